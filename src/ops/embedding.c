/*
 * embedding.c - zs_embedding: rows of weight [V, D] picked by an index
 * tensor of any shape (i32/i64) -> [idx..., D].
 *
 * Every index is checked before anything is written: one outside [0, V)
 * fails with a message naming the value and its position. The weight may
 * have any strides (rows are copied, with a memcpy when a row is
 * contiguous). Backward scatter-adds gout rows into a zero [V, D]
 * gradient; the pool splits the vocabulary into ranges, each thread scans
 * all indices and adds only those in its range, so no row is ever written
 * by two threads and the order of additions per row is the index order
 * (deterministic for any thread count).
 *
 * A descriptor run by zsi_run (ops/op.h); inputs weight and idx (no
 * gradient), no attributes. Saved: 0 the contiguous index tensor. The
 * backward rule runs the descriptor "embedding_backward" (inputs idx and
 * gout, attributes embedding_backward_attrs: V), a fused kernel not itself
 * differentiable. Cost model: no FLOPs forward; backward n*D additions.
 * Bytes: forward indices + rows read, rows written; backward indices +
 * gout read, [V, D] written. bf16 / f16: the forward copies rows as any
 * dtype; the backward sums each gradient row in f32 and rounds it once.
 */
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/lowp.h"
#include "ops/internal.h"
#include "ops/attrs.h"

static zs_status embedding_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin);

/* The attributes of embedding_backward (the forward has none: V is the
 * weight's first dim). */

/* ---- kernels ----------------------------------------------------------- */

static int64_t idx_get(zs_dtype dt, const void *idx, int64_t i)
{
    return dt == ZS_I64 ? ((const int64_t *)idx)[i]
                        : (int64_t)((const int32_t *)idx)[i];
}

typedef struct emb_ctx {
    zs_dtype idt;
    const void *idx;
    int64_t n, V, D;
    size_t es;
    const char *w;            /* weight base (first element) */
    int64_t ws0, ws1;         /* weight strides, elements */
    char *out;                /* [n, D] */
    const char *g;            /* backward: gout [n, D] */
    char *gw;                 /* backward: [V, D] */
    bool f64;
    zs_dtype dt;              /* backward: g's and gw's dtype */
    int failed;               /* bf16/f16 backward: no accumulator */
} emb_ctx;

static void emb_fw_rows(void *p, int64_t i0, int64_t i1)
{
    const emb_ctx *c = p;
    for (int64_t i = i0; i < i1; i++) {
        int64_t v = idx_get(c->idt, c->idx, i);
        const char *src = c->w + (size_t)(v * c->ws0) * c->es;
        char *dst = c->out + (size_t)(i * c->D) * c->es;
        if (c->ws1 == 1) {
            memcpy(dst, src, (size_t)c->D * c->es);
            continue;
        }
        for (int64_t d = 0; d < c->D; d++)
            memcpy(dst + (size_t)d * c->es, src + (size_t)(d * c->ws1) * c->es,
                   c->es);
    }
}

/* Vocabulary rows [v0, v1): adds every gout row whose index falls there. */
static void emb_bw_vocab(void *p, int64_t v0, int64_t v1)
{
    const emb_ctx *c = p;
    for (int64_t i = 0; i < c->n; i++) {
        int64_t v = idx_get(c->idt, c->idx, i);
        if (v < v0 || v >= v1)
            continue;
        if (c->f64) {
            double *dst = (double *)c->gw + v * c->D;
            const double *src = (const double *)c->g + i * c->D;
            for (int64_t d = 0; d < c->D; d++)
                dst[d] += src[d];
        } else {
            float *dst = (float *)c->gw + v * c->D;
            const float *src = (const float *)c->g + i * c->D;
            for (int64_t d = 0; d < c->D; d++)
                dst[d] += src[d];
        }
    }
}

/* bf16 / f16 gradient rows: vocabulary rows [v0, v1) in chunks that fit
 * an f32 accumulator of about 64K values, each chunk summing every g row
 * whose index falls in it (widened), then rounded once into gw. */
#define LP_ACC 65536

static void emb_bw_vocab_lp(void *p, int64_t v0, int64_t v1)
{
    const emb_ctx *c = p;
    int64_t D = c->D, vb = LP_ACC / (D > 0 ? D : 1);
    vb = vb < 1 ? 1 : vb;
    float *acc = malloc((size_t)((vb < v1 - v0 ? vb : v1 - v0) * D + D) *
                        sizeof(float));
    if (!acc) {
        __atomic_store_n(&((emb_ctx *)c)->failed, 1, __ATOMIC_RELAXED);
        return;
    }
    float *row = acc + (vb < v1 - v0 ? vb : v1 - v0) * D;
    for (int64_t a = v0; a < v1; a += vb) {
        int64_t b = a + vb < v1 ? a + vb : v1;
        memset(acc, 0, (size_t)((b - a) * D) * sizeof(float));
        for (int64_t i = 0; i < c->n; i++) {
            int64_t v = idx_get(c->idt, c->idx, i);
            if (v < a || v >= b)
                continue;
            zsk_widen16(c->dt, (const uint16_t *)c->g + i * D, row, D);
            float *dst = acc + (v - a) * D;
            for (int64_t d = 0; d < D; d++)
                dst[d] += row[d];
        }
        zsk_narrow16(c->dt, acc, (uint16_t *)c->gw + a * D, (b - a) * D);
    }
    free(acc);
}

/* ---- operator ---------------------------------------------------------- */

/* First index outside [0, V), reported with its coordinates in idx. */
static zs_status check_indices(const zs_tensor *idx, const void *data,
                               int64_t n, int64_t V)
{
    for (int64_t i = 0; i < n; i++) {
        int64_t v = idx_get(idx->dtype, data, i);
        if (v >= 0 && v < V)
            continue;
        char pos[160] = "[", *p = pos + 1;
        int64_t rem = i, coord[ZS_MAX_DIMS];
        for (int d = idx->ndim - 1; d >= 0; d--) {
            coord[d] = idx->shape[d] ? rem % idx->shape[d] : 0;
            rem = idx->shape[d] ? rem / idx->shape[d] : 0;
        }
        for (int d = 0; d < idx->ndim; d++)
            p += snprintf(p, sizeof pos - (size_t)(p - pos), "%s%lld",
                          d ? ", " : "", (long long)coord[d]);
        snprintf(p, sizeof pos - (size_t)(p - pos), "]");
        return zs_set_error("embedding: index %lld at position %s (flat %lld) "
                            "is out of range [0, %lld)", (long long)v, pos,
                            (long long)i, (long long)V);
    }
    return ZS_OK;
}

/* Inputs weight, idx; saved 0 the contiguous idx (the kernel's aux 0). */
static zs_status infer_embedding(zsi_call *c)
{
    const zs_tensor *w = c->in[0], *idx = c->in[1];
    zs_status st = zsi_check_float16_dtype("embedding", w);
    if (st == ZS_OK)
        st = zsi_check_index("embedding", idx);
    if (st != ZS_OK)
        return st;
    char sw[96], si[96];
    if (w->ndim != 2)
        return zs_set_error("embedding: weight %s has %d dims, expected 2 "
                            "[V, D]", zs_shape_str(w, sw, sizeof sw), w->ndim);
    if (idx->ndim + 1 > ZS_MAX_DIMS)
        return zs_set_error("embedding: idx %s has %d dims, expected at most "
                            "%d", zs_shape_str(idx, si, sizeof si), idx->ndim,
                            ZS_MAX_DIMS - 1);
    c->dtype = w->dtype;
    c->ndim = idx->ndim + 1;
    memcpy(c->shape, idx->shape, (size_t)idx->ndim * sizeof *c->shape);
    c->shape[idx->ndim] = w->shape[1];
    return ZS_OK;
}

static zs_status cpu_embedding(const zsi_call *c, zs_tensor *out)
{
    const zs_tensor *weight = c->in[0], *idx = c->in[1];
    zs_tensor *ic = zsi_aux_copy(c, 0, c->in[1], zs_contiguous);
    if (!ic)
        return ZS_ERR_NOMEM;
    int64_t n = zs_numel(idx), V = weight->shape[0], D = weight->shape[1];
    if (check_indices(idx, zs_data(ic), n, V) != ZS_OK)
        return ZS_ERR_ARG;
    emb_ctx e = {.idt = idx->dtype, .idx = zs_data(ic), .n = n, .V = V, .D = D,
                 .es = zs_dtype_size(weight->dtype), .w = zs_data(weight),
                 .ws0 = weight->strides[0], .ws1 = weight->strides[1],
                 .out = zs_data(out)};
    zs_parallel_for(n, ZSK_GRAIN / (D > 0 ? D : 1) + 1, emb_fw_rows, &e);
    return ZS_OK;
}

static void save_embedding(zsi_ctx *n, const zsi_call *c, zs_tensor *out)
{
    zsi_save(n, 0, c->aux[0]);
}

static zsi_cost embedding_cost(const zsi_call *c, const zs_tensor *out)
{
    double rows = zsi_bytes(out);
    return (zsi_cost){0, zsi_bytes(c->in[1]) + rows, rows};
}

/* ---- backward ---------------------------------------------------------- */

/* Inputs idx (i32/i64, any shape) and g [idx..., D] (f32/f64); the
 * result is [V, D] of g's dtype. Indices outside [0, V) add nothing (the
 * forward has checked them). */
static zs_status infer_embedding_backward(zsi_call *c)
{
    const embedding_backward_attrs *at = c->attrs;
    const zs_tensor *idx = c->in[0], *g = c->in[1];
    zs_status st = zsi_check_index("embedding_backward", idx);
    if (st == ZS_OK)
        st = zsi_check_float16_dtype("embedding_backward", g);
    if (st != ZS_OK)
        return st;
    bool match = g->ndim == idx->ndim + 1;
    for (int d = 0; match && d < idx->ndim; d++)
        match = g->shape[d] == idx->shape[d];
    if (!match || at->V < 0) {
        char si[96], sg[96];
        return zs_set_error("embedding_backward: idx %s, g %s, V %lld: "
                            "expected g [idx..., D] and V >= 0",
                            zs_shape_str(idx, si, sizeof si),
                            zs_shape_str(g, sg, sizeof sg), (long long)at->V);
    }
    c->key = c->dtype = g->dtype;
    c->ndim = 2;
    c->shape[0] = at->V;
    c->shape[1] = g->shape[g->ndim - 1];
    return ZS_OK;
}

static zs_status cpu_embedding_backward(const zsi_call *c, zs_tensor *out)
{
    zs_tensor *ic = zsi_contig_host(c->in[0]), *gc = ic ? zsi_contig_host(c->in[1]) : NULL;
    if (!gc) {
        zs_release(ic);
        return ZS_ERR_NOMEM;
    }
    memset(zs_data(out), 0, zs_nbytes(out));
    int64_t V = out->shape[0], D = out->shape[1], cnt = zs_numel(ic);
    emb_ctx e = {.idt = ic->dtype, .idx = zs_data(ic), .n = cnt, .V = V,
                 .D = D, .g = zs_data(gc), .gw = zs_data(out),
                 .f64 = out->dtype == ZS_F64, .dt = out->dtype};
    /* Each range rescans all indices: split only when the rows to add
     * outweigh that scan. */
    int64_t grain = cnt * D >= ZSK_GRAIN ? 1 : V;
    zs_parallel_for(V, grain, zsk_is_lowp16(out->dtype) ? emb_bw_vocab_lp
                                                      : emb_bw_vocab, &e);
    zs_release(ic);
    zs_release(gc);
    if (e.failed)
        return zs_set_error_code(ZS_ERR_NOMEM, "embedding_backward: out of "
                                 "memory for the f32 accumulator");
    return ZS_OK;
}

/* n*D additions; indices and g read, [V, D] written */
static zsi_cost embedding_backward_cost(const zsi_call *c, const zs_tensor *out)
{
    const zs_tensor *idx = c->in[0], *g = c->in[1];
    return (zsi_cost){(double)zs_numel(idx) * (double)out->shape[1],
                      zsi_bytes(idx) + zsi_bytes(g), zsi_bytes(out)};
}

zsi_opdef zsi_def_embedding_backward = {
    .op = {.name = "embedding_backward"}, .arity = 2,
    .infer = infer_embedding_backward,
    .kernel = {[ZS_CPU] = {[ZS_F32] = cpu_embedding_backward,
                           [ZS_F64] = cpu_embedding_backward,
                           [ZS_BF16] = cpu_embedding_backward,
                           [ZS_F16] = cpu_embedding_backward}},
    .cost = embedding_backward_cost,
    .attr_size = sizeof(embedding_backward_attrs)};

zsi_opdef zsi_def_embedding = {
    .op = {.name = "embedding", .backward = embedding_bw}, .arity = 2,
    .infer = infer_embedding,
    .kernel = {[ZS_CPU] = {[ZS_F32] = cpu_embedding, [ZS_F64] = cpu_embedding,
                           [ZS_BF16] = cpu_embedding, [ZS_F16] = cpu_embedding}},
    .save = save_embedding, .cost = embedding_cost,
    .bw_ops = (zsi_opdef *const[]){&zsi_def_embedding_backward, NULL}};

zs_tensor *zs_embedding(zs_tensor *weight, zs_tensor *idx)
{
    return zsi_run(&zsi_def_embedding, 2, (zs_tensor *[]){weight, idx}, NULL);
}

static zs_status embedding_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin)
{
    embedding_backward_attrs at = {.V = n->in_meta[0].shape[0]};
    gin[0] = zsi_run(&zsi_def_embedding_backward, 2,
                     (zs_tensor *[]){n->saved[0], g}, &at);
    return gin[0] ? ZS_OK : ZS_ERR_NOMEM;
}
