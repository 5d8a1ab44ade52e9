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

#ifdef __cplusplus
}
#endif
#endif
