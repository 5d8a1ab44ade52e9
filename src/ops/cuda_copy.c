/*
 * ops/cuda_copy.c - the CUDA adapters of data movement and one-input
 * pointwise operators: copy, to_dtype, copy_ (any layout, any of the
 * dtypes below, converting), slice_backward, add_scalar / mul_scalar and
 * the unary operators with unary_deriv (f32, bf16; strided inputs read in
 * place). Kernels in kernels/cuda/elementwise.cu.
 */
#include <string.h>

#include "ops/cuda_internal.h"

#ifdef ZS_HAVE_CUDA

zs_status zsi_cuda_install(const zsi_cuda_kernel *k, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (zsi_op_set_kernel(k[i].def, ZS_CUDA, k[i].dt, k[i].fn) != ZS_OK)
            return ZS_ERR_ARG;
    return ZS_OK;
}

zsk_cuda_view zsi_cuda_view(const zs_tensor *t)
{
    zsk_cuda_view v = {.dt = t->dtype, .p = zsi_ptr(t), .ndim = t->ndim};
    memcpy(v.shape, t->shape, sizeof(int64_t) * (size_t)t->ndim);
    memcpy(v.stride, t->strides, sizeof(int64_t) * (size_t)t->ndim);
    return v;
}

zs_tensor *zsi_cuda_empty(zs_dtype dt, int ndim, const int64_t *shape)
{
    zsi_tracking_pause();
    zs_tensor *t = zsi_new_tensor_on(ZS_CUDA, dt, ndim, shape);
    zsi_tracking_resume();
    return t;
}

zs_tensor *zsi_cuda_contig(zs_tensor *t)
{
    if (zs_is_contiguous(t))
        return zs_retain(t);
    zs_tensor *c = zsi_cuda_empty(t->dtype, t->ndim, t->shape);
    if (!c)
        return NULL;
    zsk_cuda_view d = zsi_cuda_view(c), s = zsi_cuda_view(t);
    if (zsk_cuda_copy(&d, &s) != ZS_OK) {
        zs_release(c);
        return NULL;
    }
    return c;
}

/* The dtypes the copy kernel converts between (fp8 only copies to
 * itself). */
static bool convertible(zs_dtype dt)
{
    return dt != ZS_F8E4M3 && dt != ZS_F8E5M2;
}

static zs_status copy_into(const char *op, zs_tensor *dst, const zs_tensor *src)
{
    if (dst->dtype != src->dtype && (!convertible(dst->dtype) || !convertible(src->dtype)))
        return zs_set_error("%s: %s -> %s on cuda: no conversion kernel", op,
                            zs_dtype_name(src->dtype), zs_dtype_name(dst->dtype));
    zsk_cuda_view d = zsi_cuda_view(dst), s = zsi_cuda_view(src);
    return zsk_cuda_copy(&d, &s);
}

/* copy and to_dtype: in[0] into out (contiguous, the inferred dtype) */
static zs_status k_copy(const zsi_call *c, zs_tensor *out)
{
    return copy_into(c->def->op.name, out, c->in[0]);
}

/* copy_: in[1] into in[0] (in place, any layout) */
static zs_status k_copy_(const zsi_call *c, zs_tensor *out)
{
    return copy_into("copy_", c->in[0], c->in[1]);
}

/* slice_backward: zeros, then g into the positions start, start + step,
 * ... of dim (views.c's cpu_slice_bw) */
static zs_status k_slice_bw(const zsi_call *c, zs_tensor *out)
{
    const slice_bw_attrs *a = c->attrs;
    const zs_tensor *g = c->in[0];
    int d = (int)a->dim;
    zs_status st = zsi_device_memset(ZS_CUDA, zsi_ptr(out), 0, zs_nbytes(out));
    if (st != ZS_OK || zs_numel(g) == 0)
        return st;
    zsk_cuda_view dst = zsi_cuda_view(out), src = zsi_cuda_view(g);
    memcpy(dst.shape, g->shape, sizeof(int64_t) * (size_t)g->ndim);
    dst.stride[d] *= a->step;
    dst.p = (char *)dst.p + a->start * out->strides[d] * (int64_t)zs_dtype_size(out->dtype);
    return zsk_cuda_copy(&dst, &src);
}

/* add_scalar, mul_scalar: binary_attrs {s, op} */
static zs_status k_scalar(const zsi_call *c, zs_tensor *out)
{
    const binary_attrs *a = c->attrs;
    static const zsk_cuda_binop map[] = {
        [ZSK_ADD] = ZSK_CUDA_ADD, [ZSK_SUB] = ZSK_CUDA_SUB,
        [ZSK_MUL] = ZSK_CUDA_MUL, [ZSK_DIV] = ZSK_CUDA_DIV};
    zsk_cuda_view v = zsi_cuda_view(c->in[0]);
    return zsk_cuda_scalar(map[a->op], &v, a->s, zsi_ptr(out));
}

/* every unary descriptor (its kernel attribute) and unary_deriv */
static zs_status k_unary(const zsi_call *c, zs_tensor *out)
{
    const unary_attrs *a = c->attrs;
    zsk_cuda_view v = zsi_cuda_view(c->in[0]);
    return zsk_cuda_unary((int)a->kernel, &v, a->p0, a->p1, zsi_ptr(out));
}

/* neg: a * -1 */
static zs_status k_neg(const zsi_call *c, zs_tensor *out)
{
    zsk_cuda_view v = zsi_cuda_view(c->in[0]);
    return zsk_cuda_scalar(ZSK_CUDA_MUL, &v, -1.0, zsi_ptr(out));
}

zs_status zsi_cuda_install_copy(void)
{
    static const zs_dtype all[] = {ZS_F32, ZS_F64, ZS_F16, ZS_BF16, ZS_F8E4M3,
                                   ZS_F8E5M2, ZS_I8, ZS_U8, ZS_I32, ZS_I64};
    zsi_opdef *unary[] = {&zsi_def_exp, &zsi_def_log, &zsi_def_sqrt, &zsi_def_rsqrt,
                          &zsi_def_pow, &zsi_def_sin, &zsi_def_cos, &zsi_def_tanh,
                          &zsi_def_sigmoid, &zsi_def_relu, &zsi_def_gelu,
                          &zsi_def_silu, &zsi_def_abs, &zsi_def_clamp, &zsi_def_deriv};
    zsi_cuda_kernel k[64];
    size_t n = 0;
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) {
        k[n++] = (zsi_cuda_kernel){&zsi_def_copy, all[i], k_copy};
        k[n++] = (zsi_cuda_kernel){&zsi_def_to_dtype, all[i], k_copy};
        k[n++] = (zsi_cuda_kernel){&zsi_def_copy_, all[i], k_copy_};
        k[n++] = (zsi_cuda_kernel){&zsi_def_slice_backward, all[i], k_slice_bw};
    }
    for (int d = 0; d < 2; d++) {
        zs_dtype dt = d ? ZS_BF16 : ZS_F32;
        k[n++] = (zsi_cuda_kernel){&zsi_def_add_scalar, dt, k_scalar};
        k[n++] = (zsi_cuda_kernel){&zsi_def_mul_scalar, dt, k_scalar};
        k[n++] = (zsi_cuda_kernel){&zsi_def_neg, dt, k_neg};
    }
    zs_status st = zsi_cuda_install(k, n);
    for (size_t i = 0; st == ZS_OK && i < sizeof unary / sizeof *unary; i++)
        for (int d = 0; st == ZS_OK && d < 2; d++)
            st = zsi_op_set_kernel(unary[i], ZS_CUDA, d ? ZS_BF16 : ZS_F32, k_unary);
    return st;
}

#endif
