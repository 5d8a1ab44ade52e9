#!/usr/bin/env bash
# Extracts the zs_trainer example from README.md, compiles it against the
# built static library (mpicc when the library uses MPI), tokenizes a small
# corpus with `zs train gpt`, and runs the example alone and under
# mpirun -np 2: both must train (loss falls) and report the same losses
# (data parallelism computes what one process does, up to the order of the
# additions).
set -euo pipefail
src="$ZS_SOURCE_DIR"
bin="$ZS_BINARY_DIR"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
. "$(dirname "$0")/readme_lib.sh"
readme_build readme-example-trainer train
# a small corpus, tokenized by the command line
for i in $(seq 1 300); do
  echo "In the beginning God created the heaven and the earth, verse $i."
  echo "And the earth was without form, and void; and darkness was upon the deep."
done > "$tmp/corpus.txt"
"$ZS_BIN" train gpt --preset tiny --seq 64 --vocab 300 --steps 1 --data "$tmp/corpus.txt" \
    --out "$tmp/run" >/dev/null 2>&1
export ASAN_OPTIONS=detect_leaks=0
"$tmp/train" "$tmp/run" > "$tmp/one.txt"
cat "$tmp/one.txt"
awk 'NR==1{a=$4} END{exit !($4 < a - 0.5)}' "$tmp/one.txt" ||
  { echo "FAIL the example did not learn"; exit 1; }
echo "ok readme trainer example, one process"
if [ $mpi = 1 ] && command -v mpirun >/dev/null; then
  mpirun --allow-run-as-root --oversubscribe -np 2 "$tmp/train" "$tmp/run" > "$tmp/two.txt"
  paste "$tmp/one.txt" "$tmp/two.txt" | awk '{d = $4 - $8; if (d < 0) d = -d;
      if (d > 2e-3 || $2 != $6 || $3 != $7) bad = 1} END{exit bad}' ||
    { echo "FAIL 1 and 2 ranks differ:"; paste "$tmp/one.txt" "$tmp/two.txt"; exit 1; }
  echo "ok readme trainer example under mpirun -np 2: the same losses"
fi
