/*
 * kernels/cpu/kernels.h - CPU kernels on raw pointers, shapes and strides.
 *
 * No tensors, no autograd: each kernel can be tested and benchmarked alone
 * against a float64 reference. Float kernels exist for f32 and f64 (the
 * latter for gradient checks). Multithreaded over the pool unless noted.
 * Hot loops are compiled for AVX-512, AVX2 and baseline x86-64 and chosen
 * at run time (ZSK_CLONES).
 */
#ifndef ZS_KERNELS_CPU_KERNELS_H
#define ZS_KERNELS_CPU_KERNELS_H

#include "kernels/cpu/iter.h"

/* One version of each kernel, not clones, where clones do not work:
 * - under ASan (gcc defines __SANITIZE_ADDRESS__, clang answers
 *   __has_feature(address_sanitizer); fuzzing builds use ASan too);
 * - under TSan (__SANITIZE_THREAD__, __has_feature(thread_sanitizer)): the
 *   clones' ifunc resolvers run before the TSan runtime is set up;
 * - with clang before 18, which names the dispatcher of an external
 *   function "name.ifunc", so calls from other files (zsk_sum_f32) do not
 *   link (llvm-project #61219, fixed by PR #71706). */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define ZSI_NO_CLONES 1
#elif defined(__clang__) && __clang_major__ < 18
#define ZSI_NO_CLONES 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define ZSI_NO_CLONES 1
#endif
#endif

#if defined(__x86_64__) && !defined(ZSI_NO_CLONES)
#define ZSK_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define ZSK_CLONES
#endif

/* Elements per chunk below which a kernel runs on one thread. */
#define ZSK_GRAIN 32768

typedef enum zsk_binop { ZSK_ADD, ZSK_SUB, ZSK_MUL, ZSK_DIV } zsk_binop;

/* out = a op b; `it` has 3 operands: out, a, b (element strides). */
void zsk_binary(zs_dtype dt, zsk_binop op, const zsk_iter *it, void *out,
                const void *a, const void *b);
/* out = a op s; `it` has 2 operands: out, a. */
void zsk_binary_scalar(zs_dtype dt, zsk_binop op, const zsk_iter *it,
                       void *out, const void *a, double s);
/* dst += alpha * src; `it` has 2 operands: dst, src. */
void zsk_axpy(zs_dtype dt, const zsk_iter *it, void *dst, double alpha,
              const void *src);

/* Reductions over a contiguous [O, R, K] array into out [O, K].
 * sum accumulates in double (f32 input: blocked float lanes, then double). */
void zsk_reduce_sum(zs_dtype dt, const void *x, int64_t O, int64_t R,
                    int64_t K, void *out);
/* The same for bf16 / f16 x (dt), out = sum * scale in dt, one rounding;
 * summed in f32 lanes over blocks of 256 with double totals (K == 1) or in
 * double per column (K > 1). Parallel over (o, blocks of 256 columns). */
void zsk_reduce_sum_lp(zs_dtype dt, const void *x, int64_t O, int64_t R,
                       int64_t K, double scale, void *out);
/* Sum of x[0, n) in double; f32 uses 16 float lanes over blocks of 256 with
 * block totals in double. Single-threaded (a row primitive). */
double zsk_sum_f32(const float *x, int64_t n);
double zsk_sum_f64(const double *x, int64_t n);

#endif
