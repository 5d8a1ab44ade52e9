/*
 * gelu_bw_avx2.c - out = g * gelu_tanh'(h) on AVX2 + FMA, 8 lanes: the
 * AVX2 path of zsk_gelu_tanh_bw (gemm.h), the backward of the GeLU
 * epilogue. Before it, CPUs without AVX-512 evaluated every element in
 * double with libm's tanh (about 20 ns an element: 8% of a GPT-small step
 * under ZS_CPU_ISA=avx2).
 *
 * Method, as the AVX-512 path (gemm_f32_avx512.c): u = c1 v + c3 v^3,
 * e = exp(-2|u|) (vmath.h), d = 1 / (1 + e) (a division: no rcp14 on
 * AVX2); (1 + tanh u) / 2 is d for u >= 0 and e d for u < 0, and
 * (1 - tanh^2 u) / 2 = 2 e d^2, so neither part cancels; gelu' =
 * (1 + t) / 2 + v u' (1 - t^2) / 2 with u' = c1 + 3 c3 v^2. bf16 operands
 * are widened in registers and the results rounded once as
 * zs_f32_to_bf16 (half8.h: the same bits as the other paths' rounding).
 */
#include <immintrin.h>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/half8.h"
#include "kernels/cpu/vmath.h"
#include "zs/core.h"

#define TGT __attribute__((target("avx2,fma,f16c")))

static inline TGT __m256 v_gelu_grad8(__m256 v)
{
    const float c1 = 0.7978845608028654f, c3 = (float)(0.7978845608028654 * 0.044715);
    __m256 s = _mm256_mul_ps(v, v);
    __m256 u = _mm256_mul_ps(v, _mm256_fmadd_ps(_mm256_set1_ps(c3), s, _mm256_set1_ps(c1)));
    __m256 du = _mm256_fmadd_ps(_mm256_set1_ps(3.0f * c3), s, _mm256_set1_ps(c1));
    __m256 au = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), u);
    __m256 e = zsi_exp_m256(_mm256_mul_ps(au, _mm256_set1_ps(-2.0f)));
    __m256 d = _mm256_div_ps(_mm256_set1_ps(1.0f), _mm256_add_ps(_mm256_set1_ps(1.0f), e));
    __m256 neg = _mm256_cmp_ps(u, _mm256_setzero_ps(), _CMP_LT_OQ);
    __m256 half1pt = _mm256_blendv_ps(d, _mm256_mul_ps(d, e), neg);
    __m256 half1mt2 = _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(2.0f), e),
                                    _mm256_mul_ps(d, d));
    return _mm256_fmadd_ps(_mm256_mul_ps(v, du), half1mt2, half1pt);
}

/* f32: 8 at a time, the tail through a zero-padded block. */
static TGT void bw_f32(const float *g, const float *h, float *out, int64_t n)
{
    int64_t k = 0;
    for (; k + 8 <= n; k += 8) {
        __m256 gv = _mm256_loadu_ps(g + k);
        __m256 d = v_gelu_grad8(_mm256_loadu_ps(h + k));
        _mm256_storeu_ps(out + k, _mm256_mul_ps(gv, d));
    }
    if (k < n) {
        float gb[8] = {0}, hb[8] = {0}, ob[8];
        for (int64_t i = k; i < n; i++) {
            gb[i - k] = g[i];
            hb[i - k] = h[i];
        }
        _mm256_storeu_ps(ob, _mm256_mul_ps(_mm256_loadu_ps(gb),
                                           v_gelu_grad8(_mm256_loadu_ps(hb))));
        for (int64_t i = k; i < n; i++)
            out[i] = ob[i - k];
    }
}

/* bf16: 8 at a time widened in registers, rounded once on the way out
 * (half8.h: zs_f32_to_bf16's bits); a stack block through the library's
 * scalar conversions took 11 ms a call for GPT small's 3.1 M elements. */
static TGT void bw_bf16(const uint16_t *g, const uint16_t *h, uint16_t *out,
                        int64_t n)
{
    for (int64_t k = 0; k < n; k += 8) {
        int64_t m = n - k < 8 ? n - k : 8;
        __m256 gv = zsk_cvt8h(zsk_ld8h(g + k, m), false);
        __m256 d = v_gelu_grad8(zsk_cvt8h(zsk_ld8h(h + k, m), false));
        zsk_st8h(out + k, zsk_rnd8h(_mm256_mul_ps(gv, d), false), m);
    }
}

void zsk_gelu_tanh_bw_avx2(bool bf16, const void *g, const void *h, void *out,
                           int64_t n)
{
    if (bf16)
        bw_bf16(g, h, out, n);
    else
        bw_f32(g, h, out, n);
}
