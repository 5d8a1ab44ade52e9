/*
 * engine_flops.c - the FLOPs that each of Zhisuan's own operators counts
 * (its zsi_op_end cost model) during one training step of its GPT
 * (src/nn/gpt.c: zs_gpt_loss forward + zs_backward), predicted from the
 * model's dimensions alone. tests/analyze/test_engine_flops.c runs real
 * steps and compares every operator's count with this, exactly.
 *
 * Symbols: B batch, T sequence, N = B*T tokens, C = h width, F = d_ff = 4C,
 * V vocabulary, L layers, P = B * n_head * T(T+1)/2 causal (query, key)
 * pairs, d = C / n_head. The step, operator by operator (calls; FLOPs):
 *   forward
 *     embedding          gather, 0 FLOPs (not listed)
 *     add                GPT-2: tok + wpe, NC
 *     layer_norm         2L+1 (+1 BLOOM's embedding norm); 8NC each
 *     linear             c_attn: 2N*3C*C + 3NC (bias)
 *     attention          4d per pair: 4dP (exp and softmax not counted)
 *     linear_residual    attn c_proj 2NC^2 + 2NC, mlp c_proj 2NFC + 2NC
 *                        (bias + residual)
 *     linear_gelu        c_fc 2NCF + NF + 30NF (bias, tanh-GeLU)
 *     matmul             tied logits x wte^T: 2NCV
 *     cross_entropy      5NV
 *   backward
 *     cross_entropy_backward 4NV
 *     matmul             2 per GEMM above (dX, dW): 4NCV + L*2*2N(3C^2 +
 *                        C^2 + 2CF)
 *     layer_norm_backward 10NC each
 *     linear_gelu_backward GeLU's gradient g * gelu'(h) of the fused
 *                        c_fc, one pass: 38NF (src/ops/linear.c; on a
 *                        device without its kernel, CUDA, unary_deriv 2NF
 *                        and mul NF are counted instead). zs_gelu's tanh
 *                        form (the split model of src/train/gpt_par.c, nn
 *                        activations) runs and counts the same 38 per
 *                        element in backward.
 *     sum                bias gradients: 3NC + NC + NF + NC per layer;
 *                        GPT-2 wpe's gradient summed over the batch, NC
 *     attention_backward 2.5 x forward (recomputed q.k, then dv, dp, dq, dk)
 *     add                gradient accumulation where a tensor has two
 *                        consumers: the residual stream twice per layer
 *                        (NC each); the three narrow() views of the fused
 *                        QKV output add their gradients into their slots
 *                        of one buffer in place (axpy_, no FLOPs counted;
 *                        a captured graph's slices pass does the same)
 *     embedding_backward scatter-add of the token gradients, NC
 * Views, copies and the embedding gather count no FLOPs and are not
 * listed. Real work the engine does not count: the
 * leaf accumulation of the tied wte's two gradients (zs_axpy_, VC adds)
 * and the k and v gradients' in-place adds into the QKV buffer (2NC).
 *
 * Textbook relation. The GEMMs alone are 72NLC^2 + 6NCV = 6 x (12LC^2 +
 * VC) x N, i.e. the 6N rule with N the matmul weights (Kaplan et al.);
 * the chapter's count (Narayanan et al.) 72BTLC^2 (1 + T/6C + V/12LC)
 * adds square attention, 12BT^2LC, where the engine counts causal pairs,
 * 3.5 x 2BT(T+1)LC (forward 4dP, backward 2.5x with the recomputation of
 * the scores), about 7/12 of it; the elementwise terms (biases, GeLU,
 * norms, loss, accumulation) are O(NC + NV) and vanish for wide models.
 */
#include <stdio.h>
#include <string.h>

#include "zs/analyze.h"

/* The operator named name in o, added (forward ones first) if new. */
static zs_engine_op *op(zs_engine_flops *o, const char *name)
{
    for (int i = 0; i < o->nops; i++)
        if (!strcmp(o->ops[i].name, name))
            return &o->ops[i];
    zs_engine_op *e = &o->ops[o->nops++];
    snprintf(e->name, sizeof e->name, "%s", name);
    return e;
}

static void fwd(zs_engine_flops *o, const char *name, int64_t calls,
                double flops)
{
    zs_engine_op *e = op(o, name);
    e->calls += calls;
    e->flops += flops;
    e->fwd += flops;
}

static void bwd(zs_engine_flops *o, const char *name, int64_t calls,
                double flops)
{
    zs_engine_op *e = op(o, name);
    e->calls += calls;
    e->flops += flops;
}

/* ZS_OK when src/nn/gpt.c builds this model and runs batch x seq. */
static zs_status check(const zs_model_config *c, int64_t batch, int64_t seq)
{
    const char *why = NULL;
    if (c->mlp != ZS_MLP_GELU || c->d_ff != 4 * c->d_model)
        why = "its MLP is not GeLU with d_ff = 4h";
    else if (c->norm != ZS_NORM_LAYER || !c->bias)
        why = "it has no LayerNorm or no biases";
    else if (!c->tied_embeddings)
        why = "its logit layer is not tied to the embedding";
    else if (c->n_kv_head != c->n_head || c->n_head * c->d_head != c->d_model)
        why = "its attention is not multi-head with n*d = h";
    else if (c->learned_pos == c->embed_norm)
        why = "it has neither learned positions alone (GPT-2) nor an "
              "embedding norm alone (BLOOM)";
    if (why)
        return zs_set_error("analyze: %s: Zhisuan's GPT cannot run it: %s",
                            c->name, why);
    if (batch < 1 || seq < 1 || seq > c->seq_len || c->n_layer < 1 ||
        c->d_model < 1 || c->vocab < 1)
        return zs_set_error("analyze: %s: engine step of batch %lld, "
                            "sequence %lld: expected batch >= 1 and 1 <= "
                            "sequence <= %lld (the context)", c->name,
                            (long long)batch, (long long)seq,
                            (long long)c->seq_len);
    return ZS_OK;
}

/* The forward pass of every layer, the stem and the head. */
static void forward(zs_engine_flops *o, const zs_model_config *c, double N,
                    double P)
{
    int64_t L = c->n_layer;
    double l = (double)L, C = (double)c->d_model, F = (double)c->d_ff;
    double V = (double)c->vocab, NC = N * C, NF = N * F;
    double attn = 4.0 * (double)c->d_head * P;
    int64_t norms = 2 * L + 1 + (c->embed_norm ? 1 : 0);
    if (c->learned_pos)
        fwd(o, "add", 1, NC);
    fwd(o, "layer_norm", norms, 8.0 * NC * (double)norms);
    fwd(o, "linear", L, l * (2.0 * N * 3.0 * C * C + 3.0 * NC));
    fwd(o, "attention", L, l * attn);
    fwd(o, "linear_residual", 2 * L,
        l * (2.0 * NC * C + 2.0 * NC + 2.0 * NF * C + 2.0 * NC));
    fwd(o, "linear_gelu", L, l * (2.0 * NC * F + NF + 30.0 * NF));
    fwd(o, "matmul", 1, 2.0 * NC * V);
    fwd(o, "cross_entropy", 1, 5.0 * N * V);
}

/* zs_backward from the loss to the parameters. */
static void backward(zs_engine_flops *o, const zs_model_config *c, double N,
                     double P)
{
    int64_t L = c->n_layer;
    double l = (double)L, C = (double)c->d_model, F = (double)c->d_ff;
    double V = (double)c->vocab, NC = N * C, NF = N * F;
    double attn = 4.0 * (double)c->d_head * P;
    int64_t norms = 2 * L + 1 + (c->embed_norm ? 1 : 0);
    int64_t pos = c->learned_pos ? 1 : 0;
    bwd(o, "cross_entropy_backward", 1, 4.0 * N * V);
    bwd(o, "matmul", 2 + 8 * L,
        4.0 * NC * V + l * 4.0 * N * (3.0 * C * C + C * C + 2.0 * C * F));
    bwd(o, "layer_norm_backward", norms, 10.0 * NC * (double)norms);
    bwd(o, "linear_gelu_backward", L, l * 38.0 * NF);
    bwd(o, "sum", 4 * L + pos, l * (5.0 * NC + NF) + (double)pos * NC);
    bwd(o, "attention_backward", L, l * 2.5 * attn);
    bwd(o, "add", 2 * L, l * 2.0 * NC);
    bwd(o, "embedding_backward", 1, NC);
}

double zs_analyze_engine_step_flops(const zs_model_config *c, int64_t batch,
                                    int64_t seq, zs_engine_flops *out)
{
    if (!c || check(c, batch, seq) != ZS_OK)
        return -1;
    zs_engine_flops o;
    memset(&o, 0, sizeof o);
    double N = (double)batch * (double)seq;
    double P = (double)batch * (double)c->n_head * (double)seq *
               (double)(seq + 1) / 2.0;
    forward(&o, c, N, P);
    backward(&o, c, N, P);
    double C = (double)c->d_model, F = (double)c->d_ff, V = (double)c->vocab;
    for (int i = 0; i < o.nops; i++) {
        o.fwd += o.ops[i].fwd;
        o.total += o.ops[i].flops;
        if (!strncmp(o.ops[i].name, "attention", 9))
            o.attention += o.ops[i].flops;
    }
    o.bwd = o.total - o.fwd;
    o.gemm = 3.0 * ((double)c->n_layer * 2.0 * N * C * (4.0 * C + 2.0 * F) +
                    2.0 * N * C * V);
    o.elementwise = o.total - o.gemm - o.attention;
    o.chapter = zs_analyze_step_flops(c, batch, seq);
    zs_param_count pc;
    zs_model_params(c, &pc);
    o.six_n = 6.0 * pc.total * N;
    if (out)
        *out = o;
    return o.total;
}
