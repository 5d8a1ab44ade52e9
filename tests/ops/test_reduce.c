/*
 * test_reduce.c - zs_sum, zs_mean, zs_var, zs_max, zs_argmax against a
 * float64 reference over many axis sets (single, non-adjacent, negative,
 * all, keepdim), contiguous, strided and transposed inputs, the [R, K]
 * leading-axis layout, sizes above 1M elements (threaded row, part and
 * strip paths, with 3 pool threads), ties and NaN, the descriptor
 * max_backward run directly (strided inputs with ties over non-adjacent
 * axes, its layout and errors), gradient checks in f64 and error paths.
 *
 * Tolerances (relative to max(1, |ref|)): f32 sums and variances
 * accumulate in double after float lanes of at most 256 terms, so 1e-5;
 * f64 1e-12; max and argmax are exact.
 */
#include <stdlib.h>

#include "ops/op.h"
#include "testutil.h"

typedef enum kind { SUM, MEAN, VAR, MAX, ARGMAX } kind;
static const char *kind_name[] = {"sum", "mean", "var", "max", "argmax"};

static double tol_of(zs_dtype dt, kind k)
{
    if (k == MAX || k == ARGMAX)
        return 0;
    return dt == ZS_F32 ? 1e-5 : 1e-12;
}

/* ---- reference --------------------------------------------------------- */

/* Reduces x over the dims in mask (float64): out[j] for each kept index j
 * in row-major order; returns the number of outputs. ARGMAX expects one
 * reduced dim and gives the first index of the maximum (NaN wins). */
static int64_t ref_reduce(const zs_tensor *x, const bool *mask, kind k,
                          int corr, double *out)
{
    int nd = x->ndim;
    int64_t n = zs_numel(x), nout = 1, R = 1;
    for (int d = 0; d < nd; d++) {
        if (mask[d])
            R *= x->shape[d];
        else
            nout *= x->shape[d];
    }
    double *v = zt_values(x);
    double *acc = calloc((size_t)nout, sizeof *acc);
    double *best = malloc((size_t)nout * sizeof *best);
    int64_t *arg = calloc((size_t)nout, sizeof *arg);
    bool *seen = calloc((size_t)nout, sizeof *seen);
    for (int pass = 0; pass < (k == VAR ? 2 : 1); pass++) {
        for (int64_t i = 0; i < n; i++) {
            int64_t rem = i, oi = 0, ostride = 1, ri = 0, rstride = 1;
            for (int d = nd - 1; d >= 0; d--) {
                int64_t c = rem % x->shape[d];
                rem /= x->shape[d];
                if (mask[d]) {
                    ri += c * rstride;
                    rstride *= x->shape[d];
                } else {
                    oi += c * ostride;
                    ostride *= x->shape[d];
                }
            }
            double val = v[i];
            if (k == VAR && pass == 1) {
                double dv = val - acc[oi] / (double)R;
                best[oi] += dv * dv;
            } else if (k == MAX || k == ARGMAX) {
                bool better = !seen[oi] || (isnan(val) && !isnan(best[oi])) ||
                              (!isnan(best[oi]) && val > best[oi]);
                if (better) {
                    best[oi] = val;
                    arg[oi] = ri;
                }
                seen[oi] = true;
            } else {
                acc[oi] += val;
                if (!seen[oi])
                    best[oi] = 0;
                seen[oi] = true;
            }
        }
    }
    for (int64_t j = 0; j < nout; j++) {
        switch (k) {
        case SUM: out[j] = acc[j]; break;
        case MEAN: out[j] = acc[j] / (double)R; break;
        case VAR: out[j] = best[j] / (double)(R > corr ? R - corr : 0); break;
        case MAX: out[j] = best[j]; break;
        case ARGMAX: out[j] = (double)arg[j]; break;
        }
    }
    free(v);
    free(acc);
    free(best);
    free(arg);
    free(seen);
    return nout;
}

/* ---- forward against the reference --------------------------------------- */

static zs_tensor *run(kind k, zs_tensor *x, int naxes, const int *axes,
                      bool keepdim, int corr)
{
    switch (k) {
    case SUM: return zs_sum(x, naxes, axes, keepdim);
    case MEAN: return zs_mean(x, naxes, axes, keepdim);
    case VAR: return zs_var(x, naxes, axes, corr, keepdim);
    case MAX: return zs_max(x, naxes, axes, keepdim);
    case ARGMAX: return zs_argmax(x, axes[0], keepdim);
    }
    return NULL;
}

/* Checks one reduction: shape (with keepdim) and values. */
static void check_one(kind k, zs_tensor *x, int naxes, const int *axes,
                      bool keepdim, int corr, const char *what)
{
    bool mask[ZS_MAX_DIMS] = {false};
    for (int d = 0; d < x->ndim; d++)
        mask[d] = naxes == 0;
    for (int i = 0; i < naxes; i++)
        mask[axes[i] < 0 ? axes[i] + x->ndim : axes[i]] = true;
    int64_t want[ZS_MAX_DIMS];
    int wnd = 0;
    for (int d = 0; d < x->ndim; d++)
        if (!mask[d] || keepdim)
            want[wnd++] = mask[d] ? 1 : x->shape[d];
    double *ref = malloc((size_t)(zs_numel(x) + 1) * sizeof *ref);
    int64_t nout = ref_reduce(x, mask, k, corr, ref);
    zs_tensor *y = run(k, x, naxes, axes, keepdim, corr);
    bool shape_ok = y && y->ndim == wnd;
    for (int d = 0; shape_ok && d < wnd; d++)
        shape_ok = y->shape[d] == want[d];
    double err = shape_ok ? zt_max_err(y, ref, nout) : INFINITY;
    char sx[96];
    ZT_CHECK(shape_ok && err <= tol_of(x->dtype, k) &&
                 (k != ARGMAX || y->dtype == ZS_I64),
             "%s %s %s x%s naxes %d axis0 %d keepdim %d: err %g", kind_name[k],
             what, zs_dtype_name(x->dtype), zs_shape_str(x, sx, sizeof sx),
             naxes, naxes ? axes[0] : 0, keepdim, err);
    free(ref);
    zs_release(y);
}

typedef struct axes_case {
    int nd;
    int64_t shape[4];
    int naxes;
    int axes[4];
} axes_case;

static const axes_case CASES[] = {
    {2, {7, 13}, 0, {0}},         {2, {7, 13}, 1, {1}},
    {2, {7, 13}, 1, {0}},         {2, {7, 13}, 1, {-2}},
    {2, {7, 13}, 2, {1, 0}},      {3, {3, 5, 7}, 2, {0, 2}},
    {3, {3, 5, 7}, 2, {-1, 0}},   {3, {3, 5, 7}, 1, {1}},
    {3, {3, 5, 7}, 2, {1, 2}},    {3, {3, 5, 7}, 2, {0, 1}},
    {4, {2, 3, 4, 5}, 2, {1, 3}}, {4, {2, 3, 4, 5}, 3, {0, 2, 3}},
    {4, {2, 3, 4, 5}, 1, {-2}},   {2, {300, 7}, 1, {0}},
    {3, {4, 9, 600}, 1, {1}},     {1, {1}, 1, {0}},
    {1, {1000}, 0, {0}},          {3, {5, 1, 6}, 1, {1}},
};

/* layout: 0 contiguous, 1 strided view, 2 transposed (dims 0 and last
 * swapped on a contiguous buffer of the swapped shape). */
static zs_tensor *make_input(zs_dtype dt, const axes_case *c, int layout,
                             uint64_t seed)
{
    if (layout == 1)
        return zt_rand_strided(dt, c->nd, c->shape, seed);
    if (layout == 0 || c->nd < 2)
        return zt_rand(dt, c->nd, c->shape, seed);
    int64_t sw[4];
    for (int d = 0; d < c->nd; d++)
        sw[d] = c->shape[d];
    sw[0] = c->shape[c->nd - 1];
    sw[c->nd - 1] = c->shape[0];
    zs_tensor *b = zt_rand(dt, c->nd, sw, seed);
    zs_tensor *t = zs_transpose(b, 0, c->nd - 1);
    zs_release(b);
    return t;
}

static void test_forward(void)
{
    static const char *lname[] = {"contiguous", "strided", "transposed"};
    uint64_t seed = 1;
    for (int dti = 0; dti < 2; dti++) {
        zs_dtype dt = dti ? ZS_F64 : ZS_F32;
        for (size_t ci = 0; ci < sizeof CASES / sizeof *CASES; ci++) {
            const axes_case *c = &CASES[ci];
            for (int layout = 0; layout < 3; layout++) {
                zs_tensor *x = make_input(dt, c, layout, seed++);
                for (int keep = 0; keep < 2; keep++) {
                    for (kind k = SUM; k <= MAX; k++)
                        check_one(k, x, c->naxes, c->axes, keep, 1,
                                  lname[layout]);
                    check_one(VAR, x, c->naxes, c->axes, keep, 0,
                              lname[layout]);
                    if (c->naxes == 1)
                        check_one(ARGMAX, x, 1, c->axes, keep, 0,
                                  lname[layout]);
                }
                zs_release(x);
            }
        }
    }
    zt_section("forward: sum mean var max argmax, axis sets x layouts");
}

/* Sizes above 1M: one long row (R split in parts), few long rows, many
 * rows, and the strip path; with 3 threads so parts are uneven. */
static void test_large(void)
{
    int saved = zs_num_threads();
    zs_set_num_threads(3);
    static const axes_case big[] = {
        {1, {(1 << 21) + 3}, 0, {0}},
        {2, {2, 700001}, 1, {1}},
        {2, {1100, 1031}, 1, {1}},
        {2, {2000, 600}, 1, {0}},
        {3, {3, 1024, 401}, 2, {0, 2}},
    };
    uint64_t seed = 500;
    for (size_t ci = 0; ci < sizeof big / sizeof *big; ci++) {
        zs_tensor *x = zt_rand(ZS_F32, big[ci].nd, big[ci].shape, seed++);
        for (kind k = SUM; k <= MAX; k++)
            check_one(k, x, big[ci].naxes, big[ci].axes, false, 1, "large");
        if (big[ci].naxes <= 1) {
            int ax = big[ci].naxes ? big[ci].axes[0] : 0;
            check_one(ARGMAX, x, 1, &ax, false, 0, "large");
        }
        zs_release(x);
    }
    zs_set_num_threads(saved);
    zt_section("large inputs (>1M elements, 3 threads)");
}

/* ---- ties, NaN, special values ------------------------------------------- */

static void test_ties_nan(void)
{
    double v[] = {1, 3, 3, 2, -5, -5, -7, -5};
    zs_tensor *x = zs_from_data(ZS_F64, ZS_SHAPE(2, 4), v);
    zs_set_requires_grad(x, true);
    zs_tensor *am = zs_argmax(x, 1, false);
    ZT_CHECK(am && zs_get(am, 0) == 1 && zs_get(am, 1) == 0,
             "argmax takes the first maximum");
    zs_tensor *m = zs_max(x, 1, (int[]){1}, false);
    zs_tensor *s = zs_sum(m, 0, NULL, false);
    ZT_CHECK(zs_backward(s, NULL, false) == ZS_OK, "backward");
    double want[] = {0, 0.5, 0.5, 0, 1.0 / 3, 1.0 / 3, 0, 1.0 / 3};
    ZT_CHECK(zt_max_err(zs_grad(x), want, 8) <= 1e-15,
             "max gradient is split equally among ties");
    zs_release(am);
    zs_release(m);
    zs_release(s);
    zs_release(x);
    /* ties along a leading axis (strip path) */
    float w[] = {2, 1, 2, 4, 4, 0};
    zs_tensor *y = zs_from_data(ZS_F32, ZS_SHAPE(3, 2), w);
    zs_tensor *ay = zs_argmax(y, 0, true);
    ZT_CHECK(ay && ay->ndim == 2 && zs_get(ay, 0) == 2 && zs_get(ay, 1) == 1,
             "argmax dim 0 with ties");
    zs_release(ay);
    zs_release(y);
    /* NaN is the maximum, first NaN wins */
    float u[] = {1, NAN, 5, NAN, 9, -INFINITY};
    for (int64_t len = 2; len <= 6; len += 4) {
        zs_tensor *z = zs_from_data(ZS_F32, 1, &len, u);
        zs_tensor *mz = zs_max(z, 0, NULL, false);
        zs_tensor *az = zs_argmax(z, 0, false);
        ZT_CHECK(mz && isnan(zs_item(mz)) && az && zs_item(az) == 1,
                 "NaN max and argmax (len %lld)", (long long)len);
        zs_release(mz);
        zs_release(az);
        zs_release(z);
    }
    /* -inf only, and 0-d input */
    zs_tensor *ni = zs_full(ZS_F32, ZS_SHAPE(3), -INFINITY);
    zs_tensor *mi = zs_max(ni, 0, NULL, false);
    ZT_CHECK(mi && isinf(zs_item(mi)) && zs_item(mi) < 0, "max of -inf");
    zs_release(mi);
    zs_release(ni);
    zs_tensor *sc = zs_scalar(ZS_F64, 4.5);
    zs_tensor *ms = zs_max(sc, 0, NULL, false), *as = zs_argmax(sc, 0, false);
    zs_tensor *vs = zs_var(sc, 0, NULL, 0, false);
    ZT_CHECK(ms && zs_item(ms) == 4.5 && as && zs_item(as) == 0 && vs &&
                 zs_item(vs) == 0, "0-d max/argmax/var");
    zs_release(ms);
    zs_release(as);
    zs_release(vs);
    zs_release(sc);
    /* var of one element with correction 1 is NaN (0/0), as in PyTorch */
    zs_tensor *one = zs_ones(ZS_F32, ZS_SHAPE(1, 4));
    zs_tensor *v1 = zs_var(one, 1, (int[]){0}, 1, false);
    ZT_CHECK(v1 && isnan(zs_get(v1, 0)), "var n - correction = 0 gives NaN");
    zs_release(v1);
    zs_release(one);
    zt_section("ties, NaN, -inf, 0-d");
}

/* The layout of max_attrs (src/ops/reduce_ext.c). */
typedef struct max_attrs {
    int64_t mask;
    bool keepdim;
} max_attrs;

/* max_backward called directly, as a backward rule on any device does:
 * x [4, 5, 6] strided with ties, axes {0, 2} (not one block: the result
 * is in the layout [5, 4, 6], kept dim first), y and a strided g, against
 * g / (number of ties) where x == y. */
static void test_max_backward_descriptor(void)
{
    zsi_opdef *def = zsi_opdef_find("max_backward");
    zsi_opdef *fw = zsi_opdef_find("max");
    ZT_CHECK(def && fw && fw->bw_ops && fw->bw_ops[0] == def && !fw->bw_ops[1] &&
                 !def->op.backward, "max's bw_ops");
    if (!def)
        return;
    zs_tensor *x0 = zt_rand(ZS_F64, ZS_SHAPE(4, 5, 6), 950);
    double *xv = zs_data(x0);
    for (int64_t i = 0; i < 120; i += 7)
        xv[i] = 0.995; /* ties at the maximum in most kept columns */
    zs_tensor *xt = zs_transpose(x0, 0, 2), *xc = zs_contiguous(xt);
    zs_tensor *x = zs_transpose(xc, 0, 2); /* strided, x0's values */
    zs_tensor *y = zs_max(x, 2, (int[]){0, 2}, true);
    zs_tensor *g = zt_rand_strided(ZS_F64, ZS_SHAPE(5, 1), 951);
    double ref[120];
    for (int64_t j = 0; j < 5; j++) {
        int ties = 0;
        for (int64_t i = 0; i < 4; i++)
            for (int64_t k = 0; k < 6; k++)
                ties += xv[(i * 5 + j) * 6 + k] == zs_get(y, j);
        for (int64_t i = 0; i < 4; i++)
            for (int64_t k = 0; k < 6; k++) {
                int64_t f = (i * 5 + j) * 6 + k;
                ref[(j * 4 + i) * 6 + k] = xv[f] == zs_get(y, j)
                                               ? zs_get(g, j) / ties : 0;
            }
    }
    max_attrs at = {.mask = 5, .keepdim = true};
    zs_tensor *gx = zsi_run(def, 3, (zs_tensor *[]){x, y, g}, &at);
    double err = gx ? zt_max_err(gx, ref, 120) : 1;
    ZT_CHECK(!zs_is_contiguous(x) && zt_shape_is(gx, ZS_SHAPE(5, 4, 6)) &&
                 err <= 1e-15, "strided x with ties over axes {0, 2}: err %g",
             err);
    zs_tensor *g4 = zt_rand(ZS_F64, ZS_SHAPE(4), 952);
    ZT_EXPECT_ERROR(!zsi_run(def, 3, (zs_tensor *[]){x, y, g4}, &at),
                    "max_backward: x [4, 5, 6], y [1, 5, 1], g [4]: expected "
                    "y and g of 5 elements");
    zs_tensor *all[] = {x0, xt, xc, x, y, g, gx, g4};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        zs_release(all[i]);
    zt_section("max_backward run directly: strided x with ties, layout, errors");
}

/* ---- gradients --------------------------------------------------------- */

typedef struct red_args {
    kind k;
    int naxes;
    int axes[4];
    bool keepdim;
    int corr;
} red_args;

static zs_tensor *red_fn(void *ctx, zs_tensor **in)
{
    red_args *a = ctx;
    return run(a->k, in[0], a->naxes, a->axes, a->keepdim, a->corr);
}

static void test_grad(void)
{
    static const red_args args[] = {
        {SUM, 2, {0, 2}, false, 0}, {SUM, 0, {0}, false, 0},
        {SUM, 1, {-1}, true, 0},    {MEAN, 2, {-1, 0}, true, 0},
        {MEAN, 1, {1}, false, 0},   {MEAN, 0, {0}, true, 0},
        {VAR, 1, {1}, false, 1},    {VAR, 2, {0, 2}, true, 0},
        {VAR, 0, {0}, false, 1},    {VAR, 1, {-1}, false, 2},
        {MAX, 2, {0, 2}, false, 0}, {MAX, 1, {1}, true, 0},
        {MAX, 0, {0}, false, 0},    {MAX, 1, {0}, false, 0},
    };
    uint64_t seed = 900;
    for (size_t i = 0; i < sizeof args / sizeof *args; i++) {
        for (int strided = 0; strided < 2; strided++) {
            zs_tensor *x = strided
                               ? zt_rand_strided(ZS_F64, ZS_SHAPE(3, 4, 5), seed)
                               : zt_rand(ZS_F64, ZS_SHAPE(3, 4, 5), seed);
            seed++;
            zs_set_requires_grad(x, true);
            char name[64];
            snprintf(name, sizeof name, "%s case %zu%s", kind_name[args[i].k],
                     i, strided ? " strided" : "");
            ZT_GRADCHECK(name, red_fn, (void *)&args[i], 1, &x);
            zs_release(x);
        }
    }
    zt_section("gradcheck sum mean var max (f64)");
}

/* ---- errors ------------------------------------------------------------ */

static void test_errors(void)
{
    zs_tensor *x = zt_rand(ZS_F32, ZS_SHAPE(3, 4), 7);
    ZT_EXPECT_ERROR(zs_sum(x, 2, (int[]){1, -1}, false) == NULL, "repeated");
    ZT_EXPECT_ERROR(zs_mean(x, 1, (int[]){2}, false) == NULL, "out of range");
    ZT_EXPECT_ERROR(zs_max(x, 2, (int[]){0, 0}, false) == NULL, "repeated");
    ZT_EXPECT_ERROR(zs_max(x, 1, (int[]){-3}, false) == NULL, "out of range");
    ZT_EXPECT_ERROR(zs_var(x, 1, (int[]){5}, 1, false) == NULL, "out of range");
    ZT_EXPECT_ERROR(zs_var(x, 2, (int[]){0, -2}, 1, false) == NULL, "repeated");
    ZT_EXPECT_ERROR(zs_var(x, 0, NULL, -1, false) == NULL, "correction");
    ZT_EXPECT_ERROR(zs_argmax(x, 2, false) == NULL, "out of range");
    zs_tensor *i = zs_zeros(ZS_I32, ZS_SHAPE(3, 4));
    ZT_EXPECT_ERROR(zs_sum(i, 0, NULL, false) == NULL, "dtype i32");
    ZT_EXPECT_ERROR(zs_mean(i, 0, NULL, false) == NULL, "dtype i32");
    ZT_EXPECT_ERROR(zs_var(i, 0, NULL, 1, false) == NULL, "dtype i32");
    ZT_EXPECT_ERROR(zs_max(i, 0, NULL, false) == NULL, "dtype i32");
    ZT_EXPECT_ERROR(zs_argmax(i, 0, false) == NULL, "dtype i32");
    zs_tensor *e = zs_zeros(ZS_F32, ZS_SHAPE(3, 0));
    ZT_EXPECT_ERROR(zs_max(e, 1, (int[]){1}, false) == NULL, "zero-size");
    ZT_EXPECT_ERROR(zs_argmax(e, 1, false) == NULL, "zero-size");
    ZT_CHECK(zs_max(NULL, 0, NULL, false) == NULL && zs_var(NULL, 0, NULL, 1,
             false) == NULL && zs_argmax(NULL, 0, false) == NULL, "NULL in");
    zs_release(e);
    zs_release(i);
    zs_release(x);
    zt_section("errors");
}

/* Output shapes on random shapes (0 to 5 dims, sizes 1 to 4), random axis
 * sets and keepdim against the plain rule: reduced dims dropped, or kept
 * as 1 with keepdim. */
static void test_random_shapes(void)
{
    uint64_t seed = 12345, r = seed;
    for (int it = 0; it < 200; it++) {
        r = r * 6364136223846793005ULL + 1442695040888963407ULL;
        int nd = (int)(r >> 33) % 6;
        int64_t shape[5];
        int axes[5] = {0}, naxes = 0;
        for (int d = 0; d < nd; d++) {
            r = r * 6364136223846793005ULL + 1442695040888963407ULL;
            shape[d] = 1 + (int64_t)((r >> 35) % 4);
            if ((r >> 20) & 1)
                axes[naxes++] = (r >> 21) & 1 ? d - nd : d;
        }
        bool keep = (r >> 40) & 1, mask[5] = {false};
        for (int d = 0; d < nd; d++)
            mask[d] = naxes == 0;
        for (int i = 0; i < naxes; i++)
            mask[axes[i] < 0 ? axes[i] + nd : axes[i]] = true;
        zs_tensor *x = zt_rand(ZS_F32, nd, shape, seed + (uint64_t)it);
        for (kind k = SUM; k <= ARGMAX; k++) {
            bool m1[5] = {false};
            int ax0 = axes[0]; /* argmax: axes[0], or 0 */
            if (k == ARGMAX && nd > 0)
                m1[ax0 < 0 ? ax0 + nd : ax0] = true;
            const bool *m = k == ARGMAX ? m1 : mask;
            int64_t want[5];
            int wnd = 0;
            for (int d = 0; d < nd; d++)
                if (!m[d] || keep)
                    want[wnd++] = m[d] ? 1 : shape[d];
            zs_tensor *y = run(k, x, naxes, axes, keep, 0);
            bool ok = y && y->ndim == wnd &&
                      y->dtype == (k == ARGMAX ? ZS_I64 : ZS_F32);
            for (int d = 0; ok && d < wnd; d++)
                ok = y->shape[d] == want[d];
            char sx[96];
            ZT_CHECK(ok, "%s shape of x%s naxes %d keepdim %d (seed %llu, "
                     "case %d)", kind_name[k], zs_shape_str(x, sx, sizeof sx),
                     naxes, keep, (unsigned long long)seed, it);
            zs_release(y);
        }
        zs_release(x);
    }
    zt_section("shapes: sum mean var max argmax on 200 random shapes");
}

int main(void)
{
    test_forward();
    test_random_shapes();
    test_large();
    test_ties_nan();
    test_max_backward_descriptor();
    test_grad();
    test_errors();
    ZT_CHECK(zs_autograd_live_nodes() == 0, "no live nodes");
    return zt_done();
}
