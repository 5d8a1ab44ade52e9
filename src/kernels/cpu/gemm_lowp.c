/*
 * gemm_lowp.c - bf16 / f16 GEMM driver (contract in gemm_lowp.h).
 *
 * BLIS-style loops, written once for every scheme (packed unit format,
 * register block, packers, micro-kernel):
 *   threads split N (M when M > N) into runs of whole register blocks;
 *   per thread: jc over NC columns, pc over KU k units (pack B block),
 *   ic over MC rows (pack A block), jr over NR, ir over MR: micro-kernel.
 * Each thread packs its own A and B blocks into zs_alloc'd buffers (cached
 * by the allocator, so repeated calls do not fault pages in). The portable
 * scheme packs to f32 with scalar conversions and runs a plain-C 4 x 16
 * kernel that the compiler vectorises; should a buffer allocation fail, a
 * direct triple loop computes the same result. M <= ZSK_LOWP_SMALL_M goes
 * to the scheme's skinny kernel (op(A) copied densely, op(B) read in place,
 * threads split N in runs of SMALL_COLS columns).
 */
#include "kernels/cpu/gemm_lowp.h"

#include "kernels/cpu/kernels.h"
#include "zs/core.h"

bool zsk_lowp_force_fallback;
bool zsk_lowp_force_bf16_as_f32;

typedef enum infmt { IN_BF16, IN_F16 } infmt;

static float bf16_to_f32(uint16_t h)
{
    union { uint32_t u; float f; } v = {(uint32_t)h << 16};
    return v.f;
}

static float to_f32(infmt f, uint16_t h)
{
    return f == IN_BF16 ? bf16_to_f32(h) : zs_f16_to_f32(h);
}

/* ---- portable scheme -------------------------------------------------- */

#define PMR 4
#define PNR 16

static void pack_portable(infmt f, zsk_lowp_src s, int64_t rows, int64_t kc,
                          int w, uint32_t *out)
{
    float *o = (float *)out;
    for (int64_t r0 = 0; r0 < rows; r0 += w, o += w * kc)
        for (int64_t k = 0; k < kc; k++)
            for (int r = 0; r < w; r++)
                o[k * w + r] = r0 + r < rows
                                   ? to_f32(f, s.x[(r0 + r) * s.rs + k * s.ks])
                                   : 0.0f;
}

static void pack_portable_bf16(zsk_lowp_src s, int64_t rows, int64_t kc,
                               int w, uint32_t *out)
{
    pack_portable(IN_BF16, s, rows, kc, w, out);
}

static void pack_portable_f16(zsk_lowp_src s, int64_t rows, int64_t kc, int w,
                              uint32_t *out)
{
    pack_portable(IN_F16, s, rows, kc, w, out);
}

/* gemm_f32_portable_4x16: a: [ku][PMR] f32, b: [ku][PNR] f32. */
ZSK_CLONES static void kernel_portable(int64_t ku, const uint32_t *a,
                                       const uint32_t *b, float *c,
                                       int64_t ldc, int mr, int nr,
                                       float alpha, float beta)
{
    const float *af = (const float *)a, *bf = (const float *)b;
    float acc[PMR][PNR] = {{0}};
    for (int64_t u = 0; u < ku; u++)
        for (int i = 0; i < PMR; i++)
            for (int j = 0; j < PNR; j++)
                acc[i][j] += af[u * PMR + i] * bf[u * PNR + j];
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++) {
            float *p = c + i * ldc + j;
            *p = alpha * acc[i][j] + (beta != 0 ? beta * *p : 0.0f);
        }
}

static const zsk_lowp_scheme PORTABLE_BF16 = {
    "bf16-portable-4x16", PMR, PNR, 1, 256, 128, 1024,
    pack_portable_bf16, pack_portable_bf16, kernel_portable, NULL};
static const zsk_lowp_scheme PORTABLE_F16 = {
    "f16-portable-4x16", PMR, PNR, 1, 256, 128, 1024,
    pack_portable_f16, pack_portable_f16, kernel_portable, NULL};

/* ---- driver ----------------------------------------------------------- */

typedef struct job {
    const zsk_lowp_scheme *s;
    infmt f;
    bool split_n;
    int64_t M, N, K;
    float alpha, beta;
    zsk_lowp_src a, b; /* rows of op(A); columns of op(B) */
    float *C;
    int64_t ldc;
} job;

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
static int64_t round_up(int64_t a, int64_t b) { return (a + b - 1) / b * b; }

static zsk_lowp_src src_at(zsk_lowp_src s, int64_t r, int64_t k)
{
    return (zsk_lowp_src){s.x + r * s.rs + k * s.ks, s.rs, s.ks};
}

/* C[m0:m1, n0:n1] on one thread with packing buffers abuf, bbuf. */
static void run_block(const job *j, int64_t m0, int64_t m1, int64_t n0,
                      int64_t n1, uint32_t *abuf, uint32_t *bbuf)
{
    const zsk_lowp_scheme *s = j->s;
    int64_t kcb = (int64_t)s->kub * s->kstep;
    for (int64_t jc = n0; jc < n1; jc += s->ncb) {
        int64_t nc = min64(s->ncb, n1 - jc);
        for (int64_t pc = 0; pc < j->K; pc += kcb) {
            int64_t kc = min64(kcb, j->K - pc);
            int64_t ku = (kc + s->kstep - 1) / s->kstep;
            float beta = pc == 0 ? j->beta : 1.0f;
            s->pack_b(src_at(j->b, jc, pc), nc, kc, s->nr, bbuf);
            for (int64_t ic = m0; ic < m1; ic += s->mcb) {
                int64_t mc = min64(s->mcb, m1 - ic);
                s->pack_a(src_at(j->a, ic, pc), mc, kc, s->mr, abuf);
                for (int64_t jr = 0; jr < nc; jr += s->nr)
                    for (int64_t ir = 0; ir < mc; ir += s->mr)
                        s->kernel(ku, abuf + ir * ku, bbuf + jr * ku,
                                  j->C + (ic + ir) * j->ldc + jc + jr, j->ldc,
                                  (int)min64(s->mr, mc - ir),
                                  (int)min64(s->nr, nc - jr), j->alpha, beta);
            }
        }
    }
}

/* Unpacked triple loop, the path of last resort when buffers fail. */
static void run_direct(const job *j, int64_t m0, int64_t m1, int64_t n0,
                       int64_t n1)
{
    for (int64_t i = m0; i < m1; i++)
        for (int64_t n = n0; n < n1; n++) {
            float acc = 0;
            for (int64_t k = 0; k < j->K; k++)
                acc += to_f32(j->f, j->a.x[i * j->a.rs + k * j->a.ks]) *
                       to_f32(j->f, j->b.x[n * j->b.rs + k * j->b.ks]);
            float *p = j->C + i * j->ldc + n;
            *p = j->alpha * acc + (j->beta != 0 ? j->beta * *p : 0.0f);
        }
}

/* Pool task over [b, e) register blocks of the split dimension. */
static void run_range(void *ctx, int64_t b, int64_t e)
{
    const job *j = ctx;
    const zsk_lowp_scheme *s = j->s;
    int64_t m0 = 0, m1 = j->M, n0 = 0, n1 = j->N;
    if (j->split_n) {
        n0 = b * s->nr;
        n1 = min64(e * s->nr, j->N);
    } else {
        m0 = b * s->mr;
        m1 = min64(e * s->mr, j->M);
    }
    int64_t ku = min64(s->kub, (j->K + s->kstep - 1) / s->kstep);
    size_t abytes = (size_t)(round_up(min64(s->mcb, m1 - m0), s->mr) * ku * 4);
    size_t bbytes = (size_t)(round_up(min64(s->ncb, n1 - n0), s->nr) * ku * 4);
    uint32_t *abuf = zs_alloc(abytes), *bbuf = zs_alloc(bbytes);
    if (abuf && bbuf)
        run_block(j, m0, m1, n0, n1, abuf, bbuf);
    else
        run_direct(j, m0, m1, n0, n1);
    zs_free(abuf);
    zs_free(bbuf);
}

/* Skinny M: op(A) copied to a dense buffer, op(B) read in place. */
typedef struct small_job {
    const job *j;
    const void *a;
    int64_t lda;
} small_job;

#define SMALL_COLS 128

static void small_range(void *ctx, int64_t b, int64_t e)
{
    const small_job *sj = ctx;
    const job *j = sj->j;
    j->s->small((int)j->M, b * SMALL_COLS, min64(e * SMALL_COLS, j->N), j->K,
                j->alpha, sj->a, sj->lda, j->b, j->beta, j->C, j->ldc);
}

/* Returns false (nothing done) when the A buffer cannot be allocated. */
static bool run_small(const job *j)
{
    bool pairs = j->s->kstep == 2;
    int64_t lda = pairs ? j->K + (j->K & 1) : j->K;
    void *a = zs_alloc((size_t)(j->M * lda) * (pairs ? 2 : 4));
    if (!a)
        return false;
    for (int64_t i = 0; i < j->M; i++)
        for (int64_t k = 0; k < lda; k++) {
            uint16_t h = k < j->K ? j->a.x[i * j->a.rs + k * j->a.ks] : 0;
            if (pairs)
                ((uint16_t *)a)[i * lda + k] = h;
            else
                ((float *)a)[i * lda + k] = to_f32(j->f, h);
        }
    small_job sj = {j, a, lda};
    int64_t nblk = (j->N + SMALL_COLS - 1) / SMALL_COLS;
    int64_t grain = 1 + (1 << 18) / (2 * SMALL_COLS * j->M * j->K + 1);
    zs_parallel_for(nblk, grain, small_range, &sj);
    zs_free(a);
    return true;
}

/* C = beta * C (alpha == 0 or K == 0). */
static void scale_c(int64_t M, int64_t N, float beta, float *C, int64_t ldc)
{
    for (int64_t i = 0; i < M; i++)
        for (int64_t n = 0; n < N; n++)
            C[i * ldc + n] = beta == 0 ? 0.0f : beta * C[i * ldc + n];
}

static void gemm_lowp(infmt f, bool ta, bool tb, int64_t M, int64_t N,
                      int64_t K, float alpha, const uint16_t *A, int64_t lda,
                      const uint16_t *B, int64_t ldb, float beta, float *C,
                      int64_t ldc)
{
    if (M <= 0 || N <= 0)
        return;
    if (K <= 0 || alpha == 0) {
        scale_c(M, N, beta, C, ldc);
        return;
    }
    const zsk_lowp_scheme *s = NULL;
    if (!zsk_lowp_force_fallback)
        s = f == IN_BF16 ? zsk_lowp_scheme_bf16_avx512()
                         : zsk_lowp_scheme_f16_avx512();
    if (!s)
        s = f == IN_BF16 ? &PORTABLE_BF16 : &PORTABLE_F16;
    job j = {s, f, N >= M, M, N, K, alpha, beta,
             {A, ta ? 1 : lda, ta ? lda : 1}, {B, tb ? ldb : 1, tb ? 1 : ldb},
             C, ldc};
    if (s->small && M <= ZSK_LOWP_SMALL_M && run_small(&j))
        return;
    /* Split into runs of register blocks of at least ~1 MFLOP each. */
    int64_t blk = j.split_n ? s->nr : s->mr;
    int64_t other = j.split_n ? M : N;
    int64_t nblk = ((j.split_n ? N : M) + blk - 1) / blk;
    int64_t grain = 1 + (1 << 20) / (2 * blk * other * K + 1);
    zs_parallel_for(nblk, grain, run_range, &j);
}

void zsk_gemm_bf16(bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                   float alpha, const uint16_t *A, int64_t lda,
                   const uint16_t *B, int64_t ldb, float beta, float *C,
                   int64_t ldc)
{
    gemm_lowp(IN_BF16, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void zsk_gemm_f16(bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                  float alpha, const uint16_t *A, int64_t lda,
                  const uint16_t *B, int64_t ldb, float beta, float *C,
                  int64_t ldc)
{
    gemm_lowp(IN_F16, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}
