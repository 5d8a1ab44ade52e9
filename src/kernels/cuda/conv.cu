/*
 * kernels/cuda/conv.cu - 2-D convolution (NCHW, stride, padding,
 * dilation, groups, bias) and max pooling on the GPU, forward and
 * backward, for LeNet-sized models: direct loops, one thread per output
 * element of each pass, so every element has one owner and a fixed
 * summation order (no atomics, bit-identical from run to run):
 *   y[n,o,oh,ow]  = b[o] + sum over (c, kh, kw) of the group x w;
 *   gx[n,c,ih,iw] = sum over (o in the group, kh, kw) hitting (ih, iw);
 *   gw[o,c,kh,kw] = sum over (n, oh, ow) of g x (double);
 *   gb[o]         = sum over (n, oh, ow) of g (double);
 * max pooling keeps the flat argmax (ih W + iw) per window, first on ties,
 * a NaN wins (kernels/cpu/pool.c), and its backward gathers, per input
 * element, the gradients of the windows whose argmax it is, in window
 * order. f32. Simple and correct first: im2col + cuBLASLt is the
 * faster route for large convolutions.
 */
#include <cuda_runtime.h>

#include "kernels/cuda/cuda.h"

namespace {

constexpr int kThreads = 256;

cudaStream_t stream() { return (cudaStream_t)zsk_cuda_stream(); }

int grid_for(int64_t n)
{
    int64_t b = (n + kThreads - 1) / kThreads;
    return (int)(b < 1 ? 1 : b > 132 * 16 ? 132 * 16 : b);
}

#define GRID_LOOP(i, n)                                                        \
    for (int64_t i = blockIdx.x * (int64_t)kThreads + threadIdx.x; i < (n);  \
         i += (int64_t)gridDim.x * kThreads)

/* x through strides xs (n, c, h, w), w and b contiguous, y contiguous */
__global__ void conv_fw(zsk_cuda_conv s, const float *x, zsk_cuda_strides4 xs,
                        const float *w, const float *b, float *y)
{
    int64_t Cg = s.C / s.G, Og = s.O / s.G;
    GRID_LOOP(i, s.N * s.O * s.OH * s.OW) {
        int64_t ow = i % s.OW, oh = i / s.OW % s.OH, o = i / (s.OW * s.OH) % s.O;
        int64_t n = i / (s.OW * s.OH * s.O), g = o / Og;
        float acc = b ? b[o] : 0.f;
        for (int64_t c = 0; c < Cg; c++)
            for (int64_t kh = 0; kh < s.KH; kh++) {
                int64_t ih = oh * s.sh - s.ph + kh * s.dh;
                if (ih < 0 || ih >= s.H)
                    continue;
                for (int64_t kw = 0; kw < s.KW; kw++) {
                    int64_t iw = ow * s.sw - s.pw + kw * s.dw;
                    if (iw < 0 || iw >= s.W)
                        continue;
                    acc += x[n * xs.s[0] + (g * Cg + c) * xs.s[1] + ih * xs.s[2] +
                             iw * xs.s[3]] *
                           w[((o * Cg + c) * s.KH + kh) * s.KW + kw];
                }
            }
        y[i] = acc;
    }
}

/* gx contiguous [N, C, H, W] from g contiguous and w */
__global__ void conv_bw_x(zsk_cuda_conv s, const float *w, const float *g, float *gx)
{
    int64_t Cg = s.C / s.G, Og = s.O / s.G;
    GRID_LOOP(i, s.N * s.C * s.H * s.W) {
        int64_t iw = i % s.W, ih = i / s.W % s.H, c = i / (s.W * s.H) % s.C;
        int64_t n = i / (s.W * s.H * s.C), grp = c / Cg, cc = c % Cg;
        float acc = 0;
        for (int64_t oo = 0; oo < Og; oo++) {
            int64_t o = grp * Og + oo;
            for (int64_t kh = 0; kh < s.KH; kh++) {
                int64_t th = ih + s.ph - kh * s.dh;
                if (th < 0 || th % s.sh)
                    continue;
                int64_t oh = th / s.sh;
                if (oh >= s.OH)
                    continue;
                for (int64_t kw = 0; kw < s.KW; kw++) {
                    int64_t tw = iw + s.pw - kw * s.dw;
                    if (tw < 0 || tw % s.sw)
                        continue;
                    int64_t ow = tw / s.sw;
                    if (ow >= s.OW)
                        continue;
                    acc += g[((n * s.O + o) * s.OH + oh) * s.OW + ow] *
                           w[((o * Cg + cc) * s.KH + kh) * s.KW + kw];
                }
            }
        }
        gx[i] = acc;
    }
}

/* gw [O, C/G, KH, KW] from x (strided) and g */
__global__ void conv_bw_w(zsk_cuda_conv s, const float *x, zsk_cuda_strides4 xs,
                          const float *g, float *gw)
{
    int64_t Cg = s.C / s.G, Og = s.O / s.G;
    GRID_LOOP(i, s.O * Cg * s.KH * s.KW) {
        int64_t kw = i % s.KW, kh = i / s.KW % s.KH, cc = i / (s.KW * s.KH) % Cg;
        int64_t o = i / (s.KW * s.KH * Cg), c = o / Og * Cg + cc;
        double acc = 0;
        for (int64_t n = 0; n < s.N; n++)
            for (int64_t oh = 0; oh < s.OH; oh++) {
                int64_t ih = oh * s.sh - s.ph + kh * s.dh;
                if (ih < 0 || ih >= s.H)
                    continue;
                for (int64_t ow = 0; ow < s.OW; ow++) {
                    int64_t iw = ow * s.sw - s.pw + kw * s.dw;
                    if (iw < 0 || iw >= s.W)
                        continue;
                    acc += (double)g[((n * s.O + o) * s.OH + oh) * s.OW + ow] *
                           x[n * xs.s[0] + c * xs.s[1] + ih * xs.s[2] + iw * xs.s[3]];
                }
            }
        gw[i] = (float)acc;
    }
}

__global__ void conv_bw_b(zsk_cuda_conv s, const float *g, float *gb)
{
    GRID_LOOP(o, s.O) {
        double acc = 0;
        for (int64_t n = 0; n < s.N; n++)
            for (int64_t k = 0; k < s.OH * s.OW; k++)
                acc += g[(n * s.O + o) * s.OH * s.OW + k];
        gb[o] = (float)acc;
    }
}

__global__ void maxpool_fw(zsk_cuda_pool s, const float *x, zsk_cuda_strides4 xs,
                           float *y, int64_t *idx)
{
    GRID_LOOP(i, s.N * s.C * s.OH * s.OW) {
        int64_t ow = i % s.OW, oh = i / s.OW % s.OH, nc = i / (s.OW * s.OH);
        int64_t n = nc / s.C, c = nc % s.C;
        float best = 0;
        int64_t bi = -1;
        for (int64_t kh = 0; kh < s.kh; kh++) {
            int64_t ih = oh * s.sh - s.ph + kh;
            if (ih < 0 || ih >= s.H)
                continue;
            for (int64_t kw = 0; kw < s.kw; kw++) {
                int64_t iw = ow * s.sw - s.pw + kw;
                if (iw < 0 || iw >= s.W)
                    continue;
                float v = x[n * xs.s[0] + c * xs.s[1] + ih * xs.s[2] + iw * xs.s[3]];
                if (bi < 0 || v > best || (isnan(v) && !isnan(best))) {
                    best = v;
                    bi = ih * s.W + iw;
                }
            }
        }
        y[i] = best;
        if (idx)
            idx[i] = bi;
    }
}

/* gx [N, C, H, W] (contiguous) gathers g of the windows whose argmax is it */
__global__ void maxpool_bw(zsk_cuda_pool s, const float *g, const int64_t *idx,
                           float *gx)
{
    GRID_LOOP(i, s.N * s.C * s.H * s.W) {
        int64_t iw = i % s.W, ih = i / s.W % s.H, nc = i / (s.W * s.H);
        int64_t self = ih * s.W + iw;
        float acc = 0;
        for (int64_t oh = 0; oh < s.OH; oh++) {
            int64_t h0 = oh * s.sh - s.ph;
            if (ih < h0 || ih >= h0 + s.kh)
                continue;
            for (int64_t ow = 0; ow < s.OW; ow++) {
                int64_t w0 = ow * s.sw - s.pw;
                if (iw < w0 || iw >= w0 + s.kw)
                    continue;
                int64_t k = (nc * s.OH + oh) * s.OW + ow;
                if (idx[k] == self)
                    acc += g[k];
            }
        }
        gx[i] = acc;
    }
}

} // namespace

extern "C" zs_status zsk_cuda_conv2d(const zsk_cuda_conv *s, const float *x,
                                     const zsk_cuda_strides4 *xs, const float *w,
                                     const float *b, float *y)
{
    int64_t n = s->N * s->O * s->OH * s->OW;
    if (n)
        conv_fw<<<grid_for(n), kThreads, 0, stream()>>>(*s, x, *xs, w, b, y);
    return zsk_cuda_check("conv2d");
}

extern "C" zs_status zsk_cuda_conv2d_backward(const zsk_cuda_conv *s, const float *x,
                                              const zsk_cuda_strides4 *xs,
                                              const float *w, const float *g,
                                              float *gx, float *gw, float *gb)
{
    int64_t nx = s->N * s->C * s->H * s->W, nw = s->O * (s->C / s->G) * s->KH * s->KW;
    if (gx && nx)
        conv_bw_x<<<grid_for(nx), kThreads, 0, stream()>>>(*s, w, g, gx);
    if (gw && nw)
        conv_bw_w<<<grid_for(nw), kThreads, 0, stream()>>>(*s, x, *xs, g, gw);
    if (gb && s->O)
        conv_bw_b<<<grid_for(s->O), kThreads, 0, stream()>>>(*s, g, gb);
    return zsk_cuda_check("conv2d_backward");
}

extern "C" zs_status zsk_cuda_max_pool2d(const zsk_cuda_pool *s, const float *x,
                                         const zsk_cuda_strides4 *xs, float *y,
                                         int64_t *idx)
{
    int64_t n = s->N * s->C * s->OH * s->OW;
    if (n)
        maxpool_fw<<<grid_for(n), kThreads, 0, stream()>>>(*s, x, *xs, y, idx);
    return zsk_cuda_check("max_pool2d");
}

extern "C" zs_status zsk_cuda_max_pool2d_backward(const zsk_cuda_pool *s,
                                                  const float *g, const int64_t *idx,
                                                  float *gx)
{
    int64_t n = s->N * s->C * s->H * s->W;
    if (n)
        maxpool_bw<<<grid_for(n), kThreads, 0, stream()>>>(*s, g, idx, gx);
    return zsk_cuda_check("max_pool2d_backward");
}
