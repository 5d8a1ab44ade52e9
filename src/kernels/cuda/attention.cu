/*
 * kernels/cuda/attention.cu - fused attention forward and backward on the
 * GPU, the contract of kernels/cpu/attention.h: o = softmax(q k^T scale -
 * slope (pos - j) + causal mask) v with pos = q_offset + i, lse per row
 * (f32), and the backward from o, lse and dout. No Tq x Tk matrix is ever
 * stored: scores are recomputed tile by tile.
 *
 * This is the simple, correct-first version (not yet tiled for speed):
 *  - forward: one block per query row; pass 1 keeps a per-thread running
 *    max and sum over its keys and merges them by a fixed tree (lse);
 *    pass 2 walks the keys in tiles of kThreads: each thread writes the
 *    probability of one key to shared memory, then thread d adds p_j v_j[d]
 *    for the tile in key order;
 *  - backward: one block per query row for dq (dS_j = P_j (dO.v_j - dO.o)),
 *    and one block per key row for dk and dv, looping over the queries that
 *    see it: every output element has one owner and a fixed summation
 *    order, so results are bit-identical from run to run (no atomics).
 * Arithmetic in f32 (bf16 inputs widened, outputs rounded once), dot
 * products and sums of exponentials in f32 with lse in f32 as the CPU.
 * Limits: D <= kMaxD (checked by the caller's entry point).
 */
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "kernels/cuda/cuda.h"

namespace {

constexpr int kThreads = 128;
constexpr int kMaxD = 256;

cudaStream_t stream() { return (cudaStream_t)zsk_cuda_stream(); }

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

/* Merges running (max, sum) pairs over the block by a fixed tree. */
__device__ void block_merge(float &m, float &l)
{
    __shared__ float sm[kThreads], sl[kThreads];
    __syncthreads();
    sm[threadIdx.x] = m;
    sl[threadIdx.x] = l;
    __syncthreads();
    for (int w = kThreads / 2; w > 0; w /= 2) {
        if ((int)threadIdx.x < w) {
            float m1 = sm[threadIdx.x], m2 = sm[threadIdx.x + w];
            float l1 = sl[threadIdx.x], l2 = sl[threadIdx.x + w];
            float mm = fmaxf(m1, m2);
            float s = (m1 == -INFINITY ? 0.f : l1 * __expf(m1 - mm)) +
                      (m2 == -INFINITY ? 0.f : l2 * __expf(m2 - mm));
            sm[threadIdx.x] = mm;
            sl[threadIdx.x] = s;
        }
        __syncthreads();
    }
    m = sm[0];
    l = sl[0];
}

__device__ float block_sum(float v)
{
    __shared__ float s[kThreads];
    __syncthreads();
    s[threadIdx.x] = v;
    __syncthreads();
    for (int w = kThreads / 2; w > 0; w /= 2) {
        if ((int)threadIdx.x < w)
            s[threadIdx.x] += s[threadIdx.x + w];
        __syncthreads();
    }
    return s[0];
}

/* The row's scaled, biased score against key j (q in shared memory). */
template <typename T>
__device__ __forceinline__ float score(const zsk_cuda_attn &a, const float *q,
                                       const T *kb, int64_t j, int64_t pos, float slope)
{
    const T *kr = kb + j * a.sk[2];
    float s = 0;
    for (int64_t d = 0; d < a.D; d++)
        s += q[d] * ld(kr, d);
    return s * a.scale - slope * (float)(pos - j);
}

/* Keys visible to query row i: [0, kend). */
__device__ __forceinline__ int64_t key_end(const zsk_cuda_attn &a, int64_t i)
{
    int64_t pos = a.q_offset + i;
    return a.causal ? (pos + 1 < a.Tk ? pos + 1 : a.Tk) : a.Tk;
}

/* grid: B * H * Tq blocks, row = blockIdx.x */
template <typename T>
__global__ void attn_forward(zsk_cuda_attn a, T *o, float *lse)
{
    __shared__ float q[kMaxD], p[kThreads];
    int64_t row = blockIdx.x, i = row % a.Tq, bh = row / a.Tq;
    int64_t b = bh / a.H, h = bh % a.H;
    const T *qr = (const T *)a.q + b * a.sq[0] + h * a.sq[1] + i * a.sq[2];
    const T *kb = (const T *)a.k + b * a.sk[0] + h * a.sk[1];
    const T *vb = (const T *)a.v + b * a.sv[0] + h * a.sv[1];
    for (int64_t d = threadIdx.x; d < a.D; d += kThreads)
        q[d] = ld(qr, d);
    __syncthreads();
    float slope = a.slopes ? (float)a.slopes[h] : 0.f;
    int64_t pos = a.q_offset + i, kend = key_end(a, i);
    float m = -INFINITY, l = 0;
    for (int64_t j = threadIdx.x; j < kend; j += kThreads) {
        float s = score(a, q, kb, j, pos, slope);
        float mm = fmaxf(m, s);
        l = (m == -INFINITY ? 0.f : l * __expf(m - mm)) + __expf(s - mm);
        m = mm;
    }
    block_merge(m, l);
    float L = m == -INFINITY ? -INFINITY : m + logf(l);
    /* thread d accumulates o[d] (threads beyond D only fill p) */
    float acc[(kMaxD + kThreads - 1) / kThreads] = {0};
    for (int64_t j0 = 0; j0 < kend; j0 += kThreads) {
        int64_t j = j0 + threadIdx.x;
        __syncthreads();
        p[threadIdx.x] = j < kend ? __expf(score(a, q, kb, j, pos, slope) - L) : 0.f;
        __syncthreads();
        int64_t n = kend - j0 < kThreads ? kend - j0 : kThreads;
#pragma unroll
        for (int c = 0; c < (kMaxD + kThreads - 1) / kThreads; c++) {
            int64_t d = threadIdx.x + (int64_t)c * kThreads;
            if (d < a.D)
                for (int64_t t = 0; t < n; t++)
                    acc[c] += p[t] * ld(vb + (j0 + t) * a.sv[2], d);
        }
    }
    T *orow = o + row * a.D;
#pragma unroll
    for (int c = 0; c < (kMaxD + kThreads - 1) / kThreads; c++) {
        int64_t d = threadIdx.x + (int64_t)c * kThreads;
        if (d < a.D)
            st(orow, d, kend > 0 ? acc[c] : 0.f);
    }
    if (threadIdx.x == 0 && lse)
        lse[row] = L;
}

/* Dot of dout row and o row (the softmax backward's D_i), block-wide. */
template <typename T>
__device__ float row_delta(const zsk_cuda_attn &a, const T *dor, const T *orow)
{
    float s = 0;
    for (int64_t d = threadIdx.x; d < a.D; d += kThreads)
        s += ld(dor, d) * ld(orow, d);
    return block_sum(s);
}

/* dq: one block per query row */
template <typename T>
__global__ void attn_backward_q(zsk_cuda_attn a, const T *o, const float *lse,
                                const T *dout, T *dq)
{
    __shared__ float q[kMaxD], dov[kMaxD], ds[kThreads];
    int64_t row = blockIdx.x, i = row % a.Tq, bh = row / a.Tq;
    int64_t b = bh / a.H, h = bh % a.H;
    const T *qr = (const T *)a.q + b * a.sq[0] + h * a.sq[1] + i * a.sq[2];
    const T *kb = (const T *)a.k + b * a.sk[0] + h * a.sk[1];
    const T *vb = (const T *)a.v + b * a.sv[0] + h * a.sv[1];
    const T *dor = dout + row * a.D;
    for (int64_t d = threadIdx.x; d < a.D; d += kThreads) {
        q[d] = ld(qr, d);
        dov[d] = ld(dor, d);
    }
    float Di = row_delta(a, dor, o + row * a.D); /* syncs q, dov */
    float slope = a.slopes ? (float)a.slopes[h] : 0.f, L = lse[row];
    int64_t pos = a.q_offset + i, kend = key_end(a, i);
    float acc[(kMaxD + kThreads - 1) / kThreads] = {0};
    for (int64_t j0 = 0; j0 < kend; j0 += kThreads) {
        int64_t j = j0 + threadIdx.x;
        __syncthreads();
        float v = 0;
        if (j < kend) {
            float P = __expf(score(a, q, kb, j, pos, slope) - L), dp = 0;
            const T *vr = vb + j * a.sv[2];
            for (int64_t d = 0; d < a.D; d++)
                dp += dov[d] * ld(vr, d);
            v = P * (dp - Di);
        }
        ds[threadIdx.x] = v;
        __syncthreads();
        int64_t n = kend - j0 < kThreads ? kend - j0 : kThreads;
#pragma unroll
        for (int c = 0; c < (kMaxD + kThreads - 1) / kThreads; c++) {
            int64_t d = threadIdx.x + (int64_t)c * kThreads;
            if (d < a.D)
                for (int64_t t = 0; t < n; t++)
                    acc[c] += ds[t] * ld(kb + (j0 + t) * a.sk[2], d);
        }
    }
#pragma unroll
    for (int c = 0; c < (kMaxD + kThreads - 1) / kThreads; c++) {
        int64_t d = threadIdx.x + (int64_t)c * kThreads;
        if (d < a.D)
            st(dq + row * a.D, d, acc[c] * a.scale);
    }
}

/* dk, dv: one block per key row j, over the queries that see it; delta
 * holds D_i for every query row (computed by attn_delta) */
template <typename T>
__global__ void attn_backward_kv(zsk_cuda_attn a, const float *lse, const float *delta,
                                 const T *dout, T *dk, T *dv)
{
    __shared__ float kr[kMaxD], vr[kMaxD], ps[kThreads], ds[kThreads];
    int64_t krow = blockIdx.x, j = krow % a.Tk, bh = krow / a.Tk;
    int64_t b = bh / a.H, h = bh % a.H;
    const T *kp = (const T *)a.k + b * a.sk[0] + h * a.sk[1] + j * a.sk[2];
    const T *vp = (const T *)a.v + b * a.sv[0] + h * a.sv[1] + j * a.sv[2];
    const T *qb = (const T *)a.q + b * a.sq[0] + h * a.sq[1];
    for (int64_t d = threadIdx.x; d < a.D; d += kThreads) {
        kr[d] = ld(kp, d);
        vr[d] = ld(vp, d);
    }
    __syncthreads();
    float slope = a.slopes ? (float)a.slopes[h] : 0.f;
    /* queries i see j when !causal or q_offset + i >= j */
    int64_t i0 = a.causal && j > a.q_offset ? j - a.q_offset : 0;
    float ak[(kMaxD + kThreads - 1) / kThreads] = {0};
    float av[(kMaxD + kThreads - 1) / kThreads] = {0};
    for (int64_t c0 = i0; c0 < a.Tq; c0 += kThreads) {
        int64_t i = c0 + threadIdx.x;
        __syncthreads();
        float P = 0, dS = 0;
        if (i < a.Tq) {
            int64_t row = bh * a.Tq + i;
            const T *qr = qb + i * a.sq[2], *dor = dout + row * a.D;
            float s = 0, dp = 0;
            for (int64_t d = 0; d < a.D; d++) {
                s += ld(qr, d) * kr[d];
                dp += ld(dor, d) * vr[d];
            }
            s = s * a.scale - slope * (float)(a.q_offset + i - j);
            P = __expf(s - lse[row]);
            dS = P * (dp - delta[row]);
        }
        ps[threadIdx.x] = P;
        ds[threadIdx.x] = dS;
        __syncthreads();
        int64_t n = a.Tq - c0 < kThreads ? a.Tq - c0 : kThreads;
#pragma unroll
        for (int c = 0; c < (kMaxD + kThreads - 1) / kThreads; c++) {
            int64_t d = threadIdx.x + (int64_t)c * kThreads;
            if (d < a.D)
                for (int64_t t = 0; t < n; t++) {
                    int64_t row = bh * a.Tq + c0 + t;
                    ak[c] += ds[t] * ld(qb + (c0 + t) * a.sq[2], d);
                    av[c] += ps[t] * ld(dout + row * a.D, d);
                }
        }
    }
#pragma unroll
    for (int c = 0; c < (kMaxD + kThreads - 1) / kThreads; c++) {
        int64_t d = threadIdx.x + (int64_t)c * kThreads;
        if (d < a.D) {
            st(dk + krow * a.D, d, ak[c] * a.scale);
            st(dv + krow * a.D, d, av[c]);
        }
    }
}

/* delta[row] = dout_row . o_row, one block per row */
template <typename T>
__global__ void attn_delta(zsk_cuda_attn a, const T *o, const T *dout, float *delta)
{
    int64_t row = blockIdx.x;
    float s = row_delta(a, dout + row * a.D, o + row * a.D);
    if (threadIdx.x == 0)
        delta[row] = s;
}

zs_status check(const zsk_cuda_attn *a, const char *what)
{
    if (a->D > kMaxD)
        return zs_set_error("cuda %s: head size D = %lld, this kernel takes at most %d",
                            what, (long long)a->D, kMaxD);
    if (a->B * a->H * (a->Tq > a->Tk ? a->Tq : a->Tk) > INT32_MAX)
        return zs_set_error("cuda %s: too many rows", what);
    if (a->dt != ZS_F32 && a->dt != ZS_BF16)
        return zs_set_error("cuda %s: dtype %s has no kernel", what,
                            zs_dtype_name(a->dt));
    return ZS_OK;
}

} // namespace

extern "C" zs_status zsk_cuda_attention_forward(const zsk_cuda_attn *a, void *o,
                                                float *lse)
{
    zs_status s = check(a, "attention");
    if (s != ZS_OK)
        return s;
    int64_t rows = a->B * a->H * a->Tq;
    if (rows == 0 || a->D == 0)
        return ZS_OK;
    if (a->dt == ZS_F32)
        attn_forward<<<(int)rows, kThreads, 0, stream()>>>(*a, (float *)o, lse);
    else
        attn_forward<<<(int)rows, kThreads, 0, stream()>>>(*a, (__nv_bfloat16 *)o, lse);
    return zsk_cuda_check("attention");
}

extern "C" zs_status zsk_cuda_attention_backward(const zsk_cuda_attn *a, const void *o,
                                                 const float *lse, const void *dout,
                                                 float *delta, void *dq, void *dk,
                                                 void *dv)
{
    zs_status s = check(a, "attention_backward");
    if (s != ZS_OK)
        return s;
    int64_t rq = a->B * a->H * a->Tq, rk = a->B * a->H * a->Tk;
    if (a->dt == ZS_F32) {
        const float *O = (const float *)o, *G = (const float *)dout;
        if (rq) {
            attn_delta<<<(int)rq, kThreads, 0, stream()>>>(*a, O, G, delta);
            attn_backward_q<<<(int)rq, kThreads, 0, stream()>>>(*a, O, lse, G, (float *)dq);
        }
        if (rk)
            attn_backward_kv<<<(int)rk, kThreads, 0, stream()>>>(*a, lse, delta, G,
                                                                (float *)dk, (float *)dv);
    } else {
        typedef __nv_bfloat16 bf;
        const bf *O = (const bf *)o, *G = (const bf *)dout;
        if (rq) {
            attn_delta<<<(int)rq, kThreads, 0, stream()>>>(*a, O, G, delta);
            attn_backward_q<<<(int)rq, kThreads, 0, stream()>>>(*a, O, lse, G, (bf *)dq);
        }
        if (rk)
            attn_backward_kv<<<(int)rk, kThreads, 0, stream()>>>(*a, lse, delta, G,
                                                                (bf *)dk, (bf *)dv);
    }
    return zsk_cuda_check("attention_backward");
}
