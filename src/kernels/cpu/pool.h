/*
 * kernels/cpu/pool.h - 2-D max and average pooling (NCHW) on raw pointers.
 *
 * x [N, C, H, W] with any element strides xs (N, C, H, W); y, gy, gx and
 * idx are contiguous. Windows start at oh*sh - ph; padded positions never
 * win a max (they count as -inf) and count towards an average only with
 * count_include_pad. Every window must hold at least one real element
 * (padding <= kernel/2, checked by the operator). Multithreaded over the
 * N*C planes; dt is ZS_F32 or ZS_F64.
 */
#ifndef ZS_KERNELS_CPU_POOL_H
#define ZS_KERNELS_CPU_POOL_H

#include <stdbool.h>
#include <stdint.h>

#include "zs/core.h"

typedef struct zsk_pool2d_shape {
    int64_t N, C, H, W, OH, OW;
    int64_t kh, kw, sh, sw, ph, pw;
} zsk_pool2d_shape;

/* y = max over each window; idx (NULL: not wanted) receives the flat index
 * ih*W + iw of the maximum within its plane (the first one on ties; a NaN
 * wins). */
void zsk_max_pool2d(zs_dtype dt, const zsk_pool2d_shape *s, const void *x,
                    const int64_t *xs, void *y, int64_t *idx);
/* gx = 0, then gx[plane][idx] += gy for every output element. */
void zsk_max_pool2d_backward(zs_dtype dt, const zsk_pool2d_shape *s,
                             const void *gy, const int64_t *idx, void *gx);

/* y = sum over each window / count (kh*kw with count_include_pad, else the
 * number of real elements in the window). */
void zsk_avg_pool2d(zs_dtype dt, const zsk_pool2d_shape *s, const void *x,
                    const int64_t *xs, bool count_include_pad, void *y);
/* gx = 0, then each window's real elements receive gy / count. */
void zsk_avg_pool2d_backward(zs_dtype dt, const zsk_pool2d_shape *s,
                             const void *gy, bool count_include_pad, void *gx);

#endif
