/*
 * dtype.c - element types and scalar conversions.
 *
 * Narrowing conversions round to nearest, ties to even, and keep NaN a NaN
 * (a quiet NaN with the sign bit kept). f8e4m3 (no Inf) saturates to +-448;
 * f8e5m2 overflows to Inf, as in the OCP FP8 specification.
 */
#include <math.h>
#include <string.h>

#include "core/internal.h"
#include "zs/core.h"

static const struct {
    const char *name;
    size_t size;
    bool is_float;
} info[ZS_DTYPE_COUNT] = {
    [ZS_F32] = {"f32", 4, true},       [ZS_F64] = {"f64", 8, true},
    [ZS_F16] = {"f16", 2, true},       [ZS_BF16] = {"bf16", 2, true},
    [ZS_F8E4M3] = {"f8e4m3", 1, true}, [ZS_F8E5M2] = {"f8e5m2", 1, true},
    [ZS_I8] = {"i8", 1, false},        [ZS_U8] = {"u8", 1, false},
    [ZS_I32] = {"i32", 4, false},      [ZS_I64] = {"i64", 8, false},
};

size_t zs_dtype_size(zs_dtype dt)
{
    return (unsigned)dt < ZS_DTYPE_COUNT ? info[dt].size : 0;
}

const char *zs_dtype_name(zs_dtype dt)
{
    return (unsigned)dt < ZS_DTYPE_COUNT ? info[dt].name : "?";
}

bool zs_dtype_is_float(zs_dtype dt)
{
    return (unsigned)dt < ZS_DTYPE_COUNT && info[dt].is_float;
}

int zs_dtype_parse(const char *name)
{
    for (int i = 0; i < ZS_DTYPE_COUNT; i++)
        if (name && strcmp(name, info[i].name) == 0)
            return i;
    return -1;
}

static uint32_t f32_bits(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}

static float bits_f32(uint32_t u)
{
    float x;
    memcpy(&x, &u, 4);
    return x;
}

uint16_t zs_f32_to_bf16(float x)
{
    uint32_t u = f32_bits(x);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float zs_bf16_to_f32(uint16_t x) { return bits_f32((uint32_t)x << 16); }

/* Generic narrowing of a finite float to a format with `mbits` mantissa
 * bits, exponent bias `bias` and largest finite exponent `emax` (unbiased);
 * returns the magnitude bits (no sign), with round-to-nearest-even.
 * Overflow returns `overflow`. Works for f16, e4m3 and e5m2. */
static uint32_t narrow(float ax, int mbits, int bias, int emin, double maxval,
                       uint32_t overflow)
{
    if (ax == 0.0f)
        return 0;
    /* Quantum of the subnormal range: 2^(emin - mbits). */
    int e;
    frexp(ax, &e); /* ax = m * 2^e, m in [0.5, 1) */
    int exp = e - 1; /* ax in [2^exp, 2^(exp+1)) */
    if (exp < emin)
        exp = emin;
    double q = ldexp(1.0, exp - mbits); /* spacing at this exponent */
    double r = nearbyint((double)ax / q) * q; /* ties-to-even (default mode) */
    if (r > maxval)
        return overflow;
    if (r == 0.0)
        return 0;
    frexp(r, &e);
    exp = e - 1;
    if (exp < emin) { /* subnormal */
        return (uint32_t)(r / ldexp(1.0, emin - mbits));
    }
    uint32_t mant = (uint32_t)((r / ldexp(1.0, exp) - 1.0) * (1 << mbits));
    return ((uint32_t)(exp + bias) << mbits) | mant;
}

static float widen(uint32_t mag, int mbits, int bias)
{
    uint32_t ebits = mag >> mbits, mant = mag & ((1u << mbits) - 1);
    if (ebits == 0)
        return (float)ldexp((double)mant, 1 - bias - mbits);
    return (float)ldexp(1.0 + (double)mant / (1 << mbits),
                        (int)ebits - bias);
}

/* Bit operations, no frexp (a quantized checkpoint converts every block
 * scale): the exponent is rebiased and the 13 dropped mantissa bits are
 * rounded to nearest even, a carry walking into the exponent (65520 and up
 * give inf); below 2^-14 adding 0.5 puts the half's quantum 2^-24 at the
 * float's last mantissa bit and the FPU rounds. */
uint16_t zs_f32_to_f16(float f)
{
    uint32_t x = f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    x &= 0x7fffffffu;
    if (x > 0x7f800000u)
        return sign | 0x7e00; /* NaN */
    if (x >= 0x47800000u) /* >= 65536 (inf included) */
        return sign | 0x7c00;
    if (x < 0x38800000u) { /* subnormal half or zero */
        float a, magic = 0.5f;
        memcpy(&a, &x, 4);
        a += magic;
        return sign | (uint16_t)(f32_bits(a) - f32_bits(magic));
    }
    uint32_t odd = (x >> 13) & 1u;
    x += ((uint32_t)(15 - 127) << 23) + 0xfffu + odd;
    return sign | (uint16_t)(x >> 13);
}

float zs_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu, u;
    float f;
    if (e == 0) {
        f = (float)m * 0x1p-24f;
        memcpy(&u, &f, 4);
        u |= sign;
    } else if (e == 31) {
        u = sign | 0x7f800000u | (m << 13);
    } else {
        u = sign | ((e + 112) << 23) | (m << 13);
    }
    memcpy(&f, &u, 4);
    return f;
}

/* Rows of f16 <-> f32: F16C's vcvtph2ps / vcvtps2ph (round to nearest
 * even, as zs_f32_to_f16) 8 at a time where the CPU has it; the scalar
 * conversions for the tail and elsewhere. The casts of --precision fp16
 * (copy.c) and the kernels' widen/narrow (kernels/cpu/lowp.c) run here. */
#if defined(__x86_64__)
#include <immintrin.h>
#define F16C_FN __attribute__((target("avx,f16c")))

F16C_FN static int64_t widen_f16c(const uint16_t *src, float *dst, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
    return i;
}

F16C_FN static int64_t narrow_f16c(const float *src, uint16_t *dst, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    return i;
}
#endif

void zsi_f16_widen(const uint16_t *src, float *dst, int64_t n)
{
    int64_t i = 0;
#if defined(__x86_64__)
    if (zs_cpu()->f16c)
        i = widen_f16c(src, dst, n);
#endif
    for (; i < n; i++)
        dst[i] = zs_f16_to_f32(src[i]);
}

void zsi_f16_narrow(const float *src, uint16_t *dst, int64_t n)
{
    int64_t i = 0;
#if defined(__x86_64__)
    if (zs_cpu()->f16c)
        i = narrow_f16c(src, dst, n);
#endif
    for (; i < n; i++)
        dst[i] = zs_f32_to_f16(src[i]);
}

uint8_t zs_f32_to_f8e4m3(float x)
{
    uint8_t sign = signbit(x) ? 0x80 : 0;
    if (isnan(x))
        return 0x7f;
    float ax = fabsf(x);
    if (ax >= 448.0f) /* saturate (the format has no Inf) */
        return sign | 0x7e;
    uint32_t m = narrow(ax, 3, 7, -6, 448.0, 0x7e);
    return sign | (uint8_t)m;
}

float zs_f8e4m3_to_f32(uint8_t v)
{
    float s = (v & 0x80) ? -1.0f : 1.0f;
    uint32_t mag = v & 0x7fu;
    if (mag == 0x7f)
        return NAN;
    return s * widen(mag, 3, 7);
}

uint8_t zs_f32_to_f8e5m2(float x)
{
    uint8_t sign = signbit(x) ? 0x80 : 0;
    if (isnan(x))
        return 0x7f;
    if (isinf(x))
        return sign | 0x7c;
    return sign | (uint8_t)narrow(fabsf(x), 2, 15, -14, 57344.0, 0x7c);
}

float zs_f8e5m2_to_f32(uint8_t v)
{
    float s = (v & 0x80) ? -1.0f : 1.0f;
    uint32_t mag = v & 0x7fu;
    if ((mag >> 2) == 0x1f)
        return (mag & 3) ? NAN : s * INFINITY;
    return s * widen(mag, 2, 15);
}
