/*
 * kernels/cpu/gemm_lowp.h - GEMM with 16-bit float inputs (bf16, IEEE
 * half), float32 accumulation and float32 output, on raw pointers.
 *
 * C = alpha * op(A) * op(B) + beta * C, row-major, op(X) = X or X^T, the
 * same contract as zsk_sgemm (kernels/cpu/gemm.h): op(A) is M x K, op(B) is
 * K x N, C is M x N; lda/ldb/ldc are row strides in elements of the matrices
 * as stored (A is M x K, or K x M when ta). beta == 0 ignores C's old
 * contents (NaN included); alpha == 0 or K == 0 only scales C by beta.
 * Multithreaded over the pool. A and B hold raw 16-bit patterns.
 *
 * Both run the generic GEMM driver of gemm.c with the descriptor of their
 * type (gemm.h): AVX-512 packers and kernels in gemm_bf16_avx512.c
 * (vdpbf16ps on bf16 pairs, or the f32 kernel of gemm_f32_avx512.c on
 * panels converted from bf16/f16 while packing), portable ones in
 * gemm_ref.c.
 */
#ifndef ZS_KERNELS_CPU_GEMM_LOWP_H
#define ZS_KERNELS_CPU_GEMM_LOWP_H

#include <stdbool.h>
#include <stdint.h>

void zsk_gemm_bf16(bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                   float alpha, const uint16_t *A, int64_t lda,
                   const uint16_t *B, int64_t ldb, float beta, float *C,
                   int64_t ldc);
/* zsk_gemm_bf16 followed by the epilogue ep (gemm.h: zsk_epilogue; NULL:
 * none). With ep->out16 the bf16 result goes there and C is not written:
 * the f32 sums stay in a per-thread block of the driver, the epilogue
 * (a linear layer's bias, GeLU and residual in f32) runs on each block
 * once its K sum is complete and rounds it to bf16 once; C (M x N, ldc)
 * is read only for beta != 0 and may be NULL when beta == 0. */
typedef struct zsk_epilogue zsk_epilogue;
void zsk_gemm_bf16_ex(bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                      float alpha, const uint16_t *A, int64_t lda,
                      const uint16_t *B, int64_t ldb, float beta, float *C,
                      int64_t ldc, const zsk_epilogue *ep);
void zsk_gemm_f16(bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                  float alpha, const uint16_t *A, int64_t lda,
                  const uint16_t *B, int64_t ldb, float beta, float *C,
                  int64_t ldc);
/* zsk_gemm_f16 followed by the epilogue ep, as zsk_gemm_bf16_ex; ep's
 * 16-bit forms are IEEE halves (set ep->f16). */
void zsk_gemm_f16_ex(bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                     float alpha, const uint16_t *A, int64_t lda,
                     const uint16_t *B, int64_t ldb, float beta, float *C,
                     int64_t ldc, const zsk_epilogue *ep);

/* Test hook: when set, both GEMMs take the portable C path (packing to f32
 * and a plain-C micro-kernel) whatever the CPU supports. */
extern bool zsk_lowp_force_fallback;
/* Test hook: when set, bf16 on AVX-512 converts to f32 panels and uses the
 * FMA kernel (the path of CPUs without AVX512_BF16). */
extern bool zsk_lowp_force_bf16_as_f32;

#endif
