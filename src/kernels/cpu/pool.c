/*
 * pool.c - max and average pooling forward and backward (contracts in
 * pool.h). Each task owns whole N*C planes, so the backward scatters
 * (overlapping windows add into the same gx elements) need no atomics.
 */
#include <string.h>

#include "kernels/cpu/kernels.h"
#include "kernels/cpu/pool.h"

typedef struct pool_ctx {
    const zsk_pool2d_shape *s;
    const void *x;
    const int64_t *xs;
    const void *gy;
    void *y, *gx;
    int64_t *idx;
    const int64_t *cidx;
    bool include_pad;
} pool_ctx;

/* Window [o*s - p, o*s - p + k) clipped to [0, n) -> [*a0, *a1). */
static void clip(int64_t o, int64_t s, int64_t p, int64_t k, int64_t n,
                    int64_t *a0, int64_t *a1)
{
    int64_t start = o * s - p, end = start + k;
    *a0 = start < 0 ? 0 : start;
    *a1 = end > n ? n : end;
}

/* The max of window [h0, h1) x [w0, w1) of a plane (element strides s2,
 * s3) and its flat index ih*W + iw: the first one on ties; the first NaN
 * wins. Branch-free unless a NaN is met (then the window is scanned again
 * for it): with a compare-and-branch, random data mispredicted about every
 * other element (LeNet's first pool, 75k windows of 4: 1.4 ms on 2
 * threads). */
#define DEFINE_WINMAX(T, SUF)                                                 \
    static inline T winmax_##SUF(const T *x, int64_t s2, int64_t s3,          \
                                 int64_t W, int64_t h0, int64_t h1,           \
                                 int64_t w0, int64_t w1, int64_t *bi_out)     \
    {                                                                         \
        T best = x[h0 * s2 + w0 * s3];                                        \
        int64_t bi = h0 * W + w0;                                             \
        int nan = 0;                                                          \
        for (int64_t ih = h0; ih < h1; ih++)                                  \
            for (int64_t iw = w0; iw < w1; iw++) {                            \
                T v = x[ih * s2 + iw * s3];                                   \
                int gt = v > best;                                            \
                bi = gt ? ih * W + iw : bi;                                   \
                best = gt ? v : best;                                         \
                nan |= v != v;                                                \
            }                                                                 \
        for (int64_t ih = h0; nan && ih < h1; ih++)                           \
            for (int64_t iw = w0; nan && iw < w1; iw++) {                     \
                T v = x[ih * s2 + iw * s3];                                   \
                if (v != v) {                                                 \
                    best = v;                                                 \
                    bi = ih * W + iw;                                         \
                    nan = 0;                                                  \
                }                                                             \
            }                                                                 \
        *bi_out = bi;                                                         \
        return best;                                                          \
    }

DEFINE_WINMAX(float, f32)
DEFINE_WINMAX(double, f64)

#define DEFINE_POOL(T, SUF)                                                   \
    static void max_fw_##SUF(void *p, int64_t b, int64_t e)                   \
    {                                                                         \
        const pool_ctx *c = p;                                                \
        const zsk_pool2d_shape *s = c->s;                                     \
        for (int64_t pl = b; pl < e; pl++) {                                  \
            const T *x = (const T *)c->x + pl / s->C * c->xs[0] +             \
                         pl % s->C * c->xs[1];                                \
            T *y = (T *)c->y + pl * s->OH * s->OW;                            \
            int64_t *ix = c->idx ? c->idx + pl * s->OH * s->OW : NULL;        \
            for (int64_t oh = 0; oh < s->OH; oh++) {                          \
                int64_t h0, h1, w0, w1;                                       \
                clip(oh, s->sh, s->ph, s->kh, s->H, &h0, &h1);                \
                for (int64_t ow = 0; ow < s->OW; ow++) {                      \
                    clip(ow, s->sw, s->pw, s->kw, s->W, &w0, &w1);            \
                    int64_t bi;                                               \
                    T best = winmax_##SUF(x, c->xs[2], c->xs[3], s->W, h0,    \
                                          h1, w0, w1, &bi);                   \
                    y[oh * s->OW + ow] = best;                                \
                    if (ix)                                                   \
                        ix[oh * s->OW + ow] = bi;                             \
                }                                                             \
            }                                                                 \
        }                                                                     \
    }                                                                         \
    static void max_bw_##SUF(void *p, int64_t b, int64_t e)                   \
    {                                                                         \
        const pool_ctx *c = p;                                                \
        const zsk_pool2d_shape *s = c->s;                                     \
        int64_t HW = s->H * s->W, P = s->OH * s->OW;                          \
        for (int64_t pl = b; pl < e; pl++) {                                  \
            T *gx = (T *)c->gx + pl * HW;                                     \
            const T *gy = (const T *)c->gy + pl * P;                          \
            const int64_t *ix = c->cidx + pl * P;                             \
            memset(gx, 0, (size_t)HW * sizeof(T));                            \
            for (int64_t i = 0; i < P; i++)                                   \
                gx[ix[i]] += gy[i];                                           \
        }                                                                     \
    }                                                                         \
    static void avg_fw_##SUF(void *p, int64_t b, int64_t e)                   \
    {                                                                         \
        const pool_ctx *c = p;                                                \
        const zsk_pool2d_shape *s = c->s;                                     \
        for (int64_t pl = b; pl < e; pl++) {                                  \
            const T *x = (const T *)c->x + pl / s->C * c->xs[0] +             \
                         pl % s->C * c->xs[1];                                \
            T *y = (T *)c->y + pl * s->OH * s->OW;                            \
            for (int64_t oh = 0; oh < s->OH; oh++) {                          \
                int64_t h0, h1, w0, w1;                                       \
                clip(oh, s->sh, s->ph, s->kh, s->H, &h0, &h1);                \
                for (int64_t ow = 0; ow < s->OW; ow++) {                      \
                    clip(ow, s->sw, s->pw, s->kw, s->W, &w0, &w1);            \
                    double acc = 0;                                           \
                    for (int64_t ih = h0; ih < h1; ih++)                      \
                        for (int64_t iw = w0; iw < w1; iw++)                  \
                            acc += x[ih * c->xs[2] + iw * c->xs[3]];          \
                    int64_t n = c->include_pad ? s->kh * s->kw                \
                                               : (h1 - h0) * (w1 - w0);       \
                    y[oh * s->OW + ow] = (T)(acc / (double)n);                \
                }                                                             \
            }                                                                 \
        }                                                                     \
    }                                                                         \
    static void avg_bw_##SUF(void *p, int64_t b, int64_t e)                   \
    {                                                                         \
        const pool_ctx *c = p;                                                \
        const zsk_pool2d_shape *s = c->s;                                     \
        int64_t HW = s->H * s->W, P = s->OH * s->OW;                          \
        for (int64_t pl = b; pl < e; pl++) {                                  \
            T *gx = (T *)c->gx + pl * HW;                                     \
            const T *gy = (const T *)c->gy + pl * P;                          \
            memset(gx, 0, (size_t)HW * sizeof(T));                            \
            for (int64_t oh = 0; oh < s->OH; oh++) {                          \
                int64_t h0, h1, w0, w1;                                       \
                clip(oh, s->sh, s->ph, s->kh, s->H, &h0, &h1);                \
                for (int64_t ow = 0; ow < s->OW; ow++) {                      \
                    clip(ow, s->sw, s->pw, s->kw, s->W, &w0, &w1);            \
                    int64_t n = c->include_pad ? s->kh * s->kw                \
                                               : (h1 - h0) * (w1 - w0);       \
                    T v = (T)(gy[oh * s->OW + ow] / (double)n);               \
                    for (int64_t ih = h0; ih < h1; ih++)                      \
                        for (int64_t iw = w0; iw < w1; iw++)                  \
                            gx[ih * s->W + iw] += v;                          \
                }                                                             \
            }                                                                 \
        }                                                                     \
    }

DEFINE_POOL(float, f32)
DEFINE_POOL(double, f64)

/* Planes per task: enough window work to amortise a task. */
static int64_t grain(const zsk_pool2d_shape *s)
{
    int64_t work = s->OH * s->OW * s->kh * s->kw + s->H * s->W;
    return 1 + ZSK_GRAIN / (work + 1);
}

void zsk_max_pool2d(zs_dtype dt, const zsk_pool2d_shape *s, const void *x,
                    const int64_t *xs, void *y, int64_t *idx)
{
    pool_ctx c = {.s = s, .x = x, .xs = xs, .y = y, .idx = idx};
    zs_parallel_for(s->N * s->C, grain(s),
                    dt == ZS_F32 ? max_fw_f32 : max_fw_f64, &c);
}

void zsk_max_pool2d_backward(zs_dtype dt, const zsk_pool2d_shape *s,
                             const void *gy, const int64_t *idx, void *gx)
{
    pool_ctx c = {.s = s, .gy = gy, .cidx = idx, .gx = gx};
    zs_parallel_for(s->N * s->C, grain(s),
                    dt == ZS_F32 ? max_bw_f32 : max_bw_f64, &c);
}

void zsk_avg_pool2d(zs_dtype dt, const zsk_pool2d_shape *s, const void *x,
                    const int64_t *xs, bool count_include_pad, void *y)
{
    pool_ctx c = {.s = s, .x = x, .xs = xs, .y = y,
                  .include_pad = count_include_pad};
    zs_parallel_for(s->N * s->C, grain(s),
                    dt == ZS_F32 ? avg_fw_f32 : avg_fw_f64, &c);
}

void zsk_avg_pool2d_backward(zs_dtype dt, const zsk_pool2d_shape *s,
                             const void *gy, bool count_include_pad, void *gx)
{
    pool_ctx c = {.s = s, .gy = gy, .gx = gx,
                  .include_pad = count_include_pad};
    zs_parallel_for(s->N * s->C, grain(s),
                    dt == ZS_F32 ? avg_bw_f32 : avg_bw_f64, &c);
}
