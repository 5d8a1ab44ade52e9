/*
 * http.c - the server's libmicrohttpd plumbing: the daemon (a thread per
 * connection, so a handler may block on its job), routing, methods,
 * authentication, request bodies under the size limit, replies and
 * OpenAI's error object, and the end of each request (metrics, the log,
 * aborting the generation of a client that left).
 *
 * Per request, the access handler runs first when the headers are in
 * (route, method, key, Content-Length: answered at once when wrong, before
 * any body is read), then once per piece of body, then when the body is
 * complete, when the route's handler answers. libmicrohttpd's own error
 * log stays off: a hostile client must not be able to fill the terminal.
 *
 * Connection slots (docs/serve.md, "Under load"): every connection is a
 * thread, counted from libmicrohttpd's STARTED to its CLOSED notice.
 * Past max_connections a request is answered 503 (JSON, Retry-After,
 * Connection: close) from its headers, so a full server says so instead
 * of closing connections unanswered; libmicrohttpd's own limit sits
 * max_connections / 4 + 16 above ours, for those answers. Once three
 * quarters of the slots are taken every answer closes its connection, so
 * idle keep-alive connections do not hold threads that new clients need.
 * Every callback here returns promptly: the notices run on
 * libmicrohttpd's polling thread, which accepts every connection.
 */
#include <microhttpd.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "serve/internal.h"

enum { R_COMPLETIONS, R_CHAT, R_MODELS, R_MODEL, R_TOKENIZE, R_DETOKENIZE, R_HEALTH,
       R_METRICS, R_NONE };

static const struct route {
    const char *path;
    const char *method;
    bool prefix;  /* the path is a prefix ("/v1/models/NAME") */
    bool auth;    /* needs the API key when one is set */
} routes[] = {
    [R_COMPLETIONS] = {"/v1/completions", "POST", false, true},
    [R_CHAT] = {"/v1/chat/completions", "POST", false, true},
    [R_MODELS] = {"/v1/models", "GET", false, true},
    [R_MODEL] = {"/v1/models/", "GET", true, true},
    [R_TOKENIZE] = {"/tokenize", "POST", false, true},
    [R_DETOKENIZE] = {"/detokenize", "POST", false, true},
    [R_HEALTH] = {"/health", "GET", false, false},
    [R_METRICS] = {"/metrics", "GET", false, false},
};

static int find_route(const char *url)
{
    for (int i = 0; i < R_NONE; i++) {
        const struct route *r = &routes[i];
        size_t n = strlen(r->path);
        if (r->prefix ? !strncmp(url, r->path, n) && url[n] : !strcmp(url, r->path))
            return i;
    }
    return R_NONE;
}

/* ---- replies ------------------------------------------------------------------- */

/* Three quarters of the connection slots are taken: answers close their
 * connections rather than keep them alive. */
static bool busy(zs_server *s)
{
    return atomic_load(&s->n_conn) * 4 > (int_fast64_t)s->c.max_connections * 3;
}

int zsi_reply(zsi_conn *q, int status, zsi_buf *body, const char *type)
{
    static char nothing[] = "";
    struct MHD_Response *r;
    if (body && body->oom) {
        zsi_buf_free(body);
        status = 500;
        type = "text/plain";
    }
    if (body && body->p) {
        r = MHD_create_response_from_buffer(body->len, body->p, MHD_RESPMEM_MUST_FREE);
        if (r)
            *body = (zsi_buf){0};
    } else {
        r = MHD_create_response_from_buffer(0, nothing, MHD_RESPMEM_PERSISTENT);
    }
    if (body)
        zsi_buf_free(body); /* what libmicrohttpd did not take */
    if (!r)
        return MHD_NO;
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    if (status == 429 || status == 503)
        MHD_add_response_header(r, MHD_HTTP_HEADER_RETRY_AFTER, "1");
    if (status == 401)
        MHD_add_response_header(r, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
    if (status == 405 && q->route < R_NONE)
        MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, routes[q->route].method);
    if (status == 503 || status == 413 || busy(q->s))
        MHD_add_response_header(r, MHD_HTTP_HEADER_CONNECTION, "close");
    enum MHD_Result ok = MHD_queue_response(q->c, (unsigned)status, r);
    MHD_destroy_response(r);
    q->status = status;
    return ok;
}

int zsi_reply_err(zsi_conn *q, const zsi_err *e)
{
    zsi_buf b = {0};
    zsi_buf_puts(&b, "{\"error\":{\"message\":");
    zsi_buf_json_str(&b, e->msg, strlen(e->msg));
    zsi_buf_puts(&b, ",\"type\":");
    zsi_buf_json_str(&b, e->type, strlen(e->type));
    zsi_buf_puts(&b, ",\"param\":");
    if (e->param[0])
        zsi_buf_json_str(&b, e->param, strlen(e->param));
    else
        zsi_buf_puts(&b, "null");
    zsi_buf_puts(&b, ",\"code\":");
    if (e->code)
        zsi_buf_json_str(&b, e->code, strlen(e->code));
    else
        zsi_buf_puts(&b, "null");
    zsi_buf_puts(&b, "}}\n");
    return zsi_reply(q, e->status, &b, "application/json");
}

static int reply_status(zsi_conn *q, int status, const char *type, const char *code,
                        const char *msg)
{
    zsi_err e;
    zsi_err_set(&e, status, type, NULL, "%s", msg);
    e.code = code;
    return zsi_reply_err(q, &e);
}

bool zsi_client_gone(const zsi_conn *q) { return zsi_fd_gone(q->fd); }

bool zsi_fd_gone(int fd)
{
    struct pollfd p = {.fd = fd, .events = POLLRDHUP};
    return fd >= 0 && poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR));
}

/* ---- the access handler ------------------------------------------------------- */

/* True when the request carries "Authorization: Bearer KEY" (compared in
 * time independent of where it differs). */
static bool authorized(const zs_server *s, struct MHD_Connection *c)
{
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND,
                                                MHD_HTTP_HEADER_AUTHORIZATION);
    if (!h || strncmp(h, "Bearer ", 7))
        return false;
    h += 7;
    size_t n = strlen(s->api_key);
    if (strlen(h) != n)
        return false;
    unsigned char d = 0;
    for (size_t i = 0; i < n; i++)
        d |= (unsigned char)(h[i] ^ s->api_key[i]);
    return d == 0;
}

static zsi_conn *conn_new(zs_server *s, struct MHD_Connection *c, const char *url,
                          const char *method)
{
    zsi_conn *q = calloc(1, sizeof *q);
    if (!q)
        return NULL;
    q->s = s;
    q->c = c;
    q->t0 = zsi_clock();
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    q->fd = ci ? ci->connect_fd : -1;
    snprintf(q->method, sizeof q->method, "%s", method);
    snprintf(q->path, sizeof q->path, "%s", url);
    pthread_mutex_lock(&s->mu);
    uint64_t n = ++s->next_id;
    pthread_mutex_unlock(&s->mu);
    snprintf(q->id, sizeof q->id, "req-%llx-%llu", (unsigned long long)s->created,
             (unsigned long long)n);
    return q;
}

/* The checks made from the headers alone: an answer's MHD result, or -1
 * to go on reading the body. */
static int headers(zsi_conn *q, const char *method)
{
    zs_server *s = q->s;
    const struct route *r = q->route < R_NONE ? &routes[q->route] : NULL;
    if (!r)
        return reply_status(q, 404, "invalid_request_error", "not_found",
                            "no such endpoint (see GET /v1/models, POST /v1/completions, "
                            "POST /v1/chat/completions)");
    bool head = !strcmp(method, "HEAD") && !strcmp(r->method, "GET");
    if (strcmp(method, r->method) && !head) {
        char m[96];
        snprintf(m, sizeof m, "%s takes %s, not %.16s", r->path, r->method, method);
        return reply_status(q, 405, "invalid_request_error", "method_not_allowed", m);
    }
    if (r->auth && s->api_key && !authorized(s, q->c))
        return reply_status(q, 401, "authentication_error", "invalid_api_key",
                            "a valid API key is required: Authorization: Bearer KEY");
    const char *cl = MHD_lookup_connection_value(q->c, MHD_HEADER_KIND,
                                                 MHD_HTTP_HEADER_CONTENT_LENGTH);
    if (cl && strtod(cl, NULL) > (double)s->c.max_body_bytes) {
        char m[96];
        snprintf(m, sizeof m, "the body is larger than this server's limit of %lld bytes",
                 (long long)s->c.max_body_bytes);
        return reply_status(q, 413, "invalid_request_error", "request_too_large", m);
    }
    return -1;
}

/* A piece of body: kept while under the limit, dropped (413 at the end)
 * after. False when the body took longer than the read timeout. */
static bool body(zsi_conn *q, const char *data, size_t n)
{
    if (zsi_clock() - q->t0 > q->s->c.read_timeout_s)
        return false;
    if (q->too_big || q->body.len + n > (size_t)q->s->c.max_body_bytes) {
        q->too_big = true;
        zsi_buf_free(&q->body);
        return true;
    }
    zsi_buf_add(&q->body, data, n);
    return !q->body.oom;
}

/* /metrics, or /health: the status and what the server holds (this
 * request counts itself among connections and requests). */
static int simple(zsi_conn *q)
{
    zs_server *s = q->s;
    zsi_buf b = {0};
    if (q->route == R_METRICS) {
        pthread_mutex_lock(&s->mu);
        zsi_metrics_text(s, &b);
        pthread_mutex_unlock(&s->mu);
        return zsi_reply(q, 200, &b, "text/plain; version=0.0.4; charset=utf-8");
    }
    zs_server_stats h;
    pthread_mutex_lock(&s->mu);
    bool draining = s->draining;
    zsi_server_stats(s, &h);
    pthread_mutex_unlock(&s->mu);
    zsi_buf_printf(&b, "{\"status\":\"%s\",\"connections\":%lld,\"requests\":%lld,"
                   "\"answering\":%lld,\"in_flight\":%lld,\"queued\":%lld,"
                   "\"engine_requests\":%lld,\"running\":%lld,\"waiting\":%lld,"
                   "\"kv_blocks_used\":%lld,\"refused_connections\":%lld}\n",
                   draining ? "stopping" : "ok", (long long)h.connections,
                   (long long)h.requests, (long long)h.answering, (long long)h.in_flight,
                   (long long)h.queued, (long long)h.engine_requests, (long long)h.running,
                   (long long)h.waiting, (long long)h.kv_blocks_used,
                   (long long)h.refused_connections);
    return zsi_reply(q, draining ? 503 : 200, &b, "application/json");
}

/* Past max_connections: 503 from the headers (the body is not read). */
static int full(zsi_conn *q)
{
    atomic_fetch_add(&q->s->n_refused, 1);
    char m[160];
    snprintf(m, sizeof m, "the server has %lld connections open, more than its limit of %d "
             "(max_connections); retry later", (long long)atomic_load(&q->s->n_conn),
             q->s->c.max_connections);
    return reply_status(q, 503, "server_error", "server_busy", m);
}

static int handle(zsi_conn *q, const char *url)
{
    if (q->too_big) {
        char m[96];
        snprintf(m, sizeof m, "the body is larger than this server's limit of %lld bytes",
                 (long long)q->s->c.max_body_bytes);
        return reply_status(q, 413, "invalid_request_error", "request_too_large", m);
    }
    switch (q->route) {
    case R_COMPLETIONS:
    case R_CHAT:
        return zsi_handle_generate(q, q->route == R_CHAT);
    case R_MODELS:
    case R_MODEL:
        return zsi_handle_models(q, url);
    case R_TOKENIZE:
        return zsi_handle_tokenize(q);
    case R_DETOKENIZE:
        return zsi_handle_detokenize(q);
    default:
        return simple(q);
    }
}

static enum MHD_Result on_access(void *cls, struct MHD_Connection *c, const char *url,
                                 const char *method, const char *version,
                                 const char *data, size_t *size, void **ptr)
{
    zsi_conn *q = *ptr;
    if (!q) {
        zs_server *s = cls;
        if (!(q = conn_new(s, c, url, method)))
            return MHD_NO;
        *ptr = q;
        atomic_fetch_add(&s->n_req, 1); /* on_completed counts it down */
        q->route = find_route(url);
        bool over = atomic_load(&s->n_conn) > s->c.max_connections && q->route != R_HEALTH;
        int st = over ? full(q) : headers(q, method);
        return st < 0 || st == MHD_YES ? MHD_YES : MHD_NO;
    }
    if (*size) {
        bool ok = body(q, data, *size);
        *size = 0;
        return ok ? MHD_YES : MHD_NO;
    }
    if (q->status)
        return MHD_YES; /* answered already */
    int r = handle(q, url);
    return r == MHD_YES ? MHD_YES : MHD_NO;
}

/* The end of a request: a generation still running is aborted (the
 * client left or the stream broke), the status is counted and logged. */
static void on_completed(void *cls, struct MHD_Connection *c, void **ptr,
                         enum MHD_RequestTerminationCode toe)
{
    zs_server *s = cls;
    zsi_conn *q = *ptr;
    if (!q)
        return;
    *ptr = NULL;
    if (q->job)
        zsi_cancel(s, q->job); /* a no-op for the engine once it is done */
    zsi_log_request(s, q, toe != MHD_REQUEST_TERMINATED_COMPLETED_OK);
    if (q->job) {
        pthread_mutex_lock(&s->mu);
        s->answering--;
        pthread_cond_broadcast(&s->idle);
        pthread_mutex_unlock(&s->mu);
    }
    zsi_job_release(q->job);
    zsi_buf_free(&q->body);
    free(q);
    atomic_fetch_sub(&s->n_req, 1);
}

/* A connection opens or closes (libmicrohttpd's polling thread, or the
 * connection's own when it ends: promptly, no lock). */
static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode code)
{
    zs_server *s = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED)
        atomic_fetch_add(&s->n_conn, 1);
    else if (code == MHD_CONNECTION_NOTIFY_CLOSED)
        atomic_fetch_sub(&s->n_conn, 1);
}

/* ---- the daemon ------------------------------------------------------------------- */

bool zsi_http_start(zs_server *s)
{
    char port[16];
    snprintf(port, sizeof port, "%d", s->c.port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV}, *ai = NULL;
    int g = getaddrinfo(s->host, port, &hints, &ai);
    if (g || !ai) {
        zs_set_error("serve: cannot resolve host '%s': %s", s->host, gai_strerror(g));
        return false;
    }
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD |
                     MHD_USE_POLL | MHD_USE_ITC |
                     (ai->ai_family == AF_INET6 ? MHD_USE_IPv6 : 0);
    s->d = MHD_start_daemon(
        flags, (uint16_t)s->c.port, NULL, NULL, on_access, s,
        MHD_OPTION_SOCK_ADDR, ai->ai_addr,
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
        MHD_OPTION_NOTIFY_CONNECTION, on_connection, s,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)(s->c.read_timeout_s + 0.999),
        MHD_OPTION_CONNECTION_LIMIT, (unsigned)(s->c.max_connections +
                                                s->c.max_connections / 4 + 16),
        MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)(64 * 1024),
        MHD_OPTION_LISTENING_ADDRESS_REUSE, 1u,
        MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!s->d) {
        zs_set_error("serve: cannot listen on %s:%d (in use, or not an address of this "
                     "machine?)", s->host, s->c.port);
        return false;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di ? di->port : s->c.port;
    return true;
}

void zsi_http_quiesce(zs_server *s)
{
    if (!s->d)
        return;
    MHD_socket fd = MHD_quiesce_daemon(s->d);
    if (fd != MHD_INVALID_SOCKET)
        close(fd);
}

void zsi_http_stop(zs_server *s)
{
    if (s->d)
        MHD_stop_daemon(s->d);
    s->d = NULL;
}
