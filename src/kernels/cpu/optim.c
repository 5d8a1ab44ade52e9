/*
 * optim.c - optimizer and clipping kernels (kernels/cpu/optim.h).
 *
 * The loops vectorise once sqrt cannot set errno (CMakeLists.txt compiles
 * this file with -fno-math-errno: the argument of sqrt is v >= 0) and the
 * buffers are restrict. The
 * sum of squares accumulates in double, eight lanes at a time (an f32 sum
 * of 10^8 squares would lose digits; one double chain per thread ran at a
 * quarter of the bandwidth): each pool chunk owns a fixed slot, and the
 * slots are added in order. The loops are compiled for AVX-512, AVX2 and
 * baseline x86-64 and picked under ZS_CPU_ISA (ZSK_ISA_VOID / ZSK_ISA_FN,
 * kernels.h).
 */
#include <math.h>
#include <stdlib.h>

#include "kernels/cpu/kernels.h"
#include "kernels/cpu/optim.h"

ZSK_ISA_VOID(zsk_adam_f32, (const zsk_adam_args *a, float *restrict p,
                            float *restrict m, float *restrict v,
                            const float *restrict g, int64_t n),
             (a, p, m, v, g, n))
{
    float b2 = a->b2, w1 = a->one_m_b1, w2 = a->one_m_b2, eps = a->eps;
    float wd = a->wd, decay = a->decay, step = a->step_size, bc2s = a->bc2_sqrt;
    float gs = a->gscale;
    if (a->decoupled) {
        for (int64_t i = 0; i < n; i++) {
            float gi = g[i] * gs, mi = m[i] + w1 * (gi - m[i]);
            float vi = v[i] * b2 + w2 * gi * gi;
            m[i] = mi;
            v[i] = vi;
            p[i] = p[i] * decay - step * (mi / (sqrtf(vi) / bc2s + eps));
        }
    } else {
        for (int64_t i = 0; i < n; i++) {
            float gi = g[i] * gs + wd * p[i], mi = m[i] + w1 * (gi - m[i]);
            float vi = v[i] * b2 + w2 * gi * gi;
            m[i] = mi;
            v[i] = vi;
            p[i] = p[i] - step * (mi / (sqrtf(vi) / bc2s + eps));
        }
    }
}

ZSK_ISA_VOID(zsk_sgd_f32, (const zsk_sgd_args *a, float *restrict p,
                           float *restrict b, const float *restrict g, int64_t n),
             (a, p, b, g, n))
{
    float lr = a->lr, wd = a->wd, mu = a->mu, gs = a->gscale;
    if (!b) {
        for (int64_t i = 0; i < n; i++)
            p[i] -= lr * (g[i] * gs + wd * p[i]);
        return;
    }
    for (int64_t i = 0; i < n; i++) {
        float gi = g[i] * gs + wd * p[i];
        float bi = a->first ? gi : mu * b[i] + gi;
        b[i] = bi;
        p[i] -= lr * (a->nesterov ? gi + mu * bi : bi);
    }
}

#define SLOTS 1024 /* at most this many chunks, one partial sum each */

typedef struct sumsq_job {
    const float *x;
    int64_t n, chunk;
    double part[SLOTS];
} sumsq_job;

static ZSK_ISA_FN(double, sumsq_range, (const float *restrict x, int64_t n), (x, n))
{
    double acc[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++)
            acc[k] += (double)x[i + k] * (double)x[i + k];
    for (; i < n; i++)
        acc[0] += (double)x[i] * (double)x[i];
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) +
           ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

static void sumsq_body(void *ctx, int64_t b, int64_t e)
{
    sumsq_job *j = ctx;
    for (int64_t c = b; c < e; c++) {
        int64_t lo = c * j->chunk, hi = lo + j->chunk < j->n ? lo + j->chunk : j->n;
        j->part[c] = sumsq_range(j->x + lo, hi - lo);
    }
}

double zsk_sumsq_f32(const float *x, int64_t n)
{
    if (n <= 0)
        return 0;
    sumsq_job *j = calloc(1, sizeof *j);
    if (!j) /* no memory for the slots: one thread */
        return sumsq_range(x, n);
    j->x = x;
    j->n = n;
    j->chunk = 65536;
    int64_t nc = (n + j->chunk - 1) / j->chunk;
    if (nc > SLOTS) { /* larger chunks, still one partial sum each */
        j->chunk = (n + SLOTS - 1) / SLOTS;
        nc = (n + j->chunk - 1) / j->chunk;
    }
    zs_parallel_for(nc, 1, sumsq_body, j);
    double s = 0;
    for (int64_t c = 0; c < nc; c++)
        s += j->part[c];
    free(j);
    return s;
}

typedef struct scale_job {
    float *x;
    float s;
} scale_job;

static ZSK_ISA_VOID(scale_body, (void *ctx, int64_t b, int64_t e), (ctx, b, e))
{
    const scale_job *j = ctx;
    float *restrict x = j->x, s = j->s;
    for (int64_t i = b; i < e; i++)
        x[i] *= s;
}

void zsk_scale_f32(float *x, int64_t n, float s)
{
    scale_job j = {x, s};
    zs_parallel_for(n, ZSK_GRAIN, scale_body, &j);
}
