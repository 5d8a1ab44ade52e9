/*
 * kernels/cpu/gemm.h - general matrix multiply on raw pointers.
 *
 * C = alpha * op(A) * op(B) + beta * C, row-major, op(X) = X or X^T.
 * op(A) is M x K, op(B) is K x N, C is M x N; lda/ldb/ldc are row strides
 * in elements of the matrices as stored (A is M x K, or K x M when ta).
 * beta == 0 ignores C's old contents (NaN included). Multithreaded.
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

#endif
