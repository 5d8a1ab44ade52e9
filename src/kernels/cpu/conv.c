/*
 * conv.c - 2-D convolution forward and backward as im2col + GEMM
 * (contracts and threading in conv.h).
 *
 * Per image n and group g, with K = Cg*KH*KW, P = OH*OW and a tile of
 * output rows [oh0, oh1) (tP = (oh1-oh0)*OW columns):
 *   forward   y_g[:, tile]  = w_g [Og, K] * col [K, tP]      (+ bias)
 *   weight    gw_g         += gy_g[:, tile] [Og, tP] * col^T
 *   input     gcol          = w_g^T [K, Og] * gy_g[:, tile]; col2im -> gx
 * col row r = (c*KH + kh)*KW + kw holds x[c, oh*sh - ph + kh*dh,
 * ow*sw - pw + kw*dw] (0 outside the image) for the tile's (oh, ow).
 * A 1x1 kernel with stride 1 and no padding on a contiguous x uses x itself
 * as the column matrix ("direct").
 * bf16 / f16 run the same tiles through the 16-bit GEMMs of gemm_lowp.h
 * (f32 accumulation) into f32 buffers rounded once (see "bf16 / f16").
 */
#include <string.h>

#include "kernels/cpu/conv.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/gemm_lowp.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/lowp.h"

/* Per-image GEMM FLOPs below which images are spread over the threads
 * (one serial GEMM each) instead of multithreading each GEMM. On 2 threads
 * a LeNet-like layer (0.5 MFLOP per image) runs 1.4x faster forward this
 * way; a ResNet-like one (58 MFLOP) runs equally fast either way. */
#define BATCH_PAR_FLOPS (64.0 * 1024 * 1024)
/* Column elements per im2col / col2im task when one image is split. */
#define COL_GRAIN 16384

typedef struct job {
    zs_dtype dt;
    size_t esz;
    const zsk_conv2d_shape *s;
    int64_t Cg, Og, K, P, rows; /* rows: output rows per tile */
    bool direct, par_inner;     /* par_inner: im2col/col2im may use pool */
    const char *x;
    int64_t xs[4];
    const char *w, *bias, *gy;
    char *y, *gx, *gw, *gb;
    char **col;   /* [nslices] column buffers (NULL when direct) */
    char **gwacc; /* [nslices] weight-gradient accumulators; [0] = gw
                   * (bf16/f16: f32 accumulators for every slice) */
    int64_t nslices;
    /* bf16 / f16 (lp): GEMMs accumulate into f32 buffers that are rounded
     * once: [nslices] scratch of the output tile [Og, tP] (forward) or
     * of the gradient columns [K, tP] and one group's gx [Cg, H, W] */
    bool lp;
    float **lpbuf;
} job;

/* One tile of im2col / col2im for an image and group. */
typedef struct tile {
    const job *j;
    const char *x; /* image + group base of x (strides j->xs[1..3]) */
    char *gx;      /* image + group base of gx, contiguous [Cg, H, W] */
    char *col;     /* [K, tP] */
    int64_t oh0, oh1;
} tile;

/* ow in [*lo, *hi) satisfy 0 <= ow*s + off < n, clamped to [0, out). */
static void valid_range(int64_t off, int64_t s, int64_t n, int64_t out,
                        int64_t *lo, int64_t *hi)
{
    int64_t l = off >= 0 ? 0 : (-off + s - 1) / s;
    int64_t h = off > n - 1 ? 0 : (n - 1 - off) / s + 1;
    h = h < out ? h : out;
    *lo = l < h ? l : h;
    *hi = h;
}

#define DEFINE_IM2COL(T, SUF)                                                 \
    /* Column rows [r0, r1) of the tile. */                                   \
    static void im2col_##SUF(void *ctx, int64_t r0, int64_t r1)               \
    {                                                                         \
        const tile *t = ctx;                                                  \
        const zsk_conv2d_shape *s = t->j->s;                                  \
        const T *x = (const T *)t->x;                                         \
        int64_t xc = t->j->xs[1], xh = t->j->xs[2], xw = t->j->xs[3];         \
        int64_t OW = s->OW, tP = (t->oh1 - t->oh0) * OW;                      \
        for (int64_t r = r0; r < r1; r++) {                                   \
            int64_t c = r / (s->KH * s->KW), kh = r / s->KW % s->KH;          \
            int64_t iw0 = r % s->KW * s->dw - s->pw, lo, hi;                  \
            valid_range(iw0, s->sw, s->W, OW, &lo, &hi);                      \
            T *d = (T *)t->col + r * tP;                                      \
            for (int64_t oh = t->oh0; oh < t->oh1; oh++, d += OW) {           \
                int64_t ih = oh * s->sh - s->ph + kh * s->dh;                 \
                if (ih < 0 || ih >= s->H) {                                   \
                    memset(d, 0, (size_t)OW * sizeof(T));                     \
                    continue;                                                 \
                }                                                             \
                const T *src = x + c * xc + ih * xh;                          \
                memset(d, 0, (size_t)lo * sizeof(T));                         \
                if (s->sw == 1 && xw == 1)                                    \
                    memcpy(d + lo, src + lo + iw0, (size_t)(hi - lo) * sizeof(T)); \
                else                                                          \
                    for (int64_t ow = lo; ow < hi; ow++)                      \
                        d[ow] = src[(ow * s->sw + iw0) * xw];                 \
                memset(d + hi, 0, (size_t)(OW - hi) * sizeof(T));             \
            }                                                                 \
        }                                                                     \
    }

#define DEFINE_COLS(T, SUF)                                                   \
    DEFINE_IM2COL(T, SUF)                                                     \
    /* Adds the tile's column rows of channels [c0, c1) into gx. */          \
    static void col2im_##SUF(void *ctx, int64_t c0, int64_t c1)               \
    {                                                                         \
        const tile *t = ctx;                                                  \
        const zsk_conv2d_shape *s = t->j->s;                                  \
        int64_t OW = s->OW, tP = (t->oh1 - t->oh0) * OW;                      \
        for (int64_t c = c0; c < c1; c++)                                     \
            for (int64_t kh = 0; kh < s->KH; kh++)                            \
                for (int64_t kw = 0; kw < s->KW; kw++) {                      \
                    int64_t r = (c * s->KH + kh) * s->KW + kw;                \
                    int64_t iw0 = kw * s->dw - s->pw, lo, hi;                 \
                    valid_range(iw0, s->sw, s->W, OW, &lo, &hi);              \
                    const T *src = (const T *)t->col + r * tP;                \
                    for (int64_t oh = t->oh0; oh < t->oh1; oh++, src += OW) { \
                        int64_t ih = oh * s->sh - s->ph + kh * s->dh;         \
                        if (ih < 0 || ih >= s->H)                             \
                            continue;                                         \
                        T *g = (T *)t->gx + (c * s->H + ih) * s->W;           \
                        for (int64_t ow = lo; ow < hi; ow++)                  \
                            g[ow * s->sw + iw0] += src[ow];                   \
                    }                                                         \
                }                                                             \
    }

DEFINE_COLS(float, f32)
DEFINE_COLS(double, f64)
/* bf16 / f16 columns are copies of the 16-bit patterns (+0 outside the
 * image); their col2im runs on f32 gradient columns (col2im_f32). */
DEFINE_IM2COL(uint16_t, u16)

static void gemm(const job *j, bool ta, bool tb, int64_t M, int64_t N,
                 int64_t K, const void *A, int64_t lda, const void *B,
                 int64_t ldb, double beta, void *C, int64_t ldc)
{
    if (j->dt == ZS_F32)
        zsk_sgemm(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, (float)beta, C, ldc);
    else
        zsk_dgemm(ta, tb, M, N, K, 1.0, A, lda, B, ldb, beta, C, ldc);
}

static void run(const job *j, int64_t n, int64_t grain, zs_range_fn fn,
                void *ctx)
{
    if (j->par_inner)
        zs_parallel_for(n, grain, fn, ctx);
    else
        fn(ctx, 0, n);
}

/* Fills the tile's column buffer; returns the column matrix and its row
 * stride (x itself when direct). */
static const char *columns(const job *j, const char *xg, int64_t oh0,
                           int64_t oh1, char *col, int64_t *ld)
{
    if (j->direct) {
        *ld = j->P;
        return xg + (size_t)(oh0 * j->s->OW) * j->esz;
    }
    tile t = {j, xg, NULL, col, oh0, oh1};
    int64_t tP = (oh1 - oh0) * j->s->OW;
    run(j, j->K, 1 + COL_GRAIN / tP,
        j->esz == 4 ? im2col_f32 : j->esz == 8 ? im2col_f64 : im2col_u16, &t);
    *ld = tP;
    return col;
}

static const char *x_image(const job *j, int64_t n, int64_t g)
{
    return j->x + (size_t)(n * j->xs[0] + g * j->Cg * j->xs[1]) * j->esz;
}

static void fill_bias(const job *j, char *yt, const char *b, int64_t tP)
{
    for (int64_t o = 0; o < j->Og; o++) {
        char *row = yt + (size_t)(o * j->P) * j->esz;
        if (j->dt == ZS_F32)
            for (int64_t i = 0; i < tP; i++)
                ((float *)row)[i] = ((const float *)b)[o];
        else
            for (int64_t i = 0; i < tP; i++)
                ((double *)row)[i] = ((const double *)b)[o];
    }
}

static void forward_image(const job *j, int64_t n, char *col)
{
    const zsk_conv2d_shape *s = j->s;
    size_t e = j->esz;
    for (int64_t g = 0; g < s->G; g++) {
        const char *wg = j->w + (size_t)(g * j->Og * j->K) * e;
        char *yg = j->y + (size_t)((n * s->O + g * j->Og) * j->P) * e;
        for (int64_t oh0 = 0; oh0 < s->OH; oh0 += j->rows) {
            int64_t oh1 = oh0 + j->rows < s->OH ? oh0 + j->rows : s->OH;
            int64_t tP = (oh1 - oh0) * s->OW, ldb;
            const char *B = columns(j, x_image(j, n, g), oh0, oh1, col, &ldb);
            char *yt = yg + (size_t)(oh0 * s->OW) * e;
            if (j->bias)
                fill_bias(j, yt, j->bias + (size_t)(g * j->Og) * e, tP);
            gemm(j, false, false, j->Og, tP, j->K, wg, j->K, B, ldb,
                 j->bias ? 1.0 : 0.0, yt, j->P);
        }
    }
}

/* Weight and input gradients of image n; gw accumulates (beta 0 when
 * first), gx of the image is overwritten. */
static void backward_image(const job *j, int64_t n, char *col, char *gw,
                           bool first)
{
    const zsk_conv2d_shape *s = j->s;
    size_t e = j->esz;
    int64_t HW = s->H * s->W;
    if (j->gx && !j->direct)
        memset(j->gx + (size_t)(n * s->C * HW) * e, 0, (size_t)(s->C * HW) * e);
    for (int64_t g = 0; g < s->G; g++) {
        const char *wg = j->w ? j->w + (size_t)(g * j->Og * j->K) * e : NULL;
        const char *gyg = j->gy + (size_t)((n * s->O + g * j->Og) * j->P) * e;
        char *gxg = j->gx ? j->gx + (size_t)((n * s->C + g * j->Cg) * HW) * e
                          : NULL;
        for (int64_t oh0 = 0; oh0 < s->OH; oh0 += j->rows) {
            int64_t oh1 = oh0 + j->rows < s->OH ? oh0 + j->rows : s->OH;
            int64_t tP = (oh1 - oh0) * s->OW, ldb;
            const char *gyt = gyg + (size_t)(oh0 * s->OW) * e;
            if (gw) {
                const char *B = columns(j, x_image(j, n, g), oh0, oh1, col, &ldb);
                gemm(j, false, true, j->Og, j->K, tP, gyt, j->P, B, ldb,
                     first && oh0 == 0 ? 0.0 : 1.0,
                     gw + (size_t)(g * j->Og * j->K) * e, j->K);
            }
            if (!gxg)
                continue;
            if (j->direct) {
                gemm(j, true, false, j->Cg, tP, j->Og, wg, j->K, gyt, j->P, 0.0,
                     gxg + (size_t)(oh0 * s->OW) * e, j->P);
                continue;
            }
            gemm(j, true, false, j->K, tP, j->Og, wg, j->K, gyt, j->P, 0.0,
                 col, tP);
            tile t = {j, NULL, gxg, col, oh0, oh1};
            run(j, j->Cg, 1 + COL_GRAIN / (tP * s->KH * s->KW),
                j->dt == ZS_F32 ? col2im_f32 : col2im_f64, &t);
        }
    }
}


/* ---- bf16 / f16 ---------------------------------------------------------
 * The same tiles through the 16-bit GEMMs (gemm_lowp.h: f32 accumulation,
 * f32 results): columns are 16-bit copies, every GEMM writes an f32
 * buffer, and results are rounded once (y per tile, gx per image and
 * group, gw after the slices are summed in f32). */

static void gemm16(const job *j, bool ta, bool tb, int64_t M, int64_t N,
                   int64_t K, const void *A, int64_t lda, const void *B,
                   int64_t ldb, float beta, float *C, int64_t ldc)
{
    (j->dt == ZS_BF16 ? zsk_gemm_bf16 : zsk_gemm_f16)(ta, tb, M, N, K, 1.0f, A,
                                                      lda, B, ldb, beta, C, ldc);
}

static void forward_image_lp(const job *j, int64_t n, char *col, float *yb)
{
    const zsk_conv2d_shape *s = j->s;
    const uint16_t *bias = (const uint16_t *)j->bias;
    for (int64_t g = 0; g < s->G; g++) {
        const uint16_t *wg = (const uint16_t *)j->w + g * j->Og * j->K;
        uint16_t *yg = (uint16_t *)j->y + (n * s->O + g * j->Og) * j->P;
        for (int64_t oh0 = 0; oh0 < s->OH; oh0 += j->rows) {
            int64_t oh1 = oh0 + j->rows < s->OH ? oh0 + j->rows : s->OH;
            int64_t tP = (oh1 - oh0) * s->OW, ldb;
            const char *B = columns(j, x_image(j, n, g), oh0, oh1, col, &ldb);
            for (int64_t o = 0; bias && o < j->Og; o++) {
                float b = zsk_ld16(j->dt, bias[g * j->Og + o]);
                for (int64_t i = 0; i < tP; i++)
                    yb[o * tP + i] = b;
            }
            gemm16(j, false, false, j->Og, tP, j->K, wg, j->K, B, ldb,
                   bias ? 1.0f : 0.0f, yb, tP);
            for (int64_t o = 0; o < j->Og; o++)
                zsk_narrow16(j->dt, yb + o * tP, yg + o * j->P + oh0 * s->OW, tP);
        }
    }
}

/* Weight (f32 accumulator gw, beta 0 when first) and input gradients of
 * image n; buf: the gradient columns [K, rows*OW], then gx of one group
 * [Cg, H, W]. */
static void backward_image_lp(const job *j, int64_t n, char *col, float *gw,
                              bool first, float *buf)
{
    const zsk_conv2d_shape *s = j->s;
    int64_t HW = s->H * s->W;
    float *gcol = buf, *gxf = buf ? buf + j->rows * s->OW * j->K : NULL;
    for (int64_t g = 0; g < s->G; g++) {
        const uint16_t *wg = j->w ? (const uint16_t *)j->w + g * j->Og * j->K
                                  : NULL;
        const uint16_t *gyg = (const uint16_t *)j->gy + (n * s->O + g * j->Og) * j->P;
        if (j->gx)
            memset(gxf, 0, (size_t)(j->Cg * HW) * sizeof(float));
        for (int64_t oh0 = 0; oh0 < s->OH; oh0 += j->rows) {
            int64_t oh1 = oh0 + j->rows < s->OH ? oh0 + j->rows : s->OH;
            int64_t tP = (oh1 - oh0) * s->OW, ldb;
            const uint16_t *gyt = gyg + oh0 * s->OW;
            if (gw) {
                const char *B = columns(j, x_image(j, n, g), oh0, oh1, col, &ldb);
                gemm16(j, false, true, j->Og, j->K, tP, gyt, j->P, B, ldb,
                       first && oh0 == 0 ? 0.0f : 1.0f, gw + g * j->Og * j->K,
                       j->K);
            }
            if (!j->gx)
                continue;
            if (j->direct) {
                gemm16(j, true, false, j->Cg, tP, j->Og, wg, j->K, gyt, j->P,
                       0.0f, gxf + oh0 * s->OW, j->P);
                continue;
            }
            gemm16(j, true, false, j->K, tP, j->Og, wg, j->K, gyt, j->P, 0.0f,
                   gcol, tP);
            tile t = {j, NULL, (char *)gxf, (char *)gcol, oh0, oh1};
            run(j, j->Cg, 1 + COL_GRAIN / (tP * s->KH * s->KW), col2im_f32, &t);
        }
        if (j->gx)
            zsk_narrow16(j->dt, gxf,
                         (uint16_t *)j->gx + (n * s->C + g * j->Cg) * HW,
                         j->Cg * HW);
    }
}

static void slice_range(const job *j, int64_t t, int64_t *n0, int64_t *n1)
{
    *n0 = j->s->N * t / j->nslices;
    *n1 = j->s->N * (t + 1) / j->nslices;
}

static void forward_slices(void *ctx, int64_t b, int64_t e)
{
    const job *j = ctx;
    for (int64_t t = b; t < e; t++) {
        int64_t n0, n1;
        slice_range(j, t, &n0, &n1);
        for (int64_t n = n0; n < n1; n++)
            if (j->lp)
                forward_image_lp(j, n, j->col ? j->col[t] : NULL, j->lpbuf[t]);
            else
                forward_image(j, n, j->col ? j->col[t] : NULL);
    }
}

static void backward_slices(void *ctx, int64_t b, int64_t e)
{
    const job *j = ctx;
    for (int64_t t = b; t < e; t++) {
        int64_t n0, n1;
        slice_range(j, t, &n0, &n1);
        for (int64_t n = n0; n < n1; n++)
            if (j->lp)
                backward_image_lp(j, n, j->col ? j->col[t] : NULL,
                                  (float *)j->gwacc[t], n == n0, j->lpbuf[t]);
            else
                backward_image(j, n, j->col ? j->col[t] : NULL,
                               j->gwacc ? j->gwacc[t] : NULL, n == n0);
    }
}

/* Chooses the threading mode and tile size, allocates the buffers (column
 * buffers unless direct; weight-gradient accumulators for slices > 0 when
 * need_gwacc). On failure the job is still safe to job_deinit. */
static zs_status job_init(job *j, zs_dtype dt, const zsk_conv2d_shape *s,
                          const void *x, const int64_t *xs, bool need_gwacc,
                          bool lp_scratch)
{
    memset(j, 0, sizeof *j);
    j->dt = dt;
    j->lp = zsk_is_lowp16(dt);
    j->esz = dt == ZS_F32 ? 4 : dt == ZS_F64 ? 8 : 2;
    j->s = s;
    j->Cg = s->C / s->G;
    j->Og = s->O / s->G;
    j->K = j->Cg * s->KH * s->KW;
    j->P = s->OH * s->OW;
    j->x = x;
    if (xs)
        memcpy(j->xs, xs, sizeof j->xs);
    j->direct = s->KH == 1 && s->KW == 1 && s->sh == 1 && s->sw == 1 &&
                s->ph == 0 && s->pw == 0 && xs && xs[3] == 1 &&
                xs[2] == s->W && xs[1] == s->H * s->W;
    /* bf16/f16: the f32 gradient columns are the larger buffer */
    int64_t row_bytes = j->K * s->OW * (int64_t)(j->lp ? 4 : j->esz);
    j->rows = ZSK_CONV_COL_BYTES / (row_bytes > 0 ? row_bytes : 1);
    j->rows = j->rows < 1 ? 1 : j->rows > s->OH ? s->OH : j->rows;
    int T = zs_num_threads();
    double flops = 2.0 * (double)s->O * (double)j->K * (double)j->P;
    bool batch = T > 1 && s->N > 1 && flops < BATCH_PAR_FLOPS;
    j->nslices = batch ? (s->N < T ? s->N : T) : 1;
    j->par_inner = !batch;
    size_t ns = (size_t)j->nslices;
    size_t col_bytes = j->direct ? 0 : (size_t)(j->rows * s->OW * j->K) * j->esz;
    size_t gw_bytes = need_gwacc ? (size_t)(s->O * j->K) * (j->lp ? 4 : j->esz)
                                 : 0;
    size_t t0 = j->lp ? 0 : 1; /* first slice with its own accumulator */
    if ((j->col = zs_alloc(ns * sizeof *j->col)))
        memset(j->col, 0, ns * sizeof *j->col);
    if ((j->gwacc = zs_alloc(ns * sizeof *j->gwacc)))
        memset(j->gwacc, 0, ns * sizeof *j->gwacc);
    if (j->lp && (j->lpbuf = zs_alloc(ns * sizeof *j->lpbuf)))
        memset(j->lpbuf, 0, ns * sizeof *j->lpbuf);
    if (!j->col || !j->gwacc || (j->lp && !j->lpbuf))
        return ZS_ERR_NOMEM;
    size_t tile = (size_t)(j->rows * s->OW);
    size_t lp_bytes = !j->lp ? 0 : lp_scratch ? (tile * (size_t)j->K +
                                                 (size_t)(j->Cg * s->H * s->W)) * 4
                                              : tile * (size_t)j->Og * 4;
    for (size_t t = 0; t < ns; t++) {
        j->col[t] = col_bytes ? zs_alloc(col_bytes) : NULL;
        j->gwacc[t] = gw_bytes && t >= t0 ? zs_alloc(gw_bytes) : NULL;
        if ((col_bytes && !j->col[t]) || (gw_bytes && t >= t0 && !j->gwacc[t]))
            return ZS_ERR_NOMEM;
        if (lp_bytes && !(j->lpbuf[t] = zs_alloc(lp_bytes)))
            return ZS_ERR_NOMEM;
    }
    return ZS_OK;
}

static void job_deinit(job *j)
{
    for (int64_t t = 0; t < j->nslices; t++) {
        if (j->col)
            zs_free(j->col[t]);
        if (j->gwacc && (t > 0 || j->lp))
            zs_free(j->gwacc[t]);
        if (j->lpbuf)
            zs_free(j->lpbuf[t]);
    }
    zs_free(j->col);
    zs_free(j->gwacc);
    zs_free(j->lpbuf);
}

enum { ROUTE_GEMM, ROUTE_AVX512, ROUTE_AVX2 };
enum { FOR_Y, FOR_GX, FOR_GW };

/* Which path computes the output (FOR_Y), the input gradient or the
 * weight gradient.
 * AVX-512: its direct path puts the output channels (the input channels
 * for gx) on its 16 or 32 lanes; it takes y and gw when it applies and
 * there are more than 8 output channels (or the AVX2 path cannot take
 * them), gx when there are at least 16 input channels. With fewer, most
 * lanes idle, and the AVX2 direct path (lanes along output rows) or, for
 * gx, the GEMM path is faster. Measured on 2 threads of the (loaded)
 * AVX-512 dev box, LeNet: the 6-channel layer's forward 0.44 -> 0.18 ms
 * and weight gradient 0.64 -> 0.18 ms, the second layer's input gradient
 * (6 channels) 0.86 ms by GEMM -> 0.35 ms; with 16 output channels the
 * AVX-512 weight gradient stays faster (0.34 vs 0.52 ms).
 * AVX2: its direct path takes every forward it applies to, and the
 * gradients of layers of at most 32 input and 32 output channels: with
 * 64 and 64 (3x3, 28x28) the GEMM path's gradients were faster (gx 9.6
 * vs 13.4 ms, gw 15.9 vs 25.0), with 32 and 32 (3x3, 14x14) slower (gx
 * 4.1 vs 1.5, gw 8.2 vs 3.0), the forward faster or equal in both; same
 * box under ZS_CPU_ISA=avx2. */
static int route_of(zs_dtype dt, const zsk_conv2d_shape *s, int what)
{
    bool avx2 = zsk_conv_direct_avx2_ok(dt, s);
    if (zsk_conv_direct_ok(dt, s) &&
        (what == FOR_GX ? s->C >= 16 : !(avx2 && s->O <= 8)))
        return ROUTE_AVX512;
    if (what != FOR_Y && (s->C > 32 || s->O > 32))
        return ROUTE_GEMM;
    if (what == FOR_GX && !zsk_conv_direct_avx2_gx_ok(s))
        return ROUTE_GEMM;
    return avx2 ? ROUTE_AVX2 : ROUTE_GEMM;
}

zs_status zsk_conv2d_forward(zs_dtype dt, const zsk_conv2d_shape *s,
                             const void *x, const int64_t *xs, const void *w,
                             const void *bias, void *y)
{
    int route = route_of(dt, s, FOR_Y);
    if (route == ROUTE_AVX512)
        return zsk_conv2d_direct_forward(s, x, xs, w, bias, y);
    if (route == ROUTE_AVX2)
        return zsk_conv2d_direct_avx2_forward(s, x, xs, w, bias, y);
    job j;
    zs_status st = job_init(&j, dt, s, x, xs, false, false);
    if (st == ZS_OK) {
        j.w = w;
        j.bias = bias;
        j.y = y;
        if (j.nslices > 1)
            zs_parallel_for(j.nslices, 1, forward_slices, &j);
        else
            forward_slices(&j, 0, 1);
    }
    job_deinit(&j);
    return st;
}

/* gb[o] = sum over n, p of gy[n, o, p], accumulated in double. */
typedef struct bias_ctx {
    zs_dtype dt;
    const void *gy;
    void *gb;
    int64_t N, O, P;
} bias_ctx;

/* Sum of n floats in 16 interleaved partial sums (one vector register;
 * a single running sum kept the loop scalar: 2% of a ResNet backward). */
static ZSK_ISA_FN(double, sum_f32, (const float *g, int64_t n), (g, n))
{
    float lane[16] = {0};
    int64_t p = 0;
    for (; p + 16 <= n; p += 16)
        for (int l = 0; l < 16; l++)
            lane[l] += g[p + l];
    double s = 0;
    for (; p < n; p++)
        s += g[p];
    for (int l = 0; l < 16; l++)
        s += lane[l];
    return s;
}

static void bias_grad(void *ctx, int64_t o0, int64_t o1)
{
    const bias_ctx *c = ctx;
    for (int64_t o = o0; o < o1; o++) {
        double acc = 0;
        for (int64_t n = 0; n < c->N; n++) {
            int64_t base = (n * c->O + o) * c->P;
            if (c->dt == ZS_F32) {
                acc += sum_f32((const float *)c->gy + base, c->P);
            } else if (zsk_is_lowp16(c->dt)) {
                float buf[512];
                for (int64_t p = 0; p < c->P; p += 512) {
                    int64_t m = c->P - p < 512 ? c->P - p : 512;
                    zsk_widen16(c->dt, (const uint16_t *)c->gy + base + p, buf, m);
                    acc += sum_f32(buf, m);
                }
            } else {
                const double *g = (const double *)c->gy + base;
                for (int64_t p = 0; p < c->P; p++)
                    acc += g[p];
            }
        }
        if (c->dt == ZS_F32)
            ((float *)c->gb)[o] = (float)acc;
        else if (zsk_is_lowp16(c->dt))
            ((uint16_t *)c->gb)[o] = zsk_st16(c->dt, (float)acc);
        else
            ((double *)c->gb)[o] = acc;
    }
}

/* gw = sum of the slices' accumulators, in slice order (bf16/f16: in f32,
 * then rounded once). */
static void reduce_gw(const job *j)
{
    int64_t n = j->s->O * j->K;
    for (int64_t t = 1; t < j->nslices; t++) {
        if (j->dt == ZS_F32 || j->lp) { /* f32: gwacc[0] is gw */
            float *d = (float *)j->gwacc[0];
            const float *a = (const float *)j->gwacc[t];
            for (int64_t i = 0; i < n; i++)
                d[i] += a[i];
        } else {
            double *d = (double *)j->gw;
            const double *a = (const double *)j->gwacc[t];
            for (int64_t i = 0; i < n; i++)
                d[i] += a[i];
        }
    }
}

zs_status zsk_conv2d_backward(zs_dtype dt, const zsk_conv2d_shape *s,
                              const void *x, const int64_t *xs, const void *w,
                              const void *gy, void *gx, void *gw, void *gb)
{
    if (gb) {
        bias_ctx bc = {dt, gy, gb, s->N, s->O, s->OH * s->OW};
        zs_parallel_for(s->O, 1 + ZSK_GRAIN / (s->N * s->OH * s->OW + 1),
                        bias_grad, &bc);
    }
    if (!gx && !gw)
        return ZS_OK;
    if (s->N == 0) {
        if (gw)
            memset(gw, 0, (size_t)(s->O * (s->C / s->G) * s->KH * s->KW) *
                              zs_dtype_size(dt));
        return ZS_OK;
    }
    int rx = gx ? route_of(dt, s, FOR_GX) : ROUTE_GEMM;
    int rw = gw ? route_of(dt, s, FOR_GW) : ROUTE_GEMM;
    for (int r = ROUTE_AVX512; r <= ROUTE_AVX2; r++) {
        if (rx != r && rw != r)
            continue;
        float *dx = rx == r ? gx : NULL, *dw = rw == r ? gw : NULL;
        zs_status st = r == ROUTE_AVX512
                           ? zsk_conv2d_direct_backward(s, x, xs, w, gy, dx, dw)
                           : zsk_conv2d_direct_avx2_backward(s, x, xs, w, gy, dx, dw);
        if (st != ZS_OK)
            return st;
    }
    gx = rx == ROUTE_GEMM ? gx : NULL;
    gw = rw == ROUTE_GEMM ? gw : NULL;
    if (!gx && !gw)
        return ZS_OK;
    job j;
    zs_status st = job_init(&j, dt, s, x, xs, gw != NULL, gx != NULL);
    if (st == ZS_OK) {
        j.w = w;
        j.gy = gy;
        j.gx = gx;
        j.gw = gw;
        if (gw && !j.lp)
            j.gwacc[0] = gw;
        if (j.nslices > 1)
            zs_parallel_for(j.nslices, 1, backward_slices, &j);
        else
            backward_slices(&j, 0, 1);
        if (gw)
            reduce_gw(&j);
        if (gw && j.lp)
            zsk_narrow16(dt, (const float *)j.gwacc[0], gw, s->O * j.K);
    }
    job_deinit(&j);
    return st;
}
