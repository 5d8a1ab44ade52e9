/*
 * gemm.c - the one GEMM driver of every input type (f32, bf16, f16; f32
 * accumulation and output): BLIS-style packing and cache blocking around a
 * small SIMD micro-kernel, threading, edge tiles, beta, the skinny
 * shortcuts (f32 GEMV for M = 1 or N = 1, 16-bit kernels that read B in
 * place for M <= 4), the fused epilogue, and run-time selection of the
 * descriptor (gemm.h: zsk_gemm_desc) per (type, ISA). Descriptors live
 * with their kernels: gemm_f32_avx512.c, gemm_f32_avx2.c,
 * gemm_bf16_avx512.c, gemm_lowp_avx2.c, and the portable gemm_ref.c.
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
 * Packed panels hold 4-byte units (a float, or a bf16 pair for vdpbf16ps:
 * kstep 2); K blocks are balanced and a multiple of kstep. Blocking (KC,
 * MC, NC) is per descriptor; for the f32 one on Zen 5 (48 KiB L1D, 1 MiB
 * L2 per core, 32 MiB L3) with the 14x32 AVX-512 kernel: KC up to 1024,
 * split evenly over K (one block for K = 768 or 1024), MC = 42,
 * NC = 2048. A block (168 KiB) and the B micro-panel (128 KiB) both sit
 * in L2, which feeds the kernel's ~13 B per
 * cycle easily; the B block (8 MiB per thread) sits in L3. The deep KC
 * matters most: each micro-kernel call pays a fixed cost (zeroing 28
 * accumulators, reading and writing the C tile, draining the FMA chains),
 * and on one thread (267 GFLOP/s peak) 2048^3 ran at 215 GFLOP/s with the
 * textbook KC = 256 / MC = 168 (B micro-panel in L1), 238 with KC = 768,
 * 245 with KC = 1024; 1024x3072x768 at 219 vs 253. MC and NC moved results
 * by less than the noise (+-2%).
 *
 * (The 16-bit descriptors' blocking is measured in gemm_bf16_avx512.c.)
 *
 * Threads: C is cut into a tm x tn grid of blocks (tm * tn = threads,
 * blocks aligned to MR / NR), the grid chosen to minimise each thread's
 * padded work plus its packing; a thread packs the A and B parts its block
 * needs, so threads share nothing. Skinny shapes therefore split N (small
 * M, huge N) or M (small N). Each thread's block is then cut into
 * TILES_PER_THREAD row tiles of whole MC blocks, and the tn column bands'
 * row tiles are claimed from one atomic counter per band: thread w takes
 * tiles of band w mod tn first, then what is left of the others. On a
 * shared machine a thread that is preempted, or woken late, leaves its
 * unclaimed tiles to the one that runs instead of making it idle (with one
 * block per thread, the caller waited for the whole block of a worker that
 * had not started). The price is packing: a thread keeps its band's
 * packed B (every jc and pc block, at most KEEP_B_MAX bytes; above that,
 * one tile per thread as before) across its row tiles, so B is packed once
 * per band and thread, as with one block each, and A once per row as
 * before; what remains is the shorter tiles. Measured on GPT small's 15
 * training products (bench/gemm_sched: CPU time of the GEMM's threads,
 * 2 threads, Zen 4, load average 6-7 on 2 cores): bf16 work 213.5 ms
 * with 1 tile per thread, 213.3 with 2, 212.3 with 4 (no cost seen); f32
 * 433.9, 438.2, 438.6 (+1%). Without keeping B (each tile packing its
 * own) the work was +6% (bf16) and +10% (f32) at 4 tiles. Under that
 * load bench/gemm_lowp --gpt (2 runs each, alternating) gave a bf16
 * %peak geomean of 109.2 and 108.1 with 4 tiles against 79.6 and 86.3
 * with 1. ZS_GEMM_TILES (or zsk_gemm_tiles_per_thread) sets the count; 1
 * is the old static split. Results do not depend on the tiling: each
 * element is computed by one thread over the same K blocks in the same
 * order (tests/kernels/test_gemm_sched.c). For f32,
 * M = 1 or N = 1 is a matrix-vector product, memory-bound: no packing,
 * split over the output; the 16-bit descriptors instead have skinny
 * kernels for M <= ZSK_GEMM_SMALL_M (op(A) copied densely, op(B) read in
 * place, threads split N in runs of SMALL_COLS columns). Should a packing
 * buffer allocation fail, a direct triple loop computes the same block.
 *
 * Epilogues (zsk_sgemm_ex: bias, GeLU, residual) run on C once its sum
 * over K is complete, while it is still in cache: per MC x NC block after
 * the last K block (the descriptor's epi: AVX-512 vector code, or scalar
 * on the other paths), per finished block of y in the GEMV paths; C thus
 * reaches memory once. Measured on 1024x3072x768, 1 thread,
 * cost over the bare GEMM: applying it inside the micro-kernel per 14 x 32
 * tile cost 4% for a bias and 20% for a residual (14 rows 12 KiB apart
 * per tile, 128 bytes each, defeat the hardware prefetchers; software
 * prefetch recovered only 3 points); per 42 x 256 block 1% and 11%; per
 * 42 x 2048 block 1-2% and 8-9%, the residual rows then streaming in 8 KiB
 * runs. GeLU adds about 3.5% (its vector math).
 * An epilogue that writes bf16 (ep->out16, a bf16 linear layer) needs no
 * f32 C: run_block16 keeps each MC x NC block's sums in a per-thread
 * buffer across the K blocks (loops jc, ic, pc) and rounds the finished
 * block into out16, with the same micro-kernel calls per element as
 * run_block, hence the same bits.
 */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/gemm_lowp.h"
#include "kernels/cpu/kernels.h"

/* Below this many multiply-adds a GEMM runs on one thread. */
#define PAR_MIN_MACS (48 * 48 * 48)
/* Row tiles per thread when several threads run (gemm.h:
 * zsk_gemm_tiles_per_thread; measured above). */
#define TILES_PER_THREAD 4

int zsk_gemm_tiles_per_thread;
bool zsk_gemm_count_cpu;
atomic_int_fast64_t zsk_gemm_cpu_ns;

static double thread_cpu_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

bool zsk_lowp_force_fallback;
bool zsk_lowp_force_bf16_as_f32;

/* ---- descriptor selection ----------------------------------------------- */

/* Every descriptor, best first within a type. */
static const zsk_gemm_desc *const DESCS[] = {
    &zsk_gemm_f32_avx512,      &zsk_gemm_f32_avx2,    &zsk_gemm_f32_ref,
    &zsk_gemm_bf16_avx512bf16, &zsk_gemm_bf16_avx512, &zsk_gemm_bf16_avx2,
    &zsk_gemm_bf16_ref,        &zsk_gemm_f16_avx512,  &zsk_gemm_f16_avx2,
    &zsk_gemm_f16_ref,
};
#define NDESCS (int)(sizeof DESCS / sizeof *DESCS)

static zsk_gemm_isa forced = ZSK_GEMM_AUTO;

static bool usable(const zsk_gemm_desc *d)
{
    return !d->usable || d->usable();
}

int zsk_gemm_descs(const zsk_gemm_desc **out, int cap)
{
    int n = 0;
    for (int i = 0; i < NDESCS; i++)
        if (usable(DESCS[i])) {
            if (n < cap)
                out[n] = DESCS[i];
            n++;
        }
    return n;
}

/* f32 follows zsk_gemm_set_isa; bf16/f16 follow the zsk_lowp_* hooks. */
static bool allowed(const zsk_gemm_desc *d)
{
    if (d->type == ZSK_GEMM_F32)
        return forced == ZSK_GEMM_AUTO || d->isa == forced;
    if (zsk_lowp_force_fallback && d->isa != ZSK_GEMM_REF)
        return false;
    return !(zsk_lowp_force_bf16_as_f32 && d->kstep == 2);
}

const zsk_gemm_desc *zsk_gemm_desc_for(zsk_gemm_type t)
{
    for (int i = 0; i < NDESCS; i++)
        if (DESCS[i]->type == t && allowed(DESCS[i]) && usable(DESCS[i]))
            return DESCS[i];
    return NULL; /* not reached: the portable descriptors always qualify */
}

bool zsk_gemm_set_isa(zsk_gemm_isa isa)
{
    for (int i = 0; i < NDESCS; i++)
        if (isa == ZSK_GEMM_AUTO ||
            (DESCS[i]->type == ZSK_GEMM_F32 && DESCS[i]->isa == isa &&
             usable(DESCS[i]))) {
            forced = isa;
            return true;
        }
    return false;
}

const char *zsk_gemm_isa_name(void)
{
    return zsk_gemm_desc_for(ZSK_GEMM_F32)->name;
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
    if (out->bias16)
        out->bias16 += j;
    if (out->pre16)
        out->pre16 += i * out->ldp + j;
    if (out->res16)
        out->res16 += i * out->ldr + j;
    if (out->out16)
        out->out16 += i * out->ldo + j;
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

typedef struct gelu_epi_job {
    zsk_sgemm_epi_fn epi;
    const float *pre;
    float *out;
} gelu_epi_job;

static void gelu_epi_range(void *p, int64_t i0, int64_t i1)
{
    const gelu_epi_job *j = p;
    zsk_epilogue ep = {.gelu = true};
    j->epi(j->pre + i0, i1 - i0, 1, i1 - i0, j->out + i0, i1 - i0, 0.0f, &ep);
}

void zsk_sgemm_gelu_of_pre(const float *pre, float *out, int64_t n)
{
    /* the descriptor zsk_sgemm_ex runs now; each element alone (lanes
     * are independent), so the blocking does not change a bit */
    gelu_epi_job j = {zsk_gemm_desc_for(ZSK_GEMM_F32)->epi, pre, out};
    zs_parallel_for(n, ZSK_GRAIN, gelu_epi_range, &j);
}

/* ---- elements ----------------------------------------------------------- */

static size_t elem_size(zsk_gemm_type t)
{
    return t == ZSK_GEMM_F32 ? sizeof(float) : sizeof(uint16_t);
}

static float elem(zsk_gemm_type t, const void *x, int64_t i)
{
    if (t == ZSK_GEMM_F32)
        return ((const float *)x)[i];
    uint16_t h = ((const uint16_t *)x)[i];
    return t == ZSK_GEMM_BF16 ? zs_bf16_to_f32(h) : zs_f16_to_f32(h);
}

static zsk_gemm_src src_at(zsk_gemm_src s, size_t es, int64_t r, int64_t k)
{
    const char *x = (const char *)s.x + (r * s.rs + k * s.ks) * (int64_t)es;
    return (zsk_gemm_src){x, s.rs, s.ks};
}

/* ---- packed GEMM -------------------------------------------------------- */

/* Column bands with a claim counter each; with more bands (more threads
 * than this), one counter over all tiles and one tile per thread. */
#define MAX_BANDS 64
/* A thread keeps its band's packed B across row tiles up to this size. */
#define KEEP_B_MAX ((int64_t)8 << 20)

typedef struct job {
    const zsk_gemm_desc *d;
    int64_t M, N, K, ldc;
    float alpha, beta;
    zsk_gemm_src a, b; /* rows of op(A); columns of op(B) */
    float *C;
    const zsk_epilogue *ep; /* NULL: none */
    bool out16;             /* ep->out16: sums in a per-thread block */
    int64_t kcb, nkb;       /* K blocks: depth (a multiple of kstep), count */
    int64_t ncb;            /* columns of a B block: NC; out16: NC / nkb */
    int tm, tn;             /* tm row tiles in each of tn column bands */
    int64_t rq;             /* row tiles: multiples of rq rows */
    bool keep_b;            /* B packed once per band and thread */
    atomic_int_fast64_t next[MAX_BANDS]; /* next row tile of each band */
} job;

/* One thread's buffers, sized for the largest tile and reused for every
 * tile it claims: A block, B (one block; out16: a column block's K
 * blocks; keep_b: the whole band's), out16's block of sums. */
typedef struct bufs {
    float *ap, *bp, *cs;
    int64_t ldcs, bstride; /* cs row stride; units between B blocks */
    int band;              /* keep_b: the band whose B bp holds, or -1 */
} bufs;

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
static int64_t ceil_to(int64_t x, int64_t q) { return (x + q - 1) / q * q; }

/* Depth of the K blocks: at most d->kc, all nearly equal, whole units. */
static int64_t kc_for(const zsk_gemm_desc *d, int64_t K)
{
    int64_t nk = (K + d->kc - 1) / d->kc;
    return ceil_to((K + nk - 1) / nk, d->kstep);
}

/* Where B block (jb, pb) of the band lies in b->bp. */
static float *b_block(const job *j, const bufs *b, int64_t jb, int64_t pb)
{
    int64_t at = (j->keep_b ? jb * j->nkb : 0) + (j->out16 || j->keep_b ? pb : 0);
    return b->bp + at * b->bstride;
}

/* C[m0:m1, n0:n1] (a tile: all of its band's columns); fresh: pack B,
 * else bp already holds the band's B (keep_b). Loops jc, pc, ic: C holds
 * the partial sums between K blocks. */
static void run_block(const job *j, int64_t m0, int64_t m1, int64_t n0,
                      int64_t n1, const bufs *bf, bool fresh)
{
    const zsk_gemm_desc *d = j->d;
    const int MR = d->mr, NR = d->nr;
    const size_t es = elem_size(d->type);
    const float pa = d->alpha_in_pack ? j->alpha : 1.0f;
    const float ka = d->alpha_in_pack ? 1.0f : j->alpha;
    for (int64_t jc = n0, jb = 0; jc < n1; jc += j->ncb, jb++) {
        int64_t nc = min64(j->ncb, n1 - jc);
        for (int64_t pc = 0, pb = 0; pc < j->K; pc += j->kcb, pb++) {
            int64_t kc = min64(j->kcb, j->K - pc);
            int64_t ku = (kc + d->kstep - 1) / d->kstep;
            float beta = pc == 0 ? j->beta : 1.0f, *bp = b_block(j, bf, jb, pb);
            bool last = pc + kc >= j->K;
            if (fresh)
                d->pack_b(src_at(j->b, es, jc, pc), nc, kc, NR, 1.0f, bp);
            for (int64_t ic = m0; ic < m1; ic += d->mc) {
                int64_t mc = min64(d->mc, m1 - ic);
                d->pack_a(src_at(j->a, es, ic, pc), mc, kc, MR, pa, bf->ap);
                for (int64_t jr = 0; jr < nc; jr += NR) {
                    const float *b = bp + jr * ku;
                    int n = (int)min64(NR, nc - jr);
                    for (int64_t ir = 0; ir < mc; ir += MR)
                        d->ukr(ku, bf->ap + ir * ku, b,
                               j->C + (ic + ir) * j->ldc + jc + jr, j->ldc,
                               (int)min64(MR, mc - ir), n, ka, beta);
                }
                if (last && j->ep) {
                    zsk_epilogue at;
                    float *c = j->C + ic * j->ldc + jc;
                    d->epi(c, j->ldc, mc, nc, c, j->ldc, 0.0f,
                           zsk_epilogue_at(j->ep, ic, jc, &at));
                }
            }
        }
    }
}

/* The epilogue's bf16 output without an M x N f32 buffer (ep->out16):
 * loops jc, ic, pc, so each MC x NCB block of sums completes in cs (f32,
 * row stride ldcs) over all K blocks before the epilogue rounds it into
 * out16. The B of every K block of the column block is packed first
 * (b_block); NCB (job.ncb) is NC divided by the number of K blocks, so
 * those blocks take no more room than run_block's one. Each element of C
 * gets the micro-kernel calls of run_block in the same K order: the sums,
 * hence the output, are bit for bit those of run_block followed by the
 * epilogue. beta != 0 reads C (when given) into cs first. */
static void run_block16(const job *j, int64_t m0, int64_t m1, int64_t n0,
                        int64_t n1, const bufs *bf, bool fresh)
{
    const zsk_gemm_desc *d = j->d;
    const int MR = d->mr, NR = d->nr;
    const size_t es = elem_size(d->type);
    const float pa = d->alpha_in_pack ? j->alpha : 1.0f;
    const float ka = d->alpha_in_pack ? 1.0f : j->alpha;
    const bool beta = j->beta != 0.0f && j->C;
    float *cs = bf->cs;
    int64_t ldcs = bf->ldcs;
    for (int64_t jc = n0, jb = 0; jc < n1; jc += j->ncb, jb++) {
        int64_t nc = min64(j->ncb, n1 - jc);
        for (int64_t pc = 0, pb = 0; fresh && pc < j->K; pc += j->kcb, pb++)
            d->pack_b(src_at(j->b, es, jc, pc), nc, min64(j->kcb, j->K - pc),
                      NR, 1.0f, b_block(j, bf, jb, pb));
        for (int64_t ic = m0; ic < m1; ic += d->mc) {
            int64_t mc = min64(d->mc, m1 - ic);
            for (int64_t i = 0; beta && i < mc; i++)
                memcpy(cs + i * ldcs, j->C + (ic + i) * j->ldc + jc,
                       (size_t)nc * sizeof(float));
            for (int64_t pc = 0, pb = 0; pc < j->K; pc += j->kcb, pb++) {
                int64_t kc = min64(j->kcb, j->K - pc);
                int64_t ku = (kc + d->kstep - 1) / d->kstep;
                const float *bp = b_block(j, bf, jb, pb);
                d->pack_a(src_at(j->a, es, ic, pc), mc, kc, MR, pa, bf->ap);
                for (int64_t jr = 0; jr < nc; jr += NR) {
                    int n = (int)min64(NR, nc - jr);
                    for (int64_t ir = 0; ir < mc; ir += MR)
                        d->ukr(ku, bf->ap + ir * ku, bp + jr * ku,
                               cs + ir * ldcs + jr, ldcs,
                               (int)min64(MR, mc - ir), n, ka,
                               pc == 0 && beta ? j->beta : pc == 0 ? 0.0f : 1.0f);
                }
            }
            zsk_epilogue at;
            d->epi(cs, ldcs, mc, nc, cs, ldcs, 0.0f,
                   zsk_epilogue_at(j->ep, ic, jc, &at));
        }
    }
}

/* out16 without packing: the f32 values v (j->alpha times the sums, plus
 * beta C) of row i, columns [n0, n0 + n), n <= DIRECT_COLS, through the
 * epilogue from a stack buffer. */
#define DIRECT_COLS 64

static void epi_row16(const job *j, int64_t i, int64_t n0, int64_t n,
                      float *v)
{
    zsk_epilogue at;
    j->d->epi(v, n, 1, n, v, n, 0.0f, zsk_epilogue_at(j->ep, i, n0, &at));
}

/* Unpacked triple loop over C[m0:m1, n0:n1], the path of last resort when
 * packing buffers cannot be allocated. */
static void run_direct(const job *j, int64_t m0, int64_t m1, int64_t n0,
                       int64_t n1)
{
    zsk_gemm_type t = j->d->type;
    if (j->out16) { /* no C: rows of DIRECT_COLS on the stack */
        float v[DIRECT_COLS];
        for (int64_t i = m0; i < m1; i++)
            for (int64_t c0 = n0; c0 < n1; c0 += DIRECT_COLS) {
                int64_t nb = min64(DIRECT_COLS, n1 - c0);
                for (int64_t n = 0; n < nb; n++) {
                    float acc = 0.0f;
                    for (int64_t k = 0; k < j->K; k++)
                        acc += elem(t, j->a.x, i * j->a.rs + k * j->a.ks) *
                               elem(t, j->b.x, (c0 + n) * j->b.rs + k * j->b.ks);
                    const float *p = j->C ? j->C + i * j->ldc + c0 + n : NULL;
                    float bc = j->beta != 0.0f && p ? j->beta * *p : 0.0f;
                    v[n] = j->K > 0 ? j->alpha * acc + bc : bc; /* K = 0: scale_c */
                }
                epi_row16(j, i, c0, nb, v);
            }
        return;
    }
    for (int64_t i = m0; i < m1; i++)
        for (int64_t n = n0; n < n1; n++) {
            float acc = 0.0f;
            for (int64_t k = 0; k < j->K; k++)
                acc += elem(t, j->a.x, i * j->a.rs + k * j->a.ks) *
                       elem(t, j->b.x, n * j->b.rs + k * j->b.ks);
            float *p = j->C + i * j->ldc + n;
            *p = j->alpha * acc + (j->beta != 0.0f ? j->beta * *p : 0.0f);
        }
    if (j->ep) {
        zsk_epilogue at;
        float *c = j->C + m0 * j->ldc + n0;
        j->d->epi(c, j->ldc, m1 - m0, n1 - n0, c, j->ldc, 0.0f,
                  zsk_epilogue_at(j->ep, m0, n0, &at));
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

/* Largest part of n items in blocks of q split into parts parts. */
static int64_t part_max(int64_t n, int64_t q, int parts)
{
    return min64(n, ((n + q - 1) / q + parts - 1) / parts * q);
}

/* Units of B of one band (all its blocks) with blocks of stride bstride. */
static int64_t band_units(const job *j, int64_t nt, int64_t *bstride)
{
    const zsk_gemm_desc *d = j->d;
    int64_t kum = (j->kcb + d->kstep - 1) / d->kstep;
    *bstride = kum * ceil_to(min64(j->ncb, nt), d->nr);
    return (nt + j->ncb - 1) / j->ncb * j->nkb * *bstride;
}

/* False (nothing held) when out of memory. */
static bool bufs_init(bufs *b, const job *j)
{
    const zsk_gemm_desc *d = j->d;
    int64_t mt = part_max(j->M, j->rq, j->tm), nt = part_max(j->N, d->nr, j->tn);
    int64_t kum = (j->kcb + d->kstep - 1) / d->kstep;
    int64_t nb = band_units(j, nt, &b->bstride);
    if (!j->keep_b)
        nb = (j->out16 ? j->nkb : 1) * b->bstride;
    b->band = -1;
    b->cs = NULL;
    b->ldcs = ceil_to(min64(j->ncb, nt), d->nr) + 16;
    if (j->out16)
        b->cs = zs_alloc((size_t)(min64(d->mc, mt) * b->ldcs) * sizeof(float));
    b->ap = zs_alloc((size_t)(ceil_to(min64(d->mc, mt), d->mr) * kum) *
                     sizeof(float));
    b->bp = zs_alloc((size_t)nb * sizeof(float));
    if (b->ap && b->bp && (b->cs || !j->out16))
        return true;
    zs_free(b->ap);
    zs_free(b->bp);
    zs_free(b->cs);
    return false;
}

/* Row tile r of band c; b NULL: the unpacked fallback. */
static void run_tile(const job *j, int c, int64_t r, bufs *b)
{
    int64_t m0, m1, n0, n1;
    split(j->M, j->rq, j->tm, (int)r, &m0, &m1);
    split(j->N, j->d->nr, j->tn, c, &n0, &n1);
    if (m0 >= m1 || n0 >= n1)
        return;
    if (!b) { /* out of memory: the unpacked loop needs no buffers */
        run_direct(j, m0, m1, n0, n1);
        return;
    }
    bool fresh = !j->keep_b || b->band != c;
    if (j->out16)
        run_block16(j, m0, m1, n0, n1, b, fresh);
    else
        run_block(j, m0, m1, n0, n1, b, fresh);
    b->band = c;
}

/* Thread w of the pool (w0 = w; w1 = w + 1): claims the row tiles of band
 * w mod tn, then those left in the other bands, so a thread that was
 * preempted leaves its unclaimed tiles to the others. */
static void run_worker(void *p, int64_t w0, int64_t w1)
{
    job *j = p;
    (void)w1;
    double t0 = zsk_gemm_count_cpu ? thread_cpu_seconds() : 0;
    bufs b;
    bool ok = bufs_init(&b, j);
    for (int64_t r; j->tn > MAX_BANDS; ) { /* one counter over all tiles */
        r = atomic_fetch_add_explicit(&j->next[0], 1, memory_order_relaxed);
        if (r >= (int64_t)j->tm * j->tn)
            break;
        run_tile(j, (int)(r % j->tn), r / j->tn, ok ? &b : NULL);
    }
    for (int i = 0; j->tn <= MAX_BANDS && i < j->tn; i++) {
        int c = (int)((w0 + i) % j->tn);
        for (;;) {
            int64_t r = atomic_fetch_add_explicit(&j->next[c], 1,
                                                  memory_order_relaxed);
            if (r >= j->tm)
                break;
            run_tile(j, c, r, ok ? &b : NULL);
        }
    }
    if (ok) {
        zs_free(b.ap);
        zs_free(b.bp);
        zs_free(b.cs);
    }
    if (zsk_gemm_count_cpu)
        atomic_fetch_add(&zsk_gemm_cpu_ns,
                         (int64_t)((thread_cpu_seconds() - t0) * 1e9));
}

/* gemm.h */
void zsk_gemm_choose_grid(const zsk_gemm_desc *d, int64_t M, int64_t N,
                          int64_t K, int T, int *tm_out, int *tn_out)
{
    double best = -1;
    for (int tm = 1; tm <= T; tm++) {
        if (T % tm)
            continue;
        int tn = T / tm;
        double mt = (double)ceil_to((M + tm - 1) / tm, d->mr);
        double nt = (double)ceil_to((N + tn - 1) / tn, d->nr);
        double cost = mt * nt * (double)K +
                      (mt * (double)((int64_t)nt + d->nc - 1) / d->nc + nt) *
                          (double)K * 4.0;
        if (best < 0 || cost < best) {
            best = cost;
            *tm_out = tm;
            *tn_out = tn;
        }
    }
}

/* ZS_GEMM_TILES (row tiles per thread, 1 to 64), read once; else
 * TILES_PER_THREAD. */
static int env_tiles(void)
{
    static atomic_int cached;
    int v = atomic_load_explicit(&cached, memory_order_relaxed);
    if (v == 0) {
        const char *e = getenv("ZS_GEMM_TILES");
        v = e ? atoi(e) : 0;
        v = v >= 1 && v <= 64 ? v : TILES_PER_THREAD;
        atomic_store_explicit(&cached, v, memory_order_relaxed);
    }
    return v;
}

static void run_packed(job *j)
{
    const zsk_gemm_desc *d = j->d;
    int T = zs_thread_index() == 0 ? zs_num_threads() : 1;
    if ((double)j->M * (double)j->N * (double)j->K < PAR_MIN_MACS)
        T = 1;
    j->kcb = kc_for(d, j->K);
    j->nkb = (j->K + j->kcb - 1) / j->kcb;
    j->ncb = d->nc;
    if (j->out16) { /* NC shared by the K blocks: as much B as run_block's */
        j->ncb = d->nc / j->nkb / d->nr * d->nr;
        j->ncb = j->ncb < d->nr ? d->nr : j->ncb;
    }
    int tm;
    zsk_gemm_choose_grid(d, j->M, j->N, j->K, T, &tm, &j->tn);
    int S = zsk_gemm_tiles_per_thread > 0 ? zsk_gemm_tiles_per_thread
          : T > 1 ? env_tiles() : 1;
    j->tm = tm;
    j->rq = d->mr;
    j->keep_b = false;
    int64_t bs, nt = part_max(j->N, d->nr, j->tn);
    if (S > 1 && j->tn <= MAX_BANDS &&
        band_units(j, nt, &bs) * (int64_t)sizeof(float) <= KEEP_B_MAX) {
        j->tm = tm * S; /* row tiles of whole MC blocks */
        j->rq = d->mc;
        j->keep_b = true;
    }
    for (int c = 0; c < MAX_BANDS; c++)
        atomic_init(&j->next[c], 0);
    if (T == 1)
        run_worker(j, 0, 1);
    else
        zs_parallel_for(T, 1, run_worker, j);
}

/* ---- skinny M (16-bit descriptors): op(B) read in place ----------------- */

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
    j->d->small((int)j->M, b * SMALL_COLS, min64(e * SMALL_COLS, j->N), j->K,
                j->alpha, sj->a, sj->lda, j->b, j->beta, j->C, j->ldc);
}

/* op(A) copied to a dense buffer of units (bf16 pairs, K padded to even,
 * or f32). Returns false (nothing done) when it cannot be allocated. */
static bool run_small(const job *j)
{
    bool pairs = j->d->kstep == 2;
    int64_t lda = pairs ? j->K + (j->K & 1) : j->K;
    void *a = zs_alloc((size_t)(j->M * lda) * (pairs ? 2 : 4));
    if (!a)
        return false;
    const uint16_t *x = j->a.x;
    for (int64_t i = 0; i < j->M; i++)
        for (int64_t k = 0; k < lda; k++) {
            int64_t at = i * j->a.rs + k * j->a.ks;
            if (pairs)
                ((uint16_t *)a)[i * lda + k] = k < j->K ? x[at] : 0;
            else
                ((float *)a)[i * lda + k] = elem(j->d->type, x, at);
        }
    small_job sj = {j, a, lda};
    int64_t nblk = (j->N + SMALL_COLS - 1) / SMALL_COLS;
    int64_t grain = 1 + (1 << 18) / (2 * SMALL_COLS * j->M * j->K + 1);
    zs_parallel_for(nblk, grain, small_range, &sj);
    zs_free(a);
    return true;
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

static ZSK_ISA_VOID(gemv_kn, (void *p, int64_t j0, int64_t j1), (p, j0, j1))
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
static ZSK_ISA_VOID(gemv_nk, (void *p, int64_t j0, int64_t j1), (p, j0, j1))
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
static bool sgemv(const zsk_gemm_desc *d, bool kn, bool col, int64_t N,
                  int64_t K, float alpha, const float *x, int64_t incx,
                  const float *P, int64_t ld, float beta, float *y,
                  int64_t incy, const zsk_epilogue *ep)
{
    float *xs = zs_alloc((size_t)K * sizeof(float));
    if (!xs)
        return false;
    for (int64_t k = 0; k < K; k++)
        xs[k] = alpha * x[k * incx];
    gemv_job g = {kn, col, K, ld, incy, xs, P, beta, y, ep, d->epi};
    int64_t grain = 65536 / (K + 1) + 16;
    if (zs_thread_index() != 0 || (double)N * (double)K < PAR_MIN_MACS)
        grain = N;
    zs_parallel_for(N, grain, kn ? gemv_kn : gemv_nk, &g);
    zs_free(xs);
    return true;
}

/* ---- the driver and the entry points ------------------------------------ */

static void scale_c(int64_t M, int64_t N, float beta, float *C, int64_t ldc)
{
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++)
            C[i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[i * ldc + j];
}

void zsk_gemm_run(const zsk_gemm_desc *d, bool ta, bool tb, int64_t M,
                  int64_t N, int64_t K, float alpha, const void *A,
                  int64_t lda, const void *B, int64_t ldb, float beta,
                  float *C, int64_t ldc, const zsk_epilogue *ep)
{
    if (M <= 0 || N <= 0)
        return;
    if ((K <= 0 || alpha == 0.0f) && ep && ep->out16) {
        job j = {.d = d, .K = 0, .ldc = ldc, .beta = beta, .C = C, .ep = ep,
                 .out16 = true};
        run_direct(&j, 0, M, 0, N);
        return;
    }
    if (K <= 0 || alpha == 0.0f) {
        scale_c(M, N, beta, C, ldc);
        if (ep)
            d->epi(C, ldc, M, N, C, ldc, 0.0f, ep);
        return;
    }
    if (d->gemv && M == 1 &&
        sgemv(d, !tb, false, N, K, alpha, A, ta ? lda : 1, B, ldb, beta, C, 1,
              ep))
        return;
    if (d->gemv && N == 1 &&
        sgemv(d, ta, true, M, K, alpha, B, tb ? 1 : ldb, A, lda, beta, C, ldc,
              ep))
        return;
    job j = {.d = d, .M = M, .N = N, .K = K, .ldc = ldc, .alpha = alpha,
             .beta = beta, .a = {A, ta ? 1 : lda, ta ? lda : 1},
             .b = {B, tb ? ldb : 1, tb ? 1 : ldb}, .C = C, .ep = ep,
             .out16 = ep && ep->out16};
    /* the skinny kernels have no epilogue: with one, M <= 4 packs */
    if (d->small && M <= ZSK_GEMM_SMALL_M && !ep && run_small(&j))
        return;
    run_packed(&j);
}

void zsk_sgemm_ex(bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                  float alpha, const float *A, int64_t lda, const float *B,
                  int64_t ldb, float beta, float *C, int64_t ldc,
                  const zsk_epilogue *ep)
{
    zsk_gemm_run(zsk_gemm_desc_for(ZSK_GEMM_F32), ta, tb, M, N, K, alpha, A,
                 lda, B, ldb, beta, C, ldc, ep);
}

void zsk_sgemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
               const float *A, int64_t lda, const float *B, int64_t ldb,
               float beta, float *C, int64_t ldc)
{
    zsk_sgemm_ex(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, NULL);
}

void zsk_gemm_bf16(bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                   float alpha, const uint16_t *A, int64_t lda,
                   const uint16_t *B, int64_t ldb, float beta, float *C,
                   int64_t ldc)
{
    zsk_gemm_run(zsk_gemm_desc_for(ZSK_GEMM_BF16), ta, tb, M, N, K, alpha, A,
                 lda, B, ldb, beta, C, ldc, NULL);
}

typedef void (*gelu_bw_fn)(bool bf16, const void *g, const void *h, void *out,
                           int64_t n);

typedef struct gelu_bw_job {
    bool bf16;
    gelu_bw_fn fn;
    const char *g, *h;
    char *out;
} gelu_bw_job;

static void gelu_bw_range(void *p, int64_t i0, int64_t i1)
{
    const gelu_bw_job *j = p;
    size_t es = j->bf16 ? 2 : 4;
    j->fn(j->bf16, j->g + (size_t)i0 * es, j->h + (size_t)i0 * es,
          j->out + (size_t)i0 * es, i1 - i0);
}

void zsk_gelu_tanh_bw(bool bf16, const void *g, const void *h, void *out,
                      int64_t n)
{
    const zs_cpu_features *f = zs_cpu();
    gelu_bw_fn fn = zsk_gelu_tanh_bw_ref;
    if (zsk_gemm_desc_for(ZSK_GEMM_F32)->isa == ZSK_GEMM_AVX512 && f->avx512bw &&
        f->avx512vl)
        fn = zsk_gelu_tanh_bw_avx512;
    else if (f->avx2 && f->fma && f->f16c)
        fn = zsk_gelu_tanh_bw_avx2;
    gelu_bw_job j = {bf16, fn, g, h, out};
    zs_parallel_for(n, 16384, gelu_bw_range, &j);
}

void zsk_gemm_bf16_ex(bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                      float alpha, const uint16_t *A, int64_t lda,
                      const uint16_t *B, int64_t ldb, float beta, float *C,
                      int64_t ldc, const zsk_epilogue *ep)
{
    zsk_gemm_run(zsk_gemm_desc_for(ZSK_GEMM_BF16), ta, tb, M, N, K, alpha, A,
                 lda, B, ldb, beta, C, ldc, ep);
}

void zsk_gemm_f16(bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                  float alpha, const uint16_t *A, int64_t lda,
                  const uint16_t *B, int64_t ldb, float beta, float *C,
                  int64_t ldc)
{
    zsk_gemm_f16_ex(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, NULL);
}

void zsk_gemm_f16_ex(bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                     float alpha, const uint16_t *A, int64_t lda,
                     const uint16_t *B, int64_t ldb, float beta, float *C,
                     int64_t ldc, const zsk_epilogue *ep)
{
    zsk_gemm_run(zsk_gemm_desc_for(ZSK_GEMM_F16), ta, tb, M, N, K, alpha, A,
                 lda, B, ldb, beta, C, ldc, ep);
}

void zsk_dgemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K,
               double alpha, const double *A, int64_t lda, const double *B,
               int64_t ldb, double beta, double *C, int64_t ldc)
{
    zsk_dgemm_ref(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}
