/*
 * gemm_sched.c - bench/gemm_sched: what cutting C into several tiles per
 * thread, claimed dynamically (gemm.h: zsk_gemm_tiles_per_thread), costs
 * and gains on GPT small's 15 training products (bench/gemm_lowp --gpt:
 * M = 2048 tokens; qkv 384->1152, attention out 384->384, MLP up
 * 384->1536, MLP down 1536->384, LM head 384->4096; forward NT, dx NN,
 * dw TN), bf16 and f32.
 *
 --threads T (default 2) threads run each product with S = 1, 2, 4 row
 * tiles per thread (S = 1: one block per thread, the static split),
 * configurations alternating per round; two measurements:
 *  - work: the CPU time the GEMM's threads spent in it, summed
 *    (CLOCK_THREAD_CPUTIME_ID, zsk_gemm_count_cpu; best of the rounds),
 *    which counts the work, packing included, whatever else the machine
 *    runs: the price of smaller tiles;
 *  - wall: the median and best wall time over the rounds: what a
 *    preempted thread costs (with S = 1 its partner idles once its one
 *    block is done).
 * The load average (/proc/loadavg) is printed before and after: on a
 * quiet machine the wall columns show the overhead alone, under load the
 * gain. Never asserted anywhere.
 *
 * Usage: gemm_sched [--rounds N] [--threads T]
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/gemm_lowp.h"
#include "zs/zs.h"

typedef struct prod {
    const char *layer, *form;
    bool ta, tb;
    int64_t m, n, k;
} prod;

#define NS 3
static const int SCHED[NS] = {1, 2, 4};

static double clk(clockid_t c)
{
    struct timespec ts;
    clock_gettime(c, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void loadavg(const char *when)
{
    char s[128] = "?";
    FILE *f = fopen("/proc/loadavg", "r");
    if (f) {
        if (!fgets(s, sizeof s, f))
            strcpy(s, "?\n");
        fclose(f);
    }
    printf("load average %s: %s", when, s);
}

/* The 15 products: y = x w^T, dx = g w, dw = g^T x per layer. */
static int products(prod *p)
{
    static const struct { const char *name; int64_t k, n; } L[] = {
        {"qkv", 384, 1152}, {"attn-out", 384, 384}, {"mlp-up", 384, 1536},
        {"mlp-down", 1536, 384}, {"lm-head", 384, 4096}};
    int n = 0;
    for (int l = 0; l < 5; l++) {
        int64_t K = L[l].k, N = L[l].n, M = 2048;
        p[n++] = (prod){L[l].name, "fwd NT", false, true, M, N, K};
        p[n++] = (prod){L[l].name, "dx NN", false, false, M, K, N};
        p[n++] = (prod){L[l].name, "dw TN", true, false, N, K, M};
    }
    return n;
}

static void run(bool bf16, const prod *p, const void *a, const void *b, float *c)
{
    int64_t lda = p->ta ? p->m : p->k, ldb = p->tb ? p->k : p->n;
    if (bf16)
        zsk_gemm_bf16(p->ta, p->tb, p->m, p->n, p->k, 1.0f, a, lda, b, ldb,
                      0.0f, c, p->n);
    else
        zsk_sgemm(p->ta, p->tb, p->m, p->n, p->k, 1.0f, a, lda, b, ldb, 0.0f,
                  c, p->n);
}

static int cmp(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return a < b ? -1 : a > b;
}

int main(int argc, char **argv)
{
    int rounds = 7, threads = 2;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--rounds"))
            rounds = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--threads"))
            threads = atoi(argv[i + 1]);
    }
    rounds = rounds < 1 ? 1 : rounds > 64 ? 64 : rounds;
    prod P[15];
    int np = products(P);
    size_t big = 2048 * 4096;
    uint16_t *a16 = malloc(big * 2), *b16 = malloc(big * 2);
    float *a32 = malloc(big * 4), *b32 = malloc(big * 4), *c = malloc(big * 4);
    if (!a16 || !b16 || !a32 || !b32 || !c)
        return 1;
    for (size_t i = 0; i < big; i++) {
        float v = (float)((i * 2654435761u) % 2001) / 1000.0f - 1.0f;
        a16[i] = b16[(i * 7) % big] = zs_f32_to_bf16(v);
        a32[i] = b32[(i * 7) % big] = v;
    }
    loadavg("before");
    printf("%d threads, S row tiles per thread; work = their CPU time in the "
           "GEMM; %d rounds\n", threads, rounds);
    for (int bf = 1; bf >= 0; bf--) {
        const void *a = bf ? (const void *)a16 : a32, *b = bf ? (const void *)b16 : b32;
        double wsum[NS] = {0}, tsum[NS] = {0}, bsum[NS] = {0};
        printf("\n%-9s %-7s %16s | %-26s | %-26s\n", bf ? "bf16" : "f32", "form",
               "M x N x K", "work ms S=1 / 2 / 4", "wall ms (median) S=1 / 2 / 4");
        for (int i = 0; i < np; i++) {
            double work[NS], wall[NS][64], best[NS];
            for (int s = 0; s < NS; s++)
                work[s] = best[s] = 1e30;
            zs_set_num_threads(threads);
            zsk_gemm_count_cpu = true;
            for (int r = 0; r < rounds; r++)
                for (int s = 0; s < NS; s++) {
                    zsk_gemm_tiles_per_thread = SCHED[s];
                    if (r == 0)
                        run(bf, &P[i], a, b, c);
                    atomic_store(&zsk_gemm_cpu_ns, 0);
                    double t0 = clk(CLOCK_MONOTONIC);
                    run(bf, &P[i], a, b, c);
                    wall[s][r] = clk(CLOCK_MONOTONIC) - t0;
                    double w = 1e-9 * (double)atomic_load(&zsk_gemm_cpu_ns);
                    work[s] = w < work[s] ? w : work[s];
                    best[s] = wall[s][r] < best[s] ? wall[s][r] : best[s];
                }
            zsk_gemm_count_cpu = false;
            double med[NS];
            for (int s = 0; s < NS; s++) {
                qsort(wall[s], (size_t)rounds, sizeof(double), cmp);
                med[s] = wall[s][rounds / 2];
                wsum[s] += work[s], tsum[s] += med[s], bsum[s] += best[s];
            }
            char dims[48];
            snprintf(dims, sizeof dims, "%lldx%lldx%lld", (long long)P[i].m,
                     (long long)P[i].n, (long long)P[i].k);
            printf("%-9s %-7s %16s | %7.2f %7.2f %7.2f    | %7.2f %7.2f %7.2f\n",
                   P[i].layer, P[i].form, dims, 1e3 * work[0], 1e3 * work[1],
                   1e3 * work[2], 1e3 * med[0], 1e3 * med[1], 1e3 * med[2]);
        }
        printf("%-34s | %7.1f %7.1f %7.1f    | %7.1f %7.1f %7.1f (best %.1f %.1f %.1f)\n",
               "sum", 1e3 * wsum[0], 1e3 * wsum[1], 1e3 * wsum[2], 1e3 * tsum[0],
               1e3 * tsum[1], 1e3 * tsum[2], 1e3 * bsum[0], 1e3 * bsum[1],
               1e3 * bsum[2]);
        printf("gemm_sched %s work S=2/S=1 = %.3f, S=4/S=1 = %.3f; wall median "
               "S=2/S=1 = %.3f, S=4/S=1 = %.3f\n", bf ? "bf16" : "f32",
               wsum[1] / wsum[0], wsum[2] / wsum[0], tsum[1] / tsum[0],
               tsum[2] / tsum[0]);
    }
    loadavg("after");
    zsk_gemm_tiles_per_thread = 0;
    free(a16), free(b16), free(a32), free(b32), free(c);
    return 0;
}
