/*
 * test_conv.c - zs_conv2d forward and backward (x, w, bias gradients)
 * against a naive float64 direct convolution: odd sizes, stride, padding,
 * dilation, groups (grouped and depthwise), with and without bias,
 * non-contiguous inputs, 1x1 kernels, column tiling, both threading
 * modes; f64 gradient checks; the cost model; the descriptor
 * conv2d_backward run directly for every subset of gradients (strided x
 * and g) and through autograd with some inputs frozen; error paths;
 * bf16 and f16 (f32 accumulation) against the same reference.
 */
#include <stdlib.h>

#include "kernels/cpu/conv.h"
#include <string.h>

#include "ops/op.h"
#include "testutil.h"

/* The attributes of conv2d_backward (ops/conv.c). */
typedef struct conv_bw_attrs {
    zs_conv2d_params p;
    bool gx, gw, gb;
} conv_bw_attrs;

typedef struct conv_case {
    int64_t N, C, H, W, O, KH, KW;
    zs_conv2d_params p;
    bool bias;
} conv_case;

static const conv_case cases[] = {
    {2, 3, 9, 7, 5, 3, 3, {{0, 0}, {0, 0}, {0, 0}, 0}, true},
    {2, 3, 9, 7, 5, 5, 2, {{2, 2}, {1, 2}, {1, 1}, 1}, false},
    {2, 3, 9, 7, 5, 3, 3, {{2, 1}, {2, 2}, {2, 2}, 1}, true},
    {2, 6, 9, 7, 9, 3, 3, {{1, 1}, {1, 1}, {1, 1}, 3}, true},  /* groups 3 */
    {3, 4, 9, 7, 4, 3, 3, {{2, 2}, {1, 1}, {1, 2}, 4}, false}, /* depthwise */
    {2, 3, 9, 7, 5, 1, 1, {{1, 1}, {0, 0}, {1, 1}, 1}, true},  /* direct 1x1 */
    {2, 3, 9, 7, 6, 1, 1, {{2, 1}, {0, 1}, {1, 1}, 3}, false},
    {1, 3, 9, 7, 5, 3, 3, {{1, 1}, {1, 1}, {1, 1}, 1}, true},  /* N = 1 */
    /* K = 576, 40x40 maps: the f64 column buffer is tiled (22 rows) */
    {2, 64, 40, 40, 8, 3, 3, {{1, 1}, {1, 1}, {1, 1}, 1}, true},
};

/* Shapes for the direct f32 path (conv_direct.c): channel counts that
 * leave partial 32- and 16-lane panels (C = 37, O = 45, 18, 33), output
 * rows longer than a 14-pixel tile (OW = 31), strides 2 and (1, 2) with
 * their input-gradient phases, dilation across and along rows, padding as
 * wide as the kernel, a strided 1x1 kernel whose odd-phase pixels no tap
 * reaches, and two shapes it hands to the GEMM path (stride 3, 81 taps). */
static const conv_case direct_cases[] = {
    {3, 37, 11, 31, 45, 3, 3, {{1, 1}, {1, 1}, {1, 1}, 1}, true},
    {2, 20, 13, 17, 18, 3, 5, {{2, 2}, {2, 1}, {1, 2}, 1}, false},
    {2, 17, 10, 12, 33, 2, 4, {{1, 2}, {0, 3}, {2, 1}, 1}, true},
    {2, 16, 7, 9, 20, 1, 1, {{2, 2}, {1, 0}, {1, 1}, 1}, false},
    {2, 16, 12, 12, 16, 3, 3, {{3, 3}, {1, 1}, {1, 1}, 1}, true},
    {1, 2, 12, 12, 3, 9, 9, {{1, 1}, {4, 4}, {1, 1}, 1}, true},
};

static int pv(int v) { return v ? v : 1; }

static int64_t out_size(int64_t n, int64_t k, int s, int p, int d)
{
    return (n + 2 * p - pv(d) * (k - 1) - 1) / pv(s) + 1;
}

/* Direct convolution and its gradients for the upstream gradient gy:
 * y, gx, gw, gb (any may be NULL). Arrays are row-major. */
static void reference(const conv_case *c, const double *x, const double *w,
                      const double *b, const double *gy, double *y,
                      double *gx, double *gw, double *gb)
{
    int G = pv(c->p.groups), sh = pv(c->p.stride[0]), sw = pv(c->p.stride[1]);
    int dh = pv(c->p.dilation[0]), dw = pv(c->p.dilation[1]);
    int ph = c->p.padding[0], pw = c->p.padding[1];
    int64_t OH = out_size(c->H, c->KH, sh, ph, dh);
    int64_t OW = out_size(c->W, c->KW, sw, pw, dw);
    int64_t Cg = c->C / G, Og = c->O / G;
    if (gx)
        memset(gx, 0, (size_t)(c->N * c->C * c->H * c->W) * sizeof *gx);
    if (gw)
        memset(gw, 0, (size_t)(c->O * Cg * c->KH * c->KW) * sizeof *gw);
    if (gb)
        memset(gb, 0, (size_t)c->O * sizeof *gb);
    for (int64_t n = 0; n < c->N; n++)
        for (int64_t o = 0; o < c->O; o++)
            for (int64_t oh = 0; oh < OH; oh++)
                for (int64_t ow = 0; ow < OW; ow++) {
                    int64_t yi = ((n * c->O + o) * OH + oh) * OW + ow;
                    double acc = b ? b[o] : 0, g = gy ? gy[yi] : 0;
                    if (gb)
                        gb[o] += g;
                    for (int64_t ci = 0; ci < Cg; ci++)
                        for (int64_t kh = 0; kh < c->KH; kh++)
                            for (int64_t kw = 0; kw < c->KW; kw++) {
                                int64_t ih = oh * sh - ph + kh * dh;
                                int64_t iw = ow * sw - pw + kw * dw;
                                if (ih < 0 || ih >= c->H || iw < 0 || iw >= c->W)
                                    continue;
                                int64_t ch = o / Og * Cg + ci;
                                int64_t xi = ((n * c->C + ch) * c->H + ih) * c->W + iw;
                                int64_t wi = ((o * Cg + ci) * c->KH + kh) * c->KW + kw;
                                acc += x[xi] * w[wi];
                                if (gx)
                                    gx[xi] += g * w[wi];
                                if (gw)
                                    gw[wi] += g * x[xi];
                            }
                    if (y)
                        y[yi] = acc;
                }
}

/* max |t - ref| / max |ref| (0 when both are zero). */
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

/* x as a [N, C, H, W] view of a transposed [N, C, W, H] buffer. */
static zs_tensor *transposed_input(zs_dtype dt, const conv_case *c,
                                   uint64_t seed)
{
    zs_tensor *base = zt_rand(dt, ZS_SHAPE(c->N, c->C, c->W, c->H), seed);
    zs_tensor *x = zs_transpose(base, 2, 3);
    zs_release(base);
    return x;
}

/* Forward and backward of case c vs the reference; layout 0: contiguous,
 * 1: transposed view, 2: zt_rand_strided. */
static void check_one(const conv_case *c, size_t ci, zs_dtype dt, int layout)
{
    uint64_t seed = 100 + 10 * ci;
    zs_tensor *x = layout == 1 ? transposed_input(dt, c, seed)
                   : layout == 2 ? zt_rand_strided(dt, ZS_SHAPE(c->N, c->C, c->H, c->W), seed)
                                 : zt_rand(dt, ZS_SHAPE(c->N, c->C, c->H, c->W), seed);
    int G = pv(c->p.groups);
    zs_tensor *w = zt_rand(dt, ZS_SHAPE(c->O, c->C / G, c->KH, c->KW), seed + 1);
    zs_tensor *b = c->bias ? zt_rand(dt, ZS_SHAPE(c->O), seed + 2) : NULL;
    zs_set_requires_grad(x, true);
    zs_set_requires_grad(w, true);
    if (b)
        zs_set_requires_grad(b, true);
    zs_tensor *y = zs_conv2d(x, w, b, &c->p);
    int64_t OH = out_size(c->H, c->KH, c->p.stride[0], c->p.padding[0], c->p.dilation[0]);
    int64_t OW = out_size(c->W, c->KW, c->p.stride[1], c->p.padding[1], c->p.dilation[1]);
    int64_t ny = c->N * c->O * OH * OW;
    zs_tensor *gy = zt_rand(dt, ZS_SHAPE(c->N, c->O, OH, OW), seed + 3);
    double *xv = zt_values(x), *wv = zt_values(w), *bv = b ? zt_values(b) : NULL;
    double *gyv = zt_values(gy);
    double *ry = malloc((size_t)ny * sizeof *ry);
    double *rgx = malloc((size_t)zs_numel(x) * sizeof *rgx);
    double *rgw = malloc((size_t)zs_numel(w) * sizeof *rgw);
    double *rgb = malloc((size_t)c->O * sizeof *rgb);
    reference(c, xv, wv, bv, gyv, ry, rgx, rgw, rgb);
    /* bf16 / f16: the reference reads the same rounded inputs; f32
     * accumulation (1e-5 as f32) and one rounding of each result, at most
     * 2^-8 (bf16) or 2^-11 (f16) of max |ref|: twice that */
    double tol = dt == ZS_F32 ? 1e-5 : dt == ZS_F64 ? 1e-12
               : dt == ZS_BF16 ? 0x1p-7 : 0x1p-10;
    double ey = rel_err(y, ry, ny);
    ZT_CHECK(y && y->shape[2] == OH && y->shape[3] == OW && ey <= tol,
             "case %zu %s layout %d threads %d: forward err %g (seed %llu)", ci,
             zs_dtype_name(dt), layout, zs_num_threads(), ey,
             (unsigned long long)seed);
    ZT_CHECK(y && zs_backward(y, gy, false) == ZS_OK, "case %zu backward", ci);
    double ex = rel_err(zs_grad(x), rgx, zs_numel(x));
    double ew = rel_err(zs_grad(w), rgw, zs_numel(w));
    double eb = b ? rel_err(zs_grad(b), rgb, c->O) : 0;
    ZT_CHECK(ex <= tol && ew <= tol && eb <= tol,
             "case %zu %s layout %d threads %d: grad err x %g w %g b %g "
             "(seed %llu)", ci, zs_dtype_name(dt), layout, zs_num_threads(),
             ex, ew, eb, (unsigned long long)seed);
    free(xv);
    free(wv);
    free(bv);
    free(gyv);
    free(ry);
    free(rgx);
    free(rgw);
    free(rgb);
    zs_release(x);
    zs_release(w);
    zs_release(b);
    zs_release(y);
    zs_release(gy);
}

static void check_case(size_t ci, zs_dtype dt, int layout)
{
    check_one(&cases[ci], ci, dt, layout);
}

static void test_reference(void)
{
    int nt = zs_num_threads();
    size_t ncases = sizeof cases / sizeof *cases;
    for (size_t ci = 0; ci < ncases; ci++) {
        check_case(ci, ZS_F32, 0);
        check_case(ci, ZS_F64, 0);
        if (ci + 1 < ncases) {
            check_case(ci, ZS_F32, 1);
            check_case(ci, ZS_F64, 2);
        }
    }
    zt_section("forward and backward vs float64 reference");
    /* The other threading mode: one thread runs every image through the
     * (serial) GEMM path; three threads split the batch unevenly. */
    int other[] = {1, 3};
    for (int k = 0; k < 2; k++) {
        zs_set_num_threads(other[k]);
        for (size_t ci = 0; ci + 1 < ncases; ci++)
            check_case(ci, ZS_F32, ci % 2);
        check_case(ncases - 1, ZS_F64, 0);
    }
    zs_set_num_threads(nt);
    zt_section("forward and backward with 1 and 3 threads");
}

/* The direct path and the GEMM path, each against the reference, on the
 * shapes of both tables (cases 100+ are direct_cases), 1 and 2 threads. */
static void test_paths(void)
{
    int nt = zs_num_threads();
    size_t nc = sizeof cases / sizeof *cases;
    size_t nd = sizeof direct_cases / sizeof *direct_cases;
    for (int threads = 1; threads <= 2; threads++) {
        zs_set_num_threads(threads);
        for (int direct = 0; direct < 2; direct++) {
            zsk_conv_set_direct(direct);
            for (size_t ci = 0; ci < nd; ci++)
                check_one(&direct_cases[ci], 100 + ci, ZS_F32, (int)ci % 3);
            for (size_t ci = 0; ci < nc; ci++)
                check_case(ci, ZS_F32, 1 + (int)ci % 2);
        }
    }
    zsk_conv_set_direct(true);
    zs_set_num_threads(nt);
    zt_section("direct and GEMM paths (f32), 1 and 2 threads");
}

/* bf16 and f16 (16-bit GEMMs, f32 accumulation, results rounded once) on
 * every case and layout, with 2 and 1 threads (both threading modes). */
static void test_lowp(void)
{
    int nt = zs_num_threads();
    size_t nc = sizeof cases / sizeof *cases;
    size_t nd = sizeof direct_cases / sizeof *direct_cases;
    int threads[2] = {nt, 1};
    for (int k = 0; k < (nt > 1 ? 2 : 1); k++) {
        zs_set_num_threads(threads[k]);
        for (size_t ci = 0; ci < nc; ci++) {
            check_case(ci, ZS_BF16, (int)ci % 3);
            check_case(ci, ZS_F16, (int)(ci + 1) % 3);
        }
        for (size_t ci = 0; ci < nd; ci++)
            check_one(&direct_cases[ci], 100 + ci, ci % 2 ? ZS_F16 : ZS_BF16,
                      (int)ci % 3);
    }
    zs_set_num_threads(nt);
    zt_section("bf16 and f16 forward and backward vs float64 reference");
}

typedef struct gc_ctx {
    zs_conv2d_params p;
    bool bias;
} gc_ctx;

static zs_tensor *gc_conv(void *ctx, zs_tensor **in)
{
    gc_ctx *c = ctx;
    return zs_conv2d(in[0], in[1], c->bias ? in[2] : NULL, &c->p);
}

static void gradcheck_case(const char *name, const conv_case *c, bool strided,
                           bool gx, bool gw, uint64_t seed)
{
    int G = pv(c->p.groups);
    zs_tensor *x = strided ? zt_rand_strided(ZS_F64, ZS_SHAPE(c->N, c->C, c->H, c->W), seed)
                           : zt_rand(ZS_F64, ZS_SHAPE(c->N, c->C, c->H, c->W), seed);
    zs_tensor *w = zt_rand(ZS_F64, ZS_SHAPE(c->O, c->C / G, c->KH, c->KW), seed + 1);
    zs_tensor *b = c->bias ? zt_rand(ZS_F64, ZS_SHAPE(c->O), seed + 2) : NULL;
    zs_set_requires_grad(x, gx);
    zs_set_requires_grad(w, gw);
    if (b)
        zs_set_requires_grad(b, true);
    gc_ctx ctx = {c->p, c->bias};
    ZT_GRADCHECK(name, gc_conv, &ctx, b ? 3 : 2, ((zs_tensor *[]){x, w, b}));
    zs_release(x);
    zs_release(w);
    zs_release(b);
}

static void test_grad(void)
{
    conv_case plain = {2, 2, 5, 4, 3, 3, 2, {{0, 0}, {0, 0}, {0, 0}, 0}, true};
    conv_case strided = {2, 2, 6, 5, 3, 3, 2, {{2, 1}, {1, 1}, {1, 2}, 1}, true};
    conv_case grouped = {1, 4, 5, 5, 2, 2, 2, {{1, 2}, {1, 0}, {1, 1}, 2}, false};
    conv_case depth = {2, 3, 6, 5, 3, 3, 3, {{2, 2}, {2, 1}, {2, 1}, 3}, true};
    conv_case one = {2, 3, 3, 4, 2, 1, 1, {{0, 0}, {0, 0}, {0, 0}, 0}, true};
    gradcheck_case("plain", &plain, false, true, true, 1);
    gradcheck_case("stride/pad/dilation", &strided, false, true, true, 2);
    gradcheck_case("groups 2", &grouped, false, true, true, 3);
    gradcheck_case("depthwise", &depth, false, true, true, 4);
    gradcheck_case("1x1 strided input", &one, true, true, true, 5);
    gradcheck_case("x only", &strided, true, true, false, 6);
    gradcheck_case("w and bias only", &depth, false, false, true, 7);
    zt_section("gradient checks (f64)");
}

static void test_cost_model(void)
{
    zs_profile_reset();
    zs_profile_enable(true);
    zs_tensor *x = zt_rand(ZS_F32, ZS_SHAPE(2, 6, 9, 7), 1);
    zs_tensor *w = zt_rand(ZS_F32, ZS_SHAPE(4, 3, 3, 2), 2);
    zs_tensor *b = zt_rand(ZS_F32, ZS_SHAPE(4), 3);
    zs_conv2d_params p = {{2, 1}, {1, 0}, {1, 1}, 2};
    zs_tensor *y = zs_conv2d(x, w, b, &p); /* [2, 4, 5, 6] */
    zs_op_stat st[64];
    int n = zs_profile_stats(st, 64);
    double flops = -1, bytes = -1;
    for (int i = 0; i < n; i++)
        if (!strcmp(st[i].name, "conv2d")) {
            flops = st[i].flops;
            bytes = st[i].bytes;
        }
    double want = 2.0 * 2 * 4 * 5 * 6 * 3 * 3 * 2 + 2 * 4 * 5 * 6;
    double want_bytes = 4.0 * (2 * 6 * 9 * 7 + 4 * 3 * 3 * 2 + 4 + 2 * 4 * 5 * 6);
    ZT_CHECK(y && y->shape[2] == 5 && y->shape[3] == 6, "output shape");
    ZT_CHECK(flops == want && bytes == want_bytes,
             "cost: flops %g (want %g), bytes %g (want %g)", flops, want,
             bytes, want_bytes);
    zs_profile_enable(false);
    zs_release(x);
    zs_release(w);
    zs_release(b);
    zs_release(y);
    zt_section("cost model");
}

static void test_errors(void)
{
    zs_tensor *x = zs_ones(ZS_F32, ZS_SHAPE(2, 3, 9, 7));
    zs_tensor *x3 = zs_ones(ZS_F32, ZS_SHAPE(2, 3, 9));
    zs_tensor *xd = zs_ones(ZS_F64, ZS_SHAPE(2, 3, 9, 7));
    zs_tensor *w = zs_ones(ZS_F32, ZS_SHAPE(5, 3, 3, 3));
    zs_tensor *w3 = zs_ones(ZS_F32, ZS_SHAPE(5, 3, 3));
    zs_tensor *wc = zs_ones(ZS_F32, ZS_SHAPE(5, 2, 3, 3));
    zs_tensor *wbig = zs_ones(ZS_F32, ZS_SHAPE(5, 3, 11, 3));
    zs_tensor *b4 = zs_ones(ZS_F32, ZS_SHAPE(4));
    zs_tensor *xi = zs_ones(ZS_I32, ZS_SHAPE(2, 3, 9, 7));
    zs_conv2d_params g2 = {.groups = 2}, neg = {.stride = {-1, 1}};
    zs_conv2d_params dil = {.dilation = {5, 1}};
    ZT_EXPECT_ERROR(zs_conv2d(x3, w, NULL, NULL) == NULL,
                    "conv2d: input [2, 3, 9] has 3 dims, expected 4");
    ZT_EXPECT_ERROR(zs_conv2d(x, w3, NULL, NULL) == NULL,
                    "weight [5, 3, 3] has 3 dims");
    ZT_EXPECT_ERROR(zs_conv2d(x, w, NULL, &g2) == NULL,
                    "must be divisible by groups 2");
    ZT_EXPECT_ERROR(zs_conv2d(x, wc, NULL, NULL) == NULL,
                    "weight [5, 2, 3, 3] has 2 input channels per group, "
                    "expected C/groups = 3");
    ZT_EXPECT_ERROR(zs_conv2d(x, w, b4, NULL) == NULL,
                    "bias [4] does not match weight [5, 3, 3, 3], expected [5]");
    ZT_EXPECT_ERROR(zs_conv2d(x, wbig, NULL, NULL) == NULL,
                    "input [2, 3, 9, 7] with weight [5, 3, 11, 3]");
    ZT_EXPECT_ERROR(zs_conv2d(x, w, NULL, &dil) == NULL, "empty output");
    ZT_EXPECT_ERROR(zs_conv2d(x, w, NULL, &neg) == NULL, "must not be negative");
    ZT_EXPECT_ERROR(zs_conv2d(xd, w, NULL, NULL) == NULL, "dtypes f64 and f32");
    ZT_EXPECT_ERROR(zs_conv2d(xi, w, NULL, NULL) == NULL, "dtype i32");
    zs_set_error("first");
    ZT_CHECK(zs_conv2d(NULL, w, NULL, NULL) == NULL &&
             !strcmp(zs_last_error(), "first"), "NULL input keeps the first error");
    zs_tensor *all[] = {x, x3, xd, w, w3, wc, wbig, b4, xi};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        zs_release(all[i]);
    zt_section("errors");
}

/* conv2d_backward directly: each of the 7 subsets of {gx, gw, gb} in
 * order, on a strided x and g (f32 and f64), against the float64
 * reference (tolerances as in check_one); each result bit-identical to
 * the all-three call (the gradients are computed independently), and to
 * autograd's gradient with the other inputs frozen. Then its cost and
 * errors. */
static void test_backward_descriptor(void)
{
    zsi_opdef *bw = zsi_opdef_find("conv2d_backward");
    const conv_case *c = &cases[3]; /* groups 3, padding, bias */
    int64_t OH = out_size(c->H, c->KH, c->p.stride[0], c->p.padding[0], c->p.dilation[0]);
    int64_t OW = out_size(c->W, c->KW, c->p.stride[1], c->p.padding[1], c->p.dilation[1]);
    int G = pv(c->p.groups);
    for (int dti = 0; dti < 2; dti++) {
        zs_dtype dt = dti ? ZS_F64 : ZS_F32;
        double tol = dt == ZS_F32 ? 1e-5 : 1e-12;
        zs_tensor *x = zt_rand_strided(dt, ZS_SHAPE(c->N, c->C, c->H, c->W), 61);
        zs_tensor *w = zt_rand(dt, ZS_SHAPE(c->O, c->C / G, c->KH, c->KW), 62);
        zs_tensor *b = zt_rand(dt, ZS_SHAPE(c->O), 63);
        zs_tensor *gy = zt_rand_strided(dt, ZS_SHAPE(c->N, c->O, OH, OW), 64);
        double *xv = zt_values(x), *wv = zt_values(w), *gyv = zt_values(gy);
        int64_t n[3] = {zs_numel(x), zs_numel(w), c->O};
        double *ref[3];
        for (int k = 0; k < 3; k++)
            ref[k] = malloc((size_t)n[k] * sizeof *ref[k]);
        reference(c, xv, wv, NULL, gyv, NULL, ref[0], ref[1], ref[2]);
        zs_tensor *in[3] = {x, w, gy}, *all[3] = {0};
        for (int mask = 7; mask >= 1; mask--) {
            conv_bw_attrs at = {c->p, mask & 1, (mask >> 1) & 1, (mask >> 2) & 1};
            int nr = (mask & 1) + ((mask >> 1) & 1) + ((mask >> 2) & 1);
            zs_tensor *r[3] = {0};
            zs_status st = zsi_run_n(bw, 3, in, &at, nr, r);
            int bad = st != ZS_OK;
            for (int k = 0, j = 0; !bad && k < 3; k++) {
                if (!(mask >> k & 1))
                    continue;
                zs_tensor *t = r[j++];
                bad += rel_err(t, ref[k], n[k]) > tol || !zs_is_contiguous(t);
                if (mask == 7)
                    all[k] = zs_retain(t);
                else
                    bad += memcmp(zs_data(t), zs_data(all[k]), zs_nbytes(t)) != 0;
                /* autograd with only input k wanting a gradient */
                zs_tensor *ins[3] = {zs_detach(x), zs_detach(w), zs_detach(b)};
                zs_set_requires_grad(ins[k], true);
                zs_tensor *y = zs_conv2d(ins[0], ins[1], ins[2], &c->p);
                bad += !y || zs_backward(y, gy, false) != ZS_OK ||
                       memcmp(zs_data(zs_grad(ins[k])), zs_data(t), zs_nbytes(t)) != 0;
                zs_release(y);
                for (int i = 0; i < 3; i++)
                    zs_release(ins[i]);
            }
            ZT_CHECK(bad == 0, "conv2d_backward %s, gx %d gw %d gb %d: %d wrong "
                     "(seeds 61-64)", zs_dtype_name(dt), mask & 1, (mask >> 1) & 1,
                     (mask >> 2) & 1, bad);
            for (int k = 0; k < 3; k++)
                zs_release(r[k]);
        }
        for (int k = 0; k < 3; k++) {
            free(ref[k]);
            zs_release(all[k]);
        }
        free(xv);
        free(wv);
        free(gyv);
        zs_tensor *ts[] = {x, w, b, gy};
        for (size_t i = 0; i < 4; i++)
            zs_release(ts[i]);
    }
    /* cost: gx and gw wanted, counted under conv2d_backward */
    zs_tensor *x = zt_rand(ZS_F32, ZS_SHAPE(2, 6, 9, 7), 1);
    zs_tensor *w = zt_rand(ZS_F32, ZS_SHAPE(4, 3, 3, 2), 2);
    zs_tensor *gy = zt_rand(ZS_F32, ZS_SHAPE(2, 4, 5, 6), 3);
    conv_bw_attrs at = {{{2, 1}, {1, 0}, {1, 1}, 2}, true, true, false};
    zs_tensor *r[3] = {0}; /* room for the wrong-count call below */
    zs_profile_reset();
    zs_profile_enable(true);
    zs_status st = zsi_run_n(bw, 3, (zs_tensor *[]){x, w, gy}, &at, 2, r);
    zs_profile_enable(false);
    zs_op_stat stats[64];
    int ns = zs_profile_stats(stats, 64);
    double flops = -1, bytes = -1;
    for (int i = 0; i < ns; i++)
        if (!strcmp(stats[i].name, "conv2d_backward")) {
            flops = stats[i].flops;
            bytes = stats[i].bytes;
        }
    double f = 2.0 * 2 * 4 * 5 * 6 * 3 * 3 * 2;
    double want_bytes = 4.0 * (2 * 4 * 5 * 6 + 2 * (2 * 6 * 9 * 7 + 4 * 3 * 3 * 2));
    ZT_CHECK(st == ZS_OK && flops == 2 * f && bytes == want_bytes,
             "conv2d_backward cost: flops %g (want %g), bytes %g (want %g)", flops,
             2 * f, bytes, want_bytes);
    zs_release(r[0]);
    zs_release(r[1]);
    /* errors */
    conv_bw_attrs none = at;
    none.gx = none.gw = false;
    zs_tensor *g3 = zs_zeros(ZS_F32, ZS_SHAPE(2, 4, 5, 5));
    zs_tensor *gd = zs_zeros(ZS_F64, ZS_SHAPE(2, 4, 5, 6));
    ZT_EXPECT_ERROR(zsi_run_n(bw, 3, (zs_tensor *[]){x, w, gy}, &none, 1, r) < 0,
                    "conv2d_backward: no gradient wanted");
    ZT_EXPECT_ERROR(zsi_run_n(bw, 3, (zs_tensor *[]){x, w, g3}, &at, 2, r) < 0,
                    "conv2d_backward: gradient [2, 4, 5, 5], expected [2, 4, 5, 6]");
    ZT_EXPECT_ERROR(zsi_run_n(bw, 3, (zs_tensor *[]){x, w, gd}, &at, 2, r) < 0,
                    "conv2d_backward: dtypes");
    ZT_EXPECT_ERROR(zsi_run_n(bw, 3, (zs_tensor *[]){x, w, gy}, &at, 3, r) < 0,
                    "conv2d_backward: 2 results, the caller expects 3");
    zs_tensor *ts[] = {x, w, gy, g3, gd};
    for (size_t i = 0; i < 5; i++)
        zs_release(ts[i]);
    zt_section("conv2d_backward run directly: every subset of gradients, cost, errors");
}

/* Every allocation of a forward + backward fails in turn: NULL or an
 * error status, never a crash or a leak. */
static void test_alloc_failures(void)
{
    zs_tensor *x = zt_rand(ZS_F32, ZS_SHAPE(2, 3, 9, 7), 1);
    zs_tensor *w = zt_rand(ZS_F32, ZS_SHAPE(4, 3, 3, 3), 2);
    zs_tensor *b = zt_rand(ZS_F32, ZS_SHAPE(4), 3);
    zs_set_requires_grad(x, true);
    zs_set_requires_grad(w, true);
    zs_set_requires_grad(b, true);
    int64_t before = zt_live_bytes();
    int failed = 0;
    for (int k = 1; k <= 16; k++) {
        zs_alloc_fail_after(k);
        zs_tensor *y = zs_conv2d(x, w, b, &(zs_conv2d_params){.padding = {1, 1}});
        zs_tensor *s = y ? zs_sum(y, 0, NULL, false) : NULL;
        zs_status st = s ? zs_backward(s, NULL, false) : ZS_ERR_NOMEM;
        zs_alloc_fail_after(0);
        failed += st != ZS_OK;
        zs_release(y);
        zs_release(s);
        zs_zero_grad(x, true);
        zs_zero_grad(w, true);
        zs_zero_grad(b, true);
    }
    ZT_CHECK(failed > 0 && zt_live_bytes() == before && zs_autograd_live_nodes() == 0,
             "%d injected failures: %lld bytes, %lld nodes left", failed,
             (long long)(zt_live_bytes() - before),
             (long long)zs_autograd_live_nodes());
    zs_release(x);
    zs_release(w);
    zs_release(b);
    zt_section("allocation failures");
}

/* ---- output shapes against the plain shape rule ----------------------- */

static void test_conv_shapes(void)
{
    const uint64_t seed = 1306;
    zt_irand_seed(seed);
    for (int trial = 0; trial < 30; trial++) {
        zs_scope_push();
        int G = (int)zt_irand(1, 2);
        int64_t N = zt_irand(1, 2), C = G * zt_irand(1, 2), O = G * zt_irand(1, 2);
        int64_t KH = zt_irand(1, 3), KW = zt_irand(1, 3);
        zs_conv2d_params p = {{(int)zt_irand(1, 2), (int)zt_irand(1, 2)},
                              {(int)zt_irand(0, 1), (int)zt_irand(0, 1)},
                              {(int)zt_irand(1, 2), (int)zt_irand(1, 2)}, G};
        int64_t H = p.dilation[0] * (KH - 1) + zt_irand(1, 6);
        int64_t W = p.dilation[1] * (KW - 1) + zt_irand(1, 6);
        int64_t e[4] = {N, O,
            (H + 2 * p.padding[0] - p.dilation[0] * (KH - 1) - 1) / p.stride[0] + 1,
            (W + 2 * p.padding[1] - p.dilation[1] * (KW - 1) - 1) / p.stride[1] + 1};
        zs_tensor *x = zs_zeros(ZS_F32, ZS_SHAPE(N, C, H, W));
        zs_tensor *w = zs_zeros(ZS_F32, ZS_SHAPE(O, C / G, KH, KW));
        ZT_CHECK(zt_shape_is(zs_conv2d(x, w, NULL, &p), 4, e) &&
                 zt_shape_is(zs_conv2d(x, w, zs_zeros(ZS_F32, ZS_SHAPE(O)), &p), 4, e),
                 "conv2d shape, seed %llu trial %d", (unsigned long long)seed, trial);
        zs_scope_pop();
    }
    zt_section("conv2d: output shapes on random shapes");
}

int main(void)
{
    int64_t before = zt_live_bytes();
    test_conv_shapes();
    test_reference();
    test_paths();
    test_lowp();
    test_grad();
    test_cost_model();
    test_backward_descriptor();
    test_alloc_failures();
    test_errors();
    ZT_CHECK(zs_autograd_live_nodes() == 0, "tape freed: %lld nodes",
             (long long)zs_autograd_live_nodes());
    ZT_CHECK(zt_live_bytes() == before, "%lld bytes left",
             (long long)(zt_live_bytes() - before));
    return zt_done();
}
