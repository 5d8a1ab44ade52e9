/*
 * test_fuse.c - the pointwise fusion pass (zs_graph_fuse, graph/fuse.c).
 *
 * - A group (a DAG: one producer read by two members) on odd sizes, one
 *   smaller than a tile and one of many tiles (run by the pool), in f32
 *   and bf16, with a strided input (its reader is left out): the fused
 *   replay equals an eager run on fresh inputs bit for bit, its node
 *   count and label are checked, and its intermediates leave the arena.
 * - Left out, with the graph still right: a broadcast operand (a bias
 *   row), a member result read outside the group before its end, an
 *   in-place write between members to a member's input. A result read
 *   after the group is kept in its buffer.
 * - Errors: no graph, a graph being captured, a planned graph.
 */
#include <stdio.h>
#include <string.h>

#include "graph/internal.h"
#include "testutil.h"

static bool same_bits(const zs_tensor *a, const zs_tensor *b)
{
    return a && b && zs_nbytes(a) == zs_nbytes(b) &&
           !memcmp(zs_data(a), zs_data(b), zs_nbytes(a));
}

/* e = sigmoid((tanh(x) * 1.5) * y + tanh(x)); a = tanh(x) read twice. */
static zs_tensor *chain(zs_tensor *x, zs_tensor *y)
{
    zs_tensor *a = zs_tanh(x);
    zs_tensor *b = zs_mul_scalar(a, 1.5);
    zs_tensor *c = zs_mul(b, y);
    zs_tensor *d = zs_add(c, a);
    return zs_sigmoid(d);
}

static void check_chain(zs_dtype dt, int64_t rows, int64_t cols, bool strided)
{
    zs_scope_push();
    int64_t shape[2] = {rows, cols};
    zs_tensor *x = strided ? zt_rand_strided(dt, 2, shape, 11)
                           : zt_rand(dt, 2, shape, 11);
    zs_tensor *y = zt_rand(dt, 2, shape, 12);
    zs_graph *g = zs_graph_capture_begin();
    zs_tensor *e = chain(x, y);
    ZT_CHECK(zs_graph_capture_end(g) == ZS_OK && e, "capture: %s", zs_last_error());
    zs_graph_stats s0, s1;
    zs_graph_get_stats(g, &s0);
    int removed = zs_graph_fuse(g, 1, &e);
    zs_graph_get_stats(g, &s1);
    /* strided x: tanh reads a non-contiguous view and stays alone */
    int want = strided ? 3 : 4;
    ZT_CHECK(removed == want && zs_graph_size(g) == 5 - want, "%s [%lld, %lld]%s: "
             "%d nodes folded (want %d), %d left", zs_dtype_name(dt), (long long)rows,
             (long long)cols, strided ? " strided" : "", removed, want,
             zs_graph_size(g));
    zsi_gnode *last = g->nodes[g->n - 1];
    ZT_CHECK(last->label && !strcmp(last->label, strided ?
             "fused(mul_scalar+mul+add+sigmoid)" : "fused(tanh+mul_scalar+mul+add+sigmoid)"),
             "label %s", last->label ? last->label : "(none)");
    ZT_CHECK(s1.flops == s0.flops, "fusion keeps the FLOPs (%.0f vs %.0f)", s1.flops,
             s0.flops);
    ZT_CHECK(s1.intermediate_bytes < s0.intermediate_bytes, "the intermediates leave "
             "(%zu -> %zu bytes)", s0.intermediate_bytes, s1.intermediate_bytes);
    ZT_CHECK(zs_graph_plan_memory(g, 1, &e) == ZS_OK, "plan after fusion: %s",
             zs_last_error());
    for (int rep = 0; rep < 2; rep++) { /* fresh inputs each replay */
        zs_tensor *x2 = zt_rand(dt, 2, shape, 20 + (uint64_t)rep);
        zs_tensor *y2 = zt_rand(dt, 2, shape, 30 + (uint64_t)rep);
        zs_copy_(x, x2);
        zs_copy_(y, y2);
        ZT_CHECK(zs_graph_replay(g) == ZS_OK, "replay: %s", zs_last_error());
        zs_tensor *ref = chain(x2, y2);
        ZT_CHECK(same_bits(e, ref), "%s [%lld, %lld]%s: the fused replay equals the "
                 "unfused chain bit for bit (replay %d)", zs_dtype_name(dt),
                 (long long)rows, (long long)cols, strided ? " strided" : "", rep);
    }
    zs_graph_free(g);
    zs_scope_pop();
}

static void test_chains(void)
{
    check_chain(ZS_F32, 37, 53, false);      /* under one tile */
    check_chain(ZS_F32, 3, 12345, false);    /* many tiles, the pool, a tail */
    check_chain(ZS_F32, 29, 31, true);       /* a strided input */
    check_chain(ZS_BF16, 41, 17, false);
    check_chain(ZS_BF16, 5, 9999, false);
    zt_section("fused groups equal the unfused chain bit for bit");
}

/* Captures body(x, y, &out, &side) once, fuses keeping out (and side),
 * replays on fresh inputs and compares with an eager run. Returns the
 * number of nodes folded. */
typedef void (*body_fn)(zs_tensor *x, zs_tensor *y, zs_tensor **out, zs_tensor **side);

static int fuse_and_compare(const char *name, body_fn body, int64_t rows, int64_t cols)
{
    int64_t shape[2] = {rows, cols};
    zs_scope_push();
    zs_tensor *x = zt_rand(ZS_F32, 2, shape, 41), *y = zt_rand(ZS_F32, 2, shape, 42);
    zs_tensor *x0 = zs_clone(x), *y0 = zs_clone(y);
    zs_tensor *out = NULL, *side = NULL;
    zs_graph *g = zs_graph_capture_begin();
    body(x, y, &out, &side);
    ZT_CHECK(zs_graph_capture_end(g) == ZS_OK && out, "%s: capture", name);
    zs_tensor *keep[2] = {out, side};
    int removed = zs_graph_fuse(g, side ? 2 : 1, keep);
    ZT_CHECK(removed >= 0, "%s: fuse: %s", name, zs_last_error());
    ZT_CHECK(zs_graph_plan_memory(g, side ? 2 : 1, keep) == ZS_OK, "%s: plan", name);
    /* replay from the captured inputs' starting values: eager on copies */
    zs_copy_(x, x0);
    zs_copy_(y, y0);
    ZT_CHECK(zs_graph_replay(g) == ZS_OK, "%s: replay: %s", name, zs_last_error());
    zs_tensor *ro = NULL, *rs = NULL;
    body(x0, y0, &ro, &rs);
    ZT_CHECK(same_bits(out, ro), "%s: the result equals eager", name);
    ZT_CHECK(!side || same_bits(side, rs), "%s: the side result equals eager", name);
    ZT_CHECK(same_bits(x, x0) && same_bits(y, y0), "%s: in-place effects equal", name);
    zs_graph_free(g);
    zs_scope_pop();
    return removed;
}

/* h = tanh(x) * 2 + bias: the broadcast add stays out */
static void body_bias(zs_tensor *x, zs_tensor *y, zs_tensor **out, zs_tensor **side)
{
    zs_tensor *bias = zs_narrow(zs_reshape(y, 1, (int64_t[]){zs_numel(y)}), 0, 0,
                                x->shape[1]);
    *out = zs_add(zs_mul_scalar(zs_tanh(x), 2.0), bias);
    *side = NULL;
}

/* a = tanh(x); s = sum(a) between; b = a * 2: a is read before b */
static void body_early(zs_tensor *x, zs_tensor *y, zs_tensor **out, zs_tensor **side)
{
    (void)y;
    zs_tensor *a = zs_tanh(x);
    *side = zs_sum(a, 0, NULL, false);
    *out = zs_mul_scalar(a, 2.0);
}

/* a = tanh(x); b = a * 2; then sum(a): a is kept in its buffer */
static void body_late(zs_tensor *x, zs_tensor *y, zs_tensor **out, zs_tensor **side)
{
    (void)y;
    zs_tensor *a = zs_tanh(x);
    *out = zs_mul_scalar(a, 2.0);
    *side = zs_sum(a, 0, NULL, false);
}

/* a = tanh(x); x += y (in place) ; b = a * 2 + x: tanh may not move past
 * the write of its input */
static void body_write(zs_tensor *x, zs_tensor *y, zs_tensor **out, zs_tensor **side)
{
    zs_tensor *a = zs_tanh(x);
    zs_axpy_(x, 1.0, y);
    *out = zs_add(zs_mul_scalar(a, 2.0), x);
    *side = NULL;
}

static void test_left_out(void)
{
    int r = fuse_and_compare("broadcast bias", body_bias, 19, 23);
    ZT_CHECK(r == 1, "broadcast: tanh and mul_scalar fuse, the bias add stays "
             "(%d folded)", r);
    r = fuse_and_compare("read before the group ends", body_early, 17, 29);
    ZT_CHECK(r == 0, "a result read outside before the group's end: no fusion "
             "(%d folded)", r);
    r = fuse_and_compare("read after the group", body_late, 17, 29);
    ZT_CHECK(r == 1, "a result read after the group: fused, kept (%d folded)", r);
    r = fuse_and_compare("in-place write between", body_write, 13, 27);
    ZT_CHECK(r == 1, "a write to a member's input between: tanh stays, mul_scalar "
             "and add fuse (%d folded)", r);
    zt_section("left out: broadcast, early readers, writes between");
}

static void test_errors(void)
{
    ZT_EXPECT_ERROR(zs_graph_fuse(NULL, 0, NULL) < 0, "no graph");
    zs_scope_push();
    zs_tensor *x = zt_rand(ZS_F32, 1, (int64_t[]){9}, 1);
    zs_graph *g = zs_graph_capture_begin();
    zs_tensor *y = zs_exp(zs_tanh(x));
    ZT_EXPECT_ERROR(zs_graph_fuse(g, 1, &y) < 0, "still being captured");
    ZT_CHECK(zs_graph_capture_end(g) == ZS_OK, "end");
    ZT_EXPECT_ERROR(zs_graph_fuse(g, 1, NULL) < 0, "keep is NULL");
    ZT_CHECK(zs_graph_plan_memory(g, 1, &y) == ZS_OK, "plan");
    ZT_EXPECT_ERROR(zs_graph_fuse(g, 1, &y) < 0, "already planned");
    zs_graph_free(g);
    zs_scope_pop();
    zt_section("errors");
}

int main(void)
{
    test_chains();
    test_left_out();
    test_errors();
    return zt_done();
}
