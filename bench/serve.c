/*
 * serve.c - bench/serve: the HTTP server (zs/serve.h) under a replayed
 * trace, continuous batching beside static batching in the same run.
 *
 * The trace (fixed seed): --requests requests with Poisson arrivals,
 * prompts of 8..64 random token ids, outputs of 16..128 tokens (uniform;
 * ignore_eos, so every request generates exactly its length), each a
 * streaming /v1/completions request with usage. The model: random weights
 * of --preset (default small: 6 layers, 384 wide, context 256) over a BPE
 * of 512 ids trained on a generated text, or --ckpt DIR; the server runs
 * in this process (zs_server_start on a loopback port), the clients are
 * threads that speak HTTP/1.0 over sockets.
 *
 * Each mode first runs the trace with every request at t = 0
 * (saturation); then at --rates requests/s (default: 25, 50 and 75% of
 * continuous batching's saturation rate), the same rates for both modes.
 * Per run: completed requests/s and output tokens/s (over the time from
 * the first arrival to the last token), time to first token and time per
 * output token (mean gap between a request's tokens), p50 and p99.
 *
 * Engine settings of both modes: --max-num-seqs (default 32) sequences,
 * 512 tokens per step, blocks of 16 for max-num-seqs contexts. The last
 * line reads `serve continuous/static tokens/s at saturation = R`.
 */
#include <arpa/inet.h>
#include <math.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "zs/zs.h"

#define MAX_RATES 8

typedef struct config {
    const char *preset, *ckpt;
    int requests, threads, rates_given;
    int64_t max_num_seqs;
    double rates[MAX_RATES];
    uint64_t seed;
} config;

/* One request of the trace and what its client measured. */
typedef struct req {
    double at;               /* arrival, seconds from the run's start */
    int n_prompt, n_out;
    int32_t prompt[64];
    int port;
    double t0;               /* the run's start (monotonic) */
    double ttft, tpot, done; /* seconds; done: from t0 */
    int tokens;
    bool ok;
} req;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t rng_next(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 11;
}

static double uniform(uint64_t *s) { return (double)(rng_next(s) >> 1) / 4503599627370496.0; }

/* ---- the model -------------------------------------------------------------------- */

static zs_bpe *make_bpe(void)
{
    static const char *const words[] = {"light", "word", "the", "beginning", "darkness",
                                        "and", "was", "with", "shone", "over", "river",
                                        "stone", "morning", "evening", "said", "let"};
    size_t cap = 1 << 18, n = 0;
    char *text = malloc(cap);
    uint64_t s = 99;
    while (text && n + 32 < cap) {
        const char *w = words[rng_next(&s) % 16];
        n += (size_t)snprintf(text + n, cap - n, "%s%s", w, rng_next(&s) % 9 ? " " : ". ");
    }
    zs_bpe *b = text ? zs_bpe_train(text, n, 512) : NULL;
    free(text);
    return b;
}

static zs_llm *make_llm(const config *c, zs_bpe **bpe)
{
    if (c->ckpt)
        return zs_llm_open(c->ckpt, NULL, bpe);
    zs_gpt_config g;
    if (zs_gpt_preset(c->preset, &g) < 0 || !(*bpe = make_bpe())) {
        zs_set_error("unknown preset %s", c->preset);
        return NULL;
    }
    g.vocab = zs_bpe_vocab_size(*bpe);
    zs_module *m = zs_gpt_new(&g, 1);
    zs_llm *l = m ? zs_llm_from_gpt(m, NULL) : NULL;
    zs_module_free(m);
    return l;
}

/* ---- the trace and its clients ------------------------------------------------------ */

static void make_trace(const config *c, int64_t vocab, int64_t ctx, req *r, double rate)
{
    uint64_t s = c->seed;
    double t = 0;
    for (int i = 0; i < c->requests; i++) {
        r[i] = (req){0};
        if (rate > 0)
            t += -log(1 - uniform(&s)) / rate;
        r[i].at = rate > 0 ? t : 0;
        r[i].n_prompt = 8 + (int)(rng_next(&s) % 57);
        r[i].n_out = 16 + (int)(rng_next(&s) % 113);
        if (r[i].n_prompt + r[i].n_out >= ctx)
            r[i].n_out = (int)ctx - r[i].n_prompt - 1;
        for (int k = 0; k < r[i].n_prompt; k++)
            r[i].prompt[k] = (int32_t)(rng_next(&s) % (uint64_t)(vocab - 1));
    }
}

static int dial(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    struct timeval tv = {120, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a)) {
        close(fd);
        return -1;
    }
    return fd;
}

/* Runs r as a streaming request: HTTP/1.0, so the events come unframed
 * until the server closes. Each event with "finish_reason":null or a
 * finish is one token (the trace's random ids decode to any bytes; a
 * token whose text is held back shows up in the next event instead). */
static void *client(void *arg)
{
    req *r = arg;
    char body[2048];
    int n = snprintf(body, sizeof body, "{\"prompt\":[");
    for (int k = 0; k < r->n_prompt; k++)
        n += snprintf(body + n, sizeof body - (size_t)n, "%s%d", k ? "," : "", r->prompt[k]);
    n += snprintf(body + n, sizeof body - (size_t)n, "],\"max_tokens\":%d,\"ignore_eos\":true,"
                  "\"temperature\":1,\"seed\":%d,\"stream\":true,\"stream_options\":"
                  "{\"include_usage\":true}}", r->n_out, r->n_prompt);
    char head[256];
    int hn = snprintf(head, sizeof head, "POST /v1/completions HTTP/1.0\r\nContent-Length: "
                      "%d\r\n\r\n", n);
    double start = now();
    int fd = dial(r->port);
    if (fd < 0 || send(fd, head, (size_t)hn, MSG_NOSIGNAL) != hn ||
        send(fd, body, (size_t)n, MSG_NOSIGNAL) != n) {
        if (fd >= 0)
            close(fd);
        return NULL;
    }
    size_t cap = 1 << 16, len = 0, scan = 0;
    char *buf = malloc(cap);
    double first = 0, last = 0;
    int events = 0, usage = -1;
    for (;;) {
        if (len + 4096 > cap)
            buf = realloc(buf, cap *= 2);
        ssize_t got = recv(fd, buf + len, cap - len - 1, 0);
        if (got <= 0)
            break;
        len += (size_t)got;
        buf[len] = 0;
        char *e;
        while ((e = strstr(buf + scan, "\n\n"))) {
            *e = 0;
            char *ev = buf + scan, *u = strstr(ev, "\"completion_tokens\":");
            if (strstr(ev, "\"choices\":[{")) {
                last = now();
                first = events++ ? first : last;
            }
            if (u)
                usage = atoi(u + 20);
            scan = (size_t)(e - buf) + 2;
        }
    }
    close(fd);
    free(buf);
    r->tokens = usage;
    r->ok = usage == r->n_out && events > 0;
    r->ttft = first - start;
    r->tpot = usage > 1 ? (last - first) / (usage - 1) : 0;
    r->done = last - r->t0;
    return NULL;
}

/* ---- runs -------------------------------------------------------------------------- */

typedef struct stats {
    double req_s, tok_s, ttft50, ttft99, tpot50, tpot99;
    int failed;
} stats;

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double pct(double *v, int n, double p)
{
    qsort(v, (size_t)n, sizeof *v, cmp);
    int i = (int)ceil(p * n) - 1;
    return n ? v[i < 0 ? 0 : i] : 0;
}

static stats replay(req *r, int n, int port)
{
    pthread_t *th = malloc((size_t)n * sizeof *th);
    double t0 = now();
    for (int i = 0; i < n; i++) {
        r[i].port = port;
        r[i].t0 = t0;
        double wait = t0 + r[i].at - now();
        if (wait > 0)
            usleep((useconds_t)(wait * 1e6));
        pthread_create(&th[i], NULL, client, &r[i]);
    }
    stats s = {0};
    double end = 0, *ttft = malloc((size_t)n * sizeof *ttft), *tpot = malloc((size_t)n * sizeof *tpot);
    int64_t tokens = 0;
    int ok = 0;
    for (int i = 0; i < n; i++) {
        pthread_join(th[i], NULL);
        if (!r[i].ok) {
            s.failed++;
            continue;
        }
        end = r[i].done > end ? r[i].done : end;
        tokens += r[i].tokens;
        ttft[ok] = r[i].ttft;
        tpot[ok++] = r[i].tpot;
    }
    s.req_s = end > 0 ? ok / end : 0;
    s.tok_s = end > 0 ? (double)tokens / end : 0;
    s.ttft50 = pct(ttft, ok, 0.5), s.ttft99 = pct(ttft, ok, 0.99);
    s.tpot50 = pct(tpot, ok, 0.5), s.tpot99 = pct(tpot, ok, 0.99);
    free(th), free(ttft), free(tpot);
    return s;
}

static void print_row(const char *mode, double rate, const stats *s)
{
    char r[32];
    if (rate > 0)
        snprintf(r, sizeof r, "%.2f", rate);
    else
        snprintf(r, sizeof r, "all at 0");
    printf("%-11s %9s %8.2f %9.0f %8.0f %8.0f %8.1f %8.1f%s\n", mode, r, s->req_s, s->tok_s,
           1e3 * s->ttft50, 1e3 * s->ttft99, 1e3 * s->tpot50, 1e3 * s->tpot99,
           s->failed ? "  (failed requests!)" : "");
    fflush(stdout);
}

static zs_server *serve(const zs_llm *m, const zs_bpe *b, const config *c, bool stat)
{
    zs_server_config sc = {.max_queue = 100000, .request_timeout_s = 3600};
    int64_t ctx = zs_llm_config(m)->ctx;
    sc.engine = (zs_engine_config){.max_num_seqs = c->max_num_seqs, .max_batched_tokens = 512,
                                   .kv_blocks = c->max_num_seqs * ((ctx + 15) / 16) + 1,
                                   .static_batching = stat};
    return zs_server_start(m, b, &sc);
}

static int parse(int argc, char **argv, config *c)
{
    *c = (config){.preset = "small", .requests = 64, .threads = 0, .max_num_seqs = 32,
                  .seed = 7};
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(f, "--help")) {
            printf("usage: serve [--preset tiny|small] [--ckpt DIR] [--requests N] "
                   "[--rates R1,R2,..] [--max-num-seqs N] [--threads N] [--seed N]\n");
            exit(0);
        }
        if (!v) {
            fprintf(stderr, "serve: %s needs a value\n", f);
            return -1;
        }
        i++;
        if (!strcmp(f, "--preset"))
            c->preset = v;
        else if (!strcmp(f, "--ckpt"))
            c->ckpt = v;
        else if (!strcmp(f, "--requests"))
            c->requests = atoi(v);
        else if (!strcmp(f, "--max-num-seqs"))
            c->max_num_seqs = atoi(v);
        else if (!strcmp(f, "--threads"))
            c->threads = atoi(v);
        else if (!strcmp(f, "--seed"))
            c->seed = (uint64_t)strtoull(v, NULL, 10);
        else if (!strcmp(f, "--rates"))
            for (char *t = strtok((char *)v, ","); t && c->rates_given < MAX_RATES;
                 t = strtok(NULL, ","))
                c->rates[c->rates_given++] = atof(t);
        else {
            fprintf(stderr, "serve: unknown flag %s\n", f);
            return -1;
        }
    }
    if (c->requests < 1 || c->max_num_seqs < 1) {
        fprintf(stderr, "serve: --requests and --max-num-seqs want positive numbers\n");
        return -1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    config c;
    if (parse(argc, argv, &c))
        return 2;
    if (c.threads)
        zs_set_num_threads(c.threads);
    signal(SIGPIPE, SIG_IGN);
    zs_bpe *bpe = NULL;
    zs_llm *m = make_llm(&c, &bpe);
    if (!m || !bpe) {
        fprintf(stderr, "serve: %s\n", zs_last_error());
        return 1;
    }
    const zs_gpt_config *g = zs_llm_config(m);
    printf("model: %lld layers, width %lld, context %lld, vocabulary %lld (%s); %d requests "
           "per run, prompts 8..64, outputs 16..128 tokens; max %lld sequences\n",
           (long long)g->layers, (long long)g->width, (long long)g->ctx, (long long)g->vocab,
           c.ckpt ? c.ckpt : "random weights", c.requests, (long long)c.max_num_seqs);
    printf("%-11s %9s %8s %9s %8s %8s %8s %8s\n", "mode", "req/s in", "req/s", "tok/s",
           "ttft50ms", "ttft99ms", "tpot50ms", "tpot99ms");
    req *r = malloc((size_t)c.requests * sizeof *r);
    double sat[2] = {0, 0};
    for (int mode = 0; mode < 2; mode++) {
        zs_server *s = serve(m, bpe, &c, mode == 1);
        if (!s) {
            fprintf(stderr, "serve: %s\n", zs_last_error());
            return 1;
        }
        const char *name = mode ? "static" : "continuous";
        make_trace(&c, g->vocab, g->ctx, r, 0);
        stats st = replay(r, c.requests, zs_server_port(s));
        print_row(name, 0, &st);
        sat[mode] = st.tok_s;
        if (mode == 0 && !c.rates_given) {
            for (int k = 0; k < 3; k++)
                c.rates[k] = st.req_s * 0.25 * (k + 1);
            c.rates_given = 3;
        }
        for (int k = 0; k < c.rates_given; k++) {
            make_trace(&c, g->vocab, g->ctx, r, c.rates[k]);
            st = replay(r, c.requests, zs_server_port(s));
            print_row(name, c.rates[k], &st);
        }
        zs_server_free(s);
    }
    printf("serve continuous/static tokens/s at saturation = %.2f\n",
           sat[1] > 0 ? sat[0] / sat[1] : 0);
    free(r);
    zs_llm_free(m);
    zs_bpe_free(bpe);
    return 0;
}
