/*
 * gemm_ref.c - the portable C parts of the GEMM framework (gemm.h):
 *
 * - the packers of f32 panels from f32, bf16 or f16 rows (zsk_gemm_pack_f32
 *   is also the packer of the f32 AVX2 and AVX-512 descriptors), with
 *   16 x 16 transposes through a buffer where k is contiguous, so reads and
 *   writes both move whole 64-byte lines (scattered single-float writes
 *   ran the dW GEMM of conv2d at 2/3 speed);
 * - a plain-C 4 x 16 micro-kernel that the compiler vectorises
 *   (ZSK_ISA_VOID), and the portable descriptors f32/bf16/f16 built on them:
 *   what the generic driver runs on CPUs without AVX2+FMA (f32) or
 *   AVX-512 (bf16, f16);
 * - the unpacked row-parallel GEMM (K-blocked, i-k-j loop order that
 *   vectorises along N): zsk_dgemm, and zsk_sgemm_ref, the f32 reference
 *   that tests/kernels/test_gemm.c runs beside the packed paths;
 *
 * Also the scalar epilogue (zsk_sgemm_epi_ref) used by every path but the
 * AVX-512 one: evaluated per element in double (GeLU as v sigmoid(2u), the
 * same function as 0.5 v (1 + tanh u) without cancellation for v < 0).
 */
#include <math.h>

#include "kernels/cpu/gemm.h"

#include "kernels/cpu/kernels.h"
#include "zs/core.h"

#define KB 256

/* sqrt(2/pi) and 0.044715, the tanh-form GeLU constants */
#define GELU_S 0.7978845608028654
#define GELU_K 0.044715

static float gelu_ref(float x)
{
    double v = x, u = GELU_S * (v + GELU_K * v * v * v);
    return (float)(v / (1.0 + exp(-2.0 * u)));
}

/* The epilogue with 16-bit operands (gemm.h: bias16, pre16, res16,
 * out16; bf16, or f16 with ep->f16). */
static float from16(const zsk_epilogue *ep, uint16_t h)
{
    return ep->f16 ? zs_f16_to_f32(h) : zs_bf16_to_f32(h);
}

static uint16_t to16(const zsk_epilogue *ep, float v)
{
    return ep->f16 ? zs_f32_to_f16(v) : zs_f32_to_bf16(v);
}

static void epi16_ref(const float *t, int64_t ldt, int64_t m, int64_t n,
                      float *c, int64_t ldc, float beta,
                      const zsk_epilogue *ep)
{
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            float v = t[i * ldt + j];
            if (beta != 0.0f)
                v += beta * c[i * ldc + j];
            if (ep->bias)
                v += ep->bias[j];
            if (ep->bias16)
                v += from16(ep, ep->bias16[j]);
            if (ep->gelu) {
                if (ep->pre)
                    ep->pre[i * ep->ldp + j] = v;
                if (ep->pre16 || ep->out16) { /* GeLU of the 16-bit pre-activation */
                    uint16_t h = to16(ep, v);
                    v = from16(ep, h);
                    if (ep->pre16)
                        ep->pre16[i * ep->ldp + j] = h;
                }
                v = gelu_ref(v);
            }
            if (ep->res)
                v += ep->res[i * ep->ldr + j];
            if (ep->res16)
                v += from16(ep, ep->res16[i * ep->ldr + j]);
            if (ep->out16)
                ep->out16[i * ep->ldo + j] = to16(ep, v);
            else
                c[i * ldc + j] = v;
        }
}

void zsk_sgemm_epi_ref(const float *t, int64_t ldt, int64_t m, int64_t n,
                       float *c, int64_t ldc, float beta,
                       const zsk_epilogue *ep)
{
    if (ep && (ep->bias16 || ep->pre16 || ep->res16 || ep->out16)) {
        epi16_ref(t, ldt, m, n, c, ldc, beta, ep);
        return;
    }
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            float v = t[i * ldt + j];
            if (beta != 0.0f)
                v += beta * c[i * ldc + j];
            if (ep && ep->bias)
                v += ep->bias[j];
            if (ep && ep->gelu) {
                if (ep->pre)
                    ep->pre[i * ep->ldp + j] = v;
                v = gelu_ref(v);
            }
            if (ep && ep->res)
                v += ep->res[i * ep->ldr + j];
            c[i * ldc + j] = v;
        }
}

/* g * gelu_tanh'(h) in double: with t = tanh(u), u = s (v + k v^3),
 * gelu' = (1 + t) / 2 + v (1 - t^2) s (1 + 3 k v^2) / 2. */
static double gelu_grad_ref(double v)
{
    double u = GELU_S * (v + GELU_K * v * v * v), t = tanh(u);
    return 0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * GELU_S * (1.0 + 3.0 * GELU_K * v * v);
}

void zsk_gelu_tanh_bw_ref(bool bf16, const void *g, const void *h, void *out,
                          int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        if (bf16) {
            double gv = zs_bf16_to_f32(((const uint16_t *)g)[i]);
            double hv = zs_bf16_to_f32(((const uint16_t *)h)[i]);
            ((uint16_t *)out)[i] = zs_f32_to_bf16((float)(gv * gelu_grad_ref(hv)));
        } else {
            double gv = ((const float *)g)[i], hv = ((const float *)h)[i];
            ((float *)out)[i] = (float)(gv * gelu_grad_ref(hv));
        }
    }
}

/* EPI(ctx, i, crow) runs once row i of C is complete. */
#define DEFINE_GEMM(T, NAME, EPI)                                             \
    typedef struct NAME##_ctx {                                               \
        bool ta, tb;                                                          \
        int64_t M, N, K, lda, ldb, ldc;                                       \
        T alpha, beta;                                                        \
        const T *A, *B;                                                       \
        T *C;                                                                 \
        const zsk_epilogue *ep;                                               \
    } NAME##_ctx;                                                             \
    static ZSK_ISA_VOID(NAME##_rows, (void *p, int64_t i0, int64_t i1),       \
        (p, i0, i1))                                                          \
    {                                                                         \
        const NAME##_ctx *c = p;                                              \
        for (int64_t i = i0; i < i1; i++) {                                   \
            T *restrict crow = c->C + i * c->ldc;                             \
            for (int64_t j = 0; j < c->N; j++)                                \
                crow[j] = c->beta == 0 ? 0 : c->beta * crow[j];               \
            for (int64_t k0 = 0; k0 < c->K; k0 += KB) {                       \
                int64_t k1 = k0 + KB < c->K ? k0 + KB : c->K;                 \
                for (int64_t k = k0; k < k1; k++) {                           \
                    T a = c->alpha * (c->ta ? c->A[k * c->lda + i]            \
                                            : c->A[i * c->lda + k]);          \
                    if (!c->tb) {                                             \
                        const T *restrict brow = c->B + k * c->ldb;           \
                        for (int64_t j = 0; j < c->N; j++)                    \
                            crow[j] += a * brow[j];                           \
                    } else {                                                  \
                        for (int64_t j = 0; j < c->N; j++)                    \
                            crow[j] += a * c->B[j * c->ldb + k];              \
                    }                                                         \
                }                                                             \
            }                                                                 \
            EPI(c, i, crow);                                                  \
        }                                                                     \
    }

#define EPI_NONE(c, i, crow) (void)0
#define EPI_F32(c, i, crow)                                                   \
    do {                                                                      \
        zsk_epilogue at_;                                                     \
        if (c->ep)                                                            \
            zsk_sgemm_epi_ref(crow, c->ldc, 1, c->N, crow, c->ldc, 0.0f,      \
                              zsk_epilogue_at(c->ep, i, 0, &at_));            \
    } while (0)

DEFINE_GEMM(float, sg, EPI_F32)
DEFINE_GEMM(double, dg, EPI_NONE)

void zsk_sgemm_ref(bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                   float alpha, const float *A, int64_t lda, const float *B,
                   int64_t ldb, float beta, float *C, int64_t ldc,
                   const zsk_epilogue *ep)
{
    sg_ctx c = {ta, tb, M, N, K, lda, ldb, ldc, alpha, beta, A, B, C, ep};
    zs_parallel_for(M, 1 + 65536 / (N * (K + 1) + 1), sg_rows, &c);
}

void zsk_dgemm_ref(bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                   double alpha, const double *A, int64_t lda,
                   const double *B, int64_t ldb, double beta, double *C,
                   int64_t ldc)
{
    dg_ctx c = {ta, tb, M, N, K, lda, ldb, ldc, alpha, beta, A, B, C, NULL};
    zs_parallel_for(M, 1 + 65536 / (N * (K + 1) + 1), dg_rows, &c);
}

/* ---- packers ------------------------------------------------------------ */

static inline float bf16_to_f32(uint16_t h)
{
    union { uint32_t u; float f; } v = {(uint32_t)h << 16};
    return v.f;
}

#define CVT_F32(x) (x)

/* The packer of gemm.h for kstep 1 (units are floats) from elements of
 * type T, converted by CVT. Three paths: k contiguous with w <= 16 (rows of
 * A) and with w a multiple of 16 (columns of B^T) transpose 16 x 16
 * blocks through a buffer, so every store writes a whole run of units;
 * rows contiguous copies a run of rows per k (memcpy for f32 and B). */
#define DEFINE_PACK(NAME, T, CVT)                                             \
    ZSK_ISA_VOID(NAME, (zsk_gemm_src s, int64_t rows, int64_t kc, int w,      \
        float alpha, void *out), (s, rows, kc, w, alpha, out))                \
    {                                                                         \
        const T *x = s.x;                                                     \
        float *restrict dst = out;                                            \
        for (int64_t ip = 0; ip < rows; ip += w, dst += kc * w) {             \
            int64_t nr = rows - ip < w ? rows - ip : w;                       \
            if (s.ks == 1 && w <= 16) {                                       \
                for (int64_t k0 = 0; k0 < kc; k0 += 16) {                     \
                    int64_t kb = kc - k0 < 16 ? kc - k0 : 16;                 \
                    float t[16][16];                                          \
                    for (int64_t r = 0; r < w; r++) {                         \
                        const T *src = x + (ip + r) * s.rs + k0;              \
                        for (int64_t k = 0; k < kb; k++)                      \
                            t[k][r] = r < nr ? alpha * CVT(src[k]) : 0.0f;    \
                    }                                                         \
                    for (int64_t k = 0; k < kb; k++)                          \
                        for (int64_t r = 0; r < w; r++)                       \
                            dst[(k0 + k) * w + r] = t[k][r];                  \
                }                                                             \
            } else if (s.ks == 1 && w % 16 == 0) {                            \
                for (int64_t k0 = 0; k0 < kc; k0 += 16) {                     \
                    int64_t kb = kc - k0 < 16 ? kc - k0 : 16;                 \
                    for (int64_t c0 = 0; c0 < w; c0 += 16) {                  \
                        float t[16][16];                                      \
                        for (int64_t c = 0; c < 16; c++) {                    \
                            int64_t cc = c0 + c;                              \
                            const T *src = x + (ip + cc) * s.rs + k0;         \
                            for (int64_t k = 0; k < kb; k++)                  \
                                t[k][c] = cc < nr ? alpha * CVT(src[k]) : 0.0f; \
                        }                                                     \
                        for (int64_t k = 0; k < kb; k++)                      \
                            for (int64_t c = 0; c < 16; c++)                  \
                                dst[(k0 + k) * w + c0 + c] = t[k][c];         \
                    }                                                         \
                }                                                             \
            } else if (s.ks == 1) {                                           \
                for (int64_t r = 0; r < nr; r++) {                            \
                    const T *src = x + (ip + r) * s.rs;                       \
                    for (int64_t k = 0; k < kc; k++)                          \
                        dst[k * w + r] = alpha * CVT(src[k]);                 \
                }                                                             \
                for (int64_t r = nr; r < w; r++)                              \
                    for (int64_t k = 0; k < kc; k++)                          \
                        dst[k * w + r] = 0.0f;                                \
            } else {                                                          \
                for (int64_t k = 0; k < kc; k++) {                            \
                    const T *src = x + k * s.ks + ip;                         \
                    float *d = dst + k * w;                                   \
                    if (alpha == 1.0f)                                        \
                        for (int64_t r = 0; r < nr; r++)                      \
                            d[r] = CVT(src[r]);                               \
                    else                                                      \
                        for (int64_t r = 0; r < nr; r++)                      \
                            d[r] = alpha * CVT(src[r]);                       \
                    for (int64_t r = nr; r < w; r++)                          \
                        d[r] = 0.0f;                                          \
                }                                                             \
            }                                                                 \
        }                                                                     \
    }

DEFINE_PACK(zsk_gemm_pack_f32, float, CVT_F32)
static DEFINE_PACK(pack_bf16, uint16_t, bf16_to_f32)
static DEFINE_PACK(pack_f16, uint16_t, zs_f16_to_f32)

/* ---- micro-kernel and descriptors --------------------------------------- */

#define PMR 4
#define PNR 16

/* gemm_f32_portable_4x16: a: [ku][PMR] f32, b: [ku][PNR] f32. */
static ZSK_ISA_VOID(ukr_4x16, (int64_t ku, const void *ap, const void *bp,
    float *c, int64_t ldc, int m, int n, float alpha, float beta),
    (ku, ap, bp, c, ldc, m, n, alpha, beta))
{
    const float *a = ap, *b = bp;
    float acc[PMR][PNR] = {{0}};
    for (int64_t u = 0; u < ku; u++)
        for (int i = 0; i < PMR; i++)
            for (int j = 0; j < PNR; j++)
                acc[i][j] += a[u * PMR + i] * b[u * PNR + j];
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            float *p = c + i * ldc + j;
            *p = alpha * acc[i][j] + (beta != 0.0f ? beta * *p : 0.0f);
        }
}

/* Blocking: KC 256, MC 128, NC 1024 (not tuned; the 4x16 kernel's panels
 * are small next to any cache). */
#define PORTABLE(NAME, STR, TYPE, PACK)                                            \
    const zsk_gemm_desc NAME = {                                              \
        .name = STR, .type = TYPE, .isa = ZSK_GEMM_REF,                \
        .mr = PMR, .nr = PNR, .kstep = 1, .alpha_in_pack = true,              \
        .kc = 256, .mc = 128, .nc = 1024, .pack_a = PACK, .pack_b = PACK,     \
        .ukr = ukr_4x16, .epi = zsk_sgemm_epi_ref, .gemv = TYPE == ZSK_GEMM_F32}

PORTABLE(zsk_gemm_f32_ref, "ref 4x16", ZSK_GEMM_F32, zsk_gemm_pack_f32);
PORTABLE(zsk_gemm_bf16_ref, "bf16 ref 4x16", ZSK_GEMM_BF16, pack_bf16);
PORTABLE(zsk_gemm_f16_ref, "f16 ref 4x16", ZSK_GEMM_F16, pack_f16);
