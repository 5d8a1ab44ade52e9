#!/usr/bin/env bash
# zs train / zs eval end to end on a small synthetic MNIST-format set:
# resume gives the same per-step losses as an uninterrupted run; bad input
# (missing data, truncated IDX, corrupt or mismatched checkpoint, unknown
# flag) gives one clear message and exit status 2; kill -9 during training
# never leaves an unreadable checkpoint.
set -uo pipefail
zs="$ZS_BIN"
src="$ZS_SOURCE_DIR"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
. "$(dirname "$0")/cli_lib.sh" # check, expect2, refused

python3 "$src/tests/apps/make_fake_mnist.py" "$tmp/data" 320 100
common=(--data "$tmp/data" --batch 32 --epochs 4 --seed 3 --threads 2 --optim sgd --lr 0.05)

"$zs" train lenet "${common[@]}" --out "$tmp/full" >/dev/null 2>"$tmp/log" || { cat "$tmp/log"; exit 1; }
"$zs" train lenet "${common[@]}" --out "$tmp/part" --stop-after 2 >/dev/null 2>&1 || exit 1
"$zs" train lenet "${common[@]}" --out "$tmp/part" --resume >/dev/null 2>&1 || exit 1
grep '"step"' "$tmp/full/metrics.jsonl" | grep -E '"epoch":(3|4),' > "$tmp/a"
grep '"step"' "$tmp/part/metrics.jsonl" | grep -E '"epoch":(3|4),' > "$tmp/b"
check "resume: epochs 3-4 losses identical ($(wc -l <"$tmp/a") steps)" \
      '[ -s "$tmp/a" ] && cmp -s "$tmp/a" "$tmp/b"'
check "metrics.jsonl has per-epoch accuracy" 'grep -q test_accuracy "$tmp/full/metrics.jsonl"'
check "curves.svg written" 'grep -q "<svg" "$tmp/full/curves.svg"'
acc=$(grep test_accuracy "$tmp/full/metrics.jsonl" | tail -1 | sed 's/.*"test_accuracy":\([0-9.]*\).*/\1/')
check "learns the synthetic classes (accuracy $acc)" 'awk "BEGIN{exit !($acc > 0.9)}"'
"$zs" eval --ckpt "$tmp/full/checkpoint.safetensors" --data "$tmp/data" > "$tmp/eval" 2>&1
check "zs eval prints accuracy and confusion matrix" 'grep -q "accuracy" "$tmp/eval" && grep -q "confusion" "$tmp/eval"'

expect2 "missing data dir" "$zs" train lenet --data "$tmp/nope" --out "$tmp/x"
cp -r "$tmp/data" "$tmp/trunc"
gzip -dc "$tmp/data/train-images-idx3-ubyte.gz" | head -c 5000 | gzip > "$tmp/trunc/train-images-idx3-ubyte.gz"
expect2 "truncated IDX" "$zs" train lenet --data "$tmp/trunc" --out "$tmp/x"
expect2 "unknown flag" "$zs" train lenet --frobnicate 3
expect2 "bad number" "$zs" train lenet --epochs many
expect2 "unknown model" "$zs" train alexnet
expect2 "bad schedule" "$zs" train lenet --schedule wobble
"$zs" train lenet "${common[@]}" --epochs 2 --schedule cosine --out "$tmp/cos" >/dev/null 2>&1
check "cosine schedule run completes" 'grep -q test_accuracy "$tmp/cos/metrics.jsonl"'
head -c 300 "$tmp/full/checkpoint.safetensors" > "$tmp/bad.safetensors"
expect2 "truncated checkpoint (eval)" "$zs" eval --ckpt "$tmp/bad.safetensors" --data "$tmp/data"
cp "$tmp/bad.safetensors" "$tmp/part/checkpoint.safetensors"
expect2 "corrupt checkpoint (resume)" "$zs" train lenet "${common[@]}" --out "$tmp/part" --resume
"$zs" train resnet --data "$tmp/data" --epochs 1 --limit 64 --batch 32 --out "$tmp/res" >/dev/null 2>&1
cp "$tmp/res/checkpoint.safetensors" "$tmp/full/checkpoint.safetensors.res"
mkdir -p "$tmp/mis" && cp "$tmp/res/checkpoint.safetensors" "$tmp/mis/checkpoint.safetensors"
expect2 "mismatched checkpoint (resnet into lenet)" "$zs" train lenet "${common[@]}" --out "$tmp/mis" --resume

# kill -9 at several moments: the checkpoint on disk always loads.
"$zs" train lenet "${common[@]}" --epochs 1 --out "$tmp/kill" >/dev/null 2>&1
ok=1
for delay in 0.3 0.7 1.1 1.6 2.2; do
  "$zs" train lenet "${common[@]}" --epochs 30 --out "$tmp/kill" --resume >/dev/null 2>&1 &
  pid=$!
  sleep $delay
  kill -9 $pid 2>/dev/null; wait $pid 2>/dev/null
  "$zs" eval --ckpt "$tmp/kill/checkpoint.safetensors" --data "$tmp/data" >/dev/null 2>&1 || ok=0
done
check "kill -9 during training leaves a readable checkpoint" '[ $ok -eq 1 ]'

# Hostile input (issue 17). Flag values: integral where an integer is
# meant, in range, finite; one positional MODEL.
small=(--data "$tmp/data" --epochs 1 --threads 2 --out "$tmp/x")
refused "--epochs 2.5" "wants a number" "$zs" train lenet "${small[@]}" --epochs 2.5
refused "--seed 1e30" "wants a number" "$zs" train lenet "${small[@]}" --seed 1e30
refused "--batch 0" "wants a number" "$zs" train lenet "${small[@]}" --batch 0
refused "--lr nan" "wants a number" "$zs" train lenet "${small[@]}" --lr nan
refused "--optim rmsprop" "must be sgd, adam or adamw" "$zs" train lenet "${small[@]}" --optim rmsprop
refused "flag without its value" "needs a value" "$zs" train lenet "${small[@]}" --limit
refused "two models" "unexpected argument" "$zs" train lenet resnet "${small[@]}"
refused "no model" "which model" "$zs" train "${small[@]}"
"$zs" train lenet --help >"$tmp/out" 2>&1
check "train --help exits 0 with the usage" '[ $? -eq 0 ] && grep -q "usage: zs train" "$tmp/out"'
"$zs" eval --help >"$tmp/out" 2>&1
check "eval --help exits 0 with the usage" '[ $? -eq 0 ] && grep -q "usage: zs eval" "$tmp/out"'
refused "eval: stray argument" "unexpected argument" \
        "$zs" eval --ckpt "$tmp/full/checkpoint.safetensors" extra

# Data the CNNs cannot take is refused before training (it used to fail
# inside conv2d/linear with exit 1, or after a whole epoch for an empty
# test set), naming the file and the shape.
python3 "$src/tests/apps/make_fake_mnist.py" "$tmp/d32" 64 20 32
python3 "$src/tests/apps/make_fake_mnist.py" "$tmp/notest" 64 0
python3 "$src/tests/apps/make_fake_mnist.py" "$tmp/notrain" 0 20
cp -r "$tmp/d32" "$tmp/mixed"
cp "$tmp/data/train-labels-idx1-ubyte.gz" "$tmp/mixed/" # 320 labels, 64 images
refused "32x32 images (lenet)" "\[64, 32, 32\].*28, 28" "$zs" train lenet "${small[@]}" --data "$tmp/d32"
refused "32x32 images (resnet)" "\[64, 32, 32\].*28, 28" "$zs" train resnet "${small[@]}" --data "$tmp/d32"
refused "32x32 images (eval)" "t10k-images.*\[20, 32, 32\]" \
        "$zs" eval --ckpt "$tmp/full/checkpoint.safetensors" --data "$tmp/d32"
refused "empty test set" "t10k-images.* holds no images" \
        "$zs" train lenet "${small[@]}" --data "$tmp/notest"
refused "empty test set (eval)" "holds no images" \
        "$zs" eval --ckpt "$tmp/full/checkpoint.safetensors" --data "$tmp/notest"
refused "empty training set" "train-images.* holds no images" \
        "$zs" train lenet "${small[@]}" --data "$tmp/notrain"
refused "labels do not match the images" "64 images but 320 labels" \
        "$zs" train lenet "${small[@]}" --data "$tmp/mixed"
"$zs" train lenet "${small[@]}" --limit 100000 --out "$tmp/lim" >/dev/null 2>"$tmp/err"
check "--limit above the set's size trains on all of it" \
      'grep -q "320 train / 100 test images" "$tmp/err"'
"$zs" eval --ckpt "$tmp/full" --data "$tmp/data" >"$tmp/evaldir" 2>&1
check "eval takes a training directory (its checkpoint.safetensors)" \
      '[ $? -eq 0 ] && grep -q "accuracy" "$tmp/evaldir"'
mkdir -p "$tmp/emptydir"
refused "eval: a directory without a checkpoint" "emptydir/checkpoint.safetensors" \
        "$zs" eval --ckpt "$tmp/emptydir" --data "$tmp/data"
"$zs" train gpt --preset tiny --steps 1 --seq 32 --vocab 300 --data "$src/README.md" \
    --out "$tmp/g" >/dev/null 2>&1
refused "eval: a GPT checkpoint" "lenet or resnet" "$zs" eval --ckpt "$tmp/g" --data "$tmp/data"
refused "generate: a lenet checkpoint" "holds a lenet, not a GPT" \
        "$zs" generate --ckpt "$tmp/full/checkpoint.safetensors" --prompt x
: > "$tmp/afile"
refused "--out is a file" "not a directory" "$zs" train lenet "${small[@]}" --out "$tmp/afile"
exit $fail
