/*
 * test_optim.c - SGD (momentum, Nesterov, weight decay), Adam and AdamW
 * against float64 re-implementations of PyTorch's update rules over
 * several steps; learning-rate schedules; gradient clipping; bad configs;
 * the descriptors the optimizer runs (sgd_update, adam_update,
 * sum_squares) called directly: the zsk loops' bits, float64 references,
 * error paths; the public fused updates (zs_sgd_update_, zs_adam_update_,
 * zs_sum_squares) and zs_optim_step against the zsk loops with the
 * scalars computed as the optimizer computed them before (bits).
 */
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/optim.h"
#include "ops/op.h"
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

/* ---- the descriptors ------------------------------------------------------ */

/* The attribute structs of ops/optim_update.c's descriptors (the same
 * layout). */
typedef struct { zsk_sgd_args s; } sgd_attrs;
typedef struct { zsk_adam_args a; } adam_attrs;

static bool same_bits(const zs_tensor *a, const zs_tensor *b)
{
    return zs_nbytes(a) == zs_nbytes(b) && memcmp(zs_data(a), zs_data(b), zs_nbytes(a)) == 0;
}

/* adam_update and sgd_update against one call of the zsk loop over the
 * whole buffers (the pool splits them; each element's arithmetic is the
 * same): bit-identical. */
static void test_update_descriptors(void)
{
    int64_t n = 70007; /* 7 x 10001 */
    zs_tensor *p = zt_rand(ZS_F32, ZS_SHAPE(n), 1), *g = zt_rand(ZS_F32, ZS_SHAPE(n), 2);
    zs_tensor *m = zt_rand(ZS_F32, ZS_SHAPE(n), 3), *v = zs_mul(m, m);
    zs_tensor *p2 = zs_clone(p), *m2 = zs_clone(m), *v2 = zs_clone(v);
    adam_attrs aa = {{.b2 = 0.999f, .one_m_b1 = 0.1f, .one_m_b2 = 0.001f, .eps = 1e-8f,
                      .wd = 0.1f, .decay = 0.999f, .step_size = 0.01f,
                      .bc2_sqrt = 0.05f, .gscale = 0.5f, .decoupled = true}};
    for (int k = 0; k < 2; k++) {
        aa.a.decoupled = k == 0;
        zs_tensor *r = zsi_run(&zsi_def_adam_update, 4, (zs_tensor *[]){p, g, m, v}, &aa);
        zsk_adam_f32(&aa.a, zs_data(p2), zs_data(m2), zs_data(v2), zs_data(g), n);
        ZT_CHECK(r == p && same_bits(p, p2) && same_bits(m, m2) && same_bits(v, v2),
                 "adam_update (%s) = zsk_adam_f32, bits of p, m, v",
                 k ? "adam" : "adamw");
        zs_release(r);
    }
    sgd_attrs sa = {{.lr = 0.1f, .wd = 0.01f, .mu = 0.9f, .gscale = 1, .nesterov = true}};
    for (int k = 0; k < 2; k++) {
        sa.s.first = k == 0;
        zs_tensor *r = zsi_run(&zsi_def_sgd_update, 3, (zs_tensor *[]){p, g, m}, &sa);
        zsk_sgd_f32(&sa.s, zs_data(p2), zs_data(m2), zs_data(g), n);
        ZT_CHECK(r == p && same_bits(p, p2) && same_bits(m, m2),
                 "sgd_update with momentum (%s step) = zsk_sgd_f32", k ? "later" : "first");
        zs_release(r);
    }
    zs_tensor *r = zsi_run(&zsi_def_sgd_update, 2, (zs_tensor *[]){p, g}, &sa);
    zsk_sgd_f32(&sa.s, zs_data(p2), NULL, zs_data(g), n);
    ZT_CHECK(r == p && same_bits(p, p2), "sgd_update without momentum = zsk_sgd_f32");
    zs_release(r);

    /* errors: shapes, dtypes, layouts, arity */
    zs_tensor *g3 = zt_rand(ZS_F32, ZS_SHAPE(3), 4), *gd = zs_to_dtype(g, ZS_F64);
    zs_tensor *gr = zs_reshape(g, ZS_SHAPE(7, 10001)), *gt = zs_transpose(gr, 0, 1);
    ZT_EXPECT_ERROR(zsi_run(&zsi_def_adam_update, 4, (zs_tensor *[]){p, g3, m, v}, &aa) == NULL,
                    "adam_update: input 1 is f32 [3], expected a contiguous f32 tensor of "
                    "70007 elements");
    ZT_EXPECT_ERROR(zsi_run(&zsi_def_adam_update, 4, (zs_tensor *[]){p, gd, m, v}, &aa) == NULL,
                    "adam_update: input 1 is f64 [70007]");
    ZT_EXPECT_ERROR(zsi_run(&zsi_def_sgd_update, 3, (zs_tensor *[]){p, gt, m}, &sa) == NULL,
                    "sgd_update: input 1 is f32 [10001, 7]");
    ZT_EXPECT_ERROR(zsi_run(&zsi_def_sgd_update, 1, &p, &sa) == NULL,
                    "sgd_update: 1 inputs, expected the parameter");
    ZT_EXPECT_ERROR(zsi_run(&zsi_def_adam_update, 3, (zs_tensor *[]){p, g, m}, &aa) == NULL,
                    "adam_update: 3 inputs, expected 4");
    zs_tensor *ts[] = {p, g, m, v, p2, m2, v2, g3, gd, gr, gt};
    for (size_t i = 0; i < sizeof ts / sizeof *ts; i++)
        zs_release(ts[i]);

    /* an optimizer over a non-leaf that requires grad: refused under grad
     * mode (the driver's in-place rule), nothing written */
    zs_tensor *leaf = zt_rand(ZS_F32, ZS_SHAPE(5), 5);
    zs_set_requires_grad(leaf, true);
    zs_tensor *q = zs_mul_scalar(leaf, 1.0);
    zs_optim_config c = {ZS_ADAM, 1e-3, 0, false, 0, 0, 0, 0};
    zs_optim *o = zs_optim_new(&c, 1, &q);
    q->grad = zs_ones(ZS_F32, ZS_SHAPE(5));
    double q0 = zs_get(q, 0);
    ZT_EXPECT_ERROR(o && zs_optim_step(o, 0.1) < 0,
                    "adam_update: the destination requires grad and is not a leaf");
    ZT_CHECK(zs_get(q, 0) == q0, "the refused step wrote nothing");
    zs_optim_free(o);
    zs_release(q);
    zs_release(leaf);
    zt_section("sgd_update and adam_update: the zsk loops' bits; errors");
}

/* The norm as zs_grad_norm summed it before it ran sum_squares: one
 * running double, zsk_sumsq_f32 for contiguous f32, else element by
 * element. */
static double old_grad_norm(int n, zs_tensor **params)
{
    double total = 0;
    for (int i = 0; i < n; i++) {
        zs_tensor *g = params[i]->grad;
        if (g && g->dtype == ZS_F32 && zs_is_contiguous(g)) {
            total += zsk_sumsq_f32(zs_data(g), zs_numel(g));
        } else if (g) {
            for (int64_t k = 0; k < zs_numel(g); k++)
                total += zs_get(g, k) * zs_get(g, k);
        }
    }
    return sqrt(total);
}

static void test_sum_squares(void)
{
    /* float64 reference: each f32 square is exact in double; 2e5 rounded
     * additions in double stay within 1e-11 relative */
    int64_t n = 200003;
    zs_tensor *x = zt_rand(ZS_F32, ZS_SHAPE(n), 7);
    const float *xd = zs_data(x);
    long double ref = 0;
    for (int64_t i = 0; i < n; i++)
        ref += (long double)xd[i] * xd[i];
    zs_tensor *s = zsi_run(&zsi_def_sum_squares, 1, &x, NULL);
    ZT_CHECK(s && s->dtype == ZS_F64 && s->ndim == 0 &&
             fabs(zs_item(s) - (double)ref) < 1e-11 * (double)ref &&
             zs_item(s) == zsk_sumsq_f32(xd, n),
             "sum_squares f32 (pool) %.17g vs %.17g, the zsk bits", s ? zs_item(s) : 0,
             (double)ref);
    zs_tensor *y = zt_rand_strided(ZS_F64, ZS_SHAPE(31, 17), 8);
    zs_tensor *t = zsi_run(&zsi_def_sum_squares, 2, (zs_tensor *[]){y, s}, NULL);
    double want = zs_item(s);
    for (int64_t k = 0; k < 31 * 17; k++)
        want += zs_get(y, k) * zs_get(y, k);
    ZT_CHECK(t && zs_item(t) == want, "sum_squares strided f64 onto a running total: "
             "the bits of one loop");

    /* zs_grad_norm: mixed dtypes and layouts, same bits as before */
    zs_tensor *ps[4];
    for (int i = 0; i < 4; i++) {
        ps[i] = zs_zeros(ZS_F32, ZS_SHAPE(3));
        zs_set_requires_grad(ps[i], true);
    }
    ps[0]->grad = zt_rand(ZS_F32, ZS_SHAPE(100000), 9);
    ps[1]->grad = zt_rand_strided(ZS_F32, ZS_SHAPE(13, 29), 10);
    ps[2]->grad = zt_rand(ZS_F64, ZS_SHAPE(77), 11);
    ps[3]->grad = zt_rand(ZS_BF16, ZS_SHAPE(50), 12);
    double a = zs_grad_norm(4, ps), b = old_grad_norm(4, ps);
    ZT_CHECK(a == b, "zs_grad_norm %.17g = the old loop's %.17g (f32, strided f32, "
             "f64, bf16 gradients)", a, b);

    ZT_EXPECT_ERROR(zsi_run(&zsi_def_sum_squares, 2, (zs_tensor *[]){y, x}, NULL) == NULL,
                    "sum_squares: running total f32 [200003], expected one f64 element");
    zs_tensor *i32 = zs_zeros(ZS_I32, ZS_SHAPE(3));
    ZT_EXPECT_ERROR(zsi_run(&zsi_def_sum_squares, 1, &i32, NULL) == NULL,
                    "sum_squares: dtype i32 is not supported");
    ZT_EXPECT_ERROR(zsi_run(&zsi_def_sum_squares, 3, (zs_tensor *[]){y, s, s}, NULL) == NULL,
                    "sum_squares: 3 inputs");
    zs_release(ps[3]->grad);
    ps[3]->grad = zs_zeros(ZS_I32, ZS_SHAPE(3));
    ZT_EXPECT_ERROR(isnan(zs_grad_norm(4, ps)), "sum_squares: dtype i32");
    zs_tensor *ts[] = {x, s, y, t, i32, ps[0], ps[1], ps[2], ps[3]};
    for (size_t i = 0; i < sizeof ts / sizeof *ts; i++)
        zs_release(ts[i]);
    zt_section("sum_squares vs float64 and the old norm's bits; errors");
}

/* ---- the public fused updates ---------------------------------------------- */

/* The scalars as zs_optim_step computed them when it ran the descriptors
 * itself (double, rounded to float once). */
static void old_step_args(const zs_optim_config *c, int64_t steps, double lr,
                          double gscale, zsk_sgd_args *s, zsk_adam_args *a)
{
    double t = (double)steps;
    *a = (zsk_adam_args){
        .b2 = (float)c->beta2, .one_m_b1 = (float)(1 - c->beta1),
        .one_m_b2 = (float)(1 - c->beta2), .eps = (float)c->eps,
        .wd = (float)c->weight_decay,
        .decay = c->kind == ZS_ADAMW ? (float)(1 - lr * c->weight_decay) : 1.0f,
        .step_size = (float)(lr / (1 - pow(c->beta1, t))),
        .bc2_sqrt = (float)sqrt(1 - pow(c->beta2, t)),
        .gscale = (float)gscale, .decoupled = c->kind == ZS_ADAMW,
    };
    *s = (zsk_sgd_args){(float)lr, (float)c->weight_decay, (float)c->momentum,
                        (float)gscale, c->nesterov, steps == 1};
}

/* zs_optim over SGD (momentum, Nesterov), Adam, AdamW for 3 steps with a
 * gradient scale, against the zsk loops run on copies with the old
 * scalars: the same bits for p and the state. zs_adam_update_ and
 * zs_sgd_update_ called directly likewise; step < 1 refused. */
static void test_fused_updates(void)
{
    int64_t n = 20011;
    zs_optim_config cfgs[] = {
        {ZS_SGD, 0, 0.9, true, 0.01, 0, 0, 0},
        {ZS_SGD, 0, 0, false, 0.01, 0, 0, 0},
        {ZS_ADAM, 0, 0, false, 0.01, 0.9, 0.9999, 1e-8},
        {ZS_ADAMW, 0, 0, false, 0.1, 0.8, 0.999, 1e-6},
    };
    bool same = true;
    for (size_t k = 0; k < sizeof cfgs / sizeof *cfgs; k++) {
        const zs_optim_config *c = &cfgs[k];
        zs_tensor *p = zt_rand(ZS_F32, ZS_SHAPE(n), 20 + k);
        zs_set_requires_grad(p, true);
        zs_tensor *p2 = zs_clone(p), *m2 = zs_zeros(ZS_F32, ZS_SHAPE(n));
        zs_tensor *v2 = zs_zeros(ZS_F32, ZS_SHAPE(n));
        zs_optim *o = zs_optim_new(c, 1, &p);
        for (int64_t t = 1; t <= 3; t++) {
            double lr = 0.01 * (double)t, gs = 0.75;
            zs_release(p->grad);
            p->grad = zt_rand(ZS_F32, ZS_SHAPE(n), 40 + (uint64_t)(k * 10 + t));
            same = same && o && zs_optim_step_scaled(o, lr, gs) == ZS_OK;
            zsk_sgd_args sa;
            zsk_adam_args aa;
            old_step_args(c, t, lr, gs, &sa, &aa);
            if (c->kind == ZS_SGD)
                zsk_sgd_f32(&sa, zs_data(p2), c->momentum > 0 ? zs_data(m2) : NULL,
                            zs_data(p->grad), n);
            else
                zsk_adam_f32(&aa, zs_data(p2), zs_data(m2), zs_data(v2),
                             zs_data(p->grad), n);
        }
        zs_tensor *m = zs_optim_moment(o, 0, 0), *v = zs_optim_moment(o, 1, 0);
        same = same && same_bits(p, p2) && (!m || same_bits(m, m2)) &&
               (!v || same_bits(v, v2));
        zs_optim_free(o);
        zs_tensor *ts[] = {p, p2, m2, v2};
        for (size_t i = 0; i < sizeof ts / sizeof *ts; i++)
            zs_release(ts[i]);
    }
    ZT_CHECK(same, "zs_optim_step (SGD+Nesterov, SGD, Adam, AdamW; 3 steps, grad "
             "scale) = the zsk loops with the old scalars, bits of p and state");

    zs_tensor *p = zt_rand(ZS_F32, ZS_SHAPE(n), 60), *g = zt_rand(ZS_F32, ZS_SHAPE(n), 61);
    zs_tensor *m = zt_rand(ZS_F32, ZS_SHAPE(n), 62), *v = zs_mul(m, m);
    zs_tensor *p2 = zs_clone(p), *m2 = zs_clone(m), *v2 = zs_clone(v);
    zs_adam_step as = {1e-3, 0.9, 0.95, 1e-8, 0.1, true, 7, 0.5};
    zs_optim_config ac = {ZS_ADAMW, 0, 0, false, 0.1, 0.9, 0.95, 1e-8};
    zsk_sgd_args sa;
    zsk_adam_args aa;
    old_step_args(&ac, 7, 1e-3, 0.5, &sa, &aa);
    zsk_adam_f32(&aa, zs_data(p2), zs_data(m2), zs_data(v2), zs_data(g), n);
    ZT_CHECK(zs_adam_update_(p, g, m, v, &as) == ZS_OK && same_bits(p, p2) &&
             same_bits(m, m2) && same_bits(v, v2),
             "zs_adam_update_ (AdamW, step 7) = zsk_adam_f32, bits of p, m, v");
    zs_sgd_step ss = {0.1, 0.9, 0.01, false, 1, 1.0};
    zs_optim_config sc = {ZS_SGD, 0, 0.9, false, 0.01, 0, 0, 0};
    old_step_args(&sc, 1, 0.1, 1.0, &sa, &aa);
    zsk_sgd_f32(&sa, zs_data(p2), zs_data(m2), zs_data(g), n);
    ZT_CHECK(zs_sgd_update_(p, g, m, &ss) == ZS_OK && same_bits(p, p2) &&
             same_bits(m, m2), "zs_sgd_update_ (momentum, first step) = zsk_sgd_f32");
    ss.step = 0;
    ZT_EXPECT_ERROR(zs_sgd_update_(p, g, m, &ss) < 0, "sgd_update: step 0, expected "
                    "the 1-based count");
    as.step = -2;
    ZT_EXPECT_ERROR(zs_adam_update_(p, g, m, v, &as) < 0, "adam_update: step -2");
    as.step = 1;
    ZT_EXPECT_ERROR(zs_adam_update_(p, g, NULL, v, &as) < 0, "");

    zs_tensor *s1 = zs_sum_squares(g, NULL), *s2 = zs_sum_squares(m, s1);
    double want = zsk_sumsq_f32(zs_data(g), n);
    want += zsk_sumsq_f32(zs_data(m), n);
    ZT_CHECK(s1 && s2 && s2->dtype == ZS_F64 && s2->ndim == 0 && zs_item(s2) == want,
             "zs_sum_squares with and without a running total: the zsk bits");
    ZT_CHECK(zs_sum_squares(NULL, s1) == NULL, "zs_sum_squares(NULL) is NULL");
    zs_tensor *ts[] = {p, g, m, v, p2, m2, v2, s1, s2};
    for (size_t i = 0; i < sizeof ts / sizeof *ts; i++)
        zs_release(ts[i]);
    zt_section("fused updates: zs_optim and zs_*_update_ keep the old bits; errors");
}

int main(void)
{
    test_rules();
    test_schedules_and_clip();
    test_fused_clip();
    test_errors();
    test_update_descriptors();
    test_sum_squares();
    test_fused_updates();
    return zt_done();
}
