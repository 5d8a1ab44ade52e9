/*
 * passes.c - passes over a captured graph (zs/graph.h): dead-code
 * elimination and memory planning by liveness.
 *
 * Both reason about storages, not tensor headers: a view shares its
 * base's storage and is not a node, so "node j reads what node i wrote"
 * means a storage written by i (a result, an aux result, or in[0] of an
 * in-place call) is among j's inputs or aux results. A storage first met
 * as an input was made before the capture or outside the driver (a
 * parameter, a batch buffer, a constant): it is the graph's input, never
 * planned, and writing it is a side effect that keeps its node. A storage
 * first met as a node's result or aux result was made by that node
 * during the capture: an intermediate, which the memory plan may place.
 */
#include <stdlib.h>
#include <string.h>

#include "graph/internal.h"

/* The tensors node n writes (results and aux results; in place: in[0])
 * into w; returns how many. */
static int writes(const zsi_gnode *n, zs_tensor **w)
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

#define WMAX (ZSI_MAX_OUT + ZSI_MAX_AUX)

/* made[s] = the node that made storage s (-1: an input of the graph),
 * for every storage the nodes touch. */
static bool classify(const zs_graph *g, zsi_sset *made)
{
    if (!zsi_sset_init(made, 4 * g->n + 16))
        return false;
    for (int i = 0; i < g->n; i++) {
        const zsi_gnode *n = g->nodes[i];
        for (int j = 0; j < n->call.nin; j++) {
            int *v = zsi_sset_get(made, n->in[j]->storage, true);
            if (!v)
                return false;
            if (*v == -1) /* absent or input: stays -1... marked below */
                *v = -2;  /* first met as an input */
        }
        zs_tensor *w[WMAX];
        int m = writes(n, w);
        for (int k = 0; k < m; k++) {
            int *v = zsi_sset_get(made, w[k]->storage, true);
            if (!v)
                return false;
            if (*v == -1)
                *v = i;
        }
    }
    return true;
}

int zs_graph_dce(zs_graph *g, int nkeep, zs_tensor *const *keep)
{
    if (!g || g->capturing || (nkeep > 0 && !keep))
        return zs_set_error("graph dce: %s", !g ? "no graph" : g->capturing ?
                            "the graph is still being captured" : "keep is NULL");
    if (g->plan)
        return zs_set_error("graph dce: the memory is already planned (run dce "
                            "first)");
    zsi_sset made, need;
    if (!classify(g, &made))
        return zs_set_error_code(ZS_ERR_NOMEM, "graph dce: out of memory");
    if (!zsi_sset_init(&need, 4 * g->n + 16)) {
        zsi_sset_deinit(&made);
        return zs_set_error_code(ZS_ERR_NOMEM, "graph dce: out of memory");
    }
    bool ok = true;
    for (int k = 0; ok && k < nkeep; k++) {
        int *v = keep[k] ? zsi_sset_get(&need, keep[k]->storage, true) : NULL;
        ok = !keep[k] || v;
        if (v)
            *v = 1;
    }
    char *live = calloc((size_t)g->n + 1, 1);
    ok = ok && live;
    for (int i = g->n - 1; ok && i >= 0; i--) {
        zsi_gnode *n = g->nodes[i];
        zs_tensor *w[WMAX];
        int m = writes(n, w);
        for (int k = 0; k < m && !live[i]; k++)
            live[i] = *zsi_sset_get(&need, w[k]->storage, false) >= 0 ||
                      *zsi_sset_get(&made, w[k]->storage, false) == -2;
        for (int j = 0; live[i] && j < n->call.nin; j++) {
            int *v = zsi_sset_get(&need, n->in[j]->storage, true);
            ok = ok && v;
            if (v)
                *v = 1;
        }
    }
    int removed = 0;
    if (ok) {
        int o = 0;
        for (int i = 0; i < g->n; i++) {
            if (live[i])
                g->nodes[o++] = g->nodes[i];
            else
                zsi_gnode_free(g->nodes[i]);
        }
        removed = g->n - o;
        g->n = o;
    }
    free(live);
    zsi_sset_deinit(&made);
    zsi_sset_deinit(&need);
    return ok ? removed : zs_set_error_code(ZS_ERR_NOMEM, "graph dce: out of memory");
}

/* ---- memory plan ---------------------------------------------------------- */

static size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }

static bool overlap_time(const zsi_gplan *a, const zsi_gplan *b)
{
    return a->first <= b->last && b->first <= a->last;
}

static int by_size_desc(const void *x, const void *y)
{
    const zsi_gplan *a = x, *b = y;
    if (a->nbytes != b->nbytes)
        return a->nbytes < b->nbytes ? 1 : -1;
    return a->first - b->first;
}

/* ---- results written over a dead input -------------------------------------
 * A node whose kernel reads each element of an input before it writes the
 * same element of its result (pointwise operators; cross_entropy_backward,
 * row by row: the logits' gradient over the logits) may write the result
 * over that input when the input is read for the last time there: at
 * GPT's loss the logits and their gradient (2 x 32 MiB at GPT small) are
 * the peak of the step. Both must be whole contiguous storages of one
 * dtype and element count. */

static bool overwrites_safely(const zsi_gnode *n, int j)
{
    const zsi_opdef *d = n->call.def;
    const zs_tensor *o = n->outs[0], *x = n->in[j];
    if (n->run || !n->kernel || d->inplace || !o || n->outs[1] || !zsi_whole_storage(o) ||
        !zsi_whole_storage(x) || x->dtype != o->dtype || zs_numel(x) != zs_numel(o))
        return false;
    return d->cls == ZSI_POINTWISE || (d == &zsi_def_cross_entropy_backward && j == 0);
}

static int group_root(int k, const int *root)
{
    while (root[k] != k)
        k = root[k];
    return k;
}

/* Joins each result to an input it may overwrite (above): the group's
 * root entry spans both. */
static void share_bytes(const zs_graph *g, zsi_sset *made, zsi_gplan *p, int n)
{
    int *root = malloc((size_t)(n ? n : 1) * sizeof *root);
    for (int k = 0; k < n; k++) {
        p[k].group = p[k].s;
        if (root)
            root[k] = k;
    }
    for (int i = 0; root && i < g->n; i++) {
        const zsi_gnode *nd = g->nodes[i];
        int vo = nd->outs[0] ? *zsi_sset_get(made, nd->outs[0]->storage, false) : -1;
        if (vo > -3 || p[-(vo + 3)].first != i)
            continue;
        for (int j = 0; j < nd->call.nin; j++) {
            int vi = *zsi_sset_get(made, nd->in[j]->storage, false);
            if (vi > -3 || vi == vo || !overwrites_safely(nd, j))
                continue;
            int r = group_root(-(vi + 3), root), o = -(vo + 3);
            if (p[r].last != i || p[r].nbytes < p[o].nbytes || p[o].last == g->n)
                continue; /* read later (or kept), too small; or the result kept */
            root[o] = r;
            p[r].last = p[o].last;
            break;
        }
    }
    for (int k = 0; root && k < n; k++)
        p[k].group = p[group_root(k, root)].s;
    free(root);
}

/* The intermediates of g with their lifetimes; *np of them. */
static zsi_gplan *lifetimes(const zs_graph *g, int nkeep, zs_tensor *const *keep,
                            int *np)
{
    zsi_sset made;
    if (!classify(g, &made))
        return NULL;
    zsi_gplan *p = calloc((size_t)made.n + 1, sizeof *p);
    int n = 0;
    for (int i = 0; p && i < g->n; i++) { /* one entry per made storage */
        zs_tensor *w[WMAX];
        int m = writes(g->nodes[i], w);
        for (int k = 0; k < m; k++) {
            zs_storage *s = w[k]->storage;
            int *v = zsi_sset_get(&made, s, false);
            if (*v != i || s->external || s->device != ZS_CPU)
                continue;
            *v = -(n + 3); /* now: the plan entry -(v + 3) */
            p[n++] = (zsi_gplan){s, i, i, 0, align64(s->nbytes), s};
        }
    }
    for (int i = 0; p && i < g->n; i++) { /* last uses */
        const zsi_gnode *nd = g->nodes[i];
        zs_tensor *w[WMAX + ZSI_MAX_IN];
        int m = writes(nd, w);
        for (int j = 0; j < nd->call.nin; j++)
            w[m++] = nd->in[j];
        for (int k = 0; k < m; k++) {
            int v = *zsi_sset_get(&made, w[k]->storage, false);
            if (v <= -3)
                p[-(v + 3)].last = i;
        }
    }
    for (int k = 0; p && k < nkeep; k++) {
        int v = keep[k] ? *zsi_sset_get(&made, keep[k]->storage, false) : -1;
        if (v <= -3)
            p[-(v + 3)].last = g->n; /* read after the replay */
    }
    if (p)
        share_bytes(g, &made, p, n);
    zsi_sset_deinit(&made);
    *np = n;
    return p;
}

/* First fit by decreasing size: each entry at the lowest offset where it
 * overlaps no placed entry alive at the same time; the other members of a
 * group (share_bytes) at their root's offset. Returns the arena's size. */
static size_t place(zsi_gplan *p, int n)
{
    qsort(p, (size_t)n, sizeof *p, by_size_desc);
    size_t top = 0;
    for (int i = 0; i < n; i++) {
        if (p[i].group != p[i].s)
            continue;
        size_t off = 0;
        for (bool moved = true; moved;) {
            moved = false;
            for (int j = 0; j < i; j++)
                if (p[j].group == p[j].s && overlap_time(&p[i], &p[j]) &&
                    off < p[j].offset + p[j].nbytes && p[j].offset < off + p[i].nbytes) {
                    off = p[j].offset + p[j].nbytes;
                    moved = true;
                }
        }
        p[i].offset = off;
        if (off + p[i].nbytes > top)
            top = off + p[i].nbytes;
    }
    for (int i = 0; i < n; i++)
        for (int j = 0; p[i].group != p[i].s && j < n; j++)
            if (p[j].s == p[i].group)
                p[i].offset = p[j].offset;
    return top;
}

zs_status zs_graph_plan_verify(const zs_graph *g)
{
    if (!g)
        return zs_set_error("graph plan verify: no graph");
    const zsi_gplan *p = g->plan;
    for (int i = 0; i < g->nplan; i++) {
        if (p[i].offset + p[i].nbytes > g->arena_bytes || p[i].nbytes < p[i].s->nbytes)
            return zs_set_error("graph plan: buffer %d ([%zu, %zu), %zu bytes "
                                "used) lies outside the %zu-byte arena", i,
                                p[i].offset, p[i].offset + p[i].nbytes,
                                p[i].s->nbytes, g->arena_bytes);
        for (int j = i + 1; j < g->nplan; j++)
            if (p[i].group != p[j].group && overlap_time(&p[i], &p[j]) &&
                p[i].offset < p[j].offset + p[j].nbytes &&
                p[j].offset < p[i].offset + p[i].nbytes)
                return zs_set_error("graph plan: buffers %d (nodes %d..%d, bytes "
                                    "[%zu, %zu)) and %d (nodes %d..%d, bytes "
                                    "[%zu, %zu)) are alive together and overlap",
                                    i, p[i].first, p[i].last, p[i].offset,
                                    p[i].offset + p[i].nbytes, j, p[j].first,
                                    p[j].last, p[j].offset,
                                    p[j].offset + p[j].nbytes);
    }
    return ZS_OK;
}

/* Moves the planned storages into the arena without holding both at once:
 * first the old blocks of the storages whose values are dead at the end
 * (everything but what keep names) are freed, so the arena can reuse
 * their bytes (the caching allocator hands them back); then the arena is
 * allocated, the values alive at the end (read after a replay) copied in
 * and their old blocks freed. The peak of planning is thus at most
 * max(what the capture held, arena + the kept values), never their sum.
 * On allocation failure the dead blocks are allocated again (their values
 * do not matter) and the graph is unchanged (or, when even that fails,
 * marked failed: it refuses replay). */
static zs_status apply(zs_graph *g, int end)
{
    for (int i = 0; i < g->nplan; i++) {
        zsi_gplan *e = &g->plan[i];
        if (e->last != end) {
            zsi_device_free(e->s->device, e->s->data);
            e->s->data = NULL;
        }
    }
    zs_alloc_trim(); /* the freed blocks' pages go back before the arena's come */
    char *base = g->arena_bytes ? zs_alloc_exact(g->arena_bytes) : NULL;
    if (g->arena_bytes && !base) {
        for (int i = 0; i < g->nplan; i++)
            if (!g->plan[i].s->data &&
                !(g->plan[i].s->data = zsi_device_alloc(g->plan[i].s->device,
                                                        g->plan[i].s->nbytes)))
                g->failed = true; /* a storage without memory: no replay */
        return zs_set_error_code(ZS_ERR_NOMEM, "graph plan: no memory for the "
                                 "%zu-byte arena", g->arena_bytes);
    }
    g->arena = base;
    for (int i = 0; i < g->nplan; i++) {
        zsi_gplan *e = &g->plan[i];
        void *old = e->s->data;
        if (old) {
            memcpy(base + e->offset, old, e->s->nbytes);
            zsi_device_free(e->s->device, old);
        }
        e->s->data = base + e->offset;
        e->s->external = true; /* the graph's arena frees it */
    }
    return ZS_OK;
}

zs_status zs_graph_plan_memory(zs_graph *g, int nkeep, zs_tensor *const *keep)
{
    if (!g || g->capturing || g->failed || (nkeep > 0 && !keep))
        return zs_set_error("graph plan: %s", !g ? "no graph" : g->capturing ?
                            "the graph is still being captured" : g->failed ?
                            "the capture failed" : "keep is NULL");
    if (g->plan)
        return zs_set_error("graph plan: the memory is already planned");
    int n = 0;
    zsi_gplan *p = lifetimes(g, nkeep, keep, &n);
    if (!p)
        return zs_set_error_code(ZS_ERR_NOMEM, "graph plan: out of memory");
    g->plan = p;
    g->nplan = n;
    g->arena_bytes = place(p, n);
    zs_status st = zs_graph_plan_verify(g);
    if (st == ZS_OK)
        st = apply(g, g->n);
    if (st != ZS_OK) {
        free(g->plan);
        g->plan = NULL;
        g->nplan = 0;
        g->arena_bytes = 0;
        return st;
    }
    /* the first replay measures the kernels' scratch (graph.c, exec_node) */
    free(g->need);
    g->need = calloc((size_t)g->n, sizeof *g->need);
    g->scratch = g->need && g->arena_bytes ? ZSI_SCRATCH_MEASURE : ZSI_SCRATCH_OFF;
    return ZS_OK;
}

/* ---- the kernels' scratch in the arena -------------------------------------
 * Kernels take temporaries of their own from the caching allocator (a
 * convolution's column buffers, a GEMM's packed panels, the f32 blocks of
 * a bf16 GEMM). Outside the plan they sit on top of the arena at the
 * moment they are taken, although the arena then holds dead values they
 * could use: LeNet's conv2d_backward takes 1.3 MiB against a 3.8 MiB
 * arena. Measured once (each node's high-water mark in a scratch window,
 * core/internal.h), each becomes one more plan entry alive during its
 * node only, placed with the rest. */

/* The values alive after a replay (plan entries with last == g->n), copied
 * aside while no arena is held. */
typedef struct kept {
    zs_storage *s;
    void *copy;
} kept;

/* Copies of g's kept values (*nk of them); NULL with *nk -1 when out of
 * memory (nothing copied). */
static kept *save_kept(const zs_graph *g, int *nk)
{
    kept *k = calloc((size_t)g->nplan + 1, sizeof *k);
    int n = 0;
    for (int i = 0; k && i < g->nplan; i++) {
        const zsi_gplan *e = &g->plan[i];
        if (e->last != g->n || !e->s->data)
            continue;
        k[n].s = e->s; /* 64-byte aligned: a storage's data may end here */
        if (posix_memalign(&k[n++].copy, 64, e->s->nbytes ? e->s->nbytes : 1) != 0) {
            k[n - 1].copy = NULL;
            for (int j = 0; j < n; j++)
                free(k[j].copy);
            free(k);
            k = NULL;
            break;
        }
        memcpy(k[n - 1].copy, e->s->data, e->s->nbytes);
    }
    *nk = k ? n : -1;
    return k;
}

/* Gives g's plan entries their place in arena base, the kept values
 * copied back (and their copies freed). */
static void settle(zs_graph *g, char *base, kept *k, int nk)
{
    g->arena = base;
    for (int i = 0; i < g->nplan; i++)
        g->plan[i].s->data = base + g->plan[i].offset;
    for (int j = 0; j < nk; j++) {
        memcpy(k[j].s->data, k[j].copy, k[j].s->nbytes);
        free(k[j].copy);
    }
    free(k);
}

/* The scratch sizes the plan holds now (0: none) into sz[g->n]. */
static void scratch_sizes(const zs_graph *g, size_t *sz)
{
    for (int i = 0; i < g->n; i++)
        sz[i] = g->nodes[i]->scratch ? g->nodes[i]->scratch->nbytes : 0;
}

/* Back to the plan old (nold entries) with the scratch sizes sz: the
 * scratch made since is dropped. */
static void restore_plan(zs_graph *g, zsi_gplan *old, int nold, const size_t *sz)
{
    for (int i = 0; i < g->n; i++) {
        zsi_gnode *nd = g->nodes[i];
        if (nd->scratch && !sz[i]) {
            free(nd->scratch);
            nd->scratch = NULL;
        } else if (nd->scratch) {
            nd->scratch->nbytes = sz[i];
        }
    }
    free(g->plan);
    g->plan = old;
    g->nplan = nold;
}

/* The new plan: g's entries, the grown scratch entries at their new size,
 * one entry per node that has its first scratch (made here). n: entries. */
static void grow_plan(zs_graph *g, zsi_gplan *p, int *n)
{
    memcpy(p, g->plan, (size_t)g->nplan * sizeof *p);
    *n = g->nplan;
    for (int j = 0; j < *n; j++) { /* grown: a later replay needed more */
        int i = p[j].first;      /* a scratch entry lives at its node */
        zs_storage *sc = i < g->n ? g->nodes[i]->scratch : NULL;
        if (sc && p[j].s == sc && g->need[i] > sc->nbytes) {
            sc->nbytes = g->need[i];
            p[j].nbytes = align64(sc->nbytes);
        }
    }
    for (int i = 0; i < g->n; i++) {
        zsi_gnode *nd = g->nodes[i];
        if (!g->need[i] || nd->scratch || !(nd->scratch = calloc(1, sizeof *nd->scratch)))
            continue;
        *nd->scratch = (zs_storage){.nbytes = g->need[i], .refcount = 1,
                                    .device = ZS_CPU, .external = true};
        p[(*n)++] = (zsi_gplan){nd->scratch, i, i, 0, align64(g->need[i]), nd->scratch};
    }
}

zs_status zsi_graph_plan_scratch(zs_graph *g)
{
    g->regrow = false;
    int extra = 0, grown = 0, placed = 0;
    for (int i = 0; i < g->n; i++) {
        const zs_storage *sc = g->nodes[i]->scratch;
        placed += sc != NULL;
        grown += sc && g->need[i] > sc->nbytes;
        extra += !sc && g->need[i] > 0;
    }
    g->scratch = placed ? ZSI_SCRATCH_PLACED : ZSI_SCRATCH_OFF;
    if (!extra && !grown)
        return ZS_OK;
    zsi_gplan *p = calloc((size_t)(g->nplan + extra), sizeof *p);
    zsi_gplan *old = malloc((size_t)g->nplan * sizeof *old + 1);
    size_t *sz = malloc((size_t)g->n * sizeof *sz + 1);
    int nk = 0;
    kept *k = p && old && sz ? save_kept(g, &nk) : NULL;
    if (!k) { /* no memory: the plan stays (a grown node tries again) */
        free(p);
        free(old);
        free(sz);
        return ZS_OK;
    }
    memcpy(old, g->plan, (size_t)g->nplan * sizeof *old);
    scratch_sizes(g, sz);
    int n = 0, nold = g->nplan;
    grow_plan(g, p, &n);
    size_t old_bytes = g->arena_bytes;
    free(g->plan);
    g->plan = p;
    g->nplan = n;
    g->arena_bytes = place(p, n);
    zs_free(g->arena); /* the kept values are in k */
    g->arena = NULL;
    zs_alloc_trim(); /* the scratch blocks' pages go back before the arena's come */
    char *base = zs_graph_plan_verify(g) == ZS_OK ? zs_alloc_exact(g->arena_bytes) : NULL;
    if (base) {
        free(old);
        free(sz);
        settle(g, base, k, nk);
        g->scratch = ZSI_SCRATCH_PLACED;
        return ZS_OK;
    }
    g->arena_bytes = old_bytes;
    restore_plan(g, old, nold, sz);
    free(sz);
    if (!(base = zs_alloc_exact(old_bytes))) {
        /* no arena: the graph refuses replay; the kept values stay
         * readable in their copies (leaked with the graph: rare enough) */
        for (int i = 0; i < g->nplan; i++)
            g->plan[i].s->data = NULL;
        for (int j = 0; j < nk; j++)
            k[j].s->data = k[j].copy;
        free(k);
        g->failed = true;
        return zs_set_error_code(ZS_ERR_NOMEM, "graph plan: no memory for the "
                                 "%zu-byte arena again", old_bytes);
    }
    zs_clear_error();
    settle(g, base, k, nk);
    return ZS_OK;
}
