/*
 * paged_attention.c - decode attention through block tables
 * (kernels/cpu/paged_attention.h).
 */
#include <math.h>
#include <stdlib.h>

#include "kernels/cpu/kernels.h"
#include "kernels/cpu/packed_linear.h"
#include "kernels/cpu/paged_attention.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define ZSK_PAGED_AVX512 1
#define AVX512 __attribute__((target("avx512f")))
#endif

#define CHUNK 256 /* positions per work item */

typedef struct item {
    int64_t s, h, t0, t1; /* sequence, head, positions [t0, t1) */
} item;

typedef struct job {
    const zsk_paged_attn *a;
    const item *items;
    float *part;          /* per item: max, sum, then D weighted values */
    bool avx512;          /* the zmm tile functions (D a multiple of 16) */
} job;

ZSK_CLONES static float dot(const float *restrict x, const float *restrict y, int64_t n)
{
    float acc[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++)
            acc[k] += x[i + k] * y[i + k];
    for (; i < n; i++)
        acc[0] += x[i] * y[i];
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}


static const float *row(const zsk_paged_attn *a, int64_t s, int64_t t, int64_t off,
                        int64_t h)
{
    int64_t b = a->tables[s][t / a->bs];
    return a->base + b * a->block_stride + off + ((t % a->bs) * a->H + h) * a->D;
}

#define TILE 16 /* positions scored together: one max and one rescale each */

ZSK_CLONES static void axpy(float *restrict y, float w, const float *restrict x, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        y[i] += w * x[i];
}

ZSK_CLONES static void scale(float *restrict y, float c, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        y[i] *= c;
}

/* Scores of positions t .. t + n - 1 (q . k * scale), and acc = c * acc +
 * sum_k w[k] v_k over the same positions: portable, through the clones. */
static void scores_c(const zsk_paged_attn *a, const item *it, const float *q, int64_t t,
                     int n, float *sc)
{
    for (int k = 0; k < n; k++)
        sc[k] = dot(q, row(a, it->s, t + k, a->k_off, it->h), a->D) * a->scale;
}

static void values_c(const zsk_paged_attn *a, const item *it, int64_t t, int n,
                     const float *w, float c, float *acc)
{
    scale(acc, c, a->D);
    for (int k = 0; k < n; k++)
        axpy(acc, w[k], row(a, it->s, t + k, a->v_off, it->h), a->D);
}

#ifdef ZSK_PAGED_AVX512
/* The same with zmm registers when D is a multiple of 16: one fma chain
 * per score, and per 16 lanes of acc one chain over the tile's positions
 * (acc stays in a register across them). */
AVX512 static void scores_avx512(const zsk_paged_attn *a, const item *it, const float *q,
                                 int64_t t, int n, float *sc)
{
    for (int k = 0; k < n; k++) {
        const float *kr = row(a, it->s, t + k, a->k_off, it->h);
        /* this position's value row and the next tile's key row: their
         * lines are in flight while the scores are computed */
        const float *vr = row(a, it->s, t + k, a->v_off, it->h);
        const float *kn = t + k + TILE < it->t1 ? row(a, it->s, t + k + TILE, a->k_off, it->h)
                                                : NULL;
        for (int64_t d = 0; d < a->D; d += 16) {
            _mm_prefetch((const char *)(vr + d), _MM_HINT_T0);
            if (kn)
                _mm_prefetch((const char *)(kn + d), _MM_HINT_T0);
        }
        __m512 v = _mm512_mul_ps(_mm512_loadu_ps(q), _mm512_loadu_ps(kr));
        for (int64_t d = 16; d < a->D; d += 16)
            v = _mm512_fmadd_ps(_mm512_loadu_ps(q + d), _mm512_loadu_ps(kr + d), v);
        sc[k] = _mm512_reduce_add_ps(v) * a->scale;
    }
}

AVX512 static void values_avx512(const zsk_paged_attn *a, const item *it, int64_t t, int n,
                                 const float *w, float c, float *acc)
{
    const float *vr[TILE];
    for (int k = 0; k < n; k++)
        vr[k] = row(a, it->s, t + k, a->v_off, it->h);
    for (int64_t d = 0; d < a->D; d += 16) {
        __m512 x = _mm512_mul_ps(_mm512_loadu_ps(acc + d), _mm512_set1_ps(c));
        for (int k = 0; k < n; k++)
            x = _mm512_fmadd_ps(_mm512_set1_ps(w[k]), _mm512_loadu_ps(vr[k] + d), x);
        _mm512_storeu_ps(acc + d, x);
    }
}
#endif

/* One chunk: the online softmax over its positions, TILE at a time (tiles
 * start at multiples of TILE, so a position's arithmetic depends on its
 * sequence only). */
static void chunk_body(void *ctx, int64_t lo, int64_t hi)
{
    const job *j = ctx;
    const zsk_paged_attn *a = j->a;
    int64_t D = a->D;
    for (int64_t w = lo; w < hi; w++) {
        const item *it = &j->items[w];
        const float *q = a->q + (it->s * a->H + it->h) * D;
        float *p = j->part + w * (D + 2), *acc = p + 2, m = -INFINITY, sum = 0;
        float slope = a->slopes ? a->slopes[it->h] : 0, sc[TILE];
        int64_t last = a->len[it->s] - 1;
        for (int64_t d = 0; d < D; d++)
            acc[d] = 0;
        for (int64_t t = it->t0; t < it->t1; t += TILE) {
            int n = it->t1 - t < TILE ? (int)(it->t1 - t) : TILE;
            float m2 = m;
#ifdef ZSK_PAGED_AVX512
            if (j->avx512)
                scores_avx512(a, it, q, t, n, sc);
            else
#endif
                scores_c(a, it, q, t, n, sc);
            for (int k = 0; k < n; k++) {
                if (slope != 0)
                    sc[k] -= slope * (float)(last - t - k);
                m2 = sc[k] > m2 ? sc[k] : m2;
            }
            float c = expf(m - m2), add = 0;
            for (int k = 0; k < n; k++)
                add += (sc[k] = expf(sc[k] - m2));
            sum = sum * c + add;
#ifdef ZSK_PAGED_AVX512
            if (j->avx512)
                values_avx512(a, it, t, n, sc, c, acc);
            else
#endif
                values_c(a, it, t, n, sc, c, acc);
            m = m2;
        }
        p[0] = m;
        p[1] = sum;
    }
}

/* The chunks of one (sequence, head), merged in order into o. */
static void merge(const zsk_paged_attn *a, const float *part, int64_t n, float *o)
{
    int64_t D = a->D;
    float m = -INFINITY;
    for (int64_t c = 0; c < n; c++)
        m = part[c * (D + 2)] > m ? part[c * (D + 2)] : m;
    double sum = 0;
    for (int64_t d = 0; d < D; d++)
        o[d] = 0;
    for (int64_t c = 0; c < n; c++) {
        const float *p = part + c * (D + 2);
        float w = expf(p[0] - m);
        sum += (double)(p[1] * w);
        for (int64_t d = 0; d < D; d++)
            o[d] += w * p[2 + d];
    }
    for (int64_t d = 0; d < D; d++)
        o[d] = (float)(o[d] / sum);
}

zs_status zsk_paged_attention_f32(const zsk_paged_attn *a, float *o)
{
    int64_t n = 0;
    for (int64_t s = 0; s < a->n_seqs; s++) {
        if (a->len[s] < 1)
            return zs_set_error("paged attention: sequence %lld has no cached position",
                                (long long)s);
        n += a->H * ((a->len[s] + CHUNK - 1) / CHUNK);
    }
    item *items = malloc((size_t)(n ? n : 1) * sizeof *items);
    float *part = malloc((size_t)(n ? n : 1) * (size_t)(a->D + 2) * sizeof *part);
    if (!items || !part) {
        free(items);
        free(part);
        return zs_set_error_code(ZS_ERR_NOMEM, "paged attention: out of memory");
    }
    int64_t w = 0;
    for (int64_t s = 0; s < a->n_seqs; s++)
        for (int64_t h = 0; h < a->H; h++)
            for (int64_t t = 0; t < a->len[s]; t += CHUNK)
                items[w++] = (item){s, h, t, t + CHUNK < a->len[s] ? t + CHUNK : a->len[s]};
    job j = {a, items, part, false};
#ifdef ZSK_PAGED_AVX512
    j.avx512 = a->D % 16 == 0 && zs_cpu()->avx512f && !zsk_linear_portable();
#endif
    zs_parallel_for(n, 1, chunk_body, &j);
    w = 0;
    for (int64_t s = 0; s < a->n_seqs; s++)
        for (int64_t h = 0; h < a->H; h++) {
            int64_t c = (a->len[s] + CHUNK - 1) / CHUNK;
            merge(a, part + w * (a->D + 2), c, o + (s * a->H + h) * a->D);
            w += c;
        }
    free(items);
    free(part);
    return ZS_OK;
}

/* ---- float64 ----------------------------------------------------------- */

static const double *row64(const zsk_paged_attn_f64 *a, int64_t s, int64_t t,
                           int64_t off, int64_t h)
{
    int64_t b = a->tables[s][t / a->bs];
    return a->base + b * a->block_stride + off + ((t % a->bs) * a->H + h) * a->D;
}

typedef struct job64 {
    const zsk_paged_attn_f64 *a;
    double *o;
} job64;

/* Work items s * H + h in [lo, hi): an online softmax over the whole
 * sequence, in position order. */
static void seq_head64(void *ctx, int64_t lo, int64_t hi)
{
    const job64 *j = ctx;
    const zsk_paged_attn_f64 *a = j->a;
    int64_t D = a->D;
    for (int64_t w = lo; w < hi; w++) {
        int64_t s = w / a->H, h = w % a->H, n = a->len[s];
        const double *q = a->q + w * D;
        double *acc = j->o + w * D, m = -INFINITY, sum = 0;
        double slope = a->slopes ? a->slopes[h] : 0;
        for (int64_t d = 0; d < D; d++)
            acc[d] = 0;
        for (int64_t t = 0; t < n; t++) {
            const double *k = row64(a, s, t, a->k_off, h), *v = row64(a, s, t, a->v_off, h);
            double x = 0;
            for (int64_t d = 0; d < D; d++)
                x += q[d] * k[d];
            x = x * a->scale - slope * (double)(n - 1 - t);
            double m2 = x > m ? x : m, c = exp(m - m2), e = exp(x - m2);
            sum = sum * c + e;
            for (int64_t d = 0; d < D; d++)
                acc[d] = acc[d] * c + e * v[d];
            m = m2;
        }
        for (int64_t d = 0; d < D; d++)
            acc[d] /= sum;
    }
}

zs_status zsk_paged_attention_f64(const zsk_paged_attn_f64 *a, double *o)
{
    for (int64_t s = 0; s < a->n_seqs; s++)
        if (a->len[s] < 1)
            return zs_set_error("paged attention: sequence %lld has no cached position",
                                (long long)s);
    job64 j = {a, o};
    zs_parallel_for(a->n_seqs * a->H, 1, seq_head64, &j);
    return ZS_OK;
}
