/*
 * test_recompute.c - activation recomputation (src/autograd/recompute.c):
 * float64 gradient checks of a checkpointed region with dropout (the RNG
 * state restored, or the recomputed mask would differ) and a parameter
 * reached through ctx; f32 results and gradients bit-identical to the same
 * region run without checkpointing; several outputs; the test device;
 * peak memory of a chain of regions; no-grad; error paths; no leaks.
 */
#include <stdlib.h>

#include "testutil.h"

/* The region: dropout(tanh(x @ w) * x2, p) with w from ctx. */
typedef struct reg_ctx {
    zs_tensor *w;  /* [K, N], used through ctx */
    double p;
    int calls;
    bool shape_change; /* second call returns another shape (error test) */
} reg_ctx;

static zs_tensor *region(void *ctx, zs_tensor **in)
{
    reg_ctx *c = ctx;
    c->calls++;
    zs_tensor *h = zs_matmul(in[0], c->w);          /* [M, N] */
    zs_tensor *t = zs_tanh(h);
    zs_tensor *u = zs_mul(t, in[1]);                /* in[1] [M, N] */
    zs_tensor *y = zs_dropout(u, c->p, true);
    zs_release(h);
    zs_release(t);
    zs_release(u);
    if (c->shape_change && c->calls > 1) {
        zs_tensor *s = zs_narrow(y, 0, 0, 1);
        zs_release(y);
        y = s;
    }
    return y;
}

/* What gradcheck differentiates: the region, checkpointed or not, from a
 * fixed RNG state, so every call draws the same dropout mask. inputs: x,
 * x2, w (w reaches the region through ctx). */
typedef struct outer_ctx {
    bool ckpt;
    double p;
} outer_ctx;

static zs_tensor *outer(void *ctx, zs_tensor **in)
{
    outer_ctx *o = ctx;
    reg_ctx rc = {.w = in[2], .p = o->p};
    zs_rng_set_state(1234, 77);
    if (!o->ckpt)
        return region(&rc, in);
    /* gradcheck's backward runs after this returns: the region's ctx
     * must outlive it */
    static reg_ctx keep;
    keep = rc;
    return zs_checkpoint(region, &keep, 2, in);
}

static void test_gradcheck(void)
{
    for (int ck = 0; ck < 2; ck++) {
        zs_tensor *in[3] = {zt_rand(ZS_F64, ZS_SHAPE(5, 7), 1),
                            zt_rand(ZS_F64, ZS_SHAPE(5, 3), 2),
                            zt_rand(ZS_F64, ZS_SHAPE(7, 3), 3)};
        for (int i = 0; i < 3; i++)
            zs_set_requires_grad(in[i], true);
        outer_ctx o = {.ckpt = ck, .p = 0.3};
        ZT_GRADCHECK(ck ? "checkpointed region with dropout" : "plain region",
                     outer, &o, 3, in);
        for (int i = 0; i < 3; i++)
            zs_release(in[i]);
    }
    zt_section("float64 gradient check of a checkpointed region with dropout");
}

/* Loss and gradients of sum(region(x, x2) * r), checkpointed or not, in
 * f32 on device dev; grads[i] receive host copies (new). */
static double run_once(bool ckpt, int dev, zs_tensor **grads)
{
    zs_tensor *x = zt_rand(ZS_F32, ZS_SHAPE(9, 13), 11);
    zs_tensor *x2 = zt_rand(ZS_F32, ZS_SHAPE(9, 6), 12);
    zs_tensor *w = zt_rand(ZS_F32, ZS_SHAPE(13, 6), 13);
    zs_tensor *r = zt_rand(ZS_F32, ZS_SHAPE(9, 6), 14);
    zs_tensor *all[] = {x, x2, w, r};
    for (int i = 0; i < 4 && dev != ZS_CPU; i++) {
        zs_tensor *d = zs_to_device(all[i], dev);
        zs_release(all[i]);
        all[i] = d;
    }
    for (int i = 0; i < 3; i++)
        zs_set_requires_grad(all[i], true);
    reg_ctx rc = {.w = all[2], .p = 0.25};
    zs_rng_set_state(99, 5);
    zs_tensor *y = ckpt ? zs_checkpoint(region, &rc, 2, all) : region(&rc, all);
    /* draws after the region: the replay must not see them */
    zs_tensor *noise = zs_dropout(all[3], 0.5, true);
    zs_tensor *m = zs_mul(y, all[3]);
    zs_tensor *loss = zs_sum(m, 0, NULL, false);
    zs_status st = zs_backward(loss, NULL, false);
    ZT_CHECK(st == ZS_OK, "backward (checkpoint %d, device %d)", ckpt, dev);
    zs_tensor *lh = zs_to_device(loss, ZS_CPU);
    double v = lh ? zs_item(lh) : NAN;
    for (int i = 0; i < 3; i++)
        grads[i] = zs_grad(all[i]) ? zs_to_device(zs_grad(all[i]), ZS_CPU) : NULL;
    ZT_CHECK(rc.calls == (ckpt ? 2 : 1), "region ran %d times", rc.calls);
    zs_tensor *tmp[] = {y, noise, m, loss, lh, all[0], all[1], all[2], all[3]};
    for (size_t i = 0; i < sizeof tmp / sizeof *tmp; i++)
        zs_release(tmp[i]);
    return v;
}

static bool bits_equal(const zs_tensor *a, const zs_tensor *b)
{
    if (!a || !b || !zs_same_shape(a, b))
        return false;
    for (int64_t i = 0; i < zs_numel(a); i++)
        if (zs_get(a, i) != zs_get(b, i))
            return false;
    return true;
}

static void test_bit_exact(void)
{
    int64_t nodes0 = zs_autograd_live_nodes();
    zs_tensor *g0[3], *g1[3], *g2[3];
    double l0 = run_once(false, ZS_CPU, g0);
    double l1 = run_once(true, ZS_CPU, g1);
    ZT_CHECK(l0 == l1, "loss %.9g vs checkpointed %.9g", l0, l1);
    for (int i = 0; i < 3; i++)
        ZT_CHECK(bits_equal(g0[i], g1[i]), "gradient %d identical", i);
    zt_section("f32 checkpointed region: identical loss and gradients");
    ZT_CHECK(zs_test_device_enable() == ZS_OK, "test device");
    zs_test_device_reset_calls();
    double l2 = run_once(true, ZS_TEST_DEVICE, g2);
    ZT_CHECK(l2 == l0, "test device loss %.9g vs cpu %.9g", l2, l0);
    for (int i = 0; i < 3; i++)
        ZT_CHECK(bits_equal(g0[i], g2[i]), "test device gradient %d", i);
    ZT_CHECK(zs_test_device_calls("dropout") == 3,
             "dropout ran %lld times on the test device (forward, replay, noise)",
             (long long)zs_test_device_calls("dropout"));
    for (int i = 0; i < 3; i++) {
        zs_release(g0[i]);
        zs_release(g1[i]);
        zs_release(g2[i]);
    }
    ZT_CHECK(zs_autograd_live_nodes() == nodes0, "nodes freed (%lld left)",
             (long long)(zs_autograd_live_nodes() - nodes0));
    zt_section("checkpointed region on the test device");
}

/* Two outputs: a = tanh(x) * w (w via ctx, [n]), b = sum(x^2, dim 1). */
static zs_status two(void *ctx, zs_tensor **in, int nout, zs_tensor **out)
{
    zs_tensor *w = ctx;
    zs_tensor *t = zs_tanh(in[0]);
    out[0] = zs_mul(t, w);
    zs_tensor *sq = zs_mul(in[0], in[0]);
    out[1] = zs_sum(sq, 1, (int[]){1}, false);
    zs_release(t);
    zs_release(sq);
    return out[0] && out[1] ? ZS_OK : ZS_ERR_ARG;
}

static void grads_two(bool ckpt, zs_tensor **gx, zs_tensor **gw, double *loss)
{
    zs_tensor *x = zt_rand(ZS_F64, ZS_SHAPE(4, 5), 21);
    zs_tensor *w = zt_rand(ZS_F64, ZS_SHAPE(5), 22);
    zs_tensor *ra = zt_rand(ZS_F64, ZS_SHAPE(4, 5), 23);
    zs_tensor *rb = zt_rand(ZS_F64, ZS_SHAPE(4), 24);
    zs_set_requires_grad(x, true);
    zs_set_requires_grad(w, true);
    zs_tensor *o[2] = {NULL, NULL};
    zs_status st = ckpt ? zs_checkpoint_n(two, w, 1, &x, 2, o) : two(w, &x, 2, o);
    ZT_CHECK(st == ZS_OK && zt_shape_is(o[0], ZS_SHAPE(4, 5)) &&
             zt_shape_is(o[1], ZS_SHAPE(4)), "two outputs, their shapes");
    zs_tensor *ma = zs_mul(o[0], ra), *mb = zs_mul(o[1], rb);
    zs_tensor *sa = zs_sum(ma, 0, NULL, false), *sb = zs_sum(mb, 0, NULL, false);
    zs_tensor *l = zs_add(sa, sb);
    ZT_CHECK(zs_backward(l, NULL, false) == ZS_OK, "backward of two outputs");
    *loss = zs_item(l);
    *gx = zs_retain(zs_grad(x));
    *gw = zs_retain(zs_grad(w));
    zs_tensor *tmp[] = {x, w, ra, rb, o[0], o[1], ma, mb, sa, sb, l};
    for (size_t i = 0; i < sizeof tmp / sizeof *tmp; i++)
        zs_release(tmp[i]);
}

static void test_two_outputs(void)
{
    zs_tensor *gx0, *gw0, *gx1, *gw1;
    double l0, l1;
    grads_two(false, &gx0, &gw0, &l0);
    grads_two(true, &gx1, &gw1, &l1);
    ZT_CHECK(l0 == l1, "loss %.17g vs %.17g", l0, l1);
    ZT_CHECK(bits_equal(gx0, gx1), "input gradient");
    ZT_CHECK(bits_equal(gw0, gw1), "parameter (ctx) gradient");
    zs_tensor *all[] = {gx0, gw0, gx1, gw1};
    for (int i = 0; i < 4; i++)
        zs_release(all[i]);
    zt_section("zs_checkpoint_n: two outputs");
}

/* A chain of regions each making 8 intermediates of x's size. */
static zs_tensor *fat(void *ctx, zs_tensor **in)
{
    zs_tensor *x = zs_retain(in[0]);
    for (int i = 0; i < 8; i++) {
        zs_tensor *y = zs_tanh(x);
        zs_release(x);
        x = y;
    }
    return x;
}

static size_t chain_peak(bool ckpt)
{
    zs_tensor *x = zt_rand(ZS_F32, ZS_SHAPE(256, 1024), 31); /* 1 MiB */
    zs_set_requires_grad(x, true);
    zs_alloc_reset_peak();
    zs_alloc_stats s0;
    zs_alloc_get_stats(&s0);
    zs_tensor *h = zs_retain(x);
    for (int l = 0; l < 6; l++) {
        zs_tensor *y = ckpt ? zs_checkpoint(fat, NULL, 1, &h) : fat(NULL, &h);
        zs_release(h);
        h = y;
    }
    zs_tensor *s = zs_sum(h, 0, NULL, false);
    ZT_CHECK(zs_backward(s, NULL, false) == ZS_OK, "chain backward");
    zs_alloc_stats s1;
    zs_alloc_get_stats(&s1);
    zs_release(s);
    zs_release(h);
    zs_release(x);
    return s1.peak_bytes - s0.current_bytes;
}

static void test_peak(void)
{
    size_t none = chain_peak(false), ck = chain_peak(true);
    printf("chain of 6 regions x 8 tanh of 1 MiB: peak %.1f MiB plain, %.1f MiB "
           "checkpointed\n", none / 1048576.0, ck / 1048576.0);
    /* plain keeps 48 outputs (tanh saves its result); checkpointed keeps
     * 6 region outputs plus one region's 8 and their gradients */
    ZT_CHECK(ck < none / 2, "peak %zu checkpointed vs %zu plain", ck, none);
    zt_section("peak memory of a checkpointed chain");
}

static zs_tensor *fail_fn(void *ctx, zs_tensor **in)
{
    zs_set_error("region failed on purpose");
    return NULL;
}

static zs_status mixed(void *ctx, zs_tensor **in, int nout, zs_tensor **out)
{
    out[0] = zs_mul_scalar(in[0], 2);
    if (nout > 1)
        out[1] = zs_to_dtype(in[0], ZS_F64);
    return ZS_OK;
}

static void test_errors_and_modes(void)
{
    int64_t nodes0 = zs_autograd_live_nodes();
    zs_tensor *x = zt_rand(ZS_F32, ZS_SHAPE(3, 4), 41);
    zs_tensor *x2 = zt_rand(ZS_F32, ZS_SHAPE(3, 2), 42);
    zs_tensor *w = zt_rand(ZS_F32, ZS_SHAPE(4, 2), 43);
    zs_set_requires_grad(x, true);
    zs_tensor *in[2] = {x, x2};
    ZT_EXPECT_ERROR(!zs_checkpoint(NULL, NULL, 1, in), "no function");
    ZT_EXPECT_ERROR(!zs_checkpoint(fail_fn, NULL, 1, in), "on purpose");
    ZT_EXPECT_ERROR(!zs_checkpoint(region, NULL, -1, in), "inputs");
    zs_tensor *o[2];
    ZT_EXPECT_ERROR(zs_checkpoint_n(mixed, NULL, 1, in, 0, o) < 0, "outputs");
    ZT_EXPECT_ERROR(zs_checkpoint_n(mixed, NULL, 1, in, 2, o) < 0 && !o[0] && !o[1],
                    "one dtype");
    zs_tensor *nul[1] = {NULL};
    zs_set_error("first error");
    ZT_CHECK(!zs_checkpoint(region, NULL, 1, nul) &&
             strstr(zs_last_error(), "first error"), "NULL input keeps the first error");
    /* a region whose replay changes shape */
    reg_ctx rc = {.w = w, .p = 0, .shape_change = true};
    zs_tensor *y = zs_checkpoint(region, &rc, 2, in);
    zs_tensor *s = zs_sum(y, 0, NULL, false);
    ZT_EXPECT_ERROR(zs_backward(s, NULL, false) < 0, "same shapes");
    zs_release(s);
    zs_release(y);
    /* under no-grad: a plain result, nothing recorded */
    reg_ctx rc2 = {.w = w, .p = 0};
    zs_no_grad_push();
    y = zs_checkpoint(region, &rc2, 2, in);
    zs_no_grad_pop();
    ZT_CHECK(y && !y->node && !zs_requires_grad(y) && rc2.calls == 1,
             "no-grad: no node");
    zs_release(y);
    /* identity region: the result is a new tensor, x keeps no node */
    zs_tensor *id = zs_checkpoint_n(mixed, NULL, 1, in, 1, o) == ZS_OK ? o[0] : NULL;
    ZT_CHECK(id && id != x && !x->node && id->node, "result is a new node");
    zs_release(id);
    zs_release(x);
    zs_release(x2);
    zs_release(w);
    ZT_CHECK(zs_autograd_live_nodes() == nodes0, "nodes freed (%lld left)",
             (long long)(zs_autograd_live_nodes() - nodes0));
    zt_section("error paths, no-grad, lifetime");
}

int main(void)
{
    test_gradcheck();
    test_bit_exact();
    test_two_outputs();
    test_peak();
    test_errors_and_modes();
    return zt_done();
}
