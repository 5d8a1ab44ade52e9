/*
 * graph_step.c - zs_trainer's graph mode (zs_trainer_config.graph,
 * zs/graph.h): the first step is captured, later steps replayed.
 *
 * A step: the batch is made (a pure function of the step) and its
 * signature computed: the shapes and dtypes of x and y, the parameters'
 * dtype, and the model's training flags and dropout rates. The step
 * scalars (t->gsched, f64 {lr from the schedule, the optimizer's 1-based
 * step}) are written. With a graph of that signature, x and y are copied
 * into the captured batch buffers and the graph replays; otherwise (the
 * first step, the last shorter batch, a changed dropout rate) the
 * previous graph is dropped and the step is captured on fresh batch
 * buffers: dry first (zs_graph_capture_begin_dry: recorded without
 * computing, so the capture holds almost no memory; the passes and the
 * memory plan follow and the step is the graph's first replay, so the
 * capture step peaks at the plan's arena, not at eager's peak), and when
 * the dry capture read a value on the host (a loss function that prints
 * its loss) again, eagerly while being recorded (noted in the log).
 *
 * The graph holds the whole step: forward, backward, the accumulation
 * into the flat gradient, the gradient's sum of squares, the clip factor
 * computed from it on the device (zs_clip_coef_of) and the optimizer
 * update (zs_optim_step_dyn), which reads lr, the step (Adam's bias
 * corrections) and the clip factor from memory when it runs, so nothing
 * a step changes is frozen at the captured value. The values and their
 * float rounding are eager's (zsi_train_update: zs_grad_norm, zs_clip_coef,
 * zs_optim_step_scaled): the same bits. A NaN norm makes the update
 * refuse before writing (eager stops before the update too) and the step
 * fails with eager's message. The loss and the sum of squares are read
 * back after the replay, for the log.
 *
 * Mixed precision (bf16, fp16, fp8) runs as eager does
 * (zsi_train_accumulate, zsi_train_micro): the capture is under the
 * trainer's autocast, so the step's one conversion of the flat f32
 * weights into fp_low (zs_autocast_cache_flat: a copy_ into that
 * pre-existing buffer) is a node, kept by dead-code elimination as a
 * write of a graph input and replayed every step; the loss times the
 * loss scale is a node too, so the scale is part of the signature (a new
 * scale, after an overflow or a run of clean steps, is a new capture).
 * With a loss scaler (f16, fp8) the unscale, the Inf/NaN check, the skip,
 * the norm and the update run eagerly after the replay (zsi_train_update,
 * the eager code itself): skipped steps are eager's. 1-bit Adam's update
 * stays eager too.
 *
 * Passes after a capture: dead-code elimination keeping the loss and the
 * sum of squares, the slice-gradient pass, pointwise fusion,
 * rematerialization, per-use weight casts (mixed precision: each reader of
 * fp_low converts its own range, and fp_low is freed while the graph
 * replays), then the memory plan (every intermediate in one arena). With
 * dump_graph the first captured graph is written before and after them,
 * and its replays after the capture step are timed node by node
 * (zs_graph_profile): the profile is appended to the text dump when the
 * graph is dropped (a recapture, the trainer freed). Later captures (the
 * last, shorter batch of an epoch, and the full one again after it) are
 * not written: each would replace the file, which then described the
 * short batch's graph, never replayed.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "train/internal.h"
#include "zs/graph.h"

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

static uint64_t tensor_sig(uint64_t h, const zs_tensor *t)
{
    h = fnv(h, &t->dtype, sizeof t->dtype);
    h = fnv(h, &t->ndim, sizeof t->ndim);
    return fnv(h, t->shape, (size_t)t->ndim * sizeof *t->shape);
}

/* Training flags and dropout rates of m and its children. */
static uint64_t module_sig(uint64_t h, const zs_module *m)
{
    h = fnv(h, &m->training, sizeof m->training);
    if (m->vt && m->vt->type && !strcmp(m->vt->type, "Dropout") && m->impl)
        h = fnv(h, m->impl, sizeof(double));
    for (int i = 0; i < m->nchildren; i++)
        h = module_sig(h, m->children[i]);
    return h;
}

/* The loss scale is part of the signature: the captured step multiplies
 * the loss (and the backward seed) by it as an attribute, so a scale the
 * scaler changed (backed off after an overflow, grown after a run of clean
 * steps) is a new capture, rare in a run. */
static uint64_t signature(const zs_trainer *t, const zs_tensor *x,
                          const zs_tensor *y)
{
    uint64_t h = 0xcbf29ce484222325ull;
    h = tensor_sig(tensor_sig(h, x), y);
    h = fnv(h, &t->fp->dtype, sizeof t->fp->dtype);
    h = fnv(h, &t->c.precision, sizeof t->c.precision);
    double scale = t->scaler ? zs_grad_scaler_get_scale(t->scaler) : 1;
    h = fnv(h, &scale, sizeof scale);
    return module_sig(h, t->m);
}

/* With dump_graph: the replay profile of the graph, appended to the text
 * dump (before the graph is dropped). */
static void dump_profile(zs_trainer *t)
{
    if (!t->c.dump_graph || !t->graph || !t->gprofiled)
        return;
    t->gprofiled = false;
    FILE *f = fopen(t->c.dump_graph, "a");
    if (f) {
        zs_graph_profile_dump(t->graph, f);
        fclose(f);
    }
}

/* Drops the graph and its buffers (not the step scalars). */
static void drop_graph(zs_trainer *t)
{
    dump_profile(t);
    zs_graph_free(t->graph);
    zs_release(t->gx);
    zs_release(t->gy);
    zs_release(t->gloss);
    zs_release(t->gsq);
    t->graph = NULL;
    t->gx = t->gy = t->gloss = t->gsq = NULL;
}

void zsi_train_graph_free(zs_trainer *t)
{
    drop_graph(t);
    zs_release(t->gsched);
    t->gsched = NULL;
}

/* Whether the clip and the update go into the graph: not with a loss
 * scaler (its unscale, check and skip are host decisions) nor 1-bit Adam. */
static bool update_in_graph(const zs_trainer *t)
{
    zs_optim_config c = t->c.optim;
    return !t->scaler && c.kind != ZS_ONEBIT_ADAM;
}

/* Writes the step scalars of step `step`: {lr, the optimizer's next step}. */
static zs_status fill_sched(zs_trainer *t, int64_t step)
{
    if (!t->gsched) {
        zsi_tracking_pause();
        t->gsched = zsi_new_tensor_on(t->fp->device, ZS_F64, 1, (int64_t[]){2});
        zsi_tracking_resume();
        if (!t->gsched)
            return ZS_ERR_NOMEM;
    }
    double v[2] = {zs_lr_at(&t->c.schedule, step), (double)(zs_optim_steps(t->o) + 1)};
    return zs_copy_from_buffer(t->gsched, v, sizeof v);
}

/* A persistent copy of b (outside any scope), for the batch buffers. */
static zs_tensor *buffer_like(const zs_tensor *b)
{
    zsi_tracking_pause();
    zs_tensor *r = zsi_new_tensor_on(b->device, b->dtype, b->ndim, b->shape);
    zsi_tracking_resume();
    if (r && zs_copy_(r, b) != ZS_OK) {
        zs_release(r);
        r = NULL;
    }
    return r;
}

static zs_status dump(const zs_trainer *t, const char *mode, const char *title)
{
    const char *path = t->c.dump_graph;
    size_t n = strlen(path);
    char *dot = malloc(n + 5);
    if (!dot)
        return ZS_ERR_NOMEM;
    memcpy(dot, path, n);
    memcpy(dot + n, ".dot", 5);
    FILE *f = fopen(path, mode), *d = fopen(dot, mode);
    zs_status st = f && d ? ZS_OK : zs_set_error("dump graph: cannot write %s",
                                                 f ? dot : path);
    if (st == ZS_OK)
        st = zs_graph_dump_text(t->graph, f, title);
    if (st == ZS_OK)
        st = zs_graph_dump_dot(t->graph, d, title);
    if (f)
        fclose(f);
    if (d)
        fclose(d);
    free(dot);
    return st;
}

/* The passes on a fresh capture, with the dumps around them. */
static zs_status optimise(zs_trainer *t)
{
    zs_tensor *keep[] = {t->gloss, t->gsq};
    int nkeep = t->gsq ? 2 : 1;
    zs_status st = ZS_OK;
    bool first = t->captures == 1; /* the dump describes the first graph */
    if (t->c.dump_graph && first)
        st = dump(t, "w", "captured");
    int removed = st == ZS_OK ? zs_graph_dce(t->graph, nkeep, keep) : -1;
    if (removed < 0)
        return ZS_ERR_STATE;
    int gathered = zs_graph_fuse_slices(t->graph, nkeep, keep);
    if (gathered < 0)
        return ZS_ERR_STATE;
    int fused = zs_graph_fuse(t->graph, nkeep, keep);
    if (fused < 0)
        return ZS_ERR_STATE;
    int remat = zs_graph_remat(t->graph, nkeep, keep);
    if (remat < 0)
        return ZS_ERR_STATE;
    int casts = t->fp_low ? zs_graph_split_casts(t->graph, t->fp_low, nkeep, keep) : 0;
    if (casts < 0)
        return ZS_ERR_STATE;
    if (casts > 0) { /* nothing reads fp_low now; an eager step makes it again */
        zs_release(t->fp_low);
        t->fp_low = NULL;
    }
    if ((st = zs_graph_plan_memory(t->graph, nkeep, keep)) != ZS_OK)
        return st;
    if (t->c.dump_graph && first &&
        (st = dump(t, "a", "after dce, fusion and the memory plan")) != ZS_OK)
        return st;
    zs_graph_stats s;
    zs_graph_get_stats(t->graph, &s);
    t->garena = s.planned_bytes;
    if (t->c.log && t->rank == 0) {
        fprintf(t->c.log, "graph: captured step %lld: %d nodes after dce (%d removed), slice "
                "gradients (%d folded), fusion (%d folded), rematerialization (%d "
                "recomputed) and per-use weight casts (%d), %.1f MFLOP; intermediates "
                "%.2f MiB, planned arena %.2f MiB\n",
                (long long)t->step, s.nodes, removed, gathered, fused, remat, casts,
                s.flops / 1e6,
                (double)s.intermediate_bytes / 1048576,
                (double)s.planned_bytes / 1048576);
    }
    return ZS_OK;
}

/* An untracked header over t's elements (NULL for NULL): the scope owns
 * t itself. */
static zs_tensor *own_alias(const zs_tensor *t)
{
    if (!t)
        return NULL;
    zsi_tracking_pause();
    zs_tensor *r = zsi_new_view(t, t->ndim, t->shape, t->strides, t->offset);
    zsi_tracking_resume();
    return r;
}

/* Records the step into a new t->graph (dry: zs_graph_capture_begin_dry)
 * on the batch buffers: forward, backward, the sum of squares of the flat
 * gradient and, with t->gupdate, the clip factor and the update; t->gloss
 * and t->gsq alias the loss and the sum of squares. */
static zs_status record_step(zs_trainer *t, bool dry)
{
    if (!(t->graph = dry ? zs_graph_capture_begin_dry() : zs_graph_capture_begin()))
        return ZS_ERR_STATE;
    /* as zsi_train_accumulate and zsi_train_micro: autocast (and the one
     * conversion of the flat weights into fp_low, a copy_ node of the
     * graph) around forward and backward, the loss times the scale */
    zs_status st = zsi_train_amp_begin(t, true);
    bool amp = st == ZS_OK;
    zs_tensor *l = NULL;
    if (st == ZS_OK)
        l = t->c.loss ? t->c.loss(t->c.loss_ctx, t->m, t->gx, t->gy)
                      : zs_gpt_loss(t->m, t->gx, t->gy);
    double f = t->scaler ? zs_grad_scaler_get_scale(t->scaler) : 1;
    zs_tensor *scaled = l && f != 1 ? zs_mul_scalar(l, f) : l;
    if (st == ZS_OK && (!scaled || zs_backward(scaled, NULL, false) != ZS_OK))
        st = ZS_ERR_STATE;
    if (amp)
        zsi_train_amp_end(t);
    /* the scaler unscales the gradients first: its norm runs eagerly */
    zs_tensor *sq = NULL, *coef = NULL;
    if (st == ZS_OK && t->c.clip > 0 && !t->scaler && !(sq = zs_sum_squares(t->fg, NULL)))
        st = ZS_ERR_STATE;
    if (st == ZS_OK && t->gupdate) {
        if (sq && !(coef = zs_clip_coef_of(sq, t->c.clip)))
            st = ZS_ERR_STATE;
        if (st == ZS_OK)
            st = zs_optim_step_dyn(t->o, t->gsched, coef);
        if (st != ZS_OK && !dry && sq && isnan(zs_item(sq))) /* refused: eager's message */
            st = zs_set_error_code(ZS_ERR_STATE, "step %lld: the gradient norm is "
                                   "NaN", (long long)t->step);
    }
    zs_status end = zs_graph_capture_end(t->graph);
    if (st == ZS_OK)
        st = end;
    t->gloss = own_alias(l);
    t->gsq = own_alias(sq);
    return st;
}

/* Captures the step on batch (x, y), first dry (nothing computed while
 * recording: the capture holds almost no memory, and the step is then
 * the graph's first replay, after the passes and the memory plan); when
 * the dry capture read a value on the host (a custom loss that inspects
 * one), again running the kernels (that step is the eager step, the
 * graph replayed from the next). ZS_GRAPH_DRY=0 in the environment skips
 * the dry attempt. */
static zs_status capture(zs_trainer *t, zs_tensor *x, zs_tensor *y, uint64_t sig)
{
    drop_graph(t);
    t->gupdate = update_in_graph(t);
    if (!(t->gx = buffer_like(x)) || !(t->gy = buffer_like(y)))
        return ZS_ERR_NOMEM;
    zs_alloc_stats a0, a1;
    zs_alloc_get_stats(&a0);
    zs_alloc_reset_peak(); /* the capture step's own peak, for the log */
    zs_alloc_tag_push("graph capture");
    const char *env = getenv("ZS_GRAPH_DRY");
    bool dry = !env || strcmp(env, "0");
    zs_status st = record_step(t, dry);
    int64_t reads = zs_graph_dry_reads(t->graph);
    if (dry && reads) {
        if (t->c.log && t->rank == 0)
            fprintf(t->c.log, "graph: step %lld: the dry capture read %lld value%s on "
                    "the host (the loss function inspects a value?): captured again "
                    "running the kernels\n", (long long)t->step, (long long)reads,
                    reads == 1 ? "" : "s");
        zs_graph_free(t->graph);
        zs_release(t->gloss);
        zs_release(t->gsq);
        t->graph = NULL;
        t->gloss = t->gsq = NULL;
        dry = false;
        st = record_step(t, false);
    }
    t->gdry = dry;
    t->gsig = sig;
    t->captures++;
    if (st == ZS_OK)
        st = optimise(t);
    if (st == ZS_OK && dry && (st = zs_graph_replay(t->graph)) != ZS_OK && t->gsq &&
        isnan(zs_item(t->gsq))) /* the update refused: eager's message */
        st = zs_set_error_code(ZS_ERR_STATE, "step %lld: the gradient norm is NaN",
                               (long long)t->step);
    zs_alloc_tag_pop();
    zs_alloc_get_stats(&a1);
    t->gpeak = a1.peak_bytes > a0.current_bytes ? a1.peak_bytes - a0.current_bytes : 0;
    if (st == ZS_OK && dry) { /* the first replay placed the kernels' scratch */
        zs_graph_stats s;
        zs_graph_get_stats(t->graph, &s);
        t->garena = s.planned_bytes;
    }
    if (st == ZS_OK && t->c.dump_graph && t->captures == 1) { /* the replays after
                                                              * this step, timed */
        st = zs_graph_profile(t->graph, true);
        t->gprofiled = st == ZS_OK;
    }
    if (st == ZS_OK && t->c.log && t->rank == 0)
        fprintf(t->c.log, "graph: memory: the capture step (%s) peak %.2f MiB above its "
                "start, plan peak (arena) %.2f MiB\n", dry ? "dry capture, passes, "
                "first replay" : "eager, recorded", (double)t->gpeak / 1048576,
                (double)t->garena / 1048576);
    if (st != ZS_OK)
        drop_graph(t);
    return st;
}

/* The gradients of step `step` into the flat gradient; *loss, *sq. */
static zs_status gradients(zs_trainer *t, int64_t step, double *loss, double *sq)
{
    zs_tensor *x, *y;
    zs_status st = t->c.batch(t->c.batch_ctx, step, &x, &y);
    if (st != ZS_OK)
        return st;
    if (!x || !y || x->ndim < 1 || y->ndim < 1 || x->shape[0] != y->shape[0])
        return zs_set_error("trainer: batch %lld has %lld input and %lld target "
                            "rows; they must be equal", (long long)step,
                            (long long)(x && x->ndim ? x->shape[0] : -1),
                            (long long)(y && y->ndim ? y->shape[0] : -1));
    t->targets += zs_numel(y);
    uint64_t sig = signature(t, x, y);
    if ((st = fill_sched(t, step)) != ZS_OK)
        return st;
    double t0 = zsi_train_now();
    if (t->graph && sig == t->gsig) {
        if ((st = zs_copy_(t->gx, x)) == ZS_OK && (st = zs_copy_(t->gy, y)) == ZS_OK)
            st = zs_graph_replay(t->graph);
    } else {
        st = capture(t, x, y, sig);
    }
    t->prof.forward_s += zsi_train_now() - t0; /* forward, backward (and update) */
    if (t->gsq && isnan(*sq = zs_item(t->gsq))) /* the update refused: eager's message */
        return zs_set_error_code(ZS_ERR_STATE, "step %lld: the gradient norm is NaN",
                                 (long long)step);
    if (st != ZS_OK)
        return st;
    *loss = zs_item(t->gloss);
    return ZS_OK;
}

zs_status zsi_train_graph_step(zs_trainer *t, int64_t step, double *loss,
                               double *gnorm)
{
    double sq = 0;
    zs_scope_push();
    zs_status st = gradients(t, step, loss, &sq);
    zs_scope_pop();
    *gnorm = 0;
    if (st != ZS_OK)
        return st;
    if (!t->gupdate) /* unscale, the Inf/NaN check and skip, norm, update: eager */
        return zsi_train_update(t, step, gnorm);
    t->skipped = false;
    t->step_scale = 1;
    *gnorm = t->c.clip > 0 ? sqrt(sq) : 0; /* as zsi_train_update */
    zs_optim_set_steps(t->o, zs_optim_steps(t->o) + 1); /* the graph updated */
    return ZS_OK;
}

zs_status zs_trainer_graph_memory(const zs_trainer *t, size_t *step_peak,
                                  size_t *arena)
{
    if (!t || !t->graph)
        return zs_set_error("trainer graph memory: %s", t ? "no graph captured "
                            "(graph mode off, or no step run yet)" : "no trainer");
    zs_graph_stats s; /* the arena now: the kernels' scratch joins it after
                       * the first replay (graph/passes.c) */
    zs_graph_get_stats(t->graph, &s);
    *step_peak = t->gpeak;
    *arena = s.planned_bytes;
    return ZS_OK;
}
