/*
 * test_collectives.c - every collective against a serial reference that
 * each rank computes itself (rank r's data is a known function of r), at
 * whatever size it is started with: plainly (one process) and by ctest
 * under `mpirun -np 2` and `-np 4`. Odd sizes (1, 7, 1000003), f32, f64,
 * i32 and i64; the ring all-reduce against MPI's; sub-communicators; and
 * the errors that can be caught before any message is sent.
 */
#include <stdlib.h>

#include "testutil.h"

static int R, P;

/* Element i of rank r's data: integers exact, floats in [-1, 1). */
static double value(zs_dtype dt, int r, int64_t i)
{
    if (dt == ZS_I32 || dt == ZS_I64)
        return (double)((r + 1) * 1000 + i % 97);
    uint32_t w[4];
    zs_philox(100 + (uint64_t)r, (uint64_t)i, w);
    return (double)(w[0] >> 8) / 8388608.0 - 1.0;
}

static zs_tensor *filled(zs_dtype dt, int64_t n, int r)
{
    zs_tensor *t = zs_empty(dt, 1, &n);
    void *d = zs_data(t);
    for (int64_t i = 0; i < n; i++) {
        double v = value(dt, r, i);
        switch (dt) {
        case ZS_F32: ((float *)d)[i] = (float)v; break;
        case ZS_F64: ((double *)d)[i] = v; break;
        case ZS_I32: ((int32_t *)d)[i] = (int32_t)v; break;
        default: ((int64_t *)d)[i] = (int64_t)v; break;
        }
    }
    return t;
}

static double tol(zs_dtype dt) { return dt == ZS_F32 ? 1e-5 : dt == ZS_F64 ? 1e-12 : 0; }

static void test_allreduce(void)
{
    const zs_dtype dts[] = {ZS_F32, ZS_F64, ZS_I32, ZS_I64};
    const int64_t sizes[] = {1, 7, 1000003};
    zs_comm *w = zs_comm_world();
    for (int a = 0; a < 2; a++)
        for (int d = 0; d < 4; d++)
            for (int s = 0; s < 3; s++) {
                int64_t n = sizes[s];
                zs_tensor *t = filled(dts[d], n, R);
                ZT_CHECK(zs_comm_allreduce(w, t, false, a) == ZS_OK, "allreduce");
                double worst = 0;
                for (int64_t i = 0; i < n; i += (n > 1000 ? 997 : 1)) {
                    double ref = 0;
                    for (int r = 0; r < P; r++)
                        ref += dts[d] == ZS_F32 ? (double)(float)value(dts[d], r, i)
                                                : value(dts[d], r, i);
                    worst = fmax(worst, fabs(zs_get(t, i) - ref) / fmax(1, fabs(ref)));
                }
                ZT_CHECK(worst <= tol(dts[d]), "allreduce %s %s n=%lld: error %g",
                         a ? "ring" : "mpi", zs_dtype_name(dts[d]), (long long)n, worst);
                zs_release(t);
            }
    zs_tensor *t = filled(ZS_F64, 11, R);
    zs_comm_allreduce(w, t, true, ZS_ALLREDUCE_RING);
    double ref = 0;
    for (int r = 0; r < P; r++)
        ref += value(ZS_F64, r, 5);
    ZT_CHECK(fabs(zs_get(t, 5) - ref / P) < 1e-12, "average");
    zs_release(t);
    zt_section("all-reduce (MPI and ring) vs serial reference");
}

static void test_others(void)
{
    zs_comm *w = zs_comm_world();
    int64_t n = 13;
    /* broadcast from the last rank */
    zs_tensor *b = filled(ZS_I64, n, R);
    ZT_CHECK(zs_comm_broadcast(w, b, P - 1) == ZS_OK && zs_get(b, 3) == value(ZS_I64, P - 1, 3),
             "broadcast");
    /* reduce to 0 */
    zs_tensor *rd = filled(ZS_I32, n, R);
    zs_comm_reduce(w, rd, 0);
    double s = 0;
    for (int r = 0; r < P; r++)
        s += value(ZS_I32, r, 4);
    ZT_CHECK(R != 0 || zs_get(rd, 4) == s, "reduce to root");
    /* all-gather */
    zs_tensor *in = filled(ZS_F64, n, R);
    int64_t tot = n * P;
    zs_tensor *all = zs_empty(ZS_F64, 1, &tot);
    ZT_CHECK(zs_comm_allgather(w, in, all) == ZS_OK, "allgather");
    int bad = 0;
    for (int r = 0; r < P; r++)
        for (int64_t i = 0; i < n; i++)
            bad += zs_get(all, r * n + i) != value(ZS_F64, r, i);
    ZT_CHECK(bad == 0, "allgather values (%d wrong)", bad);
    /* reduce-scatter: every rank contributes filled(tot); chunk R summed */
    zs_tensor *big = filled(ZS_I64, tot, R), *mine = zs_empty(ZS_I64, 1, &n);
    ZT_CHECK(zs_comm_reduce_scatter(w, big, mine) == ZS_OK, "reduce_scatter");
    bad = 0;
    for (int64_t i = 0; i < n; i++) {
        double ref = 0;
        for (int r = 0; r < P; r++)
            ref += value(ZS_I64, r, R * n + i);
        bad += zs_get(mine, i) != ref;
    }
    ZT_CHECK(bad == 0, "reduce_scatter values (%d wrong)", bad);
    /* scatter from 0 and gather back to 0 */
    zs_tensor *part = zs_empty(ZS_I64, 1, &n);
    ZT_CHECK(zs_comm_scatter(w, big, part, 0) == ZS_OK &&
             zs_get(part, 2) == value(ZS_I64, 0, R * n + 2), "scatter");
    zs_tensor *back = zs_zeros(ZS_I64, 1, &tot);
    ZT_CHECK(zs_comm_gather(w, part, back, 0) == ZS_OK, "gather");
    ZT_CHECK(R != 0 || zs_get(back, tot - 1) == value(ZS_I64, 0, tot - 1), "gather values");
    /* send/recv around the ring */
    if (P > 1) {
        zs_tensor *got = zs_empty(ZS_I64, 1, &n);
        zs_status st;
        if (R % 2 == 0) {
            st = zs_comm_send(w, b, (R + 1) % P, 5);
            if (st == ZS_OK)
                st = zs_comm_recv(w, got, (R + P - 1) % P, 5);
        } else {
            st = zs_comm_recv(w, got, (R + P - 1) % P, 5);
            if (st == ZS_OK)
                st = zs_comm_send(w, b, (R + 1) % P, 5);
        }
        ZT_CHECK(st == ZS_OK && zs_get(got, 0) == value(ZS_I64, P - 1, 0), "send/recv");
        zs_release(got);
    }
    /* sub-communicators: even and odd ranks */
    zs_comm *sub = zs_comm_split(w, R % 2, R);
    zs_tensor *one = zs_ones(ZS_I32, 1, (int64_t[]){1});
    zs_comm_allreduce(sub, one, false, ZS_ALLREDUCE_RING);
    ZT_CHECK(sub && zs_get(one, 0) == zs_comm_size(sub) && zs_comm_size(sub) == (P + 1 - R % 2) / 2,
             "split: %d ranks in my group", zs_comm_size(sub));
    zs_comm_free(sub);
    zs_tensor *all_t[] = {b, rd, in, all, big, mine, part, back, one};
    for (size_t i = 0; i < sizeof all_t / sizeof *all_t; i++)
        zs_release(all_t[i]);
    zt_section("broadcast, reduce, all-gather, reduce-scatter, scatter, gather, send/recv, split");
}

static void test_errors(void)
{
    zs_comm *w = zs_comm_world();
    zs_tensor *a = zs_zeros(ZS_F32, ZS_SHAPE(5)), *b = zs_zeros(ZS_F32, ZS_SHAPE(5 * P + 1));
    ZT_EXPECT_ERROR(zs_comm_allgather(w, a, b) < 0, "expected the whole");
    ZT_EXPECT_ERROR(zs_comm_broadcast(w, a, P) < 0, "is not a rank");
    zs_tensor *m = zs_zeros(ZS_F32, ZS_SHAPE(4, 4)), *mt = zs_transpose(m, 0, 1);
    ZT_EXPECT_ERROR(zs_comm_allreduce(w, mt, false, ZS_ALLREDUCE_MPI) < 0, "contiguous");
    zs_tensor *u = zs_zeros(ZS_U8, ZS_SHAPE(3));
    ZT_EXPECT_ERROR(zs_comm_allreduce(w, u, false, ZS_ALLREDUCE_RING) < 0, "cannot sum");
    ZT_EXPECT_ERROR(zs_comm_send(w, a, R, 1) < 0, "not another rank");
    zs_tensor *all_t[] = {a, b, m, mt, u};
    for (size_t i = 0; i < sizeof all_t / sizeof *all_t; i++)
        zs_release(all_t[i]);
    zt_section("errors caught before any message");
}

int main(int argc, char **argv)
{
    if (zs_dist_init(&argc, &argv) != ZS_OK) {
        fprintf(stderr, "%s\n", zs_last_error());
        return 1;
    }
    R = zs_comm_rank(zs_comm_world());
    P = zs_comm_size(zs_comm_world());
    printf("rank %d of %d (%s)\n", R, P, zs_dist_is_mpi() ? "MPI" : "single process");
    test_allreduce();
    test_others();
    test_errors();
    int rc = zt_done();
    zs_dist_finalize();
    return rc;
}
