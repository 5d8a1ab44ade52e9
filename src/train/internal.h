/*
 * train/internal.h - the state of a zs_trainer, shared by trainer.c (the
 * synchronous step and loop), state.c (checkpoints) and async.c (the
 * parameter server's asynchronous loops).
 */
#ifndef ZS_TRAIN_INTERNAL_H
#define ZS_TRAIN_INTERNAL_H

#include "zs/autograd.h"
#include "zs/dp.h"
#include "zs/onebit.h"
#include "zs/ops.h"
#include "zs/ps.h"
#include "zs/train.h"
#include "zs/zero.h"

struct zs_trainer {
    zs_trainer_config c;
    zs_module *m;         /* borrowed */
    zs_comm *comm;        /* borrowed */
    int rank, size;
    int parts;            /* ranks that compute gradients (all but the
                           * server for ASYNC and SSP) */
    zs_tensor *fp, *fg;   /* flat parameters / gradients, borrowed from m;
                           * fg NULL under ZeRO-2/3 (shards only) */
    zs_optim *o;          /* NULL on parameter-server workers */
    zs_dp *dp;            /* gradient averaging during backward */
    zs_zero *z;           /* ZeRO 1 (with dp), 2 or 3 (instead of dp) */
    zs_ps *ps;            /* made when the run starts, after any resume */
    zs_onebit *ob;        /* 1-bit Adam's momentum all-reduce (several ranks) */
    int64_t comm_bytes;   /* sent by this rank in the last step */
    int64_t step;         /* next step */
    double peak;          /* FLOP/s of the computing ranks together */
    zs_train_profile prof;
    /* the loop */
    double t0, last_val;
    int64_t first_step;   /* of this run, for the ETA */
    int64_t targets;      /* elements of y in the step (synchronous: counted
                           * by its micro-batches; the server: of batch 0;
                           * -1: not yet known) */
    double loss_sum, t_step; /* the server: losses of this step's updates */
    /* mixed precision */
    zs_grad_scaler *scaler; /* f16 and fp8: dynamic loss scaling */
    zs_tensor *fp_low;      /* the weights in the products' dtype, rewritten
                             * from fp once per step (owned) */
    double step_scale;      /* the loss scale of the last step */
    bool skipped;           /* the last step's update was skipped */
    /* graph mode (graph_step.c) */
    struct zs_graph *graph;
    zs_tensor *gx, *gy;      /* the captured batch buffers (owned) */
    zs_tensor *gloss, *gsq;  /* the captured loss and sum of squared
                              * gradients (owned; gsq NULL without clip) */
    zs_tensor *gsched;       /* f64 [2] {lr, step}: the step scalars the
                              * captured update reads, filled before each
                              * capture and replay (owned) */
    bool gupdate;            /* the graph holds the clip and the update */
    bool gdry;               /* the graph was captured dry (zs/graph.h) */
    bool gprofiled;          /* dump_graph: this graph's replays are timed,
                              * its profile not yet written (the first
                              * capture's only) */
    uint64_t gsig;           /* the captured step's signature */
    int64_t captures;        /* graphs captured so far */
    size_t gpeak, garena;    /* the last capture: the allocator's peak
                              * during it above its start; the plan's arena */
    /* model parallelism (parallel3d.c); NULL: none. comm, rank and size
     * are then the dp group's, except rank: the world rank (rank 0 logs),
     * and m the part of the model this rank trains */
    struct zsi_par *par;
};
/* Model parallelism (parallel3d.c). Whether the config asks for it; its
 * config mistakes; setup (t->comm the world; on success t->m, t->comm
 * and t->size become this rank's part and dp group); free. */
bool zsi_par_wanted(const zs_trainer_config *c);
zs_status zsi_par_check(const zs_trainer_config *c);
zs_status zsi_par_setup(zs_trainer *t);
void zsi_par_free(zs_trainer *t);
void zsi_par_log_setup(const zs_trainer *t);
void zsi_par_log_end(const zs_trainer *t);
/* The averaged gradients and the mean loss of step `step` (global batch). */
zs_status zsi_par_gradients(zs_trainer *t, int64_t step, double *loss);
/* The norm of the whole model's gradient (over tp and pp, each
 * parameter once). Collective. */
zs_status zsi_par_grad_norm(zs_trainer *t, double *norm);
/* Validation on the split model (forward only, the loss by the last
 * stage), the same on every rank. Collective. */
double zsi_par_validate(zs_trainer *t);
/* Checkpoints in the one-process layout (par_ckpt.c), gathered to and
 * written by world rank 0 one parameter at a time (meta: its metadata,
 * read there only), or read by every rank for its part; local: the
 * optimizer over t->fp whose moments go with the parameters (NULL:
 * none). Collective; every rank returns the same status. */
zs_status zsi_par_save(zs_trainer *t, const char *path, const char *meta, zs_optim *local);
zs_status zsi_par_load(zs_trainer *t, const char *path, zs_optim *local, char **meta);
/* Every rank's parameters, model state and allocator bytes (now, peak),
 * printed by world rank 0 to the log. Collective. */
void zsi_par_log_memory(zs_trainer *t);
/* The grid's whole communicator (borrowed): what every rank must agree
 * on, such as the loss scaler's Inf/NaN flag. */
zs_comm *zsi_par_world(zs_trainer *t);
/* The pipeline's fields of the profile; their reset. */
void zsi_par_profile(const zs_trainer *t, zs_train_profile *p);
void zsi_par_profile_reset(zs_trainer *t);

/* Autocast for the trainer's precision (nothing for f32); flat: with the
 * step's one conversion pass of the flat weights. amp_end pops it. */
zs_status zsi_train_amp_begin(zs_trainer *t, bool flat);
void zsi_train_amp_end(zs_trainer *t);
/* The loss scaler's pass before an update (nothing without a scaler):
 * the gradients in hand unscaled, Inf/NaN agreed by every rank; *skip:
 * the update must be skipped (zsi_train_optim_step still ends the step). */
zs_status zsi_train_unscale(zs_trainer *t, bool *skip);
/* The optimizer step with the clip factor, through the scaler when there
 * is one (which skips it after Inf/NaN and moves the scale). */
zs_status zsi_train_optim_step(zs_trainer *t, double lr, double grad_scale);
/* Rank 0's setup line of the precision (nothing for f32). */
void zsi_train_log_precision(const zs_trainer *t);

double zsi_train_now(void);
/* Clipping and the optimizer update of step `step` on the gradients in
 * hand (the averaged flat gradient, or ZeRO's shard): one norm pass, then
 * the update with the clip factor fused in. *gnorm gets the norm. */
zs_status zsi_train_update(zs_trainer *t, int64_t step, double *gnorm);
/* The bookkeeping after step `step` (loss, seconds): the event, validation
 * and checkpoint when due. 0: go on; 1: the run ends; < 0: failed. */
int zsi_train_after_step(zs_trainer *t, int64_t step, double loss, double gnorm,
                         double dt);
/* This rank's rows of a global batch: [part * B / parts, ...). */
void zsi_train_my_rows(zs_tensor **x, zs_tensor **y, int part, int parts);
/* One micro-batch: global batch `index`, rows of part (of parts), loss
 * (scaled by 1 / accum) and backward; *loss gets the unscaled loss. Under
 * ZeRO the micro-batch is reduced into the shard; with dp and last, the
 * buckets are reduced during this backward. */
zs_status zsi_train_micro(zs_trainer *t, int64_t index, int part, int parts,
                          bool last, double *loss);
/* The accum micro-batches of global step i on rows part of parts, each in
 * its scope; *loss gets their mean loss. */
zs_status zsi_train_accumulate(zs_trainer *t, int64_t i, int part, int parts,
                               double *loss);
/* Graph mode: one step (gradients by capture or replay, then the eager
 * clip and update); *loss and *gnorm as sync_step's. */
zs_status zsi_train_graph_step(zs_trainer *t, int64_t step, double *loss,
                               double *gnorm);
/* Frees the graph-mode state. */
void zsi_train_graph_free(zs_trainer *t);
/* ASYNC and SSP: the server (rank 0) or a worker until the last step. */
zs_status zsi_train_run_async(zs_trainer *t);
/* 1-bit Adam (onebit.c): the config's conflicts (ZS_OK or an error); the
 * compressed momentum all-reduce made and handed to the optimizer, and
 * the setup line logged; whether this step skips the gradient all-reduce;
 * the bytes this rank sends averaging this step (local: it does skip). */
zs_status zsi_train_onebit_check(const zs_trainer_config *c);
zs_status zsi_train_onebit_setup(zs_trainer *t);
bool zsi_train_grads_local(const zs_trainer *t);
int64_t zsi_train_step_bytes(const zs_trainer *t, bool local);

/* Every rank's flat parameters hash alike, or an error naming the rank
 * that diverged. Collective. */
zs_status zsi_train_check_replicas(zs_trainer *t);

#endif
