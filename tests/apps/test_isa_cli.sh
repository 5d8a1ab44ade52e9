#!/usr/bin/env bash
# ZS_CPU_ISA caps the kernels' run-time dispatch (zs_cpu()): `zs sysinfo`
# reports the cap and the path of each kernel family under it; a cap above
# the hardware changes nothing; a bad value is warned about once and
# ignored (exit 0).
set -uo pipefail
zs="$ZS_BIN"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
. "$(dirname "$0")/cli_lib.sh" # check, expect2, refused

ZS_CPU_ISA=portable "$zs" sysinfo --quick > "$tmp/p" 2>&1
check "portable: cap printed, no vector feature left" \
      'grep -q "^isa cap *portable" "$tmp/p" && grep -q "avx2=0 fma=0" "$tmp/p"'
check "portable: the f32 GEMM is the reference kernel" 'grep -q "gemm f32 *ref" "$tmp/p"'
check "portable: quantized matmul portable" 'grep -q "quantized matmul *portable" "$tmp/p"'
if grep -q avx2 /proc/cpuinfo && grep -q fma /proc/cpuinfo; then
  ZS_CPU_ISA=avx2 "$zs" sysinfo --quick > "$tmp/a" 2>&1
  check "avx2: cap printed, AVX-512 cleared" \
        'grep -q "^isa cap *avx2" "$tmp/a" && grep -q "avx512f=0" "$tmp/a"'
  check "avx2: the f32 GEMM takes its AVX2 kernel" 'grep -q "gemm f32 *avx2" "$tmp/a"'
fi
"$zs" sysinfo --quick > "$tmp/d" 2>&1
ZS_CPU_ISA=avx512 "$zs" sysinfo --quick > "$tmp/h" 2>&1
check "avx512 (the highest) = the default" 'cmp -s "$tmp/d" "$tmp/h"'
ZS_CPU_ISA=sse9 "$zs" sysinfo --quick > "$tmp/out" 2>"$tmp/err"; rc=$?
check "a bad value: exit 0, one warning naming it" \
      '[ $rc -eq 0 ] && [ $(wc -l <"$tmp/err") -eq 1 ] && grep -q "ZS_CPU_ISA=sse9" "$tmp/err"'
exit $fail
