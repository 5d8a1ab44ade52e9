/*
 * test_attention.c - zs_attention against a naive float64 reference
 * (softmax(q k^T * scale + mask + alibi) v with the T x T matrix): odd
 * shapes spanning several 64-row tiles, causal and not, ALiBi slopes for
 * H = 3, 8, 12, the KV-cache form (Tq < Tk with q_offset), inputs that are
 * strided views (a permuted fused QKV tensor, read in place) or have a
 * strided last dim (copied); f32 and f64. Backward against the float64
 * formulas on multi-tile sizes, the descriptor attention_backward run
 * directly (strided inputs, lse from float64; its errors), gradient checks
 * in f64 (also through a fused QKV tensor), peak memory of forward + backward growing linearly
 * in T, and error paths. bf16 and f16 (f32 arithmetic inside, lse f32)
 * against the float64 formulas on the same rounded inputs.
 *
 * Tolerances: outputs are convex combinations of values in [-1, 1], so
 * errors are absolute-like; f32 forward uses a polynomial exp (about 2 ulp)
 * and float accumulation over at most a few hundred keys: 1e-5. f32
 * gradients sum up to Tq * Tk terms of order 1: 1e-4 relative to
 * max(1, |ref|). f64: 1e-12 (forward), 1e-10 (gradients).
 */
#include <stdlib.h>

#include <string.h>

#include "ops/op.h"
#include "kernels/cpu/attention.h"
#include "testutil.h"

typedef struct cfg {
    int64_t B, H, Tq, Tk, D;
    bool causal, alibi;
    int64_t off;
    double scale; /* 0: 1/sqrt(D) */
} cfg;

/* ---- references -------------------------------------------------------- */

/* BLOOM's get_slopes, written recursively as in the Python original. */
static void ref_slopes(int64_t n, double *out)
{
    double l2 = log2((double)n);
    if (l2 == floor(l2)) {
        double start = pow(2.0, -pow(2.0, -(l2 - 3)));
        for (int64_t i = 0; i < n; i++)
            out[i] = start * pow(start, (double)i);
        return;
    }
    int64_t c = (int64_t)1 << (int64_t)floor(l2);
    double *big = malloc((size_t)(2 * c) * sizeof *big);
    ref_slopes(c, out);
    ref_slopes(2 * c, big);
    for (int64_t j = 0; j < n - c; j++)
        out[c + j] = big[2 * j];
    free(big);
}

static double scale_of(const cfg *c)
{
    return c->scale != 0 ? c->scale : 1 / sqrt((double)c->D);
}

/* Probabilities P [Tq, Tk] of head (b, h); q, k row-major [B, H, T, D];
 * the rows' log-sum-exp in lse [Tq] unless it is NULL. */
static void ref_probs(const cfg *c, const double *q, const double *k,
                      int64_t bh, double *P, double *lse)
{
    double slopes[64];
    ref_slopes(c->H, slopes);
    double slope = c->alibi ? slopes[bh % c->H] : 0, sc = scale_of(c);
    const double *qh = q + bh * c->Tq * c->D, *kh = k + bh * c->Tk * c->D;
    for (int64_t i = 0; i < c->Tq; i++) {
        double *row = P + i * c->Tk, mx = -INFINITY, sum = 0;
        int64_t pos = c->off + i;
        for (int64_t j = 0; j < c->Tk; j++) {
            double s = 0;
            for (int64_t d = 0; d < c->D; d++)
                s += qh[i * c->D + d] * kh[j * c->D + d];
            row[j] = c->causal && j > pos ? -INFINITY
                                          : s * sc - slope * (double)(pos - j);
            mx = fmax(mx, row[j]);
        }
        for (int64_t j = 0; j < c->Tk; j++)
            sum += row[j] = exp(row[j] - mx);
        for (int64_t j = 0; j < c->Tk; j++)
            row[j] /= sum;
        if (lse)
            lse[i] = mx + log(sum);
    }
}

static void ref_forward(const cfg *c, const double *q, const double *k,
                        const double *v, double *o)
{
    double *P = malloc((size_t)(c->Tq * c->Tk) * sizeof *P);
    for (int64_t bh = 0; bh < c->B * c->H; bh++) {
        ref_probs(c, q, k, bh, P, NULL);
        const double *vh = v + bh * c->Tk * c->D;
        for (int64_t i = 0; i < c->Tq; i++)
            for (int64_t d = 0; d < c->D; d++) {
                double s = 0;
                for (int64_t j = 0; j < c->Tk; j++)
                    s += P[i * c->Tk + j] * vh[j * c->D + d];
                o[(bh * c->Tq + i) * c->D + d] = s;
            }
    }
    free(P);
}

/* Gradients of sum(out * g): dv = P^T g, dP = g v^T,
 * dS = P (dP - rowsum(P dP)), dq = scale dS k, dk = scale dS^T q. */
static void ref_backward(const cfg *c, const double *q, const double *k,
                         const double *v, const double *g, double *dq,
                         double *dk, double *dv)
{
    int64_t Tq = c->Tq, Tk = c->Tk, D = c->D;
    double *P = malloc((size_t)(Tq * Tk) * sizeof *P);
    double *dS = malloc((size_t)(Tq * Tk) * sizeof *dS), sc = scale_of(c);
    for (int64_t bh = 0; bh < c->B * c->H; bh++) {
        ref_probs(c, q, k, bh, P, NULL);
        const double *qh = q + bh * Tq * D, *kh = k + bh * Tk * D,
                     *vh = v + bh * Tk * D, *gh = g + bh * Tq * D;
        for (int64_t i = 0; i < Tq; i++) {
            double rs = 0;
            for (int64_t j = 0; j < Tk; j++) {
                double dp = 0;
                for (int64_t d = 0; d < D; d++)
                    dp += gh[i * D + d] * vh[j * D + d];
                dS[i * Tk + j] = dp;
                rs += P[i * Tk + j] * dp;
            }
            for (int64_t j = 0; j < Tk; j++)
                dS[i * Tk + j] = P[i * Tk + j] * (dS[i * Tk + j] - rs) * sc;
        }
        for (int64_t d = 0; d < D; d++) {
            for (int64_t i = 0; i < Tq; i++) {
                double s = 0;
                for (int64_t j = 0; j < Tk; j++)
                    s += dS[i * Tk + j] * kh[j * D + d];
                dq[(bh * Tq + i) * D + d] = s;
            }
            for (int64_t j = 0; j < Tk; j++) {
                double sk = 0, sv = 0;
                for (int64_t i = 0; i < Tq; i++) {
                    sk += dS[i * Tk + j] * qh[i * D + d];
                    sv += P[i * Tk + j] * gh[i * D + d];
                }
                dk[(bh * Tk + j) * D + d] = sk;
                dv[(bh * Tk + j) * D + d] = sv;
            }
        }
    }
    free(P);
    free(dS);
}

/* ---- inputs ------------------------------------------------------------ */

/* layout 0: contiguous; 1: last dim strided (copied by the op);
 * 2: q, k, v are slices of a permuted fused [B, T, 3, H, D] tensor (read in
 * place; only when Tq == Tk). *fused receives that tensor (or NULL). */
static void make_qkv(zs_dtype dt, const cfg *c, int layout, uint64_t seed,
                     zs_tensor **qkv, zs_tensor **fused)
{
    *fused = NULL;
    if (layout == 2) {
        zs_tensor *x = zt_rand(dt, ZS_SHAPE(c->B, c->Tq, 3, c->H, c->D), seed);
        zs_tensor *p = zs_permute(x, (int[]){2, 0, 3, 1, 4});
        for (int i = 0; i < 3; i++) {
            zs_tensor *n = zs_narrow(p, 0, i, 1);
            qkv[i] = zs_squeeze(n, 0);
            zs_release(n);
        }
        zs_release(p);
        *fused = x;
        return;
    }
    int64_t sq[4] = {c->B, c->H, c->Tq, c->D}, sk[4] = {c->B, c->H, c->Tk, c->D};
    for (int i = 0; i < 3; i++)
        qkv[i] = layout == 1 ? zt_rand_strided(dt, 4, i ? sk : sq, seed + i)
                             : zt_rand(dt, 4, i ? sk : sq, seed + i);
}

static zs_attention_params params_of(const cfg *c)
{
    return (zs_attention_params){.causal = c->causal, .scale = c->scale,
                                 .alibi = c->alibi, .q_offset = c->off};
}

static void release3(zs_tensor **t)
{
    for (int i = 0; i < 3; i++)
        zs_release(t[i]);
}

/* Forward of c in dtype dt and layout vs the reference; returns error. */
static double forward_err(zs_dtype dt, const cfg *c, int layout, uint64_t seed)
{
    zs_tensor *t[3], *fused;
    make_qkv(dt, c, layout, seed, t, &fused);
    zs_attention_params p = params_of(c);
    zs_tensor *o = zs_attention(t[0], t[1], t[2], &p);
    double *q = zt_values(t[0]), *k = zt_values(t[1]), *v = zt_values(t[2]);
    int64_t n = c->B * c->H * c->Tq * c->D;
    double *ref = malloc((size_t)(n ? n : 1) * sizeof *ref);
    ref_forward(c, q, k, v, ref);
    double err = o && o->ndim == 4 && o->shape[2] == c->Tq ? zt_max_err(o, ref, n)
                                                           : INFINITY;
    free(q);
    free(k);
    free(v);
    free(ref);
    zs_release(o);
    release3(t);
    zs_release(fused);
    return err;
}

/* bf16 / f16: the reference reads the same rounded inputs, the kernel
 * computes in f32 (1e-5 as above) and rounds o once, by at most 2^-8
 * (bf16) or 2^-11 (f16) of |o| <= 1: twice that. */
static double tol_fw(zs_dtype dt)
{
    return dt == ZS_F32 ? 1e-5 : dt == ZS_F64 ? 1e-12 : dt == ZS_BF16 ? 0x1p-7 : 0x1p-10;
}

/* ---- forward ----------------------------------------------------------- */

static void test_forward(zs_dtype dt)
{
    static const int64_t Ts[] = {1, 7, 33, 130}, Ds[] = {1, 13, 64};
    uint64_t seed = 1000;
    for (int ti = 0; ti < 4; ti++)
        for (int di = 0; di < 3; di++)
            for (int causal = 0; causal < 2; causal++) {
                cfg c = {2, 3, Ts[ti], Ts[ti], Ds[di], causal, false, 0, 0};
                int layout = (int)(seed % 3);
                double err = forward_err(dt, &c, layout, seed);
                ZT_CHECK(err <= tol_fw(dt), "%s T=%lld D=%lld causal=%d "
                         "layout %d: err %g (seed %llu)", zs_dtype_name(dt),
                         (long long)c.Tq, (long long)c.D, causal, layout, err,
                         (unsigned long long)seed);
                seed += 7;
            }
    /* the head sizes of real models, an explicit scale, one head */
    static const int64_t Ds2[] = {32, 48, 80, 128};
    for (int di = 0; di < 4; di++) {
        cfg c = {1, 2, 70, 70, Ds2[di], true, false, 0, di == 2 ? 0.3 : 0};
        double err = forward_err(dt, &c, 2, seed);
        ZT_CHECK(err <= tol_fw(dt), "%s D=%lld: err %g", zs_dtype_name(dt),
                 (long long)c.D, err);
        seed += 7;
    }
    cfg one = {1, 1, 200, 200, 5, true, false, 0, 0};
    ZT_CHECK(forward_err(dt, &one, 0, 5) <= tol_fw(dt), "B=H=1 T=200");
    char name[64];
    snprintf(name, sizeof name, "forward %s", zs_dtype_name(dt));
    zt_section(name);
}

static void test_alibi(zs_dtype dt)
{
    /* slopes: powers of two, and 12 = 8 + every other slope of 16 */
    double s[12];
    zs_alibi_slopes(8, s);
    ZT_CHECK(s[0] == 0.5 && s[7] == 1.0 / 256, "H=8 slopes %g .. %g", s[0], s[7]);
    zs_alibi_slopes(12, s);
    ZT_CHECK(s[7] == 1.0 / 256 && fabs(s[8] - pow(2, -0.5)) < 1e-15 &&
                 fabs(s[11] - pow(2, -3.5)) < 1e-15,
             "H=12 slopes %g %g", s[8], s[11]);
    double r[12];
    for (int64_t H = 1; H <= 12; H++) {
        zs_alibi_slopes(H, s);
        ref_slopes(H, r);
        for (int64_t h = 0; h < H; h++)
            ZT_CHECK(fabs(s[h] - r[h]) < 1e-15, "H=%lld slope %lld: %g vs %g",
                     (long long)H, (long long)h, s[h], r[h]);
    }
    static const int64_t Hs[] = {3, 8, 12};
    uint64_t seed = 2000;
    for (int hi = 0; hi < 3; hi++)
        for (int causal = 0; causal < 2; causal++) {
            cfg c = {2, Hs[hi], 77, 77, 16, causal, true, 0, 0};
            int layout = (int)(seed % 3);
            double err = forward_err(dt, &c, layout, seed);
            ZT_CHECK(err <= tol_fw(dt), "%s alibi H=%lld causal=%d: err %g",
                     zs_dtype_name(dt), (long long)c.H, causal, err);
            seed += 11;
        }
    char name[64];
    snprintf(name, sizeof name, "alibi %s", zs_dtype_name(dt));
    zt_section(name);
}

/* Tq < Tk: the KV-cache step (q_offset = Tk - Tq), earlier offsets, and
 * non-causal cross attention; the last rows of a full causal attention
 * equal the same queries run against the cache. */
static void test_offset(zs_dtype dt)
{
    static const cfg cases[] = {
        {2, 3, 1, 130, 13, true, false, 129, 0},
        {2, 3, 5, 70, 64, true, true, 65, 0},
        {2, 3, 9, 70, 8, true, true, 3, 0},
        {1, 4, 20, 150, 16, true, false, 100, 0},
        {2, 3, 7, 33, 13, false, false, 0, 0},
        {2, 3, 40, 9, 13, false, true, 5, 0},
    };
    uint64_t seed = 3000;
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        double err = forward_err(dt, &cases[i], (int)(i % 2), seed);
        ZT_CHECK(err <= tol_fw(dt), "%s offset case %zu: err %g",
                 zs_dtype_name(dt), i, err);
        seed += 13;
    }
    /* cache consistency */
    const int64_t T = 97, Tq = 4;
    zs_tensor *q = zt_rand(dt, ZS_SHAPE(1, 6, T, 32), 31);
    zs_tensor *k = zt_rand(dt, ZS_SHAPE(1, 6, T, 32), 32);
    zs_tensor *v = zt_rand(dt, ZS_SHAPE(1, 6, T, 32), 33);
    zs_attention_params p = {.causal = true, .alibi = true};
    zs_tensor *full = zs_attention(q, k, v, &p);
    zs_tensor *qs = zs_narrow(q, 2, T - Tq, Tq);
    p.q_offset = T - Tq;
    zs_tensor *step = zs_attention(qs, k, v, &p);
    zs_tensor *tail = zs_narrow(full, 2, T - Tq, Tq);
    double *ref = zt_values(tail);
    double err = zt_max_err(step, ref, zs_numel(tail));
    ZT_CHECK(err <= (dt == ZS_F32 ? 1e-6 : 1e-14), "cache step vs full: %g", err);
    free(ref);
    zs_release(q);
    zs_release(k);
    zs_release(v);
    zs_release(full);
    zs_release(qs);
    zs_release(step);
    zs_release(tail);
    char name[64];
    snprintf(name, sizeof name, "q_offset and Tq < Tk %s", zs_dtype_name(dt));
    zt_section(name);
}

/* ---- backward ---------------------------------------------------------- */

static double grad_err(const zs_tensor *t, const double *ref)
{
    zs_tensor *g = zs_grad(t);
    return g ? zt_max_err(g, ref, zs_numel(t)) : INFINITY;
}

/* loss = sum(out * g) on multi-tile sizes against ref_backward. */
static void test_backward_ref(zs_dtype dt)
{
    static const cfg cases[] = {
        {2, 3, 130, 130, 13, true, false, 0, 0},
        {1, 3, 150, 150, 64, true, true, 0, 0},
        {2, 2, 70, 70, 33, false, true, 0, 0},
        {1, 3, 30, 140, 16, true, true, 110, 0},
        {2, 2, 25, 100, 16, true, false, 40, 0},
        {1, 2, 20, 90, 7, false, false, 0, 0},
        /* the AVX2 6x16 blocks (D % 16 == 0): query blocks of 72 and
         * their 6-row tails, key tiles of 32 and a lone short tile,
         * D = 128 (the largest they take), Tq != Tk */
        {1, 2, 161, 161, 64, false, true, 0, 0},
        {2, 2, 75, 33, 32, false, false, 0, 0},
        {1, 2, 97, 97, 128, true, false, 0, 0},
        {1, 2, 41, 100, 48, true, true, 59, 0.2},
    };
    /* bf16 / f16: besides the final rounding of dq, dk, dv (2^-8, 2^-11
     * relative), the backward reads the forward's rounded o in
     * delta = g . o, as torch does: 4x the rounding. */
    double tol = dt == ZS_F32 ? 1e-4 : dt == ZS_F64 ? 1e-10
               : dt == ZS_BF16 ? 0x1p-6 : 0x1p-9;
    uint64_t seed = 4000;
    for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++) {
        const cfg *c = &cases[ci];
        zs_tensor *t[3], *fused;
        int layout = c->Tq == c->Tk ? (int)(ci % 3) : (int)(ci % 2);
        make_qkv(dt, c, layout, seed, t, &fused);
        zs_tensor *gout = zt_rand(dt, ZS_SHAPE(c->B, c->H, c->Tq, c->D), seed + 5);
        for (int i = 0; i < 3; i++)
            zs_set_requires_grad(t[i], true);
        zs_attention_params p = params_of(c);
        zs_tensor *o = zs_attention(t[0], t[1], t[2], &p);
        ZT_CHECK(zs_backward(o, gout, false) == ZS_OK, "backward runs");
        double *q = zt_values(t[0]), *k = zt_values(t[1]), *v = zt_values(t[2]);
        double *g = zt_values(gout);
        int64_t nq = zs_numel(t[0]), nk = zs_numel(t[1]);
        double *dq = malloc((size_t)nq * sizeof *dq);
        double *dk = malloc((size_t)nk * sizeof *dk), *dv = malloc((size_t)nk * sizeof *dv);
        ref_backward(c, q, k, v, g, dq, dk, dv);
        double e0 = grad_err(t[0], dq), e1 = grad_err(t[1], dk), e2 = grad_err(t[2], dv);
        ZT_CHECK(e0 <= tol && e1 <= tol && e2 <= tol, "%s backward case %zu "
                 "layout %d: dq %g dk %g dv %g (seed %llu)", zs_dtype_name(dt),
                 ci, layout, e0, e1, e2, (unsigned long long)seed);
        free(q);
        free(k);
        free(v);
        free(g);
        free(dq);
        free(dk);
        free(dv);
        zs_release(o);
        zs_release(gout);
        release3(t);
        zs_release(fused);
        seed += 17;
    }
    char name[64];
    snprintf(name, sizeof name, "backward vs reference %s", zs_dtype_name(dt));
    zt_section(name);
}

/* The layout of attention_attrs (src/ops/attention.c). */
typedef struct attn_attrs {
    double scale;
    int64_t q_offset;
    bool causal, alibi;
} attn_attrs;

/* attention_backward called directly, as a backward rule on any device
 * does: q, k, v and g with a strided last dim (copied by the kernel), lse
 * from float64; dq, dk, dv by zsi_run_n against the float64 formulas. */
static void test_backward_descriptor(void)
{
    zsi_opdef *def = zsi_opdef_find("attention_backward");
    zsi_opdef *fw = zsi_opdef_find("attention");
    ZT_CHECK(def && fw && fw->bw_ops && fw->bw_ops[0] == def && !fw->bw_ops[1] &&
                 !def->op.backward, "attention's bw_ops");
    if (!def)
        return;
    cfg c = {1, 3, 9, 12, 8, true, true, 3, 0.4};
    zs_tensor *t[3], *fused;
    make_qkv(ZS_F64, &c, 1, 4500, t, &fused);
    zs_tensor *g = zt_rand_strided(ZS_F64, ZS_SHAPE(c.B, c.H, c.Tq, c.D), 4510);
    zs_attention_params p = params_of(&c);
    zs_tensor *o = zs_attention(t[0], t[1], t[2], &p);
    zs_tensor *lse = zs_empty(ZS_F64, ZS_SHAPE(c.B, c.H, c.Tq));
    double *q = zt_values(t[0]), *k = zt_values(t[1]), *v = zt_values(t[2]);
    double *gv = zt_values(g), *P = malloc((size_t)(c.Tq * c.Tk) * sizeof *P);
    for (int64_t bh = 0; bh < c.B * c.H; bh++)
        ref_probs(&c, q, k, bh, P, (double *)zs_data(lse) + bh * c.Tq);
    int64_t nq = zs_numel(t[0]), nk = zs_numel(t[1]);
    double *dq = malloc((size_t)nq * sizeof *dq);
    double *dk = malloc((size_t)nk * sizeof *dk), *dv = malloc((size_t)nk * sizeof *dv);
    ref_backward(&c, q, k, v, gv, dq, dk, dv);
    attn_attrs at = {c.scale, c.off, c.causal, c.alibi};
    zs_tensor *d[3];
    zs_tensor *in[6] = {t[0], t[1], t[2], o, lse, g};
    zs_status st = zsi_run_n(def, 6, in, &at, 3, d);
    double e0 = st == ZS_OK ? zt_max_err(d[0], dq, nq) : 1;
    double e1 = st == ZS_OK ? zt_max_err(d[1], dk, nk) : 1;
    double e2 = st == ZS_OK ? zt_max_err(d[2], dv, nk) : 1;
    ZT_CHECK(!zs_is_contiguous(g) && e0 <= 1e-10 && e1 <= 1e-10 && e2 <= 1e-10,
             "dq %g dk %g dv %g", e0, e1, e2);
    for (int i = 0; i < 3; i++)
        zs_release(d[i]); /* NULL on failure */
    ZT_EXPECT_ERROR(zsi_run(def, 6, in, &at) == NULL, "3 results: run it with "
                    "zsi_run_n");
    in[4] = o;
    ZT_EXPECT_ERROR(zsi_run_n(def, 6, in, &at, 3, d) < 0, "attention_backward: "
                    "q [1, 3, 9, 8], out [1, 3, 9, 8], lse [1, 3, 9, 8]");
    at.q_offset = 4;
    in[4] = lse;
    ZT_EXPECT_ERROR(zsi_run_n(def, 6, in, &at, 3, d) < 0, "needs Tk >= 13");
    free(q);
    free(k);
    free(v);
    free(gv);
    free(P);
    free(dq);
    free(dk);
    free(dv);
    release3(t);
    zs_release(g);
    zs_release(o);
    zs_release(lse);
    zt_section("attention_backward run directly: strided inputs, errors");
}

static zs_tensor *attn_fn(void *ctx, zs_tensor **in)
{
    zs_attention_params p = params_of(ctx);
    return zs_attention(in[0], in[1], in[2], &p);
}

/* in[0] is a fused [B, T, 3, H, D] tensor sliced into q, k, v. */
static zs_tensor *fused_fn(void *ctx, zs_tensor **in)
{
    zs_tensor *p = zs_permute(in[0], (int[]){2, 0, 3, 1, 4}), *t[3];
    for (int i = 0; i < 3; i++) {
        zs_tensor *n = zs_narrow(p, 0, i, 1);
        t[i] = zs_squeeze(n, 0);
        zs_release(n);
    }
    zs_tensor *o = attn_fn(ctx, t);
    zs_release(p);
    release3(t);
    return o;
}

static void test_gradcheck(void)
{
    static const cfg cases[] = {
        {2, 2, 6, 6, 3, true, false, 0, 0},
        {1, 3, 5, 5, 4, true, true, 0, 0},
        {1, 2, 5, 5, 3, false, true, 0, 0.7},
        {1, 2, 3, 7, 3, true, true, 4, 0},
        {2, 1, 4, 6, 2, false, false, 1, 0},
    };
    char name[64];
    for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++) {
        const cfg *c = &cases[ci];
        zs_tensor *t[3], *fused;
        make_qkv(ZS_F64, c, (int)(ci % 2), 5000 + ci, t, &fused);
        for (int i = 0; i < 3; i++)
            zs_set_requires_grad(t[i], true);
        snprintf(name, sizeof name, "attention case %zu", ci);
        ZT_GRADCHECK(name, attn_fn, (void *)c, 3, t);
        release3(t);
    }
    cfg fc = {1, 2, 5, 5, 3, true, true, 0, 0};
    zs_tensor *x = zt_rand(ZS_F64, ZS_SHAPE(1, 5, 3, 2, 3), 5100);
    zs_set_requires_grad(x, true);
    ZT_GRADCHECK("attention through fused qkv", fused_fn, &fc, 1, &x);
    zs_release(x);
    zt_section("gradcheck f64");
}

/* ---- memory ------------------------------------------------------------ */

/* Peak bytes above the baseline during forward + backward at length T. */
static double peak_fwd_bwd(int64_t T)
{
    zs_tensor *t[3];
    for (int i = 0; i < 3; i++) {
        t[i] = zt_rand(ZS_F32, ZS_SHAPE(1, 2, T, 32), 60 + (uint64_t)i);
        zs_set_requires_grad(t[i], true);
    }
    zs_tensor *g = zt_rand(ZS_F32, ZS_SHAPE(1, 2, T, 32), 70);
    zs_alloc_stats st;
    zs_alloc_get_stats(&st);
    size_t base = st.current_bytes;
    zs_alloc_reset_peak();
    zs_attention_params p = {.causal = true};
    zs_tensor *o = zs_attention(t[0], t[1], t[2], &p);
    zs_backward(o, g, false);
    zs_alloc_get_stats(&st);
    zs_release(o);
    zs_release(g);
    release3(t);
    return (double)(st.peak_bytes - base);
}

static void test_memory(void)
{
    double p256 = peak_fwd_bwd(256), p512 = peak_fwd_bwd(512);
    /* linear: ~2x; a stored T x T score matrix alone would be 2 MiB at 512 */
    ZT_CHECK(p512 < 3 * p256 + 4096, "peak %g at T=512 vs %g at T=256", p512, p256);
    ZT_CHECK(p512 < 64.0 * 512 * 2 * 32 * 4, "peak %g at T=512 exceeds "
             "64 rows of [T, D] per head", p512);
    printf("  peak bytes of forward+backward: T=256 %.0f, T=512 %.0f\n", p256, p512);
    zt_section("memory linear in T");
}

/* ---- errors ------------------------------------------------------------ */

static void test_errors(void)
{
    zs_tensor *q = zt_rand(ZS_F32, ZS_SHAPE(2, 3, 5, 8), 1);
    zs_tensor *k = zt_rand(ZS_F32, ZS_SHAPE(2, 3, 7, 8), 2);
    zs_tensor *v = zt_rand(ZS_F32, ZS_SHAPE(2, 3, 7, 8), 3);
    zs_tensor *v6 = zt_rand(ZS_F32, ZS_SHAPE(2, 3, 6, 8), 4);
    zs_tensor *k4 = zt_rand(ZS_F32, ZS_SHAPE(2, 3, 7, 4), 5);
    zs_tensor *h2 = zt_rand(ZS_F32, ZS_SHAPE(2, 2, 7, 8), 6);
    zs_tensor *q3 = zt_rand(ZS_F32, ZS_SHAPE(3, 5, 8), 7);
    zs_tensor *qd = zt_rand(ZS_F64, ZS_SHAPE(2, 3, 5, 8), 8);
    zs_tensor *qi = zs_zeros(ZS_I32, ZS_SHAPE(2, 3, 5, 8));
    zs_tensor *k0 = zs_zeros(ZS_F32, ZS_SHAPE(2, 3, 0, 8));
    zs_attention_params causal = {.causal = true, .q_offset = 2};
    ZT_EXPECT_ERROR(zs_attention(q, k, v6, NULL) == NULL, "key length differ");
    ZT_EXPECT_ERROR(zs_attention(q, k4, k4, NULL) == NULL, "head size D differs");
    ZT_EXPECT_ERROR(zs_attention(q, h2, h2, NULL) == NULL, "[2, 2, 7, 8]");
    ZT_EXPECT_ERROR(zs_attention(q3, k, v, NULL) == NULL, "needs 4 dims");
    ZT_EXPECT_ERROR(zs_attention(qd, k, v, NULL) == NULL, "dtypes f64 and f32");
    ZT_EXPECT_ERROR(zs_attention(qi, k, v, NULL) == NULL, "dtype i32");
    ZT_EXPECT_ERROR(zs_attention(q, k0, k0, NULL) == NULL, "no keys");
    /* causal: 5 queries from position 2 end at 7 (ok), from 3 they do not */
    zs_tensor *o = zs_attention(q, k, v, &causal);
    ZT_CHECK(o != NULL, "q_offset 2 + Tq 5 = Tk 7 is allowed");
    zs_release(o);
    causal.q_offset = 3;
    ZT_EXPECT_ERROR(zs_attention(q, k, v, &causal) == NULL, "needs Tk >= 8");
    ZT_EXPECT_ERROR(zs_attention(k, q, q, &(zs_attention_params){.causal = true}) == NULL,
                    "got Tk 5");
    causal.q_offset = -1;
    ZT_EXPECT_ERROR(zs_attention(q, k, v, &causal) == NULL, "q_offset = -1");
    ZT_EXPECT_ERROR(zs_attention(q, k, v, &(zs_attention_params){.scale = NAN}) == NULL,
                    "scale = nan");
    zs_set_error("first");
    ZT_CHECK(zs_attention(NULL, k, v, NULL) == NULL &&
                 !strcmp(zs_last_error(), "first"),
             "NULL input keeps the first error");
    zs_tensor *all[] = {q, k, v, v6, k4, h2, q3, qd, qi, k0};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        zs_release(all[i]);
    ZT_CHECK(zs_autograd_live_nodes() == 0, "no autograd nodes left: %lld",
             (long long)zs_autograd_live_nodes());
    zt_section("errors");
}

/* ---- output shapes against the plain shape rule ----------------------- */

static void test_attention_shapes(void)
{
    const uint64_t seed = 1307;
    zt_irand_seed(seed);
    for (int trial = 0; trial < 20; trial++) {
        zs_scope_push();
        int64_t B = zt_irand(1, 2), H = zt_irand(1, 3), Tq = zt_irand(1, 5);
        int64_t Tk = Tq + zt_irand(0, 3), D = zt_irand(1, 8);
        zs_attention_params p = {.causal = zt_irand(0, 1), .alibi = zt_irand(0, 1),
                                 .q_offset = Tk - Tq};
        zs_tensor *q = zs_zeros(ZS_F32, ZS_SHAPE(B, H, Tq, D));
        zs_tensor *k = zs_zeros(ZS_F32, ZS_SHAPE(B, H, Tk, D));
        zs_tensor *v = zs_zeros(ZS_F32, ZS_SHAPE(B, H, Tk, D));
        ZT_CHECK(zt_shape_is(zs_attention(q, k, v, &p), 4, (int64_t[]){B, H, Tq, D}),
                 "attention shape, seed %llu trial %d", (unsigned long long)seed, trial);
        zs_scope_pop();
    }
    zt_section("attention: q's shape [B, H, Tq, D] on random shapes");
}

int main(void)
{
    test_attention_shapes();
    test_forward(ZS_F32);
    test_forward(ZS_F64);
    test_alibi(ZS_F32);
    test_alibi(ZS_F64);
    test_offset(ZS_F32);
    test_offset(ZS_F64);
    test_backward_ref(ZS_F32);
    test_backward_ref(ZS_F64);
    test_forward(ZS_BF16);
    test_forward(ZS_F16);
    test_alibi(ZS_BF16);
    test_offset(ZS_F16);
    test_backward_ref(ZS_BF16);
    test_backward_ref(ZS_F16);
    test_offset(ZS_BF16);
    /* bf16 again on the widening path (f32 tiles) where the CPU would take
     * the vdpbf16ps one (attention_bf16.c) */
    zsk_attention_bf16_off = true;
    test_forward(ZS_BF16);
    test_alibi(ZS_BF16);
    test_offset(ZS_BF16);
    test_backward_ref(ZS_BF16);
    zsk_attention_bf16_off = false;
    test_backward_descriptor();
    test_gradcheck();
    test_memory();
    test_errors();
    return zt_done();
}
