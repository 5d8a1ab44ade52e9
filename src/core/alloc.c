/*
 * alloc.c - 64-byte aligned host allocator with a size-class cache.
 *
 * Blocks are rounded up to a size class (four classes per power of two, so
 * at most 25% waste) and, when freed, kept on a per-class free list instead
 * of going back to the system. A training loop that allocates the same
 * sizes every step therefore stops calling malloc after its first step and
 * never faults fresh pages in again (a first touch costs 10-15 us/4 KiB).
 * Small blocks (< 256 B) use the same path; zs_alloc_trim empties the cache.
 *
 * Every block carries a 64-byte header holding its class, so zs_free needs
 * no lookup. current/peak count the bytes handed out (class sizes).
 * Thread-safe (one mutex; allocation is not on any hot inner loop).
 *
 * Blocks of HUGE_MIN bytes and more ask Linux for transparent huge pages
 * (madvise MADV_HUGEPAGE on their 2 MiB-aligned interior, which is what
 * this machine's "madvise" THP mode serves): inference streams ~100 MB of
 * weights and the KV cache per token, and with 4 KiB pages every 4 KiB of
 * that stream is a TLB miss and a page walk. A hint only: where THP is off
 * or no huge page is free, the block is ordinary memory.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "zs/core.h"

#define HDR 64
#define NCLASS 256
#define HUGE_MIN ((size_t)4 << 20)
#define HUGE_PAGE ((uintptr_t)2 << 20)

typedef struct block {
    struct block *next; /* free-list link while cached */
    uint32_t cls;       /* EXACT: a zs_alloc_exact block of `bytes` */
    uint32_t magic;
    size_t bytes;
} block;

#define EXACT 0xffffffffu

#define MAGIC 0x5a53a110u

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static block *free_list[NCLASS];
static zs_alloc_stats stats;
static int64_t fail_countdown;

/* Class c covers sizes up to class_size(c): 64, 80, 96, 112, 128, 160, ... */
static size_t class_size(uint32_t c)
{
    uint32_t p = c / 4, q = c % 4;
    return ((size_t)64 << p) + (((size_t)64 << p) / 4) * q;
}

static int size_class(size_t n)
{
    for (uint32_t c = 0; c < NCLASS; c++) {
        size_t s = class_size(c);
        if (s >= n)
            return (int)c;
        if (c / 4 > 48)
            break;
    }
    return -1;
}

void zs_alloc_fail_after(int64_t n)
{
    pthread_mutex_lock(&mu);
    fail_countdown = n;
    pthread_mutex_unlock(&mu);
}

void *zs_alloc(size_t nbytes)
{
    int c = size_class(nbytes ? nbytes : 1);
    if (c < 0) {
        zs_set_error_code(ZS_ERR_NOMEM, "alloc: %zu bytes is too large",
                          nbytes);
        return NULL;
    }
    size_t sz = class_size((uint32_t)c);
    pthread_mutex_lock(&mu);
    if (fail_countdown > 0 && --fail_countdown == 0) {
        pthread_mutex_unlock(&mu);
        zs_set_error_code(ZS_ERR_NOMEM,
                          "alloc: out of memory (%zu bytes, injected)", nbytes);
        return NULL;
    }
    block *b = free_list[c];
    if (b) {
        free_list[c] = b->next;
        stats.cached_bytes -= sz;
    }
    pthread_mutex_unlock(&mu);
    if (!b) {
        void *p = NULL;
        if (posix_memalign(&p, 64, HDR + sz) != 0 || !p) {
            zs_set_error_code(ZS_ERR_NOMEM, "alloc: out of memory (%zu bytes)",
                              nbytes);
            return NULL;
        }
        b = p;
        if (sz >= HUGE_MIN)
            zs_advise_huge(p, HDR + sz);
        b->cls = (uint32_t)c;
        b->magic = MAGIC;
        pthread_mutex_lock(&mu);
        stats.n_system++;
        pthread_mutex_unlock(&mu);
    }
    pthread_mutex_lock(&mu);
    stats.n_allocs++;
    stats.current_bytes += sz;
    if (stats.current_bytes > stats.peak_bytes)
        stats.peak_bytes = stats.current_bytes;
    pthread_mutex_unlock(&mu);
    return (char *)b + HDR;
}

void zs_advise_huge(void *p, size_t n)
{
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    uintptr_t lo = ((uintptr_t)p + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1);
    uintptr_t hi = ((uintptr_t)p + n) & ~(HUGE_PAGE - 1);
    if (hi > lo)
        (void)madvise((void *)lo, hi - lo, MADV_HUGEPAGE);
#else
    (void)p, (void)n;
#endif
}

/* Exact blocks: one-off buffers of hundreds of MiB (a graph's arena)
 * would waste up to a quarter of themselves in a size class; they are
 * rounded to 4 KiB, counted at that size and given back on free. */
void *zs_alloc_exact(size_t nbytes)
{
    size_t sz = ((nbytes ? nbytes : 1) + 4095) & ~(size_t)4095;
    pthread_mutex_lock(&mu);
    bool fail = fail_countdown > 0 && --fail_countdown == 0;
    pthread_mutex_unlock(&mu);
    void *p = NULL;
    if (fail || posix_memalign(&p, 64, HDR + sz) != 0 || !p) {
        zs_set_error_code(ZS_ERR_NOMEM, "alloc: out of memory (%zu bytes%s)", nbytes,
                          fail ? ", injected" : "");
        return NULL;
    }
    block *b = p;
    if (sz >= HUGE_MIN)
        zs_advise_huge(p, HDR + sz);
    b->cls = EXACT;
    b->magic = MAGIC;
    b->bytes = sz;
    pthread_mutex_lock(&mu);
    stats.n_allocs++;
    stats.n_system++;
    stats.current_bytes += sz;
    if (stats.current_bytes > stats.peak_bytes)
        stats.peak_bytes = stats.current_bytes;
    pthread_mutex_unlock(&mu);
    return (char *)b + HDR;
}

void zs_free(void *p)
{
    if (!p)
        return;
    block *b = (block *)((char *)p - HDR);
    if (b->magic != MAGIC)
        abort(); /* internal invariant: not our block */
    if (b->cls == EXACT) {
        pthread_mutex_lock(&mu);
        stats.current_bytes -= b->bytes;
        pthread_mutex_unlock(&mu);
        b->magic = 0;
        free(b);
        return;
    }
    size_t sz = class_size(b->cls);
    pthread_mutex_lock(&mu);
    stats.current_bytes -= sz;
    stats.cached_bytes += sz;
    b->next = free_list[b->cls];
    free_list[b->cls] = b;
    pthread_mutex_unlock(&mu);
}

void zs_alloc_get_stats(zs_alloc_stats *st)
{
    pthread_mutex_lock(&mu);
    *st = stats;
    pthread_mutex_unlock(&mu);
}

void zs_alloc_reset_peak(void)
{
    pthread_mutex_lock(&mu);
    stats.peak_bytes = stats.current_bytes;
    pthread_mutex_unlock(&mu);
}

void zs_alloc_trim(void)
{
    pthread_mutex_lock(&mu);
    for (int c = 0; c < NCLASS; c++) {
        while (free_list[c]) {
            block *b = free_list[c];
            free_list[c] = b->next;
            free(b);
        }
    }
    stats.cached_bytes = 0;
    pthread_mutex_unlock(&mu);
}

/* Hand the cache back at exit so LeakSanitizer sees no leak. */
__attribute__((destructor)) static void alloc_fini(void) { zs_alloc_trim(); }
