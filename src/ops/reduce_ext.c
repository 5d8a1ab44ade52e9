/*
 * reduce_ext.c - max, argmax and var over any set of axes, on the [O, R, K]
 * plan of reduce.c (kernels in kernels/cpu/reduce_ext.c).
 *
 * max: NaN counts as the maximum. Its gradient is split equally among tied
 * maxima (as torch.amax; a single maximum gets all of it). The backward is
 * a fused kernel (zsk_reduce_max_backward) on the plan's [O, R, K] layout,
 * permuted back to the input's layout when the axes were not one block; it
 * is not itself differentiable. Saved: 0 input, 1 output. p.i[0] holds the
 * mask of reduced axes (bit d = axis d).
 *
 * argmax: index (i64) of the first maximum along one dim; no node.
 *
 * var: fused two-pass kernel in double (mean, then squared deviations),
 * divisor max(0, n - correction). Backward, written with zs_* ops:
 * gx = 2 (x - mean) / (n - correction) * g. Saved: 0 input, 1 the mean in
 * the keepdim shape (from the forward kernel). p.f[0] = 2 / divisor, p.i[1..]
 * the keepdim shape.
 *
 * Cost models: each element read once; max and argmax 1 FLOP per element,
 * var 3.
 */
#include <string.h>

#include "kernels/cpu/reduce_ext.h"
#include "ops/internal.h"

static zs_status max_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin);
static zs_status var_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin);

static zsi_op OP_MAX = {.name = "max", .backward = max_bw};
static zsi_op OP_ARGMAX = {.name = "argmax"};
static zsi_op OP_VAR = {.name = "var", .backward = var_bw};

/* The plan built without autograd or scope tracking (p->x is a new
 * reference owned by the caller). */
static zs_status make_plan(const char *op, zs_tensor *a, int naxes,
                           const int *axes, bool keepdim, zsi_reduce_plan *p)
{
    zsi_tracking_pause();
    zs_no_grad_push();
    zs_status st = zsi_reduce_plan_make(op, a, naxes, axes, keepdim, p);
    zs_no_grad_pop();
    zsi_tracking_resume();
    return st;
}

static zs_status check_nonempty(const char *op, const zs_tensor *a,
                                const zsi_reduce_plan *p)
{
    if (p->R > 0)
        return ZS_OK;
    char s[96];
    return zs_set_error("%s: cannot reduce a tensor of shape %s over a "
                        "zero-size dim, expected at least one element",
                        op, zs_shape_str(a, s, sizeof s));
}

/* ---- max --------------------------------------------------------------- */

zs_tensor *zs_max(zs_tensor *a, int naxes, const int *axes, bool keepdim)
{
    if (!a)
        return NULL;
    double t0 = zsi_op_begin(&OP_MAX);
    bool mask[ZS_MAX_DIMS];
    zsi_reduce_plan p;
    if (zsi_check_float("max", a) != ZS_OK ||
        zsi_axes_mask("max", a->ndim, naxes, axes, mask) < 0 ||
        make_plan("max", a, naxes, axes, keepdim, &p) != ZS_OK)
        return NULL;
    zs_tensor *out = NULL;
    if (check_nonempty("max", a, &p) == ZS_OK)
        out = zsi_new_tensor(a->dtype, p.out_ndim, p.out_shape);
    if (out)
        zsk_reduce_max(a->dtype, zs_data(p.x), p.O, p.R, p.K, zs_data(out),
                       NULL);
    zs_release(p.x);
    zsi_ctx *n;
    if (!out || zsi_record(&OP_MAX, out, 1, &a, &n) != ZS_OK) {
        zs_release(out);
        return NULL;
    }
    if (n) {
        zsi_save(n, 0, a);
        zsi_save(n, 1, out);
        n->p.i[0] = 0;
        for (int d = 0; d < a->ndim; d++)
            n->p.i[0] |= (int64_t)mask[d] << d;
    }
    zsi_op_end(&OP_MAX, t0, (double)zs_numel(a), zsi_bytes(a), zsi_bytes(out));
    return out;
}

/* gx in the plan's layout [kept..., reduced...] (or a's own layout when
 * the reduced axes are one block), then viewed back in a's dim order. */
static zs_status max_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin)
{
    zs_tensor *x = n->saved[0], *y = n->saved[1];
    int nd = x->ndim, axes[ZS_MAX_DIMS] = {0};
    int naxes = 0, first = -1, last = -1;
    for (int d = 0; d < nd; d++)
        if (n->p.i[0] >> d & 1) {
            axes[naxes++] = d;
            first = first < 0 ? d : first;
            last = d;
        }
    zsi_reduce_plan p;
    if (zsi_reduce_plan_make("max", x, naxes, axes, true, &p) != ZS_OK)
        return ZS_ERR_NOMEM;
    bool block = naxes == 0 || last - first + 1 == naxes;
    int inv[ZS_MAX_DIMS], k = 0; /* gx dim inv[d] is x's dim d */
    int64_t pshape[ZS_MAX_DIMS];
    for (int pass = block ? 1 : 0; pass < 2; pass++)
        for (int d = 0; d < nd; d++)
            if (block || (int)(n->p.i[0] >> d & 1) == pass) {
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

zs_tensor *zs_argmax(zs_tensor *a, int dim, bool keepdim)
{
    if (!a)
        return NULL;
    double t0 = zsi_op_begin(&OP_ARGMAX);
    if (zsi_check_float("argmax", a) != ZS_OK)
        return NULL;
    if (a->ndim == 0) { /* torch: the only element is at index 0 */
        if (dim != 0 && dim != -1) {
            zs_set_error("argmax: dim %d out of range for a 0-d tensor", dim);
            return NULL;
        }
        return zs_zeros(ZS_I64, 0, NULL);
    }
    zsi_reduce_plan p;
    if (make_plan("argmax", a, 1, &dim, keepdim, &p) != ZS_OK)
        return NULL;
    zs_tensor *out = NULL;
    if (check_nonempty("argmax", a, &p) == ZS_OK)
        out = zsi_new_tensor(ZS_I64, p.out_ndim, p.out_shape);
    if (out)
        zsk_reduce_max(a->dtype, zs_data(p.x), p.O, p.R, p.K, NULL,
                       zs_data(out));
    zs_release(p.x);
    if (out)
        zsi_op_end(&OP_ARGMAX, t0, (double)zs_numel(a), zsi_bytes(a),
                   zsi_bytes(out));
    return out;
}

/* ---- var --------------------------------------------------------------- */

zs_tensor *zs_var(zs_tensor *a, int naxes, const int *axes, int correction,
                  bool keepdim)
{
    if (!a)
        return NULL;
    double t0 = zsi_op_begin(&OP_VAR);
    if (zsi_check_float("var", a) != ZS_OK)
        return NULL;
    if (correction < 0) {
        zs_set_error("var: correction %d, expected >= 0", correction);
        return NULL;
    }
    zsi_reduce_plan p;
    if (make_plan("var", a, naxes, axes, keepdim, &p) != ZS_OK)
        return NULL;
    zs_tensor *out = zsi_new_tensor(a->dtype, p.out_ndim, p.out_shape);
    zs_tensor *mean = NULL;
    if (out && zsi_grad_needed(a)) {
        zsi_tracking_pause();
        mean = zsi_new_tensor(a->dtype, a->ndim, p.keep_shape);
        zsi_tracking_resume();
    }
    if (out && (mean || !zsi_grad_needed(a)))
        zsk_reduce_var(a->dtype, zs_data(p.x), p.O, p.R, p.K, correction,
                       zs_data(out), mean ? zs_data(mean) : NULL);
    zs_release(p.x);
    zsi_ctx *n = NULL;
    if (!out || (zsi_grad_needed(a) && !mean) ||
        zsi_record(&OP_VAR, out, 1, &a, &n) != ZS_OK) {
        zs_release(out);
        zs_release(mean);
        return NULL;
    }
    if (n) {
        double div = (double)p.R - correction;
        zsi_save(n, 0, a);
        zsi_save(n, 1, mean);
        n->p.f[0] = 2.0 / (div > 0 ? div : 0);
        for (int d = 0; d < a->ndim; d++)
            n->p.i[1 + d] = p.keep_shape[d];
    }
    zs_release(mean);
    zsi_op_end(&OP_VAR, t0, 3.0 * (double)zs_numel(a), zsi_bytes(a),
               zsi_bytes(out));
    return out;
}

static zs_status var_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin)
{
    zs_tensor *x = n->saved[0], *mean = n->saved[1];
    zs_tensor *d = zs_sub(x, mean);
    zs_tensor *gk = zs_reshape(g, x->ndim, n->p.i + 1);
    zs_tensor *t = d && gk ? zs_mul(d, gk) : NULL;
    gin[0] = t ? zs_mul_scalar(t, n->p.f[0]) : NULL;
    zs_release(d);
    zs_release(gk);
    zs_release(t);
    return gin[0] ? ZS_OK : ZS_ERR_NOMEM;
}
