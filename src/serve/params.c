/*
 * params.c - OpenAI request bodies into zsi_params: every field is checked
 * for its JSON type and range before anything reaches the engine, and the
 * message names the field ("temperature: expected a number in [0, 2], got
 * -1"). Unknown fields are ignored; fields whose non-default values ask
 * for something the server does not do (best_of > n, suffix, logit_bias,
 * tools) are refused rather than silently dropped. The engine still checks
 * what only it knows (the prompt against the context, ids against the
 * vocabulary) and its refusals become 400 too (server.c).
 */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve/internal.h"

void zsi_err_set(zsi_err *e, int status, const char *type, const char *param,
                 const char *fmt, ...)
{
    e->status = status;
    e->type = type;
    e->code = NULL;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
}

/* A 400 for a bad field: fills e, returns false. */
__attribute__((format(printf, 3, 4))) static bool bad(zsi_err *e, const char *param,
                                                      const char *fmt, ...)
{
    e->status = 400;
    e->type = "invalid_request_error";
    e->code = NULL;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    return false;
}

cJSON *zsi_json_parse(zs_server *s, const char *body, size_t n, zsi_err *e)
{
    if (n == 0) {
        bad(e, NULL, "the request has no body: expected a JSON object");
        return NULL;
    }
    if (!zsi_utf8_valid(body, n)) {
        bad(e, NULL, "the body is not valid UTF-8");
        return NULL;
    }
    const char *end = NULL;
    pthread_mutex_lock(&s->json_mu);
    cJSON *j = cJSON_ParseWithLengthOpts(body, n, &end, false);
    pthread_mutex_unlock(&s->json_mu);
    size_t at = end && end >= body && end <= body + n ? (size_t)(end - body) : 0;
    if (!j) {
        bad(e, NULL, "the body is not valid JSON (at byte %zu of %zu; arrays and "
            "objects nest at most 1000 deep)", at, n);
        return NULL;
    }
    while (at < n && strchr(" \t\r\n", body[at]))
        at++;
    if (at < n)
        bad(e, NULL, "the body has more after its JSON value (at byte %zu)", at);
    else if (!cJSON_IsObject(j))
        bad(e, NULL, "the body is JSON but not an object");
    if (at < n || !cJSON_IsObject(j)) {
        cJSON_Delete(j);
        return NULL;
    }
    return j;
}

/* ---- typed fields -------------------------------------------------------- */

static const char *type_name(const cJSON *v)
{
    if (cJSON_IsString(v))
        return "a string";
    if (cJSON_IsNumber(v))
        return "a number";
    if (cJSON_IsBool(v))
        return "a boolean";
    if (cJSON_IsArray(v))
        return "an array";
    if (cJSON_IsObject(v))
        return "an object";
    return "null";
}

/* What v is, for messages: its type, or its value when a number. */
static const char *describe(const cJSON *v, char *buf, size_t n)
{
    if (!cJSON_IsNumber(v))
        return type_name(v);
    snprintf(buf, n, "%g", v->valuedouble);
    return buf;
}

/* The field, or NULL when absent or null (the default applies). */
static const cJSON *field(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return v && !cJSON_IsNull(v) ? v : NULL;
}

/* A number in [lo, hi] ((lo, hi] when lo_open) into *out; absent: kept. */
static bool num(const cJSON *o, const char *k, double lo, double hi, bool lo_open,
                double *out, zsi_err *e)
{
    const cJSON *v = field(o, k);
    if (!v)
        return true;
    if (!cJSON_IsNumber(v))
        return bad(e, k, "%s: expected a number, got %s", k, type_name(v));
    double x = v->valuedouble;
    if (!isfinite(x) || x < lo || x > hi || (lo_open && x == lo))
        return bad(e, k, "%s: expected a number in %c%g, %g], got %g", k,
                   lo_open ? '(' : '[', lo, hi, x);
    *out = x;
    return true;
}

/* An integral number in [lo, hi] (both within 2^53) into *out. */
static bool integer(const cJSON *o, const char *k, double lo, double hi, int64_t *out,
                    zsi_err *e)
{
    const cJSON *v = field(o, k);
    if (!v)
        return true;
    double x = v->valuedouble;
    char d[32];
    if (!cJSON_IsNumber(v) || !isfinite(x) || x != floor(x) || x < lo || x > hi)
        return bad(e, k, "%s: expected an integer in [%.0f, %.0f], got %s", k, lo, hi,
                   describe(v, d, sizeof d));
    *out = (int64_t)x;
    return true;
}

static bool boolean(const cJSON *o, const char *k, bool *out, zsi_err *e)
{
    const cJSON *v = field(o, k);
    if (!v)
        return true;
    if (!cJSON_IsBool(v))
        return bad(e, k, "%s: expected a boolean, got %s", k, type_name(v));
    *out = cJSON_IsTrue(v);
    return true;
}

static bool string(const cJSON *o, const char *k, const char **out, zsi_err *e)
{
    const cJSON *v = field(o, k);
    if (!v)
        return true;
    if (!cJSON_IsString(v))
        return bad(e, k, "%s: expected a string, got %s", k, type_name(v));
    *out = v->valuestring;
    return true;
}

/* The seed: any integer a 64-bit signed or unsigned value holds. */
static bool seed(const cJSON *o, zs_sampler *sp, bool *given, zsi_err *e)
{
    const cJSON *v = field(o, "seed");
    if (!v)
        return true;
    double x = v->valuedouble;
    char d[32];
    if (!cJSON_IsNumber(v) || !isfinite(x) || x != floor(x) || x < -9223372036854775808.0 ||
        x >= 18446744073709551616.0)
        return bad(e, "seed", "seed: expected an integer of at most 64 bits, got %s",
                   describe(v, d, sizeof d));
    sp->seed = x >= 0 ? (uint64_t)x : (uint64_t)(int64_t)x;
    *given = true;
    return true;
}

/* ---- prompts --------------------------------------------------------------- */

bool zsi_encode(zs_server *s, const char *text, size_t n, int32_t **ids, int64_t *n_ids,
                zsi_err *e)
{
    size_t k = 0;
    if (zs_bpe_encode(s->tok, text, n, 0, ids, &k) != ZS_OK) {
        zsi_err_set(e, 500, "server_error", NULL, "tokenizer: %s", zs_last_error());
        return false;
    }
    if (k == 0) { /* an empty prompt starts from end of text, as zs generate */
        free(*ids);
        if (!(*ids = malloc(sizeof **ids))) {
            zsi_err_set(e, 500, "server_error", NULL, "out of memory");
            return false;
        }
        (*ids)[k++] = s->eot >= 0 ? s->eot : 0;
    }
    *n_ids = (int64_t)k;
    return true;
}

/* Token ids given as a JSON array. */
bool zsi_token_array(const cJSON *a, const char *k, int32_t **ids, int64_t *n, zsi_err *e)
{
    int len = cJSON_GetArraySize(a);
    if (len == 0)
        return bad(e, k, "%s: an empty array", k);
    if (!(*ids = malloc((size_t)len * sizeof **ids))) {
        zsi_err_set(e, 500, "server_error", NULL, "out of memory");
        return false;
    }
    int i = 0;
    for (const cJSON *v = a->child; v; v = v->next, i++) {
        double x = v->valuedouble;
        char d[32];
        if (!cJSON_IsNumber(v) || x != floor(x) || x < 0 || x > 2147483647.0)
            return bad(e, k, "%s: token %d is not an integer id (got %s)", k, i,
                       describe(v, d, sizeof d));
        (*ids)[i] = (int32_t)x;
    }
    *n = len;
    return true;
}

/* What an element of a prompt array is, for messages. */
static const char *prompt_kind(const cJSON *v)
{
    return cJSON_IsString(v) ? "a string" : cJSON_IsNumber(v) ? "a token id"
           : cJSON_IsArray(v) ? "an array of token ids" : type_name(v);
}

/* The elements of the prompt array a are all strings, all token ids (one
 * prompt) or all arrays of token ids (OpenAI refuses a mix too). */
static bool uniform(const cJSON *a, zsi_err *e)
{
    const cJSON *first = a->child;
    if (!cJSON_IsString(first) && !cJSON_IsNumber(first) && !cJSON_IsArray(first))
        return bad(e, "prompt", "prompt[0]: expected a string, a token id or an array of "
                   "token ids, got %s", type_name(first));
    int i = 0;
    for (const cJSON *x = first; x; x = x->next, i++)
        if (strcmp(prompt_kind(x), prompt_kind(first)))
            return bad(e, "prompt", "prompt[%d]: expected %s like prompt[0], got %s (a "
                       "prompt array holds strings, token ids or arrays of token ids, "
                       "not a mix)", i, prompt_kind(first), prompt_kind(x));
    return true;
}

/* Appends the prompt v (a string or an array of token ids, called name in
 * messages) to p->prompts, which has room for it. */
static bool add_prompt(zs_server *s, const cJSON *v, const char *name, zsi_params *p,
                       zsi_err *e)
{
    zsi_prompt *q = &p->prompts[p->n_prompts++]; /* freed with p, also on failure */
    if (cJSON_IsString(v))
        return zsi_encode(s, v->valuestring, strlen(v->valuestring), &q->ids, &q->n, e);
    return zsi_token_array(v, name, &q->ids, &q->n, e);
}

/* "prompt": a string, an array of token ids (one prompt), an array of
 * strings or an array of arrays of token ids (a prompt each), with
 * n_prompts * n <= ZSI_MAX_N (p->n is known). */
static bool completion_prompt(zs_server *s, const cJSON *req, zsi_params *p, zsi_err *e)
{
    const cJSON *v = field(req, "prompt");
    if (!v)
        return bad(e, "prompt", "prompt: required");
    if (!cJSON_IsString(v) && !cJSON_IsArray(v))
        return bad(e, "prompt", "prompt: expected a string, an array of strings, an array "
                   "of token ids or an array of arrays of token ids, got %s", type_name(v));
    if (cJSON_IsArray(v) && !v->child)
        return bad(e, "prompt", "prompt: an empty array (expected at least one prompt)");
    if (cJSON_IsArray(v) && !uniform(v, e))
        return false;
    bool list = cJSON_IsArray(v) && !cJSON_IsNumber(v->child);
    int count = list ? cJSON_GetArraySize(v) : 1;
    if (count > ZSI_MAX_N / p->n)
        return bad(e, "prompt", "prompt: %d prompts with n = %d ask for %lld choices; a "
                   "request may have at most %d (prompts times n)", count, p->n,
                   (long long)count * p->n, ZSI_MAX_N);
    if (!(p->prompts = calloc((size_t)count, sizeof *p->prompts))) {
        zsi_err_set(e, 500, "server_error", NULL, "out of memory");
        return false;
    }
    if (!list)
        return add_prompt(s, v, "prompt", p, e);
    int i = 0;
    for (const cJSON *x = v->child; x; x = x->next, i++) {
        char name[32];
        snprintf(name, sizeof name, "prompt[%d]", i);
        if (!add_prompt(s, x, name, p, e))
            return false;
    }
    return true;
}

/* One message's content: a string or text parts, appended to out. */
static bool content(const cJSON *c, int i, zsi_buf *out, zsi_err *e)
{
    if (!c || cJSON_IsNull(c))
        return true;
    if (cJSON_IsString(c)) {
        zsi_buf_puts(out, c->valuestring);
        return true;
    }
    if (!cJSON_IsArray(c))
        return bad(e, "messages", "messages[%d].content: expected a string or an array "
                   "of text parts, got %s", i, type_name(c));
    for (const cJSON *part = c->child; part; part = part->next) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(part, "type");
        const cJSON *x = cJSON_GetObjectItemCaseSensitive(part, "text");
        if (!cJSON_IsObject(part) || !cJSON_IsString(t) || strcmp(t->valuestring, "text") ||
            !cJSON_IsString(x))
            return bad(e, "messages", "messages[%d].content: only parts {\"type\": "
                       "\"text\", \"text\": STRING} are supported", i);
        zsi_buf_puts(out, x->valuestring);
    }
    return true;
}

bool zsi_chat_prompt(const cJSON *messages, zsi_buf *out, zsi_err *e)
{
    static const char *const roles[] = {"system", "developer", "user", "assistant", "tool"};
    if (!cJSON_IsArray(messages) || cJSON_GetArraySize(messages) == 0)
        return bad(e, "messages", "messages: expected a non-empty array of messages, "
                   "got %s", messages ? type_name(messages) : "nothing");
    int i = 0;
    for (const cJSON *m = messages->child; m; m = m->next, i++) {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        bool known = false;
        for (size_t r = 0; cJSON_IsString(role) && r < sizeof roles / sizeof *roles; r++)
            known = known || !strcmp(role->valuestring, roles[r]);
        if (!cJSON_IsObject(m) || !known)
            return bad(e, "messages", "messages[%d]: expected an object with a role of "
                       "system, developer, user, assistant or tool", i);
        zsi_buf_printf(out, "<|%s|>\n", role->valuestring);
        if (!content(cJSON_GetObjectItemCaseSensitive(m, "content"), i, out, e))
            return false;
        zsi_buf_puts(out, "\n");
    }
    zsi_buf_puts(out, "<|assistant|>\n");
    if (out->oom)
        zsi_err_set(e, 500, "server_error", NULL, "out of memory");
    return !out->oom;
}

/* Chat: one prompt, the template of the messages. */
static bool chat_prompt(zs_server *s, const cJSON *req, zsi_params *p, zsi_err *e)
{
    zsi_buf t = {0};
    if (!(p->prompts = calloc(1, sizeof *p->prompts))) {
        zsi_err_set(e, 500, "server_error", NULL, "out of memory");
        return false;
    }
    p->n_prompts = 1;
    bool ok = zsi_chat_prompt(cJSON_GetObjectItemCaseSensitive(req, "messages"), &t, e) &&
              zsi_encode(s, t.p, t.len, &p->prompts[0].ids, &p->prompts[0].n, e);
    zsi_buf_free(&t);
    return ok;
}

/* ---- the request --------------------------------------------------------- */

static bool stops(const cJSON *req, zsi_params *p, zsi_err *e)
{
    const cJSON *v = field(req, "stop");
    if (!v)
        return true;
    if (cJSON_IsArray(v) && cJSON_GetArraySize(v) > ZSI_MAX_STOP)
        return bad(e, "stop", "stop: at most %d strings", ZSI_MAX_STOP);
    if (!cJSON_IsString(v) && !cJSON_IsArray(v))
        return bad(e, "stop", "stop: expected a string or an array of strings, got %s",
                   type_name(v));
    for (const cJSON *x = cJSON_IsString(v) ? v : v->child; x;
         x = cJSON_IsString(v) ? NULL : x->next) {
        if (!cJSON_IsString(x) || !x->valuestring[0])
            return bad(e, "stop", "stop: expected non-empty strings");
        if (!(p->stop[p->n_stop++] = strdup(x->valuestring))) {
            p->n_stop--;
            zsi_err_set(e, 500, "server_error", NULL, "out of memory");
            return false;
        }
    }
    return true;
}

/* What the server does not do, refused when asked for. */
static bool unsupported(const cJSON *req, const zsi_params *p, zsi_err *e)
{
    const cJSON *v;
    if ((v = field(req, "best_of")) && !(cJSON_IsNumber(v) && v->valuedouble == p->n))
        return bad(e, "best_of", "best_of: only best_of = n is supported");
    if ((v = field(req, "suffix")) && !(cJSON_IsString(v) && !v->valuestring[0]))
        return bad(e, "suffix", "suffix: not supported");
    if ((v = field(req, "logit_bias")) && !(cJSON_IsObject(v) && !v->child))
        return bad(e, "logit_bias", "logit_bias: not supported");
    if ((v = field(req, "tools")) && !(cJSON_IsArray(v) && !v->child))
        return bad(e, "tools", "tools: not supported");
    return true;
}

static bool sampling(const cJSON *req, zsi_params *p, bool *seeded, zsi_err *e)
{
    zs_sampler *sp = &p->sampling;
    int64_t top_k = 0;
    *sp = (zs_sampler){.temperature = 1, .top_p = 1};
    return num(req, "temperature", 0, 2, false, &sp->temperature, e) &&
           num(req, "top_p", 0, 1, true, &sp->top_p, e) &&
           integer(req, "top_k", -1, 1e9, &top_k, e) &&
           num(req, "min_p", 0, 1, false, &sp->min_p, e) &&
           num(req, "presence_penalty", -2, 2, false, &sp->presence_penalty, e) &&
           num(req, "frequency_penalty", -2, 2, false, &sp->frequency_penalty, e) &&
           num(req, "repetition_penalty", 0, 10, true, &sp->repetition_penalty, e) &&
           seed(req, sp, seeded, e) && ((sp->top_k = top_k > 0 ? (int)top_k : 0), true);
}

/* "logprobs": an integer 0..5 for completions; true + "top_logprobs"
 * 0..20 for chat. */
static bool logprobs(const cJSON *req, zsi_params *p, zsi_err *e)
{
    int64_t k = 0;
    if (!p->chat) {
        bool ok = integer(req, "logprobs", 0, 5, &k, e);
        p->logprobs = ok && field(req, "logprobs");
        p->top_logprobs = (int)k;
        return ok;
    }
    if (!boolean(req, "logprobs", &p->logprobs, e) ||
        !integer(req, "top_logprobs", 0, 20, &k, e))
        return false;
    if (field(req, "top_logprobs") && !p->logprobs)
        return bad(e, "top_logprobs", "top_logprobs: needs \"logprobs\": true");
    p->top_logprobs = (int)k;
    return true;
}

bool zsi_check_model(zs_server *s, const cJSON *req, zsi_err *e)
{
    const char *name = NULL;
    if (!string(req, "model", &name, e))
        return false;
    if (name && strcmp(name, s->model)) {
        zsi_err_set(e, 404, "invalid_request_error", "model", "the model '%.200s' does "
                    "not exist; this server has '%.100s'", name, s->model);
        e->code = "model_not_found";
        return false;
    }
    return true;
}

bool zsi_params_parse(zs_server *s, const cJSON *req, bool chat, zsi_params *p, zsi_err *e)
{
    *p = (zsi_params){.chat = chat, .n = 1, .max_tokens = chat ? 0 : 16};
    int64_t n = 1, max_tokens = p->max_tokens;
    bool seeded = false;
    const cJSON *so = field(req, "stream_options");
    if (!zsi_check_model(s, req, e) || !sampling(req, p, &seeded, e) ||
        !integer(req, "n", 1, ZSI_MAX_N, &n, e) ||
        !integer(req, "max_tokens", 1, 1e9, &max_tokens, e) ||
        (chat && !integer(req, "max_completion_tokens", 1, 1e9, &max_tokens, e)) ||
        !boolean(req, "stream", &p->stream, e) || !boolean(req, "echo", &p->echo, e) ||
        !boolean(req, "ignore_eos", &p->ignore_eos, e) || !logprobs(req, p, e) ||
        !stops(req, p, e))
        return false;
    if (so && !cJSON_IsObject(so))
        return bad(e, "stream_options", "stream_options: expected an object, got %s",
                   type_name(so));
    if (so && !boolean(so, "include_usage", &p->include_usage, e))
        return false;
    p->n = (int)n;
    p->max_tokens = max_tokens;
    p->echo = p->echo && !chat;
    if (!seeded) { /* a seed of its own per request */
        pthread_mutex_lock(&s->mu);
        uint64_t z = (s->seed_base += 0x9E3779B97F4A7C15ull);
        pthread_mutex_unlock(&s->mu);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        p->sampling.seed = z ^ (z >> 31);
    }
    if (!unsupported(req, p, e) ||
        !(chat ? chat_prompt(s, req, p, e) : completion_prompt(s, req, p, e)))
        return false;
    p->n_choices = p->n_prompts * p->n;
    return true;
}

int64_t zsi_prompt_tokens(const zsi_params *p)
{
    int64_t n = 0;
    for (int i = 0; i < p->n_prompts; i++)
        n += p->prompts[i].n;
    return n;
}

void zsi_params_free(zsi_params *p)
{
    for (int i = 0; i < p->n_prompts; i++)
        free(p->prompts[i].ids);
    free(p->prompts);
    for (int i = 0; i < p->n_stop; i++)
        free(p->stop[i]);
    *p = (zsi_params){0};
}
