/*
 * dropout.c - zs_dropout: keeps each element with probability 1 - p and
 * scales the kept ones by 1/(1 - p) when training.
 *
 * The mask comes from the global counter-based stream: one call reserves
 * numel draws (zs_rng_reserve) and element i (row-major) keeps its value
 * when word i % 4 of zs_philox(seed, offset + i / 4) is below
 * (1 - p) * 2^32. Any thread can make any element, so the mask depends
 * only on the seed and the stream position, never on the thread count,
 * and zs_manual_seed reproduces it.
 *
 * p == 0 or !training: the result is zs_contiguous(a) (a differentiable
 * view, or copy when a is not contiguous) and no draws are consumed.
 * p == 1 (training): every element is dropped and the result is zeros
 * (gradient zero), as in PyTorch; draws are still reserved. p outside
 * [0, 1] is an error.
 *
 * A descriptor run by zsi_run (ops/op.h); the kernel makes the u8 mask as
 * an aux result only when a node will be recorded. Saved: 0 the mask;
 * p.f[8] the scale. Backward: g * mask * scale.
 * Cost model: one multiply per element; bytes = input read, output and
 * mask written (backward: g and mask read, gradient written).
 */
#include <math.h>
#include <string.h>

#include "ops/internal.h"

static zs_status dropout_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin);

/* ---- kernels ----------------------------------------------------------- */

typedef struct drop_ctx {
    const void *x;       /* forward input, or backward gradient */
    void *y;
    uint8_t *mask;       /* written forward, read backward */
    int64_t n;
    uint64_t seed, offset, thr;
    double scale;
} drop_ctx;

#define DEFINE_DROPOUT(T, SUF)                                                \
    /* Groups [g0, g1) of 4 elements, one Philox call each. */                \
    static void drop_fw_##SUF(void *p, int64_t g0, int64_t g1)                \
    {                                                                         \
        const drop_ctx *c = p;                                                \
        const T *x = c->x;                                                    \
        T *y = c->y, s = (T)c->scale;                                         \
        for (int64_t g = g0; g < g1; g++) {                                   \
            uint32_t w[4];                                                    \
            zs_philox(c->seed, c->offset + (uint64_t)g, w);                   \
            for (int k = 0; k < 4 && 4 * g + k < c->n; k++) {                 \
                int64_t i = 4 * g + k;                                        \
                uint8_t keep = (uint64_t)w[k] < c->thr;                       \
                if (c->mask) /* NULL when nothing is recorded */              \
                    c->mask[i] = keep;                                        \
                y[i] = x[i] * (keep ? s : (T)0);                              \
            }                                                                 \
        }                                                                     \
    }                                                                         \
    ZSK_CLONES static void drop_bw_##SUF(void *p, int64_t i0, int64_t i1)     \
    {                                                                         \
        const drop_ctx *c = p;                                                \
        const T *restrict g = c->x;                                           \
        const uint8_t *restrict m = c->mask;                                  \
        T *restrict y = c->y, s = (T)c->scale;                                \
        for (int64_t i = i0; i < i1; i++)                                     \
            y[i] = g[i] * (T)m[i] * s;                                        \
    }

DEFINE_DROPOUT(float, f32)
DEFINE_DROPOUT(double, f64)

/* ---- operator ---------------------------------------------------------- */

/* Attributes: f[0] = p (node: p.f[0]); node: p.f[P_SCALE] = 1/(1 - p),
 * saved 0 the mask. */
#define P_SCALE 8

static double keep_scale(double p) { return p < 1 ? 1.0 / (1.0 - p) : 0.0; }

static zs_status check_dropout(const zs_tensor *a, double p)
{
    if (zsi_check_float_dtype("dropout", a) != ZS_OK)
        return ZS_ERR_ARG;
    if (!(p >= 0 && p <= 1))
        return zs_set_error("dropout: p = %g, expected 0 <= p < 1 (p = 1 gives "
                            "zeros)", p);
    return ZS_OK;
}

static zs_status infer_dropout(zsi_call *c)
{
    const zs_tensor *a = c->in[0];
    if (check_dropout(a, c->a->f[0]) != ZS_OK)
        return ZS_ERR_ARG;
    c->dtype = a->dtype;
    c->ndim = a->ndim;
    memcpy(c->shape, a->shape, sizeof c->shape);
    return ZS_OK;
}

/* The training pass; the u8 mask (aux 0) only when a node will be
 * recorded. */
static zs_status cpu_dropout(const zsi_call *c, zs_tensor *out)
{
    zs_tensor *a = c->in[0];
    double p = c->a->f[0];
    bool rec = zsi_call_records(c);
    zsi_tracking_pause();
    zs_no_grad_push();
    zs_tensor *xc = zs_contiguous(a);
    if (rec)
        c->aux[0] = zsi_new_tensor(ZS_U8, a->ndim, a->shape);
    zs_no_grad_pop();
    zsi_tracking_resume();
    if (!xc || (rec && !c->aux[0])) {
        zs_release(xc);
        return ZS_ERR_NOMEM;
    }
    int64_t n = zs_numel(a);
    drop_ctx d = {.x = zs_data(xc), .y = zs_data(out),
                  .mask = rec ? zs_data(c->aux[0]) : NULL, .n = n,
                  .thr = (uint64_t)ldexp(1.0 - p, 32), .scale = keep_scale(p)};
    zs_rng_reserve((uint64_t)n, &d.seed, &d.offset);
    zs_parallel_for((n + 3) / 4, ZSK_GRAIN / 4,
                    a->dtype == ZS_F64 ? drop_fw_f64 : drop_fw_f32, &d);
    zs_release(xc);
    return ZS_OK;
}

static void save_dropout(zsi_ctx *n, const zsi_call *c, zs_tensor *out)
{
    zsi_save(n, 0, c->aux[0]);
    n->p.f[P_SCALE] = keep_scale(c->a->f[0]);
}

/* one multiply per element; the input read, the output and a mask byte
 * per element written */
static zsi_cost dropout_cost(const zsi_call *c, const zs_tensor *out)
{
    double n = (double)zs_numel(out);
    return (zsi_cost){n, zsi_bytes(c->in[0]), zsi_bytes(c->in[0]) + n};
}

zsi_opdef zsi_def_dropout = {
    .op = {.name = "dropout", .backward = dropout_bw}, .arity = 1,
    .infer = infer_dropout,
    .kernel = {[ZS_CPU] = {[ZS_F32] = cpu_dropout, [ZS_F64] = cpu_dropout}},
    .save = save_dropout, .cost = dropout_cost};

zs_tensor *zs_dropout(zs_tensor *a, double p, bool training)
{
    if (a && (!training || p == 0)) /* the identity: no draws, no call */
        return check_dropout(a, p) == ZS_OK ? zs_contiguous(a) : NULL;
    zsi_attrs at = {.f = {p}};
    return zsi_run(&zsi_def_dropout, 1, &a, &at);
}

static zs_status dropout_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin)
{
    zs_tensor *gc = zs_contiguous(g);
    zs_tensor *gx = gc ? zsi_new_tensor(g->dtype, g->ndim, g->shape) : NULL;
    if (!gx) {
        zs_release(gc);
        return ZS_ERR_NOMEM;
    }
    drop_ctx c = {.x = zs_data(gc), .y = zs_data(gx),
                  .mask = zs_data(n->saved[0]), .scale = n->p.f[P_SCALE]};
    zs_parallel_for(zs_numel(g), ZSK_GRAIN,
                    g->dtype == ZS_F64 ? drop_bw_f64 : drop_bw_f32, &c);
    zs_release(gc);
    gin[0] = gx;
    return ZS_OK;
}
