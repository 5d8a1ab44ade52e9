/*
 * threadpool.c - bench/threadpool: the dispatch overhead of zs_parallel_for
 * (src/core/thread.c), i.e. what one operator call pays for going through
 * the pool before any real work is done.
 *
 * For 1 and 2 pool threads it times back-to-back calls of
 *   empty: a body that does nothing (pure dispatch + join), and
 *   tiny:  a body that sums 1024 floats split over the chunks,
 * each over n = 2 * threads items with grain 1 (so every thread gets a
 * chunk), plus the same bodies called directly ("serial"), for reference.
 * A last row ("after idle") spaces the empty calls 5 ms apart, long enough
 * for the workers to stop spinning and sleep on the condition variable, so
 * it shows the wake-up cost an operator pays after a pause.
 * Each call is timed alone with a monotonic clock; the table gives the
 * median and the 99th percentile in microseconds (the clock read itself
 * costs ~20-30 ns and is included), and the share of chunks that pool
 * workers ran rather than the caller: chunks are claimed dynamically, so
 * when a worker is slow to notice a job (descheduled on a busy machine)
 * the caller runs every chunk itself and the call looks serial.
 *
 * Usage: threadpool [--quick] [--calls N]   (--quick: 2000 calls per row)
 * Nothing is asserted: the machine may be shared and p99 is noisy.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "zs/zs.h"

#define TINY_N 1024

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct tiny_ctx {
    const float *x;
    int64_t n;          /* items the range [0, n) is split into */
    /* chunks run by pool thread t at [16 * t] (a cache line each) */
    int64_t chunks[16 * 256];
    volatile float sink[256];
} tiny_ctx;

/* Counts the chunk and nothing else. */
static void empty_body(void *ctx, int64_t b, int64_t e)
{
    tiny_ctx *c = ctx;
    (void)b;
    (void)e;
    c->chunks[16 * (zs_thread_index() & 255)]++;
}

/* Sums the share of x that items [b, e) stand for. */
static void tiny_body(void *ctx, int64_t b, int64_t e)
{
    tiny_ctx *c = ctx;
    int64_t lo = TINY_N * b / c->n, hi = TINY_N * e / c->n;
    float s = 0;
    for (int64_t i = lo; i < hi; i++)
        s += c->x[i];
    int t = zs_thread_index() & 255;
    c->sink[t] = s;
    c->chunks[16 * t]++;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

typedef struct stat {
    double median_us, p99_us;
    double worker_pct; /* chunks run by threads other than the caller */
} stat;

static void sleep_ms(int ms)
{
    struct timespec ts = {0, (long)ms * 1000000L};
    nanosleep(&ts, NULL);
}

/* Times `calls` calls of fn over n items (pool when pooled, else direct),
 * each after idle_ms of sleep when idle_ms > 0. */
static stat time_calls(zs_range_fn fn, tiny_ctx *ctx, int64_t n, bool pooled,
                       int calls, int idle_ms, double *t)
{
    for (int i = 0; i < calls / 10 + 10; i++) /* warm-up: wake the workers */
        pooled ? zs_parallel_for(n, 1, fn, ctx) : fn(ctx, 0, n);
    memset(ctx->chunks, 0, sizeof ctx->chunks);
    for (int i = 0; i < calls; i++) {
        if (idle_ms > 0)
            sleep_ms(idle_ms);
        double t0 = now();
        if (pooled)
            zs_parallel_for(n, 1, fn, ctx);
        else
            fn(ctx, 0, n);
        t[i] = now() - t0;
    }
    qsort(t, (size_t)calls, sizeof *t, cmp_double);
    int p99 = (int)((double)calls * 0.99);
    if (p99 >= calls)
        p99 = calls - 1;
    int64_t all = 0;
    for (int i = 0; i < 256; i++)
        all += ctx->chunks[16 * i];
    double w = all ? 100.0 * (double)(all - ctx->chunks[0]) / (double)all : 0;
    return (stat){t[calls / 2] * 1e6, t[p99] * 1e6, w};
}

static void row(const char *body, const char *mode, int threads, stat s)
{
    printf("%-8s %-12s %8d %12.3f %12.3f %10.0f%%\n", body, mode, threads,
           s.median_us, s.p99_us, s.worker_pct);
}

int main(int argc, char **argv)
{
    int calls = 20000;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick"))
            calls = 2000;
        else if (!strcmp(argv[i], "--calls") && i + 1 < argc)
            calls = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: threadpool [--quick] [--calls N]\n");
            return 2;
        }
    }
    if (calls < 100)
        calls = 100;
    double *t = malloc((size_t)calls * sizeof *t);
    float *x = malloc(TINY_N * sizeof *x);
    if (!t || !x) {
        fprintf(stderr, "threadpool: out of memory\n");
        return 1;
    }
    for (int i = 0; i < TINY_N; i++)
        x[i] = (float)i / TINY_N;
    tiny_ctx tc = {.x = x};
    int saved = zs_num_threads();

    printf("zs_parallel_for dispatch overhead, %d calls per row, "
           "n = 2 x threads items, grain 1\n", calls);
    printf("%-8s %-12s %8s %12s %12s %11s\n", "body", "mode", "threads",
           "median us", "p99 us", "by workers");
    static const char *names[2] = {"empty", "tiny"};
    zs_range_fn fns[2] = {empty_body, tiny_body};
    for (int b = 0; b < 2; b++) {
        tc.n = 1;
        row(names[b], "serial", 1, time_calls(fns[b], &tc, 1, false, calls, 0, t));
        for (int th = 1; th <= 2; th++) {
            zs_set_num_threads(th);
            tc.n = 2 * th;
            row(names[b], "pool", th, time_calls(fns[b], &tc, tc.n, true, calls, 0, t));
        }
    }
    int idle_calls = calls / 50 < 40 ? 40 : calls / 50;
    zs_set_num_threads(2);
    tc.n = 4;
    row("empty", "after idle", 2,
        time_calls(empty_body, &tc, tc.n, true, idle_calls, 5, t));
    printf("(tiny = sum of %d floats; serial = the body called directly; "
           "after idle: %d calls, each after 5 ms asleep)\n", TINY_N,
           idle_calls);
    zs_set_num_threads(saved);
    free(t);
    free(x);
    return 0;
}
