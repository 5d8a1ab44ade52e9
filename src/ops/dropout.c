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
 * A descriptor run by zsi_run (ops/op.h), attributes { p }; the kernel
 * makes the u8 mask as an aux result only when a node will be recorded.
 * Saved: 0 the mask. Backward: the descriptor dropout_backward,
 * g * mask * scale with scale = 1/(1 - p).
 * bf16 / f16: the same mask; x * scale computed in f32 and rounded once.
 * Cost model: one multiply per element; bytes = input read, output and
 * mask written (backward: g and mask read, gradient written).
 */
#include <math.h>
#include <string.h>

#include "kernels/cpu/lowp.h"
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
    static ZSK_ISA_VOID(drop_bw_##SUF, (void *p, int64_t i0, int64_t i1),     \
        (p, i0, i1))                                                          \
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

/* bf16 / f16 (dt): blocks of LP_BLOCK elements widened to f32, scaled or
 * zeroed with the same mask as above, rounded once. */
#define LP_BLOCK 256

typedef struct drop_lp_ctx {
    drop_ctx d;
    zs_dtype dt;
} drop_lp_ctx;

static void drop_fw_lp(void *p, int64_t g0, int64_t g1)
{
    const drop_lp_ctx *l = p;
    const drop_ctx *c = &l->d;
    float buf[LP_BLOCK], s = (float)c->scale;
    int64_t end = 4 * g1 < c->n ? 4 * g1 : c->n;
    for (int64_t i0 = 4 * g0; i0 < end; i0 += LP_BLOCK) { /* LP_BLOCK % 4 == 0 */
        int64_t m = end - i0 < LP_BLOCK ? end - i0 : LP_BLOCK;
        zsk_widen16(l->dt, (const uint16_t *)c->x + i0, buf, m);
        for (int64_t j = 0; j < m; j += 4) {
            uint32_t w[4];
            zs_philox(c->seed, c->offset + (uint64_t)((i0 + j) / 4), w);
            for (int k = 0; k < 4 && j + k < m; k++) {
                uint8_t keep = (uint64_t)w[k] < c->thr;
                if (c->mask)
                    c->mask[i0 + j + k] = keep;
                buf[j + k] *= keep ? s : 0.0f;
            }
        }
        zsk_narrow16(l->dt, buf, (uint16_t *)c->y + i0, m);
    }
}

static void drop_bw_lp(void *p, int64_t i0, int64_t i1)
{
    const drop_lp_ctx *l = p;
    const drop_ctx *c = &l->d;
    float buf[LP_BLOCK], s = (float)c->scale;
    for (int64_t b = i0; b < i1; b += LP_BLOCK) {
        int64_t m = i1 - b < LP_BLOCK ? i1 - b : LP_BLOCK;
        zsk_widen16(l->dt, (const uint16_t *)c->x + b, buf, m);
        for (int64_t j = 0; j < m; j++)
            buf[j] *= (float)c->mask[b + j] * s;
        zsk_narrow16(l->dt, buf, (uint16_t *)c->y + b, m);
    }
}

/* ---- operator ---------------------------------------------------------- */

typedef struct dropout_attrs {
    double p; /* the drop probability */
} dropout_attrs;
ZSI_ATTRS(dropout_attrs);

static double keep_scale(double p) { return p < 1 ? 1.0 / (1.0 - p) : 0.0; }

static zs_status check_dropout(const zs_tensor *a, double p)
{
    if (zsi_check_float16_dtype("dropout", a) != ZS_OK)
        return ZS_ERR_ARG;
    if (!(p >= 0 && p <= 1))
        return zs_set_error("dropout: p = %g, expected 0 <= p < 1 (p = 1 gives "
                            "zeros)", p);
    return ZS_OK;
}

static zs_status infer_dropout(zsi_call *c)
{
    const zs_tensor *a = c->in[0];
    if (check_dropout(a, ((const dropout_attrs *)c->attrs)->p) != ZS_OK)
        return ZS_ERR_ARG;
    zsi_out_like(c, a);
    return ZS_OK;
}

/* The training pass; the u8 mask (aux 0) only when a node will be
 * recorded. */
static zs_status cpu_dropout(const zsi_call *c, zs_tensor *out)
{
    zs_tensor *a = c->in[0];
    double p = ((const dropout_attrs *)c->attrs)->p;
    bool rec = zsi_call_records(c);
    zsi_tracking_pause();
    zs_no_grad_push();
    zs_tensor *xc = zs_contiguous(a);
    zs_no_grad_pop();
    zsi_tracking_resume();
    if (rec)
        zsi_aux_new(c, 0, ZS_U8, a->ndim, a->shape);
    if (!xc || (rec && !c->aux[0])) {
        zs_release(xc);
        return ZS_ERR_NOMEM;
    }
    int64_t n = zs_numel(a);
    drop_ctx d = {.x = zs_data(xc), .y = zs_data(out),
                  .mask = rec ? zs_data(c->aux[0]) : NULL, .n = n,
                  .thr = (uint64_t)ldexp(1.0 - p, 32), .scale = keep_scale(p)};
    zs_rng_reserve((uint64_t)n, &d.seed, &d.offset);
    drop_lp_ctx l = {d, a->dtype};
    if (zsk_is_lowp16(a->dtype))
        zs_parallel_for((n + 3) / 4, ZSK_GRAIN / 4, drop_fw_lp, &l);
    else
        zs_parallel_for((n + 3) / 4, ZSK_GRAIN / 4,
                        a->dtype == ZS_F64 ? drop_fw_f64 : drop_fw_f32, &d);
    zs_release(xc);
    return ZS_OK;
}

static void save_dropout(zsi_ctx *n, const zsi_call *c, zs_tensor *out)
{
    zsi_save(n, 0, c->aux[0]);
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
    .kernel = {[ZS_CPU] = {[ZS_F32] = cpu_dropout, [ZS_F64] = cpu_dropout,
                           [ZS_BF16] = cpu_dropout, [ZS_F16] = cpu_dropout}},
    .save = save_dropout, .cost = dropout_cost,
    .attr_size = sizeof(dropout_attrs),
    .bw_ops = (zsi_opdef *const[]){&zsi_def_dropout_backward, NULL}};

zs_tensor *zs_dropout(zs_tensor *a, double p, bool training)
{
    if (a && (!training || p == 0)) /* the identity: no draws, no call */
        return check_dropout(a, p) == ZS_OK ? zs_contiguous(a) : NULL;
    dropout_attrs at = {p};
    return zsi_run(&zsi_def_dropout, 1, &a, &at);
}

/* ---- backward ---------------------------------------------------------- */

/* dropout_backward: g (f32/f64, any layout) and the forward's u8 mask of
 * g's shape -> gx = g * mask * (1/(1 - p)), contiguous. Attributes: the
 * forward's. Not differentiable. */
static zs_status infer_dropout_bw(zsi_call *c)
{
    const zs_tensor *g = c->in[0], *m = c->in[1];
    if (zsi_check_float16_dtype("dropout_backward", g) != ZS_OK)
        return ZS_ERR_ARG;
    if (m->dtype != ZS_U8 || !zs_same_shape(m, g)) {
        char sg[96], sm[96];
        return zs_set_error("dropout_backward: mask %s %s, expected u8 of the "
                            "gradient's shape %s", zs_dtype_name(m->dtype),
                            zs_shape_str(m, sm, sizeof sm),
                            zs_shape_str(g, sg, sizeof sg));
    }
    zsi_out_like(c, g);
    return ZS_OK;
}

static zs_status cpu_dropout_bw(const zsi_call *c, zs_tensor *out)
{
    zsi_tracking_pause();
    zs_no_grad_push();
    zs_tensor *gc = zs_contiguous(c->in[0]), *mc = zs_contiguous(c->in[1]);
    zs_no_grad_pop();
    zsi_tracking_resume();
    if (gc && mc) {
        drop_ctx d = {.x = zs_data(gc), .y = zs_data(out), .mask = zs_data(mc),
                      .scale = keep_scale(((const dropout_attrs *)c->attrs)->p)};
        drop_lp_ctx l = {d, out->dtype};
        if (zsk_is_lowp16(out->dtype))
            zs_parallel_for(zs_numel(out), ZSK_GRAIN, drop_bw_lp, &l);
        else
            zs_parallel_for(zs_numel(out), ZSK_GRAIN,
                            out->dtype == ZS_F64 ? drop_bw_f64 : drop_bw_f32, &d);
    }
    zs_status st = gc && mc ? ZS_OK : ZS_ERR_NOMEM;
    zs_release(gc);
    zs_release(mc);
    return st;
}

/* one multiply per element; g and the mask read, the gradient written */
static zsi_cost dropout_bw_cost(const zsi_call *c, const zs_tensor *out)
{
    double n = (double)zs_numel(out);
    return (zsi_cost){n, zsi_bytes(c->in[0]) + n, zsi_bytes(out)};
}

zsi_opdef zsi_def_dropout_backward = {
    .op = {.name = "dropout_backward"}, .arity = 2, .infer = infer_dropout_bw,
    .kernel = {[ZS_CPU] = {[ZS_F32] = cpu_dropout_bw, [ZS_F64] = cpu_dropout_bw,
                           [ZS_BF16] = cpu_dropout_bw, [ZS_F16] = cpu_dropout_bw}},
    .cost = dropout_bw_cost, .attr_size = sizeof(dropout_attrs)};

static zs_status dropout_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin)
{
    gin[0] = zsi_run(&zsi_def_dropout_backward, 2,
                     (zs_tensor *[]){g, n->saved[0]}, zsi_node_attrs(n));
    return gin[0] ? ZS_OK : ZS_ERR_NOMEM;
}
