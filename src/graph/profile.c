/*
 * profile.c - the replay profiler (zs/graph.h): where a replayed step's
 * time goes, node by node, summed by operator.
 *
 * While on, zs_graph_replay reads the monotonic clock around each node
 * (zsi_gnode_exec_timed) and around the whole replay; a clock read costs
 * ~20-30 ns, a GPT small step has ~400 nodes: ~0.02 ms of a step of
 * seconds. Nodes a pass made are grouped under their label (remat:gelu,
 * fused, ...), the others under their operator's name. The FLOPs and
 * bytes are the nodes' cost models (the same as `zs analyze` and the
 * dump), so GFLOP/s and GB/s say how far each operator is from the
 * machine's peaks.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "graph/internal.h"

double zsi_graph_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

zs_status zsi_gnode_exec_timed(zsi_gnode *n)
{
    double t0 = zsi_graph_now();
    zs_status st = zsi_gnode_exec(n);
    n->seconds += zsi_graph_now() - t0;
    return st;
}

zs_status zs_graph_profile(zs_graph *g, bool on)
{
    if (!g)
        return zs_set_error("graph profile: no graph");
    if (on && !g->profile) {
        for (int i = 0; i < g->n; i++)
            g->nodes[i]->seconds = 0;
        g->prof_replays = 0;
        g->prof_seconds = 0;
    }
    g->profile = on;
    return ZS_OK;
}

typedef struct prof_row {
    const char *name;
    int nodes;
    double seconds, flops, bytes;
} prof_row;

static const char *name_of(const zsi_gnode *n)
{
    return n->label ? n->label : n->call.def->op.name;
}

static int by_time(const void *x, const void *y)
{
    const prof_row *a = x, *b = y;
    return a->seconds < b->seconds ? 1 : a->seconds > b->seconds ? -1 : 0;
}

static int node_by_time(const void *x, const void *y)
{
    const zsi_gnode *a = *(zsi_gnode *const *)x, *b = *(zsi_gnode *const *)y;
    return a->seconds < b->seconds ? 1 : a->seconds > b->seconds ? -1 : 0;
}

/* The per-operator rows of g, sorted by time; *nr of them (NULL on
 * allocation failure). */
static prof_row *rows_of(const zs_graph *g, int *nr)
{
    prof_row *r = calloc((size_t)g->n + 1, sizeof *r);
    int n = 0;
    for (int i = 0; r && i < g->n; i++) {
        const zsi_gnode *nd = g->nodes[i];
        const char *name = name_of(nd);
        int k = 0;
        while (k < n && strcmp(r[k].name, name))
            k++;
        if (k == n)
            r[n++].name = name;
        r[k].nodes++;
        r[k].seconds += nd->seconds;
        r[k].flops += nd->cost.flops;
        r[k].bytes += nd->cost.bytes_read + nd->cost.bytes_written;
    }
    if (r)
        qsort(r, (size_t)n, sizeof *r, by_time);
    *nr = n;
    return r;
}

zs_status zs_graph_profile_dump(const zs_graph *g, FILE *f)
{
    if (!g || !f)
        return zs_set_error("graph profile dump: no graph or file");
    if (!g->prof_replays) {
        fprintf(f, "# replay profile: no replay timed (zs_graph_profile off, or "
                   "not replayed since)\n");
        return ZS_OK;
    }
    int nr = 0;
    prof_row *r = rows_of(g, &nr);
    zsi_gnode **by = malloc((size_t)(g->n ? g->n : 1) * sizeof *by);
    if (!r || !by) {
        free(r);
        free(by);
        return zs_set_error_code(ZS_ERR_NOMEM, "graph profile dump: out of memory");
    }
    double reps = (double)g->prof_replays, whole = g->prof_seconds / reps, nodes = 0;
    for (int k = 0; k < nr; k++)
        nodes += r[k].seconds / reps;
    fprintf(f, "# replay profile: %lld replays, %.2f ms per replay (nodes %.2f ms, "
               "between them %.3f ms)\n", (long long)g->prof_replays, 1e3 * whole,
            1e3 * nodes, 1e3 * (whole - nodes));
    fprintf(f, "# %-26s %6s %11s %7s %9s %8s\n", "operator", "nodes", "ms/replay", "share",
            "GFLOP/s", "GB/s");
    for (int k = 0; k < nr; k++) {
        double s = r[k].seconds / reps;
        fprintf(f, "# %-26s %6d %11.3f %6.1f%% %9.2f %8.2f\n", r[k].name, r[k].nodes,
                1e3 * s, whole > 0 ? 100 * s / whole : 0,
                s > 0 ? r[k].flops / s / 1e9 : 0, s > 0 ? r[k].bytes / s / 1e9 : 0);
    }
    memcpy(by, g->nodes, (size_t)g->n * sizeof *by);
    qsort(by, (size_t)g->n, sizeof *by, node_by_time);
    fprintf(f, "# slowest nodes:\n");
    for (int k = 0; k < g->n && k < 12; k++) {
        int idx = 0;
        while (idx < g->n && g->nodes[idx] != by[k])
            idx++;
        double s = by[k]->seconds / reps;
        fprintf(f, "#   node %4d %-26s %9.3f ms  %8.2f GFLOP/s\n", idx, name_of(by[k]),
                1e3 * s, s > 0 ? by[k]->cost.flops / s / 1e9 : 0);
    }
    free(r);
    free(by);
    zs_graph_stats st; /* the plan as the replays left it: with the scratch */
    zs_graph_get_stats(g, &st);
    fprintf(f, "# after the replays: the kernels' scratch of %d nodes in the plan "
               "(%.2f MiB of places)\n", st.scratch_nodes,
            (double)st.scratch_bytes / 1048576);
    zsi_graph_plan_text(g, f);
    return ferror(f) ? zs_set_error("graph profile dump: write failed") : ZS_OK;
}
