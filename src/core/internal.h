/*
 * core/internal.h - core helpers shared inside the library (zsi_ prefix).
 */
#ifndef ZS_CORE_INTERNAL_H
#define ZS_CORE_INTERNAL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "zs/core.h"

/* Reference counts (zs_refcount: tensors, storages, autograd nodes) are
 * atomic so that threads may share a tensor: an increment is relaxed (the
 * caller already holds a reference), a decrement acq_rel (the thread that
 * frees sees every write made through the other references). */
static inline void zsi_ref_inc(zs_refcount *rc)
{
    atomic_fetch_add_explicit(rc, 1, memory_order_relaxed);
}
/* Drops one reference; true when it was the last (the caller frees). A
 * count of 1 read by its holder cannot rise meanwhile (only a holder may
 * retain), so the sole holder skips the locked decrement, as libstdc++'s
 * shared_ptr does: the acquire load pairs with the other holders' release
 * decrements. */
static inline bool zsi_ref_dec(zs_refcount *rc)
{
    return atomic_load_explicit(rc, memory_order_acquire) == 1 ||
           atomic_fetch_sub_explicit(rc, 1, memory_order_acq_rel) == 1;
}
/* The count now (acquire): 1 means the caller holds the only reference. */
static inline int zsi_ref_get(const zs_refcount *rc)
{
    return atomic_load_explicit((zs_refcount *)rc, memory_order_acquire);
}
/* Storage references, for code that re-points a tensor at other storage
 * (nn/module.c); the last release frees the memory with its device. */
void zsi_storage_retain(zs_storage *s);
void zsi_storage_release(zs_storage *s);

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
/* n bytes of device memory set to byte; a synchronous copy of n bytes on
 * device (kind says which side is the host). ZS_OK or negative + message. */
zs_status zsi_device_memset(int device, void *p, int byte, size_t n);
zs_status zsi_device_copy(int device, void *dst, const void *src, size_t n,
                          zs_copy_kind kind);
/* True when the CPU may address the device's memory. */
bool zsi_device_host(int device);
/* The first element's address on whatever device t lives, unchecked: for
 * that device's kernels and copies, never for CPU code on other devices. */
static inline void *zsi_ptr(const zs_tensor *t)
{
    return (char *)t->storage->data + t->offset * (int64_t)zs_dtype_size(t->dtype);
}
/* A dry graph capture (graph/graph.c, zs_graph_capture_begin_dry) is
 * running on this thread: the values the recorded calls make have no
 * memory (data NULL) until the graph's first replay. zsi_dry_touch(t),
 * called by the host entry points that read elements (zs_get, zs_data,
 * zs_copy_to_buffer), counts a read of such a value in zsi_dry_reads and
 * gives its storage zeroed memory so the reader does not crash (the
 * capture then reports the read and its caller captures again running
 * the kernels). Otherwise nothing. */
extern _Thread_local bool zsi_dry_capture;
extern _Thread_local int64_t zsi_dry_reads;
void zsi_dry_touch(const zs_tensor *t);
/* New tensor header sharing base's storage (retained), no autograd. */
zs_tensor *zsi_new_view(const zs_tensor *base, int ndim, const int64_t *shape,
                        const int64_t *strides, int64_t offset);
void zsi_contig_strides(int ndim, const int64_t *shape, int64_t *strides);
int64_t zsi_shape_numel(int ndim, const int64_t *shape);
/* Validates a user shape (ndim in [0, 8], sizes >= 0); op names the caller. */
zs_status zsi_check_shape(const char *op, int ndim, const int64_t *shape);

/* Scratch windows (alloc.c): a node of a planned graph gets the memory its
 * kernel takes and gives back while it runs (im2col columns, packed GEMM
 * panels: zs_alloc/zs_free inside the kernel) from a region of the graph's
 * arena, so that it is planned with the node's values rather than held on
 * top of them. zsi_alloc_window_open(base, n) starts one: until close,
 * zs_alloc calls from this thread, and from pool workers while they run a
 * chunk of a job this thread published (thread.c hands them
 * zsi_alloc_scope), are served from [base, base + n) as a stack (each
 * block its 64-byte header plus its size rounded to 64; freeing the top
 * block pops it and the freed blocks under it); a request that does not
 * fit goes to the cache as usual. zs_free of a window block only counts
 * it. base NULL measures instead: every request goes to the cache, and
 * the window counts what the stack would have needed. Close returns that
 * high-water mark in bytes (serving: including what the requests that did
 * not fit would have needed) and the window blocks still live (*live > 0:
 * memory escaped the node; it must not be reused while held). One window
 * at a time in the process; windows serve host memory only. */
extern _Thread_local uint64_t zsi_alloc_scope;
bool zsi_alloc_window_open(void *base, size_t nbytes); /* false: one is open */
size_t zsi_alloc_window_close(int64_t *live);
/* Bytes a window needs for one block of n (header, rounding). */
size_t zsi_alloc_window_block(size_t n);

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

/* CPUs in this process's affinity mask (0: unknown; cpu.c). */
long zsi_affinity_cpus(void);

/* n f16 values to f32 and back (dtype.c; F16C where the CPU has it,
 * rounding to nearest even as zs_f32_to_f16). */
void zsi_f16_widen(const uint16_t *src, float *dst, int64_t n);
void zsi_f16_narrow(const float *src, uint16_t *dst, int64_t n);

/* Element access as double for any dtype (slow paths, tests, printing). */
double zsi_load(zs_dtype dt, const void *base, int64_t i);
void zsi_store(zs_dtype dt, void *base, int64_t i, double v);

/* The host copy and fill behind zs_copy_ and zs_fill_ (copy.c): dst and
 * src of equal numel, any layouts and dtypes (converted, rounding to
 * nearest even); both on memory the CPU addresses, not checked. Rows are
 * split across the pool. No autograd. */
zs_status zsi_copy_host(zs_tensor *dst, const zs_tensor *src);
zs_status zsi_fill_host(zs_tensor *t, double v);

/* True if grad mode is on and t needs grad (grad_mode.c). */
bool zsi_grad_needed(const zs_tensor *t);

/* Set by the autograd layer: called when a tensor with a node is freed, to
 * drop the tensor's reference to its node. Set once, by a constructor that
 * runs before main (autograd/engine.c), and only read after. */
extern void (*zsi_node_release_hook)(zs_tensor *t);

#endif
