/*
 * llm_io.c - quantized checkpoints (zs_llm_save, zs_llm_open in
 * zs/infer.h).
 *
 * A quantized checkpoint is safetensors with the GPT's tensor names:
 *   - quantized weights of the block formats as U8 [N, K / 32 * block
 *     bytes] (kernels/cpu/quant.h), int8 ones as I8 [N, K] beside
 *     "<name>.scale" F32 [N] and, for SmoothQuant, "<name>.smooth" F32 [K];
 *   - wte.weight in the logits head's format (the embedding rows are read
 *     from it), everything else (norms, biases, wpe) F32;
 *   - metadata: the GPT config, "quant" (the scheme), "quant.<name>" for
 *     every quantized tensor (q8_0, q4_0, q4_1, i8) and
 *     "quant.int8_threshold".
 * Loading checks every tensor's dtype and shape against the config and
 * every scale for finiteness before the model is used.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "infer/internal.h"
#include "zs/io.h"

static const char *fmt_name(zsi_wfmt f)
{
    switch (f) {
    case ZSI_W_Q8_0: return "q8_0";
    case ZSI_W_Q4_0: return "q4_0";
    case ZSI_W_Q4_1: return "q4_1";
    case ZSI_W_I8: return "i8";
    default: return "f32";
    }
}

/* ---- saving ---------------------------------------------------------------- */

typedef struct out_set {
    int n, cap;
    char **names;
    zs_tensor **t;
    cJSON *meta;
    bool ok;
} out_set;

static void put(out_set *o, const char *name, zs_dtype dt, int ndim, const int64_t *shape,
                const void *data)
{
    if (!o->ok)
        return;
    if (o->n == o->cap) {
        o->cap = o->cap ? 2 * o->cap : 64;
        char **nn = realloc(o->names, (size_t)o->cap * sizeof *nn);
        zs_tensor **tt = nn ? realloc(o->t, (size_t)o->cap * sizeof *tt) : NULL;
        o->names = nn ? nn : o->names;
        o->t = tt ? tt : o->t;
        if (!nn || !tt) {
            o->ok = false;
            return;
        }
    }
    o->names[o->n] = strdup(name);
    o->t[o->n] = zs_from_data(dt, ndim, shape, data);
    o->ok = o->names[o->n] && o->t[o->n];
    o->n++;
}

static void put_vec(out_set *o, const char *name, const void *data, int64_t n)
{
    put(o, name, ZS_F32, 1, &n, data);
}

static void put_linear(out_set *o, const char *name, const zsi_linear *l)
{
    char n[128];
    snprintf(n, sizeof n, "quant.%s", name);
    cJSON_AddStringToObject(o->meta, n, fmt_name(l->fmt));
    if (l->fmt == ZSI_W_I8) {
        put(o, name, ZS_I8, 2, (int64_t[]){l->N, l->K}, l->w);
        snprintf(n, sizeof n, "%s.scale", name);
        put_vec(o, n, l->scale, l->N);
        if (l->smooth) {
            snprintf(n, sizeof n, "%s.smooth", name);
            put_vec(o, n, l->smooth, l->K);
        }
    } else { /* the tiles back to quant.h's row blocks */
        int64_t row = l->K / ZSK_QBLOCK * zsk_qblock_bytes(zsi_qfmt(l->fmt));
        void *blocks = malloc((size_t)(l->N * row));
        if (!blocks || zsk_qunpack(&l->tiles, blocks) < 0)
            o->ok = false;
        else
            put(o, name, ZS_U8, 2, (int64_t[]){l->N, row}, blocks);
        free(blocks);
    }
}

static void put_layer(out_set *o, const zs_llm *m, int64_t i)
{
    const zsi_layer *y = &m->layers[i];
    const char *names[4] = {"attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"};
    const zsi_linear *ls[4] = {&y->qkv, &y->proj, &y->fc, &y->fc2};
    char n[128];
    int64_t C = m->c.width;
    const void *ln[4] = {y->ln1_w, y->ln1_b, y->ln2_w, y->ln2_b};
    const char *lnn[4] = {"ln_1.weight", "ln_1.bias", "ln_2.weight", "ln_2.bias"};
    for (int k = 0; k < 4; k++) {
        snprintf(n, sizeof n, "h.%lld.%s", (long long)i, lnn[k]);
        put_vec(o, n, ln[k], C);
        snprintf(n, sizeof n, "h.%lld.%s.weight", (long long)i, names[k]);
        put_linear(o, n, ls[k]);
        snprintf(n, sizeof n, "h.%lld.%s.bias", (long long)i, names[k]);
        put_vec(o, n, ls[k]->bias, ls[k]->N);
    }
}

/* The metadata: config, scheme, the caller's keys. */
static zs_status base_meta(const zs_llm *m, const char *extra, out_set *o)
{
    char cfg[512];
    zs_gpt_config_to_metadata(&m->c, cfg, sizeof cfg);
    o->meta = cJSON_Parse(cfg);
    cJSON *x = extra ? cJSON_Parse(extra) : NULL;
    if (extra && !cJSON_IsObject(x)) {
        cJSON_Delete(x);
        return zs_set_error("llm_save: the extra metadata is not a JSON object");
    }
    for (cJSON *it = x ? x->child : NULL; it; it = it->next)
        if (cJSON_IsString(it) && !cJSON_GetObjectItemCaseSensitive(o->meta, it->string))
            cJSON_AddStringToObject(o->meta, it->string, it->valuestring);
    cJSON_Delete(x);
    char th[32];
    snprintf(th, sizeof th, "%.9g", (double)m->int8_threshold);
    cJSON_AddStringToObject(o->meta, "quant", zs_quant_name(m->quant));
    cJSON_AddStringToObject(o->meta, "quant.int8_threshold", th);
    return ZS_OK;
}

zs_status zs_llm_save(const zs_llm *m, const char *path, const char *extra_metadata)
{
    if (m->quant == ZS_QUANT_NONE || m->dt != ZS_F32)
        return zs_set_error("llm_save: the model is not quantized (its float checkpoint "
                            "is the one to keep)");
    if (m->device != ZS_CPU)
        return zs_set_error("llm_save: the model lives on %s (its host buffers are "
                            "gone): save it from a model opened on the cpu",
                            zs_device_name(m->device));
    out_set o = {.ok = true};
    zs_status s = base_meta(m, extra_metadata, &o);
    int64_t C = m->c.width;
    if (s == ZS_OK) {
        if (m->wte)
            put(&o, "wte.weight", ZS_F32, 2, (int64_t[]){m->c.vocab, C}, m->wte);
        else
            put_linear(&o, "wte.weight", &m->head);
        if (m->wpe)
            put(&o, "wpe.weight", ZS_F32, 2, (int64_t[]){m->c.ctx, C}, m->wpe);
        if (m->emb_ln_w) {
            put_vec(&o, "emb_ln.weight", m->emb_ln_w, C);
            put_vec(&o, "emb_ln.bias", m->emb_ln_b, C);
        }
        for (int64_t i = 0; i < m->c.layers; i++)
            put_layer(&o, m, i);
        put_vec(&o, "ln_f.weight", m->lnf_w, C);
        put_vec(&o, "ln_f.bias", m->lnf_b, C);
        char *meta = o.ok ? cJSON_PrintUnformatted(o.meta) : NULL;
        s = meta ? zs_safetensors_save(path, o.n, (const char *const *)o.names, o.t, meta)
                 : zs_set_error_code(ZS_ERR_NOMEM, "llm_save: out of memory");
        free(meta);
    }
    for (int i = 0; i < o.n; i++) {
        free(o.names[i]);
        zs_release(o.t[i]);
    }
    free(o.names);
    free(o.t);
    cJSON_Delete(o.meta);
    return s;
}

/* ---- loading ---------------------------------------------------------------- */

typedef struct in_set {
    const char *path;
    zs_tensor_set set;
    cJSON *meta;
} in_set;

/* The tensor `name` with exactly dtype dt and shape [d0, d1] (d1 < 0: 1-D),
 * or NULL + message. */
static const zs_tensor *need(const in_set *in, const char *name, zs_dtype dt, int64_t d0,
                             int64_t d1)
{
    const zs_tensor *t = zs_tensor_set_get(&in->set, name);
    int nd = d1 < 0 ? 1 : 2;
    if (!t) {
        zs_set_error_code(ZS_ERR_FORMAT, "%s: no tensor %s", in->path, name);
        return NULL;
    }
    if (t->dtype != dt || t->ndim != nd || t->shape[0] != d0 || (nd == 2 && t->shape[1] != d1)) {
        char s[96];
        zs_set_error_code(ZS_ERR_FORMAT, "%s: %s is %s %s, expected %s [%lld%s%lld]",
                          in->path, name, zs_dtype_name(t->dtype),
                          zs_shape_str(t, s, sizeof s), zs_dtype_name(dt), (long long)d0,
                          nd == 2 ? ", " : "", nd == 2 ? (long long)d1 : 0LL);
        return NULL;
    }
    return t;
}

static void *copy_of(const zs_tensor *t)
{
    size_t n = (size_t)zs_numel(t) * zs_dtype_size(t->dtype);
    void *p = malloc(n ? n : 1);
    if (p)
        memcpy(p, zs_data(t), n);
    return p;
}

static void *vec(const in_set *in, const char *name, int64_t n)
{
    const zs_tensor *t = need(in, name, ZS_F32, n, -1);
    void *p = t ? copy_of(t) : NULL;
    for (int64_t i = 0; p && i < n; i++)
        if (!isfinite(((float *)p)[i])) {
            zs_set_error_code(ZS_ERR_FORMAT, "%s: %s holds a non-finite value", in->path,
                              name);
            free(p);
            return NULL;
        }
    if (t && !p)
        zs_set_error_code(ZS_ERR_NOMEM, "llm: out of memory");
    return p;
}

static zsi_wfmt parse_fmt(const char *s)
{
    if (!s)
        return ZSI_W_F32;
    if (!strcmp(s, "q8_0"))
        return ZSI_W_Q8_0;
    if (!strcmp(s, "q4_0"))
        return ZSI_W_Q4_0;
    if (!strcmp(s, "q4_1"))
        return ZSI_W_Q4_1;
    return !strcmp(s, "i8") ? ZSI_W_I8 : (zsi_wfmt)-1;
}

/* Every f16 scale (and Q4_1 offset) of n blocks is finite. */
static bool scales_finite(zsi_wfmt f, const uint8_t *w, int64_t n)
{
    int64_t bb = zsk_qblock_bytes(zsi_qfmt(f));
    for (int64_t b = 0; b < n; b++) {
        uint16_t h[2];
        memcpy(h, w + b * bb, f == ZSI_W_Q4_1 ? 4 : 2);
        if ((h[0] & 0x7c00) == 0x7c00 || (f == ZSI_W_Q4_1 && (h[1] & 0x7c00) == 0x7c00))
            return false;
    }
    return true;
}

static zs_status read_linear(const in_set *in, const char *name, int64_t N, int64_t K,
                             bool bias, zsi_linear *l)
{
    char key[160];
    snprintf(key, sizeof key, "quant.%s", name);
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(in->meta, key);
    zsi_wfmt fmt = parse_fmt(cJSON_IsString(f) ? f->valuestring : NULL);
    *l = (zsi_linear){.fmt = fmt, .N = N, .K = K};
    if ((int)fmt < 0 || fmt == ZSI_W_F32 || (fmt != ZSI_W_I8 && K % ZSK_QBLOCK))
        return zs_set_error_code(ZS_ERR_FORMAT, "%s: %s has no valid quantization format "
                                 "in the metadata", in->path, name);
    const zs_tensor *t;
    if (fmt == ZSI_W_I8) {
        t = need(in, name, ZS_I8, N, K);
        l->w_bytes = N * K;
        snprintf(key, sizeof key, "%s.scale", name);
        if (t && !(l->scale = vec(in, key, N)))
            return ZS_ERR_FORMAT;
        snprintf(key, sizeof key, "%s.smooth", name);
        if (t && zs_tensor_set_get(&in->set, key) && !(l->smooth = vec(in, key, K)))
            return ZS_ERR_FORMAT;
    } else {
        t = need(in, name, ZS_U8, N, K / ZSK_QBLOCK * zsk_qblock_bytes(zsi_qfmt(fmt)));
        if (t && !scales_finite(fmt, zs_data(t), N * K / ZSK_QBLOCK))
            return zs_set_error_code(ZS_ERR_FORMAT, "%s: %s holds a non-finite block "
                                     "scale (corrupted?)", in->path, name);
    }
    if (!t)
        return ZS_ERR_FORMAT;
    zs_status s = fmt == ZSI_W_I8 ? ((l->w = copy_of(t)) ? ZS_OK : ZS_ERR_NOMEM)
                                  : zsi_linear_tiles(l, zs_data(t));
    if (s == ZS_ERR_NOMEM)
        return zs_set_error_code(ZS_ERR_NOMEM, "llm: out of memory");
    if (s < 0)
        return s;
    snprintf(key, sizeof key, "%.*s.bias", (int)(strlen(name) - 7), name);
    if (bias && !(l->bias = vec(in, key, N)))
        return ZS_ERR_FORMAT;
    if (fmt == ZSI_W_I8) {
        const cJSON *th = cJSON_GetObjectItemCaseSensitive(in->meta, "quant.int8_threshold");
        const cJSON *q = cJSON_GetObjectItemCaseSensitive(in->meta, "quant");
        l->threshold = cJSON_IsString(th) ? strtof(th->valuestring, NULL) : 0;
        if (cJSON_IsString(q) && strcmp(q->valuestring, "int8"))
            l->threshold = 0;
        if (!(l->threshold >= 0 && l->threshold < 1e30f))
            return zs_set_error_code(ZS_ERR_FORMAT, "%s: bad int8 threshold", in->path);
    }
    return ZS_OK;
}

static zs_status read_layer(const in_set *in, zs_llm *m, int64_t i)
{
    zsi_layer *y = &m->layers[i];
    int64_t C = m->c.width;
    const char *names[4] = {"attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"};
    zsi_linear *ls[4] = {&y->qkv, &y->proj, &y->fc, &y->fc2};
    const int64_t N[4] = {3 * C, C, 4 * C, C}, K[4] = {C, C, C, 4 * C};
    void **ln[4] = {&y->ln1_w, &y->ln1_b, &y->ln2_w, &y->ln2_b};
    const char *lnn[4] = {"ln_1.weight", "ln_1.bias", "ln_2.weight", "ln_2.bias"};
    char n[128];
    for (int k = 0; k < 4; k++) {
        snprintf(n, sizeof n, "h.%lld.%s", (long long)i, lnn[k]);
        if (!(*ln[k] = vec(in, n, C)))
            return ZS_ERR_FORMAT;
        snprintf(n, sizeof n, "h.%lld.%s.weight", (long long)i, names[k]);
        zs_status s = read_linear(in, n, N[k], K[k], true, ls[k]);
        if (s != ZS_OK)
            return s;
    }
    return zsi_layer_gather(y);
}

/* Embeddings, final norm and head. */
static zs_status read_outer(const in_set *in, zs_llm *m)
{
    int64_t C = m->c.width, V = m->c.vocab;
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(in->meta, "quant.wte.weight");
    zs_status s;
    if (cJSON_IsString(f)) {
        s = read_linear(in, "wte.weight", V, C, false, &m->head);
        if (s == ZS_OK && m->head.fmt == ZSI_W_I8)
            s = zs_set_error_code(ZS_ERR_FORMAT, "%s: wte.weight cannot be int8",
                                  in->path);
    } else {
        const zs_tensor *t = need(in, "wte.weight", ZS_F32, V, C);
        m->wte = t ? copy_of(t) : NULL;
        s = m->wte ? zsi_linear_build(&m->head, ZSI_W_F32, ZS_F32, m->wte, V, C, NULL, ZS_F32)
                   : ZS_ERR_FORMAT;
    }
    if (s != ZS_OK)
        return s;
    if (m->c.arch == ZS_GPT2) {
        const zs_tensor *t = need(in, "wpe.weight", ZS_F32, m->c.ctx, C);
        if (!t || !(m->wpe = copy_of(t)))
            return ZS_ERR_FORMAT;
    } else if (!(m->emb_ln_w = vec(in, "emb_ln.weight", C)) ||
               !(m->emb_ln_b = vec(in, "emb_ln.bias", C))) {
        return ZS_ERR_FORMAT;
    }
    if (!(m->lnf_w = vec(in, "ln_f.weight", C)) || !(m->lnf_b = vec(in, "ln_f.bias", C)))
        return ZS_ERR_FORMAT;
    return zsi_llm_slopes(m);
}

static zs_llm *read_quantized(in_set *in, zs_quant q)
{
    zs_llm *m = calloc(1, sizeof *m);
    zs_status s = m ? zs_gpt_config_from_metadata(in->set.metadata_json, &m->c) : ZS_ERR_NOMEM;
    if (s == ZS_OK && !(m->layers = calloc((size_t)m->c.layers, sizeof *m->layers)))
        s = ZS_ERR_NOMEM;
    if (s == ZS_OK) {
        m->dt = ZS_F32;
        m->quant = q;
        s = read_outer(in, m);
    }
    for (int64_t i = 0; s == ZS_OK && i < m->c.layers; i++)
        s = read_layer(in, m, i);
    if (s == ZS_OK)
        s = zsi_llm_wrap(m);
    if (s != ZS_OK) {
        if (s == ZS_ERR_NOMEM)
            zs_set_error_code(ZS_ERR_NOMEM, "llm: out of memory");
        else if (m && !m->layers)
            zs_set_error("%s: %s", in->path, zs_last_error());
        zs_llm_free(m);
        return NULL;
    }
    return m;
}

static zs_llm *open_float(const char *path, const zs_llm_options *o, zs_bpe **tok)
{
    zs_model_file f;
    if (zs_model_open(path, &f) != ZS_OK)
        return NULL;
    zs_llm *m = NULL;
    if (strcmp(f.kind, "gpt"))
        zs_set_error("%s holds a %s, not a GPT", path, f.kind);
    else
        m = zs_llm_from_gpt(f.model, o);
    if (m && tok) {
        *tok = f.tokenizer;
        f.tokenizer = NULL;
    }
    zs_model_close(&f);
    return m;
}

zs_llm *zs_llm_open(const char *path, const zs_llm_options *o, zs_bpe **tokenizer)
{
    char ckpt[4200], dir[4200];
    if (tokenizer)
        *tokenizer = NULL;
    zsi_ckpt_paths(path, ckpt, dir, sizeof ckpt);
    in_set in = {.path = ckpt};
    if (zs_safetensors_load(ckpt, &in.set) != ZS_OK)
        return NULL;
    in.meta = cJSON_Parse(in.set.metadata_json ? in.set.metadata_json : "{}");
    const cJSON *q = cJSON_GetObjectItemCaseSensitive(in.meta, "quant");
    zs_quant want = o ? o->quant : ZS_QUANT_NONE, have = ZS_QUANT_NONE;
    zs_llm *m = NULL;
    if (!cJSON_IsString(q) || !strcmp(q->valuestring, "none")) {
        zs_tensor_set_free(&in.set);
        cJSON_Delete(in.meta);
        return open_float(path, o, tokenizer);
    }
    if (zs_quant_parse(q->valuestring, &have) != ZS_OK || have == ZS_QUANT_NONE)
        zs_set_error_code(ZS_ERR_FORMAT, "%s: unknown quantization '%s'", ckpt,
                          q->valuestring);
    else if (want != ZS_QUANT_NONE && want != have)
        zs_set_error("%s is quantized as %s already; it cannot be loaded as %s", ckpt,
                     zs_quant_name(have), zs_quant_name(want));
    else
        m = zsi_llm_place(read_quantized(&in, have), o);
    zs_tensor_set_free(&in.set);
    cJSON_Delete(in.meta);
    char tp[4300];
    snprintf(tp, sizeof tp, "%s/tokenizer.bpe", dir);
    if (m && tokenizer && !(*tokenizer = zs_bpe_load(tp))) {
        zs_llm_free(m);
        return NULL;
    }
    if (m && tokenizer && zs_bpe_vocab_size(*tokenizer) != m->c.vocab) {
        zs_set_error("%s has %d tokens but the model has %lld", tp,
                     zs_bpe_vocab_size(*tokenizer), (long long)m->c.vocab);
        zs_bpe_free(*tokenizer);
        *tokenizer = NULL;
        zs_llm_free(m);
        return NULL;
    }
    return m;
}
