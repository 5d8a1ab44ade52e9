/*
 * lowp.c - bulk bf16/f16 <-> f32 conversions (see lowp.h).
 *
 * bf16: widening is a 16-bit shift; narrowing adds 0x7fff plus the lowest
 * kept bit (round to nearest even) and sets the quiet bit of NaNs, as
 * zs_f32_to_bf16; both are integer loops that vectorise in the ISA variants.
 * f16: core's row conversions (zsi_f16_widen/narrow, core/dtype.c, which
 * copy.c's casts share): vcvtph2ps / vcvtps2ph (round to nearest even) 8
 * lanes at a time when the CPU has F16C (zs_cpu(), so ZS_CPU_ISA=portable
 * tests the scalar path), the scalar conversions for the tail and without.
 * The F16C path gives the bits of zs_f32_to_f16 except NaN payloads
 * (tests/ops/test_lowp_ops.c).
 */
#include <string.h>

#include "core/internal.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/lowp.h"

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

void zsk_widen16(zs_dtype dt, const uint16_t *src, float *dst, int64_t n)
{
    if (dt == ZS_BF16) {
        widen_bf16(src, dst, n);
        return;
    }
    zsi_f16_widen(src, dst, n);
}

void zsk_narrow16(zs_dtype dt, const float *src, uint16_t *dst, int64_t n)
{
    if (dt == ZS_BF16) {
        narrow_bf16(src, dst, n);
        return;
    }
    zsi_f16_narrow(src, dst, n);
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
