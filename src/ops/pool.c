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
 * recorded; their attributes are the zs_pool2d_params by value. The
 * backward rules run the descriptors max_pool2d_backward (g and the
 * indices) and avg_pool2d_backward (g), whose attributes add the input's
 * H and W. Cost model: kh*kw FLOPs (comparisons or additions) per output
 * element; bytes = input + output (+ indices written); backward: one add
 * per gradient element (max) or kh*kw (avg), g (+ indices) read, the
 * gradient written.
 *
 * bf16 / f16 (forward and backward): the f32 kernels on f32 copies of the
 * float inputs (zsi_via_f32), each result rounded once into the input's
 * dtype (a max is exact; the indices are i64 either way).
 */
#include <string.h>

#include "kernels/cpu/pool.h"
#include "ops/internal.h"
#include "ops/attrs.h"

static zs_status max_pool_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin);
static zs_status avg_pool_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin);

/* Attributes of both operators: the params by value. Saved: 0 the argmax
 * indices (max_pool2d). */

/* Attributes of the backward descriptors: the forward's, and the input's
 * height and width (the gradient's shape, [N, C, H, W]). */

/* The geometry of a pooling of [N, C, H, W] with params p (s's N, C, H, W
 * are set by the caller); fails with a message naming op. */
static zs_status pool_geom(const char *op, const zs_pool2d_params *p,
                           const char *sx, zsk_pool2d_shape *s)
{
    const int *k = p->kernel, *sd = p->stride, *pd = p->padding;
    if (k[0] <= 0 || k[1] <= 0 || sd[0] < 0 || sd[1] < 0)
        return zs_set_error("%s: kernel [%d, %d] must be positive and stride "
                            "[%d, %d] non-negative (0 = kernel)", op, k[0],
                            k[1], sd[0], sd[1]);
    if (pd[0] < 0 || pd[1] < 0 || pd[0] > k[0] / 2 || pd[1] > k[1] / 2)
        return zs_set_error("%s: padding [%d, %d] must be in [0, kernel/2] "
                            "for kernel [%d, %d]", op, pd[0], pd[1], k[0], k[1]);
    s->kh = k[0], s->kw = k[1];
    s->sh = sd[0] ? sd[0] : k[0], s->sw = sd[1] ? sd[1] : k[1];
    s->ph = pd[0], s->pw = pd[1];
    int64_t eh = s->H + 2 * s->ph - s->kh, ew = s->W + 2 * s->pw - s->kw;
    if (eh < 0 || ew < 0)
        return zs_set_error("%s: input %s is smaller than kernel [%d, %d] "
                            "with padding [%d, %d]: empty output", op, sx,
                            k[0], k[1], pd[0], pd[1]);
    s->OH = eh / s->sh + 1;
    s->OW = ew / s->sw + 1;
    return ZS_OK;
}

static zs_status pool_shape(const char *op, const zs_tensor *x,
                            const zs_pool2d_params *p, zsk_pool2d_shape *s)
{
    char sx[96];
    zs_status st = zsi_check_float16_dtype(op, x);
    if (st != ZS_OK)
        return st;
    zs_shape_str(x, sx, sizeof sx);
    if (x->ndim != 4)
        return zs_set_error("%s: input %s has %d dims, expected 4 "
                            "[N, C, H, W]", op, sx, x->ndim);
    *s = (zsk_pool2d_shape){
        .N = x->shape[0], .C = x->shape[1], .H = x->shape[2], .W = x->shape[3]};
    return pool_geom(op, p, sx, s);
}

/* The geometry of an inferred call (its checks passed). */
static zsk_pool2d_shape call_shape(const zsi_call *c)
{
    zsk_pool2d_shape s;
    pool_shape(c->def->op.name, c->in[0], &((const pool_attrs *)c->attrs)->p, &s);
    return s;
}

static zs_status infer_pool(zsi_call *c)
{
    zsk_pool2d_shape s;
    if (pool_shape(c->def->op.name, c->in[0], &((const pool_attrs *)c->attrs)->p,
                   &s) != ZS_OK)
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
    if (zsi_call_records(c) && !zsi_aux_new(c, 0, ZS_I64, out->ndim, out->shape))
        return ZS_ERR_NOMEM;
    zsk_max_pool2d(x->dtype, &s, zs_data(x), x->strides, zs_data(out),
                   c->aux[0] ? zs_data(c->aux[0]) : NULL);
    return ZS_OK;
}

static zs_status cpu_avg_pool(const zsi_call *c, zs_tensor *out)
{
    const zs_tensor *x = c->in[0];
    zsk_pool2d_shape s = call_shape(c);
    zsk_avg_pool2d(x->dtype, &s, zs_data(x), x->strides,
                   ((const pool_attrs *)c->attrs)->p.count_include_pad,
                   zs_data(out));
    return ZS_OK;
}

static zs_status cpu_max_pool_lowp(const zsi_call *c, zs_tensor *out)
{
    return zsi_via_f32(c, out, cpu_max_pool);
}

static zs_status cpu_avg_pool_lowp(const zsi_call *c, zs_tensor *out)
{
    return zsi_via_f32(c, out, cpu_avg_pool);
}

static void save_pool(zsi_ctx *n, const zsi_call *c, zs_tensor *out)
{
    zsi_save(n, 0, c->aux[0]); /* max_pool2d's indices */
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
    .kernel = {[ZS_CPU] = {[ZS_F32] = cpu_max_pool, [ZS_F64] = cpu_max_pool,
                           [ZS_BF16] = cpu_max_pool_lowp,
                           [ZS_F16] = cpu_max_pool_lowp}},
    .save = save_pool, .cost = pool_cost, .attr_size = sizeof(pool_attrs),
    .bw_ops = (zsi_opdef *const[]){&zsi_def_max_pool_backward, NULL}};

zsi_opdef zsi_def_avg_pool = {
    .op = {.name = "avg_pool2d", .backward = avg_pool_bw}, .arity = 1,
    .infer = infer_pool,
    .kernel = {[ZS_CPU] = {[ZS_F32] = cpu_avg_pool, [ZS_F64] = cpu_avg_pool,
                           [ZS_BF16] = cpu_avg_pool_lowp,
                           [ZS_F16] = cpu_avg_pool_lowp}},
    .save = save_pool, .cost = pool_cost, .attr_size = sizeof(pool_attrs),
    .bw_ops = (zsi_opdef *const[]){&zsi_def_avg_pool_backward, NULL}};

static zs_tensor *pool(zsi_opdef *def, zs_tensor *x, const zs_pool2d_params *p)
{
    if (x && !p) {
        zs_set_error("%s: params are NULL, expected a kernel size",
                     def->op.name);
        return NULL;
    }
    pool_attrs at = {0};
    if (p)
        at.p = *p;
    return zsi_run(def, 1, &x, &at);
}

zs_tensor *zs_max_pool2d(zs_tensor *x, const zs_pool2d_params *p)
{
    return pool(&zsi_def_max_pool, x, p);
}

zs_tensor *zs_avg_pool2d(zs_tensor *x, const zs_pool2d_params *p)
{
    return pool(&zsi_def_avg_pool, x, p);
}

/* ---- backward ---------------------------------------------------------- */

/* The backward descriptors: g [N, C, OH, OW] (f32/f64, any layout; the
 * max's argmax indices, i64 of g's shape, as the forward made them) ->
 * gx [N, C, H, W] contiguous. Not differentiable. */
static zs_status infer_pool_bw(zsi_call *c)
{
    const char *op = c->def->op.name;
    const pool_bw_attrs *a = c->attrs;
    const zs_tensor *g = c->in[0];
    char sg[96], si[96];
    zs_status st = zsi_check_float16_dtype(op, g);
    if (st != ZS_OK)
        return st;
    zs_shape_str(g, sg, sizeof sg);
    if (g->ndim != 4)
        return zs_set_error("%s: gradient %s has %d dims, expected 4 "
                            "[N, C, OH, OW]", op, sg, g->ndim);
    zsk_pool2d_shape s = {.N = g->shape[0], .C = g->shape[1], .H = a->H, .W = a->W};
    int64_t xs[4] = {s.N, s.C, s.H, s.W};
    zsi_shape_fmt(4, xs, si, sizeof si);
    if (a->H < 0 || a->W < 0 || pool_geom(op, &a->p, si, &s) != ZS_OK)
        return ZS_ERR_ARG;
    if (g->shape[2] != s.OH || g->shape[3] != s.OW)
        return zs_set_error("%s: gradient %s, expected [%lld, %lld, %lld, %lld] "
                            "for input %s", op, sg, (long long)s.N,
                            (long long)s.C, (long long)s.OH, (long long)s.OW, si);
    if (c->nin > 1 && (c->in[1]->dtype != ZS_I64 || !zs_same_shape(c->in[1], g)))
        return zs_set_error("%s: indices %s %s, expected i64 of the gradient's "
                            "shape %s", op, zs_dtype_name(c->in[1]->dtype),
                            zs_shape_str(c->in[1], si, sizeof si), sg);
    c->dtype = g->dtype;
    c->ndim = 4;
    memcpy(c->shape, xs, sizeof xs);
    return ZS_OK;
}

/* The geometry of an inferred backward call. */
static zsk_pool2d_shape bw_shape(const zsi_call *c)
{
    const pool_bw_attrs *a = c->attrs;
    const zs_tensor *g = c->in[0];
    zsk_pool2d_shape s = {.N = g->shape[0], .C = g->shape[1], .H = a->H, .W = a->W};
    pool_geom(c->def->op.name, &a->p, "", &s);
    return s;
}

/* Contiguous aliases (or copies) of c's inputs into t[], made without
 * autograd or scope tracking; false when one failed (released). */
static bool contiguous_inputs(const zsi_call *c, zs_tensor **t)
{
    bool ok = true;
    zsi_tracking_pause();
    zs_no_grad_push();
    for (int i = 0; i < c->nin; i++)
        ok = (t[i] = zs_contiguous(c->in[i])) && ok;
    zs_no_grad_pop();
    zsi_tracking_resume();
    for (int i = 0; !ok && i < c->nin; i++)
        zs_release(t[i]);
    return ok;
}

static zs_status cpu_max_pool_bw(const zsi_call *c, zs_tensor *out)
{
    zsk_pool2d_shape s = bw_shape(c);
    zs_tensor *t[2] = {0};
    if (!contiguous_inputs(c, t))
        return ZS_ERR_NOMEM;
    zsk_max_pool2d_backward(out->dtype, &s, zs_data(t[0]), zs_data(t[1]),
                            zs_data(out));
    zs_release(t[0]);
    zs_release(t[1]);
    return ZS_OK;
}

static zs_status cpu_avg_pool_bw(const zsi_call *c, zs_tensor *out)
{
    zsk_pool2d_shape s = bw_shape(c);
    zs_tensor *t[1] = {0};
    if (!contiguous_inputs(c, t))
        return ZS_ERR_NOMEM;
    zsk_avg_pool2d_backward(out->dtype, &s, zs_data(t[0]),
                            ((const pool_bw_attrs *)c->attrs)->p.count_include_pad,
                            zs_data(out));
    zs_release(t[0]);
    return ZS_OK;
}

static zs_status cpu_max_pool_bw_lowp(const zsi_call *c, zs_tensor *out)
{
    return zsi_via_f32(c, out, cpu_max_pool_bw);
}

static zs_status cpu_avg_pool_bw_lowp(const zsi_call *c, zs_tensor *out)
{
    return zsi_via_f32(c, out, cpu_avg_pool_bw);
}

/* max: one add per output gradient; reads g and the argmax indices */
static zsi_cost max_pool_bw_cost(const zsi_call *c, const zs_tensor *out)
{
    return (zsi_cost){(double)zs_numel(c->in[0]),
                      zsi_bytes(c->in[0]) + zsi_bytes(c->in[1]), zsi_bytes(out)};
}

/* avg: g / count added to each window element */
static zsi_cost avg_pool_bw_cost(const zsi_call *c, const zs_tensor *out)
{
    zsk_pool2d_shape s = bw_shape(c);
    return (zsi_cost){(double)zs_numel(c->in[0]) * (double)(s.kh * s.kw),
                      zsi_bytes(c->in[0]), zsi_bytes(out)};
}

zsi_opdef zsi_def_max_pool_backward = {
    .op = {.name = "max_pool2d_backward"}, .arity = 2, .infer = infer_pool_bw,
    .kernel = {[ZS_CPU] = {[ZS_F32] = cpu_max_pool_bw, [ZS_F64] = cpu_max_pool_bw,
                           [ZS_BF16] = cpu_max_pool_bw_lowp,
                           [ZS_F16] = cpu_max_pool_bw_lowp}},
    .cost = max_pool_bw_cost, .attr_size = sizeof(pool_bw_attrs)};

zsi_opdef zsi_def_avg_pool_backward = {
    .op = {.name = "avg_pool2d_backward"}, .arity = 1, .infer = infer_pool_bw,
    .kernel = {[ZS_CPU] = {[ZS_F32] = cpu_avg_pool_bw, [ZS_F64] = cpu_avg_pool_bw,
                           [ZS_BF16] = cpu_avg_pool_bw_lowp,
                           [ZS_F16] = cpu_avg_pool_bw_lowp}},
    .cost = avg_pool_bw_cost, .attr_size = sizeof(pool_bw_attrs)};

/* The backward descriptor's attributes from n's. */
static pool_bw_attrs bw_attrs(const zsi_ctx *n)
{
    const zsi_meta *m = &n->in_meta[0];
    return (pool_bw_attrs){((const pool_attrs *)zsi_node_attrs(n))->p,
                           m->shape[2], m->shape[3]};
}

static zs_status max_pool_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin)
{
    pool_bw_attrs at = bw_attrs(n);
    gin[0] = zsi_run(&zsi_def_max_pool_backward, 2,
                     (zs_tensor *[]){g, n->saved[0]}, &at);
    return gin[0] ? ZS_OK : ZS_ERR_NOMEM;
}

static zs_status avg_pool_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin)
{
    pool_bw_attrs at = bw_attrs(n);
    gin[0] = zsi_run(&zsi_def_avg_pool_backward, 1, &g, &at);
    return gin[0] ? ZS_OK : ZS_ERR_NOMEM;
}
