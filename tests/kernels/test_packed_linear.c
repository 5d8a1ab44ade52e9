/*
 * test_packed_linear.c - kernels/cpu/packed_linear.c: zsk_pack_f32 and the
 * batch-invariant linear layer zsk_packed_linear_f32.
 *
 * (1) Against float64 on random inputs of odd sizes (N, K not multiples of
 *     64 or 16; M = 1, 3, 17, 130), with every bias / residual / GeLU
 *     combination, strided x, y and residual, and the residual aliasing y.
 *     Tolerance: a chain of K f32 fmas errs by at most about
 *     K 2^-24 sum_k |x w| (first-order bound), GeLU's slope is below 1.13,
 *     and the epilogue's GeLU errs by < 1e-6 max(1, |v|) (checked in (4)),
 *     the adds by an ulp each: |y - ref| <= 1.2 (K + 4) 2^-24 (sum_k |x w|
 *     + |bias|) + 2e-6 max(1, |ref|).
 * (2) Exact contract: without GeLU, y[m, n] has the bits of the scalar
 *     chain acc = fmaf(x[m, k], W[n, k], acc) over k = 0..K-1, then
 *     (acc + bias) + residual, in float.
 * (3) Invariance, all bitwise: each row computed alone (M = 1) equals the
 *     row of the full batch; the row placed at several positions of another
 *     batch of other rows; 1 vs 2 threads; the vector path (AVX-512, or
 *     AVX2+FMA under ZS_CPU_ISA=avx2) vs the portable one
 *     (zsk_linear_force_portable) when the CPU has one.
 * (4) GeLU of the epilogue against 0.5 v (1 + tanh(...)) in float64 on
 *     [-12, 12] and at extremes (+-inf, NaN, huge).
 * (5) Errors: NULL pointers, negative sizes, small strides, bad act,
 *     overlapping residual, failed allocation: a status and a message,
 *     outputs untouched.
 * Seeds are printed with every failure.
 */
#include <stdlib.h>

#include "kernels/cpu/packed_linear.h"
#include "testutil.h"

static uint64_t rng_next(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 11;
}

static float urand(uint64_t *s) /* [-1, 1) */
{
    return (float)((double)rng_next(s) / 9007199254740992.0 * 2.0 - 1.0);
}

static float *rand_buf(int64_t n, float scale, uint64_t seed)
{
    float *p = malloc((size_t)(n > 0 ? n : 1) * sizeof *p);
    uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
    for (int64_t i = 0; i < n; i++)
        p[i] = urand(&s) * scale;
    return p;
}

static double gelu_d(double v)
{
    return 0.5 * v * (1.0 + tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)));
}

/* One problem: W [N, K], x [M, ldx], residual [M, ldr], y [M, ldy]. */
typedef struct prob {
    int64_t M, N, K, ldx, ldr, ldy;
    float *W, *x, *bias, *res;
    zsk_packed_f32 P;
    uint64_t seed;
} prob;

static prob make(int64_t M, int64_t N, int64_t K, int64_t pad, uint64_t seed)
{
    prob p = {.M = M, .N = N, .K = K, .ldx = K + pad, .ldr = N + 2 * pad,
              .ldy = N + 3 * pad, .seed = seed};
    p.W = rand_buf(N * K, 1.0f, seed);
    p.x = rand_buf(M * p.ldx, 2.0f, seed + 1);
    p.bias = rand_buf(N, 1.0f, seed + 2);
    p.res = rand_buf(M * p.ldr, 1.0f, seed + 3);
    ZT_CHECK(zsk_pack_f32(p.W, N, K, &p.P) == ZS_OK, "pack N=%lld K=%lld",
             (long long)N, (long long)K);
    return p;
}

static void drop(prob *p)
{
    free(p->W);
    free(p->x);
    free(p->bias);
    free(p->res);
    zsk_packed_free(&p->P);
}

static float *new_y(const prob *p) { return rand_buf(p->M * p->ldy, 100.0f, 7); }

/* Runs p with the given options into y (the residual copied into y first
 * when alias). */
static zs_status run(const prob *p, bool bias, bool res, bool alias, zsk_act act,
                     float *y)
{
    const float *r = res ? p->res : NULL;
    int64_t ldr = p->ldr;
    if (res && alias) {
        for (int64_t m = 0; m < p->M; m++)
            memcpy(y + m * p->ldy, p->res + m * p->ldr, (size_t)p->N * sizeof *y);
        r = y;
        ldr = p->ldy;
    }
    return zsk_packed_linear_f32(&p->P, p->x, p->M, p->ldx, bias ? p->bias : NULL, r,
                                 ldr, act, y, p->ldy);
}

static bool same_rows(const float *a, int64_t lda, const float *b, int64_t ldb,
                      int64_t M, int64_t N)
{
    for (int64_t m = 0; m < M; m++)
        if (memcmp(a + m * lda, b + m * ldb, (size_t)N * sizeof *a) != 0)
            return false;
    return true;
}

/* ---- (1), (2) ------------------------------------------------------------ */

static void check_values(const prob *p, bool bias, bool res, bool alias, zsk_act act)
{
    float *y = new_y(p);
    ZT_CHECK(run(p, bias, res, alias, act, y) == ZS_OK, "run");
    int bad = 0;
    for (int64_t m = 0; m < p->M && bad < 3; m++) {
        for (int64_t n = 0; n < p->N && bad < 3; n++) {
            double ref = 0, mag = 0;
            float chain = 0.0f;
            for (int64_t k = 0; k < p->K; k++) {
                float xv = p->x[m * p->ldx + k], wv = p->W[n * p->K + k];
                ref += (double)xv * wv;
                mag += fabs((double)xv * wv);
                chain = fmaf(xv, wv, chain);
            }
            float exact = chain;
            if (bias) {
                ref += p->bias[n];
                mag += fabs(p->bias[n]);
                exact = exact + p->bias[n];
            }
            if (act == ZSK_ACT_GELU_TANH)
                ref = gelu_d(ref);
            if (res) {
                ref += p->res[m * p->ldr + n];
                exact = exact + p->res[m * p->ldr + n];
            }
            float got = y[m * p->ldy + n];
            double tol = 1.2 * (double)(p->K + 4) * 0x1p-24 * mag + 2e-6 * fmax(1, fabs(ref));
            bool ok = fabs(got - ref) <= tol;
            if (act == ZSK_ACT_NONE)
                ok = ok && memcmp(&got, &exact, sizeof got) == 0;
            if (!ok) {
                ZT_CHECK(0, "seed %llu M=%lld N=%lld K=%lld bias=%d res=%d alias=%d "
                         "gelu=%d [%lld,%lld]: got %.9g, ref %.9g (tol %.3g), chain %.9g",
                         (unsigned long long)p->seed, (long long)p->M, (long long)p->N,
                         (long long)p->K, bias, res, alias, act, (long long)m,
                         (long long)n, got, ref, tol, exact);
                bad++;
            }
        }
    }
    /* padding between rows untouched */
    float *y0 = new_y(p);
    for (int64_t m = 0; m < p->M; m++)
        for (int64_t n = p->N; n < p->ldy; n++)
            ZT_CHECK(y[m * p->ldy + n] == y0[m * p->ldy + n], "padding of y written");
    free(y0);
    free(y);
}

/* ---- (3) ------------------------------------------------------------------- */

/* Row m alone (M = 1) and at positions 0, mid and last of a batch of
 * other rows must give the bits of the full batch. */
static void check_batch_invariance(const prob *p, zsk_act act, const float *yfull)
{
    int64_t N = p->N, K = p->K;
    int64_t rows[3] = {0, p->M / 2, p->M - 1};
    int64_t B = p->M + 5;
    float *xb = rand_buf(B * K, 2.0f, p->seed + 99);
    float *rb = rand_buf(B * N, 1.0f, p->seed + 98);
    float *yb = malloc((size_t)(B * N) * sizeof *yb), y1[1024];
    for (int i = 0; i < 3; i++) {
        int64_t m = rows[i];
        ZT_CHECK(zsk_packed_linear_f32(&p->P, p->x + m * p->ldx, 1, K, p->bias,
                                       p->res + m * p->ldr, N, act, y1, N) == ZS_OK,
                 "M = 1");
        ZT_CHECK(same_rows(y1, N, yfull + m * p->ldy, N, 1, N),
                 "seed %llu M=%lld N=%lld K=%lld: row %lld alone differs from the batch",
                 (unsigned long long)p->seed, (long long)p->M, (long long)N,
                 (long long)K, (long long)m);
        int64_t pos[3] = {0, B / 2 + 1, B - 1};
        for (int q = 0; q < 3; q++) {
            memcpy(xb + pos[q] * K, p->x + m * p->ldx, (size_t)K * sizeof *xb);
            memcpy(rb + pos[q] * N, p->res + m * p->ldr, (size_t)N * sizeof *rb);
            ZT_CHECK(zsk_packed_linear_f32(&p->P, xb, B, K, p->bias, rb, N, act, yb, N) ==
                         ZS_OK, "batch");
            ZT_CHECK(same_rows(yb + pos[q] * N, N, y1, N, 1, N),
                     "seed %llu N=%lld K=%lld: row %lld at position %lld of %lld differs",
                     (unsigned long long)p->seed, (long long)N, (long long)K,
                     (long long)m, (long long)pos[q], (long long)B);
        }
    }
    free(xb);
    free(rb);
    free(yb);
}

static void check_invariance(const prob *p, bool vec)
{
    for (int a = 0; a < 2; a++) {
        zsk_act act = a ? ZSK_ACT_GELU_TANH : ZSK_ACT_NONE;
        int threads = zs_num_threads();
        float *y1 = new_y(p), *y2 = new_y(p), *yp = new_y(p);
        zs_set_num_threads(1);
        ZT_CHECK(run(p, true, true, false, act, y1) == ZS_OK, "1 thread");
        zs_set_num_threads(2);
        ZT_CHECK(run(p, true, true, false, act, y2) == ZS_OK, "2 threads");
        ZT_CHECK(same_rows(y1, p->ldy, y2, p->ldy, p->M, p->N),
                 "seed %llu M=%lld N=%lld K=%lld: 1 vs 2 threads differ",
                 (unsigned long long)p->seed, (long long)p->M, (long long)p->N,
                 (long long)p->K);
        if (vec) {
            bool old = zsk_linear_force_portable(true);
            ZT_CHECK(run(p, true, true, false, act, yp) == ZS_OK, "portable");
            zsk_linear_force_portable(old);
            ZT_CHECK(same_rows(y2, p->ldy, yp, p->ldy, p->M, p->N),
                     "seed %llu M=%lld N=%lld K=%lld act=%d: vector vs portable path differ",
                     (unsigned long long)p->seed, (long long)p->M, (long long)p->N,
                     (long long)p->K, act);
        }
        if (p->N <= 1024)
            check_batch_invariance(p, act, y2);
        zs_set_num_threads(threads);
        free(y1);
        free(y2);
        free(yp);
    }
}

/* ---- (4) ------------------------------------------------------------------- */

static void check_gelu(void)
{
    enum { n = 24001 };
    float *v = malloc(n * sizeof *v), *g = malloc(n * sizeof *g);
    for (int i = 0; i < n; i++)
        v[i] = -12.0f + 24.0f * (float)i / (n - 1);
    zsk_linear_epilogue(v, n, NULL, NULL, ZSK_ACT_GELU_TANH, g);
    double worst = 0;
    for (int i = 0; i < n; i++)
        worst = fmax(worst, fabs(g[i] - gelu_d(v[i])) / fmax(1, fabs(v[i])));
    printf("gelu: max |err| / max(1, |v|) = %.3g on [-12, 12]\n", worst);
    ZT_CHECK(worst < 1e-6, "gelu error %.3g", worst);
    float ex[6] = {INFINITY, -INFINITY, NAN, 1e30f, -1e30f, 0.0f}, ge[6];
    zsk_linear_epilogue(ex, 6, NULL, NULL, ZSK_ACT_GELU_TANH, ge);
    ZT_CHECK(ge[0] == INFINITY && ge[1] != ge[1] && ge[2] != ge[2] && ge[3] == 1e30f &&
                 ge[4] == 0.0f && ge[5] == 0.0f,
             "gelu extremes: %g %g %g %g %g %g", ge[0], ge[1], ge[2], ge[3], ge[4], ge[5]);
    /* a lane's result does not depend on its position or the count */
    for (int c = 1; c <= 33; c += 4) {
        float part[33];
        zsk_linear_epilogue(v + 1000 + c, 33 - c % 7, NULL, NULL, ZSK_ACT_GELU_TANH, part);
        ZT_CHECK(memcmp(part, g + 1000 + c, (size_t)(33 - c % 7) * sizeof *part) == 0,
                 "epilogue depends on position (offset %d)", c);
    }
    free(v);
    free(g);
}

/* ---- (5) ------------------------------------------------------------------- */

static void check_errors(void)
{
    float W[12] = {0}, x[8] = {0}, y[8], r[8] = {0};
    for (int i = 0; i < 8; i++)
        y[i] = 7;
    zsk_packed_f32 P = {0}, Q;
    ZT_EXPECT_ERROR(zsk_pack_f32(NULL, 3, 4, &Q) == ZS_ERR_ARG, "NULL");
    ZT_EXPECT_ERROR(zsk_pack_f32(W, -1, 4, &Q) == ZS_ERR_ARG, "negative");
    ZT_EXPECT_ERROR(zsk_pack_f32(W, 3, -4, &Q) == ZS_ERR_ARG, "negative");
    ZT_EXPECT_ERROR(zsk_pack_f32(W, 3, 4, NULL) == ZS_ERR_ARG, "NULL");
    ZT_EXPECT_ERROR(zsk_pack_f32(W, INT64_MAX / 2, 1 << 20, &Q) == ZS_ERR_ARG, "too large");
    ZT_CHECK(Q.data == NULL && Q.N == 0, "failed pack leaves a zeroed struct");
    zs_alloc_fail_after(1);
    zs_status st = zsk_pack_f32(W, 3, 4, &Q);
    zs_alloc_fail_after(0);
    ZT_EXPECT_ERROR(st == ZS_ERR_NOMEM, "out of memory");
    zsk_packed_free(&Q);
    zsk_packed_free(NULL);
    ZT_CHECK(zsk_pack_f32(W, 3, 4, &P) == ZS_OK, "pack");
    ZT_EXPECT_ERROR(zsk_packed_linear_f32(NULL, x, 2, 4, NULL, NULL, 0, ZSK_ACT_NONE, y, 3) ==
                        ZS_ERR_ARG, "NULL weights");
    ZT_EXPECT_ERROR(zsk_packed_linear_f32(&P, NULL, 2, 4, NULL, NULL, 0, ZSK_ACT_NONE, y, 3) ==
                        ZS_ERR_ARG, "NULL x");
    ZT_EXPECT_ERROR(zsk_packed_linear_f32(&P, x, 2, 4, NULL, NULL, 0, ZSK_ACT_NONE, NULL, 3) ==
                        ZS_ERR_ARG, "NULL y");
    ZT_EXPECT_ERROR(zsk_packed_linear_f32(&P, x, -2, 4, NULL, NULL, 0, ZSK_ACT_NONE, y, 3) ==
                        ZS_ERR_ARG, "negative");
    ZT_EXPECT_ERROR(zsk_packed_linear_f32(&P, x, 2, 3, NULL, NULL, 0, ZSK_ACT_NONE, y, 3) ==
                        ZS_ERR_ARG, "stride");
    ZT_EXPECT_ERROR(zsk_packed_linear_f32(&P, x, 2, 4, NULL, NULL, 0, ZSK_ACT_NONE, y, 2) ==
                        ZS_ERR_ARG, "stride");
    ZT_EXPECT_ERROR(zsk_packed_linear_f32(&P, x, 2, 4, NULL, r, 2, ZSK_ACT_NONE, y, 3) ==
                        ZS_ERR_ARG, "stride");
    ZT_EXPECT_ERROR(zsk_packed_linear_f32(&P, x, 2, 4, NULL, NULL, 0, (zsk_act)9, y, 3) ==
                        ZS_ERR_ARG, "activation");
    ZT_EXPECT_ERROR(zsk_packed_linear_f32(&P, x, 2, 4, NULL, y + 1, 3, ZSK_ACT_NONE, y, 3) ==
                        ZS_ERR_ARG, "overlaps");
    ZT_EXPECT_ERROR(zsk_packed_linear_f32(&P, y, 1, 4, NULL, NULL, 0, ZSK_ACT_NONE, y + 2, 3) ==
                        ZS_ERR_ARG, "overlaps");
    zsk_packed_f32 bad = P;
    bad.data = NULL;
    ZT_EXPECT_ERROR(zsk_packed_linear_f32(&bad, x, 2, 4, NULL, NULL, 0, ZSK_ACT_NONE, y, 3) ==
                        ZS_ERR_ARG, "not packed");
    for (int i = 0; i < 8; i++)
        ZT_CHECK(y[i] == 7, "y touched by a refused call");
    ZT_CHECK(zsk_packed_linear_f32(&P, x, 0, 4, NULL, NULL, 0, ZSK_ACT_NONE, NULL, 3) == ZS_OK,
             "M = 0");
    zsk_packed_free(&P);
    ZT_CHECK(P.data == NULL && P.N == 0, "free zeroes the struct");
    zsk_packed_free(&P);
    /* K = 0: y = act(bias) + residual */
    zsk_packed_f32 Z;
    float b[3] = {1, -2, 3}, yz[6];
    ZT_CHECK(zsk_pack_f32(NULL, 3, 0, &Z) == ZS_OK, "pack K = 0");
    ZT_CHECK(zsk_packed_linear_f32(&Z, NULL, 2, 0, b, NULL, 0, ZSK_ACT_NONE, yz, 3) == ZS_OK &&
                 yz[0] == 1 && yz[4] == -2 && yz[5] == 3,
             "K = 0 gives the bias");
    zsk_packed_free(&Z);
}

int main(void)
{
    const zs_cpu_features *f = zs_cpu();
    bool vec = f->avx512f || (f->avx2 && f->fma);
    printf("vector path: %s\n", f->avx512f             ? "AVX-512"
                                 : f->avx2 && f->fma ? "AVX2+FMA"
                                                     : "no (portable only)");
    static const int64_t Ms[] = {1, 3, 17, 130};
    static const int64_t NKs[][2] = {{1, 1}, {67, 13}, {130, 100}, {200, 257}, {64, 64}};
    uint64_t seed = 1;
    for (size_t a = 0; a < sizeof Ms / sizeof *Ms; a++) {
        for (size_t b = 0; b < sizeof NKs / sizeof *NKs; b++) {
            prob p = make(Ms[a], NKs[b][0], NKs[b][1], (int64_t)(b % 3) * 3, seed++);
            for (int c = 0; c < 8; c++)
                check_values(&p, c & 1, c & 2, (c & 2) && (c & 4),
                             c & 4 ? ZSK_ACT_GELU_TANH : ZSK_ACT_NONE);
            check_values(&p, true, true, true, ZSK_ACT_NONE);
            drop(&p);
        }
    }
    zt_section("values against float64 and the fmaf chain");

    for (size_t a = 0; a < sizeof Ms / sizeof *Ms; a++) {
        for (size_t b = 1; b < sizeof NKs / sizeof *NKs; b++) {
            prob p = make(Ms[a], NKs[b][0], NKs[b][1], 1, seed++);
            check_invariance(&p, vec);
            drop(&p);
        }
    }
    prob wide = make(9, 1000, 70, 0, seed++); /* many panels over the pool */
    check_invariance(&wide, vec);
    drop(&wide);
    zt_section("batch, thread and path invariance (bitwise)");

    check_gelu();
    zt_section("gelu");
    check_errors();
    zt_section("errors");
    return zt_done();
}
