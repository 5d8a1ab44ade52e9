/*
 * lenet.c - bench/lenet: seconds per epoch of LeNet-5 training on
 * Fashion-MNIST, Zhisuan beside PyTorch (bench/lenet_torch.py run by
 * /usr/bin/python3 in the same run, same architecture, Adam lr 1e-3,
 * batch 64, same normalisation, data pre-loaded into a tensor).
 *
 * The Zhisuan step mirrors apps/zs/train.c: scope per step, loader batch
 * (prefetched by its background thread), forward, cross-entropy, backward,
 * Adam step on the flat parameter buffer, zeroing of the flat gradient,
 * zs_item of the loss. Both sides run --warmup untimed steps, then time
 * --steps steps (default: one epoch, 938 batches of 64) and extrapolate to
 * seconds per epoch = time / steps * batches per epoch. Each side also
 * reports its fastest block of 50 consecutive steps, extrapolated the same
 * way, since other load on a shared machine inflates the mean.
 *
 * --profile adds the mean time per step of each phase (loader, forward,
 * loss, backward, optimizer, zero-grad) over the timed steps and the
 * per-operator table (zs_profile_print) of one extra step (K extra steps,
 * summed, with --profile-steps K).
 *
 * --graph adds a row for graph mode (zs/graph.h) on a second LeNet of the
 * same seed and batches: the first step's forward, loss and backward are
 * captured into persistent batch buffers, the graph goes through
 * dead-code elimination, pointwise fusion and the memory plan, and every
 * later step copies its batch into the buffers and replays it; the Adam
 * step and the zeroing of the gradient stay eager, as in the trainer. A
 * batch of another shape (the epoch's last, shorter one) runs eagerly.
 * The two trainers (one training set) live side by side and their timed
 * steps alternate (bench_zs). Both rows then show the step's memory: the
 * largest allocator peak of a timed step above what was live before it,
 * plus, for the graph, its arena (allocated before). Then `lenet
 * graph/eager step time = R` and `lenet graph/eager step memory = R`.
 *
 * The last line reads `lenet epoch seconds zhisuan/pytorch = R` (R < 1:
 * Zhisuan is faster), or `pytorch: not available`.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../apps/zs/cnn.h" /* ZS_FMNIST_MEAN, ZS_FMNIST_STD, ZS_FMNIST_DIR */
#include "zs/zs.h"

#include "isa_cap.h"

/* The PyTorch peer's environment (its best settings on this machine). */
#define PEER_ENV                                                             \
    "env -u OPENBLAS_CORETYPE OMP_WAIT_POLICY=PASSIVE "                      \
    "GLIBC_TUNABLES=glibc.malloc.mmap_max=0:"                                \
    "glibc.malloc.trim_threshold=68719476736 "
#define PEER_PYTHON "/usr/bin/python3"
#define BATCH 64
#define SEED 1
#define BLOCK 50 /* steps per block for the best-block figure */

enum { PH_LOAD, PH_FORWARD, PH_LOSS, PH_BACKWARD, PH_OPTIM, PH_ZERO, PH_COUNT };
static const char *PHASE_NAMES[PH_COUNT] = {"loader", "forward", "loss",
                                            "backward", "optimizer", "zero grad"};

typedef struct config {
    int64_t steps;   /* 0: one epoch */
    int warmup, threads;
    int profile;     /* steps to profile per operator (0: none) */
    bool graph;      /* also a graph-mode row */
    const char *data;
    char script[4096];
} config;

typedef struct trainer {
    const zs_image_data *train; /* borrowed: one set for both trainers */
    zs_module *m;
    zs_optim *o;
    zs_loader *l;
    zs_tensor *fg;       /* flat gradient, borrowed from m */
    double phase[PH_COUNT];
    /* graph mode: the graph, its batch buffers and loss (owned) */
    bool graph_mode;
    zs_graph *g;
    zs_tensor *gx, *gy, *gloss;
} trainer;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: lenet [--steps N] [--warmup N] [--quick] [--threads N] "
               "[--profile] [--profile-steps K] [--graph] [--data DIR] [--script PATH]\n"
               "  --steps N   time N training steps and extrapolate to one epoch "
               "(default: one epoch)\n"
               "  --quick     --steps 100 --warmup 5\n"
               "  --profile   phase times, and operator table of 1 extra step\n"
               "  --profile-steps K   operator table summed over K extra steps\n"
               "  --graph     also a graph-mode row (capture once, replay)\n");
}

static int parse_args(int argc, char **argv, config *c)
{
    *c = (config){0, 10, 0, 0, false, ZS_FMNIST_DIR, ""};
    const char *slash = strrchr(__FILE__, '/');
    snprintf(c->script, sizeof c->script, "%.*s/lenet_torch.py",
             slash ? (int)(slash - __FILE__) : 1, slash ? __FILE__ : ".");
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(f, "--quick")) {
            c->steps = 100;
            c->warmup = 5;
        } else if (!strcmp(f, "--profile")) {
            c->profile = c->profile ? c->profile : 1;
        } else if (v && !strcmp(f, "--profile-steps")) {
            c->profile = atoi(v), i++;
        } else if (!strcmp(f, "--graph")) {
            c->graph = true;
        } else if (!strcmp(f, "--help")) {
            usage(stdout);
            exit(0);
        } else if (v && !strcmp(f, "--steps")) {
            c->steps = atoll(v), i++;
        } else if (v && !strcmp(f, "--warmup")) {
            c->warmup = atoi(v), i++;
        } else if (v && !strcmp(f, "--threads")) {
            c->threads = atoi(v), i++;
        } else if (v && !strcmp(f, "--data")) {
            c->data = v, i++;
        } else if (v && !strcmp(f, "--script")) {
            snprintf(c->script, sizeof c->script, "%s", v), i++;
        } else {
            fprintf(stderr, "lenet: unknown flag or missing value '%s'\n", f);
            usage(stderr);
            return -1;
        }
    }
    if (c->steps < 0 || c->warmup < 0 || c->threads < 0 || c->profile < 0) {
        fprintf(stderr, "lenet: --steps, --warmup, --threads and --profile-steps "
                        "must be >= 0\n");
        return -1;
    }
    return 0;
}

static void trainer_free(trainer *t)
{
    zs_graph_free(t->g);
    zs_release(t->gx);
    zs_release(t->gy);
    zs_release(t->gloss);
    zs_loader_free(t->l);
    zs_optim_free(t->o);
    zs_module_free(t->m);
    *t = (trainer){0};
}

/* LeNet-5 + Adam as `zs train lenet`, over the training set d. */
static zs_status trainer_init(trainer *t, const zs_image_data *d)
{
    *t = (trainer){0};
    t->train = d;
    zs_tensor *fp;
    if (!(t->m = zs_lenet5_new(SEED)) ||
        zs_module_flatten(t->m, &fp, &t->fg) != ZS_OK)
        return ZS_ERR_ARG;
    fp->grad = zs_retain(t->fg);
    zs_optim_config oc = {ZS_ADAM, 1e-3, 0, false, 0, 0, 0, 0};
    if (!(t->o = zs_optim_new(&oc, 1, &fp)) ||
        !(t->l = zs_loader_new(t->train, BATCH, true, SEED, ZS_FMNIST_MEAN,
                               ZS_FMNIST_STD)))
        return ZS_ERR_ARG;
    zs_manual_seed(SEED);
    zs_module_train(t->m, true);
    return ZS_OK;
}

/* Next batch, moving on to the next epoch at the end of one. */
static int next_batch(zs_loader *l, zs_tensor **x, zs_tensor **y)
{
    int r = zs_loader_next(l, x, y);
    return r == 1 ? zs_loader_next(l, x, y) : r;
}

/* A copy of b that outlives the step's scope (the scope drops its own
 * reference when it pops). */
static zs_tensor *persistent_copy(zs_tensor *b) { return zs_retain(zs_clone(b)); }

/* Graph mode's forward, loss and backward (phase "forward" holds them
 * all): the first call captures them on persistent copies of the batch
 * and runs the passes; later calls with a batch of the same shape copy it
 * in and replay. Another shape: NULL (*eager set), the caller runs it
 * eagerly. */
static zs_tensor *graph_loss(trainer *t, zs_tensor *x, zs_tensor *y, bool *eager)
{
    *eager = false;
    if (t->g) {
        if (x->shape[0] != t->gx->shape[0]) {
            *eager = true;
            return NULL;
        }
        if (zs_copy_(t->gx, x) != ZS_OK || zs_copy_(t->gy, y) != ZS_OK ||
            zs_graph_replay(t->g) != ZS_OK)
            return NULL;
        return t->gloss;
    }
    if (!(t->gx = persistent_copy(x)) || !(t->gy = persistent_copy(y)) ||
        !(t->g = zs_graph_capture_begin()))
        return NULL;
    zs_tensor *loss = zs_cross_entropy(zs_module_forward(t->m, t->gx), t->gy, -100);
    zs_status st = loss ? zs_backward(loss, NULL, false) : ZS_ERR_STATE;
    zs_status end = zs_graph_capture_end(t->g);
    if (st != ZS_OK || end != ZS_OK)
        return NULL;
    t->gloss = zs_retain(loss);
    if (zs_graph_dce(t->g, 1, &t->gloss) < 0 || zs_graph_fuse(t->g, 1, &t->gloss) < 0 ||
        zs_graph_plan_memory(t->g, 1, &t->gloss) != ZS_OK)
        return NULL;
    return t->gloss;
}

/* One training step; adds each phase's seconds to t->phase. */
static zs_status train_step(trainer *t, double *loss_out)
{
    double ts[PH_COUNT + 1];
    zs_status st = ZS_ERR_ARG;
    zs_scope_push();
    zs_tensor *x, *y;
    ts[0] = now();
    if (next_batch(t->l, &x, &y) != 0)
        goto out;
    ts[1] = now();
    bool eager = !t->graph_mode;
    zs_tensor *loss = NULL;
    if (t->graph_mode && !(loss = graph_loss(t, x, y, &eager)) && !eager)
        goto out;
    if (eager) {
        zs_tensor *logits = zs_module_forward(t->m, x);
        ts[2] = now();
        loss = zs_cross_entropy(logits, y, -100);
        ts[3] = now();
        if (!loss || zs_backward(loss, NULL, false) != ZS_OK)
            goto out;
    } else {
        ts[2] = ts[3] = now();
    }
    ts[4] = now();
    if (zs_optim_step(t->o, 1e-3) != ZS_OK)
        goto out;
    ts[5] = now();
    zs_fill_(t->fg, 0.0);
    *loss_out = zs_item(loss);
    ts[6] = now();
    for (int p = 0; p < PH_COUNT; p++)
        t->phase[p] += ts[p + 1] - ts[p];
    st = ZS_OK;
out:
    zs_scope_pop();
    return st;
}

/* Timings of one side: whole timed run, and the fastest block of BLOCK
 * consecutive steps (a figure less disturbed by other load on the machine). */
typedef struct run_result {
    double seconds, best_block_step, loss; /* seconds, seconds per step, last loss */
    double step_bytes; /* the largest allocator peak of a timed step above
                        * its start (graph mode: plus the arena) */
    double arena_bytes; /* graph mode: the memory plan's arena */
    double block_s;     /* the current block's seconds so far */
    int64_t done;       /* timed steps so far */
} run_result;

static zs_status warm_up(trainer *t, const config *c, run_result *r)
{
    *r = (run_result){0, INFINITY, 0, 0, 0, 0, 0};
    for (int i = 0; i < c->warmup; i++)
        if (train_step(t, &r->loss) != ZS_OK)
            return ZS_ERR_ARG;
    memset(t->phase, 0, sizeof t->phase);
    return ZS_OK;
}

/* One timed step of t: its time (and its block's), its memory. */
static zs_status timed_step(trainer *t, int64_t block, run_result *r)
{
    zs_alloc_stats a0, a1;
    zs_alloc_get_stats(&a0);
    zs_alloc_reset_peak();
    double t0 = now();
    if (train_step(t, &r->loss) != ZS_OK)
        return ZS_ERR_ARG;
    double dt = now() - t0;
    zs_alloc_get_stats(&a1);
    double above = (double)a1.peak_bytes - (double)a0.current_bytes;
    r->step_bytes = above > r->step_bytes ? above : r->step_bytes;
    r->seconds += dt;
    r->block_s += dt;
    if (++r->done % block == 0) {
        if (r->block_s / (double)block < r->best_block_step)
            r->best_block_step = r->block_s / (double)block;
        r->block_s = 0;
    }
    return ZS_OK;
}

/* The eager trainer and, with --graph, the graph trainer side by side,
 * their timed steps alternating, so that a change of the shared machine's
 * load reaches both rows (one after the other, graph/eager step time came
 * out 0.79 and 1.38 in two runs of the same build on a 2-core Zen 4
 * share). Each trainer's loader prepares its next batch while its own
 * step runs, so a step's memory is its own. */
static zs_status bench_zs(trainer *t, int n, const config *c, int64_t steps,
                          run_result *r)
{
    for (int k = 0; k < n; k++)
        if (warm_up(&t[k], c, &r[k]) != ZS_OK)
            return ZS_ERR_ARG;
    int64_t block = steps < BLOCK ? steps : BLOCK;
    for (int64_t i = 0; i < steps; i++)
        for (int k = 0; k < n; k++)
            if (timed_step(&t[k], block, &r[k]) != ZS_OK)
                return ZS_ERR_ARG;
    for (int k = 0; k < n; k++) {
        zs_graph_stats gs;
        zs_graph_get_stats(t[k].g, &gs);
        r[k].arena_bytes = (double)gs.planned_bytes;
        r[k].step_bytes += (double)gs.planned_bytes;
    }
    if (zs_alloc_tracing()) { /* ZS_ALLOC_TRACE=1: what the last step's peak held */
        printf("\n%s: held at the last timed step's peak\n", n > 1 ? "graph" : "eager");
        zs_alloc_peak_report(stdout, 16 << 10);
    }
    return ZS_OK;
}

static void print_profile(trainer *t, int64_t steps, int nprof)
{
    double total = 0, loss;
    for (int p = 0; p < PH_COUNT; p++)
        total += t->phase[p];
    printf("\nzhisuan time per step by phase (mean of %lld timed steps):\n",
           (long long)steps);
    for (int p = 0; p < PH_COUNT; p++)
        printf("  %-10s %8.3f ms %5.1f%%\n", PHASE_NAMES[p],
               1e3 * t->phase[p] / (double)steps, 100 * t->phase[p] / total);
    zs_profile_reset();
    zs_profile_enable(true);
    zs_status st = ZS_OK;
    for (int i = 0; st == ZS_OK && i < nprof; i++)
        st = train_step(t, &loss);
    zs_profile_enable(false);
    if (st != ZS_OK) {
        fprintf(stderr, "lenet: profiled step: %s\n", zs_last_error());
        return;
    }
    printf("\nzhisuan operators in %d training step%s (batch %d, totals):\n",
           nprof, nprof > 1 ? "s" : "", BATCH);
    zs_profile_print(stdout);
}

/* Runs the PyTorch peer; false when it is not available. */
static bool bench_torch(const config *c, int threads, int64_t steps,
                        run_result *r)
{
    char cmd[8192];
    snprintf(cmd, sizeof cmd, PEER_ENV "%s" PEER_PYTHON " '%s' --data '%s' --threads %d "
             "--steps %lld --warmup %d --batch %d --block %d --mean %.9g --std %.9g",
             isa_cap_torch_env(), c->script, c->data, threads, (long long)steps, c->warmup, BATCH, BLOCK,
             (double)ZS_FMNIST_MEAN, (double)ZS_FMNIST_STD);
    fflush(stdout);
    FILE *pf = popen(cmd, "r");
    if (!pf)
        return false;
    char line[512];
    bool got = false;
    while (fgets(line, sizeof line, pf)) {
        long long n;
        run_result x;
        if (sscanf(line, "zsbench lenet %lld %lf %lf %lf", &n, &x.seconds,
                   &x.best_block_step, &x.loss) == 4 &&
            n == steps && x.seconds > 0 && x.best_block_step > 0) {
            *r = x;
            got = true;
        } else if (strncmp(line, "zsbench", 7) != 0) {
            fputs(line, stdout); /* the peer's own messages */
        }
    }
    pclose(pf);
    return got;
}

static void print_row(const char *name, const run_result *r, int64_t steps,
                      int64_t nb)
{
    double step = r->seconds / (double)steps;
    printf("%-10s %9.3f %9.2f %9.0f %14.2f %10.4f", name, 1e3 * step,
           step * (double)nb, BATCH / step, r->best_block_step * (double)nb, r->loss);
    if (r->step_bytes > 0)
        printf(" %9.2f", r->step_bytes / 1048576.0);
    printf("\n");
}

int main(int argc, char **argv)
{
    config c;
    if (parse_args(argc, argv, &c) != 0)
        return 2;
    if (c.threads > 0)
        zs_set_num_threads(c.threads);
    int threads = zs_num_threads();
    zs_image_data data;
    trainer t[2] = {{0}};
    int n = c.graph ? 2 : 1;
    zs_status st = zs_mnist_load(c.data, true, &data);
    for (int k = 0; k < n && st == ZS_OK; k++)
        st = trainer_init(&t[k], &data);
    t[1].graph_mode = true;
    if (st != ZS_OK) {
        fprintf(stderr, "lenet: %s\n", zs_last_error());
        for (int k = 0; k < n; k++)
            trainer_free(&t[k]);
        return 2;
    }
    int64_t nb = zs_loader_batches_per_epoch(t[0].l);
    int64_t steps = c.steps > 0 ? c.steps : nb;
    static const char *const fam[] = {"gemm f32", "convolution", "pointwise",
                                      "softmax, norms, reductions", "optimizer"};
    isa_cap_header(stdout, fam, 5, "PyTorch");
    printf("LeNet-5 on Fashion-MNIST (%lld images, %lld batches of %d per epoch), "
           "Adam lr 1e-3; %d warm-up + %lld timed steps; %d threads%s\n",
           (long long)data.images->shape[0], (long long)nb, BATCH, c.warmup,
           (long long)steps, threads, c.graph ? "; eager and graph steps alternate" : "");
    run_result r[2], pr;
    st = bench_zs(t, n, &c, steps, r);
    if (st == ZS_OK && c.profile)
        print_profile(&t[0], steps, c.profile);
    if (st != ZS_OK)
        fprintf(stderr, "lenet: %s\n", zs_last_error());
    for (int k = 0; k < n; k++)
        trainer_free(&t[k]);
    zs_image_data_free(&data);
    if (st != ZS_OK)
        return 1;
    run_result zr = r[0], gr = r[1];
    bool have_torch = bench_torch(&c, threads, steps, &pr);
    printf("\n%-10s %9s %9s %9s %14s %10s %9s\n", "", "ms/step", "s/epoch", "images/s",
           "s/epoch best", "last loss", "step MiB");
    printf("%-10s %9s %9s %9s %14s %10s\n", "", "", "(mean)", "", "block", "");
    print_row("zhisuan", &zr, steps, nb);
    if (c.graph) {
        print_row("zs-graph", &gr, steps, nb);
        printf("(graph step memory: arena %.2f MiB + replay peak %.2f MiB)\n",
               gr.arena_bytes / 1048576.0, (gr.step_bytes - gr.arena_bytes) / 1048576.0);
        printf("lenet graph/eager step time = %.3f\n", gr.seconds / zr.seconds);
        printf("lenet graph/eager step memory = %.3f\n", gr.step_bytes / zr.step_bytes);
    }
    if (!have_torch) {
        printf("pytorch: not available\n");
        return 0;
    }
    print_row("pytorch", &pr, steps, nb);
    printf("best-block ratio zhisuan/pytorch = %.3f\n",
           zr.best_block_step / pr.best_block_step);
    printf("lenet epoch seconds zhisuan/pytorch = %.3f\n", zr.seconds / pr.seconds);
    return 0;
}
