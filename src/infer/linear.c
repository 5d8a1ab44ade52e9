/*
 * linear.c - one linear layer of the inference model in each weight format
 * (infer/internal.h): building it from float weights, running it on a
 * batch of rows, freeing it.
 *
 * Batch invariance holds in every format: the f32 kernel accumulates each
 * output in one fma chain over k, the f64 loop likewise, the block formats
 * (qpacked.h) and int8 quantize activations per row and sum blocks in a
 * fixed order.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "infer/internal.h"

static zs_status oom(void)
{
    return zs_set_error_code(ZS_ERR_NOMEM, "llm: out of memory");
}

zsk_qfmt zsi_qfmt(zsi_wfmt f)
{
    return f == ZSI_W_Q8_0 ? ZSK_Q8_0 : f == ZSI_W_Q4_0 ? ZSK_Q4_0 : ZSK_Q4_1;
}

static bool is_q(zsi_wfmt f)
{
    return f == ZSI_W_Q8_0 || f == ZSI_W_Q4_0 || f == ZSI_W_Q4_1;
}

/* W as n floats (converted from src_dt when it is f64), malloc'd. */
static float *as_f32(const void *W, zs_dtype src_dt, int64_t n)
{
    float *f = malloc((size_t)n * sizeof *f);
    if (f && src_dt == ZS_F64)
        for (int64_t i = 0; i < n; i++)
            f[i] = (float)((const double *)W)[i];
    else if (f)
        memcpy(f, W, (size_t)n * sizeof *f);
    return f;
}

static zs_status build_weights(zsi_linear *l, const float *w)
{
    int64_t N = l->N, K = l->K;
    if (l->fmt == ZSI_W_F32) {
        l->w_bytes = N * K * 4;
        return zsk_pack_f32(w, N, K, &l->packed);
    }
    if (is_q(l->fmt)) {
        void *blocks = malloc((size_t)(N * K / ZSK_QBLOCK * zsk_qblock_bytes(zsi_qfmt(l->fmt))));
        if (!blocks)
            return oom();
        zs_status s = zsk_quantize(zsi_qfmt(l->fmt), w, N * K, blocks);
        if (s == ZS_OK)
            s = zsi_linear_tiles(l, blocks);
        free(blocks);
        return s;
    }
    l->w_bytes = N * K;
    l->w = malloc((size_t)(N * K));
    l->scale = malloc((size_t)N * sizeof *l->scale);
    if (!l->w || !l->scale)
        return oom();
    return zsk_quantize_rows_i8(w, N, K, l->w, l->scale);
}

zs_status zsi_linear_build(zsi_linear *l, zsi_wfmt fmt, zs_dtype src_dt, const void *W,
                           int64_t N, int64_t K, const void *bias, zs_dtype dt)
{
    *l = (zsi_linear){.fmt = fmt, .N = N, .K = K};
    if (is_q(fmt) && K % ZSK_QBLOCK != 0)
        return zs_set_error("llm: a %lld x %lld weight cannot be quantized in blocks "
                            "of %d (the width must be a multiple of %d)",
                            (long long)N, (long long)K, ZSK_QBLOCK, ZSK_QBLOCK);
    zs_status s = ZS_OK;
    if (bias) {
        size_t nb = (size_t)N * zs_dtype_size(dt);
        if (!(l->bias = malloc(nb)))
            return oom();
        memcpy(l->bias, bias, nb);
    }
    if (fmt == ZSI_W_F64) {
        l->w_bytes = N * K * 8;
        if (!(l->w = malloc((size_t)l->w_bytes)))
            return oom();
        memcpy(l->w, W, (size_t)l->w_bytes);
        return ZS_OK;
    }
    float *w = as_f32(W, src_dt, N * K);
    s = w ? build_weights(l, w) : oom();
    free(w);
    return s;
}

zs_status zsi_linear_tiles(zsi_linear *l, const void *blocks)
{
    zs_status s = zsk_qpack(zsi_qfmt(l->fmt), blocks, l->N, l->K, &l->tiles);
    l->w_bytes = zsk_qpacked_bytes(&l->tiles);
    return s;
}

void zsi_linear_free(zsi_linear *l)
{
    if (l->in_arena) /* the layer's arena holds them */
        l->packed.data = NULL, l->tiles.data = NULL, l->w = NULL;
    zsk_packed_free(&l->packed);
    zsk_qpacked_free(&l->tiles);
    free(l->w);
    free(l->scale);
    free(l->smooth);
    free(l->bias);
    *l = (zsi_linear){0};
}

int64_t zsi_linear_bytes(const zsi_linear *l)
{
    return l->w_bytes + (l->scale ? l->N * 4 : 0);
}

/* ---- a layer's weights in one block -------------------------------------- */

/* Why: at batch 1 every token streams all weights from memory, a layer's
 * four matrices one after the other. Separately allocated, a quantized
 * layer's matrices (0.6-2.5 MB for GPT-2 in Q8_0) sit below zs_alloc's
 * huge-page threshold, so every 4 KiB of the stream is a TLB miss and a
 * page walk; gathered in one block (7.5 MB) they lie on 2 MiB pages.
 * Measured on GPT-2 (bench/infer's decode, both layouts interleaved in one
 * process, two runs): Q8_0 197.5 -> 206.7 and 216.4 -> 224.3 tok/s, Q4_0
 * 304.3 -> 323.0 and 333.4 -> 341.4 (+2-6%). Peak memory while gathering:
 * the model plus one layer. */

/* l's weight data (the pointer of its format) and where it came from. */
static void *weight_data(const zsi_linear *l, bool *zs_owned)
{
    *zs_owned = l->fmt == ZSI_W_F32 || is_q(l->fmt);
    return l->fmt == ZSI_W_F32 ? (void *)l->packed.data
           : is_q(l->fmt)      ? (void *)l->tiles.data
                               : l->w;
}

static void set_weight_data(zsi_linear *l, void *p)
{
    if (l->fmt == ZSI_W_F32)
        l->packed.data = p;
    else if (is_q(l->fmt))
        l->tiles.data = p;
    else
        l->w = p;
}

/* Bytes of l's weight data: F32 panels are padded to 64 columns. */
static size_t weight_bytes(const zsi_linear *l)
{
    if (l->fmt == ZSI_W_F32)
        return (size_t)(l->packed.panels * l->K) * ZSK_PANEL * sizeof(float);
    return (size_t)l->w_bytes;
}

static size_t round64(size_t n) { return (n + 63) / 64 * 64; }

zs_status zsi_layer_gather(zsi_layer *y)
{
    zsi_linear *ls[4] = {&y->qkv, &y->proj, &y->fc, &y->fc2}; /* forward order */
    size_t total = 0;
    for (int i = 0; i < 4; i++)
        total += round64(weight_bytes(ls[i]));
    char *a = zs_alloc(total ? total : 1);
    if (!a)
        return oom();
    zs_advise_huge(a, total); /* zs_alloc advises from 4 MiB on */
    size_t off = 0;
    for (int i = 0; i < 4; i++) {
        bool zs_owned;
        void *old = weight_data(ls[i], &zs_owned);
        if (old)
            memcpy(a + off, old, weight_bytes(ls[i]));
        if (zs_owned)
            zs_free(old);
        else
            free(old);
        set_weight_data(ls[i], old ? a + off : NULL);
        ls[i]->in_arena = true;
        off += round64(weight_bytes(ls[i]));
    }
    y->arena = a;
    return ZS_OK;
}

/* GPT-2's tanh GeLU of one value. */
static double gelu(double x)
{
    return 0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
}

typedef struct f64_job {
    const zsi_linear *l;
    const double *x, *r;
    double *y;
    int64_t M, ldx, ldr, ldy;
    zsk_act act;
} f64_job;

/* Outputs [n0, n1) of every row: the dot in increasing k. */
static void f64_cols(void *ctx, int64_t n0, int64_t n1)
{
    const f64_job *j = ctx;
    const double *W = j->l->w, *b = j->l->bias;
    int64_t K = j->l->K;
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

zs_status zsi_linear_run(const zsi_linear *l, zs_dtype dt, const void *x, int64_t M,
                         int64_t ldx, const void *residual, int64_t ldr, zsk_act act,
                         void *y, int64_t ldy)
{
    if (M == 0)
        return ZS_OK;
    if (dt == ZS_F64) {
        f64_job j = {l, x, residual, y, M, ldx, ldr, ldy, act};
        zs_parallel_for(l->N, 1 + 16384 / (l->K * M + 1), f64_cols, &j);
        return ZS_OK;
    }
    switch (l->fmt) {
    case ZSI_W_F32:
        return zsk_packed_linear_f32(&l->packed, x, M, ldx, l->bias, residual, ldr, act,
                                     y, ldy);
    case ZSI_W_I8: {
        zsk_i8_opts o = {l->smooth, l->threshold};
        return zsk_i8_linear(l->w, l->scale, l->N, l->K, x, M, ldx, &o, l->bias,
                             residual, ldr, act, y, ldy);
    }
    default:
        return zsk_qpacked_linear(&l->tiles, x, M, ldx, l->bias, residual, ldr, act, y, ldy);
    }
}
