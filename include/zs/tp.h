/*
 * zs/tp.h - model parallelism as library pieces: the dp x tp x pp process
 * grid, Megatron-LM tensor parallelism (with sequence parallelism), and
 * pipeline point-to-point transfers and schedules. See shared/DESIGN.md,
 * "Distributed", and issue 28. The trainer builds on these; each piece is
 * usable and tested alone.
 *
 * Grid (src/parallel/grid.c). World rank r of a dp x tp x pp grid has the
 * coordinates tp = r % tp, dp = (r / tp) % dp, pp = r / (tp dp): tp varies
 * fastest, so the ranks of a tensor-parallel group are neighbours (share a
 * node), and pp slowest (Megatron-LM's order). The layout functions are
 * pure (no communicator needed); zs_grid_new makes the three groups.
 *
 * Tensor parallel (src/parallel/tp.c: the communication operators;
 * tp_layers.c: the layers and shard helpers). Autograd operators over a tp
 * communicator; their tensors are float (f32, f64) tensors in host memory
 * (the CPU, or the test device, whose kernels run on host aliases: the
 * collectives move host memory). Every rank of the group must call them
 * in the same order with the same shapes, forward and backward (the
 * collectives' rule, zs/dist.h); a shape error found locally is found
 * alike on every rank when the shapes are replicated. Megatron's
 * conjugate pairs:
 *   zs_tp_copy    f: identity forward, all-reduce (sum) backward
 *   zs_tp_reduce  g: all-reduce (sum) forward, identity backward
 *   zs_tp_gather  all-gather along dim forward, this rank's chunk backward
 *   zs_tp_split   this rank's chunk forward, all-gather backward
 *   zs_sp_gather  all-gather along dim forward, reduce-scatter backward
 *   zs_sp_reduce_scatter  reduce-scatter forward, all-gather backward
 * Layers on them: column- and row-parallel linear, the vocabulary-parallel
 * embedding and cross-entropy. The loss is replicated: every tp rank
 * computes the same value and seeds backward with the same gradient.
 * Shards are the even split of a dim: rank r of P holds elements
 * [r n/P, (r+1) n/P) (per block, for fused weights; zs_tp_shard).
 *
 * Pipeline (src/parallel/pipeline.c). Schedules as pure functions, and a
 * channel (zs_pipe) that sends activations to the next stage and their
 * gradients to the previous one, tagged by micro-batch, with sends that
 * never block (so a schedule cannot deadlock on a rendezvous send).
 */
#ifndef ZS_TP_H
#define ZS_TP_H

#include "dist.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- process grid ------------------------------------------------------ */

typedef struct zs_grid_dims {
    int dp, tp, pp;
} zs_grid_dims;

typedef enum zs_grid_axis { ZS_GRID_DP = 0, ZS_GRID_TP = 1, ZS_GRID_PP = 2 } zs_grid_axis;

/* Checks a layout for a world of `world` ranks: every size >= 1 and
 * dp * tp * pp == world. A dp of 0 is filled in as world / (tp pp) (which
 * must then divide). Pure. ZS_OK, or ZS_ERR_ARG and a message giving the
 * sizes and the world. */
zs_status zs_grid_dims_check(int world, zs_grid_dims *d);
/* The coordinates (dp, tp, pp, as a zs_grid_dims) of world rank r, and
 * back. Pure; d must be valid. */
zs_grid_dims zs_grid_coords(zs_grid_dims d, int rank);
int zs_grid_rank(zs_grid_dims d, zs_grid_dims coords);
/* The world ranks of rank r's group along axis a, in group-rank order,
 * into out (the axis' size of them). Returns that size. Pure. */
int zs_grid_group(zs_grid_dims d, zs_grid_axis a, int rank, int *out);
/* The layout in words: a header line, then for each axis every group's
 * world ranks ("tp groups: [0 1] [2 3] ..."), one line per axis. Pure;
 * returns a malloc'd string (free()) or NULL and an error for bad dims. */
char *zs_grid_layout(zs_grid_dims d);

/* This rank's place in a grid and its three groups. */
typedef struct zs_grid {
    zs_comm *world;       /* borrowed */
    zs_grid_dims dims;    /* sizes */
    zs_grid_dims me;      /* this rank's coordinates */
    int rank;             /* world rank */
    zs_comm *dp, *tp, *pp; /* owned; group rank = the coordinate */
} zs_grid;

/* Splits world into the dp, tp and pp groups of the layout (dp 0: the
 * rest of the world). Collective on world; sizes are checked first on
 * every rank alike, so a bad layout fails everywhere before any message.
 * Returns a new grid (zs_grid_free) or NULL and an error. */
zs_grid *zs_grid_new(zs_comm *world, int dp, int tp, int pp);
void zs_grid_free(zs_grid *g);

/* ---- tensor-parallel mappings (autograd operators) ---------------------- */

/* Each returns a new reference or NULL and an error; x is borrowed; tp is
 * borrowed until the backward of the result has run. dim may be negative
 * (from the end). */
zs_tensor *zs_tp_copy(zs_comm *tp, zs_tensor *x);
zs_tensor *zs_tp_reduce(zs_comm *tp, zs_tensor *x);
/* x [..., n, ...] -> [..., P n, ...] along dim, ranks in order. */
zs_tensor *zs_tp_gather(zs_comm *tp, zs_tensor *x, int dim);
/* x [..., P n, ...] -> this rank's [..., n, ...]; dim must divide. */
zs_tensor *zs_tp_split(zs_comm *tp, zs_tensor *x, int dim);
/* Sequence parallelism: as zs_tp_gather forward, but backward sums the
 * gradient over the ranks and keeps this rank's chunk (reduce-scatter). */
zs_tensor *zs_sp_gather(zs_comm *tp, zs_tensor *x, int dim);
/* x [..., P n, ...] summed over the ranks, this rank's chunk [..., n, ...]
 * kept; backward all-gathers. */
zs_tensor *zs_sp_reduce_scatter(zs_comm *tp, zs_tensor *x, int dim);

/* ---- tensor-parallel layers -------------------------------------------- */

/* Column-parallel linear (Megatron-LM): the full layer y = x W^T + b with
 * W [N, K] split by output rows. w: this rank's [N/P, K], b: its [N/P] or
 * NULL. x [..., K] is replicated over tp (it passes zs_tp_copy), or with
 * seq_dim >= 0 this rank's sequence shard along seq_dim (zs_sp_gather
 * collects the sequence first). Returns this rank's [..., N/P], or with
 * gather_output the whole [..., N] (all-gathered; not with seq_dim). */
zs_tensor *zs_tp_column_linear(zs_comm *tp, zs_tensor *x, zs_tensor *w, zs_tensor *b,
                               bool gather_output, int seq_dim);
/* Row-parallel linear: W [N, K] split by input columns. w: this rank's
 * [N, K/P]; b: the whole [N] (replicated) or NULL, added once after the
 * reduction. x: this rank's [..., K/P] with input_is_parallel, else the
 * whole [..., K] (split here). The partial products are all-reduced, or
 * with seq_dim >= 0 reduce-scattered along seq_dim (the result is this
 * rank's sequence shard). With seq_dim, b's gradient on each rank covers
 * its shard only: sum it over tp (zs_tp_allreduce_grads) before the step,
 * as for every replicated parameter used on sequence shards (norms). */
zs_tensor *zs_tp_row_linear(zs_comm *tp, zs_tensor *x, zs_tensor *w, zs_tensor *b,
                            bool input_is_parallel, int seq_dim);
/* Sums the .grad of n tensors over tp in place (contiguous CPU
 * gradients). A tensor without a gradient is skipped, so every rank must
 * pass tensors that have gradients alike (call it after the same backward
 * everywhere). */
zs_status zs_tp_allreduce_grads(zs_comm *tp, int n, zs_tensor *const *params);

/* Vocabulary-parallel embedding: w is this rank's rows [V/P, D] of the
 * [V, D] table (rank r owns ids [r V/P, (r+1) V/P)); idx (i32/i64, any
 * shape, every id in [0, V)) is replicated. Ids outside this rank's range
 * give zero rows, and the rows are summed over tp: returns [idx..., D]
 * (with seq_dim >= 0 reduce-scattered along that dim of the result
 * instead: this rank's sequence shard). */
zs_tensor *zs_tp_vocab_embedding(zs_comm *tp, zs_tensor *w, zs_tensor *idx, int seq_dim);
/* Vocabulary-parallel cross-entropy: logits [..., V/P] are this rank's
 * columns of [..., V]; target [...] (i32/i64, replicated) in [0, V) or
 * ignore_index. The mean over the targets that are not ignored (0 when
 * all are), as zs_cross_entropy, without gathering the logits: each
 * rank's row log-sum-exps are all-gathered (P numbers a row) and
 * combined, each rank adds the loss of the rows whose target it owns,
 * those shares are all-reduced, and the gradient stays local. It keeps
 * the logits (no copy, no softmax) until backward. A 0-d tensor, the same
 * on every rank.
 * 16-bit logits (autocast) are computed in f32, the loss then f32. */
zs_tensor *zs_tp_vocab_cross_entropy(zs_comm *tp, zs_tensor *logits, zs_tensor *target,
                                     int64_t ignore_index);

/* ---- weights between the one-process and the split layout --------------- */

/* This rank's shard of a whole tensor along dim, for rank `rank` of
 * `size`: dim is `blocks` equal blocks (3 for a fused QKV weight, else 1)
 * and each block is split evenly, the shard being every block's piece in
 * order. A new contiguous tensor, no autograd; NULL and an error when dim
 * does not divide by blocks * size. Pure (no communication). */
zs_tensor *zs_tp_shard(zs_tensor *full, int dim, int blocks, int rank, int size);
/* The inverse over tp: all-gathers the shards and returns the whole
 * tensor (new, no autograd). Collective. */
zs_tensor *zs_tp_unshard(zs_comm *tp, zs_tensor *shard, int dim, int blocks);

/* Bytes this rank has sent on tp through the tensor-parallel operators
 * above (tp_allreduce, tp_allgather, tp_reduce_scatter, forward and
 * backward), counted at the ring algorithm's volume as zs_comm_analyze
 * models it: 2 (P-1)/P of an all-reduced tensor, (P-1)/P of a gathered
 * or reduce-scattered one (the whole tensor's bytes); 0 for NULL. */
int64_t zs_tp_bytes_sent(const zs_comm *tp);

/* The dropout seed of a region: `split` regions (the outputs of a
 * column-parallel layer, attention heads) differ between tp ranks,
 * replicated regions (after a row-parallel layer, with sequence
 * parallelism their shards too) take the same seed everywhere. As
 * Megatron-LM: split = seed + 2718 + tp_rank, replicated = seed. */
uint64_t zs_tp_dropout_seed(uint64_t seed, int tp_rank, bool split);

/* ---- pipeline ---------------------------------------------------------- */

typedef enum zs_pp_schedule { ZS_PP_GPIPE = 0, ZS_PP_1F1B = 1 } zs_pp_schedule;

typedef struct zs_pp_action {
    bool backward;  /* false: forward */
    int mb;         /* micro-batch in [0, m) */
} zs_pp_action;

/* "gpipe" or "1f1b" -> *s; ZS_ERR_ARG with the names otherwise. */
zs_status zs_pp_schedule_parse(const char *name, zs_pp_schedule *s);
const char *zs_pp_schedule_name(zs_pp_schedule s);
/* The ordered actions of stage s of p for m micro-batches, 2 m of them,
 * into out[2 m]. GPipe: every forward, then every backward (in the same
 * micro-batch order). 1F1B: min(p - s - 1, m) forwards, then alternately
 * one forward and one backward, then the remaining backwards, so at most
 * p - s <= p micro-batches are in flight (forwarded, not yet backwarded).
 * Pure; ZS_ERR_ARG for s outside [0, p) or m < 1. */
zs_status zs_pp_schedule_make(zs_pp_schedule sched, int s, int p, int m, zs_pp_action *out);
/* The bubble of both schedules: (p - 1) / m, the idle time over the
 * compute time of a stage when stages take equal time. */
double zs_pp_bubble(int p, int m);
/* Runs the p stages' schedules on a model clock (a forward takes t_fwd,
 * a backward t_bwd; a forward of stage s waits for stage s-1's, a
 * backward for stage s+1's; transfers are free): *bubble = (makespan -
 * m (t_fwd + t_bwd)) / (m (t_fwd + t_bwd)). Pure. ZS_ERR_STATE if the
 * schedules deadlock (they do not). */
zs_status zs_pp_simulate(zs_pp_schedule sched, int p, int m, double t_fwd, double t_bwd,
                         double *bubble);

/* A point-to-point channel between the stages of a pp communicator
 * (stage = rank in it): activations go to stage + 1, gradients to stage -
 * 1, each tagged by micro-batch (mb in [0, 16383]). */
typedef struct zs_pipe zs_pipe;
typedef enum zs_pipe_kind { ZS_PIPE_ACT = 0, ZS_PIPE_GRAD = 1 } zs_pipe_kind;
/* Borrows pp. Returns a new channel (zs_pipe_free) or NULL. */
zs_pipe *zs_pipe_new(zs_comm *pp);
/* Starts sending t (contiguous CPU tensor, retained until sent) to the
 * next stage (ACT) or the previous (GRAD) and returns without waiting.
 * Errors: no such stage, mb out of range, a bad tensor. */
zs_status zs_pipe_send(zs_pipe *p, zs_pipe_kind kind, int mb, zs_tensor *t);
/* Receives into t (contiguous CPU tensor of the sender's byte size) from
 * the previous stage (ACT) or the next (GRAD); blocks (within the
 * communicator's timeout, naming the peer on expiry). */
zs_status zs_pipe_recv(zs_pipe *p, zs_pipe_kind kind, int mb, zs_tensor *t);
/* Waits until every send has completed (end of a step). */
zs_status zs_pipe_flush(zs_pipe *p);
/* Sends not yet known to have completed. */
int zs_pipe_pending(const zs_pipe *p);
/* Bytes sent so far (for communication volume). */
int64_t zs_pipe_bytes_sent(const zs_pipe *p);
/* Frees the channel; sends still pending are waited for first. */
void zs_pipe_free(zs_pipe *p);

#ifdef __cplusplus
}
#endif
#endif
