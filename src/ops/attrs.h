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

#endif
