/*
 * views.c - differentiable views and copies: reshape/view, permute,
 * transpose, narrow/slice, expand, squeeze/unsqueeze, flatten, contiguous,
 * clone, detach, to_dtype.
 *
 * Views share storage with their input (no copy, O(1)); reshape copies only
 * when the input is not contiguous. Backward rules: reshape back, inverse
 * permutation, scatter into zeros (narrow/slice), sum over broadcast dims
 * (expand), identity (copies), convert back (to_dtype).
 */
#include <stdlib.h>
#include <string.h>

#include "ops/internal.h"

static zs_status reshape_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin);
static zs_status permute_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin);
static zs_status slice_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin);
static zs_status expand_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin);
static zs_status identity_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin);
static zs_status to_dtype_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin);
static zs_status hook_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin);

static zsi_op OP_RESHAPE = {.name = "reshape", .backward = reshape_bw};
static zsi_op OP_PERMUTE = {.name = "permute", .backward = permute_bw};
static zsi_op OP_SLICE = {.name = "slice", .backward = slice_bw};
static zsi_op OP_EXPAND = {.name = "expand", .backward = expand_bw};
static zsi_op OP_COPY = {.name = "copy", .backward = identity_bw};
static zsi_op OP_TO_DTYPE = {.name = "to_dtype", .backward = to_dtype_bw};
static zsi_op OP_HOOK = {.name = "backward_hook", .backward = hook_bw};

/* Wraps up a view or copy: records the node and its cost. */
static zs_tensor *finish(zsi_op *op, double t0, zs_tensor *in, zs_tensor *out,
                         double bytes)
{
    zsi_ctx *n;
    if (zsi_record(op, out, 1, &in, &n) != ZS_OK) {
        zs_release(out);
        return NULL;
    }
    zsi_op_end(op, t0, 0, bytes, bytes);
    return out;
}

static zs_tensor *view_of(zsi_op *op, zs_tensor *t, int ndim,
                          const int64_t *shape, const int64_t *strides,
                          int64_t offset)
{
    double t0 = zsi_op_begin(op);
    zs_tensor *out = zsi_new_view(t, ndim, shape, strides, offset);
    return out ? finish(op, t0, t, out, 0) : NULL;
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

zs_tensor *zs_view(zs_tensor *t, int ndim, const int64_t *shape)
{
    if (!t)
        return NULL;
    int64_t sh[ZS_MAX_DIMS], st[ZS_MAX_DIMS];
    if (infer_shape("view", t, ndim, shape, sh) != ZS_OK)
        return NULL;
    if (!zs_is_contiguous(t)) {
        zs_set_error("view: input is not contiguous; use zs_reshape");
        return NULL;
    }
    zsi_contig_strides(ndim, sh, st);
    return view_of(&OP_RESHAPE, t, ndim, sh, st, t->offset);
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

zs_tensor *zs_permute(zs_tensor *t, const int *perm)
{
    if (!t)
        return NULL;
    int64_t sh[ZS_MAX_DIMS], st[ZS_MAX_DIMS];
    bool seen[ZS_MAX_DIMS] = {0};
    for (int d = 0; d < t->ndim; d++) {
        int p = perm ? perm[d] : -1;
        if (p < 0 || p >= t->ndim || seen[p]) {
            zs_set_error("permute: entry %d of the permutation is %d, "
                         "expected a permutation of 0..%d", d, p, t->ndim - 1);
            return NULL;
        }
        seen[p] = true;
        sh[d] = t->shape[p];
        st[d] = t->strides[p];
    }
    zs_tensor *out = view_of(&OP_PERMUTE, t, t->ndim, sh, st, t->offset);
    if (out && out->node)
        for (int d = 0; d < t->ndim; d++)
            zsi_ctx_of(out)->p.i[d] = perm[d];
    return out;
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

zs_tensor *zs_slice(zs_tensor *t, int dim, int64_t start, int64_t end,
                    int64_t step)
{
    if (!t)
        return NULL;
    int d = zsi_norm_dim("slice", dim, t->ndim);
    if (d < 0)
        return NULL;
    if (step <= 0) {
        zs_set_error("slice: step %lld, expected > 0", (long long)step);
        return NULL;
    }
    int64_t n = t->shape[d];
    if (start < 0)
        start += n;
    if (end < 0)
        end += n;
    start = start < 0 ? 0 : start > n ? n : start;
    end = end < start ? start : end > n ? n : end;
    int64_t sh[ZS_MAX_DIMS], st[ZS_MAX_DIMS];
    memcpy(sh, t->shape, sizeof sh);
    memcpy(st, t->strides, sizeof st);
    sh[d] = (end - start + step - 1) / step;
    st[d] = t->strides[d] * step;
    zs_tensor *out = view_of(&OP_SLICE, t, t->ndim, sh, st,
                             t->offset + start * t->strides[d]);
    if (out && out->node) {
        zsi_ctx_of(out)->p.i[0] = d;
        zsi_ctx_of(out)->p.i[1] = start;
        zsi_ctx_of(out)->p.i[2] = step;
    }
    return out;
}

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

zs_tensor *zs_expand(zs_tensor *t, int ndim, const int64_t *shape)
{
    if (!t)
        return NULL;
    if (ndim < t->ndim || ndim > ZS_MAX_DIMS) {
        zs_set_error("expand: %d dims requested for a %d-d tensor", ndim,
                     t->ndim);
        return NULL;
    }
    int64_t sh[ZS_MAX_DIMS], st[ZS_MAX_DIMS];
    int lead = ndim - t->ndim;
    for (int d = 0; d < ndim; d++) {
        int64_t want = shape[d];
        int64_t have = d < lead ? 1 : t->shape[d - lead];
        if (want == -1)
            want = have;
        if (have != want && have != 1) {
            char a[96], b[96];
            zs_set_error("expand: cannot expand %s to %s (dim %d)",
                         zs_shape_str(t, a, sizeof a),
                         zsi_shape_fmt(ndim, shape, b, sizeof b), d);
            return NULL;
        }
        sh[d] = want;
        st[d] = (d < lead || have != want) ? 0 : t->strides[d - lead];
    }
    return view_of(&OP_EXPAND, t, ndim, sh, st, t->offset);
}

zs_tensor *zs_squeeze(zs_tensor *t, int dim)
{
    if (!t)
        return NULL;
    int d = zsi_norm_dim("squeeze", dim, t->ndim);
    if (d < 0)
        return NULL;
    if (t->shape[d] != 1) {
        zs_set_error("squeeze: dim %d has size %lld, expected 1", dim,
                     (long long)t->shape[d]);
        return NULL;
    }
    int64_t sh[ZS_MAX_DIMS], st[ZS_MAX_DIMS];
    int k = 0;
    for (int i = 0; i < t->ndim; i++) {
        if (i == d)
            continue;
        sh[k] = t->shape[i];
        st[k++] = t->strides[i];
    }
    return view_of(&OP_RESHAPE, t, k, sh, st, t->offset);
}

zs_tensor *zs_unsqueeze(zs_tensor *t, int dim)
{
    if (!t)
        return NULL;
    if (t->ndim >= ZS_MAX_DIMS) {
        zs_set_error("unsqueeze: tensor already has %d dims", ZS_MAX_DIMS);
        return NULL;
    }
    int d = zsi_norm_dim("unsqueeze", dim, t->ndim + 1);
    if (d < 0)
        return NULL;
    int64_t sh[ZS_MAX_DIMS], st[ZS_MAX_DIMS];
    for (int i = 0, k = 0; i <= t->ndim; i++) {
        if (i == d) {
            sh[i] = 1;
            st[i] = d < t->ndim ? t->shape[d] * t->strides[d] : 1;
        } else {
            sh[i] = t->shape[k];
            st[i] = t->strides[k++];
        }
    }
    return view_of(&OP_RESHAPE, t, t->ndim + 1, sh, st, t->offset);
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

static zs_tensor *copy_as(zsi_op *op, zs_tensor *t, zs_dtype dt)
{
    double t0 = zsi_op_begin(op);
    zs_tensor *out = zsi_new_tensor(dt, t->ndim, t->shape);
    if (!out)
        return NULL;
    if (zs_copy_(out, t) != ZS_OK) {
        zs_release(out);
        return NULL;
    }
    return finish(op, t0, t, out, zsi_bytes(t));
}

zs_tensor *zs_contiguous(zs_tensor *t)
{
    if (!t)
        return NULL;
    /* A new header even when no copy is needed, so that the result is
     * owned like any other (by the caller or the open scope). */
    if (zs_is_contiguous(t))
        return view_of(&OP_RESHAPE, t, t->ndim, t->shape, t->strides, t->offset);
    return copy_as(&OP_COPY, t, t->dtype);
}

zs_tensor *zs_clone(zs_tensor *t)
{
    return t ? copy_as(&OP_COPY, t, t->dtype) : NULL;
}

zs_tensor *zs_to_dtype(zs_tensor *t, zs_dtype dt)
{
    if (!t)
        return NULL;
    if ((unsigned)dt >= ZS_DTYPE_COUNT) {
        zs_set_error("to_dtype: unknown dtype %d", (int)dt);
        return NULL;
    }
    if (zs_requires_grad(t) && zs_grad_enabled() && !zs_dtype_is_float(dt)) {
        zs_set_error("to_dtype: a tensor that requires grad cannot become %s",
                     zs_dtype_name(dt));
        return NULL;
    }
    return copy_as(&OP_TO_DTYPE, t, dt);
}

zs_tensor *zs_detach(zs_tensor *t)
{
    if (!t)
        return NULL;
    return zsi_new_view(t, t->ndim, t->shape, t->strides, t->offset);
}

typedef struct hook_extra {
    zs_backward_hook_fn fn;
    void *ctx;
} hook_extra;

zs_tensor *zs_backward_hook(zs_tensor *t, zs_backward_hook_fn fn, void *ctx, int64_t arg)
{
    if (!t)
        return NULL;
    if (!fn) {
        zs_set_error("backward_hook: no function");
        return NULL;
    }
    double t0 = zsi_op_begin(&OP_HOOK);
    zs_tensor *out = zsi_new_view(t, t->ndim, t->shape, t->strides, t->offset);
    zsi_ctx *n = NULL;
    if (!out || zsi_record(&OP_HOOK, out, 1, &t, &n) != ZS_OK) {
        zs_release(out);
        return NULL;
    }
    if (n) {
        hook_extra *h = malloc(sizeof *h);
        if (!h) {
            zs_release(out);
            zs_set_error_code(ZS_ERR_NOMEM, "backward_hook: out of memory");
            return NULL;
        }
        *h = (hook_extra){fn, ctx};
        n->extra = h;
        n->p.i[0] = arg;
    }
    zsi_op_end(&OP_HOOK, t0, 0, 0, 0);
    return out;
}

/* ---- backward -------------------------------------------------------- */

static zs_status reshape_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin)
{
    gin[0] = zs_reshape(g, n->in_meta[0].ndim, n->in_meta[0].shape);
    return gin[0] ? ZS_OK : ZS_ERR_NOMEM;
}

static zs_status permute_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin)
{
    int inv[ZS_MAX_DIMS];
    for (int d = 0; d < g->ndim; d++)
        inv[n->p.i[d]] = d;
    gin[0] = zs_permute(g, inv);
    return gin[0] ? ZS_OK : ZS_ERR_NOMEM;
}

static zs_status slice_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin)
{
    const zsi_meta *m = &n->in_meta[0];
    zs_tensor *z = zs_zeros(g->dtype, m->ndim, m->shape);
    if (!z)
        return ZS_ERR_NOMEM;
    int64_t d = n->p.i[0], start = n->p.i[1], step = n->p.i[2];
    zs_tensor *dst = zs_slice(z, (int)d, start, start + g->shape[d] * step, step);
    zs_status st = dst ? zs_copy_(dst, g) : ZS_ERR_NOMEM;
    zs_release(dst);
    if (st != ZS_OK) {
        zs_release(z);
        return st;
    }
    gin[0] = z;
    return ZS_OK;
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
    const hook_extra *h = n->extra;
    zs_status st = h->fn(h->ctx, n->p.i[0]);
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
