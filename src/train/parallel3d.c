/*
 * parallel3d.c - the trainer's model parallelism (issue 28; contract in
 * zs/train.h, zs_trainer_config.tp): a dp x tp x pp grid (zs/tp.h), this
 * rank's part of the GPT (gpt_par.c), and the pipelined step.
 *
 * A step: the global batch's rows for this dp rank are cut into m
 * micro-batches; stage s runs zs_pp_schedule_make's actions: a forward
 * takes the micro-batch's ids (first stage) or the activation received
 * from s - 1, runs the stage's blocks and sends the result on (or, on the
 * last stage, computes the loss / m); a backward seeds the stage's output
 * with the gradient received from s + 1 (the last stage: the loss) and
 * sends its input's gradient back. Then the gradients are completed:
 * averaged over dp (zs_dp, or ZeRO-1 over dp), summed over tp for the
 * replicated parameters under sequence parallelism, and the tied
 * embedding's summed between the first and the last stage. Every dp
 * replica of a (tp, pp) position holds the same parameters, so the losses
 * equal one process's on the same global batch up to the order of the
 * additions.
 *
 * The caller's one-process GPT is read once, for this rank's shards
 * (zsi_pgpt_new), and may be freed once zs_trainer_new returns (zs train
 * gpt and bench/parallel free it): checkpoints are written in the
 * one-process layout one parameter at a time (par_ckpt.c), so a run
 * resumes on any layout, and validation runs on the split model. Each
 * rank still builds that whole GPT once at start, before its part is cut.
 *
 * Memory per rank (measured against zs_memory_analyze_stage by
 * bench/parallel, attributed with ZS_ALLOC_TRACE=1): the part's model
 * state, each held micro-batch's activations and stage output (or head),
 * and the backward's working set; the terms are in src/analyze/memory.c.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/internal.h"
#include "train/par.h"

bool zsi_par_wanted(const zs_trainer_config *c) { return c->tp > 1 || c->pp > 1; }

zs_status zsi_par_check(const zs_trainer_config *c)
{
    if (c->tp < 0 || c->pp < 0 || c->dp < 0 || c->micro_batches < 0)
        return zs_set_error("trainer: tp %d, pp %d, dp %d, micro-batches %lld: "
                            "expected >= 0", c->tp, c->pp, c->dp,
                            (long long)c->micro_batches);
    if (!zsi_par_wanted(c)) {
        if (c->sequence_parallel || c->pp_layers || c->micro_batches > 1)
            return zs_set_error("trainer: sequence parallelism, pp_layers and "
                                "micro-batches need tp or pp > 1");
        return ZS_OK;
    }
    if (c->sync != ZS_SYNC_ALLREDUCE || c->zero > 1 || c->accum != 1 || c->graph ||
        c->device != ZS_CPU || c->loss || c->optim.kind == ZS_ONEBIT_ADAM)
        return zs_set_error("trainer: model parallelism (tp %d, pp %d) runs all-reduce "
                            "data parallelism with ZeRO 0 or 1, accum 1 (micro-batches "
                            "instead), eager on the cpu, AdamW or SGD and the GPT "
                            "loss (here: ZeRO %d, accum %lld%s)", c->tp, c->pp,
                            c->zero, (long long)c->accum, c->graph ? ", graph" : "");
    if (c->eval && !c->eval_batch && c->eval != zs_token_eval)
        return zs_set_error("trainer: model parallelism validates on the split model: "
                            "give eval_batch (a custom eval function cannot run on it)");
    if (c->sequence_parallel && c->tp < 2)
        return zs_set_error("trainer: sequence parallelism needs tp > 1");
    if ((unsigned)c->pp_schedule > ZS_PP_1F1B)
        return zs_set_error("trainer: pipeline schedule %d (expected gpipe or 1f1b)",
                            (int)c->pp_schedule);
    return ZS_OK;
}

/* Layer bounds of the stages: pp_layers, or an even split. */
static zs_status stage_bounds(zsi_par *p, const zs_trainer_config *c, int64_t L)
{
    int P = p->stages;
    if (!(p->bounds = calloc((size_t)P + 1, sizeof *p->bounds)))
        return zs_set_error_code(ZS_ERR_NOMEM, "trainer: out of memory");
    for (int s = 0; s < P; s++) {
        int64_t n = c->pp_layers ? c->pp_layers[s] : L / P + (s < L % P);
        if (n < 0)
            return zs_set_error("pipeline: stage %d of %lld blocks", s, (long long)n);
        p->bounds[s + 1] = p->bounds[s] + n;
    }
    if (p->bounds[P] != L)
        return zs_set_error("pipeline: the %d stages' blocks sum to %lld, the model "
                            "has %lld", P, (long long)p->bounds[P], (long long)L);
    return ZS_OK;
}

zs_status zsi_par_setup(zs_trainer *t)
{
    const zs_trainer_config *c = &t->c;
    const zs_gpt_config *g = zs_gpt_config_of(t->m);
    if (!g)
        return zs_set_error("trainer: model parallelism splits a GPT (zs_gpt_new)");
    zsi_par *p = calloc(1, sizeof *p);
    if (!p)
        return zs_set_error_code(ZS_ERR_NOMEM, "trainer: out of memory");
    t->par = p;
    p->grid = zs_grid_new(t->comm, c->dp, c->tp > 1 ? c->tp : 1, c->pp > 1 ? c->pp : 1);
    if (!p->grid)
        return ZS_ERR_ARG;
    p->stages = p->grid->dims.pp;
    p->stage = p->grid->me.pp;
    p->first = p->stage == 0;
    p->last = p->stage == p->stages - 1;
    p->m = c->micro_batches > 0 ? (int)c->micro_batches : 1;
    p->width = g->width;
    zs_status st = stage_bounds(p, c, g->layers);
    if (st != ZS_OK)
        return st;
    p->pg = zsi_pgpt_new(t->m, p->grid->tp, c->sequence_parallel,
                         p->bounds[p->stage], p->bounds[p->stage + 1], p->first, p->last);
    if (!p->pg)
        return ZS_ERR_ARG;
    if ((st = zsi_par_layout(p, t->m)) != ZS_OK)
        return st;
    if (p->stages > 1) {
        p->emb = zs_comm_split(p->grid->pp, p->first || p->last ? 0 : 1, p->stage);
        p->pipe = zs_pipe_new(p->grid->pp);
        if (!p->emb || !p->pipe)
            return ZS_ERR_STATE;
    }
    t->m = zsi_pgpt_module(p->pg);
    t->comm = p->grid->dp;
    t->size = zs_comm_size(t->comm);
    return ZS_OK;
}

/* Whether a group of the grid failed (a timeout or a transport error). */
static bool grid_broken(const zsi_par *p)
{
    const zs_grid *g = p->grid;
    return g && (zs_comm_is_broken(g->tp) || zs_comm_is_broken(g->pp) ||
                 zs_comm_is_broken(g->dp) || zs_comm_is_broken(p->emb));
}

void zsi_par_free(zs_trainer *t)
{
    zsi_par *p = t->par;
    if (!p)
        return;
    /* A group that timed out leaves transfers with a dead or hung rank
     * pending, on which MPI_Finalize would hang: the job ends here, the
     * message (naming the rank, zsi_par_gradients) printed. */
    if (grid_broken(p))
        zs_dist_abort(1);
    zs_pipe_free(p->pipe);
    zs_comm_free(p->emb);
    zsi_pgpt_free(p->pg);
    zsi_par_layout_free(p);
    zs_grid_free(p->grid);
    free(p->bounds);
    free(p);
    t->par = NULL;
}

zs_comm *zsi_par_world(zs_trainer *t) { return t->par->grid->world; }

void zsi_par_profile(const zs_trainer *t, zs_train_profile *pr)
{
    const zsi_par *p = t->par;
    pr->pp_busy_s = p->busy_s;
    pr->pp_wall_s = p->wall_s;
    pr->pp_bytes = p->pipe_bytes;
    pr->tp_bytes = p->tp_bytes;
}

void zsi_par_profile_reset(zs_trainer *t)
{
    t->par->busy_s = t->par->wall_s = 0;
}

void zsi_par_log_setup(const zs_trainer *t)
{
    const zsi_par *p = t->par;
    char *lay = zs_grid_layout(p->grid->dims);
    fprintf(t->c.log, "model parallel: %s", lay ? lay : "?\n");
    free(lay);
    fprintf(t->c.log, "  pipeline: %d stage%s, blocks", p->stages, p->stages == 1 ? "" : "s");
    for (int s = 0; s < p->stages; s++)
        fprintf(t->c.log, " %s[%lld, %lld)", s ? "" : "", (long long)p->bounds[s],
                (long long)p->bounds[s + 1]);
    fprintf(t->c.log, ", %d micro-batch%s per step, %s schedule; tensor parallel %d%s\n",
            p->m, p->m == 1 ? "" : "es", zs_pp_schedule_name(t->c.pp_schedule),
            p->grid->dims.tp, t->c.sequence_parallel ? " with sequence parallelism" : "");
}

void zsi_par_log_end(const zs_trainer *t)
{
    const zsi_par *p = t->par;
    static const char *rc[] = {"none", "selective", "full"};
    zs_recompute mode = zsi_pgpt_recompute(p->pg);
    fprintf(t->c.log, "step memory (world rank 0): peak %.3f MiB above the step's start "
            "(activations, gradients, temporaries; recompute %s)\n",
            (double)p->step_peak / 1048576, (unsigned)mode < 3 ? rc[mode] : "?");
    if (p->stages < 2 || p->busy_s <= 0)
        return;
    fprintf(t->c.log, "pipeline %s pp %d m %d: measured bubble %.3f (stage 0: idle / "
            "compute), formula (p-1)/m = %.3f\n", zs_pp_schedule_name(t->c.pp_schedule),
            p->stages, p->m, (p->wall_s - p->busy_s) / p->busy_s,
            zs_pp_bubble(p->stages, p->m));
}

/* This rank's model state in bytes: parameters, gradients, the
 * optimizer's moments (under ZeRO its shards'). */
static double state_bytes(zs_trainer *t)
{
    const char *nm[8];
    zs_tensor *ts[8];
    int k = t->o ? zs_optim_state(t->o, 8, nm, ts) : 0;
    double b = (double)zs_nbytes(t->fp) + (t->fg ? (double)zs_nbytes(t->fg) : 0);
    for (int i = 0; i < k; i++)
        b += (double)zs_nbytes(ts[i]);
    return b;
}

void zsi_par_log_memory(zs_trainer *t)
{
    zsi_par *p = t->par;
    int W = zs_comm_size(p->grid->world);
    zs_alloc_stats as;
    zs_alloc_get_stats(&as);
    double mine[4] = {(double)zs_numel(t->fp), state_bytes(t), (double)as.current_bytes,
                      (double)as.peak_bytes};
    zs_tensor *one = zs_from_data(ZS_F64, 1, (int64_t[]){4}, mine);
    zs_tensor *all = zs_empty(ZS_F64, 1, (int64_t[]){4 * (int64_t)W});
    zs_status st = one && all ? zs_comm_allgather(p->grid->world, one, all) : ZS_ERR_NOMEM;
    for (int r = 0; st == ZS_OK && t->c.log && p->grid->rank == 0 && r < W; r++) {
        const double *v = (const double *)zs_data(all) + 4 * r;
        fprintf(t->c.log, "model parallel memory, world rank %d: parameters %.0f of the "
                "model's %lld; model state %.0f B (parameters, gradients, optimizer); "
                "allocator now %.0f B, peak %.0f B\n", r, v[0], (long long)p->full_numel,
                v[1], v[2], v[3]);
    }
    zs_release(one);
    zs_release(all);
}

/* ---- the pipelined step ------------------------------------------------ */

typedef struct mb_state {
    zs_tensor *in;   /* the received activation (leaf; NULL on the first stage) */
    zs_tensor *out;  /* the stage's output, or the loss / m on the last */
} mb_state;

/* Forward of micro-batch i: *loss_sum gets the loss on the last stage. */
static zs_status forward(zs_trainer *t, mb_state *s, zs_tensor *x, zs_tensor *y,
                         int i, double *loss_sum, double *busy)
{
    zsi_par *p = t->par;
    zs_status st = ZS_OK;
    zs_tensor *h = NULL;
    if (p->first) {
        double t0 = zsi_train_now();
        h = zsi_pgpt_embed(p->pg, x);
        *busy += zsi_train_now() - t0;
    } else {
        int64_t T = x->shape[1], P = p->grid->dims.tp;
        int64_t n = t->c.sequence_parallel ? T / P : T;
        int64_t C = p->width;
        s->in = zs_empty(ZS_F32, 3, (int64_t[]){x->shape[0], n, C});
        st = s->in ? zs_pipe_recv(p->pipe, ZS_PIPE_ACT, i, s->in) : ZS_ERR_NOMEM;
        if (st == ZS_OK)
            st = zs_set_requires_grad(s->in, true);
        h = st == ZS_OK ? zs_retain(s->in) : NULL;
    }
    double t0 = zsi_train_now();
    zs_tensor *o = h ? zsi_pgpt_blocks(p->pg, h) : NULL;
    zs_release(h);
    if (o && p->last) {
        zs_tensor *l = zsi_pgpt_loss(p->pg, o, y);
        zs_release(o);
        *loss_sum += l ? zs_item(l) : NAN;
        /* 1 / m, times the loss scale for f16 and fp8 (the same on every
         * rank: the scaler's skips are agreed over the world) */
        double f = (t->scaler ? zs_grad_scaler_get_scale(t->scaler) : 1) / p->m;
        o = l ? zs_mul_scalar(l, f) : NULL;
        zs_release(l);
    }
    *busy += zsi_train_now() - t0;
    s->out = o;
    if (!o)
        return st != ZS_OK ? st : ZS_ERR_STATE;
    return p->last ? ZS_OK : zs_pipe_send(p->pipe, ZS_PIPE_ACT, i, o);
}

/* Backward of micro-batch i; last_one: the step's final backward (data
 * parallelism's buckets reduce during it). */
static zs_status backward(zs_trainer *t, mb_state *s, int i, bool last_one, double *busy)
{
    zsi_par *p = t->par;
    zs_status st = ZS_OK;
    zs_tensor *g = NULL;
    if (!p->last) {
        g = zs_empty_like(s->out);
        st = g ? zs_pipe_recv(p->pipe, ZS_PIPE_GRAD, i, g) : ZS_ERR_NOMEM;
    }
    if (st == ZS_OK && t->dp && last_one)
        st = zs_dp_begin(t->dp);
    double t0 = zsi_train_now();
    if (st == ZS_OK)
        st = zs_backward(s->out, g, false);
    *busy += zsi_train_now() - t0;
    zs_release(g);
    if (st == ZS_OK && s->in) {
        zs_tensor *gi = zs_grad(s->in);
        zs_tensor *gc = gi ? zs_contiguous(gi) : NULL;
        st = gc ? zs_pipe_send(p->pipe, ZS_PIPE_GRAD, i, gc) : ZS_ERR_STATE;
        zs_release(gc);
    }
    zs_release(s->out);
    zs_release(s->in);
    s->out = s->in = NULL;
    return st;
}

/* This dp rank's rows of global batch `index` made by fn (ctx), as m
 * micro-batches; train: the step's (its targets counted). */
static zs_status micro_batches(zs_trainer *t, zs_batch_fn fn, void *ctx, int64_t index,
                               bool train, zs_tensor **xs, zs_tensor **ys)
{
    zsi_par *p = t->par;
    zs_tensor *x, *y;
    zs_status st = fn(ctx, index, &x, &y);
    if (st != ZS_OK)
        return st;
    int64_t parts = (int64_t)t->size * p->m;
    if (!x || !y || x->ndim != 2 || y->ndim != 2 || x->shape[0] != y->shape[0] ||
        x->shape[0] % parts != 0)
        return zs_set_error("trainer: %s batch %lld has %lld rows; model parallelism "
                            "needs [B, T] ids and targets with B divisible by dp %d x "
                            "micro-batches %d", train ? "training" : "validation",
                            (long long)index,
                            (long long)(x && x->ndim ? x->shape[0] : -1), t->size, p->m);
    if ((st = zsi_pgpt_check_seq(p->pg, x->shape[1])) != ZS_OK)
        return st;
    if (train)
        t->targets += zs_numel(y);
    zsi_train_my_rows(&x, &y, zs_comm_rank(t->comm), t->size);
    int64_t b = x->shape[0] / p->m;
    for (int i = 0; i < p->m; i++) {
        xs[i] = zs_contiguous(zs_narrow(x, 0, i * b, b));
        ys[i] = zs_contiguous(zs_narrow(y, 0, i * b, b));
        if (!xs[i] || !ys[i])
            return ZS_ERR_STATE;
    }
    return ZS_OK;
}

/* The actions of this stage's schedule for one step. */
static zs_status run_schedule(zs_trainer *t, zs_tensor **xs, zs_tensor **ys,
                              double *loss_sum)
{
    zsi_par *p = t->par;
    zs_pp_action *acts = malloc(2 * (size_t)p->m * sizeof *acts);
    mb_state *ms = calloc((size_t)p->m, sizeof *ms);
    zs_status st = acts && ms ? zs_pp_schedule_make(t->c.pp_schedule, p->stage,
                                                    p->stages, p->m, acts)
                              : zs_set_error_code(ZS_ERR_NOMEM, "trainer: out of memory");
    double busy = 0, t0 = zsi_train_now();
    int64_t sent0 = p->pipe ? zs_pipe_bytes_sent(p->pipe) : 0;
    for (int a = 0; st == ZS_OK && a < 2 * p->m; a++) {
        int i = acts[a].mb;
        zs_alloc_tag_push(acts[a].backward ? "backward" : "forward");
        st = acts[a].backward ? backward(t, &ms[i], i, a == 2 * p->m - 1, &busy)
                              : forward(t, &ms[i], xs[i], ys[i], i, loss_sum, &busy);
        zs_alloc_tag_pop();
    }
    if (st == ZS_OK && p->pipe)
        st = zs_pipe_flush(p->pipe);
    p->busy_s += busy;
    p->wall_s += zsi_train_now() - t0;
    p->pipe_bytes = p->pipe ? zs_pipe_bytes_sent(p->pipe) - sent0 : 0;
    for (int i = 0; ms && i < p->m; i++) {
        zs_release(ms[i].in);
        zs_release(ms[i].out);
    }
    free(ms);
    free(acts);
    return st;
}

/* After backward: the replicated parameters' gradients summed over tp
 * (sequence parallelism: each rank has its shard's part), the tied
 * embedding's over the first and last stage. */
static zs_status complete_grads(zs_trainer *t)
{
    zsi_par *p = t->par;
    zs_status st = ZS_OK;
    zs_module *m = t->m;
    if (t->c.sequence_parallel) {
        zs_tensor **rep = malloc((size_t)(m->nparams + 1) * sizeof *rep);
        if (!rep)
            return zs_set_error_code(ZS_ERR_NOMEM, "trainer: out of memory");
        int n = zsi_pgpt_replicated(p->pg, rep);
        st = zs_tp_allreduce_grads(p->grid->tp, n, rep);
        free(rep);
    }
    if (st == ZS_OK && p->emb && (p->first || p->last)) {
        for (int i = 0; i < m->nparams; i++)
            if (!strcmp(m->param_names[i], "wte.weight"))
                st = zs_comm_allreduce(p->emb, zs_grad(m->params[i]), false,
                                       ZS_ALLREDUCE_MPI);
    }
    return st;
}

/* The error in hand, with this rank's place and its groups' world ranks
 * (a communicator's messages give ranks within the group). */
static void name_groups(const zsi_par *p)
{
    char grp[3][160], err[512];
    const zs_grid_axis ax[3] = {ZS_GRID_DP, ZS_GRID_TP, ZS_GRID_PP};
    const zs_grid_dims d = p->grid->dims;
    int *ranks = malloc((size_t)(d.dp * d.tp * d.pp) * sizeof *ranks);
    snprintf(err, sizeof err, "%s", zs_last_error());
    for (int a = 0; a < 3; a++) {
        int n = ranks ? zs_grid_group(d, ax[a], p->grid->rank, ranks) : 0, k = 0;
        grp[a][0] = '\0';
        for (int i = 0; i < n && i < 16; i++)
            k += snprintf(grp[a] + k, sizeof grp[a] - (size_t)k, i ? " %d" : "%d", ranks[i]);
    }
    free(ranks);
    zs_set_error_code(ZS_ERR_IO, "%s (world rank %d: its dp group is world ranks [%s], "
                      "tp [%s], pp [%s], in group-rank order)", err, p->grid->rank,
                      grp[0], grp[1], grp[2]);
}

zs_status zsi_par_gradients(zs_trainer *t, int64_t step, double *loss)
{
    zsi_par *p = t->par;
    zs_tensor **xs = calloc(2 * (size_t)p->m, sizeof *xs);
    if (!xs)
        return zs_set_error_code(ZS_ERR_NOMEM, "trainer: out of memory");
    double sum = 0;
    /* mixed precision: the schedule's forwards under autocast, this part's
     * weights converted once per step (backward runs with autocast off) */
    zs_status st = zsi_train_amp_begin(t, true);
    bool amp = st == ZS_OK;
    zs_alloc_stats a0, a1;
    zs_alloc_get_stats(&a0);
    zs_alloc_reset_peak();
    zs_scope_push();
    int64_t tp0 = zs_tp_bytes_sent(p->grid->tp);
    zs_alloc_tag_push("batch");
    if (st == ZS_OK)
        st = micro_batches(t, t->c.batch, t->c.batch_ctx, step, true, xs, xs + p->m);
    zs_alloc_tag_pop();
    if (st == ZS_OK)
        st = run_schedule(t, xs, xs + p->m, &sum);
    zs_scope_pop();
    if (amp)
        zsi_train_amp_end(t);
    zs_alloc_get_stats(&a1);
    if (a1.peak_bytes > a0.current_bytes + p->step_peak)
        p->step_peak = a1.peak_bytes - a0.current_bytes;
    free(xs);
    double t0 = zsi_train_now();
    if (t->dp && zs_dp_finish(t->dp) != ZS_OK && st == ZS_OK)
        st = ZS_ERR_STATE;
    zs_alloc_tag_push("gradient sums");
    if (st == ZS_OK)
        st = complete_grads(t);
    zs_alloc_tag_pop();
    /* the dp average's ring volume (ZeRO-1's reduce-scatter + all-gather
     * moves the same), at this rank's place in its dp group (t->rank is
     * the world rank) */
    t->comm_bytes = (t->size > 1 ? zs_onebit_ring_bytes(zs_numel(t->fp), 4, t->size,
                                                        zs_comm_rank(t->comm)) : 0) +
                    p->pipe_bytes;
    p->tp_bytes = zs_tp_bytes_sent(p->grid->tp) - tp0;
    /* the loss: the last stage's mean over micro-batches, to every stage,
     * then averaged over dp */
    zs_tensor *l = st == ZS_OK ? zs_scalar(ZS_F64, sum / p->m) : NULL;
    if (l && p->stages > 1)
        st = zs_comm_broadcast(p->grid->pp, l, p->stages - 1);
    if (l && st == ZS_OK && t->size > 1)
        st = zs_comm_allreduce(t->comm, l, true, ZS_ALLREDUCE_MPI);
    t->prof.comm_s += zsi_train_now() - t0;
    if (st != ZS_OK && grid_broken(p))
        name_groups(p);
    *loss = l && st == ZS_OK ? zs_item(l) : NAN;
    zs_release(l);
    return l ? st : st != ZS_OK ? st : ZS_ERR_NOMEM;
}

zs_status zsi_par_grad_norm(zs_trainer *t, double *norm)
{
    zsi_par *p = t->par;
    zs_module *m = t->m;
    bool tp0 = p->grid->me.tp == 0;
    double sq = 0;
    for (int i = 0; i < m->nparams; i++) {
        const char *name = m->param_names[i];
        int dim, blocks;
        bool split = zsi_gpt_param_split(name, &dim, &blocks);
        if ((!split && !tp0) || (!p->first && !strcmp(name, "wte.weight")))
            continue; /* counted by tp rank 0 / the first stage */
        zs_tensor *g = zs_grad(m->params[i]);
        const float *d = g ? zs_data(g) : NULL;
        for (int64_t k = 0; d && k < zs_numel(g); k++)
            sq += (double)d[k] * d[k];
    }
    zs_tensor *s = zs_scalar(ZS_F64, sq);
    zs_status st = s ? zs_comm_allreduce(p->grid->tp, s, false, ZS_ALLREDUCE_MPI)
                     : ZS_ERR_NOMEM;
    if (st == ZS_OK && p->stages > 1)
        st = zs_comm_allreduce(p->grid->pp, s, false, ZS_ALLREDUCE_MPI);
    if (st != ZS_OK && grid_broken(p))
        name_groups(p);
    *norm = st == ZS_OK ? sqrt(zs_item(s)) : NAN;
    zs_release(s);
    return st;
}


/* ---- validation on the split model ------------------------------------- */

/* The mean loss of the last stage's micro-batches of one validation
 * batch: every stage forwards its micro-batches in order (no backward,
 * under the caller's no-grad), the last one adding up their losses. */
static zs_status validate_batch(zs_trainer *t, zs_batch_fn fn, void *ctx, int64_t b,
                                double *sum)
{
    zsi_par *p = t->par;
    zs_tensor **xs = calloc(2 * (size_t)p->m, sizeof *xs);
    if (!xs)
        return zs_set_error_code(ZS_ERR_NOMEM, "trainer: out of memory");
    double busy = 0;
    zs_scope_push();
    zs_status st = micro_batches(t, fn, ctx, b, false, xs, xs + p->m);
    for (int i = 0; st == ZS_OK && i < p->m; i++) {
        mb_state ms = {NULL, NULL};
        st = forward(t, &ms, xs[i], xs[p->m + i], i, sum, &busy);
        zs_release(ms.in);
        zs_release(ms.out);
    }
    if (st == ZS_OK && p->pipe)
        st = zs_pipe_flush(p->pipe);
    zs_scope_pop();
    free(xs);
    return st;
}

double zsi_par_validate(zs_trainer *t)
{
    zsi_par *p = t->par;
    zs_batch_fn fn = t->c.eval_batch ? t->c.eval_batch : zs_token_batch;
    void *ctx = t->c.eval_batch ? t->c.eval_batch_ctx : t->c.eval_ctx;
    int64_t n = t->c.eval_batch ? t->c.eval_batches
                                : ((const zs_token_source *)ctx)->eval_batches;
    n = n > 0 ? n : 1;
    double sum = 0;
    zs_status st = ZS_OK;
    for (int64_t b = 0; st == ZS_OK && b < n; b++)
        st = validate_batch(t, fn, ctx, b, &sum);
    /* the last stage's mean, to every stage, averaged over dp */
    zs_tensor *l = st == ZS_OK ? zs_scalar(ZS_F64, sum / (double)(p->m * n)) : NULL;
    if (l && p->stages > 1)
        st = zs_comm_broadcast(p->grid->pp, l, p->stages - 1);
    if (l && st == ZS_OK && t->size > 1)
        st = zs_comm_allreduce(t->comm, l, true, ZS_ALLREDUCE_MPI);
    if (st != ZS_OK && grid_broken(p))
        name_groups(p);
    double v = l && st == ZS_OK ? zs_item(l) : NAN;
    zs_release(l);
    return v;
}
