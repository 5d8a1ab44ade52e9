# Sourced by the README tests: readme_build MARKER NAME extracts the C
# block after <!-- MARKER --> in README.md into $tmp/NAME.c and compiles it
# against the built static library into $tmp/NAME, with the sanitizer
# flags when the build uses them and with mpicc when the library calls MPI
# (then mpi=1). Needs src, bin and tmp set.
readme_build() {
  local marker=$1 name=$2 flags="" cc=cc
  awk -v m="<!-- $marker -->" '$0 == m {f=1; next} f && /^```c/{g=1; next} g && /^```/{exit} g{print}' \
      "$src/README.md" > "$tmp/$name.c"
  [ -s "$tmp/$name.c" ] || { echo "no <!-- $marker --> example found in README.md"; exit 1; }
  grep -q "ZS_SANITIZE:BOOL=ON" "$bin/CMakeCache.txt" && flags="-fsanitize=address,undefined"
  mpi=0
  if [ "$(nm "$bin/libzs.a" 2>/dev/null | grep -c " U MPI_")" -gt 0 ]; then
    cc=mpicc
    mpi=1
  fi
  $cc -std=c11 -Wall -Wextra -Werror $flags -I"$src/include" "$tmp/$name.c" \
      "$bin/libzs.a" -lz -lcjson -lm -lpthread -o "$tmp/$name"
}
