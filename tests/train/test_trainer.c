/*
 * test_trainer.c - zs_trainer (zs/train.h) and zs_model_open (zs/infer.h).
 *
 * One process: a bad config is refused with a message naming the field;
 * a trainer step equals the hand-written loop (loss scaled by 1/accum,
 * zs_clip_grad_norm, zs_optim_step) to the bit; a run stopped at a
 * checkpoint and resumed by a new trainer repeats the uninterrupted run's
 * losses exactly; the profile counts every step; zs_model_open gives back
 * the model (GPT with its tokenizer, a CNN) and refuses what does not fit.
 * Under mpirun (ctest runs it with 2 and 4 ranks too): all-reduce data
 * parallelism, ZeRO 1, 2, 3 and the synchronous parameter server give the
 * losses a one-rank trainer computes on the same global batches.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "testutil.h"

#define STEPS 8

static const zs_gpt_config TINY = {ZS_GPT2, 61, 16, 2, 2, 16};
static zs_comm *alone; /* this rank by itself */

/* A learnable stream: token t of row r of batch i is (3 i + 5 r + 7 t) mod
 * 61 and its target the next one. 8 rows of 12. */
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

/* A broken source: 8 input rows, 7 target rows. */
static zs_status bad_batch(void *ctx, int64_t index, zs_tensor **x, zs_tensor **y)
{
    zs_status st = batch(ctx, index, x, y);
    *y = st == ZS_OK ? zs_narrow(*y, 0, 0, 7) : NULL;
    return st;
}

static double eval_const(void *ctx, zs_module *m)
{
    (void)ctx;
    (void)m;
    return 1.5;
}

typedef struct losses {
    int n;
    double v[64];
} losses;

static int record(void *ctx, const zs_train_event *e)
{
    losses *l = ctx;
    if (l->n < 64)
        l->v[l->n++] = e->loss;
    return 0;
}

static zs_trainer_config base_config(losses *l)
{
    zs_trainer_config c = zs_trainer_defaults();
    c.steps = c.schedule.total_steps = STEPS;
    c.optim.lr = c.schedule.base_lr = 2e-2;
    c.schedule.min_lr = 2e-3;
    c.schedule.warmup_steps = 2;
    c.accum = 2;
    c.clip = 0.5; /* clips: the norms here are larger */
    c.batch = batch;
    c.on_step = record, c.on_step_ctx = l;
    c.comm = alone;
    return c;
}

static void test_config_errors(void)
{
    zs_module *m = zs_gpt_new(&TINY, 1);
    losses l = {0};
    zs_trainer_config c = base_config(&l);
    c.batch = NULL;
    ZT_EXPECT_ERROR(zs_trainer_new(m, &c) == NULL, "no batch function");
    c = base_config(&l);
    c.steps = 0;
    ZT_EXPECT_ERROR(zs_trainer_new(m, &c) == NULL, "steps");
    c = base_config(&l);
    c.zero = 2, c.sync = ZS_SYNC_PS;
    ZT_EXPECT_ERROR(zs_trainer_new(m, &c) == NULL, "ZeRO works with all-reduce");
    c = base_config(&l);
    c.zero = 7;
    ZT_EXPECT_ERROR(zs_trainer_new(m, &c) == NULL, "ZeRO stage 7");
    c = base_config(&l);
    c.clip = NAN;
    ZT_EXPECT_ERROR(zs_trainer_new(m, &c) == NULL, "clip");
    ZT_EXPECT_ERROR(zs_trainer_new(NULL, &c) == NULL, "no model");
    c = base_config(&l);
    c.batch = bad_batch;
    zs_trainer *t = zs_trainer_new(m, &c);
    ZT_EXPECT_ERROR(t && zs_trainer_step(t, NULL) != ZS_OK, "7 target rows");
    ZT_EXPECT_ERROR(t && zs_trainer_run(t) != ZS_OK, "7 target rows");
    zs_trainer_free(t);
    zs_module_free(m);
    zt_section("bad configs are refused");
}

/* The hand-written loop a trainer step replaces, on the same model. */
static void test_step_equals_loop(void)
{
    zs_module *ma = zs_gpt_new(&TINY, 3), *mb = zs_gpt_new(&TINY, 3);
    losses l = {0};
    zs_trainer_config c = base_config(&l);
    zs_trainer *t = zs_trainer_new(ma, &c);
    zs_tensor *fp, *fg;
    zs_module_flatten(mb, &fp, &fg);
    fp->grad = zs_retain(fg);
    zs_optim *o = zs_optim_new(&c.optim, 1, &fp);
    bool same = t && o;
    for (int64_t s = 0; same && s < 4; s++) {
        zs_train_event e;
        same = zs_trainer_step(t, &e) == ZS_OK;
        double sum = 0;
        for (int a = 0; a < 2; a++) {
            zs_scope_push();
            zs_tensor *x, *y;
            batch(NULL, s * 2 + a, &x, &y);
            zs_tensor *loss = zs_gpt_loss(mb, x, y);
            zs_backward(zs_mul_scalar(loss, 0.5), NULL, false);
            sum += zs_item(loss);
            zs_scope_pop();
        }
        double norm = zs_clip_grad_norm(1, &fp, c.clip);
        zs_optim_step(o, zs_lr_at(&c.schedule, s));
        zs_fill_(fg, 0.0);
        same = same && e.loss == sum / 2 && e.grad_norm == norm &&
               memcmp(zs_data(fp), zs_data(zs_trainer_flat_params(t)),
                      (size_t)zs_nbytes(fp)) == 0;
    }
    ZT_CHECK(same, "4 trainer steps (accum 2, clip 0.5 fused) == the loop, bit for bit");
    zs_train_profile p;
    zs_trainer_profile(t, &p);
    ZT_CHECK(p.steps == 4 && p.forward_s > 0 && p.backward_s > 0 && p.update_s > 0 &&
             p.norm_bytes == 4.0 * (double)zs_numel(fp) &&
             p.update_bytes == 28.0 * (double)zs_numel(fp),
             "profile: %lld steps, %g norm bytes, %g update bytes", (long long)p.steps,
             p.norm_bytes, p.update_bytes);
    zs_optim_free(o);
    zs_trainer_free(t);
    zs_module_free(ma);
    zs_module_free(mb);
    zt_section("a trainer step is the hand-written loop");
}

/* Trains STEPS steps (or stops after stop) writing ckpt at every step 4;
 * resume: from ckpt first. The per-step losses go to l. */
static zs_status train(const char *ckpt, int64_t stop, bool resume, losses *l,
                       char **meta)
{
    zs_module *m = zs_gpt_new(&TINY, 5);
    zs_trainer_config c = base_config(l);
    c.checkpoint = ckpt;
    c.eval = eval_const;
    c.eval_every = 4;
    c.stop_after = stop;
    c.metadata = "{\"model\":\"gpt\",\"note\":\"test\"}";
    zs_trainer *t = zs_trainer_new(m, &c);
    zs_status st = t ? ZS_OK : ZS_ERR_STATE;
    if (st == ZS_OK && resume)
        st = zs_trainer_resume(t, ckpt, meta);
    if (st == ZS_OK)
        st = zs_trainer_run(t);
    zs_trainer_free(t);
    zs_module_free(m);
    return st;
}

static void test_resume(const char *dir)
{
    char ckpt[4200];
    snprintf(ckpt, sizeof ckpt, "%s/ckpt.safetensors", dir);
    losses full = {0}, first = {0}, rest = {0};
    char *meta = NULL;
    ZT_CHECK(train(ckpt, 0, false, &full, NULL) == ZS_OK && full.n == STEPS,
             "uninterrupted run: %d steps", full.n);
    ZT_CHECK(full.v[STEPS - 1] < full.v[0] - 0.3, "it learns: %.4f -> %.4f", full.v[0],
             full.v[STEPS - 1]);
    ZT_CHECK(train(ckpt, 4, false, &first, NULL) == ZS_OK && first.n == 4,
             "stopped after 4");
    ZT_CHECK(train(ckpt, 0, true, &rest, &meta) == ZS_OK && rest.n == STEPS - 4,
             "resumed: %d more steps", rest.n);
    ZT_CHECK(meta && strstr(meta, "\"note\":\"test\"") && strstr(meta, "\"step\":\"4\""),
             "the checkpoint's metadata keeps the caller's keys and the step (%s)",
             meta ? meta : "none");
    free(meta);
    bool same = true;
    for (int i = 0; i < STEPS - 4; i++)
        same = same && rest.v[i] == full.v[4 + i];
    ZT_CHECK(same, "resumed steps 5..8 repeat the uninterrupted losses exactly");
    unlink(ckpt);
    ZT_EXPECT_ERROR(train(ckpt, 0, true, &rest, NULL) != ZS_OK, "ckpt.safetensors");
    /* metadata a trainer did not write, or a hostile one */
    const char *bad[] = {"{}", "{\"step\":\"-3\"}", "{\"step\":\"4x\"}",
                         "{\"step\":4}", "{\"step\":\"9007199254740993\"}",
                         "{\"step\":\"2\",\"optim_steps\":\"1e9\"}"};
    zs_module *m = zs_gpt_new(&TINY, 5);
    zs_trainer_config c = base_config(&rest);
    zs_trainer *t = zs_trainer_new(m, &c);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        zs_module_save(ckpt, m, zs_trainer_optim(t), bad[i]);
        ZT_EXPECT_ERROR(zs_trainer_resume(t, ckpt, NULL) != ZS_OK, "valid \"step\"");
    }
    zs_module_save(ckpt, m, zs_trainer_optim(t), "{\"step\":\"3\"}");
    ZT_CHECK(zs_trainer_resume(t, ckpt, NULL) == ZS_OK && zs_trainer_next_step(t) == 3,
             "a step alone is enough");
    zs_trainer_free(t);
    zs_module_free(m);
    zt_section("checkpoint and exact resume");
}

static void test_model_open(const char *dir)
{
    const char *text = "In the beginning God created the heaven and the earth. "
                       "And the earth was without form, and void.";
    zs_bpe *bpe = zs_bpe_train(text, strlen(text), 270);
    char path[4200];
    snprintf(path, sizeof path, "%s/tokenizer.bpe", dir);
    zs_bpe_save(bpe, path);
    zs_gpt_config g = TINY;
    g.vocab = zs_bpe_vocab_size(bpe);
    zs_module *m = zs_gpt_new(&g, 9);
    char meta[512];
    zs_gpt_config_to_metadata(&g, meta, sizeof meta);
    snprintf(path, sizeof path, "%s/checkpoint.safetensors", dir);
    zs_module_save(path, m, NULL, meta);
    zs_model_file f;
    ZT_CHECK(zs_model_open(dir, &f) == ZS_OK && !strcmp(f.kind, "gpt") && f.tokenizer &&
             f.gpt.vocab == g.vocab && f.gpt.layers == g.layers,
             "a training directory opens as a GPT with its tokenizer");
    zs_tensor *x = zs_from_data(ZS_I64, ZS_SHAPE(1, 3), (int64_t[]){1, 2, 3});
    zs_no_grad_push();
    zs_tensor *a = zs_module_forward(m, x), *b = f.model ? zs_module_forward(f.model, x) : NULL;
    zs_no_grad_pop();
    ZT_CHECK(a && b && memcmp(zs_data(a), zs_data(b), zs_nbytes(a)) == 0,
             "the reopened GPT gives the same logits");
    zs_release(a);
    zs_release(b);
    zs_release(x);
    zs_model_close(&f);
    ZT_CHECK(zs_model_open(path, &f) == ZS_OK && f.tokenizer != NULL,
             "the checkpoint file opens too (tokenizer beside it)");
    zs_model_close(&f);
    /* another vocabulary beside the checkpoint */
    zs_bpe *other = zs_bpe_train(text, strlen(text), 262);
    snprintf(path, sizeof path, "%s/tokenizer.bpe", dir);
    zs_bpe_save(other, path);
    ZT_EXPECT_ERROR(zs_model_open(dir, &f) != ZS_OK, "tokenizer has");
    ZT_CHECK(f.model == NULL && f.tokenizer == NULL, "a failed open leaves nothing");
    /* a CNN checkpoint: no tokenizer needed */
    zs_module *cnn = zs_lenet5_new(2);
    snprintf(path, sizeof path, "%s/lenet.safetensors", dir);
    zs_module_save(path, cnn, NULL, "{\"model\":\"lenet\"}");
    ZT_CHECK(zs_model_open(path, &f) == ZS_OK && !strcmp(f.kind, "lenet") && !f.tokenizer,
             "a lenet checkpoint opens without a tokenizer");
    zs_model_close(&f);
    zs_module_save(path, cnn, NULL, "{\"model\":\"alexnet\"}");
    ZT_EXPECT_ERROR(zs_model_open(path, &f) != ZS_OK, "unknown model 'alexnet'");
    zs_module_save(path, cnn, NULL, "{}");
    ZT_EXPECT_ERROR(zs_model_open(path, &f) != ZS_OK, "no model name");
    snprintf(path, sizeof path, "%s/none", dir);
    ZT_EXPECT_ERROR(zs_model_open(path, &f) != ZS_OK, "none");
    zs_module_free(cnn);
    zs_module_free(m);
    zs_bpe_free(bpe);
    zs_bpe_free(other);
    zt_section("zs_model_open");
}

/* Every rank: a one-rank trainer and a trainer over the world in mode
 * (sync, zero) on the same global batches: the same losses. */
static void parallel_case(const char *name, zs_sync_mode sync, int zero)
{
    losses one = {0}, all = {0};
    zs_module *ma = zs_gpt_new(&TINY, 4), *mb = zs_gpt_new(&TINY, 4);
    zs_trainer_config c = base_config(&one);
    zs_trainer *ta = zs_trainer_new(ma, &c);
    c.on_step_ctx = &all;
    c.comm = NULL, c.sync = sync, c.zero = zero, c.bucket_bytes = 4096;
    zs_trainer *tb = zs_trainer_new(mb, &c);
    zs_status sa = ta ? zs_trainer_run(ta) : ZS_ERR_STATE;
    zs_status sb = tb ? zs_trainer_run(tb) : ZS_ERR_STATE;
    double worst = 0;
    for (int i = 0; i < one.n && i < all.n; i++)
        worst = fmax(worst, fabs(one.v[i] - all.v[i]));
    ZT_CHECK(sa == ZS_OK && sb == ZS_OK && one.n == STEPS && all.n == STEPS &&
             worst < 2e-5, "%s: %d ranks give the one-rank losses (worst %.2g): %s",
             name, zs_comm_size(zs_comm_world()), worst, zs_last_error());
    zs_trainer_free(ta);
    zs_trainer_free(tb);
    zs_module_free(ma);
    zs_module_free(mb);
}

static void test_parallel(void)
{
    parallel_case("all-reduce", ZS_SYNC_ALLREDUCE, 0);
    parallel_case("ZeRO-1", ZS_SYNC_ALLREDUCE, 1);
    parallel_case("ZeRO-2", ZS_SYNC_ALLREDUCE, 2);
    parallel_case("ZeRO-3", ZS_SYNC_ALLREDUCE, 3);
    parallel_case("parameter server", ZS_SYNC_PS, 0);
    zt_section("data parallel, ZeRO 1-3 and the parameter server equal one rank");
}

int main(int argc, char **argv)
{
    int rank, size;
    zt_dist_start(&argc, &argv, &rank, &size);
    alone = zs_comm_split(zs_comm_world(), rank, 0);
    if (rank == 0) {
        char dir[] = "/tmp/zs_trainer_XXXXXX";
        if (!mkdtemp(dir))
            return 1;
        test_config_errors();
        test_step_equals_loop();
        test_resume(dir);
        test_model_open(dir);
        char cmd[64];
        snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
        if (system(cmd) != 0)
            return 1;
    }
    test_parallel();
    zs_comm_free(alone);
    return zt_dist_done();
}
