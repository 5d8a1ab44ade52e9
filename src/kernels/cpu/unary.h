/*
 * kernels/cpu/unary.h - elementwise y = f(x) kernels for f32 and f64.
 *
 * One entry point walks any strided layout (zsk_iter with 2 operands: out,
 * x) on the thread pool. f32 rows run through contiguous array routines:
 * AVX-512 for the transcendental and simple functions when zs_cpu()->avx512f,
 * else a portable fallback that evaluates in double with libm and rounds.
 * Strided rows are gathered into a small buffer, so a strided input gives
 * bit-identical results to a contiguous one. f64 evaluates with libm.
 *
 * Accuracy (f32, vs float64 libm on the same float input): relative error
 * below 1e-6 (a few ulp) wherever the result is a normal float; see
 * unary.c for each function's method and special values.
 */
#ifndef ZS_KERNELS_CPU_UNARY_H
#define ZS_KERNELS_CPU_UNARY_H

#include <stdbool.h>

#include "kernels/cpu/iter.h"

typedef enum zsk_unop {
    ZSK_EXP,
    ZSK_LOG,
    ZSK_SQRT,
    ZSK_RSQRT,
    ZSK_POW,        /* x ** p0, as libm pow (NaN for x < 0 and p0 not integer) */
    ZSK_SIN,
    ZSK_COS,
    ZSK_TANH,
    ZSK_SIGMOID,
    ZSK_RELU,       /* x < 0 ? 0 : x (NaN stays NaN) */
    ZSK_GELU_ERF,   /* x * Phi(x) */
    ZSK_GELU_TANH,  /* x * sigmoid(2 sqrt(2/pi) (x + 0.044715 x^3)) */
    ZSK_SILU,       /* x * sigmoid(x) */
    ZSK_ABS,
    ZSK_CLAMP,      /* min(max(x, p0), p1), NaN stays NaN */
    /* derivatives and masks used by backward rules */
    ZSK_STEP,       /* x > 0 ? 1 : 0 */
    ZSK_SIGN,       /* -1, 0, 1 */
    ZSK_INRANGE,    /* p0 <= x <= p1 ? 1 : 0 */
    ZSK_GELU_ERF_GRAD,
    ZSK_GELU_TANH_GRAD,
    ZSK_SILU_GRAD,
    ZSK_UNOP_COUNT
} zsk_unop;

/* out = f(x) with parameters p0, p1 (pow: exponent; clamp: lo, hi).
 * `it` has 2 operands: out, x (element strides); out may alias x only when
 * both have the same layout. dt is ZS_F32 or ZS_F64. */
void zsk_unary(zs_dtype dt, zsk_unop op, const zsk_iter *it, void *out,
               const void *x, double p0, double p1);

/* Single-threaded contiguous f32 routine, for tests: vector selects the
 * AVX-512 code (ignored, i.e. fallback used, when the CPU lacks it). */
void zsk_unary_f32_contig(zsk_unop op, float *out, const float *x, int64_t n,
                          double p0, double p1, bool vector);
/* True when op has an AVX-512 f32 routine and this CPU can run it. */
bool zsk_unary_has_vector(zsk_unop op);

#endif
