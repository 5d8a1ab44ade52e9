/*
 * test_device.c - a whole training step on a device the host cannot touch
 * (the test device, src/ops/testdev.c), and the device interface under it.
 *
 * Checked: the test device's memory faults when the host reads it raw (in
 * a child process), zs_data refuses it with a message naming the device,
 * zs_item / zs_get / zs_print copy explicitly, the collectives refuse it
 * naming the device; streams, events, memset,
 * asynchronous copies and the allocator counters; every descriptor with a
 * CPU kernel has one there for the same dtypes; GPT (gpt2 and bloom),
 * LeNet and ResNet train 20 steps through zs_trainer with losses
 * bit-identical to the CPU's and the parameters equal to the bit after;
 * a checkpoint written from the test device loads on the CPU and the
 * reverse, giving the same loss.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ops/op.h"
#include "testutil.h"

#define STEPS 20
#define DEV ZS_TEST_DEVICE

/* ---- the device itself ------------------------------------------------- */

static void test_memory(void)
{
    zs_tensor *x = zt_rand(ZS_F32, ZS_SHAPE(3, 5), 1);
    zs_tensor *d = zs_to_device(x, DEV);
    ZT_CHECK(d && d->device == DEV, "to_device: on the test device");
    ZT_EXPECT_ERROR(zs_data(d) == NULL, "data: the tensor is on test, which the "
                    "CPU cannot address");
    float hb[15];
    zs_tensor *col = zs_narrow(d, 1, 0, 3);
    ZT_EXPECT_ERROR(zs_copy_to_buffer(col, hb, 9 * sizeof *hb) != ZS_OK,
                    "copy_to_buffer: a strided view on test: make it contiguous");
    ZT_CHECK(zs_copy_to_buffer(d, hb, sizeof hb) == ZS_OK && hb[7] == (float)zs_get(x, 7),
             "copy_to_buffer copies a contiguous device tensor to the host");
    zs_release(col);
    zs_tensor *row = zs_narrow(d, 0, 1, 1);
    ZT_CHECK(zs_get(d, 7) == zs_get(x, 7) && zs_item(row) == zs_get(x, 5),
             "zs_get and zs_item copy the element to the host");
    zs_release(row);
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) { /* a raw read behind the driver's back must fault */
        signal(SIGSEGV, SIG_DFL); /* not a sanitizer's report: die of it */
        volatile float v = *(volatile float *)zsi_ptr(d);
        (void)v;
        _exit(0);
    }
    int ws = 0;
    waitpid(pid, &ws, 0);
    ZT_CHECK(WIFSIGNALED(ws) && WTERMSIG(ws) == SIGSEGV, "a raw host read of "
             "test-device memory faults (status %d)", ws);
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    zs_print(d, f);
    fclose(f);
    ZT_CHECK(buf && strstr(buf, "device=test") && strstr(buf, "["), "zs_print copies "
             "to the host: %s", buf ? buf : "");
    free(buf);
    ZT_EXPECT_ERROR(zs_comm_allreduce(zs_comm_world(), d, false, ZS_ALLREDUCE_MPI) != ZS_OK,
                    "allreduce: the tensor is on test: the collectives take host tensors");
    ZT_EXPECT_ERROR(zs_comm_broadcast(zs_comm_world(), d, 0) != ZS_OK,
                    "broadcast: the tensor is on test");
    zs_tensor *back = zs_to_device(d, ZS_CPU);
    ZT_CHECK(back && !memcmp(zs_data(back), zs_data(x), zs_nbytes(x)), "round trip");
    zs_release(back);
    zs_release(d);
    zs_release(x);
    zt_section("test device memory: faults, refusals, explicit copies");
}

static void test_interface(void)
{
    zs_device_stats s0, s1;
    ZT_CHECK(zs_device_get_stats(DEV, &s0) == ZS_OK, "stats");
    zs_tensor *z = zs_zeros_on(DEV, ZS_F64, ZS_SHAPE(1000));
    zs_tensor *zl = zs_zeros_like(z);
    ZT_CHECK(zl && zl->device == DEV, "zeros_like on the source's device");
    ZT_CHECK(zs_device_get_stats(DEV, &s1) == ZS_OK &&
             s1.current_bytes >= s0.current_bytes + 16000 && s1.peak_bytes >= s1.current_bytes,
             "current and peak bytes count the allocations (%zu -> %zu)",
             s0.current_bytes, s1.current_bytes);
    ZT_CHECK(zs_get(z, 999) == 0 && zs_get(zl, 0) == 0, "memset zeroes");
    zs_tensor *h = zt_rand(ZS_F64, ZS_SHAPE(1000), 2), *h2 = zs_zeros(ZS_F64, ZS_SHAPE(1000));
    zs_stream *s = zs_stream_new(DEV);
    zs_event *e = zs_event_new(DEV);
    ZT_CHECK(s && e, "a stream and an event");
    ZT_CHECK(zs_copy_async(z, h, s) == ZS_OK && zs_copy_async(zl, z, s) == ZS_OK &&
             zs_event_record(DEV, e, s) == ZS_OK && zs_event_wait(DEV, NULL, e) == ZS_OK &&
             zs_copy_async(h2, zl, s) == ZS_OK && zs_stream_sync(DEV, s) == ZS_OK &&
             zs_event_sync(DEV, e) == ZS_OK && zs_device_sync(DEV) == ZS_OK,
             "host -> device -> device -> host on a stream");
    ZT_CHECK(!memcmp(zs_data(h), zs_data(h2), zs_nbytes(h)), "the bytes arrive");
    zs_tensor *part = zs_narrow(h, 0, 0, 10);
    ZT_EXPECT_ERROR(zs_copy_async(z, part, s) != ZS_OK,
                    "copy_async: expected contiguous tensors of one dtype and size");
    zs_release(part);
    zs_stream_free(DEV, s);
    zs_event_free(DEV, e);
    ZT_CHECK(zs_device_find("test") == DEV && zs_device_find("cpu") == ZS_CPU, "find");
    ZT_EXPECT_ERROR(zs_device_find("tpu") < 0, "no device named 'tpu' (devices here: "
                    "cpu, test)");
    ZT_EXPECT_ERROR(zs_add(z, h) == NULL, "add: inputs on test and cpu");
    zs_release(z);
    zs_release(zl);
    zs_release(h);
    zs_release(h2);
    zt_section("device interface: memset, streams, events, async copies, stats");
}

/* Every descriptor that has a CPU kernel for a dtype has one on the test
 * device: the list of operators without a kernel there is empty. */
static void test_complete(void)
{
    zsi_opdef *const *all = zsi_opdefs();
    int missing = 0, n = 0;
    for (int i = 0; all[i]; i++, n++)
        for (int t = 0; t < ZS_DTYPE_COUNT; t++)
            if (all[i]->kernel[ZS_CPU][t] && !all[i]->kernel[DEV][t]) {
                printf("  no test-device kernel: %s %s\n", all[i]->op.name,
                       zs_dtype_name((zs_dtype)t));
                missing++;
            }
    ZT_CHECK(n > 50 && missing == 0, "%d descriptors listed before the first call, "
             "%d without a test-device kernel", n, missing);
    zt_section("every descriptor has its kernels on the test device");
}

/* ---- training ---------------------------------------------------------- */

static const zs_gpt_config GPT2 = {ZS_GPT2, 61, 16, 2, 2, 16};
static const zs_gpt_config BLOOM = {ZS_BLOOM, 61, 16, 2, 2, 16};

/* Tokens: row r of batch i is (3 i + 5 r + 7 t) mod 61, target the next. */
static zs_status tok_batch(void *ctx, int64_t index, zs_tensor **x, zs_tensor **y)
{
    (void)ctx;
    int64_t ids[4 * 13];
    for (int r = 0; r < 4; r++)
        for (int t = 0; t < 13; t++)
            ids[r * 13 + t] = (3 * index + 5 * r + 7 * t) % 61;
    zs_tensor *all = zs_from_data(ZS_I64, ZS_SHAPE(4, 13), ids);
    *x = zs_contiguous(zs_narrow(all, 1, 0, 12));
    *y = zs_contiguous(zs_narrow(all, 1, 1, 12));
    zs_release(all);
    return *x && *y ? ZS_OK : ZS_ERR_NOMEM;
}

/* Images: 4 random 1x28x28 inputs per batch and fixed labels; batches
 * 0 and 1 alternate. */
static zs_status img_batch(void *ctx, int64_t index, zs_tensor **x, zs_tensor **y)
{
    (void)ctx;
    index %= 2; /* two batches, seen alternately: learnable */
    *x = zs_normal(ZS_F32, ZS_SHAPE(4, 1, 28, 28), 0, 1, 100 + (uint64_t)index);
    int64_t lab[4];
    for (int i = 0; i < 4; i++)
        lab[i] = (index * 3 + i * 7) % 10;
    *y = zs_from_data(ZS_I64, ZS_SHAPE(4), lab);
    return *x && *y ? ZS_OK : ZS_ERR_NOMEM;
}

typedef struct run {
    int n;
    double loss[STEPS], norm[STEPS];
} run;

static int record(void *ctx, const zs_train_event *e)
{
    run *r = ctx;
    if (r->n < STEPS) {
        r->loss[r->n] = e->loss;
        r->norm[r->n++] = e->grad_norm;
    }
    return 0;
}

/* 20 steps of AdamW with clipping (or SGD with momentum for the CNNs) on
 * device dev; the trained model is returned in *out. */
static run train(zs_module *m, int dev, bool cnn, zs_module **out)
{
    run r = {0};
    zs_trainer_config c = zs_trainer_defaults();
    c.steps = c.schedule.total_steps = STEPS;
    c.optim.lr = c.schedule.base_lr = 1e-2;
    c.schedule.warmup_steps = 3;
    c.clip = 0.5;
    c.accum = cnn ? 1 : 2;
    c.batch = cnn ? img_batch : tok_batch;
    c.loss = cnn ? zs_classifier_loss : NULL;
    if (cnn)
        c.optim = (zs_optim_config){ZS_SGD, 1e-2, 0.9, true, 1e-4, 0, 0, 0};
    c.on_step = record, c.on_step_ctx = &r;
    c.comm = NULL; /* the world: one rank here */
    c.device = dev;
    zs_trainer *t = zs_trainer_new(m, &c);
    ZT_CHECK(t != NULL, "trainer on %s: %s", zs_device_name(dev), zs_last_error());
    zs_status st = t ? zs_trainer_run(t) : ZS_ERR_STATE;
    ZT_CHECK(st == ZS_OK && r.n == STEPS, "20 steps on %s: %s", zs_device_name(dev),
             st == ZS_OK ? "" : zs_last_error());
    zs_trainer_free(t);
    *out = m;
    return r;
}

/* The parameters of a and b, bit for b (b may be on any device). */
static bool same_params(zs_module *a, zs_module *b)
{
    zs_tensor **pa, **pb;
    char **na, **nb;
    int n = zs_module_parameters(a, &pa, &na), k = zs_module_parameters(b, &pb, &nb);
    bool same = n == k && n > 0;
    for (int i = 0; same && i < n; i++) {
        zs_tensor *ha = zs_to_device(zs_contiguous(pa[i]), ZS_CPU);
        zs_tensor *hb = zs_to_device(zs_contiguous(pb[i]), ZS_CPU);
        same = ha && hb && !memcmp(zs_data(ha), zs_data(hb), zs_nbytes(ha));
        zs_release(ha);
        zs_release(hb);
    }
    zs_names_free(n, pa, na);
    zs_names_free(k, pb, nb);
    return same;
}

static zs_module *model(const char *kind, uint64_t seed)
{
    if (!strcmp(kind, "gpt2"))
        return zs_gpt_new(&GPT2, seed);
    if (!strcmp(kind, "bloom"))
        return zs_gpt_new(&BLOOM, seed);
    return zs_cnn_new(kind, seed);
}

static void test_train(const char *kind)
{
    bool cnn = !strcmp(kind, "lenet") || !strcmp(kind, "resnet");
    zs_module *cpu_m, *dev_m;
    zs_scope_push();
    run a = train(model(kind, 7), ZS_CPU, cnn, &cpu_m);
    zs_test_device_reset_calls();
    run b = train(model(kind, 7), DEV, cnn, &dev_m);
    bool same = a.n == STEPS && b.n == STEPS;
    for (int i = 0; same && i < STEPS; i++)
        same = a.loss[i] == b.loss[i] && a.norm[i] == b.norm[i];
    ZT_CHECK(same, "%s: 20 losses and gradient norms bit-identical on cpu and test "
             "(first %.9g / %.9g, last %.9g / %.9g)", kind, a.loss[0], b.loss[0],
             a.loss[STEPS - 1], b.loss[STEPS - 1]);
    ZT_CHECK(a.loss[STEPS - 1] < a.loss[0], "%s: it learns (%.4f -> %.4f)", kind,
             a.loss[0], a.loss[STEPS - 1]);
    ZT_CHECK(zs_module_device(dev_m) == DEV && same_params(cpu_m, dev_m),
             "%s: the trained parameters are equal to the bit", kind);
    ZT_CHECK(zs_test_device_calls(cnn ? "conv2d" : "attention") > 0 &&
             zs_test_device_calls(cnn ? "sgd_update" : "adam_update") == STEPS,
             "%s: the step ran through the test device's kernels", kind);
    /* checkpoints: written from the device, read on the CPU, and back */
    char path[] = "/tmp/zs_test_device_XXXXXX";
    int fd = mkstemp(path);
    close(fd);
    zs_module *fresh = model(kind, 99);
    ZT_CHECK(zs_module_save(path, dev_m, NULL, "{}") == ZS_OK &&
             zs_module_load(path, fresh, NULL, NULL) == ZS_OK && same_params(fresh, cpu_m),
             "%s: a checkpoint saved on test loads on the cpu", kind);
    zs_module *back = model(kind, 98);
    ZT_CHECK(zs_module_to_device(back, DEV) == ZS_OK &&
             zs_module_save(path, cpu_m, NULL, "{}") == ZS_OK &&
             zs_module_load(path, back, NULL, NULL) == ZS_OK && same_params(back, cpu_m) &&
             zs_module_device(back) == DEV,
             "%s: a checkpoint saved on the cpu loads on test", kind);
    unlink(path);
    zs_module_free(fresh);
    zs_module_free(back);
    zs_module_free(cpu_m);
    zs_module_free(dev_m);
    zs_scope_pop();
    char name[64];
    snprintf(name, sizeof name, "%s: 20 training steps on the test device", kind);
    zt_section(name);
}

static void test_refusals(void)
{
    zs_module *m = zs_gpt_new(&GPT2, 1);
    zs_trainer_config c = zs_trainer_defaults();
    c.batch = tok_batch;
    c.comm = NULL; /* the world: one rank here */
    c.device = 5;
    ZT_EXPECT_ERROR(zs_trainer_new(m, &c) == NULL, "trainer: device 5 (not registered) "
                    "(devices here: cpu, test)");
    ZT_EXPECT_ERROR(zs_module_to_device(m, 6) != ZS_OK, "module_to_device: device 6");
    zs_tensor *fp, *fg;
    ZT_CHECK(zs_module_flatten(m, &fp, &fg) == ZS_OK, "flatten");
    ZT_EXPECT_ERROR(zs_module_to_device(m, DEV) != ZS_OK, "flattened");
    zs_module_free(m);
    zt_section("refusals: unknown devices, moving a flattened module");
}

int main(void)
{
    zs_set_num_threads(2);
    if (zs_test_device_enable() != ZS_OK) {
        printf("test device: %s\n", zs_last_error());
        return 1;
    }
    test_complete(); /* first: before any operator has run */
    test_memory();
    test_interface();
    test_refusals();
    test_train("gpt2");
    test_train("bloom");
    test_train("lenet");
    test_train("resnet");
    return zt_done();
}
