# par3d_common.sh - sourced by tests/train/test_parallel3d*.sh: a corpus,
# the common flags of the runs (tiny GPT, 4 blocks, 10 steps), the
# one-process reference $tmp/one-gpt2 and the helpers (par, one, same).
set -uo pipefail
zs="$ZS_BIN"
if ! command -v mpirun >/dev/null; then
  echo "mpirun not installed: model-parallel test not run"; exit 0
fi
# slow CMD...: CMD, but not under ZS_TEST_QUICK (scripts/test.sh --asan sets
# it: the sanitizer run takes the runs that cover each code path once, the
# release run takes them all).
slow() {
  if [ -n "${ZS_TEST_QUICK:-}" ]; then echo "skip ($*): ZS_TEST_QUICK"; return 0; fi
  "$@"
}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for i in $(seq 1 300); do
  echo "In the beginning was the word $i, and the word was with the light; and the light shone."
done > "$tmp/corpus.txt"
# 4 blocks of width 64, 4 heads, vocabulary 300 (divisible by 2 and 4)
common=(--data "$tmp/corpus.txt" --preset tiny --layers 4 --vocab 300 --batch 8 --seq 32
        --seed 5 --threads 1 --eval-every 4 --warmup 3 --steps 10)
mpi=(mpirun --allow-run-as-root --oversubscribe)
fail=0
# OpenMPI's plugins keep memory until exit: no leak check for MPI runs.
export ASAN_OPTIONS=detect_leaks=0
"$zs" train gpt "${common[@]}" --arch gpt2 --out "$tmp/one-gpt2" >/dev/null 2>"$tmp/log" \
  || { cat "$tmp/log"; exit 1; }
# col FILE KEY: the values of KEY on the step lines of metrics.jsonl.
col() { grep '"loss"' "$1" | sed "s/.*\"$2\":\([-0-9.e+]*\).*/\1/"; }
# same NAME REF DIR: DIR's 10 step losses and gradient norms equal REF's
# within $tol relative (the losses) and $ntol (the norms); 1e-5 in f32.
tol=1e-5 ntol=1e-5
same() {
  local worst
  worst=$(paste <(col "$2/metrics.jsonl" loss) <(col "$3/metrics.jsonl" loss) \
                <(col "$2/metrics.jsonl" grad_norm) <(col "$3/metrics.jsonl" grad_norm) |
          awk '{for (k = 1; k <= 3; k += 2) {d = ($k - $(k+1)) / $k; if (d < 0) d = -d;
                if (d > w[k]) w[k] = d}; n++}
               END {if (n != 10) print "missing"; else printf "%.2e %.2e\n", w[1], w[3]}')
  if [ "$worst" != "missing" ] &&
     awk -v t="$tol" -v nt="$ntol" "BEGIN{split(\"$worst\", w, \" \"); exit !(w[1] <= t && w[2] <= nt)}"; then
    echo "ok $1: 10 step losses and gradient norms equal one process's within" \
         "${worst% *} and ${worst#* } relative (bounds $tol, $ntol)${took:+; ran $took s}"
  else
    echo "FAIL $1: worst relative differences (losses, norms) $worst (bounds $tol, $ntol)" \
         "${took:+; ran $took s}"; fail=1
  fi
}
# now: seconds since the epoch, to the millisecond; since T0: seconds
# from T0 to now, one decimal (the runs' times on the ok lines).
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN{printf "%.1f", b - a}'; }
# par ARCH NP NAME FLAGS...: mpirun -np NP zs train gpt FLAGS, compared
# with the one-process run $ref (default: one-ARCH).
par() {
  local arch=$1 np=$2 name=$3 t0 took; shift 3
  t0=$(now)
  if "${mpi[@]}" -np "$np" "$zs" train gpt "${common[@]}" --arch $arch "$@" \
      --out "$tmp/$name" >/dev/null 2>"$tmp/$name.log"; then
    took=$(since "$t0") same "$name ($arch, $np ranks: $*)" "$tmp/${ref:-one-$arch}" "$tmp/$name"
  else
    echo "FAIL $name (mpirun -np $np $*, $(since "$t0") s):"; cat "$tmp/$name.log"; fail=1
  fi
}
# one NAME FLAGS...: the one-process reference run with FLAGS.
one() {
  local name=$1; shift
  "$zs" train gpt "${common[@]}" "$@" --out "$tmp/$name" >/dev/null 2>"$tmp/$name.log" \
    || { echo "FAIL one-process $name:"; cat "$tmp/$name.log"; fail=1; }
}
