/*
 * gemm_f32_avx2.c - the f32 AVX2+FMA descriptor of the GEMM framework: a
 * 6 x 16 micro-kernel (see gemm.h for the packed panel contract) on the
 * portable f32 packer, with the AVX2 epilogue (gemm_epi_avx2.c). The
 * bf16 / f16 AVX2 descriptors (gemm_lowp_avx2.c) run the same kernel on converted panels.
 *
 * 12 ymm accumulators (6 rows x 2 vectors), 2 B loads and 6 broadcasts per
 * k step: 12 FMAs cover the FMA latency on two pipes and leave 4 of the 16
 * registers for operands. Edge tiles go through a small buffer.
 */
#include <immintrin.h>

#include "kernels/cpu/gemm.h"
#include "zs/core.h"

#define MR 6
#define NR 16

/* alpha is applied by the packer (alpha_in_pack). Also the kernel of the
 * 16-bit AVX2 descriptors (gemm_lowp_avx2.c), which pack f32 panels. */
__attribute__((target("avx2,fma"))) void zsk_gemm_f32_avx2_6x16(
    int64_t kc, const void *ap, const void *bp, float *restrict c,
    int64_t ldc, int m, int n, float alpha, float beta)
{
    const float *restrict a = ap, *restrict b = bp;
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

static bool usable(void)
{
    return zs_cpu()->avx2 && zs_cpu()->fma;
}

/* Blocking: the f32 AVX-512 one (gemm.c); not measured on an AVX2-only
 * CPU. */
const zsk_gemm_desc zsk_gemm_f32_avx2 = {
    .name = "avx2 6x16", .type = ZSK_GEMM_F32, .isa = ZSK_GEMM_AVX2,
    .usable = usable, .mr = MR, .nr = NR, .kstep = 1, .alpha_in_pack = true,
    .kc = 1024, .mc = 42, .nc = 2048, .pack_a = zsk_gemm_pack_f32,
    .pack_b = zsk_gemm_pack_f32, .ukr = zsk_gemm_f32_avx2_6x16,
    .epi = zsk_sgemm_epi_avx2,
    .gemv = true};
