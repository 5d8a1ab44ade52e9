/*
 * train/par.h - model parallelism in the trainer (issue 28): one rank's
 * part of a GPT (gpt_par.c) and the 3D step over a dp x tp x pp grid
 * (parallel3d.c). Internal to src/train.
 */
#ifndef ZS_TRAIN_PAR_H
#define ZS_TRAIN_PAR_H

#include "zs/nn.h"
#include "zs/ops.h"
#include "zs/tp.h"

/* ---- a GPT's part (gpt_par.c) ------------------------------------------ */

typedef struct zsi_pgpt zsi_pgpt;

/* The layer of a GPT parameter by its one-process name: i for "h.<i>.*",
 * `layers` for ln_f, -1 for the embeddings (wte, wpe, emb_ln). */
int64_t zsi_gpt_param_layer(const char *name, int64_t layers);
/* Whether the parameter is split over tp, and how (zs_tp_shard's dim and
 * blocks); false: replicated. */
bool zsi_gpt_param_split(const char *name, int *dim, int *blocks);

/* Blocks [l0, l1) of the GPT `full` (borrowed, read for the weights: this
 * rank's shards are copied out of it) over tp (borrowed, outliving the
 * part); first: the embeddings; last: ln_f, the tied head and the loss;
 * sp: sequence parallelism. NULL + error (tp must divide the heads and
 * the vocabulary). */
zsi_pgpt *zsi_pgpt_new(zs_module *full, zs_comm *tp, bool sp, int64_t l0, int64_t l1,
                       bool first, bool last);
/* The recomputation mode the split model runs (the one-process GPT's). */
zs_recompute zsi_pgpt_recompute(const zsi_pgpt *pg);
void zsi_pgpt_free(zsi_pgpt *pg);
/* The module holding this rank's parameters (borrowed), named as in the
 * one-process GPT, in its order. */
zs_module *zsi_pgpt_module(zsi_pgpt *pg);
/* Whether this part holds the parameter of that one-process name. */
bool zsi_pgpt_holds(const zsi_pgpt *pg, const char *name);
/* Copies this rank's shards out of a one-process GPT's parameters. */
zs_status zsi_pgpt_from_full(zsi_pgpt *pg, zs_module *full);
/* The replicated parameters (norms, wpe, row-parallel biases) into out
 * (room for all the parameters); returns their count. */
int zsi_pgpt_replicated(zsi_pgpt *pg, zs_tensor **out);
/* ZS_OK when a sequence of T tokens fits (context, sequence shards). */
zs_status zsi_pgpt_check_seq(const zsi_pgpt *pg, int64_t T);
/* First stage: ids [B, T] (i64) -> the residual stream [B, T, C] (with
 * sequence parallelism this rank's [B, T/P, C]). */
zs_tensor *zsi_pgpt_embed(zsi_pgpt *pg, zs_tensor *idx);
/* This part's blocks on the residual stream (borrowed): a new one. */
zs_tensor *zsi_pgpt_blocks(zsi_pgpt *pg, zs_tensor *x);
/* Last stage: ln_f, the tied vocabulary-parallel head and cross-entropy
 * against y [B, T]: the mean loss, a 0-d tensor alike on every tp rank. */
zs_tensor *zsi_pgpt_loss(zsi_pgpt *pg, zs_tensor *x, zs_tensor *y);

/* ---- the trainer's model-parallel state (parallel3d.c, par_ckpt.c) ---- */

/* A parameter of the one-process GPT: its name and shape, its element
 * offset in the one-process flat buffer (and the flat optimizer moments),
 * the stage that owns it, and its index in this rank's part (-1: not
 * held here). */
typedef struct zsi_pinfo {
    char *name;
    int ndim;
    int64_t shape[ZS_MAX_DIMS];
    int64_t off, numel;
    int stage, local;
} zsi_pinfo;

typedef struct zsi_par {
    zs_grid *grid;
    zsi_pgpt *pg;
    zsi_pinfo *info;     /* the one-process parameters, in their order */
    int ninfo;
    int64_t full_numel;  /* the one-process model's parameters */
    zs_comm *emb;        /* the first and last stage (tied wte); NULL if pp 1 */
    zs_pipe *pipe;
    int64_t *bounds;     /* pp + 1 layer bounds */
    int stage, stages, m;
    int64_t width;       /* the GPT's */
    bool first, last;
    /* pipeline timing, summed over steps: busy (compute) and wall */
    double busy_s, wall_s;
    int64_t pipe_bytes;  /* activations and gradients sent in the last step */
    int64_t tp_bytes;    /* tp collectives' bytes of the last step */
    size_t step_peak;    /* most bytes the allocator held above a step's start
                          * (activations, their gradients, temporaries) */
} zsi_par;

/* The table of the one-process parameters of full (borrowed) and where
 * each lives (p->bounds, p->pg set). */
zs_status zsi_par_layout(zsi_par *p, zs_module *full);
void zsi_par_layout_free(zsi_par *p);

#endif
