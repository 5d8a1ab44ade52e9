/*
 * test_norm.c - zs_layer_norm and zs_batch_norm against float64
 * references: odd shapes, non-contiguous inputs, with and without
 * weight/bias, f32 and f64; fused backward against a float64 reference
 * on a multi-threaded size and gradient checks in f64 (batch norm in
 * training and inference mode); the descriptors layer_norm_backward and
 * batch_norm_backward run directly (strided inputs, statistics from
 * float64, every subset of results, with and without weight, their
 * errors); running-statistics updates; error paths.
 *
 * Tolerances: f32 results are normalised values of order 1 computed with
 * float accumulation over at most a few thousand terms, so 2e-5 relative
 * to max(1, |ref|); f64 1e-12.
 */
#include <stdlib.h>

#include "ops/op.h"
#include "testutil.h"

static double tol_of(zs_dtype dt) { return dt == ZS_F32 ? 2e-5 : 1e-12; }

/* ---- references -------------------------------------------------------- */

/* y = (x - mean) / sqrt(var + eps) * w + b over the last dim. */
static void ln_ref(const zs_tensor *x, const zs_tensor *w, const zs_tensor *b,
                   double eps, double *y)
{
    int64_t C = x->shape[x->ndim - 1], R = zs_numel(x) / C;
    for (int64_t r = 0; r < R; r++) {
        double m = 0, v = 0;
        for (int64_t i = 0; i < C; i++)
            m += zs_get(x, r * C + i);
        m /= (double)C;
        for (int64_t i = 0; i < C; i++) {
            double d = zs_get(x, r * C + i) - m;
            v += d * d;
        }
        double s = 1.0 / sqrt(v / (double)C + eps);
        for (int64_t i = 0; i < C; i++)
            y[r * C + i] = (zs_get(x, r * C + i) - m) * s *
                               (w ? zs_get(w, i) : 1.0) +
                           (b ? zs_get(b, i) : 0.0);
    }
}

/* Batch norm of x [N, C, ...]; with stats == NULL batch statistics are
 * used and their mean and biased variance returned in mean/var ([C]),
 * else stats = {running_mean, running_var}. */
static void bn_ref(const zs_tensor *x, const zs_tensor *w, const zs_tensor *b,
                   const zs_tensor *const *stats, double eps, double *y,
                   double *mean, double *var)
{
    int64_t N = x->shape[0], C = x->shape[1], n = zs_numel(x);
    int64_t S = n / (N * C);
    for (int64_t c = 0; c < C; c++) {
        double m = 0, v = 0;
        if (stats) {
            m = zs_get(stats[0], c);
            v = zs_get(stats[1], c);
        } else {
            for (int64_t k = 0; k < N; k++)
                for (int64_t s = 0; s < S; s++)
                    m += zs_get(x, (k * C + c) * S + s);
            m /= (double)(N * S);
            for (int64_t k = 0; k < N; k++)
                for (int64_t s = 0; s < S; s++) {
                    double d = zs_get(x, (k * C + c) * S + s) - m;
                    v += d * d;
                }
            v /= (double)(N * S);
            mean[c] = m;
            var[c] = v;
        }
        double r = 1.0 / sqrt(v + eps);
        for (int64_t k = 0; k < N; k++)
            for (int64_t s = 0; s < S; s++) {
                int64_t i = (k * C + c) * S + s;
                y[i] = (zs_get(x, i) - m) * r * (w ? zs_get(w, c) : 1.0) +
                       (b ? zs_get(b, c) : 0.0);
            }
    }
}

/* ---- layer norm -------------------------------------------------------- */

typedef struct shape4 {
    int nd;
    int64_t s[4];
} shape4;

static void test_ln_forward(zs_dtype dt)
{
    static const shape4 shapes[] = {
        {3, {3, 5, 7}}, {2, {7, 13}}, {1, {33}}, {2, {64, 1000}}, {2, {5, 1}}};
    uint64_t seed = 100;
    for (size_t k = 0; k < sizeof shapes / sizeof *shapes; k++) {
        const shape4 *sh = &shapes[k];
        int64_t C = sh->s[sh->nd - 1];
        for (int mode = 0; mode < 8; mode++) {
            bool strided = mode & 1, has_w = mode & 2, has_b = mode & 4;
            zs_tensor *x = strided ? zt_rand_strided(dt, sh->nd, sh->s, seed)
                                   : zt_rand(dt, sh->nd, sh->s, seed);
            zs_tensor *w = has_w ? zt_rand(dt, 1, &C, seed + 1) : NULL;
            zs_tensor *b = has_b ? zt_rand(dt, 1, &C, seed + 2) : NULL;
            zs_tensor *y = zs_layer_norm(x, w, b, 1e-5);
            int64_t n = zs_numel(x);
            double *ref = malloc((size_t)n * sizeof *ref);
            ln_ref(x, w, b, 1e-5, ref);
            double err = zt_max_err(y, ref, n);
            ZT_CHECK(y && zs_same_shape(x, y) && err <= tol_of(dt),
                     "layer_norm %s shape %zu mode %d: err %g (seed %llu)",
                     zs_dtype_name(dt), k, mode, err, (unsigned long long)seed);
            free(ref);
            zs_release(x);
            zs_release(w);
            zs_release(b);
            zs_release(y);
            seed += 3;
        }
    }
}

/* Backward through a multi-threaded size (3 threads, so the weight
 * gradient is combined from 3 parts) against the float64 formulas:
 * loss = sum(y * r), so dy = r. */
static void test_ln_backward_ref(zs_dtype dt)
{
    const int64_t R = 1537, C = 96;
    int threads = zs_num_threads();
    zs_set_num_threads(3);
    zs_tensor *x = zt_rand_strided(dt, ZS_SHAPE(R, C), 7);
    zs_tensor *w = zt_rand(dt, 1, &C, 8), *b = zt_rand(dt, 1, &C, 9);
    zs_tensor *r = zt_rand(dt, ZS_SHAPE(R, C), 10);
    zs_set_requires_grad(x, true);
    zs_set_requires_grad(w, true);
    zs_set_requires_grad(b, true);
    zs_tensor *y = zs_layer_norm(x, w, b, 1e-5);
    zs_tensor *yr = zs_mul(y, r);
    zs_tensor *loss = zs_sum(yr, 0, NULL, false);
    ZT_CHECK(zs_backward(loss, NULL, false) == ZS_OK, "ln backward runs");
    double *gx = malloc((size_t)(R * C) * sizeof *gx);
    double *gw = calloc((size_t)C, sizeof *gw), *gb = calloc((size_t)C, sizeof *gb);
    for (int64_t i = 0; i < R; i++) {
        double m = 0, v = 0;
        for (int64_t j = 0; j < C; j++)
            m += zs_get(x, i * C + j);
        m /= (double)C;
        for (int64_t j = 0; j < C; j++)
            v += pow(zs_get(x, i * C + j) - m, 2);
        double s = 1.0 / sqrt(v / (double)C + 1e-5), a = 0, bb = 0;
        for (int64_t j = 0; j < C; j++) {
            double xh = (zs_get(x, i * C + j) - m) * s;
            double g = zs_get(r, i * C + j), d = g * zs_get(w, j);
            a += d;
            bb += d * xh;
            gw[j] += g * xh;
            gb[j] += g;
        }
        for (int64_t j = 0; j < C; j++) {
            double xh = (zs_get(x, i * C + j) - m) * s;
            double d = zs_get(r, i * C + j) * zs_get(w, j);
            gx[i * C + j] = s * (d - a / (double)C - xh * bb / (double)C);
        }
    }
    /* gw/gb sum R terms of order 1: allow R times the element tolerance */
    double ex = zt_max_err(zs_grad(x), gx, R * C);
    double ew = zt_max_err(zs_grad(w), gw, C), eb = zt_max_err(zs_grad(b), gb, C);
    ZT_CHECK(ex <= 10 * tol_of(dt) && ew <= 50 * tol_of(dt) &&
                 eb <= 50 * tol_of(dt),
             "layer_norm backward %s: dx %g dw %g db %g", zs_dtype_name(dt),
             ex, ew, eb);
    zs_set_num_threads(threads);
    free(gx);
    free(gw);
    free(gb);
    zs_release(loss);
    zs_release(yr);
    zs_release(y);
    zs_release(r);
    zs_release(x);
    zs_release(w);
    zs_release(b);
}

typedef struct ln_gc {
    bool w, b;
} ln_gc;

static zs_tensor *ln_fn(void *ctx, zs_tensor **in)
{
    const ln_gc *c = ctx;
    return zs_layer_norm(in[0], c->w ? in[1] : NULL, c->b ? in[2] : NULL, 1e-5);
}

static void test_ln_grad(void)
{
    for (int mode = 0; mode < 4; mode++) {
        ln_gc c = {mode & 1, mode & 2};
        zs_tensor *x = zt_rand_strided(ZS_F64, ZS_SHAPE(3, 5, 7), 20 + mode);
        zs_tensor *w = zt_rand(ZS_F64, ZS_SHAPE(7), 30 + mode);
        zs_tensor *b = zt_rand(ZS_F64, ZS_SHAPE(7), 40 + mode);
        zs_set_requires_grad(x, true);
        zs_set_requires_grad(w, c.w);
        zs_set_requires_grad(b, c.b);
        char name[64];
        snprintf(name, sizeof name, "layer_norm weight %d bias %d", c.w, c.b);
        ZT_GRADCHECK(name, ln_fn, &c, 3, ((zs_tensor *[]){x, w, b}));
        zs_release(x);
        zs_release(w);
        zs_release(b);
    }
    /* only the parameters require grad */
    ln_gc c = {true, true};
    zs_tensor *x = zt_rand(ZS_F64, ZS_SHAPE(4, 6), 50);
    zs_tensor *w = zt_rand(ZS_F64, ZS_SHAPE(6), 51), *b = zt_rand(ZS_F64, ZS_SHAPE(6), 52);
    zs_set_requires_grad(w, true);
    zs_set_requires_grad(b, true);
    ZT_GRADCHECK("layer_norm params only", ln_fn, &c, 3, ((zs_tensor *[]){x, w, b}));
    zs_release(x);
    zs_release(w);
    zs_release(b);
}

static void test_layer_norm(void)
{
    test_ln_forward(ZS_F32);
    test_ln_forward(ZS_F64);
    zt_section("layer_norm forward vs float64 (strided, weight/bias on/off)");
    test_ln_backward_ref(ZS_F32);
    test_ln_backward_ref(ZS_F64);
    zt_section("layer_norm fused backward vs float64 [1537, 96], 3 threads");
    test_ln_grad();
    zt_section("layer_norm gradcheck");
}

/* ---- batch norm -------------------------------------------------------- */

static void bn_case(zs_dtype dt, const shape4 *sh, int mode, uint64_t seed)
{
    bool strided = mode & 1, affine = mode & 2, training = mode & 4;
    int64_t C = sh->s[1];
    zs_tensor *x = strided ? zt_rand_strided(dt, sh->nd, sh->s, seed)
                           : zt_rand(dt, sh->nd, sh->s, seed);
    zs_tensor *w = affine ? zt_rand(dt, 1, &C, seed + 1) : NULL;
    zs_tensor *b = affine ? zt_rand(dt, 1, &C, seed + 2) : NULL;
    zs_tensor *rm = zt_rand(ZS_F32, 1, &C, seed + 3);
    zs_tensor *rv0 = zs_uniform(ZS_F32, 1, &C, 0.5, 2.0, seed + 4);
    zs_tensor *rv = zs_clone(rv0);
    double *rm0 = zt_values(rm), *rvv = zt_values(rv);
    int64_t n = zs_numel(x);
    double *ref = malloc((size_t)n * sizeof *ref);
    double *mean = calloc((size_t)C, sizeof *mean), *var = calloc((size_t)C, sizeof *var);
    bn_ref(x, w, b, training ? NULL : (const zs_tensor *const[]){rm, rv},
           1e-5, ref, mean, var);
    zs_tensor *y = zs_batch_norm(x, w, b, rm, rv, training, 0.1, 1e-5);
    double err = zt_max_err(y, ref, n);
    ZT_CHECK(y && zs_same_shape(x, y) && err <= tol_of(dt),
             "batch_norm %s mode %d shape rank %d: err %g (seed %llu)",
             zs_dtype_name(dt), mode, sh->nd, err, (unsigned long long)seed);
    /* running stats: (1 - m) * old + m * batch (unbiased var) in training,
     * untouched in inference; stored in f32 */
    int64_t cnt = n / C;
    double worst = 0;
    for (int64_t c = 0; c < C; c++) {
        double em = training ? 0.9 * rm0[c] + 0.1 * mean[c] : rm0[c];
        double ev = training ? 0.9 * rvv[c] + 0.1 * var[c] * (double)cnt / (double)(cnt - 1)
                             : rvv[c];
        worst = fmax(worst, fabs(zs_get(rm, c) - em));
        worst = fmax(worst, fabs(zs_get(rv, c) - ev));
    }
    ZT_CHECK(worst <= 1e-6, "batch_norm running stats mode %d: err %g", mode,
             worst);
    free(rm0);
    free(rvv);
    free(ref);
    free(mean);
    free(var);
    zs_release(x);
    zs_release(w);
    zs_release(b);
    zs_release(rm);
    zs_release(rv0);
    zs_release(rv);
    zs_release(y);
}

static void test_bn_forward(zs_dtype dt)
{
    static const shape4 shapes[] = {
        {4, {4, 3, 5, 5}}, {2, {6, 4}}, {3, {2, 3, 7}}, {4, {8, 16, 17, 19}}};
    uint64_t seed = 300;
    for (size_t k = 0; k < sizeof shapes / sizeof *shapes; k++)
        for (int mode = 0; mode < 8; mode++, seed += 5)
            bn_case(dt, &shapes[k], mode, seed);
}

/* Inference without running statistics uses the batch's (as PyTorch with
 * track_running_stats=False); a permuted (non-contiguous) input. */
static void test_bn_misc(void)
{
    zs_tensor *x0 = zt_rand(ZS_F64, ZS_SHAPE(3, 5, 4), 60);
    zs_tensor *x = zs_transpose(x0, 0, 2); /* [4, 5, 3] */
    int64_t n = zs_numel(x);
    double *ref = malloc((size_t)n * sizeof *ref);
    double mean[5], var[5];
    bn_ref(x, NULL, NULL, NULL, 1e-5, ref, mean, var);
    zs_tensor *y = zs_batch_norm(x, NULL, NULL, NULL, NULL, false, 0.1, 1e-5);
    double err = zt_max_err(y, ref, n);
    ZT_CHECK(err <= 1e-12, "batch_norm no running stats, permuted: err %g", err);
    free(ref);
    zs_release(y);
    zs_release(x);
    zs_release(x0);
}

typedef struct bn_gc {
    bool training, affine;
    zs_tensor *rm, *rv;
} bn_gc;

static zs_tensor *bn_fn(void *ctx, zs_tensor **in)
{
    const bn_gc *c = ctx;
    return zs_batch_norm(in[0], c->affine ? in[1] : NULL,
                         c->affine ? in[2] : NULL, c->rm, c->rv, c->training,
                         0.1, 1e-5);
}

static void test_bn_grad(void)
{
    static const shape4 shapes[] = {{4, {3, 2, 3, 2}}, {2, {5, 3}}};
    for (size_t k = 0; k < 2; k++) {
        for (int mode = 0; mode < 4; mode++) {
            const shape4 *sh = &shapes[k];
            int64_t C = sh->s[1];
            bn_gc c = {mode & 1, mode & 2, NULL, NULL};
            c.rm = zt_rand(ZS_F64, 1, &C, 70);
            c.rv = zs_uniform(ZS_F64, 1, &C, 0.5, 2.0, 71);
            zs_tensor *x = zt_rand_strided(ZS_F64, sh->nd, sh->s, 72 + mode);
            zs_tensor *w = zt_rand(ZS_F64, 1, &C, 73), *b = zt_rand(ZS_F64, 1, &C, 74);
            zs_set_requires_grad(x, true);
            zs_set_requires_grad(w, c.affine);
            zs_set_requires_grad(b, c.affine);
            char name[80];
            snprintf(name, sizeof name, "batch_norm rank %d %s affine %d",
                     sh->nd, c.training ? "training" : "inference", c.affine);
            ZT_GRADCHECK(name, bn_fn, &c, 3, ((zs_tensor *[]){x, w, b}));
            zs_release(c.rm);
            zs_release(c.rv);
            zs_release(x);
            zs_release(w);
            zs_release(b);
        }
    }
}

static void test_batch_norm(void)
{
    test_bn_forward(ZS_F32);
    test_bn_forward(ZS_F64);
    test_bn_misc();
    zt_section("batch_norm forward and running stats vs float64");
    test_bn_grad();
    zt_section("batch_norm gradcheck (training and inference)");
}

/* ---- backward descriptors run directly --------------------------------- */

/* The layouts of layer_norm_attrs and batch_norm_attrs (src/ops/norm.c)
 * and the bits of their `want`. */
typedef struct ln_attrs {
    double eps;
    int64_t weight, bias, want;
    int64_t pdt1; /* dtype of gw, gb + 1; 0 (these tests): x's */
} ln_attrs;
typedef struct bn_attrs {
    double eps, momentum;
    int64_t weight, bias, running_mean, running_var, want;
    bool training;
} bn_attrs;
enum { GX = 1, GW = 2, GB = 4 };

/* max |a - b| over equal shapes (bit-equal results give 0). */
static double diff(const zs_tensor *a, const zs_tensor *b)
{
    if (!a || !b || !zs_same_shape(a, b))
        return INFINITY;
    double m = 0;
    for (int64_t i = 0; i < zs_numel(a); i++)
        m = fmax(m, fabs(zs_get(a, i) - zs_get(b, i)));
    return m;
}

/* layer_norm_backward called directly, as a backward rule on any device
 * does: strided f64 x [4, 6, 11] and g, mean and rstd from float64, with
 * and without weight, every subset of results. */
static void test_ln_backward_descriptor(void)
{
    zsi_opdef *def = zsi_opdef_find("layer_norm_backward");
    zsi_opdef *fw = zsi_opdef_find("layer_norm");
    ZT_CHECK(def && fw && fw->bw_ops && fw->bw_ops[0] == def && !fw->bw_ops[1] &&
                 !def->op.backward, "layer_norm's bw_ops");
    if (!def)
        return;
    const int64_t R = 24, C = 11;
    zs_tensor *x = zt_rand_strided(ZS_F64, ZS_SHAPE(4, 6, C), 500);
    zs_tensor *g = zt_rand_strided(ZS_F64, ZS_SHAPE(4, 6, C), 501);
    zs_tensor *w = zt_rand(ZS_F64, 1, &C, 502);
    zs_tensor *mean = zs_empty(ZS_F64, 1, &R), *rstd = zs_empty(ZS_F64, 1, &R);
    for (int hw = 1; hw >= 0; hw--) {
        double gx[24 * 11], gw[11] = {0}, gb[11] = {0};
        for (int64_t i = 0; i < R; i++) {
            double m = 0, v = 0, a = 0, bb = 0;
            for (int64_t j = 0; j < C; j++)
                m += zs_get(x, i * C + j) / (double)C;
            for (int64_t j = 0; j < C; j++)
                v += pow(zs_get(x, i * C + j) - m, 2) / (double)C;
            double rs = 1.0 / sqrt(v + 1e-5);
            ((double *)zs_data(mean))[i] = m;
            ((double *)zs_data(rstd))[i] = rs;
            for (int64_t j = 0; j < C; j++) {
                double xh = (zs_get(x, i * C + j) - m) * rs, gy = zs_get(g, i * C + j);
                double d = gy * (hw ? zs_get(w, j) : 1.0);
                a += d;
                bb += d * xh;
                gw[j] += gy * xh;
                gb[j] += gy;
            }
            for (int64_t j = 0; j < C; j++) {
                double xh = (zs_get(x, i * C + j) - m) * rs;
                double d = zs_get(g, i * C + j) * (hw ? zs_get(w, j) : 1.0);
                gx[i * C + j] = rs * (d - a / (double)C - xh * bb / (double)C);
            }
        }
        ln_attrs at = {1e-5, hw ? 1 : -1, 2, GX | GB | (hw ? GW : 0), 0};
        zs_tensor *in[5] = {x, mean, rstd, g, w}, *all[3], *r[3];
        zs_status st = zsi_run_n(def, hw ? 5 : 4, in, &at, 3, all);
        double ex = st == ZS_OK ? zt_max_err(all[0], gx, R * C) : 1;
        double ew = st == ZS_OK && hw ? zt_max_err(all[1], gw, C) : 0;
        double eb = st == ZS_OK ? zt_max_err(all[2], gb, C) : 1;
        ZT_CHECK(st == ZS_OK && (hw || !all[1]) && ex <= 1e-12 && ew <= 1e-12 &&
                     eb <= 1e-12, "weight %d: gx %g gw %g gb %g", hw, ex, ew, eb);
        /* each subset alone: the same values, the others not made */
        for (int64_t want = 1; st == ZS_OK && want < 8; want++) {
            if ((want & GW) && !hw)
                continue;
            at.want = want;
            bool ok = zsi_run_n(def, hw ? 5 : 4, in, &at, 3, r) == ZS_OK;
            ok = ok && ((want & GX) ? diff(r[0], all[0]) == 0 : zs_numel(r[0]) == 0);
            ok = ok && ((want & GW) ? diff(r[1], all[1]) == 0 : !r[1]);
            ok = ok && ((want & GB) ? diff(r[2], all[2]) == 0 : !r[2]);
            ZT_CHECK(ok, "weight %d, results %lld alone", hw, (long long)want);
            for (int k = 0; k < 3; k++)
                zs_release(r[k]); /* NULL when not made */
        }
        for (int k = 0; k < 3; k++)
            zs_release(all[k]);
    }
    ln_attrs at = {1e-5, -1, -1, GW, 0};
    zs_tensor *in[5] = {x, mean, rstd, g, w}, *r[3];
    ZT_EXPECT_ERROR(zsi_run_n(def, 4, in, &at, 3, r) < 0, "gw wanted");
    at.want = GX;
    ZT_EXPECT_ERROR(zsi_run_n(def, 5, in, &at, 3, r) < 0,
                    "layer_norm_backward: 5 inputs, expected 4 (x, mean, rstd, g)");
    zs_tensor *in2[4] = {x, w, rstd, g};
    ZT_EXPECT_ERROR(zsi_run_n(def, 4, in2, &at, 3, r) < 0,
                    "expected g like x, 24 f64 statistics");
    zs_tensor *t[] = {x, g, w, mean, rstd};
    for (size_t i = 0; i < sizeof t / sizeof *t; i++)
        zs_release(t[i]);
    zt_section("layer_norm_backward run directly: strided, subsets, errors");
}

/* batch_norm_backward called directly: strided f64 x [3, 4, 5] and g,
 * with batch statistics (training) and constant ones (inference with
 * running statistics), against the float64 formulas. */
static void test_bn_backward_descriptor(void)
{
    zsi_opdef *def = zsi_opdef_find("batch_norm_backward");
    zsi_opdef *fw = zsi_opdef_find("batch_norm");
    ZT_CHECK(def && fw && fw->bw_ops && fw->bw_ops[0] == def &&
                 fw->bw_ops[1] == &zsi_def_to_dtype && !fw->bw_ops[2] &&
                 !def->op.backward, "batch_norm's bw_ops (to_dtype: bf16/f16 g)");
    if (!def)
        return;
    const int64_t N = 3, C = 4, S = 5, M = N * S;
    zs_tensor *x = zt_rand_strided(ZS_F64, ZS_SHAPE(N, C, S), 510);
    zs_tensor *g = zt_rand_strided(ZS_F64, ZS_SHAPE(N, C, S), 511);
    zs_tensor *w = zt_rand(ZS_F64, 1, &C, 512);
    zs_tensor *mean = zs_empty(ZS_F64, 1, &C), *rstd = zs_empty(ZS_F64, 1, &C);
    for (int training = 1; training >= 0; training--) {
        double gx[60], gw[4] = {0}, gb[4] = {0};
        for (int64_t c = 0; c < C; c++) {
            double m = 0, v = 0, sg = 0, sgx = 0;
            for (int64_t i = 0; i < M; i++) {
                int64_t f = (i / S * C + c) * S + i % S;
                m += zs_get(x, f) / (double)M;
            }
            for (int64_t i = 0; i < M; i++) {
                int64_t f = (i / S * C + c) * S + i % S;
                v += pow(zs_get(x, f) - m, 2) / (double)M;
            }
            if (!training) { /* running statistics: constants */
                m = 0.1 * (double)c - 0.2;
                v = 0.5 + 0.25 * (double)c;
            }
            double rs = 1.0 / sqrt(v + 1e-5), a = zs_get(w, c) * rs;
            ((double *)zs_data(mean))[c] = m;
            ((double *)zs_data(rstd))[c] = rs;
            for (int64_t i = 0; i < M; i++) {
                int64_t f = (i / S * C + c) * S + i % S;
                sg += zs_get(g, f);
                sgx += zs_get(g, f) * (zs_get(x, f) - m) * rs;
            }
            gw[c] = sgx;
            gb[c] = sg;
            for (int64_t i = 0; i < M; i++) {
                int64_t f = (i / S * C + c) * S + i % S;
                double xh = (zs_get(x, f) - m) * rs;
                gx[f] = training ? a * (zs_get(g, f) - sg / (double)M -
                                        xh * sgx / (double)M)
                                 : a * zs_get(g, f);
            }
        }
        bn_attrs at = {1e-5, 0.1, 1, 2, training ? -1 : 3, training ? -1 : 4,
                       GX | GW | GB, training};
        zs_tensor *r[3];
        zs_status st = zsi_run_n(def, 5, (zs_tensor *[]){x, mean, rstd, g, w},
                                 &at, 3, r);
        double ex = st == ZS_OK ? zt_max_err(r[0], gx, N * C * S) : 1;
        double ew = st == ZS_OK ? zt_max_err(r[1], gw, C) : 1;
        double eb = st == ZS_OK ? zt_max_err(r[2], gb, C) : 1;
        ZT_CHECK(ex <= 1e-12 && ew <= 1e-12 && eb <= 1e-12,
                 "%s: gx %g gw %g gb %g", training ? "batch statistics"
                                                   : "running statistics",
                 ex, ew, eb);
        for (int k = 0; k < 3; k++)
            zs_release(r[k]);
    }
    zs_tensor *m32 = zs_to_dtype(mean, ZS_F32), *r[3];
    bn_attrs at = {1e-5, 0.1, -1, -1, -1, -1, GX, true};
    ZT_EXPECT_ERROR(zsi_run_n(def, 4, (zs_tensor *[]){x, m32, rstd, g}, &at, 3, r) < 0,
                    "batch_norm_backward: x [3, 4, 5], g [3, 4, 5], mean and "
                    "rstd f32 [4]: expected g like x, 4 f64 statistics");
    zs_tensor *t[] = {x, g, w, mean, rstd, m32};
    for (size_t i = 0; i < sizeof t / sizeof *t; i++)
        zs_release(t[i]);
    zt_section("batch_norm_backward run directly: batch and running statistics, errors");
}

/* ---- errors ------------------------------------------------------------ */

static void test_errors(void)
{
    zs_tensor *x = zs_ones(ZS_F32, ZS_SHAPE(4, 5));
    zs_tensor *w6 = zs_ones(ZS_F32, ZS_SHAPE(6)), *w5 = zs_ones(ZS_F32, ZS_SHAPE(5));
    zs_tensor *w5d = zs_ones(ZS_F64, ZS_SHAPE(5)), *x1 = zs_ones(ZS_F32, ZS_SHAPE(7));
    zs_tensor *xi = zs_ones(ZS_I32, ZS_SHAPE(4, 5)), *one = zs_ones(ZS_F32, ZS_SHAPE(1, 5));
    ZT_EXPECT_ERROR(zs_layer_norm(x, w6, NULL, 1e-5) == NULL,
                    "layer_norm: weight [6] does not match x [4, 5], expected [5]");
    ZT_EXPECT_ERROR(zs_layer_norm(x, NULL, w6, 1e-5) == NULL, "bias [6]");
    ZT_EXPECT_ERROR(zs_layer_norm(x, w5d, NULL, 1e-5) == NULL, "dtypes f32 and f64");
    ZT_EXPECT_ERROR(zs_layer_norm(x, NULL, NULL, -1) == NULL, "eps = -1");
    ZT_EXPECT_ERROR(zs_layer_norm(xi, NULL, NULL, 1e-5) == NULL, "dtype i32");
    ZT_EXPECT_ERROR(zs_batch_norm(x1, NULL, NULL, NULL, NULL, true, 0.1, 1e-5) == NULL,
                    "batch_norm: x [7] has 1 dims, expected at least 2");
    ZT_EXPECT_ERROR(zs_batch_norm(x, w6, NULL, NULL, NULL, true, 0.1, 1e-5) == NULL,
                    "batch_norm: weight [6] does not match");
    ZT_EXPECT_ERROR(zs_batch_norm(x, NULL, NULL, w6, w6, false, 0.1, 1e-5) == NULL,
                    "running_mean [6]");
    ZT_EXPECT_ERROR(zs_batch_norm(x, NULL, NULL, w5, NULL, true, 0.1, 1e-5) == NULL,
                    "must be given together");
    ZT_EXPECT_ERROR(zs_batch_norm(x, NULL, NULL, NULL, NULL, true, 0.1, NAN) == NULL,
                    "eps = nan");
    ZT_EXPECT_ERROR(zs_batch_norm(x, NULL, NULL, NULL, NULL, true, 1.5, 1e-5) == NULL,
                    "momentum = 1.5");
    ZT_EXPECT_ERROR(zs_batch_norm(one, NULL, NULL, NULL, NULL, true, 0.1, 1e-5) == NULL,
                    "expected more than 1");
    zs_set_error("first");
    ZT_CHECK(zs_layer_norm(NULL, w5, NULL, 1e-5) == NULL &&
                 zs_batch_norm(NULL, NULL, NULL, NULL, NULL, true, 0.1, 1e-5) == NULL &&
                 !strcmp(zs_last_error(), "first"),
             "NULL input keeps the first error");
    zs_release(x);
    zs_release(w6);
    zs_release(w5);
    zs_release(w5d);
    zs_release(x1);
    zs_release(xi);
    zs_release(one);
    ZT_CHECK(zs_autograd_live_nodes() == 0, "no autograd nodes left: %lld",
             (long long)zs_autograd_live_nodes());
    zt_section("errors");
}

/* Output shapes on random shapes (layer norm 1 to 5 dims, batch norm 2 to
 * 5, sizes 1 to 4; with and without weight and bias) against the rule:
 * x's shape and dtype. */
static void test_random_shapes(void)
{
    uint64_t seed = 99, r = seed;
    for (int it = 0; it < 100; it++) {
        r = r * 6364136223846793005ULL + 1442695040888963407ULL;
        int nd = 1 + (int)(r >> 33) % 5;
        bool affine = (r >> 40) & 1;
        int64_t shape[5];
        for (int d = 0; d < nd; d++) {
            r = r * 6364136223846793005ULL + 1442695040888963407ULL;
            shape[d] = 1 + (int64_t)((r >> 35) % 4);
        }
        if (nd >= 2)
            shape[0] = 2; /* batch statistics need 2 values per channel */
        zs_dtype dt = it % 2 ? ZS_F64 : ZS_F32;
        zs_tensor *x = zt_rand(dt, nd, shape, seed + (uint64_t)it);
        int64_t C = shape[nd - 1], Cb = nd >= 2 ? shape[1] : 1;
        zs_tensor *w = affine ? zt_rand(dt, 1, &C, seed + 500) : NULL;
        zs_tensor *b = affine ? zt_rand(dt, 1, &C, seed + 501) : NULL;
        zs_tensor *wb = affine ? zt_rand(dt, 1, &Cb, seed + 502) : NULL;
        zs_tensor *ln = zs_layer_norm(x, w, b, 1e-5);
        zs_tensor *bn = nd >= 2 ? zs_batch_norm(x, wb, NULL, NULL, NULL, true,
                                                0.1, 1e-5) : NULL;
        bool ok_ln = ln && ln->dtype == dt && zs_same_shape(ln, x);
        bool ok_bn = nd < 2 || (bn && bn->dtype == dt && zs_same_shape(bn, x));
        char sx[96];
        zs_shape_str(x, sx, sizeof sx);
        ZT_CHECK(ok_ln && ok_bn, "%s%s shape of x%s, affine %d (seed %llu, "
                 "case %d)", ok_ln ? "" : "layer_norm ",
                 ok_bn ? "" : "batch_norm", sx, affine,
                 (unsigned long long)seed, it);
        zs_tensor *all[] = {x, w, b, wb, ln, bn};
        for (int k = 0; k < 6; k++)
            zs_release(all[k]);
    }
    zt_section("shapes: layer_norm batch_norm on 100 random shapes");
}

int main(void)
{
    test_random_shapes();
    test_layer_norm();
    test_batch_norm();
    test_ln_backward_descriptor();
    test_bn_backward_descriptor();
    test_errors();
    return zt_done();
}
