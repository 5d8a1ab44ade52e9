/*
 * test_dispatch.c - operators as data (src/ops/dispatch.c): every pointwise
 * descriptor against its scalar formula on random broadcast shapes, odd
 * sizes and strided views (float64); dispatch errors (a dtype or device
 * with no kernel, tensors on two devices); a second device registered from
 * host memory whose kernels count their calls; bf16 elementwise operators,
 * forward and backward, against float64; CPU kernels make no nested driver
 * calls (the profiler counts each operator once).
 */
#include <stdlib.h>

#include "ops/op.h"
#include "testutil.h"

/* ---- a second device: host memory the CPU is told it cannot address -- */

#define TESTDEV 3
static int64_t dev_allocs, dev_copies;

static void *dev_alloc(void *ctx, size_t n)
{
    dev_allocs++;
    return malloc(n ? n : 1);
}

static void dev_free(void *ctx, void *p) { free(p); }

static zs_status dev_copy(void *ctx, void *dst, const void *src, size_t n,
                          zs_copy_kind kind)
{
    dev_copies++;
    memcpy(dst, src, n);
    return ZS_OK;
}

static int add_calls;

/* The test device's add: f32, same shapes, contiguous (all this test
 * gives it); counts its calls. */
static zs_status dev_add(const zsi_call *c, zs_tensor *out)
{
    add_calls++;
    const float *a = zsi_ptr(c->in[0]), *b = zsi_ptr(c->in[1]);
    float *o = zsi_ptr(out);
    for (int64_t i = 0; i < zs_numel(out); i++)
        o[i] = a[i] + b[i];
    return ZS_OK;
}

static void test_second_device(void)
{
    zs_device_ops ops = {.name = "testdev", .alloc = dev_alloc, .free = dev_free,
                         .copy = dev_copy};
    ZT_CHECK(zs_device_register(TESTDEV, &ops) == ZS_OK, "register");
    ZT_EXPECT_ERROR(zs_device_register(ZS_CPU, &ops) < 0, "0 is the CPU");
    ZT_CHECK(!strcmp(zs_device_name(TESTDEV), "testdev"), "name");
    zs_tensor *x = zt_rand(ZS_F32, ZS_SHAPE(5, 7), 1), *y = zt_rand(ZS_F32, ZS_SHAPE(5, 7), 2);
    zs_tensor *ref = zs_add(x, y);
    zs_tensor *xs = zt_rand_strided(ZS_F32, ZS_SHAPE(5, 7), 1);
    zs_tensor *xd = zs_to_device(xs, TESTDEV), *yd = zs_to_device(y, TESTDEV);
    ZT_CHECK(xd && yd && xd->device == TESTDEV && dev_allocs == 2 && dev_copies == 2,
             "to_device: two allocations and copies on the device");
    ZT_EXPECT_ERROR(zs_data(xd) == NULL, "which the CPU cannot address");
    ZT_EXPECT_ERROR(zs_device_register(TESTDEV, NULL) < 0, "still holds 2 storages");
    /* no kernel yet: the message lists what exists */
    ZT_EXPECT_ERROR(zs_add(xd, yd) == NULL, "add: no kernel for f32 on testdev "
                    "(kernels: f32, f64, f16, bf16 on cpu)");
    ZT_EXPECT_ERROR(zs_add(x, yd) == NULL, "add: inputs on cpu and testdev");
    /* softmax is a descriptor too: the same message, with its kernels */
    ZT_EXPECT_ERROR(zs_softmax(xd, -1) == NULL, "softmax: no kernel for f32 on "
                    "testdev (kernels: f32, f64, f16, bf16 on cpu)");
    zsi_opdef *add = zsi_opdef_find("add");
    ZT_CHECK(add && zsi_op_set_kernel(add, TESTDEV, ZS_F32, dev_add) == ZS_OK, "set kernel");
    zs_tensor *zd = zs_add(xd, yd);
    ZT_CHECK(zd && zd->device == TESTDEV && add_calls == 1, "add ran the device's "
             "kernel (%d calls)", add_calls);
    zs_tensor *z = zs_to_device(zd, ZS_CPU);
    bool same = z && z->device == ZS_CPU;
    for (int64_t i = 0; same && i < 35; i++)
        same = zs_get(z, i) == zs_get(ref, i);
    ZT_CHECK(same, "device result copied back equals the CPU's");
    zsi_op_set_kernel(add, TESTDEV, ZS_F32, NULL);
    zs_tensor *all[] = {x, y, ref, xs, xd, yd, zd, z};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        zs_release(all[i]);
    ZT_CHECK(zs_device_register(TESTDEV, NULL) == ZS_OK, "removed once empty");
    ZT_EXPECT_ERROR(zs_empty_on(TESTDEV, ZS_F32, ZS_SHAPE(2)) == NULL, "not registered");
    zt_section("a second device: dispatch by device, copies, checked host access");
}

/* ---- pointwise descriptors against their scalar formulas ------------- */

typedef struct pw_case {
    const char *name;
    int arity;
    zs_tensor *(*run)(zs_tensor *a, zs_tensor *b);
    bool positive; /* domain: inputs > 0 */
} pw_case;

#define U(fn) static zs_tensor *r_##fn(zs_tensor *a, zs_tensor *b) { return zs_##fn(a); }
U(neg) U(exp) U(log) U(sqrt) U(rsqrt) U(sin) U(cos) U(tanh) U(sigmoid) U(relu)
U(silu) U(abs)
#undef U
static zs_tensor *r_gelu(zs_tensor *a, zs_tensor *b) { return zs_gelu(a, ZS_GELU_TANH); }
static zs_tensor *r_pow(zs_tensor *a, zs_tensor *b) { return zs_pow(a, 1.7); }
static zs_tensor *r_clamp(zs_tensor *a, zs_tensor *b) { return zs_clamp(a, -0.3, 0.4); }
static zs_tensor *r_adds(zs_tensor *a, zs_tensor *b) { return zs_add_scalar(a, 0.25); }
static zs_tensor *r_muls(zs_tensor *a, zs_tensor *b) { return zs_mul_scalar(a, -3.0); }

static const pw_case cases[] = {
    {"neg", 1, r_neg, false}, {"exp", 1, r_exp, false}, {"log", 1, r_log, true},
    {"sqrt", 1, r_sqrt, true}, {"rsqrt", 1, r_rsqrt, true}, {"sin", 1, r_sin, false},
    {"cos", 1, r_cos, false}, {"tanh", 1, r_tanh, false}, {"sigmoid", 1, r_sigmoid, false},
    {"relu", 1, r_relu, false}, {"silu", 1, r_silu, false}, {"abs", 1, r_abs, false},
    {"gelu", 1, r_gelu, false}, {"pow", 1, r_pow, true}, {"clamp", 1, r_clamp, false},
    {"add_scalar", 1, r_adds, false}, {"mul_scalar", 1, r_muls, false},
    {"add", 2, zs_add, false}, {"sub", 2, zs_sub, false}, {"mul", 2, zs_mul, false},
    {"div", 2, zs_div, true},
};
#define NCASES (sizeof cases / sizeof *cases)

static uint32_t rnd(uint64_t seed, uint64_t i, uint32_t n)
{
    uint32_t w[4];
    zs_philox(seed, i, w);
    return w[0] % n;
}

/* A random shape of 1..4 dims with odd sizes, and a second one that
 * broadcasts against it (sizes 1 and missing leading dims). */
static void random_shapes(uint64_t seed, int *na, int64_t *a, int *nb, int64_t *b)
{
    *na = 1 + (int)rnd(seed, 0, 4);
    for (int d = 0; d < *na; d++)
        a[d] = 1 + rnd(seed, 1 + (uint64_t)d, 9);
    *nb = 1 + (int)rnd(seed, 10, (uint32_t)*na);
    for (int d = 0; d < *nb; d++)
        b[d] = rnd(seed, 20 + (uint64_t)d, 3) == 0 ? 1 : a[*na - *nb + d];
}

/* Values in [0.1, 1.1) for a positive domain, else [-1, 1). */
static zs_tensor *input(zs_dtype dt, int n, const int64_t *s, uint64_t seed,
                        bool positive, bool strided)
{
    zs_tensor *r = strided ? zt_rand_strided(dt, n, s, seed) : zt_rand(dt, n, s, seed);
    if (!positive)
        return r;
    zs_tensor *a = zs_abs(r), *p = zs_add_scalar(a, 0.1);
    zs_release(r);
    zs_release(a);
    return p;
}

/* max relative error of out against the descriptor's formula applied to
 * a (and b, broadcast); -1 when the shape is not the broadcast shape. */
static double formula_err(const zsi_opdef *d, const void *at, zs_tensor *out,
                          zs_tensor *a, zs_tensor *b)
{
    int n = a->ndim > (b ? b->ndim : 0) ? a->ndim : b->ndim;
    if (out->ndim != n)
        return -1;
    double worst = 0;
    for (int64_t i = 0; i < zs_numel(out); i++) {
        int64_t ia = 0, ib = 0, sa = 1, sb = 1, rem = i;
        for (int k = n - 1; k >= 0; k--) {
            int64_t idx = rem % out->shape[k];
            rem /= out->shape[k];
            int ka = k - (n - a->ndim), kb = b ? k - (n - b->ndim) : -1;
            if (ka >= 0) {
                if (a->shape[ka] != 1 && a->shape[ka] != out->shape[k])
                    return -1;
                ia += (a->shape[ka] == 1 ? 0 : idx) * sa;
                sa *= a->shape[ka];
            }
            if (kb >= 0) {
                ib += (b->shape[kb] == 1 ? 0 : idx) * sb;
                sb *= b->shape[kb];
            }
        }
        double x[2] = {zs_get(a, ia), b ? zs_get(b, ib) : 0};
        double r = d->scalar(x, at), v = zs_get(out, i);
        worst = fmax(worst, fabs(v - r) / fmax(1.0, fabs(r)));
    }
    return worst;
}

/* The attributes a case's call used (the scalar formula reads them, e.g.
 * pow's exponent or add_scalar's s): the node of a recorded call holds the
 * operator's struct whole (ops/op.h). */
static const void *attrs_of(const zs_tensor *out)
{
    return zsi_node_attrs(zsi_ctx_of(out));
}

static void test_formulas(void)
{
    double worst = 0;
    int shapes = 0;
    for (size_t c = 0; c < NCASES; c++) {
        for (int r = 0; r < 12; r++) {
            uint64_t seed = 1000 * c + (uint64_t)r;
            int na, nb;
            int64_t sa[4], sb[4];
            random_shapes(seed, &na, sa, &nb, sb);
            bool swap = r % 2 == 1; /* the broadcast operand on either side */
            zs_tensor *a = input(ZS_F64, swap ? nb : na, swap ? sb : sa, seed,
                                 cases[c].positive, r % 3 == 0);
            zs_tensor *b = cases[c].arity == 2
                ? input(ZS_F64, swap ? na : nb, swap ? sa : sb, seed + 7,
                        cases[c].positive, r % 3 == 1) : NULL;
            zs_set_requires_grad(a, true); /* records the attributes */
            zs_tensor *out = cases[c].run(a, b);
            const zsi_opdef *d = out ? (const zsi_opdef *)zsi_ctx_of(out)->op : NULL;
            double e = d && d->scalar && d->cls == ZSI_POINTWISE
                           ? formula_err(d, attrs_of(out), out, a, b) : -1;
            ZT_CHECK(e >= 0 && e < 1e-12 && !strcmp(d->op.name, cases[c].name),
                     "%s (seed %llu): error %g against its formula '%s'",
                     cases[c].name, (unsigned long long)seed, e,
                     d ? d->formula : "?");
            worst = fmax(worst, e);
            shapes++;
            zs_release(out);
            zs_release(a);
            zs_release(b);
        }
    }
    printf("%zu pointwise descriptors on %d random shapes (broadcast, strided): "
           "max rel err %.2g vs their scalar formulas\n", NCASES, shapes, worst);
    zt_section("pointwise descriptors: shape rule and formula (float64)");
}

/* ---- dispatch errors --------------------------------------------------- */

static void test_errors(void)
{
    zs_tensor *h = zs_zeros(ZS_F16, ZS_SHAPE(3)), *f = zs_zeros(ZS_F32, ZS_SHAPE(3));
    zs_tensor *b = zs_zeros(ZS_BF16, ZS_SHAPE(3)), *i = zs_zeros(ZS_I32, ZS_SHAPE(3));
    zs_tensor *q = zs_zeros(ZS_F8E4M3, ZS_SHAPE(3));
    ZT_EXPECT_ERROR(zs_exp(q) == NULL, "exp: no kernel for f8e4m3 on cpu (kernels: "
                    "f32, f64, f16, bf16 on cpu)");
    zs_release(q);
    ZT_EXPECT_ERROR(zs_add(b, f) == NULL, "add: dtypes bf16 and f32 differ");
    ZT_EXPECT_ERROR(zs_mul(i, i) == NULL, "mul: dtype i32 is not supported");
    zs_tensor *f4 = zs_zeros(ZS_F32, ZS_SHAPE(4));
    ZT_EXPECT_ERROR(zs_add(f, f4) == NULL, "cannot be broadcast");
    ZT_EXPECT_ERROR(zs_neg(NULL) == NULL, "");
    zs_tensor *all[] = {h, f, b, i, f4};
    for (size_t k = 0; k < sizeof all / sizeof *all; k++)
        zs_release(all[k]);
    zt_section("dispatch errors name the operator, dtypes, devices and kernels");
}

/* ---- bf16 ---------------------------------------------------------------- */

/* bf16 inputs (rounded from random f32); the same values in f64 give the
 * reference. Forward: within one bf16 rounding of the result (2^-8
 * relative) plus the f32 kernel's error: 2^-7. Backward with an upstream
 * gradient of ones: the rules are chains of up to five bf16 operators
 * (sigmoid: 1 - y, then two products), each rounding once: 2^-5. Errors
 * are relative to max(1, |reference|). */
static void test_bf16(void)
{
    double wf = 0, wb = 0;
    for (size_t c = 0; c < NCASES; c++) {
        zs_scope_push();
        uint64_t seed = 77 + c;
        zs_tensor *a32 = input(ZS_F32, ZS_SHAPE(3, 17), seed, cases[c].positive, false);
        zs_tensor *b32 = input(ZS_F32, ZS_SHAPE(17), seed + 1, cases[c].positive, false);
        zs_tensor *ab = zs_to_dtype(a32, ZS_BF16), *bb = zs_to_dtype(b32, ZS_BF16);
        zs_tensor *ad = zs_to_dtype(ab, ZS_F64), *bd = zs_to_dtype(bb, ZS_F64);
        zs_tensor *ins[4] = {ab, bb, ad, bd};
        for (int k = 0; k < 4; k++)
            zs_set_requires_grad(ins[k], true);
        bool two = cases[c].arity == 2;
        zs_tensor *ob = cases[c].run(ab, two ? bb : NULL);
        zs_tensor *od = cases[c].run(ad, two ? bd : NULL);
        double *ref = od ? zt_values(od) : NULL;
        double ef = ob && ref && ob->dtype == ZS_BF16 ? zt_max_err(ob, ref, 51) : 1;
        free(ref);
        bool bw = ob && od &&
                  zs_backward(ob, zs_ones(ZS_BF16, ob->ndim, ob->shape), false) == ZS_OK &&
                  zs_backward(od, zs_ones(ZS_F64, od->ndim, od->shape), false) == ZS_OK;
        double eb = 0;
        for (int k = 0; bw && k < (two ? 2 : 1); k++) {
            zs_tensor *g = zs_grad(ins[k]), *gd = zs_grad(ins[k + 2]);
            double *gr = gd ? zt_values(gd) : NULL;
            eb = fmax(eb, g && g->dtype == ZS_BF16 && gr
                              ? zt_max_err(g, gr, zs_numel(g)) : 1);
            free(gr);
        }
        ZT_CHECK(ef < 1.0 / 128 && bw && eb < 1.0 / 32,
                 "%s bf16: forward err %g, backward err %g", cases[c].name, ef, eb);
        wf = fmax(wf, ef);
        wb = fmax(wb, eb);
        zs_scope_pop();
    }
    printf("bf16: %zu elementwise operators, max rel err forward %.2g, "
           "backward %.2g (vs float64 on the same rounded inputs)\n", NCASES, wf, wb);
    zt_section("bf16 elementwise operators, forward and backward");
}

/* Largest |x - ref| / max(1, |ref|) over the elements of two tensors of
 * one shape (any dtypes). */
static double rel_err(const zs_tensor *x, const zs_tensor *ref)
{
    double *r = zt_values(ref), e = zt_max_err(x, r, zs_numel(ref));
    free(r);
    return e;
}

/* matmul and linear in bf16 (the BF16 GEMM, f32 accumulation, one rounding
 * of the result) against float64 on the same rounded inputs, forward and
 * backward, over transposed, batched and broadcast shapes. Tolerance 2^-6
 * relative to max(1, |ref|): K <= 37 products accumulate in f32 and the
 * result rounds to bf16 once; the gradient of a broadcast operand rounds
 * twice (each batch's product, then their sum). */
static void test_bf16_gemm(void)
{
    static const struct {
        int na, nb;
        int64_t a[4], b[4];
        bool ta, tb;
    } mm[] = {
        {2, 2, {5, 37}, {37, 19}, false, false},
        {2, 2, {37, 5}, {19, 37}, true, true},
        {3, 2, {3, 7, 9}, {9, 33}, false, false},
        {4, 3, {2, 1, 7, 9}, {3, 9, 5}, false, false},
        {3, 3, {2, 9, 7}, {2, 5, 9}, true, true},
    };
    double worst = 0;
    for (size_t i = 0; i < sizeof mm / sizeof *mm; i++) {
        zs_scope_push();
        zs_tensor *ab = zs_to_dtype(zt_rand(ZS_F32, mm[i].na, mm[i].a, 300 + i), ZS_BF16);
        zs_tensor *bb = zs_to_dtype(zt_rand(ZS_F32, mm[i].nb, mm[i].b, 400 + i), ZS_BF16);
        zs_tensor *ad = zs_to_dtype(ab, ZS_F64), *bd = zs_to_dtype(bb, ZS_F64);
        zs_tensor *ins[4] = {ab, bb, ad, bd};
        for (int k = 0; k < 4; k++)
            zs_set_requires_grad(ins[k], true);
        zs_tensor *ob = zs_matmul_t(ab, bb, mm[i].ta, mm[i].tb);
        zs_tensor *od = zs_matmul_t(ad, bd, mm[i].ta, mm[i].tb);
        bool ok = ob && od && ob->dtype == ZS_BF16 && zs_same_shape(ob, od) &&
                  zs_backward(ob, zs_ones(ZS_BF16, ob->ndim, ob->shape), false) == ZS_OK &&
                  zs_backward(od, zs_ones(ZS_F64, od->ndim, od->shape), false) == ZS_OK;
        double e = ok ? fmax(rel_err(ob, od), fmax(rel_err(zs_grad(ab), zs_grad(ad)),
                                                 rel_err(zs_grad(bb), zs_grad(bd)))) : 1;
        ZT_CHECK(ok && zs_grad(ab)->dtype == ZS_BF16 && e < 1.0 / 64,
                 "matmul bf16 case %zu: rel err %g", i, e);
        worst = fmax(worst, e);
        zs_scope_pop();
    }
    printf("bf16 matmul: %zu shapes, max rel err %.2g (forward and both gradients)\n",
           sizeof mm / sizeof *mm, worst);
    /* linear, linear_gelu, linear_residual: x [3, 5, 37], w [19, 37] */
    double wl = 0;
    for (int kind = 0; kind < 3; kind++) {
        zs_scope_push();
        zs_tensor *src[4] = {zt_rand(ZS_F32, ZS_SHAPE(3, 5, 37), 500),
                             zt_rand(ZS_F32, ZS_SHAPE(19, 37), 501),
                             zt_rand(ZS_F32, ZS_SHAPE(19), 502),
                             zt_rand(ZS_F32, ZS_SHAPE(3, 5, 19), 503)};
        zs_tensor *lb[4], *ld[4];
        for (int k = 0; k < 4; k++) {
            lb[k] = zs_to_dtype(src[k], ZS_BF16);
            ld[k] = zs_to_dtype(lb[k], ZS_F64);
            zs_set_requires_grad(lb[k], true);
            zs_set_requires_grad(ld[k], true);
        }
        zs_tensor *ob = kind == 0 ? zs_linear(lb[0], lb[1], lb[2])
                      : kind == 1 ? zs_linear_gelu(lb[0], lb[1], lb[2])
                                  : zs_linear_residual(lb[0], lb[1], lb[2], lb[3]);
        zs_tensor *od = kind == 0 ? zs_linear(ld[0], ld[1], ld[2])
                      : kind == 1 ? zs_linear_gelu(ld[0], ld[1], ld[2])
                                  : zs_linear_residual(ld[0], ld[1], ld[2], ld[3]);
        bool ok = ob && od && ob->dtype == ZS_BF16 &&
                  zs_backward(ob, zs_ones(ZS_BF16, ob->ndim, ob->shape), false) == ZS_OK &&
                  zs_backward(od, zs_ones(ZS_F64, od->ndim, od->shape), false) == ZS_OK;
        double e = ok ? rel_err(ob, od) : 1;
        for (int k = 0; ok && k < (kind == 2 ? 4 : 3); k++)
            e = fmax(e, zs_grad(lb[k]) && zs_grad(lb[k])->dtype == ZS_BF16
                            ? rel_err(zs_grad(lb[k]), zs_grad(ld[k])) : 1);
        ZT_CHECK(ok && e < 1.0 / 64, "linear kind %d bf16: rel err %g", kind, e);
        wl = fmax(wl, e);
        zs_scope_pop();
    }
    printf("bf16 linear, linear_gelu, linear_residual: max rel err %.2g (output and "
           "every gradient)\n", wl);
    zt_section("bf16 matmul and linear (BF16 GEMM) forward and backward vs float64");
}

/* ---- kernels make no nested driver calls --------------------------------- */

static uint64_t calls_of(const char *name)
{
    zs_op_stat st[128];
    int n = zs_profile_stats(st, 128);
    for (int i = 0; i < n; i++)
        if (!strcmp(st[i].name, name))
            return st[i].calls;
    return 0;
}

/* CPU kernels copy and fill with the host helpers (zsi_copy_host,
 * zsi_fill_host), so the profiler counts each operator once: clone,
 * bf16 elementwise (zsi_via_f32's conversions and rounding), the bf16
 * matmul's rounding, the mean of an empty tensor and a concat of strided
 * inputs run no copy_, fill_ or to_dtype of their own. */
static void test_no_nested_calls(void)
{
    zs_tensor *x = zt_rand(ZS_F32, ZS_SHAPE(5, 6), 11);
    zs_tensor *xb = zs_to_dtype(x, ZS_BF16);
    zs_tensor *xt = zs_transpose(x, 0, 1), *xbt = zs_transpose(xb, 0, 1);
    zs_tensor *e = zs_zeros(ZS_F32, ZS_SHAPE(0, 3));
    zs_profile_reset();
    zs_profile_enable(true);
    zs_tensor *r[] = {zs_clone(xt), zs_exp(xb), zs_add(xb, xb),
                      zs_matmul(xb, xbt), zs_mean(e, 0, NULL, false),
                      zs_concat(2, (zs_tensor *[]){xt, xt}, 0)};
    zs_profile_enable(false);
    bool made = true;
    for (size_t i = 0; i < sizeof r / sizeof *r; i++)
        made = made && r[i];
    ZT_CHECK(made && calls_of("copy") == 1 && calls_of("exp") == 1 &&
             calls_of("matmul") == 1 && calls_of("mean") == 1 &&
             calls_of("concat") == 1,
             "each operator counted once (copy %llu, exp %llu, matmul %llu)",
             (unsigned long long)calls_of("copy"),
             (unsigned long long)calls_of("exp"),
             (unsigned long long)calls_of("matmul"));
    ZT_CHECK(calls_of("copy_") == 0 && calls_of("fill_") == 0 &&
             calls_of("to_dtype") == 0,
             "no nested copy_ (%llu), fill_ (%llu) or to_dtype (%llu)",
             (unsigned long long)calls_of("copy_"),
             (unsigned long long)calls_of("fill_"),
             (unsigned long long)calls_of("to_dtype"));
    ZT_CHECK(made && isnan(zs_item(r[4])), "mean of an empty dim is NaN");
    zs_profile_reset();
    for (size_t i = 0; i < sizeof r / sizeof *r; i++)
        zs_release(r[i]);
    zs_tensor *all[] = {x, xb, xt, xbt, e};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        zs_release(all[i]);
    zt_section("kernels copy and fill on the host: no nested driver calls");
}

int main(void)
{
    test_formulas();
    test_errors();
    test_second_device();
    test_bf16();
    test_bf16_gemm();
    test_no_nested_calls();
    return zt_done();
}
