/*
 * test_serve_limits.c - the server gives back everything a request took,
 * whatever the client does, and says so when it is full (issue 30). An
 * in-process server (zs_server_start) on a pool of 16 threads, with small
 * limits (4 sequences, 4 queued, 24 connections, a read timeout of 4 s),
 * and 16 client threads per phase:
 *   - clients that vanish while waiting for a whole answer, mid-stream
 *     (after the first event), mid-body and mid-headers;
 *   - a full queue: 16 slow requests at once, the ones past max_num_seqs +
 *     max_queue answered 429 with Retry-After and an error object;
 *   - a full server: 24 idle connections open, then 16 requests answered
 *     503 (error object, Retry-After) rather than closed unanswered; at 19
 *     of 24 an answer closes its keep-alive connection;
 *   - an idle keep-alive connection is closed after the read timeout;
 *   - a mix of all of it, 16 threads at once.
 * After every phase zs_server_get_stats must come back to zero
 * (connections, HTTP requests, answers, in flight, queued, in the engine,
 * running and waiting sequences, KV blocks) within 10 s, and /health must
 * answer 200 with the same counts. The vanishing phases use a model slow
 * enough (a few ms a token) that only aborts, not finished generations,
 * bring the counts back in time; their tokens are checked too.
 */
#include <cjson/cJSON.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "serve/serve_util.h"
#include "testutil.h"

enum { CLIENTS = 16, POOL = 16, CTX = 1024, MAX_CONN = 24, SEQS = 4, QUEUE = 4 };

static int port;
static zs_server *srv;

/* ---- the counts -------------------------------------------------------------------- */

static const char *nonzero(const zs_server_stats *h)
{
    return h->connections ? "connections" : h->requests ? "requests"
         : h->answering ? "answering" : h->in_flight ? "in_flight" : h->queued ? "queued"
         : h->engine_requests ? "engine_requests" : h->running ? "running"
         : h->waiting ? "waiting" : h->kv_blocks_used ? "kv_blocks_used" : NULL;
}

static void print_stats(const char *when, const zs_server_stats *h)
{
    printf("%s: connections %lld, requests %lld, answering %lld, in flight %lld, queued "
           "%lld, engine %lld, running %lld, waiting %lld, KV blocks %lld, refused %lld\n",
           when, (long long)h->connections, (long long)h->requests, (long long)h->answering,
           (long long)h->in_flight, (long long)h->queued, (long long)h->engine_requests,
           (long long)h->running, (long long)h->waiting, (long long)h->kv_blocks_used,
           (long long)h->refused_connections);
}

/* Waits up to 10 s for every count to be 0, then asks /health, which
 * must say ok and count only itself. */
static void settle(const char *phase)
{
    zs_server_stats h;
    double t0 = zt_now();
    zs_server_get_stats(srv, &h);
    while (nonzero(&h) && zt_now() - t0 < 10) {
        usleep(10000);
        zs_server_get_stats(srv, &h);
    }
    const char *left = nonzero(&h);
    ZT_CHECK(!left, "%s: %s not back to 0 after 10 s", phase, left ? left : "");
    if (left)
        print_stats("  still held", &h);
    zt_resp r;
    int st = zt_request(port, "GET", "/health", NULL, NULL, 0, &r);
    cJSON *j = cJSON_Parse(r.body ? r.body : "");
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(j, "status");
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(j, "connections");
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(j, "in_flight");
    const cJSON *k = cJSON_GetObjectItemCaseSensitive(j, "kv_blocks_used");
    ZT_CHECK(st == 200 && cJSON_IsString(s) && !strcmp(s->valuestring, "ok") &&
             cJSON_IsNumber(c) && c->valuedouble == 1 && cJSON_IsNumber(f) &&
             f->valuedouble == 0 && cJSON_IsNumber(k) && k->valuedouble == 0,
             "%s: /health after it: %d %.300s", phase, st, r.body ? r.body : "");
    cJSON_Delete(j);
    zt_resp_free(&r);
    printf("%s: every count back to 0 in %.2f s, /health ok\n", phase, zt_now() - t0);
}

/* ---- clients -------------------------------------------------------------------------- */

typedef struct tally {
    int n200, n429, n503, other, bad_error;
    int first_other;
    char first[256];
} tally;

static void note(tally *t, int st, const zt_resp *r)
{
    t->n200 += st == 200;
    t->n429 += st == 429;
    t->n503 += st == 503;
    if (st != 200 && st != 429 && st != 503 && t->other++ == 0) {
        t->first_other = st;
        snprintf(t->first, sizeof t->first, "%.200s", r && r->body ? r->body : "");
    }
    if (st == 429 || st == 503) { /* an error object and Retry-After */
        char v[32];
        cJSON *j = cJSON_Parse(r->body ? r->body : "");
        const cJSON *e = cJSON_GetObjectItemCaseSensitive(j, "error");
        t->bad_error += !cJSON_IsString(cJSON_GetObjectItemCaseSensitive(e, "message")) ||
                        !zt_header(r, "Retry-After", v, sizeof v);
        cJSON_Delete(j);
    }
}

static const char *long_body =
    "{\"prompt\": \"In the beginning\", \"max_tokens\": 1000, \"ignore_eos\": true}";
static const char *long_stream =
    "{\"prompt\": \"In the beginning\", \"max_tokens\": 1000, \"ignore_eos\": true, "
    "\"stream\": true}";

/* Sends a whole generation request and leaves after ms milliseconds. */
static void vanish_waiting(int ms)
{
    int fd = zt_connect(port, 10);
    if (fd < 0)
        return;
    char h[256];
    int n = snprintf(h, sizeof h, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                     "application/json\r\nContent-Length: %zu\r\n\r\n", strlen(long_body));
    if (zt_send_all(fd, h, (size_t)n) && zt_send_all(fd, long_body, strlen(long_body)))
        usleep((useconds_t)ms * 1000);
    close(fd);
}

/* Opens a long stream and leaves after its first event (or its refusal). */
static void vanish_streaming(tally *t)
{
    zt_sse s;
    if (zt_sse_open(port, "/v1/completions", long_stream, NULL, &s) && s.head.status == 200) {
        char *ev = zt_sse_next(&s);
        t->other += ev == NULL;
        free(ev);
    }
    zt_sse_close(&s);
}

/* Leaves in the middle of the body (cut true) or of the headers. */
static void vanish_sending(bool in_body)
{
    int fd = zt_connect(port, 10);
    if (fd < 0)
        return;
    const char *h = in_body ? "POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                              "Content-Length: 1000\r\n\r\n{\"prompt\": \"In the"
                            : "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Le";
    zt_send_all(fd, h, strlen(h));
    usleep(20000);
    close(fd);
}

typedef struct client {
    int id, phase, rounds;
    tally t;
} client;

enum { P_WAITING, P_STREAM, P_SENDING, P_FULL_QUEUE, P_FULL_SERVER, P_MIX };

static void one(client *c, int k)
{
    uint64_t x = (uint64_t)(c->id * 7919 + k * 104729) * 0x9E3779B97F4A7C15ull;
    int what = c->phase == P_MIX ? (int)(x >> 60) % 8 : c->phase;
    zt_resp r = {0};
    int st;
    switch (what) {
    case P_WAITING:
        vanish_waiting(c->phase == P_MIX ? 20 : 200);
        break;
    case P_STREAM:
        vanish_streaming(&c->t);
        break;
    case P_SENDING:
        vanish_sending(c->id % 2 == 0);
        break;
    case P_FULL_QUEUE: {
        const char *b = "{\"prompt\": \"The light\", \"max_tokens\": 16, \"ignore_eos\": true}";
        st = zt_request(port, "POST", "/v1/completions", NULL, b, strlen(b), &r);
        note(&c->t, st, &r);
        break;
    }
    case P_FULL_SERVER:
        st = zt_request(port, "GET", "/v1/models", NULL, NULL, 0, &r);
        note(&c->t, st, &r);
        break;
    case 6: { /* a whole short stream */
        zt_sse s;
        const char *b = "{\"prompt\": \"The\", \"max_tokens\": 3, \"stream\": true}";
        bool ok = zt_sse_open(port, "/v1/completions", b, NULL, &s);
        char *rest = ok ? zt_sse_rest(&s) : NULL;
        bool done = rest && strstr(rest, "data: [DONE]");
        zt_resp h = s.head; /* its headers, the rest as the body */
        h.body = rest;
        note(&c->t, ok && s.head.status == 200 && !done ? -2 : s.head.status, &h);
        free(rest);
        zt_sse_close(&s);
        break;
    }
    default: /* malformed: 400 */
        st = zt_request(port, "POST", "/v1/completions", NULL, "{\"prompt\": ", 11, &r);
        note(&c->t, st == 400 ? 200 : st, &r);
        break;
    }
    zt_resp_free(&r);
}

static void *run_client(void *arg)
{
    client *c = arg;
    for (int k = 0; k < c->rounds; k++)
        one(c, k);
    return NULL;
}

/* CLIENTS threads, each `rounds` times the phase's client; returns the
 * tallies summed. */
static tally clients(int phase, int rounds)
{
    client c[CLIENTS];
    pthread_t th[CLIENTS];
    tally sum = {0};
    for (int i = 0; i < CLIENTS; i++) {
        c[i] = (client){.id = i, .phase = phase, .rounds = rounds};
        pthread_create(&th[i], NULL, run_client, &c[i]);
    }
    for (int i = 0; i < CLIENTS; i++) {
        pthread_join(th[i], NULL);
        sum.n200 += c[i].t.n200, sum.n429 += c[i].t.n429, sum.n503 += c[i].t.n503;
        sum.bad_error += c[i].t.bad_error;
        if (c[i].t.other && !sum.other) {
            sum.first_other = c[i].t.first_other;
            memcpy(sum.first, c[i].t.first, sizeof sum.first);
        }
        sum.other += c[i].t.other;
    }
    return sum;
}

/* ---- the phases -------------------------------------------------------------------- */

static double tokens(void) { return zt_get_metric(port, "zs_generation_tokens_total"); }

static void vanishing(void)
{
    double before = tokens();
    tally t = clients(P_WAITING, 1);
    settle("clients gone while waiting for a whole answer");
    t = clients(P_STREAM, 1);
    ZT_CHECK(t.other == 0, "%d streams gave no first event", t.other);
    settle("clients gone mid-stream");
    clients(P_SENDING, 2);
    settle("clients gone mid-body and mid-headers");
    double made = tokens() - before;
    printf("vanishing clients: %.0f tokens generated of the %d asked\n", made,
           2 * CLIENTS * 1000);
    ZT_CHECK(made >= 0 && made < CLIENTS * 1000 / 2,
             "vanished clients' requests aborted: %.0f tokens generated", made);
    zt_section("clients that vanish give back their requests and connections");
}

static void full_queue(void)
{
    tally t = clients(P_FULL_QUEUE, 1);
    printf("full queue: %d answered, %d refused 429\n", t.n200, t.n429);
    ZT_CHECK(t.other == 0 && t.bad_error == 0, "full queue: %d answers neither 200 nor 429 "
             "(first %d %s), %d refusals without an error object or Retry-After", t.other,
             t.first_other, t.first, t.bad_error);
    ZT_CHECK(t.n200 >= SEQS && t.n429 >= 1 && t.n200 + t.n429 == CLIENTS,
             "full queue: %d x 200, %d x 429 of %d", t.n200, t.n429, CLIENTS);
    settle("a full queue");
    zt_section("a full queue answers 429 and gives its slots back");
}

/* n connections that send nothing; returns how many opened. */
static int idle_open(int *fd, int n)
{
    int k = 0;
    for (; k < n && (fd[k] = zt_connect(port, 10)) >= 0; k++) {
    }
    zs_server_stats h;
    double t0 = zt_now();
    do {
        usleep(5000);
        zs_server_get_stats(srv, &h);
    } while (h.connections < k && zt_now() - t0 < 5);
    return k;
}

static void idle_close(int *fd, int n)
{
    for (int i = 0; i < n; i++)
        close(fd[i]);
}

static void full_server(void)
{
    int fd[MAX_CONN];
    zs_server_stats h0, h1;
    zs_server_get_stats(srv, &h0);
    int k = idle_open(fd, MAX_CONN);
    zt_resp r;
    int hs = zt_request(port, "GET", "/health", NULL, NULL, 0, &r);
    zt_resp_free(&r);
    tally t = clients(P_FULL_SERVER, 1);
    zs_server_get_stats(srv, &h1);
    idle_close(fd, k);
    printf("full server (%d idle connections): %d x 503, %d x 200, /health %d\n", k, t.n503,
           t.n200, hs);
    ZT_CHECK(k == MAX_CONN && t.n503 == CLIENTS && t.bad_error == 0 && t.other == 0,
             "%d idle connections of %d, then %d x 503 of %d (%d without an error object or "
             "Retry-After, %d other: first %d %s)", k, MAX_CONN, t.n503, CLIENTS, t.bad_error,
             t.other, t.first_other, t.first);
    ZT_CHECK(h1.refused_connections - h0.refused_connections == CLIENTS,
             "refused_connections counted %lld of %d",
             (long long)(h1.refused_connections - h0.refused_connections), CLIENTS);
    ZT_CHECK(hs == 200, "/health answers on a full server: %d", hs);
    settle("a full server");

    /* three quarters full: an answer closes its keep-alive connection */
    k = idle_open(fd, MAX_CONN * 3 / 4 + 1);
    int c = zt_connect(port, 10);
    const char *req = "GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n";
    bool ok = c >= 0 && zt_send_all(c, req, strlen(req)) && zt_read_resp(c, &r);
    char v[32], byte;
    bool closes = ok && zt_header(&r, "Connection", v, sizeof v) && !strcmp(v, "close") &&
                  recv(c, &byte, 1, 0) == 0;
    ZT_CHECK(ok && r.status == 200 && closes, "at %d of %d connections an answer closes "
             "its connection: %d, closed %d", k + 1, MAX_CONN, r.status, closes);
    zt_resp_free(&r);
    if (c >= 0)
        close(c);
    idle_close(fd, k);
    settle("three quarters full");
    ZT_CHECK(zt_request(port, "GET", "/v1/models", NULL, NULL, 0, &r) == 200,
             "answers again: %d", r.status);
    zt_resp_free(&r);
    zt_section("a full server answers 503 with an error object, not silence");
}

static void keep_alive(void)
{
    int c = zt_connect(port, 15);
    const char *req = "GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n";
    zt_resp r = {0};
    bool ok = c >= 0 && zt_send_all(c, req, strlen(req)) && zt_read_resp(c, &r) &&
              r.status == 200;
    zs_server_stats h;
    usleep(50000);
    zs_server_get_stats(srv, &h);
    ZT_CHECK(ok && h.connections == 1 && h.requests == 0,
             "an idle keep-alive connection: status %d, connections %lld, requests %lld",
             r.status, (long long)h.connections, (long long)h.requests);
    double t0 = zt_now();
    char byte;
    ssize_t n = c >= 0 ? recv(c, &byte, 1, 0) : -1; /* the server closes it */
    double dt = zt_now() - t0;
    printf("keep-alive: an idle connection closed by the server after %.1f s (read timeout "
           "4 s)\n", dt);
    ZT_CHECK(n == 0, "the idle keep-alive connection is closed (recv %zd)", n);
    zt_resp_free(&r);
    if (c >= 0)
        close(c);
    settle("an idle keep-alive connection");
    zt_section("idle keep-alive connections are closed after the read timeout");
}

static void mix(void)
{
    tally t = clients(P_MIX, 12);
    printf("mix: %d x 200, %d x 429, %d x 503, %d other\n", t.n200, t.n429, t.n503, t.other);
    ZT_CHECK(t.other == 0 && t.bad_error == 0, "mix: %d unexpected answers (first %d %s), %d "
             "refusals without an error object", t.other, t.first_other, t.first,
             t.bad_error);
    settle("the mix");
    zt_section("16 clients mixing all of it");
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    zs_set_num_threads(POOL);
    zs_bpe *b = zt_serve_bpe();
    zs_llm *m = b ? zt_serve_llm(b, CTX, 4, 512) : NULL; /* a few ms a token */
    ZT_CHECK(m != NULL, "a model to serve");
    zs_server_config c = {.max_connections = MAX_CONN, .max_queue = QUEUE,
                          .read_timeout_s = 4,
                          .engine = {.max_num_seqs = SEQS, .kv_blocks = 4 * CTX / 16}};
    srv = m ? zs_server_start(m, b, &c) : NULL;
    ZT_CHECK(srv != NULL, "the server starts");
    if (srv) {
        port = zs_server_port(srv);
        printf("pool of %d threads, %d clients, limits: %d sequences + %d queued, %d "
               "connections\n", zs_num_threads(), CLIENTS, SEQS, QUEUE, MAX_CONN);
        settle("start");
        vanishing();
        full_queue();
        full_server();
        keep_alive();
        mix();
    }
    zs_server_free(srv);
    zs_llm_free(m);
    zs_bpe_free(b);
    return zt_done();
}
