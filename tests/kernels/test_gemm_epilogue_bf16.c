/*
 * test_gemm_epilogue_bf16.c - the bf16 forms of the GEMM epilogue
 * (zsk_gemm_bf16_ex with bias16, pre16, res16, out16; gemm.h; the same
 * cases in IEEE halves through zsk_gemm_f16_ex with ep.f16) and the GeLU
 * backward zsk_gelu_tanh_bw, against float64 references computed from the
 * bf16 values the inputs hold, on every 16-bit GEMM path the CPU has (the
 * vdpbf16ps one, bf16 widened to f32 panels, the portable one via
 * zsk_lowp_force_*), and ZS_CPU_ISA caps through ctest (avx2, portable:
 * the scalar epilogue and the portable GeLU backward).
 *
 * Shapes are odd (M = 45 crosses MR = 14 and MC = 42; N = 37 a 32-wide
 * tile; K = 1100 runs as two K blocks, so a bf16 output written on the
 * first block instead of the last is caught), with transposes, a residual
 * with a padded row stride, and out16 / pre16 rows padded with sentinels
 * that must stay.
 *
 * Tolerances: each result is rounded to bf16 once, by at most 2^-9 of its
 * magnitude; the f32 sums and the GeLU add ~1e-6 of the terms. So
 * |got - ref| <= 2^-8 |ref| + 1e-5 s with s the sum of the magnitudes of
 * the terms (|a_i| |b_j| + |bias| + |res|), for out16 and pre16 alike;
 * GeLU reads the pre-activation h rounded to bf16 (as autocast's gelu of
 * the bf16 linear output; recomputable from pre16), so out16 with GeLU
 * allows |gelu'| <= 1.13 times h's bound more.
 * The rounding itself must equal zs_f32_to_bf16 bit for bit (halfway
 * cases, subnormals, Inf, NaN, overflow to Inf), checked through K = 0
 * with beta = 1 (out16 = the rounding of C). Seed 4242.
 */
#include <stdlib.h>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/gemm_lowp.h"
#include "testutil.h"

#define SEED 4242u
#define SENTINEL 0x7bcdu

static uint64_t rng_state = SEED;
/* The 16-bit type of the epilogue cases: bf16, or IEEE half (the F16
 * GEMM, zsk_gemm_f16_ex with ep.f16) when set. */
static bool F16;

static float urand(void)
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(rng_state >> 40) / (double)(1ull << 23) - 1.0);
}

/* n random bf16 values in [-scale, scale). */
static uint16_t *rand16(int64_t n, float scale)
{
    uint16_t *p = malloc((size_t)(n + 1) * sizeof *p);
    for (int64_t i = 0; i < n; i++)
        p[i] = F16 ? zs_f32_to_f16(scale * urand()) : zs_f32_to_bf16(scale * urand());
    return p;
}

static double ld(const uint16_t *p, int64_t i)
{
    return F16 ? zs_f16_to_f32(p[i]) : zs_bf16_to_f32(p[i]);
}

static double gelu_d(double v)
{
    const double s = 0.7978845608028654, k = 0.044715;
    return 0.5 * v * (1.0 + tanh(s * (v + k * v * v * v)));
}

static double gelu_grad_d(double v)
{
    const double s = 0.7978845608028654, k = 0.044715;
    double t = tanh(s * (v + k * v * v * v));
    return 0.5 * (1 + t) + 0.5 * v * (1 - t * t) * s * (1 + 3 * k * v * v);
}

typedef struct epi_case {
    bool ta, tb, bias, gelu, pre, res;
    int64_t M, N, K;
} epi_case;

/* One case on the current path: returns the worst error / bound. */
static double run_case(const epi_case *e)
{
    int64_t M = e->M, N = e->N, K = e->K, ldo = N + 3, ldr = N + 5;
    int64_t lda = e->ta ? M : K, ldb = e->tb ? K : N;
    uint16_t *A = rand16(M * K, 1.0f), *B = rand16(K * N, 1.0f);
    uint16_t *bias = rand16(N, 2.0f), *res = rand16(M * ldr, 4.0f);
    uint16_t *out = malloc((size_t)(M * ldo) * sizeof *out);
    uint16_t *pre = malloc((size_t)(M * ldo) * sizeof *pre);
    float *C = malloc((size_t)(M * N) * sizeof *C);
    for (int64_t i = 0; i < M * ldo; i++)
        out[i] = pre[i] = SENTINEL;
    zsk_epilogue ep = {.gelu = e->gelu, .ldp = ldo, .ldr = ldr,
                       .bias16 = e->bias ? bias : NULL,
                       .pre16 = e->pre ? pre : NULL,
                       .res16 = e->res ? res : NULL, .out16 = out, .ldo = ldo, .f16 = F16};
    (F16 ? zsk_gemm_f16_ex : zsk_gemm_bf16_ex)(e->ta, e->tb, M, N, K, 1.0f, A, lda, B, ldb,
                                                0.0f, C, N, &ep);
    double worst = 0;
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < ldo; j++) {
            int64_t o = i * ldo + j;
            if (j >= N) { /* padding stays */
                worst = out[o] == SENTINEL && pre[o] == SENTINEL ? worst : INFINITY;
                continue;
            }
            double v = 0, s = 0;
            for (int64_t k = 0; k < K; k++) {
                double a = ld(A, e->ta ? k * lda + i : i * lda + k);
                double b = ld(B, e->tb ? j * ldb + k : k * ldb + j);
                v += a * b, s += fabs(a * b);
            }
            if (e->bias)
                v += ld(bias, j), s += fabs(ld(bias, j));
            double h = v;
            if (e->pre && e->gelu) {
                double err = fabs(ld(pre, o) - h) / (0x1p-8 * fabs(h) + 1e-5 * s + 1e-30);
                worst = err > worst ? err : worst;
            } else if (pre[o] != SENTINEL) {
                worst = INFINITY;
            }
            double hb = 0; /* GeLU reads h rounded to bf16: |gelu'| <= 1.13 times that */
            if (e->gelu)
                v = gelu_d(v), hb = 1.13 * (0x1p-8 * fabs(h) + 1e-5 * s);
            if (e->res)
                v += ld(res, i * ldr + j), s += fabs(ld(res, i * ldr + j));
            double err = fabs(ld(out, o) - v) / (0x1p-8 * fabs(v) + 1e-5 * s + hb + 1e-30);
            worst = err > worst ? err : worst;
        }
    free(A), free(B), free(bias), free(res), free(out), free(pre), free(C);
    return worst;
}

static void test_epilogues(const char *path)
{
    static const int64_t dims[][3] = {{45, 37, 29}, {45, 70, 1100}, {3, 37, 30}};
    int cases = 0;
    for (int d = 0; d < 3; d++)
        for (int combo = 0; combo < 16; combo++) {
            epi_case e = {.ta = combo & 1, .tb = (combo >> 1) & 1,
                          .bias = (combo >> 2) & 1, .gelu = (combo >> 3) & 1,
                          .pre = (combo >> 3) & 1, .res = !((combo >> 2) & 1) || d == 1,
                          .M = dims[d][0], .N = dims[d][1], .K = dims[d][2]};
            double w = run_case(&e);
            cases++;
            ZT_CHECK(w <= 1.0, "%s: M %lld N %lld K %lld ta %d tb %d bias %d gelu %d "
                     "res %d: error %.3g of the bound (seed %u)", path,
                     (long long)e.M, (long long)e.N, (long long)e.K, e.ta, e.tb,
                     e.bias, e.gelu, e.res, w, SEED);
        }
    printf("  %s: %d cases\n", path, cases);
}

/* out16 = round(C) through K = 0, beta = 1: the rounding of gemm.h. */
static void test_rounding(const char *path)
{
    static const uint32_t bits[] = {
        0x3f808000u, 0x3f818000u, 0x3f80c000u, 0x3f807fffu, /* halfway, odd, above, below */
        0x00008000u, 0x00018000u, 0x80000001u, 0x007fffffu, /* subnormals */
        0x7f7fffffu, 0xff7fffffu, 0x7f800000u, 0xff800000u, /* overflow to Inf, Inf */
        0x7fc00001u, 0xffa00000u, 0x7f800001u, 0x00000000u, /* NaNs, zero */
        0x80000000u, 0x4049ffffu, 0xc2f6e979u, 0x3eaaaaabu};
    enum { NB = sizeof bits / sizeof *bits };
    float C[NB];
    uint16_t out[NB];
    for (int i = 0; i < NB; i++)
        memcpy(&C[i], &bits[i], sizeof C[i]);
    zsk_epilogue ep = {.out16 = out, .ldo = NB};
    zsk_gemm_bf16_ex(false, false, 1, NB, 0, 1.0f, NULL, 1, NULL, NB, 1.0f, C, NB, &ep);
    int bad = 0;
    for (int i = 0; i < NB; i++) {
        uint16_t want = zs_f32_to_bf16(C[i]);
        if (out[i] != want) {
            bad++;
            fprintf(stderr, "  %s: 0x%08x -> 0x%04x, want 0x%04x\n", path,
                    bits[i], out[i], want);
        }
    }
    ZT_CHECK(bad == 0, "%s: %d of %d roundings differ from zs_f32_to_bf16",
             path, bad, (int)NB);
}

/* The out16 epilogue through the driver's per-thread block of sums
 * (C = NULL) against the two-step path it replaced, computed here: the
 * whole f32 product into C (zsk_gemm_bf16), then the descriptor's
 * epilogue over all of C. out16 and pre16 must agree bit for bit. Shapes
 * cross MR, MC (112 on AVX-512), NR, the column block (NC / K blocks:
 * 512 for vdpbf16ps at K = 1100, 192 for the portable path) and several K
 * blocks; A and B transposed or not with padded row strides (views into
 * wider matrices); with beta != 0 C is given and read, not written. */
static void test_bit_identity(const char *path)
{
    static const int64_t dims[][3] = {
        {130, 530, 1100}, {45, 37, 29}, {113, 33, 1537}, {17, 1030, 64}};
    const zsk_gemm_desc *d = zsk_gemm_desc_for(ZSK_GEMM_BF16);
    int cases = 0;
    for (int s = 0; s < 4; s++)
        for (int combo = 0; combo < 8; combo++) {
            int64_t M = dims[s][0], N = dims[s][1], K = dims[s][2];
            bool ta = combo & 1, tb = combo >> 1 & 1, gelu = combo >> 2 & 1;
            float beta = s == 1 && combo == 3 ? 0.5f : 0.0f;
            int64_t lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 5;
            int64_t ldo = N + 3, ldr = N + 7, ldc = N + 1;
            uint16_t *A = rand16((ta ? K : M) * lda, 1.0f);
            uint16_t *B = rand16((tb ? N : K) * ldb, 1.0f);
            uint16_t *bias = rand16(N, 2.0f), *res = rand16(M * ldr, 4.0f);
            float *C = malloc((size_t)(M * ldc) * sizeof *C);
            float *C0 = malloc((size_t)(M * ldc) * sizeof *C0);
            float *C1 = malloc((size_t)(M * ldc) * sizeof *C1);
            uint16_t *o[2], *h[2];
            for (int v = 0; v < 2; v++) {
                o[v] = malloc((size_t)(M * ldo) * 2);
                h[v] = malloc((size_t)(M * ldo) * 2);
                for (int64_t i = 0; i < M * ldo; i++)
                    o[v][i] = h[v][i] = SENTINEL;
            }
            for (int64_t i = 0; i < M * ldc; i++)
                C[i] = C0[i] = C1[i] = 3.0f * urand();
            for (int v = 0; v < 2; v++) {
                zsk_epilogue ep = {.gelu = gelu, .ldp = ldo, .ldr = ldr,
                                   .bias16 = combo & 2 ? bias : NULL,
                                   .pre16 = gelu ? h[v] : NULL,
                                   .res16 = combo & 1 ? res : NULL,
                                   .out16 = o[v], .ldo = ldo};
                if (v == 0) { /* the old two steps */
                    zsk_gemm_bf16(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, beta,
                                  C, ldc);
                    d->epi(C, ldc, M, N, C, ldc, 0.0f, &ep);
                } else {
                    zsk_gemm_bf16_ex(ta, tb, M, N, K, 1.0f, A, lda, B, ldb,
                                     beta, beta != 0.0f ? C0 : NULL, ldc, &ep);
                }
            }
            bool same = !memcmp(o[0], o[1], (size_t)(M * ldo) * 2) &&
                        !memcmp(h[0], h[1], (size_t)(M * ldo) * 2);
            bool kept = !memcmp(C0, C1, (size_t)(M * ldc) * sizeof *C0);
            ZT_CHECK(same && kept, "%s: M %lld N %lld K %lld ta %d tb %d gelu %d "
                     "beta %g: out16/pre16 %s the two-step path's, C %s (seed %u)",
                     path, (long long)M, (long long)N, (long long)K, ta, tb, gelu,
                     beta, same ? "equal" : "differ from", kept ? "kept" : "written",
                     SEED);
            cases++;
            free(A), free(B), free(bias), free(res), free(C), free(C0), free(C1);
            for (int v = 0; v < 2; v++)
                free(o[v]), free(h[v]);
        }
    printf("  %s: %d bit-identity cases\n", path, cases);
}

/* Out of memory for the driver's buffers: the unpacked fallback still
 * writes the right out16 (against float64, as test_epilogues). */
static void test_oom(const char *path)
{
    epi_case e = {.bias = true, .gelu = true, .pre = true, .res = true,
                  .M = 45, .N = 70, .K = 1100};
    zs_alloc_fail_after(1);
    double w = run_case(&e);
    zs_alloc_fail_after(0);
    ZT_CHECK(w <= 1.0, "%s: out of memory fallback: error %.3g of the bound "
             "(seed %u)", path, w, SEED);
}

/* zsk_gelu_tanh_bw on each of its paths (portable, AVX-512, AVX2) and the
 * threaded entry (whichever path the ISA cap picks). */
static void test_gelu_bw(void)
{
    const int64_t n = 4099;
    float *g = malloc(n * sizeof *g), *h = malloc(n * sizeof *h);
    float *o = malloc(n * sizeof *o);
    uint16_t *g16 = malloc(n * 2), *h16 = malloc(n * 2), *o16 = malloc(n * 2);
    for (int64_t i = 0; i < n; i++) {
        g[i] = 3.0f * urand();
        h[i] = i < 64 ? (float)(i - 32) * 0.5f : 8.0f * urand(); /* -16 .. 15.5 */
        g16[i] = zs_f32_to_bf16(g[i]);
        h16[i] = zs_f32_to_bf16(h[i]);
    }
    const zs_cpu_features *f = zs_cpu();
    bool vec = f->avx512f && f->avx512bw && f->avx512vl, v2 = f->avx2 && f->fma;
    for (int path = 0; path < 4; path++) {
        if ((path == 1 && !vec) || (path == 3 && !v2))
            continue;
        const char *name = path == 0 ? "portable" : path == 1 ? "avx512"
                         : path == 2 ? "threaded" : "avx2";
        for (int bf = 0; bf < 2; bf++) {
            const void *gp = bf ? (const void *)g16 : g, *hp = bf ? (const void *)h16 : h;
            void *op = bf ? (void *)o16 : o;
            if (path == 0)
                zsk_gelu_tanh_bw_ref(bf, gp, hp, op, n);
            else if (path == 1)
                zsk_gelu_tanh_bw_avx512(bf, gp, hp, op, n);
            else if (path == 3)
                zsk_gelu_tanh_bw_avx2(bf, gp, hp, op, n);
            else
                zsk_gelu_tanh_bw(bf, gp, hp, op, n);
            double worst = 0;
            for (int64_t i = 0; i < n; i++) {
                double gv = bf ? ld(g16, i) : g[i], hv = bf ? ld(h16, i) : h[i];
                double ref = gv * gelu_grad_d(hv), got = bf ? ld(o16, i) : o[i];
                double tol = bf ? 0x1p-8 * fabs(ref) + 1e-6 * fabs(gv)
                                : 1e-6 * fabs(ref) + 1e-6 * fabs(gv);
                double e = fabs(got - ref) / (tol + 1e-30);
                worst = e > worst ? e : worst;
            }
            ZT_CHECK(worst <= 1.0, "gelu backward %s %s: error %.3g of the bound "
                     "(seed %u)", name, bf ? "bf16" : "f32", worst, SEED);
        }
    }
    free(g), free(h), free(o), free(g16), free(h16), free(o16);
    zt_section("gelu_tanh backward (bf16, f32) against float64");
}

int main(void)
{
    printf("bf16 path: %s\n", zsk_gemm_desc_for(ZSK_GEMM_BF16)->name);
    for (int p = 0; p < 3; p++) {
        zsk_lowp_force_fallback = p == 2;
        zsk_lowp_force_bf16_as_f32 = p == 1;
        const char *name = zsk_gemm_desc_for(ZSK_GEMM_BF16)->name;
        for (int t = 1; t <= 2; t++) {
            zs_set_num_threads(t);
            char path[96];
            snprintf(path, sizeof path, "%s, %d thread%s", name, t, t > 1 ? "s" : "");
            test_epilogues(path);
            test_rounding(path);
            test_bit_identity(path);
            test_oom(path);
        }
    }
    zsk_lowp_force_fallback = zsk_lowp_force_bf16_as_f32 = false;
    zt_section("bf16 epilogues (bias16, gelu + pre16, res16, out16) and rounding");
    /* the same cases in IEEE halves (a linear layer under --precision
     * fp16): the F16 GEMM's paths, the bound of one bf16 rounding covering
     * the half's (2^-11) */
    F16 = true;
    for (int p = 0; p < 2; p++) {
        zsk_lowp_force_fallback = p == 1;
        char path[96];
        snprintf(path, sizeof path, "f16: %s", zsk_gemm_desc_for(ZSK_GEMM_F16)->name);
        zs_set_num_threads(2);
        test_epilogues(path);
    }
    zsk_lowp_force_fallback = false;
    F16 = false;
    zt_section("f16 epilogues (zsk_gemm_f16_ex, ep.f16)");
    test_gelu_bw();
    return zt_done();
}
