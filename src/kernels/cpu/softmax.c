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
 * exp for f32 is a local branch-free Cephes-style approximation
 * (exp_f32, relative error ~2 ulp) that the compiler vectorises; f64 uses
 * libm exp.
 */
#include <math.h>
#include <stdint.h>

#include "kernels/cpu/kernels.h"
#include "kernels/cpu/reduce_ext.h"
#include "kernels/cpu/softmax.h"

#define STRIP 1024
#define BLOCK 256

/* exp(x) = 2^n e^r with n = round(x log2 e) (by the 1.5 * 2^23 trick) and
 * r = x - n ln 2 in two parts; degree-6 polynomial for e^r (Cephes expf).
 * x < -87 gives 0, x > 88 gives inf, NaN stays NaN. The range tests are
 * integer compares on the bits combined with masks: float compares would
 * keep the loops from vectorising under the default -ftrapping-math. */
static inline float exp_f32(float x)
{
    union { float f; uint32_t u; int32_t i; } xb = {x}, xc, t, s, y;
    uint32_t lo = -(uint32_t)(xb.u > 0xC2AE0000u); /* < -87, -inf, -NaN */
    uint32_t hi = -(uint32_t)(xb.i > 0x42B00000);  /* > 88, +inf, +NaN */
    uint32_t nan = -(uint32_t)((xb.u & 0x7FFFFFFFu) > 0x7F800000u);
    xc.u = (lo & 0xC2AE0000u) | (hi & 0x42B00000u) | (~(lo | hi) & xb.u);
    t.f = xc.f * 1.44269504088896341f + 12582912.0f;
    float n = t.f - 12582912.0f;
    float r = xc.f - n * 0.693359375f + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    s.u = (t.u - 0x4B400000u + 127u) << 23;
    y.f = p * s.f;
    y.u = (~(lo | hi | nan) & y.u) | (hi & 0x7F800000u) | (nan & xb.u);
    return y.f;
}

/* ---- row primitives, per element type ------------------------------------
 * max_S(x, n): max of x[0, n) (n >= 1), NaN if any is NaN (integer keys,
 *   see reduce_ext.h).
 * sumexp_S(x, n, m, y): sum of exp(x - m) in double; y (or NULL) receives
 *   the terms.
 * dot_S(a, b, n): sum of a * b in double (b == NULL: sum of a). */
#define DEF_ROW_PRIMS(T, S, L, KT, EXP)                                     \
    ZSK_CLONES static T max_##S(const T *x, int64_t n)                      \
    {                                                                       \
        KT m = zsk_key_##S(x[0]);                                           \
        for (int64_t i = 1; i < n; i++) {                                   \
            KT k = zsk_key_##S(x[i]);                                       \
            m = k > m ? k : m;                                              \
        }                                                                   \
        return zsk_unkey_##S(m);                                            \
    }                                                                       \
    ZSK_CLONES static double sumexp_store_##S(const T *x, int64_t n, T m,   \
                                              T *y)                         \
    {                                                                       \
        double total = 0;                                                   \
        int64_t i = 0;                                                      \
        for (; i + BLOCK <= n; i += BLOCK) {                                \
            T lane[L] = {0};                                                \
            for (int64_t j = 0; j < BLOCK; j += L)                          \
                for (int l = 0; l < L; l++) {                               \
                    T e = EXP(x[i + j + l] - m);                            \
                    y[i + j + l] = e;                                       \
                    lane[l] += e;                                           \
                }                                                           \
            T s = 0;                                                        \
            for (int l = 0; l < L; l++)                                     \
                s += lane[l];                                               \
            total += s;                                                     \
        }                                                                   \
        for (; i < n; i++) {                                                \
            y[i] = EXP(x[i] - m);                                           \
            total += y[i];                                                  \
        }                                                                   \
        return total;                                                       \
    }                                                                       \
    ZSK_CLONES static double sumexp_##S(const T *x, int64_t n, T m)         \
    {                                                                       \
        double total = 0;                                                   \
        int64_t i = 0;                                                      \
        for (; i + BLOCK <= n; i += BLOCK) {                                \
            T lane[L] = {0};                                                \
            for (int64_t j = 0; j < BLOCK; j += L)                          \
                for (int l = 0; l < L; l++)                                 \
                    lane[l] += EXP(x[i + j + l] - m);                       \
            T s = 0;                                                        \
            for (int l = 0; l < L; l++)                                     \
                s += lane[l];                                               \
            total += s;                                                     \
        }                                                                   \
        for (; i < n; i++)                                                  \
            total += EXP(x[i] - m);                                         \
        return total;                                                       \
    }                                                                       \
    ZSK_CLONES static double dot_##S(const T *a, const T *b, int64_t n)     \
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

DEF_ROW_PRIMS(float, f32, 16, int32_t, exp_f32)
DEF_ROW_PRIMS(double, f64, 8, int64_t, exp)

/* ---- softmax rows and strips ------------------------------------------- */

/* Row (K == 1) and strip (K > 1: columns [0, w) of an [R, K] slab, x and
 * y pointing at the strip's first column) forms of the forward and the
 * backward. */
#define DEF_SOFTMAX(T, S, KT, EXP)                                          \
    ZSK_CLONES static void softmax_row_##S(const T *x, int64_t n, bool lg,  \
                                           T *y)                            \
    {                                                                       \
        T m = max_##S(x, n);                                                \
        if (lg) {                                                           \
            T ls = (T)log(sumexp_##S(x, n, m));                             \
            for (int64_t i = 0; i < n; i++)                                 \
                y[i] = (x[i] - m) - ls;                                     \
            return;                                                         \
        }                                                                   \
        T inv = (T)(1.0 / sumexp_store_##S(x, n, m, y));                    \
        for (int64_t i = 0; i < n; i++)                                     \
            y[i] *= inv;                                                    \
    }                                                                       \
    ZSK_CLONES static void softmax_strip_##S(const T *x, int64_t R,         \
                                             int64_t K, int64_t w, bool lg, \
                                             T *y)                          \
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
    ZSK_CLONES static void softmax_bw_row_##S(const T *y, const T *g,       \
                                              int64_t n, bool lg, T *gx)    \
    {                                                                       \
        T c = (T)dot_##S(g, lg ? NULL : y, n);                              \
        if (lg)                                                             \
            for (int64_t i = 0; i < n; i++)                                 \
                gx[i] = g[i] - EXP(y[i]) * c;                               \
        else                                                                \
            for (int64_t i = 0; i < n; i++)                                 \
                gx[i] = y[i] * (g[i] - c);                                  \
    }                                                                       \
    ZSK_CLONES static void softmax_bw_strip_##S(const T *y, const T *g,     \
                                                int64_t R, int64_t K,       \
                                                int64_t w, bool lg, T *gx)  \
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
} sm_ctx;

static void sm_body(void *p, int64_t b, int64_t e)
{
    sm_ctx *c = p;
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

static void sm_run(sm_ctx *c, int64_t O)
{
    c->nstrips = (c->K + STRIP - 1) / STRIP;
    if (O * c->R * c->K == 0)
        return;
    int64_t per = c->R * (c->K < STRIP ? c->K : STRIP);
    zs_parallel_for(O * c->nstrips, 1 + ZSK_GRAIN / per, sm_body, c);
}

void zsk_softmax(zs_dtype dt, const void *x, int64_t O, int64_t R, int64_t K,
                 bool log, void *y)
{
    sm_ctx c = {.dt = dt, .x = x, .y = y, .R = R, .K = K, .lg = log};
    sm_run(&c, O);
}

void zsk_softmax_backward(zs_dtype dt, const void *y, const void *g,
                          int64_t O, int64_t R, int64_t K, bool log,
                          void *gx)
{
    sm_ctx c = {.dt = dt, .x = y, .g = g, .y = gx, .R = R, .K = K, .lg = log,
                .backward = true};
    sm_run(&c, O);
}

/* ---- cross entropy ------------------------------------------------------ */

static int64_t target_at(const zsk_targets *tg, int64_t i)
{
    return tg->t64 ? ((const int64_t *)tg->t)[i]
                   : (int64_t)((const int32_t *)tg->t)[i];
}

#define DEF_CE(T, S, EXP)                                                   \
    static void ce_row_##S(const T *x, int64_t C, int64_t t, double *lse,   \
                           double *loss)                                    \
    {                                                                       \
        T m = max_##S(x, C);                                                \
        *lse = (double)m + log(sumexp_##S(x, C, m));                        \
        *loss = *lse - (double)x[t];                                        \
    }                                                                       \
    ZSK_CLONES static void ce_bw_row_##S(const T *x, int64_t C, int64_t t,  \
                                         double lse, double scale, T *gx)   \
    {                                                                       \
        T l = (T)lse, sc = (T)scale;                                        \
        for (int64_t j = 0; j < C; j++)                                     \
            gx[j] = sc * EXP(x[j] - l);                                     \
        gx[t] -= sc;                                                        \
    }

DEF_CE(float, f32, exp_f32)
DEF_CE(double, f64, exp)

typedef struct ce_ctx {
    zs_dtype dt;
    const char *x;
    const zsk_targets *tg;
    int64_t C;
    double *lse, *loss;
    const double *lse_in;
    double scale;
    char *gx;
} ce_ctx;

static void ce_body(void *p, int64_t b, int64_t e)
{
    ce_ctx *c = p;
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

void zsk_cross_entropy(zs_dtype dt, const void *x, const zsk_targets *tg,
                       int64_t N, int64_t C, double *lse, double *loss)
{
    ce_ctx c = {.dt = dt, .x = x, .tg = tg, .C = C, .lse = lse, .loss = loss};
    zs_parallel_for(N, 1 + ZSK_GRAIN / (C > 0 ? C : 1), ce_body, &c);
}

void zsk_cross_entropy_backward(zs_dtype dt, const void *x,
                                const zsk_targets *tg, int64_t N, int64_t C,
                                const double *lse, double scale, void *gx)
{
    ce_ctx c = {.dt = dt, .x = x, .tg = tg, .C = C, .lse_in = lse,
                .scale = scale, .gx = gx};
    zs_parallel_for(N, 1 + ZSK_GRAIN / (C > 0 ? C : 1), ce_bw_body, &c);
}
