/*
 * casts.c - per-use weight casts (zs_graph_split_casts, zs/graph.h).
 *
 * Mixed precision converts the flat f32 weights into a low-precision
 * copy once per step (train/precision.c: one copy_ of the whole flat
 * buffer into fp_low, a graph input kept across steps), and every matrix
 * product of the step, forward and backward, reads its weight there: on
 * GPT small bf16 that buffer is 23.5 MiB held through the whole step,
 * beside the activations, at the step's peak. The graph knows every
 * reader, so the pass gives each reader its own conversion of just the
 * range it reads, right before it, into a fresh buffer the memory plan
 * places: a weight is alive from its cast to its reader, and the flat
 * copy and its conversion node go.
 *
 * Same bits: each cast is zsi_copy_host over contiguous 1-d ranges, the
 * routine the flat copy_ ran (contiguous flat copies: the same rounding,
 * nearest even), of f32 values no node between the flat copy and the
 * reader writes. A reader sees a view of its cast's buffer with its
 * original shape and strides (the cast covers the view's whole extent).
 * A reader's aux results over the low buffer (a layer norm's saved
 * weight, a view of its input) move with its input. Cost: a weight the
 * forward and the backward both read is converted twice.
 *
 * The pass applies to a graph whose low buffer is written once, by a
 * plain copy_ from a contiguous f32 buffer of the same length, before
 * every reader, and read only by plain driver calls (no pass-made node)
 * with non-negative strides; otherwise it changes nothing.
 */
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "graph/internal.h"

static bool touches(const zsi_gnode *n, const zs_storage *s)
{
    for (int j = 0; j < n->call.nin; j++)
        if (n->in[j]->storage == s)
            return true;
    for (int k = 0; k < ZSI_MAX_OUT; k++)
        if (n->outs[k] && n->outs[k]->storage == s)
            return true;
    for (int k = 0; k < ZSI_MAX_AUX; k++)
        if (n->aux[k] && n->aux[k]->storage == s)
            return true;
    return false;
}

/* The flat cast: a plain copy_ of a contiguous f32 buffer into a whole
 * contiguous buffer of another float dtype and the same length, both in
 * the CPU's memory (the casts run CPU code). */
static bool is_flat_cast(const zsi_gnode *n)
{
    if (n->run || n->call.def != &zsi_def_copy_ || n->call.nin != 2)
        return false;
    const zs_tensor *d = n->in[0], *s = n->in[1];
    return d->dtype != ZS_F32 && zs_dtype_is_float(d->dtype) && s->dtype == ZS_F32 &&
           d->device == ZS_CPU && s->device == ZS_CPU && zsi_whole_storage(d) &&
           zsi_whole_storage(s) && zs_numel(d) == zs_numel(s);
}

/* Elements [lo, hi) of its storage that view t spans; false for a
 * negative stride. */
static bool extent(const zs_tensor *t, int64_t *lo, int64_t *hi)
{
    int64_t e = 1;
    for (int d = 0; d < t->ndim; d++) {
        if (t->shape[d] == 0) {
            e = 0;
            break;
        }
        if (t->strides[d] < 0)
            return false;
        e += (t->shape[d] - 1) * t->strides[d];
    }
    *lo = t->offset;
    *hi = t->offset + e;
    return true;
}

/* Whether node r can have its reads of low moved: a plain driver call,
 * every view of low among its inputs with non-negative strides, every
 * aux result over low inside one of those inputs' extents, low not
 * written. */
static bool movable(const zsi_gnode *r, const zs_storage *low)
{
    if (r->run || zsi_gnode_writes(r, low))
        return false;
    for (int j = 0; j < r->call.nin; j++) {
        int64_t lo, hi;
        if (r->in[j]->storage == low && !extent(r->in[j], &lo, &hi))
            return false;
    }
    for (int k = 0; k < ZSI_MAX_AUX; k++) {
        const zs_tensor *a = r->aux[k];
        int64_t alo, ahi;
        bool inside = false;
        if (!a || a->storage != low)
            continue;
        if (!extent(a, &alo, &ahi))
            return false;
        for (int j = 0; j < r->call.nin && !inside; j++) {
            int64_t lo, hi;
            inside = r->in[j]->storage == low && extent(r->in[j], &lo, &hi) &&
                     lo <= alo && ahi <= hi;
        }
        if (!inside)
            return false;
    }
    return true;
}

static zs_status cast_run(zsi_gnode *n)
{
    return zsi_copy_host(n->outs[0], n->in[0]);
}

/* A cast node: f32 elements [lo, hi) of src's storage into a fresh
 * buffer of dt (no bytes until the plan gives them). */
static zsi_gnode *cast_node(zs_graph *g, const zs_tensor *src, zs_dtype dt, int64_t lo,
                            int64_t hi)
{
    zsi_gnode *k = calloc(1, sizeof *k);
    if (k)
        k->in = calloc(1, sizeof *k->in);
    if (!k || !k->in) {
        free(k);
        return NULL;
    }
    int64_t n = hi - lo, one = 1;
    k->in[0] = zsi_new_view(src, 1, &n, &one, lo);
    k->outs[0] = zsi_new_tensor_on(ZS_CPU, dt, 1, &n);
    if (!k->in[0] || !k->outs[0]) {
        zsi_gnode_free(k);
        return NULL;
    }
    zs_storage *s = k->outs[0]->storage;
    zsi_device_free(s->device, s->data);
    s->data = NULL;
    g->dropped++;
    k->call.def = &zsi_def_copy;
    k->call.nin = 1;
    k->call.nout = 1;
    k->call.in = k->in;
    k->call.attrs = k->attrs;
    k->call.aux = k->aux;
    k->call.outs = k->outs;
    k->call.device = ZS_CPU;
    k->run = cast_run;
    k->label = "cast";
    k->cost = (zsi_cost){0, 4.0 * (double)n, (double)(n * (int64_t)zs_dtype_size(dt))};
    return k;
}

/* A view of t's elements on buf, whose element 0 is t's storage's lo. */
static zs_tensor *moved(const zs_tensor *t, const zs_tensor *buf, int64_t lo)
{
    return zsi_new_view(buf, t->ndim, t->shape, t->strides, t->offset - lo);
}

/* Gives node p (a reader of low) a cast per input over low, moving its
 * inputs and aux results there; the casts go before it. Returns the
 * casts inserted, or -1 (out of memory: the graph is failed). */
static int split_reader(zs_graph *g, int p, const zs_tensor *low, const zs_tensor *src)
{
    zsi_gnode *r = g->nodes[p];
    int added = 0;
    for (int j = 0; j < r->call.nin; j++) {
        zs_tensor *t = r->in[j];
        int64_t lo, hi;
        if (t->storage != low->storage || !extent(t, &lo, &hi))
            continue;
        zsi_gnode *k = cast_node(g, src, low->dtype, lo, hi);
        zs_tensor *v = k ? moved(t, k->outs[0], lo) : NULL;
        bool ok = v != NULL;
        for (int a = 0; ok && a < ZSI_MAX_AUX; a++) {
            zs_tensor *x = r->aux[a];
            int64_t alo, ahi;
            if (!x || x->storage != low->storage || !extent(x, &alo, &ahi) || alo < lo ||
                ahi > hi)
                continue;
            zs_tensor *w = moved(x, k->outs[0], lo);
            ok = w != NULL;
            if (ok) {
                zs_release(x);
                r->aux[a] = w;
            }
        }
        if (!ok || !zsi_graph_insert(g, p + added, k)) {
            zs_release(v);
            zsi_gnode_free(k);
            g->failed = true; /* a reader half moved */
            return -1;
        }
        zs_release(t);
        r->in[j] = v;
        added++;
    }
    return added;
}

int zs_graph_split_casts(zs_graph *g, const zs_tensor *only, int nkeep,
                         zs_tensor *const *keep)
{
    if (!g || g->capturing || g->plan || g->failed || (nkeep > 0 && !keep))
        return zs_set_error("graph split casts: %s", !g ? "no graph" : g->capturing
                            ? "the graph is still being captured" : g->plan ?
                            "the memory is already planned (run the pass first)"
                            : g->failed ? "the capture failed" : "keep is NULL");
    int c = 0;
    while (c < g->n && !(is_flat_cast(g->nodes[c]) &&
                         (!only || g->nodes[c]->in[0]->storage == only->storage)))
        c++;
    if (c == g->n)
        return 0;
    zsi_gnode *C = g->nodes[c];
    const zs_storage *low = C->in[0]->storage, *src = C->in[1]->storage;
    for (int k = 0; k < nkeep; k++)
        if (keep[k] && keep[k]->storage == low)
            return 0;
    bool src_written = false;
    for (int i = c + 1; i < g->n; i++) {
        const zsi_gnode *n = g->nodes[i];
        /* read only after the flat cast, before the f32 values change,
         * by nodes whose reads can move */
        if (touches(n, low) && (src_written || !movable(n, low)))
            return 0;
        src_written = src_written || zsi_gnode_writes(n, src);
    }
    for (int i = 0; i < c; i++)
        if (touches(g->nodes[i], low))
            return 0;
    zsi_tracking_pause();
    zs_tensor *lowt = zs_retain(C->in[0]), *srct = zs_retain(C->in[1]);
    int added = 0;
    for (int i = c + 1; i < g->n && added >= 0; i++) {
        if (!touches(g->nodes[i], low))
            continue;
        int a = split_reader(g, i, lowt, srct);
        added = a < 0 ? -1 : added + a;
        i += a > 0 ? a : 0; /* past the casts, to the reader */
    }
    if (added >= 0) { /* nothing reads the low buffer now: its conversion goes */
        memmove(g->nodes + c, g->nodes + c + 1, (size_t)(g->n - c - 1) * sizeof *g->nodes);
        g->n--;
        zsi_gnode_free(C);
    }
    zs_release(lowt);
    zs_release(srct);
    zsi_tracking_resume();
    return added >= 0 ? added
                      : zs_set_error_code(ZS_ERR_NOMEM, "graph split casts: out of memory");
}
