/*
 * test_fp8.c - the FP8 operators of ops/fp8.c: fp8_quantize,
 * fp8_dequantize, fp8_gemm and zs_linear_fp8 (forward and backward).
 *
 * References: the quantizer itself is checked bit-exactly against a naive
 * float64 one in tests/kernels/test_fp8_kernels.c; here the operators are
 * checked against float64 of the same quantized math, built from that
 * kernel: y = deq(xq) deq(wq)^T + b, dx = deq(gq) deq(wq) with g in e5m2
 * 1x128 tiles along N, dw = deq(gq') deq(xq')^T with g^T and the
 * dequantized x^T re-tiled along M (built here by explicit transposes; the
 * operator quantizes in 128x1 tiles without them), db = column sums of g. Tolerance
 * 1e-5 * sum |terms| (the products are exact; only f32 accumulation and
 * the scale multiplications round), plus bf16 rounding for a bf16 dx.
 * Against the unquantized f32 math the relative error (Frobenius) must
 * stay below 2^-4 for y (e4m3: 3 mantissa bits; measured about 0.03) and
 * below 2^-3 for dx and dw (an e5m2 operand: 2 bits; measured about
 * 0.06). The test device must give the CPU's bits. Error paths: bad
 * dtypes, shapes, block sizes and scales.
 */
#include <stdlib.h>

#include "kernels/cpu/fp8.h"
#include "ops/op.h"
#include "testutil.h"

static float *fvals(const zs_tensor *t)
{
    int64_t n = zs_numel(t);
    double *d = zt_values(t);
    float *f = malloc((size_t)(n ? n : 1) * sizeof *f);
    for (int64_t i = 0; i < n; i++)
        f[i] = (float)d[i];
    free(d);
    return f;
}

/* A quantized [R, C] matrix (tiles of br x 128) with dequantized values. */
typedef struct qmat {
    int64_t R, C, br, KB;
    uint8_t *q;
    float *s;
    zsk_fp8_fmt f;
} qmat;

static qmat qmake(zsk_fp8_fmt f, const float *x, int64_t R, int64_t C,
                  int64_t br)
{
    qmat m = {R, C, br, zsk_fp8_groups(C, 128), malloc((size_t)(R * C + 1)),
              NULL, f};
    m.s = malloc((size_t)(zsk_fp8_groups(R, br) * m.KB + 1) * sizeof(float));
    zsk_fp8_quantize(f, false, x, R, C, C, 1, br, m.q, m.s);
    return m;
}

/* The dequantized value, in float as the kernel computes it. */
static float qval(const qmat *m, int64_t r, int64_t c)
{
    return zsk_fp8_to_f32(m->f, m->q[r * m->C + c]) *
           m->s[(r / m->br) * m->KB + c / 128];
}

static void qfree(qmat *m)
{
    free(m->q);
    free(m->s);
}

/* Counts elements of got [n] outside tol * mag + rel * |ref|. */
static int64_t compare(const float *got, const double *ref, const double *mag,
                       int64_t n, double rel, const char *what)
{
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++)
        if (!(fabs(got[i] - ref[i]) <= 1e-5 * mag[i] + rel * fabs(ref[i]) + 1e-30) &&
            bad++ < 3)
            fprintf(stderr, "  %s[%lld] = %.9g, expected %.9g (mag %g)\n", what,
                    (long long)i, got[i], ref[i], mag[i]);
    return bad;
}

/* ||a - b|| / ||b|| over n. */
static double rel_err(const float *a, const double *b, int64_t n)
{
    double e = 0, r = 0;
    for (int64_t i = 0; i < n; i++) {
        e += (a[i] - b[i]) * (a[i] - b[i]);
        r += b[i] * b[i];
    }
    return sqrt(e / (r > 0 ? r : 1));
}

/* ---- linear_fp8 ---------------------------------------------------------------- */

typedef struct lcase {
    int64_t B, T, N, K;
    bool bias, bf16x;
} lcase;

static void test_linear_case(const lcase *c, uint64_t seed)
{
    zs_scope_push();
    int64_t M = c->B * c->T, N = c->N, K = c->K;
    zs_tensor *x = zt_rand(c->bf16x ? ZS_BF16 : ZS_F32, 3,
                           (int64_t[]){c->B, c->T, K}, seed);
    zs_tensor *w = zt_rand(ZS_F32, 2, (int64_t[]){N, K}, seed + 1);
    zs_tensor *b = c->bias ? zt_rand(ZS_F32, 1, (int64_t[]){N}, seed + 2) : NULL;
    zs_tensor *G = zt_rand(ZS_F32, 3, (int64_t[]){c->B, c->T, N}, seed + 3);
    zs_set_requires_grad(x, true);
    zs_set_requires_grad(w, true);
    if (b)
        zs_set_requires_grad(b, true);
    zs_tensor *y = zs_linear_fp8(x, w, b);
    char what[160];
    snprintf(what, sizeof what, "linear_fp8 x [%lld, %lld, %lld] %s w [%lld, %lld]%s "
             "seed %llu", (long long)c->B, (long long)c->T, (long long)K,
             c->bf16x ? "bf16" : "f32", (long long)N, (long long)K,
             c->bias ? " + b" : "", (unsigned long long)seed);
    ZT_CHECK(zt_shape_is(y, 3, (int64_t[]){c->B, c->T, N}) && y->dtype == ZS_F32,
             "%s: output shape/dtype\n", what);
    if (!y) {
        zs_scope_pop();
        return;
    }
    ZT_CHECK(y->node && zsi_ctx_of(y)->saved[0]->dtype == ZS_F8E4M3 &&
                 zs_numel(zsi_ctx_of(y)->saved[0]) == M * K,
             "%s: backward keeps the e4m3 x\n", what);
    float *xf = fvals(x), *wf = fvals(w), *bf = b ? fvals(b) : NULL;
    float *yf = fvals(y), *gf = fvals(G);
    qmat xq = qmake(ZSK_FP8_E4M3, xf, M, K, 1), wq = qmake(ZSK_FP8_E4M3, wf, N, K, 128);

    /* forward */
    double *ref = malloc((size_t)(M * N) * sizeof *ref);
    double *mag = malloc((size_t)(M * N) * sizeof *mag);
    double *exact = malloc((size_t)(M * N) * sizeof *exact);
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            double s = bf ? bf[n] : 0, a = fabs(s), e = 0;
            for (int64_t k = 0; k < K; k++) {
                double p = (double)qval(&xq, m, k) * qval(&wq, n, k);
                s += p;
                a += fabs(p);
                e += (double)xf[m * K + k] * wf[n * K + k];
            }
            ref[m * N + n] = s;
            mag[m * N + n] = a;
            exact[m * N + n] = e;
        }
    ZT_CHECK(compare(yf, ref, mag, M * N, 0, "y") == 0, "%s: forward\n", what);
    float *prod = malloc((size_t)(M * N) * sizeof *prod);
    for (int64_t i = 0; i < M * N; i++)
        prod[i] = yf[i] - (bf ? bf[i % N] : 0.0f);
    double ey = rel_err(prod, exact, M * N);
    ZT_CHECK(ey < 0x1p-4, "%s: relative error of y against f32 %.4f\n", what, ey);

    /* backward */
    ZT_CHECK(zs_backward(y, G, false) == ZS_OK, "%s: backward\n", what);
    zs_tensor *gx = zs_grad(x), *gw = zs_grad(w), *gb = b ? zs_grad(b) : NULL;
    ZT_CHECK(gx && gx->dtype == x->dtype && zt_shape_is(gx, 3, x->shape) && gw &&
                 gw->dtype == ZS_F32 && zt_shape_is(gw, 2, w->shape) &&
                 (!b || (gb && zt_shape_is(gb, 1, b->shape))),
             "%s: gradient dtypes and shapes\n", what);
    if (gx && gw && (!b || gb)) {
        float *gxf = fvals(gx), *gwf = fvals(gw);
        qmat gq = qmake(ZSK_FP8_E5M2, gf, M, N, 1);
        double *dx = calloc((size_t)(M * K), sizeof *dx), *dxm = calloc((size_t)(M * K), sizeof *dx);
        double *dxe = calloc((size_t)(M * K), sizeof *dx);
        for (int64_t m = 0; m < M; m++)
            for (int64_t n = 0; n < N; n++)
                for (int64_t k = 0; k < K; k++) {
                    double p = (double)qval(&gq, m, n) * qval(&wq, n, k);
                    dx[m * K + k] += p;
                    dxm[m * K + k] += fabs(p);
                    dxe[m * K + k] += (double)gf[m * N + n] * wf[n * K + k];
                }
        ZT_CHECK(compare(gxf, dx, dxm, M * K, c->bf16x ? 0x1p-8 : 0, "dx") == 0,
                 "%s: dx against the same quantized math\n", what);
        double ex = rel_err(gxf, dxe, M * K);
        ZT_CHECK(ex < 0x1p-3, "%s: relative error of dx against f32 %.4f\n", what, ex);
        /* dw: g^T and the dequantized x^T re-tiled along M */
        float *gt = malloc((size_t)(N * M) * sizeof *gt), *xt = malloc((size_t)(K * M) * sizeof *xt);
        for (int64_t m = 0; m < M; m++) {
            for (int64_t n = 0; n < N; n++)
                gt[n * M + m] = gf[m * N + n];
            for (int64_t k = 0; k < K; k++)
                xt[k * M + m] = qval(&xq, m, k);
        }
        qmat gtq = qmake(ZSK_FP8_E5M2, gt, N, M, 1), xtq = qmake(ZSK_FP8_E4M3, xt, K, M, 1);
        double *dw = calloc((size_t)(N * K), sizeof *dw), *dwm = calloc((size_t)(N * K), sizeof *dw);
        double *dwe = calloc((size_t)(N * K), sizeof *dw);
        for (int64_t n = 0; n < N; n++)
            for (int64_t k = 0; k < K; k++)
                for (int64_t m = 0; m < M; m++) {
                    double p = (double)qval(&gtq, n, m) * qval(&xtq, k, m);
                    dw[n * K + k] += p;
                    dwm[n * K + k] += fabs(p);
                    dwe[n * K + k] += (double)gf[m * N + n] * xf[m * K + k];
                }
        ZT_CHECK(compare(gwf, dw, dwm, N * K, 0, "dw") == 0,
                 "%s: dw against the same quantized math\n", what);
        double ew = rel_err(gwf, dwe, N * K);
        ZT_CHECK(ew < 0x1p-3, "%s: relative error of dw against f32 %.4f\n", what, ew);
        if (gb) {
            float *gbf = fvals(gb);
            double *db = calloc((size_t)N, sizeof *db), *dbm = calloc((size_t)N, sizeof *db);
            for (int64_t m = 0; m < M; m++)
                for (int64_t n = 0; n < N; n++) {
                    db[n] += gf[m * N + n];
                    dbm[n] += fabs(gf[m * N + n]);
                }
            ZT_CHECK(compare(gbf, db, dbm, N, 0, "db") == 0, "%s: db\n", what);
            free(gbf);
            free(db);
            free(dbm);
        }
        printf("  %s: rel. error vs f32: y %.4f dx %.4f dw %.4f\n", what, ey, ex, ew);
        qfree(&gq);
        qfree(&gtq);
        qfree(&xtq);
        free(gxf);
        free(gwf);
        free(dx);
        free(dxm);
        free(dxe);
        free(gt);
        free(xt);
        free(dw);
        free(dwm);
        free(dwe);
    }
    qfree(&xq);
    qfree(&wq);
    free(xf);
    free(wf);
    free(bf);
    free(yf);
    free(gf);
    free(ref);
    free(mag);
    free(exact);
    free(prod);
    zs_scope_pop();
}

static void test_linear(void)
{
    static const lcase cases[] = {
        {1, 1, 5, 7, true, false},
        {2, 3, 130, 200, true, false},
        {3, 5, 64, 128, false, true},
        {4, 70, 257, 300, true, false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        test_linear_case(&cases[i], 100 + 10 * i);
    zt_section("linear_fp8: forward and backward against float64 of the same "
               "quantized math and against f32");
}

/* bf16 x gives the f32 forward of the same values bit for bit. */
static void test_bf16_input(void)
{
    zs_scope_push();
    zs_tensor *xb = zt_rand(ZS_BF16, 2, (int64_t[]){9, 150}, 7);
    zs_tensor *xf = zs_to_dtype(xb, ZS_F32);
    zs_tensor *w = zt_rand(ZS_F32, 2, (int64_t[]){33, 150}, 8);
    zs_tensor *yb = zs_linear_fp8(xb, w, NULL), *yf = zs_linear_fp8(xf, w, NULL);
    float *a = yb ? fvals(yb) : NULL, *b = yf ? fvals(yf) : NULL;
    ZT_CHECK(a && b && !memcmp(a, b, 9 * 33 * sizeof(float)),
             "linear_fp8: bf16 and f32 inputs of equal values differ\n");
    free(a);
    free(b);
    zs_scope_pop();
    zt_section("linear_fp8: bf16 input");
}

/* The forward and backward on the test device give the CPU's bits. */
static void test_device(void)
{
    ZT_CHECK(zs_test_device_enable() == ZS_OK, "test device\n");
    zs_scope_push();
    zs_tensor *x = zt_rand(ZS_F32, 2, (int64_t[]){37, 260}, 21);
    zs_tensor *w = zt_rand(ZS_F32, 2, (int64_t[]){140, 260}, 22);
    zs_tensor *b = zt_rand(ZS_F32, 1, (int64_t[]){140}, 23);
    zs_tensor *G = zt_rand(ZS_F32, 2, (int64_t[]){37, 140}, 24);
    zs_tensor *dx = zs_to_device(x, ZS_TEST_DEVICE), *dw = zs_to_device(w, ZS_TEST_DEVICE);
    zs_tensor *db = zs_to_device(b, ZS_TEST_DEVICE), *dG = zs_to_device(G, ZS_TEST_DEVICE);
    zs_tensor *in[2][3] = {{x, w, b}, {dx, dw, db}};
    float *res[2][4] = {{0}};
    zs_test_device_reset_calls();
    for (int d = 0; d < 2; d++) {
        for (int i = 0; i < 3; i++)
            zs_set_requires_grad(in[d][i], true);
        zs_tensor *y = zs_linear_fp8(in[d][0], in[d][1], in[d][2]);
        ZT_CHECK(y && zs_backward(y, d ? dG : G, false) == ZS_OK,
                 "linear_fp8 on %s\n", d ? "test" : "cpu");
        zs_tensor *outs[4] = {y, zs_grad(in[d][0]), zs_grad(in[d][1]), zs_grad(in[d][2])};
        for (int k = 0; k < 4; k++) {
            zs_tensor *h = outs[k] ? zs_to_device(outs[k], ZS_CPU) : NULL;
            res[d][k] = h ? fvals(h) : NULL;
        }
    }
    int64_t n[4] = {37 * 140, 37 * 260, 140 * 260, 140};
    for (int k = 0; k < 4; k++)
        ZT_CHECK(res[0][k] && res[1][k] &&
                     !memcmp(res[0][k], res[1][k], (size_t)n[k] * sizeof(float)),
                 "linear_fp8: result %d differs on the test device\n", k);
    ZT_CHECK(zs_test_device_calls("fp8_gemm") == 2 &&
                 zs_test_device_calls("fp8_quantize") == 3 &&
                 zs_test_device_calls("linear_fp8") == 1,
             "test device calls: gemm %lld quantize %lld linear %lld\n",
             (long long)zs_test_device_calls("fp8_gemm"),
             (long long)zs_test_device_calls("fp8_quantize"),
             (long long)zs_test_device_calls("linear_fp8"));
    for (int d = 0; d < 2; d++)
        for (int k = 0; k < 4; k++)
            free(res[d][k]);
    zs_scope_pop();
    zt_section("linear_fp8: the test device gives the CPU's bits");
}

/* ---- quantize / dequantize / gemm descriptors ---------------------------------- */

static void test_quantize_ops(void)
{
    zs_scope_push();
    /* a transposed view quantizes as its contiguous copy */
    zs_tensor *x = zt_rand(ZS_F32, 2, (int64_t[]){300, 45}, 31);
    zs_tensor *xt = zs_transpose(x, 0, 1), *xc = zs_contiguous(xt);
    zs_tensor *q1, *s1, *q2, *s2;
    ZT_CHECK(zs_fp8_quantize(xt, ZS_F8E5M2, 1, &q1, &s1) == ZS_OK &&
                 zs_fp8_quantize(xc, ZS_F8E5M2, 1, &q2, &s2) == ZS_OK,
             "fp8_quantize\n");
    ZT_CHECK(q1 && q1->dtype == ZS_F8E5M2 && zt_shape_is(q1, 2, (int64_t[]){45, 300}) &&
                 zt_shape_is(s1, 2, (int64_t[]){45, 3}) && s1->dtype == ZS_F32,
             "fp8_quantize: result shapes\n");
    if (q1 && q2)
        ZT_CHECK(!memcmp(zs_data(q1), zs_data(q2), 45 * 300) &&
                     !memcmp(zs_data(s1), zs_data(s2), 45 * 3 * sizeof(float)),
                 "fp8_quantize: a transposed view differs from its copy\n");
    /* blocks, and the dequantized values are q * s */
    zs_tensor *q3, *s3;
    zs_tensor *x3 = zt_rand(ZS_F32, 3, (int64_t[]){2, 3, 130}, 32);
    ZT_CHECK(zs_fp8_quantize(x, ZS_F8E4M3, 128, &q3, &s3) == ZS_OK &&
                 zt_shape_is(s3, 2, (int64_t[]){3, 1}),
             "fp8_quantize: 128x128 block scales [3, 1]\n");
    zs_tensor *d3 = zs_fp8_dequantize(q3, s3, 128);
    if (d3) {
        const uint8_t *q = zs_data(q3);
        const float *s = zs_data(s3), *d = zs_data(d3);
        int64_t bad = 0;
        for (int64_t r = 0; r < 300; r++)
            for (int64_t c = 0; c < 45; c++)
                bad += d[r * 45 + c] != zsk_fp8_to_f32(ZSK_FP8_E4M3, q[r * 45 + c]) * s[r / 128];
        ZT_CHECK(bad == 0, "fp8_dequantize: %lld values differ from q * s\n", (long long)bad);
    }
    zs_tensor *q4, *s4;
    ZT_CHECK(zs_fp8_quantize(x3, ZS_F8E4M3, 1, &q4, &s4) == ZS_OK &&
                 zt_shape_is(s4, 3, (int64_t[]){2, 3, 2}),
             "fp8_quantize: 3-D tiles, scales [2, 3, 2]\n");
    zs_tensor *all[] = {q1, s1, q2, s2, q3, s3, q4, s4};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        zs_release(all[i]);
    zs_scope_pop();
    zt_section("fp8_quantize / fp8_dequantize: views, shapes, q * s");
}

static void expect_gemm_error(zs_tensor *a, zs_tensor *sa, zs_tensor *b,
                              zs_tensor *sb, int64_t b_rows, int64_t b_trans,
                              const char *needle)
{
    int64_t at[4] = {b_rows, b_trans, -1, 0};
    zs_tensor *r = zsi_run(&zsi_def_fp8_gemm, 4, (zs_tensor *[]){a, sa, b, sb}, at);
    ZT_EXPECT_ERROR(r == NULL, needle);
    zs_release(r);
}

static void test_errors(void)
{
    zs_scope_push();
    zs_tensor *x = zt_rand(ZS_F32, 2, (int64_t[]){4, 10}, 1);
    zs_tensor *x64 = zt_rand(ZS_F64, 2, (int64_t[]){4, 10}, 1);
    zs_tensor *w = zt_rand(ZS_F32, 2, (int64_t[]){6, 10}, 2);
    zs_tensor *wb = zt_rand(ZS_BF16, 2, (int64_t[]){6, 10}, 2);
    zs_tensor *w9 = zt_rand(ZS_F32, 2, (int64_t[]){6, 9}, 2);
    zs_tensor *b5 = zt_rand(ZS_F32, 1, (int64_t[]){5}, 3);
    zs_tensor *xi = zs_zeros(ZS_I32, 2, (int64_t[]){4, 10});
    zs_tensor *x3 = zt_rand(ZS_F32, 3, (int64_t[]){2, 4, 10}, 4);
    ZT_EXPECT_ERROR(zs_linear_fp8(x64, w, NULL) == NULL, "linear_fp8: input dtype f64");
    ZT_EXPECT_ERROR(zs_linear_fp8(x, wb, NULL) == NULL, "linear_fp8: weight bf16");
    ZT_EXPECT_ERROR(zs_linear_fp8(x, w9, NULL) == NULL, "do not match");
    ZT_EXPECT_ERROR(zs_linear_fp8(x, w, b5) == NULL, "bias [5]");
    zs_tensor *q = NULL, *s = NULL;
    ZT_EXPECT_ERROR(zs_fp8_quantize(xi, ZS_F8E4M3, 1, &q, &s) < 0 && !q && !s,
                    "fp8_quantize: input dtype i32");
    ZT_EXPECT_ERROR(zs_fp8_quantize(x, ZS_BF16, 1, &q, &s) < 0, "format bf16");
    ZT_EXPECT_ERROR(zs_fp8_quantize(x, ZS_F8E4M3, 0, &q, &s) < 0, "block_rows 0");
    ZT_EXPECT_ERROR(zs_fp8_quantize(x3, ZS_F8E4M3, 128, &q, &s) < 0, "[R, C]");
    zs_tensor *qa, *sa, *qb, *sb;
    zs_fp8_quantize(x, ZS_F8E4M3, 1, &qa, &sa);
    zs_fp8_quantize(w, ZS_F8E4M3, 128, &qb, &sb);
    ZT_EXPECT_ERROR(zs_fp8_dequantize(qa, sb, 1) == NULL, "fp8_dequantize: scales");
    ZT_EXPECT_ERROR(zs_fp8_dequantize(x, sa, 1) == NULL, "input dtype f32");
    expect_gemm_error(qa, sa, qb, sa, 128, 0, "scales of b");
    expect_gemm_error(qa, sa, qb, sb, 64, 0, "b_rows 64");
    expect_gemm_error(qa, sa, qb, sb, 1, 1, "(transposed) do not match");
    expect_gemm_error(qa, sa, qb, sb, 128, 1, "do not match");
    expect_gemm_error(x, sa, qb, sb, 128, 0, "expected f8e4m3 or f8e5m2");
    zs_tensor *ok = zsi_run(&zsi_def_fp8_gemm, 4, (zs_tensor *[]){qa, sa, qb, sb},
                            (int64_t[]){128, 0, -1, 0});
    ZT_CHECK(zt_shape_is(ok, 2, (int64_t[]){4, 6}), "fp8_gemm: [4, 6]\n");
    zs_tensor *all[] = {qa, sa, qb, sb, ok};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        zs_release(all[i]);
    zs_scope_pop();
    zt_section("errors: dtypes, shapes, block sizes, scales");
}

int main(void)
{
    int64_t live = zt_live_bytes();
    test_linear();
    test_bf16_input();
    test_quantize_ops();
    test_errors();
    test_device();
    ZT_CHECK(zt_live_bytes() == live, "leak: %lld bytes\n",
             (long long)(zt_live_bytes() - live));
    return zt_done();
}
