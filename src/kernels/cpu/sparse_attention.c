/*
 * sparse_attention.c - block-sparse attention kernels (see
 * sparse_attention.h), after Child et al. (Sparse Transformer) and
 * DeepSpeed's Sparse Attention; flash-style (Dao et al.): no T x T matrix.
 *
 * Layout: a byte per (query block, key block) marks local, global and
 * random blocks (nb^2 bytes while building), then compressed rows.
 *
 * Forward: a task is one (b, h, query block) of nq <= bs rows. Its key
 * blocks are visited in chunks of at most CHUNK_KEYS keys: the chunk's
 * key and value rows are packed into contiguous panels Kp, Vp [nk, D],
 * S = scale * Q Kp^T [nq, nk] is one GEMM, the causal diagonal block is
 * masked, then the online softmax (running max m, sum l, unnormalised
 * output acc [nq, D] rescaled by exp(m_old - m_new)) and acc += P Vp, a
 * second GEMM. At the end o = acc / l and lse = m + log l. The GEMMs are
 * zsk_sgemm (AVX-512 / AVX2 micro-kernels by zs_cpu(), serial inside a
 * pool task) and zsk_dgemm; the row loops (exp, max, sums) are compiled
 * per ISA (ZSK_ISA_VOID) with vmath.h's vectorisable exp for f32.
 *
 * Backward: a task is one (b, h), so it owns its dq, dk and dv rows. For
 * each query block and chunk: S again, P = exp(S - lse), dP = dO Vp^T,
 * dV[block] += P^T dO, dS = P (dP - delta) scale with delta_i = dO_i . O_i,
 * dQ += dS Kp, dK[block] += dS^T Q: five GEMMs per chunk, accumulating
 * (beta = 1) straight into dk and dv rows of each key block.
 *
 * Memory per task: the panels and S, dP [bs, CHUNK_KEYS]; nothing grows
 * with T beyond the outputs. Cost: 4 D FLOPs per computed (query, key)
 * pair forward, 10 D backward (zsk_blocks_pairs).
 */
#pragma GCC optimize("fp-contract=fast")

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/sparse_attention.h"
#include "kernels/cpu/vmath.h"

/* Keys per chunk: 512 keys of D = 64 are 128 KiB of f32 panels (K and V),
 * which stay in L2 while a query block runs over them. */
#define CHUNK_KEYS 512

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* ---- layout ------------------------------------------------------------- */

/* Marks R random blocks of row i among the allowed, unmarked ones. */
static void mark_random(uint8_t *row, int64_t i, int64_t nb, bool causal,
                        int64_t R, uint64_t seed, int32_t *cand)
{
    int64_t n = 0, lim = causal ? i + 1 : nb;
    for (int64_t j = 0; j < lim; j++)
        if (!row[j])
            cand[n++] = (int32_t)j;
    for (int64_t r = 0; r < R && n > 0; r++) {
        uint32_t w[4];
        zs_philox(seed, ((uint64_t)i << 24) + (uint64_t)r, w);
        int64_t k = (int64_t)(((uint64_t)w[0] << 32 | w[1]) % (uint64_t)n);
        row[cand[k]] = 1;
        cand[k] = cand[--n];
    }
}

zs_status zsk_blocks_build(int64_t T, int64_t bs, int64_t local, int64_t global,
                           int64_t random, uint64_t seed, bool causal,
                           zsk_blocks *out)
{
    int64_t nb = (T + bs - 1) / bs;
    *out = (zsk_blocks){.T = T, .bs = bs, .nb = nb, .causal = causal};
    uint8_t *mark = calloc((size_t)(nb * nb), 1);
    int32_t *cand = malloc((size_t)nb * sizeof *cand);
    out->row_ptr = malloc((size_t)(nb + 1) * sizeof *out->row_ptr);
    if (!mark || !cand || !out->row_ptr) {
        free(mark);
        free(cand);
        zsk_blocks_free(out);
        return zs_set_error_code(ZS_ERR_NOMEM, "sparse_attention: out of memory "
                                 "for the layout of %lld blocks", (long long)nb);
    }
    for (int64_t i = 0; i < nb; i++) {
        uint8_t *row = mark + i * nb;
        for (int64_t j = 0; j < (causal ? i + 1 : nb); j++) {
            int64_t dist = i > j ? i - j : j - i;
            row[j] = dist <= local || j < global || i < global;
        }
        mark_random(row, i, nb, causal, random, seed, cand);
    }
    out->row_ptr[0] = 0;
    for (int64_t i = 0; i < nb; i++) {
        int64_t c = 0;
        for (int64_t j = 0; j < nb; j++)
            c += mark[i * nb + j];
        out->row_ptr[i + 1] = out->row_ptr[i] + c;
    }
    out->nnz = out->row_ptr[nb];
    out->cols = malloc((size_t)(out->nnz > 0 ? out->nnz : 1) * sizeof *out->cols);
    if (out->cols)
        for (int64_t i = 0, k = 0; i < nb; i++)
            for (int64_t j = 0; j < nb; j++)
                if (mark[i * nb + j])
                    out->cols[k++] = (int32_t)j;
    free(mark);
    free(cand);
    if (!out->cols) {
        zsk_blocks_free(out);
        return zs_set_error_code(ZS_ERR_NOMEM, "sparse_attention: out of memory "
                                 "for the layout");
    }
    return ZS_OK;
}

void zsk_blocks_free(zsk_blocks *b)
{
    free(b->row_ptr);
    free(b->cols);
    b->row_ptr = NULL;
    b->cols = NULL;
}

double zsk_blocks_pairs(const zsk_blocks *b, double *visible)
{
    double all = 0, vis = 0;
    for (int64_t i = 0; i < b->nb; i++) {
        double nq = (double)min64(b->bs, b->T - i * b->bs);
        for (int64_t k = b->row_ptr[i]; k < b->row_ptr[i + 1]; k++) {
            double nk = (double)min64(b->bs, b->T - b->cols[k] * b->bs);
            all += nq * nk;
            /* a causal diagonal block is square: nq (nq + 1) / 2 visible */
            vis += b->causal && b->cols[k] == i ? nq * (nq + 1) / 2 : nq * nk;
        }
    }
    if (visible)
        *visible = vis;
    return all;
}

/* ---- shared pieces -------------------------------------------------------- */

typedef struct fw_ctx {
    const zsk_sattn *a;
    void *o, *lse;
    int failed;
} fw_ctx;

typedef struct bw_ctx {
    const zsk_sattn *a;
    const void *o, *lse, *dout;
    int64_t sd[3];
    void *dq, *dk, *dv;
    int failed;
} bw_ctx;

static void set_failed(int *flag) { __atomic_store_n(flag, 1, __ATOMIC_RELAXED); }

/* The blocks of row i from index k0 that fit a chunk (at least one):
 * their count; kstart[] receives each block's first panel row and *nk the
 * panel's rows. */
static int64_t chunk_of(const zsk_blocks *L, int64_t k0, int64_t k1,
                        int64_t *kstart, int64_t *nk)
{
    int64_t n = 0, rows = 0;
    for (int64_t k = k0; k < k1; k++) {
        int64_t kn = min64(L->bs, L->T - L->cols[k] * L->bs);
        if (n > 0 && rows + kn > CHUNK_KEYS)
            break;
        kstart[n++] = rows;
        rows += kn;
    }
    *nk = rows;
    return n;
}

static void gemm_f32(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                     const float *A, int64_t lda, const float *B, int64_t ldb,
                     float beta, float *C, int64_t ldc)
{
    zsk_sgemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

static void gemm_f64(bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha,
                     const double *A, int64_t lda, const double *B, int64_t ldb,
                     double beta, double *C, int64_t ldc)
{
    zsk_dgemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

static inline __attribute__((always_inline)) float exp_f32(float x)
{
    return zsi_exp_f32_clamped(x);
}

#define DEFINE_SPARSE(TY, SUF, EXP)                                           \
    /* Packs the rows of the chunk's key blocks of x (rows st apart) into     \
     * xp [nk, D]. */                                                         \
    static void pack_##SUF(const zsk_blocks *L, const int32_t *cols,          \
                           int64_t n, const TY *x, int64_t st, int64_t D,     \
                           TY *xp)                                            \
    {                                                                         \
        for (int64_t c = 0; c < n; c++) {                                     \
            int64_t t0 = cols[c] * L->bs, kn = min64(L->bs, L->T - t0);       \
            for (int64_t t = 0; t < kn; t++, xp += D)                         \
                memcpy(xp, x + (t0 + t) * st, (size_t)D * sizeof(TY));        \
        }                                                                     \
    }                                                                         \
    /* -inf on the keys after each query inside the causal diagonal block,    \
     * when it is in the chunk (the last block of a causal row). */           \
    static void mask_##SUF(const zsk_blocks *L, const int32_t *cols,          \
                           int64_t n, const int64_t *kstart, int64_t qb,      \
                           int64_t nq, TY *s, int64_t nk)                     \
    {                                                                         \
        if (!L->causal || cols[n - 1] != qb)                                  \
            return;                                                           \
        for (int64_t i = 0; i < nq; i++)                                      \
            for (int64_t j = i + 1; kstart[n - 1] + j < nk; j++)              \
                s[i * nk + kstart[n - 1] + j] = -INFINITY;                    \
    }                                                                         \
    /* The online softmax of nq rows of nk scores s (overwritten by p):       \
     * updates m, l and rescales acc [nq, D]. */                              \
    static ZSK_ISA_VOID(online_##SUF, (TY *restrict s, int64_t nq,            \
        int64_t nk, TY *m, TY *l, TY *restrict acc, int64_t D),               \
        (s, nq, nk, m, l, acc, D))                                            \
    {                                                                         \
        for (int64_t i = 0; i < nq; i++) {                                    \
            TY *sr = s + i * nk, mx = m[i], sum = 0;                          \
            for (int64_t j = 0; j < nk; j++)                                  \
                mx = sr[j] > mx ? sr[j] : mx;                                 \
            if (mx == -INFINITY) { /* nothing visible yet */                  \
                memset(sr, 0, (size_t)nk * sizeof(TY));                       \
                continue;                                                     \
            }                                                                 \
            TY corr = EXP(m[i] - mx);                                         \
            for (int64_t j = 0; j < nk; j++) {                                \
                sr[j] = EXP(sr[j] - mx);                                      \
                sum += sr[j];                                                 \
            }                                                                 \
            l[i] = l[i] * corr + sum;                                         \
            m[i] = mx;                                                        \
            if (corr != 1)                                                    \
                for (int64_t d = 0; d < D; d++)                               \
                    acc[i * D + d] *= corr;                                   \
        }                                                                     \
    }                                                                         \
    /* p = exp(s - lse_i); ds = p (dp - delta_i) scale (into dp). */          \
    static ZSK_ISA_VOID(grads_##SUF, (TY *restrict s, TY *restrict dp,        \
        int64_t nq, int64_t nk, const TY *lse, const TY *delta, TY scale),    \
        (s, dp, nq, nk, lse, delta, scale))                                   \
    {                                                                         \
        for (int64_t i = 0; i < nq; i++) {                                    \
            TY *sr = s + i * nk, *dr = dp + i * nk, L = lse[i], dl = delta[i]; \
            for (int64_t j = 0; j < nk; j++) {                                \
                TY p = L == -INFINITY ? 0 : EXP(sr[j] - L);                   \
                sr[j] = p;                                                    \
                dr[j] = p * (dr[j] - dl) * scale;                             \
            }                                                                 \
        }                                                                     \
    }                                                                         \
    static void fw_block_##SUF(const fw_ctx *c, int64_t t, TY *w)             \
    {                                                                         \
        const zsk_sattn *a = c->a;                                            \
        const zsk_blocks *L = a->lay;                                         \
        int64_t D = a->D, bh = t / L->nb, qb = t % L->nb;                     \
        int64_t b = bh / a->H, h = bh % a->H, i0 = qb * L->bs;                \
        int64_t nq = min64(L->bs, a->T - i0), kst[CHUNK_KEYS];                \
        const TY *q = (const TY *)a->q + b * a->sq[0] + h * a->sq[1] +        \
                     i0 * a->sq[2];                                           \
        const TY *k = (const TY *)a->k + b * a->sk[0] + h * a->sk[1];         \
        const TY *v = (const TY *)a->v + b * a->sv[0] + h * a->sv[1];         \
        TY *kp = w, *vp = kp + CHUNK_KEYS * D, *s = vp + CHUNK_KEYS * D;      \
        TY *acc = s + L->bs * CHUNK_KEYS, *m = acc + L->bs * D, *l = m + L->bs; \
        for (int64_t i = 0; i < nq; i++)                                      \
            m[i] = -INFINITY, l[i] = 0;                                       \
        memset(acc, 0, (size_t)(nq * D) * sizeof(TY));                        \
        int64_t k1 = L->row_ptr[qb + 1];                                      \
        for (int64_t k0 = L->row_ptr[qb]; k0 < k1;) {                         \
            int64_t nk, n = chunk_of(L, k0, k1, kst, &nk);                    \
            const int32_t *cols = L->cols + k0;                               \
            pack_##SUF(L, cols, n, k, a->sk[2], D, kp);                       \
            pack_##SUF(L, cols, n, v, a->sv[2], D, vp);                       \
            gemm_##SUF(false, true, nq, nk, D, (TY)a->scale, q, a->sq[2], kp, \
                       D, 0, s, nk);                                          \
            mask_##SUF(L, cols, n, kst, qb, nq, s, nk);                       \
            online_##SUF(s, nq, nk, m, l, acc, D);                            \
            gemm_##SUF(false, false, nq, D, nk, 1, s, nk, vp, D, 1, acc, D);  \
            k0 += n;                                                          \
        }                                                                     \
        TY *o = (TY *)c->o + (bh * a->T + i0) * D;                            \
        for (int64_t i = 0; i < nq; i++) {                                    \
            TY inv = l[i] > 0 ? 1 / l[i] : 0;                                 \
            for (int64_t d = 0; d < D; d++)                                   \
                o[i * D + d] = acc[i * D + d] * inv;                          \
            if (c->lse)                                                       \
                ((TY *)c->lse)[bh * a->T + i0 + i] =                          \
                    l[i] > 0 ? m[i] + (TY)log((double)l[i]) : -INFINITY;      \
        }                                                                     \
    }                                                                         \
    static void fw_task_##SUF(void *p, int64_t t0, int64_t t1)                \
    {                                                                         \
        fw_ctx *c = p;                                                        \
        int64_t D = c->a->D, bs = c->a->lay->bs;                              \
        TY *w = malloc((size_t)(2 * CHUNK_KEYS * D + bs * CHUNK_KEYS +        \
                               bs * D + 2 * bs) * sizeof(TY));                \
        if (!w) {                                                             \
            set_failed(&c->failed);                                           \
            return;                                                           \
        }                                                                     \
        for (int64_t t = t0; t < t1; t++)                                     \
            fw_block_##SUF(c, t, w);                                          \
        free(w);                                                              \
    }                                                                         \
    /* One chunk of query block qb of head (q, dout, lse, delta at the        \
     * block's first row; dq, dk, dv of the head). */                         \
    static void bw_chunk_##SUF(const bw_ctx *c, const TY *const *hp, int64_t qb, \
                               const int32_t *cols, int64_t n,                \
                               const int64_t *kst, int64_t nk, TY *w, TY *dq, \
                               TY *dk, TY *dv)                                \
    {                                                                         \
        const zsk_sattn *a = c->a;                                            \
        const zsk_blocks *L = a->lay;                                         \
        int64_t D = a->D, nq = min64(L->bs, a->T - qb * L->bs);               \
        const TY *q = hp[0], *dout = hp[1], *lse = hp[2], *delta = hp[3];     \
        TY *kp = w, *vp = kp + CHUNK_KEYS * D, *s = vp + CHUNK_KEYS * D;      \
        TY *dp = s + L->bs * CHUNK_KEYS;                                      \
        pack_##SUF(L, cols, n, hp[4], a->sk[2], D, kp);                       \
        pack_##SUF(L, cols, n, hp[5], a->sv[2], D, vp);                       \
        gemm_##SUF(false, true, nq, nk, D, (TY)a->scale, q, a->sq[2], kp, D, 0, \
                   s, nk);                                                    \
        mask_##SUF(L, cols, n, kst, qb, nq, s, nk);                           \
        gemm_##SUF(false, true, nq, nk, D, 1, dout, c->sd[2], vp, D, 0, dp,   \
                   nk);                                                       \
        grads_##SUF(s, dp, nq, nk, lse, delta, (TY)a->scale);                 \
        gemm_##SUF(false, false, nq, D, nk, 1, dp, nk, kp, D, 1, dq, D);      \
        for (int64_t j = 0; j < n; j++) {                                     \
            int64_t t0 = cols[j] * L->bs, kn = min64(L->bs, a->T - t0);       \
            gemm_##SUF(true, false, kn, D, nq, 1, s + kst[j], nk, dout,       \
                       c->sd[2], 1, dv + t0 * D, D);                          \
            gemm_##SUF(true, false, kn, D, nq, 1, dp + kst[j], nk, q,         \
                       a->sq[2], 1, dk + t0 * D, D);                          \
        }                                                                     \
    }                                                                         \
    static void bw_head_##SUF(const bw_ctx *c, int64_t bh, TY *w)             \
    {                                                                         \
        const zsk_sattn *a = c->a;                                            \
        const zsk_blocks *L = a->lay;                                         \
        int64_t D = a->D, Tn = a->T, b = bh / a->H, h = bh % a->H;            \
        const TY *q = (const TY *)a->q + b * a->sq[0] + h * a->sq[1];         \
        const TY *dout = (const TY *)c->dout + b * c->sd[0] + h * c->sd[1];   \
        const TY *o = (const TY *)c->o + bh * Tn * D;                         \
        const TY *lse = (const TY *)c->lse + bh * Tn;                         \
        TY *dq = (TY *)c->dq + bh * Tn * D, *dk = (TY *)c->dk + bh * Tn * D;  \
        TY *dv = (TY *)c->dv + bh * Tn * D;                                   \
        TY *delta = w + 2 * CHUNK_KEYS * D + 2 * L->bs * CHUNK_KEYS;          \
        int64_t kst[CHUNK_KEYS];                                              \
        memset(dq, 0, (size_t)(Tn * D) * sizeof(TY));                         \
        memset(dk, 0, (size_t)(Tn * D) * sizeof(TY));                         \
        memset(dv, 0, (size_t)(Tn * D) * sizeof(TY));                         \
        for (int64_t i = 0; i < Tn; i++) {                                    \
            TY sum = 0;                                                       \
            for (int64_t d = 0; d < D; d++)                                   \
                sum += dout[i * c->sd[2] + d] * o[i * D + d];                 \
            delta[i] = sum;                                                   \
        }                                                                     \
        for (int64_t qb = 0; qb < L->nb; qb++) {                              \
            int64_t i0 = qb * L->bs, k1 = L->row_ptr[qb + 1];                 \
            const TY *hp[6] = {q + i0 * a->sq[2], dout + i0 * c->sd[2],       \
                              lse + i0, delta + i0,                           \
                              (const TY *)a->k + b * a->sk[0] + h * a->sk[1], \
                              (const TY *)a->v + b * a->sv[0] + h * a->sv[1]}; \
            for (int64_t k0 = L->row_ptr[qb]; k0 < k1;) {                     \
                int64_t nk, n = chunk_of(L, k0, k1, kst, &nk);                \
                bw_chunk_##SUF(c, hp, qb, L->cols + k0, n, kst, nk, w,        \
                               dq + i0 * D, dk, dv);                          \
                k0 += n;                                                      \
            }                                                                 \
        }                                                                     \
    }                                                                         \
    static void bw_task_##SUF(void *p, int64_t t0, int64_t t1)                \
    {                                                                         \
        bw_ctx *c = p;                                                        \
        int64_t D = c->a->D, bs = c->a->lay->bs;                              \
        TY *w = malloc((size_t)(2 * CHUNK_KEYS * D + 2 * bs * CHUNK_KEYS +    \
                               c->a->T) * sizeof(TY));                        \
        if (!w) {                                                             \
            set_failed(&c->failed);                                           \
            return;                                                           \
        }                                                                     \
        for (int64_t t = t0; t < t1; t++)                                     \
            bw_head_##SUF(c, t, w);                                           \
        free(w);                                                              \
    }

DEFINE_SPARSE(float, f32, exp_f32)
DEFINE_SPARSE(double, f64, exp)

/* ---- drivers ---------------------------------------------------------------- */

zs_status zsk_sparse_attention_forward(const zsk_sattn *a, void *o, void *lse)
{
    fw_ctx c = {.a = a, .o = o, .lse = lse};
    int64_t n = a->B * a->H * a->lay->nb;
    if (n > 0 && a->D > 0)
        zs_parallel_for(n, 1, a->dt == ZS_F32 ? fw_task_f32 : fw_task_f64, &c);
    if (c.failed)
        return zs_set_error_code(ZS_ERR_NOMEM, "sparse_attention: out of memory "
                                 "for the kernel's panels");
    return ZS_OK;
}

zs_status zsk_sparse_attention_backward(const zsk_sattn *a, const void *o,
                                        const void *lse, const void *dout,
                                        const int64_t sd[3], void *dq, void *dk,
                                        void *dv)
{
    bw_ctx c = {.a = a, .o = o, .lse = lse, .dout = dout, .dq = dq, .dk = dk,
                .dv = dv};
    memcpy(c.sd, sd, sizeof c.sd);
    int64_t n = a->B * a->H;
    if (n > 0 && a->D > 0)
        zs_parallel_for(n, 1, a->dt == ZS_F32 ? bw_task_f32 : bw_task_f64, &c);
    if (c.failed)
        return zs_set_error_code(ZS_ERR_NOMEM, "sparse_attention: out of memory "
                                 "for the backward's panels");
    return ZS_OK;
}
