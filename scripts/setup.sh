#!/usr/bin/env bash
# One command from a fresh Debian 12 machine: installs what is missing,
# builds Zhisuan, and runs the main job on its default data.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)"
build/zs sysinfo --quick
# The main job: LeNet-5 on Fashion-MNIST, 5 epochs, then its evaluation.
build/zs train lenet --epochs 5 --out runs/lenet
build/zs eval --ckpt runs/lenet/checkpoint.safetensors
