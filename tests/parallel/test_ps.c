/*
 * test_ps.c - the parameter server (src/parallel/ps.c) at whatever size it is
 * started with: plainly (one process) and by ctest under `mpirun -np 2`
 * and `-np 4`.
 *
 * Gradients are known functions of (rank, clock), so the server can check
 * every message it applies:
 *  - sync: rank 0 sees the average of every rank's gradient (float64
 *    reference, f32 sums of P terms: 1e-6), every rank ends with rank 0's
 *    parameters, and rank 0's stop request reaches every rank;
 *  - async: every pushed gradient is applied once, in a worker's own order,
 *    with the staleness the worker can tell from the version it read;
 *  - ssp: no gradient is applied while its worker is more than s clocks
 *    ahead of the slowest (s = 0: rounds of one gradient per worker);
 *  - errors: modes that need two ranks, bad buffers, a receive with a bad
 *    tag, and a server whose workers never push (timeout naming them).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "testutil.h"

static int R, P;

#define N 1001 /* odd: no vector width divides it */

/* Element i of the gradient worker w pushes at its clock k. */
static float grad_value(int w, int64_t k, int64_t i)
{
    uint32_t x[4];
    zs_philox(7919 * (uint64_t)w + (uint64_t)k, (uint64_t)i, x);
    return (float)((double)(x[0] >> 8) / 8388608.0 - 1.0);
}

typedef struct server_log {
    zs_tensor *fp, *fg;
    int64_t count[8];     /* gradients applied per worker */
    int64_t stop_at;      /* ask to stop after this many updates */
    int64_t s;            /* SSP bound, -1 for none */
    int bad_grad, bad_stale, bad_order;
    int calls;
} server_log;

/* Server: checks the gradient against (worker, its clock), the staleness
 * against the version the worker read (sent as its loss), the SSP order;
 * then p[i] += 1 everywhere (p[0] counts versions). */
static int server_fn(void *ctx, const zs_ps_update *u)
{
    server_log *L = ctx;
    const float *g = zs_data(L->fg);
    float *p = zs_data(L->fp);
    int w = u->worker;
    for (int64_t i = 0; i < N; i++)
        if (g[i] != grad_value(w, L->count[w], i)) {
            L->bad_grad++;
            break;
        }
    if (u->staleness != u->index - (int64_t)u->loss)
        L->bad_stale++;
    if (L->s >= 0) {
        int64_t lo = INT64_MAX;
        for (int v = 1; v < P; v++)
            lo = L->count[v] < lo ? L->count[v] : lo;
        if (L->count[w] - lo > L->s)
            L->bad_order++;
    }
    L->count[w]++;
    L->calls++;
    for (int64_t i = 0; i < N; i++)
        p[i] += 1.0f;
    return u->index + 1 >= L->stop_at ? 1 : 0;
}

typedef struct sync_log {
    zs_tensor *fp, *fg;
    double err;
    int calls;
} sync_log;

/* Rank 0 of the synchronous server: gradient = mean over ranks. */
static int sync_fn(void *ctx, const zs_ps_update *u)
{
    sync_log *L = ctx;
    const float *g = zs_data(L->fg);
    float *p = zs_data(L->fp);
    for (int64_t i = 0; i < N; i++) {
        double want = 0;
        for (int r = 0; r < P; r++)
            want += grad_value(r, u->index, i);
        want /= P;
        double e = fabs(g[i] - want);
        L->err = e > L->err ? e : L->err;
        p[i] -= 0.5f * g[i];
    }
    L->calls++;
    return u->index == 2 ? 1 : 0;
}

static void fill_grad(zs_tensor *fg, int w, int64_t k)
{
    float *g = zs_data(fg);
    for (int64_t i = 0; i < N; i++)
        g[i] = grad_value(w, k, i);
}

static void test_sync(void)
{
    zs_tensor *fp = zs_zeros(ZS_F32, ZS_SHAPE(N)), *fg = zs_zeros(ZS_F32, ZS_SHAPE(N));
    if (R == 0)
        zs_fill_(fp, 3.0);
    zs_ps *ps = zs_ps_new(zs_comm_world(), ZS_PS_SYNC, 0, fp, fg);
    ZT_CHECK(ps != NULL, "sync server: %s", zs_last_error());
    ZT_CHECK(((float *)zs_data(fp))[N - 1] == 3.0f, "every rank starts from rank 0's "
             "parameters");
    sync_log L = {fp, fg, 0, 0};
    int verdict = 0;
    for (int64_t k = 0; ps && k < 3; k++) {
        fill_grad(fg, R, k);
        verdict = zs_ps_sync_step(ps, 1.0, sync_fn, &L);
    }
    ZT_CHECK(verdict == 1, "rank 0's stop request reaches rank %d (%d)", R, verdict);
    if (R == 0)
        ZT_CHECK(L.calls == 3 && L.err <= 1e-6, "rank 0 applied the average of %d "
                 "gradients 3 times (error %.2e)", P, L.err);
    else
        ZT_CHECK(L.calls == 0, "only rank 0 applies updates");
    /* every rank holds rank 0's result: compare a checksum */
    double sum = 0;
    for (int64_t i = 0; i < N; i++)
        sum += ((float *)zs_data(fp))[i];
    zs_tensor *mine = zs_scalar(ZS_F64, sum), *root = zs_scalar(ZS_F64, sum);
    zs_comm_broadcast(zs_comm_world(), root, 0);
    ZT_CHECK(zs_item(mine) == zs_item(root), "rank %d's parameters equal rank 0's", R);
    zs_release(mine);
    zs_release(root);
    zs_ps_free(ps);
    zs_release(fp);
    zs_release(fg);
    zt_section("sync: average on rank 0, parameters broadcast, stop shared");
}

/* A worker's push at clock k: its known gradient, and as "loss" the
 * version of the parameters it read (p[0]), for the server to check. */
static int push(zs_ps *ps, zs_tensor *fg, const zs_tensor *fp, int w, int64_t k)
{
    /* rank 1 is slow: without the SSP bound the others would run ahead */
    struct timespec nap = {0, 3000000};
    if (w == 1)
        nanosleep(&nap, NULL);
    fill_grad(fg, w, k);
    return zs_ps_push_pull(ps, ((const float *)zs_data(fp))[0]);
}

/* One asynchronous (s < 0) or stale-synchronous run of `rounds` gradients
 * per worker. */
static void run_async(zs_ps_mode mode, int s, int64_t rounds)
{
    zs_tensor *fp = zs_zeros(ZS_F32, ZS_SHAPE(N)), *fg = zs_zeros(ZS_F32, ZS_SHAPE(N));
    zs_ps *ps = zs_ps_new(zs_comm_world(), mode, s, fp, fg);
    ZT_CHECK(ps != NULL, "server: %s", zs_last_error());
    const char *name = mode == ZS_PS_ASYNC ? "async" : "ssp";
    if (ps && R == 0) {
        server_log L = {.fp = fp, .fg = fg, .stop_at = rounds * (P - 1),
                        .s = mode == ZS_PS_SSP ? s : -1};
        zs_status st = zs_ps_serve(ps, server_fn, &L);
        ZT_CHECK(st == ZS_OK, "%s serve: %s", name, zs_last_error());
        zs_ps_stats stats;
        zs_ps_get_stats(ps, &stats);
        ZT_CHECK(L.calls == rounds * (P - 1) && stats.updates == L.calls,
                 "%s: %d updates applied, %lld wanted", name, L.calls,
                 (long long)(rounds * (P - 1)));
        ZT_CHECK(L.bad_grad == 0, "%s: %d gradients differ from what was pushed", name,
                 L.bad_grad);
        ZT_CHECK(L.bad_stale == 0, "%s: %d staleness values wrong", name, L.bad_stale);
        ZT_CHECK(L.bad_order == 0, "%s s=%d: %d gradients applied too far ahead", name,
                 s, L.bad_order);
        ZT_CHECK(mode != ZS_PS_SSP || stats.max_clock_gap <= s,
                 "ssp: largest clock gap %lld <= %d", (long long)stats.max_clock_gap, s);
        ZT_CHECK(((float *)zs_data(fp))[0] == (float)L.calls, "parameters advanced once "
                 "per update");
    } else if (ps) {
        int64_t k = 0, last_version = -1;
        int r = 0, monotone = 1;
        while ((r = push(ps, fg, fp, R, k)) == 0) {
            int64_t v = (int64_t)((float *)zs_data(fp))[0];
            monotone &= v > last_version;
            last_version = v;
            k++;
        }
        ZT_CHECK(r == 1, "%s: worker %d stopped by the server (%d)", name, R, r);
        ZT_CHECK(monotone, "%s: worker %d read newer parameters each time", name, R);
        /* SSP keeps the slow worker within s rounds of the end; async may
         * finish without its second gradient */
        ZT_CHECK(mode == ZS_PS_ASYNC || k >= rounds - s - 1, "%s s=%d: worker %d had "
                 "%lld gradients taken (%lld rounds)", name, s, R, (long long)k,
                 (long long)rounds);
    }
    zs_comm_barrier(zs_comm_world());
    zs_ps_free(ps);
    zs_release(fp);
    zs_release(fg);
}

static void test_async(void)
{
    if (P == 1) {
        zt_section("async/ssp: need a server and a worker (skipped on one process)");
        return;
    }
    run_async(ZS_PS_ASYNC, 0, 7);
    run_async(ZS_PS_SSP, 0, 5);
    run_async(ZS_PS_SSP, 1, 6);
    zt_section("async and ssp (s = 0, 1): every gradient applied once, staleness "
               "exact, clocks within s");
}

static void test_errors(void)
{
    zs_tensor *fp = zs_zeros(ZS_F32, ZS_SHAPE(N)), *fg = zs_zeros(ZS_F32, ZS_SHAPE(N));
    zs_tensor *small = zs_zeros(ZS_F32, ZS_SHAPE(N - 1));
    zs_tensor *f64 = zs_zeros(ZS_F64, ZS_SHAPE(N));
    zs_comm *w = zs_comm_world();
    ZT_EXPECT_ERROR(zs_ps_new(w, ZS_PS_SYNC, 0, fp, small) == NULL, "one size");
    ZT_EXPECT_ERROR(zs_ps_new(w, ZS_PS_SYNC, 0, f64, fg) == NULL, "f32");
    ZT_EXPECT_ERROR(zs_ps_new(w, ZS_PS_SSP, -1, fp, fg) == NULL, "staleness must be");
    ZT_EXPECT_ERROR(zs_ps_new(NULL, ZS_PS_SYNC, 0, fp, fg) == NULL, "no communicator");
    if (P == 1) {
        ZT_EXPECT_ERROR(zs_ps_new(w, ZS_PS_ASYNC, 0, fp, fg) == NULL, "at least 2 ranks");
        ZT_EXPECT_ERROR(zs_comm_recv_idle(w, fp, ZS_ANY_SOURCE, 1, NULL) < 0,
                        "no one to hear from");
    } else {
        ZT_EXPECT_ERROR(zs_comm_recv_idle(w, fp, ZS_ANY_SOURCE, 40000, NULL) < 0,
                        "outside [0, 32767]");
        ZT_EXPECT_ERROR(zs_comm_recv_idle(w, fp, R, 1, NULL) < 0, "not another rank");
    }
    zs_ps *sync = zs_ps_new(w, ZS_PS_SYNC, 0, fp, fg);
    ZT_EXPECT_ERROR(zs_ps_serve(sync, server_fn, NULL) < 0, "serve runs on rank 0");
    ZT_EXPECT_ERROR(zs_ps_push_pull(sync, 0) < 0, "push_pull runs on a worker");
    zs_ps_free(sync);
    if (P > 1) {
        /* workers that never push: the server names them after the timeout
         * (on a sub-communicator, so the world stays usable) */
        zs_comm *c = zs_comm_split(w, 0, R);
        zs_comm_set_timeout(c, 0.3);
        zs_ps *ps = zs_ps_new(c, ZS_PS_ASYNC, 0, fp, fg);
        ZT_CHECK(ps != NULL, "server for the timeout: %s", zs_last_error());
        if (ps && R == 0) {
            server_log L = {.fp = fp, .fg = fg, .stop_at = 1, .s = -1};
            zs_status st = zs_ps_serve(ps, server_fn, &L);
            printf("  %s\n", zs_last_error());
            ZT_EXPECT_ERROR(st < 0, P > 2 ? "from ranks 1, 2" : "from rank 1");
        }
        zs_comm_barrier(w);
        zs_ps_free(ps);
        zs_comm_free(c);
    }
    zs_release(fp);
    zs_release(fg);
    zs_release(small);
    zs_release(f64);
    zt_section("errors: bad buffers and modes, misplaced calls, a server timing out "
               "names the silent workers");
}

int main(int argc, char **argv)
{
    zt_dist_start(&argc, &argv, &R, &P);
    test_sync();
    test_async();
    test_errors();
    return zt_dist_done();
}
