/*
 * linear.c - bench/linear: the fused linear operators (GEMM with a bias +
 * GeLU or bias + residual epilogue, one write of the output) against the
 * unfused operator sequences they replace, on the GPT-2 MLP shapes
 * (M, N, K) = (1024, 3072, 768) and (1024, 768, 3072), f32, 2 threads:
 *   linear_gelu      vs  matmul_t(x, w^T) -> add(b) -> gelu
 *   linear_residual  vs  matmul_t(x, w^T) -> add(b) -> add(r)
 * plus linear_gelu with autograd on (it also writes the pre-activation).
 *
 * Columns: the bare matmul, the unfused sequence and the fused op (best
 * forward time over the rounds, all interleaved since the machine is
 * shared), the speedup, the memory traffic the fusion removes (bytes of the
 * separate elementwise passes minus the epilogue's own reads and writes)
 * and that traffic divided by the time saved (the bandwidth the removed
 * passes were running at), and the fused op's epilogue overhead over the
 * bare matmul. Usage: linear [rounds] (default 15).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "zs/zs.h"

typedef struct shape {
    const char *name;
    int64_t M, N, K;
} shape;

static const shape shapes[] = {
    {"mlp up 1024x3072x768", 1024, 3072, 768},
    {"mlp down 1024x768x3072", 1024, 768, 3072},
};

typedef enum variant { GELU, GELU_TRAIN, RESIDUAL } variant;
static const char *variant_name[] = {"linear_gelu", "linear_gelu+pre",
                                     "linear_residual"};

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct inputs {
    zs_tensor *x, *w, *b, *r;
} inputs;

static zs_tensor *run_unfused(variant v, const inputs *in)
{
    zs_tensor *y = zs_matmul_t(in->x, in->w, false, true);
    zs_tensor *y2 = zs_add(y, in->b);
    zs_tensor *o = v == RESIDUAL ? zs_add(y2, in->r) : zs_gelu(y2, ZS_GELU_TANH);
    zs_release(y);
    zs_release(y2);
    return o;
}

static zs_tensor *run_fused(variant v, const inputs *in)
{
    return v == RESIDUAL ? zs_linear_residual(in->x, in->w, in->b, in->r)
                         : zs_linear_gelu(in->x, in->w, in->b);
}

/* Times one call (output released); returns seconds. */
static double time_call(int which, variant v, const inputs *in)
{
    double t0 = now();
    zs_tensor *o = which == 0   ? zs_matmul_t(in->x, in->w, false, true)
                   : which == 1 ? run_unfused(v, in)
                                : run_fused(v, in);
    double t = now() - t0;
    if (!o) {
        fprintf(stderr, "linear: %s\n", zs_last_error());
        exit(1);
    }
    zs_release(o);
    return t;
}

/* Bytes of elementwise traffic removed by fusing (f32, M x N output):
 * unfused add(b): read y, write y2 (8 MN); gelu: read y2, write out (8 MN);
 * add(r): read y2 and r, write out (12 MN). The fused epilogue reads r
 * (4 MN) and, with autograd, writes the pre-activation (4 MN). */
static double bytes_saved(variant v, double mn)
{
    switch (v) {
    case GELU: return 16 * mn;
    case GELU_TRAIN: return 16 * mn - 4 * mn;
    default: return 20 * mn - 4 * mn;
    }
}

static double max_diff(variant v, const inputs *in)
{
    zs_tensor *a = run_unfused(v, in), *b = run_fused(v, in);
    zs_tensor *d = zs_sub(a, b), *ad = zs_abs(d);
    zs_tensor *m = zs_max(ad, 0, NULL, false);
    double r = m ? zs_item(m) : INFINITY;
    zs_tensor *all[] = {a, b, d, ad, m};
    for (int i = 0; i < 5; i++)
        zs_release(all[i]);
    return r;
}

static void bench_shape(const shape *s, variant v, int rounds)
{
    inputs in = {
        zs_uniform(ZS_F32, 2, (int64_t[]){s->M, s->K}, -1, 1, 1),
        zs_uniform(ZS_F32, 2, (int64_t[]){s->N, s->K}, -0.05, 0.05, 2),
        zs_uniform(ZS_F32, 1, (int64_t[]){s->N}, -1, 1, 3),
        zs_uniform(ZS_F32, 2, (int64_t[]){s->M, s->N}, -1, 1, 4),
    };
    if (v == GELU_TRAIN)
        zs_set_requires_grad(in.w, true);
    double best[3] = {INFINITY, INFINITY, INFINITY};
    for (int k = 0; k < 3; k++) /* warm-up: caches, allocator */
        time_call(k, v, &in);
    for (int r = 0; r < rounds; r++)
        for (int k = 0; k < 3; k++) {
            double t = time_call(k, v, &in);
            best[k] = t < best[k] ? t : best[k];
        }
    double mn = (double)s->M * (double)s->N;
    double saved = bytes_saved(v, mn), dt = best[1] - best[2];
    char rate[16] = "-"; /* no time saved: no rate */
    if (dt > 0)
        snprintf(rate, sizeof rate, "%.1f", saved / dt / 1e9);
    printf("%-24s %-16s %8.2f %8.2f %8.2f %7.2fx %8.1f %9s %8.1f%%  %.1e\n",
           s->name, variant_name[v], 1e3 * best[0], 1e3 * best[1],
           1e3 * best[2], best[1] / best[2], saved / 1e6, rate,
           100.0 * (best[2] - best[0]) / best[0], max_diff(v, &in));
    zs_release(in.x);
    zs_release(in.w);
    zs_release(in.b);
    zs_release(in.r);
}

int main(int argc, char **argv)
{
    int rounds = argc > 1 ? atoi(argv[1]) : 15;
    if (rounds < 1)
        rounds = 1;
    zs_set_num_threads(2);
    zs_manual_seed(1);
    printf("fused linear epilogues vs unfused sequences, f32, %d threads, "
           "best of %d rounds\n", zs_num_threads(), rounds);
    printf("%-24s %-16s %8s %8s %8s %8s %8s %9s %9s  %s\n", "shape (MxNxK)",
           "op", "matmul", "unfused", "fused", "speedup", "saved", "saved",
           "epilogue", "max |diff|");
    printf("%-24s %-16s %8s %8s %8s %8s %8s %9s %9s\n", "", "", "ms", "ms",
           "ms", "", "MB", "GB/s", "overhead");
    for (int s = 0; s < 2; s++)
        for (int v = 0; v < 3; v++)
            bench_shape(&shapes[s], (variant)v, rounds);
    return 0;
}
