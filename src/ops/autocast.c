/*
 * autocast.c - mixed precision as PyTorch's autocast (zs_autocast_push,
 * zs/ops.h): under a low dtype (bf16, f16, fp8) the driver (zsi_run,
 * forward calls only) casts an operator's float inputs by the operator's
 * cast class, written down once in `table` below and in
 * docs/precision.md:
 *
 *   LOWP     matmul, linear(+gelu, +residual), conv2d, attention: f32
 *            inputs are cast to the dtype the products run in
 *            (zsi_autocast_route: the low dtype; bf16 for fp8 until an
 *            FP8 kernel is wired there; f32 where the operator has no
 *            kernel for it), accumulation in f32 inside the kernel.
 *   F32      norms, softmax, losses, reductions: low inputs computed in
 *            f32. A row with reads_lowp runs on the low dtype's own kernel
 *            instead when one is registered (it computes in f32 and reads
 *            and writes the low dtype: no f32 copy of the activation is
 *            made or saved for backward), as PyTorch's CPU kernels do.
 *            cross_entropy is such a row: its loss value is f32 (the
 *            f32_loss attribute zs_cross_entropy sets under autocast).
 *   PROMOTE  add, sub, mul, div, where, concat with mixed float dtypes:
 *            the widest (f32).
 *   DEFAULT  everything else runs in its input's dtype; where the operator
 *            has no kernel for that low dtype, in f32.
 *   NEVER    the cast itself, copies, views, in-place operators.
 * f64 calls are never cast (gradient checks stay exact). Casts are
 * to_dtype operators, so gradients flow back through them: a parameter
 * (f32 leaf) gets its gradient in f32.
 *
 * Weights are cast once per scope, not once per use: the cast of a leaf
 * that requires grad is cached until the scope pops (PyTorch's autocast
 * cache), and zs_autocast_cache_flat converts a whole flat parameter
 * buffer in one pass so that every parameter's cast is a view of it. Each
 * use gets a fresh alias carrying its own to_dtype node, so several
 * forwards (gradient accumulation) may backpropagate through one cast.
 *
 * Threads: the stack, the cache and the counters are the calling thread's.
 * The backward pass runs with autocast off (autograd/engine.c pushes
 * ZS_F32), as PyTorch runs backward outside the autocast region.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "ops/op.h"
#include "zs/ops.h"

_Thread_local zs_dtype zsi_amp_dtype = ZS_F32;
static _Thread_local zs_autocast_stats stats;

/* ---- the cast table ------------------------------------------------------- */

typedef struct amp_row {
    zsi_opdef *def;
    zsi_amp_class cls;
    bool reads_lowp; /* F32 class: a low-dtype kernel computes in f32 */
} amp_row;

static const amp_row table[] = {
    /* products: the low dtype, f32 accumulation */
    {&zsi_def_matmul, ZSI_AMP_LOWP, false},
    {&zsi_def_linear, ZSI_AMP_LOWP, false},
    {&zsi_def_linear_gelu, ZSI_AMP_LOWP, false},
    {&zsi_def_linear_res, ZSI_AMP_LOWP, false},
    {&zsi_def_conv2d, ZSI_AMP_LOWP, false},
    {&zsi_def_attention, ZSI_AMP_LOWP, false},
    /* f32: norms, softmax, reductions (their low kernels compute in f32) */
    {&zsi_def_layer_norm, ZSI_AMP_F32, true},
    {&zsi_def_softmax, ZSI_AMP_F32, true},
    {&zsi_def_log_softmax, ZSI_AMP_F32, true},
    {&zsi_def_sum, ZSI_AMP_F32, true},
    {&zsi_def_mean, ZSI_AMP_F32, true},
    {&zsi_def_var, ZSI_AMP_F32, true},
    {&zsi_def_sum_squares, ZSI_AMP_F32, true},
    /* f32 always: batch statistics, the loss value */
    {&zsi_def_batch_norm, ZSI_AMP_F32, false},
    /* the loss: f32 value; the low kernel reads the low logits */
    {&zsi_def_cross_entropy, ZSI_AMP_F32, true},
    {&zsi_def_mse, ZSI_AMP_F32, false},
    /* optimizer updates: f32 master weights and state (in place: the
     * driver never casts them; listed for the table) */
    {&zsi_def_sgd_update, ZSI_AMP_F32, false},
    {&zsi_def_adam_update, ZSI_AMP_F32, false},
    {&zsi_def_sgd_update_dyn, ZSI_AMP_F32, false},
    {&zsi_def_adam_update_dyn, ZSI_AMP_F32, false},
    /* mixed float dtypes: the widest */
    {&zsi_def_add, ZSI_AMP_PROMOTE, false},
    {&zsi_def_sub, ZSI_AMP_PROMOTE, false},
    {&zsi_def_mul, ZSI_AMP_PROMOTE, false},
    {&zsi_def_div, ZSI_AMP_PROMOTE, false},
    {&zsi_def_where, ZSI_AMP_PROMOTE, false},
    {&zsi_def_concat, ZSI_AMP_PROMOTE, false},
    /* never cast: the cast itself and plain copies */
    {&zsi_def_to_dtype, ZSI_AMP_NEVER, false},
    {&zsi_def_copy, ZSI_AMP_NEVER, false},
};

static pthread_once_t table_once = PTHREAD_ONCE_INIT;

/* Copies the table into the descriptors (and marks the backward
 * descriptors, which run with autocast off, NEVER). */
static void fill_table(void)
{
    for (zsi_opdef *const *d = zsi_opdefs(); *d; d++) {
        const char *nm = (*d)->op.name;
        size_t n = strlen(nm);
        if (n > 9 && !strcmp(nm + n - 9, "_backward"))
            (*d)->amp = ZSI_AMP_NEVER;
    }
    for (size_t i = 0; i < sizeof table / sizeof *table; i++) {
        table[i].def->amp = (uint8_t)table[i].cls;
        table[i].def->amp_reads_lowp = table[i].reads_lowp;
    }
}

const char *zsi_amp_class_name(const zsi_opdef *def)
{
    pthread_once(&table_once, fill_table);
    if (def->inplace || def->view)
        return def->amp == ZSI_AMP_F32 ? "f32" : "never";
    switch ((zsi_amp_class)def->amp) {
    case ZSI_AMP_LOWP: return "lowp";
    case ZSI_AMP_F32: return def->amp_reads_lowp ? "f32/reads-lowp" : "f32";
    case ZSI_AMP_PROMOTE: return "promote";
    case ZSI_AMP_NEVER: return "never";
    default: return "default";
    }
}

static bool is_linear(const zsi_opdef *def)
{
    return def == &zsi_def_linear || def == &zsi_def_linear_gelu ||
           def == &zsi_def_linear_res;
}

zs_dtype zsi_autocast_route(const zsi_opdef *def, int device, zs_dtype lowp)
{
    if (device < 0 || device >= ZS_MAX_DEVICES)
        return ZS_F32;
    /* FP8 (e4m3 weights and activations, tile scales): the linears run as
     * linear_fp8 (zsi_autocast_fp8) where the device has its kernel; the
     * other products (matmul, conv2d, attention) through the BF16 path */
    if (lowp == ZS_F8E4M3 && is_linear(def) &&
        zsi_def_linear_fp8.kernel[device][ZS_F32])
        return ZS_F8E4M3;
    zs_dtype dt = lowp == ZS_F8E4M3 ? ZS_BF16 : lowp;
    if (dt == ZS_F32)
        return ZS_F32;
    return def->kernel[device][dt] ? dt : ZS_F32;
}

/* The weights' compute dtype: matmul's route (bf16 for fp8, whose linears
 * quantize the f32 master weights themselves and whose other products
 * read the bf16 copies). */
zs_dtype zs_autocast_compute_dtype(zs_dtype lowp, int device)
{
    return zsi_autocast_route(&zsi_def_matmul, device, lowp);
}

/* ---- FP8: the linears through linear_fp8 ---------------------------------- */

zs_tensor *zsi_autocast_fp8(zsi_opdef *def, int nin, zs_tensor *const *in,
                            bool *done)
{
    *done = false;
    if (zsi_amp_dtype != ZS_F8E4M3 || !is_linear(def) || nin < 2 ||
        zsi_autocast_route(def, in[0]->device, ZS_F8E4M3) != ZS_F8E4M3)
        return NULL;
    bool res = def == &zsi_def_linear_res;
    zs_tensor *x = in[0], *w = in[1];
    zs_tensor *b = nin > 2 + res ? in[2] : NULL, *r = res ? in[nin - 1] : NULL;
    /* master weights f32 and an f32 or bf16 input, else the BF16 path */
    if ((x->dtype != ZS_F32 && x->dtype != ZS_BF16) || w->dtype != ZS_F32 ||
        (b && b->dtype != ZS_F32) || (res && nin < 3))
        return NULL;
    *done = true;
    stats.fp8_linears++;
    zsi_tracking_pause();
    zs_tensor *y = zs_linear_fp8(x, w, b), *o = y;
    if (y && def == &zsi_def_linear_gelu)
        o = zs_gelu(y, ZS_GELU_TANH); /* linear_gelu's GeLU, in f32 */
    else if (y && res)
        o = zs_add(y, r); /* the residual: f32 (promoted) */
    if (o != y)
        zs_release(y);
    zsi_tracking_resume();
    return zsi_track(o);
}

/* ---- the stack and the weight cache ------------------------------------- */

#define AMP_DEPTH 16
#define AMP_FLATS 4

typedef struct cache_entry {
    zs_tensor *src; /* the leaf (retained) */
    zs_tensor *low; /* its cast, no autograd (owned) */
} cache_entry;

typedef struct level {
    zs_dtype dt;
    cache_entry *e;
    int n, cap;
    cache_entry flat[AMP_FLATS]; /* src: an f32 flat buffer, low: its cast */
    int nflat;
} level;

static _Thread_local level stack[AMP_DEPTH];
static _Thread_local int depth;

zs_status zs_autocast_push(zs_dtype lowp)
{
    if (lowp != ZS_F32 && lowp != ZS_BF16 && lowp != ZS_F16 && lowp != ZS_F8E4M3)
        return zs_set_error("autocast: dtype %s is not a precision policy, expected "
                            "bf16, f16, f8e4m3 or f32 (off)",
                            (unsigned)lowp < ZS_DTYPE_COUNT ? zs_dtype_name(lowp) : "?");
    if (depth == AMP_DEPTH)
        return zs_set_error_code(ZS_ERR_STATE, "autocast: more than %d nested "
                                 "scopes", AMP_DEPTH);
    pthread_once(&table_once, fill_table);
    stack[depth++] = (level){.dt = lowp};
    zsi_amp_dtype = lowp;
    return ZS_OK;
}

zs_status zs_autocast_pop(void)
{
    if (depth == 0)
        return zs_set_error_code(ZS_ERR_STATE, "autocast: pop without a push");
    level *l = &stack[--depth];
    for (int i = 0; i < l->n; i++) {
        zs_release(l->e[i].src);
        zs_release(l->e[i].low);
    }
    for (int i = 0; i < l->nflat; i++) {
        zs_release(l->flat[i].src);
        zs_release(l->flat[i].low);
    }
    free(l->e);
    *l = (level){0};
    zsi_amp_dtype = depth ? stack[depth - 1].dt : ZS_F32;
    return ZS_OK;
}

zs_dtype zs_autocast_dtype(void) { return zsi_amp_dtype; }

void zs_autocast_get_stats(zs_autocast_stats *s) { *s = stats; }
void zs_autocast_reset_stats(void) { memset(&stats, 0, sizeof stats); }

/* Appends (src, low) to the top level, taking low and retaining src. */
static zs_status cache_put(zs_tensor *src, zs_tensor *low)
{
    level *l = &stack[depth - 1];
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 64;
        cache_entry *e = realloc(l->e, (size_t)cap * sizeof *e);
        if (!e)
            return zs_set_error_code(ZS_ERR_NOMEM, "autocast: out of memory");
        l->e = e;
        l->cap = cap;
    }
    l->e[l->n++] = (cache_entry){zs_retain(src), low};
    return ZS_OK;
}

/* A view of a registered flat cast at t's place, or NULL. */
static zs_tensor *flat_view(const level *l, const zs_tensor *t, zs_dtype dt)
{
    for (int i = 0; i < l->nflat; i++) {
        const zs_tensor *f = l->flat[i].src, *low = l->flat[i].low;
        int64_t rel = t->offset - f->offset, last = rel;
        for (int d = 0; d < t->ndim; d++)
            last += (t->shape[d] - 1) * t->strides[d];
        if (f->storage == t->storage && low->dtype == dt && rel >= 0 &&
            zs_numel(t) > 0 && last < zs_numel(f))
            return zsi_new_view(low, t->ndim, t->shape, t->strides, low->offset + rel);
    }
    return NULL;
}

/* The cached cast of leaf t to dt (borrowed), made on first use. */
static zs_tensor *cached_low(zs_tensor *t, zs_dtype dt)
{
    for (int k = depth - 1; k >= 0; k--) {
        const level *l = &stack[k];
        for (int i = 0; i < l->n; i++)
            if (l->e[i].src == t && l->e[i].low->dtype == dt) {
                stats.cache_hits++;
                return l->e[i].low;
            }
    }
    zs_tensor *low = NULL;
    for (int k = depth - 1; k >= 0 && !low; k--)
        low = flat_view(&stack[k], t, dt);
    if (low) {
        stats.flat_views++;
    } else {
        zs_no_grad_push();
        low = zs_to_dtype(t, dt);
        zs_no_grad_pop();
        if (!low)
            return NULL;
        stats.weight_casts++;
        stats.weight_cast_elems += zs_numel(t);
    }
    if (cache_put(t, low) != ZS_OK) {
        zs_release(low);
        return NULL;
    }
    return low;
}

/* Leaf t cast to dt through the cache: an alias of the cached cast with a
 * to_dtype node of its own from t (under grad mode), a new reference. */
static zs_tensor *cast_leaf(zs_tensor *t, zs_dtype dt)
{
    zs_tensor *low = cached_low(t, dt);
    if (!low)
        return NULL;
    zs_tensor *a = zsi_new_view(low, low->ndim, low->shape, low->strides, low->offset);
    zsi_ctx *n = NULL;
    if (a && zsi_record(&zsi_def_to_dtype.op, a, 1, &t, &n) != ZS_OK) {
        zs_release(a);
        return NULL;
    }
    if (n) { /* to_dtype's attributes: views.c's copy_attrs, { int64_t dtype } */
        int64_t d = dt;
        memcpy(n->attrs, &d, zsi_def_to_dtype.attr_size < sizeof d
                                 ? zsi_def_to_dtype.attr_size : sizeof d);
    }
    return a;
}

static zs_tensor *cast_one(zs_tensor *t, zs_dtype dt)
{
    if (!t->node && t->requires_grad && t->dtype == ZS_F32 && dt != ZS_F32)
        return cast_leaf(t, dt);
    stats.casts++;
    return zs_to_dtype(t, dt);
}

zs_status zs_autocast_cache_flat(zs_tensor *flat, zs_tensor *low)
{
    if (!flat)
        return ZS_ERR_ARG;
    if (zsi_amp_dtype == ZS_F32)
        return zs_set_error_code(ZS_ERR_STATE, "autocast_cache_flat: autocast is "
                                 "off (push a low dtype first)");
    zs_dtype dt = zs_autocast_compute_dtype(zsi_amp_dtype, (int)flat->device);
    if (dt == ZS_F32) /* the products run in f32 here: nothing to cast */
        return ZS_OK;
    if (flat->dtype != ZS_F32 || !zs_is_contiguous(flat))
        return zs_set_error("autocast_cache_flat: the flat buffer is %s%s, expected "
                            "contiguous f32", zs_dtype_name(flat->dtype),
                            zs_is_contiguous(flat) ? "" : " (strided)");
    if (low && (low->dtype != dt || !zs_is_contiguous(low) ||
                zs_numel(low) != zs_numel(flat) || low->device != flat->device))
        return zs_set_error("autocast_cache_flat: the low buffer must be a contiguous "
                            "%s tensor of %lld elements on %s", zs_dtype_name(dt),
                            (long long)zs_numel(flat), zs_device_name(flat->device));
    level *l = &stack[depth - 1];
    if (l->nflat == AMP_FLATS)
        return zs_set_error_code(ZS_ERR_STATE, "autocast_cache_flat: more than %d "
                                 "flat buffers in one scope", AMP_FLATS);
    zsi_tracking_pause();
    zs_tensor *dst = low ? zs_retain(low)
                         : zs_empty_on((int)flat->device, dt, flat->ndim, flat->shape);
    zs_no_grad_push();
    zs_status st = dst ? zs_copy_(dst, flat) : ZS_ERR_NOMEM;
    zs_no_grad_pop();
    zsi_tracking_resume();
    if (st != ZS_OK) {
        zs_release(dst);
        return st;
    }
    stats.weight_casts++;
    stats.weight_cast_elems += zs_numel(flat);
    l->flat[l->nflat++] = (cache_entry){zs_retain(flat), dst};
    return ZS_OK;
}

/* ---- the driver's hook ---------------------------------------------------- */

static bool eligible(const zs_tensor *t)
{
    return zs_dtype_is_float(t->dtype) && t->dtype != ZS_F64;
}

/* The dtype def's float inputs run in under autocast dtype lowp, or false
 * when the call stays as it is. */
static bool plan(const zsi_opdef *def, int nin, zs_tensor *const *in,
                 zs_dtype lowp, zs_dtype *target)
{
    bool any_low = false, mixed_low = false, any_f32 = false;
    zs_dtype low = ZS_F32;
    for (int i = 0; i < nin; i++) {
        zs_dtype dt = in[i]->dtype;
        if (!zs_dtype_is_float(dt))
            continue;
        if (dt == ZS_F64)
            return false; /* f64 is never autocast */
        if (dt == ZS_F32) {
            any_f32 = true;
        } else {
            mixed_low = mixed_low || (any_low && low != dt);
            any_low = true;
            low = dt;
        }
    }
    int dev = in[0]->device;
    switch ((zsi_amp_class)def->amp) {
    case ZSI_AMP_LOWP:
        *target = zsi_autocast_route(def, dev, lowp);
        if (*target == ZS_F8E4M3) /* not taken by zsi_autocast_fp8 */
            *target = zsi_autocast_route(def, dev, ZS_BF16);
        return any_low || any_f32;
    case ZSI_AMP_F32:
        *target = def->amp_reads_lowp && !mixed_low && def->kernel[dev][low] ? low
                                                                            : ZS_F32;
        return any_low;
    case ZSI_AMP_PROMOTE:
        *target = ZS_F32;
        return any_low && (any_f32 || mixed_low);
    case ZSI_AMP_DEFAULT: {
        zs_dtype key = zs_dtype_is_float(in[0]->dtype) ? in[0]->dtype : low;
        *target = ZS_F32;
        return any_low && !def->kernel[dev][key] && def->kernel[dev][ZS_F32];
    }
    default:
        return false;
    }
}

int zsi_autocast_inputs(const zsi_opdef *def, int nin, zs_tensor *const *in,
                        zs_tensor **cast)
{
    zs_dtype target;
    if ((unsigned)in[0]->device >= ZS_MAX_DEVICES ||
        !plan(def, nin, in, zsi_amp_dtype, &target))
        return 0;
    int changed = 0, i = 0;
    zsi_tracking_pause();
    for (; i < nin; i++) {
        bool c = eligible(in[i]) && in[i]->dtype != target;
        if (!(cast[i] = c ? cast_one(in[i], target) : zs_retain(in[i])))
            break;
        changed += c;
    }
    zsi_tracking_resume();
    if (i == nin && changed)
        return changed;
    for (int k = 0; k < i; k++)
        zs_release(cast[k]);
    return i == nin ? 0 : -1;
}
