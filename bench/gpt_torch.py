"""PyTorch peer of bench/gpt (run by bench/gpt with /usr/bin/python3).

The same GPT-2 as zs_gpt_new builds it, written plainly for torch 1.13:
token + learned position embeddings, L pre-LayerNorm blocks (c_attn
Linear(C, 3C) -> causal multi-head attention -> c_proj Linear(C, C);
c_fc Linear(C, 4C) -> GELU(tanh) -> c_proj Linear(4C, C)), ln_f, output
projection tied to the token embedding. Attention is the manual masked
softmax (torch 1.13 has no scaled_dot_product_attention). Initialisation
is GPT-2's N(0, 0.02) (it does not change speed).

Modes (one process runs those asked for, in this order):
  --train   AdamW (betas 0.9, 0.95, eps 1e-8, wd 0.1 on every parameter),
            clip_grad_norm_ 1.0, on random tokens; --warmup untimed steps
            then --steps timed steps. Prints
            `zsbench gpt train <steps> <seconds> <best step seconds> <loss>`.
  --generate  batch 1, --prompt random tokens, --new greedy tokens with a
            KV cache (prefill, then one token per forward); one untimed
            run then --reps timed runs. Prints
            `zsbench gpt generate <new tokens> <mean seconds> <best seconds>
            <prefill seconds of the best run>`.
  --memory  preset gpt2 (--mem-vocab), 2 training steps at --mem-batch x
            --mem-seq; prints `zsbench gpt memory <peak RSS bytes>`.
Prints `pytorch: not available (...)` and exits 0 when torch is missing.
"""
import argparse
import math
import resource
import sys
import time

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except Exception as e:  # noqa: BLE001 - any import failure means no peer
    print(f"pytorch: not available ({e.__class__.__name__}: {e})")
    sys.exit(0)

PRESETS = {  # name: (ctx, layers, heads, width), as zs_gpt_preset
    "tiny": (128, 2, 4, 64),
    "small": (256, 6, 6, 384),
    "gpt2": (1024, 12, 12, 768),
}


class Block(nn.Module):
    def __init__(self, C, H, ctx):
        super().__init__()
        self.H = H
        self.ln_1 = nn.LayerNorm(C)
        self.c_attn = nn.Linear(C, 3 * C)
        self.attn_proj = nn.Linear(C, C)
        self.ln_2 = nn.LayerNorm(C)
        self.c_fc = nn.Linear(C, 4 * C)
        self.gelu = nn.GELU(approximate="tanh")
        self.mlp_proj = nn.Linear(4 * C, C)
        mask = torch.tril(torch.ones(ctx, ctx, dtype=torch.bool))
        self.register_buffer("mask", mask.view(1, 1, ctx, ctx), persistent=False)

    def attention(self, h, cache, pos):
        """h [B, n, C] at positions pos..pos+n-1; cache None or (k, v)
        [B, H, max, D] filled up to pos (keys and values appended)."""
        B, n, C = h.shape
        D = C // self.H
        q, k, v = self.c_attn(h).split(C, dim=2)
        q = q.view(B, n, self.H, D).transpose(1, 2)
        k = k.view(B, n, self.H, D).transpose(1, 2)
        v = v.view(B, n, self.H, D).transpose(1, 2)
        if cache is not None:
            ck, cv = cache
            ck[:, :, pos:pos + n] = k
            cv[:, :, pos:pos + n] = v
            k, v = ck[:, :, :pos + n], cv[:, :, :pos + n]
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(D))
        if n > 1:  # a single new query sees every cached key
            att = att.masked_fill(~self.mask[:, :, pos:pos + n, :pos + n],
                                  float("-inf"))
        y = F.softmax(att, dim=-1) @ v
        return self.attn_proj(y.transpose(1, 2).reshape(B, n, C))

    def forward(self, x, cache=None, pos=0):
        x = x + self.attention(self.ln_1(x), cache, pos)
        return x + self.mlp_proj(self.gelu(self.c_fc(self.ln_2(x))))


class GPT(nn.Module):
    def __init__(self, vocab, ctx, layers, heads, width):
        super().__init__()
        self.ctx, self.layers, self.heads, self.width = ctx, layers, heads, width
        self.wte = nn.Embedding(vocab, width)
        self.wpe = nn.Embedding(ctx, width)
        self.h = nn.ModuleList(Block(width, heads, ctx) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)
        self.lm_head = nn.Linear(width, vocab, bias=False)
        self.lm_head.weight = self.wte.weight  # tied
        for name, p in self.named_parameters():
            if name.endswith("weight") and p.dim() == 2:
                std = 0.02
                if name.endswith("proj.weight"):
                    std /= math.sqrt(2 * layers)
                nn.init.normal_(p, 0.0, std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx, caches=None, pos=0):
        n = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(pos, pos + n))
        for i, b in enumerate(self.h):
            x = b(x, None if caches is None else caches[i], pos)
        return self.lm_head(self.ln_f(x))

    def new_cache(self, batch, max_len):
        D = self.width // self.heads
        shape = (batch, self.heads, max_len, D)
        return [(torch.zeros(shape), torch.zeros(shape)) for _ in self.h]


def build(preset, vocab):
    ctx, layers, heads, width = PRESETS[preset]
    return GPT(vocab, ctx, layers, heads, width)


def make_train_step(model, batch, seq, vocab, gen, bf16=False):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95),
                            eps=1e-8, weight_decay=0.1)
    model.train()

    def step():
        x = torch.randint(0, vocab, (batch, seq), generator=gen)
        y = torch.randint(0, vocab, (batch, seq), generator=gen)
        # --bf16: PyTorch's own CPU mixed precision (f32 weights, autocast
        # around forward and loss, backward outside it)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = model(x)
            loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), y.view(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()

    return step


def bench_train(a, gen, bf16=False):
    model = build(a.preset, a.vocab)
    step = make_train_step(model, a.batch, a.seq, a.vocab, gen, bf16)
    for _ in range(a.warmup):
        step()
    loss, best = 0.0, float("inf")
    t0 = time.perf_counter()
    for _ in range(a.steps):
        ts = time.perf_counter()
        loss = step()
        best = min(best, time.perf_counter() - ts)
    seconds = time.perf_counter() - t0
    name = "train-bf16" if bf16 else "train"
    print(f"zsbench gpt {name} {a.steps} {seconds:.9g} {best:.9g} {loss:.9g}",
          flush=True)


@torch.no_grad()
def generate(model, prompt, new):
    """Greedy decoding of `new` tokens after prompt [1, P]; returns
    (tokens, prefill seconds)."""
    caches = model.new_cache(1, prompt.shape[1] + new)
    t0 = time.perf_counter()
    logits = model(prompt, caches, 0)
    nxt = logits[:, -1].argmax(-1, keepdim=True)
    prefill = time.perf_counter() - t0
    out, pos = [nxt], prompt.shape[1]
    for _ in range(new - 1):
        logits = model(nxt, caches, pos)
        pos += 1
        nxt = logits[:, -1].argmax(-1, keepdim=True)
        out.append(nxt)
    return torch.cat(out, 1), prefill


def bench_generate(a, gen):
    model = build(a.preset, a.vocab)
    model.eval()
    prompt = torch.randint(0, a.vocab, (1, a.prompt), generator=gen)
    generate(model, prompt, a.new)
    total, best, best_prefill = 0.0, float("inf"), 0.0
    for _ in range(a.reps):
        t0 = time.perf_counter()
        _, prefill = generate(model, prompt, a.new)
        dt = time.perf_counter() - t0
        total += dt
        if dt < best:
            best, best_prefill = dt, prefill
    print(f"zsbench gpt generate {a.new} {total / a.reps:.9g} {best:.9g} "
          f"{best_prefill:.9g}", flush=True)


def bench_memory(a, gen):
    model = build("gpt2", a.mem_vocab)
    step = make_train_step(model, a.mem_batch, a.mem_seq, a.mem_vocab, gen)
    for _ in range(2):
        step()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(f"zsbench gpt memory {peak}", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--train", action="store_true")
    ap.add_argument("--generate", action="store_true")
    ap.add_argument("--memory", action="store_true")
    ap.add_argument("--preset", default="small", choices=sorted(PRESETS))
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--mem-vocab", type=int, default=50257)
    ap.add_argument("--mem-batch", type=int, default=4)
    ap.add_argument("--mem-seq", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--bf16", action="store_true",
                    help="train again under torch.autocast('cpu', bfloat16)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    gen = torch.Generator()
    gen.manual_seed(a.seed)
    print(f"pytorch {torch.__version__}, {torch.get_num_threads()} threads",
          flush=True)
    if a.train:
        bench_train(a, gen)
    if a.train and a.bf16:
        bench_train(a, gen, bf16=True)
    if a.generate:
        bench_generate(a, gen)
    if a.memory:
        bench_memory(a, gen)


if __name__ == "__main__":
    main()
