/*
 * test_serve_errors.c - every status of the server (zs/serve.h) over
 * loopback with plain sockets, on an in-process server (zs_server_start)
 * of a random-weight GPT:
 *   - 400: malformed JSON, an empty body, wrong types, out-of-range values
 *     (temperature -1, top_p 2, n 0, max_tokens -5, 2.5, 1e20, 1e400, the
 *     NaN literal), invalid UTF-8, 10^5 nested '[', bad chat messages, bad
 *     prompt lists (empty, strings mixed with ids or arrays, members that
 *     are neither, more than 128 choices in prompts times n), and
 *     what the engine refuses (a prompt longer than the context, also when
 *     streaming; an id outside the vocabulary), each an OpenAI error object;
 *   - 401 without or with a wrong key, 200 with "Bearer KEY", /health open;
 *   - 404 unknown path or model, 405 wrong method (with Allow), 413 a body
 *     over the limit, by Content-Length (answered before the body) and
 *     chunked;
 *   - 429 + Retry-After when max_num_seqs + max_queue requests are in
 *     flight; clients that disconnect mid-stream or while waiting for a
 *     whole answer have their requests aborted: /metrics shows running 0
 *     and KV blocks used 0 within a second, and far fewer tokens generated
 *     than asked;
 *   - requests waiting for a slot longer than the read timeout keep their
 *     connections (streams send SSE comments meanwhile);
 *   - 504 past request_timeout_s; zs_server_stop ends a running stream with
 *     an error event and [DONE], answers a waiting request 503, and
 *     returns within its grace period plus a step.
 */
#include <cjson/cJSON.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "serve/serve_util.h"
#include "testutil.h"

#define CTX 1024

static const zs_llm *fast, *slow; /* slow: a few ms per token, for timing */
static const zs_bpe *bpe;
static int n400;                  /* 400s asked for */

static zs_server *start_on(const zs_llm *m, zs_server_config c)
{
    c.port = 0;
    c.engine.kv_blocks = 4 * CTX / 16;
    zs_server *s = zs_server_start(m, bpe, &c);
    ZT_CHECK(s != NULL, "the server starts");
    return s;
}

static zs_server *start(zs_server_config c) { return start_on(fast, c); }

/* True when body is {"error": {"message": STRING containing needle,
 * "type": STRING, ...}}. */
static bool error_object(const char *body, const char *needle)
{
    cJSON *j = cJSON_Parse(body ? body : "");
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(j, "error");
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(e, "message");
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(e, "type");
    bool ok = cJSON_IsString(m) && cJSON_IsString(t) && strstr(m->valuestring, needle) &&
              cJSON_HasObjectItem(e, "param") && cJSON_HasObjectItem(e, "code");
    cJSON_Delete(j);
    return ok;
}

/* POST path with body: expect status and an error object naming needle. */
static void expect(int port, const char *path, const char *body, int status,
                   const char *needle)
{
    zt_resp r;
    n400 += status == 400;
    int st = zt_request(port, "POST", path, NULL, body, strlen(body), &r);
    ZT_CHECK(st == status && error_object(r.body, needle),
             "%s %.60s: expected %d naming '%s', got %d %.300s", path, body, status, needle,
             st, r.body ? r.body : "");
    zt_resp_free(&r);
}

static void bad(int port, const char *body, const char *needle)
{
    expect(port, "/v1/completions", body, 400, needle);
}

static char *repeat(const char *piece, int times, const char *pre, const char *post)
{
    size_t n = strlen(piece) * (size_t)times + strlen(pre) + strlen(post) + 1;
    char *s = malloc(n);
    strcpy(s, pre);
    for (int i = 0; i < times; i++)
        strcat(s, piece);
    strcat(s, post);
    return s;
}

static void test_400(int port)
{
    bad(port, "{", "not valid JSON");
    bad(port, "", "no body");
    bad(port, "[1, 2]", "not an object");
    bad(port, "{\"prompt\": \"x\"} {}", "more after");
    bad(port, "{\"prompt\": 5}", "prompt");
    bad(port, "{}", "prompt: required");
    bad(port, "{\"prompt\": \"x\", \"temperature\": \"hot\"}", "temperature");
    bad(port, "{\"prompt\": \"x\", \"stream\": \"yes\"}", "stream");
    bad(port, "{\"prompt\": \"x\", \"stop\": 5}", "stop");
    bad(port, "{\"prompt\": \"x\", \"stop\": [\"\"]}", "stop");
    bad(port, "{\"prompt\": \"x\", \"stop\": [\"a\",\"b\",\"c\",\"d\",\"e\"]}", "stop");
    bad(port, "{\"prompt\": \"x\", \"n\": \"2\"}", "n:");
    bad(port, "{\"prompt\": \"x\", \"seed\": \"7\"}", "seed");
    bad(port, "{\"prompt\": \"x\", \"model\": 3}", "model");
    bad(port, "{\"prompt\": \"x\", \"temperature\": -1}", "temperature");
    bad(port, "{\"prompt\": \"x\", \"top_p\": 2}", "top_p");
    bad(port, "{\"prompt\": \"x\", \"top_p\": 0}", "top_p");
    bad(port, "{\"prompt\": \"x\", \"n\": 0}", "n:");
    bad(port, "{\"prompt\": \"x\", \"n\": 1000}", "n:");
    bad(port, "{\"prompt\": \"x\", \"max_tokens\": -5}", "max_tokens");
    bad(port, "{\"prompt\": \"x\", \"max_tokens\": 2.5}", "max_tokens");
    bad(port, "{\"prompt\": \"x\", \"max_tokens\": 1e20}", "max_tokens");
    bad(port, "{\"prompt\": \"x\", \"temperature\": 1e400}", "temperature");
    bad(port, "{\"prompt\": \"x\", \"seed\": 1e30}", "seed");
    bad(port, "{\"prompt\": \"x\", \"temperature\": NaN}", "not valid JSON");
    bad(port, "{\"prompt\": \"x\", \"logprobs\": 6}", "logprobs");
    bad(port, "{\"prompt\": \"x\", \"presence_penalty\": 3}", "presence_penalty");
    bad(port, "{\"prompt\": \"x\", \"best_of\": 3}", "best_of");
    /* lists of prompts: empty, mixed, malformed members, too many choices */
    bad(port, "{\"prompt\": []}", "empty array");
    bad(port, "{\"prompt\": [\"a\", 1]}", "not a mix");
    bad(port, "{\"prompt\": [1, \"a\"]}", "not a mix");
    bad(port, "{\"prompt\": [[1, 2], \"a\"]}", "not a mix");
    bad(port, "{\"prompt\": [\"a\", [1, 2]]}", "not a mix");
    bad(port, "{\"prompt\": [{\"text\": \"a\"}]}", "prompt[0]");
    bad(port, "{\"prompt\": [null]}", "prompt[0]");
    bad(port, "{\"prompt\": [[1, 2], []]}", "prompt[1]: an empty array");
    bad(port, "{\"prompt\": [[1, 2], [3, 2.5]]}", "prompt[1]: token 1");
    bad(port, "{\"prompt\": [[1, [2]]]}", "prompt[0]: token 1");
    bad(port, "{\"prompt\": [\"a\", \"b\", \"c\"], \"n\": 43}", "at most 128");
    char *many = repeat("\"a\",", 128, "{\"prompt\": [", "\"b\"]}");
    bad(port, many, "129 prompts");
    free(many);
    bad(port, "{\"prompt\": [1, 2.5]}", "token 1");
    bad(port, "{\"prompt\": \"caf\xC3\"}", "UTF-8");
    bad(port, "{\"prompt\": \"\xED\xA0\x80\"}", "UTF-8"); /* a surrogate */
    char *deep = repeat("[", 100000, "", "");
    bad(port, deep, "not valid JSON");
    free(deep);
    char *deep_obj = repeat("{\"a\":", 5000, "{\"prompt\":\"x\",\"b\":", "");
    bad(port, deep_obj, "not valid JSON");
    free(deep_obj);
    /* what only the engine knows */
    char *longp = repeat("light ", 1500, "{\"prompt\": \"", "\"}");
    bad(port, longp, "context");
    char *longs = repeat("light ", 1500, "{\"stream\": true, \"prompt\": \"", "\"}");
    bad(port, longs, "context");
    free(longp);
    free(longs);
    bad(port, "{\"prompt\": [1, 2, 100000]}", "vocabulary");
    /* chat */
    const char *chat = "/v1/chat/completions";
    expect(port, chat, "{}", 400, "messages");
    expect(port, chat, "{\"messages\": []}", 400, "messages");
    expect(port, chat, "{\"messages\": [{\"role\": \"wizard\", \"content\": \"x\"}]}", 400,
           "role");
    expect(port, chat, "{\"messages\": [{\"role\": \"user\", \"content\": 5}]}", 400,
           "content");
    expect(port, chat, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], "
           "\"top_logprobs\": 2}", 400, "top_logprobs");
    expect(port, "/detokenize", "{\"tokens\": [1, 300]}", 400, "tokens");
    expect(port, "/tokenize", "{\"prompt\": 5}", 400, "prompt");
    zt_section("400 for malformed, mistyped, out-of-range and refused requests");
}

static void test_404_405_413(int port)
{
    zt_resp r;
    char v[64];
    ZT_CHECK(zt_request(port, "GET", "/v2/nothing", NULL, NULL, 0, &r) == 404 &&
             error_object(r.body, "no such endpoint"), "404 unknown path: %d", r.status);
    zt_resp_free(&r);
    expect(port, "/v1/completions", "{\"prompt\": \"x\", \"model\": \"gpt-9\"}", 404,
           "does not exist");
    ZT_CHECK(zt_request(port, "GET", "/v1/models/gpt-9", NULL, NULL, 0, &r) == 404,
             "404 unknown model: %d", r.status);
    zt_resp_free(&r);
    ZT_CHECK(zt_request(port, "GET", "/v1/completions", NULL, NULL, 0, &r) == 405 &&
             zt_header(&r, "Allow", v, sizeof v) && !strcmp(v, "POST") &&
             error_object(r.body, "POST"), "405 GET /v1/completions: %d", r.status);
    zt_resp_free(&r);
    ZT_CHECK(zt_request(port, "POST", "/health", NULL, "{}", 2, &r) == 405,
             "405 POST /health: %d", r.status);
    zt_resp_free(&r);
    /* Content-Length over the limit: answered from the headers alone */
    int fd = zt_connect(port, 10);
    const char *h = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 10485760\r\n\r\n";
    ZT_CHECK(fd >= 0 && zt_send_all(fd, h, strlen(h)) && zt_read_resp(fd, &r) &&
             r.status == 413 && error_object(r.body, "limit"), "413 by Content-Length: %d",
             r.status);
    zt_resp_free(&r);
    close(fd);
    /* chunked, 2 MiB in 64 KiB chunks: read, dropped, then 413 */
    fd = zt_connect(port, 10);
    h = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n";
    bool sent = fd >= 0 && zt_send_all(fd, h, strlen(h));
    char *chunk = malloc(65536 + 16);
    int cl = snprintf(chunk, 16, "10000\r\n");
    memset(chunk + cl, 'a', 65536);
    memcpy(chunk + cl + 65536, "\r\n", 2);
    for (int i = 0; sent && i < 32; i++)
        sent = zt_send_all(fd, chunk, (size_t)cl + 65536 + 2);
    sent = sent && zt_send_all(fd, "0\r\n\r\n", 5);
    ZT_CHECK(sent && zt_read_resp(fd, &r) && r.status == 413, "413 chunked: %d", r.status);
    zt_resp_free(&r);
    free(chunk);
    close(fd);
    zt_section("404 unknown path or model, 405 wrong method, 413 body over the limit");
}

static void test_401(const zs_server_config *base)
{
    zs_server_config c = *base;
    c.api_key = "sekrit";
    zs_server *s = start(c);
    int port = s ? zs_server_port(s) : 0;
    const char *body = "{\"prompt\": \"In the\", \"max_tokens\": 2}";
    zt_resp r;
    ZT_CHECK(zt_request(port, "POST", "/v1/completions", NULL, body, strlen(body), &r) == 401 &&
             error_object(r.body, "API key"), "401 without a key: %d", r.status);
    zt_resp_free(&r);
    ZT_CHECK(zt_request(port, "POST", "/v1/completions", "Authorization: Bearer sekrix\r\n",
                        body, strlen(body), &r) == 401, "401 with a wrong key: %d", r.status);
    zt_resp_free(&r);
    ZT_CHECK(zt_request(port, "GET", "/v1/models", "Authorization: Basic sekrit\r\n", NULL, 0,
                        &r) == 401, "401 with another scheme: %d", r.status);
    zt_resp_free(&r);
    ZT_CHECK(zt_request(port, "POST", "/v1/completions", "Authorization: Bearer sekrit\r\n",
                        body, strlen(body), &r) == 200, "200 with the key: %d", r.status);
    zt_resp_free(&r);
    ZT_CHECK(zt_request(port, "GET", "/health", NULL, NULL, 0, &r) == 200, "/health open");
    zt_resp_free(&r);
    ZT_CHECK(zt_get_metric(port, "zs_requests_total{code=\"401\"}") == 3,
             "three 401 counted");
    zs_server_free(s);
    zt_section("401 without or with a wrong key, 200 with it");
}

/* Waits up to `seconds` for metric name to read want. */
static bool metric_becomes(int port, const char *name, double want, double seconds)
{
    for (double t = 0; t < seconds; t += 0.02) {
        if (zt_get_metric(port, name) == want)
            return true;
        usleep(20000);
    }
    return false;
}

static const char *long_stream =
    "{\"prompt\": \"In the\", \"max_tokens\": 1000, \"ignore_eos\": true, \"stream\": true}";
static const char *long_whole =
    "{\"prompt\": \"The light\", \"max_tokens\": 1000, \"ignore_eos\": true}";

static void test_429_and_disconnect(const zs_server_config *base)
{
    zs_server_config c = *base;
    c.engine.max_num_seqs = 1;
    c.max_queue = 1;
    zs_server *s = start_on(slow, c);
    int port = s ? zs_server_port(s) : 0;
    zt_sse a, b;
    char *first = NULL;
    ZT_CHECK(zt_sse_open(port, "/v1/completions", long_stream, NULL, &a) &&
             a.head.status == 200 && (first = zt_sse_next(&a)), "stream A runs");
    free(first);
    ZT_CHECK(zt_sse_open(port, "/v1/completions", long_stream, NULL, &b) &&
             b.head.status == 200, "stream B waits (admitted: %d)", b.head.status);
    zt_resp r;
    char v[16];
    const char *q = "{\"prompt\": \"x\", \"max_tokens\": 1}";
    ZT_CHECK(zt_request(port, "POST", "/v1/completions", NULL, q, strlen(q), &r) == 429 &&
             zt_header(&r, "Retry-After", v, sizeof v) && error_object(r.body, "retry"),
             "429 + Retry-After with 2 in flight: %d", r.status);
    zt_resp_free(&r);
    ZT_CHECK(zt_get_metric(port, "zs_kv_blocks_used") > 0, "blocks in use");
    zt_sse_close(&a);
    zt_sse_close(&b);
    ZT_CHECK(metric_becomes(port, "zs_requests_in_flight", 0, 10), "both aborted");
    ZT_CHECK(metric_becomes(port, "zs_running_sequences", 0, 10), "running 0");
    ZT_CHECK(metric_becomes(port, "zs_kv_blocks_used", 0, 10), "KV blocks used back to 0");
    /* a whole answer whose client leaves while waiting */
    int fd = zt_connect(port, 10);
    char h[256];
    int hl = snprintf(h, sizeof h, "POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                      "Content-Length: %zu\r\n\r\n%s", strlen(long_whole), long_whole);
    zt_send_all(fd, h, (size_t)hl);
    ZT_CHECK(metric_becomes(port, "zs_running_sequences", 1, 10), "the whole answer runs");
    close(fd);
    ZT_CHECK(metric_becomes(port, "zs_requests_in_flight", 0, 10), "aborted when it left");
    ZT_CHECK(metric_becomes(port, "zs_kv_blocks_used", 0, 10), "its blocks freed");
    double gen = zt_get_metric(port, "zs_generation_tokens_total");
    ZT_CHECK(gen >= 1 && gen < 2500, "%g tokens generated of the 3000 asked", gen);
    zs_server_free(s);
    zt_section("429 + Retry-After; a client that leaves has its request aborted at once");
}

static void test_504(const zs_server_config *base)
{
    zs_server_config c = *base;
    c.request_timeout_s = 0.05;
    zs_server *s = start_on(slow, c);
    int port = s ? zs_server_port(s) : 0;
    expect(port, "/v1/completions", long_whole, 504, "timeout");
    ZT_CHECK(metric_becomes(port, "zs_kv_blocks_used", 0, 10), "its blocks freed");
    zs_server_free(s);
    zt_section("504 past the request timeout");
}

typedef struct waiter {
    int port;
    const char *body;
    int status;
    char *rest;      /* a stream's events, or a whole answer's body */
} waiter;

static void *stream_reader(void *arg);
static void *whole_reader(void *arg);

/* Requests that wait longer than the read timeout (1 s) for a slot keep
 * their connections: the stream sends comments meanwhile. */
static void test_long_waits(const zs_server_config *base)
{
    zs_server_config c = *base;
    c.engine.max_num_seqs = 1;
    c.read_timeout_s = 1;
    zs_server *s = start_on(slow, c);
    int port = s ? zs_server_port(s) : 0;
    zt_sse a;
    char *first = NULL;
    ZT_CHECK(zt_sse_open(port, "/v1/completions", long_stream, NULL, &a) &&
             (first = zt_sse_next(&a)), "the long stream runs");
    free(first);
    const char *short_stream = "{\"prompt\": \"x\", \"max_tokens\": 3, \"stream\": true}";
    const char *short_whole = "{\"prompt\": \"x\", \"max_tokens\": 3}";
    waiter w1 = {port, short_stream, 0, NULL}, w2 = {port, short_whole, 0, NULL};
    pthread_t t1, t2;
    pthread_create(&t1, NULL, stream_reader, &w1);
    pthread_create(&t2, NULL, whole_reader, &w2);
    usleep(2500000); /* both wait 2.5 s behind the long stream */
    zt_sse_close(&a);
    pthread_join(t1, NULL);
    pthread_join(t2, NULL);
    ZT_CHECK(w1.status == 200 && w1.rest && strstr(w1.rest, "\"finish_reason\":\"length\"") &&
             strstr(w1.rest, "data: [DONE]"), "the waiting stream completes: %.200s",
             w1.rest ? w1.rest : "(none)");
    ZT_CHECK(w2.status == 200 && w2.rest && strstr(w2.rest, "\"text_completion\""),
             "the waiting whole answer completes: %d", w2.status);
    free(w1.rest);
    free(w2.rest);
    zs_server_free(s);
    zt_section("requests waiting longer than the read timeout keep their connections");
}

static void *stream_reader(void *arg)
{
    waiter *w = arg;
    zt_sse sse;
    if (zt_sse_open(w->port, "/v1/completions", w->body, NULL, &sse)) {
        w->status = sse.head.status;
        w->rest = zt_sse_rest(&sse);
    }
    zt_sse_close(&sse);
    return NULL;
}

static void *whole_reader(void *arg)
{
    waiter *w = arg;
    zt_resp r;
    w->status = zt_request(w->port, "POST", "/v1/completions", NULL, w->body,
                           strlen(w->body), &r);
    w->rest = r.body;
    return NULL;
}

static void test_stop(const zs_server_config *base)
{
    zs_server_config c = *base;
    c.engine.max_num_seqs = 1;
    zs_server *s = start_on(slow, c);
    int port = s ? zs_server_port(s) : 0;
    waiter a = {port, long_stream, 0, NULL}, b = {port, long_whole, 0, NULL};
    pthread_t ta, tb;
    pthread_create(&ta, NULL, stream_reader, &a);
    ZT_CHECK(metric_becomes(port, "zs_running_sequences", 1, 10), "the stream runs");
    pthread_create(&tb, NULL, whole_reader, &b);
    ZT_CHECK(metric_becomes(port, "zs_waiting_sequences", 1, 10), "the whole answer waits");
    double t0 = zt_now();
    zs_server_stop(s, 0.2);
    double dt = zt_now() - t0;
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    ZT_CHECK(dt < 3, "stop took %.2f s with a grace of 0.2 s", dt);
    ZT_CHECK(a.status == 200 && a.rest && strstr(a.rest, "data: {\"error\"") &&
             strstr(a.rest, "shutting down") && strstr(a.rest, "data: [DONE]"),
             "the stream ends with an error event and [DONE]: %.200s",
             a.rest ? a.rest : "(none)");
    ZT_CHECK(b.status == 503 && error_object(b.rest, "shutting down"),
             "the waiting request gets 503: %d", b.status);
    ZT_CHECK(zt_connect(port, 1) < 0, "no longer listening");
    free(a.rest);
    free(b.rest);
    zs_server_free(s);
    zt_section("zs_server_stop: streams end with an error event, waiting requests 503");
}

int main(void)
{
    zs_bpe *b = zt_serve_bpe();
    zs_llm *m = b ? zt_serve_llm(b, CTX, 2, 64) : NULL;
    zs_llm *ms = b ? zt_serve_llm(b, CTX, 4, 512) : NULL;
    ZT_CHECK(m && ms, "models");
    if (!m || !ms)
        return zt_done();
    fast = m, slow = ms, bpe = b;
    zs_server_config base = {.max_body_bytes = 1 << 20};
    zs_server *s = start(base);
    if (s) {
        test_400(zs_server_port(s));
        test_404_405_413(zs_server_port(s));
        double got = zt_get_metric(zs_server_port(s), "zs_requests_total{code=\"400\"}");
        ZT_CHECK(got == n400, "%d 400s counted: %g", n400, got);
        zs_server_free(s);
    }
    test_401(&base);
    test_429_and_disconnect(&base);
    test_504(&base);
    test_long_waits(&base);
    test_stop(&base);
    zs_llm_free(m);
    zs_llm_free(ms);
    zs_bpe_free(b);
    return zt_done();
}
