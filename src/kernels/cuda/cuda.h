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

/* ---- row kernels (rows.cu); all contiguous, no atomics ---------------- */

/* y = (x - mean) rstd w + b over rows of x [R, C] (dt f32 or bf16; w, b of
 * pdt: dt, or f32 for a bf16 x; either may be NULL); mean, rstd: NULL or
 * R f32 values written. */
zs_status zsk_cuda_layer_norm(zs_dtype dt, zs_dtype pdt, const void *x,
                              const void *w, const void *b, int64_t R, int64_t C,
                              double eps, void *y, float *mean, float *rstd);
/* Rows of partial sums the backward's scratch holds: part has
 * 2 * zsk_cuda_layer_norm_parts(R) * C doubles. */
int64_t zsk_cuda_layer_norm_parts(int64_t R);
/* gx (NULL: not wanted), gw, gb ([C] of pdt, each may be NULL) from x, w
 * (may be NULL), the saved mean and rstd, and g [R, C]. */
zs_status zsk_cuda_layer_norm_backward(zs_dtype dt, zs_dtype pdt, const void *x,
                                       const void *w, const float *mean,
                                       const float *rstd, const void *g, int64_t R,
                                       int64_t C, void *gx, void *gw, void *gb,
                                       double *part);
/* One-block check of n indices (i32, or i64 when i64): res (3 device
 * int64) = first position outside [0, hi) that is not ignore (-1: none),
 * its value, the count of indices != ignore. */
zs_status zsk_cuda_index_check(const void *idx, bool i64, int64_t n, int64_t hi,
                               int64_t ignore, int64_t *res);
/* Mean cross entropy of logits x [N, C] (f32, bf16) against targets t:
 * lse[N], loss[N] (double scratch) written, out (one value of odt: dt,
 * or f32 for bf16 logits under autocast) = sum of loss in a fixed order /
 * *count (0 when *count is 0). */
zs_status zsk_cuda_cross_entropy(zs_dtype dt, const void *x, const void *t, bool t64,
                                 int64_t ignore, int64_t N, int64_t C,
                                 const int64_t *count, double *lse, double *loss,
                                 zs_dtype odt, void *out);
/* gx [N, C] = g / count (softmax(x) - onehot(t)), 0 on ignored rows and
 * everywhere when *count is 0; g one value of gdt (f32 or dt). */
zs_status zsk_cuda_cross_entropy_backward(zs_dtype dt, const void *x, const void *t,
                                          bool t64, int64_t ignore, const double *lse,
                                          const int64_t *count, zs_dtype gdt,
                                          const void *g, int64_t N, int64_t C,
                                          void *gx);
/* out [n, D] = rows idx[i] of w (row stride ws0, element stride ws1);
 * indices already checked. */
zs_status zsk_cuda_embedding(zs_dtype dt, const void *w, int64_t ws0, int64_t ws1,
                             const void *idx, bool i64, int64_t n, int64_t D,
                             void *out);
/* out [V, D] (dt f32 or bf16) = sum of g's rows per index, in index order
 * in f32 in acc ([V, D] f32 scratch; may be out itself for f32), rounded
 * once for bf16. Indices outside [0, V) add nothing. */
zs_status zsk_cuda_embedding_backward(zs_dtype dt, const void *idx, bool i64,
                                      int64_t n, const void *g, int64_t V, int64_t D,
                                      float *acc, void *out);
/* out[o, k] = sum over r of x [O, R, K] (times 1/R when mean), in double. */
zs_status zsk_cuda_sum(zs_dtype dt, const void *x, int64_t O, int64_t R, int64_t K,
                       bool mean, void *out);

/* ---- attention (attention.cu) ------------------------------------------ */

/* kernels/cpu/attention.h's zsk_attn on the GPU: q [B, H, Tq, D], k and v
 * [B, H, Tk, D] read through strides of (b, h, t) with unit stride in d;
 * slopes: NULL or H ALiBi slopes in device memory. dt f32 or bf16;
 * D <= 256. */
typedef struct zsk_cuda_attn {
    zs_dtype dt;
    int64_t B, H, Tq, Tk, D;
    const void *q, *k, *v;
    int64_t sq[3], sk[3], sv[3];
    float scale;
    bool causal;
    int64_t q_offset;
    const double *slopes;
} zsk_cuda_attn;
/* o [B, H, Tq, D] contiguous of dt, lse [B, H, Tq] f32 (may be NULL). */
zs_status zsk_cuda_attention_forward(const zsk_cuda_attn *a, void *o, float *lse);
/* dq, dk, dv (contiguous, like q, k, v) from o, lse and dout (contiguous
 * like o); delta: [B, H, Tq] f32 scratch. */
zs_status zsk_cuda_attention_backward(const zsk_cuda_attn *a, const void *o,
                                      const float *lse, const void *dout,
                                      float *delta, void *dq, void *dk, void *dv);

/* ---- convolution and pooling (conv.cu), f32 --------------------------- */

/* kernels/cpu/conv.h's zsk_conv2d_shape and pool.h's zsk_pool2d_shape. */
typedef struct zsk_cuda_conv {
    int64_t N, C, H, W, O, KH, KW, G, OH, OW;
    int64_t sh, sw, ph, pw, dh, dw;
} zsk_cuda_conv;
typedef struct zsk_cuda_pool {
    int64_t N, C, H, W, OH, OW;
    int64_t kh, kw, sh, sw, ph, pw;
} zsk_cuda_pool;
/* Element strides of an [N, C, H, W] input. */
typedef struct zsk_cuda_strides4 {
    int64_t s[4];
} zsk_cuda_strides4;
/* y [N, O, OH, OW] = conv(x (strides xs), w [O, C/G, KH, KW]) + b (NULL:
 * none); w, b, y contiguous. */
zs_status zsk_cuda_conv2d(const zsk_cuda_conv *s, const float *x,
                          const zsk_cuda_strides4 *xs, const float *w, const float *b,
                          float *y);
/* gx (contiguous like x), gw (like w), gb [O] from g (contiguous), each
 * NULL when not wanted. */
zs_status zsk_cuda_conv2d_backward(const zsk_cuda_conv *s, const float *x,
                                   const zsk_cuda_strides4 *xs, const float *w,
                                   const float *g, float *gx, float *gw, float *gb);
/* y [N, C, OH, OW] = window maxima of x; idx (NULL: not wanted) = flat
 * argmax ih W + iw in its plane (first on ties, a NaN wins). */
zs_status zsk_cuda_max_pool2d(const zsk_cuda_pool *s, const float *x,
                              const zsk_cuda_strides4 *xs, float *y, int64_t *idx);
/* gx [N, C, H, W] = the gradients g of the windows whose argmax it is. */
zs_status zsk_cuda_max_pool2d_backward(const zsk_cuda_pool *s, const float *g,
                                       const int64_t *idx, float *gx);

#ifdef __cplusplus
}
#endif

#endif
