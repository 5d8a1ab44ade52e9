/*
 * test_gemm.c - zsk_sgemm (every micro-kernel the CPU has, and the portable
 * path) and zsk_dgemm against a float64 reference: odd shapes around the
 * register and cache blocks, all four transposes, alpha and beta, leading
 * dimensions padded past the row length (padding filled with NaN, which
 * must neither be read into results nor overwritten), NaN in C with
 * beta = 0, on 1 and 2 threads.
 *
 * Every registered (element type, ISA) descriptor of the framework that
 * the CPU runs (zsk_gemm_descs: f32, bf16, f16 on each ISA) also runs
 * directly through zsk_gemm_run on odd shapes with edge tiles in M and N,
 * all transposes, alpha/beta, some with a bias epilogue, against float64
 * on the inputs as rounded to its type (same tolerance).
 *
 * Tolerance: |c - ref| <= 1e-5 * max(1, s) with s = |alpha| |a_i| |b_j| +
 * |beta c0|, |a_i| and |b_j| the 2-norms of the row of op(A) and column of
 * op(B) (s bounds |ref| by Cauchy-Schwarz): float rounding of a sum of K
 * products grows with the size of its terms, not with |ref|, which can be
 * near zero; uniform [-1, 1] inputs with K <= 700 give errors near
 * sqrt(K) 2^-24 s, well inside the bound.
 */
#include <stdlib.h>

#include "kernels/cpu/gemm.h"
#include "testutil.h"
#include "zs/core.h"

static const int64_t sizes[] = {1, 2, 3, 7, 15, 16, 17, 31, 33, 63, 65, 129, 257};
#define NSIZES (int)(sizeof sizes / sizeof *sizes)

static const float alphas[] = {1.0f, 0.5f, 1.0f, -1.5f, 0.0f};
static const float betas[] = {0.0f, 0.0f, 1.0f, 0.25f, 2.0f};

static uint64_t rng_state = 12345;

static float urand(void)
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(rng_state >> 40) / (double)(1ull << 23) - 1.0);
}

/* A rows x cols matrix with leading dimension ld >= cols; padding NaN. */
typedef struct mat {
    int64_t rows, cols, ld;
    float *f;
    double *d;
} mat;

static mat mat_new(int64_t rows, int64_t cols, int64_t pad, bool nan_body)
{
    mat m = {rows, cols, cols + pad, NULL, NULL};
    size_t n = (size_t)(rows * m.ld + 1);
    m.f = malloc(n * sizeof *m.f);
    m.d = malloc(n * sizeof *m.d);
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < m.ld; j++) {
            float v = j < cols && !nan_body ? urand() : NAN;
            m.f[i * m.ld + j] = v;
            m.d[i * m.ld + j] = v;
        }
    return m;
}

static void mat_free(mat *m)
{
    free(m->f);
    free(m->d);
}

typedef struct gemm_case {
    bool ta, tb;
    int64_t M, N, K, pad;
    float alpha, beta;
} gemm_case;

/* ref = alpha op(A) op(B) + beta C (beta == 0: C ignored), in double. */
/* ref[2 * (i * N + j)] is the value, ref[... + 1] its scale s. */
static double *reference(const gemm_case *g, const mat *A, const mat *B,
                         const mat *C)
{
    double *r = malloc((size_t)(2 * g->M * g->N + 1) * sizeof *r);
    for (int64_t i = 0; i < g->M; i++)
        for (int64_t j = 0; j < g->N; j++) {
            double s = 0, na = 0, nb = 0;
            for (int64_t k = 0; k < g->K; k++) {
                double a = g->ta ? A->d[k * A->ld + i] : A->d[i * A->ld + k];
                double b = g->tb ? B->d[j * B->ld + k] : B->d[k * B->ld + j];
                s += a * b;
                na += a * a;
                nb += b * b;
            }
            double c0 = g->beta != 0 ? g->beta * C->d[i * C->ld + j] : 0.0;
            r[2 * (i * g->N + j)] = g->alpha * s + c0;
            r[2 * (i * g->N + j) + 1] =
                fabs(g->alpha) * sqrt(na * nb) + fabs(c0);
        }
    return r;
}

/* Runs zsk_sgemm on a copy of C; returns the worst error, INFINITY when
 * padding was written or a NaN appeared. */
static double run_case(const gemm_case *g, const mat *A, const mat *B,
                       const mat *C, const double *ref)
{
    size_t n = (size_t)(C->rows * C->ld + 1);
    float *c = malloc(n * sizeof *c);
    memcpy(c, C->f, n * sizeof *c);
    zsk_sgemm(g->ta, g->tb, g->M, g->N, g->K, g->alpha, A->f, A->ld, B->f,
              B->ld, g->beta, c, C->ld);
    double worst = 0;
    for (int64_t i = 0; i < g->M; i++)
        for (int64_t j = 0; j < C->ld; j++) {
            float v = c[i * C->ld + j];
            if (j >= g->N) {
                if (!isnan(v))
                    worst = INFINITY; /* padding overwritten */
                continue;
            }
            const double *r = ref + 2 * (i * g->N + j);
            double e = fabs(v - r[0]) / fmax(1, r[1]);
            if (!(e <= worst))
                worst = isnan(e) ? INFINITY : e;
        }
    free(c);
    return worst;
}

static const zsk_gemm_isa isas[] = {ZSK_GEMM_AVX512, ZSK_GEMM_AVX2, ZSK_GEMM_REF};

/* One shape on every path and thread count. */
static void check_case(const gemm_case *g)
{
    int64_t ar = g->ta ? g->K : g->M, ac = g->ta ? g->M : g->K;
    int64_t br = g->tb ? g->N : g->K, bc = g->tb ? g->K : g->N;
    mat A = mat_new(ar, ac, g->pad, false), B = mat_new(br, bc, g->pad + 1, false);
    mat C = mat_new(g->M, g->N, g->pad + 2, g->beta == 0.0f);
    double *ref = reference(g, &A, &B, &C);
    for (int i = 0; i < 3; i++) {
        if (!zsk_gemm_set_isa(isas[i]))
            continue;
        for (int t = 1; t <= 2; t++) {
            zs_set_num_threads(t);
            double e = run_case(g, &A, &B, &C, ref);
            ZT_CHECK(e <= 1e-5, "sgemm %s, %d threads, ta=%d tb=%d M=%lld "
                     "N=%lld K=%lld pad=%lld alpha=%g beta=%g: error %.3g",
                     zsk_gemm_isa_name(), t, g->ta, g->tb, (long long)g->M,
                     (long long)g->N, (long long)g->K, (long long)g->pad,
                     g->alpha, g->beta, e);
        }
    }
    zsk_gemm_set_isa(ZSK_GEMM_AUTO);
    free(ref);
    mat_free(&A);
    mat_free(&B);
    mat_free(&C);
}

static void test_odd_shapes(void)
{
    int c = 0;
    for (int im = 0; im < NSIZES; im++)
        for (int in = 0; in < NSIZES; in++, c++) {
            gemm_case g = {c & 1, c & 2, sizes[im], sizes[in],
                           sizes[(im + 2 * in) % NSIZES], (c / 4) % 3,
                           alphas[c % 5], betas[(c / 5) % 5]};
            check_case(&g);
        }
    zt_section("sgemm odd shapes, transposes, alpha/beta, padding");
}

/* Every transpose on shapes that cross the MC, KC and NC blocks and the
 * thread split. */
static void test_blocks(void)
{
    static const int64_t shapes[][3] = {
        {200, 70, 600}, {20, 3100, 300}, {170, 513, 257}, {4, 1000, 97},
        {1, 700, 300}, {700, 1, 300}, {2, 2, 700},
    };
    for (int s = 0; s < 7; s++)
        for (int t = 0; t < 4; t++) {
            gemm_case g = {t & 1, t & 2, shapes[s][0], shapes[s][1],
                           shapes[s][2], t % 2 * 3, t == 3 ? -1.5f : 1.0f,
                           t == 2 ? 0.5f : 0.0f};
            check_case(&g);
        }
    zt_section("sgemm across cache blocks and thread splits");
}

/* Every edge micro-kernel instance of the AVX-512 path: M = 14 + m leaves
 * an m-row tile (m = 1..14), N covers one partial vector, one full and
 * two (5, 16, 21, 32 + 9). */
static void test_edge_tiles(void)
{
    static const int64_t ns[] = {5, 16, 21, 41};
    for (int64_t m = 1; m <= 14; m++)
        for (int n = 0; n < 4; n++) {
            gemm_case g = {false, m % 2 == 1, 14 + m, ns[n], 23, 1, 1.0f,
                           n % 2 ? 0.5f : 0.0f};
            check_case(&g);
        }
    zt_section("sgemm edge tiles: every row count, 1 and 2 vectors");
}

static void test_degenerate(void)
{
    float c[4] = {NAN, NAN, NAN, NAN}, a = 1.0f, b = 2.0f;
    zsk_sgemm(false, false, 2, 2, 0, 1.0f, &a, 1, &b, 2, 0.0f, c, 2);
    ZT_CHECK(c[0] == 0 && c[3] == 0, "K = 0, beta = 0 zeroes C");
    float d[2] = {1, 2};
    zsk_sgemm(false, false, 1, 2, 1, 0.0f, &a, 1, d, 2, 3.0f, d, 2);
    ZT_CHECK(d[0] == 3 && d[1] == 6, "alpha = 0 scales C by beta");
    zsk_sgemm(false, false, 0, 5, 3, 1.0f, NULL, 3, NULL, 5, 0.0f, NULL, 5);
    ZT_CHECK(true, "M = 0 touches nothing");
    zt_section("sgemm degenerate sizes");
}

static void test_dgemm(void)
{
    for (int t = 0; t < 4; t++) {
        int64_t M = 33, N = 17, K = 65;
        bool ta = t & 1, tb = t & 2;
        int64_t lda = (ta ? M : K) + 2, ldb = (tb ? K : N) + 1, ldc = N + 3;
        double *A = malloc((size_t)((ta ? K : M) * lda) * sizeof *A);
        double *B = malloc((size_t)((tb ? N : K) * ldb) * sizeof *B);
        double *C = malloc((size_t)(M * ldc) * sizeof *C);
        for (int64_t i = 0; i < (ta ? K : M) * lda; i++)
            A[i] = urand();
        for (int64_t i = 0; i < (tb ? N : K) * ldb; i++)
            B[i] = urand();
        for (int64_t i = 0; i < M * ldc; i++)
            C[i] = NAN;
        zsk_dgemm(ta, tb, M, N, K, 2.0, A, lda, B, ldb, 0.0, C, ldc);
        double worst = 0;
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) {
                double s = 0;
                for (int64_t k = 0; k < K; k++)
                    s += (ta ? A[k * lda + i] : A[i * lda + k]) *
                         (tb ? B[j * ldb + k] : B[k * ldb + j]);
                double e = fabs(C[i * ldc + j] - 2.0 * s);
                worst = isnan(e) || e > worst ? (isnan(e) ? INFINITY : e) : worst;
            }
        ZT_CHECK(worst <= 1e-12, "dgemm ta=%d tb=%d: error %.3g", ta, tb, worst);
        free(A);
        free(B);
        free(C);
    }
    zt_section("dgemm transposes, padding, NaN in C");
}

/* One descriptor on one shape: inputs rounded to its type, A and B with
 * leading dimensions padded by 3, C with NaN when beta == 0. Returns the
 * number of elements off the float64 reference. */
static int64_t run_desc(const zsk_gemm_desc *d, bool ta, bool tb, int64_t M,
                        int64_t N, int64_t K, float alpha, float beta,
                        bool bias)
{
    int64_t lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 3, ldc = N + 2;
    int64_t na = (ta ? K : M) * lda, nb = (tb ? N : K) * ldb;
    bool half = d->type != ZSK_GEMM_F32;
    size_t nc = (size_t)(M * ldc);
    float *af = malloc((size_t)na * sizeof *af);
    float *bf = malloc((size_t)nb * sizeof *bf);
    uint16_t *ah = malloc((size_t)na * 2), *bh = malloc((size_t)nb * 2);
    float *C = malloc(nc * sizeof *C), *C0 = malloc(nc * sizeof *C0);
    float *bv = malloc((size_t)N * sizeof *bv);
    for (int p = 0; p < 2; p++) {
        int64_t n = p ? nb : na;
        float *x = p ? bf : af;
        uint16_t *h = p ? bh : ah;
        for (int64_t i = 0; i < n; i++) {
            float v = urand();
            if (d->type == ZSK_GEMM_BF16) {
                h[i] = zs_f32_to_bf16(v);
                v = zs_bf16_to_f32(h[i]);
            } else if (d->type == ZSK_GEMM_F16) {
                h[i] = zs_f32_to_f16(v);
                v = zs_f16_to_f32(h[i]);
            }
            x[i] = v;
        }
    }
    for (int64_t i = 0; i < M * ldc; i++)
        C[i] = C0[i] = beta == 0 ? NAN : urand();
    for (int64_t j = 0; j < N; j++)
        bv[j] = urand();
    zsk_epilogue ep = {.bias = bv};
    zsk_gemm_run(d, ta, tb, M, N, K, alpha, half ? (const void *)ah : af, lda,
                 half ? (const void *)bh : bf, ldb, beta, C, ldc,
                 bias ? &ep : NULL);
    int64_t bad = 0;
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            double sum = 0, na2 = 0, nb2 = 0;
            for (int64_t k = 0; k < K; k++) {
                double a = af[ta ? k * lda + i : i * lda + k];
                double b = bf[tb ? j * ldb + k : k * ldb + j];
                sum += a * b;
                na2 += a * a;
                nb2 += b * b;
            }
            double c0 = beta == 0 ? 0 : (double)beta * C0[i * ldc + j];
            double ref = alpha * sum + c0 + (bias ? bv[j] : 0.0);
            double mag = fabs((double)alpha) * sqrt(na2 * nb2) + fabs(c0) +
                         (bias ? fabs(bv[j]) : 0.0);
            double got = C[i * ldc + j];
            bad += !(fabs(got - ref) <= 1e-5 * (mag > 1 ? mag : 1));
        }
    free(af);
    free(bf);
    free(ah);
    free(bh);
    free(C);
    free(C0);
    free(bv);
    return bad;
}

/* Every descriptor the CPU runs, on odd shapes around its tile. */
static void test_descriptors(void)
{
    const zsk_gemm_desc *ds[16];
    int nd = zsk_gemm_descs(ds, 16);
    static const int64_t MS[] = {1, 3, 13, 15, 29, 45};
    static const int64_t NS[] = {1, 5, 17, 33, 47, 70};
    static const int64_t KS[] = {1, 7, 64, 131};
    for (int t = 1; t <= 2; t++) {
        zs_set_num_threads(t);
        for (int di = 0; di < nd; di++) {
            int64_t n = 0, bad = 0, cases = 0;
            for (int mi = 0; mi < 6; mi++)
                for (int ni = 0; ni < 6; ni++)
                    for (int ki = 0; ki < 4; ki++, n++) {
                        int tr = (int)(n % 4);
                        float alpha = n % 5 == 3 ? -1.5f : 1.0f;
                        float beta = n % 3 == 0 ? 0.0f : 0.5f;
                        uint64_t seed = rng_state;
                        int64_t b = run_desc(ds[di], tr & 1, tr >> 1, MS[mi],
                                             NS[ni], KS[ki], alpha, beta,
                                             n % 4 == 1);
                        cases++;
                        bad += b;
                        ZT_CHECK(b == 0,
                                 "%s threads=%d ta=%d tb=%d M=%lld N=%lld "
                                 "K=%lld alpha=%g beta=%g seed=%llu: %lld "
                                 "bad elements\n",
                                 ds[di]->name, t, tr & 1, tr >> 1,
                                 (long long)MS[mi], (long long)NS[ni],
                                 (long long)KS[ki], alpha, beta,
                                 (unsigned long long)seed, (long long)b);
                    }
            printf("  %-24s %d thread(s): %lld shapes, %lld bad\n",
                   ds[di]->name, t, (long long)cases, (long long)bad);
        }
    }
    zt_section("every (type, ISA) descriptor vs float64: odd shapes, edge "
               "tiles, transposes, alpha/beta, bias epilogue, 1-2 threads");
}

int main(void)
{
    int threads = zs_num_threads();
    printf("best path: %s\n", zsk_gemm_isa_name());
    test_odd_shapes();
    test_blocks();
    test_edge_tiles();
    test_degenerate();
    test_dgemm();
    test_descriptors();
    zs_set_num_threads(threads);
    return zt_done();
}
