#!/usr/bin/env bash
# Parameter-server training of the tiny GPT (`zs train gpt --sync ...`):
#  - ps (synchronous, optimizer on rank 0) gives one process's losses step
#    by step within 1e-5 relative at 2 and 4 ranks;
#  - async and ssp (rank 0 serves, the others compute) train every step:
#    all step losses logged, the server applied (ranks - 1) updates per
#    step, the loss falls, ssp's clock gap stays within --staleness;
#  - an async checkpoint resumes in one process;
#  - flag combinations that cannot work are refused with a message.
set -uo pipefail
zs="$ZS_BIN"
if ! command -v mpirun >/dev/null; then
  echo "mpirun not installed: parameter-server test not run"; exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for i in $(seq 1 300); do
  echo "In the beginning was the word $i, and the word was with the light; and the light shone."
done > "$tmp/corpus.txt"
common=(--data "$tmp/corpus.txt" --preset tiny --vocab 300 --batch 6 --seq 32 --seed 5
        --threads 1 --eval-every 10 --warmup 3 --steps 12)
# OpenMPI's plugins keep memory until exit: no leak check for MPI runs.
run() { local np=$1; shift; ASAN_OPTIONS=detect_leaks=0 mpirun --allow-run-as-root \
        --oversubscribe -np "$np" "$zs" train gpt "${common[@]}" "$@"; }
losses() { grep '"loss"' "$1" | sed 's/.*"loss":\([0-9.]*\).*/\1/'; }
fail=0
"$zs" train gpt "${common[@]}" --out "$tmp/one" >/dev/null 2>"$tmp/log" || { cat "$tmp/log"; exit 1; }

for np in 2 3; do
  if run "$np" --sync ps --out "$tmp/ps$np" >/dev/null 2>"$tmp/ps$np.log"; then
    worst=$(paste <(losses "$tmp/one/metrics.jsonl") <(losses "$tmp/ps$np/metrics.jsonl") |
            awk '{d = ($1 - $2) / $1; if (d < 0) d = -d; if (d > w) w = d; n++}
                 END {if (n != 12) print "missing"; else printf "%.2e\n", w}')
    if [ "$worst" != "missing" ] && awk "BEGIN{exit !($worst <= 1e-5)}"; then
      echo "ok --sync ps on $np ranks: 12 step losses equal one process's within $worst"
    else
      echo "FAIL --sync ps on $np ranks: worst relative difference $worst"; fail=1
    fi
  else
    echo "FAIL --sync ps on $np ranks:"; cat "$tmp/ps$np.log"; fail=1
  fi
done

# asynch NAME NP FLAGS...: trains, logs 12 steps, (NP-1)*12 updates, loss falls.
asynch() {
  local name=$1 np=$2; shift 2
  if ! run "$np" "$@" --out "$tmp/$name" >/dev/null 2>"$tmp/$name.log"; then
    echo "FAIL $name (mpirun -np $np $*):"; cat "$tmp/$name.log"; fail=1; return
  fi
  local n first last
  n=$(losses "$tmp/$name/metrics.jsonl" | wc -l)
  first=$(losses "$tmp/$name/metrics.jsonl" | head -1)
  last=$(losses "$tmp/$name/metrics.jsonl" | tail -1)
  local report
  report=$(grep "parameter server (" "$tmp/$name.log" | tail -1)
  if [ "$n" = 12 ] && echo "$report" | grep -q " $(( (np - 1) * 12 )) updates" &&
     awk "BEGIN{exit !($last < $first - 0.5)}"; then
    echo "ok $name ($np ranks: $*): loss $first -> $last; $report"
  else
    echo "FAIL $name: $n steps, loss $first -> $last, report '$report'"; cat "$tmp/$name.log"; fail=1
  fi
}
asynch async3 3 --sync async
asynch ssp0 4 --sync ssp --staleness 0 --batch 6
asynch ssp1 3 --sync ssp --staleness 1
grep -q "largest clock gap 0," "$tmp/ssp0.log" && echo "ok ssp --staleness 0: clock gap 0" \
  || { echo "FAIL ssp --staleness 0 let a worker run ahead"; fail=1; }
gap=$(sed -n 's/.*largest clock gap \([0-9]*\),.*/\1/p' "$tmp/ssp1.log")
[ -n "$gap" ] && [ "$gap" -le 1 ] && echo "ok ssp --staleness 1: clock gap $gap" \
  || { echo "FAIL ssp --staleness 1: clock gap '$gap'"; fail=1; }

# The server's checkpoint holds the parameters and the AdamW state: it
# resumes in one process (plain all-reduce) and finishes the schedule.
run 3 --sync async --stop-after 6 --out "$tmp/ares" >/dev/null 2>"$tmp/ares.log"
if "$zs" train gpt "${common[@]}" --resume --out "$tmp/ares" >/dev/null 2>"$tmp/ares2.log" &&
   grep -q "resuming .* at step 6" "$tmp/ares2.log" &&
   [ "$(losses "$tmp/ares/metrics.jsonl" | wc -l)" = 12 ]; then
  echo "ok an async checkpoint (step 6) resumes in one process to step 12"
else
  echo "FAIL async checkpoint resume"; cat "$tmp/ares.log" "$tmp/ares2.log"; fail=1
fi

# refused ARGS... NEEDLE: exit code 2 and the message.
refused() {
  local np=$1 needle=$2; shift 2
  local out
  if [ "$np" = 1 ]; then
    out=$("$zs" train gpt "${common[@]}" "$@" --out "$tmp/bad" 2>&1 >/dev/null); rc=$?
  else
    out=$(run "$np" "$@" --out "$tmp/bad" 2>&1 >/dev/null); rc=$?
  fi
  if [ "$rc" -ne 0 ] && echo "$out" | grep -q -- "$needle"; then
    echo "ok refused ($np rank(s): $*): $(echo "$out" | grep -m1 -- "$needle")"
  else
    echo "FAIL not refused ($np rank(s): $*; rc $rc): $out"; fail=1
  fi
}
refused 1 "must be allreduce, ps, async or ssp" --sync gossip
refused 1 "need at least 2 ranks" --sync async
refused 1 "applies to --sync ssp only" --staleness 3
refused 1 "works with --sync allreduce only" --sync ps --zero 1
refused 1 "wants a number" --sync ssp --staleness -1
refused 3 "not divisible by the 2 workers" --sync async --batch 5
exit $fail
