/*
 * test_linear_bf16.c - the bf16 paths of linear, linear_gelu,
 * linear_residual (the BF16 GEMM with bias, GeLU and residual in its
 * epilogue, the output and the saved pre-activation written in bf16) and
 * of matmul (the epilogue's rounding for one GEMM, the f32 tensor for a
 * batch), forward and backward (the fused linear_gelu_backward), against
 * float64 references computed from the bf16 values the inputs hold;
 * linear_gelu_backward's error paths; and the contiguous bf16 path of the
 * binary operators (the gradient sums of backward).
 *
 * Shapes are odd (K = 29, N = 37, rows 3 x 7), x a strided view, w also a
 * transposed view, the residual a strided view. Tolerances as in
 * test_lowp_ops.c: max |got - ref| / max |ref| over a result against
 * 2^-7 (one bf16 rounding of the result, f32 sums); the backward's
 * gradients go through a second rounding (gh, or the saved bf16 h of
 * GeLU) and are checked against 2^-6. Seeds 11..19.
 */
#include <stdlib.h>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/gemm_lowp.h"
#include "ops/op.h"
#include "testutil.h"

#define B 3
#define T 7
#define K 29
#define N 37

static double rel_err(const zs_tensor *t, const double *ref, int64_t n)
{
    if (!t || zs_numel(t) != n)
        return INFINITY;
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        num = fmax(num, fabs(zs_get(t, i) - ref[i]));
        den = fmax(den, fabs(ref[i]));
    }
    return den > 0 ? num / den : num;
}

static double gelu_d(double v)
{
    const double s = 0.7978845608028654, k = 0.044715;
    return 0.5 * v * (1.0 + tanh(s * (v + k * v * v * v)));
}

static double gelu_grad_d(double v)
{
    const double s = 0.7978845608028654, k = 0.044715;
    double t = tanh(s * (v + k * v * v * v));
    return 0.5 * (1 + t) + 0.5 * v * (1 - t * t) * s * (1 + 3 * k * v * v);
}

/* kind 0 linear, 1 linear_gelu, 2 linear_residual; wt: w as a transposed
 * view of a [K, N] tensor. */
static void check_linear(int kind, bool wt)
{
    const int64_t M = B * T;
    zs_tensor *x = zt_rand_strided(ZS_BF16, ZS_SHAPE(B, T, K), 11);
    zs_tensor *w0 = wt ? zt_rand(ZS_BF16, ZS_SHAPE(K, N), 12)
                       : zt_rand(ZS_BF16, ZS_SHAPE(N, K), 12);
    zs_tensor *w = wt ? zs_transpose(w0, 0, 1) : zs_retain(w0);
    zs_tensor *b = zt_rand(ZS_BF16, ZS_SHAPE(N), 13);
    zs_tensor *r = zt_rand_strided(ZS_BF16, ZS_SHAPE(B, T, N), 14);
    zs_tensor *g = zt_rand(ZS_BF16, ZS_SHAPE(B, T, N), 15);
    zs_tensor *leaves[] = {x, w, b, r};
    for (int i = 0; i < 4; i++)
        zs_set_requires_grad(leaves[i], true);
    zs_tensor *y = kind == 0 ? zs_linear(x, w, b)
                 : kind == 1 ? zs_linear_gelu(x, w, b)
                             : zs_linear_residual(x, w, b, r);
    const char *name = kind == 0 ? "linear" : kind == 1 ? "linear_gelu" : "linear_residual";
    ZT_CHECK(y && y->dtype == ZS_BF16 && zt_shape_is(y, ZS_SHAPE(B, T, N)),
             "%s bf16: output dtype/shape", name);
    double *xv = zt_values(x), *wv = zt_values(w), *bv = zt_values(b);
    double *rv = zt_values(r), *gv = zt_values(g);
    double *h = malloc(M * N * sizeof *h), *out = malloc(M * N * sizeof *out);
    double *gh = malloc(M * N * sizeof *gh), *dx = calloc(M * K, sizeof *dx);
    double *dw = calloc(N * K, sizeof *dw), *db = calloc(N, sizeof *db);
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            double v = bv[j];
            for (int64_t k = 0; k < K; k++)
                v += xv[i * K + k] * wv[j * K + k];
            h[i * N + j] = v;
            out[i * N + j] = kind == 1 ? gelu_d(v) : kind == 2 ? v + rv[i * N + j] : v;
            gh[i * N + j] = gv[i * N + j] * (kind == 1 ? gelu_grad_d(v) : 1.0);
        }
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            db[j] += gh[i * N + j];
            for (int64_t k = 0; k < K; k++) {
                dx[i * K + k] += gh[i * N + j] * wv[j * K + k];
                dw[j * K + k] += gh[i * N + j] * xv[i * K + k];
            }
        }
    double e = rel_err(y, out, M * N);
    ZT_CHECK(e <= 0x1p-7, "%s bf16%s forward: error %.3g > 2^-7 (seeds 11-15)",
             name, wt ? " (w transposed)" : "", e);
    zs_status st = y ? zs_backward(y, g, false) : ZS_ERR_ARG;
    ZT_CHECK(st == ZS_OK, "%s bf16 backward ran", name);
    double ex = rel_err(zs_grad(x), dx, M * K), ew = rel_err(zs_grad(w), dw, N * K);
    double eb = rel_err(zs_grad(b), db, N);
    double er = kind == 2 ? rel_err(zs_grad(r), gv, M * N) : 0;
    ZT_CHECK(ex <= 0x1p-6 && ew <= 0x1p-6 && eb <= 0x1p-6 && er <= 0x1p-6,
             "%s bf16%s backward: dx %.3g dw %.3g db %.3g dr %.3g (> 2^-6)", name,
             wt ? " (w transposed)" : "", ex, ew, eb, er);
    free(xv), free(wv), free(bv), free(rv), free(gv), free(h), free(out);
    free(gh), free(dx), free(dw), free(db);
    zs_tensor *all[] = {x, w0, w, b, r, g, y};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        zs_release(all[i]);
}

static void test_linear(void)
{
    for (int kind = 0; kind < 3; kind++)
        for (int wt = 0; wt < 2; wt++)
            check_linear(kind, wt);
    zt_section("bf16 linear, linear_gelu, linear_residual forward and backward");
}

/* The bf16 linears (whose GEMM keeps its f32 sums in per-thread blocks)
 * against the two-step path they replaced, computed here from contiguous
 * copies: the whole product into an f32 buffer (zsk_gemm_bf16), then the
 * BF16 descriptor's epilogue over all of it. Bit for bit, on strided
 * views (x, r) and a transposed w, at a size crossing MC, the column
 * block and two K blocks (x [3, 47, 800], w [530, 800]); GeLU with x
 * requiring grad (the pre-activation is written too). Seeds 31..34. */
static void test_linear_bit_identity(void)
{
    const int64_t Bt = 3, Tt = 47, Kt = 800, Nt = 530, M = Bt * Tt;
    zs_tensor *x = zt_rand_strided(ZS_BF16, ZS_SHAPE(Bt, Tt, Kt), 31);
    zs_tensor *w0 = zt_rand(ZS_BF16, ZS_SHAPE(Kt, Nt), 32);
    zs_tensor *w = zs_transpose(w0, 0, 1);
    zs_tensor *b = zt_rand(ZS_BF16, ZS_SHAPE(Nt), 33);
    zs_tensor *r = zt_rand_strided(ZS_BF16, ZS_SHAPE(Bt, Tt, Nt), 34);
    zs_tensor *xc = zs_contiguous(x), *wc = zs_contiguous(w);
    zs_tensor *rc = zs_contiguous(r);
    float *C = malloc((size_t)(M * Nt) * sizeof *C);
    uint16_t *want = malloc((size_t)(M * Nt) * 2), *h = malloc((size_t)(M * Nt) * 2);
    const zsk_gemm_desc *d = zsk_gemm_desc_for(ZSK_GEMM_BF16);
    zsk_gemm_bf16(false, true, M, Nt, Kt, 1.0f, zs_data(xc), Kt, zs_data(wc),
                  Kt, 0.0f, C, Nt);
    for (int kind = 0; kind < 3; kind++) {
        zs_set_requires_grad(x, kind == 1);
        zsk_epilogue ep = {.gelu = kind == 1, .ldp = Nt, .ldr = Nt,
                           .bias16 = zs_data(b), .pre16 = kind == 1 ? h : NULL,
                           .res16 = kind == 2 ? zs_data(rc) : NULL,
                           .out16 = want, .ldo = Nt};
        d->epi(C, Nt, M, Nt, C, Nt, 0.0f, &ep);
        zs_tensor *y = kind == 0 ? zs_linear(x, w, b)
                     : kind == 1 ? zs_linear_gelu(x, w, b)
                                 : zs_linear_residual(x, w, b, r);
        int64_t diff = y ? 0 : -1;
        for (int64_t i = 0; y && i < M * Nt; i++)
            diff += ((const uint16_t *)zs_data(y))[i] != want[i];
        ZT_CHECK(diff == 0, "%s bf16 [%lld, %lld] x [%lld, %lld]^T (%s): %lld "
                 "outputs differ from the two-step path (seeds 31-34)",
                 kind == 0 ? "linear" : kind == 1 ? "linear_gelu" : "linear_residual",
                 (long long)M, (long long)Kt, (long long)Nt, (long long)Kt, d->name,
                 (long long)diff);
        zs_release(y);
    }
    free(C), free(want), free(h);
    zs_tensor *all[] = {x, w0, w, b, r, xc, wc, rc};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        zs_release(all[i]);
    zt_section("bf16 linears: bit-identical to the two-step GEMM + epilogue");
}

/* a [2, 5, 33] by b: 2-D (one GEMM, the fused rounding), batched [2, 33,
 * 19] (the f32 tensor), and 2-D by 2-D transposed. */
static void test_matmul(void)
{
    const int64_t Bm = 2, M = 5, Km = 33, Nm = 19;
    zs_tensor *a = zt_rand_strided(ZS_BF16, ZS_SHAPE(Bm, M, Km), 16);
    zs_tensor *b2 = zt_rand(ZS_BF16, ZS_SHAPE(Km, Nm), 17);
    zs_tensor *b3 = zt_rand(ZS_BF16, ZS_SHAPE(Bm, Km, Nm), 18);
    zs_tensor *a2 = zt_rand(ZS_BF16, ZS_SHAPE(Km, M), 19);
    double *av = zt_values(a), *b2v = zt_values(b2), *b3v = zt_values(b3);
    double *a2v = zt_values(a2);
    double *r2 = calloc(Bm * M * Nm, sizeof *r2), *r3 = calloc(Bm * M * Nm, sizeof *r3);
    double *rt = calloc(M * Nm, sizeof *rt);
    for (int64_t p = 0; p < Bm; p++)
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < Nm; j++)
                for (int64_t k = 0; k < Km; k++) {
                    double x = av[(p * M + i) * Km + k];
                    r2[(p * M + i) * Nm + j] += x * b2v[k * Nm + j];
                    r3[(p * M + i) * Nm + j] += x * b3v[(p * Km + k) * Nm + j];
                }
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < Nm; j++)
            for (int64_t k = 0; k < Km; k++)
                rt[i * Nm + j] += a2v[k * M + i] * b2v[k * Nm + j];
    zs_tensor *y2 = zs_matmul(a, b2), *y3 = zs_matmul(a, b3);
    zs_tensor *yt = zs_matmul_t(a2, b2, true, false);
    double e2 = rel_err(y2, r2, Bm * M * Nm), e3 = rel_err(y3, r3, Bm * M * Nm);
    double et = rel_err(yt, rt, M * Nm);
    ZT_CHECK(y2 && y3 && yt && y2->dtype == ZS_BF16 && y3->dtype == ZS_BF16 &&
             yt->dtype == ZS_BF16, "bf16 matmul results are bf16");
    ZT_CHECK(e2 <= 0x1p-7 && e3 <= 0x1p-7 && et <= 0x1p-7,
             "bf16 matmul: folded %.3g, batched %.3g, a^T b %.3g (> 2^-7; seeds 16-19)",
             e2, e3, et);
    free(av), free(b2v), free(b3v), free(a2v), free(r2), free(r3), free(rt);
    zs_tensor *all[] = {a, b2, b3, a2, y2, y3, yt};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        zs_release(all[i]);
    zt_section("bf16 matmul: one GEMM (epilogue rounding), batched, transposed");
}

static void test_gelu_bw_errors(void)
{
    zs_tensor *g = zt_rand(ZS_BF16, ZS_SHAPE(4, 5), 1);
    zs_tensor *h = zt_rand(ZS_BF16, ZS_SHAPE(5, 4), 2);
    zs_tensor *h32 = zt_rand(ZS_F32, ZS_SHAPE(4, 5), 3);
    zs_tensor *g64 = zt_rand(ZS_F64, ZS_SHAPE(4, 5), 4);
    zs_tensor *r;
    r = zsi_run(&zsi_def_linear_gelu_backward, 2, (zs_tensor *[]){g, h}, NULL);
    ZT_EXPECT_ERROR(r == NULL, "differ in shape");
    r = zsi_run(&zsi_def_linear_gelu_backward, 2, (zs_tensor *[]){g, h32}, NULL);
    ZT_EXPECT_ERROR(r == NULL, "linear_gelu_backward");
    r = zsi_run(&zsi_def_linear_gelu_backward, 2, (zs_tensor *[]){g64, g64}, NULL);
    ZT_EXPECT_ERROR(r == NULL, "expected bf16 or f32");
    /* the f32 kernel against the unfused derivative */
    zs_tensor *h2 = zt_rand(ZS_F32, ZS_SHAPE(4, 5), 5);
    r = zsi_run(&zsi_def_linear_gelu_backward, 2, (zs_tensor *[]){h32, h2}, NULL);
    double ref[20];
    for (int i = 0; i < 20; i++)
        ref[i] = zs_get(h32, i) * gelu_grad_d(zs_get(h2, i));
    double e = rel_err(r, ref, 20);
    ZT_CHECK(e <= 1e-5, "linear_gelu_backward f32: error %.3g > 1e-5", e);
    zs_tensor *all[] = {g, h, h32, g64, h2, r};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        zs_release(all[i]);
    zt_section("linear_gelu_backward: errors and the f32 kernel");
}

/* bf16 add/sub/mul/div of contiguous same-shape operands (the blocked
 * path of ops/binary.c) against strided views of the same values (the
 * zsi_via_f32 path): the same bits, and float64 within one rounding. */
static void test_binary_contig(void)
{
    const int64_t n = 3 * 4111;
    zs_tensor *a = zt_rand(ZS_BF16, ZS_SHAPE(3, 4111), 21);
    zs_tensor *b = zt_rand(ZS_BF16, ZS_SHAPE(3, 4111), 22);
    zs_tensor *as = zt_rand_strided(ZS_BF16, ZS_SHAPE(3, 4111), 21);
    zs_tensor *(*fn[4])(zs_tensor *, zs_tensor *) = {zs_add, zs_sub, zs_mul, zs_div};
    for (int op = 0; op < 4; op++) {
        zs_tensor *y = fn[op](a, b), *ys = fn[op](as, b);
        int diff = 0;
        double worst = 0;
        for (int64_t i = 0; y && ys && i < n; i++) {
            double x = zs_get(a, i), z = zs_get(b, i);
            double ref = op == 0 ? x + z : op == 1 ? x - z : op == 2 ? x * z : x / z;
            diff += zs_get(y, i) != zs_get(ys, i);
            double e = fabs(zs_get(y, i) - ref) / (fabs(ref) + 1e-30);
            worst = e > worst ? e : worst;
        }
        ZT_CHECK(y && ys && y->dtype == ZS_BF16 && diff == 0 && worst <= 0x1p-8,
                 "bf16 binary op %d: %d elements differ from the strided path, "
                 "relative error %.3g (seeds 21, 22)", op, diff, worst);
        zs_release(y);
        zs_release(ys);
    }
    zs_release(a);
    zs_release(b);
    zs_release(as);
    zt_section("bf16 add/sub/mul/div: contiguous blocks equal the general path");
}

int main(void)
{
    test_binary_contig();
    test_linear();
    test_linear_bit_identity();
    test_matmul();
    test_gelu_bw_errors();
    return zt_done();
}
