/*
 * generate.c - `zs generate --ckpt DIR --prompt TEXT | --prompts FILE`:
 * samples from a GPT checkpoint (float or quantized) through the inference
 * engine: paged KV cache, continuous batching of every prompt of the file,
 * prefix caching. One prompt streams its text as it is produced; several
 * are printed in file order when all are done. --device NAME runs the model
 * on a device (test: the test device, for checking device-neutral code).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "apps/zs/commands.h"
#include "apps/zs/common.h"
#include "apps/zs/flags.h"

typedef struct gen_cfg {
    const char *ckpt, *prompt, *prompts, *quant, *stop;
    int64_t max_new;
    zs_sampler s;
    zs_engine_config e;
    int threads, n;
    const char *kv; /* --kv-dtype: auto, bf16 or f16 */
    const char *device; /* --device: cpu (default), test, or a registered one */
} gen_cfg;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: zs generate --ckpt DIR [flags]\n"
            "  --ckpt DIR        a zs train gpt output directory (tokenizer.bpe,\n"
            "                    checkpoint.safetensors) or a checkpoint file,\n"
            "                    float or written by zs quantize\n"
            "  --prompt TEXT     text to continue (default: empty, from end-of-text)\n"
            "  --prompts FILE    one prompt per line, all served together\n"
            "  --max-new N       tokens to generate per prompt (default 128)\n"
            "  --temperature X   0 = greedy (default 0.8)\n"
            "  --top-k N         sample among the N most likely, 0 = all (default 40)\n"
            "  --top-p X         nucleus: smallest set of mass >= X, 1 = all (default\n"
            "                    0.95)\n"
            "  --min-p X         drop tokens below X times the top probability (0)\n"
            "  --repetition-penalty X, --presence-penalty X, --frequency-penalty X\n"
            "  --stop TEXT       end a sample where this text appears\n"
            "  --n N             samples per prompt (default 1)\n"
            "  --seed N          seed of the draws (default 1)\n"
            "  --quant Q         quantize a float checkpoint on load: q8_0, q4_0,\n"
            "                    q4_1, int8 (LLM.int8()); see zs quantize\n"
            "  --kv-blocks N     KV cache blocks (default: 64 contexts, at most 1 GiB)\n"
            "  --block-size N    tokens per KV block (default 16)\n"
            "  --kv-dtype T      auto (the model's) | bf16 | f16: keys and values of\n"
            "                    an f32 model in 16 bits, half the KV memory\n"
            "  --max-batched-tokens N  tokens per engine step (default 512)\n"
            "  --max-num-seqs N  sequences decoding at once (default 64)\n"
            "  --threads N       worker threads\n"
            "  --device NAME     where the model and its KV cache live and the forward\n"
            "                    pass runs: cpu (default), test (the test device: memory\n"
            "                    the host may not touch, for checking), or a registered\n"
            "                    device\n");
}

/* Parses argv into c: FLAGS_OK, FLAGS_HELP or FLAGS_BAD (printed). */
static int parse(int argc, char **argv, gen_cfg *c)
{
    *c = (gen_cfg){.prompt = "", .max_new = 128, .n = 1,
                   .s = {.temperature = 0.8, .top_k = 40, .top_p = 0.95, .seed = 1}};
    flag t[] = {
        FLAG_STR("--ckpt", &c->ckpt),
        FLAG_STR("--prompt", &c->prompt),
        FLAG_STR("--prompts", &c->prompts),
        FLAG_NUM("--max-new", &c->max_new, 1, 1e9),
        FLAG_NUM("--temperature", &c->s.temperature, 0, 1e6),
        FLAG_NUM("--top-k", &c->s.top_k, 0, 1e9),
        FLAG_NUM_ABOVE("--top-p", &c->s.top_p, 0, 1),
        FLAG_NUM("--min-p", &c->s.min_p, 0, 1),
        FLAG_NUM("--repetition-penalty", &c->s.repetition_penalty, 0, 1e6),
        FLAG_NUM("--presence-penalty", &c->s.presence_penalty, -1e6, 1e6),
        FLAG_NUM("--frequency-penalty", &c->s.frequency_penalty, -1e6, 1e6),
        FLAG_STR("--stop", &c->stop),
        FLAG_NUM("--n", &c->n, 1, 256),
        FLAG_NUM("--seed", &c->s.seed, 0, FLAG_EXACT_MAX),
        FLAG_STR("--quant", &c->quant),
        FLAG_NUM("--kv-blocks", &c->e.kv_blocks, 1, 1e9),
        FLAG_NUM("--block-size", &c->e.block_size, 1, 4096),
        FLAG_CHOICE("--kv-dtype", &c->kv, "auto|bf16|f16"),
        FLAG_NUM("--max-batched-tokens", &c->e.max_batched_tokens, 1, 1e7),
        FLAG_NUM("--max-num-seqs", &c->e.max_num_seqs, 1, 1e6),
        FLAG_NUM("--threads", &c->threads, 1, 256),
        FLAG_STR("--device", &c->device),
    };
    int p = flags_parse("zs generate", t, NFLAGS(t), usage, argc, argv);
    if (p != FLAGS_OK)
        return p;
    if (c->kv && strcmp(c->kv, "auto")) /* a choice: bf16 or f16 */
        c->e.kv_dtype = (zs_dtype)zs_dtype_parse(c->kv);
    if (!c->ckpt)
        return flags_error("zs generate", "--ckpt DIR is required (see zs "
                              "generate --help)");
    return FLAGS_OK;
}

/* What the engine produced for one prompt. */
typedef struct job {
    const char *prompt;
    int32_t *ids;
    size_t n_ids;
    char *text[256];          /* per sample, when not streaming */
    size_t len[256], cap[256];
    int64_t keep[256];
} job;

typedef struct run {
    const zs_bpe *bpe;
    job *jobs;
    bool stream;              /* one prompt, one sample: print as it comes */
    int64_t tokens;
    bool failed;
} run;

static void on_token(void *ctx, const zs_token_event *ev)
{
    run *r = ctx;
    job *j = &r->jobs[(intptr_t)ev->user];
    int k = ev->sample;
    size_t len = 0;
    const uint8_t *b = ev->token >= 0 ? zs_bpe_token(r->bpe, ev->token, &len) : NULL;
    r->tokens += ev->token >= 0;
    if (r->stream && b && ev->text_bytes == (int64_t)(j->len[0] + len)) {
        fwrite(b, 1, len, stdout); /* no stop string cut it */
        fflush(stdout);
    }
    if (b && j->len[k] + len + 1 > j->cap[k]) {
        size_t c = 2 * (j->len[k] + len) + 64;
        char *t = realloc(j->text[k], c);
        if (!t) {
            r->failed = true;
            return;
        }
        j->text[k] = t, j->cap[k] = c;
    }
    if (b) {
        memcpy(j->text[k] + j->len[k], b, len);
        j->len[k] += len;
    }
    j->keep[k] = ev->text_bytes;
}

/* The prompts: --prompts FILE's lines, or the one --prompt. */
static zs_status read_prompts(const gen_cfg *c, char **buf, job **jobs, int *n)
{
    *n = 0;
    size_t len = 0;
    if (!c->prompts) {
        *jobs = calloc(1, sizeof **jobs);
        if (!*jobs)
            return zs_set_error_code(ZS_ERR_NOMEM, "out of memory");
        (*jobs)[(*n)++].prompt = c->prompt;
        return ZS_OK;
    }
    if (!(*buf = app_read_corpus(c->prompts, &len)))
        return ZS_ERR_IO;
    int lines = 1;
    for (size_t i = 0; i < len; i++)
        lines += (*buf)[i] == '\n';
    if (!(*jobs = calloc((size_t)lines, sizeof **jobs)))
        return zs_set_error_code(ZS_ERR_NOMEM, "out of memory");
    for (char *line = strtok(*buf, "\n"); line; line = strtok(NULL, "\n"))
        if (*line)
            (*jobs)[(*n)++].prompt = line;
    if (*n == 0)
        return zs_set_error("%s holds no prompt", c->prompts);
    return ZS_OK;
}

/* Encodes and queues every prompt. */
static zs_status submit(const gen_cfg *c, zs_engine *e, const zs_bpe *bpe, job *jobs, int n)
{
    int32_t eot = zs_bpe_eot(bpe) >= 0 ? zs_bpe_eot(bpe) : 0;
    const char *stop[1] = {c->stop};
    for (int i = 0; i < n; i++) {
        job *j = &jobs[i];
        zs_status s = zs_bpe_encode(bpe, j->prompt, strlen(j->prompt), 0, &j->ids, &j->n_ids);
        if (s != ZS_OK)
            return s;
        if (j->n_ids == 0) { /* empty prompt: start from end-of-text */
            free(j->ids);
            if (!(j->ids = malloc(sizeof *j->ids)))
                return zs_set_error_code(ZS_ERR_NOMEM, "out of memory");
            j->ids[j->n_ids++] = eot;
        }
        zs_gen_request q = {.prompt = j->ids, .n_prompt = (int64_t)j->n_ids,
                            .sampling = c->s, .max_tokens = c->max_new, .n = c->n,
                            .stop = stop, .n_stop = c->stop ? 1 : 0,
                            .user = (void *)(intptr_t)i};
        if ((s = zs_engine_add(e, &q, NULL)) != ZS_OK)
            return zs_set_error("prompt %d: %s", i + 1, zs_last_error());
    }
    return ZS_OK;
}

static void print_all(const gen_cfg *c, const job *jobs, int n)
{
    for (int i = 0; i < n; i++)
        for (int k = 0; k < c->n; k++) {
            if (c->prompts || c->n > 1)
                printf("=== prompt %d%s", i + 1, c->n > 1 ? "" : " ===\n");
            if (c->n > 1)
                printf(", sample %d ===\n", k + 1);
            int64_t keep = jobs[i].keep[k] >= 0 ? jobs[i].keep[k] : (int64_t)jobs[i].len[k];
            printf("%s%.*s\n", jobs[i].prompt, (int)keep, jobs[i].text[k] ? jobs[i].text[k] : "");
        }
}

static int generate(const gen_cfg *c, zs_llm *m, const zs_bpe *bpe, job *jobs, int n)
{
    zs_engine *e = zs_engine_new(m, bpe, &c->e);
    run r = {bpe, jobs, !c->prompts && c->n == 1, 0, false};
    zs_status s = e ? submit(c, e, bpe, jobs, n) : ZS_ERR_ARG;
    if (s != ZS_OK) {
        zs_engine_free(e);
        return 2;
    }
    if (r.stream)
        fputs(jobs[0].prompt, stdout);
    double t0 = app_now();
    s = zs_engine_run(e, on_token, &r);
    double dt = app_now() - t0;
    zs_engine_stats st;
    zs_engine_get_stats(e, &st);
    zs_engine_free(e);
    if (s != ZS_OK || r.failed)
        return 1;
    if (!r.stream)
        print_all(c, jobs, n);
    fprintf(stderr, "\n[%lld tokens in %.2f s: %.1f tokens/s; %d prompts, %lld steps, "
            "%lld preemptions, prefix cache %lld of %lld blocks]\n", (long long)r.tokens,
            dt, dt > 0 ? (double)r.tokens / dt : 0, n, (long long)st.steps,
            (long long)st.preemptions, (long long)st.kv.prefix_hits,
            (long long)st.kv.prefix_queries);
    return 0;
}

int cmd_generate(int argc, char **argv)
{
    gen_cfg c;
    int p = parse(argc, argv, &c);
    if (p != FLAGS_OK)
        return flags_exit(p);
    if (c.threads)
        zs_set_num_threads(c.threads);
    zs_llm_options o = {0};
    zs_bpe *bpe = NULL;
    zs_llm *m = NULL;
    char *buf = NULL;
    job *jobs = NULL;
    int n = 0, rc = c.quant && zs_quant_parse(c.quant, &o.quant) != ZS_OK ? 2 : 0;
    if (!rc && (o.device = app_device("zs generate", c.device)) < 0)
        return 2; /* app_device printed why */
    if (!rc && o.quant == ZS_QUANT_W8A8) {
        zs_set_error("--quant w8a8 needs calibration: make the checkpoint with zs quantize");
        rc = 2;
    }
    if (!rc && !(m = zs_llm_open(c.ckpt, &o, &bpe)))
        rc = 2;
    if (!rc && read_prompts(&c, &buf, &jobs, &n) != ZS_OK)
        rc = 2;
    if (!rc)
        rc = generate(&c, m, bpe, jobs, n);
    if (rc)
        fprintf(stderr, "zs generate: %s\n", zs_last_error());
    for (int i = 0; i < n; i++) {
        free(jobs[i].ids);
        for (int k = 0; k < 256; k++)
            free(jobs[i].text[k]);
    }
    free(jobs);
    free(buf);
    zs_llm_free(m);
    zs_bpe_free(bpe);
    return rc;
}
