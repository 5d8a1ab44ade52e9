/*
 * test_gemm_lowp.c - zsk_gemm_bf16 / zsk_gemm_f16 against a float64
 * reference computed from the same 16-bit inputs.
 *
 * The inputs are exact in f32 and their products are exact in f32 too
 * (8- or 11-bit mantissas), so the only error is f32 accumulation (order,
 * blocking) and the alpha/beta epilogue: each element must lie within
 * 1e-5 * (|alpha| * sum_k |a_ik b_kj| + |beta c_ij|) of the reference.
 * Cases: odd shapes (all combinations of 1..129 for M and N with several K,
 * odd K included: vdpbf16ps works on k pairs), all four transposes, alpha /
 * beta (beta == 0 with NaN in C), ld > columns (padding must stay
 * untouched), several cache blocks in M, N and K, 1 and 2 threads, and the
 * portable path forced through zsk_lowp_force_fallback, and bf16 through
 * f32 panels (CPUs without AVX512_BF16) via zsk_lowp_force_bf16_as_f32.
 */
#include <stdlib.h>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/gemm_lowp.h"
#include "testutil.h"

#define TOL 1e-5
#define SENTINEL 12345.0f

typedef enum fmt { BF16, F16 } fmt;

typedef struct gcase {
    fmt f;
    bool ta, tb;
    int64_t M, N, K;
    float alpha, beta;
    int64_t pad; /* extra elements per row of A, B, C */
    uint64_t seed;
} gcase;

static uint64_t rng_next(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 33;
}

/* Uniform [-1, 1) rounded to the 16-bit format. */
static uint16_t rand16(fmt f, uint64_t *s)
{
    float x = (float)rng_next(s) / 2147483648.0f * 2.0f - 1.0f;
    return f == BF16 ? zs_f32_to_bf16(x) : zs_f32_to_f16(x);
}

static double val16(fmt f, uint16_t h)
{
    return f == BF16 ? zs_bf16_to_f32(h) : zs_f16_to_f32(h);
}

/* Runs one case; returns the number of bad elements (0 = pass). */
static int64_t run_case(const gcase *c)
{
    uint64_t s = c->seed;
    int64_t ar = c->ta ? c->K : c->M, ac = c->ta ? c->M : c->K;
    int64_t br = c->tb ? c->N : c->K, bc = c->tb ? c->K : c->N;
    int64_t lda = ac + c->pad, ldb = bc + c->pad, ldc = c->N + c->pad;
    uint16_t *A = malloc((size_t)(ar * lda + 1) * sizeof *A);
    uint16_t *B = malloc((size_t)(br * ldb + 1) * sizeof *B);
    float *C = malloc((size_t)(c->M * ldc + 1) * sizeof *C);
    float *C0 = malloc((size_t)(c->M * ldc + 1) * sizeof *C0);
    for (int64_t i = 0; i < ar * lda; i++)
        A[i] = rand16(c->f, &s);
    for (int64_t i = 0; i < br * ldb; i++)
        B[i] = rand16(c->f, &s);
    for (int64_t i = 0; i < c->M * ldc; i++) {
        bool pad = i % ldc >= c->N;
        C0[i] = pad ? SENTINEL : c->beta == 0 ? NAN : (float)val16(c->f, rand16(c->f, &s));
        C[i] = C0[i];
    }
    void (*gemm)(bool, bool, int64_t, int64_t, int64_t, float,
                 const uint16_t *, int64_t, const uint16_t *, int64_t, float,
                 float *, int64_t) = c->f == BF16 ? zsk_gemm_bf16 : zsk_gemm_f16;
    gemm(c->ta, c->tb, c->M, c->N, c->K, c->alpha, A, lda, B, ldb, c->beta, C,
         ldc);
    /* op(A) as M x K and op(B) transposed as N x K, in double */
    double *a = malloc((size_t)(c->M * c->K + 1) * sizeof *a);
    double *b = malloc((size_t)(c->N * c->K + 1) * sizeof *b);
    for (int64_t i = 0; i < c->M; i++)
        for (int64_t k = 0; k < c->K; k++)
            a[i * c->K + k] = val16(c->f, c->ta ? A[k * lda + i] : A[i * lda + k]);
    for (int64_t j = 0; j < c->N; j++)
        for (int64_t k = 0; k < c->K; k++)
            b[j * c->K + k] = val16(c->f, c->tb ? B[j * ldb + k] : B[k * ldb + j]);
    int64_t bad = 0;
    for (int64_t i = 0; i < c->M; i++)
        for (int64_t j = 0; j < ldc; j++) {
            float got = C[i * ldc + j];
            if (j >= c->N) {
                bad += got != SENTINEL;
                continue;
            }
            double sum = 0, mag = 0;
            const double *ai = a + i * c->K, *bj = b + j * c->K;
            for (int64_t k = 0; k < c->K; k++) {
                sum += ai[k] * bj[k];
                mag += fabs(ai[k] * bj[k]);
            }
            double c0 = c->beta == 0 ? 0 : (double)c->beta * C0[i * ldc + j];
            double ref = (double)c->alpha * sum + c0;
            double tol = TOL * (fabs((double)c->alpha) * mag + fabs(c0)) + 1e-30;
            bad += !(fabs(got - ref) <= tol);
        }
    free(a);
    free(b);
    free(A);
    free(B);
    free(C);
    free(C0);
    return bad;
}

static void check_case(const gcase *c)
{
    int64_t bad = run_case(c);
    ZT_CHECK(bad == 0,
             "%s ta=%d tb=%d M=%lld N=%lld K=%lld alpha=%g beta=%g pad=%lld "
             "seed=%llu threads=%d fallback=%d: %lld bad elements\n",
             c->f == BF16 ? "bf16" : "f16", c->ta, c->tb, (long long)c->M,
             (long long)c->N, (long long)c->K, c->alpha, c->beta,
             (long long)c->pad, (unsigned long long)c->seed,
             zs_num_threads(), zsk_lowp_force_fallback, (long long)bad);
}

static const int64_t SIZES[] = {1, 2, 3, 7, 15, 16, 17, 31, 33, 65, 129};
#define NSIZES (int)(sizeof SIZES / sizeof *SIZES)
static const int64_t KS[] = {1, 2, 3, 16, 33, 129};
#define NKS (int)(sizeof KS / sizeof *KS)
static const float ALPHA_BETA[][2] = {{1, 0}, {0.5f, 1}, {-1.5f, -0.25f}, {1, 1}};

/* Every M x N of SIZES with every K of KS (stride picks a subset). */
static void odd_shapes(fmt f, int stride)
{
    uint64_t seed = 1;
    int n = 0;
    for (int t = 0; t < 4; t++)
        for (int m = 0; m < NSIZES; m++)
            for (int nn = 0; nn < NSIZES; nn++)
                for (int k = 0; k < NKS; k++, n++) {
                    if (n % stride)
                        continue;
                    const float *ab = ALPHA_BETA[n % 4];
                    gcase c = {f, t & 1, t >> 1, SIZES[m], SIZES[nn], KS[k],
                               ab[0], ab[1], n % 3, seed++};
                    check_case(&c);
                }
}

/* Shapes spanning several cache blocks (MC, NC, KU) and thread splits. */
static void large_shapes(fmt f)
{
    static const int64_t SH[][3] = {
        {150, 70, 1101}, {1, 2100, 97}, {500, 33, 40},
        {45, 4200, 9},   {3, 300, 1025}, {129, 259, 520}, {4, 300, 67},
    };
    for (int i = 0; i < 7; i++)
        for (int t = 0; t < 4; t++) {
            const float *ab = ALPHA_BETA[(i + t) % 4];
            gcase c = {f, t & 1, t >> 1, SH[i][0], SH[i][1], SH[i][2],
                       ab[0], ab[1], (i + t) % 2 ? 5 : 0, 100 + (uint64_t)i};
            check_case(&c);
        }
}

static void edge_cases(fmt f)
{
    /* K == 0 and alpha == 0 scale C by beta (beta == 0 clears NaN). */
    gcase k0 = {f, false, false, 5, 7, 0, 1, 0.5f, 1, 7};
    check_case(&k0);
    gcase k0z = {f, true, true, 5, 7, 0, 1, 0, 0, 8};
    check_case(&k0z);
    gcase a0 = {f, false, true, 9, 33, 17, 0, -2, 2, 9};
    check_case(&a0);
    float c = 3;
    zsk_gemm_bf16(false, false, 0, 1, 4, 1, NULL, 4, NULL, 1, 0, &c, 1);
    zsk_gemm_f16(false, false, 1, 0, 4, 1, NULL, 4, NULL, 1, 0, &c, 1);
    ZT_CHECK(c == 3, "M == 0 / N == 0 leave C alone");
}

static void suite(const char *name, int stride, bool large)
{
    for (int f = 0; f < 2; f++) {
        odd_shapes((fmt)f, stride);
        if (large)
            large_shapes((fmt)f);
        edge_cases((fmt)f);
    }
    zt_section(name);
}

int main(void)
{
    printf("paths (ZS_CPU_ISA caps them): %s, %s\n",
           zsk_gemm_desc_for(ZSK_GEMM_BF16)->name,
           zsk_gemm_desc_for(ZSK_GEMM_F16)->name);
    zs_set_num_threads(2);
    suite("bf16/f16 gemm, 2 threads: odd shapes, transposes, alpha/beta, ld, blocks", 2, true);
    zs_set_num_threads(1);
    suite("bf16/f16 gemm, 1 thread", 7, true);
    zsk_lowp_force_bf16_as_f32 = true;
    suite("bf16/f16 gemm, bf16 through f32 panels (no AVX512_BF16), 2 threads", 5, true);
    zsk_lowp_force_bf16_as_f32 = false;
    zsk_lowp_force_fallback = true;
    suite("bf16/f16 gemm, portable fallback forced, 1 thread", 9, true);
    zs_set_num_threads(2);
    suite("bf16/f16 gemm, portable fallback forced, 2 threads", 9, false);
    zsk_lowp_force_fallback = false;
    return zt_done();
}
