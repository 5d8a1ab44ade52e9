/*
 * test_grid.c - the dp x tp x pp process grid (src/parallel/grid.c): the
 * pure layout (the 8-rank dp 2 x tp 2 x pp 2 layout word for word,
 * coordinates and back for other shapes, every rank in exactly one group
 * per axis, the size errors) and, at whatever size the program is started
 * with (plainly, and by ctest under mpirun with 2 and 4 ranks), the
 * communicators zs_grid_new makes: sizes, ranks equal to the coordinates,
 * and members (all-gathered world ranks) equal to the pure layout's.
 */
#include <stdlib.h>

#include "testutil.h"

static void test_layout_8(void)
{
    zs_grid_dims d = {2, 2, 2};
    char *s = zs_grid_layout(d);
    const char *want = "grid dp 2 x tp 2 x pp 2 over 8 ranks (tp fastest, pp slowest)\n"
                       "  tp groups: [0 1] [2 3] [4 5] [6 7]\n"
                       "  dp groups: [0 2] [1 3] [4 6] [5 7]\n"
                       "  pp groups: [0 4] [1 5] [2 6] [3 7]\n";
    ZT_CHECK(s && !strcmp(s, want), "layout of dp2 tp2 pp2:\n%s", s ? s : "(null)");
    free(s);
    zs_grid_dims c = zs_grid_coords(d, 5);
    ZT_CHECK(c.tp == 1 && c.dp == 0 && c.pp == 1, "rank 5 = tp 1 dp 0 pp 1");
    c = zs_grid_coords(d, 6);
    ZT_CHECK(c.tp == 0 && c.dp == 1 && c.pp == 1, "rank 6 = tp 0 dp 1 pp 1");
    int g[2];
    ZT_CHECK(zs_grid_group(d, ZS_GRID_PP, 3, g) == 2 && g[0] == 3 && g[1] == 7,
             "pp group of rank 3: [3 7]");
    ZT_CHECK(zs_grid_group(d, ZS_GRID_DP, 5, g) == 2 && g[0] == 5 && g[1] == 7,
             "dp group of rank 5: [5 7]");
    zt_section("grid layout dp 2 x tp 2 x pp 2 (8 ranks)");
}

/* Round trips and group membership for several shapes. */
static void test_layout_shapes(void)
{
    static const zs_grid_dims shapes[] = {{3, 2, 4}, {1, 8, 1}, {4, 1, 3}, {2, 3, 1}, {1, 1, 1}};
    for (size_t k = 0; k < sizeof shapes / sizeof *shapes; k++) {
        zs_grid_dims d = shapes[k];
        int n = d.dp * d.tp * d.pp;
        int *seen = calloc((size_t)n * 3, sizeof *seen), *grp = malloc((size_t)n * sizeof *grp);
        bool ok = true;
        for (int r = 0; r < n; r++) {
            zs_grid_dims c = zs_grid_coords(d, r);
            ok = ok && zs_grid_rank(d, c) == r && c.tp < d.tp && c.dp < d.dp && c.pp < d.pp;
            ok = ok && (r % d.tp == c.tp); /* tp fastest */
            for (int a = 0; a < 3; a++) {
                int m = zs_grid_group(d, (zs_grid_axis)a, r, grp);
                bool in = false;
                for (int i = 0; i < m; i++) {
                    in = in || grp[i] == r;
                    seen[grp[i] * 3 + a] += (grp[i] == r);
                    zs_grid_dims gi = zs_grid_coords(d, grp[i]);
                    int ci = a == 0 ? gi.dp : a == 1 ? gi.tp : gi.pp;
                    ok = ok && ci == i; /* ordered by the axis' coordinate */
                }
                ok = ok && in;
            }
        }
        for (int i = 0; i < n * 3; i++)
            ok = ok && seen[i] == 1;
        ZT_CHECK(ok, "grid dp %d tp %d pp %d: round trips and groups", d.dp, d.tp, d.pp);
        free(seen);
        free(grp);
    }
    zs_grid_dims d = {0, 2, 2};
    ZT_CHECK(zs_grid_dims_check(8, &d) == ZS_OK && d.dp == 2, "dp 0 is the rest of the world");
    d = (zs_grid_dims){0, 3, 1};
    ZT_EXPECT_ERROR(zs_grid_dims_check(8, &d) < 0, "does not divide the world of 8");
    d = (zs_grid_dims){2, 2, 1};
    ZT_EXPECT_ERROR(zs_grid_dims_check(8, &d) < 0, "but the world has 8");
    d = (zs_grid_dims){1, 0, 1};
    ZT_EXPECT_ERROR(zs_grid_dims_check(8, &d) < 0, "expected tp, pp >= 1");
    ZT_EXPECT_ERROR(zs_grid_layout((zs_grid_dims){0, 2, 2}) == NULL, "expected sizes >= 1");
    zt_section("grid layouts: round trips, one group per axis, size errors");
}

/* The communicators of one layout: sizes, ranks, members. */
static void check_grid(zs_comm *world, int tp, int pp)
{
    int W = zs_comm_size(world), me = zs_comm_rank(world);
    zs_grid *g = zs_grid_new(world, 0, tp, pp);
    ZT_CHECK(g != NULL, "grid tp %d pp %d over %d ranks", tp, pp, W);
    if (!g)
        return;
    zs_comm *cs[3] = {g->dp, g->tp, g->pp};
    int sizes[3] = {g->dims.dp, g->dims.tp, g->dims.pp};
    int coord[3] = {g->me.dp, g->me.tp, g->me.pp};
    for (int a = 0; a < 3; a++) {
        ZT_CHECK(zs_comm_size(cs[a]) == sizes[a] && zs_comm_rank(cs[a]) == coord[a],
                 "axis %d: size %d rank %d", a, zs_comm_size(cs[a]), zs_comm_rank(cs[a]));
        int want[64];
        zs_grid_group(g->dims, (zs_grid_axis)a, me, want);
        zs_tensor *mine = zs_full(ZS_I32, 1, (int64_t[]){1}, me);
        zs_tensor *all = zs_zeros(ZS_I32, 1, (int64_t[]){sizes[a]});
        ZT_CHECK(zs_comm_allgather(cs[a], mine, all) == ZS_OK, "allgather in group");
        bool ok = true;
        for (int i = 0; i < sizes[a]; i++)
            ok = ok && (int)zs_get(all, i) == want[i];
        ZT_CHECK(ok, "axis %d group of rank %d has the layout's members", a, me);
        zs_release(mine);
        zs_release(all);
    }
    zs_grid_free(g);
}

static void test_comms(zs_comm *world)
{
    int W = zs_comm_size(world);
    for (int tp = 1; tp <= W; tp *= 2)
        for (int pp = 1; tp * pp <= W; pp *= 2)
            check_grid(world, tp, pp);
    if (W == 1)
        check_grid(world, 1, 1);
    ZT_EXPECT_ERROR(zs_grid_new(world, 0, 3 * W, 1) == NULL, "does not divide");
    ZT_EXPECT_ERROR(zs_grid_new(world, 2 * W, 1, 1) == NULL, "but the world has");
    ZT_EXPECT_ERROR(zs_grid_new(NULL, 1, 1, 1) == NULL, "NULL communicator");
    zt_section("grid communicators: sizes, ranks, members");
}

int main(int argc, char **argv)
{
    int rank, size;
    zt_dist_start(&argc, &argv, &rank, &size);
    zs_comm_set_timeout(zs_comm_world(), 120);
    test_layout_8();
    test_layout_shapes();
    test_comms(zs_comm_world());
    if (rank == 0) {
        zs_grid_dims d = {0, size >= 2 ? 2 : 1, 1};
        zs_grid_dims_check(size, &d);
        char *s = zs_grid_layout(d);
        printf("%s", s ? s : "");
        free(s);
    }
    return zt_dist_done();
}
