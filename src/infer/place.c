/*
 * place.c - the inference model's buffers as tensors on its device
 * (infer/internal.h): what the forward pass's descriptors run on.
 *
 * A model is built on the host (llm.c, llm_io.c) and wrapped: every buffer
 * gets a tensor header on the same bytes (no copy), so on the CPU the
 * engine reads the very memory it always did. zsi_llm_move then copies a
 * wrapped model to another device, once, and frees the host buffers: a
 * layer's arena becomes one device allocation and its four weight tensors
 * views of it, as on the host.
 */
#include <stdlib.h>

#include "core/internal.h"
#include "infer/internal.h"

static zs_tensor *wrap(void *p, zs_dtype dt, int64_t n)
{
    zsi_tracking_pause();
    zs_tensor *t = p ? zs_from_blob(dt, 1, (int64_t[]){n}, p) : NULL;
    zsi_tracking_resume();
    return t;
}

/* *t = a wrapper of n elements at p (nothing when p is NULL). */
static bool wrap_to(zs_tensor **t, void *p, zs_dtype dt, int64_t n)
{
    return !p || (*t = wrap(p, dt, n)) != NULL;
}

static zs_status oom(void)
{
    return zs_set_error_code(ZS_ERR_NOMEM, "llm: out of memory");
}

static zs_status wrap_layer(zs_llm *m, zsi_layer *y)
{
    int64_t C = m->c.width;
    zs_dtype dt = m->dt;
    if (!wrap_to(&y->tln1_w, y->ln1_w, dt, C) || !wrap_to(&y->tln1_b, y->ln1_b, dt, C) ||
        !wrap_to(&y->tln2_w, y->ln2_w, dt, C) || !wrap_to(&y->tln2_b, y->ln2_b, dt, C) ||
        !wrap_to(&y->tarena, y->arena, ZS_U8, y->arena_bytes))
        return oom();
    zsi_linear *ls[4] = {&y->qkv, &y->proj, &y->fc, &y->fc2};
    zs_status s = ZS_OK;
    for (int i = 0; s == ZS_OK && i < 4; i++)
        s = zsi_linear_wrap(ls[i], dt, ls[i]->in_arena ? y->tarena : NULL, y->arena);
    return s;
}

zs_status zsi_llm_wrap(zs_llm *m)
{
    int64_t C = m->c.width, V = m->c.vocab, H = m->c.heads;
    zs_dtype dt = m->dt;
    m->device = ZS_CPU;
    zs_status s = zsi_linear_wrap(&m->head, dt, NULL, NULL);
    if (s != ZS_OK)
        return s;
    if (m->wte && !wrap_to(&m->twte, m->wte, dt, V * C))
        return oom();
    if (!m->wte) /* the quantized head's rows */
        m->twte = zs_retain(m->head.tw);
    void *slopes = dt == ZS_F64 ? (void *)m->slopes64 : (void *)m->slopes;
    if (!wrap_to(&m->twpe, m->wpe, dt, m->c.ctx * C) ||
        !wrap_to(&m->temb_ln_w, m->emb_ln_w, dt, C) ||
        !wrap_to(&m->temb_ln_b, m->emb_ln_b, dt, C) ||
        !wrap_to(&m->tlnf_w, m->lnf_w, dt, C) || !wrap_to(&m->tlnf_b, m->lnf_b, dt, C) ||
        !wrap_to(&m->tslopes, slopes, dt, H))
        return oom();
    for (int64_t l = 0; s == ZS_OK && l < m->c.layers; l++)
        s = wrap_layer(m, &m->layers[l]);
    return s;
}

/* *t replaced by its copy on device; *host (the buffer it wrapped) freed. */
/* *t replaced by its copy on device; *host (the buffer it wrapped) freed. */
static bool move_buf(zs_tensor **t, void **host, int device)
{
    if (!*t)
        return true;
    if (!zsi_move_tensor(t, device))
        return false;
    if (host) {
        free(*host);
        *host = NULL;
    }
    return true;
}

static zs_status move_layer(zsi_layer *y, int device)
{
    if (!move_buf(&y->tln1_w, &y->ln1_w, device) || !move_buf(&y->tln1_b, &y->ln1_b, device) ||
        !move_buf(&y->tln2_w, &y->ln2_w, device) || !move_buf(&y->tln2_b, &y->ln2_b, device) ||
        !move_buf(&y->tarena, NULL, device))
        return ZS_ERR_NOMEM;
    zsi_linear *ls[4] = {&y->qkv, &y->proj, &y->fc, &y->fc2};
    zs_status s = ZS_OK;
    for (int i = 0; s == ZS_OK && i < 4; i++)
        s = zsi_linear_move(ls[i], device, ls[i]->in_arena ? y->tarena : NULL);
    if (s == ZS_OK && y->arena) { /* the host arena goes */
        zs_free(y->arena);
        y->arena = NULL;
        for (int i = 0; i < 4; i++)
            if (ls[i]->in_arena)
                ls[i]->packed.data = NULL, ls[i]->tiles.data = NULL, ls[i]->w = NULL;
    }
    return s;
}

zs_status zsi_llm_move(zs_llm *m, int device)
{
    if (device == m->device)
        return ZS_OK;
    if (device != ZS_CPU && !zs_device_get(device))
        return zs_set_error("llm: no device %d (devices: %s)", device, zs_device_list());
    if (m->device != ZS_CPU || device == ZS_CPU)
        return zs_set_error("llm: a model moves from the cpu to a device only");
    bool shared = m->twte == m->head.tw; /* the quantized head's rows */
    zs_status s = zsi_linear_move(&m->head, device, NULL);
    if (s != ZS_OK)
        return s;
    if (shared) {
        zs_release(m->twte);
        m->twte = zs_retain(m->head.tw);
    }
    bool ok = (shared || move_buf(&m->twte, &m->wte, device)) &&
              move_buf(&m->twpe, &m->wpe, device) &&
              move_buf(&m->temb_ln_w, &m->emb_ln_w, device) &&
              move_buf(&m->temb_ln_b, &m->emb_ln_b, device) &&
              move_buf(&m->tlnf_w, &m->lnf_w, device) &&
              move_buf(&m->tlnf_b, &m->lnf_b, device) &&
              move_buf(&m->tslopes, NULL, device);
    for (int64_t l = 0; ok && l < m->c.layers; l++)
        ok = move_layer(&m->layers[l], device) == ZS_OK;
    if (!ok)
        return ZS_ERR_NOMEM; /* zs_to_device's message */
    m->device = device; /* the slopes stay on the host too ([heads]) */
    return ZS_OK;
}
