/*
 * test_cuda_ops.c - every CUDA kernel a GPT (gpt2, bloom) training step
 * or a LeNet step runs (src/ops/cuda_*.c), forward and backward, against
 * the CPU in float64, and the steps themselves.
 *
 * Each case runs an operator (and, through autograd, its backward rule on
 * loss = sum(out * R), R random) twice: on the CPU in f64 from the inputs
 * rounded to the tested dtype, and on cuda in f32 or bf16. Inputs are fresh
 * random values of odd sizes (not multiples of any tile or block), some
 * strided views; before each GPU call the caching allocator is filled with
 * 0xFF blocks (poison), so an output element the kernel forgot is NaN and
 * fails. The error is ||gpu - ref|| / ||ref|| over each result:
 *   f32 <= 1e-5 (float arithmetic over sums of at most a few hundred terms;
 *   the references are exact to ~1e-16), bf16 <= 2e-2 (inputs and outputs
 *   carry 8-bit mantissas: one rounding is 2^-9 relative; results that go
 *   through two or three roundings stay under 4x that; gradients of bf16
 *   models compound a few more).
 * Also: bad indices fail with the CPU's message; attention's backward is
 * bit-identical from run to run; a GPT step trains on cuda with losses
 * within 1e-4 of the CPU's, and two cuda runs give the same losses bit for
 * bit.
 *
 * Without a GPU (or in a build without CUDA) the test says why and exits
 * 77, which ctest reports as skipped.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "testutil.h"

#define MAXIN 6
/* The device under test (another id lets the harness itself be checked
 * against the CPU's kernels on the test device). */
#ifndef GPU_DEV
#define GPU_DEV ZS_CUDA
#endif

typedef zs_tensor *(*op_fn)(zs_tensor **in, const void *ctx);

/* Fills the caching allocator with freed blocks of 0xFF bytes. */
static void poison(void)
{
    zs_tensor *t[12] = {0};
    int64_t n = 256;
    for (int i = 0; i < 12; i++, n *= 3) {
        t[i] = zs_empty_on(GPU_DEV, ZS_U8, 1, &n);
        if (t[i])
            zsi_device_memset(GPU_DEV, zsi_ptr(t[i]), 0xFF, (size_t)n);
    }
    for (int i = 0; i < 12; i++)
        zs_release(t[i]);
}

/* t in f64 on the host (a new reference). */
static zs_tensor *host_f64(zs_tensor *t)
{
    zs_tensor *h = zs_to_device(t, ZS_CPU);
    zs_tensor *d = h ? zs_to_dtype(h, ZS_F64) : NULL;
    zs_release(h);
    return d;
}

/* ||a - b|| / ||b|| (a, b f64 host of one numel); +inf on NaN or size. */
static double rel_err(const zs_tensor *a, const zs_tensor *b)
{
    if (!a || !b || zs_numel(a) != zs_numel(b))
        return INFINITY;
    double num = 0, den = 0;
    for (int64_t i = 0; i < zs_numel(a); i++) {
        double x = zs_get(a, i), y = zs_get(b, i);
        if (isnan(x) || isnan(y))
            return INFINITY;
        num += (x - y) * (x - y);
        den += y * y;
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* Runs f on in[] (host tensors: floats are rounded to dt first; others
 * taken as they are) on device dev in dtype dt (f64 on the CPU for the
 * reference); out[0] = result, out[1..] = the gradients of the inputs
 * marked in grad (f64 host copies, new references). */
static int run_case(op_fn f, const void *ctx, int nin, zs_tensor **in,
                    const bool *grad, zs_dtype dt, int dev, zs_dtype run_dt,
                    uint64_t seed, zs_tensor **out)
{
    zs_tensor *x[MAXIN];
    for (int i = 0; i < nin; i++) {
        bool fl = zs_dtype_is_float(in[i]->dtype);
        zs_tensor *r = fl ? zs_to_dtype(in[i], dt) : zs_retain(in[i]);
        zs_tensor *c = fl ? zs_to_dtype(r, run_dt) : zs_retain(r);
        x[i] = zs_to_device(c, dev);
        zs_release(r);
        zs_release(c);
        if (grad[i])
            zs_set_requires_grad(x[i], true);
    }
    if (dev == GPU_DEV)
        poison();
    zs_tensor *y = f(x, ctx);
    ZT_CHECK(y != NULL, "op on %s: %s", zs_device_name(dev), y ? "" : zs_last_error());
    int n = 0;
    if (y) {
        zs_tensor *R = zt_rand(dt, y->ndim, y->shape, seed);
        zs_tensor *Rc = zs_to_dtype(R, y->dtype), *Rd = zs_to_device(Rc, dev);
        zs_tensor *prod = zs_mul(y, Rd);
        zs_tensor *loss = zs_sum(prod, 0, NULL, false);
        bool any = false;
        for (int i = 0; i < nin; i++)
            any = any || grad[i];
        zs_status st = any ? zs_backward(loss, NULL, false) : ZS_OK;
        ZT_CHECK(st == ZS_OK, "backward on %s: %s", zs_device_name(dev),
                 st == ZS_OK ? "" : zs_last_error());
        out[n++] = host_f64(y);
        for (int i = 0; i < nin; i++)
            if (grad[i])
                out[n++] = zs_grad(x[i]) ? host_f64(zs_grad(x[i])) : NULL;
        zs_release(R), zs_release(Rc), zs_release(Rd), zs_release(prod), zs_release(loss);
    }
    zs_release(y);
    for (int i = 0; i < nin; i++)
        zs_release(x[i]);
    return n;
}

/* One case on dtype dt (f32 or bf16) against the f64 CPU reference. */
static void check(const char *name, op_fn f, const void *ctx, int nin, zs_tensor **in,
                  const bool *grad, zs_dtype dt, uint64_t seed)
{
    zs_tensor *ref[MAXIN + 1] = {0}, *got[MAXIN + 1] = {0};
    int nr = run_case(f, ctx, nin, in, grad, dt, ZS_CPU, ZS_F64, seed, ref);
    int ng = run_case(f, ctx, nin, in, grad, dt, GPU_DEV, dt, seed, got);
    double tol = dt == ZS_F32 ? 1e-5 : 2e-2;
    ZT_CHECK(nr == ng && nr > 0, "%s %s: %d results on cpu, %d on cuda", name,
             zs_dtype_name(dt), nr, ng);
    for (int k = 0; k < nr && k < ng; k++) {
        double e = rel_err(got[k], ref[k]);
        ZT_CHECK(e <= tol, "%s %s (seed %llu): %s relative error %.3g > %.1g", name,
                 zs_dtype_name(dt), (unsigned long long)seed,
                 k ? "gradient" : "output", e, tol);
    }
    for (int k = 0; k <= MAXIN; k++) {
        zs_release(ref[k]);
        zs_release(got[k]);
    }
}

static void check_both(const char *name, op_fn f, const void *ctx, int nin,
                       zs_tensor **in, const bool *grad, uint64_t seed)
{
    check(name, f, ctx, nin, in, grad, ZS_F32, seed);
    check(name, f, ctx, nin, in, grad, ZS_BF16, seed + 1);
}

static void release_all(zs_tensor **t, int n)
{
    for (int i = 0; i < n; i++)
        zs_release(t[i]);
}

/* ---- cases ------------------------------------------------------------- */

static zs_tensor *f_copy_t(zs_tensor **in, const void *ctx)
{
    zs_tensor *t = zs_transpose(in[0], 0, 2);
    zs_tensor *c = zs_contiguous(t);
    zs_release(t);
    return c;
}

static zs_tensor *f_slice(zs_tensor **in, const void *ctx)
{
    zs_tensor *s = zs_slice(in[0], 1, 1, 12, 3);
    zs_tensor *e = zs_exp(s); /* a kernel reads the strided view */
    zs_release(s);
    return e;
}

static zs_tensor *f_gelu(zs_tensor **in, const void *ctx)
{
    return zs_gelu(in[0], ZS_GELU_TANH);
}

static zs_tensor *f_relu_scale(zs_tensor **in, const void *ctx)
{
    zs_tensor *r = zs_relu(in[0]), *m = zs_mul_scalar(r, 0.75);
    zs_release(r);
    return m;
}

static zs_tensor *f_sum(zs_tensor **in, const void *ctx)
{
    const int *axes = ctx;
    return zs_sum(in[0], axes[0], axes + 1, false);
}

static zs_tensor *f_mean(zs_tensor **in, const void *ctx)
{
    const int *axes = ctx;
    return zs_mean(in[0], axes[0], axes + 1, true);
}

static zs_tensor *f_matmul(zs_tensor **in, const void *ctx)
{
    const bool *t = ctx;
    return zs_matmul_t(in[0], in[1], t[0], t[1]);
}

static zs_tensor *f_linear(zs_tensor **in, const void *ctx)
{
    return zs_linear(in[0], in[1], in[2]);
}

static zs_tensor *f_linear_gelu(zs_tensor **in, const void *ctx)
{
    return zs_linear_gelu(in[0], in[1], in[2]);
}

static zs_tensor *f_linear_res(zs_tensor **in, const void *ctx)
{
    return zs_linear_residual(in[0], in[1], in[2], in[3]);
}

static zs_tensor *f_layer_norm(zs_tensor **in, const void *ctx)
{
    return zs_layer_norm(in[0], in[1], in[2], 1e-5);
}

static zs_tensor *f_cross_entropy(zs_tensor **in, const void *ctx)
{
    return zs_cross_entropy(in[0], in[1], -100);
}

static zs_tensor *f_embedding(zs_tensor **in, const void *ctx)
{
    return zs_embedding(in[0], in[1]);
}

static zs_tensor *f_attention(zs_tensor **in, const void *ctx)
{
    return zs_attention(in[0], in[1], in[2], ctx);
}

static zs_tensor *ids(int ndim, const int64_t *shape, int64_t hi, uint64_t seed,
                      double ignore_frac)
{
    zs_tensor *t = zs_empty(ZS_I64, ndim, shape);
    zt_irand_seed(seed);
    int64_t *p = zs_data(t);
    for (int64_t i = 0; i < zs_numel(t); i++)
        p[i] = zt_irand(0, 999) < ignore_frac * 1000 ? -100 : zt_irand(0, hi - 1);
    return t;
}

static void test_movement_and_pointwise(void)
{
    const bool g1[1] = {true};
    zs_tensor *a = zt_rand_strided(ZS_F32, 3, (int64_t[]){5, 13, 7}, 11);
    check_both("copy of a transposed view", f_copy_t, NULL, 1, &a, g1, 11);
    check_both("slice (slice_backward) + exp", f_slice, NULL, 1, &a, g1, 12);
    check_both("gelu tanh (unary_deriv)", f_gelu, NULL, 1, &a, g1, 13);
    check_both("relu * 0.75 (mul_scalar)", f_relu_scale, NULL, 1, &a, g1, 14);
    int last[] = {1, 2}, first[] = {1, 0}, two[] = {2, 0, 2}, all[] = {0};
    check_both("sum over the last dim", f_sum, last, 1, &a, g1, 15);
    check_both("sum over dim 0", f_sum, first, 1, &a, g1, 16);
    check_both("sum over dims 0 and 2", f_sum, two, 1, &a, g1, 17);
    check_both("sum of all", f_sum, all, 1, &a, g1, 18);
    check_both("mean over the last dim", f_mean, last, 1, &a, g1, 19);
    zs_release(a);
    zt_section("copy, slice_backward, unary and derivatives, scalar ops, sum, mean");
}

static void test_gemm(void)
{
    const bool g2[2] = {true, true}, g3[3] = {true, true, true};
    const bool g4[4] = {true, true, true, true};
    zs_tensor *m[2] = {zt_rand(ZS_F32, 3, (int64_t[]){3, 37, 45}, 21),
                       zt_rand(ZS_F32, 2, (int64_t[]){45, 29}, 22)};
    bool nn[2] = {false, false}, tt[2] = {true, true};
    check_both("matmul [3,37,45] x [45,29] (folded batch)", f_matmul, nn, 2, m, g2, 21);
    zs_tensor *b[2] = {zt_rand(ZS_F32, 4, (int64_t[]){2, 3, 17, 19}, 23),
                       zt_rand(ZS_F32, 4, (int64_t[]){2, 1, 23, 17}, 24)};
    check_both("matmul_t broadcast batch, both transposed", f_matmul, tt, 2, b, g2, 23);
    zs_tensor *s[2] = {zt_rand_strided(ZS_F32, 2, (int64_t[]){31, 9}, 25),
                       zt_rand_strided(ZS_F32, 2, (int64_t[]){9, 33}, 26)};
    check_both("matmul of strided views", f_matmul, nn, 2, s, g2, 25);
    zs_tensor *l[4] = {zt_rand(ZS_F32, 3, (int64_t[]){3, 37, 45}, 27),
                       zt_rand(ZS_F32, 2, (int64_t[]){29, 45}, 28),
                       zt_rand(ZS_F32, 1, (int64_t[]){29}, 29),
                       zt_rand(ZS_F32, 3, (int64_t[]){3, 37, 29}, 30)};
    check_both("linear (bias epilogue)", f_linear, NULL, 3, l, g3, 27);
    check_both("linear_gelu", f_linear_gelu, NULL, 3, l, g3, 28);
    check_both("linear_residual", f_linear_res, NULL, 4, l, g4, 29);
    release_all(m, 2), release_all(b, 2), release_all(s, 2), release_all(l, 4);
    zt_section("matmul (batched, broadcast, transposed, strided), linear, "
               "linear_gelu, linear_residual on cuBLASLt");
}

static void test_rows(void)
{
    const bool g3[3] = {true, true, true}, gx[2] = {true, false};
    zs_tensor *ln[3] = {zt_rand(ZS_F32, 3, (int64_t[]){5, 7, 129}, 31),
                        zt_rand(ZS_F32, 1, (int64_t[]){129}, 32),
                        zt_rand(ZS_F32, 1, (int64_t[]){129}, 33)};
    check_both("layer_norm (+ backward: gx, gw, gb)", f_layer_norm, NULL, 3, ln, g3, 31);
    zs_tensor *ce[2] = {zt_rand(ZS_F32, 2, (int64_t[]){37, 101}, 34),
                        ids(1, (int64_t[]){37}, 101, 35, 0.1)};
    zs_tensor *x3 = zs_mul_scalar(ce[0], 4.0);
    zs_release(ce[0]);
    ce[0] = x3;
    check_both("cross_entropy (+ backward), some rows ignored", f_cross_entropy, NULL, 2,
               ce, gx, 34);
    zs_tensor *em[2] = {zt_rand(ZS_F32, 2, (int64_t[]){61, 33}, 36),
                        ids(2, (int64_t[]){4, 13}, 61, 37, 0)};
    check_both("embedding (+ backward, repeated indices)", f_embedding, NULL, 2, em, gx, 36);

    zs_tensor *gw = zs_to_device(em[0], GPU_DEV);
    int64_t bad[3] = {1, 61, 2};
    zs_tensor *bi = zs_from_data(ZS_I64, 1, (int64_t[]){3}, bad);
    zs_tensor *gbi = zs_to_device(bi, GPU_DEV);
    ZT_EXPECT_ERROR(zs_embedding(gw, gbi) == NULL,
                    "embedding: index 61 at position [1] (flat 1) is out of range [0, 61)");
    zs_tensor *gl = zs_to_device(ce[0], GPU_DEV);
    zs_tensor *t3 = zs_from_data(ZS_I64, 1, (int64_t[]){3}, (int64_t[]){0, 5, -7});
    zs_tensor *lg = zs_narrow(gl, 0, 0, 3), *gt = zs_to_device(t3, GPU_DEV);
    ZT_EXPECT_ERROR(zs_cross_entropy(lg, gt, -100) == NULL,
                    "cross_entropy: target -7 at index 2 is out of range [0, 101)");
    zs_tensor *errs[] = {gw, bi, gbi, gl, t3, lg, gt};
    release_all(errs, 7);
    release_all(ln, 3), release_all(ce, 2), release_all(em, 2);
    zt_section("layer_norm, cross_entropy, embedding (+ backward); bad indices refused");
}

static void test_attention(void)
{
    const bool g3[3] = {true, true, true};
    struct { int64_t Tq, Tk; zs_attention_params p; const char *name; } cs[] = {
        {37, 37, {.causal = true}, "attention causal T 37"},
        {37, 37, {.causal = false, .scale = 0.3}, "attention full T 37, scale 0.3"},
        {37, 37, {.causal = true, .alibi = true}, "attention causal ALiBi"},
        {5, 41, {.causal = true, .q_offset = 36}, "attention causal, q_offset 36"},
        {19, 150, {.causal = false, .alibi = true}, "attention full ALiBi Tk 150"},
    };
    for (size_t i = 0; i < sizeof cs / sizeof *cs; i++) {
        zs_tensor *qkv[3] = {zt_rand(ZS_F32, 4, (int64_t[]){2, 3, cs[i].Tq, 24}, 40 + i),
                             zt_rand(ZS_F32, 4, (int64_t[]){2, 3, cs[i].Tk, 24}, 50 + i),
                             zt_rand(ZS_F32, 4, (int64_t[]){2, 3, cs[i].Tk, 24}, 60 + i)};
        check_both(cs[i].name, f_attention, &cs[i].p, 3, qkv, g3, 40 + i);
        release_all(qkv, 3);
    }
    /* two backward runs: the same bits */
    zs_tensor *h = zt_rand(ZS_F32, 4, (int64_t[]){2, 3, 45, 32}, 70);
    zs_tensor *grads[2] = {0};
    for (int r = 0; r < 2; r++) {
        zs_tensor *q = zs_to_device(h, GPU_DEV);
        zs_set_requires_grad(q, true);
        zs_attention_params p = {.causal = true};
        zs_tensor *o = zs_attention(q, q, q, &p);
        zs_tensor *s = zs_sum(o, 0, NULL, false);
        ZT_CHECK(s && zs_backward(s, NULL, false) == ZS_OK, "attention backward: %s",
                 zs_last_error());
        grads[r] = zs_grad(q) ? zs_to_device(zs_grad(q), ZS_CPU) : NULL;
        zs_release(q), zs_release(o), zs_release(s);
    }
    ZT_CHECK(grads[0] && grads[1] &&
                 !memcmp(zs_data(grads[0]), zs_data(grads[1]), zs_nbytes(grads[0])),
             "attention backward twice: different bits (a race or an atomic)");
    release_all(grads, 2);
    zs_release(h);
    zt_section("attention (+ backward): causal, full, ALiBi, q_offset; deterministic");
}

static zs_tensor *f_conv(zs_tensor **in, const void *ctx)
{
    return zs_conv2d(in[0], in[1], in[2], ctx);
}

static zs_tensor *f_max_pool(zs_tensor **in, const void *ctx)
{
    return zs_max_pool2d(in[0], ctx);
}

static void test_conv(void)
{
    const bool g3[3] = {true, true, true}, g1[1] = {true};
    zs_conv2d_params ps[] = {{.stride = {1, 1}},
                             {.stride = {2, 1}, .padding = {1, 2}, .dilation = {1, 2}},
                             {.padding = {1, 1}, .groups = 3}};
    for (int i = 0; i < 3; i++) {
        zs_tensor *in[3] = {zt_rand_strided(ZS_F32, 4, (int64_t[]){3, 6, 13, 11}, 80 + i),
                            zt_rand(ZS_F32, 4, (int64_t[]){9, i == 2 ? 2 : 6, 5, 3}, 90 + i),
                            zt_rand(ZS_F32, 1, (int64_t[]){9}, 100 + i)};
        check("conv2d (+ backward: gx, gw, gb)", f_conv, &ps[i], 3, in, g3, ZS_F32, 80 + i);
        release_all(in, 3);
    }
    zs_pool2d_params pp[] = {{.kernel = {2, 2}}, {.kernel = {3, 3}, .stride = {2, 2},
                                                  .padding = {1, 1}}};
    for (int i = 0; i < 2; i++) {
        zs_tensor *x = zt_rand_strided(ZS_F32, 4, (int64_t[]){3, 5, 13, 11}, 110 + i);
        check("max_pool2d (+ backward, overlapping windows)", f_max_pool, &pp[i], 1, &x,
              g1, ZS_F32, 110 + i);
        zs_release(x);
    }
    zt_section("conv2d (stride, padding, dilation, groups), max_pool2d (+ backward), f32");
}

/* ---- a GPT step --------------------------------------------------------- */

#define STEPS 6

static zs_status tok_batch(void *ctx, int64_t index, zs_tensor **x, zs_tensor **y)
{
    (void)ctx;
    int64_t idv[4 * 14];
    for (int r = 0; r < 4; r++)
        for (int t = 0; t < 14; t++)
            idv[r * 14 + t] = (3 * index + 5 * r + 7 * t) % 61;
    zs_tensor *all = zs_from_data(ZS_I64, 2, (int64_t[]){4, 14}, idv);
    *x = zs_contiguous(zs_narrow(all, 1, 0, 13));
    *y = zs_contiguous(zs_narrow(all, 1, 1, 13));
    zs_release(all);
    return *x && *y ? ZS_OK : ZS_ERR_NOMEM;
}

/* Images: 4 random 1x28x28 inputs per batch and fixed labels; batches 0
 * and 1 alternate. */
static zs_status img_batch(void *ctx, int64_t index, zs_tensor **x, zs_tensor **y)
{
    (void)ctx;
    index %= 2;
    *x = zs_normal(ZS_F32, 4, (int64_t[]){4, 1, 28, 28}, 0, 1, 100 + (uint64_t)index);
    int64_t lab[4];
    for (int i = 0; i < 4; i++)
        lab[i] = (index * 3 + i * 7) % 10;
    *y = zs_from_data(ZS_I64, 1, (int64_t[]){4}, lab);
    return *x && *y ? ZS_OK : ZS_ERR_NOMEM;
}

typedef struct run {
    int n;
    double loss[STEPS];
} run;

static int record(void *ctx, const zs_train_event *e)
{
    run *r = ctx;
    if (r->n < STEPS)
        r->loss[r->n++] = e->loss;
    return 0;
}

/* arch < 0: LeNet with SGD */
static run train(int arch, int dev, zs_dtype precision)
{
    run r = {0};
    zs_gpt_config g = {arch < 0 ? ZS_GPT2 : (zs_gpt_arch)arch, 61, 16, 2, 2, 24};
    zs_module *m = arch < 0 ? zs_cnn_new("lenet", 7) : zs_gpt_new(&g, 7);
    zs_trainer_config c = zs_trainer_defaults();
    c.steps = c.schedule.total_steps = STEPS;
    c.optim.lr = c.schedule.base_lr = 1e-2;
    c.schedule.warmup_steps = 2;
    c.clip = 0.5;
    c.accum = 2;
    c.batch = tok_batch;
    if (arch < 0) {
        c.accum = 1;
        c.batch = img_batch;
        c.loss = zs_classifier_loss;
        c.optim = (zs_optim_config){ZS_SGD, 1e-2, 0.9, true, 1e-4, 0, 0, 0};
    }
    c.on_step = record, c.on_step_ctx = &r;
    c.comm = NULL;
    c.device = dev;
    c.precision = precision;
    zs_trainer *t = zs_trainer_new(m, &c);
    zs_status st = t ? zs_trainer_run(t) : ZS_ERR_STATE;
    ZT_CHECK(st == ZS_OK && r.n == STEPS, "%d steps on %s: %s", STEPS,
             zs_device_name(dev), st == ZS_OK ? "" : zs_last_error());
    zs_trainer_free(t);
    zs_module_free(m);
    return r;
}

static void test_train(int arch, const char *name, zs_dtype precision)
{
    zs_scope_push();
    run cpu = train(arch, ZS_CPU, precision), g1 = train(arch, GPU_DEV, precision);
    run g2 = train(arch, GPU_DEV, precision);
    double tol = precision == ZS_F32 ? 1e-4 : 3e-2, worst = 0;
    for (int i = 0; i < STEPS && i < cpu.n && i < g1.n; i++)
        worst = fmax(worst, fabs(g1.loss[i] - cpu.loss[i]) / fabs(cpu.loss[i]));
    ZT_CHECK(g1.n == STEPS && worst <= tol, "%s %s: cuda losses within %.0e of the "
             "cpu's (worst %.3g; first %.9g / %.9g, last %.9g / %.9g)", name,
             zs_dtype_name(precision), tol, worst, g1.loss[0], cpu.loss[0],
             g1.loss[STEPS - 1], cpu.loss[STEPS - 1]);
    ZT_CHECK(g1.n == g2.n && !memcmp(g1.loss, g2.loss, sizeof g1.loss),
             "%s %s: two cuda runs give the same losses bit for bit", name,
             zs_dtype_name(precision));
    zs_scope_pop();
}

int main(void)
{
    if ((GPU_DEV == ZS_CUDA ? zs_cuda_enable() : zs_test_device_enable()) != ZS_OK) {
        printf("SKIP: %s\n", zs_last_error());
        return 77;
    }
    char gpu[384];
    zs_cuda_describe(gpu, sizeof gpu);
    printf("gpu: %s\n", gpu);
    zs_set_num_threads(4);
    test_movement_and_pointwise();
    test_gemm();
    test_rows();
    test_attention();
    test_conv();
    test_train(ZS_GPT2, "gpt2", ZS_F32);
    test_train(ZS_BLOOM, "bloom", ZS_F32);
    test_train(ZS_GPT2, "gpt2", ZS_BF16);
    test_train(-1, "lenet", ZS_F32);
    zt_section("GPT and LeNet steps on cuda track the cpu; two cuda runs are identical");
    return zt_done();
}
