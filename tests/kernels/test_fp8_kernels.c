/*
 * test_fp8_kernels.c - the FP8 kernels of kernels/cpu/fp8.h against naive
 * float64 references.
 *
 * Quantizer: a per-tile reference that takes amax in double, the scale as
 * (float)(amax / fmax), and rounds each element by exact comparisons with
 * the sorted list of the format's values times the scale (products of a
 * <= 5-bit value and a 24-bit scale are exact in double): no division and
 * none of the kernel's bit tricks. Scales must be equal and codes
 * bit-exact, on the AVX-512 and the portable path, f32 and bf16 inputs,
 * rows padded or read transposed (column stride != 1),
 * 1x128 tiles, 128x128 blocks and 128x1 tiles, odd shapes (edge tiles),
 * padded rows,
 * 1 and 2 threads; then the special cases: ties at midpoints (normal and
 * subnormal), saturation (given scales), NaN, -0, zero tiles, Inf, tiny
 * amax (scale underflow).
 * Dequantize: q * s exactly. Widening: all 256 codes against the core
 * conversions.
 * GEMM: against a float64 product of the dequantized operands with the
 * same chunked scales; each element within 1e-5 * sum_k |a_ik b_jk| (the
 * products are exact, so only f32 accumulation and the two scale
 * multiplications round) on every micro-kernel the CPU runs, odd M, N, K
 * (K not a multiple of 128, K over one cache block), A with 1x128 tiles
 * (or stored transposed with 128x1 tiles),
 * B with 128x128 blocks, read transposed, or with 1x128 tiles, bias or
 * none, 1 and 2 threads.
 */
#include <stdlib.h>

#include "kernels/cpu/fp8.h"
#include "kernels/cpu/gemm.h"
#include "testutil.h"

static uint64_t rng_next(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 33;
}

static double urand(uint64_t *s) /* [-1, 1) */
{
    return (double)rng_next(s) / 2147483648.0 * 2.0 - 1.0;
}

static const char *fname(zsk_fp8_fmt f) { return f == ZSK_FP8_E4M3 ? "e4m3" : "e5m2"; }

/* ---- the reference quantizer ---------------------------------------------- */

static double vals[2][128]; /* finite non-negative values, by code */
static int nvals[2];

static void init_vals(void)
{
    for (int f = 0; f < 2; f++) {
        int n = 0;
        for (int v = 0; v < 128; v++) {
            float x = f == ZSK_FP8_E4M3 ? zs_f8e4m3_to_f32((uint8_t)v)
                                        : zs_f8e5m2_to_f32((uint8_t)v);
            if (!isfinite(x))
                break;
            vals[f][n++] = x;
        }
        nvals[f] = n;
    }
}

/* RNE_fp8(|x| / s) by exact comparisons of |x| with values times s. */
static uint8_t ref_code(zsk_fp8_fmt f, float x, float s)
{
    if (isnan(x) || (isinf(x) && isinf(s)))
        return 0x7f;
    uint8_t sign = signbit(x) ? 0x80 : 0;
    double a = fabs((double)x);
    if (isinf(s))
        return sign;
    const double *v = vals[f];
    int n = nvals[f], k = 0;
    while (k + 1 < n && v[k + 1] * s <= a)
        k++;
    if (k + 1 == n) /* at or beyond the largest: saturate */
        return sign | (uint8_t)k;
    double mid = (v[k] + v[k + 1]) / 2 * s; /* exact */
    int code = a < mid ? k : a > mid ? k + 1 : (k % 2 ? k + 1 : k);
    return sign | (uint8_t)code;
}

static float ref_scale(zsk_fp8_fmt f, double amax)
{
    if (amax == 0)
        return 1.0f;
    float s = (float)(amax / zsk_fp8_max(f));
    return s == 0.0f ? 0x1p-149f : s;
}

/* x as f32 values (bf16: the widened ones) for the reference. */
static float xval(bool bf16, const void *x, int64_t i)
{
    return bf16 ? zs_bf16_to_f32(((const uint16_t *)x)[i]) : ((const float *)x)[i];
}

/* Checks q and s of x [R, C] (element (r, c) at x[r * rs + c * cs])
 * against the reference; returns the number of mismatches. */
static int64_t check_quant(zsk_fp8_fmt f, bool bf16, const void *x, int64_t R,
                           int64_t C, int64_t rs, int64_t cs, int64_t br,
                           const uint8_t *q, const float *s, const char *what)
{
    int64_t KB = zsk_fp8_groups(C, 128), bad = 0;
    for (int64_t g = 0; g * br < R; g++)
        for (int64_t t = 0; t < KB; t++) {
            double amax = 0;
            for (int64_t r = g * br; r < R && r < (g + 1) * br; r++)
                for (int64_t c = t * 128; c < C && c < (t + 1) * 128; c++) {
                    double v = fabs((double)xval(bf16, x, r * rs + c * cs));
                    if (v > amax) /* false for NaN */
                        amax = v;
                }
            float se = ref_scale(f, amax), sg = s[g * KB + t];
            if (memcmp(&se, &sg, sizeof se) && bad++ < 5)
                fprintf(stderr, "  %s: scale of tile (%lld, %lld): %a, expected %a\n",
                        what, (long long)g, (long long)t, sg, se);
            for (int64_t r = g * br; r < R && r < (g + 1) * br; r++)
                for (int64_t c = t * 128; c < C && c < (t + 1) * 128; c++) {
                    float xv = xval(bf16, x, r * rs + c * cs);
                    uint8_t e = ref_code(f, xv, se), got = q[r * C + c];
                    if (e != got && bad++ < 5)
                        fprintf(stderr, "  %s: (%lld, %lld) x = %a s = %a: code "
                                "0x%02x, expected 0x%02x\n", what, (long long)r,
                                (long long)c, xv, se, got, e);
                }
        }
    return bad;
}

/* Random values: each tile of 1 x 32 has its own magnitude 2^[-40, 40],
 * so 128-wide tiles mix magnitudes and quantize small values to
 * subnormals and zeros. */
static void fill_rand(bool bf16, void *x, int64_t n, uint64_t *st)
{
    float mag = 1.0f;
    for (int64_t i = 0; i < n; i++) {
        if (i % 32 == 0)
            mag = ldexpf(1.0f, (int)(rng_next(st) % 81) - 40);
        float v = (float)urand(st) * mag;
        if (bf16)
            ((uint16_t *)x)[i] = zs_f32_to_bf16(v);
        else
            ((float *)x)[i] = v;
    }
}

static void test_quantize_random(void)
{
    static const int64_t Rs[] = {1, 3, 130, 257}, Cs[] = {1, 5, 127, 128, 129, 300};
    uint64_t seed = 0x5eed0001;
    for (int f = 0; f < 2; f++)
        for (int b16 = 0; b16 < 2; b16++)
            for (int br = 1; br <= 128; br += 127)
                for (size_t ri = 0; ri < sizeof Rs / sizeof *Rs; ri++)
                    for (size_t ci = 0; ci < sizeof Cs / sizeof *Cs; ci++)
                        for (int portable = 0; portable < 2; portable++) {
                            /* rows padded by 3, or x^T of a [C, R + 3]
                             * array (a transposed view) */
                            bool tr = (ri + ci) % 3 == 1;
                            int64_t R = Rs[ri], C = Cs[ci], ldx = tr ? R + 3 : C + 3;
                            int64_t rs = tr ? 1 : ldx, cs = tr ? ldx : 1;
                            int64_t nx = tr ? C * ldx : R * ldx;
                            uint64_t st = seed++;
                            size_t es = b16 ? 2 : 4;
                            void *x = malloc((size_t)nx * es);
                            fill_rand(b16, x, nx, &st);
                            uint8_t *q = malloc((size_t)(R * C));
                            float *s = malloc((size_t)(zsk_fp8_groups(R, br) *
                                                       zsk_fp8_groups(C, 128)) * 4);
                            zsk_fp8_force_portable = portable;
                            zs_set_num_threads(1 + (int)(ri % 2));
                            zsk_fp8_quantize((zsk_fp8_fmt)f, b16, x, R, C, rs, cs, br, q, s);
                            char what[128];
                            snprintf(what, sizeof what, "%s %s [%lld, %lld]%s tiles %dx128 "
                                     "%s seed %llx", fname((zsk_fp8_fmt)f),
                                     b16 ? "bf16" : "f32", (long long)R, (long long)C,
                                     tr ? " transposed" : "",
                                     br, portable ? "portable" : "default",
                                     (unsigned long long)(seed - 1));
                            int64_t bad = check_quant((zsk_fp8_fmt)f, b16, x, R, C,
                                                      rs, cs, br, q, s, what);
                            ZT_CHECK(bad == 0, "quantize %s: %lld mismatches\n", what,
                                     (long long)bad);
                            free(x);
                            free(q);
                            free(s);
                        }
    zsk_fp8_force_portable = false;
    zs_set_num_threads(2);
    zt_section("quantize: random tiles against the per-tile float64 reference");
}

/* 128 x 1 tiles: the codes and scales of x^T's 1x128 tiles, in x's layout. */
static void test_quantize_cols(void)
{
    static const int64_t Rs[] = {1, 127, 129, 300}, Cs[] = {1, 17, 300};
    uint64_t seed = 0xc015;
    for (int f = 0; f < 2; f++)
        for (int b16 = 0; b16 < 2; b16++)
            for (size_t ri = 0; ri < 4; ri++)
                for (size_t ci = 0; ci < 3; ci++)
                    for (int portable = 0; portable < 2; portable++) {
                        int64_t R = Rs[ri], C = Cs[ci], ldx = C + 2, RB = zsk_fp8_groups(R, 128);
                        uint64_t st = seed++;
                        void *x = malloc((size_t)(R * ldx) * (b16 ? 2 : 4));
                        fill_rand(b16, x, R * ldx, &st);
                        if (R > 1 && C > 1 && !b16)
                            ((float *)x)[ldx + 1] = NAN;
                        uint8_t *q = malloc((size_t)(R * C)), *qt = malloc((size_t)(R * C));
                        float *s = malloc((size_t)(RB * C) * 4), *sT = malloc((size_t)(RB * C) * 4);
                        zsk_fp8_force_portable = portable;
                        zsk_fp8_quantize_cols((zsk_fp8_fmt)f, b16, x, R, C, ldx, q, s);
                        zsk_fp8_force_portable = false;
                        for (int64_t r = 0; r < R; r++)
                            for (int64_t c = 0; c < C; c++)
                                qt[c * R + r] = q[r * C + c];
                        for (int64_t g = 0; g < RB; g++)
                            for (int64_t c = 0; c < C; c++)
                                sT[c * RB + g] = s[g * C + c];
                        char what[128];
                        snprintf(what, sizeof what, "cols %s %s [%lld, %lld] %s seed %llx",
                                 fname((zsk_fp8_fmt)f), b16 ? "bf16" : "f32", (long long)R,
                                 (long long)C, portable ? "portable" : "default",
                                 (unsigned long long)(seed - 1));
                        /* x^T [C, R]: element (c, r) at x[c + r * ldx] */
                        int64_t bad = check_quant((zsk_fp8_fmt)f, b16, x, C, R, 1, ldx, 1,
                                                  qt, sT, what);
                        ZT_CHECK(bad == 0, "quantize %s: %lld mismatches\n", what, (long long)bad);
                        free(x);
                        free(q);
                        free(qt);
                        free(s);
                        free(sT);
                    }
    zt_section("quantize: 128x1 tiles (x^T's 1x128 tiles in x's layout)");
}

/* Quantizes one row of n values with both paths (computed scales) and
 * checks against the reference; returns the codes of the default path. */
static void quant_row(zsk_fp8_fmt f, const float *x, int64_t n, uint8_t *q,
                      float *s, const char *what)
{
    uint8_t qp[512];
    float sp[4];
    zsk_fp8_force_portable = true;
    zsk_fp8_quantize(f, false, x, 1, n, n, 1, 1, qp, sp);
    zsk_fp8_force_portable = false;
    zsk_fp8_quantize(f, false, x, 1, n, n, 1, 1, q, s);
    ZT_CHECK(!memcmp(qp, q, (size_t)n) &&
                 !memcmp(sp, s, sizeof(float) * (size_t)zsk_fp8_groups(n, 128)),
             "%s %s: portable and default paths differ\n", what, fname(f));
    ZT_CHECK(check_quant(f, false, x, 1, n, n, 1, 1, q, s, what) == 0,
             "%s %s: reference mismatch\n", what, fname(f));
}

static void test_quantize_special(void)
{
    uint8_t q[512];
    float s[4];
    /* ties with scale 1 (amax = fmax): e4m3 [1, 2) has steps of 1/8 */
    float t4[] = {448.0f, 1.0625f, 1.1875f, -1.0625f, 0x1p-10f, 0x3p-10f,
                  0x7p-10f, -0x1p-10f, 0x1.04p0f, 0x1.0fffffp0f, 0.0f, -0.0f,
                  0x1p-11f, 0x1.000002p-10f};
    int n4 = (int)(sizeof t4 / sizeof *t4);
    quant_row(ZSK_FP8_E4M3, t4, n4, q, s, "ties");
    ZT_CHECK(s[0] == 1.0f, "ties: scale %g, expected 1\n", s[0]);
    uint8_t e4[] = {0x7e, 0x38, 0x3a, 0xb8, 0x00, 0x02, 0x04, 0x80, 0x38, 0x38,
                    0x00, 0x80, 0x00, 0x01};
    for (int i = 0; i < n4; i++)
        ZT_CHECK(q[i] == e4[i], "e4m3 tie/edge %a: 0x%02x, expected 0x%02x\n",
                 t4[i], q[i], e4[i]);
    /* e5m2 with scale 1: [1, 2) steps of 1/4, subnormal quantum 2^-16 */
    float t5[] = {57344.0f, 1.125f, 1.375f, 0x1p-17f, 0x3p-17f, -1.125f};
    uint8_t e5[] = {0x7b, 0x3c, 0x3e, 0x00, 0x02, 0xbc};
    quant_row(ZSK_FP8_E5M2, t5, 6, q, s, "ties");
    for (int i = 0; i < 6; i++)
        ZT_CHECK(q[i] == e5[i], "e5m2 tie %a: 0x%02x, expected 0x%02x\n", t5[i],
                 q[i], e5[i]);
    zt_section("quantize: round to nearest even at midpoints, subnormals");

    /* NaN stays NaN (0x7f), others quantize as if it were absent */
    float tn[130];
    for (int i = 0; i < 130; i++)
        tn[i] = (float)(i - 60) * 0.5f;
    tn[3] = NAN;
    tn[129] = -NAN;
    quant_row(ZSK_FP8_E4M3, tn, 130, q, s, "nan");
    ZT_CHECK(q[3] == 0x7f && q[129] == 0x7f, "NaN codes 0x%02x 0x%02x\n", q[3], q[129]);
    ZT_CHECK(s[0] == 33.5f / 448.0f && s[1] == 34.0f / 448.0f,
             "NaN ignored by amax: scales %g %g\n", s[0], s[1]);
    /* a zero tile and a -0: scale 1, codes 0 and 0x80 */
    float tz[200] = {0};
    tz[7] = -0.0f;
    tz[150] = 3.0f;
    quant_row(ZSK_FP8_E5M2, tz, 200, q, s, "zero tile");
    ZT_CHECK(s[0] == 1.0f && q[0] == 0 && q[7] == 0x80,
             "zero tile: scale %g, codes 0x%02x 0x%02x\n", s[0], q[0], q[7]);
    /* Inf: scale Inf, the Inf NaN, the rest +-0 */
    float ti[5] = {1.0f, -INFINITY, -2.0f, 0.0f, 5.0f};
    quant_row(ZSK_FP8_E4M3, ti, 5, q, s, "inf");
    ZT_CHECK(isinf(s[0]) && q[1] == 0x7f && q[0] == 0 && q[2] == 0x80,
             "Inf tile: scale %g codes 0x%02x 0x%02x 0x%02x\n", s[0], q[0], q[1], q[2]);
    /* tiny amax: the scale underflows to 0 and becomes 2^-149 */
    float tt[3] = {0x1p-148f, -0x1p-149f, 0.0f};
    quant_row(ZSK_FP8_E4M3, tt, 3, q, s, "tiny");
    ZT_CHECK(s[0] == 0x1p-149f && q[0] == 0x40 && q[1] == 0xb8,
             "tiny amax: scale %a codes 0x%02x 0x%02x\n", s[0], q[0], q[1]);
    zt_section("quantize: NaN, -0, zero tile, Inf, scale underflow");

    /* saturation with given scales (never Inf, also for e5m2) */
    float xs[6] = {1000.0f, -1e30f, 449.0f, 464.0f, 70000.0f, INFINITY};
    float one = 1.0f;
    uint8_t qp[6];
    for (int f = 0; f < 2; f++) {
        zsk_fp8_force_portable = true;
        zsk_fp8_quantize_scaled((zsk_fp8_fmt)f, false, xs, 1, 6, 6, 1, 1, &one, qp);
        zsk_fp8_force_portable = false;
        zsk_fp8_quantize_scaled((zsk_fp8_fmt)f, false, xs, 1, 6, 6, 1, 1, &one, q);
        ZT_CHECK(!memcmp(q, qp, 6), "saturation %s: paths differ\n", fname((zsk_fp8_fmt)f));
        for (int i = 0; i < 6; i++) {
            uint8_t e = ref_code((zsk_fp8_fmt)f, xs[i], 1.0f);
            ZT_CHECK(q[i] == e, "saturation %s of %g: 0x%02x, expected 0x%02x\n",
                     fname((zsk_fp8_fmt)f), xs[i], q[i], e);
        }
        uint8_t mx = f == ZSK_FP8_E4M3 ? 0x7e : 0x7b;
        ZT_CHECK(q[0] == (f == ZSK_FP8_E4M3 ? mx : 0x64) && q[1] == (0x80 | mx) &&
                     q[5] == mx, "saturation %s: 0x%02x 0x%02x 0x%02x\n",
                 fname((zsk_fp8_fmt)f), q[0], q[1], q[5]);
    }
    zt_section("quantize: saturation to +-max finite with given scales");
}

static void test_dequantize_widen(void)
{
    uint64_t st = 99;
    int64_t R = 131, C = 259;
    for (int f = 0; f < 2; f++)
        for (int br = 1; br <= 128; br += 127) {
            uint8_t *q = malloc((size_t)(R * (C + 1)));
            int64_t ns = zsk_fp8_groups(R, br) * zsk_fp8_groups(C, 128);
            float *s = malloc((size_t)ns * 4), *y = malloc((size_t)(R * C) * 4);
            for (int64_t i = 0; i < R * (C + 1); i++) {
                q[i] = (uint8_t)rng_next(&st);
                if ((q[i] & 0x7f) > (f == ZSK_FP8_E4M3 ? 0x7e : 0x7b))
                    q[i] = 0x11; /* finite codes only */
            }
            for (int64_t i = 0; i < ns; i++)
                s[i] = (float)fabs(urand(&st)) + 0.01f;
            zsk_fp8_dequantize((zsk_fp8_fmt)f, q, R, C, C + 1, br, s, y);
            int64_t bad = 0;
            for (int64_t r = 0; r < R; r++)
                for (int64_t c = 0; c < C; c++) {
                    uint8_t v = q[r * (C + 1) + c];
                    float e = (f == ZSK_FP8_E4M3 ? zs_f8e4m3_to_f32(v & 0x7f)
                                                 : zs_f8e5m2_to_f32(v & 0x7f)) *
                              (v & 0x80 ? -1.0f : 1.0f) *
                              s[(r / br) * zsk_fp8_groups(C, 128) + c / 128];
                    bad += y[r * C + c] != e;
                }
            ZT_CHECK(bad == 0, "dequantize %s br %d: %lld wrong\n",
                     fname((zsk_fp8_fmt)f), br, (long long)bad);
            free(q);
            free(s);
            free(y);
        }
    zt_section("dequantize: q * s exactly, 1x128 and 128x128");

    uint8_t codes[256 + 7];
    uint16_t out[256 + 7];
    for (int i = 0; i < 263; i++)
        codes[i] = (uint8_t)(i * 37 + 5);
    for (int f = 0; f < 2; f++)
        for (int portable = 0; portable < 2; portable++) {
            zsk_fp8_force_portable = portable;
            zsk_fp8_to_bf16((zsk_fp8_fmt)f, codes, 263, out);
            int64_t bad = 0;
            for (int i = 0; i < 263; i++) {
                uint8_t v = codes[i];
                float e = f == ZSK_FP8_E4M3 ? zs_f8e4m3_to_f32(v & 0x7f)
                                            : zs_f8e5m2_to_f32(v & 0x7f);
                float g = zs_bf16_to_f32(out[i]);
                bool sign = (out[i] & 0x8000) != 0;
                bad += isnan(e) ? !isnan(g) : (fabsf(g) != fabsf(e) || sign != !!(v & 0x80));
                bad += zsk_fp8_to_f32((zsk_fp8_fmt)f, v) != (v & 0x80 ? -e : e) && !isnan(e);
            }
            ZT_CHECK(bad == 0, "widen %s portable %d: %lld wrong\n",
                     fname((zsk_fp8_fmt)f), portable, (long long)bad);
        }
    zsk_fp8_force_portable = false;
    zt_section("widen to bf16: all codes, exact, both paths");
}

/* ---- GEMM ------------------------------------------------------------------- */

typedef enum bkind { B_BLOCKS, B_BLOCKS_T, B_TILES } bkind;

typedef struct gcase {
    int64_t M, N, K;
    bkind bk;
    bool bias;
    zsk_fp8_fmt fa;
    bool at; /* A stored [K, M] with 128x1 tiles (scales [KB, M]) */
} gcase;

/* Random finite codes of f. */
static uint8_t rcode(zsk_fp8_fmt f, uint64_t *st)
{
    uint8_t v = (uint8_t)rng_next(st);
    return (v & 0x7f) > (f == ZSK_FP8_E4M3 ? 0x7e : 0x7b) ? (uint8_t)(v & 0x8f) : v;
}

/* Returns the number of elements outside the tolerance. */
static int64_t run_gemm(const zsk_gemm_desc *d, const gcase *g, uint64_t seed)
{
    uint64_t st = seed;
    int64_t M = g->M, N = g->N, K = g->K, KB = zsk_fp8_groups(K, 128);
    int64_t lda = K + 5, ldc = N + 2;
    uint8_t *A = malloc((size_t)(M * lda));
    uint8_t *B = malloc((size_t)(N * K));
    for (int64_t i = 0; i < M * lda; i++)
        A[i] = rcode(g->fa, &st);
    for (int64_t i = 0; i < N * K; i++)
        B[i] = rcode(ZSK_FP8_E4M3, &st);
    float *sa = malloc((size_t)(M * KB) * 4);
    int64_t nsb = g->bk == B_TILES ? N * KB : zsk_fp8_groups(N, 128) * KB;
    float *sb = malloc((size_t)nsb * 4), *bias = malloc((size_t)N * 4);
    for (int64_t i = 0; i < M * KB; i++)
        sa[i] = (float)ldexp(fabs(urand(&st)) + 0.1, (int)(rng_next(&st) % 9) - 4);
    for (int64_t i = 0; i < nsb; i++)
        sb[i] = (float)ldexp(fabs(urand(&st)) + 0.1, (int)(rng_next(&st) % 9) - 4);
    for (int64_t i = 0; i < N; i++)
        bias[i] = (float)urand(&st);
    zsk_fp8_mat a = {A, lda, 1, g->fa, sa, 1, KB, 1};
    uint8_t *At = NULL;
    float *saT = NULL;
    if (g->at) {
        At = malloc((size_t)(M * K + 1));
        saT = malloc((size_t)(M * KB + 1) * 4);
        for (int64_t i = 0; i < M; i++) {
            for (int64_t k = 0; k < K; k++)
                At[k * M + i] = A[i * lda + k];
            for (int64_t c = 0; c < KB; c++)
                saT[c * M + i] = sa[i * KB + c];
        }
        a = (zsk_fp8_mat){At, 1, M, g->fa, saT, 1, 1, M};
    }
    zsk_fp8_mat b;
    int64_t NB = zsk_fp8_groups(N, 128);
    uint8_t *Bt = NULL;
    if (g->bk == B_BLOCKS) {
        b = (zsk_fp8_mat){B, K, 1, ZSK_FP8_E4M3, sb, 128, KB, 1};
    } else if (g->bk == B_TILES) {
        b = (zsk_fp8_mat){B, K, 1, ZSK_FP8_E4M3, sb, 1, KB, 1};
    } else {
        /* a weight W [K, N] with 128x128 blocks (scales [KB, NB]) read
         * transposed: B(j, k) = W[k, j] */
        Bt = malloc((size_t)(N * K));
        for (int64_t j = 0; j < N; j++)
            for (int64_t k = 0; k < K; k++)
                Bt[k * N + j] = B[j * K + k];
        b = (zsk_fp8_mat){Bt, 1, N, ZSK_FP8_E4M3, sb, 128, 1, NB};
    }
    float *C = malloc((size_t)(M * ldc) * 4);
    for (int64_t i = 0; i < M * ldc; i++)
        C[i] = NAN;
    zs_status rc = zsk_gemm_fp8_with(d, M, N, K, &a, &b, g->bias ? bias : NULL, C, ldc);
    int64_t bad = rc != ZS_OK;
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            double ref = g->bias ? bias[j] : 0, mag = fabs(ref);
            for (int64_t k = 0; k < K; k++) {
                double sbv = g->bk == B_BLOCKS ? sb[(j / 128) * KB + k / 128]
                           : g->bk == B_TILES ? sb[j * KB + k / 128]
                                              : sb[(k / 128) * NB + j / 128];
                double av = (double)zsk_fp8_to_f32(g->fa, A[i * lda + k]) *
                            sa[i * KB + k / 128];
                double bv = (double)zsk_fp8_to_f32(ZSK_FP8_E4M3, B[j * K + k]) * sbv;
                ref += av * bv;
                mag += fabs(av * bv);
            }
            double got = C[i * ldc + j];
            if (!(fabs(got - ref) <= 1e-5 * mag + 1e-30) && bad++ < 3)
                fprintf(stderr, "  (%lld, %lld): %.9g, expected %.9g (sum|ab| %g)\n",
                        (long long)i, (long long)j, got, ref, mag);
        }
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = N; j < ldc; j++)
            bad += !isnan(C[i * ldc + j]); /* padding untouched */
    free(A);
    free(B);
    free(Bt);
    free(At);
    free(saT);
    free(sa);
    free(sb);
    free(bias);
    free(C);
    return bad;
}

static void test_gemm(void)
{
    const zsk_gemm_desc *descs[16];
    int nd = zsk_gemm_descs(descs, 16);
    static const gcase cases[] = {
        {1, 1, 1, B_BLOCKS, false, ZSK_FP8_E4M3, false},
        {3, 5, 127, B_BLOCKS, true, ZSK_FP8_E4M3, false},
        {15, 33, 128, B_BLOCKS, true, ZSK_FP8_E5M2, false},
        {17, 31, 129, B_BLOCKS_T, false, ZSK_FP8_E5M2, false},
        {29, 130, 300, B_TILES, true, ZSK_FP8_E4M3, false},
        {150, 129, 257, B_BLOCKS, true, ZSK_FP8_E4M3, false},
        {131, 67, 1100, B_BLOCKS_T, true, ZSK_FP8_E5M2, false},
        {45, 260, 1100, B_TILES, false, ZSK_FP8_E5M2, false},
        {33, 19, 300, B_BLOCKS_T, false, ZSK_FP8_E5M2, true},
        {140, 70, 1100, B_BLOCKS, true, ZSK_FP8_E4M3, true},
        {7, 9, 0, B_BLOCKS, true, ZSK_FP8_E4M3, false},
    };
    int nc = (int)(sizeof cases / sizeof *cases), ran = 0;
    uint64_t seed = 0xf8f8;
    for (int di = 0; di < nd; di++) {
        const zsk_gemm_desc *d = descs[di];
        if (!(d->type == ZSK_GEMM_F32 || (d->type == ZSK_GEMM_BF16 && d->kstep == 2)))
            continue;
        for (int t = 1; t <= 2; t++) {
            zs_set_num_threads(t);
            for (int c = 0; c < nc; c++) {
                const gcase *g = &cases[c];
                int64_t bad = run_gemm(d, g, seed);
                ZT_CHECK(bad == 0, "fp8 gemm [%s, %d threads] M %lld N %lld K %lld "
                         "b %d bias %d a %s%s seed %llx: %lld bad\n", d->name, t,
                         (long long)g->M, (long long)g->N, (long long)g->K,
                         (int)g->bk, g->bias, fname(g->fa), g->at ? " (transposed)" : "",
                         (unsigned long long)seed, (long long)bad);
                seed++;
                ran++;
            }
        }
    }
    ZT_CHECK(zsk_gemm_fp8(0, 3, 3, &(zsk_fp8_mat){0}, &(zsk_fp8_mat){0}, NULL,
                          NULL, 3) == ZS_OK, "empty GEMM\n");
    zs_set_num_threads(2);
    printf("fp8 gemm: %d cases over the micro-kernels; default path %s\n", ran,
           zsk_gemm_fp8_path());
    zt_section("fp8 gemm: against float64 of the dequantized operands");
}

int main(void)
{
    init_vals();
    printf("cpu isa %s\n", zs_cpu_isa());
    test_quantize_random();
    test_quantize_cols();
    test_quantize_special();
    test_dequantize_widen();
    test_gemm();
    return zt_done();
}
