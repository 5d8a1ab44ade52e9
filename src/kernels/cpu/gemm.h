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

/* Portable row-parallel GEMMs (any transposes, strides, beta). */
void zsk_sgemm_ref(bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                   float alpha, const float *A, int64_t lda, const float *B,
                   int64_t ldb, float beta, float *C, int64_t ldc);
void zsk_dgemm_ref(bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                   double alpha, const double *A, int64_t lda,
                   const double *B, int64_t ldb, double beta, double *C,
                   int64_t ldc);

#endif
