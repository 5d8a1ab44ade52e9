/*
 * kernels/cpu/softmax.h - softmax, log-softmax and cross entropy on raw
 * pointers.
 *
 * bf16 / f16 (x, y, g, gx of that dtype): each task widens its rows or
 * strip into f32 scratch, runs the f32 code and rounds its result once;
 * these fail only when that scratch cannot be allocated (ZS_ERR_NOMEM,
 * message set). f32 and f64 return ZS_OK.
 *
 * Softmax kernels see a contiguous [O, R, K] array and normalise over R
 * (K == 1 is the last-dim case: contiguous rows). Cross entropy works on
 * contiguous logits [N, C]. dt is ZS_F32 or ZS_F64 and every float array
 * has that dtype unless typed double. Multithreaded over rows (or
 * (o, k-strip) pairs when K > 1). Numerically stable: the row maximum is
 * subtracted before exponentiating.
 */
#ifndef ZS_KERNELS_CPU_SOFTMAX_H
#define ZS_KERNELS_CPU_SOFTMAX_H

#include <stdbool.h>
#include <stdint.h>

#include "zs/core.h"

/* y = softmax(x) over R, or log_softmax(x) when log. y may not alias x. */
zs_status zsk_softmax(zs_dtype dt, const void *x, int64_t O, int64_t R,
                      int64_t K, bool log, void *y);

/* From the forward output y and the output gradient g ([O, R, K]):
 * softmax: gx = y * (g - sum_r g * y); log_softmax: gx = g - exp(y) *
 * sum_r g. */
zs_status zsk_softmax_backward(zs_dtype dt, const void *y, const void *g,
                               int64_t O, int64_t R, int64_t K, bool log,
                               void *gx);

/* Class targets: i64 when t64, else i32; [N]. Rows whose target equals
 * ignore are skipped; every other target must lie in [0, C) (the caller
 * checks). */
typedef struct zsk_targets {
    const void *t;
    bool t64;
    int64_t ignore;
} zsk_targets;

/* Per row i of x [N, C]: lse[i] = log sum_j exp(x[i, j]) and
 * loss[i] = lse[i] - x[i, t_i] (0 for ignored rows). C >= 1. */
zs_status zsk_cross_entropy(zs_dtype dt, const void *x, const zsk_targets *tg,
                            int64_t N, int64_t C, double *lse, double *loss);

/* gx[i, j] = scale * (exp(x[i, j] - lse[i]) - [j == t_i]); ignored rows
 * get 0; a target outside [0, C) that is not ignore has no [j == t_i]
 * term (a class shard's rows whose target another shard holds). */
zs_status zsk_cross_entropy_backward(zs_dtype dt, const void *x,
                                     const zsk_targets *tg, int64_t N,
                                     int64_t C, const double *lse,
                                     double scale, void *gx);

#endif
