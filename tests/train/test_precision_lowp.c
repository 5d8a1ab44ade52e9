/*
 * test_precision_lowp.c - fp16 and fp8 training of a tiny GPT through the
 * trainer (train/precision.c, ops/autocast.c): under fp16 the products run
 * on the f16 kernels of matmul and the linears (F16 GEMM, f32
 * accumulation; counted through wrappers installed with
 * zsi_op_set_kernel); under fp8 every linear of the GPT runs as
 * linear_fp8 (the wrapper of its kernel counts the calls, and
 * zs_autocast_stats.fp8_linears the routed calls) and no linear runs in
 * bf16. Both learn (the loss falls by more than 1 nat in 30 steps) and
 * stay within a sane distance of fp32 from the same seed: the mean of the
 * last three losses within 10% + 0.05 (the bf16 test's bound in
 * test_precision.c), and they differ from fp32 (they did run in the low
 * precision).
 */
#include <stdlib.h>
#include <string.h>

#include "ops/op.h"
#include "testutil.h"

static const zs_gpt_config TINY = {ZS_GPT2, 61, 16, 2, 2, 32};

/* The learnable stream of test_precision.c: 8 rows of 12 tokens. */
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

enum { STEPS = 30 };

typedef struct run {
    int n;
    double loss[STEPS];
    int64_t routed; /* zs_autocast_stats.fp8_linears over the run */
} run;

static int on_step(void *ctx, const zs_train_event *e)
{
    run *r = ctx;
    zs_autocast_stats s;
    zs_autocast_get_stats(&s);
    r->routed += s.fp8_linears;
    zs_autocast_reset_stats();
    if (r->n < STEPS)
        r->loss[r->n++] = e->loss;
    return 0;
}

/* ---- kernel call counters ---------------------------------------------- */

static int64_t calls_fp8, calls_linear[ZS_DTYPE_COUNT], calls_matmul[ZS_DTYPE_COUNT];
static zsi_kernel_fn orig_fp8[ZS_DTYPE_COUNT], orig_linear[ZS_DTYPE_COUNT],
    orig_matmul[ZS_DTYPE_COUNT];

static zs_status count_fp8(const zsi_call *c, zs_tensor *out)
{
    calls_fp8++;
    return orig_fp8[c->key](c, out);
}

static zs_status count_linear(const zsi_call *c, zs_tensor *out)
{
    calls_linear[c->key]++;
    return orig_linear[c->key](c, out);
}

static zs_status count_matmul(const zsi_call *c, zs_tensor *out)
{
    calls_matmul[c->key]++;
    return orig_matmul[c->key](c, out);
}

static zsi_opdef *const LINEARS[] = {&zsi_def_linear, &zsi_def_linear_gelu,
                                     &zsi_def_linear_res};

/* Wraps (on) or restores (off) the CPU kernels counted above. */
static void counters(bool on)
{
    static const zs_dtype dts[] = {ZS_F32, ZS_BF16, ZS_F16};
    for (size_t k = 0; k < 3; k++) {
        zs_dtype dt = dts[k];
        if (on) {
            orig_linear[dt] = zsi_def_linear.kernel[ZS_CPU][dt];
            orig_matmul[dt] = zsi_def_matmul.kernel[ZS_CPU][dt];
            orig_fp8[dt] = zsi_def_linear_fp8.kernel[ZS_CPU][dt];
        }
        /* the three linears share one kernel per dtype */
        for (size_t i = 0; i < 3; i++)
            if (orig_linear[dt])
                zsi_op_set_kernel(LINEARS[i], ZS_CPU, dt, on ? count_linear : orig_linear[dt]);
        if (orig_matmul[dt])
            zsi_op_set_kernel(&zsi_def_matmul, ZS_CPU, dt, on ? count_matmul : orig_matmul[dt]);
        if (orig_fp8[dt])
            zsi_op_set_kernel(&zsi_def_linear_fp8, ZS_CPU, dt, on ? count_fp8 : orig_fp8[dt]);
    }
}

static void reset_counts(void)
{
    calls_fp8 = 0;
    memset(calls_linear, 0, sizeof calls_linear);
    memset(calls_matmul, 0, sizeof calls_matmul);
}

static zs_status train(run *r, zs_dtype precision)
{
    zs_trainer_config c = zs_trainer_defaults();
    c.steps = c.schedule.total_steps = STEPS;
    c.optim.lr = c.schedule.base_lr = 2e-2;
    c.schedule.min_lr = 2e-3;
    c.schedule.warmup_steps = 2;
    c.clip = 1.0;
    c.batch = batch;
    c.on_step = on_step, c.on_step_ctx = r;
    c.precision = precision;
    zs_module *m = zs_gpt_new(&TINY, 5);
    zs_trainer *t = zs_trainer_new(m, &c);
    zs_autocast_reset_stats();
    reset_counts();
    zs_status st = t ? zs_trainer_run(t) : ZS_ERR_STATE;
    zs_trainer_free(t);
    zs_module_free(m);
    return st;
}

static double last3(const run *r)
{
    return (r->loss[STEPS - 3] + r->loss[STEPS - 2] + r->loss[STEPS - 1]) / 3;
}

/* The low run learns, stays near fp32 and differs from it. */
static void check_close(const char *name, const run *lo, const run *f32)
{
    double a = last3(f32), b = last3(lo);
    ZT_CHECK(lo->n == STEPS && lo->loss[STEPS - 1] < lo->loss[0] - 1.0,
             "%s learns: %.4f -> %.4f", name, lo->loss[0], lo->loss[STEPS - 1]);
    ZT_CHECK(fabs(a - b) < 0.1 * a + 0.05, "last 3 steps' mean loss: %s %.4f, fp32 "
             "%.4f (within 10%% + 0.05)", name, b, a);
    bool diff = false;
    for (int i = 0; i < STEPS; i++)
        diff = diff || lo->loss[i] != f32->loss[i];
    ZT_CHECK(diff, "%s differs from fp32 (it ran in the low precision)", name);
}

static void test_fp16_fp8(void)
{
    counters(true);
    run f32 = {0}, h = {0}, f8 = {0};
    ZT_CHECK(train(&f32, ZS_F32) == ZS_OK, "fp32 run: %s", zs_last_error());
    ZT_CHECK(calls_fp8 == 0 && calls_linear[ZS_F16] == 0 && calls_linear[ZS_F32] > 0,
             "fp32: linears in f32 (%lld), none in f16 or fp8",
             (long long)calls_linear[ZS_F32]);

    ZT_CHECK(train(&h, ZS_F16) == ZS_OK, "fp16 run: %s", zs_last_error());
    int64_t lin16 = calls_linear[ZS_F16], mm16 = calls_matmul[ZS_F16];
    /* per step: 4 linears per block forward, and the tied logits */
    ZT_CHECK(lin16 >= 4 * TINY.layers * STEPS && calls_linear[ZS_F32] == 0 &&
             mm16 >= STEPS && calls_fp8 == 0,
             "fp16: linears on the f16 kernel (%lld calls, f32 %lld), matmul in f16 "
             "(%lld: the logits and backward's products)", (long long)lin16,
             (long long)calls_linear[ZS_F32], (long long)mm16);
    check_close("fp16", &h, &f32);
    zt_section("fp16: products on the f16 kernels; learns like fp32");

    ZT_CHECK(train(&f8, ZS_F8E4M3) == ZS_OK, "fp8 run: %s", zs_last_error());
    int64_t want = 4 * TINY.layers * STEPS;
    ZT_CHECK(calls_fp8 >= want && f8.routed >= want && calls_linear[ZS_BF16] == 0 &&
             calls_linear[ZS_F32] == 0 && calls_matmul[ZS_BF16] > 0,
             "fp8: every linear as linear_fp8 (%lld kernel calls, %lld routed, expected "
             ">= %lld), none in bf16 (%lld) or f32 (%lld); the tied logits' matmul in "
             "bf16 (%lld)", (long long)calls_fp8, (long long)f8.routed, (long long)want,
             (long long)calls_linear[ZS_BF16], (long long)calls_linear[ZS_F32],
             (long long)calls_matmul[ZS_BF16]);
    check_close("fp8", &f8, &f32);
    fprintf(stderr, "last-3 mean losses: fp32 %.4f, fp16 %.4f, fp8 %.4f\n", last3(&f32),
            last3(&h), last3(&f8));
    counters(false);
    zt_section("fp8: the GPT's linears run as linear_fp8; learns like fp32");
}

int main(void)
{
    test_fp16_fp8();
    return zt_done();
}
