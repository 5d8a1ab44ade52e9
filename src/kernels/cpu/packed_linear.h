/*
 * kernels/cpu/packed_linear.h - batch-invariant f32 linear layer with the
 * weights packed once: y = act(x W^T + bias) + residual.
 *
 * Batch invariance: the bits of output row m depend only on x's row m, the
 * weights, bias, residual row m and act: never on M, on the other rows of
 * the batch, on m's position in it, on the thread count or on the CPU's
 * vector width. Every output element is accumulated as one sequential
 * chain of fused multiply-adds over k = 0 .. K-1,
 *     acc = 0; for k: acc = fma(x[m, k], W[n, k], acc)
 * whatever the tile, split or code path computes it, so an inference
 * engine can run decode (M = 1) and prefill (M = thousands) through the
 * same function and get the same logits for the same token. The general
 * GEMM (gemm.h) picks its path and K blocking by shape and is not
 * invariant in this sense.
 *
 * Layout (zsk_pack_f32): W [N, K] row-major (PyTorch Linear's [out, in])
 * becomes ceil(N / 64) panels of 64 output columns, each k-major:
 *     data[p * K * 64 + k * 64 + j] = W[p * 64 + j, k]   (0 past N)
 * so an M = 1 product (decode) reads the weights as one sequential stream.
 *
 * Paths: AVX-512 (a tile of up to 6 rows x 64 columns in 24 zmm
 * accumulators) when the CPU has it, else AVX2+FMA (6 rows x 16 columns
 * in 12 ymm, the panel's four strips in turn; M = 1 the whole panel in 8
 * ymm), else portable C with fmaf (same chains, same bits;
 * tests/kernels/test_packed_linear.c checks the vector path taken against
 * the portable one, and runs again under ZS_CPU_ISA=avx2). The
 * pool splits (panel, block of rows) work items; neither split changes a
 * sum. Measured figures: packed_linear.c's file comment.
 */
#ifndef ZS_KERNELS_CPU_PACKED_LINEAR_H
#define ZS_KERNELS_CPU_PACKED_LINEAR_H

#include <stdbool.h>
#include <stdint.h>

#include "zs/core.h"

#define ZSK_PANEL 64 /* output columns per packed panel */

/* Weights packed by zsk_pack_f32. Fields are read-only for users. */
typedef struct zsk_packed_f32 {
    int64_t N, K;    /* W was [N, K] */
    int64_t panels;  /* ceil(N / 64) */
    float *data;     /* owned, 64-byte aligned, panels * K * 64 floats;
                      * NULL when N or K is 0 */
} zsk_packed_f32;

/* Packs W [N, K] (row-major, borrowed) into *out (overwritten; free with
 * zsk_packed_free). N, K >= 0. Errors: ZS_ERR_ARG (NULL pointer, negative
 * or overflowing size), ZS_ERR_NOMEM; on error *out is zeroed. */
zs_status zsk_pack_f32(const float *W, int64_t N, int64_t K, zsk_packed_f32 *out);
/* Frees p's data and zeroes *p; a zeroed struct (or NULL) is a no-op. */
void zsk_packed_free(zsk_packed_f32 *p);

typedef enum zsk_act {
    ZSK_ACT_NONE,
    ZSK_ACT_GELU_TANH, /* GPT-2's 0.5 v (1 + tanh(sqrt(2/pi) (v + 0.044715 v^3))) */
} zsk_act;

/* y[m, n] = act(dot(x[m, :], W[n, :]) + bias[n]) + residual[m, n] for
 * m < M, n < N, the dot as the fma chain of the file comment.
 *   x: [M, K] with row stride ldx >= K; bias: [N] or NULL;
 *   residual: [M, N] with row stride ldr >= N, or NULL; it may be y itself
 *   (residual == y and ldr == ldy: y += ...), no other overlap with y;
 *   y: [M, N] with row stride ldy >= N, written (old contents ignored
 *   unless it is the residual). x must not overlap y.
 * Borrows everything. Multithreaded over the pool. Errors (ZS_ERR_ARG with
 * a message, nothing written): NULL W (or W->data with N, K > 0), NULL x
 * or y with M > 0, M < 0, a stride too small, an unknown act, partial
 * overlap of residual and y. M == 0 or N == 0: nothing to do. */
zs_status zsk_packed_linear_f32(const zsk_packed_f32 *W, const float *x, int64_t M,
                                int64_t ldx, const float *bias, const float *residual,
                                int64_t ldr, zsk_act act, float *y, int64_t ldy);

/* Test knob: when on, the inference kernels (this header, int8_linear.h,
 * qpacked.h, paged_attention.h) take their portable C paths whatever the
 * CPU supports. Returns the
 * previous value. Not thread-safe (kernels' test knobs, zs/core.h). */
bool zsk_linear_force_portable(bool on);

/* ---- shared with int8_linear.c ------------------------------------------ */

/* y[j] = act(acc[j] + bias[j]) + res[j] for j < n, in float: v = acc + bias
 * (when bias), v = gelu(v) (when act), v = v + res (when res). Per element,
 * the same operations in every lane and ISA variant (so the bits of y[j] depend
 * only on acc[j], bias[j], res[j]). GeLU is v / (1 + exp(-2u)) (the same
 * function as 0.5 v (1 + tanh u)) with vmath.h's exp; its error is below
 * 1e-6 * max(1, |v|) (test_packed_linear). bias, res may be NULL; res may
 * be y; acc may be y. */
void zsk_linear_epilogue(const float *acc, int64_t n, const float *bias,
                         const float *res, zsk_act act, float *y);
/* The argument checks every linear kernel shares (who names the kernel in
 * the message): sizes non-negative, a known act, x (when K > 0) and y
 * non-NULL, strides ldx >= K, ldy >= N, ldr >= N, residual either y itself
 * or disjoint from y, x disjoint from y. ZS_OK or ZS_ERR_ARG. */
zs_status zsk_linear_check(const char *who, int64_t N, int64_t K, const float *x, int64_t M,
                           int64_t ldx, const float *residual, int64_t ldr, zsk_act act,
                           const float *y, int64_t ldy);
/* zsk_linear_epilogue of row m's columns [n0, n0 + nc): y + m ldy + n0,
 * residual + m ldr + n0 (NULL: none), bias + n0 (NULL: none). */
void zsk_linear_epilogue_at(const float *acc, int64_t n0, int64_t nc, int64_t m,
                            const float *bias, const float *res, int64_t ldr, zsk_act act,
                            float *y, int64_t ldy);
/* The value of the zsk_linear_force_portable knob. */
bool zsk_linear_portable(void);

#endif
