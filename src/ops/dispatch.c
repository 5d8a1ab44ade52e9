/*
 * dispatch.c - zsi_run, the one eager driver of every operator described
 * by a zsi_opdef (ops/op.h), and the descriptor registry.
 *
 * A call: NULL inputs pass the first error on; every input must be on one
 * device; infer checks dtypes and shapes and gives the output's; the
 * kernel for (device, kernel dtype) is looked up (its absence is an error
 * listing what exists); the output is allocated by the device; the kernel
 * runs; autograd's recorder makes a node and the descriptor saves what its
 * backward needs; the cost model is counted. zsi_run_n is the same for
 * operators with several results (fused backward kernels). In-place
 * operators (def->inplace: axpy_, copy_, the optimizers' updates) skip
 * allocation and recording: their kernel writes into in[0]. The list of
 * descriptors is ops/oplist.h. Measured overhead of one call
 * on a 1-element tensor: bench/dispatch.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "ops/op.h"
#include "zs/ops.h"

/* The one list (ops/oplist.h), complete before main. */
#define ZSI_OP(sym) &sym,
static zsi_opdef *const defs[] = {
#include "ops/oplist.h"
    NULL};

zsi_opdef *const *zsi_opdefs(void) { return defs; }

zsi_opdef *zsi_opdef_find(const char *name)
{
    for (int i = 0; defs[i]; i++)
        if (!strcmp(defs[i]->op.name, name))
            return defs[i];
    return NULL;
}

zs_status zsi_op_set_kernel(zsi_opdef *def, int device, zs_dtype dt,
                            zsi_kernel_fn fn)
{
    if (device < 0 || device >= ZS_MAX_DEVICES || (unsigned)dt >= ZS_DTYPE_COUNT)
        return zs_set_error("%s: no kernel slot for device %d, dtype %d",
                            def->op.name, device, (int)dt);
    def->kernel[device][dt] = fn;
    return ZS_OK;
}

/* "f32, f64 on cpu; f32 on testdev" */
static void kernels_text(const zsi_opdef *def, char *buf, size_t n)
{
    size_t k = 0;
    buf[0] = '\0';
    for (int d = 0; d < ZS_MAX_DEVICES && k < n; d++) {
        bool any = false;
        for (int t = 0; t < ZS_DTYPE_COUNT && k < n; t++) {
            if (!def->kernel[d][t])
                continue;
            k += (size_t)snprintf(buf + k, n - k, "%s%s", any ? ", " : k ? "; " : "",
                                  zs_dtype_name((zs_dtype)t));
            any = true;
        }
        if (any && k < n)
            k += (size_t)snprintf(buf + k, n - k, " on %s", zs_device_name(d));
    }
    if (!buf[0])
        snprintf(buf, n, "none");
}

static zs_status check_devices(const zsi_call *c)
{
    for (int i = 1; i < c->nin; i++)
        if ((int)c->in[i]->device != c->device)
            return zs_set_error("%s: inputs on %s and %s: expected one device "
                                "(move them with zs_to_device)",
                                c->def->op.name, zs_device_name(c->device),
                                zs_device_name(c->in[i]->device));
    return ZS_OK;
}

static zsi_kernel_fn find_kernel(const zsi_call *c)
{
    zsi_kernel_fn k = c->device < ZS_MAX_DEVICES && (unsigned)c->key < ZS_DTYPE_COUNT
                          ? c->def->kernel[c->device][c->key] : NULL;
    if (!k) {
        char have[256];
        kernels_text(c->def, have, sizeof have);
        zs_set_error_code(ZS_ERR_UNSUPPORTED, "%s: no kernel for %s on %s "
                          "(kernels: %s)", c->def->op.name,
                          zs_dtype_name(c->key), zs_device_name(c->device), have);
    }
    return k;
}

static zsi_cost default_cost(const zsi_call *c, const zs_tensor *out)
{
    double n = (double)zs_numel(out);
    zsi_cost k = {c->def->flops * n, 0, n * (double)zs_dtype_size(out->dtype)};
    for (int i = 0; i < c->nin; i++)
        k.bytes_read += (double)zs_nbytes(c->in[i]);
    return k;
}

bool zsi_call_records(const zsi_call *c) { return c->records; }

_Thread_local zsi_capture_fn zsi_capture;
static _Thread_local int kernel_depth; /* kernels running, while capturing */

/* ---- dry capture (zs_graph_capture_begin_dry) -------------------------------
 * An outermost call is recorded without computing: its results lose their
 * memory right after. Only a forward call that records an autograd node
 * runs its kernel, because the kernel makes the aux results the backward
 * rule saves (their shapes and dtypes): it runs with every input that has
 * no memory (made earlier in the dry capture) pointed at zeros, so integer
 * inputs are valid indices, and, for descriptors that write into inputs
 * (def->writes_inputs: batch norm's running statistics), with every input
 * pointed at zeros of its own, wiped after, so no tensor of the program is
 * changed. In-place calls (updates of parameters, gradients, optimizer
 * state) never run. */

static _Thread_local char *dry_zeros;  /* zeroed host scratch */
static _Thread_local size_t dry_nzeros;

void zsi_dry_release(void)
{
    zs_free(dry_zeros);
    dry_zeros = NULL;
    dry_nzeros = 0;
}

static size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }

/* Points the inputs of c that need it at zeros (their storages in s[],
 * the old data pointers in old[]); returns how many, or -1 when no
 * scratch could be allocated. */
static int dry_redirect(const zsi_call *c, bool all, zs_storage **s, void **old,
                        size_t *used)
{
    int n = 0;
    size_t need = 0;
    for (int i = 0; i < c->nin; i++) {
        zs_storage *st = c->in[i]->storage;
        bool dup = false;
        for (int j = 0; j < n; j++)
            dup |= s[j] == st;
        if (dup || st->device != ZS_CPU || (!all && st->data) || !st->nbytes)
            continue;
        s[n++] = st;
        need += align64(st->nbytes);
    }
    if (need > dry_nzeros) {
        zs_free(dry_zeros);
        dry_nzeros = 0;
        if (!(dry_zeros = zs_alloc(need)))
            return -1;
        memset(dry_zeros, 0, need);
        dry_nzeros = need;
    }
    size_t off = 0;
    for (int j = 0; j < n; j++) {
        old[j] = s[j]->data;
        s[j]->data = dry_zeros + off;
        off += align64(s[j]->nbytes);
    }
    *used = off;
    return n;
}

/* Frees the memory of what a dry call made (its results, the aux results
 * that are not views of an input). */
static void dry_drop(zsi_call *c)
{
    zs_storage *made[ZSI_MAX_OUT + ZSI_MAX_AUX];
    int m = 0;
    for (int k = 0; k < c->nout && k < ZSI_MAX_OUT; k++)
        if (c->outs[k])
            made[m++] = c->outs[k]->storage;
    for (int k = 0; k < ZSI_MAX_AUX; k++)
        if (c->aux && c->aux[k])
            made[m++] = c->aux[k]->storage;
    for (int k = 0; k < m; k++) {
        bool input = made[k]->external;
        for (int i = 0; i < c->nin && !input; i++)
            input = c->in[i]->storage == made[k];
        if (!input && made[k]->device == ZS_CPU) {
            zsi_device_free(made[k]->device, made[k]->data);
            made[k]->data = NULL;
        }
    }
}

static zs_status run_dry(zsi_call *c, zsi_kernel_fn k, zs_tensor *out)
{
    zs_status st = ZS_OK;
    if (c->device != ZS_CPU)
        return zs_set_error_code(ZS_ERR_UNSUPPORTED, "%s: a dry graph capture runs on "
                                 "the CPU only (this call is on %s)", c->def->op.name,
                                 zs_device_name(c->device));
    if (!c->def->inplace && c->records) {
        zs_storage *s[ZSI_MAX_IN];
        void *old[ZSI_MAX_IN];
        size_t used = 0;
        bool all = c->def->writes_inputs;
        int n = dry_redirect(c, all, s, old, &used);
        if (n < 0)
            return zs_set_error_code(ZS_ERR_NOMEM, "%s: dry capture: out of memory "
                                     "for zeroed inputs", c->def->op.name);
        kernel_depth++;
        st = k(c, out);
        kernel_depth--;
        for (int j = 0; j < n; j++)
            s[j]->data = old[j];
        if (all)
            memset(dry_zeros, 0, used);
    }
    if (st == ZS_OK && zsi_capture)
        st = zsi_capture(c, k, out);
    if (!c->def->inplace)
        dry_drop(c);
    return st;
}

/* Runs k; while this thread captures a graph, hands an outermost call
 * (not one a kernel made) to the recorder after it ran (dry: see above). */
static zs_status run_kernel(zsi_call *c, zsi_kernel_fn k, zs_tensor *out)
{
    if (!zsi_capture)
        return k(c, out);
    if (zsi_dry_capture && kernel_depth == 0)
        return run_dry(c, k, out);
    kernel_depth++;
    zs_status st = k(c, out);
    kernel_depth--;
    return st == ZS_OK && kernel_depth == 0 && zsi_capture ? zsi_capture(c, k, out)
                                                           : st;
}

static bool records(int nin, zs_tensor *const *in)
{
    for (int i = 0; i < nin; i++)
        if (zsi_grad_needed(in[i]))
            return true;
    return false;
}

/* Allocates results 1.. that infer asked for on the call's device. */
static zs_status alloc_more(zsi_call *c)
{
    for (int k = 1; k < c->nout; k++) {
        const zsi_meta *m = &c->more[k - 1];
        if (m->ndim >= 0 &&
            !(c->outs[k] = zsi_new_tensor_on(c->device, m->dtype, m->ndim, m->shape)))
            return ZS_ERR_NOMEM;
    }
    return ZS_OK;
}

static void release_outs(zsi_call *c)
{
    for (int k = 0; k < c->nout; k++) {
        zs_release(c->outs[k]);
        c->outs[k] = NULL;
    }
}

/* The output: a view of an input (ZSI_VIEW), or fresh tensors on the
 * device written by the (device, dtype) kernel; c->outs[0..nout). */
static zs_tensor *make_output(zsi_call *c)
{
    if (c->def->view)
        return c->outs[0] = c->def->view(c);
    zsi_kernel_fn k = find_kernel(c);
    if (zsi_capture && kernel_depth == 0) /* the recorder frees what was dropped */
        zsi_capture(NULL, NULL, NULL);
    zs_tensor *out = k ? zsi_new_tensor_on(c->device, c->dtype, c->ndim, c->shape)
                       : NULL;
    c->outs[0] = out;
    if (out && (alloc_more(c) != ZS_OK || run_kernel(c, k, out) != ZS_OK)) {
        release_outs(c);
        out = NULL;
    }
    return out;
}

/* Fills c and runs infer; ZS_OK or a negative status (message set). */
static zs_status begin_call(zsi_call *c, zsi_opdef *def, int nin,
                            zs_tensor *const *in, const void *a,
                            zs_tensor **aux, zs_tensor **outs)
{
    static const unsigned char none[ZSI_ATTR_BYTES] __attribute__((aligned(16)));
    c->def = def;
    c->nin = nin;
    c->in = in;
    c->attrs = a ? a : (const void *)none;
    c->device = nin ? (int)in[0]->device : ZS_CPU;
    c->key = c->dtype = nin ? in[0]->dtype : ZS_F32;
    c->ndim = 0;
    c->aux = aux;
    c->nout = 1;
    c->outs = outs;
    c->records = records(nin, in);
    if (nin > ZSI_MAX_IN || (def->arity && nin != def->arity))
        return zs_set_error("%s: %d inputs, expected %d", def->op.name, nin,
                            def->arity);
    zs_status st = check_devices(c);
    return st != ZS_OK ? st : def->infer(c);
}

static void count_cost(zsi_call *c, double t0, zs_tensor *out)
{
    if (t0 == 0) /* profiling: the cost model is only evaluated then */
        return;
    zsi_cost cost = c->def->cost ? c->def->cost(c, out) : default_cost(c, out);
    zsi_op_end((zsi_op *)&c->def->op, t0, cost.flops, cost.bytes_read,
               cost.bytes_written);
}

/* An in-place call (def->inplace): the kernel writes into in[0], which
 * is the result (retained); nothing is allocated or recorded. */
static zs_tensor *run_inplace(zsi_call *c, double t0)
{
    zs_tensor *dst = c->in[0];
    if (dst->node && zsi_grad_needed(dst)) {
        zs_set_error("%s: the destination requires grad and is not a leaf: "
                     "an in-place write would change what its graph saved "
                     "(write under zs_no_grad_push, or into a zs_detach alias)",
                     c->def->op.name);
        return NULL;
    }
    zsi_kernel_fn k = find_kernel(c);
    c->outs[0] = dst; /* borrowed: the result is in[0] */
    if (!k || run_kernel(c, k, dst) != ZS_OK)
        return NULL;
    count_cost(c, t0, dst);
    return zs_retain(dst);
}

static void release_aux(zs_tensor **aux)
{
    for (int i = 0; i < ZSI_MAX_AUX; i++)
        if (aux[i])
            zs_release(aux[i]);
}

static zs_tensor *run_call(zsi_opdef *def, int nin, zs_tensor *const *in,
                           const void *a);
static zs_tensor *run_call_tagged(zsi_opdef *def, int nin, zs_tensor *const *in,
                                  const void *a);

zs_tensor *zsi_run(zsi_opdef *def, int nin, zs_tensor *const *in,
                   const void *a)
{
    for (int i = 0; i < nin; i++)
        if (!in[i])
            return NULL;
    if (zsi_amp_dtype == ZS_F32 || def->inplace || def->view || !nin)
        return run_call(def, nin, in, a);
    /* autocast (ops/autocast.c): fp8 linears as linear_fp8, else the call
     * runs on its cast inputs */
    bool done;
    zs_tensor *f8 = zsi_autocast_fp8(def, nin, in, &done);
    if (done)
        return f8;
    zs_tensor *cast[ZSI_MAX_IN];
    int r = zsi_autocast_inputs(def, nin, in, cast);
    if (r <= 0)
        return r < 0 ? NULL : run_call(def, nin, in, a);
    zs_tensor *out = run_call(def, nin, cast, a);
    for (int i = 0; i < nin; i++)
        zs_release(cast[i]);
    return out;
}

/* One forward call on inputs as given (not NULL), its allocations tagged
 * with the operator's name for the allocator's peak report (ZS_ALLOC_TRACE). */
static zs_tensor *run_call(zsi_opdef *def, int nin, zs_tensor *const *in,
                           const void *a)
{
    zs_alloc_tag_push(def->op.name);
    zs_tensor *out = run_call_tagged(def, nin, in, a);
    zs_alloc_tag_pop();
    return out;
}

static zs_tensor *run_call_tagged(zsi_opdef *def, int nin, zs_tensor *const *in,
                                  const void *a)
{
    double t0 = zsi_op_begin(&def->op);
    zs_tensor *aux[ZSI_MAX_AUX] = {0}, *outs[ZSI_MAX_OUT] = {0};
    zsi_call c; /* field by field: infer fills the shape (no zero-fill) */
    if (begin_call(&c, def, nin, in, a, aux, outs) != ZS_OK)
        return NULL;
    if (def->inplace)
        return run_inplace(&c, t0);
    if (c.nout != 1) {
        zs_set_error("%s: %d results: run it with zsi_run_n", def->op.name,
                     c.nout);
        return NULL;
    }
    zs_tensor *out = make_output(&c);
    zsi_ctx *n = NULL;
    if (out && zsi_record(&def->op, out, nin, in, &n) != ZS_OK) {
        zs_release(out);
        out = NULL;
    }
    if (n) {
        memcpy(n->attrs, c.attrs, def->attr_size); /* 0: the node's zeros */
        if (def->save)
            def->save(n, &c, out);
    }
    release_aux(aux);
    if (out)
        count_cost(&c, t0, out);
    return out;
}

static zs_status run_n(zsi_opdef *def, int nin, zs_tensor *const *in,
                       const void *a, int nout, zs_tensor **out);

zs_status zsi_run_n(zsi_opdef *def, int nin, zs_tensor *const *in,
                    const void *a, int nout, zs_tensor **out)
{
    for (int k = 0; k < nout; k++)
        out[k] = NULL;
    for (int i = 0; i < nin; i++)
        if (!in[i])
            return ZS_ERR_ARG;
    zs_alloc_tag_push(def->op.name);
    zs_status st = run_n(def, nin, in, a, nout, out);
    zs_alloc_tag_pop();
    return st;
}

/* zsi_run_n on inputs as given (not NULL). */
static zs_status run_n(zsi_opdef *def, int nin, zs_tensor *const *in,
                       const void *a, int nout, zs_tensor **out)
{
    double t0 = zsi_op_begin(&def->op);
    zs_tensor *aux[ZSI_MAX_AUX] = {0}, *outs[ZSI_MAX_OUT] = {0};
    zsi_call c;
    zs_status st = begin_call(&c, def, nin, in, a, aux, outs);
    if (st != ZS_OK)
        return st;
    if (def->inplace)
        return zs_set_error("%s: in place: run it with zsi_run", def->op.name);
    if (c.nout != nout || nout > ZSI_MAX_OUT || def->view)
        return zs_set_error("%s: %d results, the caller expects %d",
                            def->op.name, c.nout, nout);
    zs_tensor *o = make_output(&c);
    release_aux(aux);
    if (!o)
        return zs_last_error()[0] ? ZS_ERR_ARG : ZS_ERR_NOMEM;
    count_cost(&c, t0, o);
    for (int k = 0; k < nout; k++)
        out[k] = outs[k];
    return ZS_OK;
}

zs_status zsi_infer_same_float(zsi_call *c)
{
    const zs_tensor *a = c->in[0];
    if (!zs_dtype_is_float(a->dtype))
        return zs_set_error("%s: dtype %s is not supported, expected a float "
                            "dtype (convert with zs_to_dtype)", c->def->op.name,
                            zs_dtype_name(a->dtype));
    zsi_out_like(c, a);
    return ZS_OK;
}

static bool lowp(zs_dtype dt)
{
    return dt == ZS_BF16 || dt == ZS_F16 || dt == ZS_F8E4M3 || dt == ZS_F8E5M2;
}

/* t converted to a new contiguous f32 tensor by the host copy (a CPU
 * kernel's temporary: no driver call), or t retained when not low
 * precision; NULL on allocation failure. */
static zs_tensor *host_f32(const zsi_call *c, zs_tensor *t)
{
    if (!lowp(t->dtype))
        return zs_retain(t);
    zs_tensor *r = zsi_new_tensor_on(c->device, ZS_F32, t->ndim, t->shape);
    if (r && zsi_copy_host(r, t) != ZS_OK) {
        zs_release(r);
        r = NULL;
    }
    return r;
}

zs_status zsi_via_f32(const zsi_call *c, zs_tensor *out, zsi_kernel_fn f32)
{
    zs_tensor *in32[ZSI_MAX_IN] = {0};
    zsi_tracking_pause();
    zs_no_grad_push();
    zs_status st = ZS_OK;
    for (int i = 0; i < c->nin; i++)
        if (!(in32[i] = host_f32(c, c->in[i])))
            st = ZS_ERR_NOMEM;
    zs_tensor *o32 = st == ZS_OK ? zsi_new_tensor_on(c->device, ZS_F32, out->ndim,
                                                     out->shape) : NULL;
    if (o32) {
        zsi_call c32 = *c;
        c32.in = in32;
        c32.key = c32.dtype = ZS_F32;
        st = f32(&c32, o32);
        if (st == ZS_OK)
            st = zsi_copy_host(out, o32); /* rounds to nearest even, once */
    } else {
        st = ZS_ERR_NOMEM;
    }
    zs_release(o32);
    for (int i = 0; i < c->nin; i++)
        zs_release(in32[i]);
    zs_no_grad_pop();
    zsi_tracking_resume();
    return st;
}
