/*
 * device.c - the device registry: who allocates, frees and copies the
 * memory of each device id.
 *
 * Id 0 is the CPU with the caching host allocator (alloc.c). Other ids are
 * registered at run time (a CUDA backend, or the tests' second device made
 * of host memory). A storage remembers its device and is freed by it; the
 * registry counts live storages per device (but the CPU's, which cannot
 * be removed) so a device cannot be removed while tensors still point
 * into its memory. Beyond alloc/free/copy a device may give memset,
 * asynchronous copies on streams, events and allocator counters; where it
 * gives none, its work is synchronous and the fallbacks here serve. Design: ../shared/DESIGN.md,
 * "Core" and "Devices".
 */
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "core/internal.h"

static void *cpu_alloc(void *ctx, size_t n) { return zs_alloc(n); }
static void cpu_free(void *ctx, void *p) { zs_free(p); }
static zs_status cpu_copy(void *ctx, void *dst, const void *src, size_t n,
                          zs_copy_kind kind)
{
    if (n)
        memcpy(dst, src, n);
    return ZS_OK;
}

static zs_status cpu_memset(void *ctx, void *p, int byte, size_t n)
{
    if (n)
        memset(p, byte, n);
    return ZS_OK;
}

static void cpu_stats(void *ctx, zs_device_stats *st)
{
    zs_alloc_stats a;
    zs_alloc_get_stats(&a);
    *st = (zs_device_stats){a.current_bytes, a.peak_bytes, a.cached_bytes,
                            a.n_allocs};
}

static zs_device_ops devices[ZS_MAX_DEVICES] = {
    [ZS_CPU] = {.name = "cpu", .host_accessible = true, .alloc = cpu_alloc,
                .free = cpu_free, .copy = cpu_copy, .memset = cpu_memset,
                .stats = cpu_stats},
};
static atomic_llong live[ZS_MAX_DEVICES];

zs_status zs_device_register(int device, const zs_device_ops *ops)
{
    if (device <= 0 || device >= ZS_MAX_DEVICES)
        return zs_set_error("device_register: id %d, expected 1..%d (0 is the "
                            "CPU)", device, ZS_MAX_DEVICES - 1);
    if (atomic_load(&live[device]) > 0)
        return zs_set_error("device_register: device %d (%s) still holds %lld "
                            "storages", device, zs_device_name(device),
                            (long long)atomic_load(&live[device]));
    if (ops && (!ops->alloc || !ops->free || !ops->copy || !ops->name))
        return zs_set_error("device_register: device %d needs a name, alloc, "
                            "free and copy", device);
    if (ops)
        devices[device] = *ops;
    else
        memset(&devices[device], 0, sizeof devices[device]);
    return ZS_OK;
}

const zs_device_ops *zs_device_get(int device)
{
    if (device < 0 || device >= ZS_MAX_DEVICES || !devices[device].alloc)
        return NULL;
    return &devices[device];
}

const char *zs_device_list(void)
{
    static _Thread_local char buf[160];
    size_t k = 0;
    buf[0] = '\0';
    for (int d = 0; d < ZS_MAX_DEVICES && k < sizeof buf; d++)
        if (devices[d].alloc)
            k += (size_t)snprintf(buf + k, sizeof buf - k, "%s%s", k ? ", " : "",
                                  devices[d].name);
    return buf;
}

int zs_device_find(const char *name)
{
    for (int d = 0; name && d < ZS_MAX_DEVICES; d++)
        if (devices[d].alloc && !strcmp(devices[d].name, name))
            return d;
    zs_set_error("device: no device named '%s' (devices here: %s)",
                 name ? name : "(null)", zs_device_list());
    return -1;
}

const char *zs_device_name(int device)
{
    static _Thread_local char buf[48];
    const zs_device_ops *d = zs_device_get(device);
    if (d)
        return d->name;
    snprintf(buf, sizeof buf, "device %d (not registered)", device);
    return buf;
}

void *zsi_device_alloc(int device, size_t nbytes)
{
    if (device == ZS_CPU) /* never unregistered: no lookup, no count */
        return zs_alloc(nbytes);
    const zs_device_ops *d = zs_device_get(device);
    if (!d) {
        zs_set_error("alloc: %s", zs_device_name(device));
        return NULL;
    }
    void *p = d->alloc(d->ctx, nbytes);
    if (p)
        atomic_fetch_add(&live[device], 1);
    else if (!zs_last_error()[0])
        zs_set_error_code(ZS_ERR_NOMEM, "alloc: %zu bytes on %s failed", nbytes,
                          d->name);
    return p;
}

void zsi_device_free(int device, void *p)
{
    if (device == ZS_CPU) {
        zs_free(p);
        return;
    }
    const zs_device_ops *d = zs_device_get(device);
    if (!d || !p) /* registration refuses to drop a device with storage */
        return;
    d->free(d->ctx, p);
    atomic_fetch_sub(&live[device], 1);
}

bool zsi_device_host(int device)
{
    const zs_device_ops *d = zs_device_get(device);
    return d && d->host_accessible;
}

zs_tensor *zs_empty_on(int device, zs_dtype dt, int ndim, const int64_t *shape)
{
    return zsi_new_tensor_on(device, dt, ndim, shape);
}

zs_status zsi_device_memset(int device, void *p, int byte, size_t n)
{
    const zs_device_ops *d = zs_device_get(device);
    if (!d)
        return zs_set_error("memset: %s", zs_device_name(device));
    if (!n)
        return ZS_OK;
    if (d->memset)
        return d->memset(d->ctx, p, byte, n);
    /* a device without memset: from a host buffer of the pattern */
    void *h = zs_alloc(n);
    if (!h)
        return ZS_ERR_NOMEM;
    memset(h, byte, n);
    zs_status st = d->copy(d->ctx, p, h, n, ZS_COPY_FROM_HOST);
    zs_free(h);
    return st;
}

zs_status zsi_device_copy(int device, void *dst, const void *src, size_t n,
                          zs_copy_kind kind)
{
    const zs_device_ops *d = zs_device_get(device);
    if (!d)
        return zs_set_error("copy: %s", zs_device_name(device));
    return n ? d->copy(d->ctx, dst, src, n, kind) : ZS_OK;
}

zs_tensor *zs_zeros_on(int device, zs_dtype dt, int ndim, const int64_t *shape)
{
    zs_tensor *t = zsi_new_tensor_on(device, dt, ndim, shape);
    if (t && zsi_device_memset(device, zsi_ptr(t), 0, zs_nbytes(t)) != ZS_OK) {
        zs_release(t);
        return NULL;
    }
    return t;
}

/* The copy of a contiguous t to a new contiguous tensor on `to`: one
 * device copy when one side is the CPU or both are one device, else two
 * through a host buffer. Untracked. */
static zs_tensor *copy_contig(const zs_tensor *t, int to)
{
    int from = (int)t->device;
    zs_tensor *out = zsi_new_tensor_on(to, t->dtype, t->ndim, t->shape);
    if (!out)
        return NULL;
    size_t n = zs_nbytes(t);
    zs_status st;
    if (from == to)
        st = zsi_device_copy(to, zsi_ptr(out), zsi_ptr(t), n,
                             to == ZS_CPU ? ZS_COPY_TO_HOST : ZS_COPY_ON_DEVICE);
    else if (from == ZS_CPU)
        st = zsi_device_copy(to, zsi_ptr(out), zsi_ptr(t), n, ZS_COPY_FROM_HOST);
    else if (to == ZS_CPU)
        st = zsi_device_copy(from, zsi_ptr(out), zsi_ptr(t), n, ZS_COPY_TO_HOST);
    else {
        void *h = zs_alloc(n ? n : 1);
        st = h ? zsi_device_copy(from, h, zsi_ptr(t), n, ZS_COPY_TO_HOST)
               : ZS_ERR_NOMEM;
        if (st == ZS_OK)
            st = zsi_device_copy(to, zsi_ptr(out), h, n, ZS_COPY_FROM_HOST);
        zs_free(h);
    }
    if (st != ZS_OK) {
        zs_release(out);
        out = NULL;
    }
    return out;
}

zs_tensor *zs_to_device(zs_tensor *t, int device)
{
    if (!t)
        return NULL;
    if (!zs_device_get(device)) {
        zs_set_error("to_device: %s (devices here: %s)", zs_device_name(device),
                     zs_device_list());
        return NULL;
    }
    bool contig = zs_is_contiguous(t);
    if ((int)t->device == device && contig) /* a new header, owned as usual */
        return zsi_new_view(t, t->ndim, t->shape, t->strides, t->offset);
    if ((int)t->device != ZS_CPU && !contig) {
        zs_set_error("to_device: a strided view on %s: make it contiguous "
                     "there first (zs_contiguous)", zs_device_name(t->device));
        return NULL;
    }
    zsi_tracking_pause();
    zs_tensor *h = NULL, *out = NULL;
    if (!contig) { /* a strided host view: packed on the host first */
        h = zsi_new_tensor(t->dtype, t->ndim, t->shape);
        if (h && zs_copy_to_buffer(t, zsi_ptr(h), zs_nbytes(h)) != ZS_OK) {
            zs_release(h);
            h = NULL;
        }
        out = h && device != ZS_CPU ? copy_contig(h, device) : zs_retain(h);
    } else {
        out = copy_contig(t, device);
    }
    zs_release(h);
    zsi_tracking_resume();
    return out ? zsi_track(out) : NULL;
}

static zs_status copy_kind_of(const zs_tensor *dst, const zs_tensor *src,
                              int *dev, zs_copy_kind *kind)
{
    int a = (int)dst->device, b = (int)src->device;
    if (a == b) {
        *dev = a;
        *kind = a == ZS_CPU ? ZS_COPY_TO_HOST : ZS_COPY_ON_DEVICE;
    } else if (b == ZS_CPU) {
        *dev = a;
        *kind = ZS_COPY_FROM_HOST;
    } else if (a == ZS_CPU) {
        *dev = b;
        *kind = ZS_COPY_TO_HOST;
    } else {
        return zs_set_error("copy_async: %s -> %s: copy through the host "
                            "(zs_to_device)", zs_device_name(b),
                            zs_device_name(a));
    }
    return ZS_OK;
}

zs_status zs_copy_async(zs_tensor *dst, const zs_tensor *src, zs_stream *stream)
{
    if (!dst || !src)
        return ZS_ERR_ARG;
    if (dst->dtype != src->dtype || zs_numel(dst) != zs_numel(src) ||
        !zs_is_contiguous(dst) || !zs_is_contiguous(src))
        return zs_set_error("copy_async: expected contiguous tensors of one "
                            "dtype and size (%s %lld -> %s %lld)",
                            zs_dtype_name(src->dtype), (long long)zs_numel(src),
                            zs_dtype_name(dst->dtype), (long long)zs_numel(dst));
    int dev = ZS_CPU;
    zs_copy_kind kind = ZS_COPY_TO_HOST;
    if (copy_kind_of(dst, src, &dev, &kind) != ZS_OK)
        return ZS_ERR_ARG;
    const zs_device_ops *d = zs_device_get(dev);
    if (!d)
        return zs_set_error("copy_async: %s", zs_device_name(dev));
    size_t n = zs_nbytes(src);
    if (!n)
        return ZS_OK;
    if (d->copy_async)
        return d->copy_async(d->ctx, zsi_ptr(dst), zsi_ptr(src), n, kind, stream);
    return d->copy(d->ctx, zsi_ptr(dst), zsi_ptr(src), n, kind);
}

/* The device's ops, or NULL + a message naming what. */
static const zs_device_ops *dev_of(int device, const char *what)
{
    const zs_device_ops *d = zs_device_get(device);
    if (!d)
        zs_set_error("%s: %s", what, zs_device_name(device));
    return d;
}

zs_status zs_device_sync(int device) { return zs_stream_sync(device, NULL); }

zs_status zs_stream_sync(int device, zs_stream *s)
{
    const zs_device_ops *d = dev_of(device, "sync");
    if (!d)
        return ZS_ERR_ARG;
    return d->sync ? d->sync(d->ctx, s) : ZS_OK;
}

zs_status zs_device_get_stats(int device, zs_device_stats *st)
{
    const zs_device_ops *d = dev_of(device, "device stats");
    if (!d)
        return ZS_ERR_ARG;
    *st = (zs_device_stats){0};
    if (d->stats)
        d->stats(d->ctx, st);
    return ZS_OK;
}

/* A synchronous device's one stream and its events: any non-NULL token. */
static char sync_token;

zs_stream *zs_stream_new(int device)
{
    const zs_device_ops *d = dev_of(device, "stream");
    if (!d)
        return NULL;
    return d->stream_new ? d->stream_new(d->ctx) : (zs_stream *)&sync_token;
}

void zs_stream_free(int device, zs_stream *s)
{
    const zs_device_ops *d = zs_device_get(device);
    if (d && d->stream_free && s && s != (zs_stream *)&sync_token)
        d->stream_free(d->ctx, s);
}

zs_event *zs_event_new(int device)
{
    const zs_device_ops *d = dev_of(device, "event");
    if (!d)
        return NULL;
    return d->event_new ? d->event_new(d->ctx) : (zs_event *)&sync_token;
}

void zs_event_free(int device, zs_event *e)
{
    const zs_device_ops *d = zs_device_get(device);
    if (d && d->event_free && e && e != (zs_event *)&sync_token)
        d->event_free(d->ctx, e);
}

zs_status zs_event_record(int device, zs_event *e, zs_stream *s)
{
    const zs_device_ops *d = dev_of(device, "event_record");
    if (!d)
        return ZS_ERR_ARG;
    return d->event_record ? d->event_record(d->ctx, e, s) : ZS_OK;
}

zs_status zs_event_wait(int device, zs_stream *s, zs_event *e)
{
    const zs_device_ops *d = dev_of(device, "event_wait");
    if (!d)
        return ZS_ERR_ARG;
    return d->event_wait ? d->event_wait(d->ctx, s, e) : ZS_OK;
}

zs_status zs_event_sync(int device, zs_event *e)
{
    const zs_device_ops *d = dev_of(device, "event_sync");
    if (!d)
        return ZS_ERR_ARG;
    return d->event_sync ? d->event_sync(d->ctx, e) : ZS_OK;
}
