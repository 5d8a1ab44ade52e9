/*
 * gemm_lowp.c - bench/gemm_lowp: BF16 and FP16 GEMM (16-bit inputs, f32
 * accumulation and output) beside Zhisuan's own SGEMM on the same shapes.
 *
 * Shapes (M, N, K): squares 256..2048 and the transformer shapes
 * (1024,768,768), (1024,3072,768), (1024,768,3072), (1024,50304,768),
 * (1,768,768); C = A B, no transposes, 1 and 2 threads. GFLOP/s = 2MNK /
 * best time over the repetitions (at least --reps, and at least 0.3 s of
 * runs after one warm-up). The %peak columns divide by the FP32 FMA peak
 * that zs_measure_peak_gflops measures in this run on the same thread
 * count (vdpbf16ps can reach about twice that). Ratio = bf16 / sgemm.
 * "Large" shapes (every dimension >= 768) feed the last line:
 * `gemm bf16/sgemm large-shape geomean 2 threads = R`.
 *
 * --gpt: instead, the products of GPT small's linear layers in training
 * (M = 2048 tokens = batch 8 x 256; layers qkv 384->1152, attention out
 * 384->384, MLP up 384->1536, MLP down 1536->384, LM head 384->4096), each
 * in its three forms: forward y = x w^T (NT: 2048 x N x K), dx = g w (NN:
 * 2048 x K x N) and dw = g^T x (TN: N x K x 2048), as src/ops/linear.c
 * calls them, 2 threads (--threads T to change). Columns: Zhisuan bf16
 * and f32 GFLOP/s, the bf16 one as % of the bf16 peak (2x the measured
 * FP32 FMA peak: vdpbf16ps does two multiply-adds per f32 lane), and
 * OpenBLAS's cblas_sbgemm / cblas_sgemm when the linked OpenBLAS has them
 * (looked up at run time; Debian's 0.3.21 has no sbgemm), capped as
 * bench/isa_cap.h says. Zhisuan and the peer alternate per round, best
 * round counts. Last line: `gemm bf16 gpt-small %bf16peak geomean = P`
 * over the shapes with min(M, N, K) >= 384 and max >= 1152 ("large").
 *
 * Usage: gemm_lowp [--reps N] [--quick] [--gpt [--threads T]]
 *   (--quick skips N = 50304)
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <dlfcn.h>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/gemm_lowp.h"
#include "zs/analyze.h"
#include "zs/zs.h"

#include "isa_cap.h"

#ifdef ZS_HAVE_OPENBLAS
#include <cblas.h>
#endif

typedef struct shape {
    int64_t m, n, k;
} shape;

static const shape SHAPES[] = {
    {256, 256, 256},    {512, 512, 512},     {1024, 1024, 1024},
    {1536, 1536, 1536}, {2048, 2048, 2048},  {1024, 768, 768},
    {1024, 3072, 768},  {1024, 768, 3072},   {1024, 50304, 768},
    {1, 768, 768},
};
#define NSHAPES (int)(sizeof SHAPES / sizeof *SHAPES)

typedef enum kind { K_BF16, K_F16, K_F32 } kind;

typedef struct bufs {
    uint16_t *a16, *b16, *ah, *bh;
    float *a32, *b32, *c;
} bufs;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void run(kind k, const shape *s, const bufs *b)
{
    if (k == K_BF16)
        zsk_gemm_bf16(false, false, s->m, s->n, s->k, 1, b->a16, s->k, b->b16,
                      s->n, 0, b->c, s->n);
    else if (k == K_F16)
        zsk_gemm_f16(false, false, s->m, s->n, s->k, 1, b->ah, s->k, b->bh,
                     s->n, 0, b->c, s->n);
    else
        zsk_sgemm(false, false, s->m, s->n, s->k, 1, b->a32, s->k, b->b32,
                  s->n, 0, b->c, s->n);
}

/* Best GFLOP/s of kind k on shape s. */
static double measure(kind k, const shape *s, const bufs *b, int reps)
{
    run(k, s, b);
    double best = 1e30, start = now();
    for (int r = 0; r < reps || now() - start < 0.3; r++) {
        double t0 = now();
        run(k, s, b);
        double t = now() - t0;
        best = t < best ? t : best;
    }
    return 2.0 * (double)(s->m * s->n * s->k) / best * 1e-9;
}

/* Random [-1, 1) inputs in all three formats (same values up to rounding). */
static int bufs_init(bufs *b, const shape *s)
{
    size_t na = (size_t)(s->m * s->k), nb = (size_t)(s->k * s->n);
    b->a16 = malloc(na * 2), b->ah = malloc(na * 2), b->a32 = malloc(na * 4);
    b->b16 = malloc(nb * 2), b->bh = malloc(nb * 2), b->b32 = malloc(nb * 4);
    b->c = malloc((size_t)(s->m * s->n) * 4);
    if (!b->a16 || !b->ah || !b->a32 || !b->b16 || !b->bh || !b->b32 || !b->c)
        return -1;
    uint64_t x = 42;
    for (size_t i = 0; i < na + nb; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        float v = (float)(x >> 40) / 8388608.0f - 1.0f;
        uint16_t h = zs_f32_to_bf16(v), f = zs_f32_to_f16(v);
        if (i < na)
            b->a16[i] = h, b->ah[i] = f, b->a32[i] = zs_bf16_to_f32(h);
        else
            b->b16[i - na] = h, b->bh[i - na] = f, b->b32[i - na] = zs_bf16_to_f32(h);
    }
    return 0;
}

static void bufs_free(bufs *b)
{
    free(b->a16), free(b->ah), free(b->a32);
    free(b->b16), free(b->bh), free(b->b32);
    free(b->c);
}

static bool is_large(const shape *s)
{
    return s->m >= 768 && s->n >= 768 && s->k >= 768;
}

/* ---- --gpt: GPT small's linear layers in training ----------------------- */

typedef struct gpt_shape {
    const char *layer, *form;
    bool ta, tb;
    int64_t m, n, k;
} gpt_shape;

#define GPT_T 2048
#define GPT_LAYER(NAME, IN, OUT)                                              \
    {NAME, "fwd NT", false, true, GPT_T, OUT, IN},                            \
    {NAME, "dx NN", false, false, GPT_T, IN, OUT},                            \
    {NAME, "dw TN", true, false, OUT, IN, GPT_T}

static const gpt_shape GPT_SHAPES[] = {
    GPT_LAYER("qkv", 384, 1152),      GPT_LAYER("attn out", 384, 384),
    GPT_LAYER("mlp up", 384, 1536),   GPT_LAYER("mlp down", 1536, 384),
    GPT_LAYER("lm head", 384, 4096),
};
#define NGPT (int)(sizeof GPT_SHAPES / sizeof *GPT_SHAPES)

/* cblas_sbgemm's signature (bf16 as uint16_t), found at run time. */
typedef void (*sbgemm_fn)(int order, int ta, int tb, int m, int n, int k,
                          float alpha, const uint16_t *a, int lda,
                          const uint16_t *b, int ldb, float beta, float *c,
                          int ldc);

typedef enum gkind { G_BF16, G_F32, G_SB, G_SGEMM } gkind;

/* One call of kind k on s: A is op(A) stored as s says, ld = its row
 * length; likewise B. */
static void gpt_run(gkind k, const gpt_shape *s, const bufs *b, sbgemm_fn sb)
{
    int64_t lda = s->ta ? s->m : s->k, ldb = s->tb ? s->k : s->n;
    switch (k) {
    case G_BF16:
        zsk_gemm_bf16(s->ta, s->tb, s->m, s->n, s->k, 1, b->a16, lda, b->b16,
                      ldb, 0, b->c, s->n);
        break;
    case G_F32:
        zsk_sgemm(s->ta, s->tb, s->m, s->n, s->k, 1, b->a32, lda, b->b32, ldb,
                  0, b->c, s->n);
        break;
    case G_SB:
        sb(101, s->ta ? 112 : 111, s->tb ? 112 : 111, (int)s->m, (int)s->n,
           (int)s->k, 1, b->a16, (int)lda, b->b16, (int)ldb, 0, b->c,
           (int)s->n);
        break;
    case G_SGEMM:
#ifdef ZS_HAVE_OPENBLAS
        cblas_sgemm(CblasRowMajor, s->ta ? CblasTrans : CblasNoTrans,
                    s->tb ? CblasTrans : CblasNoTrans, (int)s->m, (int)s->n,
                    (int)s->k, 1, b->a32, (int)lda, b->b32, (int)ldb, 0, b->c,
                    (int)s->n);
#endif
        break;
    }
}

static int gpt_main(int threads, int reps)
{
    sbgemm_fn sb = (sbgemm_fn)(uintptr_t)dlsym(RTLD_DEFAULT, "cblas_sbgemm");
    bool have_sgemm = false;
#ifdef ZS_HAVE_OPENBLAS
    have_sgemm = true;
    openblas_set_num_threads(threads);
#endif
    static const char *const fam[] = {"gemm bf16", "gemm f32"};
    isa_cap_header(stdout, fam, 2, have_sgemm ? "OpenBLAS" : NULL);
    zs_set_num_threads(threads);
    double peak = 2.0 * zs_measure_peak_gflops(threads, 0.5);
    printf("GPT small linears, %d threads; bf16 peak %.1f GFLOP/s (2x the "
           "measured FP32 FMA peak); OpenBLAS sbgemm: %s\n", threads, peak,
           sb ? "yes" : "not in the linked OpenBLAS");
    printf("%-9s %-7s %-16s %9s %9s %7s %9s %9s\n", "layer", "form", "M,N,K",
           "zs bf16", "zs f32", "%bf16pk", "ob sbgemm", "ob sgemm");
    double geo = 0;
    int ngeo = 0;
    for (int i = 0; i < NGPT; i++) {
        const gpt_shape *s = &GPT_SHAPES[i];
        shape sh = {s->m, s->n, s->k};
        bufs b;
        if (bufs_init(&b, &sh) != 0) {
            fprintf(stderr, "gemm_lowp: out of memory\n");
            return 1;
        }
        double best[4] = {1e30, 1e30, 1e30, 1e30};
        bool on[4] = {true, true, sb != NULL, have_sgemm};
        for (int k = 0; k < 4; k++)
            if (on[k])
                gpt_run((gkind)k, s, &b, sb);
        double start = now();
        for (int r = 0; r < reps || now() - start < 0.6; r++)
            for (int k = 0; k < 4; k++) {
                if (!on[k])
                    continue;
                double t0 = now();
                gpt_run((gkind)k, s, &b, sb);
                double t = now() - t0;
                best[k] = t < best[k] ? t : best[k];
            }
        bufs_free(&b);
        double fl = 2.0 * (double)s->m * (double)s->n * (double)s->k * 1e-9;
        char name[64], g[4][16];
        snprintf(name, sizeof name, "%lld,%lld,%lld", (long long)s->m,
                 (long long)s->n, (long long)s->k);
        for (int k = 0; k < 4; k++)
            snprintf(g[k], sizeof g[k], on[k] ? "%.1f" : "-", fl / best[k]);
        double pct = 100 * fl / best[G_BF16] / peak;
        printf("%-9s %-7s %-16s %9s %9s %6.0f%% %9s %9s\n", s->layer, s->form,
               name, g[0], g[1], pct, g[2], g[3]);
        fflush(stdout);
        int64_t mn = s->m < s->n ? s->m : s->n, mx = s->m > s->n ? s->m : s->n;
        mn = mn < s->k ? mn : s->k, mx = mx > s->k ? mx : s->k;
        if (mn >= 384 && mx >= 1152) {
            geo += log(pct);
            ngeo++;
        }
    }
    printf("gemm bf16 gpt-small %%bf16peak geomean = %.1f\n",
           ngeo ? exp(geo / ngeo) : 0.0);
    return 0;
}

int main(int argc, char **argv)
{
    int reps = 3, threads = 2;
    bool quick = false, gpt = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--quick"))
            quick = true;
        else if (!strcmp(argv[i], "--gpt"))
            gpt = true;
        else {
            fprintf(stderr, "usage: gemm_lowp [--reps N] [--quick] "
                            "[--gpt [--threads T]]\n");
            return 2;
        }
    }
    if (gpt) {
        isa_cap_exec(argv);
        return gpt_main(threads < 1 ? 1 : threads, reps);
    }
    static const char *const fam[] = {"gemm bf16", "gemm f16", "gemm f32"};
    isa_cap_header(stdout, fam, 3, NULL);
    double geo = 0;
    int ngeo = 0;
    for (int threads = 1; threads <= 2; threads++) {
        zs_set_num_threads(threads);
        double peak = zs_measure_peak_gflops(threads, 0.5);
        printf("threads %d: measured FP32 FMA peak %.1f GFLOP/s\n", threads,
               peak);
        printf("%-20s %9s %9s %9s %10s %10s %11s\n", "M,N,K", "bf16", "f16",
               "sgemm", "bf16/sgemm", "bf16 %peak", "sgemm %peak");
        for (int i = 0; i < NSHAPES; i++) {
            const shape *s = &SHAPES[i];
            if (quick && s->n > 10000)
                continue;
            bufs b;
            if (bufs_init(&b, s) != 0) {
                fprintf(stderr, "gemm_lowp: out of memory\n");
                return 1;
            }
            double g16 = measure(K_BF16, s, &b, reps);
            double gh = measure(K_F16, s, &b, reps);
            double g32 = measure(K_F32, s, &b, reps);
            bufs_free(&b);
            char name[64];
            snprintf(name, sizeof name, "%lld,%lld,%lld", (long long)s->m,
                     (long long)s->n, (long long)s->k);
            printf("%-20s %9.1f %9.1f %9.1f %10.2f %9.0f%% %10.0f%%%s\n",
                   name, g16, gh, g32, g16 / g32, 100 * g16 / peak,
                   100 * g32 / peak, is_large(s) ? "  (large)" : "");
            fflush(stdout);
            if (threads == 2 && is_large(s)) {
                geo += log(g16 / g32);
                ngeo++;
            }
        }
    }
    printf("gemm bf16/sgemm large-shape geomean 2 threads = %.3f\n",
           ngeo ? exp(geo / ngeo) : 0.0);
    return 0;
}
