/*
 * conv_direct.c - f32 conv2d on AVX-512 read straight from the images,
 * without a column matrix (contracts in conv.h).
 *
 * Why: im2col + GEMM writes a K x P column matrix per image, and the GEMM
 * packs it again; on ResNet-like layers that cost a fifth of the forward
 * time (1 thread: 81 GFLOP/s where the same GEMM alone ran at 101). Here
 * every product is a register tile of up to MR = 14 rows x NR = 32 lanes
 * (28 zmm accumulators) whose broadcast operand is read in place from a
 * zero-padded copy of the input (the copy is O(input), the work
 * O(input x O x KH x KW)):
 *
 *   forward  rows = MR output pixels of one output row, lanes = 32 output
 *            channels; depth (c, kh, kw): broadcast
 *            xp[c, oh*sh + kh*dh, (ow0 + i)*sw + kw*dw], vector = packed
 *            w[o0 .. o0+31, c, kh, kw].
 *   input    gx is a correlation of gy (padded) with the taps reversed. Per
 *   grad     phase (ih mod sh, iw mod sw) only the taps with
 *            (ih + ph - kh*dh) divisible by sh reach a pixel, and along a
 *            row of that phase they read consecutive gy pixels: the forward
 *            kernel with row stride 1; lanes = 32 input channels.
 *   weight   rows = 14 (kw, c) pairs of one kh (adjacent in NHWC, so the
 *   grad     broadcasts are consecutive floats), lanes = 32 output channels;
 *            depth = output pixels: broadcast xt[n, oh*sh + kh*dh,
 *            ow*sw + kw, c] from an NHWC padded copy, vector = gy of the 32
 *            channels at that pixel (gy transposed to pixel-major panels).
 *            Images are taken in chunks that fit in L2, every tile
 *            accumulating over the chunk before the next one is touched.
 *
 * Threading: tiles over the pool; each tile's sums run in a fixed order,
 * so results do not depend on the thread count.
 */
#include <immintrin.h>
#include <string.h>

#include "kernels/cpu/conv.h"
#include "kernels/cpu/kernels.h"

#define MR 14 /* rows of a tile */
#define NR 32 /* lanes of a tile: two zmm */
/* Bytes of images (NHWC input + gy panels) per weight-gradient chunk: half
 * of a 1 MiB L2. */
#define GW_CHUNK_BYTES (512 * 1024)

#define AVX512 __attribute__((target("avx512f")))

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

static bool use_direct = true;

bool zsk_conv_set_direct(bool on)
{
    bool old = use_direct;
    use_direct = on;
    return old;
}

bool zsk_conv_direct_ok(zs_dtype dt, const zsk_conv2d_shape *s)
{
    /* row strides 1 and 2 have kernels; a phase holds at most 64 taps */
    return use_direct && dt == ZS_F32 && s->G == 1 && zs_cpu()->avx512f &&
           s->sw <= 2 && s->KH * s->KW <= 64 &&
           !(s->KH == 1 && s->KW == 1 && s->sh == 1 && s->sw == 1 &&
             s->ph == 0 && s->pw == 0); /* 1x1: x is the column matrix */
}

bool zsk_conv_direct_avx2_ok(zs_dtype dt, const zsk_conv2d_shape *s)
{
    const zs_cpu_features *f = zs_cpu();
    int64_t Hp = s->H + 2 * s->ph, Wp = s->W + 2 * s->pw;
    return use_direct && dt == ZS_F32 && s->G == 1 && f->avx2 && f->fma &&
           s->sh == 1 && s->sw == 1 && s->C * Hp * Wp < INT32_MAX &&
           !(s->KH == 1 && s->KW == 1 && s->ph == 0 && s->pw == 0);
}

/* ---- micro-kernels ------------------------------------------------------ */

/* Pixel tile: t[i * ldt + j] = sum_{c < nc} sum_{k < nt}
 * a[c * cs + off[k] + i * RS] * b[(c * nt + k) * NR + j], i < M,
 * j < 16 * NV. b, t and ldt are 64-byte aligned. */
#define PIX(M, NV, RS)                                                        \
    AVX512 static void pix_##M##_##NV##_##RS(                                 \
        const float *a, int64_t cs, int64_t nc, const int32_t *off, int nt,   \
        const float *restrict b, float *restrict t, int64_t ldt)              \
    {                                                                         \
        __m512 acc[M][NV];                                                    \
        _Pragma("GCC unroll 16") for (int i = 0; i < M; i++)                  \
            _Pragma("GCC unroll 2") for (int v = 0; v < NV; v++)              \
                acc[i][v] = _mm512_setzero_ps();                              \
        for (int64_t c = 0; c < nc; c++, a += cs)                             \
            for (int k = 0; k < nt; k++, b += NR) {                           \
                const float *p = a + off[k];                                  \
                __m512 bv[NV];                                                \
                _Pragma("GCC unroll 2") for (int v = 0; v < NV; v++)          \
                    bv[v] = _mm512_load_ps(b + 16 * v);                       \
                _Pragma("GCC unroll 16") for (int i = 0; i < M; i++) {        \
                    __m512 ai = _mm512_set1_ps(p[i * RS]);                    \
                    _Pragma("GCC unroll 2") for (int v = 0; v < NV; v++)      \
                        acc[i][v] = _mm512_fmadd_ps(ai, bv[v], acc[i][v]);    \
                }                                                             \
            }                                                                 \
        _Pragma("GCC unroll 16") for (int i = 0; i < M; i++)                  \
            _Pragma("GCC unroll 2") for (int v = 0; v < NV; v++)              \
                _mm512_store_ps(t + i * ldt + 16 * v, acc[i][v]);             \
    }

/* Weight-gradient tile: t[i * NR + j] += sum_{r < nrow} sum_{q < ncol}
 * a[r * ar + q * aq + i] * b[(r * ncol + q) * NR + j]. */
#define GWK(M, NV)                                                            \
    AVX512 static void gwk_##M##_##NV(const float *a, int64_t ar, int64_t aq, \
                                      int64_t nrow, int64_t ncol,             \
                                      const float *restrict b,                \
                                      float *restrict t)                      \
    {                                                                         \
        __m512 acc[M][NV];                                                    \
        _Pragma("GCC unroll 16") for (int i = 0; i < M; i++)                  \
            _Pragma("GCC unroll 2") for (int v = 0; v < NV; v++)              \
                acc[i][v] = _mm512_load_ps(t + i * NR + 16 * v);              \
        for (int64_t r = 0; r < nrow; r++, a += ar) {                         \
            const float *p = a;                                               \
            for (int64_t q = 0; q < ncol; q++, p += aq, b += NR) {            \
                __m512 bv[NV];                                                \
                _Pragma("GCC unroll 2") for (int v = 0; v < NV; v++)          \
                    bv[v] = _mm512_load_ps(b + 16 * v);                       \
                _Pragma("GCC unroll 16") for (int i = 0; i < M; i++) {        \
                    __m512 ai = _mm512_set1_ps(p[i]);                         \
                    _Pragma("GCC unroll 2") for (int v = 0; v < NV; v++)      \
                        acc[i][v] = _mm512_fmadd_ps(ai, bv[v], acc[i][v]);    \
                }                                                             \
            }                                                                 \
        }                                                                     \
        _Pragma("GCC unroll 16") for (int i = 0; i < M; i++)                  \
            _Pragma("GCC unroll 2") for (int v = 0; v < NV; v++)              \
                _mm512_store_ps(t + i * NR + 16 * v, acc[i][v]);              \
    }

/* X(m, ...) for every row count m of a tile. */
#define ROWS(X, ...)                                                          \
    X(1, __VA_ARGS__) X(2, __VA_ARGS__) X(3, __VA_ARGS__) X(4, __VA_ARGS__)   \
    X(5, __VA_ARGS__) X(6, __VA_ARGS__) X(7, __VA_ARGS__) X(8, __VA_ARGS__)   \
    X(9, __VA_ARGS__) X(10, __VA_ARGS__) X(11, __VA_ARGS__)                   \
    X(12, __VA_ARGS__) X(13, __VA_ARGS__) X(14, __VA_ARGS__)

ROWS(PIX, 1, 1)
ROWS(PIX, 2, 1)
ROWS(PIX, 1, 2)
ROWS(PIX, 2, 2)
ROWS(GWK, 1)
ROWS(GWK, 2)

typedef void (*pix_fn)(const float *, int64_t, int64_t, const int32_t *, int,
                       const float *, float *, int64_t);
typedef void (*gwk_fn)(const float *, int64_t, int64_t, int64_t, int64_t,
                       const float *, float *);

#define PIX_NAME(M, NV, RS) pix_##M##_##NV##_##RS,
#define GWK_NAME(M, NV) gwk_##M##_##NV,
/* [row stride - 1][vectors - 1][rows - 1] */
static const pix_fn PIX_TAB[2][2][MR] = {
    {{ROWS(PIX_NAME, 1, 1)}, {ROWS(PIX_NAME, 2, 1)}},
    {{ROWS(PIX_NAME, 1, 2)}, {ROWS(PIX_NAME, 2, 2)}},
};
/* [vectors - 1][rows - 1] */
static const gwk_fn GWK_TAB[2][MR] = {{ROWS(GWK_NAME, 1)},
                                      {ROWS(GWK_NAME, 2)}};

/* ---- 16 x 16 transposes ------------------------------------------------ */

static __mmask16 lanes(int64_t n)
{
    return n >= 16 ? (__mmask16)0xffff : n <= 0 ? 0 : (__mmask16)((1u << n) - 1);
}

/* r[i] lane j -> r[j] lane i. Two rounds of unpacks gather, in every
 * 128-bit lane L of r[4g + c], rows 4g..4g+3 of column 4L + c; two rounds
 * of 128-bit shuffles then collect the four row groups of each column. */
AVX512 static inline void tr16(__m512 r[16])
{
    __m512 t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int g = 0; g < 16; g += 4)
        for (int h = 0; h < 2; h++) {
            __m512d a = _mm512_castps_pd(t[g + h]);
            __m512d b = _mm512_castps_pd(t[g + h + 2]);
            r[g + 2 * h] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, b));
            r[g + 2 * h + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, b));
        }
    for (int c = 0; c < 4; c++) {
        t[c] = _mm512_shuffle_f32x4(r[c], r[4 + c], 0x88);
        t[4 + c] = _mm512_shuffle_f32x4(r[c], r[4 + c], 0xdd);
        t[8 + c] = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0x88);
        t[12 + c] = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0xdd);
    }
    for (int c = 0; c < 4; c++) {
        r[c] = _mm512_shuffle_f32x4(t[c], t[8 + c], 0x88);
        r[8 + c] = _mm512_shuffle_f32x4(t[c], t[8 + c], 0xdd);
        r[4 + c] = _mm512_shuffle_f32x4(t[4 + c], t[12 + c], 0x88);
        r[12 + c] = _mm512_shuffle_f32x4(t[4 + c], t[12 + c], 0xdd);
    }
}

/* d[j * ldd + i] = src[i * lds + j] (+ add[j] when add) for i < m, j < n,
 * m, n <= 16; rows i >= m read as zero. */
AVX512 static void tr_block(const float *src, int64_t lds, int64_t m,
                            int64_t n, float *d, int64_t ldd,
                            const float *add)
{
    __m512 r[16];
    __mmask16 mn = lanes(n), mm = lanes(m);
    for (int i = 0; i < 16; i++)
        r[i] = i < m ? _mm512_maskz_loadu_ps(mn, src + i * lds)
                     : _mm512_setzero_ps();
    tr16(r);
    for (int j = 0; j < n; j++) {
        __m512 v = add ? _mm512_add_ps(r[j], _mm512_set1_ps(add[j])) : r[j];
        _mm512_mask_storeu_ps(d + j * ldd, mm, v);
    }
}

/* d[j * ldd + i] = src[i * lds + j] (+ add[j]) for i < m, j < n, any
 * sizes, by 16 x 16 blocks. */
static void transpose(const float *src, int64_t lds, int64_t m, int64_t n,
                      float *d, int64_t ldd, const float *add)
{
    for (int64_t i = 0; i < m; i += 16)
        for (int64_t j = 0; j < n; j += 16)
            tr_block(src + i * lds + j, lds, min64(16, m - i),
                     min64(16, n - j), d + j * ldd + i, ldd,
                     add ? add + j : NULL);
}

/* ---- layout copies ------------------------------------------------------ */

/* Zero-padded planes: d[q] (Hp x Wp) = plane q of src at (pt, pl), for q in
 * [0, N*C) with plane q = (n, c) at n * s[0] + c * s[1]; element strides
 * s[2], s[3] inside the plane. */
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
        memset(d, 0, (size_t)(p->pt * p->Wp) * sizeof(float));
        for (int64_t h = 0; h < p->H; h++) {
            float *row = d + (h + p->pt) * p->Wp;
            const float *sr = src + h * p->s[2];
            memset(row, 0, (size_t)p->pl * sizeof(float));
            if (p->s[3] == 1)
                memcpy(row + p->pl, sr, (size_t)p->W * sizeof(float));
            else
                for (int64_t w = 0; w < p->W; w++)
                    row[p->pl + w] = sr[w * p->s[3]];
            memset(row + p->pl + p->W, 0,
                   (size_t)(p->Wp - p->pl - p->W) * sizeof(float));
        }
        memset(d + (p->H + p->pt) * p->Wp, 0,
               (size_t)((p->Hp - p->H - p->pt) * p->Wp) * sizeof(float));
    }
}

/* d[n, h, w, c] (Hp x Wp x C per image, zero border) = src[n, c, h - pt,
 * w - pl]; q runs over the padded rows (n, h). */
static void nhwc_rows(void *ctx, int64_t q0, int64_t q1)
{
    const pad_job *p = ctx;
    for (int64_t q = q0; q < q1; q++) {
        int64_t n = q / p->Hp, h = q % p->Hp - p->pt;
        float *d = p->d + q * p->Wp * p->C;
        memset(d, 0, (size_t)(p->Wp * p->C) * sizeof(float));
        if (h < 0 || h >= p->H)
            continue;
        const float *src = p->src + n * p->s[0] + h * p->s[2];
        if (p->s[3] == 1) { /* [C, W] rows of stride s[1] -> [W, C] */
            transpose(src, p->s[1], p->C, p->W, d + p->pl * p->C, p->C, NULL);
            continue;
        }
        for (int64_t c = 0; c < p->C; c++) {
            const float *sr = src + c * p->s[1];
            float *dc = d + p->pl * p->C + c;
            for (int64_t w = 0; w < p->W; w++)
                dc[w * p->C] = sr[w * p->s[3]];
        }
    }
}

/* gy of contiguous [N, O, P] as pixel-major panels d[ob, n, p, j] =
 * gy[n, ob*NR + j, p] (0 past O); q runs over (ob, n). */
typedef struct panel_job {
    const float *gy;
    int64_t N, O, P;
    float *d;
} panel_job;

static void gy_panels(void *ctx, int64_t q0, int64_t q1)
{
    const panel_job *g = ctx;
    for (int64_t q = q0; q < q1; q++) {
        int64_t ob = q / g->N, n = q % g->N, no = min64(NR, g->O - ob * NR);
        float *d = g->d + q * g->P * NR;
        if (no < NR) /* lanes past O stay zero */
            memset(d, 0, (size_t)(g->P * NR) * sizeof(float));
        transpose(g->gy + (n * g->O + ob * NR) * g->P, g->P, no, g->P, d, NR,
                  NULL);
    }
}

/* ---- forward ------------------------------------------------------------ */

typedef struct fwd_job {
    const zsk_conv2d_shape *s;
    const float *xp; /* [N, C, Hp, Wp] */
    int64_t Hp, Wp, KK, nob, nowb;
    const float *wp; /* [nob, C, KK, NR] */
    const float *bias;
    float *y;
    int32_t off[]; /* [KK] */
} fwd_job;

static void fwd_tiles(void *ctx, int64_t q0, int64_t q1)
{
    const fwd_job *f = ctx;
    const zsk_conv2d_shape *s = f->s;
    float t[MR * NR] __attribute__((aligned(64)));
    for (int64_t q = q0; q < q1; q++) {
        /* image, then weight panel, then pixels: the image and one panel
         * stay in L2 while all the image's tiles of that panel run */
        int64_t ow0 = q % f->nowb * MR, r = q / f->nowb;
        int64_t oh = r % s->OH;
        r /= s->OH;
        int64_t ob = r % f->nob, n = r / f->nob;
        int64_t m = min64(MR, s->OW - ow0), no = min64(NR, s->O - ob * NR);
        const float *a =
            f->xp + (n * s->C * f->Hp + oh * s->sh) * f->Wp + ow0 * s->sw;
        PIX_TAB[s->sw - 1][no > 16][m - 1](a, f->Hp * f->Wp, s->C, f->off,
                                           (int)f->KK,
                                           f->wp + ob * s->C * f->KK * NR, t,
                                           NR);
        transpose(t, NR, m, no,
                  f->y + ((n * s->O + ob * NR) * s->OH + oh) * s->OW + ow0,
                  s->OH * s->OW, f->bias ? f->bias + ob * NR : NULL);
    }
}

/* Weight packing, spread over the pool (serial, it took 3% of a 2-thread
 * ResNet forward). */
typedef struct pack_job {
    const zsk_conv2d_shape *s;
    const float *w;
    float *d;
    const struct gx_job *g; /* input gradient: its phases */
} pack_job;

/* Forward: d[ob, c, k, j] = w[ob*NR + j, c, k] (0 past O); q = (ob, c). */
static void pack_fwd(void *ctx, int64_t q0, int64_t q1)
{
    const pack_job *p = ctx;
    int64_t C = p->s->C, O = p->s->O, KK = p->s->KH * p->s->KW;
    for (int64_t q = q0; q < q1; q++) {
        int64_t ob = q / C, c = q % C, no = min64(NR, O - ob * NR);
        float *d = p->d + q * KK * NR;
        if (no < NR)
            memset(d, 0, (size_t)(KK * NR) * sizeof(float));
        transpose(p->w + (ob * NR * C + c) * KK, C * KK, no, KK, d, NR, NULL);
    }
}

/* Padded copy of x, or x itself when it is contiguous and unpadded. */
static const float *padded_input(const zsk_conv2d_shape *s, const float *x,
                                 const int64_t *xs, int64_t Hp, int64_t Wp,
                                 float **owned)
{
    *owned = NULL;
    if (s->ph == 0 && s->pw == 0 && xs[3] == 1 && xs[2] == s->W &&
        xs[1] == s->H * s->W && xs[0] == s->C * s->H * s->W)
        return x;
    *owned = zs_alloc((size_t)(s->N * s->C * Hp * Wp) * sizeof(float));
    if (!*owned)
        return NULL;
    pad_job p = {x,     {xs[0], xs[1], xs[2], xs[3]}, s->C, s->H, s->W,
                 *owned, Hp, Wp, s->ph, s->pw};
    zs_parallel_for(s->N * s->C, 1 + ZSK_GRAIN / (Hp * Wp), pad_planes, &p);
    return *owned;
}

zs_status zsk_conv2d_direct_forward(const zsk_conv2d_shape *s, const float *x,
                                    const int64_t *xs, const float *w,
                                    const float *bias, float *y)
{
    int64_t KK = s->KH * s->KW, Hp = s->H + 2 * s->ph, Wp = s->W + 2 * s->pw;
    int64_t nob = cdiv(s->O, NR);
    fwd_job *f = zs_alloc(sizeof *f + (size_t)KK * sizeof(int32_t));
    float *wp = zs_alloc((size_t)(nob * s->C * KK * NR) * sizeof(float));
    float *xpad = NULL;
    const float *xp = f && wp ? padded_input(s, x, xs, Hp, Wp, &xpad) : NULL;
    if (!xp) {
        zs_free(f);
        zs_free(wp);
        return ZS_ERR_NOMEM;
    }
    f->s = s;
    f->xp = xp;
    f->Hp = Hp;
    f->Wp = Wp;
    f->KK = KK;
    f->nob = nob;
    f->nowb = cdiv(s->OW, MR);
    f->wp = wp;
    f->bias = bias;
    f->y = y;
    for (int64_t k = 0; k < KK; k++)
        f->off[k] = (int32_t)(k / s->KW * s->dh * Wp + k % s->KW * s->dw);
    pack_job pj = {s, w, wp, NULL};
    zs_parallel_for(nob * s->C, 1 + 4096 / (KK * NR), pack_fwd, &pj);
    int64_t ntiles = s->N * s->OH * f->nowb * nob;
    double tile_flops = 2.0 * MR * NR * (double)(s->C * KK);
    zs_parallel_for(ntiles, 1 + (int64_t)(2e5 / tile_flops), fwd_tiles, f);
    zs_free(xpad);
    zs_free(wp);
    zs_free(f);
    return ZS_OK;
}

/* ---- input gradient ----------------------------------------------------- */

/* The gx pixels (a + sh*i, b + sw*j) of one phase and the taps that reach
 * them; gy row i + oi[k], column j + oj[k]. */
typedef struct phase {
    int64_t a, b, ni, nj, nt;
    int64_t kh[64], kw[64], oi[64], oj[64]; /* nt <= 64 taps per phase */
    int32_t off[64];
    float *wp; /* [ncb, O, nt, NR] */
} phase;

typedef struct gx_job {
    const zsk_conv2d_shape *s;
    const float *gyp; /* [N, O, Hg, Wg] */
    int64_t Hg, Wg, ncb, nph;
    int64_t nimax, njb; /* phase rows and column tiles, most of any phase */
    float *gx;
    phase *ph; /* [nph] */
} gx_job;

/* Lists the taps of phase (a, b) (at most KH*KW <= 64: zsk_conv_direct_ok). */
static void phase_taps(const zsk_conv2d_shape *s, phase *p, int64_t a,
                       int64_t b)
{
    p->a = a;
    p->b = b;
    p->ni = a < s->H ? cdiv(s->H - a, s->sh) : 0;
    p->nj = b < s->W ? cdiv(s->W - b, s->sw) : 0;
    p->nt = 0;
    for (int64_t kh = 0; kh < s->KH; kh++)
        for (int64_t kw = 0; kw < s->KW; kw++) {
            int64_t vh = a + s->ph - kh * s->dh, vw = b + s->pw - kw * s->dw;
            if (((vh % s->sh) + s->sh) % s->sh || ((vw % s->sw) + s->sw) % s->sw)
                continue;
            p->kh[p->nt] = kh;
            p->kw[p->nt] = kw;
            p->oi[p->nt] = vh / s->sh;
            p->oj[p->nt] = vw / s->sw;
            p->nt++;
        }
}

/* A tile is one gx row segment: row a + sh*i, columns sw*j0 ..
 * sw*(j0 + MR) - 1, 32 channels. Its sw column phases are computed into
 * interleaved rows of u (pixel e of phase b at row e*sw + b), so the
 * segment is stored with one transpose. Tiles run phase-row a fastest: the
 * phases differ in taps (1, 2, 2 and 4 for a 3x3 stride-2 kernel), and
 * contiguous ranges of tiles then cost the same on every thread. */
static void gx_tiles(void *ctx, int64_t q0, int64_t q1)
{
    const gx_job *g = ctx;
    const zsk_conv2d_shape *s = g->s;
    float u[2 * MR * NR] __attribute__((aligned(64)));
    for (int64_t q = q0; q < q1; q++) {
        int64_t a = q % s->sh, r = q / s->sh;
        int64_t cb = r % g->ncb;
        r /= g->ncb;
        int64_t j0 = r % g->njb * MR;
        r /= g->njb;
        int64_t i = r % g->nimax, n = r / g->nimax;
        const phase *row = g->ph + a * s->sw;
        if (i >= row->ni)
            continue;
        int64_t nc = min64(NR, s->C - cb * NR);
        int64_t np = min64(s->sw * MR, s->W - s->sw * j0);
        for (int64_t b = 0; b < s->sw; b++) {
            const phase *p = row + b;
            if (j0 >= p->nj)
                continue;
            int64_t m = min64(MR, p->nj - j0);
            const float *x = g->gyp + (n * s->O * g->Hg + i) * g->Wg + j0;
            PIX_TAB[0][nc > 16][m - 1](x, g->Hg * g->Wg, s->O, p->off,
                                       (int)p->nt,
                                       p->wp + cb * s->O * p->nt * NR,
                                       u + b * NR, s->sw * NR);
        }
        transpose(u, NR, np, nc,
                  g->gx + ((n * s->C + cb * NR) * s->H + a + s->sh * i) * s->W +
                      s->sw * j0,
                  s->H * s->W, NULL);
    }
}

/* Input gradient: for every phase, d_phase[cb, o, k, j] = w[o, cb*NR + j,
 * kh_k, kw_k] (0 past C); q = (cb, o). */
static void pack_gx(void *ctx, int64_t q0, int64_t q1)
{
    const pack_job *p = ctx;
    const zsk_conv2d_shape *s = p->s;
    int64_t KK = s->KH * s->KW;
    float all[64 * NR] __attribute__((aligned(64)));
    for (int64_t q = q0; q < q1; q++) {
        int64_t cb = q / s->O, o = q % s->O, nc = min64(NR, s->C - cb * NR);
        memset(all, 0, sizeof all);
        transpose(p->w + (o * s->C + cb * NR) * KK, KK, nc, KK, all, NR, NULL);
        for (int64_t h = 0; h < p->g->nph; h++) {
            const phase *ph = &p->g->ph[h];
            float *d = ph->wp + q * ph->nt * NR;
            for (int64_t k = 0; k < ph->nt; k++)
                memcpy(d + k * NR, all + (ph->kh[k] * s->KW + ph->kw[k]) * NR,
                       NR * sizeof(float));
        }
    }
}

/* Fills the phases (sh*sw of them: taps, offsets into the padded gy,
 * packed weights in wp, which holds ncb*O*KK*NR floats) and the padded gy
 * geometry: planes of Hg x Wg with gy at (*pt, *pl). */
static void plan_phases(const zsk_conv2d_shape *s, gx_job *g, float *wp,
                        int64_t *pt, int64_t *pl)
{
    int64_t hi = s->OH, wi = s->OW;
    *pt = *pl = 0;
    g->nph = s->sh * s->sw;
    for (int64_t q = 0; q < g->nph; q++) {
        phase *p = &g->ph[q];
        phase_taps(s, p, q / s->sw, q % s->sw);
        for (int64_t k = 0; k < p->nt; k++) {
            *pt = -p->oi[k] > *pt ? -p->oi[k] : *pt;
            *pl = -p->oj[k] > *pl ? -p->oj[k] : *pl;
            hi = p->ni + p->oi[k] > hi ? p->ni + p->oi[k] : hi;
            wi = p->nj + p->oj[k] > wi ? p->nj + p->oj[k] : wi;
        }
    }
    g->Hg = *pt + hi;
    g->Wg = *pl + wi;
    for (int64_t q = 0; q < g->nph; q++) {
        phase *p = &g->ph[q];
        for (int64_t k = 0; k < p->nt; k++)
            p->off[k] = (int32_t)((p->oi[k] + *pt) * g->Wg + p->oj[k] + *pl);
        p->wp = wp;
        wp += g->ncb * s->O * p->nt * NR;
    }
}

static zs_status input_grad(const zsk_conv2d_shape *s, const float *w,
                            const float *gy, float *gx)
{
    int64_t KK = s->KH * s->KW, pt, pl;
    gx_job g = {.s = s, .ncb = cdiv(s->C, NR), .gx = gx};
    g.ph = zs_alloc((size_t)(s->sh * s->sw) * sizeof *g.ph);
    float *wp = zs_alloc((size_t)(g.ncb * s->O * KK * NR) * sizeof(float));
    float *gyp = NULL;
    if (g.ph && wp) {
        plan_phases(s, &g, wp, &pt, &pl);
        pack_job pj = {s, w, NULL, &g};
        zs_parallel_for(g.ncb * s->O, 1 + 4096 / (KK * NR), pack_gx, &pj);
        gyp = zs_alloc((size_t)(s->N * s->O * g.Hg * g.Wg) * sizeof(float));
    }
    if (!gyp) {
        zs_free(g.ph);
        zs_free(wp);
        return ZS_ERR_NOMEM;
    }
    int64_t P = s->OH * s->OW;
    pad_job p = {gy,  {s->O * P, P, s->OW, 1}, s->O, s->OH, s->OW,
                 gyp, g.Hg, g.Wg, pt, pl};
    zs_parallel_for(s->N * s->O, 1 + ZSK_GRAIN / (g.Hg * g.Wg), pad_planes,
                    &p);
    g.gyp = gyp;
    g.nimax = g.ph[0].ni; /* phase a = 0 has the most rows and columns */
    g.njb = cdiv(g.ph[0].nj, MR);
    int64_t ntiles = s->N * g.nimax * g.njb * g.ncb * s->sh;
    double tile_flops = 2.0 * MR * NR * (double)(s->O * KK) / (double)g.nph;
    zs_parallel_for(ntiles, 1 + (int64_t)(2e5 / tile_flops), gx_tiles, &g);
    /* every gx pixel belongs to exactly one phase and one tile, so all of
     * gx is written (zeros where no tap reaches) */
    zs_free(gyp);
    zs_free(wp);
    zs_free(g.ph);
    return ZS_OK;
}

/* ---- weight gradient ---------------------------------------------------- */

/* Rows of a tile are R "pairs": with dw == 1, (kw, c) for one kh (R =
 * KW*C, adjacent floats in NHWC), else c for one (kh, kw) (R = C). */
typedef struct gw_job {
    const zsk_conv2d_shape *s;
    const float *xt;  /* [N, Hp, Wp, C] */
    const float *gyt; /* [nob, N, P, NR] */
    int64_t Hp, Wp, R, nout, nrb, nob;
    int64_t n0, n1;   /* images of the current chunk */
    float *acc;       /* [tiles, MR, NR] */
    float *gw;
} gw_job;

/* Outer tap u: its (kh, kw0) and offset in an NHWC image. */
static int64_t outer_offset(const gw_job *g, int64_t u, int64_t *kh,
                            int64_t *kw0)
{
    const zsk_conv2d_shape *s = g->s;
    bool pairs = s->dw == 1;
    *kh = pairs ? u : u / s->KW;
    *kw0 = pairs ? 0 : u % s->KW;
    return (*kh * s->dh * g->Wp + *kw0 * s->dw) * s->C;
}

static void gw_tiles(void *ctx, int64_t q0, int64_t q1)
{
    const gw_job *g = ctx;
    const zsk_conv2d_shape *s = g->s;
    int64_t P = s->OH * s->OW, img = g->Hp * g->Wp * s->C;
    for (int64_t q = q0; q < q1; q++) {
        int64_t ob = q % g->nob, rb = q / g->nob % g->nrb;
        int64_t u = q / g->nob / g->nrb, kh, kw0;
        int64_t off = outer_offset(g, u, &kh, &kw0) + rb * MR;
        int64_t m = min64(MR, g->R - rb * MR), no = min64(NR, s->O - ob * NR);
        gwk_fn fn = GWK_TAB[no > 16][m - 1];
        if (g->n0 == 0)
            memset(g->acc + q * MR * NR, 0, MR * NR * sizeof(float));
        for (int64_t n = g->n0; n < g->n1; n++)
            fn(g->xt + n * img + off, s->sh * g->Wp * s->C, s->sw * s->C,
               s->OH, s->OW, g->gyt + (ob * s->N + n) * P * NR,
               g->acc + q * MR * NR);
    }
}

/* gw[o, c, kh, kw] from the accumulators of tiles [q0, q1). */
static void gw_store(void *ctx, int64_t q0, int64_t q1)
{
    const gw_job *g = ctx;
    const zsk_conv2d_shape *s = g->s;
    int64_t KK = s->KH * s->KW;
    float *gw = g->gw;
    for (int64_t q = q0; q < q1; q++) {
        int64_t ob = q % g->nob, rb = q / g->nob % g->nrb;
        int64_t u = q / g->nob / g->nrb, kh, kw0;
        outer_offset(g, u, &kh, &kw0);
        int64_t m = min64(MR, g->R - rb * MR), no = min64(NR, s->O - ob * NR);
        const float *t = g->acc + q * MR * NR;
        for (int64_t i = 0; i < m; i++) {
            int64_t r = rb * MR + i, c = r % s->C, kw = kw0 + r / s->C;
            for (int64_t j = 0; j < no; j++)
                gw[((ob * NR + j) * s->C + c) * KK + kh * s->KW + kw] =
                    t[i * NR + j];
        }
    }
}

static zs_status weight_grad(const zsk_conv2d_shape *s, const float *x,
                             const int64_t *xs, const float *gy, float *gw)
{
    gw_job g = {.s = s, .Hp = s->H + 2 * s->ph, .Wp = s->W + 2 * s->pw};
    bool pairs = s->dw == 1;
    int64_t P = s->OH * s->OW;
    g.R = pairs ? s->KW * s->C : s->C;
    g.nout = pairs ? s->KH : s->KH * s->KW;
    g.nrb = cdiv(g.R, MR);
    g.nob = cdiv(s->O, NR);
    int64_t img = g.Hp * g.Wp * s->C, ntiles = g.nout * g.nrb * g.nob;
    float *xt = zs_alloc((size_t)(s->N * img) * sizeof(float));
    float *gyt = zs_alloc((size_t)(g.nob * s->N * P * NR) * sizeof(float));
    g.acc = zs_alloc((size_t)(ntiles * MR * NR) * sizeof(float));
    if (!xt || !gyt || !g.acc) {
        zs_free(xt);
        zs_free(gyt);
        zs_free(g.acc);
        return ZS_ERR_NOMEM;
    }
    pad_job pj = {x,  {xs[0], xs[1], xs[2], xs[3]}, s->C, s->H, s->W,
                  xt, g.Hp, g.Wp, s->ph, s->pw};
    zs_parallel_for(s->N * g.Hp, 1 + ZSK_GRAIN / (g.Wp * s->C), nhwc_rows, &pj);
    panel_job gj = {gy, s->N, s->O, P, gyt};
    zs_parallel_for(g.nob * s->N, 1 + ZSK_GRAIN / (P * NR), gy_panels, &gj);
    g.xt = xt;
    g.gyt = gyt;
    int64_t per_img = (img + g.nob * P * NR) * (int64_t)sizeof(float);
    int64_t chunk = GW_CHUNK_BYTES / per_img > 1 ? GW_CHUNK_BYTES / per_img : 1;
    for (g.n0 = 0; g.n0 < s->N; g.n0 = g.n1) {
        g.n1 = min64(s->N, g.n0 + chunk);
        zs_parallel_for(ntiles, 1, gw_tiles, &g);
    }
    g.gw = gw;
    zs_parallel_for(ntiles, 1 + 4096 / (MR * NR), gw_store, &g);
    zs_free(xt);
    zs_free(gyt);
    zs_free(g.acc);
    return ZS_OK;
}

zs_status zsk_conv2d_direct_backward(const zsk_conv2d_shape *s,
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
