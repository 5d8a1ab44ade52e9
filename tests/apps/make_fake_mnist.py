#!/usr/bin/env python3
"""Writes a small synthetic MNIST-format data set (gzip IDX files).

usage: make_fake_mnist.py DIR NTRAIN NTEST [SIDE]
Class k images are a noisy bright bar at row 2k+4, so a CNN can learn them;
deterministic (fixed LCG), standard library only. SIDE (default 28) makes
SIDE x SIDE images, and NTEST 0 an empty test set, for the tests of bad
data.
"""
import gzip
import os
import struct
import sys


def lcg(seed):
    while True:
        seed = (seed * 6364136223846793005 + 1442695040888963407) % (1 << 64)
        yield seed >> 33


def write(path, magic_type, dims, payload):
    with gzip.open(path, "wb") as f:
        f.write(bytes([0, 0, magic_type, len(dims)]))
        for d in dims:
            f.write(struct.pack(">I", d))
        f.write(payload)


def make(dirname, prefix, n, seed, side=28):
    rnd = lcg(seed)
    images = bytearray()
    labels = bytearray()
    for _ in range(n):
        k = next(rnd) % 10
        labels.append(k)
        for r in range(side):
            for c in range(side):
                v = next(rnd) % 60
                if r in (2 * k + 4, 2 * k + 5) and 4 <= c < 24:
                    v += 180
                images.append(v)
    write(f"{dirname}/{prefix}-images-idx3-ubyte.gz", 0x08, [n, side, side], bytes(images))
    write(f"{dirname}/{prefix}-labels-idx1-ubyte.gz", 0x08, [n], bytes(labels))


if __name__ == "__main__":
    d, ntr, nte = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    side = int(sys.argv[4]) if len(sys.argv) > 4 else 28
    os.makedirs(d, exist_ok=True)
    make(d, "train", ntr, 1, side)
    make(d, "t10k", nte, 2, side)
