/*
 * gemm_bf16_avx512.c - the AVX-512 descriptors of the GEMM framework
 * (gemm.h) for 16-bit inputs, bf16 and f16 (the two share the packers):
 * packers, the bf16 pair micro-kernel and the skinny-M kernels.
 *
 * bf16 with AVX512_BF16: panels hold bf16 pairs (k = 2u, 2u+1 in one 32-bit
 * unit), the layout vdpbf16ps multiplies pairwise; the micro-kernel keeps a
 * MR x NR = 14 x 32 tile of C in 28 zmm accumulators and per k pair loads
 * two B vectors and broadcasts 14 A pairs (vdpbf16ps with {1to16} memory
 * operands). 28 independent chains cover vdpbf16ps' latency x throughput.
 * Odd K: the last unit's high half is zero.
 * f16 (and bf16 on AVX-512 without BF16): panels are converted to f32 (and
 * A scaled by alpha) while packing (vcvtph2ps / shift), and the 14 x 32
 * f32 kernel of gemm_f32_avx512.c runs on them.
 * Packing is one of two vector paths: k contiguous (rows of A, or columns
 * of B^T: 16x16 32-bit transposes) or rows contiguous (interleave /
 * convert whole k rows).
 * Skinny M (<= 4, e.g. decoding one token): no packing of B, which would
 * cost as much as the product; B rows are paired on the fly (vpunpck*wd)
 * or, for B^T, dot products run along k (vdpbf16ps then a lane sum).
 * Measured 1 thread, (1,768,768) bf16: 110 GFLOP/s against 18 through the
 * packed path (zsk_sgemm at that time: 50).
 */
#include <immintrin.h>
#include <string.h>
#include <stdlib.h>

#include "kernels/cpu/gemm.h"
#include "zs/core.h"

/* 14 x 32: the tile of the f32 kernel, which the f32-panel descriptors
 * share. */
#define MR 14
#define NV 2
#define NR (16 * NV)

/* zsk_gemm_src with its element type: x[r * rs + k * ks]. */
typedef struct hsrc {
    const uint16_t *x;
    int64_t rs, ks;
} hsrc;

#define T512 __attribute__((target("avx512f,avx512bw,avx512vl")))
#define TBF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
#define INL inline __attribute__((always_inline))
/* The micro-kernel's: prefetchw (every AVX-512 CPU has it) for the C tile. */
#define TUKR __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,prfchw")))

enum fmt { FMT_PAIRS, FMT_F16, FMT_BF16F32 };

/* ---- packing ---------------------------------------------------------- */

T512 static INL void transpose16(__m512i r[16])
{
    __m512i t[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; i++) {
        r[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        r[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        r[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        r[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    for (int j = 0; j < 4; j++) {
        __m512i a = _mm512_shuffle_i32x4(r[j], r[4 + j], 0x44);
        __m512i b = _mm512_shuffle_i32x4(r[8 + j], r[12 + j], 0x44);
        __m512i c = _mm512_shuffle_i32x4(r[j], r[4 + j], 0xee);
        __m512i d = _mm512_shuffle_i32x4(r[8 + j], r[12 + j], 0xee);
        t[j] = _mm512_shuffle_i32x4(a, b, 0x88);
        t[4 + j] = _mm512_shuffle_i32x4(a, b, 0xdd);
        t[8 + j] = _mm512_shuffle_i32x4(c, d, 0x88);
        t[12 + j] = _mm512_shuffle_i32x4(c, d, 0xdd);
    }
    for (int i = 0; i < 16; i++)
        r[i] = t[i];
}

/* 16 units of one row, k contiguous from p, kv valid k elements (rest 0). */
T512 static INL __m512i load_krun(enum fmt f, const uint16_t *p, int64_t kv)
{
    if (f == FMT_PAIRS) {
        __mmask32 m = kv >= 32 ? ~(__mmask32)0 : ((__mmask32)1 << kv) - 1;
        return _mm512_maskz_loadu_epi16(m, p);
    }
    __mmask16 m = kv >= 16 ? (__mmask16)~0 : (__mmask16)((1u << kv) - 1);
    __m256i h = _mm256_maskz_loadu_epi16(m, p);
    if (f == FMT_F16)
        return _mm512_castps_si512(_mm512_cvtph_ps(h));
    return _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16);
}

/* 16 units of consecutive rows at unit u: rows contiguous from p, rv valid
 * rows; ks is the k stride, kc the valid k range. */
T512 static INL __m512i load_rrun(enum fmt f, const uint16_t *p, int64_t ks,
                                  int64_t u, int64_t kc, int64_t rv)
{
    __mmask16 m = rv >= 16 ? (__mmask16)~0 : (__mmask16)((1u << rv) - 1);
    if (f == FMT_PAIRS) {
        __m512i lo = _mm512_cvtepu16_epi32(
            _mm256_maskz_loadu_epi16(m, p + 2 * u * ks));
        if (2 * u + 1 >= kc)
            return lo;
        __m512i hi = _mm512_cvtepu16_epi32(
            _mm256_maskz_loadu_epi16(m, p + (2 * u + 1) * ks));
        return _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16));
    }
    __m256i h = _mm256_maskz_loadu_epi16(m, p + u * ks);
    if (f == FMT_F16)
        return _mm512_castps_si512(_mm512_cvtph_ps(h));
    return _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16);
}

/* One panel of w rows (nrows valid) with k contiguous: 16 x 16 transposes. */
/* v times alpha when scale (f32 units only). */
T512 static INL __m512i scaled(__m512i v, bool scale, __m512 va)
{
    return scale ? _mm512_castps_si512(_mm512_mul_ps(_mm512_castsi512_ps(v), va))
                 : v;
}

T512 static INL void pack_panel_kcontig(enum fmt f, hsrc s,
                                        int64_t nrows, int64_t kc, int64_t ku,
                                        int w, bool scale, __m512 va,
                                        uint32_t *out)
{
    int kstep = f == FMT_PAIRS ? 2 : 1;
    for (int g0 = 0; g0 < w; g0 += 16) {
        int gw = w - g0 < 16 ? w - g0 : 16;
        __mmask16 sm = (__mmask16)((1u << gw) - 1);
        for (int64_t u0 = 0; u0 < ku; u0 += 16) {
            __m512i r[16];
            int64_t k0 = u0 * kstep;
            for (int i = 0; i < 16; i++)
                r[i] = g0 + i < nrows
                           ? load_krun(f, s.x + (g0 + i) * s.rs + k0, kc - k0)
                           : _mm512_setzero_si512();
            transpose16(r);
            int64_t un = ku - u0 < 16 ? ku - u0 : 16;
            for (int64_t u = 0; u < un; u++)
                _mm512_mask_storeu_epi32(out + (u0 + u) * w + g0, sm,
                                         scaled(r[u], scale, va));
        }
    }
}

/* One panel of w rows (nrows valid) with rows contiguous. */
T512 static INL void pack_panel_rcontig(enum fmt f, hsrc s,
                                        int64_t nrows, int64_t kc, int64_t ku,
                                        int w, bool scale, __m512 va,
                                        uint32_t *out)
{
    for (int64_t u = 0; u < ku; u++) {
        for (int g0 = 0; g0 < w; g0 += 16) {
            int gw = w - g0 < 16 ? w - g0 : 16;
            int64_t rv = nrows - g0 < 0 ? 0 : nrows - g0;
            __m512i v = scaled(load_rrun(f, s.x + g0, s.ks, u, kc, rv), scale,
                               va);
            _mm512_mask_storeu_epi32(out + u * w + g0,
                                     (__mmask16)((1u << gw) - 1), v);
        }
    }
}

T512 static INL void pack_any(enum fmt f, zsk_gemm_src src, int64_t rows,
                              int64_t kc, int w, float alpha, void *dst)
{
    hsrc s = {src.x, src.rs, src.ks};
    uint32_t *out = dst;
    int kstep = f == FMT_PAIRS ? 2 : 1;
    int64_t ku = (kc + kstep - 1) / kstep;
    bool scale = f != FMT_PAIRS && alpha != 1.0f;
    __m512 va = _mm512_set1_ps(alpha);
    for (int64_t r0 = 0; r0 < rows; r0 += w) {
        hsrc p = {s.x + r0 * s.rs, s.rs, s.ks};
        int64_t nrows = rows - r0 < w ? rows - r0 : w;
        uint32_t *o = out + r0 * ku;
        if (s.ks == 1)
            pack_panel_kcontig(f, p, nrows, kc, ku, w, scale, va, o);
        else
            pack_panel_rcontig(f, p, nrows, kc, ku, w, scale, va, o);
    }
}

T512 static void pack_pairs(zsk_gemm_src s, int64_t rows, int64_t kc, int w,
                            float alpha, void *out)
{
    pack_any(FMT_PAIRS, s, rows, kc, w, alpha, out);
}

T512 static void pack_f16(zsk_gemm_src s, int64_t rows, int64_t kc, int w,
                          float alpha, void *out)
{
    pack_any(FMT_F16, s, rows, kc, w, alpha, out);
}

T512 static void pack_bf16f32(zsk_gemm_src s, int64_t rows, int64_t kc, int w,
                              float alpha, void *out)
{
    pack_any(FMT_BF16F32, s, rows, kc, w, alpha, out);
}

/* ---- micro-kernels ---------------------------------------------------- */

/* C[i][16v..] = alpha * acc + beta * C, rows < mr, columns < nr. */
T512 static INL void store_tile(__m512 acc[MR][NV], float *c, int64_t ldc,
                                int mr, int nr, float alpha, float beta)
{
    __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
    if (mr == MR && nr == NR) {
        for (int i = 0; i < MR; i++)
            for (int v = 0; v < NV; v++) {
                float *p = c + i * ldc + 16 * v;
                __m512 r = _mm512_mul_ps(va, acc[i][v]);
                if (beta != 0)
                    r = _mm512_fmadd_ps(vb, _mm512_loadu_ps(p), r);
                _mm512_storeu_ps(p, r);
            }
        return;
    }
    __mmask16 m[NV];
    for (int v = 0; v < NV; v++) {
        int n = nr - 16 * v;
        m[v] = n >= 16 ? (__mmask16)~0 : n <= 0 ? 0 : (__mmask16)((1u << n) - 1);
    }
    for (int i = 0; i < MR; i++) {
        if (i >= mr)
            break;
        for (int v = 0; v < NV; v++) {
            float *p = c + i * ldc + 16 * v;
            __m512 r = _mm512_mul_ps(va, acc[i][v]);
            if (beta != 0)
                r = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m[v], p), r);
            _mm512_mask_storeu_ps(p, m[v], r);
        }
    }
}

/* Asks for the mr rows of a C tile (2 lines each) in L1, for writing: the
 * tile's first touch otherwise stalls the kernel's final stores on misses
 * (C of a K = 384 product is written once, straight to memory). Measured
 * on Zen 4 (AMD EPYC, 32 KiB L1d, 1 MiB L2; 1 thread, thread CPU time, the
 * machine loaded): the kernel inside the driver at (2048, 1152, 384) NT
 * went from 185-190 to 193-200 GFLOP/s. The kernel alone, panels in
 * L1/L2, runs 220-226 GFLOP/s (94-96% of the 236 bf16 peak); the whole
 * GEMM at GPT small's shapes 185-204 (78-86%), packing A taking 3-13%
 * (most for dw = g^T x: A packed rows-contiguous, 14-wide, ~9 GB/s). */
TUKR static INL void prefetch_tile(const float *c, int64_t ldc, int mr)
{
    for (int i = 0; i < mr; i++) {
        __builtin_prefetch(c + i * ldc, 1, 3);
        __builtin_prefetch(c + i * ldc + 16, 1, 3);
    }
}

/* gemm_bf16_avx512_14x32: ku bf16 pairs; a: [ku][MR], b: [ku][NR]. */
TUKR static void kernel_bf16(int64_t ku, const void *ap, const void *bp,
                              float *c, int64_t ldc, int mr, int nr,
                              float alpha, float beta)
{
    const uint32_t *restrict a = ap, *restrict b = bp;
    __m512 acc[MR][NV];
    for (int i = 0; i < MR; i++)
        for (int v = 0; v < NV; v++)
            acc[i][v] = _mm512_setzero_ps();
    prefetch_tile(c, ldc, mr);
    for (int64_t u = 0; u < ku; u++) {
        __m512bh bv[NV];
        for (int v = 0; v < NV; v++)
            bv[v] = (__m512bh)_mm512_load_si512(b + u * NR + 16 * v);
        for (int i = 0; i < MR; i++) {
            __m512bh av = (__m512bh)_mm512_set1_epi32((int)a[u * MR + i]);
            for (int v = 0; v < NV; v++)
                acc[i][v] = _mm512_dpbf16_ps(acc[i][v], bv[v], av);
        }
    }
    store_tile(acc, c, ldc, mr, nr, alpha, beta);
}

/* ---- skinny M: op(B) read in place ------------------------------------ */

static INL __mmask16 mask16(int64_t n)
{
    return n >= 16 ? (__mmask16)~0 : n <= 0 ? 0 : (__mmask16)((1u << n) - 1);
}

static INL __mmask32 mask32(int64_t n)
{
    return n >= 32 ? ~(__mmask32)0 : n <= 0 ? 0 : ((__mmask32)1 << n) - 1;
}

/* C[16 columns, mask m] = alpha * v + beta * C. */
T512 static INL void store16(float *p, __mmask16 m, __m512 v, float alpha,
                             float beta)
{
    __m512 r = _mm512_mul_ps(_mm512_set1_ps(alpha), v);
    if (beta != 0)
        r = _mm512_fmadd_ps(_mm512_set1_ps(beta), _mm512_maskz_loadu_ps(m, p),
                            r);
    _mm512_mask_storeu_ps(p, m, r);
}

T512 static INL void store1(float *p, float v, float alpha, float beta)
{
    *p = alpha * v + (beta != 0 ? beta * *p : 0.0f);
}

/* Columns per step of the NT kernels and 32-column groups of the NN
 * kernels, per M (at most 8 and 4): enough independent chains to cover
 * the latency of vdpbf16ps / FMA. */
#define NT_COLS(MS) ((MS) == 1 ? 8 : 4)
#define NN_SUB(MS) ((MS) == 1 ? 4 : 2)

static INL uint32_t load_pair(const uint16_t *p)
{
    uint32_t u;
    memcpy(&u, p, sizeof u);
    return u;
}

/* bf16, rows of B contiguous: NN_SUB x 32 columns per step. vpunpck{l,h}wd
 * interleaves rows k, k+1 into pairs but orders columns within 128-bit
 * lanes (lo: 8L+0..3, hi: 8L+4..7); the epilogue puts them back. */
TBF16 static INL void small_bf16_nn(enum fmt f, const int MS, int64_t n0, int64_t n1,
                                    int64_t K, float alpha, const uint16_t *a,
                                    int64_t lda, hsrc b, float beta,
                                    float *C, int64_t ldc)
{
    const int NS = NN_SUB(MS);
    for (int64_t n = n0; n < n1; n += 32 * NS) {
        __mmask32 m[4];
        __m512 lo[4][4], hi[4][4];
        for (int s = 0; s < NS; s++) {
            m[s] = mask32(n1 - n - 32 * s);
            for (int i = 0; i < MS; i++)
                lo[i][s] = hi[i][s] = _mm512_setzero_ps();
        }
        for (int64_t k = 0; k < K; k += 2) {
            const uint16_t *r0 = b.x + n + k * b.ks, *r1 = r0 + b.ks;
            __m512bh l[4], h[4];
            for (int s = 0; s < NS; s++) {
                __m512i x0 = _mm512_maskz_loadu_epi16(m[s], r0 + 32 * s);
                __m512i x1 = k + 1 < K
                                 ? _mm512_maskz_loadu_epi16(m[s], r1 + 32 * s)
                                 : _mm512_setzero_si512();
                l[s] = (__m512bh)_mm512_unpacklo_epi16(x0, x1);
                h[s] = (__m512bh)_mm512_unpackhi_epi16(x0, x1);
            }
            for (int i = 0; i < MS; i++) {
                __m512bh av = (__m512bh)_mm512_set1_epi32(
                    (int)load_pair(a + i * lda + k));
                for (int s = 0; s < NS; s++) {
                    lo[i][s] = _mm512_dpbf16_ps(lo[i][s], l[s], av);
                    hi[i][s] = _mm512_dpbf16_ps(hi[i][s], h[s], av);
                }
            }
        }
        for (int i = 0; i < MS; i++)
            for (int s = 0; s < NS; s++) {
                __m512 t0 = _mm512_shuffle_f32x4(lo[i][s], hi[i][s], 0x44);
                __m512 t1 = _mm512_shuffle_f32x4(lo[i][s], hi[i][s], 0xee);
                float *p = C + i * ldc + n + 32 * s;
                int64_t left = n1 - n - 32 * s;
                store16(p, mask16(left), _mm512_shuffle_f32x4(t0, t0, 0xd8),
                        alpha, beta);
                store16(p + 16, mask16(left - 16),
                        _mm512_shuffle_f32x4(t1, t1, 0xd8), alpha, beta);
            }
    }
}

/* bf16, k contiguous in B's columns: dot products, 32 k per step. */
TBF16 static INL void small_bf16_nt(enum fmt f, const int MS, int64_t n0, int64_t n1,
                                    int64_t K, float alpha, const uint16_t *a,
                                    int64_t lda, hsrc b, float beta,
                                    float *C, int64_t ldc)
{
    const int NCOL = NT_COLS(MS);
    for (int64_t n = n0; n < n1; n += NCOL) {
        int nb = n1 - n < NCOL ? (int)(n1 - n) : NCOL;
        const uint16_t *bp[8];
        __m512 acc[4][8];
        for (int c = 0; c < NCOL; c++) {
            bp[c] = b.x + (n + (c < nb ? c : 0)) * b.rs;
            for (int i = 0; i < MS; i++)
                acc[i][c] = _mm512_setzero_ps();
        }
        for (int64_t k = 0; k < K; k += 32) {
            __mmask32 m = mask32(K - k);
            __m512bh bv[8];
            for (int c = 0; c < NCOL; c++)
                bv[c] = (__m512bh)_mm512_maskz_loadu_epi16(m, bp[c] + k);
            for (int i = 0; i < MS; i++) {
                __m512bh av =
                    (__m512bh)_mm512_maskz_loadu_epi16(m, a + i * lda + k);
                for (int c = 0; c < NCOL; c++)
                    acc[i][c] = _mm512_dpbf16_ps(acc[i][c], bv[c], av);
            }
        }
        for (int i = 0; i < MS; i++)
            for (int c = 0; c < NCOL; c++)
                if (c < nb)
                    store1(C + i * ldc + n + c,
                           _mm512_reduce_add_ps(acc[i][c]), alpha, beta);
    }
}

/* 16 halves (f16 or bf16) at p, mask m, as f32. */
T512 static INL __m512 load16_f32(enum fmt f, const uint16_t *p, __mmask16 m)
{
    __m256i h = _mm256_maskz_loadu_epi16(m, p);
    if (f == FMT_F16)
        return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* f32 FMA on B converted in registers, rows of B contiguous. */
T512 static INL void small_f32_nn(enum fmt f, const int MS, int64_t n0,
                                  int64_t n1, int64_t K, float alpha,
                                  const float *a, int64_t lda, hsrc b,
                                  float beta, float *C, int64_t ldc)
{
    const int NS = 2 * NN_SUB(MS);
    for (int64_t n = n0; n < n1; n += 16 * NS) {
        __mmask16 m[8];
        __m512 acc[4][8];
        for (int s = 0; s < NS; s++) {
            m[s] = mask16(n1 - n - 16 * s);
            for (int i = 0; i < MS; i++)
                acc[i][s] = _mm512_setzero_ps();
        }
        for (int64_t k = 0; k < K; k++) {
            __m512 bv[8];
            for (int s = 0; s < NS; s++)
                bv[s] = load16_f32(f, b.x + n + k * b.ks + 16 * s, m[s]);
            for (int i = 0; i < MS; i++) {
                __m512 av = _mm512_set1_ps(a[i * lda + k]);
                for (int s = 0; s < NS; s++)
                    acc[i][s] = _mm512_fmadd_ps(av, bv[s], acc[i][s]);
            }
        }
        for (int i = 0; i < MS; i++)
            for (int s = 0; s < NS; s++)
                store16(C + i * ldc + n + 16 * s, m[s], acc[i][s], alpha,
                        beta);
    }
}

/* f32 FMA dot products, k contiguous in B's columns, 16 k per step. */
T512 static INL void small_f32_nt(enum fmt f, const int MS, int64_t n0,
                                  int64_t n1, int64_t K, float alpha,
                                  const float *a, int64_t lda, hsrc b,
                                  float beta, float *C, int64_t ldc)
{
    const int NCOL = NT_COLS(MS);
    for (int64_t n = n0; n < n1; n += NCOL) {
        int nb = n1 - n < NCOL ? (int)(n1 - n) : NCOL;
        const uint16_t *bp[8];
        __m512 acc[4][8];
        for (int c = 0; c < NCOL; c++) {
            bp[c] = b.x + (n + (c < nb ? c : 0)) * b.rs;
            for (int i = 0; i < MS; i++)
                acc[i][c] = _mm512_setzero_ps();
        }
        for (int64_t k = 0; k < K; k += 16) {
            __mmask16 m = mask16(K - k);
            __m512 bv[8];
            for (int c = 0; c < NCOL; c++)
                bv[c] = load16_f32(f, bp[c] + k, m);
            for (int i = 0; i < MS; i++) {
                __m512 av = _mm512_maskz_loadu_ps(m, a + i * lda + k);
                for (int c = 0; c < NCOL; c++)
                    acc[i][c] = _mm512_fmadd_ps(av, bv[c], acc[i][c]);
            }
        }
        for (int i = 0; i < MS; i++)
            for (int c = 0; c < NCOL; c++)
                if (c < nb)
                    store1(C + i * ldc + n + c,
                           _mm512_reduce_add_ps(acc[i][c]), alpha, beta);
    }
}

/* Instantiates a skinny entry point for M = 1..4 (ZSK_GEMM_SMALL_M) with
 * the row count a compile-time constant, so accumulators stay in zmm. */
#define SMALL_CALL(NN, NT, F, MS)                                             \
    (b.ks == 1 ? NT(F, MS, n0, n1, K, alpha, ap, lda, b, beta, C, ldc)        \
               : NN(F, MS, n0, n1, K, alpha, ap, lda, b, beta, C, ldc))
#define SMALL_ENTRY(NAME, TGT, NN, NT, AT, F)                                 \
    TGT static void NAME(int M, int64_t n0, int64_t n1, int64_t K,            \
                         float alpha, const void *a, int64_t lda,             \
                         zsk_gemm_src bs, float beta, float *C,       \
                         int64_t ldc)                                         \
    {                                                                         \
        const AT *ap = a;                                                     \
        hsrc b = {bs.x, bs.rs, bs.ks};                                        \
        switch (M) {                                                          \
        case 1: SMALL_CALL(NN, NT, F, 1); break;                              \
        case 2: SMALL_CALL(NN, NT, F, 2); break;                              \
        case 3: SMALL_CALL(NN, NT, F, 3); break;                              \
        default: SMALL_CALL(NN, NT, F, 4); break;                             \
        }                                                                     \
    }

SMALL_ENTRY(small_bf16, TBF16, small_bf16_nn, small_bf16_nt, uint16_t,
            FMT_PAIRS)
SMALL_ENTRY(small_f16, T512, small_f32_nn, small_f32_nt, float, FMT_F16)
SMALL_ENTRY(small_bf16f32, T512, small_f32_nn, small_f32_nt, float,
            FMT_BF16F32)

/* ---- descriptors -------------------------------------------------------- */

/* Cache blocks in 4-byte units, measured on Zen 5 (48 KiB L1d, 1 MiB L2)
 * with bf16 2048^3 and (1024,3072,768), 1 thread: KU 384 / MC 112 / NC 1024
 * gave 445-460 GFLOP/s against 376-396 for KU 256 / MC 224 / NC 2048 and
 * 413-423 for MC 168-448. A B micro-panel (KU x NR x 4 = 48 KiB) streams
 * through L1 and is reused by MC / MR = 8 A micro-panels; the A block
 * (MC x KU x 4 = 168 KiB) and the B block (KU x NC x 4 = 1.5 MiB) share L2
 * and L3. K = 768 (bf16) is one k block. */
#define KU 384
#define MC 112
#define NC 1024

static bool have_avx512(void)
{
    const zs_cpu_features *c = zs_cpu();
    return c->avx512f && c->avx512bw && c->avx512vl;
}

static bool have_avx512bf16(void)
{
    return have_avx512() && zs_cpu()->avx512_bf16;
}

const zsk_gemm_desc zsk_gemm_bf16_avx512bf16 = {
    .name = "bf16 avx512bf16 14x32", .type = ZSK_GEMM_BF16,
    .isa = ZSK_GEMM_AVX512, .usable = have_avx512bf16, .mr = MR, .nr = NR,
    .kstep = 2, .alpha_in_pack = false, .kc = 2 * KU, .mc = MC, .nc = NC,
    .pack_a = pack_pairs, .pack_b = pack_pairs, .ukr = kernel_bf16,
    .epi = zsk_sgemm_epi_avx512, .small = small_bf16};
const zsk_gemm_desc zsk_gemm_bf16_avx512 = {
    .name = "bf16 avx512f 14x32", .type = ZSK_GEMM_BF16,
    .isa = ZSK_GEMM_AVX512, .usable = have_avx512, .mr = MR, .nr = NR,
    .kstep = 1, .alpha_in_pack = true, .kc = KU, .mc = MC, .nc = NC,
    .pack_a = pack_bf16f32, .pack_b = pack_bf16f32,
    .ukr = zsk_gemm_f32_avx512_14x32, .epi = zsk_sgemm_epi_avx512,
    .small = small_bf16f32};
const zsk_gemm_desc zsk_gemm_f16_avx512 = {
    .name = "f16 avx512f 14x32", .type = ZSK_GEMM_F16,
    .isa = ZSK_GEMM_AVX512, .usable = have_avx512, .mr = MR, .nr = NR,
    .kstep = 1, .alpha_in_pack = true, .kc = KU, .mc = MC, .nc = NC,
    .pack_a = pack_f16, .pack_b = pack_f16, .ukr = zsk_gemm_f32_avx512_14x32,
    .epi = zsk_sgemm_epi_avx512, .small = small_f16};
