/*
 * test_optim_dyn.c - the updates whose per-step scalars are read from
 * device memory (zs_sgd_update_dyn_, zs_adam_update_dyn_,
 * zs_optim_step_dyn) and the clip factor computed on the device
 * (zs_clip_coef_of), which a captured training step replays:
 *
 * - zs_optim_step_dyn with {lr, step} and zs_clip_coef_of's factor equals
 *   zs_optim_step_scaled with zs_clip_coef(zs_grad_norm) bit for bit (p
 *   and the state), SGD (plain, momentum + Nesterov), Adam, AdamW, over 4
 *   steps with a different lr each step, clipped and not clipped;
 * - the same calls captured once as a graph and replayed with new values
 *   in the step scalars give those bits too (nothing frozen);
 * - zs_clip_coef_of against zs_clip_coef (below, at, above max_norm, Inf;
 *   NaN stays NaN);
 * - errors: bad step scalars and scales (shape, dtype), a step < 1 or a
 *   NaN / zero scale refused when the kernel runs with nothing written,
 *   bad max_norm, 1-bit Adam refused.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
#include "zs/graph.h"

#define N 4099 /* odd, spans several of the pool's chunks */
#define STEPS 4

static bool same_bits(const zs_tensor *a, const zs_tensor *b)
{
    return a && b && zs_nbytes(a) == zs_nbytes(b) &&
           memcmp(zs_data(a), zs_data(b), zs_nbytes(a)) == 0;
}

static void set_sched(zs_tensor *sched, double lr, double step)
{
    double v[2] = {lr, step};
    ZT_CHECK(zs_copy_from_buffer(sched, v, sizeof v) == ZS_OK, "fill the step scalars");
}

/* Step t's gradient (3x a random tensor: its norm is ~100, so max 2.5
 * clips it), lr and max_norm (step 3 is not clipped). */
static zs_tensor *grad_of(int t)
{
    zs_tensor *r = zt_rand(ZS_F32, ZS_SHAPE(N), 300 + (uint64_t)t), *g = zs_mul_scalar(r, 3.0);
    zs_release(r);
    return g;
}
static double lr_of(int t) { return 0.01 * t; }
static double max_of(int t) { return t == 3 ? 1e9 : 2.5; }

/* The eager reference: zs_optim_step_scaled with the host clip factor. */
static zs_optim *run_eager(const zs_optim_config *c, zs_tensor *p)
{
    zs_optim *o = zs_optim_new(c, 1, &p);
    for (int t = 1; t <= STEPS && o; t++) {
        zs_release(p->grad);
        p->grad = grad_of(t);
        double coef = zs_clip_coef(zs_grad_norm(1, &p), max_of(t));
        ZT_CHECK(zs_optim_step_scaled(o, lr_of(t), coef) == ZS_OK, "eager step %d", t);
    }
    return o;
}

static void case_dyn(const char *name, zs_optim_config c)
{
    zs_tensor *pa = zt_rand(ZS_F32, ZS_SHAPE(N), 7), *pb = zs_clone(pa), *pc = zs_clone(pa);
    zs_optim *oa = run_eager(&c, pa);
    /* direct calls: the step scalars and the factor from device tensors */
    zs_optim *ob = zs_optim_new(&c, 1, &pb);
    zs_tensor *sched = zs_zeros(ZS_F64, ZS_SHAPE(2));
    for (int t = 1; t <= STEPS && ob; t++) {
        zs_release(pb->grad);
        pb->grad = grad_of(t);
        set_sched(sched, lr_of(t), (double)(zs_optim_steps(ob) + 1));
        zs_tensor *sq = zs_sum_squares(pb->grad, NULL), *k = zs_clip_coef_of(sq, max_of(t));
        ZT_CHECK(zs_optim_step_dyn(ob, sched, k) == ZS_OK, "%s: dyn step %d: %s", name, t,
                 zs_last_error());
        zs_optim_set_steps(ob, zs_optim_steps(ob) + 1);
        zs_release(sq);
        zs_release(k);
    }
    /* captured once (step 1), replayed for steps 2..4 with new step
     * scalars and a new gradient in the same buffer (max_norm is an
     * attribute: 2.5 throughout; step 3's gradient is small instead, so
     * that step is not clipped) */
    zs_optim *oc = zs_optim_new(&c, 1, &pc);
    pc->grad = zs_zeros(ZS_F32, ZS_SHAPE(N));
    zs_graph *g = NULL;
    bool replay_ok = true;
    for (int t = 1; t <= STEPS && oc; t++) {
        zs_tensor *gt = grad_of(t), *gs = t == 3 ? zs_mul_scalar(gt, 1e-3) : zs_clone(gt);
        zs_copy_(pc->grad, gs); /* step 3: below max */
        zs_release(gs);
        set_sched(sched, lr_of(t), (double)(zs_optim_steps(oc) + 1));
        if (!g) {
            g = zs_graph_capture_begin();
            zs_tensor *sq = zs_sum_squares(pc->grad, NULL), *k = zs_clip_coef_of(sq, 2.5);
            zs_status st = zs_optim_step_dyn(oc, sched, k);
            zs_status end = zs_graph_capture_end(g);
            replay_ok = st == ZS_OK && end == ZS_OK;
            zs_release(sq);
            zs_release(k);
        } else {
            replay_ok = replay_ok && zs_graph_replay(g) == ZS_OK;
        }
        zs_optim_set_steps(oc, zs_optim_steps(oc) + 1);
        zs_release(gt);
    }
    ZT_CHECK(replay_ok, "%s: capture and replays: %s", name, zs_last_error());
    /* the reference for the replayed run: eager with the same gradients */
    zs_tensor *pd = zt_rand(ZS_F32, ZS_SHAPE(N), 7);
    zs_optim *od = zs_optim_new(&c, 1, &pd);
    for (int t = 1; t <= STEPS && od; t++) {
        zs_tensor *gt = grad_of(t);
        zs_release(pd->grad);
        pd->grad = t == 3 ? zs_mul_scalar(gt, 1e-3) : zs_clone(gt);
        double coef = zs_clip_coef(zs_grad_norm(1, &pd), 2.5);
        zs_optim_step_scaled(od, lr_of(t), coef);
        zs_release(gt);
    }
    bool state_ab = true, state_dc = true;
    for (int w = 0; w < 2; w++) {
        zs_tensor *ma = zs_optim_moment(oa, w, 0), *mb = zs_optim_moment(ob, w, 0);
        zs_tensor *mc = zs_optim_moment(oc, w, 0), *md = zs_optim_moment(od, w, 0);
        state_ab = state_ab && (!ma || same_bits(ma, mb));
        state_dc = state_dc && (!md || same_bits(md, mc));
    }
    ZT_CHECK(same_bits(pa, pb) && state_ab, "%s: zs_optim_step_dyn == zs_optim_step_scaled "
             "(bits of p and state, %d steps, lr changing, clipped and not)", name, STEPS);
    ZT_CHECK(same_bits(pd, pc) && state_dc, "%s: one capture replayed with new step "
             "scalars == eager (bits)", name);
    ZT_CHECK(!same_bits(pa, pc), "%s: the test can fail (the two references differ)", name);
    zs_graph_free(g);
    zs_optim_free(oa);
    zs_optim_free(ob);
    zs_optim_free(oc);
    zs_optim_free(od);
    zs_tensor *ts[] = {pa, pb, pc, pd, sched};
    for (size_t i = 0; i < sizeof ts / sizeof *ts; i++)
        zs_release(ts[i]);
}

static void test_steps(void)
{
    case_dyn("sgd", (zs_optim_config){ZS_SGD, 0.1, 0, false, 1e-2, 0, 0, 0});
    case_dyn("sgd momentum nesterov", (zs_optim_config){ZS_SGD, 0.1, 0.9, true, 1e-2, 0, 0, 0});
    case_dyn("adam l2", (zs_optim_config){ZS_ADAM, 1e-2, 0, false, 0.1, 0, 0, 0});
    case_dyn("adamw", (zs_optim_config){ZS_ADAMW, 1e-2, 0, false, 0.1, 0.9, 0.95, 0});
    zt_section("updates with device step scalars == eager, direct and replayed");
}

static void test_clip_coef(void)
{
    double max = 2.0, sums[] = {0, 1, 4, 4.000001, 9, 1e30, INFINITY};
    bool same = true;
    for (size_t i = 0; i < sizeof sums / sizeof *sums; i++) {
        zs_tensor *q = zs_scalar(ZS_F64, sums[i]), *k = zs_clip_coef_of(q, max);
        double want = zs_clip_coef(sqrt(sums[i]), max);
        same = same && k && k->dtype == ZS_F64 && k->ndim == 0 && zs_item(k) == want;
        zs_release(q);
        zs_release(k);
    }
    ZT_CHECK(same, "clip_coef == zs_clip_coef(sqrt(sumsq)) below, at, above max, Inf");
    zs_tensor *qn = zs_scalar(ZS_F64, NAN), *kn = zs_clip_coef_of(qn, max);
    ZT_CHECK(kn && isnan(zs_item(kn)), "clip_coef of a NaN sum of squares is NaN");
    zs_tensor *qf = zs_scalar(ZS_F32, 1), *q2 = zs_zeros(ZS_F64, ZS_SHAPE(2));
    ZT_EXPECT_ERROR(zs_clip_coef_of(qf, max) == NULL, "clip_coef: sum of squares f32");
    ZT_EXPECT_ERROR(zs_clip_coef_of(q2, max) == NULL, "clip_coef: sum of squares f64 [2]");
    ZT_EXPECT_ERROR(zs_clip_coef_of(qn, 0) == NULL, "clip_coef: max_norm 0");
    ZT_CHECK(zs_clip_coef_of(NULL, 1) == NULL, "clip_coef of NULL is NULL");
    zs_tensor *ts[] = {qn, kn, qf, q2};
    for (size_t i = 0; i < sizeof ts / sizeof *ts; i++)
        zs_release(ts[i]);
    zt_section("clip_coef");
}

static void test_errors(void)
{
    zs_tensor *p = zt_rand(ZS_F32, ZS_SHAPE(N), 1), *g = zt_rand(ZS_F32, ZS_SHAPE(N), 2);
    zs_tensor *m = zs_zeros(ZS_F32, ZS_SHAPE(N)), *v = zs_zeros(ZS_F32, ZS_SHAPE(N));
    zs_tensor *p0 = zs_clone(p), *sched = zs_zeros(ZS_F64, ZS_SHAPE(2));
    zs_adam_step as = {0, 0.9, 0.999, 1e-8, 0, true, 1, 1};
    zs_sgd_step ss = {0, 0.9, 0, false, 1, 1};
    set_sched(sched, 0.1, 0);
    ZT_EXPECT_ERROR(zs_adam_update_dyn_(p, g, m, v, &as, sched, NULL) < 0,
                    "adam_update_dyn: step 0, expected the 1-based count");
    set_sched(sched, 0.1, 1.5);
    ZT_EXPECT_ERROR(zs_sgd_update_dyn_(p, g, m, &ss, sched, NULL) < 0,
                    "sgd_update_dyn: step 1.5, expected the 1-based count");
    set_sched(sched, 0.1, 1);
    zs_tensor *kn = zs_scalar(ZS_F64, NAN), *k0 = zs_scalar(ZS_F64, 0);
    ZT_EXPECT_ERROR(zs_adam_update_dyn_(p, g, m, v, &as, sched, kn) < 0,
                    "adam_update_dyn: gradient scale nan is not a positive finite number "
                    "(the gradient norm was NaN)");
    ZT_EXPECT_ERROR(zs_sgd_update_dyn_(p, g, NULL, &ss, sched, k0) < 0,
                    "sgd_update_dyn: gradient scale 0");
    ZT_CHECK(same_bits(p, p0) && zs_get(m, 0) == 0, "refused updates wrote nothing");
    zs_tensor *s3 = zs_zeros(ZS_F64, ZS_SHAPE(3)), *sf = zs_zeros(ZS_F32, ZS_SHAPE(2));
    zs_tensor *kf = zs_scalar(ZS_F32, 1), *g3 = zt_rand(ZS_F32, ZS_SHAPE(3), 3);
    ZT_EXPECT_ERROR(zs_adam_update_dyn_(p, g, m, v, &as, s3, NULL) < 0,
                    "adam_update_dyn: step scalars f64 [3]");
    ZT_EXPECT_ERROR(zs_sgd_update_dyn_(p, g, NULL, &ss, sf, NULL) < 0,
                    "sgd_update_dyn: step scalars f32 [2]");
    ZT_EXPECT_ERROR(zs_sgd_update_dyn_(p, g, NULL, &ss, sched, kf) < 0,
                    "and scale f32 []");
    ZT_EXPECT_ERROR(zs_adam_update_dyn_(p, g3, m, v, &as, sched, NULL) < 0,
                    "adam_update_dyn: input 1 is f32 [3]");
    ZT_CHECK(zs_adam_update_dyn_(p, g, m, v, &as, NULL, NULL) < 0,
             "a NULL step-scalars tensor fails");
    zs_optim_config oc = {ZS_ONEBIT_ADAM, 1e-3, 0, false, 0, 0, 0, 0};
    zs_optim *o = zs_optim_new_onebit(&oc, 2, 1, &p);
    ZT_EXPECT_ERROR(o && zs_optim_step_dyn(o, sched, NULL) < 0, "1-bit Adam");
    zs_optim_free(o);
    zs_tensor *ts[] = {p, g, m, v, p0, sched, kn, k0, s3, sf, kf, g3};
    for (size_t i = 0; i < sizeof ts / sizeof *ts; i++)
        zs_release(ts[i]);
    zt_section("errors");
}

int main(void)
{
    test_steps();
    test_clip_coef();
    test_errors();
    return zt_done();
}
