/*
 * test_thread_pool.c - zs_parallel_for (src/core/thread.c) back to back
 * with a chunk count that changes from call to call, on a pool of 16
 * threads whatever the machine (2 cores make workers late often enough).
 *
 * Calls alternate between few chunks (2, 3) and one per thread, each with
 * its job on the caller's stack, poisoned as soon as the call returns.
 * Every item must be run exactly once per call, and no chunk may see a
 * job that is not its own (a poisoned or foreign one). This is the race of
 * issue 30: a worker late for a finished 2-chunk job read its stale claim
 * ("chunk 2") and the next job's count of 16, won chunk 2 before the new
 * claim was published, and let the new owner return while a chunk still
 * ran on its frame (zs serve crashed in lin_items under load on 16 cores).
 * Before the fix, 10^6 calls here (about 4 s) gave some wrong items on 2
 * busy cores in 5 runs of 5 (10^5 calls: 1 run in 2).
 */
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "testutil.h"

enum { POOL = 16, MAX_ITEMS = 64, MAGIC = 0x5eed1e55 };

typedef struct job {
    unsigned magic;
    int64_t n;
    atomic_int *hits; /* [n] */
} job;

static atomic_long foreign; /* chunks that saw a job not theirs */

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void body(void *ctx, int64_t b, int64_t e)
{
    job *j = ctx;
    if (j->magic != MAGIC || b < 0 || e > j->n) {
        atomic_fetch_add(&foreign, 1);
        return;
    }
    for (int64_t i = b; i < e; i++)
        atomic_fetch_add(&j->hits[i], 1);
}

/* One call of n items in chunks of grain; the items not run exactly once. */
static int64_t call(int64_t n, int64_t grain)
{
    atomic_int hits[MAX_ITEMS];
    for (int64_t i = 0; i < n; i++)
        atomic_init(&hits[i], 0);
    job j = {MAGIC, n, hits};
    zs_parallel_for(n, grain, body, &j);
    int64_t wrong = 0;
    for (int64_t i = 0; i < n; i++)
        wrong += atomic_load(&hits[i]) != 1;
    /* a chunk still running on this job from now on sees the poison */
    atomic_store((_Atomic unsigned *)&j.magic, 0u);
    return wrong;
}

/* zs_cpu_count, the pool's default size, follows the affinity mask (a
 * container's cpuset, taskset): one CPU allowed, one counted. */
static void test_cpu_count(void)
{
    cpu_set_t all, one;
    ZT_CHECK(sched_getaffinity(0, sizeof all, &all) == 0, "sched_getaffinity");
    int n = zs_cpu_count(), online = (int)sysconf(_SC_NPROCESSORS_ONLN);
    ZT_CHECK(n >= 1 && n <= online && n <= CPU_COUNT(&all),
             "zs_cpu_count %d: at least 1, at most the %d online and %d allowed", n, online,
             CPU_COUNT(&all));
    int first = 0;
    while (!CPU_ISSET(first, &all))
        first++;
    CPU_ZERO(&one);
    CPU_SET(first, &one);
    ZT_CHECK(sched_setaffinity(0, sizeof one, &one) == 0, "sched_setaffinity");
    ZT_CHECK(zs_cpu_count() == 1, "one CPU in the affinity mask: zs_cpu_count %d",
             zs_cpu_count());
    ZT_CHECK(sched_setaffinity(0, sizeof all, &all) == 0, "affinity restored");
    zt_section("zs_cpu_count follows the affinity mask");
}

/* The pool's default size (read once, at the first pool call: this runs
 * before any) as the second of two unbound ranks of an OpenMPI job on
 * this host: half the CPUs, at least 1; bound ranks (a mask smaller than
 * the online CPUs) keep their mask's count. */
static void test_default_split(void)
{
    unsetenv("ZS_NUM_THREADS");
    setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "2", 1);
    cpu_set_t all;
    sched_getaffinity(0, sizeof all, &all);
    int n = zs_cpu_count(), want = n;
    if (CPU_COUNT(&all) >= sysconf(_SC_NPROCESSORS_ONLN))
        want = n / 2 >= 1 ? n / 2 : 1;
    ZT_CHECK(zs_local_ranks() == 2, "zs_local_ranks reads the launcher: %d", zs_local_ranks());
    ZT_CHECK(zs_num_threads() == want, "2 local ranks, %d usable CPUs: %d threads by "
             "default (want %d)", n, zs_num_threads(), want);
    unsetenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    zt_section("unbound ranks of one host split its CPUs");
}

int main(void)
{
    test_cpu_count();
    test_default_split();
    zs_set_num_threads(POOL);
    int nt = zs_num_threads();
    ZT_CHECK(nt == POOL, "a pool of %d threads (got %d)", POOL, nt);
    const char *e = getenv("ZS_POOL_CALLS");
    long calls = e ? atol(e) : 1000000, done = 0;
    int64_t wrong = 0;
    double t0 = now_s();
    for (; done < calls && now_s() - t0 < 20; done++) {
        int64_t n = done % 2 ? MAX_ITEMS : 2 + done / 2 % 2; /* 2, 16, 3, 16, ... */
        wrong += call(n, done % 4 == 3 ? 4 : 1);
    }
    ZT_CHECK(wrong == 0 && atomic_load(&foreign) == 0,
             "%ld calls: %lld items not run exactly once, %ld chunks ran on a job not "
             "theirs", done, (long long)wrong, atomic_load(&foreign));
    printf("%ld calls of 2, 3 and %d chunks back to back on %d threads: every item once, "
           "every chunk on its own job\n", done, nt, nt);
    zt_section("parallel_for: chunk counts that change between calls");
    return zt_done();
}
