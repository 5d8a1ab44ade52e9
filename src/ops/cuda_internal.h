/*
 * ops/cuda_internal.h - helpers shared by the CUDA backend's adapter files
 * (src/ops/cuda*.c): each file turns zsi_calls into kernels/cuda launches
 * and installs its kernels with zsi_op_set_kernel from zs_cuda_enable.
 * Only compiled into builds with ZS_HAVE_CUDA.
 */
#ifndef ZS_OPS_CUDA_INTERNAL_H
#define ZS_OPS_CUDA_INTERNAL_H

#include "kernels/cuda/cuda.h"
#include "ops/attrs.h"
#include "ops/internal.h"

/* One (operator, dtype, kernel) row of an install table. */
typedef struct zsi_cuda_kernel {
    zsi_opdef *def;
    zs_dtype dt;
    zsi_kernel_fn fn;
} zsi_cuda_kernel;

/* Installs the n rows on device ZS_CUDA; ZS_OK or negative + message. */
zs_status zsi_cuda_install(const zsi_cuda_kernel *k, size_t n);

/* t as a kernel operand (its dtype, first element, shape and strides);
 * borrows t. */
zsk_cuda_view zsi_cuda_view(const zs_tensor *t);
/* t itself (retained) when contiguous, else a contiguous copy made on the
 * GPU; untracked, no autograd: a new reference or NULL + message. */
zs_tensor *zsi_cuda_contig(zs_tensor *t);
/* An uninitialised untracked tensor on cuda: a new reference or NULL. */
zs_tensor *zsi_cuda_empty(zs_dtype dt, int ndim, const int64_t *shape);

/* The install functions of the adapter files (called by zs_cuda_enable). */
zs_status zsi_cuda_install_copy(void);
zs_status zsi_cuda_install_rows(void);
zs_status zsi_cuda_install_gemm(void);
zs_status zsi_cuda_install_attention(void);
zs_status zsi_cuda_install_conv(void);

#endif
