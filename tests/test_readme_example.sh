#!/usr/bin/env bash
# Extracts the C example from README.md, compiles it against the built
# static library (with the sanitizer flags when the build uses them) and
# runs it: the README's tour must stay true.
set -euo pipefail
src="$ZS_SOURCE_DIR"
bin="$ZS_BINARY_DIR"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
. "$(dirname "$0")/readme_lib.sh"
readme_build readme-example example
out=$("$tmp/example")
echo "$out"
echo "$out" | grep -q "w = 2.000, b = 1.000" || { echo "example did not converge"; exit 1; }
echo "ok readme example"
