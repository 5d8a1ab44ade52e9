/*
 * amp.c - the loss scaler's unscale-and-check pass (kernels/cpu/amp.h).
 * Memory-bound: one read and one write per element. The check tests the
 * exponent bits (all ones: Inf or NaN) with integer operations, so the
 * loop vectorises without -ffast-math; each pool task ORs its flag into
 * one atomic.
 */
#include <stdatomic.h>
#include <string.h>

#include "kernels/cpu/amp.h"
#include "zs/core.h"

typedef struct job {
    void *x;
    double inv;
    bool f64;
    atomic_bool bad;
} job;

static bool run_f32(float *x, int64_t n, float inv)
{
    uint32_t bad = 0;
    for (int64_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &x[i], sizeof u);
        bad |= (u & 0x7f800000u) == 0x7f800000u;
        x[i] *= inv;
    }
    return bad != 0;
}

static bool run_f64(double *x, int64_t n, double inv)
{
    uint64_t bad = 0;
    for (int64_t i = 0; i < n; i++) {
        uint64_t u;
        memcpy(&u, &x[i], sizeof u);
        bad |= (u & 0x7ff0000000000000ull) == 0x7ff0000000000000ull;
        x[i] *= inv;
    }
    return bad != 0;
}

static void body(void *ctx, int64_t b, int64_t e)
{
    job *j = ctx;
    bool bad = j->f64 ? run_f64((double *)j->x + b, e - b, j->inv)
                      : run_f32((float *)j->x + b, e - b, (float)j->inv);
    if (bad)
        atomic_store_explicit(&j->bad, true, memory_order_relaxed);
}

bool zsk_unscale_f32(float *x, int64_t n, float inv)
{
    job j = {.x = x, .inv = inv};
    atomic_init(&j.bad, false);
    zs_parallel_for(n, 32768, body, &j);
    return atomic_load(&j.bad);
}

bool zsk_unscale_f64(double *x, int64_t n, double inv)
{
    job j = {.x = x, .inv = inv, .f64 = true};
    atomic_init(&j.bad, false);
    zs_parallel_for(n, 32768, body, &j);
    return atomic_load(&j.bad);
}
