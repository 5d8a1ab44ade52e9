/*
 * test_quant.c - kernels/cpu/quant.c: Q8_0 / Q4_0 / Q4_1 blocks, the f16
 * conversion and zsk_qmatmul, against float64 references.
 *
 * (1) quantize -> dequantize: the stored scale is the format's scale
 *     rounded to f16 (within 2^-10), every value is d * q (+ m) with the q a
 *     float64 rounding of w / d gives (one step off allowed only at a near
 *     tie), and |w - w'| <= d / 2 (Q4_0's clamped -v: <= d).
 * (2) zsk_qmatmul against sum_k W'[n,k] x'[m,k] in float64, W' and x' the
 *     dequantized weights and activations (zsk_quantize_q8x): block sums are
 *     exact integers, so the only error is f32 scaling and accumulation:
 *     within 1e-5 * sum_k |W' x'|. Every format, portable and VNNI paths
 *     (when the CPU has VNNI), 1 and 2 threads, odd M and N.
 * (2b) batch invariance: a row alone (M = 1) gives the bits it gives in a
 *     batch of M = 7; 1 vs 2 threads the same bits.
 * (3) f16: edge values, all 65536 halves round trip, random floats against
 *     zs_f32_to_f16 (core's independent implementation).
 * (4) bad sizes are refused with ZS_ERR_ARG and leave outputs untouched.
 */
#include <stdlib.h>

#include "kernels/cpu/quant.h"
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

/* Random weights; block b gets scale 10^(b % 5 - 2); block 1 is all zero,
 * block 2 has one outlier. */
static void fill(float *w, int64_t n, uint64_t seed)
{
    uint64_t s = seed;
    for (int64_t i = 0; i < n; i++) {
        int64_t b = i / 32;
        float sc = powf(10.0f, (float)(b % 5) - 2.0f);
        w[i] = b == 1 ? 0.0f : urand(&s) * sc;
        if (b == 2 && i % 32 == 7)
            w[i] = -25.0f * sc;
    }
}

static const char *fname[] = {"q8_0", "q4_0", "q4_1"};

/* ---- (1) ---------------------------------------------------------------- */

static double round_away(double v) { return v < 0 ? -floor(-v + 0.5) : floor(v + 0.5); }

static void check_roundtrip(zsk_qfmt fmt, int64_t n, uint64_t seed)
{
    float *w = malloc(n * sizeof *w), *o = malloc(n * sizeof *o);
    unsigned char *q = malloc(n / 32 * zsk_qblock_bytes(fmt));
    fill(w, n, seed);
    ZT_CHECK(zsk_quantize(fmt, w, n, q) == ZS_OK, "quantize %s", fname[fmt]);
    ZT_CHECK(zsk_dequantize(fmt, q, n, o) == ZS_OK, "dequantize %s", fname[fmt]);
    int bad = 0;
    for (int64_t b = 0; b < n / 32 && bad < 5; b++) {
        const float *v = w + b * 32;
        const unsigned char *blk = q + b * zsk_qblock_bytes(fmt);
        uint16_t dh, mh = 0;
        memcpy(&dh, blk, 2);
        if (fmt == ZSK_Q4_1)
            memcpy(&mh, blk + 2, 2);
        double d = zs_f16_to_f32(dh), m = zs_f16_to_f32(mh);
        double amax = 0, vmax = 0, lo = v[0], hi = v[0];
        for (int i = 0; i < 32; i++) {
            if (fabs(v[i]) > amax) {
                amax = fabs(v[i]);
                vmax = v[i];
            }
            lo = fmin(lo, v[i]);
            hi = fmax(hi, v[i]);
        }
        double dref = fmt == ZSK_Q8_0 ? amax / 127 : fmt == ZSK_Q4_0 ? vmax / -8
                                                                      : (hi - lo) / 15;
        double dref16 = zs_f16_to_f32(zs_f32_to_f16((float)dref));
        if (fabs(d - dref16) > fabs(dref16) * 0x1p-10) {
            ZT_CHECK(0, "%s block %lld: d %g, reference %g", fname[fmt],
                     (long long)b, d, dref16);
            bad++;
        }
        if (fmt == ZSK_Q4_1 && m != zs_f16_to_f32(zs_f32_to_f16((float)lo))) {
            ZT_CHECK(0, "q4_1 block %lld: m %g, min %g", (long long)b, m, lo);
            bad++;
        }
        for (int i = 0; i < 32; i++) {
            double t = fmt == ZSK_Q4_1 ? (v[i] - m) / d : v[i] / d;
            if (d == 0)
                t = 0;
            double qr = round_away(t);
            double lim_lo = fmt == ZSK_Q8_0 ? -127 : fmt == ZSK_Q4_0 ? -8 : 0;
            double lim_hi = fmt == ZSK_Q8_0 ? 127 : fmt == ZSK_Q4_0 ? 7 : 15;
            bool clamped = qr > lim_hi || qr < lim_lo;
            qr = fmin(fmax(qr, lim_lo), lim_hi);
            double ref = d * qr + (fmt == ZSK_Q4_1 ? m : 0);
            bool near_tie = fabs(fabs(t - floor(t)) - 0.5) < 1e-4;
            double diff = fabs(o[b * 32 + i] - ref);
            double tol_ref = near_tie ? fabs(d) * 1.0001 : 1e-6 * fabs(ref);
            double err = fabs(o[b * 32 + i] - v[i]);
            double bound = (clamped ? fabs(d) : fabs(d) / 2) * (1 + 1e-5) +
                           (fmt == ZSK_Q4_1 ? fabs(m - lo) : 0) + 1e-7 * fabs(v[i]);
            if (diff > tol_ref || err > bound) {
                ZT_CHECK(0, "%s block %lld elem %d: w %g, got %g, ref %g, d %g",
                         fname[fmt], (long long)b, i, v[i], o[b * 32 + i], ref, d);
                bad++;
                break;
            }
        }
    }
    free(w);
    free(o);
    free(q);
}

static void check_act(int64_t n, uint64_t seed)
{
    float *x = malloc(n * sizeof *x);
    zsk_block_q8x *xq = malloc(n / 32 * sizeof *xq);
    fill(x, n, seed);
    ZT_CHECK(zsk_quantize_q8x(x, n, xq) == ZS_OK, "quantize_q8x");
    int bad = 0;
    for (int64_t b = 0; b < n / 32 && bad < 5; b++) {
        int32_t s = 0;
        for (int i = 0; i < 32; i++) {
            s += xq[b].q[i];
            double err = fabs(xq[b].d * (double)xq[b].q[i] - x[b * 32 + i]);
            if (err > xq[b].d * 0.5 * (1 + 1e-5) + 1e-7 * fabs(x[b * 32 + i])) {
                ZT_CHECK(0, "q8x block %lld elem %d: err %g, d %g",
                         (long long)b, i, err, xq[b].d);
                bad++;
            }
        }
        ZT_CHECK(s == xq[b].s, "q8x block %lld: sum %d, stored %d",
                 (long long)b, s, xq[b].s);
    }
    free(x);
    free(xq);
}

/* (1b) The activation quantizer's paths agree bit for bit (AVX-512 and AVX2
 * versions; the ISA cap picks which): random blocks, exact ties of v / d at k + 0.5,
 * NaN, infinities, -0, denormals and huge values. */
static void check_act_paths(void)
{
    int64_t n = 32 * 64;
    float *x = malloc(n * sizeof *x);
    zsk_block_q8x *a = malloc(n / 32 * sizeof *a), *b = malloc(n / 32 * sizeof *b);
    fill(x, n, 123);
    for (int i = 0; i < 32; i++) /* block 3: amax 127, so d = 1 and v / d = v */
        x[3 * 32 + i] = i == 0 ? 127.0f : (float)(i - 16) + 0.5f;
    for (int i = 0; i < 32; i++) /* block 4: ties after a non-trivial scale */
        x[4 * 32 + i] = i == 0 ? 12.7f : 0.1f * ((float)(i - 16) + 0.5f);
    x[5 * 32 + 3] = NAN;
    x[6 * 32 + 4] = INFINITY;
    x[7 * 32 + 5] = -INFINITY;
    x[8 * 32 + 6] = -0.0f;
    for (int i = 0; i < 32; i++)
        x[9 * 32 + i] = i % 2 ? 1e-40f : -1e-41f; /* denormals */
    x[10 * 32 + 1] = 3e38f;
    x[11 * 32 + 2] = NAN, x[11 * 32 + 9] = INFINITY;
    bool old = zsk_quant_force_portable(true);
    ZT_CHECK(zsk_quantize_q8x(x, n, a) == ZS_OK, "portable q8x");
    zsk_quant_force_portable(false);
    ZT_CHECK(zsk_quantize_q8x(x, n, b) == ZS_OK, "default q8x");
    zsk_quant_force_portable(old);
    for (int64_t k = 0; k < n / 32; k++)
        ZT_CHECK(memcmp(&a[k], &b[k], sizeof a[k]) == 0,
                 "q8x block %lld: portable and vector paths differ (d %g / %g, s %d / %d)",
                 (long long)k, a[k].d, b[k].d, a[k].s, b[k].s);
    ZT_CHECK(a[3].d == 1.0f && a[3].q[1] == -15 && a[3].q[17] == 2 && a[3].q[16] == 1,
             "ties round away from zero: %d %d %d", a[3].q[1], a[3].q[17], a[3].q[16]);
    free(x);
    free(a);
    free(b);
}

/* ---- (2) ---------------------------------------------------------------- */

static void check_qmatmul(zsk_qfmt fmt, int64_t M, int64_t N, int64_t K,
                          uint64_t seed, const char *path)
{
    float *W = malloc(N * K * sizeof *W), *Wd = malloc(N * K * sizeof *Wd);
    float *x = malloc(M * K * sizeof *x), *y = malloc(M * N * sizeof *y);
    unsigned char *Wq = malloc(N * K / 32 * zsk_qblock_bytes(fmt));
    zsk_block_q8x *xq = malloc(M * K / 32 * sizeof *xq);
    fill(W, N * K, seed);
    uint64_t s = seed ^ 0x9e3779b97f4a7c15ull;
    for (int64_t i = 0; i < M * K; i++)
        x[i] = urand(&s) * (i % 64 == 5 ? 30.0f : 1.0f);
    ZT_CHECK(zsk_quantize(fmt, W, N * K, Wq) == ZS_OK, "quantize");
    ZT_CHECK(zsk_dequantize(fmt, Wq, N * K, Wd) == ZS_OK, "dequantize");
    ZT_CHECK(zsk_quantize_q8x(x, M * K, xq) == ZS_OK, "quantize_q8x");
    ZT_CHECK(zsk_qmatmul(fmt, Wq, x, y, M, N, K) == ZS_OK, "qmatmul");
    int bad = 0;
    for (int64_t m = 0; m < M; m++) {
        for (int64_t n = 0; n < N && bad < 3; n++) {
            double ref = 0, scale = 0;
            for (int64_t k = 0; k < K; k++) {
                const zsk_block_q8x *xb = xq + (m * K + k) / 32;
                double p = (double)Wd[n * K + k] * xb->d * xb->q[k % 32];
                ref += p;
                scale += fabs(p);
            }
            double err = fabs(y[m * N + n] - ref);
            if (err > 1e-5 * scale + 1e-30) {
                ZT_CHECK(0, "qmatmul %s %s M=%lld N=%lld K=%lld [%lld,%lld]: "
                         "got %.9g, ref %.9g (scale %g)", fname[fmt], path,
                         (long long)M, (long long)N, (long long)K, (long long)m,
                         (long long)n, y[m * N + n], ref, scale);
                bad++;
            }
        }
    }
    free(W);
    free(Wd);
    free(x);
    free(y);
    free(Wq);
    free(xq);
}

static void check_all_qmatmul(const char *path)
{
    static const int64_t Ms[] = {1, 3, 7}, Ns[] = {1, 5, 67}, Ks[] = {32, 96, 288};
    uint64_t seed = 1;
    for (int f = 0; f < 3; f++)
        for (int a = 0; a < 3; a++)
            for (int b = 0; b < 3; b++)
                for (int c = 0; c < 3; c++)
                    check_qmatmul((zsk_qfmt)f, Ms[a], Ns[b], Ks[c], seed++, path);
    for (int f = 0; f < 3; f++) /* many chunks over the pool */
        check_qmatmul((zsk_qfmt)f, 2, 301, 4096, seed++, path);
}

/* (2b) Batch invariance, bitwise: row m of a batch of M = 7 equals the
 * row computed alone (M = 1), and 1 vs 2 threads give the same bits (the
 * inference engine runs decode and prefill through zsk_qmatmul). */
static void check_qmatmul_invariance(zsk_qfmt fmt, const char *path)
{
    int64_t M = 7, N = 67, K = 288;
    float *W = malloc(N * K * sizeof *W), *x = malloc(M * K * sizeof *x);
    float *y = malloc(M * N * sizeof *y), *y1 = malloc(N * sizeof *y1);
    float *y2 = malloc(M * N * sizeof *y2);
    unsigned char *Wq = malloc(N * K / 32 * zsk_qblock_bytes(fmt));
    fill(W, N * K, 77 + fmt);
    uint64_t s = 99;
    for (int64_t i = 0; i < M * K; i++)
        x[i] = urand(&s);
    ZT_CHECK(zsk_quantize(fmt, W, N * K, Wq) == ZS_OK, "quantize");
    int threads = zs_num_threads();
    zs_set_num_threads(2);
    ZT_CHECK(zsk_qmatmul(fmt, Wq, x, y, M, N, K) == ZS_OK, "qmatmul batch");
    for (int64_t m = 0; m < M; m++) {
        ZT_CHECK(zsk_qmatmul(fmt, Wq, x + m * K, y1, 1, N, K) == ZS_OK, "qmatmul row");
        ZT_CHECK(memcmp(y1, y + m * N, N * sizeof *y1) == 0,
                 "qmatmul %s %s: row %lld alone differs from the batch of 7", fname[fmt],
                 path, (long long)m);
    }
    zs_set_num_threads(1);
    ZT_CHECK(zsk_qmatmul(fmt, Wq, x, y2, M, N, K) == ZS_OK, "qmatmul 1 thread");
    ZT_CHECK(memcmp(y2, y, M * N * sizeof *y) == 0, "qmatmul %s %s: 1 vs 2 threads differ",
             fname[fmt], path);
    zs_set_num_threads(threads);
    free(W);
    free(x);
    free(y);
    free(y1);
    free(y2);
    free(Wq);
}

/* (3), the f16 conversion of the scales, is core's: tests/core/test_f16.c. */

/* ---- (4) ---------------------------------------------------------------- */

static void check_bad_sizes(void)
{
    float w[64] = {0}, y[4] = {7, 7, 7, 7};
    unsigned char q[256];
    memset(q, 0xab, sizeof q);
    for (int f = 0; f < 3; f++) {
        ZT_CHECK(zsk_quantize((zsk_qfmt)f, w, 33, q) == ZS_ERR_ARG, "n = 33");
        ZT_CHECK(zsk_quantize((zsk_qfmt)f, w, -32, q) == ZS_ERR_ARG, "n < 0");
        ZT_CHECK(zsk_quantize((zsk_qfmt)f, NULL, 32, q) == ZS_ERR_ARG, "NULL");
        ZT_CHECK(zsk_dequantize((zsk_qfmt)f, q, 31, w) == ZS_ERR_ARG, "n = 31");
        ZT_CHECK(zsk_quantize((zsk_qfmt)f, w, 0, q) == ZS_OK, "n = 0");
        ZT_CHECK(zsk_qmatmul((zsk_qfmt)f, q, w, y, 1, 1, 48) == ZS_ERR_ARG,
                 "K = 48");
        ZT_CHECK(zsk_qmatmul((zsk_qfmt)f, q, w, y, -1, 1, 32) == ZS_ERR_ARG,
                 "M < 0");
        ZT_CHECK(zsk_qmatmul((zsk_qfmt)f, NULL, w, y, 1, 1, 32) == ZS_ERR_ARG,
                 "W NULL");
        ZT_CHECK(zsk_qmatmul((zsk_qfmt)f, q, w, y, 0, 3, 32) == ZS_OK, "M = 0");
    }
    for (int i = 0; i < 4; i++)
        ZT_CHECK(y[i] == 7, "y touched by a refused call");
    for (int i = 0; i < 256; i++)
        ZT_CHECK(q[i] == 0xab, "q touched by a refused call");
    ZT_CHECK(zsk_qmatmul((zsk_qfmt)7, q, w, y, 1, 1, 32) == ZS_ERR_ARG, "fmt 7");
    ZT_CHECK(zsk_qmatmul(ZSK_Q8_0, q, w, y, 2, 2, 0) == ZS_OK && y[0] == 0 &&
             y[3] == 0, "K = 0 zeroes y");
}

int main(void)
{
    for (int f = 0; f < 3; f++)
        for (int64_t n = 32; n <= 32 * 40; n += 32 * 13)
            check_roundtrip((zsk_qfmt)f, n, 100 + n);
    check_act(32 * 40, 3);
    check_act_paths();
    zt_section("quantize / dequantize");

    bool vnni = zsk_quant_has_vnni();
    const char *vec = vnni ? "vnni" : zsk_quant_has_avx2() ? "avx2" : "default";
    printf("vector path: %s\n", vnni || zsk_quant_has_avx2() ? vec : "no (portable only)");
    int threads = zs_num_threads();
    for (int t = 1; t <= 2; t++) {
        zs_set_num_threads(t);
        zsk_quant_force_portable(true);
        check_all_qmatmul("portable");
        zsk_quant_force_portable(false);
        check_all_qmatmul(vec);
    }
    zs_set_num_threads(threads);
    zt_section("qmatmul");

    for (int f = 0; f < 3; f++) {
        zsk_quant_force_portable(true);
        check_qmatmul_invariance((zsk_qfmt)f, "portable");
        zsk_quant_force_portable(false);
        check_qmatmul_invariance((zsk_qfmt)f, vec);
    }
    zt_section("qmatmul batch and thread invariance (bitwise)");

    check_bad_sizes();
    zt_section("bad sizes");
    return zt_done();
}
