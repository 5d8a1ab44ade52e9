#!/usr/bin/env bash
# A failed rank ends a data-parallel run, with a message naming a rank,
# well within 60 seconds (no rank hangs in a collective waiting for it):
#  - kill -9 of one rank: mpirun ends the job;
#  - kill -STOP of one rank (alive but hung): the others' collectives time
#    out (--comm-timeout 2) and name the rank that did not answer.
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
fail=0
# scenario NAME SIGNAL EXPECTED-TEXT
scenario() {
  local name=$1 sig=$2 want=$3 run="$tmp/run-$1"
  ASAN_OPTIONS=detect_leaks=0 mpirun --allow-run-as-root --oversubscribe -np 2 \
    "$zs" train gpt --data "$tmp/corpus.txt" --preset tiny --vocab 300 --batch 4 --seq 32 \
    --threads 1 --steps 1000000 --eval-every 50 --comm-timeout 2 --out "$run" \
    >"$run.log" 2>&1 &
  local job=$!
  for _ in $(seq 1 300); do  # wait until training runs (metrics appear)
    [ -s "$run/metrics.jsonl" ] && break
    sleep 0.2
  done
  local victim
  victim=$(pgrep -f "train gpt.*$run" | grep -v "^$job$" | tail -1)
  [ -n "$victim" ] || { echo "FAIL $name: no rank process found"; cat "$run.log"; fail=1; return; }
  local start=$(date +%s)
  kill "-$sig" "$victim"
  for _ in $(seq 1 600); do
    kill -0 $job 2>/dev/null || break
    sleep 0.1
  done
  kill -9 $job 2>/dev/null
  wait $job; local rc=$?
  local took=$(( $(date +%s) - start ))
  if [ $rc -ne 0 ] && [ $took -le 60 ] && grep -q "$want" "$run.log"; then
    echo "ok $name: job ended in ${took} s, exit $rc: $(grep -m1 "$want" "$run.log")"
  else
    echo "FAIL $name: exit $rc after ${took} s"; tail -5 "$run.log"; fail=1
  fi
  pkill -9 -f "$run" 2>/dev/null
}
scenario killed KILL "exited on signal"
scenario hung STOP "did not answer"
exit $fail
