/*
 * onebit_adam.c - the frozen stage of 1-bit Adam (ZS_ONEBIT_ADAM in
 * zs/optim.h): v no longer moves, the momentum is updated from this rank's
 * own gradient, averaged over the ranks by the reduce function (the
 * compressed all-reduce of zs/onebit.h, wired by the trainer), and the
 * parameters move by the averaged momentum over the frozen denominator.
 * The warm-up stage is AdamW itself (optim.c runs zs_adam_update_).
 *
 * Written with the in-place and elementwise operators, so the step runs on
 * whatever device holds the parameters; five passes over the buffers
 * instead of Adam's one fused pass (the denominator is computed once, at
 * the freeze).
 */
#include <math.h>

#include "core/internal.h"
#include "optim/internal.h"
#include "zs/ops.h"

/* sqrt(v / (1 - b2^T)) + eps as a new tensor on v's device. */
static zs_tensor *frozen_denominator(const zs_optim_config *c, int64_t freeze_step,
                                     const zs_tensor *v)
{
    double bc2 = sqrt(1 - pow(c->beta2, (double)freeze_step));
    zs_tensor *r = zs_sqrt((zs_tensor *)v), *d = NULL;
    if (r && zs_scale_(r, 1 / bc2) == ZS_OK)
        d = zs_add_scalar(r, c->eps);
    zs_release(r);
    return d;
}

zs_status zsi_onebit_adam_step(const zs_optim_config *c, int64_t freeze_step,
                               int64_t step, double lr,
                               double grad_scale, int i, zs_tensor *p, const zs_tensor *g,
                               zs_tensor *m, const zs_tensor *v, zs_tensor **denom,
                               zs_optim_reduce_fn reduce, void *ctx)
{
    if (step <= freeze_step)
        return zs_set_error("onebit_adam: step %lld is not past freeze_step %lld",
                            (long long)step, (long long)freeze_step);
    zsi_tracking_pause(); /* state and temporaries outlive / bypass scopes */
    zs_status st = ZS_OK;
    if (!*denom && !(*denom = frozen_denominator(c, freeze_step, v)))
        st = ZS_ERR_STATE;
    /* m = b1 m + (1 - b1) g' */
    if (st == ZS_OK)
        st = zs_scale_(m, c->beta1);
    if (st == ZS_OK)
        st = zs_axpy_(m, (1 - c->beta1) * grad_scale, g);
    if (st == ZS_OK && reduce)
        st = reduce(ctx, i, m);
    /* p = p (1 - lr wd) - lr / (1 - b1^t) * m / denom */
    if (st == ZS_OK && c->weight_decay > 0)
        st = zs_scale_(p, 1 - lr * c->weight_decay);
    zs_tensor *u = st == ZS_OK ? zs_div(m, *denom) : NULL;
    if (st == ZS_OK && !u)
        st = ZS_ERR_STATE;
    if (st == ZS_OK)
        st = zs_axpy_(p, -lr / (1 - pow(c->beta1, (double)step)), u);
    zs_release(u);
    zsi_tracking_resume();
    return st;
}
