/*
 * kernels/cpu/int8_linear.h - batch-invariant W8A8 linear layer: int8
 * weights with one f32 scale per output row, int8 activations with one
 * scale per input row (LLM.int8()'s vector-wise quantization, SmoothQuant's
 * W8A8), optionally with LLM.int8()'s mixed-precision outlier columns.
 *
 * For each row m of x (every decision below is made per row, so row m's
 * output bits depend only on row m, the weights and the options: never on
 * M, the other rows, the row's position or the thread count):
 *   x'[k]  = x[m, k] * smooth[k]            (smooth NULL: x' = x)
 *   O      = {k : |x'[k]| > threshold}      (empty when threshold <= 0)
 *   x_in   = x' with the columns of O set to 0
 *   sx     = max_k |x_in[k]| / 127,  qx[k] = round(x_in[k] / sx) (halves
 *            away from zero; qx = 0 when sx = 0)
 *   acc[n] = (sx * w_scale[n]) * (float)dot32(qx, Wq[n, :])
 *            + sum_{k in O, increasing} x'[k] * ((float)Wq[n, k] * w_scale[n])
 *            (the outlier sum as an fmaf chain from 0)
 *   y[m,n] = act(acc[n] + bias[n]) + residual[m, n]   (packed_linear.h's
 *            epilogue, zsk_linear_epilogue)
 * dot32 is exact int32 arithmetic (K <= 131072 keeps it in range), so its
 * order does not matter; every float operation above is fixed.
 * bitsandbytes picks the outlier columns over the whole batch (a column is
 * an outlier when any row exceeds the threshold in it) and so is not batch
 * invariant; here each row picks its own.
 *
 * Paths: AVX-512 VNNI (vpdpbusd; the activations are stored as unsigned
 * qx + 128 and 128 * sum_k Wq[n, k], summed by the same kernel, is
 * subtracted: one instruction per 64 products instead of the abs/sign pair
 * of quant.c) when the CPU has AVX512F/BW/VNNI, else AVX2 (vpmaddubsw on
 * |w| and qx with w's sign, vpmaddwd, as llama.cpp's AVX2 path), else
 * portable C; ZS_CPU_ISA caps the choice. All give the same dot32 and
 * share the float code, so the same bits (test_int8_linear checks it). The pool splits blocks of 64 output
 * columns. Measured figures: int8_linear.c's file comment.
 */
#ifndef ZS_KERNELS_CPU_INT8_LINEAR_H
#define ZS_KERNELS_CPU_INT8_LINEAR_H

#include <stdint.h>

#include "kernels/cpu/packed_linear.h"
#include "zs/core.h"

#define ZSK_I8_MAX_K 131072 /* dot32 stays below 2^31 in magnitude */

/* Per-row symmetric quantization of W [N, K] (row-major, borrowed) into q
 * [N, K] and scale [N] (caller's buffers): scale[n] = max_k |W[n, k]| /
 * 127, q[n, k] = round(W[n, k] / scale[n]) with halves away from zero,
 * clamped to [-127, 127]; an all-zero row gets scale 0 and q = 0. NaN
 * weights give unspecified (finite) q, no crash. Errors: ZS_ERR_ARG for
 * negative sizes or NULL pointers (with N * K > 0). */
zs_status zsk_quantize_rows_i8(const float *W, int64_t N, int64_t K, int8_t *q,
                               float *scale);

typedef struct zsk_i8_opts {
    const float *smooth; /* [K] or NULL: x is multiplied by it per column
                          * first (SmoothQuant's 1 / s; the weights were
                          * multiplied by s before quantization) */
    float threshold;     /* > 0: LLM.int8() mixed decomposition: in each
                          * row, columns with |x'| > threshold are computed
                          * in float against the dequantized weights */
} zsk_i8_opts;

/* y [M, N] as in the file comment; o may be NULL (no smoothing, no
 * outliers).
 *   Wq: [N, K] int8 row-major, w_scale: [N] (zsk_quantize_rows_i8);
 *   x: [M, K] with row stride ldx >= K; bias: [N] or NULL;
 *   residual: [M, N] with row stride ldr >= N, or NULL; it may be y itself
 *   (residual == y and ldr == ldy), no other overlap with y;
 *   y: [M, N] with row stride ldy >= N. x must not overlap y.
 * Borrows everything; allocates a workspace of about M * (K + 64) bytes
 * (plus 8 M K bytes when threshold > 0). Multithreaded over the pool.
 * Errors, nothing written: ZS_ERR_ARG (NULL pointer where there is data,
 * negative size, K > ZSK_I8_MAX_K, small stride, unknown act, overlap),
 * ZS_ERR_NOMEM. M == 0 or N == 0: nothing to do. */
zs_status zsk_i8_linear(const int8_t *Wq, const float *w_scale, int64_t N, int64_t K,
                        const float *x, int64_t M, int64_t ldx, const zsk_i8_opts *o,
                        const float *bias, const float *residual, int64_t ldr, zsk_act act,
                        float *y, int64_t ldy);

/* True when the VNNI path exists in this build and the CPU runs it (the
 * kernel takes it unless zsk_linear_force_portable is on). */
bool zsk_i8_has_vnni(void);
/* True when the AVX2 path exists in this build and the (capped) CPU runs
 * it; the kernel takes it when VNNI is not there, unless
 * zsk_linear_force_portable is on. */
bool zsk_i8_has_avx2(void);

#endif
