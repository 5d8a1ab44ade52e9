/*
 * kernels/cpu/quant.c - Q8_0 / Q4_0 / Q4_1 (de)quantization and the
 * quantized matrix product; formats and contracts in quant.h.
 *
 * zsk_qmatmul: x's rows are quantized once into zsk_block_q8x (a malloc'd
 * buffer of M * K / 32 blocks), then the pool splits W's N rows; each
 * weight row is read once and dotted with all M activation rows while it
 * sits in L1 (K = 4096: 4.3 KB in Q8_0). One dot function per format and
 * path; the VNNI and AVX2 ones (x86-64 only, chosen at run time by
 * zs_cpu(), capped by ZS_CPU_ISA) keep 8 f32 lanes of scaled block sums and reduce
 * once per dot; the AVX2 ones make the VNNI ones' int32 lanes with
 * vpmaddubsw + vpmaddwd and so give their bits.
 *
 * Measured (bench/quant, M = 1, N = K = 4096, 2 threads, Zen 5 EPYC): Q8_0
 * 0.29 ms (61 GB/s of weights), Q4_0 0.34 ms (28 GB/s), Q4_1 0.41 ms,
 * f32 zsk_sgemm 1.8 ms (37 GB/s); portable C 1.0 / 1.5 / 1.9 ms. The VNNI
 * loops are bound by per-block work, not bandwidth (1 thread: half the
 * speed); a zmm version with two blocks per vector was slower.
 */
#include "kernels/cpu/quant.h"

#include "kernels/cpu/kernels.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>
#define ZSK_QUANT_VNNI 1
#define VNNI __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")))
#define AVX2 __attribute__((target("avx2,fma,f16c")))
#endif

_Static_assert(sizeof(zsk_block_q8_0) == ZSK_Q8_0_BYTES, "q8_0 block size");
_Static_assert(sizeof(zsk_block_q4_0) == ZSK_Q4_0_BYTES, "q4_0 block size");
_Static_assert(sizeof(zsk_block_q4_1) == ZSK_Q4_1_BYTES, "q4_1 block size");

/* Scale to f16, finite: saturates at 65504. */
static uint16_t scale_f16(float d)
{
    uint16_t h = zs_f32_to_f16(d);
    if ((h & 0x7fffu) == 0x7c00u)
        h = (uint16_t)((h & 0x8000u) | 0x7bffu);
    return h;
}

/* round(v) (halves away from zero, as roundf) clamped to [lo, hi], as a
 * float: NaN gives lo. truncf, selects and max/min-shaped compares instead
 * of roundf and branches, so that loops over it vectorize (v - t is exact;
 * "a > b ? a : b" is what maxps computes, NaN included). */
static inline float round_clamp(float v, float lo, float hi)
{
    float t = truncf(v), f = v - t;
    t += (f >= 0.5f ? 1.0f : 0.0f) - (f <= -0.5f ? 1.0f : 0.0f);
    t = t > lo ? t : lo;
    return t < hi ? t : hi;
}

/* round_clamp as an int (never out of range). */
static inline int clampi(float v, int lo, int hi)
{
    return (int)round_clamp(v, (float)lo, (float)hi);
}

/* Whole blocks only; pointers needed when n > 0. */
static zs_status check_n(const char *what, int64_t n, const void *a,
                         const void *b)
{
    if (n < 0 || n % ZSK_QBLOCK != 0)
        return zs_set_error("%s: n = %lld is not a non-negative multiple of %d",
                            what, (long long)n, ZSK_QBLOCK);
    if (n > 0 && (!a || !b))
        return zs_set_error("%s: NULL pointer", what);
    return ZS_OK;
}

int64_t zsk_qblock_bytes(zsk_qfmt fmt)
{
    switch (fmt) {
    case ZSK_Q8_0: return ZSK_Q8_0_BYTES;
    case ZSK_Q4_0: return ZSK_Q4_0_BYTES;
    case ZSK_Q4_1: return ZSK_Q4_1_BYTES;
    }
    return 0;
}

/* ---- quantize / dequantize --------------------------------------------- */

zs_status zsk_quantize_q8_0(const float *w, int64_t n, void *out)
{
    zs_status st = check_n("quantize_q8_0", n, w, out);
    if (st < 0)
        return st;
    for (int64_t b = 0; b < n / ZSK_QBLOCK; b++) {
        const float *v = w + b * ZSK_QBLOCK;
        zsk_block_q8_0 blk;
        float amax = 0;
        for (int i = 0; i < ZSK_QBLOCK; i++)
            amax = fmaxf(amax, fabsf(v[i]));
        blk.d = scale_f16(amax / 127.0f);
        float d = zs_f16_to_f32(blk.d);
        float id = d > 0 ? 1.0f / d : 0.0f;
        for (int i = 0; i < ZSK_QBLOCK; i++)
            blk.q[i] = (int8_t)clampi(v[i] * id, -127, 127);
        memcpy((char *)out + b * ZSK_Q8_0_BYTES, &blk, sizeof blk);
    }
    return ZS_OK;
}

zs_status zsk_quantize_q4_0(const float *w, int64_t n, void *out)
{
    zs_status st = check_n("quantize_q4_0", n, w, out);
    if (st < 0)
        return st;
    for (int64_t b = 0; b < n / ZSK_QBLOCK; b++) {
        const float *v = w + b * ZSK_QBLOCK;
        zsk_block_q4_0 blk;
        float amax = 0, vmax = 0;
        for (int i = 0; i < ZSK_QBLOCK; i++) {
            if (fabsf(v[i]) > amax) {
                amax = fabsf(v[i]);
                vmax = v[i];
            }
        }
        blk.d = scale_f16(vmax / -8.0f);
        float d = zs_f16_to_f32(blk.d);
        float id = d != 0 ? 1.0f / d : 0.0f;
        for (int i = 0; i < 16; i++) {
            int lo = clampi(v[i] * id, -8, 7) + 8;
            int hi = clampi(v[i + 16] * id, -8, 7) + 8;
            blk.qs[i] = (uint8_t)(lo | hi << 4);
        }
        memcpy((char *)out + b * ZSK_Q4_0_BYTES, &blk, sizeof blk);
    }
    return ZS_OK;
}

zs_status zsk_quantize_q4_1(const float *w, int64_t n, void *out)
{
    zs_status st = check_n("quantize_q4_1", n, w, out);
    if (st < 0)
        return st;
    for (int64_t b = 0; b < n / ZSK_QBLOCK; b++) {
        const float *v = w + b * ZSK_QBLOCK;
        zsk_block_q4_1 blk;
        float lo = v[0], hi = v[0];
        for (int i = 1; i < ZSK_QBLOCK; i++) {
            lo = fminf(lo, v[i]);
            hi = fmaxf(hi, v[i]);
        }
        blk.d = scale_f16((hi - lo) / 15.0f);
        blk.m = scale_f16(lo);
        float d = zs_f16_to_f32(blk.d), m = zs_f16_to_f32(blk.m);
        float id = d > 0 ? 1.0f / d : 0.0f;
        for (int i = 0; i < 16; i++) {
            int a = clampi((v[i] - m) * id, 0, 15);
            int c = clampi((v[i + 16] - m) * id, 0, 15);
            blk.qs[i] = (uint8_t)(a | c << 4);
        }
        memcpy((char *)out + b * ZSK_Q4_1_BYTES, &blk, sizeof blk);
    }
    return ZS_OK;
}

zs_status zsk_dequantize_q8_0(const void *in, int64_t n, float *out)
{
    zs_status st = check_n("dequantize_q8_0", n, in, out);
    if (st < 0)
        return st;
    for (int64_t b = 0; b < n / ZSK_QBLOCK; b++) {
        zsk_block_q8_0 blk;
        memcpy(&blk, (const char *)in + b * ZSK_Q8_0_BYTES, sizeof blk);
        float d = zs_f16_to_f32(blk.d);
        for (int i = 0; i < ZSK_QBLOCK; i++)
            out[b * ZSK_QBLOCK + i] = d * blk.q[i];
    }
    return ZS_OK;
}

zs_status zsk_dequantize_q4_0(const void *in, int64_t n, float *out)
{
    zs_status st = check_n("dequantize_q4_0", n, in, out);
    if (st < 0)
        return st;
    for (int64_t b = 0; b < n / ZSK_QBLOCK; b++) {
        zsk_block_q4_0 blk;
        memcpy(&blk, (const char *)in + b * ZSK_Q4_0_BYTES, sizeof blk);
        float d = zs_f16_to_f32(blk.d);
        float *o = out + b * ZSK_QBLOCK;
        for (int i = 0; i < 16; i++) {
            o[i] = d * ((blk.qs[i] & 15) - 8);
            o[i + 16] = d * ((blk.qs[i] >> 4) - 8);
        }
    }
    return ZS_OK;
}

zs_status zsk_dequantize_q4_1(const void *in, int64_t n, float *out)
{
    zs_status st = check_n("dequantize_q4_1", n, in, out);
    if (st < 0)
        return st;
    for (int64_t b = 0; b < n / ZSK_QBLOCK; b++) {
        zsk_block_q4_1 blk;
        memcpy(&blk, (const char *)in + b * ZSK_Q4_1_BYTES, sizeof blk);
        float d = zs_f16_to_f32(blk.d), m = zs_f16_to_f32(blk.m);
        float *o = out + b * ZSK_QBLOCK;
        for (int i = 0; i < 16; i++) {
            o[i] = d * (blk.qs[i] & 15) + m;
            o[i + 16] = d * (blk.qs[i] >> 4) + m;
        }
    }
    return ZS_OK;
}

zs_status zsk_quantize(zsk_qfmt fmt, const float *w, int64_t n, void *out)
{
    switch (fmt) {
    case ZSK_Q8_0: return zsk_quantize_q8_0(w, n, out);
    case ZSK_Q4_0: return zsk_quantize_q4_0(w, n, out);
    case ZSK_Q4_1: return zsk_quantize_q4_1(w, n, out);
    }
    return zs_set_error("quantize: unknown format %d", (int)fmt);
}

zs_status zsk_dequantize(zsk_qfmt fmt, const void *in, int64_t n, float *out)
{
    switch (fmt) {
    case ZSK_Q8_0: return zsk_dequantize_q8_0(in, n, out);
    case ZSK_Q4_0: return zsk_dequantize_q4_0(in, n, out);
    case ZSK_Q4_1: return zsk_dequantize_q4_1(in, n, out);
    }
    return zs_set_error("dequantize: unknown format %d", (int)fmt);
}

/* The blocks of zsk_quantize_q8x, portable. */
static void q8x_blocks_c(const float *x, int64_t nb, zsk_block_q8x *out)
{
    for (int64_t b = 0; b < nb; b++) {
        const float *v = x + b * ZSK_QBLOCK;
        zsk_block_q8x *o = out + b;
        float amax = 0;
        for (int i = 0; i < ZSK_QBLOCK; i++) /* NaN skipped, as fmaxf */
            amax = fabsf(v[i]) > amax ? fabsf(v[i]) : amax;
        o->d = amax / 127.0f;
        float id = o->d > 0 ? 1.0f / o->d : 0.0f;
        int32_t s = 0;
        for (int i = 0; i < ZSK_QBLOCK; i++) {
            int q = clampi(v[i] * id, -127, 127);
            o->q[i] = (int8_t)q;
            s += q;
        }
        o->s = s;
    }
}

#ifdef ZSK_QUANT_VNNI
/* 16 values of round_clamp(v * id, -127, 127) as int32, the same
 * operations lane-wise (maxps / minps are "a > b ? a : b" / "a < b ? a :
 * b"; adding 0 is skipped, which only turns -0 into +0 before the int). */
VNNI static __m512i q8x_lanes(__m512 v, __m512 id)
{
    __m512 x = _mm512_mul_ps(v, id);
    __m512 t = _mm512_roundscale_ps(x, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    __m512 f = _mm512_sub_ps(x, t), one = _mm512_set1_ps(1.0f);
    t = _mm512_mask_add_ps(t, _mm512_cmp_ps_mask(f, _mm512_set1_ps(0.5f), _CMP_GE_OQ), t, one);
    t = _mm512_mask_sub_ps(t, _mm512_cmp_ps_mask(f, _mm512_set1_ps(-0.5f), _CMP_LE_OQ), t,
                           one);
    t = _mm512_max_ps(t, _mm512_set1_ps(-127.0f));
    t = _mm512_min_ps(t, _mm512_set1_ps(127.0f));
    return _mm512_cvttps_epi32(t);
}

/* The blocks of zsk_quantize_q8x, AVX-512: the portable loop's values. */
VNNI static void q8x_blocks_avx512(const float *x, int64_t nb, zsk_block_q8x *out)
{
    for (int64_t b = 0; b < nb; b++) {
        __m512 v0 = _mm512_loadu_ps(x + b * ZSK_QBLOCK);
        __m512 v1 = _mm512_loadu_ps(x + b * ZSK_QBLOCK + 16);
        /* maxps(a, m) keeps m where a is NaN: NaN skipped, as fmaxf. */
        __m512 m = _mm512_max_ps(_mm512_abs_ps(v0), _mm512_setzero_ps());
        m = _mm512_max_ps(_mm512_abs_ps(v1), m);
        zsk_block_q8x *o = out + b;
        o->d = _mm512_reduce_max_ps(m) / 127.0f;
        __m512 id = _mm512_set1_ps(o->d > 0 ? 1.0f / o->d : 0.0f);
        __m512i q0 = q8x_lanes(v0, id), q1 = q8x_lanes(v1, id);
        _mm_storeu_si128((__m128i *)o->q, _mm512_cvtepi32_epi8(q0));
        _mm_storeu_si128((__m128i *)(o->q + 16), _mm512_cvtepi32_epi8(q1));
        o->s = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
    }
}

/* 8 values of round_clamp(v * id, -127, 127) as int32, q8x_lanes on ymm:
 * the compares give all-ones lanes, so and-ing them with 1.0 adds or
 * subtracts 1 or 0 (0 only turns -0 into +0); maxps / minps keep their
 * second operand for NaN, as the portable "t > lo ? t : lo" does. */
AVX2 static inline __m256i q8x_lanes8(__m256 v, __m256 id)
{
    __m256 x = _mm256_mul_ps(v, id);
    __m256 t = _mm256_round_ps(x, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    __m256 f = _mm256_sub_ps(x, t), one = _mm256_set1_ps(1.0f);
    __m256 up = _mm256_and_ps(_mm256_cmp_ps(f, _mm256_set1_ps(0.5f), _CMP_GE_OQ), one);
    __m256 dn = _mm256_and_ps(_mm256_cmp_ps(f, _mm256_set1_ps(-0.5f), _CMP_LE_OQ), one);
    t = _mm256_sub_ps(_mm256_add_ps(t, up), dn);
    t = _mm256_max_ps(t, _mm256_set1_ps(-127.0f));
    t = _mm256_min_ps(t, _mm256_set1_ps(127.0f));
    return _mm256_cvttps_epi32(t);
}

/* The blocks of zsk_quantize_q8x, AVX2: the portable loop's values (the
 * test compares them bit for bit). Decode quantizes one row per linear
 * layer on the calling thread before the pool splits the weights, so on
 * CPUs without AVX-512 this loop was serial time in every layer. */
AVX2 static void q8x_blocks_avx2(const float *x, int64_t nb, zsk_block_q8x *out)
{
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int64_t b = 0; b < nb; b++) {
        const float *p = x + b * ZSK_QBLOCK;
        __m256 v[4], m = _mm256_setzero_ps();
        for (int i = 0; i < 4; i++) { /* NaN skipped, as fmaxf */
            v[i] = _mm256_loadu_ps(p + 8 * i);
            m = _mm256_max_ps(_mm256_andnot_ps(sign, v[i]), m);
        }
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        h = _mm_max_ss(h, _mm_movehdup_ps(h));
        zsk_block_q8x *o = out + b;
        o->d = _mm_cvtss_f32(h) / 127.0f;
        __m256 id = _mm256_set1_ps(o->d > 0 ? 1.0f / o->d : 0.0f);
        __m256i q[4];
        for (int i = 0; i < 4; i++)
            q[i] = q8x_lanes8(v[i], id);
        /* |q| <= 127: the saturating packs are exact; they interleave the
         * 128-bit lanes, which the permute undoes */
        __m256i q16 = _mm256_packs_epi32(q[0], q[1]), r16 = _mm256_packs_epi32(q[2], q[3]);
        __m256i q8 = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(q16, r16),
                                                 _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256((__m256i *)o->q, q8);
        __m256i s = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]),
                                     _mm256_add_epi32(q[2], q[3]));
        __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
        o->s = _mm_cvtsi128_si32(s4);
    }
}
#endif

static bool force_portable = false;

zs_status zsk_quantize_q8x(const float *x, int64_t n, zsk_block_q8x *out)
{
    zs_status st = check_n("quantize_q8x", n, x, out);
    if (st < 0)
        return st;
#ifdef ZSK_QUANT_VNNI
    if (!force_portable && zsk_quant_has_vnni()) {
        q8x_blocks_avx512(x, n / ZSK_QBLOCK, out);
        return ZS_OK;
    }
    if (!force_portable && zsk_quant_has_avx2()) {
        q8x_blocks_avx2(x, n / ZSK_QBLOCK, out);
        return ZS_OK;
    }
#endif
    q8x_blocks_c(x, n / ZSK_QBLOCK, out);
    return ZS_OK;
}

/* ---- block dot products ------------------------------------------------ */

/* Dot of one quantized weight row (nb blocks) with nb activation blocks. */
typedef float (*dot_fn)(const void *w, const zsk_block_q8x *x, int64_t nb);

/* The portable dots: per block int32 loops over 16 or 32 bytes that the
 * compiler vectorizes (ZSK_ISA_FN variants for AVX-512 / AVX2 / baseline). */
static int32_t dot32(const int8_t *w, const int8_t *x)
{
    int32_t s = 0;
    for (int i = 0; i < ZSK_QBLOCK; i++)
        s += w[i] * x[i];
    return s;
}

/* sum_i (nibble_i - off) * x_i over 16 bytes: low nibbles (shift 0) or
 * high (shift 4). */
static int32_t dot16_nib(const uint8_t *q, int shift, int off, const int8_t *x)
{
    int32_t s = 0;
    /* Complete unrolling (16 trips) would keep the loop vectorizer out. */
#pragma GCC unroll 1
    for (int i = 0; i < 16; i++)
        s += (((q[i] >> shift) & 15) - off) * x[i];
    return s;
}

static ZSK_ISA_FN(float, dot_q8_0_c, (const void *w, const zsk_block_q8x *x,
    int64_t nb), (w, x, nb))
{
    const zsk_block_q8_0 *wb = w;
    float acc = 0;
    for (int64_t b = 0; b < nb; b++)
        acc += zs_f16_to_f32(wb[b].d) * x[b].d * (float)dot32(wb[b].q, x[b].q);
    return acc;
}

static ZSK_ISA_FN(float, dot_q4_0_c, (const void *w, const zsk_block_q8x *x,
    int64_t nb), (w, x, nb))
{
    const zsk_block_q4_0 *wb = w;
    float acc = 0;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *qs = wb[b].qs;
        const int8_t *xq = x[b].q;
        int32_t s = dot16_nib(qs, 0, 8, xq) + dot16_nib(qs, 4, 8, xq + 16);
        acc += zs_f16_to_f32(wb[b].d) * x[b].d * (float)s;
    }
    return acc;
}

static ZSK_ISA_FN(float, dot_q4_1_c, (const void *w, const zsk_block_q8x *x,
    int64_t nb), (w, x, nb))
{
    const zsk_block_q4_1 *wb = w;
    float acc = 0;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *qs = wb[b].qs;
        const int8_t *xq = x[b].q;
        int32_t s = dot16_nib(qs, 0, 0, xq) + dot16_nib(qs, 4, 0, xq + 16);
        acc += zs_f16_to_f32(wb[b].d) * x[b].d * (float)s +
               zs_f16_to_f32(wb[b].m) * x[b].d * (float)x[b].s;
    }
    return acc;
}

#ifdef ZSK_QUANT_VNNI
/* hsum8 and unpack_nibbles need only AVX2, so both paths share them. */
AVX2 static inline float hsum8(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* 32 nibbles of 16 bytes as 32 bytes: low nibbles first. */
AVX2 static inline __m256i unpack_nibbles(const uint8_t *qs)
{
    __m128i v = _mm_loadu_si128((const __m128i *)qs);
    __m128i m = _mm_set1_epi8(15);
    __m128i lo = _mm_and_si128(v, m);
    __m128i hi = _mm_and_si128(_mm_srli_epi16(v, 4), m);
    return _mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1);
}

/* Per 4-byte lane, sum of u * x, u unsigned bytes (Q4_1's nibbles). */
VNNI static __m256i dot_u8(__m256i u, const int8_t *x)
{
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u,
                               _mm256_loadu_si256((const __m256i *)x));
}

/* Per 4-byte lane, sum of w * x for signed w in [-127, 127] (or [-8, 7]):
 * vpdpbusd(|w| unsigned, x with w's sign); x in [-127, 127], so negating
 * it never overflows. Each lane holds a sum of true products, so no large
 * offset terms cancel in f32 (adding 128 to w and subtracting 128 * sum(x)
 * did: a block whose weights round to 0 left lanes of ~1e3 * d_w * d_x). */
VNNI static __m256i dot_signed(__m256i w, const int8_t *x)
{
    __m256i xv = _mm256_loadu_si256((const __m256i *)x);
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_abs_epi8(w),
                               _mm256_sign_epi8(xv, w));
}

/* Signed weight bytes of block b. */
#define W_Q8_0(wb, b) _mm256_loadu_si256((const __m256i *)(wb)[b].q)
#define W_Q4_0(wb, b) _mm256_sub_epi8(unpack_nibbles((wb)[b].qs), _mm256_set1_epi8(8))

/* Two blocks per step into two accumulators (one fmadd chain would bound
 * the loop). DOTS is dot_signed or its AVX2 twin. */
#define DOT_SIGNED_BODY(T, WVEC, DOTS)                                        \
    const T *wb = w;                                                          \
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();            \
    int64_t b = 0;                                                            \
    for (; b + 1 < nb; b += 2) {                                              \
        __m256i p0 = DOTS(WVEC(wb, b), x[b].q);                               \
        __m256i p1 = DOTS(WVEC(wb, b + 1), x[b + 1].q);                       \
        acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p0),                        \
                               _mm256_set1_ps(_cvtsh_ss(wb[b].d) * x[b].d), acc0); \
        acc1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p1),                        \
                               _mm256_set1_ps(_cvtsh_ss(wb[b + 1].d) * x[b + 1].d), \
                               acc1);                                         \
    }                                                                         \
    if (b < nb) {                                                             \
        __m256i p0 = DOTS(WVEC(wb, b), x[b].q);                               \
        acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p0),                        \
                               _mm256_set1_ps(_cvtsh_ss(wb[b].d) * x[b].d), acc0); \
    }                                                                         \
    return hsum8(_mm256_add_ps(acc0, acc1));

/* Q4_1: unsigned nibbles and the minimum term kept apart. DOTU is dot_u8
 * or its AVX2 twin. */
#define DOT_Q4_1_BODY(DOTU)                                                   \
    const zsk_block_q4_1 *wb = w;                                             \
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();            \
    float off0 = 0, off1 = 0;                                                 \
    int64_t b = 0;                                                            \
    for (; b + 1 < nb; b += 2) {                                              \
        __m256i p0 = DOTU(unpack_nibbles(wb[b].qs), x[b].q);                  \
        __m256i p1 = DOTU(unpack_nibbles(wb[b + 1].qs), x[b + 1].q);          \
        acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p0),                        \
                               _mm256_set1_ps(_cvtsh_ss(wb[b].d) * x[b].d), acc0); \
        acc1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p1),                        \
                               _mm256_set1_ps(_cvtsh_ss(wb[b + 1].d) * x[b + 1].d), \
                               acc1);                                         \
        off0 += _cvtsh_ss(wb[b].m) * x[b].d * (float)x[b].s;                  \
        off1 += _cvtsh_ss(wb[b + 1].m) * x[b + 1].d * (float)x[b + 1].s;      \
    }                                                                         \
    if (b < nb) {                                                             \
        __m256i p0 = DOTU(unpack_nibbles(wb[b].qs), x[b].q);                  \
        acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p0),                        \
                               _mm256_set1_ps(_cvtsh_ss(wb[b].d) * x[b].d), acc0); \
        off0 += _cvtsh_ss(wb[b].m) * x[b].d * (float)x[b].s;                  \
    }                                                                         \
    return hsum8(_mm256_add_ps(acc0, acc1)) + (off0 + off1);

VNNI static float dot_q8_0_vnni(const void *w, const zsk_block_q8x *x, int64_t nb)
{
    DOT_SIGNED_BODY(zsk_block_q8_0, W_Q8_0, dot_signed)
}

VNNI static float dot_q4_0_vnni(const void *w, const zsk_block_q8x *x, int64_t nb)
{
    DOT_SIGNED_BODY(zsk_block_q4_0, W_Q4_0, dot_signed)
}

VNNI static float dot_q4_1_vnni(const void *w, const zsk_block_q8x *x, int64_t nb)
{
    DOT_Q4_1_BODY(dot_u8)
}

/* AVX2 + FMA + F16C: vpdpbusd becomes vpmaddubsw (u8 x s8 -> s16 pairs)
 * and vpmaddwd with ones (pairs -> the 4-byte lane's int32). The u8
 * operand is at most 128 (|w|) or 15 (a nibble) and |x| <= 127, so a pair
 * (<= 32512) never saturates and each lane holds the same int32 as
 * vpdpbusd's: the dots give the VNNI ones' bits. */
AVX2 static __m256i dot_u8_avx2(__m256i u, const int8_t *x)
{
    __m256i p = _mm256_maddubs_epi16(u, _mm256_loadu_si256((const __m256i *)x));
    return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}

AVX2 static __m256i dot_signed_avx2(__m256i w, const int8_t *x)
{
    __m256i xv = _mm256_loadu_si256((const __m256i *)x);
    __m256i p = _mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(xv, w));
    return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}

AVX2 static float dot_q8_0_avx2(const void *w, const zsk_block_q8x *x, int64_t nb)
{
    DOT_SIGNED_BODY(zsk_block_q8_0, W_Q8_0, dot_signed_avx2)
}

AVX2 static float dot_q4_0_avx2(const void *w, const zsk_block_q8x *x, int64_t nb)
{
    DOT_SIGNED_BODY(zsk_block_q4_0, W_Q4_0, dot_signed_avx2)
}

AVX2 static float dot_q4_1_avx2(const void *w, const zsk_block_q8x *x, int64_t nb)
{
    DOT_Q4_1_BODY(dot_u8_avx2)
}
#endif

/* ---- dispatch ---------------------------------------------------------- */

bool zsk_quant_force_portable(bool on)
{
    bool old = force_portable;
    force_portable = on;
    return old;
}

bool zsk_quant_has_vnni(void)
{
#ifdef ZSK_QUANT_VNNI
    const zs_cpu_features *f = zs_cpu(); /* capped by ZS_CPU_ISA */
    return f->avx2 && f->fma && f->avx512f && f->avx512bw && f->avx512vl &&
           f->avx512vnni;
#else
    return false;
#endif
}

bool zsk_quant_has_avx2(void)
{
#ifdef ZSK_QUANT_VNNI
    const zs_cpu_features *f = zs_cpu();
    return f->avx2 && f->fma && f->f16c;
#else
    return false;
#endif
}

static dot_fn pick_dot(zsk_qfmt fmt)
{
#ifdef ZSK_QUANT_VNNI
    if (!force_portable && zsk_quant_has_vnni()) {
        switch (fmt) {
        case ZSK_Q8_0: return dot_q8_0_vnni;
        case ZSK_Q4_0: return dot_q4_0_vnni;
        case ZSK_Q4_1: return dot_q4_1_vnni;
        }
    }
    if (!force_portable && zsk_quant_has_avx2()) {
        switch (fmt) {
        case ZSK_Q8_0: return dot_q8_0_avx2;
        case ZSK_Q4_0: return dot_q4_0_avx2;
        case ZSK_Q4_1: return dot_q4_1_avx2;
        }
    }
#endif
    switch (fmt) {
    case ZSK_Q8_0: return dot_q8_0_c;
    case ZSK_Q4_0: return dot_q4_0_c;
    case ZSK_Q4_1: return dot_q4_1_c;
    }
    return NULL;
}

typedef struct qmm_job {
    dot_fn dot;
    const char *W;
    const zsk_block_q8x *xq;
    float *y;
    int64_t M, N, nb, row_bytes;
} qmm_job;

/* Rows [n0, n1) of W against every row of x. */
static void qmm_rows(void *ctx, int64_t n0, int64_t n1)
{
    const qmm_job *j = ctx;
    for (int64_t n = n0; n < n1; n++) {
        const char *wr = j->W + n * j->row_bytes;
        for (int64_t m = 0; m < j->M; m++)
            j->y[m * j->N + n] = j->dot(wr, j->xq + m * j->nb, j->nb);
    }
}

zs_status zsk_qmatmul(zsk_qfmt fmt, const void *W, const float *x, float *y,
                      int64_t M, int64_t N, int64_t K)
{
    int64_t bb = zsk_qblock_bytes(fmt);
    if (bb == 0)
        return zs_set_error("qmatmul: unknown format %d", (int)fmt);
    if (M < 0 || N < 0 || K < 0 || K % ZSK_QBLOCK != 0)
        return zs_set_error("qmatmul: bad sizes M = %lld, N = %lld, K = %lld "
                            "(K must be a multiple of %d)",
                            (long long)M, (long long)N, (long long)K, ZSK_QBLOCK);
    if (M == 0 || N == 0)
        return ZS_OK;
    if (!y || (K > 0 && (!W || !x)))
        return zs_set_error("qmatmul: NULL pointer");
    if (K == 0) {
        memset(y, 0, (size_t)(M * N) * sizeof(float));
        return ZS_OK;
    }
    int64_t nb = K / ZSK_QBLOCK;
    zsk_block_q8x *xq = malloc((size_t)(M * nb) * sizeof *xq);
    if (!xq)
        return zs_set_error_code(ZS_ERR_NOMEM, "qmatmul: out of memory");
    for (int64_t m = 0; m < M; m++)
        zsk_quantize_q8x(x + m * K, K, xq + m * nb);
    qmm_job j = {pick_dot(fmt), W, xq, y, M, N, nb, nb * bb};
    /* ~64K weight-activation products per chunk. */
    int64_t grain = 1 + 65536 / (K * M);
    zs_parallel_for(N, grain, qmm_rows, &j);
    free(xq);
    return ZS_OK;
}
