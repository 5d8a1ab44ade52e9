/*
 * kernels/cpu/lowp.h - widening and narrowing of 16-bit floats (bf16, IEEE
 * half) in bulk, for the CPU kernels that read bf16/f16 tensors and
 * compute in f32 (attention, conv, norms, softmax, reductions, ...).
 *
 * The arrays hold raw 16-bit patterns. Narrowing rounds to nearest even
 * and keeps NaN a quiet NaN of the same sign, bit for bit as
 * zs_f32_to_bf16 / zs_f32_to_f16 of include/zs/core.h except for the
 * payload of an f16 NaN (F16C keeps its top bits, the scalar form gives
 * 0x7e00); widening is exact. f16 uses F16C (vcvtph2ps,
 * vcvtps2ph) when zs_cpu() has it, bf16 a shift that vectorises on every
 * path. Single-threaded: callers convert the block they work on.
 */
#ifndef ZS_KERNELS_CPU_LOWP_H
#define ZS_KERNELS_CPU_LOWP_H

#include <stdbool.h>
#include <stdint.h>

#include "zs/core.h"

/* True for the dtypes these helpers take: ZS_BF16 and ZS_F16. */
static inline bool zsk_is_lowp16(zs_dtype dt)
{
    return dt == ZS_BF16 || dt == ZS_F16;
}

/* dst[i] = src[i] as f32, i < n. dt: ZS_BF16 or ZS_F16. */
void zsk_widen16(zs_dtype dt, const uint16_t *src, float *dst, int64_t n);
/* dst[i] = src[i] rounded to dt (nearest even), i < n. */
void zsk_narrow16(zs_dtype dt, const float *src, uint16_t *dst, int64_t n);

/* One element, for scalar loops (the same results as the bulk forms). */
static inline float zsk_ld16(zs_dtype dt, uint16_t h)
{
    return dt == ZS_BF16 ? zs_bf16_to_f32(h) : zs_f16_to_f32(h);
}
static inline uint16_t zsk_st16(zs_dtype dt, float x)
{
    return dt == ZS_BF16 ? zs_f32_to_bf16(x) : zs_f32_to_f16(x);
}

/* An element of a float tensor of dtype dt (f32, f64, bf16 or f16) as a
 * float / double, and a store that rounds to dt: for the scalar loops of
 * mixed-dtype kernels (a bf16 x with an f32 weight). */
static inline float zsk_ldf(zs_dtype dt, const void *p, int64_t i)
{
    switch (dt) {
    case ZS_F32: return ((const float *)p)[i];
    case ZS_F64: return (float)((const double *)p)[i];
    default: return zsk_ld16(dt, ((const uint16_t *)p)[i]);
    }
}
static inline void zsk_stf(zs_dtype dt, void *p, int64_t i, double x)
{
    switch (dt) {
    case ZS_F32: ((float *)p)[i] = (float)x; break;
    case ZS_F64: ((double *)p)[i] = x; break;
    default: ((uint16_t *)p)[i] = zsk_st16(dt, (float)x); break;
    }
}

/* dst[i] = src[i] as f32 for a float array of dtype dt (f32: a copy). */
void zsk_widen_any(zs_dtype dt, const void *src, float *dst, int64_t n);
/* dst[i] = src[i] rounded to dtype dt (f32: a copy, f64: exact). */
void zsk_narrow_any(zs_dtype dt, const float *src, void *dst, int64_t n);

#endif
