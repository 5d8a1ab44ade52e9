/*
 * test_onebit_adam.c - 1-bit Adam (ZS_ONEBIT_ADAM, src/optim/onebit_adam.c)
 * plainly and by ctest under `mpirun -np 2` and `-np 4`.
 *
 * One process: the warm-up steps are AdamW's to the bit (parameters and
 * both moments); the frozen steps follow the rule of zs/optim.h against a
 * float64 reference (m, p within 1e-5 relative: f32 arithmetic over five
 * steps), v never moves, the reduce function sees each parameter's
 * momentum once per frozen step, after the momentum update, and what it
 * writes is what the update uses; zs_optim_grads_local turns on exactly
 * at freeze_step; on the test device the same steps give the CPU's bits;
 * errors: freeze_step < 1, a failing reduce function.
 *
 * Every rank: the data-parallel 1-bit Adam (warm-up gradients averaged by
 * the ring all-reduce, then the momenta by zs_onebit_allreduce) equals one
 * process simulating it for all P ranks over the same per-rank gradients
 * (a replica whose reduce function updates P momenta and runs the
 * compressor over them in one process; the gradients are multiples of
 * 1/64, so their averages are exact in any order). Checked to the bit;
 * the byte count is at least 5x below the ring all-reduce's.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "parallel/onebit.h"
#include "testutil.h"
#include "zs/onebit.h"

static int R, P;

#define N 5003
#define FREEZE 4
#define STEPS 9

static const zs_optim_config CFG = {ZS_ONEBIT_ADAM, 1e-2, 0, false, 0.1, 0.9, 0.99, 1e-8};

static zs_optim *onebit(zs_tensor **p) { return zs_optim_new_onebit(&CFG, FREEZE, 1, p); }

/* Rank r's gradient at step t (1-based): multiples of 1/64 in [-1, 1]. */
static float grad_value(int r, int t, int64_t k)
{
    return (float)((int)((k * 7 + r * 13 + t * 5) % 129) - 64) / 64.0f;
}

static void fill_grad(zs_tensor *p, int r, int t)
{
    zs_tensor *g = zs_empty(ZS_F32, ZS_SHAPE(zs_numel(p)));
    float *d = zs_data(g);
    for (int64_t k = 0; k < zs_numel(p); k++)
        d[k] = grad_value(r, t, k);
    if (p->device != ZS_CPU) {
        zs_tensor *dev = zs_to_device(g, p->device);
        zs_release(g);
        g = dev;
    }
    zs_release(p->grad);
    p->grad = g;
}

static zs_tensor *new_param(int device)
{
    zs_tensor *p = zs_uniform(ZS_F32, ZS_SHAPE(N), -1, 1, 5);
    if (device != ZS_CPU) {
        zs_tensor *d = zs_to_device(p, device);
        zs_release(p);
        p = d;
    }
    return p;
}

static bool same_bits(const zs_tensor *a, const zs_tensor *b)
{
    zs_tensor *ca = a->device == ZS_CPU ? zs_retain((zs_tensor *)a)
                                        : zs_to_device((zs_tensor *)a, ZS_CPU);
    zs_tensor *cb = b->device == ZS_CPU ? zs_retain((zs_tensor *)b)
                                        : zs_to_device((zs_tensor *)b, ZS_CPU);
    bool same = ca && cb && zs_numel(ca) == zs_numel(cb) &&
                memcmp(zs_data(ca), zs_data(cb), zs_nbytes(ca)) == 0;
    zs_release(ca);
    zs_release(cb);
    return same;
}

/* ---- one process ---------------------------------------------------------- */

typedef struct halve {
    int calls;
    double *m_seen; /* the momentum the reduce function was given */
} halve;

/* A reduce function that records m and halves it. */
static zs_status halve_m(void *ctx, int i, zs_tensor *m)
{
    halve *h = ctx;
    h->calls += i == 0;
    const float *d = zs_data(m);
    for (int64_t k = 0; k < zs_numel(m); k++)
        h->m_seen[k] = d[k];
    return zs_scale_(m, 0.5);
}

static zs_status failing_reduce(void *ctx, int i, zs_tensor *m)
{
    (void)ctx, (void)i, (void)m;
    return zs_set_error("reduce: the network is down");
}

static void test_warmup_and_frozen(void)
{
    zs_tensor *pa = new_param(ZS_CPU), *pb = new_param(ZS_CPU);
    zs_optim_config adamw = CFG;
    adamw.kind = ZS_ADAMW;
    zs_optim *oa = zs_optim_new(&adamw, 1, &pa), *ob = onebit(&pb);
    bool same = true, local_ok = true;
    for (int t = 1; t <= FREEZE; t++) {
        local_ok &= !zs_optim_grads_local(ob);
        fill_grad(pa, 0, t);
        fill_grad(pb, 0, t);
        double gs = t == 2 ? 0.7 : 1; /* a clipped step */
        zs_optim_step_scaled(oa, 1e-2, gs);
        zs_optim_step_scaled(ob, 1e-2, gs);
        same &= same_bits(pa, pb) && same_bits(zs_optim_moment(oa, 0, 0),
                                               zs_optim_moment(ob, 0, 0)) &&
                same_bits(zs_optim_moment(oa, 1, 0), zs_optim_moment(ob, 1, 0));
    }
    ZT_CHECK(same, "warm-up differs from AdamW");
    ZT_CHECK(local_ok && zs_optim_grads_local(ob), "grads_local off before the freeze, "
             "on after it");
    /* frozen steps against float64 */
    double *p = zt_values(pb), *m = zt_values(zs_optim_moment(ob, 0, 0));
    double *v = zt_values(zs_optim_moment(ob, 1, 0));
    zs_tensor *v0 = zs_clone(zs_optim_moment(ob, 1, 0));
    halve h = {0, calloc(N, sizeof(double))};
    zs_optim_set_momentum_reduce(ob, halve_m, &h);
    double worst_seen = 0;
    for (int t = FREEZE + 1; t <= STEPS; t++) {
        double lr = 1e-2 * (t % 2 ? 1 : 0.5), gs = t == 7 ? 0.6 : 1;
        fill_grad(pb, 0, t);
        ZT_CHECK(zs_optim_step_scaled(ob, lr, gs) == ZS_OK, "frozen step %d", t);
        double bc1 = 1 - pow(CFG.beta1, t), bc2 = 1 - pow(CFG.beta2, FREEZE);
        for (int64_t k = 0; k < N; k++) {
            m[k] = CFG.beta1 * m[k] + (1 - CFG.beta1) * gs * grad_value(0, t, k);
            worst_seen = fmax(worst_seen, fabs(h.m_seen[k] - m[k]) / fmax(1e-3, fabs(m[k])));
            m[k] *= 0.5;
            p[k] = p[k] * (1 - lr * CFG.weight_decay) -
                   lr / bc1 * m[k] / (sqrt(v[k] / bc2) + CFG.eps);
        }
    }
    ZT_CHECK(h.calls == STEPS - FREEZE, "reduce called %d times", h.calls);
    ZT_CHECK(worst_seen < 1e-5, "reduce saw m off by %.3g", worst_seen);
    double em = zt_max_err(zs_optim_moment(ob, 0, 0), m, N), ep = zt_max_err(pb, p, N);
    ZT_CHECK(em < 1e-5 && ep < 1e-5, "frozen steps vs float64: m %.3g, p %.3g", em, ep);
    ZT_CHECK(same_bits(v0, zs_optim_moment(ob, 1, 0)), "v moved after the freeze");
    printf("  frozen steps vs float64: m %.2g, p %.2g\n", em, ep);
    /* a failing reduce fails the step with its message */
    zs_optim_set_momentum_reduce(ob, failing_reduce, NULL);
    fill_grad(pb, 0, 1);
    ZT_EXPECT_ERROR(zs_optim_step(ob, 1e-2) != ZS_OK, "network is down");
    free(p);
    free(m);
    free(v);
    free(h.m_seen);
    zs_release(v0);
    zs_optim_free(oa);
    zs_optim_free(ob);
    zs_release(pa);
    zs_release(pb);
    zt_section("1-bit Adam: warm-up = AdamW to the bit; frozen steps vs float64; the "
               "reduce function's place");
}

/* The same steps on the test device and on the CPU: the CPU's bits. */
static void test_device(void)
{
    if (zs_test_device_enable() != ZS_OK) {
        ZT_CHECK(false, "test device");
        return;
    }
    zs_tensor *pc = new_param(ZS_CPU), *pd = new_param(ZS_TEST_DEVICE);
    zs_optim *oc = onebit(&pc), *od = onebit(&pd);
    for (int t = 1; t <= STEPS; t++) {
        fill_grad(pc, 0, t);
        fill_grad(pd, 0, t);
        ZT_CHECK(zs_optim_step(oc, 1e-2) == ZS_OK && zs_optim_step(od, 1e-2) == ZS_OK,
                 "step %d", t);
    }
    ZT_CHECK(pd->device == ZS_TEST_DEVICE && same_bits(pc, pd) &&
             same_bits(zs_optim_moment(oc, 0, 0), zs_optim_moment(od, 0, 0)),
             "test device differs from the CPU");
    zs_optim_free(oc);
    zs_optim_free(od);
    zs_release(pc);
    zs_release(pd);
    zt_section("1-bit Adam on the test device: the CPU's bits (the driver only)");
}

static void test_errors(void)
{
    zs_tensor *p = new_param(ZS_CPU);
    ZT_EXPECT_ERROR(zs_optim_new_onebit(&CFG, 0, 1, &p) == NULL, "freeze_step 0");
    ZT_EXPECT_ERROR(zs_optim_new_onebit(&CFG, -3, 1, &p) == NULL, "expected >= 1");
    ZT_EXPECT_ERROR(zs_optim_new(&CFG, 1, &p) == NULL, "zs_optim_new_onebit");
    zs_optim_config adam = CFG;
    adam.kind = ZS_ADAM;
    ZT_EXPECT_ERROR(zs_optim_new_onebit(&adam, 4, 1, &p) == NULL, "ZS_ONEBIT_ADAM");
    zs_release(p);
    zt_section("1-bit Adam refuses freeze_step < 1 and the other constructor");
}

/* ---- every rank against the one-process simulation ----------------------- */

typedef struct sim {
    zs_tensor *m[16], *g[16]; /* the momenta and gradients of the P ranks */
    float *werr[16], *serr[16];
    int t;
} sim;

#define LO(n, P, k) ((n) * (int64_t)(k) / (P))

/* The replica's reduce function: the P ranks' momentum updates (the same
 * operators as the optimizer's) and the compressed all-reduce over them,
 * in one process; m gets the result. */
static zs_status simulate(void *ctx, int i, zs_tensor *m)
{
    sim *s = ctx;
    int64_t B = ZS_ONEBIT_BLOCK;
    float *out = malloc(N * sizeof *out), *acc = malloc(N * sizeof *acc);
    uint8_t *pk = malloc((size_t)zsi_onebit_packet_bytes(N, B) * (size_t)P);
    for (int r = 0; r < P; r++) {
        zs_scale_(s->m[r], CFG.beta1);
        zs_axpy_(s->m[r], 1 - CFG.beta1, s->g[r]);
    }
    for (int j = 0; j < P; j++) {
        int64_t lo = LO(N, P, j), len = LO(N, P, j + 1) - lo;
        int64_t pb = zsi_onebit_packet_bytes(len, B);
        for (int r = 0; r < P; r++)
            zsi_onebit_compress((float *)zs_data(s->m[r]) + lo, s->werr[r] + lo, len, B,
                                pk + r * pb);
        memset(acc, 0, (size_t)len * sizeof *acc);
        for (int r = 0; r < P; r++)
            zsi_onebit_accumulate(pk + r * pb, len, B, 1.0f / (float)P, acc);
        zsi_onebit_compress(acc, s->serr[j], len, B, pk);
        zsi_onebit_decode(pk, len, B, out + lo);
    }
    memcpy(zs_data(m), out, N * sizeof *out);
    for (int r = 0; r < P; r++)
        memcpy(zs_data(s->m[r]), out, N * sizeof *out);
    free(out);
    free(acc);
    free(pk);
    (void)i;
    return ZS_OK;
}

static zs_status world_reduce(void *ctx, int i, zs_tensor *m)
{
    (void)i;
    return zs_onebit_allreduce(ctx, m);
}

static void test_world(void)
{
    if (P > 16)
        return;
    zs_comm *c = zs_comm_world();
    zs_tensor *p = new_param(ZS_CPU), *q = new_param(ZS_CPU);
    zs_optim *o = onebit(&p), *os = onebit(&q);
    zs_onebit *ob = zs_onebit_new(c, N, 0);
    sim s = {0};
    for (int r = 0; r < P; r++) {
        s.g[r] = zs_empty(ZS_F32, ZS_SHAPE(N));
        s.werr[r] = calloc(N, sizeof(float));
        s.serr[r] = calloc(N, sizeof(float));
    }
    zs_optim_set_momentum_reduce(o, world_reduce, ob);
    zs_optim_set_momentum_reduce(os, simulate, &s);
    int64_t adam_bytes = 0, onebit_bytes = 0;
    for (int t = 1; t <= STEPS; t++) {
        bool local = zs_optim_grads_local(o);
        fill_grad(p, R, t);
        if (!local) { /* warm-up: data parallelism's gradient average */
            zs_comm_allreduce(c, p->grad, true, ZS_ALLREDUCE_RING);
            adam_bytes = zs_onebit_ring_bytes(N, 4, P, R);
        }
        /* the simulation: every rank's gradient, their exact mean */
        fill_grad(q, 0, t);
        for (int r = 0; r < P; r++) {
            float *d = zs_data(s.g[r]), *mean = zs_data(q->grad);
            for (int64_t k = 0; k < N; k++) {
                d[k] = grad_value(r, t, k);
                mean[k] = r == 0 ? d[k] : mean[k] + d[k];
            }
        }
        zs_scale_(q->grad, 1.0 / P);
        if (local && !s.m[0]) /* the first frozen step: every rank's m is the replica's */
            for (int r = 0; r < P; r++)
                s.m[r] = zs_clone(zs_optim_moment(os, 0, 0));
        ZT_CHECK(zs_optim_step(o, 1e-2) == ZS_OK && zs_optim_step(os, 1e-2) == ZS_OK,
                 "step %d", t);
        if (local) {
            zs_onebit_stats st;
            zs_onebit_get_stats(ob, &st);
            onebit_bytes = st.last_bytes_sent;
        }
        ZT_CHECK(same_bits(p, q), "rank %d of %d, step %d: parameters differ from the "
                 "simulation (max err %.3g)", R, P, t, zt_max_err(p, zt_values(q), N));
    }
    ZT_CHECK(same_bits(zs_optim_moment(o, 0, 0), zs_optim_moment(os, 0, 0)), "momentum");
    if (P > 1)
        ZT_CHECK(onebit_bytes > 0 && adam_bytes >= 5 * onebit_bytes, "bytes per step: "
                 "Adam %lld, 1-bit Adam %lld", (long long)adam_bytes,
                 (long long)onebit_bytes);
    if (R == 0)
        printf("  %d ranks, %d elements: bytes sent per step by rank 0: Adam's ring "
               "all-reduce %lld, 1-bit Adam %lld\n", P, N, (long long)adam_bytes,
               (long long)onebit_bytes);
    for (int r = 0; r < P; r++) {
        zs_release(s.m[r]);
        zs_release(s.g[r]);
        free(s.werr[r]);
        free(s.serr[r]);
    }
    zs_onebit_free(ob);
    zs_optim_free(o);
    zs_optim_free(os);
    zs_release(p);
    zs_release(q);
    zt_section("data-parallel 1-bit Adam equals the one-process simulation of all ranks "
               "to the bit; bytes >= 5x below Adam's");
}

int main(int argc, char **argv)
{
    zt_dist_start(&argc, &argv, &R, &P);
    test_warmup_and_frozen();
    test_errors();
    test_world();
    test_device();
    return zt_dist_done();
}
