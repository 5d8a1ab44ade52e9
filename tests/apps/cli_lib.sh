# cli_lib.sh - checks shared by the command-line tests (sourced, not run).
# The caller sets tmp (a scratch directory) and fail=0; a failed check
# prints FAIL and sets fail=1.

# check NAME EXPR: EXPR (eval'd) is true
check() { if eval "$2"; then echo "ok $1"; else echo "FAIL $1"; fail=1; fi; }

# expect2 NAME COMMAND...: exit status 2 and a message of 1..3 lines on stderr
expect2() {
  local name=$1; shift
  "$@" >"$tmp/out" 2>"$tmp/err"; local rc=$?
  if [ $rc -eq 2 ] && [ -s "$tmp/err" ] && [ "$(wc -l <"$tmp/err")" -le 3 ]; then
    echo "ok $name: $(head -1 "$tmp/err")"
  else
    echo "FAIL $name: exit $rc, stderr: $(cat "$tmp/err")"; fail=1
  fi
}

# refused NAME NEEDLE COMMAND...: exit status 2 before any work: stdout
# empty, stderr exactly one line (no progress before it) containing NEEDLE
refused() {
  local name=$1 needle=$2; shift 2
  "$@" >"$tmp/out" 2>"$tmp/err"; local rc=$?
  if [ $rc -eq 2 ] && [ "$(wc -l <"$tmp/err")" -eq 1 ] && [ ! -s "$tmp/out" ] &&
     grep -q -- "$needle" "$tmp/err"; then
    echo "ok $name: $(cat "$tmp/err")"
  else
    echo "FAIL $name: exit $rc, stdout $(wc -c <"$tmp/out") bytes, stderr: $(cat "$tmp/err")"
    fail=1
  fi
}
