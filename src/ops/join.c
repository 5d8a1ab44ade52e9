/*
 * join.c - concat, stack, split, chunk.
 *
 * concat copies every input into its block of the output: contiguous
 * inputs in one parallel pass (zsk_concat_rows, the output seen as
 * [O, C] rows), others with zs_copy_ into a view of their block. Its node
 * has one input per tensor (any number); backward hands input i the narrow
 * view of the gradient over its block (no copy). stack is unsqueeze +
 * concat. split and chunk return narrow views, differentiable through the
 * slice operator.
 *
 * concat is not a zsi_opdef: it takes any number of inputs and its node
 * one input per tensor, more than a zsi_run call holds (ZSI_MAX_IN), so it
 * keeps its direct path (zsi_op_begin, checks, zsi_record, zsi_op_end) on
 * the CPU. stack, split and chunk are compositions of descriptors.
 */
#include <stdlib.h>

#include "kernels/cpu/select.h"
#include "ops/internal.h"

static zs_status concat_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin);

static zsi_op OP_CONCAT = {.name = "concat", .backward = concat_bw};

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
        if (t->device != ZS_CPU)
            return zs_set_error("concat: input %d is not on the CPU", i);
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
            st = v ? zs_copy_(v, t) : ZS_ERR_NOMEM;
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

zs_tensor *zs_concat(int n, zs_tensor *const *ts, int dim)
{
    double t0 = zsi_op_begin(&OP_CONCAT);
    int d = 0;
    if (check_concat(n, ts, dim, &d) != ZS_OK)
        return NULL;
    int64_t shape[ZS_MAX_DIMS];
    for (int k = 0; k < ts[0]->ndim; k++)
        shape[k] = ts[0]->shape[k];
    shape[d] = 0;
    double bytes = 0;
    for (int i = 0; i < n; i++) {
        shape[d] += ts[i]->shape[d];
        bytes += zsi_bytes(ts[i]);
    }
    zs_tensor *out = zsi_new_tensor(ts[0]->dtype, ts[0]->ndim, shape);
    if (!out)
        return NULL;
    zsi_ctx *node;
    if (concat_fill(n, ts, d, out) != ZS_OK ||
        zsi_record(&OP_CONCAT, out, n, ts, &node) != ZS_OK) {
        zs_release(out);
        return NULL;
    }
    if (node)
        node->p.i[0] = d;
    zsi_op_end(&OP_CONCAT, t0, 0, bytes, zsi_bytes(out));
    return out;
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
    int d = (int)n->p.i[0];
    int64_t start = 0;
    for (int i = 0; i < n->nin; i++) {
        int64_t len = n->in_meta[i].shape[d];
        if (zsi_needs_grad(n, i) && !(gin[i] = zs_narrow(g, d, start, len)))
            return ZS_ERR_NOMEM;
        start += len;
    }
    return ZS_OK;
}
