/*
 * norm.c - zs_layer_norm and zs_batch_norm as descriptors (class
 * ZSI_OTHER; kernels in kernels/cpu/norm.c).
 *
 * Both are single fused operators rather than compositions: the forward
 * kernel makes, as aux results when a node is recorded, its per-row
 * (layer norm, dtype of x, [R]) or per-channel (batch norm, f64, [C])
 * mean and rstd = 1/sqrt(var + eps), and the backward rule runs one fused
 * backward descriptor, "layer_norm_backward" or "batch_norm_backward",
 * whose kernel makes gx, gw and gb together (zsi_run_n) instead of
 * composing zs_* operators. The backward is therefore not itself
 * differentiable (no double backward).
 *
 * Node inputs are x followed by weight and bias when given (absent ones
 * are left out), and for batch norm running_mean and running_var (which
 * the training forward updates in place). Attributes: layer_norm_attrs
 * and batch_norm_attrs (eps, the input slot of each optional tensor or -1,
 * batch norm's momentum and training), the same struct in the forward and
 * its backward descriptor, which also reads the gradients wanted. Saved: 0
 * contiguous x, 1 contiguous weight (or NULL), 2 mean, 3 rstd (the
 * kernel's aux results 0..3).
 *
 * Backward descriptors: inputs x, mean, rstd, g and, when the forward had
 * a weight, the weight (x and weight as saved: contiguous); results gx
 * (like x; an empty [0] tensor when not wanted, since the driver always
 * makes result 0), gw and gb ([C], or none when not wanted).
 *
 * Layer norm of a bf16 / f16 x (kernels/cpu/norm.c, "bf16 / f16 x"):
 * computed in f32 from rows widened block by block (no f32 copy of x is
 * made or saved: x is saved in its dtype), y and gx in x's dtype, mean and
 * rstd f32, weight and bias of x's dtype or both f32 (torch's mixed CPU
 * layer_norm) with gradients of their own dtype.
 *
 * Batch norm of a bf16 / f16 x: the f32 kernels on f32 copies
 * (zsi_via_f32_keep), results rounded once, statistics f64; the saved x
 * is the f32 copy and the backward rule converts g to it.
 *
 * Cost models count the minimum traffic: inputs and parameters read once,
 * outputs (and saved statistics) written once; FLOPs are about 8 per
 * element forward and 10 per element backward.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/lowp.h"
#include "kernels/cpu/norm.h"
#include "ops/internal.h"
#include "ops/attrs.h"

static zs_status layer_norm_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin);
static zs_status batch_norm_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin);


/* The attributes of layer_norm and layer_norm_backward. */

/* The attributes of batch_norm and batch_norm_backward. */
typedef struct batch_norm_attrs {
    double eps, momentum;
    /* input slots of the forward, -1 when absent */
    int64_t weight, bias, running_mean, running_var;
    int64_t want; /* batch_norm_backward: WANT_* bits */
    bool training;
} batch_norm_attrs;
ZSI_ATTRS(batch_norm_attrs);

/* ---- shared helpers ---------------------------------------------------- */

/* p (weight, bias, running stats) must be NULL or a 1-D [C] tensor; with
 * same_dtype it must share x's dtype, else any float dtype. */
static zs_status check_vec(const char *op, const char *what,
                           const zs_tensor *x, const zs_tensor *p, int64_t C,
                           bool same_dtype)
{
    if (!p)
        return ZS_OK;
    zs_status st = same_dtype ? zsi_check_pair_float16(op, x, p)
                              : zsi_check_float16_dtype(op, p);
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

/* A new reference to a borrowed aux result (NULL stays NULL). */
static zs_tensor *own(zs_tensor *t) { return t ? zs_retain(t) : NULL; }

/* Contiguous versions of x and weight made without autograd or scope
 * tracking; new references (w may come back NULL when absent). When c
 * records they are also its aux results 0 and 1 (zsi_aux_copy: a replay
 * refreshes the captured ones). */
static zs_status contig_inputs(const zsi_call *c, zs_tensor *x, zs_tensor *w,
                               zs_tensor *b, zs_tensor **xc, zs_tensor **wc,
                               zs_tensor **bc)
{
    bool rec = zsi_call_records(c);
    *xc = rec ? own(zsi_aux_copy(c, 0, x, zs_contiguous)) : NULL;
    *wc = rec && w ? own(zsi_aux_copy(c, 1, w, zs_contiguous)) : NULL;
    zsi_tracking_pause();
    zs_no_grad_push();
    if (!rec) {
        *xc = zs_contiguous(x);
        *wc = w ? zs_contiguous(w) : NULL;
    }
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

/* New untracked tensor (temporaries owned by the caller or a node); when c
 * records, aux result k (zsi_aux_new), a new reference to it. */
static zs_tensor *new_untracked(const zsi_call *c, int k, zs_dtype dt, int64_t n)
{
    if (zsi_call_records(c))
        return own(zsi_aux_new(c, k, dt, 1, &n));
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
        if (t[k] && c->aux[k] == t[k]) /* made by zsi_aux_*: c holds it */
            zs_release(t[k]);
        else if (rec)
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

/* Bytes of the weight and bias in slots wi and bi (-1: absent). */
static double param_bytes(const zsi_call *c, int64_t wi, int64_t bi)
{
    zs_tensor *w = slot_of(c, wi), *b = slot_of(c, bi);
    return (w ? zsi_bytes(w) : 0) + (b ? zsi_bytes(b) : 0);
}

/* The WANT_* bits of a node: its inputs 0 (x), wi and bi (-1: absent)
 * that need a gradient. */
static int64_t want_of(const zsi_ctx *n, int64_t wi, int64_t bi)
{
    return (zsi_needs_grad(n, 0) ? WANT_GX : 0) |
           (wi >= 0 && zsi_needs_grad(n, (int)wi) ? WANT_GW : 0) |
           (bi >= 0 && zsi_needs_grad(n, (int)bi) ? WANT_GB : 0);
}

/* Runs a backward descriptor on the saved x, mean, rstd, weight and g,
 * and hands its results to gin[0], gin[wi], gin[bi] (releasing the ones
 * not wanted). */
static zs_status run_norm_backward(zsi_opdef *def, zsi_ctx *n, zs_tensor *g,
                                   const void *attrs, int64_t want,
                                   int64_t wi, int64_t bi, zs_tensor **gin)
{
    zs_tensor *in[5] = {n->saved[0], n->saved[2], n->saved[3], g, n->saved[1]};
    zs_tensor *r[3];
    zs_status st = zsi_run_n(def, wi >= 0 ? 5 : 4, in, attrs, 3, r);
    if (st != ZS_OK)
        return st;
    if (want & WANT_GX)
        gin[0] = r[0];
    else
        zs_release(r[0]);
    if (r[1])
        gin[wi] = r[1];
    if (r[2])
        gin[bi] = r[2];
    return ZS_OK;
}

/* The backward descriptors' checks and results: inputs x (float; layer
 * norm [..., C] with statistics per row, batch norm [N, C, ...] with
 * statistics per channel), mean and rstd (stats_dt, one value per row or
 * channel), g (like x) and, when has_w, the weight ([C], x's dtype);
 * results gx, gw, gb as `want` says. */
static zs_status infer_norm_backward(zsi_call *c, bool layer, bool has_w,
                                     int64_t want, zs_dtype stats_dt,
                                     zs_dtype pdt)
{
    const char *op = c->def->op.name;
    const zs_tensor *x = c->in[0], *mean = c->in[1], *rstd = c->in[2];
    const zs_tensor *g = c->in[3];
    if (c->nin != (has_w ? 5 : 4))
        return zs_set_error("%s: %d inputs, expected %d (x, mean, rstd, g%s)",
                            op, c->nin, has_w ? 5 : 4, has_w ? ", weight" : "");
    zs_status st = zsi_check_pair_float16(op, x, g);
    if (st == ZS_OK && pdt != x->dtype && (pdt != ZS_F32 || !zsk_is_lowp16(x->dtype)))
        st = zs_set_error("%s: parameters of %s with x of %s, expected x's "
                          "dtype (or f32 for a bf16/f16 x)", op,
                          zs_dtype_name(pdt), zs_dtype_name(x->dtype));
    if (st == ZS_OK && has_w && c->in[4]->dtype != pdt)
        st = zs_set_error("%s: weight of %s, expected %s", op,
                          zs_dtype_name(c->in[4]->dtype), zs_dtype_name(pdt));
    if (st != ZS_OK)
        return st;
    int min_dims = layer ? 1 : 2;
    int64_t C = x->ndim < min_dims ? -1 : layer ? x->shape[x->ndim - 1] : x->shape[1];
    int64_t nstats = !layer ? C : C > 0 ? zs_numel(x) / C : 0;
    const zs_tensor *w = has_w ? c->in[4] : NULL;
    if (x->ndim < min_dims || !zs_same_shape(x, g) || mean->dtype != stats_dt ||
        rstd->dtype != stats_dt || zs_numel(mean) != nstats ||
        zs_numel(rstd) != nstats || (w && (w->ndim != 1 || w->shape[0] != C)) ||
        ((want & WANT_GW) && !w)) {
        char sx[96], sg[96], sm[96], sw[96];
        return zs_set_error("%s: x %s, g %s, mean and rstd %s %s%s%s%s: "
                            "expected g like x, %lld %s statistics%s", op,
                            zs_shape_str(x, sx, sizeof sx),
                            zs_shape_str(g, sg, sizeof sg),
                            zs_dtype_name(mean->dtype),
                            zs_shape_str(mean, sm, sizeof sm),
                            w ? ", weight " : "",
                            w ? zs_shape_str(w, sw, sizeof sw) : "",
                            want & WANT_GW ? ", gw wanted" : "",
                            (long long)nstats, zs_dtype_name(stats_dt),
                            w ? " and a [C] weight" : "");
    }
    c->dtype = x->dtype;
    c->ndim = want & WANT_GX ? x->ndim : 1;
    memcpy(c->shape, x->shape, sizeof c->shape);
    if (!(want & WANT_GX))
        c->shape[0] = 0; /* not wanted: an empty result 0 */
    c->nout = 3;
    for (int k = 0; k < 2; k++)
        c->more[k] = (zsi_meta){.dtype = pdt,
                                .ndim = want & (k ? WANT_GB : WANT_GW) ? 1 : -1,
                                .shape = {C}};
    return ZS_OK;
}

/* Contiguous versions of the backward descriptors' inputs (t[4] NULL
 * without a weight); ZS_OK or ZS_ERR_NOMEM (all released). */
static zs_status contig_backward_inputs(const zsi_call *c, zs_tensor **t)
{
    bool ok = true;
    for (int i = 0; i < 5; i++) {
        t[i] = i < c->nin ? zsi_contig_host(c->in[i]) : NULL;
        ok = ok && (t[i] || i >= c->nin);
    }
    if (ok)
        return ZS_OK;
    for (int i = 0; i < 5; i++)
        zs_release(t[i]);
    return ZS_ERR_NOMEM;
}

/* The data of a wanted result (NULL for an empty gx or a result not
 * made). */
static void *result_data(zs_tensor *t)
{
    return t && zs_numel(t) > 0 ? zs_data(t) : NULL;
}

/* flops_per_elem FLOPs per element of x; x and g read, the results
 * written */
static zsi_cost norm_backward_cost(const zsi_call *c, double flops_per_elem)
{
    double written = 0;
    for (int k = 0; k < 3; k++)
        written += c->outs[k] ? zsi_bytes(c->outs[k]) : 0;
    return (zsi_cost){flops_per_elem * (double)zs_numel(c->in[0]),
                      zsi_bytes(c->in[0]) + zsi_bytes(c->in[3]), written};
}

/* ---- layer norm -------------------------------------------------------- */

/* x [..., C], weight and bias [C] of x's dtype (or both f32 for a bf16 or
 * f16 x: torch's mixed CPU layer_norm); the output is like x */
static zs_status infer_layer_norm(zsi_call *c)
{
    const layer_norm_attrs *at = c->attrs;
    zs_tensor *x = c->in[0], *w = slot_of(c, at->weight);
    zs_tensor *b = slot_of(c, at->bias);
    zs_status st = zsi_check_float16_dtype("layer_norm", x);
    zs_dtype pdt = w ? w->dtype : b ? b->dtype : x->dtype;
    bool mixed = zsk_is_lowp16(x->dtype) && pdt == ZS_F32;
    if (st == ZS_OK && mixed && ((w && w->dtype != pdt) || (b && b->dtype != pdt)))
        st = zs_set_error("layer_norm: weight %s and bias %s, expected one "
                          "dtype (f32 or x's %s)", w ? zs_dtype_name(w->dtype) : "none",
                          b ? zs_dtype_name(b->dtype) : "none",
                          zs_dtype_name(x->dtype));
    if (st == ZS_OK && x->ndim < 1)
        st = zs_set_error("layer_norm: x is 0-d, expected at least 1 dim "
                          "[..., C]");
    if (st != ZS_OK)
        return st;
    int64_t C = x->shape[x->ndim - 1];
    if ((st = check_vec("layer_norm", "weight", x, w, C, !mixed)) != ZS_OK ||
        (st = check_vec("layer_norm", "bias", x, b, C, !mixed)) != ZS_OK ||
        (st = check_eps("layer_norm", at->eps)) != ZS_OK)
        return st;
    zsi_out_like(c, x);
    return ZS_OK;
}

static zs_status cpu_layer_norm(const zsi_call *c, zs_tensor *out)
{
    const layer_norm_attrs *at = c->attrs;
    zs_tensor *x = c->in[0], *xc, *wc, *bc;
    if (contig_inputs(c, x, slot_of(c, at->weight), slot_of(c, at->bias), &xc,
                      &wc, &bc) != ZS_OK)
        return ZS_ERR_NOMEM;
    int64_t C = x->shape[x->ndim - 1];
    int64_t R = C > 0 ? zs_numel(x) / C : 0;
    bool rec = zsi_call_records(c), lp = zsk_is_lowp16(x->dtype);
    zs_dtype sdt = lp ? ZS_F32 : x->dtype; /* statistics */
    zs_tensor *mean = rec ? new_untracked(c, 2, sdt, R) : NULL;
    zs_tensor *rstd = rec ? new_untracked(c, 3, sdt, R) : NULL;
    zs_status st = !rec || (mean && rstd) ? ZS_OK : ZS_ERR_NOMEM;
    if (st == ZS_OK && lp)
        st = zsk_layer_norm_lp(x->dtype, wc ? wc->dtype : bc ? bc->dtype : x->dtype,
                               zs_data(xc), wc ? zs_data(wc) : NULL,
                               bc ? zs_data(bc) : NULL, R, C, at->eps,
                               zs_data(out), mean ? zs_data(mean) : NULL,
                               rstd ? zs_data(rstd) : NULL);
    else if (st == ZS_OK)
        zsk_layer_norm(x->dtype, zs_data(xc), wc ? zs_data(wc) : NULL,
                       bc ? zs_data(bc) : NULL, R, C, at->eps, zs_data(out),
                       mean ? zs_data(mean) : NULL, rstd ? zs_data(rstd) : NULL);
    zs_release(bc);
    return keep_aux(c, st, xc, wc, mean, rstd);
}

/* 8 FLOPs per element; x and the parameters read, y and the statistics
 * (2 R values) written */
static zsi_cost layer_norm_cost(const zsi_call *c, const zs_tensor *out)
{
    const layer_norm_attrs *at = c->attrs;
    const zs_tensor *x = c->in[0];
    int64_t C = x->shape[x->ndim - 1];
    int64_t R = C > 0 ? zs_numel(x) / C : 0;
    return (zsi_cost){8.0 * (double)zs_numel(x),
                      zsi_bytes(x) + param_bytes(c, at->weight, at->bias),
                      zsi_bytes(x) + 2.0 * (double)R *
                                         (double)zs_dtype_size(x->dtype)};
}

/* ---- layer norm backward ----------------------------------------------- */

/* x [..., C], mean and rstd (x's dtype, R = numel / C values), g like x,
 * weight [C] when the forward had one. */
static zs_status infer_layer_norm_backward(zsi_call *c)
{
    const layer_norm_attrs *at = c->attrs;
    zs_dtype xdt = c->in[0]->dtype;
    return infer_norm_backward(c, true, at->weight >= 0, at->want,
                               zsk_is_lowp16(xdt) ? ZS_F32 : xdt,
                               at->pdt1 ? (zs_dtype)(at->pdt1 - 1) : xdt);
}

static zs_status cpu_layer_norm_backward(const zsi_call *c, zs_tensor *gx)
{
    zs_tensor *t[5]; /* x, mean, rstd, g, weight (or NULL) */
    if (contig_backward_inputs(c, t) != ZS_OK)
        return ZS_ERR_NOMEM;
    zs_tensor *x = t[0];
    int64_t C = x->shape[x->ndim - 1];
    int64_t R = C > 0 ? zs_numel(x) / C : 0;
    zs_status st;
    if (zsk_is_lowp16(x->dtype))
        st = zsk_layer_norm_backward_lp(
            x->dtype, c->more[0].dtype, zs_data(x), t[4] ? zs_data(t[4]) : NULL,
            zs_data(t[1]), zs_data(t[2]), zs_data(t[3]), R, C, result_data(gx),
            result_data(c->outs[1]), result_data(c->outs[2]));
    else
        st = zsk_layer_norm_backward(
            x->dtype, zs_data(x), t[4] ? zs_data(t[4]) : NULL, zs_data(t[1]),
            zs_data(t[2]), zs_data(t[3]), R, C, result_data(gx),
            result_data(c->outs[1]), result_data(c->outs[2]));
    for (int i = 0; i < 5; i++)
        zs_release(t[i]);
    return st;
}

/* 10 FLOPs per element; x and g read, the gradients written */
static zsi_cost layer_norm_backward_cost(const zsi_call *c, const zs_tensor *gx)
{
    return norm_backward_cost(c, 10.0);
}

zsi_opdef zsi_def_layer_norm_backward = {
    .op = {.name = "layer_norm_backward"}, .cls = ZSI_OTHER,
    .infer = infer_layer_norm_backward,
    .kernel = {[ZS_CPU] = {[ZS_F32] = cpu_layer_norm_backward,
                           [ZS_F64] = cpu_layer_norm_backward,
                           [ZS_BF16] = cpu_layer_norm_backward,
                           [ZS_F16] = cpu_layer_norm_backward}},
    .cost = layer_norm_backward_cost, .attr_size = sizeof(layer_norm_attrs)};

zsi_opdef zsi_def_layer_norm = {
    .op = {.name = "layer_norm", .backward = layer_norm_bw},
    .cls = ZSI_OTHER, .infer = infer_layer_norm,
    .kernel = {[ZS_CPU] = {[ZS_F32] = cpu_layer_norm, [ZS_F64] = cpu_layer_norm,
                           [ZS_BF16] = cpu_layer_norm, [ZS_F16] = cpu_layer_norm}},
    .save = save_norm, .cost = layer_norm_cost,
    .attr_size = sizeof(layer_norm_attrs),
    .bw_ops = (zsi_opdef *const[]){&zsi_def_layer_norm_backward, NULL}};

zs_tensor *zs_layer_norm(zs_tensor *x, zs_tensor *weight, zs_tensor *bias,
                         double eps)
{
    zs_tensor *in[3];
    int64_t slot[2];
    int n = pack_inputs(x, (zs_tensor *[]){weight, bias}, 2, in, slot);
    layer_norm_attrs at = {.eps = eps, .weight = slot[0], .bias = slot[1]};
    return zsi_run(&zsi_def_layer_norm, n, in, &at);
}

static zs_status layer_norm_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin)
{
    layer_norm_attrs at = *(const layer_norm_attrs *)zsi_node_attrs(n);
    at.want = want_of(n, at.weight, at.bias);
    int64_t p = at.weight >= 0 ? at.weight : at.bias; /* slot of a parameter */
    at.pdt1 = p >= 0 ? (int64_t)n->in_meta[p].dtype + 1 : 0;
    return run_norm_backward(&zsi_def_layer_norm_backward, n, g, &at, at.want,
                             at.weight, at.bias, gin);
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
    const batch_norm_attrs *t = c->attrs;
    bn_args a = {.x = c->in[0], .w = slot_of(c, t->weight),
                 .b = slot_of(c, t->bias), .rm = slot_of(c, t->running_mean),
                 .rv = slot_of(c, t->running_var), .training = t->training,
                 .momentum = t->momentum, .eps = t->eps};
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
    zs_status st = zsi_check_float16_dtype(op, x);
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
    zsi_out_like(c, x);
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
    if (contig_inputs(c, a.x, a.w, a.b, &xc, &wc, &bc) != ZS_OK)
        return ZS_ERR_NOMEM;
    zs_tensor *mean = new_untracked(c, 2, ZS_F64, a.C);
    zs_tensor *rstd = new_untracked(c, 3, ZS_F64, a.C);
    zs_status st = mean && rstd ? bn_forward(&a, xc, wc, bc, mean, rstd, out)
                                : ZS_ERR_NOMEM;
    zs_release(bc);
    return keep_aux(c, st, xc, wc, mean, rstd);
}

/* bf16 / f16 x (weight and bias of its dtype): the f32 kernel on f32
 * copies of x, weight and bias, y rounded once; the running statistics
 * (any float dtype) updated in place as they are; the saved x and weight
 * are the f32 copies, the statistics f64 (batch_norm_bw converts g). */
static zs_status cpu_batch_norm_lowp(const zsi_call *c, zs_tensor *out)
{
    const batch_norm_attrs *t = c->attrs;
    uint64_t keep = (t->running_mean >= 0 ? 1ull << t->running_mean : 0) |
                    (t->running_var >= 0 ? 1ull << t->running_var : 0);
    return zsi_via_f32_keep(c, out, cpu_batch_norm, keep);
}

/* 5 FLOPs per element with batch statistics, 2 with running ones; x and
 * the parameters read, y written */
static zsi_cost batch_norm_cost(const zsi_call *c, const zs_tensor *out)
{
    const batch_norm_attrs *at = c->attrs;
    const zs_tensor *x = c->in[0];
    return (zsi_cost){(bn_args_of(c).batch_stats ? 5.0 : 2.0) *
                          (double)zs_numel(x),
                      zsi_bytes(x) + param_bytes(c, at->weight, at->bias),
                      zsi_bytes(x)};
}

/* ---- batch norm backward ----------------------------------------------- */

/* Per-channel coefficients of gx = a*g + b*x + k, the folded form of
 * gx = w*rstd*(g - mean(g) - xhat*mean(g*xhat)): a = w*rstd; with batch
 * statistics (M values per channel) b = -a*rstd^2*sum(g*(x-mean))/M and
 * k = -a*sum(g)/M - b*mean; with running statistics (constants) b = k = 0.
 * w may be NULL (1). */
static void bn_dx_coefs(const zs_tensor *w, const double *mean,
                        const double *rstd, bool batch_stats, int64_t C,
                        double M, const double *sg, const double *sgx,
                        double *a, double *b, double *k)
{
    for (int64_t c = 0; c < C; c++) {
        a[c] = (w ? vec_at(w, c) : 1.0) * rstd[c];
        b[c] = k[c] = 0;
        if (batch_stats) {
            b[c] = -a[c] * rstd[c] * rstd[c] * sgx[c] / M;
            k[c] = -a[c] * sg[c] / M - b[c] * mean[c];
        }
    }
}

/* x [N, C, ...], mean and rstd f64 [C], g like x, weight [C] when the
 * forward had one. */
static zs_status infer_batch_norm_backward(zsi_call *c)
{
    const batch_norm_attrs *at = c->attrs;
    return infer_norm_backward(c, false, at->weight >= 0, at->want, ZS_F64,
                               c->in[0]->dtype);
}

/* Per-channel sums of g and g*(x - mean), then gw = sum(g*(x-mean))*rstd,
 * gb = sum(g) and gx from the folded coefficients; with batch statistics
 * when the forward trained or had no running statistics. */
static zs_status cpu_batch_norm_backward(const zsi_call *c, zs_tensor *gx)
{
    const batch_norm_attrs *at = c->attrs;
    zs_tensor *t[5]; /* x, mean, rstd, g, weight (or NULL) */
    if (contig_backward_inputs(c, t) != ZS_OK)
        return ZS_ERR_NOMEM;
    zs_tensor *x = t[0], *gw = c->outs[1], *gb = c->outs[2];
    int64_t N = x->shape[0], C = x->shape[1];
    int64_t S = zsi_shape_numel(x->ndim - 2, x->shape + 2);
    zs_dtype dt = x->dtype;
    double *buf = malloc((size_t)(5 * C + 1) * sizeof *buf);
    if (!buf) {
        for (int i = 0; i < 5; i++)
            zs_release(t[i]);
        return zs_set_error_code(ZS_ERR_NOMEM, "batch_norm: out of memory "
                                 "in backward");
    }
    double *sg = buf, *sgx = buf + C;
    const double *mean = zs_data(t[1]), *rstd = zs_data(t[2]);
    zsk_batch_norm_grad_sums(dt, zs_data(x), zs_data(t[3]), N, C, S, mean, sg,
                             sgx);
    for (int64_t ch = 0; ch < C; ch++) {
        if (gw)
            zsi_store(dt, zs_data(gw), ch, sgx[ch] * rstd[ch]);
        if (gb)
            zsi_store(dt, zs_data(gb), ch, sg[ch]);
    }
    if (result_data(gx)) {
        double *a = buf + 2 * C, *b = buf + 3 * C, *k = buf + 4 * C;
        bool batch_stats = at->training || at->running_mean < 0;
        bn_dx_coefs(t[4], mean, rstd, batch_stats, C, (double)(N * S), sg, sgx,
                    a, b, k);
        zsk_batch_norm_backward_x(dt, zs_data(x), zs_data(t[3]), N, C, S, a, b,
                                  k, zs_data(gx));
    }
    free(buf);
    for (int i = 0; i < 5; i++)
        zs_release(t[i]);
    return ZS_OK;
}

/* bf16 / f16 x, g and weight: the f32 kernel on f32 copies, gx, gw and
 * gb each rounded once into x's dtype. */
static zs_status cpu_batch_norm_backward_lowp(const zsi_call *c, zs_tensor *gx)
{
    return zsi_via_f32_keep(c, gx, cpu_batch_norm_backward, 0);
}

/* 6 FLOPs per element; x and g read, the gradients written */
static zsi_cost batch_norm_backward_cost(const zsi_call *c, const zs_tensor *gx)
{
    return norm_backward_cost(c, 6.0);
}

zsi_opdef zsi_def_batch_norm_backward = {
    .op = {.name = "batch_norm_backward"}, .cls = ZSI_OTHER,
    .infer = infer_batch_norm_backward,
    .kernel = {[ZS_CPU] = {[ZS_F32] = cpu_batch_norm_backward,
                           [ZS_F64] = cpu_batch_norm_backward,
                           [ZS_BF16] = cpu_batch_norm_backward_lowp,
                           [ZS_F16] = cpu_batch_norm_backward_lowp}},
    .cost = batch_norm_backward_cost, .attr_size = sizeof(batch_norm_attrs)};

zsi_opdef zsi_def_batch_norm = {
    .op = {.name = "batch_norm", .backward = batch_norm_bw},
    .cls = ZSI_OTHER, .infer = infer_batch_norm,
    .kernel = {[ZS_CPU] = {[ZS_F32] = cpu_batch_norm, [ZS_F64] = cpu_batch_norm,
                           [ZS_BF16] = cpu_batch_norm_lowp,
                           [ZS_F16] = cpu_batch_norm_lowp}},
    .save = save_norm, .cost = batch_norm_cost,
    .attr_size = sizeof(batch_norm_attrs),
    .writes_inputs = true, /* the running statistics */
    .bw_ops = (zsi_opdef *const[]){&zsi_def_batch_norm_backward,
                                   &zsi_def_to_dtype, NULL}};

zs_tensor *zs_batch_norm(zs_tensor *x, zs_tensor *weight, zs_tensor *bias,
                         zs_tensor *running_mean, zs_tensor *running_var,
                         bool training, double momentum, double eps)
{
    zs_tensor *in[5];
    int64_t slot[4];
    int n = pack_inputs(x, (zs_tensor *[]){weight, bias, running_mean,
                                           running_var}, 4, in, slot);
    batch_norm_attrs at = {.eps = eps, .momentum = momentum, .weight = slot[0],
                           .bias = slot[1], .running_mean = slot[2],
                           .running_var = slot[3], .training = training};
    return zsi_run(&zsi_def_batch_norm, n, in, &at);
}

/* A bf16 / f16 forward saved its f32 copy of x (cpu_batch_norm_lowp): g
 * is converted to it, and the gradients back to their inputs' dtypes. */
static zs_status batch_norm_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin)
{
    batch_norm_attrs at = *(const batch_norm_attrs *)zsi_node_attrs(n);
    at.want = want_of(n, at.weight, at.bias);
    zs_dtype sdt = n->saved[0]->dtype;
    if (g->dtype == sdt)
        return run_norm_backward(&zsi_def_batch_norm_backward, n, g, &at, at.want,
                                 at.weight, at.bias, gin);
    zs_tensor *gc = zs_to_dtype(g, sdt);
    zs_status st = gc ? run_norm_backward(&zsi_def_batch_norm_backward, n, gc, &at,
                                          at.want, at.weight, at.bias, gin)
                      : ZS_ERR_NOMEM;
    zs_release(gc);
    for (int i = 0; st == ZS_OK && i < n->nin; i++) {
        if (!gin[i] || gin[i]->dtype == n->in_meta[i].dtype)
            continue;
        zs_tensor *r = zs_to_dtype(gin[i], n->in_meta[i].dtype);
        zs_release(gin[i]);
        st = (gin[i] = r) ? ZS_OK : ZS_ERR_NOMEM;
    }
    return st;
}
