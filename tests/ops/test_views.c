/*
 * test_views.c - src/ops/views.c as descriptors: slice_backward run
 * directly and through autograd against a float64 scatter reference
 * (negative starts, steps 1-3, empty slices, strided gradients, every
 * dim), its error path; replay of every view and copy from the typed
 * attributes its node holds (values, not pointers: the caller's shape and
 * order arrays are overwritten before the replay); a backward hook whose
 * function and context live in the node. Copies are exact: tolerance 0.
 */
#include <stdlib.h>

#include "ops/op.h"
#include "testutil.h"

/* The attributes of slice_backward (ops/views.c). */
typedef struct slice_bw_attrs {
    int64_t ndim, shape[ZS_MAX_DIMS];
    int64_t dim, start, step;
} slice_bw_attrs;

/* ref[] (row-major over shape) = zeros with g scattered at positions
 * start + i*step of dim d. */
static void scatter_ref(const zs_tensor *g, int ndim, const int64_t *shape,
                        int d, int64_t start, int64_t step, double *ref)
{
    int64_t n = 1;
    for (int k = 0; k < ndim; k++)
        n *= shape[k];
    for (int64_t i = 0; i < n; i++)
        ref[i] = 0;
    for (int64_t j = 0; j < zs_numel(g); j++) {
        int64_t rem = j, idx = 0, mul = 1, c[ZS_MAX_DIMS];
        for (int k = ndim - 1; k >= 0; k--) {
            c[k] = rem % g->shape[k];
            rem /= g->shape[k];
        }
        c[d] = start + c[d] * step;
        for (int k = ndim - 1; k >= 0; k--) {
            idx += c[k] * mul;
            mul *= shape[k];
        }
        ref[idx] = zs_get(g, j);
    }
}

static void test_slice_backward(void)
{
    int cases = 0;
    for (uint64_t seed = 1; seed <= 40; seed++) {
        zt_irand_seed(seed);
        int ndim = (int)zt_irand(1, 4);
        int64_t shape[ZS_MAX_DIMS], n = 1;
        for (int k = 0; k < ndim; k++)
            n *= shape[k] = zt_irand(1, 7);
        int d = (int)zt_irand(0, ndim - 1);
        int64_t start = zt_irand(-shape[d], shape[d]), end = zt_irand(-2, shape[d] + 2);
        int64_t step = zt_irand(1, 3);
        zs_dtype dt = seed % 2 ? ZS_F64 : ZS_F32;
        zs_tensor *x = zt_rand(dt, ndim, shape, seed);
        zs_set_requires_grad(x, true);
        zs_tensor *y = zs_slice(x, d - (seed % 3 == 0 ? ndim : 0), start, end, step);
        /* upstream gradient: strided for a third of the cases */
        zs_tensor *g = y ? (seed % 3 == 1 ? zt_rand_strided(dt, y->ndim, y->shape, seed + 9)
                                          : zt_rand(dt, y->ndim, y->shape, seed + 9))
                         : NULL;
        int64_t s0 = start < 0 ? start + shape[d] : start;
        s0 = s0 < 0 ? 0 : s0 > shape[d] ? shape[d] : s0;
        double *ref = malloc((size_t)n * sizeof *ref);
        if (g)
            scatter_ref(g, ndim, shape, d, s0, step, ref);
        /* through autograd */
        bool ok = g && zs_backward(y, g, false) == ZS_OK;
        double e1 = ok ? zt_max_err(zs_grad(x), ref, n) : -1;
        /* directly */
        slice_bw_attrs at = {.ndim = ndim, .dim = d, .start = s0, .step = step};
        memcpy(at.shape, shape, sizeof shape);
        zs_tensor *gx = g ? zsi_run(zsi_opdef_find("slice_backward"), 1, &g, &at) : NULL;
        double e2 = gx ? zt_max_err(gx, ref, n) : -1;
        ZT_CHECK(e1 == 0 && e2 == 0 && zt_shape_is(gx, ndim, shape) && gx->dtype == dt,
                 "slice_backward (seed %llu): dim %d of %lld, [%lld, %lld) step "
                 "%lld: autograd err %g, direct err %g", (unsigned long long)seed,
                 d, (long long)shape[d], (long long)start, (long long)end,
                 (long long)step, e1, e2);
        free(ref);
        zs_release(gx);
        zs_release(g);
        zs_release(y);
        zs_release(x);
        cases++;
    }
    printf("slice_backward: %d random slices (f32, f64), autograd and direct, exact\n",
           cases);
    /* error: the gradient does not fit the slice */
    zs_tensor *g = zs_ones(ZS_F32, ZS_SHAPE(2, 3));
    slice_bw_attrs bad = {.ndim = 2, .shape = {2, 4}, .dim = 1, .start = 2, .step = 1};
    ZT_EXPECT_ERROR(zsi_run(zsi_opdef_find("slice_backward"), 1, &g, &bad) == NULL,
                    "slice_backward: gradient [2, 3] does not fit input [2, 4]");
    bad.start = 0;
    bad.shape[0] = 3;
    ZT_EXPECT_ERROR(zsi_run(zsi_opdef_find("slice_backward"), 1, &g, &bad) == NULL,
                    "does not fit");
    zs_release(g);
    ZT_CHECK(zs_autograd_live_nodes() == 0, "tape freed");
}

/* ---- replay ------------------------------------------------------------ */

/* Runs node's descriptor again on in with the node's attributes (grad
 * mode off); true when the result equals out: same shape and strides, and
 * for views the same storage and offset, for copies the same bytes. */
static bool replays(const zs_tensor *out, zs_tensor *in)
{
    const zsi_ctx *n = zsi_ctx_of(out);
    if (!n)
        return false;
    const zsi_opdef *def = (const zsi_opdef *)n->op;
    zs_no_grad_push();
    zs_tensor *r = zsi_run((zsi_opdef *)def, 1, &in, zsi_node_attrs(n));
    zs_no_grad_pop();
    bool same = r && r->dtype == out->dtype && r->ndim == out->ndim &&
                !memcmp(r->shape, out->shape, (size_t)out->ndim * sizeof *r->shape);
    if (same && def->view)
        same = r->storage == out->storage && r->offset == out->offset &&
               !memcmp(r->strides, out->strides, (size_t)out->ndim * sizeof *r->strides);
    else if (same)
        same = !memcmp(zs_data(r), zs_data(out), zs_nbytes(out));
    zs_release(r);
    return same;
}

typedef struct hook_log {
    int calls;
    int64_t arg;
} hook_log;

static zs_status on_backward(void *ctx, int64_t arg)
{
    hook_log *h = ctx;
    h->calls++;
    h->arg = arg;
    return ZS_OK;
}

static void test_replay(void)
{
    zs_tensor *x = zt_rand(ZS_F32, ZS_SHAPE(4, 1, 6), 5);
    zs_set_requires_grad(x, true);
    int64_t shape[3] = {6, -1, 2};
    int order[3] = {2, 0, 1};
    int64_t eshape[4] = {3, 4, 5, 6};
    hook_log h = {0};
    zs_tensor *r = zs_reshape(x, 3, shape);
    zs_tensor *p = zs_permute(x, order);
    zs_tensor *sq = zs_squeeze(x, 1);
    zs_tensor *us = zs_unsqueeze(x, -1);
    zs_tensor *sl = zs_slice(x, -1, -5, 6, 2);
    zs_tensor *ex = zs_expand(x, 4, eshape);
    zs_tensor *cp = zs_clone(x);
    zs_tensor *cv = zs_contiguous(p);
    zs_tensor *td = zs_to_dtype(x, ZS_F64);
    zs_tensor *hk = zs_backward_hook(x, on_backward, &h, 42);
    /* the caller's arrays change: the nodes hold their own values */
    shape[0] = shape[1] = shape[2] = 1;
    order[0] = order[1] = order[2] = 0;
    eshape[1] = 9;
    const struct { const char *name; zs_tensor *out, *in; } c[] = {
        {"reshape", r, x}, {"permute", p, x}, {"squeeze", sq, x},
        {"unsqueeze", us, x}, {"slice", sl, x}, {"expand", ex, x},
        {"copy", cp, x}, {"copy (contiguous of a permuted view)", cv, p},
        {"to_dtype", td, x}, {"backward_hook", hk, x}};
    for (size_t i = 0; i < sizeof c / sizeof *c; i++)
        ZT_CHECK(replays(c[i].out, c[i].in), "%s replays from its node's attributes",
                 c[i].name);
    /* backward through all of them, reading the nodes' attributes: each
     * contributes its gradient of sum(out) */
    zs_tensor *sums[10], *tot = NULL;
    for (size_t i = 0; i < sizeof c / sizeof *c; i++) {
        zs_tensor *s = zs_sum(c[i].out, 0, NULL, false);
        sums[i] = s && s->dtype != ZS_F32 ? zs_to_dtype(s, ZS_F32) : zs_retain(s);
        zs_release(s);
    }
    tot = zs_stack(10, (zs_tensor *const *)sums, 0);
    zs_tensor *l = tot ? zs_sum(tot, 0, NULL, false) : NULL;
    ZT_CHECK(l && zs_backward(l, NULL, false) == ZS_OK, "backward");
    /* d/dx: reshape 1, permute 1, squeeze 1, unsqueeze 1, expand 3*5 = 15,
     * clone 1, contiguous(permute) 1, to_dtype 1, hook 1; slice adds 1 on
     * the taken positions (last dim: 1, 3, 5) */
    zs_tensor *gx = zs_grad(x);
    int bad = 0;
    for (int64_t i = 0; gx && i < 24; i++) {
        int64_t k = i % 6;
        bad += zs_get(gx, i) != 23 + (k % 2 == 1);
    }
    ZT_CHECK(gx && bad == 0, "gradient of x through every view: %d wrong", bad);
    ZT_CHECK(h.calls == 1 && h.arg == 42, "hook from the node: %d calls, arg %lld",
             h.calls, (long long)h.arg);
    for (size_t i = 0; i < 10; i++)
        zs_release(sums[i]);
    zs_tensor *all[] = {tot, l, r, p, sq, us, sl, ex, cp, cv, td, hk, x};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        zs_release(all[i]);
    ZT_CHECK(zs_autograd_live_nodes() == 0, "tape freed");
}

static void test_errors(void)
{
    zs_tensor *a = zs_ones(ZS_F32, ZS_SHAPE(2, 3));
    ZT_EXPECT_ERROR(zs_view(a, 2, NULL) == NULL, "view: 2 dims requested");
    ZT_EXPECT_ERROR(zs_view(a, ZS_MAX_DIMS + 1, (int64_t[ZS_MAX_DIMS + 1]){0}) == NULL,
                    "dims requested, expected 0..8");
    ZT_EXPECT_ERROR(zs_expand(a, 3, NULL) == NULL, "expand: 3 dims requested");
    ZT_EXPECT_ERROR(zs_permute(a, NULL) == NULL, "entry 0 of the permutation is -1");
    zs_set_error("first");
    ZT_CHECK(zs_view(NULL, 2, NULL) == NULL && zs_expand(NULL, -1, NULL) == NULL &&
             zs_permute(NULL, NULL) == NULL && !strcmp(zs_last_error(), "first"),
             "NULL input keeps the first error");
    zs_clear_error();
    zs_release(a);
}

int main(void)
{
    test_slice_backward();
    zt_section("slice_backward: direct and through autograd vs float64 scatter");
    test_replay();
    zt_section("views and copies replay from their node's typed attributes");
    test_errors();
    zt_section("errors");
    return zt_done();
}
