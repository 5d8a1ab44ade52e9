/*
 * model.c - zs_model_open (zs/infer.h): a trained model back from disk,
 * whatever trained it: the kind and config from the checkpoint's metadata,
 * the weights, and the tokenizer beside it for text models.
 */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "infer/internal.h"
#include "zs/infer.h"
#include "zs/io.h"

/* The "model" string of a metadata object into out[0, n). */
static zs_status model_kind(const char *path, const char *meta, char *out, size_t n)
{
    cJSON *root = meta ? cJSON_Parse(meta) : NULL;
    const cJSON *k = cJSON_GetObjectItemCaseSensitive(root, "model");
    zs_status st = ZS_OK;
    if (!cJSON_IsString(k) || strlen(k->valuestring) >= n)
        st = zs_set_error("%s: no model name in its metadata (not written by zs "
                          "train?)", path);
    else
        strcpy(out, k->valuestring);
    cJSON_Delete(root);
    return st;
}

/* A GPT and the tokenizer of its directory, which must agree on the
 * vocabulary. */
static zs_status open_gpt(const char *ckpt, const char *dir, zs_model_file *f)
{
    char path[4300];
    if (!(f->model = zs_gpt_load(ckpt, NULL)))
        return ZS_ERR_IO;
    f->gpt = *zs_gpt_config_of(f->model);
    snprintf(path, sizeof path, "%s/tokenizer.bpe", dir);
    if (!(f->tokenizer = zs_bpe_load(path)))
        return ZS_ERR_IO;
    if (zs_bpe_vocab_size(f->tokenizer) != f->gpt.vocab)
        return zs_set_error("tokenizer has %d tokens but the checkpoint's model has "
                            "%lld", zs_bpe_vocab_size(f->tokenizer),
                            (long long)f->gpt.vocab);
    return ZS_OK;
}

/* The CNNs of zs train lenet|resnet. */
static zs_status open_cnn(const char *ckpt, zs_model_file *f)
{
    if (!(f->model = zs_cnn_new(f->kind, 0)))
        return zs_set_error("%s: %s (or gpt)", ckpt, zs_last_error());
    return zs_module_load(ckpt, f->model, NULL, NULL);
}

void zsi_ckpt_paths(const char *path, char *ckpt, char *dir, size_t n)
{
    struct stat st;
    bool is_dir = stat(path, &st) == 0 && S_ISDIR(st.st_mode);
    snprintf(ckpt, n, is_dir ? "%s/checkpoint.safetensors" : "%s", path);
    snprintf(dir, n, "%s", path);
    char *slash = is_dir ? NULL : strrchr(dir, '/');
    if (slash)
        *slash = '\0';
    else if (!is_dir) /* the tokenizer sits beside the file */
        snprintf(dir, n, ".");
}

zs_status zs_model_open(const char *path, zs_model_file *out)
{
    *out = (zs_model_file){0};
    char ckpt[4200], dir[4200];
    zsi_ckpt_paths(path, ckpt, dir, sizeof ckpt);
    zs_tensor_set probe;
    zs_status s = zs_safetensors_load(ckpt, &probe);
    if (s != ZS_OK)
        return s;
    out->metadata = probe.metadata_json ? strdup(probe.metadata_json) : NULL;
    zs_tensor_set_free(&probe);
    s = model_kind(ckpt, out->metadata, out->kind, sizeof out->kind);
    if (s == ZS_OK)
        s = !strcmp(out->kind, "gpt") ? open_gpt(ckpt, dir, out) : open_cnn(ckpt, out);
    if (s != ZS_OK)
        zs_model_close(out);
    return s;
}

void zs_model_close(zs_model_file *f)
{
    zs_module_free(f->model);
    zs_bpe_free(f->tokenizer);
    free(f->metadata);
    *f = (zs_model_file){0};
}
