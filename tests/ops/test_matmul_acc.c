/*
 * test_matmul_acc.c - in-place gradient accumulation (src/ops/matmul.c
 * matmul_acc_, the engine's zsi_grad_acc offer in src/autograd/engine.c,
 * and the rules that take it: linear's weight gradient, matmul's folded
 * gradient of a 2-D b).
 *
 * Checked: matmul_acc_ adds op(a) op(b) into a destination (all four
 * transpose cases, odd sizes, a strided operand) against float64 in f32
 * and f64; onto zeros it has zs_matmul_t's bits (the GPT's weight-gradient
 * shapes); its errors (shapes, a strided destination, mixed dtypes) name
 * it. Through autograd: a linear's and a folded matmul's weight gradients,
 * with the leaf's .grad present, equal the values the engine's own
 * accumulation gives (two backwards adding up: f64 to 1e-12, f32 to
 * 1e-6) and, onto a zeroed .grad, the same bits; the allocator makes no
 * block of the weight's size during that backward (the transient is
 * gone).
 */
#include <stdlib.h>

#include "ops/internal.h"
#include "testutil.h"

/* max |got - (d0 + op(a) op(b))| / max(1, |ref|) in float64. */
static double acc_err(const zs_tensor *got, const double *d0, const zs_tensor *a,
                      const zs_tensor *b, bool ta, bool tb)
{
    double *av = zt_values(a), *bv = zt_values(b), *gv = zt_values(got), e = 0;
    int64_t M = got->shape[0], N = got->shape[1], K = a->shape[ta ? 0 : 1];
    int64_t ac = a->shape[1], bc = b->shape[1];
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            double s = d0[i * N + j];
            for (int64_t k = 0; k < K; k++)
                s += (ta ? av[k * ac + i] : av[i * ac + k]) *
                     (tb ? bv[j * bc + k] : bv[k * bc + j]);
            e = fmax(e, fabs(gv[i * N + j] - s) / fmax(1, fabs(s)));
        }
    free(av);
    free(bv);
    free(gv);
    return e;
}

static void test_kernel(zs_dtype dt)
{
    double tol = dt == ZS_F32 ? 2e-5 : 1e-12;
    int64_t M = 37, N = 29, K = 53;
    for (int c = 0; c < 4; c++) {
        bool ta = c & 1, tb = c & 2;
        zs_tensor *a = ta ? zt_rand_strided(dt, 2, (int64_t[]){K, M}, 10 + c)
                          : zt_rand(dt, 2, (int64_t[]){M, K}, 10 + c);
        zs_tensor *b = zt_rand(dt, 2, tb ? (int64_t[]){N, K} : (int64_t[]){K, N}, 20 + c);
        zs_tensor *d = zt_rand(dt, 2, (int64_t[]){M, N}, 30 + c);
        double *d0 = zt_values(d);
        zs_status st = zsi_matmul_acc_(d, a, b, ta, tb);
        double e = st == ZS_OK ? acc_err(d, d0, a, b, ta, tb) : INFINITY;
        ZT_CHECK(e <= tol, "%s matmul_acc_ %s%s: error %.2e (tol %.0e)", zs_dtype_name(dt),
                 ta ? "a^T" : "a", tb ? " b^T" : " b", e, tol);
        free(d0);
        zs_release(a);
        zs_release(b);
        zs_release(d);
    }
    zt_section(dt == ZS_F32 ? "matmul_acc_ f32 against float64"
                            : "matmul_acc_ f64 against float64");
}

/* Onto zeros: the bits of zs_matmul_t(a, b, true, false) (the weight
 * gradients: gh^T x of a GPT small block and of its tied head). */
static void test_bits(void)
{
    const int64_t shapes[][3] = {{256, 1536, 384}, {256, 384, 1536}, {512, 4096, 384},
                                 {7, 5, 3}};
    for (int s = 0; s < 4; s++) {
        int64_t R = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
        zs_tensor *g = zt_rand(ZS_F32, 2, (int64_t[]){R, N}, 40 + s);
        zs_tensor *x = zt_rand(ZS_F32, 2, (int64_t[]){R, K}, 50 + s);
        zs_tensor *ref = zs_matmul_t(g, x, true, false);
        zs_tensor *d = zs_zeros(ZS_F32, 2, (int64_t[]){N, K});
        zs_status st = zsi_matmul_acc_(d, g, x, true, false);
        ZT_CHECK(st == ZS_OK && ref && !memcmp(zs_data(d), zs_data(ref), zs_nbytes(d)),
                 "matmul_acc_ onto zeros has zs_matmul_t's bits ([%lld, %lld]^T x [%lld, "
                 "%lld])", (long long)R, (long long)N, (long long)R, (long long)K);
        zs_release(g);
        zs_release(x);
        zs_release(ref);
        zs_release(d);
    }
    zt_section("matmul_acc_ onto zeros: the bits of zs_matmul_t");
}

static void test_errors(void)
{
    zs_tensor *d = zs_zeros(ZS_F32, 2, (int64_t[]){3, 4});
    zs_tensor *a = zt_rand(ZS_F32, 2, (int64_t[]){3, 5}, 1);
    zs_tensor *b = zt_rand(ZS_F32, 2, (int64_t[]){5, 4}, 2);
    zs_tensor *b6 = zt_rand(ZS_F32, 2, (int64_t[]){6, 4}, 3);
    zs_tensor *a64 = zt_rand(ZS_F64, 2, (int64_t[]){3, 5}, 4);
    zs_tensor *wide = zs_zeros(ZS_F32, 2, (int64_t[]){4, 3});
    zs_tensor *dt = zs_transpose(wide, 0, 1); /* [3, 4], not contiguous */
    ZT_EXPECT_ERROR(zsi_matmul_acc_(d, a, b6, false, false) != ZS_OK, "matmul_acc_");
    ZT_EXPECT_ERROR(zsi_matmul_acc_(dt, a, b, false, false) != ZS_OK, "contiguous");
    ZT_EXPECT_ERROR(zsi_matmul_acc_(d, a64, b, false, false) != ZS_OK, "matmul_acc_");
    ZT_CHECK(zsi_matmul_acc_(d, a, b, false, false) == ZS_OK, "the good call runs");
    ZT_CHECK(!zsi_matmul_acc_ok(NULL, a, b) && !zsi_matmul_acc_ok(d, a64, b) &&
             zsi_matmul_acc_ok(d, a, b), "zsi_matmul_acc_ok");
    zs_tensor *all[] = {d, a, b, b6, a64, wide, dt};
    for (int i = 0; i < 7; i++)
        zs_release(all[i]);
    zt_section("matmul_acc_ errors");
}

/* loss = sum(f(x, w) * r) for the linear or the folded matmul. */
static zs_tensor *loss_of(bool lin, zs_tensor *x, zs_tensor *w, zs_tensor *r)
{
    zs_tensor *y = lin ? zs_linear(x, w, NULL) : zs_matmul_t(x, w, false, true);
    zs_tensor *p = zs_mul(y, r);
    zs_tensor *l = zs_sum(p, 0, NULL, false);
    zs_release(y);
    zs_release(p);
    return l;
}

/* w's gradient after backwards of two batches with w.grad present (the
 * in-place path) against the same computed with w.grad absent at first
 * (the engine's own accumulation), and the first backward's bits. */
static void test_autograd(zs_dtype dt, bool lin)
{
    /* Few rows against a large weight: the backward's own temporaries
     * (dy, the GEMM's packing, which differ by ISA and thread count) stay
     * far below one [N, K] gradient (at 51 rows they came within 10 KiB of
     * it and failed once the GEMM packed through the allocator). */
    int64_t B = 3, T = 2, K = 64, N = 96;
    zs_tensor *x[2], *r[2];
    for (int i = 0; i < 2; i++) {
        x[i] = zt_rand(dt, 3, (int64_t[]){B, T, K}, 60 + i);
        r[i] = zt_rand(dt, 3, (int64_t[]){B, T, N}, 70 + i);
    }
    zs_tensor *w1 = zt_rand(dt, 2, (int64_t[]){N, K}, 80), *w2 = zs_clone(w1);
    zs_set_requires_grad(w1, true);
    zs_set_requires_grad(w2, true);
    w1->grad = zs_zeros(dt, 2, (int64_t[]){N, K}); /* present: offered in place */
    zs_tensor *first = NULL;
    size_t wbytes = (size_t)(N * K) * zs_dtype_size(dt), big = 0;
    for (int i = 0; i < 2; i++) {
        zs_tensor *l1 = loss_of(lin, x[i], w1, r[i]), *l2 = loss_of(lin, x[i], w2, r[i]);
        zs_alloc_stats a0, a1;
        zs_alloc_get_stats(&a0);
        zs_alloc_reset_peak();
        ZT_CHECK(zs_backward(l1, NULL, false) == ZS_OK, "backward (in place)");
        zs_alloc_get_stats(&a1);
        big = a1.peak_bytes - a0.current_bytes > big ? a1.peak_bytes - a0.current_bytes : big;
        ZT_CHECK(zs_backward(l2, NULL, false) == ZS_OK, "backward (engine accumulates)");
        if (i == 0)
            first = zs_clone(zs_grad(w2));
        if (i == 0)
            ZT_CHECK(first && !memcmp(zs_data(zs_grad(w1)), zs_data(first), wbytes),
                     "%s %s: the first backward onto zeros has the engine's bits",
                     zs_dtype_name(dt), lin ? "linear" : "matmul");
        zs_release(l1);
        zs_release(l2);
    }
    double *g1 = zt_values(zs_grad(w1));
    double e = zt_max_err(zs_grad(w2), g1, N * K);
    double tol = dt == ZS_F32 ? 1e-6 : 1e-12;
    ZT_CHECK(e <= tol, "%s %s: two backwards in place equal the engine's sum: error %.2e",
             zs_dtype_name(dt), lin ? "linear" : "matmul", e);
    ZT_CHECK(big < wbytes, "%s %s: the backward held %zu bytes above its start, less than "
             "the weight's %zu (no gradient temporary)", zs_dtype_name(dt),
             lin ? "linear" : "matmul", big, wbytes);
    free(g1);
    zs_release(first);
    for (int i = 0; i < 2; i++) {
        zs_release(x[i]);
        zs_release(r[i]);
    }
    zs_release(w1);
    zs_release(w2);
    zt_section(lin ? "linear weight gradient in place" : "folded matmul gradient in place");
}

int main(void)
{
    test_kernel(ZS_F32);
    test_kernel(ZS_F64);
    test_bits();
    test_errors();
    for (int lin = 0; lin < 2; lin++) {
        test_autograd(ZS_F32, lin);
        test_autograd(ZS_F64, lin);
    }
    return zt_done();
}
