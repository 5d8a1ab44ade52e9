/*
 * gemm_avx2.c - AVX2+FMA SGEMM micro-kernel, 6 x 16 (see gemm.h for the
 * packed panel contract).
 *
 * 12 ymm accumulators (6 rows x 2 vectors), 2 B loads and 6 broadcasts per
 * k step: 12 FMAs cover the FMA latency on two pipes and leave 4 of the 16
 * registers for operands. Edge tiles go through a small buffer.
 */
#include <immintrin.h>

#include "kernels/cpu/gemm.h"

#define MR 6
#define NR 16

__attribute__((target("avx2,fma"))) static void ukr_6x16(
    int64_t kc, const float *restrict a, const float *restrict b,
    float *restrict c, int64_t ldc, float beta, int m, int n)
{
    __m256 acc[MR][2];
#pragma GCC unroll 8
    for (int i = 0; i < MR; i++)
        acc[i][0] = acc[i][1] = _mm256_setzero_ps();
    for (int64_t k = 0; k < kc; k++) {
        __m256 b0 = _mm256_load_ps(b), b1 = _mm256_load_ps(b + 8);
#pragma GCC unroll 8
        for (int i = 0; i < MR; i++) {
            __m256 ai = _mm256_broadcast_ss(a + i);
            acc[i][0] = _mm256_fmadd_ps(ai, b0, acc[i][0]);
            acc[i][1] = _mm256_fmadd_ps(ai, b1, acc[i][1]);
        }
        a += MR;
        b += NR;
    }
    __m256 vb = _mm256_set1_ps(beta);
    if (m == MR && n == NR) {
#pragma GCC unroll 8
        for (int i = 0; i < MR; i++)
            for (int v = 0; v < 2; v++) {
                float *p = c + i * ldc + 8 * v;
                __m256 r = acc[i][v];
                if (beta != 0.0f)
                    r = _mm256_fmadd_ps(vb, _mm256_loadu_ps(p), r);
                _mm256_storeu_ps(p, r);
            }
        return;
    }
    float t[MR][NR];
#pragma GCC unroll 8
    for (int i = 0; i < MR; i++) {
        _mm256_storeu_ps(t[i], acc[i][0]);
        _mm256_storeu_ps(t[i] + 8, acc[i][1]);
    }
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++)
            c[i * ldc + j] = t[i][j] + (beta != 0.0f ? beta * c[i * ldc + j] : 0.0f);
}

const zsk_sgemm_ukr zsk_sgemm_ukr_avx2 = {"avx2 6x16", MR, NR, ukr_6x16};
