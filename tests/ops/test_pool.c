/*
 * test_pool.c - zs_max_pool2d and zs_avg_pool2d forward and backward
 * against float64 references: odd sizes, stride (0 = kernel), padding
 * (never winning a max; counted or not in an average), non-contiguous
 * inputs, f32 and f64; f64 gradient checks; the backward descriptors run
 * directly (strided gradients) against the reference, with the params
 * the caller passed overwritten before backward (the node holds its own);
 * error paths. Random inputs have no ties, so the max-pool gradient is
 * well defined.
 */
#include <stdlib.h>

#include <string.h>

#include "kernels/cpu/pool.h"
#include "ops/op.h"
#include "testutil.h"

/* The backward descriptors' attributes (ops/pool.c). */
typedef struct pool_bw_attrs {
    zs_pool2d_params p;
    int64_t H, W;
} pool_bw_attrs;

typedef struct pool_case {
    int64_t N, C, H, W;
    zs_pool2d_params p;
} pool_case;

static const pool_case cases[] = {
    {2, 3, 9, 7, {{3, 3}, {0, 0}, {0, 0}, false}},
    {2, 3, 9, 7, {{3, 2}, {2, 1}, {1, 1}, false}},
    {2, 3, 9, 7, {{2, 2}, {1, 1}, {1, 0}, true}},
    {1, 2, 11, 8, {{5, 3}, {2, 2}, {2, 1}, false}},
    {1, 2, 11, 8, {{5, 3}, {2, 2}, {2, 1}, true}},
    {3, 1, 4, 4, {{4, 4}, {0, 0}, {0, 0}, false}}, /* global pooling */
};

static void out_hw(const pool_case *c, int64_t *OH, int64_t *OW)
{
    const zs_pool2d_params *p = &c->p;
    int sh = p->stride[0] ? p->stride[0] : p->kernel[0];
    int sw = p->stride[1] ? p->stride[1] : p->kernel[1];
    *OH = (c->H + 2 * p->padding[0] - p->kernel[0]) / sh + 1;
    *OW = (c->W + 2 * p->padding[1] - p->kernel[1]) / sw + 1;
}

/* Max or average pooling of x (row-major) and the input gradient for gy. */
static void reference(const pool_case *c, bool max, const double *x,
                      const double *gy, double *y, double *gx)
{
    const zs_pool2d_params *p = &c->p;
    int sh = p->stride[0] ? p->stride[0] : p->kernel[0];
    int sw = p->stride[1] ? p->stride[1] : p->kernel[1];
    int64_t OH, OW, HW = c->H * c->W;
    out_hw(c, &OH, &OW);
    memset(gx, 0, (size_t)(c->N * c->C * HW) * sizeof *gx);
    for (int64_t pl = 0; pl < c->N * c->C; pl++)
        for (int64_t oh = 0; oh < OH; oh++)
            for (int64_t ow = 0; ow < OW; ow++) {
                double best = -INFINITY, sum = 0;
                int64_t bi = -1, cnt = 0;
                for (int kh = 0; kh < p->kernel[0]; kh++)
                    for (int kw = 0; kw < p->kernel[1]; kw++) {
                        int64_t ih = oh * sh - p->padding[0] + kh;
                        int64_t iw = ow * sw - p->padding[1] + kw;
                        if (ih < 0 || ih >= c->H || iw < 0 || iw >= c->W)
                            continue;
                        double v = x[pl * HW + ih * c->W + iw];
                        sum += v;
                        cnt++;
                        if (v > best) {
                            best = v;
                            bi = ih * c->W + iw;
                        }
                    }
                int64_t yi = (pl * OH + oh) * OW + ow;
                if (p->count_include_pad)
                    cnt = p->kernel[0] * p->kernel[1];
                y[yi] = max ? best : sum / (double)cnt;
                if (max) {
                    gx[pl * HW + bi] += gy[yi];
                    continue;
                }
                for (int kh = 0; kh < p->kernel[0]; kh++)
                    for (int kw = 0; kw < p->kernel[1]; kw++) {
                        int64_t ih = oh * sh - p->padding[0] + kh;
                        int64_t iw = ow * sw - p->padding[1] + kw;
                        if (ih >= 0 && ih < c->H && iw >= 0 && iw < c->W)
                            gx[pl * HW + ih * c->W + iw] += gy[yi] / (double)cnt;
                    }
            }
}

static zs_tensor *make_input(zs_dtype dt, const pool_case *c, int layout,
                             uint64_t seed)
{
    if (layout == 2)
        return zt_rand_strided(dt, ZS_SHAPE(c->N, c->C, c->H, c->W), seed);
    if (layout == 0)
        return zt_rand(dt, ZS_SHAPE(c->N, c->C, c->H, c->W), seed);
    zs_tensor *base = zt_rand(dt, ZS_SHAPE(c->N, c->C, c->W, c->H), seed);
    zs_tensor *x = zs_transpose(base, 2, 3);
    zs_release(base);
    return x;
}

static void check_case(size_t ci, bool max, zs_dtype dt, int layout)
{
    const pool_case *c = &cases[ci];
    uint64_t seed = 50 + 7 * ci;
    int64_t OH, OW;
    out_hw(c, &OH, &OW);
    zs_tensor *x = make_input(dt, c, layout, seed);
    zs_set_requires_grad(x, true);
    zs_tensor *y = max ? zs_max_pool2d(x, &c->p) : zs_avg_pool2d(x, &c->p);
    zs_tensor *gy = zt_rand(dt, ZS_SHAPE(c->N, c->C, OH, OW), seed + 1);
    int64_t nx = zs_numel(x), ny = zs_numel(gy);
    double *xv = zt_values(x), *gyv = zt_values(gy);
    double *ry = malloc((size_t)ny * sizeof *ry), *rgx = malloc((size_t)nx * sizeof *rgx);
    reference(c, max, xv, gyv, ry, rgx);
    /* f32: the window sum of an average is accumulated in double, then
     * rounded once; the gradient g/count is rounded once. */
    double tol = dt == ZS_F32 ? 1e-6 : 1e-14;
    double ey = y && zs_numel(y) == ny ? zt_max_err(y, ry, ny) : INFINITY;
    ZT_CHECK(ey <= tol, "%s case %zu %s layout %d: forward err %g (seed %llu)",
             max ? "max" : "avg", ci, zs_dtype_name(dt), layout, ey,
             (unsigned long long)seed);
    ZT_CHECK(y && zs_backward(y, gy, false) == ZS_OK, "backward");
    double eg = zs_grad(x) ? zt_max_err(zs_grad(x), rgx, nx) : INFINITY;
    ZT_CHECK(eg <= tol, "%s case %zu %s layout %d: grad err %g (seed %llu)",
             max ? "max" : "avg", ci, zs_dtype_name(dt), layout, eg,
             (unsigned long long)seed);
    free(xv);
    free(gyv);
    free(ry);
    free(rgx);
    zs_release(x);
    zs_release(y);
    zs_release(gy);
}

static void test_reference(void)
{
    for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++)
        for (int max = 0; max < 2; max++) {
            check_case(ci, max, ZS_F32, 0);
            check_case(ci, max, ZS_F64, 0);
            check_case(ci, max, ZS_F32, 1);
            check_case(ci, max, ZS_F64, 2);
        }
    zt_section("forward and backward vs float64 reference");
}

static void test_padding_never_wins(void)
{
    zs_tensor *r = zt_rand(ZS_F32, ZS_SHAPE(2, 3, 7, 5), 9);
    zs_tensor *x = zs_add_scalar(r, -5.0); /* all in [-6, -4) */
    zs_pool2d_params p = {{3, 3}, {1, 1}, {1, 1}, false};
    zs_tensor *y = zs_max_pool2d(x, &p);
    double top = -INFINITY;
    for (int64_t i = 0; y && i < zs_numel(y); i++)
        top = fmax(top, zs_get(y, i));
    ZT_CHECK(y && y->shape[2] == 7 && y->shape[3] == 5 && top < -4.0,
             "max over padded windows of negative inputs: %g", top);
    zs_release(r);
    zs_release(x);
    zs_release(y);
    zt_section("max-pool padding is -inf");
}

/* max_pool2d_backward and avg_pool2d_backward run directly on a strided
 * gradient (and the indices the forward's node saved) against the
 * reference; and autograd through a forward whose params struct was
 * overwritten after the call. */
/* The max-pool kernel on ties and NaN (its windows are scanned without
 * branches, a NaN window again): the first maximum in scan order wins a
 * tie, the first NaN wins over anything, -inf can win; f32 and f64. Plane
 * [2, 8], 2x2 windows of stride 2: {1 1; 1 1} -> 1 at 0; {0 NaN; 5 NaN}
 * -> NaN at 3; {-inf -inf; -inf 2} -> 2 at 13; {NaN 7; 7 -inf} -> NaN
 * at 6. */
static void test_max_ties_nan(void)
{
    const double X[16] = {1, 1, 0, NAN, -INFINITY, -INFINITY, NAN, 7,
                          1, 1, 5, NAN, -INFINITY, 2, 7, -INFINITY};
    const int64_t want_i[4] = {0, 3, 13, 6};
    const double want_v[4] = {1, NAN, 2, NAN};
    zsk_pool2d_shape s = {1, 1, 2, 8, 1, 4, 2, 2, 2, 2, 0, 0};
    int64_t xs[4] = {16, 16, 8, 1}, idx[4];
    for (int d = 0; d < 2; d++) {
        float xf[16], yf[4];
        double xd[16], yd[4];
        for (int i = 0; i < 16; i++) {
            xf[i] = (float)X[i];
            xd[i] = X[i];
        }
        if (d == 0)
            zsk_max_pool2d(ZS_F32, &s, xf, xs, yf, idx);
        else
            zsk_max_pool2d(ZS_F64, &s, xd, xs, yd, idx);
        for (int k = 0; k < 4; k++) {
            double y = d == 0 ? yf[k] : yd[k];
            bool ok = idx[k] == want_i[k] &&
                      (isnan(want_v[k]) ? isnan(y) : y == want_v[k]);
            ZT_CHECK(ok, "%s window %d: max %g at %lld, expected %g at %lld",
                     d ? "f64" : "f32", k, y, (long long)idx[k], want_v[k],
                     (long long)want_i[k]);
        }
    }
    zt_section("max pool: ties, NaN and -inf (kernel)");
}

static void test_backward_descriptors(void)
{
    zsi_opdef *bw[2] = {zsi_opdef_find("avg_pool2d_backward"),
                        zsi_opdef_find("max_pool2d_backward")};
    for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++)
        for (int max = 0; max < 2; max++) {
            const pool_case *c = &cases[ci];
            uint64_t seed = 300 + 7 * ci;
            zs_dtype dt = (ci + (size_t)max) % 2 ? ZS_F64 : ZS_F32;
            int64_t OH, OW;
            out_hw(c, &OH, &OW);
            zs_tensor *x = zt_rand(dt, ZS_SHAPE(c->N, c->C, c->H, c->W), seed);
            zs_set_requires_grad(x, true);
            zs_pool2d_params p = c->p;
            zs_tensor *y = max ? zs_max_pool2d(x, &p) : zs_avg_pool2d(x, &p);
            memset(&p, 0xff, sizeof p); /* the node keeps its own copy */
            zs_tensor *gy = zt_rand_strided(dt, ZS_SHAPE(c->N, c->C, OH, OW), seed + 1);
            int64_t nx = zs_numel(x), ny = zs_numel(gy);
            double *xv = zt_values(x), *gyv = zt_values(gy);
            double *ry = malloc((size_t)ny * sizeof *ry);
            double *rgx = malloc((size_t)nx * sizeof *rgx);
            reference(c, max, xv, gyv, ry, rgx);
            pool_bw_attrs at = {c->p, c->H, c->W};
            zs_tensor *in[2] = {gy, y ? zsi_ctx_of(y)->saved[0] : NULL};
            zs_tensor *gx = y ? zsi_run(bw[max], 1 + max, in, &at) : NULL;
            double tol = dt == ZS_F32 ? 1e-6 : 1e-14;
            double e1 = gx ? zt_max_err(gx, rgx, nx) : INFINITY;
            bool ok = y && zs_backward(y, gy, false) == ZS_OK;
            double e2 = ok ? zt_max_err(zs_grad(x), rgx, nx) : INFINITY;
            ZT_CHECK(e1 <= tol && e2 <= tol && zt_shape_is(gx, 4, x->shape),
                     "%s case %zu %s: direct err %g, autograd err %g (seed %llu)",
                     bw[max]->op.name, ci, zs_dtype_name(dt), e1, e2,
                     (unsigned long long)seed);
            free(xv);
            free(gyv);
            free(ry);
            free(rgx);
            zs_release(gx);
            zs_release(gy);
            zs_release(y);
            zs_release(x);
        }
    /* errors: a gradient that does not fit, indices of the wrong dtype */
    zs_tensor *g = zs_ones(ZS_F32, ZS_SHAPE(2, 3, 4, 3));
    zs_tensor *gi = zs_ones(ZS_I32, ZS_SHAPE(2, 3, 4, 3));
    zs_tensor *i32 = zs_zeros(ZS_I32, ZS_SHAPE(2, 3, 4, 3));
    pool_bw_attrs at = {{{2, 2}, {0, 0}, {0, 0}, false}, 11, 7};
    ZT_EXPECT_ERROR(zsi_run(bw[0], 1, &g, &at) == NULL,
                    "avg_pool2d_backward: gradient [2, 3, 4, 3], expected "
                    "[2, 3, 5, 3] for input [2, 3, 11, 7]");
    at.H = 9;
    ZT_EXPECT_ERROR(zsi_run(bw[1], 2, (zs_tensor *[]){g, i32}, &at) == NULL,
                    "max_pool2d_backward: indices i32 [2, 3, 4, 3], expected i64");
    ZT_EXPECT_ERROR(zsi_run(bw[0], 1, &gi, &at) == NULL,
                    "avg_pool2d_backward: dtype i32");
    zs_release(g);
    zs_release(gi);
    zs_release(i32);
    ZT_CHECK(zs_autograd_live_nodes() == 0, "tape freed");
    zt_section("backward descriptors run directly vs float64 reference; errors");
}

static zs_tensor *gc_max(void *ctx, zs_tensor **in)
{
    return zs_max_pool2d(in[0], ctx);
}

static zs_tensor *gc_avg(void *ctx, zs_tensor **in)
{
    return zs_avg_pool2d(in[0], ctx);
}

static void test_grad(void)
{
    zs_pool2d_params ps[] = {
        {{2, 2}, {0, 0}, {0, 0}, false},
        {{3, 2}, {2, 1}, {1, 1}, false},
        {{3, 3}, {2, 2}, {1, 1}, true},
    };
    for (int i = 0; i < 3; i++) {
        zs_tensor *x = i == 1 ? zt_rand_strided(ZS_F64, ZS_SHAPE(2, 2, 5, 6), 20 + i)
                              : zt_rand(ZS_F64, ZS_SHAPE(2, 2, 5, 6), 20 + i);
        zs_set_requires_grad(x, true);
        char name[32];
        snprintf(name, sizeof name, "max params %d", i);
        ZT_GRADCHECK(name, gc_max, &ps[i], 1, &x);
        snprintf(name, sizeof name, "avg params %d", i);
        ZT_GRADCHECK(name, gc_avg, &ps[i], 1, &x);
        zs_release(x);
    }
    zt_section("gradient checks (f64)");
}

static void test_errors(void)
{
    zs_tensor *x = zs_ones(ZS_F32, ZS_SHAPE(2, 3, 9, 7));
    zs_tensor *x3 = zs_ones(ZS_F32, ZS_SHAPE(3, 9, 7));
    zs_tensor *xi = zs_ones(ZS_I32, ZS_SHAPE(2, 3, 9, 7));
    zs_pool2d_params ok = {{2, 2}, {0, 0}, {0, 0}, false};
    zs_pool2d_params k0 = {{0, 2}, {0, 0}, {0, 0}, false};
    zs_pool2d_params sneg = {{2, 2}, {-1, 1}, {0, 0}, false};
    zs_pool2d_params pad = {{3, 3}, {1, 1}, {2, 0}, false};
    zs_pool2d_params big = {{11, 3}, {1, 1}, {0, 0}, false};
    ZT_EXPECT_ERROR(zs_max_pool2d(x3, &ok) == NULL,
                    "max_pool2d: input [3, 9, 7] has 3 dims, expected 4");
    ZT_EXPECT_ERROR(zs_avg_pool2d(x, &k0) == NULL,
                    "avg_pool2d: kernel [0, 2] must be positive");
    ZT_EXPECT_ERROR(zs_max_pool2d(x, &sneg) == NULL, "stride [-1, 1]");
    ZT_EXPECT_ERROR(zs_max_pool2d(x, &pad) == NULL,
                    "padding [2, 0] must be in [0, kernel/2] for kernel [3, 3]");
    ZT_EXPECT_ERROR(zs_avg_pool2d(x, &big) == NULL,
                    "input [2, 3, 9, 7] is smaller than kernel [11, 3]");
    ZT_EXPECT_ERROR(zs_max_pool2d(x, NULL) == NULL, "params are NULL");
    ZT_EXPECT_ERROR(zs_avg_pool2d(xi, &ok) == NULL, "dtype i32");
    zs_set_error("first");
    ZT_CHECK(zs_max_pool2d(NULL, &ok) == NULL && !strcmp(zs_last_error(), "first"),
             "NULL input keeps the first error");
    zs_release(x);
    zs_release(x3);
    zs_release(xi);
    zt_section("errors");
}

/* ---- output shapes against the plain shape rule ----------------------- */

static void test_pool_shapes(void)
{
    const uint64_t seed = 1305;
    zt_irand_seed(seed);
    for (int trial = 0; trial < 30; trial++) {
        zs_scope_push();
        zs_pool2d_params p = {.kernel = {(int)zt_irand(1, 3), (int)zt_irand(1, 3)},
                              .stride = {(int)zt_irand(0, 2), (int)zt_irand(0, 2)}};
        p.padding[0] = (int)zt_irand(0, p.kernel[0] / 2);
        p.padding[1] = (int)zt_irand(0, p.kernel[1] / 2);
        int64_t N = zt_irand(1, 2), C = zt_irand(1, 3);
        int64_t H = zt_irand(p.kernel[0], 9), W = zt_irand(p.kernel[1], 9);
        int sh = p.stride[0] ? p.stride[0] : p.kernel[0];
        int sw = p.stride[1] ? p.stride[1] : p.kernel[1];
        int64_t e[4] = {N, C, (H + 2 * p.padding[0] - p.kernel[0]) / sh + 1,
                        (W + 2 * p.padding[1] - p.kernel[1]) / sw + 1};
        zs_tensor *x = zs_zeros(ZS_F32, ZS_SHAPE(N, C, H, W));
        ZT_CHECK(zt_shape_is(zs_max_pool2d(x, &p), 4, e) && zt_shape_is(zs_avg_pool2d(x, &p), 4, e),
                 "pool shape, seed %llu trial %d", (unsigned long long)seed, trial);
        zs_scope_pop();
    }
    zt_section("max_pool2d, avg_pool2d: output shapes on random shapes");
}

int main(void)
{
    int64_t before = zt_live_bytes();
    test_pool_shapes();
    test_reference();
    test_padding_never_wins();
    test_max_ties_nan();
    test_grad();
    test_backward_descriptors();
    test_errors();
    ZT_CHECK(zs_autograd_live_nodes() == 0, "tape freed: %lld nodes",
             (long long)zs_autograd_live_nodes());
    ZT_CHECK(zt_live_bytes() == before, "%lld bytes left",
             (long long)(zt_live_bytes() - before));
    return zt_done();
}
