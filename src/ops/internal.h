/*
 * ops/internal.h - helpers shared by the operator files.
 */
#ifndef ZS_OPS_INTERNAL_H
#define ZS_OPS_INTERNAL_H

#include "core/internal.h"
#include "kernels/cpu/kernels.h"
#include "ops/op.h"
#include "zs/ops.h"

/* For infer functions (the driver checks devices): fails (message names
 * op) unless t is f32 or f64; unless a and b are and share their dtype. */
zs_status zsi_check_float_dtype(const char *op, const zs_tensor *t);
zs_status zsi_check_pair_dtype(const char *op, const zs_tensor *a,
                               const zs_tensor *b);
/* For descriptors (any device; the driver finds the kernel): fails unless
 * a and b share a float dtype. */
zs_status zsi_check_same_float(const char *op, const zs_tensor *a,
                               const zs_tensor *b);
/* Fails unless t is an i32 or i64 tensor. */
zs_status zsi_check_index(const char *op, const zs_tensor *t);
/* numpy broadcasting of a and b's shapes into (ndim, shape). */
zs_status zsi_broadcast_shape(const char *op, const zs_tensor *a,
                              const zs_tensor *b, int *ndim, int64_t *shape);

/* Reductions (reduce.c). The axes list (NULL/0 = all) as a mask, bit d =
 * axis d; -1 + message naming op on a bad or repeated axis. */
int64_t zsi_axes_bits(const char *op, int ndim, int naxes, const int *axes);
/* keep = shape with the masked dims set to 1; returns the product of the
 * masked dims (R). */
int64_t zsi_reduce_keep(int ndim, const int64_t *shape, int64_t mask,
                        int64_t *keep);
/* The reductions' shape rule, for their infer functions (each reads mask
 * and keepdim from its own attribute struct): an f32 or f64 input; the
 * output has its dtype and the shape with the masked dims dropped (kept as
 * 1 with keepdim). */
zs_status zsi_infer_reduce(zsi_call *c, int64_t mask, bool keepdim);
/* def->flops FLOPs per input element, input read, output written. */
zsi_cost zsi_reduce_cost(const zsi_call *c, const zs_tensor *out);

/* A reduction over the masked axes seen as a contiguous [O, R, K] array: x
 * is a new reference to a contiguous tensor (the input itself, or a
 * permuted copy when the reduced axes are not one block), O = product of
 * kept dims before the block, R = reduced size, K = kept size after. Made
 * without autograd or scope tracking; fails only on allocation. */
typedef struct zsi_reduce_plan {
    zs_tensor *x;
    int64_t O, R, K;
    int64_t keep_shape[ZS_MAX_DIMS]; /* shape with reduced dims = 1 */
} zsi_reduce_plan;
zs_status zsi_reduce_plan_make(zs_tensor *a, int64_t mask, zsi_reduce_plan *p);

/* The derivative kernel `kernel` (a zsk_unop such as ZSK_GELU_TANH_GRAD)
 * of x, elementwise, through the unary_deriv descriptor: a new reference
 * on x's device. */
zs_tensor *zsi_unary_deriv(zs_tensor *x, int kernel, double p0, double p1);
/* g * gelu_tanh'(h) (src/ops/linear.c), a new reference: the fused
 * vector pass linear_gelu_backward (f32, bf16) where g's device has its
 * kernel for g's dtype and h has that dtype; else unary_deriv and mul.
 * The backward of linear_gelu and of zs_gelu's tanh form. */
zs_tensor *zsi_gelu_tanh_grad(zs_tensor *g, zs_tensor *h);

/* For CPU kernels: t itself (retained) when contiguous, else a contiguous
 * host copy (zsi_copy_host: no nested driver call), untracked, no
 * autograd; a new reference, or NULL on allocation failure. */
zs_tensor *zsi_contig_host(zs_tensor *t);

/* Cross-entropy over a shard of the classes (loss.c, its contract there):
 * zsi_row_lse(x [N, C]) -> f64 [N], each row's log-sum-exp, not
 * differentiable; zsi_cross_entropy_shard(z [N, C], t [N], lse [N] f64,
 * count 0-d i64, ignore_index) -> 0-d loss share whose backward is the
 * gradient of the sum over the shards. New references; NULL + message. */
zs_tensor *zsi_row_lse(zs_tensor *x);
zs_tensor *zsi_cross_entropy_shard(zs_tensor *z, zs_tensor *t, zs_tensor *lse,
                                   zs_tensor *count, int64_t ignore_index);

/* In-place gradient accumulation (matmul.c): dst += op(a) op(b) for a
 * contiguous 2-D dst and 2-D a, b (matmul_acc_; ZS_OK or negative +
 * message), and whether dst (NULL allowed) can take it: f32 or f64 like a
 * and b, on a device with the kernel. */
zs_status zsi_matmul_acc_(zs_tensor *dst, zs_tensor *a, zs_tensor *b, bool trans_a,
                          bool trans_b);
bool zsi_matmul_acc_ok(const zs_tensor *dst, const zs_tensor *a, const zs_tensor *b);

/* Bytes of t's elements (for cost models). */
static inline double zsi_bytes(const zs_tensor *t)
{
    return (double)zs_nbytes(t);
}

/* For infer functions of operators with 16-bit float kernels (ops/lowp.c):
 * fails (message names op) unless t is f32, f64, bf16 or f16; unless a
 * and b are and share their dtype. */
zs_status zsi_check_float16_dtype(const char *op, const zs_tensor *t);
zs_status zsi_check_pair_float16(const char *op, const zs_tensor *a,
                                 const zs_tensor *b);
/* zsi_via_f32 for kernels with several results or inputs updated in
 * place (ops/lowp.c): the bf16 / f16 inputs except those whose bit is set
 * in keep (passed as they are: running statistics the kernel updates) are
 * converted to f32 host copies, every bf16 / f16 result (out and
 * c->outs[1..nout)) is computed into an f32 temporary and rounded once
 * into it; aux results are the f32 kernel's (f32 statistics). CPU kernels
 * only. */
zs_status zsi_via_f32_keep(const zsi_call *c, zs_tensor *out,
                           zsi_kernel_fn f32, uint64_t keep);


/* A matrix operand's layout for the GEMMs (ops/matmul.c): when the last
 * two dims of x (R x C) have unit stride in either orientation, *ld gets
 * the other dim's stride (the leading dimension) and *t = trans, or !trans
 * when x is stored transposed; false when neither orientation has unit
 * stride (the caller copies). Size-1 dims take any stride. */
bool zsi_mat_layout(const zs_tensor *x, bool trans, int64_t *ld, bool *t);

#endif
