/*
 * model.c - descriptions of decoder-only transformers for the analyzer:
 * presets (GPT-2, BLOOM-176B, GPT-3 175B, LLaMA-65B, Llama-2-70B, and
 * Zhisuan's own GPT presets gpt-tiny and gpt-small), configs
 * set field by field from flags or from a flat JSON object, and the
 * parameter count in closed form.
 *
 * Parameter count (qd = n*d, kvd = kv*d, norm = 2h for LayerNorm, h for
 * RMSNorm, [x] = x only with biases):
 *   attention = h*qd + 2*h*kvd + qd*h       [+ qd + 2*kvd + h]
 *   mlp GeLU  = 2*h*ff                      [+ ff + h]
 *   mlp SwiGLU= 3*h*ff                      [+ 2*ff + h]
 *   per layer = attention + mlp + 2*norm
 *   total     = l*per layer + V*h (+ s*h learned positions) (+ norm after
 *               the embedding) + final norm (+ V*h untied logit layer)
 * BLOOM-176B: 176,247,271,424 parameters; GPT-2 small: 124,439,808.
 */
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <cjson/cJSON.h>

#include "core/checked.h"
#include "zs/analyze.h"

#define GPT2(nm, l, h, n)                                                     \
    {.name = nm, .n_layer = l, .d_model = h, .n_head = n, .n_kv_head = n,     \
     .d_head = (h) / (n), .d_ff = 4 * (h), .vocab = 50257, .seq_len = 1024,   \
     .mlp = ZS_MLP_GELU, .norm = ZS_NORM_LAYER, .bias = true,                 \
     .tied_embeddings = true, .learned_pos = true, .embed_norm = false}

static const zs_model_config presets[] = {
    GPT2("gpt2-small", 12, 768, 12),
    GPT2("gpt2-medium", 24, 1024, 16),
    GPT2("gpt2-large", 36, 1280, 20),
    GPT2("gpt2-xl", 48, 1600, 25),
    /* Zhisuan's GPT presets (zs_gpt_preset in src/nn/gpt.c: tiny, small)
     * with the default BPE vocabulary of zs train gpt (4096); the BLOOM
     * variant is --set learned_pos=false --set embed_norm=true. */
    {.name = "gpt-tiny", .n_layer = 2, .d_model = 64, .n_head = 4,
     .n_kv_head = 4, .d_head = 16, .d_ff = 256, .vocab = 4096, .seq_len = 128,
     .mlp = ZS_MLP_GELU, .norm = ZS_NORM_LAYER, .bias = true,
     .tied_embeddings = true, .learned_pos = true, .embed_norm = false},
    {.name = "gpt-small", .n_layer = 6, .d_model = 384, .n_head = 6,
     .n_kv_head = 6, .d_head = 64, .d_ff = 1536, .vocab = 4096, .seq_len = 256,
     .mlp = ZS_MLP_GELU, .norm = ZS_NORM_LAYER, .bias = true,
     .tied_embeddings = true, .learned_pos = true, .embed_norm = false},
    /* BLOOM: ALiBi (no position table), LayerNorm after the embedding. */
    {.name = "bloom-176b", .n_layer = 70, .d_model = 14336, .n_head = 112,
     .n_kv_head = 112, .d_head = 128, .d_ff = 4 * 14336, .vocab = 250880,
     .seq_len = 2048, .mlp = ZS_MLP_GELU, .norm = ZS_NORM_LAYER, .bias = true,
     .tied_embeddings = true, .learned_pos = false, .embed_norm = true},
    {.name = "gpt3-175b", .n_layer = 96, .d_model = 12288, .n_head = 96,
     .n_kv_head = 96, .d_head = 128, .d_ff = 4 * 12288, .vocab = 50257,
     .seq_len = 2048, .mlp = ZS_MLP_GELU, .norm = ZS_NORM_LAYER, .bias = true,
     .tied_embeddings = true, .learned_pos = true, .embed_norm = false},
    /* LLaMA: rotary positions, RMSNorm, SwiGLU, no biases, untied head. */
    {.name = "llama-65b", .n_layer = 80, .d_model = 8192, .n_head = 64,
     .n_kv_head = 64, .d_head = 128, .d_ff = 22016, .vocab = 32000,
     .seq_len = 2048, .mlp = ZS_MLP_SWIGLU, .norm = ZS_NORM_RMS, .bias = false,
     .tied_embeddings = false, .learned_pos = false, .embed_norm = false},
    /* Llama 2 70B: grouped-query attention with 8 K/V heads. */
    {.name = "llama2-70b", .n_layer = 80, .d_model = 8192, .n_head = 64,
     .n_kv_head = 8, .d_head = 128, .d_ff = 28672, .vocab = 32000,
     .seq_len = 4096, .mlp = ZS_MLP_SWIGLU, .norm = ZS_NORM_RMS, .bias = false,
     .tied_embeddings = false, .learned_pos = false, .embed_norm = false},
};
#define N_PRESETS ((int)(sizeof presets / sizeof *presets))

static const struct {
    const char *alias, *name;
} aliases[] = {
    {"gpt2", "gpt2-small"}, {"bloom", "bloom-176b"}, {"gpt3", "gpt3-175b"},
    {"llama-2-70b", "llama2-70b"}, {"llama2", "llama2-70b"},
};

int zs_model_preset_count(void) { return N_PRESETS; }

const zs_model_config *zs_model_preset_at(int i)
{
    return i >= 0 && i < N_PRESETS ? &presets[i] : NULL;
}

const zs_model_config *zs_model_preset(const char *name)
{
    if (!name)
        return NULL;
    for (size_t i = 0; i < sizeof aliases / sizeof *aliases; i++)
        if (!strcasecmp(name, aliases[i].alias))
            name = aliases[i].name;
    for (int i = 0; i < N_PRESETS; i++)
        if (!strcasecmp(name, presets[i].name))
            return &presets[i];
    char list[512] = "";
    for (int i = 0; i < N_PRESETS; i++) {
        strncat(list, presets[i].name, sizeof list - strlen(list) - 3);
        if (i + 1 < N_PRESETS)
            strcat(list, ", ");
    }
    zs_set_error("analyze: unknown model '%s' (known: %s)", name, list);
    return NULL;
}

/* ---- setting fields ---------------------------------------------------- */

typedef enum { F_INT, F_BOOL, F_MLP, F_NORM, F_NAME } field_kind;

static const struct field {
    const char *key, *sym; /* field name; the chapter's symbol or NULL */
    field_kind kind;
    size_t off;
} fields[] = {
    {"name", NULL, F_NAME, offsetof(zs_model_config, name)},
    {"n_layer", "l", F_INT, offsetof(zs_model_config, n_layer)},
    {"d_model", "h", F_INT, offsetof(zs_model_config, d_model)},
    {"n_head", "n", F_INT, offsetof(zs_model_config, n_head)},
    {"n_kv_head", NULL, F_INT, offsetof(zs_model_config, n_kv_head)},
    {"d_head", "d", F_INT, offsetof(zs_model_config, d_head)},
    {"d_ff", NULL, F_INT, offsetof(zs_model_config, d_ff)},
    {"vocab", "V", F_INT, offsetof(zs_model_config, vocab)},
    {"seq_len", "s", F_INT, offsetof(zs_model_config, seq_len)},
    {"mlp", NULL, F_MLP, offsetof(zs_model_config, mlp)},
    {"norm", NULL, F_NORM, offsetof(zs_model_config, norm)},
    {"bias", NULL, F_BOOL, offsetof(zs_model_config, bias)},
    {"tied_embeddings", NULL, F_BOOL, offsetof(zs_model_config, tied_embeddings)},
    {"learned_pos", NULL, F_BOOL, offsetof(zs_model_config, learned_pos)},
    {"embed_norm", NULL, F_BOOL, offsetof(zs_model_config, embed_norm)},
};
#define N_FIELDS ((int)(sizeof fields / sizeof *fields))

/* Field for key ('-' read as '_'), or NULL. Symbols are case-sensitive
 * (s vs S would be ambiguous), names are not. */
static const struct field *find_field(const char *key)
{
    char k[64];
    size_t n = strlen(key);
    if (n == 0 || n >= sizeof k)
        return NULL;
    for (size_t i = 0; i <= n; i++)
        k[i] = key[i] == '-' ? '_' : key[i];
    for (int i = 0; i < N_FIELDS; i++)
        if (!strcasecmp(k, fields[i].key) || (fields[i].sym && !strcmp(k, fields[i].sym)))
            return &fields[i];
    return NULL;
}

/* Largest size accepted: keeps every product below 2^53 in practice. */
#define MAX_SIZE ((int64_t)1 << 40)

static zs_status set_int(zs_model_config *c, const struct field *f, double v)
{
    if (!(v >= 1 && v <= (double)MAX_SIZE) || v != floor(v))
        return zs_set_error("analyze: '%s' must be a positive integer "
                            "(at most 2^40), got %.17g", f->key, v);
    *(int64_t *)((char *)c + f->off) = (int64_t)v;
    return ZS_OK;
}

static zs_status set_text(zs_model_config *c, const struct field *f,
                          const char *v)
{
    switch (f->kind) {
    case F_NAME:
        if (!*v || strlen(v) >= sizeof c->name)
            return zs_set_error("analyze: name must be 1..63 characters");
        strcpy(c->name, v);
        return ZS_OK;
    case F_MLP:
        if (strcasecmp(v, "gelu") && strcasecmp(v, "swiglu"))
            return zs_set_error("analyze: mlp must be gelu or swiglu, got '%s'", v);
        c->mlp = strcasecmp(v, "gelu") ? ZS_MLP_SWIGLU : ZS_MLP_GELU;
        return ZS_OK;
    case F_NORM:
        if (strcasecmp(v, "layernorm") && strcasecmp(v, "rmsnorm"))
            return zs_set_error("analyze: norm must be layernorm or rmsnorm, "
                                "got '%s'", v);
        c->norm = strcasecmp(v, "layernorm") ? ZS_NORM_RMS : ZS_NORM_LAYER;
        return ZS_OK;
    case F_BOOL:
        if (strcasecmp(v, "true") && strcasecmp(v, "false") &&
            strcmp(v, "1") && strcmp(v, "0"))
            return zs_set_error("analyze: '%s' must be true or false, got '%s'",
                                f->key, v);
        *(bool *)((char *)c + f->off) = !strcasecmp(v, "true") || !strcmp(v, "1");
        return ZS_OK;
    case F_INT: {
        char *end;
        errno = 0;
        long long x = strtoll(v, &end, 10);
        if (end == v || *end || errno)
            return zs_set_error("analyze: '%s' must be a positive integer, "
                                "got '%s'", f->key, v);
        return set_int(c, f, (double)x);
    }
    }
    return ZS_ERR_ARG;
}

static zs_status unknown_key(const char *key)
{
    return zs_set_error("analyze: unknown config key '%s' (known: name, "
                        "n_layer, d_model, n_head, n_kv_head, d_head, d_ff, "
                        "vocab, seq_len, mlp, norm, bias, tied_embeddings, "
                        "learned_pos, embed_norm, base)", key);
}

zs_status zs_model_config_set(zs_model_config *c, const char *key,
                              const char *value)
{
    if (!c || !key || !value)
        return zs_set_error("analyze: config_set: NULL argument");
    const struct field *f = find_field(key);
    if (!f)
        return unknown_key(key);
    return set_text(c, f, value);
}

/* Derived fields a batch of settings did not give are re-derived from the
 * sizes it changed: d_head from d_model and n_head, n_kv_head from n_head,
 * d_ff from d_model and mlp. `set` has bit i for fields[i]. */
static int field_index(const char *key)
{
    const struct field *f = find_field(key);
    return f ? (int)(f - fields) : -1;
}

static void rederive(zs_model_config *c, unsigned set)
{
#define SET(k) ((set >> field_index(k)) & 1u)
    if (!SET("d_head") && (SET("d_model") || SET("n_head")))
        c->d_head = 0;
    if (!SET("n_kv_head") && SET("n_head"))
        c->n_kv_head = 0;
    if (!SET("d_ff") && (SET("d_model") || SET("mlp")))
        c->d_ff = 0;
#undef SET
}

zs_status zs_model_config_set_many(zs_model_config *c, int n,
                                   const char *const *keys,
                                   const char *const *values)
{
    unsigned set = 0;
    for (int i = 0; i < n; i++) {
        zs_status st = zs_model_config_set(c, keys[i], values[i]);
        if (st != ZS_OK)
            return st;
        set |= 1u << field_index(keys[i]);
    }
    rederive(c, set);
    return zs_model_config_finish(c);
}

zs_status zs_model_config_finish(zs_model_config *c)
{
    if (!c->name[0])
        strcpy(c->name, "custom");
    const char *need[] = {"n_layer", "d_model", "n_head", "vocab", "seq_len"};
    const int64_t have[] = {c->n_layer, c->d_model, c->n_head, c->vocab,
                            c->seq_len};
    for (int i = 0; i < 5; i++)
        if (have[i] <= 0)
            return zs_set_error("analyze: config '%s' lacks %s", c->name, need[i]);
    if (c->d_head <= 0) {
        if (c->d_model % c->n_head)
            return zs_set_error("analyze: d_model %lld is not a multiple of "
                                "n_head %lld; give d_head",
                                (long long)c->d_model, (long long)c->n_head);
        c->d_head = c->d_model / c->n_head;
    }
    if (c->n_kv_head <= 0)
        c->n_kv_head = c->n_head;
    if (c->n_head % c->n_kv_head)
        return zs_set_error("analyze: n_head %lld is not a multiple of "
                            "n_kv_head %lld", (long long)c->n_head,
                            (long long)c->n_kv_head);
    if (c->d_ff <= 0)
        c->d_ff = c->mlp == ZS_MLP_GELU
                      ? 4 * c->d_model
                      : 256 * ((8 * c->d_model / 3 + 255) / 256);
    /* Each size is <= 2^40 on its own; the attention widths are products
     * that the FLOP and memory counts use as integers. */
    int64_t qd;
    if (!zsi_mul_i64(c->n_head, c->d_head, &qd) || qd > MAX_SIZE)
        return zs_set_error("analyze: n_head %lld x d_head %lld is wider than "
                            "2^40", (long long)c->n_head, (long long)c->d_head);
    return ZS_OK;
}

/* ---- JSON -------------------------------------------------------------- */

static zs_status json_error(const char *text, const char *at)
{
    int line = 1, col = 1;
    for (const char *p = text; at && p < at && *p; p++) {
        if (*p == '\n') {
            line++;
            col = 1;
        } else {
            col++;
        }
    }
    return zs_set_error_code(ZS_ERR_FORMAT, "analyze: malformed JSON at "
                             "line %d, column %d", line, col);
}

static zs_status apply_item(zs_model_config *c, const cJSON *it)
{
    const struct field *f = find_field(it->string);
    if (!f)
        return unknown_key(it->string);
    if (f->kind == F_INT) {
        if (!cJSON_IsNumber(it))
            return zs_set_error("analyze: '%s' must be a number", it->string);
        return set_int(c, f, it->valuedouble);
    }
    if (f->kind == F_BOOL) {
        if (!cJSON_IsBool(it))
            return zs_set_error("analyze: '%s' must be true or false", it->string);
        *(bool *)((char *)c + f->off) = cJSON_IsTrue(it);
        return ZS_OK;
    }
    if (!cJSON_IsString(it))
        return zs_set_error("analyze: '%s' must be a string", it->string);
    return set_text(c, f, it->valuestring);
}

zs_status zs_model_config_parse_json(const char *text, zs_model_config *out)
{
    if (!text || !out)
        return zs_set_error("analyze: parse_json: NULL argument");
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithOpts(text, &end, 1);
    if (!root)
        return json_error(text, cJSON_GetErrorPtr());
    zs_status st = ZS_OK;
    zs_model_config c;
    memset(&c, 0, sizeof c);
    if (!cJSON_IsObject(root)) {
        st = zs_set_error_code(ZS_ERR_FORMAT, "analyze: config must be a "
                               "JSON object {\"key\": value, ...}");
        goto done;
    }
    const cJSON *base = cJSON_GetObjectItemCaseSensitive(root, "base");
    if (base) {
        const zs_model_config *p = cJSON_IsString(base)
                                       ? zs_model_preset(base->valuestring)
                                       : NULL;
        if (!p) {
            if (!cJSON_IsString(base))
                zs_set_error("analyze: 'base' must be a preset name string");
            st = ZS_ERR_ARG;
            goto done;
        }
        c = *p;
    }
    unsigned set = 0;
    for (const cJSON *it = root->child; it && st == ZS_OK; it = it->next) {
        if (!strcmp(it->string, "base"))
            continue;
        if (cJSON_IsObject(it) || cJSON_IsArray(it))
            st = zs_set_error("analyze: '%s': nested values are not allowed "
                              "(flat object of numbers)", it->string);
        else
            st = apply_item(&c, it);
        if (st == ZS_OK)
            set |= 1u << field_index(it->string);
    }
    if (st == ZS_OK) {
        rederive(&c, set);
        st = zs_model_config_finish(&c);
    }
    if (st == ZS_OK)
        *out = c;
done:
    cJSON_Delete(root);
    return st;
}

zs_status zs_model_config_load_json(const char *path, zs_model_config *out)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return zs_set_error_code(ZS_ERR_IO, "analyze: cannot open config "
                                 "'%s': %s", path, strerror(errno));
    char *buf = NULL;
    size_t n = 0, cap = 0;
    zs_status st = ZS_OK;
    for (;;) {
        if (n + 4096 + 1 > cap) {
            cap = cap ? 2 * cap : 8192;
            if (cap > (1u << 24)) {
                st = zs_set_error_code(ZS_ERR_FORMAT, "analyze: config '%s' "
                                       "is larger than 16 MB", path);
                break;
            }
            char *nb = realloc(buf, cap);
            if (!nb) {
                st = zs_set_error_code(ZS_ERR_NOMEM, "analyze: out of memory");
                break;
            }
            buf = nb;
        }
        size_t got = fread(buf + n, 1, cap - n - 1, f);
        n += got;
        if (got == 0)
            break;
    }
    if (st == ZS_OK && ferror(f))
        st = zs_set_error_code(ZS_ERR_IO, "analyze: reading '%s' failed", path);
    fclose(f);
    if (st == ZS_OK) {
        buf[n] = 0;
        if (strlen(buf) != n)
            st = zs_set_error_code(ZS_ERR_FORMAT, "analyze: config '%s' "
                                   "contains a NUL byte", path);
        else
            st = zs_model_config_parse_json(buf, out);
    }
    free(buf);
    if (st != ZS_OK && st != ZS_ERR_IO && st != ZS_ERR_NOMEM) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", zs_last_error());
        zs_set_error_code(st, "%s (in '%s')", msg, path);
    }
    return st;
}

/* ---- parameters -------------------------------------------------------- */

void zs_model_params(const zs_model_config *c, zs_param_count *o)
{
    double h = (double)c->d_model, V = (double)c->vocab, ff = (double)c->d_ff;
    double qd = (double)(c->n_head * c->d_head);
    double kvd = (double)(c->n_kv_head * c->d_head);
    double bias = c->bias ? 1 : 0;
    double norm = c->norm == ZS_NORM_LAYER ? 2 * h : h;
    memset(o, 0, sizeof *o);
    o->embedding = V * h;
    o->position = c->learned_pos ? (double)c->seq_len * h : 0;
    o->embed_norm = c->embed_norm ? norm : 0;
    o->attention = h * qd + 2 * h * kvd + qd * h + bias * (qd + 2 * kvd + h);
    if (c->mlp == ZS_MLP_GELU)
        o->mlp = 2 * h * ff + bias * (ff + h);
    else
        o->mlp = 3 * h * ff + bias * (2 * ff + h);
    o->norms = 2 * norm;
    o->per_layer = o->attention + o->mlp + o->norms;
    o->final_norm = norm;
    o->logit = c->tied_embeddings ? 0 : V * h;
    o->total = (double)c->n_layer * o->per_layer + o->embedding + o->position +
               o->embed_norm + o->final_norm + o->logit;
}
