/*
 * recompute.c - activation recomputation (gradient checkpointing):
 * zs_checkpoint and zs_checkpoint_n (contracts in include/zs/autograd.h).
 *
 * Forward: the region fn runs under no-grad, so none of its operators
 * records a node or keeps what its backward would need; the region keeps
 * only detached aliases of its inputs and the global RNG state (seed,
 * offset of core/rng.c) as it was before fn ran. One node ("checkpoint")
 * is recorded on the result, with the region's inputs as its inputs.
 *
 * Backward (the node's rule): the inputs' aliases become fresh leaves
 * (requires_grad where the node's input wants a gradient), the RNG is set
 * back to the saved state (so dropout draws the same masks) and fn runs
 * again with grad mode on, through the same driver and kernels as the
 * first time, so the recomputed values are bit-identical and it runs on
 * any device. A nested zs_backward from the recomputed output with the
 * node's output gradient then fills the leaves' .grad (returned as the
 * node's input gradients) and accumulates into the .grad of every other
 * leaf fn used (parameters reached through ctx). The RNG state of the
 * caller is restored afterwards, and so is the autocast dtype of the
 * forward (backward runs with autocast off).
 *
 * Several outputs (zs_checkpoint_n): the outputs (one dtype and device)
 * are copied into one flat buffer on which the node is recorded, and the
 * caller gets differentiable views of it; the recomputation rebuilds the
 * same buffer with grad on and back-propagates it, so each output gets
 * exactly its gradient.
 *
 * Scopes: fn runs in the caller's scope in the forward and inside a scope
 * of its own in the backward, so a fn that leaves its temporaries to the
 * current scope and one that releases them both work.
 */
#include <stdlib.h>
#include <string.h>

#include "autograd/node.h"
#include "core/internal.h"
#include "zs/autograd.h"
#include "zs/ops.h"

typedef struct region {
    zs_grad_fn fn1;       /* one output, or */
    zs_region_fn fnn;     /* several */
    void *ctx;            /* borrowed: outlives the backward */
    int n, nout;
    zs_tensor **in;       /* [n] detached aliases of the inputs (retained) */
    uint64_t seed, offset; /* global RNG state before fn ran */
    zs_dtype amp;         /* the autocast dtype fn ran under (ZS_F32: off) */
} region;

static zs_status region_bw(zsi_ctx *c, zs_tensor *g, zs_tensor **gin);

static zsi_op checkpoint_op = {.name = "checkpoint", .backward = region_bw};

static void region_free(void *p)
{
    region *r = p;
    if (!r)
        return;
    for (int i = 0; i < r->n; i++)
        zs_release(r->in[i]);
    free(r->in);
    free(r);
}

/* A new header on t's storage, no autograd (tracked by the scope unless
 * tracking is paused). */
static zs_tensor *alias(const zs_tensor *t)
{
    return zsi_new_view(t, t->ndim, t->shape, t->strides, t->offset);
}

/* Runs the region's fn on in: out[0..nout) new references, or a negative
 * status (message set; out all NULL). */
static zs_status run_fn(const region *r, zs_tensor **in, zs_tensor **out)
{
    for (int k = 0; k < r->nout; k++)
        out[k] = NULL;
    if (r->fn1) {
        out[0] = r->fn1(r->ctx, in);
        return out[0] ? ZS_OK : ZS_ERR_ARG;
    }
    zs_status st = r->fnn(r->ctx, in, r->nout, out);
    for (int k = 0; k < r->nout; k++)
        if (st == ZS_OK && !out[k])
            st = zs_set_error("checkpoint: the region returned no output %d", k);
    if (st != ZS_OK)
        for (int k = 0; k < r->nout; k++) {
            zs_release(out[k]);
            out[k] = NULL;
        }
    return st;
}

/* The outputs flattened and concatenated into one 1-d tensor (recorded
 * when grad mode is on); NULL + message when they differ in dtype or
 * device. */
static zs_tensor *bundle(int nout, zs_tensor **out)
{
    zs_tensor *flat[ZSI_MAX_IN] = {0};
    for (int k = 1; k < nout; k++)
        if (out[k]->dtype != out[0]->dtype || out[k]->device != out[0]->device) {
            zs_set_error("checkpoint: output %d is %s on %s, output 0 %s on %s: "
                         "expected one dtype and device", k,
                         zs_dtype_name(out[k]->dtype), zs_device_name(out[k]->device),
                         zs_dtype_name(out[0]->dtype), zs_device_name(out[0]->device));
            return NULL;
        }
    for (int k = 0; k < nout; k++)
        flat[k] = zs_reshape(out[k], 1, (int64_t[]){-1});
    zs_tensor *b = zs_concat(nout, flat, 0);
    for (int k = 0; k < nout; k++)
        zs_release(flat[k]);
    return b;
}

static zs_status check_args(int n, zs_tensor *const *inputs, int nout)
{
    if (n < 0 || n > ZSI_MAX_IN || (n > 0 && !inputs))
        return zs_set_error("checkpoint: %d inputs, expected 0..%d", n, ZSI_MAX_IN);
    if (nout < 1 || nout > ZSI_MAX_IN)
        return zs_set_error("checkpoint: %d outputs, expected 1..%d", nout,
                            ZSI_MAX_IN);
    for (int i = 0; i < n; i++)
        if (!inputs[i])
            return ZS_ERR_ARG; /* the first error is kept */
    return ZS_OK;
}

/* r with aliases of the n inputs and the RNG state now; NULL + message. */
static region *region_new(int n, zs_tensor *const *inputs, int nout)
{
    region *r = calloc(1, sizeof *r);
    if (r && n > 0 && !(r->in = calloc((size_t)n, sizeof *r->in))) {
        free(r);
        r = NULL;
    }
    if (!r) {
        zs_set_error_code(ZS_ERR_NOMEM, "checkpoint: out of memory");
        return NULL;
    }
    r->nout = nout;
    zsi_tracking_pause();
    for (int i = 0; i < n; i++) {
        if (!(r->in[i] = alias(inputs[i]))) {
            zsi_tracking_resume();
            region_free(r);
            return NULL;
        }
        r->n = i + 1;
    }
    zsi_tracking_resume();
    zs_rng_get_state(&r->seed, &r->offset);
    r->amp = zs_autocast_dtype();
    return r;
}

/* Records the node on res (a fresh header, no node) with the region's
 * inputs; on success the node owns r. */
static zs_status record(region *r, zs_tensor *res, int n, zs_tensor *const *inputs)
{
    zsi_ctx *c = NULL;
    zs_status st = zsi_record(&checkpoint_op, res, n, inputs, &c);
    if (st == ZS_OK && c) {
        c->extra = r;
        ((zsi_node *)c)->extra_free = region_free;
    } else {
        region_free(r);
    }
    return st;
}

/* out[k] = output k's shape as a view of the flat res (recorded when grad
 * mode is on); releases res. */
static zs_status split(zs_tensor *res, int nout, const zsi_meta *m, zs_tensor **out)
{
    zs_status st = ZS_OK;
    int64_t off = 0;
    for (int k = 0; k < nout; k++) {
        int64_t len = zsi_shape_numel(m[k].ndim, m[k].shape);
        zs_tensor *s = zs_narrow(res, 0, off, len);
        out[k] = zs_reshape(s, m[k].ndim, m[k].shape);
        zs_release(s);
        off += len;
        if (!out[k])
            st = ZS_ERR_NOMEM;
    }
    zs_release(res);
    for (int k = 0; st != ZS_OK && k < nout; k++) {
        zs_release(out[k]);
        out[k] = NULL;
    }
    return st;
}

/* The forward of both entry points (takes r): fills out[0..nout) with new
 * references or fails with every out[k] NULL. */
static zs_status checkpoint(region *r, int n, zs_tensor *const *inputs,
                            zs_tensor **out)
{
    bool grad = zs_grad_enabled();
    int nout = r->nout;
    zs_tensor *raw[ZSI_MAX_IN] = {0}, *b = NULL;
    zsi_meta m[ZSI_MAX_IN];
    zs_no_grad_push();
    zs_status st = run_fn(r, r->in, raw);
    if (st == ZS_OK && !(b = nout == 1 ? zs_retain(raw[0]) : bundle(nout, raw)))
        st = ZS_ERR_ARG;
    zs_no_grad_pop();
    for (int k = 0; k < nout; k++) {
        if (raw[k]) {
            m[k].ndim = raw[k]->ndim;
            memcpy(m[k].shape, raw[k]->shape, sizeof m[k].shape);
        }
        zs_release(raw[k]);
    }
    /* a fresh header, so a region returning (a view of) an input does not
     * put a node on the input */
    zs_tensor *res = b ? alias(b) : NULL;
    zs_release(b);
    if (!res) {
        region_free(r);
        return st != ZS_OK ? st : ZS_ERR_NOMEM;
    }
    if (grad)
        st = record(r, res, n, inputs);
    else
        region_free(r); /* nothing will be recomputed */
    if (st != ZS_OK) {
        zs_release(res);
        return st;
    }
    if (nout == 1) {
        out[0] = res;
        return ZS_OK;
    }
    return split(res, nout, m, out);
}

/* ---- backward ------------------------------------------------------------ */

/* Grad mode on from inside a backward rule (which runs under no-grad):
 * returns the levels popped, for grad_off. */
static int grad_on(void)
{
    int d = 0;
    while (!zs_grad_enabled()) {
        zs_no_grad_pop();
        d++;
    }
    return d;
}

static void grad_off(int d)
{
    while (d-- > 0)
        zs_no_grad_push();
}

/* Runs fn again with grad on (RNG as in the forward) and back-propagates
 * g into the leaves lv (and the other leaves fn uses). */
static zs_status replay(const region *r, zs_tensor **lv, zs_tensor *g)
{
    zs_tensor *out[ZSI_MAX_IN] = {0};
    uint64_t seed, offset;
    zs_rng_get_state(&seed, &offset);
    zs_rng_set_state(r->seed, r->offset);
    int d = grad_on();
    zsi_tracking_resume();
    zs_scope_push();
    /* backward runs with autocast off: the recomputation runs under the
     * forward's autocast dtype again (as torch.utils.checkpoint restores
     * the autocast state), so it computes the same values */
    bool amp = r->amp != ZS_F32 && zs_autocast_push(r->amp) == ZS_OK;
    zs_status st = run_fn(r, lv, out);
    if (amp)
        zs_autocast_pop();
    zs_tensor *root = st != ZS_OK ? NULL : r->nout == 1 ? zs_retain(out[0])
                                                        : bundle(r->nout, out);
    zs_rng_set_state(seed, offset);
    if (!root) {
        st = st != ZS_OK ? st : ZS_ERR_ARG;
    } else if (!zs_same_shape(root, g) || root->dtype != g->dtype) {
        char a[96], b[96];
        st = zs_set_error("checkpoint: the recomputed output is %s %s, the "
                          "forward's was %s %s: the region must compute the "
                          "same shapes every time", zs_shape_str(root, a, sizeof a),
                          zs_dtype_name(root->dtype), zs_shape_str(g, b, sizeof b),
                          zs_dtype_name(g->dtype));
    } else if (zs_requires_grad(root)) {
        st = zs_backward(root, g, false);
    }
    zs_release(root);
    for (int k = 0; k < r->nout; k++)
        zs_release(out[k]);
    zs_scope_pop();
    zsi_tracking_pause();
    grad_off(d);
    return st;
}

static zs_status region_bw(zsi_ctx *c, zs_tensor *g, zs_tensor **gin)
{
    region *r = c->extra;
    zs_tensor *lv[ZSI_MAX_IN] = {0};
    zs_status st = ZS_OK;
    for (int i = 0; i < r->n && st == ZS_OK; i++) {
        if (!(lv[i] = alias(r->in[i])))
            st = ZS_ERR_NOMEM;
        else if (zsi_needs_grad(c, i))
            lv[i]->requires_grad = true;
    }
    if (st == ZS_OK)
        st = replay(r, lv, g);
    for (int i = 0; i < r->n; i++) {
        if (st == ZS_OK && zsi_needs_grad(c, i) && lv[i]->grad)
            gin[i] = zs_retain(lv[i]->grad);
        zs_release(lv[i]);
    }
    return st;
}

/* ---- entry points --------------------------------------------------------- */

zs_tensor *zs_checkpoint(zs_grad_fn fn, void *ctx, int n, zs_tensor **inputs)
{
    if (!fn) {
        zs_set_error("checkpoint: no function");
        return NULL;
    }
    if (check_args(n, inputs, 1) != ZS_OK)
        return NULL;
    region *r = region_new(n, inputs, 1);
    if (!r)
        return NULL;
    r->fn1 = fn;
    r->ctx = ctx;
    zs_tensor *out = NULL;
    return checkpoint(r, n, inputs, &out) == ZS_OK ? out : NULL;
}

zs_status zs_checkpoint_n(zs_region_fn fn, void *ctx, int n, zs_tensor **inputs,
                          int nout, zs_tensor **outputs)
{
    for (int k = 0; outputs && k < nout; k++)
        outputs[k] = NULL;
    if (!fn || !outputs)
        return zs_set_error("checkpoint: no function or no output array");
    zs_status st = check_args(n, inputs, nout);
    if (st != ZS_OK)
        return st;
    region *r = region_new(n, inputs, nout);
    if (!r)
        return ZS_ERR_NOMEM;
    r->fnn = fn;
    r->ctx = ctx;
    return checkpoint(r, n, inputs, outputs);
}
