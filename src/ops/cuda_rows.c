/*
 * ops/cuda_rows.c - the CUDA adapters of the row operators: layer_norm and
 * layer_norm_backward, cross_entropy and cross_entropy_backward, embedding
 * and embedding_backward, sum and mean (kernels in kernels/cuda/rows.cu).
 *
 * Each keeps its CPU descriptor's contract (ops/norm.c, loss.c,
 * embedding.c, reduce.c): the same aux results (layer norm: contiguous x,
 * weight, f32 mean and rstd; cross entropy: contiguous logits and targets,
 * f64 lse, the i64 count), the same results and dtypes. Indices are
 * checked on the GPU and the verdict (first bad position, its value, the
 * count) is read back before anything is written, so a bad index fails
 * with the CPU's message; that read is the one synchronisation of these
 * operators.
 */
#include <stdio.h>
#include <string.h>

#include "ops/cuda_internal.h"

#ifdef ZS_HAVE_CUDA

/* Checks n indices of idx (contiguous, on cuda) against [0, hi), skipping
 * ignore; res3 (device, 3 i64) keeps the verdict; *count receives the
 * number not ignored. Fails naming op and the first bad index. */
static zs_status check_idx(const char *op, const zs_tensor *idx, int64_t hi,
                           int64_t ignore, zs_tensor *res3, int64_t *count)
{
    int64_t r[3] = {-1, 0, 0};
    zs_status st = zsk_cuda_index_check(zsi_ptr(idx), idx->dtype == ZS_I64,
                                        zs_numel(idx), hi, ignore, zsi_ptr(res3));
    if (st == ZS_OK)
        st = zsi_device_copy(ZS_CUDA, r, zsi_ptr(res3), sizeof r, ZS_COPY_TO_HOST);
    if (st != ZS_OK)
        return st;
    *count = r[2];
    if (r[0] < 0)
        return ZS_OK;
    if (!strcmp(op, "cross_entropy")) /* the CPU's messages (loss.c, embedding.c) */
        return zs_set_error("cross_entropy: target %lld at index %lld is out of range "
                            "[0, %lld) (ignore_index %lld)", (long long)r[1],
                            (long long)r[0], (long long)hi, (long long)ignore);
    char pos[160] = "[", *p = pos + 1;
    int64_t rem = r[0], coord[ZS_MAX_DIMS];
    for (int d = idx->ndim - 1; d >= 0; d--) {
        coord[d] = idx->shape[d] ? rem % idx->shape[d] : 0;
        rem = idx->shape[d] ? rem / idx->shape[d] : 0;
    }
    for (int d = 0; d < idx->ndim; d++)
        p += snprintf(p, sizeof pos - (size_t)(p - pos), "%s%lld", d ? ", " : "",
                      (long long)coord[d]);
    snprintf(p, sizeof pos - (size_t)(p - pos), "]");
    return zs_set_error("%s: index %lld at position %s (flat %lld) is out of range "
                        "[0, %lld)", op, (long long)r[1], pos, (long long)r[0],
                        (long long)hi);
}

/* ---- layer norm ---- */

static zs_tensor *slot_of(const zsi_call *c, int64_t s)
{
    return s >= 0 ? c->in[s] : NULL;
}

static zs_status k_layer_norm(const zsi_call *c, zs_tensor *out)
{
    const layer_norm_attrs *at = c->attrs;
    zs_tensor *x = c->in[0], *w = slot_of(c, at->weight), *b = slot_of(c, at->bias);
    int64_t C = x->shape[x->ndim - 1], R = C > 0 ? zs_numel(x) / C : 0;
    bool rec = zsi_call_records(c);
    zs_tensor *xc, *wc, *bc, *mean = NULL, *rstd = NULL;
    if (rec) { /* borrowed: c holds them */
        xc = zs_retain(zsi_aux_copy(c, 0, x, zs_contiguous));
        wc = w ? zs_retain(zsi_aux_copy(c, 1, w, zs_contiguous)) : NULL;
        mean = zsi_aux_new(c, 2, ZS_F32, 1, &R);
        rstd = zsi_aux_new(c, 3, ZS_F32, 1, &R);
    } else {
        xc = zsi_cuda_contig(x);
        wc = w ? zsi_cuda_contig(w) : NULL;
    }
    bc = b ? zsi_cuda_contig(b) : NULL;
    zs_status st = xc && (!w || wc) && (!b || bc) && (!rec || (mean && rstd))
                       ? ZS_OK : ZS_ERR_NOMEM;
    zs_dtype pdt = w ? w->dtype : b ? b->dtype : x->dtype;
    if (st == ZS_OK)
        st = zsk_cuda_layer_norm(x->dtype, pdt, zsi_ptr(xc), wc ? zsi_ptr(wc) : NULL,
                                 bc ? zsi_ptr(bc) : NULL, R, C, at->eps, zsi_ptr(out),
                                 mean ? zsi_ptr(mean) : NULL,
                                 rstd ? zsi_ptr(rstd) : NULL);
    zs_release(xc);
    zs_release(wc);
    zs_release(bc);
    return st;
}

/* inputs x, mean, rstd, g[, weight]; results gx (empty when not wanted),
 * gw, gb (c->outs[1], [2]; NULL when not wanted) */
static zs_status k_layer_norm_backward(const zsi_call *c, zs_tensor *gx)
{
    zs_tensor *t[5] = {0};
    zs_status st = ZS_OK;
    for (int i = 0; i < c->nin && i < 5; i++)
        if (!(t[i] = zsi_cuda_contig(c->in[i])))
            st = ZS_ERR_NOMEM;
    zs_tensor *x = t[0];
    int64_t C = c->in[0]->shape[c->in[0]->ndim - 1];
    int64_t R = C > 0 ? zs_numel(c->in[0]) / C : 0;
    zs_tensor *gw = c->outs[1], *gb = c->outs[2], *part = NULL;
    zs_dtype pdt = gw ? gw->dtype : gb ? gb->dtype : c->in[0]->dtype;
    if (st == ZS_OK && (gw || gb)) {
        int64_t n = 2 * zsk_cuda_layer_norm_parts(R) * (C > 0 ? C : 1);
        if (!(part = zsi_cuda_empty(ZS_F64, 1, &n)))
            st = ZS_ERR_NOMEM;
        for (int k = 0; st == ZS_OK && k < 2; k++) /* R = 0: zero sums */
            if (c->outs[k + 1])
                st = zsi_device_memset(ZS_CUDA, zsi_ptr(c->outs[k + 1]), 0,
                                       zs_nbytes(c->outs[k + 1]));
    }
    if (st == ZS_OK)
        st = zsk_cuda_layer_norm_backward(
            x->dtype, pdt, zsi_ptr(x), t[4] ? zsi_ptr(t[4]) : NULL, zsi_ptr(t[1]),
            zsi_ptr(t[2]), zsi_ptr(t[3]), R, C, zs_numel(gx) ? zsi_ptr(gx) : NULL,
            gw ? zsi_ptr(gw) : NULL, gb ? zsi_ptr(gb) : NULL,
            part ? zsi_ptr(part) : NULL);
    for (int i = 0; i < 5; i++)
        zs_release(t[i]);
    zs_release(part);
    return st;
}

/* ---- cross entropy ---- */

static zs_status k_cross_entropy(const zsi_call *c, zs_tensor *out)
{
    const cross_entropy_attrs *at = c->attrs;
    zs_tensor *logits = c->in[0], *target = c->in[1];
    int64_t C = logits->shape[logits->ndim - 1], N = zs_numel(logits) / C;
    bool rec = zsi_call_records(c);
    zs_tensor *xc, *tc, *lse, *cnt = NULL;
    if (rec) {
        xc = zs_retain(zsi_aux_copy(c, 0, logits, zs_contiguous));
        tc = zs_retain(zsi_aux_copy(c, 1, target, zs_contiguous));
        lse = zs_retain(zsi_aux_new(c, 2, ZS_F64, 1, &N));
        cnt = zsi_aux_new(c, 3, ZS_I64, 0, NULL);
    } else {
        xc = zsi_cuda_contig(logits);
        tc = zsi_cuda_contig(target);
        lse = zsi_cuda_empty(ZS_F64, 1, &N);
    }
    int64_t three = 3, count = 0;
    zs_tensor *res = zsi_cuda_empty(ZS_I64, 1, &three);
    zs_tensor *loss = zsi_cuda_empty(ZS_F64, 1, &N);
    zs_status st = xc && tc && lse && res && loss && (!rec || cnt) ? ZS_OK : ZS_ERR_NOMEM;
    if (st == ZS_OK)
        st = check_idx("cross_entropy", tc, C, at->ignore_index, res, &count);
    int64_t *dcount = res ? (int64_t *)zsi_ptr(res) + 2 : NULL;
    if (st == ZS_OK)
        st = zsk_cuda_cross_entropy(logits->dtype, zsi_ptr(xc), zsi_ptr(tc),
                                    target->dtype == ZS_I64, at->ignore_index, N, C,
                                    dcount, zsi_ptr(lse), zsi_ptr(loss), out->dtype,
                                    zsi_ptr(out));
    if (st == ZS_OK && cnt)
        st = zsi_device_copy(ZS_CUDA, zsi_ptr(cnt), dcount, sizeof(int64_t),
                             ZS_COPY_ON_DEVICE);
    zs_tensor *all[] = {xc, tc, lse, res, loss};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        zs_release(all[i]);
    return st;
}

/* inputs logits, targets, lse, count, g */
static zs_status k_cross_entropy_backward(const zsi_call *c, zs_tensor *out)
{
    const cross_entropy_attrs *at = c->attrs;
    zs_tensor *x = c->in[0], *t = c->in[1];
    int64_t C = x->shape[x->ndim - 1], N = zs_numel(x) / C;
    zs_tensor *xc = zsi_cuda_contig(x), *tc = zsi_cuda_contig(t);
    zs_tensor *lc = zsi_cuda_contig(c->in[2]);
    zs_tensor *g = c->in[4];
    zs_status st = xc && tc && lc ? ZS_OK : ZS_ERR_NOMEM;
    if (st == ZS_OK)
        st = zsk_cuda_cross_entropy_backward(
            x->dtype, zsi_ptr(xc), zsi_ptr(tc), t->dtype == ZS_I64, at->ignore_index,
            zsi_ptr(lc), zsi_ptr(c->in[3]), g->dtype, zsi_ptr(g), N, C, zsi_ptr(out));
    zs_release(xc);
    zs_release(tc);
    zs_release(lc);
    return st;
}

/* ---- embedding ---- */

static zs_status k_embedding(const zsi_call *c, zs_tensor *out)
{
    const zs_tensor *w = c->in[0];
    zs_tensor *ic = zsi_aux_copy(c, 0, c->in[1], zs_contiguous); /* borrowed */
    int64_t three = 3, count;
    zs_tensor *res = zsi_cuda_empty(ZS_I64, 1, &three);
    zs_status st = ic && res ? ZS_OK : ZS_ERR_NOMEM;
    if (st == ZS_OK) /* ignore: no index equals INT64_MIN in range */
        st = check_idx("embedding", ic, w->shape[0], INT64_MIN, res, &count);
    if (st == ZS_OK)
        st = zsk_cuda_embedding(w->dtype, zsi_ptr(w), w->strides[0], w->strides[1],
                                zsi_ptr(ic), ic->dtype == ZS_I64, zs_numel(ic),
                                w->shape[1], zsi_ptr(out));
    zs_release(res);
    return st;
}

/* inputs idx, g [idx..., D]; out [V, D] */
static zs_status k_embedding_backward(const zsi_call *c, zs_tensor *out)
{
    zs_tensor *ic = zsi_cuda_contig(c->in[0]), *gc = zsi_cuda_contig(c->in[1]);
    zs_tensor *acc = NULL;
    zs_status st = ic && gc ? ZS_OK : ZS_ERR_NOMEM;
    if (st == ZS_OK && out->dtype != ZS_F32 &&
        !(acc = zsi_cuda_empty(ZS_F32, out->ndim, out->shape)))
        st = ZS_ERR_NOMEM;
    if (st == ZS_OK)
        st = zsk_cuda_embedding_backward(out->dtype, zsi_ptr(ic), ic->dtype == ZS_I64,
                                         zs_numel(ic), zsi_ptr(gc), out->shape[0],
                                         out->shape[1], zsi_ptr(acc ? acc : out),
                                         zsi_ptr(out));
    zs_release(ic);
    zs_release(gc);
    zs_release(acc);
    return st;
}

/* ---- sum, mean ---- */

static zs_status k_sum(const zsi_call *c, zs_tensor *out)
{
    const reduce_attrs *a = c->attrs;
    zsi_reduce_plan p;
    if (zsi_reduce_plan_make(c->in[0], a->mask, &p) != ZS_OK)
        return ZS_ERR_NOMEM;
    zs_status st = zsk_cuda_sum(out->dtype, zsi_ptr(p.x), p.O, p.R, p.K,
                                c->def == &zsi_def_mean, zsi_ptr(out));
    zs_release(p.x);
    return st;
}

zs_status zsi_cuda_install_rows(void)
{
    zsi_cuda_kernel k[32];
    size_t n = 0;
    for (int d = 0; d < 2; d++) {
        zs_dtype dt = d ? ZS_BF16 : ZS_F32;
        k[n++] = (zsi_cuda_kernel){&zsi_def_layer_norm, dt, k_layer_norm};
        k[n++] = (zsi_cuda_kernel){&zsi_def_layer_norm_backward, dt, k_layer_norm_backward};
        k[n++] = (zsi_cuda_kernel){&zsi_def_cross_entropy, dt, k_cross_entropy};
        k[n++] = (zsi_cuda_kernel){&zsi_def_cross_entropy_backward, dt,
                                   k_cross_entropy_backward};
        k[n++] = (zsi_cuda_kernel){&zsi_def_embedding, dt, k_embedding};
        k[n++] = (zsi_cuda_kernel){&zsi_def_embedding_backward, dt, k_embedding_backward};
        k[n++] = (zsi_cuda_kernel){&zsi_def_sum, dt, k_sum};
        k[n++] = (zsi_cuda_kernel){&zsi_def_mean, dt, k_sum};
    }
    return zsi_cuda_install(k, n);
}

#endif
