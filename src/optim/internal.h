/*
 * optim/internal.h - what optim.c hands to the update rules kept in files
 * of their own (onebit_adam.c). Not public.
 */
#ifndef ZS_OPTIM_INTERNAL_H
#define ZS_OPTIM_INTERNAL_H

#include "zs/optim.h"

/* One frozen step of 1-bit Adam on parameter i (zs/optim.h states the
 * rule): p, its gradient g, first moment m and frozen second moment v,
 * all contiguous f32 of p's numel on one device. *denom caches
 * sqrt(v / (1 - b2^freeze_step)) + eps (made here when NULL; the caller
 * owns and releases it). reduce (may be NULL) averages m. step: the
 * 1-based count of this update (> freeze_step). */
zs_status zsi_onebit_adam_step(const zs_optim_config *c, int64_t freeze_step,
                               int64_t step, double lr,
                               double grad_scale, int i, zs_tensor *p, const zs_tensor *g,
                               zs_tensor *m, const zs_tensor *v, zs_tensor **denom,
                               zs_optim_reduce_fn reduce, void *ctx);

#endif
