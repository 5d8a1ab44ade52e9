/*
 * conv_direct_avx2.c - f32 conv2d of stride 1 on AVX2 + FMA, read straight
 * from zero-padded copies of the images, without a column matrix
 * (contracts in conv.h; the AVX-512 direct path is conv_direct.c).
 *
 * Why: on a CPU without AVX-512 small convolutions such as LeNet's (1 -> 6
 * and 6 -> 16 channels, 5x5) went through im2col + the AVX2 GEMM, whose
 * 6x16 tiles idle on a K of 25 or 150 and whose column matrix is rewritten
 * per image: 13 GFLOP/s forward, 11 backward on 2 threads.
 *
 * Lanes run along an output row (NCHW keeps it contiguous), so narrow
 * channel counts waste nothing and results are stored without a
 * transpose:
 *
 *   forward  tile = MR = 6 output channels x 16 pixels of one output row
 *            (12 ymm accumulators); depth (c, kh, kw): two vector loads
 *            xp[c, oh + kh*dh, ow0 + kw*dw + 0..15] of the padded input,
 *            6 broadcasts of the packed w[o0 .. o0+5, c, kh, kw]. A row
 *            shorter than 16 uses 8 lanes or masked stores.
 *   input    gx is the forward convolution of gy padded by (K-1)*d - p,
 *   grad     with input and output channels swapped and the taps
 *            reversed (stride 1 only; p <= (K-1)*d, else the GEMM path).
 *   weight   tile = GO = 3 output channels x GT = 4 taps (c, kh, kw) (12
 *   grad     accumulators of 8 pixel lanes); depth = every output pixel of
 *            the batch, row by row: 3 vector loads of gy, 4 of the padded
 *            x at the taps' offsets, the row's tail by masked loads (so
 *            a lane past the row never multiplies anything); the 8 lanes
 *            are summed once at the end.
 *
 * Blocking: chosen for LeNet's shapes (6 and 16 output channels, 28- and
 * 10-pixel rows); 6 x 16 is the largest tile 16 ymm registers hold with
 * its two input vectors and a broadcast.
 *
 * Threading: tiles over the pool; each tile's sums run in a fixed order,
 * so results do not depend on the thread count.
 */
#include <immintrin.h>
#include <string.h>

#include "kernels/cpu/conv.h"
#include "kernels/cpu/kernels.h"

#define TGT __attribute__((target("avx2,fma")))
#define MR 6     /* output channels of a forward tile */
#define NW 16    /* pixels of a forward tile: two ymm */
#define GO 3     /* output channels of a weight-gradient tile */
#define GT 4     /* taps of a weight-gradient tile */
#define SLACK 32 /* zero floats after a padded copy: a forward tile's 16
                  * lanes may read past the last row */

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

static const int32_t MASK_TAB[16] = {-1, -1, -1, -1, -1, -1, -1, -1,
                                     0,  0,  0,  0,  0,  0,  0,  0};

/* The first n lanes (0 <= n <= 8). */
static inline TGT __m256i lanes8(int64_t n)
{
    return _mm256_loadu_si256((const __m256i *)(MASK_TAB + 8 - n));
}

/* ---- micro-kernels ------------------------------------------------------ */

/* Forward tile: y[i * ldy + j] = sum_{c < nc} sum_{k < nt}
 * a[c * cs + off[k] + j] * b[(c * nt + k) * MR + i] (+ bias[i]), i < M,
 * j < nw <= 8 * NV. */
#define FWK(M, NV)                                                            \
    TGT static void fwk_##M##_##NV(const float *a, int64_t cs, int64_t nc,    \
                                   const int32_t *off, int nt,                \
                                   const float *restrict b, float *y,         \
                                   int64_t ldy, int64_t nw,                   \
                                   const float *bias)                         \
    {                                                                         \
        __m256 acc[M][NV];                                                    \
        _Pragma("GCC unroll 8") for (int i = 0; i < M; i++)                   \
            _Pragma("GCC unroll 2") for (int v = 0; v < NV; v++)              \
                acc[i][v] = _mm256_setzero_ps();                              \
        for (int64_t c = 0; c < nc; c++, a += cs)                             \
            for (int k = 0; k < nt; k++, b += MR) {                           \
                const float *p = a + off[k];                                  \
                __m256 xv[NV];                                                \
                _Pragma("GCC unroll 2") for (int v = 0; v < NV; v++)          \
                    xv[v] = _mm256_loadu_ps(p + 8 * v);                       \
                _Pragma("GCC unroll 8") for (int i = 0; i < M; i++) {         \
                    __m256 bi = _mm256_broadcast_ss(b + i);                   \
                    _Pragma("GCC unroll 2") for (int v = 0; v < NV; v++)      \
                        acc[i][v] = _mm256_fmadd_ps(bi, xv[v], acc[i][v]);    \
                }                                                             \
            }                                                                 \
        _Pragma("GCC unroll 8") for (int i = 0; i < M; i++) {                 \
            _Pragma("GCC unroll 2") for (int v = 0; v < NV; v++) {            \
                __m256 r = acc[i][v];                                         \
                if (bias)                                                     \
                    r = _mm256_add_ps(r, _mm256_broadcast_ss(bias + i));      \
                int64_t n = nw - 8 * v;                                       \
                if (n >= 8)                                                   \
                    _mm256_storeu_ps(y + i * ldy + 8 * v, r);                 \
                else if (n > 0)                                               \
                    _mm256_maskstore_ps(y + i * ldy + 8 * v, lanes8(n), r);   \
            }                                                                 \
        }                                                                     \
    }

/* The geometry a weight-gradient tile walks: gy [N, O, OH, OW], the padded
 * x [N, C, Hp, Wp] (stride 1: output row oh reads padded row oh + kh*dh). */
typedef struct gw_geom {
    const float *gy, *xp;
    int64_t N, O, OH, OW, C, Hp, Wp;
} gw_geom;

/* Horizontal sum of 8 lanes, in a fixed order. */
static inline TGT float hsum8(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Weight-gradient tile: t[i * MT + u] = sum over n, oh, ow of
 * gy[n, o0 + i, oh, ow] * xp[n, 0, oh, ow + toff[u]], i < MO, u < MT
 * (toff: the tap's channel plane, kh*dh rows and kw*dw columns). */
#define GWK(MO, MT)                                                           \
    TGT static void gwk_##MO##_##MT(const gw_geom *g, int64_t o0,             \
                                    const int32_t *toff, float *t)            \
    {                                                                         \
        int64_t P = g->OH * g->OW, OW = g->OW;                                \
        __m256 acc[MO][MT];                                                   \
        _Pragma("GCC unroll 4") for (int i = 0; i < MO; i++)                  \
            _Pragma("GCC unroll 4") for (int u = 0; u < MT; u++)              \
                acc[i][u] = _mm256_setzero_ps();                              \
        __m256i tail = lanes8(OW % 8);                                        \
        for (int64_t n = 0; n < g->N; n++)                                    \
            for (int64_t oh = 0; oh < g->OH; oh++) {                          \
                const float *gr = g->gy + (n * g->O + o0) * P + oh * OW;      \
                const float *xr = g->xp + (n * g->C * g->Hp + oh) * g->Wp;    \
                int64_t j = 0;                                                \
                for (; j + 8 <= OW; j += 8) {                                 \
                    __m256 gv[MO];                                            \
                    _Pragma("GCC unroll 4") for (int i = 0; i < MO; i++)      \
                        gv[i] = _mm256_loadu_ps(gr + i * P + j);              \
                    _Pragma("GCC unroll 4") for (int u = 0; u < MT; u++) {    \
                        __m256 xv = _mm256_loadu_ps(xr + toff[u] + j);        \
                        _Pragma("GCC unroll 4") for (int i = 0; i < MO; i++)  \
                            acc[i][u] = _mm256_fmadd_ps(gv[i], xv, acc[i][u]); \
                    }                                                         \
                }                                                             \
                if (j < OW) {                                                 \
                    __m256 gv[MO];                                            \
                    _Pragma("GCC unroll 4") for (int i = 0; i < MO; i++)      \
                        gv[i] = _mm256_maskload_ps(gr + i * P + j, tail);     \
                    _Pragma("GCC unroll 4") for (int u = 0; u < MT; u++) {    \
                        __m256 xv = _mm256_maskload_ps(xr + toff[u] + j, tail); \
                        _Pragma("GCC unroll 4") for (int i = 0; i < MO; i++)  \
                            acc[i][u] = _mm256_fmadd_ps(gv[i], xv, acc[i][u]); \
                    }                                                         \
                }                                                             \
            }                                                                 \
        _Pragma("GCC unroll 4") for (int i = 0; i < MO; i++)                  \
            _Pragma("GCC unroll 4") for (int u = 0; u < MT; u++)              \
                t[i * MT + u] = hsum8(acc[i][u]);                             \
    }

#define ROWS6(X, ...)                                                         \
    X(1, __VA_ARGS__) X(2, __VA_ARGS__) X(3, __VA_ARGS__) X(4, __VA_ARGS__)   \
    X(5, __VA_ARGS__) X(6, __VA_ARGS__)
#define TAPS4(X, MO) X(MO, 1) X(MO, 2) X(MO, 3) X(MO, 4)

ROWS6(FWK, 1)
ROWS6(FWK, 2)
TAPS4(GWK, 1)
TAPS4(GWK, 2)
TAPS4(GWK, 3)

typedef void (*fwk_fn)(const float *, int64_t, int64_t, const int32_t *, int,
                       const float *, float *, int64_t, int64_t,
                       const float *);
typedef void (*gwk_fn)(const gw_geom *, int64_t, const int32_t *, float *);

#define FWK_NAME(M, NV) fwk_##M##_##NV,
#define GWK_NAME(MO, MT) gwk_##MO##_##MT,
/* [vectors - 1][rows - 1] */
static const fwk_fn FWK_TAB[2][MR] = {{ROWS6(FWK_NAME, 1)},
                                      {ROWS6(FWK_NAME, 2)}};
/* [channels - 1][taps - 1] */
static const gwk_fn GWK_TAB[GO][GT] = {{TAPS4(GWK_NAME, 1)},
                                       {TAPS4(GWK_NAME, 2)},
                                       {TAPS4(GWK_NAME, 3)}};

/* ---- padded copies and packing ------------------------------------------ */

/* d (planes of Hp x Wp, then SLACK zeros) = planes of src at (pt, pl);
 * plane q = (n, c) at n * s[0] + c * s[1], element strides s[2], s[3]. */
typedef struct pad_job {
    const float *src;
    int64_t s[4], C, H, W;
    float *d;
    int64_t Hp, Wp, pt, pl;
} pad_job;

static void pad_planes(void *ctx, int64_t q0, int64_t q1)
{
    const pad_job *p = ctx;
    for (int64_t q = q0; q < q1; q++) {
        const float *src = p->src + q / p->C * p->s[0] + q % p->C * p->s[1];
        float *d = p->d + q * p->Hp * p->Wp;
        memset(d, 0, (size_t)(p->Hp * p->Wp) * sizeof(float));
        for (int64_t h = 0; h < p->H; h++) {
            float *row = d + (h + p->pt) * p->Wp + p->pl;
            const float *sr = src + h * p->s[2];
            if (p->s[3] == 1)
                memcpy(row, sr, (size_t)p->W * sizeof(float));
            else
                for (int64_t w = 0; w < p->W; w++)
                    row[w] = sr[w * p->s[3]];
        }
    }
}

/* A new zero-padded copy of the N*C planes of src (NULL: no memory). */
static float *padded(const float *src, const int64_t *s, int64_t N, int64_t C,
                     int64_t H, int64_t W, int64_t pt, int64_t pl, int64_t Hp,
                     int64_t Wp)
{
    size_t n = (size_t)(N * C * Hp * Wp);
    float *d = zs_alloc((n + SLACK) * sizeof(float));
    if (!d)
        return NULL;
    memset(d + n, 0, SLACK * sizeof(float));
    pad_job p = {src, {s[0], s[1], s[2], s[3]}, C, H, W, d, Hp, Wp, pt, pl};
    zs_parallel_for(N * C, 1 + ZSK_GRAIN / (Hp * Wp), pad_planes, &p);
    return d;
}

/* Forward weights seen as we[o, c, k] = w[o * so + c * sc + (flip ? KK-1-k
 * : k)], packed d[ob, c, k, i] = we[ob*MR + i, c, k] (0 past O). The
 * forward: so = C*KK, sc = KK; the input gradient: the channels swapped
 * and the taps reversed. */
typedef struct pack_job {
    const float *w;
    int64_t O, C, KK, so, sc;
    bool flip;
    float *d;
} pack_job;

static void pack_w(void *ctx, int64_t q0, int64_t q1)
{
    const pack_job *p = ctx;
    for (int64_t q = q0; q < q1; q++) { /* q = (ob, c) */
        int64_t ob = q / p->C, c = q % p->C;
        float *d = p->d + q * p->KK * MR;
        for (int64_t k = 0; k < p->KK; k++)
            for (int64_t i = 0; i < MR; i++) {
                int64_t o = ob * MR + i, kk = p->flip ? p->KK - 1 - k : k;
                d[k * MR + i] = o < p->O ? p->w[o * p->so + c * p->sc + kk] : 0;
            }
    }
}

/* ---- forward (and the input gradient through it) ------------------------ */

typedef struct fwd_job {
    const float *xp; /* [N, C, Hp, Wp] */
    int64_t N, C, Hp, Wp, O, OH, OW, KK, nob, nwb;
    const float *wp; /* [nob, C, KK, MR] */
    const float *bias;
    float *y; /* [N, O, OH, OW] */
    const int32_t *off;
} fwd_job;

static void fwd_tiles(void *ctx, int64_t q0, int64_t q1)
{
    const fwd_job *f = ctx;
    for (int64_t q = q0; q < q1; q++) { /* q = (n, ob, oh, owb) */
        int64_t owb = q % f->nwb, r = q / f->nwb;
        int64_t oh = r % f->OH;
        r /= f->OH;
        int64_t ob = r % f->nob, n = r / f->nob;
        int64_t ow0 = owb * NW, nw = min64(NW, f->OW - ow0);
        int64_t m = min64(MR, f->O - ob * MR);
        FWK_TAB[nw > 8][m - 1](f->xp + (n * f->C * f->Hp + oh) * f->Wp + ow0,
                               f->Hp * f->Wp, f->C, f->off, (int)f->KK,
                               f->wp + ob * f->C * f->KK * MR,
                               f->y + ((n * f->O + ob * MR) * f->OH + oh) * f->OW + ow0,
                               f->OH * f->OW, nw, f->bias ? f->bias + ob * MR : NULL);
    }
}

/* y [N, O, OH, OW] = the stride-1 convolution of the padded xp [N, C, Hp,
 * Wp] (+ SLACK) with the weights pj describes, dilation (dh, dw). */
static zs_status run_forward(const float *xp, int64_t N, int64_t C,
                             int64_t Hp, int64_t Wp, int64_t O, int64_t OH,
                             int64_t OW, int64_t KH, int64_t KW, int64_t dh,
                             int64_t dw, pack_job *pj, const float *bias,
                             float *y)
{
    int64_t KK = KH * KW, nob = cdiv(O, MR);
    int32_t *off = zs_alloc((size_t)KK * sizeof(int32_t));
    float *wp = zs_alloc((size_t)(nob * C * KK * MR) * sizeof(float));
    if (!off || !wp) {
        zs_free(off);
        zs_free(wp);
        return ZS_ERR_NOMEM;
    }
    for (int64_t k = 0; k < KK; k++)
        off[k] = (int32_t)(k / KW * dh * Wp + k % KW * dw);
    pj->d = wp;
    zs_parallel_for(nob * C, 1 + 4096 / (KK * MR), pack_w, pj);
    fwd_job f = {xp, N, C, Hp, Wp, O, OH, OW, KK, nob, cdiv(OW, NW), wp,
                 bias, y, off};
    int64_t ntiles = N * nob * OH * f.nwb;
    double tile_flops = 2.0 * MR * NW * (double)(C * KK);
    zs_parallel_for(ntiles, 1 + (int64_t)(2e5 / tile_flops), fwd_tiles, &f);
    zs_free(off);
    zs_free(wp);
    return ZS_OK;
}

zs_status zsk_conv2d_direct_avx2_forward(const zsk_conv2d_shape *s,
                                         const float *x, const int64_t *xs,
                                         const float *w, const float *bias,
                                         float *y)
{
    int64_t Hp = s->H + 2 * s->ph, Wp = s->W + 2 * s->pw;
    float *xp = padded(x, xs, s->N, s->C, s->H, s->W, s->ph, s->pw, Hp, Wp);
    if (!xp)
        return ZS_ERR_NOMEM;
    pack_job pj = {w, s->O, s->C, s->KH * s->KW, s->C * s->KH * s->KW,
                   s->KH * s->KW, false, NULL};
    zs_status st = run_forward(xp, s->N, s->C, Hp, Wp, s->O, s->OH, s->OW,
                               s->KH, s->KW, s->dh, s->dw, &pj, bias, y);
    zs_free(xp);
    return st;
}

bool zsk_conv_direct_avx2_gx_ok(const zsk_conv2d_shape *s)
{
    int64_t Hg = s->OH + 2 * ((s->KH - 1) * s->dh - s->ph);
    int64_t Wg = s->OW + 2 * ((s->KW - 1) * s->dw - s->pw);
    return s->ph <= (s->KH - 1) * s->dh && s->pw <= (s->KW - 1) * s->dw &&
           s->O * Hg * Wg < INT32_MAX;
}

/* gx[n, c, ih, iw] = sum_{o, kh, kw} gy[n, o, ih + ph - kh*dh, iw + pw -
 * kw*dw] w[o, c, kh, kw]: with kh' = KH-1-kh the forward convolution of gy
 * padded by (KH-1)*dh - ph (>= 0: zsk_conv_direct_avx2_gx_ok). */
static zs_status input_grad(const zsk_conv2d_shape *s, const float *w,
                            const float *gy, float *gx)
{
    int64_t pt = (s->KH - 1) * s->dh - s->ph, pl = (s->KW - 1) * s->dw - s->pw;
    int64_t Hg = s->OH + 2 * pt, Wg = s->OW + 2 * pl, P = s->OH * s->OW;
    int64_t gs[4] = {s->O * P, P, s->OW, 1};
    float *gyp = padded(gy, gs, s->N, s->O, s->OH, s->OW, pt, pl, Hg, Wg);
    if (!gyp)
        return ZS_ERR_NOMEM;
    int64_t KK = s->KH * s->KW;
    pack_job pj = {w, s->C, s->O, KK, KK, s->C * KK, true, NULL};
    zs_status st = run_forward(gyp, s->N, s->O, Hg, Wg, s->C, s->H, s->W,
                               s->KH, s->KW, s->dh, s->dw, &pj, NULL, gx);
    zs_free(gyp);
    return st;
}

/* ---- weight gradient ---------------------------------------------------- */

typedef struct gw_job {
    gw_geom g;
    int64_t ntaps, nob, ntb;
    const int32_t *toff; /* [ntaps] */
    float *gw;           /* [O, ntaps] */
} gw_job;

static void gw_tiles(void *ctx, int64_t q0, int64_t q1)
{
    const gw_job *j = ctx;
    float t[GO * GT];
    for (int64_t q = q0; q < q1; q++) { /* q = (ob, tb) */
        int64_t ob = q / j->ntb, tb = q % j->ntb;
        int64_t mo = min64(GO, j->g.O - ob * GO), mt = min64(GT, j->ntaps - tb * GT);
        GWK_TAB[mo - 1][mt - 1](&j->g, ob * GO, j->toff + tb * GT, t);
        for (int64_t i = 0; i < mo; i++)
            for (int64_t u = 0; u < mt; u++)
                j->gw[(ob * GO + i) * j->ntaps + tb * GT + u] = t[i * mt + u];
    }
}

static zs_status weight_grad(const zsk_conv2d_shape *s, const float *x,
                             const int64_t *xs, const float *gy, float *gw)
{
    int64_t Hp = s->H + 2 * s->ph, Wp = s->W + 2 * s->pw, KK = s->KH * s->KW;
    int64_t ntaps = s->C * KK;
    float *xp = padded(x, xs, s->N, s->C, s->H, s->W, s->ph, s->pw, Hp, Wp);
    int32_t *toff = zs_alloc((size_t)ntaps * sizeof(int32_t));
    if (!xp || !toff) {
        zs_free(xp);
        zs_free(toff);
        return ZS_ERR_NOMEM;
    }
    for (int64_t t = 0; t < ntaps; t++) {
        int64_t c = t / KK, k = t % KK;
        toff[t] = (int32_t)(c * Hp * Wp + k / s->KW * s->dh * Wp +
                            k % s->KW * s->dw);
    }
    gw_job j = {{gy, xp, s->N, s->O, s->OH, s->OW, s->C, Hp, Wp},
                ntaps, cdiv(s->O, GO), cdiv(ntaps, GT), toff, gw};
    zs_parallel_for(j.nob * j.ntb, 1, gw_tiles, &j);
    zs_free(xp);
    zs_free(toff);
    return ZS_OK;
}

zs_status zsk_conv2d_direct_avx2_backward(const zsk_conv2d_shape *s,
                                          const float *x, const int64_t *xs,
                                          const float *w, const float *gy,
                                          float *gx, float *gw)
{
    zs_status st = ZS_OK;
    if (gx)
        st = input_grad(s, w, gy, gx);
    if (st == ZS_OK && gw)
        st = weight_grad(s, x, xs, gy, gw);
    return st;
}
