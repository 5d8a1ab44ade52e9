"""PyTorch peer of bench/conv (run by bench/conv with /usr/bin/python3).

Times conv2d forward and forward+backward (grads for input, weight, bias)
exactly as bench/conv does for Zhisuan: y = conv2d(x, w, b); y.backward(g),
gradients set to None between passes, best of --reps after --warmup.

Usage: conv_torch.py [--threads T] [--reps R] [--warmup W] N,C,H,W,O,K,S,P ...
Prints one line per layer: `zsbench conv <index> <fwd_s> <fwdbwd_s>`, or
`pytorch: not available` (exit 0) when torch cannot be imported.
"""
import argparse
import sys
import time

try:
    import torch
    import torch.nn.functional as F
except Exception as e:  # noqa: BLE001 - any import failure means no peer
    print(f"pytorch: not available ({e.__class__.__name__}: {e})")
    sys.exit(0)


def bench_layer(spec, reps, warmup):
    n, c, h, w, o, k, s, p = spec
    gen = torch.Generator().manual_seed(1)
    x = (torch.rand(n, c, h, w, generator=gen) * 2 - 1).requires_grad_()
    wt = ((torch.rand(o, c, k, k, generator=gen) * 2 - 1) * 0.2).requires_grad_()
    b = ((torch.rand(o, generator=gen) * 2 - 1) * 0.1).requires_grad_()
    oh = (h + 2 * p - k) // s + 1
    ow = (w + 2 * p - k) // s + 1
    g = torch.rand(n, o, oh, ow, generator=gen) * 2 - 1
    best_f = best_t = float("inf")
    for i in range(warmup + reps):
        x.grad = wt.grad = b.grad = None
        t0 = time.perf_counter()
        y = F.conv2d(x, wt, b, stride=s, padding=p)
        t1 = time.perf_counter()
        y.backward(g)
        t2 = time.perf_counter()
        del y
        if i >= warmup:
            best_f = min(best_f, t1 - t0)
            best_t = min(best_t, t2 - t0)
    return best_f, best_t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("layers", nargs="+")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    print(f"pytorch {torch.__version__}, {torch.get_num_threads()} threads",
          flush=True)
    for i, spec in enumerate(a.layers):
        f, t = bench_layer([int(v) for v in spec.split(",")], a.reps, a.warmup)
        print(f"zsbench conv {i} {f:.9g} {t:.9g}", flush=True)


if __name__ == "__main__":
    main()
