/*
 * optim_update.c - the fused optimizer updates and the sum of squares of
 * the gradient norm, as operators: zs_sgd_update_, zs_adam_update_ and
 * zs_sum_squares (zs/ops.h), which the optimizer (src/optim/optim.c) runs
 * once per parameter.
 *
 * The updates are in-place descriptors ("sgd_update" over p, g[, momentum
 * buffer]; "adam_update" over p, g, m, v): one pass over each buffer, the
 * step's float scalars in the typed attributes, the CPU kernels the fused
 * zsk loops (kernels/cpu/optim.h) split across the pool. The scalars are
 * computed in double from the double hyper-parameters and rounded to float
 * once, as PyTorch does ((1 - beta2) from a float-rounded beta2 = 0.9999
 * is off by 1.7e-4 relative, and 1 - beta^t loses digits in float when
 * beta is close to 1). "sum_squares" (x[, acc]) adds the squares of x to a
 * running f64 total kept on x's device, so a norm over many tensors is
 * read back once. None is differentiable.
 *
 * The _dyn updates and clip_coef are the same steps with the changing
 * scalars (lr, step, clip factor) read from device memory when the kernel
 * runs: what a captured training step (zs/graph.h) replays.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "kernels/cpu/optim.h"
#include "ops/attrs.h"
#include "ops/internal.h"

/* ---- sgd_update, adam_update ---------------------------------------------- */


/* p: contiguous f32; every other input (gradient, state buffers) a
 * contiguous f32 tensor of p's numel. */
static zs_status infer_update(zsi_call *c)
{
    const char *op = c->def->op.name;
    if (c->nin < 2 || c->nin > 4)
        return zs_set_error("%s: %d inputs, expected the parameter, its "
                            "gradient and the state buffers", op, c->nin);
    const zs_tensor *p = c->in[0];
    for (int i = 0; i < c->nin; i++) {
        const zs_tensor *t = c->in[i];
        if (t->dtype != ZS_F32 || !zs_is_contiguous(t) || zs_numel(t) != zs_numel(p)) {
            char a[96], b[96];
            return zs_set_error("%s: input %d is %s %s, expected a contiguous "
                                "f32 tensor of %lld elements (the parameter "
                                "%s)", op, i, zs_dtype_name(t->dtype),
                                zs_shape_str(t, a, sizeof a),
                                (long long)zs_numel(p), zs_shape_str(p, b, sizeof b));
        }
    }
    zsi_out_like(c, p);
    return ZS_OK;
}

/* What one pool task needs: the scalars and one parameter's buffers. */
typedef struct step_job {
    bool adam;
    zsk_adam_args a;
    zsk_sgd_args s;
    float *p, *m, *v;
    const float *g;
} step_job;

static void step_body(void *ctx, int64_t b, int64_t e)
{
    const step_job *j = ctx;
    if (j->adam)
        zsk_adam_f32(&j->a, j->p + b, j->m + b, j->v + b, j->g + b, e - b);
    else
        zsk_sgd_f32(&j->s, j->p + b, j->m ? j->m + b : NULL, j->g + b, e - b);
}

/* in: p, g[, b]; writes p and b */
static zs_status cpu_sgd(const zsi_call *c, zs_tensor *p)
{
    const sgd_update_attrs *a = c->attrs;
    step_job j = {.s = a->s, .p = zs_data(p), .g = zs_data(c->in[1]),
                  .m = c->nin > 2 ? zs_data(c->in[2]) : NULL};
    zs_parallel_for(zs_numel(p), 16384, step_body, &j);
    return ZS_OK;
}

/* in: p, g, m, v; writes p, m and v */
static zs_status cpu_adam(const zsi_call *c, zs_tensor *p)
{
    const adam_update_attrs *a = c->attrs;
    step_job j = {.adam = true, .a = a->a, .p = zs_data(p), .g = zs_data(c->in[1]),
                  .m = zs_data(c->in[2]), .v = zs_data(c->in[3])};
    zs_parallel_for(zs_numel(p), 16384, step_body, &j);
    return ZS_OK;
}

/* Every input read, p and the state buffers written. FLOPs per element as
 * the zsk loops compute them (a square root counts one): SGD g*gs + wd*p
 * and p -= lr*d (5), momentum b = mu*b + g (2, none at the first step),
 * Nesterov g + mu*b (2); Adam 16, AdamW 15 (p*decay instead of the L2
 * term's two). */
static zsi_cost update_cost(const zsi_call *c, const zs_tensor *p)
{
    double n = (double)zs_numel(p), per;
    if (c->def == &zsi_def_adam_update) {
        const adam_update_attrs *a = c->attrs;
        per = a->a.decoupled ? 15 : 16;
    } else {
        const sgd_update_attrs *a = c->attrs;
        per = 5 + (c->nin > 2 ? (a->s.first ? 0 : 2) + (a->s.nesterov ? 2 : 0) : 0);
    }
    zsi_cost k = {per * n, 0, 0};
    for (int i = 0; i < c->nin; i++) {
        k.bytes_read += (double)zs_nbytes(c->in[i]);
        if (i != 1) /* not the gradient */
            k.bytes_written += (double)zs_nbytes(c->in[i]);
    }
    return k;
}

zsi_opdef zsi_def_sgd_update = {
    .op = {.name = "sgd_update"}, .arity = 0, .inplace = true,
    .infer = infer_update, .cost = update_cost,
    .attr_size = sizeof(sgd_update_attrs),
    .kernel = {[ZS_CPU] = {[ZS_F32] = cpu_sgd}},
};

zsi_opdef zsi_def_adam_update = {
    .op = {.name = "adam_update"}, .arity = 4, .inplace = true,
    .infer = infer_update, .cost = update_cost,
    .attr_size = sizeof(adam_update_attrs),
    .kernel = {[ZS_CPU] = {[ZS_F32] = cpu_adam}},
};

/* ZS_OK, or the failure of the driver call that returned r (message set,
 * or kept from a NULL input) */
static zs_status done(zs_tensor *r)
{
    if (!r)
        return ZS_ERR_ARG;
    zs_release(r);
    return ZS_OK;
}

/* The float scalars of a step, computed in double and rounded once: the
 * one place for the eager updates and the _dyn ones (same bits). */
static zsk_sgd_args sgd_args(const zs_sgd_step *s)
{
    return (zsk_sgd_args){(float)s->lr, (float)s->weight_decay, (float)s->momentum,
                          (float)s->grad_scale, s->nesterov, s->step == 1};
}

static zsk_adam_args adam_args(const zs_adam_step *s)
{
    double t = (double)s->step;
    return (zsk_adam_args){
        .b2 = (float)s->beta2, .one_m_b1 = (float)(1 - s->beta1),
        .one_m_b2 = (float)(1 - s->beta2), .eps = (float)s->eps,
        .wd = (float)s->weight_decay,
        .decay = s->adamw ? (float)(1 - s->lr * s->weight_decay) : 1.0f,
        .step_size = (float)(s->lr / (1 - pow(s->beta1, t))),
        .bc2_sqrt = (float)sqrt(1 - pow(s->beta2, t)),
        .gscale = (float)s->grad_scale, .decoupled = s->adamw,
    };
}

static zs_status check_step(const char *op, int64_t step)
{
    if (step < 1)
        return zs_set_error("%s: step %lld, expected the 1-based count of "
                            "this update (>= 1)", op, (long long)step);
    return ZS_OK;
}

zs_status zs_sgd_update_(zs_tensor *p, const zs_tensor *g, zs_tensor *momentum_buf,
                         const zs_sgd_step *s)
{
    if (check_step("sgd_update", s->step) != ZS_OK)
        return ZS_ERR_ARG;
    sgd_update_attrs a = {sgd_args(s)};
    zs_tensor *in[3] = {p, (zs_tensor *)g, momentum_buf};
    return done(zsi_run(&zsi_def_sgd_update, momentum_buf ? 3 : 2, in, &a));
}

zs_status zs_adam_update_(zs_tensor *p, const zs_tensor *g, zs_tensor *exp_avg,
                          zs_tensor *exp_avg_sq, const zs_adam_step *s)
{
    if (check_step("adam_update", s->step) != ZS_OK)
        return ZS_ERR_ARG;
    adam_update_attrs a = {adam_args(s)};
    zs_tensor *in[4] = {p, (zs_tensor *)g, exp_avg, exp_avg_sq};
    return done(zsi_run(&zsi_def_adam_update, 4, in, &a));
}

/* ---- sgd_update_dyn, adam_update_dyn, clip_coef ---------------------------- */

/* The updates with the step's changing scalars in device memory (graph
 * mode: a replay reads the values the trainer wrote before it, where the
 * eager descriptors' attributes would be frozen at the captured step).
 * Inputs: p, g, the state buffers (nstate: SGD 0 or 1, Adam 2), sched
 * (f64 [2]: lr, the 1-based step) and, with attrs.coef, the gradient scale
 * (one f64: clip_coef's result). The kernel fills the host step struct
 * from them and computes the float scalars with sgd_args / adam_args, so
 * the bits are the eager update's for the same values. */

static zs_status infer_update_dyn(zsi_call *c)
{
    const update_dyn_attrs *a = c->attrs;
    const char *op = c->def->op.name;
    int n = 2 + (int)a->nstate, want = n + 1 + (a->coef ? 1 : 0);
    if (c->nin != want || a->nstate < 0)
        return zs_set_error("%s: %d inputs, expected %d (the parameter, its gradient, "
                            "%lld state buffers, the step scalars%s)", op, c->nin, want,
                            (long long)a->nstate, a->coef ? ", the gradient scale" : "");
    zsi_call big = *c;
    big.nin = n;
    zs_status st = infer_update(&big);
    if (st != ZS_OK)
        return st;
    const zs_tensor *sc = c->in[n], *k = a->coef ? c->in[n + 1] : NULL;
    if (sc->dtype != ZS_F64 || zs_numel(sc) != 2 || !zs_is_contiguous(sc) ||
        (k && (k->dtype != ZS_F64 || zs_numel(k) != 1))) {
        char b1[96], b2[160] = "";
        if (k)
            snprintf(b2, sizeof b2, " and scale %s %s", zs_dtype_name(k->dtype),
                     zs_shape_str(k, b1, sizeof b1));
        return zs_set_error("%s: step scalars %s %s%s, expected a contiguous f64 [2] "
                            "(lr, step) and one f64 gradient scale", op,
                            zs_dtype_name(sc->dtype), zs_shape_str(sc, b1, sizeof b1), b2);
    }
    zsi_out_like(c, c->in[0]);
    return ZS_OK;
}

/* The lr, step and gradient scale the kernel reads, checked as the eager
 * path checks them (check_step, zs_optim_step_scaled's scale). */
static zs_status read_dyn(const zsi_call *c, double *lr, int64_t *step, double *gs)
{
    const update_dyn_attrs *a = c->attrs;
    int n = 2 + (int)a->nstate;
    const double *sc = zs_data(c->in[n]);
    *lr = sc[0];
    *step = (int64_t)sc[1];
    *gs = a->coef ? zs_get(c->in[n + 1], 0) : 1.0;
    if ((double)*step != sc[1] || *step < 1)
        return zs_set_error("%s: step %g, expected the 1-based count of this update (a "
                            "whole number >= 1)", c->def->op.name, sc[1]);
    if (!(*gs > 0) || !isfinite(*gs))
        return zs_set_error("%s: gradient scale %g is not a positive finite number (the "
                            "gradient norm was %s); nothing updated", c->def->op.name, *gs,
                            isnan(*gs) ? "NaN" : "not finite");
    return ZS_OK;
}

static zs_status cpu_sgd_dyn(const zsi_call *c, zs_tensor *p)
{
    const update_dyn_attrs *a = c->attrs;
    zs_sgd_step s = a->sgd;
    zs_status st = read_dyn(c, &s.lr, &s.step, &s.grad_scale);
    if (st != ZS_OK)
        return st;
    step_job j = {.s = sgd_args(&s), .p = zs_data(p), .g = zs_data(c->in[1]),
                  .m = a->nstate ? zs_data(c->in[2]) : NULL};
    zs_parallel_for(zs_numel(p), 16384, step_body, &j);
    return ZS_OK;
}

static zs_status cpu_adam_dyn(const zsi_call *c, zs_tensor *p)
{
    const update_dyn_attrs *a = c->attrs;
    zs_adam_step s = a->adam;
    zs_status st = read_dyn(c, &s.lr, &s.step, &s.grad_scale);
    if (st != ZS_OK)
        return st;
    step_job j = {.adam = true, .a = adam_args(&s), .p = zs_data(p), .g = zs_data(c->in[1]),
                  .m = zs_data(c->in[2]), .v = zs_data(c->in[3])};
    zs_parallel_for(zs_numel(p), 16384, step_body, &j);
    return ZS_OK;
}

/* update_cost's figures for the large inputs; the scalars are a few bytes
 * (the first step's SGD counts as a later one: the step is not known). */
static zsi_cost update_dyn_cost(const zsi_call *c, const zs_tensor *p)
{
    const update_dyn_attrs *a = c->attrs;
    double n = (double)zs_numel(p), per;
    if (c->def == &zsi_def_adam_update_dyn)
        per = a->adam.adamw ? 15 : 16;
    else
        per = 5 + (a->nstate ? 2 + (a->sgd.nesterov ? 2 : 0) : 0);
    zsi_cost k = {per * n, 0, 0};
    for (int i = 0; i < 2 + (int)a->nstate; i++) {
        k.bytes_read += (double)zs_nbytes(c->in[i]);
        if (i != 1)
            k.bytes_written += (double)zs_nbytes(c->in[i]);
    }
    return k;
}

zsi_opdef zsi_def_sgd_update_dyn = {
    .op = {.name = "sgd_update_dyn"}, .arity = 0, .inplace = true,
    .infer = infer_update_dyn, .cost = update_dyn_cost,
    .attr_size = sizeof(update_dyn_attrs),
    .kernel = {[ZS_CPU] = {[ZS_F32] = cpu_sgd_dyn}},
};

zsi_opdef zsi_def_adam_update_dyn = {
    .op = {.name = "adam_update_dyn"}, .arity = 0, .inplace = true,
    .infer = infer_update_dyn, .cost = update_dyn_cost,
    .attr_size = sizeof(update_dyn_attrs),
    .kernel = {[ZS_CPU] = {[ZS_F32] = cpu_adam_dyn}},
};

/* the inputs after the buffers: sched, then coef when given */
static int dyn_inputs(zs_tensor **in, int n, zs_tensor *sched, zs_tensor *coef)
{
    in[n++] = sched;
    if (coef)
        in[n++] = coef;
    return n;
}

zs_status zs_sgd_update_dyn_(zs_tensor *p, const zs_tensor *g, zs_tensor *momentum_buf,
                             const zs_sgd_step *s, zs_tensor *sched, zs_tensor *coef)
{
    update_dyn_attrs a = {.sgd = *s, .nstate = momentum_buf ? 1 : 0, .coef = coef != NULL};
    zs_tensor *in[5] = {p, (zs_tensor *)g, momentum_buf};
    if (!sched)
        return ZS_ERR_ARG; /* a failed call made it: its message is kept */
    int n = dyn_inputs(in, momentum_buf ? 3 : 2, sched, coef);
    return done(zsi_run(&zsi_def_sgd_update_dyn, n, in, &a));
}

zs_status zs_adam_update_dyn_(zs_tensor *p, const zs_tensor *g, zs_tensor *exp_avg,
                              zs_tensor *exp_avg_sq, const zs_adam_step *s,
                              zs_tensor *sched, zs_tensor *coef)
{
    update_dyn_attrs a = {.adam = *s, .nstate = 2, .coef = coef != NULL};
    zs_tensor *in[6] = {p, (zs_tensor *)g, exp_avg, exp_avg_sq};
    if (!sched)
        return ZS_ERR_ARG;
    int n = dyn_inputs(in, 4, sched, coef);
    return done(zsi_run(&zsi_def_adam_update_dyn, n, in, &a));
}

/* clip_coef(sq) = zsk_clip_coef(sqrt(sq), max_norm), NaN for a NaN sq: a
 * 0-d f64 on sq's device. */
static zs_status infer_clip_coef(zsi_call *c)
{
    const clip_coef_attrs *a = c->attrs;
    const zs_tensor *q = c->in[0];
    if (q->dtype != ZS_F64 || zs_numel(q) != 1) {
        char b[96];
        return zs_set_error("clip_coef: sum of squares %s %s, expected one f64 element "
                            "(zs_sum_squares' result)", zs_dtype_name(q->dtype),
                            zs_shape_str(q, b, sizeof b));
    }
    if (!(a->max_norm > 0) || !isfinite(a->max_norm))
        return zs_set_error("clip_coef: max_norm %g, expected a positive finite number",
                            a->max_norm);
    c->dtype = ZS_F64;
    c->ndim = 0;
    return ZS_OK;
}

static zs_status cpu_clip_coef(const zsi_call *c, zs_tensor *out)
{
    const clip_coef_attrs *a = c->attrs;
    double norm = sqrt(zs_get(c->in[0], 0)); /* as zs_grad_norm */
    *(double *)zs_data(out) = isnan(norm) ? NAN : zsk_clip_coef(norm, a->max_norm);
    return ZS_OK;
}

zsi_opdef zsi_def_clip_coef = {
    .op = {.name = "clip_coef"}, .arity = 1, .flops = 3,
    .infer = infer_clip_coef, .attr_size = sizeof(clip_coef_attrs),
    .kernel = {[ZS_CPU] = {[ZS_F64] = cpu_clip_coef}},
};

zs_tensor *zs_clip_coef_of(zs_tensor *sumsq, double max_norm)
{
    clip_coef_attrs a = {max_norm};
    return zsi_run(&zsi_def_clip_coef, 1, &sumsq, &a);
}

/* ---- sum_squares ------------------------------------------------------------ */

/* sum_squares(x[, acc]) = acc + sum of x[i]^2, in double, as a 0-d f64
 * tensor: f32 contiguous x over the pool (zsk_sumsq_f32: fixed chunks
 * whose partial sums are added in order), any other layout or float dtype
 * element by element in row-major order, each square added to the running
 * total. acc: a 1-element f64 tensor. */
static zs_status infer_sum_squares(zsi_call *c)
{
    const char *op = c->def->op.name;
    if (c->nin < 1 || c->nin > 2)
        return zs_set_error("%s: %d inputs, expected x and an optional "
                            "running total", op, c->nin);
    if (!zs_dtype_is_float(c->in[0]->dtype))
        return zs_set_error("%s: dtype %s is not supported, expected a float "
                            "dtype (convert with zs_to_dtype)", op,
                            zs_dtype_name(c->in[0]->dtype));
    if (c->nin == 2 && (c->in[1]->dtype != ZS_F64 || zs_numel(c->in[1]) != 1)) {
        char a[96];
        return zs_set_error("%s: running total %s %s, expected one f64 element",
                            op, zs_dtype_name(c->in[1]->dtype),
                            zs_shape_str(c->in[1], a, sizeof a));
    }
    c->dtype = ZS_F64;
    c->ndim = 0;
    return ZS_OK;
}

static zs_status cpu_sum_squares(const zsi_call *c, zs_tensor *out)
{
    const zs_tensor *x = c->in[0];
    double total = c->nin > 1 ? zs_get(c->in[1], 0) : 0;
    if (x->dtype == ZS_F32 && zs_is_contiguous(x)) {
        total += zsk_sumsq_f32(zs_data(x), zs_numel(x));
    } else {
        for (int64_t k = 0; k < zs_numel(x); k++) {
            double v = zs_get(x, k);
            total += v * v;
        }
    }
    *(double *)zs_data(out) = total;
    return ZS_OK;
}

/* x (and acc) read, one f64 written; a multiply and an add per element */
static zsi_cost sum_squares_cost(const zsi_call *c, const zs_tensor *out)
{
    zsi_cost k = {2 * (double)zs_numel(c->in[0]), 0, (double)zs_nbytes(out)};
    for (int i = 0; i < c->nin; i++)
        k.bytes_read += (double)zs_nbytes(c->in[i]);
    return k;
}

zsi_opdef zsi_def_sum_squares = {
    .op = {.name = "sum_squares"}, .arity = 0, .cls = ZSI_REDUCTION,
    .infer = infer_sum_squares, .cost = sum_squares_cost,
    .kernel = {[ZS_CPU] = {[ZS_F32] = cpu_sum_squares, [ZS_F64] = cpu_sum_squares,
                           [ZS_F16] = cpu_sum_squares, [ZS_BF16] = cpu_sum_squares,
                           [ZS_F8E4M3] = cpu_sum_squares,
                           [ZS_F8E5M2] = cpu_sum_squares}},
};

zs_tensor *zs_sum_squares(zs_tensor *x, zs_tensor *acc)
{
    zs_tensor *in[2] = {x, acc};
    return zsi_run(&zsi_def_sum_squares, acc ? 2 : 1, in, NULL);
}
