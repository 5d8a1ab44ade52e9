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
 *   NaN quotient gives 0x7f. The AVX-512 path runs exactly these steps on
 *   8 f64 lanes, so both paths give identical bits.
 * amax ignores NaN on both paths (fmaxf; vmaxps returns its second operand
 * when the first is NaN).
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

/* The code of a >= 0 (or NaN), without sign: see the file comment. */
static uint8_t code_of(const finfo *f, double a)
{
    if (a != a)
        return 0x7f;
    uint64_t code;
    if (a >= f->minnorm) {
        int sh = 52 - f->mbits;
        uint64_t u = bits64(a);
        u += ((uint64_t)1 << (sh - 1)) - 1 + ((u >> sh) & 1);
        code = (u >> sh) - ((uint64_t)(1023 - f->bias) << f->mbits);
    } else {
        code = bits64(a + f->magic) - bits64(f->magic);
    }
    return (uint8_t)(code < f->maxcode ? code : f->maxcode);
}

static float scale_of(const finfo *f, float amax)
{
    if (amax == 0.0f)
        return 1.0f;
    float s = amax / f->fmax;
    return s == 0.0f ? 0x1p-149f : s;
}

static float amax_portable(const float *x, int64_t n)
{
    float m = 0.0f;
    for (int64_t i = 0; i < n; i++)
        m = fmaxf(m, fabsf(x[i]));
    return m;
}

static void quant_portable(const finfo *f, const float *x, int64_t n,
                           float s, uint8_t *q)
{
    for (int64_t i = 0; i < n; i++) {
        uint8_t c = code_of(f, (double)fabsf(x[i]) / (double)s);
        q[i] = c == 0x7f ? c : (uint8_t)(c | (signbit(x[i]) ? 0x80 : 0));
    }
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

/* code_of on 8 f64 lanes; *nan gets the lanes whose quotient is NaN. */
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

T512 static void quant_avx512(const finfo *f, const float *x, int64_t n,
                              float s, uint8_t *q)
{
    __m512d vs = _mm512_set1_pd((double)s);
    __m512i abs = _mm512_set1_epi32(0x7fffffff);
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = mask16(n - i);
        __m512i xb = _mm512_maskz_loadu_epi32(m, x + i);
        __m512i ax = _mm512_and_si512(xb, abs);
        __m256 lo = _mm512_castps512_ps256(_mm512_castsi512_ps(ax));
        __m256 hi = _mm256_castsi256_ps(_mm512_extracti64x4_epi64(ax, 1));
        __mmask8 nl, nh;
        __m512i cl = codes8(f, _mm512_div_pd(_mm512_cvtps_pd(lo), vs), &nl);
        __m512i ch = codes8(f, _mm512_div_pd(_mm512_cvtps_pd(hi), vs), &nh);
        __m128i c = _mm_unpacklo_epi64(_mm512_cvtepi64_epi8(cl),
                                       _mm512_cvtepi64_epi8(ch));
        __mmask16 nan = (__mmask16)(nl | (nh << 8));
        __m128i sg = _mm512_cvtepi32_epi8(_mm512_and_si512(
            _mm512_srli_epi32(xb, 24), _mm512_set1_epi32(0x80)));
        c = _mm_or_si128(c, _mm_maskz_mov_epi8((__mmask16)~nan, sg));
        _mm_mask_storeu_epi8(q + i, m, c);
    }
}

static bool use_avx512(void)
{
    const zs_cpu_features *c = zs_cpu();
    return !zsk_fp8_force_portable && c->avx512f && c->avx512bw &&
           c->avx512vl;
}

/* ---- quantize ---------------------------------------------------------------- */

typedef struct qjob {
    const finfo *f;
    bool bf16, vec, given; /* given: the scales are read, not computed */
    const void *x;
    int64_t R, C, ldx, br, KB;
    uint8_t *q;
    float *s;
} qjob;

/* Columns [c0, c0 + n) of row r as f32: in place, or converted into buf. */
static const float *row_seg(const qjob *j, int64_t r, int64_t c0, int64_t n,
                            float *buf)
{
    if (!j->bf16)
        return (const float *)j->x + r * j->ldx + c0;
    const uint16_t *h = (const uint16_t *)j->x + r * j->ldx + c0;
    for (int64_t i = 0; i < n; i++)
        buf[i] = zs_bf16_to_f32(h[i]);
    return buf;
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
            float s = j->s[g * j->KB + t], amax = 0.0f;
            for (int64_t r = r0; r < r1 && !j->given; r++) {
                const float *x = row_seg(j, r, c0, n, buf);
                amax = fmaxf(amax, j->vec ? amax_avx512(x, n)
                                          : amax_portable(x, n));
            }
            if (!j->given)
                j->s[g * j->KB + t] = s = scale_of(j->f, amax);
            for (int64_t r = r0; r < r1; r++) {
                const float *x = row_seg(j, r, c0, n, buf);
                uint8_t *q = j->q + r * j->C + c0;
                if (j->vec)
                    quant_avx512(j->f, x, n, s, q);
                else
                    quant_portable(j->f, x, n, s, q);
            }
        }
    }
}

static void quantize(zsk_fp8_fmt f, bool bf16, bool given, const void *x,
                     int64_t R, int64_t C, int64_t ldx, int64_t br,
                     uint8_t *q, float *s)
{
    if (R <= 0 || C <= 0)
        return;
    if (br < 1)
        br = 1;
    qjob j = {&FI[f], bf16, use_avx512(), given, x, R, C, ldx, br,
              zsk_fp8_groups(C, ZSK_FP8_TILE), q, s};
    int64_t ng = zsk_fp8_groups(R, br);
    int64_t grain = ZSK_GRAIN / (br * C) + 1;
    zs_parallel_for(ng, grain, quant_groups, &j);
}

void zsk_fp8_quantize(zsk_fp8_fmt f, bool bf16, const void *x, int64_t R,
                      int64_t C, int64_t ldx, int64_t br, uint8_t *q,
                      float *s)
{
    quantize(f, bf16, false, x, R, C, ldx, br, q, s);
}

void zsk_fp8_quantize_scaled(zsk_fp8_fmt f, bool bf16, const void *x,
                             int64_t R, int64_t C, int64_t ldx, int64_t br,
                             const float *s, uint8_t *q)
{
    /* read only when given */
    quantize(f, bf16, true, x, R, C, ldx, br, q, (float *)s);
}

/* ---- dequantize -------------------------------------------------------------- */

typedef struct djob {
    const float *tab;
    const uint8_t *q;
    int64_t C, ldq, br, KB;
    const float *s;
    float *y;
} djob;

ZSK_CLONES static void dequant_rows(void *p, int64_t r0, int64_t r1)
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
