#!/usr/bin/env bash
# zs train gpt / zs generate end to end on a small text: the loss falls,
# a resumed run repeats the uninterrupted run's per-step losses exactly,
# generation streams text, and bad input (empty or binary corpus, a
# sequence longer than the context, a tokenizer that does not match the
# checkpoint, unknown flags) gives one clear message and exit status 2.
set -uo pipefail
zs="$ZS_BIN"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
check() { if eval "$2"; then echo "ok $1"; else echo "FAIL $1"; fail=1; fi; }
expect2() {
  local name=$1; shift
  "$@" >"$tmp/out" 2>"$tmp/err"; local rc=$?
  if [ $rc -eq 2 ] && [ -s "$tmp/err" ]; then echo "ok $name: $(tail -1 "$tmp/err")"
  else echo "FAIL $name: exit $rc: $(cat "$tmp/err")"; fail=1; fi
}

for i in $(seq 1 300); do
  echo "In the beginning was the word $i, and the word was with the light; and the light shone."
done > "$tmp/corpus.txt"
common=(--data "$tmp/corpus.txt" --preset tiny --vocab 300 --batch 4 --seq 32 --seed 5
        --threads 2 --eval-every 10 --warmup 5)

"$zs" train gpt "${common[@]}" --steps 30 --out "$tmp/full" >/dev/null 2>"$tmp/log" || { cat "$tmp/log"; exit 1; }
"$zs" train gpt "${common[@]}" --steps 30 --stop-after 20 --out "$tmp/part" >/dev/null 2>&1 || exit 1
"$zs" train gpt "${common[@]}" --steps 30 --out "$tmp/part" --resume >/dev/null 2>&1 || exit 1
first=$(grep '"loss"' "$tmp/full/metrics.jsonl" | head -1 | sed 's/.*"loss":\([0-9.]*\).*/\1/')
last=$(grep '"loss"' "$tmp/full/metrics.jsonl" | tail -1 | sed 's/.*"loss":\([0-9.]*\).*/\1/')
check "loss falls ($first -> $last)" 'awk "BEGIN{exit !($last < $first - 1)}"'
grep '"loss"' "$tmp/full/metrics.jsonl" | grep -E '"step":2[0-9],' | sed 's/,"tokens_per_s.*//' > "$tmp/a"
grep '"loss"' "$tmp/part/metrics.jsonl" | grep -E '"step":2[0-9],' | sed 's/,"tokens_per_s.*//' > "$tmp/b"
check "resume repeats steps 20-29 exactly ($(wc -l <"$tmp/a") steps)" '[ -s "$tmp/a" ] && cmp -s "$tmp/a" "$tmp/b"'
"$zs" generate --ckpt "$tmp/full" --prompt "In the beginning" --max-new 20 --seed 1 >"$tmp/gen" 2>/dev/null
check "generate prints the prompt and more" '[ $(wc -c <"$tmp/gen") -gt 20 ] && grep -q "In the beginning" "$tmp/gen"'

: > "$tmp/empty.txt"
expect2 "empty corpus" "$zs" train gpt "${common[@]}" --steps 2 --data "$tmp/empty.txt" --out "$tmp/e"
head -c 5000 /dev/urandom > "$tmp/bin.dat"; printf '\0' >> "$tmp/bin.dat"
expect2 "binary corpus" "$zs" train gpt "${common[@]}" --steps 2 --data "$tmp/bin.dat" --out "$tmp/e"
expect2 "sequence longer than the context" "$zs" train gpt "${common[@]}" --steps 2 --seq 4096 --out "$tmp/e"
expect2 "unknown preset" "$zs" train gpt --preset enormous --out "$tmp/e"
expect2 "unknown flag" "$zs" train gpt --warp 9
"$zs" train gpt "${common[@]}" --steps 2 --vocab 280 --out "$tmp/other" >/dev/null 2>&1
cp "$tmp/other/tokenizer.bpe" "$tmp/full/tokenizer.bpe"
expect2 "tokenizer does not match the checkpoint" "$zs" generate --ckpt "$tmp/full" --prompt x
expect2 "missing checkpoint" "$zs" generate --ckpt "$tmp/nowhere" --prompt x
exit $fail
