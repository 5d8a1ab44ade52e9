/*
 * gpt.c - bench/gpt: training and generation tokens/s of Zhisuan's GPT
 * beside the same model in PyTorch (bench/gpt_torch.py, run by
 * /usr/bin/python3 in the same run), and peak memory of `gpt2` training.
 *
 * Training: preset --preset (default small: 6 layers, 384 wide, 6 heads,
 * context 256), vocabulary 4096, random tokens (content does not change
 * speed), batch --batch x --seq (default 8 x 256). A step is that of
 * `zs train gpt`: one zs_trainer_step (zs/train.h) of the library's
 * trainer: scope, zs_gpt_loss, backward, zs_item, the gradient norm (clip
 * 1.0), AdamW (betas 0.9, 0.95, eps 1e-8, weight decay 0.1) with the clip
 * factor fused into its pass over the flat parameters, zeroing of the flat
 * gradient. --warmup untimed steps, then --steps timed steps; both sides
 * do the same (PyTorch: clip_grad_norm_, then AdamW).
 *
 * Generation: batch 1, a random prompt of 64 tokens, 128 new greedy
 * tokens with a KV cache: one prefill forward, then one token
 * per forward. tokens/s = new tokens / (prefill + decode) seconds, mean of
 * 3 runs (1 with --quick) after one untimed run; a context shorter than
 * prompt + new tokens (preset tiny) shortens both.
 *
 * Memory (--memory alone, or a section of the default output, run in a
 * child process so the training benchmark does not raise its high-water
 * mark): preset gpt2 (vocabulary 50257, not padded), 2 AdamW steps at
 * B=4, T=64; peak RSS (VmHWM) and the allocator's peak next to the
 * predicted bytes: 16 per parameter (fp32 weight, gradient, two moments)
 * plus activations from zs_activation_bytes_layer (Korthikanti et al.,
 * 16-bit: 34sbh + 5as^2b per layer; doubled for fp32), with and without
 * the s^2 score term (Zhisuan's fused attention never stores it), plus the
 * output layer's fp32 logits and their gradient, 8sbV.
 *
 * --profile adds the phase times of the timed steps (the trainer's
 * profile), the bandwidth the two optimizer passes reach as a fraction of
 * the triad bandwidth measured in the same run, and the per-operator
 * table (zs_profile_print) of one extra training step; with --precision,
 * the same for the low-precision trainer (printed before the others).
 *
 * --precision bf16|fp16|fp8 (issue 24) trains a second time under that
 * precision (zs_trainer_config.precision: autocast, f32 master weights)
 * and asks the peer for PyTorch's own CPU autocast,
 * torch.autocast("cpu", dtype=torch.bfloat16), in the same run; the rows
 * add the activation memory of a step: the allocator's peak during the
 * step minus what was live before it (zs_alloc_reset_peak), per precision.
 * Zhisuan's fp32 and P trainers run their timed steps alternately (one
 * fp32 step, one P step, ...), so a load change on the shared machine
 * reaches both sides of the P/fp32 ratio; with --profile they run one
 * after the other (the operator profile is global).
 *
 * The last two lines read `gpt train tokens/s zhisuan/pytorch = R` and
 * `gpt generate tokens/s zhisuan/pytorch = R` (R > 1: Zhisuan is faster),
 * or `pytorch: not available`; with --precision P they are followed by
 * `gpt train tokens/s zhisuan-P/pytorch-bf16 = R`,
 * `gpt train tokens/s zhisuan-P/zhisuan-fp32 = R` and
 * `gpt activation memory zhisuan-P/zhisuan-fp32 = R`.
 *
 * --graph adds Zhisuan's training in graph mode (zs_trainer_config.graph:
 * the first step captured, the others replayed; zs/graph.h) on a second
 * trainer over the same model and batches, rows `eager` and `graph` with
 * the allocator's peak during each whole run (model, trainer, warm-up
 * with the capture step, timed steps; until issue 27's fourth round it was
 * the last timed step's, the per-step resets having hidden the rest) and
 * the step's own memory (the peak above the step's start; graph: plus the
 * memory plan's arena, printed beside the capture step's own peak), and
 * then the last line
 * `gpt train tokens/s graph/eager = R`. --graph-only prints only these
 * rows, at --precision (bf16: both trainers under autocast).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "zs/zs.h"

#include "isa_cap.h"

/* The PyTorch peer's environment (its best settings on this machine). */
#define PEER_ENV                                                             \
    "env -u OPENBLAS_CORETYPE OMP_WAIT_POLICY=PASSIVE "                      \
    "GLIBC_TUNABLES=glibc.malloc.mmap_max=0:"                                \
    "glibc.malloc.trim_threshold=68719476736 "
#define PEER_PYTHON "/usr/bin/python3"
#define SEED 1
#define MEM_VOCAB 50257
#define MEM_BATCH 4
#define MEM_SEQ 64
#define MEM_STEPS 2
#define MiB (1024.0 * 1024.0)


typedef struct config {
    const char *preset;
    int64_t vocab, batch, seq, steps, warmup, prompt, new_tokens, reps;
    int threads;
    bool memory_only, profile, quick, graph, graph_only;
    char script[4096];
    zs_dtype precision; /* ZS_F32: the fp32 comparison only */
    const char *dump_graph; /* --dump-graph FILE: the graph trainer's dump */
} config;

typedef struct trainer {
    zs_module *m;
    zs_trainer *t;        /* the library's trainer over m */
    int64_t batch, seq, vocab;
    uint64_t rng;         /* generation's prompt */
} trainer;

/* Seconds per side: training and generation. */
typedef struct result {
    double train_s, train_best_s, loss;     /* timed steps, fastest step */
    double gen_s, gen_best_s, prefill_s;    /* mean run, fastest run, its prefill */
    double act_bytes;                       /* most bytes a step added */
    double peak_bytes;                      /* the allocator's peak over the
                                             * whole run (init, warm-up) */
    double faults;                          /* page faults in the timed steps */
    bool train_ok, gen_ok;
} result;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: gpt [--preset NAME] [--batch N] [--seq N] [--steps N] "
               "[--warmup N] [--threads N] [--quick] [--memory] [--profile] [--graph] [--graph-only] "
               "[--script PATH] [--precision NAME]\n"
               "  --preset NAME  tiny | small | gpt2 (default small)\n"
               "  --batch N      sequences per step (default 8)\n"
               "  --seq N        tokens per sequence (default: the preset's context)\n"
               "  --steps N      timed training steps (default 10; --quick 3)\n"
               "  --warmup N     untimed steps first (default 2; --quick 1)\n"
               "  --threads N    threads of both sides (default 2)\n"
               "  --memory       only the gpt2 memory measurement\n"
               "  --profile      phase times and operator table of one step\n"
               "  --precision P  bf16 | fp16 | fp8: also train in P (and PyTorch in its\n"
               "                 CPU autocast bf16) and compare (default fp32 only)\n"
               "  --graph        also train in graph mode: eager and graph rows\n"
               "  --graph-only   only the eager and graph rows (at --precision)\n"
               "  --dump-graph FILE  the graph trainer's graph before and after its\n"
               "                 passes (FILE, FILE.dot) and its replay profile\n");
}

/* Parses a positive integer flag value; -1 on error. */
static int64_t pos_int(const char *flag, const char *v)
{
    char *end;
    long long x = strtoll(v, &end, 10);
    if (*v == '\0' || *end != '\0' || x <= 0) {
        fprintf(stderr, "gpt: %s wants a positive integer, got '%s'\n", flag, v);
        return -1;
    }
    return (int64_t)x;
}

static int parse_args(int argc, char **argv, config *c)
{
    *c = (config){"small", 4096, 8, 0, 10, 2, 64, 128, 3, 2, false, false, false, false, false,
                  "", ZS_F32, NULL};
    const char *slash = strrchr(__FILE__, '/');
    snprintf(c->script, sizeof c->script, "%.*s/gpt_torch.py",
             slash ? (int)(slash - __FILE__) : 1, slash ? __FILE__ : ".");
    bool steps_set = false, warmup_set = false;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int64_t *field = NULL;
        if (!strcmp(f, "--quick")) {
            c->quick = true;
            continue;
        } else if (!strcmp(f, "--graph")) {
            c->graph = true;
            continue;
        } else if (!strcmp(f, "--graph-only")) {
            c->graph = c->graph_only = true;
            continue;
        } else if (!strcmp(f, "--memory")) {
            c->memory_only = true;
            continue;
        } else if (!strcmp(f, "--profile")) {
            c->profile = true;
            continue;
        } else if (!strcmp(f, "--help")) {
            usage(stdout);
            exit(0);
        } else if (v && !strcmp(f, "--preset")) {
            c->preset = v;
        } else if (v && !strcmp(f, "--dump-graph")) {
            c->dump_graph = v;
        } else if (v && !strcmp(f, "--script")) {
            snprintf(c->script, sizeof c->script, "%s", v);
        } else if (v && !strcmp(f, "--batch")) {
            field = &c->batch;
        } else if (v && !strcmp(f, "--seq")) {
            field = &c->seq;
        } else if (v && !strcmp(f, "--steps")) {
            field = &c->steps, steps_set = true;
        } else if (v && !strcmp(f, "--warmup")) {
            field = &c->warmup, warmup_set = true;
        } else if (v && !strcmp(f, "--precision")) {
            int p = zs_precision_parse(v);
            if (p < 0) {
                fprintf(stderr, "gpt: --precision must be fp32, bf16, fp16 or fp8, got "
                        "'%s'\n", v);
                return -1;
            }
            c->precision = (zs_dtype)p;
        } else if (v && !strcmp(f, "--threads")) {
            int64_t t = pos_int(f, v);
            if (t < 0)
                return -1;
            c->threads = (int)t;
        } else {
            fprintf(stderr, "gpt: unknown flag or missing value '%s'\n", f);
            usage(stderr);
            return -1;
        }
        if (field && (*field = pos_int(f, v)) < 0)
            return -1;
        i++;
    }
    if (c->quick) {
        c->steps = steps_set ? c->steps : 3;
        c->warmup = warmup_set ? c->warmup : 1;
        c->reps = 1;
    }
    return 0;
}

/* ---- Zhisuan side -------------------------------------------------------- */

static uint64_t next_rand(uint64_t *s)
{
    uint64_t x = *s += 0x9e3779b97f4a7c15ull; /* splitmix64 */
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* Random token ids [b, t] in [0, vocab), owned by the open scope. */
static zs_tensor *random_tokens(uint64_t *rng, int64_t b, int64_t t, int64_t vocab)
{
    int64_t n = b * t;
    int64_t *ids = malloc((size_t)n * sizeof *ids);
    if (!ids) {
        zs_set_error("out of memory for %lld token ids", (long long)n);
        return NULL;
    }
    for (int64_t i = 0; i < n; i++)
        ids[i] = (int64_t)(next_rand(rng) % (uint64_t)vocab);
    zs_tensor *x = zs_from_data(ZS_I64, 2, (int64_t[]){b, t}, ids);
    free(ids);
    return x;
}

static void trainer_free(trainer *t)
{
    zs_trainer_free(t->t);
    zs_module_free(t->m);
    *t = (trainer){0};
}

/* zs_batch_fn: random tokens, a pure function of the batch index. */
static zs_status random_batch(void *ctx, int64_t index, zs_tensor **x, zs_tensor **y)
{
    const trainer *t = ctx;
    /* a hashed start: splitmix64 streams whose starts differ by a multiple
     * of its increment would repeat each other shifted */
    uint64_t rng = (uint64_t)index;
    rng = next_rand(&rng) ^ SEED;
    *x = random_tokens(&rng, t->batch, t->seq, t->vocab);
    *y = random_tokens(&rng, t->batch, t->seq, t->vocab);
    return *x && *y ? ZS_OK : ZS_ERR_NOMEM;
}

/* --dump-graph FILE (graph trainers only): the graph before and after its
 * passes, the memory plan and, after the run, the per-node replay profile
 * (zs_trainer_graph_profile_dump). */
static const char *dump_graph_path;

/* The model of preset (vocab) under a trainer configured as `zs train
 * gpt` (AdamW, clip 1.0, lr 1e-3 constant). */
static zs_status trainer_init(trainer *t, const char *preset, int64_t vocab,
                              int64_t batch, int64_t seq, zs_dtype precision,
                              bool graph)
{
    *t = (trainer){0};
    t->batch = batch, t->vocab = vocab, t->rng = SEED;
    zs_gpt_config gc = {.arch = ZS_GPT2, .vocab = vocab};
    if (zs_gpt_preset(preset, &gc) != 0)
        return ZS_ERR_ARG;
    t->seq = seq ? seq : gc.ctx;
    if (t->seq > gc.ctx)
        return zs_set_error("--seq %lld is longer than the %s model's context "
                            "of %lld", (long long)t->seq, preset, (long long)gc.ctx);
    if (!(t->m = zs_gpt_new(&gc, SEED)))
        return ZS_ERR_ARG;
    zs_trainer_config tc = zs_trainer_defaults();
    tc.schedule = (zs_lr_schedule){ZS_LR_CONSTANT, 1e-3, 0, 0, 0, 0, 0};
    tc.steps = 1 << 30;
    tc.batch = random_batch, tc.batch_ctx = t;
    tc.precision = precision;
    tc.graph = graph;
    tc.dump_graph = graph ? dump_graph_path : NULL;
    return (t->t = zs_trainer_new(t->m, &tc)) ? ZS_OK : ZS_ERR_ARG;
}

/* One training step. */
static zs_status train_step(trainer *t, double *loss_out)
{
    zs_train_event e;
    zs_status st = zs_trainer_step(t->t, &e);
    *loss_out = e.loss;
    return st;
}

/* The warm-up steps of t, then r ready for its timed steps. */
static zs_status train_warm(trainer *t, const config *c, result *r)
{
    double loss = 0;
    for (int64_t i = 0; i < c->warmup; i++)
        if (train_step(t, &loss) != ZS_OK)
            return ZS_ERR_ARG;
    zs_trainer_profile_reset(t->t);
    zs_alloc_stats ap;
    zs_alloc_get_stats(&ap); /* the peak so far: model, trainer, warm-up */
    r->peak_bytes = (double)ap.peak_bytes;
    r->train_best_s = INFINITY;
    r->train_s = 0;
    return ZS_OK;
}

/* One timed step of t into r: its time, fastest step, memory, loss. */
static zs_status train_timed(trainer *t, result *r)
{
    zs_alloc_stats a0, a1;
    zs_alloc_get_stats(&a0);
    zs_alloc_reset_peak();
    struct rusage u0, u1;
    getrusage(RUSAGE_SELF, &u0);
    double ts = now();
    if (train_step(t, &r->loss) != ZS_OK)
        return ZS_ERR_ARG;
    double dt = now() - ts;
    getrusage(RUSAGE_SELF, &u1);
    r->faults += (double)(u1.ru_minflt - u0.ru_minflt + u1.ru_majflt - u0.ru_majflt);
    zs_alloc_get_stats(&a1);
    if ((double)a1.peak_bytes > r->peak_bytes)
        r->peak_bytes = (double)a1.peak_bytes;
    double act = (double)a1.peak_bytes - (double)a0.current_bytes;
    r->act_bytes = act > r->act_bytes ? act : r->act_bytes;
    r->train_best_s = dt < r->train_best_s ? dt : r->train_best_s;
    r->train_s += dt;
    r->train_ok = true;
    return ZS_OK;
}

static zs_status bench_zs_train(trainer *t, const config *c, result *r)
{
    if (train_warm(t, c, r) != ZS_OK)
        return ZS_ERR_ARG;
    for (int64_t i = 0; i < c->steps; i++)
        if (train_timed(t, r) != ZS_OK)
            return ZS_ERR_ARG;
    return ZS_OK;
}

/* The first event's time (the prefill), for generate. */
typedef struct gen_clock {
    double t0, first;
    int64_t tokens;
} gen_clock;

static void on_token(void *ctx, const zs_token_event *ev)
{
    gen_clock *g = ctx;
    if (g->tokens++ == 0)
        g->first = now() - g->t0;
    (void)ev;
}

/* Greedy decoding of n_new tokens after prompt [1, P] with the inference
 * engine (zs_llm in f32, paged KV cache); *prefill gets the prefill
 * seconds, *total the whole generation's (not the weights' packing). */
static zs_status generate(zs_module *m, zs_tensor *prompt, int64_t n_new,
                          double *prefill, double *total)
{
    zs_llm *llm = zs_llm_from_gpt(m, NULL);
    zs_engine *e = llm ? zs_engine_new(llm, NULL, &(zs_engine_config){.max_num_seqs = 1})
                       : NULL;
    int64_t P = prompt->shape[1];
    int32_t *ids = malloc((size_t)P * sizeof *ids);
    for (int64_t i = 0; ids && i < P; i++)
        ids[i] = (int32_t)((const int64_t *)zs_data(prompt))[i];
    zs_gen_request q = {.prompt = ids, .n_prompt = P, .max_tokens = n_new,
                        .sampling = {.top_p = 1}, .ignore_eos = true};
    gen_clock g = {now(), 0, 0};
    zs_status st = e && ids ? zs_engine_add(e, &q, NULL) : ZS_ERR_ARG;
    if (st == ZS_OK)
        st = zs_engine_run(e, on_token, &g);
    *prefill = g.first;
    *total = now() - g.t0;
    if (st == ZS_OK && g.tokens != n_new)
        st = zs_set_error("generate: %lld of %lld tokens", (long long)g.tokens,
                          (long long)n_new);
    free(ids);
    zs_engine_free(e);
    zs_llm_free(llm);
    return st;
}

static zs_status bench_zs_generate(trainer *t, const config *c, result *r)
{
    zs_scope_push();
    zs_tensor *prompt = random_tokens(&t->rng, 1, c->prompt, t->vocab);
    double prefill, dt;
    zs_status st = prompt ? generate(t->m, prompt, c->new_tokens, &prefill, &dt)
                          : ZS_ERR_ARG;
    r->gen_best_s = INFINITY;
    for (int64_t i = 0; st == ZS_OK && i < c->reps; i++) {
        st = generate(t->m, prompt, c->new_tokens, &prefill, &dt);
        r->gen_s += dt / (double)c->reps;
        if (dt < r->gen_best_s)
            r->gen_best_s = dt, r->prefill_s = prefill;
    }
    zs_scope_pop();
    r->gen_ok = st == ZS_OK;
    return st;
}

/* Phase times of the timed steps; the two optimizer passes as bytes moved
 * per second against the triad bandwidth measured now. */
static void print_phases(const trainer *t, const config *c)
{
    zs_train_profile p;
    zs_trainer_profile(t->t, &p);
    const char *names[] = {"forward+loss", "backward", "grad norm", "update", "zero grad"};
    double s[] = {p.forward_s, p.backward_s, p.norm_s, p.update_s, p.zero_grad_s};
    double total = 0, n = (double)(p.steps ? p.steps : 1);
    for (int i = 0; i < 5; i++)
        total += s[i];
    double triad = zs_measure_triad_gbs(c->threads, (size_t)1 << 28, 5) * 1e9;
    printf("\nzhisuan time per training step by phase (mean of %lld timed steps; "
           "triad %.1f GB/s on %d threads):\n", (long long)p.steps, triad / 1e9,
           c->threads);
    for (int i = 0; i < 5; i++) {
        double bytes = i == 2 ? p.norm_bytes : i == 3 ? p.update_bytes : 0;
        char bw[96] = "";
        if (bytes > 0 && s[i] > 0)
            snprintf(bw, sizeof bw, "  %6.1f GB/s = %.2f of triad (%.0f MB moved)",
                     bytes * n / s[i] / 1e9, bytes * n / s[i] / triad, bytes / 1e6);
        printf("  %-13s %9.2f ms %5.1f%%%s\n", names[i], 1e3 * s[i] / n,
               100 * s[i] / total, bw);
    }
}

static void print_profile(trainer *t, const config *c)
{
    double loss;
    print_phases(t, c);
    zs_profile_reset();
    zs_profile_enable(true);
    double t0 = now();
    zs_status st = train_step(t, &loss);
    double dt = now() - t0;
    zs_profile_enable(false);
    if (st != ZS_OK) {
        fprintf(stderr, "gpt: profiled step: %s\n", zs_last_error());
        return;
    }
    printf("\nzhisuan operators in one training step (batch %lld x %lld, "
           "%.1f ms wall, %.1f GFLOP counted):\n", (long long)t->batch,
           (long long)t->seq, 1e3 * dt, 1e-9 * zs_profile_total_flops());
    zs_profile_print(stdout);
}

/* ---- PyTorch side ---------------------------------------------------------- */

/* Runs the peer with `args`; parses its zsbench lines into r and *rss
 * (either may be NULL), passes its other lines through. False when torch
 * is not available or the run failed. */
static bool run_peer(const config *c, const char *args, result *r, double *rss)
{
    char cmd[8192];
    snprintf(cmd, sizeof cmd, PEER_ENV "%s" PEER_PYTHON " '%s' --threads %d %s",
             isa_cap_torch_env(), c->script, c->threads, args);
    fflush(stdout);
    FILE *pf = popen(cmd, "r");
    if (!pf)
        return false;
    char line[512];
    bool got = false;
    while (fgets(line, sizeof line, pf)) {
        long long n;
        double a, b, d;
        if (r && sscanf(line, "zsbench gpt train-bf16 %lld %lf %lf %lf", &n, &a, &b,
                        &d) == 4) {
            result *l = r + 1; /* the autocast run's row */
            l->train_s = a, l->train_best_s = b, l->loss = d;
            l->train_ok = n == c->steps && a > 0;
        } else if (r && sscanf(line, "zsbench gpt train %lld %lf %lf %lf", &n, &a, &b, &d) == 4) {
            r->train_s = a, r->train_best_s = b, r->loss = d;
            got = r->train_ok = n == c->steps && a > 0;
        } else if (r && sscanf(line, "zsbench gpt generate %lld %lf %lf %lf", &n, &a,
                               &b, &d) == 4) {
            r->gen_s = a, r->gen_best_s = b, r->prefill_s = d;
            got = r->gen_ok = n == c->new_tokens && a > 0;
        } else if (rss && sscanf(line, "zsbench gpt memory %lf", &a) == 1) {
            *rss = a;
            got = a > 0;
        } else if (r || strncmp(line, "pytorch ", 8) != 0) {
            fputs(line, stdout); /* the peer's own messages */
        }
    }
    pclose(pf);
    return got;
}

/* ---- memory ------------------------------------------------------------------ */

/* A field of /proc/self/status ("VmHWM:", "VmRSS:") in bytes, or 0. */
static double proc_status_bytes(const char *key)
{
    FILE *f = fopen("/proc/self/status", "r");
    if (!f)
        return 0;
    char line[256];
    double kb = 0;
    size_t n = strlen(key);
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, key, n)) {
            kb = strtod(line + n, NULL);
            break;
        }
    fclose(f);
    return kb * 1024;
}

/* Predicted training bytes of GPT config g at batch b, length s. */
typedef struct mem_pred {
    double params, state, act_t2, act_fused, logits;
} mem_pred;

static zs_status predict(const zs_gpt_config *g, int64_t b, int64_t s, mem_pred *p)
{
    const zs_model_config *base = zs_model_preset("gpt2");
    if (!base)
        return ZS_ERR_ARG;
    zs_model_config mc = *base;
    mc.n_layer = g->layers, mc.d_model = g->width, mc.n_head = g->heads;
    mc.d_head = 0, mc.n_kv_head = 0, mc.d_ff = 0;
    mc.vocab = g->vocab, mc.seq_len = g->ctx;
    if (zs_model_config_finish(&mc) != ZS_OK)
        return ZS_ERR_ARG;
    double L = (double)g->layers;
    p->params = (double)zs_gpt_param_count(g);
    p->state = 16 * p->params;
    /* fp32 activations: twice the 16-bit figures */
    p->act_t2 = 2 * L * zs_activation_bytes_layer(&mc, b, s, 1, ZS_RECOMPUTE_NONE);
    p->act_fused = 2 * L * zs_activation_bytes_layer(&mc, b, s, 1, ZS_RECOMPUTE_SELECTIVE);
    p->logits = 8.0 * (double)(b * s) * (double)g->vocab;
    return ZS_OK;
}

/* Trains gpt2 MEM_STEPS steps at MEM_BATCH x MEM_SEQ and prints the peaks
 * next to the prediction, and PyTorch's peak RSS for the same run. */
static int run_memory(const config *c)
{
    double rss0 = proc_status_bytes("VmRSS:");
    zs_alloc_reset_peak();
    trainer t;
    double t0 = now(), loss = 0;
    zs_status st = trainer_init(&t, "gpt2", MEM_VOCAB, MEM_BATCH, MEM_SEQ, ZS_F32, false);
    double t_init = now() - t0;
    for (int i = 0; st == ZS_OK && i < MEM_STEPS; i++)
        st = train_step(&t, &loss);
    if (st != ZS_OK) {
        fprintf(stderr, "gpt: memory run: %s\n", zs_last_error());
        trainer_free(&t);
        return 1;
    }
    double t_train = now() - t0 - t_init;
    double hwm = proc_status_bytes("VmHWM:");
    zs_alloc_stats as;
    zs_alloc_get_stats(&as);
    mem_pred p;
    if (predict(zs_gpt_config_of(t.m), MEM_BATCH, MEM_SEQ, &p) != ZS_OK) {
        fprintf(stderr, "gpt: memory prediction: %s\n", zs_last_error());
        trainer_free(&t);
        return 1;
    }
    trainer_free(&t);
    double with_t2 = p.state + p.act_t2 + p.logits;
    double fused = p.state + p.act_fused + p.logits;
    printf("memory: gpt2 (12 layers, 768 wide, 12 heads, vocab %d), %.0f "
           "parameters, AdamW, %d steps at B=%d, T=%d (init %.1f s, steps %.1f s, "
           "loss %.3f)\n", MEM_VOCAB, p.params, MEM_STEPS, MEM_BATCH, MEM_SEQ,
           t_init, t_train, loss);
    printf("  predicted  params+grads+AdamW (16 B/param)      %9.1f MiB\n", p.state / MiB);
    printf("             activations fp32, 2*L*(34sbh+5as^2b) %9.1f MiB\n", p.act_t2 / MiB);
    printf("             activations fp32, 2*L*34sbh (fused)  %9.1f MiB\n", p.act_fused / MiB);
    printf("             logits + their gradient, 8sbV        %9.1f MiB\n", p.logits / MiB);
    printf("             total with s^2 / fused               %9.1f / %.1f MiB\n",
           with_t2 / MiB, fused / MiB);
    printf("  measured   zhisuan peak RSS (VmHWM)             %9.1f MiB "
           "(%.1f MiB before the model)\n", hwm / MiB, rss0 / MiB);
    printf("             zhisuan allocator peak               %9.1f MiB\n",
           (double)as.peak_bytes / MiB);
    double torch_rss = 0;
    if (run_peer(c, "--memory", NULL, &torch_rss))
        printf("             pytorch peak RSS (ru_maxrss)         %9.1f MiB\n",
               torch_rss / MiB);
    printf("memory gpt2 B=4 T=64: peak RSS %.0f MiB, allocator peak %.0f MiB, "
           "predicted %.0f MiB (%.0f fused): RSS/predicted = %.2f (%.2f fused)\n",
           hwm / MiB, (double)as.peak_bytes / MiB, with_t2 / MiB, fused / MiB,
           hwm / with_t2, hwm / fused);
    return 0;
}

/* The memory section from a child process (a fresh high-water mark). */
static void memory_child(const config *c)
{
    char self[4096], cmd[8400];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) {
        printf("memory: cannot find this program's path\n");
        return;
    }
    self[n] = '\0';
    snprintf(cmd, sizeof cmd, "'%s' --memory --threads %d --script '%s'", self,
             c->threads, c->script);
    fflush(stdout);
    if (system(cmd) != 0)
        printf("memory: the measurement failed\n");
}

/* ---- graph mode ---------------------------------------------------------------- */

/* The two trainers of the graph rows live side by side and their timed
 * steps alternate, so that a change of the shared machine's load falls on
 * both sides of the ratio (run one after the other, graph/eager of bf16
 * GPT small spread over 0.91-1.14 in three runs on a 2-core Zen 4 share).
 * Memory stays per trainer: the allocator counts both, and a trainer holds
 * the same bytes while the other runs, so held[k] (what trainer k keeps
 * between its calls, above the bench's own base) is subtracted from the
 * other's peaks. */
typedef struct side_mem {
    double base;      /* bytes live before either trainer */
    double held[2];   /* bytes each trainer keeps between its calls */
    double peak[2];   /* each trainer's peak: base + its own bytes */
} side_mem;

/* After a call on trainer k (init or step): its peak and held bytes. */
static void side_account(side_mem *m, int k)
{
    zs_alloc_stats a;
    zs_alloc_get_stats(&a);
    double other = m->held[1 - k];
    m->peak[k] = fmax(m->peak[k], (double)a.peak_bytes - other);
    m->held[k] = (double)a.current_bytes - m->base - other;
}

static zs_status side_init(trainer *t, const config *c, side_mem *m, int k)
{
    zs_alloc_reset_peak();
    zs_status st = trainer_init(t, c->preset, c->vocab, c->batch, c->seq,
                                c->graph_only ? c->precision : ZS_F32, k == 1);
    side_account(m, k);
    for (int64_t i = 0; st == ZS_OK && i < c->warmup; i++) {
        double loss;
        zs_alloc_reset_peak();
        st = train_step(t, &loss);
        side_account(m, k);
    }
    return st;
}

/* --graph-only --profile: eager's operators per timed step (the graph's,
 * timed node by node in the same interleaved steps, go to --dump-graph's
 * file). */
static void print_eager_ops(const config *c)
{
    zs_op_stat st[128];
    int n = zs_profile_stats(st, 128);
    double total = 0, steps = (double)c->steps;
    for (int i = 0; i < n; i++)
        total += st[i].seconds;
    printf("\neager operators, ms per timed step (%.1f ms in operators; graph: "
           "--dump-graph FILE's replay profile)\n", 1e3 * total / steps);
    for (int i = 0; i < n; i++)
        if (st[i].seconds > 1e-4 * steps)
            printf("  %-26s %7.1f calls %9.3f ms %8.2f GFLOP/s\n", st[i].name,
                   (double)st[i].calls / steps, 1e3 * st[i].seconds / steps,
                   st[i].seconds > 0 ? st[i].flops / st[i].seconds / 1e9 : 0.0);
}

/* Eager (0) and graph (1) training on fresh trainers (same model seed,
 * batches), with each one's peak; prints the rows and the ratio. */
static int run_graph_rows(const config *c)
{
    result r[2] = {{0}};
    trainer t[2] = {{0}};
    side_mem m = {0};
    size_t cap_peak = 0, arena = 0;
    zs_alloc_trim();
    zs_alloc_stats a;
    zs_alloc_get_stats(&a);
    m.base = (double)a.current_bytes;
    zs_status st = ZS_OK;
    /* the graph trainer first: its memory plan trims the allocator's
     * cache (passes.c), which would hand the eager trainer's warm blocks
     * back to the system and fault them in again in its first timed step */
    for (int k = 1; k >= 0 && st == ZS_OK; k--) {
        st = side_init(&t[k], c, &m, k);
        r[k].train_best_s = INFINITY;
        if (st == ZS_OK && zs_alloc_tracing()) { /* ZS_ALLOC_TRACE=1 */
            printf("\n%s trainer: what was held at the peak of its set-up and "
                   "warm-up%s\n", k ? "graph" : "eager",
                   k ? "" : " (the graph trainer's blocks included)");
            zs_alloc_peak_report(stdout, 1 << 20);
        }
    }
    zs_profile_reset();
    for (int64_t i = 0; st == ZS_OK && i < c->steps; i++)
        for (int k = 0; k < 2 && st == ZS_OK; k++) {
            zs_profile_enable(c->profile && k == 0); /* eager's operators */
            st = train_timed(&t[k], &r[k]);
            zs_profile_enable(false);
            side_account(&m, k);
        }
    if (st == ZS_OK)
        st = zs_trainer_graph_memory(t[1].t, &cap_peak, &arena);
    double peak[2], step[2];
    for (int k = 0; k < 2; k++) {
        peak[k] = m.peak[k] / 1048576;
        step[k] = (r[k].act_bytes + (k == 1 ? (double)arena : 0)) / 1048576;
    }
    int64_t batch = t[0].batch, seq = t[0].seq;
    for (int k = 0; k < 2; k++)
        if (t[k].m)
            trainer_free(&t[k]);
    if (st != ZS_OK) {
        fprintf(stderr, "gpt --graph: %s\n", zs_last_error());
        return 1;
    }
    double tok = (double)(batch * seq) * (double)c->steps;
    printf("\n%-8s %11s %10s %9s %11s %11s %12s   (zhisuan training, %lld x %lld)\n", "",
           "train tok/s", "ms/step", "last loss", "peak MiB", "step MiB", "faults/step",
           (long long)batch,
           (long long)seq);
    printf("(%s %s, %lld warm-up + %lld timed steps, %d threads)\n", c->preset,
           zs_precision_name(c->graph_only ? c->precision : ZS_F32),
           (long long)c->warmup, (long long)c->steps, c->threads);
    const char *names[] = {"eager", "graph"};
    for (int k = 0; k < 2; k++)
        printf("%-8s %11.0f %10.1f %9.4f %11.1f %11.1f %12.0f\n", names[k], tok / r[k].train_s,
               1e3 * r[k].train_s / (double)c->steps, r[k].loss, peak[k], step[k],
               r[k].faults / (double)c->steps);
    printf("(step MiB: the allocator's peak in a timed step above its start; graph: "
           "plus the plan's arena, %.1f MiB; the capture step peaked %.1f MiB above "
           "its start; peak MiB: the whole run's, capture and warm-up included; "
           "timed steps alternate between the two)\n",
           (double)arena / 1048576, (double)cap_peak / 1048576);
    if (c->profile)
        print_eager_ops(c);
    printf("gpt train step memory graph/eager = %.3f\n", step[1] / step[0]);
    printf("gpt train peak memory graph/eager = %.3f\n", peak[1] / peak[0]);
    printf("gpt train tokens/s graph/eager = %.3f\n", r[0].train_s / r[1].train_s);
    return 0;
}

/* ---- report ------------------------------------------------------------------ */

static void print_row(const char *name, const result *r, const config *c,
                      int64_t batch, int64_t seq)
{
    double tok = (double)(batch * seq);
    printf("%-14s %11.0f %11.0f %10.1f %9.3f", name,
           tok * (double)c->steps / r->train_s, tok / r->train_best_s,
           1e3 * r->train_s / (double)c->steps, r->loss);
    if (r->gen_ok)
        printf(" %11.1f %11.1f %11.1f", (double)c->new_tokens / r->gen_s,
               (double)c->new_tokens / r->gen_best_s, 1e3 * r->prefill_s);
    else
        printf(" %11s %11s %11s", "-", "-", "-");
    if (r->act_bytes > 0)
        printf(" %13.1f", r->act_bytes / MiB);
    printf("\n");
}

/* --precision without --profile: fp32 (t) and the precision trained on
 * two trainers whose timed steps alternate, so that a change of the shared
 * machine's load falls on both sides of the ratio (run one after the
 * other, the bf16/fp32 ratio of five runs spread over 1.44-1.92 on a
 * 2-core Zen 4 share whose load came and went). */
static zs_status bench_zs_interleaved(trainer *t, const config *c, result *r,
                                      result *rl)
{
    trainer tl;
    zs_status st = trainer_init(&tl, c->preset, c->vocab, c->batch, c->seq,
                                c->precision, false);
    if (st == ZS_OK && (st = train_warm(t, c, r)) == ZS_OK)
        st = train_warm(&tl, c, rl);
    for (int64_t i = 0; st == ZS_OK && i < c->steps; i++)
        if ((st = train_timed(t, r)) == ZS_OK)
            st = train_timed(&tl, rl);
    trainer_free(&tl);
    return st;
}

/* --precision --profile: the same training under the precision after the
 * fp32 run (the operator profile counts one trainer), no generation. */
static zs_status bench_zs_lowp(const config *c, result *r)
{
    trainer t;
    zs_status st = trainer_init(&t, c->preset, c->vocab, c->batch, c->seq, c->precision, false);
    if (st == ZS_OK)
        st = bench_zs_train(&t, c, r);
    if (st == ZS_OK && c->profile) {
        printf("\n== zhisuan-%s ==", zs_precision_name(c->precision));
        print_profile(&t, c);
    }
    trainer_free(&t);
    return st;
}

int main(int argc, char **argv)
{
    config c;
    if (parse_args(argc, argv, &c) != 0)
        return 2;
    zs_set_num_threads(c.threads);
    dump_graph_path = c.dump_graph;
    if (c.memory_only)
        return run_memory(&c);
    if (c.graph_only)
        return run_graph_rows(&c);
    trainer t;
    result zr = {0}, zl = {0}, pr[2] = {{0}};
    bool lowp = c.precision != ZS_F32;
    const char *pname = zs_precision_name(c.precision);
    zs_status st = trainer_init(&t, c.preset, c.vocab, c.batch, c.seq, ZS_F32, false);
    if (st == ZS_OK) {
        /* A context shorter than prompt + new (preset tiny) shortens both. */
        int64_t ctx = zs_gpt_config_of(t.m)->ctx;
        c.prompt = c.prompt < ctx / 2 ? c.prompt : ctx / 2;
        c.new_tokens = c.new_tokens < ctx - c.prompt ? c.new_tokens : ctx - c.prompt;
        st = lowp && !c.profile ? bench_zs_interleaved(&t, &c, &zr, &zl)
                                : bench_zs_train(&t, &c, &zr);
    }
    if (st != ZS_OK || bench_zs_generate(&t, &c, &zr) != ZS_OK ||
        (lowp && c.profile && bench_zs_lowp(&c, &zl) != ZS_OK)) {
        fprintf(stderr, "gpt: %s\n", zs_last_error());
        trainer_free(&t);
        return 1;
    }
    const zs_gpt_config *g = zs_gpt_config_of(t.m);
    static const char *const fam[] = {"gemm f32", "attention", "pointwise",
                                      "softmax, norms, reductions", "optimizer"};
    isa_cap_header(stdout, fam, 5, "PyTorch");
    printf("GPT %s: %lld layers, width %lld, %lld heads, context %lld, vocab %lld "
           "(random tokens), %lld parameters; train batch %lld x %lld, AdamW, clip "
           "1.0, %lld warm-up + %lld timed steps; generate batch 1, prompt %lld, "
           "%lld new greedy tokens, KV cache, %lld runs; %d threads%s%s\n",
           c.preset, (long long)g->layers, (long long)g->width, (long long)g->heads,
           (long long)g->ctx, (long long)g->vocab, (long long)zs_gpt_param_count(g),
           (long long)t.batch, (long long)t.seq, (long long)c.warmup,
           (long long)c.steps, (long long)c.prompt, (long long)c.new_tokens,
           (long long)c.reps, c.threads, lowp ? "; training also in " : "",
           lowp ? pname : "");
    if (lowp && c.precision != ZS_BF16)
        printf("(PyTorch's CPU autocast is bf16 only: its row stays bf16)\n");
    if (c.profile)
        print_profile(&t, &c);
    int64_t batch = t.batch, seq = t.seq;
    trainer_free(&t);
    char args[512];
    snprintf(args, sizeof args, "--train --generate --preset %s --vocab %lld "
             "--batch %lld --seq %lld --steps %lld --warmup %lld --prompt %lld "
             "--new %lld --reps %lld", c.preset, (long long)c.vocab,
             (long long)batch, (long long)seq, (long long)c.steps,
             (long long)c.warmup, (long long)c.prompt, (long long)c.new_tokens,
             (long long)c.reps);
    if (lowp)
        strcat(args, " --bf16");
    bool have_torch = run_peer(&c, args, pr, NULL) && pr[0].train_ok && pr[0].gen_ok &&
                      (!lowp || pr[1].train_ok);
    printf("\n");
    memory_child(&c);
    printf("\n%-14s %11s %11s %10s %9s %11s %11s %11s %13s\n", "", "train tok/s",
           "best step", "ms/step", "last loss", "gen tok/s", "best run", "prefill ms",
           "act. MiB/step");
    char zname[32], zname32[32] = "zhisuan";
    snprintf(zname, sizeof zname, "zhisuan-%s", pname);
    if (lowp)
        snprintf(zname32, sizeof zname32, "zhisuan-fp32");
    print_row(zname32, &zr, &c, batch, seq);
    if (lowp)
        print_row(zname, &zl, &c, batch, seq);
    if (have_torch) {
        print_row(lowp ? "pytorch-fp32" : "pytorch", &pr[0], &c, batch, seq);
        if (lowp)
            print_row("pytorch-bf16", &pr[1], &c, batch, seq);
        printf("gpt train tokens/s zhisuan/pytorch = %.3f\n", pr[0].train_s / zr.train_s);
        printf("gpt generate tokens/s zhisuan/pytorch = %.3f\n", pr[0].gen_s / zr.gen_s);
    } else {
        printf("pytorch: not available\n");
    }
    if (lowp) {
        if (have_torch)
            printf("gpt train tokens/s %s/pytorch-bf16 = %.3f\n", zname,
                   pr[1].train_s / zl.train_s);
        printf("gpt train tokens/s %s/zhisuan-fp32 = %.3f\n", zname, zr.train_s / zl.train_s);
        printf("gpt activation memory %s/zhisuan-fp32 = %.3f (%.1f / %.1f MiB per step)\n",
               zname, zl.act_bytes / zr.act_bytes, zl.act_bytes / MiB, zr.act_bytes / MiB);
    }
    return c.graph ? run_graph_rows(&c) : 0;
}
