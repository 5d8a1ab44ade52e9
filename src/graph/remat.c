/*
 * remat.c - rematerialization (zs_graph_remat, zs/graph.h): values that
 * the forward makes, the backward reads again much later, and that are a
 * cheap function of tensors kept alive through that gap anyway, are not
 * kept: a copy of their producer runs again right before the first late
 * reader, into a fresh buffer, and the late readers read that. The memory
 * plan then sees two short lifetimes instead of one long one and reuses
 * the bytes in between. This is the saving PyTorch's min-cut partitioner
 * (AOTAutograd) makes for pointwise ops; here the candidates are named,
 * not found by a cut:
 *
 * - layer_norm's output y from its input x (the residual stream, which
 *   the layer_norm backward keeps anyway) and its weight and bias: the
 *   node's own kernel runs again with no aux results (records false);
 * - a contiguous copy (copy: the attention output made contiguous in
 *   [B, n, C] for the projection) from its source, kept for the
 *   attention backward;
 * - linear_gelu's output gelu(h) from its saved pre-activation h, which
 *   the GeLU backward reads later anyway: f32, the f32 GEMM's own
 *   epilogue function runs over h (zsk_sgemm_gelu_of_pre); bf16, the bf16
 *   GEMM's 16-bit epilogue over h widened (its GeLU reads the
 *   pre-activation rounded to bf16, which is the saved h: gemm.h).
 *
 * Same bits: each recomputation is the same function on the same bits
 * (the same kernel, or the epilogue's GeLU on the float the epilogue
 * stored), and every input it reads is checked unwritten between the
 * producer and the recomputation. A candidate qualifies when its readers
 * have a gap (between two consecutive readers, the widest, at least
 * MIN_GAP nodes) and every input of the recomputation is either a graph
 * input or alive after the gap anyway, so no other lifetime grows.
 *
 * Measured (GPT small, graph.c's header): per layer 12.6 MB (GeLU output)
 * + 2 x 3.1 MB (ln_1, ln_2 outputs) + 3.1 MB (attention output copy).
 */
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "graph/internal.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/lowp.h"

/* at least this many nodes between two readers make the split worth a
 * recomputation (the forward use and the backward use are hundreds of
 * nodes apart in a training step) */
#define MIN_GAP 8

typedef enum rkind { R_NONE, R_RERUN, R_GELU, R_GELU16 } rkind;

static rkind kind_of(const zsi_gnode *n)
{
    const zsi_opdef *d = n->call.def;
    const zs_tensor *o = n->outs[0];
    if (n->run || !n->kernel || n->recomputed || !o || !zsi_whole_storage(o) ||
        o->storage->device != ZS_CPU || n->outs[1])
        return R_NONE;
    if (d == &zsi_def_layer_norm || (d == &zsi_def_copy && n->call.nin == 1))
        return R_RERUN;
    const zs_tensor *h = n->aux[0];
    if (d != &zsi_def_linear_gelu || !h || h->dtype != o->dtype || !zs_is_contiguous(h) ||
        zs_numel(h) != zs_numel(o))
        return R_NONE;
    return o->dtype == ZS_F32 ? R_GELU : o->dtype == ZS_BF16 ? R_GELU16 : R_NONE;
}

static bool kept(const zs_storage *s, int nkeep, zs_tensor *const *keep)
{
    for (int k = 0; k < nkeep; k++)
        if (keep[k] && keep[k]->storage == s)
            return true;
    return false;
}

/* Input t of a recomputation placed before node p, producer at f: no node
 * in (f, p) writes it, and it is a graph input (no node makes it) or
 * used at p or later (alive there anyway). */
static bool input_ok(const zs_graph *g, const zs_tensor *t, int f, int p, int nkeep,
                     zs_tensor *const *keep)
{
    const zs_storage *s = t->storage;
    int origin = 0; /* 1: made by a node; -1: first met as an input */
    bool later = kept(s, nkeep, keep);
    for (int i = 0; i < g->n; i++) {
        const zsi_gnode *n = g->nodes[i];
        bool w = zsi_gnode_writes(n, s), r = zsi_gnode_reads(n, s);
        if (w && i > f && i < p)
            return false;
        if (!origin && (r || w)) /* as passes.c classifies: inputs first */
            origin = r ? -1 : 1;
        later = later || (i >= p && (w || r));
    }
    return origin < 0 || later;
}

/* An untracked alias of base's storage with t's shape, strides, offset. */
static zs_tensor *alias_on(const zs_tensor *base, const zs_tensor *t)
{
    return zsi_new_view(base, t->ndim, t->shape, t->strides, t->offset);
}

static zs_status gelu_run(zsi_gnode *n)
{
    const zs_tensor *h = n->in[0], *o = n->outs[0];
    zsk_sgemm_gelu_of_pre((const float *)h->storage->data + h->offset,
                          (float *)o->storage->data + o->offset, zs_numel(o));
    return ZS_OK;
}

/* bf16: the GEMM's 16-bit epilogue (the bf16 GEMM's own, as the forward
 * ran it) over h widened to f32 in pieces; GeLU there reads the rounded
 * pre-activation (gemm.h), so the output's bits come back. */
typedef struct gelu16_job {
    zsk_sgemm_epi_fn epi;
    const uint16_t *h;
    uint16_t *out;
} gelu16_job;

static void gelu16_range(void *p, int64_t i0, int64_t i1)
{
    const gelu16_job *j = p;
    float t[1024];
    for (int64_t i = i0; i < i1; i += 1024) {
        int64_t n = i1 - i < 1024 ? i1 - i : 1024;
        zsk_widen16(ZS_BF16, j->h + i, t, n);
        zsk_epilogue ep = {.gelu = true, .out16 = j->out + i, .ldo = n};
        j->epi(t, n, 1, n, t, n, 0.0f, &ep);
    }
}

static zs_status gelu16_run(zsi_gnode *n)
{
    const zs_tensor *h = n->in[0], *o = n->outs[0];
    gelu16_job j = {zsk_gemm_desc_for(ZSK_GEMM_BF16)->epi,
                    (const uint16_t *)h->storage->data + h->offset,
                    (uint16_t *)o->storage->data + o->offset};
    zs_parallel_for(zs_numel(o), 16384, gelu16_range, &j);
    return ZS_OK;
}

/* Node R recomputing f's output (kind k) into a fresh storage; NULL on
 * allocation failure. */
static zsi_gnode *make_node(zs_graph *g, const zsi_gnode *f, rkind k)
{
    zsi_gnode *r = calloc(1, sizeof *r);
    bool gelu = k == R_GELU || k == R_GELU16;
    int nin = gelu ? 1 : f->call.nin;
    if (r)
        r->in = calloc((size_t)(nin ? nin : 1), sizeof *r->in);
    if (!r || !r->in) {
        free(r);
        return NULL;
    }
    const zs_tensor *o = f->outs[0];
    zs_tensor *fresh = zsi_new_tensor_on(o->storage->device, o->dtype, o->ndim, o->shape);
    bool ok = fresh != NULL;
    if (ok) { /* no bytes until the plan (or materialize) gives them */
        zsi_device_free(fresh->storage->device, fresh->storage->data);
        fresh->storage->data = NULL;
        g->dropped++;
        r->outs[0] = fresh;
    }
    r->call = f->call;
    r->call.nin = nin;
    for (int j = 0; ok && j < nin; j++) {
        const zs_tensor *src = gelu ? f->aux[0] : f->in[j];
        ok = (r->in[j] = alias_on(src, src)) != NULL;
    }
    if (!ok) {
        zsi_gnode_free(r);
        return NULL;
    }
    memcpy(r->attrs, f->attrs, sizeof r->attrs);
    r->call.in = r->in;
    r->call.attrs = r->attrs;
    r->call.aux = r->aux; /* none: records off, the kernel makes no aux */
    r->call.outs = r->outs;
    r->call.records = false;
    r->call.nout = 1;
    r->recomputed = true;
    double bytes = (double)zs_nbytes(o);
    if (gelu) {
        r->call.def = &zsi_def_gelu;
        r->run = k == R_GELU ? gelu_run : gelu16_run;
        r->label = "remat:gelu";
        r->cost = (zsi_cost){30 * (double)zs_numel(o), bytes, bytes};
    } else {
        r->kernel = f->kernel;
        r->label = f->call.def == &zsi_def_copy ? "remat:copy" : "remat:layer_norm";
        r->cost = f->cost;
    }
    return r;
}

/* Tries candidate node f: 1 recomputed, 0 not, < 0 out of memory. */
static int try_node(zs_graph *g, int f, int nkeep, zs_tensor *const *keep)
{
    zsi_gnode *F = g->nodes[f];
    rkind k = kind_of(F);
    zs_storage *s = k == R_NONE ? NULL : F->outs[0]->storage;
    if (!s || kept(s, nkeep, keep))
        return 0;
    int prev = -1, gap = 0, p = -1; /* the widest gap between readers */
    for (int i = 0; i < g->n; i++) {
        if (i != f && zsi_gnode_writes(g->nodes[i], s))
            return 0; /* written elsewhere too: not a plain value */
        if (i <= f || !zsi_gnode_reads(g->nodes[i], s))
            continue;
        if (prev >= 0 && i - prev > gap) {
            gap = i - prev;
            p = i;
        }
        prev = i;
    }
    if (p < 0 || gap < MIN_GAP)
        return 0;
    if (k >= R_GELU && !input_ok(g, F->aux[0], f, p, nkeep, keep))
        return 0;
    for (int j = 0; k == R_RERUN && j < F->call.nin; j++)
        if (!input_ok(g, F->in[j], f, p, nkeep, keep))
            return 0;
    zsi_tracking_pause();
    zsi_gnode *r = make_node(g, F, k);
    bool ok = r != NULL;
    for (int i = p; ok && i < g->n; i++) { /* the late readers read r's result */
        zsi_gnode *n = g->nodes[i];
        for (int j = 0; ok && j < n->call.nin; j++) {
            if (n->in[j]->storage != s)
                continue;
            zs_tensor *a = alias_on(r->outs[0], n->in[j]);
            ok = a != NULL;
            if (ok) {
                zs_release(n->in[j]);
                n->in[j] = a;
            }
        }
    }
    zsi_tracking_resume();
    if (ok && zsi_graph_insert(g, p, r))
        return 1;
    /* readers already moved to r's storage cannot go back cheaply: the
     * graph is failed (an allocation of a few hundred bytes failed) */
    if (r)
        g->failed = true;
    zsi_gnode_free(r);
    return -1;
}

int zs_graph_remat(zs_graph *g, int nkeep, zs_tensor *const *keep)
{
    if (!g || g->capturing || g->plan || g->failed || (nkeep > 0 && !keep))
        return zs_set_error("graph remat: %s", !g ? "no graph" : g->capturing
                            ? "the graph is still being captured" : g->plan ?
                            "the memory is already planned (run the pass first)"
                            : g->failed ? "the capture failed" : "keep is NULL");
    int added = 0;
    for (int f = 0; f < g->n; f++) {
        int r = try_node(g, f, nkeep, keep);
        if (r < 0)
            return zs_set_error_code(ZS_ERR_NOMEM, "graph remat: out of memory");
        added += r;
    }
    return added;
}
