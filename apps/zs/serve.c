/*
 * serve.c - `zs serve --ckpt DIR`: an OpenAI-compatible HTTP server
 * (zs/serve.h) on a GPT checkpoint, float or quantized. Prints the address
 * it listens on, one JSON line per request to the log (stderr unless
 * --log), and on SIGINT or SIGTERM stops accepting, lets running requests
 * finish for --grace seconds, aborts the rest and exits 0.
 *
 * The signals are blocked in every thread and taken by sigwait here, so
 * no handler runs inside the server's threads.
 */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "apps/zs/commands.h"
#include "apps/zs/flags.h"
#include "zs/zs.h"

typedef struct serve_cfg {
    const char *ckpt, *quant, *log, *model;
    zs_server_config s;
    int threads;
    const char *kv; /* --kv-dtype: auto, bf16 or f16 */
    double grace;
} serve_cfg;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: zs serve --ckpt DIR [flags]\n"
            "  --ckpt DIR        a zs train gpt output directory or a zs quantize one\n"
            "  --host ADDR       address to listen on (default 127.0.0.1)\n"
            "  --port N          TCP port, 0 = any free one (default 8080)\n"
            "  --api-key KEY     require Authorization: Bearer KEY (also from the\n"
            "                    environment variable ZS_API_KEY)\n"
            "  --model-name S    the model's name in answers (default: DIR's name)\n"
            "  --quant Q         quantize a float checkpoint on load: q8_0, q4_0, q4_1, int8\n"
            "  --kv-blocks N     KV cache blocks (default: max-num-seqs contexts, <= 1 GiB)\n"
            "  --block-size N    tokens per KV block (default 16)\n"
            "  --kv-dtype T      auto (the model's) | bf16 | f16: keys and values of\n"
            "                    an f32 model in 16 bits, half the KV memory\n"
            "  --max-num-seqs N  sequences decoding at once (default 64)\n"
            "  --max-batched-tokens N  tokens per engine step (default 512)\n"
            "  --max-queue N     requests that may wait beyond max-num-seqs; more get\n"
            "                    429 (default 256)\n"
            "  --max-body-bytes N  request body limit (default 1048576)\n"
            "  --read-timeout S  idle connection / request body time limit (default 30)\n"
            "  --request-timeout S  a generation's time limit, then 504 (default 600)\n"
            "  --grace S         on SIGINT/SIGTERM, seconds to let requests finish (5)\n"
            "  --log FILE        request log, one JSON line each (default stderr;\n"
            "                    - = stdout)\n"
            "  --threads N       worker threads of the engine\n");
}

static int parse(int argc, char **argv, serve_cfg *c)
{
    *c = (serve_cfg){.grace = 5, .s = {.host = "127.0.0.1", .port = 8080}};
    c->s.api_key = getenv("ZS_API_KEY");
    zs_engine_config *e = &c->s.engine;
    flag t[] = {
        FLAG_STR("--ckpt", &c->ckpt),
        FLAG_STR("--host", &c->s.host),
        FLAG_NUM("--port", &c->s.port, 0, 65535),
        FLAG_STR("--api-key", &c->s.api_key),
        FLAG_STR("--model-name", &c->model),
        FLAG_STR("--quant", &c->quant),
        FLAG_NUM("--kv-blocks", &e->kv_blocks, 1, 1e9),
        FLAG_NUM("--block-size", &e->block_size, 1, 4096),
        FLAG_CHOICE("--kv-dtype", &c->kv, "auto|bf16|f16"),
        FLAG_NUM("--max-num-seqs", &e->max_num_seqs, 1, 1e6),
        FLAG_NUM("--max-batched-tokens", &e->max_batched_tokens, 1, 1e7),
        FLAG_NUM("--max-queue", &c->s.max_queue, 1, 1e9),
        FLAG_NUM("--max-body-bytes", &c->s.max_body_bytes, 1024, 1e10),
        FLAG_NUM_ABOVE("--read-timeout", &c->s.read_timeout_s, 0, 86400),
        FLAG_NUM_ABOVE("--request-timeout", &c->s.request_timeout_s, 0, 1e7),
        FLAG_NUM("--grace", &c->grace, 0, 3600),
        FLAG_STR("--log", &c->log),
        FLAG_NUM("--threads", &c->threads, 1, 256),
    };
    int p = flags_parse("zs serve", t, NFLAGS(t), usage, argc, argv);
    if (p != FLAGS_OK)
        return p;
    if (c->kv && strcmp(c->kv, "auto")) /* a choice: bf16 or f16 */
        e->kv_dtype = (zs_dtype)zs_dtype_parse(c->kv);
    if (!c->ckpt)
        return flags_error("zs serve", "--ckpt DIR is required (see zs serve --help)");
    return FLAGS_OK;
}

/* The name a client sees: --model-name, or the checkpoint's last path
 * component. */
static const char *model_name(const serve_cfg *c, char *buf, size_t n)
{
    if (c->model)
        return c->model;
    size_t len = strlen(c->ckpt);
    while (len > 1 && c->ckpt[len - 1] == '/')
        len--;
    size_t start = len;
    while (start > 0 && c->ckpt[start - 1] != '/')
        start--;
    snprintf(buf, n, "%.*s", (int)(len - start), c->ckpt + start);
    return buf[0] ? buf : "zs";
}

/* Serves until SIGINT or SIGTERM. */
static int run(serve_cfg *c, zs_llm *m, zs_bpe *bpe, const sigset_t *sigs)
{
    zs_server *srv = zs_server_start(m, bpe, &c->s);
    if (!srv)
        return 1;
    const zs_gpt_config *g = zs_llm_config(m);
    printf("zs serve: listening on http://%s:%d (model %s: %lld layers, width %lld, "
           "context %lld, %s)\n", c->s.host, zs_server_port(srv), c->s.model_name,
           (long long)g->layers, (long long)g->width, (long long)g->ctx,
           zs_quant_name(zs_llm_quant(m)));
    fflush(stdout);
    int sig = 0;
    sigwait(sigs, &sig);
    fprintf(stderr, "zs serve: %s, stopping (running requests get up to %g s)\n",
            sig == SIGINT ? "SIGINT" : "SIGTERM", c->grace);
    zs_server_stop(srv, c->grace);
    zs_server_free(srv);
    fprintf(stderr, "zs serve: stopped\n");
    return 0;
}

int cmd_serve(int argc, char **argv)
{
    serve_cfg c;
    int p = parse(argc, argv, &c);
    if (p != FLAGS_OK)
        return flags_exit(p);
    if (c.threads)
        zs_set_num_threads(c.threads);
    char name[256];
    c.s.model_name = model_name(&c, name, sizeof name);
    FILE *log = stderr;
    if (c.log && !strcmp(c.log, "-"))
        log = stdout;
    else if (c.log && !(log = fopen(c.log, "a"))) {
        fprintf(stderr, "zs serve: cannot open the log %s\n", c.log);
        return 2;
    }
    c.s.log = log;
    /* before any thread starts, so that every thread inherits the mask */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);
    zs_llm_options o = {0};
    zs_bpe *bpe = NULL;
    zs_llm *m = NULL;
    int rc = c.quant && zs_quant_parse(c.quant, &o.quant) != ZS_OK ? 2 : 0;
    if (!rc && o.quant == ZS_QUANT_W8A8) {
        zs_set_error("--quant w8a8 needs calibration: make the checkpoint with zs quantize");
        rc = 2;
    }
    if (!rc && !(m = zs_llm_open(c.ckpt, &o, &bpe)))
        rc = 2;
    if (!rc && !bpe) {
        zs_set_error("%s has no tokenizer.bpe beside it", c.ckpt);
        rc = 2;
    }
    if (!rc)
        rc = run(&c, m, bpe, &sigs);
    if (rc)
        fprintf(stderr, "zs serve: %s\n", zs_last_error());
    if (log != stderr && log != stdout)
        fclose(log);
    zs_llm_free(m);
    zs_bpe_free(bpe);
    return rc;
}
