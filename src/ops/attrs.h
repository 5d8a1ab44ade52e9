/*
 * ops/attrs.h - attribute structs of operators whose kernels live in more
 * than one file: the CPU kernels beside the descriptor, and another
 * backend's (src/ops/cuda.c) that reads the same struct from c->attrs.
 * Each is the operator's whole attribute struct (ZSI_ATTRS size-checked).
 */
#ifndef ZS_OPS_ATTRS_H
#define ZS_OPS_ATTRS_H

#include "kernels/cpu/optim.h"
#include "ops/op.h"
#include "zs/ops.h"

/* Every binary descriptor (binary.c): the kernel's operation and, for the
 * scalar forms, the scalar (the tensor forms leave it 0). */
typedef struct binary_attrs {
    double s;   /* add_scalar, mul_scalar: a + s, a * s */
    int64_t op; /* zsk_binop */
} binary_attrs;
ZSI_ATTRS(binary_attrs);

/* In-place descriptors (inplace.c). */
typedef struct axpy_attrs {
    double alpha;
} axpy_attrs;
ZSI_ATTRS(axpy_attrs);

typedef struct fill_attrs {
    double value;
} fill_attrs;
ZSI_ATTRS(fill_attrs);

typedef struct scale_attrs {
    double s;
} scale_attrs;
ZSI_ATTRS(scale_attrs);

/* Optimizer updates (optim_update.c): the step's float scalars, computed
 * in double and rounded once. */
typedef struct sgd_update_attrs {
    zsk_sgd_args s;
} sgd_update_attrs;
ZSI_ATTRS(sgd_update_attrs);

typedef struct adam_update_attrs {
    zsk_adam_args a; /* AdamW: a.decoupled, a.decay = 1 - lr * wd */
} adam_update_attrs;
ZSI_ATTRS(adam_update_attrs);

/* sgd_update_dyn, adam_update_dyn (optim_update.c): the hyper-parameters
 * (the step struct's lr, step and grad_scale are read from the inputs),
 * the state buffers among the inputs, whether a gradient scale follows. */
typedef struct update_dyn_attrs {
    zs_sgd_step sgd;   /* sgd_update_dyn */
    zs_adam_step adam; /* adam_update_dyn */
    int32_t nstate;
    bool coef;
} update_dyn_attrs;
ZSI_ATTRS(update_dyn_attrs);

typedef struct clip_coef_attrs {
    double max_norm;
} clip_coef_attrs;
ZSI_ATTRS(clip_coef_attrs);

/* copy and to_dtype (views.c): the dtype of the copy */
typedef struct copy_attrs {
    int64_t dtype; /* zs_dtype */
} copy_attrs;
ZSI_ATTRS(copy_attrs);

/* slice_backward (views.c) */
typedef struct slice_bw_attrs {
    int64_t ndim, shape[ZS_MAX_DIMS]; /* the sliced input's */
    int64_t dim, start, step;         /* normalised dim, clamped start */
} slice_bw_attrs;
ZSI_ATTRS(slice_bw_attrs);

/* every unary descriptor and unary_deriv (unary.c) */
typedef struct unary_attrs {
    double p0, p1;  /* pow: p0 = exponent; clamp: p0 = lo, p1 = hi */
    int64_t kernel; /* zsk_unop */
    int64_t deriv;  /* zsk_unop of the derivative, for mask_bw */
} unary_attrs;
ZSI_ATTRS(unary_attrs);

/* sum and mean (reduce.c) */
typedef struct reduce_attrs {
    int64_t mask; /* bit d: axis d is reduced */
    bool keepdim;
} reduce_attrs;
ZSI_ATTRS(reduce_attrs);

/* linear, linear_gelu, linear_residual (linear.c) */
typedef enum lin_kind { LIN_PLAIN, LIN_GELU, LIN_RESIDUAL } lin_kind;
typedef struct linear_attrs {
    int64_t kind; /* lin_kind */
    int64_t bias; /* the input index of b; -1: none */
    int64_t res;  /* the input index of r; -1: none */
} linear_attrs;
ZSI_ATTRS(linear_attrs);

/* matmul (matmul.c) */
typedef struct matmul_attrs {
    bool trans_a, trans_b;
} matmul_attrs;
ZSI_ATTRS(matmul_attrs);

/* attention and attention_backward (attention.c) */
typedef struct attention_attrs {
    double scale;     /* 0: 1/sqrt(D) */
    int64_t q_offset; /* absolute position of query row 0 */
    bool causal, alibi;
} attention_attrs;
ZSI_ATTRS(attention_attrs);

/* layer_norm and layer_norm_backward (norm.c). Bits of `want` (also
 * batch_norm_backward's): the results the backward descriptors are asked
 * for. */
enum { WANT_GX = 1, WANT_GW = 2, WANT_GB = 4 };
typedef struct layer_norm_attrs {
    double eps;
    int64_t weight, bias; /* input slots of the forward, -1 when absent */
    int64_t want;         /* layer_norm_backward: WANT_* bits */
    /* layer_norm_backward: the dtype of gw and gb (the forward's weight
     * and bias) + 1; 0: x's dtype */
    int64_t pdt1;
} layer_norm_attrs;
ZSI_ATTRS(layer_norm_attrs);

/* cross_entropy and cross_entropy_backward (loss.c) */
typedef struct cross_entropy_attrs {
    int64_t ignore_index; /* rows with this target count for nothing */
    bool f32_loss; /* bf16/f16 logits give an f32 loss (set under autocast) */
} cross_entropy_attrs;
ZSI_ATTRS(cross_entropy_attrs);

/* embedding_backward (embedding.c): V, the weight's rows */
typedef struct embedding_backward_attrs {
    int64_t V; /* rows of the weight, the gradient's first dim */
} embedding_backward_attrs;
ZSI_ATTRS(embedding_backward_attrs);

/* conv2d (conv.c): the params by value (zeros: defaults) */
typedef struct conv_attrs {
    zs_conv2d_params p;
} conv_attrs;
ZSI_ATTRS(conv_attrs);

/* conv2d_backward (conv.c): the forward's params and the gradients wanted */
typedef struct conv_bw_attrs {
    zs_conv2d_params p;
    bool gx, gw, gb;
} conv_bw_attrs;
ZSI_ATTRS(conv_bw_attrs);

/* max_pool2d, avg_pool2d (pool.c): the params by value */
typedef struct pool_attrs {
    zs_pool2d_params p;
} pool_attrs;
ZSI_ATTRS(pool_attrs);

/* their backward descriptors (pool.c): + the input's H and W */
typedef struct pool_bw_attrs {
    zs_pool2d_params p;
    int64_t H, W;
} pool_bw_attrs;
ZSI_ATTRS(pool_bw_attrs);

#endif
