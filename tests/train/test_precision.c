/*
 * test_precision.c - mixed precision in zs_trainer (precision.c):
 * a bf16 run of a tiny GPT whose loss falls and stays within a sane
 * distance of the fp32 run from the same seed; the weights converted once
 * per step (one pass of the flat buffer, also with accumulation); a bf16
 * run stopped at a checkpoint and resumed by a new trainer repeats the
 * uninterrupted run's losses exactly; fp16 with Inf injected into the
 * loss at chosen steps: exactly those steps skipped (parameters
 * untouched), the scale halving there and doubling after the growth
 * interval, metrics.jsonl saying so; bf16 on the test device gives the
 * CPU's losses; bad configs refused.
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "testutil.h"

static const zs_gpt_config TINY = {ZS_GPT2, 61, 16, 2, 2, 32};

/* A learnable stream (as test_trainer.c): token t of row r of batch i is
 * (3 i + 5 r + 7 t) mod 61, its target the next one; 8 rows of 12. */
static zs_status batch(void *ctx, int64_t index, zs_tensor **x, zs_tensor **y)
{
    (void)ctx;
    int64_t ids[8 * 13];
    for (int r = 0; r < 8; r++)
        for (int t = 0; t < 13; t++)
            ids[r * 13 + t] = (3 * index + 5 * r + 7 * t) % 61;
    zs_tensor *all = zs_from_data(ZS_I64, ZS_SHAPE(8, 13), ids);
    *x = zs_contiguous(zs_narrow(all, 1, 0, 12));
    *y = zs_contiguous(zs_narrow(all, 1, 1, 12));
    zs_release(all);
    return *x && *y ? ZS_OK : ZS_ERR_NOMEM;
}

typedef struct run {
    int n;
    double loss[64], scale[64];
    bool skipped[64];
    int64_t casts[64], cast_elems[64]; /* weight conversions per step */
    zs_trainer *t;
    float *prev;         /* the flat weights after the previous step */
    int64_t changed[64]; /* weights that moved in each step */
    const int *inject;   /* steps whose loss is multiplied by Inf */
    zs_train_log *log;
} run;

static int on_step(void *ctx, const zs_train_event *e)
{
    run *r = ctx;
    if (r->n >= 64)
        return 0;
    zs_autocast_stats s;
    zs_autocast_get_stats(&s);
    zs_autocast_reset_stats();
    r->loss[r->n] = e->loss;
    r->scale[r->n] = e->loss_scale;
    r->skipped[r->n] = e->skipped;
    r->casts[r->n] = s.weight_casts;
    r->cast_elems[r->n] = s.weight_cast_elems;
    if (r->t && r->prev) {
        zs_tensor *fp = zs_trainer_flat_params(r->t);
        const float *now = zs_data(fp);
        int64_t moved = 0;
        for (int64_t i = 0; i < zs_numel(fp); i++)
            moved += now[i] != r->prev[i];
        memcpy(r->prev, now, (size_t)zs_nbytes(fp));
        r->changed[r->n] = moved;
    }
    if (r->log)
        zs_train_log_event(r->log, e);
    r->n++;
    return 0;
}

/* zs_gpt_loss, times Inf at the steps r->inject lists (batch index =
 * step with accum 1). */
static int64_t loss_calls;
static zs_tensor *inf_loss(void *ctx, zs_module *m, zs_tensor *x, zs_tensor *y)
{
    const run *r = ctx;
    zs_tensor *l = zs_gpt_loss(m, x, y);
    int64_t step = loss_calls++;
    for (int i = 0; r->inject && r->inject[i] >= 0; i++)
        if (r->inject[i] == step) {
            zs_tensor *b = zs_mul_scalar(l, INFINITY);
            zs_release(l);
            return b;
        }
    return l;
}

static zs_trainer_config config(run *r, zs_dtype precision, int64_t steps)
{
    zs_trainer_config c = zs_trainer_defaults();
    c.steps = c.schedule.total_steps = steps;
    c.optim.lr = c.schedule.base_lr = 2e-2;
    c.schedule.min_lr = 2e-3;
    c.schedule.warmup_steps = 2;
    c.clip = 1.0;
    c.batch = batch;
    c.on_step = on_step, c.on_step_ctx = r;
    c.precision = precision;
    return c;
}

static zs_status train(run *r, zs_trainer_config *c, const char *resume_from)
{
    zs_module *m = zs_gpt_new(&TINY, 5);
    zs_trainer *t = zs_trainer_new(m, c);
    zs_status st = t ? ZS_OK : ZS_ERR_STATE;
    if (st == ZS_OK && resume_from)
        st = zs_trainer_resume(t, resume_from, NULL);
    r->t = t;
    if (t) {
        zs_tensor *fp = zs_trainer_flat_params(t);
        r->prev = malloc((size_t)zs_nbytes(fp));
        memcpy(r->prev, zs_data(fp), (size_t)zs_nbytes(fp));
    }
    zs_autocast_reset_stats();
    if (st == ZS_OK)
        st = zs_trainer_run(t);
    free(r->prev);
    r->prev = NULL;
    r->t = NULL;
    zs_trainer_free(t);
    zs_module_free(m);
    return st;
}

static void test_bf16_learns(void)
{
    run f32 = {0}, b16 = {0};
    zs_trainer_config c32 = config(&f32, ZS_F32, 30), c16 = config(&b16, ZS_BF16, 30);
    ZT_CHECK(train(&f32, &c32, NULL) == ZS_OK && f32.n == 30, "fp32 run");
    ZT_CHECK(train(&b16, &c16, NULL) == ZS_OK && b16.n == 30, "bf16 run: %s", zs_last_error());
    double a = (f32.loss[27] + f32.loss[28] + f32.loss[29]) / 3;
    double b = (b16.loss[27] + b16.loss[28] + b16.loss[29]) / 3;
    ZT_CHECK(b16.loss[29] < b16.loss[0] - 1.0, "bf16 learns: %.4f -> %.4f", b16.loss[0],
             b16.loss[29]);
    ZT_CHECK(fabs(b16.loss[0] - f32.loss[0]) < 0.02 * f32.loss[0],
             "first losses: bf16 %.4f, fp32 %.4f", b16.loss[0], f32.loss[0]);
    ZT_CHECK(fabs(a - b) < 0.1 * a + 0.05, "last 3 steps' mean loss: bf16 %.4f, fp32 %.4f "
             "(within 10%% + 0.05)", b, a);
    bool diff = false;
    for (int i = 0; i < 30; i++)
        diff = diff || b16.loss[i] != f32.loss[i];
    ZT_CHECK(diff, "bf16 differs from fp32 (it did run in bf16)");
    int64_t n = zs_gpt_param_count(&TINY), bad = 0;
    for (int i = 0; i < 30; i++)
        bad += b16.casts[i] != 1 || b16.cast_elems[i] != n || f32.casts[i] != 0;
    ZT_CHECK(bad == 0, "one weight conversion (of %lld elements) per bf16 step, none in "
             "fp32: %lld steps differ (step 0: %lld conversions of %lld)", (long long)n,
             (long long)bad, (long long)b16.casts[0], (long long)b16.cast_elems[0]);
    /* accumulation: still one conversion per step */
    run acc = {0};
    zs_trainer_config ca = config(&acc, ZS_BF16, 3);
    ca.accum = 3;
    ZT_CHECK(train(&acc, &ca, NULL) == ZS_OK && acc.n == 3 && acc.casts[0] == 1 &&
             acc.casts[2] == 1, "accum 3: %lld, %lld conversions per step",
             (long long)acc.casts[0], (long long)acc.casts[2]);
    zt_section("bf16 GPT: loss falls, close to fp32; weights converted once per step");
}

static void test_resume(const char *dir)
{
    char ckpt[4200];
    snprintf(ckpt, sizeof ckpt, "%s/bf16.safetensors", dir);
    run full = {0}, first = {0}, rest = {0};
    zs_trainer_config c = config(&full, ZS_BF16, 8);
    ZT_CHECK(train(&full, &c, NULL) == ZS_OK && full.n == 8, "uninterrupted bf16 run");
    c = config(&first, ZS_BF16, 8);
    c.checkpoint = ckpt, c.eval_every = 4, c.stop_after = 4;
    ZT_CHECK(train(&first, &c, NULL) == ZS_OK && first.n == 4, "stopped after 4");
    c = config(&rest, ZS_BF16, 8);
    ZT_CHECK(train(&rest, &c, ckpt) == ZS_OK && rest.n == 4, "resumed: %d steps", rest.n);
    bool same = true;
    for (int i = 0; i < 4; i++)
        same = same && first.loss[i] == full.loss[i] && rest.loss[i] == full.loss[4 + i];
    ZT_CHECK(same, "bf16 resumed run repeats the uninterrupted losses exactly "
             "(step 4: %.9g vs %.9g)", rest.loss[0], full.loss[4]);
    zt_section("a bf16 run resumed from its f32 checkpoint continues exactly");
}

static void test_fp16_skips(const char *dir)
{
    static const int inject[] = {2, 3, 7, -1};
    run r = {.inject = inject};
    zs_trainer_config c = config(&r, ZS_F16, 11);
    c.loss = inf_loss, c.loss_ctx = &r;
    c.scaler = zs_grad_scaler_defaults();
    c.scaler.init_scale = 1024;
    c.scaler.growth_interval = 2;
    ZT_CHECK((r.log = zs_train_log_open(dir, false, true)) != NULL, "log");
    loss_calls = 0;
    ZT_CHECK(train(&r, &c, NULL) == ZS_OK && r.n == 11, "fp16 run: %s", zs_last_error());
    zs_train_log_close(r.log);
    double scale = 1024;
    int tracker = 0, wrong = 0;
    for (int s = 0; s < r.n; s++) {
        bool inj = s == 2 || s == 3 || s == 7;
        bool ok = r.skipped[s] == inj && r.scale[s] == scale &&
                  (inj ? r.changed[s] == 0 : r.changed[s] > 0);
        if (!ok)
            fprintf(stderr, "step %d: skipped %d (expected %d), scale %g (expected %g), "
                    "%lld weights moved\n", s, r.skipped[s], inj, r.scale[s], scale,
                    (long long)r.changed[s]);
        wrong += !ok;
        if (inj) {
            scale /= 2;
            tracker = 0;
        } else if (++tracker == 2) {
            scale *= 2;
            tracker = 0;
        }
    }
    ZT_CHECK(wrong == 0, "injected steps 2, 3, 7: exactly those skipped with the weights "
             "untouched, scale halved there and doubled after 2 clean steps (%d wrong)",
             wrong);
    char path[4200], line[1024];
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    FILE *f = fopen(path, "r");
    int lines = 0, skipped = 0, fp16 = 0;
    while (f && fgets(line, sizeof line, f)) {
        if (!strstr(line, "\"loss_scale\""))
            continue;
        lines++;
        skipped += strstr(line, "\"skipped\":true") != NULL;
        fp16 += strstr(line, "\"precision\":\"fp16\"") != NULL;
    }
    if (f)
        fclose(f);
    ZT_CHECK(lines == 11 && skipped == 3 && fp16 == 11, "metrics.jsonl: %d step lines, %d "
             "skipped, %d fp16 (expected 11, 3, 11)", lines, skipped, fp16);
    zt_section("fp16: injected Inf skips exactly those steps; scale; metrics.jsonl");
}

static void test_device(void)
{
    if (zs_test_device_enable() != ZS_OK) {
        ZT_CHECK(0, "test device: %s", zs_last_error());
        return;
    }
    run cpu = {0}, dev = {0};
    zs_trainer_config c = config(&cpu, ZS_BF16, 3);
    ZT_CHECK(train(&cpu, &c, NULL) == ZS_OK, "cpu");
    c = config(&dev, ZS_BF16, 3);
    c.device = ZS_TEST_DEVICE;
    run *r = &dev;
    zs_module *m = zs_gpt_new(&TINY, 5);
    zs_trainer *t = zs_trainer_new(m, &c);
    ZT_CHECK(t && zs_trainer_run(t) == ZS_OK && r->n == 3, "bf16 on the test device: %s",
             zs_last_error());
    zs_trainer_free(t);
    zs_module_free(m);
    ZT_CHECK(dev.loss[0] == cpu.loss[0] && dev.loss[2] == cpu.loss[2],
             "test device losses %.9g %.9g, cpu %.9g %.9g", dev.loss[0], dev.loss[2],
             cpu.loss[0], cpu.loss[2]);
    zt_section("bf16 training on the test device: the CPU's losses");
}

static void test_errors(void)
{
    run r = {0};
    zs_module *m = zs_gpt_new(&TINY, 5);
    zs_trainer_config c = config(&r, ZS_I32, 3);
    ZT_EXPECT_ERROR(zs_trainer_new(m, &c) == NULL, "precision i32");
    c = config(&r, ZS_F64, 3);
    ZT_EXPECT_ERROR(zs_trainer_new(m, &c) == NULL, "expected f32, bf16, f16 or f8e4m3");
    c = config(&r, ZS_F16, 3);
    c.sync = ZS_SYNC_PS;
    ZT_EXPECT_ERROR(zs_trainer_new(m, &c) == NULL, "fp16 scales the loss");
    c = config(&r, ZS_F16, 3);
    c.scaler.init_scale = -1;
    ZT_EXPECT_ERROR(zs_trainer_new(m, &c) == NULL, "grad_scaler: bad config");
    ZT_CHECK(zs_precision_parse("bf16") == ZS_BF16 && zs_precision_parse("fp8") == ZS_F8E4M3 &&
             zs_precision_parse("fp16") == ZS_F16 && zs_precision_parse("fp32") == ZS_F32 &&
             zs_precision_parse("int8") < 0 && zs_precision_parse(NULL) < 0,
             "zs_precision_parse");
    ZT_CHECK(!strcmp(zs_precision_name(ZS_F8E4M3), "fp8") &&
             !strcmp(zs_precision_name(ZS_I64), "?"), "zs_precision_name");
    zs_module_free(m);
    zt_section("bad precisions and combinations are refused");
}

int main(void)
{
    char dir[] = "/tmp/zs_precision_XXXXXX";
    if (!mkdtemp(dir))
        return 1;
    test_bf16_learns();
    test_resume(dir);
    test_fp16_skips(dir);
    test_device();
    test_errors();
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
    return zt_done();
}
