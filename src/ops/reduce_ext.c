/*
 * reduce_ext.c - max, argmax and var over any set of axes as descriptors
 * (class ZSI_REDUCTION), on the mask, shape rule and [O, R, K] plan of
 * reduce.c (kernels in kernels/cpu/reduce_ext.c). Typed attributes, one
 * struct per operator: max_attrs and var_attrs hold the mask of reduced
 * axes (bit d = axis d) and keepdim, argmax_attrs one dim and keepdim.
 *
 * max: NaN counts as the maximum. Its gradient is split equally among tied
 * maxima (as torch.amax; a single maximum gets all of it). The backward
 * rule runs the descriptor "max_backward" (inputs x, y, g; one fused
 * kernel, zsk_reduce_max_backward, on the plan's [O, R, K] layout, not
 * itself differentiable) and permutes its result back to the input's
 * layout when the axes were not one block. Saved: 0 input, 1 output.
 *
 * argmax: index (i64) of the first maximum along one dim; no node (it runs
 * with grad mode off).
 *
 * var: fused two-pass kernel in double (mean, then squared deviations),
 * divisor max(0, n - correction). Backward,
 * written with zs_* ops: gx = 2 (x - mean) / (n - correction) * g. Saved:
 * 0 input, 1 the mean in the keepdim shape (an aux result of the forward
 * kernel, made only when a node is recorded).
 *
 * bf16 / f16 (every operator here): the f32 kernel on an f32 copy of the
 * input (zsi_via_f32: one conversion, the result rounded once into the
 * input's dtype; argmax's i64 indices exact). var's saved mean is then
 * f32 (the statistics stay f32) and its backward computes in f32, the
 * gradient rounded to x's dtype.
 *
 * Cost models (zsi_reduce_cost): each element read once; max and argmax
 * 1 FLOP per element, var 3. max_backward: 1 FLOP per input element, x, y
 * and g read, gx written.
 */
#include <string.h>

#include "kernels/cpu/reduce_ext.h"
#include "ops/internal.h"

static zs_status max_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin);
static zs_status var_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin);

/* The attributes of max and max_backward. */
typedef struct max_attrs {
    int64_t mask; /* bit d: axis d is reduced */
    bool keepdim;
} max_attrs;
ZSI_ATTRS(max_attrs);

typedef struct argmax_attrs {
    int64_t dim; /* any sign */
    bool keepdim;
} argmax_attrs;
ZSI_ATTRS(argmax_attrs);

typedef struct var_attrs {
    int64_t mask;       /* bit d: axis d is reduced */
    int64_t correction; /* divisor n - correction; >= 0 */
    bool keepdim;
} var_attrs;
ZSI_ATTRS(var_attrs);

static zs_status check_nonempty(const zsi_call *c, int64_t mask)
{
    const zs_tensor *a = c->in[0];
    int64_t keep[ZS_MAX_DIMS];
    if (zsi_reduce_keep(a->ndim, a->shape, mask, keep) > 0)
        return ZS_OK;
    char s[96];
    return zs_set_error("%s: cannot reduce a tensor of shape %s over a "
                        "zero-size dim, expected at least one element",
                        c->def->op.name, zs_shape_str(a, s, sizeof s));
}

/* ---- max --------------------------------------------------------------- */

static zs_status infer_max(zsi_call *c)
{
    const max_attrs *at = c->attrs;
    if (zsi_infer_reduce(c, at->mask, at->keepdim) != ZS_OK)
        return ZS_ERR_ARG;
    return check_nonempty(c, at->mask);
}

static zs_status cpu_max(const zsi_call *c, zs_tensor *out)
{
    const max_attrs *at = c->attrs;
    zsi_reduce_plan p;
    if (zsi_reduce_plan_make(c->in[0], at->mask, &p) != ZS_OK)
        return ZS_ERR_NOMEM;
    zsk_reduce_max(out->dtype, zs_data(p.x), p.O, p.R, p.K, zs_data(out), NULL);
    zs_release(p.x);
    return ZS_OK;
}

static zs_status cpu_max_lowp(const zsi_call *c, zs_tensor *out)
{
    return zsi_via_f32(c, out, cpu_max);
}

static void save_in_out(zsi_ctx *n, const zsi_call *c, zs_tensor *out)
{
    zsi_save(n, 0, c->in[0]);
    zsi_save(n, 1, out);
}

/* ---- max backward ------------------------------------------------------ */

/* The layout of max's gradient as its kernel writes it: x's dims in the
 * plan's order (kept dims, then reduced ones, when the reduced axes are
 * not one block; else x's own order): shape[k] = x's dim order[k], and
 * inv[d] = the position of x's dim d. Returns whether the axes are one
 * block (the layout is x's). */
static bool max_grad_layout(int nd, const int64_t *xshape, int64_t mask,
                            int64_t *shape, int *inv)
{
    int naxes = 0, first = -1, last = -1, k = 0;
    for (int d = 0; d < nd; d++)
        if (mask >> d & 1) {
            naxes++;
            first = first < 0 ? d : first;
            last = d;
        }
    bool block = naxes == 0 || last - first + 1 == naxes;
    for (int pass = block ? 1 : 0; pass < 2; pass++)
        for (int d = 0; d < nd; d++)
            if (block || (int)(mask >> d & 1) == pass) {
                inv[d] = k;
                shape[k++] = xshape[d];
            }
    return block;
}

/* Inputs x, y = max(x) and g (like y, or any shape with y's element
 * count), one float dtype; the result gx in max_grad_layout's layout. */
static zs_status infer_max_backward(zsi_call *c)
{
    const max_attrs *at = c->attrs;
    const zs_tensor *x = c->in[0], *y = c->in[1], *g = c->in[2];
    if (zsi_infer_reduce(c, at->mask, at->keepdim) != ZS_OK ||
        zsi_check_pair_float16("max_backward", x, y) != ZS_OK ||
        zsi_check_pair_float16("max_backward", x, g) != ZS_OK)
        return ZS_ERR_ARG;
    int64_t m = zsi_shape_numel(c->ndim, c->shape);
    if (zs_numel(y) != m || zs_numel(g) != m) {
        char sx[96], sy[96], sg[96];
        return zs_set_error("max_backward: x %s, y %s, g %s: expected y and "
                            "g of %lld elements (x reduced by the mask)",
                            zs_shape_str(x, sx, sizeof sx),
                            zs_shape_str(y, sy, sizeof sy),
                            zs_shape_str(g, sg, sizeof sg), (long long)m);
    }
    int inv[ZS_MAX_DIMS];
    c->ndim = x->ndim;
    max_grad_layout(x->ndim, x->shape, at->mask, c->shape, inv);
    return ZS_OK;
}

static zs_status cpu_max_backward(const zsi_call *c, zs_tensor *gx)
{
    const max_attrs *at = c->attrs;
    zsi_reduce_plan p;
    if (zsi_reduce_plan_make(c->in[0], at->mask, &p) != ZS_OK)
        return ZS_ERR_NOMEM;
    zs_tensor *yc = zsi_contig_host(c->in[1]), *gc = yc ? zsi_contig_host(c->in[2]) : NULL;
    if (gc)
        zsk_reduce_max_backward(gx->dtype, zs_data(p.x), zs_data(yc),
                                zs_data(gc), p.O, p.R, p.K, zs_data(gx));
    zs_release(p.x);
    zs_release(yc);
    zs_release(gc);
    return gc ? ZS_OK : ZS_ERR_NOMEM;
}

static zs_status cpu_max_backward_lowp(const zsi_call *c, zs_tensor *gx)
{
    return zsi_via_f32(c, gx, cpu_max_backward);
}

/* 1 FLOP per input element; x, y and g read, gx written */
static zsi_cost max_backward_cost(const zsi_call *c, const zs_tensor *gx)
{
    return (zsi_cost){(double)zs_numel(gx),
                      zsi_bytes(c->in[0]) + zsi_bytes(c->in[1]) +
                          zsi_bytes(c->in[2]),
                      zsi_bytes(gx)};
}

zsi_opdef zsi_def_max_backward = {
    .op = {.name = "max_backward"}, .arity = 3, .infer = infer_max_backward,
    .kernel = {[ZS_CPU] = {[ZS_F32] = cpu_max_backward,
                           [ZS_F64] = cpu_max_backward,
                           [ZS_BF16] = cpu_max_backward_lowp,
                           [ZS_F16] = cpu_max_backward_lowp}},
    .cost = max_backward_cost, .attr_size = sizeof(max_attrs)};

zsi_opdef zsi_def_max = {
    .op = {.name = "max", .backward = max_bw}, .arity = 1,
    .cls = ZSI_REDUCTION, .flops = 1, .infer = infer_max,
    .kernel = {[ZS_CPU] = {[ZS_F32] = cpu_max, [ZS_F64] = cpu_max,
                           [ZS_BF16] = cpu_max_lowp, [ZS_F16] = cpu_max_lowp}},
    .save = save_in_out, .cost = zsi_reduce_cost,
    .attr_size = sizeof(max_attrs),
    .bw_ops = (zsi_opdef *const[]){&zsi_def_max_backward, NULL}};

zs_tensor *zs_max(zs_tensor *a, int naxes, const int *axes, bool keepdim)
{
    int64_t mask = a ? zsi_axes_bits("max", a->ndim, naxes, axes) : -1;
    max_attrs at = {.mask = mask, .keepdim = keepdim};
    return mask < 0 ? NULL : zsi_run(&zsi_def_max, 1, &a, &at);
}

/* gx by max_backward in its layout, then viewed back in x's dim order. */
static zs_status max_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin)
{
    const max_attrs *at = zsi_node_attrs(n);
    const zsi_meta *m = &n->in_meta[0];
    int64_t shape[ZS_MAX_DIMS];
    int inv[ZS_MAX_DIMS]; /* gx dim inv[d] is x's dim d */
    bool block = max_grad_layout(m->ndim, m->shape, at->mask, shape, inv);
    zs_tensor *gx = zsi_run(&zsi_def_max_backward, 3,
                            (zs_tensor *[]){n->saved[0], n->saved[1], g}, at);
    gin[0] = block || !gx ? zs_retain(gx) : zs_permute(gx, inv);
    zs_release(gx);
    return gin[0] ? ZS_OK : ZS_ERR_NOMEM;
}

/* ---- argmax ------------------------------------------------------------ */

/* A 0-d input (torch: the only element is at index 0) accepts dim 0 or
 * -1. */
static zs_status infer_argmax(zsi_call *c)
{
    const argmax_attrs *at = c->attrs;
    const zs_tensor *a = c->in[0];
    int dim = (int)at->dim;
    if (zsi_check_float16_dtype("argmax", a) != ZS_OK)
        return ZS_ERR_ARG;
    c->dtype = ZS_I64;
    c->ndim = 0;
    if (a->ndim == 0)
        return dim == 0 || dim == -1 ? ZS_OK
                   : zs_set_error("argmax: dim %d out of range for a 0-d "
                                  "tensor", dim);
    int d = zsi_norm_dim("argmax", dim, a->ndim);
    if (d < 0)
        return ZS_ERR_ARG;
    for (int i = 0; i < a->ndim; i++)
        if (i != d || at->keepdim)
            c->shape[c->ndim++] = i == d ? 1 : a->shape[i];
    return check_nonempty(c, (int64_t)1 << d);
}

static zs_status cpu_argmax(const zsi_call *c, zs_tensor *out)
{
    const argmax_attrs *at = c->attrs;
    zs_tensor *a = c->in[0];
    if (a->ndim == 0) {
        *(int64_t *)zs_data(out) = 0;
        return ZS_OK;
    }
    int d = (int)at->dim < 0 ? (int)at->dim + a->ndim : (int)at->dim;
    zsi_reduce_plan p;
    if (zsi_reduce_plan_make(a, (int64_t)1 << d, &p) != ZS_OK)
        return ZS_ERR_NOMEM;
    zsk_reduce_max(a->dtype, zs_data(p.x), p.O, p.R, p.K, NULL, zs_data(out));
    zs_release(p.x);
    return ZS_OK;
}

/* bf16 / f16: argmax of the exact f32 widening (a host copy). */
static zs_status cpu_argmax_lowp(const zsi_call *c, zs_tensor *out)
{
    zs_tensor *a = c->in[0];
    zsi_tracking_pause();
    zs_tensor *a32 = zsi_new_tensor_on(c->device, ZS_F32, a->ndim, a->shape);
    zs_status st = a32 ? zsi_copy_host(a32, a) : ZS_ERR_NOMEM;
    if (st == ZS_OK) {
        zsi_call c32 = *c;
        c32.in = (zs_tensor *const[]){a32};
        c32.key = ZS_F32;
        st = cpu_argmax(&c32, out);
    }
    zs_release(a32);
    zsi_tracking_resume();
    return st;
}

zsi_opdef zsi_def_argmax = {
    .op = {.name = "argmax"}, .arity = 1,
    .cls = ZSI_REDUCTION, .flops = 1, .infer = infer_argmax,
    .kernel = {[ZS_CPU] = {[ZS_F32] = cpu_argmax, [ZS_F64] = cpu_argmax,
                           [ZS_BF16] = cpu_argmax_lowp,
                           [ZS_F16] = cpu_argmax_lowp}},
    .cost = zsi_reduce_cost, .attr_size = sizeof(argmax_attrs)};

zs_tensor *zs_argmax(zs_tensor *a, int dim, bool keepdim)
{
    argmax_attrs at = {.dim = dim, .keepdim = keepdim};
    zs_no_grad_push(); /* not differentiable: no node */
    zs_tensor *out = zsi_run(&zsi_def_argmax, 1, &a, &at);
    zs_no_grad_pop();
    return out;
}

/* ---- var --------------------------------------------------------------- */

static zs_status infer_var(zsi_call *c)
{
    const var_attrs *at = c->attrs;
    if (zsi_infer_reduce(c, at->mask, at->keepdim) != ZS_OK)
        return ZS_ERR_ARG;
    if (at->correction < 0)
        return zs_set_error("var: correction %d, expected >= 0",
                            (int)at->correction);
    return ZS_OK;
}

/* aux[0]: the mean in the keepdim shape, when a node is recorded. */
static zs_status cpu_var(const zsi_call *c, zs_tensor *out)
{
    const var_attrs *at = c->attrs;
    zs_tensor *a = c->in[0];
    zsi_reduce_plan p;
    if (zsi_reduce_plan_make(a, at->mask, &p) != ZS_OK)
        return ZS_ERR_NOMEM;
    zs_tensor *mean = NULL;
    if (zsi_call_records(c))
        mean = zsi_aux_new(c, 0, a->dtype, a->ndim, p.keep_shape);
    if (mean || !zsi_call_records(c))
        zsk_reduce_var(a->dtype, zs_data(p.x), p.O, p.R, p.K, at->correction,
                       zs_data(out), mean ? zs_data(mean) : NULL);
    zs_release(p.x);
    return mean || !zsi_call_records(c) ? ZS_OK : ZS_ERR_NOMEM;
}

/* bf16 / f16: the mean (aux 0) is f32 */
static zs_status cpu_var_lowp(const zsi_call *c, zs_tensor *out)
{
    return zsi_via_f32(c, out, cpu_var);
}

static void save_var(zsi_ctx *n, const zsi_call *c, zs_tensor *out)
{
    zsi_save(n, 0, c->in[0]);
    zsi_save(n, 1, c->aux[0]);
}

zsi_opdef zsi_def_var = {
    .op = {.name = "var", .backward = var_bw}, .arity = 1,
    .cls = ZSI_REDUCTION, .flops = 3, .infer = infer_var,
    .kernel = {[ZS_CPU] = {[ZS_F32] = cpu_var, [ZS_F64] = cpu_var,
                           [ZS_BF16] = cpu_var_lowp, [ZS_F16] = cpu_var_lowp}},
    .save = save_var, .cost = zsi_reduce_cost,
    .attr_size = sizeof(var_attrs),
    .bw_ops = (zsi_opdef *const[]){&zsi_def_sub, &zsi_def_mul,
                                   &zsi_def_mul_scalar, &zsi_def_to_dtype,
                                   NULL}};

zs_tensor *zs_var(zs_tensor *a, int naxes, const int *axes, int correction,
                  bool keepdim)
{
    int64_t mask = a ? zsi_axes_bits("var", a->ndim, naxes, axes) : -1;
    var_attrs at = {.mask = mask, .correction = correction, .keepdim = keepdim};
    return mask < 0 ? NULL : zsi_run(&zsi_def_var, 1, &a, &at);
}

/* A new reference to t in dtype dt (t retained when it has it). */
static zs_tensor *as_dtype(zs_tensor *t, zs_dtype dt)
{
    return !t ? NULL : t->dtype == dt ? zs_retain(t) : zs_to_dtype(t, dt);
}

/* In the mean's dtype (f32 for a bf16 / f16 x), rounded to x's at the
 * end. */
static zs_status var_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin)
{
    const var_attrs *at = zsi_node_attrs(n);
    zs_tensor *mean = n->saved[1];
    zs_tensor *x = as_dtype(n->saved[0], mean->dtype), *gc = as_dtype(g, mean->dtype);
    int64_t keep[ZS_MAX_DIMS];
    double div = x ? (double)zsi_reduce_keep(x->ndim, x->shape, at->mask, keep) -
                         (double)at->correction : 0;
    zs_tensor *d = x ? zs_sub(x, mean) : NULL;
    zs_tensor *gk = x && gc ? zs_reshape(gc, x->ndim, keep) : NULL;
    zs_tensor *t = d && gk ? zs_mul(d, gk) : NULL;
    zs_tensor *r = t ? zs_mul_scalar(t, 2.0 / (div > 0 ? div : 0)) : NULL;
    gin[0] = as_dtype(r, n->in_meta[0].dtype);
    zs_tensor *all[] = {x, gc, d, gk, t, r};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        zs_release(all[i]);
    return gin[0] ? ZS_OK : ZS_ERR_NOMEM;
}
