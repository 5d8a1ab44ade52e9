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
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "infer/internal.h"
#include "kernels/cpu/norm.h"
#include "kernels/cpu/paged_attention.h"

static void *grow(void *p, size_t n)
{
    void *q = realloc(p, n ? n : 1);
    if (!q)
        free(p);
    return q;
}

zs_status zsi_work_reserve(zsi_work *w, const zs_llm *m, int64_t rows, int64_t out_rows)
{
    int64_t C = m->c.width;
    size_t es = zs_dtype_size(m->dt);
    if (rows > w->rows) {
        w->x = grow(w->x, (size_t)(rows * C) * es);
        w->h = grow(w->h, (size_t)(rows * C) * es);
        w->big = grow(w->big, (size_t)(rows * 4 * C) * es);
        w->att = grow(w->att, (size_t)(rows * C) * es);
        w->q = grow(w->q, (size_t)(rows * C) * es);
        w->len = grow(w->len, (size_t)rows * sizeof *w->len);
        w->rows = rows;
        if (!w->x || !w->h || !w->big || !w->att || !w->q || !w->len) {
            zsi_work_free(w);
            return zs_set_error_code(ZS_ERR_NOMEM, "llm: out of memory for a batch "
                                     "of %lld tokens", (long long)rows);
        }
    }
    if (out_rows > w->out_rows) {
        w->hout = grow(w->hout, (size_t)(out_rows * C) * es);
        w->out_rows = out_rows;
        if (!w->hout) {
            zsi_work_free(w);
            return zs_set_error_code(ZS_ERR_NOMEM, "llm: out of memory");
        }
    }
    return ZS_OK;
}

void zsi_work_free(zsi_work *w)
{
    free(w->x), free(w->h), free(w->big), free(w->att), free(w->q), free(w->len);
    free(w->hout);
    *w = (zsi_work){0};
}

/* ---- embeddings ---------------------------------------------------------- */

/* Row id of the token embedding into dst (compute dtype). */
static zs_status embedding_row(const zs_llm *m, int32_t id, void *dst)
{
    int64_t C = m->c.width;
    size_t es = zs_dtype_size(m->dt);
    if (m->wte) {
        memcpy(dst, (const char *)m->wte + (size_t)id * (size_t)C * es, (size_t)C * es);
        return ZS_OK;
    }
    return zsk_qpacked_row(&m->head.tiles, id, dst); /* quantized: the head's row */
}

static zs_status embed(const zs_llm *m, const zsi_batch *b, void *x)
{
    int64_t C = m->c.width;
    size_t es = zs_dtype_size(m->dt);
    for (int64_t i = 0; i < b->n; i++) {
        char *r = (char *)x + (size_t)(i * C) * es;
        zs_status s = embedding_row(m, b->tokens[i], r);
        if (s != ZS_OK)
            return s;
        if (m->c.arch == ZS_BLOOM)
            continue;
        const char *p = (const char *)m->wpe + (size_t)(b->pos[i] * C) * es;
        for (int64_t c = 0; c < C; c++) {
            if (m->dt == ZS_F64)
                ((double *)r)[c] += ((const double *)p)[c];
            else
                ((float *)r)[c] += ((const float *)p)[c];
        }
    }
    if (m->c.arch == ZS_BLOOM)
        zsk_layer_norm(m->dt, x, m->emb_ln_w, m->emb_ln_b, b->n, C, 1e-5, x, NULL, NULL);
    return ZS_OK;
}

/* ---- attention ----------------------------------------------------------- */

/* One K or V row of C floats into the pool's 16-bit dtype kv (rounded to
 * nearest even, as zs_f32_to_bf16 / zs_f32_to_f16). */
static void narrow_row(zs_dtype kv, const float *src, int64_t C, uint16_t *dst)
{
    for (int64_t c = 0; c < C; c++)
        dst[c] = kv == ZS_BF16 ? zs_f32_to_bf16(src[c]) : zs_f32_to_f16(src[c]);
}

/* Keys and values of every row of layer l from qkv [n, 3C] into the pool
 * (in its dtype: the model's, or 16 bits for an f32 model), and the
 * queries into w->q [n, C]. */
static void store_kv(const zs_llm *m, zs_kv_pool *pool, const zsi_batch *b, int64_t l,
                     zsi_work *w)
{
    const zs_kv_pool_config *pc = zs_kv_pool_config_of(pool);
    int64_t C = m->c.width, L = m->c.layers, bs = pc->block_size;
    size_t es = zs_dtype_size(m->dt), row = (size_t)C * es;
    size_t kv_row = (size_t)C * zs_dtype_size(pc->dtype);
    bool same = pc->dtype == m->dt;
    char *base = zs_kv_pool_data(pool);
    for (int64_t i = 0; i < b->n; i++) {
        const char *qkv = (const char *)w->big + (size_t)(i * 3) * row;
        int64_t blk = b->tables[i][b->pos[i] / bs], slot = b->pos[i] % bs;
        char *k = base + ((size_t)(blk * 2 * L + l) * (size_t)bs + (size_t)slot) * kv_row;
        char *v = k + (size_t)(L * bs) * kv_row;
        memcpy((char *)w->q + (size_t)i * row, qkv, row);
        if (same) {
            memcpy(k, qkv + row, row);
            memcpy(v, qkv + 2 * row, row);
        } else {
            narrow_row(pc->dtype, (const float *)(qkv + row), C, (uint16_t *)k);
            narrow_row(pc->dtype, (const float *)(qkv + 2 * row), C, (uint16_t *)v);
        }
        w->len[i] = b->pos[i] + 1;
    }
}

static zs_status attend(const zs_llm *m, zs_kv_pool *pool, const zsi_batch *b, int64_t l,
                        zsi_work *w)
{
    const zs_kv_pool_config *pc = zs_kv_pool_config_of(pool);
    int64_t C = m->c.width, H = m->c.heads, D = C / H, L = m->c.layers;
    int64_t bs = pc->block_size, per = bs * C;
    if (m->dt == ZS_F64) {
        zsk_paged_attn_f64 a = {b->n, H, D, w->q, zs_kv_pool_data(pool), 2 * L * per,
                                l * per, (L + l) * per, bs, b->tables, w->len,
                                1 / sqrt((double)D), m->slopes64};
        return zsk_paged_attention_f64(&a, w->att);
    }
    zsk_paged_attn a = {b->n, H, D, w->q, zs_kv_pool_data(pool), 2 * L * per, l * per,
                        (L + l) * per, bs, b->tables, w->len,
                        (float)(1 / sqrt((double)D)), m->slopes, pc->dtype};
    return zsk_paged_attention_f32(&a, w->att);
}

/* ---- blocks -------------------------------------------------------------- */

/* SmoothQuant calibration: the largest |x| per channel of x [n, K]. */
static void observe(const zs_llm *m, int which, int64_t l, const float *x, int64_t n,
                    int64_t K)
{
    if (!m->calib)
        return;
    float *a = m->calib->amax[which] + l * K;
    for (int64_t i = 0; i < n; i++)
        for (int64_t k = 0; k < K; k++)
            a[k] = fmaxf(a[k], fabsf(x[i * K + k]));
}

static zs_status block(const zs_llm *m, zs_kv_pool *pool, const zsi_batch *b, int64_t l,
                       zsi_work *w)
{
    const zsi_layer *y = &m->layers[l];
    int64_t n = b->n, C = m->c.width;
    zs_dtype dt = m->dt;
    zsk_layer_norm(dt, w->x, y->ln1_w, y->ln1_b, n, C, 1e-5, w->h, NULL, NULL);
    observe(m, 0, l, w->h, n, C);
    zs_status s = zsi_linear_run(&y->qkv, dt, w->h, n, C, NULL, 0, ZSK_ACT_NONE, w->big,
                                 3 * C);
    if (s != ZS_OK)
        return s;
    store_kv(m, pool, b, l, w);
    if ((s = attend(m, pool, b, l, w)) != ZS_OK)
        return s;
    observe(m, 1, l, w->att, n, C);
    s = zsi_linear_run(&y->proj, dt, w->att, n, C, w->x, C, ZSK_ACT_NONE, w->x, C);
    if (s != ZS_OK)
        return s;
    zsk_layer_norm(dt, w->x, y->ln2_w, y->ln2_b, n, C, 1e-5, w->h, NULL, NULL);
    observe(m, 2, l, w->h, n, C);
    s = zsi_linear_run(&y->fc, dt, w->h, n, C, NULL, 0, ZSK_ACT_GELU_TANH, w->big, 4 * C);
    if (s != ZS_OK)
        return s;
    observe(m, 3, l, w->big, n, 4 * C);
    return zsi_linear_run(&y->fc2, dt, w->big, n, 4 * C, w->x, C, ZSK_ACT_NONE, w->x, C);
}

zs_status zsi_forward(const zs_llm *m, zs_kv_pool *pool, const zsi_batch *b,
                      zsi_work *w, void *logits)
{
    int64_t C = m->c.width;
    size_t es = zs_dtype_size(m->dt);
    zs_status s = zsi_work_reserve(w, m, b->n, b->n_out);
    if (s == ZS_OK)
        s = embed(m, b, w->x);
    for (int64_t l = 0; s == ZS_OK && l < m->c.layers; l++)
        s = block(m, pool, b, l, w);
    if (s != ZS_OK || b->n_out == 0)
        return s;
    for (int64_t i = 0; i < b->n_out; i++)
        memcpy((char *)w->hout + (size_t)(i * C) * es,
               (const char *)w->x + (size_t)(b->out_rows[i] * C) * es, (size_t)C * es);
    zsk_layer_norm(m->dt, w->hout, m->lnf_w, m->lnf_b, b->n_out, C, 1e-5, w->hout, NULL,
                   NULL);
    return zsi_linear_run(&m->head, m->dt, w->hout, b->n_out, C, NULL, 0, ZSK_ACT_NONE,
                          logits, m->c.vocab);
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
    zs_kv_pool *pool = zs_kv_pool_new(&pc);
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
