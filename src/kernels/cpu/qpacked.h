/*
 * kernels/cpu/qpacked.h - block-quantized weights (Q8_0, Q4_0, Q4_1 of
 * quant.h) repacked once into 16-row tiles for VNNI, and the batch-
 * invariant linear layer on them: y = act(x W^T + bias) + residual.
 *
 * Why a second layout: quant.h's row-major blocks make a matrix-vector
 * product one 32-weight dot per block, horizontal sums and scalar scales;
 * at batch 1 that costs ~10 cycles per Q4_0 block, more than the memory
 * delivers it in. Here one zmm register holds 4 consecutive k of 16 output
 * rows, so one vpdpbusd with 4 activation bytes broadcast does 64 products
 * with no horizontal work, the 16 rows' scales load as one vector, and a
 * tile of weights stays in registers while several activation rows pass
 * over it (prefill, batched decode).
 *
 * Layout: W [N, K] (K a multiple of 32) becomes ceil(N / 16) tiles of
 * tile_bytes each (a multiple of 64, 64-byte aligned); tile t holds rows
 * 16t .. 16t + 15 (rows past N are zero with scale 0). With nb = K / 32
 * blocks and r the row in the tile, a tile is ceil(nb / 2) groups of two
 * blocks (b = 2 g, 2 g + 1; a missing last block is zero), each group:
 *   64 bytes: the 2 x 16 f16 scales d (block 2g's 16 rows, then 2g + 1's),
 *   Q4_1 only: 64 bytes of minimums m, the same way,
 *   then the 2 blocks' data, QB bytes each (QB = 512 for Q8_0, 256 for Q4_*):
 *     Q8_0: byte 64 g + 4 r + j = q[r][32 b + 4 g + j] + 128   (g < 8, j < 4)
 *           (unsigned, so vpdpbusd takes the weights as its u8 operand)
 *     Q4_*: byte 64 g + 4 r + j = qs[r][4 g + j] of quant.h's block: the
 *           low nibble is k = 4 g + j (group g), the high one k = 16 + 4 g
 *           + j (group g + 4); nibbles are unsigned 0 .. 15
 * so that a tile is read as one sequential stream (scales kept in a
 * separate region made two streams per tile).
 *
 * Arithmetic, per output (row n, activation row i), blocks b in order:
 *   s   = sum_k u[n, k] q_x[i, k] - c s_x[i, b]   (int32, exact: |s| < 2^21)
 *         u the unsigned weight code, c = 128 (Q8_0), 8 (Q4_0), 0 (Q4_1),
 *         q_x, s_x the activation block (quant.h's zsk_block_q8x)
 *   acc = fma((float)s, d[n, b] * d_x[i, b], acc)
 *   Q4_1: acc = fma(m[n, b], d_x[i, b] * (float)s_x[i, b], acc)
 * then the epilogue of packed_linear.h. The AVX-512 VNNI path, the AVX2
 * path (vpmaddubsw / vpmaddwd on the same layout, qpacked.c) and the
 * portable C path (fmaf) perform exactly these operations, so all give the
 * same bits, and so do any M, any row position in the batch and any thread
 * count (batch invariance, as in packed_linear.h).
 */
#ifndef ZS_KERNELS_CPU_QPACKED_H
#define ZS_KERNELS_CPU_QPACKED_H

#include <stdint.h>

#include "kernels/cpu/packed_linear.h"
#include "kernels/cpu/quant.h"

#define ZSK_QTILE 16 /* output rows per tile */

/* Fields are read-only for users. */
typedef struct zsk_qpacked {
    zsk_qfmt fmt;
    int64_t N, K;
    int64_t tiles;      /* ceil(N / 16) */
    int64_t tile_bytes; /* bytes per tile, a multiple of 64 */
    uint8_t *data;      /* owned, 64-byte aligned, tiles * tile_bytes bytes;
                         * NULL when N or K is 0 */
} zsk_qpacked;

/* Repacks blocks (quant.h's layout: N rows of K / 32 blocks of fmt,
 * borrowed) into *out (overwritten; free with zsk_qpacked_free). Errors:
 * ZS_ERR_ARG (unknown fmt, K not a multiple of 32, negative sizes, NULL
 * blocks with data), ZS_ERR_NOMEM; on error *out is zeroed. */
zs_status zsk_qpack(zsk_qfmt fmt, const void *blocks, int64_t N, int64_t K,
                    zsk_qpacked *out);
/* The inverse: p back to quant.h's row blocks in blocks (caller's buffer of
 * N * K / 32 blocks), bit for bit what zsk_qpack took. */
zs_status zsk_qunpack(const zsk_qpacked *p, void *blocks);
/* Row n of W dequantized into dst [K] (the bits zsk_dequantize gives). */
zs_status zsk_qpacked_row(const zsk_qpacked *p, int64_t n, float *dst);
/* Bytes of p->data (what one pass over the weights reads). */
int64_t zsk_qpacked_bytes(const zsk_qpacked *p);
/* Frees p's data and zeroes *p; a zeroed struct (or NULL) is a no-op. */
void zsk_qpacked_free(zsk_qpacked *p);

/* y[m, n] = act(dot(x[m, :], W[n, :]) + bias[n]) + residual[m, n], the dot
 * as in the file comment (x's rows quantized per 32-block on the fly).
 * Strides, aliasing, errors and threading as zsk_packed_linear_f32
 * (packed_linear.h); zsk_linear_force_portable selects the portable path.
 * ZS_ERR_NOMEM when the activation buffer cannot be allocated. */
zs_status zsk_qpacked_linear(const zsk_qpacked *p, const float *x, int64_t M,
                             int64_t ldx, const float *bias, const float *residual,
                             int64_t ldr, zsk_act act, float *y, int64_t ldy);

#endif
