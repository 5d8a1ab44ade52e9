/*
 * internal.h - what the files of src/serve share (zs/serve.h describes the
 * server and its threads).
 *
 *   server.c   start and stop, the engine thread, token events -> jobs
 *   http.c     libmicrohttpd callbacks: routing, bodies, auth, replies
 *   params.c   OpenAI JSON -> zsi_params (types, ranges), chat template
 *   respond.c  whole answers and the small endpoints
 *   stream.c   server-sent events, read from a job as tokens arrive
 *   metrics.c  Prometheus text, the JSON-lines request log
 *   text.c     an output buffer, JSON strings, UTF-8
 *
 * A generation request is a zsi_job, reference counted: the handler holds
 * one reference, the engine thread another from zs_server's queue until
 * every choice has finished, a stream's reader a third. The engine sees a
 * job as one zs_gen_request per prompt (zsi_part); the server counts it
 * once (queue limit, metrics, log). Token data lives
 * in the job under its mutex; the server's mutex guards the queue, the
 * counters and the metrics. Lock order: the server's mutex, then a job's;
 * the server's is never taken while a job's is held.
 */
#ifndef ZS_SERVE_INTERNAL_H
#define ZS_SERVE_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "zs/serve.h"

struct MHD_Connection;
struct MHD_Daemon;
struct cJSON;
typedef struct zsi_conn zsi_conn;

/* ---- text.c: a growing output buffer ------------------------------------ */

typedef struct zsi_buf {
    char *p;      /* NUL-terminated while len < cap; owned */
    size_t len, cap;
    bool oom;     /* an append failed: the content is incomplete */
} zsi_buf;

void zsi_buf_add(zsi_buf *b, const void *data, size_t n);
void zsi_buf_puts(zsi_buf *b, const char *s);
__attribute__((format(printf, 2, 3))) void zsi_buf_printf(zsi_buf *b, const char *fmt, ...);
/* A JSON string literal (quotes included) of the bytes s[0, n): control
 * characters escaped, every byte that does not begin a valid UTF-8
 * sequence written as U+FFFD (so any bytes give valid JSON). */
void zsi_buf_json_str(zsi_buf *b, const char *s, size_t n);
void zsi_buf_json_num(zsi_buf *b, double v); /* null when not finite */
void zsi_buf_free(zsi_buf *b);

/* True when s[0, n) is well-formed UTF-8 (no overlong forms, surrogates or
 * code points above U+10FFFF). */
bool zsi_utf8_valid(const char *s, size_t n);
/* The longest prefix of s[0, n) that does not end inside a character
 * still being completed (a valid lead byte with too few continuations). */
size_t zsi_utf8_complete(const char *s, size_t n);
/* The bytes at the end of text[0, n) that could begin one of the stop
 * strings (the longest proper prefix of one that text ends with). */
size_t zsi_stop_holdback(const char *text, size_t n, char *const *stop, int n_stop);

/* ---- params.c: a generation request ------------------------------------- */

#define ZSI_MAX_STOP 4
#define ZSI_MAX_N 128        /* choices per request: prompts * n */

/* One prompt's tokens (chat: the template applied). */
typedef struct zsi_prompt {
    int32_t *ids;            /* owned */
    int64_t n;
} zsi_prompt;

/* A request asks for n samples of each of its prompts: n_prompts * n
 * choices, prompt-major as OpenAI orders them (choice c answers prompt
 * c / n, as its sample c % n). Every prompt samples with the same
 * zs_sampler, seed included, so a prompt gives the same choices alone and
 * in a list. */
typedef struct zsi_params {
    bool chat;               /* /v1/chat/completions */
    bool stream, include_usage, echo;
    bool logprobs;           /* return log probabilities */
    int top_logprobs;        /* alternatives per token */
    zsi_prompt *prompts;     /* [n_prompts] owned; chat: one */
    int n_prompts;
    zs_sampler sampling;
    int64_t max_tokens;      /* 0: up to the context */
    int n;                   /* samples per prompt */
    int n_choices;           /* n_prompts * n <= ZSI_MAX_N */
    char *stop[ZSI_MAX_STOP];/* owned */
    int n_stop;
    bool ignore_eos;
} zsi_params;

/* What went wrong with a request: HTTP status, OpenAI error type, the
 * offending parameter ("" for none) and the message. */
typedef struct zsi_err {
    int status;
    const char *type;
    const char *code;        /* NULL or OpenAI's code string */
    char param[64];
    char msg[400];
} zsi_err;

__attribute__((format(printf, 5, 6))) void zsi_err_set(zsi_err *e, int status,
                                                       const char *type,
                                                       const char *param,
                                                       const char *fmt, ...);

/* Parses body[0, n) as JSON: refuses invalid UTF-8 and whatever cJSON
 * refuses (its nesting limit included). NULL + e filled (400). The result
 * is the caller's (cJSON_Delete). Safe from any thread. */
struct cJSON *zsi_json_parse(zs_server *s, const char *body, size_t n, zsi_err *e);
/* A completion (chat false) or chat request into *p (zeroed first; free
 * with zsi_params_free, also after a failure). 400 / 404 in e. */
bool zsi_params_parse(zs_server *s, const struct cJSON *req, bool chat, zsi_params *p,
                      zsi_err *e);
void zsi_params_free(zsi_params *p);
/* The tokens of all of p's prompts (each counted once, whatever n). */
int64_t zsi_prompt_tokens(const zsi_params *p);
/* The chat template of messages into *out (text, see zs/serve.h). */
bool zsi_chat_prompt(const struct cJSON *messages, zsi_buf *out, zsi_err *e);
/* Token ids given as a JSON array a (field name k) into *ids (malloc'd,
 * also on failure: free it) and *n: integers in [0, 2^31). */
bool zsi_token_array(const struct cJSON *a, const char *k, int32_t **ids, int64_t *n,
                     zsi_err *e);
/* A "model" field, when present, must name this server's model (404). */
bool zsi_check_model(zs_server *s, const struct cJSON *req, zsi_err *e);
/* The tokens of a prompt string; empty text gives the end-of-text id. */
bool zsi_encode(zs_server *s, const char *text, size_t n, int32_t **ids, int64_t *n_ids,
                zsi_err *e);

/* ---- server.c: jobs and the engine thread -------------------------------- */

/* One sample's output so far. */
typedef struct zsi_sample {
    int32_t *ids;            /* [n_tok] sampled tokens */
    float *lps;              /* [n_tok] their log probabilities */
    int32_t *top_ids;        /* [n_tok * top_logprobs] */
    float *top_lps;
    size_t *ends;            /* [n_tok] bytes of text once token t is in */
    int64_t n_tok, cap_tok;
    zsi_buf text;            /* the tokens' bytes, a stop string included */
    int64_t keep;            /* bytes of text to show (event text_bytes) */
    zs_finish finish;
} zsi_sample;

typedef struct zsi_job zsi_job;

/* One prompt's engine request: its zs_gen_request's user pointer. */
typedef struct zsi_part {
    zsi_job *job;
    int prompt;              /* index: its choices are prompt * n + sample */
    uint64_t engine_id;      /* engine thread only */
    bool added;              /* engine thread only: the engine took it */
} zsi_part;

struct zsi_job {
    atomic_int refs;
    pthread_mutex_t mu;      /* the fields up to `cancel` */
    pthread_cond_t cv;       /* signalled on every event of the job */
    zsi_params p;
    zsi_sample *s;           /* [p.n_choices] */
    int n_finished;
    bool admitted;           /* the engine took every prompt */
    bool done;               /* all choices finished, or fail_status set */
    int fail_status;         /* != 0: answer this status (400, 500, 503, 504) */
    char fail_msg[400];
    double t_arrival, t_first, t_done; /* zsi_clock() seconds; 0: not yet */
    bool cancel;             /* server mutex: the handler asked to abort */
    zsi_job *next_in;        /* server mutex: the incoming queue */
    zsi_part *parts;         /* [p.n_prompts] */
    /* engine thread only */
    bool aborted;
    uint64_t abort_step;     /* the server's step count when aborted */
    zsi_job *prev, *next;    /* the engine thread's list of live jobs */
};

/* Takes p (zeroed in the caller). A new job with one reference, or NULL. */
zsi_job *zsi_job_new(zsi_params *p);
void zsi_job_release(zsi_job *j);
/* Hands j to the engine thread (a reference of its own). 0, or the status
 * that refuses it: 429 (queue full) or 503 (stopping) into e. */
int zsi_submit(zs_server *s, zsi_job *j, zsi_err *e);
/* Asks the engine thread to abort j (no-op once done). */
void zsi_cancel(zs_server *s, zsi_job *j);
/* zs_server_get_stats with the server mutex held. */
void zsi_server_stats(zs_server *s, zs_server_stats *out);
double zsi_clock(void);                   /* monotonic seconds */
/* Condition variables on CLOCK_MONOTONIC, and a wait of at most `seconds`. */
bool zsi_cond_init(pthread_cond_t *cv);
void zsi_timedwait(pthread_cond_t *cv, pthread_mutex_t *mu, double seconds);

/* ---- metrics.c ----------------------------------------------------------- */

#define ZSI_NBUCKETS 16

typedef struct zsi_hist {
    int64_t count, bucket[ZSI_NBUCKETS + 1]; /* per upper bound, then +Inf */
    double sum;
} zsi_hist;

typedef struct zsi_metrics {
    int64_t by_status[600];
    int64_t prompt_tokens, generation_tokens;
    zsi_hist ttft, tpot, latency;
} zsi_metrics;

/* A finished job's tokens and times (server mutex held). */
void zsi_metrics_job(zsi_metrics *m, const zsi_job *j);
/* The Prometheus text of the metrics and engine stats (server mutex held). */
void zsi_metrics_text(zs_server *s, zsi_buf *out);
/* Counts q's status and writes its log line (takes the server mutex).
 * broken: the connection ended before the answer was complete. */
void zsi_log_request(zs_server *s, const zsi_conn *q, bool broken);

/* ---- http.c -------------------------------------------------------------- */

/* One HTTP request's state (libmicrohttpd's per-request pointer). */
struct zsi_conn {
    zs_server *s;
    struct MHD_Connection *c;
    int fd;                  /* the socket, to notice a client that left */
    int route;               /* index into http.c's table */
    zsi_buf body;
    bool too_big;
    double t0;
    int status;              /* what was answered (0: nothing yet) */
    zsi_job *job;            /* a generation's: one reference */
    char id[48];             /* "cmpl-...", "chatcmpl-..." or "req-..." */
    char method[16], path[96]; /* for the log (cut) */
};

/* Queues a reply: body (taken, may be NULL) with the content type. */
int zsi_reply(zsi_conn *q, int status, zsi_buf *body, const char *type);
/* Queues OpenAI's error object for e. */
int zsi_reply_err(zsi_conn *q, const zsi_err *e);
/* True when the client closed its end of the connection (fd: its
 * socket; poll with POLLRDHUP, no wait). */
bool zsi_client_gone(const zsi_conn *q);
bool zsi_fd_gone(int fd);
/* Starts or stops the HTTP daemon (server.c calls these). */
bool zsi_http_start(zs_server *s);
void zsi_http_quiesce(zs_server *s);
void zsi_http_stop(zs_server *s);

/* ---- respond.c / stream.c ------------------------------------------------ */

int zsi_handle_generate(zsi_conn *q, bool chat);
int zsi_handle_models(zsi_conn *q, const char *url);
int zsi_handle_tokenize(zsi_conn *q);
int zsi_handle_detokenize(zsi_conn *q);
/* Answers q's job (submitted, admitted) as server-sent events. */
int zsi_stream_start(zsi_conn *q);
/* Parts of answers that streams write too (job mutex held): the choice
 * logprobs of choice k's tokens [from, to) (completions: its prompt's
 * tokens first when echo; chat: "content" entries), the usage object
 * (summed over prompts and choices), and a prompt's text for echo
 * (appended to out; out->oom when it cannot be decoded). */
void zsi_json_logprobs(zs_server *s, const zsi_job *j, int k, int64_t from, int64_t to,
                       bool echo, zsi_buf *b);
void zsi_json_usage(const zsi_job *j, zsi_buf *b);
void zsi_prompt_text(zs_server *s, const zsi_prompt *p, zsi_buf *out);
/* The head of an answer or chunk: {"id":..,"object":..,"created":..,"model":.. */
void zsi_json_head(zs_server *s, const char *id, const char *object, zsi_buf *b);

/* ---- the server ---------------------------------------------------------- */

struct zs_server {
    zs_server_config c;      /* defaults filled in; the strings below */
    char *host, *api_key, *model;
    const zs_llm *m;
    const zs_bpe *tok;
    int64_t ctx, vocab;
    int32_t eot;
    zs_engine *e;            /* the engine thread's */
    struct MHD_Daemon *d;
    int port;
    pthread_t engine_thread;
    bool engine_started;
    pthread_mutex_t mu;      /* the fields below */
    pthread_cond_t wake;     /* for the engine thread: work arrived */
    pthread_cond_t idle;     /* for zs_server_stop: pending went down */
    zsi_job *in_head, *in_tail;
    int64_t n_incoming;      /* jobs in the incoming queue */
    int64_t live_jobs;       /* n_live as of the engine thread's last look */
    int n_cancel;            /* cancellations the engine thread has not seen */
    int64_t pending;         /* jobs handed over and not done */
    int64_t answering;       /* requests with a job whose answer is not done */
    bool draining;           /* refuse new requests (503) */
    bool cancel_all;         /* abort every job (stop's deadline passed) */
    bool quit;               /* the engine thread returns when idle */
    bool stopped;
    zs_engine_stats est;     /* the engine's, as of its thread's last step */
    zsi_job *live;           /* engine thread only: jobs in the engine */
    int64_t n_live;          /* engine thread only: their count */
    uint64_t steps;          /* engine thread only: steps run */
    zsi_metrics met;
    uint64_t next_id, seed_base;
    int64_t created;         /* Unix time of the start */
    pthread_mutex_t json_mu; /* cJSON's parser writes a global on every call */
    /* libmicrohttpd's threads count these without the mutex (http.c) */
    atomic_int_fast64_t n_conn;     /* connections open: STARTED .. CLOSED */
    atomic_int_fast64_t n_req;      /* requests: first callback .. on_completed */
    atomic_int_fast64_t n_refused;  /* 503s at the connection limit (total) */
};

#endif
