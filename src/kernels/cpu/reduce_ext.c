/*
 * reduce_ext.c - max / argmax, the max gradient, two-pass variance and the
 * squared-difference sum, over contiguous [O, R, K] arrays (see
 * reduce_ext.h for the contracts).
 *
 * Layout of the work, as in reduce.c: K == 1 reduces contiguous rows
 * (lanes of 16 floats / 8 doubles so the loops vectorise without
 * -ffast-math), threaded over rows, or over parts of R combined in order
 * when there are fewer rows than threads; K > 1 streams rows of a k-strip
 * (STRIP columns) into accumulators, threaded over (o, strip).
 *
 * Each kernel is written once as a macro over the element type T and
 * instantiated for float and double.
 */
#include <math.h>
#include <stdlib.h>

#include "kernels/cpu/kernels.h"
#include "kernels/cpu/lowp.h"
#include "kernels/cpu/reduce_ext.h"

#define STRIP 1024
#define MAX_PARTS 64

static size_t esize(zs_dtype dt) { return dt == ZS_F64 ? 8 : 4; }

/* a and b are the same maximum (equal, or both NaN). */
#define SAME(a, b) ((a) == (b) || ((a) != (a) && (b) != (b)))

/* ---- max / argmax ------------------------------------------------------ */

/* Max key of x[0, n) (n >= 1); an integer max reduction, vectorised. */
#define DEF_KEY_MAX(T, S, KT)                                               \
    static ZSK_ISA_FN(KT, key_max_##S, (const T *x, int64_t n), (x, n))     \
    {                                                                       \
        KT m = zsk_key_##S(x[0]);                                           \
        for (int64_t i = 1; i < n; i++) {                                   \
            KT k = zsk_key_##S(x[i]);                                       \
            m = k > m ? k : m;                                              \
        }                                                                   \
        return m;                                                           \
    }

DEF_KEY_MAX(float, f32, int32_t)
DEF_KEY_MAX(double, f64, int64_t)

/* Max of x[0, n) (n >= 1), NaN if any element is NaN; *at (may be NULL)
 * receives the first index holding the largest key (so -0 < +0). One pass
 * over blocks of ARG_BLOCK, then a scan of the first block holding the
 * maximum. */
#define ARG_BLOCK 4096
#define DEF_ROW_MAX(T, S, KT)                                               \
    static T row_max_##S(const T *x, int64_t n, int64_t *at)                \
    {                                                                       \
        if (!at)                                                            \
            return zsk_unkey_##S(key_max_##S(x, n));                        \
        KT best = zsk_key_##S(x[0]);                                        \
        int64_t b0 = 0;                                                     \
        for (int64_t b = 0; b < n; b += ARG_BLOCK) {                        \
            KT m = key_max_##S(x + b, n - b < ARG_BLOCK ? n - b : ARG_BLOCK);\
            if (m > best) {                                                 \
                best = m;                                                   \
                b0 = b;                                                     \
            }                                                               \
        }                                                                   \
        while (zsk_key_##S(x[b0]) != best)                                  \
            b0++;                                                           \
        *at = b0;                                                           \
        return zsk_unkey_##S(best);                                         \
    }

DEF_ROW_MAX(float, f32, int32_t)
DEF_ROW_MAX(double, f64, int64_t)

/* Max (and first index when id != NULL) over the R rows of the columns
 * [k0, k0 + w) of one [R, K] slab into m, id; on integer keys. */
#define DEF_STRIP_MAX(T, S, KT)                                             \
    static ZSK_ISA_VOID(strip_max_##S, (const T *x, int64_t R, int64_t K,   \
        int64_t k0, int64_t w, T *m, int64_t *id), (x, R, K, k0, w, m, id)) \
    {                                                                       \
        KT km[STRIP];                                                       \
        for (int64_t j = 0; j < w; j++)                                     \
            km[j] = zsk_key_##S(x[k0 + j]);                                 \
        if (id)                                                             \
            for (int64_t j = 0; j < w; j++)                                 \
                id[j] = 0;                                                  \
        for (int64_t r = 1; r < R; r++) {                                   \
            const T *row = x + r * K + k0;                                  \
            if (id) {                                                       \
                for (int64_t j = 0; j < w; j++) {                           \
                    KT k = zsk_key_##S(row[j]);                             \
                    id[j] = k > km[j] ? r : id[j];                          \
                    km[j] = k > km[j] ? k : km[j];                          \
                }                                                           \
            } else {                                                        \
                for (int64_t j = 0; j < w; j++) {                           \
                    KT k = zsk_key_##S(row[j]);                             \
                    km[j] = k > km[j] ? k : km[j];                          \
                }                                                           \
            }                                                               \
        }                                                                   \
        for (int64_t j = 0; j < w; j++)                                     \
            m[j] = zsk_unkey_##S(km[j]);                                    \
    }

DEF_STRIP_MAX(float, f32, int32_t)
DEF_STRIP_MAX(double, f64, int64_t)

typedef struct max_ctx {
    zs_dtype dt;
    const char *x; /* bytes */
    char *out;     /* may be NULL */
    int64_t *idx;  /* may be NULL */
    int64_t O, R, K;
    /* parts of one row (K == 1, few rows) */
    int64_t nparts;
    double pval[MAX_PARTS];
    int64_t pidx[MAX_PARTS];
} max_ctx;

static void store(zs_dtype dt, void *out, int64_t i, double v)
{
    if (dt == ZS_F64)
        ((double *)out)[i] = v;
    else
        ((float *)out)[i] = (float)v;
}

/* Max of n elements from x (bytes) in the dtype, returned widened. */
static double row_max(zs_dtype dt, const void *x, int64_t n, int64_t *at)
{
    return dt == ZS_F64 ? row_max_f64(x, n, at)
                        : (double)row_max_f32(x, n, at);
}

static void max_rows_body(void *p, int64_t b, int64_t e)
{
    max_ctx *c = p;
    size_t es = esize(c->dt);
    for (int64_t o = b; o < e; o++) {
        int64_t at;
        double m = row_max(c->dt, c->x + (size_t)(o * c->R) * es, c->R,
                           c->idx ? &at : NULL);
        if (c->out)
            store(c->dt, c->out, o, m);
        if (c->idx)
            c->idx[o] = at;
    }
}

static void max_parts_body(void *p, int64_t b, int64_t e)
{
    max_ctx *c = p;
    size_t es = esize(c->dt);
    for (int64_t k = b; k < e; k++) {
        int64_t r0 = c->R * k / c->nparts, r1 = c->R * (k + 1) / c->nparts;
        c->pval[k] = row_max(c->dt, c->x + (size_t)r0 * es, r1 - r0,
                             &c->pidx[k]);
        c->pidx[k] += r0;
    }
}

static void max_strips_body(void *p, int64_t b, int64_t e)
{
    max_ctx *c = p;
    int64_t nstrips = (c->K + STRIP - 1) / STRIP;
    size_t es = esize(c->dt);
    double md[STRIP];
    float mf[STRIP];
    int64_t id[STRIP];
    int64_t *idp = c->idx ? id : NULL;
    for (int64_t t = b; t < e; t++) {
        int64_t o = t / nstrips, k0 = (t % nstrips) * STRIP;
        int64_t w = c->K - k0 < STRIP ? c->K - k0 : STRIP;
        const char *slab = c->x + (size_t)(o * c->R * c->K) * es;
        if (c->dt == ZS_F64)
            strip_max_f64((const double *)slab, c->R, c->K, k0, w, md, idp);
        else
            strip_max_f32((const float *)slab, c->R, c->K, k0, w, mf, idp);
        for (int64_t j = 0; j < w; j++) {
            if (c->out)
                store(c->dt, c->out, o * c->K + k0 + j,
                      c->dt == ZS_F64 ? md[j] : (double)mf[j]);
            if (c->idx)
                c->idx[o * c->K + k0 + j] = id[j];
        }
    }
}

/* One row at a time, R split into parts across the pool. */
static void max_by_parts(max_ctx *c, int nt)
{
    const char *x = c->x;
    size_t es = esize(c->dt);
    c->nparts = nt > MAX_PARTS ? MAX_PARTS : nt;
    for (int64_t o = 0; o < c->O; o++) {
        c->x = x + (size_t)(o * c->R) * es;
        zs_parallel_for(c->nparts, 1, max_parts_body, c);
        int best = 0;
        for (int k = 1; k < c->nparts; k++)
            if (zsk_key_f64(c->pval[k]) > zsk_key_f64(c->pval[best]))
                best = k;
        if (c->out)
            store(c->dt, c->out, o, c->pval[best]);
        if (c->idx)
            c->idx[o] = c->pidx[best];
    }
    c->x = x;
}

void zsk_reduce_max(zs_dtype dt, const void *x, int64_t O, int64_t R,
                    int64_t K, void *out, int64_t *idx)
{
    max_ctx c = {.dt = dt, .x = x, .out = out, .idx = idx, .O = O, .R = R,
                 .K = K};
    if (R <= 0 || O * K == 0)
        return;
    if (K == 1) {
        int nt = zs_num_threads();
        if (O >= nt || O * R < 2 * ZSK_GRAIN)
            zs_parallel_for(O, 1 + ZSK_GRAIN / R, max_rows_body, &c);
        else
            max_by_parts(&c, nt);
        return;
    }
    int64_t nstrips = (K + STRIP - 1) / STRIP;
    int64_t per = R * (K < STRIP ? K : STRIP);
    zs_parallel_for(O * nstrips, 1 + ZSK_GRAIN / per, max_strips_body, &c);
}

/* ---- max backward ------------------------------------------------------ */

/* One [R, K] slab, columns [k0, k0 + w): counts the ties of y per column,
 * then writes g / count at the ties and 0 elsewhere. */
#define DEF_MAX_BW(T, S)                                                    \
    static void max_bw_##S(const T *x, const T *y, const T *g, int64_t R,   \
                           int64_t K, int64_t k0, int64_t w, T *gx)         \
    {                                                                       \
        int64_t cnt[STRIP] = {0};                                           \
        for (int64_t r = 0; r < R; r++)                                     \
            for (int64_t j = 0; j < w; j++)                                 \
                cnt[j] += SAME(x[r * K + k0 + j], y[k0 + j]);               \
        T share[STRIP];                                                     \
        for (int64_t j = 0; j < w; j++)                                     \
            share[j] = cnt[j] ? g[k0 + j] / (T)cnt[j] : 0;                  \
        for (int64_t r = 0; r < R; r++)                                     \
            for (int64_t j = 0; j < w; j++)                                 \
                gx[r * K + k0 + j] =                                        \
                    SAME(x[r * K + k0 + j], y[k0 + j]) ? share[j] : 0;      \
    }

DEF_MAX_BW(float, f32)
DEF_MAX_BW(double, f64)

typedef struct max_bw_ctx {
    zs_dtype dt;
    const char *x, *y, *g;
    char *gx;
    int64_t R, K, nstrips;
} max_bw_ctx;

static void max_bw_body(void *p, int64_t b, int64_t e)
{
    max_bw_ctx *c = p;
    size_t es = esize(c->dt);
    for (int64_t t = b; t < e; t++) {
        int64_t o = t / c->nstrips, k0 = (t % c->nstrips) * STRIP;
        int64_t w = c->K - k0 < STRIP ? c->K - k0 : STRIP;
        size_t xo = (size_t)(o * c->R * c->K) * es;
        size_t yo = (size_t)(o * c->K) * es;
        if (c->dt == ZS_F64)
            max_bw_f64((const double *)(c->x + xo), (const double *)(c->y + yo),
                       (const double *)(c->g + yo), c->R, c->K, k0, w,
                       (double *)(c->gx + xo));
        else
            max_bw_f32((const float *)(c->x + xo), (const float *)(c->y + yo),
                       (const float *)(c->g + yo), c->R, c->K, k0, w,
                       (float *)(c->gx + xo));
    }
}

void zsk_reduce_max_backward(zs_dtype dt, const void *x, const void *y,
                             const void *g, int64_t O, int64_t R, int64_t K,
                             void *gx)
{
    max_bw_ctx c = {dt, x, y, g, gx, R, K, (K + STRIP - 1) / STRIP};
    if (O * R * K == 0)
        return;
    int64_t per = R * (K < STRIP ? K : STRIP);
    zs_parallel_for(O * c.nstrips, 1 + ZSK_GRAIN / per, max_bw_body, &c);
}

/* ---- variance ----------------------------------------------------------
 * Blocked two-pass: a block (VAR_BLOCK elements of a row, or VAR_ROWS
 * rows of a strip) stays in cache, so its mean and sum of squared
 * deviations come from two passes over cached data; blocks (and parts of
 * a row split across threads) are merged in order with the pairwise
 * update of Chan, Golub and LeVeque, so memory is read once. */

#define VAR_BLOCK 4096
#define VAR_ROWS 32

/* Count, mean and sum of squared deviations (m2) of a set of values. */
typedef struct moments {
    double n, mean, m2;
} moments;

static void merge(moments *a, const moments *b)
{
    if (b->n == 0)
        return;
    double n = a->n + b->n, d = b->mean - a->mean;
    a->mean += d * b->n / n;
    a->m2 += b->m2 + d * d * a->n * b->n / n;
    a->n = n;
}

/* sum of (x - mean)^2 over x[0, n), in double lanes. */
#define DEF_ROW_M2(T, S)                                                    \
    static ZSK_ISA_FN(double, row_m2_##S, (const T *x, int64_t n,           \
        double mean), (x, n, mean))                                         \
    {                                                                       \
        double lane[8] = {0};                                               \
        int64_t i = 0;                                                      \
        for (; i + 8 <= n; i += 8)                                          \
            for (int l = 0; l < 8; l++) {                                   \
                double d = (double)x[i + l] - mean;                         \
                lane[l] += d * d;                                           \
            }                                                               \
        double s = 0;                                                       \
        for (int l = 0; l < 8; l++)                                         \
            s += lane[l];                                                   \
        for (; i < n; i++) {                                                \
            double d = (double)x[i] - mean;                                 \
            s += d * d;                                                     \
        }                                                                   \
        return s;                                                           \
    }

DEF_ROW_M2(float, f32)
DEF_ROW_M2(double, f64)

/* Moments of x[0, n) (x in bytes, dtype dt), block by block. */
static moments row_moments(zs_dtype dt, const char *x, int64_t n)
{
    moments acc = {0, 0, 0};
    size_t es = esize(dt);
    for (int64_t i = 0; i < n; i += VAR_BLOCK) {
        int64_t nb = n - i < VAR_BLOCK ? n - i : VAR_BLOCK;
        const char *b = x + (size_t)i * es;
        moments m = {(double)nb, 0, 0};
        if (dt == ZS_F64) {
            m.mean = zsk_sum_f64((const double *)b, nb) / (double)nb;
            m.m2 = row_m2_f64((const double *)b, nb, m.mean);
        } else {
            m.mean = zsk_sum_f32((const float *)b, nb) / (double)nb;
            m.m2 = row_m2_f32((const float *)b, nb, m.mean);
        }
        merge(&acc, &m);
    }
    return acc;
}

/* Column means and m2 of nb rows of a strip of w columns (x at the
 * strip's first element, rows K apart), merged into mean[], m2[] that
 * already hold na rows. */
#define DEF_STRIP_VAR(T, S)                                                 \
    static ZSK_ISA_VOID(strip_var_##S, (const T *x, int64_t nb, int64_t K,  \
        int64_t w, double na, double *mean, double *m2),                    \
        (x, nb, K, w, na, mean, m2))                                        \
    {                                                                       \
        double bm[STRIP], bm2[STRIP];                                       \
        for (int64_t j = 0; j < w; j++)                                     \
            bm[j] = bm2[j] = 0;                                             \
        for (int64_t r = 0; r < nb; r++)                                    \
            for (int64_t j = 0; j < w; j++)                                 \
                bm[j] += x[r * K + j];                                      \
        for (int64_t j = 0; j < w; j++)                                     \
            bm[j] /= (double)nb;                                            \
        for (int64_t r = 0; r < nb; r++)                                    \
            for (int64_t j = 0; j < w; j++) {                               \
                double d = (double)x[r * K + j] - bm[j];                    \
                bm2[j] += d * d;                                            \
            }                                                               \
        double n = na + (double)nb, f = (double)nb / n;                     \
        double g = na * (double)nb / n;                                     \
        for (int64_t j = 0; j < w; j++) {                                   \
            double d = bm[j] - mean[j];                                     \
            mean[j] += d * f;                                               \
            m2[j] += bm2[j] + d * d * g;                                    \
        }                                                                   \
    }

DEF_STRIP_VAR(float, f32)
DEF_STRIP_VAR(double, f64)

typedef struct var_ctx {
    zs_dtype dt;
    const char *x;
    char *out, *mean;
    int64_t O, R, K, nstrips;
    double div;
    /* parts of one row */
    int64_t nparts;
    moments part[MAX_PARTS];
} var_ctx;

static void var_store(var_ctx *c, int64_t i, double mean, double m2)
{
    store(c->dt, c->out, i, m2 / c->div);
    if (c->mean)
        store(c->dt, c->mean, i, mean);
}

static void var_rows_body(void *p, int64_t b, int64_t e)
{
    var_ctx *c = p;
    size_t es = esize(c->dt);
    for (int64_t o = b; o < e; o++) {
        moments m = row_moments(c->dt, c->x + (size_t)(o * c->R) * es, c->R);
        var_store(c, o, m.mean, m.m2);
    }
}

static void var_strips_body(void *p, int64_t b, int64_t e)
{
    var_ctx *c = p;
    size_t es = esize(c->dt);
    double mean[STRIP], m2[STRIP];
    for (int64_t t = b; t < e; t++) {
        int64_t o = t / c->nstrips, k0 = (t % c->nstrips) * STRIP;
        int64_t w = c->K - k0 < STRIP ? c->K - k0 : STRIP;
        for (int64_t j = 0; j < w; j++)
            mean[j] = m2[j] = 0;
        for (int64_t r = 0; r < c->R; r += VAR_ROWS) {
            int64_t nb = c->R - r < VAR_ROWS ? c->R - r : VAR_ROWS;
            const char *blk = c->x + (size_t)((o * c->R + r) * c->K + k0) * es;
            if (c->dt == ZS_F64)
                strip_var_f64((const double *)blk, nb, c->K, w, (double)r,
                              mean, m2);
            else
                strip_var_f32((const float *)blk, nb, c->K, w, (double)r,
                              mean, m2);
        }
        for (int64_t j = 0; j < w; j++)
            var_store(c, o * c->K + k0 + j, mean[j], m2[j]);
    }
}

static void var_parts_body(void *p, int64_t b, int64_t e)
{
    var_ctx *c = p;
    size_t es = esize(c->dt);
    for (int64_t k = b; k < e; k++) {
        int64_t r0 = c->R * k / c->nparts, r1 = c->R * (k + 1) / c->nparts;
        c->part[k] = row_moments(c->dt, c->x + (size_t)r0 * es, r1 - r0);
    }
}

/* Few long rows: each row is split into parts across the pool. */
static void var_by_parts(var_ctx *c, int nt)
{
    const char *x = c->x;
    size_t es = esize(c->dt);
    c->nparts = nt > MAX_PARTS ? MAX_PARTS : nt;
    for (int64_t o = 0; o < c->O; o++) {
        c->x = x + (size_t)(o * c->R) * es;
        zs_parallel_for(c->nparts, 1, var_parts_body, c);
        moments m = {0, 0, 0};
        for (int64_t k = 0; k < c->nparts; k++)
            merge(&m, &c->part[k]);
        var_store(c, o, m.mean, m.m2);
    }
    c->x = x;
}

void zsk_reduce_var(zs_dtype dt, const void *x, int64_t O, int64_t R,
                    int64_t K, int64_t correction, void *out, void *mean)
{
    double div = (double)R - (double)correction;
    var_ctx c = {.dt = dt, .x = x, .out = out, .mean = mean, .O = O, .R = R,
                 .K = K, .nstrips = (K + STRIP - 1) / STRIP,
                 .div = div > 0 ? div : 0};
    if (O * K == 0)
        return;
    if (R == 0) {
        for (int64_t i = 0; i < O * K; i++)
            var_store(&c, i, NAN, NAN);
        return;
    }
    if (K == 1) {
        int nt = zs_num_threads();
        if (O >= nt || O * R < 2 * ZSK_GRAIN)
            zs_parallel_for(O, 1 + ZSK_GRAIN / R, var_rows_body, &c);
        else
            var_by_parts(&c, nt);
        return;
    }
    int64_t per = R * (K < STRIP ? K : STRIP);
    zs_parallel_for(O * c.nstrips, 1 + ZSK_GRAIN / per, var_strips_body, &c);
}

/* ---- squared-difference sum -------------------------------------------- */

#define SQ_BLOCK 65536

static ZSK_ISA_FN(double, sq_diff_f32, (const float *a, const float *b,
    int64_t n), (a, b, n))
{
    double total = 0;
    int64_t i = 0;
    for (; i + 256 <= n; i += 256) {
        float lane[16] = {0};
        for (int64_t j = 0; j < 256; j += 16)
            for (int l = 0; l < 16; l++) {
                float d = a[i + j + l] - b[i + j + l];
                lane[l] += d * d;
            }
        float s = 0;
        for (int l = 0; l < 16; l++)
            s += lane[l];
        total += s;
    }
    for (; i < n; i++) {
        double d = (double)a[i] - (double)b[i];
        total += d * d;
    }
    return total;
}

static ZSK_ISA_FN(double, sq_diff_f64, (const double *a, const double *b,
    int64_t n), (a, b, n))
{
    double lane[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) {
            double d = a[i + l] - b[i + l];
            lane[l] += d * d;
        }
    double s = 0;
    for (int l = 0; l < 8; l++)
        s += lane[l];
    for (; i < n; i++)
        s += (a[i] - b[i]) * (a[i] - b[i]);
    return s;
}

typedef struct sq_ctx {
    zs_dtype dt;
    const char *a, *b;
    int64_t n;
    double *part;
} sq_ctx;

/* bf16 / f16: n values widened 256 at a time, summed as f32 (in double) */
static double sq_diff_lp(zs_dtype dt, const uint16_t *a, const uint16_t *b,
                         int64_t n)
{
    float fa[256], fb[256];
    double s = 0;
    for (int64_t i = 0; i < n; i += 256) {
        int64_t m = n - i < 256 ? n - i : 256;
        zsk_widen16(dt, a + i, fa, m);
        zsk_widen16(dt, b + i, fb, m);
        s += sq_diff_f32(fa, fb, m);
    }
    return s;
}

static double sq_block(const sq_ctx *c, int64_t k)
{
    int64_t i0 = k * SQ_BLOCK;
    int64_t len = c->n - i0 < SQ_BLOCK ? c->n - i0 : SQ_BLOCK;
    if (zsk_is_lowp16(c->dt))
        return sq_diff_lp(c->dt, (const uint16_t *)c->a + i0,
                          (const uint16_t *)c->b + i0, len);
    size_t off = (size_t)i0 * esize(c->dt);
    return c->dt == ZS_F64
               ? sq_diff_f64((const double *)(c->a + off),
                             (const double *)(c->b + off), len)
               : sq_diff_f32((const float *)(c->a + off),
                             (const float *)(c->b + off), len);
}

static void sq_body(void *p, int64_t b, int64_t e)
{
    sq_ctx *c = p;
    for (int64_t k = b; k < e; k++)
        c->part[k] = sq_block(c, k);
}

double zsk_sq_diff_sum(zs_dtype dt, const void *a, const void *b, int64_t n)
{
    sq_ctx c = {dt, a, b, n, NULL};
    int64_t nb = (n + SQ_BLOCK - 1) / SQ_BLOCK;
    double s = 0;
    if (nb > 1)
        c.part = malloc((size_t)nb * sizeof *c.part);
    if (!c.part) { /* one block, or no scratch: the same order, serially */
        for (int64_t k = 0; k < nb; k++)
            s += sq_block(&c, k);
        return s;
    }
    zs_parallel_for(nb, 1, sq_body, &c);
    for (int64_t k = 0; k < nb; k++)
        s += c.part[k];
    free(c.part);
    return s;
}
