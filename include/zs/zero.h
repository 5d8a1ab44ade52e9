/*
 * zs/zero.h - ZeRO stages 1 and 2 for data parallelism: every rank keeps
 * the full parameters but only its 1/N share of the optimizer state
 * (stage 1) and of the gradients (stage 2).
 *
 * Stage 1 keeps the full gradient buffer, averaged over the ranks by
 * zs/dp.h as in plain data parallelism; each rank's optimizer updates only
 * its chunks, and zs_zero_gather shares them. Stage 2 works as follows.
 * The parameters live in one flat f32 buffer (zs_module_flatten); their
 * .grad must be NULL (zs_zero_new releases them): the autograd engine
 * then allocates a parameter's gradient when backward reaches it, and the
 * grad-ready hook (zs/autograd.h) hands it over as soon as it is final.
 * Parameters are grouped, from the end of the buffer backwards, into
 * buckets of about bucket_bytes; a bucket whose gradients are all final is
 * packed into a staging buffer, the gradients are freed, and a
 * reduce-scatter leaves chunk r (the r-th 1/N of the bucket) of the
 * average over ranks in rank r's shard gradient. So a rank never holds
 * more than its shard plus the gradients of the buckets still filling
 * (plus one staging bucket): the ZeRO-2 memory of 4/N bytes of gradient
 * per parameter instead of 4.
 *
 * The optimizer runs on zs_zero_shards: views of this rank's chunks of
 * the parameters whose .grad are views of the shard gradient; after its
 * step zs_zero_gather all-gathers the updated chunks, bucket by bucket,
 * into every rank's full parameters.
 *
 * Step (accumulation reduces every micro-batch into the shard):
 *     for each micro-batch: zs_zero_begin; backward; zs_zero_finish
 *     zs_zero_clip_grad_norm; optimizer step; zs_zero_gather;
 *     zs_zero_zero_grad
 * Buckets are reduced in index order on every rank (the collectives'
 * rule); the reductions are blocking calls made from the hook.
 */
#ifndef ZS_ZERO_H
#define ZS_ZERO_H

#include "dist.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct zs_zero zs_zero;

typedef struct zs_zero_memory {
    int64_t params;      /* bytes of the full parameters */
    int64_t grad_shard;  /* bytes of this rank's gradient shard (stage 1:
                          * the whole gradient buffer) */
    int64_t grad_peak;   /* most final gradient bytes waiting for their
                          * bucket at once (counted when they become
                          * final), plus the staging buffers; last step */
    int64_t buckets;
} zs_zero_memory;

/* stage 1 or 2. params: the n parameters, views of flat_params
 * (contiguous 1-D f32); all borrowed, outliving z. Stage 2 releases their
 * .grad; stage 1 needs flat_grads (their .grad views it), stage 2 ignores
 * it. Chunks follow the buckets of bucket_bytes in both stages. */
zs_zero *zs_zero_new(zs_comm *c, int stage, int64_t bucket_bytes, int n,
                     zs_tensor *const *params, zs_tensor *flat_params,
                     zs_tensor *flat_grads);
void zs_zero_free(zs_zero *z);
/* This rank's parameter chunks (borrowed array of *n views, some may be
 * absent when a bucket is smaller than the rank count). */
zs_tensor **zs_zero_shards(zs_zero *z, int *n);
/* Around each backward (stage 2; no-ops for stage 1). */
zs_status zs_zero_begin(zs_zero *z);
zs_status zs_zero_finish(zs_zero *z);
/* Global gradient norm (stage 2: over all ranks' shards); when above
 * max_norm (> 0) the gradients are scaled by max_norm / (norm + 1e-6),
 * like zs_clip_grad_norm. Returns the norm (NaN on a communication
 * failure). */
double zs_zero_clip_grad_norm(zs_zero *z, double max_norm);
/* All-gathers the updated chunks into every rank's full parameters. */
zs_status zs_zero_gather(zs_zero *z);
void zs_zero_zero_grad(zs_zero *z);
/* Optimizer state for checkpoints, one kind at a time (e.g. AdamW's first
 * moments): chunks[i] is the state of shard i (zs_zero_shards order).
 * gather: collective; full (shaped like the flat parameters) receives the
 * whole state on the ranks passing it (NULL elsewhere). scatter: local;
 * each rank copies its chunks out of a full state it loaded. */
zs_status zs_zero_gather_state(zs_zero *z, zs_tensor *const *chunks, zs_tensor *full);
zs_status zs_zero_scatter_state(zs_zero *z, const zs_tensor *full,
                                zs_tensor *const *chunks);
void zs_zero_get_memory(const zs_zero *z, zs_zero_memory *m);

#ifdef __cplusplus
}
#endif
#endif
