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
 * With --rounds N (the GPT-small shapes: --B 8 --rounds 5 --T 256,1024)
 * the naive table is replaced by the kernel against the machine's peak:
 * each round measures the FP32 FMA peak (zs_measure_peak_gflops, on the
 * bench's threads and on 1) and then the fused forward and backward (best
 * of --reps each), so a load that moves the peak moves both; a row per
 * round gives GFLOP/s (forward 2 B H T^2 D, backward 2.5x that: the
 * matmul FLOPs only, exp and the rescale are extra work), the fraction of
 * that round's peak, and "cpu%": FLOPs per second of process CPU time
 * over the best per-core peak in thread CPU time of the run
 * (zs_measure_peak_gflops_cpu; a second measure, blind to time spent
 * descheduled, which a loaded machine adds to both wall times). Then min / median / max over rounds, and the
 * PyTorch peer (bench/attention_torch.py: scaled_dot_product_attention,
 * or the masked-softmax composition on torch 1.13) on the same shape and
 * cap, against the median peak.
 *
 * Usage: attention [--reps N] [--threads N] [--T t1,t2,...] [--B N]
 *                  [--rounds N [--no-peer]]
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "zs/zs.h"

#include "isa_cap.h"

enum { H = 6, D = 64, MAXT = 16, MAXR = 64 };

static int64_t B = 1; /* --B */

static double clock_s(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double now(void) { return clock_s(CLOCK_MONOTONIC); }

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

/* ---- kernel against the peak (--rounds) --------------------------------- */

typedef struct kround {
    double peak, peak1; /* GFLOP/s: wall on the bench's threads; per core in CPU time */
    double fwd, bwd;         /* best wall seconds */
    double fwd_cpu, bwd_cpu; /* process CPU seconds of those passes */
} kround;

/* One round: the peak, then best-of-reps fused forward and backward. */
static int kernel_round(zs_tensor **qkv, zs_tensor *g, int reps, kround *r)
{
    r->peak = zs_measure_peak_gflops(zs_num_threads(), 0.2);
    r->peak1 = zs_measure_peak_gflops_cpu(zs_num_threads(), 0.1);
    r->fwd = r->bwd = INFINITY;
    zs_attention_params p = {.causal = true};
    for (int rep = -1; rep < reps; rep++) {
        double c0 = clock_s(CLOCK_PROCESS_CPUTIME_ID), t0 = now();
        zs_tensor *o = zs_attention(qkv[0], qkv[1], qkv[2], &p);
        double c1 = clock_s(CLOCK_PROCESS_CPUTIME_ID), t1 = now();
        if (!o || zs_backward(o, g, false) != ZS_OK) {
            fprintf(stderr, "attention: %s\n", zs_last_error());
            zs_release(o);
            return -1;
        }
        double c2 = clock_s(CLOCK_PROCESS_CPUTIME_ID), t2 = now();
        if (rep >= 0 && t1 - t0 < r->fwd)
            r->fwd = t1 - t0, r->fwd_cpu = c1 - c0;
        if (rep >= 0 && t2 - t1 < r->bwd)
            r->bwd = t2 - t1, r->bwd_cpu = c2 - c1;
        for (int i = 0; i < 3; i++)
            zs_zero_grad(qkv[i], true);
        zs_release(o);
    }
    return 0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* "min / median / max" of n values into buf. */
static const char *spread(const double *v, int n, char *buf, size_t cap)
{
    double s[MAXR];
    memcpy(s, v, (size_t)n * sizeof *s);
    qsort(s, (size_t)n, sizeof *s, cmp_double);
    snprintf(buf, cap, "%5.1f / %5.1f / %5.1f", s[0], s[n / 2], s[n - 1]);
    return buf;
}

/* The PyTorch peer's best forward and backward seconds; false without it. */
static bool run_peer(int64_t T, int reps, double *fwd, double *bwd, char *kind)
{
    const char *slash = strrchr(__FILE__, '/');
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "env -u OPENBLAS_CORETYPE OMP_WAIT_POLICY=PASSIVE %s/usr/bin/python3 "
             "'%.*s/attention_torch.py' --B %lld --H %d --T %lld --D %d "
             "--threads %d --reps %d", isa_cap_torch_env(),
             slash ? (int)(slash - __FILE__) : 1, slash ? __FILE__ : ".",
             (long long)B, H, (long long)T, D, zs_num_threads(), reps);
    fflush(stdout);
    FILE *pf = popen(cmd, "r");
    if (!pf)
        return false;
    char line[512];
    bool got = false;
    while (fgets(line, sizeof line, pf)) {
        if (sscanf(line, "zsbench attention %lf %lf %15s", fwd, bwd, kind) == 3)
            got = *fwd > 0 && *bwd > 0;
        else
            fputs(line, stdout);
    }
    pclose(pf);
    return got;
}

static int bench_rounds(int64_t T, int reps, int rounds, bool peer)
{
    zs_tensor *qkv[3];
    for (int i = 0; i < 3; i++) {
        qkv[i] = zs_uniform(ZS_F32, ZS_SHAPE(B, H, T, D), -1, 1,
                            10 + (uint64_t)i);
        zs_set_requires_grad(qkv[i], true);
    }
    zs_tensor *g = zs_uniform(ZS_F32, ZS_SHAPE(B, H, T, D), -1, 1, 20);
    double ff = 2.0 * (double)B * H * (double)T * (double)T * D, fb = 2.5 * ff;
    double fp[MAXR], bp[MAXR], fc[MAXR], bc[MAXR], pk[MAXR], p1 = 0;
    kround r[MAXR];
    int rc = 0;
    for (int k = 0; k < rounds && rc == 0; k++) {
        rc = kernel_round(qkv, g, reps, &r[k]);
        p1 = fmax(p1, r[k].peak1);
    }
    for (int k = 0; k < rounds && rc == 0; k++) {
        pk[k] = r[k].peak;
        fp[k] = 100 * ff / r[k].fwd * 1e-9 / r[k].peak;
        bp[k] = 100 * fb / r[k].bwd * 1e-9 / r[k].peak;
        fc[k] = 100 * ff / r[k].fwd_cpu * 1e-9 / p1;
        bc[k] = 100 * fb / r[k].bwd_cpu * 1e-9 / p1;
        printf("%6lld %5d %8.1f %8.2f %8.1f %6.1f %6.1f %8.2f %8.1f %6.1f "
               "%6.1f\n", (long long)T, k, r[k].peak, 1e3 * r[k].fwd,
               ff / r[k].fwd * 1e-9, fp[k], fc[k], 1e3 * r[k].bwd,
               fb / r[k].bwd * 1e-9, bp[k], bc[k]);
    }
    if (rc == 0) {
        char b1[64], b2[64], b3[64], b4[64], b5[64];
        printf("%6lld  min / median / max over %d rounds: peak %s GFLOP/s; "
               "fwd %%peak %s, cpu%% %s; bwd %%peak %s, cpu%% %s "
               "(per-core CPU-time peak %.1f)\n", (long long)T, rounds,
               spread(pk, rounds, b1, 64), spread(fp, rounds, b2, 64),
               spread(fc, rounds, b3, 64), spread(bp, rounds, b4, 64),
               spread(bc, rounds, b5, 64), p1);
        double tf, tb, s[MAXR];
        char kind[16];
        memcpy(s, pk, (size_t)rounds * sizeof *s);
        qsort(s, (size_t)rounds, sizeof *s, cmp_double);
        if (!peer) {
        } else if (run_peer(T, reps, &tf, &tb, kind)) {
            printf("%6lld  pytorch (%s): fwd %.2f ms %.1f GFLOP/s %.1f%%, "
                   "bwd %.2f ms %.1f GFLOP/s %.1f%% of the median peak\n",
                   (long long)T, kind, 1e3 * tf, ff / tf * 1e-9,
                   100 * ff / tf * 1e-9 / s[rounds / 2], 1e3 * tb,
                   fb / tb * 1e-9, 100 * fb / tb * 1e-9 / s[rounds / 2]);
        } else {
            printf("%6lld  pytorch: not available\n", (long long)T);
        }
    }
    for (int i = 0; i < 3; i++)
        zs_release(qkv[i]);
    zs_release(g);
    return rc;
}

int main(int argc, char **argv)
{
    int reps = 3, threads = 0, nT = 3, rounds = 0;
    bool peer = true;
    int64_t Ts[MAXT] = {256, 1024, 4096};
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (v && !strcmp(argv[i], "--reps")) {
            reps = atoi(v), i++;
        } else if (v && !strcmp(argv[i], "--threads")) {
            threads = atoi(v), i++;
        } else if (v && !strcmp(argv[i], "--B")) {
            B = atoll(v), i++;
        } else if (v && !strcmp(argv[i], "--rounds")) {
            rounds = atoi(v), i++;
        } else if (!strcmp(argv[i], "--no-peer")) {
            peer = false;
        } else if (v && !strcmp(argv[i], "--T")) {
            nT = 0;
            for (char *s = (char *)v; *s && nT < MAXT; s += *s == ',')
                Ts[nT++] = strtoll(s, &s, 10);
            i++;
        } else {
            fprintf(stderr, "usage: attention [--reps N] [--threads N] "
                            "[--T t1,t2,...] [--B N] [--rounds N [--no-peer]]\n");
            return 2;
        }
    }
    if (reps < 1 || threads < 0 || B < 1 || rounds < 0 || rounds > MAXR) {
        fprintf(stderr, "attention: --reps and --B must be >= 1, --threads "
                        ">= 0, --rounds 0..%d\n", MAXR);
        return 2;
    }
    if (threads)
        zs_set_num_threads(threads);
    static const char *const fam[] = {"attention", "gemm f32", "softmax, norms, reductions"};
    isa_cap_header(stdout, fam, 3, rounds && peer ? "PyTorch" : NULL);
    if (rounds) {
        printf("attention kernel vs FP32 peak, causal f32, B=%lld H=%d D=%d, "
               "%d threads, best of %d, %d rounds\n", (long long)B, H, D,
               zs_num_threads(), reps, rounds);
        printf("%6s %5s %8s %8s %8s %6s %6s %8s %8s %6s %6s\n", "T", "round",
               "peak_GF", "fwd_ms", "fwd_GF", "%peak", "cpu%", "bwd_ms",
               "bwd_GF", "%peak", "cpu%");
        for (int i = 0; i < nT; i++)
            if (Ts[i] < 1 || bench_rounds(Ts[i], reps, rounds, peer) != 0)
                return 1;
        return 0;
    }
    printf("attention fwd+bwd, causal f32, B=%lld H=%d D=%d, %d threads, best "
           "of %d\n", (long long)B, H, D, zs_num_threads(), reps);
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
