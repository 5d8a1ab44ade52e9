/*
 * test_dropout.c - zs_dropout: fraction kept within statistical bounds,
 * scaling of kept values, the same mask for the same seed at 1 and 2
 * threads, gradient = mask * scale (and a gradcheck with the seed reset
 * in the function), identity in eval mode and for p = 0, zeros for p = 1,
 * the descriptor dropout_backward run directly (f32 arithmetic reproduced
 * here: exact) and its errors, errors.
 */
#include <stdlib.h>

#include <string.h>

#include "ops/op.h"
#include "testutil.h"

/* Fraction of non-zero elements; bad counts kept values != x * scale. */
static double kept_fraction(const zs_tensor *x, const zs_tensor *y,
                            double scale, double tol, int64_t *bad)
{
    int64_t n = zs_numel(x), kept = 0;
    *bad = 0;
    for (int64_t i = 0; i < n; i++) {
        double v = zs_get(y, i);
        if (v == 0)
            continue;
        kept++;
        *bad += fabs(v - zs_get(x, i) * scale) > tol;
    }
    return (double)kept / (double)n;
}

static void test_statistics(void)
{
    const int64_t n = 1000 * 101;
    double ps[] = {0.1, 0.3, 0.7};
    for (int k = 0; k < 3; k++) {
        for (int dt = 0; dt < 2; dt++) {
            zs_dtype d = dt ? ZS_F64 : ZS_F32;
            /* values in [0.5, 1): never 0, so zeros mark dropped elements */
            zs_tensor *x0 = zs_uniform(d, ZS_SHAPE(1000, 202), 0.5, 1.0, 9);
            zs_tensor *x = zs_slice(x0, 1, 0, 202, 2); /* non-contiguous */
            zs_tensor *y = zs_dropout(x, ps[k], true);
            int64_t bad;
            double f = kept_fraction(x, y, 1.0 / (1.0 - ps[k]),
                                     d == ZS_F32 ? 1e-6 : 1e-15, &bad);
            /* 5 standard deviations of a binomial fraction */
            double sd = sqrt(ps[k] * (1 - ps[k]) / (double)n);
            ZT_CHECK(y && fabs(f - (1 - ps[k])) <= 5 * sd && bad == 0,
                     "p = %g %s: kept %.5f (expected %.5f +- %.5f), %lld "
                     "badly scaled", ps[k], zs_dtype_name(d), f, 1 - ps[k],
                     5 * sd, (long long)bad);
            zs_release(y);
            zs_release(x);
            zs_release(x0);
        }
    }
    zt_section("kept fraction within 5 sd, kept values scaled by 1/(1-p)");
}

static void test_reproducible(void)
{
    int threads = zs_num_threads();
    zs_tensor *x = zs_ones(ZS_F32, ZS_SHAPE(317, 331));
    zs_tensor *y[3];
    for (int k = 0; k < 2; k++) {
        zs_set_num_threads(k + 1);
        zs_manual_seed(1234);
        y[k] = zs_dropout(x, 0.5, true);
    }
    y[2] = zs_dropout(x, 0.5, true); /* the stream moved on */
    zs_set_num_threads(threads);
    int64_t n = zs_numel(x), diff01 = 0, diff12 = 0;
    for (int64_t i = 0; i < n; i++) {
        diff01 += zs_get(y[0], i) != zs_get(y[1], i);
        diff12 += zs_get(y[1], i) != zs_get(y[2], i);
    }
    ZT_CHECK(diff01 == 0, "1 vs 2 threads, same seed: %lld elements differ",
             (long long)diff01);
    ZT_CHECK(diff12 > n / 4, "next call gives a new mask (%lld differ)",
             (long long)diff12);
    for (int k = 0; k < 3; k++)
        zs_release(y[k]);
    zs_release(x);
    zt_section("same seed, same mask at 1 and 2 threads");
}

static zs_tensor *drop_fn(void *ctx, zs_tensor **in)
{
    zs_manual_seed(77); /* the same mask at every evaluation */
    return zs_dropout(in[0], *(const double *)ctx, true);
}

static void test_grad(void)
{
    const double p = 0.4, scale = 1.0 / (1.0 - p);
    zs_tensor *x = zs_uniform(ZS_F64, ZS_SHAPE(53, 29), 0.5, 1.0, 5);
    zs_tensor *r = zt_rand(ZS_F64, ZS_SHAPE(53, 29), 6);
    zs_set_requires_grad(x, true);
    zs_tensor *y = zs_dropout(x, p, true);
    zs_tensor *yr = zs_mul(y, r);
    zs_tensor *s = zs_sum(yr, 0, NULL, false);
    ZT_CHECK(zs_backward(s, NULL, false) == ZS_OK, "backward runs");
    int64_t bad = 0;
    for (int64_t i = 0; i < zs_numel(x); i++) {
        double mask = zs_get(y, i) != 0;
        bad += fabs(zs_get(zs_grad(x), i) - zs_get(r, i) * mask * scale) > 1e-15;
    }
    ZT_CHECK(bad == 0, "gradient = g * mask * scale: %lld wrong", (long long)bad);
    zs_release(s);
    zs_release(yr);
    zs_release(y);
    zs_release(r);
    zs_release(x);

    zs_tensor *xs = zt_rand_strided(ZS_F64, ZS_SHAPE(7, 13), 8);
    zs_set_requires_grad(xs, true);
    double pp = 0.3;
    ZT_GRADCHECK("dropout p = 0.3 (seed reset per call)", drop_fn, &pp, 1, &xs);
    pp = 0.0;
    ZT_GRADCHECK("dropout p = 0", drop_fn, &pp, 1, &xs);
    zs_release(xs);
    zt_section("gradient and gradcheck");
}

/* dropout_backward directly: a strided f32 gradient and a mask; the
 * result is g * mask * scale in float, as the kernel computes it (exact);
 * autograd's gradient through zs_dropout is the same bits. */
static void test_backward_descriptor(void)
{
    const double p = 0.25;
    zsi_opdef *bw = zsi_opdef_find("dropout_backward");
    /* values in [0.5, 1): never 0, so zeros of y mark dropped elements */
    zs_tensor *x = zs_uniform(ZS_F32, ZS_SHAPE(37, 41), 0.5, 1.0, 12);
    zs_set_requires_grad(x, true);
    zs_tensor *y = zs_dropout(x, p, true);
    zs_tensor *g = zt_rand_strided(ZS_F32, ZS_SHAPE(37, 41), 13);
    ZT_CHECK(y && zs_backward(y, g, false) == ZS_OK, "backward runs");
    zs_tensor *m = zs_empty(ZS_U8, ZS_SHAPE(37, 41));
    uint8_t *mv = zs_data(m);
    for (int64_t i = 0; i < zs_numel(m); i++)
        mv[i] = zs_get(y, i) != 0;
    zs_tensor *gx = zsi_run(bw, 2, (zs_tensor *[]){g, m}, &p);
    float s = (float)(1.0 / (1.0 - p));
    int64_t bad = !gx, bad_ag = 0;
    for (int64_t i = 0; gx && i < zs_numel(gx); i++) {
        float want = (float)zs_get(g, i) * (float)mv[i] * s;
        bad += ((const float *)zs_data(gx))[i] != want;
        bad_ag += ((const float *)zs_data(zs_grad(x)))[i] != want;
    }
    ZT_CHECK(bad == 0 && bad_ag == 0, "dropout_backward direct: %lld wrong, "
             "through autograd: %lld wrong (seed 12)", (long long)bad,
             (long long)bad_ag);
    zs_tensor *mi = zs_zeros(ZS_I32, ZS_SHAPE(37, 41));
    zs_tensor *m2 = zs_zeros(ZS_U8, ZS_SHAPE(41, 37));
    ZT_EXPECT_ERROR(zsi_run(bw, 2, (zs_tensor *[]){g, mi}, &p) == NULL,
                    "dropout_backward: mask i32 [37, 41], expected u8");
    ZT_EXPECT_ERROR(zsi_run(bw, 2, (zs_tensor *[]){g, m2}, &p) == NULL,
                    "expected u8 of the gradient's shape [37, 41]");
    zs_tensor *all[] = {mi, m2, gx, m, g, y, x};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        zs_release(all[i]);
    zt_section("dropout_backward run directly: g * mask * scale, exact; errors");
}

static void test_identity(void)
{
    zs_tensor *x = zt_rand_strided(ZS_F32, ZS_SHAPE(9, 11), 3);
    zs_set_requires_grad(x, true);
    zs_tensor *ys[] = {zs_dropout(x, 0.5, false), zs_dropout(x, 0.0, true)};
    for (int k = 0; k < 2; k++) {
        int bad = !ys[k] || !zs_same_shape(x, ys[k]);
        for (int64_t i = 0; !bad && i < 99; i++)
            bad += zs_get(ys[k], i) != zs_get(x, i);
        ZT_CHECK(bad == 0, "%s is the identity", k ? "p = 0" : "eval mode");
        zs_tensor *s = zs_sum(ys[k], 0, NULL, false);
        ZT_CHECK(zs_backward(s, NULL, false) == ZS_OK &&
                     zs_get(zs_grad(x), 98) == 1.0 * (k + 1),
                 "identity passes the gradient through");
        zs_release(s);
        zs_release(ys[k]);
    }
    zs_release(x);
    zs_tensor *o = zs_ones(ZS_F64, ZS_SHAPE(5, 6));
    zs_tensor *z = zs_dropout(o, 1.0, true);
    double m = 0;
    for (int64_t i = 0; z && i < 30; i++)
        m = fmax(m, fabs(zs_get(z, i)));
    ZT_CHECK(z && m == 0, "p = 1 gives zeros");
    zs_release(z);
    zs_release(o);
    zt_section("eval mode and p = 0 identity, p = 1 zeros");
}

static void test_errors(void)
{
    zs_tensor *x = zs_ones(ZS_F32, ZS_SHAPE(4));
    zs_tensor *xi = zs_ones(ZS_I32, ZS_SHAPE(4));
    ZT_EXPECT_ERROR(zs_dropout(x, -0.1, true) == NULL,
                    "dropout: p = -0.1, expected 0 <= p < 1");
    ZT_EXPECT_ERROR(zs_dropout(x, 1.5, false) == NULL, "p = 1.5");
    ZT_EXPECT_ERROR(zs_dropout(x, NAN, true) == NULL, "p = nan");
    ZT_EXPECT_ERROR(zs_dropout(xi, 0.5, true) == NULL, "dtype i32");
    zs_set_error("first");
    ZT_CHECK(zs_dropout(NULL, 0.5, true) == NULL && !strcmp(zs_last_error(), "first"),
             "NULL input keeps the first error");
    zs_release(x);
    zs_release(xi);
    ZT_CHECK(zs_autograd_live_nodes() == 0, "no autograd nodes left");
    zt_section("errors");
}

/* ---- output shapes against the plain shape rule ----------------------- */

static void test_dropout_shapes(void)
{
    const uint64_t seed = 1304;
    zt_irand_seed(seed);
    for (int trial = 0; trial < 20; trial++) {
        zs_scope_push();
        int nd = (int)zt_irand(0, 4);
        int64_t s[4];
        for (int d = 0; d < nd; d++)
            s[d] = zt_irand(0, 5);
        zs_tensor *x = zs_zeros(ZS_F32, nd, s);
        ZT_CHECK(zt_shape_is(zs_dropout(x, 0.5, true), nd, s) &&
                 zt_shape_is(zs_dropout(x, 0.5, false), nd, s),
                 "dropout shape, seed %llu trial %d", (unsigned long long)seed, trial);
        zs_scope_pop();
    }
    zt_section("dropout: the input's shape on random shapes");
}

int main(void)
{
    test_dropout_shapes();
    test_statistics();
    test_reproducible();
    test_grad();
    test_backward_descriptor();
    test_identity();
    test_errors();
    return zt_done();
}
