#!/usr/bin/env bash
# zs train gpt --recompute and --attention sparse (issue 29): full and
# selective recomputation print the same per-step losses as none (the
# recomputed blocks run the same kernels in the same order); sparse
# attention prints its layout's density and FLOPs and trains; bad values
# (an unknown mode, a block outside 16..128, sparse attention on BLOOM)
# are refused with one message and exit status 2. Under data parallelism
# (mpirun -np 2, all-reduce and ZeRO-3, whose gather hooks run inside the
# recomputed blocks) and in bf16, recomputation keeps the losses too.
set -uo pipefail
zs="$ZS_BIN"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
. "$(dirname "$0")/cli_lib.sh" # check, expect2, refused

for i in $(seq 1 300); do
  echo "In the beginning was the word $i, and the word was with the light; and the light shone."
done > "$tmp/corpus.txt"
common=(--data "$tmp/corpus.txt" --preset tiny --vocab 300 --batch 4 --seq 48 --seed 5
        --threads 2 --eval-every 10 --warmup 5 --steps 6)

losses() { grep '"loss"' "$1/metrics.jsonl" | sed 's/.*"loss":\([0-9.e+-]*\).*/\1/'; }
for mode in none full selective; do
  "$zs" train gpt "${common[@]}" --recompute "$mode" --out "$tmp/$mode" >/dev/null \
    2>"$tmp/log.$mode" || { cat "$tmp/log.$mode"; fail=1; }
  losses "$tmp/$mode" > "$tmp/l.$mode"
done
check "full: the losses of none ($(wc -l <"$tmp/l.none") steps)" \
  '[ -s "$tmp/l.none" ] && cmp -s "$tmp/l.none" "$tmp/l.full"'
check "selective: the losses of none" 'cmp -s "$tmp/l.none" "$tmp/l.selective"'
"$zs" train gpt "${common[@]}" --recompute full --recompute-layers 1 --out "$tmp/f1" \
  >/dev/null 2>&1
losses "$tmp/f1" > "$tmp/l.f1"
check "full, first block only: the losses of none" 'cmp -s "$tmp/l.none" "$tmp/l.f1"'

"$zs" train gpt "${common[@]}" --attention sparse --sparse-block 16 --local 1 --global 1 \
  --random 1 --out "$tmp/sparse" >/dev/null 2>"$tmp/log.sparse" || { cat "$tmp/log.sparse"; fail=1; }
check "sparse attention prints density and FLOPs: $(grep 'sparse attention' "$tmp/log.sparse")" \
  'grep -q "density 0\.[0-9]*; attention forward .* GFLOP" "$tmp/log.sparse"'
check "sparse attention trains" '[ "$(losses "$tmp/sparse" | wc -l)" -ge 6 ]'

if command -v mpirun >/dev/null; then
  dp() { # dp NAME FLAGS...: 2 ranks
    local name=$1; shift
    ASAN_OPTIONS=detect_leaks=0 mpirun --allow-run-as-root --oversubscribe -np 2 \
      "$zs" train gpt "${common[@]}" --threads 1 "$@" --out "$tmp/$name" >/dev/null \
      2>"$tmp/log.$name" || { cat "$tmp/log.$name"; fail=1; }
    losses "$tmp/$name" > "$tmp/l.$name"
  }
  for z in 0 3; do
    dp "dp$z-none" --zero "$z"
    dp "dp$z-full" --zero "$z" --recompute full
    dp "dp$z-sel" --zero "$z" --recompute selective
    check "2 ranks, zero $z: full and selective give the losses of none" \
      '[ -s "$tmp/l.dp$z-none" ] && cmp -s "$tmp/l.dp$z-none" "$tmp/l.dp$z-full" &&
       cmp -s "$tmp/l.dp$z-none" "$tmp/l.dp$z-sel"'
  done
else
  echo "mpirun not installed: the data-parallel recomputation runs are skipped"
fi
for mode in none full; do
  "$zs" train gpt "${common[@]}" --precision bf16 --recompute "$mode" --out "$tmp/bf$mode" \
    >/dev/null 2>"$tmp/log.bf$mode" || { cat "$tmp/log.bf$mode"; fail=1; }
  losses "$tmp/bf$mode" > "$tmp/l.bf$mode"
done
check "bf16: full recomputation gives the losses of none" \
  '[ -s "$tmp/l.bfnone" ] && cmp -s "$tmp/l.bfnone" "$tmp/l.bffull"'

# graph mode replays the recomputed regions and the sparse kernel (their aux
# results refreshed each step) with the eager losses
"$zs" train gpt "${common[@]}" --recompute full --graph --out "$tmp/gfull" >/dev/null 2>&1
losses "$tmp/gfull" > "$tmp/l.gfull"
check "--graph --recompute full: the losses of none" 'cmp -s "$tmp/l.none" "$tmp/l.gfull"'
"$zs" train gpt "${common[@]}" --attention sparse --sparse-block 16 --local 1 --global 0 \
  --random 0 --out "$tmp/sp1" >/dev/null 2>&1
"$zs" train gpt "${common[@]}" --attention sparse --sparse-block 16 --local 1 --global 0 \
  --random 0 --graph --out "$tmp/gsp1" >/dev/null 2>&1
losses "$tmp/sp1" > "$tmp/l.sp1"
losses "$tmp/gsp1" > "$tmp/l.gsp1"
check "--graph --attention sparse: the eager sparse losses" \
  '[ -s "$tmp/l.sp1" ] && cmp -s "$tmp/l.sp1" "$tmp/l.gsp1" && ! cmp -s "$tmp/l.sp1" "$tmp/l.none"'

# with --tp the flags are accepted (tests/train/test_parallel3d.sh trains
# them); one process is refused for the layout alone
refused "recomputation with --tp 2 in one process" "start it with mpirun -np 2" "$zs" \
  train gpt "${common[@]}" --tp 2 --recompute full --out "$tmp/x"
refused "unknown recompute mode" "--recompute" "$zs" train gpt "${common[@]}" --recompute half \
  --out "$tmp/x"
refused "sparse block outside 16..128" "--sparse-block" "$zs" train gpt "${common[@]}" \
  --attention sparse --sparse-block 8 --out "$tmp/x"
refused "sparse attention on bloom" "ALiBi" "$zs" train gpt "${common[@]}" --arch bloom \
  --attention sparse --out "$tmp/y"
exit $fail
