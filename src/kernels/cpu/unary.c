/*
 * unary.c - elementwise y = f(x) for f32 and f64 (see unary.h).
 *
 * Layout: zsk_unary splits the iteration over the pool; each row segment
 * calls a contiguous array routine, directly for unit strides, else through
 * a 256-element gather/scatter buffer. The array routines are:
 *   - f32 AVX-512 (16 lanes, masked tail) for exp, log, sqrt, rsqrt, tanh,
 *     sigmoid, silu, gelu (both forms), relu, abs, clamp and step, chosen
 *     at run time with zs_cpu()->avx512f;
 *   - a portable fallback (f32 and f64) evaluating each element in double
 *     with libm, so its f32 results are the correctly rounded-ish reference;
 *     its loops are compiled for AVX-512, AVX2 and baseline x86-64 and
 *     picked under ZS_CPU_ISA (ZSK_ISA_VOID, kernels.h).
 *
 * f32 vector methods (errors measured against double libm on the same
 * float input by tests/ops/test_unary.c, sweep over [-100, 100] and
 * special values; "relative" where the result is a normal float):
 *   exp      n = rint(x log2 e), r = x - n ln2 (two-constant Cody-Waite),
 *            Cephes degree-6 polynomial, scalef by 2^n. Input clamped to
 *            [-104, 89]: overflow gives inf, underflow 0 or a subnormal.
 *   log      x = m 2^k with m in [0.75, 1.5) (getmant/getexp, subnormals
 *            included); log m = 2 atanh(s), s = (m-1)/(m+1), odd series
 *            to s^11; k ln2 added in two parts. 0 -> -inf, x < 0 -> NaN.
 *   tanh     |x| < 0.625: Cephes odd polynomial; else (1-e)/(1+e) with
 *            e = exp(-2|x|), sign restored.
 *   sigmoid  e = exp(-|x|); (x >= 0 ? 1 : e) / (1 + e): no cancellation,
 *            no overflow for any x.
 *   silu     x * sigmoid(x); x < -200 gives -0 (so -inf -> -0, the limit).
 *   gelu tanh  x * sigmoid(v), v = 2 sqrt(2/pi) (x + 0.044715 x^3). v is
 *            formed in double-float (hi + lo, error-free products and sum)
 *            because its rounding error would be amplified by exp(v) into
 *            relative errors of 1e-5 at |x| ~ 5; exp(v_hi)(1 + v_lo).
 *   gelu erf x * Phi(x), Phi(x) = erfc(-x/sqrt 2)/2 with erfc(z) =
 *            t R(t) exp(-x^2/2), t = 1/(1 + z/2) (rcp14 + Newton), R a
 *            degree-10 Chebyshev fit (Estrin), x^2 = s + se split exactly
 *            by fma so exp(-s/2)(1 - se/2) keeps relative accuracy out to
 *            |x| = 13. Phi(x) = 1 - erfc/2 for x >= 0.
 *   gelu/silu: inputs beyond +-20 (+-200 silu) give x resp. -0.
 * Divisions by 1 + e (tanh, sigmoid, silu, gelu) use rcp14 + one Newton
 * step. sqrt is the IEEE instruction; rsqrt = 1/sqrt (two roundings).
 *
 * Measured, 16M f32 elements, 2 threads, GB/s of read + write, best of 15:
 * EPYC (Zen 5) dev box, shared: relu 41-50, exp 41-46, log 38-45, tanh,
 * sigmoid, silu 47-50 (at bandwidth), gelu erf 22-37, gelu tanh 16-41.
 * Xeon (Sapphire Rapids class) idle: relu 47, exp 37, log 39, sigmoid 34,
 * tanh 27, silu 26, gelu erf 19, gelu tanh 17 (compute bound there: two
 * 512-bit FMA ports). sin, cos, pow are scalar libm (~1-2 GB/s).
 */
#include <math.h>
#include <string.h>

#include "kernels/cpu/kernels.h"
#include "kernels/cpu/unary.h"
#include "kernels/cpu/vmath.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define ZSK_HAVE_AVX512 1
#endif

/* GELU tanh constants: C1 = 2 sqrt(2/pi), C3 = C1 * 0.044715. */
#define GELU_C1 1.5957691216057308
#define GELU_K 0.044715
#define GELU_C3 (GELU_C1 * GELU_K)

typedef void (*arr_f32_fn)(zsk_unop op, float *o, const float *a, int64_t n,
                           double p0, double p1);

/* ---- double reference definitions (portable fallback, f64) ----------- */

static inline double sigmoid_d(double v)
{
    if (v >= 0)
        return 1.0 / (1.0 + exp(-v));
    double e = exp(v);
    return e / (1.0 + e);
}

static inline double gelu_erf_d(double x)
{
    return x == -INFINITY ? -0.0 : x * 0.5 * erfc(-x * M_SQRT1_2);
}

static inline double gelu_tanh_d(double x)
{
    return x == -INFINITY ? -0.0
                          : x * sigmoid_d(GELU_C1 * (x + GELU_K * x * x * x));
}

static inline double silu_d(double x)
{
    return x == -INFINITY ? -0.0 : x * sigmoid_d(x);
}

/* d/dx x Phi(x) = Phi(x) + x phi(x) */
static inline double gelu_erf_grad_d(double x)
{
    return 0.5 * erfc(-x * M_SQRT1_2) +
           x * exp(-0.5 * x * x) * 0.39894228040143267794;
}

static inline double gelu_tanh_grad_d(double x)
{
    double s = sigmoid_d(GELU_C1 * (x + GELU_K * x * x * x));
    return s + x * s * (1 - s) * GELU_C1 * (1 + 3 * GELU_K * x * x);
}

static inline double silu_grad_d(double x)
{
    double s = sigmoid_d(x);
    return s * (1 + x * (1 - s));
}

#define LOOP(expr)                                                            \
    for (int64_t i = 0; i < n; i++) {                                         \
        double x = (double)a[i];                                              \
        o[i] = (expr);                                                        \
    }                                                                         \
    break

/* Contiguous fallback: every element evaluated in double, then rounded. */
#define DEFINE_SCALAR(T, SUF, SIN, COS, POW)                                   \
    static ZSK_ISA_VOID(scalar_##SUF, (zsk_unop op, T *o, const T *a,        \
                                       int64_t n, double p0, double p1),     \
                        (op, o, a, n, p0, p1))                               \
    {                                                                         \
        switch (op) {                                                         \
        case ZSK_EXP: LOOP(exp(x));                                           \
        case ZSK_LOG: LOOP(log(x));                                           \
        case ZSK_SQRT: LOOP(sqrt(x));                                         \
        case ZSK_RSQRT: LOOP(1.0 / sqrt(x));                                  \
        case ZSK_POW:                                                         \
            if (p0 == 2.0) {                                                  \
                LOOP(x * x);                                                  \
            }                                                                 \
            LOOP(POW((T)x, (T)p0));                                           \
        case ZSK_SIN: LOOP(SIN((T)x));                                        \
        case ZSK_COS: LOOP(COS((T)x));                                        \
        case ZSK_TANH: LOOP(tanh(x));                                         \
        case ZSK_SIGMOID: LOOP(sigmoid_d(x));                                 \
        case ZSK_RELU: LOOP(x < 0 ? 0.0 : x);                                 \
        case ZSK_GELU_ERF: LOOP(gelu_erf_d(x));                               \
        case ZSK_GELU_TANH: LOOP(gelu_tanh_d(x));                             \
        case ZSK_SILU: LOOP(silu_d(x));                                       \
        case ZSK_ABS: LOOP(fabs(x));                                          \
        case ZSK_CLAMP: LOOP(x < p0 ? p0 : x > p1 ? p1 : x);                  \
        case ZSK_STEP: LOOP(x > 0 ? 1.0 : 0.0);                               \
        case ZSK_SIGN: LOOP(x > 0 ? 1.0 : x < 0 ? -1.0 : 0.0);                \
        case ZSK_INRANGE: LOOP(x >= p0 && x <= p1 ? 1.0 : 0.0);               \
        case ZSK_GELU_ERF_GRAD: LOOP(gelu_erf_grad_d(x));                     \
        case ZSK_GELU_TANH_GRAD: LOOP(gelu_tanh_grad_d(x));                   \
        case ZSK_SILU_GRAD: LOOP(silu_grad_d(x));                             \
        default: break;                                                       \
        }                                                                     \
    }

/* sin, cos, pow of f32 use glibc's float routines (< 1 ulp, several times
 * faster than the double ones); p0 of pow is rounded to float. */
DEFINE_SCALAR(float, f32, sinf, cosf, powf)
DEFINE_SCALAR(double, f64, sin, cos, pow)

/* ---- f32 AVX-512 ------------------------------------------------------ */

#ifdef ZSK_HAVE_AVX512
#define AVX512 __attribute__((target("avx512f")))
#define SPLAT(c) _mm512_set1_ps((float)(c))

static inline AVX512 __m512 v_or_sign(__m512 y, __m512 x)
{
    __m512i s = _mm512_and_epi32(_mm512_castps_si512(x),
                                 _mm512_set1_epi32((int)0x80000000u));
    return _mm512_castsi512_ps(_mm512_or_epi32(_mm512_castps_si512(y), s));
}

/* min(max(x, lo), hi) keeping NaN (max/min return their 2nd operand then) */
static inline AVX512 __m512 v_clampf(__m512 x, __m512 lo, __m512 hi)
{
    return _mm512_min_ps(hi, _mm512_max_ps(lo, x));
}

/* 1/d by rcp14 and one Newton step: relative error ~1e-8 before rounding,
 * cheaper than vdivps (which made sigmoid/tanh/gelu compute bound on Intel
 * cores). d must not be 0 or inf (callers have d >= 1). */
static inline AVX512 __m512 v_recip(__m512 d)
{
    __m512 r = _mm512_rcp14_ps(d);
    return _mm512_mul_ps(r, _mm512_fnmadd_ps(d, r, SPLAT(2.0f)));
}

/* exp (vmath.h): v_exp_nc for x in [-104, 89] or NaN (below -104 it
 * still gives 0 down to about -2^22, which the gelu caller relies on);
 * v_exp clamps x to [-104, 89]. */
static inline AVX512 __m512 v_exp_nc(__m512 x) { return zsi_exp_m512_nc(x); }

static inline AVX512 __m512 v_exp(__m512 x) { return zsi_exp_m512(x); }

static inline AVX512 __m512 v_log(__m512 x)
{
    const __m512 one = SPLAT(1.0f);
    __m512 m = _mm512_getmant_ps(x, _MM_MANT_NORM_p75_1p5, _MM_MANT_SIGN_zero);
    __m512 k = _mm512_getexp_ps(x);
    k = _mm512_mask_add_ps(k, _mm512_cmp_ps_mask(m, one, _CMP_LT_OQ), k, one);
    __m512 s = _mm512_div_ps(_mm512_sub_ps(m, one), _mm512_add_ps(m, one));
    __m512 z = _mm512_mul_ps(s, s);
    __m512 p = SPLAT(2.0 / 11);
    p = _mm512_fmadd_ps(p, z, SPLAT(2.0 / 9));
    p = _mm512_fmadd_ps(p, z, SPLAT(2.0 / 7));
    p = _mm512_fmadd_ps(p, z, SPLAT(2.0 / 5));
    p = _mm512_fmadd_ps(p, z, SPLAT(2.0 / 3));
    __m512 lm = _mm512_fmadd_ps(_mm512_mul_ps(p, z), s, _mm512_add_ps(s, s));
    __m512 r = _mm512_fmadd_ps(k, SPLAT(-2.12194440e-4f), lm);
    r = _mm512_fmadd_ps(k, SPLAT(0.693359375f), r);
    __m512 zero = _mm512_setzero_ps();
    r = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, zero, _CMP_EQ_OQ), r,
                             SPLAT(-INFINITY));
    r = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, zero, _CMP_LT_OQ), r,
                             SPLAT(NAN));
    r = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, SPLAT(INFINITY), _CMP_EQ_OQ),
                             r, x);
    return r;
}

static inline AVX512 __m512 v_tanh(__m512 x)
{
    __m512 ax = _mm512_abs_ps(x);
    __m512 s = _mm512_mul_ps(x, x);
    __m512 p = SPLAT(-5.70498872745e-3f);
    p = _mm512_fmadd_ps(p, s, SPLAT(2.06390887954e-2f));
    p = _mm512_fmadd_ps(p, s, SPLAT(-5.37397155531e-2f));
    p = _mm512_fmadd_ps(p, s, SPLAT(1.33314422036e-1f));
    p = _mm512_fmadd_ps(p, s, SPLAT(-3.33332819422e-1f));
    __m512 ys = _mm512_fmadd_ps(_mm512_mul_ps(p, s), x, x);
    __m512 e = v_exp(_mm512_mul_ps(ax, SPLAT(-2.0f)));
    __m512 yl = _mm512_mul_ps(_mm512_sub_ps(SPLAT(1.0f), e),
                              v_recip(_mm512_add_ps(SPLAT(1.0f), e)));
    yl = v_or_sign(yl, x);
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(ax, SPLAT(0.625f), _CMP_LT_OQ),
                                yl, ys);
}

/* sigmoid(v + lo) for a double-float argument (lo tiny next to v). */
static inline AVX512 __m512 v_sigmoid2(__m512 v, __m512 lo)
{
    __mmask16 pos = _mm512_cmp_ps_mask(v, _mm512_setzero_ps(), _CMP_GE_OQ);
    __m512 t = _mm512_mask_blend_ps(pos, lo, _mm512_sub_ps(_mm512_setzero_ps(), lo));
    __m512 e = v_exp(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_abs_ps(v)));
    e = _mm512_fmadd_ps(e, t, e);
    __m512 num = _mm512_mask_blend_ps(pos, e, SPLAT(1.0f));
    return _mm512_mul_ps(num, v_recip(_mm512_add_ps(SPLAT(1.0f), e)));
}

static inline AVX512 __m512 v_sigmoid(__m512 x)
{
    return v_sigmoid2(x, _mm512_setzero_ps());
}

static inline AVX512 __m512 v_silu(__m512 x)
{
    __m512 xc = _mm512_max_ps(SPLAT(-200.0f), x);
    return _mm512_mul_ps(xc, v_sigmoid(xc));
}

/* Error-free a*b = p + return value (fma). */
static inline AVX512 __m512 v_two_prod_err(__m512 a, __m512 b, __m512 p)
{
    return _mm512_fmsub_ps(a, b, p);
}

static inline AVX512 __m512 v_gelu_tanh(__m512 x)
{
    const float c1h = (float)GELU_C1, c1l = (float)(GELU_C1 - (double)c1h);
    const float c3h = (float)GELU_C3, c3l = (float)(GELU_C3 - (double)c3h);
    __m512 xc = v_clampf(x, SPLAT(-20.0f), SPLAT(20.0f));
    __m512 s = _mm512_mul_ps(xc, xc);
    __m512 se = v_two_prod_err(xc, xc, s);
    __m512 x3 = _mm512_mul_ps(s, xc);
    __m512 x3l = _mm512_fmadd_ps(se, xc, v_two_prod_err(s, xc, x3));
    __m512 p1 = _mm512_mul_ps(SPLAT(c1h), xc);
    __m512 p1l = _mm512_fmadd_ps(SPLAT(c1l), xc, v_two_prod_err(SPLAT(c1h), xc, p1));
    __m512 p3 = _mm512_mul_ps(SPLAT(c3h), x3);
    __m512 p3l = _mm512_fmadd_ps(SPLAT(c3h), x3l,
                                 _mm512_fmadd_ps(SPLAT(c3l), x3,
                                                 v_two_prod_err(SPLAT(c3h), x3, p3)));
    /* TwoSum(p1, p3) */
    __m512 v = _mm512_add_ps(p1, p3);
    __m512 bb = _mm512_sub_ps(v, p1);
    __m512 err = _mm512_add_ps(_mm512_sub_ps(p1, _mm512_sub_ps(v, bb)),
                               _mm512_sub_ps(p3, bb));
    __m512 lo = _mm512_add_ps(err, _mm512_add_ps(p1l, p3l));
    __m512 r = _mm512_mul_ps(xc, v_sigmoid2(v, lo));
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, SPLAT(20.0f), _CMP_GT_OQ),
                                r, x);
}

/* erfc(z) e^(z^2) / t as a polynomial in u = t - 0.56, t = 1/(1 + z/2) in
 * [0.12, 1] (z <= 14.2): Chebyshev fit (mpmath chebyfit, degree 10), max
 * relative error 2e-8 with these float coefficients; c[k] multiplies u^k. */
static const float ERFC_C[11] = {
    5.540623665e-01f, 7.556532621e-01f, 5.812615752e-01f, 1.011932492e-01f,
    -1.975129396e-01f, -6.530620158e-02f, 1.127689555e-01f, 1.679266989e-02f,
    -7.791594416e-02f, 7.695372216e-03f, 3.925937414e-02f,
};

static inline AVX512 __m512 v_erfc_poly(__m512 u)
{
#define C(k) SPLAT(ERFC_C[k])
    /* Estrin: depth 5 instead of 10 dependent FMAs */
    __m512 u2 = _mm512_mul_ps(u, u), u4 = _mm512_mul_ps(u2, u2);
    __m512 u8 = _mm512_mul_ps(u4, u4);
    __m512 q0 = _mm512_fmadd_ps(C(1), u, C(0)), q1 = _mm512_fmadd_ps(C(3), u, C(2));
    __m512 q2 = _mm512_fmadd_ps(C(5), u, C(4)), q3 = _mm512_fmadd_ps(C(7), u, C(6));
    __m512 q4 = _mm512_fmadd_ps(C(9), u, C(8));
    __m512 r0 = _mm512_fmadd_ps(q1, u2, q0), r1 = _mm512_fmadd_ps(q3, u2, q2);
    __m512 r2 = _mm512_fmadd_ps(C(10), u2, q4);
    return _mm512_fmadd_ps(r2, u8, _mm512_fmadd_ps(r1, u4, r0));
#undef C
}

static inline AVX512 __m512 v_gelu_erf(__m512 x)
{
    __m512 xc = v_clampf(x, SPLAT(-20.0f), SPLAT(20.0f));
    /* e^(-x^2/2) with x^2 = s + se exactly (independent of the chain below) */
    __m512 s = _mm512_mul_ps(xc, xc);
    __m512 se = v_two_prod_err(xc, xc, s);
    __m512 E = v_exp_nc(_mm512_mul_ps(s, SPLAT(-0.5f))); /* arg in [-200, 0] */
    E = _mm512_fnmadd_ps(_mm512_mul_ps(E, se), SPLAT(0.5f), E);
    __m512 z = _mm512_mul_ps(_mm512_abs_ps(xc), SPLAT(M_SQRT1_2));
    __m512 t = v_recip(_mm512_fmadd_ps(z, SPLAT(0.5f), SPLAT(1.0f)));
    __m512 q = _mm512_mul_ps(t, v_erfc_poly(_mm512_sub_ps(t, SPLAT(0.56f))));
    __m512 h = _mm512_mul_ps(_mm512_mul_ps(q, SPLAT(0.5f)), E); /* erfc/2 */
    __mmask16 neg = _mm512_cmp_ps_mask(xc, _mm512_setzero_ps(), _CMP_LT_OQ);
    __m512 phi = _mm512_mask_blend_ps(neg, _mm512_sub_ps(SPLAT(1.0f), h), h);
    __m512 r = _mm512_mul_ps(xc, phi);
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, SPLAT(20.0f), _CMP_GT_OQ),
                                r, x);
}

static inline AVX512 __m512 v_relu(__m512 x)
{
    return _mm512_mask_blend_ps(
        _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_LT_OQ), x,
        _mm512_setzero_ps());
}

static inline AVX512 __m512 v_clamp(__m512 x, __m512 lo, __m512 hi)
{
    x = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ), x, lo);
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, hi, _CMP_GT_OQ), x, hi);
}

/* A contiguous routine applying EXPR (of x, P0, P1) to 16 lanes at a time,
 * with a masked tail. */
#define VEC_ROUTINE(NAME, EXPR)                                               \
    static AVX512 void NAME(zsk_unop op, float *o, const float *a, int64_t n, \
                            double p0, double p1)                            \
    {                                                                         \
        const __m512 P0 = SPLAT(p0), P1 = SPLAT(p1);                          \
        (void)P0;                                                             \
        (void)P1;                                                             \
        int64_t i = 0;                                                        \
        for (; i + 16 <= n; i += 16) {                                        \
            __m512 x = _mm512_loadu_ps(a + i);                                \
            _mm512_storeu_ps(o + i, EXPR);                                    \
        }                                                                     \
        if (i < n) {                                                          \
            __mmask16 m = (__mmask16)((1u << (n - i)) - 1);                   \
            __m512 x = _mm512_maskz_loadu_ps(m, a + i);                       \
            _mm512_mask_storeu_ps(o + i, m, EXPR);                            \
        }                                                                     \
    }

VEC_ROUTINE(vr_exp, v_exp(x))
VEC_ROUTINE(vr_log, v_log(x))
VEC_ROUTINE(vr_sqrt, _mm512_sqrt_ps(x))
VEC_ROUTINE(vr_rsqrt, _mm512_div_ps(SPLAT(1.0f), _mm512_sqrt_ps(x)))
VEC_ROUTINE(vr_tanh, v_tanh(x))
VEC_ROUTINE(vr_sigmoid, v_sigmoid(x))
VEC_ROUTINE(vr_silu, v_silu(x))
VEC_ROUTINE(vr_gelu_tanh, v_gelu_tanh(x))
VEC_ROUTINE(vr_gelu_erf, v_gelu_erf(x))
VEC_ROUTINE(vr_relu, v_relu(x))
VEC_ROUTINE(vr_abs, _mm512_abs_ps(x))
VEC_ROUTINE(vr_clamp, v_clamp(x, P0, P1))
VEC_ROUTINE(vr_step, _mm512_maskz_mov_ps(
                         _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_GT_OQ),
                         SPLAT(1.0f)))

static const arr_f32_fn vec_f32[ZSK_UNOP_COUNT] = {
    [ZSK_EXP] = vr_exp,           [ZSK_LOG] = vr_log,
    [ZSK_SQRT] = vr_sqrt,         [ZSK_RSQRT] = vr_rsqrt,
    [ZSK_TANH] = vr_tanh,         [ZSK_SIGMOID] = vr_sigmoid,
    [ZSK_SILU] = vr_silu,         [ZSK_GELU_TANH] = vr_gelu_tanh,
    [ZSK_GELU_ERF] = vr_gelu_erf, [ZSK_RELU] = vr_relu,
    [ZSK_ABS] = vr_abs,           [ZSK_CLAMP] = vr_clamp,
    [ZSK_STEP] = vr_step,
};
#endif /* ZSK_HAVE_AVX512 */

bool zsk_unary_has_vector(zsk_unop op)
{
#ifdef ZSK_HAVE_AVX512
    return op >= 0 && op < ZSK_UNOP_COUNT && vec_f32[op] && zs_cpu()->avx512f;
#else
    (void)op;
    return false;
#endif
}

static arr_f32_fn pick_f32(zsk_unop op, bool vector)
{
#ifdef ZSK_HAVE_AVX512
    if (vector && zsk_unary_has_vector(op))
        return vec_f32[op];
#endif
    (void)vector;
    return scalar_f32;
}

void zsk_unary_f32_contig(zsk_unop op, float *out, const float *x, int64_t n,
                          double p0, double p1, bool vector)
{
    pick_f32(op, vector)(op, out, x, n, p0, p1);
}

/* ---- driver ------------------------------------------------------------ */

#define GATHER 256

typedef struct un_ctx {
    const zsk_iter *it;
    zsk_unop op;
    void *out;
    const void *x;
    double p0, p1;
    arr_f32_fn f32;
} un_ctx;

#define DEFINE_SEG(T, SUF, CALL)                                              \
    static void seg_##SUF(void *p, const int64_t *offs, int64_t n)           \
    {                                                                         \
        const un_ctx *c = p;                                                  \
        int last = c->it->ndim - 1;                                           \
        int64_t so = c->it->strides[0][last], sa = c->it->strides[1][last];   \
        T *o = (T *)c->out + offs[0];                                         \
        const T *a = (const T *)c->x + offs[1];                               \
        if (so == 1 && sa == 1) {                                             \
            CALL(c->op, o, a, n, c->p0, c->p1);                               \
            return;                                                           \
        }                                                                     \
        T bin[GATHER], bout[GATHER];                                          \
        for (int64_t i = 0; i < n; i += GATHER) {                             \
            int64_t m = n - i < GATHER ? n - i : GATHER;                      \
            for (int64_t j = 0; j < m; j++)                                   \
                bin[j] = a[(i + j) * sa];                                     \
            CALL(c->op, bout, bin, m, c->p0, c->p1);                          \
            for (int64_t j = 0; j < m; j++)                                   \
                o[(i + j) * so] = bout[j];                                    \
        }                                                                     \
    }

#define CALL_F32(...) c->f32(__VA_ARGS__)
DEFINE_SEG(float, f32, CALL_F32)
DEFINE_SEG(double, f64, scalar_f64)

/* Elements per task: transcendental rows cost more than a copy, so the
 * pool is used from smaller sizes on. */
static int64_t grain_of(zsk_unop op)
{
    switch (op) {
    case ZSK_RELU: case ZSK_ABS: case ZSK_CLAMP: case ZSK_STEP:
    case ZSK_SIGN: case ZSK_INRANGE: case ZSK_SQRT:
        return ZSK_GRAIN;
    default:
        return ZSK_GRAIN / 4;
    }
}

void zsk_unary(zs_dtype dt, zsk_unop op, const zsk_iter *it, void *out,
               const void *x, double p0, double p1)
{
    un_ctx c = {it, op, out, x, p0, p1, pick_f32(op, true)};
    zsk_iter_parallel(it, grain_of(op), dt == ZS_F64 ? seg_f64 : seg_f32, &c);
}
