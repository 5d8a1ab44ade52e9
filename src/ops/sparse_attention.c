/*
 * sparse_attention.c - zs_sparse_attention, block-sparse self-attention,
 * and its layout (kernels in kernels/cpu/sparse_attention.c; public
 * contract in include/zs/attention.h).
 *
 * The layout is a pure function of its parameters and T, so the operator's
 * attributes (sparse_attrs) carry the parameters by value and each kernel
 * call rebuilds the compressed rows (nb^2 bytes while building: about 1 ms
 * for nb = 1024): no pointer to caller memory in a node.
 *
 * Descriptors as zs_attention's: "sparse_attention" (inputs q, k, v; aux
 * 0..2 the views the kernel reads, aux 3 the logsumexp lse [B, H, T], made
 * only when a node is recorded; saved: q, k, v, out, lse) and
 * "sparse_attention_backward" (inputs q, k, v, out, lse, g; results dq,
 * dk, dv by zsi_run_n), run by the backward rule, so the rule works on any
 * device with these kernels.
 *
 * Cost model: 4 D FLOPs per computed (query, key) pair forward (the kept
 * blocks' area, masked diagonal halves included: they are computed), 10 D
 * backward; bytes: inputs read once, outputs written once.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/sparse_attention.h"
#include "ops/internal.h"
#include "zs/attention.h"

static zs_status sparse_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin);

typedef struct sparse_attrs {
    double scale; /* 0: 1/sqrt(D) */
    int64_t block, local, global, random;
    uint64_t seed;
    bool causal;
} sparse_attrs;
ZSI_ATTRS(sparse_attrs);

/* ---- layout ------------------------------------------------------------- */

static zs_status check_params(const zs_sparse_params *p, int64_t T)
{
    if (p->block < 16 || p->block > 128)
        return zs_set_error("sparse_attention: block %lld, expected 16..128 tokens",
                            (long long)p->block);
    if (p->local < 0 || p->global < 0 || p->random < 0)
        return zs_set_error("sparse_attention: local %lld, global %lld, random "
                            "%lld: expected counts of blocks >= 0",
                            (long long)p->local, (long long)p->global,
                            (long long)p->random);
    if (T < 1 || T > ((int64_t)1 << 31))
        return zs_set_error("sparse_attention: %lld tokens, expected 1..2^31",
                            (long long)T);
    if (!isfinite(p->scale))
        return zs_set_error("sparse_attention: scale = %g, expected a finite "
                            "value (0 for 1/sqrt(D))", p->scale);
    return ZS_OK;
}

static zs_status build(const zs_sparse_params *p, int64_t T, zsk_blocks *b)
{
    zs_status st = check_params(p, T);
    return st != ZS_OK ? st : zsk_blocks_build(T, p->block, p->local, p->global,
                                               p->random, p->seed, p->causal, b);
}

zs_sparse_layout *zs_sparse_layout_new(const zs_sparse_params *p, int64_t T)
{
    if (!p) {
        zs_set_error("sparse_layout_new: no parameters");
        return NULL;
    }
    zs_sparse_layout *l = calloc(1, sizeof *l);
    zsk_blocks *b = calloc(1, sizeof *b);
    if (!l || !b) {
        free(l);
        free(b);
        zs_set_error_code(ZS_ERR_NOMEM, "sparse_layout_new: out of memory");
        return NULL;
    }
    if (build(p, T, b) != ZS_OK) {
        free(l);
        free(b);
        return NULL;
    }
    double t = (double)T;
    *l = (zs_sparse_layout){.T = T, .block = b->bs, .nb = b->nb, .nnz = b->nnz,
                            .causal = b->causal, .row_ptr = b->row_ptr,
                            .cols = b->cols,
                            .density = (double)b->nnz / ((double)b->nb * (double)b->nb),
                            .dense_pairs = b->causal ? t * (t + 1) / 2 : t * t,
                            .impl = b};
    l->pairs = zsk_blocks_pairs(b, &l->visible);
    return l;
}

void zs_sparse_layout_free(zs_sparse_layout *l)
{
    if (!l)
        return;
    zsk_blocks_free(l->impl);
    free(l->impl);
    free(l);
}

bool zs_sparse_layout_visible(const zs_sparse_layout *l, int64_t i, int64_t j)
{
    if (!l || i < 0 || j < 0 || i >= l->T || j >= l->T || (l->causal && j > i))
        return false;
    int64_t qb = i / l->block, kb = j / l->block;
    for (int64_t k = l->row_ptr[qb]; k < l->row_ptr[qb + 1]; k++)
        if (l->cols[k] == kb)
            return true;
    return false;
}

double zs_sparse_layout_flops(const zs_sparse_layout *l, int64_t B, int64_t H,
                              int64_t D)
{
    return l ? 4.0 * (double)D * (double)B * (double)H * l->pairs : 0;
}

/* ---- checks -------------------------------------------------------------- */

static zs_sparse_params params_of(const sparse_attrs *a)
{
    return (zs_sparse_params){.block = a->block, .local = a->local,
                              .global = a->global, .random = a->random,
                              .seed = a->seed, .causal = a->causal,
                              .scale = a->scale};
}

static zs_status check_qkv(const zs_tensor *q, const zs_tensor *k,
                           const zs_tensor *v, const sparse_attrs *a)
{
    zs_status st = zsi_check_pair_dtype("sparse_attention", q, k);
    if (st == ZS_OK)
        st = zsi_check_pair_dtype("sparse_attention", q, v);
    if (st != ZS_OK)
        return st;
    if (q->dtype != ZS_F32 && q->dtype != ZS_F64)
        return zs_set_error("sparse_attention: dtype %s, expected f32 or f64",
                            zs_dtype_name(q->dtype));
    if (q->ndim != 4 || !zs_same_shape(q, k) || !zs_same_shape(q, v) ||
        q->shape[3] < 1) {
        char sq[96], sk[96], sv[96];
        return zs_set_error("sparse_attention: q %s, k %s, v %s: expected one "
                            "shape [B, H, T, D] with D >= 1 (self-attention)",
                            zs_shape_str(q, sq, sizeof sq), zs_shape_str(k, sk, sizeof sk),
                            zs_shape_str(v, sv, sizeof sv));
    }
    zs_sparse_params p = params_of(a);
    return check_params(&p, q->shape[2]);
}

static bool last_dim_unit(const zs_tensor *t)
{
    return t->shape[3] <= 1 || t->strides[3] == 1;
}

/* t itself (retained) when its last dim has stride 1, else an untracked
 * contiguous copy; new reference or NULL. */
static zs_tensor *kernel_view(zs_tensor *t)
{
    return last_dim_unit(t) ? zs_retain(t) : zsi_contig_host(t);
}

/* The kernel's arguments for q, k, v (last dims of stride 1) and lay. */
static void fill_args(zsk_sattn *a, zs_tensor *const *qkv, const sparse_attrs *at,
                      const zsk_blocks *lay)
{
    const zs_tensor *q = qkv[0];
    int64_t D = q->shape[3];
    *a = (zsk_sattn){.dt = q->dtype, .B = q->shape[0], .H = q->shape[1],
                     .T = q->shape[2], .D = D, .q = zs_data(qkv[0]),
                     .k = zs_data(qkv[1]), .v = zs_data(qkv[2]),
                     .scale = at->scale != 0 ? at->scale : 1 / sqrt((double)D),
                     .lay = lay};
    for (int d = 0; d < 3; d++) {
        a->sq[d] = qkv[0]->strides[d];
        a->sk[d] = qkv[1]->strides[d];
        a->sv[d] = qkv[2]->strides[d];
    }
}

/* ---- forward -------------------------------------------------------------- */

static zs_status infer_sparse(zsi_call *c)
{
    if (check_qkv(c->in[0], c->in[1], c->in[2], c->attrs) != ZS_OK)
        return ZS_ERR_ARG;
    zsi_out_like(c, c->in[0]);
    return ZS_OK;
}

static zs_status cpu_sparse(const zsi_call *c, zs_tensor *out)
{
    const sparse_attrs *at = c->attrs;
    /* aux results through ops/aux.c, so a graph replay refreshes the
     * captured ones instead of making new ones its backward does not read */
    for (int i = 0; i < 3; i++)
        if (!zsi_aux_copy(c, i, c->in[i], kernel_view))
            return ZS_ERR_NOMEM;
    zsk_blocks lay;
    zs_sparse_params p = params_of(at);
    zs_status st = build(&p, c->in[0]->shape[2], &lay);
    if (st != ZS_OK)
        return st;
    zsk_sattn a;
    fill_args(&a, c->aux, at, &lay);
    if (zsi_call_records(c))
        st = zsi_aux_new(c, 3, a.dt, ZS_SHAPE(a.B, a.H, a.T)) ? ZS_OK : ZS_ERR_NOMEM;
    if (st == ZS_OK)
        st = zsk_sparse_attention_forward(&a, zs_data(out),
                                          c->aux[3] ? zs_data(c->aux[3]) : NULL);
    zsk_blocks_free(&lay);
    return st;
}

static void save_sparse(zsi_ctx *n, const zsi_call *c, zs_tensor *out)
{
    for (int i = 0; i < 3; i++)
        zsi_save(n, i, c->aux[i]);
    zsi_save(n, 3, out);
    zsi_save(n, 4, c->aux[3]);
}

/* Computed pairs of c's layout per (batch, head); 0 when it cannot be
 * built (the cost model is best effort). */
static double call_pairs(const zsi_call *c)
{
    zsk_blocks lay;
    zs_sparse_params p = params_of(c->attrs);
    if (build(&p, c->in[0]->shape[2], &lay) != ZS_OK)
        return 0;
    double pairs = zsk_blocks_pairs(&lay, NULL);
    zsk_blocks_free(&lay);
    return pairs;
}

static double call_flops(const zsi_call *c)
{
    const zs_tensor *q = c->in[0];
    return 4.0 * (double)(q->shape[0] * q->shape[1] * q->shape[3]) * call_pairs(c);
}

static zsi_cost sparse_cost(const zsi_call *c, const zs_tensor *out)
{
    return (zsi_cost){call_flops(c),
                      zsi_bytes(c->in[0]) + zsi_bytes(c->in[1]) + zsi_bytes(c->in[2]),
                      zsi_bytes(out)};
}

/* ---- backward ------------------------------------------------------------- */

/* Inputs q, k, v, out, lse, g (one dtype; out and g like q, lse
 * [B, H, T]); results dq, dk, dv like q. */
static zs_status infer_sparse_backward(zsi_call *c)
{
    const zs_tensor *q = c->in[0], *out = c->in[3], *lse = c->in[4], *g = c->in[5];
    if (infer_sparse(c) != ZS_OK)
        return ZS_ERR_ARG;
    for (int i = 3; i < 6; i++)
        if (zsi_check_pair_dtype("sparse_attention_backward", q, c->in[i]) != ZS_OK)
            return ZS_ERR_ARG;
    if (!zs_same_shape(out, q) || !zs_same_shape(g, q) || lse->ndim != 3 ||
        lse->shape[0] != q->shape[0] || lse->shape[1] != q->shape[1] ||
        lse->shape[2] != q->shape[2]) {
        char sq[96], so[96], sl[96], sg[96];
        return zs_set_error("sparse_attention_backward: q %s, out %s, lse %s, g "
                            "%s: expected out and g like q and lse [B, H, T]",
                            zs_shape_str(q, sq, sizeof sq), zs_shape_str(out, so, sizeof so),
                            zs_shape_str(lse, sl, sizeof sl), zs_shape_str(g, sg, sizeof sg));
    }
    c->nout = 3;
    for (int i = 1; i < 3; i++) {
        c->more[i - 1].dtype = q->dtype;
        c->more[i - 1].ndim = 4;
        memcpy(c->more[i - 1].shape, q->shape, sizeof q->shape);
    }
    return ZS_OK;
}

static zs_status cpu_sparse_backward(const zsi_call *c, zs_tensor *dq)
{
    const sparse_attrs *at = c->attrs;
    zs_tensor *t[6] = {kernel_view(c->in[0]), kernel_view(c->in[1]),
                       kernel_view(c->in[2]), kernel_view(c->in[5]),
                       zsi_contig_host(c->in[3]), zsi_contig_host(c->in[4])};
    zs_status st = ZS_OK;
    for (int i = 0; i < 6; i++)
        if (!t[i])
            st = ZS_ERR_NOMEM;
    zsk_blocks lay = {0};
    zs_sparse_params p = params_of(at);
    if (st == ZS_OK)
        st = build(&p, dq->shape[2], &lay);
    if (st == ZS_OK) {
        zsk_sattn a;
        fill_args(&a, t, at, &lay);
        st = zsk_sparse_attention_backward(&a, zs_data(t[4]), zs_data(t[5]),
                                           zs_data(t[3]), t[3]->strides, zs_data(dq),
                                           zs_data(c->outs[1]), zs_data(c->outs[2]));
    }
    zsk_blocks_free(&lay);
    for (int i = 0; i < 6; i++)
        zs_release(t[i]);
    return st;
}

static zsi_cost sparse_backward_cost(const zsi_call *c, const zs_tensor *dq)
{
    zsi_cost k = {2.5 * call_flops(c), 0, 3 * zsi_bytes(dq)};
    for (int i = 0; i < 6; i++)
        k.bytes_read += zsi_bytes(c->in[i]);
    return k;
}

zsi_opdef zsi_def_sparse_attention_backward = {
    .op = {.name = "sparse_attention_backward"}, .arity = 6,
    .infer = infer_sparse_backward,
    .kernel = {[ZS_CPU] = {[ZS_F32] = cpu_sparse_backward,
                           [ZS_F64] = cpu_sparse_backward}},
    .cost = sparse_backward_cost, .attr_size = sizeof(sparse_attrs)};

zsi_opdef zsi_def_sparse_attention = {
    .op = {.name = "sparse_attention", .backward = sparse_bw}, .arity = 3,
    .infer = infer_sparse,
    .kernel = {[ZS_CPU] = {[ZS_F32] = cpu_sparse, [ZS_F64] = cpu_sparse}},
    .save = save_sparse, .cost = sparse_cost, .attr_size = sizeof(sparse_attrs),
    .bw_ops = (zsi_opdef *const[]){&zsi_def_sparse_attention_backward, NULL}};

zs_tensor *zs_sparse_attention(zs_tensor *q, zs_tensor *k, zs_tensor *v,
                               const zs_sparse_params *p)
{
    if (!p) {
        zs_set_error("sparse_attention: no layout parameters");
        return NULL;
    }
    sparse_attrs at = {.scale = p->scale, .block = p->block, .local = p->local,
                       .global = p->global, .random = p->random, .seed = p->seed,
                       .causal = p->causal};
    return zsi_run(&zsi_def_sparse_attention, 3, (zs_tensor *[]){q, k, v}, &at);
}

/* dq, dk, dv from the saved tensors by sparse_attention_backward; those no
 * input wants are dropped. */
static zs_status sparse_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin)
{
    zs_tensor *in[] = {n->saved[0], n->saved[1], n->saved[2], n->saved[3],
                       n->saved[4], g};
    zs_tensor *d[3];
    zs_status st = zsi_run_n(&zsi_def_sparse_attention_backward, 6, in,
                             zsi_node_attrs(n), 3, d);
    for (int i = 0; i < 3; i++) {
        if (st == ZS_OK && zsi_needs_grad(n, i))
            gin[i] = d[i];
        else
            zs_release(d[i]);
    }
    return st;
}
