#!/usr/bin/env bash
# The flag parser every zs command shares (apps/zs/flags.c), through the
# two commands the other CLI tests do not cover: zs demo and zs sysinfo.
# Bad usage (unknown flag, missing value, a value that is not an integer,
# out of range or not finite, a stray argument) is one line on stderr
# naming the flag and what it accepts, and exit status 2; --help and -h
# print the usage on stdout and exit 0.
set -uo pipefail
zs="$ZS_BIN"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
. "$(dirname "$0")/cli_lib.sh" # check, expect2, refused

"$zs" demo --steps 3 >"$tmp/out" 2>&1
check "demo --steps 3 runs" '[ $? -eq 0 ] && grep -q "^step   2" "$tmp/out"'
"$zs" demo --steps 2e1 >"$tmp/out" 2>&1
check "demo --steps 2e1 is 20 steps" '[ $? -eq 0 ] && grep -q "^step  19" "$tmp/out"'
refused "demo --steps 2.5" "--steps wants a number in \[1, 1000000\] (an integer), got '2.5'" \
        "$zs" demo --steps 2.5
refused "demo --steps 0" "--steps wants a number" "$zs" demo --steps 0
refused "demo --steps 1e30" "--steps wants a number" "$zs" demo --steps 1e30
refused "demo --steps 99999999999999999999" "--steps wants a number" \
        "$zs" demo --steps 99999999999999999999
refused "demo --steps nan" "--steps wants a number" "$zs" demo --steps nan
refused "demo --steps ' 3'" "--steps wants a number" "$zs" demo --steps " 3"
refused "demo --steps without a value" "zs demo: --steps needs a value" "$zs" demo --steps
refused "demo: stray argument" "zs demo: unexpected argument 'now'" "$zs" demo now
refused "demo: a flag with a newline stays one line" "unknown flag '--x?y'" \
        "$zs" demo $'--x\ny'
"$zs" demo --help >"$tmp/out" 2>"$tmp/err"
check "demo --help exits 0, usage on stdout" '[ $? -eq 0 ] && grep -q "usage: zs demo" "$tmp/out" && [ ! -s "$tmp/err" ]'

"$zs" sysinfo --quick >"$tmp/out" 2>&1
check "sysinfo --quick runs" '[ $? -eq 0 ] && grep -q "cpu features" "$tmp/out"'
refused "sysinfo: unknown flag" "zs sysinfo: unknown flag '--fast'" "$zs" sysinfo --fast
"$zs" sysinfo -h >"$tmp/out" 2>&1
check "sysinfo -h exits 0 with the usage" '[ $? -eq 0 ] && grep -q "usage: zs sysinfo" "$tmp/out"'
exit $fail
