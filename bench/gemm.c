/*
 * gemm.c - bench/gemm: Zhisuan's SGEMM beside OpenBLAS (cblas_sgemm) on
 * square sizes 64..4096 and the GPT-2 transformer shapes, with 1 and 2
 * threads: GFLOP/s of each, their ratio, and each as a percentage of the
 * machine's peak FP32 rate, measured in the same run with an FMA loop
 * (zs_measure_peak_gflops).
 *
 * Timing: both libraries run interleaved (one call of each per round) and
 * the best round counts, since the machine is shared and noisy. Rounds per
 * shape shrink with its size (at least 2) to keep the run near 3 minutes.
 *
 * OpenBLAS picks its kernels from OPENBLAS_CORETYPE at load time, before
 * main; the program sets that variable for the ISA cap (isa_cap.h:
 * Haswell under ZS_CPU_ISA=avx2 on an AVX-512 machine) or removes it
 * when uncapped (this machine pins it to Haswell, an AVX2 kernel), and
 * re-executes itself, so OpenBLAS runs the kernels of the same kind of
 * CPU as Zhisuan.
 *
 * Usage: gemm [--quick]   (--quick: squares up to 1024, fewer rounds)
 * The last line reads "gemm geomean zhisuan/openblas 2 threads = R", the
 * geometric mean over all shapes of the 2-thread GFLOP/s ratio.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kernels/cpu/gemm.h"
#include "zs/analyze.h"
#include "zs/zs.h"

#include "isa_cap.h"

#ifdef ZS_HAVE_OPENBLAS
#include <cblas.h>
#endif

typedef struct shape {
    const char *name;
    int64_t M, N, K;
} shape;

static const shape shapes[] = {
    {"square 64", 64, 64, 64},
    {"square 128", 128, 128, 128},
    {"square 256", 256, 256, 256},
    {"square 512", 512, 512, 512},
    {"square 1024", 1024, 1024, 1024},
    {"square 2048", 2048, 2048, 2048},
    {"square 4096", 4096, 4096, 4096},
    {"attn qkv/out 1024x768x768", 1024, 768, 768},
    {"mlp up 1024x3072x768", 1024, 3072, 768},
    {"mlp down 1024x768x3072", 1024, 768, 3072},
    {"lm head 1024x50304x768", 1024, 50304, 768},
    {"decode 1x768x768", 1, 768, 768},
    {"decode head 1x50304x768", 1, 50304, 768},
};
#define NSHAPES (int)(sizeof shapes / sizeof *shapes)

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static float *rand_buf(int64_t n, unsigned seed)
{
    float *p = malloc((size_t)n * sizeof *p);
    if (!p) {
        fprintf(stderr, "gemm: out of memory\n");
        exit(1);
    }
    for (int64_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        p[i] = (float)(seed >> 8) / 16777216.0f - 0.5f;
    }
    return p;
}

typedef struct result {
    double zs, blas; /* GFLOP/s, blas 0 when not linked */
} result;

/* Best-of-rounds GFLOP/s of C = A B (row-major, no transposes). */
static result measure(const shape *s, int rounds, float *A, float *B, float *C)
{
    double flops = 2.0 * (double)s->M * (double)s->N * (double)s->K;
    double best_zs = INFINITY, best_blas = INFINITY;
    for (int r = 0; r <= rounds; r++) { /* round 0 warms up */
        double t0 = now();
        zsk_sgemm(false, false, s->M, s->N, s->K, 1.0f, A, s->K, B, s->N,
                  0.0f, C, s->N);
        double t1 = now();
        if (r > 0 && t1 - t0 < best_zs)
            best_zs = t1 - t0;
#ifdef ZS_HAVE_OPENBLAS
        t0 = now();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)s->M,
                    (int)s->N, (int)s->K, 1.0f, A, (int)s->K, B, (int)s->N,
                    0.0f, C, (int)s->N);
        t1 = now();
        if (r > 0 && t1 - t0 < best_blas)
            best_blas = t1 - t0;
#endif
    }
    result res = {flops / best_zs * 1e-9, 0};
#ifdef ZS_HAVE_OPENBLAS
    res.blas = flops / best_blas * 1e-9;
#endif
    return res;
}

/* Rounds for a shape: about budget seconds at an assumed 100 GFLOP/s per
 * thread, between 2 and 30. */
static int rounds_for(const shape *s, int threads, double budget)
{
    double t = 2.0 * (double)s->M * (double)s->N * (double)s->K /
               (100e9 * threads);
    int r = (int)(budget / (2 * t));
    return r < 2 ? 2 : r > 30 ? 30 : r;
}

int main(int argc, char **argv)
{
#ifdef ZS_HAVE_OPENBLAS
    isa_cap_exec(argv);
#endif
    bool quick = argc > 1 && strcmp(argv[1], "--quick") == 0;
    double budget = quick ? 0.1 : 1.0;
    int64_t maxn = 0;
    for (int i = 0; i < NSHAPES; i++) {
        int64_t n = shapes[i].M * shapes[i].K + shapes[i].K * shapes[i].N +
                    shapes[i].M * shapes[i].N;
        maxn = n > maxn ? n : maxn;
    }
    float *A = rand_buf(maxn, 1), *B = rand_buf(maxn, 2), *C = rand_buf(maxn, 3);
    int max_threads = zs_num_threads() < 2 ? zs_num_threads() : 2;
    double peak[3] = {0};
    for (int t = 1; t <= max_threads; t++)
        peak[t] = zs_measure_peak_gflops(t, 0.3);
    static const char *const fam[] = {"gemm f32"};
#ifdef ZS_HAVE_OPENBLAS
    isa_cap_header(stdout, fam, 1, "OpenBLAS");
#else
    isa_cap_header(stdout, fam, 1, NULL);
#endif
    printf("SGEMM, C = A B row-major; zhisuan %s", zsk_gemm_isa_name());
#ifdef ZS_HAVE_OPENBLAS
    printf(", OpenBLAS %s (%s)", openblas_get_corename(), openblas_get_config());
#endif
    printf("\nmeasured FP32 peak: %.1f GFLOP/s on 1 thread, %.1f on %d\n\n",
           peak[1], peak[max_threads], max_threads);
    printf("%-28s %3s %9s %9s %6s %7s %7s\n", "shape (MxNxK)", "thr",
           "zhisuan", "openblas", "ratio", "zs%pk", "ob%pk");
    double log_sum = 0;
    int n_ratio = 0;
    for (int t = 1; t <= max_threads; t++) {
        zs_set_num_threads(t);
#ifdef ZS_HAVE_OPENBLAS
        openblas_set_num_threads(t);
#endif
        for (int i = 0; i < NSHAPES; i++) {
            const shape *s = &shapes[i];
            if (quick && s->M == s->N && s->M > 1024)
                continue;
            result r = measure(s, rounds_for(s, t, budget), A, B, C);
            double ratio = r.blas > 0 ? r.zs / r.blas : NAN;
            printf("%-28s %3d %9.1f %9.1f %6.2f %6.1f%% %6.1f%%\n", s->name, t,
                   r.zs, r.blas, ratio, 100 * r.zs / peak[t],
                   100 * r.blas / peak[t]);
            fflush(stdout);
            if (t == max_threads && r.blas > 0) {
                log_sum += log(ratio);
                n_ratio++;
            }
        }
    }
    free(A);
    free(B);
    free(C);
    if (n_ratio)
        printf("gemm geomean zhisuan/openblas %d threads = %.3f\n",
               max_threads, exp(log_sum / n_ratio));
    else
        printf("gemm geomean zhisuan/openblas %d threads = n/a (OpenBLAS not "
               "linked)\n", max_threads);
    return 0;
}
