/*
 * test_collectives.c - every collective against a serial reference that
 * each rank computes itself (rank r's data is a known function of r), at
 * whatever size it is started with: plainly (one process) and by ctest
 * under `mpirun -np 2` and `-np 4`. Odd sizes (1, 3, 7, 1000003: chunks
 * of the ring that differ in size, or are empty), f32, f64, i32, i64 (u8
 * for the byte movers); the ring all-reduce against MPI's; non-blocking
 * all-reduces in flight together; sub-communicators; the errors caught
 * before any message; cross-rank argument checks; and timeouts that name
 * the rank that did not answer.
 */
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "testutil.h"

static int R, P;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static const int64_t sizes[] = {1, 3, 7, 1000003};
#define NSIZES 4

/* Element i of rank r's data: integers exact, floats in [-1, 1). */
static double value(zs_dtype dt, int r, int64_t i)
{
    if (dt == ZS_I32 || dt == ZS_I64)
        return (double)((r + 1) * 1000 + i % 97);
    if (dt == ZS_U8)
        return (double)((r * 31 + i) % 251);
    uint32_t w[4];
    zs_philox(100 + (uint64_t)r, (uint64_t)i, w);
    double v = (double)(w[0] >> 8) / 8388608.0 - 1.0;
    return dt == ZS_F32 ? (double)(float)v : v;
}

static double get(const zs_tensor *t, int64_t i)
{
    const void *d = zs_data(t);
    switch (t->dtype) {
    case ZS_F32: return ((const float *)d)[i];
    case ZS_F64: return ((const double *)d)[i];
    case ZS_I32: return ((const int32_t *)d)[i];
    case ZS_I64: return (double)((const int64_t *)d)[i];
    default: return ((const uint8_t *)d)[i];
    }
}

/* Rank r's data of n elements, starting at element `from` of its series. */
static zs_tensor *filled(zs_dtype dt, int64_t n, int r, int64_t from)
{
    zs_tensor *t = zs_empty(dt, 1, &n);
    void *d = zs_data(t);
    for (int64_t i = 0; i < n; i++) {
        double v = value(dt, r, from + i);
        switch (dt) {
        case ZS_F32: ((float *)d)[i] = (float)v; break;
        case ZS_F64: ((double *)d)[i] = v; break;
        case ZS_I32: ((int32_t *)d)[i] = (int32_t)v; break;
        case ZS_I64: ((int64_t *)d)[i] = (int64_t)v; break;
        default: ((uint8_t *)d)[i] = (uint8_t)v; break;
        }
    }
    return t;
}

/* Sum over ranks of element i (float64; exact for the integers). */
static double ref_sum(zs_dtype dt, int64_t i)
{
    double s = 0;
    for (int r = 0; r < P; r++)
        s += value(dt, r, i);
    return s;
}

/* Float sums of P terms in [-1, 1) in any order differ from the float64
 * sum by at most (P-1) * eps * sum|x| <= P^2 eps; integers are exact. */
static double tol(zs_dtype dt)
{
    return dt == ZS_F32 ? P * P * 6e-8 : dt == ZS_F64 ? P * P * 1.2e-16 : 0;
}

static const zs_dtype sum_dts[] = {ZS_F32, ZS_F64, ZS_I32, ZS_I64};

static void test_allreduce(void)
{
    zs_comm *w = zs_comm_world();
    for (int d = 0; d < 4; d++)
        for (int s = 0; s < NSIZES; s++) {
            zs_dtype dt = sum_dts[d];
            int64_t n = sizes[s];
            zs_tensor *ring = filled(dt, n, R, 0), *mpi = filled(dt, n, R, 0);
            ZT_CHECK(zs_comm_allreduce(w, ring, false, ZS_ALLREDUCE_RING) == ZS_OK &&
                     zs_comm_allreduce(w, mpi, false, ZS_ALLREDUCE_MPI) == ZS_OK,
                     "allreduce %s n=%lld", zs_dtype_name(dt), (long long)n);
            double worst = 0, apart = 0;
            for (int64_t i = 0; i < n; i++) {
                double ref = ref_sum(dt, i);
                worst = fmax(worst, fmax(fabs(get(ring, i) - ref), fabs(get(mpi, i) - ref)));
                apart = fmax(apart, fabs(get(ring, i) - get(mpi, i)));
            }
            ZT_CHECK(worst <= tol(dt) && apart <= 2 * tol(dt),
                     "allreduce %s n=%lld: error vs reference %g, ring vs mpi %g (tol %g)",
                     zs_dtype_name(dt), (long long)n, worst, apart, tol(dt));
            zs_release(ring);
            zs_release(mpi);
        }
    for (int a = 0; a < 2; a++) {
        zs_tensor *t = filled(ZS_F64, 11, R, 0);
        ZT_CHECK(zs_comm_allreduce(w, t, true, a) == ZS_OK &&
                 fabs(get(t, 5) - ref_sum(ZS_F64, 5) / P) < 1e-15, "average (%d)", a);
        zs_release(t);
    }
    zt_section("all-reduce: MPI and ring vs serial reference and each other (n = 1, 3, 7, 1000003)");
}

/* Three buckets in flight at once, advanced by test/progress, waited for
 * in reverse order. */
static void test_iallreduce(void)
{
    zs_comm *w = zs_comm_world();
    const zs_dtype dts[] = {ZS_F32, ZS_F64, ZS_I64};
    const int64_t ns[] = {100003, 77, 13};
    const zs_allreduce_algo algos[] = {ZS_ALLREDUCE_RING, ZS_ALLREDUCE_MPI, ZS_ALLREDUCE_RING};
    zs_tensor *t[3];
    zs_request *q[3];
    for (int k = 0; k < 3; k++) {
        t[k] = filled(dts[k], ns[k], R, 0);
        q[k] = zs_comm_iallreduce(w, t[k], k == 0, algos[k]);
        ZT_CHECK(q[k] != NULL, "iallreduce %d started", k);
    }
    bool done = false;
    zs_status st = ZS_OK;
    for (int spin = 0; spin < 1000 && !done && st == ZS_OK; spin++)
        st = zs_request_test(q[1], &done);
    ZT_CHECK(st == ZS_OK, "request_test");
    ZT_CHECK(zs_comm_progress(w) == ZS_OK, "progress");
    for (int k = 2; k >= 0; k--) {
        ZT_CHECK(zs_request_wait(q[k]) == ZS_OK, "wait %d", k);
        double worst = 0, div = k == 0 ? P : 1;
        for (int64_t i = 0; i < ns[k]; i++)
            worst = fmax(worst, fabs(get(t[k], i) - ref_sum(dts[k], i) / div));
        ZT_CHECK(worst <= tol(dts[k]), "iallreduce %d: error %g", k, worst);
        zs_release(t[k]);
    }
    zt_section("non-blocking all-reduce: ring, MPI, ring in flight together");
}

static int bad_count(const zs_tensor *t, zs_dtype dt, int r, int64_t from, int64_t n,
                     int64_t at)
{
    int bad = 0;
    for (int64_t i = 0; i < n; i++)
        bad += get(t, at + i) != value(dt, r, from + i);
    return bad;
}

/* Broadcast, all-gather, scatter, gather move bytes: any dtype. */
static void test_movers(zs_dtype dt, int64_t n)
{
    zs_comm *w = zs_comm_world();
    int64_t tot = n * P;
    const char *name = zs_dtype_name(dt);
    zs_tensor *b = filled(dt, n, R, 0);
    ZT_CHECK(zs_comm_broadcast(w, b, P - 1) == ZS_OK &&
             bad_count(b, dt, P - 1, 0, n, 0) == 0, "broadcast %s n=%lld", name, (long long)n);
    zs_tensor *in = filled(dt, n, R, 0), *all = zs_empty(dt, 1, &tot);
    ZT_CHECK(zs_comm_allgather(w, in, all) == ZS_OK, "allgather");
    int bad = 0;
    for (int r = 0; r < P; r++)
        bad += bad_count(all, dt, r, 0, n, r * n);
    ZT_CHECK(bad == 0, "allgather %s n=%lld: %d wrong", name, (long long)n, bad);
    int root = P / 2;
    zs_tensor *whole = filled(dt, tot, R, 0), *part = zs_empty(dt, 1, &n);
    ZT_CHECK(zs_comm_scatter(w, R == root ? whole : NULL, part, root) == ZS_OK &&
             bad_count(part, dt, root, R * n, n, 0) == 0, "scatter %s n=%lld", name, (long long)n);
    zs_tensor *back = zs_zeros(dt, 1, &tot);
    ZT_CHECK(zs_comm_gather(w, in, R == root ? back : NULL, root) == ZS_OK, "gather");
    bad = 0;
    for (int r = 0; R == root && r < P; r++)
        bad += bad_count(back, dt, r, 0, n, r * n);
    ZT_CHECK(bad == 0, "gather %s n=%lld: %d wrong", name, (long long)n, bad);
    zs_tensor *ts[] = {b, in, all, whole, part, back};
    for (int i = 0; i < 6; i++)
        zs_release(ts[i]);
}

/* Reduce and reduce-scatter sum: the four summable dtypes. */
static void test_reducers(zs_dtype dt, int64_t n)
{
    zs_comm *w = zs_comm_world();
    int64_t tot = n * P;
    int root = P - 1;
    zs_tensor *rd = filled(dt, n, R, 0);
    ZT_CHECK(zs_comm_reduce(w, rd, root) == ZS_OK, "reduce");
    double worst = 0;
    for (int64_t i = 0; i < n; i++)
        worst = fmax(worst, fabs(get(rd, i) - (R == root ? ref_sum(dt, i) : value(dt, R, i))));
    ZT_CHECK(worst <= tol(dt), "reduce %s n=%lld: error %g", zs_dtype_name(dt),
             (long long)n, worst);
    zs_tensor *big = filled(dt, tot, R, 0), *mine = zs_empty(dt, 1, &n);
    ZT_CHECK(zs_comm_reduce_scatter(w, big, mine) == ZS_OK, "reduce_scatter");
    worst = 0;
    for (int64_t i = 0; i < n; i++)
        worst = fmax(worst, fabs(get(mine, i) - ref_sum(dt, R * n + i)));
    ZT_CHECK(worst <= tol(dt), "reduce_scatter %s n=%lld: error %g", zs_dtype_name(dt),
             (long long)n, worst);
    zs_release(rd);
    zs_release(big);
    zs_release(mine);
}

static void test_others(void)
{
    const zs_dtype movers[] = {ZS_F32, ZS_F64, ZS_I32, ZS_I64, ZS_U8};
    for (int s = 0; s < NSIZES; s++) {
        for (int d = 0; d < 5; d++)
            test_movers(movers[d], sizes[s]);
        for (int d = 0; d < 4; d++)
            test_reducers(sum_dts[d], sizes[s]);
    }
    zt_section("broadcast, all-gather, scatter, gather (5 dtypes); reduce, reduce-scatter (4)");
    zs_comm *w = zs_comm_world();
    ZT_CHECK(zs_comm_barrier(w) == ZS_OK, "barrier");
    if (P > 1) { /* around the ring: even ranks send first */
        int64_t n = 13;
        zs_tensor *mine = filled(ZS_I64, n, R, 0), *got = zs_empty(ZS_I64, 1, &n);
        int right = (R + 1) % P, left = (R + P - 1) % P;
        zs_status st;
        if (R % 2 == 0) {
            st = zs_comm_send(w, mine, right, 5);
            if (st == ZS_OK)
                st = zs_comm_recv(w, got, left, 5);
        } else {
            st = zs_comm_recv(w, got, left, 5);
            if (st == ZS_OK)
                st = zs_comm_send(w, mine, right, 5);
        }
        ZT_CHECK(st == ZS_OK && bad_count(got, ZS_I64, left, 0, n, 0) == 0, "send/recv");
        zs_release(mine);
        zs_release(got);
    }
    /* even and odd ranks; then each rank alone; keys reverse the order */
    zs_comm *sub = zs_comm_split(w, R % 2, -R), *alone = zs_comm_split(w, R, 0);
    int want = (P + 1 - R % 2) / 2;
    zs_tensor *rk = zs_scalar(ZS_I64, R), *one = zs_ones(ZS_I32, 1, (int64_t[]){1});
    ZT_CHECK(sub && zs_comm_size(sub) == want && zs_comm_allreduce(sub, one, false,
             ZS_ALLREDUCE_RING) == ZS_OK && get(one, 0) == want,
             "split: %d ranks in my group, expected %d", zs_comm_size(sub), want);
    ZT_CHECK(zs_comm_broadcast(sub, rk, 0) == ZS_OK && get(rk, 0) == (want - 1) * 2 + R % 2,
             "split ordered by key: rank 0 of my group is world rank %g", get(rk, 0));
    ZT_CHECK(alone && zs_comm_size(alone) == 1 && zs_comm_rank(alone) == 0 &&
             zs_comm_allreduce(alone, one, false, ZS_ALLREDUCE_RING) == ZS_OK, "split alone");
    zs_comm *rest = zs_comm_split(w, R == 0 ? -1 : 0, 0); /* rank 0 opts out */
    if (R == 0)
        ZT_EXPECT_ERROR(rest == NULL, "color -1 is negative");
    else
        ZT_CHECK(rest && zs_comm_size(rest) == P - 1, "split without rank 0");
    zs_comm_free(rest);
    zs_comm_free(sub);
    zs_comm_free(alone);
    zs_release(rk);
    zs_release(one);
    zt_section("barrier, send/recv, split (groups, key order, single rank, bad color)");
}

static void test_errors(void)
{
    zs_comm *w = zs_comm_world();
    zs_tensor *a = zs_zeros(ZS_F32, ZS_SHAPE(5)), *b = zs_zeros(ZS_F32, ZS_SHAPE(5 * P + 1));
    zs_tensor *bi = zs_zeros(ZS_I32, ZS_SHAPE(5 * P));
    ZT_EXPECT_ERROR(zs_comm_allgather(w, a, b) < 0, "expected the whole");
    ZT_EXPECT_ERROR(zs_comm_allgather(w, a, bi) < 0, "same dtype");
    ZT_EXPECT_ERROR(zs_comm_reduce_scatter(w, b, a) < 0, "expected the whole");
    if (P == 1) /* only the root can tell; the others would wait for it */
        ZT_EXPECT_ERROR(zs_comm_scatter(w, b, a, 0) < 0, "expected the whole");
    ZT_EXPECT_ERROR(zs_comm_broadcast(w, a, P) < 0, "is not a rank");
    ZT_EXPECT_ERROR(zs_comm_reduce(w, a, -1) < 0, "is not a rank");
    ZT_EXPECT_ERROR(zs_comm_gather(w, a, b, P + 3) < 0, "is not a rank");
    ZT_EXPECT_ERROR(zs_comm_scatter(w, b, a, P) < 0, "is not a rank");
    zs_tensor *m = zs_zeros(ZS_F32, ZS_SHAPE(4, 4)), *mt = zs_transpose(m, 0, 1);
    ZT_EXPECT_ERROR(zs_comm_allreduce(w, mt, false, ZS_ALLREDUCE_MPI) < 0, "contiguous");
    ZT_EXPECT_ERROR(zs_comm_iallreduce(w, mt, false, ZS_ALLREDUCE_RING) == NULL, "contiguous");
    zs_tensor *u = zs_zeros(ZS_U8, ZS_SHAPE(3));
    ZT_EXPECT_ERROR(zs_comm_allreduce(w, u, false, ZS_ALLREDUCE_RING) < 0, "cannot sum");
    ZT_EXPECT_ERROR(zs_comm_reduce(w, u, 0) < 0, "cannot sum");
    ZT_EXPECT_ERROR(zs_comm_allreduce(w, bi, true, ZS_ALLREDUCE_RING) < 0, "would truncate");
    ZT_EXPECT_ERROR(zs_comm_allreduce(w, a, false, (zs_allreduce_algo)7) < 0, "unknown algorithm");
    ZT_EXPECT_ERROR(zs_comm_send(w, a, R, 1) < 0, "not another rank");
    ZT_EXPECT_ERROR(zs_comm_recv(w, a, P, 1) < 0, "not another rank");
    ZT_EXPECT_ERROR(zs_comm_broadcast(NULL, a, 0) < 0, "NULL communicator");
    ZT_EXPECT_ERROR(zs_comm_broadcast(w, NULL, 0) < 0, "NULL tensor");
    if (P > 1) {
        ZT_EXPECT_ERROR(zs_comm_send(w, a, (R + 1) % P, 40000) < 0, "tag 40000");
        /* rank 0 sends 5 floats to rank 1, which expects 5*P+1, then the reverse */
        if (R == 0) {
            ZT_CHECK(zs_comm_send(w, a, 1, 9) == ZS_OK, "send 5 floats");
            ZT_CHECK(zs_comm_send(w, b, 1, 9) == ZS_OK, "send 5P+1 floats");
        } else if (R == 1) {
            ZT_EXPECT_ERROR(zs_comm_recv(w, b, 0, 9) < 0, "got 20 bytes from rank 0");
            ZT_EXPECT_ERROR(zs_comm_recv(w, a, 0, 9) < 0, "sent more than the 20 bytes");
        }
        ZT_CHECK(!zs_comm_is_broken(w) && zs_comm_barrier(w) == ZS_OK,
                 "the world is usable after size errors");
    }
    zs_tensor *all_t[] = {a, b, bi, m, mt, u};
    for (size_t i = 0; i < sizeof all_t / sizeof *all_t; i++)
        zs_release(all_t[i]);
    zt_section("errors caught before any message (sizes, dtypes, roots, layout, peers, tags)");
}

/* With checks on, a rank whose sizes, collective or arguments differ
 * makes every rank fail with a message naming it, and nobody hangs. */
static void test_checks(void)
{
    zs_comm *c = zs_comm_split(zs_comm_world(), 0, R);
    zs_comm_set_checks(c, true);
    zs_comm_set_timeout(c, 30); /* a bug here fails instead of hanging */
    int odd = P - 1;
    zs_tensor *t = zs_zeros(ZS_F32, ZS_SHAPE(R == odd ? 8 : 7));
    zs_status st = zs_comm_allreduce(c, t, false, ZS_ALLREDUCE_RING);
    char want[64];
    snprintf(want, sizeof want, "rank %d called allreduce(%d f32", R == odd ? 0 : odd,
             R == odd ? 7 : 8);
    if (P > 1)
        ZT_EXPECT_ERROR(st < 0, want);
    else
        ZT_CHECK(st == ZS_OK, "checks on one process");
    st = zs_comm_broadcast(c, t, R == odd ? P : 0); /* bad root on one rank */
    snprintf(want, sizeof want, "rank %d rejected its arguments", odd);
    if (R == 0 && P > 1)
        printf("  %s\n", zs_last_error());
    ZT_EXPECT_ERROR(st < 0 || P == 1, R == odd || P == 1 ? "is not a rank" : want);
    if (P > 1) { /* one rank in another collective */
        st = R == odd ? zs_comm_barrier(c) : zs_comm_broadcast(c, t, 0);
        ZT_EXPECT_ERROR(st < 0, "called barrier(");
    }
    ZT_CHECK(!zs_comm_is_broken(c) && zs_comm_barrier(c) == ZS_OK, "usable after checks");
    zs_release(t);
    zs_comm_free(c);
    zt_section("checks on: differing sizes, a bad root, another collective fail on every rank");
}

/* Rank P-1 stays away longer than the timeout: the others fail with a
 * message naming it, then it arrives and fails or completes. */
static void timeout_case(zs_allreduce_algo algo)
{
    zs_comm *c = zs_comm_split(zs_comm_world(), 0, R);
    zs_comm_set_timeout(c, 1.0);
    zs_tensor *t = filled(ZS_F32, 7, R, 0);
    zs_comm_barrier(zs_comm_world());
    double t0 = now();
    if (R == P - 1)
        sleep(3);
    zs_status st = zs_comm_allreduce(c, t, false, algo);
    double took = now() - t0;
    if (R != P - 1) {
        char want[64];
        snprintf(want, sizeof want, "rank %d did not answer", P - 1);
        if (R == 0)
            printf("  %s\n", zs_last_error());
        ZT_EXPECT_ERROR(st < 0, want);
        ZT_CHECK(took < 2.9 && zs_comm_is_broken(c), "failed within 2 timeouts (%.2f s)", took);
        ZT_EXPECT_ERROR(zs_comm_barrier(c) < 0, "unusable after an earlier failure");
    }
    zs_comm_barrier(zs_comm_world()); /* the late rank is done with c */
    zs_comm_free(c);
    zs_release(t);
}

static void test_timeouts(void)
{
    if (P == 1) {
        zt_section("timeouts: one process never waits (skipped)");
        return;
    }
    timeout_case(ZS_ALLREDUCE_RING);
    timeout_case(ZS_ALLREDUCE_MPI);
    zs_comm *c = zs_comm_split(zs_comm_world(), 0, R);
    zs_comm_set_timeout(c, 0.3);
    zs_tensor *t = zs_zeros(ZS_F64, ZS_SHAPE(3));
    if (R == 0) {
        zs_status st = zs_comm_recv(c, t, 1, 3);
        printf("  %s\n", zs_last_error());
        ZT_EXPECT_ERROR(st < 0, "waiting for rank 1");
    }
    zs_comm_barrier(zs_comm_world());
    zs_comm_free(c);
    zs_release(t);
    zt_section("timeouts: ring, MPI all-reduce and recv name the missing rank");
}

int main(int argc, char **argv)
{
    zt_dist_start(&argc, &argv, &R, &P);
    test_allreduce();
    test_iallreduce();
    test_others();
    test_errors();
    test_checks();
    test_timeouts();
    return zt_dist_done();
}
