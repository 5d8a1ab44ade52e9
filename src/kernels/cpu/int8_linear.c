/*
 * kernels/cpu/int8_linear.c - the batch-invariant W8A8 linear layer
 * (contract in int8_linear.h).
 *
 * Two phases. (1) Each row of x is smoothed, split into outliers and the
 * rest, and quantized into a workspace row of Kp = ceil(K / 64) * 64
 * unsigned bytes qx + 128 (padding: 128, i.e. qx = 0), in 16-lane vectors,
 * in parallel over rows. (2) The pool splits N into blocks of 64 output
 * columns; a block runs tiles of up to TR = 4 rows of x by TC = 4 rows of W
 * (one W row when M < SEQ_M = 16) through the int32 dot kernel, scales the
 * sums into floats, adds the row's outlier terms and runs the shared
 * epilogue (zsk_linear_epilogue) on the block's columns.
 *
 * The dot kernel is the AVX-512 VNNI tile, the AVX2 one (the comment at
 * tile_avx2) or portable C, by the CPU under ZS_CPU_ISA; all exact.
 * The VNNI tile keeps TR x TC zmm accumulators of vpdpbusd(qx + 128, w);
 * on the first row tile of a block it also sums each W row (vpdpbusd of
 * ones and w), and dot32 = sum - 128 * sum(w) in wrapping uint32
 * arithmetic (exact: the true value is below 2^31). The K tail is a
 * masked load of w (zeros), so the padding adds nothing to either sum;
 * full chunks use plain loads (masked loads of unaligned rows ran at a
 * third of the speed even from L2).
 *
 * Reading W: cold rows are read sequentially. Four interleaved row streams
 * (the 4 x 4 tile) ran at a third of the bandwidth of one sequential
 * stream, hence one W row per tile for small M; at M = 1 a thread runs
 * the blocks t and t + h of its range side by side (two sequential
 * streams). Measured (bench/infer_gemm, 2 threads, the Zen 4 VM of
 * packed_linear.c, triad 41.5 GB/s): M = 1 over GPT-2's five shapes 35.4
 * GB/s of int8 weights, 85% of the triad; M = 64 .. 1024 410-640 GOP/s
 * (2.4-3.9x f32 zsk_sgemm).
 */
#include "kernels/cpu/int8_linear.h"

#include <math.h>
#include <string.h>

#include "kernels/cpu/kernels.h"
#include "kernels/cpu/quant.h"
#include "kernels/cpu/vmath.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define ZSK_I8_VNNI 1
#define VNNI __attribute__((target("avx512f,avx512bw,avx512vnni")))
#define AVX2 __attribute__((target("avx2")))
#endif

/* The dot kernels of phase 2, chosen per call (zsk_i8_linear). */
enum path { PATH_C, PATH_AVX2, PATH_VNNI };

#define BLK 64             /* output columns per work item */
#define TR 4               /* rows of x per tile */
#define TC 4               /* rows of W per tile */
#define ITEM_MACS 65536    /* fewer products per work item run on one thread */
#define SEQ_M 16           /* below: tiles of one W row (sequential reads) */

/* roundf(v) (halves away from zero) clamped to [-127, 127], NaN -> 0,
 * without libm calls (GCC inlines neither roundf nor fmaxf here): v - (int)v
 * is exact for |v| < 2^23. */
static inline int8_t q8(float v)
{
    if (!(fabsf(v) < 127.5f))
        return (int8_t)(v > 0 ? 127 : v < 0 ? -127 : 0);
    int i = (int)v;
    float f = v - (float)i;
    i += f >= 0.5f ? 1 : f <= -0.5f ? -1 : 0;
    return (int8_t)(i > 127 ? 127 : i < -127 ? -127 : i);
}

/* max(a, |v|), NaN v ignored (as fmaxf). */
static inline float amax_step(float a, float v)
{
    float b = fabsf(v);
    return b > a ? b : a;
}

zs_status zsk_quantize_rows_i8(const float *W, int64_t N, int64_t K, int8_t *q,
                               float *scale)
{
    if (N < 0 || K < 0)
        return zs_set_error("quantize_rows_i8: negative size N = %lld, K = %lld",
                            (long long)N, (long long)K);
    if (N > 0 && (!scale || (K > 0 && (!W || !q))))
        return zs_set_error("quantize_rows_i8: NULL pointer");
    for (int64_t n = 0; n < N; n++) {
        const float *w = W + n * K;
        float amax = 0;
        for (int64_t k = 0; k < K; k++)
            amax = amax_step(amax, w[k]);
        float s = amax / 127.0f;
        scale[n] = s;
        for (int64_t k = 0; k < K; k++)
            q[n * K + k] = s > 0 ? q8(w[k] / s) : 0;
    }
    return ZS_OK;
}

/* ---- phase 1: activations --------------------------------------------------- */

typedef struct work {
    const int8_t *Wq;
    const float *w_scale, *x, *smooth, *bias, *res;
    float *y;
    int64_t N, K, Kp, M, ldx, ldr, ldy;
    float threshold;
    zsk_act act;
    enum path path;
    /* workspace */
    uint8_t *u;    /* [M, Kp] qx + 128 */
    float *sx;     /* [M] */
    int32_t *cnt;  /* [M] outliers per row */
    int32_t *oidx; /* [M, K] outlier columns, increasing (threshold > 0) */
    float *oval;   /* [M, K] their x' */
} work;

/* 16 lanes of x' = x * smooth from column k (zeros past c columns); tails
 * lane by lane (a variable-size memcpy became rep movs). */
ZSI_VINLINE void load_xs(const work *w, const float *xr, int64_t k, int64_t c, zsi_v16f *v)
{
    zsi_v16f s = {0};
    *v = (zsi_v16f){0};
    if (c == 16) {
        memcpy(v, xr + k, 64);
        if (w->smooth)
            memcpy(&s, w->smooth + k, 64);
    } else {
        for (int64_t j = 0; j < c; j++) {
            (*v)[j] = xr[k + j];
            s[j] = w->smooth ? w->smooth[k + j] : 0.0f;
        }
    }
    if (w->smooth)
        *v = *v * s;
}

typedef uint8_t v16u8 __attribute__((vector_size(16)));

/* Lanes of a where mask, else b. */
#define SELECT(mask, a, b) ((((zsi_v16u)(a)) & (mask)) | (((zsi_v16u)(b)) & ~(mask)))

/* The row's qx + 128 into u, per 16 lanes; q8() per lane (the same
 * operations: clamp to +-127.5 with NaN -> 0, truncate, step by the
 * remainder), so the scalar and vector forms agree. */
static ZSK_ISA_VOID(quantize_row, (const work *w, const float *xr, float s,
    uint8_t *u), (w, xr, s, u))
{
    for (int64_t k = 0; k < w->K; k += 16) {
        int64_t c = w->K - k < 16 ? w->K - k : 16;
        zsi_v16f v, t;
        load_xs(w, xr, k, c, &v);
        t = v / s;
        t = (zsi_v16f)SELECT((zsi_v16u)(t == t), t, (zsi_v16f){0});
        t = (zsi_v16f)SELECT((zsi_v16u)(t > 127.5f), (zsi_v16f){0} + 127.5f, t);
        t = (zsi_v16f)SELECT((zsi_v16u)(t < -127.5f), (zsi_v16f){0} - 127.5f, t);
        zsi_v16i i = __builtin_convertvector(t, zsi_v16i);
        zsi_v16f f = t - __builtin_convertvector(i, zsi_v16f);
        i = i - (zsi_v16i)(f >= 0.5f) + (zsi_v16i)(f <= -0.5f);
        i = (zsi_v16i)SELECT((zsi_v16u)(i > 127), (zsi_v16i){0} + 127, i);
        i = (zsi_v16i)SELECT((zsi_v16u)(i < -127), (zsi_v16i){0} - 127, i);
        if (w->threshold > 0) {
            zsi_v16f a = (zsi_v16f)((zsi_v16u)v & 0x7fffffffu);
            i = (zsi_v16i)((zsi_v16u)i & ~(zsi_v16u)(a > w->threshold));
        }
        if (c == 16) {
            v16u8 b = __builtin_convertvector(i + 128, v16u8);
            memcpy(u + k, &b, 16);
        } else {
            for (int64_t j = 0; j < c; j++)
                u[k + j] = (uint8_t)(i[j] + 128);
        }
    }
}

/* max |x'| over the columns that are not outliers (NaN ignored, as in
 * amax_step: a max is the same in any order). */
static ZSK_ISA_FN(float, row_amax, (const work *w, const float *xr), (w, xr))
{
    zsi_v16f mx = {0};
    for (int64_t k = 0; k < w->K; k += 16) {
        int64_t c = w->K - k < 16 ? w->K - k : 16;
        zsi_v16f v, a;
        load_xs(w, xr, k, c, &v);
        a = (zsi_v16f)((zsi_v16u)v & 0x7fffffffu);
        zsi_v16u gt = (zsi_v16u)(a > mx);
        if (w->threshold > 0)
            gt &= ~(zsi_v16u)(a > w->threshold);
        mx = (zsi_v16f)SELECT(gt, a, mx);
    }
    float amax = 0;
    for (int j = 0; j < 16; j++)
        amax = mx[j] > amax ? mx[j] : amax;
    return amax;
}

static void prep_rows(void *ctx, int64_t m0, int64_t m1)
{
    const work *w = ctx;
    for (int64_t m = m0; m < m1; m++) {
        w->sx[m] = 0;
        w->cnt[m] = 0;
        if (w->K == 0)
            continue;
        const float *xr = w->x + m * w->ldx;
        uint8_t *u = w->u + m * w->Kp;
        int32_t c = 0;
        for (int64_t k = 0; w->threshold > 0 && k < w->K; k++) {
            float v = w->smooth ? xr[k] * w->smooth[k] : xr[k];
            if (fabsf(v) > w->threshold) {
                w->oidx[m * w->K + c] = (int32_t)k;
                w->oval[m * w->K + c] = v;
                c++;
            }
        }
        float s = row_amax(w, xr) / 127.0f;
        if (s > 0)
            quantize_row(w, xr, s, u);
        else
            memset(u, 128, (size_t)w->K);
        memset(u + w->K, 128, (size_t)(w->Kp - w->K));
        w->sx[m] = s;
        w->cnt[m] = c;
    }
}

/* ---- phase 2: int32 dot tiles --------------------------------------------------
 * d[r * C + c] = sum_k (u[r * ldu + k] - 128) * w[c * K + k], r < R, c < C.
 * wsum[c] = sum_k w[c * K + k] (VNNI, when first; read otherwise). */

static ZSK_ISA_VOID(tile_c, (int R, int C, const uint8_t *u, int64_t ldu,
    const int8_t *w, int64_t K, int32_t *d), (R, C, u, ldu, w, K, d))
{
    for (int r = 0; r < R; r++) {
        for (int c = 0; c < C; c++) {
            const uint8_t *ur = u + r * ldu;
            const int8_t *wr = w + c * K;
            int32_t s = 0;
            for (int64_t k = 0; k < K; k++)
                s += ((int32_t)ur[k] - 128) * wr[k];
            d[r * C + c] = s;
        }
    }
}

#ifdef ZSK_I8_VNNI
#define VNNI_INLINE static inline __attribute__((always_inline, target("avx512f,avx512bw,avx512vnni")))

/* Sum of the 16 lanes, wrapping (the header's _mm512_reduce_add_epi32 ends
 * in a signed scalar add, which may overflow for the offset sums). */
VNNI_INLINE uint32_t hsum_u32(__m512i v)
{
    __m256i a = _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
    __m128i b = _mm_add_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
    b = _mm_add_epi32(b, _mm_shuffle_epi32(b, 0x4e));
    b = _mm_add_epi32(b, _mm_shuffle_epi32(b, 0xb1));
    return (uint32_t)_mm_cvtsi128_si32(b);
}

VNNI_INLINE void
tile_vnni_rc(const int R, const int C, bool first, const uint8_t *u, int64_t ldu,
             const int8_t *w, int64_t K, int32_t *d, int32_t *wsum)
{
    __m512i acc[TR][TC], sum[TC], ones = _mm512_set1_epi8(1);
#pragma GCC unroll 4
    for (int c = 0; c < C; c++) {
        sum[c] = _mm512_setzero_si512();
        for (int r = 0; r < R; r++)
            acc[r][c] = _mm512_setzero_si512();
    }
    for (int64_t k = 0; k < K; k += 64) {
        __m512i wv[TC];
        if (K - k >= 64) {
#pragma GCC unroll 4
            for (int c = 0; c < C; c++) {
                wv[c] = _mm512_loadu_si512((const void *)(w + c * K + k));
            }
        } else {
            __mmask64 mk = ((__mmask64)1 << (K - k)) - 1;
#pragma GCC unroll 4
            for (int c = 0; c < C; c++)
                wv[c] = _mm512_maskz_loadu_epi8(mk, w + c * K + k);
        }
#pragma GCC unroll 4
        for (int c = 0; c < C; c++)
            if (first)
                sum[c] = _mm512_dpbusd_epi32(sum[c], ones, wv[c]);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            __m512i xv = _mm512_load_si512((const void *)(u + r * ldu + k));
#pragma GCC unroll 4
            for (int c = 0; c < C; c++)
                acc[r][c] = _mm512_dpbusd_epi32(acc[r][c], xv, wv[c]);
        }
    }
#pragma GCC unroll 4
    for (int c = 0; c < C; c++) {
        if (first)
            wsum[c] = (int32_t)hsum_u32(sum[c]);
        uint32_t off = 128u * (uint32_t)wsum[c];
        for (int r = 0; r < R; r++)
            d[r * C + c] = (int32_t)(hsum_u32(acc[r][c]) - off);
    }
}

#define TILE_CASE(r, c)                                                                   \
    case (r) * 8 + (c):                                                                   \
        if (first)                                                                        \
            tile_vnni_rc(r, c, true, u, ldu, w, K, d, wsum);                              \
        else                                                                              \
            tile_vnni_rc(r, c, false, u, ldu, w, K, d, wsum);                             \
        break;

VNNI static void tile_vnni(int R, int C, bool first, const uint8_t *u, int64_t ldu,
                           const int8_t *w, int64_t K, int32_t *d, int32_t *wsum)
{
    switch (R * 8 + C) {
        TILE_CASE(1, 1) TILE_CASE(1, 2) TILE_CASE(1, 3) TILE_CASE(1, 4)
        TILE_CASE(2, 1) TILE_CASE(2, 2) TILE_CASE(2, 3) TILE_CASE(2, 4)
        TILE_CASE(3, 1) TILE_CASE(3, 2) TILE_CASE(3, 3) TILE_CASE(3, 4)
        TILE_CASE(4, 1) TILE_CASE(4, 2) TILE_CASE(4, 3) TILE_CASE(4, 4)
    }
}

/* d[0], d[1] = dot32 of the activation row u with W rows wa, wb. */
VNNI static void gemv2_vnni(const uint8_t *u, const int8_t *wa, const int8_t *wb, int64_t K,
                            int32_t *d)
{
    __m512i aa = _mm512_setzero_si512(), ab = aa, sa = aa, sb = aa;
    __m512i ones = _mm512_set1_epi8(1);
    for (int64_t k = 0; k < K; k += 64) {
        __m512i va, vb;
        if (K - k >= 64) {
            va = _mm512_loadu_si512((const void *)(wa + k));
            vb = _mm512_loadu_si512((const void *)(wb + k));
        } else {
            __mmask64 mk = ((__mmask64)1 << (K - k)) - 1;
            va = _mm512_maskz_loadu_epi8(mk, wa + k);
            vb = _mm512_maskz_loadu_epi8(mk, wb + k);
        }
        __m512i xv = _mm512_load_si512((const void *)(u + k));
        aa = _mm512_dpbusd_epi32(aa, xv, va);
        ab = _mm512_dpbusd_epi32(ab, xv, vb);
        sa = _mm512_dpbusd_epi32(sa, ones, va);
        sb = _mm512_dpbusd_epi32(sb, ones, vb);
    }
    d[0] = (int32_t)(hsum_u32(aa) - 128u * hsum_u32(sa));
    d[1] = (int32_t)(hsum_u32(ab) - 128u * hsum_u32(sb));
}

/* ---- the AVX2 tiles (llama.cpp's int8 dot on AVX2) ----------------------------
 * vpmaddubsw multiplies unsigned by signed bytes into saturating int16
 * pairs, so qx + 128 (up to 255) times w would saturate; instead the
 * signed qx = u ^ 0x80 (|qx| <= 127; padding gives 0) takes w's sign
 * (vpsignb) and multiplies |w| (vpsignb(w, w): -128 gives 0x80, read as
 * the unsigned 128): each pair is at most 2 * 128 * 127 = 32512 in
 * magnitude, exact; vpmaddwd with ones widens to int32 lanes. The same
 * integers as the other paths, so the same bits. The K tail of a W row is
 * copied to a zeroed 32-byte buffer (no byte-masked loads in AVX2). */
#define AVX2_INLINE static inline __attribute__((always_inline, target("avx2")))

/* 32 weights from k, zeros past K. */
AVX2_INLINE __m256i load_w32(const int8_t *w, int64_t k, int64_t K)
{
    if (K - k >= 32)
        return _mm256_loadu_si256((const __m256i *)(w + k));
    int8_t t[32] = {0};
    for (int64_t j = 0; j < K - k; j++)
        t[j] = w[k + j];
    return _mm256_loadu_si256((const __m256i *)t);
}

/* 32 activations qx from u + k (64-aligned rows padded to Kp). */
AVX2_INLINE __m256i load_x32(const uint8_t *u)
{
    return _mm256_xor_si256(_mm256_load_si256((const __m256i *)u),
                            _mm256_set1_epi8((char)0x80));
}

/* acc + the int32 lane sums of x * w, given aw = vpsignb(w, w). */
AVX2_INLINE __m256i dot32_step(__m256i acc, __m256i aw, __m256i x, __m256i w)
{
    __m256i p = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(x, w));
    return _mm256_add_epi32(acc, _mm256_madd_epi16(p, _mm256_set1_epi16(1)));
}

/* Sum of the 8 lanes, wrapping. */
AVX2_INLINE int32_t hsum8_i32(__m256i v)
{
    __m128i b = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    b = _mm_add_epi32(b, _mm_shuffle_epi32(b, 0x4e));
    b = _mm_add_epi32(b, _mm_shuffle_epi32(b, 0xb1));
    return _mm_cvtsi128_si32(b);
}

/* R <= 2 rows of x by C <= TC rows of W: 8 accumulators at most, within
 * the 16 ymm registers. */
AVX2_INLINE void tile_avx2_rc(const int R, const int C, const uint8_t *u, int64_t ldu,
                              const int8_t *w, int64_t K, int32_t *d, int ldd)
{
    __m256i acc[2][TC];
#pragma GCC unroll 4
    for (int c = 0; c < C; c++)
        for (int r = 0; r < R; r++)
            acc[r][c] = _mm256_setzero_si256();
    for (int64_t k = 0; k < K; k += 32) {
        __m256i xv[2];
        for (int r = 0; r < R; r++)
            xv[r] = load_x32(u + r * ldu + k);
#pragma GCC unroll 4
        for (int c = 0; c < C; c++) {
            __m256i wv = load_w32(w + c * K, k, K), aw = _mm256_sign_epi8(wv, wv);
            for (int r = 0; r < R; r++)
                acc[r][c] = dot32_step(acc[r][c], aw, xv[r], wv);
        }
    }
#pragma GCC unroll 4
    for (int c = 0; c < C; c++)
        for (int r = 0; r < R; r++)
            d[r * ldd + c] = hsum8_i32(acc[r][c]);
}

#define TILE2_CASE(r, c)                                                                  \
    case (r) * 8 + (c):                                                                   \
        tile_avx2_rc(r, c, u + r0 * ldu, ldu, w, K, d + r0 * C, C);                       \
        break;

/* The tile of tile_c in pairs of rows. */
AVX2 static void tile_avx2(int R, int C, const uint8_t *u, int64_t ldu, const int8_t *w,
                           int64_t K, int32_t *d)
{
    for (int r0 = 0; r0 < R; r0 += 2) {
        switch ((R - r0 < 2 ? R - r0 : 2) * 8 + C) {
            TILE2_CASE(1, 1) TILE2_CASE(1, 2) TILE2_CASE(1, 3) TILE2_CASE(1, 4)
            TILE2_CASE(2, 1) TILE2_CASE(2, 2) TILE2_CASE(2, 3) TILE2_CASE(2, 4)
        }
    }
}

/* gemv2_vnni on AVX2. */
AVX2 static void gemv2_avx2(const uint8_t *u, const int8_t *wa, const int8_t *wb, int64_t K,
                            int32_t *d)
{
    __m256i aa = _mm256_setzero_si256(), ab = aa;
    for (int64_t k = 0; k < K; k += 32) {
        __m256i xv = load_x32(u + k);
        __m256i va = load_w32(wa, k, K), vb = load_w32(wb, k, K);
        aa = dot32_step(aa, _mm256_sign_epi8(va, va), xv, va);
        ab = dot32_step(ab, _mm256_sign_epi8(vb, vb), xv, vb);
    }
    d[0] = hsum8_i32(aa);
    d[1] = hsum8_i32(ab);
}
#endif

bool zsk_i8_has_vnni(void)
{
#ifdef ZSK_I8_VNNI
    return zsk_quant_has_vnni();
#else
    return false;
#endif
}

bool zsk_i8_has_avx2(void)
{
#ifdef ZSK_I8_VNNI
    return zs_cpu()->avx2; /* capped by ZS_CPU_ISA */
#else
    return false;
#endif
}

/* d[r * C + c] = dot32(x row r, W row c) on w's path (wsum: tile_vnni's). */
static void tile(const work *w, int R, int C, bool first, const uint8_t *u, const int8_t *wr,
                 int32_t *d, int32_t *wsum)
{
    (void)first, (void)wsum;
#ifdef ZSK_I8_VNNI
    if (w->path == PATH_VNNI) {
        tile_vnni(R, C, first, u, w->Kp, wr, w->K, d, wsum);
        return;
    }
    if (w->path == PATH_AVX2) {
        tile_avx2(R, C, u, w->Kp, wr, w->K, d);
        return;
    }
#endif
    tile_c(R, C, u, w->Kp, wr, w->K, d);
}

/* ---- phase 2: blocks of 64 output columns ------------------------------------- */

/* acc[r] holds the scaled dots of rows m + r (r < R) for the block's nb
 * columns from n0: adds each row's outlier terms and runs the epilogue. */
static void finish_rows(const work *w, int64_t m, int R, int64_t n0, int64_t nb,
                        float (*acc)[BLK])
{
    int64_t K = w->K;
    for (int r = 0; r < R; r++) {
        int64_t mr = m + r;
        for (int32_t i = 0; w->cnt[mr] > 0 && i < nb; i++) {
            int64_t n = n0 + i;
            float ws = w->w_scale[n], o = 0.0f;
            for (int32_t j = 0; j < w->cnt[mr]; j++) {
                int64_t k = w->oidx[mr * K + j];
                o = fmaf(w->oval[mr * K + j], (float)w->Wq[n * K + k] * ws, o);
            }
            acc[r][i] = acc[r][i] + o;
        }
        zsk_linear_epilogue(acc[r], nb, w->bias ? w->bias + n0 : NULL,
                            w->res ? w->res + mr * w->ldr + n0 : NULL, w->act,
                            w->y + mr * w->ldy + n0);
    }
}

#ifdef ZSK_I8_VNNI
/* M = 1 on blocks [b0, b0 + 2h): block t and block t + h side by side, two
 * weight streams per thread (the dots are the same integers); vector paths
 * only. */
static void gemv_pairs(const work *w, int64_t b0, int64_t h)
{
    int64_t K = w->K;
    float acc[2][BLK];
    for (int64_t t = 0; t < h; t++) {
        int64_t na = (b0 + t) * BLK, nb = (b0 + h + t) * BLK;
        int64_t cb = w->N - nb < BLK ? w->N - nb : BLK;
        for (int64_t c = 0; c < BLK; c++) {
            int32_t d[2], ws[2];
            if (c < cb) {
                const int8_t *wa = w->Wq + (na + c) * K, *wb = w->Wq + (nb + c) * K;
                if (w->path == PATH_VNNI)
                    gemv2_vnni(w->u, wa, wb, K, d);
                else
                    gemv2_avx2(w->u, wa, wb, K, d);
                acc[1][c] = (w->sx[0] * w->w_scale[nb + c]) * (float)d[1];
            } else {
                tile(w, 1, 1, true, w->u, w->Wq + (na + c) * K, d, ws);
            }
            acc[0][c] = (w->sx[0] * w->w_scale[na + c]) * (float)d[0];
        }
        finish_rows(w, 0, 1, na, BLK, acc);
        finish_rows(w, 0, 1, nb, cb, acc + 1);
    }
}
#endif

static void block_cols(void *ctx, int64_t b0, int64_t b1)
{
    const work *w = ctx;
    int64_t K = w->K;
    int32_t d[TR * TC], wsum[BLK];
    float acc[TR][BLK];
#ifdef ZSK_I8_VNNI
    if (w->path != PATH_C && w->M == 1 && K > 0 && b1 - b0 >= 2) {
        int64_t h = (b1 - b0) / 2;
        gemv_pairs(w, b0, h);
        b0 += 2 * h;
    }
#endif
    /* Small M reads W as one sequential stream (row after row); four
     * interleaved row streams ran at a third of the bandwidth cold. */
    int tc = w->M < SEQ_M ? 1 : TC;
    for (int64_t b = b0; b < b1; b++) {
        int64_t n0 = b * BLK, nb = w->N - n0 < BLK ? w->N - n0 : BLK;
        for (int64_t m = 0; m < w->M; m += TR) {
            int R = (int)(w->M - m < TR ? w->M - m : TR);
            for (int64_t c0 = 0; c0 < nb; c0 += tc) {
                int C = (int)(nb - c0 < tc ? nb - c0 : tc);
                const int8_t *wr = K > 0 ? w->Wq + (n0 + c0) * K : NULL;
                if (K == 0)
                    memset(d, 0, sizeof d);
                else
                    tile(w, R, C, m == 0, w->u + m * w->Kp, wr, d, wsum + c0);
                for (int r = 0; r < R; r++)
                    for (int c = 0; c < C; c++)
                        acc[r][c0 + c] = (w->sx[m + r] * w->w_scale[n0 + c0 + c]) *
                                         (float)d[r * C + c];
            }
            finish_rows(w, m, R, n0, nb, acc);
        }
    }
}

/* ---- entry ------------------------------------------------------------------------ */

static zs_status check_args(const int8_t *Wq, const float *w_scale, int64_t N, int64_t K,
                            const float *x, int64_t M, int64_t ldx, const float *residual,
                            int64_t ldr, zsk_act act, float *y, int64_t ldy)
{
    if (K > ZSK_I8_MAX_K)
        return zs_set_error("i8_linear: K = %lld above %d (int32 dot could overflow)",
                            (long long)K, ZSK_I8_MAX_K);
    zs_status st = zsk_linear_check("i8_linear", N, K, x, M, ldx, residual, ldr, act, y,
                                    ldy);
    if (st < 0)
        return st;
    if (M > 0 && N > 0 && (!w_scale || (K > 0 && !Wq)))
        return zs_set_error("i8_linear: NULL %s", !w_scale ? "w_scale" : "Wq");
    return ZS_OK;
}

zs_status zsk_i8_linear(const int8_t *Wq, const float *w_scale, int64_t N, int64_t K,
                        const float *x, int64_t M, int64_t ldx, const zsk_i8_opts *o,
                        const float *bias, const float *residual, int64_t ldr, zsk_act act,
                        float *y, int64_t ldy)
{
    zs_status st = check_args(Wq, w_scale, N, K, x, M, ldx, residual, ldr, act, y, ldy);
    if (st < 0 || M == 0 || N == 0)
        return st;
    work w = {.Wq = Wq, .w_scale = w_scale, .x = x, .smooth = o ? o->smooth : NULL,
              .bias = bias, .res = residual, .y = y, .N = N, .K = K,
              .Kp = (K + 63) / 64 * 64, .M = M, .ldx = ldx, .ldr = ldr, .ldy = ldy,
              .threshold = o ? o->threshold : 0.0f, .act = act};
    if (!(w.threshold > 0))
        w.threshold = 0;
    w.path = zsk_linear_portable() ? PATH_C
             : zsk_i8_has_vnni()   ? PATH_VNNI
             : zsk_i8_has_avx2()   ? PATH_AVX2
                                   : PATH_C;
    /* workspace: u (64-aligned rows), sx, cnt, then oidx, oval */
    size_t nu = (size_t)(M * w.Kp), no = w.threshold > 0 ? (size_t)(M * K) : 0;
    size_t bytes = nu + (size_t)M * 8 + no * 8;
    char *ws = zs_alloc(bytes > 0 ? bytes : 1);
    if (!ws)
        return zs_set_error_code(ZS_ERR_NOMEM, "i8_linear: out of memory (%zu bytes)", bytes);
    w.u = (uint8_t *)ws;
    w.sx = (float *)(ws + nu);
    w.cnt = (int32_t *)(ws + nu + (size_t)M * 4);
    w.oidx = no ? (int32_t *)(ws + nu + (size_t)M * 8) : NULL;
    w.oval = no ? (float *)(ws + nu + (size_t)M * 8 + no * 4) : NULL;
    zs_parallel_for(M, 1 + 16384 / (K + 1), prep_rows, &w);
    int64_t blocks = (N + BLK - 1) / BLK;
    zs_parallel_for(blocks, 1 + ITEM_MACS / (M * BLK * (K + 1)), block_cols, &w);
    zs_free(ws);
    return ZS_OK;
}
