/*
 * loss.c - zs_cross_entropy and zs_mse_loss, as descriptors (class
 * ZSI_OTHER) run by zsi_run.
 *
 * cross_entropy is one fused kernel (kernels/cpu/softmax.c): per row the
 * log-sum-exp and the picked logit, then a mean over the rows whose target
 * is not ignore_index, summed in row order in double (0 when every row is
 * ignored). Targets are checked by the kernel before any work: one
 * outside [0, C) that is not ignore_index fails with a message naming its
 * position. Node inputs: logits, target; attributes: cross_entropy_attrs
 * (ignore_index). Saved (aux results of the kernel, made only when a node
 * is recorded): 0 contiguous logits [N, C], 1 contiguous targets, 2
 * per-row log-sum-exp (f64 [N]), 3 the count of rows not ignored (0-d
 * i64). The backward rule runs the descriptor "cross_entropy_backward" on
 * those and g (one fused kernel, gx = g * (softmax(x) - onehot(t)) / count
 * on counted rows and 0 on ignored ones; all 0 when count is 0), which is
 * not itself differentiable.
 * bf16 / f16 logits: computed in f32 (rows widened by the kernel), the
 * loss in the logits' dtype and the logits' gradient too, as torch; the
 * saved logits stay in their dtype and lse is f64 as for f32. Under
 * autocast (attribute f32_loss, set by zs_cross_entropy when an autocast
 * scope is open) the loss is f32, as torch's autocast makes it by casting
 * the logits to f32 first; here the logits are read as they are (the
 * cast table's reads-lowp class, ops/autocast.c), so no f32 copy of them
 * is made or saved, and their gradient is written in their dtype, rounded
 * once: the same values as the f32 copy's gradient cast back.
 *
 * cross_entropy_shard is the loss of one shard of a cross-entropy whose
 * classes are split over shards (the vocabulary-parallel head, zs/tp.h),
 * run on the shard's logits z [N, C] with the rows' log-sum-exp over all
 * shards given (lse, f64 [N]; row_lse gives a shard's own, which the
 * caller combines across shards) and the targets as this shard's class
 * index t, a value outside [0, C) for a row whose target another shard
 * holds, or ignore_index (rows no shard counts). Its value (0-d, z's
 * dtype): sum over the rows with t in [0, C) of (lse - z[i, t]) / count;
 * summed over the shards, the mean cross-entropy. Its backward is the
 * gradient of that sum over the shards with respect to this shard's z,
 * since every row's softmax takes all shards' logits: cross_entropy_
 * backward on the saved inputs, g (exp(z - lse) - onehot(t)) / count on
 * the rows not ignored (no onehot where t is outside [0, C)). So the
 * value must be summed over the shards by an operator whose backward
 * passes g on unchanged (tp_allreduce), as Megatron-LM's
 * vocabulary-parallel cross-entropy does. It keeps z (the caller's
 * tensor, no copy) and no softmax: one logits-sized tensor per
 * micro-batch until backward, which makes one (the gradient).
 *
 * mse_loss = mean((a - b)^2) over equal shapes, a fused sum of squared
 * differences; backward (with zs_* ops): ga = 2 (a - b) g / n, gb = -ga.
 * Saved: 0 a, 1 b; p.f[8] = 2 / n.
 *
 * Cost models: inputs read once, a scalar written; cross entropy about
 * 5 FLOPs per logit, mse 3 per element.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/reduce_ext.h"
#include "kernels/cpu/softmax.h"
#include "ops/internal.h"
#include "ops/attrs.h"

static zs_status cross_entropy_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin);
static zs_status mse_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin);

/* The attributes of cross_entropy and cross_entropy_backward. */

/* ---- cross entropy ----------------------------------------------------- */

/* target must be logits.shape[:-1], or 1-D with N elements; the output
 * is a 0-d tensor of the logits' dtype (f32 for 16-bit logits with
 * f32_loss). */
static zs_status infer_cross_entropy(zsi_call *c)
{
    const zs_tensor *x = c->in[0], *t = c->in[1];
    const cross_entropy_attrs *at = c->attrs;
    bool low = x->dtype == ZS_BF16 || x->dtype == ZS_F16;
    c->dtype = low && at->f32_loss ? ZS_F32 : x->dtype;
    c->ndim = 0;
    zs_status st = zsi_check_float16_dtype("cross_entropy", x);
    if (st == ZS_OK && x->ndim < 1)
        st = zs_set_error("cross_entropy: logits are 0-d, expected [N, C] "
                          "or [..., C]");
    if (st == ZS_OK && x->shape[x->ndim - 1] == 0)
        st = zs_set_error("cross_entropy: logits have 0 classes");
    if (st == ZS_OK)
        st = zsi_check_index("cross_entropy", t);
    if (st != ZS_OK)
        return st;
    int64_t C = x->shape[x->ndim - 1], N = zs_numel(x) / C;
    bool match = t->ndim == x->ndim - 1;
    for (int d = 0; match && d < t->ndim; d++)
        match = t->shape[d] == x->shape[d];
    if (match || (t->ndim == 1 && t->shape[0] == N))
        return ZS_OK;
    char sx[96], stt[96], se[96];
    return zs_set_error("cross_entropy: target %s does not match logits %s, "
                        "expected %s or [%lld]",
                        zs_shape_str(t, stt, sizeof stt),
                        zs_shape_str(x, sx, sizeof sx),
                        zsi_shape_fmt(x->ndim - 1, x->shape, se, sizeof se),
                        (long long)N);
}

/* Counts the targets != ignore; -1 + message on one outside [0, C). */
static int64_t ce_count(const zsk_targets *tg, int64_t N, int64_t C)
{
    int64_t count = 0;
    for (int64_t i = 0; i < N; i++) {
        int64_t t = tg->t64 ? ((const int64_t *)tg->t)[i]
                            : ((const int32_t *)tg->t)[i];
        if (t == tg->ignore)
            continue;
        if (t < 0 || t >= C) {
            zs_set_error("cross_entropy: target %lld at index %lld is out "
                         "of range [0, %lld) (ignore_index %lld)",
                         (long long)t, (long long)i, (long long)C,
                         (long long)tg->ignore);
            return -1;
        }
        count++;
    }
    return count;
}

/* Runs the kernel; *mean receives the mean loss (0 when count is 0). */
static zs_status ce_forward(zs_tensor *xc, const zsk_targets *tg, int64_t N,
                            int64_t C, int64_t count, zs_tensor *lse,
                            double *mean)
{
    double *loss = malloc((size_t)(N ? N : 1) * sizeof *loss);
    if (!loss)
        return zs_set_error_code(ZS_ERR_NOMEM, "cross_entropy: out of memory");
    zs_status st = zsk_cross_entropy(xc->dtype, zs_data(xc), tg, N, C,
                                     zs_data(lse), loss);
    if (st != ZS_OK) {
        free(loss);
        return st;
    }
    double s = 0;
    for (int64_t i = 0; i < N; i++)
        s += loss[i];
    free(loss);
    *mean = count ? s / (double)count : 0.0;
    return ZS_OK;
}

/* aux: 0 contiguous logits, 1 contiguous targets, 2 per-row log-sum-exp,
 * 3 the count (0-d i64), when a node is recorded. */
static zs_status cpu_cross_entropy(const zsi_call *c, zs_tensor *out)
{
    const cross_entropy_attrs *at = c->attrs;
    zs_tensor *logits = c->in[0], *target = c->in[1];
    int64_t C = logits->shape[logits->ndim - 1], N = zs_numel(logits) / C;
    bool rec = zsi_call_records(c);
    zs_tensor *xc, *tc, *lse, *cnt = NULL;
    if (rec) { /* the aux results (a replay supplies them), new references */
        xc = zsi_aux_copy(c, 0, logits, zs_contiguous);
        tc = zsi_aux_copy(c, 1, target, zs_contiguous);
        lse = zsi_aux_new(c, 2, ZS_F64, 1, &N);
        cnt = zsi_aux_new(c, 3, ZS_I64, 0, NULL);
        zs_tensor *mine[] = {xc, tc, lse, cnt};
        for (int k = 0; k < 4; k++)
            if (mine[k])
                zs_retain(mine[k]);
    } else {
        zsi_tracking_pause();
        zs_no_grad_push();
        xc = zs_contiguous(logits);
        tc = zs_contiguous(target);
        lse = zsi_new_tensor(ZS_F64, 1, &N);
        zs_no_grad_pop();
        zsi_tracking_resume();
    }
    zsk_targets tg = {tc ? zs_data(tc) : NULL, target->dtype == ZS_I64,
                      at->ignore_index};
    bool have = xc && tc && lse && (cnt || !rec);
    int64_t count = have ? ce_count(&tg, N, C) : -1;
    double v = 0;
    zs_status st = count >= 0 ? ce_forward(xc, &tg, N, C, count, lse, &v)
                   : have ? ZS_ERR_ARG
                          : zs_set_error_code(ZS_ERR_NOMEM, "cross_entropy: "
                                              "out of memory");
    if (st == ZS_OK)
        zsi_store(out->dtype, zs_data(out), 0, v);
    if (st == ZS_OK && rec)
        *(int64_t *)zs_data(cnt) = count;
    zs_release(xc);
    zs_release(tc);
    zs_release(lse);
    zs_release(cnt);
    return st;
}

static void save_cross_entropy(zsi_ctx *n, const zsi_call *c, zs_tensor *out)
{
    for (int k = 0; k < 4; k++)
        zsi_save(n, k, c->aux[k]);
}

/* def->flops FLOPs per element of in[0], every input read once, out
 * written once */
static zsi_cost loss_cost(const zsi_call *c, const zs_tensor *out)
{
    zsi_cost k = {c->def->flops * (double)zs_numel(c->in[0]), 0,
                  (double)zs_nbytes(out)};
    for (int i = 0; i < c->nin; i++)
        k.bytes_read += (double)zs_nbytes(c->in[i]);
    return k;
}

/* ---- cross entropy backward ------------------------------------------- */

/* Inputs x (logits [..., C]), t (the N = numel(x) / C targets, i32 or
 * i64), lse (f64, N values), count (i64, one value) and g (one value, the
 * gradient of the mean loss); the result gx is like x. */
static zs_status infer_cross_entropy_backward(zsi_call *c)
{
    const char *op = c->def->op.name;
    const zs_tensor *x = c->in[0], *t = c->in[1], *lse = c->in[2];
    const zs_tensor *cnt = c->in[3], *g = c->in[4];
    zs_status st = zsi_check_float16_dtype(op, x);
    if (st == ZS_OK && (x->ndim < 1 || x->shape[x->ndim - 1] == 0))
        st = zs_set_error("%s: logits are 0-d or have 0 classes", op);
    if (st == ZS_OK)
        st = zsi_check_index(op, t);
    if (st == ZS_OK)
        st = zsi_check_float16_dtype(op, g);
    if (st != ZS_OK)
        return st;
    int64_t N = zs_numel(x) / x->shape[x->ndim - 1];
    if (zs_numel(t) != N || lse->dtype != ZS_F64 || zs_numel(lse) != N ||
        cnt->dtype != ZS_I64 || zs_numel(cnt) != 1 || zs_numel(g) != 1) {
        char sx[96], stt[96], sl[96], sc[96], sg[96];
        return zs_set_error("%s: logits %s, targets %s, lse %s %s, count %s "
                            "%s, g %s: expected %lld targets, %lld f64 lse "
                            "values, one i64 count and one g value", op,
                            zs_shape_str(x, sx, sizeof sx),
                            zs_shape_str(t, stt, sizeof stt),
                            zs_dtype_name(lse->dtype),
                            zs_shape_str(lse, sl, sizeof sl),
                            zs_dtype_name(cnt->dtype),
                            zs_shape_str(cnt, sc, sizeof sc),
                            zs_shape_str(g, sg, sizeof sg), (long long)N,
                            (long long)N);
    }
    zsi_out_like(c, x);
    return ZS_OK;
}

static zs_status cpu_cross_entropy_backward(const zsi_call *c, zs_tensor *out)
{
    const cross_entropy_attrs *at = c->attrs;
    zs_tensor *x = c->in[0], *t = c->in[1], *cnt = c->in[3];
    int64_t C = x->shape[x->ndim - 1], N = zs_numel(x) / C;
    int64_t count = (int64_t)zs_item(cnt);
    if (count == 0) { /* every row ignored: the mean was a constant 0 */
        memset(zs_data(out), 0, zs_nbytes(out));
        return ZS_OK;
    }
    zs_tensor *xc = zsi_contig_host(x), *tc = xc ? zsi_contig_host(t) : NULL;
    zs_tensor *lc = tc ? zsi_contig_host(c->in[2]) : NULL;
    zs_status st = ZS_ERR_NOMEM;
    if (lc) {
        zsk_targets tg = {zs_data(tc), t->dtype == ZS_I64, at->ignore_index};
        st = zsk_cross_entropy_backward(x->dtype, zs_data(xc), &tg, N, C,
                                        zs_data(lc),
                                        zs_item(c->in[4]) / (double)count,
                                        zs_data(out));
    }
    zs_release(xc);
    zs_release(tc);
    zs_release(lc);
    return st;
}

/* 4 FLOPs per logit; logits, targets and lse read, gx written */
static zsi_cost cross_entropy_backward_cost(const zsi_call *c,
                                            const zs_tensor *out)
{
    const zs_tensor *x = c->in[0];
    return (zsi_cost){4.0 * (double)zs_numel(x),
                      zsi_bytes(x) + zsi_bytes(c->in[1]) + zsi_bytes(c->in[2]),
                      zsi_bytes(out)};
}

zsi_opdef zsi_def_cross_entropy_backward = {
    .op = {.name = "cross_entropy_backward"}, .arity = 5, .cls = ZSI_OTHER,
    .infer = infer_cross_entropy_backward,
    .kernel = {[ZS_CPU] = {[ZS_F32] = cpu_cross_entropy_backward,
                           [ZS_F64] = cpu_cross_entropy_backward,
                           [ZS_BF16] = cpu_cross_entropy_backward,
                           [ZS_F16] = cpu_cross_entropy_backward}},
    .cost = cross_entropy_backward_cost,
    .attr_size = sizeof(cross_entropy_attrs)};

zsi_opdef zsi_def_cross_entropy = {
    .op = {.name = "cross_entropy", .backward = cross_entropy_bw}, .arity = 2,
    .cls = ZSI_OTHER, .flops = 5, .infer = infer_cross_entropy,
    .kernel = {[ZS_CPU] = {[ZS_F32] = cpu_cross_entropy,
                           [ZS_F64] = cpu_cross_entropy,
                           [ZS_BF16] = cpu_cross_entropy,
                           [ZS_F16] = cpu_cross_entropy}},
    .save = save_cross_entropy, .cost = loss_cost,
    .attr_size = sizeof(cross_entropy_attrs),
    .bw_ops = (zsi_opdef *const[]){&zsi_def_cross_entropy_backward, NULL}};

zs_tensor *zs_cross_entropy(zs_tensor *logits, zs_tensor *target,
                            int64_t ignore_index)
{
    cross_entropy_attrs at = {.ignore_index = ignore_index,
                              .f32_loss = zsi_amp_dtype != ZS_F32};
    return zsi_run(&zsi_def_cross_entropy, 2, (zs_tensor *[]){logits, target}, &at);
}

static zs_status cross_entropy_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin)
{
    zs_tensor *in[] = {n->saved[0], n->saved[1], n->saved[2], n->saved[3], g};
    gin[0] = zsi_run(&zsi_def_cross_entropy_backward, 5, in, zsi_node_attrs(n));
    return gin[0] ? ZS_OK : ZS_ERR_NOMEM;
}

/* ---- cross entropy over a shard of the classes ------------------------- */

/* row_lse: x [N, C] (f32, f64) -> f64 [N], log sum_j exp(x[i, j]) per row
 * by the cross-entropy kernel (its targets 0, the losses dropped). Not
 * differentiable: the shard's loss below takes the global log-sum-exp as
 * a given. */
static zs_status infer_row_lse(zsi_call *c)
{
    const zs_tensor *x = c->in[0];
    zs_status st = zsi_check_float_dtype("row_lse", x);
    if (st == ZS_OK && (x->ndim != 2 || x->shape[1] < 1)) {
        char sx[96];
        st = zs_set_error("row_lse: logits %s, expected [N, C] with C >= 1",
                          zs_shape_str(x, sx, sizeof sx));
    }
    if (st != ZS_OK)
        return st;
    c->dtype = ZS_F64;
    c->ndim = 1;
    c->shape[0] = x->shape[0];
    return ZS_OK;
}

static zs_status cpu_row_lse(const zsi_call *c, zs_tensor *out)
{
    zs_tensor *xc = zsi_contig_host(c->in[0]);
    int64_t N = c->in[0]->shape[0], C = c->in[0]->shape[1];
    int64_t *t = calloc((size_t)(N ? N : 1), sizeof *t);
    double *loss = malloc((size_t)(N ? N : 1) * sizeof *loss);
    zs_status st = xc && t && loss ? ZS_OK
                   : zs_set_error_code(ZS_ERR_NOMEM, "row_lse: out of memory");
    zsk_targets tg = {t, true, -1};
    if (st == ZS_OK)
        st = zsk_cross_entropy(xc->dtype, zs_data(xc), &tg, N, C, zs_data(out), loss);
    zs_release(xc);
    free(t);
    free(loss);
    return st;
}

/* 3 FLOPs per logit (max pass, exp, sum); x read, [N] written */
static zsi_cost row_lse_cost(const zsi_call *c, const zs_tensor *out)
{
    return (zsi_cost){3.0 * (double)zs_numel(c->in[0]), zsi_bytes(c->in[0]),
                      zsi_bytes(out)};
}

zsi_opdef zsi_def_row_lse = {
    .op = {.name = "row_lse"}, .arity = 1, .cls = ZSI_OTHER,
    .infer = infer_row_lse,
    .kernel = {[ZS_CPU] = {[ZS_F32] = cpu_row_lse, [ZS_F64] = cpu_row_lse}},
    .cost = row_lse_cost};

zs_tensor *zsi_row_lse(zs_tensor *x)
{
    return zsi_run(&zsi_def_row_lse, 1, (zs_tensor *[]){x}, NULL);
}

/* cross_entropy_shard: inputs z [N, C] (f32, f64), t [N] (i32, i64), lse
 * [N] (f64), count (i64, one value); a 0-d result of z's dtype. */
static zs_status infer_ce_shard(zsi_call *c)
{
    const char *op = c->def->op.name;
    const zs_tensor *z = c->in[0], *t = c->in[1], *lse = c->in[2], *cnt = c->in[3];
    zs_status st = zsi_check_float_dtype(op, z);
    if (st == ZS_OK)
        st = zsi_check_index(op, t);
    if (st != ZS_OK)
        return st;
    int64_t N = z->ndim == 2 ? z->shape[0] : -1;
    if (N < 0 || z->shape[1] < 1 || t->ndim != 1 || t->shape[0] != N ||
        lse->dtype != ZS_F64 || lse->ndim != 1 || lse->shape[0] != N ||
        cnt->dtype != ZS_I64 || zs_numel(cnt) != 1) {
        char sz[96], stt[96], sl[96];
        return zs_set_error("%s: logits %s, targets %s, lse %s %s, count %s: expected "
                            "logits [N, C] with C >= 1, N targets, N f64 lse values "
                            "and one i64 count", op, zs_shape_str(z, sz, sizeof sz),
                            zs_shape_str(t, stt, sizeof stt), zs_dtype_name(lse->dtype),
                            zs_shape_str(lse, sl, sizeof sl), zs_dtype_name(cnt->dtype));
    }
    c->dtype = z->dtype;
    c->ndim = 0;
    return ZS_OK;
}

/* sum over rows whose target lies in [0, C) of lse - z[i, t], / count. */
static zs_status cpu_ce_shard(const zsi_call *c, zs_tensor *out)
{
    zs_tensor *z = c->in[0];
    zs_tensor *tc = zsi_contig_host(c->in[1]), *lc = tc ? zsi_contig_host(c->in[2]) : NULL;
    if (!lc) {
        zs_release(tc);
        return zs_set_error_code(ZS_ERR_NOMEM, "cross_entropy_shard: out of memory");
    }
    int64_t N = z->shape[0], C = z->shape[1], count = (int64_t)zs_item(c->in[3]);
    const double *lse = zs_data(lc);
    double s = 0;
    for (int64_t i = 0; i < N; i++) {
        int64_t t = c->in[1]->dtype == ZS_I64 ? ((const int64_t *)zs_data(tc))[i]
                                              : ((const int32_t *)zs_data(tc))[i];
        if (t < 0 || t >= C)
            continue; /* another shard's row, or ignored */
        int64_t o = i * z->strides[0] + t * z->strides[1];
        double v = z->dtype == ZS_F64 ? ((const double *)zs_data(z))[o]
                                      : (double)((const float *)zs_data(z))[o];
        s += lse[i] - v;
    }
    zsi_store(out->dtype, zs_data(out), 0, count > 0 ? s / (double)count : 0.0);
    zs_release(tc);
    zs_release(lc);
    return ZS_OK;
}

/* saved: 0 z, 1 t, 2 lse, 3 count (the inputs: cross_entropy_backward
 * reads them as they are) */
static void save_ce_shard(zsi_ctx *n, const zsi_call *c, zs_tensor *out)
{
    (void)out;
    for (int k = 0; k < 4; k++)
        zsi_save(n, k, c->in[k]);
}

/* one FLOP per row; the targets and lse read (one logit per row) */
static zsi_cost ce_shard_cost(const zsi_call *c, const zs_tensor *out)
{
    return (zsi_cost){(double)c->in[0]->shape[0],
                      zsi_bytes(c->in[1]) + zsi_bytes(c->in[2]), zsi_bytes(out)};
}

zsi_opdef zsi_def_cross_entropy_shard = {
    .op = {.name = "cross_entropy_shard", .backward = cross_entropy_bw}, .arity = 4,
    .cls = ZSI_OTHER, .infer = infer_ce_shard,
    .kernel = {[ZS_CPU] = {[ZS_F32] = cpu_ce_shard, [ZS_F64] = cpu_ce_shard}},
    .save = save_ce_shard, .cost = ce_shard_cost,
    .attr_size = sizeof(cross_entropy_attrs),
    .bw_ops = (zsi_opdef *const[]){&zsi_def_cross_entropy_backward, NULL}};

zs_tensor *zsi_cross_entropy_shard(zs_tensor *z, zs_tensor *t, zs_tensor *lse,
                                   zs_tensor *count, int64_t ignore_index)
{
    cross_entropy_attrs at = {.ignore_index = ignore_index};
    return zsi_run(&zsi_def_cross_entropy_shard, 4, (zs_tensor *[]){z, t, lse, count},
                   &at);
}

/* ---- mse --------------------------------------------------------------- */

/* a, b: one dtype (f32, f64, bf16 or f16), equal shapes; a 0-d output
 * of that dtype (bf16/f16: summed in double, rounded once) */
static zs_status infer_mse(zsi_call *c)
{
    const zs_tensor *a = c->in[0], *b = c->in[1];
    if (zsi_check_pair_float16("mse_loss", a, b) != ZS_OK)
        return ZS_ERR_ARG;
    if (!zs_same_shape(a, b)) {
        char sa[96], sb[96];
        return zs_set_error("mse_loss: shapes %s and %s differ, expected "
                            "equal shapes", zs_shape_str(a, sa, sizeof sa),
                            zs_shape_str(b, sb, sizeof sb));
    }
    c->dtype = a->dtype;
    c->ndim = 0;
    return ZS_OK;
}

static zs_status cpu_mse(const zsi_call *c, zs_tensor *out)
{
    zs_tensor *a = c->in[0], *b = c->in[1];
    int64_t num = zs_numel(a);
    zsi_tracking_pause();
    zs_no_grad_push();
    zs_tensor *ac = zs_contiguous(a), *bc = zs_contiguous(b);
    zs_no_grad_pop();
    zsi_tracking_resume();
    if (ac && bc) {
        double s = zsk_sq_diff_sum(a->dtype, zs_data(ac), zs_data(bc), num);
        zsi_store(out->dtype, zs_data(out), 0, num ? s / (double)num : NAN);
    }
    zs_status st = ac && bc ? ZS_OK : ZS_ERR_NOMEM;
    zs_release(ac);
    zs_release(bc);
    return st;
}

/* saved: 0 a, 1 b; p.f[8] = 2 / n */
static void save_mse(zsi_ctx *n, const zsi_call *c, zs_tensor *out)
{
    zsi_save(n, 0, c->in[0]);
    zsi_save(n, 1, c->in[1]);
    n->p.f[8] = 2.0 / (double)zs_numel(c->in[0]);
}

zsi_opdef zsi_def_mse = {
    .op = {.name = "mse_loss", .backward = mse_bw}, .arity = 2,
    .cls = ZSI_OTHER, .flops = 3, .infer = infer_mse,
    .kernel = {[ZS_CPU] = {[ZS_F32] = cpu_mse, [ZS_F64] = cpu_mse,
                           [ZS_BF16] = cpu_mse, [ZS_F16] = cpu_mse}},
    .save = save_mse, .cost = loss_cost,
    .bw_ops = (zsi_opdef *const[]){&zsi_def_sub, &zsi_def_mul,
                                   &zsi_def_mul_scalar, NULL}};

zs_tensor *zs_mse_loss(zs_tensor *a, zs_tensor *b)
{
    return zsi_run(&zsi_def_mse, 2, (zs_tensor *[]){a, b}, NULL);
}

static zs_status mse_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin)
{
    zs_tensor *d = zs_sub(n->saved[0], n->saved[1]);
    zs_tensor *t = d ? zs_mul(d, g) : NULL;
    zs_release(d);
    if (!t)
        return ZS_ERR_NOMEM;
    zs_status st = ZS_OK;
    for (int i = 0; i < 2 && st == ZS_OK; i++)
        if (zsi_needs_grad(n, i) &&
            !(gin[i] = zs_mul_scalar(t, i == 0 ? n->p.f[8] : -n->p.f[8])))
            st = ZS_ERR_NOMEM;
    zs_release(t);
    return st;
}
