/*
 * test_trainer_onebit.c - the trainer's 1-bit Adam (src/train/onebit.c),
 * plainly and by ctest under `mpirun -np 2` and `-np 4`.
 *
 * On the world: a tiny GPT trained with 1-bit Adam (freeze_step 3) takes
 * the same warm-up steps as AdamW (losses and parameters to the bit: both
 * average the gradients with the same all-reduce), then keeps training
 * (finite losses that fall below the first) with every rank's parameters
 * equal to the bit; the bytes of each step are the ring all-reduce's
 * before the freeze and the compressed all-reduce's after it (at least 5x
 * fewer); metrics.jsonl carries them. Errors: ZeRO, a parameter server,
 * freeze_step < 1, a block that is not a multiple of 8.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "testutil.h"

#define STEPS 8
#define FREEZE 3

static const zs_gpt_config TINY = {ZS_GPT2, 61, 16, 2, 2, 16};
static int R, P;

/* Token t of row r of batch i is (3 i + 5 r + 7 t) mod 61, its target the
 * next one: 8 rows of 12. */
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

static zs_trainer_config config(bool onebit)
{
    zs_trainer_config c = zs_trainer_defaults();
    c.steps = c.schedule.total_steps = STEPS;
    c.optim.lr = c.schedule.base_lr = 2e-2;
    c.schedule.warmup_steps = 2;
    c.schedule.min_lr = 2e-3;
    c.batch = batch;
    c.bucket_bytes = 4096; /* several buckets */
    if (onebit) {
        c.optim.kind = ZS_ONEBIT_ADAM;
        c.freeze_step = FREEZE;
        c.onebit_block = 64;
    }
    return c;
}

static void test_errors(void)
{
    zs_module *m = zs_gpt_new(&TINY, 1);
    zs_trainer_config c = config(true);
    c.zero = 1;
    ZT_EXPECT_ERROR(zs_trainer_new(m, &c) == NULL, "without ZeRO");
    c = config(true);
    c.sync = ZS_SYNC_PS;
    ZT_EXPECT_ERROR(zs_trainer_new(m, &c) == NULL, "parameter server");
    c = config(true);
    c.freeze_step = -1;
    ZT_EXPECT_ERROR(zs_trainer_new(m, &c) == NULL, "freeze_step -1");
    c.freeze_step = 0;
    ZT_EXPECT_ERROR(zs_trainer_new(m, &c) == NULL, "expected >= 1");
    c = config(true);
    c.onebit_block = 12;
    ZT_EXPECT_ERROR(zs_trainer_new(m, &c) == NULL, "multiple of 8");
    zs_module_free(m);
    zt_section("refused: 1-bit Adam with ZeRO, a parameter server, freeze_step < 1, a "
               "bad block");
}

/* Rank 0's flat parameters, broadcast: do all ranks hold them to the bit? */
static bool replicas_equal(zs_tensor *fp)
{
    zs_tensor *r0 = zs_clone(fp);
    zs_comm_broadcast(zs_comm_world(), r0, 0);
    int64_t differ = memcmp(zs_data(r0), zs_data(fp), zs_nbytes(fp)) != 0;
    zs_release(r0);
    zs_tensor *d = zs_scalar(ZS_I64, (double)differ);
    zs_comm_allreduce(zs_comm_world(), d, false, ZS_ALLREDUCE_MPI);
    bool ok = zs_item(d) == 0;
    zs_release(d);
    return ok;
}

static void test_train(const char *dir)
{
    zs_module *ma = zs_gpt_new(&TINY, 3), *mb = zs_gpt_new(&TINY, 3);
    zs_trainer_config ca = config(false), cb = config(true);
    zs_trainer *ta = zs_trainer_new(ma, &ca), *tb = zs_trainer_new(mb, &cb);
    ZT_CHECK(ta && tb, "trainers");
    if (!ta || !tb)
        return;
    int64_t n = zs_numel(zs_trainer_flat_params(tb));
    int64_t ring = zs_onebit_ring_bytes(n, 4, P, R), one = zs_onebit_bytes(n, 64, P, R);
    zs_train_log *log = zs_train_log_open(dir, false, true);
    bool warm_same = true, bytes_ok = true, finite = true;
    double first = NAN, last = NAN;
    for (int s = 0; s < STEPS; s++) {
        zs_train_event ea, eb;
        ZT_CHECK(zs_trainer_step(tb, &eb) == ZS_OK, "1-bit step %d", s);
        finite &= isfinite(eb.loss);
        first = s == 0 ? eb.loss : first;
        last = eb.loss;
        bytes_ok &= eb.comm_bytes == (s < FREEZE ? ring : one);
        zs_train_log_event(log, &eb);
        if (s <= FREEZE) { /* step FREEZE's loss is read after FREEZE AdamW updates */
            ZT_CHECK(zs_trainer_step(ta, &ea) == ZS_OK, "AdamW step %d", s);
            warm_same &= ea.loss == eb.loss && (s == FREEZE || ea.comm_bytes == eb.comm_bytes);
        }
        if (s == FREEZE - 1) {
            zs_tensor *pa = zs_trainer_flat_params(ta), *pb = zs_trainer_flat_params(tb);
            warm_same &= memcmp(zs_data(pa), zs_data(pb), zs_nbytes(pa)) == 0;
        }
    }
    zs_train_log_close(log);
    ZT_CHECK(warm_same, "the warm-up differs from AdamW");
    ZT_CHECK(bytes_ok, "bytes per step: expected %lld before the freeze, %lld after",
             (long long)ring, (long long)one);
    if (P > 1)
        ZT_CHECK(ring >= 5 * one, "ring %lld vs 1-bit %lld", (long long)ring,
                 (long long)one);
    ZT_CHECK(finite && last < first, "losses %.4f -> %.4f", first, last);
    ZT_CHECK(replicas_equal(zs_trainer_flat_params(tb)), "ranks hold other parameters");
    if (R == 0)
        printf("  %d rank%s, %lld parameters: loss %.4f -> %.4f; bytes sent per step by "
               "rank 0: %lld (AdamW all-reduce), %lld (1-bit, %.1fx fewer)\n", P,
               P == 1 ? "" : "s", (long long)n, first, last, (long long)ring,
               (long long)one, one ? (double)ring / (double)one : 0.0);
    /* metrics.jsonl: comm_bytes on the frozen steps' lines */
    char path[256], line[512];
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    FILE *f = fopen(path, "r");
    int with = 0;
    while (f && fgets(line, sizeof line, f))
        with += strstr(line, "\"comm_bytes\":") != NULL;
    if (f)
        fclose(f);
    ZT_CHECK(with == (P > 1 ? STEPS : 0), "%d lines of metrics.jsonl carry comm_bytes",
             with);
    zs_trainer_free(ta);
    zs_trainer_free(tb);
    zs_module_free(ma);
    zs_module_free(mb);
    zt_section("trainer: 1-bit Adam's warm-up is AdamW's; then it trains with equal "
               "replicas and >= 5x fewer bytes");
}

int main(int argc, char **argv)
{
    zt_dist_start(&argc, &argv, &R, &P);
    char dir[64];
    snprintf(dir, sizeof dir, "/tmp/zs_onebit_%d_XXXXXX", R);
    if (!mkdtemp(dir))
        return 1;
    test_errors();
    test_train(dir);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0)
        return 1;
    return zt_dist_done();
}
