/*
 * ops/op.h - operators as data: the descriptor of an operator, the record a
 * backward rule reads, and the one eager driver that runs every operator.
 *
 * An operator is one zsi_opdef (../shared/DESIGN.md, "Operators"): its
 * name, arity, class, shape and dtype rule (infer), forward kernels indexed
 * by (device, dtype), what its backward rule needs (save), the backward
 * rule, and its cost model. zsi_run is the eager call: check inputs and
 * devices -> infer -> allocate on the device -> dispatch -> record for
 * autograd -> count the cost. A public operator is a few lines that fill
 * its attribute struct and call zsi_run.
 *
 * Layering: this layer never calls autograd. Autograd (above) installs the
 * recorder (zsi_set_recorder) that makes graph nodes; a node begins with a
 * zsi_ctx, which is all a backward rule sees. Grad mode lives in core.
 */
#ifndef ZS_OPS_OP_H
#define ZS_OPS_OP_H

#include <string.h>

#include "core/internal.h"

#define ZSI_MAX_SAVED 6
/* Inputs of a zsi_run call. 64 (was 8) for concat, which takes any number
 * of tensors and runs more than this in groups, each level one more pass
 * over the data (ops/join.c): concats of a batch or of attention heads
 * stay one call. Arrays of this size are pointers (zsi_via_f32's). */
#define ZSI_MAX_IN 64
#define ZSI_MAX_OUT 4 /* results of a zsi_run_n call */

typedef struct zsi_meta {
    zs_dtype dtype;
    int ndim;
    int64_t shape[ZS_MAX_DIMS];
} zsi_meta;

/* Attributes. An operator's parameters are a struct of its own (softmax:
 * { int64_t dim; }), declared with ZSI_ATTRS so its size is checked at
 * compile time, passed to zsi_run by address and copied whole (attr_size
 * bytes) into the node, so forward, backward and a replay of the recorded
 * call read the same struct: `const softmax_attrs *a = c->attrs` in a
 * kernel, `= zsi_node_attrs(n)` in a backward rule. Attributes hold
 * values, never pointers to the caller's memory. An operator with no
 * parameters has attr_size 0 and is called with NULL: its node's attrs
 * are zeros. */
#define ZSI_ATTR_BYTES 128
#define ZSI_ATTRS(T)                                                        \
    _Static_assert(sizeof(T) <= ZSI_ATTR_BYTES,                             \
                   #T " is larger than ZSI_ATTR_BYTES")

typedef struct zsi_op zsi_op;

/* What a backward rule reads: the recorded call. */
typedef struct zsi_ctx {
    const zsi_op *op;
    int nin;
    zsi_meta *in_meta;    /* [nin] dtype and shape of each input */
    uint8_t *needs;       /* [nin] 1 when input i wants a gradient */
    zsi_meta out_meta;
    zs_tensor *saved[ZSI_MAX_SAVED];
    /* the call's attributes, whole (def->attr_size bytes; the node is
     * malloc'd, so reading them as the operator's struct is defined) */
    _Alignas(16) unsigned char attrs[ZSI_ATTR_BYTES];
    union {
        double f[16];
        int64_t i[16];
    } p;                  /* what save computed for backward (by convention
                           * slots 8..15) */
    void *extra;          /* malloc'd parameters, freed with the record */
    /* set by the backward engine only while the rule runs (else NULL):
     * per input, the gradient buffer of a leaf input that the rule may
     * add its gradient into in place (leaving gin[i] NULL), or NULL */
    zs_tensor *const *acc;
} zsi_ctx;

/* The recorded call's attributes, as the operator's struct. */
static inline const void *zsi_node_attrs(const zsi_ctx *n) { return n->attrs; }
/* Input i's in-place gradient destination in a backward rule (borrowed;
 * contiguous, of the input's dtype and shape), or NULL: then the rule
 * returns gin[i] as usual. A rule that adds into it leaves gin[i] NULL.
 * Saves the transient of a weight's gradient before the engine adds it:
 * the engine offers a leaf's .grad when it exists and, to rules with
 * zsi_op.acc_nodes outside graph capture, the sum so far of a non-leaf
 * input's gradient when no other tensor shares its memory. */
static inline zs_tensor *zsi_grad_acc(const zsi_ctx *n, int i)
{
    return n->acc ? n->acc[i] : NULL;
}

/* Computes gin[i] (new references, or NULL when there is no gradient) for
 * every input i with zsi_needs_grad(n, i), from gout (borrowed, shape of the
 * output). Runs with grad mode off and scope tracking paused. */
typedef zs_status (*zsi_backward_fn)(zsi_ctx *n, zs_tensor *gout,
                                     zs_tensor **gin);

/* The part of a descriptor every operator has, including the ones not yet
 * run by zsi_run: name, backward rule, profiler counters. */
struct zsi_op {
    const char *name;
    zsi_backward_fn backward;
    /* the rule may also be offered (zsi_grad_acc) the gradient being summed
     * for an input made by another node, which the engine holds alone: a
     * slice's gradient is added into its slot there instead of a zeroed
     * input-sized buffer summed with the others' (GPT's q, k, v) */
    bool acc_nodes;
    /* counters, filled by zsi_op_end while profiling, under the profiler's
     * lock (ops/op.c) */
    uint64_t calls;
    double flops, bytes, seconds;
    struct zsi_op *next; /* registry list, under the registry's lock */
    /* set (release) once the op is on the registry list: a thread that
     * reads true (acquire) takes no lock */
    _Atomic bool registered;
};

typedef enum zsi_op_class {
    ZSI_OTHER = 0,
    ZSI_POINTWISE, /* out[i] = scalar(in[0][i], in[1][i], ...) (broadcast) */
    ZSI_REDUCTION,
    ZSI_GEMM,
    ZSI_VIEW,
} zsi_op_class;

typedef struct zsi_opdef zsi_opdef;

/* One eager call as zsi_run hands it to an operator's functions. infer
 * fills the output's dtype and shape (and may change `key`, the dtype
 * whose kernel runs, which starts as in[0]'s). */
typedef struct zsi_call {
    const zsi_opdef *def;
    int nin;
    zs_tensor *const *in;
    const void *attrs;   /* the operator's attribute struct (borrowed;
                          * zeros when the call passed NULL) */
    int device;
    zs_dtype key;
    zs_dtype dtype;
    int ndim;
    int64_t shape[ZS_MAX_DIMS];
    /* Extra results a kernel makes for the backward rule (argmax indices,
     * a norm's mean and rstd, a dropout mask): the kernel stores new
     * references here, save keeps what it needs (zsi_save), and the driver
     * releases all of them after save. Kernels make them only when
     * zsi_call_records(c) says a node will be recorded, and with scope
     * tracking paused (zsi_tracking_pause): the driver owns them. */
    zs_tensor **aux;
    /* a node will be recorded (grad mode on and an input requires grad);
     * kept in the call, so a backend that runs the kernel on aliases of
     * the inputs (the test device) still makes the aux results */
    bool records;
    /* Operators with several results (zsi_run_n): infer sets nout (1 by
     * default) and the dtype and shape of results 1.. in more[k-1]
     * (ndim -1: not wanted, left NULL); the driver allocates them on the
     * device into outs[1..] before the kernel runs (outs[0] is out). */
    int nout;
    zsi_meta more[ZSI_MAX_OUT - 1];
    zs_tensor **outs;
} zsi_call;

#define ZSI_MAX_AUX 4

typedef struct zsi_cost {
    double flops, bytes_read, bytes_written;
} zsi_cost;

/* Checks the inputs (dtypes, shapes, attributes) and fills the output's
 * dtype and shape; on failure a message naming the operator. */
typedef zs_status (*zsi_infer_fn)(zsi_call *c);
/* Writes out (allocated by the driver on c->device with the inferred dtype
 * and shape, contiguous) from c->in. */
typedef zs_status (*zsi_kernel_fn)(const zsi_call *c, zs_tensor *out);
/* View operators (class ZSI_VIEW) make their output from the input's
 * storage instead of a kernel writing a fresh tensor: a new reference. */
typedef zs_tensor *(*zsi_view_fn)(const zsi_call *c);
/* Saves in n (zsi_save, n->p) what the backward rule needs. */
typedef void (*zsi_save_fn)(zsi_ctx *n, const zsi_call *c, zs_tensor *out);
typedef zsi_cost (*zsi_cost_fn)(const zsi_call *c, const zs_tensor *out);
/* A pointwise operator's formula on doubles (x[k] = input k's value;
 * attrs: the call's attribute struct, the operator's own, as a node holds
 * it): the reference the tests use and what a fusion pass will compose. */
typedef double (*zsi_scalar_fn)(const double *x, const void *attrs);

struct zsi_opdef {
    zsi_op op;           /* first: a zsi_opdef * is a zsi_op * */
    int arity;
    zsi_op_class cls;
    const char *formula; /* pointwise: the formula in words, "a * b" */
    zsi_scalar_fn scalar;
    double flops;        /* pointwise: FLOPs per output element */
    zsi_infer_fn infer;
    zsi_kernel_fn kernel[ZS_MAX_DEVICES][ZS_DTYPE_COUNT];
    zsi_view_fn view;    /* ZSI_VIEW: replaces allocation and kernel */
    zsi_save_fn save;    /* NULL: the backward rule needs nothing */
    zsi_cost_fn cost;    /* NULL: flops per element, inputs read, output written */
    size_t attr_size;    /* sizeof the attribute struct; 0: none */
    /* forward descriptors: the descriptors their backward rule runs
     * (NULL-terminated; for the `zs ops` table) */
    zsi_opdef *const *bw_ops;
    /* In place: the kernel writes into in[0] itself (out == in[0]; an
     * update rule also into the state inputs it documents); zsi_run
     * allocates nothing, records no node and returns in[0], retained.
     * Refused under grad mode when in[0] requires grad and is not a leaf
     * (a node may have saved it); leaves (parameters) may be written. */
    bool inplace;
    /* The kernel also writes into inputs it documents while computing a
     * result (batch norm's running statistics): a dry graph capture runs
     * it on zeros only (ops/dispatch.c). */
    bool writes_inputs;
    /* In place into in[0] only, the other inputs read (matmul_acc_): what
     * graph passes may assume of the node's writes (else an in-place
     * node may write any input, as the updates do). */
    bool inplace_in0;
    /* Autocast (ops/autocast.c): the cast class (zsi_amp_class) and, for
     * ZSI_AMP_F32, whether a kernel registered for a low dtype computes
     * in f32 itself, so low inputs need no f32 copy. Filled from the one
     * table in autocast.c before main; descriptors do not set them. */
    uint8_t amp;
    bool amp_reads_lowp;
};

/* How the driver treats an operator's float inputs under
 * zs_autocast_push (ops/autocast.c, docs/precision.md). */
typedef enum zsi_amp_class {
    ZSI_AMP_DEFAULT = 0, /* the input's dtype; f32 where no low kernel */
    ZSI_AMP_LOWP,        /* f32 inputs cast to the low dtype */
    ZSI_AMP_F32,         /* low inputs computed in f32 */
    ZSI_AMP_PROMOTE,     /* mixed float dtypes: the widest */
    ZSI_AMP_NEVER,       /* never cast (the cast itself, plain copies) */
} zsi_amp_class;

/* The thread's autocast dtype: ZS_F32 when off (zs_autocast_dtype). */
extern _Thread_local zs_dtype zsi_amp_dtype;
/* Under autocast: the inputs def runs on. Returns 0 when in[] stays as
 * it is, > 0 when cast[0..nin) hold new references (casts, or in[i]
 * retained) to run on instead, < 0 on failure (message set). Forward
 * calls only (zsi_run); never for views or in-place operators. */
int zsi_autocast_inputs(const zsi_opdef *def, int nin, zs_tensor *const *in,
                        zs_tensor **cast);
/* The dtype a ZSI_AMP_LOWP operator def computes in on device under
 * autocast dtype lowp: the one place the route is chosen (fp8: ZS_F8E4M3
 * for the linears, which zsi_autocast_fp8 runs as linear_fp8, bf16 for
 * the other products), f32 where def has no kernel for it. */
zs_dtype zsi_autocast_route(const zsi_opdef *def, int device, zs_dtype lowp);
/* Under autocast fp8, the linears (linear, linear_gelu, linear_residual)
 * with f32 master weights and an f32 or bf16 input run as linear_fp8
 * (zs_linear_fp8: e4m3 tiles, f32 result) followed by their epilogue in
 * f32 (GeLU, the residual add): returns that result (a new reference, or
 * NULL with the message set) with *done true; *done false (NULL) when the
 * call takes the ordinary route. The driver calls it first. */
zs_tensor *zsi_autocast_fp8(zsi_opdef *def, int nin, zs_tensor *const *in,
                            bool *done);
/* The autocast column of `zs ops`: "lowp", "f32", "f32/reads-lowp", ... */
const char *zsi_amp_class_name(const zsi_opdef *def);

/* The eager driver: runs def on nin inputs (NULL inputs: returns NULL with
 * the first error kept) with attributes a (the operator's struct, borrowed;
 * NULL: zeros). Returns a new tensor or NULL + message. When it records a
 * node, the attributes are copied whole (def->attr_size bytes; none for 0)
 * into n->attrs before def->save runs; n->p is the operator's. */
zs_tensor *zsi_run(zsi_opdef *def, int nin, zs_tensor *const *in,
                   const void *a);
/* zsi_run for an operator with up to ZSI_MAX_OUT results (a fused backward
 * kernel's gradients): out[0..nout) receive new references, or NULL for a
 * result infer marked as not wanted; on failure all are NULL and the
 * status is negative (message set). Records no node: such operators are
 * not differentiable (they run under backward, with grad mode off). */
zs_status zsi_run_n(zsi_opdef *def, int nin, zs_tensor *const *in,
                    const void *a, int nout, zs_tensor **out);
/* True when grad mode is on and an input of c requires grad: a node will
 * be recorded, so kernels should make the aux results save needs. */
bool zsi_call_records(const zsi_call *c);
/* Aux result k of c (ops/aux.c): the tensor a graph replay supplies in
 * c->aux[k], or a new uninitialised one on c's device (dtype dt, shape),
 * stored in c->aux[k]. Borrowed (the driver or the graph node owns it);
 * NULL on allocation failure. Kernels make their aux results with these
 * two so that a replay writes into the captured ones. */
zs_tensor *zsi_aux_new(const zsi_call *c, int k, zs_dtype dt, int ndim,
                       const int64_t *shape);
/* Aux result k derived from input t by make (zs_contiguous, a conversion;
 * a new reference, called with grad mode off and tracking paused): made
 * eagerly; on replay the supplied tensor, refreshed from t by zs_copy_
 * unless it views t's very elements. Borrowed, stored in c->aux[k]; NULL
 * on failure. */
zs_tensor *zsi_aux_copy(const zsi_call *c, int k, zs_tensor *t,
                        zs_tensor *(*make)(zs_tensor *));
/* Graph capture (graph/graph.c): set, per thread, while a graph is
 * captured; the driver calls it after the kernel of each outermost call
 * ran (k the kernel it looked up, out its first result; in place: in[0];
 * c->outs and c->aux filled), never for views or calls made inside a
 * kernel. A negative status fails the call. Also called with c NULL
 * before an outermost call allocates its results (the recorder frees the
 * memory of values dropped since, graph/lean.c); its status is ignored. */
typedef zs_status (*zsi_capture_fn)(const zsi_call *c, zsi_kernel_fn k,
                                    zs_tensor *out);
extern _Thread_local zsi_capture_fn zsi_capture;
/* Frees this thread's zeroed scratch of dry captures (zsi_dry_capture,
 * core/internal.h: the driver records calls without computing them;
 * ops/dispatch.c). */
void zsi_dry_release(void);
/* Installs (or, with fn NULL, removes) the kernel of def for (device,
 * dtype): how a backend adds itself, and how the tests count calls. Not
 * thread-safe against calls of def: set kernels before threads run
 * operators. */
zs_status zsi_op_set_kernel(zsi_opdef *def, int device, zs_dtype dt,
                            zsi_kernel_fn fn);
/* Sets c's output dtype and shape to t's (the common infer ending). */
static inline void zsi_out_like(zsi_call *c, const zs_tensor *t)
{
    c->dtype = t->dtype;
    c->ndim = t->ndim;
    memcpy(c->shape, t->shape, sizeof c->shape);
}
/* The infer of operators whose output has their first input's float dtype
 * and shape (the unary and scalar elementwise operators). */
zs_status zsi_infer_same_float(zsi_call *c);
/* A low-precision CPU kernel written once: converts c's bf16/f16/fp8
 * inputs to f32, runs the f32 kernel into an f32 result and rounds it into
 * out (FP32 arithmetic, one rounding). The conversions are host copies
 * (zsi_copy_host), not driver calls: for CPU kernels only. */
zs_status zsi_via_f32(const zsi_call *c, zs_tensor *out, zsi_kernel_fn f32);
/* Every descriptor of the library (ops/oplist.h), NULL-terminated, from
 * before main: the table backends and passes walk. */
zsi_opdef *const *zsi_opdefs(void);
/* The descriptor named name, or NULL. */
zsi_opdef *zsi_opdef_find(const char *name);

#include "ops/oplist.h" /* extern zsi_opdef zsi_def_...; */

/* Profiling: call zsi_op_begin first thing, zsi_op_end with the cost model
 * just before returning the result (zsi_run does both). zsi_op_begin puts
 * op on the registry on its first call (race-free; later calls take no
 * lock) and returns the start time while profiling is on, else 0;
 * zsi_op_end counts only a call whose t0 is not 0, under a lock, so
 * profiling off costs a load and a test. Thread-safe. */
double zsi_op_begin(zsi_op *op);
void zsi_op_end(zsi_op *op, double t0, double flops, double bytes_read,
                double bytes_written);

/* Recording. The recorder (installed by autograd) makes out's node when
 * grad mode is on and some input requires grad, and returns its record
 * (owned by out), or NULL when nothing is recorded; it fails only on
 * allocation failure (message set). Without a recorder nothing is. */
typedef zs_status (*zsi_recorder_fn)(zsi_op *op, zs_tensor *out, int nin,
                                     zs_tensor *const *in, zsi_ctx **ctx);
/* Called once, by autograd's constructor before main; read-only after. */
void zsi_set_recorder(zsi_recorder_fn fn);
zs_status zsi_record(zsi_op *op, zs_tensor *out, int nin, zs_tensor *const *in,
                     zsi_ctx **ctx);
/* The record of the node that made t (NULL for leaves). */
static inline zsi_ctx *zsi_ctx_of(const zs_tensor *t)
{
    return (zsi_ctx *)t->node; /* a node begins with its zsi_ctx */
}
/* Saves a detached alias of t in slot k of n (t may be NULL). */
void zsi_save(zsi_ctx *n, int k, zs_tensor *t);
static inline bool zsi_needs_grad(const zsi_ctx *n, int i)
{
    return n->needs[i] != 0;
}

/* Sums g over the dims that were broadcast from the shape in m and reshapes
 * to it; new reference. */
zs_tensor *zsi_sum_to(zs_tensor *g, const zsi_meta *m);

#endif
