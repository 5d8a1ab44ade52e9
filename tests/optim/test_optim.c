/*
 * test_optim.c - SGD (momentum, Nesterov, weight decay), Adam and AdamW
 * against float64 re-implementations of PyTorch's update rules over
 * several steps; learning-rate schedules; gradient clipping; bad configs.
 */
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

#define N 1037 /* odd, spans several threads' chunks */

typedef struct ref_state {
    double p[N], m[N], v[N];
} ref_state;

static void ref_step(const zs_optim_config *c, ref_state *s, const double *g,
                     int t, double lr)
{
    double b1 = c->beta1 ? c->beta1 : 0.9, b2 = c->beta2 ? c->beta2 : 0.999;
    double eps = c->eps ? c->eps : 1e-8;
    for (int i = 0; i < N; i++) {
        double gi = g[i];
        if (c->kind == ZS_SGD) {
            gi += c->weight_decay * s->p[i];
            if (c->momentum > 0) {
                s->m[i] = t == 1 ? gi : c->momentum * s->m[i] + gi;
                gi = c->nesterov ? gi + c->momentum * s->m[i] : s->m[i];
            }
            s->p[i] -= lr * gi;
            continue;
        }
        if (c->kind == ZS_ADAMW)
            s->p[i] *= 1 - lr * c->weight_decay;
        else
            gi += c->weight_decay * s->p[i];
        s->m[i] = b1 * s->m[i] + (1 - b1) * gi;
        s->v[i] = b2 * s->v[i] + (1 - b2) * gi * gi;
        double mh = s->m[i] / (1 - pow(b1, t)), vh = s->v[i] / (1 - pow(b2, t));
        s->p[i] -= lr * mh / (sqrt(vh) + eps);
    }
}

static void run_case(const char *name, zs_optim_config c)
{
    zs_tensor *p = zt_rand(ZS_F32, ZS_SHAPE(N), 5);
    zs_set_requires_grad(p, true);
    ref_state *s = calloc(1, sizeof *s);
    for (int i = 0; i < N; i++)
        s->p[i] = zs_get(p, i);
    zs_optim *o = zs_optim_new(&c, 1, &p);
    ZT_CHECK(o != NULL, "%s: new", name);
    double worst = 0;
    for (int t = 1; t <= 5; t++) {
        zs_tensor *g = zt_rand(ZS_F32, ZS_SHAPE(N), 100 + t);
        double gd[N];
        for (int i = 0; i < N; i++)
            gd[i] = zs_get(g, i);
        zs_release(p->grad);
        p->grad = g;
        double lr = c.lr * (1.0 - 0.1 * t);
        zs_optim_step(o, lr);
        ref_step(&c, s, gd, t, lr);
        for (int i = 0; i < N; i++)
            worst = fmax(worst, fabs(zs_get(p, i) - s->p[i]));
    }
    ZT_CHECK(worst < 2e-6, "%s: max |p - ref| = %g after 5 steps", name, worst);
    ZT_CHECK(zs_optim_steps(o) == 5, "%s: step count", name);
    zs_optim_free(o);
    zs_release(p);
    free(s);
}

static void test_rules(void)
{
    run_case("sgd", (zs_optim_config){ZS_SGD, 0.1, 0, false, 0, 0, 0, 0});
    run_case("sgd momentum wd", (zs_optim_config){ZS_SGD, 0.1, 0.9, false, 1e-2, 0, 0, 0});
    run_case("sgd nesterov", (zs_optim_config){ZS_SGD, 0.1, 0.9, true, 0, 0, 0, 0});
    run_case("adam", (zs_optim_config){ZS_ADAM, 1e-2, 0, false, 0, 0, 0, 0});
    run_case("adam l2", (zs_optim_config){ZS_ADAM, 1e-2, 0, false, 0.1, 0.8, 0.99, 1e-6});
    run_case("adamw", (zs_optim_config){ZS_ADAMW, 1e-2, 0, false, 0.1, 0, 0, 0});
    /* beta2 near 1: (1 - beta2) and the bias corrections must come from
     * double (a float-rounded 0.9999 makes 1 - beta2 off by 1.7e-4) */
    run_case("adam beta2 0.9999", (zs_optim_config){ZS_ADAM, 1e-2, 0, false, 0, 0.9, 0.9999, 1e-8});
    run_case("adamw beta2 0.99999", (zs_optim_config){ZS_ADAMW, 1e-2, 0, false, 0.1, 0.95, 0.99999, 1e-8});
    zt_section("update rules vs float64 reference");
}

static void test_schedules_and_clip(void)
{
    zs_lr_schedule cos = {ZS_LR_COSINE, 1.0, 10, 110, 0.1, 0, 0};
    ZT_CHECK(fabs(zs_lr_at(&cos, 0) - 0.1) < 1e-12, "warm-up starts at base/warmup");
    ZT_CHECK(fabs(zs_lr_at(&cos, 9) - 1.0) < 1e-12, "warm-up reaches base");
    ZT_CHECK(fabs(zs_lr_at(&cos, 60) - 0.55) < 1e-12, "cosine midpoint %g", zs_lr_at(&cos, 60));
    ZT_CHECK(fabs(zs_lr_at(&cos, 500) - 0.1) < 1e-12, "cosine floor");
    zs_lr_schedule st = {ZS_LR_STEP, 1.0, 0, 0, 0, 30, 0.1};
    ZT_CHECK(fabs(zs_lr_at(&st, 29) - 1.0) < 1e-12 && fabs(zs_lr_at(&st, 65) - 0.01) < 1e-12,
             "step schedule");
    zs_tensor *a = zs_ones(ZS_F32, ZS_SHAPE(3)), *b = zs_ones(ZS_F32, ZS_SHAPE(4, 4));
    a->grad = zs_full(ZS_F32, ZS_SHAPE(3), 3.0);     /* |.|^2 = 27 */
    b->grad = zs_full(ZS_F32, ZS_SHAPE(4, 4), 1.0);  /* 16 */
    zs_tensor *ps[] = {a, b};
    double n0 = zs_clip_grad_norm(2, ps, 1.0);
    ZT_CHECK(fabs(n0 - sqrt(43.0)) < 1e-9, "norm before clipping %g", n0);
    double n1 = zs_clip_grad_norm(2, ps, 100.0);
    ZT_CHECK(fabs(n1 - 1.0) < 1e-5, "norm after clipping %g", n1);
    zs_release(a);
    zs_release(b);
    /* a gradient of many pool chunks (the vectorised, multi-threaded norm
     * and scale): the float64 reference, the same bits on 1 and 2 threads */
    int64_t big = 3000017;
    zs_tensor *c = zs_ones(ZS_F32, ZS_SHAPE(big));
    c->grad = zt_rand(ZS_F32, ZS_SHAPE(big), 11);
    double ref = 0;
    const float *gd = zs_data(c->grad);
    for (int64_t i = 0; i < big; i++)
        ref += (double)gd[i] * gd[i];
    ref = sqrt(ref);
    int nt = zs_num_threads();
    zs_set_num_threads(1);
    double m1 = zs_clip_grad_norm(1, &c, 1e9);
    zs_set_num_threads(2);
    double m2 = zs_clip_grad_norm(1, &c, 1e9);
    double m3 = zs_clip_grad_norm(1, &c, 2.0); /* scales to norm 2 */
    double m4 = zs_clip_grad_norm(1, &c, 1e9);
    zs_set_num_threads(nt);
    ZT_CHECK(fabs(m1 - ref) < 1e-9 * ref && m1 == m2 && m3 == m1 &&
             fabs(m4 - 2.0) < 1e-5, "3M-element norm %.12g (1 thread) %.12g (2) vs "
             "%.12g; after clipping to 2: %g", m1, m2, ref, m4);
    zs_release(c);
    zt_section("schedules and clipping");
}

/* Two copies of one parameter: one clipped in place then stepped, the
 * other stepped with the clip factor fused into the update. Same bits,
 * every optimizer; the fused path leaves its gradient unscaled. */
static void fused_case(const char *name, zs_optim_config c)
{
    zs_tensor *pa = zt_rand(ZS_F32, ZS_SHAPE(N), 7), *pb = zs_clone(pa);
    zs_optim *oa = zs_optim_new(&c, 1, &pa), *ob = zs_optim_new(&c, 1, &pb);
    bool same = oa && ob, grad_kept = true;
    for (int t = 1; t <= 4 && same; t++) {
        zs_tensor *g = zt_rand(ZS_F32, ZS_SHAPE(N), 200 + t);
        zs_release(pa->grad);
        zs_release(pb->grad);
        pa->grad = zs_mul_scalar(g, 3.0); /* norm ~ 3 sqrt(N/3) > max */
        pb->grad = zs_clone(pa->grad);
        zs_tensor *g0 = zs_clone(pb->grad);
        double max = t == 3 ? 1e9 : 2.5; /* step 3 is not clipped */
        double na = zs_clip_grad_norm(1, &pa, max);
        double nb = zs_grad_norm(1, &pb);
        zs_optim_step(oa, 0.01);
        zs_optim_step_scaled(ob, 0.01, zs_clip_coef(nb, max));
        same = na == nb && memcmp(zs_data(pa), zs_data(pb), N * sizeof(float)) == 0;
        grad_kept = grad_kept && memcmp(zs_data(g0), zs_data(pb->grad), N * sizeof(float)) == 0;
        zs_release(g);
        zs_release(g0);
    }
    ZT_CHECK(same, "%s: clip then step == step with the clip factor fused", name);
    ZT_CHECK(grad_kept, "%s: the fused step leaves .grad unscaled", name);
    ZT_EXPECT_ERROR(zs_optim_step_scaled(ob, 0.01, 0.0) != ZS_OK, "gradient scale");
    ZT_EXPECT_ERROR(zs_optim_step_scaled(ob, 0.01, NAN) != ZS_OK, "gradient scale");
    zs_optim_free(oa);
    zs_optim_free(ob);
    zs_release(pa);
    zs_release(pb);
}

static void test_fused_clip(void)
{
    fused_case("sgd", (zs_optim_config){ZS_SGD, 0.1, 0, false, 1e-2, 0, 0, 0});
    fused_case("sgd nesterov", (zs_optim_config){ZS_SGD, 0.1, 0.9, true, 1e-2, 0, 0, 0});
    fused_case("adam l2", (zs_optim_config){ZS_ADAM, 1e-2, 0, false, 0.1, 0, 0, 0});
    fused_case("adamw", (zs_optim_config){ZS_ADAMW, 1e-2, 0, false, 0.1, 0.9, 0.95, 0});
    ZT_CHECK(zs_clip_coef(NAN, 1.0) == 1.0 && zs_clip_coef(0.5, 1.0) == 1.0 &&
             zs_clip_coef(4.0, 0) == 1.0 && fabs(zs_clip_coef(4.0, 1.0) - 1 / (4 + 1e-6)) < 1e-15,
             "clip coefficient");
    zt_section("clipping fused into the update");
}

static void test_errors(void)
{
    zs_tensor *p = zs_ones(ZS_F64, ZS_SHAPE(3));
    zs_optim_config c = {ZS_ADAM, 1e-3, 0, false, 0, 0, 0, 0};
    ZT_EXPECT_ERROR(zs_optim_new(&c, 1, &p) == NULL, "not a contiguous f32");
    c.lr = -1;
    ZT_EXPECT_ERROR(zs_optim_new(&c, 0, NULL) == NULL, "bad config");
    c = (zs_optim_config){ZS_ADAM, 1e-3, 0, false, 0, 1.5, 0.9, 0};
    ZT_EXPECT_ERROR(zs_optim_new(&c, 0, NULL) == NULL, "bad config");
    zs_release(p);
    zt_section("errors");
}

int main(void)
{
    test_rules();
    test_schedules_and_clip();
    test_fused_clip();
    test_errors();
    return zt_done();
}
