/*
 * kernels/cuda/pointwise.cu - memory-bound kernels of the CUDA backend:
 * binary pointwise operators over broadcast strides, fill, scale, axpy,
 * the optimizer updates and the sum of squares of gradient clipping.
 *
 * Each elementwise kernel is a grid-stride loop (one element per thread
 * per trip; the launch uses enough blocks to fill every SM several times).
 * This file is compiled with --fmad=false (CMakeLists.txt) so that every
 * float operation rounds as the CPU kernels' do (they are compiled in ISO
 * C mode, which does not contract a*b+c into an FMA): the update of a
 * parameter is then bit-identical on both devices.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "kernels/cuda/cuda.h"

namespace {

constexpr int kThreads = 256;

/* Blocks for n elements: at most 8 per SM's worth (grid-stride beyond). */
int blocks_for(int64_t n)
{
    int64_t b = (n + kThreads - 1) / kThreads;
    const int64_t cap = 132 * 8; /* H100 SXM: 132 SMs */
    return (int)(b < 1 ? 1 : b > cap ? cap : b);
}

__device__ __forceinline__ float load(const float *p, int64_t i) { return p[i]; }
__device__ __forceinline__ float load(const __nv_bfloat16 *p, int64_t i)
{
    return __bfloat162float(p[i]);
}
__device__ __forceinline__ void store(float *p, int64_t i, float v) { p[i] = v; }
__device__ __forceinline__ void store(__nv_bfloat16 *p, int64_t i, float v)
{
    p[i] = __float2bfloat16_rn(v);
}

template <typename T>
__global__ void binary_kernel(zsk_cuda_binop op, zsk_cuda_iter it, const T *a,
                              const T *b, T *out)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < it.numel;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t rem = i, oa = 0, ob = 0;
        for (int d = it.ndim - 1; d >= 0; d--) {
            int64_t k = rem % it.shape[d];
            rem /= it.shape[d];
            oa += k * it.stride[0][d];
            ob += k * it.stride[1][d];
        }
        float x = load(a, oa), y = load(b, ob), r;
        switch (op) {
        case ZSK_CUDA_ADD: r = x + y; break;
        case ZSK_CUDA_SUB: r = x - y; break;
        case ZSK_CUDA_MUL: r = x * y; break;
        default: r = x / y; break;
        }
        store(out, i, r);
    }
}

template <typename T>
__global__ void fill_kernel(T *x, int64_t n, T v)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        x[i] = v;
}

template <typename T>
__global__ void scale_kernel(T *x, int64_t n, float s)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        store(x, i, load(x, i) * s);
}

__global__ void axpy_kernel(float *y, const float *x, int64_t n, float a)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        y[i] += a * x[i];
}

/* kernels/cpu/optim.c's zsk_adam_f32, element for element */
__global__ void adam_kernel(zsk_adam_args a, float *p, float *m, float *v,
                            const float *g, int64_t n)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        float gi = a.decoupled ? g[i] * a.gscale : g[i] * a.gscale + a.wd * p[i];
        float mi = m[i] + a.one_m_b1 * (gi - m[i]);
        float vi = v[i] * a.b2 + a.one_m_b2 * gi * gi;
        m[i] = mi;
        v[i] = vi;
        float pi = a.decoupled ? p[i] * a.decay : p[i];
        p[i] = pi - a.step_size * (mi / (sqrtf(vi) / a.bc2_sqrt + a.eps));
    }
}

/* kernels/cpu/optim.c's zsk_sgd_f32 */
__global__ void sgd_kernel(zsk_sgd_args a, float *p, float *b, const float *g,
                           int64_t n)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        float gi = g[i] * a.gscale + a.wd * p[i];
        if (!b) {
            p[i] -= a.lr * gi;
            continue;
        }
        float bi = a.first ? gi : a.mu * b[i] + gi;
        b[i] = bi;
        p[i] -= a.lr * (a.nesterov ? gi + a.mu * bi : bi);
    }
}

/* Sum of squares in two launches of fixed shape (kSumBlocks x kThreads,
 * then one block), each summing in a fixed tree order: the result does
 * not depend on scheduling. */
constexpr int kSumBlocks = 1024;
__device__ double sum_partials[kSumBlocks];

__device__ double block_sum(double v)
{
    __shared__ double s[kThreads];
    s[threadIdx.x] = v;
    __syncthreads();
    for (int w = kThreads / 2; w > 0; w /= 2) {
        if ((int)threadIdx.x < w)
            s[threadIdx.x] += s[threadIdx.x + w];
        __syncthreads();
    }
    return s[0];
}

__global__ void sumsq_partial(const float *x, int64_t n)
{
    double acc = 0;
    for (int64_t i = blockIdx.x * (int64_t)kThreads + threadIdx.x; i < n;
         i += (int64_t)kSumBlocks * kThreads) {
        double v = x[i];
        acc += v * v;
    }
    double s = block_sum(acc);
    if (threadIdx.x == 0)
        sum_partials[blockIdx.x] = s;
}

__global__ void sumsq_final(const double *acc, double *out)
{
    double v = 0;
    for (int i = threadIdx.x; i < kSumBlocks; i += kThreads)
        v += sum_partials[i];
    double s = block_sum(v);
    if (threadIdx.x == 0)
        *out = (acc ? *acc : 0.0) + s;
}


/* linear's epilogue: one thread per element of [M, N] */
template <typename TB, typename TO>
__global__ void linear_epilogue_kernel(int64_t M, int64_t N, const float *acc,
                                       const TB *bias, bool gelu, float *h,
                                       const TO *r, TO *out)
{
    int64_t n = M * N;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        float v = acc[i];
        if (bias)
            v += load(bias, i % N);
        if (h)
            h[i] = v;
        if (gelu) { /* kernels/cpu/unary.c's tanh form, in double */
            double x = v, u = 1.5957691216057308 * (x + 0.044715 * x * x * x);
            double s = u >= 0 ? 1.0 / (1.0 + exp(-u)) : exp(u) / (1.0 + exp(u));
            v = (float)(x * s);
        } else if (r) {
            v += load(r, i);
        }
        store(out, i, v);
    }
}

zs_status launched(const char *what) { return zsk_cuda_check(what); }

cudaStream_t stream() { return (cudaStream_t)zsk_cuda_stream(); }

} // namespace

extern "C" zs_status zsk_cuda_binary(zsk_cuda_binop op, zs_dtype dt,
                                     const zsk_cuda_iter *it, const void *a,
                                     const void *b, void *out)
{
    if (it->numel == 0)
        return ZS_OK;
    int g = blocks_for(it->numel);
    if (dt == ZS_F32)
        binary_kernel<<<g, kThreads, 0, stream()>>>(op, *it, (const float *)a,
                                                   (const float *)b, (float *)out);
    else if (dt == ZS_BF16)
        binary_kernel<<<g, kThreads, 0, stream()>>>(
            op, *it, (const __nv_bfloat16 *)a, (const __nv_bfloat16 *)b,
            (__nv_bfloat16 *)out);
    else
        return zs_set_error("cuda binary: dtype %s has no kernel", zs_dtype_name(dt));
    return launched("binary");
}

extern "C" zs_status zsk_cuda_fill(zs_dtype dt, void *x, int64_t n, double v)
{
    if (n == 0)
        return ZS_OK;
    int g = blocks_for(n);
    if (dt == ZS_F32)
        fill_kernel<<<g, kThreads, 0, stream()>>>((float *)x, n, (float)v);
    else if (dt == ZS_BF16)
        fill_kernel<<<g, kThreads, 0, stream()>>>((__nv_bfloat16 *)x, n,
                                                 __float2bfloat16_rn((float)v));
    else if (dt == ZS_F16)
        fill_kernel<<<g, kThreads, 0, stream()>>>((__half *)x, n, __float2half_rn((float)v));
    else
        return zs_set_error("cuda fill: dtype %s has no kernel", zs_dtype_name(dt));
    return launched("fill");
}

extern "C" zs_status zsk_cuda_scale(zs_dtype dt, void *x, int64_t n, double s)
{
    if (n == 0)
        return ZS_OK;
    int g = blocks_for(n);
    if (dt == ZS_F32)
        scale_kernel<<<g, kThreads, 0, stream()>>>((float *)x, n, (float)s);
    else if (dt == ZS_BF16)
        scale_kernel<<<g, kThreads, 0, stream()>>>((__nv_bfloat16 *)x, n, (float)s);
    else
        return zs_set_error("cuda scale: dtype %s has no kernel", zs_dtype_name(dt));
    return launched("scale");
}

extern "C" zs_status zsk_cuda_axpy(float *y, const float *x, int64_t n, float a)
{
    if (n == 0)
        return ZS_OK;
    axpy_kernel<<<blocks_for(n), kThreads, 0, stream()>>>(y, x, n, a);
    return launched("axpy");
}

extern "C" zs_status zsk_cuda_adam(const zsk_adam_args *a, float *p, float *m,
                                   float *v, const float *g, int64_t n)
{
    if (n == 0)
        return ZS_OK;
    adam_kernel<<<blocks_for(n), kThreads, 0, stream()>>>(*a, p, m, v, g, n);
    return launched("adam_update");
}

extern "C" zs_status zsk_cuda_sgd(const zsk_sgd_args *a, float *p, float *buf,
                                  const float *g, int64_t n)
{
    if (n == 0)
        return ZS_OK;
    sgd_kernel<<<blocks_for(n), kThreads, 0, stream()>>>(*a, p, buf, g, n);
    return launched("sgd_update");
}

extern "C" zs_status zsk_cuda_sum_squares(const float *x, int64_t n,
                                          const double *acc, double *out)
{
    sumsq_partial<<<kSumBlocks, kThreads, 0, stream()>>>(x, n);
    sumsq_final<<<1, kThreads, 0, stream()>>>(acc, out);
    return launched("sum_squares");
}

extern "C" zs_status zsk_cuda_linear_epilogue(int64_t M, int64_t N, const float *acc,
                                              zs_dtype bias_dt, const void *bias,
                                              bool gelu, float *h, const void *r,
                                              zs_dtype out_dt, void *out)
{
    if (M * N == 0)
        return ZS_OK;
    if ((out_dt != ZS_F32 && out_dt != ZS_BF16) ||
        (bias && bias_dt != ZS_F32 && bias_dt != ZS_BF16))
        return zs_set_error("cuda linear epilogue: dtypes %s / %s have no kernel",
                            zs_dtype_name(out_dt), zs_dtype_name(bias_dt));
    int g = blocks_for(M * N);
    bool bb = bias && bias_dt == ZS_BF16;
    if (out_dt == ZS_F32 && !bb)
        linear_epilogue_kernel<<<g, kThreads, 0, stream()>>>(
            M, N, acc, (const float *)bias, gelu, h, (const float *)r, (float *)out);
    else if (out_dt == ZS_F32)
        linear_epilogue_kernel<<<g, kThreads, 0, stream()>>>(
            M, N, acc, (const __nv_bfloat16 *)bias, gelu, h, (const float *)r,
            (float *)out);
    else if (!bb)
        linear_epilogue_kernel<<<g, kThreads, 0, stream()>>>(
            M, N, acc, (const float *)bias, gelu, h, (const __nv_bfloat16 *)r,
            (__nv_bfloat16 *)out);
    else
        linear_epilogue_kernel<<<g, kThreads, 0, stream()>>>(
            M, N, acc, (const __nv_bfloat16 *)bias, gelu, h,
            (const __nv_bfloat16 *)r, (__nv_bfloat16 *)out);
    return launched("linear epilogue");
}
