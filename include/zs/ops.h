/*
 * zs/ops.h - differentiable operators on tensors.
 *
 * Every operator: checks its inputs (a wrong shape or dtype gives NULL and a
 * message naming the operator, the shapes and what was expected), allocates
 * its output, runs a CPU kernel, and, when grad mode is on and an input
 * requires grad, records a node for the backward pass. Each returns a new
 * reference (or NULL). Inputs are borrowed.
 *
 * Float ops compute in f32 or f64 (both operands must share the dtype; f16
 * and bf16 tensors are converted with zs_to_dtype first). Index tensors are
 * i32 or i64; masks and conditions are u8 (non-zero = true).
 * Axes may be negative (counted from the end).
 */
#ifndef ZS_OPS_H
#define ZS_OPS_H

#include "core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- copies and conversions (operators, any device) -------------------- */
/* New contiguous tensor of dtype dt (differentiable for float dtypes). */
zs_tensor *zs_to_dtype(zs_tensor *t, zs_dtype dt);
/* t itself (retained) when contiguous, else a differentiable copy. */
zs_tensor *zs_contiguous(zs_tensor *t);
/* Differentiable copy, always new storage. */
zs_tensor *zs_clone(zs_tensor *t);
/* Same data, no autograd history. Shares storage. */
zs_tensor *zs_detach(zs_tensor *t);
/* Called by backward with the arg given to zs_backward_hook; a failure
 * (negative status, message set) stops the backward. */
typedef zs_status (*zs_backward_hook_fn)(void *ctx, int64_t arg);
/* An alias of t (shares storage) whose backward calls fn(ctx, arg) when
 * the gradient of the alias is complete, before it passes on to t
 * unchanged: everything computed from t before the alias gets its
 * gradient after the call (ZeRO-3 gathers a layer's weights there). With
 * grad mode off or no input needing grad, a plain alias. Returns a new
 * reference. */
zs_tensor *zs_backward_hook(zs_tensor *t, zs_backward_hook_fn fn, void *ctx, int64_t arg);

/* ---- tensors: views (share storage, differentiable) ------------------ */

/* One dim of `shape` may be -1 (inferred). Copies if t's strides cannot
 * express the new shape. */
zs_tensor *zs_reshape(zs_tensor *t, int ndim, const int64_t *shape);
/* Like reshape but fails instead of copying. */
zs_tensor *zs_view(zs_tensor *t, int ndim, const int64_t *shape);
zs_tensor *zs_permute(zs_tensor *t, const int *perm);
zs_tensor *zs_transpose(zs_tensor *t, int d0, int d1);
/* Elements [start, start+len) along dim. Negative dims count from the end. */
zs_tensor *zs_narrow(zs_tensor *t, int dim, int64_t start, int64_t len);
/* Python-style slice along dim with step > 0; end is clamped. */
zs_tensor *zs_slice(zs_tensor *t, int dim, int64_t start, int64_t end,
                    int64_t step);
/* Broadcasts size-1 dims (stride 0); may add leading dims. */
zs_tensor *zs_expand(zs_tensor *t, int ndim, const int64_t *shape);
zs_tensor *zs_squeeze(zs_tensor *t, int dim);   /* dim must have size 1 */
zs_tensor *zs_unsqueeze(zs_tensor *t, int dim);
zs_tensor *zs_flatten(zs_tensor *t, int start_dim, int end_dim);

/* ---- elementwise binary, numpy broadcasting --------------------------- */
zs_tensor *zs_add(zs_tensor *a, zs_tensor *b);
zs_tensor *zs_sub(zs_tensor *a, zs_tensor *b);
zs_tensor *zs_mul(zs_tensor *a, zs_tensor *b);
zs_tensor *zs_div(zs_tensor *a, zs_tensor *b);
/* a + s, a * s with a scalar s (a's dtype). */
zs_tensor *zs_add_scalar(zs_tensor *a, double s);
zs_tensor *zs_mul_scalar(zs_tensor *a, double s);

/* ---- in place ---------------------------------------------------------- */
/* These write into their first argument and record nothing for autograd
 * (optimizers, gradient accumulation, loading weights). The tensors must
 * be on one device. Under grad mode they refuse a destination that
 * requires grad and is not a leaf (its graph may have saved it); leaves,
 * such as parameters, may be written. ZS_OK or a negative status with a
 * message naming the operator. */

/* dst += alpha * src, src broadcast to dst's shape (f32 or f64, one
 * dtype; dst is not a broadcast view). */
zs_status zs_axpy_(zs_tensor *dst, double alpha, const zs_tensor *src);
/* Copies src into dst: same numel, any layouts, any dtypes (converted,
 * rounding to nearest even); a shape that differs is read in row-major
 * order. Across devices src is first copied to dst's device (it must be
 * contiguous unless it is on the CPU), as torch's copy_ does. */
zs_status zs_copy_(zs_tensor *dst, const zs_tensor *src);
/* Every element of t = v (converted to t's dtype). */
zs_status zs_fill_(zs_tensor *t, double v);
/* t *= s (float dtypes; s rounded to t's dtype first, as zs_mul_scalar). */
zs_status zs_scale_(zs_tensor *t, double s);

/* ---- fused optimizer updates -------------------------------------------- */
/* One parameter's optimizer step in place, in one pass over its buffers
 * (as torch's fused _fused_sgd_ / _fused_adam_ for a single tensor): what
 * zs_optim (zs/optim.h) runs per parameter, for a training loop that keeps
 * its own state. p, g and the state buffers: contiguous f32 tensors of p's
 * numel on one device; p and the state are written, g is only read. The
 * step's scalars are computed in double and rounded to f32 once. Under
 * grad mode p may be a leaf (a parameter) but not a non-leaf that requires
 * grad. ZS_OK or a negative status with a message naming the operator. */
typedef struct zs_sgd_step {
    double lr, momentum, weight_decay;
    bool nesterov;
    int64_t step;      /* the 1-based count of this update: at step 1 the
                        * momentum buffer starts as g (PyTorch's rule) */
    double grad_scale; /* g is multiplied by it as it is read (1: none) */
} zs_sgd_step;
typedef struct zs_adam_step {
    double lr, beta1, beta2, eps, weight_decay; /* no defaults: all given */
    bool adamw;        /* decoupled weight decay (AdamW): p *= 1 - lr*wd */
    int64_t step;      /* the 1-based count of this update (bias corrections) */
    double grad_scale; /* as in zs_sgd_step */
} zs_adam_step;
/* SGD: g' = grad_scale*g + wd*p; b = momentum*b + g' (b = g' at step 1);
 * d = nesterov ? g' + momentum*b : b; p -= lr*d. momentum_buf: the buffer
 * b, or NULL for plain SGD (then momentum and nesterov are not used). */
zs_status zs_sgd_update_(zs_tensor *p, const zs_tensor *g, zs_tensor *momentum_buf,
                         const zs_sgd_step *s);
/* Adam (AdamW with s->adamw): with t = s->step, g' = grad_scale*g (+ wd*p
 * for Adam); m = b1*m + (1-b1)*g'; v = b2*v + (1-b2)*g'^2;
 * p -= lr * (m/(1-b1^t)) / (sqrt(v/(1-b2^t)) + eps). */
zs_status zs_adam_update_(zs_tensor *p, const zs_tensor *g, zs_tensor *exp_avg,
                          zs_tensor *exp_avg_sq, const zs_adam_step *s);
/* The same updates with the scalars that change every step read from
 * device memory when the kernel runs, not frozen into the call: what a
 * captured training step (zs/graph.h) replays with new values. sched: a
 * contiguous f64 [2] on p's device holding {lr, step} (step: the 1-based
 * count, a whole number); coef: one f64 element there, the gradient scale
 * (zs_clip_coef_of's result), or NULL for 1. s gives the other
 * hyper-parameters; its lr, step and grad_scale are not used. Same bits as
 * zs_sgd_update_ / zs_adam_update_ given those values. A step < 1 or a
 * scale that is not positive and finite (a NaN gradient norm) fails when
 * the kernel runs, before anything is written. */
zs_status zs_sgd_update_dyn_(zs_tensor *p, const zs_tensor *g, zs_tensor *momentum_buf,
                             const zs_sgd_step *s, zs_tensor *sched, zs_tensor *coef);
zs_status zs_adam_update_dyn_(zs_tensor *p, const zs_tensor *g, zs_tensor *exp_avg,
                              zs_tensor *exp_avg_sq, const zs_adam_step *s,
                              zs_tensor *sched, zs_tensor *coef);
/* The clip factor of a gradient whose sum of squares is sumsq (one f64
 * element, zs_sum_squares' result): zs_clip_coef(sqrt(sumsq), max_norm)
 * (PyTorch's clip_grad_norm_ factor, min(1, max_norm / (norm + 1e-6)),
 * except that a norm <= max_norm gives exactly 1: PyTorch's is just below
 * 1 for norms less than 1e-6 under max_norm), computed on the
 * device, as a new 0-d f64 tensor; NaN when sumsq is NaN, so an update
 * reading it refuses to run. max_norm > 0. Not differentiable. */
zs_tensor *zs_clip_coef_of(zs_tensor *sumsq, double max_norm);
/* acc + the sum of x[i]^2, accumulated in double, as a new 0-d f64 tensor
 * on x's device (acc: a 1-element f64 tensor there, or NULL for 0). A
 * gradient norm over many tensors passes each result on as the next acc
 * and reads the total once (zs_grad_norm). x: any float dtype and layout;
 * the order of the additions is fixed (bit-reproducible). Not
 * differentiable. */
zs_tensor *zs_sum_squares(zs_tensor *x, zs_tensor *acc);

/* The loss scaler's pass over one gradient (zs_grad_scaler, zs/optim.h):
 * g *= inv_scale in place, and found_inf = 1 when an element of g was Inf
 * or NaN (else found_inf is left as it is), in one read of g, as
 * torch._amp_foreach_non_finite_check_and_unscale_. g: contiguous f32 or
 * f64; found_inf: one f32 element on g's device; inv_scale finite > 0.
 * ZS_OK or a negative status naming the operator. */
zs_status zs_unscale_(zs_tensor *g, zs_tensor *found_inf, double inv_scale);

/* ---- elementwise unary ----------------------------------------------- */
typedef enum zs_gelu_approx { ZS_GELU_ERF = 0, ZS_GELU_TANH = 1 } zs_gelu_approx;

zs_tensor *zs_neg(zs_tensor *a);
zs_tensor *zs_exp(zs_tensor *a);
zs_tensor *zs_log(zs_tensor *a);
zs_tensor *zs_sqrt(zs_tensor *a);
zs_tensor *zs_rsqrt(zs_tensor *a);
zs_tensor *zs_pow(zs_tensor *a, double p);   /* a ** p */
zs_tensor *zs_sin(zs_tensor *a);
zs_tensor *zs_cos(zs_tensor *a);
zs_tensor *zs_tanh(zs_tensor *a);
zs_tensor *zs_sigmoid(zs_tensor *a);
zs_tensor *zs_relu(zs_tensor *a);
zs_tensor *zs_gelu(zs_tensor *a, zs_gelu_approx approx);
zs_tensor *zs_silu(zs_tensor *a);
zs_tensor *zs_abs(zs_tensor *a);
zs_tensor *zs_clamp(zs_tensor *a, double lo, double hi);

/* ---- reductions -------------------------------------------------------- */
/* axes == NULL (naxes 0) reduces over all axes. keepdim keeps size-1 dims. */
zs_tensor *zs_sum(zs_tensor *a, int naxes, const int *axes, bool keepdim);
zs_tensor *zs_mean(zs_tensor *a, int naxes, const int *axes, bool keepdim);
/* Unbiased when correction = 1 (divides by n - correction). */
zs_tensor *zs_var(zs_tensor *a, int naxes, const int *axes, int correction,
                  bool keepdim);
zs_tensor *zs_max(zs_tensor *a, int naxes, const int *axes, bool keepdim);
/* Index (i64) of the first maximum along dim. Not differentiable. */
zs_tensor *zs_argmax(zs_tensor *a, int dim, bool keepdim);

/* ---- linear algebra ---------------------------------------------------- */
/* numpy matmul: 1-D operands are promoted, batch dims broadcast.
 * a: [..., M, K], b: [..., K, N] -> [..., M, N]. */
zs_tensor *zs_matmul(zs_tensor *a, zs_tensor *b);
/* Same with op(a) = a^T over the last two dims when trans_a (likewise b);
 * both must have at least 2 dims. */
zs_tensor *zs_matmul_t(zs_tensor *a, zs_tensor *b, bool trans_a, bool trans_b);

/* ---- softmax and losses ---------------------------------------------- */
zs_tensor *zs_softmax(zs_tensor *a, int dim);
zs_tensor *zs_log_softmax(zs_tensor *a, int dim);
/* logits [N, C] (or [..., C], flattened), target [N] of class indices
 * (i32/i64). Mean over targets != ignore_index; 0 when all are ignored. */
zs_tensor *zs_cross_entropy(zs_tensor *logits, zs_tensor *target,
                            int64_t ignore_index);
/* mean((a - b)^2), shapes equal */
zs_tensor *zs_mse_loss(zs_tensor *a, zs_tensor *b);

/* ---- normalisation ---------------------------------------------------- */
/* Normalises over the last dim. weight, bias: [C] or NULL. */
zs_tensor *zs_layer_norm(zs_tensor *x, zs_tensor *weight, zs_tensor *bias,
                         double eps);
/* x: [N, C, ...]. training: batch statistics, and running_mean/var (if not
 * NULL, [C], no grad) are updated in place with momentum (unbiased var);
 * inference: running statistics are used. weight, bias: [C] or NULL. */
zs_tensor *zs_batch_norm(zs_tensor *x, zs_tensor *weight, zs_tensor *bias,
                         zs_tensor *running_mean, zs_tensor *running_var,
                         bool training, double momentum, double eps);

/* ---- embedding, dropout ----------------------------------------------- */
/* weight [V, D], idx any shape (i32/i64) -> [idx..., D] */
zs_tensor *zs_embedding(zs_tensor *weight, zs_tensor *idx);
/* Zeroes with probability p and scales by 1/(1-p) when training; the mask
 * comes from the global counter-based RNG (zs_manual_seed). */
zs_tensor *zs_dropout(zs_tensor *a, double p, bool training);

/* ---- convolution and pooling ------------------------------------------ */
typedef struct zs_conv2d_params {
    int stride[2];   /* h, w; 0 means 1 */
    int padding[2];
    int dilation[2]; /* 0 means 1 */
    int groups;      /* 0 means 1 */
} zs_conv2d_params;

/* x [N, C, H, W], w [O, C/groups, KH, KW], bias [O] or NULL,
 * p may be NULL (stride 1, no padding). -> [N, O, OH, OW] */
zs_tensor *zs_conv2d(zs_tensor *x, zs_tensor *w, zs_tensor *bias,
                     const zs_conv2d_params *p);

typedef struct zs_pool2d_params {
    int kernel[2];
    int stride[2];   /* 0 means kernel */
    int padding[2];
    bool count_include_pad; /* avg pool: divide by the full window */
} zs_pool2d_params;

zs_tensor *zs_max_pool2d(zs_tensor *x, const zs_pool2d_params *p);
zs_tensor *zs_avg_pool2d(zs_tensor *x, const zs_pool2d_params *p);

/* ---- joining, splitting, selection ------------------------------------ */
zs_tensor *zs_concat(int n, zs_tensor *const *ts, int dim);
zs_tensor *zs_stack(int n, zs_tensor *const *ts, int dim);
/* Splits along dim into pieces of the given sizes (summing to the dim);
 * out[i] receive new references (views). */
zs_status zs_split(zs_tensor *t, int dim, int n, const int64_t *sizes,
                   zs_tensor **out);
/* n nearly equal pieces, as torch.chunk (the last may be smaller; fewer
 * than n when the dim is small). Returns the number of pieces or < 0. */
int zs_chunk(zs_tensor *t, int n, int dim, zs_tensor **out);
/* cond ? a : b with broadcasting; cond is u8. */
zs_tensor *zs_where(zs_tensor *cond, zs_tensor *a, zs_tensor *b);
/* a with value where mask (u8, broadcast to a) is non-zero. */
zs_tensor *zs_masked_fill(zs_tensor *a, zs_tensor *mask, double value);
/* Picks slices idx (1-D i32/i64) along dim. */
zs_tensor *zs_index_select(zs_tensor *a, int dim, zs_tensor *idx);
/* out[i][j] = a[idx[i][j]][j] for dim 0 (torch.gather semantics); idx has
 * a's ndim and sizes <= a's sizes off dim. */
zs_tensor *zs_gather(zs_tensor *a, int dim, zs_tensor *idx);

/* ---- cost counters and profiling -------------------------------------- */
typedef struct zs_op_stat {
    const char *name;
    uint64_t calls;
    double flops;         /* from the operator's cost model */
    double bytes;         /* read + written */
    double seconds;       /* measured while profiling is on */
} zs_op_stat;

/* Counters (calls, the cost model's FLOPs and bytes, wall time) accumulate
 * only while enabled (off at start: an operator then pays one load; on, two
 * clock reads and a lock per call). Operators on other threads are counted
 * too; enable and disable while no other thread runs operators. The readers
 * below are thread-safe. */
void zs_profile_enable(bool on);
void zs_profile_reset(void);
/* Fills up to max entries (operators with calls > 0); returns the count. */
int zs_profile_stats(zs_op_stat *out, int max);
double zs_profile_total_flops(void);
/* Prints a table: op, calls, GFLOP, GB, ms, GFLOP/s, GB/s. */
void zs_profile_print(FILE *f);

/* ---- autocast: mixed precision (ops/autocast.c, docs/precision.md) ------ */
/* As torch.autocast: while a low dtype is pushed, operators called on this
 * thread cast their float inputs by their class in one table: matrix
 * products, convolutions and attention in the low dtype (f32
 * accumulation); norms, softmax, reductions and losses in f32 (or on a
 * low-dtype kernel that computes in f32 itself); binary operators on mixed
 * dtypes in the widest; the rest in their input's dtype (f32 where no
 * low-dtype kernel exists). f64 calls are never cast. The casts are
 * differentiable: a parameter (f32 leaf) gets its gradient in f32.
 * backward runs with autocast off. Differences from PyTorch: the table's
 * rows are this library's operators (docs/precision.md); an operator with
 * no kernel for the low dtype runs in f32; fp8 (ZS_F8E4M3) runs the
 * linears (zs_linear, zs_linear_gelu, zs_linear_residual with f32 master
 * weights) as zs_linear_fp8 with their GeLU or residual applied after in
 * f32, and the other products (matmul, conv2d, attention) in bf16
 * (zs_autocast_compute_dtype says which).
 *
 * lowp: ZS_BF16, ZS_F16 or ZS_F8E4M3; ZS_F32 pushes "off" (nestable, as
 * torch.autocast(enabled=False)). Scopes nest up to 16 deep, per thread.
 * The casts of leaves that require grad (parameters) are cached until the
 * scope that made them pops: convert each weight once per scope. */
zs_status zs_autocast_push(zs_dtype lowp);
/* Ends the innermost scope and frees its weight casts. */
zs_status zs_autocast_pop(void);
/* The innermost scope's dtype; ZS_F32 when autocast is off. */
zs_dtype zs_autocast_dtype(void);
/* The dtype matrix products (matmul; the weights' low copies) compute in
 * under lowp on device: lowp, bf16 for fp8 (whose linears quantize the
 * f32 master weights to e4m3 themselves), or f32 where the device has no
 * such GEMM kernel. */
zs_dtype zs_autocast_compute_dtype(zs_dtype lowp, int device);
/* Converts flat (a contiguous f32 buffer holding parameters, such as
 * zs_module_flatten's) in one pass into low (a contiguous tensor of
 * flat's numel in zs_autocast_compute_dtype on flat's device, reused
 * across steps; NULL: one is made) and, until the innermost scope pops,
 * serves the cast of every leaf inside flat's storage as a view of it:
 * one weight conversion per step. Nothing to do (ZS_OK) where the
 * products run in f32. Both are retained by the scope. Write nothing into
 * flat while the scope is open. */
zs_status zs_autocast_cache_flat(zs_tensor *flat, zs_tensor *low);
/* This thread's counters since the last reset. */
typedef struct zs_autocast_stats {
    int64_t weight_casts;      /* conversions of weights: one per leaf cast
                                * or per flat buffer pass */
    int64_t weight_cast_elems; /* elements those conversions wrote */
    int64_t flat_views;        /* leaves first served from a flat pass */
    int64_t cache_hits;        /* later uses of a cached weight cast */
    int64_t casts;             /* casts of other tensors (activations) */
    int64_t fp8_linears;       /* fp8: linears run as zs_linear_fp8 */
} zs_autocast_stats;
void zs_autocast_get_stats(zs_autocast_stats *s);
void zs_autocast_reset_stats(void);

/* ---- the operator table and the test device ---------------------------- */

/* Prints every operator (ops/oplist.h) with its kernels per device and
 * dtype, its autocast class and its backward: what runs where (`zs ops`). */
void zs_ops_print(FILE *f);
/* Prints the CPU's name, the ISA cap (ZS_CPU_ISA, zs/core.h) and the path
 * each CPU kernel family takes under it: GEMM f32/bf16/f16, packed and
 * quantized linears, paged attention, pointwise, convolution, attention,
 * softmax and norms, optimizer (`zs sysinfo`). */
void zs_kernel_paths_print(FILE *f);

/* The test device (id ZS_TEST_DEVICE, name "test"): host memory that the
 * host may not touch (its pages are inaccessible outside the device's own
 * kernels and copies, so a stray read faults), running every CPU kernel
 * behind the driver on aliases of its tensors: a training step that runs
 * there runs through the driver only, and gives the CPU's bits. For tests
 * and for `--device test`. Registers the device once (later calls do
 * nothing); not thread-safe against other threads' operators. */
#define ZS_TEST_DEVICE 7
zs_status zs_test_device_enable(void);
/* Calls of operator op's kernels on the test device since the last reset
 * (-1: no operator of that name). */
int64_t zs_test_device_calls(const char *op);
void zs_test_device_reset_calls(void);

/* The CUDA device (src/ops/cuda.c): registers GPU 0 as ZS_CUDA, named
 * "cuda", with its caching allocator, streams and events, and installs
 * the CUDA kernels into the operators. Later calls do nothing. Fails with
 * the reason (a build without CUDA; no GPU or no driver) and leaves the
 * library as it was. Call before other threads run operators. */
zs_status zs_cuda_enable(void);
/* One line about GPU 0 into buf ("NVIDIA H100 ..., 132 SMs, 79.1 GiB,
 * sm_90, runtime 13.0, driver 13.0", or "none (why)"); 1 when there is
 * one, else 0. Does not register anything. */
int zs_cuda_describe(char *buf, size_t n);

/* ---- FP8 with tile scales (ops/fp8.c) ----------------------------------- */
/* DeepSeek-V3's fine-grained FP8: one f32 scale per tile of block_rows x 128
 * elements (block_rows 1: 1x128 tiles along the last dim, for activations
 * and gradients; 128: 128x128 blocks of a 2-D weight); scale = amax / max
 * finite (448 for f8e4m3, 57344 for f8e5m2; 1 for a zero tile), values
 * x / scale rounded to nearest even and saturated (never Inf; NaN stays
 * NaN). PyTorch has the dtypes (float8_e4m3fn, float8_e5m2) but its casts
 * do not saturate and it keeps no tile scales; this matches DeepGEMM's
 * per-tile quantization (kernels/cpu/fp8.h has the exact contract).
 * Not differentiable. */
/* x [..., C] (f32 or bf16; [R, C] when block_rows > 1) -> *q (dtype fmt,
 * x's shape) and *scales (f32: [..., ceil(C/128)], or [ceil(R/block_rows),
 * ceil(C/128)]), new references; on failure both NULL and a negative
 * status (message set). */
zs_status zs_fp8_quantize(zs_tensor *x, zs_dtype fmt, int64_t block_rows,
                          zs_tensor **q, zs_tensor **scales);
/* q * scales as f32 (q's shape), scales as zs_fp8_quantize made them. */
zs_tensor *zs_fp8_dequantize(zs_tensor *q, zs_tensor *scales,
                             int64_t block_rows);
/* y = x w^T + b in FP8, as zs_linear (x [..., K] f32 or bf16, w [N, K] f32
 * master weights, b [N] f32 or NULL -> y [..., N] f32): x is quantized to
 * e4m3 in 1x128 tiles, w to e4m3 in 128x128 blocks, products accumulate in
 * f32 and are promoted with the scales every 128 of K. Backward: the
 * output gradient in e5m2 (1x128 tiles), dx = g w and dw = g^T x as FP8
 * GEMMs, db in f32; dx has x's dtype. Keeps the e4m3 x (1 byte per
 * element) and w for backward. Relative error of y about 2^-4 against
 * the f32 linear. */
zs_tensor *zs_linear_fp8(zs_tensor *x, zs_tensor *w, zs_tensor *b);

#ifdef __cplusplus
}
#endif
#endif
