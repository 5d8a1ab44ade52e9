/*
 * kernels/cpu/iter.h - strided n-d iteration shared by elementwise kernels.
 *
 * An iteration covers an output shape with up to ZSK_MAX_OPS operands, each
 * with its own element strides (0 for broadcast dims). zsk_iter_init merges
 * adjacent dims that are contiguous in every operand, so a fully contiguous
 * case becomes one long row. Kernels then walk flat element ranges split
 * into row segments, which parallelises well even when there is one row.
 */
#ifndef ZS_KERNELS_CPU_ITER_H
#define ZS_KERNELS_CPU_ITER_H

#include <stdint.h>

#include "zs/core.h"

#define ZSK_MAX_OPS 4

typedef struct zsk_iter {
    int ndim; /* >= 1 */
    int nops;
    int64_t shape[ZS_MAX_DIMS];
    int64_t strides[ZSK_MAX_OPS][ZS_MAX_DIMS];
    int64_t numel;
} zsk_iter;

/* strides[k] may be NULL for a contiguous operand of `shape`. */
void zsk_iter_init(zsk_iter *it, int ndim, const int64_t *shape, int nops,
                   const int64_t *const *strides);

/* Calls seg(ctx, offs, len) for the row segments covering flat output
 * elements [begin, end): offs[k] is operand k's element offset of the
 * segment start; along the segment operand k advances by
 * it->strides[k][it->ndim - 1]. */
typedef void (*zsk_seg_fn)(void *ctx, const int64_t *offs, int64_t len);
void zsk_iter_range(const zsk_iter *it, int64_t begin, int64_t end,
                    zsk_seg_fn seg, void *ctx);

/* Runs zsk_iter_range over all elements on the thread pool, chunks of at
 * least `grain` elements. */
void zsk_iter_parallel(const zsk_iter *it, int64_t grain, zsk_seg_fn seg,
                       void *ctx);

/* Broadcast strides of a tensor of shape (ndim, shape, strides) seen as
 * shape (ondim, oshape): missing leading dims and size-1 dims get 0. */
void zsk_broadcast_strides(int ndim, const int64_t *shape,
                           const int64_t *strides, int ondim,
                           const int64_t *oshape, int64_t *out);

#endif
