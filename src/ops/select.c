/*
 * select.c - where, masked_fill, index_select, gather.
 *
 * where and masked_fill are one elementwise pass (zsk_where) over the
 * broadcast shape; their backward routes g through the same condition
 * (zeros elsewhere) and sums it to each input's shape. index_select and
 * gather share one indexed copy over an [O, L, K] index space (select.h):
 * the space is the output's shape split around dim; index_select's index
 * varies along L only, gather's along all three. Their backward rule runs
 * the descriptor "index_select_backward" or "gather_backward", which
 * scatter-adds g into zeros of the input's shape, so repeated indices
 * accumulate. Indices are checked before any access: an index out of range
 * gives an error naming its value and position, never a crash.
 *
 * All four are descriptors run by zsi_run (ops/op.h): cond, mask and idx
 * are inputs of the node (they get no gradient). Attributes: where has
 * none, masked_fill masked_fill_attrs, index_select and gather (and their
 * backward descriptors) index_attrs. The kernels move elements by size, so
 * all four work for every dtype; gradients exist for f32 and f64 (the
 * dtypes that can require grad).
 *
 * Cost models: no FLOPs forward, every input read, the output written; the
 * backward scatter-add 1 FLOP per element of g, g and the indices read,
 * the gradient written.
 */
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/select.h"
#include "kernels/cpu/lowp.h"
#include "ops/internal.h"

static zs_status where_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin);
static zs_status masked_fill_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin);
static zs_status index_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin);

typedef struct masked_fill_attrs {
    double value; /* written where the mask is nonzero */
} masked_fill_attrs;
ZSI_ATTRS(masked_fill_attrs);

/* The attributes of index_select, gather and their backward descriptors. */
typedef struct index_attrs {
    int64_t dim;  /* any sign */
    /* backward descriptors only: the input's shape (the gradient's) */
    int64_t ndim;
    int64_t shape[ZS_MAX_DIMS];
} index_attrs;
ZSI_ATTRS(index_attrs);

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

/* Inputs cond, a, b (the kernel runs by a's dtype); saved 0 cond. */
static zs_status infer_where(zsi_call *c)
{
    const zs_tensor *cond = c->in[0], *a = c->in[1], *b = c->in[2];
    if (check_u8("where", "condition", cond) != ZS_OK)
        return ZS_ERR_ARG;
    if (a->dtype != b->dtype)
        return zs_set_error("where: dtypes %s (a) and %s (b) differ, expected "
                            "equal", zs_dtype_name(a->dtype),
                            zs_dtype_name(b->dtype));
    if (broadcast3(c->in, &c->ndim, c->shape) != ZS_OK)
        return ZS_ERR_ARG;
    c->key = c->dtype = a->dtype;
    return ZS_OK;
}

static zs_status cpu_where(const zsi_call *c, zs_tensor *out)
{
    const zs_tensor *cond = c->in[0], *a = c->in[1], *b = c->in[2];
    int ndim = out->ndim;
    const int64_t *shape = out->shape;
    int64_t sc[ZS_MAX_DIMS], sa[ZS_MAX_DIMS], sb[ZS_MAX_DIMS];
    zsk_broadcast_strides(cond->ndim, cond->shape, cond->strides, ndim, shape, sc);
    zsk_broadcast_strides(a->ndim, a->shape, a->strides, ndim, shape, sa);
    zsk_broadcast_strides(b->ndim, b->shape, b->strides, ndim, shape, sb);
    zsk_iter it;
    zsk_iter_init(&it, ndim, shape, 4, (const int64_t *[]){NULL, sc, sa, sb});
    zsk_where(zs_dtype_size(a->dtype), &it, zs_data(out), zs_data(cond),
              zs_data(a), zs_data(b));
    return ZS_OK;
}

static void save_cond(zsi_ctx *n, const zsi_call *c, zs_tensor *out)
{
    zsi_save(n, 0, c->in[0]);
}

/* no FLOPs; every input read, the output written */
static zsi_cost move_cost(const zsi_call *c, const zs_tensor *out)
{
    zsi_cost k = {0, 0, zsi_bytes(out)};
    for (int i = 0; i < c->nin; i++)
        k.bytes_read += zsi_bytes(c->in[i]);
    return k;
}

#define ALL_DTYPES(fn)                                                        \
    {[ZS_F32] = fn, [ZS_F64] = fn, [ZS_F16] = fn, [ZS_BF16] = fn,             \
     [ZS_F8E4M3] = fn, [ZS_F8E5M2] = fn, [ZS_I8] = fn, [ZS_U8] = fn,          \
     [ZS_I32] = fn, [ZS_I64] = fn}

zsi_opdef zsi_def_where = {
    .op = {.name = "where", .backward = where_bw}, .arity = 3,
    .infer = infer_where, .kernel = {[ZS_CPU] = ALL_DTYPES(cpu_where)},
    .save = save_cond, .cost = move_cost,
    .bw_ops = (zsi_opdef *const[]){&zsi_def_where, &zsi_def_sum, NULL}};

zs_tensor *zs_where(zs_tensor *cond, zs_tensor *a, zs_tensor *b)
{
    return zsi_run(&zsi_def_where, 3, (zs_tensor *[]){cond, a, b}, NULL);
}

/* Inputs a, mask; attributes masked_fill_attrs; saved 0 the mask. */
static zs_status infer_masked_fill(zsi_call *c)
{
    const zs_tensor *a = c->in[0], *mask = c->in[1];
    if (check_u8("masked_fill", "mask", mask) != ZS_OK ||
        zsi_broadcast_shape("masked_fill", mask, a, &c->ndim, c->shape) != ZS_OK)
        return ZS_ERR_ARG;
    bool same = c->ndim == a->ndim;
    for (int d = 0; same && d < c->ndim; d++)
        same = c->shape[d] == a->shape[d];
    if (!same) {
        char sm[96], sa[96];
        return zs_set_error("masked_fill: mask %s does not broadcast to the "
                            "input's shape %s", zs_shape_str(mask, sm, sizeof sm),
                            zs_shape_str(a, sa, sizeof sa));
    }
    c->dtype = a->dtype;
    return ZS_OK;
}

static zs_status cpu_masked_fill(const zsi_call *c, zs_tensor *out)
{
    const masked_fill_attrs *at = c->attrs;
    const zs_tensor *a = c->in[0], *mask = c->in[1];
    uint64_t v = 0; /* value in a's dtype, read as a stride-0 operand */
    zsi_store(a->dtype, &v, 0, at->value);
    int64_t sm[ZS_MAX_DIMS], zero[ZS_MAX_DIMS] = {0};
    zsk_broadcast_strides(mask->ndim, mask->shape, mask->strides, a->ndim,
                          a->shape, sm);
    zsk_iter it;
    zsk_iter_init(&it, a->ndim, a->shape, 4,
                  (const int64_t *[]){NULL, sm, zero, a->strides});
    zsk_where(zs_dtype_size(a->dtype), &it, zs_data(out), zs_data(mask), &v,
              zs_data(a));
    return ZS_OK;
}

static void save_mask(zsi_ctx *n, const zsi_call *c, zs_tensor *out)
{
    zsi_save(n, 0, c->in[1]);
}

zsi_opdef zsi_def_masked_fill = {
    .op = {.name = "masked_fill", .backward = masked_fill_bw}, .arity = 2,
    .infer = infer_masked_fill, .kernel = {[ZS_CPU] = ALL_DTYPES(cpu_masked_fill)},
    .save = save_mask, .cost = move_cost,
    .attr_size = sizeof(masked_fill_attrs),
    .bw_ops = (zsi_opdef *const[]){&zsi_def_masked_fill, NULL}};

zs_tensor *zs_masked_fill(zs_tensor *a, zs_tensor *mask, double value)
{
    masked_fill_attrs at = {.value = value};
    return zsi_run(&zsi_def_masked_fill, 2, (zs_tensor *[]){a, mask}, &at);
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

/* Inputs a, idx; attributes index_attrs (dim); saved 0 the i64 indices
 * (the kernel's aux 0). */

static bool is_gather(const zsi_call *c)
{
    return c->def == &zsi_def_gather || c->def == &zsi_def_gather_backward;
}

static zs_status infer_index_select(zsi_call *c)
{
    const index_attrs *at = c->attrs;
    const zs_tensor *a = c->in[0], *idx = c->in[1];
    int d = zsi_norm_dim("index_select", (int)at->dim, a->ndim);
    if (d < 0 || zsi_check_index("index_select", idx) != ZS_OK)
        return ZS_ERR_ARG;
    if (idx->ndim > 1) {
        char s[96];
        return zs_set_error("index_select: index has shape %s, expected 1-D",
                            zs_shape_str(idx, s, sizeof s));
    }
    c->dtype = a->dtype;
    c->ndim = a->ndim;
    for (int k = 0; k < a->ndim; k++)
        c->shape[k] = k == d ? zs_numel(idx) : a->shape[k];
    return ZS_OK;
}

static zs_status infer_gather(zsi_call *c)
{
    const index_attrs *at = c->attrs;
    const zs_tensor *a = c->in[0], *idx = c->in[1];
    int d = zsi_norm_dim("gather", (int)at->dim, a->ndim);
    if (d < 0 || zsi_check_index("gather", idx) != ZS_OK)
        return ZS_ERR_ARG;
    char si[96], sa[96];
    if (idx->ndim != a->ndim)
        return zs_set_error("gather: index %s has %d dims, expected %d as the "
                            "input %s", zs_shape_str(idx, si, sizeof si),
                            idx->ndim, a->ndim, zs_shape_str(a, sa, sizeof sa));
    for (int k = 0; k < a->ndim; k++)
        if (k != d && idx->shape[k] > a->shape[k])
            return zs_set_error("gather: index %s is larger than the input %s "
                                "in dim %d, expected <= off dim %d",
                                zs_shape_str(idx, si, sizeof si),
                                zs_shape_str(a, sa, sizeof sa), k, d);
    c->dtype = a->dtype;
    c->ndim = idx->ndim;
    memcpy(c->shape, idx->shape, sizeof c->shape);
    return ZS_OK;
}

static int call_dim(const zsi_call *c)
{
    const index_attrs *at = c->attrs;
    return zsi_norm_dim(c->def->op.name, (int)at->dim, c->in[0]->ndim);
}

/* The shared forward: out = a indexed by idx along d. */
static zs_status cpu_index(const zsi_call *c, zs_tensor *out)
{
    zs_tensor *a = c->in[0];
    int d = call_dim(c);
    zs_tensor *ix = zsi_aux_copy(c, 0, c->in[1], index_i64);
    if (!ix)
        return ZS_ERR_NOMEM;
    if (check_range(c->def->op.name, ix, d, a->shape[d]) != ZS_OK)
        return ZS_ERR_ARG;
    zsk_index_plan p;
    if (plan_make(a->ndim, out->shape, a->strides, d, zs_data(ix),
                  is_gather(c), &p) != ZS_OK)
        return ZS_ERR_NOMEM;
    zsk_index_gather(zs_dtype_size(a->dtype), &p, zs_data(out), zs_data(a));
    plan_free(&p);
    return ZS_OK;
}

static void save_index(zsi_ctx *n, const zsi_call *c, zs_tensor *out)
{
    zsi_save(n, 0, c->aux[0]);
}

/* no FLOPs; output-sized rows and the indices read, the output written */
static zsi_cost index_cost(const zsi_call *c, const zs_tensor *out)
{
    return (zsi_cost){0, zsi_bytes(out) + zsi_bytes(c->in[1]), zsi_bytes(out)};
}

/* ---- index_select, gather backward ------------------------------------- */

/* Inputs g (f32 or f64) and idx (the forward's i64 indices, contiguous:
 * 1-D for index_select, g's shape for gather); attributes index_attrs with
 * the input's shape, which must hold g around dim (index_select: equal
 * off dim, idx's length along it; gather: at least g's sizes off dim).
 * The indices must lie in [0, shape[dim]) (the forward checked them). The
 * result has that shape and g's dtype. */
static zs_status infer_index_backward(zsi_call *c)
{
    const index_attrs *at = c->attrs;
    const char *op = c->def->op.name;
    const zs_tensor *g = c->in[0], *idx = c->in[1];
    bool gather = is_gather(c);
    if (zsi_check_float16_dtype(op, g) != ZS_OK)
        return ZS_ERR_ARG;
    int d = zsi_norm_dim(op, (int)at->dim, g->ndim);
    if (d < 0)
        return ZS_ERR_ARG;
    bool ok = idx->dtype == ZS_I64 && at->ndim == g->ndim &&
              (gather ? zs_same_shape(idx, g) : zs_numel(idx) == g->shape[d]);
    for (int k = 0; ok && k < g->ndim; k++)
        ok = k == d ? at->shape[k] >= 0
                    : gather ? g->shape[k] <= at->shape[k] : g->shape[k] == at->shape[k];
    if (!ok) {
        char sg[96], si[96], sa[96];
        return zs_set_error("%s: g %s, idx %s %s, input %s: expected i64 "
                            "indices of the forward and g the forward's "
                            "output for that input", op,
                            zs_shape_str(g, sg, sizeof sg),
                            zs_dtype_name(idx->dtype),
                            zs_shape_str(idx, si, sizeof si),
                            zsi_shape_fmt((int)at->ndim > 0 && at->ndim <= ZS_MAX_DIMS
                                              ? (int)at->ndim : 0,
                                          at->shape, sa, sizeof sa));
    }
    c->dtype = g->dtype;
    c->ndim = g->ndim;
    memcpy(c->shape, at->shape, (size_t)g->ndim * sizeof *c->shape);
    return ZS_OK;
}

/* bf16 / f16: the f32 scatter-add on g widened into a temporary, into an
 * f32 gx rounded once (sums of repeated indices stay in f32). */
static zs_status scatter_add_lp(const zsk_index_plan *p, zs_tensor *gx,
                                const zs_tensor *gc)
{
    int64_t ng = zs_numel(gc), nx = zs_numel(gx);
    float *g32 = zs_alloc((size_t)(ng + nx + 1) * sizeof(float));
    if (!g32)
        return zs_set_error_code(ZS_ERR_NOMEM, "index backward: out of memory");
    float *x32 = g32 + ng;
    zsk_widen16(gc->dtype, zs_data(gc), g32, ng);
    memset(x32, 0, (size_t)nx * sizeof(float));
    zsk_index_scatter_add(ZS_F32, p, x32, g32);
    zsk_narrow16(gx->dtype, x32, zs_data(gx), nx);
    zs_free(g32);
    return ZS_OK;
}

/* gx = 0, then gx[indexed (o, l, k)] += g[o, l, k]. */
static zs_status cpu_index_backward(const zsi_call *c, zs_tensor *gx)
{
    const index_attrs *at = c->attrs;
    zs_tensor *g = c->in[0], *idx = c->in[1];
    int d = zsi_norm_dim(c->def->op.name, (int)at->dim, g->ndim);
    zsi_tracking_pause();
    zs_no_grad_push();
    zs_tensor *gc = zs_contiguous(g), *ic = zs_contiguous(idx);
    zs_no_grad_pop();
    zsi_tracking_resume();
    zsk_index_plan p;
    zs_status st = ZS_ERR_NOMEM;
    if (gc && ic &&
        plan_make(g->ndim, g->shape, gx->strides, d, zs_data(ic), is_gather(c),
                  &p) == ZS_OK) {
        if (zsk_is_lowp16(gx->dtype)) {
            st = scatter_add_lp(&p, gx, gc);
        } else {
            memset(zs_data(gx), 0, zs_nbytes(gx));
            zsk_index_scatter_add(gx->dtype, &p, zs_data(gx), zs_data(gc));
            st = ZS_OK;
        }
        plan_free(&p);
    }
    zs_release(gc);
    zs_release(ic);
    return st;
}

/* 1 FLOP per element of g; g and the indices read, gx written */
static zsi_cost index_backward_cost(const zsi_call *c, const zs_tensor *gx)
{
    return (zsi_cost){(double)zs_numel(c->in[0]),
                      zsi_bytes(c->in[0]) + zsi_bytes(c->in[1]), zsi_bytes(gx)};
}

zsi_opdef zsi_def_index_select_backward = {
    .op = {.name = "index_select_backward"}, .arity = 2,
    .infer = infer_index_backward,
    .kernel = {[ZS_CPU] = {[ZS_F32] = cpu_index_backward,
                           [ZS_F64] = cpu_index_backward,
                           [ZS_BF16] = cpu_index_backward,
                           [ZS_F16] = cpu_index_backward}},
    .cost = index_backward_cost, .attr_size = sizeof(index_attrs)};

zsi_opdef zsi_def_gather_backward = {
    .op = {.name = "gather_backward"}, .arity = 2,
    .infer = infer_index_backward,
    .kernel = {[ZS_CPU] = {[ZS_F32] = cpu_index_backward,
                           [ZS_F64] = cpu_index_backward,
                           [ZS_BF16] = cpu_index_backward,
                           [ZS_F16] = cpu_index_backward}},
    .cost = index_backward_cost, .attr_size = sizeof(index_attrs)};

zsi_opdef zsi_def_index_select = {
    .op = {.name = "index_select", .backward = index_bw}, .arity = 2,
    .infer = infer_index_select, .kernel = {[ZS_CPU] = ALL_DTYPES(cpu_index)},
    .save = save_index, .cost = index_cost, .attr_size = sizeof(index_attrs),
    .bw_ops = (zsi_opdef *const[]){&zsi_def_index_select_backward, NULL}};

zsi_opdef zsi_def_gather = {
    .op = {.name = "gather", .backward = index_bw}, .arity = 2,
    .infer = infer_gather, .kernel = {[ZS_CPU] = ALL_DTYPES(cpu_index)},
    .save = save_index, .cost = index_cost, .attr_size = sizeof(index_attrs),
    .bw_ops = (zsi_opdef *const[]){&zsi_def_gather_backward, NULL}};

zs_tensor *zs_index_select(zs_tensor *a, int dim, zs_tensor *idx)
{
    index_attrs at = {.dim = dim};
    return zsi_run(&zsi_def_index_select, 2, (zs_tensor *[]){a, idx}, &at);
}

zs_tensor *zs_gather(zs_tensor *a, int dim, zs_tensor *idx)
{
    index_attrs at = {.dim = dim};
    return zsi_run(&zsi_def_gather, 2, (zs_tensor *[]){a, idx}, &at);
}

/* ---- backward ---------------------------------------------------------- */

static zs_status where_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin)
{
    zs_tensor *cond = n->saved[0];
    zs_tensor *zero = zs_zeros_on(g->device, g->dtype, 0, NULL); /* g's device */
    if (!zero)
        return ZS_ERR_NOMEM;
    for (int i = 1; i < 3; i++) { /* inputs a, b (0 is cond) */
        if (!zsi_needs_grad(n, i))
            continue;
        zs_tensor *t = i == 1 ? zs_where(cond, g, zero) : zs_where(cond, zero, g);
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

/* Scatter-adds g (the output's shape) into zeros of the input's shape, by
 * the backward descriptor of n's operator. */
static zs_status index_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin)
{
    const zsi_meta *m = &n->in_meta[0];
    if (m->dtype != ZS_F32 && m->dtype != ZS_F64 && !zsk_is_lowp16(m->dtype))
        return zs_set_error("%s: no gradient for dtype %s", n->op->name,
                            zs_dtype_name(m->dtype));
    index_attrs at = *(const index_attrs *)zsi_node_attrs(n);
    at.ndim = m->ndim;
    memcpy(at.shape, m->shape, sizeof at.shape);
    zsi_opdef *def = n->op == &zsi_def_gather.op ? &zsi_def_gather_backward
                                                 : &zsi_def_index_select_backward;
    gin[0] = zsi_run(def, 2, (zs_tensor *[]){g, n->saved[0]}, &at);
    return gin[0] ? ZS_OK : ZS_ERR_NOMEM;
}
