/*
 * dump.c - a captured graph as text and as Graphviz (zs/graph.h), for
 * `--dump-graph`: each node's operator, input and result shapes, dtype,
 * device and its cost model's FLOPs and bytes, then the totals (which
 * `zs analyze` checks against its formulas; tests/graph/test_graph.c).
 */
#include <stdlib.h>
#include <string.h>

#include "graph/internal.h"

static const char *name_of(const zsi_gnode *n)
{
    return n->label ? n->label : n->call.def->op.name;
}

/* "f32[2, 3]" */
static void tensor_text(const zs_tensor *t, char *buf, size_t n)
{
    char s[96];
    snprintf(buf, n, "%s%s", zs_dtype_name(t->dtype),
             zsi_shape_fmt(t->ndim, t->shape, s, sizeof s));
}

/* "f32[2, 3], f32[3]": the first few of ts (n of them), then "+k more" */
static void list_text(zs_tensor *const *ts, int n, char *buf, size_t cap)
{
    size_t k = 0;
    buf[0] = '\0';
    for (int i = 0; i < n && k < cap; i++) {
        if (i == 4) {
            snprintf(buf + k, cap - k, ", +%d more", n - i);
            return;
        }
        char t[128];
        tensor_text(ts[i], t, sizeof t);
        k += (size_t)snprintf(buf + k, cap - k, "%s%s", i ? ", " : "", t);
    }
}

/* With a memory plan: the node where the planned buffers alive together
 * weigh most (the plan's lower bound: no placement can use fewer bytes),
 * beside the arena, and the largest buffers alive there with the node
 * that makes each (the plan is sorted by decreasing size). */
void zsi_graph_plan_text(const zs_graph *g, FILE *f)
{
    if (!g->plan || !g->n)
        return;
    int peak = 0;
    size_t most = 0;
    for (int i = 0; i < g->n; i++) {
        size_t live = 0;
        for (int k = 0; k < g->nplan; k++) /* a group's root spans it */
            if (g->plan[k].group == g->plan[k].s && g->plan[k].first <= i &&
                i <= g->plan[k].last)
                live += g->plan[k].nbytes;
        if (live > most) {
            most = live;
            peak = i;
        }
    }
    fprintf(f, "# memory plan: arena %.2f MiB; most bytes alive at once %.2f MiB, at "
               "node %d (%s)\n", (double)g->arena_bytes / 1048576, (double)most / 1048576,
            peak, name_of(g->nodes[peak]));
    int shown = 0;
    for (int k = 0; k < g->nplan && shown < 48; k++) {
        const zsi_gplan *e = &g->plan[k];
        if (e->first > peak || peak > e->last)
            continue;
        fprintf(f, "#   %8.2f MiB  nodes %d..%d  made by %s%s\n", (double)e->nbytes / 1048576,
                e->first, e->last, e->first < g->n ? name_of(g->nodes[e->first]) : "?",
                e->group != e->s ? " (over another buffer)"
                : e->first < g->n && g->nodes[e->first]->scratch == e->s
                    ? " (its kernel's scratch)" : "");
        shown++;
    }
}

zs_status zs_graph_dump_text(const zs_graph *g, FILE *f, const char *title)
{
    if (!g || !f)
        return zs_set_error("graph dump: no graph or file");
    zs_graph_stats s;
    zs_graph_get_stats(g, &s);
    fprintf(f, "# graph: %s: %d nodes\n", title ? title : "", g->n);
    fprintf(f, "# node  operator  inputs -> results  device  flops  bytes_read  "
               "bytes_written\n");
    for (int i = 0; i < g->n; i++) {
        const zsi_gnode *n = g->nodes[i];
        char in[512], out[512];
        list_text(n->in, n->call.nin, in, sizeof in);
        int no = 0;
        while (no < ZSI_MAX_OUT && n->outs[no])
            no++;
        list_text(n->outs, no, out, sizeof out);
        fprintf(f, "%d %s (%s) -> (%s) %s %.0f %.0f %.0f\n", i, name_of(n), in, out,
                zs_device_name(n->call.device), n->cost.flops, n->cost.bytes_read,
                n->cost.bytes_written);
    }
    fprintf(f, "# total: nodes %d flops %.0f bytes_read %.0f bytes_written %.0f "
               "intermediate_bytes %zu planned_bytes %zu scratch_nodes %d "
               "scratch_bytes %zu\n", s.nodes, s.flops, s.bytes_read, s.bytes_written,
            s.intermediate_bytes, s.planned_bytes, s.scratch_nodes, s.scratch_bytes);
    zsi_graph_plan_text(g, f);
    return ferror(f) ? zs_set_error("graph dump: write failed") : ZS_OK;
}

zs_status zs_graph_dump_dot(const zs_graph *g, FILE *f, const char *title)
{
    if (!g || !f)
        return zs_set_error("graph dump: no graph or file");
    zsi_sset writer; /* storage -> the last node that wrote it */
    if (!zsi_sset_init(&writer, 4 * g->n + 16))
        return zs_set_error_code(ZS_ERR_NOMEM, "graph dump: out of memory");
    fprintf(f, "digraph zs_graph {\n  label=\"%s\";\n  node [shape=box, "
               "fontsize=10];\n", title ? title : "");
    zs_status st = ZS_OK;
    for (int i = 0; i < g->n && st == ZS_OK; i++) {
        const zsi_gnode *n = g->nodes[i];
        char out[256] = "";
        if (n->outs[0])
            tensor_text(n->outs[0], out, sizeof out);
        fprintf(f, "  n%d [label=\"%d %s\\n%s %s\\n%.3g FLOP, %.3g B\"];\n", i, i,
                name_of(n), out, zs_device_name(n->call.device), n->cost.flops,
                n->cost.bytes_read + n->cost.bytes_written);
        for (int j = 0; j < n->call.nin; j++) {
            int w = *zsi_sset_get(&writer, n->in[j]->storage, false);
            if (w >= 0)
                fprintf(f, "  n%d -> n%d;\n", w, i);
        }
        zs_tensor *const *ws[] = {n->outs, n->aux};
        int cnt[] = {ZSI_MAX_OUT, ZSI_MAX_AUX};
        for (int a = 0; a < 2; a++)
            for (int k = 0; k < cnt[a]; k++) {
                if (!ws[a][k])
                    continue;
                int *v = zsi_sset_get(&writer, ws[a][k]->storage, true);
                if (!v) {
                    st = zs_set_error_code(ZS_ERR_NOMEM, "graph dump: out of memory");
                    break;
                }
                *v = i;
            }
    }
    fprintf(f, "}\n");
    zsi_sset_deinit(&writer);
    if (st == ZS_OK && ferror(f))
        st = zs_set_error("graph dump: write failed");
    return st;
}
