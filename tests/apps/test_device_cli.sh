#!/usr/bin/env bash
# --device on the command line (issue 23): zs train lenet, resnet and gpt
# on the test device (host memory the host may not touch, running the CPU
# kernels behind the driver) give the CPU's per-step losses to the bit,
# their checkpoints evaluate and generate on the CPU, a run stopped and
# resumed there repeats the CPU's uninterrupted one, an unknown device
# exits 2 naming the devices there are, and `zs ops` lists every operator
# with kernels on the test device.
set -uo pipefail
zs="$ZS_BIN"
src="$ZS_SOURCE_DIR"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
. "$(dirname "$0")/cli_lib.sh" # check, expect2, refused

losses() { grep '"step"' "$1/metrics.jsonl" | sed 's/.*"loss":\([-0-9.e]*\).*/\1/'; }

python3 "$src/tests/apps/make_fake_mnist.py" "$tmp/data" 128 64
cnn=(--data "$tmp/data" --batch 32 --epochs 1 --seed 3 --threads 2 --optim sgd --lr 0.05)
for m in lenet resnet; do
  "$zs" train $m "${cnn[@]}" --out "$tmp/$m-cpu" >/dev/null 2>&1 || fail=1
  "$zs" train $m "${cnn[@]}" --out "$tmp/$m-test" --device test >/dev/null 2>"$tmp/log" ||
    { cat "$tmp/log"; fail=1; }
  losses "$tmp/$m-cpu" > "$tmp/a"; losses "$tmp/$m-test" > "$tmp/b"
  check "$m: --device test gives the cpu's losses ($(wc -l <"$tmp/a") steps)" \
        '[ -s "$tmp/a" ] && cmp -s "$tmp/a" "$tmp/b"'
  "$zs" eval --ckpt "$tmp/$m-test/checkpoint.safetensors" --data "$tmp/data" > "$tmp/ev" 2>&1
  check "$m: the test device's checkpoint evaluates on the cpu" 'grep -q accuracy "$tmp/ev"'
done

# stopped and resumed on the test device (moments and state loaded onto it):
# the cpu's uninterrupted run, step for step
two=(--data "$tmp/data" --batch 32 --epochs 2 --seed 3 --threads 2 --optim adam)
"$zs" train lenet "${two[@]}" --out "$tmp/r-cpu" >/dev/null 2>&1 || fail=1
"$zs" train lenet "${two[@]}" --out "$tmp/r-test" --stop-after 1 --device test >/dev/null 2>&1 || fail=1
"$zs" train lenet "${two[@]}" --out "$tmp/r-test" --resume --device test >/dev/null 2>&1 || fail=1
grep '"step"' "$tmp/r-cpu/metrics.jsonl" | grep '"epoch":2,' | sed 's/,"tokens.*//' > "$tmp/a"
grep '"step"' "$tmp/r-test/metrics.jsonl" | grep '"epoch":2,' | sed 's/,"tokens.*//' > "$tmp/b"
check "lenet: resumed on test = the cpu's uninterrupted run ($(wc -l <"$tmp/a") steps)" \
      '[ -s "$tmp/a" ] && cmp -s "$tmp/a" "$tmp/b"'

for i in $(seq 1 200); do
  echo "In the beginning was the word $i, and the word was with the light; and the light shone."
done > "$tmp/corpus.txt"
gpt=(--data "$tmp/corpus.txt" --preset tiny --vocab 300 --batch 4 --seq 32 --seed 5
     --threads 2 --eval-every 5 --warmup 2 --steps 10)
for arch in gpt2 bloom; do
  "$zs" train gpt "${gpt[@]}" --arch $arch --out "$tmp/$arch-cpu" >/dev/null 2>&1 || fail=1
  "$zs" train gpt "${gpt[@]}" --arch $arch --out "$tmp/$arch-test" --device test \
    >/dev/null 2>"$tmp/log" || { cat "$tmp/log"; fail=1; }
  losses "$tmp/$arch-cpu" > "$tmp/a"; losses "$tmp/$arch-test" > "$tmp/b"
  check "gpt $arch: --device test gives the cpu's losses ($(wc -l <"$tmp/a") steps)" \
        '[ -s "$tmp/a" ] && cmp -s "$tmp/a" "$tmp/b"'
  "$zs" generate --ckpt "$tmp/$arch-test" --prompt "In the" --max-new 8 --seed 1 \
    >"$tmp/g1" 2>/dev/null
  "$zs" generate --ckpt "$tmp/$arch-cpu" --prompt "In the" --max-new 8 --seed 1 \
    >"$tmp/g2" 2>/dev/null
  check "gpt $arch: the test device's checkpoint generates the cpu's text" \
        '[ -s "$tmp/g1" ] && cmp -s "$tmp/g1" "$tmp/g2"'
done

refused "train lenet --device tpu" "devices: cpu, test" "$zs" train lenet --device tpu
refused "train gpt --device tpu" "devices: cpu, test" "$zs" train gpt --device tpu

# without a GPU (or a build without CUDA) --device cuda says why, exit 2
if "$zs" sysinfo --quick | grep -q "^gpu  *none"; then
  refused "train lenet --device cuda without a GPU" "cuda: " "$zs" train lenet --device cuda
  refused "generate --device cuda without a GPU" "cuda: " "$zs" generate --device cuda \
    --ckpt /nonexistent --prompt x
fi
refused "zs ops --frobnicate" "unknown flag" "$zs" ops --frobnicate
"$zs" ops > "$tmp/ops" 2>&1
check "zs ops prints the table with a test column" \
      'head -1 "$tmp/ops" | grep -q "operator.*cpu.*test.*backward"'
check "zs ops: every operator with a cpu kernel has the same kernels on test" \
      '[ $(wc -l <"$tmp/ops") -gt 60 ] && awk -F"  +" "NR > 1 && \$3 != \$4 { bad = 1 } END { exit bad }" "$tmp/ops"'
check "zs ops: layer_norm's backward is a descriptor of its own" \
      'grep -q "^layer_norm .*layer_norm_backward" "$tmp/ops"'
exit $fail
