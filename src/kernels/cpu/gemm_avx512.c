/*
 * gemm_avx512.c - AVX-512 SGEMM micro-kernels (see gemm.h for the packed
 * panel contract).
 *
 * A tile of MR rows x NV*16 columns lives in MR*NV zmm accumulators; per k
 * the kernel loads NV vectors of the B panel and broadcasts MR values of the
 * A panel (embedded-broadcast FMA operands), so a k step is MR*NV FMAs for
 * NV + MR loads. Column edges use masked loads/stores, row edges stop early.
 *
 * Shape 14 x 32 (28 accumulators + 2 B vectors of the 32 registers).
 * Single-thread GFLOP/s with KC = 768 (peak 267): 2048^3: 14x32 245,
 * 12x32 240, 8x32 241, 6x64 236, 8x48 232 (and at KC = 256: 16x16 182
 * vs 14x32 201); 1024x3072x768: 14x32 253, 6x64 253, 8x48 255. 14x32 is at the top
 * or within noise of it everywhere and wastes the least on M edges that
 * are not multiples of 16.
 */
#include <immintrin.h>

#include "kernels/cpu/gemm.h"

#define TGT __attribute__((target("avx512f"), always_inline)) static inline

TGT __mmask16 col_mask(int n, int v)
{
    int r = n - 16 * v;
    return r >= 16 ? (__mmask16)0xffff : r <= 0 ? 0 : (__mmask16)((1u << r) - 1);
}

/* The kernel body for MR rows and NV vectors: a macro so that the
 * accumulator array has constant dimensions and, fully unrolled, lives in
 * registers. */
#define UKR(MR, NV)                                                           \
    __attribute__((target("avx512f"))) static void ukr_##MR##x##NV(           \
        int64_t kc, const float *restrict a, const float *restrict b,         \
        float *restrict c, int64_t ldc, float beta, int m, int n)             \
    {                                                                         \
        __m512 acc[MR][NV];                                                   \
        _Pragma("GCC unroll 32") for (int i = 0; i < MR; i++)                 \
            _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++)              \
                acc[i][v] = _mm512_setzero_ps();                              \
        for (int i = 0; i < m; i++)                                           \
            _mm_prefetch((const char *)(c + i * ldc), _MM_HINT_T0);           \
        for (int64_t k = 0; k < kc; k++) {                                    \
            __m512 bv[NV];                                                    \
            _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++)              \
                bv[v] = _mm512_load_ps(b + 16 * v);                           \
            _mm_prefetch((const char *)(b + 16 * NV * 8), _MM_HINT_T0);       \
            _Pragma("GCC unroll 32") for (int i = 0; i < MR; i++) {           \
                __m512 ai = _mm512_set1_ps(a[i]);                             \
                _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++)          \
                    acc[i][v] = _mm512_fmadd_ps(ai, bv[v], acc[i][v]);        \
            }                                                                 \
            a += MR;                                                          \
            b += 16 * NV;                                                     \
        }                                                                     \
        __m512 vb = _mm512_set1_ps(beta);                                     \
        _Pragma("GCC unroll 32") for (int i = 0; i < MR; i++) {               \
            if (i >= m)                                                       \
                break;                                                        \
            _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) {            \
                __mmask16 mk = col_mask(n, v);                                \
                float *p = c + i * ldc + 16 * v;                              \
                __m512 r = acc[i][v];                                         \
                if (beta != 0.0f)                                             \
                    r = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(mk, p), r); \
                _mm512_mask_storeu_ps(p, mk, r);                              \
            }                                                                 \
        }                                                                     \
    }

UKR(14, 2)

const zsk_sgemm_ukr zsk_sgemm_ukr_avx512 = {"avx512 14x32", 14, 32, ukr_14x2};
