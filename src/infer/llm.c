/*
 * llm.c - zs_llm (zs/infer.h): a GPT's weights copied into inference
 * layout and quantized as asked, including SmoothQuant's calibration.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "infer/internal.h"
#include "zs/ops.h"
#include "zs/attention.h"

static const char *const quant_names[] = {"none", "q8_0", "q4_0", "q4_1", "int8", "w8a8"};

const char *zs_quant_name(zs_quant q)
{
    return (unsigned)q < sizeof quant_names / sizeof *quant_names ? quant_names[q] : "?";
}

zs_status zs_quant_parse(const char *s, zs_quant *q)
{
    static const struct {
        const char *name;
        zs_quant q;
    } alias[] = {{"f32", ZS_QUANT_NONE}, {"q8", ZS_QUANT_Q8_0}, {"q4", ZS_QUANT_Q4_0},
                 {"llm.int8", ZS_QUANT_INT8}, {"smoothquant", ZS_QUANT_W8A8}};
    for (int i = 0; s && i < (int)(sizeof quant_names / sizeof *quant_names); i++)
        if (!strcasecmp(s, quant_names[i])) {
            *q = (zs_quant)i;
            return ZS_OK;
        }
    for (size_t i = 0; s && i < sizeof alias / sizeof *alias; i++)
        if (!strcasecmp(s, alias[i].name)) {
            *q = alias[i].q;
            return ZS_OK;
        }
    return zs_set_error("unknown quantization '%s' (known: none, q8_0, q4_0, q4_1, "
                        "int8, w8a8; q8, q4, llm.int8, smoothquant)", s ? s : "(null)");
}

const zs_gpt_config *zs_llm_config(const zs_llm *m) { return &m->c; }
zs_quant zs_llm_quant(const zs_llm *m) { return m->quant; }
zs_dtype zs_llm_dtype(const zs_llm *m) { return m->dt; }

int64_t zs_llm_weight_bytes(const zs_llm *m)
{
    int64_t n = zsi_linear_bytes(&m->head);
    for (int64_t l = 0; l < m->c.layers; l++) {
        const zsi_layer *y = &m->layers[l];
        n += zsi_linear_bytes(&y->qkv) + zsi_linear_bytes(&y->proj) +
             zsi_linear_bytes(&y->fc) + zsi_linear_bytes(&y->fc2);
    }
    return n;
}

void zs_llm_free(zs_llm *m)
{
    if (!m)
        return;
    for (int64_t l = 0; m->layers && l < m->c.layers; l++) {
        zsi_layer *y = &m->layers[l];
        zs_release(y->tln1_w), zs_release(y->tln1_b), zs_release(y->tln2_w);
        zs_release(y->tln2_b), zs_release(y->tarena);
        free(y->ln1_w), free(y->ln1_b), free(y->ln2_w), free(y->ln2_b);
        zsi_linear_free(&y->qkv), zsi_linear_free(&y->proj);
        zsi_linear_free(&y->fc), zsi_linear_free(&y->fc2);
        zs_free(y->arena);
    }
    free(m->layers);
    zs_release(m->twte), zs_release(m->twpe), zs_release(m->temb_ln_w);
    zs_release(m->temb_ln_b), zs_release(m->tlnf_w), zs_release(m->tlnf_b);
    zs_release(m->tslopes);
    zsi_linear_free(&m->head);
    free(m->wte), free(m->wpe), free(m->emb_ln_w), free(m->emb_ln_b);
    free(m->lnf_w), free(m->lnf_b), free(m->slopes), free(m->slopes64);
    free(m);
}

/* ---- building from a GPT module ----------------------------------------- */

typedef struct params {
    int n;
    zs_tensor **t;
    char **names;
    zs_dtype dt;
} params;

/* The named parameter as a malloc'd contiguous buffer in p->dt, or NULL +
 * message. */
static void *take(const params *p, const char *name, int64_t numel)
{
    for (int i = 0; i < p->n; i++) {
        if (strcmp(p->names[i], name))
            continue;
        if (zs_numel(p->t[i]) != numel) {
            zs_set_error("llm: %s has %lld elements, expected %lld", name,
                         (long long)zs_numel(p->t[i]), (long long)numel);
            return NULL;
        }
        zs_tensor *c = zs_to_dtype(p->t[i], p->dt);
        zs_tensor *d = c ? zs_contiguous(c) : NULL;
        size_t nb = (size_t)numel * zs_dtype_size(p->dt);
        void *out = d ? malloc(nb ? nb : 1) : NULL;
        if (out)
            memcpy(out, zs_data(d), nb);
        else
            zs_set_error_code(ZS_ERR_NOMEM, "llm: out of memory");
        zs_release(c);
        zs_release(d);
        return out;
    }
    zs_set_error("llm: the GPT has no parameter %s", name);
    return NULL;
}

static zsi_wfmt wfmt_of(zs_quant q, zs_dtype dt)
{
    switch (q) {
    case ZS_QUANT_Q8_0: return ZSI_W_Q8_0;
    case ZS_QUANT_Q4_0: return ZSI_W_Q4_0;
    case ZS_QUANT_Q4_1: return ZSI_W_Q4_1;
    case ZS_QUANT_INT8:
    case ZS_QUANT_W8A8: return ZSI_W_I8;
    default: return dt == ZS_F64 ? ZSI_W_F64 : ZSI_W_F32;
    }
}

/* Multiplies column k of W [N, K] by s[k] = amax_x[k]^alpha /
 * amax_w[k]^(1 - alpha) and returns 1 / s (SmoothQuant), malloc'd. */
static float *smooth(float *W, int64_t N, int64_t K, const float *amax_x, double alpha)
{
    float *inv = malloc((size_t)K * sizeof *inv);
    if (!inv)
        return NULL;
    for (int64_t k = 0; k < K; k++) {
        double aw = 0;
        for (int64_t n = 0; n < N; n++)
            aw = fmax(aw, fabs(W[n * K + k]));
        double s = amax_x[k] > 0 && aw > 0 ? pow(amax_x[k], alpha) / pow(aw, 1 - alpha) : 1;
        s = s > 1e-5 && s < 1e5 ? s : 1;
        for (int64_t n = 0; n < N; n++)
            W[n * K + k] = (float)(W[n * K + k] * s);
        inv[k] = (float)(1 / s);
    }
    return inv;
}

/* One linear "h.<l>.<name>" of the GPT into out; which (0..3) picks the
 * calibration statistics for SmoothQuant. */
static zs_status build_linear(zs_llm *m, const params *p, int64_t l, const char *name,
                              int which, int64_t N, int64_t K, const zsi_calib *cal,
                              zsi_linear *out)
{
    char wn[96], bn[96];
    snprintf(wn, sizeof wn, "h.%lld.%s.weight", (long long)l, name);
    snprintf(bn, sizeof bn, "h.%lld.%s.bias", (long long)l, name);
    void *W = take(p, wn, N * K), *b = W ? take(p, bn, N) : NULL;
    float *inv = NULL;
    zs_status s = W && b ? ZS_OK : ZS_ERR_ARG;
    if (s == ZS_OK && m->quant == ZS_QUANT_W8A8 &&
        !(inv = smooth(W, N, K, cal->amax[which] + l * K, m->smooth_alpha)))
        s = zs_set_error_code(ZS_ERR_NOMEM, "llm: out of memory");
    if (s == ZS_OK)
        s = zsi_linear_build(out, wfmt_of(m->quant, m->dt), p->dt, W, N, K, b, m->dt);
    if (s == ZS_OK && out->fmt == ZSI_W_I8) {
        out->smooth = inv;
        inv = NULL;
        out->threshold = m->quant == ZS_QUANT_INT8 ? m->int8_threshold : 0;
    }
    free(inv);
    free(W);
    free(b);
    return s;
}

static zs_status build_layer(zs_llm *m, const params *p, int64_t l, const zsi_calib *cal)
{
    int64_t C = m->c.width;
    zsi_layer *y = &m->layers[l];
    char n[4][64];
    const char *ln[4] = {"ln_1.weight", "ln_1.bias", "ln_2.weight", "ln_2.bias"};
    void **dst[4] = {&y->ln1_w, &y->ln1_b, &y->ln2_w, &y->ln2_b};
    for (int i = 0; i < 4; i++) {
        snprintf(n[i], sizeof n[i], "h.%lld.%s", (long long)l, ln[i]);
        if (!(*dst[i] = take(p, n[i], C)))
            return ZS_ERR_ARG;
    }
    zs_status s = build_linear(m, p, l, "attn.c_attn", 0, 3 * C, C, cal, &y->qkv);
    s = s ? s : build_linear(m, p, l, "attn.c_proj", 1, C, C, cal, &y->proj);
    s = s ? s : build_linear(m, p, l, "mlp.c_fc", 2, 4 * C, C, cal, &y->fc);
    s = s ? s : build_linear(m, p, l, "mlp.c_proj", 3, C, 4 * C, cal, &y->fc2);
    return s ? s : zsi_layer_gather(y);
}

/* Embeddings, final norm, logits head and ALiBi slopes. */
static zs_status build_outer(zs_llm *m, const params *p)
{
    int64_t C = m->c.width, V = m->c.vocab;
    void *wte = take(p, "wte.weight", V * C);
    if (!wte)
        return ZS_ERR_ARG;
    zsi_wfmt hf = wfmt_of(m->quant, m->dt);
    if (hf == ZSI_W_Q4_0 || hf == ZSI_W_Q4_1)
        hf = ZSI_W_Q8_0; /* the logits are sensitive: llama.cpp keeps them wider */
    if (hf == ZSI_W_I8)
        hf = ZSI_W_F32; /* LLM.int8() and SmoothQuant keep lm_head in float */
    zs_status s = zsi_linear_build(&m->head, hf, p->dt, wte, V, C, NULL, m->dt);
    if (hf == ZSI_W_F32 || hf == ZSI_W_F64)
        m->wte = wte; /* embedding rows; quantized heads give theirs */
    else
        free(wte);
    if (s != ZS_OK)
        return s;
    if (m->c.arch == ZS_GPT2 && !(m->wpe = take(p, "wpe.weight", m->c.ctx * C)))
        return ZS_ERR_ARG;
    if (m->c.arch == ZS_BLOOM && (!(m->emb_ln_w = take(p, "emb_ln.weight", C)) ||
                                  !(m->emb_ln_b = take(p, "emb_ln.bias", C))))
        return ZS_ERR_ARG;
    if (!(m->lnf_w = take(p, "ln_f.weight", C)) || !(m->lnf_b = take(p, "ln_f.bias", C)))
        return ZS_ERR_ARG;
    return zsi_llm_slopes(m);
}

zs_status zsi_llm_slopes(zs_llm *m)
{
    if (m->c.arch != ZS_BLOOM)
        return ZS_OK;
    int64_t H = m->c.heads;
    m->slopes = malloc((size_t)H * sizeof *m->slopes);
    m->slopes64 = malloc((size_t)H * sizeof *m->slopes64);
    if (!m->slopes || !m->slopes64)
        return zs_set_error_code(ZS_ERR_NOMEM, "llm: out of memory");
    zs_alibi_slopes(H, m->slopes64);
    for (int64_t h = 0; h < H; h++)
        m->slopes[h] = (float)m->slopes64[h];
    return ZS_OK;
}

/* The largest |x| of every input channel of every linear, over the
 * calibration tokens run through the float model f in ctx-long pieces. */
static zs_status calibrate(zs_llm *f, const int32_t *tok, int64_t n, zsi_calib *cal)
{
    int64_t C = f->c.width, L = f->c.layers, K[4] = {C, C, C, 4 * C};
    for (int i = 0; i < 4; i++)
        if (!(cal->amax[i] = calloc((size_t)(L * K[i]), sizeof(float))))
            return zs_set_error_code(ZS_ERR_NOMEM, "llm: out of memory");
    int64_t T = f->c.ctx < 256 ? f->c.ctx : 256;
    float *logits = malloc((size_t)(T * f->c.vocab) * sizeof *logits);
    if (!logits)
        return zs_set_error_code(ZS_ERR_NOMEM, "llm: out of memory");
    f->calib = cal;
    zs_status s = ZS_OK;
    for (int64_t i = 0; s == ZS_OK && i < n; i += T)
        s = zs_llm_logits(f, tok + i, n - i < T ? n - i : T, logits);
    f->calib = NULL;
    free(logits);
    return s;
}

static void calib_free(zsi_calib *cal)
{
    for (int i = 0; i < 4; i++)
        free(cal->amax[i]);
}

static zs_llm *build(const zs_gpt_config *c, const params *p, const zs_llm_options *o,
                     const zsi_calib *cal)
{
    zs_llm *m = calloc(1, sizeof *m);
    if (m)
        m->layers = calloc((size_t)c->layers, sizeof *m->layers);
    if (!m || !m->layers) {
        zs_llm_free(m);
        zs_set_error_code(ZS_ERR_NOMEM, "llm: out of memory");
        return NULL;
    }
    m->c = *c;
    m->dt = p->dt;
    m->quant = o ? o->quant : ZS_QUANT_NONE;
    m->int8_threshold = o && o->int8_threshold > 0 ? o->int8_threshold : 6.0f;
    m->smooth_alpha = o && o->smooth_alpha > 0 ? o->smooth_alpha : 0.5;
    zs_status s = build_outer(m, p);
    for (int64_t l = 0; s == ZS_OK && l < c->layers; l++)
        s = build_layer(m, p, l, cal);
    if (s == ZS_OK)
        s = zsi_llm_wrap(m);
    if (s != ZS_OK) {
        zs_llm_free(m);
        return NULL;
    }
    return m;
}

zs_llm *zs_llm_from_gpt(zs_module *gpt, const zs_llm_options *o)
{
    const zs_gpt_config *c = zs_gpt_config_of(gpt);
    if (!c) {
        zs_set_error("llm: the module is not a GPT");
        return NULL;
    }
    zs_quant q = o ? o->quant : ZS_QUANT_NONE;
    if ((unsigned)q > ZS_QUANT_W8A8) {
        zs_set_error("llm: unknown quantization %d", (int)q);
        return NULL;
    }
    if (q == ZS_QUANT_W8A8 && (!o->calib || o->n_calib < 1)) {
        zs_set_error("llm: SmoothQuant (w8a8) needs calibration tokens");
        return NULL;
    }
    params p = {0};
    p.n = zs_module_parameters(gpt, &p.t, &p.names);
    if (p.n < 0)
        return NULL;
    /* float64 models compute in float64 unless quantized; the rest in f32 */
    p.dt = p.n > 0 && p.t[0]->dtype == ZS_F64 && q == ZS_QUANT_NONE ? ZS_F64 : ZS_F32;
    zs_llm *m = NULL;
    zsi_calib cal = {0};
    if (q == ZS_QUANT_W8A8) {
        zs_llm *f = build(c, &p, NULL, NULL);
        zs_status s = f ? calibrate(f, o->calib, o->n_calib, &cal) : ZS_ERR_ARG;
        zs_llm_free(f);
        m = s == ZS_OK ? build(c, &p, o, &cal) : NULL;
    } else {
        m = build(c, &p, o, NULL);
    }
    calib_free(&cal);
    zs_names_free(p.n, p.t, p.names);
    return zsi_llm_place(m, o);
}

zs_llm *zsi_llm_place(zs_llm *m, const zs_llm_options *o)
{
    if (m && o && o->device != ZS_CPU && zsi_llm_move(m, o->device) != ZS_OK) {
        zs_llm_free(m);
        return NULL;
    }
    return m;
}
