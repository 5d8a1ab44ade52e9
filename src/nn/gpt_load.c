/*
 * gpt_load.c - a GPT from a checkpoint file: its config from the metadata,
 * checked against the file's tensors before the model is allocated.
 *
 * A checkpoint is user input. Its metadata could claim 10^12 layers while
 * the file holds two, so the order is: read the file (its size is real),
 * parse and range-check the config, require that the file's parameter
 * tensors are exactly as many, and hold exactly as many elements, as the
 * config implies (so the model costs no more memory than the file), and
 * only then build the model and copy the weights, each checked by name,
 * shape and dtype (zsi_module_state_apply).
 */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/checked.h"
#include "nn/internal.h"

/* Limits far above any model this code can train, low enough that the
 * parameter count below cannot overflow before it is checked. */
#define MAX_VOCAB ((int64_t)1 << 24)
#define MAX_CTX ((int64_t)1 << 24)
#define MAX_LAYERS ((int64_t)1 << 16)
#define MAX_WIDTH ((int64_t)1 << 20)
#define MAX_PARAMS ((int64_t)1 << 40)

/* zs_gpt_param_count with every product checked; false on overflow. */
static bool param_count_checked(const zs_gpt_config *c, int64_t *out)
{
    int64_t C = c->width, emb = 0, pos = 0, blk = 0, n = 0;
    bool ok = zsi_mul_i64(c->vocab, C, &emb) &&
              zsi_mul_i64(c->arch == ZS_BLOOM ? 2 : c->ctx, C, &pos) &&
              zsi_mul_i64(12 * C, C, &blk) && zsi_add_i64(blk, 13 * C, &blk) &&
              zsi_mul_i64(c->layers, blk, &blk) && zsi_add_i64(emb, pos, &n) &&
              zsi_add_i64(n, blk, &n) && zsi_add_i64(n, 2 * C, &n);
    *out = n;
    return ok;
}

zs_status zs_gpt_config_check(const zs_gpt_config *c)
{
    static const char *names[] = {"vocab", "ctx", "layers", "heads", "width"};
    int64_t v[] = {c->vocab, c->ctx, c->layers, c->heads, c->width};
    int64_t hi[] = {MAX_VOCAB, MAX_CTX, MAX_LAYERS, MAX_WIDTH, MAX_WIDTH};
    for (int i = 0; i < 5; i++)
        if (v[i] < 1 || v[i] > hi[i])
            return zs_set_error("gpt config: %s = %lld, expected 1..%lld",
                                names[i], (long long)v[i], (long long)hi[i]);
    if (c->arch != ZS_GPT2 && c->arch != ZS_BLOOM)
        return zs_set_error("gpt config: unknown arch %d", (int)c->arch);
    if (c->width % c->heads)
        return zs_set_error("gpt config: width %lld is not divisible by %lld "
                            "heads", (long long)c->width, (long long)c->heads);
    int64_t n;
    if (!param_count_checked(c, &n) || n > MAX_PARAMS)
        return zs_set_error("gpt config: vocab %lld, ctx %lld, %lld layers, "
                            "width %lld: more than 2^40 parameters",
                            (long long)c->vocab, (long long)c->ctx,
                            (long long)c->layers, (long long)c->width);
    return ZS_OK;
}

/* An integer field of the metadata: a string of digits (safetensors
 * metadata values are strings) or a JSON integer. */
static zs_status meta_int(const cJSON *root, const char *key, int64_t *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    char *end = NULL;
    double x = NAN;
    if (cJSON_IsString(v) && v->valuestring[0]) {
        x = strtod(v->valuestring, &end);
        if (*end)
            x = NAN;
    } else if (cJSON_IsNumber(v)) {
        x = v->valuedouble;
    }
    if (!(x >= -9e15 && x <= 9e15) || x != (double)(int64_t)x)
        return zs_set_error("gpt checkpoint: metadata field \"%s\" is %s, "
                            "expected an integer", key, v ? "not an integer"
                                                          : "missing");
    *out = (int64_t)x;
    return ZS_OK;
}

zs_status zs_gpt_config_from_metadata(const char *metadata_json,
                                      zs_gpt_config *out)
{
    cJSON *root = metadata_json ? cJSON_Parse(metadata_json) : NULL;
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return zs_set_error("gpt checkpoint: no metadata object (not written "
                            "by zs train gpt?)");
    }
    zs_gpt_config c = {0};
    const cJSON *arch = cJSON_GetObjectItemCaseSensitive(root, "arch");
    zs_status st = ZS_OK;
    if (!cJSON_IsString(arch))
        st = zs_set_error("gpt checkpoint: metadata has no \"arch\" (not a GPT "
                          "checkpoint?)");
    else if (!strcmp(arch->valuestring, "gpt2") || !strcmp(arch->valuestring, "bloom"))
        c.arch = arch->valuestring[0] == 'b' ? ZS_BLOOM : ZS_GPT2;
    else
        st = zs_set_error("gpt checkpoint: unknown arch \"%.40s\" (known: gpt2, "
                          "bloom)", arch->valuestring);
    if (st == ZS_OK)
        st = meta_int(root, "vocab", &c.vocab);
    if (st == ZS_OK)
        st = meta_int(root, "ctx", &c.ctx);
    if (st == ZS_OK)
        st = meta_int(root, "layers", &c.layers);
    if (st == ZS_OK)
        st = meta_int(root, "heads", &c.heads);
    if (st == ZS_OK)
        st = meta_int(root, "width", &c.width);
    cJSON_Delete(root);
    if (st == ZS_OK)
        st = zs_gpt_config_check(&c);
    if (st == ZS_OK)
        *out = c;
    return st;
}

bool zs_gpt_config_to_metadata(const zs_gpt_config *c, char *buf, size_t n)
{
    int k = snprintf(buf, n, "{\"model\":\"gpt\",\"arch\":\"%s\",\"vocab\":\"%lld\","
                     "\"ctx\":\"%lld\",\"layers\":\"%lld\",\"heads\":\"%lld\","
                     "\"width\":\"%lld\"}", c->arch == ZS_BLOOM ? "bloom" : "gpt2",
                     (long long)c->vocab, (long long)c->ctx, (long long)c->layers,
                     (long long)c->heads, (long long)c->width);
    return k > 0 && (size_t)k < n;
}

/* The file's parameters (tensors not named optim.*) must be as many, and
 * hold as many elements, as the config implies. */
static zs_status check_sizes(const char *path, const zs_gpt_config *c,
                             const zs_tensor_set *set)
{
    int64_t want_n, have_n = 0, have_t = 0;
    int64_t want_t = 12 * c->layers + 3 + (c->arch == ZS_BLOOM ? 2 : 1);
    param_count_checked(c, &want_n); /* checked by zs_gpt_config_check */
    for (int i = 0; i < set->n; i++) {
        if (!strncmp(set->names[i], "optim.", 6))
            continue;
        have_t++;
        have_n += zs_numel(set->tensors[i]); /* <= file size: no overflow */
    }
    if (have_t != want_t || have_n != want_n)
        return zs_set_error_code(ZS_ERR_FORMAT, "gpt checkpoint: %s holds %lld "
                                 "parameter tensors (%lld values) but its "
                                 "metadata describes a model of %lld tensors "
                                 "(%lld values)", path, (long long)have_t,
                                 (long long)have_n, (long long)want_t,
                                 (long long)want_n);
    return ZS_OK;
}

zs_module *zs_gpt_load(const char *path, char **metadata_json)
{
    zs_tensor_set set;
    if (zs_safetensors_load(path, &set) != ZS_OK)
        return NULL;
    zs_gpt_config c;
    zs_status st = zs_gpt_config_from_metadata(set.metadata_json, &c);
    if (st == ZS_OK)
        st = check_sizes(path, &c, &set);
    zs_module *m = st == ZS_OK ? zs_gpt_new(&c, 0) : NULL;
    if (m && zsi_module_state_apply(path, &set, m, NULL, metadata_json) != ZS_OK) {
        zs_module_free(m);
        m = NULL;
    }
    zs_tensor_set_free(&set);
    return m;
}
