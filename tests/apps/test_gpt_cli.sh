#!/usr/bin/env bash
# zs train gpt / zs generate end to end on a small text: the loss falls,
# a resumed run repeats the uninterrupted run's per-step losses exactly,
# generation streams text, generation on the test device (--device test)
# prints the cpu's text (one prompt, batched prompts greedy and seeded,
# q8_0), --device tpu is refused with the list of devices, and bad input (empty or binary corpus, a
# sequence longer than the context, a tokenizer that does not match the
# checkpoint, unknown flags) gives one clear message and exit status 2.
# Hostile input (issue 17): flag values that do not fit (--max-new 1e30,
# --top-k 2.5), a checkpoint of an unknown arch or that is a directory, a
# corpus that is a directory or too small, --resume with nothing to resume,
# --out a file: refused before any work, with one line and exit status 2.
set -uo pipefail
zs="$ZS_BIN"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
. "$(dirname "$0")/cli_lib.sh" # check, expect2, refused

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
# --device test: the model, its KV cache and every kernel on the test device
# (memory the host may not touch): the same text as on the cpu, batched
# prompts (greedy and seeded) and a quantized model too.
"$zs" generate --ckpt "$tmp/full" --prompt "In the beginning" --max-new 20 --seed 1 \
    --device test >"$tmp/gen_test" 2>/dev/null
check "generate --device test = cpu" '[ $? -eq 0 ] && [ -s "$tmp/gen" ] && cmp -s "$tmp/gen" "$tmp/gen_test"'
printf 'In the beginning\nand the light\nthe word was\n' > "$tmp/prompts"
for gflags in "--temperature 0" "--temperature 0.9 --seed 3 --n 2" "--quant q8_0 --temperature 0"; do
  eval "set -- $gflags"
  "$zs" generate --ckpt "$tmp/full" --prompts "$tmp/prompts" --max-new 16 --kv-blocks 20 \
      --block-size 8 --max-batched-tokens 24 "$@" >"$tmp/p_cpu" 2>/dev/null
  "$zs" generate --ckpt "$tmp/full" --prompts "$tmp/prompts" --max-new 16 --kv-blocks 20 \
      --block-size 8 --max-batched-tokens 24 "$@" --device test >"$tmp/p_test" 2>/dev/null
  check "generate --prompts $gflags: --device test = --device cpu" \
      '[ $(grep -c "=== prompt" "$tmp/p_cpu") -ge 3 ] && cmp -s "$tmp/p_cpu" "$tmp/p_test"'
done
refused "generate --device tpu" "devices: cpu, test" \
        "$zs" generate --ckpt "$tmp/full" --prompt x --device tpu

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

# Flag values: integral, finite, in range, or refused (1e30 used to overflow
# the float-to-int conversions of --max-new, --top-k, --seed, --threads).
for fv in "--max-new 1e30" "--max-new 0" "--top-k 1e30" "--top-k 2.5" "--top-k -1" \
          "--seed 1e30" "--seed 1.5" "--threads 1e30" "--threads 0" "--top-p 0" \
          "--top-p 1.5" "--temperature nan" "--temperature inf" "--max-new 12abc" \
          "--max-new ''"; do
  eval "set -- $fv"
  refused "generate $fv" "$1 wants a number" "$zs" generate --ckpt "$tmp/other" --max-new 5 "$@"
done
refused "generate: flag without its value" "needs a value" "$zs" generate --ckpt
refused "generate: stray argument" "unexpected argument" "$zs" generate --ckpt "$tmp/other" x
refused "generate: no --ckpt" "required" "$zs" generate --prompt x
"$zs" generate --help >"$tmp/out" 2>&1
check "generate --help exits 0 with the usage" '[ $? -eq 0 ] && grep -q "usage: zs generate" "$tmp/out"'
"$zs" train gpt --help >"$tmp/out" 2>&1
check "train gpt --help exits 0 with the usage" '[ $? -eq 0 ] && grep -q "usage: zs train gpt" "$tmp/out"'
refused "train gpt: bad --sync" "must be allreduce, ps, async or ssp" \
        "$zs" train gpt "${common[@]}" --out "$tmp/e" --sync gossip
refused "train gpt: bad --arch" "must be gpt2 or bloom" \
        "$zs" train gpt "${common[@]}" --out "$tmp/e" --arch llama
refused "train gpt: --steps 2.5" "wants a number" \
        "$zs" train gpt "${common[@]}" --out "$tmp/e" --steps 2.5

# A checkpoint whose metadata names an arch Zhisuan does not know (the
# header keeps its length: "gpt2" -> "rwkv") is refused, not read as gpt2.
cp -r "$tmp/other" "$tmp/rwkv"
python3 -c '
import sys
p = sys.argv[1]
b = open(p, "rb").read()
old, new = b"\"arch\":\"gpt2\"", b"\"arch\":\"rwkv\""
assert b.count(old) == 1, "no arch in the header"
open(p, "wb").write(b.replace(old, new))' "$tmp/rwkv/checkpoint.safetensors"
refused "generate: unknown arch in the checkpoint" 'unknown arch "rwkv"' \
        "$zs" generate --ckpt "$tmp/rwkv" --prompt x --max-new 5
mkdir -p "$tmp/ckdir/checkpoint.safetensors"
cp "$tmp/other/tokenizer.bpe" "$tmp/ckdir/"
refused "generate: the checkpoint is a directory" "directory" \
        "$zs" generate --ckpt "$tmp/ckdir" --prompt x --max-new 5

# zs train gpt checks what it can before any work or output.
refused "train gpt: --data is a directory" "is a directory" \
        "$zs" train gpt "${common[@]}" --steps 2 --data "$tmp" --out "$tmp/e"
head -3 "$tmp/corpus.txt" > "$tmp/tiny.txt"
refused "train gpt: corpus too small for one sequence" "corpus too small" \
        "$zs" train gpt "${common[@]}" --steps 2 --data "$tmp/tiny.txt" --out "$tmp/e"
head -20 "$tmp/corpus.txt" > "$tmp/short.txt" # ~450 tokens: enough for --seq 32 only
refused "train gpt: corpus too small for the preset's context" "sequences of 128" \
        "$zs" train gpt --data "$tmp/short.txt" --preset tiny --vocab 300 --steps 2 \
        --threads 2 --out "$tmp/e"
refused "train gpt: --resume without a checkpoint" "no checkpoint" \
        "$zs" train gpt "${common[@]}" --steps 2 --out "$tmp/fresh" --resume
: > "$tmp/afile"
refused "train gpt: --out is a file" "not a directory" \
        "$zs" train gpt "${common[@]}" --steps 2 --out "$tmp/afile"
exit $fail
