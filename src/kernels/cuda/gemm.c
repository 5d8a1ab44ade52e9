/*
 * kernels/cuda/gemm.c - matrix products on the GPU through cuBLASLt.
 *
 * Row-major C[M, N] = op(A)[M, K] op(B)[K, N] is, read column-major, the
 * product C^T = op(B)^T op(A)^T: cuBLASLt's "A" is our B and its "B" our
 * A, with the same transpose flags, and D is an N x M column-major matrix
 * of leading dimension ldc. f32 runs CUBLAS_COMPUTE_32F (no TF32, as
 * PyTorch's default); bf16 inputs accumulate in f32 (CUBLAS_COMPUTE_32F)
 * and write D in f32 or bf16 (rounded once). The optional bias epilogue
 * (CUBLASLT_EPILOGUE_BIAS, an f32 vector of N added to every row) is used
 * only with an f32 D. Batches are strided (one call for the whole batch).
 *
 * The minimum alignment of each pointer is told to the heuristic, so that
 * views at odd offsets get an algorithm that accepts them. One handle and
 * one 32 MiB workspace for the process, made on first use (cudaMalloc'd
 * once, outside the caching allocator); calls are serialised by a mutex
 * around the descriptor set-up (the launch is asynchronous on the current
 * stream).
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>

#include <cublasLt.h>
#include <cuda_runtime.h>

#include "kernels/cuda/cuda.h"

#define WORKSPACE_BYTES ((size_t)32 << 20)

static cublasLtHandle_t handle;
static void *workspace;
static zs_status init_status = ZS_OK;
static char init_msg[256];
static pthread_once_t once = PTHREAD_ONCE_INIT;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

static void init(void)
{
    cublasStatus_t s = cublasLtCreate(&handle);
    if (s != CUBLAS_STATUS_SUCCESS) {
        snprintf(init_msg, sizeof init_msg, "cublasLtCreate failed (status %d)", (int)s);
        init_status = ZS_ERR_STATE;
        return;
    }
    cudaError_t e = cudaMalloc(&workspace, WORKSPACE_BYTES);
    if (e != cudaSuccess) {
        snprintf(init_msg, sizeof init_msg, "workspace of %zu bytes: %s",
                 WORKSPACE_BYTES, cudaGetErrorString(e));
        init_status = ZS_ERR_NOMEM;
    }
}

/* The largest power of two (<= 256) dividing the address. */
static uint32_t alignment(const void *p)
{
    uintptr_t a = (uintptr_t)p;
    uint32_t al = 256;
    while (al > 1 && a % al)
        al /= 2;
    return al;
}

static cudaDataType_t cuda_type(zs_dtype dt)
{
    return dt == ZS_BF16 ? CUDA_R_16BF : dt == ZS_F16 ? CUDA_R_16F : CUDA_R_32F;
}

#define LT(call)                                                               \
    do {                                                                       \
        cublasStatus_t s_ = (call);                                            \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                     \
            st = zs_set_error("cuda gemm: %s failed (status %d) for M %lld N %lld " \
                              "K %lld batch %lld", #call, (int)s_, (long long)g->M, \
                              (long long)g->N, (long long)g->K,                \
                              (long long)g->batch);                            \
            goto done;                                                         \
        }                                                                      \
    } while (0)

static zs_status layout(cublasLtMatrixLayout_t *l, cudaDataType_t t, int64_t rows,
                        int64_t cols, int64_t ld, int64_t batch, int64_t stride)
{
    if (cublasLtMatrixLayoutCreate(l, t, (uint64_t)rows, (uint64_t)cols, ld) !=
        CUBLAS_STATUS_SUCCESS)
        return zs_set_error("cuda gemm: layout %lld x %lld (ld %lld) refused",
                            (long long)rows, (long long)cols, (long long)ld);
    if (batch > 1) {
        int32_t b = (int32_t)batch;
        cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &b,
                                         sizeof b);
        cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                         &stride, sizeof stride);
    }
    return ZS_OK;
}

zs_status zsk_cuda_gemm(const zsk_cuda_gemm_args *g)
{
    if (g->M == 0 || g->N == 0 || g->batch == 0)
        return ZS_OK;
    if (g->in_dt != ZS_F32 && g->in_dt != ZS_BF16)
        return zs_set_error("cuda gemm: inputs of %s, expected f32 or bf16",
                            zs_dtype_name(g->in_dt));
    if (g->K == 0) /* an empty sum: zeros (no bias path needs K = 0) */
        return zs_set_error("cuda gemm: K = 0 is not supported");
    if (g->bias && g->out_dt != ZS_F32)
        return zs_set_error("cuda gemm: the bias epilogue needs an f32 output");
    if (g->batch > INT32_MAX)
        return zs_set_error("cuda gemm: batch %lld too large", (long long)g->batch);
    pthread_once(&once, init);
    if (init_status != ZS_OK)
        return zs_set_error_code(init_status, "cuda gemm: %s", init_msg);

    zs_status st = ZS_OK;
    cublasLtMatmulDesc_t op = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, ld = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    cudaDataType_t tin = cuda_type(g->in_dt), tout = cuda_type(g->out_dt);
    pthread_mutex_lock(&mu);
    LT(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t ta = g->tb ? CUBLAS_OP_T : CUBLAS_OP_N; /* cuBLAS A = our B */
    cublasOperation_t tb = g->ta ? CUBLAS_OP_T : CUBLAS_OP_N; /* cuBLAS B = our A */
    LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    if (g->bias) {
        cublasLtEpilogue_t ep = CUBLASLT_EPILOGUE_BIAS;
        LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep,
                                          sizeof ep));
        LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                          &g->bias, sizeof g->bias));
    }
    /* our B as stored: [K, N] (N x K column-major) or, transposed, [N, K] */
    if ((st = layout(&la, tin, g->tb ? g->K : g->N, g->tb ? g->N : g->K, g->ldb,
                     g->batch, g->sb)) != ZS_OK)
        goto done;
    if ((st = layout(&lb, tin, g->ta ? g->M : g->K, g->ta ? g->K : g->M, g->lda,
                     g->batch, g->sa)) != ZS_OK)
        goto done;
    if ((st = layout(&ld, tout, g->N, g->M, g->ldc, g->batch, g->sc)) != ZS_OK)
        goto done;
    LT(cublasLtMatmulPreferenceCreate(&pref));
    size_t ws = WORKSPACE_BYTES;
    LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                            &ws, sizeof ws));
    uint32_t al[4] = {alignment(g->B), alignment(g->A), alignment(g->C),
                      alignment(g->C)};
    cublasLtMatmulPreferenceAttributes_t which[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (int i = 0; i < 4; i++)
        LT(cublasLtMatmulPreferenceSetAttribute(pref, which[i], &al[i], sizeof al[i]));
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    LT(cublasLtMatmulAlgoGetHeuristic(handle, op, la, lb, ld, ld, pref, 1, &res, &found));
    if (found < 1) {
        st = zs_set_error("cuda gemm: cuBLASLt has no algorithm for M %lld N %lld "
                          "K %lld (%s)", (long long)g->M, (long long)g->N,
                          (long long)g->K, zs_dtype_name(g->in_dt));
        goto done;
    }
    float alpha = 1.0f, beta = 0.0f;
    LT(cublasLtMatmul(handle, op, &alpha, g->B, la, g->A, lb, &beta, g->C, ld, g->C,
                      ld, &res.algo, workspace, WORKSPACE_BYTES,
                      (cudaStream_t)zsk_cuda_stream()));
    st = zsk_cuda_check("gemm");
done:
    if (pref)
        cublasLtMatmulPreferenceDestroy(pref);
    if (la)
        cublasLtMatrixLayoutDestroy(la);
    if (lb)
        cublasLtMatrixLayoutDestroy(lb);
    if (ld)
        cublasLtMatrixLayoutDestroy(ld);
    if (op)
        cublasLtMatmulDescDestroy(op);
    pthread_mutex_unlock(&mu);
    return st;
}
