/*
 * test_qpacked.c - kernels/cpu/qpacked.c: block-quantized weights in 16-row
 * tiles and the linear layer on them.
 *
 * (1) zsk_qpack then zsk_qunpack gives back quant.h's blocks byte for byte
 *     (N with tails 1 .. 17 rows past a tile), and zsk_qpacked_row gives
 *     the bits zsk_dequantize gives for that row.
 * (2) zsk_qpacked_linear (no bias, no act) against sum_k W'[n,k] x'[m,k] in
 *     float64, W' the dequantized weights and x' the dequantized activation
 *     blocks (zsk_quantize_q8x): the block sums are exact integers, so the
 *     only error is f32 scaling and accumulation, within 1e-5 * sum |W' x'|.
 *     Every format, odd M and N, strided x and y.
 * (3) bitwise: the vector (VNNI or AVX2) and portable paths agree (two
 *     K, one with an odd block count); a row alone (M = 1) gives
 *     the bits it gives in a batch of 9 (and at any position); 1 and 2
 *     threads agree; bias + GeLU + residual (also y as its own residual)
 *     give exactly zsk_linear_epilogue applied to the plain product.
 * (4) bad arguments are refused with ZS_ERR_ARG and a message, y untouched.
 */
#include <stdlib.h>

#include "kernels/cpu/qpacked.h"
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

static const char *fname[] = {"q8_0", "q4_0", "q4_1"};

/* Random weights with block scales spread over 10^-2 .. 10^2, a zero block
 * and an outlier, quantized: a malloc'd buffer of N * K / 32 blocks. */
static unsigned char *make_blocks(zsk_qfmt f, int64_t N, int64_t K, uint64_t seed)
{
    float *w = malloc((size_t)(N * K) * sizeof *w);
    unsigned char *q = malloc((size_t)(N * K / 32 * zsk_qblock_bytes(f)));
    uint64_t s = seed;
    for (int64_t i = 0; i < N * K; i++) {
        int64_t b = i / 32;
        float sc = powf(10.0f, (float)(b % 5) - 2.0f);
        w[i] = b == 1 ? 0.0f : urand(&s) * sc;
        if (b % 7 == 2 && i % 32 == 7)
            w[i] = -25.0f * sc;
    }
    ZT_CHECK(zsk_quantize(f, w, N * K, q) == ZS_OK, "quantize");
    free(w);
    return q;
}

static float *make_x(int64_t n, uint64_t seed)
{
    float *x = malloc((size_t)n * sizeof *x);
    uint64_t s = seed;
    for (int64_t i = 0; i < n; i++)
        x[i] = urand(&s) * (i % 64 == 5 ? 30.0f : 1.0f);
    return x;
}

/* ---- (1) ------------------------------------------------------------------ */

static void check_layout(zsk_qfmt f, int64_t N, int64_t K, uint64_t seed)
{
    size_t bytes = (size_t)(N * K / 32 * zsk_qblock_bytes(f));
    unsigned char *q = make_blocks(f, N, K, seed), *back = malloc(bytes);
    float *row = malloc((size_t)K * sizeof *row), *ref = malloc((size_t)K * sizeof *ref);
    zsk_qpacked p;
    ZT_CHECK(zsk_qpack(f, q, N, K, &p) == ZS_OK, "qpack");
    ZT_CHECK(p.tiles == (N + 15) / 16 && p.tile_bytes % 64 == 0 &&
             (uintptr_t)p.data % 64 == 0, "tiles, size, alignment");
    ZT_CHECK(zsk_qpacked_bytes(&p) == p.tiles * p.tile_bytes, "bytes");
    memset(back, 0xcd, bytes);
    ZT_CHECK(zsk_qunpack(&p, back) == ZS_OK, "qunpack");
    ZT_CHECK(memcmp(back, q, bytes) == 0, "%s N=%lld K=%lld: unpack(pack(q)) != q",
             fname[f], (long long)N, (long long)K);
    for (int64_t n = 0; n < N; n++) {
        int64_t rb = K / 32 * zsk_qblock_bytes(f);
        ZT_CHECK(zsk_qpacked_row(&p, n, row) == ZS_OK, "row");
        zsk_dequantize(f, q + n * rb, K, ref);
        ZT_CHECK(memcmp(row, ref, (size_t)K * sizeof *row) == 0,
                 "%s N=%lld K=%lld: row %lld differs from zsk_dequantize", fname[f],
                 (long long)N, (long long)K, (long long)n);
    }
    zsk_qpacked_free(&p);
    ZT_CHECK(p.data == NULL, "free zeroes");
    free(q), free(back), free(row), free(ref);
}

/* ---- (2) ------------------------------------------------------------------ */

static void check_reference(zsk_qfmt f, int64_t M, int64_t N, int64_t K, uint64_t seed,
                            const char *path)
{
    int64_t ldx = K + 3, ldy = N + 5;
    unsigned char *q = make_blocks(f, N, K, seed);
    float *x = make_x(M * ldx, seed + 1), *Wd = malloc((size_t)(N * K) * sizeof *Wd);
    float *xr = malloc((size_t)(M * K) * sizeof *xr), *y = malloc((size_t)(M * ldy) * 4);
    zsk_block_q8x *xq = malloc((size_t)(M * K / 32) * sizeof *xq);
    for (int64_t m = 0; m < M; m++)
        memcpy(xr + m * K, x + m * ldx, (size_t)K * sizeof *xr);
    zsk_dequantize(f, q, N * K, Wd);
    zsk_quantize_q8x(xr, M * K, xq);
    zsk_qpacked p;
    ZT_CHECK(zsk_qpack(f, q, N, K, &p) == ZS_OK, "qpack");
    for (int64_t i = 0; i < M * ldy; i++)
        y[i] = 12345.0f;
    ZT_CHECK(zsk_qpacked_linear(&p, x, M, ldx, NULL, NULL, 0, ZSK_ACT_NONE, y, ldy) ==
             ZS_OK, "linear");
    int bad = 0;
    for (int64_t m = 0; m < M; m++) {
        for (int64_t n = 0; n < N && bad < 3; n++) {
            double ref = 0, scale = 0;
            for (int64_t k = 0; k < K; k++) {
                const zsk_block_q8x *xb = xq + (m * K + k) / 32;
                double v = (double)Wd[n * K + k] * xb->d * xb->q[k % 32];
                ref += v;
                scale += fabs(v);
            }
            float got = y[m * ldy + n];
            if (!(fabs(got - ref) <= 1e-5 * scale + 1e-30)) {
                ZT_CHECK(0, "%s %s M=%lld N=%lld K=%lld [%lld,%lld]: got %.9g, ref %.9g",
                         fname[f], path, (long long)M, (long long)N, (long long)K,
                         (long long)m, (long long)n, got, ref);
                bad++;
            }
        }
        for (int64_t n = N; n < ldy; n++)
            ZT_CHECK(y[m * ldy + n] == 12345.0f, "y written past N");
    }
    zsk_qpacked_free(&p);
    free(q), free(x), free(Wd), free(xr), free(y), free(xq);
}

/* ---- (3) ------------------------------------------------------------------ */

typedef struct run {
    const zsk_qpacked *p;
    const float *x, *bias, *res;
    int64_t ldx;
    zsk_act act;
} run;

/* y [M, N] (contiguous) of rows m0 .. m0 + M of r's x. */
static void linear(const run *r, int64_t m0, int64_t M, float *y)
{
    int64_t N = r->p->N;
    ZT_CHECK(zsk_qpacked_linear(r->p, r->x + m0 * r->ldx, M, r->ldx, r->bias,
                                r->res ? r->res + m0 * N : NULL, N, r->act, y, N) == ZS_OK,
             "linear");
}

/* N = 163: 11 tiles, so the 4-stream M = 1 path and its tails; K = 320
 * and K = 2080 (65 blocks: an odd count, a last group of one block). */
static void check_bitwise(zsk_qfmt f, bool vec, int64_t K)
{
    int64_t M = 9, N = 163, ldx = K + 1;
    unsigned char *q = make_blocks(f, N, K, 500 + f);
    float *x = make_x(M * ldx, 600 + f), *bias = make_x(N, 7), *res = make_x(M * N, 8);
    float *y = malloc((size_t)(M * N) * 4), *y1 = malloc((size_t)N * 4);
    float *y2 = malloc((size_t)(M * N) * 4), *e = malloc((size_t)(M * N) * 4);
    zsk_qpacked p;
    ZT_CHECK(zsk_qpack(f, q, N, K, &p) == ZS_OK, "qpack");
    int threads = zs_num_threads();
    zs_set_num_threads(2);
    run plain = {&p, x, NULL, NULL, ldx, ZSK_ACT_NONE};
    linear(&plain, 0, M, y);
    /* portable vs the vector path */
    bool old = zsk_linear_force_portable(true);
    linear(&plain, 0, M, y2);
    zsk_linear_force_portable(old);
    ZT_CHECK(!vec || memcmp(y, y2, (size_t)(M * N) * 4) == 0,
             "%s K=%lld: vector and portable paths differ", fname[f], (long long)K);
    /* rows alone, rows at other positions */
    for (int64_t m = 0; m < M; m++) {
        linear(&plain, m, 1, y1);
        ZT_CHECK(memcmp(y1, y + m * N, (size_t)N * 4) == 0,
                 "%s K=%lld: row %lld alone differs from the batch of %lld", fname[f],
                 (long long)K, (long long)m, (long long)M);
    }
    linear(&plain, 3, 5, y2);
    ZT_CHECK(memcmp(y2, y + 3 * N, (size_t)(5 * N) * 4) == 0, "%s K=%lld: rows 3..7 differ",
             fname[f], (long long)K);
    zs_set_num_threads(1);
    linear(&plain, 0, M, y2);
    ZT_CHECK(memcmp(y2, y, (size_t)(M * N) * 4) == 0, "%s K=%lld: 1 vs 2 threads differ",
             fname[f], (long long)K);
    zs_set_num_threads(2);
    /* epilogue: bias, GeLU, residual; then y as its own residual */
    for (int64_t m = 0; m < M; m++)
        zsk_linear_epilogue(y + m * N, N, bias, res + m * N, ZSK_ACT_GELU_TANH, e + m * N);
    run full = {&p, x, bias, res, ldx, ZSK_ACT_GELU_TANH};
    linear(&full, 0, M, y2);
    ZT_CHECK(memcmp(y2, e, (size_t)(M * N) * 4) == 0, "%s K=%lld: fused epilogue differs",
             fname[f], (long long)K);
    memcpy(y2, res, (size_t)(M * N) * 4);
    ZT_CHECK(zsk_qpacked_linear(&p, x, M, ldx, bias, y2, N, ZSK_ACT_GELU_TANH, y2, N) ==
             ZS_OK, "in place");
    ZT_CHECK(memcmp(y2, e, (size_t)(M * N) * 4) == 0,
             "%s K=%lld: y += ... in place differs",
             fname[f], (long long)K);
    zs_set_num_threads(threads);
    zsk_qpacked_free(&p);
    free(q), free(x), free(bias), free(res), free(y), free(y1), free(y2), free(e);
}

/* ---- (4) ------------------------------------------------------------------ */

static void check_errors(void)
{
    unsigned char *q = make_blocks(ZSK_Q8_0, 4, 64, 3);
    float x[2 * 64] = {0}, y[10];
    zsk_qpacked p;
    ZT_CHECK(zsk_qpack((zsk_qfmt)7, q, 4, 64, &p) == ZS_ERR_ARG, "fmt 7");
    ZT_CHECK(zsk_qpack(ZSK_Q8_0, q, 4, 48, &p) == ZS_ERR_ARG && p.data == NULL, "K = 48");
    ZT_CHECK(zsk_qpack(ZSK_Q8_0, q, -1, 64, &p) == ZS_ERR_ARG, "N < 0");
    ZT_CHECK(zsk_qpack(ZSK_Q8_0, NULL, 4, 64, &p) == ZS_ERR_ARG, "NULL blocks");
    ZT_CHECK(zsk_qpack(ZSK_Q8_0, q, 4, 64, NULL) == ZS_ERR_ARG, "NULL out");
    zsk_qpacked zero = {0};
    zero.N = 4, zero.K = 64, zero.tiles = 1;
    ZT_CHECK(zsk_qpacked_linear(&zero, x, 1, 64, NULL, NULL, 0, 0, y, 4) == ZS_ERR_ARG,
             "unpacked weights");
    ZT_CHECK(zsk_qpacked_linear(NULL, x, 1, 64, NULL, NULL, 0, 0, y, 4) == ZS_ERR_ARG,
             "NULL weights");
    ZT_CHECK(zsk_qpack(ZSK_Q8_0, q, 4, 64, &p) == ZS_OK, "qpack");
    for (int i = 0; i < 8; i++)
        y[i] = 7.0f;
    ZT_CHECK(zsk_qpacked_linear(&p, x, 1, 63, NULL, NULL, 0, 0, y, 4) == ZS_ERR_ARG,
             "ldx < K");
    ZT_CHECK(zsk_qpacked_linear(&p, x, 2, 64, NULL, NULL, 0, 0, y, 3) == ZS_ERR_ARG,
             "ldy < N");
    ZT_CHECK(zsk_qpacked_linear(&p, x, 1, 64, NULL, NULL, 0, (zsk_act)9, y, 4) ==
             ZS_ERR_ARG, "act 9");
    ZT_CHECK(zsk_qpacked_linear(&p, x, -1, 64, NULL, NULL, 0, 0, y, 4) == ZS_ERR_ARG,
             "M < 0");
    ZT_CHECK(zsk_qpacked_linear(&p, NULL, 1, 64, NULL, NULL, 0, 0, y, 4) == ZS_ERR_ARG,
             "NULL x");
    ZT_CHECK(zsk_qpacked_linear(&p, x, 1, 64, NULL, y + 1, 4, 0, y, 4) == ZS_ERR_ARG,
             "residual overlapping y");
    ZT_CHECK(zsk_qpacked_linear(&p, x, 1, 64, NULL, NULL, 0, 0, x + 2, 4) == ZS_ERR_ARG,
             "x overlapping y");
    for (int i = 0; i < 8; i++)
        ZT_CHECK(y[i] == 7.0f, "y touched by a refused call");
    ZT_CHECK(zsk_qpacked_row(&p, 4, y) == ZS_ERR_ARG, "row 4 of 4");
    ZT_CHECK(zsk_qpacked_row(&p, -1, y) == ZS_ERR_ARG, "row -1");
    ZT_CHECK(zsk_qpacked_linear(&p, x, 0, 64, NULL, NULL, 0, 0, NULL, 4) == ZS_OK, "M = 0");
    zsk_qpacked_free(&p);
    ZT_CHECK(zsk_qpack(ZSK_Q4_1, NULL, 5, 0, &p) == ZS_OK && p.data == NULL, "K = 0");
    ZT_CHECK(zsk_qpacked_linear(&p, x, 2, 0, NULL, NULL, 0, 0, y, 5) == ZS_OK &&
             y[0] == 0 && y[9] == 0, "K = 0 gives zeros");
    zsk_qpacked_free(&p);
    zsk_qpacked_free(NULL);
    free(q);
}

int main(void)
{
    for (int f = 0; f < 3; f++)
        for (int64_t N = 1; N <= 35; N += 17)
            check_layout((zsk_qfmt)f, N, 96, 10 + N);
    check_layout(ZSK_Q4_1, 16, 32, 4);
    zt_section("pack / unpack / row");

    bool vnni = zsk_quant_has_vnni(), vec = vnni || zsk_quant_has_avx2();
    printf("vector path: %s\n", vnni ? "avx512 vnni" : vec ? "avx2" : "no (portable only)");
    static const int64_t Ms[] = {1, 4, 7}, Ns[] = {1, 16, 67}, Ks[] = {32, 96, 544};
    uint64_t seed = 1;
    for (int path = 0; path < 2; path++) {
        bool old = zsk_linear_force_portable(path == 1);
        const char *name = path ? "portable" : vnni ? "vnni" : vec ? "avx2" : "default";
        for (int f = 0; f < 3; f++)
            for (int a = 0; a < 3; a++)
                for (int b = 0; b < 3; b++)
                    for (int c = 0; c < 3; c++)
                        check_reference((zsk_qfmt)f, Ms[a], Ns[b], Ks[c], seed++, name);
        for (int f = 0; f < 3; f++) /* many tiles over the pool, two streams */
            check_reference((zsk_qfmt)f, 1, 301, 4096, seed++, name);
        zsk_linear_force_portable(old);
    }
    zt_section("linear against float64");

    for (int f = 0; f < 3; f++) {
        check_bitwise((zsk_qfmt)f, vec, 320);
        check_bitwise((zsk_qfmt)f, vec, 2080);
    }
    zt_section("paths, batch, threads, epilogue (bitwise)");

    check_errors();
    zt_section("bad arguments");
    return zt_done();
}
