/*
 * unary.c - elementwise functions of one tensor: neg, exp, log, sqrt,
 * rsqrt, pow (scalar exponent), sin, cos, tanh, sigmoid, relu, gelu (erf
 * and tanh forms), silu, abs, clamp.
 *
 * One forward driver (unary) checks the dtype, allocates a contiguous
 * output of the input's shape, runs zsk_unary (any input strides) and
 * records a node saving the input and/or output that the backward rule
 * needs. Backward rules are written with other zs_* operators; masks and
 * derivatives with no operator of their own (x > 0, sign, lo <= x <= hi,
 * gelu' and silu') come from internal kernels run by deriv().
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

#include "kernels/cpu/unary.h"
#include "ops/internal.h"

enum { SAVE_IN = 1, SAVE_OUT = 2 };

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

static zsi_op OP_NEG = {.name = "neg", .backward = neg_bw};
static zsi_op OP_EXP = {.name = "exp", .backward = exp_bw};
static zsi_op OP_LOG = {.name = "log", .backward = log_bw};
static zsi_op OP_SQRT = {.name = "sqrt", .backward = sqrt_bw};
static zsi_op OP_RSQRT = {.name = "rsqrt", .backward = rsqrt_bw};
static zsi_op OP_POW = {.name = "pow", .backward = pow_bw};
static zsi_op OP_SIN = {.name = "sin", .backward = sin_bw};
static zsi_op OP_COS = {.name = "cos", .backward = cos_bw};
static zsi_op OP_TANH = {.name = "tanh", .backward = tanh_bw};
static zsi_op OP_SIGMOID = {.name = "sigmoid", .backward = sigmoid_bw};
/* These multiply g by a derivative kernel of the saved input (mask_bw). */
static zsi_op OP_RELU = {.name = "relu", .backward = mask_bw};
static zsi_op OP_GELU = {.name = "gelu", .backward = mask_bw};
static zsi_op OP_SILU = {.name = "silu", .backward = mask_bw};
static zsi_op OP_ABS = {.name = "abs", .backward = mask_bw};
static zsi_op OP_CLAMP = {.name = "clamp", .backward = mask_bw};

/* Node parameters: p.f[0], p.f[1] = kernel parameters, p.i[2] = the
 * derivative kernel used by mask_bw. */
#define P_DERIV 2

/* ---- forward ----------------------------------------------------------- */

/* Runs kernel k on a into a new contiguous tensor; no autograd. */
static zs_tensor *apply(zsk_unop k, zs_tensor *a, double p0, double p1)
{
    zs_tensor *out = zsi_new_tensor(a->dtype, a->ndim, a->shape);
    if (!out)
        return NULL;
    zsk_iter it;
    zsk_iter_init(&it, a->ndim, a->shape, 2, (const int64_t *[]){NULL, a->strides});
    zsk_unary(a->dtype, k, &it, zs_data(out), zs_data(a), p0, p1);
    return out;
}

/* The shared forward: checks, kernel k, node saving what `save` names,
 * parameters p0/p1 (and the derivative kernel for mask_bw), cost model
 * `flops` per element. */
static zs_tensor *unary(zsi_op *op, zsk_unop k, zs_tensor *a, double p0,
                        double p1, int save, zsk_unop deriv, double flops)
{
    if (!a)
        return NULL;
    double t0 = zsi_op_begin(op);
    if (zsi_check_float(op->name, a) != ZS_OK)
        return NULL;
    zs_tensor *out = apply(k, a, p0, p1);
    if (!out)
        return NULL;
    zsi_ctx *n;
    if (zsi_record(op, out, 1, &a, &n) != ZS_OK) {
        zs_release(out);
        return NULL;
    }
    if (n) {
        n->p.f[0] = p0;
        n->p.f[1] = p1;
        n->p.i[P_DERIV] = deriv;
        if (save & SAVE_IN)
            zsi_save(n, 0, a);
        if (save & SAVE_OUT)
            zsi_save(n, 1, out);
    }
    zsi_op_end(op, t0, flops * (double)zs_numel(out), zsi_bytes(a),
               zsi_bytes(out));
    return out;
}

zs_tensor *zs_neg(zs_tensor *a)
{
    if (!a)
        return NULL;
    double t0 = zsi_op_begin(&OP_NEG);
    if (zsi_check_float("neg", a) != ZS_OK)
        return NULL;
    zs_tensor *out = zsi_new_tensor(a->dtype, a->ndim, a->shape);
    if (!out)
        return NULL;
    zsk_iter it;
    zsk_iter_init(&it, a->ndim, a->shape, 2, (const int64_t *[]){NULL, a->strides});
    zsk_binary_scalar(a->dtype, ZSK_MUL, &it, zs_data(out), zs_data(a), -1.0);
    zsi_ctx *n;
    if (zsi_record(&OP_NEG, out, 1, &a, &n) != ZS_OK) {
        zs_release(out);
        return NULL;
    }
    zsi_op_end(&OP_NEG, t0, (double)zs_numel(out), zsi_bytes(a), zsi_bytes(out));
    return out;
}

zs_tensor *zs_exp(zs_tensor *a)
{
    return unary(&OP_EXP, ZSK_EXP, a, 0, 0, SAVE_OUT, 0, 12);
}

zs_tensor *zs_log(zs_tensor *a)
{
    return unary(&OP_LOG, ZSK_LOG, a, 0, 0, SAVE_IN, 0, 15);
}

zs_tensor *zs_sqrt(zs_tensor *a)
{
    return unary(&OP_SQRT, ZSK_SQRT, a, 0, 0, SAVE_OUT, 0, 1);
}

zs_tensor *zs_rsqrt(zs_tensor *a)
{
    return unary(&OP_RSQRT, ZSK_RSQRT, a, 0, 0, SAVE_OUT, 0, 2);
}

zs_tensor *zs_pow(zs_tensor *a, double p)
{
    return unary(&OP_POW, ZSK_POW, a, p, 0, SAVE_IN, 0, p == 2.0 ? 1 : 20);
}

zs_tensor *zs_sin(zs_tensor *a)
{
    return unary(&OP_SIN, ZSK_SIN, a, 0, 0, SAVE_IN, 0, 15);
}

zs_tensor *zs_cos(zs_tensor *a)
{
    return unary(&OP_COS, ZSK_COS, a, 0, 0, SAVE_IN, 0, 15);
}

zs_tensor *zs_tanh(zs_tensor *a)
{
    return unary(&OP_TANH, ZSK_TANH, a, 0, 0, SAVE_OUT, 0, 18);
}

zs_tensor *zs_sigmoid(zs_tensor *a)
{
    return unary(&OP_SIGMOID, ZSK_SIGMOID, a, 0, 0, SAVE_OUT, 0, 15);
}

zs_tensor *zs_relu(zs_tensor *a)
{
    return unary(&OP_RELU, ZSK_RELU, a, 0, 0, SAVE_IN, ZSK_STEP, 1);
}

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
        return unary(&OP_GELU, ZSK_GELU_TANH, a, 0, 0, SAVE_IN,
                     ZSK_GELU_TANH_GRAD, 30);
    return unary(&OP_GELU, ZSK_GELU_ERF, a, 0, 0, SAVE_IN, ZSK_GELU_ERF_GRAD, 40);
}

zs_tensor *zs_silu(zs_tensor *a)
{
    return unary(&OP_SILU, ZSK_SILU, a, 0, 0, SAVE_IN, ZSK_SILU_GRAD, 16);
}

zs_tensor *zs_abs(zs_tensor *a)
{
    return unary(&OP_ABS, ZSK_ABS, a, 0, 0, SAVE_IN, ZSK_SIGN, 1);
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
    return unary(&OP_CLAMP, ZSK_CLAMP, a, lo, hi, SAVE_IN, ZSK_INRANGE, 2);
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
    double p = n->p.f[0];
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
static zs_status mask_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin)
{
    zs_tensor *x = n->saved[0];
    RETURN_GIN(mul_take(g, apply((zsk_unop)n->p.i[P_DERIV], x, n->p.f[0],
                                 n->p.f[1])));
}
