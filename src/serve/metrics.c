/*
 * metrics.c - what the server counts and how it says so: GET /metrics in
 * Prometheus' text format (names in the README), and one JSON line per
 * request in the log. Everything here runs under the server's mutex.
 *
 * Times are seconds. Time to first token runs from the request's hand-over
 * to the engine thread (queueing included) to its first sampled token;
 * time per output token is (last - first token time) / (tokens - 1) of the
 * request's longest choice, observed for requests of at least 2 tokens.
 * A request with several prompts counts once, its tokens summed (each
 * prompt's once, whatever n).
 */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "serve/internal.h"

static const double latency_bounds[ZSI_NBUCKETS] = {
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 50, 100};
static const double token_bounds[ZSI_NBUCKETS] = {
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1,
    2.5, 5};

static void observe(zsi_hist *h, const double *bounds, double v)
{
    int b = 0;
    while (b < ZSI_NBUCKETS && v > bounds[b])
        b++;
    h->bucket[b]++;
    h->count++;
    h->sum += v;
}

void zsi_metrics_job(zsi_metrics *m, const zsi_job *j)
{
    if (!j->admitted)
        return; /* refused: nothing ran */
    int64_t out = 0, longest = 0;
    for (int k = 0; k < j->p.n_choices; k++) {
        out += j->s[k].n_tok;
        longest = j->s[k].n_tok > longest ? j->s[k].n_tok : longest;
    }
    m->prompt_tokens += zsi_prompt_tokens(&j->p);
    m->generation_tokens += out;
    if (j->t_first > 0)
        observe(&m->ttft, latency_bounds, j->t_first - j->t_arrival);
    if (longest > 1 && j->t_done > j->t_first)
        observe(&m->tpot, token_bounds, (j->t_done - j->t_first) / (double)(longest - 1));
    observe(&m->latency, latency_bounds, j->t_done - j->t_arrival);
}

static void head(zsi_buf *b, const char *name, const char *type, const char *help)
{
    zsi_buf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void value(zsi_buf *b, const char *name, const char *type, const char *help,
                  int64_t v)
{
    head(b, name, type, help);
    zsi_buf_printf(b, "%s %lld\n", name, (long long)v);
}

static void histogram(zsi_buf *b, const char *name, const char *help, const zsi_hist *h,
                      const double *bounds)
{
    head(b, name, "histogram", help);
    int64_t cum = 0;
    for (int i = 0; i < ZSI_NBUCKETS; i++) {
        cum += h->bucket[i];
        zsi_buf_printf(b, "%s_bucket{le=\"%g\"} %lld\n", name, bounds[i], (long long)cum);
    }
    zsi_buf_printf(b, "%s_bucket{le=\"+Inf\"} %lld\n", name, (long long)h->count);
    zsi_buf_printf(b, "%s_sum %.6f\n%s_count %lld\n", name, h->sum, name,
                   (long long)h->count);
}

void zsi_metrics_text(zs_server *s, zsi_buf *b)
{
    const zsi_metrics *m = &s->met;
    const zs_engine_stats *e = &s->est;
    zs_server_stats h;
    zsi_server_stats(s, &h);
    head(b, "zs_requests_total", "counter", "HTTP requests answered, by status code.");
    for (int c = 100; c < 600; c++)
        if (m->by_status[c])
            zsi_buf_printf(b, "zs_requests_total{code=\"%d\"} %lld\n", c,
                           (long long)m->by_status[c]);
    value(b, "zs_prompt_tokens_total", "counter", "Prompt tokens of generation requests.",
          m->prompt_tokens);
    value(b, "zs_generation_tokens_total", "counter", "Tokens generated.",
          m->generation_tokens);
    histogram(b, "zs_time_to_first_token_seconds", "From arrival to the first token.",
              &m->ttft, latency_bounds);
    histogram(b, "zs_time_per_output_token_seconds", "Between tokens of a request.",
              &m->tpot, token_bounds);
    histogram(b, "zs_request_latency_seconds", "From arrival to the last token.",
              &m->latency, latency_bounds);
    value(b, "zs_requests_in_flight", "gauge", "Generation requests handed to the engine "
          "and not finished.", s->pending);
    value(b, "zs_running_sequences", "gauge", "Sequences in the running batch.", e->running);
    value(b, "zs_waiting_sequences", "gauge", "Sequences waiting for a slot.", e->waiting);
    value(b, "zs_kv_blocks_used", "gauge", "KV cache blocks held by sequences.",
          e->kv.used_blocks);
    value(b, "zs_kv_blocks_cached", "gauge", "Free KV blocks kept for prefix reuse.",
          e->kv.cached_blocks);
    value(b, "zs_kv_blocks_total", "gauge", "KV cache blocks in the pool.", e->kv.blocks);
    value(b, "zs_preemptions_total", "counter", "Sequences preempted for KV blocks.",
          e->preemptions);
    value(b, "zs_prefix_cache_hits_total", "counter", "Prompt blocks found in the prefix "
          "cache.", e->kv.prefix_hits);
    value(b, "zs_prefix_cache_queries_total", "counter", "Prompt blocks looked up in the "
          "prefix cache.", e->kv.prefix_queries);
    value(b, "zs_engine_steps_total", "counter", "Engine iterations.", e->steps);
    value(b, "zs_connections_open", "gauge", "TCP connections open (a thread each).",
          h.connections);
    value(b, "zs_http_requests_active", "gauge", "HTTP requests begun and not completed.",
          h.requests);
    value(b, "zs_generations_answering", "gauge", "Generation requests whose answer or "
          "stream is not over.", h.answering);
    value(b, "zs_requests_queued", "gauge", "Generation requests handed over and not yet "
          "taken by the engine thread.", h.queued);
    value(b, "zs_engine_requests", "gauge", "Generation requests in the engine.",
          h.engine_requests);
    value(b, "zs_connections_refused_total", "counter", "Connections answered 503 at "
          "max_connections.", h.refused_connections);
}

/* ---- the request log ---------------------------------------------------------- */

static void log_line(zs_server *s, const zsi_conn *q, bool broken, zsi_buf *b)
{
    double now = zsi_clock();
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    zsi_buf_printf(b, "{\"time\":%.3f,\"id\":\"%s\",\"method\":", (double)t.tv_sec +
                   1e-9 * (double)t.tv_nsec, q->id);
    zsi_buf_json_str(b, q->method, strlen(q->method));
    zsi_buf_puts(b, ",\"path\":");
    zsi_buf_json_str(b, q->path, strlen(q->path));
    zsi_buf_printf(b, ",\"status\":%d", q->status);
    zsi_job *j = q->job;
    if (j) {
        pthread_mutex_lock(&j->mu);
        int64_t out = 0;
        const char *why = NULL;
        for (int k = 0; k < j->p.n_choices; k++) {
            out += j->s[k].n_tok;
            why = why ? why : zs_finish_name(j->s[k].finish);
        }
        zsi_buf_printf(b, ",\"prompt_tokens\":%lld,\"completion_tokens\":%lld,\"ttft_s\":",
                       (long long)zsi_prompt_tokens(&j->p), (long long)out);
        zsi_buf_json_num(b, j->t_first > 0 ? j->t_first - j->t_arrival : NAN);
        zsi_buf_printf(b, ",\"finish_reason\":%s%s%s", why ? "\"" : "", why ? why : "null",
                       why ? "\"" : "");
        pthread_mutex_unlock(&j->mu);
    }
    zsi_buf_printf(b, ",\"latency_s\":%.6f%s}\n", now - q->t0,
                   broken ? ",\"broken\":true" : "");
}

void zsi_log_request(zs_server *s, const zsi_conn *q, bool broken)
{
    zsi_buf b = {0};
    if (s->c.log)
        log_line(s, q, broken, &b);
    pthread_mutex_lock(&s->mu);
    if (q->status >= 100 && q->status < 600)
        s->met.by_status[q->status]++;
    if (s->c.log && b.p && !b.oom) {
        fwrite(b.p, 1, b.len, s->c.log);
        fflush(s->c.log);
    }
    pthread_mutex_unlock(&s->mu);
    zsi_buf_free(&b);
}
