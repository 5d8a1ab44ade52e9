/*
 * test_scaler.c - zs_unscale_ (ops/unscale.c) and zs_grad_scaler
 * (optim/scaler.c): the pass against a reference (f32 and f64, odd sizes
 * split over the pool, Inf and NaN anywhere, the flag left alone when
 * clean); a scripted run where Inf/NaN are injected into a gradient at
 * chosen steps: exactly those steps are skipped with the parameters
 * untouched, the scale halves there and doubles after growth_interval
 * clean steps, clean steps update by the unscaled gradient; accumulation
 * and clipping after unscale; the test device; the errors.
 */
#include <stdlib.h>

#include "testutil.h"

static void test_unscale_pass(void)
{
    int64_t sizes[] = {1, 17, 100003};
    for (int k = 0; k < 3; k++) {
        for (int d = 0; d < 2; d++) {
            zs_dtype dt = d ? ZS_F64 : ZS_F32;
            int64_t n = sizes[k];
            zs_tensor *g = zt_rand(dt, 1, &n, 70 + (uint64_t)k);
            double *ref = zt_values(g);
            zs_tensor *flag = zs_zeros(ZS_F32, ZS_SHAPE(1));
            double inv = 1.0 / 3.0;
            ZT_CHECK(zs_unscale_(g, flag, inv) == ZS_OK && zs_get(flag, 0) == 0,
                     "%s n=%lld clean: flag stays 0", zs_dtype_name(dt), (long long)n);
            int64_t bad = 0;
            for (int64_t i = 0; i < n; i++) {
                double want = d ? ref[i] * inv : (double)((float)ref[i] * (float)inv);
                bad += zs_get(g, i) != want;
            }
            ZT_CHECK(bad == 0, "%s n=%lld: %lld elements differ from x * inv (seed %d)",
                     zs_dtype_name(dt), (long long)n, (long long)bad, 70 + k);
            for (int w = 0; w < 2; w++) { /* Inf, then NaN, at the end */
                zs_tensor *h = zt_rand(dt, 1, &n, 80);
                if (dt == ZS_F32)
                    ((float *)zs_data(h))[n - 1] = w ? NAN : INFINITY;
                else
                    ((double *)zs_data(h))[n - 1] = w ? NAN : -INFINITY;
                zs_tensor *f = zs_zeros(ZS_F32, ZS_SHAPE(1));
                ZT_CHECK(zs_unscale_(h, f, 0.5) == ZS_OK && zs_get(f, 0) == 1,
                         "%s n=%lld: %s found", zs_dtype_name(dt), (long long)n,
                         w ? "NaN" : "Inf");
                zs_release(h);
                zs_release(f);
            }
            free(ref);
            zs_release(g);
            zs_release(flag);
        }
    }
    zs_tensor *g = zt_rand(ZS_F32, ZS_SHAPE(4, 6), 1), *f = zs_zeros(ZS_F32, ZS_SHAPE(1));
    zs_tensor *gt = zs_transpose(g, 0, 1), *fi = zs_zeros(ZS_I32, ZS_SHAPE(1));
    zs_tensor *g16 = zs_zeros(ZS_BF16, ZS_SHAPE(3)), *f2 = zs_zeros(ZS_F32, ZS_SHAPE(2));
    ZT_EXPECT_ERROR(zs_unscale_(gt, f, 1) != ZS_OK, "unscale_: gradient f32 [6, 4] (strided)");
    ZT_EXPECT_ERROR(zs_unscale_(g16, f, 1) != ZS_OK, "expected a contiguous f32 or f64");
    ZT_EXPECT_ERROR(zs_unscale_(g, fi, 1) != ZS_OK, "found_inf i32");
    ZT_EXPECT_ERROR(zs_unscale_(g, f2, 1) != ZS_OK, "expected one f32 element");
    ZT_EXPECT_ERROR(zs_unscale_(g, f, 0) != ZS_OK, "inverse scale 0");
    ZT_EXPECT_ERROR(zs_unscale_(g, f, INFINITY) != ZS_OK, "expected a finite value > 0");
    zs_tensor *t[] = {g, f, gt, fi, g16, f2};
    for (int i = 0; i < 6; i++)
        zs_release(t[i]);
    zt_section("unscale_: x * inv and the Inf/NaN flag (f32, f64, sizes 1..100003)");
}

/* One step: loss = sum(p * c) (so grad = c), scaled; Inf or NaN injected
 * into the gradient when inject is 1 or 2. Returns the scaler's skip. */
static bool run_step(zs_grad_scaler *s, zs_optim *o, zs_tensor *p, zs_tensor *c,
                     int inject, int accum)
{
    zs_scope_push();
    for (int a = 0; a < accum; a++) {
        zs_tensor *l = zs_sum(zs_mul(p, c), 0, NULL, false);
        ZT_CHECK(zs_backward(zs_grad_scaler_scale(s, l), NULL, false) == ZS_OK, "backward");
    }
    if (inject && p->grad) /* a driver call: the test device's memory too */
        ZT_CHECK(zs_fill_(zs_narrow(p->grad, 0, 3, 1), inject == 1 ? INFINITY : NAN) ==
                 ZS_OK, "inject");
    ZT_CHECK(zs_grad_scaler_step(s, o, 0.125, 1.0) == ZS_OK, "step");
    bool skipped = zs_grad_scaler_skipped(s);
    ZT_CHECK(zs_grad_scaler_update(s) == ZS_OK, "update");
    zs_zero_grad(p, false);
    zs_scope_pop();
    return skipped;
}

static void test_script(int device)
{
    int64_t n = 37;
    zs_scope_push();
    zs_tensor *p = zs_to_device(zt_rand(ZS_F32, 1, &n, 90), device);
    zs_tensor *c = zs_to_device(zt_rand(ZS_F32, 1, &n, 91), device);
    zs_set_requires_grad(p, true);
    zs_optim_config oc = {ZS_SGD, 0.125, 0, false, 0, 0, 0, 0};
    zs_optim *o = zs_optim_new(&oc, 1, &p);
    zs_grad_scaler_config sc = zs_grad_scaler_defaults();
    sc.init_scale = 1024;
    sc.growth_interval = 3;
    zs_grad_scaler *s = zs_grad_scaler_new(&sc);
    /* Inf at steps 2 and 3 (twice in a row), NaN at 8 */
    int inject[12] = {0, 0, 1, 1, 0, 0, 0, 0, 2, 0, 0, 0};
    double scale = 1024;
    int tracker = 0, wrong_skip = 0, wrong_scale = 0, wrong_p = 0;
    for (int step = 0; step < 12; step++) {
        zs_scope_push();
        double *before = zt_values(zs_to_device(p, ZS_CPU)), *cv = zt_values(zs_to_device(c, ZS_CPU));
        ZT_CHECK(zs_grad_scaler_get_scale(s) == scale, "step %d: scale %g, expected %g",
                 step, zs_grad_scaler_get_scale(s), scale);
        wrong_scale += zs_grad_scaler_get_scale(s) != scale;
        bool skipped = run_step(s, o, p, c, inject[step], 1);
        wrong_skip += skipped != (inject[step] != 0);
        double *after = zt_values(zs_to_device(p, ZS_CPU));
        for (int64_t i = 0; i < n; i++) {
            /* clean: p - lr * c exactly (the scale is a power of 2) */
            float want = inject[step] ? (float)before[i]
                                      : (float)before[i] - 0.125f * (float)cv[i];
            wrong_p += (float)after[i] != want;
        }
        if (inject[step]) {
            scale *= 0.5;
            tracker = 0;
        } else if (++tracker == 3) {
            scale *= 2;
            tracker = 0;
        }
        free(before);
        free(after);
        free(cv);
        zs_scope_pop();
    }
    ZT_CHECK(wrong_skip == 0 && wrong_scale == 0 && wrong_p == 0,
             "%s: %d steps skipped wrongly, %d scales wrong, %d parameter values "
             "wrong (untouched on skipped steps, p - lr c on clean ones)",
             zs_device_name(device), wrong_skip, wrong_scale, wrong_p);
    ZT_CHECK(zs_grad_scaler_get_scale(s) == 512 && zs_grad_scaler_growth_tracker(s) == 0,
             "final scale %g (1024 / 2 / 2 * 2 * 2 / 2 * 2 = 512... tracker %lld)",
             zs_grad_scaler_get_scale(s), (long long)zs_grad_scaler_growth_tracker(s));
    zs_grad_scaler_free(s);
    zs_optim_free(o);
    zs_scope_pop();
}

static void test_skips(void)
{
    test_script(ZS_CPU);
    zt_section("injected Inf/NaN: exactly those steps skipped, parameters untouched, "
               "scale halves then doubles after 3 clean steps");
    if (zs_test_device_enable() == ZS_OK)
        test_script(ZS_TEST_DEVICE);
    zt_section("the same script on the test device (driver calls only)");
}

/* Accumulation (two scaled micro-batches, one unscale) and clipping after
 * unscale: the norm is the unscaled gradient's. */
static void test_accum_clip(void)
{
    int64_t n = 11;
    zs_tensor *p = zt_rand(ZS_F32, 1, &n, 95), *c = zt_rand(ZS_F32, 1, &n, 96);
    zs_set_requires_grad(p, true);
    zs_grad_scaler *s = zs_grad_scaler_new(NULL);
    ZT_CHECK(s && zs_grad_scaler_get_scale(s) == 65536, "default scale 2^16");
    for (int a = 0; a < 2; a++) {
        zs_scope_push();
        zs_tensor *l = zs_sum(zs_mul(p, c), 0, NULL, false);
        zs_backward(zs_grad_scaler_scale(s, l), NULL, false);
        zs_scope_pop();
    }
    ZT_CHECK(zs_grad_scaler_unscale(s, 1, &p) == ZS_OK && !zs_grad_scaler_found_inf(s),
             "unscale");
    double ss = 0, err = 0;
    for (int64_t i = 0; i < n; i++) {
        double want = 2 * (double)(float)zs_get(c, i);
        ss += want * want;
        err = fmax(err, fabs(zs_get(p->grad, i) - want));
    }
    ZT_CHECK(err < 1e-6, "accumulated gradient 2c after unscale (error %g)", err);
    double norm = zs_clip_grad_norm(1, &p, 0.5);
    ZT_CHECK(fabs(norm - sqrt(ss)) < 1e-5 * sqrt(ss), "clip sees the unscaled norm %g "
             "(expected %g)", norm, sqrt(ss));
    ZT_EXPECT_ERROR(zs_grad_scaler_unscale(s, 1, &p) != ZS_OK, "unscale called twice");
    zs_optim_config oc = {ZS_SGD, 0.1, 0, false, 0, 0, 0, 0};
    zs_optim *o = zs_optim_new(&oc, 1, &p);
    ZT_CHECK(zs_grad_scaler_step(s, o, 0.1, 1) == ZS_OK && !zs_grad_scaler_skipped(s),
             "step after unscale and clip");
    ZT_EXPECT_ERROR(zs_grad_scaler_step(s, o, 0.1, 1) != ZS_OK, "step called twice");
    ZT_CHECK(zs_grad_scaler_update(s) == ZS_OK && zs_grad_scaler_growth_tracker(s) == 1,
             "one clean step counted");
    ZT_EXPECT_ERROR(zs_grad_scaler_update(s) != ZS_OK, "update before unscale");
    zs_grad_scaler_set_found_inf(s, false);
    ZT_CHECK(zs_grad_scaler_set_state(s, 8, 5) == ZS_OK && zs_grad_scaler_get_scale(s) == 8 &&
             zs_grad_scaler_growth_tracker(s) == 5, "set_state");
    ZT_EXPECT_ERROR(zs_grad_scaler_set_state(s, 0, 0) != ZS_OK, "expected a finite scale");
    ZT_EXPECT_ERROR(zs_grad_scaler_set_state(s, 1, -1) != ZS_OK, "tracker >= 0");
    zs_optim_free(o);
    zs_grad_scaler_free(s);
    zs_release(p);
    zs_release(c);
    zs_grad_scaler_config bad[] = {
        {0, 2, 0.5, 10}, {INFINITY, 2, 0.5, 10}, {1, 1, 0.5, 10}, {1, 2, 1, 10},
        {1, 2, 0, 10}, {1, 2, 0.5, 0}, {NAN, 2, 0.5, 1},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        ZT_EXPECT_ERROR(zs_grad_scaler_new(&bad[i]) == NULL, "grad_scaler: bad config");
    zt_section("accumulation, clipping after unscale, state, errors");
}

int main(void)
{
    int64_t live = zt_live_bytes();
    test_unscale_pass();
    test_skips();
    test_accum_clip();
    ZT_CHECK(zt_live_bytes() == live, "no leak: %lld bytes live, %lld at start",
             (long long)zt_live_bytes(), (long long)live);
    return zt_done();
}
