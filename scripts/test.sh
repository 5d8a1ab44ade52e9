#!/usr/bin/env bash
# Builds Zhisuan and runs the whole test suite (ctest).
#   scripts/test.sh                 release build in build/
#   scripts/test.sh --asan          ASan + UBSan (LeakSanitizer on) build in build-asan/
#                                   (-O2 -g: 2-5x faster than -O0 under ASan;
#                                   accesses the optimiser removes go unchecked);
#                                   ZS_TEST_QUICK=1: the long end-to-end scripts
#                                   leave out the runs that repeat a code path
#   scripts/test.sh --tsan          ThreadSanitizer build in build-tsan/: builds and
#                                   runs test_threads (several user threads training
#                                   at once), the core, autograd, nn, optim and
#                                   dispatch unit tests and the in-process server
#                                   tests (HTTP threads + engine thread); the first
#                                   race reported fails the run.
#   scripts/test.sh --fuzz [SECS]   libFuzzer build (clang) in build-fuzz/: each
#                                   harness of tests/fuzz runs SECS seconds (default
#                                   60); what it finds is copied into
#                                   tests/fuzz/corpus/<name>/ and fails the run.
#                                   Without clang: a note, exit 0.
set -euo pipefail
cd "$(dirname "$0")/.."

# One libFuzzer campaign per harness over build-fuzz/fuzz-work/<name>/,
# which starts from the build's seeds and the regression corpus and keeps
# what the fuzzer adds between runs. Prints a table of executions, edge
# coverage (cov), features (ft) and speed.
fuzz() {
  local secs=${1:-60} dir=build-fuzz
  if ! [[ "$secs" =~ ^[1-9][0-9]*$ ]]; then
    echo "test.sh: --fuzz takes a number of seconds, got '$secs'" >&2
    exit 2
  fi
  if ! command -v clang >/dev/null 2>&1; then
    echo "fuzz: clang not found, no fuzzing (scripts/install-deps.sh installs it)"
    exit 0
  fi
  if ! echo 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n) { return 0; }' |
       clang -x c -fsanitize=fuzzer - -o /dev/null >/dev/null 2>&1; then
    echo "fuzz: clang cannot link -fsanitize=fuzzer (libclang-rt-14-dev missing?), no fuzzing"
    exit 0
  fi
  CC=clang cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DZS_FUZZ=ON \
    -DZS_BUILD_BENCH=OFF >/dev/null
  cmake --build "$dir" -j"$(nproc)" --target fuzzers
  rm -rf "$dir/fuzz-seeds" "$dir/fuzz-artifacts"
  "$dir/make_seeds" "$dir/fuzz-seeds" >/dev/null
  mkdir -p "$dir/fuzz-logs"
  export ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1
  local found=0 bin name work art log rc line f execs cov ft speed
  printf '%-16s %10s %7s %7s %8s  %s\n' harness execs cov ft exec/s result
  for bin in "$dir"/fuzz/fuzz_*; do
    name=${bin##*/fuzz_}
    work=$dir/fuzz-work/$name
    art=$dir/fuzz-artifacts/$name
    log=$dir/fuzz-logs/$name.log
    mkdir -p "$work" "$art"
    for f in "$dir/fuzz-seeds/$name"/* tests/fuzz/corpus/"$name"/*; do
      [ -f "$f" ] && cp "$f" "$work/"
    done
    rc=0
    "$bin" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -detect_leaks=1 \
      -artifact_prefix="$art/" "$work" >"$log" 2>&1 || rc=$?
    # the last status line: "#N  DONE|pulse|NEW ... cov: X ft: Y ... exec/s: Z"
    # (none when an input of the corpus fails before fuzzing starts)
    line=$(grep -E '^#[0-9]+' "$log" | tail -1 || true)
    execs=$(sed -nE 's/^#([0-9]+).*/\1/p' <<<"$line")
    cov=$(sed -nE 's/.* cov: ([0-9]+).*/\1/p' <<<"$line")
    ft=$(sed -nE 's/.* ft: ([0-9]+).*/\1/p' <<<"$line")
    speed=$(sed -nE 's/.* exec\/s: ([0-9]+).*/\1/p' <<<"$line")
    printf '%-16s %10s %7s %7s %8s  %s\n' "$name" "${execs:--}" "${cov:--}" "${ft:--}" \
      "${speed:--}" "$([ $rc -eq 0 ] && echo ok || echo "FOUND (exit $rc), log $log")"
    [ $rc -eq 0 ] || found=1
    for f in "$art"/crash-* "$art"/leak-* "$art"/timeout-* "$art"/oom-*; do
      [ -f "$f" ] || continue
      save_finding "$f" "tests/fuzz/corpus/$name"
    done
    [ $rc -eq 0 ] || grep -m1 -E '^SUMMARY:|ERROR: libFuzzer' "$log" | sed 's/^/    /' || true
  done
  exit $found
}

# Copies a libFuzzer artifact into the regression corpus unless a file
# with the same bytes is there already (an old reproducer found again).
save_finding() {
  local f=$1 corpus=$2 g
  mkdir -p "$corpus"
  for g in "$corpus"/*; do
    if [ -f "$g" ] && cmp -s "$f" "$g"; then
      echo "    $(basename "$f"): same bytes as $g"
      return
    fi
  done
  cp "$f" "$corpus/"
  echo "    saved $corpus/$(basename "$f")"
}

# The ThreadSanitizer run: only the tests that exercise threads and the
# layers they run through are built (every test takes 6 minutes on CI's two
# cores; all but the MPI ones pass, and OpenMPI's TCP transport reports
# lock-order inversions of its own). No suppressions: a report in our code
# is a bug.
TSAN_TESTS=(test_threads test_tensor test_autograd test_mlp test_nn test_gpt
            test_optim test_dispatch test_serve_errors test_serve_stream
            test_thread_pool test_serve_limits test_alloc_window)
tsan() {
  local dir=build-tsan
  cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DZS_TSAN=ON \
    -DZS_BUILD_BENCH=OFF >/dev/null
  cmake --build "$dir" -j"$(nproc)" --target "${TSAN_TESTS[@]}"
  export TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1
  cd "$dir"
  local re
  re="^($(IFS='|'; echo "${TSAN_TESTS[*]}"))\$"
  ctest --output-on-failure -j"$(nproc)" -R "$re"
  exit 0
}

if [ "${1:-}" = "--fuzz" ]; then
  fuzz "${2:-60}"
fi
if [ "${1:-}" = "--tsan" ]; then
  tsan
fi
dir=build
flags=(-DCMAKE_BUILD_TYPE=Release)
if [ "${1:-}" = "--asan" ]; then
  dir=build-asan
  flags=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DZS_SANITIZE=ON -DZS_BUILD_BENCH=OFF)
  export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0
  # the long end-to-end scripts run each code path once, not every
  # combination (tests/train/par3d_common.sh: slow)
  export ZS_TEST_QUICK=1
  export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
fi
cmake -S . -B "$dir" "${flags[@]}" >/dev/null
cmake --build "$dir" -j"$(nproc)"
cd "$dir"
ctest --output-on-failure -j"$(nproc)"
