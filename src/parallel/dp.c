/*
 * dp.c - gradient buckets all-reduced during backward (contract in
 * zs/dp.h).
 *
 * Bucket k covers flat gradient elements [lo, hi) made of whole
 * parameters; bucket 0 ends at the buffer's end. pending[k] counts its
 * parameters whose gradient is not final yet in this backward; the hook
 * finds a leaf's bucket from the offset of its gradient view into the
 * flat buffer. Only leaves whose .grad views the flat buffer count, so a
 * foreign leaf reached by the same backward is ignored.
 */
#include <stdlib.h>
#include <string.h>

#include "parallel/internal.h"
#include "zs/autograd.h"
#include "zs/dp.h"
#include "zs/ops.h"

typedef struct bucket {
    int64_t lo, hi;      /* flat element range */
    int nparams, pending;
    zs_tensor *view;     /* narrow(flat_grad, lo, hi - lo) */
    zs_request *req;     /* in flight, NULL otherwise */
    bool started;
} bucket;

struct zs_dp {
    zs_comm *c;
    zs_dp_config cfg;
    zs_tensor *flat;     /* borrowed */
    bucket *b;
    int64_t *lo;         /* bucket starts, descending (buckets.c) */
    int nb, next;        /* next: the lowest bucket not started yet */
    zs_status st;        /* first failure seen by the hook */
    char err[384];
    bool armed;
    double t_first;      /* first start this step (0: none yet) */
    zs_dp_stats stats;
};

/* Element offset of a leaf's gradient in the flat buffer, or -1. */
static int64_t flat_offset(const zs_dp *dp, const zs_tensor *leaf)
{
    const zs_tensor *g = leaf->grad;
    if (!g || g->storage != dp->flat->storage)
        return -1;
    return g->offset - dp->flat->offset;
}

static int find_bucket(const zs_dp *dp, int64_t off)
{
    return zsi_find_bucket(dp->nb, dp->lo, zs_numel(dp->flat), off);
}

static void fail(zs_dp *dp, zs_status st)
{
    if (dp->st == ZS_OK) {
        dp->st = st;
        snprintf(dp->err, sizeof dp->err, "%s", zs_last_error());
    }
}

/* Starts buckets next, next+1, ... while they are complete (or all of
 * them, with force), in index order. */
static void start_ready(zs_dp *dp, bool force)
{
    while (dp->next < dp->nb && (force || dp->b[dp->next].pending == 0)) {
        bucket *k = &dp->b[dp->next++];
        if (dp->t_first == 0)
            dp->t_first = zsi_now();
        k->started = true;
        if (dp->armed) /* not yet in zs_dp_finish */
            dp->stats.started_in_backward++;
        k->req = zs_comm_iallreduce(dp->c, k->view, true, dp->cfg.algo);
        if (!k->req)
            fail(dp, ZS_ERR_STATE);
    }
}

static void on_ready(void *ctx, zs_tensor *leaf)
{
    zs_dp *dp = ctx;
    int64_t off = flat_offset(dp, leaf);
    int k = off < 0 ? -1 : find_bucket(dp, off);
    if (k < 0)
        return;
    dp->b[k].pending--;
    start_ready(dp, false);
    if (dp->next > 0 && zs_comm_progress(dp->c) != ZS_OK)
        fail(dp, ZS_ERR_STATE);
}

static zs_status build_buckets(zs_dp *dp, int n, zs_tensor *const *params)
{
    size_t m = (size_t)n + 1;
    int64_t *off = malloc(m * sizeof *off);
    int *cnt = malloc(m * sizeof *cnt);
    dp->lo = malloc(m * sizeof *dp->lo);
    dp->b = calloc(m, sizeof *dp->b);
    zs_status st = off && cnt && dp->lo && dp->b ? ZS_OK : ZS_ERR_NOMEM;
    for (int i = 0; st == ZS_OK && i < n; i++) {
        off[i] = flat_offset(dp, params[i]);
        if (off[i] < 0 || !zs_is_contiguous(params[i]->grad))
            st = zs_set_error("data parallel: parameter %d's gradient is not a "
                              "view of the flat gradient buffer", i);
    }
    int64_t total = zs_numel(dp->flat);
    if (st == ZS_OK &&
        (dp->nb = zsi_plan_buckets(n, off, total, dp->cfg.bucket_bytes / 4, dp->lo,
                                   cnt)) < 0)
        st = ZS_ERR_NOMEM;
    for (int k = 0; st == ZS_OK && k < dp->nb; k++) {
        bucket *b = &dp->b[k];
        b->lo = dp->lo[k];
        b->hi = k ? dp->lo[k - 1] : total;
        b->nparams = cnt[k];
        if (!(b->view = zs_narrow(dp->flat, 0, b->lo, b->hi - b->lo)))
            st = ZS_ERR_NOMEM;
    }
    free(off);
    free(cnt);
    if (st == ZS_ERR_NOMEM)
        zs_set_error_code(st, "data parallel: out of memory");
    dp->stats.buckets = dp->nb;
    return st;
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
    zsi_tracking_pause(); /* the views belong to dp, not to a scope */
    zs_status st = build_buckets(dp, n, params);
    zsi_tracking_resume();
    if (st != ZS_OK) {
        zs_dp_free(dp);
        return NULL;
    }
    return dp;
}

void zs_dp_free(zs_dp *dp)
{
    if (!dp)
        return;
    if (dp->armed)
        zs_set_grad_ready_hook(NULL, NULL);
    for (int k = 0; dp->b && k < dp->nb; k++) {
        if (dp->b[k].req)
            zs_request_wait(dp->b[k].req);
        zs_release(dp->b[k].view);
    }
    free(dp->b);
    free(dp->lo);
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
    dp->next = 0;
    dp->t_first = 0;
    dp->stats.started_in_backward = 0;
    for (int k = 0; k < dp->nb; k++) {
        dp->b[k].pending = dp->b[k].nparams;
        dp->b[k].started = false;
    }
    if (dp->cfg.bucket_bytes > 0 && zs_comm_size(dp->c) > 1) {
        dp->armed = true;
        zs_set_grad_ready_hook(on_ready, dp);
    }
    return ZS_OK;
}

zs_status zs_dp_finish(zs_dp *dp)
{
    if (!dp)
        return ZS_ERR_ARG;
    double t0 = zsi_now();
    if (dp->armed)
        zs_set_grad_ready_hook(NULL, NULL);
    dp->armed = false;
    if (zs_comm_size(dp->c) == 1) { /* nothing to average */
        dp->next = dp->nb;
    } else {
        start_ready(dp, true);
    }
    for (int k = 0; k < dp->nb; k++) {
        if (!dp->b[k].req)
            continue;
        zs_status st = zs_request_wait(dp->b[k].req);
        dp->b[k].req = NULL;
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
