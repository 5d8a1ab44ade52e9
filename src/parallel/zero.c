/*
 * zero.c - ZeRO stages 2 and 3: gradients reduce-scattered bucket by
 * bucket as backward finishes them, optimizer state and gradients kept
 * only for this rank's chunks; at stage 3 the parameters too, gathered
 * unit by unit when the model needs them (contract in zs/zero.h).
 *
 * Bucket k covers flat elements [lo, lo + len); with cs = ceil(len / P)
 * rank r owns [lo + r*cs, lo + min((r+1)*cs, len)). The staging buffer
 * holds P*cs elements (the bucket, zero-padded), the reduce-scatter's
 * input; chunk rank receives cs of it.
 *
 * Stage 3: the buckets are the caller's units (a layer's parameters). The
 * flat parameter buffer keeps its addresses, so the model's parameter
 * views stay valid, but the pages of a dropped unit outside this rank's
 * chunk are handed back to the kernel (madvise MADV_DONTNEED: they read as
 * zeros until written again) and an all-gather refills them before use.
 * Only pages wholly inside a unit's foreign part are dropped, so a page
 * shared with the rank's own chunk or a neighbouring unit stays.
 * Residency changes in the same order on every rank (the hooks run in the
 * same order), which keeps the all-gathers matched.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "parallel/internal.h"
#include "kernels/cpu/optim.h"
#include "zs/autograd.h"
#include "zs/ops.h"
#include "zs/zero.h"

typedef struct zbucket {
    int64_t lo, len, cs;
    int64_t own_lo, own_len; /* this rank's chunk, in the flat buffer */
    int64_t sg_off;          /* its place in the shard gradient */
    int nparams, pending, nready;
    int shard;               /* index in z->shards, -1 when own_len == 0 */
    int group;               /* stage 3: the caller's unit id, -1 kept */
    bool resident;           /* stage 3: the foreign part is gathered */
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
    int *unit;               /* stage 3: bucket of group g, [ngroups] */
    int ngroups;
    bool pinned;             /* stage 3: all gathered until zs_zero_release */
    int64_t resident, resident_peak; /* gathered foreign parameter bytes */
};

static void unit_drop(zs_zero *z, int k);
static zs_status unit_fetch(zs_zero *z, int k);

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
    if (z->stage == 3 && b->group >= 0) /* its backward is over */
        unit_drop(z, k);
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

static const int64_t *sort_off; /* qsort context (single-threaded setup) */

static int by_off_desc(const void *a, const void *b)
{
    int64_t x = sort_off[*(const int *)a], y = sort_off[*(const int *)b];
    return x < y ? 1 : x > y ? -1 : 0;
}

/* Stage 3 buckets: maximal runs of parameters of one group in flat order,
 * descending like zsi_plan_buckets (bucket 0 ends the buffer, the lowest
 * reaches 0); ugroup[k] = the run's group (negative groups: -1, one run
 * per stretch). A group >= 0 split into two runs is an error. Returns the
 * bucket count, or a negative status. */
static int plan_units(int n, const int64_t *off, const int *group, int64_t *lo,
                      int *cnt, int *ugroup)
{
    int *idx = malloc((size_t)(n > 0 ? n : 1) * sizeof *idx);
    if (!idx)
        return zs_set_error_code(ZS_ERR_NOMEM, "ZeRO: out of memory");
    for (int i = 0; i < n; i++)
        idx[i] = i;
    sort_off = off;
    qsort(idx, (size_t)n, sizeof *idx, by_off_desc);
    int nb = 0;
    for (int j = 0; j < n; j++) {
        int g = group[idx[j]] < 0 ? -1 : group[idx[j]];
        if (nb == 0 || g != ugroup[nb - 1]) {
            for (int k = 0; g >= 0 && k < nb; k++)
                if (ugroup[k] == g) {
                    free(idx);
                    return zs_set_error("ZeRO-3: the parameters of unit %d are not "
                                        "contiguous in the flat buffer", g);
                }
            ugroup[nb] = g;
            cnt[nb++] = 0;
        }
        cnt[nb - 1]++;
        lo[nb - 1] = off[idx[j]];
    }
    free(idx);
    if (nb == 0) {
        ugroup[0] = -1;
        cnt[0] = 0;
        nb = 1;
    }
    lo[nb - 1] = 0;
    return nb;
}

/* Buckets (stage 3: units by group), this rank's chunks and the buffers. */
static zs_status build(zs_zero *z, int n, zs_tensor *const *params, int64_t limit,
                       const int *group)
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
    int *ugroup = calloc(m, sizeof *ugroup);
    if (!ugroup)
        st = ZS_ERR_NOMEM;
    if (st == ZS_OK && group) {
        z->nb = plan_units(n, off, group, z->lo, cnt, ugroup);
        st = z->nb < 0 ? z->nb : ZS_OK;
    } else if (st == ZS_OK && (z->nb = zsi_plan_buckets(n, off, total, limit, z->lo, cnt)) < 0)
        st = ZS_ERR_NOMEM;
    int P = z->c->size, R = z->c->rank;
    int64_t sg_n = 0, max_cs = 1;
    for (int k = 0; st == ZS_OK && k < z->nb; k++) {
        zbucket *b = &z->b[k];
        b->lo = z->lo[k];
        b->len = (k ? z->lo[k - 1] : total) - b->lo;
        b->cs = (b->len + P - 1) / P;
        b->nparams = cnt[k];
        b->group = group ? ugroup[k] : -1;
        b->resident = true; /* the module holds all of its parameters */
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
    if (st == ZS_OK && group) { /* group -> bucket, for fetch and drop */
        for (int k = 0; k < z->nb; k++)
            z->ngroups = ugroup[k] + 1 > z->ngroups ? ugroup[k] + 1 : z->ngroups;
        if (!(z->unit = malloc((size_t)(z->ngroups + 1) * sizeof *z->unit)))
            st = ZS_ERR_NOMEM;
        for (int g = 0; st == ZS_OK && g < z->ngroups; g++)
            z->unit[g] = -1;
        for (int k = 0; st == ZS_OK && k < z->nb; k++) {
            if (ugroup[k] >= 0)
                z->unit[ugroup[k]] = k;
            z->resident += (z->b[k].len - z->b[k].own_len) * (int64_t)sizeof(float);
        }
    }
    free(ugroup);
    if (st != ZS_OK)
        return st == ZS_ERR_NOMEM ? zs_set_error_code(st, "ZeRO: out of memory") : st;
    z->sg = z->stage >= 2 ? zs_zeros(ZS_F32, 1, &sg_n) : NULL;
    z->stage_buf = zs_zeros(ZS_F32, 1, (int64_t[]){max_cs * P});
    z->chunk = zs_zeros(ZS_F32, 1, &max_cs);
    if ((z->stage >= 2 && !z->sg) || !z->stage_buf || !z->chunk)
        return zs_set_error_code(ZS_ERR_NOMEM, "ZeRO: out of memory");
    for (int k = 0; k < z->nb; k++) {
        zbucket *b = &z->b[k];
        b->shard = -1;
        if (b->own_len == 0)
            continue;
        b->shard = z->nshards;
        zs_tensor *v = zs_narrow(z->fp, 0, b->own_lo, b->own_len);
        if (v)
            v->grad = z->stage >= 2 ? zs_narrow(z->sg, 0, b->sg_off, b->own_len)
                                    : zs_narrow(z->fg, 0, b->own_lo, b->own_len);
        if (!v || !v->grad)
            return zs_set_error_code(ZS_ERR_NOMEM, "ZeRO: out of memory");
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
    zsi_tracking_pause(); /* z owns its tensors, not a scope */
    zs_status st = build(z, n, params, bucket_bytes / 4, stage == 3 ? group : NULL);
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
    z->next = 0;
    z->live = z->peak = 0;
    for (int k = 0; k < z->nb; k++) {
        z->b[k].pending = z->b[k].nparams;
        z->b[k].nready = 0;
    }
    /* stage 3: the units kept for the whole step (embeddings tied to the
     * output layer, the final norm) are gathered now */
    for (int k = 0; z->stage == 3 && k < z->nb; k++)
        if (z->b[k].group < 0) {
            zs_status st = unit_fetch(z, k);
            if (st != ZS_OK)
                return st;
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
    for (int k = 0; z->stage == 3 && k < z->nb; k++)
        unit_drop(z, k);
    if (z->st != ZS_OK)
        return zs_set_error_code(z->st, "%s", z->err);
    return ZS_OK;
}

double zs_zero_clip_grad_norm(zs_zero *z, double max_norm)
{
    /* stage 1: every rank holds the whole averaged gradient; stage 2: the
     * squares of the shards are summed over the ranks */
    zs_tensor *gt = z->stage >= 2 ? z->sg : z->fg;
    double sq = zsk_sumsq_f32(zs_data(gt), zs_numel(gt));
    double norm = sqrt(sq);
    if (z->stage >= 2) {
        zs_tensor *t = zs_scalar(ZS_F64, sq);
        zs_status st = t ? zs_comm_allreduce(z->c, t, false, ZS_ALLREDUCE_MPI)
                         : ZS_ERR_NOMEM;
        norm = st == ZS_OK ? sqrt(zs_item(t)) : NAN;
        zs_release(t);
    }
    if (!isfinite(norm) || norm <= max_norm || max_norm <= 0)
        return norm;
    zsk_scale_f32(zs_data(gt), zs_numel(gt), (float)(max_norm / (norm + 1e-6)));
    return norm;
}

/* Bucket k: this rank's chunk (chunks[shard]) is all-gathered and the
 * bucket's elements written to dst + lo (dst NULL: not kept). */
static zs_status gather_one(zs_zero *z, int k, zs_tensor *const *chunks, float *dst)
{
    int P = z->c->size;
    float *ch = zs_data(z->chunk);
    zbucket *b = &z->b[k];
    memset(ch, 0, (size_t)b->cs * sizeof(float));
    if (b->shard >= 0)
        memcpy(ch, zs_data(chunks[b->shard]), (size_t)b->own_len * sizeof(float));
    zs_tensor *in = zs_narrow(z->chunk, 0, 0, b->cs);
    zs_tensor *out = zs_narrow(z->stage_buf, 0, 0, b->cs * P);
    zs_status st = in && out ? zs_comm_allgather(z->c, in, out) : ZS_ERR_NOMEM;
    zs_release(in);
    zs_release(out);
    if (st == ZS_OK && dst)
        memcpy(dst + b->lo, zs_data(z->stage_buf), (size_t)b->len * sizeof(float));
    return st;
}

static zs_status gather_buckets(zs_zero *z, zs_tensor *const *chunks, float *dst)
{
    zs_status st = ZS_OK;
    for (int k = 0; st == ZS_OK && k < z->nb; k++)
        st = gather_one(z, k, chunks, dst);
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
    zbucket *b = &z->b[k];
    if (!b->resident || z->pinned)
        return;
    float *base = zs_data(z->fp);
    int64_t own = b->lo + (b->own_lo - b->lo < b->len ? b->own_lo - b->lo : b->len);
    drop_pages(base + b->lo, base + own);
    drop_pages(base + own + b->own_len, base + b->lo + b->len);
    b->resident = false;
    z->resident -= (b->len - b->own_len) * (int64_t)sizeof(float);
}

static zs_status unit_fetch(zs_zero *z, int k)
{
    zbucket *b = &z->b[k];
    if (b->resident)
        return ZS_OK;
    zs_status st = gather_one(z, k, z->shards, zs_data(z->fp));
    if (st != ZS_OK)
        return st;
    b->resident = true;
    z->resident += (b->len - b->own_len) * (int64_t)sizeof(float);
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
        zbucket *b = &z->b[k];
        if (b->shard >= 0)
            memcpy(zs_data(chunks[b->shard]), (const float *)zs_data(full) + b->own_lo,
                   (size_t)b->own_len * sizeof(float));
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
    m->grad_peak = z->peak + (int64_t)(zs_nbytes(z->stage_buf) + zs_nbytes(z->chunk));
    m->buckets = z->nb;
}
