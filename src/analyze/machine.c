/*
 * machine.c - measures this machine's limits: FP32 FMA peak and triad
 * memory bandwidth, so benchmarks and the roofline report fractions of what
 * the hardware can do rather than absolute times.
 *
 * Peak: each thread runs 12 independent FMA chains on 16-wide registers
 * (enough to cover the FMA latency of 4 cycles on two pipes), so the loop
 * is bound by FMA throughput only.
 */
#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "zs/analyze.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#define CHAINS 12

__attribute__((target("avx512f"))) static double fma_avx512(int64_t iters)
{
    __m512 acc[CHAINS];
    __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
    for (int i = 0; i < CHAINS; i++)
        acc[i] = _mm512_set1_ps((float)i);
    for (int64_t it = 0; it < iters; it++)
        for (int i = 0; i < CHAINS; i++)
            acc[i] = _mm512_fmadd_ps(acc[i], a, b);
    __m512 s = acc[0];
    for (int i = 1; i < CHAINS; i++)
        s = _mm512_add_ps(s, acc[i]);
    float out[16];
    _mm512_storeu_ps(out, s);
    return out[0] + (double)iters * CHAINS * 32; /* flops (value keeps it live) */
}

__attribute__((target("avx2,fma"))) static double fma_avx2(int64_t iters)
{
    __m256 acc[CHAINS];
    __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
    for (int i = 0; i < CHAINS; i++)
        acc[i] = _mm256_set1_ps((float)i);
    for (int64_t it = 0; it < iters; it++)
        for (int i = 0; i < CHAINS; i++)
            acc[i] = _mm256_fmadd_ps(acc[i], a, b);
    __m256 s = acc[0];
    for (int i = 1; i < CHAINS; i++)
        s = _mm256_add_ps(s, acc[i]);
    float out[8];
    _mm256_storeu_ps(out, s);
    return out[0] + (double)iters * CHAINS * 16;
}

static double fma_scalar(int64_t iters)
{
    float acc[CHAINS];
    for (int i = 0; i < CHAINS; i++)
        acc[i] = (float)i;
    for (int64_t it = 0; it < iters; it++)
        for (int i = 0; i < CHAINS; i++)
            acc[i] = acc[i] * 0.999999f + 1e-7f;
    float s = 0;
    for (int i = 0; i < CHAINS; i++)
        s += acc[i];
    return s * 0 + (double)iters * CHAINS * 2;
}

typedef struct peak_job {
    int64_t iters;
    double flops[256];
} peak_job;

static double run_fma(int64_t iters)
{
    const zs_cpu_features *f = zs_cpu();
    if (f->avx512f)
        return fma_avx512(iters);
    if (f->avx2 && f->fma)
        return fma_avx2(iters);
    return fma_scalar(iters);
}

static void peak_body(void *ctx, int64_t b, int64_t e)
{
    peak_job *j = ctx;
    for (int64_t t = b; t < e; t++)
        j->flops[t % 256] = floor(run_fma(j->iters));
}

double zs_measure_peak_gflops(int threads, double seconds)
{
    int old = zs_num_threads();
    if (threads != old)
        zs_set_num_threads(threads);
    peak_job j = {.iters = 1000};
    run_fma(j.iters); /* warm up (clock ramp) */
    double best = 0;
    for (;;) {
        double t0 = now();
        zs_parallel_for(threads, 1, peak_body, &j);
        double dt = now() - t0;
        double total = 0;
        for (int t = 0; t < threads && t < 256; t++)
            total += j.flops[t];
        if (dt > 0.02 && total / dt > best)
            best = total / dt;
        if (dt >= seconds / 4 && best > 0)
            break;
        j.iters *= 2;
    }
    /* one more at the final size */
    double t0 = now();
    zs_parallel_for(threads, 1, peak_body, &j);
    double dt = now() - t0, total = 0;
    for (int t = 0; t < threads && t < 256; t++)
        total += j.flops[t];
    if (total / dt > best)
        best = total / dt;
    if (threads != old)
        zs_set_num_threads(old);
    return best / 1e9;
}

typedef struct cpu_peak_job {
    int64_t iters;
    double rate[256]; /* FLOP per second of thread CPU time */
} cpu_peak_job;

static double thread_cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void cpu_peak_body(void *ctx, int64_t b, int64_t e)
{
    cpu_peak_job *j = ctx;
    for (int64_t t = b; t < e; t++) {
        double c0 = thread_cpu_s();
        double f = floor(run_fma(j->iters));
        double dc = thread_cpu_s() - c0;
        j->rate[t % 256] = dc > 0 ? f / dc : 0;
    }
}

double zs_measure_peak_gflops_cpu(int threads, double seconds)
{
    int old = zs_num_threads();
    if (threads != old)
        zs_set_num_threads(threads);
    cpu_peak_job j = {.iters = 1000};
    run_fma(j.iters); /* warm up (clock ramp) */
    double best = 0, t_end = now() + seconds;
    int runs = 0;
    while (runs < 3 || now() < t_end) {
        double c0 = thread_cpu_s();
        zs_parallel_for(threads, 1, cpu_peak_body, &j);
        for (int t = 0; t < threads && t < 256; t++)
            best = j.rate[t] > best ? j.rate[t] : best;
        if (thread_cpu_s() - c0 < 0.005) /* too short to time well */
            j.iters *= 2;
        else
            runs++;
    }
    if (threads != old)
        zs_set_num_threads(old);
    return best / 1e9;
}

typedef struct triad_job {
    float *a, *b, *c;
    float s;
} triad_job;

static void triad_body(void *ctx, int64_t lo, int64_t hi)
{
    triad_job *j = ctx;
    float *restrict a = j->a;
    const float *restrict b = j->b, *restrict c = j->c;
    for (int64_t i = lo; i < hi; i++)
        a[i] = b[i] + j->s * c[i];
}

static void init_body(void *ctx, int64_t lo, int64_t hi)
{
    triad_job *j = ctx;
    for (int64_t i = lo; i < hi; i++) {
        j->a[i] = 0;
        j->b[i] = 1;
        j->c[i] = 2;
    }
}

double zs_measure_triad_gbs(int threads, size_t bytes, int reps)
{
    int old = zs_num_threads();
    if (threads != old)
        zs_set_num_threads(threads);
    int64_t n = (int64_t)(bytes / sizeof(float));
    triad_job j = {malloc(bytes), malloc(bytes), malloc(bytes), 3.0f};
    double best = 0;
    if (j.a && j.b && j.c) {
        zs_parallel_for(n, 1 << 16, init_body, &j); /* first touch by worker */
        for (int r = 0; r < reps; r++) {
            double t0 = now();
            zs_parallel_for(n, 1 << 16, triad_body, &j);
            double dt = now() - t0;
            double gbs = 3.0 * (double)n * sizeof(float) / dt / 1e9;
            if (gbs > best)
                best = gbs;
        }
    }
    free(j.a);
    free(j.b);
    free(j.c);
    if (threads != old)
        zs_set_num_threads(old);
    return best;
}
