/*
 * flops.c - FLOPs, bytes moved and arithmetic intensity of a decoder
 * block's operators, and the training FLOPs of a whole model.
 *
 * A matmul [M, K] x [K, N] costs 2MKN FLOPs and moves MK + KN + MN
 * elements, so for the chapter's table (b micro-batch, s sequence, h
 * hidden, n heads of width d):
 *   x W_Q, x W_K, x W_V, out proj  2bsh^2   intensity 1/(1/h + 1/(2bs))
 *   Q K^T, P V                     2bs^2h  intensity 1/(1/s + 1/(2d))
 *   MLP up, MLP down               8bsh^2  intensity 1/(5/(8h) + 1/(2bs))
 * and a block's forward pass is 24bsh^2 + 4bs^2h. Biases and elementwise
 * operators are listed but not part of that sum (as in the chapter).
 *
 * Training a batch of B sequences: forward l*(24Bsh^2 + 4Bs^2h), backward
 * twice that (the gradients with respect to inputs and to weights are one
 * matmul each), total 72Bls h^2 + 12Bls^2h. For BLOOM-176B with B = 16 this
 * is 34.75 PFLOP: the chapter's 34.8 P counts the decoder blocks only; the
 * logit layer (3 * 2BshV = 0.71 PFLOP) would make it 35.46.
 */
#include <stdio.h>
#include <string.h>

#include "zs/analyze.h"

/* Writes "(d0, d1, ...)" into buf (48 bytes, the zs_op_cost fields). */
static void shape_text(char *buf, int nd, const int64_t *dims)
{
    size_t cap = 48, pos = 0;
    for (int i = 0; i < nd && pos < cap; i++) {
        int w = snprintf(buf + pos, cap - pos, "%s%lld", i ? ", " : "(",
                         (long long)dims[i]);
        pos += w > 0 ? (size_t)w : 0;
    }
    if (pos + 2 <= cap)
        strcat(buf, ")");
}

#define SHAPE(buf, ...)                                                       \
    shape_text(buf, (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), \
               (int64_t[]){__VA_ARGS__})

/* x [b, s, k] times a weight [k, m]. */
static zs_op_cost linear(const char *name, int64_t b, int64_t s, int64_t k,
                         int64_t m)
{
    zs_op_cost o = {.matmul = true};
    snprintf(o.name, sizeof o.name, "%s", name);
    SHAPE(o.in1, b, s, k);
    SHAPE(o.in2, k, m);
    SHAPE(o.out, b, s, m);
    double bs = (double)b * (double)s;
    o.flops = 2 * bs * (double)k * (double)m;
    o.elems = bs * (double)k + (double)k * (double)m + bs * (double)m;
    return o;
}

/* Elementwise over x [b, s, w] (and y of the same shape when two inputs),
 * `per` FLOPs per output element, `params` extra elements read. */
static zs_op_cost pointwise(const char *name, int64_t b, int64_t s, int64_t w,
                            int inputs, double per, double params)
{
    zs_op_cost o = {.matmul = false};
    snprintf(o.name, sizeof o.name, "%s", name);
    SHAPE(o.in1, b, s, w);
    if (inputs == 2)
        SHAPE(o.in2, b, s, w);
    else if (params > 0)
        snprintf(o.in2, sizeof o.in2, "(%lld)", (long long)w);
    SHAPE(o.out, b, s, w);
    double e = (double)b * (double)s * (double)w;
    o.flops = per * e;
    o.elems = (inputs + 1) * e + params;
    return o;
}

static zs_op_cost norm_op(const zs_model_config *c, const char *name,
                          int64_t b, int64_t s)
{
    bool ln = c->norm == ZS_NORM_LAYER;
    return pointwise(name, b, s, c->d_model, 1, ln ? 8 : 4,
                     (ln ? 2.0 : 1.0) * (double)c->d_model);
}

/* Batched attention products: Q K^T and P V. */
static zs_op_cost attn_op(const zs_model_config *c, bool qk, int64_t b,
                          int64_t s)
{
    int64_t n = c->n_head, kv = c->n_kv_head, d = c->d_head;
    zs_op_cost o = {.matmul = true};
    snprintf(o.name, sizeof o.name, "%s", qk ? "Q K^T" : "P V");
    double bns = (double)b * (double)n * (double)s;
    double kvsd = (double)b * (double)kv * (double)s * (double)d;
    if (qk) {
        SHAPE(o.in1, b, n, s, d);
        SHAPE(o.in2, b, kv, s, d);
        SHAPE(o.out, b, n, s, s);
        o.elems = bns * (double)d + kvsd + bns * (double)s;
    } else {
        SHAPE(o.in1, b, n, s, s);
        SHAPE(o.in2, b, kv, s, d);
        SHAPE(o.out, b, n, s, d);
        o.elems = bns * (double)s + kvsd + bns * (double)d;
    }
    o.flops = 2 * bns * (double)s * (double)d;
    return o;
}

int zs_block_ops(const zs_model_config *c, int64_t b, int64_t s,
                 double elem_bytes, zs_op_cost *ops)
{
    if (!c || !ops || b <= 0 || s <= 0 || !(elem_bytes > 0))
        return zs_set_error("analyze: block_ops: need b, s and element size "
                            "> 0 (got b=%lld, s=%lld, %g bytes)", (long long)b,
                            (long long)s, elem_bytes);
    int64_t h = c->d_model, ff = c->d_ff;
    int64_t qd = c->n_head * c->d_head, kvd = c->n_kv_head * c->d_head;
    int k = 0;
    ops[k++] = norm_op(c, "norm 1", b, s);
    ops[k++] = linear("x W_Q", b, s, h, qd);
    ops[k++] = linear("x W_K", b, s, h, kvd);
    ops[k++] = linear("x W_V", b, s, h, kvd);
    ops[k++] = attn_op(c, true, b, s);
    zs_op_cost sm = {.matmul = false};
    snprintf(sm.name, sizeof sm.name, "softmax");
    SHAPE(sm.in1, b, c->n_head, s, s);
    SHAPE(sm.out, b, c->n_head, s, s);
    double sc = (double)b * (double)c->n_head * (double)s * (double)s;
    sm.flops = 5 * sc;
    sm.elems = 2 * sc;
    ops[k++] = sm;
    ops[k++] = attn_op(c, false, b, s);
    ops[k++] = linear("out proj", b, s, qd, h);
    ops[k++] = pointwise("residual 1", b, s, h, 2, 1, 0);
    ops[k++] = norm_op(c, "norm 2", b, s);
    if (c->mlp == ZS_MLP_GELU) {
        ops[k++] = linear("MLP up", b, s, h, ff);
        ops[k++] = pointwise("GeLU", b, s, ff, 1, 8, 0);
    } else {
        ops[k++] = linear("MLP gate", b, s, h, ff);
        ops[k++] = linear("MLP up", b, s, h, ff);
        ops[k++] = pointwise("SiLU(gate) * up", b, s, ff, 2, 5, 0);
    }
    ops[k++] = linear("MLP down", b, s, ff, h);
    ops[k++] = pointwise("residual 2", b, s, h, 2, 1, 0);
    for (int i = 0; i < k; i++)
        ops[i].bytes = ops[i].elems * elem_bytes;
    return k;
}

double zs_block_matmul_flops(const zs_model_config *c, int64_t b, int64_t s)
{
    double bs = (double)b * (double)s, h = (double)c->d_model;
    double qd = (double)(c->n_head * c->d_head);
    double kvd = (double)(c->n_kv_head * c->d_head);
    double mats = c->mlp == ZS_MLP_GELU ? 2 : 3;
    return 2 * bs * h * (qd + 2 * kvd) + 2 * bs * qd * h +
           2 * bs * h * (double)c->d_ff * mats + 4 * bs * (double)s * qd;
}

zs_status zs_train_flops_compute(const zs_model_config *c, int64_t batch,
                                 int64_t s, zs_recompute rc,
                                 zs_train_flops *o)
{
    if (!c || !o || batch <= 0 || s <= 0)
        return zs_set_error("analyze: train_flops: need batch and s > 0 "
                            "(got %lld, %lld)", (long long)batch, (long long)s);
    memset(o, 0, sizeof *o);
    double l = (double)c->n_layer, B = (double)batch, S = (double)s;
    o->fwd = l * zs_block_matmul_flops(c, batch, s);
    o->bwd = 2 * o->fwd;
    o->total = o->fwd + o->bwd;
    o->logit_fwd = 2 * B * S * (double)c->d_model * (double)c->vocab;
    o->total_with_logit = 3 * (o->fwd + o->logit_fwd);
    o->recompute_selective =
        l * 4 * B * (double)c->n_head * S * S * (double)c->d_head;
    o->recompute_full = o->fwd;
    o->step = o->total_with_logit;
    if (rc == ZS_RECOMPUTE_SELECTIVE)
        o->step += o->recompute_selective;
    else if (rc == ZS_RECOMPUTE_FULL)
        o->step += o->recompute_full;
    o->per_token = o->step / (B * S);
    zs_param_count pc;
    zs_model_params(c, &pc);
    o->six_n_per_token = 6 * pc.total;
    return ZS_OK;
}

double zs_analyze_step_flops(const zs_model_config *c, int64_t batch,
                             int64_t s)
{
    zs_train_flops f;
    if (zs_train_flops_compute(c, batch, s, ZS_RECOMPUTE_NONE, &f) != ZS_OK)
        return -1;
    return f.total_with_logit;
}
