/*
 * test_int8_linear.c - kernels/cpu/int8_linear.c: zsk_quantize_rows_i8 and
 * the batch-invariant W8A8 linear layer zsk_i8_linear.
 *
 * (1) zsk_quantize_rows_i8: scale = max|w| / 127 and q = roundf(w / scale)
 *     exactly (float operations), |w - q scale| <= scale / 2, zero rows.
 * (2) zsk_i8_linear against float64 evaluated on the same quantized
 *     weights and activations (the test quantizes each row of x itself
 *     with the contract's float operations: smoothing, outlier columns,
 *     sx = max / 127, roundf(x / sx)). The int32 dot is exact, so the only
 *     errors are the f32 scaling (3 roundings), the outlier fmaf chain
 *     (k_O + 1 roundings of terms bounded by sum |x' w|), the epilogue adds
 *     and GeLU (< 1e-6 max(1, |v|), test_packed_linear): |y - ref| <=
 *     1e-6 (|s| + sum_O |x' w| + |bias|) + 2e-6 max(1, |ref|). Without
 *     bias, residual and act, y must also equal bit for bit the float
 *     expression of the contract, computed here. And the whole W8A8 product
 *     stays within the quantization bound of the unquantized float64 one:
 *     sum_k |x'| dw + |w| dx + dw dx, dw = w_scale / 2, dx = sx / 2.
 *     Odd sizes (N, K not multiples of 64 or 16; M = 1, 3, 17, 130 covers
 *     both tile shapes), smoothing, outliers, bias / residual / GeLU,
 *     strided x / y / residual, residual aliasing y.
 * (3) Outliers: a row with one huge column keeps its accuracy with the
 *     threshold (computed in float) and loses it without.
 * (4) Invariance, bitwise: rows alone vs in batches at several positions
 *     (batches whose other rows have outliers in other columns), 1 vs 2
 *     threads, the vector path (VNNI, or AVX2 under ZS_CPU_ISA=avx2) vs
 *     portable; K = 131072 extremes (dot32 near 2^31).
 * (5) Errors: NULL pointers, negative sizes, K too large, strides, act,
 *     overlap, failed allocation; outputs untouched.
 */
#include <stdlib.h>

#include "kernels/cpu/int8_linear.h"
#include "testutil.h"

static uint64_t rng_next(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 11;
}

static float urand(uint64_t *s) /* [-1, 1) */
{
    return (float)((double)rng_next(s) / 9007199254740992.0 * 2.0 - 1.0);
}

static float *rand_buf(int64_t n, float scale, uint64_t seed)
{
    float *p = malloc((size_t)(n > 0 ? n : 1) * sizeof *p);
    uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
    for (int64_t i = 0; i < n; i++)
        p[i] = urand(&s) * scale;
    return p;
}

static double gelu_d(double v)
{
    return 0.5 * v * (1.0 + tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)));
}

static int8_t ref_q(float v) /* roundf, clamped */
{
    float r = roundf(v);
    return (int8_t)(r > 127 ? 127 : r < -127 ? -127 : r);
}

/* ---- (1) ------------------------------------------------------------------- */

static void check_quantize_rows(int64_t N, int64_t K, uint64_t seed)
{
    float *W = rand_buf(N * K, 3.0f, seed);
    for (int64_t k = 0; k < K; k++)
        W[(N / 2) * K + k] = 0.0f; /* a zero row */
    int8_t *q = malloc((size_t)(N * K));
    float *s = malloc((size_t)N * sizeof *s);
    ZT_CHECK(zsk_quantize_rows_i8(W, N, K, q, s) == ZS_OK, "quantize_rows_i8");
    int bad = 0;
    for (int64_t n = 0; n < N && bad < 3; n++) {
        float amax = 0;
        for (int64_t k = 0; k < K; k++)
            amax = fmaxf(amax, fabsf(W[n * K + k]));
        if (s[n] != amax / 127.0f) {
            ZT_CHECK(0, "seed %llu row %lld: scale %g, want %g", (unsigned long long)seed,
                     (long long)n, s[n], amax / 127.0f);
            bad++;
        }
        for (int64_t k = 0; k < K; k++) {
            float w = W[n * K + k];
            int8_t want = s[n] > 0 ? ref_q(w / s[n]) : 0;
            double err = fabs(w - (double)q[n * K + k] * s[n]);
            if (q[n * K + k] != want || err > s[n] * 0.5 * (1 + 1e-6)) {
                ZT_CHECK(0, "seed %llu [%lld,%lld]: w %g, q %d, want %d, scale %g",
                         (unsigned long long)seed, (long long)n, (long long)k, w,
                         q[n * K + k], want, s[n]);
                bad++;
                break;
            }
        }
    }
    ZT_CHECK(s[N / 2] == 0.0f && q[(N / 2) * K] == 0, "zero row: scale %g", s[N / 2]);
    free(W);
    free(q);
    free(s);
}

/* ---- problems ------------------------------------------------------------- */

typedef struct prob {
    int64_t M, N, K, ldx, ldr, ldy;
    float *W, *x, *bias, *res, *smooth, *ws;
    int8_t *Wq;
    zsk_i8_opts opts;
    uint64_t seed;
} prob;

/* x: uniform [-2, 2) with a few columns of up to +-40 (outliers for a
 * threshold of 6); smooth in [0.5, 1.5) when smooth. */
static prob make(int64_t M, int64_t N, int64_t K, int64_t pad, bool smooth, float thr,
                 uint64_t seed)
{
    prob p = {.M = M, .N = N, .K = K, .ldx = K + pad, .ldr = N + 2 * pad,
              .ldy = N + 3 * pad, .seed = seed};
    p.W = rand_buf(N * K, 1.0f, seed);
    p.x = rand_buf(M * p.ldx, 2.0f, seed + 1);
    uint64_t s = seed + 5;
    for (int64_t m = 0; m < M; m++)
        for (int j = 0; j < 3; j++)
            p.x[m * p.ldx + (int64_t)(rng_next(&s) % (uint64_t)K)] = 40.0f * urand(&s);
    p.bias = rand_buf(N, 1.0f, seed + 2);
    p.res = rand_buf(M * p.ldr, 1.0f, seed + 3);
    p.smooth = rand_buf(K, 0.5f, seed + 4);
    for (int64_t k = 0; k < K; k++)
        p.smooth[k] += 1.0f;
    p.Wq = malloc((size_t)(N * K > 0 ? N * K : 1));
    p.ws = malloc((size_t)N * sizeof *p.ws);
    ZT_CHECK(zsk_quantize_rows_i8(p.W, N, K, p.Wq, p.ws) == ZS_OK, "quantize");
    p.opts = (zsk_i8_opts){smooth ? p.smooth : NULL, thr};
    return p;
}

static void drop(prob *p)
{
    free(p->W);
    free(p->x);
    free(p->bias);
    free(p->res);
    free(p->smooth);
    free(p->Wq);
    free(p->ws);
}

static float *new_y(const prob *p) { return rand_buf(p->M * p->ldy, 100.0f, 7); }

static zs_status run(const prob *p, bool bias, bool res, bool alias, zsk_act act, float *y)
{
    const float *r = res ? p->res : NULL;
    int64_t ldr = p->ldr;
    if (res && alias) {
        for (int64_t m = 0; m < p->M; m++)
            memcpy(y + m * p->ldy, p->res + m * p->ldr, (size_t)p->N * sizeof *y);
        r = y;
        ldr = p->ldy;
    }
    return zsk_i8_linear(p->Wq, p->ws, p->N, p->K, p->x, p->M, p->ldx, &p->opts,
                         bias ? p->bias : NULL, r, ldr, act, y, p->ldy);
}

static bool same_rows(const float *a, int64_t lda, const float *b, int64_t ldb, int64_t M,
                      int64_t N)
{
    for (int64_t m = 0; m < M; m++)
        if (memcmp(a + m * lda, b + m * ldb, (size_t)N * sizeof *a) != 0)
            return false;
    return true;
}

/* The test's own quantization of row m: x' (xs), outlier flags, qx, sx. */
typedef struct qrow {
    float *xs, sx;
    bool *out;
    int8_t *q;
} qrow;

static qrow quant_row(const prob *p, int64_t m)
{
    qrow r = {malloc((size_t)p->K * sizeof(float) + 1), 0, malloc((size_t)p->K + 1),
              malloc((size_t)p->K + 1)};
    float amax = 0;
    for (int64_t k = 0; k < p->K; k++) {
        float v = p->x[m * p->ldx + k];
        r.xs[k] = p->opts.smooth ? v * p->opts.smooth[k] : v;
        r.out[k] = p->opts.threshold > 0 && fabsf(r.xs[k]) > p->opts.threshold;
        if (!r.out[k])
            amax = fmaxf(amax, fabsf(r.xs[k]));
    }
    r.sx = amax / 127.0f;
    for (int64_t k = 0; k < p->K; k++)
        r.q[k] = r.out[k] || !(r.sx > 0) ? 0 : ref_q(r.xs[k] / r.sx);
    return r;
}

static void free_qrow(qrow *r)
{
    free(r->xs);
    free(r->out);
    free(r->q);
}

/* ---- (2) ------------------------------------------------------------------- */

static void check_values(const prob *p, bool bias, bool res, bool alias, zsk_act act)
{
    float *y = new_y(p);
    ZT_CHECK(run(p, bias, res, alias, act, y) == ZS_OK, "run");
    int bad = 0;
    for (int64_t m = 0; m < p->M && bad < 3; m++) {
        qrow qr = quant_row(p, m);
        for (int64_t n = 0; n < p->N && bad < 3; n++) {
            const int8_t *wq = p->Wq + n * p->K;
            float wsn = p->ws[n];
            int64_t dot = 0;
            double omag = 0, o = 0, exact_bound = 0, truth = 0;
            float of = 0.0f;
            for (int64_t k = 0; k < p->K; k++) {
                double wd = (double)wq[k] * wsn;
                truth += (double)qr.xs[k] * p->W[n * p->K + k];
                if (qr.out[k]) {
                    o += (double)qr.xs[k] * wd;
                    omag += fabs((double)qr.xs[k] * wd);
                    of = fmaf(qr.xs[k], (float)wq[k] * wsn, of);
                    exact_bound += fabs(qr.xs[k]) * wsn / 2;
                } else {
                    dot += (int64_t)qr.q[k] * wq[k];
                    exact_bound += fabs(qr.xs[k]) * wsn / 2 +
                                   fabs(p->W[n * p->K + k]) * qr.sx / 2 + wsn * qr.sx / 4;
                }
            }
            double sterm = (double)qr.sx * wsn * (double)dot;
            float exact = (qr.sx * wsn) * (float)dot;
            bool any_out = omag > 0 || o != 0;
            for (int64_t k = 0; k < p->K && !any_out; k++)
                any_out = qr.out[k];
            if (any_out)
                exact = exact + of;
            double v = sterm + o, mag = fabs(sterm) + omag;
            if (bias) {
                v += p->bias[n];
                mag += fabs(p->bias[n]);
                exact = exact + p->bias[n];
            }
            /* quantization bound against the unquantized product */
            double qerr = fabs(sterm + o - truth);
            if (qerr > exact_bound * (1 + 1e-5) + 1e-6 * fabs(truth) + 1e-30) {
                ZT_CHECK(0, "seed %llu [%lld,%lld]: W8A8 %g vs float %g, bound %g",
                         (unsigned long long)p->seed, (long long)m, (long long)n,
                         sterm + o, truth, exact_bound);
                bad++;
            }
            if (act == ZSK_ACT_GELU_TANH)
                v = gelu_d(v);
            if (res) {
                v += p->res[m * p->ldr + n];
                exact = exact + p->res[m * p->ldr + n];
            }
            float got = y[m * p->ldy + n];
            double tol = 1e-6 * mag + 2e-6 * fmax(1, fabs(v));
            bool ok = fabs(got - v) <= tol;
            if (act == ZSK_ACT_NONE)
                ok = ok && memcmp(&got, &exact, sizeof got) == 0;
            if (!ok) {
                ZT_CHECK(0, "seed %llu M=%lld N=%lld K=%lld bias=%d res=%d alias=%d gelu=%d "
                         "smooth=%d thr=%g [%lld,%lld]: got %.9g, ref %.9g (tol %.3g), "
                         "exact %.9g", (unsigned long long)p->seed, (long long)p->M,
                         (long long)p->N, (long long)p->K, bias, res, alias, act,
                         p->opts.smooth != NULL, p->opts.threshold, (long long)m,
                         (long long)n, got, v, tol, exact);
                bad++;
            }
        }
        free_qrow(&qr);
    }
    float *y0 = new_y(p);
    for (int64_t m = 0; m < p->M; m++)
        for (int64_t n = p->N; n < p->ldy; n++)
            ZT_CHECK(y[m * p->ldy + n] == y0[m * p->ldy + n], "padding of y written");
    free(y0);
    free(y);
}

/* ---- (3) ------------------------------------------------------------------- */

/* One row of K = 512 values in [-1, 1) and one of 2000: the relative error
 * against the unquantized product (W quantized in both) with the threshold
 * is bounded by the int8 error of the small columns; without it sx is
 * 2000 / 127 and the small columns all round to 0. */
static void check_outlier_row(void)
{
    int64_t N = 37, K = 512;
    prob p = make(1, N, K, 0, false, 0.0f, 4242);
    for (int64_t k = 0; k < K; k++)
        p.x[k] = urand(&(uint64_t){(uint64_t)k * 77 + 1});
    p.x[100] = 2000.0f;
    float *y = new_y(&p), *yt = new_y(&p);
    ZT_CHECK(run(&p, false, false, false, ZSK_ACT_NONE, y) == ZS_OK, "no threshold");
    p.opts.threshold = 6.0f;
    ZT_CHECK(run(&p, false, false, false, ZSK_ACT_NONE, yt) == ZS_OK, "threshold");
    double e0 = 0, e1 = 0, scale = 0;
    for (int64_t n = 0; n < N; n++) {
        double small = 0, ref = 0;
        for (int64_t k = 0; k < K; k++) {
            double t = (double)p.x[k] * p.Wq[n * K + k] * p.ws[n];
            ref += t;
            if (k != 100)
                small += fabs(t);
        }
        scale = fmax(scale, small);
        e0 = fmax(e0, fabs(y[n] - ref) / small);
        e1 = fmax(e1, fabs(yt[n] - ref) / small);
    }
    printf("outlier row: max error / sum|small terms| = %.3g without threshold, %.3g "
           "with\n", e0, e1);
    ZT_CHECK(e1 < 0.01 && e0 > 10 * e1, "outlier handling: %g with, %g without", e1, e0);
    free(y);
    free(yt);
    drop(&p);
}

/* ---- (4) ------------------------------------------------------------------- */

static void check_batch_invariance(const prob *p, zsk_act act, const float *yfull)
{
    int64_t N = p->N, K = p->K, B = p->M + 5;
    int64_t rows[3] = {0, p->M / 2, p->M - 1};
    float *xb = rand_buf(B * K, 2.0f, p->seed + 99);
    uint64_t s = p->seed;
    for (int64_t i = 0; i < B; i++) /* other rows have outliers elsewhere */
        xb[i * K + (int64_t)(rng_next(&s) % (uint64_t)K)] = 50.0f;
    float *rb = rand_buf(B * N, 1.0f, p->seed + 98);
    float *yb = malloc((size_t)(B * N) * sizeof *yb), *y1 = malloc((size_t)N * sizeof *y1);
    for (int i = 0; i < 3; i++) {
        int64_t m = rows[i];
        ZT_CHECK(zsk_i8_linear(p->Wq, p->ws, N, K, p->x + m * p->ldx, 1, K, &p->opts,
                               p->bias, p->res + m * p->ldr, N, act, y1, N) == ZS_OK,
                 "M = 1");
        ZT_CHECK(same_rows(y1, N, yfull + m * p->ldy, N, 1, N),
                 "seed %llu M=%lld N=%lld K=%lld: row %lld alone differs from the batch",
                 (unsigned long long)p->seed, (long long)p->M, (long long)N, (long long)K,
                 (long long)m);
        int64_t pos[3] = {0, B / 2 + 1, B - 1};
        for (int q = 0; q < 3; q++) {
            memcpy(xb + pos[q] * K, p->x + m * p->ldx, (size_t)K * sizeof *xb);
            memcpy(rb + pos[q] * N, p->res + m * p->ldr, (size_t)N * sizeof *rb);
            ZT_CHECK(zsk_i8_linear(p->Wq, p->ws, N, K, xb, B, K, &p->opts, p->bias, rb, N,
                                   act, yb, N) == ZS_OK, "batch");
            ZT_CHECK(same_rows(yb + pos[q] * N, N, y1, N, 1, N),
                     "seed %llu N=%lld K=%lld: row %lld at position %lld of %lld differs",
                     (unsigned long long)p->seed, (long long)N, (long long)K, (long long)m,
                     (long long)pos[q], (long long)B);
        }
    }
    free(xb);
    free(rb);
    free(yb);
    free(y1);
}

static void check_invariance(const prob *p, bool vnni)
{
    for (int a = 0; a < 2; a++) {
        zsk_act act = a ? ZSK_ACT_GELU_TANH : ZSK_ACT_NONE;
        int threads = zs_num_threads();
        float *y1 = new_y(p), *y2 = new_y(p), *yp = new_y(p);
        zs_set_num_threads(1);
        ZT_CHECK(run(p, true, true, false, act, y1) == ZS_OK, "1 thread");
        zs_set_num_threads(2);
        ZT_CHECK(run(p, true, true, false, act, y2) == ZS_OK, "2 threads");
        ZT_CHECK(same_rows(y1, p->ldy, y2, p->ldy, p->M, p->N),
                 "seed %llu M=%lld N=%lld K=%lld: 1 vs 2 threads differ",
                 (unsigned long long)p->seed, (long long)p->M, (long long)p->N,
                 (long long)p->K);
        if (vnni) {
            bool old = zsk_linear_force_portable(true);
            ZT_CHECK(run(p, true, true, false, act, yp) == ZS_OK, "portable");
            zsk_linear_force_portable(old);
            ZT_CHECK(same_rows(y2, p->ldy, yp, p->ldy, p->M, p->N),
                     "seed %llu M=%lld N=%lld K=%lld: vector vs portable differ",
                     (unsigned long long)p->seed, (long long)p->M, (long long)p->N,
                     (long long)p->K);
        }
        check_batch_invariance(p, act, y2);
        zs_set_num_threads(threads);
        free(y1);
        free(y2);
        free(yp);
    }
}

/* K = ZSK_I8_MAX_K with every product at its extreme: dot32 = K * 127 * 127
 * and K * 127 * -128 (a raw -128 weight, which the quantizer never makes),
 * both within int32; VNNI, portable and the float expression agree. */
static void check_extremes(bool vnni)
{
    int64_t K = ZSK_I8_MAX_K, N = 3;
    int8_t *Wq = malloc((size_t)(N * K));
    float *x = malloc((size_t)K * sizeof *x), ws[3] = {0.5f, 0.25f, 1.0f}, y[3], yp[3];
    for (int64_t k = 0; k < K; k++) {
        Wq[k] = 127;
        Wq[K + k] = -128;
        Wq[2 * K + k] = (int8_t)(k % 2 ? 127 : -127);
        x[k] = 127.0f;
    }
    ZT_CHECK(zsk_i8_linear(Wq, ws, N, K, x, 1, K, NULL, NULL, NULL, 0, ZSK_ACT_NONE, y, N) ==
                 ZS_OK, "extremes");
    float want[3] = {(1.0f * 0.5f) * (float)(K * 127 * 127),
                     (1.0f * 0.25f) * (float)(K * 127 * -128), 0.0f};
    ZT_CHECK(memcmp(y, want, sizeof y) == 0, "extremes: %.9g %.9g %.9g, want %.9g %.9g %.9g",
             y[0], y[1], y[2], want[0], want[1], want[2]);
    if (vnni) {
        bool old = zsk_linear_force_portable(true);
        ZT_CHECK(zsk_i8_linear(Wq, ws, N, K, x, 1, K, NULL, NULL, NULL, 0, ZSK_ACT_NONE, yp,
                               N) == ZS_OK, "extremes portable");
        zsk_linear_force_portable(old);
        ZT_CHECK(memcmp(y, yp, sizeof y) == 0, "extremes: vector vs portable differ");
    }
    free(Wq);
    free(x);
}

/* ---- (5) ------------------------------------------------------------------- */

static void check_errors(void)
{
    int8_t Wq[12] = {0};
    float ws[3] = {1, 1, 1}, x[8] = {0}, y[8], r[8] = {0}, W[12] = {0}, s[3];
    for (int i = 0; i < 8; i++)
        y[i] = 7;
    ZT_EXPECT_ERROR(zsk_quantize_rows_i8(NULL, 3, 4, Wq, s) == ZS_ERR_ARG, "NULL");
    ZT_EXPECT_ERROR(zsk_quantize_rows_i8(W, 3, 4, Wq, NULL) == ZS_ERR_ARG, "NULL");
    ZT_EXPECT_ERROR(zsk_quantize_rows_i8(W, -3, 4, Wq, s) == ZS_ERR_ARG, "negative");
    ZT_CHECK(zsk_quantize_rows_i8(NULL, 0, 4, NULL, NULL) == ZS_OK, "N = 0");
#define CALL(Wq_, ws_, N_, K_, x_, M_, ldx_, res_, ldr_, act_, y_, ldy_)                   \
    zsk_i8_linear(Wq_, ws_, N_, K_, x_, M_, ldx_, NULL, NULL, res_, ldr_, act_, y_, ldy_)
    ZT_EXPECT_ERROR(CALL(NULL, ws, 3, 4, x, 2, 4, NULL, 0, ZSK_ACT_NONE, y, 3) == ZS_ERR_ARG,
                    "NULL Wq");
    ZT_EXPECT_ERROR(CALL(Wq, NULL, 3, 4, x, 2, 4, NULL, 0, ZSK_ACT_NONE, y, 3) == ZS_ERR_ARG,
                    "NULL w_scale");
    ZT_EXPECT_ERROR(CALL(Wq, ws, 3, 4, NULL, 2, 4, NULL, 0, ZSK_ACT_NONE, y, 3) == ZS_ERR_ARG,
                    "NULL x");
    ZT_EXPECT_ERROR(CALL(Wq, ws, 3, 4, x, 2, 4, NULL, 0, ZSK_ACT_NONE, NULL, 3) == ZS_ERR_ARG,
                    "NULL y");
    ZT_EXPECT_ERROR(CALL(Wq, ws, 3, -4, x, 2, 4, NULL, 0, ZSK_ACT_NONE, y, 3) == ZS_ERR_ARG,
                    "negative");
    ZT_EXPECT_ERROR(CALL(Wq, ws, 3, 4, x, -2, 4, NULL, 0, ZSK_ACT_NONE, y, 3) == ZS_ERR_ARG,
                    "negative");
    ZT_EXPECT_ERROR(CALL(Wq, ws, 3, ZSK_I8_MAX_K + 1, x, 2, ZSK_I8_MAX_K + 1, NULL, 0,
                         ZSK_ACT_NONE, y, 3) == ZS_ERR_ARG, "overflow");
    ZT_EXPECT_ERROR(CALL(Wq, ws, 3, 4, x, 2, 3, NULL, 0, ZSK_ACT_NONE, y, 3) == ZS_ERR_ARG,
                    "stride");
    ZT_EXPECT_ERROR(CALL(Wq, ws, 3, 4, x, 2, 4, NULL, 0, ZSK_ACT_NONE, y, 2) == ZS_ERR_ARG,
                    "stride");
    ZT_EXPECT_ERROR(CALL(Wq, ws, 3, 4, x, 2, 4, r, 1, ZSK_ACT_NONE, y, 3) == ZS_ERR_ARG,
                    "stride");
    ZT_EXPECT_ERROR(CALL(Wq, ws, 3, 4, x, 2, 4, NULL, 0, (zsk_act)5, y, 3) == ZS_ERR_ARG,
                    "activation");
    ZT_EXPECT_ERROR(CALL(Wq, ws, 3, 4, x, 2, 4, y + 1, 3, ZSK_ACT_NONE, y, 3) == ZS_ERR_ARG,
                    "overlaps");
    ZT_EXPECT_ERROR(CALL(Wq, ws, 3, 4, y, 1, 4, NULL, 0, ZSK_ACT_NONE, y + 2, 3) ==
                        ZS_ERR_ARG, "overlaps");
    zs_alloc_fail_after(1);
    zs_status st = CALL(Wq, ws, 3, 4, x, 2, 4, NULL, 0, ZSK_ACT_NONE, y, 3);
    zs_alloc_fail_after(0);
    ZT_EXPECT_ERROR(st == ZS_ERR_NOMEM, "out of memory");
    for (int i = 0; i < 8; i++)
        ZT_CHECK(y[i] == 7, "y touched by a refused call");
    ZT_CHECK(CALL(Wq, ws, 3, 4, x, 0, 4, NULL, 0, ZSK_ACT_NONE, NULL, 3) == ZS_OK, "M = 0");
    float b[3] = {1, -2, 3}, yz[6];
    ZT_CHECK(zsk_i8_linear(NULL, ws, 3, 0, NULL, 2, 0, NULL, b, NULL, 0, ZSK_ACT_NONE, yz,
                           3) == ZS_OK && yz[0] == 1 && yz[4] == -2 && yz[5] == 3,
             "K = 0 gives the bias");
#undef CALL
}

int main(void)
{
    bool vnni = zsk_i8_has_vnni() || zsk_i8_has_avx2();
    printf("vector path: %s\n", zsk_i8_has_vnni()   ? "avx512 vnni"
                                 : zsk_i8_has_avx2() ? "avx2"
                                                     : "no (portable only)");
    check_quantize_rows(7, 100, 1);
    check_quantize_rows(64, 257, 2);
    zt_section("quantize_rows_i8");

    static const int64_t Ms[] = {1, 3, 17, 130};
    static const int64_t NKs[][2] = {{1, 1}, {67, 13}, {130, 100}, {200, 257}, {5, 700},
                                     {64, 64}};
    uint64_t seed = 10;
    for (size_t a = 0; a < sizeof Ms / sizeof *Ms; a++) {
        for (size_t b = 0; b < sizeof NKs / sizeof *NKs; b++) {
            for (int v = 0; v < 3; v++) { /* plain, smooth, smooth + threshold */
                prob p = make(Ms[a], NKs[b][0], NKs[b][1], (int64_t)(b % 3) * 3, v > 0,
                              v == 2 ? 6.0f : 0.0f, seed++);
                for (int c = 0; c < 8; c++)
                    check_values(&p, c & 1, c & 2, (c & 2) && (c & 4),
                                 c & 4 ? ZSK_ACT_GELU_TANH : ZSK_ACT_NONE);
                check_values(&p, true, true, true, ZSK_ACT_NONE);
                drop(&p);
            }
        }
    }
    zt_section("values against float64 on the same quantized operands");

    check_outlier_row();
    zt_section("outlier columns");

    for (size_t a = 0; a < sizeof Ms / sizeof *Ms; a++) {
        for (size_t b = 1; b < sizeof NKs / sizeof *NKs; b++) {
            prob p = make(Ms[a], NKs[b][0], NKs[b][1], 1, true, b % 2 ? 6.0f : 0.0f, seed++);
            check_invariance(&p, vnni);
            drop(&p);
        }
    }
    prob wide = make(20, 1000, 70, 0, false, 6.0f, seed++);
    check_invariance(&wide, vnni);
    drop(&wide);
    check_extremes(vnni);
    zt_section("batch, thread and path invariance (bitwise)");

    check_errors();
    zt_section("errors");
    return zt_done();
}
