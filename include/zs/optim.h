/*
 * zs/optim.h - optimizers, learning-rate schedules, gradient clipping.
 *
 * An optimizer updates a list of parameters (leaf f32 tensors with .grad)
 * in place with one fused multithreaded loop per parameter. After
 * zs_module_flatten, pass the single flat parameter tensor (its .grad is
 * the flat gradient buffer) and a step is one loop over all the weights.
 */
#ifndef ZS_OPTIM_H
#define ZS_OPTIM_H

#include "core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ZS_ONEBIT_ADAM: 1-bit Adam (Tang et al. 2021; DeepSpeed's OnebitAdam).
 * Made by zs_optim_new_onebit, which takes freeze_step (zs_optim_new
 * refuses the kind). Steps 1 .. freeze_step are AdamW, the same numbers as
 * ZS_ADAMW. From step t = freeze_step + 1 on, the variance v is frozen and
 * each step is
 *     m = b1 m + (1 - b1) g'          (g' = grad_scale g, this rank's own)
 *     m = reduce(m)                   (zs_optim_set_momentum_reduce: the
 *                                      compressed average over the ranks)
 *     p = p (1 - lr wd) - lr / (1 - b1^t) * m / (sqrt(v / (1 - b2^T)) + eps)
 * with T = freeze_step: the bias corrections go on as Adam's for m and
 * stay where the freeze left them for v, so the update continues the
 * warm-up's smoothly. DeepSpeed's OnebitAdam applies no bias correction
 * (equal once b1^t and b2^T are ~0) and adds wd p to the update (AdamW's
 * decay up to rounding). The denominator is computed once, at the first
 * frozen step (and again after zs_optim_set_steps). Without a reduce
 * function (one process), m is this process's: Adam with v frozen. */
typedef enum zs_optim_kind { ZS_SGD, ZS_ADAM, ZS_ADAMW, ZS_ONEBIT_ADAM } zs_optim_kind;

typedef struct zs_optim_config {
    zs_optim_kind kind;
    double lr;
    double momentum;      /* SGD */
    bool nesterov;        /* SGD */
    double weight_decay;  /* SGD, Adam: L2 added to the gradient; AdamW: decoupled */
    double beta1, beta2, eps; /* Adam(W); 0 means the defaults 0.9, 0.999, 1e-8 */
} zs_optim_config;

typedef struct zs_optim zs_optim;

/* params are retained. NULL + message on a bad config (lr < 0, betas
 * outside [0, 1), non-f32 parameter, ...). */
zs_optim *zs_optim_new(const zs_optim_config *cfg, int n, zs_tensor **params);
/* 1-bit Adam (cfg->kind ZS_ONEBIT_ADAM; the other fields as AdamW's):
 * AdamW for freeze_step (>= 1) steps, then v frozen. */
zs_optim *zs_optim_new_onebit(const zs_optim_config *cfg, int64_t freeze_step, int n,
                              zs_tensor **params);
void zs_optim_free(zs_optim *o);
/* One update with learning rate lr (from a schedule); parameters whose grad
 * is NULL are skipped. */
zs_status zs_optim_step(zs_optim *o, double lr);
/* zs_optim_step with every gradient multiplied by grad_scale (> 0, finite)
 * as the update reads it, in the same pass over the memory: gradient
 * clipping (zs_grad_norm, zs_clip_coef, then this) costs one read of the
 * gradients for the norm and none for the scaling. The .grad buffers are
 * left unscaled. Equal to scaling the gradients in f32 first (the product
 * is rounded to f32 before use, as PyTorch's in-place clip does). */
zs_status zs_optim_step_scaled(zs_optim *o, double lr, double grad_scale);
/* The update of zs_optim_step_scaled with lr, the step count and the
 * gradient scale read from device memory when the kernels run
 * (zs_sgd_update_dyn_, zs_adam_update_dyn_): sched an f64 [2] {lr, step}
 * on the parameters' device, coef one f64 there (zs_clip_coef_of) or NULL
 * for 1. For a captured step (zs/graph.h) that a replay runs with the
 * values of its own step. The caller fills sched (step = zs_optim_steps(o)
 * + 1) and counts the step (zs_optim_set_steps) itself: a replay does not
 * run this function. Same bits as zs_optim_step_scaled with those values.
 * SGD, Adam, AdamW; 1-bit Adam refused. */
zs_status zs_optim_step_dyn(zs_optim *o, zs_tensor *sched, zs_tensor *coef);
int64_t zs_optim_steps(const zs_optim *o);
/* The state tensors (momentum / first and second moments), borrowed, and
 * the step counter, for checkpoints: names "exp_avg.<i>", "exp_avg_sq.<i>",
 * "momentum.<i>". Returns the count (<= max). */
int zs_optim_state(zs_optim *o, int max, const char **names, zs_tensor **ts);
/* The state of parameter i, borrowed: which 0 = momentum / first moment,
 * 1 = second moment; NULL when the optimizer keeps none (or i is out of
 * range). */
zs_tensor *zs_optim_moment(zs_optim *o, int which, int i);
void zs_optim_set_steps(zs_optim *o, int64_t steps);
/* The parameters the optimizer updates (borrowed array of *n). */
zs_tensor **zs_optim_params(zs_optim *o, int *n);

/* ---- dynamic loss scaling (as torch.cuda.amp.GradScaler) ---------------- */
/* FP16 gradients underflow where f32's do not: the loss is multiplied by
 * a scale before backward, the gradients divided by it before the update.
 * The scale halves (backoff) whenever a gradient holds Inf or NaN, and
 * that step is skipped; it doubles (growth) after growth_interval clean
 * steps in a row. A step:
 *     zs_backward(zs_grad_scaler_scale(s, loss), NULL, false);
 *     zs_grad_scaler_unscale(s, n, params);   optional: to clip first
 *     zs_grad_scaler_step(s, o, lr, clip_coef or 1);
 *     zs_grad_scaler_update(s);
 * Gradient accumulation: scale every micro-batch's loss, unscale once
 * before the step. Unscaling is one pass through the zs_unscale_
 * operator per gradient (any device); the found-Inf flag is read back
 * once. Not thread-safe: one scaler per training loop. */
typedef struct zs_grad_scaler_config {
    double init_scale;       /* 65536 (2^16) */
    double growth_factor;    /* 2 */
    double backoff_factor;   /* 0.5 */
    int64_t growth_interval; /* 2000 clean steps */
} zs_grad_scaler_config;
/* PyTorch's defaults, above. */
zs_grad_scaler_config zs_grad_scaler_defaults(void);

typedef struct zs_grad_scaler zs_grad_scaler;
/* cfg NULL: the defaults. NULL + message for a bad config (scale not
 * finite > 0, growth <= 1, backoff outside (0, 1), interval < 1). */
zs_grad_scaler *zs_grad_scaler_new(const zs_grad_scaler_config *cfg);
void zs_grad_scaler_free(zs_grad_scaler *s);
/* loss * scale (a new reference, differentiable; NULL passes through). */
zs_tensor *zs_grad_scaler_scale(zs_grad_scaler *s, zs_tensor *loss);
/* Divides the .grad of params (NULL grads skipped) by the scale in place
 * and records whether any held Inf/NaN: once per step, before clipping.
 * A second call before zs_grad_scaler_update is an error. */
zs_status zs_grad_scaler_unscale(zs_grad_scaler *s, int n, zs_tensor **params);
/* Or-s in a found-Inf flag from elsewhere (other ranks' gradient shards,
 * reduced by the caller), after unscale. */
void zs_grad_scaler_set_found_inf(zs_grad_scaler *s, bool found);
/* Whether the unscaled gradients of this step held Inf/NaN. */
bool zs_grad_scaler_found_inf(const zs_grad_scaler *s);
/* The optimizer step of o with learning rate lr and gradients multiplied
 * by grad_scale (a clip coefficient; 1: none) unless this step's
 * gradients held Inf/NaN: then nothing is updated (zs_grad_scaler_skipped
 * says so). Unscales o's parameters' gradients first when unscale was not
 * called. */
zs_status zs_grad_scaler_step(zs_grad_scaler *s, zs_optim *o, double lr,
                              double grad_scale);
/* The scale for the next step: backoff after Inf/NaN, growth after
 * growth_interval clean steps; ends the step. */
zs_status zs_grad_scaler_update(zs_grad_scaler *s);
/* The scale the next zs_grad_scaler_scale multiplies by. */
double zs_grad_scaler_get_scale(const zs_grad_scaler *s);
/* Whether the last zs_grad_scaler_step skipped the update. */
bool zs_grad_scaler_skipped(const zs_grad_scaler *s);
/* The state a checkpoint keeps: the scale and the clean steps counted
 * towards growth. set: scale finite > 0, growth_tracker >= 0. */
int64_t zs_grad_scaler_growth_tracker(const zs_grad_scaler *s);
zs_status zs_grad_scaler_set_state(zs_grad_scaler *s, double scale,
                                   int64_t growth_tracker);

/* 1-bit Adam's momentum averaging: called after the momentum update of
 * parameter i (its first moment m, contiguous f32 on the parameters'
 * device) in every frozen step, to replace m in place by its average over
 * the ranks (zs/onebit.h's compressed all-reduce). A failure (negative
 * status, message set) fails the step. */
typedef zs_status (*zs_optim_reduce_fn)(void *ctx, int i, zs_tensor *m);
/* Sets (or with NULL clears) the function; other kinds ignore it. */
void zs_optim_set_momentum_reduce(zs_optim *o, zs_optim_reduce_fn fn, void *ctx);
/* True when the next zs_optim_step reads each rank's own gradient: 1-bit
 * Adam past its freeze_step, where the momenta are averaged instead, so
 * data parallelism must not all-reduce the gradients of that step. */
bool zs_optim_grads_local(const zs_optim *o);

typedef enum zs_lr_kind { ZS_LR_CONSTANT, ZS_LR_STEP, ZS_LR_COSINE } zs_lr_kind;
typedef struct zs_lr_schedule {
    zs_lr_kind kind;
    double base_lr;
    int64_t warmup_steps;   /* linear warm-up from 0 (cosine and step) */
    int64_t total_steps;    /* cosine: decays to min_lr at total_steps */
    double min_lr;
    int64_t step_size;      /* step: multiply by gamma every step_size */
    double gamma;
} zs_lr_schedule;

/* Learning rate for step (0-based). */
double zs_lr_at(const zs_lr_schedule *s, int64_t step);

/* Global L2 norm of the gradients of params (NULL grads skipped), summed
 * in double over the pool; nothing is scaled. NaN + message when the
 * gradients cannot be summed (two devices, an integer dtype). */
double zs_grad_norm(int n, zs_tensor **params);
/* The factor torch.nn.utils.clip_grad_norm_ applies for a norm:
 * max_norm / (norm + 1e-6) when norm > max_norm > 0, else 1 (also for a
 * NaN/Inf norm: a step with such gradients should be skipped instead). */
double zs_clip_coef(double norm, double max_norm);
/* Scales all gradients so their global L2 norm is at most max_norm;
 * returns the norm before clipping (NaN/Inf when a gradient is not finite:
 * then nothing is scaled). */
double zs_clip_grad_norm(int n, zs_tensor **params, double max_norm);

#ifdef __cplusplus
}
#endif
#endif
