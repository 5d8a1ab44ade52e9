/*
 * attention_bf16.c - flash attention on bf16 q, k, v with vdpbf16ps
 * (AVX512_BF16): the products run on bf16 pairs with f32 accumulation,
 * the online softmax in f32. attention.c calls it for bf16 when
 * zsk_attention_bf16_usable says the CPU has the instructions and D is a
 * multiple of 16; its own widening path (f32 tiles) runs the others.
 *
 * Forward: a task is one (b, h) and a block of BQ = 64 query rows. Keys go
 * in tiles of BK = 32: kt [D/2][32] holds (k[j][2p], k[j][2p+1]) pairs, so
 * the 32 scores of a row are 2 x D/2 vdpbf16ps with the row's q pairs
 * broadcast (4 rows share each load of kt). The tile's p = exp(s - m) is
 * computed in f32, rounded to bf16 in key pairs, and acc [D] += p v runs
 * as vdpbf16ps against vt [16][D] of (v[2u][d], v[2u+1][d]) pairs, the
 * accumulators of 4 rows x 4 vectors of columns in registers. o = acc / l
 * rounded to bf16; lse = m + log(l) in f32.
 *
 * Backward: attention.c's widening path (bf16 tiles widened to f32, its
 * 6x16 f32 blocks). A vdpbf16ps backward lived here (s, dp and dq by
 * vdpbf16ps with p and ds rounded to bf16, dv and dk in f32) and was
 * removed: on Zen 4 (2 threads, B=8 H=6 T=256 D=64 causal, through the
 * operator) it took 8.15-8.16 ms against the widening path's 6.74-6.91 ms,
 * while this forward takes 2.89-2.92 ms against the widening forward's
 * 3.32-3.45 ms.
 *
 * Numerics: the products of bf16 values are exact in f32 and accumulate in
 * f32; p and ds are rounded to bf16 before their products (as flash
 * attention does on GPUs), relative error 2^-9 per term; tests compare
 * with float64 at the bf16 tolerances of test_attention.c. exp is
 * zsi_exp_m512_nc of vmath.h (about 2 ulp) clamped below at -104, masked
 * lanes (keys beyond the causal limit or the tile) exactly 0.
 */
#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/lowp.h"
#include "kernels/cpu/vmath.h"

#define TGT __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
#define INL static inline __attribute__((always_inline,                       \
                                         target("avx512f,avx512bw,avx512vl,avx512bf16")))

#define BQ 64 /* query rows per forward task */
#define BK 32 /* keys per tile: two vectors of scores */
#define RG 4  /* query rows per register group */

bool zsk_attention_bf16_off;

bool zsk_attention_bf16_usable(const zsk_attn *a)
{
    const zs_cpu_features *f = zs_cpu();
    return !zsk_attention_bf16_off && a->dt == ZS_BF16 && f->avx512f &&
           f->avx512bw && f->avx512vl && f->avx512_bf16 && a->D > 0 &&
           a->D % 16 == 0;
}

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

static uint32_t ld32(const uint16_t *p)
{
    uint32_t u;
    memcpy(&u, p, sizeof u);
    return u;
}

/* kt[p * BK + j] = (x[j][2p], x[j][2p+1]) for j < n (rows st apart), 0
 * beyond: pairs over d. */
static void pack_pairs_d(const uint16_t *x, int64_t st, int64_t n, int64_t D,
                         uint32_t *kt)
{
    for (int64_t j = 0; j < BK; j++)
        for (int64_t p = 0; p < D / 2; p++)
            kt[p * BK + j] = j < n ? ld32(x + j * st + 2 * p) : 0;
}

/* vt[u * D + d] = (x[2u][d], x[2u+1][d]) for rows < n, 0 beyond: pairs
 * over rows. */
static void pack_pairs_rows(const uint16_t *x, int64_t st, int64_t n,
                            int64_t D, uint32_t *vt)
{
    for (int64_t u = 0; u < BK / 2; u++) {
        const uint16_t *r0 = 2 * u < n ? x + 2 * u * st : NULL;
        const uint16_t *r1 = 2 * u + 1 < n ? x + (2 * u + 1) * st : NULL;
        for (int64_t d = 0; d < D; d++)
            vt[u * D + d] = (r0 ? r0[d] : 0u) | (uint32_t)(r1 ? r1[d] : 0u) << 16;
    }
}

/* s[r][0:BK] = x_r . kt (pairs over d) for the RG rows xr (bf16, d unit
 * stride; a repeated pointer for missing rows). */
INL void scores4(const uint16_t *const xr[RG], const uint32_t *kt, int64_t D,
                 float s[RG][BK])
{
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, b0 = a0, b1 = a0;
    __m512 c0 = a0, c1 = a0, d0 = a0, d1 = a0;
    for (int64_t p = 0; p < D / 2; p++) {
        __m512bh k0 = (__m512bh)_mm512_loadu_si512(kt + p * BK);
        __m512bh k1 = (__m512bh)_mm512_loadu_si512(kt + p * BK + 16);
        __m512bh x0 = (__m512bh)_mm512_set1_epi32((int)ld32(xr[0] + 2 * p));
        __m512bh x1 = (__m512bh)_mm512_set1_epi32((int)ld32(xr[1] + 2 * p));
        __m512bh x2 = (__m512bh)_mm512_set1_epi32((int)ld32(xr[2] + 2 * p));
        __m512bh x3 = (__m512bh)_mm512_set1_epi32((int)ld32(xr[3] + 2 * p));
        a0 = _mm512_dpbf16_ps(a0, x0, k0), a1 = _mm512_dpbf16_ps(a1, x0, k1);
        b0 = _mm512_dpbf16_ps(b0, x1, k0), b1 = _mm512_dpbf16_ps(b1, x1, k1);
        c0 = _mm512_dpbf16_ps(c0, x2, k0), c1 = _mm512_dpbf16_ps(c1, x2, k1);
        d0 = _mm512_dpbf16_ps(d0, x3, k0), d1 = _mm512_dpbf16_ps(d1, x3, k1);
    }
    _mm512_storeu_ps(s[0], a0), _mm512_storeu_ps(s[0] + 16, a1);
    _mm512_storeu_ps(s[1], b0), _mm512_storeu_ps(s[1] + 16, b1);
    _mm512_storeu_ps(s[2], c0), _mm512_storeu_ps(s[2] + 16, c1);
    _mm512_storeu_ps(s[3], d0), _mm512_storeu_ps(s[3] + 16, d1);
}

/* acc[r][0:D] = acc[r] * corr[r] + sum_u pp[r][u] . vt[u] for the RG rows
 * (pp: bf16 key pairs; rows of acc D apart; vt pairs over rows). */
INL void pv4(float *acc, const float corr[RG], const uint32_t pp[RG][BK / 2],
             const uint32_t *vt, int64_t D, int nr)
{
    for (int64_t d0 = 0; d0 < D; d0 += 64) {
        int nv = (int)min64(4, (D - d0) / 16);
        __m512 r[RG][4];
        for (int i = 0; i < RG; i++)
            for (int c = 0; c < 4; c++)
                r[i][c] = i < nr && c < nv
                              ? _mm512_mul_ps(_mm512_loadu_ps(acc + i * D + d0 + 16 * c),
                                              _mm512_set1_ps(corr[i]))
                              : _mm512_setzero_ps();
        for (int64_t u = 0; u < BK / 2; u++) {
            const uint32_t *v = vt + u * D + d0;
            for (int c = 0; c < 4; c++) {
                if (c >= nv)
                    break;
                __m512bh vc = (__m512bh)_mm512_loadu_si512(v + 16 * c);
                for (int i = 0; i < RG; i++)
                    r[i][c] = _mm512_dpbf16_ps(
                        r[i][c], (__m512bh)_mm512_set1_epi32((int)pp[i][u]), vc);
            }
        }
        for (int i = 0; i < nr; i++)
            for (int c = 0; c < nv; c++)
                _mm512_storeu_ps(acc + i * D + d0 + 16 * c, r[i][c]);
    }
}

/* Scores s[0:BK] of a row scaled and biased (scale * s - slope (pos - j)),
 * lanes j >= n set to -inf. */
INL void bias_row(float *s, int64_t n, float scale, float slope, int64_t pos,
                  int64_t j0)
{
    __m512 idx = _mm512_set_ps(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    for (int h = 0; h < 2; h++) {
        __m512 j = _mm512_add_ps(idx, _mm512_set1_ps((float)(16 * h)));
        __m512 dist = _mm512_sub_ps(_mm512_set1_ps((float)(pos - j0)), j);
        __m512 v = _mm512_mul_ps(_mm512_loadu_ps(s + 16 * h), _mm512_set1_ps(scale));
        v = _mm512_fnmadd_ps(_mm512_set1_ps(slope), dist, v);
        __mmask16 ok = _mm512_cmp_ps_mask(j, _mm512_set1_ps((float)n), _CMP_LT_OQ);
        _mm512_storeu_ps(s + 16 * h, _mm512_mask_blend_ps(ok, _mm512_set1_ps(-INFINITY), v));
    }
}

/* p[0:BK] = exp(s - c) (lanes with s = -inf: 0) in place; returns the sum. */
INL float exp_row(float *s, float c)
{
    __m512 sum = _mm512_setzero_ps();
    for (int h = 0; h < 2; h++) {
        __m512 v = _mm512_loadu_ps(s + 16 * h);
        __mmask16 live = _mm512_cmp_ps_mask(v, _mm512_set1_ps(-INFINITY), _CMP_NEQ_OQ);
        __m512 x = _mm512_max_ps(_mm512_set1_ps(-104.0f),
                                 _mm512_sub_ps(v, _mm512_set1_ps(c)));
        __m512 e = _mm512_maskz_mov_ps(live, zsi_exp_m512_nc(x));
        _mm512_storeu_ps(s + 16 * h, e);
        sum = _mm512_add_ps(sum, e);
    }
    return _mm512_reduce_add_ps(sum);
}

/* 32 f32 values rounded to bf16, as 16 key pairs. */
INL void to_pairs(const float *x, uint32_t *pp)
{
    __m512bh b = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + 16), _mm512_loadu_ps(x));
    _mm512_storeu_si512(pp, (__m512i)b);
}

/* ---- forward ------------------------------------------------------------ */

typedef struct fw16 {
    const zsk_attn *a;
    uint16_t *o;
    float *lse;
    int64_t nqb;
    int failed;
} fw16;

typedef struct fw_scratch {
    uint32_t *kt, *vt;
    float *acc, *m, *l;
} fw_scratch;

TGT static void fw_block(const fw16 *c, int64_t t, const fw_scratch *w)
{
    const zsk_attn *a = c->a;
    int64_t D = a->D, bh = t / c->nqb, b = bh / a->H, h = bh % a->H;
    int64_t i0 = (t % c->nqb) * BQ, nq = min64(BQ, a->Tq - i0);
    const uint16_t *q = (const uint16_t *)a->q + b * a->sq[0] + h * a->sq[1];
    const uint16_t *k = (const uint16_t *)a->k + b * a->sk[0] + h * a->sk[1];
    const uint16_t *v = (const uint16_t *)a->v + b * a->sv[0] + h * a->sv[1];
    float scale = (float)a->scale, slope = a->slopes ? (float)a->slopes[h] : 0;
    int64_t kend = a->causal ? min64(a->Tk, a->q_offset + i0 + nq) : a->Tk;
    for (int64_t i = 0; i < nq; i++)
        w->m[i] = -INFINITY, w->l[i] = 0;
    memset(w->acc, 0, (size_t)(nq * D) * sizeof(float));
    float s[RG][BK], corr[RG];
    uint32_t pp[RG][BK / 2];
    for (int64_t j0 = 0; j0 < kend; j0 += BK) {
        int64_t nk = min64(BK, kend - j0);
        pack_pairs_d(k + j0 * a->sk[2], a->sk[2], nk, D, w->kt);
        pack_pairs_rows(v + j0 * a->sv[2], a->sv[2], nk, D, w->vt);
        for (int64_t i = 0; i < nq; i += RG) {
            int nr = (int)min64(RG, nq - i);
            const uint16_t *xr[RG];
            for (int r = 0; r < RG; r++)
                xr[r] = q + (i0 + i + (r < nr ? r : 0)) * a->sq[2];
            scores4(xr, w->kt, D, s);
            for (int r = 0; r < RG; r++) {
                int64_t row = i + r, pos = a->q_offset + i0 + row;
                int64_t n = r >= nr ? 0 : a->causal ? min64(nk, pos - j0 + 1) : nk;
                corr[r] = 1.0f;
                if (n <= 0) {
                    memset(pp[r], 0, sizeof pp[r]);
                    continue;
                }
                bias_row(s[r], n, scale, slope, pos, j0);
                float mx = w->m[row];
                for (int64_t j = 0; j < n; j++)
                    mx = s[r][j] > mx ? s[r][j] : mx;
                corr[r] = w->m[row] == -INFINITY ? 0.0f : expf(w->m[row] - mx);
                float sum = exp_row(s[r], mx);
                w->l[row] = w->l[row] * corr[r] + sum;
                w->m[row] = mx;
                to_pairs(s[r], pp[r]);
            }
            pv4(w->acc + i * D, corr, pp, w->vt, D, nr);
        }
    }
    uint16_t *o = c->o + (bh * a->Tq + i0) * D;
    for (int64_t i = 0; i < nq; i++) {
        float inv = w->l[i] > 0 ? 1 / w->l[i] : 0;
        float *r = w->acc + i * D;
        for (int64_t d = 0; d < D; d++)
            r[d] *= inv;
        zsk_narrow16(ZS_BF16, r, o + i * D, D);
        if (c->lse)
            c->lse[bh * a->Tq + i0 + i] =
                w->l[i] > 0 ? w->m[i] + (float)log((double)w->l[i]) : -INFINITY;
    }
}

static void fw_task(void *p, int64_t t0, int64_t t1)
{
    fw16 *c = p;
    int64_t D = c->a->D;
    size_t units = (size_t)(D / 2 * BK + BK / 2 * D);
    void *buf = malloc(units * 4 + (size_t)(BQ * D + 2 * BQ) * sizeof(float));
    if (!buf) {
        __atomic_store_n(&c->failed, 1, __ATOMIC_RELAXED);
        return;
    }
    fw_scratch w;
    w.kt = buf;
    w.vt = w.kt + D / 2 * BK;
    w.acc = (float *)(w.vt + BK / 2 * D);
    w.m = w.acc + BQ * D;
    w.l = w.m + BQ;
    for (int64_t t = t0; t < t1; t++)
        fw_block(c, t, &w);
    free(buf);
}

zs_status zsk_attention_forward_bf16(const zsk_attn *a, void *o, void *lse)
{
    fw16 c = {.a = a, .o = o, .lse = lse, .nqb = (a->Tq + BQ - 1) / BQ};
    int64_t n = a->B * a->H * c.nqb;
    if (n > 0)
        zs_parallel_for(n, 1, fw_task, &c);
    if (c.failed)
        return zs_set_error_code(ZS_ERR_NOMEM, "attention: out of memory "
                                 "for the bf16 kernel's tile buffers");
    return ZS_OK;
}
