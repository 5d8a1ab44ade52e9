/*
 * softmax.c - zs_softmax and zs_log_softmax along any dim, as descriptors
 * (class ZSI_OTHER; kernels in kernels/cpu/softmax.c). Attribute: i[0] =
 * dim (node: p.i[4]).
 *
 * The input is made contiguous and seen as [O, R, K] with R the softmax
 * dim, so one fused kernel serves every dim without a transpose. Both
 * save their output y (slot 0) and run a fused backward kernel:
 *   softmax:     gx = y * (g - sum_dim(g * y))
 *   log_softmax: gx = g - exp(y) * sum_dim(g)
 * The backward is not itself differentiable (no double backward); it is
 * counted in the profiler as "softmax_backward" / "log_softmax_backward".
 * p.i[8..10] = O, R, K.
 *
 * Cost model: input read once, output written once; about 5 FLOPs per
 * element forward (max, subtract, exp, sum, scale) and 4 backward.
 */
#include <string.h>

#include "kernels/cpu/softmax.h"
#include "ops/internal.h"

static zs_status softmax_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin);

static zsi_op OP_SOFTMAX_BW = {.name = "softmax_backward"};
static zsi_op OP_LOG_SOFTMAX_BW = {.name = "log_softmax_backward"};

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

/* f32 or f64, dim in range; the output is like the input */
static zs_status infer_softmax(zsi_call *c)
{
    const zs_tensor *a = c->in[0];
    const char *op = c->def->op.name;
    if (zsi_check_float_dtype(op, a) != ZS_OK ||
        zsi_norm_dim(op, (int)c->a->i[0], a->ndim > 0 ? a->ndim : 1) < 0)
        return ZS_ERR_ARG;
    c->dtype = a->dtype;
    c->ndim = a->ndim;
    memcpy(c->shape, a->shape, sizeof c->shape);
    return ZS_OK;
}

static zs_status cpu_softmax(const zsi_call *c, zs_tensor *out)
{
    zs_tensor *a = c->in[0];
    int64_t O, R, K;
    split_dims(a, (int)c->a->i[0], &O, &R, &K);
    zsi_tracking_pause();
    zs_no_grad_push();
    zs_tensor *xc = zs_contiguous(a);
    zs_no_grad_pop();
    zsi_tracking_resume();
    if (!xc)
        return ZS_ERR_NOMEM;
    zsk_softmax(a->dtype, zs_data(xc), O, R, K, c->def == &zsi_def_log_softmax,
                zs_data(out));
    zs_release(xc);
    return ZS_OK;
}

static void save_softmax(zsi_ctx *n, const zsi_call *c, zs_tensor *out)
{
    zsi_save(n, 0, out);
    split_dims(out, (int)c->a->i[0], &n->p.i[8], &n->p.i[9], &n->p.i[10]);
}

/* default cost: 5 FLOPs per element, input read, output written */
zsi_opdef zsi_def_softmax = {
    .op = {.name = "softmax", .backward = softmax_bw}, .arity = 1,
    .cls = ZSI_OTHER, .flops = 5, .infer = infer_softmax,
    .kernel = {[ZS_CPU] = {[ZS_F32] = cpu_softmax, [ZS_F64] = cpu_softmax}},
    .save = save_softmax};
zsi_opdef zsi_def_log_softmax = {
    .op = {.name = "log_softmax", .backward = softmax_bw}, .arity = 1,
    .cls = ZSI_OTHER, .flops = 5, .infer = infer_softmax,
    .kernel = {[ZS_CPU] = {[ZS_F32] = cpu_softmax, [ZS_F64] = cpu_softmax}},
    .save = save_softmax};

zs_tensor *zs_softmax(zs_tensor *a, int dim)
{
    zsi_attrs at = {.i = {dim}};
    return zsi_run(&zsi_def_softmax, 1, &a, &at);
}

zs_tensor *zs_log_softmax(zs_tensor *a, int dim)
{
    zsi_attrs at = {.i = {dim}};
    return zsi_run(&zsi_def_log_softmax, 1, &a, &at);
}

static zs_status softmax_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin)
{
    bool lg = n->op == &zsi_def_log_softmax.op;
    zsi_op *bop = lg ? &OP_LOG_SOFTMAX_BW : &OP_SOFTMAX_BW;
    double t0 = zsi_op_begin(bop);
    zs_tensor *y = n->saved[0];
    zs_tensor *gc = zs_contiguous(g);
    gin[0] = gc ? zsi_new_tensor(y->dtype, y->ndim, y->shape) : NULL;
    if (gin[0])
        zsk_softmax_backward(y->dtype, zs_data(y), zs_data(gc), n->p.i[8],
                             n->p.i[9], n->p.i[10], lg, zs_data(gin[0]));
    zs_release(gc);
    if (!gin[0])
        return ZS_ERR_NOMEM;
    zsi_op_end(bop, t0, 4.0 * (double)zs_numel(y),
               zsi_bytes(y) + zsi_bytes(g), zsi_bytes(y));
    return ZS_OK;
}
