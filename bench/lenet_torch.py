"""PyTorch peer of bench/lenet (run by bench/lenet with /usr/bin/python3).

LeNet-5 as zs_lenet5_new builds it (conv 1->6 5x5 pad 2, relu, maxpool 2,
conv 6->16 5x5, relu, maxpool 2, flatten, fc 400->120, relu, fc 120->84,
relu, fc 84->10), cross-entropy, Adam lr 1e-3, trained on Fashion-MNIST
read from the same IDX files (gzip + struct + numpy) and normalised the same
way, (pixel/255 - mean)/std. The whole training set is pre-loaded into one
tensor; a step gathers its shuffled batch from it (per-epoch permutation),
so the data pipeline costs about what Zhisuan's loader does.

Usage: lenet_torch.py --data DIR --steps N [--warmup W] [--threads T]
                      [--batch B] [--mean M] [--std S] [--seed K] [--block K]
Prints `zsbench lenet <steps> <seconds for the timed steps> <seconds per
step of the fastest --block consecutive steps> <last loss>`, or
`pytorch: not available` (exit 0) when torch cannot be imported.
"""
import argparse
import gzip
import os
import struct
import sys
import time

try:
    import numpy as np
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except Exception as e:  # noqa: BLE001 - any import failure means no peer
    print(f"pytorch: not available ({e.__class__.__name__}: {e})")
    sys.exit(0)


def read_idx(path):
    """An IDX file (plain or .gz) as a numpy array of its shape."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    zero, dtype, ndim = struct.unpack(">HBB", data[:4])
    if zero != 0 or dtype != 0x08:
        raise ValueError(f"{path}: not an unsigned-byte IDX file")
    shape = struct.unpack(f">{ndim}I", data[4:4 + 4 * ndim])
    return np.frombuffer(data, np.uint8, offset=4 + 4 * ndim).reshape(shape)


def find(data_dir, stem):
    for name in (stem + ".gz", stem):
        path = os.path.join(data_dir, name)
        if os.path.exists(path):
            return path
    raise FileNotFoundError(f"{data_dir}: no {stem}[.gz]")


def lenet5():
    return nn.Sequential(
        nn.Conv2d(1, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(400, 120), nn.ReLU(),
        nn.Linear(120, 84), nn.ReLU(),
        nn.Linear(84, 10))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--mean", type=float, default=0.2860)
    ap.add_argument("--std", type=float, default=0.3530)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--block", type=int, default=50)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)

    images = read_idx(find(a.data, "train-images-idx3-ubyte"))
    labels = read_idx(find(a.data, "train-labels-idx1-ubyte"))
    x_all = torch.from_numpy(images.astype(np.float32))
    x_all = ((x_all / 255.0 - a.mean) / a.std).unsqueeze(1).contiguous()
    y_all = torch.from_numpy(labels.astype(np.int64))
    n = x_all.shape[0]
    nb = (n + a.batch - 1) // a.batch

    model = lenet5()
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    gen = torch.Generator()
    perm, perm_epoch = None, -1

    def step(s):
        nonlocal perm, perm_epoch
        epoch, i = divmod(s, nb)
        if epoch != perm_epoch:
            gen.manual_seed(a.seed * 1000003 + epoch)
            perm, perm_epoch = torch.randperm(n, generator=gen), epoch
        idx = perm[i * a.batch:(i + 1) * a.batch]
        x, y = x_all.index_select(0, idx), y_all.index_select(0, idx)
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss.item()

    print(f"pytorch {torch.__version__}, {torch.get_num_threads()} threads",
          flush=True)
    for s in range(a.warmup):
        step(s)
    block = min(a.block, a.steps)
    loss, best = 0.0, float("inf")
    t0 = tb = time.perf_counter()
    for k in range(a.steps):
        loss = step(a.warmup + k)
        if (k + 1) % block == 0:
            tn = time.perf_counter()
            best, tb = min(best, (tn - tb) / block), tn
    seconds = time.perf_counter() - t0
    print(f"zsbench lenet {a.steps} {seconds:.9g} {best:.9g} {loss:.9g}",
          flush=True)


if __name__ == "__main__":
    main()
