/*
 * softmax.c - zs_softmax and zs_log_softmax along any dim, as descriptors
 * (class ZSI_OTHER; kernels in kernels/cpu/softmax.c). Attributes:
 * softmax_attrs, the dim (any sign).
 *
 * The input is made contiguous and seen as [O, R, K] with R the softmax
 * dim, so one fused kernel serves every dim without a transpose. Both
 * save their output y (slot 0) and run a fused backward kernel:
 *   softmax:     gx = y * (g - sum_dim(g * y))
 *   log_softmax: gx = g - exp(y) * sum_dim(g)
 * The backward rule runs the descriptor "softmax_backward" or
 * "log_softmax_backward" (inputs y, g; the forward's attributes), so it
 * runs wherever y lives; it is not itself differentiable (no double
 * backward).
 *
 * Cost model: input read once, output written once; about 5 FLOPs per
 * element forward (max, subtract, exp, sum, scale) and 4 backward.
 */
#include <string.h>

#include "kernels/cpu/softmax.h"
#include "ops/internal.h"

static zs_status softmax_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin);

/* The attributes of softmax, log_softmax and their backward descriptors. */
typedef struct softmax_attrs {
    int64_t dim;
} softmax_attrs;
ZSI_ATTRS(softmax_attrs);

/* [O, R, K] of a's shape around dim (a 0-d tensor is one element); dim
 * already checked. */
static void split_dims(const zs_tensor *a, int dim, int64_t *O, int64_t *R,
                       int64_t *K)
{
    int d = dim < 0 ? dim + (a->ndim > 0 ? a->ndim : 1) : dim;
    *O = *R = *K = 1;
    for (int i = 0; i < a->ndim; i++) {
        if (i < d)
            *O *= a->shape[i];
        else if (i == d)
            *R = a->shape[i];
        else
            *K *= a->shape[i];
    }
}

/* f32, f64, bf16 or f16, dim in range; the output is like the input
 * (bf16/f16: computed in f32, rounded once, as torch's CPU softmax) */
static zs_status infer_softmax(zsi_call *c)
{
    const zs_tensor *a = c->in[0];
    const softmax_attrs *at = c->attrs;
    const char *op = c->def->op.name;
    if (zsi_check_float16_dtype(op, a) != ZS_OK ||
        zsi_norm_dim(op, (int)at->dim, a->ndim > 0 ? a->ndim : 1) < 0)
        return ZS_ERR_ARG;
    zsi_out_like(c, a);
    return ZS_OK;
}

static zs_status cpu_softmax(const zsi_call *c, zs_tensor *out)
{
    zs_tensor *a = c->in[0];
    const softmax_attrs *at = c->attrs;
    int64_t O, R, K;
    split_dims(a, (int)at->dim, &O, &R, &K);
    zs_tensor *xc = zsi_contig_host(a);
    if (!xc)
        return ZS_ERR_NOMEM;
    zs_status st = zsk_softmax(a->dtype, zs_data(xc), O, R, K,
                               c->def == &zsi_def_log_softmax, zs_data(out));
    zs_release(xc);
    return st;
}

static void save_softmax(zsi_ctx *n, const zsi_call *c, zs_tensor *out)
{
    zsi_save(n, 0, out);
}

/* ---- backward descriptors ---------------------------------------------- */

/* Inputs y (the forward's output) and g, one float dtype and shape; the
 * result gx is like y. */
static zs_status infer_softmax_backward(zsi_call *c)
{
    const zs_tensor *y = c->in[0], *g = c->in[1];
    if (infer_softmax(c) != ZS_OK ||
        zsi_check_pair_float16(c->def->op.name, y, g) != ZS_OK)
        return ZS_ERR_ARG;
    if (!zs_same_shape(y, g)) {
        char sy[96], sg[96];
        return zs_set_error("%s: g %s does not match y %s, expected equal "
                            "shapes", c->def->op.name,
                            zs_shape_str(g, sg, sizeof sg),
                            zs_shape_str(y, sy, sizeof sy));
    }
    return ZS_OK;
}

static zs_status cpu_softmax_backward(const zsi_call *c, zs_tensor *out)
{
    zs_tensor *y = c->in[0];
    const softmax_attrs *at = c->attrs;
    int64_t O, R, K;
    split_dims(y, (int)at->dim, &O, &R, &K);
    zs_tensor *yc = zsi_contig_host(y), *gc = yc ? zsi_contig_host(c->in[1]) : NULL;
    zs_status st = ZS_ERR_NOMEM;
    if (gc)
        st = zsk_softmax_backward(y->dtype, zs_data(yc), zs_data(gc), O, R, K,
                                  c->def == &zsi_def_log_softmax_backward,
                                  zs_data(out));
    zs_release(yc);
    zs_release(gc);
    return st;
}

/* 4 FLOPs per element; y and g read, gx written */
static zsi_cost softmax_backward_cost(const zsi_call *c, const zs_tensor *out)
{
    return (zsi_cost){4.0 * (double)zs_numel(out),
                      zsi_bytes(c->in[0]) + zsi_bytes(c->in[1]), zsi_bytes(out)};
}

zsi_opdef zsi_def_softmax_backward = {
    .op = {.name = "softmax_backward"}, .arity = 2, .cls = ZSI_OTHER,
    .infer = infer_softmax_backward,
    .kernel = {[ZS_CPU] = {[ZS_F32] = cpu_softmax_backward,
                           [ZS_F64] = cpu_softmax_backward,
                           [ZS_BF16] = cpu_softmax_backward,
                           [ZS_F16] = cpu_softmax_backward}},
    .cost = softmax_backward_cost, .attr_size = sizeof(softmax_attrs)};
zsi_opdef zsi_def_log_softmax_backward = {
    .op = {.name = "log_softmax_backward"}, .arity = 2, .cls = ZSI_OTHER,
    .infer = infer_softmax_backward,
    .kernel = {[ZS_CPU] = {[ZS_F32] = cpu_softmax_backward,
                           [ZS_F64] = cpu_softmax_backward,
                           [ZS_BF16] = cpu_softmax_backward,
                           [ZS_F16] = cpu_softmax_backward}},
    .cost = softmax_backward_cost, .attr_size = sizeof(softmax_attrs)};

/* ---- forward descriptors ----------------------------------------------- */

/* default cost: 5 FLOPs per element, input read, output written */
zsi_opdef zsi_def_softmax = {
    .op = {.name = "softmax", .backward = softmax_bw}, .arity = 1,
    .cls = ZSI_OTHER, .flops = 5, .infer = infer_softmax,
    .kernel = {[ZS_CPU] = {[ZS_F32] = cpu_softmax, [ZS_F64] = cpu_softmax,
                           [ZS_BF16] = cpu_softmax, [ZS_F16] = cpu_softmax}},
    .save = save_softmax, .attr_size = sizeof(softmax_attrs),
    .bw_ops = (zsi_opdef *const[]){&zsi_def_softmax_backward, NULL}};
zsi_opdef zsi_def_log_softmax = {
    .op = {.name = "log_softmax", .backward = softmax_bw}, .arity = 1,
    .cls = ZSI_OTHER, .flops = 5, .infer = infer_softmax,
    .kernel = {[ZS_CPU] = {[ZS_F32] = cpu_softmax, [ZS_F64] = cpu_softmax,
                           [ZS_BF16] = cpu_softmax, [ZS_F16] = cpu_softmax}},
    .save = save_softmax, .attr_size = sizeof(softmax_attrs),
    .bw_ops = (zsi_opdef *const[]){&zsi_def_log_softmax_backward, NULL}};

zs_tensor *zs_softmax(zs_tensor *a, int dim)
{
    softmax_attrs at = {.dim = dim};
    return zsi_run(&zsi_def_softmax, 1, &a, &at);
}

zs_tensor *zs_log_softmax(zs_tensor *a, int dim)
{
    softmax_attrs at = {.dim = dim};
    return zsi_run(&zsi_def_log_softmax, 1, &a, &at);
}

/* gx from the saved y by the backward descriptor of n's operator. */
static zs_status softmax_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin)
{
    zsi_opdef *def = n->op == &zsi_def_log_softmax.op
                         ? &zsi_def_log_softmax_backward
                         : &zsi_def_softmax_backward;
    gin[0] = zsi_run(def, 2, (zs_tensor *[]){n->saved[0], g},
                     zsi_node_attrs(n));
    return gin[0] ? ZS_OK : ZS_ERR_NOMEM;
}
