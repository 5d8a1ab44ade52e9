/*
 * test_autocast.c - zs_autocast_push/pop (ops/autocast.c): the dtype of
 * every class's results as the table says (the expectation read from the
 * kernel table, so it follows kernels added later), values of a bf16
 * product against a float64 reference of the rounded inputs, gradients
 * reaching f32 parameters in f32 (values against float64), the weight
 * cache (one conversion per scope, two forwards and two backwards through
 * one cast), the flat pass (one conversion of the whole buffer, the same
 * bits as the per-weight cache), nesting, f64 never cast, the test device
 * giving the CPU's bits, and the errors.
 */
#include <stdlib.h>

#include "ops/op.h"
#include "testutil.h"

/* What the table says a call of def on inputs of dtype in under lowp
 * computes in (the single-dtype cases the tests use). */
static zs_dtype lowp_dtype(zsi_opdef *def, zs_dtype lowp)
{
    return zsi_autocast_route(def, ZS_CPU, lowp);
}

static zs_dtype f32_class_dtype(zsi_opdef *def, zs_dtype in)
{
    return def->kernel[ZS_CPU][in] ? in : ZS_F32; /* reads_lowp rows */
}

static zs_tensor *bf16(zs_tensor *t)
{
    zs_tensor *r = zs_to_dtype(t, ZS_BF16);
    zs_release(t);
    return r;
}

static void test_classes(void)
{
    zs_scope_push();
    zs_tensor *a = zt_rand(ZS_F32, ZS_SHAPE(5, 7), 1), *b = zt_rand(ZS_F32, ZS_SHAPE(7, 3), 2);
    zs_tensor *ab = bf16(zt_rand(ZS_F32, ZS_SHAPE(5, 7), 3));
    zs_tensor *w = zt_rand(ZS_F32, ZS_SHAPE(4, 7), 4), *bias = zt_rand(ZS_F32, ZS_SHAPE(4), 5);
    zs_tensor *x4 = zt_rand(ZS_F32, ZS_SHAPE(2, 3, 6, 5), 6); /* [B, H, T, D] */
    zs_tensor *img = zt_rand(ZS_F32, ZS_SHAPE(2, 3, 9, 8), 7);
    zs_tensor *k = zt_rand(ZS_F32, ZS_SHAPE(4, 3, 3, 3), 8);
    zs_tensor *a64 = zt_rand(ZS_F64, ZS_SHAPE(5, 7), 9), *b64 = zt_rand(ZS_F64, ZS_SHAPE(7, 3), 10);
    zs_tensor *lnw = zt_rand(ZS_F32, ZS_SHAPE(7), 11);
    zs_tensor *tgt = zs_zeros(ZS_I64, ZS_SHAPE(5));
    ZT_CHECK(zs_autocast_dtype() == ZS_F32, "off at start");
    ZT_CHECK(zs_autocast_push(ZS_BF16) == ZS_OK && zs_autocast_dtype() == ZS_BF16, "push");
    struct {
        const char *what;
        zs_tensor *r;
        zs_dtype want;
    } cases[] = {
        {"matmul f32", zs_matmul(a, b), lowp_dtype(&zsi_def_matmul, ZS_BF16)},
        {"linear f32", zs_linear(a, w, bias), lowp_dtype(&zsi_def_linear, ZS_BF16)},
        {"linear_gelu f32", zs_linear_gelu(a, w, bias), lowp_dtype(&zsi_def_linear_gelu, ZS_BF16)},
        {"attention f32", zs_attention(x4, x4, x4, NULL), lowp_dtype(&zsi_def_attention, ZS_BF16)},
        {"conv2d f32", zs_conv2d(img, k, NULL, NULL), lowp_dtype(&zsi_def_conv2d, ZS_BF16)},
        {"matmul f64 (never cast)", zs_matmul(a64, b64), ZS_F64},
        {"layer_norm bf16", zs_layer_norm(ab, lnw, NULL, 1e-5),
         f32_class_dtype(&zsi_def_layer_norm, ZS_BF16)},
        {"softmax bf16", zs_softmax(ab, -1), f32_class_dtype(&zsi_def_softmax, ZS_BF16)},
        {"sum bf16", zs_sum(ab, 0, NULL, false), f32_class_dtype(&zsi_def_sum, ZS_BF16)},
        {"cross_entropy bf16", zs_cross_entropy(ab, tgt, -100), ZS_F32},
        {"mse_loss bf16", zs_mse_loss(ab, ab), ZS_F32},
        {"add bf16 + f32 (promote)", zs_add(ab, a), ZS_F32},
        {"add bf16 + bf16", zs_add(ab, ab), ZS_BF16},
        {"exp bf16 (default)", zs_exp(ab), ZS_BF16},
        {"exp f32 (default)", zs_exp(a), ZS_F32},
        {"dropout bf16 (default)", zs_dropout(ab, 0.5, true),
         zsi_def_dropout.kernel[ZS_CPU][ZS_BF16] ? ZS_BF16 : ZS_F32},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        ZT_CHECK(cases[i].r && cases[i].r->dtype == cases[i].want, "%s: %s, expected %s",
                 cases[i].what, cases[i].r ? zs_dtype_name(cases[i].r->dtype) : "NULL",
                 zs_dtype_name(cases[i].want));
    ZT_CHECK(zsi_autocast_route(&zsi_def_matmul, ZS_CPU, ZS_BF16) == ZS_BF16,
             "matmul has a bf16 kernel: bf16 route");
    /* nested off, then fp8 and f16 */
    ZT_CHECK(zs_autocast_push(ZS_F32) == ZS_OK, "push off");
    zs_tensor *off = zs_matmul(a, b);
    ZT_CHECK(off && off->dtype == ZS_F32 && zs_autocast_dtype() == ZS_F32,
             "nested ZS_F32 scope: matmul in f32");
    ZT_CHECK(zs_autocast_push(ZS_F8E4M3) == ZS_OK, "push fp8");
    zs_tensor *f8 = zs_matmul(a, b);
    ZT_CHECK(f8 && f8->dtype == ZS_BF16 &&
             zs_autocast_compute_dtype(ZS_F8E4M3, ZS_CPU) == ZS_BF16 &&
             zsi_autocast_route(&zsi_def_matmul, ZS_CPU, ZS_F8E4M3) == ZS_BF16 &&
             zsi_autocast_route(&zsi_def_linear, ZS_CPU, ZS_F8E4M3) == ZS_F8E4M3 &&
             zsi_autocast_route(&zsi_def_attention, ZS_CPU, ZS_F8E4M3) == ZS_BF16,
             "fp8: matmul and attention through the bf16 path (%s), the linears to "
             "linear_fp8", f8 ? zs_dtype_name(f8->dtype) : "NULL");
    ZT_CHECK(zs_autocast_push(ZS_F16) == ZS_OK, "push f16");
    zs_tensor *h = zs_matmul(a, b);
    ZT_CHECK(h && h->dtype == lowp_dtype(&zsi_def_matmul, ZS_F16),
             "f16: %s (f16 where a kernel exists, else f32)", h ? zs_dtype_name(h->dtype) : "NULL");
    for (int i = 0; i < 3; i++)
        zs_autocast_pop();
    ZT_CHECK(zs_autocast_dtype() == ZS_BF16, "pops back to bf16");
    zs_autocast_pop();
    zs_tensor *after = zs_matmul(a, b);
    ZT_CHECK(zs_autocast_dtype() == ZS_F32 && after && after->dtype == ZS_F32,
             "after the last pop: off");
    zs_scope_pop();
    zt_section("every class's result dtype as the table (and the kernel table) says");
}

/* max |bf16 matmul - f64 of the bf16-rounded inputs| */
static void test_values(void)
{
    zs_scope_push();
    int64_t M = 37, K = 129, N = 19;
    zs_tensor *a = zt_rand_strided(ZS_F32, ZS_SHAPE(M, K), 21), *b = zt_rand(ZS_F32, ZS_SHAPE(K, N), 22);
    zs_autocast_push(ZS_BF16);
    zs_tensor *c = zs_matmul(a, b);
    zs_autocast_pop();
    zs_tensor *a16 = zs_to_dtype(a, ZS_BF16), *b16 = zs_to_dtype(b, ZS_BF16);
    double *ra = zt_values(a16), *rb = zt_values(b16), *ref = malloc(sizeof *ref * M * N);
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            double s = 0;
            for (int64_t p = 0; p < K; p++)
                s += ra[i * K + p] * rb[p * N + j];
            ref[i * N + j] = s;
        }
    /* f32 accumulation then one rounding to bf16: 2^-8 relative */
    double err = c ? zt_max_err(c, ref, M * N) : 1e9;
    ZT_CHECK(c && c->dtype == ZS_BF16 && err < 8e-3, "bf16 matmul [%lld,%lld]x[%lld,%lld]: "
             "error %.3g (seed 21/22)", (long long)M, (long long)K, (long long)K,
             (long long)N, err);
    free(ra);
    free(rb);
    free(ref);
    zs_scope_pop();
    zt_section("bf16 product against float64 of the rounded inputs");
}

/* Gradients of sum(linear(x, w, b)) reach f32 w and b in f32: dw[n][k] =
 * sum_m x[m][k] (the rounded x), db = M. */
static void test_gradients(void)
{
    zs_scope_push();
    int64_t M = 6, K = 11, N = 5;
    zs_tensor *x = zt_rand(ZS_F32, ZS_SHAPE(M, K), 31), *w = zt_rand(ZS_F32, ZS_SHAPE(N, K), 32);
    zs_tensor *b = zt_rand(ZS_F32, ZS_SHAPE(N), 33), *lw = zt_rand(ZS_F32, ZS_SHAPE(N), 34);
    zs_set_requires_grad(w, true);
    zs_set_requires_grad(b, true);
    zs_set_requires_grad(lw, true);
    zs_autocast_push(ZS_BF16);
    zs_tensor *y = zs_linear(x, w, b);
    zs_tensor *n = zs_layer_norm(y, lw, NULL, 1e-5);
    zs_tensor *l = zs_sum(zs_mul(n, n), 0, NULL, false);
    zs_tensor *l2 = zs_sum(y, 0, NULL, false);
    zs_autocast_pop();
    zs_tensor *tot = zs_add(zs_mul_scalar(l, 0), l2); /* y's path and the norm's */
    ZT_CHECK(tot && zs_backward(tot, NULL, false) == ZS_OK, "backward");
    ZT_CHECK(w->grad && w->grad->dtype == ZS_F32 && b->grad && b->grad->dtype == ZS_F32 &&
             lw->grad && lw->grad->dtype == ZS_F32, "gradients of f32 parameters are f32");
    zs_tensor *x16 = zs_to_dtype(x, ZS_BF16);
    double *rx = zt_values(x16), ref[5 * 11], refb[5];
    for (int64_t j = 0; j < N; j++) {
        refb[j] = (double)M;
        for (int64_t k = 0; k < K; k++) {
            double s = 0;
            for (int64_t m = 0; m < M; m++)
                s += rx[m * K + k];
            ref[j * K + k] = s;
        }
    }
    double ew = w->grad ? zt_max_err(w->grad, ref, N * K) : 1e9;
    double eb = b->grad ? zt_max_err(b->grad, refb, N) : 1e9;
    /* the incoming gradient (ones) is exact in bf16; the sums of M bf16
     * products in f32 rounded once to bf16 (dw is computed in bf16) */
    ZT_CHECK(ew < 2e-2 && eb < 2e-2, "dw error %.3g, db error %.3g (seeds 31-33)", ew, eb);
    free(rx);
    zs_scope_pop();
    zt_section("gradients reach f32 parameters in f32 (values against float64)");
}

/* One conversion per weight per scope; two forwards and two backwards
 * through one cached cast accumulate. */
static void test_cache(void)
{
    zs_scope_push();
    zs_tensor *x = zt_rand(ZS_F32, ZS_SHAPE(3, 8), 41), *w = zt_rand(ZS_F32, ZS_SHAPE(4, 8), 42);
    zs_set_requires_grad(w, true);
    zs_autocast_stats s;
    zs_autocast_reset_stats();
    zs_autocast_push(ZS_BF16);
    for (int i = 0; i < 2; i++) {
        zs_tensor *l = zs_sum(zs_linear(x, w, NULL), 0, NULL, false);
        ZT_CHECK(l && zs_backward(l, NULL, false) == ZS_OK, "backward %d through the cache", i);
    }
    zs_tensor *y3 = zs_linear(x, w, NULL);
    zs_autocast_get_stats(&s);
    ZT_CHECK(s.weight_casts == 1 && s.weight_cast_elems == 32 && s.cache_hits == 2,
             "three uses in one scope: %lld conversions (%lld elements), %lld hits; "
             "expected 1 (32), 2", (long long)s.weight_casts, (long long)s.weight_cast_elems,
             (long long)s.cache_hits);
    zs_autocast_pop();
    zs_autocast_push(ZS_BF16);
    zs_tensor *y4 = zs_linear(x, w, NULL);
    zs_autocast_pop();
    zs_autocast_get_stats(&s);
    ZT_CHECK(s.weight_casts == 2, "a new scope converts again (%lld)", (long long)s.weight_casts);
    double *r4 = y4 ? zt_values(y4) : NULL;
    ZT_CHECK(y3 && r4 && zt_max_err(y3, r4, 12) == 0, "same cast, same bits");
    free(r4);
    /* two backwards: twice the column sums of x (bf16-rounded) */
    double *rx = zt_values(zs_to_dtype(x, ZS_BF16)), ref[32];
    for (int j = 0; j < 4; j++)
        for (int k = 0; k < 8; k++)
            ref[j * 8 + k] = 2 * (rx[k] + rx[8 + k] + rx[16 + k]);
    ZT_CHECK(w->grad && zt_max_err(w->grad, ref, 32) < 2e-2, "accumulated gradient");
    free(rx);
    zs_scope_pop();
    zt_section("weight cast once per scope; backward twice through one cast");
}

/* A flattened model: one pass converts every weight, bits equal to the
 * per-weight cache. */
static void test_flat(void)
{
    zs_scope_push();
    zs_module *m = zs_linear_new(16, 9, true, ZS_INIT_DEFAULT, 51);
    zs_module *m2 = zs_linear_new(16, 9, true, ZS_INIT_DEFAULT, 51);
    zs_tensor *fp = NULL, *fg = NULL;
    ZT_CHECK(zs_module_flatten(m, &fp, &fg) == ZS_OK, "flatten");
    zs_tensor *x = zt_rand(ZS_F32, ZS_SHAPE(5, 16), 52);
    zs_autocast_stats s;
    zs_autocast_reset_stats();
    zs_autocast_push(ZS_BF16);
    ZT_CHECK(zs_autocast_cache_flat(fp, NULL) == ZS_OK, "cache_flat");
    zs_tensor *y = zs_module_forward(m, x);
    zs_tensor *l = zs_sum(y, 0, NULL, false);
    zs_autocast_pop();
    zs_autocast_get_stats(&s);
    ZT_CHECK(s.weight_casts == 1 && s.weight_cast_elems == zs_numel(fp) && s.flat_views == 2,
             "one pass of %lld elements serves 2 weights: %lld passes, %lld elements, "
             "%lld views", (long long)zs_numel(fp), (long long)s.weight_casts,
             (long long)s.weight_cast_elems, (long long)s.flat_views);
    ZT_CHECK(l && zs_backward(l, NULL, false) == ZS_OK && fg && zs_sum_squares(fg, NULL) &&
             zs_item(zs_sum_squares(fg, NULL)) > 0, "gradients reach the flat f32 buffer");
    ZT_CHECK(fg && fg->dtype == ZS_F32, "flat gradient f32");
    zs_autocast_push(ZS_BF16);
    zs_tensor *y2 = zs_module_forward(m2, x); /* the per-weight cache */
    zs_autocast_pop();
    double *r2 = y2 ? zt_values(y2) : NULL;
    ZT_CHECK(y && r2 && zt_max_err(y, r2, 45) == 0, "flat views give the cache's bits");
    free(r2);
    /* errors */
    ZT_EXPECT_ERROR(zs_autocast_cache_flat(fp, NULL) != ZS_OK, "autocast is off");
    zs_autocast_push(ZS_BF16);
    zs_tensor *bad = zs_zeros(ZS_BF16, ZS_SHAPE(3));
    ZT_EXPECT_ERROR(zs_autocast_cache_flat(fp, bad) != ZS_OK, "contiguous bf16 tensor of");
    zs_tensor *half = zs_narrow(fp, 0, 0, 10);
    zs_tensor *f64 = zs_zeros(ZS_F64, ZS_SHAPE(10));
    ZT_EXPECT_ERROR(zs_autocast_cache_flat(f64, NULL) != ZS_OK, "expected contiguous f32");
    ZT_CHECK(zs_autocast_cache_flat(half, NULL) == ZS_OK, "a contiguous part is a flat buffer");
    zs_autocast_pop();
    zs_module_free(m);
    zs_module_free(m2);
    zs_scope_pop();
    zt_section("flat buffer: one conversion pass, parameters' casts are views of it");
}

static void test_errors(void)
{
    ZT_EXPECT_ERROR(zs_autocast_push(ZS_I32) != ZS_OK, "not a precision policy");
    ZT_EXPECT_ERROR(zs_autocast_push(ZS_F64) != ZS_OK, "expected bf16, f16, f8e4m3");
    ZT_EXPECT_ERROR(zs_autocast_push(ZS_F8E5M2) != ZS_OK, "f8e5m2");
    ZT_EXPECT_ERROR(zs_autocast_push((zs_dtype)99) != ZS_OK, "not a precision policy");
    ZT_EXPECT_ERROR(zs_autocast_pop() != ZS_OK, "pop without a push");
    int n = 0;
    while (zs_autocast_push(ZS_BF16) == ZS_OK && n < 100)
        n++;
    ZT_CHECK(n == 16 && strstr(zs_last_error(), "nested"), "16 nested scopes at most (%d)", n);
    while (n-- > 0)
        zs_autocast_pop();
    ZT_CHECK(zs_autocast_dtype() == ZS_F32, "all popped");
    /* a bad call under autocast still names the operator */
    zs_scope_push();
    zs_autocast_push(ZS_BF16);
    zs_tensor *a = zt_rand(ZS_F32, ZS_SHAPE(2, 3), 1);
    ZT_EXPECT_ERROR(zs_matmul(a, a) == NULL, "matmul");
    zs_autocast_pop();
    zs_scope_pop();
    zt_section("errors: bad dtypes, pop without push, depth, bad shapes under autocast");
}

/* A forward and backward under bf16 on the test device give the CPU's
 * bits (the casts are driver calls). */
static void test_device(void)
{
    if (zs_test_device_enable() != ZS_OK) {
        ZT_CHECK(0, "test device");
        return;
    }
    zs_scope_push();
    double *got[2][2] = {{0}};
    for (int d = 0; d < 2; d++) {
        int dev = d ? ZS_TEST_DEVICE : ZS_CPU;
        zs_tensor *x = zs_to_device(zt_rand(ZS_F32, ZS_SHAPE(4, 6), 61), dev);
        zs_tensor *w = zs_to_device(zt_rand(ZS_F32, ZS_SHAPE(3, 6), 62), dev);
        zs_set_requires_grad(w, true);
        zs_autocast_push(ZS_BF16);
        zs_tensor *y = zs_linear(x, w, NULL);
        zs_tensor *l = zs_mean(zs_mul(y, y), 0, NULL, false);
        zs_autocast_pop();
        ZT_CHECK(l && zs_backward(l, NULL, false) == ZS_OK && w->grad &&
                 w->grad->dtype == ZS_F32, "%s: backward, f32 gradient", d ? "test" : "cpu");
        if (y && w->grad) {
            got[d][0] = zt_values(zs_to_device(y, ZS_CPU));
            got[d][1] = zt_values(zs_to_device(w->grad, ZS_CPU));
        }
    }
    bool same = got[0][0] && got[1][0] && !memcmp(got[0][0], got[1][0], 12 * sizeof(double)) &&
                !memcmp(got[0][1], got[1][1], 18 * sizeof(double));
    ZT_CHECK(same, "test device: the CPU's bits");
    for (int d = 0; d < 2; d++)
        for (int k = 0; k < 2; k++)
            free(got[d][k]);
    zs_scope_pop();
    zt_section("test device: autocast forward and backward give the CPU's bits");
}

/* max |a - b| over same-sized tensors (1e9 when not). */
static double max_diff(const zs_tensor *a, const zs_tensor *b)
{
    if (!a || !b || zs_numel(a) != zs_numel(b))
        return 1e9;
    double *va = zt_values(a), *vb = zt_values(b), m = 0;
    for (int64_t i = 0; i < zs_numel(a); i++)
        m = fmax(m, fabs(va[i] - vb[i]));
    free(va);
    free(vb);
    return m;
}

/* fp8: zs_linear, zs_linear_gelu and zs_linear_residual with f32 master
 * weights run as zs_linear_fp8 plus their epilogue in f32: bit for bit
 * the composition outside autocast; w's gradient f32 and the fp8 rule's
 * (the same backward as the composition); a bf16 weight (not master
 * weights) takes the bf16 route instead. */
static void test_fp8(void)
{
    zs_scope_push();
    int64_t M = 6, K = 130, N = 9;
    zs_tensor *x = zt_rand(ZS_F32, ZS_SHAPE(2, 3, K), 41);
    zs_tensor *w = zt_rand(ZS_F32, ZS_SHAPE(N, K), 42), *b = zt_rand(ZS_F32, ZS_SHAPE(N), 43);
    zs_tensor *r = zt_rand(ZS_F32, ZS_SHAPE(2, 3, N), 44);
    zs_set_requires_grad(w, true);
    zs_tensor *y8 = zs_linear_fp8(x, w, b);
    zs_tensor *refs[3] = {y8, zs_gelu(y8, ZS_GELU_TANH), zs_add(y8, r)};
    zs_tensor *refr = zs_linear_fp8(x, w, NULL);
    zs_tensor *ref_nobias = zs_add(refr, r);
    ZT_CHECK(zs_backward(zs_sum(refs[1], 0, NULL, false), NULL, false) == ZS_OK, "ref bw");
    zs_tensor *gref = zs_clone(w->grad);
    zs_zero_grad(w, true);
    zs_autocast_reset_stats();
    zs_autocast_push(ZS_F8E4M3);
    zs_tensor *got[3] = {zs_linear(x, w, b), zs_linear_gelu(x, w, b),
                         zs_linear_residual(x, w, b, r)};
    zs_tensor *got_nobias = zs_linear_residual(x, w, NULL, r);
    zs_tensor *w16 = zs_to_dtype(w, ZS_BF16);
    zs_tensor *other = zs_linear(x, w16, NULL); /* not master weights */
    zs_autocast_pop();
    zs_autocast_stats st;
    zs_autocast_get_stats(&st);
    const char *names[3] = {"linear", "linear_gelu", "linear_residual"};
    for (int i = 0; i < 3; i++)
        ZT_CHECK(got[i] && got[i]->dtype == ZS_F32 && max_diff(got[i], refs[i]) == 0,
                 "fp8 %s = linear_fp8 + epilogue exactly (diff %g)", names[i],
                 got[i] ? max_diff(got[i], refs[i]) : 1e9);
    ZT_CHECK(got_nobias && max_diff(got_nobias, ref_nobias) == 0,
             "fp8 linear_residual without a bias");
    ZT_CHECK(st.fp8_linears == 4, "4 linears routed to linear_fp8 (%lld)",
             (long long)st.fp8_linears);
    ZT_CHECK(other && other->dtype == ZS_BF16, "a bf16 weight: the bf16 route (%s)",
             other ? zs_dtype_name(other->dtype) : "NULL");
    ZT_CHECK(got[1] && zs_backward(zs_sum(got[1], 0, NULL, false), NULL, false) == ZS_OK &&
             w->grad && w->grad->dtype == ZS_F32 && max_diff(w->grad, gref) == 0,
             "fp8 linear_gelu backward: w's gradient f32, the fp8 rule's (e5m2)");
    (void)M;
    zs_scope_pop();
    zt_section("fp8 autocast: the linears run as linear_fp8, epilogue in f32");
}

int main(void)
{
    int64_t live = zt_live_bytes();
    test_classes();
    test_values();
    test_gradients();
    test_cache();
    test_flat();
    test_errors();
    test_device();
    test_fp8();
    ZT_CHECK(zt_live_bytes() == live, "no leak: %lld bytes live, %lld at start",
             (long long)zt_live_bytes(), (long long)live);
    return zt_done();
}
