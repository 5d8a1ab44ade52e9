/*
 * kernels/cpu/conv.h - 2-D convolution (NCHW) on raw pointers.
 *
 * Two paths. f32 on an AVX-512 CPU takes the direct path (conv_direct.c,
 * declared at the end) where it applies: register tiles read straight from
 * padded copies of the images, no column matrix; on an AVX2 CPU (or under
 * ZS_CPU_ISA=avx2) stride-1 convolutions take the AVX2 direct path
 * (conv_direct_avx2.c). Everything else (f64,
 * groups, 1x1 stride-1 kernels, input gradients of < 16 channels, ...)
 * runs the GEMM path (conv.c), built on gemm.h with im2col / col2im:
 *
 * Shapes: x [N, C, H, W] (any element strides), w [O, C/G, KH, KW] and
 * y, gy [N, O, OH, OW] contiguous, bias [O]. Per image and group the
 * convolution is one GEMM: y_g [O/G, P] = w_g [O/G, K] * col [K, P] with
 * K = (C/G)*KH*KW and P = OH*OW; the column buffer covers a tile of output
 * rows so that it stays under ZSK_CONV_COL_BYTES.
 *
 * Threading: small GEMMs run one image per thread (serial GEMMs, private
 * column buffers and weight-gradient accumulators summed in a fixed order,
 * so results depend only on the thread count); large ones run image by
 * image with the multithreaded GEMM.
 */
#ifndef ZS_KERNELS_CPU_CONV_H
#define ZS_KERNELS_CPU_CONV_H

#include <stdbool.h>
#include <stdint.h>

#include "zs/core.h"

/* Bytes of one column buffer (per thread in batch-parallel mode). */
#define ZSK_CONV_COL_BYTES (4 << 20)

typedef struct zsk_conv2d_shape {
    int64_t N, C, H, W;          /* input */
    int64_t O, KH, KW, G;        /* output channels, kernel, groups */
    int64_t OH, OW;              /* output */
    int64_t sh, sw, ph, pw, dh, dw; /* stride, padding, dilation */
} zsk_conv2d_shape;

/* Output size along one axis, floor((n + 2p - d*(k-1) - 1)/s) + 1; may be
 * <= 0 (the caller reports it). */
static inline int64_t zsk_conv_out_size(int64_t n, int64_t k, int64_t s,
                                        int64_t p, int64_t d)
{
    int64_t span = n + 2 * p - d * (k - 1) - 1;
    return span < 0 ? 0 : span / s + 1;
}

/* y = conv(x, w) + bias. dt: ZS_F32, ZS_F64, ZS_BF16 or ZS_F16 (every
 * array of that dtype; bf16/f16 accumulate in f32 and round y once). xs: x's element strides
 * (N, C, H, W). bias may be NULL. Returns ZS_ERR_NOMEM (message set) when
 * the column buffers cannot be allocated. */
zs_status zsk_conv2d_forward(zs_dtype dt, const zsk_conv2d_shape *s,
                             const void *x, const int64_t *xs, const void *w,
                             const void *bias, void *y);

/* Gradients from gy (contiguous [N, O, OH, OW]): gx [N, C, H, W]
 * contiguous, gw [O, C/G, KH, KW], gb [O]; each output may be NULL (not
 * wanted) and is overwritten, not accumulated into (bf16/f16: computed
 * in f32, each rounded once). x (strides xs) is
 * needed only for gw, w only for gx. */
zs_status zsk_conv2d_backward(zs_dtype dt, const zsk_conv2d_shape *s,
                              const void *x, const int64_t *xs, const void *w,
                              const void *gy, void *gx, void *gw, void *gb);

/* ---- direct f32 path (conv_direct.c) ------------------------------------
 * AVX-512 register tiles read straight from padded copies of x and gy, no
 * column matrix. zsk_conv2d_forward/backward take it by themselves when
 * zsk_conv_direct_ok(dt, s): f32, one group, an AVX-512 CPU, column stride
 * <= 2, at most 64 taps, and not a 1x1 stride-1 unpadded kernel (where x
 * itself is the column matrix of the GEMM path), unless the result has
 * few channels on its lanes (conv.c route_of: <= 8 output channels go to
 * the AVX2 direct path where it applies; the input gradient of < 16
 * input channels to the AVX2 direct path or the GEMM path). */
bool zsk_conv_direct_ok(zs_dtype dt, const zsk_conv2d_shape *s);
/* Turns the direct path on or off (tests and benchmarks compare both);
 * returns the previous setting. Not thread-safe against running convs. */
bool zsk_conv_set_direct(bool on);
zs_status zsk_conv2d_direct_forward(const zsk_conv2d_shape *s, const float *x,
                                    const int64_t *xs, const float *w,
                                    const float *bias, float *y);
/* gx and gw as in zsk_conv2d_backward (either may be NULL); no bias. */
zs_status zsk_conv2d_direct_backward(const zsk_conv2d_shape *s,
                                     const float *x, const int64_t *xs,
                                     const float *w, const float *gy,
                                     float *gx, float *gw);

/* ---- direct f32 path on AVX2 + FMA (conv_direct_avx2.c) ----------------
 * Lanes along an output row, no column matrix. zsk_conv2d_forward/backward
 * take it by themselves when the AVX-512 path does not (see above) and
 * zsk_conv_direct_avx2_ok(dt, s): f32, one group, AVX2 and FMA (as capped
 * by ZS_CPU_ISA), stride 1, a padded input plane set under 2^31 elements,
 * and not a 1x1 unpadded kernel; zsk_conv_set_direct turns it off too.
 * The gradients take it for layers of at most 32 input and output channels
 * (conv.c route_of), the input gradient when also
 * zsk_conv_direct_avx2_gx_ok(s) (padding <= (kernel - 1) * dilation on
 * both axes); else the GEMM path. */
bool zsk_conv_direct_avx2_ok(zs_dtype dt, const zsk_conv2d_shape *s);
bool zsk_conv_direct_avx2_gx_ok(const zsk_conv2d_shape *s);
zs_status zsk_conv2d_direct_avx2_forward(const zsk_conv2d_shape *s,
                                         const float *x, const int64_t *xs,
                                         const float *w, const float *bias,
                                         float *y);
/* gx and gw as in zsk_conv2d_backward (either may be NULL); no bias. */
zs_status zsk_conv2d_direct_avx2_backward(const zsk_conv2d_shape *s,
                                          const float *x, const int64_t *xs,
                                          const float *w, const float *gy,
                                          float *gx, float *gw);

#endif
