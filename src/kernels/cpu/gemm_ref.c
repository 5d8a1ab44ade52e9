/*
 * gemm_ref.c - portable GEMM: parallel over rows of C, K-blocked, with an
 * i-k-j loop order that the compiler vectorises along N (ZSK_CLONES).
 * Correct for all transposes and strides. It is zsk_dgemm, and zsk_sgemm
 * on CPUs without AVX2+FMA (and the fallback when packing buffers cannot be
 * allocated); tests/kernels/test_gemm.c runs it beside the packed paths.
 */
#include "kernels/cpu/gemm.h"

#include "kernels/cpu/kernels.h"

#define KB 256

#define DEFINE_GEMM(T, NAME)                                                  \
    typedef struct NAME##_ctx {                                               \
        bool ta, tb;                                                          \
        int64_t M, N, K, lda, ldb, ldc;                                       \
        T alpha, beta;                                                        \
        const T *A, *B;                                                       \
        T *C;                                                                 \
    } NAME##_ctx;                                                             \
    ZSK_CLONES static void NAME##_rows(void *p, int64_t i0, int64_t i1)       \
    {                                                                         \
        const NAME##_ctx *c = p;                                              \
        for (int64_t i = i0; i < i1; i++) {                                   \
            T *restrict crow = c->C + i * c->ldc;                             \
            for (int64_t j = 0; j < c->N; j++)                                \
                crow[j] = c->beta == 0 ? 0 : c->beta * crow[j];               \
            for (int64_t k0 = 0; k0 < c->K; k0 += KB) {                       \
                int64_t k1 = k0 + KB < c->K ? k0 + KB : c->K;                 \
                for (int64_t k = k0; k < k1; k++) {                           \
                    T a = c->alpha * (c->ta ? c->A[k * c->lda + i]            \
                                            : c->A[i * c->lda + k]);          \
                    if (!c->tb) {                                             \
                        const T *restrict brow = c->B + k * c->ldb;           \
                        for (int64_t j = 0; j < c->N; j++)                    \
                            crow[j] += a * brow[j];                           \
                    } else {                                                  \
                        for (int64_t j = 0; j < c->N; j++)                    \
                            crow[j] += a * c->B[j * c->ldb + k];              \
                    }                                                         \
                }                                                             \
            }                                                                 \
        }                                                                     \
    }

DEFINE_GEMM(float, sg)
DEFINE_GEMM(double, dg)

void zsk_sgemm_ref(bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                   float alpha, const float *A, int64_t lda, const float *B,
                   int64_t ldb, float beta, float *C, int64_t ldc)
{
    sg_ctx c = {ta, tb, M, N, K, lda, ldb, ldc, alpha, beta, A, B, C};
    zs_parallel_for(M, 1 + 65536 / (N * (K + 1) + 1), sg_rows, &c);
}

void zsk_dgemm_ref(bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                   double alpha, const double *A, int64_t lda,
                   const double *B, int64_t ldb, double beta, double *C,
                   int64_t ldc)
{
    dg_ctx c = {ta, tb, M, N, K, lda, ldb, ldc, alpha, beta, A, B, C};
    zs_parallel_for(M, 1 + 65536 / (N * (K + 1) + 1), dg_rows, &c);
}
