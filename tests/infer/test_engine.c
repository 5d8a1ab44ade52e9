/*
 * test_engine.c - the inference model and engine (zs/infer.h):
 *   - zs_llm_logits against the training forward (zs_gpt_logits) for GPT-2
 *     and BLOOM, in f32 and f64 (a float64 model generates in float64);
 *   - the scheduler under a random arrival/length trace with a pool so
 *     small that sequences are preempted: every request completes with the
 *     tokens it gives when run alone (batch invariance, recompute);
 *   - n > 1 samples (copy-on-write of the shared prompt block) and prefix
 *     cache hits give the logits of a cold run, bit for bit;
 *   - stop ids, max_tokens, context end, abort (blocks freed at once);
 *   - static batching whose padding is preempted for blocks, and its
 *     prompt padding (computed, counted, changing no member's tokens);
 *   - quantized models (q8_0, q4_0, q4_1, LLM.int8(), SmoothQuant) stay
 *     close to f32 and are batch invariant too;
 *   - a KV cache in bf16 / f16 for an f32 model: logits near the f32
 *     cache's, half the block bytes, traces batch invariant, bad dtypes
 *     refused;
 *   - every format's layers keep their four weight matrices in one block,
 *     in forward order; a failed allocation anywhere in building a model
 *     gives NULL and a message, and a retry the same logits;
 *   - bad requests and configs are refused with a message.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "infer/internal.h"
#include "testutil.h"
#include "zs/infer.h"
#include "zs/io.h"
#include "zs/ops.h"

#define V 67
#define MAXR 64
#define MAXT 256

static zs_module *tiny_gpt(zs_gpt_arch arch, int64_t ctx)
{
    return zt_tiny_gpt(arch, V, ctx, 7, 100);
}

static int32_t *random_tokens(int64_t n)
{
    int32_t *t = malloc((size_t)n * sizeof *t);
    for (int64_t i = 0; i < n; i++)
        t[i] = (int32_t)zt_irand(0, V - 1);
    return t;
}

/* zs_llm_logits vs zs_gpt_logits of the module. */
static void check_logits(zs_module *gpt, zs_dtype dt, double tol)
{
    int64_t T = 37;
    int32_t *tok = random_tokens(T);
    zs_tensor *idx = zs_empty(ZS_I64, 2, (int64_t[]){1, T});
    for (int64_t i = 0; i < T; i++)
        ((int64_t *)zs_data(idx))[i] = tok[i];
    zs_no_grad_push();
    zs_tensor *ref = zs_gpt_logits(gpt, idx);
    zs_no_grad_pop();
    double *r = zt_values(ref);
    zs_llm *m = zs_llm_from_gpt(gpt, NULL);
    ZT_CHECK(m && zs_llm_dtype(m) == dt, "llm in %s", zs_dtype_name(dt));
    float *lg = malloc((size_t)(T * V) * sizeof *lg);
    ZT_CHECK(zs_llm_logits(m, tok, T, lg) == ZS_OK, "llm_logits: %s", zs_last_error());
    double err = 0;
    for (int64_t i = 0; i < T * V; i++)
        err = fmax(err, fabs(lg[i] - r[i]));
    ZT_CHECK(err < tol, "logits differ from the training forward by %g (tol %g)", err, tol);
    free(lg);
    free(r);
    free(tok);
    zs_release(ref);
    zs_release(idx);
    zs_llm_free(m);
}

static void test_logits(void)
{
    zt_section("llm logits = training forward (gpt2, bloom; f32, f64, bf16 weights)");
    for (int arch = 0; arch < 2; arch++) {
        zs_module *g = tiny_gpt((zs_gpt_arch)arch, 128);
        check_logits(g, ZS_F32, 2e-4);
        ZT_CHECK(zs_module_to_dtype(g, ZS_F64) == ZS_OK, "to f64");
        check_logits(g, ZS_F64, 1e-6); /* the f32 copy of the result dominates */
        /* bf16 weights run in f32 (the training forward has no bf16
         * path to compare with: the f32 engine's logits are the reference) */
        int32_t tok[20];
        for (int i = 0; i < 20; i++)
            tok[i] = (int32_t)zt_irand(0, V - 1);
        float a[20 * V], b[20 * V];
        zs_llm *m64 = zs_llm_from_gpt(g, NULL);
        zs_llm_logits(m64, tok, 20, a);
        ZT_CHECK(zs_module_to_dtype(g, ZS_BF16) == ZS_OK, "to bf16");
        zs_llm *m16 = zs_llm_from_gpt(g, NULL);
        ZT_CHECK(m16 && zs_llm_dtype(m16) == ZS_F32 && zs_llm_logits(m16, tok, 20, b) == ZS_OK,
                 "bf16 model: %s", zs_last_error());
        double err = 0, scale = 0;
        for (int i = 0; i < 20 * V; i++)
            err = fmax(err, fabs(a[i] - b[i])), scale = fmax(scale, fabs(a[i]));
        ZT_CHECK(err < 0.05 * scale, "bf16 weights: logits within %g of %g", err, scale);
        zs_llm_free(m64);
        zs_llm_free(m16);
        zs_module_free(g);
    }
}

/* ---- generation records ---------------------------------------------- */

typedef struct out {
    int32_t tok[4][MAXT];
    int64_t n[4];
    zs_finish fin[4];
    int events;
} out;

typedef struct rec {
    out *o;        /* by request user index */
} rec;

static void on_token(void *ctx, const zs_token_event *ev)
{
    rec *r = ctx;
    out *o = &r->o[(intptr_t)ev->user];
    o->events++;
    if (ev->token >= 0)
        o->tok[ev->sample][o->n[ev->sample]++] = ev->token;
    if (ev->finish)
        o->fin[ev->sample] = ev->finish;
}

typedef struct trace_req {
    int32_t *prompt;
    int64_t n_prompt, max_tokens, arrive;
    zs_sampler s;
    int n;
} trace_req;

static zs_gen_request request_of(const trace_req *t, intptr_t user)
{
    return (zs_gen_request){.prompt = t->prompt, .n_prompt = t->n_prompt,
                            .sampling = t->s, .max_tokens = t->max_tokens, .n = t->n,
                            .user = (void *)user};
}

/* The KV cache dtype of the traces' engines (ZS_F32: the model's). */
static zs_dtype trace_kv = ZS_F32;

/* Runs t alone in a roomy engine. */
static void run_alone(const zs_llm *m, const trace_req *t, out *o)
{
    zs_engine *e = zs_engine_new(m, NULL, &(zs_engine_config){.kv_dtype = trace_kv});
    rec r = {o};
    zs_gen_request q = request_of(t, 0);
    memset(o, 0, sizeof *o);
    ZT_CHECK(zs_engine_add(e, &q, NULL) == ZS_OK, "add: %s", zs_last_error());
    ZT_CHECK(zs_engine_run(e, on_token, &r) == ZS_OK, "run: %s", zs_last_error());
    zs_engine_free(e);
}

static void test_trace(const zs_llm *m, const char *what, int64_t kv_blocks, int64_t budget)
{
    zt_section(what);
    int nr = 24;
    trace_req t[24];
    for (int i = 0; i < nr; i++) {
        t[i].n_prompt = zt_irand(1, 60);
        t[i].prompt = random_tokens(t[i].n_prompt);
        t[i].max_tokens = zt_irand(1, 40);
        t[i].arrive = zt_irand(0, 30);
        t[i].n = i % 5 == 0 ? 2 : 1;
        t[i].s = (zs_sampler){.temperature = i % 3 ? 0.9 : 0, .top_k = i % 4 ? 0 : 20,
                              .top_p = i % 2 ? 0.95 : 1, .seed = 1000 + (uint64_t)i,
                              .presence_penalty = i % 7 == 3 ? 0.5 : 0};
    }
    static out batched[24], alone;
    memset(batched, 0, sizeof batched);
    zs_engine *e = zs_engine_new(m, NULL, &(zs_engine_config){.kv_blocks = kv_blocks,
                                                             .max_num_seqs = 8,
                                                             .max_batched_tokens = budget,
                                                             .kv_dtype = trace_kv});
    ZT_CHECK(e != NULL, "engine: %s", zs_last_error());
    rec r = {batched};
    int added = 0;
    for (int64_t step = 0; added < nr || zs_engine_busy(e); step++) {
        for (int i = 0; i < nr; i++)
            if (t[i].arrive == step) {
                zs_gen_request q = request_of(&t[i], i);
                ZT_CHECK(zs_engine_add(e, &q, NULL) == ZS_OK, "add: %s", zs_last_error());
                added++;
            }
        ZT_CHECK(zs_engine_step(e, on_token, &r) == ZS_OK, "step: %s", zs_last_error());
        if (step > 100000)
            break;
    }
    zs_engine_stats st;
    zs_engine_get_stats(e, &st);
    ZT_CHECK(st.requests_done == nr && st.kv.used_blocks == 0,
             "%lld of %d requests done, %lld blocks still used", (long long)st.requests_done,
             nr, (long long)st.kv.used_blocks);
    if (kv_blocks)
        ZT_CHECK(st.preemptions > 0, "a tiny pool preempts (got %lld)",
                 (long long)st.preemptions);
    int same = 0, total = 0;
    for (int i = 0; i < nr; i++) {
        run_alone(m, &t[i], &alone);
        for (int k = 0; k < t[i].n; k++, total++) {
            bool eq = alone.n[k] == batched[i].n[k] && alone.fin[k] == batched[i].fin[k] &&
                      !memcmp(alone.tok[k], batched[i].tok[k],
                              (size_t)alone.n[k] * sizeof(int32_t));
            same += eq;
            ZT_CHECK(batched[i].fin[k] == ZS_FINISH_LENGTH, "request %d ended", i);
        }
    }
    ZT_CHECK(same == total, "%d of %d samples match their run alone", same, total);
    zs_engine_free(e);
    for (int i = 0; i < nr; i++)
        free(t[i].prompt);
}

/* ---- copy-on-write and prefix cache: the logits of a cold run --------- */

typedef struct cold {
    const zs_llm *m;
    int32_t seq[2][MAXT];
    int64_t n[2];
    int64_t n_prompt;
    const int32_t *prompt;
    int mismatches, checked, bad_lp, tops;
} cold;

/* Every event's logits against zs_llm_logits of the same sequence. */
static void on_cold(void *ctx, const zs_token_event *ev)
{
    cold *c = ctx;
    int k = ev->sample;
    if (c->n[k] == 0) {
        memcpy(c->seq[k], c->prompt, (size_t)c->n_prompt * sizeof(int32_t));
        c->n[k] = c->n_prompt;
    }
    int64_t n = c->n[k];
    float *lg = malloc((size_t)(n * V) * sizeof *lg);
    zs_llm_logits(c->m, c->seq[k], n, lg);
    c->mismatches += memcmp(lg + (n - 1) * V, ev->logits, V * sizeof(float)) != 0;
    c->checked++;
    /* log probabilities against a float64 log softmax */
    double mx = -INFINITY, sum = 0;
    for (int v = 0; v < V; v++)
        mx = fmax(mx, ev->logits[v]);
    for (int v = 0; v < V; v++)
        sum += exp(ev->logits[v] - mx);
    double lse = mx + log(sum);
    int32_t t = ev->token >= 0 ? ev->token : 0;
    c->bad_lp += ev->token >= 0 && fabs(ev->logprob - (ev->logits[t] - lse)) > 1e-5;
    for (int i = 0; i < ev->n_top; i++) {
        int32_t id = ev->top_ids[i];
        c->bad_lp += fabs(ev->top_logprobs[i] - (ev->logits[id] - lse)) > 1e-5;
        c->bad_lp += i > 0 && ev->top_logprobs[i] > ev->top_logprobs[i - 1];
        for (int v = 0; v < V && i == 0; v++)
            c->bad_lp += ev->logits[v] > ev->logits[id];
    }
    c->tops += ev->n_top;
    free(lg);
    if (ev->token >= 0)
        c->seq[k][c->n[k]++] = ev->token;
}

static void test_cow_prefix(const zs_llm *m)
{
    zt_section("copy-on-write (n = 2) and prefix-cache hits = cold logits");
    int32_t *prompt = random_tokens(40);
    zs_engine *e = zs_engine_new(m, NULL, &(zs_engine_config){.block_size = 16});
    cold c = {.m = m, .prompt = prompt, .n_prompt = 37};
    zs_gen_request q = {.prompt = prompt, .n_prompt = 37, .max_tokens = 9, .n = 2,
                        .sampling = {.temperature = 1, .top_p = 1, .seed = 5}};
    ZT_CHECK(zs_engine_add(e, &q, NULL) == ZS_OK && zs_engine_run(e, on_cold, &c) == ZS_OK,
             "n = 2: %s", zs_last_error());
    ZT_CHECK(c.checked == 18 && c.mismatches == 0, "%d of %d events differ from a cold run",
             c.mismatches, c.checked);
    ZT_CHECK(memcmp(c.seq[0], c.seq[1], sizeof c.seq[0]) != 0, "the samples differ");
    zs_engine_stats st;
    zs_engine_get_stats(e, &st);
    ZT_CHECK(st.kv.cow_copies >= 1, "the shared partial block was copied (%lld)",
             (long long)st.kv.cow_copies);
    /* the same first 32 tokens (2 full blocks), another tail */
    int32_t p2[40];
    memcpy(p2, prompt, sizeof p2);
    p2[35] = (p2[35] + 1) % V;
    cold c2 = {.m = m, .prompt = p2, .n_prompt = 39};
    zs_gen_request q2 = {.prompt = p2, .n_prompt = 39, .max_tokens = 5, .logprobs = 4,
                         .sampling = {.temperature = 0.7, .top_p = 1, .seed = 9}};
    int64_t hits = st.kv.prefix_hits;
    ZT_CHECK(zs_engine_add(e, &q2, NULL) == ZS_OK && zs_engine_run(e, on_cold, &c2) == ZS_OK,
             "prefix: %s", zs_last_error());
    zs_engine_get_stats(e, &st);
    ZT_CHECK(st.kv.prefix_hits - hits == 2, "2 blocks from the prefix cache (got %lld)",
             (long long)(st.kv.prefix_hits - hits));
    ZT_CHECK(c2.checked == 5 && c2.mismatches == 0, "prefix hit: %d of %d events differ",
             c2.mismatches, c2.checked);
    ZT_CHECK(c.bad_lp == 0 && c2.bad_lp == 0 && c2.tops == 20,
             "log probabilities = float64 log softmax, top 4 sorted (%d, %d wrong; %d tops)",
             c.bad_lp, c2.bad_lp, c2.tops);
    zs_engine_free(e);
    free(prompt);
}

/* ---- stops, abort, errors ------------------------------------------------ */

static void test_stops_abort(const zs_llm *m)
{
    zt_section("stop ids, max_tokens, context end, abort");
    int32_t prompt[5] = {1, 2, 3, 4, 5};
    static out o[3];
    memset(o, 0, sizeof o);
    rec r = {o};
    zs_engine *e = zs_engine_new(m, NULL, &(zs_engine_config){0});
    /* greedy: find its first token, then ask to stop there */
    zs_gen_request q = {.prompt = prompt, .n_prompt = 5, .max_tokens = 3,
                        .sampling = {.top_p = 1}, .user = (void *)0};
    zs_engine_add(e, &q, NULL);
    zs_engine_run(e, on_token, &r);
    ZT_CHECK(o[0].n[0] == 3 && o[0].fin[0] == ZS_FINISH_LENGTH, "max_tokens 3");
    int32_t stop = o[0].tok[0][1];
    q.stop_ids = &stop, q.n_stop_ids = 1, q.user = (void *)1, q.max_tokens = 0;
    zs_engine_add(e, &q, NULL);
    zs_engine_run(e, on_token, &r);
    ZT_CHECK(o[1].n[0] == 1 && o[1].fin[0] == ZS_FINISH_STOP, "stop id: %lld tokens",
             (long long)o[1].n[0]);
    /* no limit: runs to the context end */
    zs_gen_request q3 = {.prompt = prompt, .n_prompt = 5, .sampling = {.top_p = 1,
                         .temperature = 1, .seed = 3}, .user = (void *)2};
    uint64_t id;
    zs_engine_add(e, &q3, &id);
    for (int i = 0; i < 4; i++)
        zs_engine_step(e, on_token, &r);
    zs_engine_stats st;
    zs_engine_get_stats(e, &st);
    ZT_CHECK(st.kv.used_blocks > 0, "blocks in use while running");
    ZT_CHECK(zs_engine_abort(e, id) == ZS_OK, "abort");
    zs_engine_get_stats(e, &st);
    ZT_CHECK(st.kv.used_blocks == 0, "abort frees the blocks at once (%lld used)",
             (long long)st.kv.used_blocks);
    zs_engine_step(e, on_token, &r);
    ZT_CHECK(o[2].fin[0] == ZS_FINISH_ABORT && !zs_engine_busy(e), "abort reported");
    ZT_EXPECT_ERROR(zs_engine_abort(e, id) != ZS_OK, "no request");
    /* n = 3 aborted before its samples fork: every sample reports the abort */
    q3.n = 3;
    zs_engine_add(e, &q3, &id);
    zs_engine_abort(e, id);
    int before = o[2].events;
    o[2].fin[0] = o[2].fin[1] = o[2].fin[2] = ZS_FINISH_NONE;
    zs_engine_step(e, on_token, &r);
    ZT_CHECK(o[2].events == before + 3 && o[2].fin[0] == ZS_FINISH_ABORT &&
             o[2].fin[1] == ZS_FINISH_ABORT && o[2].fin[2] == ZS_FINISH_ABORT &&
             !zs_engine_busy(e), "unforked samples report their abort (%d events)",
             o[2].events - before);
    zs_engine_free(e);
}

/* Static batching with a pool of one context: the padding of a finished
 * member grows until the pool is short and it is preempted; it must end
 * there (it was once requeued, then freed with its request while still
 * queued: a use after free when the next batch was admitted). */
static void test_static_padding(const zs_llm *m)
{
    zt_section("static batching: a padding sequence preempted for blocks");
    int32_t *pa = random_tokens(100), *pb = random_tokens(10), *pq = random_tokens(10);
    trace_req t[3] = {{pb, 10, 100, 0, {.top_p = 1}, 1},  /* older: keeps running */
                      {pa, 100, 1, 0, {.top_p = 1}, 1},   /* done at once, pads */
                      {pq, 10, 4, 0, {.top_p = 1}, 1}};   /* the next batch */
    static out o[3], alone[3];
    memset(o, 0, sizeof o);
    memset(alone, 0, sizeof alone);
    rec r = {o};
    zs_engine *e = zs_engine_new(m, NULL, &(zs_engine_config){.kv_blocks = 8,
                                 .max_num_seqs = 2, .max_batched_tokens = 256,
                                 .static_batching = true});
    ZT_CHECK(e != NULL, "engine: %s", zs_last_error());
    for (int i = 0; i < 3; i++) {
        zs_gen_request q = request_of(&t[i], i);
        ZT_CHECK(zs_engine_add(e, &q, NULL) == ZS_OK, "add: %s", zs_last_error());
    }
    ZT_CHECK(zs_engine_run(e, on_token, &r) == ZS_OK, "run: %s", zs_last_error());
    zs_engine_stats st;
    zs_engine_get_stats(e, &st);
    ZT_CHECK(st.requests_done == 3 && st.kv.used_blocks == 0 && !zs_engine_busy(e),
             "3 requests done (%lld), no blocks held (%lld)", (long long)st.requests_done,
             (long long)st.kv.used_blocks);
    for (int i = 0; i < 3; i++) {
        run_alone(m, &t[i], &alone[i]);
        ZT_CHECK(o[i].n[0] == t[i].max_tokens && o[i].fin[0] == ZS_FINISH_LENGTH &&
                 !memcmp(o[i].tok[0], alone[i].tok[0],
                         (size_t)t[i].max_tokens * sizeof(int32_t)),
                 "request %d: %lld tokens, those of its run alone", i,
                 (long long)o[i].n[0]);
    }
    zs_engine_free(e);
    free(pa), free(pb), free(pq);
}

/* A static batch pads its prompts to the longest: the pad rows are
 * computed (counted) and change nothing of the members' tokens. */
static void test_static_prompt_padding(const zs_llm *m)
{
    zt_section("static batching: prompts padded to the batch's longest");
    const int64_t P[4] = {5, 9, 20, 7};
    trace_req t[4];
    static out o[4], alone;
    memset(o, 0, sizeof o);
    rec r = {o};
    zs_engine *e = zs_engine_new(m, NULL, &(zs_engine_config){.max_num_seqs = 3,
                                 .max_batched_tokens = 64, .static_batching = true});
    ZT_CHECK(e != NULL, "engine: %s", zs_last_error());
    for (int i = 0; i < 4; i++) { /* 3 in the first batch, the 4th alone */
        t[i] = (trace_req){random_tokens(P[i]), P[i], 3 + i, 0, {.top_p = 1}, 1};
        zs_gen_request q = request_of(&t[i], i);
        ZT_CHECK(zs_engine_add(e, &q, NULL) == ZS_OK, "add: %s", zs_last_error());
    }
    ZT_CHECK(zs_engine_run(e, on_token, &r) == ZS_OK, "run: %s", zs_last_error());
    zs_engine_stats st;
    zs_engine_get_stats(e, &st);
    ZT_CHECK(st.padding_rows == (20 - 5) + (20 - 9) && st.kv.used_blocks == 0,
             "padding rows %lld (expected 26), %lld blocks held",
             (long long)st.padding_rows, (long long)st.kv.used_blocks);
    for (int i = 0; i < 4; i++) {
        run_alone(m, &t[i], &alone);
        ZT_CHECK(o[i].n[0] == t[i].max_tokens &&
                 !memcmp(o[i].tok[0], alone.tok[0], (size_t)t[i].max_tokens * 4),
                 "request %d: the tokens of its run alone", i);
        free(t[i].prompt);
    }
    zs_engine_free(e);
}

static void test_errors(const zs_llm *m)
{
    zt_section("bad requests and configs");
    zs_engine *e = zs_engine_new(m, NULL, &(zs_engine_config){0});
    int32_t p[130] = {0};
    zs_gen_request q = {.prompt = p, .n_prompt = 0, .sampling = {.top_p = 1}};
    ZT_EXPECT_ERROR(zs_engine_add(e, &q, NULL) != ZS_OK, "empty prompt");
    q.n_prompt = 128;
    ZT_EXPECT_ERROR(zs_engine_add(e, &q, NULL) != ZS_OK, "no room");
    q.n_prompt = 3, p[1] = V;
    ZT_EXPECT_ERROR(zs_engine_add(e, &q, NULL) != ZS_OK, "outside the vocabulary");
    p[1] = -1;
    ZT_EXPECT_ERROR(zs_engine_add(e, &q, NULL) != ZS_OK, "outside the vocabulary");
    p[1] = 0;
    q.sampling.temperature = NAN;
    ZT_EXPECT_ERROR(zs_engine_add(e, &q, NULL) != ZS_OK, "temperature");
    q.sampling.temperature = 0, q.sampling.top_p = 2;
    ZT_EXPECT_ERROR(zs_engine_add(e, &q, NULL) != ZS_OK, "top_p");
    q.sampling.top_p = 1, q.logprobs = 21;
    ZT_EXPECT_ERROR(zs_engine_add(e, &q, NULL) != ZS_OK, "logprobs");
    q.logprobs = 0;
    const char *stop[] = {"x"};
    q.stop = stop, q.n_stop = 1;
    ZT_EXPECT_ERROR(zs_engine_add(e, &q, NULL) != ZS_OK, "need a tokenizer");
    ZT_CHECK(!zs_engine_busy(e), "nothing queued by bad requests");
    zs_engine_free(e);
    ZT_EXPECT_ERROR(zs_engine_new(m, NULL, &(zs_engine_config){.kv_blocks = 3}) == NULL,
                    "cannot hold one sequence");
    ZT_EXPECT_ERROR(zs_engine_new(m, NULL, &(zs_engine_config){.block_size = -1}) == NULL,
                    "block size");
    ZT_EXPECT_ERROR(zs_llm_logits(m, p, 0, NULL) != ZS_OK, "expected 1 ..");
    zs_quant qq;
    ZT_EXPECT_ERROR(zs_quant_parse("q5", &qq) != ZS_OK, "unknown quantization");
    ZT_CHECK(zs_quant_parse("q8", &qq) == ZS_OK && qq == ZS_QUANT_Q8_0, "q8 alias");
}

/* ---- quantized ----------------------------------------------------------- */

static void test_quant(zs_module *g, const zs_llm *f)
{
    zt_section("quantized models: close to f32, batch invariant");
    int64_t T = 50;
    int32_t *tok = random_tokens(T), *calib = random_tokens(300);
    float *ref = malloc((size_t)(T * V) * sizeof *ref), *lg = malloc(sizeof *ref * T * V);
    zs_llm_logits(f, tok, T, ref);
    double scale = 0;
    for (int64_t i = 0; i < T * V; i++)
        scale = fmax(scale, fabs(ref[i]));
    const zs_quant qs[] = {ZS_QUANT_Q8_0, ZS_QUANT_Q4_0, ZS_QUANT_Q4_1, ZS_QUANT_INT8,
                           ZS_QUANT_W8A8};
    const double tol[] = {0.03, 0.25, 0.2, 0.05, 0.05};
    for (int i = 0; i < 5; i++) {
        zs_llm_options o = {.quant = qs[i], .calib = calib, .n_calib = 300};
        zs_llm *q = zs_llm_from_gpt(g, &o);
        ZT_CHECK(q && zs_llm_quant(q) == qs[i], "%s: %s", zs_quant_name(qs[i]),
                 q ? "" : zs_last_error());
        ZT_CHECK(zs_llm_weight_bytes(q) < zs_llm_weight_bytes(f) / 2 + 8 * V * 64,
                 "%s is smaller", zs_quant_name(qs[i]));
        zs_llm_logits(q, tok, T, lg);
        double err = 0;
        for (int64_t j = 0; j < T * V; j++)
            err = fmax(err, fabs(lg[j] - ref[j]));
        ZT_CHECK(err / scale < tol[i], "%s: max error %.4f of %.3f", zs_quant_name(qs[i]),
                 err, scale);
        /* one row alone = the same row in the 50-token run */
        float *one = malloc((size_t)(20 * V) * sizeof *one);
        zs_llm_logits(q, tok, 20, one);
        ZT_CHECK(!memcmp(one, lg, (size_t)(20 * V) * sizeof *one),
                 "%s: a prefix's logits do not depend on the batch", zs_quant_name(qs[i]));
        free(one);
        zs_llm_free(q);
    }
    zs_llm_options bad = {.quant = ZS_QUANT_W8A8};
    ZT_EXPECT_ERROR(zs_llm_from_gpt(g, &bad) == NULL, "calibration");
    free(tok), free(calib), free(ref), free(lg);
}

/* Layer l's linears lie in its arena in forward order, 64-byte aligned. */
static bool gathered(const zs_llm *m, int64_t l)
{
    const zsi_layer *y = &m->layers[l];
    const zsi_linear *ls[4] = {&y->qkv, &y->proj, &y->fc, &y->fc2};
    const char *prev = y->arena;
    for (int i = 0; i < 4; i++) {
        const zsi_linear *x = ls[i];
        const char *d = x->fmt == ZSI_W_F32 ? (const char *)x->packed.data
                        : x->fmt == ZSI_W_F64 || x->fmt == ZSI_W_I8
                            ? (const char *)x->w
                            : (const char *)x->tiles.data;
        if (!x->in_arena || !d || d < prev || (uintptr_t)d % 64)
            return false;
        prev = d + x->w_bytes;
    }
    return y->arena != NULL;
}

static void test_weight_arena(zs_module *g, zs_module *g64)
{
    zt_section("weights: one block per layer; allocation failures while building");
    int64_t T = 23;
    int32_t *tok = random_tokens(T), *calib = random_tokens(100);
    float *ref = malloc((size_t)(T * V) * sizeof *ref), *lg = malloc(sizeof *ref * T * V);
    const zs_quant qs[] = {ZS_QUANT_NONE, ZS_QUANT_NONE, ZS_QUANT_Q8_0, ZS_QUANT_Q4_1,
                           ZS_QUANT_INT8, ZS_QUANT_W8A8};
    for (int i = 0; i < 6; i++) {
        zs_module *src = i == 1 ? g64 : g;
        zs_llm_options o = {.quant = qs[i], .calib = calib, .n_calib = 100};
        zs_llm *m = zs_llm_from_gpt(src, &o);
        bool ok = m != NULL;
        for (int64_t l = 0; ok && l < zs_llm_config(m)->layers; l++)
            ok = gathered(m, l);
        const char *name = i == 1 ? "f64" : zs_quant_name(qs[i]);
        ZT_CHECK(ok, "%s: each layer's weights in one block, in forward order", name);
        zs_llm_logits(m, tok, T, ref);
        zs_llm_free(m);
        /* fail the k-th allocation of the build, for every k until it succeeds */
        int64_t k = 1, refused = 0;
        bool clear = true;
        for (;; k++) {
            zs_alloc_fail_after(k);
            zs_llm *f = zs_llm_from_gpt(src, &o);
            zs_alloc_fail_after(0);
            if (f) {
                zs_llm_logits(f, tok, T, lg);
                ZT_CHECK(!memcmp(lg, ref, (size_t)(T * V) * sizeof *lg),
                         "%s: built after %lld refused allocations, same logits", name,
                         (long long)refused);
                zs_llm_free(f);
                break;
            }
            refused++;
            clear = clear && strstr(zs_last_error(), "out of memory") != NULL;
        }
        ZT_CHECK(refused > 0 && clear, "%s: %lld failed allocations each gave NULL and "
                 "'out of memory'", name, (long long)refused);
    }
    free(tok), free(calib), free(ref), free(lg);
}

/* Greedy logits of one request, step by step, into lg [steps, V]. */
typedef struct kv_rec {
    float *lg;
    int64_t n;
} kv_rec;

static void on_kv(void *ctx, const zs_token_event *ev)
{
    kv_rec *r = ctx;
    if (ev->token >= 0)
        memcpy(r->lg + r->n++ * V, ev->logits, V * sizeof(float));
}

static int64_t kv_run(const zs_llm *m, zs_dtype kv, const int32_t *prompt, int64_t P,
                      int64_t new_tokens, float *lg, zs_kv_pool_stats *ps)
{
    zs_engine *e = zs_engine_new(m, NULL, &(zs_engine_config){.kv_dtype = kv,
                                                             .max_batched_tokens = 16});
    kv_rec r = {lg, 0};
    zs_gen_request q = {.prompt = prompt, .n_prompt = P, .max_tokens = new_tokens,
                        .ignore_eos = true};
    if (!e || zs_engine_add(e, &q, NULL) != ZS_OK || zs_engine_run(e, on_kv, &r) != ZS_OK)
        r.n = -1;
    zs_engine_stats st;
    if (e) {
        zs_engine_get_stats(e, &st);
        *ps = st.kv;
    }
    zs_engine_free(e);
    return r.n;
}

/* A KV cache in bf16 or f16 for an f32 model: the logits differ from the
 * f32 cache's (the values really are rounded, to 8 or 11 significant bits)
 * but stay near them (this tiny model's attention moves its small logits
 * little: relative 1.6e-5 and 3.1e-6 measured, bounds 60x that), the pool's
 * blocks are half the bytes, traces are batch invariant, and a 16-bit
 * cache for a float64 model or a cache in int8 is refused. */
static void test_kv_dtype(const zs_llm *m, const zs_llm *m64)
{
    zt_section("KV cache in bf16 / f16: near f32, half the bytes, errors");
    int64_t P = 37, N = 20;
    int32_t *prompt = random_tokens(P);
    float *ref = malloc((size_t)(N * V) * sizeof *ref), *lg = malloc(sizeof *ref * N * V);
    zs_kv_pool_stats s32, s16;
    ZT_CHECK(kv_run(m, ZS_F32, prompt, P, N, ref, &s32) == N, "f32 cache: %s",
             zs_last_error());
    double scale = 0;
    for (int64_t i = 0; i < N * V; i++)
        scale = fmax(scale, fabs(ref[i]));
    const zs_dtype kvs[2] = {ZS_BF16, ZS_F16};
    const double tol[2] = {1e-3, 2e-4}; /* measured 1.6e-5 and 3.1e-6 */ /* relative to the largest |logit| */
    for (int i = 0; i < 2; i++) {
        int64_t n = kv_run(m, kvs[i], prompt, P, N, lg, &s16);
        double err = 0;
        for (int64_t j = 0; n == N && j < N * V; j++)
            err = fmax(err, fabs(lg[j] - ref[j]));
        ZT_CHECK(n == N && err > 0 && err / scale < tol[i], "%s cache: %lld tokens, logits within %.3g "
                 "(%.3g) of the f32 cache's (largest %.2f)", zs_dtype_name(kvs[i]),
                 (long long)n, err, err / scale, scale);
        ZT_CHECK(2 * s16.block_bytes == s32.block_bytes, "%s blocks: %lld bytes, f32 %lld",
                 zs_dtype_name(kvs[i]), (long long)s16.block_bytes,
                 (long long)s32.block_bytes);
    }
    zs_engine *e = zs_engine_new(m64, NULL, &(zs_engine_config){.kv_dtype = ZS_BF16});
    ZT_EXPECT_ERROR(e == NULL, "bf16 for a model that computes in f64");
    e = zs_engine_new(m, NULL, &(zs_engine_config){.kv_dtype = ZS_I8});
    ZT_EXPECT_ERROR(e == NULL, "KV cache in i8");
    free(prompt), free(ref), free(lg);
}

/* ---- quantized checkpoints ------------------------------------------------ */

/* Rewrites path with tensor `name` changed by fn (or dropped). */
static void tamper(const char *path, const char *out, const char *name,
                   void (*fn)(zs_tensor *t), const char *meta_override)
{
    zs_tensor_set set;
    zs_safetensors_load(path, &set);
    const char *names[512];
    zs_tensor *ts[512];
    int n = 0;
    for (int i = 0; i < set.n; i++) {
        if (!strcmp(set.names[i], name) && !fn)
            continue;
        if (!strcmp(set.names[i], name))
            fn(set.tensors[i]);
        names[n] = set.names[i];
        ts[n++] = set.tensors[i];
    }
    zs_safetensors_save(out, n, names, ts, meta_override ? meta_override : set.metadata_json);
    zs_tensor_set_free(&set);
}

static void nan_scale(zs_tensor *t) { memset(zs_data(t), 0xff, 4); }

static void test_checkpoints(zs_module *g)
{
    zt_section("quantized checkpoints: round trip, corrupted files");
    const char *path = "test_engine_q.safetensors", *bad = "test_engine_bad.safetensors";
    int32_t *tok = random_tokens(30), *calib = random_tokens(200);
    float *a = malloc(30 * V * sizeof *a), *b = malloc(30 * V * sizeof *b);
    const zs_quant qs[] = {ZS_QUANT_Q8_0, ZS_QUANT_Q4_1, ZS_QUANT_INT8, ZS_QUANT_W8A8};
    for (int i = 0; i < 4; i++) {
        zs_llm_options o = {.quant = qs[i], .calib = calib, .n_calib = 200};
        zs_llm *q = zs_llm_from_gpt(g, &o);
        ZT_CHECK(zs_llm_save(q, path, "{\"note\":\"test\"}") == ZS_OK, "save %s: %s",
                 zs_quant_name(qs[i]), zs_last_error());
        zs_llm *r = zs_llm_open(path, NULL, NULL);
        ZT_CHECK(r && zs_llm_quant(r) == qs[i], "open %s: %s", zs_quant_name(qs[i]),
                 r ? "" : zs_last_error());
        zs_llm_logits(q, tok, 30, a);
        if (r)
            zs_llm_logits(r, tok, 30, b);
        ZT_CHECK(r && !memcmp(a, b, 30 * V * sizeof *a), "%s: same logits after loading",
                 zs_quant_name(qs[i]));
        zs_llm_free(q);
        zs_llm_free(r);
    }
    /* path holds the W8A8 model now; q8_0 for the block checks */
    zs_llm *q8 = zs_llm_from_gpt(g, &(zs_llm_options){.quant = ZS_QUANT_Q8_0});
    ZT_EXPECT_ERROR(zs_llm_open(path, &(zs_llm_options){.quant = ZS_QUANT_Q4_0}, NULL) == NULL,
                    "quantized as w8a8 already");
    zs_llm_save(q8, path, NULL);
    tamper(path, bad, "h.1.mlp.c_fc.weight", nan_scale, NULL);
    ZT_EXPECT_ERROR(zs_llm_open(bad, NULL, NULL) == NULL, "non-finite block scale");
    tamper(path, bad, "h.0.attn.c_proj.weight", NULL, NULL);
    ZT_EXPECT_ERROR(zs_llm_open(bad, NULL, NULL) == NULL, "no tensor h.0.attn.c_proj.weight");
    tamper(path, bad, "wte.weight", NULL, NULL);
    ZT_EXPECT_ERROR(zs_llm_open(bad, NULL, NULL) == NULL, "no tensor wte.weight");
    tamper(path, bad, "ln_f.bias", nan_scale, NULL);
    ZT_EXPECT_ERROR(zs_llm_open(bad, NULL, NULL) == NULL, "non-finite");
    tamper(path, bad, "none", NULL,
           "{\"model\":\"gpt\",\"arch\":\"gpt2\",\"vocab\":\"67\",\"ctx\":\"128\","
           "\"layers\":\"2\",\"heads\":\"4\",\"width\":\"64\",\"quant\":\"q9\"}");
    ZT_EXPECT_ERROR(zs_llm_open(bad, NULL, NULL) == NULL, "unknown quantization");
    tamper(path, bad, "none", NULL,
           "{\"model\":\"gpt\",\"arch\":\"gpt2\",\"vocab\":\"67\",\"ctx\":\"128\","
           "\"layers\":\"2\",\"heads\":\"4\",\"width\":\"64\",\"quant\":\"q8_0\"}");
    ZT_EXPECT_ERROR(zs_llm_open(bad, NULL, NULL) == NULL, "wte.weight is u8");
    tamper(path, bad, "none", NULL,
           "{\"model\":\"gpt\",\"arch\":\"gpt2\",\"vocab\":\"67\",\"ctx\":\"128\","
           "\"layers\":\"3\",\"heads\":\"4\",\"width\":\"64\",\"quant\":\"q8_0\","
           "\"quant.wte.weight\":\"q8_0\"}");
    ZT_EXPECT_ERROR(zs_llm_open(bad, NULL, NULL) == NULL, "c_attn.weight has no valid");
    FILE *f = fopen(bad, "wb");
    fwrite("\x10\0\0\0\0\0\0\0{\"a\":", 1, 13, f);
    fclose(f);
    ZT_EXPECT_ERROR(zs_llm_open(bad, NULL, NULL) == NULL, bad);
    ZT_EXPECT_ERROR(zs_llm_open("/nonexistent/q.safetensors", NULL, NULL) == NULL,
                    "/nonexistent");
    zs_llm *f32 = zs_llm_from_gpt(g, NULL);
    ZT_EXPECT_ERROR(zs_llm_save(f32, path, NULL) != ZS_OK, "not quantized");
    zs_llm_free(f32);
    zs_llm_free(q8);
    remove(path);
    remove(bad);
    free(tok), free(calib), free(a), free(b);
}

int main(void)
{
    zt_irand_seed(42);
    test_logits();
    zs_module *g = tiny_gpt(ZS_GPT2, 128);
    zs_llm *m = zs_llm_from_gpt(g, NULL);
    test_trace(m, "trace, roomy pool: batched = alone", 0, 64);
    test_trace(m, "trace, tiny pool (preemption): batched = alone", 12, 48);
    test_cow_prefix(m);
    test_stops_abort(m);
    test_static_padding(m);
    test_static_prompt_padding(m);
    test_errors(m);
    test_quant(g, m);
    test_checkpoints(g);
    zs_module *g64 = tiny_gpt(ZS_GPT2, 128);
    ZT_CHECK(zs_module_to_dtype(g64, ZS_F64) == ZS_OK, "to f64");
    test_weight_arena(g, g64);
    zs_llm *m64 = zs_llm_from_gpt(g64, NULL);
    test_kv_dtype(m, m64);
    zs_llm_free(m64);
    trace_kv = ZS_BF16;
    test_trace(m, "trace, bf16 KV cache, tiny pool: batched = alone", 12, 48);
    trace_kv = ZS_F16;
    test_trace(m, "trace, f16 KV cache, roomy pool: batched = alone", 0, 64);
    trace_kv = ZS_F32;
    zs_module_free(g64);
    zs_llm_free(m);
    zs_module_free(g);
    zs_module *b = tiny_gpt(ZS_BLOOM, 128);
    zs_llm *mb = zs_llm_from_gpt(b, NULL);
    test_trace(mb, "bloom trace, tiny pool", 10, 32);
    zs_llm_free(mb);
    zs_module_free(b);
    return zt_done();
}
