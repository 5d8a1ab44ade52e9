#!/usr/bin/env bash
# Installs the Debian 12 packages Zhisuan needs that are missing.
#   scripts/install-deps.sh          build + tests + data + benchmark peers
#   scripts/install-deps.sh --ci     only what building and testing need
set -euo pipefail

# clang + libclang-rt-14-dev (libFuzzer, only recommended by clang): test.sh --fuzz
core=(build-essential cmake pkg-config zlib1g-dev libcjson-dev libmicrohttpd-dev python3 libopenmpi-dev openmpi-bin
      clang libclang-rt-14-dev)
data=(dataset-fashion-mnist bible-kjv)
peers=(libopenblas-dev python3-torch)

want=("${core[@]}")
if [ "${1:-}" != "--ci" ]; then
  want+=("${data[@]}" "${peers[@]}")
fi

missing=()
for p in "${want[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" \
    || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all packages present"
  exit 0
fi
echo "install-deps: installing ${missing[*]}"
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
