/*
 * generate.c - `zs generate --ckpt DIR --prompt TEXT`: samples from a GPT
 * checkpoint with a KV cache (each new token costs one position, not a
 * re-run of the whole sequence), streaming the text as it is produced.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "apps/zs/commands.h"
#include "apps/zs/common.h"

typedef struct gen_cfg {
    const char *ckpt, *prompt;
    int64_t max_new;
    zs_sampler s;
    int threads;
} gen_cfg;

static int parse(int argc, char **argv, gen_cfg *c)
{
    *c = (gen_cfg){NULL, "", 128, {0.8, 40, 0.95, 1}, 0};
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(f, "--help")) {
            printf("usage: zs generate --ckpt DIR [--prompt TEXT] [--max-new N] "
                   "[--temperature X] [--top-k N] [--top-p X] [--seed N] "
                   "[--threads N]\n");
            return 1;
        }
        if (!v) {
            fprintf(stderr, "zs generate: unknown flag or missing value: '%s'\n", f);
            return -1;
        }
        i++;
        char *end = NULL;
        double x = strtod(v, &end);
        bool isnum = *v && end && *end == '\0';
        if (!strcmp(f, "--ckpt")) c->ckpt = v;
        else if (!strcmp(f, "--prompt")) c->prompt = v;
        else if (!strcmp(f, "--max-new") && isnum && x >= 1) c->max_new = (int64_t)x;
        else if (!strcmp(f, "--temperature") && isnum && x >= 0) c->s.temperature = x;
        else if (!strcmp(f, "--top-k") && isnum && x >= 0) c->s.top_k = (int)x;
        else if (!strcmp(f, "--top-p") && isnum && x > 0 && x <= 1) c->s.top_p = x;
        else if (!strcmp(f, "--seed") && isnum && x >= 0) c->s.seed = (uint64_t)x;
        else if (!strcmp(f, "--threads") && isnum && x >= 1) c->threads = (int)x;
        else {
            fprintf(stderr, "zs generate: bad flag or value: %s %s\n", f, v);
            return -1;
        }
    }
    if (!c->ckpt) {
        fprintf(stderr, "zs generate: --ckpt DIR is required\n");
        return -1;
    }
    return 0;
}

/* Loads the tokenizer and the model of a training output directory. */
static int load(const char *dir, zs_bpe **bpe, zs_module **m)
{
    char path[4200], *meta = NULL;
    snprintf(path, sizeof path, "%s/tokenizer.bpe", dir);
    if (!(*bpe = zs_bpe_load(path)))
        return 2;
    snprintf(path, sizeof path, "%s/checkpoint.safetensors", dir);
    zs_tensor_set probe;
    if (zs_safetensors_load(path, &probe) != ZS_OK)
        return 2;
    meta = probe.metadata_json ? strdup(probe.metadata_json) : NULL;
    zs_tensor_set_free(&probe);
    char arch[16] = "";
    zs_gpt_config gc = {
        .vocab = zs_app_meta_int(meta, "vocab", -1),
        .ctx = zs_app_meta_int(meta, "ctx", -1),
        .layers = zs_app_meta_int(meta, "layers", -1),
        .heads = zs_app_meta_int(meta, "heads", -1),
        .width = zs_app_meta_int(meta, "width", -1),
    };
    bool is_gpt = zs_app_meta_str(meta, "arch", arch, sizeof arch);
    gc.arch = !strcmp(arch, "bloom") ? ZS_BLOOM : ZS_GPT2;
    free(meta);
    if (!is_gpt) {
        zs_set_error("%s is not a GPT checkpoint (no arch in its metadata)", path);
        return 2;
    }
    if (gc.vocab != zs_bpe_vocab_size(*bpe)) {
        zs_set_error("tokenizer has %d tokens but the checkpoint's model has %lld",
                     zs_bpe_vocab_size(*bpe), (long long)gc.vocab);
        return 2;
    }
    if (!(*m = zs_gpt_new(&gc, 0)) || zs_checkpoint_load(path, *m, NULL, NULL) != ZS_OK)
        return 2;
    return 0;
}

static void emit(const zs_bpe *bpe, int32_t id)
{
    size_t len;
    const uint8_t *b = zs_bpe_token(bpe, id, &len);
    if (b)
        fwrite(b, 1, len, stdout);
    fflush(stdout);
}

int zs_cmd_generate(int argc, char **argv)
{
    gen_cfg c;
    int p = parse(argc, argv, &c);
    if (p)
        return p > 0 ? 0 : 2;
    if (c.threads)
        zs_set_num_threads(c.threads);
    zs_bpe *bpe = NULL;
    zs_module *m = NULL;
    int32_t *ids = NULL;
    size_t n = 0;
    int rc = load(c.ckpt, &bpe, &m);
    if (!rc && zs_bpe_encode(bpe, c.prompt, strlen(c.prompt), 0, &ids, &n) != ZS_OK)
        rc = 2;
    const zs_gpt_config *g = m ? zs_gpt_config_of(m) : NULL;
    if (!rc && n == 0) { /* empty prompt: start from end-of-text */
        ids = realloc(ids, sizeof *ids);
        ids[0] = zs_bpe_eot(bpe) >= 0 ? zs_bpe_eot(bpe) : 0;
        n = 1;
    }
    if (!rc && (int64_t)n + c.max_new > g->ctx) {
        zs_set_error("prompt (%zu tokens) + %lld new tokens exceed the model's "
                     "context of %lld", n, (long long)c.max_new, (long long)g->ctx);
        rc = 2;
    }
    zs_kv_cache *kv = rc ? NULL : zs_kv_cache_new(m, 1, (int64_t)n + c.max_new);
    if (!rc && !kv)
        rc = 1;
    if (rc) {
        fprintf(stderr, "zs generate: %s\n", zs_last_error());
        goto out;
    }
    fputs(c.prompt, stdout);
    zs_tensor *logits = NULL;
    {
        int64_t *buf = malloc(n * sizeof *buf);
        for (size_t i = 0; i < n; i++)
            buf[i] = ids[i];
        zs_tensor *x = zs_from_data(ZS_I64, 2, (int64_t[]){1, (int64_t)n}, buf);
        free(buf);
        logits = zs_gpt_forward_cached(m, kv, x);
        zs_release(x);
    }
    double t0 = zs_app_now();
    int64_t produced = 0;
    for (int64_t t = 0; logits && t < c.max_new; t++) {
        int64_t V = logits->shape[2], last = logits->shape[1] - 1;
        const float *row = (const float *)zs_data(logits) + last * V;
        int64_t next = zs_sample(row, V, &c.s, (uint64_t)t);
        zs_release(logits);
        logits = NULL;
        if (next < 0 || next == zs_bpe_eot(bpe))
            break;
        emit(bpe, (int32_t)next);
        produced++;
        if (t + 1 == c.max_new)
            break;
        zs_tensor *x = zs_from_data(ZS_I64, 2, (int64_t[]){1, 1}, &next);
        logits = zs_gpt_forward_cached(m, kv, x);
        zs_release(x);
    }
    zs_release(logits);
    double dt = zs_app_now() - t0;
    fprintf(stderr, "\n[%lld tokens in %.2f s: %.1f tokens/s]\n", (long long)produced,
            dt, dt > 0 ? (double)produced / dt : 0);
out:
    zs_kv_cache_free(kv);
    free(ids);
    zs_module_free(m);
    zs_bpe_free(bpe);
    return rc;
}
