#!/usr/bin/env bash
# 1-bit Adam from the command line: `mpirun -np 2 zs train gpt --optim
# onebit-adam --freeze-step 3` takes AdamW's first 4 steps (the same losses
# as --optim adamw on 2 ranks, to the printed digits: both average the
# gradients with the same all-reduce), then trains on with the compressed
# momentum; metrics.jsonl carries the bytes each step sent (>= 5x fewer
# after the freeze), the log the setup line; a resumed run continues; the
# flags 1-bit Adam cannot have are refused.
set -uo pipefail
zs="$ZS_BIN"
if ! command -v mpirun >/dev/null; then
  echo "mpirun not installed: 1-bit Adam CLI test not run"; exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for i in $(seq 1 300); do
  echo "In the beginning was the word $i, and the word was with the light; and the light shone."
done > "$tmp/corpus.txt"
common=(--data "$tmp/corpus.txt" --preset tiny --vocab 300 --batch 4 --seq 32 --seed 5
        --threads 1 --eval-every 4 --warmup 3 --steps 8)
run() { # run NAME FLAGS...: mpirun -np 2 zs train gpt
  local name=$1; shift
  ASAN_OPTIONS=detect_leaks=0 mpirun --allow-run-as-root --oversubscribe -np 2 \
      "$zs" train gpt "${common[@]}" "$@" --out "$tmp/$name" >/dev/null 2>"$tmp/$name.log"
}
fail=0
run adam || { echo "FAIL adamw run"; cat "$tmp/adam.log"; fail=1; }
run onebit --optim onebit-adam --freeze-step 3 --onebit-block 256 ||
  { echo "FAIL onebit run"; cat "$tmp/onebit.log"; fail=1; }
losses() { grep '"loss"' "$1" | sed 's/.*"loss":\([0-9.]*\).*/\1/'; }
bytes() { grep '"loss"' "$1" | sed -n 's/.*"comm_bytes":\([0-9]*\).*/\1/p'; }
if [ "$(losses "$tmp/adam/metrics.jsonl" | head -4)" = "$(losses "$tmp/onebit/metrics.jsonl" | head -4)" ] &&
   [ "$(losses "$tmp/onebit/metrics.jsonl" | wc -l)" -eq 8 ]; then
  echo "ok the first 4 losses equal AdamW's: $(losses "$tmp/onebit/metrics.jsonl" | head -4 | tr '\n' ' ')"
else
  echo "FAIL warm-up losses differ from AdamW's"; paste <(losses "$tmp/adam/metrics.jsonl") \
    <(losses "$tmp/onebit/metrics.jsonl"); fail=1
fi
b=$(bytes "$tmp/onebit/metrics.jsonl" | tr '\n' ' ')
if echo "$b" | awk '{exit !(NF == 8 && $1 == $3 && $4 == $8 && $1 >= 5 * $4)}'; then
  echo "ok bytes sent per step by rank 0: $b"
else
  echo "FAIL bytes per step: '$b'"; fail=1
fi
grep -q "1-bit Adam over 2 ranks" "$tmp/onebit.log" && echo "ok $(grep '1-bit Adam over' "$tmp/onebit.log")" \
  || { echo "FAIL no setup line"; cat "$tmp/onebit.log"; fail=1; }
# stopped after the freeze and resumed: it runs to the end
run resume --optim onebit-adam --freeze-step 3 --stop-after 5 &&
  run resume --optim onebit-adam --freeze-step 3 --resume &&
  [ "$(losses "$tmp/resume/metrics.jsonl" | wc -l)" -eq 8 ] &&
  echo "ok stopped at step 5 and resumed to step 8" ||
  { echo "FAIL resume"; cat "$tmp/resume.log"; fail=1; }
# refused combinations: exit 2 with the reason
refused() { # refused NEEDLE FLAGS...
  local needle=$1; shift
  "$zs" train gpt "${common[@]}" "$@" --out "$tmp/bad" >/dev/null 2>"$tmp/bad.log"
  if [ $? -eq 2 ] && grep -q -- "$needle" "$tmp/bad.log"; then
    echo "ok refused: $(tail -1 "$tmp/bad.log")"
  else
    echo "FAIL not refused ($*)"; cat "$tmp/bad.log"; fail=1
  fi
}
refused "wants a number" --optim onebit-adam --freeze-step -1
refused "without --zero" --optim onebit-adam --zero 1
refused "onebit-adam only" --freeze-step 3
exit $fail
