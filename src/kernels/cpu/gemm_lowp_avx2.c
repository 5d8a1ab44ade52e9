/*
 * gemm_lowp_avx2.c - the AVX2 + FMA + F16C descriptors of the GEMM
 * framework (gemm.h) for 16-bit inputs, bf16 and f16: the path of CPUs
 * without AVX-512 (and of ZS_CPU_ISA=avx2).
 *
 * Both widen to f32 while packing - bf16 by a 16-bit shift, f16 by
 * vcvtph2ps - scale A by alpha, and run the f32 6 x 16 micro-kernel of
 * gemm_f32_avx2.c on the panels, so the products are the exact f32
 * products of the 16-bit inputs and only the f32 accumulation order
 * differs from the other paths.
 * Packing is one of two vector paths: k contiguous (rows of A, columns of
 * B^T: 8 x 8 transposes of converted runs) or rows contiguous (convert 8
 * rows of one k at a time). Runs shorter than 8 go through a zeroed
 * 8-element buffer, so nothing past a row is read.
 * Skinny M (<= 4, e.g. decoding one token): no packing of B; B rows are
 * converted in registers (rows of B contiguous) or dot products run
 * along k (B^T), 6 to 8 independent FMA chains per step.
 */
#include <immintrin.h>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/half8.h"
#include "zs/core.h"

#define MR 6
#define NR 16

#define TGT __attribute__((target("avx2,fma,f16c")))
#define INL static inline __attribute__((always_inline))

enum fmt { FMT_BF16, FMT_F16 };

/* zsk_gemm_src with its element type: x[r * rs + k * ks]. */
typedef struct hsrc {
    const uint16_t *x;
    int64_t rs, ks;
} hsrc;

/* ---- conversion, loads and stores --------------------------------------- */

/* 8 halves as f32: bf16 by shift, f16 by vcvtph2ps (both exact;
 * half8.h). */
TGT INL __m256 cvt8(enum fmt f, __m128i h)
{
    return zsk_cvt8h(h, f == FMT_F16);
}

/* Lane mask of the first n (0..8) lanes. */
TGT INL __m256i lanes(int64_t n)
{
    static const int32_t tab[16] = {-1, -1, -1, -1, -1, -1, -1, -1,
                                    0,  0,  0,  0,  0,  0,  0,  0};
    n = n < 0 ? 0 : n > 8 ? 8 : n;
    return _mm256_loadu_si256((const __m256i *)(tab + 8 - n));
}

/* The first n lanes of v to p. */
TGT INL void store_n(float *p, int64_t n, __m256 v)
{
    if (n >= 8)
        _mm256_storeu_ps(p, v);
    else
        _mm256_maskstore_ps(p, lanes(n), v);
}

TGT INL void transpose8(__m256 r[8])
{
    __m256 t[8], s[8];
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 2; i++) {
        s[4 * i] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
        s[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0xee);
        s[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
        s[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xee);
    }
    for (int i = 0; i < 4; i++) {
        r[i] = _mm256_permute2f128_ps(s[i], s[4 + i], 0x20);
        r[4 + i] = _mm256_permute2f128_ps(s[i], s[4 + i], 0x31);
    }
}

/* ---- packing ------------------------------------------------------------ */

/* One panel of w rows (nrows valid) with k contiguous: 8 x 8 transposes. */
TGT INL void pack_panel_kcontig(enum fmt f, hsrc s, int64_t nrows,
                                int64_t kc, int w, __m256 va, float *out)
{
    for (int g0 = 0; g0 < w; g0 += 8) {
        int gw = w - g0 < 8 ? w - g0 : 8;
        for (int64_t k0 = 0; k0 < kc; k0 += 8) {
            int64_t kv = kc - k0;
            __m256 r[8];
            for (int i = 0; i < 8; i++)
                r[i] = i < gw && g0 + i < nrows
                           ? cvt8(f, zsk_ld8h(s.x + (g0 + i) * s.rs + k0, kv))
                           : _mm256_setzero_ps();
            transpose8(r);
            for (int64_t k = 0; k < 8 && k < kv; k++)
                store_n(out + (k0 + k) * w + g0, gw, _mm256_mul_ps(r[k], va));
        }
    }
}

/* One panel of w rows (nrows valid) with rows contiguous. */
TGT INL void pack_panel_rcontig(enum fmt f, hsrc s, int64_t nrows,
                                int64_t kc, int w, __m256 va, float *out)
{
    for (int64_t k = 0; k < kc; k++)
        for (int g0 = 0; g0 < w; g0 += 8) {
            __m256 v = cvt8(f, zsk_ld8h(s.x + k * s.ks + g0, nrows - g0));
            store_n(out + k * w + g0, w - g0, _mm256_mul_ps(v, va));
        }
}

/* The packer of gemm.h (kstep 1: f32 units, times alpha). */
TGT INL void pack_any(enum fmt f, zsk_gemm_src src, int64_t rows, int64_t kc,
                      int w, float alpha, void *dst)
{
    __m256 va = _mm256_set1_ps(alpha);
    float *out = dst;
    for (int64_t r0 = 0; r0 < rows; r0 += w) {
        hsrc p = {(const uint16_t *)src.x + r0 * src.rs, src.rs, src.ks};
        int64_t nrows = rows - r0 < w ? rows - r0 : w;
        if (src.ks == 1)
            pack_panel_kcontig(f, p, nrows, kc, w, va, out + r0 * kc);
        else
            pack_panel_rcontig(f, p, nrows, kc, w, va, out + r0 * kc);
    }
}

TGT static void pack_bf16(zsk_gemm_src s, int64_t rows, int64_t kc, int w,
                          float alpha, void *out)
{
    pack_any(FMT_BF16, s, rows, kc, w, alpha, out);
}

TGT static void pack_f16(zsk_gemm_src s, int64_t rows, int64_t kc, int w,
                         float alpha, void *out)
{
    pack_any(FMT_F16, s, rows, kc, w, alpha, out);
}

/* ---- skinny M: op(B) read in place --------------------------------------- */

/* C[n columns at p] = alpha * v + beta * C. */
TGT INL void store8(float *p, int64_t n, __m256 v, float alpha, float beta)
{
    __m256 r = _mm256_mul_ps(_mm256_set1_ps(alpha), v);
    if (beta != 0) {
        __m256 c = n >= 8 ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, lanes(n));
        r = _mm256_fmadd_ps(_mm256_set1_ps(beta), c, r);
    }
    store_n(p, n, r);
}

TGT INL float hsum8(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v),
                          _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* 8-column vectors per step (NN) and columns per step (NT) for MS rows:
 * 6 to 8 accumulators, within the 16 ymm registers. */
#define NN_SUB(MS) ((MS) == 1 ? 8 : (MS) == 2 ? 4 : 2)
#define NT_COLS(MS) ((MS) == 1 ? 8 : (MS) == 2 ? 4 : 2)

/* Rows of B contiguous: 8 * NN_SUB columns per step, B converted in
 * registers; a is a dense MS x lda f32 buffer (alpha not applied). */
TGT INL void small_nn(enum fmt f, const int MS, int64_t n0, int64_t n1,
                      int64_t K, float alpha, const float *a, int64_t lda,
                      hsrc b, float beta, float *C, int64_t ldc)
{
    const int NS = NN_SUB(MS);
    for (int64_t n = n0; n < n1; n += 8 * NS) {
        __m256 acc[4][8];
        for (int s = 0; s < NS; s++)
            for (int i = 0; i < MS; i++)
                acc[i][s] = _mm256_setzero_ps();
        for (int64_t k = 0; k < K; k++) {
            const uint16_t *row = b.x + n + k * b.ks;
            __m256 bv[8];
            for (int s = 0; s < NS; s++)
                bv[s] = cvt8(f, zsk_ld8h(row + 8 * s, n1 - n - 8 * s));
            for (int i = 0; i < MS; i++) {
                __m256 av = _mm256_broadcast_ss(a + i * lda + k);
                for (int s = 0; s < NS; s++)
                    acc[i][s] = _mm256_fmadd_ps(av, bv[s], acc[i][s]);
            }
        }
        for (int i = 0; i < MS; i++)
            for (int s = 0; s < NS; s++)
                if (n1 - n - 8 * s > 0)
                    store8(C + i * ldc + n + 8 * s, n1 - n - 8 * s,
                           acc[i][s], alpha, beta);
    }
}

/* k contiguous in B's columns: dot products, 8 k per step. */
TGT INL void small_nt(enum fmt f, const int MS, int64_t n0, int64_t n1,
                      int64_t K, float alpha, const float *a, int64_t lda,
                      hsrc b, float beta, float *C, int64_t ldc)
{
    const int NCOL = NT_COLS(MS);
    for (int64_t n = n0; n < n1; n += NCOL) {
        int nb = n1 - n < NCOL ? (int)(n1 - n) : NCOL;
        const uint16_t *bp[8];
        __m256 acc[4][8];
        for (int c = 0; c < NCOL; c++) {
            bp[c] = b.x + (n + (c < nb ? c : 0)) * b.rs;
            for (int i = 0; i < MS; i++)
                acc[i][c] = _mm256_setzero_ps();
        }
        for (int64_t k = 0; k < K; k += 8) {
            int64_t kv = K - k;
            __m256 av[4];
            for (int i = 0; i < MS; i++)
                av[i] = kv >= 8 ? _mm256_loadu_ps(a + i * lda + k)
                                : _mm256_maskload_ps(a + i * lda + k, lanes(kv));
            for (int c = 0; c < NCOL; c++) {
                __m256 bv = cvt8(f, zsk_ld8h(bp[c] + k, kv));
                for (int i = 0; i < MS; i++)
                    acc[i][c] = _mm256_fmadd_ps(av[i], bv, acc[i][c]);
            }
        }
        for (int i = 0; i < MS; i++)
            for (int c = 0; c < nb; c++) {
                float *p = C + i * ldc + n + c;
                float v = alpha * hsum8(acc[i][c]);
                *p = beta != 0 ? v + beta * *p : v;
            }
    }
}

/* A skinny entry point for M = 1..4 (ZSK_GEMM_SMALL_M), the row count a
 * compile-time constant so the accumulators stay in registers. */
#define SMALL_CALL(F, MS)                                                     \
    (b.ks == 1 ? small_nt(F, MS, n0, n1, K, alpha, ap, lda, b, beta, C, ldc)  \
               : small_nn(F, MS, n0, n1, K, alpha, ap, lda, b, beta, C, ldc))
#define SMALL_ENTRY(NAME, F)                                                  \
    TGT static void NAME(int M, int64_t n0, int64_t n1, int64_t K,            \
                         float alpha, const void *a, int64_t lda,             \
                         zsk_gemm_src bs, float beta, float *C, int64_t ldc)  \
    {                                                                         \
        const float *ap = a;                                                  \
        hsrc b = {bs.x, bs.rs, bs.ks};                                        \
        switch (M) {                                                          \
        case 1: SMALL_CALL(F, 1); break;                                      \
        case 2: SMALL_CALL(F, 2); break;                                      \
        case 3: SMALL_CALL(F, 3); break;                                      \
        default: SMALL_CALL(F, 4); break;                                     \
        }                                                                     \
    }

SMALL_ENTRY(small_bf16, FMT_BF16)
SMALL_ENTRY(small_f16, FMT_F16)

/* ---- descriptors ---------------------------------------------------------- */

static bool usable(void)
{
    const zs_cpu_features *c = zs_cpu();
    return c->avx2 && c->fma && c->f16c;
}

/* Blocking: that of the f32 AVX2 descriptor (gemm_f32_avx2.c), whose
 * kernel these run. */
#define LOWP_AVX2(NAME, STR, TYPE, PACK, SMALL)                               \
    const zsk_gemm_desc NAME = {                                              \
        .name = STR, .type = TYPE, .isa = ZSK_GEMM_AVX2, .usable = usable,    \
        .mr = MR, .nr = NR, .kstep = 1, .alpha_in_pack = true,                \
        .kc = 1024, .mc = 42, .nc = 2048, .pack_a = PACK, .pack_b = PACK,     \
        .ukr = zsk_gemm_f32_avx2_6x16, .epi = zsk_sgemm_epi_avx2,              \
        .small = SMALL}

LOWP_AVX2(zsk_gemm_bf16_avx2, "bf16 avx2 6x16", ZSK_GEMM_BF16, pack_bf16,
          small_bf16);
LOWP_AVX2(zsk_gemm_f16_avx2, "f16 avx2 6x16", ZSK_GEMM_F16, pack_f16,
          small_f16);
