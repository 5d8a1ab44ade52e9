/*
 * zs/ps.h - the parameter-server family of data parallelism: rank 0 owns
 * the parameters and the optimizer; the other ranks send gradients and
 * receive parameters. Three synchronisation schemes (shared/DESIGN.md,
 * "Distributed"; Ho et al., "More effective distributed ML via a stale
 * synchronous parallel parameter server", 2013):
 *
 *  ZS_PS_SYNC   every rank (rank 0 too) computes a gradient on its share of
 *               the global batch; the gradients are summed to rank 0,
 *               averaged, applied there once, and the new parameters are
 *               broadcast. Equal to all-reduce data parallelism step by
 *               step (up to the order of the additions), but the optimizer
 *               state lives on rank 0 only.
 *  ZS_PS_ASYNC  rank 0 only serves: each worker (ranks 1..P-1) pushes its
 *               gradient when done and pulls the parameters as they are
 *               then; the server applies every gradient on arrival. No
 *               worker waits for another, gradients may be stale.
 *  ZS_PS_SSP    as ASYNC, with a bound s on the clocks: a worker that has
 *               pushed c gradients gets its reply (and starts computing
 *               gradient c + 1) only when every worker has pushed at least
 *               c - s. s = 0 is lock-step with per-worker updates.
 *
 * Messages (on the communicator's user channel, tags 7001 and 7002): a push
 * is the flat gradient (n floats) followed by the worker's loss; a reply is
 * the flat parameters followed by 1 (go on) or 0 (stop).
 */
#ifndef ZS_PS_H
#define ZS_PS_H

#include "dist.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum zs_ps_mode { ZS_PS_SYNC, ZS_PS_ASYNC, ZS_PS_SSP } zs_ps_mode;

typedef struct zs_ps zs_ps;

/* What the server's update function is given for one gradient, which it
 * finds in the flat gradient buffer. */
typedef struct zs_ps_update {
    int64_t index;     /* updates applied before this one (from 0) */
    int worker;        /* the rank that pushed it; -1 for ZS_PS_SYNC */
    double loss;       /* the loss the worker reported with it */
    int64_t staleness; /* updates applied since the worker read its parameters */
} zs_ps_update;

/* Applies the gradient in the flat gradient buffer to the flat parameters
 * (clipping, optimizer step). Returns 0 to go on, 1 to stop serving after
 * this update, a negative zs_status on failure. Called on rank 0 only. */
typedef int (*zs_ps_update_fn)(void *ctx, const zs_ps_update *u);

typedef struct zs_ps_stats {
    int64_t updates;          /* gradients applied */
    int64_t max_staleness;    /* largest staleness of an applied gradient */
    double mean_staleness;
    int64_t max_clock_gap;    /* largest (clock of a released worker) -
                               * (lowest clock) at a reply */
    int64_t held;             /* replies SSP held back */
    double server_idle_s;     /* seconds the server waited for gradients */
} zs_ps_stats;

/* Collective over c (size >= 2 for ASYNC and SSP: one server and at least
 * one worker). flat_params and flat_grads: contiguous 1-D f32 tensors of
 * equal size, borrowed; the model's parameters are views of the first and
 * its gradients of the second. Rank 0's parameters are broadcast, so every
 * rank starts from them. staleness: SSP's bound s >= 0 (ignored
 * otherwise). Returns a new object to free with zs_ps_free, or NULL and an
 * error (on every rank alike for argument errors). */
zs_ps *zs_ps_new(zs_comm *c, zs_ps_mode mode, int staleness,
                 zs_tensor *flat_params, zs_tensor *flat_grads);
void zs_ps_free(zs_ps *ps);

/* ZS_PS_SYNC, on every rank after backward: gradients averaged on rank 0,
 * fn applied there (u.loss = loss as given by rank 0), parameters
 * broadcast. Returns fn's stop request (0 or 1) on every rank, or a
 * negative status. */
int zs_ps_sync_step(zs_ps *ps, double loss, zs_ps_update_fn fn, void *ctx);

/* ASYNC/SSP, on rank 0: receives gradients in arrival order and calls fn
 * for each until fn asks to stop; then tells every worker to stop (their
 * gradients still in flight are received and dropped) and returns. */
zs_status zs_ps_serve(zs_ps *ps, zs_ps_update_fn fn, void *ctx);

/* ASYNC/SSP, on a worker after backward: pushes the flat gradient and
 * loss, waits for the reply and copies the parameters into the flat
 * buffer. Returns 0 (go on), 1 (the server stopped: parameters not
 * changed) or a negative status. */
int zs_ps_push_pull(zs_ps *ps, double loss);

/* Counters of the server (zeros on workers). */
void zs_ps_get_stats(const zs_ps *ps, zs_ps_stats *s);

#ifdef __cplusplus
}
#endif
#endif
