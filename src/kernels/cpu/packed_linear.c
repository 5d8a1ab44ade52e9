/*
 * kernels/cpu/packed_linear.c - the batch-invariant f32 linear layer on
 * packed weights (contract and layout in packed_linear.h).
 *
 * Work items are (panel, block of rows), panel-major, split into
 * contiguous ranges by the pool: at large M a panel (K * 256 bytes) stays
 * in L2 while every row block of x passes over it; rows are split too only
 * when there are fewer than 4 panels per thread. Within an item, tiles of
 * up to TILE_R = 6 rows x 64 columns (24 zmm accumulators; per k 4 panel
 * loads, 6 broadcasts, 24 FMAs) run the whole k range, then the shared
 * epilogue (zsk_linear_epilogue) writes the 64 columns of each row. At
 * M = 1 a thread runs the two halves of its panel range side by side (two
 * sequential weight streams; one stream with a 1 KB software prefetch was
 * the slowest variant measured). The portable path keeps the accumulators
 * in an L1 array and lets each ISA variant vectorize the fmaf loop.
 *
 * No K blocking: every element's chain is one pass over k, which is the
 * invariant, and the panel of the largest GPT-2 K (3072, 768 KB) fits in
 * L2 anyway.
 *
 * Measured (bench/infer_gemm, 2 threads, the 2-core AMD EPYC VM: cpuid
 * family 25 model 17, i.e. Zen 4, triad 41.5 GB/s, measured peak 235
 * GFLOP/s): M = 1 over GPT-2's five weight shapes read from DRAM 35.3 GB/s
 * of weights, 85% of the triad (zsk_sgemm's GEMV 86%); M = 64 .. 1024
 * 219-231 GFLOP/s, 93-98% of peak, 1.08-1.95x zsk_sgemm.
 * AVX2 path (the same EPYC capped with ZS_CPU_ISA=avx2, bench/infer
 * --only decode, GPT-2 124M f32, batch 1, memory slow and drifting that
 * day): 89.5% and 90.7% of the triad measured before each run (the
 * AVX-512 path 95.0% and 76.1% in the same session). Not yet measured on
 * a CPU that stops at AVX2, where the portable variant is AVX2 code too.
 */
#include "kernels/cpu/packed_linear.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels/cpu/kernels.h"
#include "kernels/cpu/vmath.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define ZSK_LINEAR_AVX512 1
#define AVX512 __attribute__((target("avx512f")))
#define AVX2 __attribute__((target("avx2,fma")))
#endif

#define TILE_R 6            /* rows of the register tile (24 accumulators) */
#define ITEM_FMAS 32768     /* fewer FMAs per work item run on one thread */

static bool force_portable = false;

bool zsk_linear_force_portable(bool on)
{
    bool old = force_portable;
    force_portable = on;
    return old;
}

bool zsk_linear_portable(void) { return force_portable; }

/* ---- epilogue ------------------------------------------------------------ */

/* *v = up to 16 floats of p, zeros past c. By pointer: 64-byte vectors
 * returned by value draw ABI notes from GCC on the baseline variant. A
 * memcpy of variable size became rep movs: the tail goes lane by lane. */
ZSI_VINLINE void load16(zsi_v16f *v, const float *p, int64_t c)
{
    if (c == 16) {
        memcpy(v, p, 64);
        return;
    }
    *v = (zsi_v16f){0};
    for (int64_t j = 0; j < c; j++)
        (*v)[j] = p[j];
}

ZSI_VINLINE void store16(float *p, const zsi_v16f *v, int64_t c)
{
    if (c == 16) {
        memcpy(p, v, 64);
        return;
    }
    for (int64_t j = 0; j < c; j++)
        p[j] = (*v)[j];
}

/* gelu(v) = v / (1 + exp(-2 sqrt(2/pi) (v + 0.044715 v^3))): v -> +inf
 * gives v (exp underflows to 0), v -> -inf gives -0 (exp overflows). */
ZSI_VINLINE void gelu16(zsi_v16f *v)
{
    zsi_v16f x = *v;
    zsi_v16f z = (x + 0.044715f * (x * x * x)) * -1.5957691216057308f;
    zsi_exp_v16f(&z);
    *v = x / (1.0f + z);
}

ZSK_ISA_VOID(zsk_linear_epilogue, (const float *acc, int64_t n,
    const float *bias, const float *res, zsk_act act, float *y),
    (acc, n, bias, res, act, y))
{
    for (int64_t j = 0; j < n; j += 16) {
        int64_t c = n - j < 16 ? n - j : 16;
        zsi_v16f v, t;
        load16(&v, acc + j, c);
        if (bias) {
            load16(&t, bias + j, c);
            v = v + t;
        }
        if (act == ZSK_ACT_GELU_TANH)
            gelu16(&v);
        if (res) {
            load16(&t, res + j, c);
            v = v + t;
        }
        store16(y + j, &v, c);
    }
}

/* ---- packing --------------------------------------------------------------- */

typedef struct pack_job {
    const float *W;
    int64_t N, K;
    float *data;
} pack_job;

static void pack_panels(void *ctx, int64_t p0, int64_t p1)
{
    const pack_job *j = ctx;
    for (int64_t p = p0; p < p1; p++) {
        float *dst = j->data + p * j->K * ZSK_PANEL;
        for (int c = 0; c < ZSK_PANEL; c++) {
            int64_t n = p * ZSK_PANEL + c;
            const float *src = n < j->N ? j->W + n * j->K : NULL;
            for (int64_t k = 0; k < j->K; k++)
                dst[k * ZSK_PANEL + c] = src ? src[k] : 0.0f;
        }
    }
}

zs_status zsk_pack_f32(const float *W, int64_t N, int64_t K, zsk_packed_f32 *out)
{
    if (!out)
        return zs_set_error("pack_f32: NULL output struct");
    *out = (zsk_packed_f32){0};
    if (N < 0 || K < 0)
        return zs_set_error("pack_f32: negative size N = %lld, K = %lld",
                            (long long)N, (long long)K);
    int64_t panels = (N + ZSK_PANEL - 1) / ZSK_PANEL;
    if (N == 0 || K == 0) {
        *out = (zsk_packed_f32){N, K, panels, NULL};
        return ZS_OK;
    }
    if (!W)
        return zs_set_error("pack_f32: NULL weights");
    if (panels > (int64_t)(SIZE_MAX / 2) / ZSK_PANEL / (int64_t)sizeof(float) / K)
        return zs_set_error("pack_f32: N = %lld x K = %lld is too large",
                            (long long)N, (long long)K);
    size_t bytes = (size_t)(panels * K * ZSK_PANEL) * sizeof(float);
    float *data = zs_alloc(bytes);
    if (!data)
        return zs_set_error_code(ZS_ERR_NOMEM, "pack_f32: out of memory (%zu bytes)",
                                 bytes);
    pack_job j = {W, N, K, data};
    zs_parallel_for(panels, 1 + ITEM_FMAS / (K * ZSK_PANEL), pack_panels, &j);
    *out = (zsk_packed_f32){N, K, panels, data};
    return ZS_OK;
}

void zsk_packed_free(zsk_packed_f32 *p)
{
    if (!p)
        return;
    zs_free(p->data);
    *p = (zsk_packed_f32){0};
}

/* ---- tiles: acc[r * 64 + j] = sum_k x[r * ldx + k] * panel[k * 64 + j] ---- */

/* Portable: the same fma chains with fmaf; the accumulators live in acc
 * (L1), which the compiler vectorizes per ISA variant. */
static ZSK_ISA_VOID(tile_c, (int R, const float *x, int64_t ldx,
    const float *p, int64_t K, float *restrict acc), (R, x, ldx, p, K, acc))
{
    for (int i = 0; i < R * ZSK_PANEL; i++)
        acc[i] = 0.0f;
    for (int64_t k = 0; k < K; k++) {
        const float *restrict w = p + k * ZSK_PANEL;
        for (int r = 0; r < R; r++) {
            float xv = x[r * ldx + k];
            float *restrict a = acc + r * ZSK_PANEL;
            for (int j = 0; j < ZSK_PANEL; j++)
                a[j] = fmaf(xv, w[j], a[j]);
        }
    }
}

#ifdef ZSK_LINEAR_AVX512
/* R rows x 64 columns in R * 4 zmm; per k 4 aligned panel loads, R
 * broadcasts, 4R FMAs. */
static inline __attribute__((always_inline, target("avx512f"))) void
tile_avx512_r(const int R, const float *x, int64_t ldx, const float *p, int64_t K,
              float *acc)
{
    __m512 c[TILE_R][4];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
        for (int v = 0; v < 4; v++)
            c[r][v] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k++) {
        const float *w = p + k * ZSK_PANEL;
        __m512 w0 = _mm512_load_ps(w), w1 = _mm512_load_ps(w + 16);
        __m512 w2 = _mm512_load_ps(w + 32), w3 = _mm512_load_ps(w + 48);
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            __m512 xb = _mm512_set1_ps(x[r * ldx + k]);
            c[r][0] = _mm512_fmadd_ps(xb, w0, c[r][0]);
            c[r][1] = _mm512_fmadd_ps(xb, w1, c[r][1]);
            c[r][2] = _mm512_fmadd_ps(xb, w2, c[r][2]);
            c[r][3] = _mm512_fmadd_ps(xb, w3, c[r][3]);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
        for (int v = 0; v < 4; v++)
            _mm512_storeu_ps(acc + r * ZSK_PANEL + 16 * v, c[r][v]);
}

AVX512 static void tile_avx512(int R, const float *x, int64_t ldx, const float *p,
                               int64_t K, float *acc)
{
    switch (R) {
    case 1: tile_avx512_r(1, x, ldx, p, K, acc); break;
    case 2: tile_avx512_r(2, x, ldx, p, K, acc); break;
    case 3: tile_avx512_r(3, x, ldx, p, K, acc); break;
    case 4: tile_avx512_r(4, x, ldx, p, K, acc); break;
    case 5: tile_avx512_r(5, x, ldx, p, K, acc); break;
    default: tile_avx512_r(6, x, ldx, p, K, acc); break;
    }
}

/* M = 1 on two panels at once (two weight streams): acc_a, acc_b [64]. */
AVX512 static void gemv2_avx512(const float *x, const float *pa, const float *pb, int64_t K,
                                float *acc_a, float *acc_b)
{
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    __m512 b0 = a0, b1 = a0, b2 = a0, b3 = a0;
    for (int64_t k = 0; k < K; k++) {
        const float *wa = pa + k * ZSK_PANEL, *wb = pb + k * ZSK_PANEL;
        __m512 xb = _mm512_set1_ps(x[k]);
        a0 = _mm512_fmadd_ps(xb, _mm512_load_ps(wa), a0);
        a1 = _mm512_fmadd_ps(xb, _mm512_load_ps(wa + 16), a1);
        a2 = _mm512_fmadd_ps(xb, _mm512_load_ps(wa + 32), a2);
        a3 = _mm512_fmadd_ps(xb, _mm512_load_ps(wa + 48), a3);
        b0 = _mm512_fmadd_ps(xb, _mm512_load_ps(wb), b0);
        b1 = _mm512_fmadd_ps(xb, _mm512_load_ps(wb + 16), b1);
        b2 = _mm512_fmadd_ps(xb, _mm512_load_ps(wb + 32), b2);
        b3 = _mm512_fmadd_ps(xb, _mm512_load_ps(wb + 48), b3);
    }
    _mm512_storeu_ps(acc_a, a0);
    _mm512_storeu_ps(acc_a + 16, a1);
    _mm512_storeu_ps(acc_a + 32, a2);
    _mm512_storeu_ps(acc_a + 48, a3);
    _mm512_storeu_ps(acc_b, b0);
    _mm512_storeu_ps(acc_b + 16, b1);
    _mm512_storeu_ps(acc_b + 32, b2);
    _mm512_storeu_ps(acc_b + 48, b3);
}

/* AVX2+FMA: a tile of R rows runs the panel as four strips of 16 columns,
 * R * 2 ymm accumulators each (per k 2 aligned panel loads, R broadcasts,
 * 2R FMAs; 6 rows: 12 accumulators of the 16 ymm). Each output's chain is
 * still one pass over k. */
static inline __attribute__((always_inline, target("avx2,fma"))) void
tile_avx2_r(const int R, const float *x, int64_t ldx, const float *p, int64_t K,
            float *acc)
{
    for (int s = 0; s < ZSK_PANEL; s += 16) {
        __m256 c[TILE_R][2];
#pragma GCC unroll 8
        for (int r = 0; r < R; r++)
            c[r][0] = c[r][1] = _mm256_setzero_ps();
        const float *w = p + s;
        for (int64_t k = 0; k < K; k++, w += ZSK_PANEL) {
            __m256 w0 = _mm256_load_ps(w), w1 = _mm256_load_ps(w + 8);
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) {
                __m256 xb = _mm256_broadcast_ss(x + r * ldx + k);
                c[r][0] = _mm256_fmadd_ps(xb, w0, c[r][0]);
                c[r][1] = _mm256_fmadd_ps(xb, w1, c[r][1]);
            }
        }
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            _mm256_storeu_ps(acc + r * ZSK_PANEL + s, c[r][0]);
            _mm256_storeu_ps(acc + r * ZSK_PANEL + s + 8, c[r][1]);
        }
    }
}

AVX2 static void tile_avx2(int R, const float *x, int64_t ldx, const float *p, int64_t K,
                           float *acc)
{
    switch (R) {
    case 1: tile_avx2_r(1, x, ldx, p, K, acc); break;
    case 2: tile_avx2_r(2, x, ldx, p, K, acc); break;
    case 3: tile_avx2_r(3, x, ldx, p, K, acc); break;
    case 4: tile_avx2_r(4, x, ldx, p, K, acc); break;
    case 5: tile_avx2_r(5, x, ldx, p, K, acc); break;
    default: tile_avx2_r(6, x, ldx, p, K, acc); break;
    }
}

/* M = 1 on one panel: the whole 64 columns in 8 ymm accumulators, so the
 * panel is one sequential stream (per k 8 panel loads as FMA operands, 1
 * broadcast). */
AVX2 static void gemv_avx2(const float *x, const float *p, int64_t K, float *acc)
{
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    __m256 a4 = a0, a5 = a0, a6 = a0, a7 = a0;
    for (int64_t k = 0; k < K; k++, p += ZSK_PANEL) {
        __m256 xb = _mm256_broadcast_ss(x + k);
        a0 = _mm256_fmadd_ps(xb, _mm256_load_ps(p), a0);
        a1 = _mm256_fmadd_ps(xb, _mm256_load_ps(p + 8), a1);
        a2 = _mm256_fmadd_ps(xb, _mm256_load_ps(p + 16), a2);
        a3 = _mm256_fmadd_ps(xb, _mm256_load_ps(p + 24), a3);
        a4 = _mm256_fmadd_ps(xb, _mm256_load_ps(p + 32), a4);
        a5 = _mm256_fmadd_ps(xb, _mm256_load_ps(p + 40), a5);
        a6 = _mm256_fmadd_ps(xb, _mm256_load_ps(p + 48), a6);
        a7 = _mm256_fmadd_ps(xb, _mm256_load_ps(p + 56), a7);
    }
    _mm256_storeu_ps(acc, a0);
    _mm256_storeu_ps(acc + 8, a1);
    _mm256_storeu_ps(acc + 16, a2);
    _mm256_storeu_ps(acc + 24, a3);
    _mm256_storeu_ps(acc + 32, a4);
    _mm256_storeu_ps(acc + 40, a5);
    _mm256_storeu_ps(acc + 48, a6);
    _mm256_storeu_ps(acc + 56, a7);
}
#endif

/* ---- driver ------------------------------------------------------------------ */

typedef struct lin_job {
    const zsk_packed_f32 *W;
    const float *x, *bias, *res;
    float *y;
    int64_t M, ldx, ldr, ldy;
    zsk_act act;
    int64_t rb, nrb; /* rows per item, row blocks per panel */
    bool avx512, avx2; /* the path: AVX-512, else AVX2+FMA, else portable */
} lin_job;

/* Epilogue of panel p's columns for row m from acc [64]. */
static void finish(const lin_job *j, int64_t p, int64_t m, const float *acc)
{
    int64_t n0 = p * ZSK_PANEL, N = j->W->N;
    int64_t nc = N - n0 < ZSK_PANEL ? N - n0 : ZSK_PANEL;
    zsk_linear_epilogue_at(acc, n0, nc, m, j->bias, j->res, j->ldr, j->act, j->y, j->ldy);
}

void zsk_linear_epilogue_at(const float *acc, int64_t n0, int64_t nc, int64_t m,
                            const float *bias, const float *res, int64_t ldr, zsk_act act,
                            float *y, int64_t ldy)
{
    zsk_linear_epilogue(acc, nc, bias ? bias + n0 : NULL, res ? res + m * ldr + n0 : NULL,
                        act, y + m * ldy + n0);
}

static void lin_items(void *ctx, int64_t i0, int64_t i1)
{
    const lin_job *j = ctx;
    int64_t N = j->W->N, K = j->W->K;
    _Alignas(64) float acc[TILE_R * ZSK_PANEL];
#ifdef ZSK_LINEAR_AVX512
    /* M = 1 (items are panels): the two halves of the range side by side,
     * two weight streams per thread. */
    if (j->avx512 && j->M == 1 && K > 0 && i1 - i0 >= 2) {
        int64_t h = (i1 - i0) / 2;
        for (int64_t t = 0; t < h; t++) {
            int64_t pa = i0 + t, pb = i0 + h + t;
            gemv2_avx512(j->x, j->W->data + pa * K * ZSK_PANEL,
                         j->W->data + pb * K * ZSK_PANEL, K, acc, acc + ZSK_PANEL);
            finish(j, pa, 0, acc);
            finish(j, pb, 0, acc + ZSK_PANEL);
        }
        i0 += 2 * h;
    }
    if (j->avx2 && j->M == 1 && K > 0) {
        for (; i0 < i1; i0++) {
            gemv_avx2(j->x, j->W->data + i0 * K * ZSK_PANEL, K, acc);
            finish(j, i0, 0, acc);
        }
    }
#endif
    for (int64_t it = i0; it < i1; it++) {
        int64_t p = it / j->nrb, m0 = it % j->nrb * j->rb;
        int64_t m1 = m0 + j->rb < j->M ? m0 + j->rb : j->M;
        int64_t n0 = p * ZSK_PANEL, nc = N - n0 < ZSK_PANEL ? N - n0 : ZSK_PANEL;
        for (int64_t m = m0; m < m1; m += TILE_R) {
            int R = (int)(m1 - m < TILE_R ? m1 - m : TILE_R);
            const float *xm = j->x + m * j->ldx;
            if (K == 0)
                memset(acc, 0, sizeof acc);
#ifdef ZSK_LINEAR_AVX512
            else if (j->avx512)
                tile_avx512(R, xm, j->ldx, j->W->data + p * K * ZSK_PANEL, K, acc);
            else if (j->avx2)
                tile_avx2(R, xm, j->ldx, j->W->data + p * K * ZSK_PANEL, K, acc);
#endif
            else
                tile_c(R, xm, j->ldx, j->W->data + p * K * ZSK_PANEL, K, acc);
            for (int r = 0; r < R; r++)
                zsk_linear_epilogue_at(acc + r * ZSK_PANEL, n0, nc, m + r, j->bias, j->res,
                                       j->ldr, j->act, j->y, j->ldy);
        }
    }
}

/* Byte range [lo, hi) of an [M, n] matrix with row stride ld. */
static void span(const float *p, int64_t M, int64_t n, int64_t ld, uintptr_t *lo,
                 uintptr_t *hi)
{
    *lo = (uintptr_t)p;
    *hi = *lo + (uintptr_t)((M - 1) * ld + n) * sizeof(float);
}

static bool overlap(const float *a, int64_t lda, int64_t na, const float *b,
                    int64_t ldb, int64_t nb, int64_t M)
{
    uintptr_t alo, ahi, blo, bhi;
    span(a, M, na, lda, &alo, &ahi);
    span(b, M, nb, ldb, &blo, &bhi);
    return alo < bhi && blo < ahi;
}

zs_status zsk_linear_check(const char *who, int64_t N, int64_t K, const float *x, int64_t M,
                           int64_t ldx, const float *residual, int64_t ldr, zsk_act act,
                           const float *y, int64_t ldy)
{
    if (N < 0 || K < 0 || M < 0)
        return zs_set_error("%s: negative size M = %lld, N = %lld, K = %lld", who,
                            (long long)M, (long long)N, (long long)K);
    if (act != ZSK_ACT_NONE && act != ZSK_ACT_GELU_TANH)
        return zs_set_error("%s: unknown activation %d", who, (int)act);
    if (M == 0 || N == 0)
        return ZS_OK;
    if ((K > 0 && !x) || !y)
        return zs_set_error("%s: NULL %s", who, !y ? "y" : "x");
    if ((K > 0 && ldx < K) || ldy < N || (residual && ldr < N))
        return zs_set_error("%s: row stride too small (ldx = %lld for K = %lld, ldy = "
                            "%lld, ldr = %lld for N = %lld)",
                            who, (long long)ldx, (long long)K, (long long)ldy,
                            (long long)ldr, (long long)N);
    if (residual && !(residual == y && ldr == ldy) &&
        overlap(residual, ldr, N, y, ldy, N, M))
        return zs_set_error("%s: residual overlaps y without being y", who);
    if (K > 0 && overlap(x, ldx, K, y, ldy, N, M))
        return zs_set_error("%s: x overlaps y", who);
    return ZS_OK;
}

zs_status zsk_packed_linear_f32(const zsk_packed_f32 *W, const float *x, int64_t M,
                                int64_t ldx, const float *bias, const float *residual,
                                int64_t ldr, zsk_act act, float *y, int64_t ldy)
{
    if (!W)
        return zs_set_error("packed_linear: NULL weights");
    int64_t N = W->N, K = W->K;
    zs_status st = zsk_linear_check("packed_linear", N, K, x, M, ldx, residual, ldr, act,
                                    y, ldy);
    if (st < 0 || M == 0 || N == 0)
        return st;
    if (K > 0 && (!W->data || W->panels != (N + ZSK_PANEL - 1) / ZSK_PANEL))
        return zs_set_error("packed_linear: weights not packed (zsk_pack_f32)");

    int nt = zs_num_threads();
    int64_t panels = W->panels, rb = M;
    /* Fewer panels than 4 per thread: split the rows too (whole tiles). */
    if (panels < 4 * (int64_t)nt && M > TILE_R) {
        int64_t want = (4 * (int64_t)nt + panels - 1) / panels;
        rb = (M + want - 1) / want;
        rb = (rb + TILE_R - 1) / TILE_R * TILE_R;
    }
    lin_job j = {W, x, bias, residual, y, M, ldx, ldr, ldy, act, rb, (M + rb - 1) / rb,
                 false, false};
#ifdef ZSK_LINEAR_AVX512
    j.avx512 = !force_portable && zs_cpu()->avx512f;
    j.avx2 = !force_portable && !j.avx512 && zs_cpu()->avx2 && zs_cpu()->fma;
#endif
    int64_t item = rb * (K > 0 ? K : 1) * ZSK_PANEL;
    zs_parallel_for(panels * j.nrb, 1 + ITEM_FMAS / item, lin_items, &j);
    return ZS_OK;
}
