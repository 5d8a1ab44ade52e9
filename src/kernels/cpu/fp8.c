/*
 * fp8.c - FP8 quantization with tile scales, dequantization and widening
 * to bf16 (fp8.h has the contract; the GEMM is fp8_gemm.c).
 *
 * Rounding without double rounding: q = RNE_fp8(|x| / s) needs the exact
 * quotient of two f32 values rounded once. Both paths divide in f64 (the
 * operands are exact there) and round the f64 quotient to the format with
 * integer operations on its bits. That is the same as rounding the exact
 * quotient: an f64 quotient could only change the result by landing on a
 * midpoint between two fp8 values when the exact quotient is not one, but
 * a midpoint m has at most 5 significant bits, so x - s m (x of 24 bits,
 * s m of at most 29) is either 0 or at least 2^-29 |x| in magnitude, while
 * f64 rounding moves the quotient by at most 2^-53 of it.
 * Rounding an f64 a >= 0 to a format of mbits mantissa bits, bias and
 * smallest normal exponent emin (e4m3: 3, 7, -6; e5m2: 2, 15, -14):
 *   a >= 2^emin: add 2^(sh-1) - 1 + (the lowest kept bit) to the bits of a
 *                (sh = 52 - mbits) and shift right by sh: ties go to even,
 *                and a carry moves into the exponent; then rebias;
 *   a <  2^emin: the subnormal codes are multiples of 2^(emin - mbits):
 *                a + 2^(emin - mbits + 52) is rounded by the FPU (nearest
 *                even) to that quantum, and its bits minus the magic's are
 *                the code (2^emin itself gives the first normal code);
 *   then the code is capped at the largest finite one (saturation) and a
 *   NaN quotient gives 0x7f. The AVX-512 and AVX2 paths run exactly these
 *   steps on 8 and 4 f64 lanes, so all paths give identical bits.
 * Measured (2 threads, shared Zen 4 EPYC, 2048 x 1536 f32): 0.8 ns per
 * element on AVX-512, 1.1 on AVX2, 16 portable.
 * amax ignores NaN on every path (fmaxf; vmaxps returns its second
 * operand when the first is NaN).
 * Layouts: 1x128 tiles and 128x128 blocks of rows read in place (any row
 * stride; a column stride != 1 gathers, 16 rows at a time for a
 * transposed view), and 128x1 tiles (zsk_fp8_quantize_cols: per-lane
 * scales over 16 or 8 columns, for dw's operands).
 */
#include <immintrin.h>
#include <math.h>
#include <pthread.h>
#include <string.h>

#include "kernels/cpu/fp8.h"
#include "kernels/cpu/kernels.h"

bool zsk_fp8_force_portable;

typedef struct finfo {
    int mbits, bias;
    uint64_t maxcode;
    float fmax;
    double minnorm; /* 2^emin */
    double magic;   /* 2^(emin - mbits + 52) */
} finfo;

static const finfo FI[2] = {
    [ZSK_FP8_E4M3] = {3, 7, 0x7e, 448.0f, 0x1p-6, 0x1p43},
    [ZSK_FP8_E5M2] = {2, 15, 0x7b, 57344.0f, 0x1p-14, 0x1p36},
};

float zsk_fp8_max(zsk_fp8_fmt f) { return FI[f].fmax; }

/* ---- tables --------------------------------------------------------------- */

static float f32tab[2][256];
static uint16_t bftab[2][256]; /* sign | bf16 of the magnitude */
static pthread_once_t tab_once = PTHREAD_ONCE_INIT;

static void init_tables(void)
{
    for (int f = 0; f < 2; f++)
        for (int v = 0; v < 256; v++) {
            uint8_t mag = (uint8_t)(v & 0x7f);
            float x = f == ZSK_FP8_E4M3 ? zs_f8e4m3_to_f32(mag)
                                        : zs_f8e5m2_to_f32(mag);
            bftab[f][v] = (uint16_t)((v & 0x80 ? 0x8000u : 0u) |
                                     zs_f32_to_bf16(x));
            f32tab[f][v] = v & 0x80 ? -x : x;
        }
}

static const float *f32_table(zsk_fp8_fmt f)
{
    pthread_once(&tab_once, init_tables);
    return f32tab[f];
}

static const uint16_t *bf16_table(zsk_fp8_fmt f)
{
    pthread_once(&tab_once, init_tables);
    return bftab[f];
}

float zsk_fp8_to_f32(zsk_fp8_fmt f, uint8_t v) { return f32_table(f)[v]; }

/* ---- portable quantizer ---------------------------------------------------- */

static uint64_t bits64(double a)
{
    uint64_t u;
    memcpy(&u, &a, sizeof u);
    return u;
}

/* The code of x / s (s > 0) with x's sign: see the file comment. Written
 * without branches so that the loop vectorises (ZSK_ISA_VOID). */
static inline uint8_t quant1(const finfo *f, float x, double s)
{
    const int sh = 52 - f->mbits;
    double a = (double)fabsf(x) / s;
    uint64_t u = bits64(a);
    uint64_t cn = ((u + ((uint64_t)1 << (sh - 1)) - 1 + ((u >> sh) & 1)) >> sh) -
                  ((uint64_t)(1023 - f->bias) << f->mbits);
    uint64_t cs = bits64(a + f->magic) - bits64(f->magic);
    uint64_t c = a >= f->minnorm ? cn : cs;
    c = c < f->maxcode ? c : f->maxcode;
    return (uint8_t)(a != a ? 0x7f : c | (signbit(x) ? 0x80 : 0));
}

static float scale_of(const finfo *f, float amax)
{
    if (amax == 0.0f)
        return 1.0f;
    float s = amax / f->fmax;
    return s == 0.0f ? 0x1p-149f : s;
}

static ZSK_ISA_FN(float, amax_portable, (const float *x, int64_t n), (x, n))
{
    float m = 0.0f;
    for (int64_t i = 0; i < n; i++)
        m = fmaxf(m, fabsf(x[i]));
    return m;
}

static ZSK_ISA_VOID(quant_portable, (const finfo *f, const float *x,
    int64_t n, float s, uint8_t *q), (f, x, n, s, q))
{
    for (int64_t i = 0; i < n; i++)
        q[i] = quant1(f, x[i], (double)s);
}

/* ---- AVX-512 quantizer ----------------------------------------------------- */

#define T512 __attribute__((target("avx512f,avx512bw,avx512vl")))
#define INL inline __attribute__((always_inline))

static INL __mmask16 mask16(int64_t n)
{
    return n >= 16 ? (__mmask16)~0 : (__mmask16)((1u << n) - 1);
}

static INL __mmask32 mask32(int64_t n)
{
    return n >= 32 ? ~(__mmask32)0 : ((__mmask32)1 << n) - 1;
}

T512 static float amax_avx512(const float *x, int64_t n)
{
    __m512i abs = _mm512_set1_epi32(0x7fffffff);
    __m512 acc = _mm512_setzero_ps();
    for (int64_t i = 0; i < n; i += 16) {
        __m512i v = _mm512_maskz_loadu_epi32(mask16(n - i), x + i);
        /* NaN in the first operand: vmaxps returns the second */
        acc = _mm512_max_ps(_mm512_castsi512_ps(_mm512_and_si512(v, abs)), acc);
    }
    return _mm512_reduce_max_ps(acc);
}

/* quant1's code on 8 f64 lanes (no sign); *nan gets the lanes whose quotient is NaN. */
T512 static INL __m512i codes8(const finfo *f, __m512d a, __mmask8 *nan)
{
    __m128i sh = _mm_cvtsi32_si128(52 - f->mbits);
    __m512i one = _mm512_set1_epi64(1);
    __m512i half = _mm512_set1_epi64(
        (long long)(((uint64_t)1 << (51 - f->mbits)) - 1));
    __m512i rebias = _mm512_set1_epi64(
        (long long)((uint64_t)(1023 - f->bias) << f->mbits));
    __m512d magic = _mm512_set1_pd(f->magic);
    *nan = _mm512_cmp_pd_mask(a, a, _CMP_UNORD_Q);
    __mmask8 nrm = _mm512_cmp_pd_mask(a, _mm512_set1_pd(f->minnorm),
                                      _CMP_GE_OQ);
    __m512i u = _mm512_castpd_si512(a);
    __m512i r = _mm512_add_epi64(
        u, _mm512_add_epi64(half, _mm512_and_si512(_mm512_srl_epi64(u, sh), one)));
    __m512i cn = _mm512_sub_epi64(_mm512_srl_epi64(r, sh), rebias);
    __m512i cs = _mm512_sub_epi64(_mm512_castpd_si512(_mm512_add_pd(a, magic)),
                                  _mm512_castpd_si512(magic));
    __m512i c = _mm512_mask_blend_epi64(nrm, cs, cn);
    c = _mm512_min_epu64(c, _mm512_set1_epi64((long long)f->maxcode));
    return _mm512_mask_mov_epi64(c, *nan, _mm512_set1_epi64(0x7f));
}

/* The 16 codes (with sign) of the f32 bits xb divided by the scales sv
 * (per lane). */
T512 static INL __m128i q16_avx512(const finfo *f, __m512i xb, __m512 sv)
{
    __m512i ax = _mm512_and_si512(xb, _mm512_set1_epi32(0x7fffffff));
    __m256 lo = _mm512_castps512_ps256(_mm512_castsi512_ps(ax));
    __m256 hi = _mm256_castsi256_ps(_mm512_extracti64x4_epi64(ax, 1));
    __m256 slo = _mm512_castps512_ps256(sv);
    __m256 shi = _mm256_castsi256_ps(
        _mm512_extracti64x4_epi64(_mm512_castps_si512(sv), 1));
    __mmask8 nl, nh;
    __m512i cl = codes8(f, _mm512_div_pd(_mm512_cvtps_pd(lo), _mm512_cvtps_pd(slo)), &nl);
    __m512i ch = codes8(f, _mm512_div_pd(_mm512_cvtps_pd(hi), _mm512_cvtps_pd(shi)), &nh);
    __m128i c = _mm_unpacklo_epi64(_mm512_cvtepi64_epi8(cl),
                                   _mm512_cvtepi64_epi8(ch));
    __mmask16 nan = (__mmask16)(nl | (nh << 8));
    __m128i sg = _mm512_cvtepi32_epi8(_mm512_and_si512(
        _mm512_srli_epi32(xb, 24), _mm512_set1_epi32(0x80)));
    return _mm_or_si128(c, _mm_maskz_mov_epi8((__mmask16)~nan, sg));
}

T512 static void quant_avx512(const finfo *f, const float *x, int64_t n,
                              float s, uint8_t *q)
{
    __m512 sv = _mm512_set1_ps(s);
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = mask16(n - i);
        _mm_mask_storeu_epi8(q + i, m,
                             q16_avx512(f, _mm512_maskz_loadu_epi32(m, x + i), sv));
    }
}

/* ---- AVX2 quantizer (4 f64 lanes; the same steps) ------------------------ */

#define T256 __attribute__((target("avx2,fma")))

T256 static float amax_avx2(const float *x, int64_t n)
{
    __m256 abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 acc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) /* NaN first: vmaxps returns the second */
        acc = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(x + i), abs), acc);
    float t[8], m = 0.0f;
    _mm256_storeu_ps(t, acc);
    for (int k = 0; k < 8; k++)
        m = fmaxf(m, t[k]);
    for (; i < n; i++)
        m = fmaxf(m, fabsf(x[i]));
    return m;
}

/* Codes with sign of 4 lanes: a = |x| / s, sign = x's sign bit (0 or 1). */
T256 static INL __m256i codes4(const finfo *f, __m256d a, __m256i sign)
{
    __m128i sh = _mm_cvtsi32_si128(52 - f->mbits);
    __m256i half = _mm256_set1_epi64x(
        (long long)(((uint64_t)1 << (51 - f->mbits)) - 1));
    __m256i rebias = _mm256_set1_epi64x(
        (long long)((uint64_t)(1023 - f->bias) << f->mbits));
    __m256i maxc = _mm256_set1_epi64x((long long)f->maxcode);
    __m256d magic = _mm256_set1_pd(f->magic);
    __m256i u = _mm256_castpd_si256(a);
    __m256i odd = _mm256_and_si256(_mm256_srl_epi64(u, sh), _mm256_set1_epi64x(1));
    __m256i cn = _mm256_sub_epi64(
        _mm256_srl_epi64(_mm256_add_epi64(u, _mm256_add_epi64(half, odd)), sh),
        rebias);
    __m256i cs = _mm256_sub_epi64(_mm256_castpd_si256(_mm256_add_pd(a, magic)),
                                  _mm256_castpd_si256(magic));
    __m256d nrm = _mm256_cmp_pd(a, _mm256_set1_pd(f->minnorm), _CMP_GE_OQ);
    __m256i c = _mm256_castpd_si256(_mm256_blendv_pd(
        _mm256_castsi256_pd(cs), _mm256_castsi256_pd(cn), nrm));
    /* the selected codes are small and non-negative: a signed compare */
    c = _mm256_castpd_si256(_mm256_blendv_pd(
        _mm256_castsi256_pd(c), _mm256_castsi256_pd(maxc),
        _mm256_castsi256_pd(_mm256_cmpgt_epi64(c, maxc))));
    c = _mm256_or_si256(c, _mm256_slli_epi64(sign, 7));
    __m256d nan = _mm256_cmp_pd(a, a, _CMP_UNORD_Q);
    return _mm256_castpd_si256(_mm256_blendv_pd(
        _mm256_castsi256_pd(c), _mm256_castsi256_pd(_mm256_set1_epi64x(0x7f)),
        nan));
}

/* The 8 codes (with sign) of the f32 bits xb divided by the scales sv
 * (per lane), in the low 8 bytes. */
T256 static INL __m128i q8_avx2(const finfo *f, __m256i xb, __m256 sv)
{
    __m256i ax = _mm256_and_si256(xb, _mm256_set1_epi32(0x7fffffff));
    __m256i sg = _mm256_srli_epi32(xb, 31);
    /* bytes 0, 4, 8, 12 of each 128-bit lane to its low 4 bytes */
    __m256i pick = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1,
                                    -1, -1, -1, -1, -1, 0, 4, 8, 12, -1, -1,
                                    -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
    __m256i lo = codes4(f, _mm256_div_pd(
                               _mm256_cvtps_pd(_mm_castsi128_ps(_mm256_castsi256_si128(ax))),
                               _mm256_cvtps_pd(_mm256_castps256_ps128(sv))),
                        _mm256_cvtepu32_epi64(_mm256_castsi256_si128(sg)));
    __m256i hi = codes4(f, _mm256_div_pd(
                               _mm256_cvtps_pd(_mm_castsi128_ps(_mm256_extracti128_si256(ax, 1))),
                               _mm256_cvtps_pd(_mm256_extractf128_ps(sv, 1))),
                        _mm256_cvtepu32_epi64(_mm256_extracti128_si256(sg, 1)));
    /* 32-bit lanes e0 e4 e1 e5 e2 e6 e3 e7 -> e0 .. e7 -> bytes */
    __m256i v = _mm256_permutevar8x32_epi32(
        _mm256_or_si256(lo, _mm256_slli_epi64(hi, 32)),
        _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7));
    v = _mm256_shuffle_epi8(v, pick);
    return _mm_unpacklo_epi32(_mm256_castsi256_si128(v),
                              _mm256_extracti128_si256(v, 1));
}

T256 static void quant_avx2(const finfo *f, const float *x, int64_t n,
                            float s, uint8_t *q)
{
    __m256 sv = _mm256_set1_ps(s);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storel_epi64((__m128i *)(q + i),
                         q8_avx2(f, _mm256_loadu_si256((const __m256i *)(x + i)), sv));
    for (; i < n; i++)
        q[i] = quant1(f, x[i], (double)s);
}

enum qpath { Q_PORTABLE, Q_AVX2, Q_AVX512 };

static enum qpath qpath(void)
{
    const zs_cpu_features *c = zs_cpu();
    if (zsk_fp8_force_portable)
        return Q_PORTABLE;
    if (c->avx512f && c->avx512bw && c->avx512vl)
        return Q_AVX512;
    return c->avx2 && c->fma ? Q_AVX2 : Q_PORTABLE;
}

static bool use_avx512(void) { return qpath() == Q_AVX512; }

/* ---- quantize ---------------------------------------------------------------- */

typedef struct qjob {
    const finfo *f;
    bool bf16, given; /* given: the scales are read, not computed */
    enum qpath path;
    const void *x;
    int64_t R, C, rs, cs, br, KB;
    uint8_t *q;
    float *s;
} qjob;

/* Columns [c0, c0 + n) of row r as f32: in place (f32, unit column
 * stride), else gathered and converted into buf. */
static const float *row_seg(const qjob *j, int64_t r, int64_t c0, int64_t n,
                            float *buf)
{
    int64_t at = r * j->rs + c0 * j->cs, cs = j->cs;
    if (!j->bf16 && cs == 1)
        return (const float *)j->x + at;
    if (j->bf16) {
        const uint16_t *h = (const uint16_t *)j->x + at;
        for (int64_t i = 0; i < n; i++)
            buf[i] = zs_bf16_to_f32(h[i * cs]);
    } else {
        const float *p = (const float *)j->x + at;
        for (int64_t i = 0; i < n; i++)
            buf[i] = p[i * cs];
    }
    return buf;
}

/* Tile rows [r0, r1) x columns [c0, c0 + n): amax (unless the scale is
 * given), the scale, the codes. A single row is read once, from one when
 * the caller has it (else from row_seg). */
static void quant_tile(const qjob *j, int64_t r0, int64_t r1, int64_t c0,
                       int64_t n, float *sp, float *buf, const float *one)
{
    if (!one && r1 - r0 == 1)
        one = row_seg(j, r0, c0, n, buf);
    float s = *sp, amax = 0.0f;
    for (int64_t r = r0; r < r1 && !j->given; r++) {
        const float *x = one ? one : row_seg(j, r, c0, n, buf);
        amax = fmaxf(amax, j->path == Q_AVX512 ? amax_avx512(x, n)
                           : j->path == Q_AVX2 ? amax_avx2(x, n)
                                               : amax_portable(x, n));
    }
    if (!j->given)
        *sp = s = scale_of(j->f, amax);
    for (int64_t r = r0; r < r1; r++) {
        const float *x = one ? one : row_seg(j, r, c0, n, buf);
        uint8_t *q = j->q + r * j->C + c0;
        if (j->path == Q_AVX512)
            quant_avx512(j->f, x, n, s, q);
        else if (j->path == Q_AVX2)
            quant_avx2(j->f, x, n, s, q);
        else
            quant_portable(j->f, x, n, s, q);
    }
}

static void quant_groups(void *p, int64_t g0, int64_t g1)
{
    const qjob *j = p;
    float buf[ZSK_FP8_TILE];
    for (int64_t g = g0; g < g1; g++) {
        int64_t r0 = g * j->br, r1 = r0 + j->br < j->R ? r0 + j->br : j->R;
        for (int64_t t = 0; t < j->KB; t++) {
            int64_t c0 = t * ZSK_FP8_TILE;
            int64_t n = j->C - c0 < ZSK_FP8_TILE ? j->C - c0 : ZSK_FP8_TILE;
            quant_tile(j, r0, r1, c0, n, j->s + g * j->KB + t, buf, NULL);
        }
    }
}

/* 1x128 tiles of a transposed view (rs == 1): 16 rows at a time, so every
 * source row (x's column) is read as one 64-byte run per tile and its page
 * is reused 16 times; a row-at-a-time gather touches a page per element.
 * Units of 16 rows. */
#define TROWS 16

static void quant_rows_t(void *p, int64_t u0, int64_t u1)
{
    const qjob *j = p;
    float buf[TROWS][ZSK_FP8_TILE];
    for (int64_t u = u0; u < u1; u++) {
        int64_t r0 = u * TROWS, nr = j->R - r0 < TROWS ? j->R - r0 : TROWS;
        for (int64_t t = 0; t < j->KB; t++) {
            int64_t c0 = t * ZSK_FP8_TILE;
            int64_t n = j->C - c0 < ZSK_FP8_TILE ? j->C - c0 : ZSK_FP8_TILE;
            for (int64_t c = 0; c < n; c++) {
                int64_t at = r0 + (c0 + c) * j->cs;
                if (j->bf16)
                    for (int64_t i = 0; i < nr; i++)
                        buf[i][c] = zs_bf16_to_f32(((const uint16_t *)j->x)[at + i]);
                else
                    for (int64_t i = 0; i < nr; i++)
                        buf[i][c] = ((const float *)j->x)[at + i];
            }
            for (int64_t i = 0; i < nr; i++)
                quant_tile(j, r0 + i, r0 + i + 1, c0, n,
                           j->s + (r0 + i) * j->KB + t, NULL, buf[i]);
        }
    }
}

static void quantize(zsk_fp8_fmt f, bool bf16, bool given, const void *x,
                     int64_t R, int64_t C, int64_t rs, int64_t cs, int64_t br,
                     uint8_t *q, float *s)
{
    if (R <= 0 || C <= 0)
        return;
    if (br < 1)
        br = 1;
    qjob j = {&FI[f], bf16, given, qpath(), x, R, C, rs, cs, br,
              zsk_fp8_groups(C, ZSK_FP8_TILE), q, s};
    if (br == 1 && rs == 1 && cs != 1) {
        zs_parallel_for(zsk_fp8_groups(R, TROWS), ZSK_GRAIN / (TROWS * C) + 1,
                        quant_rows_t, &j);
        return;
    }
    int64_t ng = zsk_fp8_groups(R, br);
    int64_t grain = ZSK_GRAIN / (br * C) + 1;
    zs_parallel_for(ng, grain, quant_groups, &j);
}

void zsk_fp8_quantize(zsk_fp8_fmt f, bool bf16, const void *x, int64_t R,
                      int64_t C, int64_t rs, int64_t cs, int64_t br,
                      uint8_t *q, float *s)
{
    quantize(f, bf16, false, x, R, C, rs, cs, br, q, s);
}

void zsk_fp8_quantize_scaled(zsk_fp8_fmt f, bool bf16, const void *x,
                             int64_t R, int64_t C, int64_t rs, int64_t cs,
                             int64_t br, const float *s, uint8_t *q)
{
    /* read only when given */
    quantize(f, bf16, true, x, R, C, rs, cs, br, q, (float *)s);
}

/* ---- 128 x 1 tiles --------------------------------------------------------- */

typedef struct cjob {
    const finfo *f;
    bool bf16;
    enum qpath path;
    const void *x;
    int64_t R, C, ldx, CB; /* CB: column blocks of a unit */
    uint8_t *q;
    float *s;
} cjob;

#define CBLK 256

static float cval(const cjob *j, int64_t r, int64_t c)
{
    int64_t at = r * j->ldx + c;
    return j->bf16 ? zs_bf16_to_f32(((const uint16_t *)j->x)[at])
                   : ((const float *)j->x)[at];
}

static void cols_portable(const cjob *j, int64_t r0, int64_t r1, int64_t c0,
                          int64_t c1)
{
    for (int64_t c = c0; c < c1; c++) {
        float amax = 0.0f;
        for (int64_t r = r0; r < r1; r++)
            amax = fmaxf(amax, fabsf(cval(j, r, c)));
        float s = scale_of(j->f, amax);
        j->s[(r0 / ZSK_FP8_TILE) * j->C + c] = s;
        for (int64_t r = r0; r < r1; r++)
            j->q[r * j->C + c] = quant1(j->f, cval(j, r, c), (double)s);
    }
}

T512 static INL __m512i load16(const cjob *j, int64_t r, int64_t c,
                               __mmask16 m)
{
    int64_t at = r * j->ldx + c;
    if (j->bf16)
        return _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(
                                     m, (const uint16_t *)j->x + at)), 16);
    return _mm512_maskz_loadu_epi32(m, (const float *)j->x + at);
}

/* scale_of on 16 lanes (the same f32 division). */
T512 static INL __m512 scales16(const finfo *f, __m512 amax)
{
    __m512 z = _mm512_setzero_ps();
    __m512 s = _mm512_div_ps(amax, _mm512_set1_ps(f->fmax));
    s = _mm512_mask_mov_ps(s, _mm512_cmp_ps_mask(s, z, _CMP_EQ_OQ),
                           _mm512_set1_ps(0x1p-149f));
    return _mm512_mask_mov_ps(s, _mm512_cmp_ps_mask(amax, z, _CMP_EQ_OQ),
                              _mm512_set1_ps(1.0f));
}

T512 static void cols_avx512(const cjob *j, int64_t r0, int64_t r1,
                             int64_t c0, int64_t c1)
{
    __m512i abs = _mm512_set1_epi32(0x7fffffff);
    for (int64_t c = c0; c < c1; c += 16) {
        __mmask16 m = mask16(c1 - c);
        __m512 acc = _mm512_setzero_ps();
        for (int64_t r = r0; r < r1; r++) /* NaN first: the second wins */
            acc = _mm512_max_ps(_mm512_castsi512_ps(_mm512_and_si512(
                                    load16(j, r, c, m), abs)), acc);
        __m512 sv = scales16(j->f, acc);
        _mm512_mask_storeu_ps(j->s + (r0 / ZSK_FP8_TILE) * j->C + c, m, sv);
        for (int64_t r = r0; r < r1; r++)
            _mm_mask_storeu_epi8(j->q + r * j->C + c, m,
                                 q16_avx512(j->f, load16(j, r, c, m), sv));
    }
}

T256 static INL __m256i load8(const cjob *j, int64_t r, int64_t c)
{
    int64_t at = r * j->ldx + c;
    if (j->bf16)
        return _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(
                                     (const __m128i *)((const uint16_t *)j->x + at))), 16);
    return _mm256_loadu_si256((const __m256i *)((const float *)j->x + at));
}

T256 static void cols_avx2(const cjob *j, int64_t r0, int64_t r1, int64_t c0,
                           int64_t c1)
{
    __m256i abs = _mm256_set1_epi32(0x7fffffff);
    __m256 z = _mm256_setzero_ps();
    int64_t c = c0;
    for (; c + 8 <= c1; c += 8) {
        __m256 acc = z;
        for (int64_t r = r0; r < r1; r++) /* NaN first: the second wins */
            acc = _mm256_max_ps(_mm256_castsi256_ps(_mm256_and_si256(
                                    load8(j, r, c), abs)), acc);
        __m256 sv = _mm256_div_ps(acc, _mm256_set1_ps(j->f->fmax));
        sv = _mm256_blendv_ps(sv, _mm256_set1_ps(0x1p-149f),
                              _mm256_cmp_ps(sv, z, _CMP_EQ_OQ));
        sv = _mm256_blendv_ps(sv, _mm256_set1_ps(1.0f),
                              _mm256_cmp_ps(acc, z, _CMP_EQ_OQ));
        _mm256_storeu_ps(j->s + (r0 / ZSK_FP8_TILE) * j->C + c, sv);
        for (int64_t r = r0; r < r1; r++)
            _mm_storel_epi64((__m128i *)(j->q + r * j->C + c),
                             q8_avx2(j->f, load8(j, r, c), sv));
    }
    cols_portable(j, r0, r1, c, c1);
}

/* Units: 128 rows x CBLK columns. */
static void cols_units(void *p, int64_t u0, int64_t u1)
{
    const cjob *j = p;
    for (int64_t u = u0; u < u1; u++) {
        int64_t r0 = u / j->CB * ZSK_FP8_TILE, c0 = u % j->CB * CBLK;
        int64_t r1 = r0 + ZSK_FP8_TILE < j->R ? r0 + ZSK_FP8_TILE : j->R;
        int64_t c1 = c0 + CBLK < j->C ? c0 + CBLK : j->C;
        if (j->path == Q_AVX512)
            cols_avx512(j, r0, r1, c0, c1);
        else if (j->path == Q_AVX2)
            cols_avx2(j, r0, r1, c0, c1);
        else
            cols_portable(j, r0, r1, c0, c1);
    }
}

void zsk_fp8_quantize_cols(zsk_fp8_fmt f, bool bf16, const void *x,
                           int64_t R, int64_t C, int64_t ldx, uint8_t *q,
                           float *s)
{
    if (R <= 0 || C <= 0)
        return;
    cjob j = {&FI[f], bf16, qpath(), x, R, C, ldx,
              zsk_fp8_groups(C, CBLK), q, s};
    int64_t units = zsk_fp8_groups(R, ZSK_FP8_TILE) * j.CB;
    zs_parallel_for(units, ZSK_GRAIN / (ZSK_FP8_TILE * CBLK) + 1, cols_units, &j);
}

/* ---- dequantize -------------------------------------------------------------- */

typedef struct djob {
    const float *tab;
    const uint8_t *q;
    int64_t C, ldq, br, KB;
    const float *s;
    float *y;
} djob;

static ZSK_ISA_VOID(dequant_rows, (void *p, int64_t r0, int64_t r1),
    (p, r0, r1))
{
    const djob *j = p;
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *q = j->q + r * j->ldq;
        const float *s = j->s + (r / j->br) * j->KB;
        float *y = j->y + r * j->C;
        for (int64_t c0 = 0; c0 < j->C; c0 += ZSK_FP8_TILE) {
            int64_t n = j->C - c0 < ZSK_FP8_TILE ? j->C - c0 : ZSK_FP8_TILE;
            float sv = s[c0 / ZSK_FP8_TILE];
            for (int64_t i = 0; i < n; i++)
                y[c0 + i] = j->tab[q[c0 + i]] * sv;
        }
    }
}

void zsk_fp8_dequantize(zsk_fp8_fmt f, const uint8_t *q, int64_t R,
                        int64_t C, int64_t ldq, int64_t br, const float *s,
                        float *y)
{
    if (R <= 0 || C <= 0)
        return;
    djob j = {f32_table(f), q, C, ldq, br < 1 ? 1 : br,
              zsk_fp8_groups(C, ZSK_FP8_TILE), s, y};
    zs_parallel_for(R, ZSK_GRAIN / C + 1, dequant_rows, &j);
}

/* ---- widening to bf16 -------------------------------------------------------- */

/* 32 codes (one per 16-bit lane) to bf16 through the 128 magnitudes in
 * t0..t3 (vpermi2w on 64 entries each) and the sign bit. */
T512 static void widen_avx512(const uint16_t *tab, const uint8_t *in,
                              int64_t n, uint16_t *out)
{
    __m512i t0 = _mm512_loadu_si512(tab), t1 = _mm512_loadu_si512(tab + 32);
    __m512i t2 = _mm512_loadu_si512(tab + 64), t3 = _mm512_loadu_si512(tab + 96);
    __m512i m7f = _mm512_set1_epi16(0x7f), m40 = _mm512_set1_epi16(0x40);
    __m512i m80 = _mm512_set1_epi16(0x80);
    for (int64_t i = 0; i < n; i += 32) {
        __mmask32 m = mask32(n - i);
        __m512i v = _mm512_cvtepu8_epi16(_mm256_maskz_loadu_epi8(m, in + i));
        __m512i mag = _mm512_and_si512(v, m7f);
        __m512i lo = _mm512_permutex2var_epi16(t0, mag, t1);
        __m512i hi = _mm512_permutex2var_epi16(t2, mag, t3);
        __m512i r = _mm512_mask_blend_epi16(_mm512_test_epi16_mask(mag, m40),
                                            lo, hi);
        r = _mm512_or_si512(r, _mm512_slli_epi16(_mm512_and_si512(v, m80), 8));
        _mm512_mask_storeu_epi16(out + i, m, r);
    }
}

void zsk_fp8_to_bf16(zsk_fp8_fmt f, const uint8_t *in, int64_t n,
                     uint16_t *out)
{
    const uint16_t *tab = bf16_table(f);
    if (use_avx512()) {
        widen_avx512(tab, in, n, out);
        return;
    }
    for (int64_t i = 0; i < n; i++)
        out[i] = tab[in[i]];
}
