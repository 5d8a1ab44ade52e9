/*
 * parallel.c - bench/parallel: model-parallel GPT training (issue 28)
 * measured beside zs analyze's formulas for the same layout.
 *
 * Run under mpirun (-np 4 or 8; `parallel` alone prints how). For each
 * layout of the world (pp 4 with GPipe and 1F1B at m = 4, 8, 16, tp 2 x
 * pp 2, with 8 ranks tp 2 x pp 2 x dp 2, also with ZeRO-1) a GPT ("small": 6 blocks,
 * width 384, 6 heads; random tokens) trains a few steps through the
 * library's trainer (AdamW, lr 0: the weights stay) and the program prints:
 *   step      median seconds of a step (max over ranks)
 *   bubble    measured: the schedule's wall time over its compute, minus
 *             1, averaged over the ranks; beside the formula (p-1)/m
 *   peak MiB  the allocator's high-water mark during the steps (the
 *             caller's GPT freed once the trainer has cut its part), max
 *             over ranks, beside zs_memory_analyze_stage for each rank's
 *             stage like for like (f32 activations, fused attention with
 *             no s^2 term, no dropout, AdamW's m and v: 8 bytes a
 *             parameter; GPipe holds m micro-batches, 1F1B min(pp - s, m);
 *             each held micro-batch's stage output or head, and the
 *             backward's working set at the peak: src/analyze/memory.c);
 *             ratio: the rank farthest from its formula
 *   pipe KiB  bytes a stage's pipe sent per step (max over ranks) beside
 *             zs_comm_analyze's pp_p2p (a middle stage's; with pp 2 each
 *             stage sends one direction only: half of it)
 *   tp KiB    bytes the tensor-parallel operators sent per step (counted
 *             by zs_tp_bytes_sent, max over ranks) beside tp_step +
 *             tp_embed (the embedding's and the head's all-reduces)
 *   dp KiB    the dp average's ring volume beside the formula for the
 *             stage's parameters (ratio: the rank farthest from it)
 * --per-rank 1 prints each rank's peak beside its stage's formula; --only K
 * runs the K-th layout only (0-7, in the order above); under
 * ZS_ALLOC_TRACE=1 each rank prints what its allocator held at its peak
 * (zs_alloc_peak_report).
 * These machines have 2 cores: ranks share them, so the step times and
 * bubbles measure contention as much as the schedule; agreement of the
 * bytes with the model is the target, not throughput. The last line reads
 * `parallel bubble measured/formula 1f1b pp4 m8 = R`.
 *
 * Usage: mpirun -np 4|8 parallel [--batch B] [--seq T] [--steps N] [--per-rank 1]
 *        [--only K]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zs/zs.h"

typedef struct source {
    int64_t rows, seq, vocab;
} source;

static zs_status random_batch(void *ctx, int64_t index, zs_tensor **x, zs_tensor **y)
{
    const source *s = ctx;
    uint64_t r = 0x9E3779B97F4A7C15ull * (uint64_t)(index + 1);
    *x = zs_empty(ZS_I64, 2, (int64_t[]){s->rows, s->seq});
    *y = zs_empty(ZS_I64, 2, (int64_t[]){s->rows, s->seq});
    if (!*x || !*y)
        return ZS_ERR_NOMEM;
    for (int64_t i = 0; i < 2 * s->rows * s->seq; i++) {
        r ^= r << 13, r ^= r >> 7, r ^= r << 17;
        int64_t *d = zs_data(i < s->rows * s->seq ? *x : *y);
        d[i % (s->rows * s->seq)] = (int64_t)(r % (uint64_t)s->vocab);
    }
    return ZS_OK;
}

/* max (or sum) of v over the world. */
static double over_ranks(double v, bool max)
{
    zs_comm *w = zs_comm_world();
    int P = zs_comm_size(w);
    zs_tensor *all = zs_empty(ZS_F64, 1, (int64_t[]){P});
    zs_tensor *one = zs_from_data(ZS_F64, 1, (int64_t[]){1}, &v);
    double r = max ? -1e300 : 0;
    if (all && one && zs_comm_allgather(w, one, all) == ZS_OK)
        for (int i = 0; i < P; i++) {
            double x = ((double *)zs_data(all))[i];
            r = max ? (x > r ? x : r) : r + x;
        }
    zs_release(one);
    zs_release(all);
    return r;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

typedef struct layout {
    int dp, tp, pp;
    zs_pp_schedule sched;
    int m, zero;
} layout;

/* |a / b - 1| as a ratio a / b (or -1 when b is 0). */
static double ratio(double a, double b) { return b > 0 ? a / b : -1; }

/* The ratio of v over the world that is farthest from 1. */
static double worst_ratio(double v)
{
    double hi = over_ranks(v, true), lo = -over_ranks(-v, true);
    return hi - 1 > 1 - lo ? hi : lo;
}

/* This rank's stage (the grid: tp fastest, then dp, pp slowest) and its
 * blocks (the trainer's even split). */
static void my_stage(const layout *l, int64_t L, int64_t *stage, int64_t *layers)
{
    int r = zs_comm_rank(zs_comm_world());
    *stage = r / (l->tp * l->dp);
    *layers = L / l->pp + (*stage < L % l->pp);
}

static bool per_rank; /* --per-rank: each rank's peak beside its formula */

/* One layout: prints its line; returns the measured bubble (or -1). */
static double run(const layout *l, int64_t batch, int64_t seq, int steps)
{
    zs_comm *w = zs_comm_world();
    bool lead = zs_comm_rank(w) == 0;
    zs_gpt_config gc = {.arch = ZS_GPT2, .vocab = 4096};
    zs_gpt_preset("small", &gc);
    zs_module *m = zs_gpt_new(&gc, 1);
    source src = {batch, seq, gc.vocab};
    zs_trainer_config tc = zs_trainer_defaults();
    tc.optim.lr = tc.optim.weight_decay = 0; /* AdamW's m and v, weights unchanged */
    tc.schedule = (zs_lr_schedule){ZS_LR_CONSTANT, 0, 0, 0, 0, 0, 0};
    tc.steps = 1 << 30, tc.clip = 0, tc.bucket_bytes = 0;
    tc.batch = random_batch, tc.batch_ctx = &src;
    tc.tp = l->tp, tc.pp = l->pp, tc.dp = l->dp, tc.zero = l->zero;
    tc.pp_schedule = l->sched, tc.micro_batches = l->m;
    zs_trainer *t = m ? zs_trainer_new(m, &tc) : NULL;
    zs_module_free(m); /* the trainer holds this rank's part only */
    if (!t) {
        fprintf(stderr, "parallel: %s\n", zs_last_error());
        return -1;
    }
    zs_alloc_trim();
    zs_alloc_reset_peak();
    double *dt = calloc((size_t)steps, sizeof *dt);
    zs_train_event e;
    zs_status st = zs_trainer_step(t, &e); /* warm-up */
    zs_trainer_profile_reset(t);
    for (int i = 0; st == ZS_OK && i < steps; i++) {
        zs_comm_barrier(w);
        st = zs_trainer_step(t, &e);
        dt[i] = over_ranks(e.step_s, true);
    }
    zs_train_profile pr;
    zs_trainer_profile(t, &pr);
    zs_alloc_stats as;
    zs_alloc_get_stats(&as);
    double bub = pr.pp_busy_s > 0 ? pr.pp_wall_s / pr.pp_busy_s - 1 : 0;
    bub = over_ranks(bub, false) / zs_comm_size(w);
    zs_model_config mc = {"small", gc.layers, gc.width, gc.heads, gc.heads,
                          gc.width / gc.heads, 4 * gc.width, gc.vocab, gc.ctx,
                          ZS_MLP_GELU, ZS_NORM_LAYER, true, true, true, false};
    /* like for like: f32 activations, fused attention, no dropout, AdamW
     * in f32 (m and v), the schedule's micro-batches in flight */
    zs_parallel par = {batch, batch / (l->dp * l->m), seq, l->dp, l->tp, l->pp, l->zero,
                       false, ZS_RECOMPUTE_NONE, ZS_PREC_FP32, 4, true, true, 8,
                       l->sched == ZS_PP_GPIPE};
    int64_t stage, layers;
    my_stage(l, gc.layers, &stage, &layers);
    zs_stage_memory sm;
    zs_comm_report cr;
    bool an = zs_memory_analyze_stage(&mc, &par, stage, layers, &sm) == ZS_OK &&
              zs_comm_analyze(&mc, &par, &cr) == ZS_OK;
    double peak = (double)as.peak_bytes, dpb = (double)(e.comm_bytes - pr.pp_bytes);
    if (zs_alloc_tracing() && st == ZS_OK) /* ZS_ALLOC_TRACE=1: what the peak held */
        for (int r = 0; r < zs_comm_size(w); r++) {
            zs_comm_barrier(w);
            if (r != zs_comm_rank(w))
                continue;
            fprintf(stderr, "rank %d, stage %lld (layout dp %d tp %d pp %d z%d %s m %d): ",
                    r, (long long)zs_comm_rank(w) / (l->tp * l->dp), l->dp, l->tp, l->pp,
                    l->zero, zs_pp_schedule_name(l->sched), l->m);
            zs_alloc_peak_report(stderr, 256 << 10);
            fflush(stderr);
        }
    if (per_rank && st == ZS_OK && an)
        fprintf(stderr, "  rank %d stage %lld (%lld blocks): peak %.2f MiB, analyze %.2f "
                "(state %.2f + activations %.2f: %lld x %.2f per block + outputs %.2f + "
                "head %.2f; + backward working set %.2f)\n",
                zs_comm_rank(w), (long long)stage, (long long)layers, peak / 1048576,
                sm.total / 1048576, sm.state.total / 1048576, sm.act / 1048576,
                (long long)sm.in_flight, sm.act_layer / 1048576, sm.boundary / 1048576,
                sm.act_head / 1048576, sm.work / 1048576);
    /* per rank: peak and the dp all-reduce beside this stage's formula
     * (the analyzer's dp_allreduce assumes an even split of the model) */
    double mem_r = worst_ratio(ratio(peak, an ? sm.total : 0));
    double dp_an = zs_ring_allreduce_bytes(sm.params * 4, l->dp);
    double dp_r = l->dp > 1 ? worst_ratio(ratio(dpb, dp_an)) : 1;
    double tp_an = an ? cr.tp_step + cr.tp_embed : 0;
    double peak_max = over_ranks(peak, true), an_max = over_ranks(an ? sm.total : 0, true);
    double pipe = over_ranks((double)pr.pp_bytes, true);
    double tpb = over_ranks((double)pr.tp_bytes, true);
    dpb = over_ranks(dpb, true), dp_an = over_ranks(dp_an, true);
    qsort(dt, (size_t)steps, sizeof *dt, cmp_double);
    if (lead && st == ZS_OK)
        printf("dp %d tp %d pp %d z%d %-5s m %2d %6.3f %6.3f %6.3f  %7.1f %7.1f %5.3f  "
               "%7.1f %7.1f  %7.1f %7.1f %5.3f  %7.1f %7.1f %5.3f\n", l->dp, l->tp, l->pp,
               l->zero, zs_pp_schedule_name(l->sched), l->m, dt[steps / 2], bub,
               zs_pp_bubble(l->pp, l->m), peak_max / 1048576, an_max / 1048576, mem_r,
               pipe / 1024, an ? cr.pp_p2p / 1024 : -1, tpb / 1024, tp_an / 1024,
               ratio(tpb, tp_an), dpb / 1024, dp_an / 1024, dp_r);
    if (st != ZS_OK && lead)
        fprintf(stderr, "parallel: %s\n", zs_last_error());
    free(dt);
    zs_trainer_free(t);
    return st == ZS_OK ? bub : -1;
}

int main(int argc, char **argv)
{
    int64_t batch = 32, seq = 64;
    int steps = 3, only = -1;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--batch")) batch = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--seq")) seq = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--steps")) steps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--per-rank")) per_rank = atoi(argv[i + 1]) != 0;
        else if (!strcmp(argv[i], "--only")) only = atoi(argv[i + 1]);
    }
    zs_dist_init(&argc, &argv);
    zs_comm *w = zs_comm_world();
    int P = zs_comm_size(w);
    if ((P != 4 && P != 8) || batch < 32 || batch % 32 || seq < 1 || steps < 1) {
        if (zs_comm_rank(w) == 0)
            fprintf(stderr, "usage: mpirun -np 4|8 parallel [--batch B (a multiple "
                    "of 32, default 32)] [--seq T (default 64)] [--steps N (default "
                    "3)]\n");
        zs_dist_finalize();
        return 2;
    }
    zs_set_num_threads(1);
    int dp = P / 4;
    layout ls[] = {
        {dp, 1, 4, ZS_PP_GPIPE, 4, 0}, {dp, 1, 4, ZS_PP_GPIPE, 8, 0},
        {dp, 1, 4, ZS_PP_GPIPE, 16, 0}, {dp, 1, 4, ZS_PP_1F1B, 4, 0},
        {dp, 1, 4, ZS_PP_1F1B, 8, 0}, {dp, 1, 4, ZS_PP_1F1B, 16, 0},
        {dp, 2, 2, ZS_PP_1F1B, 8, 0}, {dp, 2, 2, ZS_PP_1F1B, 8, 1},
    };
    if (zs_comm_rank(w) == 0)
        printf("GPT small (6 blocks, width 384, vocabulary 4096), batch %lld x seq %lld, "
               "%d ranks on %s; AdamW (lr 0)\n"
               "peak: max over ranks, MiB; analyze: zs_memory_analyze_stage (f32, flash, "
               "no dropout, m and v); ratio: the rank farthest from 1\n"
               "layout                step s bubble (p-1)/m  peak    analyze ratio  "
               "pipe KiB analyze  tp KiB  analyze ratio  dp KiB  analyze ratio\n",
               (long long)batch, (long long)seq, P, "this machine");
    double r = -1;
    for (size_t i = 0; i < sizeof ls / sizeof *ls; i++) {
        if ((ls[i].zero && ls[i].dp < 2) || (only >= 0 && (size_t)only != i))
            continue; /* ZeRO partitions over dp; --only: that row */
        double b = run(&ls[i], batch, seq, steps);
        if (ls[i].sched == ZS_PP_1F1B && ls[i].pp == 4 && ls[i].m == 8 && b >= 0)
            r = b / zs_pp_bubble(4, 8);
    }
    if (zs_comm_rank(w) == 0)
        printf("parallel bubble measured/formula 1f1b pp4 m8 = %.3f\n", r);
    zs_dist_finalize();
    return 0;
}
