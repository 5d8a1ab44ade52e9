/*
 * lowp.c - bulk bf16/f16 <-> f32 conversions (see lowp.h).
 *
 * bf16: widening is a 16-bit shift; narrowing adds 0x7fff plus the lowest
 * kept bit (round to nearest even) and sets the quiet bit of NaNs, as
 * zs_f32_to_bf16; both are integer loops that vectorise in the ISA variants.
 * f16: vcvtph2ps / vcvtps2ph (round to nearest even) 8 lanes at a time when
 * the CPU has F16C (zs_cpu(), so ZS_CPU_ISA=portable tests the scalar
 * path), the scalar conversions of core for the tail and without F16C.
 * The F16C path gives the bits of zs_f32_to_f16 except NaN payloads
 * (tests/ops/test_lowp_ops.c).
 */
#include <string.h>

#include "kernels/cpu/kernels.h"
#include "kernels/cpu/lowp.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define F16C_FN __attribute__((target("avx,f16c")))
#endif

/* 32-bit views of float arrays (the bit operations of bf16) */
typedef uint32_t u32_alias __attribute__((may_alias));

static ZSK_ISA_VOID(widen_bf16, (const uint16_t *restrict src,
    float *restrict dst, int64_t n), (src, dst, n))
{
    u32_alias *d = (u32_alias *)dst;
    for (int64_t i = 0; i < n; i++)
        d[i] = (uint32_t)src[i] << 16;
}

static ZSK_ISA_VOID(narrow_bf16, (const float *restrict src,
    uint16_t *restrict dst, int64_t n), (src, dst, n))
{
    const u32_alias *s = (const u32_alias *)src;
    for (int64_t i = 0; i < n; i++) {
        uint32_t u = s[i];
        uint32_t nan = (u & 0x7fffffffu) > 0x7f800000u;
        uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
        dst[i] = (uint16_t)(nan ? (u >> 16) | 0x40u : r);
    }
}

#if defined(__x86_64__)
F16C_FN static void widen_f16_f16c(const uint16_t *src, float *dst, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(
                                      _mm_loadu_si128((const __m128i *)(src + i))));
    for (; i < n; i++)
        dst[i] = zs_f16_to_f32(src[i]);
}

F16C_FN static void narrow_f16_f16c(const float *src, uint16_t *dst, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i),
                                         _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++)
        dst[i] = zs_f32_to_f16(src[i]);
}
#endif

static bool have_f16c(void)
{
#if defined(__x86_64__)
    return zs_cpu()->f16c;
#else
    return false;
#endif
}

void zsk_widen16(zs_dtype dt, const uint16_t *src, float *dst, int64_t n)
{
    if (dt == ZS_BF16) {
        widen_bf16(src, dst, n);
        return;
    }
#if defined(__x86_64__)
    if (have_f16c()) {
        widen_f16_f16c(src, dst, n);
        return;
    }
#endif
    for (int64_t i = 0; i < n; i++)
        dst[i] = zs_f16_to_f32(src[i]);
}

void zsk_narrow16(zs_dtype dt, const float *src, uint16_t *dst, int64_t n)
{
    if (dt == ZS_BF16) {
        narrow_bf16(src, dst, n);
        return;
    }
#if defined(__x86_64__)
    if (have_f16c()) {
        narrow_f16_f16c(src, dst, n);
        return;
    }
#endif
    for (int64_t i = 0; i < n; i++)
        dst[i] = zs_f32_to_f16(src[i]);
}

void zsk_widen_any(zs_dtype dt, const void *src, float *dst, int64_t n)
{
    if (dt == ZS_F32)
        memcpy(dst, src, (size_t)n * sizeof(float));
    else if (dt == ZS_F64)
        for (int64_t i = 0; i < n; i++)
            dst[i] = (float)((const double *)src)[i];
    else
        zsk_widen16(dt, src, dst, n);
}

void zsk_narrow_any(zs_dtype dt, const float *src, void *dst, int64_t n)
{
    if (dt == ZS_F32)
        memcpy(dst, src, (size_t)n * sizeof(float));
    else if (dt == ZS_F64)
        for (int64_t i = 0; i < n; i++)
            ((double *)dst)[i] = src[i];
    else
        zsk_narrow16(dt, src, dst, n);
}
