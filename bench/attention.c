/*
 * attention.c - bench/attention: fused flash attention (zs_attention)
 * beside the naive composition matmul -> scale -> causal masked_fill ->
 * softmax -> matmul with autograd, which stores Tq x Tk matrices.
 *
 * Shape: B=1, H=6, D=64 (the GPT `small` preset's heads), causal, f32,
 * T = 256, 1024, 4096 by default. One pass is out = attention(q, k, v)
 * then zs_backward(out, g) with a fixed random g; times are the best of
 * --reps passes after one warm-up. Peak is zs_alloc's high-water mark of
 * live bytes during the first pass, above what was live before it (q, k,
 * v and g); it must grow linearly in T for the fused operator and
 * quadratically for the naive one. GFLOP/s counts the causal forward as
 * 2 B H T^2 D (4 D per visible pair) and the backward as 2.5x that, as in
 * the FlashAttention paper, for both columns. "maxdiff" is the largest
 * |fused - naive| over the outputs and the three input gradients.
 *
 * Usage: attention [--reps N] [--threads N] [--T t1,t2,...]
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "zs/zs.h"

#include "isa_cap.h"

enum { B = 1, H = 6, D = 64, MAXT = 16 };

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The naive causal attention, every step a recorded zs_* operator. */
static zs_tensor *naive_attention(zs_tensor *q, zs_tensor *k, zs_tensor *v,
                                  zs_tensor *mask)
{
    zs_tensor *s = zs_matmul_t(q, k, false, true);
    zs_tensor *ss = zs_mul_scalar(s, 1 / sqrt((double)D));
    zs_tensor *m = zs_masked_fill(ss, mask, -INFINITY);
    zs_tensor *p = zs_softmax(m, -1);
    zs_tensor *o = zs_matmul(p, v);
    zs_release(s);
    zs_release(ss);
    zs_release(m);
    zs_release(p);
    return o;
}

static zs_tensor *fused_attention(zs_tensor *q, zs_tensor *k, zs_tensor *v,
                                  zs_tensor *mask)
{
    zs_attention_params p = {.causal = true};
    return zs_attention(q, k, v, &p);
}

typedef zs_tensor *(*attn_fn)(zs_tensor *, zs_tensor *, zs_tensor *,
                              zs_tensor *);

typedef struct result {
    double fwd, total; /* best seconds */
    double peak;       /* bytes above the baseline, first pass */
    double *vals[4];   /* out, dq, dk, dv of the last pass (malloc'd) */
} result;

static double *values(const zs_tensor *t)
{
    int64_t n = zs_numel(t);
    double *v = malloc((size_t)n * sizeof *v);
    float *f = malloc((size_t)n * sizeof *f);
    zs_copy_to_buffer(t, f, (size_t)n * sizeof *f);
    for (int64_t i = 0; i < n; i++)
        v[i] = f[i];
    free(f);
    return v;
}

static int run(attn_fn fn, zs_tensor **qkv, zs_tensor *g, zs_tensor *mask,
               int reps, result *r)
{
    *r = (result){.fwd = INFINITY, .total = INFINITY};
    for (int rep = -1; rep < reps; rep++) {
        zs_alloc_stats st;
        zs_alloc_get_stats(&st);
        size_t base = st.current_bytes;
        zs_alloc_reset_peak();
        double t0 = now();
        zs_tensor *o = fn(qkv[0], qkv[1], qkv[2], mask);
        double t1 = now();
        if (!o || zs_backward(o, g, false) != ZS_OK) {
            fprintf(stderr, "attention: %s\n", zs_last_error());
            zs_release(o);
            return -1;
        }
        double t2 = now();
        zs_alloc_get_stats(&st);
        if (rep == -1)
            r->peak = (double)(st.peak_bytes - base);
        else {
            r->fwd = fmin(r->fwd, t1 - t0);
            r->total = fmin(r->total, t2 - t0);
        }
        if (rep == reps - 1) {
            r->vals[0] = values(o);
            for (int i = 0; i < 3; i++)
                r->vals[i + 1] = values(zs_grad(qkv[i]));
        }
        for (int i = 0; i < 3; i++)
            zs_zero_grad(qkv[i], true);
        zs_release(o);
    }
    return 0;
}

static double max_diff(const result *a, const result *b, int64_t n)
{
    double m = 0;
    for (int k = 0; k < 4; k++)
        for (int64_t i = 0; i < n; i++)
            m = fmax(m, fabs(a->vals[k][i] - b->vals[k][i]));
    return m;
}

/* u8 [T, T], 1 above the diagonal (keys after the query). */
static zs_tensor *causal_mask(int64_t T)
{
    zs_tensor *m = zs_zeros(ZS_U8, ZS_SHAPE(T, T));
    uint8_t *p = zs_data(m);
    for (int64_t i = 0; i < T; i++)
        for (int64_t j = i + 1; j < T; j++)
            p[i * T + j] = 1;
    return m;
}

static int bench_T(int64_t T, int reps)
{
    zs_tensor *qkv[3];
    for (int i = 0; i < 3; i++) {
        qkv[i] = zs_uniform(ZS_F32, ZS_SHAPE(B, H, T, D), -1, 1,
                            10 + (uint64_t)i);
        zs_set_requires_grad(qkv[i], true);
    }
    zs_tensor *g = zs_uniform(ZS_F32, ZS_SHAPE(B, H, T, D), -1, 1, 20);
    zs_tensor *mask = causal_mask(T);
    result f = {0}, n = {0};
    int rc = run(fused_attention, qkv, g, NULL, reps, &f);
    if (rc == 0)
        rc = run(naive_attention, qkv, g, mask, reps, &n);
    if (rc == 0) {
        double fl = 2.0 * B * H * (double)T * (double)T * D * 3.5;
        printf("%6lld %9.2f %9.2f %9.1f %10.2f %9.2f %9.2f %10.2f %8.1f "
               "%8.1f %9.2e\n", (long long)T, 1e3 * f.fwd, 1e3 * f.total,
               f.peak / 1048576, fl / f.total * 1e-9, 1e3 * n.fwd,
               1e3 * n.total, n.peak / 1048576, fl / n.total * 1e-9,
               n.total / f.total, max_diff(&f, &n, B * H * T * D));
    }
    for (int k = 0; k < 4; k++) {
        free(f.vals[k]);
        free(n.vals[k]);
    }
    for (int i = 0; i < 3; i++)
        zs_release(qkv[i]);
    zs_release(g);
    zs_release(mask);
    return rc;
}

int main(int argc, char **argv)
{
    int reps = 3, threads = 0, nT = 3;
    int64_t Ts[MAXT] = {256, 1024, 4096};
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (v && !strcmp(argv[i], "--reps")) {
            reps = atoi(v), i++;
        } else if (v && !strcmp(argv[i], "--threads")) {
            threads = atoi(v), i++;
        } else if (v && !strcmp(argv[i], "--T")) {
            nT = 0;
            for (char *s = (char *)v; *s && nT < MAXT; s += *s == ',')
                Ts[nT++] = strtoll(s, &s, 10);
            i++;
        } else {
            fprintf(stderr, "usage: attention [--reps N] [--threads N] "
                            "[--T t1,t2,...]\n");
            return 2;
        }
    }
    if (reps < 1 || threads < 0) {
        fprintf(stderr, "attention: --reps must be >= 1, --threads >= 0\n");
        return 2;
    }
    if (threads)
        zs_set_num_threads(threads);
    static const char *const fam[] = {"attention", "gemm f32", "softmax, norms, reductions"};
    isa_cap_header(stdout, fam, 3, NULL);
    printf("attention fwd+bwd, causal f32, B=%d H=%d D=%d, %d threads, best "
           "of %d\n", B, H, D, zs_num_threads(), reps);
    printf("%6s %9s %9s %9s %10s %9s %9s %10s %8s %8s %9s\n", "T", "fused_fwd",
           "fused_tot", "fused_MiB", "fused_GF/s", "naive_fwd", "naive_tot",
           "naive_MiB", "naive_GF", "speedup", "maxdiff");
    printf("%6s %9s %9s %9s %10s %9s %9s %10s %8s %8s %9s\n", "", "ms", "ms",
           "peak", "", "ms", "ms", "peak", "/s", "", "");
    for (int i = 0; i < nT; i++)
        if (Ts[i] < 1 || bench_T(Ts[i], reps) != 0)
            return 1;
    return 0;
}
