#!/usr/bin/env bash
# Killing one rank of a data-parallel run ends the whole job, with a
# message naming the rank, well within 60 seconds (no rank hangs in a
# collective waiting for the dead one).
set -uo pipefail
zs="$ZS_BIN"
if ! command -v mpirun >/dev/null; then
  echo "mpirun not installed: test not run"; exit 0
fi
tmp=$(mktemp -d)
trap 'pkill -9 -f "$tmp/run" 2>/dev/null; rm -rf "$tmp"' EXIT
for i in $(seq 1 300); do
  echo "In the beginning was the word $i, and the word was with the light; and the light shone."
done > "$tmp/corpus.txt"
ASAN_OPTIONS=detect_leaks=0 mpirun --allow-run-as-root --oversubscribe -np 2 \
  "$zs" train gpt --data "$tmp/corpus.txt" --preset tiny --vocab 300 --batch 4 --seq 32 \
  --threads 1 --steps 1000000 --eval-every 50 --out "$tmp/run" >"$tmp/log" 2>&1 &
job=$!
for _ in $(seq 1 300); do  # wait until training runs (metrics appear)
  [ -s "$tmp/run/metrics.jsonl" ] && break
  sleep 0.2
done
victim=$(pgrep -f "train gpt.*$tmp/run" | grep -v "^$job$" | tail -1)
[ -n "$victim" ] || { echo "FAIL: no rank process found"; cat "$tmp/log"; exit 1; }
start=$(date +%s)
kill -9 "$victim"
for _ in $(seq 1 600); do
  kill -0 $job 2>/dev/null || break
  sleep 0.1
done
wait $job; rc=$?
took=$(( $(date +%s) - start ))
if [ $rc -ne 0 ] && [ $took -le 60 ] && grep -q "rank" "$tmp/log"; then
  echo "ok killed rank $victim: job ended in ${took} s, exit $rc: $(grep -m1 'rank' "$tmp/log")"
else
  echo "FAIL: exit $rc after ${took} s"; tail -5 "$tmp/log"; exit 1
fi
