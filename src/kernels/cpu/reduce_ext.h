/*
 * kernels/cpu/reduce_ext.h - max, argmax, variance and squared-error
 * reductions on raw pointers.
 *
 * Like zsk_reduce_sum, the reductions see their input as a contiguous
 * [O, R, K] array reduced over R into [O, K]. dt is ZS_F32 or ZS_F64 and
 * every float array has that dtype unless stated. Multithreaded over the
 * pool: over rows when K == 1 (R itself split into parts when there are
 * fewer rows than threads), over (o, k-strip) when K > 1.
 *
 * NaN: a NaN counts as the maximum (the first NaN along R wins), as in
 * PyTorch.
 */
#ifndef ZS_KERNELS_CPU_REDUCE_EXT_H
#define ZS_KERNELS_CPU_REDUCE_EXT_H

#include <stdint.h>

#include "zs/core.h"

/* Order-preserving integer keys of floats: for non-NaN a, b, a < b implies
 * key(a) < key(b) (and -0 < +0); every NaN maps to the largest key, so an
 * integer max treats NaN as the maximum, and unkey(largest) is a NaN. Max
 * loops run on keys because integer compares vectorise where float
 * compares do not (under the default -ftrapping-math). */
static inline int32_t zsk_key_f32(float x)
{
    union { float f; int32_t i; uint32_t u; } b = {x};
    int32_t k = b.i ^ ((b.i >> 31) & 0x7FFFFFFF);
    int32_t nan = -(int32_t)((b.u & 0x7FFFFFFFu) > 0x7F800000u);
    return (k & ~nan) | (INT32_MAX & nan); /* masks: no branch */
}

static inline float zsk_unkey_f32(int32_t k)
{
    union { int32_t i; float f; } b = {k ^ ((k >> 31) & 0x7FFFFFFF)};
    return b.f;
}

static inline int64_t zsk_key_f64(double x)
{
    union { double f; int64_t i; uint64_t u; } b = {x};
    int64_t k = b.i ^ ((b.i >> 63) & INT64_MAX);
    int64_t nan = -(int64_t)((b.u & (uint64_t)INT64_MAX) > 0x7FF0000000000000u);
    return (k & ~nan) | (INT64_MAX & nan);
}

static inline double zsk_unkey_f64(int64_t k)
{
    union { int64_t i; double f; } b = {k ^ ((k >> 63) & INT64_MAX)};
    return b.f;
}

/* out[o, k] = max_r x[o, r, k]; idx (may be NULL) receives the index r of
 * the first maximum. out may be NULL when only idx is wanted. R >= 1. */
void zsk_reduce_max(zs_dtype dt, const void *x, int64_t O, int64_t R,
                    int64_t K, void *out, int64_t *idx);

/* Gradient of max over R: gx[o, r, k] = g[o, k] / t[o, k] where
 * x[o, r, k] equals y[o, k] (t = the number of such r, ties share the
 * gradient equally), else 0. y and g: [O, K]; gx: [O, R, K]. */
void zsk_reduce_max_backward(zs_dtype dt, const void *x, const void *y,
                             const void *g, int64_t O, int64_t R, int64_t K,
                             void *gx);

/* Two-pass variance in double: mean[o, k] = sum_r x / R, then
 * out[o, k] = sum_r (x - mean)^2 / max(0, R - correction) (0/0 = NaN when
 * the divisor is 0). mean (dtype dt, [O, K]) may be NULL. */
void zsk_reduce_var(zs_dtype dt, const void *x, int64_t O, int64_t R,
                    int64_t K, int64_t correction, void *out, void *mean);

/* sum_i (a[i] - b[i])^2 over contiguous a, b of n elements (f32, f64, or
 * bf16 / f16 widened to f32), in double;
 * blocks of a fixed size are summed in order, so the result does not
 * depend on the number of threads. */
double zsk_sq_diff_sum(zs_dtype dt, const void *a, const void *b, int64_t n);

#endif
