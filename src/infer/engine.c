/*
 * engine.c - zs_engine (zs/infer.h): continuous batching over a paged KV
 * cache, as in Orca and vLLM.
 *
 * Every step builds one flat batch under the token budget: first the
 * running sequences in arrival order (one decode token each, or the next
 * chunk of a prompt still being prefilled), then waiting sequences, first
 * come first served, each starting after the longest run of its prompt
 * found in the prefix cache. When the pool has no block for a running
 * sequence, the newest running sequence is preempted: its blocks are
 * freed and it goes back to the head of the queue, to be recomputed from
 * its prompt and output so far (the same tokens come back: batch
 * invariance, and each token is drawn with zs_philox(seed, index)).
 *
 * A request with n > 1 samples prefills its prompt once (sample 0); when
 * the prompt's last logits are in, samples 1 .. n-1 fork sample 0's
 * blocks and draw their first tokens from the same logits. The shared
 * partial block is copied when one of them writes into it.
 *
 * Threads: one thread drives an engine (the kernels use the pool).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "infer/internal.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/softmax.h"

enum { WAITING, RUNNING, DONE };

typedef struct req req;

typedef struct seq {
    req *r;
    int sample, state;
    uint64_t arrival;        /* order of creation: preemption takes the newest */
    int32_t *tok;            /* prompt + output */
    int64_t n_tok, cap, n_prompt, n_out;
    int64_t computed;        /* positions whose K and V are in the pool */
    zs_kv_seq kv;
    char *text;              /* output bytes (with a tokenizer) */
    int64_t n_text, cap_text, keep;
    zs_finish finish;
    bool reported;           /* its last event went out */
} seq;

struct req {
    uint64_t id;
    zs_gen_request q;        /* prompt, stop ids and strings owned */
    seq **s;                 /* [q.n]; s[i] NULL until forked */
    int n_live;              /* samples not yet reported done */
    bool forked;
    bool aborted;            /* its samples never forked still owe an event */
    req *next;
};

/* One scheduled piece of the step: positions [start, start + count). */
typedef struct piece {
    seq *s;
    int64_t start, count;
    bool logits;
} piece;

struct zs_engine {
    const zs_llm *m;
    const zs_bpe *bpe;
    zs_engine_config c;
    zs_kv_pool *pool;
    zsi_work work;
    req *reqs;               /* every live request */
    seq **run, **wait;       /* running (arrival order), waiting (queue order) */
    int64_t n_run, n_wait, cap_run, cap_wait;
    uint64_t next_id, next_arrival;
    int32_t eot;
    /* per step */
    piece *pieces;
    int32_t *b_tok;
    int64_t *b_pos, *b_out;
    const int32_t **b_tab;
    void *logits;
    float *row;              /* f32 logits of one row */
    int64_t cap_rows;
    int64_t *pads;           /* static batching: [max_num_seqs] prompt padding
                              * of the members admitted this step */
    int64_t n_pads;
    zs_engine_stats st;
};

static zs_status oom(void)
{
    return zs_set_error_code(ZS_ERR_NOMEM, "engine: out of memory");
}

const char *zs_finish_name(zs_finish f)
{
    static const char *const n[] = {NULL, "length", "stop", "abort"};
    return (unsigned)f < 4 ? n[f] : NULL;
}

/* ---- lists ------------------------------------------------------------- */

static zs_status push(seq ***a, int64_t *n, int64_t *cap, seq *s, bool front)
{
    if (*n == *cap) {
        int64_t c = *cap ? 2 * *cap : 16;
        seq **b = realloc(*a, (size_t)c * sizeof *b);
        if (!b)
            return oom();
        *a = b, *cap = c;
    }
    if (front) {
        memmove(*a + 1, *a, (size_t)*n * sizeof **a);
        (*a)[0] = s;
    } else {
        (*a)[*n] = s;
    }
    (*n)++;
    return ZS_OK;
}

static void remove_at(seq **a, int64_t *n, int64_t i)
{
    memmove(a + i, a + i + 1, (size_t)(*n - i - 1) * sizeof *a);
    (*n)--;
}

static void remove_seq(seq **a, int64_t *n, const seq *s)
{
    for (int64_t i = 0; i < *n; i++)
        if (a[i] == s) {
            remove_at(a, n, i);
            return;
        }
}

/* Into the running list at its place in arrival order (a preempted
 * sequence comes back older than those admitted meanwhile). */
static zs_status insert_running(zs_engine *e, seq *s)
{
    zs_status st = push(&e->run, &e->n_run, &e->cap_run, s, false);
    for (int64_t i = e->n_run - 1; st == ZS_OK && i > 0 &&
                                   e->run[i - 1]->arrival > s->arrival; i--) {
        e->run[i] = e->run[i - 1];
        e->run[i - 1] = s;
    }
    return st;
}

/* ---- engine ------------------------------------------------------------ */

static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

static zs_status check_config(const zs_llm *m, zs_engine_config *c)
{
    int64_t ctx = m->c.ctx;
    c->block_size = c->block_size ? c->block_size : 16;
    c->max_num_seqs = c->max_num_seqs ? c->max_num_seqs : 64;
    c->max_batched_tokens = c->max_batched_tokens ? c->max_batched_tokens : 512;
    if (c->block_size < 1 || c->block_size > 4096 || c->max_num_seqs < 1 ||
        c->max_batched_tokens < 1 || c->kv_blocks < 0)
        return zs_set_error("engine: block size %lld, %lld sequences, %lld tokens per "
                            "step, %lld KV blocks: expected block size 1 .. 4096 and "
                            "positive counts", (long long)c->block_size,
                            (long long)c->max_num_seqs, (long long)c->max_batched_tokens,
                            (long long)c->kv_blocks);
    if (c->kv_dtype == ZS_F32)
        c->kv_dtype = m->dt;
    if (c->kv_dtype != m->dt && !(m->dt == ZS_F32 && (c->kv_dtype == ZS_BF16 ||
                                                      c->kv_dtype == ZS_F16)))
        return zs_set_error("engine: a KV cache in %s for a model that computes in %s "
                            "(expected the model's dtype, or bf16 or f16 for f32)",
                            zs_dtype_name(c->kv_dtype), zs_dtype_name(m->dt));
    int64_t per_ctx = cdiv(ctx, c->block_size);
    if (c->kv_blocks == 0) {
        int64_t bb = 2 * m->c.layers * c->block_size * m->c.width *
                     (int64_t)zs_dtype_size(c->kv_dtype);
        int64_t cap = ((int64_t)1 << 30) / bb;
        c->kv_blocks = per_ctx * c->max_num_seqs;
        c->kv_blocks = c->kv_blocks < cap ? c->kv_blocks : cap;
        c->kv_blocks = c->kv_blocks > per_ctx + 1 ? c->kv_blocks : per_ctx + 1;
    }
    if (c->kv_blocks < per_ctx)
        return zs_set_error("engine: %lld KV blocks of %lld tokens cannot hold one "
                            "sequence of the model's context (%lld tokens: %lld blocks)",
                            (long long)c->kv_blocks, (long long)c->block_size,
                            (long long)ctx, (long long)per_ctx);
    return ZS_OK;
}

zs_engine *zs_engine_new(const zs_llm *m, const zs_bpe *tokenizer,
                         const zs_engine_config *cfg)
{
    zs_engine_config c = cfg ? *cfg : (zs_engine_config){0};
    if (!m) {
        zs_set_error("engine: no model");
        return NULL;
    }
    if (check_config(m, &c) != ZS_OK)
        return NULL;
    zs_engine *e = calloc(1, sizeof *e);
    if (!e) {
        oom();
        return NULL;
    }
    e->m = m;
    e->bpe = tokenizer;
    e->c = c;
    e->next_id = 1;
    e->eot = tokenizer ? zs_bpe_eot(tokenizer) : -1;
    zs_kv_pool_config pc = {m->c.layers, m->c.heads, m->c.width / m->c.heads,
                            c.block_size, c.kv_blocks, c.kv_dtype};
    e->row = malloc((size_t)m->c.vocab * sizeof *e->row);
    e->pads = c.static_batching ? malloc((size_t)c.max_num_seqs * sizeof *e->pads) : NULL;
    if (!(e->pool = zs_kv_pool_new_on(&pc, m->device)) || !e->row ||
        (c.static_batching && !e->pads)) {
        if (e->pool)
            oom();
        zs_engine_free(e);
        return NULL;
    }
    return e;
}

static void seq_free(zs_engine *e, seq *s)
{
    if (!s)
        return;
    zs_kv_seq_release(e->pool, &s->kv);
    free(s->kv.blocks);
    free(s->tok);
    free(s->text);
    free(s);
}

static void req_free(zs_engine *e, req *r)
{
    for (int i = 0; i < r->q.n; i++)
        seq_free(e, r->s[i]);
    free(r->s);
    free((void *)r->q.prompt);
    free((void *)r->q.stop_ids);
    for (int i = 0; i < r->q.n_stop; i++)
        free((void *)r->q.stop[i]);
    free((void *)r->q.stop);
    free(r);
}

void zs_engine_free(zs_engine *e)
{
    if (!e)
        return;
    while (e->reqs) {
        req *r = e->reqs;
        e->reqs = r->next;
        req_free(e, r);
    }
    zs_kv_pool_free(e->pool);
    zsi_work_free(&e->work);
    free(e->run), free(e->wait), free(e->pieces), free(e->b_tok), free(e->b_pos);
    free(e->b_out), free(e->b_tab), free(e->logits), free(e->row);
    free(e->pads);
    free(e);
}

bool zs_engine_busy(const zs_engine *e) { return e->reqs != NULL; }

void zs_engine_get_stats(const zs_engine *e, zs_engine_stats *st)
{
    *st = e->st;
    st->running = e->n_run;
    st->waiting = e->n_wait;
    zs_kv_pool_get_stats(e->pool, &st->kv);
}

/* ---- requests ---------------------------------------------------------- */

static zs_status check_sampler(const zs_sampler *s)
{
    if (!(s->temperature >= 0 && s->temperature <= 1e6) || s->top_k < 0 ||
        !(s->top_p >= 0 && s->top_p <= 1) || !(s->min_p >= 0 && s->min_p <= 1) ||
        !(s->repetition_penalty >= 0 && s->repetition_penalty <= 1e6) ||
        !(fabs(s->presence_penalty) <= 1e6) || !(fabs(s->frequency_penalty) <= 1e6))
        return zs_set_error("engine: sampling temperature %g, top_k %d, top_p %g, min_p "
                            "%g, penalties %g %g %g: expected temperature >= 0, top_k "
                            ">= 0, top_p and min_p in [0, 1], finite penalties and "
                            "repetition_penalty >= 0", s->temperature, s->top_k,
                            s->top_p, s->min_p, s->repetition_penalty,
                            s->presence_penalty, s->frequency_penalty);
    return ZS_OK;
}

static zs_status check_request(const zs_engine *e, const zs_gen_request *q)
{
    int64_t V = e->m->c.vocab, ctx = e->m->c.ctx;
    if (!q->prompt || q->n_prompt < 1)
        return zs_set_error("engine: empty prompt");
    if (q->n_prompt >= ctx)
        return zs_set_error("engine: the prompt has %lld tokens; the model's context "
                            "is %lld, which leaves no room to generate",
                            (long long)q->n_prompt, (long long)ctx);
    for (int64_t i = 0; i < q->n_prompt; i++)
        if (q->prompt[i] < 0 || q->prompt[i] >= V)
            return zs_set_error("engine: prompt token %lld is %d, outside the "
                                "vocabulary of %lld", (long long)i, q->prompt[i],
                                (long long)V);
    for (int i = 0; i < q->n_stop_ids; i++)
        if (!q->stop_ids || q->stop_ids[i] < 0 || q->stop_ids[i] >= V)
            return zs_set_error("engine: stop token id %d is outside the vocabulary",
                                q->stop_ids ? q->stop_ids[i] : -1);
    if (q->n_stop > 0 && !e->bpe)
        return zs_set_error("engine: stop strings need a tokenizer");
    for (int i = 0; i < q->n_stop; i++)
        if (!q->stop || !q->stop[i] || !q->stop[i][0])
            return zs_set_error("engine: stop string %d is empty", i);
    if (q->n < 0 || q->n > 256 || q->max_tokens < 0 || q->n_stop < 0 ||
        q->n_stop_ids < 0 || q->logprobs < 0 || q->logprobs > ZS_MAX_LOGPROBS)
        return zs_set_error("engine: n %d, max_tokens %lld, logprobs %d: expected n in "
                            "0 .. 256, max_tokens >= 0, logprobs in 0 .. %d", q->n,
                            (long long)q->max_tokens, q->logprobs, ZS_MAX_LOGPROBS);
    return check_sampler(&q->sampling);
}

static void *dup(const void *p, size_t n)
{
    void *q = malloc(n ? n : 1);
    if (q && n)
        memcpy(q, p, n);
    return q;
}

/* The request's own copies of what the caller's arrays held. */
static bool copy_request(req *r, const zs_gen_request *q)
{
    r->q = *q;
    r->q.n = q->n ? q->n : 1;
    r->q.prompt = dup(q->prompt, (size_t)q->n_prompt * sizeof *q->prompt);
    r->q.stop_ids = dup(q->stop_ids, (size_t)q->n_stop_ids * sizeof *q->stop_ids);
    r->q.stop = calloc((size_t)q->n_stop + 1, sizeof *r->q.stop);
    r->q.n_stop = 0;
    bool ok = r->q.prompt && r->q.stop_ids && r->q.stop;
    for (int i = 0; ok && i < q->n_stop; i++, r->q.n_stop++)
        ok = (((const char **)r->q.stop)[i] = dup(q->stop[i], strlen(q->stop[i]) + 1));
    if (r->q.sampling.top_p == 0)
        r->q.sampling.top_p = 1; /* a zeroed sampler means: off */
    return ok;
}

static seq *seq_new(zs_engine *e, req *r, int sample, const int32_t *tok, int64_t n)
{
    seq *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->r = r;
    s->sample = sample;
    s->arrival = e->next_arrival++;
    s->cap = n + 16;
    s->tok = malloc((size_t)s->cap * sizeof *s->tok);
    if (!s->tok) {
        free(s);
        return NULL;
    }
    memcpy(s->tok, tok, (size_t)n * sizeof *tok);
    s->n_tok = n;
    s->n_prompt = r->q.n_prompt;
    zs_kv_seq_init(&s->kv);
    return s;
}

zs_status zs_engine_add(zs_engine *e, const zs_gen_request *q, uint64_t *id)
{
    zs_status st = check_request(e, q);
    if (st != ZS_OK)
        return st;
    req *r = calloc(1, sizeof *r);
    if (!r)
        return oom();
    bool ok = copy_request(r, q) && (r->s = calloc((size_t)r->q.n, sizeof *r->s)) &&
              (r->s[0] = seq_new(e, r, 0, r->q.prompt, r->q.n_prompt)) &&
              push(&e->wait, &e->n_wait, &e->cap_wait, r->s[0], false) == ZS_OK;
    if (!ok) {
        if (r->s && r->s[0])
            remove_seq(e->wait, &e->n_wait, r->s[0]);
        req_free(e, r);
        return oom();
    }
    r->id = e->next_id++;
    r->n_live = r->q.n;
    r->next = e->reqs;
    e->reqs = r;
    e->st.prompt_tokens += q->n_prompt;
    if (id)
        *id = r->id;
    return ZS_OK;
}

zs_status zs_engine_abort(zs_engine *e, uint64_t id)
{
    req *r = e->reqs;
    while (r && r->id != id)
        r = r->next;
    if (!r)
        return zs_set_error("engine: no request %llu", (unsigned long long)id);
    for (int i = 0; i < r->q.n; i++) {
        seq *s = r->s[i];
        if (!s || s->state == DONE)
            continue;
        remove_seq(s->state == RUNNING ? e->run : e->wait,
                   s->state == RUNNING ? &e->n_run : &e->n_wait, s);
        zs_kv_seq_release(e->pool, &s->kv);
        s->state = DONE;
        s->finish = ZS_FINISH_ABORT;
    }
    r->aborted = !r->forked; /* samples never forked are reported by reap */
    return ZS_OK;
}

/* ---- scheduling -------------------------------------------------------- */

static zs_status reserve_rows(zs_engine *e, int64_t rows)
{
    if (rows <= e->cap_rows)
        return ZS_OK;
    int64_t c = rows > 2 * e->cap_rows ? rows : 2 * e->cap_rows;
    size_t V = (size_t)e->m->c.vocab, es = zs_dtype_size(e->m->dt);
    free(e->pieces), free(e->b_tok), free(e->b_pos), free(e->b_out), free(e->b_tab);
    free(e->logits);
    e->pieces = malloc((size_t)c * sizeof *e->pieces);
    e->b_tok = malloc((size_t)c * sizeof *e->b_tok);
    e->b_pos = malloc((size_t)c * sizeof *e->b_pos);
    e->b_out = malloc((size_t)c * sizeof *e->b_out);
    e->b_tab = malloc((size_t)c * sizeof *e->b_tab);
    e->logits = malloc((size_t)c * V * es);
    e->cap_rows = c;
    if (!e->pieces || !e->b_tok || !e->b_pos || !e->b_out || !e->b_tab || !e->logits) {
        e->cap_rows = 0;
        return oom();
    }
    return ZS_OK;
}

/* Frees s's blocks and queues it first, to be recomputed. A finished
 * sequence (static batching's padding) has nothing to recompute: it ends
 * here, as finish() ends one in continuous batching; queued, it would be
 * freed with its request by reap() while still in the wait list. */
static zs_status preempt(zs_engine *e, seq *s)
{
    remove_seq(e->run, &e->n_run, s);
    zs_kv_seq_release(e->pool, &s->kv);
    s->computed = 0;
    if (s->finish != ZS_FINISH_NONE) {
        s->state = DONE;
        return ZS_OK;
    }
    s->state = WAITING;
    e->st.preemptions++;
    return push(&e->wait, &e->n_wait, &e->cap_wait, s, true);
}

/* Claims `count` positions for s, preempting the newest running sequences
 * (never one already scheduled this step: those are older than s) while
 * the pool is short. False when s itself had to go. */
static bool claim(zs_engine *e, seq *s, int64_t count, zs_status *st)
{
    for (;;) {
        zs_status a = zs_kv_seq_append(e->pool, &s->kv, count);
        if (a == ZS_OK)
            return true;
        if (a != ZS_ERR_NOMEM) {
            *st = a;
            return false;
        }
        seq *victim = e->run[e->n_run - 1]; /* the newest: run is in arrival order */
        if ((*st = preempt(e, victim)) != ZS_OK || victim == s)
            return false;
    }
}

/* The positions s computes this step, under the budget. */
static int64_t want(const zs_engine *e, const seq *s, int64_t budget)
{
    int64_t n = s->n_tok - s->computed;
    (void)e;
    return n < budget ? n : budget;
}

typedef struct plan {
    int64_t n_pieces, rows, budget;
    int64_t pad_rows, pad_max; /* static batching's prompt padding this step
                                * (e->pads: per member) */
} plan;

static void add_piece(zs_engine *e, plan *p, seq *s, int64_t count)
{
    e->pieces[p->n_pieces++] = (piece){s, s->computed, count,
                                       s->computed + count == s->n_tok};
    p->rows += count;
    p->budget -= count;
}

/* Running sequences first, in arrival order. */
static zs_status schedule_running(zs_engine *e, plan *p, bool *preempted)
{
    zs_status st = ZS_OK;
    for (int64_t i = 0; i < e->n_run && p->budget > 0; i++) {
        seq *s = e->run[i];
        int64_t c = want(e, s, p->budget);
        if (c == 0)
            continue;
        int64_t before = e->st.preemptions;
        bool ok = claim(e, s, c, &st);
        *preempted = *preempted || e->st.preemptions != before;
        if (st != ZS_OK)
            return st;
        if (!ok)
            break; /* s itself went back to the queue */
        add_piece(e, p, s, c);
    }
    return ZS_OK;
}

/* A static batch just admitted as run[first ..]: every member's prefill
 * padded to the longest (p->pad_rows rows in all, p->pad_max at most for
 * one member). */
static void plan_padding(zs_engine *e, plan *p, int64_t first)
{
    int64_t most = 0;
    for (int64_t i = first; i < e->n_run; i++) {
        const seq *s = e->run[i];
        most = s->n_tok - s->computed > most ? s->n_tok - s->computed : most;
    }
    e->n_pads = 0;
    for (int64_t i = first; i < e->n_run; i++) {
        int64_t pad = most - (e->run[i]->n_tok - e->run[i]->computed);
        e->pads[e->n_pads++] = pad;
        p->pad_rows += pad;
        p->pad_max = pad > p->pad_max ? pad : p->pad_max;
    }
}

/* Computes the step's prompt padding (static batching): member i's pads[i]
 * rows of token 0 at positions 0 .. pads[i] - 1 of a scratch sequence (the
 * members share it: what the rows leave there is never read by a real
 * sequence), at most cap_rows rows per forward, no logits. Without blocks
 * for the scratch it pads nothing: real sequences never wait for padding. */
static zs_status run_padding(zs_engine *e, const plan *p)
{
    zs_kv_seq pad;
    zs_kv_seq_init(&pad);
    if (zs_kv_seq_append(e->pool, &pad, p->pad_max) != ZS_OK) {
        zs_kv_seq_release(e->pool, &pad);
        zs_clear_error();
        return ZS_OK;
    }
    zs_status st = ZS_OK;
    int64_t i = 0, t = 0;
    while (st == ZS_OK && i < e->n_pads) {
        int64_t n = 0;
        for (; i < e->n_pads && n < e->cap_rows; n++) {
            while (i < e->n_pads && t == e->pads[i])
                i++, t = 0;
            if (i == e->n_pads)
                break;
            e->b_tok[n] = 0;
            e->b_pos[n] = t++;
            e->b_tab[n] = pad.blocks;
        }
        zsi_batch b = {n, e->b_tok, e->b_pos, e->b_tab, 0, e->b_out};
        st = n > 0 ? zsi_forward(e->m, e->pool, &b, &e->work, NULL) : ZS_OK;
        e->st.padding_rows += n;
    }
    zs_kv_seq_release(e->pool, &pad);
    return st;
}

/* Then waiting ones, first come first served, from their cached prefix. */
static zs_status schedule_waiting(zs_engine *e, plan *p)
{
    bool fill = e->c.static_batching; /* a static batch takes max_num_seqs at
                                       * once; their prefills share the budget
                                       * of this and the next steps */
    if (fill && e->n_run > 0)
        return ZS_OK;
    int64_t first = e->n_run;
    while (e->n_wait > 0 && (p->budget > 0 || fill) && e->n_run < e->c.max_num_seqs) {
        seq *s = e->wait[0];
        if (!e->c.no_prefix_cache && s->kv.n_blocks == 0) {
            int64_t hit = zs_kv_seq_match(e->pool, &s->kv, s->tok, s->n_tok);
            s->computed = hit;
        }
        int64_t c = want(e, s, p->budget);
        zs_status a = zs_kv_seq_append(e->pool, &s->kv, c);
        if (a == ZS_ERR_NOMEM) {
            zs_kv_seq_release(e->pool, &s->kv);
            s->computed = 0;
            return ZS_OK;
        }
        if (a != ZS_OK)
            return a;
        remove_at(e->wait, &e->n_wait, 0);
        s->state = RUNNING;
        zs_status st = insert_running(e, s);
        if (st != ZS_OK)
            return st;
        if (s->sample == 0 && s->n_out == 0)
            e->st.computed_prompt_tokens += s->n_tok - s->computed;
        if (c > 0)
            add_piece(e, p, s, c);
    }
    if (fill)
        plan_padding(e, p, first);
    return ZS_OK;
}

/* The flat batch of the pieces. */
static zsi_batch flatten(zs_engine *e, const plan *p)
{
    int64_t r = 0, o = 0;
    for (int64_t i = 0; i < p->n_pieces; i++) {
        const piece *pc = &e->pieces[i];
        for (int64_t t = pc->start; t < pc->start + pc->count; t++, r++) {
            e->b_tok[r] = pc->s->tok[t];
            e->b_pos[r] = t;
            e->b_tab[r] = pc->s->kv.blocks;
        }
        if (pc->logits)
            e->b_out[o++] = r - 1;
    }
    return (zsi_batch){r, e->b_tok, e->b_pos, e->b_tab, o, e->b_out};
}

/* ---- sampling and outputs --------------------------------------------- */

/* log(sum(exp(row))) over the vocabulary, as cross entropy computes it
 * (softmax.h: the max, then the vector exp of every ISA, float lanes
 * summed in double; the target's loss is not used). The unary exp kernel
 * this used has no AVX2 code: under ZS_CPU_ISA=avx2 it ran libm's double
 * exp on all 50257 GPT-2 logits, ~2% of a q8_0 decode step, serial. */
static double log_sum_exp(zs_engine *e, const float *row)
{
    int32_t t0 = 0;
    double lse = 0, loss;
    zsk_cross_entropy(ZS_F32, row, &(zsk_targets){&t0, false, -1}, 1, e->m->c.vocab, &lse,
                      &loss);
    return lse;
}

/* The k largest logits' ids, largest first (ties: lower id), and their
 * log probabilities (logit - lse). */
static int top_ids(const zs_engine *e, const float *row, double lse, int k, int32_t *ids,
                   float *lp)
{
    int64_t V = e->m->c.vocab;
    int n = 0;
    for (int64_t i = 0; i < V; i++) {
        float v = row[i];
        if (n == k && !(v > lp[n - 1]))
            continue;
        int j = n < k ? n++ : n - 1;
        while (j > 0 && v > lp[j - 1]) {
            ids[j] = ids[j - 1];
            lp[j] = lp[j - 1];
            j--;
        }
        ids[j] = (int32_t)i;
        lp[j] = v;
    }
    for (int j = 0; j < n; j++)
        lp[j] = (float)(lp[j] - lse);
    return n;
}

static bool is_stop_id(const zs_engine *e, const req *r, int32_t t)
{
    for (int i = 0; i < r->q.n_stop_ids; i++)
        if (r->q.stop_ids[i] == t)
            return true;
    return !r->q.ignore_eos && t == e->eot;
}

/* Appends t's bytes to s's text; true when a stop string now appears
 * (s->keep is cut before it). */
static bool text_stop(zs_engine *e, seq *s, int32_t t, zs_status *st)
{
    size_t len = 0;
    const uint8_t *b = zs_bpe_token(e->bpe, t, &len);
    if (s->n_text + (int64_t)len + 1 > s->cap_text) {
        int64_t c = 2 * (s->n_text + (int64_t)len) + 64;
        char *x = realloc(s->text, (size_t)c);
        if (!x) {
            *st = oom();
            return false;
        }
        s->text = x, s->cap_text = c;
    }
    int64_t old = s->n_text;
    memcpy(s->text + s->n_text, b, len);
    s->n_text += (int64_t)len;
    s->keep = s->n_text;
    bool hit = false;
    for (int i = 0; i < s->r->q.n_stop; i++) {
        const char *w = s->r->q.stop[i];
        int64_t wl = (int64_t)strlen(w), from = old - wl + 1;
        for (int64_t p = from > 0 ? from : 0; p + wl <= s->n_text; p++)
            if (!memcmp(s->text + p, w, (size_t)wl) && p < s->keep) {
                s->keep = p;
                hit = true;
            }
    }
    return hit;
}

static zs_status append_token(seq *s, int32_t t)
{
    if (s->n_tok == s->cap) {
        int64_t c = 2 * s->cap;
        int32_t *x = realloc(s->tok, (size_t)c * sizeof *x);
        if (!x)
            return oom();
        s->tok = x, s->cap = c;
    }
    s->tok[s->n_tok++] = t;
    return ZS_OK;
}

static void finish(zs_engine *e, seq *s, zs_finish f)
{
    s->finish = f;
    if (!e->c.static_batching) { /* static batches hold their slots */
        remove_seq(e->run, &e->n_run, s);
        zs_kv_seq_release(e->pool, &s->kv);
        s->state = DONE;
    }
}

/* Draws s's next token from row (f32 [V]) and reports it. */
static zs_status sample_one(zs_engine *e, seq *s, const float *row, zs_token_fn fn,
                            void *ctx)
{
    const req *r = s->r;
    zs_sampler sp = r->q.sampling;
    sp.seed += (uint64_t)s->sample;
    bool rep = sp.repetition_penalty != 0 && sp.repetition_penalty != 1;
    const int32_t *hist = rep ? s->tok : s->tok + s->n_prompt;
    int64_t n_hist = rep ? s->n_tok : s->n_out;
    int64_t t = zs_sample_with_history(row, e->m->c.vocab, &sp, hist, n_hist,
                                       (uint64_t)s->n_out);
    if (t < 0)
        return ZS_ERR_ARG;
    int32_t ids[ZS_MAX_LOGPROBS];
    float lps[ZS_MAX_LOGPROBS];
    double lse = log_sum_exp(e, row);
    zs_token_event ev = {r->id, s->sample, r->q.user, (int32_t)t, row,
                         (float)(row[t] - lse), 0, ids, lps, ZS_FINISH_NONE, 0, -1};
    ev.n_top = r->q.logprobs > 0 ? top_ids(e, row, lse, r->q.logprobs, ids, lps) : 0;
    zs_status st = ZS_OK;
    if (is_stop_id(e, r, (int32_t)t)) {
        ev.token = -1;
        ev.finish = ZS_FINISH_STOP;
    } else {
        if ((st = append_token(s, (int32_t)t)) != ZS_OK)
            return st;
        s->n_out++;
        e->st.generated_tokens++;
        if (e->bpe && text_stop(e, s, (int32_t)t, &st))
            ev.finish = ZS_FINISH_STOP;
        else if ((r->q.max_tokens && s->n_out >= r->q.max_tokens) || s->n_tok >= e->m->c.ctx)
            ev.finish = ZS_FINISH_LENGTH;
    }
    if (st != ZS_OK)
        return st;
    ev.n_output = s->n_out;
    ev.text_bytes = e->bpe ? s->keep : -1;
    if (ev.finish != ZS_FINISH_NONE) {
        finish(e, s, ev.finish);
        s->reported = true;
        s->r->n_live--;
    }
    if (fn)
        fn(ctx, &ev);
    return ZS_OK;
}

/* Samples 1 .. n-1 of s's request share s's blocks (s has just computed
 * its prompt and not yet drawn a token). */
static zs_status fork_samples(zs_engine *e, seq *s)
{
    req *r = s->r;
    r->forked = true;
    for (int i = 1; i < r->q.n; i++) {
        seq *c = seq_new(e, r, i, s->tok, s->n_tok);
        if (!c)
            return oom();
        r->s[i] = c;
        zs_status st = zs_kv_seq_fork(e->pool, &s->kv, &c->kv);
        if (st != ZS_OK)
            return st;
        c->computed = s->computed;
        c->state = RUNNING;
        if ((st = insert_running(e, c)) != ZS_OK)
            return st;
    }
    return ZS_OK;
}

/* The f32 logits of out row i. */
static const float *logits_row(zs_engine *e, int64_t i)
{
    int64_t V = e->m->c.vocab;
    if (e->m->dt == ZS_F32)
        return (const float *)e->logits + i * V;
    const double *d = (const double *)e->logits + i * V;
    for (int64_t v = 0; v < V; v++)
        e->row[v] = (float)d[v];
    return e->row;
}

static zs_status emit(zs_engine *e, const plan *p, zs_token_fn fn, void *ctx)
{
    int64_t o = 0;
    zs_status st = ZS_OK;
    for (int64_t i = 0; st == ZS_OK && i < p->n_pieces; i++) {
        piece *pc = &e->pieces[i];
        seq *s = pc->s;
        s->computed += pc->count;
        if (!e->c.no_prefix_cache)
            zs_kv_seq_publish(e->pool, &s->kv, s->tok);
        if (!pc->logits)
            continue;
        const float *row = logits_row(e, o++);
        if (s->finish != ZS_FINISH_NONE) { /* static batching's padding */
            st = s->n_tok < e->m->c.ctx ? append_token(s, s->tok[s->n_tok - 1]) : ZS_OK;
            continue;
        }
        if (s->r->q.n > 1 && !s->r->forked && (st = fork_samples(e, s)) != ZS_OK)
            break;
        bool first = s->n_out == 0 && s->sample == 0;
        st = sample_one(e, s, row, fn, ctx);
        for (int k = 1; st == ZS_OK && first && k < s->r->q.n; k++)
            if (s->r->s[k] && s->r->s[k]->n_out == 0 && s->r->s[k]->n_tok == s->n_prompt)
                st = sample_one(e, s->r->s[k], row, fn, ctx);
    }
    return st;
}

/* ---- the step ------------------------------------------------------------ */

/* Reports aborted samples, ends a finished static batch, and frees the
 * requests whose samples are all reported. */
static void reap(zs_engine *e, zs_token_fn fn, void *ctx)
{
    bool all = e->c.static_batching && e->n_run > 0;
    for (int64_t i = 0; all && i < e->n_run; i++)
        all = e->run[i]->finish != ZS_FINISH_NONE;
    while (all && e->n_run > 0) {
        seq *s = e->run[--e->n_run];
        zs_kv_seq_release(e->pool, &s->kv);
        s->state = DONE;
    }
    for (req **pr = &e->reqs; *pr;) {
        req *r = *pr;
        for (int i = 0; i < r->q.n; i++) {
            seq *s = r->s[i];
            if (s && s->finish == ZS_FINISH_ABORT && !s->reported) {
                zs_token_event ev = {.request = r->id, .sample = i, .user = r->q.user,
                                     .token = -1, .finish = ZS_FINISH_ABORT,
                                     .n_output = s->n_out,
                                     .text_bytes = e->bpe ? s->keep : -1};
                s->reported = true;
                r->n_live--;
                if (fn)
                    fn(ctx, &ev);
            }
            if (!s && r->aborted) { /* never forked: nothing ran for it */
                zs_token_event ev = {.request = r->id, .sample = i, .user = r->q.user,
                                     .token = -1, .finish = ZS_FINISH_ABORT,
                                     .text_bytes = e->bpe ? 0 : -1};
                r->n_live--;
                if (fn)
                    fn(ctx, &ev);
            }
        }
        r->aborted = false;
        bool held = false; /* a static batch still pads with it */
        for (int i = 0; i < r->q.n; i++)
            held = held || (r->s[i] && r->s[i]->state == RUNNING);
        if (r->n_live <= 0 && !held) {
            *pr = r->next;
            e->st.requests_done++;
            req_free(e, r);
        } else {
            pr = &r->next;
        }
    }
}

zs_status zs_engine_step(zs_engine *e, zs_token_fn fn, void *ctx)
{
    int64_t most = e->c.max_batched_tokens;
    zs_status st = reserve_rows(e, most);
    plan p = {0, 0, most, 0, 0};
    bool preempted = false;
    if (st == ZS_OK)
        st = schedule_running(e, &p, &preempted);
    if (st == ZS_OK && !preempted)
        st = schedule_waiting(e, &p);
    if (st == ZS_OK && p.rows > 0) {
        zsi_batch b = flatten(e, &p);
        st = zsi_forward(e->m, e->pool, &b, &e->work, e->logits);
        if (st == ZS_OK)
            st = emit(e, &p, fn, ctx);
        else /* positions were claimed but not computed: start them over */
            for (int64_t i = 0; i < p.n_pieces; i++)
                if (p.n_pieces && e->pieces[i].s->state == RUNNING)
                    preempt(e, e->pieces[i].s);
        if (st == ZS_OK && p.pad_rows > 0)
            st = run_padding(e, &p);
        e->st.steps++;
    }
    reap(e, fn, ctx);
    return st;
}

zs_status zs_engine_run(zs_engine *e, zs_token_fn fn, void *ctx)
{
    zs_status st = ZS_OK;
    while (st == ZS_OK && zs_engine_busy(e))
        st = zs_engine_step(e, fn, ctx);
    return st;
}
