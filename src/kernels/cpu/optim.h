/*
 * kernels/cpu/optim.h - optimizer and gradient-clipping kernels on flat
 * f32 buffers: the Adam/AdamW update, the sum of squares and the scaling
 * pass of clip_grad_norm. All are memory-bound; bench/gpt --profile shows
 * their time per step.
 */
#ifndef ZS_KERNELS_CPU_OPTIM_H
#define ZS_KERNELS_CPU_OPTIM_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>

/* The scalars of one Adam step, computed in double and rounded once by
 * the caller (src/ops/optim_update.c says why). */
typedef struct zsk_adam_args {
    float b2, one_m_b1, one_m_b2, eps, wd, decay, step_size, bc2_sqrt;
    float gscale;   /* each g[i] is multiplied by it as it is read (clipping
                     * fused into the update; 1: none, exact) */
    bool decoupled; /* AdamW: decay p; Adam: add wd p to g */
} zsk_adam_args;

/* Elements [0, n) of p, m, v updated from gscale * g with PyTorch's
 * single-tensor formula (m.lerp_(g, 1 - b1); v.mul_(b2).addcmul_(g, g, 1 - b2);
 * p.addcdiv_(m, sqrt(v) / bc2_sqrt + eps, -step_size)). One thread; the
 * caller splits the range. */
void zsk_adam_f32(const zsk_adam_args *a, float *p, float *m, float *v,
                  const float *g, int64_t n);
/* sum x[i]^2 in double, over the pool (the partial sums per thread are
 * added in a fixed order, so the result does not depend on timing). */
double zsk_sumsq_f32(const float *x, int64_t n);
/* x[i] *= s over the pool. */
void zsk_scale_f32(float *x, int64_t n, float s);

/* The factor torch.nn.utils.clip_grad_norm_ applies for a norm, as
 * zs_clip_coef (zs/optim.h) defines it: max_norm / (norm + 1e-6) when
 * norm > max_norm > 0, else 1 (also for a NaN or Inf norm). The one
 * formula for the eager clip (optim.c) and the clip_coef operator. */
static inline double zsk_clip_coef(double norm, double max_norm)
{
    if (!isfinite(norm) || max_norm <= 0 || norm <= max_norm)
        return 1.0;
    return max_norm / (norm + 1e-6);
}

/* The scalars of one SGD step (src/ops/optim_update.c). */
typedef struct zsk_sgd_args {
    float lr, wd, mu, gscale; /* gscale as in zsk_adam_args */
    bool nesterov, first;     /* first: the momentum buffer starts as g */
} zsk_sgd_args;

/* Elements [0, n) of p (and of the momentum buffer b, NULL without
 * momentum) updated from gscale * g with PyTorch's SGD. One thread. */
void zsk_sgd_f32(const zsk_sgd_args *a, float *p, float *b, const float *g,
                 int64_t n);

#endif
