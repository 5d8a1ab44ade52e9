/*
 * thread.c - the persistent thread pool behind zs_parallel_for.
 *
 * One pool per process, sized by ZS_NUM_THREADS or zs_cpu_count() (the
 * online CPUs this process may use: affinity and cgroup quota).
 * A call splits [0, n) into at most one chunk per thread (at least `grain`
 * items each: even static splits suit the memory-bound kernels best) and
 * publishes the job by bumping a generation counter; every thread, the
 * caller included, then claims chunks from a shared counter. Workers spin briefly
 * on that counter before sleeping on a condition variable, so back-to-back
 * calls (one per operator) cost a few microseconds, not a wake-up each;
 * bench/threadpool measures it.
 *
 * Calls made from inside a pool task, or while another thread owns the
 * pool, run serially on the calling thread.
 *
 * Threads: the pool serves one call at a time. `owner` is taken with a
 * trylock, so a user thread that finds the pool busy runs its whole range
 * inline instead of waiting (no interleaving of two jobs' chunks, no
 * deadlock when jobs nest or threads contend); the kernels split work by
 * zs_num_threads(), not by who runs a chunk, so the result is the same.
 * The job fields (fn, ctx, n, scope) are written by the owner before it publishes
 * the job (release store of `claim`) and read by a worker only after it
 * claimed a chunk of that job (acquire CAS), while the owner still waits
 * for that chunk.
 *
 * `claim` packs the generation, the job's chunk count and the next chunk
 * into one word, so a worker decides "is there a chunk left of the job I
 * woke for" from one load. (The count once lived in a field of its own:
 * a worker that arrived late for a finished job of 2 chunks could read
 * the stale claim "chunk 2", then the next owner's count of 16, and its
 * CAS won chunk 2 before the new job's claim was stored. It ran a chunk of
 * a half-written job and decremented the new job's pending count, so
 * that owner returned while a chunk still ran on its stack frame: lost or
 * doubled items and crashes (zs serve under load on 16 cores, issue 30;
 * tests/core/test_thread_pool.c).)
 */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#include "core/internal.h"
#include "zs/core.h"

#define SPIN_ITERS 20000

typedef struct pool {
    atomic_int nthreads; /* including the caller; written under owner */
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_mutex_t owner; /* held by the thread running a parallel_for */
    atomic_uint_fast64_t generation;
    atomic_int pending; /* chunks not yet finished */
    /* generation << 20 | chunks << 10 | next chunk (CLAIM_*): a claim
     * succeeds only for the job of the generation the claimer saw and only
     * below that job's own chunk count, so a late worker never runs a
     * chunk of a finished job or of a newer one. */
    atomic_uint_fast64_t claim;
    atomic_bool stop;
    /* current job */
    zs_range_fn fn;
    void *ctx;
    int64_t n;
    uint64_t scope; /* the owner's zsi_alloc_scope: its chunks' allocations
                     * belong to the owner's scratch window (alloc.c) */
} pool;

/* The fields of `claim`: chunks (at most 256 threads) and the next chunk
 * take 10 bits each, the generation the 44 above them. */
#define CLAIM_GEN(t) ((t) >> 20)
#define CLAIM_CHUNKS(t) ((int64_t)((t) >> 10 & 0x3ff))
#define CLAIM_NEXT(t) ((int64_t)((t)&0x3ff))
#define CLAIM_GEN_MASK ((UINT64_C(1) << 44) - 1)

static pool P = {.mu = PTHREAD_MUTEX_INITIALIZER,
                 .cv = PTHREAD_COND_INITIALIZER,
                 .owner = PTHREAD_MUTEX_INITIALIZER};
static pthread_once_t pool_once = PTHREAD_ONCE_INIT;
static _Thread_local int thread_index;
static _Thread_local bool in_task;

static void run_chunk(int64_t c, int64_t nchunks)
{
    int64_t b = P.n * c / nchunks, e = P.n * (c + 1) / nchunks;
    if (b < e)
        P.fn(P.ctx, b, e);
}

static void work_on(uint_fast64_t gen)
{
    for (;;) {
        uint_fast64_t t = atomic_load_explicit(&P.claim, memory_order_acquire);
        if (CLAIM_GEN(t) != (gen & CLAIM_GEN_MASK))
            return;
        int64_t c = CLAIM_NEXT(t), nchunks = CLAIM_CHUNKS(t);
        if (c >= nchunks)
            return;
        if (atomic_compare_exchange_weak_explicit(&P.claim, &t, t + 1,
                                                  memory_order_acq_rel,
                                                  memory_order_acquire)) {
            /* chunk c of the job of gen: its owner waits for it */
            uint64_t mine = zsi_alloc_scope;
            zsi_alloc_scope = P.scope;
            run_chunk(c, nchunks);
            zsi_alloc_scope = mine;
            atomic_fetch_sub_explicit(&P.pending, 1, memory_order_release);
        }
    }
}

static void *worker(void *arg)
{
    thread_index = (int)(intptr_t)arg;
    in_task = true;
    uint_fast64_t seen = atomic_load(&P.generation);
    for (;;) {
        uint_fast64_t g;
        int spins = 0;
        while ((g = atomic_load_explicit(&P.generation, memory_order_acquire)) == seen &&
               !atomic_load(&P.stop)) {
            if (++spins < SPIN_ITERS) {
                __builtin_ia32_pause();
                continue;
            }
            pthread_mutex_lock(&P.mu);
            while (atomic_load(&P.generation) == seen && !atomic_load(&P.stop))
                pthread_cond_wait(&P.cv, &P.mu);
            pthread_mutex_unlock(&P.mu);
        }
        if (atomic_load(&P.stop))
            return NULL;
        seen = g;
        work_on(g);
    }
}

static void pool_stop(void)
{
    if (!P.threads)
        return;
    pthread_mutex_lock(&P.mu);
    atomic_store(&P.stop, true);
    pthread_cond_broadcast(&P.cv);
    pthread_mutex_unlock(&P.mu);
    int nt = atomic_load_explicit(&P.nthreads, memory_order_relaxed);
    for (int i = 1; i < nt; i++)
        pthread_join(P.threads[i], NULL);
    free(P.threads);
    P.threads = NULL;
    atomic_store(&P.stop, false);
}

static void pool_start(int n)
{
    if (n < 1)
        n = 1;
    if (n > 256)
        n = 256;
    atomic_store_explicit(&P.nthreads, n, memory_order_relaxed);
    if (n == 1)
        return;
    P.threads = calloc((size_t)n, sizeof *P.threads);
    if (!P.threads) {
        atomic_store_explicit(&P.nthreads, 1, memory_order_relaxed);
        return;
    }
    for (int i = 1; i < n; i++) {
        if (pthread_create(&P.threads[i], NULL, worker, (void *)(intptr_t)i) != 0) {
            /* run with what started */
            atomic_store_explicit(&P.nthreads, i, memory_order_relaxed);
            break;
        }
    }
}

/* ZS_NUM_THREADS, else zs_cpu_count(); ranks that share the host unbound
 * (mpirun binds none when they outnumber the cores) split its CPUs, as
 * torchrun's one thread per rank does, so 4 ranks on 2 cores run 4
 * threads, not 8. */
static int default_threads(void)
{
    const char *e = getenv("ZS_NUM_THREADS");
    if (e && *e) {
        int n = atoi(e);
        if (n >= 1)
            return n;
    }
    long n = zs_cpu_count(), local = zs_local_ranks();
    if (local > 1 && zsi_affinity_cpus() >= sysconf(_SC_NPROCESSORS_ONLN)) /* not bound */
        n = n / local >= 1 ? n / local : 1;
    return (int)n;
}

static void pool_exit(void)
{
    pthread_mutex_lock(&P.owner);
    pool_stop();
    pthread_mutex_unlock(&P.owner);
}

static void pool_init(void)
{
    pool_start(default_threads());
    atexit(pool_exit);
}

int zs_num_threads(void)
{
    pthread_once(&pool_once, pool_init);
    return atomic_load_explicit(&P.nthreads, memory_order_relaxed);
}

void zs_set_num_threads(int n)
{
    pthread_once(&pool_once, pool_init);
    if (in_task)
        return;
    pthread_mutex_lock(&P.owner);
    pool_stop();
    pool_start(n);
    pthread_mutex_unlock(&P.owner);
}

int zs_thread_index(void) { return thread_index; }

void zs_parallel_for(int64_t n, int64_t grain, zs_range_fn fn, void *ctx)
{
    if (n <= 0)
        return;
    if (grain < 1)
        grain = 1;
    pthread_once(&pool_once, pool_init);
    int64_t nchunks = (n + grain - 1) / grain;
    int nt = atomic_load_explicit(&P.nthreads, memory_order_relaxed);
    if (nchunks > nt)
        nchunks = nt;
    if (nchunks <= 1 || in_task || pthread_mutex_trylock(&P.owner) != 0) {
        fn(ctx, 0, n);
        return;
    }
    P.fn = fn;
    P.ctx = ctx;
    P.n = n;
    P.scope = zsi_alloc_scope;
    atomic_store(&P.pending, (int)nchunks);
    uint_fast64_t g = atomic_load(&P.generation) + 1;
    atomic_store_explicit(&P.claim, (g & CLAIM_GEN_MASK) << 20 | (uint_fast64_t)nchunks << 10,
                          memory_order_release);
    pthread_mutex_lock(&P.mu);
    atomic_store_explicit(&P.generation, g, memory_order_release);
    pthread_cond_broadcast(&P.cv);
    pthread_mutex_unlock(&P.mu);
    in_task = true;
    work_on(g);
    in_task = false;
    while (atomic_load_explicit(&P.pending, memory_order_acquire) > 0)
        __builtin_ia32_pause();
    pthread_mutex_unlock(&P.owner);
}
