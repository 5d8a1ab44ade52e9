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
#include "apps/zs/flags.h"

typedef struct gen_cfg {
    const char *ckpt, *prompt;
    int64_t max_new;
    zs_sampler s;
    int threads;
} gen_cfg;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: zs generate --ckpt DIR [flags]\n"
            "  --ckpt DIR        a zs train gpt output directory (tokenizer.bpe,\n"
            "                    checkpoint.safetensors)\n"
            "  --prompt TEXT     text to continue (default: empty, from end-of-text)\n"
            "  --max-new N       tokens to generate (default 128)\n"
            "  --temperature X   0 = greedy (default 0.8)\n"
            "  --top-k N         sample among the N most likely, 0 = all (default 40)\n"
            "  --top-p X         nucleus: smallest set of mass >= X, 1 = all (default\n"
            "                    0.95)\n"
            "  --seed N          seed of the draws (default 1)\n"
            "  --threads N       worker threads\n");
}

/* Parses argv into c: FLAGS_OK, FLAGS_HELP or FLAGS_BAD (printed). */
static int parse(int argc, char **argv, gen_cfg *c)
{
    *c = (gen_cfg){NULL, "", 128, {.temperature = 0.8, .top_k = 40, .top_p = 0.95, .seed = 1}, 0};
    flag t[] = {
        FLAG_STR("--ckpt", &c->ckpt),
        FLAG_STR("--prompt", &c->prompt),
        FLAG_NUM("--max-new", &c->max_new, 1, 1e9),
        FLAG_NUM("--temperature", &c->s.temperature, 0, 1e6),
        FLAG_NUM("--top-k", &c->s.top_k, 0, 1e9),
        FLAG_NUM_ABOVE("--top-p", &c->s.top_p, 0, 1),
        FLAG_NUM("--seed", &c->s.seed, 0, FLAG_EXACT_MAX),
        FLAG_NUM("--threads", &c->threads, 1, 256),
    };
    int p = flags_parse("zs generate", t, NFLAGS(t), usage, argc, argv);
    if (p != FLAGS_OK)
        return p;
    if (!c->ckpt)
        return flags_error("zs generate", "--ckpt DIR is required (see zs "
                              "generate --help)");
    return FLAGS_OK;
}

static void emit(const zs_bpe *bpe, int32_t id)
{
    size_t len;
    const uint8_t *b = zs_bpe_token(bpe, id, &len);
    if (b)
        fwrite(b, 1, len, stdout);
    fflush(stdout);
}

/* Feeds the prompt ids[0..n) through the cached model, then samples up to
 * c->max_new tokens, printing each. 0, or 1 + message if the model or the
 * sampler fails. */
static int stream(const gen_cfg *c, zs_module *m, zs_kv_cache *kv,
                  const zs_bpe *bpe, const int32_t *ids, size_t n)
{
    int64_t *buf = malloc(n * sizeof *buf);
    if (!buf) {
        zs_set_error_code(ZS_ERR_NOMEM, "out of memory");
        return 1;
    }
    for (size_t i = 0; i < n; i++)
        buf[i] = ids[i];
    zs_tensor *x = zs_from_data(ZS_I64, 2, (int64_t[]){1, (int64_t)n}, buf);
    free(buf);
    zs_tensor *logits = zs_gpt_forward_cached(m, kv, x);
    zs_release(x);
    double t0 = app_now();
    int64_t produced = 0, next = logits ? 0 : -1; /* -1: failed, message set */
    for (int64_t t = 0; logits && t < c->max_new; t++) {
        int64_t V = logits->shape[2], last = logits->shape[1] - 1;
        const float *row = (const float *)zs_data(logits) + last * V;
        next = zs_sample(row, V, &c->s, (uint64_t)t);
        zs_release(logits);
        logits = NULL;
        if (next < 0 || next == zs_bpe_eot(bpe))
            break;
        emit(bpe, (int32_t)next);
        produced++;
        if (t + 1 == c->max_new)
            break;
        x = zs_from_data(ZS_I64, 2, (int64_t[]){1, 1}, &next);
        logits = zs_gpt_forward_cached(m, kv, x);
        zs_release(x);
        if (!logits)
            next = -1;
    }
    double dt = app_now() - t0;
    fprintf(stderr, "\n[%lld tokens in %.2f s: %.1f tokens/s]\n", (long long)produced,
            dt, dt > 0 ? (double)produced / dt : 0);
    return next < 0 ? 1 : 0;
}

int cmd_generate(int argc, char **argv)
{
    gen_cfg c;
    int p = parse(argc, argv, &c);
    if (p != FLAGS_OK)
        return flags_exit(p);
    if (c.threads)
        zs_set_num_threads(c.threads);
    zs_model_file mf;
    zs_kv_cache *kv = NULL;
    int32_t *ids = NULL;
    size_t n = 0;
    int rc = zs_model_open(c.ckpt, &mf) == ZS_OK ? 0 : 2;
    if (!rc && strcmp(mf.kind, "gpt") != 0) {
        zs_set_error("%s holds a %s, not a GPT", c.ckpt, mf.kind);
        rc = 2;
    }
    zs_bpe *bpe = mf.tokenizer;
    zs_module *m = mf.model;
    if (!rc && zs_bpe_encode(bpe, c.prompt, strlen(c.prompt), 0, &ids, &n) != ZS_OK)
        rc = 2;
    if (!rc && n == 0) { /* empty prompt: start from end-of-text */
        free(ids);
        ids = malloc(sizeof *ids);
        if (!ids) {
            zs_set_error_code(ZS_ERR_NOMEM, "out of memory");
            rc = 1;
        } else {
            ids[n++] = zs_bpe_eot(bpe) >= 0 ? zs_bpe_eot(bpe) : 0;
        }
    }
    int64_t ctx = rc ? 0 : mf.gpt.ctx; /* a GPT when rc is 0 */
    if (!rc && (int64_t)n + c.max_new > ctx) {
        zs_set_error("prompt (%zu tokens) + %lld new tokens exceed the model's "
                     "context of %lld", n, (long long)c.max_new, (long long)ctx);
        rc = 2;
    }
    if (!rc && !(kv = zs_kv_cache_new(m, 1, (int64_t)n + c.max_new)))
        rc = 1;
    if (!rc) {
        fputs(c.prompt, stdout);
        rc = stream(&c, m, kv, bpe, ids, n);
    }
    if (rc)
        fprintf(stderr, "zs generate: %s\n", zs_last_error());
    zs_kv_cache_free(kv);
    free(ids);
    zs_model_close(&mf);
    return rc;
}
