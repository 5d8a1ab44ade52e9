/*
 * test_matmul.c - zs_matmul and zs_matmul_t against a float64 reference:
 * odd sizes, 1-D promotion, batched and broadcast batch dims, the four
 * transpose combinations, non-contiguous views (strided copies, transposed
 * and row-padded views passed without a copy), f32 and f64; gradient checks
 * in f64 for all of these; error paths.
 *
 * Tolerance: f32 results within 1e-5 of the reference relative to
 * max(1, |ref|): inputs are uniform in [-1, 1] and K <= 300, so the f32
 * rounding error of a sum of K products stays near sqrt(K) * 2^-24 * |ref|.
 */
#include <stdlib.h>

#include "testutil.h"

/* A case in numpy form: a [.., M, K] (or [K]) times b [.., K, N] (or [K]). */
typedef struct mm_case {
    int na, nb;
    int64_t a[4], b[4];
} mm_case;

static const mm_case cases[] = {
    {2, 2, {1, 1}, {1, 1}},
    {2, 2, {7, 5}, {5, 13}},
    {2, 2, {33, 17}, {17, 65}},
    {2, 2, {1, 9}, {9, 6}},
    {1, 2, {11}, {11, 4}},
    {2, 1, {6, 11}, {11}},
    {1, 1, {8}, {8}},
    {4, 2, {2, 3, 4, 5}, {5, 6}},
    {4, 4, {3, 1, 4, 5}, {1, 4, 5, 6}},
    {1, 3, {3}, {2, 3, 4}},
    {3, 1, {2, 5, 3}, {3}},
};
#define NCASES (int)(sizeof cases / sizeof *cases)

/* Shape of x with its last two dims swapped (x stored transposed). */
static void swap_last(int n, const int64_t *s, int64_t *out)
{
    memcpy(out, s, (size_t)n * sizeof *out);
    if (n >= 2) {
        out[n - 2] = s[n - 1];
        out[n - 1] = s[n - 2];
    }
}

/* float64 reference of op(a) op(b) with numpy promotion and broadcasting;
 * a, b as stored (ta: a's last two dims hold op(a)^T). Fills the expected
 * result shape. Returns a malloc'd row-major array. */
static double *reference(const zs_tensor *a, const zs_tensor *b, bool ta,
                         bool tb, int *ondim, int64_t *oshape)
{
    double *av = zt_values(a), *bv = zt_values(b);
    int64_t sa[ZS_MAX_DIMS], sb[ZS_MAX_DIMS];
    int na = a->ndim, nb = b->ndim;
    memcpy(sa, a->shape, sizeof sa);
    memcpy(sb, b->shape, sizeof sb);
    if (na == 1) { sa[1] = sa[0]; sa[0] = 1; na = 2; }
    if (nb == 1) { sb[1] = 1; nb = 2; }
    int64_t M = sa[na - (ta ? 1 : 2)], K = sa[na - (ta ? 2 : 1)];
    int64_t N = sb[nb - (tb ? 2 : 1)];
    int n = (na > nb ? na : nb) - 2;
    int64_t bs[ZS_MAX_DIMS], nbatch = 1;
    for (int d = 0; d < n; d++) {
        int da = d - (n - (na - 2)), db = d - (n - (nb - 2));
        int64_t x = da >= 0 ? sa[da] : 1, y = db >= 0 ? sb[db] : 1;
        bs[d] = x > y ? x : y;
        nbatch *= bs[d];
    }
    double *out = calloc((size_t)(nbatch * M * N + 1), sizeof *out);
    for (int64_t i = 0; i < nbatch; i++) {
        int64_t rem = i, ia = 0, ib = 0, ma = 1, mb = 1;
        for (int d = n - 1; d >= 0; d--) {
            int64_t idx = rem % bs[d];
            rem /= bs[d];
            int da = d - (n - (na - 2)), db = d - (n - (nb - 2));
            if (da >= 0) { ia += (sa[da] == 1 ? 0 : idx) * ma; ma *= sa[da]; }
            if (db >= 0) { ib += (sb[db] == 1 ? 0 : idx) * mb; mb *= sb[db]; }
        }
        const double *A = av + ia * M * K, *B = bv + ib * K * N;
        for (int64_t m = 0; m < M; m++)
            for (int64_t j = 0; j < N; j++) {
                double s = 0;
                for (int64_t k = 0; k < K; k++)
                    s += (ta ? A[k * M + m] : A[m * K + k]) *
                         (tb ? B[j * K + k] : B[k * N + j]);
                out[(i * M + m) * N + j] = s;
            }
    }
    *ondim = 0;
    for (int d = 0; d < n; d++)
        oshape[(*ondim)++] = bs[d];
    if (a->ndim != 1)
        oshape[(*ondim)++] = M;
    if (b->ndim != 1)
        oshape[(*ondim)++] = N;
    free(av);
    free(bv);
    return out;
}

/* Compares o with the reference of op(a) op(b), shape included. */
static void check(const char *what, zs_tensor *o, zs_tensor *a, zs_tensor *b,
                  bool ta, bool tb, double tol)
{
    int ndim;
    int64_t shape[ZS_MAX_DIMS];
    double *ref = reference(a, b, ta, tb, &ndim, shape);
    bool shape_ok = o && o->ndim == ndim;
    for (int d = 0; shape_ok && d < ndim; d++)
        shape_ok = o->shape[d] == shape[d];
    ZT_CHECK(shape_ok, "%s: result shape", what);
    if (shape_ok) {
        double err = zt_max_err(o, ref, zs_numel(o));
        ZT_CHECK(err <= tol, "%s: error %.3g > %.3g", what, err, tol);
    }
    free(ref);
}

static double tol_of(zs_dtype dt) { return dt == ZS_F32 ? 1e-5 : 1e-12; }

static void test_numpy_cases(zs_dtype dt)
{
    for (int c = 0; c < NCASES; c++) {
        const mm_case *mc = &cases[c];
        char what[64];
        snprintf(what, sizeof what, "%s case %d", zs_dtype_name(dt), c);
        for (int strided = 0; strided < 2; strided++) {
            zs_tensor *a = strided ? zt_rand_strided(dt, mc->na, mc->a, 100 + c)
                                   : zt_rand(dt, mc->na, mc->a, 100 + c);
            zs_tensor *b = zt_rand(dt, mc->nb, mc->b, 200 + c);
            zs_tensor *o = zs_matmul(a, b);
            check(what, o, a, b, false, false, tol_of(dt));
            zs_release(o);
            zs_release(a);
            zs_release(b);
        }
    }
    zt_section(dt == ZS_F32 ? "matmul numpy cases f32" : "matmul numpy cases f64");
}

/* All four transpose combinations on 2-D and batched operands stored as
 * op(x)^T where flagged; also as transposed views of contiguous tensors
 * (no copy: the flag flips) and as row-padded narrow views (ld > cols). */
static void test_transposes(zs_dtype dt)
{
    for (int c = 1; c < NCASES; c++) {
        const mm_case *mc = &cases[c];
        if (mc->na < 2 || mc->nb < 2)
            continue;
        for (int t = 0; t < 4; t++) {
            bool ta = t & 1, tb = t & 2;
            int64_t sa[4], sb[4];
            swap_last(mc->na, mc->a, sa);
            swap_last(mc->nb, mc->b, sb);
            for (int view = 0; view < 3; view++) {
                zs_tensor *a, *b;
                if (view == 0) { /* plain storage */
                    a = zt_rand(dt, mc->na, ta ? sa : mc->a, 300 + c);
                    b = zt_rand(dt, mc->nb, tb ? sb : mc->b, 400 + c);
                } else if (view == 1) { /* transposed views */
                    zs_tensor *a0 = zt_rand(dt, mc->na, ta ? mc->a : sa, 300 + c);
                    zs_tensor *b0 = zt_rand(dt, mc->nb, tb ? mc->b : sb, 400 + c);
                    a = zs_transpose(a0, -1, -2);
                    b = zs_transpose(b0, -1, -2);
                    zs_release(a0);
                    zs_release(b0);
                } else { /* rows padded: narrow of a wider tensor */
                    int64_t wa[4], wb[4];
                    memcpy(wa, ta ? sa : mc->a, sizeof wa);
                    memcpy(wb, tb ? sb : mc->b, sizeof wb);
                    int64_t la = wa[mc->na - 1], lb = wb[mc->nb - 1];
                    wa[mc->na - 1] += 3;
                    wb[mc->nb - 1] += 5;
                    zs_tensor *a0 = zt_rand(dt, mc->na, wa, 300 + c);
                    zs_tensor *b0 = zt_rand(dt, mc->nb, wb, 400 + c);
                    a = zs_narrow(a0, -1, 1, la);
                    b = zs_narrow(b0, -1, 2, lb);
                    zs_release(a0);
                    zs_release(b0);
                }
                zs_tensor *o = zs_matmul_t(a, b, ta, tb);
                char what[80];
                snprintf(what, sizeof what, "%s case %d ta=%d tb=%d view %d",
                         zs_dtype_name(dt), c, ta, tb, view);
                check(what, o, a, b, ta, tb, tol_of(dt));
                zs_release(o);
                zs_release(a);
                zs_release(b);
            }
        }
    }
    zt_section(dt == ZS_F32 ? "matmul_t transposes and views f32"
                            : "matmul_t transposes and views f64");
}

/* Sizes that reach the packed f32 kernels and the serial batch loop. */
static void test_large_f32(void)
{
    static const int64_t shapes[][6] = {
        /* na, a..., nb, b... encoded as 3-D batched */
        {1, 70, 300, 1, 300, 130},
        {2, 130, 70, 2, 70, 120},
        {1, 1, 257, 1, 257, 1000},
    };
    for (int s = 0; s < 3; s++) {
        const int64_t *p = shapes[s];
        for (int t = 0; t < 4; t++) {
            bool ta = t & 1, tb = t & 2;
            int64_t as[3] = {p[0], ta ? p[2] : p[1], ta ? p[1] : p[2]};
            int64_t bs[3] = {p[3], tb ? p[5] : p[4], tb ? p[4] : p[5]};
            zs_tensor *a = zt_rand(ZS_F32, 3, as, 500 + s);
            zs_tensor *b = zt_rand(ZS_F32, 3, bs, 600 + s);
            zs_tensor *o = zs_matmul_t(a, b, ta, tb);
            char what[64];
            snprintf(what, sizeof what, "large %d ta=%d tb=%d", s, ta, tb);
            check(what, o, a, b, ta, tb, 1e-5);
            zs_release(o);
            zs_release(a);
            zs_release(b);
        }
    }
    zt_section("matmul f32 large and batched");
}

/* Gradient-check function: op(view(in[0])) op(view(in[1])). The views
 * make non-contiguous operands from contiguous leaves: 1 transposes the
 * last two dims (the leaf is stored the other way round), 2 narrows the
 * last dim (row padding), 3 takes every other element (copied inside). */
typedef struct gctx {
    bool use_t, ta, tb;
    int view;
    int64_t len[2]; /* last-dim size of the operands (views 2 and 3) */
} gctx;

static zs_tensor *make_view(const gctx *g, zs_tensor *x, int i)
{
    switch (g->view) {
    case 1: return zs_transpose(x, -1, -2);
    case 2: return zs_narrow(x, -1, 1, g->len[i]);
    case 3: return zs_slice(x, -1, 0, 2 * g->len[i], 2);
    default: return zs_retain(x);
    }
}

static zs_tensor *mm_fn(void *p, zs_tensor **in)
{
    const gctx *g = p;
    zs_tensor *a = make_view(g, in[0], 0), *b = make_view(g, in[1], 1);
    zs_tensor *o = g->use_t ? zs_matmul_t(a, b, g->ta, g->tb) : zs_matmul(a, b);
    zs_release(a);
    zs_release(b);
    return o;
}

/* Leaf shape for operand shape s (n dims) under view v. */
static void leaf_shape(int v, int n, const int64_t *s, int64_t *out)
{
    if (v == 1) {
        swap_last(n, s, out);
        return;
    }
    memcpy(out, s, (size_t)n * sizeof *out);
    if (v == 2)
        out[n - 1] += 3;
    else if (v == 3)
        out[n - 1] *= 2;
}

static void gradcheck_case(int c, gctx g, uint64_t seed)
{
    const mm_case *mc = &cases[c];
    int64_t sa[4], sb[4], la[4], lb[4];
    memcpy(sa, mc->a, sizeof sa);
    memcpy(sb, mc->b, sizeof sb);
    if (g.ta)
        swap_last(mc->na, mc->a, sa);
    if (g.tb)
        swap_last(mc->nb, mc->b, sb);
    leaf_shape(g.view, mc->na, sa, la);
    leaf_shape(g.view, mc->nb, sb, lb);
    g.len[0] = sa[mc->na - 1];
    g.len[1] = sb[mc->nb - 1];
    zs_tensor *in[2] = {zt_rand(ZS_F64, mc->na, la, seed),
                        zt_rand(ZS_F64, mc->nb, lb, seed + 1)};
    zs_set_requires_grad(in[0], true);
    zs_set_requires_grad(in[1], true);
    char what[80];
    snprintf(what, sizeof what, "case %d %s ta=%d tb=%d view %d", c,
             g.use_t ? "matmul_t" : "matmul", g.ta, g.tb, g.view);
    ZT_GRADCHECK(what, mm_fn, &g, 2, in);
    zs_release(in[0]);
    zs_release(in[1]);
}

static void test_gradients(void)
{
    for (int c = 0; c < NCASES; c++) {
        const mm_case *mc = &cases[c];
        bool two_d = mc->na >= 2 && mc->nb >= 2;
        for (int v = 0; v < 4; v++) {
            /* the largest case (33x17x65) only plainly: it costs the most */
            if ((v == 1 && !two_d) || (v > 0 && c == 2))
                continue;
            gradcheck_case(c, (gctx){false, false, false, v, {0, 0}}, 700 + c);
        }
        if (c == 2) /* both transposed */
            gradcheck_case(c, (gctx){true, true, true, 0, {0, 0}}, 900 + c);
        if (!two_d || c == 2)
            continue;
        for (int t = 1; t < 4; t++)
            for (int v = 0; v < 4; v++)
                gradcheck_case(c, (gctx){true, t & 1, t & 2, v, {0, 0}},
                               900 + c);
    }
    zt_section("matmul gradients");
}

static void test_errors(void)
{
    zs_tensor *a = zt_rand(ZS_F32, ZS_SHAPE(2, 3), 1);
    zs_tensor *b = zt_rand(ZS_F32, ZS_SHAPE(4, 5), 2);
    zs_tensor *s = zs_scalar(ZS_F32, 2.0);
    zs_tensor *d = zt_rand(ZS_F64, ZS_SHAPE(3, 5), 3);
    zs_tensor *v = zt_rand(ZS_F32, ZS_SHAPE(4), 4);
    zs_tensor *b3 = zt_rand(ZS_F32, ZS_SHAPE(3, 3, 5), 5);
    zs_tensor *a3 = zt_rand(ZS_F32, ZS_SHAPE(2, 2, 3), 6);
    ZT_EXPECT_ERROR(zs_matmul(a, b) == NULL, "[2, 3] and [4, 5]");
    ZT_EXPECT_ERROR(zs_matmul(a, v) == NULL, "inner dims 3 vs 4");
    ZT_EXPECT_ERROR(zs_matmul_t(a, b, false, true) == NULL, "[4, 5]^T");
    ZT_EXPECT_ERROR(zs_matmul(s, a) == NULL, "0-d operand");
    ZT_EXPECT_ERROR(zs_matmul_t(v, b, false, false) == NULL, "at least 2 dims");
    ZT_EXPECT_ERROR(zs_matmul(a, d) == NULL, "dtypes f32 and f64 differ");
    ZT_EXPECT_ERROR(zs_matmul(a3, b3) == NULL, "cannot be broadcast");
    ZT_CHECK(zs_matmul(NULL, a) == NULL, "NULL input");
    zs_tensor *r[] = {a, b, s, d, v, b3, a3};
    for (int i = 0; i < 7; i++)
        zs_release(r[i]);
    zt_section("matmul errors");
}

/* Shapes with a 0 (M, K, N or a batch): the product and both gradients
 * exist with the operands' shapes; a K = 0 product and gradients through
 * it are zeros (PyTorch gives the same). Backward once divided by zero in
 * the reduction and reshaped to [-1, 0]. */
static void test_empty(void)
{
    static const struct {
        int na, nb;
        int64_t a[3], b[3];
    } cases[] = {
        {3, 2, {2, 0, 3}, {3, 4}},  {3, 3, {0, 2, 3}, {0, 3, 4}},
        {2, 3, {2, 3}, {5, 3, 0}},  {3, 2, {2, 3, 0}, {0, 4}},
        {1, 1, {0}, {0}},           {1, 2, {0}, {0, 3}},
        {3, 3, {2, 1, 0}, {1, 0, 5}}, {2, 2, {2, 0}, {0, 3}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        zs_scope_push();
        zs_tensor *a = zs_ones(ZS_F32, cases[i].na, cases[i].a);
        zs_tensor *b = zs_ones(ZS_F32, cases[i].nb, cases[i].b);
        zs_set_requires_grad(a, true);
        zs_set_requires_grad(b, true);
        zs_tensor *c = zs_matmul(a, b);
        zs_tensor *s = zs_sum(c, 0, NULL, false);
        bool ok = s && zs_backward(s, NULL, false) == ZS_OK;
        zs_tensor *ga = zs_grad(a), *gb = zs_grad(b);
        ok = ok && ga && gb && zs_same_shape(ga, a) && zs_same_shape(gb, b);
        for (int64_t k = 0; ok && k < zs_numel(c); k++)
            ok = zs_get(c, k) == 0; /* every nonempty product here has K = 0 */
        for (int64_t k = 0; ok && k < zs_numel(ga); k++)
            ok = zs_get(ga, k) == 0;
        for (int64_t k = 0; ok && k < zs_numel(gb); k++)
            ok = zs_get(gb, k) == 0;
        ZT_CHECK(ok, "empty case %zu: product and gradients", i);
        zs_scope_pop(); /* releases a, b and their gradients' graph */
    }
    zt_section("matmul with a zero dimension, forward and backward");
}

int main(void)
{
    int64_t live0 = zt_live_bytes();
    test_numpy_cases(ZS_F64);
    test_numpy_cases(ZS_F32);
    test_transposes(ZS_F64);
    test_transposes(ZS_F32);
    test_large_f32();
    test_gradients();
    test_errors();
    test_empty();
    ZT_CHECK(zt_live_bytes() == live0, "live bytes %lld -> %lld",
             (long long)live0, (long long)zt_live_bytes());
    return zt_done();
}
