/*
 * ops/cuda.c - the CUDA backend's entry: registers GPU 0 as device
 * ZS_CUDA ("cuda") and installs its kernels into the descriptors' tables,
 * so the operators users call are the same on both devices (device
 * dispatch, not a second API).
 *
 * Kernels installed (each a thin adapter from a zsi_call to a
 * kernels/cuda launch): here add, sub, mul, div (f32, bf16; broadcasting
 * strides), fill_ (f32, bf16, f16), scale_ (f32, bf16), axpy_,
 * sgd_update, adam_update and sum_squares (f32); in cuda_copy.c copy,
 * to_dtype, copy_, slice_backward (every dtype, converting), add_scalar,
 * mul_scalar, neg and the unary operators with unary_deriv (f32, bf16);
 * in cuda_gemm.c matmul and the linears (cuBLASLt); in cuda_rows.c
 * layer_norm, cross_entropy, embedding (+ backward), sum, mean; in
 * cuda_attention.c attention (+ backward); in cuda_conv.c conv2d and
 * max_pool2d (+ backward, f32): every operator a GPT (gpt2, bloom) or
 * LeNet training step runs (tests/cuda/test_cuda_ops.c). An operator without a
 * CUDA kernel is refused by the driver with a message naming the
 * operator, the device and the dtype. The in-place kernels need
 * contiguous tensors (the flat buffers of the trainer are).
 *
 * Without ZS_HAVE_CUDA (no nvcc at configure time) zs_cuda_enable fails
 * and says so; the rest of the library is unchanged.
 */
#include <stdio.h>
#include <string.h>

#include "ops/internal.h"
#include "zs/ops.h"

#ifdef ZS_HAVE_CUDA

#include "kernels/cpu/iter.h"
#include "kernels/cuda/cuda.h"
#include "ops/attrs.h"
#include "ops/cuda_internal.h"

static zs_status need_contig(const char *op, const zs_tensor *t)
{
    if (zs_is_contiguous(t))
        return ZS_OK;
    char s[96];
    return zs_set_error("%s: a strided %s tensor on cuda: the CUDA kernel needs "
                        "a contiguous one (zs_contiguous)", op,
                        zs_shape_str(t, s, sizeof s));
}

static zs_status k_binary(const zsi_call *c, zs_tensor *out)
{
    const zs_tensor *a = c->in[0], *b = c->in[1];
    zsk_cuda_iter it = {.ndim = out->ndim, .numel = zs_numel(out)};
    memcpy(it.shape, out->shape, sizeof(int64_t) * (size_t)out->ndim);
    zsk_broadcast_strides(a->ndim, a->shape, a->strides, out->ndim, out->shape,
                          it.stride[0]);
    zsk_broadcast_strides(b->ndim, b->shape, b->strides, out->ndim, out->shape,
                          it.stride[1]);
    const binary_attrs *at = c->attrs;
    static const zsk_cuda_binop map[] = {
        [ZSK_ADD] = ZSK_CUDA_ADD, [ZSK_SUB] = ZSK_CUDA_SUB,
        [ZSK_MUL] = ZSK_CUDA_MUL, [ZSK_DIV] = ZSK_CUDA_DIV};
    return zsk_cuda_binary(map[at->op], a->dtype, &it, zsi_ptr(a), zsi_ptr(b),
                           zsi_ptr(out));
}

static zs_status k_fill(const zsi_call *c, zs_tensor *out)
{
    const fill_attrs *a = c->attrs;
    if (need_contig("fill_", c->in[0]) != ZS_OK)
        return ZS_ERR_ARG;
    return zsk_cuda_fill(c->in[0]->dtype, zsi_ptr(c->in[0]), zs_numel(c->in[0]),
                         a->value);
}

static zs_status k_scale(const zsi_call *c, zs_tensor *out)
{
    const scale_attrs *a = c->attrs;
    if (need_contig("scale_", c->in[0]) != ZS_OK)
        return ZS_ERR_ARG;
    return zsk_cuda_scale(c->in[0]->dtype, zsi_ptr(c->in[0]), zs_numel(c->in[0]),
                          a->s);
}

static zs_status k_axpy(const zsi_call *c, zs_tensor *out)
{
    const axpy_attrs *a = c->attrs;
    if (need_contig("axpy_", c->in[0]) != ZS_OK ||
        need_contig("axpy_", c->in[1]) != ZS_OK)
        return ZS_ERR_ARG;
    return zsk_cuda_axpy(zsi_ptr(c->in[0]), zsi_ptr(c->in[1]), zs_numel(c->in[0]),
                         (float)a->alpha);
}

/* infer_update (optim_update.c) checked: contiguous f32 of one numel */
static zs_status k_sgd(const zsi_call *c, zs_tensor *out)
{
    const sgd_update_attrs *a = c->attrs;
    return zsk_cuda_sgd(&a->s, zsi_ptr(c->in[0]),
                        c->nin > 2 ? zsi_ptr(c->in[2]) : NULL, zsi_ptr(c->in[1]),
                        zs_numel(c->in[0]));
}

static zs_status k_adam(const zsi_call *c, zs_tensor *out)
{
    const adam_update_attrs *a = c->attrs;
    return zsk_cuda_adam(&a->a, zsi_ptr(c->in[0]), zsi_ptr(c->in[2]),
                         zsi_ptr(c->in[3]), zsi_ptr(c->in[1]), zs_numel(c->in[0]));
}

static zs_status k_sum_squares(const zsi_call *c, zs_tensor *out)
{
    if (need_contig("sum_squares", c->in[0]) != ZS_OK)
        return ZS_ERR_ARG;
    return zsk_cuda_sum_squares(zsi_ptr(c->in[0]), zs_numel(c->in[0]),
                                c->nin > 1 ? zsi_ptr(c->in[1]) : NULL,
                                zsi_ptr(out));
}

static zs_status install(void)
{
    struct {
        zsi_opdef *def;
        zs_dtype dt;
        zsi_kernel_fn fn;
    } k[] = {
        {&zsi_def_add, ZS_F32, k_binary}, {&zsi_def_add, ZS_BF16, k_binary},
        {&zsi_def_sub, ZS_F32, k_binary}, {&zsi_def_sub, ZS_BF16, k_binary},
        {&zsi_def_mul, ZS_F32, k_binary}, {&zsi_def_mul, ZS_BF16, k_binary},
        {&zsi_def_div, ZS_F32, k_binary}, {&zsi_def_div, ZS_BF16, k_binary},
        {&zsi_def_fill_, ZS_F32, k_fill}, {&zsi_def_fill_, ZS_BF16, k_fill},
        {&zsi_def_fill_, ZS_F16, k_fill},
        {&zsi_def_scale_, ZS_F32, k_scale}, {&zsi_def_scale_, ZS_BF16, k_scale},
        {&zsi_def_axpy_, ZS_F32, k_axpy},
        {&zsi_def_sgd_update, ZS_F32, k_sgd},
        {&zsi_def_adam_update, ZS_F32, k_adam},
        {&zsi_def_sum_squares, ZS_F32, k_sum_squares},
    };
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++)
        if (zsi_op_set_kernel(k[i].def, ZS_CUDA, k[i].dt, k[i].fn) != ZS_OK)
            return ZS_ERR_ARG;
    zs_status (*more[])(void) = {zsi_cuda_install_copy, zsi_cuda_install_gemm,
                                  zsi_cuda_install_rows, zsi_cuda_install_attention,
                                  zsi_cuda_install_conv};
    for (size_t i = 0; i < sizeof more / sizeof *more; i++)
        if (more[i]() != ZS_OK)
            return ZS_ERR_ARG;
    return ZS_OK;
}

zs_status zs_cuda_enable(void)
{
    if (zs_device_get(ZS_CUDA))
        return ZS_OK;
    char why[256] = "";
    if (zsk_cuda_count(why, sizeof why) < 1)
        return zs_set_error("cuda: no GPU (%s)", why);
    zs_device_ops ops;
    zsk_cuda_device_ops(&ops);
    zs_status st = zs_device_register(ZS_CUDA, &ops);
    if (st == ZS_OK)
        st = install();
    return st;
}

int zs_cuda_describe(char *buf, size_t n)
{
    char why[256] = "";
    if (zsk_cuda_count(why, sizeof why) < 1) {
        snprintf(buf, n, "none (%s)", why);
        return 0;
    }
    zsk_cuda_props p;
    if (zsk_cuda_props_get(&p) != ZS_OK) {
        snprintf(buf, n, "none (%s)", zs_last_error());
        return 0;
    }
    snprintf(buf, n, "%s, %d SMs, %.1f GiB, sm_%d%d, runtime %d.%d, driver %d.%d",
             p.name, p.sms, (double)p.total_bytes / (1 << 30), p.major, p.minor,
             p.runtime_version / 1000, p.runtime_version % 1000 / 10,
             p.driver_version / 1000, p.driver_version % 1000 / 10);
    return 1;
}

#else /* no CUDA backend in this build */

zs_status zs_cuda_enable(void)
{
    return zs_set_error("cuda: this build has no CUDA backend (nvcc was not "
                        "found at configure time, or -DZS_CUDA=OFF)");
}

int zs_cuda_describe(char *buf, size_t n)
{
    snprintf(buf, n, "none (built without CUDA)");
    return 0;
}

#endif
