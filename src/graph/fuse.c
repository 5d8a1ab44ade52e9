/*
 * fuse.c - pointwise fusion over a captured graph (zs_graph_fuse,
 * zs/graph.h): chains of ZSI_POINTWISE nodes become one node that runs
 * the chain tile by tile, so the values passed between its members stay
 * in L1 instead of going to memory and back.
 *
 * Which nodes: a pointwise descriptor (ops/op.h, ZSI_POINTWISE), not in
 * place, one result, no aux result, on the CPU, whose inputs all have the
 * result's dtype and element count and are contiguous (a reshape view is
 * fine: the tiles are flat). Scalar operands ride in the attributes
 * (mul_scalar, add_scalar), so they fuse; a broadcast operand (a bias row
 * of a [rows, cols] add) has fewer elements and is not fused (tested as
 * excluded): its node stays as it was.
 *
 * Groups: a candidate joins the group of a member whose result it reads
 * (the same storage, offset and element count), when that keeps the
 * meaning of the graph: the fused node runs where its last member was, so
 * every member is delayed to there. That is allowed only when (1) no node
 * outside the group reads a member's result before that point, and (2) no
 * node outside the group between the group's first member and the new one
 * writes a storage a member reads. A producer read by several members
 * counts once: a group is a small DAG, not only a chain. A member's
 * result read after the group (or kept by the caller) is written to its
 * buffer as before (at most ZSI_MAX_OUT of them); the others, the
 * intermediates, live only in per-thread tile scratch, and their storages
 * lose their memory (data NULL: their values were never read outside).
 *
 * Running (fused_run): the elements [0, N) are cut into tiles of
 * TILE_BYTES per value (8192 f32; the scratch, at most MAX_SLOTS tiles,
 * is on the stack); zs_parallel_for hands whole tiles to the threads,
 * and for each tile every member's own captured kernel runs, in capture
 * order, on 1-D headers over the tile (its inputs' tiles, its result's
 * tile or a scratch slot). A kernel called from a pool task runs
 * serially on that thread (core/thread.c), so the chain's values for one
 * tile stay in that core's cache. The tile size is a trade: each tile
 * costs one kernel call per member (~1 us of iterator setup and dispatch),
 * so 8 KiB tiles (L1-sized) lost to the unfused chain; 32 KiB tiles
 * (the values of a tile in L2) won (measured, graph.c's header). The kernels are the very functions the
 * unfused nodes ran and pointwise kernels compute each element alone
 * (masked vector tails, no position-dependent path), so the fused node's
 * bits equal the chain's, which the tests check.
 *
 * The choice (issue 27: generated C compiled at run time, or a vectorised
 * interpreter over cache-sized tiles): the interpreter. It reuses every
 * (device, dtype) kernel with its ISA dispatch and bf16 path, needs no
 * compiler at run time and keeps bit-exactness by construction; generated
 * C would fuse into one loop (no per-tile call overhead, no scratch
 * round trip through L1) but would have to reproduce each kernel's vector
 * math bit for bit. What it saves here is memory traffic and memory:
 * each intermediate is a write and a read of N values that no longer
 * reach DRAM, and its buffer leaves the arena. Measured effect: see
 * graph.c's header.
 */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "graph/internal.h"

#define TILE_BYTES 32768
#define MAX_SLOTS 4
#define MAX_MEMBERS 16
#define MAX_ARITY 4

/* ---- the fused node ----------------------------------------------------- */

typedef struct fmember {
    zsi_gnode *n;               /* the captured node (owned) */
    int out_slot;               /* scratch slot of its result, -1: its buffer */
    int in_slot[MAX_ARITY];     /* per input: scratch slot, -1: in[i]'s tile */
} fmember;

typedef struct fused {
    int nm, nslots;
    fmember m[MAX_MEMBERS];
    int64_t numel;
    size_t esize;               /* bytes per element (all members' dtype) */
    int64_t tile;               /* elements per tile */
    char label[192];
    _Atomic int failed;         /* a kernel failed (its message is the
                                 * failing thread's) */
} fused;

static void fused_free(void *p)
{
    fused *f = p;
    if (!f)
        return;
    for (int i = 0; i < f->nm; i++)
        zsi_gnode_free(f->m[i].n);
    free(f);
}

/* A header over elements [t0, t0 + len) of contiguous t: flat, not
 * tracked, not counted (it lives on the stack for one kernel call). */
static void tile_of(zs_tensor *d, const zs_tensor *t, int64_t t0, int64_t len)
{
    *d = *t;
    d->refcount = 1;
    d->ndim = 1;
    d->shape[0] = len;
    d->strides[0] = 1;
    d->offset = t->offset + t0;
    d->requires_grad = d->retains_grad = false;
    d->grad = NULL;
    d->node = NULL;
    d->scope = NULL;
}

static void slot_of(zs_tensor *d, zs_storage *s, zs_dtype dt, int64_t len)
{
    memset(d, 0, sizeof *d);
    d->refcount = 1;
    d->dtype = dt;
    d->device = ZS_CPU;
    d->ndim = 1;
    d->shape[0] = len;
    d->strides[0] = 1;
    d->storage = s;
}

typedef struct run_ctx {
    fused *f;
} run_ctx;

/* Tiles [b, e) of f on this thread. */
static void run_tiles(void *ctx, int64_t b, int64_t e)
{
    fused *f = ((run_ctx *)ctx)->f;
    _Alignas(64) unsigned char scratch[MAX_SLOTS * TILE_BYTES];
    zs_storage st[MAX_SLOTS];
    for (int k = 0; k < f->nslots; k++)
        st[k] = (zs_storage){.data = scratch + (size_t)k * TILE_BYTES,
                             .nbytes = TILE_BYTES, .refcount = 1,
                             .device = ZS_CPU, .external = true};
    for (int64_t t = b; t < e && !atomic_load_explicit(&f->failed, memory_order_relaxed);
         t++) {
        int64_t t0 = t * f->tile;
        int64_t len = f->numel - t0 < f->tile ? f->numel - t0 : f->tile;
        for (int i = 0; i < f->nm; i++) {
            const fmember *m = &f->m[i];
            const zsi_gnode *n = m->n;
            zs_tensor in[MAX_ARITY], out, *pin[MAX_ARITY], *pout[1] = {&out};
            for (int j = 0; j < n->call.nin; j++) {
                if (m->in_slot[j] >= 0)
                    slot_of(&in[j], &st[m->in_slot[j]], n->in[j]->dtype, len);
                else
                    tile_of(&in[j], n->in[j], t0, len);
                pin[j] = &in[j];
            }
            if (m->out_slot >= 0)
                slot_of(&out, &st[m->out_slot], n->outs[0]->dtype, len);
            else
                tile_of(&out, n->outs[0], t0, len);
            zsi_call c = n->call;
            c.in = pin;
            c.outs = pout;
            c.nout = 1;
            c.ndim = 1;
            c.shape[0] = len;
            if (n->kernel(&c, &out) != ZS_OK) {
                atomic_store(&f->failed, 1);
                return;
            }
        }
    }
}

static zs_status fused_run(zsi_gnode *n)
{
    fused *f = n->impl;
    run_ctx c = {f};
    int64_t tiles = (f->numel + f->tile - 1) / f->tile;
    /* as the pointwise kernels: the pool from ~32k elements on */
    int64_t grain = 32768 / f->tile > 0 ? 32768 / f->tile : 1;
    atomic_store(&f->failed, 0);
    zs_parallel_for(tiles, grain, run_tiles, &c);
    if (atomic_load(&f->failed))
        return zs_set_error("%s: a member's kernel failed on a tile", f->label);
    return ZS_OK;
}

/* ---- analysis ------------------------------------------------------------ */

/* The tensors node n writes into w (results, aux; in place: in[0]). */
static int writes_of(const zsi_gnode *n, zs_tensor **w)
{
    int m = 0;
    for (int k = 0; k < ZSI_MAX_OUT; k++)
        if (n->outs[k])
            w[m++] = n->outs[k];
    for (int k = 0; k < ZSI_MAX_AUX; k++)
        if (n->aux[k])
            w[m++] = n->aux[k];
    return m;
}

static bool candidate(const zsi_gnode *n)
{
    const zsi_opdef *d = n->call.def;
    if (n->run || !n->kernel || d->cls != ZSI_POINTWISE || d->inplace ||
        n->call.nin > MAX_ARITY || n->call.device != ZS_CPU || !n->outs[0])
        return false;
    for (int k = 1; k < ZSI_MAX_OUT; k++)
        if (n->outs[k])
            return false;
    for (int k = 0; k < ZSI_MAX_AUX; k++)
        if (n->aux[k])
            return false;
    const zs_tensor *o = n->outs[0];
    if (!zs_is_contiguous(o) || o->storage->external)
        return false;
    for (int j = 0; j < n->call.nin; j++) {
        const zs_tensor *x = n->in[j];
        if (x->dtype != o->dtype || zs_numel(x) != zs_numel(o) || !zs_is_contiguous(x))
            return false;
    }
    return zs_dtype_size(o->dtype) <= 8;
}

/* Readers of each storage: node indices in increasing order (a linked
 * list per storage id), g->n for a kept storage. */
typedef struct readers {
    zsi_sset id;      /* storage -> id */
    int *head, *tail; /* per id: first and last entry, -1 */
    int *next, *node; /* per entry */
    int nid, nent, cap_id, cap_ent;
} readers;

static int sid(readers *r, zs_storage *s)
{
    int *v = zsi_sset_get(&r->id, s, true);
    if (!v)
        return -1;
    if (*v < 0) {
        if (r->nid == r->cap_id) {
            int cap = r->cap_id ? 2 * r->cap_id : 256;
            int *h = realloc(r->head, (size_t)cap * sizeof *h);
            if (h)
                r->head = h;
            int *t = realloc(r->tail, (size_t)cap * sizeof *t);
            if (t)
                r->tail = t;
            if (!h || !t)
                return -1;
            r->cap_id = cap;
        }
        *v = r->nid++;
        r->head[*v] = r->tail[*v] = -1;
    }
    return *v;
}

static bool add_reader(readers *r, zs_storage *s, int node)
{
    int i = sid(r, s);
    if (i < 0)
        return false;
    if (r->tail[i] >= 0 && r->node[r->tail[i]] == node)
        return true;
    if (r->nent == r->cap_ent) {
        int cap = r->cap_ent ? 2 * r->cap_ent : 1024;
        int *nx = realloc(r->next, (size_t)cap * sizeof *nx);
        if (nx)
            r->next = nx;
        int *nd = realloc(r->node, (size_t)cap * sizeof *nd);
        if (nd)
            r->node = nd;
        if (!nx || !nd)
            return false;
        r->cap_ent = cap;
    }
    int e = r->nent++;
    r->next[e] = -1;
    r->node[e] = node;
    if (r->tail[i] >= 0)
        r->next[r->tail[i]] = e;
    else
        r->head[i] = e;
    r->tail[i] = e;
    return true;
}

static void readers_free(readers *r)
{
    zsi_sset_deinit(&r->id);
    free(r->head);
    free(r->tail);
    free(r->next);
    free(r->node);
}

static bool readers_build(readers *r, const zs_graph *g, int nkeep,
                          zs_tensor *const *keep)
{
    memset(r, 0, sizeof *r);
    if (!zsi_sset_init(&r->id, 4 * g->n + 16))
        return false;
    for (int i = 0; i < g->n; i++)
        for (int j = 0; j < g->nodes[i]->call.nin; j++)
            if (!add_reader(r, g->nodes[i]->in[j]->storage, i))
                return false;
    for (int k = 0; k < nkeep; k++)
        if (keep[k] && !add_reader(r, keep[k]->storage, g->n))
            return false;
    return true;
}

/* A group being built: node indices in order. */
typedef struct group {
    int idx[MAX_MEMBERS];
    int n;
} group;

static bool in_group(const group *G, int i)
{
    for (int k = 0; k < G->n; k++)
        if (G->idx[k] == i)
            return true;
    return false;
}

/* Readers of node i's result outside G: how many, and whether one comes
 * before `last`. */
static int outside_readers(const zs_graph *g, readers *r, const group *G, int i,
                           int last, bool *early)
{
    int *v = zsi_sset_get(&r->id, g->nodes[i]->outs[0]->storage, false);
    int cnt = 0;
    for (int e = *v >= 0 ? r->head[*v] : -1; e >= 0; e = r->next[e])
        if (!in_group(G, r->node[e])) {
            cnt++;
            *early |= r->node[e] < last;
        }
    return cnt;
}

/* Whether G plus node j (read from a member) still means the same graph,
 * and fits the limits. */
static bool can_join(const zs_graph *g, readers *r, const group *G, int j)
{
    if (G->n >= MAX_MEMBERS)
        return false;
    group H = *G;
    H.idx[H.n++] = j;
    const zsi_gnode *nj = g->nodes[j];
    const zsi_gnode *n0 = g->nodes[G->idx[0]];
    if (nj->outs[0]->dtype != n0->outs[0]->dtype ||
        zs_numel(nj->outs[0]) != zs_numel(n0->outs[0]))
        return false;
    int outs = 0, slots = 0;
    for (int k = 0; k < H.n; k++) {
        bool early = false;
        int o = outside_readers(g, r, &H, H.idx[k], j, &early);
        if (early)
            return false; /* (1): read outside before the group runs */
        if (o > 0 || k == H.n - 1)
            outs++;
        else
            slots++;
    }
    if (outs > ZSI_MAX_OUT || slots > MAX_SLOTS)
        return false;
    for (int k = G->idx[0] + 1; k < j; k++) { /* (2): no write to a member input */
        if (in_group(&H, k))
            continue;
        zs_tensor *w[ZSI_MAX_OUT + ZSI_MAX_AUX];
        int m = writes_of(g->nodes[k], w);
        for (int a = 0; a < m; a++)
            for (int q = 0; q < H.n; q++) {
                const zsi_gnode *mq = g->nodes[H.idx[q]];
                for (int b = 0; b < mq->call.nin; b++)
                    if (mq->in[b]->storage == w[a]->storage)
                        return false;
            }
    }
    return true;
}

/* Node i's input x is member p's result itself (same bytes, same count). */
static bool reads_result(const zs_tensor *x, const zsi_gnode *p)
{
    const zs_tensor *o = p->outs[0];
    return x->storage == o->storage && x->offset == o->offset &&
           zs_numel(x) == zs_numel(o);
}

/* ---- building the fused node -------------------------------------------- */

static zs_tensor *retain(zs_tensor *t) { return zs_retain(t); }

/* Makes the fused node of G (its members taken out of g's list by the
 * caller); NULL on allocation failure. */
static zsi_gnode *build(const zs_graph *g, readers *r, const group *G)
{
    zsi_gnode *fn = calloc(1, sizeof *fn);
    fused *f = calloc(1, sizeof *f);
    int cap_in = 0;
    for (int k = 0; k < G->n; k++)
        cap_in += g->nodes[G->idx[k]]->call.nin;
    zs_tensor **in = calloc((size_t)cap_in + 1, sizeof *in);
    if (!fn || !f || !in) {
        free(fn), free(f), free(in);
        return NULL;
    }
    int last = G->idx[G->n - 1], nin = 0, nout = 0;
    const zsi_gnode *L = g->nodes[last];
    size_t k0 = 0;
    k0 += (size_t)snprintf(f->label, sizeof f->label, "fused(");
    zsi_cost cost = {0, 0, 0};
    for (int k = 0; k < G->n; k++) {
        zsi_gnode *n = g->nodes[G->idx[k]];
        fmember *m = &f->m[f->nm++];
        m->n = n;
        bool early = false;
        bool out = outside_readers(g, r, G, G->idx[k], last, &early) > 0 || k == G->n - 1;
        m->out_slot = out ? -1 : f->nslots++;
        if (out)
            fn->outs[nout++] = retain(n->outs[0]);
        for (int j = 0; j < n->call.nin; j++) {
            m->in_slot[j] = -1;
            for (int q = k - 1; q >= 0; q--)
                if (reads_result(n->in[j], f->m[q].n)) {
                    m->in_slot[j] = f->m[q].out_slot;
                    break;
                }
            bool inside = false;
            for (int q = 0; q < k; q++)
                inside |= reads_result(n->in[j], f->m[q].n);
            bool dup = false;
            for (int q = 0; q < nin; q++)
                dup |= in[q] == n->in[j];
            if (!inside && !dup) {
                in[nin++] = retain(n->in[j]);
                cost.bytes_read += (double)zs_nbytes(n->in[j]);
            }
        }
        cost.flops += n->cost.flops;
        if (out)
            cost.bytes_written += (double)zs_nbytes(n->outs[0]);
        if (k0 < sizeof f->label)
            k0 += (size_t)snprintf(f->label + k0, sizeof f->label - k0, "%s%s",
                                   k ? "+" : "", n->call.def->op.name);
    }
    if (k0 < sizeof f->label)
        snprintf(f->label + k0, sizeof f->label - k0, ")");
    f->numel = zs_numel(L->outs[0]);
    f->esize = zs_dtype_size(L->outs[0]->dtype);
    f->tile = (int64_t)(TILE_BYTES / f->esize);
    fn->call = L->call;
    fn->kernel = NULL;
    fn->in = in;
    memcpy(fn->attrs, L->attrs, sizeof fn->attrs);
    fn->call.in = fn->in;
    fn->call.nin = nin;
    fn->call.attrs = fn->attrs;
    fn->call.aux = fn->aux;
    fn->call.outs = fn->outs;
    fn->call.nout = nout;
    fn->cost = cost;
    fn->run = fused_run;
    fn->impl = f;
    fn->impl_free = fused_free;
    fn->label = f->label;
    return fn;
}

/* The intermediates of a fused node keep no memory: nobody reads them. */
static void drop_intermediates(zsi_gnode *fn)
{
    fused *f = fn->impl;
    for (int i = 0; i < f->nm; i++) {
        if (f->m[i].out_slot < 0)
            continue;
        zs_storage *s = f->m[i].n->outs[0]->storage;
        if (s->external || !s->data)
            continue;
        zsi_device_free(s->device, s->data);
        s->data = NULL;
        s->external = true;
    }
}

/* ---- the pass -------------------------------------------------------------- */

int zs_graph_fuse(zs_graph *g, int nkeep, zs_tensor *const *keep)
{
    if (!g || g->capturing || g->failed || (nkeep > 0 && !keep))
        return zs_set_error("graph fuse: %s", !g ? "no graph" : g->capturing ?
                            "the graph is still being captured" : g->failed ?
                            "the capture failed" : "keep is NULL");
    if (g->plan)
        return zs_set_error("graph fuse: the memory is already planned (fuse "
                            "first)");
    readers r;
    int *gid = malloc(((size_t)g->n + 1) * sizeof *gid);
    group *gs = malloc(((size_t)g->n + 1) * sizeof *gs);
    int ng = 0;
    bool ok = gid && gs && readers_build(&r, g, nkeep, keep);
    for (int j = 0; ok && j < g->n; j++) {
        gid[j] = -1;
        const zsi_gnode *n = g->nodes[j];
        if (!candidate(n))
            continue;
        int best = -1; /* the group of the latest member j reads */
        for (int a = 0; a < n->call.nin; a++)
            for (int p = j - 1; p >= 0; p--) {
                if (gid[p] < 0 || !reads_result(n->in[a], g->nodes[p]))
                    continue;
                if (gid[p] > best)
                    best = gid[p];
                break;
            }
        if (best >= 0 && can_join(g, &r, &gs[best], j)) {
            gs[best].idx[gs[best].n++] = j;
            gid[j] = best;
        } else {
            gs[ng] = (group){.n = 1};
            gs[ng].idx[0] = j;
            gid[j] = ng++;
        }
    }
    /* replace each group of two or more by its fused node at its last
     * member's place */
    int removed = 0;
    for (int k = 0; ok && k < ng; k++) {
        if (gs[k].n < 2)
            continue;
        zsi_gnode *fn = build(g, &r, &gs[k]);
        if (!fn) {
            ok = false;
            break;
        }
        drop_intermediates(fn);
        for (int q = 0; q < gs[k].n; q++)
            g->nodes[gs[k].idx[q]] = NULL;
        g->nodes[gs[k].idx[gs[k].n - 1]] = fn;
        removed += gs[k].n - 1;
    }
    int o = 0;
    for (int i = 0; i < g->n; i++)
        if (g->nodes[i])
            g->nodes[o++] = g->nodes[i];
    g->n = o;
    if (gid && gs)
        readers_free(&r);
    free(gid);
    free(gs);
    return ok ? removed : zs_set_error_code(ZS_ERR_NOMEM, "graph fuse: out of memory");
}
