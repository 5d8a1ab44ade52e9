/*
 * autograd/node.h - the operator descriptor and the autograd node, shared by
 * the operator files (src/ops) and the backward engine.
 *
 * An operator is described once by a zsi_op: its name, its backward rule
 * and its profiler counters. The forward is the public zs_* function, which
 * checks shapes, allocates, runs a kernel, reports its cost model with
 * zsi_op_end and calls zsi_record when autograd needs a node.
 *
 * A node holds, per input, either the input's own node (retained) or the
 * input itself when it is a leaf that requires grad (retained), plus the
 * input's dtype and shape, and the tensors its backward rule needs (saved as
 * detached aliases, so an output saving itself makes no cycle).
 */
#ifndef ZS_AUTOGRAD_NODE_H
#define ZS_AUTOGRAD_NODE_H

#include "zs/core.h"

#define ZSI_MAX_SAVED 6

typedef struct zsi_node zsi_node;

/* Computes gin[i] (new references, or NULL when there is no gradient) for
 * every input i with zsi_needs_grad(n, i), from gout (borrowed, shape of the
 * output). Runs with grad mode off and scope tracking paused. */
typedef zs_status (*zsi_backward_fn)(zsi_node *n, zs_tensor *gout,
                                     zs_tensor **gin);

typedef struct zsi_op {
    const char *name;
    zsi_backward_fn backward;
    /* counters, filled by zsi_op_end */
    uint64_t calls;
    double flops, bytes, seconds;
    struct zsi_op *next; /* registry list */
    bool registered;
} zsi_op;

typedef struct zsi_meta {
    zs_dtype dtype;
    int ndim;
    int64_t shape[ZS_MAX_DIMS];
} zsi_meta;

struct zsi_node {
    int refcount;
    zsi_op *op;
    int nin;
    zsi_node **in_node;   /* [nin], retained or NULL */
    zs_tensor **in_leaf;  /* [nin], retained or NULL */
    zsi_meta *in_meta;    /* [nin] */
    zsi_meta out_meta;
    zs_tensor *saved[ZSI_MAX_SAVED];
    union {
        double f[16];
        int64_t i[16];
    } p;                  /* operator parameters for backward */
    void *extra;          /* malloc'd parameters, freed with the node */
    zs_tensor *gout;      /* gradient being accumulated during backward */
    zs_tensor *retain_target; /* weak: output that asked to keep its grad */
    bool freed;           /* saved tensors dropped by a backward */
    int deps;             /* engine scratch */
    int visit;
};

/* Profiling: call zsi_op_begin first thing, zsi_op_end with the cost model
 * just before returning the result. */
double zsi_op_begin(zsi_op *op);
void zsi_op_end(zsi_op *op, double t0, double flops, double bytes_read,
                double bytes_written);

/* If grad mode is on and some input requires grad, makes out's node and
 * stores it in *node (owned by out); else *node = NULL. Fails only on
 * allocation failure (message set). */
zs_status zsi_record(zsi_op *op, zs_tensor *out, int nin, zs_tensor *const *in,
                     zsi_node **node);
/* Saves a detached alias of t in slot k of n (t may be NULL). */
void zsi_save(zsi_node *n, int k, zs_tensor *t);
static inline bool zsi_needs_grad(const zsi_node *n, int i)
{
    return n->in_node[i] || n->in_leaf[i];
}
/* True if grad mode is on and t needs grad. */
bool zsi_grad_needed(const zs_tensor *t);

/* Sums g over the dims that were broadcast from the shape in m and reshapes
 * to it; new reference. */
zs_tensor *zsi_sum_to(zs_tensor *g, const zsi_meta *m);

void zsi_node_retain(zsi_node *n);
void zsi_node_release(zsi_node *n);

#endif
