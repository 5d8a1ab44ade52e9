/*
 * reduce.c - sum and mean over any set of axes, with keepdim, as
 * descriptors (class ZSI_REDUCTION), and what every reduction shares: the
 * axes given as a mask (bit d = axis d), the shape rule, the [O, R, K]
 * plan and the cost model.
 *
 * Attributes of sum and mean: reduce_attrs, the mask of reduced axes and
 * keepdim (reduce_ext.c's operators have structs of their own and call the
 * shared helpers with their mask). The public functions turn the axes list
 * into the mask (zsi_axes_bits) before zsi_run, so a bad axis is reported
 * first.
 *
 * Backward: the gradient is reshaped to the keepdim shape and expanded back
 * to the input shape (a stride-0 view, no copy); mean also scales by 1/R.
 * Nothing is saved: the shapes come from the node's input record and mask.
 *
 * Cost model: def->flops per input element (sum, mean, max, argmax 1;
 * var 3), the input read once, the output written once.
 */
#include <math.h>
#include <string.h>

#include "kernels/cpu/lowp.h"
#include "ops/internal.h"
#include "ops/attrs.h"

static zs_status sum_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin);

/* ---- shared by the reductions (ops/internal.h) ------------------------- */

int64_t zsi_axes_bits(const char *op, int ndim, int naxes, const int *axes)
{
    if (naxes == 0 || !axes)
        return ((int64_t)1 << ndim) - 1;
    int64_t mask = 0;
    for (int i = 0; i < naxes; i++) {
        int d = zsi_norm_dim(op, axes[i], ndim);
        if (d < 0)
            return -1;
        if (mask >> d & 1) {
            zs_set_error("%s: axis %d repeated", op, axes[i]);
            return -1;
        }
        mask |= (int64_t)1 << d;
    }
    return mask;
}

int64_t zsi_reduce_keep(int ndim, const int64_t *shape, int64_t mask,
                        int64_t *keep)
{
    int64_t R = 1;
    for (int d = 0; d < ndim; d++) {
        bool r = mask >> d & 1;
        keep[d] = r ? 1 : shape[d];
        R *= r ? shape[d] : 1;
    }
    return R;
}

zs_status zsi_infer_reduce(zsi_call *c, int64_t mask, bool keepdim)
{
    const zs_tensor *a = c->in[0];
    if (zsi_check_float16_dtype(c->def->op.name, a) != ZS_OK)
        return ZS_ERR_ARG;
    int64_t keep[ZS_MAX_DIMS];
    zsi_reduce_keep(a->ndim, a->shape, mask, keep);
    c->dtype = a->dtype;
    c->ndim = 0;
    for (int d = 0; d < a->ndim; d++)
        if (!(mask >> d & 1) || keepdim)
            c->shape[c->ndim++] = keep[d];
    return ZS_OK;
}

zsi_cost zsi_reduce_cost(const zsi_call *c, const zs_tensor *out)
{
    const zs_tensor *a = c->in[0];
    return (zsi_cost){c->def->flops * (double)zs_numel(a),
                      (double)zs_nbytes(a), (double)zs_nbytes(out)};
}

zs_status zsi_reduce_plan_make(zs_tensor *a, int64_t mask, zsi_reduce_plan *p)
{
    memset(p, 0, sizeof *p);
    int first = -1, last = -1;
    p->R = zsi_reduce_keep(a->ndim, a->shape, mask, p->keep_shape);
    for (int d = 0; d < a->ndim; d++)
        if (mask >> d & 1) {
            first = first < 0 ? d : first;
            last = d;
        }
    bool block = true;
    for (int d = first; first >= 0 && d <= last; d++)
        block = block && (mask >> d & 1);
    int perm[ZS_MAX_DIMS], k = 0;
    p->O = p->K = 1;
    if (first < 0) { /* 0-d input, or nothing to reduce */
        p->O = zs_numel(a);
    } else if (block) {
        for (int d = 0; d < a->ndim; d++) {
            if (d < first)
                p->O *= a->shape[d];
            else if (d > last)
                p->K *= a->shape[d];
        }
    } else { /* kept dims first, reduced dims last, then copy */
        for (int pass = 0; pass < 2; pass++)
            for (int d = 0; d < a->ndim; d++)
                if ((int)(mask >> d & 1) == pass) {
                    perm[k++] = d;
                    p->O *= pass ? 1 : a->shape[d];
                }
    }
    zsi_tracking_pause();
    zs_no_grad_push();
    zs_tensor *t = k ? zs_permute(a, perm) : zs_retain(a);
    p->x = t ? zs_contiguous(t) : NULL;
    zs_release(t);
    zs_no_grad_pop();
    zsi_tracking_resume();
    return p->x ? ZS_OK : ZS_ERR_NOMEM;
}

/* ---- sum, mean --------------------------------------------------------- */


static zs_status infer_sum(zsi_call *c)
{
    const reduce_attrs *a = c->attrs;
    return zsi_infer_reduce(c, a->mask, a->keepdim);
}

/* bf16 / f16: widened and summed in f32 / double by the kernel, which
 * applies mean's 1/R before the one rounding into the output's dtype. */
static zs_status cpu_sum(const zsi_call *c, zs_tensor *out)
{
    const reduce_attrs *a = c->attrs;
    zsi_reduce_plan p;
    if (zsi_reduce_plan_make(c->in[0], a->mask, &p) != ZS_OK)
        return ZS_ERR_NOMEM;
    bool mean = c->def == &zsi_def_mean;
    if (zsk_is_lowp16(out->dtype)) {
        zsk_reduce_sum_lp(out->dtype, zs_data(p.x), p.O, p.R, p.K,
                          !mean ? 1.0 : p.R ? 1.0 / (double)p.R : NAN,
                          zs_data(out));
    } else {
        zsk_reduce_sum(out->dtype, zs_data(p.x), p.O, p.R, p.K, zs_data(out));
        if (mean && p.R > 0) {
            zsk_iter it;
            zsk_iter_init(&it, out->ndim, out->shape, 2,
                          (const int64_t *[]){NULL, NULL});
            zsk_binary_scalar(out->dtype, ZSK_MUL, &it, zs_data(out),
                              zs_data(out), 1.0 / (double)p.R);
        } else if (mean) {
            zsi_fill_host(out, 0.0 / 0.0);
        }
    }
    zs_release(p.x);
    return ZS_OK;
}

zsi_opdef zsi_def_sum = {
    .op = {.name = "sum", .backward = sum_bw}, .arity = 1,
    .cls = ZSI_REDUCTION, .flops = 1, .infer = infer_sum,
    .kernel = {[ZS_CPU] = {[ZS_F32] = cpu_sum, [ZS_F64] = cpu_sum,
                           [ZS_BF16] = cpu_sum, [ZS_F16] = cpu_sum}},
    .cost = zsi_reduce_cost, .attr_size = sizeof(reduce_attrs),
    .bw_ops = (zsi_opdef *const[]){&zsi_def_view, &zsi_def_expand, NULL}};
zsi_opdef zsi_def_mean = {
    .op = {.name = "mean", .backward = sum_bw}, .arity = 1,
    .cls = ZSI_REDUCTION, .flops = 1, .infer = infer_sum,
    .kernel = {[ZS_CPU] = {[ZS_F32] = cpu_sum, [ZS_F64] = cpu_sum,
                           [ZS_BF16] = cpu_sum, [ZS_F16] = cpu_sum}},
    .cost = zsi_reduce_cost, .attr_size = sizeof(reduce_attrs),
    .bw_ops = (zsi_opdef *const[]){&zsi_def_mul_scalar, &zsi_def_view,
                                   &zsi_def_expand, NULL}};

static zs_tensor *reduce(zsi_opdef *def, zs_tensor *a, int naxes,
                         const int *axes, bool keepdim)
{
    int64_t mask = a ? zsi_axes_bits(def->op.name, a->ndim, naxes, axes) : -1;
    reduce_attrs at = {.mask = mask, .keepdim = keepdim};
    return mask < 0 ? NULL : zsi_run(def, 1, &a, &at);
}

zs_tensor *zs_sum(zs_tensor *a, int naxes, const int *axes, bool keepdim)
{
    return reduce(&zsi_def_sum, a, naxes, axes, keepdim);
}

zs_tensor *zs_mean(zs_tensor *a, int naxes, const int *axes, bool keepdim)
{
    return reduce(&zsi_def_mean, a, naxes, axes, keepdim);
}

static zs_status sum_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin)
{
    const reduce_attrs *a = zsi_node_attrs(n);
    const zsi_meta *m = &n->in_meta[0];
    int64_t keep[ZS_MAX_DIMS];
    int64_t R = zsi_reduce_keep(m->ndim, m->shape, a->mask, keep);
    double scale = n->op == &zsi_def_mean.op ? 1.0 / (double)R : 1.0;
    zs_tensor *gs = scale != 1.0 ? zs_mul_scalar(g, scale) : zs_retain(g);
    zs_tensor *r = gs ? zs_reshape(gs, m->ndim, keep) : NULL;
    gin[0] = r ? zs_expand(r, m->ndim, m->shape) : NULL;
    zs_release(gs);
    zs_release(r);
    return gin[0] ? ZS_OK : ZS_ERR_NOMEM;
}
