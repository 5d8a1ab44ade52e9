/*
 * server.c - zs_server (zs/serve.h): start and stop, and the engine
 * thread, the only caller of zs_engine_*.
 *
 * Handlers hand jobs over through the server's queue (zsi_submit) and ask
 * for aborts by flagging a job (zsi_cancel); the engine thread adds what
 * arrived, aborts what was flagged, steps the engine while anything runs,
 * and sleeps on `wake` when idle. A job goes to the engine as one
 * zs_gen_request per prompt, each with the job's sampling (seed included)
 * and its zsi_part as the user pointer, so that an event names the job
 * and the prompt (choice prompt * n + sample). Token events land in the
 * job's buffers under the job's mutex and wake its handler.
 *
 * A job is done when every choice of every prompt has its final event.
 * Aborted jobs are the exception: the engine ends a request's samples
 * that were never forked without an event, so a job the engine thread
 * aborted (every prompt of it) is finalized here after the next step has
 * run (its reap delivers the events of the samples that exist and frees
 * the requests; until then an event may still name the job, so it stays
 * alive). A prompt the engine refuses fails the whole job the same way,
 * its prompts already added aborted.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "serve/internal.h"

double zsi_clock(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Waits on cv (made with CLOCK_MONOTONIC) for at most `seconds`. */
void zsi_timedwait(pthread_cond_t *cv, pthread_mutex_t *mu, double seconds)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    double ns = (double)t.tv_nsec + seconds * 1e9;
    t.tv_sec += (time_t)(ns / 1e9);
    t.tv_nsec = (long)(ns - 1e9 * (double)(time_t)(ns / 1e9));
    pthread_cond_timedwait(cv, mu, &t);
}

bool zsi_cond_init(pthread_cond_t *cv)
{
    pthread_condattr_t a;
    if (pthread_condattr_init(&a))
        return false;
    bool ok = !pthread_condattr_setclock(&a, CLOCK_MONOTONIC) && !pthread_cond_init(cv, &a);
    pthread_condattr_destroy(&a);
    return ok;
}

/* ---- jobs ------------------------------------------------------------------ */

zsi_job *zsi_job_new(zsi_params *p)
{
    zsi_job *j = calloc(1, sizeof *j);
    if (!j)
        return NULL;
    j->s = calloc((size_t)p->n_choices, sizeof *j->s);
    j->parts = calloc((size_t)p->n_prompts, sizeof *j->parts);
    if (!j->s || !j->parts || pthread_mutex_init(&j->mu, NULL)) {
        free(j->s), free(j->parts), free(j);
        return NULL;
    }
    if (!zsi_cond_init(&j->cv)) {
        pthread_mutex_destroy(&j->mu);
        free(j->s), free(j->parts), free(j);
        return NULL;
    }
    atomic_init(&j->refs, 1);
    for (int i = 0; i < p->n_prompts; i++)
        j->parts[i] = (zsi_part){.job = j, .prompt = i};
    j->p = *p;
    *p = (zsi_params){0};
    return j;
}

void zsi_job_release(zsi_job *j)
{
    if (!j || atomic_fetch_sub(&j->refs, 1) != 1)
        return;
    for (int i = 0; i < j->p.n_choices; i++) {
        zsi_sample *s = &j->s[i];
        free(s->ids), free(s->lps), free(s->top_ids), free(s->top_lps), free(s->ends);
        zsi_buf_free(&s->text);
    }
    free(j->s);
    free(j->parts);
    zsi_params_free(&j->p);
    pthread_cond_destroy(&j->cv);
    pthread_mutex_destroy(&j->mu);
    free(j);
}

int zsi_submit(zs_server *s, zsi_job *j, zsi_err *e)
{
    pthread_mutex_lock(&s->mu);
    int64_t most = s->c.engine.max_num_seqs + s->c.max_queue;
    int st = s->draining ? 503 : s->pending >= most ? 429 : 0;
    if (st == 0) {
        s->pending++;
        s->n_incoming++;
        j->t_arrival = zsi_clock();
        atomic_fetch_add(&j->refs, 1);
        if (s->in_tail)
            s->in_tail->next_in = j;
        else
            s->in_head = j;
        s->in_tail = j;
        pthread_cond_signal(&s->wake);
    }
    pthread_mutex_unlock(&s->mu);
    if (st == 503)
        zsi_err_set(e, 503, "server_error", NULL, "the server is shutting down");
    else if (st == 429)
        zsi_err_set(e, 429, "rate_limit_error", NULL, "the server has %lld requests in "
                    "flight, its limit (max_num_seqs + max_queue); retry later",
                    (long long)most);
    return st;
}

void zsi_cancel(zs_server *s, zsi_job *j)
{
    pthread_mutex_lock(&s->mu);
    if (!j->cancel) {
        j->cancel = true;
        s->n_cancel++;
        pthread_cond_signal(&s->wake);
    }
    pthread_mutex_unlock(&s->mu);
}

/* ---- the engine thread ------------------------------------------------------ */

static void unlink_live(zs_server *s, zsi_job *j)
{
    s->n_live--;
    if (j->prev)
        j->prev->next = j->next;
    else if (s->live == j)
        s->live = j->next;
    if (j->next)
        j->next->prev = j->prev;
    j->prev = j->next = NULL;
}

/* The engine is done with j: counters, metrics, its reference. */
static void job_finished(zs_server *s, zsi_job *j)
{
    unlink_live(s, j);
    pthread_mutex_lock(&s->mu);
    s->pending--;
    zsi_metrics_job(&s->met, j);
    pthread_cond_broadcast(&s->idle);
    pthread_mutex_unlock(&s->mu);
    zsi_job_release(j);
}

/* Ends j now: unfinished samples count as aborted; status != 0 fails it. */
static void finalize(zs_server *s, zsi_job *j, int status, const char *msg)
{
    pthread_mutex_lock(&j->mu);
    for (int i = 0; i < j->p.n_choices; i++)
        if (j->s[i].finish == ZS_FINISH_NONE)
            j->s[i].finish = ZS_FINISH_ABORT;
    j->n_finished = j->p.n_choices;
    if (status && !j->fail_status) {
        j->fail_status = status;
        snprintf(j->fail_msg, sizeof j->fail_msg, "%s", msg);
    }
    j->t_done = zsi_clock();
    j->done = true;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
    job_finished(s, j);
}

/* Appends the token of ev to sample sm (job mutex held). */
static bool sample_add(zs_server *s, zsi_sample *sm, int k, const zs_token_event *ev)
{
    if (sm->n_tok == sm->cap_tok) {
        int64_t c = sm->cap_tok ? 2 * sm->cap_tok : 16;
        int32_t *ids = realloc(sm->ids, (size_t)c * sizeof *ids);
        sm->ids = ids ? ids : sm->ids;
        float *lps = realloc(sm->lps, (size_t)c * sizeof *lps);
        sm->lps = lps ? lps : sm->lps;
        int32_t *ti = realloc(sm->top_ids, (size_t)(c * k + 1) * sizeof *ti);
        sm->top_ids = ti ? ti : sm->top_ids;
        float *tl = realloc(sm->top_lps, (size_t)(c * k + 1) * sizeof *tl);
        sm->top_lps = tl ? tl : sm->top_lps;
        size_t *ends = realloc(sm->ends, (size_t)c * sizeof *ends);
        sm->ends = ends ? ends : sm->ends;
        if (!ids || !lps || !ti || !tl || !ends)
            return false;
        sm->cap_tok = c;
    }
    int64_t t = sm->n_tok++;
    sm->ids[t] = ev->token;
    sm->lps[t] = ev->logprob;
    for (int i = 0; i < k; i++) {
        sm->top_ids[t * k + i] = i < ev->n_top ? ev->top_ids[i] : -1;
        sm->top_lps[t * k + i] = i < ev->n_top ? ev->top_logprobs[i] : 0;
    }
    size_t len = 0;
    const uint8_t *b = zs_bpe_token(s->tok, ev->token, &len);
    zsi_buf_add(&sm->text, b, b ? len : 0);
    sm->ends[t] = sm->text.len;
    return !sm->text.oom;
}

static void on_event(void *ctx, const zs_token_event *ev)
{
    zs_server *s = ctx;
    const zsi_part *part = ev->user;
    zsi_job *j = part->job;
    zsi_sample *sm = &j->s[part->prompt * j->p.n + ev->sample];
    int k = j->p.logprobs ? j->p.top_logprobs : 0;
    double now = zsi_clock();
    pthread_mutex_lock(&j->mu);
    if (ev->token >= 0 && !sample_add(s, sm, k, ev) && !j->fail_status) {
        j->fail_status = 500;
        snprintf(j->fail_msg, sizeof j->fail_msg, "out of memory");
    }
    if (ev->token >= 0 && j->t_first == 0)
        j->t_first = now;
    if (ev->text_bytes >= 0)
        sm->keep = ev->text_bytes;
    if (ev->finish != ZS_FINISH_NONE && sm->finish == ZS_FINISH_NONE) {
        sm->finish = ev->finish;
        j->n_finished++;
    }
    bool done = j->n_finished == j->p.n_choices && !j->aborted;
    if (done) {
        j->t_done = now;
        j->done = true;
    }
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
    if (done)
        job_finished(s, j);
}

/* Aborts j's prompts in the engine; it is finalized after the next step.
 * A status (400, 503, 504, 500) fails it with msg. */
static void abort_job(zs_server *s, zsi_job *j, int status, const char *msg)
{
    j->aborted = true;
    j->abort_step = s->steps;
    if (status) {
        pthread_mutex_lock(&j->mu);
        if (!j->fail_status) {
            j->fail_status = status;
            snprintf(j->fail_msg, sizeof j->fail_msg, "%s", msg);
        }
        pthread_mutex_unlock(&j->mu);
    }
    for (int i = 0; i < j->p.n_prompts; i++)
        if (j->parts[i].added) /* unknown once finished: fine */
            zs_engine_abort(s->e, j->parts[i].engine_id);
}

/* Adds j's prompts to the engine, one request each. A refusal fails the
 * job: at once when the engine took none of its prompts, else by aborting
 * those it took (the job is finalized after the next step). */
static void admit_job(zs_server *s, zsi_job *j)
{
    zsi_params *p = &j->p;
    j->next = s->live;
    if (s->live)
        s->live->prev = j;
    s->live = j;
    s->n_live++;
    for (int i = 0; i < p->n_prompts; i++) {
        zs_gen_request q = {.prompt = p->prompts[i].ids, .n_prompt = p->prompts[i].n,
                            .sampling = p->sampling, .max_tokens = p->max_tokens, .n = p->n,
                            .stop = (const char *const *)p->stop, .n_stop = p->n_stop,
                            .ignore_eos = p->ignore_eos,
                            .logprobs = p->logprobs ? p->top_logprobs : 0,
                            .user = &j->parts[i]};
        zs_status st = zs_engine_add(s->e, &q, &j->parts[i].engine_id);
        if (st != ZS_OK) {
            char msg[400];
            if (p->n_prompts > 1)
                snprintf(msg, sizeof msg, "prompt %d: %s", i, zs_last_error());
            else
                snprintf(msg, sizeof msg, "%s", zs_last_error());
            if (i == 0)
                finalize(s, j, st == ZS_ERR_NOMEM ? 503 : 400, msg);
            else
                abort_job(s, j, st == ZS_ERR_NOMEM ? 503 : 400, msg);
            return;
        }
        j->parts[i].added = true;
    }
    pthread_mutex_lock(&j->mu);
    j->admitted = true;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
}

/* Hands the jobs that arrived to the engine. */
static void admit(zs_server *s, zsi_job *in)
{
    while (in) {
        zsi_job *j = in;
        in = in->next_in;
        j->next_in = NULL;
        admit_job(s, j);
    }
}

/* Aborts the flagged jobs (server mutex held), every job when stopping,
 * and jobs past the request timeout. */
static void aborts(zs_server *s, bool all, double now)
{
    char msg[128];
    snprintf(msg, sizeof msg, "the request ran past the server's timeout of %g s",
             s->c.request_timeout_s);
    for (zsi_job *j = s->live; j; j = j->next) {
        if (j->aborted)
            continue;
        if (all)
            abort_job(s, j, 503, "the server is shutting down");
        else if (j->cancel)
            abort_job(s, j, 0, NULL);
        else if (now - j->t_arrival > s->c.request_timeout_s)
            abort_job(s, j, 504, msg);
    }
}

/* After a step: the jobs aborted before it have had their last events. */
static void reap_aborted(zs_server *s)
{
    for (zsi_job *j = s->live, *next; j; j = next) {
        next = j->next;
        if (j->aborted && j->abort_step < s->steps)
            finalize(s, j, 0, NULL);
    }
}

/* A failed step: every live job fails with the engine's message. */
static void fail_all(zs_server *s, const char *why)
{
    char msg[400];
    snprintf(msg, sizeof msg, "the engine failed: %s", why);
    fprintf(stderr, "zs serve: %s\n", msg);
    for (zsi_job *j = s->live; j; j = j->next)
        if (!j->aborted)
            abort_job(s, j, 500, msg);
}

static void *engine_main(void *arg)
{
    zs_server *s = arg;
    double last_scan = 0;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        zsi_job *in = s->in_head;
        s->in_head = s->in_tail = NULL;
        s->n_incoming = 0;
        bool scan = s->n_cancel > 0 || s->cancel_all;
        s->n_cancel = 0;
        pthread_mutex_unlock(&s->mu);
        admit(s, in);
        double now = zsi_clock();
        if (scan || now - last_scan > 0.25) {
            pthread_mutex_lock(&s->mu);
            aborts(s, s->cancel_all, now);
            pthread_mutex_unlock(&s->mu);
            last_scan = now;
        }
        if (zs_engine_busy(s->e)) {
            zs_status st = zs_engine_step(s->e, on_event, s);
            s->steps++;
            if (st != ZS_OK)
                fail_all(s, zs_last_error());
            reap_aborted(s);
        }
        pthread_mutex_lock(&s->mu);
        zs_engine_get_stats(s->e, &s->est);
        s->live_jobs = s->n_live;
        if (!zs_engine_busy(s->e) && !s->in_head && !s->n_cancel) {
            if (s->quit)
                break;
            pthread_cond_wait(&s->wake, &s->mu);
        }
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* ---- start and stop -------------------------------------------------------- */

static char *dup_or(const char *s, const char *dflt)
{
    return strdup(s && *s ? s : dflt ? dflt : "");
}

static zs_status configure(zs_server *s, const zs_server_config *cfg)
{
    zs_server_config c = cfg ? *cfg : (zs_server_config){0};
    c.max_queue = c.max_queue ? c.max_queue : 256;
    c.max_body_bytes = c.max_body_bytes ? c.max_body_bytes : 1 << 20;
    c.max_connections = c.max_connections ? c.max_connections : 512;
    c.read_timeout_s = c.read_timeout_s > 0 ? c.read_timeout_s : 30;
    c.request_timeout_s = c.request_timeout_s > 0 ? c.request_timeout_s : 600;
    c.engine.max_num_seqs = c.engine.max_num_seqs ? c.engine.max_num_seqs : 64;
    if (c.port < 0 || c.port > 65535 || c.max_queue < 0 || c.max_body_bytes < 0 ||
        c.max_connections < 1 || c.engine.max_num_seqs < 0)
        return zs_set_error("serve: port %d, max_queue %lld, max_body_bytes %lld, "
                            "max_connections %d: expected a port in 0 .. 65535 and "
                            "positive limits", c.port, (long long)c.max_queue,
                            (long long)c.max_body_bytes, c.max_connections);
    s->host = dup_or(c.host, "127.0.0.1");
    s->api_key = c.api_key && *c.api_key ? strdup(c.api_key) : NULL;
    s->model = dup_or(c.model_name, "zs");
    if (!s->host || !s->model || (c.api_key && *c.api_key && !s->api_key))
        return zs_set_error_code(ZS_ERR_NOMEM, "serve: out of memory");
    c.host = s->host, c.api_key = s->api_key, c.model_name = s->model;
    s->c = c;
    return ZS_OK;
}

zs_server *zs_server_start(const zs_llm *m, const zs_bpe *tok, const zs_server_config *cfg)
{
    if (!m || !tok) {
        zs_set_error("serve: a model and its tokenizer are required");
        return NULL;
    }
    zs_server *s = calloc(1, sizeof *s);
    if (!s) {
        zs_set_error_code(ZS_ERR_NOMEM, "serve: out of memory");
        return NULL;
    }
    s->stopped = true; /* nothing to stop until the threads run */
    bool locks = !pthread_mutex_init(&s->mu, NULL) && !pthread_mutex_init(&s->json_mu, NULL) &&
                 !pthread_cond_init(&s->wake, NULL) && zsi_cond_init(&s->idle);
    if (!locks || configure(s, cfg) != ZS_OK ||
        !(s->e = zs_engine_new(m, tok, &s->c.engine))) {
        if (!locks)
            zs_set_error("serve: cannot make locks");
        zs_server_free(s);
        return NULL;
    }
    s->m = m, s->tok = tok;
    s->ctx = zs_llm_config(m)->ctx;
    s->vocab = zs_llm_config(m)->vocab;
    s->eot = zs_bpe_eot(tok);
    s->created = (int64_t)time(NULL);
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    s->seed_base = (uint64_t)t.tv_sec * 1000000007ull ^ (uint64_t)t.tv_nsec;
    if (pthread_create(&s->engine_thread, NULL, engine_main, s)) {
        zs_set_error("serve: cannot start the engine thread");
        zs_server_free(s);
        return NULL;
    }
    s->engine_started = true;
    s->stopped = false;
    if (!zsi_http_start(s)) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", zs_last_error());
        zs_server_free(s);
        zs_set_error("%s", msg);
        return NULL;
    }
    return s;
}

int zs_server_port(const zs_server *s) { return s->port; }

void zsi_server_stats(zs_server *s, zs_server_stats *out)
{
    *out = (zs_server_stats){
        .connections = atomic_load(&s->n_conn),
        .requests = atomic_load(&s->n_req),
        .refused_connections = atomic_load(&s->n_refused),
        .answering = s->answering,
        .in_flight = s->pending,
        .queued = s->n_incoming,
        .engine_requests = s->live_jobs,
        .running = s->est.running,
        .waiting = s->est.waiting,
        .kv_blocks_used = s->est.kv.used_blocks,
    };
}

void zs_server_get_stats(zs_server *s, zs_server_stats *out)
{
    pthread_mutex_lock(&s->mu);
    zsi_server_stats(s, out);
    pthread_mutex_unlock(&s->mu);
}

/* Waits until no job is pending or `until` (zsi_now) passes (mutex held). */
static void wait_idle(zs_server *s, double until)
{
    while (s->pending > 0 && zsi_clock() < until)
        zsi_timedwait(&s->idle, &s->mu, until - zsi_clock());
}

void zs_server_stop(zs_server *s, double grace_seconds)
{
    if (!s || s->stopped)
        return;
    pthread_mutex_lock(&s->mu);
    s->draining = true;
    pthread_mutex_unlock(&s->mu);
    zsi_http_quiesce(s);
    pthread_mutex_lock(&s->mu);
    wait_idle(s, zsi_clock() + (grace_seconds > 0 ? grace_seconds : 0));
    s->cancel_all = true; /* aborted at the next look, done after a step */
    s->quit = true;
    pthread_cond_signal(&s->wake);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->engine_thread, NULL);
    s->engine_started = false;
    /* every job is done: let the answers and the streams' last events go
     * out before the connections are closed (a client that does not read
     * gets cut after a second) */
    pthread_mutex_lock(&s->mu);
    double until = zsi_clock() + 1;
    while (s->answering > 0 && zsi_clock() < until)
        zsi_timedwait(&s->idle, &s->mu, until - zsi_clock());
    pthread_mutex_unlock(&s->mu);
    zsi_http_stop(s);
    s->stopped = true;
}

void zs_server_free(zs_server *s)
{
    if (!s)
        return;
    zs_server_stop(s, 0);
    zs_engine_free(s->e);
    pthread_cond_destroy(&s->idle);
    pthread_cond_destroy(&s->wake);
    pthread_mutex_destroy(&s->json_mu);
    pthread_mutex_destroy(&s->mu);
    free(s->host), free(s->api_key), free(s->model);
    free(s);
}
