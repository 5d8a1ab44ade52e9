/*
 * quant.c - bench/quant: matrix-vector product (M = 1, the decode step of
 * inference) with quantized weights (zsk_qmatmul) beside f32 (zsk_sgemm
 * with B transposed, and a plain dot-product loop), W [N, K] = [4096, 4096].
 *
 * GB/s = bytes of W in its format / time (x and y are 16 KB, not
 * counted). Each row: best of `reps` batches of back-to-back calls filling
 * ~50 ms, after one warm-up call. Quantized rows run on the VNNI path (when
 * the CPU has it) and on the portable C path (zsk_quant_force_portable).
 * Caveat: Q4_0's 9.4 MB and Q8_0's 17.8 MB may sit partly in a large L3,
 * so their GB/s can exceed DRAM bandwidth; f32's 64 MB cannot.
 *
 * Usage: quant [--threads N] [--reps N]   (defaults 2 and 5)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/quant.h"
#include "zs/zs.h"

#define N 4096
#define K 4096

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct job {
    int kind; /* 0: qmatmul, 1: sgemm, 2: plain loop */
    zsk_qfmt fmt;
    const void *W;
    const float *x;
    float *y;
} job;

static void run(const job *j)
{
    if (j->kind == 0) {
        zsk_qmatmul(j->fmt, j->W, j->x, j->y, 1, N, K);
    } else if (j->kind == 1) {
        zsk_sgemm(false, true, 1, N, K, 1.0f, j->x, K, j->W, K, 0.0f, j->y, N);
    } else {
        const float *W = j->W;
        for (int64_t n = 0; n < N; n++) {
            float s = 0;
            for (int64_t k = 0; k < K; k++)
                s += W[n * K + k] * j->x[k];
            j->y[n] = s;
        }
    }
}

/* Best seconds per call. */
static double time_job(const job *j, int reps)
{
    run(j);
    double t0 = now();
    run(j);
    double one = now() - t0;
    int calls = (int)(0.05 / (one > 1e-6 ? one : 1e-6)) + 1;
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        t0 = now();
        for (int c = 0; c < calls; c++)
            run(j);
        double t = (now() - t0) / calls;
        best = t < best ? t : best;
    }
    return best;
}

int main(int argc, char **argv)
{
    int threads = 2, reps = 5;
    for (int i = 1; i + 1 < argc; i++) {
        if (!strcmp(argv[i], "--threads"))
            threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps"))
            reps = atoi(argv[++i]);
    }
    zs_set_num_threads(threads);
    float *W = malloc((size_t)N * K * sizeof *W), *x = malloc(K * sizeof *x);
    float *y = malloc(N * sizeof *y);
    uint64_t s = 42;
    for (int64_t i = 0; i < (int64_t)N * K; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        W[i] = (float)((double)(s >> 11) / 9007199254740992.0 - 0.5);
    }
    for (int64_t k = 0; k < K; k++)
        x[k] = W[k * 7 % ((int64_t)N * K)];

    static const char *names[] = {"q8_0", "q4_0", "q4_1"};
    printf("matvec y[1,%d] = x[1,%d] W^T, %d threads, VNNI %s\n", N, K,
           threads, zsk_quant_has_vnni() ? "yes" : "no");
    printf("%-22s %10s %10s %8s\n", "weights / path", "MB", "ms", "GB/s");
    job jf = {1, ZSK_Q8_0, W, x, y};
    double t = time_job(&jf, reps), mb = (double)N * K * 4 / 1e6;
    printf("%-22s %10.1f %10.3f %8.1f\n", "f32 zsk_sgemm", mb, t * 1e3, mb / 1e3 / t);
    jf.kind = 2;
    t = time_job(&jf, reps);
    printf("%-22s %10.1f %10.3f %8.1f\n", "f32 plain loop (1 thr)", mb, t * 1e3,
           mb / 1e3 / t);
    for (int f = 0; f < 3; f++) {
        int64_t bytes = (int64_t)N * K / ZSK_QBLOCK * zsk_qblock_bytes((zsk_qfmt)f);
        void *Wq = malloc((size_t)bytes);
        if (!Wq || zsk_quantize((zsk_qfmt)f, W, (int64_t)N * K, Wq) < 0) {
            fprintf(stderr, "quantize %s failed: %s\n", names[f], zs_last_error());
            return 1;
        }
        job jq = {0, (zsk_qfmt)f, Wq, x, y};
        for (int portable = 0; portable <= 1; portable++) {
            if (!portable && !zsk_quant_has_vnni())
                continue;
            zsk_quant_force_portable(portable);
            t = time_job(&jq, reps);
            char label[64];
            snprintf(label, sizeof label, "%s %s", names[f],
                     portable ? "portable" : "vnni");
            printf("%-22s %10.1f %10.3f %8.1f\n", label, bytes / 1e6, t * 1e3,
                   bytes / 1e9 / t);
        }
        zsk_quant_force_portable(false);
        free(Wq);
    }
    free(W);
    free(x);
    free(y);
    return 0;
}
