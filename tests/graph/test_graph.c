/*
 * test_graph.c - captured graphs (zs/graph.h) and the trainer's graph
 * mode.
 *
 * - The trainer with graph = true gives the eager losses, gradient norms
 *   and final parameters bit for bit (f32, 20 steps, AdamW, clipping on,
 *   a warm-up then cosine lr: a new lr every step) for GPT (gpt2 and
 *   bloom, tiny), LeNet and ResNet (small), and for an MLP with dropout
 *   (the replay draws new numbers in the eager order); a last shorter
 *   batch recaptures and still matches; SGD with momentum (clipping on
 *   and off) and Adam too. The captured graph holds the clip factor and
 *   the update (the optimizer runs inside the replay).
 * - Each pass alone on small graphs: dead-code elimination removes what
 *   nobody reads and keeps in-place writes of pre-existing tensors; the
 *   memory plan shares bytes (arena < the intermediates), passes its
 *   verifier, replays to the same bits, and the verifier catches a plan
 *   made wrong on purpose.
 * - The dump's FLOP total of a captured GPT step equals zs analyze's
 *   prediction for the same model and batch.
 * - Errors: nested capture, replay while capturing or of nothing, a bad
 *   end, passes on a graph being captured, graph mode with accum 2.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "graph/internal.h"
#include "train/internal.h"
#include "testutil.h"

#define STEPS 20

typedef struct losses {
    int n;
    double v[64], norm[64];
} losses;

static int record_loss(void *ctx, const zs_train_event *e)
{
    losses *l = ctx;
    if (l->n < 64) {
        l->norm[l->n] = e->grad_norm;
        l->v[l->n++] = e->loss;
    }
    return 0;
}

/* The optimizer and clipping of the runs (check_model's callers set them). */
static zs_optim_config g_optim;
static double g_clip;

/* Nodes of g running op (by name). */
static int count_op(const zs_graph *g, const char *op)
{
    int k = 0;
    for (int i = 0; g && i < g->n; i++)
        k += !strcmp(g->nodes[i]->call.def->op.name, op);
    return k;
}

/* GPT batches: 4 rows of 12 tokens from 61, index-dependent. */
static zs_status tok_batch(void *ctx, int64_t index, zs_tensor **x, zs_tensor **y)
{
    int64_t rows = ctx ? *(const int64_t *)ctx : 0; /* last-batch rows, or 0 */
    return zt_token_batch(index, rows && index == STEPS - 1 ? (int)rows : 4, x, y);
}

/* Images [6, 1, 28, 28] and labels in [0, 10), index-dependent. */
static zs_status img_batch(void *ctx, int64_t index, zs_tensor **x, zs_tensor **y)
{
    (void)ctx;
    int64_t lab[6];
    for (int i = 0; i < 6; i++)
        lab[i] = (index * 7 + i * 3) % 10;
    *x = zt_rand(ZS_F32, 4, (int64_t[]){6, 1, 28, 28}, 1000 + (uint64_t)index);
    *y = zs_from_data(ZS_I64, ZS_SHAPE(6), lab);
    return *x && *y ? ZS_OK : ZS_ERR_NOMEM;
}

/* Vectors [8, 12] and labels in [0, 5) for the dropout MLP. */
static zs_status vec_batch(void *ctx, int64_t index, zs_tensor **x, zs_tensor **y)
{
    (void)ctx;
    int64_t lab[8];
    for (int i = 0; i < 8; i++)
        lab[i] = (index + i * 2) % 5;
    *x = zt_rand(ZS_F32, 2, (int64_t[]){8, 12}, 500 + (uint64_t)index);
    *y = zs_from_data(ZS_I64, ZS_SHAPE(8), lab);
    return *x && *y ? ZS_OK : ZS_ERR_NOMEM;
}

typedef zs_module *(*make_fn)(void);

static const zs_gpt_config GPT2 = {ZS_GPT2, 61, 16, 2, 2, 16};
static const zs_gpt_config BLOOM = {ZS_BLOOM, 61, 16, 2, 2, 16};
static zs_module *make_gpt2(void) { return zs_gpt_new(&GPT2, 3); }
static zs_module *make_bloom(void) { return zs_gpt_new(&BLOOM, 3); }
static zs_module *make_lenet(void) { return zs_lenet5_new(4); }
static zs_module *make_resnet(void) { return zs_resnet_small_new(5); }
static zs_module *make_mlp(void)
{
    zs_module *mods[] = {zs_linear_new(12, 16, true, ZS_INIT_DEFAULT, 6),
                         zs_activation_new(ZS_ACT_RELU), zs_dropout_new(0.3),
                         zs_linear_new(16, 5, true, ZS_INIT_DEFAULT, 7)};
    return zs_sequential_new(4, mods);
}

/* Runs STEPS steps (graph or eager) from the same seeds; losses into l,
 * the final flat parameters (a new tensor) returned. */
static zs_tensor *train(make_fn make, zs_batch_fn batch, void *bctx, bool cnn,
                        bool graph, losses *l, int64_t *captures)
{
    zs_manual_seed(77);
    zs_module *m = make();
    zs_trainer_config c = zs_trainer_defaults();
    c.steps = c.schedule.total_steps = STEPS;
    c.optim = g_optim;
    c.optim.lr = c.schedule.base_lr = 1e-2;
    c.schedule.warmup_steps = 3;
    c.clip = g_clip;
    c.batch = batch, c.batch_ctx = bctx;
    if (cnn)
        c.loss = zs_classifier_loss;
    c.on_step = record_loss, c.on_step_ctx = l;
    c.comm = NULL;
    c.graph = graph;
    zs_trainer *t = zs_trainer_new(m, &c);
    zs_status st = t ? zs_trainer_run(t) : ZS_ERR_STATE;
    ZT_CHECK(st == ZS_OK, "training (%s): %s", graph ? "graph" : "eager",
             zs_last_error());
    zs_tensor *p = t ? zs_clone(zs_trainer_flat_params(t)) : NULL;
    if (captures)
        *captures = t ? t->captures : 0;
    if (graph && t) { /* the optimizer ran inside the graph */
        const char *upd = g_optim.kind == ZS_SGD ? "sgd_update_dyn" : "adam_update_dyn";
        ZT_CHECK(count_op(t->graph, upd) == 1 &&
                 count_op(t->graph, "clip_coef") == (g_clip > 0),
                 "the captured step holds %s and %s clip_coef", upd,
                 g_clip > 0 ? "a" : "no");
    }
    zs_trainer_free(t);
    zs_module_free(m);
    return p;
}

static bool same_bits(const zs_tensor *a, const zs_tensor *b)
{
    return a && b && zs_nbytes(a) == zs_nbytes(b) &&
           !memcmp(zs_data(a), zs_data(b), zs_nbytes(a));
}

static void check_model(const char *name, make_fn make, zs_batch_fn batch, void *bctx,
                        bool cnn, int64_t want_captures)
{
    losses le = {0}, lg = {0};
    int64_t caps = 0;
    zs_tensor *pe = train(make, batch, bctx, cnn, false, &le, NULL);
    zs_tensor *pg = train(make, batch, bctx, cnn, true, &lg, &caps);
    bool same = le.n == STEPS && lg.n == STEPS &&
                !memcmp(le.v, lg.v, sizeof le.v[0] * STEPS);
    ZT_CHECK(same, "%s: graph losses differ from eager (steps %d, %d; first "
             "%.9g vs %.9g, last %.9g vs %.9g)", name, le.n, lg.n, le.v[0], lg.v[0],
             le.v[STEPS - 1], lg.v[STEPS - 1]);
    ZT_CHECK(same_bits(pe, pg), "%s: parameters after %d steps differ", name, STEPS);
    ZT_CHECK(!memcmp(le.norm, lg.norm, sizeof le.norm[0] * STEPS), "%s: gradient "
             "norms differ (first %.9g vs %.9g)", name, le.norm[0], lg.norm[0]);
    int clipped = 0;
    for (int i = 0; i < le.n; i++)
        clipped += g_clip > 0 && le.norm[i] > g_clip;
    ZT_CHECK(g_clip == 0 || clipped > 0, "%s: clipping is exercised (a norm above %g)",
             name, g_clip);
    ZT_CHECK(caps == want_captures, "%s: %lld captures, expected %lld", name,
             (long long)caps, (long long)want_captures);
    ZT_CHECK(le.v[STEPS - 1] != le.v[0], "%s: the steps change the loss (%.4f -> "
             "%.4f)", name, le.v[0], le.v[STEPS - 1]);
    printf("%s: %d steps, graph == eager bit for bit (loss %.6f -> %.6f; %d steps "
           "clipped), %lld capture%s\n", name, STEPS, lg.v[0], lg.v[STEPS - 1], clipped,
           (long long)caps, caps == 1 ? "" : "s");
    zs_release(pe);
    zs_release(pg);
}

static void test_trainer_models(void)
{
    g_optim = zs_trainer_defaults().optim; /* AdamW */
    g_clip = 0.5;
    check_model("gpt2 tiny", make_gpt2, tok_batch, NULL, false, 1);
    check_model("bloom tiny", make_bloom, tok_batch, NULL, false, 1);
    check_model("lenet", make_lenet, img_batch, NULL, true, 1);
    check_model("resnet small", make_resnet, img_batch, NULL, true, 1);
    check_model("mlp with dropout 0.3", make_mlp, vec_batch, NULL, true, 1);
    int64_t rows = 3; /* the last batch has 3 rows instead of 4 */
    check_model("gpt2 tiny, shorter last batch", make_gpt2, tok_batch, &rows, false, 2);
    /* the other optimizers in the graph, clipping on and off */
    g_optim = (zs_optim_config){ZS_SGD, 0, 0.9, false, 1e-4, 0, 0, 0};
    check_model("gpt2 tiny, sgd momentum, clip 0.5", make_gpt2, tok_batch, NULL, false, 1);
    g_clip = 0;
    check_model("gpt2 tiny, sgd momentum, no clip", make_gpt2, tok_batch, NULL, false, 1);
    check_model("lenet, sgd momentum, no clip", make_lenet, img_batch, NULL, true, 1);
    g_optim = (zs_optim_config){ZS_ADAM, 0, 0, false, 0.01, 0.9, 0.999, 1e-8};
    check_model("bloom tiny, adam, no clip", make_bloom, tok_batch, NULL, false, 1);
    g_clip = 0.05;
    check_model("resnet small, adam, clip 0.05", make_resnet, img_batch, NULL, true, 1);
    zt_section("trainer: graph mode equals eager bit for bit");
}

/* ---- passes on small graphs ------------------------------------------------ */

/* c = exp(2 x) + x, with sin(exp(2 x)) dead and y += x in place. */
static zs_graph *small_graph(zs_tensor *x, zs_tensor *y, zs_tensor **c)
{
    zs_graph *g = zs_graph_capture_begin();
    zs_tensor *b = zs_exp(zs_mul_scalar(x, 2.0));
    zs_tensor *dead = zs_sin(b);
    *c = zs_add(b, x);
    zs_axpy_(y, 1.0, x);
    ZT_CHECK(zs_graph_capture_end(g) == ZS_OK, "capture: %s", zs_last_error());
    (void)dead;
    return g;
}

static void test_dce(void)
{
    zs_scope_push();
    zs_tensor *x = zt_rand(ZS_F32, 2, (int64_t[]){7, 13}, 1);
    zs_tensor *y = zs_zeros(ZS_F32, 2, (int64_t[]){7, 13});
    zs_tensor *c;
    zs_graph *g = small_graph(x, y, &c);
    ZT_CHECK(zs_graph_size(g) == 5, "5 nodes captured (got %d)", zs_graph_size(g));
    int removed = zs_graph_dce(g, 1, &c);
    ZT_CHECK(removed == 1 && zs_graph_size(g) == 4, "dce removes sin only (removed %d, "
             "%d left)", removed, zs_graph_size(g));
    /* new x: the replay recomputes c and adds x into y again */
    zs_tensor *x2 = zt_rand(ZS_F32, 2, (int64_t[]){7, 13}, 2);
    zs_copy_(x, x2);
    ZT_CHECK(zs_graph_replay(g) == ZS_OK, "replay: %s", zs_last_error());
    zs_tensor *ref = zs_add(zs_exp(zs_mul_scalar(x2, 2.0)), x2);
    zs_tensor *yref = zs_add(zt_rand(ZS_F32, 2, (int64_t[]){7, 13}, 1), x2);
    ZT_CHECK(same_bits(c, ref), "replayed c equals eager on the new x");
    ZT_CHECK(same_bits(y, yref), "the in-place axpy_ on y was kept and replayed");
    zs_tensor *none[1] = {NULL};
    zs_graph *g2 = small_graph(x, y, &c);
    ZT_CHECK(zs_graph_dce(g2, 0, none) == 4, "without keep only the in-place write "
             "stays");
    zs_graph_free(g2);
    zs_graph_free(g);
    zs_scope_pop();
    zt_section("dead-code elimination");
}

static void test_memory_plan(void)
{
    zs_scope_push();
    int64_t shape[2] = {33, 17};
    zs_tensor *x = zt_rand(ZS_F32, 2, shape, 3);
    zs_graph *g = zs_graph_capture_begin();
    zs_tensor *h = x, *h0 = NULL;
    for (int i = 0; i < 12; i++) { /* a chain: each result dies after the next */
        h = i % 3 == 0 ? zs_tanh(h) : i % 3 == 1 ? zs_mul_scalar(h, 1.5)
                                    : zs_add(h, i > 3 ? h0 : x);
        h0 = h0 ? h0 : h; /* but the first lives to the end */
    }
    ZT_CHECK(zs_graph_capture_end(g) == ZS_OK, "capture");
    zs_graph_stats s0, s1;
    zs_graph_get_stats(g, &s0);
    zs_alloc_stats a0, a1;
    zs_alloc_get_stats(&a0);
    zs_alloc_reset_peak();
    ZT_CHECK(zs_graph_plan_memory(g, 1, &h) == ZS_OK, "plan: %s", zs_last_error());
    zs_alloc_get_stats(&a1);
    /* the dead blocks go before the arena comes: planning adds no peak */
    ZT_CHECK(a1.peak_bytes <= a0.current_bytes && a1.current_bytes < a0.current_bytes,
             "planning raised the allocator's peak from %zu to %zu bytes (now %zu)",
             a0.current_bytes, a1.peak_bytes, a1.current_bytes);
    zs_graph_get_stats(g, &s1);
    ZT_CHECK(s1.planned_bytes > 0 && s1.planned_bytes <= s0.intermediate_bytes / 3,
             "the arena (%zu bytes) is at most a third of the intermediates (%zu)",
             s1.planned_bytes, s0.intermediate_bytes);
    ZT_CHECK(zs_graph_plan_verify(g) == ZS_OK, "verifier: %s", zs_last_error());
    printf("memory plan: 12 intermediates of %zu bytes in a %zu-byte arena\n",
           s0.intermediate_bytes, s1.planned_bytes);
    zs_tensor *x2 = zt_rand(ZS_F32, 2, shape, 4);
    zs_copy_(x, x2);
    ZT_CHECK(zs_graph_replay(g) == ZS_OK, "replay: %s", zs_last_error());
    zs_tensor *r = x2, *r0 = NULL;
    for (int i = 0; i < 12; i++) {
        r = i % 3 == 0 ? zs_tanh(r) : i % 3 == 1 ? zs_mul_scalar(r, 1.5)
                                    : zs_add(r, i > 3 ? r0 : x2);
        r0 = r0 ? r0 : r;
    }
    ZT_CHECK(same_bits(h, r), "the planned replay equals eager");
    /* pointwise results were written over their dead inputs */
    zsi_gplan *p = g->plan;
    int shared = 0;
    for (int i = 0; i < g->nplan; i++)
        shared += p[i].group != p[i].s;
    ZT_CHECK(shared >= 8, "%d of %d buffers written over a dead input (expected >= 8)",
             shared, g->nplan);
    printf("memory plan: %d of %d results written over their dead input\n", shared,
           g->nplan);
    /* a wrong plan: two buffers of different groups alive together at one
     * offset */
    int a = -1, b = -1;
    for (int i = 0; i < g->nplan && b < 0; i++)
        for (int j = i + 1; j < g->nplan && b < 0; j++)
            if (p[i].group != p[j].group && p[i].first <= p[j].last &&
                p[j].first <= p[i].last)
                a = i, b = j;
    ZT_CHECK(b >= 0, "two buffers alive together");
    if (b >= 0) {
        size_t keep = p[b].offset;
        p[b].offset = p[a].offset;
        ZT_EXPECT_ERROR(zs_graph_plan_verify(g) != ZS_OK, "overlap");
        p[b].offset = keep;
        p[a].offset = g->arena_bytes; /* outside the arena */
        ZT_EXPECT_ERROR(zs_graph_plan_verify(g) != ZS_OK, "outside");
    }
    zs_graph_free(g);
    zs_scope_pop();
    zt_section("memory plan by liveness");
}

/* ---- dump and FLOPs ---------------------------------------------------------- */

static void test_dump_flops(void)
{
    const int64_t V = 97, B = 2, T = 16;
    zs_gpt_config gc = {.arch = ZS_GPT2, .vocab = V};
    zs_gpt_preset("tiny", &gc);
    const zs_model_config *pre = zs_model_preset("gpt-tiny");
    zs_model_config mc = pre ? *pre : (zs_model_config){0};
    char vocab[32];
    snprintf(vocab, sizeof vocab, "%lld", (long long)V);
    const char *keys[] = {"vocab", "learned_pos", "embed_norm"};
    const char *vals[] = {vocab, "true", "false"};
    ZT_CHECK(pre && zs_model_config_set_many(&mc, 3, keys, vals) == ZS_OK,
             "analyzer config: %s", zs_last_error());
    zs_module *m = zs_gpt_new(&gc, 1);
    zs_scope_push();
    zs_tensor *x = zs_zeros(ZS_I64, 2, (int64_t[]){B, T});
    zs_tensor *y = zs_ones(ZS_I64, 2, (int64_t[]){B, T});
    zs_graph *g = zs_graph_capture_begin();
    zs_tensor *l = zs_gpt_loss(m, x, y);
    zs_status st = l ? zs_backward(l, NULL, false) : ZS_ERR_STATE;
    ZT_CHECK(zs_graph_capture_end(g) == ZS_OK && st == ZS_OK, "capture a GPT step");
    /* the analyzer counts the step as eager runs it: the q, k, v slices'
     * gradients added into one buffer in place, as the slices pass makes
     * the captured form (2 slice_backward + adds per layer) do */
    zs_graph_stats s;
    zs_graph_get_stats(g, &s);
    double before = s.flops;
    ZT_CHECK(zs_graph_fuse_slices(g, 1, &l) == 5 * gc.layers,
             "slices pass: %s", zs_last_error());
    zs_graph_get_stats(g, &s);
    ZT_CHECK(s.flops < before, "the pass removed the adds' FLOPs");
    double predicted = zs_analyze_engine_step_flops(&mc, B, T, NULL);
    ZT_CHECK(s.flops == predicted, "graph FLOPs %.0f, zs analyze predicts %.0f",
             s.flops, predicted);
    char path[] = "/tmp/zs_graph_dumpXXXXXX";
    int fd = mkstemp(path);
    FILE *f = fd >= 0 ? fdopen(fd, "w+") : NULL;
    ZT_CHECK(f && zs_graph_dump_text(g, f, "gpt tiny") == ZS_OK, "dump text");
    char line[4096], want[128];
    double total = -1;
    int lines = 0;
    if (f) {
        rewind(f);
        while (fgets(line, sizeof line, f)) {
            lines++;
            if (!strncmp(line, "# total:", 8))
                sscanf(line, "# total: nodes %*d flops %lf", &total);
        }
        fclose(f);
    }
    snprintf(want, sizeof want, "%.0f", predicted);
    ZT_CHECK(total == predicted, "the dump's total %.0f equals zs analyze's %s", total,
             want);
    ZT_CHECK(lines == s.nodes + 3, "a line per node (%d lines, %d nodes)", lines,
             s.nodes);
    FILE *d = fopen(path, "w");
    ZT_CHECK(d && zs_graph_dump_dot(g, d, "gpt tiny") == ZS_OK, "dump dot");
    if (d)
        fclose(d);
    remove(path);
    printf("gpt tiny B=%lld T=%lld: %d nodes, %.0f FLOPs (= zs analyze)\n",
           (long long)B, (long long)T, s.nodes, s.flops);
    zs_graph_free(g);
    zs_scope_pop();
    zs_module_free(m);
    zt_section("dump: FLOPs agree with zs analyze");
}

/* ---- errors -------------------------------------------------------------------- */

static void test_errors(void)
{
    zs_graph *g = zs_graph_capture_begin();
    ZT_EXPECT_ERROR(zs_graph_capture_begin() == NULL, "already captures");
    ZT_EXPECT_ERROR(zs_graph_replay(g) != ZS_OK, "still being captured");
    ZT_EXPECT_ERROR(zs_graph_dce(g, 0, NULL) < 0, "still being captured");
    ZT_EXPECT_ERROR(zs_graph_plan_memory(g, 0, NULL) != ZS_OK, "still being captured");
    ZT_EXPECT_ERROR(zs_graph_capture_end(NULL) != ZS_OK, "no graph");
    ZT_CHECK(zs_graph_capture_end(g) == ZS_OK, "end");
    ZT_EXPECT_ERROR(zs_graph_capture_end(g) != ZS_OK, "not the one");
    ZT_EXPECT_ERROR(zs_graph_replay(NULL) != ZS_OK, "no graph");
    ZT_CHECK(zs_graph_replay(g) == ZS_OK && zs_graph_size(g) == 0, "empty replay");
    zs_graph_free(g);
    zs_module *m = make_gpt2();
    zs_trainer_config c = zs_trainer_defaults();
    c.batch = tok_batch;
    c.graph = true;
    c.accum = 2;
    ZT_EXPECT_ERROR(zs_trainer_new(m, &c) == NULL, "graph mode runs one process, accum 1");
    c.accum = 1;
    c.graph = false;
    c.dump_graph = "/tmp/x";
    ZT_EXPECT_ERROR(zs_trainer_new(m, &c) == NULL, "dump_graph needs graph");
    zs_module_free(m);
    zt_section("errors");
}

/* Images as img_batch, the last of DUMP_STEPS with 3 rows. */
enum { DUMP_STEPS = 5 };
static zs_status img_batch_short(void *ctx, int64_t index, zs_tensor **x, zs_tensor **y)
{
    zs_status st = img_batch(ctx, index, x, y);
    if (st != ZS_OK || index != DUMP_STEPS - 1)
        return st;
    *x = zs_narrow(*x, 0, 0, 3);
    *y = zs_narrow(*y, 0, 0, 3);
    return *x && *y ? ZS_OK : ZS_ERR_NOMEM;
}

/* --dump-graph through the trainer: FILE has the first graph before and
 * after the passes and its replay profile, FILE.dot both digraphs; the
 * last, shorter batch recaptures and is not written over them. */
static void test_trainer_dump(void)
{
    char path[] = "/tmp/zs_graph_trainerXXXXXX", dot[64];
    int fd = mkstemp(path);
    if (fd >= 0)
        close(fd);
    snprintf(dot, sizeof dot, "%s.dot", path);
    zs_module *m = make_lenet();
    zs_trainer_config c = zs_trainer_defaults();
    c.steps = DUMP_STEPS;
    c.batch = img_batch_short;
    c.loss = zs_classifier_loss;
    c.graph = true;
    c.dump_graph = path;
    zs_trainer *t = zs_trainer_new(m, &c);
    ZT_CHECK(t && zs_trainer_run(t) == ZS_OK, "lenet with dump_graph: %s",
             zs_last_error());
    ZT_CHECK(t && t->captures == 2, "the short last batch recaptured (%lld captures)",
             t ? (long long)t->captures : -1LL);
    zs_trainer_free(t);
    zs_module_free(m);
    int titles = 0, graphs = 0, profiles = 0, full = 0, shorter = 0;
    long long replays = -1;
    char line[4096];
    FILE *f = fopen(path, "r");
    while (f && fgets(line, sizeof line, f)) {
        titles += !strncmp(line, "# graph:", 8);
        full += strstr(line, "f32[6, 1, 28, 28]") != NULL;
        shorter += strstr(line, "f32[3, 1, 28, 28]") != NULL;
        if (!strncmp(line, "# replay profile:", 17)) {
            profiles++;
            if (sscanf(line, "# replay profile: %lld replays", &replays) != 1)
                replays = -1;
        }
    }
    if (f)
        fclose(f);
    ZT_CHECK(full > 0 && shorter == 0, "the dump is the first graph's (%d lines with "
             "the full batch, %d with the short one)", full, shorter);
    ZT_CHECK(profiles == 1 && replays == DUMP_STEPS - 2, "one replay profile, of the "
             "first graph's %d replays (%d profiles, %lld replays)", DUMP_STEPS - 2,
             profiles, replays);
    f = fopen(dot, "r");
    while (f && fgets(line, sizeof line, f))
        graphs += !strncmp(line, "digraph", 7);
    if (f)
        fclose(f);
    ZT_CHECK(titles == 2 && graphs == 2, "the dump holds the graph before and after "
             "the passes (%d text, %d dot)", titles, graphs);
    remove(path);
    remove(dot);
    zt_section("trainer: dump_graph writes the first graph, before and after, and its "
               "profile");
}

int main(void)
{
    test_trainer_dump();
    test_errors();
    test_dce();
    test_memory_plan();
    test_dump_flops();
    test_trainer_models();
    return zt_done();
}
