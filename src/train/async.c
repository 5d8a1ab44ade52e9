/*
 * async.c - the asynchronous and stale-synchronous parameter server of a
 * zs_trainer (zs/ps.h). Rank 0 serves: each worker's gradient is one
 * optimizer update, and (ranks - 1) updates make a step, which is logged,
 * validated and checkpointed as a synchronous step is. A worker computes
 * gradient after gradient on its share of successive global batches until
 * the server says stop.
 */
#include <math.h>

#include "train/internal.h"

/* zs_ps_update_fn of the server. */
static int serve_update(void *ctx, const zs_ps_update *u)
{
    zs_trainer *t = ctx;
    int workers = t->size - 1;
    int64_t step = t->first_step + u->index / workers;
    double gnorm = 0;
    if (zsi_train_update(t, step, &gnorm) != ZS_OK)
        return ZS_ERR_STATE;
    t->loss_sum += u->loss;
    if ((u->index + 1) % workers != 0)
        return 0;
    double now = zsi_train_now(), dt = now - t->t_step;
    t->t_step = now;
    t->prof.steps++;
    int r = zsi_train_after_step(t, step, t->loss_sum / workers, gnorm, dt);
    t->loss_sum = 0;
    if (r < 0)
        return zs_set_error_code(ZS_ERR_STATE, "the server's step %lld failed: %s",
                                 (long long)step, zs_last_error());
    return r == 1 || step + 1 >= t->c.steps ? 1 : 0;
}

static zs_status serve(zs_trainer *t)
{
    t->t_step = zsi_train_now();
    zs_status st = zs_ps_serve(t->ps, serve_update, t);
    if (st != ZS_OK || !t->c.log)
        return st;
    static const char *names[] = {"allreduce", "ps", "async", "ssp"};
    zs_ps_stats s;
    zs_ps_get_stats(t->ps, &s);
    double total = zsi_train_now() - t->t0;
    fprintf(t->c.log, "parameter server (%s, %d workers): %lld updates, staleness "
            "mean %.2f max %lld, largest clock gap %lld, %lld replies held, server "
            "idle %.0f%%\n", names[t->c.sync], t->size - 1, (long long)s.updates,
            s.mean_staleness, (long long)s.max_staleness, (long long)s.max_clock_gap,
            (long long)s.held, total > 0 ? 100 * s.server_idle_s / total : 0.0);
    return ZS_OK;
}

static zs_status work(zs_trainer *t)
{
    for (int64_t i = t->step;; i++) {
        double loss = 0;
        zs_status st = zsi_train_accumulate(t, i, t->rank - 1, t->size - 1, &loss);
        if (st != ZS_OK)
            return zs_set_error_code(st, "rank %d: %s", t->rank, zs_last_error());
        int r = zs_ps_push_pull(t->ps, loss);
        zs_fill_(t->fg, 0.0);
        if (r < 0)
            return zs_set_error_code(ZS_ERR_STATE, "rank %d: %s", t->rank,
                                     zs_last_error());
        if (r == 1)
            return ZS_OK;
    }
}

zs_status zsi_train_run_async(zs_trainer *t)
{
    return t->rank == 0 ? serve(t) : work(t);
}
