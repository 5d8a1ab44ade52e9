/*
 * memcomm.c - bench/memcomm: training in less memory and less compute
 * (issue 29): activation recomputation of a GPT and block-sparse attention.
 *
 * Recomputation: GPT "small" (6 layers, width 384, 6 heads, vocab 4096)
 * with its context raised to T = 1024, micro-batch b = 1 (--batch), f32,
 * for none / selective / full (zs_gpt_set_recompute). Columns: the
 * activations kept per layer after the forward (live bytes after the
 * forward of a 6-layer model minus those of a 2-layer one, over 4: the
 * embeddings, final norm and logits cancel), beside Korthikanti et al.'s
 * formula in f32 (twice their 16-bit bytes: 2 (34sbh + 5as^2b) none,
 * 2 * 34sbh selective, 2 * 2sbh full: the block inputs in 16 bits) and
 * src/nn/gpt.c's accounting (17, 16 and 1 sbh elements of 4 bytes); the
 * peak of one forward + backward above the model's state; the best time
 * of forward + backward over --reps steps after a warm-up, and its cost
 * against none.
 *
 * Sparse attention: zs_sparse_attention vs zs_attention (fused dense),
 * causal, f32, B = 1, H = 6, D = 64, forward + backward with a fixed
 * random output gradient, at T = 1024 and 4096 (--long adds 16384), with
 * block 64, local 2, global 1, random 2 (--block/--local/--global/
 * --random). Columns: density (kept blocks / nb^2), pairs ratio (the
 * dense causal pairs over the sparse computed pairs: the ideal speed-up),
 * best times, peaks above the inputs, and the speed-up dense / sparse.
 *
 * Communication: 1-bit Adam against AdamW at 4 ranks on the Bible, run
 * by the sibling program bench/onebit (mpirun; its header says what it
 * measures) with --onebit-args passed on; --skip-onebit leaves it out.
 *
 * The last lines: `memcomm onebit/adam bytes = R` (bytes per step after
 * the freeze over AdamW's; target <= 0.2) and `memcomm sparse/dense time
 * T4096 = R` (dense time over sparse time at T = 4096; target >= 3 at
 * density <= 0.2).
 *
 * Usage: memcomm [--reps N] [--threads N] [--batch N] [--long]
 *                [--skip-recompute] [--skip-sparse] [--skip-onebit]
 *                [--onebit-args "ARGS"] [--block B] [--local L]
 *                [--global G] [--random R]
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "zs/zs.h"

typedef struct opts {
    int reps, threads;
    int64_t batch;
    bool lng, skip_rc, skip_sp, skip_ob;
    const char *ob_args; /* extra arguments of bench/onebit */
    zs_sparse_params sp;
} opts;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static size_t live(void)
{
    zs_alloc_stats st;
    zs_alloc_get_stats(&st);
    return st.current_bytes;
}

static size_t peak(void)
{
    zs_alloc_stats st;
    zs_alloc_get_stats(&st);
    return st.peak_bytes;
}

static double mib(double b) { return b / 1048576.0; }

/* ---- recomputation ------------------------------------------------------ */

static zs_tensor *tokens(int64_t B, int64_t T, int64_t V, uint64_t seed)
{
    zs_tensor *t = zs_empty(ZS_I64, 2, (int64_t[]){B, T});
    int64_t *d = zs_data(t);
    for (int64_t i = 0; i < B * T; i++) {
        uint32_t w[4];
        zs_philox(seed, (uint64_t)i, w);
        d[i] = w[0] % V;
    }
    return t;
}

static zs_gpt_config small(int64_t layers, int64_t T)
{
    zs_gpt_config c = {.arch = ZS_GPT2, .vocab = 4096};
    zs_gpt_preset("small", &c);
    c.ctx = T;
    c.layers = layers;
    return c;
}

/* Live bytes kept by a grad-mode forward of m (the loss alive). */
static double kept(zs_module *m, zs_tensor *x, zs_tensor *y)
{
    size_t b0 = live();
    zs_tensor *loss = zs_gpt_loss(m, x, y);
    double k = (double)live() - (double)b0;
    zs_release(loss);
    return loss ? k : NAN;
}

typedef struct rc_row {
    double per_layer, peak, step, cpu; /* cpu: process CPU seconds of a step
                                        * (all threads; steadier than the
                                        * wall time on a shared machine) */
} rc_row;

static int recompute_row(const opts *o, zs_recompute mode, int64_t T, rc_row *r)
{
    zs_gpt_config c6 = small(6, T), c2 = small(2, T);
    zs_module *m6 = zs_gpt_new(&c6, 1), *m2 = zs_gpt_new(&c2, 1);
    zs_tensor *x = tokens(o->batch, T, c6.vocab, 1), *y = tokens(o->batch, T, c6.vocab, 2);
    if (!m6 || !m2 || zs_gpt_set_recompute(m6, mode, 0) != ZS_OK ||
        zs_gpt_set_recompute(m2, mode, 0) != ZS_OK) {
        fprintf(stderr, "memcomm: %s\n", zs_last_error());
        return -1;
    }
    r->per_layer = (kept(m6, x, y) - kept(m2, x, y)) / 4;
    r->step = r->cpu = INFINITY, r->peak = 0;
    for (int rep = -1; rep < o->reps; rep++) {
        size_t b0 = live();
        zs_alloc_reset_peak();
        double t0 = now();
        clock_t c0 = clock();
        zs_tensor *loss = zs_gpt_loss(m6, x, y);
        if (!loss || zs_backward(loss, NULL, false) != ZS_OK) {
            fprintf(stderr, "memcomm: %s\n", zs_last_error());
            zs_release(loss);
            return -1;
        }
        double t = now() - t0;
        if (rep == 0) /* the gradients exist from the warm-up on */
            r->peak = (double)(peak() - b0);
        if (rep >= 0) {
            r->step = fmin(r->step, t);
            r->cpu = fmin(r->cpu, (double)(clock() - c0) / CLOCKS_PER_SEC);
        }
        zs_release(loss);
        zs_module_zero_grad(m6);
    }
    zs_release(x);
    zs_release(y);
    zs_module_free(m6);
    zs_module_free(m2);
    return 0;
}

static int bench_recompute(const opts *o)
{
    const int64_t T = 1024;
    zs_gpt_config c = small(6, T);
    double s = (double)T, b = (double)o->batch, h = (double)c.width, a = (double)c.heads;
    double sbh = s * b * h;
    struct { zs_recompute m; const char *name; double formula, ours; } modes[] = {
        {ZS_RECOMPUTE_NONE, "none", 2 * (34 * sbh + 5 * a * s * s * b), 17 * 4 * sbh},
        {ZS_RECOMPUTE_SELECTIVE, "selective", 2 * 34 * sbh, 16 * 4 * sbh},
        {ZS_RECOMPUTE_FULL, "full", 2 * 2 * sbh, 1 * 4 * sbh},
    };
    printf("recomputation: GPT small (6 layers, h %lld, a %lld, vocab %lld), s %lld, "
           "b %lld, f32, %d threads, best of %d\n", (long long)c.width,
           (long long)c.heads, (long long)c.vocab, (long long)T, (long long)o->batch,
           zs_num_threads(), o->reps);
    printf("%-10s %12s %14s %10s %8s %11s %8s %8s %8s\n", "recompute", "kept/layer",
           "Korthikanti32", "ours", "kept/K", "peak_fw+bw", "step_s", "cpu_s", "cost");
    double base = 0;
    for (int i = 0; i < 3; i++) {
        rc_row r;
        if (recompute_row(o, modes[i].m, T, &r) != 0)
            return -1;
        if (i == 0)
            base = r.step;
        printf("%-10s %9.2f MiB %10.2f MiB %6.2f MiB %8.3f %7.1f MiB %8.3f %8.3f "
               "%+7.1f%%\n", modes[i].name, mib(r.per_layer), mib(modes[i].formula),
               mib(modes[i].ours), r.per_layer / modes[i].formula, mib(r.peak), r.step,
               r.cpu, 100 * (r.step / base - 1));
    }
    printf("(Korthikanti32: 34sbh + 5as^2b none, 34sbh selective, 2sbh full, per layer "
           "in 16-bit bytes, doubled for f32; our flash attention keeps no s^2 term; "
           "cost: step time against none)\n\n");
    return 0;
}

/* ---- sparse attention ---------------------------------------------------- */

typedef struct at_res {
    double t, peak;
} at_res;

static int attn_run(const zs_sparse_params *sp, zs_tensor **qkv, zs_tensor *g, int reps,
                    at_res *r)
{
    zs_attention_params dp = {.causal = true};
    *r = (at_res){.t = INFINITY};
    for (int rep = -1; rep < reps; rep++) {
        size_t b0 = live();
        zs_alloc_reset_peak();
        double t0 = now();
        zs_tensor *out = sp ? zs_sparse_attention(qkv[0], qkv[1], qkv[2], sp)
                            : zs_attention(qkv[0], qkv[1], qkv[2], &dp);
        if (!out || zs_backward(out, g, false) != ZS_OK) {
            fprintf(stderr, "memcomm: %s\n", zs_last_error());
            zs_release(out);
            return -1;
        }
        double t = now() - t0;
        if (rep == -1)
            r->peak = (double)(peak() - b0);
        else
            r->t = fmin(r->t, t);
        zs_release(out);
        for (int i = 0; i < 3; i++)
            zs_zero_grad(qkv[i], true);
    }
    return 0;
}

static int bench_sparse(const opts *o, double *ratio4096)
{
    enum { B = 1, H = 6, D = 64 };
    int64_t Ts[] = {1024, 4096, 16384};
    int nT = o->lng ? 3 : 2;
    const zs_sparse_params *sp = &o->sp;
    printf("sparse attention: causal f32, B %d, H %d, D %d, block %lld, local %lld, "
           "global %lld, random %lld; fwd+bwd, best of %d\n", B, H, D,
           (long long)sp->block, (long long)sp->local, (long long)sp->global,
           (long long)sp->random, o->reps);
    printf("%6s %8s %8s %11s %10s %10s %10s %10s %8s\n", "T", "density", "pairs/",
           "GFLOP_fw+bw", "dense_s", "sparse_s", "dense_MiB", "sparse_MiB", "speedup");
    for (int i = 0; i < nT; i++) {
        int64_t T = Ts[i];
        zs_sparse_layout *l = zs_sparse_layout_new(sp, T);
        zs_tensor *qkv[3], *g = zs_uniform(ZS_F32, ZS_SHAPE(B, H, T, D), -1, 1, 20);
        for (int k = 0; k < 3; k++) {
            qkv[k] = zs_uniform(ZS_F32, ZS_SHAPE(B, H, T, D), -1, 1, 10 + (uint64_t)k);
            zs_set_requires_grad(qkv[k], true);
        }
        at_res d, s;
        int rc = l ? attn_run(NULL, qkv, g, o->reps, &d) : -1;
        if (rc == 0)
            rc = attn_run(sp, qkv, g, o->reps, &s);
        if (rc == 0) {
            printf("%6lld %8.3f %8.2f %11.2f %10.4f %10.4f %10.1f %10.1f %7.2fx\n",
                   (long long)T, l->density, l->dense_pairs / l->pairs,
                   3.5 * zs_sparse_layout_flops(l, B, H, D) / 1e9, d.t, s.t,
                   mib(d.peak), mib(s.peak), d.t / s.t);
            if (T == 4096)
                *ratio4096 = d.t / s.t;
        }
        for (int k = 0; k < 3; k++)
            zs_release(qkv[k]);
        zs_release(g);
        zs_sparse_layout_free(l);
        if (rc != 0)
            return rc;
    }
    printf("(pairs/: dense causal pairs over the sparse layout's computed pairs, the "
           "ideal speed-up)\n");
    return 0;
}

/* ---- main ------------------------------------------------------------------ */

static int parse(int argc, char **argv, opts *o)
{
    *o = (opts){.reps = 2, .batch = 1,
                .sp = {.block = 64, .local = 2, .global = 1, .random = 2, .seed = 1,
                       .causal = true}};
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        int64_t *num = !strcmp(argv[i], "--block") ? &o->sp.block
                       : !strcmp(argv[i], "--local") ? &o->sp.local
                       : !strcmp(argv[i], "--global") ? &o->sp.global
                       : !strcmp(argv[i], "--random") ? &o->sp.random
                       : !strcmp(argv[i], "--batch") ? &o->batch : NULL;
        if (num && v) {
            *num = strtoll(v, NULL, 10), i++;
        } else if (v && !strcmp(argv[i], "--reps")) {
            o->reps = atoi(v), i++;
        } else if (v && !strcmp(argv[i], "--threads")) {
            o->threads = atoi(v), i++;
        } else if (!strcmp(argv[i], "--long")) {
            o->lng = true;
        } else if (!strcmp(argv[i], "--skip-recompute")) {
            o->skip_rc = true;
        } else if (!strcmp(argv[i], "--skip-sparse")) {
            o->skip_sp = true;
        } else if (!strcmp(argv[i], "--skip-onebit")) {
            o->skip_ob = true;
        } else if (v && !strcmp(argv[i], "--onebit-args")) {
            o->ob_args = v, i++;
        } else {
            fprintf(stderr, "usage: memcomm [--reps N] [--threads N] [--batch N] "
                    "[--long] [--skip-recompute] [--skip-sparse] [--skip-onebit] "
                    "[--onebit-args \"ARGS\"] [--block B] [--local L] [--global G] "
                    "[--random R]\n");
            return -1;
        }
    }
    if (o->reps < 1 || o->threads < 0 || o->batch < 1) {
        fprintf(stderr, "memcomm: --reps and --batch must be >= 1, --threads >= 0\n");
        return -1;
    }
    return 0;
}

/* Runs bench/onebit (beside this program) with o->ob_args, echoing its
 * output; *ratio = the value of its `memcomm onebit/adam bytes = R` line. */
static int bench_onebit(const opts *o, const char *argv0, double *ratio)
{
    char dir[4096], cmd[8192], line[1024];
    snprintf(dir, sizeof dir, "%s", argv0);
    char *slash = strrchr(dir, '/');
    if (slash)
        *slash = 0;
    else
        snprintf(dir, sizeof dir, ".");
    snprintf(cmd, sizeof cmd, "'%s/onebit' %s 2>&1", dir, o->ob_args ? o->ob_args : "");
    printf("1-bit Adam vs AdamW: %s\n", cmd);
    fflush(stdout);
    FILE *p = popen(cmd, "r");
    if (!p) {
        fprintf(stderr, "memcomm: cannot run %s\n", cmd);
        return -1;
    }
    while (fgets(line, sizeof line, p)) {
        fputs(line, stdout);
        sscanf(line, "memcomm onebit/adam bytes = %lf", ratio);
    }
    int rc = pclose(p);
    printf("\n");
    return rc == 0 ? 0 : -1;
}

int main(int argc, char **argv)
{
    opts o;
    if (parse(argc, argv, &o) != 0)
        return 2;
    if (o.threads)
        zs_set_num_threads(o.threads);
    printf("memcomm: %d threads, ISA %s\n\n", zs_num_threads(), zs_cpu_isa());
    if (!o.skip_rc && bench_recompute(&o) != 0)
        return 1;
    double r = NAN, ob = NAN;
    if (!o.skip_sp && bench_sparse(&o, &r) != 0)
        return 1;
    if (!o.skip_ob && bench_onebit(&o, argv[0], &ob) != 0)
        fprintf(stderr, "memcomm: bench/onebit failed (its output is above)\n");
    printf("memcomm onebit/adam bytes = %.4f\n", ob);
    printf("memcomm sparse/dense time T4096 = %.2f\n", r);
    return 0;
}
