/*
 * zs/attention.h - fused scaled dot-product attention (flash attention on
 * the CPU), the attention of the GPT and BLOOM models.
 *
 * out = softmax(q k^T * scale + bias + mask) v per (batch, head), computed
 * in tiles with an online softmax (running max and sum), so the Tq x Tk
 * score matrix never exists in memory: forward keeps O and the per-row
 * logsumexp, backward recomputes the scores tile by tile. Memory therefore
 * grows linearly with the sequence length. See src/ops/attention.c.
 */
#ifndef ZS_ATTENTION_H
#define ZS_ATTENTION_H

#include "core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct zs_attention_params {
    /* Query i (absolute position q_offset + i) sees keys 0..q_offset + i
     * only; requires q_offset + Tq <= Tk. */
    bool causal;
    /* Multiplies q k^T; 0 means 1/sqrt(D). */
    double scale;
    /* Adds BLOOM's ALiBi bias -slope_h * (q_offset + i - j) to the scaled
     * score of query i and key j, with zs_alibi_slopes(H) (added after the
     * scale, as in BLOOM). */
    bool alibi;
    /* Absolute position of query row 0 (KV cache: Tk - Tq); >= 0. */
    int64_t q_offset;
} zs_attention_params;

/* q [B, H, Tq, D], k and v [B, H, Tk, D] -> out [B, H, Tq, D] (contiguous,
 * dtype of q). f32 or f64, all three of one dtype. Any strides are read in
 * place as long as the last dim has stride 1 (e.g. slices of a permuted
 * fused QKV projection [B, T, 3, H, D]); an input whose last dim is strided
 * is first copied to a contiguous buffer. p may be NULL (non-causal, scale
 * 1/sqrt(D), no bias, q_offset 0). Differentiable in q, k and v (the
 * backward is a fused kernel, not itself differentiable). Returns a new
 * reference, or NULL with a message on bad shapes, dtypes or parameters. */
zs_tensor *zs_attention(zs_tensor *q, zs_tensor *k, zs_tensor *v,
                        const zs_attention_params *p);

/* The ALiBi slopes of Press et al. / BLOOM for H heads into slopes[H]:
 * 2^(-8 (h+1) / n) for n = H a power of two; otherwise those of the
 * largest power of two n < H followed by every other slope of 2n. */
void zs_alibi_slopes(int64_t H, double *slopes);

/* ---- block-sparse attention (src/ops/sparse_attention.c) -------------- */

/* A block layout (DeepSpeed Sparse Attention, Sparse Transformer): tokens
 * cut into blocks of `block` tokens (the last one partial); query block i
 * sees key block j (causal: only j <= i, and inside the diagonal block
 * key t only for queries t' >= t) when
 *   local:  i - local <= j <= i (causal) or |i - j| <= local; 0 keeps
 *           the diagonal block alone, which every row always has;
 *   global: j < global or i < global (the first blocks attend and are
 *           attended by all);
 *   random: `random` more blocks per row drawn without replacement among
 *           the allowed ones not yet taken, from `seed` (deterministic).
 * scale multiplies q k^T (0: 1/sqrt(D)). No ALiBi bias. */
typedef struct zs_sparse_params {
    int64_t block;  /* 16..128 */
    int64_t local, global, random; /* >= 0 */
    uint64_t seed;
    bool causal;
    double scale;
} zs_sparse_params;

/* A layout built for T tokens: compressed rows of key blocks, and what it
 * costs. Read-only; free with zs_sparse_layout_free. */
typedef struct zs_sparse_layout {
    int64_t T, block, nb, nnz; /* tokens, block size, blocks, kept blocks */
    bool causal;
    const int64_t *row_ptr;    /* [nb + 1]: row i is cols[row_ptr[i]..] */
    const int32_t *cols;       /* [nnz], ascending in each row */
    double density;            /* nnz / nb^2: the block matrix kept */
    double pairs;              /* (query, key) scores computed per (batch,
                                * head): the kept blocks' area */
    double visible;            /* of those, unmasked */
    double dense_pairs;        /* what zs_attention computes with the same
                                * causal flag: T^2, or T (T + 1) / 2 */
    void *impl;
} zs_sparse_layout;

/* The layout of p for T >= 1 tokens; NULL + message for bad values. */
zs_sparse_layout *zs_sparse_layout_new(const zs_sparse_params *p, int64_t T);
void zs_sparse_layout_free(zs_sparse_layout *l);
/* True when query token i sees key token j (0 <= i, j < T). */
bool zs_sparse_layout_visible(const zs_sparse_layout *l, int64_t i, int64_t j);
/* Forward FLOPs over B x H heads of size D: 4 D per computed pair (the
 * backward: 2.5 times that, 10 D per pair). */
double zs_sparse_layout_flops(const zs_sparse_layout *l, int64_t B, int64_t H,
                              int64_t D);

/* Self-attention of q, k, v [B, H, T, D] (one shape, f32 or f64, last dim
 * of stride 1 read in place, else copied) over the layout of p for T:
 * out [B, H, T, D] = softmax(q k^T scale + mask) v where the mask keeps
 * only the layout's visible pairs, computed block by block (no T x T
 * matrix; forward keeps out and the row logsumexp). Differentiable in q,
 * k and v (a fused backward kernel over the same blocks). New reference,
 * or NULL + message on bad shapes, dtypes or parameters. */
zs_tensor *zs_sparse_attention(zs_tensor *q, zs_tensor *k, zs_tensor *v,
                               const zs_sparse_params *p);

#ifdef __cplusplus
}
#endif
#endif
