/*
 * zero.c - ZeRO stages 1, 2 and 3: gradients reduce-scattered bucket by
 * bucket as backward finishes them, optimizer state and gradients kept
 * only for this rank's chunks; at stage 3 the parameters too, gathered
 * unit by unit when the model needs them (contract in zs/zero.h).
 *
 * The buckets are the bucket engine's (buckets.c): by size from the end of
 * the flat parameter buffer (stages 1, 2) or one per unit (stage 3); the
 * engine follows the grad-ready events and hands complete buckets over in
 * index order, and reduce_bucket packs and reduce-scatters them.
 *
 * Bucket k covers flat elements [lo, lo + len); with cs = ceil(len / P)
 * rank r owns [lo + r*cs, lo + min((r+1)*cs, len)). The staging buffer
 * holds P*cs elements (the bucket, zero-padded), the reduce-scatter's
 * input; chunk rank receives cs of it. Stage 1 only gathers (its
 * gradients are all-reduced by zs/dp.h), and does so in rounds of at most
 * GATHER_ROUND elements of every rank's chunk, through a staging buffer
 * of P rounds made for the gather only (after the optimizer's step, when
 * the step's activations are gone): with one bucket over the model (the
 * bench's bucket_bytes 0) the bucket-sized buffer it kept was another
 * copy of the parameters on every rank, held through the step.
 *
 * Stage 3: the flat parameter buffer keeps its addresses, so the model's
 * parameter views stay valid, but the pages of a dropped unit outside this
 * rank's chunk are handed back to the kernel (madvise MADV_DONTNEED: they
 * read as zeros until written again) and an all-gather refills them before
 * use. Only pages wholly inside a unit's foreign part are dropped, so a
 * page shared with the rank's own chunk or a neighbouring unit stays.
 * Residency changes in the same order on every rank (the hooks run in the
 * same order), which keeps the all-gathers matched.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "kernels/cpu/optim.h"
#include "parallel/internal.h"
#include "zs/autograd.h"
#include "zs/ops.h"
#include "zs/zero.h"

typedef struct zchunk {
    int64_t cs;              /* chunk size: ceil(len / P) */
    int64_t own_lo, own_len; /* this rank's chunk, in the flat buffer */
    int64_t sg_off;          /* its place in the shard gradient */
    int shard;               /* index in z->shards, -1 when own_len == 0 */
    bool resident;           /* stage 3: the foreign part is gathered */
} zchunk;

struct zs_zero {
    zs_comm *c;
    int stage;
    zs_tensor *fp;           /* borrowed flat parameters */
    zs_tensor *fg;           /* stage 1: borrowed flat gradients */
    zs_tensor *sg;           /* stages 2, 3: shard gradient [sum of own_len] */
    zs_tensor *stage_buf, *chunk; /* [P * max cs], [max cs]; stage 1:
                                   * [P * round], [round] while gathering */
    int64_t max_cs;
    zs_tensor **shards;      /* optimizer views, .grad into sg */
    int nshards;
    zsi_buckets *e;          /* the buckets (e->b[k]) */
    zchunk *ch;              /* per bucket */
    int nb;
    bool armed;
    zs_status st;
    char err[384];
    int *unit;               /* stage 3: bucket of group g, [ngroups] */
    int ngroups;
    bool pinned;             /* stage 3: all gathered until zs_zero_release */
    int64_t resident, resident_peak; /* gathered foreign parameter bytes */
    void (*on_free)(void *); /* zs_zero_on_free: called first by zs_zero_free */
    void *on_free_ctx;
};

/* Stage 1: elements of each rank's chunk all-gathered at once (1 MiB). */
#define GATHER_ROUND ((int64_t)1 << 16)

static void unit_drop(zs_zero *z, int k);
static zs_status unit_fetch(zs_zero *z, int k);

static void fail(zs_zero *z, zs_status st)
{
    if (z->st == ZS_OK) {
        z->st = st;
        snprintf(z->err, sizeof z->err, "%s", zs_last_error());
    }
}

/* The engine's `ready` (stages 2, 3): packs bucket k's final gradients
 * into the staging buffer, frees them and reduce-scatters the bucket into
 * this rank's shard (averaged). After a failure the gradients are only
 * freed. */
static void reduce_bucket(void *ctx, int k)
{
    zs_zero *z = ctx;
    const zsi_bucket *b = &z->e->b[k];
    const zchunk *ch = &z->ch[k];
    int P = z->c->size;
    float *stage = zs_data(z->stage_buf);
    if (z->st == ZS_OK)
        memset(stage, 0, (size_t)(ch->cs * P) * sizeof(float));
    for (int i = 0; i < b->nready; i++) {
        zs_tensor *p = b->ready[i], *g = p->grad;
        int64_t off = p->offset - z->fp->offset - b->lo;
        if (z->st != ZS_OK)
            ;
        else if (g && zs_is_contiguous(g) && g->dtype == ZS_F32) /* as the engine makes them */
            memcpy(stage + off, zs_data(g), (size_t)zs_numel(g) * sizeof(float));
        else if (g)
            fail(z, zs_set_error_code(ZS_ERR_STATE, "ZeRO: a gradient is not a "
                                      "contiguous f32 tensor"));
        zs_zero_grad(p, true);
    }
    if (z->st != ZS_OK)
        return;
    zs_tensor *in = zs_narrow(z->stage_buf, 0, 0, ch->cs * P);
    zs_tensor *out = zs_narrow(z->chunk, 0, 0, ch->cs);
    zs_status st = in && out ? zs_comm_reduce_scatter(z->c, in, out) : ZS_ERR_NOMEM;
    zs_release(in);
    zs_release(out);
    if (st != ZS_OK) {
        fail(z, st);
        return;
    }
    const float *cv = zs_data(z->chunk);
    float *sg = (float *)zs_data(z->sg) + ch->sg_off, inv = 1.0f / (float)P;
    for (int64_t i = 0; i < ch->own_len; i++)
        sg[i] += cv[i] * inv;
    if (z->stage == 3 && b->group >= 0) /* its backward is over */
        unit_drop(z, k);
}

/* This rank's chunks, the unit table (stage 3) and the buffers, once the
 * engine has planned the buckets. */
static zs_status build(zs_zero *z)
{
    const zsi_buckets *e = z->e;
    z->nb = e->nb;
    z->ch = calloc((size_t)z->nb, sizeof *z->ch);
    z->shards = calloc((size_t)z->nb, sizeof *z->shards);
    if (!z->ch || !z->shards)
        return zs_set_error_code(ZS_ERR_NOMEM, "ZeRO: out of memory");
    int P = z->c->size, R = z->c->rank;
    int64_t sg_n = 0, max_cs = 1;
    for (int k = 0; k < z->nb; k++) {
        const zsi_bucket *b = &e->b[k];
        zchunk *ch = &z->ch[k];
        ch->cs = (b->len + P - 1) / P;
        ch->resident = true; /* the module holds all of its parameters */
        int64_t a = ch->cs * R, end = ch->cs * (R + 1) < b->len ? ch->cs * (R + 1) : b->len;
        ch->own_lo = b->lo + a;
        ch->own_len = end > a ? end - a : 0;
        ch->sg_off = sg_n;
        sg_n += ch->own_len;
        max_cs = ch->cs > max_cs ? ch->cs : max_cs;
    }
    if (z->stage == 3) { /* group -> bucket, for fetch and drop */
        for (int k = 0; k < z->nb; k++)
            z->ngroups = e->b[k].group + 1 > z->ngroups ? e->b[k].group + 1 : z->ngroups;
        if (!(z->unit = malloc((size_t)(z->ngroups + 1) * sizeof *z->unit)))
            return zs_set_error_code(ZS_ERR_NOMEM, "ZeRO: out of memory");
        for (int g = 0; g < z->ngroups; g++)
            z->unit[g] = -1;
        for (int k = 0; k < z->nb; k++) {
            if (e->b[k].group >= 0)
                z->unit[e->b[k].group] = k;
            z->resident += (e->b[k].len - z->ch[k].own_len) * (int64_t)sizeof(float);
        }
    }
    z->max_cs = max_cs;
    z->sg = z->stage >= 2 ? zs_zeros(ZS_F32, 1, &sg_n) : NULL;
    if (z->stage >= 2 && !(z->stage_buf = zs_zeros(ZS_F32, 1, (int64_t[]){max_cs * P})))
        return zs_set_error_code(ZS_ERR_NOMEM, "ZeRO: out of memory");
    if (z->stage >= 2 && !(z->chunk = zs_zeros(ZS_F32, 1, &max_cs)))
        return zs_set_error_code(ZS_ERR_NOMEM, "ZeRO: out of memory");
    if (z->stage >= 2 && !z->sg)
        return zs_set_error_code(ZS_ERR_NOMEM, "ZeRO: out of memory");
    for (int k = 0; k < z->nb; k++) {
        zchunk *ch = &z->ch[k];
        ch->shard = -1;
        if (ch->own_len == 0)
            continue;
        ch->shard = z->nshards;
        zs_tensor *v = zs_narrow(z->fp, 0, ch->own_lo, ch->own_len);
        if (v)
            v->grad = z->stage >= 2 ? zs_narrow(z->sg, 0, ch->sg_off, ch->own_len)
                                    : zs_narrow(z->fg, 0, ch->own_lo, ch->own_len);
        if (!v || !v->grad) {
            zs_release(v);
            return zs_set_error_code(ZS_ERR_NOMEM, "ZeRO: out of memory");
        }
        z->shards[z->nshards++] = v;
    }
    return ZS_OK;
}

static zs_zero *create(zs_comm *c, int stage, int64_t bucket_bytes, int n,
                       zs_tensor *const *params, zs_tensor *flat_params,
                       zs_tensor *flat_grads, const int *group)
{
    if (!c || n < 0 || (n > 0 && !params) || !flat_params ||
        flat_params->dtype != ZS_F32 || flat_params->ndim != 1 ||
        !zs_is_contiguous(flat_params) || (stage == 3 && n > 0 && !group) ||
        (stage == 1 && (!flat_grads || !zs_same_shape(flat_grads, flat_params) ||
                        flat_grads->dtype != ZS_F32 || !zs_is_contiguous(flat_grads)))) {
        zs_set_error("ZeRO: needs a communicator, the parameters as views of a "
                     "contiguous 1-D f32 buffer, for stage 1 a gradient buffer of the "
                     "same shape and for stage 3 the parameters' units");
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
    for (int i = 0; stage >= 2 && i < n; i++) /* gradients appear in backward */
        zs_zero_grad(params[i], true);
    static const zsi_bucket_ops ops = {reduce_bucket, NULL};
    zsi_tracking_pause(); /* z owns its tensors, not a scope */
    z->e = zsi_buckets_new(stage == 3 ? "ZeRO-3" : "ZeRO", n, params, flat_params, false,
                           bucket_bytes / 4, stage == 3 ? group : NULL, &ops, z);
    zs_status st = z->e ? build(z) : ZS_ERR_STATE;
    zsi_tracking_resume();
    if (st != ZS_OK) {
        zs_zero_free(z);
        return NULL;
    }
    return z;
}

zs_zero *zs_zero_new(zs_comm *c, int stage, int64_t bucket_bytes, int n,
                     zs_tensor *const *params, zs_tensor *flat_params,
                     zs_tensor *flat_grads)
{
    if (stage != 1 && stage != 2) {
        zs_set_error("ZeRO: stage %d is not one of 1 and 2 (zs_zero_new3 makes stage "
                     "3)", stage);
        return NULL;
    }
    return create(c, stage, bucket_bytes, n, params, flat_params, flat_grads, NULL);
}

zs_zero *zs_zero_new3(zs_comm *c, int n, zs_tensor *const *params,
                      zs_tensor *flat_params, const int *group)
{
    return create(c, 3, 0, n, params, flat_params, NULL, group);
}

void zs_zero_on_free(zs_zero *z, void (*fn)(void *ctx), void *ctx)
{
    z->on_free = fn;
    z->on_free_ctx = ctx;
}

void zs_zero_free(zs_zero *z)
{
    if (!z)
        return;
    if (z->on_free)
        z->on_free(z->on_free_ctx);
    zsi_buckets_free(z->e); /* removes its hook if armed */
    for (int i = 0; i < z->nshards; i++)
        zs_release(z->shards[i]);
    free(z->shards);
    free(z->ch);
    free(z->unit);
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
    /* stage 3: the units kept for the whole step (embeddings tied to the
     * output layer, the final norm) are gathered now */
    for (int k = 0; z->stage == 3 && k < z->nb; k++)
        if (z->e->b[k].group < 0) {
            zs_status st = unit_fetch(z, k);
            if (st != ZS_OK)
                return st;
        }
    zs_status st = zsi_buckets_begin(z->e, true);
    z->armed = st == ZS_OK;
    return st;
}

zs_status zs_zero_finish(zs_zero *z)
{
    if (!z)
        return ZS_ERR_ARG;
    if (z->stage == 1)
        return ZS_OK;
    z->armed = false;
    zsi_buckets_finish(z->e, true); /* buckets with parameters backward never reached */
    for (int k = 0; z->stage == 3 && k < z->nb; k++)
        unit_drop(z, k);
    if (z->st != ZS_OK)
        return zs_set_error_code(z->st, "%s", z->err);
    return ZS_OK;
}

double zs_zero_grad_norm(zs_zero *z)
{
    if (!z) {
        zs_set_error("ZeRO: grad_norm of no ZeRO");
        return NAN;
    }
    /* stage 1: every rank holds the whole averaged gradient; stages 2, 3:
     * the squares of the shards are summed over the ranks */
    zs_tensor *gt = z->stage >= 2 ? z->sg : z->fg;
    double sq = zsk_sumsq_f32(zs_data(gt), zs_numel(gt));
    if (z->stage == 1)
        return sqrt(sq);
    zs_tensor *t = zs_scalar(ZS_F64, sq);
    zs_status st = t ? zs_comm_allreduce(z->c, t, false, ZS_ALLREDUCE_MPI) : ZS_ERR_NOMEM;
    double norm = st == ZS_OK ? sqrt(zs_item(t)) : NAN;
    zs_release(t);
    return norm;
}

double zs_zero_clip_grad_norm(zs_zero *z, double max_norm)
{
    double norm = zs_zero_grad_norm(z);
    if (!isfinite(norm) || norm <= max_norm || max_norm <= 0)
        return norm;
    zs_tensor *gt = z->stage >= 2 ? z->sg : z->fg;
    zsk_scale_f32(zs_data(gt), zs_numel(gt), (float)(max_norm / (norm + 1e-6)));
    return norm;
}

/* Elements [at, at + n) of every rank's chunk of bucket k: this rank's
 * (chunks[shard], zero past its end) all-gathered through the staging
 * buffer and written to dst (NULL: not kept) where each rank's lie. */
static zs_status gather_round(zs_zero *z, int k, zs_tensor *const *chunks, float *dst,
                              int64_t at, int64_t n)
{
    int P = z->c->size;
    float *cv = zs_data(z->chunk);
    const zchunk *ch = &z->ch[k];
    const zsi_bucket *b = &z->e->b[k];
    int64_t mine = ch->own_len - at < n ? ch->own_len - at : n;
    memset(cv, 0, (size_t)n * sizeof(float));
    if (ch->shard >= 0 && mine > 0)
        memcpy(cv, (const float *)zs_data(chunks[ch->shard]) + at,
               (size_t)mine * sizeof(float));
    zs_tensor *in = zs_narrow(z->chunk, 0, 0, n);
    zs_tensor *out = zs_narrow(z->stage_buf, 0, 0, n * P);
    zs_status st = in && out ? zs_comm_allgather(z->c, in, out) : ZS_ERR_NOMEM;
    zs_release(in);
    zs_release(out);
    const float *sv = zs_data(z->stage_buf);
    for (int r = 0; st == ZS_OK && dst && r < P; r++) {
        int64_t lo = r * ch->cs + at; /* in the bucket */
        int64_t len = b->len - lo < n ? b->len - lo : n;
        if (len > 0)
            memcpy(dst + b->lo + lo, sv + r * n, (size_t)len * sizeof(float));
    }
    return st;
}

/* Bucket k: this rank's chunk (chunks[shard]) is all-gathered and the
 * bucket's elements written to dst + lo (dst NULL: not kept); stage 1 in
 * rounds (GATHER_ROUND), else the chunk at once. */
static zs_status gather_one(zs_zero *z, int k, zs_tensor *const *chunks, float *dst)
{
    int64_t cs = z->ch[k].cs, round = z->stage == 1 ? GATHER_ROUND : cs;
    zs_status st = ZS_OK;
    for (int64_t at = 0; st == ZS_OK && at < cs; at += round)
        st = gather_round(z, k, chunks, dst, at, cs - at < round ? cs - at : round);
    return st;
}

static zs_status gather_buckets(zs_zero *z, zs_tensor *const *chunks, float *dst)
{
    bool tmp = z->stage == 1; /* its staging lives for the gather only */
    if (tmp) {
        int64_t r = z->max_cs < GATHER_ROUND ? z->max_cs : GATHER_ROUND;
        zsi_tracking_pause();
        z->stage_buf = zs_empty(ZS_F32, 1, (int64_t[]){r * z->c->size});
        z->chunk = zs_empty(ZS_F32, 1, &r);
        zsi_tracking_resume();
        if (!z->stage_buf || !z->chunk) {
            zs_release(z->stage_buf);
            zs_release(z->chunk);
            z->stage_buf = z->chunk = NULL;
            return zs_set_error_code(ZS_ERR_NOMEM, "ZeRO: out of memory");
        }
    }
    zs_status st = ZS_OK;
    for (int k = 0; st == ZS_OK && k < z->nb; k++)
        st = gather_one(z, k, chunks, dst);
    if (tmp) {
        zs_release(z->stage_buf);
        zs_release(z->chunk);
        z->stage_buf = z->chunk = NULL;
    }
    return st;
}

/* ---- stage 3: units gathered on use, dropped after ------------------------ */

/* Hands the whole pages inside [from, to) back to the kernel. */
static void drop_pages(float *from, float *to)
{
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t a = ((uintptr_t)from + page - 1) & ~(page - 1);
    uintptr_t e = (uintptr_t)to & ~(page - 1);
    if (e > a)
        madvise((void *)a, e - a, MADV_DONTNEED);
}

static void unit_drop(zs_zero *z, int k)
{
    const zsi_bucket *b = &z->e->b[k];
    zchunk *ch = &z->ch[k];
    if (!ch->resident || z->pinned)
        return;
    float *base = zs_data(z->fp);
    int64_t own = b->lo + (ch->own_lo - b->lo < b->len ? ch->own_lo - b->lo : b->len);
    drop_pages(base + b->lo, base + own);
    drop_pages(base + own + ch->own_len, base + b->lo + b->len);
    ch->resident = false;
    z->resident -= (b->len - ch->own_len) * (int64_t)sizeof(float);
}

static zs_status unit_fetch(zs_zero *z, int k)
{
    zchunk *ch = &z->ch[k];
    if (ch->resident)
        return ZS_OK;
    zs_status st = gather_one(z, k, z->shards, zs_data(z->fp));
    if (st != ZS_OK)
        return st;
    ch->resident = true;
    z->resident += (z->e->b[k].len - ch->own_len) * (int64_t)sizeof(float);
    if (z->resident > z->resident_peak && !z->pinned)
        z->resident_peak = z->resident;
    return ZS_OK;
}

static int unit_of(const zs_zero *z, int group)
{
    if (!z || z->stage != 3 || group < 0 || group >= z->ngroups || z->unit[group] < 0) {
        zs_set_error("ZeRO-3: no unit %d", group);
        return -1;
    }
    return z->unit[group];
}

zs_status zs_zero_fetch(zs_zero *z, int group)
{
    int k = unit_of(z, group);
    return k < 0 ? ZS_ERR_ARG : unit_fetch(z, k);
}

zs_status zs_zero_drop(zs_zero *z, int group)
{
    int k = unit_of(z, group);
    if (k < 0)
        return ZS_ERR_ARG;
    unit_drop(z, k);
    return ZS_OK;
}

void zs_zero_release(zs_zero *z)
{
    if (!z || z->stage != 3)
        return;
    z->pinned = false;
    for (int k = 0; k < z->nb; k++)
        unit_drop(z, k);
}

zs_status zs_zero_gather(zs_zero *z)
{
    if (!z)
        return ZS_ERR_ARG;
    if (z->stage < 3)
        return gather_buckets(z, z->shards, zs_data(z->fp));
    zs_status st = ZS_OK;
    z->pinned = true; /* not counted in the training peak */
    for (int k = 0; st == ZS_OK && k < z->nb; k++)
        st = unit_fetch(z, k);
    z->pinned = st == ZS_OK;
    return st;
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
        const zchunk *ch = &z->ch[k];
        if (ch->shard >= 0)
            memcpy(zs_data(chunks[ch->shard]), (const float *)zs_data(full) + ch->own_lo,
                   (size_t)ch->own_len * sizeof(float));
    }
    return st;
}

void zs_zero_zero_grad(zs_zero *z)
{
    zs_tensor *g = !z ? NULL : z->stage >= 2 ? z->sg : z->fg;
    if (g)
        memset(zs_data(g), 0, zs_nbytes(g));
}

void zs_zero_get_memory(const zs_zero *z, zs_zero_memory *m)
{
    *m = (zs_zero_memory){0};
    if (!z)
        return;
    m->params = (int64_t)zs_nbytes(z->fp);
    if (z->stage == 3) { /* this rank's chunks, as long as the gradient shard */
        m->params = (int64_t)zs_nbytes(z->sg);
        m->params_peak = m->params + z->resident_peak;
    } else {
        m->params_peak = m->params;
    }
    m->grad_shard = (int64_t)zs_nbytes(z->stage >= 2 ? z->sg : z->fg);
    m->grad_peak = z->e->peak + (z->stage_buf ? (int64_t)zs_nbytes(z->stage_buf) : 0) +
                   (z->chunk ? (int64_t)zs_nbytes(z->chunk) : 0);
    m->buckets = z->nb;
}
