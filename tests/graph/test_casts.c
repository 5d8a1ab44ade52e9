/*
 * test_casts.c - per-use weight casts (zs_graph_split_casts,
 * src/graph/casts.c).
 *
 * - A step in the shape of mixed precision's (one copy_ of a flat f32
 *   buffer into a bf16 / f16 copy, then a linear reading a weight and a
 *   bias there, a layer norm whose weight, a view of its input, is also
 *   an aux result, a transposed matmul reading the same weight, and an
 *   in-place update of the f32 buffer at the end): the pass adds one cast
 *   per read view, removes the flat copy, no node touches the low buffer,
 *   and the replay, planned, gives eager's bits (odd sizes).
 * - Nothing changes when a reader comes after a write of the f32 buffer,
 *   when the low buffer is kept, when only names another buffer; errors:
 *   no graph, a graph being captured, an already planned graph.
 */
#include <stdio.h>
#include <string.h>

#include "graph/internal.h"
#include "testutil.h"
#include "zs/linear.h"

enum { IN = 13, OUT = 7, ROWS = 5 };
/* flat layout: W [OUT, IN], bias [OUT], ln weight [OUT], ln bias [OUT] */
#define NFLAT (OUT * IN + 3 * OUT)

typedef struct step_io {
    zs_tensor *flat, *low, *x, *y; /* y: the kept result */
} step_io;

/* The step; with late_write the f32 buffer is updated before the
 * matmul reads the weight. */
static zs_tensor *run_step(step_io *s, bool late_write)
{
    zs_scope_push();
    ZT_CHECK(zs_copy_(s->low, s->flat) == ZS_OK, "flat cast: %s", zs_last_error());
    zs_tensor *w = zs_reshape(zs_narrow(s->low, 0, 0, OUT * IN), 2, (int64_t[]){OUT, IN});
    zs_tensor *b = zs_narrow(s->low, 0, OUT * IN, OUT);
    zs_tensor *lw = zs_narrow(s->low, 0, OUT * IN + OUT, OUT);
    zs_tensor *lb = zs_narrow(s->low, 0, OUT * IN + 2 * OUT, OUT);
    zs_tensor *h = zs_linear(s->x, w, b);
    zs_tensor *n = zs_layer_norm(h, lw, lb, 1e-5);
    if (late_write)
        ZT_CHECK(zs_scale_(s->flat, 0.5) == ZS_OK, "update: %s", zs_last_error());
    zs_tensor *y = zs_matmul_t(n, w, false, false); /* [ROWS, OUT] x [OUT, IN] */
    if (!late_write)
        ZT_CHECK(zs_scale_(s->flat, 0.5) == ZS_OK, "update: %s", zs_last_error());
    zs_tensor *r = zs_retain(y);
    zs_scope_pop();
    return r;
}

static step_io make_io(zs_dtype dt)
{
    step_io s;
    s.flat = zt_rand(ZS_F32, 1, (int64_t[]){NFLAT}, 5);
    s.low = zs_empty(dt, 1, (int64_t[]){NFLAT});
    zs_tensor *x = zt_rand(ZS_F32, 2, (int64_t[]){ROWS, IN}, 6);
    s.x = zs_to_dtype(x, dt);
    zs_release(x);
    /* recorded calls (an input needs a gradient) keep aux results: the
     * layer norm's weight, a view of the low buffer */
    zs_set_requires_grad(s.x, true);
    s.y = NULL;
    return s;
}

static void free_io(step_io *s)
{
    zs_release(s->flat);
    zs_release(s->low);
    zs_release(s->x);
    zs_release(s->y);
}

static bool touches_low(const zs_graph *g, const zs_storage *low)
{
    for (int i = 0; i < g->n; i++) {
        const zsi_gnode *n = g->nodes[i];
        for (int j = 0; j < n->call.nin; j++)
            if (n->in[j]->storage == low)
                return true;
        for (int k = 0; k < ZSI_MAX_AUX; k++)
            if (n->aux[k] && n->aux[k]->storage == low)
                return true;
    }
    return false;
}

static void check_split(zs_dtype dt)
{
    step_io s = make_io(dt);
    zs_tensor *f0 = zs_clone(s.flat);
    zs_tensor *ref = run_step(&s, false); /* eager */
    ZT_CHECK(zs_copy_(s.flat, f0) == ZS_OK, "reset");
    zs_graph *g = zs_graph_capture_begin();
    s.y = run_step(&s, false);
    ZT_CHECK(zs_graph_capture_end(g) == ZS_OK, "capture: %s", zs_last_error());
    int n0 = zs_graph_size(g);
    int added = zs_graph_split_casts(g, s.low, 1, &s.y);
    /* linear: w, b; layer norm: its weight and bias (the aux weight moves
     * with them); matmul: w again */
    ZT_CHECK(added == 5, "%s: %d casts added, expected 5", zs_dtype_name(dt), added);
    ZT_CHECK(zs_graph_size(g) == n0 + added - 1, "%s: %d nodes after, %d before: the "
             "flat copy not removed", zs_dtype_name(dt), zs_graph_size(g), n0);
    ZT_CHECK(!touches_low(g, s.low->storage), "%s: a node still reads the low buffer",
             zs_dtype_name(dt));
    ZT_CHECK(zs_graph_plan_memory(g, 1, &s.y) == ZS_OK && zs_graph_plan_verify(g) == ZS_OK,
             "%s plan: %s", zs_dtype_name(dt), zs_last_error());
    memset(zs_data(s.low), 0xff, zs_nbytes(s.low)); /* NaNs: must not be read */
    ZT_CHECK(zs_copy_(s.flat, f0) == ZS_OK, "reset");
    ZT_CHECK(zs_graph_replay(g) == ZS_OK, "replay: %s", zs_last_error());
    ZT_CHECK(!memcmp(zs_data(s.y), zs_data(ref), zs_nbytes(ref)), "%s: the replay's "
             "result differs from eager's", zs_dtype_name(dt));
    zs_tensor *f1 = zs_mul_scalar(f0, 0.5);
    ZT_CHECK(!memcmp(zs_data(s.flat), zs_data(f1), zs_nbytes(f1)), "%s: the update",
             zs_dtype_name(dt));
    printf("%s: %d nodes, %d casts added, the flat copy removed; replay == eager\n",
           zs_dtype_name(dt), n0, added);
    ZT_EXPECT_ERROR(zs_graph_split_casts(g, NULL, 1, &s.y) < 0, "already planned");
    zs_graph_free(g);
    zs_release(f1);
    zs_release(f0);
    zs_release(ref);
    free_io(&s);
}

/* A graph the pass must leave alone: late_write (a reader after the f32
 * buffer changes), keep_low (the low buffer read after the replay), other
 * (only names another buffer). */
static void check_unchanged(bool late_write, bool keep_low, bool other, const char *what)
{
    step_io s = make_io(ZS_BF16);
    zs_graph *g = zs_graph_capture_begin();
    s.y = run_step(&s, late_write);
    ZT_CHECK(zs_graph_capture_end(g) == ZS_OK, "capture: %s", zs_last_error());
    int n0 = zs_graph_size(g);
    zs_tensor *keep[2] = {s.y, s.low};
    int added = zs_graph_split_casts(g, other ? s.x : NULL, keep_low ? 2 : 1, keep);
    ZT_CHECK(added == 0 && zs_graph_size(g) == n0, "%s: the pass changed the graph (%d "
             "added)", what, added);
    zs_graph_free(g);
    free_io(&s);
}

int main(void)
{
    zs_manual_seed(3);
    check_split(ZS_BF16);
    check_split(ZS_F16);
    zt_section("split casts: one per read, the flat copy gone, eager's bits (bf16, f16)");

    check_unchanged(true, false, false, "a reader after the f32 update");
    check_unchanged(false, true, false, "the low buffer kept");
    check_unchanged(false, false, true, "only names another buffer");
    ZT_EXPECT_ERROR(zs_graph_split_casts(NULL, NULL, 0, NULL) < 0, "no graph");
    zs_graph *c = zs_graph_capture_begin();
    ZT_EXPECT_ERROR(zs_graph_split_casts(c, NULL, 0, NULL) < 0, "still being captured");
    ZT_CHECK(zs_graph_capture_end(c) == ZS_OK, "end");
    zs_graph_free(c);
    zt_section("split casts: left alone when unsafe; errors");
    return zt_done();
}
