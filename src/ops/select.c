/*
 * select.c - where, masked_fill, index_select, gather.
 *
 * where and masked_fill are one elementwise pass (zsk_where) over the
 * broadcast shape; their backward routes g through the same condition
 * (zeros elsewhere) and sums it to each input's shape. index_select and
 * gather share one indexed copy over an [O, L, K] index space (select.h):
 * the space is the output's shape split around dim; index_select's index
 * varies along L only, gather's along all three. Their backward
 * scatter-adds g into zeros of the input's shape, so repeated indices
 * accumulate. Indices are checked before any access: an index out of range
 * gives an error naming its value and position, never a crash.
 *
 * The kernels move elements by size, so all four work for every dtype;
 * gradients exist for f32 and f64 (the dtypes that can require grad).
 */
#include <stdlib.h>

#include "kernels/cpu/select.h"
#include "ops/internal.h"

static zs_status where_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin);
static zs_status masked_fill_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin);
static zs_status index_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin);

static zsi_op OP_WHERE = {.name = "where", .backward = where_bw};
static zsi_op OP_MASKED_FILL = {.name = "masked_fill", .backward = masked_fill_bw};
static zsi_op OP_INDEX_SELECT = {.name = "index_select", .backward = index_bw};
static zsi_op OP_GATHER = {.name = "gather", .backward = index_bw};

/* ---- where, masked_fill ------------------------------------------------ */

static zs_status check_u8(const char *op, const char *what, const zs_tensor *t)
{
    if (t->dtype != ZS_U8)
        return zs_set_error("%s: %s dtype %s, expected u8", op, what,
                            zs_dtype_name(t->dtype));
    return ZS_OK;
}

/* numpy broadcasting of cond, a, b into (ndim, shape). */
static zs_status broadcast3(zs_tensor *const *t, int *ndim, int64_t *shape)
{
    int n = 0;
    for (int k = 0; k < 3; k++)
        n = t[k]->ndim > n ? t[k]->ndim : n;
    for (int d = 0; d < n; d++) {
        int64_t size = 1;
        for (int k = 0; k < 3; k++) {
            int dk = d - (n - t[k]->ndim);
            int64_t x = dk >= 0 ? t[k]->shape[dk] : 1;
            if (x == 1)
                continue;
            if (size != 1 && size != x) {
                char sc[96], sa[96], sb[96];
                return zs_set_error("where: shapes %s (cond), %s (a) and %s "
                                    "(b) cannot be broadcast (dim %d)",
                                    zs_shape_str(t[0], sc, sizeof sc),
                                    zs_shape_str(t[1], sa, sizeof sa),
                                    zs_shape_str(t[2], sb, sizeof sb), d);
            }
            size = x;
        }
        shape[d] = size;
    }
    *ndim = n;
    return ZS_OK;
}

zs_tensor *zs_where(zs_tensor *cond, zs_tensor *a, zs_tensor *b)
{
    if (!cond || !a || !b)
        return NULL;
    double t0 = zsi_op_begin(&OP_WHERE);
    if (check_u8("where", "condition", cond) != ZS_OK)
        return NULL;
    if (a->dtype != b->dtype) {
        zs_set_error("where: dtypes %s (a) and %s (b) differ, expected equal",
                     zs_dtype_name(a->dtype), zs_dtype_name(b->dtype));
        return NULL;
    }
    if (cond->device != ZS_CPU || a->device != ZS_CPU || b->device != ZS_CPU) {
        zs_set_error("where: tensors are not on the CPU");
        return NULL;
    }
    int ndim = 0;
    int64_t shape[ZS_MAX_DIMS], sc[ZS_MAX_DIMS], sa[ZS_MAX_DIMS], sb[ZS_MAX_DIMS];
    if (broadcast3((zs_tensor *[]){cond, a, b}, &ndim, shape) != ZS_OK)
        return NULL;
    zs_tensor *out = zsi_new_tensor(a->dtype, ndim, shape);
    if (!out)
        return NULL;
    zsk_broadcast_strides(cond->ndim, cond->shape, cond->strides, ndim, shape, sc);
    zsk_broadcast_strides(a->ndim, a->shape, a->strides, ndim, shape, sa);
    zsk_broadcast_strides(b->ndim, b->shape, b->strides, ndim, shape, sb);
    zsk_iter it;
    zsk_iter_init(&it, ndim, shape, 4, (const int64_t *[]){NULL, sc, sa, sb});
    zsk_where(zs_dtype_size(a->dtype), &it, zs_data(out), zs_data(cond),
              zs_data(a), zs_data(b));
    zsi_ctx *n;
    if (zsi_record(&OP_WHERE, out, 2, (zs_tensor *[]){a, b}, &n) != ZS_OK) {
        zs_release(out);
        return NULL;
    }
    zsi_save(n, 0, cond);
    zsi_op_end(&OP_WHERE, t0, 0,
               zsi_bytes(cond) + zsi_bytes(a) + zsi_bytes(b), zsi_bytes(out));
    return out;
}

zs_tensor *zs_masked_fill(zs_tensor *a, zs_tensor *mask, double value)
{
    if (!a || !mask)
        return NULL;
    double t0 = zsi_op_begin(&OP_MASKED_FILL);
    int ndim;
    int64_t shape[ZS_MAX_DIMS];
    if (check_u8("masked_fill", "mask", mask) != ZS_OK ||
        zsi_broadcast_shape("masked_fill", mask, a, &ndim, shape) != ZS_OK)
        return NULL;
    bool same = ndim == a->ndim;
    for (int d = 0; same && d < ndim; d++)
        same = shape[d] == a->shape[d];
    if (!same) {
        char sm[96], sa[96];
        zs_set_error("masked_fill: mask %s does not broadcast to the input's "
                     "shape %s", zs_shape_str(mask, sm, sizeof sm),
                     zs_shape_str(a, sa, sizeof sa));
        return NULL;
    }
    if (a->device != ZS_CPU || mask->device != ZS_CPU) {
        zs_set_error("masked_fill: tensors are not on the CPU");
        return NULL;
    }
    uint64_t v = 0; /* value in a's dtype, read as a stride-0 operand */
    zsi_store(a->dtype, &v, 0, value);
    zs_tensor *out = zsi_new_tensor(a->dtype, a->ndim, a->shape);
    if (!out)
        return NULL;
    int64_t sm[ZS_MAX_DIMS], zero[ZS_MAX_DIMS] = {0};
    zsk_broadcast_strides(mask->ndim, mask->shape, mask->strides, a->ndim,
                          a->shape, sm);
    zsk_iter it;
    zsk_iter_init(&it, a->ndim, a->shape, 4,
                  (const int64_t *[]){NULL, sm, zero, a->strides});
    zsk_where(zs_dtype_size(a->dtype), &it, zs_data(out), zs_data(mask), &v,
              zs_data(a));
    zsi_ctx *n;
    if (zsi_record(&OP_MASKED_FILL, out, 1, &a, &n) != ZS_OK) {
        zs_release(out);
        return NULL;
    }
    zsi_save(n, 0, mask);
    zsi_op_end(&OP_MASKED_FILL, t0, 0, zsi_bytes(a) + zsi_bytes(mask),
               zsi_bytes(out));
    return out;
}

/* ---- index_select, gather ---------------------------------------------- */

/* Element offsets, under `strides`, of the row-major coordinates over dims
 * [d0, d1) of `shape`; a new malloc'd array of prod(shape[d0..d1)) entries
 * (*count), or NULL + message. */
static int64_t *coord_offsets(const int64_t *shape, const int64_t *strides,
                              int d0, int d1, int64_t *count)
{
    int64_t n = 1, c[ZS_MAX_DIMS] = {0}, cur = 0;
    for (int d = d0; d < d1; d++)
        n *= shape[d];
    int64_t *off = malloc((size_t)(n > 0 ? n : 1) * sizeof *off);
    if (!off) {
        zs_set_error_code(ZS_ERR_NOMEM, "index: out of memory");
        return NULL;
    }
    for (int64_t i = 0; i < n; i++) {
        off[i] = cur;
        for (int d = d1 - 1; d >= d0; d--) {
            cur += strides[d];
            if (++c[d] < shape[d])
                break;
            cur -= c[d] * strides[d];
            c[d] = 0;
        }
    }
    *count = n;
    return off;
}

/* Index plan over the space (ndim, shape) split around dim d, on a tensor
 * with `strides`. gather: idx has the space's shape (contiguous); else it
 * is 1-D along d. p->ooff and p->koff are malloc'd (free both). */
static zs_status plan_make(int ndim, const int64_t *shape,
                           const int64_t *strides, int d, const int64_t *idx,
                           bool gather, zsk_index_plan *p)
{
    *p = (zsk_index_plan){.L = shape[d], .idx = idx, .sd = strides[d]};
    int64_t *ooff = coord_offsets(shape, strides, 0, d, &p->O);
    int64_t *koff = ooff ? coord_offsets(shape, strides, d + 1, ndim, &p->K)
                         : NULL;
    if (!koff) {
        free(ooff);
        return ZS_ERR_NOMEM;
    }
    p->ooff = ooff;
    p->is_l = gather ? p->K : 1;
    p->is_o = gather ? p->L * p->K : 0;
    p->is_k = gather ? 1 : 0;
    /* Inner offsets in arithmetic progression: pass the stride instead. */
    bool arith = true;
    for (int64_t k = 1; arith && k < p->K; k++)
        arith = koff[k] == k * koff[1];
    if (arith) {
        p->ks = p->K > 1 ? koff[1] : 1;
        free(koff);
    } else {
        p->koff = koff;
    }
    return ZS_OK;
}

static void plan_free(zsk_index_plan *p)
{
    free((void *)p->ooff);
    free((void *)p->koff);
}

/* A contiguous i64 alias or copy of idx, not tracked by any scope. */
static zs_tensor *index_i64(zs_tensor *idx)
{
    zsi_tracking_pause();
    zs_no_grad_push();
    zs_tensor *r = idx->dtype == ZS_I64 ? zs_contiguous(idx)
                                        : zs_to_dtype(idx, ZS_I64);
    zs_no_grad_pop();
    zsi_tracking_resume();
    return r;
}

/* Fails with the first index outside [0, size): its value and position
 * (a flat position for 1-D indices, coordinates otherwise). */
static zs_status check_range(const char *op, const zs_tensor *idx64, int d,
                             int64_t size)
{
    const int64_t *ix = zs_data(idx64);
    int64_t bad = zsk_index_find_bad(ix, zs_numel(idx64), size);
    if (bad < 0)
        return ZS_OK;
    char pos[128];
    if (idx64->ndim <= 1) {
        snprintf(pos, sizeof pos, "%lld", (long long)bad);
    } else {
        int64_t c[ZS_MAX_DIMS], r = bad;
        for (int k = idx64->ndim - 1; k >= 0; k--) {
            c[k] = r % idx64->shape[k];
            r /= idx64->shape[k];
        }
        zsi_shape_fmt(idx64->ndim, c, pos, sizeof pos);
    }
    return zs_set_error("%s: index %lld at position %s is out of range for "
                        "dim %d of size %lld", op, (long long)ix[bad], pos, d,
                        (long long)size);
}

/* The shared forward: out (shape `shape`) = a indexed by idx along d. */
static zs_tensor *index_forward(zsi_op *op, zs_tensor *a, int d,
                                zs_tensor *idx, const int64_t *shape,
                                bool gather)
{
    double t0 = zsi_op_begin(op);
    zs_tensor *ix = index_i64(idx);
    if (!ix || check_range(op->name, ix, d, a->shape[d]) != ZS_OK) {
        zs_release(ix);
        return NULL;
    }
    zs_tensor *out = zsi_new_tensor(a->dtype, a->ndim, shape);
    zsk_index_plan p;
    if (!out || plan_make(a->ndim, shape, a->strides, d, zs_data(ix), gather,
                          &p) != ZS_OK) {
        zs_release(out);
        zs_release(ix);
        return NULL;
    }
    zsk_index_gather(zs_dtype_size(a->dtype), &p, zs_data(out), zs_data(a));
    plan_free(&p);
    zsi_ctx *n;
    if (zsi_record(op, out, 1, &a, &n) != ZS_OK) {
        zs_release(out);
        out = NULL;
    } else if (n) {
        n->p.i[0] = d;
        n->p.i[1] = gather;
        zsi_save(n, 0, ix);
    }
    if (out)
        zsi_op_end(op, t0, 0, zsi_bytes(out) + zsi_bytes(idx), zsi_bytes(out));
    zs_release(ix);
    return out;
}

zs_tensor *zs_index_select(zs_tensor *a, int dim, zs_tensor *idx)
{
    if (!a || !idx)
        return NULL;
    int d = zsi_norm_dim("index_select", dim, a->ndim);
    if (d < 0 || zsi_check_index("index_select", idx) != ZS_OK)
        return NULL;
    if (idx->ndim > 1) {
        char s[96];
        zs_set_error("index_select: index has shape %s, expected 1-D",
                     zs_shape_str(idx, s, sizeof s));
        return NULL;
    }
    int64_t shape[ZS_MAX_DIMS];
    for (int k = 0; k < a->ndim; k++)
        shape[k] = k == d ? zs_numel(idx) : a->shape[k];
    return index_forward(&OP_INDEX_SELECT, a, d, idx, shape, false);
}

zs_tensor *zs_gather(zs_tensor *a, int dim, zs_tensor *idx)
{
    if (!a || !idx)
        return NULL;
    int d = zsi_norm_dim("gather", dim, a->ndim);
    if (d < 0 || zsi_check_index("gather", idx) != ZS_OK)
        return NULL;
    char si[96], sa[96];
    if (idx->ndim != a->ndim) {
        zs_set_error("gather: index %s has %d dims, expected %d as the input "
                     "%s", zs_shape_str(idx, si, sizeof si), idx->ndim,
                     a->ndim, zs_shape_str(a, sa, sizeof sa));
        return NULL;
    }
    for (int k = 0; k < a->ndim; k++) {
        if (k != d && idx->shape[k] > a->shape[k]) {
            zs_set_error("gather: index %s is larger than the input %s in dim "
                         "%d, expected <= off dim %d",
                         zs_shape_str(idx, si, sizeof si),
                         zs_shape_str(a, sa, sizeof sa), k, d);
            return NULL;
        }
    }
    return index_forward(&OP_GATHER, a, d, idx, idx->shape, true);
}

/* ---- backward ---------------------------------------------------------- */

static zs_status where_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin)
{
    zs_tensor *cond = n->saved[0], *zero = zs_scalar(g->dtype, 0);
    if (!zero)
        return ZS_ERR_NOMEM;
    for (int i = 0; i < 2; i++) {
        if (!zsi_needs_grad(n, i))
            continue;
        zs_tensor *t = i == 0 ? zs_where(cond, g, zero) : zs_where(cond, zero, g);
        gin[i] = t ? zsi_sum_to(t, &n->in_meta[i]) : NULL;
        zs_release(t);
        if (!gin[i]) {
            zs_release(zero);
            return ZS_ERR_NOMEM;
        }
    }
    zs_release(zero);
    return ZS_OK;
}

static zs_status masked_fill_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin)
{
    gin[0] = zs_masked_fill(g, n->saved[0], 0.0);
    return gin[0] ? ZS_OK : ZS_ERR_NOMEM;
}

/* Scatter-adds g (the output's shape) into zeros of the input's shape. */
static zs_status index_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin)
{
    const zsi_meta *m = &n->in_meta[0];
    int d = (int)n->p.i[0];
    if (m->dtype != ZS_F32 && m->dtype != ZS_F64)
        return zs_set_error("%s: no gradient for dtype %s", n->op->name,
                            zs_dtype_name(m->dtype));
    zs_tensor *z = zs_zeros(m->dtype, m->ndim, m->shape);
    zs_tensor *gc = z ? zs_contiguous(g) : NULL;
    zsk_index_plan p;
    if (!gc || plan_make(g->ndim, g->shape, z->strides, d,
                         zs_data(n->saved[0]), n->p.i[1], &p) != ZS_OK) {
        zs_release(z);
        zs_release(gc);
        return ZS_ERR_NOMEM;
    }
    zsk_index_scatter_add(m->dtype, &p, zs_data(z), zs_data(gc));
    plan_free(&p);
    zs_release(gc);
    gin[0] = z;
    return ZS_OK;
}
