/*
 * test_lowp_more.c - the bf16 and f16 kernels added after test_lowp_ops.c:
 * max, argmax, var, max_pool2d, avg_pool2d, batch_norm (forward and
 * backward each), the f16 pointwise operators (add, sub, mul, div, the
 * scalar forms, unary ones and their backward), matmul and the linears in
 * f16 (F16 GEMM), layer_norm_rows and embedding_rows in bf16 / f16.
 *
 * Reference: the same operator in float64 on the same rounded inputs (the
 * values the 16-bit tensors hold; the f64 kernels are checked against
 * formulas in their own tests), forward and gradients (backward with the
 * same rounded incoming gradient). Errors: max |got - ref| / max |ref|.
 * Tolerances: a result rounded once errs by 2^-8 (bf16) / 2^-11 (f16) of
 * its magnitude; forward results are allowed 2^-7 / 2^-10. Gradients go
 * through a few rounded steps (the backward rules' operators in the low
 * dtype: pointwise products, the GEMMs' rounded results, batch norm's f32
 * result rounded to x's dtype): 4 times that, 2^-5 / 2^-8. argmax and the
 * max and max-pool values are exact. Odd sizes, strided views, broadcasting.
 */
#include <stdlib.h>
#include <string.h>

#include "ops/infer_ops.h"
#include "ops/op.h"
#include "testutil.h"

static const zs_dtype LOWP[2] = {ZS_BF16, ZS_F16};

static double tol_fw(zs_dtype dt) { return dt == ZS_BF16 ? 0x1p-7 : 0x1p-10; }
static double tol_bw(zs_dtype dt) { return dt == ZS_BF16 ? 0x1p-5 : 0x1p-8; }

/* max |a - b| / max |b| over same-sized tensors (INFINITY if not). */
static double rel_diff(const zs_tensor *a, const zs_tensor *b)
{
    if (!a || !b || zs_numel(a) != zs_numel(b))
        return INFINITY;
    double *va = zt_values(a), *vb = zt_values(b), num = 0, den = 0;
    for (int64_t i = 0; i < zs_numel(a); i++) {
        num = fmax(num, fabs(va[i] - vb[i]));
        den = fmax(den, fabs(vb[i]));
    }
    free(va);
    free(vb);
    return den > 0 ? num / den : num;
}

/* Uniform [-s, s) values of dt; strided: every other element of a wider
 * buffer. */
static zs_tensor *rand_lo(zs_dtype dt, int ndim, const int64_t *shape, double s,
                          uint64_t seed, bool strided)
{
    zs_tensor *f = zs_uniform(ZS_F32, ndim, shape, -s, s, seed);
    zs_tensor *lo = zs_to_dtype(f, dt);
    if (!strided)
        return lo;
    int64_t wide[ZS_MAX_DIMS];
    memcpy(wide, shape, (size_t)ndim * sizeof *wide);
    wide[ndim - 1] *= 2;
    zs_tensor *buf = zs_zeros(dt, ndim, wide);
    zs_tensor *v = zs_slice(buf, ndim - 1, 0, wide[ndim - 1], 2);
    zs_copy_(v, lo);
    return v;
}

/* An operator under test: out = f(in[0..n)); ctx: its parameters. */
typedef zs_tensor *(*op_fn)(zs_tensor **in, const void *ctx);

typedef struct op_case {
    const char *name;
    op_fn f;
    const void *ctx;
    int n;
    int ndim[3];
    int64_t shape[3][4];
    bool grad[3];   /* inputs that get a gradient */
    bool exact;     /* the forward result is exact (max) */
} op_case;

/* Runs c in dt and in f64 on the same rounded inputs; returns the worst
 * forward and gradient errors in *fw, *bw and checks them. */
static void run_case(const op_case *c, zs_dtype dt, uint64_t seed, bool strided,
                     double *fw, double *bw)
{
    zs_scope_push();
    zs_tensor *lo[3], *hi[3];
    for (int i = 0; i < c->n; i++) {
        lo[i] = rand_lo(dt, c->ndim[i], c->shape[i], 1.5, seed + (uint64_t)i, strided);
        hi[i] = zs_to_dtype(lo[i], ZS_F64);
        if (c->grad[i] && !strided) {
            zs_set_requires_grad(lo[i], true);
            zs_set_requires_grad(hi[i], true);
        }
    }
    zs_tensor *yl = c->f(lo, c->ctx), *yh = c->f(hi, c->ctx);
    double e = yl && yl->dtype == dt ? rel_diff(yl, yh) : INFINITY;
    ZT_CHECK(e <= (c->exact ? 0 : tol_fw(dt)), "%s %s%s forward: rel err %.3g (seed %llu, %s)",
             c->name, zs_dtype_name(dt), strided ? " strided" : "", e,
             (unsigned long long)seed, yl ? zs_dtype_name(yl->dtype) : zs_last_error());
    *fw = fmax(*fw, e);
    if (!strided && yl && yh) {
        zs_tensor *g = rand_lo(dt, yl->ndim, yl->shape, 1.0, seed + 7, false);
        zs_tensor *g64 = zs_to_dtype(g, ZS_F64);
        ZT_CHECK(zs_backward(yl, g, false) == ZS_OK && zs_backward(yh, g64, false) == ZS_OK,
                 "%s %s backward: %s", c->name, zs_dtype_name(dt), zs_last_error());
        for (int i = 0; i < c->n; i++) {
            if (!c->grad[i])
                continue;
            zs_tensor *gl = zs_grad(lo[i]), *gh = zs_grad(hi[i]);
            double eg = gl && gl->dtype == dt ? rel_diff(gl, gh) : INFINITY;
            ZT_CHECK(eg <= tol_bw(dt), "%s %s gradient of input %d: rel err %.3g (%s)",
                     c->name, zs_dtype_name(dt), i, eg,
                     gl ? zs_dtype_name(gl->dtype) : "none");
            *bw = fmax(*bw, eg);
        }
    }
    zs_scope_pop();
}

static void run_cases(const char *what, const op_case *cs, size_t n)
{
    double fw = 0, bw = 0;
    for (size_t k = 0; k < n; k++)
        for (int d = 0; d < 2; d++)
            for (int s = 0; s < 2; s++)
                run_case(&cs[k], LOWP[d], 100 + 10 * k, s == 1, &fw, &bw);
    printf("%s: max rel err forward %.3g, gradients %.3g (vs float64)\n", what, fw, bw);
}

/* ---- reductions ---------------------------------------------------------- */

static zs_tensor *f_max(zs_tensor **in, const void *ctx)
{
    const int *ax = ctx;
    return zs_max(in[0], ax[0], ax + 1, false);
}

static zs_tensor *f_var(zs_tensor **in, const void *ctx)
{
    const int *ax = ctx;
    return zs_var(in[0], ax[0], ax + 1, 1, true);
}

static void test_reductions(void)
{
    static const int one[] = {1, 1}, two[] = {2, 0, 2}, last[] = {1, -1};
    const op_case cs[] = {
        {"max dim 1", f_max, one, 1, {3}, {{5, 37, 3}}, {true}, true},
        {"max dims 0,2", f_max, two, 1, {3}, {{5, 7, 33}}, {true}, true},
        {"var dim -1", f_var, last, 1, {2}, {{6, 41}}, {true}, false},
        {"var dims 0,2", f_var, two, 1, {3}, {{4, 5, 19}}, {true}, false},
    };
    run_cases("bf16/f16 max, var", cs, sizeof cs / sizeof *cs);
    /* argmax: the indices of the f64 run on the same values, exactly */
    int bad = 0;
    for (int d = 0; d < 2; d++) {
        zs_scope_push();
        zs_tensor *x = rand_lo(LOWP[d], ZS_SHAPE(4, 29, 6), 1, 55, true);
        zs_tensor *x64 = zs_to_dtype(x, ZS_F64);
        for (int dim = 0; dim < 3; dim++) {
            zs_tensor *a = zs_argmax(x, dim, false), *b = zs_argmax(x64, dim, false);
            bad += !a || a->dtype != ZS_I64 || rel_diff(a, b) != 0;
        }
        zs_scope_pop();
    }
    ZT_CHECK(bad == 0, "argmax of bf16/f16 = argmax of the same values in f64 (%d "
             "differ)", bad);
    zt_section("bf16/f16 max, argmax, var: forward and backward vs float64");
}

/* ---- pooling ------------------------------------------------------------- */

static zs_tensor *f_maxpool(zs_tensor **in, const void *ctx)
{
    return zs_max_pool2d(in[0], ctx);
}

static zs_tensor *f_avgpool(zs_tensor **in, const void *ctx)
{
    return zs_avg_pool2d(in[0], ctx);
}

static void test_pools(void)
{
    static const zs_pool2d_params p3 = {{3, 3}, {2, 2}, {1, 1}, false};
    static const zs_pool2d_params p2 = {{2, 3}, {0, 0}, {1, 1}, true};
    static const zs_pool2d_params p2x = {{2, 2}, {0, 0}, {0, 0}, false};
    const op_case cs[] = {
        {"max_pool2d 3x3 s2 p1", f_maxpool, &p3, 1, {4}, {{2, 3, 9, 11}}, {true}, true},
        {"avg_pool2d 2x3 p1 incl", f_avgpool, &p2, 1, {4}, {{2, 3, 8, 13}}, {true}, false},
        {"avg_pool2d 2x2", f_avgpool, &p2x, 1, {4}, {{3, 2, 10, 7}}, {true}, false},
    };
    run_cases("bf16/f16 max_pool2d, avg_pool2d", cs, sizeof cs / sizeof *cs);
    zt_section("bf16/f16 pooling: forward and backward vs float64");
}

/* ---- batch norm ---------------------------------------------------------- */

/* training with weight and bias (in[1], in[2]) and f32 running stats */
static zs_tensor *f_bn(zs_tensor **in, const void *ctx)
{
    (void)ctx;
    zs_tensor *rm = zs_zeros(ZS_F32, ZS_SHAPE(in[0]->shape[1]));
    zs_tensor *rv = zs_ones(ZS_F32, ZS_SHAPE(in[0]->shape[1]));
    return zs_batch_norm(in[0], in[1], in[2], rm, rv, true, 0.1, 1e-5);
}

/* inference with running statistics given in the inputs' dtype */
static zs_tensor *f_bn_eval(zs_tensor **in, const void *ctx)
{
    (void)ctx;
    zs_tensor *rm = zs_mul_scalar(in[1], 0.5);
    zs_tensor *rv = zs_add_scalar(zs_mul(in[2], in[2]), 0.5);
    return zs_batch_norm(in[0], in[1], NULL, rm, rv, false, 0.1, 1e-5);
}

static void test_batch_norm(void)
{
    const op_case cs[] = {
        {"batch_norm train", f_bn, NULL, 3, {4, 1, 1}, {{4, 5, 3, 7}, {5}, {5}},
         {true, true, true}, false},
        {"batch_norm [N, C]", f_bn, NULL, 3, {2, 1, 1}, {{9, 6}, {6}, {6}},
         {true, true, true}, false},
        {"batch_norm eval", f_bn_eval, NULL, 3, {3, 1, 1}, {{3, 4, 11}, {4}, {4}},
         {true, false, false}, false},
    };
    run_cases("bf16/f16 batch_norm", cs, sizeof cs / sizeof *cs);
    /* the running statistics (f32) are updated as f64's run updates its */
    zs_scope_push();
    zs_tensor *x = rand_lo(ZS_BF16, ZS_SHAPE(6, 3, 5), 2, 77, false);
    zs_tensor *x64 = zs_to_dtype(x, ZS_F64);
    zs_tensor *rm = zs_zeros(ZS_F32, ZS_SHAPE(3)), *rv = zs_ones(ZS_F32, ZS_SHAPE(3));
    zs_tensor *rm64 = zs_zeros(ZS_F64, ZS_SHAPE(3)), *rv64 = zs_ones(ZS_F64, ZS_SHAPE(3));
    zs_tensor *y = zs_batch_norm(x, NULL, NULL, rm, rv, true, 0.3, 1e-5);
    zs_tensor *y64 = zs_batch_norm(x64, NULL, NULL, rm64, rv64, true, 0.3, 1e-5);
    ZT_CHECK(y && y64 && rel_diff(rm, rm64) < 1e-6 && rel_diff(rv, rv64) < 1e-6,
             "bf16 training updates f32 running stats in place (err %.3g, %.3g)",
             rel_diff(rm, rm64), rel_diff(rv, rv64));
    zs_tensor *w32 = zs_ones(ZS_F32, ZS_SHAPE(3));
    ZT_EXPECT_ERROR(zs_batch_norm(x, w32, NULL, NULL, NULL, true, 0.1, 1e-5) == NULL,
                    "dtypes bf16 and f32 differ");
    zs_scope_pop();
    zt_section("bf16/f16 batch_norm: forward, backward, running stats vs float64");
}

/* ---- f16 pointwise ------------------------------------------------------- */

static zs_tensor *f_add(zs_tensor **in, const void *c) { (void)c; return zs_add(in[0], in[1]); }
static zs_tensor *f_sub(zs_tensor **in, const void *c) { (void)c; return zs_sub(in[0], in[1]); }
static zs_tensor *f_mul(zs_tensor **in, const void *c) { (void)c; return zs_mul(in[0], in[1]); }
static zs_tensor *f_div(zs_tensor **in, const void *c)
{
    (void)c; /* b kept away from 0: 2 + b in [0.5, 3.5) */
    return zs_div(in[0], zs_add_scalar(in[1], 2.0));
}
static zs_tensor *f_scal(zs_tensor **in, const void *c)
{
    (void)c;
    return zs_add_scalar(zs_mul_scalar(in[0], -1.75), 0.5);
}
static zs_tensor *f_exp(zs_tensor **in, const void *c) { (void)c; return zs_exp(in[0]); }
static zs_tensor *f_gelu(zs_tensor **in, const void *c)
{
    (void)c;
    return zs_gelu(in[0], ZS_GELU_TANH);
}
static zs_tensor *f_tanh(zs_tensor **in, const void *c) { (void)c; return zs_tanh(in[0]); }

static void test_pointwise(void)
{
    const op_case cs[] = {
        {"add (broadcast)", f_add, NULL, 2, {3, 2}, {{4, 5, 7}, {5, 7}}, {true, true}, false},
        {"sub", f_sub, NULL, 2, {2, 2}, {{6, 9}, {6, 9}}, {true, true}, false},
        {"mul (broadcast)", f_mul, NULL, 2, {2, 2}, {{6, 9}, {6, 1}}, {true, true}, false},
        {"div", f_div, NULL, 2, {2, 2}, {{5, 11}, {5, 11}}, {true, true}, false},
        {"mul_scalar, add_scalar", f_scal, NULL, 1, {2}, {{7, 13}}, {true}, false},
        {"exp", f_exp, NULL, 1, {1}, {{37}}, {true}, false},
        {"gelu", f_gelu, NULL, 1, {2}, {{3, 17}}, {true}, false},
        {"tanh", f_tanh, NULL, 1, {2}, {{3, 17}}, {true}, false},
    };
    run_cases("bf16/f16 pointwise", cs, sizeof cs / sizeof *cs);
    zt_section("f16 pointwise operators (and bf16 again): forward, backward vs float64");
}

/* ---- f16 products -------------------------------------------------------- */

static zs_tensor *f_matmul(zs_tensor **in, const void *c)
{
    (void)c;
    return zs_matmul(in[0], in[1]);
}
static zs_tensor *f_matmul_t(zs_tensor **in, const void *c)
{
    (void)c;
    return zs_matmul_t(in[0], in[1], true, true);
}
static zs_tensor *f_linear(zs_tensor **in, const void *c)
{
    (void)c;
    return zs_linear(in[0], in[1], in[2]);
}
static zs_tensor *f_linear_gelu(zs_tensor **in, const void *c)
{
    (void)c;
    return zs_linear_gelu(in[0], in[1], in[2]);
}
static zs_tensor *f_linear_res(zs_tensor **in, const void *c)
{
    (void)c;
    return zs_linear_residual(in[0], in[1], NULL, in[2]);
}

static void test_products(void)
{
    const op_case cs[] = {
        {"matmul batched x 2-D", f_matmul, NULL, 2, {3, 2}, {{3, 5, 33}, {33, 7}},
         {true, true}, false},
        {"matmul_t both transposed", f_matmul_t, NULL, 2, {3, 3}, {{2, 19, 6}, {2, 9, 19}},
         {true, true}, false},
        {"linear", f_linear, NULL, 3, {3, 2, 1}, {{2, 3, 37}, {11, 37}, {11}},
         {true, true, true}, false},
        {"linear_gelu", f_linear_gelu, NULL, 3, {2, 2, 1}, {{7, 21}, {13, 21}, {13}},
         {true, true, true}, false},
        {"linear_residual", f_linear_res, NULL, 3, {2, 2, 2}, {{7, 21}, {13, 21}, {7, 13}},
         {true, true, true}, false},
    };
    run_cases("bf16/f16 matmul and linears", cs, sizeof cs / sizeof *cs);
    ZT_CHECK(zsi_def_matmul.kernel[ZS_CPU][ZS_F16] && zsi_def_linear.kernel[ZS_CPU][ZS_F16],
             "matmul and linear have f16 kernels");
    zt_section("f16 matmul and linears (F16 GEMM, f32 accumulation) vs float64");
}

/* ---- inference rows ------------------------------------------------------ */

static void test_rows(void)
{
    enum { N = 5, C = 37, V = 9 };
    int bad = 0;
    double worst = 0;
    for (int d = 0; d < 2; d++) {
        zs_dtype dt = LOWP[d];
        zs_scope_push();
        zs_tensor *x = rand_lo(dt, ZS_SHAPE(N, C), 2, 11, false);
        zs_tensor *w = rand_lo(dt, ZS_SHAPE(C), 1, 12, false);
        zs_tensor *b = rand_lo(dt, ZS_SHAPE(C), 1, 13, false);
        zs_tensor *y = zs_zeros(dt, ZS_SHAPE(N, C));
        zs_tensor *ref = zs_layer_norm(zs_to_dtype(x, ZS_F64), zs_to_dtype(w, ZS_F64),
                                       zs_to_dtype(b, ZS_F64), 1e-5);
        zsi_norm_rows_attrs na = {N, C, 1e-5};
        zs_tensor *r = zsi_run(&zsi_def_layer_norm_rows, 4, (zs_tensor *[]){y, x, w, b}, &na);
        double e = r ? rel_diff(y, ref) : INFINITY;
        worst = fmax(worst, e);
        bad += e > tol_fw(dt);
        zs_release(r);
        /* embedding_rows: table rows + wpe rows */
        zs_tensor *table = rand_lo(dt, ZS_SHAPE(V, C), 1, 14, false);
        zs_tensor *wpe = rand_lo(dt, ZS_SHAPE(8, C), 1, 15, false);
        int32_t meta[2 * N] = {3, 0, 8, 8, 1, /* positions */ 0, 1, 2, 7, 4};
        zs_tensor *mt = zs_from_data(ZS_I32, ZS_SHAPE(2 * N), meta);
        zs_tensor *e_out = zs_zeros(dt, ZS_SHAPE(N, C));
        zsi_embed_attrs ea = {.m = {.n = N, .tok = 0, .pos = N, .len = 2 * N}, .C = C,
                              .V = V, .fmt = ZSI_W_F32, .wpe = 1};
        r = zsi_run(&zsi_def_embedding_rows, 4, (zs_tensor *[]){e_out, mt, table, wpe}, &ea);
        double *tv = zt_values(table), *pv = zt_values(wpe), ref_e[N * C];
        for (int i = 0; i < N; i++)
            for (int k = 0; k < C; k++)
                ref_e[i * C + k] = tv[meta[i] * C + k] + pv[meta[N + i] * C + k];
        double ee = r ? zt_max_err(e_out, ref_e, N * C) : INFINITY;
        worst = fmax(worst, ee);
        bad += ee > 2 * tol_fw(dt);
        free(tv);
        free(pv);
        zs_release(r);
        zs_scope_pop();
    }
    ZT_CHECK(bad == 0, "layer_norm_rows and embedding_rows in bf16/f16: %d off, worst "
             "rel err %.3g", bad, worst);
    zt_section("bf16/f16 layer_norm_rows, embedding_rows vs float64");
}

/* ---- errors -------------------------------------------------------------- */

static void test_errors(void)
{
    zs_scope_push();
    zs_tensor *i = zs_zeros(ZS_I32, ZS_SHAPE(2, 3, 4, 5));
    zs_tensor *b = zs_zeros(ZS_BF16, ZS_SHAPE(2, 3)), *h = zs_zeros(ZS_F16, ZS_SHAPE(2, 3));
    ZT_EXPECT_ERROR(zs_max(i, 0, NULL, false) == NULL, "expected f32, f64, bf16 or f16");
    ZT_EXPECT_ERROR(zs_argmax(i, 0, false) == NULL, "argmax: dtype i32");
    ZT_EXPECT_ERROR(zs_var(i, 0, NULL, 1, false) == NULL, "var: dtype i32");
    zs_pool2d_params p = {{2, 2}, {0, 0}, {0, 0}, false};
    ZT_EXPECT_ERROR(zs_max_pool2d(i, &p) == NULL, "max_pool2d: dtype i32");
    ZT_EXPECT_ERROR(zs_add(b, h) == NULL, "add: dtypes bf16 and f16 differ");
    ZT_EXPECT_ERROR(zs_matmul(b, h) == NULL, "matmul: dtypes bf16 and f16 differ");
    ZT_EXPECT_ERROR(zs_max_pool2d(zs_zeros(ZS_F16, ZS_SHAPE(1, 1, 1, 1)), &p) == NULL,
                    "smaller than kernel");
    zs_scope_pop();
    zt_section("bad dtypes and shapes name the operator");
}

int main(void)
{
    int64_t live = zt_live_bytes();
    test_reductions();
    test_pools();
    test_batch_norm();
    test_pointwise();
    test_products();
    test_rows();
    test_errors();
    ZT_CHECK(zt_live_bytes() == live, "no leak: %lld bytes live, %lld at start",
             (long long)zt_live_bytes(), (long long)live);
    return zt_done();
}
