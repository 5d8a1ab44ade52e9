/*
 * reduce_ext.c - max, argmax and var over any set of axes as descriptors
 * (class ZSI_REDUCTION), on the mask, shape rule and [O, R, K] plan of
 * reduce.c (kernels in kernels/cpu/reduce_ext.c). Attributes as reduce.c:
 * i[0] = mask of reduced axes, i[1] = keepdim (node: p.i[4], p.i[5]).
 *
 * max: NaN counts as the maximum. Its gradient is split equally among tied
 * maxima (as torch.amax; a single maximum gets all of it). The backward is
 * a fused kernel (zsk_reduce_max_backward) on the plan's [O, R, K] layout,
 * permuted back to the input's layout when the axes were not one block; it
 * is not itself differentiable. Saved: 0 input, 1 output.
 *
 * argmax: index (i64) of the first maximum along one dim (i[0] = dim); no
 * node (it runs with grad mode off).
 *
 * var: fused two-pass kernel in double (mean, then squared deviations),
 * divisor max(0, n - correction), i[2] = correction (p.i[6]). Backward,
 * written with zs_* ops: gx = 2 (x - mean) / (n - correction) * g. Saved:
 * 0 input, 1 the mean in the keepdim shape (an aux result of the forward
 * kernel, made only when a node is recorded).
 *
 * Cost models (zsi_reduce_cost): each element read once; max and argmax
 * 1 FLOP per element, var 3.
 */
#include <string.h>

#include "kernels/cpu/reduce_ext.h"
#include "ops/internal.h"

static zs_status max_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin);
static zs_status var_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin);

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
    if (zsi_infer_reduce(c) != ZS_OK)
        return ZS_ERR_ARG;
    return check_nonempty(c, c->a->i[0]);
}

static zs_status cpu_max(const zsi_call *c, zs_tensor *out)
{
    zsi_reduce_plan p;
    if (zsi_reduce_plan_make(c->in[0], c->a->i[0], &p) != ZS_OK)
        return ZS_ERR_NOMEM;
    zsk_reduce_max(out->dtype, zs_data(p.x), p.O, p.R, p.K, zs_data(out), NULL);
    zs_release(p.x);
    return ZS_OK;
}

static void save_in_out(zsi_ctx *n, const zsi_call *c, zs_tensor *out)
{
    zsi_save(n, 0, c->in[0]);
    zsi_save(n, 1, out);
}

zsi_opdef zsi_def_max = {
    .op = {.name = "max", .backward = max_bw}, .arity = 1,
    .cls = ZSI_REDUCTION, .flops = 1, .infer = infer_max,
    .kernel = {[ZS_CPU] = {[ZS_F32] = cpu_max, [ZS_F64] = cpu_max}},
    .save = save_in_out, .cost = zsi_reduce_cost};

zs_tensor *zs_max(zs_tensor *a, int naxes, const int *axes, bool keepdim)
{
    int64_t mask = a ? zsi_axes_bits("max", a->ndim, naxes, axes) : -1;
    zsi_attrs at = {.i = {mask, keepdim}};
    return mask < 0 ? NULL : zsi_run(&zsi_def_max, 1, &a, &at);
}

/* gx in the plan's layout [kept..., reduced...] (or a's own layout when
 * the reduced axes are one block), then viewed back in a's dim order. */
static zs_status max_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin)
{
    zs_tensor *x = n->saved[0], *y = n->saved[1];
    int64_t mask = n->p.i[4];
    int nd = x->ndim, naxes = 0, first = -1, last = -1;
    for (int d = 0; d < nd; d++)
        if (mask >> d & 1) {
            naxes++;
            first = first < 0 ? d : first;
            last = d;
        }
    zsi_reduce_plan p;
    if (zsi_reduce_plan_make(x, mask, &p) != ZS_OK)
        return ZS_ERR_NOMEM;
    bool block = naxes == 0 || last - first + 1 == naxes;
    int inv[ZS_MAX_DIMS], k = 0; /* gx dim inv[d] is x's dim d */
    int64_t pshape[ZS_MAX_DIMS];
    for (int pass = block ? 1 : 0; pass < 2; pass++)
        for (int d = 0; d < nd; d++)
            if (block || (int)(mask >> d & 1) == pass) {
                inv[d] = k;
                pshape[k++] = x->shape[d];
            }
    zs_tensor *gc = zs_contiguous(g);
    zs_tensor *gx = gc ? zsi_new_tensor(x->dtype, nd, pshape) : NULL;
    if (gx)
        zsk_reduce_max_backward(x->dtype, zs_data(p.x), zs_data(y),
                                zs_data(gc), p.O, p.R, p.K, zs_data(gx));
    zs_release(p.x);
    zs_release(gc);
    gin[0] = block || !gx ? zs_retain(gx) : zs_permute(gx, inv);
    zs_release(gx);
    return gin[0] ? ZS_OK : ZS_ERR_NOMEM;
}

/* ---- argmax ------------------------------------------------------------ */

/* i[0] = dim, i[1] = keepdim; a 0-d input (torch: the only element is at
 * index 0) accepts dim 0 or -1. */
static zs_status infer_argmax(zsi_call *c)
{
    const zs_tensor *a = c->in[0];
    int dim = (int)c->a->i[0];
    if (zsi_check_float_dtype("argmax", a) != ZS_OK)
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
        if (i != d || c->a->i[1])
            c->shape[c->ndim++] = i == d ? 1 : a->shape[i];
    return check_nonempty(c, (int64_t)1 << d);
}

static zs_status cpu_argmax(const zsi_call *c, zs_tensor *out)
{
    zs_tensor *a = c->in[0];
    if (a->ndim == 0) {
        *(int64_t *)zs_data(out) = 0;
        return ZS_OK;
    }
    int d = (int)c->a->i[0] < 0 ? (int)c->a->i[0] + a->ndim : (int)c->a->i[0];
    zsi_reduce_plan p;
    if (zsi_reduce_plan_make(a, (int64_t)1 << d, &p) != ZS_OK)
        return ZS_ERR_NOMEM;
    zsk_reduce_max(a->dtype, zs_data(p.x), p.O, p.R, p.K, NULL, zs_data(out));
    zs_release(p.x);
    return ZS_OK;
}

zsi_opdef zsi_def_argmax = {
    .op = {.name = "argmax"}, .arity = 1,
    .cls = ZSI_REDUCTION, .flops = 1, .infer = infer_argmax,
    .kernel = {[ZS_CPU] = {[ZS_F32] = cpu_argmax, [ZS_F64] = cpu_argmax}},
    .cost = zsi_reduce_cost};

zs_tensor *zs_argmax(zs_tensor *a, int dim, bool keepdim)
{
    zsi_attrs at = {.i = {dim, keepdim}};
    zs_no_grad_push(); /* not differentiable: no node */
    zs_tensor *out = zsi_run(&zsi_def_argmax, 1, &a, &at);
    zs_no_grad_pop();
    return out;
}

/* ---- var --------------------------------------------------------------- */

static zs_status infer_var(zsi_call *c)
{
    if (zsi_infer_reduce(c) != ZS_OK)
        return ZS_ERR_ARG;
    if (c->a->i[2] < 0)
        return zs_set_error("var: correction %d, expected >= 0",
                            (int)c->a->i[2]);
    return ZS_OK;
}

/* aux[0]: the mean in the keepdim shape, when a node is recorded. */
static zs_status cpu_var(const zsi_call *c, zs_tensor *out)
{
    zs_tensor *a = c->in[0];
    zsi_reduce_plan p;
    if (zsi_reduce_plan_make(a, c->a->i[0], &p) != ZS_OK)
        return ZS_ERR_NOMEM;
    zs_tensor *mean = NULL;
    if (zsi_call_records(c)) {
        zsi_tracking_pause();
        mean = c->aux[0] = zsi_new_tensor_on(c->device, a->dtype, a->ndim,
                                             p.keep_shape);
        zsi_tracking_resume();
    }
    if (mean || !zsi_call_records(c))
        zsk_reduce_var(a->dtype, zs_data(p.x), p.O, p.R, p.K, c->a->i[2],
                       zs_data(out), mean ? zs_data(mean) : NULL);
    zs_release(p.x);
    return mean || !zsi_call_records(c) ? ZS_OK : ZS_ERR_NOMEM;
}

static void save_var(zsi_ctx *n, const zsi_call *c, zs_tensor *out)
{
    zsi_save(n, 0, c->in[0]);
    zsi_save(n, 1, c->aux[0]);
}

zsi_opdef zsi_def_var = {
    .op = {.name = "var", .backward = var_bw}, .arity = 1,
    .cls = ZSI_REDUCTION, .flops = 3, .infer = infer_var,
    .kernel = {[ZS_CPU] = {[ZS_F32] = cpu_var, [ZS_F64] = cpu_var}},
    .save = save_var, .cost = zsi_reduce_cost};

zs_tensor *zs_var(zs_tensor *a, int naxes, const int *axes, int correction,
                  bool keepdim)
{
    int64_t mask = a ? zsi_axes_bits("var", a->ndim, naxes, axes) : -1;
    zsi_attrs at = {.i = {mask, keepdim, correction}};
    return mask < 0 ? NULL : zsi_run(&zsi_def_var, 1, &a, &at);
}

static zs_status var_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin)
{
    zs_tensor *x = n->saved[0], *mean = n->saved[1];
    int64_t keep[ZS_MAX_DIMS];
    double div = (double)zsi_reduce_keep(x->ndim, x->shape, n->p.i[4], keep) -
                 (double)n->p.i[6];
    zs_tensor *d = zs_sub(x, mean);
    zs_tensor *gk = zs_reshape(g, x->ndim, keep);
    zs_tensor *t = d && gk ? zs_mul(d, gk) : NULL;
    gin[0] = t ? zs_mul_scalar(t, 2.0 / (div > 0 ? div : 0)) : NULL;
    zs_release(d);
    zs_release(gk);
    zs_release(t);
    return gin[0] ? ZS_OK : ZS_ERR_NOMEM;
}
