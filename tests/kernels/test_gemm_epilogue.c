/*
 * test_gemm_epilogue.c - zsk_sgemm_ex epilogues (bias, GeLU with and
 * without the pre-activation store, residual, every combination) against a
 * float64 reference, on the AVX-512, AVX2 and portable paths (those the CPU
 * has) with 1 and 2 threads; and the vector tanh and GeLU of the AVX-512
 * epilogue against libm in double.
 *
 * Shapes are odd and cross the register tiles (14 x 32, 6 x 16), MC = 42,
 * NC = 2048 and the K block (K = 1100 > KC_MAX = 1024 runs as two blocks, so
 * an epilogue applied on every block instead of the last one adds the bias
 * twice or applies GeLU to a partial sum); M = 1 and N = 1 take the GEMV
 * paths; alpha = 0 and K = 0 the scale-only path. Leading dimensions of C,
 * pre and res are padded with NaN that must stay NaN (pre also stays NaN
 * without GeLU); beta != 0 checks that beta C is added before the bias.
 *
 * Tolerances: the pre-activation v as in test_gemm.c, |v - ref| <= 1e-5
 * max(1, s), s = |alpha| |a_i| |b_j| + |beta c0| + |bias_j| (a bound on the
 * terms summed); the output after GeLU (derivative below 1.13) and the
 * residual, 2e-5 max(1, s + |res|). Seed 777 for all inputs.
 */
#include <stdlib.h>

#include "kernels/cpu/gemm.h"
#include "testutil.h"

#define SEED 777u

static uint64_t rng_state = SEED;

static float urand(void)
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(rng_state >> 40) / (double)(1ull << 23) - 1.0);
}

static float *rand_buf(int64_t n, float scale)
{
    float *p = malloc((size_t)(n + 1) * sizeof *p);
    for (int64_t i = 0; i < n; i++)
        p[i] = scale * urand();
    return p;
}

static double gelu_d(double v)
{
    return 0.5 * v * (1.0 + tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)));
}

/* Inputs of one shape: A and B as op(A) M x K, op(B) K x N with transposes,
 * C0 (ldc = N + 3), bias [N], res (ldr = N + 2). */
typedef struct problem {
    bool ta, tb;
    int64_t M, N, K, lda, ldb, ldc, ldr, ldp;
    float alpha, beta;
    float *A, *B, *C0, *bias, *res;
    double *acc, *scale; /* alpha op(A) op(B) + beta C0 and its bound */
} problem;

static void problem_init(problem *p, int64_t M, int64_t N, int64_t K,
                         bool ta, bool tb, float alpha, float beta)
{
    memset(p, 0, sizeof *p);
    p->ta = ta;
    p->tb = tb;
    p->M = M;
    p->N = N;
    p->K = K;
    p->lda = ta ? M : K;
    p->ldb = tb ? K : N;
    p->ldc = N + 3;
    p->ldr = N + 2;
    p->ldp = N + 1;
    p->alpha = alpha;
    p->beta = beta;
    p->A = rand_buf((ta ? K : M) * p->lda, 1.0f);
    p->B = rand_buf((tb ? N : K) * p->ldb, 1.0f);
    p->C0 = rand_buf(M * p->ldc, 2.0f); /* |c0| up to 2: GeLU's both sides */
    p->bias = rand_buf(N, 1.0f);
    p->res = rand_buf(M * p->ldr, 1.0f);
    p->acc = malloc((size_t)(M * N + 1) * sizeof *p->acc);
    p->scale = malloc((size_t)(M * N + 1) * sizeof *p->scale);
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            double s = 0, na = 0, nb = 0;
            for (int64_t k = 0; k < K; k++) {
                double a = ta ? p->A[k * p->lda + i] : p->A[i * p->lda + k];
                double b = tb ? p->B[j * p->ldb + k] : p->B[k * p->ldb + j];
                s += a * b;
                na += a * a;
                nb += b * b;
            }
            double c0 = beta != 0 ? (double)beta * p->C0[i * p->ldc + j] : 0.0;
            p->acc[i * N + j] = alpha * s + c0;
            p->scale[i * N + j] = fabs(alpha) * sqrt(na * nb) + fabs(c0);
        }
}

static void problem_free(problem *p)
{
    free(p->A);
    free(p->B);
    free(p->C0);
    free(p->bias);
    free(p->res);
    free(p->acc);
    free(p->scale);
}

/* Runs one epilogue combination (bit 0 bias, 1 gelu, 2 pre, 3 res) on the
 * current path; returns the worst scaled error (INFINITY for padding
 * written, NaN results, or pre written without GeLU). */
static double run_combo(const problem *p, int combo)
{
    bool has_bias = combo & 1, gelu = combo & 2, has_pre = combo & 4,
         has_res = combo & 8;
    int64_t M = p->M, N = p->N;
    float *c = malloc((size_t)(M * p->ldc) * sizeof *c);
    float *pre = malloc((size_t)(M * p->ldp) * sizeof *pre);
    for (int64_t i = 0; i < M * p->ldc; i++)
        c[i] = i % p->ldc >= N || p->beta == 0 ? NAN : p->C0[i];
    for (int64_t i = 0; i < M * p->ldp; i++)
        pre[i] = NAN;
    zsk_epilogue ep = {.bias = has_bias ? p->bias : NULL, .gelu = gelu,
                       .pre = has_pre ? pre : NULL, .ldp = p->ldp,
                       .res = has_res ? p->res : NULL, .ldr = p->ldr};
    zsk_sgemm_ex(p->ta, p->tb, M, N, p->K, p->alpha, p->A, p->lda, p->B,
                 p->ldb, p->beta, c, p->ldc, &ep);
    double worst = 0;
    for (int64_t i = 0; i < M; i++) {
        for (int64_t j = N; j < p->ldc; j++)
            worst = isnan(c[i * p->ldc + j]) ? worst : INFINITY;
        for (int64_t j = 0; j < p->ldp; j++)
            if (j >= N || !(gelu && has_pre))
                worst = isnan(pre[i * p->ldp + j]) ? worst : INFINITY;
        for (int64_t j = 0; j < N; j++) {
            double v = p->acc[i * N + j], s = p->scale[i * N + j];
            if (has_bias) {
                v += p->bias[j];
                s += fabs(p->bias[j]);
            }
            double e = 0;
            if (gelu && has_pre)
                e = fabs(pre[i * p->ldp + j] - v) / fmax(1, s);
            double tol_ratio = 1.0;
            if (gelu) {
                v = gelu_d(v);
                tol_ratio = 0.5; /* 2e-5 bound vs 1e-5 for pre */
            }
            if (has_res) {
                v += p->res[i * p->ldr + j];
                s += fabs(p->res[i * p->ldr + j]);
                tol_ratio = 0.5;
            }
            double eo = tol_ratio * fabs(c[i * p->ldc + j] - v) / fmax(1, s);
            e = fmax(e, eo);
            if (!(e <= worst))
                worst = isnan(e) ? INFINITY : e;
        }
    }
    free(c);
    free(pre);
    return worst;
}

static const zsk_gemm_isa isas[] = {ZSK_GEMM_AVX512, ZSK_GEMM_AVX2, ZSK_GEMM_REF};

static void check_problem(const problem *p)
{
    for (int k = 0; k < 3; k++) {
        if (!zsk_gemm_set_isa(isas[k]))
            continue;
        for (int t = 1; t <= 2; t++) {
            zs_set_num_threads(t);
            for (int combo = 0; combo < 16; combo++) {
                double e = run_combo(p, combo);
                ZT_CHECK(e <= 1e-5, "seed %u, %s, %d threads, M=%lld N=%lld "
                         "K=%lld ta=%d tb=%d alpha=%g beta=%g, bias=%d "
                         "gelu=%d pre=%d res=%d: error %.3g", SEED,
                         zsk_gemm_isa_name(), t, (long long)p->M,
                         (long long)p->N, (long long)p->K, p->ta, p->tb,
                         p->alpha, p->beta, combo & 1, combo >> 1 & 1,
                         combo >> 2 & 1, combo >> 3 & 1, e);
            }
        }
    }
    zsk_gemm_set_isa(ZSK_GEMM_AUTO);
}

static void test_combinations(void)
{
    static const struct {
        int64_t M, N, K;
        float alpha, beta;
    } cases[] = {
        {45, 77, 1100, 1.0f, 0.0f},  /* two K blocks, MC and tile edges */
        {43, 65, 1100, -0.5f, 0.5f}, /* two K blocks with beta */
        {20, 2080, 40, 1.0f, 0.0f},  /* crosses NC = 2048 */
        {7, 13, 5, 1.0f, 1.0f},      /* one thread (small) */
        {1, 100, 1030, 1.0f, 0.25f}, /* GEMV over N */
        {61, 1, 1030, 2.0f, 0.0f},   /* GEMV over M (a column of C) */
        {5, 9, 4, 0.0f, 1.5f},       /* alpha = 0: scale, then epilogue */
        {6, 3, 0, 1.0f, 0.0f},       /* K = 0 */
    };
    for (int c = 0; c < (int)(sizeof cases / sizeof *cases); c++) {
        problem p;
        problem_init(&p, cases[c].M, cases[c].N, cases[c].K, c & 1, c & 2,
                     cases[c].alpha, cases[c].beta);
        check_problem(&p);
        problem_free(&p);
    }
    zt_section("sgemm epilogues: bias, gelu, pre, residual on every path");
}

static void test_plain_is_unchanged(void)
{
    problem p;
    problem_init(&p, 30, 50, 70, false, true, 1.0f, 0.0f);
    float *c1 = malloc((size_t)(p.M * p.ldc) * sizeof *c1);
    float *c2 = malloc((size_t)(p.M * p.ldc) * sizeof *c2);
    zsk_epilogue none = {0};
    zsk_sgemm(p.ta, p.tb, p.M, p.N, p.K, 1.0f, p.A, p.lda, p.B, p.ldb, 0.0f,
              c1, p.ldc);
    zsk_sgemm_ex(p.ta, p.tb, p.M, p.N, p.K, 1.0f, p.A, p.lda, p.B, p.ldb,
                 0.0f, c2, p.ldc, &none);
    bool same = true;
    for (int64_t i = 0; i < p.M; i++)
        same = same && !memcmp(c1 + i * p.ldc, c2 + i * p.ldc,
                               (size_t)p.N * sizeof *c1);
    ZT_CHECK(same, "an empty epilogue gives zsk_sgemm's bits");
    free(c1);
    free(c2);
    problem_free(&p);
    zt_section("empty epilogue equals zsk_sgemm");
}

/* x over [-20, 20] in steps of 2^-12, tiny values, and specials. */
static int64_t sweep(float *x, int64_t cap)
{
    int64_t n = 0;
    for (int64_t k = -20 * 4096; k <= 20 * 4096 && n < cap; k++)
        x[n++] = (float)k / 4096.0f;
    static const float extra[] = {1e-30f, -1e-30f, 1e-7f, -3e-5f, 0.6249f,
                                  0.6251f, -0.625f, 8.9f, 9.1f, 1e30f,
                                  -1e30f, 1e-40f, -0.0f, INFINITY, -INFINITY};
    for (int i = 0; i < (int)(sizeof extra / sizeof *extra) && n < cap; i++)
        x[n++] = extra[i];
    return n;
}

static void test_tanh_gelu(void)
{
    int64_t cap = 40 * 4096 + 64;
    float *x = malloc((size_t)cap * sizeof *x), *y = malloc((size_t)cap * sizeof *y);
    int64_t n = sweep(x, cap);
    zsk_tanh_f32_avx512(y, x, n);
    double worst = 0;
    for (int64_t i = 0; i < n; i++) {
        double r = tanh((double)x[i]);
        double e = r == 0 ? fabs(y[i]) : fabs(y[i] - r) / fabs(r);
        worst = e > worst || isnan(e) ? (isnan(e) ? INFINITY : e) : worst;
    }
    ZT_CHECK(worst < 1e-6, "tanh relative error %.3g (< 1e-6)", worst);
    printf("  tanh (%s): max relative error %.3g over %lld inputs\n",
           zs_cpu()->avx512f ? "avx512" : "libm", worst, (long long)n);
    float nan_in = NAN, nan_out = 0;
    zsk_tanh_f32_avx512(&nan_out, &nan_in, 1);
    ZT_CHECK(isnan(nan_out), "tanh(NaN) is NaN");
    const zs_cpu_features *f = zs_cpu();
    for (int vec = 0; vec < 3; vec++) {
        if (vec < 2) /* finite inputs */
            zsk_gelu_tanh_f32(y, x, n - 4, vec);
        else
            zsk_gelu_tanh_f32_avx2(y, x, n - 4);
        double wa = 0;
        for (int64_t i = 0; i < n - 4; i++) {
            double r = gelu_d(x[i]);
            double e = fabs(y[i] - r) / fmax(fabs(r), 1.0);
            wa = e > wa || isnan(e) ? (isnan(e) ? INFINITY : e) : wa;
        }
        /* error relative to max(|gelu|, 1): the GEMM's own error is
         * relative to its terms, and gelu's tail below 1 is tiny */
        const char *path = vec == 2 ? (f->avx2 && f->fma ? "avx2" : "scalar")
                           : vec && f->avx512f ? "avx512" : "scalar";
        ZT_CHECK(wa < 1e-6, "gelu (%s) error %.3g (< 1e-6)", path, wa);
        printf("  gelu (%s): max error / max(|gelu|, 1) %.3g\n", path, wa);
        nan_out = 0;
        if (vec < 2)
            zsk_gelu_tanh_f32(&nan_out, &nan_in, 1, vec);
        else
            zsk_gelu_tanh_f32_avx2(&nan_out, &nan_in, 1);
        ZT_CHECK(isnan(nan_out), "gelu(NaN) is NaN");
    }
    free(x);
    free(y);
    zt_section("vector tanh and gelu accuracy");
}

int main(void)
{
    int threads = zs_num_threads();
    printf("best path: %s\n", zsk_gemm_isa_name());
    test_tanh_gelu();
    test_plain_is_unchanged();
    test_combinations();
    zs_set_num_threads(threads);
    return zt_done();
}
