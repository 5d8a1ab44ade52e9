/*
 * zs/dp.h - data-parallel gradient averaging with buckets reduced while
 * backward is still running (the all-reduce style of data parallelism).
 *
 * The model's parameters live in one flat f32 buffer and their gradients
 * in another (zs_module_flatten). The gradient buffer is cut, from its end
 * backwards, into buckets of whole parameters of about bucket_bytes each:
 * backward produces gradients roughly from the last layer to the first,
 * so the bucket holding the end of the buffer fills first. When every
 * parameter of a bucket has its final gradient (the autograd engine's
 * grad-ready hook, zs/autograd.h), a non-blocking all-reduce of that
 * bucket starts; the hook also advances the all-reduces in flight, so
 * communication proceeds while the remaining layers are differentiated.
 * Buckets start in a fixed order (their index) on every rank, as the
 * collectives require; a bucket that fills early waits for those before
 * it. zs_dp_finish starts what is left and waits for all.
 *
 * Typical step (accumulating over micro-batches, reduce on the last):
 *     for a in micro-batches:
 *         if (a == last) zs_dp_begin(dp);
 *         zs_backward(loss_a, ...);
 *     zs_dp_finish(dp);            // flat gradient = average over ranks
 *
 * Threads: begin / backward / finish on the thread that initialised MPI.
 */
#ifndef ZS_DP_H
#define ZS_DP_H

#include "dist.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct zs_dp zs_dp;

typedef struct zs_dp_config {
    zs_allreduce_algo algo;
    /* Target bucket size; <= 0: one all-reduce of the whole gradient after
     * backward (no overlap), the reference the bench compares with. */
    int64_t bucket_bytes;
} zs_dp_config;

typedef struct zs_dp_stats {
    int buckets;            /* buckets per step */
    int started_in_backward; /* of those, started before zs_dp_finish (last step) */
    double finish_s;        /* seconds in zs_dp_finish, last step: the
                             * communication backward did not hide */
    double comm_s;          /* seconds from the first bucket's start to the
                             * end of zs_dp_finish, last step */
} zs_dp_stats;

/* params: the n parameters whose .grad are views into flat_grad (a
 * contiguous 1-D f32 tensor; both borrowed, they must outlive dp).
 * Returns NULL and an error for a bad config or foreign parameters. */
zs_dp *zs_dp_new(zs_comm *c, const zs_dp_config *cfg, int n,
                 zs_tensor *const *params, zs_tensor *flat_grad);
void zs_dp_free(zs_dp *dp);
/* Arms the grad-ready hook for the next backward on this thread. */
zs_status zs_dp_begin(zs_dp *dp);
/* Disarms the hook, starts the remaining buckets, waits for all: the flat
 * gradient then holds the average over the ranks. Returns the first
 * failure of any bucket (a timeout names the rank). */
zs_status zs_dp_finish(zs_dp *dp);
void zs_dp_get_stats(const zs_dp *dp, zs_dp_stats *s);

#ifdef __cplusplus
}
#endif
#endif
