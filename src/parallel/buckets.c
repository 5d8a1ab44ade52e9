/*
 * buckets.c - the gradient bucket engine shared by data parallelism
 * (dp.c: a non-blocking all-reduce per bucket) and ZeRO (zero.c: pack and
 * reduce-scatter per bucket). Contract in parallel/internal.h.
 *
 * A flat buffer holds the parameters (or their gradients) at element
 * offsets. The engine cuts it into buckets of whole parameters, from its
 * end backwards: backward produces the last layers' gradients first, so
 * bucket 0 (the highest offsets) fills first. Either by size (a bucket is
 * closed once it reaches `limit` elements) or by the caller's units (one
 * bucket per maximal run of parameters of one unit: ZeRO-3's layers).
 *
 * During backward the engine listens to the autograd engine's grad-ready
 * events (zs_grad_ready_hook_add): a ready leaf is found by the offset of
 * its view into the flat buffer, recorded in its bucket's ready list, and
 * the bucket's pending count drops. Buckets are handed to the user's
 * `ready` callback strictly in index order, on every rank alike (the
 * collectives' rule): a bucket that fills early waits for those before
 * it. The engine counts the bytes of final gradients whose bucket has not
 * started (ZeRO's memory report); for data parallelism they are views of
 * the flat buffer and the count is only informative.
 */
#include <stdlib.h>

#include "parallel/internal.h"
#include "zs/autograd.h"

static const int64_t *sort_off; /* qsort context (single-threaded setup) */

static int by_off_desc(const void *a, const void *b)
{
    int64_t x = sort_off[*(const int *)a], y = sort_off[*(const int *)b];
    return x < y ? 1 : x > y ? -1 : 0;
}

/* Fills e->b[*].lo / nparams / group from the parameters' offsets (in
 * descending order idx): by size (group NULL) or by units. */
static zs_status plan(zsi_buckets *e, const char *who, int n, const int64_t *off,
                      const int *idx, int64_t limit, const int *group)
{
    int nb = 0;
    int64_t hi = e->total;
    for (int j = 0; j < n; j++) {
        int64_t o = off[idx[j]];
        if (group) {
            int g = group[idx[j]] < 0 ? -1 : group[idx[j]];
            if (nb == 0 || g != e->b[nb - 1].group) {
                for (int k = 0; g >= 0 && k < nb; k++)
                    if (e->b[k].group == g)
                        return zs_set_error("%s: the parameters of unit %d are not "
                                            "contiguous in the flat buffer", who, g);
                e->b[nb++] = (zsi_bucket){.group = g};
            }
        } else if (nb == 0 || (limit > 0 && hi - e->b[nb - 1].lo >= limit)) {
            if (nb > 0) /* the previous bucket is full: close it at its lowest */
                hi = e->b[nb - 1].lo;
            e->b[nb++] = (zsi_bucket){.group = -1};
        }
        e->b[nb - 1].nparams++;
        e->b[nb - 1].lo = o;
    }
    if (nb == 0) /* no parameters: one empty bucket over everything */
        e->b[nb++] = (zsi_bucket){.group = -1};
    e->b[nb - 1].lo = 0; /* the lowest bucket reaches 0 */
    for (int k = 0; k < nb; k++)
        e->b[k].len = (k ? e->b[k - 1].lo : e->total) - e->b[k].lo;
    e->nb = nb;
    return ZS_OK;
}

/* The view of leaf that locates it in the flat buffer, or NULL. */
static const zs_tensor *locator(const zsi_buckets *e, const zs_tensor *leaf)
{
    return e->by_grad ? leaf->grad : leaf;
}

zsi_buckets *zsi_buckets_new(const char *who, int n, zs_tensor *const *params,
                             const zs_tensor *flat, bool by_grad, int64_t limit,
                             const int *group, const zsi_bucket_ops *ops, void *ctx)
{
    zsi_buckets *e = calloc(1, sizeof *e);
    int64_t *off = malloc((size_t)(n + 1) * sizeof *off);
    int *idx = malloc((size_t)(n + 1) * sizeof *idx);
    if (e) {
        e->b = calloc((size_t)n + 1, sizeof *e->b);
        e->ready = calloc((size_t)n + 1, sizeof *e->ready);
    }
    zs_status st = e && off && idx && e->b && e->ready ? ZS_OK : ZS_ERR_NOMEM;
    if (st == ZS_OK) {
        e->flat = flat;
        e->by_grad = by_grad;
        e->total = zs_numel(flat);
        e->ops = *ops;
        e->ctx = ctx;
    }
    for (int i = 0; st == ZS_OK && i < n; i++) {
        const zs_tensor *v = locator(e, params[i]);
        if (!v || v->storage != flat->storage || !zs_is_contiguous(v))
            st = zs_set_error("%s: parameter %d%s is not a view of the flat %s buffer", who,
                              i, by_grad ? "'s gradient" : "",
                              by_grad ? "gradient" : "parameter");
        else
            off[i] = v->offset - flat->offset;
        idx[i] = i;
    }
    if (st == ZS_OK) {
        sort_off = off;
        qsort(idx, (size_t)n, sizeof *idx, by_off_desc);
        st = plan(e, who, n, off, idx, limit, group);
    }
    int64_t used = 0; /* each bucket's slice of the ready lists */
    for (int k = 0; st == ZS_OK && k < e->nb; k++) {
        e->b[k].ready = e->ready + used;
        used += e->b[k].nparams;
    }
    free(off);
    free(idx);
    if (st == ZS_ERR_NOMEM)
        zs_set_error_code(st, "%s: out of memory", who);
    if (st != ZS_OK) {
        zsi_buckets_free(e);
        return NULL;
    }
    return e;
}

void zsi_buckets_free(zsi_buckets *e)
{
    if (!e)
        return;
    if (e->hook > 0)
        zs_grad_ready_hook_remove(e->hook);
    free(e->b);
    free(e->ready);
    free(e);
}

int zsi_buckets_find(const zsi_buckets *e, int64_t off)
{
    if (off < 0 || off >= e->total)
        return -1;
    int a = 0, b = e->nb - 1; /* first bucket with lo <= off (lo descends) */
    while (a < b) {
        int mid = (a + b) / 2;
        if (off >= e->b[mid].lo)
            b = mid;
        else
            a = mid + 1;
    }
    return off >= e->b[a].lo ? a : -1;
}

/* Hands buckets next, next+1, ... to the user while they are complete
 * (all of them, with force), in index order. */
static void start_ready(zsi_buckets *e, bool force)
{
    while (e->next < e->nb && (force || e->b[e->next].pending == 0)) {
        zsi_bucket *b = &e->b[e->next];
        e->waiting -= b->ready_bytes;
        b->ready_bytes = 0;
        e->ops.ready(e->ctx, e->next++);
        b->nready = 0;
    }
}

static void on_grad_ready(void *ctx, zs_tensor *leaf)
{
    zsi_buckets *e = ctx;
    const zs_tensor *v = locator(e, leaf);
    if (!v || v->storage != e->flat->storage || !leaf->grad)
        return; /* a leaf that is not ours */
    int k = zsi_buckets_find(e, v->offset - e->flat->offset);
    if (k < 0)
        return;
    zsi_bucket *b = &e->b[k];
    if (b->nready < b->nparams)
        b->ready[b->nready++] = leaf;
    b->pending--;
    int64_t bytes = (int64_t)zs_nbytes(leaf->grad);
    b->ready_bytes += bytes;
    e->waiting += bytes;
    if (e->waiting > e->peak)
        e->peak = e->waiting;
    start_ready(e, false);
    if (e->ops.after_event)
        e->ops.after_event(e->ctx);
}

zs_status zsi_buckets_begin(zsi_buckets *e, bool listen)
{
    e->next = 0;
    e->waiting = e->peak = 0;
    for (int k = 0; k < e->nb; k++) {
        e->b[k].pending = e->b[k].nparams;
        e->b[k].nready = 0;
        e->b[k].ready_bytes = 0;
    }
    if (!listen || e->hook > 0)
        return ZS_OK;
    int id = zs_grad_ready_hook_add(on_grad_ready, e);
    if (id < 0)
        return id;
    e->hook = id;
    return ZS_OK;
}

void zsi_buckets_finish(zsi_buckets *e, bool start_rest)
{
    if (e->hook > 0)
        zs_grad_ready_hook_remove(e->hook);
    e->hook = 0;
    if (start_rest)
        start_ready(e, true);
    else
        e->next = e->nb;
}
