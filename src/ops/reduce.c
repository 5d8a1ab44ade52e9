/*
 * reduce.c - sum and mean over any set of axes, with keepdim, and the
 * [O, R, K] reduction plan shared by the other reductions.
 *
 * Backward: the gradient is reshaped to the keepdim shape and expanded back
 * to the input shape (a stride-0 view, no copy); mean also scales by 1/R.
 */
#include <string.h>

#include "ops/internal.h"

static zs_status sum_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin);

static zsi_op OP_SUM = {.name = "sum", .backward = sum_bw};
static zsi_op OP_MEAN = {.name = "mean", .backward = sum_bw};

zs_status zsi_reduce_plan_make(const char *op, zs_tensor *a, int naxes,
                               const int *axes, bool keepdim,
                               zsi_reduce_plan *p)
{
    bool mask[ZS_MAX_DIMS];
    memset(p, 0, sizeof *p);
    if (zsi_axes_mask(op, a->ndim, naxes, axes, mask) < 0)
        return ZS_ERR_ARG;
    int first = -1, last = -1;
    p->out_ndim = 0;
    for (int d = 0; d < a->ndim; d++) {
        p->keep_shape[d] = mask[d] ? 1 : a->shape[d];
        if (mask[d]) {
            if (first < 0)
                first = d;
            last = d;
        }
        if (!mask[d] || keepdim)
            p->out_shape[p->out_ndim++] = p->keep_shape[d];
    }
    bool block = true;
    for (int d = first; first >= 0 && d <= last; d++)
        block = block && mask[d];
    if (first < 0) { /* 0-d input, or nothing to reduce */
        p->O = zs_numel(a);
        p->R = 1;
        p->K = 1;
        p->x = zs_contiguous(a);
        return p->x ? ZS_OK : ZS_ERR_NOMEM;
    }
    if (block) {
        p->O = p->R = p->K = 1;
        for (int d = 0; d < a->ndim; d++) {
            if (d < first)
                p->O *= a->shape[d];
            else if (d <= last)
                p->R *= a->shape[d];
            else
                p->K *= a->shape[d];
        }
        p->x = zs_contiguous(a);
        return p->x ? ZS_OK : ZS_ERR_NOMEM;
    }
    /* Kept dims first, reduced dims last, then copy. */
    int perm[ZS_MAX_DIMS], k = 0;
    p->O = p->R = p->K = 1;
    for (int d = 0; d < a->ndim; d++)
        if (!mask[d]) {
            perm[k++] = d;
            p->O *= a->shape[d];
        }
    for (int d = 0; d < a->ndim; d++)
        if (mask[d]) {
            perm[k++] = d;
            p->R *= a->shape[d];
        }
    zs_tensor *t = zs_permute(a, perm);
    p->x = t ? zs_contiguous(t) : NULL;
    zs_release(t);
    return p->x ? ZS_OK : ZS_ERR_NOMEM;
}

static zs_tensor *sum_like(zsi_op *op, zs_tensor *a, int naxes,
                           const int *axes, bool keepdim, bool mean)
{
    if (!a)
        return NULL;
    double t0 = zsi_op_begin(op);
    if (zsi_check_float(op->name, a) != ZS_OK)
        return NULL;
    zsi_reduce_plan p;
    zsi_tracking_pause();
    zs_no_grad_push();
    zs_status st = zsi_reduce_plan_make(op->name, a, naxes, axes, keepdim, &p);
    zs_no_grad_pop();
    zsi_tracking_resume();
    if (st != ZS_OK)
        return NULL;
    zs_tensor *out = zsi_new_tensor(a->dtype, p.out_ndim, p.out_shape);
    if (!out) {
        zs_release(p.x);
        return NULL;
    }
    zsk_reduce_sum(a->dtype, zs_data(p.x), p.O, p.R, p.K, zs_data(out));
    if (mean && p.R > 0) {
        zsk_iter it;
        zsk_iter_init(&it, out->ndim, out->shape, 2, (const int64_t *[]){NULL, NULL});
        zsk_binary_scalar(out->dtype, ZSK_MUL, &it, zs_data(out), zs_data(out),
                          1.0 / (double)p.R);
    } else if (mean) {
        zs_fill_(out, 0.0 / 0.0);
    }
    zs_release(p.x);
    zsi_ctx *n;
    if (zsi_record(op, out, 1, &a, &n) != ZS_OK) {
        zs_release(out);
        return NULL;
    }
    if (n) {
        n->p.f[0] = mean ? 1.0 / (double)p.R : 1.0;
        for (int d = 0; d < a->ndim; d++)
            n->p.i[1 + d] = p.keep_shape[d];
    }
    zsi_op_end(op, t0, (double)zs_numel(a), zsi_bytes(a), zsi_bytes(out));
    return out;
}

zs_tensor *zs_sum(zs_tensor *a, int naxes, const int *axes, bool keepdim)
{
    return sum_like(&OP_SUM, a, naxes, axes, keepdim, false);
}

zs_tensor *zs_mean(zs_tensor *a, int naxes, const int *axes, bool keepdim)
{
    return sum_like(&OP_MEAN, a, naxes, axes, keepdim, true);
}

static zs_status sum_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin)
{
    const zsi_meta *m = &n->in_meta[0];
    zs_tensor *gs = n->p.f[0] != 1.0 ? zs_mul_scalar(g, n->p.f[0]) : zs_retain(g);
    zs_tensor *r = gs ? zs_reshape(gs, m->ndim, n->p.i + 1) : NULL;
    gin[0] = r ? zs_expand(r, m->ndim, m->shape) : NULL;
    zs_release(gs);
    zs_release(r);
    return gin[0] ? ZS_OK : ZS_ERR_NOMEM;
}
