/*
 * infer.c - bench/infer: the inference engine (zs/infer.h) in one run:
 * decode speed against the memory-bandwidth roofline and PyTorch, batched
 * decode, continuous against static batching on a request trace, the
 * paged KV cache's memory, and validation loss per quantization.
 *
 * Model (sections 1-3): random weights of --preset (default gpt2: 12
 * layers, 768 wide, 12 heads, context 1024) with --vocab (default 50257,
 * GPT-2's: 124M parameters), or --ckpt DIR: a `zs train gpt` output
 * directory or checkpoint file (zs_model_open). --preset small --vocab
 * 4096 makes a quick run.
 *
 * 2. Decode at batch 1: one request, a random prompt of 128 tokens, 64
 *    new greedy tokens (ignore_eos), best of --reps (5) runs after one
 *    untimed run, for f32, q8_0 and q4_0 (zs_llm_from_gpt), interleaved
 *    run by run (load on the shared machine hits them alike). Only
 *    decoding is timed: tokens 2..64 over the time from the first
 *    token's event to the last's. "median step" is 1 / the median gap
 *    between consecutive tokens over all timed runs (the speed without
 *    the stalls: neighbours on the shared machine take memory bandwidth
 *    in bursts). Roofline tok/s = triad bytes/s (zs_measure_triad_gbs,
 *    measured in this run before and after the decodes and at the start
 *    of every round, the best of all) / bytes read per token, bytes per
 *    token = zs_llm_weight_bytes + the f32 KV cache read at the mean
 *    context of the decode steps (prompt + new / 2 positions): 2 * layers
 *    * ctx * width * 4. "of roof" is the fastest run against that best
 *    triad; "paired" is the median over rounds of each run's bytes/s
 *    against the triad of its own round, measured just before it: the
 *    machine's memory speed drifts by a quarter and more within one run
 *    (triads of 37 and 45 GB/s before and after the same decodes were
 *    seen), so a run is best compared with the bandwidth of its moment.
 *    PyTorch (bench/gpt_torch.py --generate: the same model,
 *    a KV cache, batch 1) decodes new - 1 tokens in its best run's time
 *    less that run's prefill.
 *
 * 3. Aggregate decode tokens/s of 1, 4, 16, 64 sequences added at once
 *    (prompt 128, 64 new tokens each; max_batched_tokens 2048, so the
 *    prefills take several steps), f32, q8_0, and q8_0 with the KV cache
 *    in bf16 (zs_engine_config.kv_dtype: half the KV bytes per step). "full batch" counts
 *    only the steps that start with every sequence past its first token
 *    and none finished (all decoding: each emits one token per sequence):
 *    sequences / the median time of those steps; "overall" is all output
 *    tokens over the whole wall time, prefills included.
 *
 * 4. Continuous against static batching (zs_engine_config.static_batching)
 *    on one trace of --requests (256) requests: Poisson arrivals at
 *    --rate requests/s (default 10: 10 x the mean output of 260 tokens
 *    offers 2600 tokens/s, about 3x what the engine serves on 2 cores,
 *    so the queue grows and the run outlasts the arrivals several times),
 *    prompts uniform in 16..256 random tokens, outputs (max_tokens,
 *    ignore_eos) uniform in 8..512, seed 1 for both modes. Model: random
 *    weights of --trace-preset (default small: 6 layers, 384 wide) with
 *    its context raised to --trace-ctx (1024, so 256 + 512 fits) and
 *    vocabulary --trace-vocab (4096), f32. Both modes: max_num_seqs
 *    --trace-seqs (32), max_batched_tokens = 32 * 256 (a prompt is never
 *    split, and a static batch is filled in its first step), KV blocks
 *    for every slot at the longest prompt + the longest output (static
 *    padding included: nothing is preempted). Static batches pad their
 *    prompts to the batch's longest too (zs_engine_config.static_batching:
 *    the pad rows are computed and dropped, as masked left padding costs
 *    in a static server). A step costs about the same in both modes, so
 *    the ratio is bounded by about E[longest output of a batch] / E[mean
 *    output] (~1.9 for 32 outputs uniform in 8..512) plus the prompt
 *    padding. (Continuous batching with 2 x the sequences in the same
 *    pool, which paging makes room for, was measured too and gained
 *    nothing on 2 cores, 1.88-2.08x static in three runs against 1.85-
 *    2.07x at equal slots: a 32-sequence step is already bound by reading
 *    the KV cache, attention ~45% of the cycles.) The driver adds each request
 *    when the wall clock passes its arrival, then steps the engine.
 *    Throughput = output tokens / seconds until the last token; TTFT =
 *    first token's event - arrival; TPOT = (last - first token time) /
 *    (tokens - 1) per request; p50 and p99 by nearest rank.
 *
 * 5. KV memory of the continuous run, sampled after every step. A
 *    contiguous cache (one max-length buffer per sequence, as before
 *    PagedAttention) would reserve, at the peak, either the model's
 *    context for every running sequence, or prompt + max_tokens for every
 *    running request (the least a contiguous cache that knows max_tokens
 *    can reserve); the paged pool holds used_bytes (blocks referenced).
 *    Paged waste = wasted_bytes / used_bytes (slots of used blocks that
 *    hold no token), mean and max over the steps.
 *
 * 6. With --ckpt of a `zs train gpt` run (its directory holds tokens.bin
 *    and tokenizer.bpe, zs_text_corpus_open): mean cross-entropy over
 *    --val-windows windows of the context length, evenly spaced over the
 *    validation split, through zs_llm_logits, for f32, q8_0, q4_0, q4_1,
 *    int8 and w8a8 (calibrated on the first 2048 tokens of the training
 *    split). Make such a checkpoint with
 *        build/zs train gpt --preset small --steps 300 --out runs/bible
 *    (the King James Bible, BPE 4096, about 15 minutes on 2 cores).
 *
 * --quick (a smoke run, seconds): preset small, vocabulary 4096, prompt
 * 64, 32 new tokens, one timed run, batches 1 and 4; a trace of 32
 * requests on preset tiny (context 256, vocabulary 512) at 2000/s,
 * prompts 16..64, outputs 8..64, 8 sequences; 4 validation windows, 512
 * calibration tokens. Flags given beside it win. --only NAME runs one
 * section (decode, batch, trace, val); the others' summary figures are
 * then nan.
 *
 * The last three lines read
 *     infer decode q8/f32 = R                 batch 1 decode tok/s
 *     infer continuous/static throughput = R
 *     infer kv waste paged = P%               mean over the steps
 * Benchmarks print; nothing here asserts a time.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "zs/zs.h"

#include "isa_cap.h"

/* The PyTorch peer's environment, as bench/gpt runs it. */
#define PEER_ENV                                                             \
    "env -u OPENBLAS_CORETYPE OMP_WAIT_POLICY=PASSIVE "                      \
    "GLIBC_TUNABLES=glibc.malloc.mmap_max=0:"                                \
    "glibc.malloc.trim_threshold=68719476736 "
#define PEER_PYTHON "/usr/bin/python3"
#define SEED 1
#define BLOCK 16          /* KV block size (tokens), the engine's default */
#define BATCH_BUDGET 2048 /* max_batched_tokens of section 3 */
#define MiB (1024.0 * 1024.0)
#define N_BATCHES 4

typedef struct config {
    const char *preset, *ckpt, *trace_preset;
    const char *only;            /* one section: decode, batch, trace, val */
    int64_t vocab, prompt, new_tokens, reps;
    int64_t batches[N_BATCHES], n_batches;
    int64_t requests, trace_seqs, trace_vocab, trace_ctx;
    int64_t prompt_min, prompt_max, out_min, out_max;
    double rate;                 /* trace arrivals per second */
    int64_t val_windows, calib_tokens;
    int threads;
    bool quick, skip_peer;
    char script[4096];
} config;

/* Summary figures for the last lines (NAN: not measured). */
typedef struct summary {
    double decode_f32, decode_q8, cont_tput, static_tput, waste_mean;
} summary;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t next_rand(uint64_t *s)
{
    uint64_t x = *s += 0x9e3779b97f4a7c15ull; /* splitmix64 */
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* Uniform in [0, 1). */
static double next_unit(uint64_t *s) { return (double)(next_rand(s) >> 11) * 0x1p-53; }

/* Uniform integer in [lo, hi]. */
static int64_t next_range(uint64_t *s, int64_t lo, int64_t hi)
{
    return lo + (int64_t)(next_rand(s) % (uint64_t)(hi - lo + 1));
}

static void random_tokens(uint64_t *rng, int32_t *ids, int64_t n, int64_t vocab)
{
    for (int64_t i = 0; i < n; i++)
        ids[i] = (int32_t)(next_rand(rng) % (uint64_t)vocab);
}

static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
static int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }
static int64_t imax(int64_t a, int64_t b) { return a > b ? a : b; }

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Nearest-rank percentile p (0..1) of v[0, n), sorted in place. */
static double percentile(double *v, int64_t n, double p)
{
    if (n == 0)
        return NAN;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    int64_t k = (int64_t)ceil(p * (double)n) - 1;
    return v[k < 0 ? 0 : k >= n ? n - 1 : k];
}

/* f32 KV bytes of one token position, all layers, K and V. */
static double kv_token_bytes(const zs_gpt_config *g)
{
    return 2.0 * (double)g->layers * (double)g->width * 4.0;
}

/* ---- flags --------------------------------------------------------------- */

static void usage(FILE *f)
{
    fprintf(f, "usage: infer [--quick] [--threads N] [--ckpt DIR] [--preset NAME] "
               "[--vocab N] [--requests N] [--skip-peer] [more below]\n"
               "  --quick             small sizes for a smoke run\n"
               "  --threads N         threads of both sides (default 2)\n"
               "  --ckpt DIR          a zs train gpt output (default: random weights)\n"
               "  --preset NAME       tiny | small | gpt2 (default gpt2)\n"
               "  --vocab N           vocabulary of the random model (default 50257)\n"
               "  --reps N            timed batch-1 decode runs (default 5)\n"
               "  --requests N        requests of the trace (default 256)\n"
               "  --rate X            trace arrivals per second (default 10)\n"
               "  --trace-preset NAME model of the trace (default small)\n"
               "  --trace-vocab N     its vocabulary (default 4096)\n"
               "  --trace-ctx N       its context (default 1024)\n"
               "  --trace-seqs N      max_num_seqs of the trace (default 32)\n"
               "  --val-windows N     validation windows with --ckpt (default 16)\n"
               "  --skip-peer         do not run PyTorch\n"
               "  --only NAME         one section: decode | batch | trace | val\n"
               "  --script PATH       the peer (default bench/gpt_torch.py)\n");
}

/* Parses a positive integer flag value; -1 on error. */
static int64_t pos_int(const char *flag, const char *v)
{
    char *end;
    long long x = strtoll(v, &end, 10);
    if (*v == '\0' || *end != '\0' || x <= 0) {
        fprintf(stderr, "infer: %s wants a positive integer, got '%s'\n", flag, v);
        return -1;
    }
    return (int64_t)x;
}

static void defaults(config *c)
{
    *c = (config){.preset = "gpt2", .trace_preset = "small", .vocab = 50257,
                  .prompt = 128, .new_tokens = 64, .reps = 5,
                  .batches = {1, 4, 16, 64}, .n_batches = 4,
                  .requests = 256, .trace_seqs = 32, .trace_vocab = 4096,
                  .trace_ctx = 1024, .prompt_min = 16, .prompt_max = 256,
                  .out_min = 8, .out_max = 512, .rate = 10, .val_windows = 16,
                  .calib_tokens = 2048, .threads = 2};
    const char *slash = strrchr(__FILE__, '/');
    snprintf(c->script, sizeof c->script, "%.*s/gpt_torch.py",
             slash ? (int)(slash - __FILE__) : 1, slash ? __FILE__ : ".");
}

/* --quick: every section, small; the other flags override it. */
static void quick(config *c)
{
    c->quick = true;
    c->preset = "small", c->vocab = 4096;
    c->prompt = 64, c->new_tokens = 32, c->reps = 1;
    c->batches[0] = 1, c->batches[1] = 4, c->n_batches = 2;
    c->requests = 32, c->rate = 2000;
    c->trace_preset = "tiny", c->trace_vocab = 512, c->trace_ctx = 256;
    c->trace_seqs = 8, c->prompt_max = 64, c->out_max = 64;
    c->val_windows = 4, c->calib_tokens = 512;
}

static int parse_args(int argc, char **argv, config *c)
{
    defaults(c);
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--quick"))
            quick(c);
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int64_t *field = NULL;
        if (!strcmp(f, "--quick") || !strcmp(f, "--skip-peer")) {
            c->skip_peer = c->skip_peer || f[2] == 's';
            continue;
        } else if (!strcmp(f, "--help")) {
            usage(stdout);
            exit(0);
        } else if (v && !strcmp(f, "--preset")) {
            c->preset = v;
        } else if (v && !strcmp(f, "--trace-preset")) {
            c->trace_preset = v;
        } else if (v && !strcmp(f, "--only")) {
            c->only = v;
            if (strcmp(v, "decode") && strcmp(v, "batch") && strcmp(v, "trace") &&
                strcmp(v, "val")) {
                fprintf(stderr, "infer: --only wants decode, batch, trace or val, "
                                "got '%s'\n", v);
                return -1;
            }
        } else if (v && !strcmp(f, "--ckpt")) {
            c->ckpt = v;
        } else if (v && !strcmp(f, "--script")) {
            snprintf(c->script, sizeof c->script, "%s", v);
        } else if (v && !strcmp(f, "--rate")) {
            char *end;
            c->rate = strtod(v, &end);
            if (*end != '\0' || !(c->rate > 0 && c->rate < INFINITY)) {
                fprintf(stderr, "infer: --rate wants a positive number, got '%s'\n", v);
                return -1;
            }
        } else if (v && !strcmp(f, "--vocab")) {
            field = &c->vocab;
        } else if (v && !strcmp(f, "--requests")) {
            field = &c->requests;
        } else if (v && !strcmp(f, "--reps")) {
            field = &c->reps;
        } else if (v && !strcmp(f, "--trace-vocab")) {
            field = &c->trace_vocab;
        } else if (v && !strcmp(f, "--trace-ctx")) {
            field = &c->trace_ctx;
        } else if (v && !strcmp(f, "--trace-seqs")) {
            field = &c->trace_seqs;
        } else if (v && !strcmp(f, "--val-windows")) {
            field = &c->val_windows;
        } else if (v && !strcmp(f, "--threads")) {
            int64_t t = pos_int(f, v);
            if (t < 0)
                return -1;
            c->threads = (int)t;
        } else {
            fprintf(stderr, "infer: unknown flag or missing value '%s'\n", f);
            usage(stderr);
            return -1;
        }
        if (field && (*field = pos_int(f, v)) < 0)
            return -1;
        i++;
    }
    return 0;
}

/* ---- the model ------------------------------------------------------------ */

/* The GPT of sections 1-3: the checkpoint's, or random weights of the
 * preset (borrowed by the caller until zs_model_close / zs_module_free). */
static zs_module *open_model(const config *c, zs_model_file *file)
{
    *file = (zs_model_file){0};
    if (c->ckpt) {
        if (zs_model_open(c->ckpt, file) != ZS_OK)
            return NULL;
        if (strcmp(file->kind, "gpt") != 0) {
            zs_set_error("%s holds a %s, not a GPT", c->ckpt, file->kind);
            return NULL;
        }
        return file->model;
    }
    zs_gpt_config g = {.arch = ZS_GPT2};
    if (zs_gpt_preset(c->preset, &g) != 0) {
        zs_set_error("unknown preset '%s'", c->preset);
        return NULL;
    }
    g.vocab = c->vocab;
    return zs_gpt_new(&g, SEED);
}

static zs_llm *make_llm(zs_module *m, zs_quant q)
{
    zs_llm_options o = {.quant = q};
    return zs_llm_from_gpt(m, &o);
}

/* ---- 2. decode at batch 1 ----------------------------------------------------- */

/* Times of the first and last token events, their count, and the gaps
 * between consecutive tokens (gaps[0, n - 1), caller's array, or NULL). */
typedef struct dec_clock {
    double first, last;
    int64_t n;
    double *gaps;
} dec_clock;

static void on_decode_token(void *ctx, const zs_token_event *ev)
{
    dec_clock *d = ctx;
    if (ev->token < 0)
        return;
    double t = now();
    if (d->n > 0 && d->gaps)
        d->gaps[d->n - 1] = t - d->last;
    d->last = t;
    if (d->n++ == 0)
        d->first = t;
}

/* One greedy generation of n_new tokens after prompt[0, P); *decode_s
 * gets the seconds from the first token to the last, gaps (NULL or
 * n_new - 1 entries) the seconds between consecutive tokens. */
static zs_status decode_once(zs_engine *e, const int32_t *prompt, int64_t P,
                             int64_t n_new, double *decode_s, double *gaps)
{
    zs_gen_request q = {.prompt = prompt, .n_prompt = P, .max_tokens = n_new,
                        .sampling = {.top_p = 1}, .ignore_eos = true};
    dec_clock d = {.gaps = gaps};
    zs_status st = zs_engine_add(e, &q, NULL);
    if (st == ZS_OK)
        st = zs_engine_run(e, on_decode_token, &d);
    if (st == ZS_OK && d.n != n_new)
        return zs_set_error("decode: %lld of %lld tokens", (long long)d.n,
                            (long long)n_new);
    *decode_s = d.last - d.first;
    return st;
}

#define N_DEC 3 /* f32, q8_0, q4_0 */

/* One quantization's model and engine, and its figures. */
typedef struct dec_side {
    zs_llm *llm;
    zs_engine *e;
    double weight_bytes, bytes_per_token, best_s, tok_s;
    double *gaps;         /* reps * (new - 1) token gaps of the timed runs */
    double median_tok_s;  /* 1 / their median */
    double *paired;       /* [reps] each timed run's bytes/s over its round's triad */
    double paired_median; /* their median */
} dec_side;

static zs_status dec_side_init(dec_side *d, zs_module *m, zs_quant q, const config *c)
{
    zs_engine_config ec = {.max_num_seqs = 1, .max_batched_tokens = c->prompt,
                           .no_prefix_cache = true};
    *d = (dec_side){.best_s = INFINITY};
    d->gaps = malloc((size_t)(c->reps * (c->new_tokens - 1) + 1) * sizeof *d->gaps);
    d->paired = malloc((size_t)c->reps * sizeof *d->paired);
    if (!d->gaps || !d->paired)
        return zs_set_error_code(ZS_ERR_NOMEM, "out of memory");
    d->llm = make_llm(m, q);
    d->e = d->llm ? zs_engine_new(d->llm, NULL, &ec) : NULL;
    if (!d->e)
        return ZS_ERR_ARG;
    double mean_ctx = (double)c->prompt + (double)c->new_tokens / 2;
    d->weight_bytes = (double)zs_llm_weight_bytes(d->llm);
    d->bytes_per_token = d->weight_bytes + mean_ctx * kv_token_bytes(zs_llm_config(d->llm));
    return ZS_OK;
}

static void dec_side_free(dec_side *d)
{
    free(d->gaps), free(d->paired);
    zs_engine_free(d->e);
    zs_llm_free(d->llm);
}

/* A short triad in bytes/s (3 arrays of 64 MiB, 2 x the L3; best of 3)
 * for one round of the decode section. */
static double round_triad(const config *c)
{
    return zs_measure_triad_gbs(c->threads, (size_t)1 << 26, 3) * 1e9;
}

/* Batch-1 decode of every side: one untimed run each, then c->reps
 * rounds that measure a triad and then run each side once (interleaved,
 * so a burst of load on the shared machine hits them alike); the fastest
 * run of each counts, the median gap between tokens over all its timed
 * runs, and the median over rounds of each run's bytes/s over its round's
 * triad. *bw_max gets the best triad of the rounds if it is larger. */
static zs_status bench_decode(dec_side *d, int n, const config *c, const int32_t *prompt,
                              double *bw_max)
{
    int64_t g = c->new_tokens - 1;
    double s = 0;
    zs_status st = ZS_OK;
    for (int i = 0; st == ZS_OK && i < n; i++)
        st = decode_once(d[i].e, prompt, c->prompt, c->new_tokens, &s, NULL);
    for (int64_t r = 0; st == ZS_OK && r < c->reps; r++) {
        double bw = round_triad(c);
        *bw_max = fmax(*bw_max, bw);
        for (int i = 0; st == ZS_OK && i < n; i++) {
            st = decode_once(d[i].e, prompt, c->prompt, c->new_tokens, &s,
                             d[i].gaps + r * g);
            d[i].best_s = s < d[i].best_s ? s : d[i].best_s;
            d[i].paired[r] = (double)g / s * d[i].bytes_per_token / bw;
        }
    }
    for (int i = 0; st == ZS_OK && i < n; i++) {
        d[i].tok_s = (double)g / d[i].best_s;
        d[i].median_tok_s = 1 / percentile(d[i].gaps, c->reps * g, 0.5);
        d[i].paired_median = percentile(d[i].paired, c->reps, 0.5);
    }
    return st;
}

/* The peer's preset for config g: one of gpt_torch.py's (same shape and
 * context, GPT-2 architecture), or NULL. */
static const char *peer_preset(const zs_gpt_config *g)
{
    static const char *const names[] = {"tiny", "small", "gpt2"};
    for (int i = 0; i < 3; i++) {
        zs_gpt_config p = {0};
        if (zs_gpt_preset(names[i], &p) == 0 && g->arch == ZS_GPT2 &&
            p.layers == g->layers && p.width == g->width && p.heads == g->heads &&
            p.ctx == g->ctx)
            return names[i];
    }
    return NULL;
}

/* PyTorch's batch-1 decode tok/s on config g (its best run less that
 * run's prefill), or a negative number; *why says what went wrong. */
static double run_peer(const config *c, const zs_gpt_config *g, const char **why)
{
    const char *preset = peer_preset(g);
    if (!preset) {
        *why = "pytorch: no gpt_torch.py preset has the checkpoint's shape";
        return -1;
    }
    char cmd[8192];
    snprintf(cmd, sizeof cmd, PEER_ENV "%s" PEER_PYTHON " '%s' --threads %d --generate "
             "--preset %s --vocab %lld --prompt %lld --new %lld --reps %lld",
             isa_cap_torch_env(), c->script, c->threads, preset, (long long)g->vocab, (long long)c->prompt,
             (long long)c->new_tokens, (long long)c->reps);
    fflush(stdout);
    FILE *pf = popen(cmd, "r");
    *why = "pytorch: not available";
    if (!pf)
        return -1;
    char line[512];
    double tok_s = -1;
    while (fgets(line, sizeof line, pf)) {
        long long n;
        double mean, best, prefill;
        if (sscanf(line, "zsbench gpt generate %lld %lf %lf %lf", &n, &mean, &best,
                   &prefill) == 4 && n == c->new_tokens && best > prefill)
            tok_s = (double)(n - 1) / (best - prefill);
        else if (strncmp(line, "pytorch: not available", 22) != 0)
            printf("  %s", line); /* its version line and any message */
    }
    pclose(pf);
    return tok_s;
}

static void print_decode_row(const char *name, const dec_side *d, double triad,
                             double f32_tok_s)
{
    double roof = triad / d->bytes_per_token;
    printf("  %-7s %10.1f %12.2f %10.1f %10.1f %9.1f%% %9.1f%% %8.2f %12.1f %8.1f%%\n",
           name, d->weight_bytes / MiB, d->bytes_per_token / MiB, d->tok_s, roof,
           100 * d->tok_s / roof, 100 * d->paired_median, d->tok_s / f32_tok_s,
           d->median_tok_s, 100 * d->median_tok_s / roof);
}

/* The triad bandwidth in bytes/s: the best of 5 runs. */
static double triad(const config *c)
{
    return zs_measure_triad_gbs(c->threads, (size_t)1 << 28, 5) * 1e9;
}

static void print_peer(const config *c, const zs_gpt_config *g, const dec_side *d,
                       double bw)
{
    if (c->skip_peer) {
        printf("  pytorch: skipped (--skip-peer)\n");
        return;
    }
    const char *why = NULL;
    double pt = run_peer(c, g, &why);
    if (pt <= 0)
        printf("%s\n", why);
    else
        printf("  pytorch f32 (KV cache, batch 1) %.1f tok/s = %.1f%% of the f32 "
               "roofline; zhisuan f32/pytorch = %.2f, q8_0/pytorch = %.2f\n", pt,
               100 * pt * d[0].bytes_per_token / bw, d[0].tok_s / pt, d[1].tok_s / pt);
}

/* Section 2; fills s->decode_f32 and s->decode_q8. The triad runs before
 * and after the decodes; the better figure is the roofline's. */
static zs_status section_decode(zs_module *m, const config *c, summary *s)
{
    const zs_gpt_config *g = zs_gpt_config_of(m);
    int32_t *prompt = malloc((size_t)c->prompt * sizeof *prompt);
    if (!prompt)
        return zs_set_error_code(ZS_ERR_NOMEM, "out of memory");
    uint64_t rng = SEED;
    random_tokens(&rng, prompt, c->prompt, g->vocab);
    const zs_quant qs[N_DEC] = {ZS_QUANT_NONE, ZS_QUANT_Q8_0, ZS_QUANT_Q4_0};
    const char *names[N_DEC] = {"f32", "q8_0", "q4_0"};
    dec_side d[N_DEC] = {{0}};
    zs_status st = ZS_OK;
    for (int i = 0; st == ZS_OK && i < N_DEC; i++)
        st = dec_side_init(&d[i], m, qs[i], c);
    double bw0 = triad(c), bw_rounds = 0;
    if (st == ZS_OK)
        st = bench_decode(d, N_DEC, c, prompt, &bw_rounds);
    double bw1 = triad(c), bw = fmax(fmax(bw0, bw1), bw_rounds);
    for (int i = 0; i < N_DEC; i++)
        dec_side_free(&d[i]);
    free(prompt);
    if (st != ZS_OK)
        return st;
    printf("\ndecode, batch 1: prompt %lld random tokens, %lld new greedy tokens; "
           "tokens 2..%lld over the time from the first token to the last, best of "
           "%lld runs (interleaved); triad %.1f GB/s (best of %.1f before, %.1f "
           "after and %.1f in the rounds, %d threads); bytes/token = weights + f32 KV "
           "at the mean context %.0f; paired = median over the rounds of a run's "
           "bytes/s over the triad measured just before it\n", (long long)c->prompt,
           (long long)c->new_tokens, (long long)c->new_tokens, (long long)c->reps,
           bw / 1e9, bw0 / 1e9, bw1 / 1e9, bw_rounds / 1e9, c->threads,
           (double)c->prompt + (double)c->new_tokens / 2);
    printf("  %-7s %10s %12s %10s %10s %10s %10s %8s %12s %9s\n", "quant", "weights MiB",
           "bytes/tok MiB", "tok/s", "roofline", "of roof", "paired", "vs f32",
           "median step", "of roof");
    for (int i = 0; i < N_DEC; i++)
        print_decode_row(names[i], &d[i], bw, d[0].tok_s);
    s->decode_f32 = d[0].tok_s, s->decode_q8 = d[1].tok_s;
    print_peer(c, g, d, bw);
    return ZS_OK;
}

/* ---- 3. batched decode ------------------------------------------------------- */

/* Per-sequence progress of a batched run. */
typedef struct batch_run {
    int64_t n, started, finished, step_tokens;
    int64_t *n_out; /* [n] */
} batch_run;

static void on_batch_token(void *ctx, const zs_token_event *ev)
{
    batch_run *b = ctx;
    int64_t i = (int64_t)(intptr_t)ev->user;
    if (ev->token >= 0) {
        b->started += b->n_out[i]++ == 0;
        b->step_tokens++;
    }
    b->finished += ev->finish != ZS_FINISH_NONE;
}

typedef struct agg_result {
    double full_tok_s, all_tok_s;
    int64_t full_steps;
} agg_result;

/* Adds n requests with random prompts to e. */
static zs_status add_batch(zs_engine *e, int64_t n, const config *c, int64_t vocab)
{
    int32_t *prompt = malloc((size_t)c->prompt * sizeof *prompt);
    zs_status st = prompt ? ZS_OK : zs_set_error_code(ZS_ERR_NOMEM, "out of memory");
    uint64_t rng = SEED + (uint64_t)n;
    for (int64_t i = 0; st == ZS_OK && i < n; i++) {
        random_tokens(&rng, prompt, c->prompt, vocab);
        zs_gen_request q = {.prompt = prompt, .n_prompt = c->prompt,
                            .max_tokens = c->new_tokens, .sampling = {.top_p = 1},
                            .ignore_eos = true, .user = (void *)(intptr_t)i};
        st = zs_engine_add(e, &q, NULL);
    }
    free(prompt);
    return st;
}

/* n sequences added at once, stepped to the end. A full-batch step (every
 * sequence past its first token, none finished when it starts) emits n
 * tokens: full_tok_s = n / the median of those steps' times (the median
 * shrugs off the shared machine's stalls). */
static zs_status run_batch(const zs_llm *llm, zs_dtype kv, int64_t n, const config *c,
                           agg_result *r)
{
    const zs_gpt_config *g = zs_llm_config(llm);
    int64_t per_seq = cdiv(c->prompt + c->new_tokens, BLOCK);
    zs_engine_config ec = {.max_num_seqs = n, .max_batched_tokens = BATCH_BUDGET,
                           .kv_blocks = imax(n * per_seq, cdiv(g->ctx, BLOCK) + 1),
                           .no_prefix_cache = true, .kv_dtype = kv};
    zs_engine *e = zs_engine_new(llm, NULL, &ec);
    batch_run b = {.n = n, .n_out = calloc((size_t)n, sizeof(int64_t))};
    double *step_s = malloc((size_t)(c->new_tokens + 1) * sizeof *step_s);
    zs_status st = !e ? ZS_ERR_ARG
                   : !b.n_out || !step_s ? zs_set_error_code(ZS_ERR_NOMEM, "out of memory")
                                         : add_batch(e, n, c, g->vocab);
    int64_t all_tok = 0;
    double t0 = now();
    *r = (agg_result){0};
    while (st == ZS_OK && zs_engine_busy(e)) {
        bool full = b.started == n && b.finished == 0 && r->full_steps < c->new_tokens;
        double ts = now();
        b.step_tokens = 0;
        st = zs_engine_step(e, on_batch_token, &b);
        if (full)
            step_s[r->full_steps++] = now() - ts;
        all_tok += b.step_tokens;
    }
    r->all_tok_s = (double)all_tok / (now() - t0);
    r->full_tok_s = (double)n / percentile(step_s, r->full_steps, 0.5);
    free(step_s), free(b.n_out);
    zs_engine_free(e);
    return st;
}

static zs_status section_batched(zs_module *m, const config *c)
{
    enum { SIDES = 3 }; /* f32, q8_0, q8_0 with a bf16 KV cache */
    const zs_quant qs[SIDES] = {ZS_QUANT_NONE, ZS_QUANT_Q8_0, ZS_QUANT_Q8_0};
    const zs_dtype kvs[SIDES] = {ZS_F32, ZS_F32, ZS_BF16};
    agg_result r[SIDES][N_BATCHES];
    zs_llm *llm = NULL;
    for (int q = 0; q < SIDES; q++) {
        if (q == 0 || qs[q] != qs[q - 1]) {
            zs_llm_free(llm);
            if (!(llm = make_llm(m, qs[q])))
                return ZS_ERR_ARG;
        }
        zs_status st = ZS_OK;
        for (int64_t i = 0; st == ZS_OK && i < c->n_batches; i++)
            st = run_batch(llm, kvs[q], c->batches[i], c, &r[q][i]);
        if (st != ZS_OK) {
            zs_llm_free(llm);
            return st;
        }
    }
    zs_llm_free(llm);
    printf("\naggregate decode, sequences added at once (prompt %lld, %lld new tokens "
           "each, max_batched_tokens %d); tok/s: \"full batch\" = sequences / median "
           "time of the steps with every sequence decoding, \"overall\" = all output "
           "tokens / wall time with the prefills; +bf16kv: the KV cache in bf16\n",
           (long long)c->prompt, (long long)c->new_tokens, BATCH_BUDGET);
    printf("  %5s %14s %15s %15s %12s %12s %13s %9s\n", "seqs", "f32 full batch",
           "q8_0 full batch", "+bf16kv full", "f32 overall", "q8_0 overall",
           "+bf16kv all", "f32 steps");
    for (int64_t i = 0; i < c->n_batches; i++)
        printf("  %5lld %14.1f %15.1f %15.1f %12.1f %12.1f %13.1f %9lld\n",
               (long long)c->batches[i], r[0][i].full_tok_s, r[1][i].full_tok_s,
               r[2][i].full_tok_s, r[0][i].all_tok_s, r[1][i].all_tok_s, r[2][i].all_tok_s,
               (long long)r[0][i].full_steps);
    return ZS_OK;
}

/* ---- 4. the trace: continuous against static batching ------------------------ */

typedef struct trace_req {
    double arrival;             /* seconds from the start */
    int64_t n_prompt, max_tokens;
    int32_t *prompt;            /* owned */
    /* outcome of one run */
    double first, last;         /* token event times, seconds from the start */
    int64_t n_out;
} trace_req;

typedef struct trace {
    trace_req *r;
    int64_t n;
} trace;

static void trace_free(trace *t)
{
    for (int64_t i = 0; t->r && i < t->n; i++)
        free(t->r[i].prompt);
    free(t->r);
    *t = (trace){0};
}

/* Poisson arrivals at c->rate, prompt and output lengths uniform, random
 * prompts; a request never exceeds the context ctx. */
static zs_status trace_make(const config *c, int64_t vocab, int64_t ctx, trace *t)
{
    uint64_t rng = SEED;
    double at = 0;
    t->n = c->requests;
    if (!(t->r = calloc((size_t)t->n, sizeof *t->r)))
        return zs_set_error_code(ZS_ERR_NOMEM, "out of memory");
    for (int64_t i = 0; i < t->n; i++) {
        trace_req *q = &t->r[i];
        at += -log(1 - next_unit(&rng)) / c->rate;
        q->arrival = at;
        q->n_prompt = imin(next_range(&rng, c->prompt_min, c->prompt_max), ctx - 1);
        q->max_tokens = imin(next_range(&rng, c->out_min, c->out_max), ctx - q->n_prompt);
        if (!(q->prompt = malloc((size_t)q->n_prompt * sizeof *q->prompt)))
            return zs_set_error_code(ZS_ERR_NOMEM, "out of memory");
        random_tokens(&rng, q->prompt, q->n_prompt, vocab);
    }
    return ZS_OK;
}

/* What one run of the trace measured. */
typedef struct trace_result {
    double seconds, tok_s;
    double ttft_p50, ttft_p99, tpot_p50, tpot_p99;
    int64_t tokens, steps, preemptions;
    int64_t prompt_rows, padding_rows; /* prefill rows computed, and padding */
    /* KV, sampled after every step */
    double peak_used, peak_ctx_reserve, peak_req_reserve, peak_tokens;
    double waste_sum, waste_max;
    int64_t waste_steps, peak_running;
    int64_t max_step, max_running, max_tokens; /* where the waste peaked */
} trace_result;

typedef struct trace_run {
    double t0;
    int64_t done, running;     /* requests finished; with a token, not finished */
    double reserve;            /* sum of prompt + max_tokens of the running */
} trace_run;

static void on_trace_token(void *ctx, const zs_token_event *ev)
{
    trace_run *run = ctx;
    trace_req *q = ev->user;
    double t = now() - run->t0;
    if (ev->token >= 0) {
        if (q->n_out++ == 0) {
            q->first = t;
            run->running++;
            run->reserve += (double)(q->n_prompt + q->max_tokens);
        }
        q->last = t;
    }
    if (ev->finish != ZS_FINISH_NONE) {
        run->done++;
        run->running--;
        run->reserve -= (double)(q->n_prompt + q->max_tokens);
    }
}

static void sample_kv(const zs_engine *e, const trace_run *run, double tok_bytes,
                      int64_t ctx, trace_result *r)
{
    zs_engine_stats st;
    zs_engine_get_stats(e, &st);
    double used = (double)st.kv.used_bytes;
    r->peak_used = fmax(r->peak_used, used);
    r->peak_running = imax(r->peak_running, st.running);
    r->peak_ctx_reserve = fmax(r->peak_ctx_reserve, (double)(st.running * ctx) * tok_bytes);
    r->peak_req_reserve = fmax(r->peak_req_reserve, run->reserve * tok_bytes);
    r->peak_tokens = fmax(r->peak_tokens, used - (double)st.kv.wasted_bytes);
    r->preemptions = st.preemptions;
    r->prompt_rows = st.computed_prompt_tokens, r->padding_rows = st.padding_rows;
    if (used > 0) {
        double w = (double)st.kv.wasted_bytes / used;
        if (w > r->waste_max) {
            r->waste_max = w, r->max_step = r->steps, r->max_running = st.running;
            r->max_tokens = (int64_t)((used - (double)st.kv.wasted_bytes) / tok_bytes);
        }
        r->waste_sum += w;
        r->waste_steps++;
    }
}

/* Throughput and latency percentiles from the requests' outcomes. */
static zs_status trace_latencies(const trace *t, trace_result *r)
{
    double *ttft = malloc((size_t)t->n * sizeof *ttft);
    double *tpot = malloc((size_t)t->n * sizeof *tpot);
    if (!ttft || !tpot) {
        free(ttft), free(tpot);
        return zs_set_error_code(ZS_ERR_NOMEM, "out of memory");
    }
    int64_t n_tpot = 0;
    r->tokens = 0, r->seconds = 0;
    for (int64_t i = 0; i < t->n; i++) {
        const trace_req *q = &t->r[i];
        ttft[i] = q->first - q->arrival;
        if (q->n_out > 1)
            tpot[n_tpot++] = (q->last - q->first) / (double)(q->n_out - 1);
        r->tokens += q->n_out;
        r->seconds = fmax(r->seconds, q->last);
    }
    r->tok_s = (double)r->tokens / r->seconds;
    r->ttft_p50 = percentile(ttft, t->n, 0.5), r->ttft_p99 = percentile(ttft, t->n, 0.99);
    r->tpot_p50 = percentile(tpot, n_tpot, 0.5);
    r->tpot_p99 = percentile(tpot, n_tpot, 0.99);
    free(ttft), free(tpot);
    return ZS_OK;
}

static void sleep_until(double t)
{
    double d = t - now();
    if (d <= 0)
        return;
    struct timespec ts = {(time_t)d, (long)((d - floor(d)) * 1e9)};
    nanosleep(&ts, NULL);
}

/* Drives the trace through an engine: requests join when the wall clock
 * passes their arrival, the engine steps while it has work. */
static zs_status trace_drive(zs_engine *e, trace *t, double tok_bytes, int64_t ctx,
                             trace_result *r)
{
    trace_run run = {.t0 = now()};
    int64_t next = 0;
    zs_status st = ZS_OK;
    while (st == ZS_OK && run.done < t->n) {
        double at = now() - run.t0;
        for (; st == ZS_OK && next < t->n && t->r[next].arrival <= at; next++) {
            trace_req *q = &t->r[next];
            zs_gen_request g = {.prompt = q->prompt, .n_prompt = q->n_prompt,
                                .max_tokens = q->max_tokens, .sampling = {.top_p = 1},
                                .ignore_eos = true, .user = q};
            st = zs_engine_add(e, &g, NULL);
        }
        if (st != ZS_OK)
            break;
        if (!zs_engine_busy(e)) {
            if (next == t->n)
                return zs_set_error("trace: the engine is idle with %lld requests "
                                    "unfinished", (long long)(t->n - run.done));
            sleep_until(run.t0 + t->r[next].arrival);
            continue;
        }
        st = zs_engine_step(e, on_trace_token, &run);
        r->steps++;
        sample_kv(e, &run, tok_bytes, ctx, r);
    }
    return st;
}

/* One run of the trace in one mode. The pool holds every slot at the
 * longest prompt + the longest output: a static batch pads its finished
 * members to its longest, so none is ever preempted. */
static zs_status trace_run_mode(const zs_llm *llm, trace *t, const config *c,
                                bool static_batching, trace_result *r)
{
    const zs_gpt_config *g = zs_llm_config(llm);
    int64_t long_prompt = 0, long_out = 0;
    for (int64_t i = 0; i < t->n; i++) {
        t->r[i].n_out = 0;
        t->r[i].first = t->r[i].last = 0;
        long_prompt = imax(long_prompt, t->r[i].n_prompt);
        long_out = imax(long_out, t->r[i].max_tokens);
    }
    int64_t per_seq = cdiv(imin(long_prompt + long_out, g->ctx), BLOCK);
    zs_engine_config ec = {
        .max_num_seqs = c->trace_seqs,
        .max_batched_tokens = c->trace_seqs * c->prompt_max,
        .kv_blocks = imax(c->trace_seqs * per_seq, cdiv(g->ctx, BLOCK) + 1),
        .static_batching = static_batching};
    zs_engine *e = zs_engine_new(llm, NULL, &ec);
    if (!e)
        return ZS_ERR_ARG;
    *r = (trace_result){0};
    zs_status st = trace_drive(e, t, kv_token_bytes(g), g->ctx, r);
    zs_engine_free(e);
    return st == ZS_OK ? trace_latencies(t, r) : st;
}

static void print_trace_row(const char *name, const trace_result *r)
{
    printf("  %-10s %8.2f %8lld %10.1f %9.3f %9.3f %8.2f %8.2f %7lld %5lld\n", name,
           r->seconds, (long long)r->tokens, r->tok_s, r->ttft_p50, r->ttft_p99,
           1e3 * r->tpot_p50, 1e3 * r->tpot_p99, (long long)r->steps,
           (long long)r->preemptions);
}

static void print_kv(const trace_result *r, const zs_gpt_config *g)
{
    double tb = kv_token_bytes(g);
    printf("\nKV memory, continuous run, sampled after each of its %lld steps (f32 KV: "
           "%.0f bytes per token position; block %d tokens):\n", (long long)r->steps,
           tb, BLOCK);
    printf("  contiguous, model context (%lld) per running sequence, peak %lld "
           "running: %9.1f MiB\n", (long long)g->ctx, (long long)r->peak_running,
           r->peak_ctx_reserve / MiB);
    printf("  contiguous, prompt + max_tokens per running request, peak sum:   "
           "%9.1f MiB\n", r->peak_req_reserve / MiB);
    printf("  paged pool, peak used blocks:                                    "
           "%9.1f MiB (peak tokens held %.1f MiB)\n", r->peak_used / MiB,
           r->peak_tokens / MiB);
    printf("  reserved / paged peak: %.2fx (context), %.2fx (prompt + max_tokens)\n",
           r->peak_ctx_reserve / r->peak_used, r->peak_req_reserve / r->peak_used);
    printf("  paged waste (unfilled slots of used blocks / used bytes) over %lld "
           "steps: mean %.2f%%, max %.2f%% (step %lld: %lld running, %lld tokens "
           "held)\n", (long long)r->waste_steps,
           100 * r->waste_sum / (double)r->waste_steps, 100 * r->waste_max,
           (long long)r->max_step, (long long)r->max_running, (long long)r->max_tokens);
}

/* Sections 4 and 5. */
static zs_status section_trace(const config *c, summary *s)
{
    zs_gpt_config g = {.arch = ZS_GPT2};
    if (zs_gpt_preset(c->trace_preset, &g) != 0)
        return zs_set_error("unknown trace preset '%s'", c->trace_preset);
    g.vocab = c->trace_vocab, g.ctx = c->trace_ctx;
    zs_module *m = zs_gpt_new(&g, SEED);
    zs_llm *llm = m ? make_llm(m, ZS_QUANT_NONE) : NULL;
    zs_module_free(m);
    trace t = {0};
    zs_status st = llm ? trace_make(c, g.vocab, g.ctx, &t) : ZS_ERR_ARG;
    trace_result cont = {0}, stat = {0};
    if (st == ZS_OK)
        st = trace_run_mode(llm, &t, c, false, &cont);
    if (st == ZS_OK)
        st = trace_run_mode(llm, &t, c, true, &stat);
    double span = t.n ? t.r[t.n - 1].arrival : 0;
    trace_free(&t);
    zs_llm_free(llm);
    if (st != ZS_OK)
        return st;
    printf("\ntrace: %lld requests, Poisson arrivals at %g/s (the last at %.2f s; "
           "offered %.0f output tok/s), prompts %lld..%lld, outputs %lld..%lld tokens "
           "(uniform, ignore_eos), seed "
           "%d; model %s (%lld layers, width %lld) with context %lld, vocab %lld, f32, "
           "%lld parameters; max_num_seqs %lld, max_batched_tokens %lld\n",
           (long long)c->requests, c->rate, span,
           c->rate * (double)(c->out_min + c->out_max) / 2, (long long)c->prompt_min,
           (long long)c->prompt_max, (long long)c->out_min, (long long)c->out_max, SEED,
           c->trace_preset, (long long)g.layers, (long long)g.width, (long long)g.ctx,
           (long long)g.vocab, (long long)zs_gpt_param_count(&g),
           (long long)c->trace_seqs, (long long)(c->trace_seqs * c->prompt_max));
    printf("  %-10s %8s %8s %10s %9s %9s %8s %8s %7s %5s\n", "mode", "seconds",
           "tokens", "tok/s", "TTFT p50", "TTFT p99", "TPOT p50", "TPOT p99", "steps",
           "preem");
    printf("  %-10s %8s %8s %10s %9s %9s %8s %8s\n", "", "", "", "", "s", "s", "ms", "ms");
    print_trace_row("continuous", &cont);
    print_trace_row("static", &stat);
    printf("  continuous/static: throughput %.2f, TTFT p50 %.2f, TPOT p50 %.2f\n",
           cont.tok_s / stat.tok_s, cont.ttft_p50 / stat.ttft_p50,
           cont.tpot_p50 / stat.tpot_p50);
    printf("  prompt rows computed: continuous %lld, static %lld + %lld padding (prompts "
           "padded to their batch's longest)\n", (long long)cont.prompt_rows,
           (long long)stat.prompt_rows, (long long)stat.padding_rows);
    print_kv(&cont, &g);
    s->cont_tput = cont.tok_s, s->static_tput = stat.tok_s;
    s->waste_mean = 100 * cont.waste_sum / (double)cont.waste_steps;
    return ZS_OK;
}

/* ---- 6. validation loss per quantization --------------------------------------- */

/* Mean cross-entropy (nats) of llm over the windows of the val split. */
static zs_status val_loss(const zs_llm *llm, const zs_tokens *val, int64_t windows,
                          double *loss)
{
    const zs_gpt_config *g = zs_llm_config(llm);
    int64_t T = g->ctx, V = g->vocab, span = val->n - (T + 1);
    int32_t *tok = malloc((size_t)(T + 1) * sizeof *tok);
    float *logits = malloc((size_t)(T * V) * sizeof *logits);
    zs_status st = tok && logits ? ZS_OK
                                 : zs_set_error_code(ZS_ERR_NOMEM, "out of memory");
    double sum = 0;
    for (int64_t w = 0; st == ZS_OK && w < windows; w++) {
        int64_t start = windows > 1 ? w * span / (windows - 1) : 0;
        for (int64_t i = 0; i <= T; i++)
            tok[i] = zs_tokens_at(val, start + i);
        st = zs_llm_logits(llm, tok, T, logits);
        for (int64_t t = 0; st == ZS_OK && t < T; t++) {
            const float *row = logits + t * V;
            double mx = -INFINITY, z = 0;
            for (int64_t v = 0; v < V; v++)
                mx = fmax(mx, row[v]);
            for (int64_t v = 0; v < V; v++)
                z += exp((double)row[v] - mx);
            sum += mx + log(z) - (double)row[tok[t + 1]];
        }
    }
    *loss = sum / (double)(windows * T);
    free(tok), free(logits);
    return st;
}

/* The directory of a checkpoint path (a directory or a file in one). */
static void ckpt_dir(const char *path, char *dir, size_t n)
{
    struct stat sb;
    snprintf(dir, n, "%s", path);
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode))
        return;
    char *slash = strrchr(dir, '/');
    if (slash)
        *slash = '\0';
    else
        snprintf(dir, n, ".");
}

static zs_status section_val(zs_module *m, const config *c)
{
    if (!c->ckpt) {
        printf("\nval loss: needs --ckpt DIR of a zs train gpt run\n");
        return ZS_OK;
    }
    const zs_gpt_config *g = zs_gpt_config_of(m);
    char dir[4200];
    ckpt_dir(c->ckpt, dir, sizeof dir);
    zs_text_corpus corpus;
    if (zs_text_corpus_open(dir, g->ctx + 1, &corpus) != ZS_OK)
        return ZS_ERR_IO;
    int64_t n_cal = imin(c->calib_tokens, corpus.train.n);
    int32_t *cal = malloc((size_t)n_cal * sizeof *cal);
    if (!cal) {
        zs_text_corpus_close(&corpus);
        return zs_set_error_code(ZS_ERR_NOMEM, "out of memory");
    }
    for (int64_t i = 0; i < n_cal; i++)
        cal[i] = zs_tokens_at(&corpus.train, i);
    printf("\nval loss: %lld windows of %lld tokens evenly over the validation split "
           "(%lld tokens) of %s; w8a8 calibrated on the first %lld training tokens\n",
           (long long)c->val_windows, (long long)g->ctx, (long long)corpus.val.n, dir,
           (long long)n_cal);
    printf("  %-6s %10s %9s %10s %8s\n", "quant", "loss", "vs f32", "weights MiB",
           "seconds");
    const zs_quant qs[6] = {ZS_QUANT_NONE, ZS_QUANT_Q8_0, ZS_QUANT_Q4_0, ZS_QUANT_Q4_1,
                            ZS_QUANT_INT8, ZS_QUANT_W8A8};
    double f32 = NAN;
    zs_status st = ZS_OK;
    for (int i = 0; st == ZS_OK && i < 6; i++) {
        zs_llm_options o = {.quant = qs[i], .calib = cal, .n_calib = n_cal};
        zs_llm *llm = zs_llm_from_gpt(m, &o);
        double loss = 0, t0 = now();
        st = llm ? val_loss(llm, &corpus.val, c->val_windows, &loss) : ZS_ERR_ARG;
        if (st == ZS_OK) {
            f32 = i == 0 ? loss : f32;
            printf("  %-6s %10.4f %9.5f %10.1f %8.1f\n", i ? zs_quant_name(qs[i]) : "f32",
                   loss, loss / f32, (double)zs_llm_weight_bytes(llm) / MiB, now() - t0);
        }
        zs_llm_free(llm);
    }
    free(cal);
    zs_text_corpus_close(&corpus);
    return st;
}

/* ---- main ------------------------------------------------------------------------ */

static void print_model(const config *c, const zs_gpt_config *g)
{
    printf("model: %s, %lld layers, width %lld, %lld heads, context %lld, vocab %lld, "
           "%lld parameters (%s); %d threads%s\n", c->ckpt ? c->ckpt : c->preset,
           (long long)g->layers, (long long)g->width, (long long)g->heads,
           (long long)g->ctx, (long long)g->vocab, (long long)zs_gpt_param_count(g),
           c->ckpt ? "checkpoint" : "random weights", c->threads,
           c->quick ? "; --quick" : "");
}

static bool wanted(const config *c, const char *section)
{
    return !c->only || !strcmp(c->only, section);
}

static void print_summary(const summary *s)
{
    printf("\ninfer decode q8/f32 = %.3f\n", s->decode_q8 / s->decode_f32);
    printf("infer continuous/static throughput = %.3f\n", s->cont_tput / s->static_tput);
    printf("infer kv waste paged = %.2f%%\n", s->waste_mean);
}

int main(int argc, char **argv)
{
    config c;
    if (parse_args(argc, argv, &c) != 0)
        return 2;
    setvbuf(stdout, NULL, _IOLBF, 0); /* progress shows when redirected */
    zs_set_num_threads(c.threads);
    static const char *const fam[] = {"gemm f32", "packed linear", "quantized matmul",
                                      "int8 / w8a8", "paged attention", "attention"};
    isa_cap_header(stdout, fam, 6, "PyTorch");
    zs_model_file file;
    zs_module *m = open_model(&c, &file);
    zs_status st = m ? ZS_OK : ZS_ERR_ARG;
    summary s = {NAN, NAN, NAN, NAN, NAN};
    if (st == ZS_OK) {
        /* a short context (preset tiny) shortens the prompt and output */
        int64_t ctx = zs_gpt_config_of(m)->ctx;
        c.prompt = imin(c.prompt, ctx / 2);
        c.new_tokens = imin(c.new_tokens, ctx - c.prompt);
        print_model(&c, zs_gpt_config_of(m));
    }
    if (st == ZS_OK && wanted(&c, "decode"))
        st = section_decode(m, &c, &s);
    if (st == ZS_OK && wanted(&c, "batch"))
        st = section_batched(m, &c);
    if (st == ZS_OK && wanted(&c, "trace"))
        st = section_trace(&c, &s);
    if (st == ZS_OK && wanted(&c, "val"))
        st = section_val(m, &c);
    if (st != ZS_OK)
        fprintf(stderr, "infer: %s\n", zs_last_error());
    if (c.ckpt)
        zs_model_close(&file);
    else
        zs_module_free(m);
    if (st != ZS_OK)
        return 1;
    print_summary(&s);
    return 0;
}
