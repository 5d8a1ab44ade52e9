/*
 * softmax.c - fused softmax / log-softmax (forward and backward) and cross
 * entropy kernels (contracts in softmax.h).
 *
 * One pass structure per row of R (K == 1): max (lanes), then
 * exp(x - max) stored and summed (float lanes over blocks of 256, block
 * totals in double), then a scale by 1/sum; log-softmax writes
 * (x - max) - log(sum) instead. A row of up to ~64K floats stays in L2
 * between passes, so DRAM sees one read and one write per element.
 * K > 1 (softmax over a dim that is not last) works on strips of STRIP
 * columns of one [R, K] slab with per-column accumulators, so every loop
 * is still unit-stride.
 *
 * exp for f32 is the branch-free Cephes-style approximation of vmath.h
 * (zsi_exp_f32, measured max relative error 1.4 ulp on [-87, 88]), applied
 * 16 lanes at a time with GCC vector extensions in the row loops
 * (zsi_exp_v16f); f64 uses libm exp. Measured (AMD EPYC, AVX-512, 2 threads): softmax over the
 * rows of [4096, 1024] f32 at ~30 GB/s (one read + one write).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/kernels.h"
#include "kernels/cpu/lowp.h"
#include "kernels/cpu/reduce_ext.h"
#include "kernels/cpu/softmax.h"
#include "kernels/cpu/vmath.h"

#define STRIP 1024
#define BLOCK 256

/* exp of f32: zsi_exp_f32 (vmath.h); x < -87 gives 0, x > 88 inf, NaN
 * stays NaN. */
static inline float exp_f32(float x) { return zsi_exp_f32(x); }

/* ---- f32 exp over arrays, 16 lanes -----------------------------------------
 * GCC vector extensions (one zmm on AVX-512, two ymm on AVX2, four xmm on
 * the baseline variant) keep the accumulators in registers; plain lane
 * arrays got spilled to the stack, which made the loop latency-bound. */

typedef zsi_v16f v16f;

#define VINLINE static inline __attribute__((always_inline))

/* Vectors go by pointer: 64-byte vectors passed or returned by value
 * draw ABI notes from GCC on the baseline variant. */
VINLINE void load16(v16f *v, const float *p) { memcpy(v, p, sizeof *v); }

VINLINE void store16(float *p, const v16f *v) { memcpy(p, v, sizeof *v); }

VINLINE float hsum16(const v16f *v)
{
    float s = 0;
    for (int l = 0; l < 16; l++)
        s += (*v)[l];
    return s;
}

/* *v = exp_f32 of each lane (same operations, same results). */
VINLINE void exp16(v16f *v) { zsi_exp_v16f(v); }

/* sum of exp(x - sub) over x[0, n) in double (float lanes per block of
 * BLOCK, block totals in double); y (or NULL) receives the terms. */
static ZSK_ISA_FN(double, expsum_f32, (const float *x, int64_t n, float sub,
    float *y), (x, n, sub, y))
{
    double total = 0;
    int64_t i = 0;
    for (; i + BLOCK <= n; i += BLOCK) {
        v16f acc = {0};
        for (int64_t j = i; j < i + BLOCK; j += 16) {
            v16f e;
            load16(&e, x + j);
            e -= sub;
            exp16(&e);
            if (y)
                store16(y + j, &e);
            acc += e;
        }
        total += hsum16(&acc);
    }
    for (; i < n; i++) {
        float e = exp_f32(x[i] - sub);
        if (y)
            y[i] = e;
        total += e;
    }
    return total;
}

/* out = add + mul * exp(x - sub) over [0, n); add may be NULL (0). */
static ZSK_ISA_VOID(expmap_f32, (const float *x, float sub, float mul,
    const float *add, float *out, int64_t n), (x, sub, mul, add, out, n))
{
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        v16f e, a = {0};
        load16(&e, x + i);
        e -= sub;
        exp16(&e);
        e *= mul;
        if (add)
            load16(&a, add + i);
        e += a;
        store16(out + i, &e);
    }
    for (; i < n; i++)
        out[i] = (add ? add[i] : 0.0f) + mul * exp_f32(x[i] - sub);
}

static double expsum_f64(const double *x, int64_t n, double sub, double *y)
{
    double total = 0;
    for (int64_t i = 0; i < n; i++) {
        double e = exp(x[i] - sub);
        if (y)
            y[i] = e;
        total += e;
    }
    return total;
}

static void expmap_f64(const double *x, double sub, double mul,
                       const double *add, double *out, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        out[i] = (add ? add[i] : 0.0) + mul * exp(x[i] - sub);
}

/* ---- row primitives, per element type ------------------------------------
 * max_S(x, n): max of x[0, n) (n >= 1), NaN if any is NaN (integer keys,
 *   see reduce_ext.h).
 * dot_S(a, b, n): sum of a * b in double (b == NULL: sum of a). */
#define DEF_ROW_PRIMS(T, S, L, KT)                                          \
    static ZSK_ISA_FN(T, max_##S, (const T *x, int64_t n), (x, n))          \
    {                                                                       \
        KT m = zsk_key_##S(x[0]);                                           \
        for (int64_t i = 1; i < n; i++) {                                   \
            KT k = zsk_key_##S(x[i]);                                       \
            m = k > m ? k : m;                                              \
        }                                                                   \
        return zsk_unkey_##S(m);                                            \
    }                                                                       \
    static ZSK_ISA_FN(double, dot_##S, (const T *a, const T *b, int64_t n), \
        (a, b, n))                                                          \
    {                                                                       \
        double total = 0;                                                   \
        int64_t i = 0;                                                      \
        for (; i + BLOCK <= n; i += BLOCK) {                                \
            T lane[L] = {0};                                                \
            if (b)                                                          \
                for (int64_t j = 0; j < BLOCK; j += L)                      \
                    for (int l = 0; l < L; l++)                             \
                        lane[l] += a[i + j + l] * b[i + j + l];             \
            else                                                            \
                for (int64_t j = 0; j < BLOCK; j += L)                      \
                    for (int l = 0; l < L; l++)                             \
                        lane[l] += a[i + j + l];                            \
            T s = 0;                                                        \
            for (int l = 0; l < L; l++)                                     \
                s += lane[l];                                               \
            total += s;                                                     \
        }                                                                   \
        for (; i < n; i++)                                                  \
            total += b ? (double)a[i] * b[i] : a[i];                        \
        return total;                                                       \
    }

DEF_ROW_PRIMS(float, f32, 16, int32_t)
DEF_ROW_PRIMS(double, f64, 8, int64_t)

/* ---- softmax rows and strips ------------------------------------------- */

/* Row (K == 1) and strip (K > 1: columns [0, w) of an [R, K] slab, x and
 * y pointing at the strip's first column) forms of the forward and the
 * backward. */
#define DEF_SOFTMAX(T, S, KT, EXP)                                          \
    static ZSK_ISA_VOID(softmax_row_##S, (const T *x, int64_t n, bool lg,   \
        T *y), (x, n, lg, y))                                               \
    {                                                                       \
        T m = max_##S(x, n);                                                \
        if (lg) {                                                           \
            T ls = (T)log(expsum_##S(x, n, m, NULL));                       \
            for (int64_t i = 0; i < n; i++)                                 \
                y[i] = (x[i] - m) - ls;                                     \
            return;                                                         \
        }                                                                   \
        T inv = (T)(1.0 / expsum_##S(x, n, m, y));                          \
        for (int64_t i = 0; i < n; i++)                                     \
            y[i] *= inv;                                                    \
    }                                                                       \
    static ZSK_ISA_VOID(softmax_strip_##S, (const T *x, int64_t R,          \
        int64_t K, int64_t w, bool lg, T *y), (x, R, K, w, lg, y))          \
    {                                                                       \
        T m[STRIP], f[STRIP];                                               \
        KT km[STRIP];                                                       \
        double s[STRIP];                                                    \
        for (int64_t j = 0; j < w; j++) {                                   \
            km[j] = zsk_key_##S(x[j]);                                      \
            s[j] = 0;                                                       \
        }                                                                   \
        for (int64_t r = 1; r < R; r++)                                     \
            for (int64_t j = 0; j < w; j++) {                               \
                KT k = zsk_key_##S(x[r * K + j]);                           \
                km[j] = k > km[j] ? k : km[j];                              \
            }                                                               \
        for (int64_t j = 0; j < w; j++)                                     \
            m[j] = zsk_unkey_##S(km[j]);                                    \
        for (int64_t r = 0; r < R; r++)                                     \
            for (int64_t j = 0; j < w; j++) {                               \
                T e = EXP(x[r * K + j] - m[j]);                             \
                if (!lg)                                                    \
                    y[r * K + j] = e;                                       \
                s[j] += e;                                                  \
            }                                                               \
        for (int64_t j = 0; j < w; j++)                                     \
            f[j] = lg ? (T)log(s[j]) : (T)(1.0 / s[j]);                     \
        for (int64_t r = 0; r < R; r++)                                     \
            for (int64_t j = 0; j < w; j++)                                 \
                y[r * K + j] = lg ? (x[r * K + j] - m[j]) - f[j]            \
                                  : y[r * K + j] * f[j];                    \
    }                                                                       \
    static ZSK_ISA_VOID(softmax_bw_row_##S, (const T *y, const T *g,        \
        int64_t n, bool lg, T *gx), (y, g, n, lg, gx))                      \
    {                                                                       \
        T c = (T)dot_##S(g, lg ? NULL : y, n);                              \
        if (lg)                                                             \
            expmap_##S(y, 0, -c, g, gx, n);                                 \
        else                                                                \
            for (int64_t i = 0; i < n; i++)                                 \
                gx[i] = y[i] * (g[i] - c);                                  \
    }                                                                       \
    static ZSK_ISA_VOID(softmax_bw_strip_##S, (const T *y, const T *g,      \
        int64_t R, int64_t K, int64_t w, bool lg, T *gx),                   \
        (y, g, R, K, w, lg, gx))                                            \
    {                                                                       \
        double s[STRIP];                                                    \
        T c[STRIP];                                                         \
        for (int64_t j = 0; j < w; j++)                                     \
            s[j] = 0;                                                       \
        for (int64_t r = 0; r < R; r++)                                     \
            for (int64_t j = 0; j < w; j++)                                 \
                s[j] += lg ? g[r * K + j] : g[r * K + j] * y[r * K + j];    \
        for (int64_t j = 0; j < w; j++)                                     \
            c[j] = (T)s[j];                                                 \
        for (int64_t r = 0; r < R; r++)                                     \
            for (int64_t j = 0; j < w; j++) {                               \
                int64_t i = r * K + j;                                      \
                gx[i] = lg ? g[i] - EXP(y[i]) * c[j] : y[i] * (g[i] - c[j]);\
            }                                                               \
    }

DEF_SOFTMAX(float, f32, int32_t, exp_f32)
DEF_SOFTMAX(double, f64, int64_t, exp)

typedef struct sm_ctx {
    zs_dtype dt;
    const char *x, *g; /* x: forward input, or y for the backward */
    char *y;           /* forward output, or gx */
    int64_t R, K, nstrips;
    bool lg, backward;
    int failed;        /* bf16/f16: scratch allocation failed */
} sm_ctx;

/* bf16 / f16: the (row or strip) task t widened into f32 scratch w
 * ([R, width] for x, g and the result), run by the f32 forms above and
 * rounded once into y. */
static void sm_task_lp(sm_ctx *c, int64_t t, float *w)
{
    int64_t o = t / c->nstrips, k0 = (t % c->nstrips) * STRIP;
    int64_t wd = c->K - k0 < STRIP ? c->K - k0 : STRIP, R = c->R;
    const uint16_t *x = (const uint16_t *)c->x + o * R * c->K + k0;
    const uint16_t *g = c->g ? (const uint16_t *)c->g + o * R * c->K + k0 : NULL;
    uint16_t *y = (uint16_t *)c->y + o * R * c->K + k0;
    float *xf = w, *gf = xf + R * wd, *yf = gf + R * wd;
    for (int64_t r = 0; r < R; r++) {
        zsk_widen16(c->dt, x + r * c->K, xf + r * wd, wd);
        if (g)
            zsk_widen16(c->dt, g + r * c->K, gf + r * wd, wd);
    }
    if (c->K == 1 && !c->backward)
        softmax_row_f32(xf, R, c->lg, yf);
    else if (c->K == 1)
        softmax_bw_row_f32(xf, gf, R, c->lg, yf);
    else if (!c->backward)
        softmax_strip_f32(xf, R, wd, wd, c->lg, yf);
    else
        softmax_bw_strip_f32(xf, gf, R, wd, wd, c->lg, yf);
    for (int64_t r = 0; r < R; r++)
        zsk_narrow16(c->dt, yf + r * wd, y + r * c->K, wd);
}

static void sm_body(void *p, int64_t b, int64_t e)
{
    sm_ctx *c = p;
    if (zsk_is_lowp16(c->dt)) {
        int64_t wd = c->K < STRIP ? c->K : STRIP;
        float *w = malloc((size_t)(3 * c->R * wd) * sizeof(float));
        if (!w) {
            __atomic_store_n(&c->failed, 1, __ATOMIC_RELAXED);
            return;
        }
        for (int64_t t = b; t < e; t++)
            sm_task_lp(c, t, w);
        free(w);
        return;
    }
    size_t es = c->dt == ZS_F64 ? 8 : 4;
    bool d = c->dt == ZS_F64;
    for (int64_t t = b; t < e; t++) {
        int64_t o = t / c->nstrips, k0 = (t % c->nstrips) * STRIP;
        int64_t w = c->K - k0 < STRIP ? c->K - k0 : STRIP;
        size_t off = (size_t)(o * c->R * c->K + k0) * es;
        const void *x = c->x + off;
        const void *g = c->g ? c->g + off : NULL;
        void *y = c->y + off;
        if (c->K == 1 && !c->backward) {
            if (d)
                softmax_row_f64(x, c->R, c->lg, y);
            else
                softmax_row_f32(x, c->R, c->lg, y);
        } else if (c->K == 1) {
            if (d)
                softmax_bw_row_f64(x, g, c->R, c->lg, y);
            else
                softmax_bw_row_f32(x, g, c->R, c->lg, y);
        } else if (!c->backward) {
            if (d)
                softmax_strip_f64(x, c->R, c->K, w, c->lg, y);
            else
                softmax_strip_f32(x, c->R, c->K, w, c->lg, y);
        } else {
            if (d)
                softmax_bw_strip_f64(x, g, c->R, c->K, w, c->lg, y);
            else
                softmax_bw_strip_f32(x, g, c->R, c->K, w, c->lg, y);
        }
    }
}

static zs_status sm_run(sm_ctx *c, int64_t O)
{
    c->nstrips = (c->K + STRIP - 1) / STRIP;
    if (O * c->R * c->K == 0)
        return ZS_OK;
    int64_t per = c->R * (c->K < STRIP ? c->K : STRIP);
    zs_parallel_for(O * c->nstrips, 1 + ZSK_GRAIN / per, sm_body, c);
    if (c->failed)
        return zs_set_error_code(ZS_ERR_NOMEM, "softmax: out of memory for "
                                 "the f32 scratch of a %s row",
                                 zs_dtype_name(c->dt));
    return ZS_OK;
}

zs_status zsk_softmax(zs_dtype dt, const void *x, int64_t O, int64_t R,
                      int64_t K, bool log, void *y)
{
    sm_ctx c = {.dt = dt, .x = x, .y = y, .R = R, .K = K, .lg = log};
    return sm_run(&c, O);
}

zs_status zsk_softmax_backward(zs_dtype dt, const void *y, const void *g,
                               int64_t O, int64_t R, int64_t K, bool log,
                               void *gx)
{
    sm_ctx c = {.dt = dt, .x = y, .g = g, .y = gx, .R = R, .K = K, .lg = log,
                .backward = true};
    return sm_run(&c, O);
}

/* ---- cross entropy ------------------------------------------------------ */

static int64_t target_at(const zsk_targets *tg, int64_t i)
{
    return tg->t64 ? ((const int64_t *)tg->t)[i]
                   : (int64_t)((const int32_t *)tg->t)[i];
}

#define DEF_CE(T, S)                                                        \
    static void ce_row_##S(const T *x, int64_t C, int64_t t, double *lse,   \
                           double *loss)                                    \
    {                                                                       \
        T m = max_##S(x, C);                                                \
        *lse = (double)m + log(expsum_##S(x, C, m, NULL));                  \
        *loss = *lse - (double)x[t];                                        \
    }                                                                       \
    static ZSK_ISA_VOID(ce_bw_row_##S, (const T *x, int64_t C, int64_t t,   \
        double lse, double scale, T *gx), (x, C, t, lse, scale, gx))        \
    {                                                                       \
        T sc = (T)scale;                                                    \
        expmap_##S(x, (T)lse, sc, NULL, gx, C);                             \
        if (t >= 0 && t < C) /* else the class lies in another shard */    \
            gx[t] -= sc;                                                    \
    }

DEF_CE(float, f32)
DEF_CE(double, f64)

typedef struct ce_ctx {
    zs_dtype dt;
    const char *x;
    const zsk_targets *tg;
    int64_t C;
    double *lse, *loss;
    const double *lse_in;
    double scale;
    char *gx;
    int failed; /* bf16/f16: scratch allocation failed */
} ce_ctx;

/* bf16 / f16 rows [b, e): each row widened into f32 scratch w [2 C] and
 * run by the f32 row forms; the backward's row rounded once into gx. */
static void ce_body_lp(ce_ctx *c, int64_t b, int64_t e, bool bw)
{
    float *w = malloc((size_t)(2 * c->C) * sizeof(float));
    if (!w) {
        __atomic_store_n(&c->failed, 1, __ATOMIC_RELAXED);
        return;
    }
    for (int64_t i = b; i < e; i++) {
        int64_t t = target_at(c->tg, i);
        const uint16_t *x = (const uint16_t *)c->x + i * c->C;
        bool skip = t == c->tg->ignore;
        if (!skip)
            zsk_widen16(c->dt, x, w, c->C);
        if (!bw && skip)
            c->lse[i] = c->loss[i] = 0;
        else if (!bw)
            ce_row_f32(w, c->C, t, &c->lse[i], &c->loss[i]);
        if (!bw)
            continue;
        if (skip)
            memset(w + c->C, 0, (size_t)c->C * sizeof(float));
        else
            ce_bw_row_f32(w, c->C, t, c->lse_in[i], c->scale, w + c->C);
        zsk_narrow16(c->dt, w + c->C, (uint16_t *)c->gx + i * c->C, c->C);
    }
    free(w);
}

static void ce_body(void *p, int64_t b, int64_t e)
{
    ce_ctx *c = p;
    if (zsk_is_lowp16(c->dt)) {
        ce_body_lp(c, b, e, false);
        return;
    }
    size_t es = c->dt == ZS_F64 ? 8 : 4;
    for (int64_t i = b; i < e; i++) {
        int64_t t = target_at(c->tg, i);
        const void *x = c->x + (size_t)(i * c->C) * es;
        if (t == c->tg->ignore) {
            c->lse[i] = 0;
            c->loss[i] = 0;
        } else if (c->dt == ZS_F64) {
            ce_row_f64(x, c->C, t, &c->lse[i], &c->loss[i]);
        } else {
            ce_row_f32(x, c->C, t, &c->lse[i], &c->loss[i]);
        }
    }
}

static void ce_bw_body(void *p, int64_t b, int64_t e)
{
    ce_ctx *c = p;
    if (zsk_is_lowp16(c->dt)) {
        ce_body_lp(c, b, e, true);
        return;
    }
    size_t es = c->dt == ZS_F64 ? 8 : 4;
    for (int64_t i = b; i < e; i++) {
        int64_t t = target_at(c->tg, i);
        const void *x = c->x + (size_t)(i * c->C) * es;
        void *gx = c->gx + (size_t)(i * c->C) * es;
        if (t == c->tg->ignore) {
            for (int64_t j = 0; j < c->C; j++) {
                if (c->dt == ZS_F64)
                    ((double *)gx)[j] = 0;
                else
                    ((float *)gx)[j] = 0;
            }
        } else if (c->dt == ZS_F64) {
            ce_bw_row_f64(x, c->C, t, c->lse_in[i], c->scale, gx);
        } else {
            ce_bw_row_f32(x, c->C, t, c->lse_in[i], c->scale, gx);
        }
    }
}

static zs_status ce_status(const ce_ctx *c)
{
    if (c->failed)
        return zs_set_error_code(ZS_ERR_NOMEM, "cross_entropy: out of memory "
                                 "for the f32 scratch of a %s row",
                                 zs_dtype_name(c->dt));
    return ZS_OK;
}

zs_status zsk_cross_entropy(zs_dtype dt, const void *x, const zsk_targets *tg,
                            int64_t N, int64_t C, double *lse, double *loss)
{
    ce_ctx c = {.dt = dt, .x = x, .tg = tg, .C = C, .lse = lse, .loss = loss};
    zs_parallel_for(N, 1 + ZSK_GRAIN / (C > 0 ? C : 1), ce_body, &c);
    return ce_status(&c);
}

zs_status zsk_cross_entropy_backward(zs_dtype dt, const void *x,
                                     const zsk_targets *tg, int64_t N,
                                     int64_t C, const double *lse,
                                     double scale, void *gx)
{
    ce_ctx c = {.dt = dt, .x = x, .tg = tg, .C = C, .lse_in = lse,
                .scale = scale, .gx = gx};
    zs_parallel_for(N, 1 + ZSK_GRAIN / (C > 0 ? C : 1), ce_bw_body, &c);
    return ce_status(&c);
}
