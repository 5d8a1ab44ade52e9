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
 *
 * Each rule is an in-place descriptor run by the ops driver (ops/op.h),
 * one call per parameter: "sgd_update" over (p, g[, momentum buffer]),
 * "adam_update" over (p, g, m, v), the step's float scalars in its typed
 * attributes; the CPU kernels run the fused zsk loops on the pool. The
 * gradient norm is "sum_squares" per gradient (a running f64 total on
 * the gradients' device, read once at the end), clipping is scale_.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "kernels/cpu/optim.h"
#include "ops/op.h"
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

/* ---- the update descriptors ---------------------------------------------- */

/* Attributes: the step's scalars, computed in double from the double
 * hyper-parameters and rounded to float once, as PyTorch does ((1 - beta2)
 * from a float-rounded beta2 = 0.9999 is off by 1.7e-4 relative, and
 * 1 - beta^t loses digits in float when beta is close to 1). */
typedef struct sgd_update_attrs {
    zsk_sgd_args s;
} sgd_update_attrs;
ZSI_ATTRS(sgd_update_attrs);

typedef struct adam_update_attrs {
    zsk_adam_args a; /* AdamW: a.decoupled, a.decay = 1 - lr * wd */
} adam_update_attrs;
ZSI_ATTRS(adam_update_attrs);

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
    c->dtype = p->dtype;
    c->ndim = p->ndim;
    memcpy(c->shape, p->shape, sizeof c->shape);
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

static void step_args(const zs_optim *o, double lr, double gscale,
                      sgd_update_attrs *sa, adam_update_attrs *aa)
{
    const zs_optim_config *c = &o->cfg;
    double t = (double)o->steps;
    aa->a = (zsk_adam_args){
        .b2 = (float)c->beta2, .one_m_b1 = (float)(1 - c->beta1),
        .one_m_b2 = (float)(1 - c->beta2), .eps = (float)c->eps,
        .wd = (float)c->weight_decay,
        .decay = c->kind == ZS_ADAMW ? (float)(1 - lr * c->weight_decay) : 1.0f,
        .step_size = (float)(lr / (1 - pow(c->beta1, t))),
        .bc2_sqrt = (float)sqrt(1 - pow(c->beta2, t)),
        .gscale = (float)gscale, .decoupled = c->kind == ZS_ADAMW,
    };
    sa->s = (zsk_sgd_args){(float)lr, (float)c->weight_decay, (float)c->momentum,
                           (float)gscale, c->nesterov, o->steps == 1};
}

zs_status zs_optim_step(zs_optim *o, double lr)
{
    return zs_optim_step_scaled(o, lr, 1.0);
}

/* ZS_OK, or the failure of a driver call that returned r (message set) */
static zs_status ran(zs_tensor *r)
{
    if (!r)
        return ZS_ERR_ARG;
    zs_release(r);
    return ZS_OK;
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
    sgd_update_attrs sa;
    adam_update_attrs aa;
    step_args(o, lr, grad_scale, &sa, &aa);
    bool adam = o->cfg.kind != ZS_SGD;
    for (int i = 0; i < o->n; i++) {
        zs_tensor *p = o->params[i];
        if (!p->grad)
            continue;
        zs_tensor *in[4] = {p, p->grad, o->m[i], o->v[i]};
        zs_status st = adam ? ran(zsi_run(&zsi_def_adam_update, 4, in, &aa))
                            : ran(zsi_run(&zsi_def_sgd_update, o->m[i] ? 3 : 2, in, &sa));
        if (st != ZS_OK)
            return st;
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

/* ---- gradient norm -------------------------------------------------------- */

/* sum_squares(x[, acc]) = acc + sum of x[i]^2, in double, as a 0-d f64
 * tensor: f32 contiguous x over the pool (zsk_sumsq_f32: fixed chunks
 * whose partial sums are added in order), any other layout or float dtype
 * element by element in row-major order, each square added to the running
 * total. zs_grad_norm passes each result on as the next acc, so the sum
 * over parameters has the order (and the bits) of one loop. acc: a
 * 1-element f64 tensor. Not differentiable. */
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

double zs_grad_norm(int n, zs_tensor **params)
{
    zs_tensor *total = NULL; /* running sum, on the gradients' device */
    bool failed = false;
    zsi_tracking_pause();
    for (int i = 0; i < n && !failed; i++) {
        zs_tensor *g = params[i] ? params[i]->grad : NULL;
        if (!g)
            continue;
        zs_tensor *in[2] = {g, total};
        zs_tensor *s = zsi_run(&zsi_def_sum_squares, total ? 2 : 1, in, NULL);
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
        if (g && zs_scale_(g, scale) != ZS_OK)
            return NAN;
    }
    return norm;
}
