/*
 * tp_layers.c - the tensor-parallel layers of zs/tp.h, composed of the
 * communication operators of tp.c and ordinary operators: column- and
 * row-parallel linear, the vocabulary-parallel embedding and
 * cross-entropy, moving weights between the one-process and the split
 * layout, and the dropout seeds.
 *
 * Composites: intermediates are made with scope tracking paused and
 * released here; the result is tracked in the caller's scope. Index
 * tensors (ids, targets) are replicated and read on the host to build
 * this rank's local ids and masks (not differentiable).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops/internal.h"
#include "parallel/internal.h"
#include "zs/autograd.h"
#include "zs/linear.h"
#include "zs/tp.h"

/* ---- linear layers ----------------------------------------------------- */

zs_tensor *zs_tp_column_linear(zs_comm *tp, zs_tensor *x, zs_tensor *w, zs_tensor *b,
                               bool gather_output, int seq_dim)
{
    if (!x || !w)
        return NULL;
    if (gather_output && seq_dim >= 0) {
        zs_set_error("tp column_linear: gather_output with sequence parallelism "
                     "(seq_dim %d): the output stays split by columns", seq_dim);
        return NULL;
    }
    zsi_tracking_pause();
    zs_tensor *xin = seq_dim >= 0 ? zs_sp_gather(tp, x, seq_dim) : zs_tp_copy(tp, x);
    zs_tensor *y = zs_linear(xin, w, b);
    zs_tensor *out = gather_output ? zs_tp_gather(tp, y, -1) : zs_retain(y);
    zs_release(xin);
    zs_release(y);
    zsi_tracking_resume();
    return out ? zsi_track(out) : NULL;
}

zs_tensor *zs_tp_row_linear(zs_comm *tp, zs_tensor *x, zs_tensor *w, zs_tensor *b,
                            bool input_is_parallel, int seq_dim)
{
    if (!x || !w)
        return NULL;
    zsi_tracking_pause();
    zs_tensor *xin = input_is_parallel ? zs_retain(x) : zs_tp_split(tp, x, -1);
    zs_tensor *y = zs_linear(xin, w, NULL);
    zs_tensor *r = seq_dim >= 0 ? zs_sp_reduce_scatter(tp, y, seq_dim) : zs_tp_reduce(tp, y);
    zs_tensor *out = b ? zs_add(r, b) : zs_retain(r);
    zs_release(xin);
    zs_release(y);
    zs_release(r);
    zsi_tracking_resume();
    return out ? zsi_track(out) : NULL;
}

zs_status zs_tp_allreduce_grads(zs_comm *tp, int n, zs_tensor *const *params)
{
    zs_status st = zsi_check_comm("tp allreduce_grads", tp);
    for (int i = 0; st == ZS_OK && i < n; i++) {
        zs_tensor *g = params[i] ? zs_grad(params[i]) : NULL;
        if (g)
            st = zs_comm_allreduce(tp, g, false, ZS_ALLREDUCE_MPI);
    }
    return st;
}

/* ---- vocabulary-parallel embedding and cross-entropy --------------------- */

/* idx's values as a malloc'd int64 array (numel n), or NULL + message. */
static int64_t *read_ids(const char *op, zs_tensor *idx, int64_t *n)
{
    if (zsi_check_index(op, idx) != ZS_OK)
        return NULL;
    *n = zs_numel(idx);
    int64_t *v = malloc((size_t)(*n > 0 ? *n : 1) * sizeof *v);
    zsi_tracking_pause();
    zs_tensor *i64 = v ? zs_to_dtype(idx, ZS_I64) : NULL;
    zsi_tracking_resume();
    zs_status st = i64 ? zs_copy_to_buffer(i64, v, (size_t)*n * sizeof *v) : ZS_ERR_NOMEM;
    zs_release(i64);
    if (st != ZS_OK) {
        free(v);
        if (!v)
            zs_set_error_code(ZS_ERR_NOMEM, "%s: out of memory", op);
        return NULL;
    }
    return v;
}

/* Untracked tensors on device from host arrays. */
static zs_tensor *host_tensor(zs_dtype dt, int ndim, const int64_t *shape, const void *d,
                              int device)
{
    zsi_tracking_pause();
    zs_tensor *t = zs_from_data(dt, ndim, shape, d);
    if (t && device != ZS_CPU) {
        zs_tensor *o = zs_to_device(t, device);
        zs_release(t);
        t = o;
    }
    zsi_tracking_resume();
    return t;
}

/* This rank's share of ids in [lo, lo + n): local ids (id - lo, or 0),
 * and not_owned (1 where the id is another rank's). */
typedef struct local_ids {
    int64_t *id;
    uint8_t *not_owned;
} local_ids;

static bool local_make(local_ids *L, const int64_t *ids, int64_t n, int64_t lo,
                       int64_t len, int64_t ignore, bool use_ignore)
{
    L->id = malloc((size_t)(n > 0 ? n : 1) * sizeof *L->id);
    L->not_owned = malloc((size_t)(n > 0 ? n : 1));
    if (!L->id || !L->not_owned)
        return false;
    for (int64_t i = 0; i < n; i++) {
        bool own = ids[i] >= lo && ids[i] < lo + len && !(use_ignore && ids[i] == ignore);
        L->id[i] = own ? ids[i] - lo : 0;
        L->not_owned[i] = !own;
    }
    return true;
}

static void local_free(local_ids *L)
{
    free(L->id);
    free(L->not_owned);
}

/* The first id outside [0, V) (other than ignore when use_ignore). */
static zs_status check_ids(const char *op, const int64_t *ids, int64_t n, int64_t V,
                           int64_t ignore, bool use_ignore)
{
    for (int64_t i = 0; i < n; i++)
        if ((ids[i] < 0 || ids[i] >= V) && !(use_ignore && ids[i] == ignore))
            return zs_set_error("%s: id %lld at flat position %lld is outside the "
                                "vocabulary [0, %lld)%s", op, (long long)ids[i],
                                (long long)i, (long long)V,
                                use_ignore ? " and not ignore_index" : "");
    return ZS_OK;
}

zs_tensor *zs_tp_vocab_embedding(zs_comm *tp, zs_tensor *w, zs_tensor *idx, int seq_dim)
{
    const char *op = "tp vocab_embedding";
    if (!w || !idx || zsi_check_comm(op, tp) != ZS_OK)
        return NULL;
    if (w->ndim != 2 || zsi_check_float_dtype(op, w) != ZS_OK) {
        char s[96];
        zs_set_error("%s: weight shard %s %s, expected a float [V/P, D]", op,
                     zs_shape_str(w, s, sizeof s), zs_dtype_name(w->dtype));
        return NULL;
    }
    if (idx->ndim + 1 > ZS_MAX_DIMS) {
        zs_set_error("%s: idx has %d dims, expected at most %d", op, idx->ndim,
                     ZS_MAX_DIMS - 1);
        return NULL;
    }
    int64_t n, Vl = w->shape[0], V = Vl * zs_comm_size(tp);
    int64_t *ids = read_ids(op, idx, &n);
    if (!ids || check_ids(op, ids, n, V, 0, false) != ZS_OK) {
        free(ids);
        return NULL;
    }
    local_ids L = {0};
    zs_tensor *out = NULL;
    if (local_make(&L, ids, n, Vl * zs_comm_rank(tp), Vl, 0, false)) {
        int64_t msh[ZS_MAX_DIMS];
        memcpy(msh, idx->shape, (size_t)idx->ndim * sizeof *msh);
        msh[idx->ndim] = 1;
        zs_tensor *li = host_tensor(ZS_I64, idx->ndim, idx->shape, L.id, w->device);
        zs_tensor *mask = host_tensor(ZS_U8, idx->ndim + 1, msh, L.not_owned, w->device);
        zsi_tracking_pause();
        zs_tensor *e = zs_embedding(w, li);
        zs_tensor *em = zs_masked_fill(e, mask, 0.0);
        out = seq_dim >= 0 ? zs_sp_reduce_scatter(tp, em, seq_dim) : zs_tp_reduce(tp, em);
        zs_release(e);
        zs_release(em);
        zsi_tracking_resume();
        zs_release(li);
        zs_release(mask);
    } else {
        zs_set_error_code(ZS_ERR_NOMEM, "%s: out of memory", op);
    }
    local_free(&L);
    free(ids);
    return out ? zsi_track(out) : NULL;
}

/* Each row's log-sum-exp over every rank's columns from this rank's own
 * (lse_local, f64 [N], host): the P N values are all-gathered and
 * combined as m + log sum_r exp(l_r - m), m their maximum. A new f64 [N]
 * tensor on device, or NULL + message. */
static zs_tensor *global_lse(zs_comm *tp, zs_tensor *lse_local, int64_t N, int device)
{
    int P = zs_comm_size(tp);
    zs_tensor *all = zs_empty(ZS_F64, 1, (int64_t[]){N * P});
    double *g = malloc((size_t)(N ? N : 1) * sizeof *g);
    zs_status st = all && g ? zs_comm_allgather(tp, lse_local, all)
                            : zs_set_error_code(ZS_ERR_NOMEM, "tp vocab_cross_entropy: "
                                                "out of memory");
    const double *a = st == ZS_OK ? zs_data(all) : NULL;
    for (int64_t i = 0; a && i < N; i++) {
        double m = a[i], s = 0;
        for (int r = 1; r < P; r++)
            m = a[r * N + i] > m ? a[r * N + i] : m;
        for (int r = 0; r < P; r++)
            s += exp(a[r * N + i] - m);
        g[i] = m + log(s);
    }
    zs_tensor *out = st == ZS_OK ? host_tensor(ZS_F64, 1, &N, g, device) : NULL;
    zs_release(all);
    free(g);
    return out;
}

/* The loss from z [N, Vl] and this rank's local targets, with tracking
 * paused: the shard's cross-entropy (ops/loss.c, cross_entropy_shard)
 * given every row's global log-sum-exp, summed over tp (tp_allreduce,
 * whose backward passes the gradient on unchanged, as the shard's
 * backward wants). Keeps z only until backward: no logits-sized
 * temporaries (the earlier composition of sub, exp, gather and
 * masked_fill kept exp(z - max) and made three more in backward). */
static zs_tensor *vocab_ce(zs_comm *tp, zs_tensor *z, const local_ids *L,
                           const uint8_t *ignored, int64_t N, int64_t count)
{
    enum { NOT_MINE = -1, IGNORED = -2 };
    int64_t *lt = malloc((size_t)N * sizeof *lt);
    if (!lt) {
        zs_set_error_code(ZS_ERR_NOMEM, "tp vocab_cross_entropy: out of memory");
        return NULL;
    }
    for (int64_t i = 0; i < N; i++)
        lt[i] = ignored[i] ? IGNORED : L->not_owned[i] ? NOT_MINE : L->id[i];
    zs_tensor *t = host_tensor(ZS_I64, 1, &N, lt, z->device);
    zs_tensor *cnt = host_tensor(ZS_I64, 0, NULL, &count, z->device);
    free(lt);
    zs_no_grad_push();
    zs_tensor *ll = t && cnt ? zsi_row_lse(z) : NULL;
    zs_tensor *llh = ll ? zs_to_device(ll, ZS_CPU) : NULL;
    zs_no_grad_pop();
    zs_tensor *lse = llh ? global_lse(tp, llh, N, z->device) : NULL;
    zs_tensor *part = lse ? zsi_cross_entropy_shard(z, t, lse, cnt, IGNORED) : NULL;
    zs_tensor *loss = part ? zs_tp_reduce(tp, part) : NULL;
    zs_tensor *tmp[] = {t, cnt, ll, llh, lse, part};
    for (size_t i = 0; i < sizeof tmp / sizeof *tmp; i++)
        zs_release(tmp[i]);
    return loss;
}

zs_tensor *zs_tp_vocab_cross_entropy(zs_comm *tp, zs_tensor *logits, zs_tensor *target,
                                     int64_t ignore_index)
{
    const char *op = "tp vocab_cross_entropy";
    if (!logits || !target || zsi_check_comm(op, tp) != ZS_OK)
        return NULL;
    bool half = logits->dtype == ZS_BF16 || logits->dtype == ZS_F16;
    if (!half && zsi_check_float_dtype(op, logits) != ZS_OK)
        return NULL;
    int64_t N, Vl = logits->ndim ? logits->shape[logits->ndim - 1] : 0;
    char sl[96], st_[96];
    if (logits->ndim < 1 || Vl < 1 || zs_numel(logits) != zs_numel(target) * Vl) {
        zs_set_error("%s: logits %s and target %s: expected logits [..., V/P] with "
                     "V/P >= 1 and one target per row", op,
                     zs_shape_str(logits, sl, sizeof sl),
                     zs_shape_str(target, st_, sizeof st_));
        return NULL;
    }
    int64_t V = Vl * zs_comm_size(tp);
    int64_t *ids = read_ids(op, target, &N);
    if (!ids || check_ids(op, ids, N, V, ignore_index, true) != ZS_OK) {
        free(ids);
        return NULL;
    }
    local_ids L = {0};
    uint8_t *ignored = malloc((size_t)(N > 0 ? N : 1));
    zs_tensor *loss = NULL;
    if (ignored && local_make(&L, ids, N, Vl * zs_comm_rank(tp), Vl, ignore_index, true)) {
        int64_t count = 0;
        for (int64_t i = 0; i < N; i++) {
            ignored[i] = ids[i] == ignore_index;
            count += !ignored[i];
        }
        zsi_tracking_pause();
        zs_tensor *zr = zs_reshape(logits, 2, (int64_t[]){N, Vl});
        /* 16-bit logits (autocast) in f32, as zs_cross_entropy's class */
        zs_tensor *z = zr && zr->dtype != ZS_F32 && zr->dtype != ZS_F64
                           ? zs_to_dtype(zr, ZS_F32) : zs_retain(zr);
        zs_release(zr);
        loss = N > 0 ? vocab_ce(tp, z, &L, ignored, N, count)
                     : zs_zeros_on(logits->device, logits->dtype, 0, NULL);
        zs_release(z);
        zsi_tracking_resume();
    } else {
        zs_set_error_code(ZS_ERR_NOMEM, "%s: out of memory", op);
    }
    local_free(&L);
    free(ignored);
    free(ids);
    return loss ? zsi_track(loss) : NULL;
}

/* ---- shards ------------------------------------------------------------ */

/* Normalises *dim and checks the split of its length L into blocks x size
 * pieces;
 * *c = L / (blocks size). */
static zs_status shard_check(const char *op, const zs_tensor *t, int *dim, int blocks,
                             int size, int64_t *c)
{
    int d = zsi_norm_dim(op, *dim, t->ndim);
    if (d < 0)
        return ZS_ERR_ARG;
    *dim = d;
    int64_t L = t->shape[d];
    if (blocks < 1 || size < 1 || L % ((int64_t)blocks * size) != 0) {
        char s[96];
        return zs_set_error("%s: dim %d of %s (%lld) does not split into %d blocks "
                            "x %d ranks", op, d, zs_shape_str(t, s, sizeof s),
                            (long long)L, blocks, size);
    }
    *c = L / ((int64_t)blocks * size);
    return ZS_OK;
}

/* A contiguous host tensor of t's values, untracked, no autograd. */
static zs_tensor *host_contig(zs_tensor *t)
{
    zsi_tracking_pause();
    zs_no_grad_push();
    zs_tensor *d = zs_detach(t);
    zs_tensor *c = zs_contiguous(d);
    zs_no_grad_pop();
    zs_release(d);
    zsi_tracking_resume();
    return c;
}

static void outer_inner(const zs_tensor *t, int dim, int64_t *A, int64_t *B)
{
    *A = 1;
    *B = 1;
    for (int d = 0; d < dim; d++)
        *A *= t->shape[d];
    for (int d = dim + 1; d < t->ndim; d++)
        *B *= t->shape[d];
}

zs_tensor *zs_tp_shard(zs_tensor *full, int dim, int blocks, int rank, int size)
{
    const char *op = "tp shard";
    int64_t c = 0;
    if (!full || shard_check(op, full, &dim, blocks, size, &c) != ZS_OK)
        return NULL;
    if (rank < 0 || rank >= size) {
        zs_set_error("%s: rank %d of %d", op, rank, size);
        return NULL;
    }
    zs_tensor *x = host_contig(full);
    const char *src = x ? zs_data(x) : NULL;
    if (!src) {
        zs_release(x);
        return NULL;
    }
    int64_t A, B, L = full->shape[dim];
    outer_inner(full, dim, &A, &B);
    int64_t sh[ZS_MAX_DIMS];
    memcpy(sh, full->shape, sizeof sh);
    sh[dim] = c * blocks;
    zs_tensor *out = zs_empty(full->dtype, full->ndim, sh);
    size_t row = (size_t)B * zs_dtype_size(full->dtype);
    for (int64_t a = 0; out && a < A; a++)
        for (int k = 0; k < blocks; k++)
            memcpy((char *)zs_data(out) + (size_t)(a * c * blocks + k * c) * row,
                   src + (size_t)(a * L + k * (L / blocks) + rank * c) * row,
                   (size_t)c * row);
    zs_release(x);
    return out;
}

zs_tensor *zs_tp_unshard(zs_comm *tp, zs_tensor *shard, int dim, int blocks)
{
    const char *op = "tp unshard";
    if (!shard || zsi_check_comm(op, tp) != ZS_OK)
        return NULL;
    int d = dim;
    int64_t c = 0;
    if (shard_check(op, shard, &d, blocks, 1, &c) != ZS_OK)
        return NULL;
    int P = zs_comm_size(tp);
    zs_tensor *x = host_contig(shard);
    zsi_tracking_pause();
    zs_tensor *all = x ? zsi_new_tensor_on(ZS_CPU, shard->dtype, 1,
                                           (int64_t[]){zs_numel(shard) * P}) : NULL;
    zsi_tracking_resume();
    zs_status st = all ? zs_comm_allgather(tp, x, all) : ZS_ERR_NOMEM;
    zs_tensor *out = NULL;
    if (st == ZS_OK) {
        int64_t A, B, n = shard->shape[d], L = n * P;
        outer_inner(shard, d, &A, &B);
        int64_t sh[ZS_MAX_DIMS];
        memcpy(sh, shard->shape, sizeof sh);
        sh[d] = L;
        out = zs_empty(shard->dtype, shard->ndim, sh);
        size_t row = (size_t)B * zs_dtype_size(shard->dtype);
        for (int r = 0; out && r < P; r++) {
            const char *src = (const char *)zs_data(all) + (size_t)(r * A * n) * row;
            for (int64_t a = 0; a < A; a++)
                for (int k = 0; k < blocks; k++)
                    memcpy((char *)zs_data(out) +
                               (size_t)(a * L + k * (L / blocks) + r * c) * row,
                           src + (size_t)(a * n + k * c) * row, (size_t)c * row);
        }
    }
    zs_release(x);
    zs_release(all);
    return out;
}

uint64_t zs_tp_dropout_seed(uint64_t seed, int tp_rank, bool split)
{
    return split ? seed + 2718u + (uint64_t)tp_rank : seed;
}
