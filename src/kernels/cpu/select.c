/*
 * select.c - data-movement kernels for concat, where/masked_fill,
 * index_select and gather, and the scatter-add of their backward rules
 * (contracts in select.h).
 *
 * Copies go by element size through unsigned integer types, so one kernel
 * serves every dtype and NaN payloads pass unchanged. All are memory bound;
 * work is split into chunks of about ZSK_GRAIN elements across the pool.
 */
#include "kernels/cpu/select.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* ---- concat ------------------------------------------------------------ */

typedef struct cat_ctx {
    size_t esize;
    int n;
    const void *const *src;
    const int64_t *cols, *start;
    int64_t C;
    char *dst;
} cat_ctx;

/* Task t copies row o = t / n of input i = t % n. */
static void cat_range(void *p, int64_t begin, int64_t end)
{
    const cat_ctx *c = p;
    for (int64_t t = begin; t < end; t++) {
        int64_t o = t / c->n;
        int i = (int)(t % c->n);
        if (!c->src[i] || c->cols[i] == 0)
            continue;
        size_t nb = (size_t)c->cols[i] * c->esize;
        memcpy(c->dst + (size_t)(o * c->C + c->start[i]) * c->esize,
               (const char *)c->src[i] + (size_t)o * nb, nb);
    }
}

void zsk_concat_rows(size_t esize, int n, const void *const *src,
                     const int64_t *cols, int64_t O, int64_t C, void *dst)
{
    if (n <= 0 || O <= 0 || C <= 0)
        return;
    int64_t *start = malloc((size_t)n * sizeof *start);
    if (!start) { /* serial, offsets on the fly */
        for (int64_t o = 0; o < O; o++) {
            int64_t s = 0;
            for (int i = 0; i < n; s += cols[i], i++)
                if (src[i])
                    memcpy((char *)dst + (size_t)(o * C + s) * esize,
                           (const char *)src[i] + (size_t)(o * cols[i]) * esize,
                           (size_t)cols[i] * esize);
        }
        return;
    }
    int64_t s = 0;
    for (int i = 0; i < n; s += cols[i], i++)
        start[i] = s;
    cat_ctx c = {esize, n, src, cols, start, C, dst};
    int64_t per_task = C / n > 0 ? C / n : 1;
    int64_t grain = ZSK_GRAIN / per_task > 0 ? ZSK_GRAIN / per_task : 1;
    zs_parallel_for(O * n, grain, cat_range, &c);
    free(start);
}

/* ---- where ------------------------------------------------------------- */

typedef struct where_ctx {
    const zsk_iter *it;
    void *out;
    const uint8_t *cond;
    const void *a, *b;
} where_ctx;

#define DEFINE_WHERE_SEG(T, SUF)                                              \
    static ZSK_ISA_VOID(where_seg_##SUF, (void *p, const int64_t *offs,      \
        int64_t n), (p, offs, n))                                            \
    {                                                                         \
        const where_ctx *c = p;                                               \
        int last = c->it->ndim - 1;                                           \
        int64_t so = c->it->strides[0][last], sc = c->it->strides[1][last];   \
        int64_t sa = c->it->strides[2][last], sb = c->it->strides[3][last];   \
        T *restrict o = (T *)c->out + offs[0];                                \
        const uint8_t *restrict m = c->cond + offs[1];                        \
        const T *restrict a = (const T *)c->a + offs[2];                      \
        const T *restrict b = (const T *)c->b + offs[3];                      \
        if (so == 1 && sc == 1 && sa == 1 && sb == 1) {                       \
            for (int64_t i = 0; i < n; i++)                                   \
                o[i] = m[i] ? a[i] : b[i];                                    \
        } else if (so == 1 && sc == 1 && sa == 0 && sb == 1) {                \
            T x = a[0];                                                       \
            for (int64_t i = 0; i < n; i++)                                   \
                o[i] = m[i] ? x : b[i];                                       \
        } else if (so == 1 && sc == 1 && sa == 1 && sb == 0) {                \
            T y = b[0];                                                       \
            for (int64_t i = 0; i < n; i++)                                   \
                o[i] = m[i] ? a[i] : y;                                       \
        } else {                                                              \
            for (int64_t i = 0; i < n; i++)                                   \
                o[i * so] = m[i * sc] ? a[i * sa] : b[i * sb];                \
        }                                                                     \
    }

DEFINE_WHERE_SEG(uint8_t, 1)
DEFINE_WHERE_SEG(uint16_t, 2)
DEFINE_WHERE_SEG(uint32_t, 4)
DEFINE_WHERE_SEG(uint64_t, 8)

void zsk_where(size_t esize, const zsk_iter *it, void *out,
               const uint8_t *cond, const void *a, const void *b)
{
    where_ctx c = {it, out, cond, a, b};
    zsk_seg_fn fn = esize == 8 ? where_seg_8 : esize == 4 ? where_seg_4
                  : esize == 2 ? where_seg_2 : where_seg_1;
    zsk_iter_parallel(it, ZSK_GRAIN, fn, &c);
}

/* ---- gather / index_select --------------------------------------------- */

typedef struct index_ctx {
    const zsk_index_plan *p;
    void *dense;
    const void *src;
    int64_t kb; /* scatter: columns per task */
} index_ctx;

/* Rows r = o * L + l in [begin, end), walked as runs of l within one o. */
#define DEFINE_GATHER_ROWS(T, SUF)                                            \
    static ZSK_ISA_VOID(gather_rows_##SUF, (void *v, int64_t begin,          \
        int64_t end), (v, begin, end))                                       \
    {                                                                         \
        const index_ctx *c = v;                                               \
        const zsk_index_plan *p = c->p;                                       \
        const T *restrict s = c->src;                                         \
        int64_t K = p->K, sd = p->sd, ks = p->ks;                             \
        for (int64_t r = begin; r < end;) {                                   \
            int64_t o = r / p->L, l0 = r % p->L;                              \
            int64_t l1 = l0 + (end - r) < p->L ? l0 + (end - r) : p->L;       \
            const int64_t *ix = p->idx + o * p->is_o;                         \
            const T *restrict so = s + p->ooff[o];                            \
            T *restrict d = (T *)c->dense + r * K;                            \
            r += l1 - l0;                                                     \
            if (K == 1) {                                                     \
                so += p->koff ? p->koff[0] : 0;                               \
                for (int64_t l = l0; l < l1; l++)                             \
                    *d++ = so[ix[l * p->is_l] * sd];                          \
                continue;                                                     \
            }                                                                 \
            for (int64_t l = l0; l < l1; l++, d += K) {                       \
                const int64_t *il = ix + l * p->is_l;                         \
                if (p->is_k == 0 && !p->koff) {                               \
                    const T *restrict row = so + il[0] * sd;                  \
                    if (ks == 1)                                              \
                        for (int64_t k = 0; k < K; k++)                       \
                            d[k] = row[k];                                    \
                    else                                                      \
                        for (int64_t k = 0; k < K; k++)                       \
                            d[k] = row[k * ks];                               \
                } else {                                                      \
                    for (int64_t k = 0; k < K; k++) {                         \
                        int64_t ko = p->koff ? p->koff[k] : k * ks;           \
                        d[k] = so[il[k * p->is_k] * sd + ko];                 \
                    }                                                         \
                }                                                             \
            }                                                                 \
        }                                                                     \
    }

DEFINE_GATHER_ROWS(uint8_t, 1)
DEFINE_GATHER_ROWS(uint16_t, 2)
DEFINE_GATHER_ROWS(uint32_t, 4)
DEFINE_GATHER_ROWS(uint64_t, 8)

void zsk_index_gather(size_t esize, const zsk_index_plan *p, void *dense,
                      const void *src)
{
    index_ctx c = {p, dense, src, 0};
    zs_range_fn fn = esize == 8 ? gather_rows_8 : esize == 4 ? gather_rows_4
                   : esize == 2 ? gather_rows_2 : gather_rows_1;
    int64_t K = p->K > 0 ? p->K : 1;
    zs_parallel_for(p->O * p->L, ZSK_GRAIN / K > 0 ? ZSK_GRAIN / K : 1, fn, &c);
}

/* Task t = (o, column block b) walks every l, so all additions into one
 * destination element happen on one thread, in l order. */
#define DEFINE_SCATTER(T, SUF)                                                \
    static ZSK_ISA_VOID(scatter_##SUF, (void *v, int64_t begin, int64_t end), \
        (v, begin, end))                                                      \
    {                                                                         \
        const index_ctx *c = v;                                               \
        const zsk_index_plan *p = c->p;                                       \
        int64_t nkb = (p->K + c->kb - 1) / c->kb;                             \
        T *restrict dst = c->dense;                                           \
        const T *restrict g = c->src;                                         \
        for (int64_t t = begin; t < end; t++) {                               \
            int64_t o = t / nkb, k0 = (t % nkb) * c->kb;                      \
            int64_t k1 = k0 + c->kb < p->K ? k0 + c->kb : p->K;               \
            int64_t base = p->ooff[o];                                        \
            for (int64_t l = 0; l < p->L; l++) {                              \
                const int64_t *ix = p->idx + o * p->is_o + l * p->is_l;       \
                const T *restrict gr = g + (o * p->L + l) * p->K;             \
                if (p->is_k == 0 && !p->koff && p->ks == 1) {                 \
                    T *restrict row = dst + base + ix[0] * p->sd;             \
                    for (int64_t k = k0; k < k1; k++)                         \
                        row[k] += gr[k];                                      \
                } else {                                                      \
                    for (int64_t k = k0; k < k1; k++) {                       \
                        int64_t ko = p->koff ? p->koff[k] : k * p->ks;        \
                        dst[base + ix[k * p->is_k] * p->sd + ko] += gr[k];    \
                    }                                                         \
                }                                                             \
            }                                                                 \
        }                                                                     \
    }

DEFINE_SCATTER(float, f32)
DEFINE_SCATTER(double, f64)

void zsk_index_scatter_add(zs_dtype dt, const zsk_index_plan *p, void *dst,
                           const void *dense)
{
    if (p->O <= 0 || p->L <= 0 || p->K <= 0)
        return;
    /* Column blocks of 4096 keep a task's destination rows in cache. */
    int64_t kb = p->K < 4096 ? p->K : 4096;
    index_ctx c = {p, dst, dense, kb};
    int64_t nkb = (p->K + kb - 1) / kb;
    int64_t work = p->L * kb;
    zs_parallel_for(p->O * nkb, ZSK_GRAIN / work > 0 ? ZSK_GRAIN / work : 1,
                    dt == ZS_F64 ? scatter_f64 : scatter_f32, &c);
}

/* ---- index validation ---------------------------------------------------- */

typedef struct bad_ctx {
    const int64_t *idx;
    int64_t size;
    atomic_int_fast64_t first;
} bad_ctx;

static void find_bad_range(void *v, int64_t begin, int64_t end)
{
    bad_ctx *c = v;
    for (int64_t i = begin; i < end; i++) {
        if (c->idx[i] < 0 || c->idx[i] >= c->size) {
            int_fast64_t cur = atomic_load(&c->first);
            while (i < cur && !atomic_compare_exchange_weak(&c->first, &cur, i))
                ;
            return;
        }
    }
}

int64_t zsk_index_find_bad(const int64_t *idx, int64_t n, int64_t size)
{
    bad_ctx c = {.idx = idx, .size = size};
    atomic_init(&c.first, n);
    zs_parallel_for(n, 4 * ZSK_GRAIN, find_bad_range, &c);
    int64_t first = (int64_t)atomic_load(&c.first);
    return first < n ? first : -1;
}
