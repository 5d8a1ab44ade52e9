/*
 * kernels/cpu/kernels.h - CPU kernels on raw pointers, shapes and strides.
 *
 * No tensors, no autograd: each kernel can be tested and benchmarked alone
 * against a float64 reference. Float kernels exist for f32 and f64 (the
 * latter for gradient checks). Multithreaded over the pool unless noted.
 * Hot loops are compiled for AVX-512, AVX2 and baseline x86-64 and chosen
 * at run time by the CPU as capped by ZS_CPU_ISA (ZSK_ISA_FN /
 * ZSK_ISA_VOID, below).
 */
#ifndef ZS_KERNELS_CPU_KERNELS_H
#define ZS_KERNELS_CPU_KERNELS_H

#include "kernels/cpu/iter.h"

/* ---- ISA variants chosen under the cap -----------------------------------
 * One source per kernel, three compilations of it, picked per call by the
 * capped zs_cpu() (ZS_CPU_ISA=portable|avx2|avx512), so one AVX-512
 * machine runs and tests the code of every kind of x86-64 CPU:
 *
 *   static ZSK_ISA_VOID(name, (params), (args)) { body }
 *   static ZSK_ISA_FN(ret, name, (params), (args)) { body }
 *
 * defines `name` (static when preceded by `static`, external otherwise:
 * the first declaration of the expansion is name's prototype) as a
 * dispatcher over name_isa_v4 (AVX-512 F/BW/VL, AVX2, FMA, F16C),
 * name_isa_v3 (AVX2, FMA, F16C) and name_isa_v0 (baseline x86-64), each
 * a copy of the body (an always_inline name_isa_body) compiled for its
 * ISA by a target attribute: the compiler vectorises each for its width,
 * as target_clones did. args repeats the parameter names in order. The
 * level is zsk_isa_level(); the features each level needs are exactly
 * those it checks, so a variant never runs on a CPU without them. Cost: a
 * predictable branch and an indirect call per call, so the macros go on
 * functions that do a run of work (a row, a segment, a pool chunk), not
 * on per-element helpers. No ifunc is involved (unlike GCC's
 * target_clones, which this replaced), so it works under ASan/TSan and
 * with any clang. Elsewhere than x86-64 the
 * macros define the plain function. */
#if defined(__x86_64__)
#define ZSK_TGT_V4 __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl")))
#define ZSK_TGT_V3 __attribute__((target("avx2,fma,f16c")))
#define ZSK_ISA_BODY_(ret, name, params)                                      \
    static inline __attribute__((always_inline)) ret name##_isa_body params
#define ZSK_ISA_FN(ret, name, params, args)                                   \
    ret name params;                                                          \
    ZSK_ISA_BODY_(ret, name, params);                                         \
    ZSK_TGT_V4 static ret name##_isa_v4 params { return name##_isa_body args; } \
    ZSK_TGT_V3 static ret name##_isa_v3 params { return name##_isa_body args; } \
    static ret name##_isa_v0 params { return name##_isa_body args; }          \
    ret name params                                                           \
    {                                                                         \
        int l_ = zsk_isa_level();                                             \
        return l_ == 2 ? name##_isa_v4 args                                   \
               : l_ == 1 ? name##_isa_v3 args : name##_isa_v0 args;           \
    }                                                                         \
    ZSK_ISA_BODY_(ret, name, params)
#define ZSK_ISA_VOID(name, params, args)                                      \
    void name params;                                                         \
    ZSK_ISA_BODY_(void, name, params);                                        \
    ZSK_TGT_V4 static void name##_isa_v4 params { name##_isa_body args; }     \
    ZSK_TGT_V3 static void name##_isa_v3 params { name##_isa_body args; }     \
    static void name##_isa_v0 params { name##_isa_body args; }                \
    void name params                                                          \
    {                                                                         \
        int l_ = zsk_isa_level();                                             \
        if (l_ == 2)                                                          \
            name##_isa_v4 args;                                               \
        else if (l_ == 1)                                                     \
            name##_isa_v3 args;                                               \
        else                                                                  \
            name##_isa_v0 args;                                               \
    }                                                                         \
    ZSK_ISA_BODY_(void, name, params)
#else
#define ZSK_ISA_FN(ret, name, params, args) ret name params
#define ZSK_ISA_VOID(name, params, args) void name params
#endif

/* The variant level the ZSK_ISA_* dispatchers take: 2 (AVX-512 F/BW/VL
 * with AVX2, FMA, F16C), 1 (AVX2, FMA, F16C) or 0, from the capped
 * zs_cpu(). */
static inline int zsk_isa_level(void)
{
    const zs_cpu_features *f = zs_cpu();
    bool v3 = f->avx2 && f->fma && f->f16c;
    return v3 && f->avx512f && f->avx512bw && f->avx512vl ? 2 : v3 ? 1 : 0;
}

/* "avx512", "avx2" or "portable": zsk_isa_level() by name (zs sysinfo). */
static inline const char *zsk_isa_name(void)
{
#if defined(__x86_64__)
    static const char *const names[] = {"portable", "avx2", "avx512"};
    return names[zsk_isa_level()];
#else
    return "portable";
#endif
}

/* Elements per chunk below which a kernel runs on one thread. */
#define ZSK_GRAIN 32768

typedef enum zsk_binop { ZSK_ADD, ZSK_SUB, ZSK_MUL, ZSK_DIV } zsk_binop;

/* out = a op b; `it` has 3 operands: out, a, b (element strides). */
void zsk_binary(zs_dtype dt, zsk_binop op, const zsk_iter *it, void *out,
                const void *a, const void *b);
/* out = a op s; `it` has 2 operands: out, a. */
void zsk_binary_scalar(zs_dtype dt, zsk_binop op, const zsk_iter *it,
                       void *out, const void *a, double s);
/* dst += alpha * src; `it` has 2 operands: dst, src. dt: f32, f64, bf16 or
 * f16 (16-bit: computed in f32, one rounding per element). */
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
