/*
 * lean.c - a lean capture (zs/graph.h): the capture holds no more memory
 * than the eager step it records.
 *
 * The recorder keeps an untracked alias of every tensor a node touches
 * (graph.c), and each alias holds a reference to its storage, so without
 * this file every value the step made stayed allocated to the end of the
 * capture (GPT small: a capture step peak of 1205 MiB against 382 eager).
 * Here the graph counts its own references per storage the nodes made
 * (zsi_gcap_note), and after each recorded call and at the end of the
 * capture (zsi_gcap_sweep) a made storage whose every reference is the
 * graph's has been dropped by eager: no tensor of the program can read it
 * any more, and the graph needs its bytes only as a place a replay
 * writes. Its memory is freed (data NULL, nbytes kept), as eager frees
 * it, so the capture's peak is eager's. A storage first met as an input
 * (a parameter, a batch buffer: made before the capture) is never
 * touched.
 *
 * Who gives the bytes back: the memory plan (passes.c) places every made
 * storage in its arena whatever its data; a graph replayed without a plan
 * gets its dropped storages allocated again before its first replay
 * (zsi_graph_materialize; their values are rewritten by the replay before
 * they are read, as in any replay).
 */
#include <stdlib.h>

#include "core/internal.h"
#include "graph/internal.h"

#define INPUT (-2)

bool zsi_gcap_init(zs_graph *g)
{
    g->refs_ok = zsi_sset_init(&g->refs, 1024);
    return g->refs_ok;
}

void zsi_gcap_deinit(zs_graph *g)
{
    if (g->refs_ok)
        zsi_sset_deinit(&g->refs);
    g->refs_ok = false;
    free(g->live);
    g->live = NULL;
    g->nlive = g->caplive = 0;
}

/* The graph made (or will hold) one more alias of a's storage; input:
 * the alias is a node's input. On allocation failure the storage is
 * marked nowhere and simply never freed early (refs_ok false: no sweep). */
void zsi_gcap_note(zs_graph *g, const zs_tensor *a, bool input)
{
    if (!g->refs_ok || !a)
        return;
    zs_storage *s = a->storage;
    int *v = zsi_sset_get(&g->refs, s, true);
    if (!v) {
        zsi_gcap_deinit(g);
        return;
    }
    if (*v == INPUT)
        return;
    if (*v >= 1) {
        (*v)++;
        return;
    }
    if (input || s->external || !s->data) { /* first met as an input */
        *v = INPUT;
        return;
    }
    if (g->nlive == g->caplive) {
        int cap = g->caplive ? 2 * g->caplive : 256;
        zs_storage **p = realloc(g->live, (size_t)cap * sizeof *p);
        if (!p) {
            *v = INPUT; /* not tracked: kept to the end */
            return;
        }
        g->live = p;
        g->caplive = cap;
    }
    *v = 1;
    g->live[g->nlive++] = s;
}

/* Frees the data of the made storages only the graph still references. */
void zsi_gcap_sweep(zs_graph *g)
{
    if (!g->refs_ok)
        return;
    int o = 0;
    for (int i = 0; i < g->nlive; i++) {
        zs_storage *s = g->live[i];
        int held = *zsi_sset_get(&g->refs, s, false);
        if ((int)s->refcount > held) {
            g->live[o++] = s;
            continue;
        }
        zsi_device_free(s->device, s->data);
        s->data = NULL;
        g->dropped++;
        g->dropped_bytes += s->nbytes;
    }
    g->nlive = o;
}

/* Allocates the storages of g's nodes left without memory (dropped by
 * the lean capture, or fused away), for a replay without a memory plan. */
zs_status zsi_graph_materialize(zs_graph *g)
{
    if (g->arena || !g->dropped)
        return ZS_OK;
    for (int i = 0; i < g->n; i++) {
        zsi_gnode *n = g->nodes[i];
        zs_tensor *t[ZSI_MAX_IN + ZSI_MAX_OUT + ZSI_MAX_AUX];
        int m = 0;
        for (int j = 0; j < n->call.nin && m < ZSI_MAX_IN; j++)
            t[m++] = n->in[j];
        for (int k = 0; k < ZSI_MAX_OUT; k++)
            if (n->outs[k])
                t[m++] = n->outs[k];
        for (int k = 0; k < ZSI_MAX_AUX; k++)
            if (n->aux[k])
                t[m++] = n->aux[k];
        for (int k = 0; k < m; k++) {
            zs_storage *s = t[k]->storage;
            if (s->data || s->external || !s->nbytes)
                continue;
            if (!(s->data = zsi_device_alloc(s->device, s->nbytes)))
                return zs_set_error_code(ZS_ERR_NOMEM, "graph replay: no memory "
                                         "for a %zu-byte buffer of node %d (%s)",
                                         s->nbytes, i, n->call.def->op.name);
        }
    }
    g->dropped = 0;
    return ZS_OK;
}
