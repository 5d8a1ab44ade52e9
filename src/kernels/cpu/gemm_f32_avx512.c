/*
 * gemm_f32_avx512.c - the f32 AVX-512 descriptor of the GEMM framework:
 * micro-kernels (see gemm.h for the packed panel contract) on the portable
 * f32 packer, and the vector epilogue. The 16-bit AVX-512 descriptors that
 * convert to f32 panels (gemm_bf16_avx512.c) run the same kernel.
 *
 * A tile of MR rows x NV*16 columns lives in MR*NV zmm accumulators; per k
 * the kernel loads NV vectors of the B panel and broadcasts MR values of the
 * A panel (embedded-broadcast FMA operands), so a k step is MR*NV FMAs for
 * NV + MR loads. Column edges use masked stores; edge tiles run the instance
 * for their row count and (<= 16 columns) one vector.
 *
 * Shape 14 x 32 (28 accumulators + 2 B vectors of the 32 registers).
 * Single-thread GFLOP/s with KC = 768 (peak 267): 2048^3: 14x32 245,
 * 12x32 240, 8x32 241, 6x64 236, 8x48 232 (and at KC = 256: 16x16 182
 * vs 14x32 201); 1024x3072x768: 14x32 253, 6x64 253, 8x48 255. 14x32 is at the top
 * or within noise of it everywhere and wastes the least on M edges that
 * are not multiples of 16.
 *
 * The epilogue (bias, GeLU, residual; gemm.h), zsk_sgemm_epi_avx512, runs
 * 16 columns at a time (masked at the edge) over a block of C that the
 * driver has just finished. GeLU = 0.5 v (1 + tanh u), u = sqrt(2/pi)(v +
 * 0.044715 v^3), is evaluated as v (1 + tanh u) / 2 with 1 + tanh u =
 * 2 / (1 + e) for u >= 0 and 2 e / (1 + e) for u < 0, e = exp(-2|u|): no
 * cancellation for negative v. exp: zsi_exp_m512_nc of vmath.h (Cody-Waite
 * reduction by ln 2, the degree-6 Cephes expf polynomial, scalef); tanh
 * for |x| < 0.625 by the Cephes tanhf odd polynomial, else (1 - e) /
 * (1 + e); 1 / (1 + e) by rcp14 and one Newton step (relative error ~1e-8
 * before rounding), cheaper than vdivps. Measured
 * by tests/kernels/test_gemm_epilogue.c: tanh relative error below 3e-7
 * over [-20, 20]; GeLU error below 2e-7 of max(|gelu|, 1).
 */
#include <immintrin.h>
#include <math.h>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/vmath.h"
#include "zs/core.h"

#define TGT __attribute__((target("avx512f"), always_inline)) static inline

TGT __mmask16 col_mask(int n, int v)
{
    int r = n - 16 * v;
    return r >= 16 ? (__mmask16)0xffff : r <= 0 ? 0 : (__mmask16)((1u << r) - 1);
}

#define SPLAT(x) _mm512_set1_ps((float)(x))
#define AVX512 __attribute__((target("avx512f")))

/* e^x for x <= 0 (x below -104 gives 0 or a subnormal; NaN stays NaN):
 * the exp of vmath.h. */
TGT __m512 v_exp_neg(__m512 x)
{
    x = _mm512_max_ps(SPLAT(-104.0f), x); /* NaN x: max returns x */
    return zsi_exp_m512_nc(x);
}

/* e = exp(-2|u|) and d = 1 / (1 + e), the parts of tanh and GeLU. */
TGT void v_tanh_parts(__m512 u, __m512 *e, __m512 *d)
{
    __m512 a2 = _mm512_mul_ps(_mm512_abs_ps(u), SPLAT(-2.0f));
    *e = v_exp_neg(a2);
    __m512 den = _mm512_add_ps(SPLAT(1.0f), *e), r = _mm512_rcp14_ps(den);
    *d = _mm512_mul_ps(r, _mm512_fnmadd_ps(den, r, SPLAT(2.0f)));
}

TGT __m512 v_tanh(__m512 x)
{
    __m512 e, d, ax = _mm512_abs_ps(x), s = _mm512_mul_ps(x, x);
    v_tanh_parts(x, &e, &d);
    __m512 p = SPLAT(-5.70498872745e-3f);
    p = _mm512_fmadd_ps(p, s, SPLAT(2.06390887954e-2f));
    p = _mm512_fmadd_ps(p, s, SPLAT(-5.37397155531e-2f));
    p = _mm512_fmadd_ps(p, s, SPLAT(1.33314422036e-1f));
    p = _mm512_fmadd_ps(p, s, SPLAT(-3.33332819422e-1f));
    __m512 small = _mm512_fmadd_ps(_mm512_mul_ps(p, s), x, x);
    __m512 big = _mm512_mul_ps(_mm512_sub_ps(SPLAT(1.0f), e), d);
    /* copy x's sign onto big */
    big = _mm512_castsi512_ps(_mm512_ternarylogic_epi32(
        _mm512_castps_si512(big), _mm512_castps_si512(x),
        _mm512_set1_epi32(0x7fffffff), 0xe4));
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(ax, SPLAT(0.625f), _CMP_LT_OQ),
                                big, small);
}

/* 0.5 v (1 + tanh u) = v d (u >= 0) or v e d (u < 0); see the file comment. */
TGT __m512 v_gelu(__m512 v)
{
    const float c1 = 0.7978845608028654f, c3 = (float)(0.7978845608028654 * 0.044715);
    __m512 s = _mm512_mul_ps(v, v);
    __m512 u = _mm512_mul_ps(v, _mm512_fmadd_ps(SPLAT(c3), s, SPLAT(c1)));
    __m512 e, d;
    v_tanh_parts(u, &e, &d);
    __mmask16 neg = _mm512_cmp_ps_mask(u, _mm512_setzero_ps(), _CMP_LT_OQ);
    __m512 f = _mm512_mask_mul_ps(d, neg, d, e);
    return _mm512_mul_ps(v, f);
}

/* One vector (mask mk) of row i: the epilogue of gemm.h. */
TGT __m512 epi_vec(__m512 r, const zsk_epilogue *ep, int64_t i, int64_t j,
                   __mmask16 mk)
{
    if (ep->bias)
        r = _mm512_add_ps(r, _mm512_maskz_loadu_ps(mk, ep->bias + j));
    if (ep->gelu) {
        if (ep->pre)
            _mm512_mask_storeu_ps(ep->pre + i * ep->ldp + j, mk, r);
        r = v_gelu(r);
    }
    if (ep->res)
        r = _mm512_add_ps(r, _mm512_maskz_loadu_ps(mk, ep->res + i * ep->ldr + j));
    return r;
}

static void epi16_avx512(const float *t, int64_t ldt, int64_t m, int64_t n,
                         float *c, int64_t ldc, float beta,
                         const zsk_epilogue *ep);

AVX512 void zsk_sgemm_epi_avx512(const float *t, int64_t ldt, int64_t m,
                                 int64_t n, float *c, int64_t ldc, float beta,
                                 const zsk_epilogue *ep)
{
    static const zsk_epilogue none = {0};
    if (!ep)
        ep = &none;
    if (ep->bias16 || ep->pre16 || ep->res16 || ep->out16) {
        const zs_cpu_features *f = zs_cpu();
        if (f->avx512bw && f->avx512vl)
            epi16_avx512(t, ldt, m, n, c, ldc, beta, ep);
        else
            zsk_sgemm_epi_ref(t, ldt, m, n, c, ldc, beta, ep);
        return;
    }
    __m512 vb = SPLAT(beta);
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j += 16) {
            __mmask16 mk = n - j >= 16 ? (__mmask16)0xffff
                                       : (__mmask16)((1u << (n - j)) - 1);
            float *p = c + i * ldc + j;
            __m512 r = _mm512_maskz_loadu_ps(mk, t + i * ldt + j);
            if (beta != 0.0f)
                r = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(mk, p), r);
            _mm512_mask_storeu_ps(p, mk, epi_vec(r, ep, i, j, mk));
        }
}

/* ---- bf16 operands (gemm.h: bias16, pre16, res16, out16) ------------- */

#define TGT16                                                                 \
    __attribute__((target("avx512f,avx512bw,avx512vl"), always_inline))     \
    static inline
#define AVX512BW __attribute__((target("avx512f,avx512bw,avx512vl")))

/* 16 bf16 patterns widened to f32: exact; f16: IEEE halves (vcvtph2ps,
 * exact too). */
TGT16 __m512 cvt16(__m256i h, bool f16)
{
    if (f16)
        return _mm512_cvtph_ps(h);
    __m512i w = _mm512_cvtepu16_epi32(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}

/* The same loaded from p under mask mk (others 0). */
TGT16 __m512 ld16(const uint16_t *p, __mmask16 mk, bool f16)
{
    return cvt16(_mm256_maskz_loadu_epi16(mk, p), f16);
}

/* v rounded to bf16 as zs_f32_to_bf16 does (nearest even; NaN: its top
 * half with the quiet bit set): 16 patterns. Integer arithmetic, not
 * vcvtneps2bf16 (which flushes subnormals). f16: vcvtps2ph, nearest even
 * as zs_f32_to_f16 (NaN payloads aside). */
TGT16 __m256i rnd16(__m512 v, bool f16)
{
    if (f16)
        return _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512i u = _mm512_castps_si512(v), hi = _mm512_srli_epi32(u, 16);
    __m512i odd = _mm512_and_si512(hi, _mm512_set1_epi32(1));
    __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff)));
    r = _mm512_srli_epi32(r, 16);
    __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    r = _mm512_mask_or_epi32(r, nan, hi, _mm512_set1_epi32(0x40));
    return _mm512_cvtepi32_epi16(r);
}

/* rnd16(v) stored under mask mk. */
TGT16 void st16(uint16_t *p, __mmask16 mk, __m512 v, bool f16)
{
    _mm256_mask_storeu_epi16(p, mk, rnd16(v, f16));
}

AVX512BW static void epi16_avx512(const float *t, int64_t ldt, int64_t m,
                                  int64_t n, float *c, int64_t ldc, float beta,
                                  const zsk_epilogue *ep)
{
    __m512 vb = SPLAT(beta);
    bool f16 = ep->f16;
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j += 16) {
            __mmask16 mk = n - j >= 16 ? (__mmask16)0xffff
                                       : (__mmask16)((1u << (n - j)) - 1);
            float *p = c + i * ldc + j;
            __m512 r = _mm512_maskz_loadu_ps(mk, t + i * ldt + j);
            if (beta != 0.0f)
                r = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(mk, p), r);
            if (ep->bias)
                r = _mm512_add_ps(r, _mm512_maskz_loadu_ps(mk, ep->bias + j));
            if (ep->bias16)
                r = _mm512_add_ps(r, ld16(ep->bias16 + j, mk, f16));
            if (ep->gelu) {
                if (ep->pre)
                    _mm512_mask_storeu_ps(ep->pre + i * ep->ldp + j, mk, r);
                if (ep->pre16 || ep->out16) { /* GeLU of the 16-bit pre-activation
                                               * (in registers: a store and
                                               * reload of the 16 patterns
                                               * stalled on store forwarding) */
                    __m256i h = rnd16(r, f16);
                    r = cvt16(h, f16);
                    if (ep->pre16)
                        _mm256_mask_storeu_epi16(ep->pre16 + i * ep->ldp + j, mk, h);
                }
                r = v_gelu(r);
            }
            if (ep->res)
                r = _mm512_add_ps(r, _mm512_maskz_loadu_ps(mk, ep->res + i * ep->ldr + j));
            if (ep->res16)
                r = _mm512_add_ps(r, ld16(ep->res16 + i * ep->ldr + j, mk, f16));
            if (ep->out16)
                st16(ep->out16 + i * ep->ldo + j, mk, r, f16);
            else
                _mm512_mask_storeu_ps(p, mk, r);
        }
}

/* gelu_tanh'(v) = (1 + t) / 2 + v s (1 + 3 k v^2) (1 - t^2) / 2 with
 * t = tanh(u): in v_tanh_parts' terms (1 + t) / 2 is d (u >= 0) or e d
 * (u < 0), and (1 - t^2) / 2 = 2 e d^2, so neither part cancels. */
TGT __m512 v_gelu_grad(__m512 v)
{
    const float c1 = 0.7978845608028654f, c3 = (float)(0.7978845608028654 * 0.044715);
    __m512 s = _mm512_mul_ps(v, v);
    __m512 u = _mm512_mul_ps(v, _mm512_fmadd_ps(SPLAT(c3), s, SPLAT(c1)));
    __m512 du = _mm512_fmadd_ps(SPLAT(3.0f * c3), s, SPLAT(c1)); /* u' */
    __m512 e, d;
    v_tanh_parts(u, &e, &d);
    __mmask16 neg = _mm512_cmp_ps_mask(u, _mm512_setzero_ps(), _CMP_LT_OQ);
    __m512 half1pt = _mm512_mask_mul_ps(d, neg, d, e);
    __m512 half1mt2 = _mm512_mul_ps(_mm512_mul_ps(SPLAT(2.0f), e), _mm512_mul_ps(d, d));
    return _mm512_fmadd_ps(_mm512_mul_ps(v, du), half1mt2, half1pt);
}

AVX512BW void zsk_gelu_tanh_bw_avx512(bool bf16, const void *g, const void *h,
                                      void *out, int64_t n)
{
    for (int64_t k = 0; k < n; k += 16) {
        __mmask16 mk = n - k >= 16 ? (__mmask16)0xffff
                                   : (__mmask16)((1u << (n - k)) - 1);
        if (bf16) {
            __m512 gv = ld16((const uint16_t *)g + k, mk, false);
            __m512 d = v_gelu_grad(ld16((const uint16_t *)h + k, mk, false));
            st16((uint16_t *)out + k, mk, _mm512_mul_ps(gv, d), false);
        } else {
            __m512 gv = _mm512_maskz_loadu_ps(mk, (const float *)g + k);
            __m512 d = v_gelu_grad(_mm512_maskz_loadu_ps(mk, (const float *)h + k));
            _mm512_mask_storeu_ps((float *)out + k, mk, _mm512_mul_ps(gv, d));
        }
    }
}

AVX512 static void tanh_avx512(float *y, const float *x, int64_t n)
{
    for (int64_t k = 0; k < n; k += 16) {
        __mmask16 mk = n - k >= 16 ? (__mmask16)0xffff
                                   : (__mmask16)((1u << (n - k)) - 1);
        _mm512_mask_storeu_ps(y + k, mk, v_tanh(_mm512_maskz_loadu_ps(mk, x + k)));
    }
}

void zsk_tanh_f32_avx512(float *y, const float *x, int64_t n)
{
    if (!zs_cpu()->avx512f) {
        for (int64_t k = 0; k < n; k++)
            y[k] = tanhf(x[k]);
        return;
    }
    tanh_avx512(y, x, n);
}

/* The kernel body for MR rows and NV vectors of a panel NR = 32 wide: a
 * macro so that the accumulator array has constant dimensions and, fully
 * unrolled, lives in registers. Instantiated for every MR <= 14 and NV of
 * 1 and 2, so an edge tile (fewer rows, or at most 16 columns) does only
 * its own FMAs: with one 14x32 kernel for all tiles, M = 128 padded to 140
 * rows and N = 196 to 224 columns, and a 128 x 196 x 1152 GEMM (a ResNet
 * layer) ran at 81 GFLOP/s where OpenBLAS ran 100. beta comes by
 * pointer and is read after the k loop: passed in a register, it stayed
 * live through the loop, and with 28 accumulators GCC spilled a B vector
 * to the stack and re-read it with every FMA. */
#define UKR(MR, NV)                                                           \
    __attribute__((target("avx512f"))) static void ukr_##MR##x##NV(           \
        int64_t kc, const float *restrict a, const float *restrict b,         \
        float *restrict c, int64_t ldc, const float *betap, int n)            \
    {                                                                         \
        __m512 acc[MR][NV];                                                   \
        _Pragma("GCC unroll 32") for (int i = 0; i < MR; i++)                 \
            _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++)              \
                acc[i][v] = _mm512_setzero_ps();                              \
        _Pragma("GCC unroll 32") for (int i = 0; i < MR; i++)                 \
            _mm_prefetch((const char *)(c + i * ldc), _MM_HINT_T0);           \
        for (int64_t k = 0; k < kc; k++) {                                    \
            __m512 bv[NV];                                                    \
            _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++)              \
                bv[v] = _mm512_load_ps(b + 16 * v);                           \
            _mm_prefetch((const char *)(b + 32 * 8), _MM_HINT_T0);            \
            _Pragma("GCC unroll 32") for (int i = 0; i < MR; i++) {           \
                __m512 ai = _mm512_set1_ps(a[i]);                             \
                _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++)          \
                    acc[i][v] = _mm512_fmadd_ps(ai, bv[v], acc[i][v]);        \
            }                                                                 \
            a += 14;                                                          \
            b += 32;                                                          \
        }                                                                     \
        float beta = *betap;                                                  \
        __m512 vb = _mm512_set1_ps(beta);                                     \
        _Pragma("GCC unroll 32") for (int i = 0; i < MR; i++) {               \
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

#define UKR_NV(MR) UKR(MR, 1) UKR(MR, 2)
UKR_NV(1) UKR_NV(2) UKR_NV(3) UKR_NV(4) UKR_NV(5) UKR_NV(6) UKR_NV(7)
UKR_NV(8) UKR_NV(9) UKR_NV(10) UKR_NV(11) UKR_NV(12) UKR_NV(13) UKR_NV(14)

typedef void (*tile_fn)(int64_t, const float *, const float *, float *,
                        int64_t, const float *, int);
#define ROW(NV)                                                               \
    {ukr_1x##NV, ukr_2x##NV, ukr_3x##NV, ukr_4x##NV, ukr_5x##NV,              \
     ukr_6x##NV, ukr_7x##NV, ukr_8x##NV, ukr_9x##NV, ukr_10x##NV,             \
     ukr_11x##NV, ukr_12x##NV, ukr_13x##NV, ukr_14x##NV}
static const tile_fn TILES[2][14] = {ROW(1), ROW(2)};

/* The gemm.h micro-kernel: the instance for m rows and 1 or 2 vectors;
 * alpha is applied by the packer (alpha_in_pack). */
void zsk_gemm_f32_avx512_14x32(int64_t ku, const void *a, const void *b,
                               float *c, int64_t ldc, int m, int n,
                               float alpha, float beta)
{
    TILES[n > 16][m - 1](ku, a, b, c, ldc, &beta, n);
}

static bool usable(void)
{
    return zs_cpu()->avx512f;
}

/* Blocking: KC 1024 (balanced over K), MC 42, NC 2048; see gemm.c. */
const zsk_gemm_desc zsk_gemm_f32_avx512 = {
    .name = "avx512 14x32", .type = ZSK_GEMM_F32, .isa = ZSK_GEMM_AVX512,
    .usable = usable, .mr = 14, .nr = 32, .kstep = 1, .alpha_in_pack = true,
    .kc = 1024, .mc = 42, .nc = 2048, .pack_a = zsk_gemm_pack_f32,
    .pack_b = zsk_gemm_pack_f32, .ukr = zsk_gemm_f32_avx512_14x32,
    .epi = zsk_sgemm_epi_avx512, .gemv = true};
