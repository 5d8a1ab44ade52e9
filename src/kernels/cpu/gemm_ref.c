/*
 * gemm_ref.c - portable GEMM: parallel over rows of C, K-blocked, with an
 * i-k-j loop order that the compiler vectorises along N (ZSK_CLONES).
 * Correct for all transposes and strides. It is zsk_dgemm, and zsk_sgemm
 * on CPUs without AVX2+FMA (and the fallback when packing buffers cannot be
 * allocated); tests/kernels/test_gemm.c runs it beside the packed paths.
 *
 * Also the scalar epilogue (zsk_sgemm_epi_ref) used by every path but the
 * AVX-512 one: evaluated per element in double (GeLU as v sigmoid(2u), the
 * same function as 0.5 v (1 + tanh u) without cancellation for v < 0).
 */
#include <math.h>

#include "kernels/cpu/gemm.h"

#include "kernels/cpu/kernels.h"

#define KB 256

/* sqrt(2/pi) and 0.044715, the tanh-form GeLU constants */
#define GELU_S 0.7978845608028654
#define GELU_K 0.044715

static float gelu_ref(float x)
{
    double v = x, u = GELU_S * (v + GELU_K * v * v * v);
    return (float)(v / (1.0 + exp(-2.0 * u)));
}

void zsk_sgemm_epi_ref(const float *t, int64_t ldt, int64_t m, int64_t n,
                       float *c, int64_t ldc, float beta,
                       const zsk_epilogue *ep)
{
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            float v = t[i * ldt + j];
            if (beta != 0.0f)
                v += beta * c[i * ldc + j];
            if (ep && ep->bias)
                v += ep->bias[j];
            if (ep && ep->gelu) {
                if (ep->pre)
                    ep->pre[i * ep->ldp + j] = v;
                v = gelu_ref(v);
            }
            if (ep && ep->res)
                v += ep->res[i * ep->ldr + j];
            c[i * ldc + j] = v;
        }
}

/* EPI(ctx, i, crow) runs once row i of C is complete. */
#define DEFINE_GEMM(T, NAME, EPI)                                             \
    typedef struct NAME##_ctx {                                               \
        bool ta, tb;                                                          \
        int64_t M, N, K, lda, ldb, ldc;                                       \
        T alpha, beta;                                                        \
        const T *A, *B;                                                       \
        T *C;                                                                 \
        const zsk_epilogue *ep;                                               \
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
            EPI(c, i, crow);                                                  \
        }                                                                     \
    }

#define EPI_NONE(c, i, crow) (void)0
#define EPI_F32(c, i, crow)                                                   \
    do {                                                                      \
        zsk_epilogue at_;                                                     \
        if (c->ep)                                                            \
            zsk_sgemm_epi_ref(crow, c->ldc, 1, c->N, crow, c->ldc, 0.0f,      \
                              zsk_epilogue_at(c->ep, i, 0, &at_));            \
    } while (0)

DEFINE_GEMM(float, sg, EPI_F32)
DEFINE_GEMM(double, dg, EPI_NONE)

void zsk_sgemm_ref(bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                   float alpha, const float *A, int64_t lda, const float *B,
                   int64_t ldb, float beta, float *C, int64_t ldc,
                   const zsk_epilogue *ep)
{
    sg_ctx c = {ta, tb, M, N, K, lda, ldb, ldc, alpha, beta, A, B, C, ep};
    zs_parallel_for(M, 1 + 65536 / (N * (K + 1) + 1), sg_rows, &c);
}

void zsk_dgemm_ref(bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                   double alpha, const double *A, int64_t lda,
                   const double *B, int64_t ldb, double beta, double *C,
                   int64_t ldc)
{
    dg_ctx c = {ta, tb, M, N, K, lda, ldb, ldc, alpha, beta, A, B, C, NULL};
    zs_parallel_for(M, 1 + 65536 / (N * (K + 1) + 1), dg_rows, &c);
}
