/*
 * gemm_epi_avx2.c - the f32 GEMM epilogue (bias, GeLU storing the
 * pre-activation, residual; gemm.h) on AVX2 + FMA, 8 columns at a time
 * with masked edges: the epilogue of the AVX2 GEMM descriptors.
 *
 * Why: they ran the portable epilogue, which evaluates GeLU in double with
 * libm's tanh, about 20 ns an element; a GPT-small step under
 * ZS_CPU_ISA=avx2 spent about half of its linear_gelu time (some 0.6 s of
 * 1.4 s on the loaded dev box) there, beside the GEMM.
 *
 * GeLU as the AVX-512 epilogue (gemm_f32_avx512.c): v (1 + tanh u) / 2,
 * u = sqrt(2/pi) (v + 0.044715 v^3), with 1 + tanh u = 2 d (u >= 0) or
 * 2 e d (u < 0), e = exp(-2|u|) (zsi_exp_m256 of vmath.h, its input
 * clamped at -88: e >= 6e-39, below every result's rounding), d =
 * 1 / (1 + e) by a division (AVX2 has no rcp14): no cancellation for
 * negative v. Error measured by tests/kernels/test_gemm_epilogue.c:
 * below 1e-6 of max(|gelu|, 1) over [-20, 20] (as the AVX-512 one).
 *
 * The 16-bit forms (bias16, pre16, res16, out16: bf16, or f16 with
 * ep->f16) run here too (epi16_8): halves widened exactly (bf16 by a
 * shift, f16 by vcvtph2ps), results rounded as zs_f32_to_bf16 (integer
 * nearest even, NaN kept quiet) or by vcvtps2ph, the pre-activation
 * rounded in registers before GeLU reads it (as gemm.h asks). They ran the
 * portable epilogue, GeLU in double: under ZS_CPU_ISA=avx2 a bf16 GPT-small
 * step spent 263 ms in linear_gelu against 128 ms in the qkv linears with
 * 72% of its FLOPs.
 */
#include <immintrin.h>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/half8.h"
#include "kernels/cpu/vmath.h"
#include "zs/core.h"

#define TGT __attribute__((target("avx2,fma,f16c")))

static const int32_t MASK_TAB[16] = {-1, -1, -1, -1, -1, -1, -1, -1,
                                     0,  0,  0,  0,  0,  0,  0,  0};

/* v (1 + tanh u) / 2 = v d (u >= 0) or v e d (u < 0). */
static inline TGT __m256 v_gelu8(__m256 v)
{
    const float c1 = 0.7978845608028654f, c3 = (float)(0.7978845608028654 * 0.044715);
    __m256 s = _mm256_mul_ps(v, v);
    __m256 u = _mm256_mul_ps(v, _mm256_fmadd_ps(_mm256_set1_ps(c3), s, _mm256_set1_ps(c1)));
    __m256 au = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), u);
    __m256 e = zsi_exp_m256(_mm256_mul_ps(au, _mm256_set1_ps(-2.0f)));
    __m256 d = _mm256_div_ps(_mm256_set1_ps(1.0f), _mm256_add_ps(_mm256_set1_ps(1.0f), e));
    __m256 neg = _mm256_cmp_ps(u, _mm256_setzero_ps(), _CMP_LT_OQ);
    return _mm256_mul_ps(v, _mm256_blendv_ps(d, _mm256_mul_ps(d, e), neg));
}

/* Row i, columns j .. j+7 (lanes mk; t and c already offset to them). */
static inline TGT void epi8(const float *t, float *c, float beta,
                            const zsk_epilogue *ep, int64_t i, int64_t j,
                            __m256i mk)
{
    __m256 r = _mm256_maskload_ps(t, mk);
    if (beta != 0.0f)
        r = _mm256_fmadd_ps(_mm256_set1_ps(beta), _mm256_maskload_ps(c, mk), r);
    if (ep->bias)
        r = _mm256_add_ps(r, _mm256_maskload_ps(ep->bias + j, mk));
    if (ep->gelu) {
        if (ep->pre)
            _mm256_maskstore_ps(ep->pre + i * ep->ldp + j, mk, r);
        r = v_gelu8(r);
    }
    if (ep->res)
        r = _mm256_add_ps(r, _mm256_maskload_ps(ep->res + i * ep->ldr + j, mk));
    _mm256_maskstore_ps(c, mk, r);
}

/* ---- 16-bit forms -------------------------------------------------------- */

/* Row i, columns j .. j+n-1 (n <= 8, lanes mk) with 16-bit operands. */
static inline TGT void epi16_8(const float *t, float *c, float beta,
                               const zsk_epilogue *ep, int64_t i, int64_t j,
                               int64_t n, __m256i mk)
{
    bool f16 = ep->f16;
    __m256 r = _mm256_maskload_ps(t, mk);
    if (beta != 0.0f)
        r = _mm256_fmadd_ps(_mm256_set1_ps(beta), _mm256_maskload_ps(c, mk), r);
    if (ep->bias)
        r = _mm256_add_ps(r, _mm256_maskload_ps(ep->bias + j, mk));
    if (ep->bias16)
        r = _mm256_add_ps(r, zsk_cvt8h(zsk_ld8h(ep->bias16 + j, n), f16));
    if (ep->gelu) {
        if (ep->pre)
            _mm256_maskstore_ps(ep->pre + i * ep->ldp + j, mk, r);
        if (ep->pre16 || ep->out16) { /* GeLU of the 16-bit pre-activation */
            __m128i h = zsk_rnd8h(r, f16);
            r = zsk_cvt8h(h, f16);
            if (ep->pre16)
                zsk_st8h(ep->pre16 + i * ep->ldp + j, h, n);
        }
        r = v_gelu8(r);
    }
    if (ep->res)
        r = _mm256_add_ps(r, _mm256_maskload_ps(ep->res + i * ep->ldr + j, mk));
    if (ep->res16)
        r = _mm256_add_ps(r, zsk_cvt8h(zsk_ld8h(ep->res16 + i * ep->ldr + j, n), f16));
    if (ep->out16)
        zsk_st8h(ep->out16 + i * ep->ldo + j, zsk_rnd8h(r, f16), n);
    else
        _mm256_maskstore_ps(c, mk, r);
}

TGT void zsk_sgemm_epi_avx2(const float *t, int64_t ldt, int64_t m, int64_t n,
                            float *c, int64_t ldc, float beta,
                            const zsk_epilogue *ep)
{
    static const zsk_epilogue none = {0};
    if (!ep)
        ep = &none;
    if (ep->bias16 || ep->pre16 || ep->res16 || ep->out16) {
        __m256i all = _mm256_set1_epi32(-1);
        __m256i tail = _mm256_loadu_si256((const __m256i *)(MASK_TAB + 8 - n % 8));
        for (int64_t i = 0; i < m; i++) {
            int64_t j = 0;
            for (; j + 8 <= n; j += 8)
                epi16_8(t + i * ldt + j, c + i * ldc + j, beta, ep, i, j, 8, all);
            if (j < n)
                epi16_8(t + i * ldt + j, c + i * ldc + j, beta, ep, i, j, n - j, tail);
        }
        return;
    }
    __m256i all = _mm256_set1_epi32(-1);
    __m256i tail = _mm256_loadu_si256((const __m256i *)(MASK_TAB + 8 - n % 8));
    for (int64_t i = 0; i < m; i++) {
        int64_t j = 0;
        for (; j + 8 <= n; j += 8)
            epi8(t + i * ldt + j, c + i * ldc + j, beta, ep, i, j, all);
        if (j < n)
            epi8(t + i * ldt + j, c + i * ldc + j, beta, ep, i, j, tail);
    }
}

void zsk_gelu_tanh_f32_avx2(float *y, const float *x, int64_t n)
{
    zsk_epilogue ep = {.gelu = true};
    const zs_cpu_features *f = zs_cpu();
    if (f->avx2 && f->fma && f->f16c) /* the target of this file */
        zsk_sgemm_epi_avx2(x, n, 1, n, y, n, 0.0f, &ep);
    else
        zsk_sgemm_epi_ref(x, n, 1, n, y, n, 0.0f, &ep);
}
