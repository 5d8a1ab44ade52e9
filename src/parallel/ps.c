/*
 * ps.c - parameter server: synchronous, asynchronous and stale-synchronous
 * updates (contract and message layout in zs/ps.h).
 *
 * Server state for ASYNC/SSP, per worker w: clock[w] = gradients received
 * from w, base[w] = the update count when w was last sent parameters (so
 * an arriving gradient is version - base[w] updates stale), held[w] = w
 * has pushed and waits for its reply. After each update the server
 * releases every held worker whose clock is within s of the lowest clock
 * (the lowest one always is, so there is no deadlock); ASYNC is s =
 * infinity. Once fn asks to stop, every held worker and every later push
 * is answered "stop"; the server returns when all workers have been told.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parallel/internal.h"
#include "zs/ops.h"
#include "zs/ps.h"

#define TAG_PUSH 7001
#define TAG_PULL 7002

struct zs_ps {
    zs_comm *c;
    zs_ps_mode mode;
    int64_t s;             /* SSP bound; INT64_MAX for ASYNC */
    zs_tensor *fp, *fg;    /* borrowed flat parameters and gradients */
    zs_tensor *push, *pull; /* [n + 1] message buffers */
    int64_t n;
    int64_t *clock, *base; /* per rank (index 0 unused) */
    bool *held, *told;
    zs_ps_stats st;
    double stale_sum;
};

static zs_status check_args(zs_comm *c, zs_ps_mode mode, int staleness,
                            const zs_tensor *fp, const zs_tensor *fg)
{
    if (!c)
        return zs_set_error("parameter server: no communicator");
    if (mode != ZS_PS_SYNC && mode != ZS_PS_ASYNC && mode != ZS_PS_SSP)
        return zs_set_error("parameter server: unknown mode %d", (int)mode);
    if (mode == ZS_PS_SSP && staleness < 0)
        return zs_set_error("parameter server: staleness must be >= 0, got %d", staleness);
    if (mode != ZS_PS_SYNC && zs_comm_size(c) < 2)
        return zs_set_error("parameter server: %s updates need at least 2 ranks "
                            "(rank 0 serves, the others compute)",
                            mode == ZS_PS_SSP ? "stale-synchronous" : "asynchronous");
    if (!fp || !fg || fp->dtype != ZS_F32 || fg->dtype != ZS_F32 || fp->ndim != 1 ||
        !zs_same_shape(fp, fg) || !zs_is_contiguous(fp) || !zs_is_contiguous(fg))
        return zs_set_error("parameter server: needs contiguous 1-D f32 parameter and "
                            "gradient buffers of one size");
    return ZS_OK;
}

zs_ps *zs_ps_new(zs_comm *c, zs_ps_mode mode, int staleness, zs_tensor *flat_params,
                 zs_tensor *flat_grads)
{
    if (check_args(c, mode, staleness, flat_params, flat_grads) != ZS_OK)
        return NULL;
    zs_ps *ps = calloc(1, sizeof *ps);
    int P = zs_comm_size(c);
    if (!ps) {
        zs_set_error_code(ZS_ERR_NOMEM, "parameter server: out of memory");
        return NULL;
    }
    *ps = (zs_ps){.c = c, .mode = mode, .fp = flat_params, .fg = flat_grads,
                  .n = zs_numel(flat_params),
                  .s = mode == ZS_PS_SSP ? staleness : INT64_MAX};
    zs_status st = ZS_OK;
    if (mode != ZS_PS_SYNC) {
        int64_t m = ps->n + 1;
        zsi_tracking_pause(); /* ps owns its buffers, not a scope */
        ps->push = zs_zeros(ZS_F32, 1, &m);
        ps->pull = zs_zeros(ZS_F32, 1, &m);
        zsi_tracking_resume();
        ps->clock = calloc((size_t)P, sizeof *ps->clock);
        ps->base = calloc((size_t)P, sizeof *ps->base);
        ps->held = calloc((size_t)P, sizeof *ps->held);
        ps->told = calloc((size_t)P, sizeof *ps->told);
        if (!ps->push || !ps->pull || !ps->clock || !ps->base || !ps->held || !ps->told)
            st = zs_set_error_code(ZS_ERR_NOMEM, "parameter server: out of memory");
    }
    /* every rank starts from rank 0's parameters (a resumed run loads them
     * there); collective, so a rank that failed above still takes part */
    zs_status bst = zs_comm_broadcast(c, flat_params, 0);
    if (st == ZS_OK)
        st = bst;
    if (st != ZS_OK) {
        zs_ps_free(ps);
        return NULL;
    }
    return ps;
}

void zs_ps_free(zs_ps *ps)
{
    if (!ps)
        return;
    zs_release(ps->push);
    zs_release(ps->pull);
    free(ps->clock);
    free(ps->base);
    free(ps->held);
    free(ps->told);
    free(ps);
}

void zs_ps_get_stats(const zs_ps *ps, zs_ps_stats *s)
{
    *s = ps ? ps->st : (zs_ps_stats){0};
    if (ps && ps->st.updates > 0)
        s->mean_staleness = ps->stale_sum / (double)ps->st.updates;
}

/* ---- synchronous --------------------------------------------------------- */

int zs_ps_sync_step(zs_ps *ps, double loss, zs_ps_update_fn fn, void *ctx)
{
    if (!ps || ps->mode != ZS_PS_SYNC)
        return zs_set_error("parameter server: sync_step needs a ZS_PS_SYNC server");
    zs_comm *c = ps->c;
    zs_status st = zs_comm_reduce(c, ps->fg, 0);
    if (st != ZS_OK)
        return st;
    /* rank 0 applies; its verdict (or failure) travels with a flag so that
     * every rank returns the same */
    double verdict = 0;
    if (zs_comm_rank(c) == 0) {
        zsi_scale(ps->fg, 1.0 / zs_comm_size(c));
        zs_ps_update u = {ps->st.updates, -1, loss, 0};
        int r = fn(ctx, &u);
        verdict = r;
        ps->st.updates++;
    }
    zs_tensor *flag = zs_scalar(ZS_F64, verdict);
    st = flag ? zs_comm_broadcast(c, flag, 0) : ZS_ERR_NOMEM;
    if (st == ZS_OK)
        verdict = zs_item(flag);
    zs_release(flag);
    if (st != ZS_OK)
        return st;
    if (verdict < 0)
        return zs_comm_rank(c) == 0 ? (int)verdict
                                    : zs_set_error_code(ZS_ERR_STATE, "parameter server: "
                                                        "rank 0 failed to apply the update");
    st = zs_comm_broadcast(c, ps->fp, 0);
    return st != ZS_OK ? st : (int)verdict;
}

/* ---- asynchronous and stale-synchronous ---------------------------------- */

/* Sends worker w the current parameters (go) or a stop. */
static zs_status reply(zs_ps *ps, int w, bool go)
{
    float *m = zs_data(ps->pull);
    if (go)
        memcpy(m, zs_data(ps->fp), (size_t)ps->n * sizeof(float));
    m[ps->n] = go ? 1.0f : 0.0f;
    ps->held[w] = false;
    if (go)
        ps->base[w] = ps->st.updates;
    else
        ps->told[w] = true;
    return zs_comm_send(ps->c, ps->pull, w, TAG_PULL);
}

/* Answers the held workers that may go on (all of them, with stop). */
static zs_status release(zs_ps *ps, bool stopping)
{
    int P = zs_comm_size(ps->c);
    int64_t lo = INT64_MAX;
    for (int w = 1; w < P; w++)
        lo = ps->clock[w] < lo ? ps->clock[w] : lo;
    for (int w = 1; w < P; w++) {
        if (!ps->held[w])
            continue;
        int64_t gap = ps->clock[w] - lo;
        if (!stopping && gap > ps->s)
            continue;
        if (!stopping && gap > ps->st.max_clock_gap)
            ps->st.max_clock_gap = gap;
        zs_status st = reply(ps, w, !stopping);
        if (st != ZS_OK)
            return st;
    }
    return ZS_OK;
}

/* Names the workers the server is waiting on ("1, 3") for a timeout. */
static void computing(const zs_ps *ps, char *buf, size_t cap)
{
    size_t k = 0;
    buf[0] = '\0';
    for (int w = 1; w < zs_comm_size(ps->c) && k + 16 < cap; w++)
        if (!ps->held[w] && !ps->told[w])
            k += (size_t)snprintf(buf + k, cap - k, "%s%d", k ? ", " : "", w);
}

zs_status zs_ps_serve(zs_ps *ps, zs_ps_update_fn fn, void *ctx)
{
    if (!ps || ps->mode == ZS_PS_SYNC || zs_comm_rank(ps->c) != 0)
        return zs_set_error("parameter server: serve runs on rank 0 of an "
                            "asynchronous or stale-synchronous server");
    int P = zs_comm_size(ps->c), left = P - 1;
    bool stopping = false;
    zs_status st = ZS_OK;
    while (st == ZS_OK && left > 0) {
        int w = -1;
        double t0 = zsi_now();
        st = zs_comm_recv_idle(ps->c, ps->push, ZS_ANY_SOURCE, TAG_PUSH, &w);
        ps->st.server_idle_s += zsi_now() - t0;
        if (st != ZS_OK) {
            char who[128];
            computing(ps, who, sizeof who);
            char why[384];
            snprintf(why, sizeof why, "%s", zs_last_error());
            return zs_set_error_code(st, "parameter server: waiting for a gradient from "
                                     "rank%s %s: %s", strchr(who, ',') ? "s" : "", who,
                                     why);
        }
        if (stopping) {
            st = reply(ps, w, false);
            left--;
            continue;
        }
        const float *m = zs_data(ps->push);
        memcpy(zs_data(ps->fg), m, (size_t)ps->n * sizeof(float));
        zs_ps_update u = {ps->st.updates, w, m[ps->n], ps->st.updates - ps->base[w]};
        int r = fn(ctx, &u);
        if (r < 0)
            return r;
        ps->stale_sum += (double)u.staleness;
        if (u.staleness > ps->st.max_staleness)
            ps->st.max_staleness = u.staleness;
        ps->st.updates++;
        ps->clock[w]++;
        ps->held[w] = true;
        if (r == 1) {
            stopping = true;
            for (int v = 1; v < P; v++) /* the held ones are told now */
                left -= ps->held[v];
        }
        st = release(ps, stopping);
        if (!stopping && ps->held[w]) /* SSP keeps w waiting */
            ps->st.held++;
    }
    return st;
}

int zs_ps_push_pull(zs_ps *ps, double loss)
{
    if (!ps || ps->mode == ZS_PS_SYNC || zs_comm_rank(ps->c) == 0)
        return zs_set_error("parameter server: push_pull runs on a worker (rank >= 1) "
                            "of an asynchronous or stale-synchronous server");
    float *m = zs_data(ps->push);
    memcpy(m, zs_data(ps->fg), (size_t)ps->n * sizeof(float));
    m[ps->n] = (float)loss;
    zs_status st = zs_comm_send(ps->c, ps->push, 0, TAG_PUSH);
    if (st == ZS_OK)
        st = zs_comm_recv_idle(ps->c, ps->pull, 0, TAG_PULL, NULL);
    if (st != ZS_OK)
        return st;
    const float *r = zs_data(ps->pull);
    if (r[ps->n] == 0.0f)
        return 1;
    memcpy(zs_data(ps->fp), r, (size_t)ps->n * sizeof(float));
    return 0;
}
