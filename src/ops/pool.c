/*
 * pool.c - zs_max_pool2d and zs_avg_pool2d over x [N, C, H, W] (any
 * layout) -> [N, C, OH, OW], OH = floor((H + 2*ph - kh)/sh) + 1, stride 0
 * meaning the kernel size (kernels in kernels/cpu/pool.c).
 *
 * Padding is at most half the kernel, so every window holds a real
 * element. max_pool2d saves the argmax of each window (i64 flat index in
 * its plane) for backward; avg_pool2d's backward spreads g / count over
 * the window. Cost model: kh*kw FLOPs (comparisons or additions) per
 * output element; bytes = input + output (+ indices written).
 */
#include "kernels/cpu/pool.h"
#include "ops/internal.h"

static zs_status max_pool_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin);
static zs_status avg_pool_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin);

static zsi_op OP_MAX_POOL = {.name = "max_pool2d", .backward = max_pool_bw};
static zsi_op OP_AVG_POOL = {.name = "avg_pool2d", .backward = avg_pool_bw};
/* The backward kernels, counted under their own names (not differentiable). */
static zsi_op OP_MAX_POOL_BW = {.name = "max_pool2d_backward"};
static zsi_op OP_AVG_POOL_BW = {.name = "avg_pool2d_backward"};

static zs_status pool_shape(const char *op, const zs_tensor *x,
                            const zs_pool2d_params *p, zsk_pool2d_shape *s)
{
    char sx[96];
    zs_status st = zsi_check_float(op, x);
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

static void save_params(zsi_ctx *n, const zsk_pool2d_shape *s, bool pad)
{
    int64_t v[] = {s->kh, s->kw, s->sh, s->sw, s->ph, s->pw, s->OH, s->OW, pad};
    for (int i = 0; i < 9; i++)
        n->p.i[i] = v[i];
}

static zsk_pool2d_shape load_params(const zsi_ctx *n)
{
    const zsi_meta *m = &n->in_meta[0];
    return (zsk_pool2d_shape){
        .N = m->shape[0], .C = m->shape[1], .H = m->shape[2], .W = m->shape[3],
        .kh = n->p.i[0], .kw = n->p.i[1], .sh = n->p.i[2], .sw = n->p.i[3],
        .ph = n->p.i[4], .pw = n->p.i[5], .OH = n->p.i[6], .OW = n->p.i[7]};
}

zs_tensor *zs_max_pool2d(zs_tensor *x, const zs_pool2d_params *p)
{
    if (!x)
        return NULL;
    double t0 = zsi_op_begin(&OP_MAX_POOL);
    zsk_pool2d_shape s;
    if (pool_shape("max_pool2d", x, p, &s) != ZS_OK)
        return NULL;
    int64_t oshape[4] = {s.N, s.C, s.OH, s.OW};
    zs_tensor *out = zsi_new_tensor(x->dtype, 4, oshape);
    zs_tensor *idx = NULL;
    if (out && zsi_grad_needed(x)) {
        zsi_tracking_pause();
        idx = zsi_new_tensor(ZS_I64, 4, oshape);
        zsi_tracking_resume();
        if (!idx) {
            zs_release(out);
            return NULL;
        }
    }
    if (!out)
        return NULL;
    zsk_max_pool2d(x->dtype, &s, zs_data(x), x->strides, zs_data(out),
                   idx ? zs_data(idx) : NULL);
    zsi_ctx *n;
    if (zsi_record(&OP_MAX_POOL, out, 1, &x, &n) != ZS_OK) {
        zs_release(out);
        zs_release(idx);
        return NULL;
    }
    if (n) {
        zsi_save(n, 0, idx);
        save_params(n, &s, false);
    }
    zs_release(idx);
    double no = (double)zs_numel(out);
    zsi_op_end(&OP_MAX_POOL, t0, no * (double)(s.kh * s.kw), zsi_bytes(x),
               zsi_bytes(out) + (n ? 8 * no : 0));
    return out;
}

zs_tensor *zs_avg_pool2d(zs_tensor *x, const zs_pool2d_params *p)
{
    if (!x)
        return NULL;
    double t0 = zsi_op_begin(&OP_AVG_POOL);
    zsk_pool2d_shape s;
    if (pool_shape("avg_pool2d", x, p, &s) != ZS_OK)
        return NULL;
    zs_tensor *out = zsi_new_tensor(x->dtype, ZS_SHAPE(s.N, s.C, s.OH, s.OW));
    if (!out)
        return NULL;
    zsk_avg_pool2d(x->dtype, &s, zs_data(x), x->strides, p->count_include_pad,
                   zs_data(out));
    zsi_ctx *n;
    if (zsi_record(&OP_AVG_POOL, out, 1, &x, &n) != ZS_OK) {
        zs_release(out);
        return NULL;
    }
    if (n)
        save_params(n, &s, p->count_include_pad);
    zsi_op_end(&OP_AVG_POOL, t0, (double)zs_numel(out) * (double)(s.kh * s.kw),
               zsi_bytes(x), zsi_bytes(out));
    return out;
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
        zsk_avg_pool2d_backward(m->dtype, &s, zs_data(gc), n->p.i[8] != 0,
                                zs_data(gx));
        /* g / count added to each window element */
        zsi_op_end(&OP_AVG_POOL_BW, t0, (double)zs_numel(gc) * (double)(s.kh * s.kw),
                   zsi_bytes(gc), zsi_bytes(gx));
    }
    zs_release(gc);
    gin[0] = gx;
    return gx ? ZS_OK : ZS_ERR_NOMEM;
}
