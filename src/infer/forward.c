/*
 * forward.c - the inference model's forward pass over a flat batch of
 * token rows from any number of sequences (infer/internal.h): embeddings,
 * L pre-LayerNorm blocks whose keys and values go into the paged KV pool,
 * attention through block tables, and the logits of the rows asked for.
 *
 * Every row takes the same path whatever the batch: prefill chunks and
 * decodes alike attend with the paged kernel (one query per row over its
 * sequence's positions 0 .. pos), so a token's logits do not depend on how
 * its prompt was chunked or on what else ran in the step (batch
 * invariance). The fused causal kernel of training is not used here: its
 * tiling follows the chunk's length.
 *
 * Devices: the weights, the work buffers and the pool are tensors on the
 * model's device, and every computation is a driver call of one of
 * ops/infer_ops.h's descriptors, so the same code runs on the CPU (where
 * the tensors wrap the host buffers: no copies) and on any device with
 * kernels for them. Per step the host builds the metadata (ids, positions,
 * block tables) and copies it there once, and copies the logits back once.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "infer/internal.h"
#include "ops/op.h"

/* A new untracked tensor of n elements on device, replacing *t. */
static bool renew(zs_tensor **t, int device, zs_dtype dt, int64_t n)
{
    zs_release(*t);
    zsi_tracking_pause();
    *t = zsi_new_tensor_on(device, dt, 1, (int64_t[]){n > 0 ? n : 1});
    zsi_tracking_resume();
    return *t != NULL;
}

zs_status zsi_work_reserve(zsi_work *w, const zs_llm *m, int64_t rows, int64_t out_rows)
{
    int64_t C = m->c.width, V = m->c.vocab;
    int dev = m->device;
    if (w->device != dev || !w->x) { /* a fresh work, or another model's */
        zsi_work_free(w);
        w->device = dev;
    }
    if (rows > w->rows) {
        w->rows = rows;
        if (!renew(&w->x, dev, m->dt, rows * C) || !renew(&w->h, dev, m->dt, rows * C) ||
            !renew(&w->big, dev, m->dt, rows * 4 * C) ||
            !renew(&w->att, dev, m->dt, rows * C) || !renew(&w->q, dev, m->dt, rows * C)) {
            zsi_work_free(w);
            return zs_set_error_code(ZS_ERR_NOMEM, "llm: out of memory for a batch "
                                     "of %lld tokens", (long long)rows);
        }
    }
    if (out_rows > w->out_rows) {
        w->out_rows = out_rows;
        if (!renew(&w->hout, dev, m->dt, out_rows * C) ||
            (dev != ZS_CPU && !renew(&w->logits, dev, m->dt, out_rows * V))) {
            zsi_work_free(w);
            return zs_set_error_code(ZS_ERR_NOMEM, "llm: out of memory");
        }
    }
    return ZS_OK;
}

void zsi_work_free(zsi_work *w)
{
    zs_release(w->x), zs_release(w->h), zs_release(w->big), zs_release(w->att);
    zs_release(w->q), zs_release(w->hout), zs_release(w->logits), zs_release(w->tmeta);
    free(w->meta);
    *w = (zsi_work){0};
}

/* ---- the step's metadata ------------------------------------------------- */

/* Writes the step's metadata (ops/infer_ops.h) into w->meta and puts it on
 * the device: token ids, positions, each row's table offset, the out rows,
 * then one block table per run of rows sharing a table (the blocks of
 * positions up to the run's last). On the CPU w->tmeta wraps w->meta; on
 * another device this is the step's one copy to it. */
static zs_status step_meta(const zs_llm *m, zs_kv_pool *pool, const zsi_batch *b,
                           zsi_work *w, zsi_step_meta *sm)
{
    int64_t n = b->n, bs = zs_kv_pool_config_of(pool)->block_size;
    *sm = (zsi_step_meta){n, b->n_out, 0, n, 2 * n, 3 * n, 3 * n + b->n_out};
    for (int64_t i = 0; i < n;) { /* a run of rows of one table */
        int64_t j = i, most = 0;
        for (; j < n && b->tables[j] == b->tables[i]; j++)
            most = b->pos[j] > most ? b->pos[j] : most;
        sm->len += most / bs + 1;
        i = j;
    }
    if (sm->len > INT32_MAX)
        return zs_set_error("llm: a step of %lld rows is too large", (long long)n);
    if (sm->len > w->meta_cap) {
        int64_t cap = sm->len > 2 * w->meta_cap ? sm->len : 2 * w->meta_cap;
        int32_t *p = realloc(w->meta, (size_t)cap * sizeof *p);
        if (!p)
            return zs_set_error_code(ZS_ERR_NOMEM, "llm: out of memory");
        w->meta = p;
        w->meta_cap = cap;
        zs_release(w->tmeta);
        zsi_tracking_pause();
        w->tmeta = m->device == ZS_CPU
                       ? zs_from_blob(ZS_I32, 1, (int64_t[]){cap}, p)
                       : zsi_new_tensor_on(m->device, ZS_I32, 1, (int64_t[]){cap});
        zsi_tracking_resume();
        if (!w->tmeta) {
            w->meta_cap = 0;
            return ZS_ERR_NOMEM;
        }
    }
    int32_t *a = w->meta;
    int64_t at = sm->out + b->n_out;
    for (int64_t i = 0; i < n; i++) {
        a[sm->tok + i] = b->tokens[i];
        a[sm->pos + i] = (int32_t)b->pos[i];
    }
    for (int64_t i = 0; i < b->n_out; i++)
        a[sm->out + i] = (int32_t)b->out_rows[i];
    for (int64_t i = 0; i < n;) {
        int64_t j = i, most = 0;
        for (; j < n && b->tables[j] == b->tables[i]; j++) {
            most = b->pos[j] > most ? b->pos[j] : most;
            a[sm->tab + j] = (int32_t)at;
        }
        memcpy(a + at, b->tables[i], (size_t)(most / bs + 1) * sizeof *a);
        at += most / bs + 1;
        i = j;
    }
    if (m->device == ZS_CPU)
        return ZS_OK;
    return zsi_device_copy(m->device, zsi_ptr(w->tmeta), a, (size_t)sm->len * sizeof *a,
                           ZS_COPY_FROM_HOST);
}

/* Runs in-place descriptor def (ops/infer_ops.h) on in[0 .. n). */
static zs_status run(zsi_opdef *def, int n, zs_tensor **in, const void *attrs)
{
    zs_tensor *r = zsi_run(def, n, in, attrs);
    if (!r)
        return ZS_ERR_ARG;
    zs_release(r); /* in[0], retained */
    return ZS_OK;
}

/* y = layer_norm(x) * w + b over n rows; y may be x. */
static zs_status norm(const zs_llm *m, zs_tensor *x, zs_tensor *wt, zs_tensor *bt, int64_t n,
                      zs_tensor *y)
{
    zsi_norm_rows_attrs a = {n, m->c.width, 1e-5};
    return run(&zsi_def_layer_norm_rows, 4, (zs_tensor *[]){y, x, wt, bt}, &a);
}

/* ---- embeddings ---------------------------------------------------------- */

static zs_status embed(const zs_llm *m, const zsi_step_meta *sm, zsi_work *w)
{
    bool dense = m->twte != m->head.tw; /* else the quantized head's rows */
    zsi_embed_attrs a = {*sm, m->c.width, m->c.vocab,
                         dense ? (m->dt == ZS_F64 ? ZSI_W_F64 : ZSI_W_F32) : m->head.fmt,
                         m->twpe != NULL, m->head.tiles.tile_bytes};
    zs_tensor *in[4] = {w->x, w->tmeta, m->twte, m->twpe};
    zs_status s = run(&zsi_def_embedding_rows, 3 + (m->twpe != NULL), in, &a);
    if (s == ZS_OK && m->c.arch == ZS_BLOOM)
        s = norm(m, w->x, m->temb_ln_w, m->temb_ln_b, sm->n, w->x);
    return s;
}

/* ---- attention ----------------------------------------------------------- */

/* Keys and values of every row of layer l from qkv [n, 3C] into the pool
 * (in its dtype: the model's, or 16 bits for an f32 model), the queries
 * into w->q [n, C]; then attention over each row's positions into w->att. */
static zs_status attend(const zs_llm *m, zs_kv_pool *pool, const zsi_step_meta *sm,
                        int64_t l, zsi_work *w)
{
    const zs_kv_pool_config *pc = zs_kv_pool_config_of(pool);
    int64_t C = m->c.width, H = m->c.heads, L = m->c.layers, bs = pc->block_size;
    zs_tensor *tp = zs_kv_pool_tensor(pool);
    zsi_kv_attrs ka = {*sm, C, L, l, bs};
    zs_status s = run(&zsi_def_kv_store, 4, (zs_tensor *[]){w->q, tp, w->big, w->tmeta}, &ka);
    if (s != ZS_OK)
        return s;
    zsi_paged_attn_attrs aa = {*sm, H, C / H, L, l, bs, m->tslopes != NULL};
    zs_tensor *in[5] = {w->att, w->q, tp, w->tmeta, m->tslopes};
    return run(&zsi_def_paged_attention, 4 + (m->tslopes != NULL), in, &aa);
}

/* ---- blocks -------------------------------------------------------------- */

/* SmoothQuant calibration: the largest |x| per channel of x [n, K] (a
 * calibrating model is on the CPU). */
static void observe(const zs_llm *m, int which, int64_t l, const zs_tensor *t, int64_t n,
                    int64_t K)
{
    if (!m->calib)
        return;
    const float *x = zs_data(t);
    float *a = m->calib->amax[which] + l * K;
    for (int64_t i = 0; i < n; i++)
        for (int64_t k = 0; k < K; k++)
            a[k] = fmaxf(a[k], fabsf(x[i * K + k]));
}

static zs_status block(const zs_llm *m, zs_kv_pool *pool, const zsi_step_meta *sm,
                       int64_t l, zsi_work *w)
{
    const zsi_layer *y = &m->layers[l];
    int64_t n = sm->n, C = m->c.width;
    zs_status s = norm(m, w->x, y->tln1_w, y->tln1_b, n, w->h);
    if (s != ZS_OK)
        return s;
    observe(m, 0, l, w->h, n, C);
    s = zsi_linear_run(&y->qkv, w->h, n, C, NULL, 0, ZSK_ACT_NONE, w->big, 3 * C);
    if (s != ZS_OK || (s = attend(m, pool, sm, l, w)) != ZS_OK)
        return s;
    observe(m, 1, l, w->att, n, C);
    s = zsi_linear_run(&y->proj, w->att, n, C, w->x, C, ZSK_ACT_NONE, w->x, C);
    if (s != ZS_OK || (s = norm(m, w->x, y->tln2_w, y->tln2_b, n, w->h)) != ZS_OK)
        return s;
    observe(m, 2, l, w->h, n, C);
    s = zsi_linear_run(&y->fc, w->h, n, C, NULL, 0, ZSK_ACT_GELU_TANH, w->big, 4 * C);
    if (s != ZS_OK)
        return s;
    observe(m, 3, l, w->big, n, 4 * C);
    return zsi_linear_run(&y->fc2, w->big, n, 4 * C, w->x, C, ZSK_ACT_NONE, w->x, C);
}

/* The tensor the head writes the logits of n_out rows into: on the CPU
 * the caller's buffer itself (wrapped, the wrapper kept while it stays). */
static zs_tensor *logits_tensor(const zs_llm *m, zsi_work *w, void *logits, int64_t n_out)
{
    if (m->device != ZS_CPU)
        return w->logits;
    int64_t n = n_out * m->c.vocab;
    if (w->logits && w->logits_at == logits && w->logits_n >= n)
        return w->logits;
    zs_release(w->logits);
    zsi_tracking_pause();
    w->logits = zs_from_blob(m->dt, 1, (int64_t[]){n}, logits);
    zsi_tracking_resume();
    w->logits_at = logits;
    w->logits_n = n;
    return w->logits;
}

zs_status zsi_forward(const zs_llm *m, zs_kv_pool *pool, const zsi_batch *b,
                      zsi_work *w, void *logits)
{
    int64_t C = m->c.width;
    zsi_step_meta sm;
    zs_status s = zsi_work_reserve(w, m, b->n, b->n_out);
    if (s == ZS_OK)
        s = step_meta(m, pool, b, w, &sm);
    if (s == ZS_OK)
        s = embed(m, &sm, w);
    for (int64_t l = 0; s == ZS_OK && l < m->c.layers; l++)
        s = block(m, pool, &sm, l, w);
    if (s != ZS_OK || b->n_out == 0)
        return s;
    zsi_gather_attrs ga = {sm, C};
    s = run(&zsi_def_gather_rows, 3, (zs_tensor *[]){w->hout, w->x, w->tmeta}, &ga);
    if (s == ZS_OK)
        s = norm(m, w->hout, m->tlnf_w, m->tlnf_b, b->n_out, w->hout);
    zs_tensor *lt = s == ZS_OK ? logits_tensor(m, w, logits, b->n_out) : NULL;
    if (s == ZS_OK && !lt)
        s = ZS_ERR_NOMEM;
    if (s == ZS_OK)
        s = zsi_linear_run(&m->head, w->hout, b->n_out, C, NULL, 0, ZSK_ACT_NONE, lt,
                           m->c.vocab);
    if (s != ZS_OK || m->device == ZS_CPU)
        return s;
    /* the step's one copy back: the logits of the out rows */
    return zsi_device_copy(m->device, logits, zsi_ptr(lt),
                           (size_t)(b->n_out * m->c.vocab) * zs_dtype_size(m->dt),
                           ZS_COPY_TO_HOST);
}

/* ---- a cold run of one sequence ------------------------------------------ */

zs_status zs_llm_logits(const zs_llm *m, const int32_t *tokens, int64_t n, float *logits)
{
    if (n < 1 || n > m->c.ctx)
        return zs_set_error("llm_logits: %lld tokens, expected 1 .. %lld (the context)",
                            (long long)n, (long long)m->c.ctx);
    for (int64_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= m->c.vocab)
            return zs_set_error("llm_logits: token %lld is %d, outside the vocabulary "
                                "of %lld", (long long)i, tokens[i], (long long)m->c.vocab);
    int64_t bs = 16, chunk = 256, V = m->c.vocab;
    zs_kv_pool_config pc = {m->c.layers, m->c.heads, m->c.width / m->c.heads, bs,
                            (n + bs - 1) / bs, m->dt};
    zs_kv_pool *pool = zs_kv_pool_new_on(&pc, m->device);
    zs_kv_seq seq;
    zs_kv_seq_init(&seq);
    zsi_work w = {0};
    int64_t *pos = malloc((size_t)n * sizeof *pos), *rows = malloc((size_t)n * sizeof *rows);
    const int32_t **tabs = malloc((size_t)n * sizeof *tabs);
    double *l64 = m->dt == ZS_F64 ? malloc((size_t)(chunk * V) * sizeof *l64) : NULL;
    zs_status s = pool && pos && rows && tabs && (m->dt != ZS_F64 || l64)
                      ? zs_kv_seq_append(pool, &seq, n)
                      : zs_set_error_code(ZS_ERR_NOMEM, "llm_logits: out of memory");
    for (int64_t i = 0; s == ZS_OK && i < n; i++)
        pos[i] = i, rows[i] = i, tabs[i] = seq.blocks;
    for (int64_t i0 = 0; s == ZS_OK && i0 < n; i0 += chunk) {
        int64_t k = n - i0 < chunk ? n - i0 : chunk;
        zsi_batch b = {k, tokens + i0, pos + i0, tabs + i0, k, rows};
        s = zsi_forward(m, pool, &b, &w, l64 ? (void *)l64 : logits + i0 * V);
        for (int64_t j = 0; s == ZS_OK && l64 && j < k * V; j++)
            logits[i0 * V + j] = (float)l64[j];
    }
    if (pool)
        zs_kv_seq_release(pool, &seq);
    zs_kv_pool_free(pool);
    zsi_work_free(&w);
    free(pos), free(rows), free(tabs), free(l64);
    return s;
}
