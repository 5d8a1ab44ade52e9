/*
 * norm.c - zs_layer_norm and zs_batch_norm as descriptors (class
 * ZSI_OTHER; kernels in kernels/cpu/norm.c).
 *
 * Both are single fused operators rather than compositions: the forward
 * kernel makes, as aux results when a node is recorded, its per-row
 * (layer norm, dtype of x, [R]) or per-channel (batch norm, f64, [C])
 * mean and rstd = 1/sqrt(var + eps), and the backward rule calls a fused
 * kernel directly instead of composing zs_* operators. The backward is
 * therefore not itself differentiable (no double backward); it is counted
 * in the profiler as "layer_norm_backward" or "batch_norm_backward".
 *
 * Node inputs are x followed by weight and bias when given (absent ones
 * are left out), and for batch norm running_mean and running_var (which
 * the training forward updates in place). Attributes: i[0], i[1] = the
 * input slot of weight and bias or -1 (node: p.i[4], p.i[5]), f[0] = eps;
 * batch norm adds i[2], i[3] = the slots of running_mean and running_var,
 * f[1] = momentum, f[2] = training (0 or 1) and saves p.i[8] = whether
 * batch statistics were used. Saved: 0 contiguous x, 1 contiguous weight
 * (or NULL), 2 mean, 3 rstd (the kernel's aux results 0..3).
 *
 * Cost models count the minimum traffic: inputs and parameters read once,
 * outputs (and saved statistics) written once; FLOPs are about 8 per
 * element forward and 10 per element backward.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/norm.h"
#include "ops/internal.h"

static zs_status layer_norm_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin);
static zs_status batch_norm_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin);

/* Profiler entries for the fused backward kernels (no node of their own). */
static zsi_op OP_LAYER_NORM_BW = {.name = "layer_norm_backward"};
static zsi_op OP_BATCH_NORM_BW = {.name = "batch_norm_backward"};

/* ---- shared helpers ---------------------------------------------------- */

/* p (weight, bias, running stats) must be NULL or a 1-D [C] tensor; with
 * same_dtype it must share x's dtype, else any float dtype. */
static zs_status check_vec(const char *op, const char *what,
                           const zs_tensor *x, const zs_tensor *p, int64_t C,
                           bool same_dtype)
{
    if (!p)
        return ZS_OK;
    zs_status st = same_dtype ? zsi_check_pair_dtype(op, x, p)
                              : zsi_check_float_dtype(op, p);
    if (st != ZS_OK)
        return st;
    if (p->ndim != 1 || p->shape[0] != C) {
        char sp[96], sx[96];
        return zs_set_error("%s: %s %s does not match x %s, expected [%lld]",
                            op, what, zs_shape_str(p, sp, sizeof sp),
                            zs_shape_str(x, sx, sizeof sx), (long long)C);
    }
    return ZS_OK;
}

static zs_status check_eps(const char *op, double eps)
{
    if (!(eps >= 0) || isinf(eps))
        return zs_set_error("%s: eps = %g, expected a finite value >= 0", op,
                            eps);
    return ZS_OK;
}

/* Compacts x and the given ones of opt[0..nopt) into in[] and records
 * the slot of each (-1 when absent); returns the count. */
static int pack_inputs(zs_tensor *x, zs_tensor *const *opt, int nopt,
                       zs_tensor **in, int64_t *slot)
{
    int k = 0;
    in[k++] = x;
    for (int i = 0; i < nopt; i++) {
        slot[i] = opt[i] ? k : -1;
        if (opt[i])
            in[k++] = opt[i];
    }
    return k;
}

/* Input slot s of c, or NULL when s is -1. */
static zs_tensor *slot_of(const zsi_call *c, int64_t s)
{
    return s >= 0 ? c->in[s] : NULL;
}

/* Contiguous versions of x and weight made without autograd or scope
 * tracking; new references (w may come back NULL when absent). */
static zs_status contig_inputs(zs_tensor *x, zs_tensor *w, zs_tensor *b,
                               zs_tensor **xc, zs_tensor **wc, zs_tensor **bc)
{
    zsi_tracking_pause();
    zs_no_grad_push();
    *xc = zs_contiguous(x);
    *wc = w ? zs_contiguous(w) : NULL;
    *bc = b ? zs_contiguous(b) : NULL;
    zs_no_grad_pop();
    zsi_tracking_resume();
    if (!*xc || (w && !*wc) || (b && !*bc)) {
        zs_release(*xc);
        zs_release(*wc);
        zs_release(*bc);
        return ZS_ERR_NOMEM;
    }
    return ZS_OK;
}

/* New untracked tensor (temporaries owned by the caller or a node). */
static zs_tensor *new_untracked(zs_dtype dt, int64_t n)
{
    zsi_tracking_pause();
    zs_tensor *t = zsi_new_tensor(dt, 1, &n);
    zsi_tracking_resume();
    return t;
}

/* Hands the contiguous x and weight and the statistics to save as the
 * aux results 0..3 when the kernel succeeded (st) and a node is recorded,
 * else releases them; returns st. */
static zs_status keep_aux(const zsi_call *c, zs_status st, zs_tensor *xc,
                          zs_tensor *wc, zs_tensor *mean, zs_tensor *rstd)
{
    zs_tensor *t[] = {xc, wc, mean, rstd};
    bool rec = st == ZS_OK && zsi_call_records(c);
    for (int k = 0; k < 4; k++) {
        if (rec)
            c->aux[k] = t[k];
        else
            zs_release(t[k]);
    }
    return st;
}

static void save_norm(zsi_ctx *n, const zsi_call *c, zs_tensor *out)
{
    for (int k = 0; k < 4; k++)
        zsi_save(n, k, c->aux[k]);
}

static double param_bytes(const zsi_call *c)
{
    zs_tensor *w = slot_of(c, c->a->i[0]), *b = slot_of(c, c->a->i[1]);
    return (w ? zsi_bytes(w) : 0) + (b ? zsi_bytes(b) : 0);
}

/* ---- layer norm -------------------------------------------------------- */

/* x [..., C], weight and bias [C] of x's dtype; the output is like x */
static zs_status infer_layer_norm(zsi_call *c)
{
    zs_tensor *x = c->in[0], *w = slot_of(c, c->a->i[0]);
    zs_tensor *b = slot_of(c, c->a->i[1]);
    zs_status st = zsi_check_float_dtype("layer_norm", x);
    if (st == ZS_OK && x->ndim < 1)
        st = zs_set_error("layer_norm: x is 0-d, expected at least 1 dim "
                          "[..., C]");
    if (st != ZS_OK)
        return st;
    int64_t C = x->shape[x->ndim - 1];
    if ((st = check_vec("layer_norm", "weight", x, w, C, true)) != ZS_OK ||
        (st = check_vec("layer_norm", "bias", x, b, C, true)) != ZS_OK ||
        (st = check_eps("layer_norm", c->a->f[0])) != ZS_OK)
        return st;
    c->dtype = x->dtype;
    c->ndim = x->ndim;
    memcpy(c->shape, x->shape, sizeof c->shape);
    return ZS_OK;
}

static zs_status cpu_layer_norm(const zsi_call *c, zs_tensor *out)
{
    zs_tensor *x = c->in[0], *xc, *wc, *bc;
    if (contig_inputs(x, slot_of(c, c->a->i[0]), slot_of(c, c->a->i[1]), &xc,
                      &wc, &bc) != ZS_OK)
        return ZS_ERR_NOMEM;
    int64_t C = x->shape[x->ndim - 1];
    int64_t R = C > 0 ? zs_numel(x) / C : 0;
    bool rec = zsi_call_records(c);
    zs_tensor *mean = rec ? new_untracked(x->dtype, R) : NULL;
    zs_tensor *rstd = rec ? new_untracked(x->dtype, R) : NULL;
    zs_status st = !rec || (mean && rstd) ? ZS_OK : ZS_ERR_NOMEM;
    if (st == ZS_OK)
        zsk_layer_norm(x->dtype, zs_data(xc), wc ? zs_data(wc) : NULL,
                       bc ? zs_data(bc) : NULL, R, C, c->a->f[0], zs_data(out),
                       mean ? zs_data(mean) : NULL, rstd ? zs_data(rstd) : NULL);
    zs_release(bc);
    return keep_aux(c, st, xc, wc, mean, rstd);
}

/* 8 FLOPs per element; x and the parameters read, y and the statistics
 * (2 R values) written */
static zsi_cost layer_norm_cost(const zsi_call *c, const zs_tensor *out)
{
    const zs_tensor *x = c->in[0];
    int64_t C = x->shape[x->ndim - 1];
    int64_t R = C > 0 ? zs_numel(x) / C : 0;
    return (zsi_cost){8.0 * (double)zs_numel(x), zsi_bytes(x) + param_bytes(c),
                      zsi_bytes(x) + 2.0 * (double)R *
                                         (double)zs_dtype_size(x->dtype)};
}

zsi_opdef zsi_def_layer_norm = {
    .op = {.name = "layer_norm", .backward = layer_norm_bw},
    .cls = ZSI_OTHER, .infer = infer_layer_norm,
    .kernel = {[ZS_CPU] = {[ZS_F32] = cpu_layer_norm, [ZS_F64] = cpu_layer_norm}},
    .save = save_norm, .cost = layer_norm_cost};

zs_tensor *zs_layer_norm(zs_tensor *x, zs_tensor *weight, zs_tensor *bias,
                         double eps)
{
    zs_tensor *in[3];
    int64_t slot[2];
    int n = pack_inputs(x, (zs_tensor *[]){weight, bias}, 2, in, slot);
    zsi_attrs at = {.f = {eps}, .i = {slot[0], slot[1]}};
    return zsi_run(&zsi_def_layer_norm, n, in, &at);
}

static zs_status layer_norm_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin)
{
    double t0 = zsi_op_begin(&OP_LAYER_NORM_BW);
    zs_tensor *x = n->saved[0], *w = n->saved[1];
    int64_t wi = n->p.i[4], bi = n->p.i[5];
    zs_dtype dt = x->dtype;
    int64_t C = x->shape[x->ndim - 1];
    int64_t R = C > 0 ? zs_numel(x) / C : 0;
    const zsi_meta *m = &n->in_meta[0];
    zs_tensor *gc = zs_contiguous(g);
    zs_tensor *gx = zsi_needs_grad(n, 0) ? zsi_new_tensor(dt, m->ndim, m->shape) : NULL;
    zs_tensor *gw = wi >= 0 && zsi_needs_grad(n, (int)wi) ? new_untracked(dt, C) : NULL;
    zs_tensor *gb = bi >= 0 && zsi_needs_grad(n, (int)bi) ? new_untracked(dt, C) : NULL;
    zs_status st = ZS_ERR_NOMEM;
    if (gc && (gx || !zsi_needs_grad(n, 0)) &&
        (gw || wi < 0 || !zsi_needs_grad(n, (int)wi)) &&
        (gb || bi < 0 || !zsi_needs_grad(n, (int)bi)))
        st = zsk_layer_norm_backward(
            dt, zs_data(x), w ? zs_data(w) : NULL, zs_data(n->saved[2]),
            zs_data(n->saved[3]), zs_data(gc), R, C, gx ? zs_data(gx) : NULL,
            gw ? zs_data(gw) : NULL, gb ? zs_data(gb) : NULL);
    zs_release(gc);
    if (st != ZS_OK) {
        zs_release(gx);
        zs_release(gw);
        zs_release(gb);
        return st;
    }
    gin[0] = gx;
    if (gw)
        gin[wi] = gw;
    if (gb)
        gin[bi] = gb;
    double bytes = zsi_bytes(x) + zsi_bytes(g);
    zsi_op_end(&OP_LAYER_NORM_BW, t0, 10.0 * (double)zs_numel(x), bytes,
               (gx ? zsi_bytes(gx) : 0) + (gw ? zsi_bytes(gw) : 0) +
                   (gb ? zsi_bytes(gb) : 0));
    return ZS_OK;
}

/* ---- batch norm -------------------------------------------------------- */

typedef struct bn_args {
    zs_tensor *x, *w, *b, *rm, *rv;
    bool training;
    double momentum, eps;
    int64_t N, C, S;
    bool batch_stats; /* training, or inference without running stats */
} bn_args;

/* The call's tensors and attributes; N, C, S and batch_stats when x has
 * at least 2 dims. */
static bn_args bn_args_of(const zsi_call *c)
{
    const zsi_attrs *t = c->a;
    bn_args a = {.x = c->in[0], .w = slot_of(c, t->i[0]),
                 .b = slot_of(c, t->i[1]), .rm = slot_of(c, t->i[2]),
                 .rv = slot_of(c, t->i[3]), .training = t->f[2] != 0,
                 .momentum = t->f[1], .eps = t->f[0]};
    if (a.x->ndim >= 2) {
        a.N = a.x->shape[0];
        a.C = a.x->shape[1];
        a.S = zsi_shape_numel(a.x->ndim - 2, a.x->shape + 2);
    }
    a.batch_stats = a.training || !a.rm;
    return a;
}

/* x [N, C, ...]; weight, bias [C] of x's dtype; running stats [C] of any
 * float dtype, both or neither; the output is like x */
static zs_status infer_batch_norm(zsi_call *c)
{
    const char *op = "batch_norm";
    bn_args args = bn_args_of(c), *a = &args;
    zs_tensor *x = a->x;
    zs_status st = zsi_check_float_dtype(op, x);
    if (st != ZS_OK)
        return st;
    if (x->ndim < 2) {
        char sx[96];
        return zs_set_error("batch_norm: x %s has %d dims, expected at least "
                            "2 [N, C, ...]", zs_shape_str(x, sx, sizeof sx),
                            x->ndim);
    }
    if ((st = check_vec(op, "weight", x, a->w, a->C, true)) != ZS_OK ||
        (st = check_vec(op, "bias", x, a->b, a->C, true)) != ZS_OK ||
        (st = check_vec(op, "running_mean", x, a->rm, a->C, false)) != ZS_OK ||
        (st = check_vec(op, "running_var", x, a->rv, a->C, false)) != ZS_OK ||
        (st = check_eps(op, a->eps)) != ZS_OK)
        return st;
    if (!a->rm != !a->rv)
        return zs_set_error("batch_norm: running_mean and running_var must "
                            "be given together");
    if (a->training && !(a->momentum >= 0 && a->momentum <= 1))
        return zs_set_error("batch_norm: momentum = %g, expected [0, 1]",
                            a->momentum);
    if (a->batch_stats && a->N * a->S <= 1) {
        char sx[96];
        return zs_set_error("batch_norm: x %s has %lld value(s) per channel, "
                            "expected more than 1 to compute batch "
                            "statistics", zs_shape_str(x, sx, sizeof sx),
                            (long long)(a->N * a->S));
    }
    c->dtype = x->dtype;
    c->ndim = x->ndim;
    memcpy(c->shape, x->shape, sizeof c->shape);
    return ZS_OK;
}

static double vec_at(const zs_tensor *t, int64_t c)
{
    return zsi_load(t->dtype, zs_data(t), c * t->strides[0]);
}

/* running = (1 - m) * running + m * batch, with the unbiased batch var. */
static void update_running(const bn_args *a, const double *mean,
                           const double *var)
{
    double m = a->momentum, cnt = (double)(a->N * a->S);
    for (int64_t c = 0; c < a->C; c++) {
        int64_t om = c * a->rm->strides[0], ov = c * a->rv->strides[0];
        double rm = vec_at(a->rm, c), rv = vec_at(a->rv, c);
        zsi_store(a->rm->dtype, zs_data(a->rm), om, (1 - m) * rm + m * mean[c]);
        zsi_store(a->rv->dtype, zs_data(a->rv), ov,
                  (1 - m) * rv + m * var[c] * cnt / (cnt - 1));
    }
}

/* Fills mean and rstd ([C] f64) from the batch or the running stats. */
static void bn_statistics(const bn_args *a, const zs_tensor *xc, double *mean,
                          double *rstd)
{
    if (a->batch_stats) {
        zsk_batch_norm_stats(xc->dtype, zs_data(xc), a->N, a->C, a->S, mean,
                             rstd);
        if (a->training && a->rm)
            update_running(a, mean, rstd);
    } else {
        for (int64_t c = 0; c < a->C; c++) {
            mean[c] = vec_at(a->rm, c);
            rstd[c] = vec_at(a->rv, c);
        }
    }
    for (int64_t c = 0; c < a->C; c++)
        rstd[c] = 1.0 / sqrt(rstd[c] + a->eps);
}

/* out = scale * x + shift per channel, from the statistics. */
static zs_status bn_forward(const bn_args *a, zs_tensor *xc, zs_tensor *wc,
                            zs_tensor *bc, zs_tensor *mean_t, zs_tensor *rstd_t,
                            zs_tensor *out)
{
    double *mean = zs_data(mean_t), *rstd = zs_data(rstd_t);
    double *coef = malloc((size_t)(2 * a->C + 1) * sizeof *coef);
    if (!coef)
        return zs_set_error_code(ZS_ERR_NOMEM, "batch_norm: out of memory");
    bn_statistics(a, xc, mean, rstd);
    double *scale = coef, *shift = coef + a->C;
    for (int64_t c = 0; c < a->C; c++) {
        scale[c] = rstd[c] * (wc ? vec_at(wc, c) : 1.0);
        shift[c] = (bc ? vec_at(bc, c) : 0.0) - mean[c] * scale[c];
    }
    zsk_channel_affine(a->x->dtype, zs_data(xc), a->N, a->C, a->S, scale,
                       shift, zs_data(out));
    free(coef);
    return ZS_OK;
}

/* Updates running_mean and running_var in place when training with them. */
static zs_status cpu_batch_norm(const zsi_call *c, zs_tensor *out)
{
    bn_args a = bn_args_of(c);
    zs_tensor *xc, *wc, *bc;
    if (contig_inputs(a.x, a.w, a.b, &xc, &wc, &bc) != ZS_OK)
        return ZS_ERR_NOMEM;
    zs_tensor *mean = new_untracked(ZS_F64, a.C);
    zs_tensor *rstd = new_untracked(ZS_F64, a.C);
    zs_status st = mean && rstd ? bn_forward(&a, xc, wc, bc, mean, rstd, out)
                                : ZS_ERR_NOMEM;
    zs_release(bc);
    return keep_aux(c, st, xc, wc, mean, rstd);
}

static void save_batch_norm(zsi_ctx *n, const zsi_call *c, zs_tensor *out)
{
    save_norm(n, c, out);
    n->p.i[8] = bn_args_of(c).batch_stats;
}

/* 5 FLOPs per element with batch statistics, 2 with running ones; x and
 * the parameters read, y written */
static zsi_cost batch_norm_cost(const zsi_call *c, const zs_tensor *out)
{
    const zs_tensor *x = c->in[0];
    return (zsi_cost){(bn_args_of(c).batch_stats ? 5.0 : 2.0) *
                          (double)zs_numel(x),
                      zsi_bytes(x) + param_bytes(c), zsi_bytes(x)};
}

zsi_opdef zsi_def_batch_norm = {
    .op = {.name = "batch_norm", .backward = batch_norm_bw},
    .cls = ZSI_OTHER, .infer = infer_batch_norm,
    .kernel = {[ZS_CPU] = {[ZS_F32] = cpu_batch_norm, [ZS_F64] = cpu_batch_norm}},
    .save = save_batch_norm, .cost = batch_norm_cost};

zs_tensor *zs_batch_norm(zs_tensor *x, zs_tensor *weight, zs_tensor *bias,
                         zs_tensor *running_mean, zs_tensor *running_var,
                         bool training, double momentum, double eps)
{
    zs_tensor *in[5];
    int64_t slot[4];
    int n = pack_inputs(x, (zs_tensor *[]){weight, bias, running_mean,
                                           running_var}, 4, in, slot);
    zsi_attrs at = {.f = {eps, momentum, training},
                    .i = {slot[0], slot[1], slot[2], slot[3]}};
    return zsi_run(&zsi_def_batch_norm, n, in, &at);
}

/* Per-channel coefficients of gx = a*g + b*x + k, the folded form of
 * gx = w*rstd*(g - mean(g) - xhat*mean(g*xhat)): a = w*rstd; with batch
 * statistics (M values per channel) b = -a*rstd^2*sum(g*(x-mean))/M and
 * k = -a*sum(g)/M - b*mean; with running statistics (constants) b = k = 0. */
static void bn_dx_coefs(const zsi_ctx *n, int64_t C, double M,
                        const double *sg, const double *sgx, double *a,
                        double *b, double *k)
{
    const double *mean = zs_data(n->saved[2]), *rstd = zs_data(n->saved[3]);
    zs_tensor *w = n->saved[1];
    for (int64_t c = 0; c < C; c++) {
        a[c] = (w ? vec_at(w, c) : 1.0) * rstd[c];
        b[c] = k[c] = 0;
        if (n->p.i[8]) {
            b[c] = -a[c] * rstd[c] * rstd[c] * sgx[c] / M;
            k[c] = -a[c] * sg[c] / M - b[c] * mean[c];
        }
    }
}

static zs_status batch_norm_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin)
{
    double t0 = zsi_op_begin(&OP_BATCH_NORM_BW);
    zs_tensor *x = n->saved[0];
    int64_t wi = n->p.i[4], bi = n->p.i[5];
    int64_t N = x->shape[0], C = x->shape[1];
    int64_t S = zsi_shape_numel(x->ndim - 2, x->shape + 2);
    zs_dtype dt = x->dtype;
    bool need_w = wi >= 0 && zsi_needs_grad(n, (int)wi);
    bool need_b = bi >= 0 && zsi_needs_grad(n, (int)bi);
    zs_tensor *gc = zs_contiguous(g);
    double *buf = malloc((size_t)(5 * C + 1) * sizeof *buf);
    zs_tensor *gx = zsi_needs_grad(n, 0) ? zsi_new_tensor(dt, x->ndim, x->shape) : NULL;
    zs_tensor *gw = need_w ? new_untracked(dt, C) : NULL;
    zs_tensor *gb = need_b ? new_untracked(dt, C) : NULL;
    if (!gc || !buf || (zsi_needs_grad(n, 0) && !gx) || (need_w && !gw) ||
        (need_b && !gb)) {
        zs_release(gc);
        free(buf);
        zs_release(gx);
        zs_release(gw);
        zs_release(gb);
        return zs_set_error_code(ZS_ERR_NOMEM, "batch_norm: out of memory "
                                 "in backward");
    }
    double *sg = buf, *sgx = buf + C;
    const double *mean = zs_data(n->saved[2]), *rstd = zs_data(n->saved[3]);
    zsk_batch_norm_grad_sums(dt, zs_data(x), zs_data(gc), N, C, S, mean, sg,
                             sgx);
    for (int64_t c = 0; c < C; c++) {
        if (gw)
            zsi_store(dt, zs_data(gw), c, sgx[c] * rstd[c]);
        if (gb)
            zsi_store(dt, zs_data(gb), c, sg[c]);
    }
    if (gx) {
        double *a = buf + 2 * C, *b = buf + 3 * C, *k = buf + 4 * C;
        bn_dx_coefs(n, C, (double)(N * S), sg, sgx, a, b, k);
        zsk_batch_norm_backward_x(dt, zs_data(x), zs_data(gc), N, C, S, a, b,
                                  k, zs_data(gx));
    }
    zs_release(gc);
    free(buf);
    gin[0] = gx;
    if (gw)
        gin[wi] = gw;
    if (gb)
        gin[bi] = gb;
    zsi_op_end(&OP_BATCH_NORM_BW, t0, 6.0 * (double)zs_numel(x),
               zsi_bytes(x) + zsi_bytes(g),
               (gx ? zsi_bytes(gx) : 0) + (gw ? zsi_bytes(gw) : 0) +
                   (gb ? zsi_bytes(gb) : 0));
    return ZS_OK;
}
