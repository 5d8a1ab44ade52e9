/*
 * softmax.c - zs_softmax and zs_log_softmax along any dim (kernels in
 * kernels/cpu/softmax.c).
 *
 * The input is made contiguous and seen as [O, R, K] with R the softmax
 * dim, so one fused kernel serves every dim without a transpose. Both
 * save their output y (slot 0) and run a fused backward kernel:
 *   softmax:     gx = y * (g - sum_dim(g * y))
 *   log_softmax: gx = g - exp(y) * sum_dim(g)
 * The backward is not itself differentiable (no double backward); it is
 * counted in the profiler as "softmax_backward" / "log_softmax_backward".
 * p.i[0..2] = O, R, K.
 *
 * Cost model: input read once, output written once; about 5 FLOPs per
 * element forward (max, subtract, exp, sum, scale) and 4 backward.
 */
#include "kernels/cpu/softmax.h"
#include "ops/internal.h"

static zs_status softmax_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin);

static zsi_op OP_SOFTMAX = {.name = "softmax", .backward = softmax_bw};
static zsi_op OP_LOG_SOFTMAX = {.name = "log_softmax", .backward = softmax_bw};
static zsi_op OP_SOFTMAX_BW = {.name = "softmax_backward"};
static zsi_op OP_LOG_SOFTMAX_BW = {.name = "log_softmax_backward"};

/* [O, R, K] of a's shape around dim d (a 0-d tensor is one element). */
static void split_dims(const zs_tensor *a, int d, int64_t *O, int64_t *R,
                       int64_t *K)
{
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

static zs_tensor *softmax_like(zsi_op *op, zs_tensor *a, int dim, bool lg)
{
    if (!a)
        return NULL;
    double t0 = zsi_op_begin(op);
    if (zsi_check_float(op->name, a) != ZS_OK)
        return NULL;
    int d = zsi_norm_dim(op->name, dim, a->ndim > 0 ? a->ndim : 1);
    if (d < 0)
        return NULL;
    int64_t O, R, K;
    split_dims(a, d, &O, &R, &K);
    zsi_tracking_pause();
    zs_no_grad_push();
    zs_tensor *xc = zs_contiguous(a);
    zs_no_grad_pop();
    zsi_tracking_resume();
    zs_tensor *out = xc ? zsi_new_tensor(a->dtype, a->ndim, a->shape) : NULL;
    if (out)
        zsk_softmax(a->dtype, zs_data(xc), O, R, K, lg, zs_data(out));
    zs_release(xc);
    zsi_ctx *n;
    if (!out || zsi_record(op, out, 1, &a, &n) != ZS_OK) {
        zs_release(out);
        return NULL;
    }
    if (n) {
        zsi_save(n, 0, out);
        n->p.i[0] = O;
        n->p.i[1] = R;
        n->p.i[2] = K;
    }
    zsi_op_end(op, t0, 5.0 * (double)zs_numel(a), zsi_bytes(a), zsi_bytes(out));
    return out;
}

zs_tensor *zs_softmax(zs_tensor *a, int dim)
{
    return softmax_like(&OP_SOFTMAX, a, dim, false);
}

zs_tensor *zs_log_softmax(zs_tensor *a, int dim)
{
    return softmax_like(&OP_LOG_SOFTMAX, a, dim, true);
}

static zs_status softmax_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin)
{
    bool lg = n->op == &OP_LOG_SOFTMAX;
    zsi_op *bop = lg ? &OP_LOG_SOFTMAX_BW : &OP_SOFTMAX_BW;
    double t0 = zsi_op_begin(bop);
    zs_tensor *y = n->saved[0];
    zs_tensor *gc = zs_contiguous(g);
    gin[0] = gc ? zsi_new_tensor(y->dtype, y->ndim, y->shape) : NULL;
    if (gin[0])
        zsk_softmax_backward(y->dtype, zs_data(y), zs_data(gc), n->p.i[0],
                             n->p.i[1], n->p.i[2], lg, zs_data(gin[0]));
    zs_release(gc);
    if (!gin[0])
        return ZS_ERR_NOMEM;
    zsi_op_end(bop, t0, 4.0 * (double)zs_numel(y),
               zsi_bytes(y) + zsi_bytes(g), zsi_bytes(y));
    return ZS_OK;
}
