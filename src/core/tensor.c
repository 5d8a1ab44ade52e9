/*
 * tensor.c - tensor headers, storage, creation, refcounts and scopes.
 *
 * A tensor header (zs_tensor) is refcounted and points at a refcounted
 * storage. The creation reference of a tensor made while a scope is open
 * belongs to that scope (unless tracking is paused): zs_scope_pop releases
 * it. zs_release of a tensor whose count reaches zero also clears its scope
 * slot, so an early release inside a scope is safe.
 *
 * Threads: the counts are atomic (internal.h), so threads may retain and
 * release a shared tensor; scopes and tracking are per thread, and a scope
 * only ever holds tensors its own thread created.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/checked.h"
#include "core/internal.h"

void (*zsi_node_release_hook)(zs_tensor *t);

/* ---- scopes ------------------------------------------------------------ */

typedef struct zsi_scope {
    zs_tensor **items;
    int64_t n, cap;
    struct zsi_scope *parent;
} zsi_scope;

static _Thread_local zsi_scope *top_scope;
static _Thread_local int scope_depth;
static _Thread_local int pause_depth;

void zsi_tracking_pause(void) { pause_depth++; }
void zsi_tracking_resume(void) { pause_depth--; }

static void scope_add(zsi_scope *s, zs_tensor *t)
{
    if (s->n == s->cap) {
        int64_t cap = s->cap ? s->cap * 2 : 64;
        zs_tensor **items = realloc(s->items, (size_t)cap * sizeof *items);
        if (!items)
            return; /* untracked: the caller keeps ownership (documented) */
        s->items = items;
        s->cap = cap;
    }
    t->scope = s;
    t->scope_slot = s->n;
    s->items[s->n++] = t;
}

zs_tensor *zsi_track(zs_tensor *t)
{
    if (t && !t->scope && top_scope && pause_depth == 0)
        scope_add(top_scope, t);
    return t;
}

void zs_scope_push(void)
{
    zsi_scope *s = calloc(1, sizeof *s);
    if (!s)
        abort(); /* a few bytes; nothing sensible to do */
    s->parent = top_scope;
    top_scope = s;
    scope_depth++;
}

void zs_scope_pop(void)
{
    zsi_scope *s = top_scope;
    if (!s)
        return;
    /* Release in reverse creation order; a release may free others (a
     * view's base), which clears their slots first. */
    for (int64_t i = s->n - 1; i >= 0; i--) {
        zs_tensor *t = s->items[i];
        if (t) {
            s->items[i] = NULL;
            t->scope = NULL;
            zs_release(t);
        }
    }
    top_scope = s->parent;
    scope_depth--;
    free(s->items);
    free(s);
}

int zs_scope_depth(void) { return scope_depth; }

zs_tensor *zs_keep(zs_tensor *t)
{
    if (!t || !t->scope)
        return t;
    zsi_scope *s = t->scope;
    s->items[t->scope_slot] = NULL;
    t->scope = NULL;
    if (s->parent)
        scope_add(s->parent, t);
    return t;
}

/* ---- headers and storage ------------------------------------------------ */

void zsi_contig_strides(int ndim, const int64_t *shape, int64_t *strides)
{
    int64_t s = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        strides[i] = s;
        s *= shape[i] > 0 ? shape[i] : 1;
    }
}

int64_t zsi_shape_numel(int ndim, const int64_t *shape)
{
    int64_t n = 1;
    for (int i = 0; i < ndim; i++)
        n *= shape[i];
    return n;
}

char *zsi_shape_fmt(int ndim, const int64_t *shape, char *buf, size_t n)
{
    size_t k = 0;
    k += (size_t)snprintf(buf + k, n - k, "[");
    for (int i = 0; i < ndim && k < n; i++)
        k += (size_t)snprintf(buf + k, n - k, i ? ", %lld" : "%lld",
                              (long long)shape[i]);
    if (k < n)
        snprintf(buf + k, n - k, "]");
    return buf;
}

zs_status zsi_check_shape(const char *op, int ndim, const int64_t *shape)
{
    if (ndim < 0 || ndim > ZS_MAX_DIMS)
        return zs_set_error("%s: %d dims requested, expected 0..%d", op, ndim,
                            ZS_MAX_DIMS);
    if (ndim > 0 && !shape)
        return zs_set_error("%s: NULL shape for %d dims", op, ndim);
    for (int i = 0; i < ndim; i++)
        if (shape[i] < 0)
            return zs_set_error("%s: size %lld in dim %d, expected >= 0", op,
                                (long long)shape[i], i);
    int64_t n;
    if (!zsi_shape_numel_checked(ndim, shape, &n)) {
        char buf[200];
        return zs_set_error("%s: shape %s is too large (its sizes, zeros "
                            "counted as 1, multiply past 2^53)", op,
                            zsi_shape_fmt(ndim, shape, buf, sizeof buf));
    }
    return ZS_OK;
}

static zs_tensor *header_new(void)
{
    zs_tensor *t = calloc(1, sizeof *t);
    if (!t) {
        zs_set_error_code(ZS_ERR_NOMEM, "tensor: out of memory");
        return NULL;
    }
    atomic_init(&t->refcount, 1);
    return t;
}

zs_tensor *zsi_new_tensor_on(int device, zs_dtype dt, int ndim,
                             const int64_t *shape)
{
    if ((unsigned)dt >= ZS_DTYPE_COUNT) {
        zs_set_error("tensor: unknown dtype %d", (int)dt);
        return NULL;
    }
    if (zsi_check_shape("tensor", ndim, shape) != ZS_OK)
        return NULL;
    zs_tensor *t = header_new();
    if (!t)
        return NULL;
    zs_storage *s = calloc(1, sizeof *s);
    size_t nbytes = (size_t)zsi_shape_numel(ndim, shape) * zs_dtype_size(dt);
    void *data = s ? zsi_device_alloc(device, nbytes) : NULL;
    if (!data) {
        if (!s)
            zs_set_error_code(ZS_ERR_NOMEM, "tensor: out of memory");
        free(s);
        free(t);
        return NULL;
    }
    s->data = data;
    s->nbytes = nbytes;
    atomic_init(&s->refcount, 1);
    s->device = (zs_device)device;
    t->storage = s;
    t->dtype = dt;
    t->device = (zs_device)device;
    t->ndim = ndim;
    if (ndim)
        memcpy(t->shape, shape, (size_t)ndim * sizeof *shape);
    zsi_contig_strides(ndim, shape, t->strides);
    return zsi_track(t);
}

zs_tensor *zsi_new_tensor(zs_dtype dt, int ndim, const int64_t *shape)
{
    return zsi_new_tensor_on(ZS_CPU, dt, ndim, shape);
}

zs_tensor *zsi_new_view(const zs_tensor *base, int ndim, const int64_t *shape,
                        const int64_t *strides, int64_t offset)
{
    zs_tensor *t = header_new();
    if (!t)
        return NULL;
    t->dtype = base->dtype;
    t->device = base->device;
    t->ndim = ndim;
    if (ndim) {
        memcpy(t->shape, shape, (size_t)ndim * sizeof *shape);
        memcpy(t->strides, strides, (size_t)ndim * sizeof *strides);
    }
    t->offset = offset;
    t->storage = base->storage;
    zsi_storage_retain(t->storage);
    return zsi_track(t);
}

zs_tensor *zs_retain(zs_tensor *t)
{
    if (t)
        zsi_ref_inc(&t->refcount);
    return t;
}

void zsi_storage_retain(zs_storage *s) { zsi_ref_inc(&s->refcount); }

void zsi_storage_release(zs_storage *s)
{
    if (s && zsi_ref_dec(&s->refcount)) {
        if (!s->external)
            zsi_device_free(s->device, s->data);
        free(s);
    }
}

void zs_release(zs_tensor *t)
{
    if (!t || !zsi_ref_dec(&t->refcount))
        return;
    if (t->scope) {
        t->scope->items[t->scope_slot] = NULL;
        t->scope = NULL;
    }
    if (t->node && zsi_node_release_hook)
        zsi_node_release_hook(t);
    zs_release(t->grad);
    zsi_storage_release(t->storage);
    free(t);
}

/* ---- creation ------------------------------------------------------------ */

zs_tensor *zs_empty(zs_dtype dt, int ndim, const int64_t *shape)
{
    return zsi_new_tensor(dt, ndim, shape);
}

zs_tensor *zs_full(zs_dtype dt, int ndim, const int64_t *shape, double v)
{
    zs_tensor *t = zsi_new_tensor(dt, ndim, shape);
    if (t)
        zsi_fill_host(t, v);
    return t;
}

zs_tensor *zs_zeros(zs_dtype dt, int ndim, const int64_t *shape)
{
    zs_tensor *t = zsi_new_tensor(dt, ndim, shape);
    if (t)
        memset(zs_data(t), 0, zs_nbytes(t));
    return t;
}

zs_tensor *zs_ones(zs_dtype dt, int ndim, const int64_t *shape)
{
    return zs_full(dt, ndim, shape, 1.0);
}

zs_tensor *zs_scalar(zs_dtype dt, double v) { return zs_full(dt, 0, NULL, v); }

zs_tensor *zs_arange(zs_dtype dt, double start, double stop, double step)
{
    if (step == 0 || !isfinite(start) || !isfinite(stop) || !isfinite(step)) {
        zs_set_error("arange: start %g, stop %g, step %g: step must be "
                     "non-zero and all finite", start, stop, step);
        return NULL;
    }
    double n = ceil((stop - start) / step);
    int64_t len = n > 0 ? (int64_t)n : 0;
    zs_tensor *t = zsi_new_tensor(dt, 1, &len);
    if (!t)
        return NULL;
    void *d = zs_data(t);
    for (int64_t i = 0; i < len; i++)
        zsi_store(dt, d, i, start + (double)i * step);
    return t;
}

zs_tensor *zs_from_data(zs_dtype dt, int ndim, const int64_t *shape,
                        const void *data)
{
    zs_tensor *t = zsi_new_tensor(dt, ndim, shape);
    if (!t)
        return NULL;
    if (!data && zs_nbytes(t)) {
        zs_release(t);
        zs_set_error("from_data: NULL data");
        return NULL;
    }
    if (zs_nbytes(t))
        memcpy(zs_data(t), data, zs_nbytes(t));
    return t;
}

zs_tensor *zs_from_blob(zs_dtype dt, int ndim, const int64_t *shape,
                        void *data)
{
    if ((unsigned)dt >= ZS_DTYPE_COUNT ||
        zsi_check_shape("from_blob", ndim, shape) != ZS_OK)
        return NULL;
    zs_tensor *t = header_new();
    zs_storage *s = calloc(1, sizeof *s);
    if (!t || !s) {
        free(t);
        free(s);
        zs_set_error_code(ZS_ERR_NOMEM, "from_blob: out of memory");
        return NULL;
    }
    s->data = data;
    s->nbytes = (size_t)zsi_shape_numel(ndim, shape) * zs_dtype_size(dt);
    atomic_init(&s->refcount, 1);
    s->external = true;
    t->storage = s;
    t->dtype = dt;
    t->ndim = ndim;
    if (ndim)
        memcpy(t->shape, shape, (size_t)ndim * sizeof *shape);
    zsi_contig_strides(ndim, shape, t->strides);
    return zsi_track(t);
}

zs_tensor *zs_empty_like(const zs_tensor *t)
{
    return t ? zsi_new_tensor_on(t->device, t->dtype, t->ndim, t->shape) : NULL;
}

zs_tensor *zs_zeros_like(const zs_tensor *t)
{
    if (!t)
        return NULL;
    if (t->device == ZS_CPU)
        return zs_zeros(t->dtype, t->ndim, t->shape);
    return zs_zeros_on(t->device, t->dtype, t->ndim, t->shape);
}

/* ---- queries ------------------------------------------------------------- */

int64_t zs_numel(const zs_tensor *t) { return zsi_shape_numel(t->ndim, t->shape); }

size_t zs_nbytes(const zs_tensor *t)
{
    return (size_t)zs_numel(t) * zs_dtype_size(t->dtype);
}

bool zs_is_contiguous(const zs_tensor *t)
{
    /* As in PyTorch: a tensor without elements is contiguous whatever its
     * strides (a fresh [2, 0, 3] has the strides zsi_contig_strides gives,
     * which count the 0 as 1). */
    for (int i = 0; i < t->ndim; i++)
        if (t->shape[i] == 0)
            return true;
    int64_t s = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        if (t->shape[i] != 1 && t->strides[i] != s)
            return false;
        s *= t->shape[i];
    }
    return true;
}

bool zs_same_shape(const zs_tensor *a, const zs_tensor *b)
{
    if (a->ndim != b->ndim)
        return false;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i])
            return false;
    return true;
}

_Thread_local bool zsi_dry_capture;
_Thread_local int64_t zsi_dry_reads;

void zsi_dry_touch(const zs_tensor *t)
{
    zs_storage *s = t ? t->storage : NULL;
    if (!zsi_dry_capture || !s || s->data || s->external || !s->nbytes)
        return;
    zsi_dry_reads++;
    if ((s->data = zsi_device_alloc(s->device, s->nbytes)) &&
        zsi_device_memset(s->device, s->data, 0, s->nbytes) != ZS_OK) {
        zsi_device_free(s->device, s->data);
        s->data = NULL;
    }
}

void *zs_data(const zs_tensor *t)
{
    zsi_dry_touch(t);
    if (t->device != ZS_CPU && !zsi_device_host(t->device)) {
        zs_set_error("data: the tensor is on %s, which the CPU cannot "
                     "address (copy it with zs_to_device)",
                     zs_device_name(t->device));
        return NULL;
    }
    return zsi_ptr(t);
}

char *zs_shape_str(const zs_tensor *t, char *buf, size_t n)
{
    return zsi_shape_fmt(t->ndim, t->shape, buf, n);
}

int zsi_norm_dim(const char *op, int dim, int ndim)
{
    int d = dim < 0 ? dim + ndim : dim;
    if (d < 0 || d >= ndim) {
        zs_set_error("%s: dim %d out of range for a %d-d tensor", op, dim,
                     ndim);
        return -1;
    }
    return d;
}
