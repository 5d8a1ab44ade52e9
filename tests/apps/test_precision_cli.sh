#!/usr/bin/env bash
# --precision on zs train gpt|lenet|resnet (issue 24): a bad value is
# refused with one line and exit status 2 before any work; a bf16 GPT run
# says its precision in the setup lines, writes precision, loss_scale and
# skipped per step to metrics.jsonl and learns; a bf16 run resumed from its
# checkpoint repeats the uninterrupted run's losses; fp16 reports its loss
# scale; LeNet in bf16 learns the synthetic classes.
set -uo pipefail
zs="$ZS_BIN"
src="$ZS_SOURCE_DIR"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
. "$(dirname "$0")/cli_lib.sh" # check, expect2, refused

refused "train gpt --precision fp64" "fp32, bf16, fp16 or fp8" "$zs" train gpt --precision fp64
refused "train lenet --precision int8" "fp32, bf16, fp16 or fp8" "$zs" train lenet --precision int8
refused "train resnet --precision" "--precision" "$zs" train resnet --precision
refused "train gpt fp16 with a parameter server" "scale the loss" \
        "$zs" train gpt --precision fp16 --sync ps

for i in $(seq 1 300); do
  echo "In the beginning was the word $i, and the word was with the light; and the light shone."
done > "$tmp/corpus.txt"
common=(--data "$tmp/corpus.txt" --preset tiny --vocab 300 --batch 4 --seq 32 --seed 5
        --threads 2 --eval-every 10 --warmup 5 --steps 20)

"$zs" train gpt "${common[@]}" --precision bf16 --out "$tmp/full" >/dev/null 2>"$tmp/log" ||
  { cat "$tmp/log"; exit 1; }
check "setup line says bf16" 'grep -q "parameters.*precision bf16" "$tmp/log"'
check "trainer line: products in bf16, f32 master weights" \
      'grep -q "precision bf16: matrix products.*in bf16.*f32 master weights" "$tmp/log"'
check "metrics.jsonl: precision, loss_scale, skipped per step" \
      '[ $(grep -c "\"precision\":\"bf16\",\"loss_scale\":1,\"skipped\":false" "$tmp/full/metrics.jsonl") -eq 20 ]'
first=$(grep '"loss"' "$tmp/full/metrics.jsonl" | head -1 | sed 's/.*"loss":\([0-9.]*\).*/\1/')
last=$(grep '"loss"' "$tmp/full/metrics.jsonl" | tail -1 | sed 's/.*"loss":\([0-9.]*\).*/\1/')
check "bf16 loss falls ($first -> $last)" 'awk "BEGIN{exit !($last < $first - 1)}"'
"$zs" train gpt "${common[@]}" --precision bf16 --stop-after 10 --out "$tmp/part" >/dev/null 2>&1 || exit 1
"$zs" train gpt "${common[@]}" --precision bf16 --out "$tmp/part" --resume >/dev/null 2>&1 || exit 1
grep '"loss"' "$tmp/full/metrics.jsonl" | grep -E '"step":1[0-9],' | sed 's/,"tokens_per_s.*//' > "$tmp/a"
grep '"loss"' "$tmp/part/metrics.jsonl" | grep -E '"step":1[0-9],' | sed 's/,"tokens_per_s.*//' > "$tmp/b"
check "bf16 resume repeats steps 10-19 exactly ($(wc -l <"$tmp/a") steps)" \
      '[ -s "$tmp/a" ] && cmp -s "$tmp/a" "$tmp/b"'

"$zs" train gpt "${common[@]}" --steps 5 --precision fp16 --out "$tmp/h" >/dev/null 2>"$tmp/log16" ||
  { cat "$tmp/log16"; exit 1; }
check "fp16: loss scaling in the setup and 65536 in metrics.jsonl" \
      'grep -q "dynamic loss scaling" "$tmp/log16" && grep -q "\"precision\":\"fp16\",\"loss_scale\":65536" "$tmp/h/metrics.jsonl"'
"$zs" train gpt "${common[@]}" --steps 3 --precision fp8 --out "$tmp/f8" >/dev/null 2>"$tmp/log8" ||
  { cat "$tmp/log8"; exit 1; }
check "fp8: the log says the linears run in fp8" 'grep -q "linears in fp8 (e4m3" "$tmp/log8"'

python3 "$src/tests/apps/make_fake_mnist.py" "$tmp/data" 320 100
"$zs" train lenet --data "$tmp/data" --batch 32 --epochs 3 --seed 3 --threads 2 --optim adam \
    --lr 2e-3 --precision bf16 --out "$tmp/lenet" >/dev/null 2>"$tmp/llog" || { cat "$tmp/llog"; exit 1; }
check "lenet setup line says bf16" 'grep -q "precision bf16" "$tmp/llog"'
acc=$(grep test_accuracy "$tmp/lenet/metrics.jsonl" | tail -1 | sed 's/.*"test_accuracy":\([0-9.]*\).*/\1/')
check "lenet bf16 learns the synthetic classes (accuracy $acc)" 'awk "BEGIN{exit !($acc > 0.9)}"'
check "lenet metrics say bf16" 'grep -q "\"precision\":\"bf16\"" "$tmp/lenet/metrics.jsonl"'
exit $fail
