/*
 * kernels/cpu/amp.h - the loss scaler's pass (ops/unscale.c): gradients
 * multiplied by the inverse loss scale with the check for Inf/NaN in the
 * same read, as torch._amp_foreach_non_finite_check_and_unscale_.
 */
#ifndef ZS_KERNELS_CPU_AMP_H
#define ZS_KERNELS_CPU_AMP_H

#include <stdbool.h>
#include <stdint.h>

/* x[i] *= inv over [0, n), over the pool; true when some x[i] was Inf or
 * NaN before the multiplication (those elements are multiplied too:
 * their step is skipped anyway). */
bool zsk_unscale_f32(float *x, int64_t n, float inv);
bool zsk_unscale_f64(double *x, int64_t n, double inv);

#endif
