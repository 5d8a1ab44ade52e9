/*
 * onebit.c - the trainer's side of 1-bit Adam (ZS_ONEBIT_ADAM, zs/optim.h):
 * the compressed momentum all-reduce (zs/onebit.h) handed to the optimizer
 * as its reduce function, the switch from the gradient all-reduce to it at
 * the freeze, and the bytes each step sends.
 *
 * Before the freeze a step is a data-parallel AdamW step (the buckets'
 * all-reduce, then the update). From the optimizer's freeze_step on, the
 * buckets stay idle: each rank's update reads its own accumulated
 * gradient, and the optimizer averages the momentum through
 * zs_onebit_allreduce over the trainer's communicator. The parameters stay
 * equal on every rank because every rank decodes the same server packets
 * (the replica check at validation confirms it). The compressed
 * all-reduce runs inside the optimizer step, so the profile counts its
 * time in update_s, not comm_s.
 */
#include "train/internal.h"

zs_status zsi_train_onebit_check(const zs_trainer_config *c)
{
    if (c->optim.kind != ZS_ONEBIT_ADAM)
        return ZS_OK;
    if (c->zero > 0 || c->sync != ZS_SYNC_ALLREDUCE)
        return zs_set_error("trainer: 1-bit Adam works with all-reduce data "
                            "parallelism only, without ZeRO (stage %d) or a parameter "
                            "server (it averages the momentum of whole replicas)",
                            c->zero);
    if (c->freeze_step < 1)
        return zs_set_error("trainer: 1-bit Adam with freeze_step %lld, expected >= 1 "
                            "(the AdamW steps that set the variance it then keeps)",
                            (long long)c->freeze_step);
    if (c->onebit_block < 0 || c->onebit_block % 8 != 0)
        return zs_set_error("trainer: onebit_block %lld, expected a multiple of 8 "
                            "(0: the default)", (long long)c->onebit_block);
    return ZS_OK;
}

static zs_status reduce_momentum(void *ctx, int i, zs_tensor *m)
{
    (void)i; /* one flat parameter */
    return zs_onebit_allreduce(ctx, m);
}

zs_status zsi_train_onebit_setup(zs_trainer *t)
{
    const zs_trainer_config *c = &t->c;
    if (c->optim.kind != ZS_ONEBIT_ADAM || t->size < 2)
        return ZS_OK;
    int64_t n = zs_numel(t->fp);
    if (!(t->ob = zs_onebit_new(t->comm, n, c->onebit_block)))
        return ZS_ERR_STATE;
    zs_optim_set_momentum_reduce(t->o, reduce_momentum, t->ob);
    if (c->log && t->rank == 0) {
        int64_t adam = zs_onebit_ring_bytes(n, 4, t->size, 0);
        int64_t one = zs_onebit_bytes(n, c->onebit_block, t->size, 0);
        fprintf(c->log, "1-bit Adam over %d ranks: AdamW with the gradient all-reduce "
                "for %lld steps (%.3f MiB sent per step by rank 0), then v frozen and "
                "the momentum compressed to signs and a scale per %lld elements "
                "(%.3f MiB per step, %.1fx fewer)\n", t->size,
                (long long)c->freeze_step, (double)adam / 1048576,
                (long long)(c->onebit_block ? c->onebit_block : ZS_ONEBIT_BLOCK),
                (double)one / 1048576, (double)adam / (double)one);
    }
    return ZS_OK;
}

bool zsi_train_grads_local(const zs_trainer *t) { return zs_optim_grads_local(t->o); }

int64_t zsi_train_step_bytes(const zs_trainer *t, bool local)
{
    if (local && t->ob) {
        zs_onebit_stats s;
        zs_onebit_get_stats(t->ob, &s);
        return s.last_bytes_sent;
    }
    return t->dp ? zs_onebit_ring_bytes(zs_numel(t->fg), 4, t->size, t->rank) : 0;
}
