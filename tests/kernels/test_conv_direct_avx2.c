/*
 * test_conv_direct_avx2.c - the AVX2 direct convolution (conv_direct_avx2.c):
 * forward, input gradient and weight gradient against a float64 direct
 * convolution, called directly (when the capped CPU has AVX2 + FMA) and
 * through zsk_conv2d_forward / zsk_conv2d_backward (whichever path the
 * cap picks: ctest reruns this under ZS_CPU_ISA=avx2 and portable).
 *
 * Shapes: LeNet's two layers (1 -> 6, 28x28, 5x5 pad 2; 6 -> 16, 14x14,
 * 5x5) and odd ones: output rows of 1, 7, 9, 17 and 31 pixels (one 8-lane
 * vector, a partial one, one of 16 and a tail), channel counts that leave
 * partial 6-channel forward tiles and 3 x 4 weight-gradient tiles (O = 5,
 * 7, 13; C = 1, 3, 11), dilation on each axis, padding as wide as the
 * kernel and wider than (kernel - 1) * dilation (its input gradient goes
 * to the GEMM path), a 1x1 padded kernel, a strided (non-contiguous) x,
 * and 1 and 2 threads. Inputs uniform in [-1, 1), seed per case.
 *
 * Tolerance: max |got - ref| / max |ref| <= 1e-5 per result (f32 sums of
 * at most a few thousand products of terms below 1; the weight gradient
 * adds 8 lane partial sums).
 */
#include <stdlib.h>

#include "kernels/cpu/conv.h"
#include "testutil.h"

typedef struct cc {
    int64_t N, C, H, W, O, KH, KW, ph, pw, dh, dw;
    bool bias, strided;
} cc;

static const cc cases[] = {
    {3, 1, 28, 28, 6, 5, 5, 2, 2, 1, 1, true, false},  /* LeNet conv1 */
    {3, 6, 14, 14, 16, 5, 5, 0, 0, 1, 1, true, false}, /* LeNet conv2 */
    {2, 3, 9, 7, 5, 3, 3, 1, 1, 1, 1, true, true},     /* OW 7 */
    {2, 11, 12, 33, 13, 3, 3, 1, 1, 1, 1, false, false}, /* OW 33 */
    {1, 3, 9, 13, 7, 3, 5, 2, 0, 2, 1, true, true},    /* dilation, OW 9 */
    {2, 2, 8, 17, 3, 2, 2, 1, 1, 1, 2, false, false},  /* OW 17 */
    {2, 3, 6, 6, 4, 3, 3, 3, 3, 1, 1, true, false},    /* pad > K-1: gx GEMM */
    {2, 4, 5, 9, 7, 1, 1, 1, 1, 1, 1, true, true},     /* 1x1 padded */
    {2, 3, 7, 5, 5, 3, 5, 1, 0, 1, 1, false, false},   /* OW 1 */
    {1, 2, 11, 31, 1, 3, 1, 0, 0, 1, 1, true, false},  /* O 1, OW 31 */
};
#define NCASES (int)(sizeof cases / sizeof *cases)

static uint64_t rng;

static float urand(void)
{
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(rng >> 40) / (double)(1ull << 23) - 1.0);
}

static float *rand_buf(int64_t n)
{
    float *p = malloc((size_t)n * sizeof *p);
    for (int64_t i = 0; i < n; i++)
        p[i] = urand();
    return p;
}

static void shape_of(const cc *c, zsk_conv2d_shape *s)
{
    *s = (zsk_conv2d_shape){c->N, c->C, c->H, c->W, c->O, c->KH, c->KW, 1,
                            0, 0, 1, 1, c->ph, c->pw, c->dh, c->dw};
    s->OH = zsk_conv_out_size(c->H, c->KH, 1, c->ph, c->dh);
    s->OW = zsk_conv_out_size(c->W, c->KW, 1, c->pw, c->dw);
}

/* y, gx, gw in double for x (strides xs), w, bias (may be NULL), gy. */
static void reference(const zsk_conv2d_shape *s, const float *x,
                      const int64_t *xs, const float *w, const float *bias,
                      const float *gy, double *y, double *gx, double *gw)
{
    int64_t KK = s->KH * s->KW;
    memset(gx, 0, (size_t)(s->N * s->C * s->H * s->W) * sizeof *gx);
    memset(gw, 0, (size_t)(s->O * s->C * KK) * sizeof *gw);
    for (int64_t n = 0; n < s->N; n++)
        for (int64_t o = 0; o < s->O; o++)
            for (int64_t oh = 0; oh < s->OH; oh++)
                for (int64_t ow = 0; ow < s->OW; ow++) {
                    int64_t yi = ((n * s->O + o) * s->OH + oh) * s->OW + ow;
                    double acc = bias ? bias[o] : 0, g = gy[yi];
                    for (int64_t c = 0; c < s->C; c++)
                        for (int64_t k = 0; k < KK; k++) {
                            int64_t ih = oh - s->ph + k / s->KW * s->dh;
                            int64_t iw = ow - s->pw + k % s->KW * s->dw;
                            if (ih < 0 || ih >= s->H || iw < 0 || iw >= s->W)
                                continue;
                            double xv = x[n * xs[0] + c * xs[1] + ih * xs[2] + iw * xs[3]];
                            double wv = w[(o * s->C + c) * KK + k];
                            acc += xv * wv;
                            gx[((n * s->C + c) * s->H + ih) * s->W + iw] += g * wv;
                            gw[(o * s->C + c) * KK + k] += g * xv;
                        }
                    y[yi] = acc;
                }
}

static double rel_err(const float *got, const double *ref, int64_t n)
{
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        num = fmax(num, fabs(got[i] - ref[i]));
        den = fmax(den, fabs(ref[i]));
    }
    return den > 0 ? num / den : num;
}

/* One case on one route: 0 the AVX2 kernels directly, 1 the dispatcher. */
static void run_case(int ci, int route)
{
    const cc *c = &cases[ci];
    zsk_conv2d_shape s;
    shape_of(c, &s);
    rng = 1000u + (uint64_t)ci;
    int64_t nx = s.N * s.C * s.H * s.W, KK = s.KH * s.KW;
    int64_t ny = s.N * s.O * s.OH * s.OW, nw = s.O * s.C * KK;
    /* strided: x lives in every other element of a buffer twice as wide */
    int64_t k = c->strided ? 2 : 1;
    int64_t xs[4] = {s.C * s.H * s.W * k, s.H * s.W * k, s.W * k, k};
    float *x = rand_buf(nx * k), *w = rand_buf(nw), *b = rand_buf(s.O);
    float *gy = rand_buf(ny);
    float *y = malloc((size_t)ny * sizeof *y), *gx = malloc((size_t)nx * sizeof *gx);
    float *gw = malloc((size_t)nw * sizeof *gw);
    double *ry = malloc((size_t)ny * sizeof *ry), *rgx = malloc((size_t)nx * sizeof *rgx);
    double *rgw = malloc((size_t)nw * sizeof *rgw);
    const float *bias = c->bias ? b : NULL;
    reference(&s, x, xs, w, bias, gy, ry, rgx, rgw);
    zs_status st;
    bool gx_avx2 = zsk_conv_direct_avx2_gx_ok(&s);
    if (route == 0) {
        st = zsk_conv2d_direct_avx2_forward(&s, x, xs, w, bias, y);
        if (st == ZS_OK)
            st = zsk_conv2d_direct_avx2_backward(&s, x, xs, w, gy,
                                                 gx_avx2 ? gx : NULL, gw);
    } else {
        st = zsk_conv2d_forward(ZS_F32, &s, x, xs, w, bias, y);
        if (st == ZS_OK)
            st = zsk_conv2d_backward(ZS_F32, &s, x, xs, w, gy, gx, gw, NULL);
    }
    double ey = rel_err(y, ry, ny), ew = rel_err(gw, rgw, nw);
    double ex = route == 0 && !gx_avx2 ? 0 : rel_err(gx, rgx, nx);
    ZT_CHECK(st == ZS_OK && ey <= 1e-5 && ex <= 1e-5 && ew <= 1e-5,
             "case %d (%s, %d threads, seed %d): N%lld C%lld %lldx%lld O%lld "
             "k%lldx%lld p%lld,%lld d%lld,%lld: errors y %.3g gx %.3g gw %.3g",
             ci, route ? "dispatch" : "avx2 direct", zs_num_threads(),
             1000 + ci, (long long)s.N, (long long)s.C, (long long)s.H,
             (long long)s.W, (long long)s.O, (long long)s.KH, (long long)s.KW,
             (long long)s.ph, (long long)s.pw, (long long)s.dh,
             (long long)s.dw, ey, ex, ew);
    free(x);
    free(w);
    free(b);
    free(gy);
    free(y);
    free(gx);
    free(gw);
    free(ry);
    free(rgx);
    free(rgw);
}

static void test_cases(void)
{
    const zs_cpu_features *f = zs_cpu();
    bool avx2 = f->avx2 && f->fma;
    int nt = zs_num_threads();
    for (int threads = 1; threads <= 2; threads++) {
        zs_set_num_threads(threads);
        for (int ci = 0; ci < NCASES; ci++) {
            if (avx2)
                run_case(ci, 0);
            run_case(ci, 1);
        }
    }
    zs_set_num_threads(nt);
    printf("  AVX2 direct kernels %s; dispatcher on every case\n",
           avx2 ? "checked" : "skipped (the capped CPU has no AVX2 + FMA)");
    zt_section("conv2d AVX2 direct path vs float64: forward, gx, gw");
}

/* Which shapes take the path: stride 1 only, f32, one group, not 1x1
 * unpadded; the input gradient only with padding <= (kernel - 1) *
 * dilation. */
static void test_applicability(void)
{
    const zs_cpu_features *f = zs_cpu();
    bool avx2 = f->avx2 && f->fma;
    zsk_conv2d_shape s;
    shape_of(&cases[1], &s);
    ZT_CHECK(zsk_conv_direct_avx2_ok(ZS_F32, &s) == avx2, "LeNet conv2: %d",
             avx2);
    ZT_CHECK(!zsk_conv_direct_avx2_ok(ZS_F64, &s), "f64 refused");
    s.sh = 2;
    ZT_CHECK(!zsk_conv_direct_avx2_ok(ZS_F32, &s), "stride 2 refused");
    shape_of(&cases[1], &s);
    s.G = 2;
    ZT_CHECK(!zsk_conv_direct_avx2_ok(ZS_F32, &s), "groups refused");
    shape_of(&cases[7], &s);
    s.ph = s.pw = 0;
    ZT_CHECK(!zsk_conv_direct_avx2_ok(ZS_F32, &s), "1x1 unpadded refused");
    shape_of(&cases[6], &s);
    ZT_CHECK(!zsk_conv_direct_avx2_gx_ok(&s), "pad 3 > 2: gx refused");
    shape_of(&cases[0], &s);
    ZT_CHECK(zsk_conv_direct_avx2_gx_ok(&s), "pad 2 = K-1: gx taken");
    bool old = zsk_conv_set_direct(false);
    shape_of(&cases[1], &s);
    ZT_CHECK(!zsk_conv_direct_avx2_ok(ZS_F32, &s), "zsk_conv_set_direct(false)");
    zsk_conv_set_direct(old);
    zt_section("conv2d AVX2 direct path: which shapes take it");
}

int main(void)
{
    test_applicability();
    test_cases();
    return zt_done();
}
