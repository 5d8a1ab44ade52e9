/*
 * test_pipeline.c - pipeline parallelism (src/parallel/pipeline.c).
 *
 * Pure: the GPipe and 1F1B schedules for every stage of p in [1, 6] with
 * m in [1, 10] micro-batches (each micro-batch forwarded once and
 * backwarded once, after its forward, both in order; at most p - s in
 * flight for 1F1B, the exact order for p 4, m 8), the model-clock
 * simulation (no deadlock, bubble = (p - 1) / m), and the errors.
 *
 * Distributed (plainly, and by ctest under mpirun with 2 and 4 ranks): p
 * ranks each run one stage of a tiny tanh MLP (one linear layer a stage)
 * with both schedules and m = 1, 4, 8, sending activations and gradients
 * through a zs_pipe; the loss (on the last stage) and every stage's
 * weight gradients equal the one-process run of the whole MLP on the
 * whole batch to 1e-12 (float64). With 4 ranks also over the pp groups of
 * a dp 2 x pp 2 grid.
 */
#include <stdlib.h>

#include "testutil.h"

/* ---- schedules ---------------------------------------------------------- */

static void sched_string(zs_pp_schedule s, int st, int p, int m, char *buf, size_t n)
{
    zs_pp_action a[64];
    buf[0] = '\0';
    if (zs_pp_schedule_make(s, st, p, m, a) != ZS_OK)
        return;
    size_t k = 0;
    for (int i = 0; i < 2 * m; i++)
        k += (size_t)snprintf(buf + k, n - k, "%s%c%d", i ? " " : "",
                              a[i].backward ? 'B' : 'F', a[i].mb);
}

static void test_schedules(void)
{
    for (int sc = 0; sc < 2; sc++)
        for (int p = 1; p <= 6; p++)
            for (int m = 1; m <= 10; m++)
                for (int s = 0; s < p; s++) {
                    zs_pp_action a[20];
                    bool ok = zs_pp_schedule_make((zs_pp_schedule)sc, s, p, m, a) == ZS_OK;
                    int nf = 0, nb = 0, fly = 0, maxfly = 0;
                    for (int i = 0; ok && i < 2 * m; i++) {
                        if (a[i].backward) {
                            ok = a[i].mb == nb++ && nb <= nf;
                            fly--;
                        } else {
                            ok = a[i].mb == nf++;
                            fly++;
                        }
                        maxfly = fly > maxfly ? fly : maxfly;
                    }
                    ok = ok && nf == m && nb == m;
                    int bound = sc == ZS_PP_1F1B ? (p - s < m ? p - s : m) : m;
                    ZT_CHECK(ok && maxfly == bound, "%s stage %d of %d, m %d: order, every "
                             "micro-batch once each way, %d in flight (want %d)",
                             zs_pp_schedule_name((zs_pp_schedule)sc), s, p, m, maxfly, bound);
                    double bub = -1;
                    if (s == 0) {
                        ZT_CHECK(zs_pp_simulate((zs_pp_schedule)sc, p, m, 1.0, 2.0, &bub) ==
                                         ZS_OK && fabs(bub - zs_pp_bubble(p, m)) < 1e-12,
                                 "%s p %d m %d: simulated bubble %g, formula %g",
                                 zs_pp_schedule_name((zs_pp_schedule)sc), p, m, bub,
                                 zs_pp_bubble(p, m));
                    }
                }
    char buf[256];
    sched_string(ZS_PP_1F1B, 0, 4, 8, buf, sizeof buf);
    ZT_CHECK(!strcmp(buf, "F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7"),
             "1f1b stage 0 of 4: %s", buf);
    sched_string(ZS_PP_1F1B, 3, 4, 8, buf, sizeof buf);
    ZT_CHECK(!strcmp(buf, "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7"),
             "1f1b last stage of 4: %s", buf);
    sched_string(ZS_PP_1F1B, 1, 4, 2, buf, sizeof buf);
    ZT_CHECK(!strcmp(buf, "F0 F1 B0 B1"), "1f1b stage 1 of 4, m 2: %s", buf);
    sched_string(ZS_PP_GPIPE, 2, 4, 3, buf, sizeof buf);
    ZT_CHECK(!strcmp(buf, "F0 F1 F2 B0 B1 B2"), "gpipe: %s", buf);
    ZT_CHECK(zs_pp_bubble(4, 8) == 3.0 / 8, "bubble (p-1)/m");
    zs_pp_schedule s;
    ZT_CHECK(zs_pp_schedule_parse("1f1b", &s) == ZS_OK && s == ZS_PP_1F1B &&
                 zs_pp_schedule_parse("gpipe", &s) == ZS_OK && s == ZS_PP_GPIPE,
             "parse names");
    ZT_EXPECT_ERROR(zs_pp_schedule_parse("zb", &s) < 0, "expected gpipe or 1f1b");
    zs_pp_action a[8];
    ZT_EXPECT_ERROR(zs_pp_schedule_make(ZS_PP_1F1B, 4, 4, 4, a) < 0, "stage 4 of 4");
    ZT_EXPECT_ERROR(zs_pp_schedule_make(ZS_PP_GPIPE, 0, 4, 0, a) < 0, "0 micro-batches");
    double b;
    ZT_EXPECT_ERROR(zs_pp_simulate(ZS_PP_GPIPE, 2, 2, 0, 1, &b) < 0, "expected positive");
    zt_section("schedules: GPipe and 1F1B orders, in-flight bound, simulated bubble");
}

/* ---- the pipelined MLP --------------------------------------------------- */

#define H 5
#define BATCH 8

typedef struct mlp {
    int L;                 /* layers = stages */
    zs_tensor *W[8], *b[8]; /* whole model (reference leaves) */
    zs_tensor *x, *t;      /* [BATCH, H] */
    double loss;
} mlp;

static void mlp_init(mlp *M, int L)
{
    M->L = L;
    for (int l = 0; l < L; l++) {
        M->W[l] = zs_keep(zt_rand(ZS_F64, 2, (int64_t[]){H, H}, 100 + l));
        M->b[l] = zs_keep(zt_rand(ZS_F64, 1, (int64_t[]){H}, 200 + l));
        zs_set_requires_grad(M->W[l], true);
        zs_set_requires_grad(M->b[l], true);
    }
    M->x = zs_keep(zt_rand(ZS_F64, 2, (int64_t[]){BATCH, H}, 300));
    M->t = zs_keep(zt_rand(ZS_F64, 2, (int64_t[]){BATCH, H}, 301));
    zs_scope_push();
    zs_tensor *y = M->x;
    for (int l = 0; l < L; l++)
        y = zs_tanh(zs_linear(y, M->W[l], M->b[l]));
    zs_tensor *loss = zs_mse_loss(y, M->t);
    M->loss = zs_item(loss);
    zs_backward(loss, NULL, false);
    zs_scope_pop();
}

static void mlp_free(mlp *M)
{
    for (int l = 0; l < M->L; l++) {
        zs_release(M->W[l]);
        zs_release(M->b[l]);
    }
    zs_release(M->x);
    zs_release(M->t);
}

static zs_tensor *rows(zs_tensor *t, int mb, int m)
{
    int64_t n = BATCH / m;
    return zs_contiguous(zs_narrow(t, 0, mb * n, n));
}

/* Stage s of the pipeline over pp, running schedule sc on m micro-batches. */
static void run_stage(zs_comm *pp, const mlp *M, zs_pp_schedule sc, int m)
{
    int s = zs_comm_rank(pp), p = zs_comm_size(pp);
    zs_scope_push();
    zs_tensor *W = zs_clone(M->W[s]), *b = zs_clone(M->b[s]);
    W = zs_contiguous(zs_detach(W));
    b = zs_contiguous(zs_detach(b));
    zs_set_requires_grad(W, true);
    zs_set_requires_grad(b, true);
    zs_pipe *pipe = zs_pipe_new(pp);
    zs_pp_action act[16];
    zs_tensor *xin[8] = {0}, *yout[8] = {0};
    bool ok = pipe && zs_pp_schedule_make(sc, s, p, m, act) == ZS_OK;
    double loss = 0;
    int fly = 0, maxfly = 0;
    int64_t n = BATCH / m;
    for (int i = 0; ok && i < 2 * m; i++) {
        int mb = act[i].mb;
        if (!act[i].backward) {
            fly++;
            maxfly = fly > maxfly ? fly : maxfly;
            if (s == 0) {
                xin[mb] = rows(M->x, mb, m);
            } else {
                xin[mb] = zs_empty(ZS_F64, 2, (int64_t[]){n, H});
                ok = zs_pipe_recv(pipe, ZS_PIPE_ACT, mb, xin[mb]) == ZS_OK;
                zs_set_requires_grad(xin[mb], true);
            }
            yout[mb] = zs_tanh(zs_linear(xin[mb], W, b));
            if (s < p - 1)
                ok = ok && zs_pipe_send(pipe, ZS_PIPE_ACT, mb, zs_detach(yout[mb])) == ZS_OK;
            else {
                yout[mb] = zs_mul_scalar(zs_mse_loss(yout[mb], rows(M->t, mb, m)), 1.0 / m);
                loss += zs_item(yout[mb]);
            }
        } else {
            fly--;
            zs_tensor *g = NULL;
            if (s < p - 1) {
                g = zs_empty(ZS_F64, 2, (int64_t[]){n, H});
                ok = zs_pipe_recv(pipe, ZS_PIPE_GRAD, mb, g) == ZS_OK;
            }
            ok = ok && zs_backward(yout[mb], g, false) == ZS_OK;
            if (s > 0)
                ok = ok && zs_pipe_send(pipe, ZS_PIPE_GRAD, mb, zs_grad(xin[mb])) == ZS_OK;
        }
    }
    ok = ok && zs_pipe_flush(pipe) == ZS_OK && zs_pipe_pending(pipe) == 0;
    ZT_CHECK(ok, "%s stage %d of %d, m %d ran", zs_pp_schedule_name(sc), s, p, m);
    ZT_CHECK(maxfly <= (sc == ZS_PP_1F1B ? p - s : m), "%s: %d micro-batches in flight",
             zs_pp_schedule_name(sc), maxfly);
    int64_t want = (int64_t)m * n * H * 8 * ((s < p - 1) + (s > 0));
    ZT_CHECK(zs_pipe_bytes_sent(pipe) == want, "bytes sent %lld, want %lld",
             (long long)zs_pipe_bytes_sent(pipe), (long long)want);
    zs_pipe_free(pipe);
    if (s == p - 1)
        ZT_CHECK(fabs(loss - M->loss) < 1e-12 * fmax(1, fabs(M->loss)),
                 "%s m %d: loss %.17g, one process %.17g", zs_pp_schedule_name(sc), m, loss,
                 M->loss);
    double *gw = zt_values(zs_grad(M->W[s])), *gb = zt_values(zs_grad(M->b[s]));
    double ew = zs_grad(W) ? zt_max_err(zs_grad(W), gw, H * H) : 1e300;
    double eb = zs_grad(b) ? zt_max_err(zs_grad(b), gb, H) : 1e300;
    ZT_CHECK(ew < 1e-12 && eb < 1e-12, "%s stage %d m %d: gradients off by %g, %g",
             zs_pp_schedule_name(sc), s, m, ew, eb);
    free(gw);
    free(gb);
    zs_scope_pop();
}

static void test_mlp(zs_comm *pp, const char *label)
{
    mlp M = {0};
    mlp_init(&M, zs_comm_size(pp));
    static const int ms[] = {1, 4, 8};
    for (int sc = 0; sc < 2; sc++)
        for (int k = 0; k < 3; k++)
            run_stage(pp, &M, (zs_pp_schedule)sc, ms[k]);
    mlp_free(&M);
    char name[128];
    snprintf(name, sizeof name, "pipelined MLP over %s (%d stages) = one process, "
             "GPipe and 1F1B, m 1, 4, 8", label, zs_comm_size(pp));
    zt_section(name);
}

/* The 1F1B pattern with 2 MB messages (rendezvous sizes for MPI): neighbours
 * send before they receive in the steady phase, which blocking sends would
 * deadlock; the received data is checked. */
static void test_big_messages(zs_comm *pp)
{
    int s = zs_comm_rank(pp), p = zs_comm_size(pp), m = 6;
    int64_t n = 1 << 18;
    zs_scope_push();
    zs_pipe *pipe = zs_pipe_new(pp);
    zs_pp_action act[12];
    bool ok = pipe && zs_pp_schedule_make(ZS_PP_1F1B, s, p, m, act) == ZS_OK;
    for (int i = 0; ok && i < 2 * m; i++) {
        int mb = act[i].mb;
        zs_pipe_kind in = act[i].backward ? ZS_PIPE_GRAD : ZS_PIPE_ACT;
        bool has_in = act[i].backward ? s < p - 1 : s > 0;
        bool has_out = act[i].backward ? s > 0 : s < p - 1;
        if (has_in) {
            zs_tensor *t = zs_empty(ZS_F64, 1, &n);
            ok = zs_pipe_recv(pipe, in, mb, t) == ZS_OK;
            int from = act[i].backward ? s + 1 : s - 1;
            ok = ok && zs_get(t, 0) == from * 100 + mb && zs_get(t, n - 1) == -mb;
        }
        if (ok && has_out) {
            zs_tensor *t = zs_full(ZS_F64, 1, &n, s * 100 + mb);
            ((double *)zs_data(t))[n - 1] = -mb;
            ok = zs_pipe_send(pipe, in, mb, t) == ZS_OK;
        }
    }
    ok = ok && zs_pipe_flush(pipe) == ZS_OK;
    ZT_CHECK(ok, "1f1b with 2 MB messages, stage %d of %d", s, p);
    zs_pipe_free(pipe);
    zs_scope_pop();
    zt_section("1F1B exchange of 2 MB messages: no deadlock, data intact");
}

static void test_pipe_errors(zs_comm *pp)
{
    int s = zs_comm_rank(pp), p = zs_comm_size(pp);
    zs_scope_push();
    zs_pipe *pipe = zs_pipe_new(pp);
    zs_tensor *t = zs_zeros(ZS_F64, 1, (int64_t[]){3});
    if (s == 0)
        ZT_EXPECT_ERROR(zs_pipe_recv(pipe, ZS_PIPE_ACT, 0, t) < 0, "no previous stage");
    if (s == p - 1)
        ZT_EXPECT_ERROR(zs_pipe_send(pipe, ZS_PIPE_ACT, 0, t) < 0, "no next stage");
    ZT_EXPECT_ERROR(zs_pipe_send(pipe, ZS_PIPE_GRAD, -1, t) < 0, "micro-batch -1");
    ZT_EXPECT_ERROR(zs_pipe_send(pipe, ZS_PIPE_GRAD, 16384, t) < 0, "micro-batch 16384");
    ZT_EXPECT_ERROR(zs_pipe_send(pipe, (zs_pipe_kind)7, 0, t) < 0, "kind 7");
    if (p > 1 && s == 1)
        ZT_EXPECT_ERROR(zs_pipe_send(pipe, ZS_PIPE_GRAD, 0, zs_transpose(
                            zs_zeros(ZS_F64, 2, (int64_t[]){2, 3}), 0, 1)) < 0, "contiguous");
    ZT_EXPECT_ERROR(zs_pipe_new(NULL) == NULL, "NULL communicator");
    ZT_EXPECT_ERROR(zs_pipe_flush(NULL) < 0, "NULL pipe");
    ZT_CHECK(zs_pipe_pending(pipe) == 0, "failed sends leave nothing pending");
    zs_pipe_free(pipe);
    zs_scope_pop();
    zt_section("pipe errors: missing neighbour, micro-batch, kind, layout");
}

int main(int argc, char **argv)
{
    int rank, size;
    zt_dist_start(&argc, &argv, &rank, &size);
    zs_comm *world = zs_comm_world();
    zs_comm_set_timeout(world, 120);
    int64_t live = zt_live_bytes();
    test_schedules();
    test_mlp(world, "the world");
    test_big_messages(world);
    test_pipe_errors(world);
    if (size == 4) {
        zs_grid *g = zs_grid_new(world, 2, 1, 2);
        ZT_CHECK(g != NULL, "grid dp 2 pp 2");
        if (g)
            test_mlp(g->pp, "grid pp groups");
        zs_grid_free(g);
    }
    ZT_CHECK(zt_live_bytes() == live, "no tensor leaked (%lld bytes live, %lld before)",
             (long long)zt_live_bytes(), (long long)live);
    return zt_dist_done();
}
