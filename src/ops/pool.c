/*
 * pool.c - zs_max_pool2d and zs_avg_pool2d over x [N, C, H, W] (any
 * layout) -> [N, C, OH, OW], OH = floor((H + 2*ph - kh)/sh) + 1, stride 0
 * meaning the kernel size (kernels in kernels/cpu/pool.c).
 *
 * Padding is at most half the kernel, so every window holds a real
 * element. max_pool2d saves the argmax of each window (i64 flat index in
 * its plane) for backward; avg_pool2d's backward spreads g / count over
 * the window. Both are descriptors run by zsi_run (ops/op.h); max_pool2d's
 * kernel makes the indices as an aux result only when a node will be
 * recorded. Cost model: kh*kw FLOPs (comparisons or additions) per output
 * element; bytes = input + output (+ indices written). The backward
 * kernels are counted under their own names (*_backward).
 */
#include <string.h>

#include "kernels/cpu/pool.h"
#include "ops/internal.h"

static zs_status max_pool_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin);
static zs_status avg_pool_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin);

/* The backward kernels, counted under their own names (not differentiable). */
static zsi_op OP_MAX_POOL_BW = {.name = "max_pool2d_backward"};
static zsi_op OP_AVG_POOL_BW = {.name = "avg_pool2d_backward"};

/* Attributes: ptr = the zs_pool2d_params, i[0] = count_include_pad
 * (avg_pool2d). Node: p.i[4] count_include_pad, p.i[8..15] kh, kw, sh,
 * sw, ph, pw, OH, OW; saved 0 the argmax indices (max_pool2d). */
#define P_PAD 4
#define P_GEOM 8

static zs_status pool_shape(const char *op, const zs_tensor *x,
                            const zs_pool2d_params *p, zsk_pool2d_shape *s)
{
    char sx[96];
    zs_status st = zsi_check_float_dtype(op, x);
    if (st != ZS_OK)
        return st;
    zs_shape_str(x, sx, sizeof sx);
    if (x->ndim != 4)
        return zs_set_error("%s: input %s has %d dims, expected 4 "
                            "[N, C, H, W]", op, sx, x->ndim);
    if (!p)
        return zs_set_error("%s: params are NULL, expected a kernel size", op);
    const int *k = p->kernel, *sd = p->stride, *pd = p->padding;
    if (k[0] <= 0 || k[1] <= 0 || sd[0] < 0 || sd[1] < 0)
        return zs_set_error("%s: kernel [%d, %d] must be positive and stride "
                            "[%d, %d] non-negative (0 = kernel)", op, k[0],
                            k[1], sd[0], sd[1]);
    if (pd[0] < 0 || pd[1] < 0 || pd[0] > k[0] / 2 || pd[1] > k[1] / 2)
        return zs_set_error("%s: padding [%d, %d] must be in [0, kernel/2] "
                            "for kernel [%d, %d]", op, pd[0], pd[1], k[0], k[1]);
    *s = (zsk_pool2d_shape){
        .N = x->shape[0], .C = x->shape[1], .H = x->shape[2], .W = x->shape[3],
        .kh = k[0], .kw = k[1], .sh = sd[0] ? sd[0] : k[0],
        .sw = sd[1] ? sd[1] : k[1], .ph = pd[0], .pw = pd[1]};
    int64_t eh = s->H + 2 * s->ph - s->kh, ew = s->W + 2 * s->pw - s->kw;
    if (eh < 0 || ew < 0)
        return zs_set_error("%s: input %s is smaller than kernel [%d, %d] "
                            "with padding [%d, %d]: empty output", op, sx,
                            k[0], k[1], pd[0], pd[1]);
    s->OH = eh / s->sh + 1;
    s->OW = ew / s->sw + 1;
    return ZS_OK;
}

/* The geometry of an inferred call (its checks passed). */
static zsk_pool2d_shape call_shape(const zsi_call *c)
{
    zsk_pool2d_shape s;
    pool_shape(c->def->op.name, c->in[0], c->a->ptr, &s);
    return s;
}

static zs_status infer_pool(zsi_call *c)
{
    zsk_pool2d_shape s;
    if (pool_shape(c->def->op.name, c->in[0], c->a->ptr, &s) != ZS_OK)
        return ZS_ERR_ARG;
    c->dtype = c->in[0]->dtype;
    c->ndim = 4;
    int64_t os[4] = {s.N, s.C, s.OH, s.OW};
    memcpy(c->shape, os, sizeof os);
    return ZS_OK;
}

/* max_pool2d; the argmax indices (aux 0) when a node will be recorded. */
static zs_status cpu_max_pool(const zsi_call *c, zs_tensor *out)
{
    const zs_tensor *x = c->in[0];
    zsk_pool2d_shape s = call_shape(c);
    if (zsi_call_records(c)) {
        zsi_tracking_pause();
        c->aux[0] = zsi_new_tensor(ZS_I64, out->ndim, out->shape);
        zsi_tracking_resume();
        if (!c->aux[0])
            return ZS_ERR_NOMEM;
    }
    zsk_max_pool2d(x->dtype, &s, zs_data(x), x->strides, zs_data(out),
                   c->aux[0] ? zs_data(c->aux[0]) : NULL);
    return ZS_OK;
}

static zs_status cpu_avg_pool(const zsi_call *c, zs_tensor *out)
{
    const zs_tensor *x = c->in[0];
    zsk_pool2d_shape s = call_shape(c);
    zsk_avg_pool2d(x->dtype, &s, zs_data(x), x->strides, c->a->i[0] != 0,
                   zs_data(out));
    return ZS_OK;
}

static void save_pool(zsi_ctx *n, const zsi_call *c, zs_tensor *out)
{
    zsk_pool2d_shape s = call_shape(c);
    int64_t v[] = {s.kh, s.kw, s.sh, s.sw, s.ph, s.pw, s.OH, s.OW};
    for (int i = 0; i < 8; i++)
        n->p.i[P_GEOM + i] = v[i];
    zsi_save(n, 0, c->aux[0]); /* max_pool2d's indices */
}

static zsk_pool2d_shape load_params(const zsi_ctx *n)
{
    const zsi_meta *m = &n->in_meta[0];
    const int64_t *v = &n->p.i[P_GEOM];
    return (zsk_pool2d_shape){
        .N = m->shape[0], .C = m->shape[1], .H = m->shape[2], .W = m->shape[3],
        .kh = v[0], .kw = v[1], .sh = v[2], .sw = v[3], .ph = v[4], .pw = v[5],
        .OH = v[6], .OW = v[7]};
}

/* kh*kw per output element; max_pool2d also writes its i64 indices when
 * a node was recorded. */
static zsi_cost pool_cost(const zsi_call *c, const zs_tensor *out)
{
    zsk_pool2d_shape s = call_shape(c);
    double no = (double)zs_numel(out);
    bool idx = c->def->op.backward == max_pool_bw && out->node;
    return (zsi_cost){no * (double)(s.kh * s.kw), zsi_bytes(c->in[0]),
                      zsi_bytes(out) + (idx ? 8 * no : 0)};
}

zsi_opdef zsi_def_max_pool = {
    .op = {.name = "max_pool2d", .backward = max_pool_bw}, .arity = 1,
    .infer = infer_pool,
    .kernel = {[ZS_CPU] = {[ZS_F32] = cpu_max_pool, [ZS_F64] = cpu_max_pool}},
    .save = save_pool, .cost = pool_cost};

zsi_opdef zsi_def_avg_pool = {
    .op = {.name = "avg_pool2d", .backward = avg_pool_bw}, .arity = 1,
    .infer = infer_pool,
    .kernel = {[ZS_CPU] = {[ZS_F32] = cpu_avg_pool, [ZS_F64] = cpu_avg_pool}},
    .save = save_pool, .cost = pool_cost};

zs_tensor *zs_max_pool2d(zs_tensor *x, const zs_pool2d_params *p)
{
    zsi_attrs at = {.ptr = p};
    return zsi_run(&zsi_def_max_pool, 1, &x, &at);
}

zs_tensor *zs_avg_pool2d(zs_tensor *x, const zs_pool2d_params *p)
{
    zsi_attrs at = {.i = {p ? p->count_include_pad : 0}, .ptr = p};
    return zsi_run(&zsi_def_avg_pool, 1, &x, &at);
}

static zs_status max_pool_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin)
{
    const zsi_meta *m = &n->in_meta[0];
    double t0 = zsi_op_begin(&OP_MAX_POOL_BW);
    zsk_pool2d_shape s = load_params(n);
    zs_tensor *gc = zs_contiguous(g);
    zs_tensor *gx = gc ? zsi_new_tensor(m->dtype, m->ndim, m->shape) : NULL;
    if (gx) {
        zsk_max_pool2d_backward(m->dtype, &s, zs_data(gc), zs_data(n->saved[0]),
                                zs_data(gx));
        /* one add per output gradient; reads g and the argmax indices */
        zsi_op_end(&OP_MAX_POOL_BW, t0, (double)zs_numel(gc),
                   zsi_bytes(gc) + zsi_bytes(n->saved[0]), zsi_bytes(gx));
    }
    zs_release(gc);
    gin[0] = gx;
    return gx ? ZS_OK : ZS_ERR_NOMEM;
}

static zs_status avg_pool_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin)
{
    const zsi_meta *m = &n->in_meta[0];
    double t0 = zsi_op_begin(&OP_AVG_POOL_BW);
    zsk_pool2d_shape s = load_params(n);
    zs_tensor *gc = zs_contiguous(g);
    zs_tensor *gx = gc ? zsi_new_tensor(m->dtype, m->ndim, m->shape) : NULL;
    if (gx) {
        zsk_avg_pool2d_backward(m->dtype, &s, zs_data(gc), n->p.i[P_PAD] != 0,
                                zs_data(gx));
        /* g / count added to each window element */
        zsi_op_end(&OP_AVG_POOL_BW, t0, (double)zs_numel(gc) * (double)(s.kh * s.kw),
                   zsi_bytes(gc), zsi_bytes(gx));
    }
    zs_release(gc);
    gin[0] = gx;
    return gx ? ZS_OK : ZS_ERR_NOMEM;
}
