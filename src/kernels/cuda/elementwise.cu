/*
 * kernels/cuda/elementwise.cu - data movement and one-input pointwise
 * kernels of the CUDA backend: the strided n-d copy with dtype conversion
 * (copy, copy_, to_dtype, contiguous, slice_backward), the scalar forms
 * (a + s, a * s) and the unary operators with their derivatives.
 *
 * Copy: element i of dst (row-major over dst's shape) takes element i of
 * src (row-major over src's shape): the reshape copy of core/copy.c. Equal
 * dtypes move raw bytes (exact for every dtype, integers included); a
 * conversion goes through double (f32 -> bf16/f16 rounds to nearest even
 * once, as the CPU's zsi_store; f64 -> bf16 rounds through f32).
 * Unary: evaluated in double and rounded once into f32 / bf16, as the CPU's
 * scalar fallback (kernels/cpu/unary.c): the same formulas, CUDA's libm
 * (within an ulp or two of glibc's, so not bit-identical).
 * Compiled with --fmad=false (CMakeLists.txt): a * s rounds as the CPU.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "kernels/cuda/cuda.h"
extern "C" {
#include "kernels/cpu/unary.h"
}

namespace {

constexpr int kThreads = 256;

int blocks_for(int64_t n)
{
    int64_t b = (n + kThreads - 1) / kThreads;
    const int64_t cap = 132 * 16;
    return (int)(b < 1 ? 1 : b > cap ? cap : b);
}

cudaStream_t stream() { return (cudaStream_t)zsk_cuda_stream(); }

/* Offset (elements) of row-major index i in a view. */
__device__ __forceinline__ int64_t view_offset(const zsk_cuda_view &v, int64_t i)
{
    int64_t off = 0;
    for (int d = v.ndim - 1; d >= 0; d--) {
        int64_t s = v.shape[d];
        off += (i % s) * v.stride[d];
        i /= s;
    }
    return off;
}

__device__ __forceinline__ double load_any(zs_dtype dt, const void *p, int64_t i)
{
    switch (dt) {
    case ZS_F32: return ((const float *)p)[i];
    case ZS_F64: return ((const double *)p)[i];
    case ZS_BF16: return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
    case ZS_F16: return __half2float(((const __half *)p)[i]);
    case ZS_I32: return ((const int32_t *)p)[i];
    case ZS_I64: return (double)((const int64_t *)p)[i];
    case ZS_I8: return ((const int8_t *)p)[i];
    case ZS_U8: return ((const uint8_t *)p)[i];
    default: return 0;
    }
}

__device__ __forceinline__ void store_any(zs_dtype dt, void *p, int64_t i, double v)
{
    switch (dt) {
    case ZS_F32: ((float *)p)[i] = (float)v; break;
    case ZS_F64: ((double *)p)[i] = v; break;
    case ZS_BF16: ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn((float)v); break;
    case ZS_F16: ((__half *)p)[i] = __double2half(v); break;
    case ZS_I32: ((int32_t *)p)[i] = (int32_t)v; break;
    case ZS_I64: ((int64_t *)p)[i] = (int64_t)v; break;
    case ZS_I8: ((int8_t *)p)[i] = (int8_t)v; break;
    case ZS_U8: ((uint8_t *)p)[i] = (uint8_t)v; break;
    default: break;
    }
}

template <typename T>
__global__ void copy_raw(zsk_cuda_view dst, zsk_cuda_view src, int64_t n)
{
    T *d = (T *)dst.p;
    const T *s = (const T *)src.p;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        d[view_offset(dst, i)] = s[view_offset(src, i)];
}

__global__ void copy_convert(zsk_cuda_view dst, zsk_cuda_view src, int64_t n)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        store_any(dst.dt, dst.p, view_offset(dst, i),
                  load_any(src.dt, src.p, view_offset(src, i)));
}

__device__ __forceinline__ float ld(const float *p, int64_t i) { return p[i]; }
__device__ __forceinline__ float ld(const __nv_bfloat16 *p, int64_t i)
{
    return __bfloat162float(p[i]);
}
__device__ __forceinline__ void st(float *p, int64_t i, float v) { p[i] = v; }
__device__ __forceinline__ void st(__nv_bfloat16 *p, int64_t i, float v)
{
    p[i] = __float2bfloat16_rn(v);
}

/* out (contiguous) = a op s in float (s rounded to float once, as the CPU) */
template <typename T>
__global__ void scalar_kernel(zsk_cuda_binop op, zsk_cuda_view a, float s, T *out,
                              int64_t n)
{
    const T *x = (const T *)a.p;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        float v = ld(x, view_offset(a, i)), r;
        switch (op) {
        case ZSK_CUDA_ADD: r = v + s; break;
        case ZSK_CUDA_SUB: r = v - s; break;
        case ZSK_CUDA_MUL: r = v * s; break;
        default: r = v / s; break;
        }
        st(out, i, r);
    }
}

/* The constants of kernels/cpu/unary.c */
#define GELU_C1 1.5957691216057308
#define GELU_K 0.044715

__device__ double sigmoid_d(double v)
{
    if (v >= 0)
        return 1.0 / (1.0 + exp(-v));
    double e = exp(v);
    return e / (1.0 + e);
}

/* kernels/cpu/unary.c's double formulas, op by op (zsk_unop numbering) */
__device__ double unary_d(int op, double x, double p0, double p1)
{
    switch (op) {
    case ZSK_EXP: return exp(x);
    case ZSK_LOG: return log(x);
    case ZSK_SQRT: return sqrt(x);
    case ZSK_RSQRT: return 1.0 / sqrt(x);
    case ZSK_POW: return p0 == 2.0 ? x * x : pow(x, p0);
    case ZSK_SIN: return sin(x);
    case ZSK_COS: return cos(x);
    case ZSK_TANH: return tanh(x);
    case ZSK_SIGMOID: return sigmoid_d(x);
    case ZSK_RELU: return x < 0 ? 0.0 : x;
    case ZSK_GELU_ERF:
        return isinf(x) && x < 0 ? -0.0 : x * 0.5 * erfc(-x * 0.70710678118654752440);
    case ZSK_GELU_TANH:
        return isinf(x) && x < 0 ? -0.0 : x * sigmoid_d(GELU_C1 * (x + GELU_K * x * x * x));
    case ZSK_SILU: return isinf(x) && x < 0 ? -0.0 : x * sigmoid_d(x);
    case ZSK_ABS: return fabs(x);
    case ZSK_CLAMP: return x < p0 ? p0 : x > p1 ? p1 : x;
    case ZSK_STEP: return x > 0 ? 1.0 : 0.0;
    case ZSK_SIGN: return x > 0 ? 1.0 : x < 0 ? -1.0 : 0.0;
    case ZSK_INRANGE: return x >= p0 && x <= p1 ? 1.0 : 0.0;
    case ZSK_GELU_ERF_GRAD:
        return 0.5 * erfc(-x * 0.70710678118654752440) +
               x * exp(-0.5 * x * x) * 0.39894228040143267794;
    case ZSK_GELU_TANH_GRAD: {
        double s = sigmoid_d(GELU_C1 * (x + GELU_K * x * x * x));
        return s + x * s * (1 - s) * GELU_C1 * (1 + 3 * GELU_K * x * x);
    }
    case ZSK_SILU_GRAD: {
        double s = sigmoid_d(x);
        return s * (1 + x * (1 - s));
    }
    default: return nan("");
    }
}

template <typename T>
__global__ void unary_kernel(int op, zsk_cuda_view a, double p0, double p1, T *out,
                             int64_t n)
{
    const T *x = (const T *)a.p;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        st(out, i, (float)unary_d(op, (double)ld(x, view_offset(a, i)), p0, p1));
}

int64_t view_numel(const zsk_cuda_view *v)
{
    int64_t n = 1;
    for (int d = 0; d < v->ndim; d++)
        n *= v->shape[d];
    return n;
}

} // namespace

extern "C" zs_status zsk_cuda_copy(const zsk_cuda_view *dst, const zsk_cuda_view *src)
{
    int64_t n = view_numel(dst);
    if (n != view_numel(src))
        return zs_set_error("cuda copy: %lld and %lld elements",
                            (long long)n, (long long)view_numel(src));
    if (n == 0)
        return ZS_OK;
    int g = blocks_for(n);
    if (dst->dt == src->dt) {
        switch (zs_dtype_size(dst->dt)) {
        case 1: copy_raw<uint8_t><<<g, kThreads, 0, stream()>>>(*dst, *src, n); break;
        case 2: copy_raw<uint16_t><<<g, kThreads, 0, stream()>>>(*dst, *src, n); break;
        case 4: copy_raw<uint32_t><<<g, kThreads, 0, stream()>>>(*dst, *src, n); break;
        case 8: copy_raw<uint64_t><<<g, kThreads, 0, stream()>>>(*dst, *src, n); break;
        default:
            return zs_set_error("cuda copy: dtype %s has no kernel",
                                zs_dtype_name(dst->dt));
        }
    } else {
        copy_convert<<<g, kThreads, 0, stream()>>>(*dst, *src, n);
    }
    return zsk_cuda_check("copy");
}

extern "C" zs_status zsk_cuda_scalar(zsk_cuda_binop op, const zsk_cuda_view *a,
                                     double s, void *out)
{
    int64_t n = view_numel(a);
    if (n == 0)
        return ZS_OK;
    int g = blocks_for(n);
    if (a->dt == ZS_F32)
        scalar_kernel<<<g, kThreads, 0, stream()>>>(op, *a, (float)s, (float *)out, n);
    else if (a->dt == ZS_BF16)
        scalar_kernel<<<g, kThreads, 0, stream()>>>(op, *a, (float)s,
                                                   (__nv_bfloat16 *)out, n);
    else
        return zs_set_error("cuda scalar op: dtype %s has no kernel",
                            zs_dtype_name(a->dt));
    return zsk_cuda_check("scalar op");
}

extern "C" zs_status zsk_cuda_unary(int op, const zsk_cuda_view *a, double p0,
                                    double p1, void *out)
{
    int64_t n = view_numel(a);
    if (op < 0 || op >= ZSK_UNOP_COUNT)
        return zs_set_error("cuda unary: unknown operation %d", op);
    if (n == 0)
        return ZS_OK;
    int g = blocks_for(n);
    if (a->dt == ZS_F32)
        unary_kernel<<<g, kThreads, 0, stream()>>>(op, *a, p0, p1, (float *)out, n);
    else if (a->dt == ZS_BF16)
        unary_kernel<<<g, kThreads, 0, stream()>>>(op, *a, p0, p1,
                                                  (__nv_bfloat16 *)out, n);
    else
        return zs_set_error("cuda unary: dtype %s has no kernel", zs_dtype_name(a->dt));
    return zsk_cuda_check("unary");
}
