/*
 * test_buckets.c - the bucket engine (src/parallel/buckets.c) that data
 * parallelism and ZeRO share, in one process.
 *
 * Checked: planning by size (bucket 0 ends the buffer, buckets of whole
 * parameters close once they reach the limit, the last reaches 0) and by
 * units (one bucket per run, a unit split in two is an error); readiness
 * from real backward passes: buckets are handed over strictly in index
 * order even when backward finishes them in the opposite order, each with
 * the list of its ready leaves; a bucket whose parameter backward never
 * reached starts only at finish; two engines listening to the same
 * backward (two grad-ready hooks) both see every leaf.
 */
#include <stdlib.h>
#include <string.h>

#include "parallel/internal.h"
#include "testutil.h"

#define NP 4
static const int64_t sizes[NP] = {10, 20, 30, 40}; /* offsets 0, 10, 30, 60; total 100 */

typedef struct ev_log {
    int order[16], n;   /* buckets in the order they were handed over */
    int events;         /* grad-ready events handled */
    int events_at_first; /* events seen when the first bucket started */
} ev_log;

static void on_ready(void *ctx, int k)
{
    ev_log *l = ctx;
    if (l->n == 0)
        l->events_at_first = l->events;
    if (l->n < 16)
        l->order[l->n++] = k;
}

static void on_event(void *ctx) { ((ev_log *)ctx)->events++; }

static const zsi_bucket_ops ops = {on_ready, on_event};

typedef struct model {
    zs_module *m;
    zs_tensor *fp, *fg, *p[NP];
} model;

static void model_init(model *md)
{
    md->m = zs_module_new(NULL, NULL);
    for (int i = 0; i < NP; i++) {
        char name[8];
        snprintf(name, sizeof name, "p%d", i);
        zs_module_add_param(md->m, name, zs_full(ZS_F32, 1, &sizes[i], 0.01 * (i + 1)));
    }
    zs_module_flatten(md->m, &md->fp, &md->fg);
    zs_tensor **ps;
    char **names;
    zs_module_parameters(md->m, &ps, &names);
    memcpy(md->p, ps, sizeof md->p);
    zs_names_free(NP, ps, names);
}

static void test_plan(void)
{
    model md;
    model_init(&md);
    ev_log l = {0};
    /* limit 35 elements: p3 (40) alone, then p2 + p1 (50 >= 35), then p0 */
    zsi_buckets *e = zsi_buckets_new("test", NP, md.p, md.fg, true, 35, NULL, &ops, &l);
    ZT_CHECK(e && e->nb == 3, "3 buckets by size (%d)", e ? e->nb : -1);
    if (e) {
        const zsi_bucket *b = e->b;
        ZT_CHECK(b[0].lo == 60 && b[0].len == 40 && b[0].nparams == 1 &&
                 b[1].lo == 10 && b[1].len == 50 && b[1].nparams == 2 &&
                 b[2].lo == 0 && b[2].len == 10 && b[2].nparams == 1,
                 "buckets [60,100) [10,60) [0,10)");
        ZT_CHECK(zsi_buckets_find(e, 99) == 0 && zsi_buckets_find(e, 10) == 1 &&
                 zsi_buckets_find(e, 0) == 2 && zsi_buckets_find(e, 100) == -1,
                 "find");
    }
    zsi_buckets_free(e);
    e = zsi_buckets_new("test", NP, md.p, md.fg, true, 0, NULL, &ops, &l);
    ZT_CHECK(e && e->nb == 1 && e->b[0].len == 100, "limit 0: one bucket");
    zsi_buckets_free(e);
    const int units[NP] = {-1, 0, 0, 1}, split[NP] = {0, 1, 0, -1};
    e = zsi_buckets_new("test", NP, md.p, md.fp, false, 0, units, &ops, &l);
    ZT_CHECK(e && e->nb == 3 && e->b[0].group == 1 && e->b[1].group == 0 &&
             e->b[1].nparams == 2 && e->b[2].group == -1, "by units: 1, 0 (two), kept");
    zsi_buckets_free(e);
    ZT_EXPECT_ERROR(zsi_buckets_new("test", NP, md.p, md.fp, false, 0, split, &ops, &l) ==
                    NULL, "unit 0 are not contiguous");
    zs_tensor *stray = zs_zeros(ZS_F32, 1, (int64_t[]){4});
    zs_set_requires_grad(stray, true);
    ZT_EXPECT_ERROR(zsi_buckets_new("test", 1, &stray, md.fp, false, 0, NULL, &ops, &l) ==
                    NULL, "not a view of the flat parameter buffer");
    zs_release(stray);
    zs_module_free(md.m);
    zt_section("planning: by size from the end, by units, errors");
}

/* L = sum(exp(exp(exp(p3) * p2) * p1) * p0) over the first 10 elements:
 * backward (depth first, last input first) finishes p0 first and p3 last,
 * the opposite of bucket order (bucket 0 holds p3). skip_p1: p1 is left
 * out of the graph. */
static zs_status run_backward(model *md, bool skip_p1)
{
    zs_tensor *v[NP] = {NULL}; /* made in chain order, as a model would */
    v[3] = zs_narrow(md->p[3], 0, 0, 10);
    zs_tensor *x = zs_exp(v[3]);
    for (int i = 2; i >= 0; i--) {
        if (i == 1 && skip_p1)
            continue;
        v[i] = zs_narrow(md->p[i], 0, 0, 10);
        zs_tensor *m = zs_mul(x, v[i]);
        zs_release(x);
        x = i ? zs_exp(m) : zs_retain(m);
        zs_release(m);
    }
    zs_tensor *l = zs_sum(x, 0, NULL, false);
    zs_status st = zs_backward(l, NULL, false);
    zs_release(l);
    zs_release(x);
    for (int i = 0; i < NP; i++)
        zs_release(v[i]);
    return st;
}

static void test_order(void)
{
    model md;
    model_init(&md);
    ev_log a = {0}, b = {0};
    /* limit 1: one bucket per parameter, bucket k holds p(3-k) */
    zsi_buckets *e = zsi_buckets_new("a", NP, md.p, md.fg, true, 1, NULL, &ops, &a);
    zsi_buckets *f = zsi_buckets_new("b", NP, md.p, md.fp, false, 1, NULL, &ops, &b);
    ZT_CHECK(e && f && e->nb == NP && f->nb == NP, "one bucket per parameter");
    if (!e || !f) {
        zsi_buckets_free(e);
        zsi_buckets_free(f);
        zs_module_free(md.m);
        return;
    }
    ZT_CHECK(zsi_buckets_begin(e, true) == ZS_OK && zsi_buckets_begin(f, true) == ZS_OK,
             "two engines listening");
    ZT_CHECK(run_backward(&md, false) == ZS_OK, "backward");
    ZT_CHECK(a.n == NP && a.order[0] == 0 && a.order[1] == 1 && a.order[2] == 2 &&
             a.order[3] == 3, "buckets handed over in index order (%d %d %d %d)",
             a.order[0], a.order[1], a.order[2], a.order[3]);
    ZT_CHECK(a.events == NP && a.events_at_first == NP - 1,
             "nothing starts before bucket 0's last leaf (%d events before the first)",
             a.events_at_first);
    ZT_CHECK(b.n == NP && b.events == NP, "the second engine saw every leaf too (%d, %d)",
             b.n, b.events);
    ZT_CHECK(e->b[0].nready == 0 && e->next == NP, "ready lists emptied once started");
    zsi_buckets_finish(e, true);
    zsi_buckets_finish(f, true);
    ZT_CHECK(a.n == NP, "finish starts nothing more");
    /* p1 unreached: buckets 0, 1 start in backward, 2 (p1) and 3 wait for
     * finish */
    memset(&a, 0, sizeof a);
    ZT_CHECK(zsi_buckets_begin(e, true) == ZS_OK, "begin again");
    ZT_CHECK(run_backward(&md, true) == ZS_OK, "backward without p1");
    ZT_CHECK(a.n == 2 && a.order[1] == 1, "two buckets started in backward (%d)", a.n);
    zsi_buckets_finish(e, true);
    ZT_CHECK(a.n == NP && a.order[2] == 2 && a.order[3] == 3, "finish starts the rest, "
             "in order");
    ZT_CHECK(zsi_buckets_begin(e, false) == ZS_OK && run_backward(&md, false) == ZS_OK,
             "a round without listening");
    zsi_buckets_finish(e, false);
    ZT_CHECK(a.n == NP && a.events == 3, "not listening: no event, nothing started");
    zsi_buckets_free(e);
    zsi_buckets_free(f);
    zs_module_free(md.m);
    zt_section("readiness: index order whatever backward's order, forced at finish, "
               "two engines on one backward");
}

int main(void)
{
    test_plan();
    test_order();
    return zt_done();
}
