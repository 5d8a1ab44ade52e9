/*
 * kernels/cpu/quant.h - block-quantized weight formats (llama.cpp's Q8_0,
 * Q4_0, Q4_1 layouts) and the matrix product with them, on raw pointers.
 *
 * A weight matrix W [N, K] (row-major, K a multiple of 32) is stored row by
 * row as K / 32 blocks of 32 consecutive weights of a row. Each block holds
 * its scale as IEEE half bits (uint16_t, native endianness) and:
 *   Q8_0 (34 bytes): d, int8 q[32];        w = d * q,       d = max|w| / 127
 *   Q4_0 (18 bytes): d, uint8 qs[16];      w = d * (q - 8), d = v / -8 where
 *                    v is the weight of largest magnitude (sign kept)
 *   Q4_1 (20 bytes): d, m, uint8 qs[16];   w = d * q + m,   d = (max-min)/15,
 *                    m = min
 * Nibbles: byte j holds element j in its low 4 bits, element j + 16 in its
 * high 4 bits. q = round(w / d) with d the scale already rounded to f16
 * (so that the error against the stored scale is at most d / 2), rounding
 * halves away from zero; Q4_0 clamps to [0, 15] (so the one weight -v, when
 * present, is off by up to d), Q4_1 to [0, 15]. A zero block stores d = 0.
 * Scales above the f16 range saturate at 65504; NaN inputs give unspecified
 * blocks (no crash).
 *
 * zsk_qmatmul quantizes each row of x to 32-blocks of int8 on the fly
 * (zsk_block_q8x: f32 scale, sum of the q's) and computes every block's
 * dot product in int32 (exact), scaled by d_w * d_x and summed in f32.
 * Q4_1's offset m enters as m * d_x * sum(q_x). Paths: AVX-512 VNNI
 * (vpdpbusd on 32-byte blocks, signed weights by the abs/sign trick: |w| as
 * unsigned times x with w's sign) when the CPU has AVX512F/BW/VL/VNNI, else
 * plain C int32 loops; both give the same block sums, the f32 summation
 * order differs. This is the layout of checkpoints and the reference
 * product; the inference engine repacks the blocks into 16-row tiles
 * (qpacked.h), 2-5x faster.
 *
 * Errors: every function checks its sizes (n or K a non-negative multiple
 * of 32, M, N >= 0, pointers non-NULL when there is data) and returns
 * ZS_ERR_ARG with a message (zs_last_error) instead of touching memory;
 * ZS_ERR_NOMEM when the activation buffer cannot be allocated. 0 = ok.
 */
#ifndef ZS_KERNELS_CPU_QUANT_H
#define ZS_KERNELS_CPU_QUANT_H

#include <stdbool.h>
#include <stdint.h>

#include "zs/core.h"

#define ZSK_QBLOCK 32 /* weights per block */
#define ZSK_Q8_0_BYTES 34
#define ZSK_Q4_0_BYTES 18
#define ZSK_Q4_1_BYTES 20

typedef enum zsk_qfmt { ZSK_Q8_0, ZSK_Q4_0, ZSK_Q4_1 } zsk_qfmt;

typedef struct zsk_block_q8_0 {
    uint16_t d; /* f16 bits */
    int8_t q[32];
} zsk_block_q8_0;

typedef struct zsk_block_q4_0 {
    uint16_t d;
    uint8_t qs[16];
} zsk_block_q4_0;

typedef struct zsk_block_q4_1 {
    uint16_t d, m;
    uint8_t qs[16];
} zsk_block_q4_1;

/* A block of 32 activations: x ~= d * q, d = max|x| / 127 (f32), q =
 * round(x / d) (halves away from zero), s = sum of q. */
typedef struct zsk_block_q8x {
    float d;
    int32_t s;
    int8_t q[32];
} zsk_block_q8x;

/* Bytes of one block of fmt, or 0 for an unknown fmt. */
int64_t zsk_qblock_bytes(zsk_qfmt fmt);

/* w: n floats -> out: n / 32 blocks (n / 32 * ZSK_*_BYTES bytes, caller's
 * buffer, any alignment). Refuses n not a multiple of 32 (ZS_ERR_ARG). */
zs_status zsk_quantize_q8_0(const float *w, int64_t n, void *out);
zs_status zsk_quantize_q4_0(const float *w, int64_t n, void *out);
zs_status zsk_quantize_q4_1(const float *w, int64_t n, void *out);
/* in: n / 32 blocks -> out: n floats. Same size rule. */
zs_status zsk_dequantize_q8_0(const void *in, int64_t n, float *out);
zs_status zsk_dequantize_q4_0(const void *in, int64_t n, float *out);
zs_status zsk_dequantize_q4_1(const void *in, int64_t n, float *out);
/* Dispatch on fmt to the functions above. */
zs_status zsk_quantize(zsk_qfmt fmt, const float *w, int64_t n, void *out);
zs_status zsk_dequantize(zsk_qfmt fmt, const void *in, int64_t n, float *out);

/* Activations: x: n floats -> out: n / 32 blocks. The AVX-512, AVX2 and
 * portable versions (capped ISA) give the same bits. */
zs_status zsk_quantize_q8x(const float *x, int64_t n, zsk_block_q8x *out);

/* y [M, N] = x [M, K] * W^T, W [N, K] in fmt (N rows of K / 32 blocks).
 * Borrows everything; y is overwritten. Multithreaded over N (the pool).
 * Sizes as in the file comment; M, N or K == 0 is fine (y zeroed when
 * K == 0). */
zs_status zsk_qmatmul(zsk_qfmt fmt, const void *W, const float *x, float *y,
                      int64_t M, int64_t N, int64_t K);

/* Test knob: when on, zsk_qmatmul takes the portable C path whatever the
 * CPU supports. Returns the previous value. Not thread-safe (kernels'
 * test knobs, zs/core.h). */
bool zsk_quant_force_portable(bool on);
/* True when the VNNI path exists in this build and the CPU runs it. */
bool zsk_quant_has_vnni(void);
/* True when the AVX2 + FMA + F16C path exists in this build and the CPU (as
 * capped by ZS_CPU_ISA) runs it; the kernels take it when VNNI is absent. */
bool zsk_quant_has_avx2(void);

#endif
