/*
 * iter.c - strided n-d iteration for elementwise kernels (see iter.h).
 */
#include "kernels/cpu/iter.h"

#include <string.h>

void zsk_iter_init(zsk_iter *it, int ndim, const int64_t *shape, int nops,
                   const int64_t *const *strides)
{
    int64_t cs[ZS_MAX_DIMS];
    int64_t s = 1;
    for (int d = ndim - 1; d >= 0; d--) {
        cs[d] = s;
        s *= shape[d];
    }
    it->nops = nops;
    it->numel = s;
    /* Drop size-1 dims, then merge dim d into d+1 when contiguous. */
    int n = 0;
    int64_t sh[ZS_MAX_DIMS], st[ZSK_MAX_OPS][ZS_MAX_DIMS];
    for (int d = 0; d < ndim; d++) {
        if (shape[d] == 1)
            continue;
        sh[n] = shape[d];
        for (int k = 0; k < nops; k++)
            st[k][n] = strides[k] ? strides[k][d] : cs[d];
        n++;
    }
    if (n == 0) {
        sh[0] = 1;
        for (int k = 0; k < nops; k++)
            st[k][0] = 1;
        n = 1;
    }
    int m = 0;
    it->shape[0] = sh[0];
    for (int k = 0; k < nops; k++)
        it->strides[k][0] = st[k][0];
    for (int d = 1; d < n; d++) {
        bool merge = true;
        for (int k = 0; k < nops; k++)
            if (it->strides[k][m] != st[k][d] * sh[d])
                merge = false;
        if (merge) {
            it->shape[m] *= sh[d];
            for (int k = 0; k < nops; k++)
                it->strides[k][m] = st[k][d];
        } else {
            m++;
            it->shape[m] = sh[d];
            for (int k = 0; k < nops; k++)
                it->strides[k][m] = st[k][d];
        }
    }
    it->ndim = m + 1;
}

void zsk_iter_range(const zsk_iter *it, int64_t begin, int64_t end,
                    zsk_seg_fn seg, void *ctx)
{
    int last = it->ndim - 1;
    int64_t inner = it->shape[last];
    int64_t idx[ZS_MAX_DIMS], offs[ZSK_MAX_OPS];
    int64_t row = begin / inner, col = begin % inner;
    for (int d = last - 1; d >= 0; d--) {
        idx[d] = row % it->shape[d];
        row /= it->shape[d];
    }
    for (int k = 0; k < it->nops; k++) {
        offs[k] = col * it->strides[k][last];
        for (int d = 0; d < last; d++)
            offs[k] += idx[d] * it->strides[k][d];
    }
    int64_t pos = begin;
    while (pos < end) {
        int64_t len = inner - col;
        if (len > end - pos)
            len = end - pos;
        seg(ctx, offs, len);
        pos += len;
        if (pos >= end)
            break;
        /* advance to the next row start */
        for (int k = 0; k < it->nops; k++)
            offs[k] -= col * it->strides[k][last];
        col = 0;
        for (int d = last - 1; d >= 0; d--) {
            idx[d]++;
            for (int k = 0; k < it->nops; k++)
                offs[k] += it->strides[k][d];
            if (idx[d] < it->shape[d])
                break;
            for (int k = 0; k < it->nops; k++)
                offs[k] -= it->shape[d] * it->strides[k][d];
            idx[d] = 0;
        }
    }
}

typedef struct par_ctx {
    const zsk_iter *it;
    zsk_seg_fn seg;
    void *ctx;
} par_ctx;

static void par_body(void *p, int64_t b, int64_t e)
{
    par_ctx *c = p;
    zsk_iter_range(c->it, b, e, c->seg, c->ctx);
}

void zsk_iter_parallel(const zsk_iter *it, int64_t grain, zsk_seg_fn seg,
                       void *ctx)
{
    par_ctx c = {it, seg, ctx};
    zs_parallel_for(it->numel, grain, par_body, &c);
}

void zsk_broadcast_strides(int ndim, const int64_t *shape,
                           const int64_t *strides, int ondim,
                           const int64_t *oshape, int64_t *out)
{
    int lead = ondim - ndim;
    for (int d = 0; d < ondim; d++) {
        if (d < lead)
            out[d] = 0;
        else
            out[d] = (shape[d - lead] == 1 && oshape[d] != 1) ? 0
                                                               : strides[d - lead];
    }
}
