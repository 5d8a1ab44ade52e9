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
 * Layout of the implementation (BLIS-style, see gemm_lowp.c): a portable
 * driver packs blocks of op(A) and op(B) into panels of 4-byte units and
 * calls a register-blocked micro-kernel; gemm_lowp_avx512.c holds the
 * AVX-512 packers and micro-kernels (vdpbf16ps on bf16 pairs, or f32 FMA on
 * panels converted from bf16/f16).
 */
#ifndef ZS_KERNELS_CPU_GEMM_LOWP_H
#define ZS_KERNELS_CPU_GEMM_LOWP_H

#include <stdbool.h>
#include <stdint.h>

void zsk_gemm_bf16(bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                   float alpha, const uint16_t *A, int64_t lda,
                   const uint16_t *B, int64_t ldb, float beta, float *C,
                   int64_t ldc);
void zsk_gemm_f16(bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                  float alpha, const uint16_t *A, int64_t lda,
                  const uint16_t *B, int64_t ldb, float beta, float *C,
                  int64_t ldc);

/* Test hook: when set, both GEMMs take the portable C path (packing to f32
 * and a plain-C micro-kernel) whatever the CPU supports. */
extern bool zsk_lowp_force_fallback;
/* Test hook: when set, bf16 on AVX-512 converts to f32 panels and uses the
 * FMA kernel (the path of CPUs without AVX512_BF16). */
extern bool zsk_lowp_force_bf16_as_f32;

/* ---- internal to gemm_lowp*.c ---------------------------------------- */

/* A matrix view for packing: element (r, k) of the rows being packed is
 * X[r * rs + k * ks] (rows of op(A), or columns of op(B)). For every
 * transpose one of rs, ks is 1, which is all the packers handle. */
typedef struct zsk_lowp_src {
    const uint16_t *x;
    int64_t rs, ks;
} zsk_lowp_src;

/* Packs rows [0, rows) and k [0, kc) of src into panels of w rows: panel p
 * holds units [u][r] (u = k unit, r < w) of 4 bytes, a bf16 pair (k = 2u in
 * the low half, 2u+1 in the high half) for pair packers or one f32 for f32
 * packers. Rows past `rows` and k past kc are zero. */
typedef void (*zsk_lowp_pack_fn)(zsk_lowp_src src, int64_t rows, int64_t kc,
                                 int w, uint32_t *out);
/* C tile (mr x nr valid of MR x NR) = alpha * a_panel . b_panel + beta * C
 * over ku units; beta == 0 does not read C. */
typedef void (*zsk_lowp_kernel_fn)(int64_t ku, const uint32_t *a,
                                   const uint32_t *b, float *c, int64_t ldc,
                                   int mr, int nr, float alpha, float beta);

/* Skinny path, M <= ZSK_LOWP_SMALL_M, no packing of B:
 * C[0:M, n0:n1] = alpha * a . op(B)[:, n0:n1] + beta * C, where a is op(A)
 * as a dense M x lda buffer: bf16 with K zero-padded to even for pair
 * schemes (kstep 2), f32 for f32 schemes; b views the columns of op(B). */
#define ZSK_LOWP_SMALL_M 4
typedef void (*zsk_lowp_small_fn)(int M, int64_t n0, int64_t n1, int64_t K,
                                  float alpha, const void *a, int64_t lda,
                                  zsk_lowp_src b, float beta, float *C,
                                  int64_t ldc);

typedef struct zsk_lowp_scheme {
    const char *name;
    int mr, nr;    /* register block */
    int kstep;     /* k elements per unit: 2 (bf16 pairs) or 1 (f32) */
    int kub, mcb, ncb; /* cache blocks: k units, rows of A, columns of B */
    zsk_lowp_pack_fn pack_a, pack_b;
    zsk_lowp_kernel_fn kernel;
    zsk_lowp_small_fn small; /* NULL: small M goes through the packed path */
} zsk_lowp_scheme;

/* AVX-512 schemes (gemm_lowp_avx512.c); NULL where the CPU lacks them. */
const zsk_lowp_scheme *zsk_lowp_scheme_bf16_avx512(void);
const zsk_lowp_scheme *zsk_lowp_scheme_f16_avx512(void);

#endif
