/*
 * graph/internal.h - the captured graph as the passes see it (zs/graph.h).
 *
 * A node is one driver call (ops/op.h) kept whole: the zsi_call the
 * kernel was given, with its pointers re-aimed at arrays the node owns
 * (inputs, results and aux results, each retained; the attributes copied),
 * and the kernel function the driver looked up. Replaying the node is
 * `kernel(&call, outs[0])`, or run(g, node) for a node a pass made (a
 * fused chain).
 */
#ifndef ZS_GRAPH_INTERNAL_H
#define ZS_GRAPH_INTERNAL_H

#include <stdio.h>

#include "ops/op.h"
#include "zs/graph.h"

typedef struct zsi_gnode zsi_gnode;
typedef zs_status (*zsi_gnode_run_fn)(zsi_gnode *n);

struct zsi_gnode {
    zsi_call call;           /* in, attrs, aux, outs point into this node */
    zsi_kernel_fn kernel;
    zs_tensor **in;          /* [call.nin], retained */
    zs_tensor *outs[ZSI_MAX_OUT]; /* [call.nout], retained (NULL: not made) */
    zs_tensor *aux[ZSI_MAX_AUX];  /* retained, NULL when none */
    _Alignas(16) unsigned char attrs[ZSI_ATTR_BYTES];
    zsi_cost cost;           /* the descriptor's cost model at capture */
    zsi_gnode_run_fn run;    /* NULL: kernel(&call, outs[0]) */
    void *impl;              /* run's state, freed by impl_free */
    void (*impl_free)(void *impl);
    const char *label;       /* NULL: the operator's name */
    bool recomputed;         /* added by remat.c (a value made again) */
    /* the arena bytes its kernel's own temporaries are served from while it
     * runs (passes.c, zsi_graph_plan_scratch); NULL: none. Owned (a bare
     * struct: data points into the arena) */
    zs_storage *scratch;
    double seconds;          /* replay time summed while profiling */
};

/* Storage sets over a graph (passes): a small open-addressing table of
 * storage pointers. */
typedef struct zsi_sset {
    zs_storage **k;
    int *v;
    int cap, n;
} zsi_sset;
bool zsi_sset_init(zsi_sset *s, int expect);
void zsi_sset_deinit(zsi_sset *s);
/* The slot of key (value -1 when absent); inserts when add (false on
 * allocation failure: returns NULL). */
int *zsi_sset_get(zsi_sset *s, zs_storage *key, bool add);

/* One storage the nodes made, placed in the arena by the memory plan. */
typedef struct zsi_gplan {
    zs_storage *s;
    int first, last;         /* nodes between which it is alive */
    size_t offset, nbytes;
    /* the storage whose bytes it shares (itself when none): a result
     * written over an input read for the last time by the same node, where
     * the kernel reads each element before writing it (passes.c); the
     * group's first entry spans them all (first, last, nbytes) */
    zs_storage *group;
} zsi_gplan;

struct zs_graph {
    zsi_gnode **nodes;
    int n, cap;
    bool failed;             /* a call could not be recorded */
    bool capturing;
    /* a dry capture (zs_graph_capture_begin_dry): the calls were recorded
     * without computing; the RNG position at its start, restored at its
     * end; the host reads of its values (zsi_dry_reads) */
    bool dry;
    uint64_t rng_seed, rng_offset;
    int64_t dry_reads;
    /* the memory plan (zs_graph_plan_memory) */
    zsi_gplan *plan;
    int nplan;
    size_t arena_bytes;
    void *arena;             /* host memory (zs_alloc), or NULL */
    /* the nodes' kernel scratch (zsi_graph_plan_scratch): measured during
     * the first replay after the plan (need[i]: node i's bytes), then
     * placed in the arena; pinned: a node kept scratch past its end, so
     * the arena is never freed (its bytes may still be in use) */
    enum { ZSI_SCRATCH_OFF, ZSI_SCRATCH_MEASURE, ZSI_SCRATCH_PLACED } scratch;
    size_t *need;
    bool regrow;             /* a node needed more than its place (another
                              * interleaving of its threads): grown at the
                              * end of the replay */
    bool pinned;
    /* the lean capture (lean.c) */
    zsi_sset refs;           /* made storage -> the graph's aliases of it;
                              * -2: first met as an input */
    bool refs_ok;            /* refs in use (capturing, no failure) */
    zs_storage **live;       /* made storages still holding memory */
    int nlive, caplive;
    int dropped;             /* storages whose memory the capture freed */
    size_t dropped_bytes;
    /* the replay profiler (profile.c) */
    bool profile;
    int64_t prof_replays;
    double prof_seconds;     /* whole replays, summed */
};

/* Places each node's kernel scratch, measured by the first replay after
 * the memory plan (g->need[i]: node i's bytes), in the arena as a value
 * alive during that node only, and moves the planned storages into the
 * new arena (the values kept after a replay copied over; the old arena
 * freed first). Called again when a replay found a node needing more
 * than its place (g->regrow): places only grow. Without memory, or with
 * nothing to place, the plan stays as it was and the kernels take what
 * does not fit from the cache. ZS_OK, or an error with the graph marked
 * failed (it had no arena left). */
zs_status zsi_graph_plan_scratch(zs_graph *g);

/* With a memory plan, writes its summary to f as "# " lines (dump.c): the
 * arena, the node where the most bytes are alive, the buffers alive there
 * (a kernel's scratch marked). */
void zsi_graph_plan_text(const zs_graph *g, FILE *f);

/* t (not NULL) is its whole storage: offset 0, contiguous, every byte. */
static inline bool zsi_whole_storage(const zs_tensor *t)
{
    return t->offset == 0 && zs_is_contiguous(t) && zs_nbytes(t) == t->storage->nbytes;
}
/* Whether node n reads storage s (an input over it), and whether it
 * writes it: a result; an aux result that is not a view of one of n's
 * inputs (zsi_aux_copy of a contiguous input, a layer norm's weight, is
 * that input, read); in place, in[0] (an update: all its inputs, unless
 * the descriptor writes in[0] only). */
bool zsi_gnode_reads(const zsi_gnode *n, const zs_storage *s);
bool zsi_gnode_writes(const zsi_gnode *n, const zs_storage *s);
/* Inserts n as node at (0 <= at <= g->n), the nodes from at on moving
 * one down; false when the node array cannot grow (nothing changed). */
bool zsi_graph_insert(zs_graph *g, int at, zsi_gnode *n);
/* Frees a node: releases its tensors and its impl. */
void zsi_gnode_free(zsi_gnode *n);
/* Runs node n (its run function or its kernel). */
zs_status zsi_gnode_exec(zsi_gnode *n);
/* The same, adding its wall time to n->seconds (profile.c); the clock. */
zs_status zsi_gnode_exec_timed(zsi_gnode *n);
double zsi_graph_now(void);
/* The lean capture (lean.c): start and stop counting the graph's
 * references; note one more alias (input: of a node's input); free the
 * memory of made storages only the graph references; before a replay
 * without a memory plan, give memory back to the storages left without. */
bool zsi_gcap_init(zs_graph *g);
void zsi_gcap_deinit(zs_graph *g);
void zsi_gcap_note(zs_graph *g, const zs_tensor *a, bool input);
void zsi_gcap_sweep(zs_graph *g);
zs_status zsi_graph_materialize(zs_graph *g);

#endif
