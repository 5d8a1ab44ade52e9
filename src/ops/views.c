/*
 * views.c - differentiable views and copies: reshape/view, permute,
 * transpose, narrow/slice, expand, squeeze/unsqueeze, flatten, contiguous,
 * clone, detach, to_dtype, backward_hook.
 *
 * Every operator is a descriptor run by zsi_run (ops/op.h). The views
 * (class ZSI_VIEW: view, squeeze, unsqueeze, permute, slice, expand,
 * backward_hook) share storage with their input (no copy, O(1)): infer
 * checks the request and gives the shape, the view function makes the
 * header with its strides and offset, and the cost is zero. transpose,
 * narrow, flatten and reshape are compositions of those; reshape copies
 * (copy, then view) only when the input is not contiguous. The copies
 * (copy, to_dtype) are kernels registered for every dtype on the CPU,
 * counted as the input's bytes read and written.
 *
 * Attributes are typed structs holding values (shapes and orders as
 * int64_t[ZS_MAX_DIMS], the hook's function and context), so a node's
 * copy replays the call.
 *
 * Backward rules, driver calls only: reshape back, inverse permutation,
 * scatter into zeros (slice: the descriptor slice_backward; or, offered
 * the input's gradient summed so far, an axpy_ into its slot), sum over
 * broadcast dims (expand), identity (copies), convert back (to_dtype), the
 * hook then identity (backward_hook).
 */
#include <string.h>

#include "kernels/cpu/kernels.h"
#include "ops/internal.h"
#include "ops/attrs.h"

static zs_status reshape_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin);
static zs_status permute_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin);
static zs_status slice_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin);
static zs_status expand_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin);
static zs_status identity_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin);
static zs_status to_dtype_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin);
static zs_status hook_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin);

/* The copies' kernels run for every dtype. */
#define ALL_DTYPES(fn)                                                        \
    {[ZS_F32] = fn, [ZS_F64] = fn, [ZS_F16] = fn, [ZS_BF16] = fn,             \
     [ZS_F8E4M3] = fn, [ZS_F8E5M2] = fn, [ZS_I8] = fn, [ZS_U8] = fn,          \
     [ZS_I32] = fn, [ZS_I64] = fn}

/* Views cost nothing (no element is read or written). */
static zsi_cost no_cost(const zsi_call *c, const zs_tensor *out)
{
    return (zsi_cost){0, 0, 0};
}

static void set_like(zsi_call *c, int ndim, const int64_t *shape)
{
    c->dtype = c->in[0]->dtype;
    c->ndim = ndim;
    memcpy(c->shape, shape, (size_t)ndim * sizeof *shape);
}

/* Resolves one -1 and checks the element count. */
static zs_status infer_shape(const char *op, const zs_tensor *t, int ndim,
                             const int64_t *shape, int64_t *out)
{
    if (ndim < 0 || ndim > ZS_MAX_DIMS || (ndim > 0 && !shape))
        return zs_set_error("%s: %d dims requested, expected 0..%d", op, ndim,
                            ZS_MAX_DIMS);
    int infer = -1;
    int64_t known = 1;
    for (int d = 0; d < ndim; d++) {
        out[d] = shape[d];
        if (shape[d] == -1) {
            if (infer >= 0)
                return zs_set_error("%s: more than one -1 in the shape", op);
            infer = d;
        } else if (shape[d] < 0) {
            return zs_set_error("%s: size %lld in dim %d, expected >= 0 or -1",
                                op, (long long)shape[d], d);
        } else {
            known *= shape[d];
        }
    }
    int64_t numel = zs_numel(t);
    if (infer >= 0) {
        if (known == 0 || numel % known != 0)
            goto bad;
        out[infer] = numel / known;
        known = numel;
    }
    if (known == numel)
        return ZS_OK;
bad:;
    char a[96], b[96];
    return zs_set_error("%s: cannot reshape %s (%lld elements) to %s", op,
                        zs_shape_str(t, a, sizeof a), (long long)numel,
                        zsi_shape_fmt(ndim, shape, b, sizeof b));
}

/* ---- view (reshape of a contiguous tensor) ------------------------------ */

/* reshape/view and expand: the requested shape, by value. */
typedef struct shape_attrs {
    int64_t ndim;
    int64_t shape[ZS_MAX_DIMS]; /* view: one -1 allowed; expand: -1 keeps */
    int64_t keep_strides;       /* view: 1 keeps the input's strides (the
                                 * same shape: zs_contiguous's alias) */
} shape_attrs;
ZSI_ATTRS(shape_attrs);

/* Fills a's shape from (ndim, shape); fails (message names op) when ndim
 * is out of range or the shape NULL with ndim > 0. */
static zs_status shape_attrs_set(const char *op, shape_attrs *a, int ndim,
                                 const int64_t *shape)
{
    if (ndim < 0 || ndim > ZS_MAX_DIMS || (ndim > 0 && !shape))
        return zs_set_error("%s: %d dims requested, expected 0..%d", op, ndim,
                            ZS_MAX_DIMS);
    a->ndim = ndim;
    if (ndim > 0)
        memcpy(a->shape, shape, (size_t)ndim * sizeof *shape);
    return ZS_OK;
}

static zs_status infer_view(zsi_call *c)
{
    const zs_tensor *t = c->in[0];
    const shape_attrs *a = c->attrs;
    int ndim = (int)a->ndim;
    if (infer_shape("view", t, ndim, a->shape, c->shape) != ZS_OK)
        return ZS_ERR_ARG;
    if (!zs_is_contiguous(t))
        return zs_set_error("view: input is not contiguous; use zs_reshape");
    c->dtype = t->dtype;
    c->ndim = ndim;
    return ZS_OK;
}

static zs_tensor *view_view(const zsi_call *c)
{
    zs_tensor *t = c->in[0];
    int64_t st[ZS_MAX_DIMS];
    if (((const shape_attrs *)c->attrs)->keep_strides)
        memcpy(st, t->strides, sizeof st);
    else
        zsi_contig_strides(c->ndim, c->shape, st);
    return zsi_new_view(t, c->ndim, c->shape, st, t->offset);
}

zsi_opdef zsi_def_view = {
    .op = {.name = "reshape", .backward = reshape_bw}, .arity = 1,
    .cls = ZSI_VIEW, .infer = infer_view, .view = view_view, .cost = no_cost,
    .attr_size = sizeof(shape_attrs), .bw_ops = (zsi_opdef *const[]){
        &zsi_def_view, &zsi_def_copy, NULL}};

zs_tensor *zs_view(zs_tensor *t, int ndim, const int64_t *shape)
{
    shape_attrs at = {0};
    if (t && shape_attrs_set("view", &at, ndim, shape) != ZS_OK)
        return NULL;
    return zsi_run(&zsi_def_view, 1, &t, &at);
}

zs_tensor *zs_reshape(zs_tensor *t, int ndim, const int64_t *shape)
{
    if (!t)
        return NULL;
    int64_t sh[ZS_MAX_DIMS];
    if (infer_shape("reshape", t, ndim, shape, sh) != ZS_OK)
        return NULL;
    if (zs_is_contiguous(t))
        return zs_view(t, ndim, sh);
    zs_tensor *c = zs_contiguous(t);
    zs_tensor *r = c ? zs_view(c, ndim, sh) : NULL;
    zs_release(c);
    return r;
}

/* ---- permute, transpose ------------------------------------------------- */

/* The order, by value: dim d of the result is dim order[d] of the input
 * (entries past the input's dims unused; -1 where the caller gave none). */
typedef struct permute_attrs {
    int64_t order[ZS_MAX_DIMS];
} permute_attrs;
ZSI_ATTRS(permute_attrs);

static zs_status infer_permute(zsi_call *c)
{
    const zs_tensor *t = c->in[0];
    const int64_t *perm = ((const permute_attrs *)c->attrs)->order;
    bool seen[ZS_MAX_DIMS] = {0};
    for (int d = 0; d < t->ndim; d++) {
        int p = (int)perm[d];
        if (p < 0 || p >= t->ndim || seen[p])
            return zs_set_error("permute: entry %d of the permutation is %d, "
                                "expected a permutation of 0..%d", d, p,
                                t->ndim - 1);
        seen[p] = true;
        c->shape[d] = t->shape[p];
    }
    c->dtype = t->dtype;
    c->ndim = t->ndim;
    return ZS_OK;
}

static zs_tensor *view_permute(const zsi_call *c)
{
    zs_tensor *t = c->in[0];
    const int64_t *perm = ((const permute_attrs *)c->attrs)->order;
    int64_t st[ZS_MAX_DIMS];
    for (int d = 0; d < t->ndim; d++)
        st[d] = t->strides[perm[d]];
    return zsi_new_view(t, c->ndim, c->shape, st, t->offset);
}

zsi_opdef zsi_def_permute = {
    .op = {.name = "permute", .backward = permute_bw}, .arity = 1,
    .cls = ZSI_VIEW, .infer = infer_permute, .view = view_permute,
    .cost = no_cost, .attr_size = sizeof(permute_attrs),
    .bw_ops = (zsi_opdef *const[]){&zsi_def_permute, NULL}};

zs_tensor *zs_permute(zs_tensor *t, const int *perm)
{
    permute_attrs at;
    for (int d = 0; d < ZS_MAX_DIMS; d++)
        at.order[d] = t && perm && d < t->ndim ? perm[d] : -1;
    return zsi_run(&zsi_def_permute, 1, &t, &at);
}

zs_tensor *zs_transpose(zs_tensor *t, int d0, int d1)
{
    if (!t)
        return NULL;
    int a = zsi_norm_dim("transpose", d0, t->ndim);
    int b = a < 0 ? -1 : zsi_norm_dim("transpose", d1, t->ndim);
    if (b < 0)
        return NULL;
    int perm[ZS_MAX_DIMS];
    for (int d = 0; d < t->ndim; d++)
        perm[d] = d;
    perm[a] = b;
    perm[b] = a;
    return zs_permute(t, perm);
}

/* ---- slice, narrow ------------------------------------------------------ */

/* start and end may be negative (from the end); both are clamped to the
 * dim. Node: p.i[8] the normalised dim, p.i[9] the clamped start. */
typedef struct slice_attrs {
    int64_t dim, start, end, step;
} slice_attrs;
ZSI_ATTRS(slice_attrs);
#define P_SLICE 8

/* The normalised dim *d and clamped [*start, *end) of c's slice. */
static zs_status slice_range(const zsi_call *c, int *d, int64_t *start,
                             int64_t *end)
{
    const zs_tensor *t = c->in[0];
    const slice_attrs *a = c->attrs;
    if ((*d = zsi_norm_dim("slice", (int)a->dim, t->ndim)) < 0)
        return ZS_ERR_ARG;
    int64_t s = a->start, e = a->end, step = a->step;
    if (step <= 0)
        return zs_set_error("slice: step %lld, expected > 0", (long long)step);
    int64_t n = t->shape[*d];
    if (s < 0)
        s += n;
    if (e < 0)
        e += n;
    s = s < 0 ? 0 : s > n ? n : s;
    e = e < s ? s : e > n ? n : e;
    *start = s;
    *end = e;
    return ZS_OK;
}

static zs_status infer_slice(zsi_call *c)
{
    int d = 0;
    int64_t start = 0, end = 0, step = ((const slice_attrs *)c->attrs)->step;
    if (slice_range(c, &d, &start, &end) != ZS_OK)
        return ZS_ERR_ARG;
    set_like(c, c->in[0]->ndim, c->in[0]->shape);
    c->shape[d] = (end - start + step - 1) / step;
    return ZS_OK;
}

static zs_tensor *view_slice(const zsi_call *c)
{
    zs_tensor *t = c->in[0];
    int d = 0;
    int64_t start = 0, end = 0, st[ZS_MAX_DIMS];
    slice_range(c, &d, &start, &end);
    memcpy(st, t->strides, sizeof st);
    st[d] = t->strides[d] * ((const slice_attrs *)c->attrs)->step;
    return zsi_new_view(t, c->ndim, c->shape, st, t->offset + start * t->strides[d]);
}

static void save_slice(zsi_ctx *n, const zsi_call *c, zs_tensor *out)
{
    int d = 0;
    int64_t start = 0, end = 0;
    slice_range(c, &d, &start, &end);
    n->p.i[P_SLICE] = d;
    n->p.i[P_SLICE + 1] = start;
}

zsi_opdef zsi_def_slice = {
    .op = {.name = "slice", .backward = slice_bw, .acc_nodes = true}, .arity = 1,
    .cls = ZSI_VIEW, .infer = infer_slice, .view = view_slice,
    .save = save_slice, .cost = no_cost, .attr_size = sizeof(slice_attrs),
    .bw_ops = (zsi_opdef *const[]){&zsi_def_slice_backward, NULL}};

zs_tensor *zs_slice(zs_tensor *t, int dim, int64_t start, int64_t end,
                    int64_t step)
{
    slice_attrs at = {dim, start, end, step};
    return zsi_run(&zsi_def_slice, 1, &t, &at);
}

/* slice_backward: g (the gradient of a slice, any layout) -> gx of the
 * sliced input's shape, zeros except g at the slice's positions. Not
 * differentiable. Cost: g read, gx written (zeros, then g's block). */

static zs_status infer_slice_bw(zsi_call *c)
{
    const zs_tensor *g = c->in[0];
    const slice_bw_attrs *a = c->attrs;
    int d = (int)a->dim;
    bool ok = a->ndim == g->ndim && d >= 0 && d < g->ndim && a->step > 0;
    for (int k = 0; ok && k < g->ndim; k++)
        ok = k == d || g->shape[k] == a->shape[k];
    if (ok) { /* positions start, start + step, ... inside the dim */
        int64_t len = g->shape[d];
        ok = a->start >= 0 && a->start <= a->shape[d] &&
             (len == 0 || a->start + (len - 1) * a->step < a->shape[d]);
    }
    if (!ok) {
        char sg[96], sx[96];
        return zs_set_error("slice_backward: gradient %s does not fit input %s "
                            "sliced in dim %d from %lld by step %lld",
                            zs_shape_str(g, sg, sizeof sg),
                            zsi_shape_fmt((int)a->ndim, a->shape, sx, sizeof sx),
                            d, (long long)a->start, (long long)a->step);
    }
    set_like(c, (int)a->ndim, a->shape);
    return ZS_OK;
}

/* The dtypes zsk_axpy and axpy_ take. */
static bool axpy_dtype(zs_dtype dt)
{
    return dt == ZS_F32 || dt == ZS_F64 || dt == ZS_BF16 || dt == ZS_F16;
}

static zs_status cpu_slice_bw(const zsi_call *c, zs_tensor *out)
{
    const slice_bw_attrs *a = c->attrs;
    const zs_tensor *g = c->in[0];
    int d = (int)a->dim;
    memset(zs_data(out), 0, zs_nbytes(out));
    int64_t str[ZS_MAX_DIMS];
    memcpy(str, out->strides, sizeof str);
    str[d] *= a->step;
    zsi_tracking_pause();
    zs_tensor *dst = zsi_new_view(out, g->ndim, g->shape, str,
                                  out->offset + a->start * out->strides[d]);
    zsi_tracking_resume();
    zs_status st = !dst ? ZS_ERR_NOMEM : ZS_OK;
    if (dst && axpy_dtype(g->dtype)) { /* 0 + g: -0 becomes +0, as summing the
                                      * k slices' gradients does */
        zsk_iter it;
        zsk_iter_init(&it, g->ndim, g->shape, 2, (const int64_t *[]){dst->strides,
                                                                     g->strides});
        zsk_axpy(g->dtype, &it, zs_data(dst), 1.0, zs_data(g));
    } else if (dst) {
        st = zsi_copy_host(dst, g);
    }
    zs_release(dst);
    return st;
}

static zsi_cost slice_bw_cost(const zsi_call *c, const zs_tensor *out)
{
    return (zsi_cost){0, zsi_bytes(c->in[0]), zsi_bytes(out)};
}

zsi_opdef zsi_def_slice_backward = {
    .op = {.name = "slice_backward"}, .arity = 1, .infer = infer_slice_bw,
    .kernel = {[ZS_CPU] = ALL_DTYPES(cpu_slice_bw)}, .cost = slice_bw_cost,
    .attr_size = sizeof(slice_bw_attrs)};

zs_tensor *zs_narrow(zs_tensor *t, int dim, int64_t start, int64_t len)
{
    if (!t)
        return NULL;
    int d = zsi_norm_dim("narrow", dim, t->ndim);
    if (d < 0)
        return NULL;
    if (start < 0 || len < 0 || start + len > t->shape[d]) {
        zs_set_error("narrow: [%lld, %lld) is out of range for dim %d of "
                     "size %lld", (long long)start, (long long)(start + len),
                     dim, (long long)t->shape[d]);
        return NULL;
    }
    return zs_slice(t, d, start, start + len, 1);
}

/* ---- expand ------------------------------------------------------------- */

/* Attributes: shape_attrs (-1 keeps a size). */
static zs_status infer_expand(zsi_call *c)
{
    const zs_tensor *t = c->in[0];
    const shape_attrs *a = c->attrs;
    const int64_t *shape = a->shape;
    int ndim = (int)a->ndim, lead = ndim - t->ndim;
    if (ndim < t->ndim || ndim > ZS_MAX_DIMS)
        return zs_set_error("expand: %d dims requested for a %d-d tensor", ndim,
                            t->ndim);
    for (int d = 0; d < ndim; d++) {
        int64_t want = shape[d];
        int64_t have = d < lead ? 1 : t->shape[d - lead];
        if (want == -1)
            want = have;
        if (have != want && have != 1) {
            char a[96], b[96];
            return zs_set_error("expand: cannot expand %s to %s (dim %d)",
                                zs_shape_str(t, a, sizeof a),
                                zsi_shape_fmt(ndim, shape, b, sizeof b), d);
        }
        c->shape[d] = want;
    }
    c->dtype = t->dtype;
    c->ndim = ndim;
    return ZS_OK;
}

static zs_tensor *view_expand(const zsi_call *c)
{
    zs_tensor *t = c->in[0];
    int64_t st[ZS_MAX_DIMS];
    int lead = c->ndim - t->ndim;
    for (int d = 0; d < c->ndim; d++) {
        int64_t have = d < lead ? 1 : t->shape[d - lead];
        st[d] = (d < lead || have != c->shape[d]) ? 0 : t->strides[d - lead];
    }
    return zsi_new_view(t, c->ndim, c->shape, st, t->offset);
}

zsi_opdef zsi_def_expand = {
    .op = {.name = "expand", .backward = expand_bw}, .arity = 1,
    .cls = ZSI_VIEW, .infer = infer_expand, .view = view_expand,
    .cost = no_cost, .attr_size = sizeof(shape_attrs),
    .bw_ops = (zsi_opdef *const[]){&zsi_def_sum, &zsi_def_view,
                                   &zsi_def_to_dtype, NULL}};

zs_tensor *zs_expand(zs_tensor *t, int ndim, const int64_t *shape)
{
    shape_attrs at = {0};
    if (t && shape_attrs_set("expand", &at, ndim, shape) != ZS_OK)
        return NULL;
    return zsi_run(&zsi_def_expand, 1, &t, &at);
}

/* ---- squeeze, unsqueeze, flatten ---------------------------------------- */

/* squeeze and unsqueeze: the dim (negative: from the end). */
typedef struct dim_attrs {
    int64_t dim;
} dim_attrs;
ZSI_ATTRS(dim_attrs);

static int attr_dim(const zsi_call *c)
{
    return (int)((const dim_attrs *)c->attrs)->dim;
}

static zs_status infer_squeeze(zsi_call *c)
{
    const zs_tensor *t = c->in[0];
    int dim = attr_dim(c), d = zsi_norm_dim("squeeze", dim, t->ndim);
    if (d < 0)
        return ZS_ERR_ARG;
    if (t->shape[d] != 1)
        return zs_set_error("squeeze: dim %d has size %lld, expected 1", dim,
                            (long long)t->shape[d]);
    set_like(c, t->ndim, t->shape);
    memmove(&c->shape[d], &c->shape[d + 1], (size_t)(t->ndim - d - 1) * sizeof *c->shape);
    c->ndim--;
    return ZS_OK;
}

static zs_tensor *view_squeeze(const zsi_call *c)
{
    zs_tensor *t = c->in[0];
    int d = zsi_norm_dim("squeeze", attr_dim(c), t->ndim);
    int64_t st[ZS_MAX_DIMS];
    for (int i = 0, k = 0; i < t->ndim; i++)
        if (i != d)
            st[k++] = t->strides[i];
    return zsi_new_view(t, c->ndim, c->shape, st, t->offset);
}

zsi_opdef zsi_def_squeeze = {
    .op = {.name = "squeeze", .backward = reshape_bw}, .arity = 1,
    .cls = ZSI_VIEW, .infer = infer_squeeze, .view = view_squeeze,
    .cost = no_cost, .attr_size = sizeof(dim_attrs),
    .bw_ops = (zsi_opdef *const[]){&zsi_def_view, &zsi_def_copy, NULL}};

zs_tensor *zs_squeeze(zs_tensor *t, int dim)
{
    dim_attrs at = {dim};
    return zsi_run(&zsi_def_squeeze, 1, &t, &at);
}

static zs_status infer_unsqueeze(zsi_call *c)
{
    const zs_tensor *t = c->in[0];
    if (t->ndim >= ZS_MAX_DIMS)
        return zs_set_error("unsqueeze: tensor already has %d dims", ZS_MAX_DIMS);
    int d = zsi_norm_dim("unsqueeze", attr_dim(c), t->ndim + 1);
    if (d < 0)
        return ZS_ERR_ARG;
    c->dtype = t->dtype;
    c->ndim = t->ndim + 1;
    for (int i = 0, k = 0; i <= t->ndim; i++)
        c->shape[i] = i == d ? 1 : t->shape[k++];
    return ZS_OK;
}

static zs_tensor *view_unsqueeze(const zsi_call *c)
{
    zs_tensor *t = c->in[0];
    int d = zsi_norm_dim("unsqueeze", attr_dim(c), t->ndim + 1);
    int64_t st[ZS_MAX_DIMS];
    for (int i = 0, k = 0; i <= t->ndim; i++)
        st[i] = i != d ? t->strides[k++]
              : d < t->ndim ? t->shape[d] * t->strides[d] : 1;
    return zsi_new_view(t, c->ndim, c->shape, st, t->offset);
}

zsi_opdef zsi_def_unsqueeze = {
    .op = {.name = "unsqueeze", .backward = reshape_bw}, .arity = 1,
    .cls = ZSI_VIEW, .infer = infer_unsqueeze, .view = view_unsqueeze,
    .cost = no_cost, .attr_size = sizeof(dim_attrs),
    .bw_ops = (zsi_opdef *const[]){&zsi_def_view, &zsi_def_copy, NULL}};

zs_tensor *zs_unsqueeze(zs_tensor *t, int dim)
{
    dim_attrs at = {dim};
    return zsi_run(&zsi_def_unsqueeze, 1, &t, &at);
}

zs_tensor *zs_flatten(zs_tensor *t, int start_dim, int end_dim)
{
    if (!t)
        return NULL;
    if (t->ndim == 0)
        return zs_reshape(t, 1, (int64_t[]){1});
    int s = zsi_norm_dim("flatten", start_dim, t->ndim);
    int e = s < 0 ? -1 : zsi_norm_dim("flatten", end_dim, t->ndim);
    if (e < 0)
        return NULL;
    if (e < s) {
        zs_set_error("flatten: start dim %d is after end dim %d", start_dim,
                     end_dim);
        return NULL;
    }
    int64_t sh[ZS_MAX_DIMS];
    int k = 0;
    for (int d = 0; d < s; d++)
        sh[k++] = t->shape[d];
    int64_t m = 1;
    for (int d = s; d <= e; d++)
        m *= t->shape[d];
    sh[k++] = m;
    for (int d = e + 1; d < t->ndim; d++)
        sh[k++] = t->shape[d];
    return zs_reshape(t, k, sh);
}

/* ---- copies -------------------------------------------------------------- */

/* copy and to_dtype: the dtype of the copy (to_dtype; copy has no
 * parameter and is called with none, zeros, which it does not read). */

static zs_status infer_copy(zsi_call *c)
{
    set_like(c, c->in[0]->ndim, c->in[0]->shape);
    return ZS_OK;
}

static zs_status infer_to_dtype(zsi_call *c)
{
    const zs_tensor *t = c->in[0];
    zs_dtype dt = (zs_dtype)((const copy_attrs *)c->attrs)->dtype;
    if ((unsigned)dt >= ZS_DTYPE_COUNT)
        return zs_set_error("to_dtype: unknown dtype %d", (int)dt);
    if (zs_requires_grad(t) && zs_grad_enabled() && !zs_dtype_is_float(dt))
        return zs_set_error("to_dtype: a tensor that requires grad cannot "
                            "become %s", zs_dtype_name(dt));
    set_like(c, t->ndim, t->shape);
    c->dtype = dt;
    return ZS_OK;
}

/* Any layout and dtype into out (conversions round to nearest even). */
static zs_status cpu_copy(const zsi_call *c, zs_tensor *out)
{
    return zsi_copy_host(out, c->in[0]);
}

/* The input's bytes read and written (as counted before descriptors). */
static zsi_cost copy_cost(const zsi_call *c, const zs_tensor *out)
{
    double b = zsi_bytes(c->in[0]);
    return (zsi_cost){0, b, b};
}

zsi_opdef zsi_def_copy = {
    .op = {.name = "copy", .backward = identity_bw}, .arity = 1,
    .infer = infer_copy, .kernel = {[ZS_CPU] = ALL_DTYPES(cpu_copy)},
    .cost = copy_cost, .attr_size = sizeof(copy_attrs),
    .bw_ops = (zsi_opdef *const[]){NULL}};

zsi_opdef zsi_def_to_dtype = {
    .op = {.name = "to_dtype", .backward = to_dtype_bw}, .arity = 1,
    .infer = infer_to_dtype, .kernel = {[ZS_CPU] = ALL_DTYPES(cpu_copy)},
    .cost = copy_cost, .attr_size = sizeof(copy_attrs),
    .bw_ops = (zsi_opdef *const[]){&zsi_def_to_dtype, NULL}};

zs_tensor *zs_contiguous(zs_tensor *t)
{
    if (!t)
        return NULL;
    /* A new header even when no copy is needed, so that the result is
     * owned like any other (by the caller or the open scope). */
    if (zs_is_contiguous(t)) {
        shape_attrs at = {.ndim = t->ndim, .keep_strides = 1};
        memcpy(at.shape, t->shape, sizeof at.shape);
        return zsi_run(&zsi_def_view, 1, &t, &at);
    }
    return zsi_run(&zsi_def_copy, 1, &t, NULL);
}

zs_tensor *zs_clone(zs_tensor *t)
{
    return zsi_run(&zsi_def_copy, 1, &t, NULL);
}

zs_tensor *zs_to_dtype(zs_tensor *t, zs_dtype dt)
{
    copy_attrs at = {dt};
    return zsi_run(&zsi_def_to_dtype, 1, &t, &at);
}

/* Not an operator: no node, no cost. */
zs_tensor *zs_detach(zs_tensor *t)
{
    if (!t)
        return NULL;
    return zsi_new_view(t, t->ndim, t->shape, t->strides, t->offset);
}

/* ---- backward_hook ------------------------------------------------------ */

/* An alias whose backward calls fn(ctx, arg) before passing g on. The
 * attributes hold the function and its context by value (ctx is the
 * caller's, borrowed until the backward has run). */
typedef struct hook_attrs {
    zs_backward_hook_fn fn;
    void *ctx;
    int64_t arg;
} hook_attrs;
ZSI_ATTRS(hook_attrs);

static zs_status infer_hook(zsi_call *c)
{
    const hook_attrs *h = c->attrs;
    if (!h->fn)
        return zs_set_error("backward_hook: no function");
    set_like(c, c->in[0]->ndim, c->in[0]->shape);
    return ZS_OK;
}

static zs_tensor *view_alias(const zsi_call *c)
{
    zs_tensor *t = c->in[0];
    return zsi_new_view(t, t->ndim, t->shape, t->strides, t->offset);
}

zsi_opdef zsi_def_hook = {
    .op = {.name = "backward_hook", .backward = hook_bw}, .arity = 1,
    .cls = ZSI_VIEW, .infer = infer_hook, .view = view_alias, .cost = no_cost,
    .attr_size = sizeof(hook_attrs), .bw_ops = (zsi_opdef *const[]){NULL}};

zs_tensor *zs_backward_hook(zs_tensor *t, zs_backward_hook_fn fn, void *ctx, int64_t arg)
{
    hook_attrs at = {fn, ctx, arg};
    return zsi_run(&zsi_def_hook, 1, &t, &at);
}

/* ---- backward -------------------------------------------------------- */

static zs_status reshape_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin)
{
    gin[0] = zs_reshape(g, n->in_meta[0].ndim, n->in_meta[0].shape);
    return gin[0] ? ZS_OK : ZS_ERR_NOMEM;
}

static zs_status permute_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin)
{
    const permute_attrs *a = zsi_node_attrs(n);
    int inv[ZS_MAX_DIMS];
    for (int d = 0; d < g->ndim; d++)
        inv[a->order[d]] = d;
    gin[0] = zs_permute(g, inv);
    return gin[0] ? ZS_OK : ZS_ERR_NOMEM;
}

/* With the input's gradient summed so far offered (zsi_grad_acc: a slice
 * of a tensor sliced k times, as GPT's q, k and v), g is added into its
 * slot there: no input-sized zeros per slice, no k - 1 adds. The same
 * bits: every slot element is 0 + g (slice_backward's) and each later
 * slice adds its g to the sum so far, as the adds did (the slots do not
 * overlap; where they do, the order of the sum is the engine's). */
static zs_status slice_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin)
{
    const zsi_meta *m = &n->in_meta[0];
    slice_bw_attrs at = {.ndim = m->ndim, .dim = n->p.i[P_SLICE],
                         .start = n->p.i[P_SLICE + 1],
                         .step = ((const slice_attrs *)zsi_node_attrs(n))->step};
    zs_tensor *acc = zsi_grad_acc(n, 0);
    /* the CPU only: the other devices' axpy_ may want contiguous operands
     * (CUDA's does) and the slot is a strided view */
    if (acc && acc->device == ZS_CPU && axpy_dtype(acc->dtype)) {
        int64_t len = g->shape[at.dim];
        zs_tensor *slot = zs_slice(acc, (int)at.dim, at.start,
                                   at.start + (len ? (len - 1) * at.step + 1 : 0), at.step);
        zs_status st = slot ? zs_axpy_(slot, 1.0, g) : ZS_ERR_NOMEM;
        zs_release(slot);
        return st;
    }
    memcpy(at.shape, m->shape, sizeof at.shape);
    gin[0] = zsi_run(&zsi_def_slice_backward, 1, &g, &at);
    return gin[0] ? ZS_OK : ZS_ERR_NOMEM;
}

static zs_status expand_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin)
{
    gin[0] = zsi_sum_to(g, &n->in_meta[0]);
    return gin[0] ? ZS_OK : ZS_ERR_NOMEM;
}

static zs_status identity_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin)
{
    gin[0] = zs_retain(g);
    return ZS_OK;
}

static zs_status hook_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin)
{
    const hook_attrs *h = zsi_node_attrs(n);
    zs_status st = h->fn(h->ctx, h->arg);
    if (st != ZS_OK)
        return st;
    gin[0] = zs_retain(g);
    return ZS_OK;
}

static zs_status to_dtype_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin)
{
    gin[0] = zs_to_dtype(g, n->in_meta[0].dtype);
    return gin[0] ? ZS_OK : ZS_ERR_NOMEM;
}
