/*
 * join.c - concat, stack, split, chunk.
 *
 * concat is the descriptor "concat" (any number of inputs per call, up to
 * ZSI_MAX_IN; attributes { dim }). Its CPU kernel copies every input into
 * its block of the output: contiguous inputs in one parallel pass
 * (zsk_concat_rows, the output seen as [O, C] rows), others with the host
 * copy (zsi_copy_host) into a view of their block. Its node has one input per tensor; backward
 * hands input i the narrow view of the gradient over its block (a slice:
 * no copy). zs_concat of more than ZSI_MAX_IN tensors runs in groups: the
 * concats of groups of at most ZSI_MAX_IN, then the concat of those (one
 * more pass over the data per level; the gradient flows through both).
 * Cost model: no FLOPs; the inputs read, the output written.
 *
 * stack is unsqueeze + concat. split and chunk return narrow views,
 * differentiable through the slice operator.
 */
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/select.h"
#include "ops/internal.h"

static zs_status concat_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin);

typedef struct concat_attrs {
    int64_t dim; /* negative: from the end */
} concat_attrs;
ZSI_ATTRS(concat_attrs);

/* Validates the inputs of concat along dim; *d receives the normalised
 * dim. An input that is NULL fails without a new message. */
static zs_status check_concat(int n, zs_tensor *const *ts, int dim, int *d)
{
    if (n <= 0 || !ts)
        return zs_set_error("concat: %d inputs, expected at least one", n);
    for (int i = 0; i < n; i++)
        if (!ts[i])
            return ZS_ERR_ARG;
    const zs_tensor *t0 = ts[0];
    if (t0->ndim == 0)
        return zs_set_error("concat: input 0 is 0-d; zero-dimensional "
                            "tensors cannot be concatenated");
    if ((*d = zsi_norm_dim("concat", dim, t0->ndim)) < 0)
        return ZS_ERR_ARG;
    for (int i = 0; i < n; i++) {
        const zs_tensor *t = ts[i];
        char sa[96], sb[96];
        if (t->dtype != t0->dtype)
            return zs_set_error("concat: input %d has dtype %s, expected %s "
                                "(as input 0)", i, zs_dtype_name(t->dtype),
                                zs_dtype_name(t0->dtype));
        if (t->ndim != t0->ndim)
            return zs_set_error("concat: input %d has shape %s (%d dims), "
                                "expected %d dims as input 0 %s", i,
                                zs_shape_str(t, sa, sizeof sa), t->ndim,
                                t0->ndim, zs_shape_str(t0, sb, sizeof sb));
        for (int k = 0; k < t->ndim; k++)
            if (k != *d && t->shape[k] != t0->shape[k])
                return zs_set_error("concat: input %d has shape %s, input 0 "
                                    "has %s: sizes differ in dim %d (%lld vs "
                                    "%lld), expected equal except in dim %d",
                                    i, zs_shape_str(t, sa, sizeof sa),
                                    zs_shape_str(t0, sb, sizeof sb), k,
                                    (long long)t->shape[k],
                                    (long long)t0->shape[k], *d);
    }
    return ZS_OK;
}

/* Copies the non-contiguous inputs into their blocks of out. */
static zs_status copy_strided(int n, zs_tensor *const *ts, int d,
                              zs_tensor *out)
{
    zs_status st = ZS_OK;
    int64_t start = 0;
    zsi_tracking_pause();
    for (int i = 0; i < n && st == ZS_OK; i++) {
        const zs_tensor *t = ts[i];
        if (!zs_is_contiguous(t) && zs_numel(t) > 0) {
            zs_tensor *v = zsi_new_view(out, t->ndim, t->shape, out->strides,
                                        out->offset + start * out->strides[d]);
            st = v ? zsi_copy_host(v, t) : ZS_ERR_NOMEM;
            zs_release(v);
        }
        start += t->shape[d];
    }
    zsi_tracking_resume();
    return st;
}

/* Fills out from the inputs (contiguous ones in one parallel pass). */
static zs_status concat_fill(int n, zs_tensor *const *ts, int d,
                             zs_tensor *out)
{
    int64_t O = 1, inner = 1;
    for (int k = 0; k < out->ndim; k++) {
        if (k < d)
            O *= out->shape[k];
        else if (k > d)
            inner *= out->shape[k];
    }
    const void **src = malloc((size_t)n * sizeof *src);
    int64_t *cols = malloc((size_t)n * sizeof *cols);
    if (!src || !cols) {
        free(src);
        free(cols);
        return zs_set_error_code(ZS_ERR_NOMEM, "concat: out of memory");
    }
    for (int i = 0; i < n; i++) {
        src[i] = zs_is_contiguous(ts[i]) ? zs_data(ts[i]) : NULL;
        cols[i] = ts[i]->shape[d] * inner;
    }
    zsk_concat_rows(zs_dtype_size(out->dtype), n, src, cols, O,
                    out->shape[d] * inner, zs_data(out));
    free(src);
    free(cols);
    return copy_strided(n, ts, d, out);
}

static zs_status infer_concat(zsi_call *c)
{
    int d = 0;
    if (check_concat(c->nin, c->in, (int)((const concat_attrs *)c->attrs)->dim,
                     &d) != ZS_OK)
        return ZS_ERR_ARG;
    const zs_tensor *t0 = c->in[0];
    zsi_out_like(c, t0);
    c->shape[d] = 0;
    for (int i = 0; i < c->nin; i++)
        c->shape[d] += c->in[i]->shape[d];
    return ZS_OK;
}

static zs_status cpu_concat(const zsi_call *c, zs_tensor *out)
{
    int d = zsi_norm_dim("concat", (int)((const concat_attrs *)c->attrs)->dim,
                         out->ndim);
    return concat_fill(c->nin, c->in, d, out);
}

/* Copies: every dtype. */
#define ALL_DTYPES(fn)                                                        \
    {[ZS_F32] = fn, [ZS_F64] = fn, [ZS_F16] = fn, [ZS_BF16] = fn,             \
     [ZS_F8E4M3] = fn, [ZS_F8E5M2] = fn, [ZS_I8] = fn, [ZS_U8] = fn,          \
     [ZS_I32] = fn, [ZS_I64] = fn}

zsi_opdef zsi_def_concat = {
    .op = {.name = "concat", .backward = concat_bw}, .infer = infer_concat,
    .kernel = {[ZS_CPU] = ALL_DTYPES(cpu_concat)},
    .attr_size = sizeof(concat_attrs),
    .bw_ops = (zsi_opdef *const[]){&zsi_def_slice, NULL}};

/* More than ZSI_MAX_IN inputs: the concat of the concats of groups of at
 * most ZSI_MAX_IN (recursively, for more than ZSI_MAX_IN groups). */
static zs_tensor *concat_groups(int n, zs_tensor *const *ts, int dim)
{
    int d = 0;
    if (check_concat(n, ts, dim, &d) != ZS_OK) /* messages name input i */
        return NULL;
    int m = (n + ZSI_MAX_IN - 1) / ZSI_MAX_IN;
    zs_tensor **part = calloc((size_t)m, sizeof *part);
    if (!part) {
        zs_set_error_code(ZS_ERR_NOMEM, "concat: out of memory");
        return NULL;
    }
    /* the group results are temporaries of ours (recorded by autograd
     * when grad mode is on, so gradients flow through them) */
    bool ok = true;
    zsi_tracking_pause();
    for (int k = 0; k < m && ok; k++) {
        int i0 = k * ZSI_MAX_IN, len = n - i0 < ZSI_MAX_IN ? n - i0 : ZSI_MAX_IN;
        ok = (part[k] = zs_concat(len, ts + i0, d)) != NULL;
    }
    zsi_tracking_resume();
    zs_tensor *out = ok ? zs_concat(m, part, d) : NULL;
    for (int k = 0; k < m; k++)
        zs_release(part[k]);
    free(part);
    return out;
}

zs_tensor *zs_concat(int n, zs_tensor *const *ts, int dim)
{
    if (n <= 0 || !ts) {
        zs_set_error("concat: %d inputs, expected at least one", n);
        return NULL;
    }
    if (n > ZSI_MAX_IN)
        return concat_groups(n, ts, dim);
    concat_attrs at = {dim};
    return zsi_run(&zsi_def_concat, n, ts, &at);
}

zs_tensor *zs_stack(int n, zs_tensor *const *ts, int dim)
{
    if (n <= 0 || !ts) {
        zs_set_error("stack: %d inputs, expected at least one", n);
        return NULL;
    }
    for (int i = 0; i < n; i++)
        if (!ts[i])
            return NULL;
    const zs_tensor *t0 = ts[0];
    for (int i = 1; i < n; i++) {
        if (!zs_same_shape(ts[i], t0) || ts[i]->dtype != t0->dtype) {
            char sa[96], sb[96];
            zs_set_error("stack: input %d is %s %s, expected %s %s as input 0",
                         i, zs_dtype_name(ts[i]->dtype),
                         zs_shape_str(ts[i], sa, sizeof sa),
                         zs_dtype_name(t0->dtype),
                         zs_shape_str(t0, sb, sizeof sb));
            return NULL;
        }
    }
    if (t0->ndim >= ZS_MAX_DIMS) {
        zs_set_error("stack: inputs have %d dims, the result would exceed %d",
                     t0->ndim, ZS_MAX_DIMS);
        return NULL;
    }
    int d = zsi_norm_dim("stack", dim, t0->ndim + 1);
    zs_tensor **u = d < 0 ? NULL : calloc((size_t)n, sizeof *u);
    if (!u) {
        if (d >= 0)
            zs_set_error_code(ZS_ERR_NOMEM, "stack: out of memory");
        return NULL;
    }
    /* The unsqueezed views are temporaries of ours (recorded by autograd
     * when grad mode is on, so gradients flow through them). */
    zsi_tracking_pause();
    bool ok = true;
    for (int i = 0; i < n && ok; i++)
        ok = (u[i] = zs_unsqueeze(ts[i], d)) != NULL;
    zsi_tracking_resume();
    zs_tensor *out = ok ? zs_concat(n, u, d) : NULL;
    for (int i = 0; i < n; i++)
        zs_release(u[i]);
    free(u);
    return out;
}

zs_status zs_split(zs_tensor *t, int dim, int n, const int64_t *sizes,
                   zs_tensor **out)
{
    if (n < 0 || (n > 0 && (!sizes || !out)))
        return zs_set_error("split: %d pieces, expected n >= 0 with "
                            "non-NULL sizes and out arrays", n);
    for (int i = 0; i < n; i++)
        out[i] = NULL;
    if (!t)
        return ZS_ERR_ARG;
    int d = zsi_norm_dim("split", dim, t->ndim);
    if (d < 0)
        return ZS_ERR_ARG;
    int64_t sum = 0;
    for (int i = 0; i < n; i++) {
        if (sizes[i] < 0)
            return zs_set_error("split: size %lld at position %d, expected "
                                ">= 0", (long long)sizes[i], i);
        sum += sizes[i];
    }
    if (sum != t->shape[d]) {
        char s[96];
        return zs_set_error("split: sizes sum to %lld, expected %lld (dim %d "
                            "of %s)", (long long)sum, (long long)t->shape[d],
                            dim, zs_shape_str(t, s, sizeof s));
    }
    int64_t start = 0;
    for (int i = 0; i < n; i++) {
        out[i] = zs_narrow(t, d, start, sizes[i]);
        if (!out[i]) {
            for (int k = 0; k < i; k++) {
                zs_release(out[k]);
                out[k] = NULL;
            }
            return ZS_ERR_NOMEM;
        }
        start += sizes[i];
    }
    return ZS_OK;
}

int zs_chunk(zs_tensor *t, int n, int dim, zs_tensor **out)
{
    if (n <= 0 || !out)
        return zs_set_error("chunk: %d chunks, expected n > 0 and a non-NULL "
                            "out array", n);
    if (!t)
        return ZS_ERR_ARG;
    int d = zsi_norm_dim("chunk", dim, t->ndim);
    if (d < 0)
        return ZS_ERR_ARG;
    /* torch.chunk: pieces of ceil(size / n); an empty dim gives n empty
     * pieces. */
    int64_t size = t->shape[d], cs = (size + n - 1) / n;
    int pieces = size == 0 ? n : (int)((size + cs - 1) / cs);
    int64_t *sizes = malloc((size_t)pieces * sizeof *sizes);
    if (!sizes)
        return zs_set_error_code(ZS_ERR_NOMEM, "chunk: out of memory");
    for (int i = 0; i < pieces; i++)
        sizes[i] = i < pieces - 1 ? cs : size - cs * (pieces - 1);
    zs_status st = zs_split(t, d, pieces, sizes, out);
    free(sizes);
    return st == ZS_OK ? pieces : st;
}

/* ---- backward ---------------------------------------------------------- */

static zs_status concat_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin)
{
    int d = (int)((const concat_attrs *)zsi_node_attrs(n))->dim;
    if (d < 0)
        d += g->ndim;
    int64_t start = 0;
    for (int i = 0; i < n->nin; i++) {
        int64_t len = n->in_meta[i].shape[d];
        if (zsi_needs_grad(n, i) && !(gin[i] = zs_narrow(g, d, start, len)))
            return ZS_ERR_NOMEM;
        start += len;
    }
    return ZS_OK;
}
