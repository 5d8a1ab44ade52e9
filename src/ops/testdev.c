/*
 * testdev.c - the test device: memory the host may not touch, running the
 * CPU kernels, so that a whole training step proves device-neutral on the
 * CPU before any GPU is involved (../shared/DESIGN.md, "Devices").
 *
 * Memory: every allocation is its own mmap'd run of pages, kept PROT_NONE
 * except while one of this device's kernels or copies uses it (freed runs
 * are kept for reuse by length, still PROT_NONE: cache_put). Code that
 * reads or writes such a tensor behind the driver's back (zs_data refuses
 * it with a message; a raw pointer faults at once) fails loudly instead of
 * silently working as it would on host memory.
 *
 * Kernels: for every descriptor of ops/oplist.h and every dtype with a CPU
 * kernel, the test device's kernel is `run` below: it opens the pages of
 * the call's inputs and results, hands the CPU kernel host aliases of them
 * (headers on the same bytes, device CPU, no autograd), copies the aux
 * results the kernel made on the host (a norm's statistics) onto the test
 * device, and closes the pages again. Results are therefore bit-identical
 * to the CPU's. Each (operator) call is counted.
 *
 * Threads: one recursive lock serialises the device's kernels and copies
 * (a copy runs inside a kernel when an aux result is moved); the CPU
 * kernel itself still runs on the pool. Enable the device before other
 * threads use the library (zs_device_register's rule).
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "ops/op.h"
#include "zs/ops.h"

typedef struct region {
    char *base;
    size_t len; /* mapped bytes (whole pages) */
    int open;   /* kernels and copies using it now */
} region;

/* Live regions sorted by base, under mu. */
static region *regs;
static int nregs, capregs;
static pthread_mutex_t mu;
static pthread_once_t mu_once = PTHREAD_ONCE_INIT;
static zs_device_stats stats;
static uint64_t *calls; /* [number of descriptors], under mu */

static void mu_init(void)
{
    pthread_mutexattr_t a;
    pthread_mutexattr_init(&a);
    pthread_mutexattr_settype(&a, PTHREAD_MUTEX_RECURSIVE);
    pthread_mutex_init(&mu, &a);
    pthread_mutexattr_destroy(&a);
}

static size_t page(void) { return (size_t)sysconf(_SC_PAGESIZE); }

/* Index of the region holding p, or -1. */
static int find(const void *p)
{
    int lo = 0, hi = nregs - 1;
    const char *c = p;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (c < regs[mid].base)
            hi = mid - 1;
        else if (c >= regs[mid].base + regs[mid].len)
            lo = mid + 1;
        else
            return mid;
    }
    return -1;
}

static void open_at(const void *p)
{
    int i = find(p);
    if (i >= 0 && regs[i].open++ == 0)
        mprotect(regs[i].base, regs[i].len, PROT_READ | PROT_WRITE);
}

static void close_at(const void *p)
{
    int i = find(p);
    if (i >= 0 && --regs[i].open == 0)
        mprotect(regs[i].base, regs[i].len, PROT_NONE);
}

/* Freed regions of up to CACHE_N runs and CACHE_BYTES in all, kept
 * mapped (PROT_NONE, off the live list: a stale pointer still faults) for
 * the next allocation of the same length, under mu. A training step frees
 * and allocates the same sizes every step; a fresh mmap each time faulted
 * every page in again and its munmap cost every thread a TLB shootdown
 * (tests on the test device ran 3-8x slower beside another test). */
#define CACHE_N 128
#define CACHE_BYTES ((size_t)256 << 20)
static region cache[CACHE_N];
static int ncache;
static size_t cache_bytes;

static void *cache_take(size_t len)
{
    for (int i = ncache - 1; i >= 0; i--)
        if (cache[i].len == len) {
            void *p = cache[i].base;
            cache[i] = cache[--ncache];
            cache_bytes -= len;
            return p;
        }
    return NULL;
}

static void cache_put(char *base, size_t len)
{
    if (ncache == CACHE_N || cache_bytes + len > CACHE_BYTES) {
        munmap(base, len);
        return;
    }
    cache[ncache++] = (region){base, len, 0};
    cache_bytes += len;
}

static void *dev_alloc(void *ctx, size_t n)
{
    size_t len = (n + page() - 1) / page() * page();
    if (!len)
        len = page();
    pthread_mutex_lock(&mu);
    void *p = cache_take(len);
    pthread_mutex_unlock(&mu);
    if (!p)
        p = mmap(NULL, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        zs_set_error_code(ZS_ERR_NOMEM, "alloc: %zu bytes on the test device "
                          "failed", n);
        return NULL;
    }
    pthread_mutex_lock(&mu);
    if (nregs == capregs) {
        int cap = capregs ? 2 * capregs : 256;
        region *r = realloc(regs, (size_t)cap * sizeof *r);
        if (!r) {
            pthread_mutex_unlock(&mu);
            munmap(p, len);
            zs_set_error_code(ZS_ERR_NOMEM, "alloc: test device: out of memory");
            return NULL;
        }
        regs = r;
        capregs = cap;
    }
    int i = nregs;
    while (i > 0 && regs[i - 1].base > (char *)p)
        i--;
    memmove(regs + i + 1, regs + i, (size_t)(nregs - i) * sizeof *regs);
    regs[i] = (region){p, len, 0};
    nregs++;
    stats.current_bytes += len;
    if (stats.current_bytes > stats.peak_bytes)
        stats.peak_bytes = stats.current_bytes;
    stats.n_allocs++;
    pthread_mutex_unlock(&mu);
    return p;
}

static void dev_free(void *ctx, void *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&mu);
    int i = find(p);
    if (i >= 0) {
        cache_put(regs[i].base, regs[i].len);
        stats.current_bytes -= regs[i].len;
        memmove(regs + i, regs + i + 1, (size_t)(nregs - i - 1) * sizeof *regs);
        nregs--;
    }
    pthread_mutex_unlock(&mu);
}

/* Opens the device side(s) of the copy for its duration. */
static zs_status dev_copy(void *ctx, void *dst, const void *src, size_t n,
                          zs_copy_kind kind)
{
    if (!n)
        return ZS_OK;
    pthread_mutex_lock(&mu);
    bool dev_dst = kind != ZS_COPY_TO_HOST, dev_src = kind != ZS_COPY_FROM_HOST;
    if (dev_dst)
        open_at(dst);
    if (dev_src)
        open_at(src);
    memmove(dst, src, n);
    if (dev_src)
        close_at(src);
    if (dev_dst)
        close_at(dst);
    pthread_mutex_unlock(&mu);
    return ZS_OK;
}

static zs_status dev_memset(void *ctx, void *p, int byte, size_t n)
{
    pthread_mutex_lock(&mu);
    open_at(p);
    memset(p, byte, n);
    close_at(p);
    pthread_mutex_unlock(&mu);
    return ZS_OK;
}

static void dev_stats(void *ctx, zs_device_stats *st)
{
    pthread_mutex_lock(&mu);
    *st = stats;
    pthread_mutex_unlock(&mu);
}

/* ---- kernels ----------------------------------------------------------- */

/* A host alias of device tensor t: a new header and an external storage
 * on the same bytes, device CPU, no autograd, not in any scope. */
static zs_tensor *host_alias(const zs_tensor *t)
{
    zsi_tracking_pause();
    zs_tensor *a = zs_from_blob(t->dtype, 0, NULL, t->storage->data);
    zsi_tracking_resume();
    if (!a)
        return NULL;
    a->storage->nbytes = t->storage->nbytes;
    a->ndim = t->ndim;
    memcpy(a->shape, t->shape, sizeof a->shape);
    memcpy(a->strides, t->strides, sizeof a->strides);
    a->offset = t->offset;
    return a;
}

/* A host tensor h (an aux result) as a new contiguous test-device tensor,
 * untracked; h is released. */
static zs_tensor *onto_device(zs_tensor *h, int device)
{
    zsi_tracking_pause();
    zs_no_grad_push();
    zs_tensor *hc = zs_contiguous(h);
    zs_tensor *d = hc ? zsi_new_tensor_on(device, h->dtype, h->ndim, h->shape) : NULL;
    zs_no_grad_pop();
    zsi_tracking_resume();
    if (d && dev_copy(NULL, zsi_ptr(d), zsi_ptr(hc), zs_nbytes(d),
                      ZS_COPY_FROM_HOST) != ZS_OK) {
        zs_release(d);
        d = NULL;
    }
    zs_release(hc);
    zs_release(h);
    return d;
}

static void count(const zsi_opdef *def)
{
    zsi_opdef *const *all = zsi_opdefs();
    for (int i = 0; calls && all[i]; i++)
        if (all[i] == def) {
            calls[i]++;
            return;
        }
}

/* Opens (open = true) or closes the storages of c's inputs and results. */
static void open_call(const zsi_call *c, bool open)
{
    void (*f)(const void *) = open ? open_at : close_at;
    for (int i = 0; i < c->nin; i++)
        f(c->in[i]->storage->data);
    for (int k = 0; k < c->nout; k++)
        if (c->outs[k])
            f(c->outs[k]->storage->data);
}

/* Runs the CPU kernel of c on host aliases; the test device's kernel for
 * every (operator, dtype) the CPU has. */
static zs_status run(const zsi_call *c, zs_tensor *out)
{
    zsi_kernel_fn cpu = c->def->kernel[ZS_CPU][c->key];
    if (!cpu)
        return zs_set_error_code(ZS_ERR_UNSUPPORTED, "%s: no CPU kernel for %s "
                                 "behind the test device", c->def->op.name,
                                 zs_dtype_name(c->key));
    zs_tensor *in[ZSI_MAX_IN] = {0}, *outs[ZSI_MAX_OUT] = {0};
    zs_tensor *aux[ZSI_MAX_AUX] = {0};
    pthread_mutex_lock(&mu);
    count(c->def);
    open_call(c, true);
    zs_status st = ZS_OK;
    for (int i = 0; i < c->nin && st == ZS_OK; i++)
        if (!(in[i] = host_alias(c->in[i])))
            st = ZS_ERR_NOMEM;
    for (int k = 0; k < c->nout && st == ZS_OK; k++)
        if (c->outs[k] && !(outs[k] = host_alias(c->outs[k])))
            st = ZS_ERR_NOMEM;
    if (st == ZS_OK) {
        zsi_call h = *c;
        h.device = ZS_CPU;
        h.in = in;
        h.outs = outs;
        h.aux = aux;
        st = cpu(&h, outs[0]);
    }
    for (int k = 0; k < ZSI_MAX_AUX; k++) {
        if (aux[k] && st == ZS_OK && !(c->aux[k] = onto_device(aux[k], c->device)))
            st = ZS_ERR_NOMEM;
        else if (aux[k] && st != ZS_OK)
            zs_release(aux[k]);
    }
    for (int i = 0; i < ZSI_MAX_IN; i++)
        zs_release(in[i]);
    for (int k = 0; k < ZSI_MAX_OUT; k++)
        zs_release(outs[k]);
    open_call(c, false);
    pthread_mutex_unlock(&mu);
    return st;
}

zs_status zs_test_device_enable(void)
{
    pthread_once(&mu_once, mu_init);
    if (zs_device_get(ZS_TEST_DEVICE))
        return ZS_OK;
    zs_device_ops ops = {.name = "test", .host_accessible = false,
                         .alloc = dev_alloc, .free = dev_free, .copy = dev_copy,
                         .memset = dev_memset, .stats = dev_stats};
    zsi_opdef *const *all = zsi_opdefs();
    int n = 0;
    while (all[n])
        n++;
    pthread_mutex_lock(&mu);
    if (!calls && !(calls = calloc((size_t)n + 1, sizeof *calls))) {
        pthread_mutex_unlock(&mu);
        return zs_set_error_code(ZS_ERR_NOMEM, "test device: out of memory");
    }
    pthread_mutex_unlock(&mu);
    zs_status st = zs_device_register(ZS_TEST_DEVICE, &ops);
    for (int i = 0; st == ZS_OK && all[i]; i++)
        for (int t = 0; t < ZS_DTYPE_COUNT; t++)
            if (all[i]->kernel[ZS_CPU][t])
                all[i]->kernel[ZS_TEST_DEVICE][t] = run;
    return st;
}

int64_t zs_test_device_calls(const char *op)
{
    zsi_opdef *const *all = zsi_opdefs();
    int64_t n = -1;
    pthread_once(&mu_once, mu_init);
    pthread_mutex_lock(&mu);
    for (int i = 0; all[i]; i++)
        if (!strcmp(all[i]->op.name, op))
            n = calls ? (int64_t)calls[i] : 0;
    pthread_mutex_unlock(&mu);
    return n;
}

void zs_test_device_reset_calls(void)
{
    pthread_once(&mu_once, mu_init);
    pthread_mutex_lock(&mu);
    zsi_opdef *const *all = zsi_opdefs();
    for (int i = 0; calls && all[i]; i++)
        calls[i] = 0;
    pthread_mutex_unlock(&mu);
}
