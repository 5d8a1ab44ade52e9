/*
 * conv.c - bench/conv: conv2d forward and forward+backward (input, weight
 * and bias gradients) for LeNet- and ResNet-like layers, Zhisuan beside
 * PyTorch (bench/conv_torch.py run by /usr/bin/python3 in the same run).
 *
 * One training pass of a layer is y = conv2d(x, w, b), then
 * zs_backward(y, g) with a fixed random g. FLOPs per pass are
 * 2*N*O*OH*OW*C*KH*KW (forward); forward+backward counts 3x that. Times are
 * the best of --reps passes after warm-up; "fwd" is the forward part of the
 * same pass (recording the graph, as in training). Gradients are dropped
 * (set to none) between passes on both sides, so neither accumulates.
 *
 * The %peak columns divide fwd+bwd rates by the FP32 FMA peak that
 * zs_measure_peak_gflops measures in this run (best of readings before and
 * after the layers, as other load on the machine lowers a reading). Ratio = zhisuan/pytorch
 * GFLOP/s (higher is better for Zhisuan). The last line reads
 * `conv geomean zhisuan/pytorch fwd+bwd = R`.
 *
 * Rounds (--rounds, default 3) alternate the two sides and each keeps its
 * best time per layer, so load from other jobs on the shared machine does
 * not land on one side only.
 *
 * Usage: conv [--reps N] [--warmup N] [--rounds N] [--threads N] [--quick]
 *             [--script PATH]   (default: conv_torch.py next to this source)
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "zs/zs.h"

#include "isa_cap.h"

/* The PyTorch peer's environment (its best settings on this machine). */
#define PEER_ENV                                                             \
    "env -u OPENBLAS_CORETYPE OMP_WAIT_POLICY=PASSIVE "                      \
    "GLIBC_TUNABLES=glibc.malloc.mmap_max=0:"                                \
    "glibc.malloc.trim_threshold=68719476736 "
#define PEER_PYTHON "/usr/bin/python3"

typedef struct layer {
    const char *name;
    int64_t n, c, h, w, o, k;
    int stride, pad;
} layer;

static const layer LAYERS[] = {
    {"lenet.conv1", 64, 1, 28, 28, 6, 5, 1, 2},
    {"lenet.conv2", 64, 6, 14, 14, 16, 5, 1, 0},
    {"resnet.64x28", 16, 64, 28, 28, 64, 3, 1, 1},
    {"resnet.128x14", 16, 128, 14, 14, 128, 3, 1, 1},
    {"resnet.64-128s2", 16, 64, 28, 28, 128, 3, 2, 1},
};
#define NLAYERS (int)(sizeof LAYERS / sizeof *LAYERS)

typedef struct timing {
    double fwd, total; /* best seconds: forward part, whole pass */
} timing;

typedef struct config {
    int reps, warmup, threads, rounds;
    char script[4096];
} config;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int64_t out_size(int64_t n, int64_t k, int s, int p)
{
    return (n + 2 * p - k) / s + 1;
}

/* Forward FLOPs of one pass over layer l. */
static double layer_flops(const layer *l)
{
    int64_t oh = out_size(l->h, l->k, l->stride, l->pad);
    int64_t ow = out_size(l->w, l->k, l->stride, l->pad);
    return 2.0 * (double)(l->n * l->o * oh * ow * l->c * l->k * l->k);
}

/* Default peer script: conv_torch.py in this source file's directory. */
static void default_script(char *buf, size_t n, const char *file)
{
    const char *slash = strrchr(file, '/');
    int dir = slash ? (int)(slash - file) : 1;
    snprintf(buf, n, "%.*s/%s_torch.py", dir, slash ? file : ".", "conv");
}

static void usage(FILE *f)
{
    fprintf(f, "usage: conv [--reps N] [--warmup N] [--rounds N] [--threads N] "
               "[--quick] [--script PATH]\n");
}

static int parse_args(int argc, char **argv, config *c)
{
    *c = (config){10, 3, 0, 3, ""};
    default_script(c->script, sizeof c->script, __FILE__);
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(f, "--quick")) {
            c->reps = 3;
            c->warmup = 1;
            c->rounds = 1;
        } else if (!strcmp(f, "--help")) {
            usage(stdout);
            exit(0);
        } else if (v && !strcmp(f, "--reps")) {
            c->reps = atoi(v), i++;
        } else if (v && !strcmp(f, "--warmup")) {
            c->warmup = atoi(v), i++;
        } else if (v && !strcmp(f, "--rounds")) {
            c->rounds = atoi(v), i++;
        } else if (v && !strcmp(f, "--threads")) {
            c->threads = atoi(v), i++;
        } else if (v && !strcmp(f, "--script")) {
            snprintf(c->script, sizeof c->script, "%s", v), i++;
        } else {
            fprintf(stderr, "conv: unknown flag or missing value '%s'\n", f);
            usage(stderr);
            return -1;
        }
    }
    if (c->reps < 1 || c->rounds < 1 || c->warmup < 0 || c->threads < 0) {
        fprintf(stderr, "conv: --reps and --rounds must be >= 1, --warmup and "
                        "--threads >= 0\n");
        return -1;
    }
    return 0;
}

/* One training pass; adds its forward and total times to t (best-of). */
static zs_status one_pass(zs_tensor *x, zs_tensor *w, zs_tensor *b, zs_tensor *g,
                          const zs_conv2d_params *p, timing *t)
{
    zs_tensor *leaves[] = {x, w, b};
    for (int i = 0; i < 3; i++)
        zs_zero_grad(leaves[i], true);
    zs_scope_push();
    double t0 = now();
    zs_tensor *y = zs_conv2d(x, w, b, p);
    double t1 = now();
    zs_status st = y ? zs_backward(y, g, false) : ZS_ERR_ARG;
    double t2 = now();
    zs_scope_pop();
    if (st != ZS_OK)
        return st;
    if (t1 - t0 < t->fwd)
        t->fwd = t1 - t0;
    if (t2 - t0 < t->total)
        t->total = t2 - t0;
    return ZS_OK;
}

/* Best-of-reps timing of layer l in Zhisuan; ZS_OK or an error. */
static zs_status bench_zs(const layer *l, const config *c, timing *t)
{
    int64_t oh = out_size(l->h, l->k, l->stride, l->pad);
    int64_t ow = out_size(l->w, l->k, l->stride, l->pad);
    zs_tensor *x = zs_uniform(ZS_F32, ZS_SHAPE(l->n, l->c, l->h, l->w), -1, 1, 1);
    zs_tensor *w = zs_uniform(ZS_F32, ZS_SHAPE(l->o, l->c, l->k, l->k), -0.2, 0.2, 2);
    zs_tensor *b = zs_uniform(ZS_F32, ZS_SHAPE(l->o), -0.1, 0.1, 3);
    zs_tensor *g = zs_uniform(ZS_F32, ZS_SHAPE(l->n, l->o, oh, ow), -1, 1, 4);
    zs_conv2d_params p = {{l->stride, l->stride}, {l->pad, l->pad}, {1, 1}, 1};
    zs_status st = x && w && b && g ? ZS_OK : ZS_ERR_NOMEM;
    if (st == ZS_OK)
        st = zs_set_requires_grad(x, true);
    if (st == ZS_OK)
        st = zs_set_requires_grad(w, true);
    if (st == ZS_OK)
        st = zs_set_requires_grad(b, true);
    timing warm = {INFINITY, INFINITY};
    *t = (timing){INFINITY, INFINITY};
    for (int i = 0; st == ZS_OK && i < c->warmup; i++)
        st = one_pass(x, w, b, g, &p, &warm);
    for (int i = 0; st == ZS_OK && i < c->reps; i++)
        st = one_pass(x, w, b, g, &p, t);
    zs_release(x);
    zs_release(w);
    zs_release(b);
    zs_release(g);
    return st;
}

static void keep_best(timing *best, timing t)
{
    best->fwd = t.fwd < best->fwd ? t.fwd : best->fwd;
    best->total = t.total < best->total ? t.total : best->total;
}

/* Runs the PyTorch peer on `threads` threads; fills tt[i] for the layers it reported and
 * returns how many it reported (0: not available). */
static int bench_torch(const config *c, int threads, timing *tt)
{
    char cmd[16384];
    int k = snprintf(cmd, sizeof cmd, PEER_ENV "%s" PEER_PYTHON
                     " '%s' --threads %d --reps %d --warmup %d", isa_cap_torch_env(), c->script,
                     threads, c->reps, c->warmup);
    for (int i = 0; i < NLAYERS; i++) {
        const layer *l = &LAYERS[i];
        k += snprintf(cmd + k, sizeof cmd - (size_t)k, " %lld,%lld,%lld,%lld,%lld,%lld,%d,%d",
                      (long long)l->n, (long long)l->c, (long long)l->h,
                      (long long)l->w, (long long)l->o, (long long)l->k,
                      l->stride, l->pad);
    }
    fflush(stdout);
    FILE *pf = popen(cmd, "r");
    if (!pf)
        return 0;
    char line[512];
    int got = 0;
    while (fgets(line, sizeof line, pf)) {
        int idx;
        double fwd, total;
        if (sscanf(line, "zsbench conv %d %lf %lf", &idx, &fwd, &total) == 3 &&
            idx >= 0 && idx < NLAYERS && fwd > 0 && total > 0) {
            tt[idx] = (timing){fwd, total};
            got++;
        } else if (strncmp(line, "zsbench", 7) != 0) {
            fputs(line, stdout); /* the peer's own messages */
        }
    }
    pclose(pf);
    return got;
}

/* Best of three short FMA-peak measurements: other load on the machine
 * only ever lowers a reading. */
static double measure_peak(int threads)
{
    double best = 0;
    for (int i = 0; i < 3; i++) {
        double g = zs_measure_peak_gflops(threads, 0.15);
        best = g > best ? g : best;
    }
    return best;
}

static void print_table(const timing *zt, const timing *tt, bool have_torch,
                        double peak)
{
    printf("\n%-16s %-24s %8s %8s %8s %8s %6s %6s %6s %6s\n", "layer",
           "N,C->O,HxW,k,s,p", "zs fwd", "pt fwd", "zs f+b", "pt f+b", "f+b", "fwd",
           "zs f+b", "pt f+b");
    printf("%-16s %-24s %8s %8s %8s %8s %6s %6s %6s %6s\n", "", "", "GFLOP/s",
           "GFLOP/s", "GFLOP/s", "GFLOP/s", "zs/pt", "zs/pt", "%peak", "%peak");
    double logsum = 0;
    for (int i = 0; i < NLAYERS; i++) {
        const layer *l = &LAYERS[i];
        double f = layer_flops(l);
        double zf = f / zt[i].fwd / 1e9, zb = 3 * f / zt[i].total / 1e9;
        char shape[64];
        snprintf(shape, sizeof shape, "%lld,%lld->%lld,%lldx%lld,%lld,%d,%d",
                 (long long)l->n, (long long)l->c, (long long)l->o, (long long)l->h,
                 (long long)l->w, (long long)l->k, l->stride, l->pad);
        printf("%-16s %-24s %8.1f ", l->name, shape, zf);
        if (have_torch) {
            double pf = f / tt[i].fwd / 1e9, pb = 3 * f / tt[i].total / 1e9;
            printf("%8.1f %8.1f %8.1f %6.2f %6.2f %6.1f %6.1f\n", pf, zb, pb, zb / pb,
                   zf / pf, 100 * zb / peak, 100 * pb / peak);
            logsum += log(zb / pb);
        } else {
            printf("%8s %8.1f %8s %6s %6s %6.1f %6s\n", "-", zb, "-", "-", "-",
                   100 * zb / peak, "-");
        }
    }
    if (have_torch)
        printf("conv geomean zhisuan/pytorch fwd+bwd = %.3f\n", exp(logsum / NLAYERS));
    else
        printf("pytorch: not available\n");
}

int main(int argc, char **argv)
{
    config c;
    if (parse_args(argc, argv, &c) != 0)
        return 2;
    if (c.threads > 0)
        zs_set_num_threads(c.threads);
    int threads = zs_num_threads();
    double peak = measure_peak(threads);
    static const char *const fam[] = {"convolution", "gemm f32"};
    isa_cap_header(stdout, fam, 2, "PyTorch");
    printf("conv2d forward+backward (grads for x, w, b), f32, best of %d after "
           "%d warm-up, %d alternating rounds; %d threads\n", c.reps, c.warmup,
           c.rounds, threads);
    printf("measured FP32 peak: %.1f GFLOP/s on %d threads\n", peak, threads);
    /* Rounds alternate the two sides, each keeping its best time per
     * layer, so that a burst of load from other jobs on the shared machine
     * hits both rather than whichever side ran during it. */
    timing zt[NLAYERS], tt[NLAYERS];
    for (int i = 0; i < NLAYERS; i++)
        zt[i] = tt[i] = (timing){INFINITY, INFINITY};
    int got = 0;
    for (int r = 0; r < c.rounds; r++) {
        for (int i = 0; i < NLAYERS; i++) {
            timing t;
            if (bench_zs(&LAYERS[i], &c, &t) != ZS_OK) {
                fprintf(stderr, "conv: %s: %s\n", LAYERS[i].name, zs_last_error());
                return 1;
            }
            keep_best(&zt[i], t);
        }
        timing pt[NLAYERS];
        for (int i = 0; i < NLAYERS; i++)
            pt[i] = (timing){INFINITY, INFINITY};
        got = bench_torch(&c, threads, pt);
        if (got != NLAYERS)
            break; /* no peer: one round of Zhisuan is enough */
        for (int i = 0; i < NLAYERS; i++)
            keep_best(&tt[i], pt[i]);
    }
    double peak2 = measure_peak(threads);
    if (peak2 > peak) {
        printf("FP32 peak measured again after the runs: %.1f GFLOP/s (used below)\n",
               peak2);
        peak = peak2;
    }
    print_table(zt, tt, got == NLAYERS, peak);
    return 0;
}
