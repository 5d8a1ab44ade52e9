/*
 * paged_attention.c - decode attention through block tables
 * (kernels/cpu/paged_attention.h).
 *
 * A work item is a chunk of CHUNK positions of one sequence, all heads.
 * The AVX-512 path reads each tile of 16 positions in address order: the
 * key rows position by position (H * D contiguous floats each), scoring
 * every head, then the value rows the same way into every head's sums,
 * which stay in L1 (part). Reading head by head instead strides H * D * 4
 * bytes (3 KB at GPT-2's width) from position to position, a new 4 KB page
 * at nearly every access, which the hardware prefetchers do not follow:
 * measured on 48 layers of 160 cached positions (cold, 2 threads), one
 * (sequence, head) per item 51 us per layer (19 GB/s), chunks of all heads
 * read head by head 38 us, address order 30 us (33 GB/s, near the weight
 * streams' rate). Software prefetching the next tile, either order, was
 * slower. Scratch (items, their states) comes from zs_alloc: a prefill
 * step's states reach tens of MB, which malloc would map and fault in
 * afresh on every call. Each (item, head) keeps its own running max, sum and weighted
 * value sum in part; merge() combines a (sequence, head)'s chunks in
 * order.
 */
#include <math.h>
#include <stdlib.h>

#include "kernels/cpu/kernels.h"
#include "kernels/cpu/packed_linear.h"
#include "kernels/cpu/paged_attention.h"
#include "kernels/cpu/vmath.h"

#if defined(__x86_64__)
#include <immintrin.h>

#include "kernels/cpu/half8.h"
#define ZSK_PAGED_AVX512 1
#define AVX512 __attribute__((target("avx512f")))
#define AVX512_INLINE static inline __attribute__((always_inline, target("avx512f")))
#define AVX2 __attribute__((target("avx2,fma,f16c")))
#define AVX2_INLINE static inline __attribute__((always_inline, target("avx2,fma,f16c")))
#endif

#define CHUNK 16 /* positions per work item (a multiple of TILE): 160
                  * positions make 10 items, 5 per thread */
#define MAX_HEADS 128 /* the AVX-512 path's score buffer: H * TILE floats */
#define TILE 16  /* positions scored together: one max and one rescale each */

typedef struct item {
    int64_t s, t0, t1; /* sequence, positions [t0, t1) */
} item;

typedef struct job {
    const zsk_paged_attn *a;
    const item *items;
    float *part;          /* per item and head: max, sum, then D weighted values */
    float *wide;          /* portable path, 16-bit K/V: per pool thread a tile's
                           * key and value rows of one head in f32 [TILE, 2, D] */
    bool avx512;          /* the zmm tile function (D a multiple of 16) */
    bool avx2;            /* else the ymm one (D a multiple of 8) */
} job;

/* One head's running state within an item: max, sum, acc [D]. */
typedef struct head_state {
    float *m, *sum, *acc;
} head_state;

static ZSK_ISA_FN(float, dot, (const float *restrict x,
    const float *restrict y, int64_t n), (x, y, n))
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

static ZSK_ISA_VOID(axpy, (float *restrict y, float w,
    const float *restrict x, int64_t n), (y, w, x, n))
{
    for (int64_t i = 0; i < n; i++)
        y[i] += w * x[i];
}

static ZSK_ISA_VOID(scale, (float *restrict y, float c, int64_t n),
    (y, c, n))
{
    for (int64_t i = 0; i < n; i++)
        y[i] *= c;
}

/* The rows (all heads) of positions t .. t + n - 1 of sequence s, keys
 * (off = k_off) or values: one division for the tile, then slots counted
 * up. */
static void tile_rows(const zsk_paged_attn *a, int64_t s, int64_t t, int n, int64_t off,
                      const void **r)
{
    const int32_t *table = a->tables[s];
    int64_t bi = t / a->bs, slot = t % a->bs;
    size_t es = zs_dtype_size(a->kv);
    for (int k = 0; k < n; k++) {
        r[k] = (const char *)a->base +
               (size_t)(table[bi] * a->block_stride + off + slot * a->H * a->D) * es;
        if (++slot == a->bs)
            slot = 0, bi++;
    }
}

/* Elements [e0, e0 + n) of a 16-bit row widened into dst (portable path). */
static void widen(zs_dtype kv, const void *row, int64_t e0, int64_t n, float *dst)
{
    const uint16_t *u = (const uint16_t *)row + e0;
    for (int64_t i = 0; i < n; i++)
        dst[i] = kv == ZS_BF16 ? zs_bf16_to_f32(u[i]) : zs_f16_to_f32(u[i]);
}

/* The online softmax step of one head over one tile, portable: kr, vr the
 * tile's rows at this head, dist the ALiBi distance of the tile's first
 * position (last - t). */
static void tile_c(const zsk_paged_attn *a, const float *q, const float *const *kr,
                   const float *const *vr, int n, float slope, int64_t dist, head_state h)
{
    float sc[TILE], m2 = *h.m;
    for (int k = 0; k < n; k++) {
        sc[k] = dot(q, kr[k], a->D) * a->scale;
        if (slope != 0)
            sc[k] -= slope * (float)(dist - k);
        m2 = sc[k] > m2 ? sc[k] : m2;
    }
    float c = expf(*h.m - m2), add = 0;
    for (int k = 0; k < n; k++)
        add += (sc[k] = expf(sc[k] - m2));
    *h.sum = *h.sum * c + add;
    *h.m = m2;
    scale(h.acc, c, a->D);
    for (int k = 0; k < n; k++)
        axpy(h.acc, sc[k], vr[k], a->D);
}

#ifdef ZSK_PAGED_AVX512
/* 16 elements of a K or V row from element i, widened to f32. */
AVX512_INLINE __m512 load_kv(zs_dtype kv, const void *row, int64_t i)
{
    if (kv == ZS_F32)
        return _mm512_loadu_ps((const float *)row + i);
    __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)row + i));
    if (kv == ZS_F16)
        return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* One tile, all heads, rows read in address order (position-major): the
 * scores position by position (each key row H * D contiguous floats), the
 * softmax step per head on 16 lanes, then the value rows position by
 * position into every head's acc (in L1: part). part: H states of D + 2
 * floats (max, sum, acc). */
AVX512_INLINE void tile_heads_kv(zs_dtype kv, const zsk_paged_attn *a, const float *q,
                                 const void *const *kr, const void *const *vr, int n,
                                 int64_t dist, float *part)
{
    int64_t D = a->D, H = a->H, S = D + 2;
    float sc[MAX_HEADS * TILE];
    for (int k = 0; k < n; k++)
        for (int64_t h = 0; h < H; h++) {
            const float *qh = q + h * D;
            __m512 v = _mm512_mul_ps(_mm512_loadu_ps(qh), load_kv(kv, kr[k], h * D));
            for (int64_t d = 16; d < D; d += 16)
                v = _mm512_fmadd_ps(_mm512_loadu_ps(qh + d), load_kv(kv, kr[k], h * D + d),
                                    v);
            sc[h * TILE + k] = _mm512_reduce_add_ps(v);
        }
    __mmask16 live = (__mmask16)((1u << n) - 1);
    for (int64_t h = 0; h < H; h++) {
        float *m = part + h * S, *sum = m + 1, *acc = m + 2;
        float slope = a->slopes ? a->slopes[h] : 0;
        __m512 s = _mm512_mul_ps(_mm512_maskz_loadu_ps(live, sc + h * TILE),
                                 _mm512_set1_ps(a->scale));
        if (slope != 0) { /* - slope * (dist - k) */
            __m512 dk = _mm512_sub_ps(_mm512_set1_ps((float)dist),
                                      _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11,
                                                     12, 13, 14, 15));
            s = _mm512_fnmadd_ps(_mm512_set1_ps(slope), dk, s);
        }
        s = _mm512_mask_blend_ps(live, _mm512_set1_ps(-INFINITY), s);
        float m2 = _mm512_reduce_max_ps(s);
        m2 = m2 > *m ? m2 : *m;
        __m512 e = _mm512_maskz_mov_ps(live,
                                       zsi_exp_m512(_mm512_sub_ps(s, _mm512_set1_ps(m2))));
        __m512 c = _mm512_set1_ps(zsi_exp_f32(*m - m2));
        *sum = *sum * _mm512_cvtss_f32(c) + _mm512_reduce_add_ps(e);
        *m = m2;
        _mm512_storeu_ps(sc + h * TILE, e);
        for (int64_t d = 0; d < D; d += 16)
            _mm512_storeu_ps(acc + d, _mm512_mul_ps(_mm512_loadu_ps(acc + d), c));
    }
    for (int k = 0; k < n; k++)
        for (int64_t h = 0; h < H; h++) {
            float *acc = part + h * S + 2;
            __m512 w = _mm512_set1_ps(sc[h * TILE + k]);
            for (int64_t d = 0; d < D; d += 16)
                _mm512_storeu_ps(acc + d, _mm512_fmadd_ps(w, load_kv(kv, vr[k], h * D + d),
                                                          _mm512_loadu_ps(acc + d)));
        }
}

/* The tile function with the element type a constant in each copy. */
AVX512 static void tile_heads_avx512(const zsk_paged_attn *a, const float *q,
                                     const void *const *kr, const void *const *vr, int n,
                                     int64_t dist, float *part)
{
    switch (a->kv) {
    case ZS_BF16: tile_heads_kv(ZS_BF16, a, q, kr, vr, n, dist, part); return;
    case ZS_F16: tile_heads_kv(ZS_F16, a, q, kr, vr, n, dist, part); return;
    default: tile_heads_kv(ZS_F32, a, q, kr, vr, n, dist, part); return;
    }
}

/* ---- AVX2+FMA+F16C: the AVX-512 tile on 8 lanes ---- */

/* 8 elements of a K or V row from element i, widened to f32 (vcvtph2ps
 * for f16, a 16-bit shift for bf16). */
AVX2_INLINE __m256 load_kv8(zs_dtype kv, const void *row, int64_t i)
{
    if (kv == ZS_F32)
        return _mm256_loadu_ps((const float *)row + i);
    return zsk_cvt8h(_mm_loadu_si128((const __m128i *)((const uint16_t *)row + i)),
                     kv == ZS_F16);
}

/* The sum and the max of 8 lanes, always the same tree. */
AVX2_INLINE float hsum8(__m256 v)
{
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    return _mm_cvtss_f32(_mm_add_ss(x, _mm_movehdup_ps(x)));
}

AVX2_INLINE float hmax8(__m256 v)
{
    __m128 x = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_max_ps(x, _mm_movehl_ps(x, x));
    return _mm_cvtss_f32(_mm_max_ss(x, _mm_movehdup_ps(x)));
}

/* tile_heads_kv on ymm: the same address order and steps, a head's 16
 * scores as two vectors, the dot products over D in 8-lane pieces. */
AVX2_INLINE void tile_heads_kv8(zs_dtype kv, const zsk_paged_attn *a, const float *q,
                                const void *const *kr, const void *const *vr, int n,
                                int64_t dist, float *part)
{
    int64_t D = a->D, H = a->H, S = D + 2;
    float sc[MAX_HEADS * TILE];
    for (int k = 0; k < n; k++)
        for (int64_t h = 0; h < H; h++) {
            const float *qh = q + h * D;
            __m256 v = _mm256_mul_ps(_mm256_loadu_ps(qh), load_kv8(kv, kr[k], h * D));
            for (int64_t d = 8; d < D; d += 8)
                v = _mm256_fmadd_ps(_mm256_loadu_ps(qh + d), load_kv8(kv, kr[k], h * D + d),
                                    v);
            sc[h * TILE + k] = hsum8(v);
        }
    const __m256 iota0 = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256 iota1 = _mm256_setr_ps(8, 9, 10, 11, 12, 13, 14, 15);
    __m256 nv = _mm256_set1_ps((float)n), ninf = _mm256_set1_ps(-INFINITY);
    __m256 live0 = _mm256_cmp_ps(iota0, nv, _CMP_LT_OQ);
    __m256 live1 = _mm256_cmp_ps(iota1, nv, _CMP_LT_OQ);
    for (int64_t h = 0; h < H; h++) {
        float *m = part + h * S, *sum = m + 1, *acc = m + 2;
        float slope = a->slopes ? a->slopes[h] : 0;
        __m256 scl = _mm256_set1_ps(a->scale);
        /* lanes past n hold stale scores: blended away below */
        __m256 s0 = _mm256_mul_ps(_mm256_loadu_ps(sc + h * TILE), scl);
        __m256 s1 = _mm256_mul_ps(_mm256_loadu_ps(sc + h * TILE + 8), scl);
        if (slope != 0) { /* - slope * (dist - k) */
            __m256 sl = _mm256_set1_ps(slope), dv = _mm256_set1_ps((float)dist);
            s0 = _mm256_fnmadd_ps(sl, _mm256_sub_ps(dv, iota0), s0);
            s1 = _mm256_fnmadd_ps(sl, _mm256_sub_ps(dv, iota1), s1);
        }
        s0 = _mm256_blendv_ps(ninf, s0, live0);
        s1 = _mm256_blendv_ps(ninf, s1, live1);
        float m2 = hmax8(_mm256_max_ps(s0, s1));
        m2 = m2 > *m ? m2 : *m;
        __m256 mv = _mm256_set1_ps(m2);
        __m256 e0 = _mm256_and_ps(live0, zsi_exp_m256(_mm256_sub_ps(s0, mv)));
        __m256 e1 = _mm256_and_ps(live1, zsi_exp_m256(_mm256_sub_ps(s1, mv)));
        float c = zsi_exp_f32(*m - m2);
        *sum = *sum * c + hsum8(_mm256_add_ps(e0, e1));
        *m = m2;
        _mm256_storeu_ps(sc + h * TILE, e0);
        _mm256_storeu_ps(sc + h * TILE + 8, e1);
        __m256 cv = _mm256_set1_ps(c);
        for (int64_t d = 0; d < D; d += 8)
            _mm256_storeu_ps(acc + d, _mm256_mul_ps(_mm256_loadu_ps(acc + d), cv));
    }
    for (int k = 0; k < n; k++)
        for (int64_t h = 0; h < H; h++) {
            float *acc = part + h * S + 2;
            __m256 w = _mm256_set1_ps(sc[h * TILE + k]);
            for (int64_t d = 0; d < D; d += 8)
                _mm256_storeu_ps(acc + d, _mm256_fmadd_ps(w, load_kv8(kv, vr[k], h * D + d),
                                                          _mm256_loadu_ps(acc + d)));
        }
}

AVX2 static void tile_heads_avx2(const zsk_paged_attn *a, const float *q,
                                 const void *const *kr, const void *const *vr, int n,
                                 int64_t dist, float *part)
{
    switch (a->kv) {
    case ZS_BF16: tile_heads_kv8(ZS_BF16, a, q, kr, vr, n, dist, part); return;
    case ZS_F16: tile_heads_kv8(ZS_F16, a, q, kr, vr, n, dist, part); return;
    default: tile_heads_kv8(ZS_F32, a, q, kr, vr, n, dist, part); return;
    }
}
#endif

/* One chunk, all heads: the online softmax over its positions, TILE at a
 * time (tiles start at multiples of TILE, so a position's arithmetic
 * depends on its sequence only). */
static void chunk_body(void *ctx, int64_t lo, int64_t hi)
{
    const job *j = ctx;
    const zsk_paged_attn *a = j->a;
    int64_t D = a->D, H = a->H;
    float *wide = j->wide ? j->wide + (size_t)zs_thread_index() * 2 * TILE * D : NULL;
    for (int64_t w = lo; w < hi; w++) {
        const item *it = &j->items[w];
        float *part = j->part + w * H * (D + 2);
        for (int64_t h = 0; h < H; h++) {
            part[h * (D + 2)] = -INFINITY;
            for (int64_t d = 1; d < D + 2; d++)
                part[h * (D + 2) + d] = 0;
        }
        int64_t last = a->len[it->s] - 1;
        for (int64_t t = it->t0; t < it->t1; t += TILE) {
            int n = it->t1 - t < TILE ? (int)(it->t1 - t) : TILE;
            const void *kr[TILE], *vr[TILE];
            const float *kh[TILE], *vh[TILE];
            tile_rows(a, it->s, t, n, a->k_off, kr);
            tile_rows(a, it->s, t, n, a->v_off, vr);
#ifdef ZSK_PAGED_AVX512
            if (j->avx512) {
                tile_heads_avx512(a, a->q + it->s * H * D, kr, vr, n, last - t, part);
                continue;
            }
            if (j->avx2) {
                tile_heads_avx2(a, a->q + it->s * H * D, kr, vr, n, last - t, part);
                continue;
            }
#endif
            for (int64_t h = 0; h < H; h++) {
                float *p = part + h * (D + 2);
                head_state st = {p, p + 1, p + 2};
                const float *q = a->q + (it->s * H + h) * D;
                float slope = a->slopes ? a->slopes[h] : 0;
                for (int k = 0; k < n; k++) {
                    if (a->kv == ZS_F32) {
                        kh[k] = (const float *)kr[k] + h * D;
                        vh[k] = (const float *)vr[k] + h * D;
                        continue;
                    }
                    float *wk = wide + 2 * k * D, *wv = wk + D;
                    widen(a->kv, kr[k], h * D, D, wk);
                    widen(a->kv, vr[k], h * D, D, wv);
                    kh[k] = wk, vh[k] = wv;
                }
                tile_c(a, q, kh, vh, n, slope, last - t, st);
            }
        }
    }
}

/* The chunks of one (sequence, head), merged in order into o: part holds
 * the first chunk's state of this head, stride apart from chunk to chunk. */
static void merge(const zsk_paged_attn *a, const float *part, int64_t n, int64_t stride,
                  float *o)
{
    int64_t D = a->D;
    float m = -INFINITY;
    for (int64_t c = 0; c < n; c++)
        m = part[c * stride] > m ? part[c * stride] : m;
    double sum = 0;
    for (int64_t d = 0; d < D; d++)
        o[d] = 0;
    for (int64_t c = 0; c < n; c++) {
        const float *p = part + c * stride;
        float w = expf(p[0] - m);
        sum += (double)(p[1] * w);
        for (int64_t d = 0; d < D; d++)
            o[d] += w * p[2 + d];
    }
    for (int64_t d = 0; d < D; d++)
        o[d] = (float)(o[d] / sum);
}

typedef struct merge_job {
    const zsk_paged_attn *a;
    const float *part;
    const int64_t *first; /* [n_seqs + 1] each sequence's first item */
    float *o;
} merge_job;

/* Sequences [s0, s1): every head's chunks merged into o. */
static void merge_seqs(void *ctx, int64_t s0, int64_t s1)
{
    const merge_job *m = ctx;
    int64_t H = m->a->H, D = m->a->D;
    for (int64_t s = s0; s < s1; s++)
        for (int64_t h = 0; h < H; h++)
            merge(m->a, m->part + (m->first[s] * H + h) * (D + 2),
                  m->first[s + 1] - m->first[s], H * (D + 2), m->o + (s * H + h) * D);
}

zs_status zsk_paged_attention_f32(const zsk_paged_attn *a, float *o)
{
    int64_t n = 0, H = a->H, D = a->D;
    if (a->kv != ZS_F32 && a->kv != ZS_BF16 && a->kv != ZS_F16)
        return zs_set_error("paged attention: keys and values in %s, expected f32, "
                            "bf16 or f16", zs_dtype_name(a->kv));
    for (int64_t s = 0; s < a->n_seqs; s++) {
        if (a->len[s] < 1)
            return zs_set_error("paged attention: sequence %lld has no cached position",
                                (long long)s);
        n += (a->len[s] + CHUNK - 1) / CHUNK;
    }
    item *items = zs_alloc((size_t)(n ? n : 1) * sizeof *items);
    float *part = zs_alloc((size_t)(n ? n : 1) * (size_t)(H * (D + 2)) * sizeof *part);
    if (!items || !part) {
        zs_free(items);
        zs_free(part);
        return zs_set_error_code(ZS_ERR_NOMEM, "paged attention: out of memory");
    }
    int64_t w = 0;
    for (int64_t s = 0; s < a->n_seqs; s++)
        for (int64_t t = 0; t < a->len[s]; t += CHUNK)
            items[w++] = (item){s, t, t + CHUNK < a->len[s] ? t + CHUNK : a->len[s]};
    job j = {a, items, part, NULL, false, false};
#ifdef ZSK_PAGED_AVX512
    const zs_cpu_features *f = zs_cpu();
    j.avx512 = a->D % 16 == 0 && a->H <= MAX_HEADS && f->avx512f && !zsk_linear_portable();
    j.avx2 = !j.avx512 && a->D % 8 == 0 && a->H <= MAX_HEADS && f->avx2 && f->fma &&
             f->f16c && !zsk_linear_portable();
#endif
    if (!j.avx512 && !j.avx2 && a->kv != ZS_F32 &&
        !(j.wide = zs_alloc((size_t)zs_num_threads() * 2 * TILE * (size_t)D *
                            sizeof *j.wide))) {
        zs_free(items);
        zs_free(part);
        return zs_set_error_code(ZS_ERR_NOMEM, "paged attention: out of memory");
    }
    zs_parallel_for(n, 1, chunk_body, &j);
    zs_free(j.wide);
    /* first[s]: sequence s's first item; the merges run over the pool too
     * (a prefill step has one sequence row per token) */
    int64_t *first = zs_alloc((size_t)(a->n_seqs + 1) * sizeof *first);
    if (!first) {
        zs_free(items);
        zs_free(part);
        return zs_set_error_code(ZS_ERR_NOMEM, "paged attention: out of memory");
    }
    first[0] = 0;
    for (int64_t s = 0; s < a->n_seqs; s++)
        first[s + 1] = first[s] + (a->len[s] + CHUNK - 1) / CHUNK;
    merge_job mj = {a, part, first, o};
    zs_parallel_for(a->n_seqs, 1 + 64 / (first[a->n_seqs] / (a->n_seqs ? a->n_seqs : 1) + 1),
                    merge_seqs, &mj);
    zs_free(first);
    zs_free(items);
    zs_free(part);
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
