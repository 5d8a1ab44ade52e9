/*
 * respond.c - the endpoints' answers in OpenAI's shapes: completions and
 * chat completions as one JSON object (streams: stream.c), the model
 * list, tokenize and detokenize.
 *
 * A generation handler parses and validates the body (params.c), hands
 * the job to the engine thread and blocks on the job's condition variable
 * (this is a connection's own thread) until the job is done, or, for a
 * stream, until the engine has accepted it, so that a request the engine
 * refuses gets its 400 before any event is sent. A client that hangs up
 * meanwhile ends the wait: the connection closes and its job is aborted.
 *
 * Logprobs: completions give OpenAI's legacy object (tokens,
 * token_logprobs, top_logprobs as {token: logprob}, text_offset in bytes);
 * with echo the prompt's tokens come first with null log probabilities
 * (prompt scoring is not computed). Chat gives {"content": [{token,
 * logprob, bytes, top_logprobs}]}. A token that does not decode to UTF-8
 * alone shows U+FFFD in "token"; "bytes" has its exact bytes.
 */
#include <cjson/cJSON.h>
#include <microhttpd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "serve/internal.h"

void zsi_json_head(zs_server *s, const char *id, const char *object, zsi_buf *b)
{
    zsi_buf_printf(b, "{\"id\":\"%s\",\"object\":\"%s\",\"created\":%lld,\"model\":", id,
                   object, (long long)time(NULL));
    zsi_buf_json_str(b, s->model, strlen(s->model));
}

void zsi_json_usage(const zsi_job *j, zsi_buf *b)
{
    int64_t in = zsi_prompt_tokens(&j->p), out = 0;
    for (int k = 0; k < j->p.n_choices; k++)
        out += j->s[k].n_tok;
    zsi_buf_printf(b, "{\"prompt_tokens\":%lld,\"completion_tokens\":%lld,"
                   "\"total_tokens\":%lld}", (long long)in, (long long)out,
                   (long long)(in + out));
}

static void token_str(zs_server *s, int32_t id, zsi_buf *b)
{
    size_t len = 0;
    const uint8_t *t = id >= 0 ? zs_bpe_token(s->tok, id, &len) : NULL;
    zsi_buf_json_str(b, (const char *)t, t ? len : 0);
}

static void token_bytes(zs_server *s, int32_t id, zsi_buf *b)
{
    size_t len = 0;
    const uint8_t *t = id >= 0 ? zs_bpe_token(s->tok, id, &len) : NULL;
    zsi_buf_puts(b, "[");
    for (size_t i = 0; t && i < len; i++)
        zsi_buf_printf(b, "%s%u", i ? "," : "", t[i]);
    zsi_buf_puts(b, "]");
}

static void chat_logprobs(zs_server *s, const zsi_job *j, int k, int64_t from, int64_t to,
                          zsi_buf *b)
{
    const zsi_sample *sm = &j->s[k];
    int K = j->p.top_logprobs;
    zsi_buf_puts(b, "{\"content\":[");
    for (int64_t t = from; t < to; t++) {
        zsi_buf_puts(b, t > from ? ",{\"token\":" : "{\"token\":");
        token_str(s, sm->ids[t], b);
        zsi_buf_puts(b, ",\"logprob\":");
        zsi_buf_json_num(b, sm->lps[t]);
        zsi_buf_puts(b, ",\"bytes\":");
        token_bytes(s, sm->ids[t], b);
        zsi_buf_puts(b, ",\"top_logprobs\":[");
        for (int i = 0, w = 0; i < K; i++) {
            int32_t id = sm->top_ids[t * K + i];
            if (id < 0)
                continue;
            zsi_buf_puts(b, w++ ? ",{\"token\":" : "{\"token\":");
            token_str(s, id, b);
            zsi_buf_puts(b, ",\"logprob\":");
            zsi_buf_json_num(b, sm->top_lps[t * K + i]);
            zsi_buf_puts(b, ",\"bytes\":");
            token_bytes(s, id, b);
            zsi_buf_puts(b, "}");
        }
        zsi_buf_puts(b, "]}");
    }
    zsi_buf_puts(b, "]}");
}

static size_t bytes_of(zs_server *s, const int32_t *ids, int64_t n)
{
    size_t total = 0, len = 0;
    for (int64_t i = 0; i < n; i++)
        total += zs_bpe_token(s->tok, ids[i], &len) ? len : 0;
    return total;
}

/* Completions: the four parallel arrays; echo puts the tokens of choice
 * k's prompt first. Offsets count from the start of the choice's text
 * (which begins with its prompt when the request asked for echo). */
static void completion_logprobs(zs_server *s, const zsi_job *j, int k, int64_t from,
                                int64_t to, bool echo, zsi_buf *b)
{
    const zsi_sample *sm = &j->s[k];
    const zsi_prompt *pr = &j->p.prompts[k / j->p.n];
    int K = j->p.top_logprobs;
    int64_t np = echo ? pr->n : 0;
    size_t offset = echo ? 0 : (j->p.echo ? bytes_of(s, pr->ids, pr->n) : 0) +
                                   bytes_of(s, sm->ids, from);
    zsi_buf tokens = {0}, lps = {0}, tops = {0}, offs = {0};
    for (int64_t i = 0; i < np + to - from; i++) {
        bool prompt = i < np;
        int32_t id = prompt ? pr->ids[i] : sm->ids[from + i - np];
        const char *sep = i ? "," : "";
        zsi_buf_puts(&tokens, sep);
        token_str(s, id, &tokens);
        zsi_buf_printf(&offs, "%s%zu", sep, offset);
        size_t len = 0;
        offset += zs_bpe_token(s->tok, id, &len) ? len : 0;
        zsi_buf_puts(&lps, sep);
        zsi_buf_puts(&tops, sep);
        if (prompt) {
            zsi_buf_puts(&lps, "null");
            zsi_buf_puts(&tops, "null");
            continue;
        }
        int64_t t = from + i - np;
        zsi_buf_json_num(&lps, sm->lps[t]);
        zsi_buf_puts(&tops, "{");
        for (int a = 0, w = 0; a < K; a++) {
            int32_t alt = sm->top_ids[t * K + a];
            if (alt < 0)
                continue;
            zsi_buf_puts(&tops, w++ ? "," : "");
            token_str(s, alt, &tops);
            zsi_buf_puts(&tops, ":");
            zsi_buf_json_num(&tops, sm->top_lps[t * K + a]);
        }
        zsi_buf_puts(&tops, "}");
    }
    zsi_buf_printf(b, "{\"tokens\":[%s],\"token_logprobs\":[%s],\"top_logprobs\":[%s],"
                   "\"text_offset\":[%s]}", tokens.p ? tokens.p : "", lps.p ? lps.p : "",
                   tops.p ? tops.p : "", offs.p ? offs.p : "");
    b->oom |= tokens.oom || lps.oom || tops.oom || offs.oom;
    zsi_buf_free(&tokens), zsi_buf_free(&lps), zsi_buf_free(&tops), zsi_buf_free(&offs);
}

void zsi_json_logprobs(zs_server *s, const zsi_job *j, int k, int64_t from, int64_t to,
                       bool echo, zsi_buf *b)
{
    if (j->p.chat)
        chat_logprobs(s, j, k, from, to, b);
    else
        completion_logprobs(s, j, k, from, to, echo, b);
}

/* ---- whole answers ----------------------------------------------------------- */

void zsi_prompt_text(zs_server *s, const zsi_prompt *p, zsi_buf *out)
{
    char *t = NULL;
    size_t n = 0;
    if (zs_bpe_decode(s->tok, p->ids, (size_t)p->n, &t, &n) == ZS_OK)
        zsi_buf_add(out, t, n);
    else
        out->oom = true;
    free(t);
}

static void choice(zs_server *s, const zsi_job *j, int k, const zsi_buf *echo, zsi_buf *b)
{
    const zsi_sample *sm = &j->s[k];
    size_t keep = sm->keep >= 0 && (size_t)sm->keep <= sm->text.len ? (size_t)sm->keep
                                                                     : sm->text.len;
    zsi_buf text = {0};
    zsi_buf_add(&text, echo->p, echo->len);
    zsi_buf_add(&text, sm->text.p, keep);
    zsi_buf_printf(b, "%s{\"index\":%d,", k ? "," : "", k);
    zsi_buf_puts(b, j->p.chat ? "\"message\":{\"role\":\"assistant\",\"content\":"
                              : "\"text\":");
    zsi_buf_json_str(b, text.p, text.len);
    zsi_buf_puts(b, j->p.chat ? "},\"logprobs\":" : ",\"logprobs\":");
    if (j->p.logprobs)
        zsi_json_logprobs(s, j, k, 0, sm->n_tok, j->p.echo, b);
    else
        zsi_buf_puts(b, "null");
    const char *why = zs_finish_name(sm->finish);
    zsi_buf_printf(b, ",\"finish_reason\":\"%s\"}", why ? why : "stop");
    b->oom |= text.oom;
    zsi_buf_free(&text);
}

/* The whole answer: every prompt's n choices, prompt-major; with echo
 * each choice's text begins with its own prompt's. */
static int answer(zsi_conn *q, zsi_job *j)
{
    zs_server *s = q->s;
    zsi_buf b = {0}, echo = {0};
    zsi_json_head(s, q->id, j->p.chat ? "chat.completion" : "text_completion", &b);
    zsi_buf_puts(&b, ",\"choices\":[");
    for (int k = 0; k < j->p.n_choices; k++) {
        if (j->p.echo && k % j->p.n == 0) {
            b.oom |= echo.oom;
            zsi_buf_free(&echo);
            zsi_prompt_text(s, &j->p.prompts[k / j->p.n], &echo);
        }
        choice(s, j, k, &echo, &b);
    }
    zsi_buf_puts(&b, "],\"usage\":");
    zsi_json_usage(j, &b);
    zsi_buf_puts(&b, "}\n");
    b.oom |= echo.oom;
    zsi_buf_free(&echo);
    return zsi_reply(q, 200, &b, "application/json");
}

/* Waits for j: until done, or (streams) until the engine has taken it.
 * False when the client hung up meanwhile. */
static bool wait_job(zsi_conn *q, zsi_job *j, bool admitted_is_enough)
{
    bool gone = false;
    pthread_mutex_lock(&j->mu);
    while (!j->done && !(admitted_is_enough && j->admitted) && !gone) {
        zsi_timedwait(&j->cv, &j->mu, 0.1);
        gone = !j->done && zsi_client_gone(q);
    }
    pthread_mutex_unlock(&j->mu);
    return !gone;
}

static void new_id(zsi_conn *q, bool chat)
{
    zs_server *s = q->s;
    pthread_mutex_lock(&s->mu);
    uint64_t n = ++s->next_id, base = s->seed_base; /* params.c advances it */
    pthread_mutex_unlock(&s->mu);
    uint64_t z = n * 0x9E3779B97F4A7C15ull ^ base;
    snprintf(q->id, sizeof q->id, "%s-%016llx%08llx", chat ? "chatcmpl" : "cmpl",
             (unsigned long long)z, (unsigned long long)n & 0xffffffffull);
}

int zsi_handle_generate(zsi_conn *q, bool chat)
{
    zs_server *s = q->s;
    zsi_err e = {0};
    zsi_params p = {0};
    cJSON *req = zsi_json_parse(s, q->body.p, q->body.len, &e);
    bool ok = req && zsi_params_parse(s, req, chat, &p, &e);
    cJSON_Delete(req);
    zsi_buf_free(&q->body);
    zsi_job *j = ok ? zsi_job_new(&p) : NULL;
    zsi_params_free(&p);
    if (ok && !j)
        zsi_err_set(&e, 500, "server_error", NULL, "out of memory");
    if (!j)
        return zsi_reply_err(q, &e);
    new_id(q, chat);
    q->job = j;
    pthread_mutex_lock(&s->mu);
    s->answering++; /* on_completed counts it down */
    pthread_mutex_unlock(&s->mu);
    if (zsi_submit(s, j, &e))
        return zsi_reply_err(q, &e);
    if (!wait_job(q, j, j->p.stream))
        return MHD_NO; /* the client left: on_completed aborts the job */
    pthread_mutex_lock(&j->mu);
    if (j->fail_status && j->done) {
        zsi_err_set(&e, j->fail_status, j->fail_status == 400 ? "invalid_request_error"
                                                              : "server_error",
                    NULL, "%s", j->fail_msg);
        pthread_mutex_unlock(&j->mu);
        return zsi_reply_err(q, &e);
    }
    int r = j->p.stream ? MHD_YES : answer(q, j);
    pthread_mutex_unlock(&j->mu);
    return j->p.stream ? zsi_stream_start(q) : r;
}

/* ---- the small endpoints ----------------------------------------------------- */

static void model_json(zs_server *s, zsi_buf *b)
{
    zsi_buf_puts(b, "{\"id\":");
    zsi_buf_json_str(b, s->model, strlen(s->model));
    zsi_buf_printf(b, ",\"object\":\"model\",\"created\":%lld,\"owned_by\":\"zhisuan\","
                   "\"max_model_len\":%lld}", (long long)s->created, (long long)s->ctx);
}

int zsi_handle_models(zsi_conn *q, const char *url)
{
    zs_server *s = q->s;
    zsi_buf b = {0};
    const char *prefix = "/v1/models/";
    if (!strncmp(url, prefix, strlen(prefix))) {
        const char *name = url + strlen(prefix);
        if (strcmp(name, s->model)) {
            zsi_err e;
            zsi_err_set(&e, 404, "invalid_request_error", "model", "the model '%.200s' "
                        "does not exist; this server has '%.100s'", name, s->model);
            e.code = "model_not_found";
            return zsi_reply_err(q, &e);
        }
        model_json(s, &b);
    } else {
        zsi_buf_puts(&b, "{\"object\":\"list\",\"data\":[");
        model_json(s, &b);
        zsi_buf_puts(&b, "]}");
    }
    zsi_buf_puts(&b, "\n");
    return zsi_reply(q, 200, &b, "application/json");
}

/* The text to tokenize: "prompt" or "text", or chat "messages". */
static bool tokenize_text(const cJSON *req, zsi_buf *t, zsi_err *e)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(req, "prompt");
    v = v ? v : cJSON_GetObjectItemCaseSensitive(req, "text");
    if (cJSON_IsString(v)) {
        zsi_buf_puts(t, v->valuestring);
        return true;
    }
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(req, "messages");
    if (!v && m)
        return zsi_chat_prompt(m, t, e);
    zsi_err_set(e, 400, "invalid_request_error", "prompt", "expected \"prompt\" (or "
                "\"text\") as a string, or chat \"messages\"");
    return false;
}

int zsi_handle_tokenize(zsi_conn *q)
{
    zs_server *s = q->s;
    zsi_err e = {0};
    zsi_buf t = {0}, b = {0};
    int32_t *ids = NULL;
    size_t n = 0;
    cJSON *req = zsi_json_parse(s, q->body.p, q->body.len, &e);
    bool ok = req && zsi_check_model(s, req, &e) && tokenize_text(req, &t, &e);
    cJSON_Delete(req);
    if (ok && zs_bpe_encode(s->tok, t.p ? t.p : "", t.len, 0, &ids, &n) != ZS_OK) {
        zsi_err_set(&e, 500, "server_error", NULL, "tokenizer: %s", zs_last_error());
        ok = false;
    }
    zsi_buf_free(&t);
    if (!ok)
        return zsi_reply_err(q, &e);
    zsi_buf_puts(&b, "{\"tokens\":[");
    for (size_t i = 0; i < n; i++)
        zsi_buf_printf(&b, "%s%d", i ? "," : "", ids[i]);
    zsi_buf_printf(&b, "],\"count\":%zu,\"max_model_len\":%lld}\n", n, (long long)s->ctx);
    free(ids);
    return zsi_reply(q, 200, &b, "application/json");
}

int zsi_handle_detokenize(zsi_conn *q)
{
    zs_server *s = q->s;
    zsi_err e = {0};
    int32_t *ids = NULL;
    int64_t n = 0;
    char *text = NULL;
    size_t len = 0;
    cJSON *req = zsi_json_parse(s, q->body.p, q->body.len, &e);
    const cJSON *a = req ? cJSON_GetObjectItemCaseSensitive(req, "tokens") : NULL;
    bool ok = req && zsi_check_model(s, req, &e);
    if (ok && !cJSON_IsArray(a))
        ok = (zsi_err_set(&e, 400, "invalid_request_error", "tokens",
                          "tokens: expected an array of token ids"), false);
    ok = ok && (!a->child || zsi_token_array(a, "tokens", &ids, &n, &e));
    cJSON_Delete(req);
    if (ok && zs_bpe_decode(s->tok, ids, (size_t)n, &text, &len) != ZS_OK) {
        zsi_err_set(&e, 400, "invalid_request_error", "tokens", "tokens: %s",
                    zs_last_error());
        ok = false;
    }
    free(ids);
    if (!ok) {
        free(text);
        return zsi_reply_err(q, &e);
    }
    zsi_buf b = {0};
    zsi_buf_puts(&b, "{\"prompt\":");
    zsi_buf_json_str(&b, text, len);
    zsi_buf_puts(&b, ",\"text\":");
    zsi_buf_json_str(&b, text, len);
    zsi_buf_puts(&b, "}\n");
    free(text);
    return zsi_reply(q, 200, &b, "application/json");
}
