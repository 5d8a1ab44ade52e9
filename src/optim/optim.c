/*
 * optim.c - SGD (momentum, Nesterov, weight decay), Adam and AdamW, as
 * fused per-element loops over f32 parameters, split across the pool.
 *
 * Update rules (PyTorch's, so runs can be compared step for step):
 *   SGD:   g += wd*p; b = mu*b + g (b = g at the first step);
 *          d = nesterov ? g + mu*b : b; p -= lr*d
 *   Adam:  g += wd*p; m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g^2;
 *          p -= lr * (m/(1-b1^t)) / (sqrt(v/(1-b2^t)) + eps)
 *   AdamW: p *= 1 - lr*wd, then the Adam update without the L2 term.
 *   1-bit Adam: AdamW for freeze_step steps, then v frozen and the
 *          momentum averaged by a reduce function (onebit_adam.c).
 * Moments are kept in f32 and accumulated in f32, as PyTorch does.
 *
 * A step is one fused operator call per parameter (zs/ops.h, defined in
 * ops/optim_update.c): zs_sgd_update_ over (p, g[, momentum buffer]) or
 * zs_adam_update_ over (p, g, m, v), in place, on the parameters' device.
 * The gradient norm is zs_sum_squares per gradient (a running f64 total on
 * the gradients' device, read once at the end), clipping is zs_scale_.
 */
#include <math.h>
#include <stdlib.h>

#include "core/internal.h"
#include "kernels/cpu/optim.h"
#include "optim/internal.h"
#include "zs/ops.h"
#include "zs/optim.h"

struct zs_optim {
    zs_optim_config cfg;
    int n;
    zs_tensor **params;
    zs_tensor **m, **v; /* momentum buffer (SGD) or moments (Adam) */
    int64_t steps;
    int64_t freeze_step; /* 1-bit Adam: the AdamW steps */
    /* 1-bit Adam: the frozen denominators (made at the first frozen
     * step) and the momentum averaging */
    zs_tensor **denom;
    zs_optim_reduce_fn reduce;
    void *reduce_ctx;
};

/* The optimizer of cfg (1-bit Adam's freeze_step checked by the caller). */
static zs_optim *make(const zs_optim_config *cfg, int64_t freeze_step, int n,
                      zs_tensor **params)
{
    zs_optim_config c = *cfg;
    if (c.beta1 == 0 && c.beta2 == 0) {
        c.beta1 = 0.9;
        c.beta2 = 0.999;
    }
    if (c.eps == 0)
        c.eps = 1e-8;
    if (!(c.lr >= 0) || !(c.momentum >= 0 && c.momentum < 1) ||
        !(c.weight_decay >= 0) || !(c.beta1 >= 0 && c.beta1 < 1) ||
        !(c.beta2 >= 0 && c.beta2 < 1) || !(c.eps > 0) ||
        (unsigned)c.kind > ZS_ONEBIT_ADAM) {
        zs_set_error("optim: bad config (lr %g, momentum %g, weight decay %g, "
                     "betas %g %g, eps %g)", c.lr, c.momentum, c.weight_decay,
                     c.beta1, c.beta2, c.eps);
        return NULL;
    }
    for (int i = 0; i < n; i++) {
        if (!params[i] || params[i]->dtype != ZS_F32 || !zs_is_contiguous(params[i])) {
            zs_set_error("optim: parameter %d is not a contiguous f32 tensor", i);
            return NULL;
        }
    }
    zs_optim *o = calloc(1, sizeof *o);
    if (!o)
        goto oom;
    o->cfg = c;
    o->freeze_step = freeze_step;
    o->params = calloc((size_t)n + 1, sizeof *o->params);
    o->m = calloc((size_t)n + 1, sizeof *o->m);
    o->v = calloc((size_t)n + 1, sizeof *o->v);
    o->denom = calloc((size_t)n + 1, sizeof *o->denom);
    if (!o->params || !o->m || !o->v || !o->denom)
        goto oom;
    o->n = n;
    zsi_tracking_pause();
    bool ok = true;
    for (int i = 0; i < n; i++) {
        o->params[i] = zs_retain(params[i]);
        bool need_m = c.kind != ZS_SGD || c.momentum > 0;
        if (need_m && !(o->m[i] = zs_zeros_like(params[i])))
            ok = false;
        if (c.kind != ZS_SGD && !(o->v[i] = zs_zeros_like(params[i])))
            ok = false;
    }
    zsi_tracking_resume();
    if (ok)
        return o;
oom:
    zs_optim_free(o);
    zs_set_error_code(ZS_ERR_NOMEM, "optim: out of memory");
    return NULL;
}

zs_optim *zs_optim_new(const zs_optim_config *cfg, int n, zs_tensor **params)
{
    if (cfg->kind == ZS_ONEBIT_ADAM) {
        zs_set_error("optim: 1-bit Adam is made by zs_optim_new_onebit (it needs "
                     "freeze_step)");
        return NULL;
    }
    return make(cfg, 0, n, params);
}

zs_optim *zs_optim_new_onebit(const zs_optim_config *cfg, int64_t freeze_step, int n,
                              zs_tensor **params)
{
    if (cfg->kind != ZS_ONEBIT_ADAM) {
        zs_set_error("optim: zs_optim_new_onebit with kind %d, expected ZS_ONEBIT_ADAM",
                     (int)cfg->kind);
        return NULL;
    }
    if (freeze_step < 1) {
        zs_set_error("optim: 1-bit Adam with freeze_step %lld, expected >= 1 (the "
                     "AdamW steps that set the variance before it is frozen)",
                     (long long)freeze_step);
        return NULL;
    }
    return make(cfg, freeze_step, n, params);
}

void zs_optim_free(zs_optim *o)
{
    if (!o)
        return;
    for (int i = 0; i < o->n; i++) {
        zs_release(o->params[i]);
        zs_release(o->m[i]);
        zs_release(o->v[i]);
        if (o->denom)
            zs_release(o->denom[i]);
    }
    free(o->denom);
    free(o->params);
    free(o->m);
    free(o->v);
    free(o);
}

zs_status zs_optim_step(zs_optim *o, double lr)
{
    return zs_optim_step_scaled(o, lr, 1.0);
}

zs_status zs_optim_step_scaled(zs_optim *o, double lr, double grad_scale)
{
    if (!o)
        return ZS_ERR_ARG;
    if (!(grad_scale > 0) || !isfinite(grad_scale))
        return zs_set_error("optim: gradient scale %g is not a positive finite "
                            "number", grad_scale);
    /* all gradients checked first: a step updates every parameter or none */
    for (int i = 0; i < o->n; i++) {
        zs_tensor *p = o->params[i], *g = p->grad;
        if (g && (g->dtype != ZS_F32 || !zs_is_contiguous(g) || zs_numel(g) != zs_numel(p)))
            return zs_set_error("optim: gradient of parameter %d is not a "
                                "contiguous f32 tensor of its shape", i);
    }
    o->steps++;
    const zs_optim_config *c = &o->cfg;
    zs_sgd_step ss = {lr, c->momentum, c->weight_decay, c->nesterov, o->steps,
                      grad_scale};
    zs_adam_step as = {lr, c->beta1, c->beta2, c->eps, c->weight_decay,
                       c->kind == ZS_ADAMW || c->kind == ZS_ONEBIT_ADAM, o->steps,
                       grad_scale};
    bool frozen = c->kind == ZS_ONEBIT_ADAM && o->steps > o->freeze_step;
    for (int i = 0; i < o->n; i++) {
        zs_tensor *p = o->params[i];
        if (!p->grad)
            continue;
        zs_status st = c->kind == ZS_SGD
                           ? zs_sgd_update_(p, p->grad, o->m[i], &ss)
                       : frozen
                           ? zsi_onebit_adam_step(c, o->freeze_step, o->steps, lr,
                                                  grad_scale, i, p, p->grad, o->m[i],
                                                  o->v[i], &o->denom[i], o->reduce,
                                                  o->reduce_ctx)
                           : zs_adam_update_(p, p->grad, o->m[i], o->v[i], &as);
        if (st != ZS_OK)
            return st;
    }
    return ZS_OK;
}

zs_status zs_optim_step_dyn(zs_optim *o, zs_tensor *sched, zs_tensor *coef)
{
    if (!o)
        return ZS_ERR_ARG;
    const zs_optim_config *c = &o->cfg;
    if (c->kind == ZS_ONEBIT_ADAM)
        return zs_set_error("optim: 1-bit Adam has no update with device scalars "
                            "(its frozen steps average the momenta on the host side)");
    for (int i = 0; i < o->n; i++) { /* as zs_optim_step_scaled: all or none */
        zs_tensor *p = o->params[i], *g = p->grad;
        if (g && (g->dtype != ZS_F32 || !zs_is_contiguous(g) || zs_numel(g) != zs_numel(p)))
            return zs_set_error("optim: gradient of parameter %d is not a "
                                "contiguous f32 tensor of its shape", i);
    }
    /* lr, step and grad_scale come from sched and coef */
    zs_sgd_step ss = {0, c->momentum, c->weight_decay, c->nesterov, 1, 1};
    zs_adam_step as = {0, c->beta1, c->beta2, c->eps, c->weight_decay,
                       c->kind == ZS_ADAMW, 1, 1};
    for (int i = 0; i < o->n; i++) {
        zs_tensor *p = o->params[i];
        if (!p->grad)
            continue;
        zs_status st = c->kind == ZS_SGD
                           ? zs_sgd_update_dyn_(p, p->grad, o->m[i], &ss, sched, coef)
                           : zs_adam_update_dyn_(p, p->grad, o->m[i], o->v[i], &as,
                                                 sched, coef);
        if (st != ZS_OK)
            return st;
    }
    return ZS_OK;
}

int64_t zs_optim_steps(const zs_optim *o) { return o ? o->steps : 0; }
void zs_optim_set_steps(zs_optim *o, int64_t steps)
{
    if (!o)
        return;
    o->steps = steps;
    for (int i = 0; i < o->n; i++) { /* v may have been loaded: recomputed */
        zs_release(o->denom[i]);
        o->denom[i] = NULL;
    }
}

void zs_optim_set_momentum_reduce(zs_optim *o, zs_optim_reduce_fn fn, void *ctx)
{
    if (o) {
        o->reduce = fn;
        o->reduce_ctx = ctx;
    }
}

bool zs_optim_grads_local(const zs_optim *o)
{
    return o && o->cfg.kind == ZS_ONEBIT_ADAM && o->steps >= o->freeze_step;
}

int zs_optim_state(zs_optim *o, int max, const char **names, zs_tensor **ts)
{
    static _Thread_local char buf[64][32];
    int k = 0;
    for (int i = 0; i < o->n && k < max && k < 62; i++) {
        if (o->m[i]) {
            snprintf(buf[k], sizeof buf[k], "%s.%d",
                     o->cfg.kind == ZS_SGD ? "momentum" : "exp_avg", i);
            names[k] = buf[k];
            ts[k++] = o->m[i];
        }
        if (o->v[i] && k < max) {
            snprintf(buf[k], sizeof buf[k], "exp_avg_sq.%d", i);
            names[k] = buf[k];
            ts[k++] = o->v[i];
        }
    }
    return k;
}

zs_tensor **zs_optim_params(zs_optim *o, int *n)
{
    *n = o ? o->n : 0;
    return o ? o->params : NULL;
}

zs_tensor *zs_optim_moment(zs_optim *o, int which, int i)
{
    if (!o || i < 0 || i >= o->n || which < 0 || which > 1)
        return NULL;
    return which == 0 ? o->m[i] : o->v[i];
}

double zs_lr_at(const zs_lr_schedule *s, int64_t step)
{
    if (s->kind != ZS_LR_CONSTANT && step < s->warmup_steps)
        return s->base_lr * (double)(step + 1) / (double)s->warmup_steps;
    switch (s->kind) {
    case ZS_LR_STEP:
        return s->base_lr * pow(s->gamma, (double)((step - s->warmup_steps) /
                                                   (s->step_size > 0 ? s->step_size : 1)));
    case ZS_LR_COSINE: {
        int64_t span = s->total_steps - s->warmup_steps;
        double t = span > 0 ? (double)(step - s->warmup_steps) / (double)span : 1;
        if (t > 1)
            t = 1;
        return s->min_lr + 0.5 * (s->base_lr - s->min_lr) * (1 + cos(M_PI * t));
    }
    default:
        return s->base_lr;
    }
}

/* ---- gradient norm -------------------------------------------------------- */

double zs_grad_norm(int n, zs_tensor **params)
{
    zs_tensor *total = NULL; /* running sum, on the gradients' device */
    bool failed = false;
    zsi_tracking_pause();
    for (int i = 0; i < n && !failed; i++) {
        zs_tensor *g = params[i] ? params[i]->grad : NULL;
        if (!g)
            continue;
        zs_tensor *s = zs_sum_squares(g, total);
        zs_release(total);
        total = s;
        failed = !s;
    }
    double sum = total ? zs_item(total) : 0; /* the one read */
    zs_release(total);
    zsi_tracking_resume();
    return failed ? NAN : sqrt(sum);
}

double zs_clip_coef(double norm, double max_norm)
{
    return zsk_clip_coef(norm, max_norm); /* shared with the clip_coef operator */
}

double zs_clip_grad_norm(int n, zs_tensor **params, double max_norm)
{
    double norm = zs_grad_norm(n, params), scale = zs_clip_coef(norm, max_norm);
    if (scale == 1.0)
        return norm;
    for (int i = 0; i < n; i++) {
        zs_tensor *g = params[i] ? params[i]->grad : NULL;
        if (g && zs_scale_(g, scale) != ZS_OK)
            return NAN;
    }
    return norm;
}
