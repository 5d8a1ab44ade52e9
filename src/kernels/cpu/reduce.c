/*
 * reduce.c - sum over the middle axis of a contiguous [O, R, K] array.
 *
 * K == 1 (reduce the innermost run): each row is summed in blocks of 256
 * with 16 independent float lanes (vectorisable, no -ffast-math needed)
 * and block totals are added in double; when there are fewer rows than
 * threads, R itself is split and the partial sums combined in order.
 * K > 1 (reduce a leading axis, e.g. a bias gradient [B*T, C] -> [C]):
 * rows are streamed and added into a double accumulator strip of K, split
 * across threads by (o, k-strip); when that gives too few tasks (O == 1,
 * K of a few strips), the rows are split instead, each thread keeping a
 * full-width private accumulator (bench/bandwidth: 36% -> see note).
 */
#include <stdlib.h>

#include "kernels/cpu/kernels.h"
#include "kernels/cpu/lowp.h"

ZSK_ISA_FN(double, zsk_sum_f32, (const float *x, int64_t n), (x, n))
{
    double total = 0;
    int64_t i = 0;
    for (; i + 256 <= n; i += 256) {
        float lane[16] = {0};
        for (int64_t j = 0; j < 256; j += 16)
            for (int l = 0; l < 16; l++)
                lane[l] += x[i + j + l];
        float s = 0;
        for (int l = 0; l < 16; l++)
            s += lane[l];
        total += s;
    }
    for (; i < n; i++)
        total += x[i];
    return total;
}

ZSK_ISA_FN(double, zsk_sum_f64, (const double *x, int64_t n), (x, n))
{
    double lane[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++)
            lane[l] += x[i + l];
    double s = 0;
    for (int l = 0; l < 8; l++)
        s += lane[l];
    for (; i < n; i++)
        s += x[i];
    return s;
}

static double row_sum(zs_dtype dt, const void *x, int64_t off, int64_t n)
{
    return dt == ZS_F64 ? zsk_sum_f64((const double *)x + off, n)
                        : zsk_sum_f32((const float *)x + off, n);
}

static void store(zs_dtype dt, void *out, int64_t i, double v)
{
    if (dt == ZS_F64)
        ((double *)out)[i] = v;
    else
        ((float *)out)[i] = (float)v;
}

typedef struct red_ctx {
    zs_dtype dt;
    const void *x;
    void *out;
    int64_t O, R, K, strip;
    double *partial;
    int64_t nparts;
} red_ctx;

static void rows_body(void *p, int64_t b, int64_t e)
{
    red_ctx *c = p;
    for (int64_t o = b; o < e; o++)
        store(c->dt, c->out, o, row_sum(c->dt, c->x, o * c->R, c->R));
}

static void parts_body(void *p, int64_t b, int64_t e)
{
    red_ctx *c = p;
    for (int64_t k = b; k < e; k++) {
        int64_t r0 = c->R * k / c->nparts, r1 = c->R * (k + 1) / c->nparts;
        c->partial[k] = row_sum(c->dt, c->x, r0, r1 - r0);
    }
}

static ZSK_ISA_VOID(strip_f32, (const float *x, int64_t R, int64_t K,
    int64_t k0, int64_t n, double *acc), (x, R, K, k0, n, acc))
{
    for (int64_t j = 0; j < n; j++)
        acc[j] = 0;
    for (int64_t r = 0; r < R; r++) {
        const float *row = x + r * K + k0;
        for (int64_t j = 0; j < n; j++)
            acc[j] += row[j];
    }
}

static ZSK_ISA_VOID(strip_f64, (const double *x, int64_t R, int64_t K,
    int64_t k0, int64_t n, double *acc), (x, R, K, k0, n, acc))
{
    for (int64_t j = 0; j < n; j++)
        acc[j] = 0;
    for (int64_t r = 0; r < R; r++) {
        const double *row = x + r * K + k0;
        for (int64_t j = 0; j < n; j++)
            acc[j] += row[j];
    }
}

static void strips_body(void *p, int64_t b, int64_t e)
{
    red_ctx *c = p;
    int64_t nstrips = (c->K + c->strip - 1) / c->strip;
    double acc[512];
    for (int64_t t = b; t < e; t++) {
        int64_t o = t / nstrips, k0 = (t % nstrips) * c->strip;
        int64_t n = c->K - k0 < c->strip ? c->K - k0 : c->strip;
        size_t es = c->dt == ZS_F64 ? 8 : 4;
        const char *base = (const char *)c->x + (size_t)(o * c->R * c->K) * es;
        if (c->dt == ZS_F64)
            strip_f64((const double *)base, c->R, c->K, k0, n, acc);
        else
            strip_f32((const float *)base, c->R, c->K, k0, n, acc);
        for (int64_t j = 0; j < n; j++)
            store(c->dt, c->out, o * c->K + k0 + j, acc[j]);
    }
}

/* Few (o, strip) tasks but many rows (a bias gradient [B*T, C] -> [C]):
 * each thread streams a contiguous block of rows into a private double
 * accumulator of K; the partial sums are then added in thread order. */
typedef struct rowsplit_ctx {
    zs_dtype dt;
    const void *x;
    int64_t R, K, nparts;
    double *acc; /* [nparts, K] */
} rowsplit_ctx;

static void rowsplit_body(void *p, int64_t b, int64_t e)
{
    rowsplit_ctx *c = p;
    for (int64_t t = b; t < e; t++) {
        int64_t r0 = c->R * t / c->nparts, r1 = c->R * (t + 1) / c->nparts;
        double *acc = c->acc + t * c->K;
        if (c->dt == ZS_F64)
            strip_f64((const double *)c->x + r0 * c->K, r1 - r0, c->K, 0, c->K, acc);
        else
            strip_f32((const float *)c->x + r0 * c->K, r1 - r0, c->K, 0, c->K, acc);
    }
}

static bool reduce_rows_split(zs_dtype dt, const void *x, int64_t R, int64_t K,
                              void *out)
{
    int nt = zs_num_threads();
    rowsplit_ctx c = {dt, x, R, K, nt, malloc((size_t)(nt * K) * sizeof(double))};
    if (!c.acc)
        return false;
    zs_parallel_for(nt, 1, rowsplit_body, &c);
    for (int64_t k = 0; k < K; k++) {
        double s = 0;
        for (int t = 0; t < nt; t++)
            s += c.acc[t * K + k];
        store(dt, out, k, s);
    }
    free(c.acc);
    return true;
}

void zsk_reduce_sum(zs_dtype dt, const void *x, int64_t O, int64_t R,
                    int64_t K, void *out)
{
    red_ctx c = {dt, x, out, O, R, K, 512, NULL, 0};
    if (O == 0 || K == 0) /* no outputs (the grain below divides by K) */
        return;
    if (R == 0) {
        for (int64_t i = 0; i < O * K; i++)
            store(dt, out, i, 0);
        return;
    }
    if (K == 1) {
        int nt = zs_num_threads();
        if (O >= nt || O * R < 2 * ZSK_GRAIN) {
            zs_parallel_for(O, 1 + ZSK_GRAIN / R, rows_body, &c);
            return;
        }
        double partial[64];
        c.partial = partial;
        c.nparts = nt > 64 ? 64 : nt;
        for (int64_t o = 0; o < O; o++) {
            c.x = (const char *)x + (size_t)(o * R) * (dt == ZS_F64 ? 8 : 4);
            zs_parallel_for(c.nparts, 1, parts_body, &c);
            double s = 0;
            for (int64_t k = 0; k < c.nparts; k++)
                s += partial[k];
            store(dt, out, o, s);
        }
        return;
    }
    int64_t nstrips = (K + c.strip - 1) / c.strip;
    int64_t per = R * (K < c.strip ? K : c.strip);
    int nt = zs_num_threads();
    if (O == 1 && nt > 1 && nstrips < 4 * nt && R >= 4 * nt && R * K >= 2 * ZSK_GRAIN &&
        reduce_rows_split(dt, x, R, K, out))
        return;
    zs_parallel_for(O * nstrips, 1 + ZSK_GRAIN / per, strips_body, &c);
}

/* ---- bf16 / f16 ----------------------------------------------------------
 * Tasks of (o, block of up to LP_W columns k): 16-bit values are widened
 * in blocks of LP_W into a stack buffer and summed in f32 lanes
 * (zsk_sum_f32) with double totals (K == 1), or added into double column
 * sums (K > 1); one rounding of sum * scale at the end. */

#define LP_W 256

typedef struct lp_ctx {
    zs_dtype dt;
    const uint16_t *x;
    uint16_t *out;
    int64_t R, K, nkb;
    double scale;
} lp_ctx;

static void lp_body(void *p, int64_t b, int64_t e)
{
    const lp_ctx *c = p;
    float buf[LP_W];
    double acc[LP_W];
    for (int64_t t = b; t < e; t++) {
        int64_t o = t / c->nkb, k0 = (t % c->nkb) * LP_W;
        int64_t w = c->K - k0 < LP_W ? c->K - k0 : LP_W;
        const uint16_t *x = c->x + o * c->R * c->K + k0;
        if (c->K == 1) {
            double s = 0;
            for (int64_t r = 0; r < c->R; r += LP_W) {
                int64_t m = c->R - r < LP_W ? c->R - r : LP_W;
                zsk_widen16(c->dt, x + r, buf, m);
                s += zsk_sum_f32(buf, m);
            }
            c->out[o] = zsk_st16(c->dt, (float)(s * c->scale));
            continue;
        }
        for (int64_t j = 0; j < w; j++)
            acc[j] = 0;
        for (int64_t r = 0; r < c->R; r++) {
            zsk_widen16(c->dt, x + r * c->K, buf, w);
            for (int64_t j = 0; j < w; j++)
                acc[j] += buf[j];
        }
        for (int64_t j = 0; j < w; j++)
            c->out[o * c->K + k0 + j] = zsk_st16(c->dt, (float)(acc[j] * c->scale));
    }
}

void zsk_reduce_sum_lp(zs_dtype dt, const void *x, int64_t O, int64_t R,
                       int64_t K, double scale, void *out)
{
    lp_ctx c = {dt, x, out, R, K, (K + LP_W - 1) / LP_W, scale};
    if (O == 0 || K == 0)
        return;
    int64_t per = R * (K < LP_W ? K : LP_W) + 1;
    zs_parallel_for(O * c.nkb, 1 + ZSK_GRAIN / per, lp_body, &c);
}
