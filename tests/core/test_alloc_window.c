/*
 * test_alloc_window.c - scratch windows of the host allocator
 * (src/core/alloc.c, core/internal.h): a graph node's kernel temporaries
 * served from a region of the graph's arena.
 *
 * - Served: blocks come from the region, back to back (64-byte header,
 *   size rounded to 64), without raising current_bytes; they form a
 *   stack: freeing the top block pops it and the freed blocks under it, a
 *   block freed below the top waits for them; a request that does not fit
 *   goes to the cache, outside the region, and the high-water mark says
 *   what it would have needed; a block still held at close is reported
 *   (live).
 * - Measured (base NULL): requests go to the cache, and the high-water
 *   mark is what the served window would have needed, for random
 *   sequences of nested allocations and frees (from a printed seed),
 *   checked by serving the same sequence from a region of exactly that
 *   many bytes: every block lands inside it.
 * - Threads: allocations in chunks of a zs_parallel_for issued by the
 *   window's thread (pool workers included, 4 threads) are the window's;
 *   a thread of its own is not; a second window while one is open is
 *   refused; a block freed after close, and the next window, do not mix
 *   counts.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "core/internal.h"
#include "testutil.h"

enum { REGION = 1 << 20 };
static _Alignas(64) unsigned char region[REGION];

static bool inside(const void *p, const void *base, size_t n)
{
    return (const unsigned char *)p >= (const unsigned char *)base &&
           (const unsigned char *)p < (const unsigned char *)base + n;
}

static void test_served(void)
{
    zs_alloc_stats a, b;
    zs_alloc_get_stats(&a);
    ZT_CHECK(zsi_alloc_window_open(region, REGION), "a window opens");
    void *p = zs_alloc(100), *q = zs_alloc(1);
    zs_alloc_get_stats(&b);
    ZT_CHECK(p == region + 64 && q == region + 64 + 128 + 64,
             "blocks back to back after 64-byte headers (%p, %p; region %p)", p, q,
             (void *)region);
    ZT_CHECK(b.current_bytes == a.current_bytes, "window blocks are the region's "
             "bytes, not the allocator's (%llu -> %llu)",
             (unsigned long long)a.current_bytes, (unsigned long long)b.current_bytes);
    void *big = zs_alloc(REGION); /* cannot fit: the cache serves it */
    ZT_CHECK(big && !inside(big, region, REGION), "an oversized request is "
             "served outside the region");
    zs_free(big);
    zs_free(q);
    zs_free(p);
    void *r = zs_alloc(5000);
    ZT_CHECK(r == region + 64, "all blocks free: the region is reused from its start");
    int64_t live = -1;
    size_t high = zsi_alloc_window_close(&live);
    ZT_CHECK(live == 1, "the block held at close is reported (%lld)", (long long)live);
    ZT_CHECK(high == 64 + 128 + 64 + 64 + zsi_alloc_window_block(REGION),
             "high-water mark %zu: what the oversized block would have needed", high);
    zs_free(r); /* after close: counted by no window */
    void *s = zs_alloc(64);
    ZT_CHECK(s && !inside(s, region, REGION), "no window: the cache serves");
    zs_free(s);
    ZT_CHECK(zsi_alloc_window_open(region, REGION), "a new window opens");
    ZT_CHECK(zs_alloc(8) == region + 64, "and starts at the region's start");
    ZT_CHECK(zsi_alloc_window_close(&live) == 128 && live == 1, "its own counts only");
    ZT_CHECK(zsi_alloc_window_open(region, REGION), "and again");
    void *a1 = zs_alloc(1), *b2 = zs_alloc(1), *c = zs_alloc(1);
    zs_free(b2); /* below the top: waits */
    void *d = zs_alloc(1);
    ZT_CHECK(d == region + 3 * 128 + 64, "a block freed below the top is not reused "
             "before the top goes");
    zs_free(d);
    zs_free(c); /* the top: pops b2 with it */
    void *e = zs_alloc(1);
    ZT_CHECK(e == region + 128 + 64, "popping the top pops the freed blocks under it");
    zs_free(e);
    zs_free(a1);
    ZT_CHECK(zsi_alloc_window_close(&live) == 4 * 128 && live == 0, "counts");
}

/* A random sequence of allocations and frees (a stack with random pops),
 * replayed the same way under a measuring window and a served one. */
static void run_sequence(uint64_t seed, void **hold, int n, bool check_in, size_t cap)
{
    zt_irand_seed(seed);
    int top = 0;
    for (int i = 0; i < n; i++) {
        if (top > 0 && zt_irand(0, 2) == 0) {
            int k = (int)zt_irand(0, top - 1); /* any held block */
            zs_free(hold[k]);
            hold[k] = hold[--top];
            continue;
        }
        size_t sz = (size_t)zt_irand(1, 3000);
        hold[top] = zs_alloc(sz);
        ZT_CHECK(!check_in || inside(hold[top], region, cap),
                 "step %d: %zu bytes served outside the measured %zu (seed %llu)", i,
                 sz, cap, (unsigned long long)seed);
        top++;
    }
    while (top > 0)
        zs_free(hold[--top]);
}

static void test_measured(void)
{
    void *hold[200];
    for (uint64_t seed = 0x5C7A; seed < 0x5C7A + 20; seed++) {
        int64_t live = -1;
        ZT_CHECK(zsi_alloc_window_open(NULL, 0), "a measuring window opens");
        run_sequence(seed, hold, 150, false, 0);
        size_t high = zsi_alloc_window_close(&live);
        ZT_CHECK(live == 0 && high > 0 && high <= REGION, "seed %llu: measured %zu "
                 "bytes, %lld live", (unsigned long long)seed, high, (long long)live);
        if (high > REGION)
            continue;
        ZT_CHECK(zsi_alloc_window_open(region, high), "a window of that size");
        run_sequence(seed, hold, 150, true, high);
        size_t again = zsi_alloc_window_close(&live);
        ZT_CHECK(again == high && live == 0, "served, the same high-water mark "
                 "(%zu vs %zu)", again, high);
    }
}

typedef struct par {
    atomic_int in, out;
} par;

static void chunk_alloc(void *ctx, int64_t b, int64_t e)
{
    par *p = ctx;
    for (int64_t i = b; i < e; i++) {
        void *x = zs_alloc(256);
        atomic_fetch_add(inside(x, region, REGION) ? &p->in : &p->out, 1);
        zs_free(x);
    }
}

static void *other_thread(void *arg)
{
    void **out = arg;
    *out = zs_alloc(64);
    return NULL;
}

static void *open_second(void *arg)
{
    *(bool *)arg = zsi_alloc_window_open(NULL, 0);
    return NULL;
}

static void test_threads(void)
{
    zs_set_num_threads(4);
    par p = {0, 0};
    ZT_CHECK(zsi_alloc_window_open(region, REGION), "window");
    zs_parallel_for(64, 1, chunk_alloc, &p);
    void *theirs = NULL;
    pthread_t t;
    ZT_CHECK(pthread_create(&t, NULL, other_thread, &theirs) == 0, "thread");
    pthread_join(t, NULL);
    ZT_CHECK(theirs && !inside(theirs, region, REGION),
             "a thread outside the window's jobs takes from the cache");
    int64_t live = -1;
    zsi_alloc_window_close(&live);
    ZT_CHECK(atomic_load(&p.in) == 64 && atomic_load(&p.out) == 0,
             "every chunk's block from the window (%d in, %d out)",
             atomic_load(&p.in), atomic_load(&p.out));
    ZT_CHECK(live == 0, "all given back (%lld live)", (long long)live);
    ZT_CHECK(zsi_alloc_window_open(region, REGION), "window again");
    bool second = true;
    ZT_CHECK(pthread_create(&t, NULL, open_second, &second) == 0, "thread");
    pthread_join(t, NULL);
    ZT_CHECK(!second, "a second window while one is open is refused");
    zsi_alloc_window_close(&live);
    zs_free(theirs);
}

int main(void)
{
    test_served();
    test_measured();
    test_threads();
    return zt_done();
}
