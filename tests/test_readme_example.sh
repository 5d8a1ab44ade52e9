#!/usr/bin/env bash
# Extracts the C example from README.md, compiles it against the built
# static library (with the sanitizer flags when the build uses them) and
# runs it: the README's tour must stay true.
set -euo pipefail
src="$ZS_SOURCE_DIR"
bin="$ZS_BINARY_DIR"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
awk '/<!-- readme-example -->/{f=1; next} f && /^```c/{g=1; next} g && /^```/{exit} g{print}' \
    "$src/README.md" > "$tmp/example.c"
[ -s "$tmp/example.c" ] || { echo "no example found in README.md"; exit 1; }
flags=""
grep -q "ZS_SANITIZE:BOOL=ON" "$bin/CMakeCache.txt" && flags="-fsanitize=address,undefined"
cc -std=c11 -Wall -Wextra -Werror $flags -I"$src/include" "$tmp/example.c" \
   "$bin/libzs.a" -lz -lcjson -lm -lpthread -o "$tmp/example"
out=$("$tmp/example")
echo "$out"
echo "$out" | grep -q "w = 2.000, b = 1.000" || { echo "example did not converge"; exit 1; }
echo "ok readme example"
