/*
 * zs/serve.h - an HTTP server with OpenAI-compatible endpoints on the
 * inference engine (zs/infer.h), on libmicrohttpd.
 *
 * Endpoints (JSON bodies; errors are OpenAI's error object
 * {"error": {"message", "type", "param", "code"}}):
 *
 *   POST /v1/completions        prompt(s) -> text (below); "stream": true
 *                               gives server-sent events
 *   POST /v1/chat/completions   messages -> one assistant message (below)
 *   GET  /v1/models             the one model, as a list
 *   GET  /v1/models/NAME        that model (404 for another name)
 *   POST /tokenize              {"prompt"|"text": STRING} or {"messages":
 *                               [...]} -> {"tokens": [...], "count": N,
 *                               "max_model_len": CTX}
 *   POST /detokenize            {"tokens": [...]} -> {"prompt": TEXT,
 *                               "text": TEXT}
 *   GET  /health                200 {"status":"ok"}; 503 while stopping
 *   GET  /metrics               Prometheus text format (README: names)
 *
 * Statuses: 200; 400 a malformed body (not JSON, not UTF-8, nested deeper
 * than cJSON's limit of 1000), a field of the wrong type or out of range
 * (NaN, 1e400), or a request the engine refuses (a prompt that leaves no
 * room in the model's context, ids outside the vocabulary); 401 a missing
 * or wrong "Authorization: Bearer KEY" when an API key is set (every
 * /v1/ path, /tokenize, /detokenize; /health and /metrics stay open); 404 an unknown
 * path or model; 405 a known path with the wrong method (Allow says the
 * right one); 413 a body over max_body_bytes (answered from the headers
 * when Content-Length says so, before the body is read); 429 with
 * Retry-After when max_num_seqs + max_queue requests are already in
 * flight (a request counts once, whatever its prompts and n); 500 the
 * engine failed; 503 the server is stopping; 504 a generation ran past
 * request_timeout_s.
 *
 * Prompts of /v1/completions: "prompt" is a string, an array of token ids
 * (one prompt), an array of strings, or an array of arrays of token ids
 * (a prompt each); an empty array, or one that mixes strings, ids and
 * arrays, is a 400, and so is a request of more than 128 choices (prompts
 * times n). Each prompt gets n samples: "choices" holds prompts * n
 * entries, prompt-major as OpenAI's (index = prompt * n + sample), and
 * with echo each choice begins with its own prompt. Every prompt samples
 * with the request's parameters and seed (sample i with seed + i), so a
 * prompt gives the same choices alone and in a list (and two equal
 * prompts the same). usage.prompt_tokens counts each prompt once,
 * completion_tokens every choice's tokens; the request counts once in the
 * queue limit, /metrics and the log. A prompt the engine refuses fails
 * the whole request (400 "prompt I: ..."). Chat keeps one conversation
 * per request.
 *
 * The chat template: each message becomes "<|ROLE|>\nCONTENT\n" (ROLE:
 * system, developer, user, assistant or tool; CONTENT a string, or an
 * array of {"type": "text", "text": ...} parts joined), and the prompt ends
 * with the assistant cue "<|assistant|>\n". The markers are plain text to
 * the tokenizer (no special ids), so any model can be served; one trained
 * on this layout answers in it. No stop string is implied: pass "stop":
 * ["<|"] to end at the next marker.
 *
 * Streaming: a chunk goes out per sampled token (choices interleave, each
 * chunk naming its index), except that text which could still be the
 * start of a stop string, or an incomplete UTF-8 character, is held back
 * until it is decided; no streamed text ever passes a stop string. The
 * usage chunk (stream_options.include_usage) and "data: [DONE]" come once,
 * after every choice of every prompt has finished. Invalid UTF-8 in output (a byte-level tokenizer
 * can split a character at the end of a sample) becomes U+FFFD, in
 * streamed and whole answers alike.
 *
 * Threads: libmicrohttpd runs a thread per connection; one engine thread
 * owns the zs_engine and is the only caller of zs_engine_*; handlers hand
 * it requests and cancellations through a mutex-protected queue and read
 * tokens from per-request buffers under the request's mutex, woken by its
 * condition variable. A client that disconnects (or shuts down its sending
 * side: POLLRDHUP) has its request aborted at once, its KV blocks freed.
 * Past max_connections open connections a request is answered 503; what
 * each request holds and where it is given back, and the counts of
 * zs_server_get_stats: docs/serve.md.
 */
#ifndef ZS_SERVE_H
#define ZS_SERVE_H

#include <stdio.h>

#include "infer.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct zs_server_config {
    const char *host;          /* address to bind; NULL: "127.0.0.1" */
    int port;                  /* 0: a free port (zs_server_port) */
    const char *api_key;       /* NULL or "": no authentication */
    const char *model_name;    /* the "model" of answers and /v1/models;
                                * NULL: "zs" */
    int64_t max_queue;         /* requests that may wait beyond
                                * engine.max_num_seqs; 0: 256 */
    int64_t max_body_bytes;    /* request body limit; 0: 1 MiB */
    int max_connections;       /* connections served at once; 0: 512. Up
                                * to max_connections / 4 + 16 more are
                                * accepted only to be answered 503 and
                                * closed; past those libmicrohttpd closes
                                * new connections unanswered */
    double read_timeout_s;     /* an idle connection is closed after this,
                                * and a request body must arrive within
                                * it; 0: 30 */
    double request_timeout_s;  /* a generation is aborted (504) after this
                                * from its arrival; 0: 600 */
    zs_engine_config engine;   /* its max_num_seqs 0 means 64, as there */
    FILE *log;                 /* one JSON line per request; NULL: none.
                                * Borrowed; written from many threads under
                                * the server's lock. */
} zs_server_config;

typedef struct zs_server zs_server;

/* Binds host:port, starts the engine (on m and tok, both borrowed until
 * zs_server_free; tok is required) and the HTTP threads. Returns a running
 * server, or NULL + message (bad config, address in use, no memory). */
zs_server *zs_server_start(const zs_llm *m, const zs_bpe *tok,
                           const zs_server_config *c);
/* The bound TCP port (the one picked when the config asked for 0). */
int zs_server_port(const zs_server *s);
/* Stops accepting connections, lets running requests finish for up to
 * grace_seconds, aborts what is left (streams end with an error event,
 * waiting requests get 503), and joins every thread. Idempotent; call it
 * from a thread that is not a handler of this server. */
void zs_server_stop(zs_server *s, double grace_seconds);
/* Stops (with no grace) if still running, then frees. NULL is fine. */
void zs_server_free(zs_server *s);

/* What the server holds right now (GET /health and /metrics say the
 * same). Every count but refused_connections returns to 0 once the
 * clients are gone and their requests have ended: a vanished client, a
 * refused request and an aborted stream each give back what they took. */
typedef struct zs_server_stats {
    int64_t connections;       /* TCP connections open (each a thread) */
    int64_t requests;          /* HTTP requests begun and not completed */
    int64_t answering;         /* generation requests whose answer or
                                * stream is not over */
    int64_t in_flight;         /* generations handed to the engine thread
                                * and not done (the 429 limit counts these) */
    int64_t queued;            /* of those, not yet taken by the engine thread */
    int64_t engine_requests;   /* of those, in the engine */
    int64_t running, waiting;  /* the engine's sequences (as of its last step) */
    int64_t kv_blocks_used;
    int64_t refused_connections; /* 503s at max_connections, since the start */
} zs_server_stats;

/* Fills *out (a consistent snapshot; any thread). */
void zs_server_get_stats(zs_server *s, zs_server_stats *out);

#ifdef __cplusplus
}
#endif
#endif
