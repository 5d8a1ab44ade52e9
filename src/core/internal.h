/*
 * core/internal.h - core helpers shared inside the library (zsi_ prefix).
 */
#ifndef ZS_CORE_INTERNAL_H
#define ZS_CORE_INTERNAL_H

#include "zs/core.h"

/* New contiguous tensor, uninitialised, refcount 1, registered in the
 * current scope unless tracking is paused. NULL + message on failure. */
zs_tensor *zsi_new_tensor(zs_dtype dt, int ndim, const int64_t *shape);
/* The same on a device (zs_device_register); zsi_new_tensor is the CPU's. */
zs_tensor *zsi_new_tensor_on(int device, zs_dtype dt, int ndim,
                             const int64_t *shape);
/* Memory of a registered device (NULL + message), freed by zsi_device_free
 * with the same id; counted so that a device with storage stays. */
void *zsi_device_alloc(int device, size_t nbytes);
void zsi_device_free(int device, void *p);
/* True when the CPU may address the device's memory. */
bool zsi_device_host(int device);
/* The first element's address on whatever device t lives, unchecked: for
 * that device's kernels and copies, never for CPU code on other devices. */
static inline void *zsi_ptr(const zs_tensor *t)
{
    return (char *)t->storage->data + t->offset * (int64_t)zs_dtype_size(t->dtype);
}
/* New tensor header sharing base's storage (retained), no autograd. */
zs_tensor *zsi_new_view(const zs_tensor *base, int ndim, const int64_t *shape,
                        const int64_t *strides, int64_t offset);
void zsi_contig_strides(int ndim, const int64_t *shape, int64_t *strides);
int64_t zsi_shape_numel(int ndim, const int64_t *shape);
/* Validates a user shape (ndim in [0, 8], sizes >= 0); op names the caller. */
zs_status zsi_check_shape(const char *op, int ndim, const int64_t *shape);

/* Scope tracking is paused while the library builds temporaries of its
 * own (backward rules, composite operators); they are owned by their
 * creator and released explicitly. Nestable, per thread. */
void zsi_tracking_pause(void);
void zsi_tracking_resume(void);
/* Registers t (if not already) in the current scope unless paused. */
zs_tensor *zsi_track(zs_tensor *t);

/* Normalises a possibly negative dim; -1 + message naming op if out of
 * range. */
int zsi_norm_dim(const char *op, int dim, int ndim);
/* "[2, 3]" */
char *zsi_shape_fmt(int ndim, const int64_t *shape, char *buf, size_t n);

/* Element access as double for any dtype (slow paths, tests, printing). */
double zsi_load(zs_dtype dt, const void *base, int64_t i);
void zsi_store(zs_dtype dt, void *base, int64_t i, double v);

/* True if grad mode is on and t needs grad (grad_mode.c). */
bool zsi_grad_needed(const zs_tensor *t);

/* Set by the autograd layer: called when a tensor with a node is freed, to
 * drop the tensor's reference to its node. */
extern void (*zsi_node_release_hook)(zs_tensor *t);

#endif
