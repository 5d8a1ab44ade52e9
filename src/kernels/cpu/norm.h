/*
 * kernels/cpu/norm.h - layer and batch normalisation on raw pointers.
 *
 * Layer norm works on a contiguous x [R, C] (rows normalised over C); batch
 * norm on a contiguous x [N, C, S] (channel c normalised over N and S).
 * dt is ZS_F32 or ZS_F64; every array except the double statistics has
 * that dtype. Multithreaded over rows (layer norm) or channels (batch
 * norm); see norm.c for how the weight gradients stay race-free.
 */
#ifndef ZS_KERNELS_CPU_NORM_H
#define ZS_KERNELS_CPU_NORM_H

#include <stdint.h>

#include "zs/core.h"

/* y[r] = (x[r] - mean[r]) * rstd[r] * w + b, with mean[r] and
 * rstd[r] = 1/sqrt(var[r] + eps) (biased var) written for backward
 * (dtype dt, [R]) unless mean is NULL (then rstd is not written either).
 * w and b ([C]) may be NULL (1 and 0). */
void zsk_layer_norm(zs_dtype dt, const void *x, const void *w, const void *b,
                    int64_t R, int64_t C, double eps, void *y, void *mean,
                    void *rstd);

/* From gy [R, C] and the forward's x, w (NULL = 1), mean, rstd:
 * gx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)) with
 * dxhat = gy * w, xhat = (x - mean) * rstd; gw = sum_r gy * xhat and
 * gb = sum_r gy. Any of gx, gw, gb may be NULL (not wanted). The row sums
 * for gw and gb are accumulated in per-part buffers (one part per pool
 * thread) and added in part order. Fails only when scratch memory cannot
 * be allocated (message set). */
zs_status zsk_layer_norm_backward(zs_dtype dt, const void *x, const void *w,
                                  const void *mean, const void *rstd,
                                  const void *gy, int64_t R, int64_t C,
                                  void *gx, void *gw, void *gb);

/* Layer norm of a bf16 / f16 x (dt; y and gx in dt) with weight and bias
 * (and their gradients gw, gb) of dtype pdt (f32 or dt, the mixed form of
 * torch's CPU layer_norm) and f32 statistics mean, rstd [R]: the f32
 * kernels above on rows widened block by block, each result rounded once.
 * Fail only when scratch memory cannot be allocated (message set). */
zs_status zsk_layer_norm_lp(zs_dtype dt, zs_dtype pdt, const void *x,
                            const void *w, const void *b, int64_t R,
                            int64_t C, double eps, void *y, float *mean,
                            float *rstd);
zs_status zsk_layer_norm_backward_lp(zs_dtype dt, zs_dtype pdt, const void *x,
                                     const void *w, const float *mean,
                                     const float *rstd, const void *gy,
                                     int64_t R, int64_t C, void *gx, void *gw,
                                     void *gb);

/* Per-channel statistics of x [N, C, S]: mean[c] and the biased variance
 * var[c] (two passes, double accumulation). */
void zsk_batch_norm_stats(zs_dtype dt, const void *x, int64_t N, int64_t C,
                          int64_t S, double *mean, double *var);

/* y = x * scale[c] + shift[c] over x [N, C, S]; y may equal x. */
void zsk_channel_affine(zs_dtype dt, const void *x, int64_t N, int64_t C,
                        int64_t S, const double *scale, const double *shift,
                        void *y);

/* Per-channel sums for batch-norm backward: sum_g[c] = sum gy and
 * sum_gxc[c] = sum gy * (x - mean[c]) over N and S. */
void zsk_batch_norm_grad_sums(zs_dtype dt, const void *x, const void *gy,
                              int64_t N, int64_t C, int64_t S,
                              const double *mean, double *sum_g,
                              double *sum_gxc);

/* gx = a[c] * gy + b[c] * x + k[c] over [N, C, S] (the input gradient of
 * batch norm with its coefficients folded per channel). */
void zsk_batch_norm_backward_x(zs_dtype dt, const void *x, const void *gy,
                               int64_t N, int64_t C, int64_t S,
                               const double *a, const double *b,
                               const double *k, void *gx);

#endif
