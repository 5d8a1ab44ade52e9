/*
 * infer_ops.c - the inference engine's forward pass as descriptors
 * (ops/infer_ops.h): packed_linear, embedding_rows, kv_store,
 * paged_attention, layer_norm_rows, gather_rows.
 *
 * All are in place: in[0] is the engine's buffer the kernel writes (kv_store
 * also writes the pool, its in[1]); the attributes carry the step's row
 * count, so buffers keep their capacity from step to step and a call costs
 * the driver's checks only. The CPU kernels are the loops and zsk_ calls
 * src/infer ran on raw pointers before (same arguments, same bits); the
 * test device (ops/testdev.c) runs them on host aliases like any other.
 * infer checks dtypes and that every buffer is large enough for the rows
 * the attributes name; the step's metadata (block tables, positions) is
 * built by the engine and trusted.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/int8_linear.h"
#include "kernels/cpu/lowp.h"
#include "kernels/cpu/norm.h"
#include "kernels/cpu/packed_linear.h"
#include "kernels/cpu/paged_attention.h"
#include "kernels/cpu/qpacked.h"
#include "ops/infer_ops.h"
#include "ops/internal.h"

ZSI_ATTRS(zsi_linear_attrs);
ZSI_ATTRS(zsi_embed_attrs);
ZSI_ATTRS(zsi_kv_attrs);
ZSI_ATTRS(zsi_paged_attn_attrs);
ZSI_ATTRS(zsi_norm_rows_attrs);
ZSI_ATTRS(zsi_gather_attrs);

/* Fails unless t holds at least n elements of dtype dt. */
static zs_status need(const zsi_call *c, const char *what, const zs_tensor *t,
                      zs_dtype dt, int64_t n)
{
    if (t->dtype != dt)
        return zs_set_error("%s: %s is %s, expected %s", c->def->op.name, what,
                            zs_dtype_name(t->dtype), zs_dtype_name(dt));
    if (!zs_is_contiguous(t) || zs_numel(t) < n)
        return zs_set_error("%s: %s holds %lld elements (contiguous), expected at "
                            "least %lld", c->def->op.name, what,
                            (long long)zs_numel(t), (long long)n);
    return ZS_OK;
}

/* Elements of `rows` rows of `cols` at stride ld (0 rows: none). */
static int64_t span(int64_t rows, int64_t ld, int64_t cols)
{
    return rows > 0 ? (rows - 1) * ld + cols : 0;
}

static zs_status check_float_dst(zsi_call *c)
{
    zs_dtype dt = c->in[0]->dtype;
    if (dt != ZS_F32 && dt != ZS_F64)
        return zs_set_error("%s: the destination is %s, expected f32 or f64",
                            c->def->op.name, zs_dtype_name(dt));
    zsi_out_like(c, c->in[0]);
    return ZS_OK;
}

/* check_float_dst, also accepting bf16 and f16 destinations. */
static zs_status check_float16_dst(zsi_call *c)
{
    zs_dtype dt = c->in[0]->dtype;
    if (dt != ZS_BF16 && dt != ZS_F16)
        return check_float_dst(c);
    zsi_out_like(c, c->in[0]);
    return ZS_OK;
}

static zs_status check_meta(const zsi_call *c, const zs_tensor *meta,
                            const zsi_step_meta *m)
{
    if (m->n < 0 || m->n_out < 0 || m->len < 0)
        return zs_set_error("%s: %lld rows, %lld out rows", c->def->op.name,
                            (long long)m->n, (long long)m->n_out);
    return need(c, "the step's metadata", meta, ZS_I32, m->len);
}

static bool is_q(int32_t f)
{
    return f == ZSI_W_Q8_0 || f == ZSI_W_Q4_0 || f == ZSI_W_Q4_1;
}

static zsk_qfmt qfmt_of(int32_t f)
{
    return f == ZSI_W_Q8_0 ? ZSK_Q8_0 : f == ZSI_W_Q4_0 ? ZSK_Q4_0 : ZSK_Q4_1;
}

/* The tiles of a quantized W [N, K] whose bytes are data. */
static zsk_qpacked tiles_of(int32_t fmt, int64_t N, int64_t K, int64_t tile_bytes,
                            void *data)
{
    return (zsk_qpacked){qfmt_of(fmt), N, K, (N + ZSK_QTILE - 1) / ZSK_QTILE, tile_bytes,
                         data};
}

/* Bytes of W [N, K] in format fmt. */
static int64_t weight_bytes(int32_t fmt, int64_t N, int64_t K, int64_t tile_bytes)
{
    switch (fmt) {
    case ZSI_W_F32: return (N + ZSK_PANEL - 1) / ZSK_PANEL * K * ZSK_PANEL * 4;
    case ZSI_W_F64: return N * K * 8;
    case ZSI_W_I8: return N * K;
    default: return (N + ZSK_QTILE - 1) / ZSK_QTILE * tile_bytes;
    }
}

/* ---- packed_linear ------------------------------------------------------- */

static zs_status infer_linear(zsi_call *c)
{
    const zsi_linear_attrs *a = c->attrs;
    zs_status st = check_float_dst(c);
    if (st != ZS_OK)
        return st;
    zs_dtype dt = c->in[0]->dtype;
    int want = 3 + a->scale + a->smooth + a->bias + a->residual;
    if (c->nin != want || a->fmt < ZSI_W_F32 || a->fmt > ZSI_W_I8 ||
        (dt == ZS_F64) != (a->fmt == ZSI_W_F64) || a->N < 0 || a->K < 0 || a->M < 0 ||
        (a->act != ZSK_ACT_NONE && a->act != ZSK_ACT_GELU_TANH) ||
        (is_q(a->fmt) && a->tile_bytes < 0))
        return zs_set_error("%s: %d inputs, format %d, act %d, %s, [%lld, %lld] x %lld "
                            "rows: expected %d inputs, a known format (f64 with f64 "
                            "only) and act", c->def->op.name, c->nin, (int)a->fmt,
                            (int)a->act, zs_dtype_name(dt), (long long)a->N,
                            (long long)a->K, (long long)a->M, want);
    int k = 3;
    st = need(c, "y", c->in[0], dt, span(a->M, a->ldy, a->N));
    st = st ? st : need(c, "x", c->in[1], dt, span(a->M, a->ldx, a->K));
    st = st ? st : need(c, "W", c->in[2], ZS_U8, weight_bytes(a->fmt, a->N, a->K,
                                                               a->tile_bytes));
    if (st == ZS_OK && a->scale)
        st = need(c, "scale", c->in[k++], ZS_F32, a->N);
    if (st == ZS_OK && a->smooth)
        st = need(c, "smooth", c->in[k++], ZS_F32, a->K);
    if (st == ZS_OK && a->bias)
        st = need(c, "bias", c->in[k++], dt, a->N);
    if (st == ZS_OK && a->residual)
        st = need(c, "residual", c->in[k++], dt, span(a->M, a->ldr, a->N));
    if (st == ZS_OK && a->fmt == ZSI_W_I8 && !a->scale)
        st = zs_set_error("%s: int8 weights without their scales", c->def->op.name);
    return st;
}

/* The optional inputs of a packed_linear call, NULL when absent. */
typedef struct lin_opt {
    void *scale, *smooth, *bias, *res;
} lin_opt;

static lin_opt lin_opts(const zsi_call *c)
{
    const zsi_linear_attrs *a = c->attrs;
    lin_opt o = {0};
    int k = 3;
    o.scale = a->scale ? zs_data(c->in[k++]) : NULL;
    o.smooth = a->smooth ? zs_data(c->in[k++]) : NULL;
    o.bias = a->bias ? zs_data(c->in[k++]) : NULL;
    o.res = a->residual ? zs_data(c->in[k++]) : NULL;
    return o;
}

static zs_status cpu_linear_f32(const zsi_call *c, zs_tensor *out)
{
    const zsi_linear_attrs *a = c->attrs;
    if (a->M == 0)
        return ZS_OK;
    lin_opt o = lin_opts(c);
    const float *x = zs_data(c->in[1]);
    void *W = zs_data(c->in[2]);
    float *y = zs_data(out);
    switch (a->fmt) {
    case ZSI_W_F32: {
        zsk_packed_f32 p = {a->N, a->K, (a->N + ZSK_PANEL - 1) / ZSK_PANEL, W};
        return zsk_packed_linear_f32(&p, x, a->M, a->ldx, o.bias, o.res, a->ldr,
                                     (zsk_act)a->act, y, a->ldy);
    }
    case ZSI_W_I8: {
        zsk_i8_opts io = {o.smooth, a->threshold};
        return zsk_i8_linear(W, o.scale, a->N, a->K, x, a->M, a->ldx, &io, o.bias,
                             o.res, a->ldr, (zsk_act)a->act, y, a->ldy);
    }
    default: {
        zsk_qpacked p = tiles_of(a->fmt, a->N, a->K, a->tile_bytes, W);
        return zsk_qpacked_linear(&p, x, a->M, a->ldx, o.bias, o.res, a->ldr,
                                  (zsk_act)a->act, y, a->ldy);
    }
    }
}

/* GPT-2's tanh GeLU of one value. */
static double gelu(double x)
{
    return 0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
}

typedef struct f64_job {
    const double *W, *b, *x, *r;
    double *y;
    int64_t K, M, ldx, ldr, ldy;
    zsk_act act;
} f64_job;

/* Outputs [n0, n1) of every row: the dot in increasing k. */
static void f64_cols(void *ctx, int64_t n0, int64_t n1)
{
    const f64_job *j = ctx;
    const double *W = j->W, *b = j->b;
    int64_t K = j->K;
    for (int64_t m = 0; m < j->M; m++)
        for (int64_t n = n0; n < n1; n++) {
            double acc = 0;
            for (int64_t k = 0; k < K; k++)
                acc += j->x[m * j->ldx + k] * W[n * K + k];
            acc += b ? b[n] : 0;
            acc = j->act == ZSK_ACT_GELU_TANH ? gelu(acc) : acc;
            j->y[m * j->ldy + n] = acc + (j->r ? j->r[m * j->ldr + n] : 0);
        }
}

static zs_status cpu_linear_f64(const zsi_call *c, zs_tensor *out)
{
    const zsi_linear_attrs *a = c->attrs;
    if (a->M == 0)
        return ZS_OK;
    lin_opt o = lin_opts(c);
    f64_job j = {zs_data(c->in[2]), o.bias, zs_data(c->in[1]), o.res, zs_data(out),
                 a->K, a->M, a->ldx, a->ldr, a->ldy, (zsk_act)a->act};
    zs_parallel_for(a->N, 1 + 16384 / (a->K * a->M + 1), f64_cols, &j);
    return ZS_OK;
}

/* 2 M N K FLOPs; the weights and x read, y written (and read when it is
 * the residual). */
static zsi_cost linear_cost(const zsi_call *c, const zs_tensor *out)
{
    const zsi_linear_attrs *a = c->attrs;
    double es = (double)zs_dtype_size(out->dtype), MN = (double)(a->M * a->N);
    double rd = (double)weight_bytes(a->fmt, a->N, a->K, a->tile_bytes) +
                (double)(a->M * a->K) * es + (a->residual ? MN * es : 0);
    return (zsi_cost){2 * MN * (double)a->K, rd, MN * es};
}

zsi_opdef zsi_def_packed_linear = {
    .op = {.name = "packed_linear"}, .arity = 0, .inplace = true, .cls = ZSI_GEMM,
    .infer = infer_linear, .cost = linear_cost, .attr_size = sizeof(zsi_linear_attrs),
    .kernel = {[ZS_CPU] = {[ZS_F32] = cpu_linear_f32, [ZS_F64] = cpu_linear_f64}},
};

/* ---- embedding_rows ------------------------------------------------------ */

static zs_status infer_embed(zsi_call *c)
{
    const zsi_embed_attrs *a = c->attrs;
    zs_status st = check_float16_dst(c);
    if (st != ZS_OK)
        return st;
    zs_dtype dt = c->in[0]->dtype;
    bool dense = a->fmt == ZSI_W_F32 || a->fmt == ZSI_W_F64;
    if (c->nin != 3 + a->wpe || (!dense && (!is_q(a->fmt) || dt != ZS_F32)) ||
        a->C < 0 || a->V < 0)
        return zs_set_error("%s: %d inputs, table format %d for %s rows",
                            c->def->op.name, c->nin, (int)a->fmt, zs_dtype_name(dt));
    st = need(c, "x", c->in[0], dt, a->m.n * a->C);
    st = st ? st : check_meta(c, c->in[1], &a->m);
    st = st ? st : dense ? need(c, "the table", c->in[2], dt, a->V * a->C)
                         : need(c, "the table", c->in[2], ZS_U8,
                                weight_bytes(a->fmt, a->V, a->C, a->tile_bytes));
    if (st == ZS_OK && a->wpe)
        st = need(c, "wpe", c->in[3], dt, a->C);
    return st;
}

static zs_status cpu_embed(const zsi_call *c, zs_tensor *out)
{
    const zsi_embed_attrs *a = c->attrs;
    const int32_t *meta = zs_data(c->in[1]);
    const char *table = zs_data(c->in[2]);
    const char *wpe = a->wpe ? zs_data(c->in[3]) : NULL;
    bool f64 = out->dtype == ZS_F64;
    int64_t C = a->C;
    size_t es = zs_dtype_size(out->dtype);
    zsk_qpacked p = tiles_of(a->fmt, a->V, C, a->tile_bytes, (void *)table);
    for (int64_t i = 0; i < a->m.n; i++) {
        char *r = (char *)zs_data(out) + (size_t)(i * C) * es;
        int32_t id = meta[a->m.tok + i];
        if (a->fmt == ZSI_W_F32 || a->fmt == ZSI_W_F64) {
            memcpy(r, table + (size_t)id * (size_t)C * es, (size_t)C * es);
        } else { /* quantized: the head's row */
            zs_status s = zsk_qpacked_row(&p, id, (float *)r);
            if (s != ZS_OK)
                return s;
        }
        if (!wpe)
            continue;
        const char *q = wpe + (size_t)((int64_t)meta[a->m.pos + i] * C) * es;
        for (int64_t k = 0; k < C; k++) {
            if (es == 2) /* bf16 / f16: the sum in f32, rounded once */
                ((uint16_t *)r)[k] = zsk_st16(
                    out->dtype, zsk_ld16(out->dtype, ((uint16_t *)r)[k]) +
                                    zsk_ld16(out->dtype, ((const uint16_t *)q)[k]));
            else if (f64)
                ((double *)r)[k] += ((const double *)q)[k];
            else
                ((float *)r)[k] += ((const float *)q)[k];
        }
    }
    return ZS_OK;
}

/* the rows read and written */
static zsi_cost embed_cost(const zsi_call *c, const zs_tensor *out)
{
    const zsi_embed_attrs *a = c->attrs;
    double b = (double)(a->m.n * a->C) * (double)zs_dtype_size(out->dtype);
    return (zsi_cost){a->wpe ? b / (double)zs_dtype_size(out->dtype) : 0,
                      a->wpe ? 2 * b : b, b};
}

zsi_opdef zsi_def_embedding_rows = {
    .op = {.name = "embedding_rows"}, .arity = 0, .inplace = true,
    .infer = infer_embed, .cost = embed_cost, .attr_size = sizeof(zsi_embed_attrs),
    .kernel = {[ZS_CPU] = {[ZS_F32] = cpu_embed, [ZS_F64] = cpu_embed,
                           [ZS_BF16] = cpu_embed, [ZS_F16] = cpu_embed}},
};

/* ---- kv_store ------------------------------------------------------------ */

/* Elements of a pool of `blocks` blocks. */
static int64_t pool_blocks(const zs_tensor *pool, int64_t C, int64_t L, int64_t bs)
{
    int64_t per = 2 * L * bs * C;
    return per > 0 ? zs_numel(pool) / per : 0;
}

static zs_status check_pool(const zsi_call *c, const zs_tensor *pool, zs_dtype dt,
                            int64_t C, int64_t L, int64_t l, int64_t bs)
{
    zs_dtype kv = pool->dtype;
    if (!(kv == dt || (dt == ZS_F32 && (kv == ZS_BF16 || kv == ZS_F16))) ||
        !zs_is_contiguous(pool) || L < 1 || l < 0 || l >= L || bs < 1 || C < 1 ||
        pool_blocks(pool, C, L, bs) < 1)
        return zs_set_error("%s: a %s pool of %lld elements for %s rows (layer %lld "
                            "of %lld, width %lld, blocks of %lld)", c->def->op.name,
                            zs_dtype_name(kv), (long long)zs_numel(pool),
                            zs_dtype_name(dt), (long long)l, (long long)L,
                            (long long)C, (long long)bs);
    return ZS_OK;
}

static zs_status infer_kv(zsi_call *c)
{
    const zsi_kv_attrs *a = c->attrs;
    zs_status st = c->nin == 4 ? check_float_dst(c)
                               : zs_set_error("%s: %d inputs, expected 4",
                                              c->def->op.name, c->nin);
    zs_dtype dt = c->in[0]->dtype;
    st = st ? st : check_pool(c, c->in[1], dt, a->C, a->L, a->l, a->bs);
    st = st ? st : need(c, "q", c->in[0], dt, a->m.n * a->C);
    st = st ? st : need(c, "qkv", c->in[2], dt, a->m.n * 3 * a->C);
    return st ? st : check_meta(c, c->in[3], &a->m);
}

/* One K or V row of C floats into the pool's 16-bit dtype kv (rounded to
 * nearest even, as zs_f32_to_bf16 / zs_f32_to_f16). */
static void narrow_row(zs_dtype kv, const float *src, int64_t C, uint16_t *dst)
{
    for (int64_t c = 0; c < C; c++)
        dst[c] = kv == ZS_BF16 ? zs_f32_to_bf16(src[c]) : zs_f32_to_f16(src[c]);
}

static zs_status cpu_kv(const zsi_call *c, zs_tensor *q)
{
    const zsi_kv_attrs *a = c->attrs;
    const zs_tensor *pool = c->in[1];
    const int32_t *meta = zs_data(c->in[3]);
    int64_t C = a->C, L = a->L, l = a->l, bs = a->bs;
    size_t es = zs_dtype_size(q->dtype), row = (size_t)C * es;
    size_t kv_row = (size_t)C * zs_dtype_size(pool->dtype);
    bool same = pool->dtype == q->dtype;
    char *base = zs_data(pool);
    const char *qkv0 = zs_data(c->in[2]);
    for (int64_t i = 0; i < a->m.n; i++) {
        const char *qkv = qkv0 + (size_t)(i * 3) * row;
        int64_t pos = meta[a->m.pos + i];
        const int32_t *table = meta + meta[a->m.tab + i];
        int64_t blk = table[pos / bs], slot = pos % bs;
        char *k = base + ((size_t)(blk * 2 * L + l) * (size_t)bs + (size_t)slot) * kv_row;
        char *v = k + (size_t)(L * bs) * kv_row;
        memcpy((char *)zs_data(q) + (size_t)i * row, qkv, row);
        if (same) {
            memcpy(k, qkv + row, row);
            memcpy(v, qkv + 2 * row, row);
        } else {
            narrow_row(pool->dtype, (const float *)(qkv + row), C, (uint16_t *)k);
            narrow_row(pool->dtype, (const float *)(qkv + 2 * row), C, (uint16_t *)v);
        }
    }
    return ZS_OK;
}

/* qkv read; q, K and V written */
static zsi_cost kv_cost(const zsi_call *c, const zs_tensor *out)
{
    const zsi_kv_attrs *a = c->attrs;
    double nc = (double)(a->m.n * a->C), es = (double)zs_dtype_size(out->dtype);
    return (zsi_cost){0, 3 * nc * es,
                      nc * es + 2 * nc * (double)zs_dtype_size(c->in[1]->dtype)};
}

zsi_opdef zsi_def_kv_store = {
    .op = {.name = "kv_store"}, .arity = 4, .inplace = true,
    .infer = infer_kv, .cost = kv_cost, .attr_size = sizeof(zsi_kv_attrs),
    .kernel = {[ZS_CPU] = {[ZS_F32] = cpu_kv, [ZS_F64] = cpu_kv}},
};

/* ---- paged_attention ----------------------------------------------------- */

static zs_status infer_attn(zsi_call *c)
{
    const zsi_paged_attn_attrs *a = c->attrs;
    zs_status st = c->nin == 4 + a->slopes ? check_float_dst(c)
                                           : zs_set_error("%s: %d inputs, expected %d",
                                                          c->def->op.name, c->nin,
                                                          4 + a->slopes);
    zs_dtype dt = c->in[0]->dtype;
    int64_t C = a->H * a->D;
    st = st ? st : check_pool(c, c->in[2], dt, C, a->L, a->l, a->bs);
    st = st ? st : need(c, "o", c->in[0], dt, a->m.n * C);
    st = st ? st : need(c, "q", c->in[1], dt, a->m.n * C);
    st = st ? st : check_meta(c, c->in[3], &a->m);
    if (st == ZS_OK && a->slopes)
        st = need(c, "slopes", c->in[4], dt, a->H);
    return st;
}

static zs_status cpu_attn(const zsi_call *c, zs_tensor *o)
{
    const zsi_paged_attn_attrs *a = c->attrs;
    int64_t n = a->m.n, H = a->H, D = a->D, C = H * D, L = a->L, l = a->l, bs = a->bs;
    int64_t per = bs * C;
    if (n == 0)
        return ZS_OK;
    const int32_t *meta = zs_data(c->in[3]);
    /* host scratch: the row pointers and lengths the kernel reads */
    const int32_t **tables = malloc((size_t)n * sizeof *tables);
    int64_t *len = malloc((size_t)n * sizeof *len);
    if (!tables || !len) {
        free(tables), free(len);
        return zs_set_error_code(ZS_ERR_NOMEM, "%s: out of memory", c->def->op.name);
    }
    for (int64_t i = 0; i < n; i++) {
        tables[i] = meta + meta[a->m.tab + i];
        len[i] = (int64_t)meta[a->m.pos + i] + 1;
    }
    zs_status st;
    if (o->dtype == ZS_F64) {
        zsk_paged_attn_f64 p = {n, H, D, zs_data(c->in[1]), zs_data(c->in[2]),
                                2 * L * per, l * per, (L + l) * per, bs, tables, len,
                                1 / sqrt((double)D), a->slopes ? zs_data(c->in[4]) : NULL};
        st = zsk_paged_attention_f64(&p, zs_data(o));
    } else {
        zsk_paged_attn p = {n, H, D, zs_data(c->in[1]), zs_data(c->in[2]), 2 * L * per,
                            l * per, (L + l) * per, bs, tables, len,
                            (float)(1 / sqrt((double)D)),
                            a->slopes ? zs_data(c->in[4]) : NULL, c->in[2]->dtype};
        st = zsk_paged_attention_f32(&p, zs_data(o));
    }
    free(tables), free(len);
    return st;
}

/* 4 D FLOPs per (row, head, position seen); q, the positions' K and V
 * read, o written. The positions are in the metadata, which the cost
 * model does not read (it may be on a device): counted as one each. */
static zsi_cost attn_cost(const zsi_call *c, const zs_tensor *out)
{
    const zsi_paged_attn_attrs *a = c->attrs;
    double nc = (double)(a->m.n * a->H * a->D), es = (double)zs_dtype_size(out->dtype);
    return (zsi_cost){4 * nc, nc * es + 2 * nc * (double)zs_dtype_size(c->in[2]->dtype),
                      nc * es};
}

zsi_opdef zsi_def_paged_attention = {
    .op = {.name = "paged_attention"}, .arity = 0, .inplace = true,
    .infer = infer_attn, .cost = attn_cost, .attr_size = sizeof(zsi_paged_attn_attrs),
    .kernel = {[ZS_CPU] = {[ZS_F32] = cpu_attn, [ZS_F64] = cpu_attn}},
};

/* ---- layer_norm_rows ----------------------------------------------------- */

static zs_status infer_norm_rows(zsi_call *c)
{
    const zsi_norm_rows_attrs *a = c->attrs;
    zs_status st = c->nin == 4 ? check_float16_dst(c)
                               : zs_set_error("%s: %d inputs, expected 4",
                                              c->def->op.name, c->nin);
    zs_dtype dt = c->in[0]->dtype;
    if (st == ZS_OK && (a->n < 0 || a->C < 1))
        st = zs_set_error("%s: %lld rows of %lld", c->def->op.name, (long long)a->n,
                          (long long)a->C);
    st = st ? st : need(c, "y", c->in[0], dt, a->n * a->C);
    st = st ? st : need(c, "x", c->in[1], dt, a->n * a->C);
    st = st ? st : need(c, "w", c->in[2], dt, a->C);
    return st ? st : need(c, "b", c->in[3], dt, a->C);
}

static zs_status cpu_norm_rows(const zsi_call *c, zs_tensor *y)
{
    const zsi_norm_rows_attrs *a = c->attrs;
    if (zsk_is_lowp16(y->dtype)) /* computed in f32, y rounded once */
        return zsk_layer_norm_lp(y->dtype, y->dtype, zs_data(c->in[1]),
                                 zs_data(c->in[2]), zs_data(c->in[3]), a->n, a->C,
                                 a->eps, zs_data(y), NULL, NULL);
    zsk_layer_norm(y->dtype, zs_data(c->in[1]), zs_data(c->in[2]), zs_data(c->in[3]),
                   a->n, a->C, a->eps, zs_data(y), NULL, NULL);
    return ZS_OK;
}

/* 8 FLOPs per element (layer_norm's count); x read, y written */
static zsi_cost norm_rows_cost(const zsi_call *c, const zs_tensor *out)
{
    const zsi_norm_rows_attrs *a = c->attrs;
    double nc = (double)(a->n * a->C), es = (double)zs_dtype_size(out->dtype);
    return (zsi_cost){8 * nc, nc * es, nc * es};
}

zsi_opdef zsi_def_layer_norm_rows = {
    .op = {.name = "layer_norm_rows"}, .arity = 4, .inplace = true,
    .infer = infer_norm_rows, .cost = norm_rows_cost,
    .attr_size = sizeof(zsi_norm_rows_attrs),
    .kernel = {[ZS_CPU] = {[ZS_F32] = cpu_norm_rows, [ZS_F64] = cpu_norm_rows,
                           [ZS_BF16] = cpu_norm_rows, [ZS_F16] = cpu_norm_rows}},
};

/* ---- gather_rows --------------------------------------------------------- */

static zs_status infer_gather(zsi_call *c)
{
    const zsi_gather_attrs *a = c->attrs;
    zs_status st = c->nin == 3 ? check_float_dst(c)
                               : zs_set_error("%s: %d inputs, expected 3",
                                              c->def->op.name, c->nin);
    zs_dtype dt = c->in[0]->dtype;
    st = st ? st : need(c, "dst", c->in[0], dt, a->m.n_out * a->C);
    st = st ? st : need(c, "src", c->in[1], dt, a->m.n * a->C);
    return st ? st : check_meta(c, c->in[2], &a->m);
}

static zs_status cpu_gather(const zsi_call *c, zs_tensor *dst)
{
    const zsi_gather_attrs *a = c->attrs;
    const int32_t *meta = zs_data(c->in[2]);
    size_t row = (size_t)a->C * zs_dtype_size(dst->dtype);
    const char *src = zs_data(c->in[1]);
    for (int64_t i = 0; i < a->m.n_out; i++)
        memcpy((char *)zs_data(dst) + (size_t)i * row,
               src + (size_t)meta[a->m.out + i] * row, row);
    return ZS_OK;
}

static zsi_cost gather_cost(const zsi_call *c, const zs_tensor *out)
{
    const zsi_gather_attrs *a = c->attrs;
    double b = (double)(a->m.n_out * a->C) * (double)zs_dtype_size(out->dtype);
    return (zsi_cost){0, b, b};
}

zsi_opdef zsi_def_gather_rows = {
    .op = {.name = "gather_rows"}, .arity = 3, .inplace = true,
    .infer = infer_gather, .cost = gather_cost, .attr_size = sizeof(zsi_gather_attrs),
    .kernel = {[ZS_CPU] = {[ZS_F32] = cpu_gather, [ZS_F64] = cpu_gather}},
};
