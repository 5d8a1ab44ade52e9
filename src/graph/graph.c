/*
 * graph.c - capture and replay of operator calls (zs/graph.h).
 *
 * A dry capture (zs_graph_capture_begin_dry) records the same nodes but
 * the driver computes nothing (ops/dispatch.c, "dry capture"): results get
 * no memory, forward calls that record an autograd node run on zeros to
 * make their aux results, in-place calls do not run; core counts host
 * reads of the values (zsi_dry_touch). The RNG position is restored at its
 * end, so the first replay draws what eager would.
 *
 * Capture installs this thread's recorder in the driver (zsi_capture,
 * ops/dispatch.c): after the kernel of each outermost zsi_run/zsi_run_n
 * call ran, record() appends a node holding the call whole (graph/
 * internal.h). Calls a kernel makes inside itself are not recorded: the
 * outer kernel makes them again on replay. Views (ZSI_VIEW) are not
 * recorded either: a view shares its input's storage, so the nodes that
 * read it see what a replay writes there.
 *
 * Aux results (norm statistics, masks, contiguous inputs kept for the
 * backward rule) are retained with the node and handed back to the
 * kernel on replay in call.aux, where zsi_aux_new / zsi_aux_copy (ops/
 * aux.c) reuse them, so the recorded backward nodes, which read them
 * through their saved aliases, see the replayed values.
 *
 * Design choices (the brief's points, and where they differ):
 * - Random numbers: the dropout kernel reserves its draws from the
 *   global stream (zs_rng_reserve) when it runs, so a replay reads the
 *   generator's offset then and advances it as eager would: nothing to do
 *   here, and a replayed step is bit-identical to the eager one.
 * - Host values that change every step (the learning rate, Adam's bias
 *   corrections, the clip factor): not attributes, which a replay would
 *   freeze, but memory the kernels read when they run: zs_trainer fills
 *   an f64 {lr, step} tensor before each replay, a clip_coef node turns
 *   the in-graph sum of squares into the factor, and the update
 *   (adam_update_dyn / sgd_update_dyn, ops/optim_update.c) computes its
 *   float scalars from them exactly as the eager update does (same
 *   bits). So the whole step, optimizer included, is one replay
 *   (src/train/graph_step.c).
 * - Pointwise fusion (graph/fuse.c, zs_graph_fuse): a vectorised
 *   interpreter of the group over cache-sized tiles, not C generated and
 *   compiled at run time: it reuses each member's own kernel (ISA
 *   dispatch, bf16 path), so the bits are the unfused chain's by
 *   construction and no compiler is needed at run time. Measured (AMD
 *   EPYC, 2 threads, a machine shared with other jobs, best of 3 runs of
 *   5 x 10 replays): tanh -> mul -> add -> mul_scalar on [2048, 1536]
 *   f32 (the shape of GPT small's MLP gradient), 4 nodes unfused 18.3 ms
 *   and a 24 MiB arena, fused 13.9 ms (1.3x) and 12 MiB; with 8 KiB tiles
 *   the fused node was no faster (14.8 vs 13.1 ms: one kernel call per
 *   member per tile). In a GPT step the only chains left are the GELU
 *   derivative times the gradient (two nodes per layer): the forward's
 *   epilogues are fused already (linear_gelu, linear_residual), so the
 *   effect on a whole step is small.
 * - The capture is lean (graph/lean.c): a value eager drops during the
 *   captured step loses its memory then, so the capture step peaks where
 *   eager does.
 * - Measured (issue 27, second round; GPT small preset: 6 layers, width
 *   384, batch 8 x 256, fp32, AMD EPYC with AVX-512, 2 threads on a
 *   machine shared with ~6 other jobs, triad 9.9 GB/s at the time):
 *   the capture step's allocator peak was 1205 MiB before the lean
 *   capture against 382 eager; now 382.5 MiB, equal to an eager step's
 *   382.5 (1.00x; GPT tiny in test_graph_lean: 1.000x). The dump of the
 *   step: 142 GFLOP and 2.97 GB of operator traffic, so at 59 GFLOP/s
 *   fp32 peak the GEMMs alone take 2.4 s, while all traffic at 30-45
 *   GB/s is 66-100 ms: what a static graph can skip is bytes, a few % of
 *   a step at most. The largest skippable item was the q, k, v gradient
 *   assembly (3 zero-filled slice_backward buffers, 2 adds, a permuting
 *   copy: 113 MB per layer, 680 MB a step) -> slices.c's one node (19 MB
 *   per layer): 566 MB less, predicted 13-19 ms a step (0.5%). Next in
 *   size: the bias-gradient sums re-reading each output gradient (174 MB,
 *   an epilogue of the weight-gradient GEMM), the residual-gradient adds
 *   (~120 MB), the attention output's permuting copy (38 MB); dispatch
 *   per replayed node (282 nodes) is microseconds against seconds. The
 *   1.15x tokens/s target is therefore out of reach of graph passes on
 *   this CPU at this size: the step is GEMM-bound.
 * - Measured (issue 27, third round: the optimizer in the graph and
 *   rematerialization, graph/remat.c; bench/gpt --graph-only --quick,
 *   GPT small, 8 x 256, 2 threads, AMD EPYC with AVX-512 under a load
 *   average of 23-27 on 2 cores, so the times are noise): fp32: the
 *   plan's arena 286.5 MiB against the captured step's eager peak 382.5
 *   (0.75x; GPT tiny in test_remat 0.77x); a replayed step's memory
 *   (its transient peak + the arena) 292.9 MiB against eager's 382.5 =
 *   0.766x; the whole run's allocator peak 0.902x (the capture step
 *   itself runs eagerly at eager's peak, and parameters, gradients and
 *   Adam's moments count in both). bf16: arena 213.0 MiB against 249.0
 *   (0.86x), a replayed step 246.7 MiB against eager's 225.0 (1.10x:
 *   the bf16 GEMMs' f32 scratch blocks, ~34 MiB, are the kernels' own
 *   temporaries, outside the plan, and the GeLU output is not recomputed
 *   in bf16: its saved pre-activation is rounded, so the bits would
 *   differ). Tokens/s graph/eager: fp32 0.956, bf16 1.069 (3 timed steps
 *   on the loaded machine). Predicted cost of the recomputation: 6 GeLUs
 *   over 12.6 MB, 12 layer norms and 6 copies over 3.1 MB, ~150 MB of
 *   traffic and 2.4e7 GeLU evaluations, ~40-60 ms of a ~2.5 s step
 *   (2%); the in-graph update runs the same one pass over the flat
 *   buffers as eager (no gain expected, none measured beyond noise).
 *   Where the rest of a step goes is unchanged from the second round: the
 *   GEMMs (142 GFLOP), so the 1.15x target stays out of reach of graph
 *   passes here.
 * - Fourth round (issue 27): the third round's "whole run" peak was the
 *   last timed step's (bench/gpt reset the peak every step). Counted over
 *   the whole run, an eager capture puts the graph at eager's peak
 *   (1.000x), hence the dry capture (the step then runs as the first
 *   replay). Three more savings: the arena is an exact block
 *   (zs_alloc_exact; its size class had added 33.5 MiB to 286.5), the
 *   logits' gradient is written over the dead logits (passes.c: 32 MiB at
 *   the step's peak), and the layer-norm recomputation now happens in the
 *   trainer (an aux result viewing the node's own weight, inside the flat
 *   parameter buffer, had counted as a write and blocked all 12). bf16:
 *   the 16-bit epilogue's GeLU reads the bf16-rounded pre-activation, so
 *   its output is recomputed too. Measured (bench/gpt --graph-only, GPT
 *   small 8 x 256, 2 threads, AMD EPYC with AVX-512, load average 13-16
 *   on 2 cores): fp32 arena 227.5 MiB, step 233.9 against eager's 382.5
 *   (0.611x), whole run 425.9 against 574.5 MiB (0.741x); bf16 arena
 *   117.0 MiB, step 150.7 against 210.7 (0.715x), whole run 366.8 against
 *   426.7 (0.860x; the bf16 GEMM's ~34 MiB f32 scratch is still outside
 *   the plan: without it ~0.78x). Loss effect of the bf16 GeLU change
 *   (eager, GPT small bf16, 4 x 128, 30 steps on a learnable pattern):
 *   step 0 differs by 1.4e-4 (8.37548 vs 8.37562), then the two bf16
 *   trajectories drift by up to 0.04 (mean -0.007), noise-sized. The
 *   replay profiler (profile.c) puts a replay at 93% GEMM nodes (matmul,
 *   linear*, attention); everything else ~360 ms of 5.2 s on the loaded
 *   machine, the largest: remat:gelu 63 ms, bias-gradient sums 40 ms (25
 *   nodes at 4 GB/s), slice_gather 38, GeLU backward 37, Adam 31; the 77
 *   gradient accumulations (axpy_) 16 ms. Even removing all of it gives
 *   <= 1.08x: the 1.15x target is out of reach of graph passes here.
 * - Fifth round (issue 27, 2026-11-28; bench/gpt --graph-only now
 *   alternates the eager and graph trainers' timed steps, each trainer's
 *   memory counted apart; GPT small 8 x 256, 2 threads, 2-core AMD EPYC
 *   Zen 4 share, medians of five runs against five of the previous head
 *   with the same bench): the bf16 slice gather was a zeroed result and
 *   one zsk_axpy per slot (21 ms a step), now rows of an odometer with
 *   an integer map for bf16 (4-5 ms); remat's bf16 GeLU widened element
 *   by element through a call (30 -> 10-12 ms); per-use weight casts
 *   (casts.c) drop the 23.5 MiB flat bf16 weight copy from the graph's
 *   peak. Whole-run peak graph/eager: bf16 0.839 -> 0.780, fp32 0.747;
 *   tokens/s graph/eager: bf16 0.927 -> 0.962, fp32 0.982 -> 0.986 (runs
 *   spread +-4%). The per-operator tables of one interleaved run (bf16,
 *   ms a step, eager / graph): GEMM nodes 472 / 448, attention 79 / 77;
 *   graph only: remat 15, casts 6, slice gather 4; eager only: copy_ of
 *   the flat weights 3.6, slice_backward + adds 5, fills 2.4, copies 3.
 *   What separates the two is ~15 ms of a ~620 ms step either way.
 * - Sixth round (issue 27, 2026-11-28, same machine kind): the kernels'
 *   scratch joins the plan (passes.c, zsi_graph_plan_scratch; measured
 *   and served by the allocator's scratch windows, core/alloc.c). LeNet
 *   (bench/lenet --graph --quick, three runs): step memory graph/eager
 *   1.10-1.29 -> 0.87-0.91 (arena 3.84 -> 3.97 MiB while 1.3-2.7 MiB of
 *   replay scratch went away). GPT small: arena 221.5 -> 233.8 MiB fp32,
 *   117.0 -> 124.9 bf16, step memory unchanged (233.9 / 125.3 before):
 *   the GEMMs' scratch peaks where the activations do, nothing dead to
 *   reuse. The Amdahl bound of the speed target, from the replay profile
 *   (bf16, 652 ms a step): GEMM nodes 483 ms and attention 88 ms leave 81
 *   ms that a graph could remove at best, 652 / 571 = 1.14x with all of
 *   it gone; fp32 (eager 1068 ms): 920 ms of GEMMs and 77 of attention,
 *   1068 / 997 = 1.07x with everything else gone. 1.15x needs faster
 *   GEMMs in graph mode only, which eager would get as well.
 * - Replay runs under no-grad with scope tracking paused: kernels that
 *   call operators inside themselves record nothing and leak nothing.
 */
#include <stdlib.h>
#include <string.h>

#include "graph/internal.h"
#include "zs/ops.h"

static _Thread_local zs_graph *current;

static zs_status record(const zsi_call *c, zsi_kernel_fn k, zs_tensor *out);

static zs_graph *begin(bool dry)
{
    if (current) {
        zs_set_error("graph capture: this thread already captures a graph "
                     "(end it with zs_graph_capture_end first)");
        return NULL;
    }
    zs_graph *g = calloc(1, sizeof *g);
    if (!g) {
        zs_set_error_code(ZS_ERR_NOMEM, "graph capture: out of memory");
        return NULL;
    }
    g->capturing = true;
    g->dry = dry;
    if (dry) { /* nothing computed: nothing to free on the way */
        zs_rng_get_state(&g->rng_seed, &g->rng_offset);
        zsi_dry_reads = 0;
        zsi_dry_capture = true;
    } else {
        zsi_gcap_init(g); /* without it the capture keeps every value */
    }
    current = g;
    zsi_capture = record;
    return g;
}

zs_graph *zs_graph_capture_begin(void) { return begin(false); }

zs_graph *zs_graph_capture_begin_dry(void) { return begin(true); }

int64_t zs_graph_dry_reads(const zs_graph *g) { return g ? g->dry_reads : 0; }

/* Ends the dry part of a capture: the kernels that ran reserved random
 * numbers the first replay reserves again. */
static void end_dry(zs_graph *g)
{
    if (!g->dry || !zsi_dry_capture)
        return;
    zsi_dry_capture = false;
    zsi_dry_release();
    zs_rng_set_state(g->rng_seed, g->rng_offset);
    g->dry_reads = zsi_dry_reads;
    zsi_dry_reads = 0;
    g->dropped++; /* a replay without a plan gives the values memory */
}

zs_status zs_graph_capture_end(zs_graph *g)
{
    if (!g || g != current)
        return zs_set_error("graph capture end: %s", g ? "this graph is not the "
                            "one this thread captures" : "no graph");
    current = NULL;
    zsi_capture = NULL;
    g->capturing = false;
    end_dry(g);
    zsi_gcap_sweep(g);
    zsi_gcap_deinit(g);
    if (g->failed)
        return zs_set_error_code(ZS_ERR_NOMEM, "graph capture: a call could not "
                                 "be recorded (out of memory); the graph cannot "
                                 "be replayed");
    if (g->dry_reads) {
        g->failed = true;
        return zs_set_error_code(ZS_ERR_STATE, "graph capture: the dry capture's "
                                 "values were read on the host %lld time%s (zs_item, "
                                 "zs_data, ...: a value that is not computed yet); "
                                 "capture the step with zs_graph_capture_begin, "
                                 "which runs the kernels", (long long)g->dry_reads,
                                 g->dry_reads == 1 ? "" : "s");
    }
    return ZS_OK;
}

void zsi_gnode_free(zsi_gnode *n)
{
    if (!n)
        return;
    for (int i = 0; n->in && i < n->call.nin; i++)
        zs_release(n->in[i]);
    free(n->in);
    for (int k = 0; k < ZSI_MAX_OUT; k++)
        zs_release(n->outs[k]);
    for (int k = 0; k < ZSI_MAX_AUX; k++)
        zs_release(n->aux[k]);
    if (n->impl_free)
        n->impl_free(n->impl);
    free(n->scratch);
    free(n);
}

/* The driver's default cost (ops/dispatch.c): flops per element, every
 * input read, the result written. */
static zsi_cost cost_of(const zsi_call *c, const zs_tensor *out)
{
    if (c->def->cost)
        return c->def->cost(c, out);
    double n = (double)zs_numel(out);
    zsi_cost k = {c->def->flops * n, 0, n * (double)zs_dtype_size(out->dtype)};
    for (int i = 0; i < c->nin; i++)
        k.bytes_read += (double)zs_nbytes(c->in[i]);
    return k;
}

bool zsi_gnode_reads(const zsi_gnode *n, const zs_storage *s)
{
    for (int j = 0; j < n->call.nin; j++)
        if (n->in[j]->storage == s)
            return true;
    return false;
}

bool zsi_gnode_writes(const zsi_gnode *n, const zs_storage *s)
{
    for (int k = 0; k < ZSI_MAX_OUT; k++)
        if (n->outs[k] && n->outs[k]->storage == s)
            return true;
    for (int k = 0; k < ZSI_MAX_AUX; k++)
        if (n->aux[k] && n->aux[k]->storage == s && !zsi_gnode_reads(n, s))
            return true;
    if (n->call.def->inplace)
        for (int j = 0; j < (n->call.def->inplace_in0 ? 1 : n->call.nin); j++)
            if (n->in[j]->storage == s)
                return true;
    return false;
}

bool zsi_graph_insert(zs_graph *g, int at, zsi_gnode *n)
{
    if (g->n == g->cap) {
        int cap = g->cap ? 2 * g->cap : 256;
        zsi_gnode **p = realloc(g->nodes, (size_t)cap * sizeof *p);
        if (!p)
            return false;
        g->nodes = p;
        g->cap = cap;
    }
    memmove(g->nodes + at + 1, g->nodes + at, (size_t)(g->n - at) * sizeof *g->nodes);
    g->nodes[at] = n;
    g->n++;
    return true;
}

static bool push(zs_graph *g, zsi_gnode *n) { return zsi_graph_insert(g, g->n, n); }

/* The node's own header over t's elements (shape, strides, offset, the
 * storage retained), untracked: retaining t itself would add a reference
 * its scope and its creator do not expect (a scoped tensor released by
 * its creator is released again by the scope while the count is above
 * zero), which is why autograd saves aliases too (zsi_save). */
static zs_tensor *alias(const zs_tensor *t)
{
    return zsi_new_view(t, t->ndim, t->shape, t->strides, t->offset);
}

/* zsi_capture_fn: the call c just ran kernel k into out (c NULL: a call
 * is about to allocate). */
static zs_status record(const zsi_call *c, zsi_kernel_fn k, zs_tensor *out)
{
    zs_graph *g = current;
    if (!g)
        return ZS_OK;
    if (!c) { /* a call is about to allocate its results */
        zsi_gcap_sweep(g);
        return ZS_OK;
    }
    zsi_gnode *n = calloc(1, sizeof *n);
    if (n)
        n->in = calloc((size_t)(c->nin ? c->nin : 1), sizeof *n->in);
    if (!n || !n->in) {
        free(n);
        g->failed = true;
        return zs_set_error_code(ZS_ERR_NOMEM, "graph capture: out of memory "
                                 "recording %s", c->def->op.name);
    }
    n->call = *c;
    n->kernel = k;
    memcpy(n->attrs, c->attrs, c->def->attr_size);
    bool ok = true;
    zsi_tracking_pause();
    for (int i = 0; i < c->nin; i++)
        ok &= (n->in[i] = alias(c->in[i])) != NULL;
    for (int j = 0; j < c->nout && j < ZSI_MAX_OUT; j++)
        ok &= !c->outs[j] || (n->outs[j] = alias(c->outs[j]));
    if (!n->outs[0])
        ok &= (n->outs[0] = alias(out)) != NULL;
    for (int j = 0; j < ZSI_MAX_AUX; j++)
        ok &= !c->aux[j] || (n->aux[j] = alias(c->aux[j]));
    zsi_tracking_resume();
    n->call.in = n->in;
    n->call.attrs = n->attrs;
    n->call.aux = n->aux;
    n->call.outs = n->outs;
    n->cost = cost_of(c, out);
    if (!ok || !push(g, n)) {
        zsi_gnode_free(n);
        g->failed = true;
        return zs_set_error_code(ZS_ERR_NOMEM, "graph capture: out of memory "
                                 "recording %s", c->def->op.name);
    }
    for (int i = 0; i < c->nin; i++) /* inputs first: made before, or by a node */
        zsi_gcap_note(g, n->in[i], true);
    for (int j = 0; j < ZSI_MAX_OUT; j++)
        zsi_gcap_note(g, n->outs[j], false);
    for (int j = 0; j < ZSI_MAX_AUX; j++)
        zsi_gcap_note(g, n->aux[j], false);
    zsi_gcap_sweep(g);
    return ZS_OK;
}

zs_status zsi_gnode_exec(zsi_gnode *n)
{
    return n->run ? n->run(n) : n->kernel(&n->call, n->outs[0]);
}

/* Runs node i of g inside its scratch window (core/internal.h): while
 * the plan's scratch is measured, one that counts; once placed, one over
 * the node's bytes of the arena. Scratch a node keeps past its end cannot
 * share the arena: measured, the node gets none; served from the arena,
 * the graph fails and its arena is never freed. The replay loop names the
 * node in the error. */
static zs_status exec_node(zs_graph *g, int i)
{
    zsi_gnode *n = g->nodes[i];
    bool measure = g->scratch == ZSI_SCRATCH_MEASURE;
    bool win = measure ? zsi_alloc_window_open(NULL, 0)
               : g->scratch == ZSI_SCRATCH_PLACED && n->scratch &&
                     zsi_alloc_window_open(n->scratch->data, n->scratch->nbytes);
    zs_status st = g->profile ? zsi_gnode_exec_timed(n) : zsi_gnode_exec(n);
    if (!win)
        return st;
    int64_t live = 0;
    size_t high = zsi_alloc_window_close(&live);
    if (measure) {
        g->need[i] = live == 0 ? high : 0;
    } else if (live > 0) {
        g->failed = g->pinned = true;
        st = zs_set_error_code(ZS_ERR_STATE, "its kernel kept %lld block%s of its "
                               "scratch, inside the graph's arena, past its end; the "
                               "graph is off and its arena is never freed",
                               (long long)live, live == 1 ? "" : "s");
    } else if (high > n->scratch->nbytes) {
        g->need[i] = high; /* grown at the end of the replay */
        g->regrow = true;
    }
    return st;
}

zs_status zs_graph_replay(zs_graph *g)
{
    if (!g)
        return zs_set_error("graph replay: no graph");
    if (g->capturing || g->failed)
        return zs_set_error("graph replay: the graph is %s",
                            g->capturing ? "still being captured (call "
                            "zs_graph_capture_end)" : "unusable (its capture, its "
                            "memory plan or a replay failed)");
    if (current)
        return zs_set_error("graph replay: this thread is capturing a graph");
    zs_status st = zsi_graph_materialize(g);
    if (st != ZS_OK)
        return st;
    zs_no_grad_push();
    zsi_tracking_pause();
    double t0 = g->profile ? zsi_graph_now() : 0;
    for (int i = 0; i < g->n && st == ZS_OK; i++) {
        zsi_gnode *n = g->nodes[i];
        /* the peak report's attribution: the kernels' scratch by node */
        zs_alloc_tag_push(n->label ? n->label : n->call.def->op.name);
        st = exec_node(g, i);
        zs_alloc_tag_pop();
        if (st != ZS_OK)
            st = zs_set_error_code(st, "graph replay: node %d (%s) failed: %s", i,
                                   n->label ? n->label : n->call.def->op.name,
                                   zs_last_error());
    }
    if (g->profile) {
        g->prof_seconds += zsi_graph_now() - t0;
        g->prof_replays++;
    }
    if (st == ZS_OK && (g->scratch == ZSI_SCRATCH_MEASURE || g->regrow))
        st = zsi_graph_plan_scratch(g);
    zsi_tracking_resume();
    zs_no_grad_pop();
    return st;
}

void zs_graph_free(zs_graph *g)
{
    if (!g)
        return;
    if (g == current) {
        current = NULL;
        zsi_capture = NULL;
        end_dry(g);
    }
    zsi_gcap_deinit(g);
    for (int i = 0; i < g->n; i++)
        zsi_gnode_free(g->nodes[i]);
    free(g->nodes);
    free(g->plan);
    free(g->need);
    if (!g->pinned)
        zs_free(g->arena); /* after the nodes: their storages point into it */
    free(g);
}

int zs_graph_size(const zs_graph *g) { return g ? g->n : 0; }

void zs_graph_get_stats(const zs_graph *g, zs_graph_stats *s)
{
    memset(s, 0, sizeof *s);
    if (!g)
        return;
    s->nodes = g->n;
    zsi_sset seen;
    bool ok = zsi_sset_init(&seen, 4 * g->n + 16);
    for (int i = 0; i < g->n; i++) {
        const zsi_gnode *n = g->nodes[i];
        s->flops += n->cost.flops;
        s->bytes_read += n->cost.bytes_read;
        s->bytes_written += n->cost.bytes_written;
        for (int j = 0; ok && j < n->call.nin; j++) /* inputs first: not made */
            zsi_sset_get(&seen, n->in[j]->storage, true);
        zs_tensor *made[ZSI_MAX_OUT + ZSI_MAX_AUX];
        int m = 0;
        for (int k = 0; k < ZSI_MAX_OUT; k++)
            if (n->outs[k] && !n->call.def->inplace)
                made[m++] = n->outs[k];
        for (int k = 0; k < ZSI_MAX_AUX; k++)
            if (n->aux[k])
                made[m++] = n->aux[k];
        for (int k = 0; ok && k < m; k++) {
            int *v = zsi_sset_get(&seen, made[k]->storage, true);
            if (v && *v < 0) {
                *v = i;
                s->intermediate_bytes += made[k]->storage->nbytes;
            }
        }
    }
    if (ok)
        zsi_sset_deinit(&seen);
    s->planned_bytes = g->arena_bytes;
    for (int i = 0; i < g->n; i++)
        if (g->nodes[i]->scratch) {
            s->scratch_nodes++;
            s->scratch_bytes += g->nodes[i]->scratch->nbytes;
        }
}

/* ---- storage sets --------------------------------------------------------- */

bool zsi_sset_init(zsi_sset *s, int expect)
{
    int cap = 64;
    while (cap < 2 * expect)
        cap *= 2;
    s->k = calloc((size_t)cap, sizeof *s->k);
    s->v = malloc((size_t)cap * sizeof *s->v);
    s->cap = cap;
    s->n = 0;
    if (!s->k || !s->v) {
        zsi_sset_deinit(s);
        return false;
    }
    return true;
}

void zsi_sset_deinit(zsi_sset *s)
{
    free(s->k);
    free(s->v);
    s->k = NULL;
    s->v = NULL;
}

static bool sset_grow(zsi_sset *s)
{
    zsi_sset b;
    if (!zsi_sset_init(&b, s->cap))
        return false;
    for (int i = 0; i < s->cap; i++)
        if (s->k[i])
            *zsi_sset_get(&b, s->k[i], true) = s->v[i];
    zsi_sset_deinit(s);
    *s = b;
    return true;
}

int *zsi_sset_get(zsi_sset *s, zs_storage *key, bool add)
{
    static int absent;
    if (add && 2 * (s->n + 1) > s->cap && !sset_grow(s))
        return NULL;
    size_t h = ((uintptr_t)key >> 4) * 0x9E3779B97F4A7C15ull;
    for (size_t i = h & (size_t)(s->cap - 1);; i = (i + 1) & (size_t)(s->cap - 1)) {
        if (s->k[i] == key)
            return &s->v[i];
        if (!s->k[i]) {
            if (!add) {
                absent = -1;
                return &absent;
            }
            s->k[i] = key;
            s->v[i] = -1;
            s->n++;
            return &s->v[i];
        }
    }
}
