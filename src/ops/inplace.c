/*
 * inplace.c - the in-place operators: axpy_ (dst += alpha * src), copy_
 * (dst <- src, any layouts and dtypes), fill_ (t = v) and scale_ (t *= s).
 *
 * Each is a descriptor with .inplace set (ops/op.h): zsi_run hands the
 * kernel out == in[0], allocates nothing, records no node, and refuses a
 * destination that requires grad and is not a leaf under grad mode. The
 * public functions turn its result into a zs_status. The CPU kernels are
 * the loops these functions ran before they were descriptors (copy and
 * fill live in core as zsi_copy_host / zsi_fill_host, which core also
 * uses for its own host copies), so results are bit-identical.
 */
#include <string.h>

#include "kernels/cpu/lowp.h"
#include "kernels/cpu/optim.h"
#include "ops/attrs.h"
#include "ops/internal.h"


/* ZS_OK, or a negative status when zsi_run failed (message set; a NULL
 * argument keeps the first error). r is in[0], retained, on success. */
static zs_status done(zs_tensor *r)
{
    if (!r)
        return ZS_ERR_ARG;
    zs_release(r);
    return ZS_OK;
}

/* ---- axpy_ --------------------------------------------------------------- */

/* dst, src: one dtype, f32, f64, bf16 or f16 (16-bit: dst + alpha * src
 * computed in f32 and rounded once: the gradient accumulation of a
 * 16-bit leaf, e.g. a recomputed region's input under autocast); src
 * broadcasts to dst's shape; dst is not a broadcast view (two of its
 * elements would be one). The iteration shape (the broadcast of both, of
 * dst's numel) is c's. */
static zs_status infer_axpy(zsi_call *c)
{
    const zs_tensor *dst = c->in[0], *src = c->in[1];
    const char *op = c->def->op.name;
    if (zsi_check_pair_float16(op, dst, src) != ZS_OK)
        return ZS_ERR_ARG;
    zs_status st = zsi_broadcast_shape(op, dst, src, &c->ndim, c->shape);
    if (st != ZS_OK)
        return st;
    if (c->ndim != dst->ndim || zsi_shape_numel(c->ndim, c->shape) != zs_numel(dst)) {
        char a[96], b[96];
        return zs_set_error("%s: source %s does not broadcast to destination "
                            "%s", op, zs_shape_str(src, b, sizeof b),
                            zs_shape_str(dst, a, sizeof a));
    }
    for (int d = 0; d < dst->ndim; d++)
        if (dst->strides[d] == 0 && dst->shape[d] > 1)
            return zs_set_error("%s: destination is a broadcast view", op);
    c->dtype = dst->dtype;
    return ZS_OK;
}

static zs_status cpu_axpy(const zsi_call *c, zs_tensor *dst)
{
    const axpy_attrs *a = c->attrs;
    const zs_tensor *src = c->in[1];
    int64_t ss[ZS_MAX_DIMS];
    zsk_broadcast_strides(src->ndim, src->shape, src->strides, c->ndim, c->shape, ss);
    zsk_iter it;
    zsk_iter_init(&it, c->ndim, c->shape, 2, (const int64_t *[]){dst->strides, ss});
    zsk_axpy(dst->dtype, &it, zs_data(dst), a->alpha, zs_data(src));
    return ZS_OK;
}

/* dst read and written, src read. No FLOPs, as before axpy_ was a
 * descriptor: the step FLOPs that src/analyze/engine_flops.c predicts
 * (and tests/analyze/test_engine_flops.c asserts) leave the leaf
 * accumulation of gradients out. */
static zsi_cost axpy_cost(const zsi_call *c, const zs_tensor *dst)
{
    return (zsi_cost){0, zsi_bytes(dst) + zsi_bytes(c->in[1]), zsi_bytes(dst)};
}

zsi_opdef zsi_def_axpy_ = {
    .op = {.name = "axpy_"}, .arity = 2, .inplace = true,
    .infer = infer_axpy, .cost = axpy_cost, .attr_size = sizeof(axpy_attrs),
    .kernel = {[ZS_CPU] = {[ZS_F32] = cpu_axpy, [ZS_F64] = cpu_axpy,
                           [ZS_BF16] = cpu_axpy, [ZS_F16] = cpu_axpy}},
};

zs_status zs_axpy_(zs_tensor *dst, double alpha, const zs_tensor *src)
{
    axpy_attrs a = {alpha};
    return done(zsi_run(&zsi_def_axpy_, 2, (zs_tensor *[]){dst, (zs_tensor *)src}, &a));
}

/* ---- copy_ --------------------------------------------------------------- */

/* dst, src: equal numel, any shapes, layouts and dtypes. The kernel is
 * dst's dtype's (every dtype has one: the copy converts). */
static zs_status infer_copy(zsi_call *c)
{
    const zs_tensor *dst = c->in[0], *src = c->in[1];
    if (zs_numel(dst) != zs_numel(src)) {
        char a[96], b[96];
        return zs_set_error("%s: destination %s and source %s differ in "
                            "element count", c->def->op.name,
                            zs_shape_str(dst, a, sizeof a),
                            zs_shape_str(src, b, sizeof b));
    }
    zsi_out_like(c, c->in[0]);
    return ZS_OK;
}

static zs_status cpu_copy(const zsi_call *c, zs_tensor *dst)
{
    return zsi_copy_host(dst, c->in[1]);
}

/* src read, dst written */
static zsi_cost copy_cost(const zsi_call *c, const zs_tensor *dst)
{
    return (zsi_cost){0, zsi_bytes(c->in[1]), zsi_bytes(dst)};
}

#define ALL_DTYPES(fn)                                                        \
    {[ZS_F32] = fn, [ZS_F64] = fn, [ZS_F16] = fn, [ZS_BF16] = fn,             \
     [ZS_F8E4M3] = fn, [ZS_F8E5M2] = fn, [ZS_I8] = fn, [ZS_U8] = fn,          \
     [ZS_I32] = fn, [ZS_I64] = fn}

zsi_opdef zsi_def_copy_ = {
    .op = {.name = "copy_"}, .arity = 2, .inplace = true,
    .infer = infer_copy, .cost = copy_cost,
    .kernel = {[ZS_CPU] = ALL_DTYPES(cpu_copy)},
};

zs_status zs_copy_(zs_tensor *dst, const zs_tensor *src)
{
    if (dst && src && dst->device != src->device) {
        /* across devices (as torch's copy_): src moves to dst's device
         * first (one device copy; a strided device view is refused there),
         * then the copy converts layout and dtype on that device */
        zsi_tracking_pause();
        zs_tensor *moved = zs_to_device((zs_tensor *)src, dst->device);
        zsi_tracking_resume();
        zs_status st = moved ? done(zsi_run(&zsi_def_copy_, 2,
                                            (zs_tensor *[]){dst, moved}, NULL))
                             : ZS_ERR_ARG;
        zs_release(moved);
        return st;
    }
    return done(zsi_run(&zsi_def_copy_, 2, (zs_tensor *[]){dst, (zs_tensor *)src}, NULL));
}

/* ---- fill_ --------------------------------------------------------------- */

static zs_status infer_dst(zsi_call *c)
{
    zsi_out_like(c, c->in[0]);
    return ZS_OK;
}

static zs_status cpu_fill(const zsi_call *c, zs_tensor *t)
{
    const fill_attrs *a = c->attrs;
    return zsi_fill_host(t, a->value);
}

/* t written */
static zsi_cost fill_cost(const zsi_call *c, const zs_tensor *t)
{
    return (zsi_cost){0, 0, zsi_bytes(t)};
}

zsi_opdef zsi_def_fill_ = {
    .op = {.name = "fill_"}, .arity = 1, .inplace = true,
    .infer = infer_dst, .cost = fill_cost, .attr_size = sizeof(fill_attrs),
    .kernel = {[ZS_CPU] = ALL_DTYPES(cpu_fill)},
};

zs_status zs_fill_(zs_tensor *t, double v)
{
    fill_attrs a = {v};
    return done(zsi_run(&zsi_def_fill_, 1, &t, &a));
}

/* ---- scale_ -------------------------------------------------------------- */

static zs_status infer_scale(zsi_call *c)
{
    const zs_tensor *t = c->in[0];
    if (!zs_dtype_is_float(t->dtype))
        return zs_set_error("%s: dtype %s is not supported, expected a float "
                            "dtype (convert with zs_to_dtype)", c->def->op.name,
                            zs_dtype_name(t->dtype));
    zsi_out_like(c, c->in[0]);
    return ZS_OK;
}

typedef struct scale_ctx {
    const zsk_iter *it;
    zs_dtype dt;
    void *x; /* the first element */
    double s;
} scale_ctx;

/* x[k] *= s along one segment, as zs_mul_scalar computes it: in f64, in
 * f32 with s rounded to f32, and for 8- and 16-bit floats in f32 rounded
 * once into the dtype. */
static void scale_seg(void *p, const int64_t *offs, int64_t n)
{
    const scale_ctx *c = p;
    int64_t st = c->it->strides[0][c->it->ndim - 1];
    if (c->dt == ZS_F64) {
        double *x = (double *)c->x + offs[0], s = c->s;
        for (int64_t i = 0; i < n; i++)
            x[i * st] *= s;
    } else if (c->dt == ZS_F32) {
        float *x = (float *)c->x + offs[0], s = (float)c->s;
        for (int64_t i = 0; i < n; i++)
            x[i * st] *= s;
    } else {
        float s = (float)c->s;
        for (int64_t i = 0; i < n; i++) {
            int64_t k = offs[0] + i * st;
            float r = (float)zsi_load(c->dt, c->x, k) * s;
            zsi_store(c->dt, c->x, k, r);
        }
    }
}

static zs_status cpu_scale(const zsi_call *c, zs_tensor *t)
{
    const scale_attrs *a = c->attrs;
    if (t->dtype == ZS_F32 && zs_is_contiguous(t)) {
        zsk_scale_f32(zs_data(t), zs_numel(t), (float)a->s);
        return ZS_OK;
    }
    zsk_iter it;
    zsk_iter_init(&it, t->ndim, t->shape, 1, (const int64_t *[]){t->strides});
    scale_ctx sc = {&it, t->dtype, zs_data(t), a->s};
    zsk_iter_parallel(&it, ZSK_GRAIN, scale_seg, &sc);
    return ZS_OK;
}

/* t read and written, a multiply per element */
static zsi_cost scale_cost(const zsi_call *c, const zs_tensor *t)
{
    return (zsi_cost){(double)zs_numel(t), zsi_bytes(t), zsi_bytes(t)};
}

zsi_opdef zsi_def_scale_ = {
    .op = {.name = "scale_"}, .arity = 1, .inplace = true,
    .infer = infer_scale, .cost = scale_cost, .attr_size = sizeof(scale_attrs),
    .kernel = {[ZS_CPU] = {[ZS_F32] = cpu_scale, [ZS_F64] = cpu_scale,
                           [ZS_F16] = cpu_scale, [ZS_BF16] = cpu_scale,
                           [ZS_F8E4M3] = cpu_scale, [ZS_F8E5M2] = cpu_scale}},
};

zs_status zs_scale_(zs_tensor *t, double s)
{
    scale_attrs a = {s};
    return done(zsi_run(&zsi_def_scale_, 1, &t, &a));
}
