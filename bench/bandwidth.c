/*
 * bandwidth.c - bench/bandwidth: achieved memory bandwidth of the
 * elementwise and reduction operators beside the machine's own, a
 * STREAM-style triad (zs_measure_triad_gbs) measured in the same run,
 * before and after the operators; the larger of the two is the reference.
 *
 * GB/s = (bytes the operator must read + bytes it must write) / time,
 * counting each input and output element once (the minimum traffic; a
 * kernel that reads its input twice, or the write-allocate read of an
 * output line, is not counted, which is exactly what the fraction exposes).
 * The triad counts 3 arrays the same way. Sizes are f32 element counts n;
 * tensors are [n/1024, 1024] unless the row says [R, 768] (R = n / 768).
 *
 * Timing: each (operator, size) runs twice to warm up (the first call
 * faults the output's fresh pages in; after that the caching allocator in
 * src/core/alloc.c hands the same block back), then the best of `reps`
 * batches, a batch being as many back-to-back calls as fill ~2 ms. Every
 * call releases its output at once, so no allocation reaches the system.
 * Batches run in rounds, one per operator per round, so that a burst of
 * load from other processes (the machine may be shared) spoils one round
 * of every operator, not every sample of one. Each round also runs a triad
 * over arrays of n floats: the "triad (same n)" row shows what the caches
 * give at that size (informational; the reference is the big triad).
 *
 * An operator that returns NULL (not implemented yet, or failing) prints
 * "n/a" and the message is listed below the table.
 *
 * Usage: bandwidth [--threads N] [--quick] [--reps N]
 *   --threads N  pool size for operators and triad (default 2)
 *   --quick      sizes 4K, 1M, 16M and 3 reps (a CI smoke run)
 * Last line: "memory-bound ops >= 60% of triad on 16M+ elements: K of M",
 * an operator passing when its worst fraction over the 16M+ sizes is >= 60%.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "zs/analyze.h"
#include "zs/zs.h"

#define MAX_SIZES 8
#define COLS 1024   /* last dim of the [n/1024, 1024] tensors */
#define LN_COLS 768 /* last dim of the [R, 768] tensors */
#define PASS 0.60

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The operands of one size; all f32, no grad. */
typedef struct inputs {
    int64_t n;
    zs_tensor *a, *b;   /* [n/1024, 1024] uniform in [0.1, 2) */
    zs_tensor *bias;    /* [1024] */
    zs_tensor *at;      /* a transposed: [1024, n/1024] view */
    zs_tensor *x768;    /* [R, 768] view of a's first R*768 elements */
    zs_tensor *w768, *b768; /* [768] layer-norm weight and bias */
} inputs;

typedef zs_tensor *(*op_run)(const inputs *in);
/* Minimum bytes read + written by one call. */
typedef double (*op_bytes)(const inputs *in);

static const int LAST[1] = {-1};
static const int FIRST[1] = {0};

static double f4(double elems) { return 4.0 * elems; }
static double rows(const inputs *in) { return (double)zs_numel(in->a) / COLS; }
static double r768(const inputs *in) { return (double)in->x768->shape[0]; }

static zs_tensor *run_add(const inputs *in) { return zs_add(in->a, in->b); }
static zs_tensor *run_add_bc(const inputs *in) { return zs_add(in->a, in->bias); }
static zs_tensor *run_mul(const inputs *in) { return zs_mul(in->a, in->b); }
static zs_tensor *run_adds(const inputs *in) { return zs_add_scalar(in->a, 0.5); }
static zs_tensor *run_muls(const inputs *in) { return zs_mul_scalar(in->a, 0.5); }
static zs_tensor *run_neg(const inputs *in) { return zs_neg(in->a); }
static zs_tensor *run_exp(const inputs *in) { return zs_exp(in->a); }
static zs_tensor *run_log(const inputs *in) { return zs_log(in->a); }
static zs_tensor *run_tanh(const inputs *in) { return zs_tanh(in->a); }
static zs_tensor *run_sigmoid(const inputs *in) { return zs_sigmoid(in->a); }
static zs_tensor *run_relu(const inputs *in) { return zs_relu(in->a); }
static zs_tensor *run_gelu(const inputs *in) { return zs_gelu(in->a, ZS_GELU_TANH); }
static zs_tensor *run_silu(const inputs *in) { return zs_silu(in->a); }
static zs_tensor *run_sum(const inputs *in) { return zs_sum(in->a, 0, NULL, false); }
static zs_tensor *run_sum0(const inputs *in) { return zs_sum(in->x768, 1, FIRST, false); }
static zs_tensor *run_mean(const inputs *in) { return zs_mean(in->a, 1, LAST, false); }
static zs_tensor *run_max(const inputs *in) { return zs_max(in->a, 1, LAST, false); }
static zs_tensor *run_softmax(const inputs *in) { return zs_softmax(in->a, -1); }
static zs_tensor *run_ln(const inputs *in)
{
    return zs_layer_norm(in->x768, in->w768, in->b768, 1e-5);
}
static zs_tensor *run_copy_t(const inputs *in) { return zs_contiguous(in->at); }

static double b_binary(const inputs *in) { return f4(3.0 * (double)in->n); }
static double b_bcast(const inputs *in) { return f4(2.0 * (double)in->n + COLS); }
static double b_unary(const inputs *in) { return f4(2.0 * (double)in->n); }
static double b_sum(const inputs *in) { return f4((double)in->n + 1); }
static double b_sum0(const inputs *in) { return f4(r768(in) * LN_COLS + LN_COLS); }
static double b_rowred(const inputs *in) { return f4((double)in->n + rows(in)); }
static double b_ln(const inputs *in) { return f4(2.0 * r768(in) * LN_COLS + 2.0 * LN_COLS); }

typedef struct op_desc {
    const char *name;
    op_run run;
    op_bytes bytes;
} op_desc;

static const op_desc OPS[] = {
    {"add", run_add, b_binary},
    {"add [N,1024]+[1024]", run_add_bc, b_bcast},
    {"mul", run_mul, b_binary},
    {"add_scalar", run_adds, b_unary},
    {"mul_scalar", run_muls, b_unary},
    {"neg", run_neg, b_unary},
    {"exp", run_exp, b_unary},
    {"log", run_log, b_unary},
    {"tanh", run_tanh, b_unary},
    {"sigmoid", run_sigmoid, b_unary},
    {"relu", run_relu, b_unary},
    {"gelu (tanh)", run_gelu, b_unary},
    {"silu", run_silu, b_unary},
    {"sum (all)", run_sum, b_sum},
    {"sum dim0 [R,768]", run_sum0, b_sum0},
    {"mean last dim", run_mean, b_rowred},
    {"max last dim", run_max, b_rowred},
    {"softmax last dim", run_softmax, b_unary},
    {"layer_norm [R,768]", run_ln, b_ln},
    {"contiguous(a^T)", run_copy_t, b_unary},
};
#define NOPS (int)(sizeof OPS / sizeof *OPS)

typedef struct options {
    int threads, reps, nsizes;
    int64_t sizes[MAX_SIZES];
    bool quick;
} options;

static void die(const char *what)
{
    fprintf(stderr, "bandwidth: %s: %s\n", what, zs_last_error());
    exit(1);
}

static inputs make_inputs(int64_t n)
{
    inputs in = {.n = n};
    int64_t r = n / COLS, r7 = n / LN_COLS;
    in.a = zs_uniform(ZS_F32, ZS_SHAPE(r, COLS), 0.1, 2.0, 1);
    in.b = zs_uniform(ZS_F32, ZS_SHAPE(r, COLS), 0.1, 2.0, 2);
    in.bias = zs_uniform(ZS_F32, ZS_SHAPE(COLS), -1.0, 1.0, 3);
    in.at = zs_transpose(in.a, 0, 1);
    zs_tensor *flat = zs_reshape(in.a, ZS_SHAPE(n));
    zs_tensor *head = zs_narrow(flat, 0, 0, r7 * LN_COLS);
    in.x768 = zs_view(head, ZS_SHAPE(r7, LN_COLS));
    zs_release(flat);
    zs_release(head);
    in.w768 = zs_ones(ZS_F32, ZS_SHAPE(LN_COLS));
    in.b768 = zs_zeros(ZS_F32, ZS_SHAPE(LN_COLS));
    if (!in.a || !in.b || !in.bias || !in.at || !in.x768 || !in.w768 || !in.b768)
        die("inputs");
    return in;
}

static void free_inputs(inputs *in)
{
    zs_release(in->a);
    zs_release(in->b);
    zs_release(in->bias);
    zs_release(in->at);
    zs_release(in->x768);
    zs_release(in->w768);
    zs_release(in->b768);
    zs_alloc_trim();
}

/* One call, output released at once; false when the operator failed. */
static bool call(const op_desc *op, const inputs *in)
{
    zs_tensor *r = op->run(in);
    zs_release(r);
    return r != NULL;
}

/* Two warm-up calls, then a timed one to size the batch (calls per timed
 * sample, ~2 ms worth). Returns the batch, or 0 when the operator failed. */
static int warm_up(const op_desc *op, const inputs *in)
{
    zs_clear_error();
    if (!call(op, in) || !call(op, in))
        return 0;
    double t0 = now();
    if (!call(op, in))
        return 0;
    double one = now() - t0;
    if (one >= 2e-3)
        return 1;
    double b = ceil(2e-3 / fmax(one, 1e-7));
    return b > 20000 ? 20000 : (int)b;
}

/* Seconds per call over one batch, or -1 when the operator failed. */
static double sample(const op_desc *op, const inputs *in, int batch)
{
    double t0 = now();
    for (int k = 0; k < batch; k++)
        if (!call(op, in))
            return -1;
    return (now() - t0) / batch;
}

/* Measures every operator at one size: rounds of one sample per operator
 * (interleaved, so a burst of load from other processes hits one round of
 * every operator rather than all samples of one), best per operator.
 * gbs[i] < 0 for failures, whose message goes to errors[i]. Also a triad
 * over arrays of n floats, one per round; returns its best GB/s. */
static double measure_size(const options *o, int64_t n, double *gbs,
                           char (*errors)[160])
{
    inputs in = make_inputs(n);
    int batch[NOPS];
    double best[NOPS], triad = 0;
    for (int i = 0; i < NOPS; i++) {
        batch[i] = warm_up(&OPS[i], &in);
        best[i] = batch[i] ? INFINITY : -1;
        if (!batch[i] && !errors[i][0])
            snprintf(errors[i], sizeof errors[i], "%s", zs_last_error());
    }
    for (int r = 0; r < o->reps; r++) {
        triad = fmax(triad, zs_measure_triad_gbs(o->threads, (size_t)n * 4, 2));
        for (int i = 0; i < NOPS; i++) {
            if (best[i] < 0)
                continue;
            double t = sample(&OPS[i], &in, batch[i]);
            best[i] = t < 0 ? -1 : fmin(best[i], t);
        }
    }
    for (int i = 0; i < NOPS; i++)
        gbs[i] = best[i] < 0 ? -1 : OPS[i].bytes(&in) / best[i] / 1e9;
    free_inputs(&in);
    return triad;
}

static void size_label(int64_t n, char *buf, size_t len)
{
    if (n % (1 << 20) == 0)
        snprintf(buf, len, "%lldM", (long long)(n >> 20));
    else if (n % (1 << 10) == 0)
        snprintf(buf, len, "%lldK", (long long)(n >> 10));
    else
        snprintf(buf, len, "%lld", (long long)n);
}

static options parse(int argc, char **argv)
{
    options o = {.threads = 2, .reps = 0};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick"))
            o.quick = true;
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            o.threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            o.reps = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: bandwidth [--threads N] [--quick] [--reps N]\n");
            exit(2);
        }
    }
    if (o.threads < 1)
        o.threads = 1;
    static const int64_t full[] = {4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20};
    static const int64_t quick[] = {4 << 10, 1 << 20, 16 << 20};
    const int64_t *s = o.quick ? quick : full;
    o.nsizes = o.quick ? 3 : 5;
    memcpy(o.sizes, s, (size_t)o.nsizes * sizeof *s);
    if (o.reps < 1)
        o.reps = o.quick ? 3 : 10;
    return o;
}

/* gbs[op][size] in GB/s, < 0 for n/a. */
static void print_cell(double gbs, double ref)
{
    if (gbs < 0)
        printf(" %14s", "n/a");
    else
        printf(" %7.1f (%3.0f%%)", gbs, 100 * gbs / ref);
}

static void print_table(const options *o, double gbs[][MAX_SIZES],
                        const double *triad_n, double ref)
{
    char lab[32];
    printf("\n%-22s", "op  GB/s (% of triad)");
    for (int s = 0; s < o->nsizes; s++) {
        size_label(o->sizes[s], lab, sizeof lab);
        printf(" %14s", lab);
    }
    printf("\n");
    for (int i = 0; i < NOPS; i++) {
        printf("%-22s", OPS[i].name);
        for (int s = 0; s < o->nsizes; s++)
            print_cell(gbs[i][s], ref);
        printf("\n");
    }
    printf("%-22s", "triad (same n)");
    for (int s = 0; s < o->nsizes; s++)
        print_cell(triad_n[s], ref);
    printf("\n");
}

static void print_summary(const options *o, double gbs[][MAX_SIZES],
                          double ref, char errors[][160])
{
    int k = 0, m = 0, first = -1;
    char below[1024] = "", na[512] = "";
    for (int s = 0; s < o->nsizes; s++)
        if (o->sizes[s] >= (16 << 20) && first < 0)
            first = s;
    if (first < 0)
        first = o->nsizes - 1;
    for (int i = 0; i < NOPS; i++) {
        double worst = INFINITY;
        for (int s = first; s < o->nsizes; s++)
            worst = gbs[i][s] < 0 ? -1 : fmin(worst, gbs[i][s] / ref);
        size_t nb = strlen(below), nn = strlen(na);
        if (worst < 0) {
            snprintf(na + nn, sizeof na - nn, "%s%s", nn ? ", " : "", OPS[i].name);
            continue;
        }
        m++;
        if (worst >= PASS)
            k++;
        else
            snprintf(below + nb, sizeof below - nb, "%s%s %d%%",
                     nb ? ", " : "", OPS[i].name, (int)(100 * worst));
    }
    for (int i = 0; i < NOPS; i++)
        if (errors[i][0])
            printf("n/a %-18s %s\n", OPS[i].name, errors[i]);
    if (na[0])
        printf("not measured: %s\n", na);
    printf("memory-bound ops >= %.0f%% of triad on 16M+ elements: %d of %d%s%s\n",
           100 * PASS, k, m, below[0] ? "; below: " : "", below);
}

int main(int argc, char **argv)
{
    options o = parse(argc, argv);
    static double gbs[NOPS][MAX_SIZES];
    static char errors[NOPS][160];
    zs_set_num_threads(o.threads);
    size_t triad_bytes = (size_t)o.sizes[o.nsizes - 1] * sizeof(float);
    int triad_reps = o.quick ? 5 : 10;
    const zs_cpu_features *f = zs_cpu();
    printf("bandwidth: %d thread(s), f32, best of %d after 2 warm-up calls; "
           "CPU %s\n", zs_num_threads(), o.reps,
           f->avx512f ? "AVX-512" : f->avx2 ? "AVX2" : "baseline");
    double triad0 = zs_measure_triad_gbs(o.threads, triad_bytes, triad_reps);
    printf("triad before: %.1f GB/s (3 arrays of %.0f MB)\n", triad0,
           (double)triad_bytes / 1e6);
    fflush(stdout);
    static double tmp[NOPS];
    double triad_n[MAX_SIZES];
    for (int s = 0; s < o.nsizes; s++) {
        triad_n[s] = measure_size(&o, o.sizes[s], tmp, errors);
        for (int i = 0; i < NOPS; i++)
            gbs[i][s] = tmp[i];
    }
    double triad1 = zs_measure_triad_gbs(o.threads, triad_bytes, triad_reps);
    double ref = fmax(triad0, triad1);
    printf("triad after:  %.1f GB/s; reference = max = %.1f GB/s\n", triad1, ref);
    print_table(&o, gbs, triad_n, ref);
    printf("(bytes = minimum traffic: inputs read once + outputs written once;"
           " sizes in f32 elements; small sizes run from cache)\n");
    print_summary(&o, gbs, ref, errors);
    return 0;
}
