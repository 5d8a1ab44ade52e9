/*
 * test_serve_prompts.c - POST /v1/completions with "prompt" as a list
 * (zs/serve.h), on in-process servers of random-weight GPTs:
 *   - 3 string prompts with n = 2 give 6 choices, indexes 0..5 in order,
 *     choice p * 2 + s with the text, finish_reason and logprob count of
 *     sample s of prompt p sent alone with the same seed (greedy; seeded
 *     temperature 1 with stop strings and logprobs); usage sums each
 *     prompt's tokens once and every choice's tokens;
 *   - streamed, the same choices (by index) piece by piece; [DONE] once,
 *     last, after every choice's finish_reason and the summed usage chunk;
 *   - arrays of arrays of token ids give the answers of the strings they
 *     encode; one array of ids is one prompt; 64 prompts with n = 2 (128
 *     choices, the most) are answered;
 *   - echo: each choice begins with its own prompt and its logprobs list
 *     that prompt's tokens first, whole and streamed;
 *   - /metrics (latency and first-token histograms, token counters) and
 *     the request log count a list once, its tokens summed;
 *   - a prompt the engine refuses (too long, an id outside the vocabulary)
 *     fails the whole request with a 400 naming it, whole and streamed,
 *     and leaves nothing running or holding KV blocks;
 *   - a client that leaves a list's stream or whole answer has every
 *     prompt aborted (running 0, KV blocks 0); the queue limit (429) counts
 *     a list once, and a list longer than the limit still runs alone.
 * Texts are compared as the server wrote them (JSON-escaped), which the
 * stream tests show equal whole and in pieces (test_serve_stream.c).
 */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "serve/serve_util.h"
#include "testutil.h"

#define MAXC 128 /* choices per request: the server's limit */

static const char *const prompts[3] = {"In the beginning", "The light", "And the word was"};

/* An answer, whole or assembled from a stream. */
typedef struct answer {
    int status;
    int n;                  /* choices: the highest index + 1 */
    char *text[MAXC];       /* JSON-escaped, as written (no quotes) */
    char finish[MAXC][16];
    int lp_tokens[MAXC];    /* logprobs "tokens" entries */
    double prompt_tokens, completion_tokens; /* usage; -1: none */
    bool in_order;          /* whole: choices[p].index == p */
    int done;               /* streams: [DONE] events */
    bool well_formed;       /* streams: nothing after [DONE]; usage and
                             * [DONE] after every choice's finish_reason */
} answer;

static void answer_free(answer *a)
{
    for (int k = 0; k < MAXC; k++)
        free(a->text[k]);
}

/* The p-th string value of "text" in json, as written (escapes kept),
 * malloc'd; NULL when there is none. The server writes no spaces. */
static char *raw_text(const char *json, int p)
{
    const char *at = json, *pat = "\"text\":\"";
    for (int i = 0; at && i <= p; i++)
        if ((at = strstr(at, pat)))
            at += strlen(pat);
    if (!at)
        return NULL;
    const char *e = at;
    while (*e && *e != '"')
        e += e[0] == '\\' && e[1] ? 2 : 1;
    char *out = malloc((size_t)(e - at) + 1);
    memcpy(out, at, (size_t)(e - at));
    out[e - at] = 0;
    return out;
}

static void append(char **s, const char *t)
{
    size_t n = *s ? strlen(*s) : 0;
    *s = realloc(*s, n + strlen(t) + 1);
    strcpy(*s + n, t);
}

static void usage(const cJSON *j, answer *a)
{
    const cJSON *u = cJSON_GetObjectItemCaseSensitive(j, "usage");
    const cJSON *pt = cJSON_GetObjectItemCaseSensitive(u, "prompt_tokens");
    const cJSON *ct = cJSON_GetObjectItemCaseSensitive(u, "completion_tokens");
    if (cJSON_IsNumber(pt) && cJSON_IsNumber(ct))
        a->prompt_tokens = pt->valuedouble, a->completion_tokens = ct->valuedouble;
}

/* Adds choice c (the p-th of json) to a; false when malformed. */
static bool add_choice(const char *json, int p, const cJSON *c, answer *a)
{
    const cJSON *idx = cJSON_GetObjectItemCaseSensitive(c, "index");
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(c, "finish_reason");
    const cJSON *lp = cJSON_GetObjectItemCaseSensitive(c, "logprobs");
    char *t = raw_text(json, p);
    if (!cJSON_IsNumber(idx) || idx->valueint < 0 || idx->valueint >= MAXC || !t) {
        free(t);
        return false;
    }
    int k = idx->valueint;
    append(&a->text[k], t);
    free(t);
    a->n = k + 1 > a->n ? k + 1 : a->n;
    if (cJSON_IsString(f))
        snprintf(a->finish[k], sizeof a->finish[k], "%s", f->valuestring);
    a->lp_tokens[k] += cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(lp, "tokens"));
    return true;
}

/* POSTs body to /v1/completions and reads the whole answer into *a. */
static void whole(int port, const char *body, answer *a)
{
    *a = (answer){.prompt_tokens = -1, .completion_tokens = -1, .in_order = true};
    zt_resp r;
    a->status = zt_request(port, "POST", "/v1/completions", NULL, body, strlen(body), &r);
    cJSON *j = a->status == 200 ? cJSON_Parse(r.body) : NULL;
    const cJSON *ch = cJSON_GetObjectItemCaseSensitive(j, "choices");
    int p = 0;
    for (const cJSON *c = cJSON_IsArray(ch) ? ch->child : NULL; c; c = c->next, p++) {
        const cJSON *idx = cJSON_GetObjectItemCaseSensitive(c, "index");
        a->in_order = a->in_order && cJSON_IsNumber(idx) && idx->valueint == p;
        a->in_order = a->in_order && add_choice(r.body, p, c, a);
    }
    usage(j, a);
    ZT_CHECK(a->status == 200 && j, "%.80s: %d %.300s", body, a->status,
             r.body ? r.body : "");
    cJSON_Delete(j);
    zt_resp_free(&r);
}

/* Every choice of a seen so far has its finish_reason. */
static bool all_finished(const answer *a)
{
    for (int k = 0; k < a->n; k++)
        if (!a->finish[k][0])
            return false;
    return a->n > 0;
}

/* One event of a stream into a. */
static void stream_event(const char *ev, answer *a)
{
    if (a->done) {
        a->well_formed = false; /* nothing after [DONE] */
        return;
    }
    if (!strcmp(ev, "[DONE]")) {
        a->done++;
        a->well_formed = a->well_formed && all_finished(a) && a->prompt_tokens >= 0;
        return;
    }
    cJSON *j = cJSON_Parse(ev);
    const cJSON *ch = cJSON_GetObjectItemCaseSensitive(j, "choices");
    int n = cJSON_GetArraySize(ch);
    if (cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(j, "usage"))) {
        a->well_formed = a->well_formed && n == 0 && all_finished(a);
        usage(j, a);
    } else {
        a->well_formed = a->well_formed && n == 1 && add_choice(ev, 0, ch->child, a);
    }
    cJSON_Delete(j);
}

/* The body {extra} streamed with usage, read into *a. */
static void streamed(int port, const char *body, answer *a)
{
    *a = (answer){.prompt_tokens = -1, .completion_tokens = -1, .well_formed = true};
    char sbody[8192];
    snprintf(sbody, sizeof sbody, "%.*s, \"stream\": true, \"stream_options\": "
             "{\"include_usage\": true}}", (int)strlen(body) - 1, body);
    zt_sse s;
    bool ok = zt_sse_open(port, "/v1/completions", sbody, NULL, &s);
    a->status = ok ? s.head.status : -1;
    for (char *ev; ok && a->status == 200 && (ev = zt_sse_next(&s)); free(ev))
        stream_event(ev, a);
    zt_sse_close(&s);
    ZT_CHECK(a->status == 200 && a->done == 1 && a->well_formed, "stream %.80s: status %d, "
             "%d [DONE], well formed %d", body, a->status, a->done, a->well_formed);
}

/* Choice ka of a equals choice kb of b (text, finish, logprobs). */
static bool same_choice(const answer *a, int ka, const answer *b, int kb)
{
    return a->text[ka] && b->text[kb] && !strcmp(a->text[ka], b->text[kb]) &&
           a->finish[ka][0] && !strcmp(a->finish[ka], b->finish[kb]) &&
           a->lp_tokens[ka] == b->lp_tokens[kb];
}

static bool same_answer(const answer *a, const answer *b)
{
    bool ok = a->n == b->n && a->prompt_tokens == b->prompt_tokens &&
              a->completion_tokens == b->completion_tokens;
    for (int k = 0; ok && k < a->n; k++)
        ok = same_choice(a, k, b, k);
    return ok;
}

/* {"prompt": P, "n": n, "max_tokens": 12, EXTRA} */
static void body_of(char *out, size_t cap, const char *prompt, int n, const char *extra)
{
    snprintf(out, cap, "{\"prompt\": %s, \"n\": %d, \"max_tokens\": 12%s%s}", prompt, n,
             extra[0] ? ", " : "", extra);
}

/* The three prompts as a JSON list of strings. */
static const char *string_list(void)
{
    static char list[256];
    snprintf(list, sizeof list, "[\"%s\", \"%s\", \"%s\"]", prompts[0], prompts[1],
             prompts[2]);
    return list;
}

/* A list of 3 prompts, n = 2, against each prompt alone; whole and
 * streamed. extra: sampling fields. */
static void list_vs_alone(int port, const char *extra, const char *what)
{
    char body[1024], q[128];
    answer list, list_s, alone[3];
    double pt = 0, ct = 0;
    for (int i = 0; i < 3; i++) {
        snprintf(q, sizeof q, "\"%s\"", prompts[i]);
        body_of(body, sizeof body, q, 2, extra);
        whole(port, body, &alone[i]);
        pt += alone[i].prompt_tokens;
        ct += alone[i].completion_tokens;
    }
    body_of(body, sizeof body, string_list(), 2, extra);
    whole(port, body, &list);
    ZT_CHECK(list.n == 6 && list.in_order, "%s: 6 choices, indexes 0..5 in order (%d)", what,
             list.n);
    for (int k = 0; k < list.n && k < 6; k++)
        ZT_CHECK(same_choice(&list, k, &alone[k / 2], k % 2), "%s: choice %d '%s' (%s) != "
                 "prompt %d alone, sample %d '%s' (%s)", what, k, list.text[k],
                 list.finish[k], k / 2, k % 2, alone[k / 2].text[k % 2],
                 alone[k / 2].finish[k % 2]);
    ZT_CHECK(list.prompt_tokens == pt && list.completion_tokens == ct, "%s: usage %g + %g, "
             "the prompts alone %g + %g", what, list.prompt_tokens, list.completion_tokens,
             pt, ct);
    streamed(port, body, &list_s);
    ZT_CHECK(same_answer(&list_s, &list), "%s: the stream (%d choices, usage %g + %g) = the "
             "whole answer", what, list_s.n, list_s.prompt_tokens, list_s.completion_tokens);
    for (int i = 0; i < 3; i++)
        answer_free(&alone[i]);
    answer_free(&list);
    answer_free(&list_s);
}

static void test_lists(int port)
{
    list_vs_alone(port, "\"temperature\": 0", "greedy");
    list_vs_alone(port, "\"temperature\": 1, \"seed\": 42", "seed 42");
    list_vs_alone(port, "\"temperature\": 1, \"seed\": 9, \"top_k\": 20, \"stop\": [\"e\", "
                  "\"th\"], \"logprobs\": 2", "seed 9, stop strings, logprobs");
    zt_section("3 prompts x n = 2: 6 choices prompt-major, each its prompt's alone; "
               "usage summed; stream = whole, [DONE] once at the end");
}

/* The ids of text as a JSON array (/tokenize), into out. */
static int ids_of(int port, const char *text, char *out, size_t cap)
{
    char body[256];
    snprintf(body, sizeof body, "{\"prompt\": \"%s\"}", text);
    zt_resp r;
    zt_request(port, "POST", "/tokenize", NULL, body, strlen(body), &r);
    cJSON *j = cJSON_Parse(r.body ? r.body : "");
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, "tokens");
    char *s = cJSON_IsArray(t) ? cJSON_PrintUnformatted(t) : NULL;
    snprintf(out, cap, "%s", s ? s : "[]");
    int n = cJSON_GetArraySize(t);
    free(s);
    cJSON_Delete(j);
    zt_resp_free(&r);
    return n;
}

static void test_token_ids(int port)
{
    char ids[3][256], list[1024], body[2048];
    for (int i = 0; i < 3; i++)
        ZT_CHECK(ids_of(port, prompts[i], ids[i], sizeof ids[i]) > 0, "tokenize %s",
                 prompts[i]);
    snprintf(list, sizeof list, "[%s, %s, %s]", ids[0], ids[1], ids[2]);
    const char *extra = "\"temperature\": 1, \"seed\": 3";
    answer by_ids, by_text, one_ids, one_text, nested;
    body_of(body, sizeof body, list, 2, extra);
    whole(port, body, &by_ids);
    body_of(body, sizeof body, string_list(), 2, extra);
    whole(port, body, &by_text);
    ZT_CHECK(by_ids.n == 6 && by_ids.in_order && same_answer(&by_ids, &by_text),
             "arrays of ids = the strings they encode (%d choices)", by_ids.n);
    answer s;
    body_of(body, sizeof body, list, 2, extra);
    streamed(port, body, &s);
    ZT_CHECK(same_answer(&s, &by_text), "arrays of ids streamed");
    answer_free(&s);
    body_of(body, sizeof body, ids[1], 1, extra);
    whole(port, body, &one_ids);
    body_of(body, sizeof body, "\"The light\"", 1, extra);
    whole(port, body, &one_text);
    snprintf(list, sizeof list, "[%s]", ids[1]);
    body_of(body, sizeof body, list, 1, extra);
    whole(port, body, &nested);
    ZT_CHECK(one_ids.n == 1 && same_answer(&one_ids, &one_text) &&
             same_answer(&nested, &one_text), "one array of ids is one prompt, as is [[ids]]");
    answer_free(&by_ids), answer_free(&by_text), answer_free(&one_ids);
    answer_free(&one_text), answer_free(&nested);
    /* the most: 64 prompts x n = 2 */
    char *big = malloc(64 * 8 + 64);
    strcpy(big, "{\"prompt\": [");
    for (int i = 0; i < 64; i++)
        strcat(big, i ? ", \"The\"" : "\"The\"");
    strcat(big, "], \"n\": 2, \"max_tokens\": 1, \"temperature\": 0}");
    answer most;
    whole(port, big, &most);
    ZT_CHECK(most.n == 128 && most.in_order && same_choice(&most, 0, &most, 127),
             "64 prompts x n = 2: 128 choices in order, alike (%d)", most.n);
    answer_free(&most);
    free(big);
    zt_section("arrays of token ids = their strings; one array is one prompt; 128 choices");
}

static void test_echo(int port)
{
    char body[1024];
    const char *extra = "\"temperature\": 1, \"seed\": 5, \"logprobs\": 1";
    answer plain, echo, echo_s;
    body_of(body, sizeof body, "[\"In the beginning\", \"The light\"]", 2, extra);
    whole(port, body, &plain);
    snprintf(body, sizeof body, "{\"prompt\": [\"In the beginning\", \"The light\"], \"n\": "
             "2, \"max_tokens\": 12, %s, \"echo\": true}", extra);
    whole(port, body, &echo);
    char ids[256];
    for (int k = 0; k < 4 && echo.n == 4; k++) {
        const char *p = prompts[k / 2];
        int np = ids_of(port, p, ids, sizeof ids);
        bool starts = echo.text[k] && !strncmp(echo.text[k], p, strlen(p)) &&
                      plain.text[k] && !strcmp(echo.text[k] + strlen(p), plain.text[k]);
        ZT_CHECK(starts, "echo choice %d: '%s' = '%s' + '%s'", k, echo.text[k], p,
                 plain.text[k]);
        ZT_CHECK(echo.lp_tokens[k] == np + plain.lp_tokens[k], "echo choice %d: %d logprob "
                 "tokens = %d of its prompt + %d", k, echo.lp_tokens[k], np,
                 plain.lp_tokens[k]);
    }
    ZT_CHECK(echo.n == 4, "echo: 4 choices (%d)", echo.n);
    streamed(port, body, &echo_s);
    ZT_CHECK(same_answer(&echo_s, &echo), "echo streamed = whole");
    answer_free(&plain), answer_free(&echo), answer_free(&echo_s);
    zt_section("echo: each choice begins with its own prompt (text and logprobs)");
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

/* A list request counts once in /metrics and the request log. */
static void test_counted_once(const zs_llm *m, const zs_bpe *b)
{
    char path[] = "/tmp/zs_prompts_log_XXXXXX";
    int fd = mkstemp(path);
    FILE *log = fd >= 0 ? fdopen(fd, "w") : NULL;
    zs_server_config c = {.engine.kv_blocks = 256, .log = log};
    zs_server *s = log ? zs_server_start(m, b, &c) : NULL;
    ZT_CHECK(s != NULL, "server with a log");
    if (!s) {
        if (log)
            fclose(log);
        return;
    }
    int port = zs_server_port(s);
    char body[1024];
    body_of(body, sizeof body, string_list(), 2, "\"temperature\": 0");
    answer a;
    whole(port, body, &a);
    ZT_CHECK(metric_becomes(port, "zs_request_latency_seconds_count", 1, 2) &&
             zt_get_metric(port, "zs_time_to_first_token_seconds_count") == 1,
             "one request in the histograms");
    ZT_CHECK(zt_get_metric(port, "zs_prompt_tokens_total") == a.prompt_tokens &&
             zt_get_metric(port, "zs_generation_tokens_total") == a.completion_tokens,
             "token counters = usage %g + %g", a.prompt_tokens, a.completion_tokens);
    zs_server_free(s);
    fclose(log);
    FILE *in = fopen(path, "r");
    char line[4096];
    int lines = 0;
    bool match = false;
    while (in && fgets(line, sizeof line, in)) {
        if (!strstr(line, "\"path\":\"/v1/completions\""))
            continue;
        lines++;
        cJSON *j = cJSON_Parse(line);
        const cJSON *pt = cJSON_GetObjectItemCaseSensitive(j, "prompt_tokens");
        const cJSON *ct = cJSON_GetObjectItemCaseSensitive(j, "completion_tokens");
        match = cJSON_IsNumber(pt) && pt->valuedouble == a.prompt_tokens &&
                cJSON_IsNumber(ct) && ct->valuedouble == a.completion_tokens;
        cJSON_Delete(j);
    }
    if (in)
        fclose(in);
    unlink(path);
    ZT_CHECK(lines == 1 && match, "the log: %d completion lines, tokens summed: %d", lines,
             match);
    answer_free(&a);
    zt_section("/metrics and the request log count a list once, tokens summed");
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

/* POSTs body (streamed when stream): expect 400 naming both needles. */
static void refused(int port, const char *body, const char *n1, const char *n2)
{
    zt_resp r;
    int st = zt_request(port, "POST", "/v1/completions", NULL, body, strlen(body), &r);
    ZT_CHECK(st == 400 && r.body && strstr(r.body, n1) && strstr(r.body, n2),
             "%.70s: expected 400 naming '%s', '%s': %d %.300s", body, n1, n2, st,
             r.body ? r.body : "");
    zt_resp_free(&r);
}

static void test_refused(int port)
{
    char *longp = repeat("light ", 300, "{\"prompt\": [\"In the\", \"", "\"]}");
    char *longs = repeat("light ", 300, "{\"stream\": true, \"prompt\": [\"In the\", \"x\", \"",
                         "\"]}");
    refused(port, longp, "prompt 1:", "context");
    refused(port, longs, "prompt 2:", "context");
    refused(port, "{\"prompt\": [[1, 2], [3, 4], [1, 2, 100000]], \"n\": 2}", "prompt 2:",
            "vocabulary");
    refused(port, "{\"prompt\": [[1, 2, 100000], [3, 4]]}", "prompt 0:", "vocabulary");
    free(longp);
    free(longs);
    ZT_CHECK(metric_becomes(port, "zs_requests_in_flight", 0, 2) &&
             metric_becomes(port, "zs_running_sequences", 0, 1) &&
             metric_becomes(port, "zs_waiting_sequences", 0, 1) &&
             metric_becomes(port, "zs_kv_blocks_used", 0, 1),
             "nothing left running, waiting or holding KV blocks");
    answer a;
    char body[1024];
    body_of(body, sizeof body, string_list(), 1, "\"temperature\": 0");
    whole(port, body, &a);
    ZT_CHECK(a.n == 3, "the server answers after (%d choices)", a.n);
    answer_free(&a);
    zt_section("a prompt the engine refuses fails the request (400 naming it), "
               "the prompts taken are aborted");
}

static const char *long_list =
    "{\"prompt\": [\"In the\", \"The light\", \"And\"], \"n\": 2, \"max_tokens\": 1000, "
    "\"ignore_eos\": true";

/* Clients that leave a list's answer; the queue limit counts a list once. */
static void test_leave_and_limit(const zs_llm *slow, const zs_bpe *b)
{
    zs_server_config c = {.engine.kv_blocks = 512};
    zs_server *s = zs_server_start(slow, b, &c);
    ZT_CHECK(s != NULL, "slow server");
    int port = s ? zs_server_port(s) : 0;
    char body[512];
    snprintf(body, sizeof body, "%s, \"stream\": true}", long_list);
    zt_sse a;
    char *first = NULL;
    ZT_CHECK(zt_sse_open(port, "/v1/completions", body, NULL, &a) && a.head.status == 200 &&
             (first = zt_sse_next(&a)), "the list's stream runs");
    free(first);
    ZT_CHECK(metric_becomes(port, "zs_running_sequences", 6, 2), "6 sequences run");
    zt_sse_close(&a);
    ZT_CHECK(metric_becomes(port, "zs_requests_in_flight", 0, 2) &&
             metric_becomes(port, "zs_running_sequences", 0, 1) &&
             metric_becomes(port, "zs_kv_blocks_used", 0, 1),
             "a stream's client left: every prompt aborted, KV blocks freed");
    /* a whole answer's client leaves */
    int fd = zt_connect(port, 10);
    char h[512];
    snprintf(body, sizeof body, "%s}", long_list);
    int hl = snprintf(h, sizeof h, "POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                      "Content-Length: %zu\r\n\r\n%s", strlen(body), body);
    zt_send_all(fd, h, (size_t)hl);
    ZT_CHECK(metric_becomes(port, "zs_running_sequences", 6, 2), "the whole list runs");
    close(fd);
    ZT_CHECK(metric_becomes(port, "zs_requests_in_flight", 0, 2) &&
             metric_becomes(port, "zs_kv_blocks_used", 0, 1),
             "a whole answer's client left: every prompt aborted, KV blocks freed");
    double gen = zt_get_metric(port, "zs_generation_tokens_total");
    ZT_CHECK(gen >= 1 && gen < 0.8 * 12000, "%g tokens generated of the 12000 asked", gen);
    zs_server_free(s);
    /* the queue limit: max_num_seqs 1 + max_queue 1 = 2 requests */
    c.engine.max_num_seqs = 1;
    c.max_queue = 1;
    s = zs_server_start(slow, b, &c);
    port = s ? zs_server_port(s) : 0;
    const char *three = "{\"prompt\": [\"In the\", \"The light\", \"And\"], \"max_tokens\": "
                        "1000, \"ignore_eos\": true, \"stream\": true}";
    const char *one = "{\"prompt\": \"x\", \"max_tokens\": 1000, \"ignore_eos\": true, "
                      "\"stream\": true}";
    zt_sse x, y;
    ZT_CHECK(zt_sse_open(port, "/v1/completions", three, NULL, &x) && x.head.status == 200 &&
             (first = zt_sse_next(&x)), "a list of 3 runs with max_num_seqs 1");
    free(first);
    ZT_CHECK(zt_sse_open(port, "/v1/completions", one, NULL, &y) && y.head.status == 200,
             "a second request is queued: the list counted once (%d)", y.head.status);
    zt_resp r;
    const char *q = "{\"prompt\": [\"x\", \"y\"], \"max_tokens\": 1}";
    ZT_CHECK(zt_request(port, "POST", "/v1/completions", NULL, q, strlen(q), &r) == 429,
             "a third gets 429: %d", r.status);
    zt_resp_free(&r);
    zt_sse_close(&x);
    zt_sse_close(&y);
    ZT_CHECK(metric_becomes(port, "zs_requests_in_flight", 0, 2) &&
             metric_becomes(port, "zs_kv_blocks_used", 0, 1), "both aborted");
    zs_server_free(s);
    zt_section("a client that leaves a list aborts every prompt; 429 counts a list once");
}

int main(void)
{
    zs_bpe *b = zt_serve_bpe();
    zs_llm *m = b ? zt_serve_llm(b, 256, 2, 64) : NULL;
    zs_llm *slow = b ? zt_serve_llm(b, 1024, 4, 512) : NULL;
    zs_server_config c = {.engine.kv_blocks = 256};
    zs_server *s = m && slow ? zs_server_start(m, b, &c) : NULL;
    ZT_CHECK(s != NULL, "server");
    if (s) {
        int port = zs_server_port(s);
        test_lists(port);
        test_token_ids(port);
        test_echo(port);
        test_refused(port);
        zs_server_free(s);
        test_counted_once(m, b);
        test_leave_and_limit(slow, b);
    }
    zs_llm_free(m);
    zs_llm_free(slow);
    zs_bpe_free(b);
    return zt_done();
}
