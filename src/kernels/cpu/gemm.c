/*
 * gemm.c - the SGEMM driver: BLIS-style packing and cache blocking around a
 * small SIMD micro-kernel, GEMV paths for M = 1 or N = 1, threading, and
 * run-time selection of the micro-kernel (gemm_avx512.c, gemm_avx2.c; the
 * portable gemm_ref.c when neither AVX2+FMA nor AVX-512 is present).
 *
 * Loops, per thread, over its own block of C (rows [m0, m1), columns
 * [n0, n1)):
 *   jc: NC columns   - B block (KC x NC) packed into NR-wide panels (L3)
 *    pc: KC depth    - beta applies on the first KC step only
 *     ic: MC rows    - A block (MC x KC, times alpha) packed into MR-tall
 *                      panels (L2)
 *      jr: NR cols   - one B micro-panel (KC x NR), from L2
 *       ir: MR rows  - micro-kernel: MR x NR tile of C in registers
 *     (epilogue)     - on the last KC step, over the MC x NC block of C
 *                      just written
 * Blocking for Zen 5 (48 KiB L1D, 1 MiB L2 per core, 32 MiB L3) with the
 * 14x32 AVX-512 kernel: KC up to 1024, split evenly over K (one block for
 * K = 768 or 1024), MC = 42, NC = 2048. A block (168 KiB) and the B
 * micro-panel (128 KiB) both sit in L2, which feeds the kernel's ~13 B per
 * cycle easily; the B block (8 MiB per thread) sits in L3. The deep KC
 * matters most: each micro-kernel call pays a fixed cost (zeroing 28
 * accumulators, reading and writing the C tile, draining the FMA chains),
 * and on one thread (267 GFLOP/s peak) 2048^3 ran at 215 GFLOP/s with the
 * textbook KC = 256 / MC = 168 (B micro-panel in L1), 238 with KC = 768,
 * 245 with KC = 1024; 1024x3072x768 at 219 vs 253. MC and NC moved results
 * by less than the noise (+-2%).
 *
 * Threads: C is cut into a tm x tn grid of blocks (tm * tn = threads,
 * blocks aligned to MR / NR), the grid chosen to minimise each thread's
 * padded work plus its packing; a thread packs the A and B parts its block
 * needs, so threads share nothing and never wait for each other. Skinny
 * shapes therefore split N (small M, huge N) or M (small N). M = 1 or
 * N = 1 is a matrix-vector product, memory-bound: no packing, split over
 * the output.
 *
 * Epilogues (zsk_sgemm_ex: bias, GeLU, residual) run on C once its sum
 * over K is complete, while it is still in cache: per MC x NC block after
 * the last K block (AVX-512 vector code, or scalar on the AVX2 path), per
 * finished block of y in the GEMV paths, per finished row in the portable
 * path; C thus reaches memory once. Measured on 1024x3072x768, 1 thread,
 * cost over the bare GEMM: applying it inside the micro-kernel per 14 x 32
 * tile cost 4% for a bias and 20% for a residual (14 rows 12 KiB apart
 * per tile, 128 bytes each, defeat the hardware prefetchers; software
 * prefetch recovered only 3 points); per 42 x 256 block 1% and 11%; per
 * 42 x 2048 block 1-2% and 8-9%, the residual rows then streaming in 8 KiB
 * runs. GeLU adds about 3.5% (its vector math).
 */
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/kernels.h"

#define MC 42       /* rows of the packed A block: 3 panels of 14 */
#define KC_MAX 1024 /* depth of the packed blocks, balanced over K */
#define NC 2048     /* columns of the packed B block */

/* Below this many multiply-adds a GEMM runs on one thread. */
#define PAR_MIN_MACS (48 * 48 * 48)

static zsk_gemm_isa forced = ZSK_GEMM_AUTO;

static zsk_gemm_isa best_isa(void)
{
    const zs_cpu_features *f = zs_cpu();
    if (f->avx512f)
        return ZSK_GEMM_AVX512;
    if (f->avx2 && f->fma)
        return ZSK_GEMM_AVX2;
    return ZSK_GEMM_REF;
}

static zsk_gemm_isa current_isa(void)
{
    return forced != ZSK_GEMM_AUTO ? forced : best_isa();
}

bool zsk_gemm_set_isa(zsk_gemm_isa isa)
{
    const zs_cpu_features *f = zs_cpu();
    if ((isa == ZSK_GEMM_AVX512 && !f->avx512f) ||
        (isa == ZSK_GEMM_AVX2 && !(f->avx2 && f->fma)))
        return false;
    forced = isa;
    return true;
}

static zsk_sgemm_epi_fn current_epi(void)
{
    return current_isa() == ZSK_GEMM_AVX512 ? zsk_sgemm_epi_avx512
                                            : zsk_sgemm_epi_ref;
}

const zsk_epilogue *zsk_epilogue_at(const zsk_epilogue *ep, int64_t i,
                                    int64_t j, zsk_epilogue *out)
{
    if (!ep)
        return NULL;
    *out = *ep;
    if (out->bias)
        out->bias += j;
    if (out->pre)
        out->pre += i * out->ldp + j;
    if (out->res)
        out->res += i * out->ldr + j;
    return out;
}

void zsk_gelu_tanh_f32(float *y, const float *x, int64_t n, bool vector)
{
    zsk_epilogue ep = {.gelu = true};
    if (vector && zs_cpu()->avx512f)
        zsk_sgemm_epi_avx512(x, n, 1, n, y, n, 0.0f, &ep);
    else
        zsk_sgemm_epi_ref(x, n, 1, n, y, n, 0.0f, &ep);
}

static const zsk_sgemm_ukr *current_ukr(void)
{
    switch (current_isa()) {
    case ZSK_GEMM_AVX512: return &zsk_sgemm_ukr_avx512;
    case ZSK_GEMM_AVX2: return &zsk_sgemm_ukr_avx2;
    default: return NULL;
    }
}

const char *zsk_gemm_isa_name(void)
{
    const zsk_sgemm_ukr *u = current_ukr();
    return u ? u->name : "ref";
}

/* ---- packing ------------------------------------------------------------ */

/* Packs rows [i0, i0+m) x depth [p0, p0+kc) of alpha * op(A) into MR-tall
 * panels: dst[panel][k][MR], rows past m zero. */
ZSK_CLONES static void pack_a(bool ta, const float *A, int64_t lda,
                              int64_t i0, int64_t m, int64_t p0, int64_t kc,
                              float alpha, int MR, float *restrict dst)
{
    for (int64_t ip = 0; ip < m; ip += MR, dst += kc * MR) {
        int64_t mr = m - ip < MR ? m - ip : MR;
        if (!ta && MR <= 16) {
            /* rows have k contiguous: transpose 16-deep blocks through a
             * small buffer so every store writes a whole MR-wide row */
            for (int64_t k0 = 0; k0 < kc; k0 += 16) {
                int64_t kb = kc - k0 < 16 ? kc - k0 : 16;
                float t[16][16];
                for (int64_t r = 0; r < MR; r++) {
                    const float *src = A + (i0 + ip + r) * lda + p0 + k0;
                    for (int64_t k = 0; k < kb; k++)
                        t[k][r] = r < mr ? alpha * src[k] : 0.0f;
                }
                for (int64_t k = 0; k < kb; k++)
                    for (int64_t r = 0; r < MR; r++)
                        dst[(k0 + k) * MR + r] = t[k][r];
            }
        } else if (!ta) {
            for (int64_t r = 0; r < mr; r++) {
                const float *src = A + (i0 + ip + r) * lda + p0;
                for (int64_t k = 0; k < kc; k++)
                    dst[k * MR + r] = alpha * src[k];
            }
            for (int64_t r = mr; r < MR; r++)
                for (int64_t k = 0; k < kc; k++)
                    dst[k * MR + r] = 0.0f;
        } else {
            for (int64_t k = 0; k < kc; k++) {
                const float *src = A + (p0 + k) * lda + i0 + ip;
                float *d = dst + k * MR;
                for (int64_t r = 0; r < mr; r++)
                    d[r] = alpha * src[r];
                for (int64_t r = mr; r < MR; r++)
                    d[r] = 0.0f;
            }
        }
    }
}

/* Packs depth [p0, p0+kc) x columns [j0, j0+n) of op(B) into NR-wide
 * panels: dst[panel][k][NR], columns past n zero. */
ZSK_CLONES static void pack_b(bool tb, const float *B, int64_t ldb,
                              int64_t p0, int64_t kc, int64_t j0, int64_t n,
                              int NR, float *restrict dst)
{
    for (int64_t jp = 0; jp < n; jp += NR, dst += kc * NR) {
        int64_t nr = n - jp < NR ? n - jp : NR;
        if (!tb) {
            for (int64_t k = 0; k < kc; k++) {
                const float *src = B + (p0 + k) * ldb + j0 + jp;
                float *d = dst + k * NR;
                for (int64_t c = 0; c < nr; c++)
                    d[c] = src[c];
                for (int64_t c = nr; c < NR; c++)
                    d[c] = 0.0f;
            }
        } else if (NR % 16 == 0) {
            /* columns have k contiguous: 16 x 16 blocks through a buffer,
             * so reads and writes both move whole 64-byte lines (scattered
             * single-float writes ran the dW GEMM of conv2d at 2/3 speed) */
            for (int64_t k0 = 0; k0 < kc; k0 += 16) {
                int64_t kb = kc - k0 < 16 ? kc - k0 : 16;
                for (int64_t c0 = 0; c0 < NR; c0 += 16) {
                    float t[16][16];
                    for (int64_t c = 0; c < 16; c++) {
                        int64_t cc = c0 + c;
                        const float *src = B + (j0 + jp + cc) * ldb + p0 + k0;
                        for (int64_t k = 0; k < kb; k++)
                            t[k][c] = cc < nr ? src[k] : 0.0f;
                    }
                    for (int64_t k = 0; k < kb; k++)
                        for (int64_t c = 0; c < 16; c++)
                            dst[(k0 + k) * NR + c0 + c] = t[k][c];
                }
            }
        } else {
            for (int64_t c = 0; c < nr; c++) {
                const float *src = B + (j0 + jp + c) * ldb + p0;
                for (int64_t k = 0; k < kc; k++)
                    dst[k * NR + c] = src[k];
            }
            for (int64_t c = nr; c < NR; c++)
                for (int64_t k = 0; k < kc; k++)
                    dst[k * NR + c] = 0.0f;
        }
    }
}

/* ---- packed GEMM -------------------------------------------------------- */

typedef struct sgemm_job {
    bool ta, tb;
    int64_t M, N, K, lda, ldb, ldc;
    float alpha, beta;
    const float *A, *B;
    float *C;
    const zsk_sgemm_ukr *u;
    const zsk_epilogue *ep; /* NULL: none */
    zsk_sgemm_epi_fn epi;
    int tm, tn;             /* thread grid */
} sgemm_job;

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
static int64_t ceil_to(int64_t x, int64_t q) { return (x + q - 1) / q * q; }

/* Depth of the K blocks: at most KC_MAX, all nearly equal. */
static int64_t kc_for(int64_t K)
{
    int64_t nk = (K + KC_MAX - 1) / KC_MAX;
    return (K + nk - 1) / nk;
}

/* C[m0:m1, n0:n1] with packing buffers ap (MC x KC) and bp (KC x NC). */
static void sgemm_block(const sgemm_job *j, int64_t m0, int64_t m1,
                        int64_t n0, int64_t n1, float *ap, float *bp)
{
    const int MR = j->u->mr, NR = j->u->nr;
    const int64_t kcb = kc_for(j->K);
    for (int64_t jc = n0; jc < n1; jc += NC) {
        int64_t nc = min64(NC, n1 - jc);
        for (int64_t pc = 0; pc < j->K; pc += kcb) {
            int64_t kc = min64(kcb, j->K - pc);
            float beta = pc == 0 ? j->beta : 1.0f;
            bool last = pc + kc >= j->K;
            pack_b(j->tb, j->B, j->ldb, pc, kc, jc, nc, NR, bp);
            for (int64_t ic = m0; ic < m1; ic += MC) {
                int64_t mc = min64(MC, m1 - ic);
                pack_a(j->ta, j->A, j->lda, ic, mc, pc, kc, j->alpha, MR, ap);
                for (int64_t jr = 0; jr < nc; jr += NR) {
                    const float *b = bp + jr * kc;
                    int n = (int)min64(NR, nc - jr);
                    for (int64_t ir = 0; ir < mc; ir += MR)
                        j->u->run(kc, ap + ir * kc, b,
                                  j->C + (ic + ir) * j->ldc + jc + jr, j->ldc,
                                  beta, (int)min64(MR, mc - ir), n);
                }
                if (last && j->ep) {
                    zsk_epilogue at;
                    float *c = j->C + ic * j->ldc + jc;
                    j->epi(c, j->ldc, mc, nc, c, j->ldc, 0.0f,
                           zsk_epilogue_at(j->ep, ic, jc, &at));
                }
            }
        }
    }
}

/* Bounds of part t of n items in blocks of q, split into parts parts. */
static void split(int64_t n, int64_t q, int parts, int t, int64_t *b,
                  int64_t *e)
{
    int64_t nb = (n + q - 1) / q;
    *b = min64(n, nb * t / parts * q);
    *e = min64(n, nb * (t + 1) / parts * q);
}

static void sgemm_tiles(void *p, int64_t t0, int64_t t1)
{
    const sgemm_job *j = p;
    for (int64_t t = t0; t < t1; t++) {
        int64_t m0, m1, n0, n1;
        split(j->M, j->u->mr, j->tm, (int)(t / j->tn), &m0, &m1);
        split(j->N, j->u->nr, j->tn, (int)(t % j->tn), &n0, &n1);
        if (m0 >= m1 || n0 >= n1)
            continue;
        int64_t kc = kc_for(j->K);
        size_t na = (size_t)(min64(MC, ceil_to(m1 - m0, j->u->mr)) * kc);
        size_t nb = (size_t)(min64(NC, ceil_to(n1 - n0, j->u->nr)) * kc);
        float *ap = zs_alloc(na * sizeof(float));
        float *bp = zs_alloc(nb * sizeof(float));
        zsk_epilogue at;
        if (ap && bp)
            sgemm_block(j, m0, m1, n0, n1, ap, bp);
        else /* out of memory: the unpacked code needs no buffers */
            zsk_sgemm_ref(j->ta, j->tb, m1 - m0, n1 - n0, j->K, j->alpha,
                          j->A + (j->ta ? m0 : m0 * j->lda), j->lda,
                          j->B + (j->tb ? n0 * j->ldb : n0), j->ldb, j->beta,
                          j->C + m0 * j->ldc + n0, j->ldc,
                          zsk_epilogue_at(j->ep, m0, n0, &at));
        zs_free(ap);
        zs_free(bp);
    }
}

/* Chooses the tm x tn grid for T threads: least padded work per thread
 * plus the elements it packs (A once per NC columns, B once). */
static void choose_grid(sgemm_job *j, int T)
{
    double best = -1;
    for (int tm = 1; tm <= T; tm++) {
        if (T % tm)
            continue;
        int tn = T / tm;
        double mt = (double)ceil_to((j->M + tm - 1) / tm, j->u->mr);
        double nt = (double)ceil_to((j->N + tn - 1) / tn, j->u->nr);
        double cost = mt * nt * (double)j->K +
                      (mt * (double)((int64_t)nt + NC - 1) / NC + nt) *
                          (double)j->K * 4.0;
        if (best < 0 || cost < best) {
            best = cost;
            j->tm = tm;
            j->tn = tn;
        }
    }
}

static void sgemm_packed(const zsk_sgemm_ukr *u, bool ta, bool tb, int64_t M,
                         int64_t N, int64_t K, float alpha, const float *A,
                         int64_t lda, const float *B, int64_t ldb, float beta,
                         float *C, int64_t ldc, const zsk_epilogue *ep)
{
    sgemm_job j = {ta, tb, M, N, K, lda, ldb, ldc, alpha, beta, A, B, C, u,
                   ep, current_epi(), 1, 1};
    int T = zs_thread_index() == 0 ? zs_num_threads() : 1;
    if ((double)M * (double)N * (double)K < PAR_MIN_MACS)
        T = 1;
    choose_grid(&j, T);
    if (T == 1)
        sgemm_tiles(&j, 0, 1);
    else
        zs_parallel_for(T, 1, sgemm_tiles, &j);
}

/* ---- matrix-vector ------------------------------------------------------ */

/* y[j * incy] = sum_k x[k] P(k, j) + beta * y[j * incy], j < N, where
 * P(k, j) = P[k * ld + j] (kn) or P[j * ld + k]; x is contiguous and
 * already scaled by alpha. y is row 0 of C (M = 1) or, when col, column 0
 * (N = 1); the epilogue ep (if any) addresses C accordingly. */
typedef struct gemv_job {
    bool kn, col;
    int64_t K, ld, incy;
    const float *x, *P;
    float beta;
    float *y;
    const zsk_epilogue *ep;
    zsk_sgemm_epi_fn epi;
} gemv_job;

#define GEMV_JB 1024

/* Writes the n finished sums v to y[j0 ...], through the epilogue. */
static void gemv_flush(const gemv_job *g, int64_t j0, int64_t n,
                       const float *v)
{
    if (g->ep) {
        zsk_epilogue at;
        const zsk_epilogue *ep =
            zsk_epilogue_at(g->ep, g->col ? j0 : 0, g->col ? 0 : j0, &at);
        if (g->col)
            g->epi(v, 1, n, 1, g->y + j0 * g->incy, g->incy, g->beta, ep);
        else
            g->epi(v, n, 1, n, g->y + j0, 1, g->beta, ep);
        return;
    }
    for (int64_t j = 0; j < n; j++) {
        float *y = g->y + (j0 + j) * g->incy;
        *y = g->beta != 0.0f ? v[j] + g->beta * *y : v[j];
    }
}

ZSK_CLONES static void gemv_kn(void *p, int64_t j0, int64_t j1)
{
    const gemv_job *g = p;
    float acc[GEMV_JB];
    for (int64_t jb = j0; jb < j1; jb += GEMV_JB) {
        int64_t n = min64(GEMV_JB, j1 - jb), k = 0;
        for (int64_t j = 0; j < n; j++)
            acc[j] = 0.0f;
        for (; k + 4 <= g->K; k += 4) {
            const float *r0 = g->P + k * g->ld + jb, *r1 = r0 + g->ld;
            const float *r2 = r1 + g->ld, *r3 = r2 + g->ld;
            float x0 = g->x[k], x1 = g->x[k + 1], x2 = g->x[k + 2],
                  x3 = g->x[k + 3];
            for (int64_t j = 0; j < n; j++)
                acc[j] += x0 * r0[j] + x1 * r1[j] + x2 * r2[j] + x3 * r3[j];
        }
        for (; k < g->K; k++) {
            const float *r0 = g->P + k * g->ld + jb;
            for (int64_t j = 0; j < n; j++)
                acc[j] += g->x[k] * r0[j];
        }
        gemv_flush(g, jb, n, acc);
    }
}

/* 16 independent lanes per row: vectorises without reassociation flags. */
ZSK_CLONES static void gemv_nk(void *p, int64_t j0, int64_t j1)
{
    const gemv_job *g = p;
    int64_t K16 = g->K / 16 * 16;
    for (int64_t j = j0; j < j1; j += 4) {
        int rows = (int)min64(4, j1 - j);
        float s[4][16] = {{0}};
        for (int r = 0; r < rows; r++) {
            const float *row = g->P + (j + r) * g->ld;
            for (int64_t k = 0; k < K16; k += 16)
                for (int l = 0; l < 16; l++)
                    s[r][l] += g->x[k + l] * row[k + l];
            for (int64_t k = K16; k < g->K; k++)
                s[r][k - K16] += g->x[k] * row[k];
        }
        float t[4];
        for (int r = 0; r < rows; r++) {
            t[r] = 0.0f;
            for (int l = 0; l < 16; l++)
                t[r] += s[r][l];
        }
        gemv_flush(g, j, rows, t);
    }
}

/* y = alpha * x P + beta * y with x strided by incx, then the epilogue
 * (col: y is a column of C). False when out of memory (nothing written). */
static bool sgemv(bool kn, bool col, int64_t N, int64_t K, float alpha,
                  const float *x, int64_t incx, const float *P, int64_t ld,
                  float beta, float *y, int64_t incy, const zsk_epilogue *ep)
{
    float *xs = zs_alloc((size_t)K * sizeof(float));
    if (!xs)
        return false;
    for (int64_t k = 0; k < K; k++)
        xs[k] = alpha * x[k * incx];
    gemv_job g = {kn, col, K, ld, incy, xs, P, beta, y, ep, current_epi()};
    int64_t grain = 65536 / (K + 1) + 16;
    if (zs_thread_index() != 0 || (double)N * (double)K < PAR_MIN_MACS)
        grain = N;
    zs_parallel_for(N, grain, kn ? gemv_kn : gemv_nk, &g);
    zs_free(xs);
    return true;
}

/* ---- entry points ------------------------------------------------------- */

static void scale_c(int64_t M, int64_t N, float beta, float *C, int64_t ldc)
{
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++)
            C[i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[i * ldc + j];
}

void zsk_sgemm_ex(bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                  float alpha, const float *A, int64_t lda, const float *B,
                  int64_t ldb, float beta, float *C, int64_t ldc,
                  const zsk_epilogue *ep)
{
    if (M <= 0 || N <= 0)
        return;
    if (K <= 0 || alpha == 0.0f) {
        scale_c(M, N, beta, C, ldc);
        if (ep)
            current_epi()(C, ldc, M, N, C, ldc, 0.0f, ep);
        return;
    }
    const zsk_sgemm_ukr *u = current_ukr();
    if (u && M == 1 &&
        sgemv(!tb, false, N, K, alpha, A, ta ? lda : 1, B, ldb, beta, C, 1, ep))
        return;
    if (u && N == 1 &&
        sgemv(ta, true, M, K, alpha, B, tb ? 1 : ldb, A, lda, beta, C, ldc, ep))
        return;
    if (u)
        sgemm_packed(u, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc,
                     ep);
    else
        zsk_sgemm_ref(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc,
                      ep);
}

void zsk_sgemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
               const float *A, int64_t lda, const float *B, int64_t ldb,
               float beta, float *C, int64_t ldc)
{
    zsk_sgemm_ex(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, NULL);
}

void zsk_dgemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K,
               double alpha, const double *A, int64_t lda, const double *B,
               int64_t ldb, double beta, double *C, int64_t ldc)
{
    zsk_dgemm_ref(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}
