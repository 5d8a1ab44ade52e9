/*
 * zs/linear.h - fused linear layers: y = x w^T + b with a GeLU or a residual
 * add folded into the GEMM, so the output is written once (f32; f64 runs the
 * same math as separate operators, for gradient checks).
 *
 * Shapes: x [..., K] (any number of leading dims, also none), w [N, K] (as
 * torch.nn.Linear stores it), b [N] or NULL -> y [..., N]. Inputs are
 * borrowed and share one float dtype; each function returns a new
 * reference, or NULL with a message naming the operator and the shapes.
 * All are differentiable in every input.
 */
#ifndef ZS_LINEAR_H
#define ZS_LINEAR_H

#include "core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* x w^T + b. */
zs_tensor *zs_linear(zs_tensor *x, zs_tensor *w, zs_tensor *b);
/* gelu_tanh(x w^T + b), gelu_tanh(v) = 0.5 v (1 + tanh(sqrt(2/pi) (v +
 * 0.044715 v^3))). When autograd records, the pre-activation x w^T + b is
 * kept (one extra [..., N] tensor) for the backward pass. */
zs_tensor *zs_linear_gelu(zs_tensor *x, zs_tensor *w, zs_tensor *b);
/* x w^T + b + r, r of the output's shape [..., N]. */
zs_tensor *zs_linear_residual(zs_tensor *x, zs_tensor *w, zs_tensor *b,
                              zs_tensor *r);

#ifdef __cplusplus
}
#endif
#endif
