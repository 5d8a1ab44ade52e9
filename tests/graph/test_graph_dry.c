/*
 * test_graph_dry.c - the dry capture (zs_graph_capture_begin_dry,
 * zs/graph.h): calls recorded without computing, the step computed by
 * the first replay.
 *
 * - A small training step (linear, GeLU, dropout, linear, cross entropy,
 *   backward, an in-place SGD-like update of the weights): during the dry
 *   capture no tensor of the program changes (weights, the random-number
 *   position) and the allocator's peak stays far below the eager step's;
 *   the replays (unplanned, then planned) give the eager step's loss and
 *   weights bit for bit, twice in a row.
 * - Batch norm (writes its running statistics while computing): untouched
 *   by the dry capture, updated by the replay exactly as eagerly.
 * - A host read of a value during the dry capture (zs_item) is counted,
 *   reads zeros, and makes zs_graph_capture_end fail with a message.
 * - The replay profiler: per-node times within the replays', a dump that
 *   names each operator; off: nothing timed.
 * - The trainer: GPT tiny captures dry (its capture step peaks well below
 *   the eager step) and equals eager bit for bit over 20 steps; a loss
 *   function that reads its loss on the host makes it capture again
 *   running the kernels (a note in the log), still bit for bit.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph/internal.h"
#include "train/internal.h"
#include "testutil.h"

static bool same_bits(const zs_tensor *a, const zs_tensor *b)
{
    return a && b && zs_nbytes(a) == zs_nbytes(b) &&
           !memcmp(zs_data(a), zs_data(b), zs_nbytes(a));
}

/* One step on (x, y): loss of linear -> gelu -> dropout -> linear ->
 * cross entropy, backward, then w -= 0.1 * grad in place for both
 * weights; returns the loss (owned by the scope). */
static zs_tensor *step(zs_tensor *w1, zs_tensor *w2, zs_tensor *x, zs_tensor *y)
{
    zs_tensor *h = zs_dropout(zs_gelu(zs_linear(x, w1, NULL), ZS_GELU_TANH), 0.25, true);
    zs_tensor *l = zs_cross_entropy(zs_linear(h, w2, NULL), y, -100);
    if (!l || zs_backward(l, NULL, false) != ZS_OK)
        return NULL;
    zs_no_grad_push();
    zs_axpy_(w1, -0.1, w1->grad);
    zs_axpy_(w2, -0.1, w2->grad);
    zs_no_grad_pop();
    return l;
}

static size_t peak_above(const zs_alloc_stats *a0)
{
    zs_alloc_stats a1;
    zs_alloc_get_stats(&a1);
    return a1.peak_bytes > a0->current_bytes ? a1.peak_bytes - a0->current_bytes : 0;
}

static void test_step(void)
{
    zs_scope_push();
    int64_t B = 67, K = 33, H = 129, C = 11;
    zs_tensor *x = zt_rand(ZS_F32, 2, (int64_t[]){B, K}, 1);
    int64_t lab[67];
    for (int i = 0; i < B; i++)
        lab[i] = (i * 5) % C;
    zs_tensor *y = zs_from_data(ZS_I64, ZS_SHAPE(B), lab);
    zs_tensor *we[2], *wg[2]; /* eager's and the graph's weights, same values */
    for (int k = 0; k < 2; k++) {
        int64_t shp[2] = {k ? C : H, k ? H : K};
        we[k] = zt_rand(ZS_F32, 2, shp, 10 + (uint64_t)k);
        wg[k] = zs_clone(we[k]);
        zs_set_requires_grad(we[k], true);
        zs_set_requires_grad(wg[k], true);
        zs_keep(we[k]);
        zs_keep(wg[k]);
    }
    zs_manual_seed(9);
    /* eager: a step to make the .grad buffers, then two more */
    zs_scope_push();
    double le[3];
    for (int s = 0; s < 3; s++) {
        zs_tensor *l = step(we[0], we[1], x, y);
        le[s] = l ? zs_item(l) : -1;
        zs_zero_grad(we[0], false);
        zs_zero_grad(we[1], false);
    }
    zs_scope_pop();
    zs_manual_seed(9);
    zs_scope_push();
    zs_tensor *l0 = step(wg[0], wg[1], x, y); /* the .grad buffers made */
    ZT_CHECK(l0 && zs_item(l0) == le[0], "first step as eager");
    zs_zero_grad(wg[0], false);
    zs_zero_grad(wg[1], false);
    zs_scope_pop();

    zs_tensor *before = zs_clone(wg[0]);
    uint64_t seed0, off0, seed1, off1;
    zs_rng_get_state(&seed0, &off0);
    zs_alloc_stats a0;
    zs_alloc_trim();
    zs_alloc_get_stats(&a0);
    zs_alloc_reset_peak();
    zs_scope_push();
    zs_graph *g = zs_graph_capture_begin_dry();
    ZT_CHECK(g != NULL, "dry capture begins: %s", zs_last_error());
    zs_tensor *l = step(wg[0], wg[1], x, y);
    ZT_CHECK(zs_graph_capture_end(g) == ZS_OK && zs_graph_dry_reads(g) == 0,
             "dry capture: %s", zs_last_error());
    zsi_tracking_pause();
    zs_tensor *la = l ? zsi_new_view(l, l->ndim, l->shape, l->strides, l->offset) : NULL;
    zsi_tracking_resume();
    zs_scope_pop();
    size_t dry_peak = peak_above(&a0);
    zs_rng_get_state(&seed1, &off1);
    ZT_CHECK(same_bits(before, wg[0]), "the dry capture left the weights alone");
    ZT_CHECK(seed0 == seed1 && off0 == off1, "the dry capture left the random-number "
             "position where it was (%llu -> %llu)", (unsigned long long)off0,
             (unsigned long long)off1);
    zs_graph_stats s;
    zs_graph_get_stats(g, &s);
    ZT_CHECK(dry_peak < s.intermediate_bytes / 2, "the dry capture's peak (%zu bytes) "
             "is far below what its nodes make (%zu)", dry_peak, s.intermediate_bytes);
    printf("dry capture: %d nodes, %zu bytes of values, the capture's peak %zu bytes\n",
           s.nodes, s.intermediate_bytes, dry_peak);

    ZT_CHECK(zs_graph_replay(g) == ZS_OK, "unplanned replay: %s", zs_last_error());
    ZT_CHECK(zs_item(la) == le[1], "replay 1: loss %.9g, eager %.9g", zs_item(la), le[1]);
    zs_zero_grad(wg[0], false);
    zs_zero_grad(wg[1], false);
    ZT_CHECK(zs_graph_plan_memory(g, 1, &la) == ZS_OK, "plan: %s", zs_last_error());
    ZT_CHECK(zs_graph_replay(g) == ZS_OK, "planned replay: %s", zs_last_error());
    ZT_CHECK(zs_item(la) == le[2], "replay 2: loss %.9g, eager %.9g", zs_item(la), le[2]);
    ZT_CHECK(same_bits(we[0], wg[0]) && same_bits(we[1], wg[1]),
             "the weights after the replays equal eager's");
    zt_section("dry capture: nothing computed or changed while recording; replays "
               "equal eager");
    zs_graph_free(g);
    zs_release(la);
    zs_release(before);
    for (int k = 0; k < 2; k++) {
        zs_release(we[k]);
        zs_release(wg[k]);
    }
    zs_scope_pop();
}

static void test_batch_norm(void)
{
    zs_scope_push();
    int64_t C = 5;
    zs_tensor *x = zt_rand(ZS_F32, 4, (int64_t[]){3, C, 4, 3}, 21);
    zs_tensor *w = zt_rand(ZS_F32, 1, &C, 22), *b = zt_rand(ZS_F32, 1, &C, 23);
    zs_set_requires_grad(w, true);
    zs_tensor *rm[2], *rv[2];
    for (int k = 0; k < 2; k++) {
        rm[k] = zt_rand(ZS_F32, 1, &C, 24);
        rv[k] = zs_add_scalar(zt_rand(ZS_F32, 1, &C, 25), 2.0);
    }
    zs_tensor *ye = zs_batch_norm(x, w, b, rm[0], rv[0], true, 0.1, 1e-5);
    zs_tensor *rm0 = zs_clone(rm[1]), *rv0 = zs_clone(rv[1]);
    zs_graph *g = zs_graph_capture_begin_dry();
    zs_tensor *yg = zs_batch_norm(x, w, b, rm[1], rv[1], true, 0.1, 1e-5);
    ZT_CHECK(zs_graph_capture_end(g) == ZS_OK, "capture: %s", zs_last_error());
    ZT_CHECK(same_bits(rm0, rm[1]) && same_bits(rv0, rv[1]),
             "the dry capture left the running statistics alone");
    ZT_CHECK(zs_graph_replay(g) == ZS_OK, "replay: %s", zs_last_error());
    ZT_CHECK(same_bits(ye, yg) && same_bits(rm[0], rm[1]) && same_bits(rv[0], rv[1]),
             "the replay's output and running statistics equal eager's");
    zs_graph_free(g);
    zs_scope_pop();
    zt_section("dry capture: batch norm's running statistics written by the replay only");
}

static void test_host_read(void)
{
    zs_scope_push();
    zs_tensor *x = zt_rand(ZS_F32, 1, (int64_t[]){7}, 31);
    zs_graph *g = zs_graph_capture_begin_dry();
    zs_tensor *e = zs_exp(x);
    double v = zs_item(e); /* not computed yet: zeros, counted */
    ZT_EXPECT_ERROR(zs_graph_capture_end(g) != ZS_OK, "read on the host");
    ZT_CHECK(zs_graph_dry_reads(g) == 1 && v == 0, "one host read counted (%lld), it "
             "read %g", (long long)zs_graph_dry_reads(g), v);
    ZT_EXPECT_ERROR(zs_graph_replay(g) != ZS_OK, "unusable");
    zs_graph_free(g);
    /* nested: a dry capture while capturing */
    g = zs_graph_capture_begin();
    ZT_EXPECT_ERROR(zs_graph_capture_begin_dry() == NULL, "already captures");
    ZT_CHECK(zs_graph_capture_end(g) == ZS_OK, "end");
    zs_graph_free(g);
    zs_scope_pop();
    zt_section("dry capture: a host read fails the capture, with a message");
}

/* ---- the replay profiler ---------------------------------------------------- */

static void test_profile(void)
{
    zs_scope_push();
    zs_tensor *x = zt_rand(ZS_F32, 2, (int64_t[]){129, 65}, 41);
    zs_graph *g = zs_graph_capture_begin();
    zs_tensor *y = zs_add(zs_tanh(zs_exp(x)), x);
    ZT_CHECK(y && zs_graph_capture_end(g) == ZS_OK, "capture");
    char buf[4096] = "";
    FILE *f = tmpfile();
    ZT_CHECK(zs_graph_profile_dump(g, f) == ZS_OK, "dump before any timing");
    ZT_CHECK(zs_graph_replay(g) == ZS_OK, "an untimed replay");
    ZT_CHECK(zs_graph_profile(g, true) == ZS_OK, "profile on");
    for (int k = 0; k < 3; k++)
        ZT_CHECK(zs_graph_replay(g) == ZS_OK, "a timed replay");
    ZT_CHECK(g->prof_replays == 3, "3 replays timed (%lld)", (long long)g->prof_replays);
    double nodes = 0;
    for (int i = 0; i < g->n; i++)
        nodes += g->nodes[i]->seconds;
    ZT_CHECK(nodes > 0 && nodes <= g->prof_seconds, "the nodes' times (%.3g s) are within "
             "the replays' (%.3g s)", nodes, g->prof_seconds);
    ZT_CHECK(zs_graph_profile_dump(g, f) == ZS_OK, "dump");
    rewind(f);
    size_t k = fread(buf, 1, sizeof buf - 1, f);
    buf[k] = '\0';
    fclose(f);
    ZT_CHECK(strstr(buf, "no replay timed") && strstr(buf, "3 replays") &&
             strstr(buf, "# exp ") && strstr(buf, "# tanh ") && strstr(buf, "# add ") &&
             strstr(buf, "slowest nodes"), "the profile names each operator:\n%s", buf);
    ZT_CHECK(zs_graph_profile(g, false) == ZS_OK && zs_graph_replay(g) == ZS_OK &&
             g->prof_replays == 3, "off: replays are not timed");
    ZT_EXPECT_ERROR(zs_graph_profile(NULL, true) != ZS_OK, "no graph");
    zs_graph_free(g);
    zs_scope_pop();
    zt_section("replay profiler: per node, by operator");
}

/* ---- the trainer ------------------------------------------------------------ */

#define STEPS 20
static const zs_gpt_config GPT2 = {ZS_GPT2, 61, 16, 2, 2, 16};

static zs_status tok_batch(void *ctx, int64_t index, zs_tensor **x, zs_tensor **y)
{
    (void)ctx;
    return zt_token_batch(index, 4, x, y);
}

/* zs_gpt_loss that prints its loss (a host read inside the step) */
static zs_tensor *chatty_loss(void *ctx, zs_module *m, zs_tensor *x, zs_tensor *y)
{
    zs_tensor *l = zs_gpt_loss(m, x, y);
    *(double *)ctx += l ? zs_item(l) : 0;
    return l;
}

typedef struct run {
    double loss[STEPS];
    int n;
    bool dry;
    size_t cap_peak;
    char log[4096];
} run;

static int on_step(void *ctx, const zs_train_event *e)
{
    run *r = ctx;
    if (r->n < STEPS)
        r->loss[r->n++] = e->loss;
    return 0;
}

static void train(bool graph, bool chatty, run *r)
{
    memset(r, 0, sizeof *r);
    zs_manual_seed(77);
    zs_module *m = zs_gpt_new(&GPT2, 3);
    zs_trainer_config c = zs_trainer_defaults();
    c.steps = c.schedule.total_steps = STEPS;
    c.schedule.base_lr = 1e-2;
    c.clip = 0.5;
    c.batch = tok_batch;
    double seen = 0;
    if (chatty)
        c.loss = chatty_loss, c.loss_ctx = &seen;
    c.on_step = on_step, c.on_step_ctx = r;
    c.graph = graph;
    FILE *log = tmpfile();
    c.log = log;
    zs_trainer *t = zs_trainer_new(m, &c);
    zs_status st = t ? zs_trainer_run(t) : ZS_ERR_STATE;
    ZT_CHECK(st == ZS_OK, "training: %s", zs_last_error());
    if (t) {
        r->dry = t->gdry;
        r->cap_peak = t->gpeak;
    }
    if (log) {
        rewind(log);
        size_t k = fread(r->log, 1, sizeof r->log - 1, log);
        r->log[k] = '\0';
        fclose(log);
    }
    zs_trainer_free(t);
    zs_module_free(m);
}

static void test_trainer(void)
{
    run e, d, f;
    train(false, false, &e);
    train(true, false, &d);
    train(true, true, &f);
    ZT_CHECK(e.n == STEPS && d.n == STEPS && !memcmp(e.loss, d.loss, sizeof e.loss),
             "dry-captured graph == eager over %d steps (last %.9g vs %.9g)", STEPS,
             e.loss[STEPS - 1], d.loss[STEPS - 1]);
    ZT_CHECK(d.dry && !strstr(d.log, "captured again"), "the trainer captured dry");
    ZT_CHECK(f.n == STEPS && !memcmp(e.loss, f.loss, sizeof e.loss),
             "fallback graph == eager over %d steps (last %.9g vs %.9g)", STEPS,
             e.loss[STEPS - 1], f.loss[STEPS - 1]);
    ZT_CHECK(!f.dry && strstr(f.log, "captured again running the kernels"),
             "a loss read on the host: captured again, noted in the log:\n%s", f.log);
    ZT_CHECK(d.cap_peak < f.cap_peak, "the dry capture step peaks below the eager "
             "capture step (%zu vs %zu bytes)", d.cap_peak, f.cap_peak);
    printf("trainer: GPT tiny, %d steps bit for bit; capture step peak dry %.1f KiB, "
           "eager capture %.1f KiB\n", STEPS, d.cap_peak / 1024.0, f.cap_peak / 1024.0);
    zt_section("trainer: dry capture, and the fallback when the step reads a value");
}

int main(void)
{
    test_step();
    test_batch_norm();
    test_host_read();
    test_profile();
    test_trainer();
    return zt_done();
}
