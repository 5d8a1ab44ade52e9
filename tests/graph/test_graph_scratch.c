/*
 * test_graph_scratch.c - the kernels' own temporaries inside a graph's
 * memory plan (src/graph/passes.c, zsi_graph_plan_scratch; the windows of
 * src/core/alloc.c).
 *
 * LeNet-5, forward, loss and backward of a batch of 16 captured, planned:
 * - the first replay measures each node's scratch and places it in the
 *   arena: the arena grows, the convolutions' nodes hold scratch, the
 *   plan verifies, zs_graph_get_stats and the dump's total line count
 *   it; the loss and the gradient equal eager's bit for bit;
 * - a replay after that takes nothing from the allocator (no block, no
 *   byte above its start): "replay without allocation" holds for the
 *   kernels' temporaries too;
 * - a node whose place is too small (shrunk here; in use, another
 *   interleaving of a kernel's threads) takes the rest from the cache for
 *   that replay and its place grows at the replay's end; the plan still
 *   verifies and the bits still agree;
 * - a second graph of the same step whose new arena cannot be allocated
 *   (an injected failure of exactly that allocation) replays on its old
 *   plan, without scratch, to the same bits;
 * - a node that keeps scratch past its end fails the replay with a
 *   message naming it, and the graph refuses replay after that (its
 *   arena, where the kept block lives, is not freed).
 * One thread: the windows serve what a thread interleaving asks for, and
 * the no-allocation check needs the measured interleaving again.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph/internal.h"
#include "testutil.h"

enum { BATCH = 16 };

typedef struct net {
    zs_module *m;
    zs_tensor *fp, *fg, *x, *y;
} net;

static void net_init(net *n)
{
    n->m = zs_lenet5_new(4);
    ZT_CHECK(n->m && zs_module_flatten(n->m, &n->fp, &n->fg) == ZS_OK, "lenet: %s",
             zs_last_error());
    n->fp->grad = zs_retain(n->fg);
    zs_module_train(n->m, true);
    n->x = zt_rand(ZS_F32, ZS_SHAPE(BATCH, 1, 28, 28), 77);
    int64_t lab[BATCH];
    for (int i = 0; i < BATCH; i++)
        lab[i] = (7 * i + 3) % 10;
    n->y = zs_from_data(ZS_I64, ZS_SHAPE(BATCH), lab);
}

/* One step's loss into a new tensor the caller owns (untracked alias). */
static zs_tensor *step(net *n)
{
    zs_tensor *l = zs_cross_entropy(zs_module_forward(n->m, n->x), n->y, -100);
    ZT_CHECK(l && zs_backward(l, NULL, false) == ZS_OK, "step: %s", zs_last_error());
    return zs_retain(l);
}

static bool same_bits(const zs_tensor *a, const zs_tensor *b)
{
    return zs_numel(a) == zs_numel(b) &&
           !memcmp(zs_data((zs_tensor *)a), zs_data((zs_tensor *)b), zs_nbytes(a));
}

static int nodes_with_scratch(const zs_graph *g, size_t *largest, int *at)
{
    int k = 0;
    *largest = 0;
    for (int i = 0; i < g->n; i++) {
        const zs_storage *s = g->nodes[i]->scratch;
        if (!s)
            continue;
        k++;
        if (s->nbytes > *largest) {
            *largest = s->nbytes;
            *at = i;
        }
    }
    return k;
}

/* Replays g with the gradient zeroed first; the allocator's blocks taken
 * and bytes held above the start during the replay. */
static zs_status replay(net *n, zs_graph *g, uint64_t *blocks, size_t *above)
{
    zs_fill_(n->fg, 0.0);
    zs_alloc_stats a0, a1;
    zs_alloc_get_stats(&a0);
    zs_alloc_reset_peak();
    zs_status st = zs_graph_replay(g);
    zs_alloc_get_stats(&a1);
    *blocks = a1.n_allocs - a0.n_allocs;
    *above = a1.peak_bytes - a0.current_bytes;
    return st;
}

static zs_tensor *stash; /* the block the leaky node keeps (reachable) */

static zs_status leaky_run(zsi_gnode *nd)
{
    zs_status st = nd->kernel(&nd->call, nd->outs[0]);
    if (!stash)
        stash = zs_alloc(100);
    return st;
}

int main(void)
{
    zs_set_num_threads(1);
    zs_manual_seed(9);
    net n;
    net_init(&n);
    zs_scope_push();
    zs_fill_(n.fg, 0.0);
    zs_tensor *le = step(&n);
    zs_tensor *ge = zs_clone(n.fg);

    zs_fill_(n.fg, 0.0);
    zs_graph *g = zs_graph_capture_begin();
    zs_tensor *lg = step(&n);
    ZT_CHECK(zs_graph_capture_end(g) == ZS_OK, "capture: %s", zs_last_error());
    ZT_CHECK(zs_graph_dce(g, 1, &lg) >= 0 && zs_graph_plan_memory(g, 1, &lg) == ZS_OK,
             "passes: %s", zs_last_error());
    zs_graph_stats s0, s1;
    zs_graph_get_stats(g, &s0);
    uint64_t blocks;
    size_t above, largest = 0;
    int at = -1;
    ZT_CHECK(nodes_with_scratch(g, &largest, &at) == 0, "no scratch before a replay");
    ZT_CHECK(replay(&n, g, &blocks, &above) == ZS_OK, "replay 1: %s", zs_last_error());
    uint64_t blocks1 = blocks; /* the kernels' measured blocks, then the arena */
    zs_graph_get_stats(g, &s1);
    int k = nodes_with_scratch(g, &largest, &at);
    printf("LeNet-5, batch %d: arena %.1f KiB before the kernels' scratch, %.1f KiB "
           "after (%d nodes with scratch, the largest %.1f KiB: node %d, %s); the first "
           "replay took %llu blocks\n", BATCH, s0.planned_bytes / 1024.0,
           s1.planned_bytes / 1024.0, k, largest / 1024.0, at,
           at >= 0 ? g->nodes[at]->call.def->op.name : "-", (unsigned long long)blocks);
    int convs = 0;
    for (int i = 0; i < g->n; i++)
        convs += g->nodes[i]->scratch && strstr(g->nodes[i]->call.def->op.name, "conv");
    ZT_CHECK(k > 0 && at >= 0 && convs > 0, "the convolutions hold scratch (%d of %d "
             "nodes; largest at %s)", convs, k,
             at >= 0 ? g->nodes[at]->call.def->op.name : "-");
    ZT_CHECK(s1.planned_bytes > s0.planned_bytes &&
             s1.planned_bytes < s0.planned_bytes + (size_t)k * largest,
             "the arena grows by less than the scratch it now holds (%zu -> %zu)",
             s0.planned_bytes, s1.planned_bytes);
    ZT_CHECK(zs_graph_plan_verify(g) == ZS_OK, "verify: %s", zs_last_error());
    ZT_CHECK(same_bits(lg, le) && same_bits(n.fg, ge), "replay 1 = eager, bit for bit");
    ZT_CHECK(s1.scratch_nodes == k && s1.scratch_bytes >= largest &&
             s0.scratch_nodes == 0 && s0.scratch_bytes == 0,
             "stats: %d nodes, %zu bytes of scratch (before: %d, %zu)", s1.scratch_nodes,
             s1.scratch_bytes, s0.scratch_nodes, s0.scratch_bytes);
    char *text = NULL, want[96];
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    ZT_CHECK(f && zs_graph_dump_text(g, f, "t") == ZS_OK, "dump: %s", zs_last_error());
    if (f)
        fclose(f);
    snprintf(want, sizeof want, "scratch_nodes %d scratch_bytes %zu", k, s1.scratch_bytes);
    ZT_CHECK(text && strstr(text, want), "the dump's total line has \"%s\"", want);
    free(text);
    zt_section("scratch measured and placed by the first replay");

    ZT_CHECK(replay(&n, g, &blocks, &above) == ZS_OK, "replay 2: %s", zs_last_error());
    ZT_CHECK(blocks == 0 && above == 0, "replay 2 took %llu blocks, %zu bytes from the "
             "allocator", (unsigned long long)blocks, above);
    ZT_CHECK(same_bits(lg, le) && same_bits(n.fg, ge), "replay 2 = eager, bit for bit");
    zt_section("a replay allocates nothing");

    zs_storage *sc = g->nodes[at]->scratch;
    sc->nbytes = 64; /* too small: the cache serves it, the place grows */
    ZT_CHECK(replay(&n, g, &blocks, &above) == ZS_OK, "replay 3: %s", zs_last_error());
    ZT_CHECK(blocks > 0, "the shrunk node took blocks from the cache");
    ZT_CHECK(sc->nbytes >= largest && zs_graph_plan_verify(g) == ZS_OK,
             "its place grew back (%zu bytes, measured %zu): %s", sc->nbytes, largest,
             zs_last_error());
    ZT_CHECK(same_bits(lg, le) && same_bits(n.fg, ge), "replay 3 = eager, bit for bit");
    ZT_CHECK(replay(&n, g, &blocks, &above) == ZS_OK && blocks == 0 && above == 0,
             "replay 4 allocates nothing again (%llu blocks)", (unsigned long long)blocks);
    ZT_CHECK(same_bits(lg, le) && same_bits(n.fg, ge), "replay 4 = eager, bit for bit");
    zt_section("a place too small grows");

    /* the same step in a second graph, its new arena's allocation made to
     * fail: the replay still succeeds on the old plan, without scratch */
    uint64_t first_blocks = 0;
    {
        zs_fill_(n.fg, 0.0);
        zs_graph *g2 = zs_graph_capture_begin();
        zs_tensor *l2 = step(&n);
        ZT_CHECK(zs_graph_capture_end(g2) == ZS_OK && zs_graph_dce(g2, 1, &l2) >= 0 &&
                 zs_graph_plan_memory(g2, 1, &l2) == ZS_OK, "second graph: %s",
                 zs_last_error());
        zs_graph_stats a, b;
        zs_graph_get_stats(g2, &a);
        zs_fill_(n.fg, 0.0);
        zs_alloc_stats a0, a1;
        zs_alloc_get_stats(&a0);
        zs_alloc_fail_after((int64_t)blocks1); /* the last one: the new arena */
        zs_status st = zs_graph_replay(g2);
        zs_alloc_fail_after(0);
        zs_alloc_get_stats(&a1);
        first_blocks = a1.n_allocs - a0.n_allocs;
        zs_graph_get_stats(g2, &b);
        ZT_CHECK(st == ZS_OK, "the replay survives a failed re-plan: %s", zs_last_error());
        ZT_CHECK(b.scratch_nodes == 0 && b.planned_bytes == a.planned_bytes &&
                 zs_graph_plan_verify(g2) == ZS_OK, "the old plan stays (%d scratch "
                 "nodes, arena %zu -> %zu bytes)", b.scratch_nodes, a.planned_bytes,
                 b.planned_bytes);
        ZT_CHECK(same_bits(l2, le) && same_bits(n.fg, ge), "replay = eager, bit for bit");
        ZT_CHECK(replay(&n, g2, &blocks, &above) == ZS_OK && blocks > 0 &&
                 same_bits(l2, le) && same_bits(n.fg, ge), "it replays on, its kernels' "
                 "scratch from the cache (%llu blocks): %s", (unsigned long long)blocks,
                 zs_last_error());
        zs_graph_free(g2);
        zs_release(l2);
    }
    /* the failed request is not counted; the old-size arena in its place is */
    ZT_CHECK(first_blocks == blocks1, "the injected failure hit the arena (%llu blocks "
             "taken, %llu by the first graph's first replay)",
             (unsigned long long)first_blocks, (unsigned long long)blocks1);
    zt_section("a re-plan without memory keeps the old plan");

    zsi_gnode *nd = g->nodes[at];
    ZT_CHECK(!nd->run, "node %d runs its kernel", at);
    if (!nd->run) {
        nd->run = leaky_run;
        ZT_EXPECT_ERROR(zs_graph_replay(g) != ZS_OK, "kept 1 block of its scratch");
        ZT_EXPECT_ERROR(zs_graph_replay(g) != ZS_OK, "unusable");
    }
    zt_section("scratch kept past a node's end fails the graph");

    zs_graph_free(g);
    zs_scope_pop();
    zs_release(le);
    zs_release(lg);
    zs_module_free(n.m);
    zs_release(n.x);
    zs_release(n.y);
    return zt_done();
}
