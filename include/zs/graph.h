/*
 * zs/graph.h - graph mode: a computation (a training step: forward,
 * backward, the gradient norm, the clip factor and the optimizer update)
 * recorded once as a static list of operator
 * calls, optimised by passes and replayed without allocating its results
 * or looking kernels up (../shared/DESIGN.md, "Autograd and graphs").
 *
 * Capture: between zs_graph_capture_begin and zs_graph_capture_end every
 * operator call this thread makes runs as usual and is also appended to
 * the graph as a node: the descriptor, a copy of its attributes, the
 * kernel it ran, its inputs, results and aux results (retained: their
 * storage is what a replay writes into). Gradients are nodes like any
 * other (the backward rules' calls, the accumulation into .grad).
 *
 * Replay: zs_graph_replay runs the nodes' kernels in order on the same
 * tensors. Tensors that existed before the capture (parameters, gradient
 * buffers, optimizer state, the batch buffers the caller fills) are the
 * graph's inputs: their contents may change between replays, never their
 * storage or shape. What a replay computes is what an eager run of the
 * same calls would: the same kernels on the same inputs give the same
 * bits, and operators that draw random numbers (dropout) reserve them
 * from the global counter-based stream at each replay, in the eager
 * order, so step k replayed equals step k run eagerly.
 *
 * What a capture cannot see, and the caller must keep fixed: anything
 * computed on the host between calls (a value read back with zs_item and
 * passed as an attribute is frozen at its captured value; control flow
 * taken on the host is frozen too) and the shapes. Values that change
 * every step go through memory instead: zs_trainer writes the step's lr
 * and count into a small f64 tensor (a graph input) before each replay,
 * the clip factor is computed from the norm by a node (zs_clip_coef_of),
 * and the update reads all three when it runs (zs_optim_step_dyn,
 * zs/optim.h). A caller replays only
 * a step whose signature (batch shapes and dtypes, dropout rates, training
 * mode) equals the captured one; zs_trainer does this and runs other
 * steps eagerly.
 *
 * Threads: a graph belongs to the thread that captured it; capture is
 * per thread (other threads' calls are not recorded). Devices: replay is
 * checked on the CPU; a capture on another device is refused by the
 * trainer (the test device runs kernels on host aliases).
 */
#ifndef ZS_GRAPH_H
#define ZS_GRAPH_H

#include <stdio.h>

#include "core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct zs_graph zs_graph;

/* Starts recording this thread's operator calls into a new graph (owned
 * by the caller: zs_graph_free). NULL + error when this thread already
 * captures or on allocation failure. */
zs_graph *zs_graph_capture_begin(void);
/* A dry capture: the same recording, but the calls compute nothing (as
 * a capture from shapes alone would): their results get no memory, only
 * the forward calls that record an autograd node run their kernels, on
 * zeros for every input made during the capture, to make the aux results
 * their backward rules save; in-place calls (the accumulation into
 * gradients, the optimizer update) do not run, and the random-number
 * position is restored at the end. So the capture holds almost no memory
 * and changes no tensor of the program: the first replay computes the
 * step (after the passes and the memory plan, its peak is the plan's).
 * The values the calls make hold nothing until then: a host read of one
 * during the capture (zs_item, zs_data, zs_copy_to_buffer; a loss
 * printed, a NaN check) is counted (zs_graph_dry_reads) and reads zeros,
 * and zs_graph_capture_end then fails: capture again with
 * zs_graph_capture_begin (zs_trainer does, noting it in its log). CPU
 * calls only. NULL + error as zs_graph_capture_begin. */
zs_graph *zs_graph_capture_begin_dry(void);
/* The host reads of a dry capture's values (0 for other graphs). */
int64_t zs_graph_dry_reads(const zs_graph *g);
/* Stops recording. ZS_OK, or an error when a call could not be recorded
 * (allocation failure) or g is not the graph being captured; a failed
 * graph refuses replay. */
zs_status zs_graph_capture_end(zs_graph *g);
/* Runs the captured calls again, in order, on the captured tensors.
 * Allocates no results and looks no kernel up; kernels may still use
 * temporaries of their own (from the caching allocator). ZS_OK, or the
 * first failing node's error (its index and operator named). */
zs_status zs_graph_replay(zs_graph *g);
void zs_graph_free(zs_graph *g);

/* Nodes now in g. */
int zs_graph_size(const zs_graph *g);

/* Totals of the nodes' cost models (the descriptors' cost functions, as
 * the profiler and `zs analyze` count them): FLOPs, bytes read and
 * written. */
typedef struct zs_graph_stats {
    int nodes;
    double flops, bytes_read, bytes_written;
    size_t intermediate_bytes; /* storage made by the nodes (their results
                                * and aux results), what replay keeps */
    size_t planned_bytes;      /* the arena after zs_graph_plan_memory; 0
                                * before (it grows once the first replay
                                * has placed the kernels' scratch) */
    int scratch_nodes;         /* nodes whose kernel scratch the plan holds */
    size_t scratch_bytes;      /* their places, summed (they share bytes
                                * with values dead at the time) */
} zs_graph_stats;
void zs_graph_get_stats(const zs_graph *g, zs_graph_stats *s);

/* ---- passes (src/graph/passes.c, fuse.c, ...), each usable alone ------ */

/* Dead-code elimination: removes the nodes whose results nobody needs. A
 * node stays when it writes storage that existed before the capture (an
 * in-place update of a parameter or gradient buffer), storage of one of
 * keep[0..nkeep) (what the caller reads after a replay: the loss), or
 * storage a kept node after it reads. Returns the number removed, or < 0
 * + error. */
int zs_graph_dce(zs_graph *g, int nkeep, zs_tensor *const *keep);

/* Pointwise fusion (graph/fuse.c): groups of pointwise nodes (ZSI_POINTWISE
 * descriptors, same element count and dtype, contiguous; scalar operands
 * in attributes; broadcast operands are not fused) where each member
 * after the first reads another member's result, and whose results are
 * read outside the group only after it, become one node that runs the
 * members' own kernels tile by tile (values passed inside the group stay
 * in per-thread scratch of a few KiB). Results read after the group or
 * named in keep[0..nkeep) are still written to their buffers; the other
 * intermediates lose their memory (their storages keep no data: read
 * them only through keep). Same bits as the unfused nodes. Run before the
 * memory plan. Returns the number of nodes removed (members folded into
 * another), or < 0 + error. */
int zs_graph_fuse(zs_graph *g, int nkeep, zs_tensor *const *keep);

/* Slice-gradient assembly (graph/slices.c): k slice_backward nodes of one
 * f32 tensor (disjoint slots of one dim), summed by adds and made
 * contiguous by a copy through a permutation view (GPT's q, k, v
 * gradients into qkv's), become one node writing each gradient into its
 * slot of the copy's result. Same bits. Run before the memory plan.
 * Returns the number of nodes removed, or < 0 + error. */
int zs_graph_fuse_slices(zs_graph *g, int nkeep, zs_tensor *const *keep);

/* Rematerialization (graph/remat.c): a value the forward makes and the
 * backward reads again much later (readers at least 8 nodes apart), when
 * it is a cheap function of tensors alive through that gap anyway - a
 * layer_norm output (from x, weight, bias), a contiguous copy (from its
 * source), an f32 linear_gelu output (from its saved pre-activation, by
 * the GEMM epilogue's own GeLU) - is made again by a new node right
 * before its first late reader, into a fresh buffer the late readers read
 * instead; the memory plan then reuses its bytes during the gap (as
 * PyTorch's min-cut partitioner recomputes cheap pointwise values). Same
 * bits: the same function on the same, unwritten inputs. Run after
 * fusion, before the memory plan. Returns the number of nodes added, or <
 * 0 + error. */
int zs_graph_remat(zs_graph *g, int nkeep, zs_tensor *const *keep);

/* Per-use weight casts (graph/casts.c): in a graph whose first use of a
 * low-precision copy of a flat f32 buffer is one copy_ converting the
 * whole buffer (mixed precision's weights, converted once per step; when
 * only is not NULL, a copy in only's storage and no other), each
 * node reading that copy gets its own conversion of the range it reads,
 * right before it, into a fresh buffer for the memory plan, and the whole
 * conversion goes: no node reads or writes the copy any more, so its
 * owner may free it (the trainer does). A weight read in the forward and
 * in the backward is converted twice. Same bits (the same conversion of
 * the same, unwritten f32 values). Applies only when every reader is a
 * plain driver call after the conversion and before any write of the f32
 * buffer; otherwise nothing changes. Run after rematerialization, before
 * the memory plan. Returns the number of conversion nodes added (0:
 * nothing to do), or < 0 + error. */
int zs_graph_split_casts(zs_graph *g, const zs_tensor *only, int nkeep,
                         zs_tensor *const *keep);

/* Memory planning by liveness: every storage the nodes make lives from
 * the node that makes it to the last node that uses it (to the end for
 * keep[0..nkeep)); each gets an offset in one arena (64-byte aligned,
 * first fit by decreasing size) so that no two storages alive at once
 * share a byte, the plan is checked by zs_graph_plan_verify, and the
 * storages are moved into the arena, allocated once: the old blocks of
 * values dead at the end are freed before the arena is allocated (so the
 * arena reuses them and planning never holds both), the kept values are
 * copied in. The first replay after it measures the temporaries each
 * node's kernel takes from the allocator (packing buffers, columns) and
 * gives each node that has some a place of that size in the arena, alive
 * during the node only (the arena is laid out again; the kept values
 * move with it); later replays serve those temporaries from there, so a
 * replay takes nothing from the allocator (a place found too small is
 * grown at the end of that replay). Returns ZS_OK or an error (the graph
 * is unchanged then). */
zs_status zs_graph_plan_memory(zs_graph *g, int nkeep, zs_tensor *const *keep);
/* Checks the plan: every pair of planned storages alive at a common node
 * occupies disjoint bytes of the arena, and each lies inside it. ZS_OK or
 * an error naming the pair. Nothing planned: ZS_OK. */
zs_status zs_graph_plan_verify(const zs_graph *g);

/* ---- replay profiler (src/graph/profile.c) ------------------------------ */

/* Turns per-node timing of g's replays on or off (off by default; on
 * resets the counts): each node's wall time (two clock reads around it)
 * is summed over the replays. ZS_OK, or an error for NULL. */
zs_status zs_graph_profile(zs_graph *g, bool on);
/* Writes the profile: per operator (a pass's node under its label, such
 * as remat:gelu or fused) the nodes, milliseconds per replay, share of
 * the replay, GFLOP/s and GB/s from the cost models; then the slowest
 * nodes. Nothing recorded: a line saying so. */
zs_status zs_graph_profile_dump(const zs_graph *g, FILE *f);

/* ---- dump (src/graph/dump.c) -------------------------------------------- */

/* Writes g as text: one line per node with its index, operator, input and
 * result shapes, dtype, device, FLOPs and bytes, then the totals. */
zs_status zs_graph_dump_text(const zs_graph *g, FILE *f, const char *title);
/* The same as a Graphviz digraph: a box per node, an edge from the node
 * that last wrote a storage to each node that reads it. */
zs_status zs_graph_dump_dot(const zs_graph *g, FILE *f, const char *title);

#ifdef __cplusplus
}
#endif

#endif
