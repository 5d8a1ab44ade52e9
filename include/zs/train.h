/*
 * zs/train.h - training as a library: zs_trainer runs the loop of one
 * model on one process or on every rank of a communicator.
 *
 * What it owns: the flat parameter and gradient buffers of the model
 * (zs_module_flatten), the optimizer, the learning-rate schedule, gradient
 * accumulation, clipping (one norm pass; the scaling is fused into the
 * optimizer's update, zs_optim_step_scaled), the data-parallel machinery
 * (bucketed all-reduce during backward, ZeRO 1-3, or a parameter server:
 * synchronous, asynchronous or stale-synchronous), validation, checkpoints
 * with exact resume (on any number of ranks, ZeRO or not), and the metrics
 * of each step (loss, gradient norm, tokens/s, MFU).
 *
 * What the caller gives: the model, a batch function that makes the
 * global micro-batch number `index` as a pure function of it (every rank
 * asks for the same batch and trains on its share of the rows, so P ranks
 * see exactly what one process would, and a resumed run sees the batches
 * the stopped one would have), and optionally a loss, a validation and a
 * step callback.
 *
 * A data-parallel GPT (every rank runs the same program under mpirun):
 *     zs_token_source src = {&train, 8, 128, 1};
 *     zs_trainer_config c = zs_trainer_defaults();
 *     c.optim.lr = c.schedule.base_lr = 1e-3;
 *     c.steps = c.schedule.total_steps = 200;
 *     c.batch = zs_token_batch;
 *     c.batch_ctx = &src;
 *     zs_trainer *t = zs_trainer_new(gpt, &c);
 *     zs_status st = t ? zs_trainer_run(t) : ZS_ERR_STATE;
 *     zs_trainer_free(t);
 *
 * Threads: a trainer and its model belong to the thread that made them
 * (the one that initialised MPI under mpirun).
 */
#ifndef ZS_TRAIN_H
#define ZS_TRAIN_H

#include <stdio.h>

#include "dist.h"
#include "nn.h"
#include "optim.h"
#include "text.h"
#include "tp.h"
#include "zero.h"

#ifdef __cplusplus
extern "C" {
#endif

/* How the ranks combine their gradients (zs/ps.h for the last three). */
typedef enum zs_sync_mode {
    ZS_SYNC_ALLREDUCE, /* every rank updates its replica (or ZeRO shard) */
    ZS_SYNC_PS,        /* rank 0 owns the optimizer, synchronous */
    ZS_SYNC_ASYNC,     /* rank 0 serves, ranks 1.. push and pull freely */
    ZS_SYNC_SSP,       /* as ASYNC with at most `staleness` clocks of lead */
} zs_sync_mode;

/* Global micro-batch number `index` (step * accum + micro) as new tensors
 * in the current scope: x the input, y the targets. Must depend on index
 * only. */
typedef zs_status (*zs_batch_fn)(void *ctx, int64_t index, zs_tensor **x,
                                 zs_tensor **y);
/* The scalar loss of m on (x, y) (a new tensor; NULL + error). */
typedef zs_tensor *(*zs_loss_fn)(void *ctx, zs_module *m, zs_tensor *x,
                                 zs_tensor *y);
/* Validation loss of m (called under no-grad with m in eval mode, the whole
 * model in hand even under ZeRO-3); NaN + error on failure. */
typedef double (*zs_eval_fn)(void *ctx, zs_module *m);

/* What the step callback is told after each optimizer step. */
typedef struct zs_train_event {
    int64_t step, steps;   /* the step just finished (0-based), of steps */
    double loss;           /* mean over the global batch (all ranks) */
    double grad_norm;      /* before clipping; 0 when clipping is off */
    double lr;
    double step_s;         /* seconds of this step */
    int64_t targets;       /* elements of y in the step's global batch (all
                            * micro-batches; the asynchronous server: those
                            * of batch 0 times accum) */
    double tokens_per_s;   /* targets (elements of y: tokens, or samples
                            * for a classifier) per second, all ranks */
    double mfu;            /* model FLOPs utilisation; 0 when not asked */
    double elapsed_s, eta_s;
    double val_loss;       /* NaN unless validated after this step */
    bool validated, last;  /* last: the run stops after this step */
    int rank;              /* of the reporting process */
    int64_t comm_bytes;    /* bytes this rank sent to average the step's
                            * gradients: the ring all-reduce's volume
                            * (zs_onebit_ring_bytes of the flat gradient,
                            * computed, also for the MPI algorithm), or
                            * after a 1-bit Adam freeze the compressed
                            * momentum's (counted); 0 on one rank or
                            * under ZeRO / a parameter server */
    zs_dtype precision;    /* the config's (ZS_F32, ZS_BF16, ZS_F16, ZS_F8E4M3) */
    double loss_scale;     /* the loss scale of this step (1 without one) */
    bool skipped;          /* the loss scaler skipped this step's update
                            * (Inf/NaN in the gradients) */
} zs_train_event;
/* Called on every rank that runs the step (the server only, for ASYNC and
 * SSP), after validation and before the checkpoint is written (a callback
 * may update the text config.metadata points to). Nonzero stops the run
 * after this step (its checkpoint is still written when due). */
typedef int (*zs_train_event_fn)(void *ctx, const zs_train_event *e);

typedef struct zs_trainer_config {
    zs_optim_config optim;    /* over the flat parameters */
    zs_lr_schedule schedule;  /* learning rate of each step */
    int64_t steps;            /* optimizer steps of the whole run */
    int64_t accum;            /* micro-batches per step (>= 1) */
    double clip;              /* max global gradient norm; 0: off */
    zs_batch_fn batch;        /* required */
    void *batch_ctx;
    zs_loss_fn loss;          /* NULL: zs_gpt_loss */
    void *loss_ctx;
    zs_eval_fn eval;          /* NULL: no validation */
    void *eval_ctx;
    int64_t eval_every;       /* validate and checkpoint every N steps and
                               * after the last; 0: after the last only */
    double flops_per_token;   /* model FLOPs per target, for MFU; 0: none */
    double peak_flops;        /* per computing rank; 0: measured (0.1 s) by
                               * zs_trainer_new when flops_per_token > 0:
                               * the FP32 FMA peak, doubled for bf16/fp8 on
                               * a CPU with AVX512_BF16 */
    int64_t stop_after;       /* stop after this many steps of the run (the
                               * schedule still spans `steps`); 0: none */
    double max_seconds;       /* stop after a step past this; 0: none */
    zs_comm *comm;            /* NULL: zs_comm_world() (borrowed) */
    zs_sync_mode sync;
    int staleness;            /* SSP's bound */
    int zero;                 /* 0, or ZeRO stage 1-3 (ZS_SYNC_ALLREDUCE) */
    int64_t bucket_bytes;     /* gradient buckets; 0: one after backward */
    zs_allreduce_algo algo;
    const char *checkpoint;   /* file written at each validation; NULL: none */
    const char *metadata;     /* JSON object of string values stored with
                               * the checkpoint (the model's config, ...);
                               * the trainer adds step, optim_steps,
                               * rng_seed, rng_offset and val_loss */
    zs_train_event_fn on_step;
    void *on_step_ctx;
    int device;               /* where the model, its flat buffers, the
                               * optimizer state and the batches live
                               * (zs_device_find); 0: the CPU. The trainer
                               * moves the model there. Data parallelism
                               * needs the CPU (the collectives take host
                               * tensors). */
    FILE *log;                /* rank 0's setup and summary lines (ZeRO
                               * memory, buckets, server statistics);
                               * NULL: silent */
    int64_t freeze_step;      /* optim.kind ZS_ONEBIT_ADAM: AdamW steps before
                               * the variance freezes (>= 1) */
    int64_t onebit_block;     /* optim.kind ZS_ONEBIT_ADAM on several ranks:
                               * from freeze_step on, the gradient
                               * all-reduce stops and the momentum is
                               * averaged by zs/onebit.h's compressed
                               * all-reduce with this many elements per
                               * scale (0: ZS_ONEBIT_BLOCK). All-reduce data
                               * parallelism only (no ZeRO, no parameter
                               * server). After the freeze, clipping and
                               * grad_norm use this rank's own gradient;
                               * a resumed run starts the error buffers at
                               * zero (as DeepSpeed does). */
    /* Mixed precision (docs/precision.md): ZS_F32 (default), ZS_BF16,
     * ZS_F16 or ZS_F8E4M3. Forward and loss (and validation) run under
     * zs_autocast_push(precision); the weights are converted once per step
     * (one pass over the flat buffer; ZeRO-3: each gathered weight once);
     * the master weights, gradients, optimizer state and checkpoints stay
     * f32. f16 and fp8 scale the loss (zs_grad_scaler with `scaler`;
     * all-reduce data parallelism only); fp8 runs the linears as
     * zs_linear_fp8 (e4m3, tile scales, e5m2 gradients) and the other
     * products in bf16 (zs_autocast_compute_dtype). */
    zs_dtype precision;
    zs_grad_scaler_config scaler; /* all zeros: zs_grad_scaler_defaults() */
    /* Graph mode (zs/graph.h): the first step's forward, backward and
     * gradient norm are captured, later steps replay them after copying
     * their batch into the captured batch buffers; the clip factor and
     * the optimizer update run eagerly (in place, no allocation). The
     * graph goes through dead-code elimination and the memory plan. A
     * step whose signature differs (batch shapes or dtypes, dropout rates,
     * training mode, the loss scale) recaptures. One process, accum 1, no
     * ZeRO, the CPU; any precision (the weights' conversion is captured,
     * the loss scaler's check and skip run eagerly after the replay).
     * Losses equal eager ones bit for bit. */
    bool graph;
    const char *dump_graph;   /* graph mode: the first captured graph
                               * before and after the passes as text here
                               * (its replay profile appended when it is
                               * dropped) and as Graphviz in
                               * dump_graph.dot; later captures are not
                               * written; NULL: none */
    /* Model parallelism (issue 28, src/train/parallel3d.c): with tp or pp
     * > 1 the trainer cuts comm into a dp x tp x pp grid (zs/tp.h: tp
     * fastest, pp slowest), prints the rank layout, and trains the GPT it
     * is given (a zs_gpt_new model, the same on every rank; zs_trainer_new
     * copies this rank's shards out of it and never uses it again, so the
     * caller frees it right after to hold only its part) split
     * Megatron-style: blocks over pp stages (embeddings on the first,
     * ln_f, the tied head and the loss on the last), each block over tp
     * (attention by heads, MLP column then row, vocabulary-parallel
     * embedding and cross-entropy). Each dp rank's rows of the global
     * batch go through the pipeline as micro_batches micro-batches under
     * pp_schedule, with activations and their gradients sent point to
     * point (zs_pipe). Gradients are averaged over dp (ZeRO-1 over dp
     * only), clipped by the norm of the whole model, and checkpoints are
     * written and read in the one-process layout (any layout resumes any
     * other). The cpu, all-reduce sync, accum 1 (micro_batches instead),
     * the default GPT loss; any precision (the split part's weights cast
     * once per step, the loss scaler's Inf/NaN agreed over the whole
     * grid), and the recomputation and sparse attention set on the GPT
     * (zs_gpt_set_recompute, zs_gpt_set_sparse_attention) apply to the
     * split blocks. */
    int tp, pp;               /* 0 or 1: no split */
    int dp;                   /* 0: comm's size / (tp pp) */
    zs_pp_schedule pp_schedule;
    int64_t micro_batches;    /* per step and dp rank; 0: 1 */
    bool sequence_parallel;   /* norms on sequence shards (tp > 1) */
    const int64_t *pp_layers; /* blocks of each of the pp stages; NULL: even */
    /* Model parallelism validates on the split model itself (forward
     * only, every rank taking part, the loss computed by the last stage as
     * in training): the mean GPT loss of batches 0 .. eval_batches - 1 of
     * eval_batch (rows as for batch). NULL with eval = zs_token_eval: its
     * zs_token_source's batches; another eval function is refused. */
    zs_batch_fn eval_batch;
    void *eval_batch_ctx;
    int64_t eval_batches;     /* 0: 1 */
} zs_trainer_config;

/* "fp32", "bf16", "fp16", "fp8" for ZS_F32, ZS_BF16, ZS_F16, ZS_F8E4M3
 * (the names of --precision), "?" otherwise. */
const char *zs_precision_name(zs_dtype p);
/* The dtype of a precision name above (also "f32", "f16", "f8e4m3"), or
 * -1 for another string. */
int zs_precision_parse(const char *name);

/* AdamW (betas 0.9, 0.95, weight decay 0.1, lr 1e-3) with a cosine
 * schedule to lr / 10 after 100 warm-up steps, 1000 steps, clip 1.0,
 * accum 1, 8 MiB buckets and the ring all-reduce. */
zs_trainer_config zs_trainer_defaults(void);

typedef struct zs_trainer zs_trainer;

/* Flattens m (borrowed; it must outlive the trainer, hold the same values
 * on every rank, and serve this one trainer: flattening again would move
 * its parameters) and builds the optimizer and the parallel machinery.
 * Every global batch must have a number of rows divisible by the ranks
 * that compute (all, or all but the server). Collective over the communicator. NULL + error for a bad
 * config (message names the field) or a failure. */
zs_trainer *zs_trainer_new(zs_module *m, const zs_trainer_config *cfg);
void zs_trainer_free(zs_trainer *t);

/* Continues from a checkpoint written by any trainer of the same model
 * (any rank count, ZeRO stage or sync mode): weights, optimizer state,
 * step and the RNG state (a step at or past `steps` leaves nothing to
 * run). *meta (if not NULL) receives the checkpoint's
 * metadata (free it). Collective. A failure (no such file, another model,
 * metadata without a valid "step") may leave the weights
 * loaded but the step not: do not train on after it. */
zs_status zs_trainer_resume(zs_trainer *t, const char *path, char **meta);
/* Trains from the current step to the end (steps, stop_after or
 * max_seconds), validating and checkpointing as configured. Collective. */
zs_status zs_trainer_run(zs_trainer *t);
/* One synchronous step (ZS_SYNC_ALLREDUCE or ZS_SYNC_PS) without
 * validation or checkpoint, for benchmarks and custom loops; e (if not
 * NULL) receives its metrics. Collective. */
zs_status zs_trainer_step(zs_trainer *t, zs_train_event *e);
/* Validation loss now (NaN without an eval function). Collective. */
double zs_trainer_validate(zs_trainer *t);
/* Writes a checkpoint (rank 0 writes; under ZeRO every rank takes part).
 * Collective. */
zs_status zs_trainer_save(zs_trainer *t, const char *path, double val_loss);

/* The next step to run (0-based), the optimizer (borrowed; under ZeRO it
 * updates this rank's shards, under a parameter server it exists on rank 0
 * only) and the flat parameters (borrowed). */
int64_t zs_trainer_next_step(const zs_trainer *t);
zs_optim *zs_trainer_optim(zs_trainer *t);
zs_tensor *zs_trainer_flat_params(zs_trainer *t);

/* Seconds spent in each phase of the steps since the last reset, and the
 * bytes the two optimizer passes move per step (for bandwidth fractions). */
typedef struct zs_train_profile {
    int64_t steps;
    double forward_s, backward_s; /* the loss function; backward */
    double comm_s;                /* waiting for gradient communication */
    double norm_s, update_s;      /* the norm pass; the fused update */
    double zero_grad_s;
    double norm_bytes, update_bytes; /* per step, this rank */
    int buckets;                  /* data parallel: gradient buckets, and */
    double buckets_early;         /* the fraction started during backward
                                   * (last step) */
    /* model parallelism, summed over the steps: this rank's pipeline
     * compute (forward and backward of its stage) and the wall time of the
     * schedule (compute + waiting: the bubble is wall / busy - 1); bytes
     * its pipe sent (activations and their gradients) in the last step */
    double pp_busy_s, pp_wall_s;
    int64_t pp_bytes;
    int64_t tp_bytes;             /* the tensor-parallel operators' bytes
                                   * sent in the last step (forward and
                                   * backward; zs_tp_bytes_sent) */
} zs_train_profile;
void zs_trainer_profile(const zs_trainer *t, zs_train_profile *p);
void zs_trainer_profile_reset(zs_trainer *t);
/* Graph mode: the last capture's step peak (the allocator's high-water
 * mark during the captured step, which runs eagerly, above what was live
 * when it began; the capture resets the allocator's peak) and the memory
 * plan's arena that replaces the step's intermediates. ZS_OK, or an
 * error when no graph is held. */
zs_status zs_trainer_graph_memory(const zs_trainer *t, size_t *step_peak,
                                  size_t *arena);

/* ---- ready-made data --------------------------------------------------- */

/* Windows of a token file: batch `index` is zs_tokens_sample(tokens,
 * batch, seq, seed, index). eval_batches is what zs_token_eval averages. */
typedef struct zs_token_source {
    const zs_tokens *tokens; /* borrowed */
    int64_t batch, seq;
    uint64_t seed;
    int64_t eval_batches;
} zs_token_source;
/* zs_batch_fn over a zs_token_source. */
zs_status zs_token_batch(void *src, int64_t index, zs_tensor **x, zs_tensor **y);
/* zs_eval_fn over a zs_token_source: mean zs_gpt_loss of batches
 * 0 .. eval_batches - 1 (at least 1). */
double zs_token_eval(void *src, zs_module *m);
/* zs_loss_fn of a classifier: cross-entropy of zs_module_forward(m, x)
 * against the class indices y. */
zs_tensor *zs_classifier_loss(void *ctx, zs_module *m, zs_tensor *x, zs_tensor *y);

/* A run's dir/metrics.jsonl (one JSON line per step: step, loss, lr,
 * grad_norm, tokens_per_s, mfu, precision, loss_scale, skipped, and
 * comm_bytes when nonzero; one per
 * validation: step, val_loss) and
 * dir/curves.svg (train and validation loss, redrawn at each validation).
 * write false (ranks other than 0): events are accepted and dropped. */
typedef struct zs_train_log zs_train_log;
zs_train_log *zs_train_log_open(const char *dir, bool append, bool write);
/* A zs_train_event_fn over a zs_train_log (ctx); returns 0. */
int zs_train_log_event(void *log, const zs_train_event *e);
void zs_train_log_close(zs_train_log *l);

/* ZeRO stage 3 for a GPT m (borrowed, outliving z) whose parameters were
 * flattened into flat_params: the units are m's blocks (zs_module_units:
 * block i is unit i; the embeddings and the final norm are kept), and m's
 * block hook fetches a block before its forward and its backward and
 * drops it after its forward; zs_zero_free removes the hook. Fails for a
 * module that is not a GPT (others: zs_module_units, zs_zero_new3, and
 * fetch/drop around each unit). Lives here, above both the parallel layer
 * and nn, which know nothing of each other. */
zs_zero *zs_zero_new3_module(zs_comm *c, zs_module *m, zs_tensor *flat_params);

/* Model FLOPs per token of a GPT trained on sequences of seq (PaLM,
 * appendix B): 6 N (N without the position embedding) + 6 L T C for the
 * causal attention. */
double zs_gpt_train_flops_per_token(const zs_gpt_config *g, int64_t seq);

#ifdef __cplusplus
}
#endif
#endif
