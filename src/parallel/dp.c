/*
 * dp.c - gradient buckets all-reduced during backward (contract in
 * zs/dp.h): a user of the bucket engine (buckets.c), which cuts the flat
 * gradient into buckets, follows the grad-ready events and hands buckets
 * over in index order; here each becomes a non-blocking all-reduce of its
 * view of the flat gradient, and every event advances those in flight.
 * Only leaves whose .grad views the flat buffer count, so a foreign leaf
 * reached by the same backward is ignored.
 */
#include <stdlib.h>
#include <string.h>

#include "parallel/internal.h"
#include "zs/dp.h"
#include "zs/ops.h"

struct zs_dp {
    zs_comm *c;
    zs_dp_config cfg;
    zs_tensor *flat;     /* borrowed */
    zsi_buckets *e;
    zs_tensor **view;    /* per bucket: narrow(flat_grad, lo, len) */
    zs_request **req;    /* per bucket: in flight, NULL otherwise */
    zs_status st;        /* first failure seen by the hook */
    char err[384];
    bool armed;          /* between begin and finish, with the hook */
    double t_first;      /* first start this step (0: none yet) */
    zs_dp_stats stats;
};

static void fail(zs_dp *dp, zs_status st)
{
    if (dp->st == ZS_OK) {
        dp->st = st;
        snprintf(dp->err, sizeof dp->err, "%s", zs_last_error());
    }
}

/* The engine's `ready`: bucket k's gradients are final, start its
 * average over the ranks. */
static void start_bucket(void *ctx, int k)
{
    zs_dp *dp = ctx;
    if (dp->t_first == 0)
        dp->t_first = zsi_now();
    if (dp->armed) /* not yet in zs_dp_finish */
        dp->stats.started_in_backward++;
    zs_alloc_tag_push("dp all-reduce");
    dp->req[k] = zs_comm_iallreduce(dp->c, dp->view[k], true, dp->cfg.algo);
    zs_alloc_tag_pop();
    if (!dp->req[k])
        fail(dp, ZS_ERR_STATE);
}

/* After each grad-ready event: advance the all-reduces in flight. */
static void advance(void *ctx)
{
    zs_dp *dp = ctx;
    if (dp->e->next > 0 && zs_comm_progress(dp->c) != ZS_OK)
        fail(dp, ZS_ERR_STATE);
}

zs_dp *zs_dp_new(zs_comm *c, const zs_dp_config *cfg, int n,
                 zs_tensor *const *params, zs_tensor *flat_grad)
{
    if (!c || !cfg || n < 0 || (n > 0 && !params) || !flat_grad) {
        zs_set_error("data parallel: missing communicator, config or buffers");
        return NULL;
    }
    if (flat_grad->dtype != ZS_F32 || flat_grad->ndim != 1 ||
        !zs_is_contiguous(flat_grad)) {
        zs_set_error("data parallel: the flat gradient must be a contiguous "
                     "1-D f32 tensor");
        return NULL;
    }
    zs_dp *dp = calloc(1, sizeof *dp);
    if (!dp) {
        zs_set_error_code(ZS_ERR_NOMEM, "data parallel: out of memory");
        return NULL;
    }
    dp->c = c;
    dp->cfg = *cfg;
    dp->flat = flat_grad;
    static const zsi_bucket_ops ops = {start_bucket, advance};
    dp->e = zsi_buckets_new("data parallel", n, params, flat_grad, true,
                            cfg->bucket_bytes / 4, NULL, &ops, dp);
    zs_status st = dp->e ? ZS_OK : ZS_ERR_STATE;
    if (st == ZS_OK) {
        dp->view = calloc((size_t)dp->e->nb, sizeof *dp->view);
        dp->req = calloc((size_t)dp->e->nb, sizeof *dp->req);
        if (!dp->view || !dp->req)
            st = zs_set_error_code(ZS_ERR_NOMEM, "data parallel: out of memory");
    }
    zsi_tracking_pause(); /* the views belong to dp, not to a scope */
    for (int k = 0; st == ZS_OK && k < dp->e->nb; k++)
        if (!(dp->view[k] = zs_narrow(flat_grad, 0, dp->e->b[k].lo, dp->e->b[k].len)))
            st = ZS_ERR_NOMEM;
    zsi_tracking_resume();
    if (st != ZS_OK) {
        zs_dp_free(dp);
        return NULL;
    }
    dp->stats.buckets = dp->e->nb;
    return dp;
}

void zs_dp_free(zs_dp *dp)
{
    if (!dp)
        return;
    for (int k = 0; dp->e && k < dp->e->nb; k++) {
        if (dp->req && dp->req[k])
            zs_request_wait(dp->req[k]);
        if (dp->view)
            zs_release(dp->view[k]);
    }
    zsi_buckets_free(dp->e); /* removes its hook if armed */
    free(dp->view);
    free(dp->req);
    free(dp);
}

zs_status zs_dp_begin(zs_dp *dp)
{
    if (!dp)
        return ZS_ERR_ARG;
    if (dp->armed)
        return zs_set_error_code(ZS_ERR_STATE, "data parallel: begin called twice "
                                 "without finish");
    dp->st = ZS_OK;
    dp->t_first = 0;
    dp->stats.started_in_backward = 0;
    /* the hook only when buckets overlap backward and there are others */
    bool listen = dp->cfg.bucket_bytes > 0 && zs_comm_size(dp->c) > 1;
    zs_status st = zsi_buckets_begin(dp->e, listen);
    if (st != ZS_OK)
        return st;
    dp->armed = listen;
    return ZS_OK;
}

zs_status zs_dp_finish(zs_dp *dp)
{
    if (!dp)
        return ZS_ERR_ARG;
    double t0 = zsi_now();
    dp->armed = false;
    /* one rank: nothing to average */
    zsi_buckets_finish(dp->e, zs_comm_size(dp->c) > 1);
    for (int k = 0; k < dp->e->nb; k++) {
        if (!dp->req[k])
            continue;
        zs_status st = zs_request_wait(dp->req[k]);
        dp->req[k] = NULL;
        if (st != ZS_OK)
            fail(dp, st);
    }
    double t1 = zsi_now();
    dp->stats.finish_s = t1 - t0;
    dp->stats.comm_s = dp->t_first > 0 ? t1 - dp->t_first : 0;
    if (dp->st != ZS_OK)
        return zs_set_error_code(dp->st, "%s", dp->err);
    return ZS_OK;
}

void zs_dp_get_stats(const zs_dp *dp, zs_dp_stats *s)
{
    if (dp && s)
        *s = dp->stats;
}
