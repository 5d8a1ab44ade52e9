/*
 * fp8_gemm.c - the FP8 GEMM of fp8.h: C = sum over 128-element K chunks of
 * (sa * sb) * (the chunk's f32 sum of exact products), as DeepSeek-V3
 * computes it on tensor cores with promotion to f32 every 128 of K.
 *
 * On the CPU the products run through the BF16 path of the GEMM framework
 * (gemm.h): both operands are widened once, exactly, to bf16 through a
 * 256-entry table (fp8.c; AVX-512: vpermi2w), and then packed by the
 * packers of a 16-bit descriptor into the panels of a micro-kernel:
 *   - AVX512_BF16: bf16 pairs and the vdpbf16ps 14 x 32 kernel
 *     (gemm_bf16_avx512.c);
 *   - elsewhere: f32 panels (the bf16 -> f32 packers) and the f32 kernel of
 *     the best ISA (AVX-512 14 x 32, AVX2 6 x 16, portable 4 x 16).
 * Products of two fp8 values are exact in f32 (at most 8 significant bits),
 * and vdpbf16ps and FMA both accumulate in f32, so a chunk's sum carries
 * only f32 accumulation error.
 *
 * Loops (per thread, over its block of C, as gemm.c's driver):
 *   jc: NC columns, pc: KC depth (a multiple of 128: B block packed),
 *   ic: MC rows (A block packed), jr / ir: micro tiles, and inside each
 *   tile the K chunks of the block: the micro-kernel writes the chunk's
 *   MR x NR sums into a small buffer (beta 0) and `promote` adds them,
 *   times sa(i) sb(j), to C (the first chunk of K stores bias + that).
 * Scales of the block's rows and columns are gathered per (block, chunk)
 * first, so the tiles read them with no division. The promotion costs one
 * load, FMA and store of the C tile per 128 of K, against the 64 (pairs)
 * or 128 k steps of the kernel.
 * Threads: C is cut into a tm x tn grid as in gemm.c, each thread packing
 * what its block needs. Should its buffers fail to allocate, a thread
 * computes its block with a direct loop (same math).
 */
#include <string.h>

#include "kernels/cpu/fp8.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/kernels.h"

/* Below this many multiply-adds the GEMM runs on one thread. */
#define PAR_MIN_MACS (48 * 48 * 48)
#define CH ZSK_FP8_TILE

typedef struct path {
    const zsk_gemm_desc *uk; /* micro-kernel, register tile and blocking */
    const zsk_gemm_desc *pk; /* packers of bf16 elements into uk's units */
} path;

static bool usable(const zsk_gemm_desc *d) { return !d->usable || d->usable(); }

/* The path of descriptor d (NULL: the best); false when d cannot be one. */
static bool path_for(const zsk_gemm_desc *d, path *p)
{
    if (!d) {
        const zsk_gemm_desc *b = zsk_gemm_desc_for(ZSK_GEMM_BF16);
        d = b->kstep == 2 ? b : zsk_gemm_desc_for(ZSK_GEMM_F32);
    }
    if (d->type == ZSK_GEMM_BF16 && d->kstep == 2) {
        p->uk = p->pk = d;
        return true;
    }
    if (d->type != ZSK_GEMM_F32 || d->kstep != 1)
        return false;
    p->uk = d;
    p->pk = usable(&zsk_gemm_bf16_avx512) ? &zsk_gemm_bf16_avx512
                                          : &zsk_gemm_bf16_ref;
    return true;
}

const char *zsk_gemm_fp8_path(void)
{
    path p = {0};
    return path_for(NULL, &p) ? p.uk->name : "?";
}

/* ---- the job ------------------------------------------------------------- */

typedef struct fjob {
    path p;
    int64_t M, N, K, ldc;
    zsk_gemm_src as, bs;   /* the widened operands (bf16 elements) */
    zsk_fp8_mat am, bm;    /* the fp8 operands, for their scales */
    const float *bias;
    float *C;
    int64_t kcb;           /* K block depth, a multiple of 128 */
    int tm, tn;            /* thread grid */
} fjob;

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
static int64_t ceil_to(int64_t x, int64_t q) { return (x + q - 1) / q * q; }

static zsk_gemm_src src_at(zsk_gemm_src s, int64_t r, int64_t k)
{
    const uint16_t *x = (const uint16_t *)s.x + r * s.rs + k * s.ks;
    return (zsk_gemm_src){x, s.rs, s.ks};
}

static float scale_at(const zsk_fp8_mat *m, int64_t r, int64_t chunk)
{
    return m->s[(r / m->rg) * m->srs + chunk * m->scs];
}

/* out[c * n + i] = scale of row r0 + i in chunk c0 + c, i < n, c < nch. */
static void gather_scales(const zsk_fp8_mat *m, int64_t r0, int64_t n,
                          int64_t c0, int64_t nch, float *out)
{
    for (int64_t c = 0; c < nch; c++)
        for (int64_t i = 0; i < n; i++)
            out[c * n + i] = scale_at(m, r0 + i, c0 + c);
}

/* c[i, j] (+)= (sa[i] sb[j]) t[i, j] for i < m, j < n; first: c = bias[j]
 * (or 0) + that. */
static ZSK_ISA_VOID(promote, (const float *t, int64_t ldt, float *c,
    int64_t ldc, int m, int n, const float *sa, const float *sb,
    const float *bias, bool first),
    (t, ldt, c, ldc, m, n, sa, sb, bias, first))
{
    for (int i = 0; i < m; i++) {
        const float *ti = t + i * ldt;
        float *ci = c + i * ldc, s = sa[i];
        if (first && bias)
            for (int j = 0; j < n; j++)
                ci[j] = bias[j] + (s * sb[j]) * ti[j];
        else if (first)
            for (int j = 0; j < n; j++)
                ci[j] = (s * sb[j]) * ti[j];
        else
            for (int j = 0; j < n; j++)
                ci[j] += (s * sb[j]) * ti[j];
    }
}

/* Per-thread buffers: packed A and B blocks (4-byte units), row scales of
 * the A block and column scales of the B block per chunk. */
typedef struct bufs {
    float *ap, *bp, *sa, *sb;
} bufs;

/* C[m0:m1, n0:n1]. */
static void run_block(const fjob *j, int64_t m0, int64_t m1, int64_t n0,
                      int64_t n1, const bufs *w)
{
    const zsk_gemm_desc *uk = j->p.uk, *pk = j->p.pk;
    const int MR = uk->mr, NR = uk->nr, ks = uk->kstep;
    _Alignas(64) float t[32 * 32];
    for (int64_t jc = n0; jc < n1; jc += uk->nc) {
        int64_t nc = min64(uk->nc, n1 - jc);
        for (int64_t pc = 0; pc < j->K; pc += j->kcb) {
            int64_t kc = min64(j->kcb, j->K - pc);
            int64_t ku = (kc + ks - 1) / ks, nch = (kc + CH - 1) / CH;
            pk->pack_b(src_at(j->bs, jc, pc), nc, kc, NR, 1.0f, w->bp);
            gather_scales(&j->bm, jc, nc, pc / CH, nch, w->sb);
            for (int64_t ic = m0; ic < m1; ic += uk->mc) {
                int64_t mc = min64(uk->mc, m1 - ic);
                pk->pack_a(src_at(j->as, ic, pc), mc, kc, MR, 1.0f, w->ap);
                gather_scales(&j->am, ic, mc, pc / CH, nch, w->sa);
                for (int64_t jr = 0; jr < nc; jr += NR) {
                    int n = (int)min64(NR, nc - jr);
                    const float *bias = j->bias ? j->bias + jc + jr : NULL;
                    for (int64_t ir = 0; ir < mc; ir += MR) {
                        int m = (int)min64(MR, mc - ir);
                        float *c = j->C + (ic + ir) * j->ldc + jc + jr;
                        for (int64_t ch = 0; ch < nch; ch++) {
                            int64_t k0 = ch * CH, u0 = k0 / ks;
                            int64_t cu = (min64(CH, kc - k0) + ks - 1) / ks;
                            uk->ukr(cu, w->ap + ir * ku + u0 * MR,
                                    w->bp + jr * ku + u0 * NR, t, NR, m, n,
                                    1.0f, 0.0f);
                            promote(t, NR, c, j->ldc, m, n,
                                    w->sa + ch * mc + ir, w->sb + ch * nc + jr,
                                    bias, pc + k0 == 0);
                        }
                    }
                }
            }
        }
    }
}

static float val(const zsk_fp8_mat *m, int64_t r, int64_t k)
{
    return zsk_fp8_to_f32(m->fmt, m->q[r * m->rs + k * m->ks]);
}

/* The same math without buffers, the path of last resort. */
static void run_direct(const fjob *j, int64_t m0, int64_t m1, int64_t n0,
                       int64_t n1)
{
    for (int64_t i = m0; i < m1; i++)
        for (int64_t n = n0; n < n1; n++) {
            float acc = j->bias ? j->bias[n] : 0.0f;
            for (int64_t k0 = 0; k0 < j->K; k0 += CH) {
                float part = 0.0f;
                for (int64_t k = k0; k < min64(j->K, k0 + CH); k++)
                    part += val(&j->am, i, k) * val(&j->bm, n, k);
                acc += scale_at(&j->am, i, k0 / CH) *
                       scale_at(&j->bm, n, k0 / CH) * part;
            }
            j->C[i * j->ldc + n] = acc;
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

static void run_tiles(void *p, int64_t t0, int64_t t1)
{
    const fjob *j = p;
    const zsk_gemm_desc *uk = j->p.uk;
    for (int64_t t = t0; t < t1; t++) {
        int64_t m0, m1, n0, n1;
        split(j->M, uk->mr, j->tm, (int)(t / j->tn), &m0, &m1);
        split(j->N, uk->nr, j->tn, (int)(t % j->tn), &n0, &n1);
        if (m0 >= m1 || n0 >= n1)
            continue;
        int64_t ku = (j->kcb + uk->kstep - 1) / uk->kstep, nch = j->kcb / CH;
        int64_t mc = ceil_to(min64(uk->mc, m1 - m0), uk->mr);
        int64_t nc = ceil_to(min64(uk->nc, n1 - n0), uk->nr);
        bufs w = {zs_alloc((size_t)(mc * ku) * 4), zs_alloc((size_t)(nc * ku) * 4),
                  zs_alloc((size_t)(mc * nch) * 4), zs_alloc((size_t)(nc * nch) * 4)};
        if (w.ap && w.bp && w.sa && w.sb)
            run_block(j, m0, m1, n0, n1, &w);
        else /* out of memory: the direct loop needs no buffers */
            run_direct(j, m0, m1, n0, n1);
        zs_free(w.ap);
        zs_free(w.bp);
        zs_free(w.sa);
        zs_free(w.sb);
    }
}


/* ---- widening ------------------------------------------------------------- */

typedef struct wjob {
    const zsk_fp8_mat *m;
    int64_t len;   /* elements per line */
    bool kline;    /* lines are rows (k contiguous), else k steps */
    uint16_t *out; /* [lines, len] */
} wjob;

static void widen_lines(void *p, int64_t l0, int64_t l1)
{
    const wjob *w = p;
    int64_t step = w->kline ? w->m->rs : w->m->ks;
    for (int64_t l = l0; l < l1; l++)
        zsk_fp8_to_bf16(w->m->fmt, w->m->q + l * step, w->len,
                        w->out + l * w->len);
}

/* m (rows x K) widened to a dense bf16 buffer of the same orientation;
 * *src describes it. NULL (message set) when out of memory. */
static uint16_t *widen(const zsk_fp8_mat *m, int64_t rows, int64_t K,
                       zsk_gemm_src *src)
{
    uint16_t *buf = zs_alloc((size_t)(rows * K) * sizeof *buf);
    if (!buf) {
        zs_set_error_code(ZS_ERR_NOMEM, "fp8 gemm: %lld x %lld bf16 buffer: "
                          "out of memory", (long long)rows, (long long)K);
        return NULL;
    }
    bool kline = m->ks == 1;
    wjob w = {m, kline ? K : rows, kline, buf};
    int64_t lines = kline ? rows : K;
    zs_parallel_for(lines, ZSK_GRAIN / (w.len + 1) + 1, widen_lines, &w);
    *src = kline ? (zsk_gemm_src){buf, K, 1} : (zsk_gemm_src){buf, 1, rows};
    return buf;
}

/* ---- entry points ---------------------------------------------------------- */

zs_status zsk_gemm_fp8_with(const zsk_gemm_desc *d, int64_t M, int64_t N,
                            int64_t K, const zsk_fp8_mat *a,
                            const zsk_fp8_mat *b, const float *bias, float *C,
                            int64_t ldc)
{
    fjob j = {.M = M, .N = N, .K = K, .ldc = ldc, .am = *a, .bm = *b,
              .bias = bias, .C = C, .tm = 1, .tn = 1};
    if (!path_for(d, &j.p))
        return zs_set_error("fp8 gemm: descriptor %s is neither bf16 pairs "
                            "nor f32", d->name);
    if (M <= 0 || N <= 0)
        return ZS_OK;
    if (K <= 0) {
        for (int64_t i = 0; i < M; i++)
            for (int64_t n = 0; n < N; n++)
                C[i * ldc + n] = bias ? bias[n] : 0.0f;
        return ZS_OK;
    }
    uint16_t *wa = widen(a, M, K, &j.as);
    uint16_t *wb = wa ? widen(b, N, K, &j.bs) : NULL;
    if (!wb) {
        zs_free(wa);
        return ZS_ERR_NOMEM;
    }
    int T = zs_thread_index() == 0 ? zs_num_threads() : 1;
    if ((double)M * (double)N * (double)K < PAR_MIN_MACS)
        T = 1;
    j.kcb = j.p.uk->kc / CH * CH;
    if (j.kcb < CH)
        j.kcb = CH;
    zsk_gemm_choose_grid(j.p.uk, j.M, j.N, j.K, T, &j.tm, &j.tn);
    if (T == 1)
        run_tiles(&j, 0, 1);
    else
        zs_parallel_for(T, 1, run_tiles, &j);
    zs_free(wa);
    zs_free(wb);
    return ZS_OK;
}

zs_status zsk_gemm_fp8(int64_t M, int64_t N, int64_t K, const zsk_fp8_mat *a,
                       const zsk_fp8_mat *b, const float *bias, float *C,
                       int64_t ldc)
{
    return zsk_gemm_fp8_with(NULL, M, N, K, a, b, bias, C, ldc);
}
