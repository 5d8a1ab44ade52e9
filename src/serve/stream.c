/*
 * stream.c - "stream": true: server-sent events read from a job as the
 * engine fills it. The response is libmicrohttpd's chunked callback
 * response; its reader runs on the connection's own thread and blocks on
 * the job's condition variable until there is something to send.
 *
 * Each event is "data: {chunk}\n\n": a chunk per choice per sampled token
 * (chat: a first chunk with the role), the last chunk of a choice carries
 * its finish_reason; choices of every prompt interleave, each chunk naming
 * its choice's index (prompt * n + sample). When every choice has ended:
 * a usage chunk (all prompts and choices) when
 * stream_options.include_usage asks, then "data: [DONE]\n\n" once. A job
 * that fails while streaming (server stopping, timeout, engine failure)
 * sends an OpenAI error object as its last event before [DONE].
 *
 * Text that could still become a stop string, or a UTF-8 character not
 * yet complete, is held back until the next token decides it (zs/serve.h),
 * so what was sent never has to be taken back. Quiet periods (a request
 * waiting for a slot) send an SSE comment (": waiting") every third of the
 * read timeout, at most 10 s, so that libmicrohttpd does not close the
 * connection as idle (clients ignore comments).
 */
#include <microhttpd.h>
#include <stdlib.h>
#include <string.h>

#include "serve/internal.h"

typedef struct stream {
    zs_server *s;
    zsi_job *j;          /* a reference */
    int fd;
    char id[48];
    int64_t *sent_tok;   /* [n_choices] tokens of choice k whose logprobs went out */
    size_t *sent_text;   /* [n_choices] bytes of choice k's text that went out */
    bool *started, *ended;
    zsi_buf *echo;       /* [n_prompts] each prompt's text, when echo */
    zsi_buf out;         /* events not yet handed to libmicrohttpd */
    size_t out_pos;
    bool over;           /* [DONE] is in out */
} stream;

static void stream_free(void *cls)
{
    stream *st = cls;
    for (int i = 0; st->echo && i < st->j->p.n_prompts; i++)
        zsi_buf_free(&st->echo[i]);
    free(st->echo);
    zsi_job_release(st->j);
    zsi_buf_free(&st->out);
    free(st->sent_tok), free(st->sent_text), free(st->started), free(st->ended);
    free(st);
}

/* The bytes of sample k's text that may go out once token t is in (job
 * mutex held): all of them after its last token, else what no stop
 * string or unfinished character could still claim. */
static size_t sendable(const stream *st, int k, int64_t t, bool last)
{
    const zsi_sample *sm = &st->j->s[k];
    size_t n = t >= 0 ? sm->ends[t] : 0;
    if (last) {
        n = sm->keep >= 0 && (size_t)sm->keep <= sm->text.len ? (size_t)sm->keep
                                                               : sm->text.len;
    } else {
        n -= zsi_stop_holdback(sm->text.p, n, st->j->p.stop, st->j->p.n_stop);
        n = zsi_utf8_complete(sm->text.p, n);
    }
    return n > st->sent_text[k] ? n : st->sent_text[k];
}

/* One chunk of choice k: text [sent, to) and tokens [sent, tok_to). */
static void chunk(stream *st, int k, size_t to, int64_t tok_to, bool last)
{
    zsi_job *j = st->j;
    const zsi_sample *sm = &j->s[k];
    zsi_buf *b = &st->out, text = {0};
    if (!st->started[k] && j->p.echo)
        zsi_buf_add(&text, st->echo[k / j->p.n].p, st->echo[k / j->p.n].len);
    zsi_buf_add(&text, sm->text.p + st->sent_text[k], to - st->sent_text[k]);
    zsi_buf_puts(b, "data: ");
    zsi_json_head(st->s, st->id, j->p.chat ? "chat.completion.chunk" : "text_completion", b);
    zsi_buf_printf(b, ",\"choices\":[{\"index\":%d,", k);
    if (j->p.chat) {
        zsi_buf_puts(b, st->started[k] ? "\"delta\":{" : "\"delta\":{\"role\":\"assistant\",");
        zsi_buf_puts(b, "\"content\":");
        zsi_buf_json_str(b, text.p, text.len);
        zsi_buf_puts(b, "}");
    } else {
        zsi_buf_puts(b, "\"text\":");
        zsi_buf_json_str(b, text.p, text.len);
    }
    zsi_buf_puts(b, ",\"logprobs\":");
    if (j->p.logprobs)
        zsi_json_logprobs(st->s, j, k, st->sent_tok[k], tok_to,
                          !st->started[k] && j->p.echo, b);
    else
        zsi_buf_puts(b, "null");
    const char *why = last ? zs_finish_name(sm->finish) : NULL;
    if (why)
        zsi_buf_printf(b, ",\"finish_reason\":\"%s\"}]}\n\n", why);
    else
        zsi_buf_puts(b, ",\"finish_reason\":null}]}\n\n");
    b->oom |= text.oom;
    zsi_buf_free(&text);
    st->started[k] = true;
    st->sent_tok[k] = tok_to;
    st->sent_text[k] = to;
    st->ended[k] = last;
}

/* Sample k's events for what is new: one chunk per token whose text
 * can go out (or whose logprobs are asked for), the last one with the
 * finish reason (job mutex held). */
static void produce_sample(stream *st, int k)
{
    zsi_job *j = st->j;
    const zsi_sample *sm = &j->s[k];
    bool fin = sm->finish != ZS_FINISH_NONE;
    if (!st->started[k] && (j->p.chat || j->p.echo) && !(fin && sm->n_tok == 0))
        chunk(st, k, st->sent_text[k], st->sent_tok[k], false); /* role, echo */
    for (int64_t t = st->sent_tok[k]; t < sm->n_tok; t++) {
        bool last = fin && t == sm->n_tok - 1;
        size_t to = sendable(st, k, t, last);
        if (to > st->sent_text[k] || j->p.logprobs || last)
            chunk(st, k, to, t + 1, last);
    }
    if (fin && !st->ended[k]) /* ended without a token (end of text, abort) */
        chunk(st, k, sendable(st, k, sm->n_tok - 1, true), sm->n_tok, true);
}

/* The end: usage, or the error, then [DONE] (job mutex held). */
static void finish(stream *st)
{
    zsi_job *j = st->j;
    zsi_buf *b = &st->out;
    if (j->fail_status) {
        zsi_buf_puts(b, "data: {\"error\":{\"message\":");
        zsi_buf_json_str(b, j->fail_msg, strlen(j->fail_msg));
        zsi_buf_printf(b, ",\"type\":\"server_error\",\"param\":null,\"code\":%d}}\n\n",
                       j->fail_status);
    } else if (j->p.include_usage) {
        zsi_buf_puts(b, "data: ");
        zsi_json_head(st->s, st->id, j->p.chat ? "chat.completion.chunk" : "text_completion",
                      b);
        zsi_buf_puts(b, ",\"choices\":[],\"usage\":");
        zsi_json_usage(j, b);
        zsi_buf_puts(b, "}\n\n");
    }
    zsi_buf_puts(b, "data: [DONE]\n\n");
    st->over = true;
}

/* Appends the events for what is new in the job (job mutex held). */
static void produce(stream *st)
{
    zsi_job *j = st->j;
    bool failed = j->done && j->fail_status;
    for (int k = 0; k < j->p.n_choices && !failed; k++)
        if (!st->ended[k])
            produce_sample(st, k);
    if (j->done && !st->over)
        finish(st);
}

static ssize_t reader(void *cls, uint64_t pos, char *buf, size_t max)
{
    stream *st = cls;
    zsi_job *j = st->j;
    double since = zsi_clock(), keepalive = st->s->c.read_timeout_s / 3;
    keepalive = keepalive < 10 ? keepalive : 10;
    if (st->out_pos == st->out.len) {
        st->out.len = st->out_pos = 0;
        if (st->over)
            return MHD_CONTENT_READER_END_OF_STREAM;
        pthread_mutex_lock(&j->mu);
        for (;;) {
            produce(st);
            if (st->out.len || st->out.oom)
                break;
            zsi_timedwait(&j->cv, &j->mu, 0.1);
            if (zsi_fd_gone(st->fd)) {
                pthread_mutex_unlock(&j->mu);
                return MHD_CONTENT_READER_END_WITH_ERROR; /* on_completed aborts */
            }
            if (zsi_clock() - since > keepalive) {
                zsi_buf_puts(&st->out, ": waiting\n\n");
                break;
            }
        }
        pthread_mutex_unlock(&j->mu);
        if (st->out.oom)
            return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    size_t n = st->out.len - st->out_pos < max ? st->out.len - st->out_pos : max;
    memcpy(buf, st->out.p + st->out_pos, n);
    st->out_pos += n;
    return (ssize_t)n;
}

/* Decodes every prompt's text into st->echo (the job asked for echo). */
static bool echo_texts(zs_server *s, stream *st)
{
    const zsi_params *p = &st->j->p;
    if (!(st->echo = calloc((size_t)p->n_prompts, sizeof *st->echo)))
        return false;
    bool ok = true;
    for (int i = 0; i < p->n_prompts; i++) {
        zsi_prompt_text(s, &p->prompts[i], &st->echo[i]);
        ok = ok && !st->echo[i].oom;
    }
    return ok;
}

int zsi_stream_start(zsi_conn *q)
{
    zsi_job *j = q->job;
    int n = j->p.n_choices;
    stream *st = calloc(1, sizeof *st);
    if (!st)
        return MHD_NO;
    st->s = q->s;
    st->fd = q->fd;
    memcpy(st->id, q->id, sizeof st->id);
    st->sent_tok = calloc((size_t)n, sizeof *st->sent_tok);
    st->sent_text = calloc((size_t)n, sizeof *st->sent_text);
    st->started = calloc((size_t)n, sizeof *st->started);
    st->ended = calloc((size_t)n, sizeof *st->ended);
    atomic_fetch_add(&j->refs, 1);
    st->j = j;
    bool echo_ok = !j->p.echo || echo_texts(q->s, st);
    struct MHD_Response *r = NULL;
    if (st->sent_tok && st->sent_text && st->started && st->ended && echo_ok)
        r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, reader, st,
                                              stream_free);
    if (!r) {
        stream_free(st);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    MHD_add_response_header(r, "X-Accel-Buffering", "no");
    enum MHD_Result ok = MHD_queue_response(q->c, 200, r);
    MHD_destroy_response(r);
    q->status = 200;
    return ok;
}
