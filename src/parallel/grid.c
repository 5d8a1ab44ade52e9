/*
 * grid.c - the dp x tp x pp process grid (contract in zs/tp.h): pure
 * functions from world rank to coordinates and groups, the layout in
 * words, and zs_grid_new, which cuts the world into the three groups with
 * zs_comm_split.
 *
 * Order (Megatron-LM's): rank = tp + tp (dp + dp_size pp). A group along
 * one axis holds the ranks that agree on the two other coordinates; its
 * ranks are ordered by the axis' coordinate, which is then the rank in
 * the group's communicator. Each group's color for the split is its
 * lowest world rank (the member whose coordinate on the axis is 0).
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parallel/internal.h"
#include "zs/tp.h"

static const char *axis_name[3] = {"dp", "tp", "pp"};

zs_status zs_grid_dims_check(int world, zs_grid_dims *d)
{
    if (!d)
        return zs_set_error("grid: no sizes");
    if (world < 1 || d->tp < 1 || d->pp < 1 || d->dp < 0)
        return zs_set_error("grid: dp %d x tp %d x pp %d over %d ranks: expected "
                            "tp, pp >= 1, dp >= 0 (0: the rest) and a world >= 1",
                            d->dp, d->tp, d->pp, world);
    int64_t tpp = (int64_t)d->tp * d->pp;
    if (d->dp == 0) {
        if (world % tpp != 0)
            return zs_set_error("grid: tp %d x pp %d = %lld does not divide the "
                                "world of %d ranks", d->tp, d->pp, (long long)tpp,
                                world);
        d->dp = (int)(world / tpp);
    }
    if (tpp * d->dp != world)
        return zs_set_error("grid: dp %d x tp %d x pp %d = %lld ranks, but the "
                            "world has %d", d->dp, d->tp, d->pp,
                            (long long)(tpp * d->dp), world);
    return ZS_OK;
}

zs_grid_dims zs_grid_coords(zs_grid_dims d, int rank)
{
    zs_grid_dims c;
    c.tp = rank % d.tp;
    c.dp = (rank / d.tp) % d.dp;
    c.pp = rank / (d.tp * d.dp);
    return c;
}

int zs_grid_rank(zs_grid_dims d, zs_grid_dims c)
{
    return c.tp + d.tp * (c.dp + d.dp * c.pp);
}

static int *axis_of(zs_grid_dims *d, zs_grid_axis a)
{
    return a == ZS_GRID_DP ? &d->dp : a == ZS_GRID_TP ? &d->tp : &d->pp;
}

int zs_grid_group(zs_grid_dims d, zs_grid_axis a, int rank, int *out)
{
    zs_grid_dims c = zs_grid_coords(d, rank);
    int n = *axis_of(&d, a);
    for (int i = 0; i < n; i++) {
        *axis_of(&c, a) = i;
        out[i] = zs_grid_rank(d, c);
    }
    return n;
}

/* A growing malloc'd string. */
typedef struct text {
    char *s;
    size_t len, cap;
    bool ok;
} text;

/* Appends printf-style text; on allocation failure t->ok becomes false. */
static void add(text *t, const char *fmt, ...)
{
    if (!t->ok)
        return;
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (t->len + (size_t)k + 1 > t->cap) {
        size_t ncap = (t->cap + (size_t)k + 1) * 2;
        char *ns = realloc(t->s, ncap);
        if (!ns) {
            t->ok = false;
            return;
        }
        t->s = ns;
        t->cap = ncap;
    }
    va_start(ap, fmt);
    vsnprintf(t->s + t->len, (size_t)k + 1, fmt, ap);
    va_end(ap);
    t->len += (size_t)k;
}

char *zs_grid_layout(zs_grid_dims d)
{
    int world = d.dp * d.tp * d.pp;
    if (d.dp < 1 || world < 1 || zs_grid_dims_check(world, &d) != ZS_OK) {
        zs_set_error("grid layout: dp %d x tp %d x pp %d: expected sizes >= 1",
                     d.dp, d.tp, d.pp);
        return NULL;
    }
    text t = {.ok = true};
    int *grp = malloc((size_t)world * sizeof *grp);
    t.ok = grp != NULL;
    add(&t, "grid dp %d x tp %d x pp %d over %d ranks (tp fastest, pp slowest)\n",
        d.dp, d.tp, d.pp, world);
    static const zs_grid_axis order[3] = {ZS_GRID_TP, ZS_GRID_DP, ZS_GRID_PP};
    for (int k = 0; k < 3; k++) {
        zs_grid_axis a = order[k];
        add(&t, "  %s groups:", axis_name[a]);
        for (int r = 0; t.ok && r < world; r++) {
            zs_grid_dims c = zs_grid_coords(d, r);
            if (*axis_of(&c, a) != 0)
                continue;
            int n = zs_grid_group(d, a, r, grp);
            for (int i = 0; i < n; i++)
                add(&t, i ? " %d" : " [%d", grp[i]);
            add(&t, "]");
        }
        add(&t, "\n");
    }
    free(grp);
    if (!t.ok) {
        free(t.s);
        zs_set_error_code(ZS_ERR_NOMEM, "grid layout: out of memory");
        return NULL;
    }
    return t.s;
}

zs_grid *zs_grid_new(zs_comm *world, int dp, int tp, int pp)
{
    if (zsi_check_comm("grid", world) != ZS_OK)
        return NULL;
    zs_grid_dims d = {dp, tp, pp};
    if (zs_grid_dims_check(zs_comm_size(world), &d) != ZS_OK)
        return NULL;
    zs_grid *g = calloc(1, sizeof *g);
    if (!g) {
        zs_set_error_code(ZS_ERR_NOMEM, "grid: out of memory");
        return NULL;
    }
    g->world = world;
    g->dims = d;
    g->rank = zs_comm_rank(world);
    g->me = zs_grid_coords(d, g->rank);
    zs_comm **slot[3] = {&g->dp, &g->tp, &g->pp};
    /* Every rank runs all three splits (collective), even after a failure,
     * so that none is left waiting. */
    zs_status st = ZS_OK;
    for (int a = 0; a < 3; a++) {
        zs_grid_dims c = g->me;
        int key = *axis_of(&c, (zs_grid_axis)a);
        *axis_of(&c, (zs_grid_axis)a) = 0;
        *slot[a] = zs_comm_split(world, zs_grid_rank(d, c), key);
        if (!*slot[a] && st == ZS_OK)
            st = ZS_ERR_STATE;
    }
    if (st != ZS_OK) {
        zs_grid_free(g);
        return NULL;
    }
    return g;
}

void zs_grid_free(zs_grid *g)
{
    if (!g)
        return;
    zs_comm_free(g->dp);
    zs_comm_free(g->tp);
    zs_comm_free(g->pp);
    free(g);
}
