/*
 * tp.c - Megatron-LM tensor parallelism (contracts in zs/tp.h): the
 * communication operators as descriptors run by zsi_run, and the layers
 * composed of them and of ordinary operators.
 *
 * Five descriptors, each the other's backward (Megatron's conjugates):
 *   tp_copy        view (identity)        backward: tp_allreduce
 *   tp_allreduce   sum over ranks         backward: identity
 *   tp_allgather   concat along dim       backward: tp_split (mode SPLIT)
 *                                                   or tp_reduce_scatter (RS)
 *   tp_split       this rank's chunk      backward: tp_allgather (SPLIT)
 *   tp_reduce_scatter  sum, keep chunk    backward: tp_allgather (RS)
 * Attributes (tp_attrs): the communicator (borrowed until backward has
 * run: a node holds it by value, as backward_hook holds its context), the
 * dim (non-negative, normalised by the public function) and the mode.
 * Kernels exist for CPU f32 and f64: the collectives of zs/dist.h move
 * host memory. A tensor [A, D, B] around dim (A: product of the dims
 * before, B: after) is gathered as P blocks [A, D, B] that are interleaved
 * into [A, P D, B]; dim 0 (A = 1) needs no reordering.
 *
 * Layers (column/row linear, vocabulary embedding and cross-entropy) are
 * composites: intermediates are made with tracking paused and released
 * here, the result is tracked in the caller's scope.
 */
#include <stdlib.h>
#include <string.h>

#include "ops/internal.h"
#include "parallel/internal.h"
#include "zs/tp.h"

enum { MODE_SPLIT = 0, MODE_RS = 1 };

typedef struct tp_attrs {
    zs_comm *comm;
    int64_t dim;
    int32_t mode; /* tp_allgather's backward: MODE_SPLIT or MODE_RS */
} tp_attrs;
ZSI_ATTRS(tp_attrs);

/* ---- geometry ---------------------------------------------------------- */

/* t seen as [A, D, B] around dim. */
static void geom(const zs_tensor *t, int dim, int64_t *A, int64_t *D, int64_t *B)
{
    *A = 1;
    *B = 1;
    for (int d = 0; d < dim; d++)
        *A *= t->shape[d];
    for (int d = dim + 1; d < t->ndim; d++)
        *B *= t->shape[d];
    *D = t->shape[dim];
}

/* dst [A, dD, B] (from d0 along the middle dim) <- src [A, sD, B] (from
 * s0), n rows of B elements of es bytes each per a. */
static void copy_rows(char *dst, int64_t dD, int64_t d0, const char *src, int64_t sD,
                      int64_t s0, int64_t A, int64_t n, int64_t B, size_t es)
{
    size_t row = (size_t)B * es;
    for (int64_t a = 0; a < A; a++)
        memcpy(dst + (size_t)(a * dD + d0) * row, src + (size_t)(a * sD + s0) * row,
               (size_t)n * row);
}

/* ---- infer ------------------------------------------------------------- */

static zs_status check_in(const zsi_call *c)
{
    const tp_attrs *a = c->attrs;
    const char *op = c->def->op.name;
    zs_status st = zsi_check_comm(op, a->comm);
    if (st == ZS_OK)
        st = zsi_check_float_dtype(op, c->in[0]);
    if (st == ZS_OK && (a->dim < 0 || (a->dim >= c->in[0]->ndim && c->def != &zsi_def_tp_copy &&
                                       c->def != &zsi_def_tp_allreduce)))
        st = zs_set_error("%s: dim %lld for a %d-dim tensor", op, (long long)a->dim,
                          c->in[0]->ndim);
    return st;
}

static zs_status infer_same(zsi_call *c)
{
    zs_status st = check_in(c);
    if (st == ZS_OK)
        zsi_out_like(c, c->in[0]);
    return st;
}

static zs_status infer_gather(zsi_call *c)
{
    zs_status st = check_in(c);
    if (st != ZS_OK)
        return st;
    const tp_attrs *a = c->attrs;
    zsi_out_like(c, c->in[0]);
    c->shape[a->dim] *= zs_comm_size(a->comm);
    return ZS_OK;
}

/* tp_split and tp_reduce_scatter: dim must divide by the group size. */
static zs_status infer_chunk(zsi_call *c)
{
    zs_status st = check_in(c);
    if (st != ZS_OK)
        return st;
    const tp_attrs *a = c->attrs;
    int P = zs_comm_size(a->comm);
    zsi_out_like(c, c->in[0]);
    if (c->shape[a->dim] % P != 0) {
        char s[96];
        return zs_set_error("%s: dim %lld of %s (%lld) does not divide by the %d "
                            "ranks of the group", c->def->op.name, (long long)a->dim,
                            zs_shape_str(c->in[0], s, sizeof s),
                            (long long)c->shape[a->dim], P);
    }
    c->shape[a->dim] /= P;
    return ZS_OK;
}

/* ---- kernels (CPU, f32 and f64) ---------------------------------------- */

/* A contiguous host copy of the input, untracked (new reference). */
static zs_tensor *input(const zsi_call *c)
{
    zs_tensor *x = zsi_contig_host(c->in[0]);
    if (!x)
        zs_set_error_code(ZS_ERR_NOMEM, "%s: out of memory", c->def->op.name);
    return x;
}

static zs_tensor *scratch(zs_dtype dt, int64_t n)
{
    zsi_tracking_pause();
    zs_tensor *t = zsi_new_tensor_on(ZS_CPU, dt, 1, &n);
    zsi_tracking_resume();
    return t;
}

/* Counts what this rank sends in a ring collective over c: all-reduce
 * 2 (P-1)/P of the tensor, all-gather and reduce-scatter (P-1)/P of the
 * whole (gathered, or reduced) tensor: `factor` times (P-1)/P x bytes. */
static void count_sent(zs_comm *c, int factor, size_t bytes)
{
    int P = zs_comm_size(c);
    if (P > 1)
        c->tp_sent += (int64_t)factor * (int64_t)bytes * (P - 1) / P;
}

int64_t zs_tp_bytes_sent(const zs_comm *tp) { return tp ? tp->tp_sent : 0; }

static zs_status k_allreduce(const zsi_call *c, zs_tensor *out)
{
    const tp_attrs *a = c->attrs;
    count_sent(a->comm, 2, zs_nbytes(out));
    zs_status st = zsi_copy_host(out, c->in[0]);
    return st == ZS_OK ? zs_comm_allreduce(a->comm, out, false, ZS_ALLREDUCE_MPI) : st;
}

static zs_status k_allgather(const zsi_call *c, zs_tensor *out)
{
    const tp_attrs *a = c->attrs;
    zs_tensor *x = input(c);
    if (!x)
        return ZS_ERR_NOMEM;
    int64_t A, D, B;
    geom(x, (int)a->dim, &A, &D, &B);
    int P = zs_comm_size(a->comm);
    zs_status st;
    count_sent(a->comm, 1, zs_nbytes(out));
    if (A == 1) {
        st = zs_comm_allgather(a->comm, x, out);
    } else {
        zs_tensor *all = scratch(x->dtype, zs_numel(x) * P);
        st = all ? zs_comm_allgather(a->comm, x, all) : ZS_ERR_NOMEM;
        size_t es = zs_dtype_size(x->dtype);
        for (int r = 0; st == ZS_OK && r < P; r++)
            copy_rows(zs_data(out), P * D, r * D,
                      (const char *)zs_data(all) + (size_t)(r * zs_numel(x)) * es, D, 0,
                      A, D, B, es);
        zs_release(all);
    }
    zs_release(x);
    return st;
}

static zs_status k_split(const zsi_call *c, zs_tensor *out)
{
    const tp_attrs *a = c->attrs;
    zs_tensor *x = input(c);
    if (!x)
        return ZS_ERR_NOMEM;
    int64_t A, D, B;
    geom(x, (int)a->dim, &A, &D, &B);
    int64_t n = D / zs_comm_size(a->comm);
    copy_rows(zs_data(out), n, 0, zs_data(x), D, n * zs_comm_rank(a->comm), A, n, B,
              zs_dtype_size(x->dtype));
    zs_release(x);
    return ZS_OK;
}

static zs_status k_reduce_scatter(const zsi_call *c, zs_tensor *out)
{
    const tp_attrs *a = c->attrs;
    zs_tensor *x = input(c);
    if (!x)
        return ZS_ERR_NOMEM;
    int64_t A, D, B;
    geom(x, (int)a->dim, &A, &D, &B);
    int P = zs_comm_size(a->comm);
    int64_t n = D / P;
    zs_status st;
    count_sent(a->comm, 1, zs_nbytes(x));
    if (A == 1) {
        st = zs_comm_reduce_scatter(a->comm, x, out);
    } else {
        /* [A, P n, B] -> [P, A, n, B]: rank r's chunk contiguous */
        zs_tensor *packed = scratch(x->dtype, zs_numel(x));
        st = packed ? ZS_OK : ZS_ERR_NOMEM;
        size_t es = zs_dtype_size(x->dtype);
        for (int r = 0; st == ZS_OK && r < P; r++)
            copy_rows((char *)zs_data(packed) + (size_t)(r * A * n * B) * es, n, 0,
                      zs_data(x), D, r * n, A, n, B, es);
        if (st == ZS_OK)
            st = zs_comm_reduce_scatter(a->comm, packed, out);
        zs_release(packed);
    }
    zs_release(x);
    return st;
}

static zs_tensor *view_alias(const zsi_call *c)
{
    zs_tensor *t = c->in[0];
    return zsi_new_view(t, t->ndim, t->shape, t->strides, t->offset);
}

/* ---- backward ---------------------------------------------------------- */

static zs_status run_bw(zsi_opdef *def, zsi_ctx *n, zs_tensor *g, zs_tensor **gin,
                        int mode)
{
    tp_attrs at = *(const tp_attrs *)zsi_node_attrs(n);
    at.mode = mode;
    gin[0] = zsi_run(def, 1, &g, &at);
    return gin[0] ? ZS_OK : ZS_ERR_STATE;
}

static zs_status copy_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin)
{
    return run_bw(&zsi_def_tp_allreduce, n, g, gin, MODE_SPLIT);
}

static zs_status allreduce_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin)
{
    gin[0] = zs_retain(g);
    return ZS_OK;
}

static zs_status allgather_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin)
{
    const tp_attrs *a = zsi_node_attrs(n);
    return run_bw(a->mode == MODE_RS ? &zsi_def_tp_reduce_scatter : &zsi_def_tp_split, n,
                  g, gin, a->mode);
}

static zs_status split_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin)
{
    return run_bw(&zsi_def_tp_allgather, n, g, gin, MODE_SPLIT);
}

static zs_status reduce_scatter_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin)
{
    return run_bw(&zsi_def_tp_allgather, n, g, gin, MODE_RS);
}

/* ---- descriptors ------------------------------------------------------- */

static zsi_cost no_cost(const zsi_call *c, const zs_tensor *out)
{
    return (zsi_cost){0, 0, 0};
}

#define TP_KERNELS(fn) {[ZS_CPU] = {[ZS_F32] = fn, [ZS_F64] = fn}}

zsi_opdef zsi_def_tp_copy = {
    .op = {.name = "tp_copy", .backward = copy_bw}, .arity = 1, .cls = ZSI_VIEW,
    .infer = infer_same, .view = view_alias, .cost = no_cost,
    .attr_size = sizeof(tp_attrs),
    .bw_ops = (zsi_opdef *const[]){&zsi_def_tp_allreduce, NULL}};

zsi_opdef zsi_def_tp_allreduce = {
    .op = {.name = "tp_allreduce", .backward = allreduce_bw}, .arity = 1,
    .infer = infer_same, .kernel = TP_KERNELS(k_allreduce), .flops = 1,
    .attr_size = sizeof(tp_attrs), .bw_ops = (zsi_opdef *const[]){NULL}};

zsi_opdef zsi_def_tp_allgather = {
    .op = {.name = "tp_allgather", .backward = allgather_bw}, .arity = 1,
    .infer = infer_gather, .kernel = TP_KERNELS(k_allgather),
    .attr_size = sizeof(tp_attrs),
    .bw_ops = (zsi_opdef *const[]){&zsi_def_tp_split, &zsi_def_tp_reduce_scatter, NULL}};

zsi_opdef zsi_def_tp_split = {
    .op = {.name = "tp_split", .backward = split_bw}, .arity = 1,
    .infer = infer_chunk, .kernel = TP_KERNELS(k_split),
    .attr_size = sizeof(tp_attrs),
    .bw_ops = (zsi_opdef *const[]){&zsi_def_tp_allgather, NULL}};

zsi_opdef zsi_def_tp_reduce_scatter = {
    .op = {.name = "tp_reduce_scatter", .backward = reduce_scatter_bw}, .arity = 1,
    .infer = infer_chunk, .kernel = TP_KERNELS(k_reduce_scatter), .flops = 1,
    .attr_size = sizeof(tp_attrs),
    .bw_ops = (zsi_opdef *const[]){&zsi_def_tp_allgather, NULL}};

/* ---- the mappings ------------------------------------------------------ */

static zs_tensor *run_map(zsi_opdef *def, zs_comm *tp, zs_tensor *x, int dim, int mode)
{
    if (!x)
        return NULL;
    tp_attrs at = {.comm = tp, .dim = 0, .mode = mode};
    if (def != &zsi_def_tp_copy && def != &zsi_def_tp_allreduce) {
        int d = zsi_norm_dim(def->op.name, dim, x->ndim);
        if (d < 0)
            return NULL;
        at.dim = d;
    }
    return zsi_run(def, 1, &x, &at);
}

zs_tensor *zs_tp_copy(zs_comm *tp, zs_tensor *x)
{
    return run_map(&zsi_def_tp_copy, tp, x, 0, MODE_SPLIT);
}

zs_tensor *zs_tp_reduce(zs_comm *tp, zs_tensor *x)
{
    return run_map(&zsi_def_tp_allreduce, tp, x, 0, MODE_SPLIT);
}

zs_tensor *zs_tp_gather(zs_comm *tp, zs_tensor *x, int dim)
{
    return run_map(&zsi_def_tp_allgather, tp, x, dim, MODE_SPLIT);
}

zs_tensor *zs_tp_split(zs_comm *tp, zs_tensor *x, int dim)
{
    return run_map(&zsi_def_tp_split, tp, x, dim, MODE_SPLIT);
}

zs_tensor *zs_sp_gather(zs_comm *tp, zs_tensor *x, int dim)
{
    return run_map(&zsi_def_tp_allgather, tp, x, dim, MODE_RS);
}

zs_tensor *zs_sp_reduce_scatter(zs_comm *tp, zs_tensor *x, int dim)
{
    return run_map(&zsi_def_tp_reduce_scatter, tp, x, dim, MODE_RS);
}
