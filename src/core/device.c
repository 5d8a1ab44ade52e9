/*
 * device.c - the device registry: who allocates, frees and copies the
 * memory of each device id.
 *
 * Id 0 is the CPU with the caching host allocator (alloc.c). Other ids are
 * registered at run time (a CUDA backend, or the tests' second device made
 * of host memory). A storage remembers its device and is freed by it; the
 * registry counts live storages per device (but the CPU's, which cannot
 * be removed) so a device cannot be removed while tensors still point
 * into its memory. Design: ../shared/DESIGN.md,
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

static zs_device_ops devices[ZS_MAX_DEVICES] = {
    [ZS_CPU] = {"cpu", true, cpu_alloc, cpu_free, cpu_copy, NULL},
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

/* Host -> device or device -> host copy of a contiguous t into a new
 * contiguous tensor on `to` (exactly one of t's device and `to` is the
 * CPU). Untracked. */
static zs_tensor *copy_across(zs_tensor *t, int to)
{
    bool to_host = to == ZS_CPU;
    const zs_device_ops *d = zs_device_get(to_host ? (int)t->device : to);
    zs_tensor *out = zsi_new_tensor_on(to, t->dtype, t->ndim, t->shape);
    if (out && d->copy(d->ctx, zsi_ptr(out), zsi_ptr(t), zs_nbytes(t),
                       to_host ? ZS_COPY_TO_HOST : ZS_COPY_FROM_HOST) != ZS_OK) {
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
        zs_set_error("to_device: %s", zs_device_name(device));
        return NULL;
    }
    if ((int)t->device == device && zs_is_contiguous(t))
        return zs_retain(t);
    if ((int)t->device != ZS_CPU && !zs_is_contiguous(t)) {
        zs_set_error("to_device: a strided view on %s: make it contiguous "
                     "there first", zs_device_name(t->device));
        return NULL;
    }
    zsi_tracking_pause();
    /* through the host: at most one copy on each side */
    zs_tensor *h = (int)t->device == ZS_CPU ? zs_contiguous(t) : copy_across(t, ZS_CPU);
    zs_tensor *out = h && device != ZS_CPU ? copy_across(h, device) : zs_retain(h);
    zs_release(h);
    zsi_tracking_resume();
    return out ? zsi_track(out) : NULL;
}
