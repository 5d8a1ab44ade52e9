#!/usr/bin/env bash
# gpu-check.sh - what a session lent the GPU machine runs there, so that
# every such session also tests Zhisuan on a many-core CPU (issue 30).
#
#   scripts/gpu-check.sh --fetch
#       here, on the Debian 12 development machine (network): downloads
#       the .debs the GPU machine lacks (cJSON, libmicrohttpd, pkgconf)
#       into build-gpu-debs/, which build*/ keeps out of git.
#   scripts/gpu-check.sh [--jobs N] [--robust-runs N] [--skip-suite] [--cuda-only]
#       there (Ubuntu 24.04, 16 cores, no cJSON, libmicrohttpd or MPI
#       headers), from the repository root, with build-gpu-debs carried:
#         run(command="bash scripts/gpu-check.sh", carry=["build-gpu-debs"])
#       1. extracts the .debs into build-gpu-debs/root (dpkg -x) and points
#          the build at them: PKG_CONFIG_PATH + PKG_CONFIG_SYSROOT_DIR for
#          libmicrohttpd (its .pc without Requires.private: gnutls has no
#          .pc there), CJSON_LIB / CJSON_INCLUDE for cJSON, LD_LIBRARY_PATH
#          for the programs and tests;
#       2. builds the CPU build (Release) in build-gpu-cpu/ and runs the
#          whole ctest suite with the default thread count (ZS_NUM_THREADS
#          unset: one per core), N tests at a time (--jobs, default 4);
#       3. runs test_serve_robust 10 times in a row (--robust-runs);
#       4. the CUDA tests, memcheck, sysinfo and a short GPT run on cuda
#          (step 4 below; --cuda-only skips steps 2 and 3);
#       and prints a summary. Logs go to $OUT when it is set (the device
#       tool brings back what is there), else to build-gpu-cpu/logs.
# Exit status 0 when everything passed.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2

debs=build-gpu-debs
pkgs=(libcjson1 libcjson-dev libmicrohttpd12 libmicrohttpd-dev pkgconf pkgconf-bin libpkgconf3)

if [ "${1:-}" = "--fetch" ]; then
  mkdir -p "$debs"
  (cd "$debs" && apt-get download "${pkgs[@]}") || { echo "gpu-check: apt-get download failed" >&2; exit 1; }
  ls -l "$debs"
  exit 0
fi

jobs=4 runs=10 suite=1
while [ $# -gt 0 ]; do
  case "$1" in
    --jobs) jobs=$2; shift ;;
    --robust-runs) runs=$2; shift ;;
    --skip-suite) suite=0 ;;
    --cuda-only) suite=0 runs=0 ;;
    *) echo "gpu-check: unknown argument $1 (see the head of this script)" >&2; exit 2 ;;
  esac
  shift
done

bin=build-gpu-cpu
logs=${OUT:-$bin/logs}
mkdir -p "$bin" "$logs"
summary=$logs/summary.txt
: >"$summary"
say() { echo "$*" | tee -a "$summary"; }
status=0

say "gpu-check: $(nproc) cores, $(uname -r), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"

# ---- 1. the carried packages ------------------------------------------------
root=$PWD/$debs/root
arch=$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)
lib=$root/usr/lib/$arch
if ls "$debs"/*.deb >/dev/null 2>&1; then
  mkdir -p "$root"
  for f in "$debs"/*.deb; do
    dpkg -x "$f" "$root" || { say "gpu-check: cannot extract $f"; exit 1; }
  done
  pc=$lib/pkgconfig/libmicrohttpd.pc
  [ -f "$pc" ] && sed -i '/^Requires.private/d' "$pc"
  export PKG_CONFIG_PATH=$lib/pkgconfig PKG_CONFIG_SYSROOT_DIR=$root
  # the headers and libraries sit under the sysroot's /usr: keep the flags
  export PKG_CONFIG_ALLOW_SYSTEM_CFLAGS=1 PKG_CONFIG_ALLOW_SYSTEM_LIBS=1
  export LD_LIBRARY_PATH=$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  if ! command -v pkg-config >/dev/null 2>&1 && [ -x "$root/usr/bin/pkgconf" ]; then
    ln -sf "$root/usr/bin/pkgconf" "$root/usr/bin/pkg-config"
    export PATH=$root/usr/bin:$PATH
  fi
  cjson_args=(-DCJSON_LIB="$lib/libcjson.so" -DCJSON_INCLUDE="$root/usr/include")
  say "packages: $(find "$debs" -maxdepth 1 -name "*.deb" | wc -l) .debs extracted into $root"
else
  cjson_args=()
  say "packages: none in $debs/ (scripts/gpu-check.sh --fetch, then carry it): the system's"
fi

# ---- 2. the CPU build and the whole suite -----------------------------------
gen=()
command -v ninja >/dev/null 2>&1 && gen=(-G Ninja)
t0=$(date +%s)
if ! { cmake -S . -B "$bin" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DZS_BUILD_BENCH=OFF \
         "${cjson_args[@]}" && cmake --build "$bin" -j"$(nproc)"; } >"$logs/build.log" 2>&1; then
  say "build: FAILED (tail of $logs/build.log:)"
  tail -30 "$logs/build.log" | tee -a "$summary"
  exit 1
fi
say "build: ok in $(( $(date +%s) - t0 )) s"

unset ZS_NUM_THREADS
if [ "$suite" = 1 ]; then
  t0=$(date +%s)
  (cd "$bin" && ctest -j"$jobs" --timeout 900) >"$logs/ctest.log" 2>&1
  rc=$?
  say "suite (ctest -j$jobs, default thread count): $(grep -E 'tests passed' "$logs/ctest.log") in $(( $(date +%s) - t0 )) s"
  grep -E '^\s+[0-9]+ - ' "$logs/ctest.log" | sed 's/^/  failed: /' | tee -a "$summary"
  [ "$rc" = 0 ] || status=1
fi

# ---- 3. test_serve_robust, runs times in a row ------------------------------
pass=0
: >"$logs/robust.log"
for i in $(seq 1 "$runs"); do
  t0=$(date +%s.%N)
  ZS_BINARY_DIR=$PWD/$bin "$bin/test_serve_robust" >"$logs/robust-run.log" 2>&1
  rc=$?
  dt=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  { echo "==== run $i: exit $rc, ${dt} s"; cat "$logs/robust-run.log"; } >>"$logs/robust.log"
  line=$(grep -m1 '^hostile load' "$logs/robust-run.log")
  if [ "$rc" = 0 ]; then
    pass=$((pass + 1))
    say "  robust run $i: ok (${dt} s; $line)"
  else
    say "  robust run $i: FAILED ($line); first failures:"
    grep -m5 -E '^FAIL|died' "$logs/robust-run.log" | cut -c1-300 | sed 's/^/    /' | tee -a "$summary"
  fi
done
rm -f "$logs/robust-run.log"
say "test_serve_robust: $pass of $runs runs passed"
[ "$pass" = "$runs" ] || status=1

# ---- 4. CUDA ------------------------------------------------------------------
# The build above compiles the CUDA backend whenever nvcc is found (ZS_CUDA
# AUTO); here, with the GPU present, its tests run instead of skipping:
#   a. test_cuda (device, allocator, pointwise, optimizer) and test_cuda_ops
#      (every kernel of a GPT step against the f64 CPU reference, bad
#      indices, determinism, GPT f32/bf16 steps against the CPU) - both are
#      also in the suite of step 2, run again here for their own logs;
#   b. compute-sanitizer memcheck on test_cuda_ops (bounded by a timeout:
#      the GPT steps are slow under it; a timeout is reported, not failed);
#   c. zs sysinfo (the GPU line);
#   d. zs train gpt --preset tiny, 30 steps on cuda and on the cpu from a
#      corpus made of the repository's docs (the Bible need not be there),
#      the losses of both printed side by side.
# --cuda-only skips steps 2 and 3 (the suite and the robust runs) to save
# device time. Budget: about 2 min of tests, 2 min of memcheck, 1 min of
# training beside the build.
if ! grep -q '^ZS_HAVE_CUDA:INTERNAL=ON' "$bin/CMakeCache.txt" 2>/dev/null &&
   ! grep -q 'CUDA backend: on' "$logs/build.log"; then
  say "cuda: the build has no CUDA backend (no nvcc?): not checked"
  status=1
else
  cuda_row() { printf '  %-34s %s\n' "$1" "$2" | tee -a "$summary"; }
  say "cuda:"
  for t in test_cuda test_cuda_ops; do
    t0=$(date +%s)
    (cd "$bin" && timeout 600 "./$t") >"$logs/$t.log" 2>&1
    rc=$?
    res=$(tail -1 "$logs/$t.log")
    if [ "$rc" = 77 ]; then cuda_row "$t" "SKIPPED ($res)"; status=1; continue; fi
    [ "$rc" = 0 ] && cuda_row "$t" "ok ($res, $(( $(date +%s) - t0 )) s)" ||
      { cuda_row "$t" "FAILED (exit $rc: $res)"; grep -m8 '^FAIL' "$logs/$t.log" |
          cut -c1-300 | sed 's/^/    /' | tee -a "$summary"; status=1; }
  done
  san=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  if [ -x "$san" ]; then
    t0=$(date +%s)
    (cd "$bin" && timeout 240 "$san" --tool memcheck --error-exitcode 9 ./test_cuda_ops) \
      >"$logs/memcheck.log" 2>&1
    rc=$?
    errs=$(grep -m1 'ERROR SUMMARY' "$logs/memcheck.log")
    case $rc in
      0) cuda_row "memcheck test_cuda_ops" "clean ($errs, $(( $(date +%s) - t0 )) s)" ;;
      124) cuda_row "memcheck test_cuda_ops" "timed out after 240 s (${errs:-no summary}; see memcheck.log)" ;;
      *) cuda_row "memcheck test_cuda_ops" "FAILED (exit $rc: $errs)"; status=1 ;;
    esac
  else
    cuda_row "memcheck test_cuda_ops" "no compute-sanitizer"
  fi
  "$bin/zs" sysinfo >"$logs/sysinfo.log" 2>&1
  cuda_row "zs sysinfo" "$(grep -m1 '^gpu' "$logs/sysinfo.log" | cut -c16-)"
  cat README.md docs/*.md >"$logs/corpus.txt" 2>/dev/null
  for dev in cuda cpu; do
    t0=$(date +%s)
    timeout 300 "$bin/zs" train gpt --device "$dev" --preset tiny --vocab 512 --steps 30 \
      --warmup 5 --eval-every 1000 --data "$logs/corpus.txt" --out "$bin/runs-gpt-$dev" \
      >"$logs/train-gpt-$dev.log" 2>&1
    rc=$?
    last=$(grep -iE 'loss' "$logs/train-gpt-$dev.log" | tail -1 | cut -c1-120)
    [ "$rc" = 0 ] && cuda_row "zs train gpt tiny, 30 steps, $dev" "ok ($(( $(date +%s) - t0 )) s; $last)" ||
      { cuda_row "zs train gpt tiny, 30 steps, $dev" "FAILED (exit $rc; $(tail -1 "$logs/train-gpt-$dev.log" | cut -c1-200))";
        [ "$dev" = cuda ] && status=1; }
  done
fi

say "gpu-check: $([ "$status" = 0 ] && echo "everything passed" || echo "FAILURES (above)")"
exit "$status"
