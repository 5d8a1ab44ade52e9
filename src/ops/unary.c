/*
 * unary.c - elementwise functions of one tensor: neg, exp, log, sqrt,
 * rsqrt, pow (scalar exponent), sin, cos, tanh, sigmoid, relu, gelu (erf
 * and tanh forms), silu, abs, clamp.
 *
 * One forward driver (unary) checks the dtype, allocates a contiguous
 * output of the input's shape, runs zsk_unary (any input strides) and
 * records a node saving the input and/or output that the backward rule
 * needs. Every descriptor reads the typed unary_attrs (kernel,
 * parameters, derivative kernel). Backward rules are driver calls only:
 * other zs_* operators, and for the derivatives with no operator of their
 * own (x > 0, sign, lo <= x <= hi, gelu' and silu') the descriptor
 * "unary_deriv", which runs the node's derivative kernel.
 *
 * Cost model, FLOPs per element (bytes: input read + output written):
 *   neg, relu, abs 1; clamp 2; sqrt 1; rsqrt 2; pow 1 for p = 2 else 20;
 *   exp 12; log 15; sin, cos 15; tanh 18; sigmoid 15; silu 16;
 *   gelu tanh 30; gelu erf 40.
 * These count the arithmetic of the f32 vector routines (kernels/cpu/unary.c),
 * a division or square root as one.
 *
 * Domain: as libm. log of x < 0, sqrt of x < 0 and pow of a negative base
 * with a non-integer exponent give NaN (no error); log(0) = -inf.
 */
#include <math.h>
#include <string.h>

#include "kernels/cpu/unary.h"
#include "ops/internal.h"
#include "ops/attrs.h"

static zs_status neg_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin);
static zs_status exp_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin);
static zs_status log_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin);
static zs_status sqrt_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin);
static zs_status rsqrt_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin);
static zs_status pow_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin);
static zs_status sin_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin);
static zs_status cos_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin);
static zs_status tanh_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin);
static zs_status sigmoid_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin);
static zs_status mask_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin);

/* The attributes of every unary descriptor (neg: all zero, unused): the
 * kernel and its parameters, and the derivative kernel mask_bw multiplies
 * by (relu, gelu, silu, abs, clamp; unary_deriv's own call runs it as its
 * kernel). */

/* ---- forward ----------------------------------------------------------- */

/* Runs kernel k on a into out (any strides in, contiguous out): f32, f64. */
static void run_unop(zsk_unop k, const zs_tensor *a, zs_tensor *out, double p0,
                     double p1)
{
    zsk_iter it;
    zsk_iter_init(&it, a->ndim, a->shape, 2, (const int64_t *[]){NULL, a->strides});
    zsk_unary(a->dtype, k, &it, zs_data(out), zs_data(a), p0, p1);
}

static zs_status cpu_unary(const zsi_call *c, zs_tensor *out)
{
    const unary_attrs *a = c->attrs;
    run_unop((zsk_unop)a->kernel, c->in[0], out, a->p0, a->p1);
    return ZS_OK;
}

static zs_status cpu_unary_lowp(const zsi_call *c, zs_tensor *out)
{
    return zsi_via_f32(c, out, cpu_unary);
}

/* neg: out = -a, the scalar-multiply kernel */
static zs_status cpu_neg(const zsi_call *c, zs_tensor *out)
{
    const zs_tensor *a = c->in[0];
    zsk_iter it;
    zsk_iter_init(&it, a->ndim, a->shape, 2, (const int64_t *[]){NULL, a->strides});
    zsk_binary_scalar(a->dtype, ZSK_MUL, &it, zs_data(out), zs_data(a), -1.0);
    return ZS_OK;
}

static zs_status cpu_neg_lowp(const zsi_call *c, zs_tensor *out)
{
    return zsi_via_f32(c, out, cpu_neg);
}

static void save_in(zsi_ctx *n, const zsi_call *c, zs_tensor *out)
{
    zsi_save(n, 0, c->in[0]);
}

static void save_out(zsi_ctx *n, const zsi_call *c, zs_tensor *out)
{
    zsi_save(n, 1, out);
}

/* The formula of every unary operator in double (the reference of the
 * tests; a fusion pass composes these), on the call's unary_attrs. */
static double unary_scalar(const double *x, const void *attrs)
{
    const unary_attrs *a = attrs;
    double v = x[0], p0 = a->p0, p1 = a->p1;
    switch ((zsk_unop)a->kernel) {
    case ZSK_EXP: return exp(v);
    case ZSK_LOG: return log(v);
    case ZSK_SQRT: return sqrt(v);
    case ZSK_RSQRT: return 1 / sqrt(v);
    case ZSK_POW: return pow(v, p0);
    case ZSK_SIN: return sin(v);
    case ZSK_COS: return cos(v);
    case ZSK_TANH: return tanh(v);
    case ZSK_SIGMOID: return 1 / (1 + exp(-v));
    case ZSK_RELU: return v < 0 ? 0 : v;
    case ZSK_GELU_ERF: return 0.5 * v * (1 + erf(v / sqrt(2.0)));
    case ZSK_GELU_TANH:
        return 0.5 * v * (1 + tanh(sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
    case ZSK_SILU: return v / (1 + exp(-v));
    case ZSK_ABS: return fabs(v);
    case ZSK_CLAMP: return v < p0 ? p0 : v > p1 ? p1 : v;
    default: return NAN;
    }
}

static double neg_scalar(const double *x, const void *a) { return -x[0]; }

/* pow costs 1 FLOP per element for p = 2 (a multiply), 20 otherwise */
static zsi_cost pow_cost(const zsi_call *c, const zs_tensor *out)
{
    double n = (double)zs_numel(out);
    const unary_attrs *a = c->attrs;
    return (zsi_cost){(a->p0 == 2.0 ? 1 : 20) * n, (double)zs_nbytes(c->in[0]),
                      (double)zs_nbytes(out)};
}

#define CPU_KERNELS(f, lowp)                                                  \
    {[ZS_CPU] = {[ZS_F32] = f, [ZS_F64] = f, [ZS_BF16] = lowp, [ZS_F16] = lowp}}

#define UNARY(var, nm, form, fl, sv, bw, ...)                                 \
    zsi_opdef var = {                                                         \
        .op = {.name = nm, .backward = bw}, .arity = 1,                       \
        .cls = ZSI_POINTWISE, .formula = form, .scalar = unary_scalar,        \
        .flops = fl, .infer = zsi_infer_same_float,                           \
        .kernel = CPU_KERNELS(cpu_unary, cpu_unary_lowp), .save = sv,         \
        .attr_size = sizeof(unary_attrs),                                     \
        .bw_ops = (zsi_opdef *const[]){__VA_ARGS__, NULL}}

zsi_opdef zsi_def_neg = {
    .op = {.name = "neg", .backward = neg_bw}, .arity = 1, .cls = ZSI_POINTWISE,
    .formula = "-a", .scalar = neg_scalar, .flops = 1, .infer = zsi_infer_same_float,
    .kernel = CPU_KERNELS(cpu_neg, cpu_neg_lowp), .attr_size = sizeof(unary_attrs),
    .bw_ops = (zsi_opdef *const[]){&zsi_def_neg, NULL}};
UNARY(zsi_def_exp, "exp", "exp(a)", 12, save_out, exp_bw, &zsi_def_mul);
UNARY(zsi_def_log, "log", "log(a)", 15, save_in, log_bw, &zsi_def_div);
UNARY(zsi_def_sqrt, "sqrt", "sqrt(a)", 1, save_out, sqrt_bw, &zsi_def_div,
      &zsi_def_mul_scalar);
UNARY(zsi_def_rsqrt, "rsqrt", "1 / sqrt(a)", 2, save_out, rsqrt_bw, &zsi_def_pow,
      &zsi_def_mul_scalar, &zsi_def_mul);
UNARY(zsi_def_sin, "sin", "sin(a)", 15, save_in, sin_bw, &zsi_def_cos, &zsi_def_mul);
UNARY(zsi_def_cos, "cos", "cos(a)", 15, save_in, cos_bw, &zsi_def_sin,
      &zsi_def_mul_scalar, &zsi_def_mul);
UNARY(zsi_def_tanh, "tanh", "tanh(a)", 18, save_out, tanh_bw, &zsi_def_mul,
      &zsi_def_mul_scalar, &zsi_def_add_scalar);
UNARY(zsi_def_sigmoid, "sigmoid", "1 / (1 + exp(-a))", 15, save_out, sigmoid_bw,
      &zsi_def_mul_scalar, &zsi_def_add_scalar, &zsi_def_mul);
/* These multiply g by a derivative kernel of the saved input (mask_bw). */
UNARY(zsi_def_relu, "relu", "max(a, 0)", 1, save_in, mask_bw, &zsi_def_deriv,
      &zsi_def_mul);
UNARY(zsi_def_gelu, "gelu", "a Phi(a) (erf) or its tanh form", 40, save_in,
      mask_bw, &zsi_def_deriv, &zsi_def_mul, &zsi_def_linear_gelu_backward);
UNARY(zsi_def_silu, "silu", "a sigmoid(a)", 16, save_in, mask_bw, &zsi_def_deriv,
      &zsi_def_mul);
UNARY(zsi_def_abs, "abs", "|a|", 1, save_in, mask_bw, &zsi_def_deriv, &zsi_def_mul);
UNARY(zsi_def_clamp, "clamp", "min(max(a, p0), p1)", 2, save_in, mask_bw,
      &zsi_def_deriv, &zsi_def_mul);
zsi_opdef zsi_def_pow = {
    .op = {.name = "pow", .backward = pow_bw}, .arity = 1, .cls = ZSI_POINTWISE,
    .formula = "a ** p0", .scalar = unary_scalar, .flops = 20, .infer = zsi_infer_same_float,
    .kernel = CPU_KERNELS(cpu_unary, cpu_unary_lowp), .save = save_in,
    .cost = pow_cost, .attr_size = sizeof(unary_attrs),
    .bw_ops = (zsi_opdef *const[]){&zsi_def_mul_scalar, &zsi_def_pow, &zsi_def_mul,
                                   NULL}};

/* The shared forward: kernel k with parameters p0, p1 and, for mask_bw,
 * the derivative kernel. */
static zs_tensor *unary(zsi_opdef *d, zsk_unop k, zs_tensor *a, double p0,
                        double p1, zsk_unop deriv)
{
    unary_attrs at = {.p0 = p0, .p1 = p1, .kernel = k, .deriv = deriv};
    return zsi_run(d, 1, &a, &at);
}

zs_tensor *zs_neg(zs_tensor *a) { return zsi_run(&zsi_def_neg, 1, &a, NULL); }
zs_tensor *zs_exp(zs_tensor *a) { return unary(&zsi_def_exp, ZSK_EXP, a, 0, 0, 0); }
zs_tensor *zs_log(zs_tensor *a) { return unary(&zsi_def_log, ZSK_LOG, a, 0, 0, 0); }
zs_tensor *zs_sqrt(zs_tensor *a) { return unary(&zsi_def_sqrt, ZSK_SQRT, a, 0, 0, 0); }
zs_tensor *zs_rsqrt(zs_tensor *a) { return unary(&zsi_def_rsqrt, ZSK_RSQRT, a, 0, 0, 0); }
zs_tensor *zs_pow(zs_tensor *a, double p) { return unary(&zsi_def_pow, ZSK_POW, a, p, 0, 0); }
zs_tensor *zs_sin(zs_tensor *a) { return unary(&zsi_def_sin, ZSK_SIN, a, 0, 0, 0); }
zs_tensor *zs_cos(zs_tensor *a) { return unary(&zsi_def_cos, ZSK_COS, a, 0, 0, 0); }
zs_tensor *zs_tanh(zs_tensor *a) { return unary(&zsi_def_tanh, ZSK_TANH, a, 0, 0, 0); }
zs_tensor *zs_sigmoid(zs_tensor *a) { return unary(&zsi_def_sigmoid, ZSK_SIGMOID, a, 0, 0, 0); }
zs_tensor *zs_relu(zs_tensor *a) { return unary(&zsi_def_relu, ZSK_RELU, a, 0, 0, ZSK_STEP); }
zs_tensor *zs_silu(zs_tensor *a) { return unary(&zsi_def_silu, ZSK_SILU, a, 0, 0, ZSK_SILU_GRAD); }
zs_tensor *zs_abs(zs_tensor *a) { return unary(&zsi_def_abs, ZSK_ABS, a, 0, 0, ZSK_SIGN); }

/* cost: tanh form 30 FLOPs per element, erf form 40 (zsi_def_gelu's default) */
zs_tensor *zs_gelu(zs_tensor *a, zs_gelu_approx approx)
{
    if (!a)
        return NULL;
    if (approx != ZS_GELU_ERF && approx != ZS_GELU_TANH) {
        zs_set_error("gelu: approximation %d is not ZS_GELU_ERF (0) or "
                     "ZS_GELU_TANH (1)", (int)approx);
        return NULL;
    }
    if (approx == ZS_GELU_TANH)
        return unary(&zsi_def_gelu, ZSK_GELU_TANH, a, 0, 0, ZSK_GELU_TANH_GRAD);
    return unary(&zsi_def_gelu, ZSK_GELU_ERF, a, 0, 0, ZSK_GELU_ERF_GRAD);
}

/* lo <= hi required (either may be infinite); NaN bounds are an error.
 * The gradient passes where lo <= x <= hi. */
zs_tensor *zs_clamp(zs_tensor *a, double lo, double hi)
{
    if (!a)
        return NULL;
    if (isnan(lo) || isnan(hi) || lo > hi) {
        zs_set_error("clamp: bounds lo %g, hi %g, expected lo <= hi", lo, hi);
        return NULL;
    }
    return unary(&zsi_def_clamp, ZSK_CLAMP, a, lo, hi, ZSK_INRANGE);
}

/* ---- backward ---------------------------------------------------------- */

/* g * b, releasing b; NULL-safe. */
static zs_tensor *mul_take(zs_tensor *g, zs_tensor *b)
{
    zs_tensor *r = b ? zs_mul(g, b) : NULL;
    zs_release(b);
    return r;
}

/* 1 - t*t or 1 - t, new reference */
static zs_tensor *one_minus(zs_tensor *t, bool square)
{
    zs_tensor *sq = square ? zs_mul(t, t) : zs_retain(t);
    zs_tensor *m = sq ? zs_mul_scalar(sq, -1.0) : NULL;
    zs_tensor *r = m ? zs_add_scalar(m, 1.0) : NULL;
    zs_release(sq);
    zs_release(m);
    return r;
}

#define RETURN_GIN(expr)                                                      \
    do {                                                                      \
        gin[0] = (expr);                                                      \
        return gin[0] ? ZS_OK : ZS_ERR_NOMEM;                                 \
    } while (0)

static zs_status neg_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin)
{
    RETURN_GIN(zs_neg(g));
}

/* exp' = exp(x) = out */
static zs_status exp_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin)
{
    RETURN_GIN(zs_mul(g, n->saved[1]));
}

static zs_status log_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin)
{
    RETURN_GIN(zs_div(g, n->saved[0]));
}

/* sqrt' = 1 / (2 out) */
static zs_status sqrt_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin)
{
    zs_tensor *q = zs_div(g, n->saved[1]);
    zs_tensor *r = q ? zs_mul_scalar(q, 0.5) : NULL;
    zs_release(q);
    RETURN_GIN(r);
}

/* rsqrt' = -x^(-3/2) / 2 = -out^3 / 2 */
static zs_status rsqrt_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin)
{
    zs_tensor *c = zs_pow(n->saved[1], 3.0);
    zs_tensor *d = c ? zs_mul_scalar(c, -0.5) : NULL;
    zs_release(c);
    RETURN_GIN(mul_take(g, d));
}

/* pow' = p x^(p-1); 0 for p = 0 */
static zs_status pow_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin)
{
    double p = ((const unary_attrs *)zsi_node_attrs(n))->p0;
    if (p == 0.0)
        RETURN_GIN(zs_mul_scalar(g, 0.0));
    if (p == 1.0)
        RETURN_GIN(zs_retain(g));
    zs_tensor *c = zs_pow(n->saved[0], p - 1);
    zs_tensor *d = c ? zs_mul_scalar(c, p) : NULL;
    zs_release(c);
    RETURN_GIN(mul_take(g, d));
}

static zs_status sin_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin)
{
    RETURN_GIN(mul_take(g, zs_cos(n->saved[0])));
}

/* cos' = -sin */
static zs_status cos_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin)
{
    zs_tensor *s = zs_sin(n->saved[0]);
    zs_tensor *d = s ? zs_mul_scalar(s, -1.0) : NULL;
    zs_release(s);
    RETURN_GIN(mul_take(g, d));
}

/* tanh' = 1 - out^2 */
static zs_status tanh_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin)
{
    RETURN_GIN(mul_take(g, one_minus(n->saved[1], true)));
}

/* sigmoid' = out (1 - out) */
static zs_status sigmoid_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin)
{
    zs_tensor *om = one_minus(n->saved[1], false);
    zs_tensor *d = om ? zs_mul(n->saved[1], om) : NULL;
    zs_release(om);
    RETURN_GIN(mul_take(g, d));
}

/* relu, abs, clamp, gelu, silu: g * d(x) with d the node's derivative
 * kernel (x > 0, sign(x), lo <= x <= hi, gelu', silu') of the saved x. */
zsi_opdef zsi_def_deriv = {
    .op = {.name = "unary_deriv"}, .arity = 1, .cls = ZSI_POINTWISE,
    .formula = "the derivative of a unary operator", .scalar = unary_scalar,
    .flops = 2, .infer = zsi_infer_same_float,
    .kernel = CPU_KERNELS(cpu_unary, cpu_unary_lowp),
    .attr_size = sizeof(unary_attrs)};

zs_tensor *zsi_unary_deriv(zs_tensor *x, int kernel, double p0, double p1)
{
    unary_attrs d = {.p0 = p0, .p1 = p1, .kernel = kernel};
    return zsi_run(&zsi_def_deriv, 1, &x, &d);
}

/* The tanh-form GeLU's g * gelu'(x) is zsi_gelu_tanh_grad: one vector pass
 * (linear_gelu_backward, f32 derivative, the fused linear's kernel) where
 * the device has it for the dtype, else unary_deriv (evaluated in double)
 * and mul, as for the other masks. */
static zs_status mask_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin)
{
    const unary_attrs *a = zsi_node_attrs(n);
    zs_tensor *x = n->saved[0];
    if (a->deriv == ZSK_GELU_TANH_GRAD)
        RETURN_GIN(zsi_gelu_tanh_grad(g, x));
    unary_attrs d = {.p0 = a->p0, .p1 = a->p1, .kernel = a->deriv};
    RETURN_GIN(mul_take(g, zsi_run(&zsi_def_deriv, 1, &x, &d)));
}
