/*
 * attention_avx2.c - the f32 flash-attention forward and backward of
 * AVX2 + FMA CPUs (ZS_CPU_ISA=avx2, or a CPU that stops there), for head
 * sizes D % 16 == 0 and D <= 128. attention.c calls it from its f32 task
 * bodies at ISA level 1 (zsk_attention_avx2_usable); other D keep its
 * 8-lane generic tiling. The algorithm and the arithmetic are those of
 * attention.c (FlashAttention-2: online softmax over key tiles, the
 * backward recomputing p from lse); what differs is the blocking, so every
 * K / V / Q load feeds several FMAs.
 *
 * Everything is one micro-kernel, as in BLIS: C[MR rows, 16 columns] (two
 * ymm) += sum_k A[m, k] B[k, 0:16] with MR <= 6 rows in 12 accumulators,
 * 2 loads of B and one broadcast of A per k (15 of the 16 ymm registers,
 * 12 FMAs per 8 loads). A is addressed by strides of m and k, so the five
 * products of attention are the same kernel on different views:
 *   scores   S [rows, BK]  = Q [rows, D] . Kt [D, BK]   (k packed transposed)
 *   dP       [rows, BK]    = dO [rows, D] . Vt [D, BK]
 *   output   O [rows, D]  += P [rows, BK] . V [BK, D]   (O rescaled by corr)
 *   dV, dK   [BK, D]      += P^T, dS^T [BK, rows] . dO, Q [rows, D]
 *   dQ       [rows, D]    += dS [rows, BK] . K [BK, D]
 * BK = 32 keys per tile (two 16-column blocks of scores). The softmax of a
 * tile row (scale, ALiBi bias, causal mask, max, exp, sum) runs on 4 ymm
 * with zsi_exp_m256, the same polynomial as attention.c's scalar exp.
 * Causal: a key tile is visited only by the query rows that see at least
 * one of its keys (exact row ranges, no masked-out tiles); within the
 * diagonal tile the invisible lanes are masked to p = 0.
 *
 * Forward: a call is one (b, h) and a block of up to 64 query rows; o (the
 * block's output rows) is the accumulator. Backward: a call is one (b, h);
 * for each key tile, blocks of RB = 72 query rows: S and dP, then
 * P = exp(S scale + bias - lse), dS = P (dP - delta) scale (delta = dO . O
 * recomputed per block: 1/160 of the block's FMAs), then dV, dK (tile
 * accumulators) and dQ (in place). Scratch lives on the stack (<= 76 KiB
 * at D = 128). Threads: none here; attention.c runs calls in its pool.
 *
 * Measured (bench/attention --B 8 --rounds 3, GPT-small heads B=8 H=6
 * D=64 causal, 2 threads, AMD EPYC (Zen 4) under a load of 15-19 on its
 * 2 cores; fraction of the FP32 FMA peak as medians over rounds, "wall"
 * against the peak measured in the same round, "cpu" FLOPs per CPU-second
 * against the per-core peak in thread CPU time, 118 GFLOP/s):
 *                 forward wall / cpu     backward wall / cpu
 *   T = 256       36% / 44%  (was 21 / 22)   56% / 54%  (was 30 / 25)
 *   T = 1024      68% / 61%  (was 25 / 25)   78% / 74%  (was 29 / 32)
 * ("was": the 8-lane tiling of attention.c under the same cap). The
 * AVX-512 path of attention.c measured 31-42% / 31-39% in the same runs:
 * on this CPU, whose AVX-512 FMAs are two 256-bit halves, these ymm
 * blocks are faster than its zmm tiles.
 */
#pragma GCC optimize("fp-contract=fast")

#include <math.h>
#include <string.h>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/vmath.h"

bool zsk_attention_avx2_usable(const zsk_attn *a)
{
#if defined(__x86_64__)
    return a->dt == ZS_F32 && a->D % 16 == 0 && a->D > 0 && a->D <= 128;
#else
    (void)a;
    return false;
#endif
}

#if defined(__x86_64__)
#include <immintrin.h>

#define TGT __attribute__((target("avx2,fma,f16c")))
#define INL static inline __attribute__((always_inline, target("avx2,fma,f16c")))

enum { BK = 32, RB = 72, MR = 6, DMAX = 128, BQMAX = 64 };

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

/* C[m, 0:16] = (acc ? C[m, 0:16] * (cs ? cs[m] : 1) : 0)
 *            + sum_{k<K} A[m am + k ak] B[k bs + 0:16]   for m < M (<= MR).
 * M and ak == 1 are compile-time constants after inlining. */
INL void mk(int M, int64_t K, const float *A, int64_t am, int64_t ak,
            const float *B, int64_t bs, float *C, int64_t ldc, int acc,
            const float *cs)
{
    __m256 c0[MR], c1[MR];
#pragma GCC unroll 6
    for (int m = 0; m < M; m++) {
        if (acc) {
            c0[m] = _mm256_loadu_ps(C + m * ldc);
            c1[m] = _mm256_loadu_ps(C + m * ldc + 8);
            if (cs) {
                __m256 f = _mm256_broadcast_ss(cs + m);
                c0[m] = _mm256_mul_ps(c0[m], f);
                c1[m] = _mm256_mul_ps(c1[m], f);
            }
        } else {
            c0[m] = c1[m] = _mm256_setzero_ps();
        }
    }
#pragma GCC unroll 2
    for (int64_t k = 0; k < K; k++) {
        __m256 b0 = _mm256_loadu_ps(B + k * bs), b1 = _mm256_loadu_ps(B + k * bs + 8);
        const float *ak_ = A + k * ak;
#pragma GCC unroll 6
        for (int m = 0; m < M; m++) {
            __m256 x = _mm256_broadcast_ss(ak_ + m * am);
            c0[m] = _mm256_fmadd_ps(x, b0, c0[m]);
            c1[m] = _mm256_fmadd_ps(x, b1, c1[m]);
        }
    }
#pragma GCC unroll 6
    for (int m = 0; m < M; m++) {
        _mm256_storeu_ps(C + m * ldc, c0[m]);
        _mm256_storeu_ps(C + m * ldc + 8, c1[m]);
    }
}

/* mk over M rows (any count) and N columns (a multiple of 16); A
 * row-major (ak == 1) when rowmajor, else A transposed (am == 1). Column
 * block n reads B + n and writes C + n; cs is per row. */
#define MK_ROWS(NAME, AM, AK)                                                 \
    INL void NAME(int64_t M, int64_t N, int64_t K, const float *A,           \
                  int64_t lda, const float *B, int64_t bs, float *C,          \
                  int64_t ldc, int acc, const float *cs)                      \
    {                                                                         \
        for (int64_t n = 0; n < N; n += 16) {                                 \
            int64_t m = 0;                                                    \
            for (; m + MR <= M; m += MR)                                      \
                mk(MR, K, A + m * (AM), (AM), (AK), B + n, bs,                \
                   C + m * ldc + n, ldc, acc, cs ? cs + m : NULL);            \
            const float *a_ = A + m * (AM), *c_ = cs ? cs + m : NULL;         \
            float *C_ = C + m * ldc + n;                                      \
            switch (M - m) {                                                  \
            case 5: mk(5, K, a_, (AM), (AK), B + n, bs, C_, ldc, acc, c_); break; \
            case 4: mk(4, K, a_, (AM), (AK), B + n, bs, C_, ldc, acc, c_); break; \
            case 3: mk(3, K, a_, (AM), (AK), B + n, bs, C_, ldc, acc, c_); break; \
            case 2: mk(2, K, a_, (AM), (AK), B + n, bs, C_, ldc, acc, c_); break; \
            case 1: mk(1, K, a_, (AM), (AK), B + n, bs, C_, ldc, acc, c_); break; \
            default: break;                                                   \
            }                                                                 \
        }                                                                     \
    }
MK_ROWS(mk_rows, lda, 1)  /* A[m, k] at A[m lda + k] */
MK_ROWS(mk_rowsT, 1, lda) /* A[m, k] at A[k lda + m] */

/* The 8 x 8 block of x at rows st apart, transposed into xt (rows BK
 * apart): 24 shuffles for 8 loads and 8 stores. */
INL void transpose8(const float *x, int64_t st, float *xt)
{
    __m256 r[8], t[8];
    for (int i = 0; i < 8; i++)
        r[i] = _mm256_loadu_ps(x + i * st);
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
        r[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
        r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
        r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
    }
    for (int i = 0; i < 4; i++) {
        _mm256_storeu_ps(xt + i * BK, _mm256_permute2f128_ps(r[i], r[i + 4], 0x20));
        _mm256_storeu_ps(xt + (i + 4) * BK, _mm256_permute2f128_ps(r[i], r[i + 4], 0x31));
    }
}

/* xt[d, j] = x[j, d] for j < n (rows st apart), 0 for n <= j < BK;
 * D % 8 == 0. Groups of 8 keys by 8 x 8 transposes, a short last group
 * element by element. */
INL void pack_t(const float *restrict x, int64_t st, int64_t n, int64_t D,
                float *restrict xt)
{
    int64_t j0 = 0;
    for (; j0 + 8 <= n; j0 += 8)
        for (int64_t d = 0; d < D; d += 8)
            transpose8(x + j0 * st + d, st, xt + d * BK + j0);
    if (j0 == BK)
        return;
    for (int64_t d = 0; d < D; d++)
        for (int64_t j = j0; j < BK; j++)
            xt[d * BK + j] = j < n ? x[j * st + d] : 0;
}

INL float hsum8(__m256 v)
{
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    return _mm_cvtss_f32(_mm_add_ss(x, _mm_movehdup_ps(x)));
}

INL float hmax8(__m256 v)
{
    __m128 x = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_max_ps(x, _mm_movehl_ps(x, x));
    return _mm_cvtss_f32(_mm_max_ss(x, _mm_movehdup_ps(x)));
}

/* The biased, scaled scores of one tile row into x[4]: s scale - slope
 * (pos - j0 - j), -inf for lanes j >= nvis. */
INL void tile_scores(const float *s, int64_t nvis, float scale, float slope,
                     int64_t pos, int64_t j0, __m256 x[4])
{
    const __m256 iota = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7);
    __m256 vs = _mm256_set1_ps(scale), vl = _mm256_set1_ps(slope);
    __m256 ninf = _mm256_set1_ps(-INFINITY), lim = _mm256_set1_ps((float)nvis);
    for (int u = 0; u < 4; u++) {
        __m256 j = _mm256_add_ps(iota, _mm256_set1_ps((float)(8 * u)));
        __m256 dist = _mm256_sub_ps(_mm256_set1_ps((float)(pos - j0)), j);
        __m256 v = _mm256_fnmadd_ps(vl, dist, _mm256_mul_ps(_mm256_loadu_ps(s + 8 * u), vs));
        x[u] = _mm256_blendv_ps(ninf, v, _mm256_cmp_ps(j, lim, _CMP_LT_OQ));
    }
}

/* Online softmax of one tile row: s [BK] becomes p = exp(x - m_new) (0
 * where invisible), l and m are updated; returns the factor acc must be
 * multiplied by (exp(m_old - m_new); 1 when the row saw nothing yet). */
INL float online_row(float *s, int64_t nvis, float scale, float slope,
                     int64_t pos, int64_t j0, float *m, float *l)
{
    __m256 x[4];
    tile_scores(s, nvis, scale, slope, pos, j0, x);
    float mx = hmax8(_mm256_max_ps(_mm256_max_ps(x[0], x[1]),
                                   _mm256_max_ps(x[2], x[3])));
    mx = mx > *m ? mx : *m;
    if (mx == -INFINITY) { /* nothing visible so far: p = 0, acc = 0 */
        memset(s, 0, BK * sizeof *s);
        return 1;
    }
    __m256 vm = _mm256_set1_ps(mx), sum = _mm256_setzero_ps();
    for (int u = 0; u < 4; u++) {
        __m256 p = zsi_exp_m256(_mm256_sub_ps(x[u], vm));
        p = _mm256_and_ps(p, _mm256_cmp_ps(x[u], _mm256_set1_ps(-INFINITY), _CMP_NEQ_OQ));
        _mm256_storeu_ps(s + 8 * u, p);
        sum = _mm256_add_ps(sum, p);
    }
    float corr = zsi_exp_f32_clamped(*m - mx);
    *l = *l * corr + hsum8(sum);
    *m = mx;
    return corr;
}

/* Keys of tile j0 (nk of them) visible to the query at absolute pos. */
static int64_t visible(const zsk_attn *a, int64_t pos, int64_t j0, int64_t nk)
{
    return a->causal ? max64(0, min64(nk, pos - j0 + 1)) : nk;
}

TGT void zsk_attention_avx2_forward(const zsk_attn *a, int64_t bh, int64_t i0,
                                    int64_t nq, float *o, float *lse)
{
    int64_t D = a->D, b = bh / a->H, h = bh % a->H;
    const float *q = (const float *)a->q + b * a->sq[0] + h * a->sq[1];
    const float *k = (const float *)a->k + b * a->sk[0] + h * a->sk[1];
    const float *v = (const float *)a->v + b * a->sv[0] + h * a->sv[1];
    int64_t sq = a->sq[2], sk = a->sk[2], sv = a->sv[2];
    float kt[DMAX * BK] __attribute__((aligned(32)));
    float s[BQMAX * BK] __attribute__((aligned(32)));
    float m[BQMAX], l[BQMAX], corr[BQMAX];
    float scale = (float)a->scale, slope = a->slopes ? (float)a->slopes[h] : 0;
    int64_t kend = a->causal ? min64(a->Tk, a->q_offset + i0 + nq) : a->Tk;
    for (int64_t i = 0; i < nq; i++)
        m[i] = -INFINITY, l[i] = 0, corr[i] = 1;
    memset(o, 0, (size_t)(nq * D) * sizeof *o);
    for (int64_t j0 = 0; j0 < kend; j0 += BK) {
        int64_t nk = min64(BK, kend - j0);
        /* rows before r0 see none of this tile's keys */
        int64_t r0 = a->causal ? max64(0, j0 - a->q_offset - i0) : 0, nr = nq - r0;
        pack_t(k + j0 * sk, sk, nk, D, kt);
        mk_rows(nr, BK, D, q + (i0 + r0) * sq, sq, kt, BK, s + r0 * BK, BK, 0, NULL);
        for (int64_t r = r0; r < nq; r++) {
            int64_t pos = a->q_offset + i0 + r;
            corr[r] = online_row(s + r * BK, visible(a, pos, j0, nk), scale, slope,
                                 pos, j0, &m[r], &l[r]);
        }
        mk_rows(nr, D, nk, s + r0 * BK, BK, v + j0 * sv, sv, o + r0 * D, D, 1,
                corr + r0);
    }
    for (int64_t i = 0; i < nq; i++) {
        __m256 inv = _mm256_set1_ps(l[i] > 0 ? 1 / l[i] : 0);
        for (int64_t d = 0; d < D; d += 8)
            _mm256_storeu_ps(o + i * D + d, _mm256_mul_ps(inv, _mm256_loadu_ps(o + i * D + d)));
        if (lse)
            lse[i] = l[i] > 0 ? m[i] + (float)log((double)l[i]) : -INFINITY;
    }
}

INL float dot_v(const float *x, const float *y, int64_t D)
{
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    for (int64_t d = 0; d < D; d += 16) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + d), _mm256_loadu_ps(y + d), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + d + 8), _mm256_loadu_ps(y + d + 8), s1);
    }
    return hsum8(_mm256_add_ps(s0, s1));
}

/* One tile row of the backward: s [BK] becomes p = exp(x - L) and dp [BK]
 * becomes ds = p (dp - delta) scale, both 0 where invisible. */
INL void bw_row(float *s, float *dp, int64_t nvis, float scale, float slope,
                int64_t pos, int64_t j0, float L, float delta)
{
    if (L == -INFINITY)
        nvis = 0;
    __m256 x[4], vL = _mm256_set1_ps(L), vd = _mm256_set1_ps(delta);
    __m256 vs = _mm256_set1_ps(scale), ninf = _mm256_set1_ps(-INFINITY);
    tile_scores(s, nvis, scale, slope, pos, j0, x);
    for (int u = 0; u < 4; u++) {
        __m256 live = _mm256_cmp_ps(x[u], ninf, _CMP_NEQ_OQ);
        __m256 p = _mm256_and_ps(live, zsi_exp_m256(_mm256_sub_ps(x[u], vL)));
        __m256 g = _mm256_sub_ps(_mm256_loadu_ps(dp + 8 * u), vd);
        _mm256_storeu_ps(s + 8 * u, p);
        _mm256_storeu_ps(dp + 8 * u, _mm256_mul_ps(_mm256_mul_ps(p, g), vs));
    }
}

TGT void zsk_attention_avx2_backward(const zsk_attn *a, int64_t bh,
                                     const float *o, const float *lse,
                                     const float *dout, int64_t sd, float *dq,
                                     float *dk, float *dv)
{
    int64_t D = a->D, Tq = a->Tq, b = bh / a->H, h = bh % a->H;
    const float *q = (const float *)a->q + b * a->sq[0] + h * a->sq[1];
    const float *k = (const float *)a->k + b * a->sk[0] + h * a->sk[1];
    const float *v = (const float *)a->v + b * a->sv[0] + h * a->sv[1];
    int64_t sq = a->sq[2], sk = a->sk[2], sv = a->sv[2];
    float kt[DMAX * BK] __attribute__((aligned(32)));
    float vt[DMAX * BK] __attribute__((aligned(32)));
    float dkb[BK * DMAX] __attribute__((aligned(32)));
    float dvb[BK * DMAX] __attribute__((aligned(32)));
    float s[RB * BK] __attribute__((aligned(32)));
    float dp[RB * BK] __attribute__((aligned(32)));
    float scale = (float)a->scale, slope = a->slopes ? (float)a->slopes[h] : 0;
    memset(dq, 0, (size_t)(Tq * D) * sizeof *dq);
    for (int64_t j0 = 0; j0 < a->Tk; j0 += BK) {
        int64_t nk = min64(BK, a->Tk - j0);
        pack_t(k + j0 * sk, sk, nk, D, kt);
        pack_t(v + j0 * sv, sv, nk, D, vt);
        memset(dkb, 0, (size_t)(BK * D) * sizeof *dkb);
        memset(dvb, 0, (size_t)(BK * D) * sizeof *dvb);
        int64_t i1 = a->causal ? max64(0, j0 - a->q_offset) : 0;
        for (int64_t ib = i1; ib < Tq; ib += RB) {
            int64_t nr = min64(RB, Tq - ib);
            mk_rows(nr, BK, D, q + ib * sq, sq, kt, BK, s, BK, 0, NULL);
            mk_rows(nr, BK, D, dout + ib * sd, sd, vt, BK, dp, BK, 0, NULL);
            for (int64_t r = 0; r < nr; r++) {
                int64_t i = ib + r, pos = a->q_offset + i;
                float delta = dot_v(dout + i * sd, o + i * D, D);
                bw_row(s + r * BK, dp + r * BK, visible(a, pos, j0, nk), scale,
                       slope, pos, j0, lse[i], delta);
            }
            mk_rowsT(nk, D, nr, s, BK, dout + ib * sd, sd, dvb, D, 1, NULL);
            mk_rowsT(nk, D, nr, dp, BK, q + ib * sq, sq, dkb, D, 1, NULL);
            mk_rows(nr, D, nk, dp, BK, k + j0 * sk, sk, dq + ib * D, D, 1, NULL);
        }
        memcpy(dk + j0 * D, dkb, (size_t)(nk * D) * sizeof *dk);
        memcpy(dv + j0 * D, dvb, (size_t)(nk * D) * sizeof *dv);
    }
}
#endif
