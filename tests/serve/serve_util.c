/*
 * serve_util.c - see serve_util.h.
 */
#include "serve/serve_util.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

/* ---- a model to serve -------------------------------------------------------- */

static const char *const sentences[] = {
    "In the beginning was the word, and the word was with the light. ",
    "The light shone in the darkness, and the darkness did not overcome it. ",
    "And God said, let there be light: and there was light. ",
    "A quick brown fox jumps over the lazy dog; the dog sleeps on. ",
    "Zhisuan serves models over HTTP with streaming answers and metrics. ",
};

zs_bpe *zt_serve_bpe(void)
{
    char text[8192];
    size_t n = 0;
    for (int r = 0; r < 20; r++)
        for (size_t i = 0; i < sizeof sentences / sizeof *sentences; i++)
            n += (size_t)snprintf(text + n, sizeof text - n, "%s", sentences[(i + (size_t)r) % 5]);
    return zs_bpe_train(text, n, 300);
}

static zs_module *gpt(const zs_bpe *b, int64_t ctx, int64_t layers, int64_t width,
                      zs_gpt_config *c)
{
    *c = (zs_gpt_config){.arch = ZS_GPT2, .vocab = zs_bpe_vocab_size(b), .ctx = ctx,
                         .layers = layers, .heads = 4, .width = width};
    return zs_gpt_new(c, 7);
}

zs_llm *zt_serve_llm(const zs_bpe *b, int64_t ctx, int64_t layers, int64_t width)
{
    zs_gpt_config c;
    zs_module *g = gpt(b, ctx, layers, width, &c);
    zs_llm *m = g ? zs_llm_from_gpt(g, NULL) : NULL;
    zs_module_free(g);
    return m;
}

zs_status zt_serve_save(const zs_bpe *b, int64_t ctx, int64_t layers, int64_t width,
                        const char *dir)
{
    zs_gpt_config c;
    zs_module *g = gpt(b, ctx, layers, width, &c);
    char path[4096], meta[1024];
    if (!g || !zs_gpt_config_to_metadata(&c, meta, sizeof meta)) {
        zs_module_free(g);
        return zs_set_error("serve test: cannot make the GPT");
    }
    snprintf(path, sizeof path, "%s/checkpoint.safetensors", dir);
    zs_status st = zs_module_save(path, g, NULL, meta);
    zs_module_free(g);
    snprintf(path, sizeof path, "%s/tokenizer.bpe", dir);
    return st != ZS_OK ? st : zs_bpe_save(b, path);
}

/* ---- the client ------------------------------------------------------------------ */

double zt_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int zt_connect(int port, double timeout_s)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return -1;
    struct timeval tv = {(time_t)timeout_s, (long)((timeout_s - (double)(time_t)timeout_s) * 1e6)};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof a)) {
        close(fd);
        return -1;
    }
    return fd;
}

bool zt_send_all(int fd, const void *p, size_t n)
{
    const char *c = p;
    while (n > 0) {
        ssize_t w = send(fd, c, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return false;
        c += w;
        n -= (size_t)w;
    }
    return true;
}

/* ---- reading ---------------------------------------------------------------- */

/* A socket's bytes with one lookahead buffer. */
typedef struct rd {
    int fd;
    char *b;
    size_t len, cap;
    bool eof;
} rd;

static bool fill(rd *r)
{
    if (r->eof)
        return false;
    if (r->len + 4096 > r->cap) {
        size_t c = r->cap ? 2 * r->cap : 8192;
        while (c < r->len + 4096)
            c *= 2;
        char *b = realloc(r->b, c);
        if (!b)
            return false;
        r->b = b, r->cap = c;
    }
    ssize_t n;
    do
        n = recv(r->fd, r->b + r->len, r->cap - r->len - 1, 0);
    while (n < 0 && errno == EINTR);
    if (n <= 0) {
        r->eof = true;
        return false;
    }
    r->len += (size_t)n;
    r->b[r->len] = 0;
    return true;
}

static void consume(rd *r, size_t n)
{
    memmove(r->b, r->b + n, r->len - n);
    r->len -= n;
    if (r->b)
        r->b[r->len] = 0;
}

/* The index just past the first "\r\n" (or "\r\n\r\n") in r, filling as
 * needed; 0 when it never comes. */
static size_t until(rd *r, const char *mark)
{
    for (;;) {
        char *p = r->b ? strstr(r->b, mark) : NULL;
        if (p)
            return (size_t)(p - r->b) + strlen(mark);
        if (!fill(r))
            return 0;
    }
}

static bool head(rd *r, zt_resp *out)
{
    size_t h = until(r, "\r\n\r\n");
    if (!h || h >= sizeof out->head)
        return false;
    memcpy(out->head, r->b, h);
    out->head[h] = 0;
    consume(r, h);
    return sscanf(out->head, "HTTP/1.%*d %d", &out->status) == 1;
}

static void append(char **b, size_t *len, size_t *cap, const char *p, size_t n)
{
    if (*len + n + 1 > *cap) {
        size_t c = *cap ? *cap : 256;
        while (c < *len + n + 1)
            c *= 2;
        char *x = realloc(*b, c);
        if (!x)
            return;
        *b = x, *cap = c;
    }
    memcpy(*b + *len, p, n);
    *len += n;
    (*b)[*len] = 0;
}

/* The next piece of a chunked body into out; false at its end or error. */
static bool next_chunk(rd *r, char **out, size_t *len, size_t *cap, bool *end)
{
    size_t l = until(r, "\r\n");
    if (!l)
        return false;
    size_t size = strtoul(r->b, NULL, 16);
    consume(r, l);
    while (r->len < size + 2)
        if (!fill(r))
            return false;
    append(out, len, cap, r->b, size);
    consume(r, size + 2);
    *end = size == 0;
    return true;
}

const char *zt_header(const zt_resp *r, const char *name, char *buf, size_t n)
{
    size_t k = strlen(name);
    for (const char *p = strstr(r->head, "\r\n"); p && p[2]; p = strstr(p + 2, "\r\n")) {
        const char *line = p + 2;
        if (!strncasecmp(line, name, k) && line[k] == ':') {
            const char *v = line + k + 1;
            while (*v == ' ')
                v++;
            size_t m = strcspn(v, "\r\n");
            snprintf(buf, n, "%.*s", (int)m, v);
            return buf;
        }
    }
    return NULL;
}

static bool body(rd *r, zt_resp *out)
{
    char v[64];
    size_t cap = 0;
    out->len = 0;
    append(&out->body, &out->len, &cap, "", 0);
    if (zt_header(out, "Transfer-Encoding", v, sizeof v) && strstr(v, "chunked")) {
        bool end = false;
        while (!end)
            if (!next_chunk(r, &out->body, &out->len, &cap, &end))
                return false;
        return true;
    }
    if (zt_header(out, "Content-Length", v, sizeof v)) {
        size_t n = strtoul(v, NULL, 10);
        while (r->len < n)
            if (!fill(r))
                return false;
        append(&out->body, &out->len, &cap, r->b, n);
        consume(r, n);
        return true;
    }
    while (fill(r)) {
    }
    append(&out->body, &out->len, &cap, r->b ? r->b : "", r->len);
    consume(r, r->len);
    return true;
}

bool zt_read_resp(int fd, zt_resp *out)
{
    memset(out, 0, sizeof *out);
    out->status = -1;
    rd r = {.fd = fd};
    bool ok = head(&r, out) && body(&r, out);
    if (!ok)
        out->status = -1;
    free(r.b);
    return ok;
}

int zt_request(int port, const char *method, const char *path, const char *extra,
               const char *b, size_t n, zt_resp *r)
{
    memset(r, 0, sizeof *r);
    r->status = -1;
    int fd = zt_connect(port, 60);
    if (fd < 0)
        return -1;
    char h[2048];
    const char *x = extra ? extra : "";
    int hl = b ? snprintf(h, sizeof h, "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: "
                          "close\r\n%sContent-Type: application/json\r\nContent-Length: "
                          "%zu\r\n\r\n", method, path, x, n)
               : snprintf(h, sizeof h, "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: "
                          "close\r\n%s\r\n", method, path, x);
    if (zt_send_all(fd, h, (size_t)hl) && (!b || zt_send_all(fd, b, n)))
        zt_read_resp(fd, r);
    close(fd);
    return r->status;
}

void zt_resp_free(zt_resp *r)
{
    free(r->body);
    r->body = NULL;
}

/* ---- server-sent events ---------------------------------------------------- */

bool zt_sse_open(int port, const char *path, const char *b, const char *extra, zt_sse *s)
{
    memset(s, 0, sizeof *s);
    s->head.status = -1;
    if ((s->fd = zt_connect(port, 60)) < 0)
        return false;
    char h[2048];
    int hl = snprintf(h, sizeof h, "POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
                      "Content-Type: application/json\r\n%sContent-Length: %zu\r\n\r\n", path,
                      extra ? extra : "", strlen(b));
    rd r = {.fd = s->fd};
    bool ok = zt_send_all(s->fd, h, (size_t)hl) && zt_send_all(s->fd, b, strlen(b)) &&
              head(&r, &s->head);
    char v[64];
    s->chunked = ok && zt_header(&s->head, "Transfer-Encoding", v, sizeof v) &&
                 strstr(v, "chunked");
    s->raw = r.b, s->rlen = r.len, s->rcap = r.cap; /* what followed the head */
    return ok;
}

/* Decodes more of the body into s->dec; false at its end. */
static bool more(zt_sse *s)
{
    if (s->eof)
        return false;
    rd r = {.fd = s->fd, .b = s->raw, .len = s->rlen, .cap = s->rcap};
    bool ok;
    if (s->chunked) {
        bool end = false;
        ok = next_chunk(&r, &s->dec, &s->dlen, &s->dcap, &end);
        s->eof = !ok || end;
    } else {
        ok = r.len > 0 || fill(&r);
        append(&s->dec, &s->dlen, &s->dcap, r.b ? r.b : "", r.len);
        consume(&r, r.len);
        s->eof = !ok;
    }
    s->raw = r.b, s->rlen = r.len, s->rcap = r.cap;
    return ok;
}

char *zt_sse_next(zt_sse *s)
{
    for (;;) {
        char *e = s->dec ? strstr(s->dec, "\n\n") : NULL;
        if (e) {
            size_t n = (size_t)(e - s->dec);
            char *ev = strndup(s->dec, n);
            memmove(s->dec, e + 2, s->dlen - n - 2);
            s->dlen -= n + 2;
            s->dec[s->dlen] = 0;
            if (ev && !strncmp(ev, "data: ", 6)) {
                memmove(ev, ev + 6, strlen(ev + 6) + 1);
                return ev;
            }
            free(ev); /* a comment or another field */
            continue;
        }
        if (!more(s))
            return NULL;
    }
}

char *zt_sse_rest(zt_sse *s)
{
    while (more(s)) {
    }
    char *r = strndup(s->dec ? s->dec : "", s->dlen);
    s->dlen = 0;
    return r;
}

void zt_sse_close(zt_sse *s)
{
    if (s->fd >= 0)
        close(s->fd);
    free(s->raw);
    free(s->dec);
    memset(s, 0, sizeof *s);
    s->fd = -1;
}

/* ---- metrics ------------------------------------------------------------------- */

double zt_metric(const char *text, const char *name)
{
    size_t n = strlen(name);
    for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
        if (!strncmp(p, name, n) && p[n] == ' ')
            return strtod(p + n + 1, NULL);
    return -1;
}

double zt_get_metric(int port, const char *name)
{
    zt_resp r;
    double v = -1;
    if (zt_request(port, "GET", "/metrics", NULL, NULL, 0, &r) == 200)
        v = zt_metric(r.body, name);
    zt_resp_free(&r);
    return v;
}
