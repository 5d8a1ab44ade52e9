/*
 * gradcheck.c - compares backward with central differences in float64.
 *
 * L(x) = sum(fn(x) * r) for a fixed random r (seed 1234), so every output
 * element contributes with a different weight. For each input element:
 * numeric = (L(x + eps) - L(x - eps)) / (2 eps), evaluated with grad mode
 * off; analytic = the .grad left by zs_backward(L).
 */
#include <math.h>

#include "core/internal.h"
#include "zs/autograd.h"
#include "zs/ops.h"

static double weighted_sum(zs_tensor *y, zs_tensor *r)
{
    double s = 0;
    int64_t n = zs_numel(y);
    for (int64_t i = 0; i < n; i++)
        s += zs_get(y, i) * zs_get(r, i);
    return s;
}

static zs_status eval(zs_grad_fn fn, void *ctx, zs_tensor **in, zs_tensor *r,
                      double *out)
{
    zs_tensor *y = fn(ctx, in);
    if (!y)
        return ZS_ERR_ARG;
    *out = weighted_sum(y, r);
    zs_release(y);
    return ZS_OK;
}

zs_status zs_gradcheck(zs_grad_fn fn, void *ctx, int n, zs_tensor **inputs,
                       double eps, double atol, double rtol,
                       zs_gradcheck_result *res)
{
    *res = (zs_gradcheck_result){0, 0, -1, -1, true};
    for (int i = 0; i < n; i++) {
        if (inputs[i]->dtype != ZS_F64 && inputs[i]->requires_grad)
            return zs_set_error("gradcheck: input %d is %s, expected f64", i,
                                zs_dtype_name(inputs[i]->dtype));
        zs_zero_grad(inputs[i], true);
    }
    zsi_tracking_pause();
    zs_status st = ZS_OK;
    zs_tensor *y = fn(ctx, inputs), *r = NULL, *L = NULL, *ry = NULL;
    if (!y) {
        st = ZS_ERR_ARG;
        goto done;
    }
    r = zs_uniform(ZS_F64, y->ndim, y->shape, -1, 1, 1234);
    ry = r ? zs_mul(y, r) : NULL;
    L = ry ? zs_sum(ry, 0, NULL, false) : NULL;
    if (!L || (st = zs_backward(L, NULL, false)) != ZS_OK) {
        st = st ? st : ZS_ERR_NOMEM;
        goto done;
    }
    zs_no_grad_push();
    for (int i = 0; i < n && st == ZS_OK; i++) {
        zs_tensor *x = inputs[i];
        if (!x->requires_grad)
            continue;
        int64_t m = zs_numel(x);
        for (int64_t j = 0; j < m; j++) {
            /* x may be a view: address element j through its strides */
            int64_t off = x->offset, rem = j;
            for (int d = x->ndim - 1; d >= 0; d--) {
                off += (rem % x->shape[d]) * x->strides[d];
                rem /= x->shape[d];
            }
            double *p = (double *)x->storage->data + off;
            double x0 = *p, lp, lm;
            *p = x0 + eps;
            st = eval(fn, ctx, inputs, r, &lp);
            *p = x0 - eps;
            if (st == ZS_OK)
                st = eval(fn, ctx, inputs, r, &lm);
            *p = x0;
            if (st != ZS_OK)
                break;
            double num = (lp - lm) / (2 * eps);
            double ana = x->grad ? zs_get(x->grad, j) : 0.0;
            double err = fabs(ana - num);
            double rel = err / fmax(fabs(num), 1.0);
            if (err > res->max_abs_err)
                res->max_abs_err = err;
            if (rel > res->max_rel_err) {
                res->max_rel_err = rel;
                res->worst_input = i;
                res->worst_index = j;
            }
            if (!(err <= atol + rtol * fabs(num)))
                res->ok = false;
        }
    }
    zs_no_grad_pop();
done:
    zs_release(L);
    zs_release(ry);
    zs_release(r);
    zs_release(y);
    zsi_tracking_resume();
    return st;
}
