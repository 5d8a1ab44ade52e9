/*
 * test_serve_stream.c - streamed answers are the whole answers, cut into
 * pieces, and never show text past a stop string:
 *   - src/serve/text.c alone: UTF-8 validation (overlong forms,
 *     surrogates, > U+10FFFF), the complete-prefix rule, the stop-string
 *     hold-back, JSON strings of arbitrary bytes (valid JSON, U+FFFD for
 *     invalid bytes, and the same text whether written whole or in pieces
 *     cut where zsi_utf8_complete allows, for every cut of random bytes);
 *   - on an in-process server of a random-weight GPT (its output is
 *     random bytes: split and invalid UTF-8 characters included), 60
 *     requests (seeds 1..60; completions and chat; n 1..3; stop strings
 *     that occur often; logprobs, echo): for each, the concatenated stream
 *     of every choice equals the whole answer's text, with the same
 *     finish_reason, the same number of logprob tokens and usage, and no
 *     chunk of a stopped choice ever contains a stop string.
 */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "serve/internal.h"
#include "serve/serve_util.h"
#include "testutil.h"

/* ---- text.c ------------------------------------------------------------------------- */

static void test_utf8(void)
{
    static const struct {
        const char *s;
        bool valid;
    } cases[] = {
        {"plain", true}, {"caf\xC3\xA9", true}, {"\xE2\x82\xAC", true},
        {"\xF0\x9F\x98\x80", true}, {"\xC3", false}, {"\xC0\xAF", false},
        {"\xE0\x80\xAF", false}, {"\xED\xA0\x80", false}, {"\xF4\x90\x80\x80", false},
        {"\xFF", false}, {"\x80", false}, {"a\xE2\x82", false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        ZT_CHECK(zsi_utf8_valid(cases[i].s, strlen(cases[i].s)) == cases[i].valid,
                 "utf8_valid case %zu", i);
    ZT_CHECK(zsi_utf8_complete("a\xE2\x82", 3) == 1, "a cut euro sign is held back");
    ZT_CHECK(zsi_utf8_complete("a\xF0\x9F", 3) == 1, "a cut emoji is held back");
    ZT_CHECK(zsi_utf8_complete("a\xE2\x82\xAC", 4) == 4, "a whole euro sign goes");
    ZT_CHECK(zsi_utf8_complete("a\xFF", 2) == 2, "an invalid byte is not waited for");
    ZT_CHECK(zsi_utf8_complete("a\xE2" "b", 3) == 3, "a broken sequence is not waited for");
    char *stops[] = {"light", "ligature", "xyz"};
    ZT_CHECK(zsi_stop_holdback("the lig", 7, stops, 3) == 3, "'lig' could start a stop");
    ZT_CHECK(zsi_stop_holdback("the l", 5, stops, 3) == 1, "'l' too");
    ZT_CHECK(zsi_stop_holdback("the x", 5, stops, 3) == 1, "'x' too");
    ZT_CHECK(zsi_stop_holdback("the lag", 7, stops, 3) == 0, "'lag' cannot");
    zsi_buf b = {0};
    zsi_buf_json_str(&b, "a\"\\\n\x01\xFF\xC3\xA9", 8);
    ZT_CHECK(b.p && !strcmp(b.p, "\"a\\\"\\\\\\n\\u0001\xEF\xBF\xBD\xC3\xA9\""),
             "JSON string escapes and U+FFFD: %s", b.p);
    zsi_buf_free(&b);
    zt_irand_seed(11);
    for (int round = 0; round < 300; round++) {
        char bytes[24];
        int n = (int)zt_irand(1, 24);
        for (int i = 0; i < n; i++) /* bias to UTF-8 lead and continuation bytes */
            bytes[i] = (char)(zt_irand(0, 3) ? zt_irand(0x80, 0xF5) : zt_irand(0x20, 0x7E));
        zsi_buf whole = {0};
        zsi_buf_json_str(&whole, bytes, (size_t)n);
        cJSON *j = cJSON_Parse(whole.p);
        ZT_CHECK(cJSON_IsString(j) && zsi_utf8_valid(j->valuestring, strlen(j->valuestring)),
                 "round %d: valid JSON of valid UTF-8", round);
        /* pieces: hold back like a stream, then flush at the end */
        zsi_buf joined = {0};
        size_t sent = 0;
        for (int end = 1; end <= n; end++) {
            size_t to = end == n ? (size_t)n : zsi_utf8_complete(bytes, (size_t)end);
            if (to > sent) {
                zsi_buf piece = {0};
                zsi_buf_json_str(&piece, bytes + sent, to - sent);
                zsi_buf_add(&joined, piece.p + 1, piece.len - 2); /* without quotes */
                zsi_buf_free(&piece);
                sent = to;
            }
        }
        ZT_CHECK(joined.len + 2 == whole.len && !memcmp(joined.p, whole.p + 1, joined.len),
                 "round %d: pieces give the whole text", round);
        cJSON_Delete(j);
        zsi_buf_free(&whole);
        zsi_buf_free(&joined);
    }
    zt_section("text.c: UTF-8, hold-back, JSON strings whole = in pieces");
}

/* ---- streams against whole answers ---------------------------------------------------- */

#define MAXN 3

static int stopped; /* choices ended by a stop string */

typedef struct result {
    char *text[MAXN];      /* bytes, unescaped (NUL included) */
    size_t len[MAXN];
    char finish[MAXN][16];
    int tokens[MAXN];      /* logprob entries */
    double usage;          /* completion tokens */
    bool echo;             /* the text begins with the prompt */
} result;

static void result_free(result *r)
{
    for (int k = 0; k < MAXN; k++)
        free(r->text[k]);
}

static void append(char **s, size_t *len, const char *t, size_t n)
{
    *s = realloc(*s, *len + n + 1);
    memcpy(*s + *len, t, n);
    *len += n;
    (*s)[*len] = 0;
}

static int logprob_tokens(const cJSON *lp, bool chat)
{
    return cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(lp, chat ? "content" : "tokens"));
}

/* The p-th string value of key in json, unescaped into *out (malloc'd,
 * *n bytes: an escaped NUL stays, where cJSON would cut the text). The
 * server writes no spaces, so the key reads "key":" exactly, and escapes
 * only quote, backslash, \n, \r, \t and \u00XX. */
static bool raw_string(const char *json, const char *key, int p, char **out, size_t *n)
{
    char pat[32];
    snprintf(pat, sizeof pat, "\"%s\":\"", key);
    const char *at = json;
    for (int i = 0; at && i <= p; i++)
        if ((at = strstr(at, pat)))
            at += strlen(pat);
    if (!at)
        return false;
    *out = malloc(strlen(at) + 1);
    *n = 0;
    for (const char *e = at; *e && *e != '"'; e++) {
        char c = *e;
        if (c == '\\') {
            c = *++e;
            if (c == 'n' || c == 'r' || c == 't')
                c = c == 'n' ? '\n' : c == 'r' ? '\r' : '\t';
            else if (c == 'u') {
                c = (char)strtol((char[]){e[1], e[2], e[3], e[4], 0}, NULL, 16);
                e += 4;
            }
        }
        (*out)[(*n)++] = c;
    }
    return true;
}

/* Adds the p-th choice c of json (whole, or a chunk) to r; false on a
 * malformed choice. */
static bool add_choice(const char *json, int p, const cJSON *c, bool chat, bool stream,
                       result *r, char *const *stops, int n_stop)
{
    const cJSON *idx = cJSON_GetObjectItemCaseSensitive(c, "index");
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(c, "finish_reason");
    if (!cJSON_IsNumber(idx) || idx->valueint < 0 || idx->valueint >= MAXN)
        return false;
    int k = idx->valueint;
    char *t = NULL;
    size_t n = 0;
    if (!raw_string(json, chat ? "content" : "text", p, &t, &n))
        return false;
    for (int i = 0; stream && !r->echo && i < n_stop; i++)
        if (memmem(t, n, stops[i], strlen(stops[i]))) {
            free(t);
            return false; /* a chunk never shows a stop string */
        }
    append(&r->text[k], &r->len[k], t, n);
    free(t);
    if (cJSON_IsString(f))
        snprintf(r->finish[k], sizeof r->finish[k], "%s", f->valuestring);
    r->tokens[k] += logprob_tokens(cJSON_GetObjectItemCaseSensitive(c, "logprobs"), chat);
    return true;
}

static bool collect(const char *json, bool chat, bool stream, result *r, char *const *stops,
                    int n_stop)
{
    cJSON *j = cJSON_Parse(json);
    const cJSON *ch = cJSON_GetObjectItemCaseSensitive(j, "choices");
    const cJSON *u = cJSON_GetObjectItemCaseSensitive(j, "usage");
    const cJSON *ct = cJSON_GetObjectItemCaseSensitive(u, "completion_tokens");
    bool ok = cJSON_IsArray(ch);
    int p = 0;
    for (const cJSON *c = ok ? ch->child : NULL; c && ok; c = c->next, p++)
        ok = add_choice(json, p, c, chat, stream, r, stops, n_stop);
    if (cJSON_IsNumber(ct))
        r->usage = ct->valuedouble;
    cJSON_Delete(j);
    return ok;
}

static void compare(int port, int seed)
{
    static const char *const stop_sets[][2] = {
        {"e", NULL}, {"th", "ig"}, {" l", "ord"}, {"ght", "\xC3\xA9"}, {NULL, NULL}};
    bool chat = seed % 3 == 0;
    int n = 1 + seed % MAXN, set = seed % 5;
    char *stops[2];
    int n_stop = 0;
    for (int i = 0; i < 2 && stop_sets[set][i]; i++)
        stops[n_stop++] = (char *)stop_sets[set][i];
    char stop_json[64] = "null";
    if (n_stop)
        snprintf(stop_json, sizeof stop_json, "[\"%s\"%s%s%s]", stops[0], n_stop > 1 ? ",\"" : "",
                 n_stop > 1 ? stops[1] : "", n_stop > 1 ? "\"" : "");
    char body[1024], sbody[1100];
    if (chat)
        snprintf(body, sizeof body, "{\"messages\": [{\"role\": \"user\", \"content\": \"The "
                 "light\"}], \"max_tokens\": %d, \"n\": %d, \"seed\": %d, \"stop\": %s, "
                 "\"logprobs\": %s", 1 + seed % 40, n, seed, stop_json,
                 seed % 2 ? "true, \"top_logprobs\": 2" : "false");
    else
        snprintf(body, sizeof body, "{\"prompt\": \"In the beginning\", \"max_tokens\": %d, "
                 "\"n\": %d, \"seed\": %d, \"stop\": %s, \"echo\": %s%s", 1 + seed % 40, n,
                 seed, stop_json, seed % 4 == 1 ? "true" : "false",
                 seed % 2 ? ", \"logprobs\": 2" : "");
    snprintf(sbody, sizeof sbody, "%s, \"stream\": true, \"stream_options\": "
             "{\"include_usage\": true}}", body);
    strcat(body, "}");
    const char *path = chat ? "/v1/chat/completions" : "/v1/completions";
    result whole = {.echo = !chat && seed % 4 == 1}, streamed = {.echo = whole.echo};
    zt_resp r;
    bool ok = zt_request(port, "POST", path, NULL, body, strlen(body), &r) == 200 &&
              collect(r.body, chat, false, &whole, stops, n_stop);
    ZT_CHECK(ok, "seed %d: whole answer: %.300s", seed, r.body ? r.body : "");
    zt_resp_free(&r);
    zt_sse s;
    bool sok = zt_sse_open(port, path, sbody, NULL, &s) && s.head.status == 200;
    bool done = false;
    for (char *ev; sok && (ev = zt_sse_next(&s)); free(ev)) {
        if (!strcmp(ev, "[DONE]"))
            done = true;
        else
            sok = !done && collect(ev, chat, true, &streamed, stops, n_stop);
        if (!sok)
            fprintf(stderr, "seed %d: bad chunk %.300s\n", seed, ev);
    }
    zt_sse_close(&s);
    ZT_CHECK(sok && done, "seed %d: a well-formed stream ending in [DONE]", seed);
    for (int k = 0; ok && sok && k < n; k++) {
        ZT_CHECK(whole.text[k] && streamed.text[k] && whole.len[k] == streamed.len[k] &&
                 !memcmp(whole.text[k], streamed.text[k], whole.len[k]),
                 "seed %d choice %d: stream '%s' != whole '%s'", seed, k,
                 streamed.text[k] ? streamed.text[k] : "(none)",
                 whole.text[k] ? whole.text[k] : "(none)");
        ZT_CHECK(whole.finish[k][0] && !strcmp(whole.finish[k], streamed.finish[k]),
                 "seed %d choice %d: finish %s vs %s", seed, k, whole.finish[k],
                 streamed.finish[k]);
        stopped += n_stop > 0 && !strcmp(whole.finish[k], "stop");
        ZT_CHECK(whole.tokens[k] == streamed.tokens[k], "seed %d choice %d: %d vs %d logprob "
                 "tokens", seed, k, whole.tokens[k], streamed.tokens[k]);
        for (int i = 0; i < n_stop && whole.text[k] && !whole.echo; i++)
            ZT_CHECK(!memmem(whole.text[k], whole.len[k], stops[i], strlen(stops[i])),
                     "seed %d: '%s' in the text", seed, stops[i]);
    }
    ZT_CHECK(whole.usage > 0 && whole.usage == streamed.usage, "seed %d: usage %g vs %g",
             seed, whole.usage, streamed.usage);
    result_free(&whole);
    result_free(&streamed);
}

int main(void)
{
    test_utf8();
    zs_bpe *b = zt_serve_bpe();
    zs_llm *m = b ? zt_serve_llm(b, 256, 2, 64) : NULL;
    zs_server_config c = {.engine.kv_blocks = 256};
    zs_server *s = m ? zs_server_start(m, b, &c) : NULL;
    ZT_CHECK(s != NULL, "server");
    for (int seed = 1; s && seed <= 60; seed++)
        compare(zs_server_port(s), seed);
    ZT_CHECK(stopped >= 10, "only %d choices met a stop string", stopped);
    printf("%d choices ended by a stop string\n", stopped);
    zt_section("streams = whole answers (60 requests), no stop string in any chunk");
    zs_server_free(s);
    zs_llm_free(m);
    zs_bpe_free(b);
    return zt_done();
}
