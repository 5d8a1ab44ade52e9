/*
 * kernels/cuda/rows.cu - row kernels of the CUDA backend: layer norm
 * forward and backward, cross-entropy forward and backward, embedding
 * forward and backward, sums over [O, R, K], and the index check the
 * gathers share.
 *
 * Determinism: no atomics anywhere. A row is one block, reduced by a fixed
 * tree (block_sum) in double; column sums (layer norm's gw, gb) are per-
 * chunk partials [P, C] added in chunk order by a second launch; the
 * embedding gradient gives each block a range of vocabulary rows it alone
 * writes, adding the gradient rows in index order (the CPU's order).
 * Statistics and losses accumulate in double; values are float, as the
 * CPU kernels (kernels/cpu/norm.c, softmax.c), so results agree within
 * float rounding, not to the bit.
 */
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "kernels/cuda/cuda.h"

namespace {

constexpr int kThreads = 256;

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

/* Sum of v over the block (kThreads threads) in a fixed tree order; every
 * thread gets the result. Uses its own shared buffer; call from all. */
__device__ double block_sum(double v)
{
    __shared__ double s[kThreads];
    __syncthreads(); /* s may still be read by a previous call */
    s[threadIdx.x] = v;
    __syncthreads();
    for (int w = kThreads / 2; w > 0; w /= 2) {
        if ((int)threadIdx.x < w)
            s[threadIdx.x] += s[threadIdx.x + w];
        __syncthreads();
    }
    return s[0];
}

__device__ float block_max(float v)
{
    __shared__ float s[kThreads];
    __syncthreads();
    s[threadIdx.x] = v;
    __syncthreads();
    for (int w = kThreads / 2; w > 0; w /= 2) {
        if ((int)threadIdx.x < w)
            s[threadIdx.x] = fmaxf(s[threadIdx.x], s[threadIdx.x + w]);
        __syncthreads();
    }
    return s[0];
}

__device__ __forceinline__ int64_t idx_at(const void *idx, bool i64, int64_t i)
{
    return i64 ? ((const int64_t *)idx)[i] : (int64_t)((const int32_t *)idx)[i];
}

/* ---- layer norm ---- */

/* one block per row r of x [R, C]: kernels/cpu/norm.c's ln_fw formulas */
template <typename T, typename P>
__global__ void ln_forward(const T *x, const P *w, const P *b, int64_t C, double eps,
                           T *y, float *mean, float *rstd)
{
    int64_t r = blockIdx.x;
    const T *xr = x + r * C;
    double s = 0;
    for (int64_t i = threadIdx.x; i < C; i += kThreads)
        s += ld(xr, i);
    float m = (float)(block_sum(s) / (double)C);
    double q = 0;
    for (int64_t i = threadIdx.x; i < C; i += kThreads) {
        float d = ld(xr, i) - m;
        q += (double)d * d;
    }
    float rs = (float)(1.0 / sqrt(block_sum(q) / (double)C + eps));
    if (threadIdx.x == 0 && mean) {
        mean[r] = m;
        rstd[r] = rs;
    }
    for (int64_t i = threadIdx.x; i < C; i += kThreads) {
        float v = (ld(xr, i) - m) * rs;
        if (w)
            v *= ld(w, i);
        if (b)
            v += ld(b, i);
        st(y + r * C, i, v);
    }
}

/* gx of row r (one block per row): (g w - dm - xhat dn) rstd */
template <typename T, typename P>
__global__ void ln_backward_x(const T *x, const P *w, const float *mean,
                             const float *rstd, const T *g, int64_t C, T *gx)
{
    int64_t r = blockIdx.x;
    const T *xr = x + r * C, *gr = g + r * C;
    float m = mean[r], s = rstd[r];
    double a = 0, bsum = 0;
    for (int64_t i = threadIdx.x; i < C; i += kThreads) {
        float d = ld(gr, i) * (w ? ld(w, i) : 1.0f);
        a += d;
        bsum += (double)d * ((ld(xr, i) - m) * s);
    }
    float dm = (float)(block_sum(a) / (double)C);
    float dn = (float)(block_sum(bsum) / (double)C);
    for (int64_t i = threadIdx.x; i < C; i += kThreads) {
        float d = ld(gr, i) * (w ? ld(w, i) : 1.0f);
        st(gx + r * C, i, (d - dm - (ld(xr, i) - m) * s * dn) * s);
    }
}

/* partial column sums over row chunk blockIdx.y: pw[p, c] = sum g xhat,
 * pb[p, c] = sum g (double) */
template <typename T>
__global__ void ln_backward_partial(const T *x, const float *mean, const float *rstd,
                                    const T *g, int64_t R, int64_t C, int64_t P,
                                    double *pw, double *pb)
{
    int64_t c = blockIdx.x * (int64_t)kThreads + threadIdx.x, p = blockIdx.y;
    if (c >= C)
        return;
    int64_t r0 = p * R / P, r1 = (p + 1) * R / P;
    double sw = 0, sb = 0;
    for (int64_t r = r0; r < r1; r++) {
        float gv = ld(g, r * C + c);
        sw += (double)gv * ((ld(x, r * C + c) - mean[r]) * rstd[r]);
        sb += gv;
    }
    pw[p * C + c] = sw;
    pb[p * C + c] = sb;
}

template <typename P>
__global__ void ln_backward_combine(const double *pw, const double *pb, int64_t P_,
                                    int64_t C, P *gw, P *gb)
{
    int64_t c = blockIdx.x * (int64_t)kThreads + threadIdx.x;
    if (c >= C)
        return;
    double sw = 0, sb = 0;
    for (int64_t p = 0; p < P_; p++) {
        sw += pw[p * C + c];
        sb += pb[p * C + c];
    }
    if (gw)
        st(gw, c, (float)sw);
    if (gb)
        st(gb, c, (float)sb);
}

/* ---- cross entropy ---- */

/* one block per row: lse (double) and the row's loss (0 when ignored) */
template <typename T>
__global__ void ce_forward(const T *x, const void *t, bool t64, int64_t ignore,
                           int64_t C, double *lse, double *loss)
{
    int64_t r = blockIdx.x;
    const T *xr = x + r * C;
    float m = -INFINITY;
    for (int64_t i = threadIdx.x; i < C; i += kThreads)
        m = fmaxf(m, ld(xr, i));
    m = block_max(m);
    double s = 0;
    for (int64_t i = threadIdx.x; i < C; i += kThreads)
        s += exp((double)ld(xr, i) - (double)m);
    double l = (double)m + log(block_sum(s));
    if (threadIdx.x == 0) {
        int64_t tv = idx_at(t, t64, r);
        lse[r] = l;
        loss[r] = tv == ignore || tv < 0 || tv >= C ? 0.0 : l - (double)ld(xr, tv);
    }
}

/* out (0-d: the dtype of the logits, or f32) = sum of loss in a fixed
 * order / count */
template <typename T>
__global__ void ce_mean(const double *loss, int64_t N, const int64_t *count, T *out)
{
    double s = 0;
    for (int64_t i = threadIdx.x; i < N; i += kThreads)
        s += loss[i];
    s = block_sum(s);
    if (threadIdx.x == 0)
        st(out, 0, (float)(*count ? s / (double)*count : 0.0));
}

/* gx = g / count (softmax(x) - onehot(t)) on counted rows, 0 on ignored
 * ones and everywhere when count is 0; one block per row */
template <typename T, typename G>
__global__ void ce_backward(const T *x, const void *t, bool t64, int64_t ignore,
                            const double *lse, const int64_t *count, const G *g,
                            int64_t C, T *gx)
{
    int64_t r = blockIdx.x;
    int64_t tv = idx_at(t, t64, r), n = *count;
    bool zero = n == 0 || tv == ignore;
    double scale = zero ? 0.0 : (double)ld(g, 0) / (double)n, l = lse[r];
    for (int64_t i = threadIdx.x; i < C; i += kThreads) {
        double p = zero ? 0.0 : exp((double)ld(x + r * C, i) - l);
        st(gx + r * C, i, (float)(scale * (p - (i == tv ? 1.0 : 0.0))));
    }
}

/* ---- index check (one block) ---- */

/* res[0] = first position i with idx[i] outside [0, hi) and != ignore (or
 * -1), res[1] = its value, res[2] = how many are != ignore */
__global__ void index_check(const void *idx, bool i64, int64_t n, int64_t hi,
                            int64_t ignore, int64_t *res)
{
    __shared__ int64_t first[kThreads];
    int64_t f = INT64_MAX;
    double cnt = 0;
    for (int64_t i = threadIdx.x; i < n; i += kThreads) {
        int64_t v = idx_at(idx, i64, i);
        if (v == ignore)
            continue;
        cnt += 1;
        if ((v < 0 || v >= hi) && i < f)
            f = i;
    }
    first[threadIdx.x] = f;
    double total = block_sum(cnt);
    for (int w = kThreads / 2; w > 0; w /= 2) {
        if ((int)threadIdx.x < w && first[threadIdx.x + w] < first[threadIdx.x])
            first[threadIdx.x] = first[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        int64_t f0 = first[0];
        res[0] = f0 == INT64_MAX ? -1 : f0;
        res[1] = f0 == INT64_MAX ? 0 : idx_at(idx, i64, f0);
        res[2] = (int64_t)total;
    }
}

/* ---- embedding ---- */

/* out[i, :] = w[idx[i], :] (w rows of stride ws0, elements ws1 apart) */
template <typename T>
__global__ void emb_forward(const T *w, int64_t ws0, int64_t ws1, const void *idx,
                            bool i64, int64_t n, int64_t D, T *out)
{
    for (int64_t k = blockIdx.x * (int64_t)kThreads + threadIdx.x; k < n * D;
         k += (int64_t)gridDim.x * kThreads) {
        int64_t i = k / D, d = k % D;
        out[k] = w[idx_at(idx, i64, i) * ws0 + d * ws1];
    }
}

/* block b owns rows [b rows_per, (b + 1) rows_per) of acc [V, D] (f32,
 * zeroed): scans every index in order and adds the gradient rows of its
 * own; thread d owns column d, so each element is summed in index order */
template <typename T>
__global__ void emb_backward(const void *idx, bool i64, int64_t n, const T *g,
                             int64_t V, int64_t D, int64_t rows_per, float *acc)
{
    __shared__ int64_t chunk[1024];
    int64_t v0 = blockIdx.x * rows_per, v1 = v0 + rows_per < V ? v0 + rows_per : V;
    for (int64_t c0 = 0; c0 < n; c0 += 1024) {
        int64_t m = n - c0 < 1024 ? n - c0 : 1024;
        __syncthreads();
        for (int64_t j = threadIdx.x; j < m; j += kThreads)
            chunk[j] = idx_at(idx, i64, c0 + j);
        __syncthreads();
        for (int64_t j = 0; j < m; j++) {
            int64_t v = chunk[j];
            if (v < v0 || v >= v1)
                continue;
            for (int64_t d = threadIdx.x; d < D; d += kThreads)
                acc[v * D + d] += ld(g, (c0 + j) * D + d);
        }
    }
}

template <typename T>
__global__ void from_f32(const float *a, int64_t n, T *out)
{
    for (int64_t i = blockIdx.x * (int64_t)kThreads + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * kThreads)
        st(out, i, a[i]);
}

/* ---- sums over [O, R, K] ---- */

/* K > 1: one thread per output (o, k), r in order */
template <typename T>
__global__ void sum_cols(const T *x, int64_t O, int64_t R, int64_t K, double scale,
                         bool f32_mean, T *out)
{
    for (int64_t j = blockIdx.x * (int64_t)kThreads + threadIdx.x; j < O * K;
         j += (int64_t)gridDim.x * kThreads) {
        int64_t o = j / K, k = j % K;
        double s = 0;
        for (int64_t r = 0; r < R; r++)
            s += ld(x, (o * R + r) * K + k);
        st(out, j, f32_mean ? (float)s * (float)scale : (float)(s * scale));
    }
}

/* K == 1: one block per row o */
template <typename T>
__global__ void sum_rows(const T *x, int64_t R, double scale, bool f32_mean, T *out)
{
    int64_t o = blockIdx.x;
    double s = 0;
    for (int64_t r = threadIdx.x; r < R; r += kThreads)
        s += ld(x, o * R + r);
    s = block_sum(s);
    if (threadIdx.x == 0)
        st(out, o, f32_mean ? (float)s * (float)scale : (float)(s * scale));
}

int grid_for(int64_t n)
{
    int64_t b = (n + kThreads - 1) / kThreads;
    return (int)(b < 1 ? 1 : b > 132 * 16 ? 132 * 16 : b);
}

bool lowp(zs_dtype dt) { return dt == ZS_BF16; }

} // namespace

#define BAD_DT(what, dt)                                                       \
    zs_set_error("cuda %s: dtype %s has no kernel", what, zs_dtype_name(dt))

extern "C" zs_status zsk_cuda_layer_norm(zs_dtype dt, zs_dtype pdt, const void *x,
                                         const void *w, const void *b, int64_t R,
                                         int64_t C, double eps, void *y, float *mean,
                                         float *rstd)
{
    if (R == 0 || C == 0)
        return ZS_OK;
    if (R > INT32_MAX)
        return zs_set_error("cuda layer_norm: %lld rows", (long long)R);
    if (dt == ZS_F32 && pdt == ZS_F32)
        ln_forward<<<(int)R, kThreads, 0, stream()>>>(
            (const float *)x, (const float *)w, (const float *)b, C, eps, (float *)y,
            mean, rstd);
    else if (dt == ZS_BF16 && pdt == ZS_BF16)
        ln_forward<<<(int)R, kThreads, 0, stream()>>>(
            (const __nv_bfloat16 *)x, (const __nv_bfloat16 *)w,
            (const __nv_bfloat16 *)b, C, eps, (__nv_bfloat16 *)y, mean, rstd);
    else if (dt == ZS_BF16 && pdt == ZS_F32)
        ln_forward<<<(int)R, kThreads, 0, stream()>>>(
            (const __nv_bfloat16 *)x, (const float *)w, (const float *)b, C, eps,
            (__nv_bfloat16 *)y, mean, rstd);
    else
        return BAD_DT("layer_norm", dt);
    return zsk_cuda_check("layer_norm");
}

template <typename T, typename P>
static zs_status ln_bw(const T *x, const P *w, const float *mean, const float *rstd,
                       const T *g, int64_t R, int64_t C, T *gx, P *gw, P *gb,
                       double *part, int64_t P_)
{
    if (gx)
        ln_backward_x<<<(int)R, kThreads, 0, stream()>>>(x, w, mean, rstd, g, C, gx);
    if (gw || gb) {
        dim3 grid((unsigned)((C + kThreads - 1) / kThreads), (unsigned)P_);
        ln_backward_partial<<<grid, kThreads, 0, stream()>>>(x, mean, rstd, g, R, C,
                                                            P_, part, part + P_ * C);
        ln_backward_combine<<<grid.x, kThreads, 0, stream()>>>(part, part + P_ * C,
                                                              P_, C, gw, gb);
    }
    return zsk_cuda_check("layer_norm_backward");
}

extern "C" int64_t zsk_cuda_layer_norm_parts(int64_t R)
{
    return R < 1 ? 1 : R < 64 ? R : 64;
}

extern "C" zs_status zsk_cuda_layer_norm_backward(
    zs_dtype dt, zs_dtype pdt, const void *x, const void *w, const float *mean,
    const float *rstd, const void *g, int64_t R, int64_t C, void *gx, void *gw,
    void *gb, double *part)
{
    if (R == 0 || C == 0) /* gw, gb: zeros (the caller's memset) */
        return ZS_OK;
    if (R > INT32_MAX)
        return zs_set_error("cuda layer_norm_backward: %lld rows", (long long)R);
    int64_t P_ = zsk_cuda_layer_norm_parts(R);
    typedef __nv_bfloat16 bf;
    if (dt == ZS_F32 && pdt == ZS_F32)
        return ln_bw((const float *)x, (const float *)w, mean, rstd, (const float *)g,
                     R, C, (float *)gx, (float *)gw, (float *)gb, part, P_);
    if (dt == ZS_BF16 && pdt == ZS_BF16)
        return ln_bw((const bf *)x, (const bf *)w, mean, rstd, (const bf *)g, R, C,
                     (bf *)gx, (bf *)gw, (bf *)gb, part, P_);
    if (dt == ZS_BF16 && pdt == ZS_F32)
        return ln_bw((const bf *)x, (const float *)w, mean, rstd, (const bf *)g, R, C,
                     (bf *)gx, (float *)gw, (float *)gb, part, P_);
    return BAD_DT("layer_norm_backward", dt);
}

extern "C" zs_status zsk_cuda_index_check(const void *idx, bool i64, int64_t n,
                                          int64_t hi, int64_t ignore, int64_t *res)
{
    index_check<<<1, kThreads, 0, stream()>>>(idx, i64, n, hi, ignore, res);
    return zsk_cuda_check("index check");
}

extern "C" zs_status zsk_cuda_cross_entropy(zs_dtype dt, const void *x, const void *t,
                                            bool t64, int64_t ignore, int64_t N,
                                            int64_t C, const int64_t *count,
                                            double *lse, double *loss, zs_dtype odt,
                                            void *out)
{
    if (N > INT32_MAX)
        return zs_set_error("cuda cross_entropy: %lld rows", (long long)N);
    if (dt == ZS_F32) {
        if (N)
            ce_forward<<<(int)N, kThreads, 0, stream()>>>((const float *)x, t, t64,
                                                          ignore, C, lse, loss);
        ce_mean<<<1, kThreads, 0, stream()>>>(loss, N, count, (float *)out);
    } else if (dt == ZS_BF16) {
        if (N)
            ce_forward<<<(int)N, kThreads, 0, stream()>>>(
                (const __nv_bfloat16 *)x, t, t64, ignore, C, lse, loss);
        if (odt == ZS_F32) /* the f32 loss of autocast */
            ce_mean<<<1, kThreads, 0, stream()>>>(loss, N, count, (float *)out);
        else
            ce_mean<<<1, kThreads, 0, stream()>>>(loss, N, count, (__nv_bfloat16 *)out);
    } else {
        return BAD_DT("cross_entropy", dt);
    }
    return zsk_cuda_check("cross_entropy");
}

extern "C" zs_status zsk_cuda_cross_entropy_backward(
    zs_dtype dt, const void *x, const void *t, bool t64, int64_t ignore,
    const double *lse, const int64_t *count, zs_dtype gdt, const void *g, int64_t N,
    int64_t C, void *gx)
{
    if (N == 0)
        return ZS_OK;
    if (N > INT32_MAX)
        return zs_set_error("cuda cross_entropy_backward: %lld rows", (long long)N);
    typedef __nv_bfloat16 bf;
    int n = (int)N;
    if (dt == ZS_F32 && gdt == ZS_F32)
        ce_backward<<<n, kThreads, 0, stream()>>>((const float *)x, t, t64, ignore, lse,
                                                  count, (const float *)g, C, (float *)gx);
    else if (dt == ZS_BF16 && gdt == ZS_BF16)
        ce_backward<<<n, kThreads, 0, stream()>>>((const bf *)x, t, t64, ignore, lse,
                                                  count, (const bf *)g, C, (bf *)gx);
    else if (dt == ZS_BF16 && gdt == ZS_F32)
        ce_backward<<<n, kThreads, 0, stream()>>>((const bf *)x, t, t64, ignore, lse,
                                                  count, (const float *)g, C, (bf *)gx);
    else
        return BAD_DT("cross_entropy_backward", dt);
    return zsk_cuda_check("cross_entropy_backward");
}

extern "C" zs_status zsk_cuda_embedding(zs_dtype dt, const void *w, int64_t ws0,
                                        int64_t ws1, const void *idx, bool i64,
                                        int64_t n, int64_t D, void *out)
{
    if (n * D == 0)
        return ZS_OK;
    int g = grid_for(n * D);
    if (dt == ZS_F32)
        emb_forward<<<g, kThreads, 0, stream()>>>((const float *)w, ws0, ws1, idx, i64,
                                                  n, D, (float *)out);
    else if (dt == ZS_BF16)
        emb_forward<<<g, kThreads, 0, stream()>>>((const __nv_bfloat16 *)w, ws0, ws1,
                                                  idx, i64, n, D, (__nv_bfloat16 *)out);
    else
        return BAD_DT("embedding", dt);
    return zsk_cuda_check("embedding");
}

extern "C" zs_status zsk_cuda_embedding_backward(zs_dtype dt, const void *idx, bool i64,
                                                 int64_t n, const void *g, int64_t V,
                                                 int64_t D, float *acc, void *out)
{
    if (V * D == 0)
        return ZS_OK;
    cudaError_t e = cudaMemsetAsync(acc, 0, (size_t)(V * D) * sizeof(float), stream());
    if (e != cudaSuccess)
        return zs_set_error("cuda embedding_backward: memset: %s", cudaGetErrorString(e));
    const int64_t rows_per = 32;
    int blocks = (int)((V + rows_per - 1) / rows_per);
    if (n > 0) {
        if (dt == ZS_F32)
            emb_backward<<<blocks, kThreads, 0, stream()>>>(idx, i64, n, (const float *)g,
                                                            V, D, rows_per, acc);
        else if (dt == ZS_BF16)
            emb_backward<<<blocks, kThreads, 0, stream()>>>(
                idx, i64, n, (const __nv_bfloat16 *)g, V, D, rows_per, acc);
        else
            return BAD_DT("embedding_backward", dt);
    }
    if (dt == ZS_BF16)
        from_f32<<<grid_for(V * D), kThreads, 0, stream()>>>(acc, V * D,
                                                             (__nv_bfloat16 *)out);
    return zsk_cuda_check("embedding_backward");
}

extern "C" zs_status zsk_cuda_sum(zs_dtype dt, const void *x, int64_t O, int64_t R,
                                  int64_t K, bool mean, void *out)
{
    if (O * K == 0)
        return ZS_OK;
    double scale = !mean ? 1.0 : R ? 1.0 / (double)R : nan("");
    bool f32m = mean && dt == ZS_F32; /* the CPU: f32 sum, then * (float)(1/R) */
    if (dt != ZS_F32 && !lowp(dt))
        return BAD_DT("sum", dt);
    if (K == 1 && O <= INT32_MAX) {
        if (dt == ZS_F32)
            sum_rows<<<(int)O, kThreads, 0, stream()>>>((const float *)x, R, scale, f32m,
                                                        (float *)out);
        else
            sum_rows<<<(int)O, kThreads, 0, stream()>>>((const __nv_bfloat16 *)x, R,
                                                        scale, f32m, (__nv_bfloat16 *)out);
    } else if (dt == ZS_F32) {
        sum_cols<<<grid_for(O * K), kThreads, 0, stream()>>>((const float *)x, O, R, K,
                                                              scale, f32m, (float *)out);
    } else {
        sum_cols<<<grid_for(O * K), kThreads, 0, stream()>>>(
            (const __nv_bfloat16 *)x, O, R, K, scale, f32m, (__nv_bfloat16 *)out);
    }
    return zsk_cuda_check("sum");
}
