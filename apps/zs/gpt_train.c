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
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "apps/zs/commands.h"
#include "apps/zs/common.h"

typedef struct gpt_cfg {
    const char *preset, *data, *out;
    zs_gpt_arch arch;
    int64_t vocab, batch, seq, steps, warmup, accum, eval_every, eval_batches, stop_after;
    double lr, min_lr, wd, clip, minutes;
    uint64_t seed;
    int threads, zero, dp;
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
            "                    backward); 0 = plain data parallel\n");
}

static int num(const char *flag, const char *s, double lo, double hi, double *out)
{
    char *end;
    double v = strtod(s, &end);
    if (*s == '\0' || *end != '\0' || !(v >= lo && v <= hi)) {
        fprintf(stderr, "zs train gpt: %s wants a number in [%g, %g], got '%s'\n",
                flag, lo, hi, s);
        return -1;
    }
    *out = v;
    return 0;
}

static int parse(int argc, char **argv, gpt_cfg *c)
{
    *c = (gpt_cfg){"small", NULL, "runs/gpt", ZS_GPT2, 4096, 8, 0, 2000, 100,
                   1, 100, 20, 0, 1e-3, 1e-4, 0.1, 1.0, 0, 1, 0, 0, 0, 8, 300,
                   ZS_ALLREDUCE_RING, false};
    for (int i = 2; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        double x;
        if (!strcmp(f, "--help")) {
            usage(stdout);
            return 1;
        }
        if (!strcmp(f, "--resume")) {
            c->resume = true;
            continue;
        }
        if (!v) {
            fprintf(stderr, "zs train gpt: unknown flag or missing value: '%s'\n", f);
            return -1;
        }
        i++;
#define NUM(name, lo, hi, field, type)                                        \
    else if (!strcmp(f, name)) { if (num(f, v, lo, hi, &x)) return -1; c->field = (type)x; }
        if (!strcmp(f, "--preset")) c->preset = v;
        else if (!strcmp(f, "--data")) c->data = v;
        else if (!strcmp(f, "--out")) c->out = v;
        else if (!strcmp(f, "--allreduce")) {
            if (!strcmp(v, "ring")) c->algo = ZS_ALLREDUCE_RING;
            else if (!strcmp(v, "mpi")) c->algo = ZS_ALLREDUCE_MPI;
            else {
                fprintf(stderr, "zs train gpt: --allreduce must be ring or mpi, got '%s'\n", v);
                return -1;
            }
        }
        else if (!strcmp(f, "--arch")) {
            if (!strcmp(v, "gpt2")) c->arch = ZS_GPT2;
            else if (!strcmp(v, "bloom")) c->arch = ZS_BLOOM;
            else {
                fprintf(stderr, "zs train gpt: --arch must be gpt2 or bloom, got '%s'\n", v);
                return -1;
            }
        }
        NUM("--vocab", 257, 65536, vocab, int64_t)
        NUM("--batch", 1, 4096, batch, int64_t)
        NUM("--seq", 1, 1 << 20, seq, int64_t)
        NUM("--accum", 1, 1024, accum, int64_t)
        NUM("--steps", 1, 1e9, steps, int64_t)
        NUM("--minutes", 0, 1e6, minutes, double)
        NUM("--stop-after", 1, 1e9, stop_after, int64_t)
        NUM("--lr", 0, 10, lr, double)
        NUM("--warmup", 0, 1e9, warmup, int64_t)
        NUM("--wd", 0, 10, wd, double)
        NUM("--clip", 0, 1e9, clip, double)
        NUM("--eval-every", 1, 1e9, eval_every, int64_t)
        NUM("--seed", 0, 1e18, seed, uint64_t)
        NUM("--threads", 1, 256, threads, int)
        NUM("--zero", 0, 3, zero, int)
        NUM("--dp", 1, 1 << 20, dp, int)
        NUM("--bucket-mb", 0, 1 << 20, bucket_mb, double)
        NUM("--comm-timeout", 0, 1e7, comm_timeout, double)
        else {
            fprintf(stderr, "zs train gpt: unknown flag '%s' (see zs train gpt --help)\n", f);
            return -1;
        }
#undef NUM
    }
    c->min_lr = c->lr / 10;
    return 0;
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
    zs_optim_config oc;
} run_state;

/* Optimizer state (and, for stage 2, gradient) bytes per rank. */
static void report_zero(const gpt_cfg *c, run_state *s, int P)
{
    int n;
    zs_zero_shards(s->z, &n);
    double opt = 0, full = 8.0 * (double)zs_numel(s->fp);
    for (int i = 0; i < n; i++)
        for (int w = 0; w < 2; w++)
            opt += (double)zs_nbytes(zs_optim_moment(s->o, w, i));
    zs_zero_memory zm;
    zs_zero_get_memory(s->z, &zm);
    fprintf(stderr, "ZeRO-%d over %d ranks, per rank: parameters %.1f MiB, gradients "
            "%.1f MiB%s, optimizer state %.1f MiB (plain data parallel: gradients %.1f, "
            "optimizer %.1f MiB)\n", c->zero, P, (double)zm.params / 1048576,
            (double)zm.grad_shard / 1048576,
            c->zero == 2 ? " (shard; + the buckets in flight)" : "", opt / 1048576,
            (double)zm.params / 1048576, full / 1048576);
}

static void run_free(run_state *s)
{
    zs_zero_free(s->z);
    zs_dp_free(s->dp);
    if (s->metrics)
        fclose(s->metrics);
    zs_optim_free(s->o);
    zs_module_free(s->m);
    zs_tokens_close(&s->all);
    zs_bpe_free(s->bpe);
}

/* Tokenizer and token file: reused from the output directory when present. */
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
        char *text = zs_app_read_corpus(c->data, &n);
        if (!text)
            return 2;
        double t0 = zs_app_now();
        s->bpe = zs_bpe_train(text, n, (int32_t)c->vocab);
        double t1 = zs_app_now();
        int32_t *ids = NULL;
        size_t nid = 0;
        if (!s->bpe || zs_bpe_encode(s->bpe, text, n, 0, &ids, &nid) != ZS_OK) {
            free(text);
            return 2;
        }
        fprintf(stderr, "corpus %zu bytes: BPE vocabulary %d trained in %.1f s, "
                "%zu tokens encoded in %.2f s (%.2f bytes/token)\n", n,
                zs_bpe_vocab_size(s->bpe), t1 - t0, nid, zs_app_now() - t1,
                (double)n / (double)(nid ? nid : 1));
        free(text);
        zs_status st = zs_bpe_save(s->bpe, tpath);
        if (st == ZS_OK)
            st = zs_tokens_write(kpath, ids, (int64_t)nid, zs_bpe_vocab_size(s->bpe));
        free(ids);
        if (st != ZS_OK || zs_tokens_open(kpath, &s->all) != ZS_OK)
            return 2;
    }
    if (zs_tokens_split(&s->all, 0.1, &s->train, &s->val) != ZS_OK)
        return 2;
    if (s->val.n < c->seq + 1 || s->train.n < c->seq + 1) {
        zs_set_error("corpus too small: %lld train / %lld validation tokens for "
                     "sequences of %lld", (long long)s->train.n,
                     (long long)s->val.n, (long long)c->seq);
        return 2;
    }
    return 0;
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
    fprintf(stderr, "gpt %s (%s): %lld layers, width %lld, %lld heads, context %lld, "
            "vocab %lld: %lld parameters (formula: %lld)\n", c->preset,
            c->arch == ZS_BLOOM ? "bloom" : "gpt2", (long long)gc.layers,
            (long long)gc.width, (long long)gc.heads, (long long)gc.ctx,
            (long long)gc.vocab, (long long)counted, (long long)formula);
    if (counted != formula) {
        zs_set_error("parameter count %lld differs from the formula %lld",
                     (long long)counted, (long long)formula);
        return 1;
    }
    bool z2 = c->zero == 2;
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
    if (c->zero > 0 &&
        !(s->z = zs_zero_new(zs_comm_world(), c->zero, bucket_bytes, np, ps, s->fp, s->fg)))
        st = ZS_ERR_STATE;
    if (st == ZS_OK && !z2) {
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
    if (!(s->o = zs_optim_new(&oc, n_opt, opt_params)))
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
    zs_status st = o ? zs_checkpoint_load(path, s->m, o, &meta) : ZS_ERR_NOMEM;
    if (st == ZS_OK && s->z)
        st = zero_state(s, o, false);
    if (s->z)
        zs_optim_free(o);
    if (st != ZS_OK)
        return 2;
    s->step0 = zs_app_meta_int(meta, "step", 0);
    zs_optim_set_steps(s->o, s->step0);
    bool same = zs_app_meta_int(meta, "vocab", -1) == zs_bpe_vocab_size(s->bpe);
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
        st = zs_checkpoint_save(path, s->m, o, meta);
    }
    if (s->z && lead)
        zs_optim_free(o);
    return st == ZS_OK ? 0 : 1;
}

/* Rows [rank*B/P, (rank+1)*B/P) of a [B, T] batch: under data
 * parallelism every rank draws the same global batch and trains on its
 * share, so P ranks see exactly what one process would. */
static void my_rows(zs_tensor **x, zs_tensor **y)
{
    zs_comm *w = zs_comm_world();
    int P = zs_comm_size(w), R = zs_comm_rank(w);
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
        my_rows(&x, &y);
        zs_tensor *loss = zs_gpt_loss(s->m, x, y);
        zs_tensor *scaled = c->accum > 1 ? zs_mul_scalar(loss, 1.0 / (double)c->accum) : loss;
        /* ZeRO-2 reduces every micro-batch into its shard; plain data
         * parallelism the accumulated gradient, during the last backward */
        zs_status st = s->z ? zs_zero_begin(s->z) : ZS_OK;
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
    if (c->clip > 0)
        *gnorm = s->z ? zs_zero_clip_grad_norm(s->z, c->clip)
                      : zs_clip_grad_norm(1, &s->fp, c->clip);
    if (isnan(*gnorm) || zs_optim_step(s->o, zs_lr_at(sched, step)) != ZS_OK)
        return NAN;
    if (s->z) {
        if (zs_zero_gather(s->z) != ZS_OK)
            return NAN;
        zs_zero_zero_grad(s->z);
    } else {
        zs_fill_(s->fg, 0.0);
    }
    return loss_sum / (double)c->accum;
}

int zs_cmd_train_gpt(int argc, char **argv)
{
    gpt_cfg c;
    int p = parse(argc, argv, &c);
    if (p)
        return p > 0 ? 0 : 2;
    if (c.threads > 0)
        zs_set_num_threads(c.threads);
    run_state s = {0};
    int ranks = zs_comm_size(zs_comm_world());
    bool lead = zs_comm_rank(zs_comm_world()) == 0; /* logs and checkpoints */
    if (c.zero > 2) {
        fprintf(stderr, "zs train gpt: --zero %d is not implemented yet (stages 1 and 2 "
                "are)\n", c.zero);
        return 2;
    }
    if (!getenv("ZS_COMM_TIMEOUT")) /* the environment's setting wins */
        zs_comm_set_timeout(zs_comm_world(), c.comm_timeout);
    if (c.dp > 0 && c.dp != ranks) {
        fprintf(stderr, "zs train gpt: --dp %d but the job has %d rank%s (start it with "
                "mpirun -np %d)\n", c.dp, ranks, ranks == 1 ? "" : "s", c.dp);
        return 2;
    }
    if (c.batch % ranks != 0) {
        fprintf(stderr, "zs train gpt: --batch %lld is not divisible by the %d "
                "data-parallel ranks\n", (long long)c.batch, ranks);
        return 2;
    }
    zs_gpt_config probe = {0};
    if (zs_gpt_preset(c.preset, &probe) != 0 || c.seq > probe.ctx) {
        if (c.seq > probe.ctx && probe.ctx > 0)
            zs_set_error("--seq %lld is longer than the %s model's context of %lld",
                         (long long)c.seq, c.preset, (long long)probe.ctx);
        fprintf(stderr, "zs train gpt: %s\n", zs_last_error());
        return 2;
    }
    mkdir("runs", 0755);
    mkdir(c.out, 0755);
    int rc = prepare_data(&c, &s);
    if (!rc)
        rc = build_model(&c, &s);
    if (!rc && c.resume)
        rc = restore(&c, &s);
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
    double peak = zs_measure_peak_gflops(zs_num_threads(), 0.1) * 1e9;
    /* Model FLOPs per token (PaLM appendix B): 6N + 6 L T C for attention
     * (causal half of 12 L T C), N without the position embedding. */
    double n_params = (double)zs_gpt_param_count(g) - (g->arch == ZS_GPT2 ? (double)(g->ctx * g->width) : 0);
    double flops_tok = 6 * n_params + 6.0 * (double)(g->layers * c.seq * g->width);
    zs_lr_schedule sched = {ZS_LR_COSINE, c.lr, c.warmup, c.steps, c.min_lr, 0, 0};
    zs_gpt_history h = {0};
    bool tty = lead && isatty(2);
    double t0 = zs_app_now(), last_val = NAN;
    int64_t tokens_step = c.batch * c.seq * c.accum, step;
    rc = 0;
    for (step = s.step0; step < c.steps; step++) {
        double ts = zs_app_now(), gnorm = 0;
        double loss = train_step(&c, &s, step, &sched, &gnorm);
        if (isnan(loss)) {
            fprintf(stderr, "\nzs train gpt: step %lld failed: %s\n", (long long)step,
                    zs_last_error());
            rc = 1;
            break;
        }
        double dt = zs_app_now() - ts, elapsed = zs_app_now() - t0;
        double tps = (double)tokens_step / dt, mfu = flops_tok * tps / peak;
        int64_t done = step + 1 - s.step0;
        double eta = elapsed / (double)done * (double)(c.steps - step - 1);
        if (c.minutes > 0 && c.minutes * 60 - elapsed < eta)
            eta = c.minutes * 60 - elapsed;
        fprintf(s.metrics, "{\"step\":%lld,\"loss\":%.6f,\"lr\":%.3g,\"grad_norm\":%.4f,"
                "\"tokens_per_s\":%.0f,\"mfu\":%.4f}\n", (long long)step, loss,
                zs_lr_at(&sched, step), gnorm, tps, mfu);
        zs_gpt_history_push(&h, (double)step, loss, NAN);
        if (lead)
            zs_app_progress(tty, step, c.steps, loss, tps, mfu, eta);
        bool last = step + 1 == c.steps || step + 1 == c.stop_after ||
                    (c.minutes > 0 && elapsed >= c.minutes * 60);
        if ((step + 1) % c.eval_every == 0 || last) {
            last_val = validate(s.m, &s.val, &c);
            if (check_replicas(&s) != ZS_OK) {
                fprintf(stderr, "\nzs train gpt: %s\n", zs_last_error());
                rc = 1;
                break;
            }
            if (tty)
                fputc('\n', stderr);
            if (lead)
                fprintf(stderr, "step %lld: train loss %.4f, val loss %.4f nats/token "
                        "(%.0f tokens/s, MFU %.1f%%)\n", (long long)step + 1, loss,
                        last_val, tps, 100 * mfu);
            fprintf(s.metrics, "{\"step\":%lld,\"val_loss\":%.6f}\n", (long long)step,
                    last_val);
            fflush(s.metrics);
            zs_gpt_history_push(&h, (double)step, NAN, last_val);
            if ((lead || s.z) && save(&c, &s, step + 1, last_val)) {
                fprintf(stderr, "zs train gpt: %s\n", zs_last_error());
                rc = 1;
                break;
            }
            snprintf(path, sizeof path, "%s/curves.svg", c.out);
            if (lead)
                zs_gpt_history_plot(&h, path);
        }
        if (last)
            break;
    }
    if (!rc && lead)
        fprintf(stderr, "trained %lld steps in %.1f s; last val loss %.4f; files in %s\n",
                (long long)(step + 1 - s.step0), zs_app_now() - t0, last_val, c.out);
    zs_gpt_history_free(&h);
    run_free(&s);
    return rc;
}
