/*
 * test_lowp_ops.c - the bf16 and f16 kernels of layer_norm, softmax,
 * log_softmax, cross_entropy, mse_loss, sum, mean, embedding, dropout,
 * gather_backward and index_select_backward (and the bulk
 * conversions of kernels/cpu/lowp.h they use), forward and backward,
 * against float64 references computed from the same rounded inputs (the
 * values the 16-bit tensors hold). attention and conv2d have their
 * bf16/f16 cases in test_attention.c and test_conv.c.
 *
 * Tolerances: the kernels compute in f32 (errors ~1e-6 here) and round
 * each result once, by at most 2^-8 (bf16) or 2^-11 (f16) of its
 * magnitude; errors are measured as max |got - ref| / max |ref| over a
 * result, against twice that: 2^-7 and 2^-10. Backward references read
 * what the backward kernels read (softmax: the forward's rounded y).
 * f32 parameter gradients of the mixed layer_norm are only summed in f32:
 * 1e-4. Odd sizes (C = 37, 33, ...), strided views, non-last softmax
 * dims, ignored cross-entropy rows, keepdim reductions.
 */
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/lowp.h"
#include "testutil.h"

static const zs_dtype LOWP[2] = {ZS_BF16, ZS_F16};

static double tol_of(zs_dtype dt) { return dt == ZS_BF16 ? 0x1p-7 : 0x1p-10; }

/* max |t - ref| / max |ref| (INFINITY for a missing or mis-sized t). */
static double rel_err(const zs_tensor *t, const double *ref, int64_t n)
{
    if (!t || zs_numel(t) != n)
        return INFINITY;
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        num = fmax(num, fabs(zs_get(t, i) - ref[i]));
        den = fmax(den, fabs(ref[i]));
    }
    return den > 0 ? num / den : num;
}

static double grad_err(zs_tensor *t, const double *ref, zs_dtype want)
{
    zs_tensor *g = zs_grad(t);
    return g && g->dtype == want ? rel_err(g, ref, zs_numel(t)) : INFINITY;
}

/* Uniform [-scale, scale) values of dtype dt as a strided view (every
 * other element of a wider buffer); the scaling happens in f32 (the
 * elementwise operators have no f16 kernels). */
static zs_tensor *rand_view(zs_dtype dt, int ndim, const int64_t *shape,
                           double scale, uint64_t seed)
{
    zs_tensor *f = zs_uniform(ZS_F32, ndim, shape, -scale, scale, seed);
    zs_tensor *src = zs_to_dtype(f, dt);
    int64_t wide[ZS_MAX_DIMS];
    memcpy(wide, shape, (size_t)ndim * sizeof *wide);
    wide[ndim - 1] *= 2;
    zs_tensor *buf = zs_zeros(dt, ndim, wide);
    zs_tensor *view = zs_slice(buf, ndim - 1, 0, wide[ndim - 1], 2);
    zs_copy_(view, src);
    zs_release(buf);
    zs_release(src);
    zs_release(f);
    return view;
}

/* ---- conversions ------------------------------------------------------- */

/* zsk_widen16 / zsk_narrow16 give the bits of the scalar conversions of
 * core on every value class (normal, subnormal, overflow, ties, Inf; a NaN
 * gives a quiet NaN of its sign, whose f16 payload F16C keeps), on the
 * F16C and the portable paths (the test runs again under
 * ZS_CPU_ISA=portable). */
static bool same16(zs_dtype dt, uint16_t a, uint16_t b)
{
    float fa = zsk_ld16(dt, a), fb = zsk_ld16(dt, b);
    if (isnan(fa) || isnan(fb))
        return isnan(fa) && isnan(fb) && (a >> 15) == (b >> 15) &&
               (a & (dt == ZS_BF16 ? 0x40 : 0x200));
    return a == b;
}

static void test_convert(void)
{
    enum { N = 4099 };
    float *src = malloc(N * sizeof *src), *back = malloc(N * sizeof *back);
    uint16_t *h = malloc(N * sizeof *h);
    uint64_t s = 7;
    for (int i = 0; i < N; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        uint32_t u = (uint32_t)(s >> 32);
        memcpy(&src[i], &u, 4); /* any bit pattern: NaN, Inf, subnormal */
    }
    src[0] = 65520.0f, src[1] = 1.0f + 0x1p-11f, src[2] = 0x1p-25f;
    src[3] = -0.0f, src[4] = 1.0f + 0x1p-8f, src[5] = 3.0f * 0x1p-9f;
    for (int k = 0; k < 2; k++) {
        zs_dtype dt = LOWP[k];
        zsk_narrow16(dt, src, h, N);
        int bad = 0;
        for (int i = 0; i < N; i++)
            bad += !same16(dt, h[i], zsk_st16(dt, src[i]));
        zsk_widen16(dt, h, back, N);
        for (int i = 0; i < N; i++) {
            float r = zsk_ld16(dt, h[i]);
            bad += memcmp(&back[i], &r, 4) != 0;
        }
        ZT_CHECK(bad == 0, "%s bulk conversions differ from the scalar ones "
                 "in %d places", zs_dtype_name(dt), bad);
    }
    free(src);
    free(back);
    free(h);
    zt_section("bulk bf16/f16 conversions = core's scalar ones");
}

/* ---- layer norm -------------------------------------------------------- */

/* y, gx, gw, gb of layer norm over rows of C (w NULL: 1, b NULL: 0). */
static void ref_layer_norm(const double *x, const double *w, const double *b,
                           const double *g, int64_t R, int64_t C, double *y,
                           double *gx, double *gw, double *gb)
{
    for (int64_t j = 0; j < C; j++)
        gw[j] = gb[j] = 0;
    for (int64_t r = 0; r < R; r++) {
        const double *xr = x + r * C, *gr = g + r * C;
        double m = 0, v = 0, a = 0, bb = 0;
        for (int64_t j = 0; j < C; j++)
            m += xr[j] / (double)C;
        for (int64_t j = 0; j < C; j++)
            v += (xr[j] - m) * (xr[j] - m) / (double)C;
        double rs = 1 / sqrt(v + 1e-5);
        for (int64_t j = 0; j < C; j++) {
            double xh = (xr[j] - m) * rs, d = gr[j] * (w ? w[j] : 1);
            y[r * C + j] = xh * (w ? w[j] : 1) + (b ? b[j] : 0);
            a += d;
            bb += d * xh;
            gw[j] += gr[j] * xh;
            gb[j] += gr[j];
        }
        for (int64_t j = 0; j < C; j++) {
            double xh = (xr[j] - m) * rs, d = gr[j] * (w ? w[j] : 1);
            gx[r * C + j] = rs * (d - a / (double)C - xh * bb / (double)C);
        }
    }
}

/* x of dt (strided), weight and bias of pdt (each present or not). */
static void check_layer_norm(zs_dtype dt, zs_dtype pdt, bool hw, bool hb,
                             uint64_t seed)
{
    int64_t R = 3 * 5, C = 37;
    zs_tensor *x = rand_view(dt, ZS_SHAPE(3, 5, C), 2.0, seed);
    zs_tensor *w = hw ? zs_uniform(pdt, 1, &C, 0.5, 1.5, seed + 1) : NULL;
    zs_tensor *b = hb ? zt_rand(pdt, 1, &C, seed + 2) : NULL;
    zs_tensor *g = zt_rand(dt, ZS_SHAPE(3, 5, C), seed + 3);
    zs_tensor *ps[] = {x, w, b};
    for (int i = 0; i < 3; i++)
        if (ps[i])
            zs_set_requires_grad(ps[i], true);
    zs_tensor *y = zs_layer_norm(x, w, b, 1e-5);
    bool ran = y && y->dtype == dt && zs_backward(y, g, false) == ZS_OK;
    double *xv = zt_values(x), *gv = zt_values(g);
    double *wv = w ? zt_values(w) : NULL, *bv = b ? zt_values(b) : NULL;
    double *ry = malloc((size_t)(R * C) * sizeof *ry);
    double *rgx = malloc((size_t)(R * C) * sizeof *rgx), rgw[37], rgb[37];
    ref_layer_norm(xv, wv, bv, gv, R, C, ry, rgx, rgw, rgb);
    double tol = tol_of(dt), tp = pdt == ZS_F32 ? 1e-4 : tol;
    double ey = rel_err(y, ry, R * C), ex = grad_err(x, rgx, dt);
    double ew = w ? grad_err(w, rgw, pdt) : 0, eb = b ? grad_err(b, rgb, pdt) : 0;
    ZT_CHECK(ran && ey <= tol && ex <= tol && ew <= tp && eb <= tp,
             "layer_norm x %s, params %s (w %d b %d): y %g gx %g gw %g gb %g "
             "(seed %llu)", zs_dtype_name(dt), zs_dtype_name(pdt), hw, hb, ey,
             ex, ew, eb, (unsigned long long)seed);
    free(xv), free(gv), free(wv), free(bv), free(ry), free(rgx);
    zs_tensor *all[] = {x, w, b, g, y};
    for (int i = 0; i < 5; i++)
        zs_release(all[i]);
}

static void test_layer_norm(void)
{
    uint64_t seed = 100;
    for (int k = 0; k < 2; k++) {
        zs_dtype dt = LOWP[k];
        check_layer_norm(dt, dt, true, true, seed++);
        check_layer_norm(dt, ZS_F32, true, true, seed++); /* torch's mixed form */
        check_layer_norm(dt, ZS_F32, false, true, seed++);
        check_layer_norm(dt, dt, true, false, seed++);
        check_layer_norm(dt, dt, false, false, seed++);
    }
    zt_section("layer_norm bf16/f16 (params of x's dtype or f32) vs float64");
}

/* ---- softmax, log_softmax ---------------------------------------------- */

/* softmax or log_softmax of x over dim d of [A, B, C] (d = 1 or 2) and,
 * from the rounded result y and g, the input gradient. */
static void ref_softmax(const double *x, const double *y, const double *g,
                        const int64_t *sh, int d, bool lg, double *out,
                        double *gx)
{
    int64_t O = d == 1 ? sh[0] : sh[0] * sh[1], R = sh[d];
    int64_t K = d == 1 ? sh[2] : 1;
    for (int64_t o = 0; o < O; o++)
        for (int64_t k = 0; k < K; k++) {
            int64_t base = o * R * K + k;
            double m = -INFINITY, s = 0, c = 0;
            for (int64_t r = 0; r < R; r++)
                m = fmax(m, x[base + r * K]);
            for (int64_t r = 0; r < R; r++)
                s += exp(x[base + r * K] - m);
            for (int64_t r = 0; r < R; r++) {
                int64_t i = base + r * K;
                out[i] = lg ? x[i] - m - log(s) : exp(x[i] - m) / s;
                c += lg ? g[i] : g[i] * y[i];
            }
            for (int64_t r = 0; r < R; r++) {
                int64_t i = base + r * K;
                gx[i] = lg ? g[i] - exp(y[i]) * c : y[i] * (g[i] - c);
            }
        }
}

static void test_softmax(void)
{
    int64_t sh[3] = {4, 7, 33}, n = 4 * 7 * 33;
    uint64_t seed = 200;
    for (int k = 0; k < 2; k++)
        for (int lg = 0; lg < 2; lg++)
            for (int d = 1; d <= 2; d++, seed++) {
                zs_dtype dt = LOWP[k];
                zs_tensor *xs = rand_view(dt, 3, sh, 4.0, seed);
                zs_tensor *g = zt_rand(dt, 3, sh, seed + 50);
                zs_set_requires_grad(xs, true);
                zs_tensor *y = lg ? zs_log_softmax(xs, d) : zs_softmax(xs, d);
                bool ran = y && y->dtype == dt && zs_backward(y, g, false) == ZS_OK;
                double *xv = zt_values(xs), *yv = y ? zt_values(y) : NULL;
                double *gv = zt_values(g), *ry = malloc((size_t)n * sizeof *ry);
                double *rg = malloc((size_t)n * sizeof *rg);
                if (yv)
                    ref_softmax(xv, yv, gv, sh, d, lg, ry, rg);
                double ey = yv ? rel_err(y, ry, n) : INFINITY;
                double eg = yv ? grad_err(xs, rg, dt) : INFINITY;
                ZT_CHECK(ran && ey <= tol_of(dt) && eg <= tol_of(dt),
                         "%s %s dim %d: y %g gx %g (seed %llu)",
                         lg ? "log_softmax" : "softmax", zs_dtype_name(dt), d,
                         ey, eg, (unsigned long long)seed);
                free(xv), free(yv), free(gv), free(ry), free(rg);
                zs_release(xs), zs_release(g), zs_release(y);
            }
    zt_section("softmax and log_softmax bf16/f16 (last and middle dim) vs float64");
}

/* ---- cross entropy ----------------------------------------------------- */

static void test_cross_entropy(void)
{
    int64_t N = 9, C = 37;
    uint64_t seed = 300;
    for (int k = 0; k < 2; k++, seed++) {
        zs_dtype dt = LOWP[k];
        zs_tensor *x = rand_view(dt, ZS_SHAPE(N, C), 3.0, seed);
        zs_tensor *t = zs_empty(ZS_I64, 1, &N);
        for (int64_t i = 0; i < N; i++)
            ((int64_t *)zs_data(t))[i] = i == 4 ? -100 : (i * 7 + 3) % C;
        zs_set_requires_grad(x, true);
        zs_tensor *loss = zs_cross_entropy(x, t, -100);
        bool ran = loss && loss->dtype == dt &&
                   zs_backward(loss, NULL, false) == ZS_OK;
        double *xv = zt_values(x), rl = 0, *rg = calloc((size_t)(N * C), sizeof *rg);
        int64_t cnt = N - 1;
        for (int64_t i = 0; i < N; i++) {
            int64_t ti = ((int64_t *)zs_data(t))[i];
            if (ti < 0)
                continue;
            double m = -INFINITY, s = 0;
            for (int64_t j = 0; j < C; j++)
                m = fmax(m, xv[i * C + j]);
            for (int64_t j = 0; j < C; j++)
                s += exp(xv[i * C + j] - m);
            rl += (m + log(s) - xv[i * C + ti]) / (double)cnt;
            for (int64_t j = 0; j < C; j++)
                rg[i * C + j] = (exp(xv[i * C + j] - m) / s - (j == ti)) / (double)cnt;
        }
        double el = loss ? fabs(zs_item(loss) - rl) / fabs(rl) : INFINITY;
        double eg = grad_err(x, rg, dt);
        ZT_CHECK(ran && el <= tol_of(dt) && eg <= tol_of(dt),
                 "cross_entropy %s: loss %g gx %g (seed %llu)", zs_dtype_name(dt),
                 el, eg, (unsigned long long)seed);
        free(xv), free(rg);
        zs_release(x), zs_release(t), zs_release(loss);
    }
    zt_section("cross_entropy bf16/f16 (ignored row) vs float64");
}

/* ---- mse, sum, mean ------------------------------------------------------ */

static void test_mse(void)
{
    for (int k = 0; k < 2; k++) {
        zs_dtype dt = LOWP[k];
        int64_t n = 13 * 17;
        zs_tensor *a = rand_view(dt, ZS_SHAPE(13, 17), 1.0, 400 + (uint64_t)k);
        zs_tensor *b = zt_rand(dt, ZS_SHAPE(13, 17), 410 + k);
        /* the gradient runs the elementwise operators sub, mul and
         * mul_scalar, which have bf16 kernels but no f16 ones yet */
        bool bw = dt == ZS_BF16;
        zs_set_requires_grad(a, bw);
        zs_tensor *l = zs_mse_loss(a, b);
        bool ran = l && l->dtype == dt && (!bw || zs_backward(l, NULL, false) == ZS_OK);
        double *av = zt_values(a), *bv = zt_values(b), rl = 0;
        double *rg = malloc((size_t)n * sizeof *rg);
        for (int64_t i = 0; i < n; i++) {
            rl += (av[i] - bv[i]) * (av[i] - bv[i]) / (double)n;
            rg[i] = 2 * (av[i] - bv[i]) / (double)n;
        }
        double el = l ? fabs(zs_item(l) - rl) / rl : INFINITY;
        /* the gradient: a few roundings (sub, mul, mul_scalar) */
        double eg = bw ? grad_err(a, rg, dt) : 0;
        ZT_CHECK(ran && el <= tol_of(dt) && eg <= 2 * tol_of(dt),
                 "mse_loss %s: loss %g ga %g", zs_dtype_name(dt), el, eg);
        free(av), free(bv), free(rg);
        zs_release(a), zs_release(b), zs_release(l);
    }
    zt_section("mse_loss bf16/f16 vs float64");
}

/* sum or mean of x [A, B, C] over the axes in mask, as a dense [A, B, C]
 * array with the reduced dims collapsed (ref indexed like the output). */
static void ref_reduce(const double *x, const int64_t *sh, int mask, bool mean,
                       double *out, int64_t *nout)
{
    int64_t os[3], R = 1;
    for (int d = 0; d < 3; d++) {
        os[d] = mask >> d & 1 ? 1 : sh[d];
        R *= mask >> d & 1 ? sh[d] : 1;
    }
    *nout = os[0] * os[1] * os[2];
    for (int64_t i = 0; i < *nout; i++)
        out[i] = 0;
    for (int64_t a = 0; a < sh[0]; a++)
        for (int64_t b = 0; b < sh[1]; b++)
            for (int64_t c = 0; c < sh[2]; c++) {
                int64_t oa = mask & 1 ? 0 : a, ob = mask & 2 ? 0 : b;
                int64_t oc = mask & 4 ? 0 : c;
                out[(oa * os[1] + ob) * os[2] + oc] +=
                    x[(a * sh[1] + b) * sh[2] + c] / (mean ? (double)R : 1);
            }
}

static void test_sum_mean(void)
{
    int64_t sh[3] = {5, 6, 300};
    static const int masks[] = {1, 2, 4, 5, 7, 6};
    for (int k = 0; k < 2; k++)
        for (size_t m = 0; m < sizeof masks / sizeof *masks; m++)
            for (int mean = 0; mean < 2; mean++) {
                zs_dtype dt = LOWP[k];
                uint64_t seed = 500 + 10 * m + (uint64_t)mean;
                zs_tensor *x = rand_view(dt, 3, sh, 1.0, seed);
                zs_set_requires_grad(x, true);
                int axes[3], na = 0;
                for (int d = 0; d < 3; d++)
                    if (masks[m] >> d & 1)
                        axes[na++] = d;
                bool keep = m % 2;
                zs_tensor *y = mean ? zs_mean(x, na, axes, keep)
                                    : zs_sum(x, na, axes, keep);
                double *xv = zt_values(x), *ref = malloc(9000 * sizeof *ref);
                int64_t no;
                ref_reduce(xv, sh, masks[m], mean, ref, &no);
                double e = y && y->dtype == dt ? rel_err(y, ref, no) : INFINITY;
                /* backward: the gradient of sum is g expanded (exact), of
                 * mean g / R (rounded once; mul_scalar, which has no f16
                 * kernel yet: bf16 only) */
                bool want_bw = !mean || dt == ZS_BF16;
                zs_tensor *g = y ? zs_ones(dt, y->ndim, y->shape) : NULL;
                bool bw = g && want_bw && zs_backward(y, g, false) == ZS_OK;
                double R = (double)(zs_numel(x) / (no ? no : 1));
                double *rg = malloc((size_t)zs_numel(x) * sizeof *rg);
                for (int64_t i = 0; i < zs_numel(x); i++)
                    rg[i] = mean ? 1 / R : 1;
                double eg = bw ? grad_err(x, rg, dt) : want_bw ? INFINITY : 0;
                ZT_CHECK(e <= tol_of(dt) && eg <= tol_of(dt),
                         "%s %s mask %d keepdim %d: err %g grad %g (seed %llu)",
                         mean ? "mean" : "sum", zs_dtype_name(dt), masks[m],
                         keep, e, eg, (unsigned long long)seed);
                free(xv), free(ref), free(rg);
                zs_release(x), zs_release(y), zs_release(g);
            }
    /* one long row (the blocked f32 lanes) and an empty mean */
    int64_t n = 100003;
    zs_tensor *x = zs_uniform(ZS_BF16, 1, &n, 0, 1, 7);
    zs_tensor *s = zs_sum(x, 0, NULL, false);
    double *xv = zt_values(x), r = 0;
    for (int64_t i = 0; i < n; i++)
        r += xv[i];
    ZT_CHECK(s && fabs(zs_item(s) - r) / r <= tol_of(ZS_BF16),
             "sum of %lld bf16 values: %g vs %g", (long long)n,
             s ? zs_item(s) : NAN, r);
    zs_tensor *e = zs_zeros(ZS_F16, ZS_SHAPE(0, 3));
    zs_tensor *me = zs_mean(e, 1, (int[]){0}, false);
    ZT_CHECK(me && me->dtype == ZS_F16 && zs_numel(me) == 3 && isnan(zs_get(me, 0)),
             "mean over an empty f16 dim is NaN");
    free(xv);
    zs_release(x), zs_release(s), zs_release(e), zs_release(me);
    zt_section("sum and mean bf16/f16 (axes, keepdim, strided) vs float64");
}

/* ---- embedding, dropout -------------------------------------------------- */

/* embedding of a bf16/f16 weight: rows copied exactly; the gradient of a
 * row picked several times is summed in f32 and rounded once. dropout:
 * the f32 mask (same seed) decides, y = x * 1/(1-p) rounded once; the
 * gradient g * mask / (1-p). */
static void test_embedding_dropout(void)
{
    int64_t V = 11, D = 37, n = 40;
    for (int k = 0; k < 2; k++) {
        zs_dtype dt = LOWP[k];
        zs_tensor *w = rand_view(dt, ZS_SHAPE(V, D), 1.0, 600 + (uint64_t)k);
        zs_tensor *idx = zs_empty(ZS_I32, ZS_SHAPE(4, 10));
        for (int64_t i = 0; i < n; i++)
            ((int32_t *)zs_data(idx))[i] = (int32_t)((i * 5 + 1) % (V - 1));
        zs_tensor *g = zt_rand(dt, ZS_SHAPE(4, 10, D), 610 + (uint64_t)k);
        zs_set_requires_grad(w, true);
        zs_tensor *y = zs_embedding(w, idx);
        bool ran = y && y->dtype == dt && zs_backward(y, g, false) == ZS_OK;
        double *wv = zt_values(w), *gv = zt_values(g);
        double *ry = malloc((size_t)(n * D) * sizeof *ry);
        double *rg = calloc((size_t)(V * D), sizeof *rg);
        for (int64_t i = 0; i < n; i++) {
            int64_t v = ((int32_t *)zs_data(idx))[i];
            for (int64_t d = 0; d < D; d++) {
                ry[i * D + d] = wv[v * D + d];
                rg[v * D + d] += gv[i * D + d];
            }
        }
        double ey = rel_err(y, ry, n * D), eg = grad_err(w, rg, dt);
        ZT_CHECK(ran && ey == 0 && eg <= tol_of(dt), "embedding %s: y %g gw %g",
                 zs_dtype_name(dt), ey, eg);
        free(wv), free(gv), free(ry), free(rg);
        zs_release(w), zs_release(idx), zs_release(g), zs_release(y);

        int64_t m = 1001;
        zs_tensor *xf = zs_uniform(ZS_F32, 1, &m, -1, 1, 620);
        zs_tensor *x = zs_to_dtype(xf, dt), *gd = zt_rand(dt, 1, &m, 621);
        zs_set_requires_grad(x, true);
        zs_manual_seed(5);
        zs_tensor *yd = zs_dropout(x, 0.3, true);
        zs_manual_seed(5);
        zs_tensor *y32 = zs_dropout(xf, 0.3, true); /* the same mask */
        ran = yd && yd->dtype == dt && zs_backward(yd, gd, false) == ZS_OK;
        double *y32v = y32 ? zt_values(y32) : NULL, *xv = zt_values(x);
        double *gdv = zt_values(gd), *r = malloc((size_t)m * sizeof *r);
        double *rgd = malloc((size_t)m * sizeof *rgd);
        for (int64_t i = 0; y32v && i < m; i++) {
            bool keep = y32v[i] != 0 || zs_get(xf, i) == 0;
            r[i] = keep ? xv[i] / 0.7 : 0;
            rgd[i] = keep ? gdv[i] / 0.7 : 0;
        }
        double e1 = y32v ? rel_err(yd, r, m) : INFINITY;
        double e2 = y32v ? grad_err(x, rgd, dt) : INFINITY;
        ZT_CHECK(ran && e1 <= tol_of(dt) && e2 <= tol_of(dt),
                 "dropout %s: y %g gx %g", zs_dtype_name(dt), e1, e2);
        free(y32v), free(xv), free(gdv), free(r), free(rgd);
        zs_tensor *all[] = {xf, x, gd, yd, y32};
        for (int i = 0; i < 5; i++)
            zs_release(all[i]);
    }
    zt_section("embedding and dropout bf16/f16 vs float64");
}

/* index_select and gather of bf16/f16 (copies) and their backward: the
 * scatter-add of repeated indices summed in f32, rounded once. */
static void test_index_backward(void)
{
    int64_t A = 6, B = 9, L = 14;
    for (int k = 0; k < 2; k++)
        for (int gather = 0; gather < 2; gather++) {
            zs_dtype dt = LOWP[k];
            zs_tensor *a = rand_view(dt, ZS_SHAPE(A, B), 1.0, 700 + (uint64_t)k);
            zs_tensor *idx = gather ? zs_empty(ZS_I64, ZS_SHAPE(A, L))
                                    : zs_empty(ZS_I64, ZS_SHAPE(L));
            for (int64_t i = 0; i < zs_numel(idx); i++)
                ((int64_t *)zs_data(idx))[i] = (i * 7 + 2) % 4; /* repeats */
            zs_set_requires_grad(a, true);
            zs_tensor *y = gather ? zs_gather(a, 1, idx) : zs_index_select(a, 1, idx);
            zs_tensor *g = y ? zt_rand(dt, y->ndim, y->shape, 710) : NULL;
            bool ran = g && zs_backward(y, g, false) == ZS_OK;
            double *gv = g ? zt_values(g) : NULL, *rg = calloc((size_t)(A * B), sizeof *rg);
            for (int64_t r = 0; gv && r < A; r++)
                for (int64_t l = 0; l < L; l++) {
                    int64_t j = ((int64_t *)zs_data(idx))[gather ? r * L + l : l];
                    rg[r * B + j] += gv[r * L + l];
                }
            double e = gv ? grad_err(a, rg, dt) : INFINITY;
            ZT_CHECK(ran && e <= tol_of(dt), "%s backward %s: %g",
                     gather ? "gather" : "index_select", zs_dtype_name(dt), e);
            free(gv), free(rg);
            zs_release(a), zs_release(idx), zs_release(y), zs_release(g);
        }
    zt_section("gather and index_select backward bf16/f16 vs float64");
}

/* ---- errors ------------------------------------------------------------ */

static void test_errors(void)
{
    int64_t C = 5;
    zs_tensor *x8 = zs_zeros(ZS_F8E4M3, ZS_SHAPE(2, C));
    zs_tensor *xb = zs_zeros(ZS_BF16, ZS_SHAPE(2, C));
    zs_tensor *w64 = zs_ones(ZS_F64, 1, &C), *w32 = zs_ones(ZS_F32, 1, &C);
    zs_tensor *bb = zs_zeros(ZS_BF16, 1, &C), *xh = zs_zeros(ZS_F16, ZS_SHAPE(2, C));
    ZT_EXPECT_ERROR(!zs_layer_norm(x8, NULL, NULL, 1e-5), "expected f32, f64, bf16 or f16");
    ZT_EXPECT_ERROR(!zs_layer_norm(xb, w64, NULL, 1e-5), "layer_norm");
    ZT_EXPECT_ERROR(!zs_layer_norm(xb, w32, bb, 1e-5), "expected one dtype");
    ZT_EXPECT_ERROR(!zs_softmax(x8, -1), "expected f32, f64, bf16 or f16");
    ZT_EXPECT_ERROR(!zs_mse_loss(xb, xh), "dtypes bf16 and f16 differ");
    ZT_EXPECT_ERROR(!zs_sum(x8, 0, NULL, false), "expected f32, f64, bf16 or f16");
    zs_tensor *all[] = {x8, xb, w64, w32, bb, xh};
    for (int i = 0; i < 6; i++)
        zs_release(all[i]);
    zt_section("errors: unsupported and mismatched dtypes");
}

int main(void)
{
    int64_t before = zt_live_bytes();
    test_convert();
    test_layer_norm();
    test_softmax();
    test_cross_entropy();
    test_mse();
    test_sum_mean();
    test_embedding_dropout();
    test_index_backward();
    test_errors();
    ZT_CHECK(zt_live_bytes() == before, "%lld bytes left",
             (long long)(zt_live_bytes() - before));
    return zt_done();
}
