/*
 * zs/zero.h - ZeRO stages 1, 2 and 3 for data parallelism: every rank
 * keeps only its 1/N share of the optimizer state (stage 1), of the
 * gradients (stage 2) and of the parameters (stage 3).
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
 *
 * Stage 3 is stage 2 whose buckets are the caller's units (a transformer
 * block's parameters) and whose parameters are kept only in this rank's
 * chunks between uses: zs_zero_fetch(unit) all-gathers a unit just before
 * the model reads it (forward, and again before its backward), and the
 * unit is dropped after its forward (zs_zero_drop) and as soon as its
 * gradients are reduce-scattered; parameters in no unit (group -1: tied
 * embeddings, final norm) are gathered from zs_zero_begin to
 * zs_zero_finish. So a rank holds its 1/N of the weights plus the kept
 * parameters and the unit in use. Dropping hands the pages back to the
 * kernel; the flat buffer keeps its addresses, so parameter views stay
 * valid. Fetches are collective: every rank must fetch the same units in
 * the same order (the model's hooks do). Step:
 *     for each micro-batch: zs_zero_begin; forward (fetch/drop per unit);
 *         backward (fetch per unit); zs_zero_finish
 *     zs_zero_clip_grad_norm; optimizer step; zs_zero_zero_grad
 * and, to read the whole model (validation, checkpoints),
 * zs_zero_gather ... zs_zero_release. The model's side (which parameters
 * make a unit, the hooks that fetch them) is the caller's: for a GPT,
 * zs_zero_new3_module (zs/train.h) does both from the module tree.
 */
#ifndef ZS_ZERO_H
#define ZS_ZERO_H

#include "dist.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct zs_zero zs_zero;

typedef struct zs_zero_memory {
    int64_t params;      /* bytes of the parameters kept between uses: all
                          * (stages 1, 2), this rank's chunks (stage 3) */
    int64_t grad_shard;  /* bytes of this rank's gradient shard (stage 1:
                          * the whole gradient buffer) */
    int64_t grad_peak;   /* most final gradient bytes waiting for their
                          * bucket at once (counted when they become
                          * final), plus the staging buffers; last step */
    int64_t buckets;
    int64_t params_peak; /* stage 3: most parameter bytes held at once
                          * (chunks + gathered units) in steps, i.e. not
                          * counting zs_zero_gather; stages 1, 2: params */
} zs_zero_memory;

/* stage 1 or 2. params: the n parameters, views of flat_params
 * (contiguous 1-D f32); all borrowed, outliving z. Stage 2 releases their
 * .grad; stage 1 needs flat_grads (their .grad views it), stage 2 ignores
 * it. Chunks follow the buckets of bucket_bytes in both stages. */
zs_zero *zs_zero_new(zs_comm *c, int stage, int64_t bucket_bytes, int n,
                     zs_tensor *const *params, zs_tensor *flat_params,
                     zs_tensor *flat_grads);
/* Stage 3. group[i] (copied): parameter i's unit, >= 0, a contiguous run
 * of the flat buffer; -1 for parameters kept gathered through a step.
 * Buckets are the units. The parameters must hold the same values on
 * every rank (as zs_zero_new); all stay gathered until the first
 * zs_zero_release or zs_zero_finish. */
zs_zero *zs_zero_new3(zs_comm *c, int n, zs_tensor *const *params,
                      zs_tensor *flat_params, const int *group);
/* fn(ctx) is called first thing by zs_zero_free (whoever made z fetch and
 * drop its units from a model's hooks removes them there). */
void zs_zero_on_free(zs_zero *z, void (*fn)(void *ctx), void *ctx);
void zs_zero_free(zs_zero *z);
/* Stage 3: gathers unit `group` (collective; no-op when gathered). */
zs_status zs_zero_fetch(zs_zero *z, int group);
/* Stage 3: drops unit `group`'s foreign parameters (local; not while
 * pinned by zs_zero_gather). */
zs_status zs_zero_drop(zs_zero *z, int group);
/* Stage 3: ends a zs_zero_gather: every unit dropped. No-op otherwise. */
void zs_zero_release(zs_zero *z);
/* This rank's parameter chunks (borrowed array of *n views, some may be
 * absent when a bucket is smaller than the rank count). */
zs_tensor **zs_zero_shards(zs_zero *z, int *n);
/* Around each backward (stage 2; no-ops for stage 1). */
zs_status zs_zero_begin(zs_zero *z);
zs_status zs_zero_finish(zs_zero *z);
/* The global L2 norm of the gradient, changing nothing: stage 1 over the
 * full averaged gradient (local, every rank holds it), stages 2 and 3 over
 * all ranks' shards (collective: one all-reduce of a number). NaN on a
 * communication failure. For a caller that folds the clipping scale into
 * its optimizer update. */
double zs_zero_grad_norm(zs_zero *z);
/* zs_zero_grad_norm, and when above max_norm (> 0) the gradients are
 * scaled by max_norm / (norm + 1e-6), like zs_clip_grad_norm. Returns the
 * norm (NaN on a communication failure). */
double zs_zero_clip_grad_norm(zs_zero *z, double max_norm);
/* All-gathers the updated chunks into every rank's full parameters (stage
 * 3: and keeps them gathered until zs_zero_release). */
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
