"""PyTorch peer of bench/attention (run by it with /usr/bin/python3 under
the same ISA cap, bench/isa_cap.h).

Causal f32 attention on q, k, v [B, H, T, D]: F.scaled_dot_product_attention
(is_causal=True) where torch has it (>= 2.0), else the composition torch
1.13 offers: q k^T * D^-1/2, masked_fill of the keys after the query with
-inf, softmax, @ v. Forward and backward (o.backward(g)) are timed apart,
best of --reps after one warm-up. Prints
`zsbench attention <fwd seconds> <bwd seconds> <sdpa|composed>`, or
`pytorch: not available (...)` and exits 0 when torch is missing.
"""
import argparse
import math
import sys
import time

try:
    import torch
    import torch.nn.functional as F
except Exception as e:  # noqa: BLE001 - any import failure means no peer
    print(f"pytorch: not available ({e.__class__.__name__}: {e})")
    sys.exit(0)


def main():
    p = argparse.ArgumentParser()
    for name, dflt in (("B", 8), ("H", 6), ("T", 256), ("D", 64), ("threads", 0),
                       ("reps", 3)):
        p.add_argument("--" + name, type=int, default=dflt)
    a = p.parse_args()
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    torch.manual_seed(1)
    shape = (a.B, a.H, a.T, a.D)
    q, k, v = (torch.rand(shape).mul_(2).sub_(1).requires_grad_() for _ in range(3))
    g = torch.rand(shape) * 2 - 1
    sdpa = hasattr(F, "scaled_dot_product_attention")
    mask = torch.ones(a.T, a.T, dtype=torch.bool).triu_(1)

    def attn():
        if sdpa:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        s = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(a.D))
        return torch.softmax(s.masked_fill(mask, float("-inf")), dim=-1) @ v

    best_f = best_b = math.inf
    for rep in range(a.reps + 1):
        t0 = time.perf_counter()
        o = attn()
        t1 = time.perf_counter()
        o.backward(g)
        t2 = time.perf_counter()
        for x in (q, k, v):
            x.grad = None
        if rep > 0:
            best_f, best_b = min(best_f, t1 - t0), min(best_b, t2 - t1)
    print(f"zsbench attention {best_f:.6f} {best_b:.6f} "
          f"{'sdpa' if sdpa else 'composed'}")


if __name__ == "__main__":
    main()
