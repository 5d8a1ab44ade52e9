/*
 * autograd/node.h - the autograd node: an operator's record (zsi_ctx, from
 * ops/op.h, which is all a backward rule sees) plus the graph edges.
 *
 * A node holds, per input, either the input's own node (retained) or the
 * input itself when it is a leaf that requires grad (retained); its record
 * holds the inputs' dtypes and shapes and the tensors the backward rule
 * needs (saved as detached aliases, so an output saving itself makes no
 * cycle). Operators reach nodes only through zsi_ctx and the recorder that
 * engine.c installs (zsi_set_recorder): ops never include this header.
 */
#ifndef ZS_AUTOGRAD_NODE_H
#define ZS_AUTOGRAD_NODE_H

#include "ops/op.h"

typedef struct zsi_node zsi_node;

struct zsi_node {
    zsi_ctx c;            /* first: the record an operator sees */
    zs_refcount refcount; /* atomic (core/internal.h) */
    zsi_node **in_node;   /* [nin], retained or NULL */
    zs_tensor **in_leaf;  /* [nin], retained or NULL */
    zs_tensor *gout;      /* gradient being accumulated during backward */
    zs_tensor *retain_target; /* weak: output that asked to keep its grad */
    bool freed;           /* saved tensors dropped by a backward */
    /* frees c.extra when the node goes (NULL: free()); recompute.c's
     * region holds tensors there */
    void (*extra_free)(void *extra);
    int deps;             /* engine scratch */
    int visit;
};

void zsi_node_retain(zsi_node *n);
void zsi_node_release(zsi_node *n);

#endif
