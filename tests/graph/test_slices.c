/*
 * test_slices.c - the slice-gradient pass (zs_graph_fuse_slices,
 * src/graph/slices.c).
 *
 * - GPT tiny (2 layers), in f32 and under bf16 and f16 autocast: a
 *   captured step's q, k, v gradient assembly (3 slice_backward nodes and
 *   2 adds per layer, then a copy) becomes one node per layer (10 nodes
 *   removed); replayed, every parameter's gradient equals eager's bit for
 *   bit, planned or not (eager adds each slice's gradient into the sum so
 *   far in place: the same bits by another path).
 * - Gradients holding -0, NaN, subnormals and infinities gather to
 *   eager's bits in f32, bf16 and f16.
 * - A graph without the pattern is left alone; errors: no graph, a graph
 *   being captured.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "graph/internal.h"
#include "testutil.h"

static const zs_gpt_config GPT2 = {ZS_GPT2, 61, 32, 2, 2, 32};

/* One step's gradients (scope inside) under autocast to lowp (f32: none);
 * *g captures it when given. */
static void step(zs_module *m, zs_tensor *x, zs_tensor *y, zs_dtype lowp, zs_graph **g,
                 zs_tensor **la)
{
    zs_module_zero_grad(m);
    zs_scope_push();
    if (g)
        *g = zs_graph_capture_begin();
    if (lowp != ZS_F32)
        zs_autocast_push(lowp);
    zs_tensor *l = zs_gpt_loss(m, x, y);
    if (lowp != ZS_F32)
        zs_autocast_pop();
    ZT_CHECK(l && zs_backward(l, NULL, false) == ZS_OK, "step: %s", zs_last_error());
    if (g) {
        ZT_CHECK(zs_graph_capture_end(*g) == ZS_OK, "capture: %s", zs_last_error());
        zsi_tracking_pause();
        *la = zsi_new_view(l, l->ndim, l->shape, l->strides, l->offset);
        zsi_tracking_resume();
    }
    zs_scope_pop();
}

/* Bits of every gradient equal to ref's (clones). */
static int diff_grads(int np, zs_tensor **p, zs_tensor **ref)
{
    int bad = 0;
    for (int i = 0; i < np; i++)
        bad += !p[i]->grad || memcmp(zs_data(p[i]->grad), zs_data(ref[i]),
                                     zs_nbytes(ref[i])) != 0;
    return bad;
}

/* The pass on a captured step under lowp against the eager step. */
static void check_pass(zs_module *m, zs_tensor *x, zs_tensor *y, zs_dtype lowp)
{
    zs_tensor **p;
    char **names;
    int np = zs_module_parameters(m, &p, &names);
    step(m, x, y, lowp, NULL, NULL);
    zs_tensor *ref[256];
    ZT_CHECK(np > 0 && np <= 256, "%d parameters", np);
    for (int i = 0; i < np; i++)
        ref[i] = zs_clone(p[i]->grad);
    zs_graph *g = NULL;
    zs_tensor *la = NULL;
    step(m, x, y, lowp, &g, &la);
    int n0 = zs_graph_size(g);
    int removed = zs_graph_fuse_slices(g, 1, &la);
    int gathers = 0;
    for (int i = 0; i < g->n; i++)
        gathers += g->nodes[i]->label && !strcmp(g->nodes[i]->label, "slice_gather");
    printf("gpt tiny %s: %d nodes, the pass removed %d, %d slice_gather nodes\n",
           zs_dtype_name(lowp), n0, removed, gathers);
    ZT_CHECK(removed == 10 && gathers == 2, "%s: removed %d nodes (expected 10: 3 "
             "slice_backward and 2 adds per layer), %d gathers (expected 2)",
             zs_dtype_name(lowp), removed, gathers);
    zs_module_zero_grad(m);
    ZT_CHECK(zs_graph_replay(g) == ZS_OK, "replay: %s", zs_last_error());
    ZT_CHECK(diff_grads(np, p, ref) == 0, "%s unplanned replay: %d gradients differ "
             "from eager", zs_dtype_name(lowp), diff_grads(np, p, ref));
    ZT_CHECK(zs_graph_plan_memory(g, 1, &la) == ZS_OK, "plan: %s", zs_last_error());
    zs_module_zero_grad(m);
    ZT_CHECK(zs_graph_replay(g) == ZS_OK, "planned replay: %s", zs_last_error());
    ZT_CHECK(diff_grads(np, p, ref) == 0, "%s planned replay: %d gradients differ "
             "from eager", zs_dtype_name(lowp), diff_grads(np, p, ref));
    ZT_EXPECT_ERROR(zs_graph_fuse_slices(g, 1, &la) < 0, "already planned");
    for (int i = 0; i < np; i++)
        zs_release(ref[i]);
    zs_names_free(np, p, names);
    zs_graph_free(g);
    zs_release(la);
}

/* One step of sum_k sum(w[k] * narrow(permute(reshape(x)), 0, k, 1)) and
 * its backward, with x the [2, 5, 3 C] output a qkv projection would be;
 * perm GPT's (2, 0, 3, 1, 4), or (2, 0, 3, 4, 1), whose last dim (the
 * position) is strided in x, so the gather writes its rows strided; *g
 * captures it when given. */
static void edge_step(zs_tensor *x, zs_tensor *const *w, const int *perm, zs_graph **g,
                      zs_tensor **la)
{
    zs_zero_grad(x, true);
    zs_scope_push();
    if (g)
        *g = zs_graph_capture_begin();
    zs_tensor *r = zs_reshape(x, 5, (int64_t[]){2, 5, 3, 2, 4});
    zs_tensor *p = zs_permute(r, perm);
    zs_tensor *l = NULL;
    for (int k = 0; k < 3; k++) {
        zs_tensor *s = zs_sum(zs_mul(zs_narrow(p, 0, k, 1), w[k]), 0, NULL, false);
        l = l ? zs_add(l, s) : s;
    }
    ZT_CHECK(l && zs_backward(l, NULL, false) == ZS_OK, "edge step: %s", zs_last_error());
    if (g) {
        ZT_CHECK(zs_graph_capture_end(*g) == ZS_OK, "capture: %s", zs_last_error());
        zsi_tracking_pause();
        *la = zsi_new_view(l, l->ndim, l->shape, l->strides, l->offset);
        zsi_tracking_resume();
    }
    zs_scope_pop();
}

/* The gather's edge values: each slice's gradient is its weight, which
 * holds -0 (the adds make it +0), a quiet NaN, subnormals and infinities;
 * the replay's gradient of x is eager's, bit for bit. x's gradient is set
 * to none before each step, so the gathered buffer becomes it (adding into
 * a zeroed one would turn -0 into +0 either way). */
static void check_edges(zs_dtype dt, const int *perm)
{
    zs_tensor *x = zt_rand(dt, 3, (int64_t[]){2, 5, 24}, 31), *w[3];
    zs_set_requires_grad(x, true);
    const int64_t full[5] = {2, 5, 3, 2, 4}; /* reshape(x)'s shape */
    int64_t ws[5] = {1};
    for (int d = 1; d < 5; d++)
        ws[d] = full[perm[d]];
    for (int k = 0; k < 3; k++) {
        zs_tensor *f = zt_rand(ZS_F32, 5, ws, 40 + (uint64_t)k);
        float *v = zs_data(f);
        const float edge[] = {-0.0f, NAN, dt == ZS_F16 ? 3e-6f : 1e-39f,
                              dt == ZS_F16 ? -3e-6f : -1e-39f, INFINITY, -INFINITY};
        for (int i = 0; i < 6; i++)
            v[7 * i + 3 * k] = edge[i];
        w[k] = zs_to_dtype(f, dt);
        zs_release(f);
    }
    edge_step(x, w, perm, NULL, NULL);
    zs_tensor *ref = zs_clone(x->grad);
    zs_graph *g = NULL;
    zs_tensor *la = NULL;
    edge_step(x, w, perm, &g, &la);
    int removed = zs_graph_fuse_slices(g, 1, &la);
    ZT_CHECK(removed == 5, "%s edges, last dim %d: removed %d nodes (expected 5)",
             zs_dtype_name(dt), perm[4], removed);
    ZT_CHECK(zs_graph_plan_memory(g, 1, &la) == ZS_OK, "plan: %s", zs_last_error());
    ZT_CHECK(zs_graph_replay(g) == ZS_OK, "replay: %s", zs_last_error());
    ZT_CHECK(x->grad && !memcmp(zs_data(x->grad), zs_data(ref), zs_nbytes(ref)),
             "%s edges, last dim %d: the gathered gradient differs from eager's",
             zs_dtype_name(dt), perm[4]);
    zs_graph_free(g);
    zs_release(la);
    zs_release(ref);
    for (int k = 0; k < 3; k++)
        zs_release(w[k]);
    zs_release(x);
}

int main(void)
{
    zs_manual_seed(9);
    zs_module *m = zs_gpt_new(&GPT2, 4);
    int64_t ids[3 * 33];
    for (int i = 0; i < 3 * 33; i++)
        ids[i] = (11 * i + i / 7) % 61;
    zs_tensor *all = zs_from_data(ZS_I64, ZS_SHAPE(3, 33), ids);
    zs_tensor *xv = zs_narrow(all, 1, 0, 32), *yv = zs_narrow(all, 1, 1, 32);
    zs_tensor *x = zs_contiguous(xv), *y = zs_contiguous(yv);
    zs_release(xv);
    zs_release(yv);
    const zs_dtype dts[] = {ZS_F32, ZS_BF16, ZS_F16};
    for (int k = 0; k < 3; k++)
        check_pass(m, x, y, dts[k]);
    zt_section("slice gradients: one node per layer, eager's bits (f32, bf16, f16)");
    static const int gpt_perm[5] = {2, 0, 3, 1, 4}, strided[5] = {2, 0, 3, 4, 1};
    for (int k = 0; k < 3; k++) {
        check_edges(dts[k], gpt_perm);
        check_edges(dts[k], strided);
    }
    zt_section("slice gradients: -0, NaN, subnormals, infinities (f32, bf16, f16; "
               "contiguous and strided rows)");

    ZT_EXPECT_ERROR(zs_graph_fuse_slices(NULL, 0, NULL) < 0, "no graph");
    zs_graph *c = zs_graph_capture_begin();
    ZT_EXPECT_ERROR(zs_graph_fuse_slices(c, 0, NULL) < 0, "still being captured");
    zs_tensor *a = zt_rand(ZS_F32, 2, (int64_t[]){5, 7}, 3);
    zs_tensor *b = zs_add(a, a);
    ZT_CHECK(zs_graph_capture_end(c) == ZS_OK, "end");
    ZT_CHECK(zs_graph_fuse_slices(c, 1, &b) == 0 && zs_graph_size(c) == 1,
             "no pattern: nothing removed");
    zs_graph_free(c);
    zs_release(b);
    zs_release(a);
    zt_section("slice gradients: no pattern, errors");

    zs_release(x);
    zs_release(y);
    zs_release(all);
    zs_module_free(m);
    return zt_done();
}
