/*
 * test_softmax.c - zs_softmax and zs_log_softmax against float64
 * references: every dim of 3-d and 4-d inputs (the [O, R, K] strip path)
 * and rows of 1, 7, 1000 and 50257 elements (vector tails), contiguous,
 * strided and transposed inputs, f32 and f64; large logits (stability),
 * -inf entries; fused backward against the float64 formulas on a threaded
 * size; the backward descriptors run directly on strided y and g (f64,
 * every dim) and their errors; gradient checks in f64; error paths.
 *
 * Tolerances (relative to max(1, |ref|)): f32 uses a polynomial exp with
 * ~2 ulp relative error and a sum in double, so outputs (<= 1, or log
 * values of order 10) are within 5e-6; f64 1e-12.
 */
#include <stdlib.h>

#include "ops/op.h"
#include "testutil.h"

static double tol_of(zs_dtype dt) { return dt == ZS_F32 ? 5e-6 : 1e-12; }

/* [O, R, K] of shape around dim d. */
static void split(const zs_tensor *x, int d, int64_t *O, int64_t *R,
                  int64_t *K)
{
    *O = *R = *K = 1;
    for (int i = 0; i < x->ndim; i++) {
        if (i < d)
            *O *= x->shape[i];
        else if (i == d)
            *R = x->shape[i];
        else
            *K *= x->shape[i];
    }
}

/* y = softmax or log_softmax of x (values v, row-major) over dim d. */
static void sm_ref(const zs_tensor *x, const double *v, int d, bool lg,
                   double *y)
{
    int64_t O, R, K;
    split(x, d, &O, &R, &K);
    for (int64_t o = 0; o < O; o++)
        for (int64_t k = 0; k < K; k++) {
            const double *xr = v + o * R * K + k;
            double m = -INFINITY, s = 0;
            for (int64_t r = 0; r < R; r++)
                m = fmax(m, xr[r * K]);
            for (int64_t r = 0; r < R; r++)
                s += exp(xr[r * K] - m);
            for (int64_t r = 0; r < R; r++) {
                double e = xr[r * K] - m;
                y[o * R * K + r * K + k] = lg ? e - log(s) : exp(e) / s;
            }
        }
}

/* softmax: gx = y (g - sum g y); log: gx = g - exp(y) sum g, over dim d. */
static void sm_bw_ref(const zs_tensor *x, const double *y, const double *g,
                      int d, bool lg, double *gx)
{
    int64_t O, R, K;
    split(x, d, &O, &R, &K);
    for (int64_t o = 0; o < O; o++)
        for (int64_t k = 0; k < K; k++) {
            int64_t b = o * R * K + k;
            double s = 0;
            for (int64_t r = 0; r < R; r++)
                s += lg ? g[b + r * K] : g[b + r * K] * y[b + r * K];
            for (int64_t r = 0; r < R; r++) {
                int64_t i = b + r * K;
                gx[i] = lg ? g[i] - exp(y[i]) * s : y[i] * (g[i] - s);
            }
        }
}

static zs_tensor *make(zs_dtype dt, int nd, const int64_t *shape, int layout,
                       uint64_t seed)
{
    if (layout == 1)
        return zt_rand_strided(dt, nd, shape, seed);
    if (layout == 0 || nd < 2)
        return zt_rand(dt, nd, shape, seed);
    int64_t sw[ZS_MAX_DIMS];
    for (int d = 0; d < nd; d++)
        sw[d] = shape[d];
    sw[0] = shape[nd - 1];
    sw[nd - 1] = shape[0];
    zs_tensor *b = zt_rand(dt, nd, sw, seed);
    zs_tensor *t = zs_transpose(b, 0, nd - 1);
    zs_release(b);
    return t;
}

static void check_fwd(zs_tensor *x, int dim, bool lg, const char *what)
{
    int d = dim < 0 ? dim + x->ndim : dim;
    int64_t n = zs_numel(x);
    double *v = zt_values(x), *ref = malloc((size_t)n * sizeof *ref);
    sm_ref(x, v, d, lg, ref);
    zs_tensor *y = lg ? zs_log_softmax(x, dim) : zs_softmax(x, dim);
    double err = zt_max_err(y, ref, n);
    char s[96];
    ZT_CHECK(y && zs_same_shape(x, y) && err <= tol_of(x->dtype),
             "%s %s %s x%s dim %d: err %g", lg ? "log_softmax" : "softmax",
             what, zs_dtype_name(x->dtype), zs_shape_str(x, s, sizeof s), dim,
             err);
    free(v);
    free(ref);
    zs_release(y);
}

typedef struct sh {
    int nd;
    int64_t s[4];
} sh;

static void test_forward(void)
{
    static const sh shapes[] = {{3, {3, 5, 7}}, {4, {2, 3, 4, 5}},
                                {2, {4, 1}},    {2, {6, 7}},
                                {2, {9, 1000}}, {2, {1000, 7}},
                                {2, {3, 300}},  {1, {1}}};
    static const char *lname[] = {"contiguous", "strided", "transposed"};
    uint64_t seed = 10;
    for (int dti = 0; dti < 2; dti++) {
        zs_dtype dt = dti ? ZS_F64 : ZS_F32;
        for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++)
            for (int layout = 0; layout < 3; layout++) {
                zs_tensor *x = make(dt, shapes[i].nd, shapes[i].s, layout,
                                    seed++);
                for (int dim = -1; dim < shapes[i].nd; dim++)
                    for (int lg = 0; lg < 2; lg++)
                        check_fwd(x, dim, lg, lname[layout]);
                zs_release(x);
            }
    }
    /* vocab-sized rows, and the same dim not last (strip path, K = 3) */
    zs_tensor *v = zt_rand(ZS_F32, ZS_SHAPE(3, 50257), 77);
    zs_tensor *vs = zs_mul_scalar(v, 8.0);
    zs_tensor *w = zt_rand(ZS_F32, ZS_SHAPE(50257, 3), 78);
    for (int lg = 0; lg < 2; lg++) {
        check_fwd(vs, -1, lg, "vocab");
        check_fwd(w, 0, lg, "vocab dim 0");
    }
    zs_release(v);
    zs_release(vs);
    zs_release(w);
    zt_section("forward: dims x shapes x layouts, rows 1/7/1000/50257");
}

/* Large logits must not overflow; -inf entries give 0 / -inf. */
static void test_stability(void)
{
    for (int dti = 0; dti < 2; dti++) {
        zs_dtype dt = dti ? ZS_F64 : ZS_F32;
        zs_tensor *x = zt_rand(dt, ZS_SHAPE(5, 33), 3);
        zs_tensor *big = zs_mul_scalar(x, 1000.0);
        zs_tensor *shifted = zs_add_scalar(x, 500.0);
        for (int lg = 0; lg < 2; lg++) {
            check_fwd(big, -1, lg, "x1000");
            check_fwd(shifted, 0, lg, "+500");
        }
        zs_release(x);
        zs_release(big);
        zs_release(shifted);
        double v[] = {0, -INFINITY, 1, -INFINITY};
        zs_tensor *m = zs_from_data(ZS_F64, ZS_SHAPE(4), v);
        zs_tensor *mc = zs_to_dtype(m, dt);
        zs_tensor *p = zs_softmax(mc, 0), *lp = zs_log_softmax(mc, 0);
        double e = 1.0 / (1.0 + exp(1.0));
        ZT_CHECK(p && lp && zs_get(p, 1) == 0 && zs_get(p, 3) == 0 &&
                     fabs(zs_get(p, 0) - e) < 1e-6 &&
                     isinf(zs_get(lp, 1)) && zs_get(lp, 1) < 0,
                 "-inf entries %s", zs_dtype_name(dt));
        zs_release(m);
        zs_release(mc);
        zs_release(p);
        zs_release(lp);
    }
    zt_section("stability: large logits, -inf entries");
}

/* Fused backward on a threaded size in f32 against the float64 formulas,
 * for the last dim and a middle dim. */
static void test_backward(void)
{
    static const int dims[] = {-1, 1};
    uint64_t seed = 40;
    for (int lg = 0; lg < 2; lg++)
        for (int di = 0; di < 2; di++) {
            zs_tensor *x = zt_rand(ZS_F32, ZS_SHAPE(64, 37, 41), seed++);
            zs_set_requires_grad(x, true);
            zs_tensor *g = zt_rand(ZS_F32, ZS_SHAPE(64, 37, 41), seed++);
            zs_tensor *y = lg ? zs_log_softmax(x, dims[di])
                              : zs_softmax(x, dims[di]);
            ZT_CHECK(zs_backward(y, g, false) == ZS_OK, "backward");
            int64_t n = zs_numel(x);
            double *yv = zt_values(y), *gv = zt_values(g);
            double *ref = malloc((size_t)n * sizeof *ref);
            sm_bw_ref(x, yv, gv, dims[di] < 0 ? 2 : dims[di], lg, ref);
            double err = zt_max_err(zs_grad(x), ref, n);
            ZT_CHECK(err <= 1e-5, "%s backward dim %d: err %g",
                     lg ? "log_softmax" : "softmax", dims[di], err);
            free(yv);
            free(gv);
            free(ref);
            zs_release(x);
            zs_release(g);
            zs_release(y);
        }
    zt_section("fused backward vs float64 (f32, threaded size)");
}

/* The layout of softmax_attrs (src/ops/softmax.c). */
typedef struct sm_attrs {
    int64_t dim;
} sm_attrs;

/* A strided view with t's values (transposed copy, transposed back). */
static zs_tensor *strided_copy(zs_tensor *t)
{
    zs_tensor *a = zs_transpose(t, 0, t->ndim - 1), *b = zs_contiguous(a);
    zs_tensor *r = zs_transpose(b, 0, t->ndim - 1);
    zs_release(a);
    zs_release(b);
    return r;
}

/* softmax_backward and log_softmax_backward called directly (as a backward
 * rule on any device does) on strided y and g, against float64. */
static void test_backward_descriptor(void)
{
    uint64_t seed = 80;
    for (int lg = 0; lg < 2; lg++) {
        const char *name = lg ? "log_softmax_backward" : "softmax_backward";
        zsi_opdef *def = zsi_opdef_find(name);
        zsi_opdef *fw = zsi_opdef_find(lg ? "log_softmax" : "softmax");
        ZT_CHECK(def && fw && fw->bw_ops && fw->bw_ops[0] == def && !fw->bw_ops[1]
                     && !def->op.backward, "%s: the forward's bw_ops", name);
        for (int dim = -1; def && dim < 3; dim++) {
            zs_tensor *x = zt_rand(ZS_F64, ZS_SHAPE(5, 6, 7), seed++);
            zs_tensor *g = zt_rand_strided(ZS_F64, ZS_SHAPE(5, 6, 7), seed++);
            zs_tensor *y0 = lg ? zs_log_softmax(x, dim) : zs_softmax(x, dim);
            zs_tensor *y = strided_copy(y0);
            sm_attrs at = {dim};
            zs_tensor *gx = zsi_run(def, 2, (zs_tensor *[]){y, g}, &at);
            int64_t n = zs_numel(x);
            double *yv = zt_values(y0), *gv = zt_values(g);
            double *ref = malloc((size_t)n * sizeof *ref);
            sm_bw_ref(x, yv, gv, dim < 0 ? 2 : dim, lg, ref);
            double err = gx ? zt_max_err(gx, ref, n) : 1;
            ZT_CHECK(!zs_is_contiguous(y) && gx && zs_same_shape(gx, x) &&
                         err <= 1e-12, "%s dim %d: err %g", name, dim, err);
            free(yv);
            free(gv);
            free(ref);
            zs_tensor *all[] = {x, g, y0, y, gx};
            for (int k = 0; k < 5; k++)
                zs_release(all[k]);
        }
        zs_tensor *y = zt_rand(ZS_F64, ZS_SHAPE(3, 4), 1);
        zs_tensor *g = zt_rand(ZS_F64, ZS_SHAPE(4, 3), 2);
        zs_tensor *g32 = zt_rand(ZS_F32, ZS_SHAPE(3, 4), 3);
        sm_attrs at = {1}, bad = {2};
        ZT_EXPECT_ERROR(def && !zsi_run(def, 2, (zs_tensor *[]){y, g}, &at),
                        "does not match y [3, 4]");
        ZT_EXPECT_ERROR(def && !zsi_run(def, 2, (zs_tensor *[]){y, g32}, &at),
                        "dtype");
        ZT_EXPECT_ERROR(def && !zsi_run(def, 2, (zs_tensor *[]){y, y}, &bad),
                        "out of range");
        zs_release(y);
        zs_release(g);
        zs_release(g32);
    }
    zt_section("backward descriptors run directly: strided y, g vs float64; errors");
}

typedef struct sm_args {
    int dim;
    bool lg;
} sm_args;

static zs_tensor *sm_fn(void *ctx, zs_tensor **in)
{
    sm_args *a = ctx;
    return a->lg ? zs_log_softmax(in[0], a->dim) : zs_softmax(in[0], a->dim);
}

static void test_grad(void)
{
    uint64_t seed = 60;
    for (int lg = 0; lg < 2; lg++)
        for (int dim = -1; dim < 3; dim++)
            for (int strided = 0; strided < 2; strided++) {
                int64_t shp[3] = {3, 4, 5};
                zs_tensor *x = strided ? zt_rand_strided(ZS_F64, 3, shp, seed)
                                       : zt_rand(ZS_F64, 3, shp, seed);
                seed++;
                zs_set_requires_grad(x, true);
                sm_args a = {dim, lg};
                char name[64];
                snprintf(name, sizeof name, "%s dim %d%s",
                         lg ? "log_softmax" : "softmax", dim,
                         strided ? " strided" : "");
                ZT_GRADCHECK(name, sm_fn, &a, 1, &x);
                zs_release(x);
            }
    /* a chain: log_softmax feeding softmax (node to node gradients) */
    zs_tensor *x = zt_rand(ZS_F64, ZS_SHAPE(7), 99);
    zs_set_requires_grad(x, true);
    sm_args a = {0, true};
    ZT_GRADCHECK("log_softmax 1-d", sm_fn, &a, 1, &x);
    zs_release(x);
    zt_section("gradcheck softmax log_softmax (f64)");
}

static void test_errors(void)
{
    zs_tensor *x = zt_rand(ZS_F32, ZS_SHAPE(3, 4), 1);
    ZT_EXPECT_ERROR(zs_softmax(x, 2) == NULL, "out of range");
    ZT_EXPECT_ERROR(zs_log_softmax(x, -3) == NULL, "out of range");
    zs_tensor *i = zs_zeros(ZS_I64, ZS_SHAPE(3, 4));
    ZT_EXPECT_ERROR(zs_softmax(i, 0) == NULL, "dtype i64");
    ZT_EXPECT_ERROR(zs_log_softmax(i, 0) == NULL, "dtype i64");
    ZT_CHECK(zs_softmax(NULL, 0) == NULL, "NULL in");
    zs_tensor *e = zs_zeros(ZS_F32, ZS_SHAPE(0, 4));
    zs_tensor *ye = zs_softmax(e, 1);
    ZT_CHECK(ye && zs_numel(ye) == 0, "empty input gives an empty output");
    zs_release(ye);
    zs_release(e);
    zs_release(i);
    zs_release(x);
    zt_section("errors");
}

/* Output shapes on random shapes (0 to 5 dims, sizes 1 to 4) and dims
 * (negative too) against the rule: the input's shape and dtype. */
static void test_random_shapes(void)
{
    uint64_t seed = 777, r = seed;
    for (int it = 0; it < 100; it++) {
        r = r * 6364136223846793005ULL + 1442695040888963407ULL;
        int nd = (int)(r >> 33) % 6, n1 = nd > 0 ? nd : 1;
        int dim = (int)((r >> 40) % (uint64_t)(2 * n1)) - n1;
        int64_t shape[5];
        for (int d = 0; d < nd; d++) {
            r = r * 6364136223846793005ULL + 1442695040888963407ULL;
            shape[d] = 1 + (int64_t)((r >> 35) % 4);
        }
        zs_tensor *x = zt_rand(ZS_F64, nd, shape, seed + (uint64_t)it);
        for (int lg = 0; lg < 2; lg++) {
            zs_tensor *y = lg ? zs_log_softmax(x, dim) : zs_softmax(x, dim);
            bool ok = y && y->ndim == nd && y->dtype == ZS_F64;
            for (int d = 0; ok && d < nd; d++)
                ok = y->shape[d] == shape[d];
            char sx[96];
            ZT_CHECK(ok, "%s shape of x%s dim %d (seed %llu, case %d)",
                     lg ? "log_softmax" : "softmax",
                     zs_shape_str(x, sx, sizeof sx), dim,
                     (unsigned long long)seed, it);
            zs_release(y);
        }
        zs_release(x);
    }
    zt_section("shapes: softmax log_softmax on 100 random shapes");
}

int main(void)
{
    test_forward();
    test_random_shapes();
    test_stability();
    test_backward();
    test_backward_descriptor();
    test_grad();
    test_errors();
    ZT_CHECK(zs_autograd_live_nodes() == 0, "no live nodes");
    return zt_done();
}
