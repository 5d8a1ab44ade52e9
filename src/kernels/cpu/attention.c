/*
 * attention.c - flash-attention kernels (see attention.h), after Dao et al.,
 * FlashAttention-2.
 *
 * Forward: a task is one (b, h) and a block of BQ = 64 query rows. Keys are
 * visited in tiles of BK = 4 vectors (64 f32, 32 f64; 32 f32 of 8-lane
 * vectors under AVX2, see "The kernels of each tiling"): the tile is packed
 * transposed (kt [D, BK], zero padded), so the scores of a row,
 * s[0:BK] = q_i . kt, are 4 vector FMAs per d with no horizontal sums;
 * rows go in pairs that share the loads of kt (8 vector accumulators).
 * Each row keeps its running max m, running sum l and an unnormalised
 * output acc [D]; a tile with a larger max rescales l and acc by
 * exp(m_old - m_new), then acc += sum_j p_j v_j with 4-vector column
 * blocks held in registers across the keys. At the end o = acc / l and
 * lse = m + log(l). Causal tiles stop at the block's last visible key.
 * Memory: per thread O(BQ*D + BK*D); nothing of size Tq x Tk.
 *
 * Backward: a task is one (b, h), so it owns its dq, dk and dv rows and no
 * two threads ever write the same element (parallelism is B*H; enough for
 * training shapes, serial for B = H = 1). delta_i = do_i . o_i; then for
 * each key tile (k and v packed transposed) and each pair of query rows
 * that see it: s = q_i . kt * scale + bias, p = exp(s - lse_i),
 * dp = do_i . vt, ds = p (dp - delta_i) scale; dv_j += p_j do_i and
 * dk_j += ds_j q_i (tile accumulators [BK, D]), dq_i += sum_j ds_j k_j
 * (in place in dq).
 *
 * Measured on B=1, H=6, D=64, causal f32, 2 threads (AMD EPYC, AVX-512),
 * forward + backward counted as 3.5 x 2 B H T^2 D: 150 GFLOP/s at T = 1024
 * and 4096, against 50-100 GFLOP/s for matmul + softmax + matmul with
 * zs_* operators in the same run (bench/attention). Under ZS_CPU_ISA=avx2
 * on that machine (T = 1024, load 14 on its 2 cores): 31-37 ms forward,
 * 83-109 ms forward + backward (26 and 34 GFLOP/s; the 16-lane body on
 * ymm pairs took 186 and 493 ms). That 8-lane tiling now serves AVX2
 * only for D % 16 != 0 or D > 128; the rest goes to attention_avx2.c's
 * register-blocked kernels (figures there).
 *
 * bf16 and f16 (see "bf16 / f16" below) widen into f32 scratch per task
 * and run the f32 task bodies: f32 arithmetic throughout, lse in f32, one
 * rounding of each result.
 *
 * f32 uses zsi_exp_f32_clamped (vmath.h), a Cephes-style polynomial
 * (about 2 ulp) that vectorises; f64 uses libm's exp. This file is
 * compiled with fp-contract=fast so the ISA variants use FMA.
 */
#pragma GCC optimize("fp-contract=fast")

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/lowp.h"
#include "kernels/cpu/vmath.h"

/* Helpers are inlined into the per-ISA variants of their callers. */
#define INL static inline __attribute__((always_inline))

/* 64-byte vectors (GCC vector extensions): one AVX-512 register, two AVX2
 * or four SSE registers in the other variants; VL lanes. may_alias and
 * element alignment make VLD/VST plain unaligned loads and stores on T
 * arrays. */
typedef float vf32 __attribute__((vector_size(64), aligned(4), may_alias));
typedef double vf64 __attribute__((vector_size(64), aligned(8), may_alias));
#define VLD(V, p) (*(const V *)(p))
#define VST(V, p, v) (*(V *)(p) = (v))
/* Lane-wise b > a ? b : a (a NaN lane of b is skipped, as the scalar
 * loops do), through the comparison's integer mask: C has no ?: on GCC
 * vectors. */
#define VMAX(a, b) ((__typeof__(a))((((a) < (b)) & (__typeof__((a) < (b)))(b)) | \
                                    (~((a) < (b)) & (__typeof__((a) < (b)))(a))))

/* Query rows per forward task; keys per tile are BK = 4 vectors (64 for
 * f32, 32 for f64), a macro parameter of DEFINE_ATTN. */
#define BQ 64

typedef struct fw_ctx {
    const zsk_attn *a;
    void *o, *lse;
    int64_t nqb; /* query blocks per (b, h) */
    int failed;
} fw_ctx;

typedef struct bw_ctx {
    const zsk_attn *a;
    const void *o, *lse, *dout;
    int64_t sd[3];
    void *dq, *dk, *dv;
    int failed;
} bw_ctx;

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* e^x for x <= 88, 0 for x <= -88 (so -inf gives exactly 0), NaN for NaN
 * (without undefined behaviour): zsi_exp_f32_clamped of vmath.h. */
INL float exp_f32(float x) { return zsi_exp_f32_clamped(x); }

static void set_failed(int *flag)
{
    __atomic_store_n(flag, 1, __ATOMIC_RELAXED);
}

#define DEFINE_ATTN(T, SUF, V, VL, BK, EXP, KDEF)                             \
    /* xt[d, j] = x[j, d] for j < n (rows st apart), 0 for n <= j < BK. */    \
    INL void pack_##SUF(const T *restrict x, int64_t st, int64_t n, int64_t D, \
                        T *restrict xt)                                       \
    {                                                                         \
        for (int64_t d = 0; d < D; d++)                                       \
            for (int64_t j = 0; j < BK; j++)                                  \
                xt[d * BK + j] = j < n ? x[j * st + d] : 0;                   \
    }                                                                         \
    /* s0[0:BK] = x0 . yt and s1[0:BK] = x1 . yt (yt [D, BK], BK = 4          \
     * vectors): the two rows share the loads of yt; 8 vector accumulators. */ \
    INL void rowdot2_##SUF(const T *restrict x0, const T *restrict x1,        \
                           const T *restrict yt, int64_t D, T *restrict s0,   \
                           T *restrict s1)                                    \
    {                                                                         \
        V a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};                             \
        V b0 = {0}, b1 = {0}, b2 = {0}, b3 = {0};                             \
        for (int64_t d = 0; d < D; d++) {                                     \
            const T *y = yt + d * BK;                                         \
            V y0 = VLD(V, y), y1 = VLD(V, y + VL), y2 = VLD(V, y + 2 * VL);   \
            V y3 = VLD(V, y + 3 * VL), u = y0 * 0 + x0[d], w = y0 * 0 + x1[d]; \
            a0 += u * y0, a1 += u * y1, a2 += u * y2, a3 += u * y3;           \
            b0 += w * y0, b1 += w * y1, b2 += w * y2, b3 += w * y3;           \
        }                                                                     \
        VST(V, s0, a0), VST(V, s0 + VL, a1);                                  \
        VST(V, s0 + 2 * VL, a2), VST(V, s0 + 3 * VL, a3);                     \
        VST(V, s1, b0), VST(V, s1 + VL, b1);                                  \
        VST(V, s1 + 2 * VL, b2), VST(V, s1 + 3 * VL, b3);                     \
    }                                                                         \
    /* acc[d0:d0+4VL] += sum_j c[j] x[j*sx + d0:...] for j < n, in two sets of \
     * 4 vector accumulators (even and odd j): no chain through memory. */    \
    INL void accw_##SUF(T *restrict acc, const T *restrict c,                 \
                        const T *restrict x, int64_t sx, int64_t n,           \
                        int64_t d0)                                           \
    {                                                                         \
        T *p = acc + d0;                                                      \
        V r0 = VLD(V, p), r1 = VLD(V, p + VL), r2 = VLD(V, p + 2 * VL);       \
        V r3 = VLD(V, p + 3 * VL), t0 = {0}, t1 = {0}, t2 = {0}, t3 = {0};    \
        int64_t j = 0;                                                        \
        for (; j + 2 <= n; j += 2) {                                          \
            const T *x0 = x + j * sx + d0, *x1 = x0 + sx;                     \
            V c0 = r0 * 0 + c[j], c1 = r0 * 0 + c[j + 1];                     \
            r0 += c0 * VLD(V, x0), r1 += c0 * VLD(V, x0 + VL);                \
            r2 += c0 * VLD(V, x0 + 2 * VL), r3 += c0 * VLD(V, x0 + 3 * VL);   \
            t0 += c1 * VLD(V, x1), t1 += c1 * VLD(V, x1 + VL);                \
            t2 += c1 * VLD(V, x1 + 2 * VL), t3 += c1 * VLD(V, x1 + 3 * VL);   \
        }                                                                     \
        if (j < n) {                                                          \
            const T *x0 = x + j * sx + d0;                                    \
            V c0 = r0 * 0 + c[j];                                             \
            r0 += c0 * VLD(V, x0), r1 += c0 * VLD(V, x0 + VL);                \
            r2 += c0 * VLD(V, x0 + 2 * VL), r3 += c0 * VLD(V, x0 + 3 * VL);   \
        }                                                                     \
        VST(V, p, r0 + t0), VST(V, p + VL, r1 + t1);                          \
        VST(V, p + 2 * VL, r2 + t2), VST(V, p + 3 * VL, r3 + t3);             \
    }                                                                         \
    /* The same for one vector of columns. */                                 \
    INL void accv_##SUF(T *restrict acc, const T *restrict c,                 \
                        const T *restrict x, int64_t sx, int64_t n,           \
                        int64_t d0)                                           \
    {                                                                         \
        V r = VLD(V, acc + d0);                                               \
        for (int64_t j = 0; j < n; j++)                                       \
            r += (r * 0 + c[j]) * VLD(V, x + j * sx + d0);                    \
        VST(V, acc + d0, r);                                                  \
    }                                                                         \
    /* acc[0:D] += sum_{j<n} c[j] x[j*sx + 0:D]: blocks of 4 vectors of       \
     * columns, then single vectors, then single columns. */                  \
    INL void accum_##SUF(T *restrict acc, const T *restrict c,                \
                         const T *restrict x, int64_t sx, int64_t n,          \
                         int64_t D)                                           \
    {                                                                         \
        int64_t d0 = 0;                                                       \
        for (; d0 + (4 * VL) <= D; d0 += (4 * VL))                            \
            accw_##SUF(acc, c, x, sx, n, d0);                                 \
        for (; d0 + VL <= D; d0 += VL)                                        \
            accv_##SUF(acc, c, x, sx, n, d0);                                 \
        for (; d0 < D; d0++) {                                                \
            T r = acc[d0];                                                    \
            for (int64_t j = 0; j < n; j++)                                   \
                r += c[j] * x[j * sx + d0];                                   \
            acc[d0] = r;                                                      \
        }                                                                     \
    }                                                                         \
    /* y[0:D] += a0 x0 + a1 x1 */                                             \
    INL void axpy2_##SUF(T *restrict y, T a0, const T *restrict x0, T a1,     \
                         const T *restrict x1, int64_t D)                     \
    {                                                                         \
        for (int64_t d = 0; d < D; d++)                                       \
            y[d] += a0 * x0[d] + a1 * x1[d];                                  \
    }                                                                         \
    INL T dot_##SUF(const T *restrict x, const T *restrict y, int64_t D)      \
    {                                                                         \
        T s = 0;                                                              \
        for (int64_t d = 0; d < D; d++)                                       \
            s += x[d] * y[d];                                                 \
        return s;                                                             \
    }                                                                         \
    /* s[j] = s[j] * scale - slope * (pos - j0 - j) for j < n */              \
    INL void bias_##SUF(T *restrict s, int64_t n, T scale, T slope,           \
                        int64_t pos, int64_t j0)                              \
    {                                                                         \
        for (int64_t j = 0; j < n; j++)                                       \
            s[j] = s[j] * scale - slope * (T)(pos - j0 - j);                  \
    }                                                                         \
    /* One row, one tile of n biased scores s (overwritten by p): the online  \
     * softmax update of m, l and acc [D] with the tile's values v (rows sv   \
     * apart). */                                                             \
    INL void online_##SUF(T *restrict s, int64_t n, T *m, T *l,               \
                          T *restrict acc, const T *restrict v, int64_t sv,   \
                          int64_t D)                                          \
    {                                                                         \
        T mx = *m, sum = 0;                                                   \
        if (n == BK) { /* a full tile: lane-wise max and sum, no serial chain \
                        * of BK steps */                                      \
            V x0 = VLD(V, s), x1 = VLD(V, s + VL), x2 = VLD(V, s + 2 * VL);   \
            V x3 = VLD(V, s + 3 * VL), y = VMAX(VMAX(x0, x1), VMAX(x2, x3));  \
            for (int j = 0; j < VL; j++)                                      \
                mx = y[j] > mx ? y[j] : mx;                                   \
            for (int64_t j = 0; j < BK; j++)                                  \
                s[j] = EXP(s[j] - mx);                                        \
            y = (VLD(V, s) + VLD(V, s + VL)) +                                \
                (VLD(V, s + 2 * VL) + VLD(V, s + 3 * VL));                    \
            for (int j = 0; j < VL; j++)                                      \
                sum += y[j];                                                  \
        } else {                                                              \
            for (int64_t j = 0; j < n; j++)                                   \
                mx = s[j] > mx ? s[j] : mx;                                   \
            for (int64_t j = 0; j < n; j++)                                   \
                s[j] = EXP(s[j] - mx);                                        \
            for (int64_t j = 0; j < n; j++)                                   \
                sum += s[j];                                                  \
        }                                                                     \
        T corr = EXP(*m - mx);                                                \
        *l = *l * corr + sum;                                                 \
        *m = mx;                                                              \
        if (corr != 1)                                                        \
            for (int64_t d = 0; d < D; d++)                                   \
                acc[d] *= corr;                                               \
        accum_##SUF(acc, s, v, sv, n, D);                                     \
    }                                                                         \
    /* Forward of task t = (b, h, query block) with scratch w. */             \
    static KDEF(fw_block_##SUF, (const fw_ctx *c, int64_t t, T *w),           \
        (c, t, w))                                                            \
    {                                                                         \
        const zsk_attn *a = c->a;                                             \
        int64_t D = a->D, bh = t / c->nqb, b = bh / a->H, h = bh % a->H;      \
        int64_t i0 = (t % c->nqb) * BQ, nq = min64(BQ, a->Tq - i0);           \
        const T *q = (const T *)a->q + b * a->sq[0] + h * a->sq[1];           \
        const T *k = (const T *)a->k + b * a->sk[0] + h * a->sk[1];           \
        const T *v = (const T *)a->v + b * a->sv[0] + h * a->sv[1];           \
        T *kt = w, *acc = kt + D * BK, *s = acc + BQ * D, *m = s + 2 * BK;    \
        T *l = m + BQ;                                                        \
        T scale = (T)a->scale, slope = a->slopes ? (T)a->slopes[h] : 0;       \
        int64_t kend = a->causal ? min64(a->Tk, a->q_offset + i0 + nq)        \
                                 : a->Tk;                                     \
        for (int64_t i = 0; i < nq; i++) {                                    \
            m[i] = -INFINITY;                                                 \
            l[i] = 0;                                                         \
        }                                                                     \
        memset(acc, 0, (size_t)(nq * D) * sizeof(T));                         \
        for (int64_t j0 = 0; j0 < kend; j0 += BK) {                           \
            int64_t nk = min64(BK, kend - j0);                                \
            pack_##SUF(k + j0 * a->sk[2], a->sk[2], nk, D, kt);               \
            for (int64_t i = 0; i < nq; i += 2) {                             \
                int64_t i1 = i + 1 < nq ? i + 1 : i;                          \
                rowdot2_##SUF(q + (i0 + i) * a->sq[2],                        \
                              q + (i0 + i1) * a->sq[2], kt, D, s, s + BK);    \
                for (int64_t r = i; r <= i1; r++) {                           \
                    int64_t pos = a->q_offset + i0 + r;                       \
                    int64_t n = a->causal ? min64(nk, pos - j0 + 1) : nk;     \
                    if (n <= 0)                                               \
                        continue;                                             \
                    T *sr = s + (r - i) * BK;                                 \
                    bias_##SUF(sr, n, scale, slope, pos, j0);                 \
                    online_##SUF(sr, n, &m[r], &l[r], acc + r * D,            \
                                 v + j0 * a->sv[2], a->sv[2], D);             \
                }                                                             \
            }                                                                 \
        }                                                                     \
        T *o = (T *)c->o + (bh * a->Tq + i0) * D;                             \
        for (int64_t i = 0; i < nq; i++) {                                    \
            T inv = l[i] > 0 ? 1 / l[i] : 0;                                  \
            for (int64_t d = 0; d < D; d++)                                   \
                o[i * D + d] = acc[i * D + d] * inv;                          \
            if (c->lse)                                                       \
                ((T *)c->lse)[bh * a->Tq + i0 + i] =                          \
                    l[i] > 0 ? m[i] + (T)log((double)l[i]) : -INFINITY;       \
        }                                                                     \
    }                                                                         \
    /* Query rows i and i1 (i1 == i for a lone last row) of one (b, h) against \
     * the packed tile at j0 (kt, vt; nk keys): dv and dk of the tile         \
     * accumulate in dkb, dvb [BK, D], dq rows in place. */                   \
    INL void bw_rows_##SUF(const bw_ctx *c, const T *const *hp, T *dq, T *w,  \
                           int64_t i, int64_t i1, int64_t j0, int64_t nk,     \
                           T slope)                                           \
    {                                                                         \
        const zsk_attn *a = c->a;                                             \
        int64_t D = a->D;                                                     \
        const T *q = hp[0], *k = hp[1], *dout = hp[3], *lse = hp[5];          \
        const T *delta = hp[6];                                               \
        T *kt = w, *vt = kt + D * BK, *dkb = vt + D * BK, *dvb = dkb + BK * D; \
        T *s = dvb + BK * D, *dp = s + 2 * BK, scale = (T)a->scale;           \
        const T *qr[2] = {q + i * a->sq[2], q + i1 * a->sq[2]};               \
        const T *dr[2] = {dout + i * c->sd[2], dout + i1 * c->sd[2]};         \
        rowdot2_##SUF(qr[0], qr[1], kt, D, s, s + BK);                        \
        rowdot2_##SUF(dr[0], dr[1], vt, D, dp, dp + BK);                      \
        int64_t n[2] = {0, 0};                                                \
        for (int64_t j = 0; i1 == i && j < BK; j++)                           \
            s[BK + j] = dp[BK + j] = 0; /* no second row */                   \
        for (int r = 0; r < 1 + (i1 != i); r++) {                             \
            int64_t row = r ? i1 : i, pos = a->q_offset + row;                \
            n[r] = a->causal ? min64(nk, pos - j0 + 1) : nk;                  \
            if (lse[row] == -INFINITY || n[r] < 0)                            \
                n[r] = 0;                                                     \
            T *sr = s + r * BK, *dpr = dp + r * BK;                           \
            T L = lse[row], dl = delta[row];                                  \
            bias_##SUF(sr, n[r], scale, slope, pos, j0);                      \
            for (int64_t j = 0; j < n[r]; j++) {                              \
                T pj = EXP(sr[j] - L);                                        \
                dpr[j] = pj * (dpr[j] - dl) * scale;                          \
                sr[j] = pj;                                                   \
            }                                                                 \
            for (int64_t j = n[r]; j < BK; j++)                               \
                sr[j] = dpr[j] = 0;                                           \
            accum_##SUF(dq + row * D, dpr, k + j0 * a->sk[2], a->sk[2], n[r], \
                        D);                                                   \
        }                                                                     \
        int64_t nmax = n[0] > n[1] ? n[0] : n[1];                             \
        for (int64_t j = 0; j < nmax; j++) {                                  \
            axpy2_##SUF(dvb + j * D, s[j], dr[0], s[BK + j], dr[1], D);       \
            axpy2_##SUF(dkb + j * D, dp[j], qr[0], dp[BK + j], qr[1], D);     \
        }                                                                     \
    }                                                                         \
    /* Backward of one (b, h) with scratch w (tiles, rows, delta [Tq]). */    \
    static KDEF(bw_head_##SUF, (const bw_ctx *c, int64_t bh, T *w),           \
        (c, bh, w))                                                           \
    {                                                                         \
        const zsk_attn *a = c->a;                                             \
        int64_t D = a->D, Tq = a->Tq, b = bh / a->H, h = bh % a->H;           \
        T *kt = w, *vt = kt + D * BK, *dkb = vt + D * BK, *dvb = dkb + BK * D; \
        T *delta = dvb + BK * D + 4 * BK;                                     \
        const T *hp[7] = {                                                    \
            (const T *)a->q + b * a->sq[0] + h * a->sq[1],                    \
            (const T *)a->k + b * a->sk[0] + h * a->sk[1],                    \
            (const T *)a->v + b * a->sv[0] + h * a->sv[1],                    \
            (const T *)c->dout + b * c->sd[0] + h * c->sd[1],                 \
            (const T *)c->o + bh * Tq * D, (const T *)c->lse + bh * Tq,       \
            delta};                                                           \
        T *dq = (T *)c->dq + bh * Tq * D, *dk = (T *)c->dk + bh * a->Tk * D;  \
        T *dv = (T *)c->dv + bh * a->Tk * D;                                  \
        T slope = a->slopes ? (T)a->slopes[h] : 0;                            \
        for (int64_t i = 0; i < Tq; i++)                                      \
            delta[i] = dot_##SUF(hp[3] + i * c->sd[2], hp[4] + i * D, D);     \
        memset(dq, 0, (size_t)(Tq * D) * sizeof(T));                          \
        for (int64_t j0 = 0; j0 < a->Tk; j0 += BK) {                          \
            int64_t nk = min64(BK, a->Tk - j0);                               \
            pack_##SUF(hp[1] + j0 * a->sk[2], a->sk[2], nk, D, kt);           \
            pack_##SUF(hp[2] + j0 * a->sv[2], a->sv[2], nk, D, vt);           \
            memset(dkb, 0, (size_t)(2 * BK * D) * sizeof(T));                 \
            int64_t i = a->causal && j0 > a->q_offset ? j0 - a->q_offset : 0; \
            for (; i < Tq; i += 2)                                            \
                bw_rows_##SUF(c, hp, dq, w, i, i + 1 < Tq ? i + 1 : i, j0, nk, \
                              slope);                                         \
            memcpy(dk + j0 * D, dkb, (size_t)(nk * D) * sizeof(T));           \
            memcpy(dv + j0 * D, dvb, (size_t)(nk * D) * sizeof(T));           \
        }                                                                     \
    }

/* The pool tasks over fw_block_SUF / bw_head_SUF; scratch sized for tiles
 * of BK keys (a kernel with smaller tiles uses a prefix of it). */
#define DEFINE_TASKS(T, SUF, BK)                                              \
    static void fw_task_##SUF(void *p, int64_t t0, int64_t t1)                \
    {                                                                         \
        fw_ctx *c = p;                                                        \
        int64_t D = c->a->D;                                                  \
        size_t nw = (size_t)(D * BK + BQ * D + 2 * BK + 2 * BQ);              \
        T *w = malloc(nw * sizeof(T));                                        \
        if (!w) {                                                             \
            set_failed(&c->failed);                                           \
            return;                                                           \
        }                                                                     \
        for (int64_t t = t0; t < t1; t++)                                     \
            fw_block_##SUF(c, t, w);                                          \
        free(w);                                                              \
    }                                                                         \
    static void bw_task_##SUF(void *p, int64_t t0, int64_t t1)                \
    {                                                                         \
        bw_ctx *c = p;                                                        \
        int64_t D = c->a->D;                                                  \
        T *w = malloc((size_t)(4 * BK * D + 4 * BK + c->a->Tq) * sizeof(T));  \
        if (!w) {                                                             \
            set_failed(&c->failed);                                           \
            return;                                                           \
        }                                                                     \
        for (int64_t t = t0; t < t1; t++)                                     \
            bw_head_##SUF(c, t, w);                                           \
        free(w);                                                              \
    }

/* The kernels of each tiling. f32 has two: 16-lane vectors and BK = 64
 * (4 zmm per row of scores, 8 accumulators of 32 registers: AVX-512, and
 * the portable build) and, for AVX2's 16 ymm registers, 8-lane vectors and
 * BK = 32 (fw_block_f32y, bw_head_f32y: 8 accumulators, 4 tile loads and
 * 2 broadcasts in rowdot2, 8 + 2 in accw, so nothing spills). Compiled for
 * AVX2 + FMA only, they are what fw_block_f32 / bw_head_f32 call at level
 * 1 (zsk_isa_level); levels 2 and 0 take the 16-lane body compiled for
 * AVX-512 or baseline x86-64. f64 (gradient checks) has one tiling. */
#if defined(__x86_64__)
typedef float vf32y __attribute__((vector_size(32), aligned(4), may_alias));
#define ATTN_AVX2(name, params, args) ZSK_TGT_V3 void name params
#define ATTN_F32(name, params, args)                                          \
    void name params;                                                         \
    ZSK_ISA_BODY_(void, name, params);                                        \
    ZSK_TGT_V4 static void name##_isa_v4 params { name##_isa_body args; }     \
    static void name##_isa_v0 params { name##_isa_body args; }                \
    void name params                                                          \
    {                                                                         \
        int l_ = zsk_isa_level();                                             \
        if (l_ == 2)                                                          \
            name##_l2 args;                                                   \
        else if (l_ == 1)                                                     \
            name##_l1 args;                                                   \
        else                                                                  \
            name##_isa_v0 args;                                               \
    }                                                                         \
    ZSK_ISA_BODY_(void, name, params)
DEFINE_ATTN(float, f32y, vf32y, 8, 32, exp_f32, ATTN_AVX2)
/* Level 1: attention_avx2.c's register-blocked kernels where they apply
 * (D % 16 == 0, D <= 128), else the 8-lane tiling above. */
static void fw_block_f32_l1(const fw_ctx *c, int64_t t, float *w)
{
    const zsk_attn *a = c->a;
    if (!zsk_attention_avx2_usable(a)) {
        fw_block_f32y(c, t, w);
        return;
    }
    int64_t bh = t / c->nqb, i0 = (t % c->nqb) * BQ;
    zsk_attention_avx2_forward(a, bh, i0, min64(BQ, a->Tq - i0),
                               (float *)c->o + (bh * a->Tq + i0) * a->D,
                               c->lse ? (float *)c->lse + bh * a->Tq + i0 : NULL);
}
static void bw_head_f32_l1(const bw_ctx *c, int64_t bh, float *w)
{
    const zsk_attn *a = c->a;
    if (!zsk_attention_avx2_usable(a)) {
        bw_head_f32y(c, bh, w);
        return;
    }
    int64_t b = bh / a->H, h = bh % a->H, Tq = a->Tq, Tk = a->Tk, D = a->D;
    zsk_attention_avx2_backward(
        a, bh, (const float *)c->o + bh * Tq * D, (const float *)c->lse + bh * Tq,
        (const float *)c->dout + b * c->sd[0] + h * c->sd[1], c->sd[2],
        (float *)c->dq + bh * Tq * D, (float *)c->dk + bh * Tk * D,
        (float *)c->dv + bh * Tk * D);
}
/* Level 2 (AVX-512): the same register-blocked ymm kernels where they
 * apply, else the 16-lane zmm tiling. Measured on Zen 4 (2 cores, thread
 * CPU time, B 8 H 6 D 64 causal): the 6x16 ymm kernels reach 45/56% (T
 * 256) and 62/73% (T 1024) of the FP32 peak forward/backward, the zmm
 * tiling 26-30/32-36% and 38-40/38%. Zen 4 runs a zmm FMA as two ymm
 * halves, so the ymm kernel loses nothing there; on CPUs with two full
 * 512-bit FMA units it can reach at most half the peak, about what the
 * zmm tiling reached here. */
static void fw_block_f32_isa_v4(const fw_ctx *c, int64_t t, float *w);
static void bw_head_f32_isa_v4(const bw_ctx *c, int64_t bh, float *w);
static void fw_block_f32_l2(const fw_ctx *c, int64_t t, float *w)
{
    if (zsk_attention_avx2_usable(c->a))
        fw_block_f32_l1(c, t, w);
    else
        fw_block_f32_isa_v4(c, t, w);
}
static void bw_head_f32_l2(const bw_ctx *c, int64_t bh, float *w)
{
    if (zsk_attention_avx2_usable(c->a))
        bw_head_f32_l1(c, bh, w);
    else
        bw_head_f32_isa_v4(c, bh, w);
}
#else
#define ATTN_F32 ZSK_ISA_VOID
#endif
DEFINE_ATTN(float, f32, vf32, 16, 64, exp_f32, ATTN_F32)
DEFINE_ATTN(double, f64, vf64, 8, 32, exp, ZSK_ISA_VOID)
DEFINE_TASKS(float, f32, 64)
DEFINE_TASKS(double, f64, 32)

/* ---- bf16 / f16 --------------------------------------------------------- */
/* q, k, v, o, dout, dq, dk and dv hold 16-bit patterns of a->dt; lse is
 * f32. A task widens what it reads into f32 scratch once and runs the f32
 * task bodies above on a one-head view of it (fw_block_f32, bw_head_f32:
 * the same tiles, FMAs and exp), then rounds its results once (o, dq, dk,
 * dv; lse stays f32). The forward widens the keys and values of a head
 * once per thread and extends them as the causal blocks of the head grow,
 * so widening costs O(T D) per head against O(T^2 D) of products. */

#define BK32 64 /* keys per f32 tile (DEFINE_ATTN's BK for f32) */

/* Rows [r0, r1) of x (rows st apart, D wide) widened into dst [.., D]. */
static void widen_rows(zs_dtype dt, const uint16_t *x, int64_t st,
                       int64_t r0, int64_t r1, int64_t D, float *dst)
{
    for (int64_t r = r0; r < r1; r++)
        zsk_widen16(dt, x + r * st, dst + r * D, D);
}

/* The f32 one-head view of head (b, h): q, k, v given as f32 arrays of
 * rows D apart; slopes point at head h's. */
static zsk_attn head_view(const zsk_attn *a, int64_t h, const float *q,
                          const float *k, const float *v)
{
    zsk_attn v1 = *a;
    v1.dt = ZS_F32;
    v1.B = v1.H = 1;
    v1.q = q, v1.k = k, v1.v = v;
    for (int d = 0; d < 2; d++)
        v1.sq[d] = v1.sk[d] = v1.sv[d] = 0;
    v1.sq[2] = v1.sk[2] = v1.sv[2] = a->D;
    v1.slopes = a->slopes ? a->slopes + h : NULL;
    return v1;
}

static void fw_task_lp(void *p, int64_t t0, int64_t t1)
{
    fw_ctx *c = p;
    const zsk_attn *a = c->a;
    int64_t D = a->D, Tq = a->Tq, Tk = a->Tk;
    size_t nw = (size_t)(D * BK32 + BQ * D + 2 * BK32 + 2 * BQ);
    float *w = malloc((nw + (size_t)(2 * BQ * D + 2 * Tk * D)) * sizeof(float));
    if (!w) {
        set_failed(&c->failed);
        return;
    }
    float *qf = w + nw, *of = qf + BQ * D, *kf = of + BQ * D, *vf = kf + Tk * D;
    int64_t have_bh = -1, have = 0; /* key rows of have_bh widened */
    for (int64_t t = t0; t < t1; t++) {
        int64_t bh = t / c->nqb, b = bh / a->H, h = bh % a->H;
        int64_t i0 = (t % c->nqb) * BQ, nq = min64(BQ, Tq - i0);
        int64_t kend = a->causal ? min64(Tk, a->q_offset + i0 + nq) : Tk;
        const uint16_t *q = (const uint16_t *)a->q + b * a->sq[0] + h * a->sq[1];
        const uint16_t *k = (const uint16_t *)a->k + b * a->sk[0] + h * a->sk[1];
        const uint16_t *v = (const uint16_t *)a->v + b * a->sv[0] + h * a->sv[1];
        if (bh != have_bh)
            have_bh = bh, have = 0;
        if (kend > have) {
            widen_rows(a->dt, k, a->sk[2], have, kend, D, kf);
            widen_rows(a->dt, v, a->sv[2], have, kend, D, vf);
            have = kend;
        }
        widen_rows(a->dt, q + i0 * a->sq[2], a->sq[2], 0, nq, D, qf);
        zsk_attn a1 = head_view(a, h, qf, kf, vf);
        a1.Tq = nq;
        a1.q_offset = a->q_offset + i0;
        fw_ctx c1 = {.a = &a1, .o = of, .nqb = 1,
                     .lse = c->lse ? (float *)c->lse + bh * Tq + i0 : NULL};
        fw_block_f32(&c1, 0, w);
        zsk_narrow16(a->dt, of, (uint16_t *)c->o + (bh * Tq + i0) * D, nq * D);
    }
    free(w);
}

static void bw_task_lp(void *p, int64_t t0, int64_t t1)
{
    bw_ctx *c = p;
    const zsk_attn *a = c->a;
    int64_t D = a->D, Tq = a->Tq, Tk = a->Tk;
    size_t nw = (size_t)(4 * BK32 * D + 4 * BK32 + Tq);
    float *w = malloc((nw + (size_t)(4 * Tq * D + 4 * Tk * D)) * sizeof(float));
    if (!w) {
        set_failed(&c->failed);
        return;
    }
    float *qf = w + nw, *gf = qf + Tq * D, *of = gf + Tq * D, *dqf = of + Tq * D;
    float *kf = dqf + Tq * D, *vf = kf + Tk * D, *dkf = vf + Tk * D;
    float *dvf = dkf + Tk * D;
    for (int64_t bh = t0; bh < t1; bh++) {
        int64_t b = bh / a->H, h = bh % a->H;
        const uint16_t *q = (const uint16_t *)a->q + b * a->sq[0] + h * a->sq[1];
        const uint16_t *k = (const uint16_t *)a->k + b * a->sk[0] + h * a->sk[1];
        const uint16_t *v = (const uint16_t *)a->v + b * a->sv[0] + h * a->sv[1];
        const uint16_t *g = (const uint16_t *)c->dout + b * c->sd[0] + h * c->sd[1];
        widen_rows(a->dt, q, a->sq[2], 0, Tq, D, qf);
        widen_rows(a->dt, g, c->sd[2], 0, Tq, D, gf);
        widen_rows(a->dt, k, a->sk[2], 0, Tk, D, kf);
        widen_rows(a->dt, v, a->sv[2], 0, Tk, D, vf);
        zsk_widen16(a->dt, (const uint16_t *)c->o + bh * Tq * D, of, Tq * D);
        zsk_attn a1 = head_view(a, h, qf, kf, vf);
        bw_ctx c1 = {.a = &a1, .o = of, .lse = (const float *)c->lse + bh * Tq,
                     .dout = gf, .sd = {0, 0, D}, .dq = dqf, .dk = dkf,
                     .dv = dvf};
        bw_head_f32(&c1, 0, w);
        zsk_narrow16(a->dt, dqf, (uint16_t *)c->dq + bh * Tq * D, Tq * D);
        zsk_narrow16(a->dt, dkf, (uint16_t *)c->dk + bh * Tk * D, Tk * D);
        zsk_narrow16(a->dt, dvf, (uint16_t *)c->dv + bh * Tk * D, Tk * D);
    }
    free(w);
}

/* ---- drivers ----------------------------------------------------------- */

zs_status zsk_attention_forward(const zsk_attn *a, void *o, void *lse)
{
    if (zsk_attention_bf16_usable(a)) /* vdpbf16ps: attention_bf16.c */
        return zsk_attention_forward_bf16(a, o, lse);
    fw_ctx c = {.a = a, .o = o, .lse = lse, .nqb = (a->Tq + BQ - 1) / BQ};
    int64_t n = a->B * a->H * c.nqb;
    if (n > 0)
        zs_parallel_for(n, 1, a->dt == ZS_F32   ? fw_task_f32
                              : a->dt == ZS_F64 ? fw_task_f64
                                                : fw_task_lp,
                        &c);
    if (c.failed)
        return zs_set_error_code(ZS_ERR_NOMEM, "attention: out of memory "
                                 "for the kernel's tile buffers");
    return ZS_OK;
}

zs_status zsk_attention_backward(const zsk_attn *a, const void *o,
                                 const void *lse, const void *dout,
                                 const int64_t sd[3], void *dq, void *dk,
                                 void *dv)
{
    bw_ctx c = {.a = a, .o = o, .lse = lse, .dout = dout, .dq = dq,
                .dk = dk, .dv = dv};
    memcpy(c.sd, sd, sizeof c.sd);
    int64_t n = a->B * a->H;
    if (n > 0)
        zs_parallel_for(n, 1, a->dt == ZS_F32   ? bw_task_f32
                              : a->dt == ZS_F64 ? bw_task_f64
                                                : bw_task_lp,
                        &c);
    if (c.failed)
        return zs_set_error_code(ZS_ERR_NOMEM, "attention: out of memory "
                                 "for the backward's tile buffers");
    return ZS_OK;
}
