/*
 * attention.c - zs_attention, fused scaled dot-product attention with
 * causal mask, ALiBi bias and a query offset for the KV cache (kernels in
 * kernels/cpu/attention.c; public contract in include/zs/attention.h).
 *
 * One operator rather than matmul + softmax + matmul: the forward keeps
 * only the output and the per-row logsumexp lse [B, H, Tq] (dtype of q),
 * and the backward recomputes the scores tile by tile, so neither pass
 * stores a Tq x Tk matrix and memory grows linearly with the sequence.
 * The backward is a fused kernel (not itself differentiable), counted in
 * the profiler as "attention_backward".
 *
 * q, k, v are read in place through their strides when their last dim has
 * stride 1 (views of a fused QKV projection qualify); otherwise that input
 * is copied to a contiguous buffer first. A descriptor run by zsi_run
 * (ops/op.h): the views the kernel reads and lse are its aux results,
 * lse made only when a node is recorded. Node inputs q, k, v; saved and
 * parameters: see zsi_def_attention below.
 *
 * Cost model: FLOPs count what is computed, 4 D per visible (query, key)
 * pair (2 D for q.k, 2 D for p v), so a causal square attention counts
 * about half of 4 B H T^2 D; exp and the softmax bookkeeping are not
 * counted. The backward counts 2.5x the forward, as in the FlashAttention
 * paper (recomputed q.k, do.v, then dv, dk and dq: 10 D per pair).
 * Bytes: the inputs read once and the outputs (and lse) written once.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/attention.h"
#include "ops/internal.h"
#include "zs/attention.h"

static zs_status attention_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin);

/* Profiler entry of the fused backward kernel (no node of its own). */
static zsi_op OP_ATTENTION_BW = {.name = "attention_backward"};

void zs_alibi_slopes(int64_t H, double *slopes)
{
    int64_t n = 1;
    while (n * 2 <= H)
        n *= 2;
    for (int64_t h = 0; h < n && h < H; h++)
        slopes[h] = pow(2.0, -8.0 * (double)(h + 1) / (double)n);
    for (int64_t j = 0; n + j < H; j++)
        slopes[n + j] = pow(2.0, -8.0 * (double)(2 * j + 1) / (double)(2 * n));
}

/* ---- checks ------------------------------------------------------------ */

static zs_status shape_error(const zs_tensor *q, const zs_tensor *k,
                             const zs_tensor *v, const char *what)
{
    char sq[96], sk[96], sv[96];
    return zs_set_error("attention: q %s, k %s, v %s: %s; expected q "
                        "[B, H, Tq, D] and k, v [B, H, Tk, D]",
                        zs_shape_str(q, sq, sizeof sq),
                        zs_shape_str(k, sk, sizeof sk),
                        zs_shape_str(v, sv, sizeof sv), what);
}

static zs_status check_args(const zs_tensor *q, const zs_tensor *k,
                            const zs_tensor *v, const zs_attention_params *p)
{
    zs_status st = zsi_check_pair_dtype("attention", q, k);
    if (st == ZS_OK)
        st = zsi_check_pair_dtype("attention", q, v);
    if (st != ZS_OK)
        return st;
    if (q->ndim != 4 || k->ndim != 4 || v->ndim != 4)
        return shape_error(q, k, v, "every input needs 4 dims");
    if (k->shape[0] != q->shape[0] || k->shape[1] != q->shape[1] ||
        !zs_same_shape(k, v))
        return shape_error(q, k, v, "batch, heads or key length differ");
    if (k->shape[3] != q->shape[3])
        return shape_error(q, k, v, "head size D differs");
    int64_t Tq = q->shape[2], Tk = k->shape[2];
    if (Tk == 0 && Tq > 0)
        return shape_error(q, k, v, "no keys (Tk = 0)");
    if (p->q_offset < 0)
        return zs_set_error("attention: q_offset = %lld, expected >= 0",
                            (long long)p->q_offset);
    if (p->causal && p->q_offset + Tq > Tk)
        return zs_set_error("attention: causal with q_offset %lld and Tq "
                            "%lld needs Tk >= %lld (the last query's "
                            "position + 1), got Tk %lld",
                            (long long)p->q_offset, (long long)Tq,
                            (long long)(p->q_offset + Tq), (long long)Tk);
    if (!isfinite(p->scale))
        return zs_set_error("attention: scale = %g, expected a finite value "
                            "(0 for 1/sqrt(D))", p->scale);
    return ZS_OK;
}

/* ---- shared helpers ---------------------------------------------------- */

static bool last_dim_unit(const zs_tensor *t)
{
    return t->shape[3] <= 1 || t->strides[3] == 1;
}

/* t itself (retained) when its last dim has stride 1, else an untracked,
 * ungraded contiguous copy; new reference or NULL. */
static zs_tensor *kernel_view(zs_tensor *t)
{
    if (last_dim_unit(t))
        return zs_retain(t);
    zsi_tracking_pause();
    zs_no_grad_push();
    zs_tensor *c = zs_contiguous(t);
    zs_no_grad_pop();
    zsi_tracking_resume();
    return c;
}

static void fill_args(zsk_attn *a, const zs_tensor *q, const zs_tensor *k,
                      const zs_tensor *v, double scale, bool causal,
                      int64_t q_offset, const double *slopes)
{
    *a = (zsk_attn){.dt = q->dtype, .B = q->shape[0], .H = q->shape[1],
                    .Tq = q->shape[2], .Tk = k->shape[2], .D = q->shape[3],
                    .q = zs_data(q), .k = zs_data(k), .v = zs_data(v),
                    .scale = scale, .causal = causal, .q_offset = q_offset,
                    .slopes = slopes};
    for (int d = 0; d < 3; d++) {
        a->sq[d] = q->strides[d];
        a->sk[d] = k->strides[d];
        a->sv[d] = v->strides[d];
    }
}

/* Visible (query, key) pairs of one (b, h). */
static double visible_pairs(int64_t Tq, int64_t Tk, bool causal, int64_t off)
{
    if (!causal)
        return (double)Tq * (double)Tk;
    double s = 0;
    for (int64_t i = 0; i < Tq; i++)
        s += (double)(off + i + 1 < Tk ? off + i + 1 : Tk);
    return s;
}

static double forward_flops(const zsk_attn *a)
{
    return 4.0 * (double)a->D * (double)(a->B * a->H) *
           visible_pairs(a->Tq, a->Tk, a->causal, a->q_offset);
}

/* malloc'd ALiBi slopes for H heads (NULL when alibi is off, or on
 * failure with *st = ZS_ERR_NOMEM and a message). */
static double *make_slopes(bool alibi, int64_t H, zs_status *st)
{
    *st = ZS_OK;
    if (!alibi)
        return NULL;
    double *s = malloc((size_t)(H > 0 ? H : 1) * sizeof *s);
    if (!s) {
        *st = zs_set_error_code(ZS_ERR_NOMEM, "attention: out of memory");
        return NULL;
    }
    zs_alibi_slopes(H, s);
    return s;
}

/* ---- forward ----------------------------------------------------------- */

/* Inputs q, k, v; attributes: f[0] scale (0: 1/sqrt(D)), i[0] causal,
 * i[1] alibi, i[2] q_offset (node: p.f[0], p.i[4..6]); node: p.f[8] the
 * scale used. Saved: 0 q, 1 k, 2 v (as read by the kernel: its aux 0..2),
 * 3 out, 4 lse (aux 3, made only when a node is recorded). */
#define P_SCALE 8
#define P_CAUSAL 4
#define P_ALIBI 5
#define P_QOFF 6

static zs_attention_params call_params(const zsi_call *c)
{
    return (zs_attention_params){.scale = c->a->f[0], .causal = c->a->i[0] != 0,
                                 .alibi = c->a->i[1] != 0,
                                 .q_offset = c->a->i[2]};
}

static double call_scale(const zsi_call *c)
{
    int64_t D = c->in[0]->shape[3];
    return c->a->f[0] != 0 ? c->a->f[0] : D > 0 ? 1 / sqrt((double)D) : 1;
}

static zs_status infer_attention(zsi_call *c)
{
    const zs_tensor *q = c->in[0];
    zs_attention_params prm = call_params(c);
    if (check_args(q, c->in[1], c->in[2], &prm) != ZS_OK)
        return ZS_ERR_ARG;
    c->dtype = q->dtype;
    c->ndim = 4;
    memcpy(c->shape, q->shape, sizeof c->shape);
    return ZS_OK;
}

static zs_status cpu_attention(const zsi_call *c, zs_tensor *out)
{
    zs_tensor *const *kin = c->aux;
    for (int i = 0; i < 3; i++)
        if (!(c->aux[i] = kernel_view(c->in[i])))
            return ZS_ERR_NOMEM;
    zs_status st;
    double *slopes = make_slopes(c->a->i[1] != 0, c->in[0]->shape[1], &st);
    if (st != ZS_OK)
        return st;
    zsk_attn a;
    fill_args(&a, kin[0], kin[1], kin[2], call_scale(c), c->a->i[0] != 0,
              c->a->i[2], slopes);
    if (zsi_call_records(c)) {
        zsi_tracking_pause();
        c->aux[3] = zsi_new_tensor(a.dt, ZS_SHAPE(a.B, a.H, a.Tq));
        zsi_tracking_resume();
        st = c->aux[3] ? ZS_OK : ZS_ERR_NOMEM;
    }
    if (st == ZS_OK)
        st = zsk_attention_forward(&a, zs_data(out),
                                   c->aux[3] ? zs_data(c->aux[3]) : NULL);
    free(slopes);
    return st;
}

static void save_attention(zsi_ctx *n, const zsi_call *c, zs_tensor *out)
{
    for (int i = 0; i < 3; i++)
        zsi_save(n, i, c->aux[i]);
    zsi_save(n, 3, out);
    zsi_save(n, 4, c->aux[3]);
    n->p.f[P_SCALE] = call_scale(c);
}

static zsi_cost attention_cost(const zsi_call *c, const zs_tensor *out)
{
    const zs_tensor *q = c->in[0], *k = c->in[1], *v = c->in[2];
    zsk_attn a = {.B = q->shape[0], .H = q->shape[1], .Tq = q->shape[2],
                  .Tk = k->shape[2], .D = q->shape[3], .causal = c->a->i[0] != 0,
                  .q_offset = c->a->i[2]};
    double lse = out->node ? (double)(a.B * a.H * a.Tq) *
                                 (double)zs_dtype_size(q->dtype) : 0;
    return (zsi_cost){forward_flops(&a),
                      zsi_bytes(q) + zsi_bytes(k) + zsi_bytes(v),
                      zsi_bytes(out) + lse};
}

zsi_opdef zsi_def_attention = {
    .op = {.name = "attention", .backward = attention_bw}, .arity = 3,
    .infer = infer_attention,
    .kernel = {[ZS_CPU] = {[ZS_F32] = cpu_attention, [ZS_F64] = cpu_attention}},
    .save = save_attention, .cost = attention_cost};

zs_tensor *zs_attention(zs_tensor *q, zs_tensor *k, zs_tensor *v,
                        const zs_attention_params *p)
{
    zs_attention_params prm = p ? *p : (zs_attention_params){0};
    zsi_attrs at = {.f = {prm.scale}, .i = {prm.causal, prm.alibi, prm.q_offset}};
    return zsi_run(&zsi_def_attention, 3, (zs_tensor *[]){q, k, v}, &at);
}

/* ---- backward ---------------------------------------------------------- */

static zs_status attention_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin)
{
    double t0 = zsi_op_begin(&OP_ATTENTION_BW);
    zs_tensor *q = n->saved[0], *k = n->saved[1], *v = n->saved[2];
    zs_tensor *out = n->saved[3], *lse = n->saved[4];
    zs_status st;
    double *slopes = make_slopes(n->p.i[P_ALIBI] != 0, q->shape[1], &st);
    if (st != ZS_OK)
        return st;
    zsk_attn a;
    fill_args(&a, q, k, v, n->p.f[P_SCALE], n->p.i[P_CAUSAL] != 0,
              n->p.i[P_QOFF], slopes);
    zs_tensor *gc = kernel_view(g);
    zs_tensor *d[3] = {zsi_new_tensor(a.dt, q->ndim, q->shape),
                       zsi_new_tensor(a.dt, k->ndim, k->shape),
                       zsi_new_tensor(a.dt, v->ndim, v->shape)};
    st = ZS_ERR_NOMEM;
    if (gc && d[0] && d[1] && d[2])
        st = zsk_attention_backward(&a, zs_data(out), zs_data(lse),
                                    zs_data(gc), gc->strides, zs_data(d[0]),
                                    zs_data(d[1]), zs_data(d[2]));
    for (int i = 0; i < 3; i++) {
        if (st == ZS_OK && zsi_needs_grad(n, i))
            gin[i] = d[i];
        else
            zs_release(d[i]);
    }
    zsi_op_end(&OP_ATTENTION_BW, t0, 2.5 * forward_flops(&a),
               zsi_bytes(q) + zsi_bytes(k) + zsi_bytes(v) + zsi_bytes(out) +
                   zsi_bytes(g) + zsi_bytes(lse),
               zsi_bytes(q) + zsi_bytes(k) + zsi_bytes(v));
    zs_release(gc);
    free(slopes);
    return st;
}
