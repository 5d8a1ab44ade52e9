/*
 * kernels/cuda/device.c - GPU 0 as a zs device: a caching allocator,
 * copies, memset, streams and events over the CUDA runtime.
 *
 * Allocator: sizes are rounded up (to 512 bytes below 1 MiB, to 2 MiB
 * above) and a freed block is kept in a free list of its rounded size, so
 * a training step that asks for the same sizes every step calls cudaMalloc
 * only in its first step (the steady state asks the driver for nothing).
 * When cudaMalloc fails the cached blocks are released and it is tried
 * once more. Blocks are reused in the order of the default stream, on
 * which every kernel of this backend runs: a block freed while a kernel
 * still reads it is only handed to work queued after that kernel. Work on
 * other streams must be synchronised before its memory is freed (as
 * PyTorch's record_stream contract, without the bookkeeping).
 *
 * Threads: the allocator's lists and counters are under one mutex; the
 * runtime calls are thread-safe themselves.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "kernels/cuda/cuda.h"

static zs_status fail(const char *what, cudaError_t e)
{
    return zs_set_error("cuda: %s: %s", what, cudaGetErrorString(e));
}

int zsk_cuda_count(char *why, size_t n)
{
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
        snprintf(why, n, "cudaGetDeviceCount: %s", cudaGetErrorString(e));
        cudaGetLastError(); /* clear the sticky-free error */
        return 0;
    }
    if (count == 0)
        snprintf(why, n, "the driver reports no GPU");
    return count;
}

zs_status zsk_cuda_props_get(zsk_cuda_props *p)
{
    struct cudaDeviceProp d;
    cudaError_t e = cudaGetDeviceProperties(&d, 0);
    if (e != cudaSuccess)
        return fail("cudaGetDeviceProperties", e);
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s", d.name);
    p->sms = d.multiProcessorCount;
    p->major = d.major;
    p->minor = d.minor;
    p->total_bytes = d.totalGlobalMem;
    cudaRuntimeGetVersion(&p->runtime_version);
    cudaDriverGetVersion(&p->driver_version);
    return ZS_OK;
}

zs_status zsk_cuda_check(const char *what)
{
    cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? ZS_OK : fail(what, e);
}

/* The stream kernels run on: the legacy default stream. */
void *zsk_cuda_stream(void) { return NULL; }

/* ---- caching allocator ------------------------------------------------- */

typedef struct block {
    void *p;
    size_t size; /* rounded */
    struct block *next;
} block;

#define NBINS 512
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static block *free_bins[NBINS]; /* free blocks hashed by size */
static block *live_bins[NBINS]; /* live blocks hashed by address */
static zs_device_stats st;

static size_t round_size(size_t n)
{
    const size_t small = 512, large = (size_t)2 << 20;
    if (n == 0)
        n = 1;
    return n < ((size_t)1 << 20) ? (n + small - 1) / small * small
                                 : (n + large - 1) / large * large;
}

static size_t hash(uintptr_t x) { return (size_t)((x >> 9) * 2654435761u) % NBINS; }

/* A cached block of exactly `size` bytes, unlinked, or NULL. mu held. */
static block *take_free(size_t size)
{
    block **b = &free_bins[hash(size)];
    for (; *b; b = &(*b)->next)
        if ((*b)->size == size) {
            block *r = *b;
            *b = r->next;
            st.cached_bytes -= size;
            return r;
        }
    return NULL;
}

/* cudaFree of every cached block. mu held. */
static void release_cached(void)
{
    for (int i = 0; i < NBINS; i++)
        while (free_bins[i]) {
            block *b = free_bins[i];
            free_bins[i] = b->next;
            cudaFree(b->p);
            st.cached_bytes -= b->size;
            free(b);
        }
}

static void *dev_alloc(void *ctx, size_t nbytes)
{
    size_t size = round_size(nbytes);
    pthread_mutex_lock(&mu);
    block *b = take_free(size);
    if (!b) {
        b = malloc(sizeof *b);
        void *p = NULL;
        cudaError_t e = b ? cudaMalloc(&p, size) : cudaErrorMemoryAllocation;
        if (e == cudaErrorMemoryAllocation && b) {
            cudaGetLastError();
            release_cached();
            e = cudaMalloc(&p, size);
        }
        if (e != cudaSuccess) {
            cudaGetLastError();
            pthread_mutex_unlock(&mu);
            free(b);
            zs_set_error("cuda: out of memory allocating %zu bytes (%zu in use, "
                         "%zu cached): %s", nbytes, st.current_bytes,
                         st.cached_bytes, cudaGetErrorString(e));
            return NULL;
        }
        b->p = p;
        b->size = size;
        st.n_allocs++;
    }
    size_t h = hash((uintptr_t)b->p);
    b->next = live_bins[h];
    live_bins[h] = b;
    st.current_bytes += size;
    if (st.current_bytes > st.peak_bytes)
        st.peak_bytes = st.current_bytes;
    pthread_mutex_unlock(&mu);
    return b->p;
}

static void dev_free(void *ctx, void *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&mu);
    block **l = &live_bins[hash((uintptr_t)p)];
    while (*l && (*l)->p != p)
        l = &(*l)->next;
    if (*l) {
        block *b = *l;
        *l = b->next;
        st.current_bytes -= b->size;
        st.cached_bytes += b->size;
        size_t h = hash(b->size);
        b->next = free_bins[h];
        free_bins[h] = b;
    }
    pthread_mutex_unlock(&mu);
}

void zsk_cuda_empty_cache(void)
{
    pthread_mutex_lock(&mu);
    release_cached();
    pthread_mutex_unlock(&mu);
}

static void dev_stats(void *ctx, zs_device_stats *out)
{
    pthread_mutex_lock(&mu);
    *out = st;
    pthread_mutex_unlock(&mu);
}

/* ---- copies, streams, events -------------------------------------------- */

static enum cudaMemcpyKind kind_of(zs_copy_kind k)
{
    return k == ZS_COPY_TO_HOST ? cudaMemcpyDeviceToHost
         : k == ZS_COPY_FROM_HOST ? cudaMemcpyHostToDevice
                                  : cudaMemcpyDeviceToDevice;
}

static zs_status dev_copy(void *ctx, void *dst, const void *src, size_t n,
                          zs_copy_kind kind)
{
    if (n == 0)
        return ZS_OK;
    /* cudaMemcpy orders itself after the default stream's work; a
     * device-to-device copy may return before it is done, so wait. */
    cudaError_t e = cudaMemcpy(dst, src, n, kind_of(kind));
    if (e == cudaSuccess && kind == ZS_COPY_ON_DEVICE)
        e = cudaStreamSynchronize(NULL);
    return e == cudaSuccess ? ZS_OK : fail("cudaMemcpy", e);
}

static zs_status dev_copy_async(void *ctx, void *dst, const void *src, size_t n,
                                zs_copy_kind kind, zs_stream *s)
{
    if (n == 0)
        return ZS_OK;
    cudaError_t e = cudaMemcpyAsync(dst, src, n, kind_of(kind), (cudaStream_t)s);
    return e == cudaSuccess ? ZS_OK : fail("cudaMemcpyAsync", e);
}

static zs_status dev_memset(void *ctx, void *p, int byte, size_t n)
{
    cudaError_t e = n ? cudaMemset(p, byte, n) : cudaSuccess;
    return e == cudaSuccess ? ZS_OK : fail("cudaMemset", e);
}

static zs_status dev_sync(void *ctx, zs_stream *s)
{
    cudaError_t e = s ? cudaStreamSynchronize((cudaStream_t)s) : cudaDeviceSynchronize();
    return e == cudaSuccess ? ZS_OK : fail("synchronize", e);
}

static zs_stream *dev_stream_new(void *ctx)
{
    cudaStream_t s;
    cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
        fail("cudaStreamCreate", e);
        return NULL;
    }
    return (zs_stream *)s;
}

static void dev_stream_free(void *ctx, zs_stream *s)
{
    if (s)
        cudaStreamDestroy((cudaStream_t)s);
}

static zs_event *dev_event_new(void *ctx)
{
    cudaEvent_t ev;
    cudaError_t e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
    if (e != cudaSuccess) {
        fail("cudaEventCreate", e);
        return NULL;
    }
    return (zs_event *)ev;
}

static void dev_event_free(void *ctx, zs_event *ev)
{
    if (ev)
        cudaEventDestroy((cudaEvent_t)ev);
}

static zs_status dev_event_record(void *ctx, zs_event *ev, zs_stream *s)
{
    cudaError_t e = cudaEventRecord((cudaEvent_t)ev, (cudaStream_t)s);
    return e == cudaSuccess ? ZS_OK : fail("cudaEventRecord", e);
}

static zs_status dev_event_wait(void *ctx, zs_stream *s, zs_event *ev)
{
    cudaError_t e = cudaStreamWaitEvent((cudaStream_t)s, (cudaEvent_t)ev, 0);
    return e == cudaSuccess ? ZS_OK : fail("cudaStreamWaitEvent", e);
}

static zs_status dev_event_sync(void *ctx, zs_event *ev)
{
    cudaError_t e = cudaEventSynchronize((cudaEvent_t)ev);
    return e == cudaSuccess ? ZS_OK : fail("cudaEventSynchronize", e);
}

void zsk_cuda_device_ops(zs_device_ops *ops)
{
    *ops = (zs_device_ops){
        .name = "cuda", .host_accessible = false,
        .alloc = dev_alloc, .free = dev_free, .copy = dev_copy,
        .memset = dev_memset, .copy_async = dev_copy_async, .sync = dev_sync,
        .stream_new = dev_stream_new, .stream_free = dev_stream_free,
        .event_new = dev_event_new, .event_free = dev_event_free,
        .event_record = dev_event_record, .event_wait = dev_event_wait,
        .event_sync = dev_event_sync, .stats = dev_stats,
    };
}
