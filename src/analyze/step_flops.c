/*
 * step_flops.c - the FLOPs that Zhisuan's own operators count during one
 * GPT training step (forward + backward; the optimizer is not an
 * operator), predicted from the model's dimensions alone.
 *
 * Each term is the cost model of the operator src/nn/gpt.c calls, with
 * N = B*T tokens, C the width, D = C/H, V the vocabulary:
 *   layer_norm 8NC, layer_norm_backward 10NC, add / mul / sum one per
 *   element, linear 2NKM + NM (bias), linear_gelu + 30NM (GeLU),
 *   linear_residual + NM (residual), matmul 2MNK, attention 4D per
 *   (query, key) pair computed (causal: T(T+1)/2 pairs per head),
 *   attention_backward 2.5x its forward, cross_entropy 5NV and its
 *   backward 4NV. Backward: every GEMM twice (dX and dW), bias gradients
 *   as sums over N rows, GeLU's gradient as one mul, and an add wherever
 *   a gradient arrives from two consumers (the residual stream, twice per
 *   layer, and q/k/v meeting in the fused QKV projection, twice).
 * The textbook count (Kaplan et al.) is 6 x non-embedding parameters x
 * tokens + 6 L T C per token for attention (causal half of 12 L T C);
 * this one adds the logit layer, the elementwise work and the exact
 * causal pair count, which is why tests/analyze/test_engine_flops.c can
 * compare it with the engine's counters for equality.
 */
#include "zs/analyze.h"

double zs_analyze_gpt_step_flops_engine(bool bloom, int64_t vocab,
                                        int64_t layers, int64_t heads,
                                        int64_t width, int64_t batch,
                                        int64_t seq)
{
    (void)heads; /* H x D = C: the attention count does not depend on H */
    double N = (double)(batch * seq), C = (double)width, V = (double)vocab;
    double NC = N * C, NC2 = N * C * C;
    double pairs = (double)batch * (double)seq * (double)(seq + 1) / 2.0;
    double attn = 4.0 * C * pairs; /* summed over heads: 4 D H per pair */

    double layer_fwd = 2 * 8 * NC          /* ln_1, ln_2 */
                     + 6 * NC2 + 3 * NC     /* c_attn (linear) */
                     + attn                 /* attention */
                     + 2 * NC2 + 2 * NC     /* c_proj (linear_residual) */
                     + 8 * NC2 + 4 * NC + 30 * 4 * NC /* c_fc (linear_gelu) */
                     + 8 * NC2 + 2 * NC;    /* mlp c_proj (linear_residual) */
    double layer_bwd = 2 * (6 + 2 + 8 + 8) * NC2 /* dX and dW of every GEMM */
                     + (3 + 1 + 4 + 1) * NC /* bias gradients (sum) */
                     + 4 * NC               /* GeLU gradient (mul) */
                     + 2.5 * attn           /* attention_backward */
                     + 2 * 10 * NC          /* layer_norm_backward x 2 */
                     + 2 * NC + 2 * 3 * NC; /* gradient accumulation (add) */
    double embed_fwd = bloom ? 8 * NC : NC;     /* emb LayerNorm, or + wpe */
    double embed_bwd = bloom ? 10 * NC : NC;    /* its backward, or wpe's sum */
    double head_fwd = 8 * NC + 2 * N * V * C + 5 * N * V; /* ln_f, logits, CE */
    double head_bwd = 10 * NC + 4 * N * V * C + 4 * N * V;
    return (double)layers * (layer_fwd + layer_bwd) + embed_fwd + embed_bwd +
           head_fwd + head_bwd;
}
