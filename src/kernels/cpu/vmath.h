/*
 * kernels/cpu/vmath.h - the float32 exp of the CPU kernels, in one place:
 * one set of constants and one polynomial, in the forms the kernels need
 * (scalar, 16-lane GCC vector, AVX-512 intrinsics). Header-only: every
 * function is static inline, so it inlines into the ISA variants
 * (ZSK_ISA_FN / ZSK_ISA_VOID) and target("avx512f") functions of its callers.
 *
 * exp(x) = 2^n e^r, n = rint(x log2 e), r = x - n ln 2 with ln 2 in two
 * parts (Cody-Waite: n * LN2_HI is exact for |n| < 2^9), e^r for
 * |r| <= ln2/2 by the degree-6 polynomial of Cephes expf,
 * 1 + r + r^2 (P5 + r (P4 + ... + r P0)). Measured max relative error
 * 1.4 ulp on [-87, 88] (2 ulp with FMA contraction). Every caller uses the
 * same degree: no site traded accuracy for speed with a shorter one.
 *
 * The variants differ only in rounding n and in range handling:
 *   zsi_exp_f32         scalar, any x: x < -87 gives 0, x > 88 inf, NaN
 *                       stays NaN; range tests are integer compares on the
 *                       bits, so loops of it vectorise under the default
 *                       -ftrapping-math (softmax.c)
 *   zsi_exp_v16f        the same on 16 lanes, same operations and results
 *                       (softmax.c row loops)
 *   zsi_exp_f32_clamped scalar, x clamped to [-88, 88] (x <= -88 gives 0,
 *                       x >= 88 gives e^88, NaN gives NaN): fewer
 *                       operations where arguments are <= 0 by
 *                       construction (attention.c, x = s - max)
 *   zsi_exp_m512_nc     AVX-512, x in [-104, 89] or NaN, scaled by scalef
 *                       (below -104 it still gives 0 down to about -2^22)
 *   zsi_exp_m512        the same with x clamped to [-104, 89], NaN kept
 *                       (unary.c; gemm_f32_avx512.c clamps only below)
 *   zsi_exp_m256        AVX2 + FMA, 8 lanes, as zsi_exp_f32_clamped
 *                       (paged_attention.c's AVX2 path)
 */
#ifndef ZS_KERNELS_CPU_VMATH_H
#define ZS_KERNELS_CPU_VMATH_H

#include <stdint.h>
#include <string.h>

#define ZSI_EXP_LOG2E 1.44269504088896341f
#define ZSI_EXP_LN2_HI 0.693359375f    /* 355/512: n * HI exact */
#define ZSI_EXP_LN2_LO -2.12194440e-4f /* ln 2 - HI */
#define ZSI_EXP_P0 1.9875691500e-4f
#define ZSI_EXP_P1 1.3981999507e-3f
#define ZSI_EXP_P2 8.3334519073e-3f
#define ZSI_EXP_P3 4.1665795894e-2f
#define ZSI_EXP_P4 1.6666665459e-1f
#define ZSI_EXP_P5 5.0000001201e-1f
/* 1.5 * 2^23: adding and subtracting it rounds a float to an integer */
#define ZSI_EXP_RINT 12582912.0f

/* r = x - n ln 2 and e^r, for float or GCC vector operands (scalars
 * broadcast); r must be a plain variable. */
#define ZSI_EXP_REDUCE(x, n) ((x) - (n) * ZSI_EXP_LN2_HI - (n) * ZSI_EXP_LN2_LO)
#define ZSI_EXP_POLY(r)                                                       \
    ((((((ZSI_EXP_P0 * (r) + ZSI_EXP_P1) * (r) + ZSI_EXP_P2) * (r) +          \
        ZSI_EXP_P3) * (r) + ZSI_EXP_P4) * (r) + ZSI_EXP_P5) * (r) * (r) +     \
     (r) + 1.0f)

#define ZSI_VINLINE static inline __attribute__((always_inline))

ZSI_VINLINE float zsi_exp_f32(float x)
{
    union { float f; uint32_t u; int32_t i; } xb = {x}, xc, t, s, y;
    uint32_t lo = -(uint32_t)(xb.u > 0xC2AE0000u); /* < -87, -inf, -NaN */
    uint32_t hi = -(uint32_t)(xb.i > 0x42B00000);  /* > 88, +inf, +NaN */
    uint32_t nan = -(uint32_t)((xb.u & 0x7FFFFFFFu) > 0x7F800000u);
    xc.u = (lo & 0xC2AE0000u) | (hi & 0x42B00000u) | (~(lo | hi) & xb.u);
    t.f = xc.f * ZSI_EXP_LOG2E + ZSI_EXP_RINT;
    float n = t.f - ZSI_EXP_RINT;
    float r = ZSI_EXP_REDUCE(xc.f, n);
    float p = ZSI_EXP_POLY(r);
    s.u = (t.u - 0x4B400000u + 127u) << 23;
    y.f = p * s.f;
    y.u = (~(lo | hi | nan) & y.u) | (hi & 0x7F800000u) | (nan & xb.u);
    return y.f;
}

/* 64-byte GCC vectors: one zmm on AVX-512, two ymm on AVX2, four xmm on
 * the baseline variant. */
typedef float zsi_v16f __attribute__((vector_size(64)));
typedef int32_t zsi_v16i __attribute__((vector_size(64)));
typedef uint32_t zsi_v16u __attribute__((vector_size(64)));

/* *v = zsi_exp_f32 of each lane (same operations, same results). By
 * pointer: 64-byte vectors passed or returned by value draw ABI notes from
 * GCC on the baseline variant. */
ZSI_VINLINE void zsi_exp_v16f(zsi_v16f *v)
{
    zsi_v16u xb = (zsi_v16u)*v;
    zsi_v16u lo = (zsi_v16u)(xb > 0xC2AE0000u);
    zsi_v16u hi = (zsi_v16u)((zsi_v16i)xb > 0x42B00000);
    zsi_v16u nan = (zsi_v16u)((xb & 0x7FFFFFFFu) > 0x7F800000u);
    zsi_v16f xc = (zsi_v16f)((lo & 0xC2AE0000u) | (hi & 0x42B00000u) |
                             (~(lo | hi) & xb));
    zsi_v16f t = xc * ZSI_EXP_LOG2E + ZSI_EXP_RINT;
    zsi_v16f n = t - ZSI_EXP_RINT;
    zsi_v16f r = ZSI_EXP_REDUCE(xc, n);
    zsi_v16f p = ZSI_EXP_POLY(r);
    zsi_v16u sc = ((zsi_v16u)t - 0x4B400000u + 127u) << 23;
    zsi_v16u y = (zsi_v16u)(p * (zsi_v16f)sc);
    y = (~(lo | hi | nan) & y) | (hi & 0x7F800000u) | (nan & xb);
    *v = (zsi_v16f)y;
}

/* The exponent comes from the bits of the rounding sum in unsigned
 * arithmetic: a float-to-int conversion of NaN (a NaN weight or score)
 * would be undefined behaviour (a fuzzed checkpoint found it). */
ZSI_VINLINE float zsi_exp_f32_clamped(float x)
{
    x = x < -88.0f ? -88.0f : x;
    x = x > 88.0f ? 88.0f : x;
    float t = x * ZSI_EXP_LOG2E + ZSI_EXP_RINT, n = t - ZSI_EXP_RINT;
    float r = ZSI_EXP_REDUCE(x, n);
    float y = ZSI_EXP_POLY(r);
    uint32_t tb, e;
    memcpy(&tb, &t, sizeof tb);
    e = (tb - 0x4B400000u + 127u) << 23; /* n = -127 gives 0 */
    float s;
    memcpy(&s, &e, sizeof s);
    return y * s;
}

#if defined(__x86_64__)
#include <immintrin.h>

#define ZSI_AVX512 static inline __attribute__((target("avx512f"), always_inline))
#define ZSI_SPLAT(c) _mm512_set1_ps(c)

ZSI_AVX512 __m512 zsi_exp_m512_nc(__m512 x)
{
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, ZSI_SPLAT(ZSI_EXP_LOG2E)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, ZSI_SPLAT(ZSI_EXP_LN2_HI), x);
    r = _mm512_fnmadd_ps(n, ZSI_SPLAT(ZSI_EXP_LN2_LO), r);
    __m512 p = ZSI_SPLAT(ZSI_EXP_P0);
    p = _mm512_fmadd_ps(p, r, ZSI_SPLAT(ZSI_EXP_P1));
    p = _mm512_fmadd_ps(p, r, ZSI_SPLAT(ZSI_EXP_P2));
    p = _mm512_fmadd_ps(p, r, ZSI_SPLAT(ZSI_EXP_P3));
    p = _mm512_fmadd_ps(p, r, ZSI_SPLAT(ZSI_EXP_P4));
    p = _mm512_fmadd_ps(p, r, ZSI_SPLAT(ZSI_EXP_P5));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, ZSI_SPLAT(1.0f)));
    return _mm512_scalef_ps(p, n);
}

/* min(max(x, -104), 89): max and min return their second operand, x, for
 * NaN, so NaN stays NaN. */
ZSI_AVX512 __m512 zsi_exp_m512(__m512 x)
{
    x = _mm512_min_ps(ZSI_SPLAT(89.0f), _mm512_max_ps(ZSI_SPLAT(-104.0f), x));
    return zsi_exp_m512_nc(x);
}

#define ZSI_AVX2 static inline __attribute__((target("avx2,fma"), always_inline))

/* exp of 8 lanes (AVX2 + FMA): the polynomial above with x
 * clamped to [-88, 88] and the scale built from the bits of the rounding
 * sum, as zsi_exp_f32_clamped (x <= -88 gives 0). */
ZSI_AVX2 __m256 zsi_exp_m256(__m256 x)
{
    x = _mm256_min_ps(_mm256_set1_ps(88.0f), _mm256_max_ps(_mm256_set1_ps(-88.0f), x));
    __m256 t = _mm256_fmadd_ps(x, _mm256_set1_ps(ZSI_EXP_LOG2E), _mm256_set1_ps(ZSI_EXP_RINT));
    __m256 n = _mm256_sub_ps(t, _mm256_set1_ps(ZSI_EXP_RINT));
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(ZSI_EXP_LN2_HI), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(ZSI_EXP_LN2_LO), r);
    __m256 p = _mm256_set1_ps(ZSI_EXP_P0);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(ZSI_EXP_P1));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(ZSI_EXP_P2));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(ZSI_EXP_P3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(ZSI_EXP_P4));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(ZSI_EXP_P5));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(
        _mm256_add_epi32(_mm256_sub_epi32(_mm256_castps_si256(t),
                                          _mm256_set1_epi32(0x4B400000)),
                         _mm256_set1_epi32(127)),
        23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}
#endif

#endif
