/*
 * slices.c - the slice-gradient pass (zs_graph_fuse_slices, zs/graph.h).
 *
 * The backward of k slices of one tensor (GPT's q, k, v: narrow(permute(
 * reshape(qkv)))) is, as a capture records it (eager adds each slice's
 * gradient into the sum so far in place, ops/views.c, which a capture
 * does not offer, autograd/engine.c): k slice_backward nodes, each
 * zero-filling a buffer of the whole tensor's size and copying its
 * gradient into its slot; k - 1 adds summing those buffers; and, when the
 * sliced tensor was a permuted view of a contiguous one, a copy making
 * the sum contiguous in the original layout. GPT small (width 384, batch 8
 * x 256): 113 MB of memory traffic per layer for a 9.4 MB result.
 *
 * The pass finds such a group - slice_backward nodes of one shape, dim
 * and step, their results summed by a chain of adds (same shape, f32,
 * contiguous, no broadcasting) whose every intermediate is read only by
 * the next add, the sum read only by one copy through a permutation view
 * - and replaces it by one node that writes each gradient straight into
 * its slot of the copy's result: 18.9 MB per layer. Bits: at each position
 * the adds computed g + 0 (+ 0) with one nonzero term g, which is g except
 * that -0 becomes +0; the node writes g + 0.0f, the same bits; positions no
 * slice covers get +0, as 0 + 0. bf16 and f16 (the adds computed in f32
 * and rounded): g + 0.0f rounded back, the same bits (bf16 as an integer
 * map); the row loop is the f32 one's (it was a zeroed result and one
 * zsk_axpy per slot, 3.5 ms a layer on GPT small bf16, 2-core Zen 4).
 */
#include <stdlib.h>
#include <string.h>

#include "graph/internal.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/lowp.h"

#define MAXK 8

/* views.c's slice_bw_attrs, mirrored (the pass checks the size). */
typedef struct sbw_attrs {
    int64_t ndim, shape[ZS_MAX_DIMS];
    int64_t dim, start, step;
} sbw_attrs;

typedef struct slot {
    zs_tensor *g;                 /* the gradient (the node's in[i]) */
    int64_t dst[ZS_MAX_DIMS];     /* strides of its slot in the result */
    int64_t off;                  /* offset of the slot in the result */
} slot;

typedef struct gather {
    int k;
    slot s[MAXK];
    bool covered;                 /* the slots cover the whole result */
    zs_tensor *out;               /* borrowed: the node's outs[0] */
    const slot *cur;              /* the slot being written */
} gather;

/* bf16 row: o = g + 0 as the adds computed it (widened, plus 0.0f,
 * rounded back), which is g with -0 as +0 and NaNs quieted: an integer
 * map: 0.93 ms a layer on GPT small bf16 (2-core Zen 4), against 3.3 ms
 * through the bulk conversions, three calls per 64-element row. */
static inline uint16_t bf16_plus0(uint16_t v)
{
    return v == 0x8000u ? 0 : (v & 0x7fffu) > 0x7f80u ? (uint16_t)(v | 0x40u) : v;
}

/* f16 row: g widened, plus 0.0f, rounded back, in pieces (f16 widens to
 * normal f32s); strided operands element by element. */
static void row_f16(const uint16_t *a, int64_t gs, uint16_t *o, int64_t ds, int64_t inner)
{
    float t[512];
    uint16_t u[512];
    for (int64_t j0 = 0; j0 < inner; j0 += 512) {
        int64_t m = inner - j0 < 512 ? inner - j0 : 512;
        if (gs == 1)
            zsk_widen16(ZS_F16, a + j0, t, m);
        else
            for (int64_t j = 0; j < m; j++)
                t[j] = zsk_ld16(ZS_F16, a[(j0 + j) * gs]);
        for (int64_t j = 0; j < m; j++)
            t[j] += 0.0f;
        zsk_narrow16(ZS_F16, t, ds == 1 ? o + j0 : u, m);
        if (ds != 1)
            for (int64_t j = 0; j < m; j++)
                o[(j0 + j) * ds] = u[j];
    }
}

static void row16(zs_dtype dt, const uint16_t *a, int64_t gs, uint16_t *o, int64_t ds,
                  int64_t inner)
{
    if (dt == ZS_F16)
        row_f16(a, gs, o, ds, inner);
    else if (gs == 1 && ds == 1)
        for (int64_t j = 0; j < inner; j++)
            o[j] = bf16_plus0(a[j]);
    else
        for (int64_t j = 0; j < inner; j++)
            o[j * ds] = bf16_plus0(a[j * gs]);
}

/* Rows (all dims but the last) [b, e) of the current slot. */
static void gather_rows(void *ctx, int64_t b, int64_t e)
{
    const gather *G = ctx;
    const slot *s = G->cur;
    const zs_tensor *g = s->g;
    zs_dtype dt = g->dtype;
    size_t es = zs_dtype_size(dt);
    int nd = g->ndim;
    int64_t inner = nd ? g->shape[nd - 1] : 1;
    int64_t gs = nd ? g->strides[nd - 1] : 1, ds = nd ? s->dst[nd - 1] : 1;
    const char *src = (const char *)g->storage->data + (size_t)g->offset * es;
    char *dst = (char *)G->out->storage->data + (size_t)(G->out->offset + s->off) * es;
    /* row b's index by division, then an odometer: a division per
     * dimension and row cost more than a 64-element row's copy */
    int64_t idx[ZS_MAX_DIMS] = {0}, so = 0, dof = 0, q = b;
    for (int d = nd - 2; d >= 0; d--) {
        idx[d] = q % g->shape[d];
        q /= g->shape[d];
        so += idx[d] * g->strides[d];
        dof += idx[d] * s->dst[d];
    }
    for (int64_t r = b; r < e; r++) {
        if (dt != ZS_F32) {
            row16(dt, (const uint16_t *)src + so, gs, (uint16_t *)dst + dof, ds, inner);
        } else {
            const float *a = (const float *)src + so;
            float *o = (float *)dst + dof;
            if (gs == 1 && ds == 1)
                for (int64_t j = 0; j < inner; j++)
                    o[j] = a[j] + 0.0f; /* -0 -> +0, as the adds did */
            else
                for (int64_t j = 0; j < inner; j++)
                    o[j * ds] = a[j * gs] + 0.0f;
        }
        for (int d = nd - 2; d >= 0; d--) {
            so += g->strides[d], dof += s->dst[d];
            if (++idx[d] < g->shape[d])
                break;
            so -= idx[d] * g->strides[d], dof -= idx[d] * s->dst[d];
            idx[d] = 0;
        }
    }
}

static zs_status gather_run(zsi_gnode *n)
{
    gather *G = n->impl;
    if (!G->covered)
        memset(zs_data(G->out), 0, zs_nbytes(G->out));
    for (int i = 0; i < G->k; i++) {
        const zs_tensor *g = G->s[i].g;
        int64_t inner = g->ndim ? g->shape[g->ndim - 1] : 1;
        G->cur = &G->s[i];
        zs_parallel_for(zs_numel(g) / (inner ? inner : 1), 16, gather_rows, G);
    }
    return ZS_OK;
}

/* Reads of each storage over g (inputs and aux results), plus keep. */
static int reads(zsi_sset *r, zs_storage *s)
{
    int *v = zsi_sset_get(r, s, false);
    return *v < 0 ? 0 : *v;
}

static bool count_reads(const zs_graph *g, int nkeep, zs_tensor *const *keep,
                        zsi_sset *r)
{
    if (!zsi_sset_init(r, 4 * g->n + 16))
        return false;
    for (int i = 0; i < g->n; i++) {
        const zsi_gnode *n = g->nodes[i];
        for (int j = 0; j < n->call.nin + ZSI_MAX_AUX; j++) {
            zs_tensor *t = j < n->call.nin ? n->in[j] : n->aux[j - n->call.nin];
            int *v = t ? zsi_sset_get(r, t->storage, true) : NULL;
            if (t && !v)
                return false;
            if (v)
                *v = *v < 0 ? 1 : *v + 1;
        }
    }
    for (int k = 0; k < nkeep; k++) {
        int *v = keep[k] ? zsi_sset_get(r, keep[k]->storage, true) : NULL;
        if (keep[k] && !v)
            return false;
        if (v)
            *v = *v < 0 ? 100 : *v + 100; /* never folded */
    }
    return true;
}

static bool is(const zsi_gnode *n, const zsi_opdef *d)
{
    return !n->run && n->call.def == d;
}

/* The dtypes the gather writes: f32, bf16, f16. */
static bool gather_dtype(zs_dtype dt)
{
    return dt == ZS_F32 || dt == ZS_BF16 || dt == ZS_F16;
}

/* t covers its whole storage, contiguous, of a gather dtype, offset 0, in
 * the CPU's memory (the gather runs CPU code on the bytes). */
static bool whole(const zs_tensor *t)
{
    return t->device == ZS_CPU && gather_dtype(t->dtype) && zsi_whole_storage(t);
}

/* The node in [0, before) whose outs[0] is storage s, or -1. */
static int maker(const zs_graph *g, zs_storage *s, int before)
{
    for (int i = before - 1; i >= 0; i--)
        if (g->nodes[i]->outs[0] && g->nodes[i]->outs[0]->storage == s)
            return i;
    return -1;
}

typedef struct match {
    int nodes[2 * MAXK];          /* slice_backward and add nodes to drop */
    int nn, k;
    int sb[MAXK];                 /* the slice_backward nodes */
} match;

/* Collects the add tree under storage s (made before node `before`) into
 * m: leaves slice_backward nodes, inner adds, each read once. */
static bool collect(const zs_graph *g, zsi_sset *r, zs_storage *s, int before, match *m)
{
    int i = maker(g, s, before);
    if (i < 0 || reads(r, s) != 1 || m->nn == 2 * MAXK)
        return false;
    zsi_gnode *n = g->nodes[i];
    if (!whole(n->outs[0]))
        return false;
    m->nodes[m->nn++] = i;
    if (is(n, &zsi_def_slice_backward)) {
        if (m->k == MAXK || n->in[0]->dtype != n->outs[0]->dtype)
            return false;
        m->sb[m->k++] = i;
        return true;
    }
    if (!is(n, &zsi_def_add) || n->call.nin != 2)
        return false;
    for (int j = 0; j < 2; j++)
        if (!whole(n->in[j]) || n->in[j]->dtype != n->outs[0]->dtype ||
            n->in[j]->ndim != n->outs[0]->ndim ||
            memcmp(n->in[j]->shape, n->outs[0]->shape,
                   (size_t)n->outs[0]->ndim * sizeof(int64_t)) ||
            !collect(g, r, n->in[j]->storage, i, m))
            return false;
    return true;
}

/* Builds the gather for copy node c over the sum `sum` (shape of the
 * slice_backward results); false when the view is not a permutation. */
static bool build(const zs_graph *g, const match *m, zsi_gnode *c, gather *G)
{
    const zs_tensor *v = c->in[0], *o = c->outs[0];
    const zsi_gnode *s0 = g->nodes[m->sb[0]];
    const zs_tensor *sum = s0->outs[0];
    int nd = sum->ndim;
    if (v->offset != 0 || v->ndim != nd || !zs_is_contiguous(o) || o->dtype != sum->dtype ||
        o->device != ZS_CPU)
        return false;
    int64_t dstr[ZS_MAX_DIMS]; /* per dim of sum: its stride in o */
    bool used[ZS_MAX_DIMS] = {0};
    for (int d = 0; d < nd; d++) {
        int hit = -1;
        for (int e = 0; e < nd && hit < 0; e++)
            if (!used[e] && v->shape[e] == sum->shape[d] &&
                (v->strides[e] == sum->strides[d] || sum->shape[d] == 1))
                hit = e;
        if (hit < 0)
            return false;
        used[hit] = true;
        dstr[d] = o->strides[hit];
    }
    const sbw_attrs *a0 = (const sbw_attrs *)s0->attrs;
    int64_t covered = 0;
    for (int i = 0; i < m->k; i++) {
        const sbw_attrs *a = (const sbw_attrs *)g->nodes[m->sb[i]]->attrs;
        if (a->ndim != nd || memcmp(a->shape, sum->shape, (size_t)nd * sizeof(int64_t)) ||
            a->dim != a0->dim || a->step != 1)
            return false;
        for (int j = 0; j < i; j++) { /* disjoint slots */
            const sbw_attrs *b = (const sbw_attrs *)g->nodes[m->sb[j]]->attrs;
            int64_t la = g->nodes[m->sb[i]]->in[0]->shape[a->dim];
            int64_t lb = g->nodes[m->sb[j]]->in[0]->shape[a->dim];
            if (a->start < b->start + lb && b->start < a->start + la)
                return false;
        }
        slot *sl = &G->s[i];
        sl->g = g->nodes[m->sb[i]]->in[0];
        memcpy(sl->dst, dstr, sizeof dstr);
        sl->off = a->start * dstr[a->dim];
        covered += zs_numel(sl->g);
    }
    G->k = m->k;
    G->out = c->outs[0];
    G->covered = covered == zs_numel(sum);
    return true;
}

/* No node in (from, to) writes storage st. */
static bool unwritten(const zs_graph *g, zs_storage *st, int from, int to)
{
    for (int i = from + 1; i < to; i++) {
        const zsi_gnode *n = g->nodes[i];
        for (int k = 0; k < ZSI_MAX_OUT; k++)
            if (n->outs[k] && n->outs[k]->storage == st)
                return false;
        for (int k = 0; k < ZSI_MAX_AUX; k++)
            if (n->aux[k] && n->aux[k]->storage == st)
                return false;
    }
    return true;
}

/* Turns copy node c into the gather of m; false (c unchanged) when not
 * possible. */
static bool rewrite(zs_graph *g, const match *m, int ci)
{
    zsi_gnode *c = g->nodes[ci];
    gather *G = calloc(1, sizeof *G);
    zs_tensor **in = calloc((size_t)m->k, sizeof *in);
    bool ok = G && in && build(g, m, c, G);
    for (int i = 0; ok && i < m->k; i++)
        ok = unwritten(g, G->s[i].g->storage, m->sb[i], ci);
    if (!ok) {
        free(G);
        free(in);
        return false;
    }
    double rd = 0;
    for (int i = 0; i < m->k; i++) {
        in[i] = zs_retain(G->s[i].g); /* the graph's own alias */
        G->s[i].g = in[i];
        rd += (double)zs_nbytes(in[i]);
    }
    zs_release(c->in[0]);
    free(c->in);
    c->in = in;
    c->call.in = in;
    c->call.nin = m->k;
    c->run = gather_run;
    c->impl = G;
    c->impl_free = free;
    c->label = "slice_gather";
    c->cost = (zsi_cost){0, rd, (double)zs_nbytes(c->outs[0])};
    return true;
}

int zs_graph_fuse_slices(zs_graph *g, int nkeep, zs_tensor *const *keep)
{
    if (!g || g->capturing || g->plan || (nkeep > 0 && !keep))
        return zs_set_error("graph fuse slices: %s", !g ? "no graph" : g->capturing
                            ? "the graph is still being captured" : g->plan ?
                            "the memory is already planned (run the pass first)"
                            : "keep is NULL");
    if (zsi_def_slice_backward.attr_size != sizeof(sbw_attrs))
        return 0; /* the descriptor's attributes changed: nothing matched */
    zsi_sset r;
    char *drop = calloc((size_t)g->n + 1, 1);
    if (!drop || !count_reads(g, nkeep, keep, &r)) {
        free(drop);
        return zs_set_error_code(ZS_ERR_NOMEM, "graph fuse slices: out of memory");
    }
    int removed = 0;
    for (int i = 0; i < g->n; i++) {
        zsi_gnode *c = g->nodes[i];
        if (!is(c, &zsi_def_copy) || c->call.nin != 1 || !gather_dtype(c->in[0]->dtype) ||
            reads(&r, c->in[0]->storage) != 1)
            continue;
        match m = {.nn = 0};
        if (!collect(g, &r, c->in[0]->storage, i, &m) || m.k < 2 || !rewrite(g, &m, i))
            continue;
        for (int k = 0; k < m.nn; k++)
            drop[m.nodes[k]] = 1;
        removed += m.nn;
    }
    zsi_sset_deinit(&r);
    int o = 0;
    for (int i = 0; i < g->n; i++) {
        if (drop[i])
            zsi_gnode_free(g->nodes[i]);
        else
            g->nodes[o++] = g->nodes[i];
    }
    g->n = o;
    free(drop);
    return removed;
}
