#!/usr/bin/env bash
# Data parallelism: `mpirun -np N zs train gpt` (each rank trains on its
# share of the same global batch, gradients averaged by the ring
# all-reduce) gives, step by step, the losses of one process on that
# global batch, within 1e-5 relative, for N = 2 and 4; and a checkpoint
# resumes on a different number of ranks.
set -uo pipefail
zs="$ZS_BIN"
if ! command -v mpirun >/dev/null; then
  echo "mpirun not installed: data-parallel test not run"; exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for i in $(seq 1 300); do
  echo "In the beginning was the word $i, and the word was with the light; and the light shone."
done > "$tmp/corpus.txt"
common=(--data "$tmp/corpus.txt" --preset tiny --vocab 300 --batch 4 --seq 32 --seed 5
        --threads 1 --eval-every 10 --warmup 3 --steps 8)
"$zs" train gpt "${common[@]}" --out "$tmp/one" >/dev/null 2>"$tmp/log" || { cat "$tmp/log"; exit 1; }
losses() { grep '"loss"' "$1" | sed 's/.*"loss":\([0-9.]*\).*/\1/'; }
fail=0
# compare NAME DIR: DIR's 8 step losses equal one process's within 1e-5.
compare() {
  local worst
  worst=$(paste <(losses "$tmp/one/metrics.jsonl") <(losses "$2/metrics.jsonl") |
          awk '{d = ($1 - $2) / $1; if (d < 0) d = -d; if (d > w) w = d; n++}
               END {if (n != 8) print "missing"; else printf "%.2e\n", w}')
  if [ "$worst" != "missing" ] && awk "BEGIN{exit !($worst <= 1e-5)}"; then
    echo "ok $1: 8 step losses equal one process's within $worst relative"
  else
    echo "FAIL $1: worst relative difference $worst"; fail=1
  fi
}
# dp NP NAME FLAGS...: mpirun -np NP zs train gpt FLAGS, compared.
dp() {
  local np=$1 name=$2; shift 2
  # OpenMPI's plugins keep memory until exit: no leak check for MPI runs.
  if ASAN_OPTIONS=detect_leaks=0 mpirun --allow-run-as-root --oversubscribe -np "$np" \
      "$zs" train gpt "${common[@]}" "$@" --out "$tmp/$name" >/dev/null 2>"$tmp/$name.log"; then
    compare "$name ($np ranks: $*)" "$tmp/$name"
  else
    echo "FAIL $name (mpirun -np $np $*):"; cat "$tmp/$name.log"; fail=1
  fi
}
dp 2 dp2 --dp 2
dp 4 dp4
# Gradient buckets all-reduced during backward (several buckets: the
# tiny model's 0.6 MB in 0.02 MB buckets), with the ring and with MPI's.
dp 2 bucket-ring --bucket-mb 0.02
dp 4 bucket-mpi --bucket-mb 0.02 --allreduce mpi
grep -q "gradient buckets" "$tmp/bucket-ring.log" && echo "ok $(grep 'gradient buckets' "$tmp/bucket-ring.log")" \
  || { echo "FAIL no bucket report"; cat "$tmp/bucket-ring.log"; fail=1; }
# ZeRO stage 1 (optimizer state partitioned, parameters all-gathered) and
# stage 2 (gradients too: reduce-scattered bucket by bucket in backward;
# several buckets, and one).
dp 4 z1 --zero 1
dp 2 z2 --zero 2 --bucket-mb 0.05
dp 4 z2-4 --zero 2 --bucket-mb 0.05
dp 2 z2-1bucket --zero 2 --bucket-mb 0
# ZeRO stage 3 (parameters too: each block gathered before its forward
# and its backward, dropped after): the same losses, and each rank holds
# its chunks plus less than the whole model.
dp 2 z3 --zero 3
dp 4 z3-4 --zero 3
held=$(grep "ZeRO-3 parameters held" "$tmp/z3-4.log")
nums=$(echo "$held" | sed -n 's/.*chunks \([0-9.]*\) MiB, at most \([0-9.]*\) MiB.*model: \([0-9.]*\) MiB.*/\1 \2 \3/p')
if [ -n "$nums" ] && echo "$nums" | awk '{exit !($1 < $2 && $2 < $3)}'; then
  echo "ok $held"
else
  echo "FAIL ZeRO-3 memory: '$held'"; cat "$tmp/z3-4.log"; fail=1
fi
grep -q "ZeRO-2 over 2 ranks" "$tmp/z2.log" && echo "ok $(grep 'ZeRO-2 over' "$tmp/z2.log")" \
  || { echo "FAIL no ZeRO-2 memory report"; cat "$tmp/z2.log"; fail=1; }
# The measured per-rank state equals zs analyze's formula (to the 0.001
# MiB printed; the optimizer against its m and v part).
for z in z1 z2 z2-4 z3-4; do
  line=$(grep "ZeRO-. over" "$tmp/$z.log")
  nums=$(echo "$line" | sed -n 's/.*weights \([0-9.]*\) (\([0-9.]*\)) MiB, gradients \([0-9.]*\) (\([0-9.]*\)) MiB.*optimizer state \([0-9.]*\) (.*: \([0-9.]*\)) MiB.*/\1 \2 \3 \4 \5 \6/p')
  if [ -n "$nums" ] && echo "$nums" | awk '{exit !($1 == $2 && $3 == $4 && $5 == $6)}'; then
    echo "ok $z: per-rank weights, gradients, optimizer state equal the formula ($nums)"
  else
    echo "FAIL $z: memory report '$line' differs from the formula"; fail=1
  fi
done
"$zs" train gpt "${common[@]}" --dp 3 --out "$tmp/dp3" >/dev/null 2>"$tmp/logdp3"
[ $? -eq 2 ] && grep -q "mpirun -np 3" "$tmp/logdp3" && echo "ok --dp 3 on one rank refused: $(cat "$tmp/logdp3")" \
  || { echo "FAIL --dp 3 not refused"; cat "$tmp/logdp3"; fail=1; }

# A checkpoint written by one process resumes on 4 ranks (and one written
# by 2 ranks on one process) with the uninterrupted run's losses.
"$zs" train gpt "${common[@]}" --stop-after 4 --out "$tmp/r14" >/dev/null 2>&1
ASAN_OPTIONS=detect_leaks=0 mpirun --allow-run-as-root --oversubscribe -np 4 \
    "$zs" train gpt "${common[@]}" --resume --out "$tmp/r14" >/dev/null 2>&1
ASAN_OPTIONS=detect_leaks=0 mpirun --allow-run-as-root --oversubscribe -np 2 \
    "$zs" train gpt "${common[@]}" --stop-after 4 --out "$tmp/r21" >/dev/null 2>&1
"$zs" train gpt "${common[@]}" --resume --out "$tmp/r21" >/dev/null 2>&1
# ZeRO checkpoints hold the whole optimizer state: a ZeRO-2 run on 2 ranks
# resumes as ZeRO-1 on 4 ranks, and a plain one-process checkpoint as
# ZeRO-2 on 2 ranks.
ASAN_OPTIONS=detect_leaks=0 mpirun --allow-run-as-root --oversubscribe -np 2 \
    "$zs" train gpt "${common[@]}" --zero 2 --stop-after 4 --out "$tmp/rz21" >/dev/null 2>&1
ASAN_OPTIONS=detect_leaks=0 mpirun --allow-run-as-root --oversubscribe -np 4 \
    "$zs" train gpt "${common[@]}" --zero 1 --resume --out "$tmp/rz21" >/dev/null 2>&1
"$zs" train gpt "${common[@]}" --stop-after 4 --out "$tmp/rz02" >/dev/null 2>&1
ASAN_OPTIONS=detect_leaks=0 mpirun --allow-run-as-root --oversubscribe -np 2 \
    "$zs" train gpt "${common[@]}" --zero 2 --resume --out "$tmp/rz02" >/dev/null 2>&1
# ZeRO-3 on 2 ranks resumes as ZeRO-3 on 4 ranks.
ASAN_OPTIONS=detect_leaks=0 mpirun --allow-run-as-root --oversubscribe -np 2 \
    "$zs" train gpt "${common[@]}" --zero 3 --stop-after 4 --out "$tmp/rz3" >/dev/null 2>&1
ASAN_OPTIONS=detect_leaks=0 mpirun --allow-run-as-root --oversubscribe -np 4 \
    "$zs" train gpt "${common[@]}" --zero 3 --resume --out "$tmp/rz3" >/dev/null 2>&1
for r in r14 r21 rz21 rz02 rz3; do
  worst=$(paste <(losses "$tmp/one/metrics.jsonl") <(losses "$tmp/$r/metrics.jsonl") |
          awk '{d = ($1 - $2) / $1; if (d < 0) d = -d; if (d > w) w = d; n++}
               END {if (n != 8) print "missing"; else printf "%.2e\n", w}')
  if [ "$worst" != "missing" ] && awk "BEGIN{exit !($worst <= 1e-5)}"; then
    echo "ok resume across rank counts ($r): losses within $worst"
  else
    echo "FAIL resume across rank counts ($r): $worst"; fail=1
  fi
done
exit $fail
