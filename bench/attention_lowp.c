/*
 * attention_lowp.c - bench/attention_lowp: zs_attention in f32, bf16 and
 * f16 on one shape, forward alone and forward + backward, in one run.
 *
 * Default shape: the GPT `small` preset's attention in training, B=8,
 * H=6, T=256, D=64, causal. bf16/f16 widen their tiles into the f32
 * kernel's loops (kernels/cpu/attention.c), so the goal is the f32 time
 * or better. Times are the best of --reps passes after one warm-up;
 * GFLOP/s counts the causal forward as 2 B H T^2 D and the backward as
 * 2.5x that (as bench/attention).
 *
 * Usage: attention_lowp [--reps N] [--B b] [--H h] [--T t] [--D d]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "zs/zs.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Best forward and forward+backward seconds of dtype dt. */
static int bench(zs_dtype dt, const int64_t *shape, int reps, double *fwd,
                 double *total)
{
    zs_tensor *q32 = zs_uniform(ZS_F32, 4, shape, -1, 1, 1);
    zs_tensor *k32 = zs_uniform(ZS_F32, 4, shape, -1, 1, 2);
    zs_tensor *v32 = zs_uniform(ZS_F32, 4, shape, -1, 1, 3);
    zs_tensor *g32 = zs_uniform(ZS_F32, 4, shape, -1, 1, 4);
    zs_tensor *t[4] = {zs_to_dtype(q32, dt), zs_to_dtype(k32, dt),
                       zs_to_dtype(v32, dt), zs_to_dtype(g32, dt)};
    zs_attention_params p = {.causal = true};
    *fwd = *total = 1e30;
    for (int r = 0; r <= reps; r++) {
        zs_no_grad_push();
        double t0 = now();
        zs_tensor *o = zs_attention(t[0], t[1], t[2], &p);
        double t1 = now();
        zs_no_grad_pop();
        if (!o)
            return -1;
        zs_release(o);
        for (int i = 0; i < 3; i++) {
            zs_set_requires_grad(t[i], true);
            zs_zero_grad(t[i], true);
        }
        double t2 = now();
        o = zs_attention(t[0], t[1], t[2], &p);
        if (!o || zs_backward(o, t[3], false) != ZS_OK)
            return -1;
        double t3 = now();
        zs_release(o);
        if (r > 0) {
            *fwd = t1 - t0 < *fwd ? t1 - t0 : *fwd;
            *total = t3 - t2 < *total ? t3 - t2 : *total;
        }
    }
    zs_tensor *all[] = {q32, k32, v32, g32, t[0], t[1], t[2], t[3]};
    for (int i = 0; i < 8; i++)
        zs_release(all[i]);
    return 0;
}

int main(int argc, char **argv)
{
    int64_t shape[4] = {8, 6, 256, 64};
    int reps = 10;
    for (int i = 1; i + 1 < argc; i += 2) {
        long v = atol(argv[i + 1]);
        if (!strcmp(argv[i], "--reps"))
            reps = (int)v;
        else if (!strcmp(argv[i], "--B"))
            shape[0] = v;
        else if (!strcmp(argv[i], "--H"))
            shape[1] = v;
        else if (!strcmp(argv[i], "--T"))
            shape[2] = v;
        else if (!strcmp(argv[i], "--D"))
            shape[3] = v;
        else {
            fprintf(stderr, "unknown flag %s\n", argv[i]);
            return 2;
        }
    }
    double fl = 2.0 * (double)(shape[0] * shape[1]) * (double)shape[2] *
                (double)shape[2] * (double)shape[3];
    printf("attention B=%lld H=%lld T=%lld D=%lld causal, %d threads, isa %s\n",
           (long long)shape[0], (long long)shape[1], (long long)shape[2],
           (long long)shape[3], zs_num_threads(), zs_cpu_isa());
    printf("%-6s %12s %10s %14s %10s\n", "dtype", "fwd ms", "GFLOP/s",
           "fwd+bwd ms", "GFLOP/s");
    zs_dtype dts[] = {ZS_F32, ZS_BF16, ZS_F16};
    for (int i = 0; i < 3; i++) {
        double f, t;
        if (bench(dts[i], shape, reps, &f, &t) != 0) {
            fprintf(stderr, "%s: %s\n", zs_dtype_name(dts[i]), zs_last_error());
            return 1;
        }
        printf("%-6s %12.2f %10.1f %14.2f %10.1f\n", zs_dtype_name(dts[i]),
               f * 1e3, fl / f * 1e-9, t * 1e3, 3.5 * fl / t * 1e-9);
    }
    return 0;
}
