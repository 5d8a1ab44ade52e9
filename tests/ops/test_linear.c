/*
 * test_linear.c - zs_linear, zs_linear_gelu, zs_linear_residual against a
 * float64 reference: odd sizes, 1-D, 2-D and 3-D inputs, with and without
 * bias, non-contiguous operands (strided copies, transposed x and w read in
 * place), shapes that reach the packed GEMM (two K blocks) and the GEMV
 * path (M = 1), f32 (fused epilogue) and f64 (composed); gradient checks in
 * f64 for every op and input; the f32 backward (which uses the
 * pre-activation stored by the GEMM epilogue) against the f64 one; the
 * cost model; error paths.
 *
 * Tolerances: f32 within 1e-6 + 5e-8 K of the reference relative to
 * max(1, |ref|): with inputs uniform in [-1, 1] the partial sums of a dot
 * product grow like sqrt(K) / 3, each of the K additions rounds by 2^-24
 * of that, and the roundings add like a random walk, so the absolute error
 * is near K 2^-24 / 3 (measured: 2.5e-5 at K = 1100); GeLU's derivative is
 * below 1.13. f64 1e-12. f32 gradients within 1e-4 (sums over M = 33 rows
 * and K = 40 of f32 products).
 */
#include <stdlib.h>

#include <string.h>

#include "testutil.h"

typedef enum kind { PLAIN, GELU, RESIDUAL } kind;
static const char *kind_name[] = {"linear", "linear_gelu", "linear_residual"};

static double gelu_d(double v)
{
    return 0.5 * v * (1.0 + tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)));
}

/* x [..., K], w [N, K], b [N] or NULL, r [..., N] or NULL -> malloc'd
 * row-major reference of the op. */
static double *reference(kind k, const zs_tensor *x, const zs_tensor *w,
                         const zs_tensor *b, const zs_tensor *r)
{
    int64_t N = w->shape[0], K = w->shape[1], M = zs_numel(x) / (K ? K : 1);
    double *xv = zt_values(x), *wv = zt_values(w);
    double *bv = b ? zt_values(b) : NULL, *rv = r ? zt_values(r) : NULL;
    double *out = malloc((size_t)(M * N + 1) * sizeof *out);
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            double s = bv ? bv[j] : 0;
            for (int64_t q = 0; q < K; q++)
                s += xv[i * K + q] * wv[j * K + q];
            if (k == GELU)
                s = gelu_d(s);
            if (k == RESIDUAL)
                s += rv[i * N + j];
            out[i * N + j] = s;
        }
    free(xv);
    free(wv);
    free(bv);
    free(rv);
    return out;
}

static zs_tensor *apply(kind k, zs_tensor *x, zs_tensor *w, zs_tensor *b,
                        zs_tensor *r)
{
    switch (k) {
    case GELU: return zs_linear_gelu(x, w, b);
    case RESIDUAL: return zs_linear_residual(x, w, b, r);
    default: return zs_linear(x, w, b);
    }
}

/* x shape (nx dims, last = K) and N */
typedef struct lin_case {
    int nx;
    int64_t x[3];
    int64_t N;
} lin_case;

static const lin_case cases[] = {
    {2, {7, 13}, 5},     {3, {2, 3, 13}, 17}, {1, {13}, 5},
    {2, {1, 9}, 70},     {2, {70, 1}, 3},     {2, {65, 300}, 130},
    {2, {45, 1100}, 33},
};
#define NCASES (int)(sizeof cases / sizeof *cases)

/* A [rows, cols] tensor stored transposed (a transposed view). */
static zs_tensor *rand_transposed(zs_dtype dt, int64_t rows, int64_t cols,
                                  uint64_t seed)
{
    zs_tensor *t = zt_rand(dt, 2, (int64_t[]){cols, rows}, seed);
    zs_tensor *v = zs_transpose(t, 0, 1);
    zs_release(t);
    return v;
}

/* layout: 0 contiguous, 1 strided copies of everything, 2 transposed x
 * and w (2-D x only) */
static void forward_case(zs_dtype dt, int c, kind k, bool bias, int layout)
{
    const lin_case *lc = &cases[c];
    int64_t K = lc->x[lc->nx - 1], N = lc->N, oshape[3];
    memcpy(oshape, lc->x, sizeof oshape);
    oshape[lc->nx - 1] = N;
    uint64_t seed = 100 * (uint64_t)c + 10 * (uint64_t)k + (uint64_t)layout;
    zs_tensor *x, *w;
    if (layout == 2) {
        x = rand_transposed(dt, lc->x[0], K, seed);
        w = rand_transposed(dt, N, K, seed + 1);
    } else if (layout == 1) {
        x = zt_rand_strided(dt, lc->nx, lc->x, seed);
        w = zt_rand_strided(dt, 2, (int64_t[]){N, K}, seed + 1);
    } else {
        x = zt_rand(dt, lc->nx, lc->x, seed);
        w = zt_rand(dt, 2, (int64_t[]){N, K}, seed + 1);
    }
    zs_tensor *b = !bias ? NULL
                   : layout == 1 ? zt_rand_strided(dt, 1, &N, seed + 2)
                                 : zt_rand(dt, 1, &N, seed + 2);
    zs_tensor *r = k != RESIDUAL ? NULL
                   : layout == 1 ? zt_rand_strided(dt, lc->nx, oshape, seed + 3)
                                 : zt_rand(dt, lc->nx, oshape, seed + 3);
    zs_tensor *o = apply(k, x, w, b, r);
    bool shape_ok = o && o->ndim == lc->nx && o->dtype == dt;
    for (int d = 0; shape_ok && d < lc->nx; d++)
        shape_ok = o->shape[d] == oshape[d];
    ZT_CHECK(shape_ok, "%s %s case %d: result shape", kind_name[k],
             zs_dtype_name(dt), c);
    if (shape_ok) {
        double *ref = reference(k, x, w, b, r);
        double err = zt_max_err(o, ref, zs_numel(o));
        double tol = dt == ZS_F32 ? 1e-6 + 5e-8 * (double)K : 1e-12;
        ZT_CHECK(err <= tol, "%s %s case %d bias=%d layout %d: error %.3g "
                 "(seed %llu)", kind_name[k], zs_dtype_name(dt), c, bias,
                 layout, err, (unsigned long long)seed);
        free(ref);
    }
    zs_release(o);
    zs_release(x);
    zs_release(w);
    zs_release(b);
    zs_release(r);
}

static void test_forward(zs_dtype dt)
{
    for (int c = 0; c < NCASES; c++)
        for (int k = 0; k < 3; k++)
            for (int bias = 0; bias < 2; bias++)
                for (int layout = 0; layout < 3; layout++) {
                    if (layout == 2 && cases[c].nx != 2)
                        continue;
                    if (dt == ZS_F64 && cases[c].x[cases[c].nx - 1] > 300)
                        continue; /* f64 is the composed path: kept small */
                    forward_case(dt, c, (kind)k, bias, layout);
                }
    zt_section(dt == ZS_F32 ? "linear ops forward f32 (fused)"
                            : "linear ops forward f64 (composed)");
}

/* ---- gradients --------------------------------------------------------- */

/* in: x, w, [b], [r]; view transposes a 2-D x leaf stored [K, M] */
typedef struct gctx {
    kind k;
    bool bias, view;
} gctx;

static zs_tensor *lin_fn(void *p, zs_tensor **in)
{
    const gctx *g = p;
    zs_tensor *x = g->view ? zs_transpose(in[0], 0, 1) : zs_retain(in[0]);
    zs_tensor *b = g->bias ? in[2] : NULL;
    zs_tensor *r = g->k == RESIDUAL ? in[g->bias ? 3 : 2] : NULL;
    zs_tensor *o = apply(g->k, x, in[1], b, r);
    zs_release(x);
    return o;
}

static void gradcheck_case(int c, gctx g)
{
    const lin_case *lc = &cases[c];
    int64_t K = lc->x[lc->nx - 1], N = lc->N, oshape[3], xs[3];
    memcpy(oshape, lc->x, sizeof oshape);
    oshape[lc->nx - 1] = N;
    memcpy(xs, lc->x, sizeof xs);
    if (g.view) {
        xs[0] = lc->x[1];
        xs[1] = lc->x[0];
    }
    uint64_t seed = 1000 + 10 * (uint64_t)c + (uint64_t)g.k;
    zs_tensor *in[4];
    int n = 0;
    in[n++] = zt_rand(ZS_F64, lc->nx, xs, seed);
    in[n++] = zt_rand(ZS_F64, 2, (int64_t[]){N, K}, seed + 1);
    if (g.bias)
        in[n++] = zt_rand(ZS_F64, 1, &N, seed + 2);
    if (g.k == RESIDUAL)
        in[n++] = zt_rand(ZS_F64, lc->nx, oshape, seed + 3);
    for (int i = 0; i < n; i++)
        zs_set_requires_grad(in[i], true);
    char what[96];
    snprintf(what, sizeof what, "%s case %d bias=%d view=%d", kind_name[g.k],
             c, g.bias, g.view);
    ZT_GRADCHECK(what, lin_fn, &g, n, in);
    for (int i = 0; i < n; i++)
        zs_release(in[i]);
}

static void test_gradients(void)
{
    for (int c = 0; c < 5; c++) /* the small cases */
        for (int k = 0; k < 3; k++)
            for (int bias = 0; bias < 2; bias++) {
                gradcheck_case(c, (gctx){(kind)k, bias, false});
                if (cases[c].nx == 2 && bias)
                    gradcheck_case(c, (gctx){(kind)k, bias, true});
            }
    zt_section("linear ops gradients (f64, every input)");
}

/* f32 backward (fused forward, epilogue-stored pre-activation) against the
 * f64 backward on the same values. */
static void test_f32_backward(void)
{
    int64_t xs[3] = {3, 11, 40}, N = 37, K = 40;
    for (int k = 0; k < 3; k++) {
        zs_tensor *in[2][4];
        for (int p = 0; p < 2; p++) {
            zs_dtype dt = p ? ZS_F64 : ZS_F32;
            in[p][0] = zt_rand(dt, 3, xs, 50);
            in[p][1] = zt_rand(dt, 2, (int64_t[]){N, K}, 51);
            in[p][2] = zt_rand(dt, 1, &N, 52);
            in[p][3] = zt_rand(dt, 3, (int64_t[]){3, 11, N}, 53);
            for (int i = 0; i < 4; i++)
                zs_set_requires_grad(in[p][i], true);
            zs_tensor *o = apply((kind)k, in[p][0], in[p][1], in[p][2],
                                 in[p][3]);
            zs_tensor *l = zs_sum(o, 0, NULL, false);
            ZT_CHECK(l && zs_backward(l, NULL, false) == ZS_OK, "backward");
            zs_release(o);
            zs_release(l);
        }
        for (int i = 0; i < (k == RESIDUAL ? 4 : 3); i++) {
            zs_tensor *g32 = zs_grad(in[0][i]), *g64 = zs_grad(in[1][i]);
            ZT_CHECK(g32 && g64, "%s: grad of input %d", kind_name[k], i);
            if (g32 && g64) {
                double *ref = zt_values(g64);
                double err = zt_max_err(g32, ref, zs_numel(g64));
                ZT_CHECK(err <= 1e-4, "%s f32 grad of input %d: error %.3g",
                         kind_name[k], i, err);
                free(ref);
            }
        }
        for (int p = 0; p < 2; p++)
            for (int i = 0; i < 4; i++)
                zs_release(in[p][i]);
    }
    ZT_CHECK(zs_autograd_live_nodes() == 0, "tape freed");
    zt_section("linear ops f32 backward vs f64");
}

/* The f32 GeLU backward runs one fused pass (linear_gelu_backward, the
 * vector zsk_gelu_tanh_bw of the ISA the cap allows) and, with a random
 * upstream gradient (not the ones of a plain sum) over an odd number of
 * elements (3 x 11 x 37: vector tails on 8 and 16 lanes), matches the f64
 * backward (unary_deriv, evaluated in double) within 1e-4 (as above; the
 * kernel's own error is ~3e-7 relative). ctest reruns this under
 * ZS_CPU_ISA=avx2 and portable. */
static void test_f32_gelu_backward(void)
{
    int64_t xs[3] = {3, 11, 40}, os[3] = {3, 11, 37}, N = 37, K = 40;
    zs_tensor *in[2][3], *gx[2] = {NULL, NULL}, *gw[2] = {NULL, NULL};
    int fused = -1;
    for (int p = 0; p < 2; p++) {
        zs_dtype dt = p ? ZS_F64 : ZS_F32;
        in[p][0] = zt_rand(dt, 3, xs, 60);
        in[p][1] = zt_rand(dt, 2, (int64_t[]){N, K}, 61);
        in[p][2] = zt_rand(dt, 3, os, 62); /* upstream gradient */
        zs_set_requires_grad(in[p][0], true);
        zs_set_requires_grad(in[p][1], true);
        zs_profile_reset();
        zs_profile_enable(true);
        zs_tensor *o = zs_linear_gelu(in[p][0], in[p][1], NULL);
        ZT_CHECK(o && zs_backward(o, in[p][2], false) == ZS_OK, "backward");
        zs_profile_enable(false);
        zs_op_stat st[64];
        int n = zs_profile_stats(st, 64);
        for (int i = 0; i < n && p == 0; i++)
            if (!strcmp(st[i].name, "linear_gelu_backward"))
                fused = (int)st[i].calls;
        zs_release(o);
        gx[p] = zs_grad(in[p][0]);
        gw[p] = zs_grad(in[p][1]);
    }
    ZT_CHECK(fused == 1, "f32 GeLU backward: linear_gelu_backward ran %d "
             "times, expected 1", fused);
    zs_tensor *g32[2] = {gx[0], gw[0]}, *g64[2] = {gx[1], gw[1]};
    for (int i = 0; i < 2; i++) {
        ZT_CHECK(g32[i] && g64[i], "grad of input %d", i);
        if (!g32[i] || !g64[i])
            continue;
        double *ref = zt_values(g64[i]);
        double err = zt_max_err(g32[i], ref, zs_numel(g64[i]));
        ZT_CHECK(err <= 1e-4, "linear_gelu f32 grad of input %d with a "
                 "random upstream gradient: error %.3g", i, err);
        printf("  linear_gelu f32 grad %s vs f64: max error %.3g\n",
               i ? "w" : "x", err);
        free(ref);
    }
    for (int p = 0; p < 2; p++)
        for (int i = 0; i < 3; i++)
            zs_release(in[p][i]);
    zt_section("linear_gelu f32 backward (fused, vector) vs f64");
}

static void test_cost_model(void)
{
    int64_t M = 6, K = 10, N = 4;
    zs_tensor *x = zt_rand(ZS_F32, 2, (int64_t[]){M, K}, 1);
    zs_tensor *w = zt_rand(ZS_F32, 2, (int64_t[]){N, K}, 2);
    zs_tensor *b = zt_rand(ZS_F32, 1, &N, 3);
    zs_profile_reset();
    zs_profile_enable(true);
    zs_tensor *o = zs_linear_gelu(x, w, b);
    zs_profile_enable(false);
    zs_op_stat st[64];
    int n = zs_profile_stats(st, 64);
    double flops = -1;
    for (int i = 0; i < n; i++)
        if (!strcmp(st[i].name, "linear_gelu"))
            flops = st[i].flops;
    double want = 2.0 * M * N * K + M * N + 30.0 * M * N;
    ZT_CHECK(flops == want, "linear_gelu FLOPs %g, expected %g", flops, want);
    zs_profile_reset();
    zs_release(o);
    zs_release(x);
    zs_release(w);
    zs_release(b);
    zt_section("linear cost model");
}

static void test_errors(void)
{
    zs_tensor *x = zt_rand(ZS_F32, ZS_SHAPE(7, 13), 1);
    zs_tensor *w = zt_rand(ZS_F32, ZS_SHAPE(5, 13), 2);
    zs_tensor *w12 = zt_rand(ZS_F32, ZS_SHAPE(5, 12), 3);
    zs_tensor *w1 = zt_rand(ZS_F32, ZS_SHAPE(13), 4);
    zs_tensor *b4 = zt_rand(ZS_F32, ZS_SHAPE(4), 5);
    zs_tensor *b2d = zt_rand(ZS_F32, ZS_SHAPE(1, 5), 6);
    zs_tensor *r = zt_rand(ZS_F32, ZS_SHAPE(7, 4), 7);
    zs_tensor *r3 = zt_rand(ZS_F32, ZS_SHAPE(1, 7, 5), 8);
    zs_tensor *wd = zt_rand(ZS_F64, ZS_SHAPE(5, 13), 9);
    zs_tensor *s = zs_scalar(ZS_F32, 1.0);
    ZT_EXPECT_ERROR(!zs_linear(x, w12, NULL),
                    "linear: input [7, 13] and weight [5, 12] do not match");
    ZT_EXPECT_ERROR(!zs_linear_gelu(x, w12, NULL), "expected weight [5, 13]");
    ZT_EXPECT_ERROR(!zs_linear(x, w1, NULL), "weight [13] must be 2-D");
    ZT_EXPECT_ERROR(!zs_linear(s, w, NULL), "input [] needs at least 1 dim");
    ZT_EXPECT_ERROR(!zs_linear(x, w, b4),
                    "bias [4] does not match weight [5, 13], expected [5]");
    ZT_EXPECT_ERROR(!zs_linear_gelu(x, w, b2d), "bias [1, 5] does not match");
    ZT_EXPECT_ERROR(!zs_linear_residual(x, w, NULL, r),
                    "linear_residual: residual [7, 4] does not match the "
                    "output [7, 5]");
    ZT_EXPECT_ERROR(!zs_linear_residual(x, w, NULL, r3),
                    "residual [1, 7, 5] does not match");
    ZT_EXPECT_ERROR(!zs_linear(x, wd, NULL), "dtypes f32 and f64 differ");
    zs_set_error("earlier");
    ZT_CHECK(!zs_linear(NULL, w, NULL) && !zs_linear_gelu(x, NULL, NULL) &&
                 !zs_linear_residual(x, w, NULL, NULL),
             "NULL input gives NULL");
    ZT_CHECK(!strcmp(zs_last_error(), "earlier"), "NULL input sets no error");
    zs_tensor *all[] = {x, w, w12, w1, b4, b2d, r, r3, wd, s};
    for (int i = 0; i < 10; i++)
        zs_release(all[i]);
    zt_section("linear errors");
}

/* ---- output shapes against the plain shape rule ----------------------- */

static void test_linear_shapes(void)
{
    const uint64_t seed = 1308;
    zt_irand_seed(seed);
    for (int trial = 0; trial < 20; trial++) {
        zs_scope_push();
        int nd = (int)zt_irand(1, 4);
        int64_t s[4], e[4], N = zt_irand(1, 9);
        for (int d = 0; d < nd; d++)
            s[d] = zt_irand(1, 5);
        memcpy(e, s, sizeof s);
        e[nd - 1] = N; /* [..., K] -> [..., N] */
        zs_tensor *x = zs_zeros(ZS_F32, nd, s), *b = zs_zeros(ZS_F32, 1, &N);
        zs_tensor *w = zs_zeros(ZS_F32, 2, (int64_t[]){N, s[nd - 1]});
        ZT_CHECK(zt_shape_is(zs_linear(x, w, b), nd, e) && zt_shape_is(zs_linear_gelu(x, w, NULL), nd, e) &&
                 zt_shape_is(zs_linear_residual(x, w, b, zs_zeros(ZS_F32, nd, e)), nd, e),
                 "linear shape, seed %llu trial %d", (unsigned long long)seed, trial);
        zs_scope_pop();
    }
    zt_section("linear, linear_gelu, linear_residual: [..., N] on random shapes");
}

int main(void)
{
    int64_t live0 = zt_live_bytes();
    test_linear_shapes();
    test_forward(ZS_F32);
    test_forward(ZS_F64);
    test_gradients();
    test_f32_backward();
    test_f32_gelu_backward();
    test_cost_model();
    test_errors();
    ZT_CHECK(zt_live_bytes() == live0, "live bytes %lld -> %lld",
             (long long)live0, (long long)zt_live_bytes());
    return zt_done();
}
