/*
 * test_autograd.c - the backward engine: accumulation, retain_grad,
 * keep_graph and the freed-graph error, no-grad, zero_grad, diamonds, node
 * lifetime, and gradient checks through every view operation.
 */
#include "testutil.h"

static void test_accumulate_and_keep(void)
{
    int64_t nodes0 = zs_autograd_live_nodes();
    zs_tensor *x = zs_from_data(ZS_F64, ZS_SHAPE(3), (double[]){1, 2, 3});
    zs_set_requires_grad(x, true);
    zs_tensor *y = zs_mul(x, x);             /* y = x^2 */
    zs_tensor *z = zs_sum(y, 0, NULL, false); /* z = sum x^2 */
    ZT_CHECK(zs_retain_grad(y) == ZS_OK, "retain_grad");
    ZT_CHECK(zs_backward(z, NULL, true) == ZS_OK, "first backward");
    ZT_CHECK(zs_get(zs_grad(x), 2) == 6, "dz/dx = 2x");
    ZT_CHECK(zs_grad(y) && zs_get(zs_grad(y), 1) == 1, "retained non-leaf grad");
    ZT_CHECK(zs_backward(z, NULL, false) == ZS_OK, "second backward (kept graph)");
    ZT_CHECK(zs_get(zs_grad(x), 2) == 12, "gradients accumulate");
    ZT_EXPECT_ERROR(zs_backward(z, NULL, false) < 0, "was freed");
    zs_zero_grad(x, false);
    ZT_CHECK(zs_grad(x) && zs_get(zs_grad(x), 0) == 0, "zero_grad keeps memory");
    zs_zero_grad(x, true);
    ZT_CHECK(zs_grad(x) == NULL, "zero_grad set_to_none");
    zs_release(z);
    zs_release(y);
    zs_release(x);
    ZT_CHECK(zs_autograd_live_nodes() == nodes0, "nodes freed (%lld left)",
             (long long)(zs_autograd_live_nodes() - nodes0));
    zt_section("accumulation, retain_grad, keep_graph, freed graph");
}

static void test_modes_and_errors(void)
{
    zs_tensor *x = zs_ones(ZS_F32, ZS_SHAPE(2, 2));
    zs_tensor *c = zs_ones(ZS_F32, ZS_SHAPE(2, 2));
    zs_set_requires_grad(x, true);
    zs_no_grad_push();
    zs_tensor *y = zs_mul(x, c);
    zs_no_grad_pop();
    ZT_CHECK(!zs_requires_grad(y) && y->node == NULL, "no-grad records nothing");
    ZT_EXPECT_ERROR(zs_backward(y, NULL, false) < 0, "does not require grad");
    zs_tensor *w = zs_mul(x, c);
    ZT_EXPECT_ERROR(zs_backward(w, NULL, false) < 0, "pass a gradient");
    zs_tensor *g = zs_ones(ZS_F32, ZS_SHAPE(3));
    ZT_EXPECT_ERROR(zs_backward(w, g, false) < 0, "does not match root");
    ZT_EXPECT_ERROR(zs_set_requires_grad(w, false) < 0, "not a leaf");
    zs_tensor *i = zs_zeros(ZS_I64, ZS_SHAPE(2));
    ZT_EXPECT_ERROR(zs_set_requires_grad(i, true) < 0, "cannot require grad");
    zs_tensor *g2 = zs_full(ZS_F32, ZS_SHAPE(2, 2), 3.0);
    ZT_CHECK(zs_backward(w, g2, false) == ZS_OK && zs_get(zs_grad(x), 3) == 3,
             "backward with an explicit gradient");
    zs_tensor *all[] = {x, c, y, w, g, i, g2};
    for (size_t k = 0; k < sizeof all / sizeof *all; k++)
        zs_release(all[k]);
    zt_section("no-grad and error paths");
}

static void test_diamond_and_scope(void)
{
    zs_tensor *x = zs_from_data(ZS_F64, ZS_SHAPE(2), (double[]){2, -1});
    zs_set_requires_grad(x, true);
    zs_scope_push();
    zs_tensor *a = zs_mul_scalar(x, 3.0);
    zs_tensor *b = zs_mul(x, a);          /* 3x^2 */
    zs_tensor *c = zs_add(a, b);          /* 3x + 3x^2 */
    zs_tensor *d = zs_sum(zs_mul(c, x), 0, NULL, false); /* 3x^2 + 3x^3 */
    ZT_CHECK(zs_backward(d, NULL, false) == ZS_OK, "backward in a scope");
    zs_scope_pop();
    /* d' = 6x + 9x^2 */
    ZT_CHECK(fabs(zs_get(zs_grad(x), 0) - 48) < 1e-12 &&
             fabs(zs_get(zs_grad(x), 1) - 3) < 1e-12, "diamond gradient %g %g",
             zs_get(zs_grad(x), 0), zs_get(zs_grad(x), 1));
    zs_release(x);
    zt_section("diamond graph inside a scope");
}

typedef struct view_case {
    int kind;
} view_case;

static zs_tensor *view_fn(void *ctx, zs_tensor **in)
{
    view_case *vc = ctx;
    zs_tensor *x = in[0], *t = NULL, *u = NULL, *r;
    switch (vc->kind) {
    case 0: t = zs_reshape(x, ZS_SHAPE(6, -1)); break;
    case 1: t = zs_permute(x, (int[]){2, 0, 1}); break;
    case 2: t = zs_slice(x, 2, 1, 5, 2); break;
    case 3: t = zs_narrow(x, 1, 1, 2); break;
    case 4:
        u = zs_unsqueeze(x, 1);
        t = zs_expand(u, ZS_SHAPE(2, 4, 3, 5));
        break;
    case 5:
        u = zs_narrow(x, 1, 0, 1);
        t = zs_squeeze(u, 1);
        break;
    case 6:
        u = zs_transpose(x, 0, 2);
        t = zs_contiguous(u);
        break;
    case 7:
        u = zs_to_dtype(x, ZS_F32);
        t = zs_to_dtype(u, ZS_F64);
        break;
    case 8:
        u = zs_permute(x, (int[]){1, 2, 0});
        t = zs_flatten(u, 0, 1);
        break;
    default: { /* slices of one intermediate: the engine offers the sum so
                * far to the later slices' rules (added into their slots in
                * place); interleaved slots (step 2) and an overlapping one */
        u = zs_mul_scalar(x, 1.5);
        zs_tensor *s[3] = {zs_slice(u, 2, 0, 5, 2), zs_slice(u, 2, 1, 5, 2),
                           zs_narrow(u, 2, 1, 3)};
        zs_tensor *a = zs_mul(s[0], s[0]), *b = zs_mul_scalar(s[1], -0.5);
        zs_tensor *c = zs_mul(s[2], s[2]);
        zs_tensor *sa = zs_sum(a, 0, NULL, false), *sb = zs_sum(b, 0, NULL, false);
        zs_tensor *sc = zs_sum(c, 0, NULL, false);
        zs_tensor *ab = zs_add(sa, sb);
        t = zs_add(ab, sc);
        zs_tensor *tmp[] = {s[0], s[1], s[2], a, b, c, sa, sb, sc, ab};
        for (int i = 0; i < 10; i++)
            zs_release(tmp[i]);
        break;
    }
    }
    /* non-linear tail so every element matters differently */
    r = zs_mul(t, t);
    zs_release(t);
    zs_release(u);
    return r;
}

static void test_view_grads(void)
{
    for (int k = 0; k < 10; k++) {
        zs_tensor *x = zt_rand(ZS_F64, ZS_SHAPE(2, 3, 5), 50 + k);
        zs_set_requires_grad(x, true);
        view_case vc = {k};
        char name[32];
        snprintf(name, sizeof name, "view kind %d", k);
        if (k == 7) { /* through f32: looser tolerance by construction */
            zs_gradcheck_result r;
            zs_gradcheck(view_fn, &vc, 1, &x, 1e-3, 1e-3, 1e-3, &r);
            ZT_CHECK(r.ok, "to_dtype round trip grad err %g", r.max_abs_err);
            zs_zero_grad(x, true);
        } else {
            ZT_GRADCHECK(name, view_fn, &vc, 1, &x);
        }
        zs_release(x);
    }
    zt_section("view gradients");
}

/* Records, per leaf, how often the ready hook ran and the gradient it saw
 * then (which must already be the final one). */
typedef struct ready_log {
    zs_tensor *leaf[4];
    int calls[4];
    double seen[4];
} ready_log;

static void on_ready(void *ctx, zs_tensor *leaf)
{
    ready_log *r = ctx;
    for (int i = 0; i < 4; i++)
        if (r->leaf[i] == leaf) {
            r->calls[i]++;
            r->seen[i] = zs_get(leaf->grad, 0);
        }
}

static void test_grad_ready_hook(void)
{
    /* a feeds the loss twice (directly near the root and through the
     * deepest node), b once in the middle, c once near the root, d not at
     * all: L = a*c + sum(b*exp(a)) (+ d unused). */
    ready_log r = {0};
    for (int i = 0; i < 4; i++) {
        r.leaf[i] = zs_full(ZS_F64, ZS_SHAPE(1), 0.5 + i);
        zs_set_requires_grad(r.leaf[i], true);
    }
    zs_tensor *a = r.leaf[0], *b = r.leaf[1], *c = r.leaf[2];
    int id = zs_grad_ready_hook_add(on_ready, &r);
    ZT_CHECK(id > 0, "hook added (id %d)", id);
    for (int pass = 0; pass < 2; pass++) {
        zs_tensor *e = zs_exp(a), *be = zs_mul(b, e), *ac = zs_mul(a, c);
        zs_tensor *l = zs_add(ac, be);
        ZT_CHECK(zs_backward(l, NULL, false) == ZS_OK, "backward");
        zs_release(l);
        zs_release(ac);
        zs_release(be);
        zs_release(e);
    }
    ZT_CHECK(zs_grad_ready_hook_remove(id) == ZS_OK, "hook removed");
    double ga = 2 * (2.5 + 1.5 * exp(0.5)), gb = 2 * exp(0.5), gc = 2 * 0.5;
    ZT_CHECK(r.calls[0] == 2 && r.calls[1] == 2 && r.calls[2] == 2 && r.calls[3] == 0,
             "one call per leaf and backward (%d %d %d %d)", r.calls[0], r.calls[1],
             r.calls[2], r.calls[3]);
    ZT_CHECK(fabs(r.seen[0] - ga) < 1e-12 && fabs(r.seen[1] - gb) < 1e-12 &&
             fabs(r.seen[2] - gc) < 1e-12, "the hook sees final gradients");
    ZT_CHECK(fabs(zs_get(a->grad, 0) - ga) < 1e-12, "a's gradient");
    /* an error part-way leaves no stale counts: a failing backward, then a
     * good one still calls the hook */
    ready_log r2 = {0};
    r2.leaf[0] = a;
    zs_zero_grad(a, true);
    zs_tensor *e2 = zs_exp(a), *l2 = zs_sum(e2, 0, NULL, false);
    zs_tensor *bad_seed = zs_ones(ZS_F32, ZS_SHAPE(3));
    id = zs_grad_ready_hook_add(on_ready, &r2);
    ZT_EXPECT_ERROR(zs_backward(l2, bad_seed, false) < 0, "does not match");
    ZT_CHECK(zs_backward(l2, NULL, false) == ZS_OK && r2.calls[0] == 1,
             "hook after a rejected backward (%d calls)", r2.calls[0]);
    zs_grad_ready_hook_remove(id);
    ZT_EXPECT_ERROR(zs_grad_ready_hook_remove(id) < 0, "no hook");
    ZT_EXPECT_ERROR(zs_grad_ready_hook_add(NULL, NULL) < 0, "no function");
    zs_release(bad_seed);
    zs_release(l2);
    zs_release(e2);
    for (int i = 0; i < 4; i++)
        zs_release(r.leaf[i]);
    zt_section("gradient-ready hook");
}

/* Two hooks at once (data parallelism's and a profiler's): each hears of
 * every leaf once per backward, the first added first; removing one
 * leaves the other. */
typedef struct order_log {
    int seq[64], n; /* hook tags in call order */
    zs_tensor *leaves[64];
} order_log;

typedef struct tagged {
    order_log *log;
    int tag;
    int calls;
} tagged;

static void on_ready_tagged(void *ctx, zs_tensor *leaf)
{
    tagged *t = ctx;
    t->calls++;
    if (t->log->n < 64) {
        t->log->leaves[t->log->n] = leaf;
        t->log->seq[t->log->n++] = t->tag;
    }
}

static void test_two_ready_hooks(void)
{
    enum { NL = 5 };
    zs_tensor *w[NL], *acc = NULL;
    for (int i = 0; i < NL; i++) {
        w[i] = zs_full(ZS_F64, ZS_SHAPE(2), 0.25 * (i + 1));
        zs_set_requires_grad(w[i], true);
    }
    order_log log = {0};
    tagged a = {&log, 1, 0}, b = {&log, 2, 0};
    int ia = zs_grad_ready_hook_add(on_ready_tagged, &a);
    int ib = zs_grad_ready_hook_add(on_ready_tagged, &b);
    ZT_CHECK(ia > 0 && ib > 0 && ia != ib, "two hooks, two ids (%d, %d)", ia, ib);
    /* L = sum(w0 * w1 * ... * w4): every leaf feeds one product */
    acc = zs_retain(w[0]);
    for (int i = 1; i < NL; i++) {
        zs_tensor *m = zs_mul(acc, w[i]);
        zs_release(acc);
        acc = m;
    }
    zs_tensor *l = zs_sum(acc, 0, NULL, false);
    ZT_CHECK(zs_backward(l, NULL, false) == ZS_OK, "backward");
    zs_release(acc);
    zs_release(l);
    ZT_CHECK(a.calls == NL && b.calls == NL, "both hooks fired for every leaf (%d, %d of %d)",
             a.calls, b.calls, NL);
    bool paired = log.n == 2 * NL;
    for (int k = 0; paired && k < log.n; k += 2)
        paired = log.seq[k] == 1 && log.seq[k + 1] == 2 && log.leaves[k] == log.leaves[k + 1];
    ZT_CHECK(paired, "per leaf, the first hook added runs first, then the second");
    for (int i = 0; i < NL; i++) {
        int seen = 0;
        for (int k = 0; k < log.n; k++)
            seen += log.leaves[k] == w[i];
        ZT_CHECK(seen == 2, "leaf %d seen by both hooks (%d calls)", i, seen);
    }
    ZT_CHECK(zs_grad_ready_hook_remove(ia) == ZS_OK, "first removed");
    a.calls = b.calls = 0;
    log.n = 0;
    for (int i = 0; i < NL; i++)
        zs_zero_grad(w[i], true);
    zs_tensor *p = zs_mul(w[0], w[1]), *l2 = zs_sum(p, 0, NULL, false);
    ZT_CHECK(zs_backward(l2, NULL, false) == ZS_OK && a.calls == 0 && b.calls == 2,
             "after removing the first, only the second fires (%d, %d)", a.calls, b.calls);
    zs_grad_ready_hook_remove(ib);
    zs_release(p);
    zs_release(l2);
    for (int i = 0; i < NL; i++)
        zs_release(w[i]);
    zt_section("two gradient-ready hooks: both fire for every leaf, in order");
}

/* zs_backward_hook: what the hook saw when backward called it. */
typedef struct hook_log {
    int calls;
    int64_t arg;
    bool input_grad_before; /* the leaf under the hook already had a grad */
    zs_tensor *leaf;
    bool fail;
} hook_log;

static zs_status on_backward(void *ctx, int64_t arg)
{
    hook_log *h = ctx;
    h->calls++;
    h->arg = arg;
    h->input_grad_before = h->leaf && h->leaf->grad != NULL;
    if (h->fail)
        return zs_set_error_code(ZS_ERR_STATE, "hook refused on purpose");
    return ZS_OK;
}

/* f(x) = hook(exp(x)) * x: the hook sits between exp and the product. */
static zs_tensor *hooked_fn(void *ctx, zs_tensor **in)
{
    zs_tensor *e = zs_exp(in[0]), *h = zs_backward_hook(e, on_backward, ctx, 7);
    zs_tensor *y = zs_mul(h, in[0]);
    zs_release(e);
    zs_release(h);
    return y;
}

static void test_backward_hook(void)
{
    hook_log h = {0};
    zs_tensor *x = zt_rand(ZS_F64, ZS_SHAPE(3, 5), 41);
    zs_set_requires_grad(x, true);
    ZT_GRADCHECK("backward_hook", hooked_fn, &h, 1, &x);
    ZT_CHECK(h.calls >= 1 && h.arg == 7, "the hook ran with its argument (%d calls)",
             h.calls);
    /* exactly once per backward, before the gradient reaches the input
     * through exp (the direct path of mul may already have) */
    zs_tensor *a = zs_full(ZS_F64, ZS_SHAPE(2), 0.5);
    zs_set_requires_grad(a, true);
    hook_log g = {.leaf = a};
    zs_tensor *e = zs_exp(a), *hk = zs_backward_hook(e, on_backward, &g, 3);
    zs_tensor *l = zs_sum(hk, 0, NULL, false);
    ZT_CHECK(zs_backward(l, NULL, true) == ZS_OK && g.calls == 1 && !g.input_grad_before,
             "one call, before the leaf's gradient (%d calls)", g.calls);
    ZT_CHECK(fabs(zs_get(a->grad, 0) - exp(0.5)) < 1e-15, "gradient passes unchanged");
    g.fail = true;
    ZT_EXPECT_ERROR(zs_backward(l, NULL, false) < 0, "hook refused on purpose");
    zs_no_grad_push();
    zs_tensor *plain = zs_backward_hook(a, on_backward, &g, 0);
    zs_no_grad_pop();
    ZT_CHECK(plain && zs_get(plain, 1) == 0.5, "grad mode off: a plain alias");
    ZT_EXPECT_ERROR(zs_backward_hook(a, NULL, NULL, 0) == NULL, "no function");
    zs_tensor *ts[] = {plain, l, hk, e, a, x};
    for (size_t i = 0; i < sizeof ts / sizeof *ts; i++)
        zs_release(ts[i]);
    zt_section("backward hook: gradcheck, called once before the input's gradient, "
               "errors stop backward");
}

int main(void)
{
    test_accumulate_and_keep();
    test_modes_and_errors();
    test_diamond_and_scope();
    test_view_grads();
    test_grad_ready_hook();
    test_two_ready_hooks();
    test_backward_hook();
    return zt_done();
}
