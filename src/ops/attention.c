/*
 * attention.c - zs_attention, fused scaled dot-product attention with
 * causal mask, ALiBi bias and a query offset for the KV cache (kernels in
 * kernels/cpu/attention.c; public contract in include/zs/attention.h).
 *
 * One operator rather than matmul + softmax + matmul: the forward keeps
 * only the output and the per-row logsumexp lse [B, H, Tq] (f64 for f64
 * inputs, else f32: bf16 and f16 inputs compute in f32 and give an
 * output of their own dtype, as torch's CPU flash attention),
 * and the backward recomputes the scores tile by tile, so neither pass
 * stores a Tq x Tk matrix and memory grows linearly with the sequence.
 * The backward rule runs the descriptor "attention_backward" (one fused
 * kernel, not itself differentiable; results dq, dk, dv via zsi_run_n).
 *
 * q, k, v are read in place through their strides when their last dim has
 * stride 1 (views of a fused QKV projection qualify); otherwise that input
 * is copied to a contiguous buffer first. A descriptor run by zsi_run
 * (ops/op.h): the views the kernel reads and lse are its aux results,
 * lse made only when a node is recorded. Node inputs q, k, v; attributes
 * attention_attrs (the zs_attention_params, by value) in forward and
 * backward; saved: see zsi_def_attention below.
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
#include "ops/attrs.h"

static zs_status attention_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin);

/* The attributes of attention and attention_backward. */

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
    zs_status st = zsi_check_pair_float16("attention", q, k);
    if (st == ZS_OK)
        st = zsi_check_pair_float16("attention", q, v);
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
    return last_dim_unit(t) ? zs_retain(t) : zsi_contig_host(t);
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

/* The dtype of lse for inputs of dtype dt: f64 for f64, else f32 (bf16
 * and f16 compute in f32 and keep their statistics in it, as torch). */
static zs_dtype lse_dtype(zs_dtype dt)
{
    return dt == ZS_F64 ? ZS_F64 : ZS_F32;
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

/* Inputs q, k, v; attributes attention_attrs. Saved: 0 q, 1 k, 2 v (as
 * read by the kernel: its aux 0..2), 3 out, 4 lse (aux 3, made only when
 * a node is recorded). */

static zs_attention_params call_params(const zsi_call *c)
{
    const attention_attrs *at = c->attrs;
    return (zs_attention_params){.scale = at->scale, .causal = at->causal,
                                 .alibi = at->alibi, .q_offset = at->q_offset};
}

/* The scale used: the attribute, or 1/sqrt(D) of q (in[0]) when it is 0. */
static double call_scale(const zsi_call *c)
{
    const attention_attrs *at = c->attrs;
    int64_t D = c->in[0]->shape[3];
    return at->scale != 0 ? at->scale : D > 0 ? 1 / sqrt((double)D) : 1;
}

/* The kernel's arguments for c's q, k, v (in[0..2], last dims of stride
 * 1) and attributes. */
static void call_args(zsk_attn *a, const zsi_call *c, zs_tensor *const *qkv,
                      const double *slopes)
{
    const attention_attrs *at = c->attrs;
    fill_args(a, qkv[0], qkv[1], qkv[2], call_scale(c), at->causal,
              at->q_offset, slopes);
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
    const attention_attrs *at = c->attrs;
    for (int i = 0; i < 3; i++)
        if (!zsi_aux_copy(c, i, c->in[i], kernel_view))
            return ZS_ERR_NOMEM;
    zs_status st;
    double *slopes = make_slopes(at->alibi, c->in[0]->shape[1], &st);
    if (st != ZS_OK)
        return st;
    zsk_attn a;
    call_args(&a, c, c->aux, slopes);
    if (zsi_call_records(c))
        st = zsi_aux_new(c, 3, lse_dtype(a.dt), ZS_SHAPE(a.B, a.H, a.Tq)) ? ZS_OK
                                                                          : ZS_ERR_NOMEM;
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
}

/* The shape part of c's kernel arguments (for cost models). */
static zsk_attn call_shape(const zsi_call *c)
{
    const attention_attrs *at = c->attrs;
    const zs_tensor *q = c->in[0], *k = c->in[1];
    return (zsk_attn){.B = q->shape[0], .H = q->shape[1], .Tq = q->shape[2],
                      .Tk = k->shape[2], .D = q->shape[3], .causal = at->causal,
                      .q_offset = at->q_offset};
}

static zsi_cost attention_cost(const zsi_call *c, const zs_tensor *out)
{
    const zs_tensor *q = c->in[0], *k = c->in[1], *v = c->in[2];
    zsk_attn a = call_shape(c);
    double lse = out->node ? (double)(a.B * a.H * a.Tq) *
                                 (double)zs_dtype_size(lse_dtype(q->dtype)) : 0;
    return (zsi_cost){forward_flops(&a),
                      zsi_bytes(q) + zsi_bytes(k) + zsi_bytes(v),
                      zsi_bytes(out) + lse};
}

/* ---- backward ---------------------------------------------------------- */

/* Inputs q, k, v, out, lse, g (the forward's, with its checks; out and g
 * like q, lse [B, H, Tq], one dtype); results dq, dk, dv like q, k, v
 * (all three: the kernel writes them together). */
static zs_status infer_attention_backward(zsi_call *c)
{
    const zs_tensor *q = c->in[0], *out = c->in[3], *lse = c->in[4];
    const zs_tensor *g = c->in[5];
    if (infer_attention(c) != ZS_OK)
        return ZS_ERR_ARG;
    if (zsi_check_pair_float16("attention_backward", q, out) != ZS_OK ||
        zsi_check_pair_float16("attention_backward", q, g) != ZS_OK)
        return ZS_ERR_ARG;
    if (lse->dtype != lse_dtype(q->dtype))
        return zs_set_error("attention_backward: lse is %s, expected %s for "
                            "q of %s", zs_dtype_name(lse->dtype),
                            zs_dtype_name(lse_dtype(q->dtype)),
                            zs_dtype_name(q->dtype));
    if (!zs_same_shape(out, q) || !zs_same_shape(g, q) || lse->ndim != 3 ||
        lse->shape[0] != q->shape[0] || lse->shape[1] != q->shape[1] ||
        lse->shape[2] != q->shape[2]) {
        char sq[96], so[96], sl[96], sg[96];
        return zs_set_error("attention_backward: q %s, out %s, lse %s, g %s: "
                            "expected out and g like q and lse [B, H, Tq]",
                            zs_shape_str(q, sq, sizeof sq),
                            zs_shape_str(out, so, sizeof so),
                            zs_shape_str(lse, sl, sizeof sl),
                            zs_shape_str(g, sg, sizeof sg));
    }
    c->nout = 3;
    for (int i = 1; i < 3; i++) {
        const zs_tensor *t = c->in[i];
        c->more[i - 1].dtype = t->dtype;
        c->more[i - 1].ndim = t->ndim;
        memcpy(c->more[i - 1].shape, t->shape, sizeof t->shape);
    }
    return ZS_OK;
}

static zs_status cpu_attention_backward(const zsi_call *c, zs_tensor *dq)
{
    const attention_attrs *at = c->attrs;
    /* q, k, v and g read in place (last dims of stride 1), out and lse
     * contiguous */
    zs_tensor *t[6] = {kernel_view(c->in[0]), kernel_view(c->in[1]),
                       kernel_view(c->in[2]), kernel_view(c->in[5]),
                       zsi_contig_host(c->in[3]), zsi_contig_host(c->in[4])};
    zs_status st = ZS_OK;
    for (int i = 0; i < 6; i++)
        if (!t[i])
            st = ZS_ERR_NOMEM;
    double *slopes = st == ZS_OK ? make_slopes(at->alibi, dq->shape[1], &st)
                                 : NULL;
    if (st == ZS_OK) {
        zsk_attn a;
        call_args(&a, c, t, slopes);
        st = zsk_attention_backward(&a, zs_data(t[4]), zs_data(t[5]),
                                    zs_data(t[3]), t[3]->strides, zs_data(dq),
                                    zs_data(c->outs[1]), zs_data(c->outs[2]));
    }
    for (int i = 0; i < 6; i++)
        zs_release(t[i]);
    free(slopes);
    return st;
}

/* 2.5 times the forward's FLOPs (recomputed q.k, do.v, then dv, dk, dq);
 * q, k, v, out, g and lse read, dq, dk, dv written */
static zsi_cost attention_backward_cost(const zsi_call *c, const zs_tensor *dq)
{
    zsk_attn a = call_shape(c);
    zsi_cost k = {2.5 * forward_flops(&a), 0,
                  zsi_bytes(c->in[0]) + zsi_bytes(c->in[1]) + zsi_bytes(c->in[2])};
    for (int i = 0; i < 6; i++)
        k.bytes_read += zsi_bytes(c->in[i]);
    return k;
}

zsi_opdef zsi_def_attention_backward = {
    .op = {.name = "attention_backward"}, .arity = 6,
    .infer = infer_attention_backward,
    .kernel = {[ZS_CPU] = {[ZS_F32] = cpu_attention_backward,
                           [ZS_F64] = cpu_attention_backward,
                           [ZS_BF16] = cpu_attention_backward,
                           [ZS_F16] = cpu_attention_backward}},
    .cost = attention_backward_cost, .attr_size = sizeof(attention_attrs)};

zsi_opdef zsi_def_attention = {
    .op = {.name = "attention", .backward = attention_bw}, .arity = 3,
    .infer = infer_attention,
    .kernel = {[ZS_CPU] = {[ZS_F32] = cpu_attention, [ZS_F64] = cpu_attention,
                           [ZS_BF16] = cpu_attention, [ZS_F16] = cpu_attention}},
    .save = save_attention, .cost = attention_cost,
    .attr_size = sizeof(attention_attrs),
    .bw_ops = (zsi_opdef *const[]){&zsi_def_attention_backward, NULL}};

zs_tensor *zs_attention(zs_tensor *q, zs_tensor *k, zs_tensor *v,
                        const zs_attention_params *p)
{
    zs_attention_params prm = p ? *p : (zs_attention_params){0};
    attention_attrs at = {.scale = prm.scale, .q_offset = prm.q_offset,
                          .causal = prm.causal, .alibi = prm.alibi};
    return zsi_run(&zsi_def_attention, 3, (zs_tensor *[]){q, k, v}, &at);
}

/* dq, dk, dv from the saved tensors by attention_backward; the ones no
 * input wants are dropped. */
static zs_status attention_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin)
{
    zs_tensor *in[] = {n->saved[0], n->saved[1], n->saved[2], n->saved[3],
                       n->saved[4], g};
    zs_tensor *d[3];
    zs_status st = zsi_run_n(&zsi_def_attention_backward, 6, in,
                             zsi_node_attrs(n), 3, d);
    for (int i = 0; i < 3; i++) {
        if (st == ZS_OK && zsi_needs_grad(n, i))
            gin[i] = d[i];
        else
            zs_release(d[i]);
    }
    return st;
}
