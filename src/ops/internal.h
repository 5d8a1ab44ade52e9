/*
 * ops/internal.h - helpers shared by the operator files.
 */
#ifndef ZS_OPS_INTERNAL_H
#define ZS_OPS_INTERNAL_H

#include "core/internal.h"
#include "kernels/cpu/kernels.h"
#include "ops/op.h"
#include "zs/ops.h"

/* Fails (message names op) unless t is f32 or f64 on the CPU. */
zs_status zsi_check_float(const char *op, const zs_tensor *t);
/* Fails unless a and b share a float dtype. */
zs_status zsi_check_pair(const char *op, const zs_tensor *a,
                         const zs_tensor *b);
/* For descriptors (any device; the driver finds the kernel): fail unless
 * t is f32 or f64, and unless a and b are and share their dtype (the
 * messages of zsi_check_float and zsi_check_pair). */
zs_status zsi_check_f32f64(const char *op, const zs_tensor *t);
zs_status zsi_check_f32f64_pair(const char *op, const zs_tensor *a,
                                const zs_tensor *b);
/* For descriptors (any device; the driver finds the kernel): fails unless
 * a and b share a float dtype. */
zs_status zsi_check_same_float(const char *op, const zs_tensor *a,
                               const zs_tensor *b);
/* Fails unless t is an i32 or i64 tensor. */
zs_status zsi_check_index(const char *op, const zs_tensor *t);
/* numpy broadcasting of a and b's shapes into (ndim, shape). */
zs_status zsi_broadcast_shape(const char *op, const zs_tensor *a,
                              const zs_tensor *b, int *ndim, int64_t *shape);

/* Parses an axes list (NULL/0 = all) into a mask; -1 + message on a bad or
 * repeated axis. */
int zsi_axes_mask(const char *op, int ndim, int naxes, const int *axes,
                  bool *mask);

/* A reduction over `axes` seen as a contiguous [O, R, K] array: x is a new
 * reference to a contiguous tensor (the input itself, or a permuted copy
 * when the reduced axes are not one block), O = product of kept dims before
 * the block, R = reduced size, K = kept size after. out_shape receives the
 * result shape (with keepdim) and out_ndim its rank. */
typedef struct zsi_reduce_plan {
    zs_tensor *x;
    int64_t O, R, K;
    int out_ndim;
    int64_t out_shape[ZS_MAX_DIMS];
    int64_t keep_shape[ZS_MAX_DIMS]; /* shape with reduced dims = 1 */
} zsi_reduce_plan;
zs_status zsi_reduce_plan_make(const char *op, zs_tensor *a, int naxes,
                               const int *axes, bool keepdim,
                               zsi_reduce_plan *p);

/* Bytes of t's elements (for cost models). */
static inline double zsi_bytes(const zs_tensor *t)
{
    return (double)zs_nbytes(t);
}

#endif
