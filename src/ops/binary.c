/*
 * binary.c - add, sub, mul, div with numpy broadcasting; scalar forms.
 * (The in-place axpy_ is in inplace.c.)
 *
 * Backward: the gradient of a broadcast input is summed back to its shape
 * (zsi_sum_to). mul and div save their inputs.
 */
#include <string.h>

#include "ops/attrs.h"
#include "kernels/cpu/lowp.h"
#include "ops/internal.h"

static zs_status add_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin);
static zs_status sub_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin);
static zs_status mul_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin);
static zs_status div_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin);
static zs_status add_scalar_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin);
static zs_status mul_scalar_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin);

/* ---- shared checks (declared in ops/internal.h) ------------------------ */

zs_status zsi_check_float_dtype(const char *op, const zs_tensor *t)
{
    if (t->dtype != ZS_F32 && t->dtype != ZS_F64)
        return zs_set_error("%s: dtype %s is not supported, expected f32 or "
                            "f64 (convert with zs_to_dtype)", op,
                            zs_dtype_name(t->dtype));
    return ZS_OK;
}

zs_status zsi_check_float16_dtype(const char *op, const zs_tensor *t)
{
    zs_dtype dt = t->dtype;
    if (dt != ZS_F32 && dt != ZS_F64 && dt != ZS_BF16 && dt != ZS_F16)
        return zs_set_error("%s: dtype %s is not supported, expected f32, "
                            "f64, bf16 or f16 (convert with zs_to_dtype)", op,
                            zs_dtype_name(dt));
    return ZS_OK;
}

/* a and b pass `one` and have one dtype */
static zs_status check_pair(const char *op, const zs_tensor *a, const zs_tensor *b,
                            zs_status (*one)(const char *, const zs_tensor *))
{
    zs_status st = one(op, a);
    if (st == ZS_OK)
        st = one(op, b);
    if (st == ZS_OK && a->dtype != b->dtype)
        st = zs_set_error("%s: dtypes %s and %s differ, expected equal "
                          "(convert with zs_to_dtype)", op,
                          zs_dtype_name(a->dtype), zs_dtype_name(b->dtype));
    return st;
}

zs_status zsi_check_pair_dtype(const char *op, const zs_tensor *a,
                               const zs_tensor *b)
{
    return check_pair(op, a, b, zsi_check_float_dtype);
}

zs_status zsi_check_pair_float16(const char *op, const zs_tensor *a,
                                 const zs_tensor *b)
{
    return check_pair(op, a, b, zsi_check_float16_dtype);
}

zs_status zsi_check_same_float(const char *op, const zs_tensor *a,
                               const zs_tensor *b)
{
    const zs_tensor *bad = !zs_dtype_is_float(a->dtype) ? a : b;
    if (!zs_dtype_is_float(bad->dtype))
        return zs_set_error("%s: dtype %s is not supported, expected a float "
                            "dtype (convert with zs_to_dtype)", op,
                            zs_dtype_name(bad->dtype));
    if (a->dtype != b->dtype)
        return zs_set_error("%s: dtypes %s and %s differ, expected equal "
                            "(convert with zs_to_dtype)", op,
                            zs_dtype_name(a->dtype), zs_dtype_name(b->dtype));
    return ZS_OK;
}

zs_status zsi_check_index(const char *op, const zs_tensor *t)
{
    if (t->dtype != ZS_I32 && t->dtype != ZS_I64)
        return zs_set_error("%s: index dtype %s, expected i32 or i64", op,
                            zs_dtype_name(t->dtype));
    return ZS_OK;
}

zs_status zsi_broadcast_shape(const char *op, const zs_tensor *a,
                              const zs_tensor *b, int *ndim, int64_t *shape)
{
    int n = a->ndim > b->ndim ? a->ndim : b->ndim;
    for (int d = 0; d < n; d++) {
        int da = d - (n - a->ndim), db = d - (n - b->ndim);
        int64_t x = da >= 0 ? a->shape[da] : 1, y = db >= 0 ? b->shape[db] : 1;
        if (x != y && x != 1 && y != 1) {
            char sa[96], sb[96];
            return zs_set_error("%s: shapes %s and %s cannot be broadcast "
                                "(dim %d: %lld vs %lld)", op,
                                zs_shape_str(a, sa, sizeof sa),
                                zs_shape_str(b, sb, sizeof sb), d,
                                (long long)x, (long long)y);
        }
        shape[d] = x == 1 ? y : x;
    }
    *ndim = n;
    return ZS_OK;
}

/* ---- forward ----------------------------------------------------------- */


/* a, b: one float dtype, shapes that broadcast */
static zs_status infer_binary(zsi_call *c)
{
    const zs_tensor *a = c->in[0], *b = c->in[1];
    if (zsi_check_same_float(c->def->op.name, a, b) != ZS_OK)
        return ZS_ERR_ARG;
    c->dtype = a->dtype;
    return zsi_broadcast_shape(c->def->op.name, a, b, &c->ndim, c->shape);
}

static zs_status cpu_binary(const zsi_call *c, zs_tensor *out)
{
    const zs_tensor *a = c->in[0], *b = c->in[1];
    int64_t sa[ZS_MAX_DIMS], sb[ZS_MAX_DIMS];
    zsk_broadcast_strides(a->ndim, a->shape, a->strides, out->ndim, out->shape, sa);
    zsk_broadcast_strides(b->ndim, b->shape, b->strides, out->ndim, out->shape, sb);
    zsk_iter it;
    zsk_iter_init(&it, out->ndim, out->shape, 3, (const int64_t *[]){NULL, sa, sb});
    const binary_attrs *at = c->attrs;
    zsk_binary(a->dtype, (zsk_binop)at->op, &it, zs_data(out), zs_data(a),
               zs_data(b));
    return ZS_OK;
}

static zs_status cpu_scalar(const zsi_call *c, zs_tensor *out)
{
    const zs_tensor *a = c->in[0];
    zsk_iter it;
    zsk_iter_init(&it, a->ndim, a->shape, 2, (const int64_t *[]){NULL, a->strides});
    const binary_attrs *at = c->attrs;
    zsk_binary_scalar(a->dtype, (zsk_binop)at->op, &it, zs_data(out),
                      zs_data(a), at->s);
    return ZS_OK;
}

/* bf16 a, b and out of one shape, contiguous (a gradient summed in
 * backward, a residual): blocks widened on the stack, the f32 operation,
 * one rounding; the bits of the zsi_via_f32 path without its three f32
 * tensors and passes (it ran at 1/10 of the f32 add's speed). */
#define LOWP_BLOCK 1024
typedef struct lowp_bin {
    zsk_binop op;
    const uint16_t *a, *b;
    uint16_t *o;
} lowp_bin;

static void lowp_bin_range(void *p, int64_t i0, int64_t i1)
{
    const lowp_bin *j = p;
    float x[LOWP_BLOCK], y[LOWP_BLOCK];
    for (int64_t s = i0; s < i1; s += LOWP_BLOCK) {
        int64_t n = i1 - s < LOWP_BLOCK ? i1 - s : LOWP_BLOCK;
        zsk_widen16(ZS_BF16, j->a + s, x, n);
        zsk_widen16(ZS_BF16, j->b + s, y, n);
        switch (j->op) {
        case ZSK_ADD: for (int64_t k = 0; k < n; k++) x[k] += y[k]; break;
        case ZSK_SUB: for (int64_t k = 0; k < n; k++) x[k] -= y[k]; break;
        case ZSK_MUL: for (int64_t k = 0; k < n; k++) x[k] *= y[k]; break;
        case ZSK_DIV: for (int64_t k = 0; k < n; k++) x[k] /= y[k]; break;
        }
        zsk_narrow16(ZS_BF16, x, j->o + s, n);
    }
}

static zs_status cpu_binary_lowp(const zsi_call *c, zs_tensor *out)
{
    const zs_tensor *a = c->in[0], *b = c->in[1];
    if (out->dtype == ZS_BF16 && a->dtype == ZS_BF16 && b->dtype == ZS_BF16 &&
        zs_same_shape(a, out) && zs_same_shape(b, out) && zs_is_contiguous(a) &&
        zs_is_contiguous(b)) {
        const binary_attrs *at = c->attrs;
        lowp_bin j = {(zsk_binop)at->op, zs_data(a), zs_data(b), zs_data(out)};
        zs_parallel_for(zs_numel(out), 16384, lowp_bin_range, &j);
        return ZS_OK;
    }
    return zsi_via_f32(c, out, cpu_binary);
}

static zs_status cpu_scalar_lowp(const zsi_call *c, zs_tensor *out)
{
    return zsi_via_f32(c, out, cpu_scalar);
}

static void save_inputs(zsi_ctx *n, const zsi_call *c, zs_tensor *out)
{
    zsi_save(n, 0, c->in[0]);
    zsi_save(n, 1, c->in[1]);
}

/* The formulas in double: x[0] op y, y = b (x[1]) or the scalar forms' s. */
static double apply(const binary_attrs *a, double x, double y)
{
    switch ((zsk_binop)a->op) {
    case ZSK_ADD: return x + y;
    case ZSK_SUB: return x - y;
    case ZSK_MUL: return x * y;
    default: return x / y;
    }
}

static double binary_scalar_fn(const double *x, const void *attrs)
{
    return apply(attrs, x[0], x[1]);
}

static double scalar_form_fn(const double *x, const void *attrs)
{
    const binary_attrs *a = attrs;
    return apply(a, x[0], a->s);
}

/* What zsi_sum_to runs (bf16 and f16 sum in f32) */
#define SUM_TO &zsi_def_sum, &zsi_def_view, &zsi_def_to_dtype

#define BINARY(var, nm, form, bw, sv, ...)                                    \
    zsi_opdef var = {                                                         \
        .op = {.name = nm, .backward = bw}, .arity = 2,                       \
        .cls = ZSI_POINTWISE, .formula = form, .scalar = binary_scalar_fn,    \
        .flops = 1, .infer = infer_binary,                                    \
        .kernel = {[ZS_CPU] = {[ZS_F32] = cpu_binary, [ZS_F64] = cpu_binary,  \
                               [ZS_BF16] = cpu_binary_lowp,                   \
                               [ZS_F16] = cpu_binary_lowp}},                  \
        .save = sv, .attr_size = sizeof(binary_attrs),                        \
        .bw_ops = (zsi_opdef *const[]){__VA_ARGS__, NULL}}
#define SCALAR(var, nm, form, bw, bwops)                                      \
    zsi_opdef var = {                                                         \
        .op = {.name = nm, .backward = bw}, .arity = 1,                       \
        .cls = ZSI_POINTWISE, .formula = form, .scalar = scalar_form_fn,      \
        .flops = 1, .infer = zsi_infer_same_float,                            \
        .kernel = {[ZS_CPU] = {[ZS_F32] = cpu_scalar, [ZS_F64] = cpu_scalar,  \
                               [ZS_BF16] = cpu_scalar_lowp,                   \
                               [ZS_F16] = cpu_scalar_lowp}},                  \
        .attr_size = sizeof(binary_attrs),                                    \
        .bw_ops = bwops}

BINARY(zsi_def_add, "add", "a + b", add_bw, NULL, SUM_TO);
BINARY(zsi_def_sub, "sub", "a - b", sub_bw, NULL, &zsi_def_neg, SUM_TO);
BINARY(zsi_def_mul, "mul", "a * b", mul_bw, save_inputs, &zsi_def_mul, SUM_TO);
BINARY(zsi_def_div, "div", "a / b", div_bw, save_inputs, &zsi_def_div,
       &zsi_def_mul, &zsi_def_neg, SUM_TO);
SCALAR(zsi_def_add_scalar, "add_scalar", "a + s", add_scalar_bw,
       (zsi_opdef *const[]){NULL}); /* the identity */
SCALAR(zsi_def_mul_scalar, "mul_scalar", "a * s", mul_scalar_bw,
       ((zsi_opdef *const[]){&zsi_def_mul_scalar, NULL}));

static zs_tensor *binary(zsi_opdef *d, zsk_binop k, zs_tensor *a, zs_tensor *b)
{
    binary_attrs at = {.op = k};
    return zsi_run(d, 2, (zs_tensor *[]){a, b}, &at);
}

zs_tensor *zs_add(zs_tensor *a, zs_tensor *b) { return binary(&zsi_def_add, ZSK_ADD, a, b); }
zs_tensor *zs_sub(zs_tensor *a, zs_tensor *b) { return binary(&zsi_def_sub, ZSK_SUB, a, b); }
zs_tensor *zs_mul(zs_tensor *a, zs_tensor *b) { return binary(&zsi_def_mul, ZSK_MUL, a, b); }
zs_tensor *zs_div(zs_tensor *a, zs_tensor *b) { return binary(&zsi_def_div, ZSK_DIV, a, b); }

zs_tensor *zs_add_scalar(zs_tensor *a, double s)
{
    binary_attrs at = {.s = s, .op = ZSK_ADD};
    return zsi_run(&zsi_def_add_scalar, 1, &a, &at);
}

zs_tensor *zs_mul_scalar(zs_tensor *a, double s)
{
    binary_attrs at = {.s = s, .op = ZSK_MUL};
    return zsi_run(&zsi_def_mul_scalar, 1, &a, &at);
}

/* ---- backward ---------------------------------------------------------- */

static zs_status add_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin)
{
    for (int i = 0; i < 2; i++)
        if (zsi_needs_grad(n, i) && !(gin[i] = zsi_sum_to(g, &n->in_meta[i])))
            return ZS_ERR_NOMEM;
    return ZS_OK;
}

static zs_status sub_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin)
{
    if (zsi_needs_grad(n, 0) && !(gin[0] = zsi_sum_to(g, &n->in_meta[0])))
        return ZS_ERR_NOMEM;
    if (zsi_needs_grad(n, 1)) {
        zs_tensor *ng = zs_neg(g);
        gin[1] = ng ? zsi_sum_to(ng, &n->in_meta[1]) : NULL;
        zs_release(ng);
        if (!gin[1])
            return ZS_ERR_NOMEM;
    }
    return ZS_OK;
}

static zs_status mul_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin)
{
    for (int i = 0; i < 2; i++) {
        if (!zsi_needs_grad(n, i))
            continue;
        zs_tensor *t = zs_mul(g, n->saved[1 - i]);
        gin[i] = t ? zsi_sum_to(t, &n->in_meta[i]) : NULL;
        zs_release(t);
        if (!gin[i])
            return ZS_ERR_NOMEM;
    }
    return ZS_OK;
}

/* d(a/b)/da = 1/b, d(a/b)/db = -a/b^2 */
static zs_status div_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin)
{
    zs_tensor *a = n->saved[0], *b = n->saved[1];
    zs_tensor *gb = zs_div(g, b); /* g / b */
    if (!gb)
        return ZS_ERR_NOMEM;
    if (zsi_needs_grad(n, 0))
        gin[0] = zsi_sum_to(gb, &n->in_meta[0]);
    if (zsi_needs_grad(n, 1)) {
        zs_tensor *q = zs_div(a, b);
        zs_tensor *t = q ? zs_mul(gb, q) : NULL;
        zs_tensor *nt = t ? zs_neg(t) : NULL;
        gin[1] = nt ? zsi_sum_to(nt, &n->in_meta[1]) : NULL;
        zs_release(q);
        zs_release(t);
        zs_release(nt);
    }
    zs_release(gb);
    if ((zsi_needs_grad(n, 0) && !gin[0]) || (zsi_needs_grad(n, 1) && !gin[1]))
        return ZS_ERR_NOMEM;
    return ZS_OK;
}

static zs_status add_scalar_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin)
{
    gin[0] = zs_retain(g);
    return ZS_OK;
}

static zs_status mul_scalar_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin)
{
    const binary_attrs *a = zsi_node_attrs(n);
    gin[0] = zs_mul_scalar(g, a->s);
    return gin[0] ? ZS_OK : ZS_ERR_NOMEM;
}
