/*
 * kernels/cpu/gemm.h - general matrix multiply on raw pointers.
 *
 * C = alpha * op(A) * op(B) + beta * C, row-major, op(X) = X or X^T.
 * op(A) is M x K, op(B) is K x N, C is M x N; lda/ldb/ldc are row strides
 * in elements of the matrices as stored (A is M x K, or K x M when ta).
 * beta == 0 ignores C's old contents (NaN included). Multithreaded over the
 * pool (serial when called from a pool task).
 *
 * zsk_sgemm is a BLIS-style packed GEMM (gemm.c) over an AVX-512 or
 * AVX2+FMA micro-kernel (gemm_avx512.c, gemm_avx2.c) chosen at run time,
 * with a portable fallback (gemm_ref.c); zsk_dgemm is the portable code.
 * zsk_sgemm_ex adds a fused epilogue (bias, GeLU, residual) applied to each
 * block of C right after its last K block, while the block is in cache, so
 * C goes to memory once and no separate elementwise pass runs.
 */
#ifndef ZS_KERNELS_CPU_GEMM_H
#define ZS_KERNELS_CPU_GEMM_H

#include <stdbool.h>
#include <stdint.h>

void zsk_sgemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
               const float *A, int64_t lda, const float *B, int64_t ldb,
               float beta, float *C, int64_t ldc);
void zsk_dgemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K,
               double alpha, const double *A, int64_t lda, const double *B,
               int64_t ldb, double beta, double *C, int64_t ldc);

/* Epilogue of zsk_sgemm_ex. With v = alpha op(A) op(B) + beta C[i, j]
 * (the full sum over K), each element of C gets, in this order:
 *   v += bias[j]                  bias != NULL, length N
 *   pre[i * ldp + j] = v          gelu and pre != NULL (for backward)
 *   v = gelu_tanh(v)              gelu: 0.5 v (1 + tanh(sqrt(2/pi)
 *                                       (v + 0.044715 v^3)))
 *   v += res[i * ldr + j]         res != NULL, M x N
 *   C[i * ldc + j] = v
 * pre and res must not overlap C (K blocks write partial sums to C before
 * the last one applies the epilogue); for an in-place residual use
 * beta = 1. Borrowed pointers. */
typedef struct zsk_epilogue {
    const float *bias;
    bool gelu;
    float *pre;
    int64_t ldp;
    const float *res;
    int64_t ldr;
} zsk_epilogue;

/* zsk_sgemm followed by the epilogue ep (NULL: plain zsk_sgemm). */
void zsk_sgemm_ex(bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                  float alpha, const float *A, int64_t lda, const float *B,
                  int64_t ldb, float beta, float *C, int64_t ldc,
                  const zsk_epilogue *ep);

/* gelu_tanh(x) in float, portable (evaluated in double) or AVX-512
 * (vector: ignored when the CPU lacks it); for tests. */
void zsk_gelu_tanh_f32(float *y, const float *x, int64_t n, bool vector);
/* tanh(x), the AVX-512 routine of the epilogue (falls back to libm when the
 * CPU lacks it); relative error < 1e-6. For tests. */
void zsk_tanh_f32_avx512(float *y, const float *x, int64_t n);

/* ---- implementation interface (gemm*.c, tests, bench) ----------------- */

typedef enum zsk_gemm_isa {
    ZSK_GEMM_AUTO = 0, /* best the CPU supports */
    ZSK_GEMM_REF,      /* portable C */
    ZSK_GEMM_AVX2,     /* AVX2 + FMA micro-kernel */
    ZSK_GEMM_AVX512,   /* AVX-512F micro-kernel */
} zsk_gemm_isa;

/* Forces the SGEMM code path (tests, benchmarks); false (and no change)
 * when the CPU lacks it. Not thread-safe against running GEMMs. */
bool zsk_gemm_set_isa(zsk_gemm_isa isa);
/* Name of the path in use, e.g. "avx512 14x32". */
const char *zsk_gemm_isa_name(void);

/* A micro-kernel computes one MR x NR tile of C from packed panels:
 * a[k * MR + i] (alpha already applied) and b[k * NR + j], k < kc (b is
 * 64-byte aligned), then c[i * ldc + j] = acc + beta * c (beta == 0: c is
 * not read) for i < m <= MR, j < n <= NR. */
typedef void (*zsk_sgemm_ukr_fn)(int64_t kc, const float *a, const float *b,
                                 float *c, int64_t ldc, float beta, int m,
                                 int n);
typedef struct zsk_sgemm_ukr {
    const char *name;
    int mr, nr;
    zsk_sgemm_ukr_fn run;
} zsk_sgemm_ukr;

extern const zsk_sgemm_ukr zsk_sgemm_ukr_avx512;
extern const zsk_sgemm_ukr zsk_sgemm_ukr_avx2;

/* Writes c[i * ldc + j] = epilogue(t[i * ldt + j] + beta * c[i * ldc + j])
 * for i < m, j < n (beta == 0: c is not read; ep NULL: no epilogue); ep's
 * pointers are offset to the block's origin. t may be c itself
 * (ldt == ldc). Single-threaded: portable scalar code (gemm_ref.c) and
 * AVX-512 (gemm_avx512.c). */
typedef void (*zsk_sgemm_epi_fn)(const float *t, int64_t ldt, int64_t m,
                                 int64_t n, float *c, int64_t ldc, float beta,
                                 const zsk_epilogue *ep);
void zsk_sgemm_epi_ref(const float *t, int64_t ldt, int64_t m, int64_t n,
                       float *c, int64_t ldc, float beta,
                       const zsk_epilogue *ep);
void zsk_sgemm_epi_avx512(const float *t, int64_t ldt, int64_t m, int64_t n,
                          float *c, int64_t ldc, float beta,
                          const zsk_epilogue *ep);
/* ep with its pointers moved to element (i, j) of C, in *out; NULL when ep
 * is NULL. */
const zsk_epilogue *zsk_epilogue_at(const zsk_epilogue *ep, int64_t i,
                                    int64_t j, zsk_epilogue *out);

/* Portable row-parallel GEMMs (any transposes, strides, beta; the f32 one
 * applies ep, which may be NULL, to each finished row). */
void zsk_sgemm_ref(bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                   float alpha, const float *A, int64_t lda, const float *B,
                   int64_t ldb, float beta, float *C, int64_t ldc,
                   const zsk_epilogue *ep);
void zsk_dgemm_ref(bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                   double alpha, const double *A, int64_t lda,
                   const double *B, int64_t ldb, double beta, double *C,
                   int64_t ldc);

#endif
