/*
 * binary.c - elementwise a op b, a op scalar and axpy for f32/f64 (axpy
 * also for bf16/f16, in f32 with one rounding).
 *
 * Each segment (a run along the innermost merged dim) has a unit-stride
 * fast path that the compiler vectorises; broadcast operands have stride 0
 * (a scalar splat). These kernels are memory bound: bench/bandwidth
 * compares them with a triad measured in the same run. Each segment
 * routine is compiled for AVX-512, AVX2 and baseline x86-64 and picked
 * under ZS_CPU_ISA (ZSK_ISA_VOID, kernels.h).
 */
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/lowp.h"

typedef struct bin_ctx {
    const zsk_iter *it;
    zsk_binop op;
    void *out;
    const void *a, *b;
    double s;
} bin_ctx;

#define DEFINE_BIN_SEG(T, SUF)                                                \
    static ZSK_ISA_VOID(bin_seg_##SUF, (void *p, const int64_t *offs,        \
                                        int64_t n), (p, offs, n))            \
    {                                                                         \
        const bin_ctx *c = p;                                                 \
        int last = c->it->ndim - 1;                                           \
        int64_t sa = c->it->strides[1][last], sb = c->it->strides[2][last];   \
        int64_t so = c->it->strides[0][last];                                 \
        T *restrict o = (T *)c->out + offs[0];                                \
        const T *restrict a = (const T *)c->a + offs[1];                      \
        const T *restrict b = (const T *)c->b + offs[2];                      \
        if (so == 1 && sa == 1 && sb == 1) {                                  \
            switch (c->op) {                                                  \
            case ZSK_ADD: for (int64_t i = 0; i < n; i++) o[i] = a[i] + b[i]; break; \
            case ZSK_SUB: for (int64_t i = 0; i < n; i++) o[i] = a[i] - b[i]; break; \
            case ZSK_MUL: for (int64_t i = 0; i < n; i++) o[i] = a[i] * b[i]; break; \
            case ZSK_DIV: for (int64_t i = 0; i < n; i++) o[i] = a[i] / b[i]; break; \
            }                                                                 \
        } else if (so == 1 && sa == 1 && sb == 0) {                           \
            T y = b[0];                                                       \
            switch (c->op) {                                                  \
            case ZSK_ADD: for (int64_t i = 0; i < n; i++) o[i] = a[i] + y; break; \
            case ZSK_SUB: for (int64_t i = 0; i < n; i++) o[i] = a[i] - y; break; \
            case ZSK_MUL: for (int64_t i = 0; i < n; i++) o[i] = a[i] * y; break; \
            case ZSK_DIV: for (int64_t i = 0; i < n; i++) o[i] = a[i] / y; break; \
            }                                                                 \
        } else if (so == 1 && sa == 0 && sb == 1) {                           \
            T x = a[0];                                                       \
            switch (c->op) {                                                  \
            case ZSK_ADD: for (int64_t i = 0; i < n; i++) o[i] = x + b[i]; break; \
            case ZSK_SUB: for (int64_t i = 0; i < n; i++) o[i] = x - b[i]; break; \
            case ZSK_MUL: for (int64_t i = 0; i < n; i++) o[i] = x * b[i]; break; \
            case ZSK_DIV: for (int64_t i = 0; i < n; i++) o[i] = x / b[i]; break; \
            }                                                                 \
        } else {                                                              \
            for (int64_t i = 0; i < n; i++) {                                 \
                T x = a[i * sa], y = b[i * sb], r;                            \
                switch (c->op) {                                              \
                case ZSK_ADD: r = x + y; break;                               \
                case ZSK_SUB: r = x - y; break;                               \
                case ZSK_MUL: r = x * y; break;                               \
                default: r = x / y; break;                                    \
                }                                                             \
                o[i * so] = r;                                                \
            }                                                                 \
        }                                                                     \
    }                                                                         \
    static ZSK_ISA_VOID(scal_seg_##SUF, (void *p, const int64_t *offs,       \
                                         int64_t n), (p, offs, n))           \
    {                                                                         \
        const bin_ctx *c = p;                                                 \
        int last = c->it->ndim - 1;                                           \
        int64_t so = c->it->strides[0][last], sa = c->it->strides[1][last];   \
        T *restrict o = (T *)c->out + offs[0];                                \
        const T *restrict a = (const T *)c->a + offs[1];                      \
        T y = (T)c->s;                                                        \
        if (so == 1 && sa == 1) {                                             \
            switch (c->op) {                                                  \
            case ZSK_ADD: for (int64_t i = 0; i < n; i++) o[i] = a[i] + y; break; \
            case ZSK_SUB: for (int64_t i = 0; i < n; i++) o[i] = a[i] - y; break; \
            case ZSK_MUL: for (int64_t i = 0; i < n; i++) o[i] = a[i] * y; break; \
            case ZSK_DIV: for (int64_t i = 0; i < n; i++) o[i] = a[i] / y; break; \
            }                                                                 \
            return;                                                           \
        }                                                                     \
        for (int64_t i = 0; i < n; i++) {                                     \
            T x = a[i * sa], r;                                               \
            switch (c->op) {                                                  \
            case ZSK_ADD: r = x + y; break;                                   \
            case ZSK_SUB: r = x - y; break;                                   \
            case ZSK_MUL: r = x * y; break;                                   \
            default: r = x / y; break;                                        \
            }                                                                 \
            o[i * so] = r;                                                    \
        }                                                                     \
    }                                                                         \
    static ZSK_ISA_VOID(axpy_seg_##SUF, (void *p, const int64_t *offs,       \
                                         int64_t n), (p, offs, n))           \
    {                                                                         \
        const bin_ctx *c = p;                                                 \
        int last = c->it->ndim - 1;                                           \
        int64_t so = c->it->strides[0][last], sa = c->it->strides[1][last];   \
        T *restrict o = (T *)c->out + offs[0];                                \
        const T *restrict a = (const T *)c->a + offs[1];                      \
        T al = (T)c->s;                                                       \
        if (so == 1 && sa == 1) {                                             \
            for (int64_t i = 0; i < n; i++)                                   \
                o[i] += al * a[i];                                            \
        } else {                                                              \
            for (int64_t i = 0; i < n; i++)                                   \
                o[i * so] += al * a[i * sa];                                  \
        }                                                                     \
    }

DEFINE_BIN_SEG(float, f32)
DEFINE_BIN_SEG(double, f64)

void zsk_binary(zs_dtype dt, zsk_binop op, const zsk_iter *it, void *out,
                const void *a, const void *b)
{
    bin_ctx c = {it, op, out, a, b, 0};
    zsk_iter_parallel(it, ZSK_GRAIN, dt == ZS_F64 ? bin_seg_f64 : bin_seg_f32, &c);
}

void zsk_binary_scalar(zs_dtype dt, zsk_binop op, const zsk_iter *it,
                       void *out, const void *a, double s)
{
    bin_ctx c = {it, op, out, a, NULL, s};
    zsk_iter_parallel(it, ZSK_GRAIN, dt == ZS_F64 ? scal_seg_f64 : scal_seg_f32, &c);
}

/* 16-bit dst and src (c->op holds the dtype): blocks widened to f32 on the
 * stack, dst + alpha * src in f32, one rounding per element (what the
 * element-by-element form computed). */
#define AXPY16_BLOCK 512

/* m elements of p at stride st widened into x (t: scratch for a gather). */
static inline void widen_strided(zs_dtype dt, const uint16_t *p, int64_t st,
                                 int64_t m, uint16_t *t, float *x)
{
    if (st != 1) {
        for (int64_t i = 0; i < m; i++)
            t[i] = p[i * st];
        p = t;
    }
    zsk_widen16(dt, p, x, m);
}

static ZSK_ISA_VOID(axpy_seg_16, (void *p, const int64_t *offs, int64_t n), (p, offs, n))
{
    const bin_ctx *c = p;
    zs_dtype dt = (zs_dtype)c->op;
    int last = c->it->ndim - 1;
    int64_t so = c->it->strides[0][last], sa = c->it->strides[1][last];
    uint16_t *o = (uint16_t *)c->out + offs[0];
    const uint16_t *a = (const uint16_t *)c->a + offs[1];
    float al = (float)c->s, x[AXPY16_BLOCK], y[AXPY16_BLOCK];
    uint16_t t[AXPY16_BLOCK];
    for (int64_t s = 0; s < n; s += AXPY16_BLOCK) {
        int64_t m = n - s < AXPY16_BLOCK ? n - s : AXPY16_BLOCK;
        uint16_t *os = o + s * so;
        widen_strided(dt, os, so, m, t, x);
        widen_strided(dt, a + s * sa, sa, m, t, y);
        for (int64_t i = 0; i < m; i++)
            x[i] += al * y[i];
        zsk_narrow16(dt, x, so == 1 ? os : t, m);
        for (int64_t i = 0; so != 1 && i < m; i++)
            os[i * so] = t[i];
    }
}

/* axpy must not split one destination element across threads: broadcast
 * sources are fine (dst is never broadcast). */
void zsk_axpy(zs_dtype dt, const zsk_iter *it, void *dst, double alpha,
              const void *src)
{
    if (zsk_is_lowp16(dt)) {
        bin_ctx c = {it, (zsk_binop)dt, dst, src, NULL, alpha};
        zsk_iter_parallel(it, ZSK_GRAIN, axpy_seg_16, &c);
        return;
    }
    bin_ctx c = {it, ZSK_ADD, dst, src, NULL, alpha};
    zsk_iter_parallel(it, ZSK_GRAIN, dt == ZS_F64 ? axpy_seg_f64 : axpy_seg_f32, &c);
}
