/*
 * kernels/cpu/gemm.h - general matrix multiply on raw pointers.
 *
 * C = alpha * op(A) * op(B) + beta * C, row-major, op(X) = X or X^T.
 * op(A) is M x K, op(B) is K x N, C is M x N; lda/ldb/ldc are row strides
 * in elements of the matrices as stored (A is M x K, or K x M when ta).
 * beta == 0 ignores C's old contents (NaN included). Multithreaded over the
 * pool (serial when called from a pool task).
 *
 * One BLIS-style framework runs every input type (gemm.c): a descriptor
 * per (element type, ISA) names the packers, the micro-kernel with its
 * register tile and the cache blocking (zsk_gemm_desc below), and one
 * driver does the packing, blocking, threading, edge tiles, beta and the
 * skinny shortcuts for all of them. zsk_sgemm runs the f32 descriptor of
 * the best ISA (gemm_f32_avx512.c, gemm_f32_avx2.c, portable gemm_ref.c);
 * zsk_gemm_bf16 / zsk_gemm_f16 (gemm_lowp.h) the 16-bit ones
 * (gemm_bf16_avx512.c, gemm_lowp_avx2.c, gemm_ref.c). zsk_dgemm is the
 * portable row-parallel code of gemm_ref.c. zsk_sgemm_ex adds a fused
 * epilogue (bias, GeLU, residual) applied to each block of C right after
 * its last K block, while the block is in cache, so C goes to memory once
 * and no separate elementwise pass runs.
 */
#ifndef ZS_KERNELS_CPU_GEMM_H
#define ZS_KERNELS_CPU_GEMM_H

#include <stdbool.h>
#include <stdint.h>

void zsk_sgemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
               const float *A, int64_t lda, const float *B, int64_t ldb,
               float beta, float *C, int64_t ldc);
void zsk_dgemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K,
               double alpha, const double *A, int64_t lda, const double *B,
               int64_t ldb, double beta, double *C, int64_t ldc);

/* Epilogue of zsk_sgemm_ex. With v = alpha op(A) op(B) + beta C[i, j]
 * (the full sum over K), each element of C gets, in this order:
 *   v += bias[j]                  bias != NULL, length N
 *   pre[i * ldp + j] = v          gelu and pre != NULL (for backward)
 *   v = gelu_tanh(v)              gelu: 0.5 v (1 + tanh(sqrt(2/pi)
 *                                       (v + 0.044715 v^3)))
 *   v += res[i * ldr + j]         res != NULL, M x N
 *   C[i * ldc + j] = v
 * pre and res must not overlap C (K blocks write partial sums to C before
 * the last one applies the epilogue); for an in-place residual use
 * beta = 1. Borrowed pointers. */
typedef struct zsk_epilogue {
    const float *bias;
    bool gelu;
    float *pre;
    int64_t ldp;
    const float *res;
    int64_t ldr;
    /* bf16 forms (raw bf16 patterns; zsk_gemm_bf16_ex's callers): bias16,
     * pre16 and res16 play bias, pre and res (same strides ldp, ldr; set one
     * form of each, not both); when out16 is set the result, rounded to
     * bf16 (nearest even, NaN kept quiet: zs_f32_to_bf16), is written to
     * out16[i * ldo + j] instead of C: the driver (zsk_gemm_run) then
     * keeps the f32 sums in a per-thread block (MC x NC/number of K
     * blocks) and never writes C, which it reads only for beta != 0 and
     * which may be NULL when beta == 0 (no M x N f32 buffer exists).
     * pre16 is the pre-activation rounded to bf16; with pre16 or out16,
     * GeLU reads that rounded value (as PyTorch's autocast runs gelu on
     * the bf16 linear output), so it can be recomputed from pre16 bit for
     * bit (graph/remat.c). */
    const uint16_t *bias16;
    uint16_t *pre16;
    const uint16_t *res16;
    uint16_t *out16;
    int64_t ldo;
    /* the 16-bit forms hold IEEE halves (zs_f32_to_f16's rounding), not
     * bf16: zsk_gemm_f16_ex's callers */
    bool f16;
} zsk_epilogue;

/* zsk_sgemm followed by the epilogue ep (NULL: plain zsk_sgemm). */
void zsk_sgemm_ex(bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                  float alpha, const float *A, int64_t lda, const float *B,
                  int64_t ldb, float beta, float *C, int64_t ldc,
                  const zsk_epilogue *ep);

/* out[i] = g[i] * gelu_tanh'(h[i]), i < n, for the backward of a GeLU
 * epilogue (h: the saved pre-activation). bf16: g, h and out are raw bf16
 * patterns, computed in f32 and rounded once; else f32. Multithreaded over
 * the pool; AVX-512 (the epilogue's vector tanh, relative error ~3e-7)
 * when the f32 GEMM runs AVX-512, AVX2 + FMA + F16C (the same method on 8 lanes)
 * when zs_cpu() has them, else portable code evaluated in double.
 * out may alias g. */
void zsk_gelu_tanh_bw(bool bf16, const void *g, const void *h, void *out,
                      int64_t n);
/* The two paths of zsk_gelu_tanh_bw, single-threaded (tests). The AVX-512
 * one needs avx512f, avx512bw and avx512vl. */
void zsk_gelu_tanh_bw_ref(bool bf16, const void *g, const void *h, void *out,
                          int64_t n);
void zsk_gelu_tanh_bw_avx512(bool bf16, const void *g, const void *h,
                             void *out, int64_t n);
/* The AVX2 + FMA path (gelu_bw_avx2.c): the same method on 8 lanes, with
 * a division where AVX-512 uses rcp14; relative error ~3e-7. */
void zsk_gelu_tanh_bw_avx2(bool bf16, const void *g, const void *h,
                           void *out, int64_t n);

/* out[i] = GeLU(pre[i]) for i < n exactly as zsk_sgemm_ex's epilogue
 * (ep.gelu, f32) computed it from the pre-activation it stored in ep.pre:
 * the same descriptor's epilogue function, so the same bits (a graph pass
 * recomputes a linear_gelu's output from its saved pre-activation instead
 * of keeping both, graph/remat.c). Over the pool; out must not overlap
 * pre. */
void zsk_sgemm_gelu_of_pre(const float *pre, float *out, int64_t n);
/* gelu_tanh(x) in float, portable (evaluated in double) or AVX-512
 * (vector: ignored when the CPU lacks it); for tests. */
void zsk_gelu_tanh_f32(float *y, const float *x, int64_t n, bool vector);
/* gelu_tanh(x) by the AVX2 epilogue (the portable one when the capped CPU
 * lacks AVX2 + FMA); for tests. */
void zsk_gelu_tanh_f32_avx2(float *y, const float *x, int64_t n);
/* tanh(x), the AVX-512 routine of the epilogue (falls back to libm when the
 * CPU lacks it); relative error < 1e-6. For tests. */
void zsk_tanh_f32_avx512(float *y, const float *x, int64_t n);

/* ---- the GEMM framework (gemm*.c, tests, bench) ---------------------- */

typedef enum zsk_gemm_isa {
    ZSK_GEMM_AUTO = 0, /* best the CPU supports */
    ZSK_GEMM_REF,      /* portable C */
    ZSK_GEMM_AVX2,     /* AVX2 + FMA micro-kernel */
    ZSK_GEMM_AVX512,   /* AVX-512 micro-kernel */
} zsk_gemm_isa;

/* Forces the SGEMM code path (tests, benchmarks); false (and no change)
 * when the CPU lacks it. Not thread-safe against running GEMMs. */
bool zsk_gemm_set_isa(zsk_gemm_isa isa);
/* Name of the SGEMM path in use, e.g. "avx512 14x32". */
const char *zsk_gemm_isa_name(void);

/* Element type of A and B; C and the accumulators are always float32. */
typedef enum zsk_gemm_type {
    ZSK_GEMM_F32,
    ZSK_GEMM_BF16, /* raw bfloat16 bit patterns (uint16_t) */
    ZSK_GEMM_F16,  /* raw IEEE half bit patterns (uint16_t) */
} zsk_gemm_type;

/* Rows to pack, in elements of the type: element (r, k) is
 * x[r * rs + k * ks] (rows of op(A), or columns of op(B)). One of rs, ks is
 * 1 for every transpose; packers take the k-contiguous path when ks == 1,
 * else the rows-contiguous one (rs == 1). */
typedef struct zsk_gemm_src {
    const void *x;
    int64_t rs, ks;
} zsk_gemm_src;

/* Packs rows [0, rows) and k [0, kc) of s into panels of w rows: panel p
 * holds 4-byte units [u][r] (u < ku = ceil(kc / kstep), r < w) at
 * out + p * w * ku; a unit is one float (kstep 1) or a bf16 pair, k = 2u
 * in the low half (kstep 2). f32 units are multiplied by alpha; pair
 * packers ignore it. Rows past `rows` and k past kc are zero. */
typedef void (*zsk_gemm_pack_fn)(zsk_gemm_src s, int64_t rows, int64_t kc,
                                 int w, float alpha, void *out);
/* The micro-kernel: with packed panels a (MR-wide) and b (NR-wide, 64-byte
 * aligned) of ku units, c[i * ldc + j] = alpha * sum_u a[u][i] b[u][j] +
 * beta * c[i * ldc + j] for i < m <= MR, j < n <= NR (beta == 0: c is not
 * read). Kernels of descriptors with alpha_in_pack are called with
 * alpha = 1 and may ignore it. */
typedef void (*zsk_gemm_ukr_fn)(int64_t ku, const void *a, const void *b,
                                float *c, int64_t ldc, int m, int n,
                                float alpha, float beta);
/* Skinny path, M <= ZSK_GEMM_SMALL_M, no packing of B:
 * C[0:M, n0:n1] = alpha * a . op(B)[:, n0:n1] + beta * C, where a is op(A)
 * as a dense M x lda buffer of units (bf16 with K zero-padded to even for
 * kstep 2, f32 for kstep 1); b views the columns of op(B). */
#define ZSK_GEMM_SMALL_M 4
typedef void (*zsk_gemm_small_fn)(int M, int64_t n0, int64_t n1, int64_t K,
                                  float alpha, const void *a, int64_t lda,
                                  zsk_gemm_src b, float beta, float *C,
                                  int64_t ldc);

typedef void (*zsk_sgemm_epi_fn)(const float *t, int64_t ldt, int64_t m,
                                 int64_t n, float *c, int64_t ldc, float beta,
                                 const zsk_epilogue *ep);

/* One (input type, ISA) implementation: what the generic driver of gemm.c
 * needs to run it. Blocking is per descriptor, measured with its kernel. */
typedef struct zsk_gemm_desc {
    const char *name;      /* "avx512 14x32", "bf16 avx512bf16 14x32" */
    zsk_gemm_type type;    /* elements of A and B */
    zsk_gemm_isa isa;      /* what zsk_gemm_set_isa calls it */
    bool (*usable)(void);  /* the CPU runs it; NULL: always */
    int mr, nr;            /* register tile of C */
    int kstep;             /* k elements per packed unit: 1 or 2 */
    bool alpha_in_pack;    /* pack_a applies alpha, the kernel gets 1 */
    int kc, mc, nc;        /* cache blocks: k depth (max; K is split in
                            * equal blocks), rows of A, columns of B */
    zsk_gemm_pack_fn pack_a, pack_b;
    zsk_gemm_ukr_fn ukr;
    zsk_sgemm_epi_fn epi;  /* the epilogue (zsk_sgemm_ex) on this ISA */
    bool gemv;             /* M = 1 or N = 1: unpacked f32 GEMV (f32 only) */
    zsk_gemm_small_fn small; /* M <= ZSK_GEMM_SMALL_M, or NULL */
} zsk_gemm_desc;

/* The descriptors (gemm_ref.c, gemm_f32_avx2.c, gemm_lowp_avx2.c,
 * gemm_f32_avx512.c, gemm_bf16_avx512.c). */
extern const zsk_gemm_desc zsk_gemm_f32_ref, zsk_gemm_bf16_ref,
    zsk_gemm_f16_ref;
extern const zsk_gemm_desc zsk_gemm_f32_avx2;
extern const zsk_gemm_desc zsk_gemm_bf16_avx2, zsk_gemm_f16_avx2;
extern const zsk_gemm_desc zsk_gemm_f32_avx512;
extern const zsk_gemm_desc zsk_gemm_bf16_avx512bf16, zsk_gemm_bf16_avx512,
    zsk_gemm_f16_avx512;

/* The f32 AVX-512 micro-kernel (14 x 32), also run by the 16-bit
 * descriptors that convert to f32 panels. */
void zsk_gemm_f32_avx512_14x32(int64_t ku, const void *a, const void *b,
                               float *c, int64_t ldc, int m, int n,
                               float alpha, float beta);

/* The f32 AVX2 + FMA micro-kernel (6 x 16), also run by the 16-bit AVX2
 * descriptors (gemm_lowp_avx2.c) on panels converted to f32. */
void zsk_gemm_f32_avx2_6x16(int64_t ku, const void *a, const void *b,
                            float *c, int64_t ldc, int m, int n, float alpha,
                            float beta);

/* Every descriptor the CPU can run, into out[0 .. cap); returns how many
 * there are (tests run each one). */
int zsk_gemm_descs(const zsk_gemm_desc **out, int cap);
/* The descriptor that the entry points use now for type t (after
 * zsk_gemm_set_isa and the zsk_lowp_* hooks). */
const zsk_gemm_desc *zsk_gemm_desc_for(zsk_gemm_type t);
/* The generic driver: C = alpha op(A) op(B) + beta C, then ep (NULL: none),
 * the contract of zsk_sgemm_ex with A and B of d's element type. */
void zsk_gemm_run(const zsk_gemm_desc *d, bool ta, bool tb, int64_t M,
                  int64_t N, int64_t K, float alpha, const void *A,
                  int64_t lda, const void *B, int64_t ldb, float beta,
                  float *C, int64_t ldc, const zsk_epilogue *ep);

/* The portable packer of f32 rows into f32 panels (gemm_ref.c), shared by
 * the f32 descriptors of every ISA. */
void zsk_gemm_pack_f32(zsk_gemm_src s, int64_t rows, int64_t kc, int w,
                       float alpha, void *out);

/* Writes c[i * ldc + j] = epilogue(t[i * ldt + j] + beta * c[i * ldc + j])
 * for i < m, j < n (beta == 0: c is not read; ep NULL: no epilogue); ep's
 * pointers are offset to the block's origin. t may be c itself
 * (ldt == ldc). Single-threaded: portable scalar code (gemm_ref.c) and
 * AVX-512 (gemm_f32_avx512.c). */
void zsk_sgemm_epi_ref(const float *t, int64_t ldt, int64_t m, int64_t n,
                       float *c, int64_t ldc, float beta,
                       const zsk_epilogue *ep);
/* The AVX2 + FMA epilogue (gemm_epi_avx2.c; 16-bit forms: the portable
 * one). GeLU error below 1e-6 of max(|gelu|, 1). */
void zsk_sgemm_epi_avx2(const float *t, int64_t ldt, int64_t m, int64_t n,
                        float *c, int64_t ldc, float beta,
                        const zsk_epilogue *ep);
void zsk_sgemm_epi_avx512(const float *t, int64_t ldt, int64_t m, int64_t n,
                          float *c, int64_t ldc, float beta,
                          const zsk_epilogue *ep);
/* ep with its pointers moved to element (i, j) of C, in *out; NULL when ep
 * is NULL. */
const zsk_epilogue *zsk_epilogue_at(const zsk_epilogue *ep, int64_t i,
                                    int64_t j, zsk_epilogue *out);

/* Portable unpacked row-parallel GEMMs (any transposes, strides, beta; the
 * f32 one applies ep, which may be NULL, to each finished row): zsk_dgemm,
 * and the f32 reference of the tests. */
void zsk_sgemm_ref(bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                   float alpha, const float *A, int64_t lda, const float *B,
                   int64_t ldb, float beta, float *C, int64_t ldc,
                   const zsk_epilogue *ep);
void zsk_dgemm_ref(bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                   double alpha, const double *A, int64_t lda,
                   const double *B, int64_t ldb, double beta, double *C,
                   int64_t ldc);


/* The tm x tn grid of T threads (tm * tn = T) for an M x N x K product
 * with micro-kernel d: least padded work per thread plus the elements it
 * packs (A once per NC columns, B once). Shared by the GEMM drivers
 * (gemm.c, fp8_gemm.c). */
void zsk_gemm_choose_grid(const zsk_gemm_desc *d, int64_t M, int64_t N,
                          int64_t K, int T, int *tm, int *tn);

/* Row tiles per thread of the packed driver (gemm.c: threads): each of
 * the T threads' blocks of the zsk_gemm_choose_grid grid is cut into this
 * many row tiles of whole MC blocks, which the threads claim from a
 * counter per column band, so a preempted thread's unclaimed tiles go to
 * the others; a thread packs its band's B once and keeps it (when it
 * takes at most 8 MiB; else one tile per thread). 1: one tile per thread.
 * 0 (the default): the driver's choice. Each element of C is computed by
 * one thread over the same K blocks whatever the tiling: results do not
 * depend on it. Benchmarks set it; not thread-safe against running
 * GEMMs. */
extern int zsk_gemm_tiles_per_thread;
/* Benchmarks: when zsk_gemm_count_cpu is set, every thread of the packed
 * driver adds the CPU time it spent in a GEMM (CLOCK_THREAD_CPUTIME_ID,
 * packing included) to zsk_gemm_cpu_ns. */
extern bool zsk_gemm_count_cpu;
extern _Atomic int_fast64_t zsk_gemm_cpu_ns;

#endif
