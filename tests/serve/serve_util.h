/*
 * serve_util.h - what the server tests share: a model to serve (random
 * weights, a BPE trained on a few sentences) and a small blocking
 * HTTP/1.1 client (loopback only): raw bytes out (malformed requests
 * included), one response back (Content-Length, chunked, or until close),
 * server-sent events one at a time, and a Prometheus value out of
 * /metrics. Every socket has send and receive timeouts, so a test never
 * hangs on a server that stopped answering.
 */
#ifndef ZS_TESTS_SERVE_UTIL_H
#define ZS_TESTS_SERVE_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "zs/zs.h"

/* A tokenizer of 300 ids trained on a fixed English text, and a GPT-2 of
 * random weights (seed 7) over it: `layers` layers, 4 heads, `width` wide,
 * context ctx. Both new (zs_bpe_free, zs_llm_free); NULL + message on
 * failure. */
zs_bpe *zt_serve_bpe(void);
zs_llm *zt_serve_llm(const zs_bpe *b, int64_t ctx, int64_t layers, int64_t width);
/* The same GPT written with b as a checkpoint directory
 * (checkpoint.safetensors with its config, tokenizer.bpe) that zs serve
 * --ckpt opens. */
zs_status zt_serve_save(const zs_bpe *b, int64_t ctx, int64_t layers, int64_t width,
                        const char *dir);

typedef struct zt_resp {
    int status;        /* -1: no (complete) response */
    char head[8192];   /* the status line and headers */
    char *body;        /* malloc'd, NUL-terminated (decoded when chunked) */
    size_t len;
} zt_resp;

double zt_now(void); /* monotonic seconds */

/* A connected socket to 127.0.0.1:port with timeouts, or -1. */
int zt_connect(int port, double timeout_s);
bool zt_send_all(int fd, const void *p, size_t n);
/* Reads one response from fd into *r (status -1 on failure). */
bool zt_read_resp(int fd, zt_resp *r);
/* One request on its own connection ("Connection: close"): extra is more
 * header lines ("Authorization: Bearer k\r\n") or NULL; body may be NULL.
 * Returns the status (-1 when none came back). */
int zt_request(int port, const char *method, const char *path, const char *extra,
               const char *body, size_t n, zt_resp *r);
/* The value of header name in r (case-insensitive) into buf, or NULL. */
const char *zt_header(const zt_resp *r, const char *name, char *buf, size_t n);
void zt_resp_free(zt_resp *r);

/* A streaming response being read. */
typedef struct zt_sse {
    int fd;
    zt_resp head;      /* status and headers (body unused) */
    char *raw;         /* socket bytes not yet decoded (chunk framing) */
    size_t rlen, rcap;
    char *dec;         /* decoded body bytes not yet returned */
    size_t dlen, dcap;
    bool chunked, eof;
} zt_sse;

/* POSTs body to path and reads the response head. False when no head
 * came back; s->head.status tells the status (errors: read the rest with
 * zt_sse_rest). */
bool zt_sse_open(int port, const char *path, const char *body, const char *extra,
                 zt_sse *s);
/* The next event's data (malloc'd, without "data: "), skipping comments;
 * NULL at the end of the stream. */
char *zt_sse_next(zt_sse *s);
/* The rest of the body (malloc'd). */
char *zt_sse_rest(zt_sse *s);
void zt_sse_close(zt_sse *s);

/* The value of the metric line "name value" (labels included in name:
 * "zs_requests_total{code=\"200\"}") in a /metrics text, or -1. */
double zt_metric(const char *text, const char *name);
/* GET /metrics and the value of one metric, or -1. */
double zt_get_metric(int port, const char *name);

#endif
