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
 * Moments are kept in f32 and accumulated in f32, as PyTorch does.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "kernels/cpu/optim.h"
#include "zs/ops.h"
#include "zs/optim.h"

struct zs_optim {
    zs_optim_config cfg;
    int n;
    zs_tensor **params;
    zs_tensor **m, **v; /* momentum buffer (SGD) or moments (Adam) */
    int64_t steps;
};

zs_optim *zs_optim_new(const zs_optim_config *cfg, int n, zs_tensor **params)
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
        (unsigned)c.kind > ZS_ADAMW) {
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
    o->params = calloc((size_t)n + 1, sizeof *o->params);
    o->m = calloc((size_t)n + 1, sizeof *o->m);
    o->v = calloc((size_t)n + 1, sizeof *o->v);
    if (!o->params || !o->m || !o->v)
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

void zs_optim_free(zs_optim *o)
{
    if (!o)
        return;
    for (int i = 0; i < o->n; i++) {
        zs_release(o->params[i]);
        zs_release(o->m[i]);
        zs_release(o->v[i]);
    }
    free(o->params);
    free(o->m);
    free(o->v);
    free(o);
}

/* Scalars of one step. As in PyTorch, they are computed in double from
 * the double hyper-parameters and rounded to float once: (1 - beta2) from a
 * float-rounded beta2 = 0.9999 is off by 1.7e-4 relative, and 1 - beta^t
 * loses digits in float when beta is close to 1. */
/* What one pool task needs: the step's scalars (computed in double from
 * the double hyper-parameters and rounded to float once, as PyTorch does:
 * (1 - beta2) from a float-rounded beta2 = 0.9999 is off by 1.7e-4
 * relative, and 1 - beta^t loses digits in float when beta is close to 1)
 * and one parameter's buffers. */
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

static step_job step_job_of(const zs_optim *o, double lr, double gscale)
{
    const zs_optim_config *c = &o->cfg;
    double t = (double)o->steps;
    step_job j = {.adam = c->kind != ZS_SGD};
    j.a = (zsk_adam_args){
        .b2 = (float)c->beta2, .one_m_b1 = (float)(1 - c->beta1),
        .one_m_b2 = (float)(1 - c->beta2), .eps = (float)c->eps,
        .wd = (float)c->weight_decay,
        .decay = c->kind == ZS_ADAMW ? (float)(1 - lr * c->weight_decay) : 1.0f,
        .step_size = (float)(lr / (1 - pow(c->beta1, t))),
        .bc2_sqrt = (float)sqrt(1 - pow(c->beta2, t)),
        .gscale = (float)gscale, .decoupled = c->kind == ZS_ADAMW,
    };
    j.s = (zsk_sgd_args){(float)lr, (float)c->weight_decay, (float)c->momentum,
                         (float)gscale, c->nesterov, o->steps == 1};
    return j;
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
    for (int i = 0; i < o->n; i++) {
        zs_tensor *p = o->params[i], *g = p->grad;
        if (g && (g->dtype != ZS_F32 || !zs_is_contiguous(g) || zs_numel(g) != zs_numel(p)))
            return zs_set_error("optim: gradient of parameter %d is not a "
                                "contiguous f32 tensor of its shape", i);
    }
    o->steps++;
    step_job j = step_job_of(o, lr, grad_scale);
    for (int i = 0; i < o->n; i++) {
        zs_tensor *p = o->params[i];
        if (!p->grad)
            continue;
        j.p = zs_data(p);
        j.m = o->m[i] ? zs_data(o->m[i]) : NULL;
        j.v = o->v[i] ? zs_data(o->v[i]) : NULL;
        j.g = zs_data(p->grad);
        zs_parallel_for(zs_numel(p), 16384, step_body, &j);
    }
    return ZS_OK;
}

int64_t zs_optim_steps(const zs_optim *o) { return o ? o->steps : 0; }
void zs_optim_set_steps(zs_optim *o, int64_t steps)
{
    if (o)
        o->steps = steps;
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

double zs_grad_norm(int n, zs_tensor **params)
{
    double total = 0;
    for (int i = 0; i < n; i++) {
        zs_tensor *g = params[i] ? params[i]->grad : NULL;
        if (!g)
            continue;
        if (g->dtype == ZS_F32 && zs_is_contiguous(g)) {
            total += zsk_sumsq_f32(zs_data(g), zs_numel(g));
        } else {
            for (int64_t k = 0; k < zs_numel(g); k++) {
                double v = zs_get(g, k);
                total += v * v;
            }
        }
    }
    return sqrt(total);
}

double zs_clip_coef(double norm, double max_norm)
{
    if (!isfinite(norm) || max_norm <= 0 || norm <= max_norm)
        return 1.0;
    return max_norm / (norm + 1e-6);
}

double zs_clip_grad_norm(int n, zs_tensor **params, double max_norm)
{
    double norm = zs_grad_norm(n, params), scale = zs_clip_coef(norm, max_norm);
    if (scale == 1.0)
        return norm;
    for (int i = 0; i < n; i++) {
        zs_tensor *g = params[i] ? params[i]->grad : NULL;
        if (!g)
            continue;
        if (g->dtype == ZS_F32 && zs_is_contiguous(g)) {
            zsk_scale_f32(zs_data(g), zs_numel(g), (float)scale);
        } else {
            zsi_tracking_pause();
            zs_tensor *t = zs_mul_scalar(g, scale);
            if (t)
                zs_copy_(g, t);
            zs_release(t);
            zsi_tracking_resume();
        }
    }
    return norm;
}
