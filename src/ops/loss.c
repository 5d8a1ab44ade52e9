/*
 * loss.c - zs_cross_entropy and zs_mse_loss.
 *
 * cross_entropy is one fused kernel (kernels/cpu/softmax.c): per row the
 * log-sum-exp and the picked logit, then a mean over the rows whose target
 * is not ignore_index, summed in row order in double (0 when every row is
 * ignored). Targets are checked before any work: one outside [0, C) that
 * is not ignore_index fails with a message naming its position. Saved:
 * 0 contiguous logits [N, C], 1 contiguous targets, 2 per-row log-sum-exp
 * (f64 [N]); p.i = {ignore_index, count, N, C}. The backward is a fused
 * kernel, gx = g * (softmax(x) - onehot(t)) / count on counted rows and 0
 * on ignored ones, not itself differentiable ("cross_entropy_backward").
 *
 * mse_loss = mean((a - b)^2) over equal shapes, a fused sum of squared
 * differences; backward (with zs_* ops): ga = 2 (a - b) g / n, gb = -ga.
 * Saved: 0 a, 1 b; p.f[0] = 2 / n.
 *
 * Cost models: inputs read once, a scalar written; cross entropy about
 * 5 FLOPs per logit, mse 3 per element.
 */
#include <math.h>
#include <stdlib.h>

#include "kernels/cpu/reduce_ext.h"
#include "kernels/cpu/softmax.h"
#include "ops/internal.h"

static zs_status cross_entropy_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin);
static zs_status mse_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin);

static zsi_op OP_CROSS_ENTROPY = {.name = "cross_entropy",
                                  .backward = cross_entropy_bw};
static zsi_op OP_CROSS_ENTROPY_BW = {.name = "cross_entropy_backward"};
static zsi_op OP_MSE = {.name = "mse_loss", .backward = mse_bw};

/* ---- cross entropy ----------------------------------------------------- */

/* target must be logits.shape[:-1], or 1-D with N elements. */
static zs_status ce_check(zs_tensor *x, zs_tensor *t)
{
    zs_status st = zsi_check_float("cross_entropy", x);
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
    zsk_cross_entropy(xc->dtype, zs_data(xc), tg, N, C, zs_data(lse), loss);
    double s = 0;
    for (int64_t i = 0; i < N; i++)
        s += loss[i];
    free(loss);
    *mean = count ? s / (double)count : 0.0;
    return ZS_OK;
}

zs_tensor *zs_cross_entropy(zs_tensor *logits, zs_tensor *target,
                            int64_t ignore_index)
{
    if (!logits || !target)
        return NULL;
    double t0 = zsi_op_begin(&OP_CROSS_ENTROPY);
    if (ce_check(logits, target) != ZS_OK)
        return NULL;
    int64_t C = logits->shape[logits->ndim - 1], N = zs_numel(logits) / C;
    zsi_tracking_pause();
    zs_no_grad_push();
    zs_tensor *xc = zs_contiguous(logits), *tc = zs_contiguous(target);
    zs_tensor *lse = zsi_new_tensor(ZS_F64, 1, &N);
    zs_no_grad_pop();
    zsi_tracking_resume();
    zs_tensor *out = NULL;
    zsk_targets tg = {tc ? zs_data(tc) : NULL, target->dtype == ZS_I64,
                      ignore_index};
    int64_t count = xc && tc && lse ? ce_count(&tg, N, C) : -1;
    double v = 0;
    if (count >= 0 && ce_forward(xc, &tg, N, C, count, lse, &v) == ZS_OK)
        out = zsi_new_tensor(logits->dtype, 0, NULL);
    zsi_ctx *n = NULL;
    if (out) {
        zsi_store(out->dtype, zs_data(out), 0, v);
        if (zsi_record(&OP_CROSS_ENTROPY, out, 1, &logits, &n) != ZS_OK) {
            zs_release(out);
            out = NULL;
        }
    }
    if (n) {
        zsi_save(n, 0, xc);
        zsi_save(n, 1, tc);
        zsi_save(n, 2, lse);
        n->p.i[0] = ignore_index;
        n->p.i[1] = count;
        n->p.i[2] = N;
        n->p.i[3] = C;
    }
    if (out)
        zsi_op_end(&OP_CROSS_ENTROPY, t0, 5.0 * (double)zs_numel(logits),
                   zsi_bytes(logits) + zsi_bytes(target), zsi_bytes(out));
    zs_release(xc);
    zs_release(tc);
    zs_release(lse);
    return out;
}

static zs_status cross_entropy_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin)
{
    double t0 = zsi_op_begin(&OP_CROSS_ENTROPY_BW);
    zs_tensor *x = n->saved[0], *t = n->saved[1], *lse = n->saved[2];
    const zsi_meta *m = &n->in_meta[0];
    int64_t count = n->p.i[1];
    if (count == 0) {
        gin[0] = zs_zeros(m->dtype, m->ndim, m->shape);
        return gin[0] ? ZS_OK : ZS_ERR_NOMEM;
    }
    gin[0] = zsi_new_tensor(m->dtype, m->ndim, m->shape);
    if (!gin[0])
        return ZS_ERR_NOMEM;
    zsk_targets tg = {zs_data(t), t->dtype == ZS_I64, n->p.i[0]};
    zsk_cross_entropy_backward(x->dtype, zs_data(x), &tg, n->p.i[2],
                               n->p.i[3], zs_data(lse),
                               zs_item(g) / (double)count, zs_data(gin[0]));
    zsi_op_end(&OP_CROSS_ENTROPY_BW, t0, 4.0 * (double)zs_numel(x),
               zsi_bytes(x) + zsi_bytes(t) + zsi_bytes(lse), zsi_bytes(x));
    return ZS_OK;
}

/* ---- mse --------------------------------------------------------------- */

zs_tensor *zs_mse_loss(zs_tensor *a, zs_tensor *b)
{
    if (!a || !b)
        return NULL;
    double t0 = zsi_op_begin(&OP_MSE);
    if (zsi_check_pair("mse_loss", a, b) != ZS_OK)
        return NULL;
    if (!zs_same_shape(a, b)) {
        char sa[96], sb[96];
        zs_set_error("mse_loss: shapes %s and %s differ, expected equal "
                     "shapes", zs_shape_str(a, sa, sizeof sa),
                     zs_shape_str(b, sb, sizeof sb));
        return NULL;
    }
    int64_t num = zs_numel(a);
    zsi_tracking_pause();
    zs_no_grad_push();
    zs_tensor *ac = zs_contiguous(a), *bc = zs_contiguous(b);
    zs_no_grad_pop();
    zsi_tracking_resume();
    zs_tensor *out = ac && bc ? zsi_new_tensor(a->dtype, 0, NULL) : NULL;
    if (out) {
        double s = zsk_sq_diff_sum(a->dtype, zs_data(ac), zs_data(bc), num);
        zsi_store(out->dtype, zs_data(out), 0, num ? s / (double)num : NAN);
    }
    zs_release(ac);
    zs_release(bc);
    zsi_ctx *n;
    zs_tensor *in[2] = {a, b};
    if (!out || zsi_record(&OP_MSE, out, 2, in, &n) != ZS_OK) {
        zs_release(out);
        return NULL;
    }
    if (n) {
        zsi_save(n, 0, a);
        zsi_save(n, 1, b);
        n->p.f[0] = 2.0 / (double)num;
    }
    zsi_op_end(&OP_MSE, t0, 3.0 * (double)num, zsi_bytes(a) + zsi_bytes(b),
               zsi_bytes(out));
    return out;
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
            !(gin[i] = zs_mul_scalar(t, i == 0 ? n->p.f[0] : -n->p.f[0])))
            st = ZS_ERR_NOMEM;
    zs_release(t);
    return st;
}
