/*
 * zs/core.h - the core layer: tensors, dtypes, storage, allocation, errors,
 * lifetime scopes, the thread pool and the random number generator.
 *
 * A zs_tensor is a strided view on a refcounted storage. Views (reshape,
 * permute, narrow, expand, ...) share storage; zs_contiguous copies only when
 * the layout is not already row-major. See ../../../shared/DESIGN.md, "Core".
 *
 * Ownership: every function that returns a zs_tensor * returns a new
 * reference unless its comment says "borrowed". Release it with zs_release,
 * or create it inside a scope (zs_scope_push/pop), which releases it for you.
 *
 * Errors: functions return NULL or a negative zs_status and set a
 * thread-local message readable with zs_last_error(). A function given a NULL
 * tensor returns NULL without overwriting the first message, so a chain of
 * calls can be checked once at its end.
 *
 * Threads: several user threads may use the library at once, each on its
 * own tensors (tests/core/test_threads.c checks it under ThreadSanitizer).
 *   May be called from several threads at once:
 *   - operators, zs_backward and the optimizers, on tensors that no other
 *     thread writes; modules' forward (and loss) on distinct modules, or on
 *     one module whose parameters nobody updates meanwhile, with grad mode
 *     off in all but one thread (two backwards into one parameter race on
 *     its .grad);
 *   - zs_retain / zs_release of one shared tensor (the reference counts of
 *     tensors, storages and autograd nodes are atomic), and operators that
 *     only read a shared tensor (one that no thread writes and that needs no
 *     gradient);
 *   - the allocator (zs_alloc, zs_free, the stats), the global random stream
 *     (zs_rng_reserve: concurrent draws get disjoint ranges in an unspecified
 *     order; pass explicit seeds for results that do not depend on timing),
 *     zs_parallel_for (the pool runs one call at a time; a call that finds it
 *     busy runs its whole range on the calling thread, and the kernels give
 *     the same bits either way);
 *   - the profiler's counters while profiling is on (zs_profile_*, ops.h).
 *   Not to be done concurrently:
 *   - two threads mutating one tensor (in-place operators, .grad,
 *     zs_set_requires_grad), two backwards through one graph or into one
 *     leaf, or one module's parameters updated (optimizer step, load,
 *     flatten, to_dtype) while another thread reads them;
 *   - zs_device_register, zs_profile_enable, zsi_op_set_kernel and the
 *     kernels' test knobs, zs_set_num_threads: call them before other
 *     threads start working, or while none does;
 *   - communicator (MPI) calls other than from the thread that initialised
 *     MPI (zs/dist.h).
 *   Per thread: the error message, grad mode (zs_no_grad_push) and scopes
 *   (a tensor created inside a scope belongs to that thread's scope: give
 *   another thread its own reference, zs_retain, or zs_keep it out first).
 */
#ifndef ZS_CORE_H
#define ZS_CORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ZS_MAX_DIMS 8

typedef enum zs_status {
    ZS_OK = 0,
    ZS_ERR_ARG = -1,      /* bad argument: shape, dtype, flag, ... */
    ZS_ERR_NOMEM = -2,    /* allocation failed */
    ZS_ERR_IO = -3,       /* file or system call failed */
    ZS_ERR_FORMAT = -4,   /* malformed file or request */
    ZS_ERR_STATE = -5,    /* object used in a state that forbids it */
    ZS_ERR_UNSUPPORTED = -6,
} zs_status;

typedef enum zs_dtype {
    ZS_F32 = 0,
    ZS_F64,
    ZS_F16,
    ZS_BF16,
    ZS_F8E4M3,
    ZS_F8E5M2,
    ZS_I8,
    ZS_U8,
    ZS_I32,
    ZS_I64,
    ZS_DTYPE_COUNT
} zs_dtype;

typedef enum zs_device { ZS_CPU = 0, ZS_CUDA = 1 } zs_device;

/* Reference counts are C11 atomics (retain: a relaxed increment; release:
 * an acq_rel decrement, the last one frees). C++ translation units (.cu)
 * see an int of the same size and layout; only the C library changes it. */
#ifdef __cplusplus
typedef int zs_refcount;
#else
typedef _Atomic int zs_refcount;
#endif

typedef struct zs_storage {
    void *data;        /* 64-byte aligned */
    size_t nbytes;
    zs_refcount refcount;
    zs_device device;
    bool external;     /* true: data is not ours to free */
} zs_storage;

struct zsi_node;
struct zsi_scope;

/* Fields are readable by users; change them only through the API. */
typedef struct zs_tensor {
    zs_refcount refcount;
    zs_dtype dtype;
    zs_device device;
    int ndim;
    int64_t shape[ZS_MAX_DIMS];
    int64_t strides[ZS_MAX_DIMS]; /* in elements, may be 0 (expanded) */
    int64_t offset;               /* in elements, into storage */
    zs_storage *storage;

    /* autograd */
    bool requires_grad;
    bool retains_grad;            /* non-leaf: keep .grad after backward */
    struct zs_tensor *grad;       /* owned; NULL until a backward reaches it */
    struct zsi_node *node;        /* the operation that made it (owned ref) */
    int32_t grad_pending;         /* leaf: gradients still to arrive in the
                                   * running backward (engine-internal) */

    /* lifetime: the scope holding the creation reference, if any */
    struct zsi_scope *scope;
    int64_t scope_slot;
} zs_tensor;

/* ---- errors ---------------------------------------------------------- */

/* The message of the last failure on this thread ("" if none). */
const char *zs_last_error(void);
/* Sets the thread's message (printf format); returns ZS_ERR_ARG for
 * convenience in `return zs_set_error(...)`-style code paths. */
zs_status zs_set_error(const char *fmt, ...)
    __attribute__((format(printf, 1, 2)));
zs_status zs_set_error_code(zs_status code, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void zs_clear_error(void);
const char *zs_status_str(zs_status s);

/* ---- dtypes ---------------------------------------------------------- */

size_t zs_dtype_size(zs_dtype dt);
const char *zs_dtype_name(zs_dtype dt);
/* Parses "f32", "bf16", ...; returns -1 when unknown. */
int zs_dtype_parse(const char *name);
bool zs_dtype_is_float(zs_dtype dt);

/* Scalar conversions, round to nearest even, NaN and Inf preserved. */
uint16_t zs_f32_to_bf16(float x);
float zs_bf16_to_f32(uint16_t x);
uint16_t zs_f32_to_f16(float x);
float zs_f16_to_f32(uint16_t x);
uint8_t zs_f32_to_f8e4m3(float x); /* saturates to +-448, NaN stays NaN */
float zs_f8e4m3_to_f32(uint8_t x);
uint8_t zs_f32_to_f8e5m2(float x); /* overflow -> Inf */
float zs_f8e5m2_to_f32(uint8_t x);

/* ---- allocation ------------------------------------------------------ */

typedef struct zs_alloc_stats {
    size_t current_bytes; /* live bytes handed out */
    size_t peak_bytes;    /* high-water mark of current_bytes */
    size_t cached_bytes;  /* freed blocks kept for reuse */
    uint64_t n_allocs;    /* calls that returned a block */
    uint64_t n_system;    /* of those, served by the system allocator */
} zs_alloc_stats;

/* 64-byte aligned host memory from the caching allocator. NULL + message on
 * failure. zs_free(NULL) does nothing. */
void *zs_alloc(size_t nbytes);
void zs_free(void *p);
void zs_alloc_get_stats(zs_alloc_stats *st);
/* Asks the OS for huge pages under [p, p + n) (Linux transparent huge
 * pages, the 2 MiB pages wholly inside; a hint, nothing on other systems).
 * zs_alloc does it for blocks of 4 MiB and more; for large buffers from
 * elsewhere that are streamed through (a KV cache), before first touch. */
void zs_advise_huge(void *p, size_t n);
void zs_alloc_reset_peak(void);
/* Returns cached blocks to the system. */
void zs_alloc_trim(void);
/* Tests: make the n-th allocation from now fail (0 disables). */
void zs_alloc_fail_after(int64_t n);
/* A one-off large block, 64-byte aligned, rounded to 4 KiB instead of a
 * size class (zs_alloc's up to 25% waste), not cached: zs_free gives it
 * back to the system. For buffers allocated once and kept (a graph's
 * memory arena). NULL + message on failure. */
void *zs_alloc_exact(size_t nbytes);
/* Peak attribution, a debugging aid: with ZS_ALLOC_TRACE=1 (any value but
 * 0) in the environment when the program starts, the allocator remembers
 * for every live block the bytes asked for and the allocating thread's
 * tags (the outermost and the two innermost of its stack; tags are static
 * strings: the operator dispatcher pushes each operator's name, the
 * backward engine each node's, the trainer its phases), and at each new
 * high-water mark (and at zs_alloc_reset_peak) snapshots the live blocks
 * grouped by tags. Without the variable push/pop do nothing.
 * zs_alloc_peak_report prints the last snapshot, groups of min_bytes and
 * more one a line, largest first; ZS_OK, or an error when tracing is off. */
bool zs_alloc_tracing(void);
void zs_alloc_tag_push(const char *tag);
void zs_alloc_tag_pop(void);
zs_status zs_alloc_peak_report(FILE *f, size_t min_bytes);

/* ---- grad mode ---------------------------------------------------------- */

/* Grad mode: nestable no-grad regions, per thread. While one is open,
 * operators record nothing for autograd (zs/autograd.h). */
void zs_no_grad_push(void);
void zs_no_grad_pop(void);
bool zs_grad_enabled(void);
/* True for leaves marked with zs_set_requires_grad and for results of
 * recorded operations. */
bool zs_requires_grad(const zs_tensor *t);

/* ---- devices ----------------------------------------------------------- */

/* A device is an id in [0, ZS_MAX_DEVICES): ZS_CPU (0) is always there and
 * uses the caching host allocator above; others are registered with the
 * functions that allocate, free and copy their memory (CUDA will be one;
 * the tests register host memory under another id to test dispatch).
 * Every storage is allocated by its tensor's device; operators run the
 * kernel registered for (device, dtype) and refuse tensors on two devices.
 * Registration is not thread-safe: do it before other threads use the
 * library. */
#define ZS_MAX_DEVICES 8

typedef enum zs_copy_kind {
    ZS_COPY_TO_HOST,    /* device -> host */
    ZS_COPY_FROM_HOST,  /* host -> device */
    ZS_COPY_ON_DEVICE,  /* device -> the same device */
} zs_copy_kind;

/* A queue of work on one device (a CUDA stream); work on one stream runs
 * in order. NULL everywhere means the device's default stream. */
typedef struct zs_stream zs_stream;
/* A point in a stream's work (a CUDA event). */
typedef struct zs_event zs_event;

/* Bytes of one device's allocator: live, high-water mark, and freed but
 * kept for reuse (the caching allocators). */
typedef struct zs_device_stats {
    size_t current_bytes, peak_bytes, cached_bytes;
    uint64_t n_allocs;
} zs_device_stats;

/* The functions of a device. name, alloc, free and copy are required;
 * the rest may be NULL for a device whose work is synchronous (the
 * registry then does the obvious thing: memset through a host buffer,
 * asynchronous copies done at once, nothing to wait for, one stream). */
typedef struct zs_device_ops {
    const char *name;      /* "cpu", "cuda:0" (borrowed, static) */
    /* true when the CPU may read and write this memory directly (zs_data
     * refuses the tensors of other devices) */
    bool host_accessible;
    /* nbytes of device memory, NULL + message on failure; free(NULL) is a
     * no-op. */
    void *(*alloc)(void *ctx, size_t nbytes);
    void (*free)(void *ctx, void *p);
    /* Copies n bytes between host and device memory or within the device;
     * returns when the copy is done (after the work queued before it). */
    zs_status (*copy)(void *ctx, void *dst, const void *src, size_t n,
                      zs_copy_kind kind);
    void *ctx;
    /* Sets n bytes of device memory to byte. */
    zs_status (*memset)(void *ctx, void *p, int byte, size_t n);
    /* Queues a copy on stream (may return before it is done: the host
     * buffer must stay valid until the stream is synchronised). */
    zs_status (*copy_async)(void *ctx, void *dst, const void *src, size_t n,
                            zs_copy_kind kind, zs_stream *stream);
    /* Waits for the work queued on stream (NULL: all of the device's). */
    zs_status (*sync)(void *ctx, zs_stream *stream);
    zs_stream *(*stream_new)(void *ctx);
    void (*stream_free)(void *ctx, zs_stream *s);
    /* Events: record marks the work queued so far on stream; wait makes
     * stream wait for it (without blocking the host); event_sync blocks
     * the host until it is reached. */
    zs_event *(*event_new)(void *ctx);
    void (*event_free)(void *ctx, zs_event *e);
    zs_status (*event_record)(void *ctx, zs_event *e, zs_stream *stream);
    zs_status (*event_wait)(void *ctx, zs_stream *stream, zs_event *e);
    zs_status (*event_sync)(void *ctx, zs_event *e);
    void (*stats)(void *ctx, zs_device_stats *st);
} zs_device_ops;

/* Registers (ops != NULL; copied) or removes (NULL) device id 1..7. Fails
 * for the CPU's id, an id out of range, a device that still owns storage,
 * or ops without alloc, free and copy. */
zs_status zs_device_register(int device, const zs_device_ops *ops);
/* The device's ops (borrowed) or NULL when id is not registered. */
const zs_device_ops *zs_device_get(int device);
/* "cpu", the registered name, or "device <id> (not registered)". */
const char *zs_device_name(int device);
/* The id of the registered device named name ("cpu", "test", "cuda"), or
 * -1 + a message that lists the registered devices. */
int zs_device_find(const char *name);
/* "cpu, test": the registered devices' names, for messages. Borrowed,
 * per thread. */
const char *zs_device_list(void);
/* Uninitialised contiguous tensor on a device. */
zs_tensor *zs_empty_on(int device, zs_dtype dt, int ndim, const int64_t *shape);
zs_tensor *zs_zeros_on(int device, zs_dtype dt, int ndim, const int64_t *shape);
/* A contiguous copy of t on device (a new reference; a new header on t's
 * storage when it is already there and contiguous). No autograd. Host <-> device
 * is one copy; between two devices other than the CPU, two (through a
 * host buffer); a strided view on a device other than the CPU must be
 * made contiguous there first (zs_contiguous). */
zs_tensor *zs_to_device(zs_tensor *t, int device);
/* Copies src's bytes into dst: contiguous tensors of one dtype and numel,
 * on the same device or one of them on the CPU; queued on stream (a
 * stream of the device that is not the CPU; NULL: its default stream). A
 * host tensor must stay alive until the stream is synchronised. */
zs_status zs_copy_async(zs_tensor *dst, const zs_tensor *src, zs_stream *stream);
/* Waits for all queued work of the device. */
zs_status zs_device_sync(int device);
zs_status zs_device_get_stats(int device, zs_device_stats *st);
/* Streams and events of a device (NULL + message when it has none of its
 * own: a synchronous device gives one shared stream and no-op events). */
zs_stream *zs_stream_new(int device);
void zs_stream_free(int device, zs_stream *s);
zs_status zs_stream_sync(int device, zs_stream *s);
zs_event *zs_event_new(int device);
void zs_event_free(int device, zs_event *e);
zs_status zs_event_record(int device, zs_event *e, zs_stream *s);
zs_status zs_event_wait(int device, zs_stream *s, zs_event *e);
zs_status zs_event_sync(int device, zs_event *e);

/* ---- tensors: creation ----------------------------------------------- */

/* Uninitialised contiguous tensor. */
zs_tensor *zs_empty(zs_dtype dt, int ndim, const int64_t *shape);
zs_tensor *zs_zeros(zs_dtype dt, int ndim, const int64_t *shape);
zs_tensor *zs_ones(zs_dtype dt, int ndim, const int64_t *shape);
zs_tensor *zs_full(zs_dtype dt, int ndim, const int64_t *shape, double v);
/* 1-D [start, start+step, ...) with ceil((stop-start)/step) elements. */
zs_tensor *zs_arange(zs_dtype dt, double start, double stop, double step);
/* A 0-d tensor holding v. */
zs_tensor *zs_scalar(zs_dtype dt, double v);
/* Copies n = numel elements of dtype dt from data. */
zs_tensor *zs_from_data(zs_dtype dt, int ndim, const int64_t *shape,
                        const void *data);
/* Wraps caller memory without copying; the caller keeps it alive. */
zs_tensor *zs_from_blob(zs_dtype dt, int ndim, const int64_t *shape,
                        void *data);
/* Tensors like t (dtype, shape, device), contiguous. */
zs_tensor *zs_empty_like(const zs_tensor *t);
zs_tensor *zs_zeros_like(const zs_tensor *t);

/* Random tensors from the counter-based generator: element i of a call
 * depends only on (seed, the generator's counter, i), never on threads. */
zs_tensor *zs_uniform(zs_dtype dt, int ndim, const int64_t *shape,
                      double lo, double hi, uint64_t seed);
zs_tensor *zs_normal(zs_dtype dt, int ndim, const int64_t *shape,
                     double mean, double std, uint64_t seed);

/* Variadic-free shape helper: ZS_SHAPE(2, 3) -> 2, (int64_t[]){2, 3} */
#define ZS_SHAPE(...)                                                       \
    (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)),              \
        (const int64_t[]){__VA_ARGS__}

/* ---- tensors: lifetime ----------------------------------------------- */

zs_tensor *zs_retain(zs_tensor *t); /* returns t */
void zs_release(zs_tensor *t);      /* NULL is fine */

/* Scopes: every tensor returned by the library while a scope is open is
 * released when that scope pops, unless zs_keep moves it to the enclosing
 * scope (or, at the outermost scope, to the caller, who then owns it).
 * Inside a scope the caller must not zs_release what the scope owns. */
void zs_scope_push(void);
void zs_scope_pop(void);
zs_tensor *zs_keep(zs_tensor *t);  /* returns t */
int zs_scope_depth(void);

/* ---- tensors: queries ------------------------------------------------ */

int64_t zs_numel(const zs_tensor *t);
size_t zs_nbytes(const zs_tensor *t);   /* numel * element size */
bool zs_is_contiguous(const zs_tensor *t);
bool zs_same_shape(const zs_tensor *a, const zs_tensor *b);
/* Pointer to the first element (storage data + offset), for the CPU to
 * read or write. Borrowed. NULL + message for a tensor on a device whose
 * memory the CPU cannot address. */
void *zs_data(const zs_tensor *t);
/* Writes "[2, 3, 4]" into buf; returns buf. */
char *zs_shape_str(const zs_tensor *t, char *buf, size_t n);
/* Reads element at a flat row-major index (any layout), as double. */
double zs_get(const zs_tensor *t, int64_t flat_index);
/* Value of a one-element tensor. */
double zs_item(const zs_tensor *t);

/* ---- tensors: copy and conversion ------------------------------------ */

/* Copies the elements into buf (row-major, dtype of t). */
zs_status zs_copy_to_buffer(const zs_tensor *t, void *buf, size_t nbytes);
zs_status zs_copy_from_buffer(zs_tensor *t, const void *buf, size_t nbytes);

/* ---- printing -------------------------------------------------------- */

/* Prints shape, dtype and (abbreviated) values. */
void zs_print(const zs_tensor *t, FILE *f);

/* ---- threads --------------------------------------------------------- */

typedef void (*zs_range_fn)(void *ctx, int64_t begin, int64_t end);

/* Runs fn over [0, n) split into chunks of at least `grain` items across the
 * pool; the calling thread takes part. Returns when every chunk is done.
 * The pool serves one call at a time: a call from inside a pool task, or
 * from a thread that finds the pool busy with another thread's call, runs
 * fn(ctx, 0, n) on the calling thread. fn must therefore give the same
 * result for any split of [0, n) (the kernels split by zs_num_threads(),
 * never by who runs a chunk). */
void zs_parallel_for(int64_t n, int64_t grain, zs_range_fn fn, void *ctx);
/* Pool size (ZS_NUM_THREADS, else the number of online CPUs). */
int zs_num_threads(void);
/* The CPUs this process may run on: online CPUs cut to the affinity mask
 * and the cgroup CPU quota (rounded up). The pool's default size. */
int zs_cpu_count(void);
/* The cgroup CPU quota in CPUs, rounded up (v2 cpu.max, v1
 * cpu.cfs_quota_us / cpu.cfs_period_us); 0: no quota, or none readable. */
int zs_cpu_quota(void);
/* Processes of this MPI job on this host, from the launcher's environment
 * (OpenMPI, MPICH, PMI, MVAPICH); 0: not started by such a launcher. */
int zs_local_ranks(void);
/* Resizes the pool (1 = serial). Not to be called from pool tasks, nor
 * while other threads run operators (it waits for the pool, but kernels
 * that read zs_num_threads() mid-call would see two sizes). */
void zs_set_num_threads(int n);
/* Index of the calling thread in the pool, 0 for the caller. */
int zs_thread_index(void);

/* ---- random numbers -------------------------------------------------- */

/* Philox-4x32-10: 4 random 32-bit words for (key, counter). */
void zs_philox(uint64_t key, uint64_t counter, uint32_t out[4]);
/* Global seed for operators that take no explicit seed (dropout, init). */
void zs_manual_seed(uint64_t seed);
/* Reserves n draws from the global stream; returns (seed, offset) that
 * feed zs_philox deterministically. */
void zs_rng_reserve(uint64_t n, uint64_t *seed, uint64_t *offset);
/* State save/restore for checkpoints. */
void zs_rng_get_state(uint64_t *seed, uint64_t *offset);
void zs_rng_set_state(uint64_t seed, uint64_t offset);

/* ---- CPU features ---------------------------------------------------- */

typedef struct zs_cpu_features {
    bool avx2, fma, f16c, avx512f, avx512bw, avx512vl, avx512_bf16;
    bool avx512vnni;
} zs_cpu_features;
/* The features the kernels may use: the CPU's, capped by the environment
 * variable ZS_CPU_ISA = portable | avx2 | avx512 (default: the highest the
 * CPU has; a cap above it changes nothing; another value is warned about
 * once on stderr and ignored). Read once, at the first call. Every CPU
 * kernel family dispatches on these, so it follows the cap (`zs sysinfo`
 * prints the path each takes). */
const zs_cpu_features *zs_cpu(void);
/* The hardware's features, uncapped. */
const zs_cpu_features *zs_cpu_hw(void);
/* The cap in force: "avx512", "avx2" or "portable". */
const char *zs_cpu_isa(void);

#ifdef __cplusplus
}
#endif
#endif
