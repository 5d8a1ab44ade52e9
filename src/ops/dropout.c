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
 * Saved: 0 the u8 mask; p.f[0] the scale. Backward: g * mask * scale.
 * Cost model: one multiply per element; bytes = input read, output and
 * mask written (backward: g and mask read, gradient written).
 */
#include <math.h>

#include "ops/internal.h"

static zs_status dropout_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin);

static zsi_op OP_DROPOUT = {.name = "dropout", .backward = dropout_bw};

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
                c->mask[i] = keep;                                            \
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

static zs_tensor *dropout_train(zs_tensor *a, double p)
{
    zsi_tracking_pause();
    zs_no_grad_push();
    zs_tensor *xc = zs_contiguous(a);
    zs_tensor *mask = zsi_new_tensor(ZS_U8, a->ndim, a->shape);
    zs_no_grad_pop();
    zsi_tracking_resume();
    zs_tensor *out = xc && mask ? zsi_new_tensor(a->dtype, a->ndim, a->shape)
                                : NULL;
    if (out) {
        int64_t n = zs_numel(a);
        drop_ctx c = {.x = zs_data(xc), .y = zs_data(out),
                      .mask = zs_data(mask), .n = n,
                      .thr = (uint64_t)ldexp(1.0 - p, 32),
                      .scale = p < 1 ? 1.0 / (1.0 - p) : 0.0};
        zs_rng_reserve((uint64_t)n, &c.seed, &c.offset);
        zs_parallel_for((n + 3) / 4, ZSK_GRAIN / 4,
                        a->dtype == ZS_F64 ? drop_fw_f64 : drop_fw_f32, &c);
        zsi_ctx *node;
        if (zsi_record(&OP_DROPOUT, out, 1, &a, &node) != ZS_OK) {
            zs_release(out);
            out = NULL;
        } else if (node) {
            zsi_save(node, 0, mask);
            node->p.f[0] = c.scale;
        }
    }
    zs_release(xc);
    zs_release(mask);
    return out;
}

zs_tensor *zs_dropout(zs_tensor *a, double p, bool training)
{
    if (!a)
        return NULL;
    double t0 = zsi_op_begin(&OP_DROPOUT);
    if (zsi_check_float("dropout", a) != ZS_OK)
        return NULL;
    if (!(p >= 0 && p <= 1)) {
        zs_set_error("dropout: p = %g, expected 0 <= p < 1 (p = 1 gives "
                     "zeros)", p);
        return NULL;
    }
    if (!training || p == 0)
        return zs_contiguous(a);
    zs_tensor *out = dropout_train(a, p);
    double n = (double)zs_numel(a);
    zsi_op_end(&OP_DROPOUT, t0, n, zsi_bytes(a), zsi_bytes(a) + n);
    return out;
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
                  .mask = zs_data(n->saved[0]), .scale = n->p.f[0]};
    zs_parallel_for(zs_numel(g), ZSK_GRAIN,
                    g->dtype == ZS_F64 ? drop_bw_f64 : drop_bw_f32, &c);
    zs_release(gc);
    gin[0] = gx;
    return ZS_OK;
}
