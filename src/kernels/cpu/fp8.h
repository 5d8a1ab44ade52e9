/*
 * kernels/cpu/fp8.h - FP8 (e4m3, e5m2) with fine-grained scales, as in
 * DeepSeek-V3: quantize, dequantize and a GEMM with f32 accumulation
 * promoted every 128 elements of K. Raw pointers and shapes, no tensors.
 *
 * Formats (OCP FP8): e4m3 has no Inf, largest finite 448, NaN 0x7f/0xff;
 * e5m2 is IEEE-like, largest finite 57344. Both convert exactly to bf16
 * and f32 (at most 4 significant bits, exponents within bf16's).
 *
 * Scales: a matrix X [R, C] is cut into tiles of br rows x 128 columns
 * (br = 1: 1x128 tiles of activations and gradients, br = 128: 128x128
 * blocks of weights; the tiles of the last row and column may be partial).
 * Each tile t has one f32 scale
 *     s_t = amax_t / fmax   (f32 division; fmax = 448 or 57344)
 * where amax_t is the largest |x| of the tile ignoring NaN; s_t = 1 when
 * amax_t is 0, and 2^-149 (the smallest f32) when the division underflows
 * to 0. An element becomes
 *     q = RNE_fp8(x / s_t)
 * rounded to nearest even from the exact quotient (no double rounding),
 * saturated to +-fmax (an overflow never gives Inf, also for e5m2), with
 * the sign of x kept (-0 stays -0); a NaN quotient gives 0x7f (as
 * zs_f32_to_f8e4m3). An Inf in a tile makes its scale Inf: the Inf element
 * becomes NaN and the others +-0. Dequantization is q * s_t in f32.
 * The AVX-512, AVX2 and portable quantizers give identical bits (all
 * compute the quotient in f64, which is exact enough: see fp8.c).
 */
#ifndef ZS_KERNELS_CPU_FP8_H
#define ZS_KERNELS_CPU_FP8_H

#include <stdbool.h>
#include <stdint.h>

#include "zs/core.h"

/* Columns of a tile, and elements of K per promotion in the GEMM. */
#define ZSK_FP8_TILE 128

typedef enum zsk_fp8_fmt { ZSK_FP8_E4M3, ZSK_FP8_E5M2 } zsk_fp8_fmt;

/* Largest finite value: 448 (e4m3), 57344 (e5m2). */
float zsk_fp8_max(zsk_fp8_fmt f);
/* Exact value of code v (NaN for NaN codes, +-Inf for e5m2's Inf). */
float zsk_fp8_to_f32(zsk_fp8_fmt f, uint8_t v);
/* ceil(n / g): tiles along a dim of n elements in groups of g. */
static inline int64_t zsk_fp8_groups(int64_t n, int64_t g)
{
    return (n + g - 1) / g;
}

/* Quantizes x [R, C] into q [R, C] (contiguous) and s [ceil(R / br),
 * ceil(C / 128)] (contiguous), tiles of br x 128 (br >= 1). Element (r, c)
 * of x is x[r * rs + c * cs] (any strides: cs != 1 gathers each tile row,
 * so a transposed view quantizes along its rows without a copy), f32 or,
 * when bf16, raw bf16 bit patterns (uint16_t). Multithreaded over tile
 * rows; vectorised on AVX-512 unless zsk_fp8_force_portable. Borrowed
 * pointers. */
void zsk_fp8_quantize(zsk_fp8_fmt f, bool bf16, const void *x, int64_t R,
                      int64_t C, int64_t rs, int64_t cs, int64_t br,
                      uint8_t *q, float *s);
/* zsk_fp8_quantize with the scales given in s (not computed): q =
 * RNE_fp8(x / s_t), saturated, for scales > 0 (delayed scaling; and how
 * the tests reach saturation). */
void zsk_fp8_quantize_scaled(zsk_fp8_fmt f, bool bf16, const void *x,
                             int64_t R, int64_t C, int64_t rs, int64_t cs,
                             int64_t br, const float *s, uint8_t *q);
/* Quantizes x [R, C] (row stride ldx, unit column stride; f32 or bf16)
 * in tiles of 128 rows x 1 column: the 1x128 tiles of x^T, kept in x's
 * layout (no transpose): q [R, C] (contiguous) and s [ceil(R / 128), C].
 * How dw = g^T x tiles both operands along M (the contraction). Same
 * rounding and paths as zsk_fp8_quantize. */
void zsk_fp8_quantize_cols(zsk_fp8_fmt f, bool bf16, const void *x,
                           int64_t R, int64_t C, int64_t ldx, uint8_t *q,
                           float *s);
/* y [R, C] (contiguous, f32) = q * s, with q [R, C] (row stride ldq) and
 * s as zsk_fp8_quantize writes them for tiles of br x 128. */
void zsk_fp8_dequantize(zsk_fp8_fmt f, const uint8_t *q, int64_t R,
                        int64_t C, int64_t ldq, int64_t br, const float *s,
                        float *y);
/* Test hook: the quantizer takes the portable path whatever the CPU. */
extern bool zsk_fp8_force_portable;

/* ---- GEMM ---------------------------------------------------------------- */

/* An FP8 operand of the GEMM seen as rows x K (the contraction dim):
 * element (r, k) is q[r * rs + k * ks] with rs == 1 or ks == 1, and its
 * scale is s[(r / rg) * srs + (k / 128) * scs]. An activation [M, K] with
 * 1x128 tiles: {q, K, 1, fmt, s, 1, KB, 1} (KB = ceil(K / 128)); a weight
 * [N, K] with 128x128 blocks: {q, K, 1, fmt, s, 128, KB, 1}; the same
 * weight read transposed (rows = its columns, contraction over its rows,
 * as dx = gy w needs): {q, 1, K, fmt, s, 128, 1, KB}. */
typedef struct zsk_fp8_mat {
    const uint8_t *q;
    int64_t rs, ks;
    zsk_fp8_fmt fmt;
    const float *s;
    int64_t rg, srs, scs;
} zsk_fp8_mat;

/* C [M, N] (row stride ldc, f32) = bias[j] + sum over K chunks c of
 *     sa(i, c) * sb(j, c) * sum_{k in chunk c} a(i, k) b(j, k)
 * The chunks are k in [128 c, 128 c + 128) (the last may be shorter); each
 * chunk's sum accumulates in f32 from exact products (the fp8 values
 * widened to bf16: vdpbf16ps on AVX512_BF16 CPUs, f32 FMA elsewhere) and
 * is promoted into the f32 accumulator with the product of its two scales.
 * bias may be NULL. Multithreaded over the pool. Returns ZS_OK, or
 * ZS_ERR_NOMEM (message set, C unspecified) when its buffers cannot be
 * allocated. */
zs_status zsk_gemm_fp8(int64_t M, int64_t N, int64_t K, const zsk_fp8_mat *a,
                       const zsk_fp8_mat *b, const float *bias, float *C,
                       int64_t ldc);

struct zsk_gemm_desc;
/* zsk_gemm_fp8 with the micro-kernel of descriptor d (tests, bench): a
 * bf16 descriptor with kstep 2 (bf16 pairs), or an f32 descriptor (f32
 * panels); NULL: the best the CPU runs (what zsk_gemm_fp8 uses). */
zs_status zsk_gemm_fp8_with(const struct zsk_gemm_desc *d, int64_t M,
                            int64_t N, int64_t K, const zsk_fp8_mat *a,
                            const zsk_fp8_mat *b, const float *bias, float *C,
                            int64_t ldc);
/* Name of the path zsk_gemm_fp8 runs now, e.g. "bf16 avx512bf16 14x32". */
const char *zsk_gemm_fp8_path(void);

/* Widens fp8 codes to bf16 bit patterns (exact): out[i] = bf16(in[i]),
 * n elements, single-threaded (vectorised on AVX-512). */
void zsk_fp8_to_bf16(zsk_fp8_fmt f, const uint8_t *in, int64_t n,
                     uint16_t *out);

#endif
