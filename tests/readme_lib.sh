# Sourced by the README tests: readme_build MARKER NAME extracts the C
# block after <!-- MARKER --> in README.md into $tmp/NAME.c and compiles it
# against the built static library into $tmp/NAME, with the sanitizer
# flags when the build uses them and with mpicc when the library calls MPI
# (then mpi=1), linking the libraries the build itself found (CMakeCache:
# a cJSON or zlib outside the system paths, as on a machine where they were
# extracted from packages, is found the same way). Needs src, bin and tmp set.

# cache_path VAR: the value of VAR in the build's CMakeCache.txt, or empty.
cache_path() {
  sed -n "s/^$1:[A-Z]*=//p" "$bin/CMakeCache.txt" | head -1
}
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
  local cjson zlib
  cjson=$(cache_path CJSON_LIB); zlib=$(cache_path ZLIB_LIBRARY_RELEASE)
  [ -n "$zlib" ] || zlib=$(cache_path ZLIB_LIBRARY)
  $cc -std=c11 -Wall -Wextra -Werror $flags -I"$src/include" "$tmp/$name.c" \
      "$bin/libzs.a" "${zlib:--lz}" "${cjson:--lcjson}" -lm -lpthread \
      ${cjson:+-Wl,-rpath,"$(dirname "$cjson")"} -o "$tmp/$name"
}
