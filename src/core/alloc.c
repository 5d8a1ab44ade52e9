/*
 * alloc.c - 64-byte aligned host allocator with a size-class cache.
 *
 * Blocks are rounded up to a size class (four classes per power of two
 * below 1 MiB, so at most 25% waste, 32 from 1 MiB, at most 3.1%)
 * and, when freed, kept on a per-class free list instead
 * of going back to the system. A training loop that allocates the same
 * sizes every step therefore stops calling malloc after its first step and
 * never faults fresh pages in again (a first touch costs 10-15 us/4 KiB).
 * Small blocks (< 256 B) use the same path; zs_alloc_trim empties the cache.
 *
 * Every block carries a 64-byte header holding its class, so zs_free needs
 * no lookup. current/peak count the bytes handed out (class sizes).
 * Thread-safe (one mutex; allocation is not on any hot inner loop).
 *
 * Peak attribution (ZS_ALLOC_TRACE=1 in the environment at start; off, it
 * costs a test per call): the header also links every live block into a
 * list with the bytes asked for and the tags of its allocating thread
 * (zs_alloc_tag_push: the outermost and the two innermost), and each new
 * high-water mark snapshots the live blocks grouped by tags, so
 * zs_alloc_peak_report says what was held at the peak (alloc_trace part
 * below).
 *
 * Blocks of HUGE_MIN bytes and more ask Linux for transparent huge pages
 * (madvise MADV_HUGEPAGE on their 2 MiB-aligned interior, which is what
 * this machine's "madvise" THP mode serves): inference streams ~100 MB of
 * weights and the KV cache per token, and with 4 KiB pages every 4 KiB of
 * that stream is a TLB miss and a page walk. A hint only: where THP is off
 * or no huge page is free, the block is ordinary memory.
 */
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "core/internal.h"
#include "zs/core.h"

#define HDR 64
#define HUGE_MIN ((size_t)4 << 20)
#define HUGE_PAGE ((uintptr_t)2 << 20)

typedef struct block {
    struct block *next; /* free-list link while cached; live list (traced) */
    uint32_t cls;       /* EXACT: a zs_alloc_exact block of `bytes` */
    uint32_t magic;
    size_t bytes;
    struct block *prev; /* live list (traced) */
    size_t asked;       /* bytes asked for (traced) */
    const char *tag[3]; /* outermost, second innermost, innermost (traced) */
} block;
_Static_assert(sizeof(block) <= HDR, "the block header outgrew HDR");

static bool tracing;
static void trace_alloc(block *b, size_t asked);
static void trace_free(block *b);
static void trace_peak(void);

#define EXACT 0xffffffffu
#define WINDOW 0xfffffffeu /* a block inside a scratch window */

#define MAGIC 0x5a53a110u

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static zs_alloc_stats stats;
static int64_t fail_countdown;

/* Class c covers sizes up to class_size(c): below FINE_MIN four classes per
 * power of two (64, 80, 96, 112, 128, 160, ...), from it FINE_DIV (at most
 * 3.1% rounding: a training step's large blocks, its model state and
 * activations, are held at the peak, so their rounding is peak memory;
 * four classes rounded a 12.8 MiB flat buffer up to 14 MiB, sixteen a
 * 13.5 MiB one to 14). Sizes reach 64 << 48 bytes. */
#define FINE_P 14 /* FINE_MIN = 64 << FINE_P = 1 MiB */
#define FINE_DIV 32u
#define CLASS_BASE(p) ((p) < FINE_P ? 4u * (p) : 4u * FINE_P + FINE_DIV * ((p) - FINE_P))
#define MAX_P 48
#define NCLASS ((int)CLASS_BASE(MAX_P) + 1)

static size_t class_size(uint32_t c)
{
    uint32_t p = c < 4 * FINE_P ? c / 4 : FINE_P + (c - 4 * FINE_P) / FINE_DIV;
    uint32_t q = c - CLASS_BASE(p), div = p < FINE_P ? 4 : FINE_DIV;
    return ((size_t)64 << p) + (((size_t)64 << p) / div) * q;
}

static block *free_list[NCLASS];

/* The scratch window (core/internal.h), under mu. Its blocks form a stack
 * over the region (measuring: over a region that is not there): a block
 * freed at the top pops it, with every freed block below it; one freed
 * below the top waits for them. So nested temporaries, and the same
 * buffers taken again and again by a kernel's chunks, reuse the same
 * bytes. A class block counted by a measuring window carries the window's
 * id in `bytes` (unused by class blocks otherwise; 0 for the others), so a
 * free after the window closed, or under a later window, is not counted. */
#define WSTACK 4096
typedef struct wentry {
    const void *p;     /* the block */
    size_t at;         /* its offset in the window */
    bool freed;
} wentry;
typedef struct window {
    uint64_t id;       /* 0: no window open */
    char *base;        /* NULL: measuring */
    size_t cap, used, high;
    int64_t live;
    int n;             /* entries on the stack */
    wentry stack[WSTACK];
} window;
static window win;
static uint64_t win_next = 1;
_Thread_local uint64_t zsi_alloc_scope;

/* The smallest class holding n bytes, or -1 beyond the last. */
static int size_class(size_t n)
{
    if (n <= 64)
        return 0;
    uint32_t hb = 63 - (uint32_t)__builtin_clzll((unsigned long long)(n - 1));
    uint32_t p = hb - 6; /* (64 << p, 64 << (p + 1)] holds n */
    if (p >= MAX_P)
        return -1;
    size_t base = (size_t)64 << p, step = base / (p < FINE_P ? 4 : FINE_DIV);
    size_t q = (n - base + step - 1) / step; /* 1 .. div: div is 2 base */
    return (int)(CLASS_BASE(p) + q);
}

/* ---- scratch windows (core/internal.h) ---------------------------------- */

size_t zsi_alloc_window_block(size_t n)
{
    return HDR + ((n ? n : 1) + 63) / 64 * 64;
}

static void window_push(const block *b, size_t need);

/* Under mu, a request of n bytes from the open window's scope: the window
 * block, or NULL: measuring, or it does not fit; *mark then says that the
 * block the cache serves is pushed all the same (window_push), so the
 * high-water mark is what the window would have needed. */
static void *window_take(size_t n, uint64_t *mark)
{
    size_t need = zsi_alloc_window_block(n);
    if (win.n == WSTACK)
        return NULL; /* too many blocks at once: neither served nor counted */
    if (!win.base || win.used > win.cap || need > win.cap - win.used) {
        *mark = win.id;
        return NULL;
    }
    block *b = (block *)(win.base + win.used);
    b->cls = WINDOW;
    b->magic = MAGIC;
    b->bytes = win.id;
    b->prev = NULL;
    window_push(b, need);
    return (char *)b + HDR;
}

/* Under mu: block b of need bytes goes on top of the window's stack. */
static void window_push(const block *b, size_t need)
{
    win.stack[win.n++] = (wentry){b, win.used, false};
    win.used += need;
    if (win.used > win.high)
        win.high = win.used;
    win.live++;
}

/* Under mu: block b, taken under window b->bytes, is given back. */
static void window_give(const block *b)
{
    if (b->bytes != win.id)
        return;
    int k = win.n - 1;
    while (k >= 0 && win.stack[k].p != b)
        k--;
    if (k < 0)
        return; /* not on this window's stack (cannot happen) */
    win.stack[k].freed = true;
    win.live--;
    while (win.n > 0 && win.stack[win.n - 1].freed)
        win.used = win.stack[--win.n].at;
}

bool zsi_alloc_window_open(void *base, size_t nbytes)
{
    pthread_mutex_lock(&mu);
    uint64_t id = win.id == 0 ? win_next++ : 0;
    if (id) {
        win.id = id;
        win.base = base;
        win.cap = nbytes;
        win.used = win.high = 0;
        win.live = 0;
        win.n = 0;
    }
    pthread_mutex_unlock(&mu);
    zsi_alloc_scope = id;
    return id != 0;
}

size_t zsi_alloc_window_close(int64_t *live)
{
    pthread_mutex_lock(&mu);
    size_t high = win.high;
    *live = win.live;
    win.id = 0;
    pthread_mutex_unlock(&mu);
    zsi_alloc_scope = 0;
    return high;
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
    uint64_t mark = 0; /* the window counting this block */
    if (zsi_alloc_scope && zsi_alloc_scope == win.id) {
        void *w = window_take(nbytes, &mark);
        if (w) {
            pthread_mutex_unlock(&mu);
            return w;
        }
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
        b->prev = NULL;
        b->bytes = 0;
        pthread_mutex_lock(&mu);
        stats.n_system++;
        pthread_mutex_unlock(&mu);
    }
    pthread_mutex_lock(&mu);
    b->bytes = 0;
    if (mark && mark == win.id && win.n < WSTACK) {
        b->bytes = mark;
        window_push(b, zsi_alloc_window_block(nbytes));
    }
    stats.n_allocs++;
    stats.current_bytes += sz;
    if (tracing)
        trace_alloc(b, nbytes);
    if (stats.current_bytes > stats.peak_bytes) {
        stats.peak_bytes = stats.current_bytes;
        if (tracing)
            trace_peak();
    }
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
    if (b->cls == WINDOW) { /* its bytes are the window's region */
        pthread_mutex_lock(&mu);
        b->magic = 0; /* a second free aborts; under mu: once given back,
                       * another thread's block may start here */
        window_give(b);
        pthread_mutex_unlock(&mu);
        return;
    }
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
    if (tracing)
        trace_free(b);
    if (b->bytes) {
        window_give(b);
        b->bytes = 0;
    }
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
    if (tracing)
        trace_peak();
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

/* ---- peak attribution (ZS_ALLOC_TRACE) ----------------------------------
 * Live blocks sit on a circular list through `live` (prev NULL: a block
 * not on it). A snapshot groups them by their three tags in an open-
 * addressed table; a new peak replaces it. All under mu. */

#define TAG_DEPTH 64
#define NGROUP 1024

typedef struct tag_group {
    const char *tag[3];
    uint64_t blocks;
    size_t held, asked, largest;
    bool used;
} tag_group;

static block live = {.next = &live, .prev = &live};
static tag_group snap[NGROUP];
static size_t snap_bytes;
static _Thread_local const char *tag_stack[TAG_DEPTH];
static _Thread_local int tag_depth;

__attribute__((constructor)) static void trace_init(void)
{
    const char *e = getenv("ZS_ALLOC_TRACE");
    tracing = e && *e && strcmp(e, "0") != 0;
}

bool zs_alloc_tracing(void) { return tracing; }

void zs_alloc_tag_push(const char *tag)
{
    if (!tracing)
        return;
    if (tag_depth < TAG_DEPTH)
        tag_stack[tag_depth] = tag;
    tag_depth++;
}

void zs_alloc_tag_pop(void)
{
    if (tracing && tag_depth > 0)
        tag_depth--;
}

static void trace_alloc(block *b, size_t asked)
{
    int d = tag_depth < TAG_DEPTH ? tag_depth : TAG_DEPTH;
    b->asked = asked;
    b->tag[0] = d > 0 ? tag_stack[0] : NULL;
    b->tag[1] = d > 2 ? tag_stack[d - 2] : NULL;
    b->tag[2] = d > 1 ? tag_stack[d - 1] : NULL;
    b->prev = &live;
    b->next = live.next;
    live.next->prev = b;
    live.next = b;
}

static void trace_free(block *b)
{
    if (!b->prev)
        return; /* allocated before tracing was on */
    b->prev->next = b->next;
    b->next->prev = b->prev;
    b->prev = NULL;
}

/* The group of b's tags in snap (the last slot collects the overflow). */
static tag_group *group_of(const block *b, int *ngroups)
{
    uintptr_t h = 0;
    for (int i = 0; i < 3; i++)
        h = (h ^ (uintptr_t)b->tag[i]) * 0x9E3779B97F4A7C15ull;
    for (int k = 0; k < NGROUP - 1; k++) {
        tag_group *g = &snap[(h + (uintptr_t)k) % (NGROUP - 1)];
        if (!g->used) {
            if (*ngroups >= NGROUP / 2)
                break;
            ++*ngroups;
            g->used = true;
            memcpy(g->tag, b->tag, sizeof g->tag);
            return g;
        }
        if (!memcmp(g->tag, b->tag, sizeof g->tag))
            return g;
    }
    tag_group *o = &snap[NGROUP - 1];
    o->used = true;
    o->tag[0] = "(more tag sets than the report holds)";
    return o;
}

static void trace_peak(void)
{
    int n = 0;
    memset(snap, 0, sizeof snap);
    for (block *b = live.next; b != &live; b = b->next) {
        tag_group *g = group_of(b, &n);
        size_t held = class_size(b->cls);
        g->blocks++;
        g->held += held;
        g->asked += b->asked;
        g->largest = held > g->largest ? held : g->largest;
    }
    snap_bytes = stats.peak_bytes;
}

static int by_held(const void *a, const void *b)
{
    const tag_group *x = a, *y = b;
    return (x->held < y->held) - (x->held > y->held);
}

zs_status zs_alloc_peak_report(FILE *f, size_t min_bytes)
{
    if (!tracing)
        return zs_set_error("alloc: no peak report: set ZS_ALLOC_TRACE=1 before the "
                            "program starts");
    tag_group *g = malloc(sizeof snap);
    if (!g)
        return zs_set_error_code(ZS_ERR_NOMEM, "alloc: out of memory");
    pthread_mutex_lock(&mu);
    memcpy(g, snap, sizeof snap);
    size_t peak = snap_bytes;
    pthread_mutex_unlock(&mu);
    qsort(g, NGROUP, sizeof *g, by_held);
    size_t held = 0, asked = 0, rest = 0, rest_n = 0;
    uint64_t blocks = 0;
    for (int i = 0; i < NGROUP && g[i].used; i++)
        held += g[i].held, asked += g[i].asked, blocks += g[i].blocks;
    fprintf(f, "allocator peak %.3f MiB in %llu blocks: asked %.3f MiB, size-class "
            "rounding %.3f MiB; by tags (outermost > .. > innermost at allocation):\n",
            (double)peak / 1048576, (unsigned long long)blocks, (double)asked / 1048576,
            (double)(held - asked) / 1048576);
    for (int i = 0; i < NGROUP && g[i].used; i++) {
        if (g[i].held < min_bytes) {
            rest += g[i].held, rest_n += g[i].blocks;
            continue;
        }
        fprintf(f, "  %9.3f MiB (asked %9.3f) %6llu blocks, largest %8.3f MiB: ",
                (double)g[i].held / 1048576, (double)g[i].asked / 1048576,
                (unsigned long long)g[i].blocks, (double)g[i].largest / 1048576);
        bool any = false;
        for (int k = 0; k < 3; k++)
            if (g[i].tag[k]) {
                fprintf(f, "%s%s", any ? " > " : "", g[i].tag[k]);
                any = true;
            }
        fprintf(f, "%s\n", any ? "" : "(untagged)");
    }
    if (rest)
        fprintf(f, "  %9.3f MiB in %zu smaller blocks of other tags\n",
                (double)rest / 1048576, rest_n);
    free(g);
    return ZS_OK;
}
