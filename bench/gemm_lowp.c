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
 * Usage: gemm_lowp [--reps N] [--quick]   (--quick skips N = 50304)
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/gemm_lowp.h"
#include "zs/analyze.h"
#include "zs/zs.h"

#include "isa_cap.h"

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

int main(int argc, char **argv)
{
    int reps = 3;
    bool quick = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--quick"))
            quick = true;
        else {
            fprintf(stderr, "usage: gemm_lowp [--reps N] [--quick]\n");
            return 2;
        }
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
