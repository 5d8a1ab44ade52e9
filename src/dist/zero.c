/*
 * zero.c - ZeRO stage 2: gradients reduce-scattered bucket by bucket as
 * backward finishes them, optimizer state and gradients kept only for
 * this rank's chunks (contract in zs/zero.h).
 *
 * Bucket k covers flat elements [lo, lo + len); with cs = ceil(len / P)
 * rank r owns [lo + r*cs, lo + min((r+1)*cs, len)). The staging buffer
 * holds P*cs elements (the bucket, zero-padded), the reduce-scatter's
 * input; chunk rank receives cs of it.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dist/internal.h"
#include "zs/autograd.h"
#include "zs/ops.h"
#include "zs/zero.h"

typedef struct zbucket {
    int64_t lo, len, cs;
    int64_t own_lo, own_len; /* this rank's chunk, in the flat buffer */
    int64_t sg_off;          /* its place in the shard gradient */
    int nparams, pending, nready;
    int shard;               /* index in z->shards, -1 when own_len == 0 */
    zs_tensor **ready;       /* parameters whose gradient is final */
} zbucket;

struct zs_zero {
    zs_comm *c;
    int stage;
    zs_tensor *fp;           /* borrowed flat parameters */
    zs_tensor *fg;           /* stage 1: borrowed flat gradients */
    zs_tensor *sg;           /* stage 2: shard gradient [sum of own_len] */
    zs_tensor *stage_buf, *chunk; /* [P * max cs], [max cs] */
    zs_tensor **shards;      /* optimizer views, .grad into sg */
    int nshards;
    zbucket *b;
    int64_t *lo;
    int nb, next;
    bool armed;
    zs_status st;
    char err[384];
    int64_t live, peak;      /* gradient bytes alive in backward */
};

static void fail(zs_zero *z, zs_status st)
{
    if (z->st == ZS_OK) {
        z->st = st;
        snprintf(z->err, sizeof z->err, "%s", zs_last_error());
    }
}

/* Packs bucket k's final gradients into the staging buffer, frees them and
 * reduce-scatters the bucket into this rank's shard (averaged). */
static void reduce_bucket(zs_zero *z, int k)
{
    zbucket *b = &z->b[k];
    int P = z->c->size;
    float *stage = zs_data(z->stage_buf);
    memset(stage, 0, (size_t)(b->cs * P) * sizeof(float));
    for (int i = 0; i < b->nready; i++) {
        zs_tensor *p = b->ready[i], *g = p->grad;
        int64_t off = p->offset - z->fp->offset - b->lo;
        if (g && zs_is_contiguous(g) && g->dtype == ZS_F32) /* as the engine makes them */
            memcpy(stage + off, zs_data(g), (size_t)zs_numel(g) * sizeof(float));
        else if (g)
            fail(z, zs_set_error_code(ZS_ERR_STATE, "ZeRO: a gradient is not a "
                                      "contiguous f32 tensor"));
        z->live -= g ? (int64_t)zs_nbytes(g) : 0;
        zs_zero_grad(p, true);
    }
    b->nready = 0;
    if (z->st != ZS_OK)
        return;
    zs_tensor *in = zs_narrow(z->stage_buf, 0, 0, b->cs * P);
    zs_tensor *out = zs_narrow(z->chunk, 0, 0, b->cs);
    zs_status st = in && out ? zs_comm_reduce_scatter(z->c, in, out) : ZS_ERR_NOMEM;
    zs_release(in);
    zs_release(out);
    if (st != ZS_OK) {
        fail(z, st);
        return;
    }
    const float *ch = zs_data(z->chunk);
    float *sg = (float *)zs_data(z->sg) + b->sg_off, inv = 1.0f / (float)P;
    for (int64_t i = 0; i < b->own_len; i++)
        sg[i] += ch[i] * inv;
}

/* Reduces buckets next, next+1, ... while complete (all, with force). */
static void reduce_ready(zs_zero *z, bool force)
{
    while (z->next < z->nb && z->st == ZS_OK &&
           (force || z->b[z->next].pending == 0))
        reduce_bucket(z, z->next++);
}

static void on_ready(void *ctx, zs_tensor *leaf)
{
    zs_zero *z = ctx;
    if (leaf->storage != z->fp->storage || !leaf->grad)
        return;
    int k = zsi_find_bucket(z->nb, z->lo, zs_numel(z->fp), leaf->offset - z->fp->offset);
    if (k < 0)
        return;
    zbucket *b = &z->b[k];
    if (b->nready < b->nparams)
        b->ready[b->nready++] = leaf;
    b->pending--;
    z->live += (int64_t)zs_nbytes(leaf->grad);
    if (z->live > z->peak)
        z->peak = z->live;
    reduce_ready(z, false);
}

/* Buckets, this rank's chunks and the buffers. */
static zs_status build(zs_zero *z, int n, zs_tensor *const *params, int64_t limit)
{
    size_t m = (size_t)n + 1;
    int64_t *off = malloc(m * sizeof *off), total = zs_numel(z->fp);
    int *cnt = malloc(m * sizeof *cnt);
    z->lo = malloc(m * sizeof *z->lo);
    z->b = calloc(m, sizeof *z->b);
    z->shards = calloc(m, sizeof *z->shards);
    zs_status st = off && cnt && z->lo && z->b && z->shards ? ZS_OK : ZS_ERR_NOMEM;
    for (int i = 0; st == ZS_OK && i < n; i++) {
        off[i] = params[i]->offset - z->fp->offset;
        if (params[i]->storage != z->fp->storage || !zs_is_contiguous(params[i]))
            st = zs_set_error("ZeRO: parameter %d is not a view of the flat "
                              "parameter buffer", i);
    }
    if (st == ZS_OK && (z->nb = zsi_plan_buckets(n, off, total, limit, z->lo, cnt)) < 0)
        st = ZS_ERR_NOMEM;
    int P = z->c->size, R = z->c->rank;
    int64_t sg_n = 0, max_cs = 1;
    for (int k = 0; st == ZS_OK && k < z->nb; k++) {
        zbucket *b = &z->b[k];
        b->lo = z->lo[k];
        b->len = (k ? z->lo[k - 1] : total) - b->lo;
        b->cs = (b->len + P - 1) / P;
        b->nparams = cnt[k];
        int64_t a = b->cs * R, e = b->cs * (R + 1) < b->len ? b->cs * (R + 1) : b->len;
        b->own_lo = b->lo + a;
        b->own_len = e > a ? e - a : 0;
        b->sg_off = sg_n;
        sg_n += b->own_len;
        max_cs = b->cs > max_cs ? b->cs : max_cs;
        if (!(b->ready = calloc((size_t)(b->nparams + 1), sizeof *b->ready)))
            st = ZS_ERR_NOMEM;
    }
    free(off);
    free(cnt);
    if (st != ZS_OK)
        return st == ZS_ERR_NOMEM ? zs_set_error_code(st, "ZeRO: out of memory") : st;
    z->sg = z->stage == 2 ? zs_zeros(ZS_F32, 1, &sg_n) : NULL;
    z->stage_buf = zs_zeros(ZS_F32, 1, (int64_t[]){max_cs * P});
    z->chunk = zs_zeros(ZS_F32, 1, &max_cs);
    if ((z->stage == 2 && !z->sg) || !z->stage_buf || !z->chunk)
        return zs_set_error_code(ZS_ERR_NOMEM, "ZeRO: out of memory");
    for (int k = 0; k < z->nb; k++) {
        zbucket *b = &z->b[k];
        b->shard = -1;
        if (b->own_len == 0)
            continue;
        b->shard = z->nshards;
        zs_tensor *v = zs_narrow(z->fp, 0, b->own_lo, b->own_len);
        if (v)
            v->grad = z->stage == 2 ? zs_narrow(z->sg, 0, b->sg_off, b->own_len)
                                    : zs_narrow(z->fg, 0, b->own_lo, b->own_len);
        if (!v || !v->grad)
            return zs_set_error_code(ZS_ERR_NOMEM, "ZeRO: out of memory");
        z->shards[z->nshards++] = v;
    }
    return ZS_OK;
}

zs_zero *zs_zero_new(zs_comm *c, int stage, int64_t bucket_bytes, int n,
                     zs_tensor *const *params, zs_tensor *flat_params,
                     zs_tensor *flat_grads)
{
    if (stage != 1 && stage != 2) {
        zs_set_error("ZeRO: stage %d is not implemented (1 and 2 are)", stage);
        return NULL;
    }
    if (!c || n < 0 || (n > 0 && !params) || !flat_params ||
        flat_params->dtype != ZS_F32 || flat_params->ndim != 1 ||
        !zs_is_contiguous(flat_params) ||
        (stage == 1 && (!flat_grads || !zs_same_shape(flat_grads, flat_params) ||
                        flat_grads->dtype != ZS_F32 || !zs_is_contiguous(flat_grads)))) {
        zs_set_error("ZeRO: needs a communicator, the parameters as views of a "
                     "contiguous 1-D f32 buffer and, for stage 1, a gradient buffer "
                     "of the same shape");
        return NULL;
    }
    zs_zero *z = calloc(1, sizeof *z);
    if (!z) {
        zs_set_error_code(ZS_ERR_NOMEM, "ZeRO: out of memory");
        return NULL;
    }
    z->c = c;
    z->stage = stage;
    z->fp = flat_params;
    z->fg = stage == 1 ? flat_grads : NULL;
    for (int i = 0; stage == 2 && i < n; i++) /* gradients appear in backward */
        zs_zero_grad(params[i], true);
    zsi_tracking_pause(); /* z owns its tensors, not a scope */
    zs_status st = build(z, n, params, bucket_bytes / 4);
    zsi_tracking_resume();
    if (st != ZS_OK) {
        zs_zero_free(z);
        return NULL;
    }
    return z;
}

void zs_zero_free(zs_zero *z)
{
    if (!z)
        return;
    if (z->armed)
        zs_set_grad_ready_hook(NULL, NULL);
    for (int i = 0; i < z->nshards; i++)
        zs_release(z->shards[i]);
    for (int k = 0; z->b && k < z->nb; k++)
        free(z->b[k].ready);
    free(z->shards);
    free(z->b);
    free(z->lo);
    zs_release(z->sg);
    zs_release(z->stage_buf);
    zs_release(z->chunk);
    free(z);
}

zs_tensor **zs_zero_shards(zs_zero *z, int *n)
{
    *n = z ? z->nshards : 0;
    return z ? z->shards : NULL;
}

zs_status zs_zero_begin(zs_zero *z)
{
    if (!z)
        return ZS_ERR_ARG;
    if (z->stage == 1)
        return ZS_OK;
    if (z->armed)
        return zs_set_error_code(ZS_ERR_STATE, "ZeRO: begin called twice without "
                                 "finish");
    z->st = ZS_OK;
    z->next = 0;
    z->live = z->peak = 0;
    for (int k = 0; k < z->nb; k++) {
        z->b[k].pending = z->b[k].nparams;
        z->b[k].nready = 0;
    }
    z->armed = true;
    zs_set_grad_ready_hook(on_ready, z);
    return ZS_OK;
}

zs_status zs_zero_finish(zs_zero *z)
{
    if (!z)
        return ZS_ERR_ARG;
    if (z->stage == 1)
        return ZS_OK;
    if (z->armed)
        zs_set_grad_ready_hook(NULL, NULL);
    z->armed = false;
    reduce_ready(z, true); /* buckets with parameters backward never reached */
    if (z->st != ZS_OK)
        return zs_set_error_code(z->st, "%s", z->err);
    return ZS_OK;
}

double zs_zero_clip_grad_norm(zs_zero *z, double max_norm)
{
    /* stage 1: every rank holds the whole averaged gradient; stage 2: the
     * squares of the shards are summed over the ranks */
    zs_tensor *gt = z->stage == 2 ? z->sg : z->fg;
    const float *g = zs_data(gt);
    double sq = 0;
    for (int64_t i = 0; i < zs_numel(gt); i++)
        sq += (double)g[i] * g[i];
    double norm = sqrt(sq);
    if (z->stage == 2) {
        zs_tensor *t = zs_scalar(ZS_F64, sq);
        zs_status st = t ? zs_comm_allreduce(z->c, t, false, ZS_ALLREDUCE_MPI)
                         : ZS_ERR_NOMEM;
        norm = st == ZS_OK ? sqrt(zs_item(t)) : NAN;
        zs_release(t);
    }
    if (!isfinite(norm) || norm <= max_norm || max_norm <= 0)
        return norm;
    float s = (float)(max_norm / (norm + 1e-6)), *w = zs_data(gt);
    for (int64_t i = 0; i < zs_numel(gt); i++)
        w[i] *= s;
    return norm;
}

/* For every bucket: this rank's chunk (read by own(k)) is all-gathered
 * and the bucket's elements written to dst + lo (dst NULL: not kept). */
static zs_status gather_buckets(zs_zero *z, zs_tensor *const *chunks, float *dst)
{
    int P = z->c->size;
    float *ch = zs_data(z->chunk);
    for (int k = 0; k < z->nb; k++) {
        zbucket *b = &z->b[k];
        memset(ch, 0, (size_t)b->cs * sizeof(float));
        if (b->shard >= 0)
            memcpy(ch, zs_data(chunks[b->shard]), (size_t)b->own_len * sizeof(float));
        zs_tensor *in = zs_narrow(z->chunk, 0, 0, b->cs);
        zs_tensor *out = zs_narrow(z->stage_buf, 0, 0, b->cs * P);
        zs_status st = in && out ? zs_comm_allgather(z->c, in, out) : ZS_ERR_NOMEM;
        zs_release(in);
        zs_release(out);
        if (st != ZS_OK)
            return st;
        if (dst)
            memcpy(dst + b->lo, zs_data(z->stage_buf), (size_t)b->len * sizeof(float));
    }
    return ZS_OK;
}

zs_status zs_zero_gather(zs_zero *z)
{
    return gather_buckets(z, z->shards, zs_data(z->fp));
}

static zs_status check_state(const zs_zero *z, zs_tensor *const *chunks,
                             const zs_tensor *full)
{
    for (int i = 0; i < z->nshards; i++)
        if (!chunks[i] || zs_numel(chunks[i]) != zs_numel(z->shards[i]) ||
            chunks[i]->dtype != ZS_F32 || !zs_is_contiguous(chunks[i]))
            return zs_set_error("ZeRO: state chunk %d does not match shard %d", i, i);
    if (full && (zs_numel(full) != zs_numel(z->fp) || full->dtype != ZS_F32 ||
                 !zs_is_contiguous(full)))
        return zs_set_error("ZeRO: the full state tensor does not match the "
                            "parameters");
    return ZS_OK;
}

zs_status zs_zero_gather_state(zs_zero *z, zs_tensor *const *chunks, zs_tensor *full)
{
    zs_status st = check_state(z, chunks, full);
    if (st != ZS_OK)
        return st;
    return gather_buckets(z, chunks, full ? zs_data(full) : NULL);
}

zs_status zs_zero_scatter_state(zs_zero *z, const zs_tensor *full, zs_tensor *const *chunks)
{
    if (!full)
        return zs_set_error("ZeRO: no full state to scatter");
    zs_status st = check_state(z, chunks, full);
    for (int k = 0; st == ZS_OK && k < z->nb; k++) {
        zbucket *b = &z->b[k];
        if (b->shard >= 0)
            memcpy(zs_data(chunks[b->shard]), (const float *)zs_data(full) + b->own_lo,
                   (size_t)b->own_len * sizeof(float));
    }
    return st;
}

void zs_zero_zero_grad(zs_zero *z)
{
    zs_tensor *g = !z ? NULL : z->stage == 2 ? z->sg : z->fg;
    if (g)
        memset(zs_data(g), 0, zs_nbytes(g));
}

void zs_zero_get_memory(const zs_zero *z, zs_zero_memory *m)
{
    *m = (zs_zero_memory){0};
    if (!z)
        return;
    m->params = (int64_t)zs_nbytes(z->fp);
    m->grad_shard = (int64_t)zs_nbytes(z->stage == 2 ? z->sg : z->fg);
    m->grad_peak = z->peak + (int64_t)(zs_nbytes(z->stage_buf) + zs_nbytes(z->chunk));
    m->buckets = z->nb;
}
