/*
 * test_graph_amp.c - the trainer's graph mode in mixed precision
 * (src/train/graph_step.c with src/train/precision.c).
 *
 * - bf16, fp16 and fp8 graph runs give the eager runs' losses, loss
 *   scales, skipped steps and final parameters bit for bit over 20 steps
 *   (GPT tiny, clipping on): the captured step holds the flat weights'
 *   conversion (a copy_ into the trainer's low buffer, replayed every
 *   step, then split into per-use casts and the copy freed) and the scaled
 *   loss; the scaler's unscale, Inf/NaN check, skip and update run eagerly
 *   after each replay.
 * - fp16 with Inf injected at steps 2, 3 and 7 (the loss times a factor
 *   tensor the batch function sets, so the captured graph sees it): the
 *   same steps are skipped as eager, the scale backs off there, and each
 *   new scale is a new capture (4 captures).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/internal.h"
#include "testutil.h"

#define STEPS 20

typedef struct record {
    int n;
    double loss[STEPS], scale[STEPS];
    bool skipped[STEPS];
} record;

static int on_step(void *ctx, const zs_train_event *e)
{
    record *r = ctx;
    if (r->n < STEPS) {
        r->loss[r->n] = e->loss;
        r->scale[r->n] = e->loss_scale;
        r->skipped[r->n] = e->skipped;
        r->n++;
    }
    return 0;
}

/* The loss factor: 1, or Inf at the injected steps (a persistent [] f32
 * tensor, an input of the captured graph). */
static zs_tensor *factor;
static const int *inject;

/* GPT batches: 4 rows of 12 tokens from 61, index-dependent; sets the
 * factor for this step. */
static zs_status tok_batch(void *ctx, int64_t index, zs_tensor **x, zs_tensor **y)
{
    (void)ctx;
    float f = 1;
    for (int i = 0; inject && inject[i] >= 0; i++)
        if (inject[i] == index)
            f = INFINITY;
    *(float *)zs_data(factor) = f;
    return zt_token_batch(index, 4, x, y);
}

static zs_tensor *factor_loss(void *ctx, zs_module *m, zs_tensor *x, zs_tensor *y)
{
    (void)ctx;
    zs_tensor *l = zs_gpt_loss(m, x, y);
    return l ? zs_mul(l, factor) : NULL;
}

static const zs_gpt_config GPT2 = {ZS_GPT2, 61, 16, 2, 2, 16};

/* STEPS steps at precision p (graph or eager); the final flat parameters
 * (a new tensor). */
static zs_tensor *train(zs_dtype p, bool graph, record *r, int64_t *captures)
{
    zs_manual_seed(77);
    zs_module *m = zs_gpt_new(&GPT2, 3);
    zs_trainer_config c = zs_trainer_defaults();
    c.steps = c.schedule.total_steps = STEPS;
    c.optim.lr = c.schedule.base_lr = 1e-2;
    c.schedule.warmup_steps = 3;
    c.clip = 0.5;
    c.batch = tok_batch;
    c.loss = factor_loss;
    c.on_step = on_step, c.on_step_ctx = r;
    c.comm = NULL;
    c.precision = p;
    if (p == ZS_F16 || p == ZS_F8E4M3) {
        c.scaler = zs_grad_scaler_defaults();
        c.scaler.init_scale = 1024;
    }
    c.graph = graph;
    zs_trainer *t = zs_trainer_new(m, &c);
    zs_status st = t ? zs_trainer_run(t) : ZS_ERR_STATE;
    ZT_CHECK(st == ZS_OK, "training (%s, %s): %s", zs_precision_name(p),
             graph ? "graph" : "eager", zs_last_error());
    zs_tensor *fp = t ? zs_clone(zs_trainer_flat_params(t)) : NULL;
    *captures = t ? t->captures : 0;
    /* graph: every weight read converts its own range (graph/casts.c), so
     * the trainer's flat low-precision copy is freed while it replays */
    ZT_CHECK(!t || !graph || !t->fp_low, "%s graph: the flat low-precision weights are "
             "still held", zs_precision_name(p));
    zs_trainer_free(t);
    zs_module_free(m);
    return fp;
}

static bool same_bits(const zs_tensor *a, const zs_tensor *b)
{
    return a && b && zs_nbytes(a) == zs_nbytes(b) &&
           !memcmp(zs_data(a), zs_data(b), zs_nbytes(a));
}

static void check(zs_dtype p, const int *inj, int64_t want_captures, int want_skips)
{
    inject = inj;
    record re = {0}, rg = {0};
    int64_t ce = 0, cg = 0;
    zs_tensor *pe = train(p, false, &re, &ce);
    zs_tensor *pg = train(p, true, &rg, &cg);
    const char *name = zs_precision_name(p);
    ZT_CHECK(re.n == STEPS && rg.n == STEPS, "%s: %d and %d steps", name, re.n, rg.n);
    int first = -1, skips = 0;
    for (int s = 0; s < STEPS; s++) {
        skips += re.skipped[s];
        if (first < 0 && (memcmp(&re.loss[s], &rg.loss[s], sizeof re.loss[s]) ||
                          re.scale[s] != rg.scale[s] || re.skipped[s] != rg.skipped[s]))
            first = s;
    }
    ZT_CHECK(first < 0, "%s: graph differs from eager at step %d (loss %.9g vs %.9g, "
             "scale %g vs %g, skipped %d vs %d)", name, first,
             first < 0 ? 0 : re.loss[first], first < 0 ? 0 : rg.loss[first],
             first < 0 ? 0 : re.scale[first], first < 0 ? 0 : rg.scale[first],
             first < 0 ? 0 : re.skipped[first], first < 0 ? 0 : rg.skipped[first]);
    ZT_CHECK(same_bits(pe, pg), "%s: parameters after %d steps differ", name, STEPS);
    ZT_CHECK(skips == want_skips, "%s: %d steps skipped, expected %d", name, skips,
             want_skips);
    for (int i = 0; inj && inj[i] >= 0; i++)
        ZT_CHECK(re.skipped[inj[i]], "%s: injected step %d skipped", name, inj[i]);
    ZT_CHECK(cg == want_captures, "%s: %lld captures, expected %lld", name,
             (long long)cg, (long long)want_captures);
    ZT_CHECK(re.loss[STEPS - 1] != re.loss[0], "%s: the steps change the loss", name);
    printf("%s%s: %d steps, graph == eager bit for bit (loss %.6f -> %.6f, %d "
           "skipped), %lld capture%s\n", name, inj ? " with Inf injected" : "", STEPS,
           rg.loss[0], rg.loss[STEPS - 1], skips, (long long)cg, cg == 1 ? "" : "s");
    zs_release(pe);
    zs_release(pg);
}

int main(void)
{
    factor = zs_scalar(ZS_F32, 1.0);
    check(ZS_BF16, NULL, 1, 0);
    check(ZS_F16, NULL, 1, 0);
    check(ZS_F8E4M3, NULL, 1, 0);
    zt_section("graph mode in bf16, fp16, fp8 equals eager bit for bit");
    static const int inj[] = {2, 3, 7, -1};
    check(ZS_F16, inj, 4, 3); /* the scale backs off 3 times: 3 recaptures */
    zt_section("fp16 graph with injected Inf skips the eager steps");
    zs_release(factor);
    return zt_done();
}
