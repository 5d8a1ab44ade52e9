/*
 * kernels/cuda/cuda.h - the CUDA backend's lowest layer: the device (its
 * caching allocator, copies, streams, events) and kernels on raw device
 * pointers and shapes. Built only when nvcc is found (ZS_HAVE_CUDA); the
 * ops layer (src/ops/cuda.c) registers the device and installs the kernels
 * into the descriptors' tables.
 *
 * Contracts: every pointer a zsk_cuda_* kernel takes is device memory of
 * GPU 0 (cuda:0); kernels are queued on the device's current stream
 * (zsk_cuda_stream(), the legacy default stream unless set) and return
 * before they finish; errors of a launch are reported by the next call
 * that synchronises (and by zsk_cuda_check right after the launch, which
 * catches bad configurations).
 */
#ifndef ZS_KERNELS_CUDA_CUDA_H
#define ZS_KERNELS_CUDA_CUDA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/cpu/optim.h"
#include "zs/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What the runtime says about GPU 0. */
typedef struct zsk_cuda_props {
    char name[256];
    int sms, major, minor;
    size_t total_bytes;
    int runtime_version, driver_version;
} zsk_cuda_props;

/* Number of usable GPUs (0 when there is none or no driver, with the
 * reason in why[n]). Never fails otherwise. */
int zsk_cuda_count(char *why, size_t n);
/* Properties of GPU 0; ZS_OK or negative + message. */
zs_status zsk_cuda_props_get(zsk_cuda_props *p);
/* The device functions (allocator, copies, streams, events) of GPU 0 for
 * zs_device_register. name is "cuda". */
void zsk_cuda_device_ops(zs_device_ops *ops);
/* The stream kernels are queued on (NULL: the legacy default stream). */
void *zsk_cuda_stream(void);
/* After a launch: ZS_OK, or negative + "cuda: <what>: <error>". */
zs_status zsk_cuda_check(const char *what);
/* Releases the allocator's cached blocks back to the driver. */
void zsk_cuda_empty_cache(void);

/* ---- kernels (pointwise.cu) ------------------------------------------ */

/* Element offsets of an n-d strided operand: the kernels index an output
 * of `ndim` dims (contiguous) and up to 3 inputs with their own strides
 * (0 on broadcast dims). */
typedef struct zsk_cuda_iter {
    int ndim;
    int64_t numel;
    int64_t shape[ZS_MAX_DIMS];
    int64_t stride[3][ZS_MAX_DIMS]; /* inputs a, b, c in elements */
} zsk_cuda_iter;

typedef enum zsk_cuda_binop {
    ZSK_CUDA_ADD, ZSK_CUDA_SUB, ZSK_CUDA_MUL, ZSK_CUDA_DIV
} zsk_cuda_binop;

/* out = a op b elementwise (dt ZS_F32 or ZS_BF16; bf16 computed in f32 and
 * rounded to nearest even). out is contiguous with it->shape. */
zs_status zsk_cuda_binary(zsk_cuda_binop op, zs_dtype dt, const zsk_cuda_iter *it,
                          const void *a, const void *b, void *out);
/* x[i] = v for n contiguous elements of dtype dt (f32, bf16, f16). */
zs_status zsk_cuda_fill(zs_dtype dt, void *x, int64_t n, double v);
/* x[i] *= s (f32, bf16). */
zs_status zsk_cuda_scale(zs_dtype dt, void *x, int64_t n, double s);
/* y[i] += a * x[i] (f32). */
zs_status zsk_cuda_axpy(float *y, const float *x, int64_t n, float a);
/* The optimizer updates of kernels/cpu/optim.h over n contiguous f32
 * elements, with the same formulas and the same float scalars (a). */
zs_status zsk_cuda_adam(const zsk_adam_args *a, float *p, float *m, float *v,
                        const float *g, int64_t n);
zs_status zsk_cuda_sgd(const zsk_sgd_args *a, float *p, float *buf,
                       const float *g, int64_t n);
/* *out = (acc ? *acc : 0) + sum of x[i]^2 over n f32 elements, in double,
 * summed in a fixed tree order (bit-identical from run to run; no
 * atomics). out and acc are device pointers to one double. */
zs_status zsk_cuda_sum_squares(const float *x, int64_t n, const double *acc,
                               double *out);

/* ---- data movement and one-input pointwise (elementwise.cu) ----------- */

/* An n-d strided operand: element (i0, .., in) is at p[sum ik stride[k]]
 * (elements; p already includes the tensor's offset). */
typedef struct zsk_cuda_view {
    zs_dtype dt;
    void *p;
    int ndim;
    int64_t shape[ZS_MAX_DIMS];
    int64_t stride[ZS_MAX_DIMS];
} zsk_cuda_view;

/* Element i of dst (row-major over dst's shape) = element i of src
 * (row-major over src's shape); equal numel. Equal dtypes copy raw
 * bytes; conversions round to nearest even. dst must not overlap src. */
zs_status zsk_cuda_copy(const zsk_cuda_view *dst, const zsk_cuda_view *src);
/* out (contiguous, a's shape and dtype: f32 or bf16) = a op (float)s. */
zs_status zsk_cuda_scalar(zsk_cuda_binop op, const zsk_cuda_view *a, double s,
                          void *out);
/* out (contiguous, a's shape and dtype: f32 or bf16) = f(a) for f the
 * zsk_unop op (kernels/cpu/unary.h) with parameters p0, p1, evaluated in
 * double and rounded once. */
zs_status zsk_cuda_unary(int op, const zsk_cuda_view *a, double p0, double p1,
                         void *out);

/* ---- matrix products (gemm.c, cuBLASLt) ------------------------------- */

/* C = op(A) op(B) for each of `batch` matrices, row-major: op(A) [M, K]
 * (A stored [M, K] with row stride lda, or [K, M] when ta), op(B) [K, N]
 * (B stored [K, N], or [N, K] when tb), C [M, N] with row stride ldc;
 * matrix i at A + i sa, B + i sb, C + i sc (elements). in_dt f32 or bf16
 * (f32 accumulation, no TF32); out_dt f32 or bf16. bias: NULL or N f32
 * added to every row (f32 C only). K >= 1. */
typedef struct zsk_cuda_gemm_args {
    zs_dtype in_dt, out_dt;
    bool ta, tb;
    int64_t M, N, K;
    const void *A, *B;
    void *C;
    int64_t lda, ldb, ldc;
    int64_t batch, sa, sb, sc;
    const float *bias;
} zsk_cuda_gemm_args;
zs_status zsk_cuda_gemm(const zsk_cuda_gemm_args *g);

/* The epilogue of linear (pointwise.cu), on [M, N] row-major: v = acc +
 * bias (bias: NULL or N elements of bias_dt); h (f32, may be NULL) = v;
 * out (out_dt, f32 or bf16) = gelu_tanh(v) when gelu, else v + r (r:
 * NULL or [M, N] of out_dt), rounded once. acc may alias out when out_dt
 * is f32. */
zs_status zsk_cuda_linear_epilogue(int64_t M, int64_t N, const float *acc,
                                   zs_dtype bias_dt, const void *bias, bool gelu,
                                   float *h, const void *r, zs_dtype out_dt,
                                   void *out);

#ifdef __cplusplus
}
#endif

#endif
