#!/usr/bin/env bash
# zs quantize / zs generate on quantized checkpoints end to end: a tiny GPT
# trained here, quantized in every format, generates from the quantized
# directory; several prompts run batched (--prompts) and a prompt gives the
# same text alone and among others (batch invariance, greedy and seeded);
# the same with a bf16 and an f16 KV cache (--kv-dtype); bad input
# (unknown type, a CNN or missing checkpoint, w8a8 without calibration
# text, a corrupted quantized file, bad engine flags) gives one clear
# message and exit status 2.
set -uo pipefail
zs="$ZS_BIN"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
. "$(dirname "$0")/cli_lib.sh" # check, expect2, refused

for i in $(seq 1 300); do
  echo "In the beginning was the word $i, and the word was with the light; and the light shone."
done > "$tmp/corpus.txt"
"$zs" train gpt --data "$tmp/corpus.txt" --preset tiny --vocab 300 --batch 4 --seq 32 \
    --seed 5 --threads 2 --eval-every 10 --warmup 5 --steps 30 --out "$tmp/full" \
    >/dev/null 2>"$tmp/log" || { cat "$tmp/log"; exit 1; }

for t in q8 q4 q4_1 int8 w8a8; do
  "$zs" quantize --ckpt "$tmp/full" --out "$tmp/$t" --type $t >"$tmp/qout" 2>&1
  check "quantize $t" '[ $? -eq 0 ] && [ -s "$tmp/$t/checkpoint.safetensors" ] && [ -s "$tmp/$t/tokenizer.bpe" ]'
  "$zs" generate --ckpt "$tmp/$t" --prompt "In the beginning" --max-new 12 --temperature 0 >"$tmp/gen" 2>/dev/null
  check "generate from $t" '[ $? -eq 0 ] && grep -q "In the beginning" "$tmp/gen"'
done
"$zs" generate --ckpt "$tmp/full" --quant q8 --prompt "In the" --max-new 8 >/dev/null 2>&1
check "generate --quant q8 on a float checkpoint" '[ $? -eq 0 ]'

printf 'In the beginning\nand the light\nthe word was\n' > "$tmp/prompts"
flags=(--max-new 16 --temperature 0.9 --seed 3 --kv-blocks 20 --block-size 8 --max-batched-tokens 24)
"$zs" generate --ckpt "$tmp/full" --prompts "$tmp/prompts" "${flags[@]}" >"$tmp/many" 2>"$tmp/many.err"
check "--prompts runs three prompts" '[ $? -eq 0 ] && [ $(grep -c "=== prompt" "$tmp/many") -eq 3 ]'
echo "and the light" > "$tmp/prompt2"
"$zs" generate --ckpt "$tmp/full" --prompts "$tmp/prompt2" "${flags[@]}" 2>/dev/null | tail -n +2 >"$tmp/one"
awk '/^=== prompt 2 ===$/{f=1;next} /^=== prompt 3 ===$/{f=0} f' "$tmp/many" > "$tmp/two"
check "a prompt alone = the same prompt batched" '[ -s "$tmp/one" ] && cmp -s "$tmp/one" "$tmp/two"'
for kv in bf16 f16; do
  "$zs" generate --ckpt "$tmp/full" --prompts "$tmp/prompts" "${flags[@]}" --kv-dtype $kv \
      >"$tmp/many16" 2>/dev/null
  "$zs" generate --ckpt "$tmp/full" --prompts "$tmp/prompt2" "${flags[@]}" --kv-dtype $kv \
      2>/dev/null | tail -n +2 >"$tmp/one16"
  awk '/^=== prompt 2 ===$/{f=1;next} /^=== prompt 3 ===$/{f=0} f' "$tmp/many16" > "$tmp/two16"
  check "--kv-dtype $kv: three prompts, one alone = batched" \
      '[ $(grep -c "=== prompt" "$tmp/many16") -eq 3 ] && [ -s "$tmp/one16" ] && cmp -s "$tmp/one16" "$tmp/two16"'
done

expect2 "unknown quantization" "$zs" quantize --ckpt "$tmp/full" --out "$tmp/x" --type q5
expect2 "nothing to quantize" "$zs" quantize --ckpt "$tmp/full" --out "$tmp/x" --type none
expect2 "missing checkpoint" "$zs" quantize --ckpt "$tmp/nowhere" --out "$tmp/x" --type q8
cp "$tmp/full/checkpoint.safetensors" "$tmp/lone.safetensors"
cp "$tmp/full/tokenizer.bpe" "$tmp/tokenizer.bpe"
refused "w8a8 without calibration text" "calibration" \
    "$zs" quantize --ckpt "$tmp/lone.safetensors" --out "$tmp/x" --type w8a8
refused "--calib missing" "$tmp/none.txt" \
    "$zs" quantize --ckpt "$tmp/full" --out "$tmp/x" --type w8a8 --calib "$tmp/none.txt"
refused "quantize without --type" "required" "$zs" quantize --ckpt "$tmp/full" --out "$tmp/x"
head -c 3000 "$tmp/q8/checkpoint.safetensors" > "$tmp/q8/cut" && mv "$tmp/q8/cut" "$tmp/q8/checkpoint.safetensors"
expect2 "truncated quantized checkpoint" "$zs" generate --ckpt "$tmp/q8" --prompt x
refused "a quantized checkpoint cannot be requantized" "already" \
    "$zs" generate --ckpt "$tmp/q4" --quant q8 --prompt x
refused "--kv-blocks too few for one context" "cannot hold one sequence" \
    "$zs" generate --ckpt "$tmp/full" --kv-blocks 2 --prompt x
refused "--prompts of nothing" "empty" \
    "$zs" generate --ckpt "$tmp/full" --prompts /dev/null
refused "--block-size 0" "--block-size" "$zs" generate --ckpt "$tmp/full" --block-size 0
refused "--kv-dtype f8" "--kv-dtype" "$zs" generate --ckpt "$tmp/full" --kv-dtype f8
refused "serve --kv-dtype f8" "--kv-dtype" "$zs" serve --ckpt "$tmp/full" --kv-dtype f8
exit $fail
