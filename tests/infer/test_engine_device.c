/*
 * test_engine_device.c - generation on a device the host cannot touch
 * (the test device, src/ops/testdev.c): zs_llm_options.device puts the
 * weights there, the engine its KV pool and work buffers, and every
 * computation of a step runs through the driver (ops/infer_ops.h).
 *
 * Checked, for a tiny GPT-2 in f32, Q8_0, LLM.int8() and f64 and a BLOOM
 * in f32 with a bf16 KV cache: zs_llm_logits and an engine serving several requests at
 * once (greedy and seeded sampling, n = 2 samples sharing blocks through
 * copy-on-write, a pool small enough to preempt, prefix-cache hits) give
 * the CPU's tokens, logits and log probabilities bit for bit; the weights
 * are device tensors with no host copy left and the forward descriptors
 * ran there; decode steps allocate no device memory; a device model
 * refuses zs_llm_save; an unknown device is refused with the list.
 */
#include <stdlib.h>
#include <string.h>

#include "infer/internal.h"
#include "testutil.h"
#include "zs/infer.h"
#include "zs/ops.h"

#define V 67
#define DEV ZS_TEST_DEVICE
#define MAXEV 4096

static zs_module *tiny_gpt(zs_gpt_arch arch)
{
    return zt_tiny_gpt(arch, V, 96, 11, 200);
}

/* Every event of a run, in order. */
typedef struct event {
    uint64_t request;
    int sample;
    int32_t token;
    float logprob;
    float logits[V];
    int n_top;
    int32_t top[3];
    zs_finish finish;
} event;

typedef struct trace {
    event *ev;
    int n;
    zs_engine_stats st;
} trace;

static void on_event(void *ctx, const zs_token_event *e)
{
    trace *t = ctx;
    if (t->n == MAXEV)
        return;
    event *v = &t->ev[t->n++];
    *v = (event){e->request, e->sample, e->token, e->logprob, {0}, e->n_top, {0}, e->finish};
    if (e->logits)
        memcpy(v->logits, e->logits, sizeof v->logits);
    memcpy(v->top, e->top_ids, (size_t)e->n_top * sizeof *e->top_ids);
}

static const int32_t prompt[40] = {5,  17, 3,  44, 9,  60, 2,  31, 8,  8,  15, 22, 40, 1,
                                   7,  33, 5,  17, 3,  44, 9,  60, 2,  31, 12, 50, 66, 0,
                                   19, 23, 29, 37, 41, 43, 47, 53, 59, 61, 4,  6};

/* Six requests at once: greedy and sampled, one with n = 2, the fifth
 * finding the first's 16-token prefix cached; a pool of kv_blocks blocks
 * of 8, 20 tokens per step. */
static void serve(const zs_llm *m, zs_dtype kv, int64_t kv_blocks, trace *t)
{
    zs_engine_config c = {.block_size = 8, .kv_blocks = kv_blocks, .max_num_seqs = 8,
                          .max_batched_tokens = 20, .kv_dtype = kv};
    zs_engine *e = zs_engine_new(m, NULL, &c);
    ZT_CHECK(e != NULL, "engine: %s", zs_last_error());
    if (!e)
        return;
    for (int r = 0; r < 6; r++) {
        zs_gen_request q = {.prompt = prompt + (r == 4 ? 0 : r),
                            .n_prompt = r == 0 ? 17 : 6 + 3 * r,
                            .max_tokens = 18 + r,
                            .sampling = {.temperature = r % 2 ? 0.8 : 0, .top_k = 30,
                                         .top_p = 0.95, .seed = 100 + (uint64_t)r},
                            .n = r == 3 ? 2 : 1, .logprobs = 3, .ignore_eos = true};
        ZT_CHECK(zs_engine_add(e, &q, NULL) == ZS_OK, "add: %s", zs_last_error());
    }
    t->n = 0;
    ZT_CHECK(zs_engine_run(e, on_event, t) == ZS_OK, "run: %s", zs_last_error());
    zs_engine_get_stats(e, &t->st);
    zs_engine_free(e);
}

static bool same_events(const trace *a, const trace *b)
{
    return a->n == b->n && a->n > 0 &&
           !memcmp(a->ev, b->ev, (size_t)a->n * sizeof *a->ev);
}

/* cpu and device models of g with options o: logits and serving agree. */
static void compare(zs_module *g, zs_llm_options o, zs_dtype kv, const char *what)
{
    zs_llm *cpu = zs_llm_from_gpt(g, &o);
    o.device = DEV;
    zs_test_device_reset_calls();
    zs_llm *dev = zs_llm_from_gpt(g, &o);
    ZT_CHECK(cpu && dev, "%s: models on cpu and test: %s", what, zs_last_error());
    if (!cpu || !dev) {
        zs_llm_free(cpu), zs_llm_free(dev);
        return;
    }
    const zsi_linear *qkv = &dev->layers[0].qkv;
    ZT_CHECK(dev->device == DEV && qkv->tw->device == DEV && dev->twte->device == DEV &&
             !qkv->packed.data && !qkv->tiles.data && !qkv->w && !qkv->bias &&
             !dev->layers[1].arena && !dev->lnf_w && !dev->head.tiles.data &&
             !dev->head.packed.data, "%s: the weights are test-device tensors, no host "
             "copy left", what);
    int64_t T = 29;
    float a[29 * V], b[29 * V];
    ZT_CHECK(zs_llm_logits(cpu, prompt, T, a) == ZS_OK &&
             zs_llm_logits(dev, prompt, T, b) == ZS_OK, "%s: logits: %s", what,
             zs_last_error());
    ZT_CHECK(!memcmp(a, b, sizeof a), "%s: zs_llm_logits on test = cpu, bit for bit", what);
    ZT_CHECK(zs_test_device_calls("packed_linear") >= 9 &&
             zs_test_device_calls("paged_attention") >= 2 &&
             zs_test_device_calls("kv_store") >= 2 &&
             zs_test_device_calls("embedding_rows") >= 1 &&
             zs_test_device_calls("layer_norm_rows") >= 5 &&
             zs_test_device_calls("gather_rows") >= 1, "%s: the forward ran through "
             "the test device's kernels (%lld packed_linear calls)", what,
             (long long)zs_test_device_calls("packed_linear"));

    trace tc = {malloc(MAXEV * sizeof(event)), 0, {0}}, td = {malloc(MAXEV * sizeof(event)), 0, {0}};
    int64_t blocks[2] = {64, 14}; /* roomy; tight enough to preempt */
    for (int k = 0; k < 2; k++) {
        serve(cpu, kv, blocks[k], &tc);
        serve(dev, kv, blocks[k], &td);
        ZT_CHECK(same_events(&tc, &td), "%s, %lld blocks: %d events (tokens, logits, "
                 "log probabilities) on test = cpu, bit for bit", what,
                 (long long)blocks[k], td.n);
        ZT_CHECK(td.st.kv.cow_copies > 0 && td.st.kv.prefix_hits > 0 &&
                 td.st.steps == tc.st.steps && td.st.preemptions == tc.st.preemptions,
                 "%s, %lld blocks: copy-on-write %lld, prefix hits %lld, preemptions "
                 "%lld, as on the cpu", what, (long long)blocks[k],
                 (long long)td.st.kv.cow_copies, (long long)td.st.kv.prefix_hits,
                 (long long)td.st.preemptions);
    }
    ZT_CHECK(tc.st.preemptions > 0, "%s: the tight pool preempted", what);
    free(tc.ev), free(td.ev);
    zs_llm_free(cpu);
    zs_llm_free(dev);
}

/* One request's decode steps allocate nothing on the device. */
static int64_t allocs_seen;
static void on_alloc(void *ctx, const zs_token_event *e)
{
    (void)ctx;
    zs_device_stats st;
    zs_device_get_stats(DEV, &st);
    if (e->n_output == 2) /* the first decode step done: buffers reserved */
        allocs_seen = (int64_t)st.n_allocs;
    else if (e->n_output > 2 && allocs_seen >= 0 && (int64_t)st.n_allocs != allocs_seen)
        allocs_seen = -1;
}

static void test_steady(zs_module *g)
{
    zt_section("device: decode steps allocate no device memory; refusals");
    zs_llm_options o = {.device = DEV};
    zs_llm *m = zs_llm_from_gpt(g, &o);
    zs_engine *e = zs_engine_new(m, NULL, &(zs_engine_config){.kv_blocks = 16});
    zs_gen_request q = {.prompt = prompt, .n_prompt = 5, .max_tokens = 12,
                        .ignore_eos = true};
    allocs_seen = 0;
    ZT_CHECK(e && zs_engine_add(e, &q, NULL) == ZS_OK &&
             zs_engine_run(e, on_alloc, NULL) == ZS_OK && allocs_seen > 0,
             "decode steps 3 .. 12: no device allocation (%lld)", (long long)allocs_seen);
    zs_engine_free(e);
    zs_llm_free(m);

    o = (zs_llm_options){.quant = ZS_QUANT_Q8_0, .device = DEV};
    m = zs_llm_from_gpt(g, &o);
    ZT_EXPECT_ERROR(zs_llm_save(m, "/tmp/zs_never_written.safetensors", NULL) != ZS_OK,
                    "lives on test");
    zs_llm_free(m);
    o = (zs_llm_options){.device = 5};
    ZT_EXPECT_ERROR(zs_llm_from_gpt(g, &o) == NULL, "devices: cpu, test");
    zs_kv_pool_config pc = {2, 4, 16, 8, 4, ZS_F32};
    ZT_EXPECT_ERROR(zs_kv_pool_new_on(&pc, 6) == NULL, "device");
}

int main(void)
{
    ZT_CHECK(zs_test_device_enable() == ZS_OK, "test device: %s", zs_last_error());
    zs_module *g = tiny_gpt(ZS_GPT2), *gb = tiny_gpt(ZS_BLOOM);
    zt_section("gpt2 f32 on the test device = cpu");
    compare(g, (zs_llm_options){0}, ZS_F32, "gpt2 f32");
    zt_section("gpt2 q8_0 on the test device = cpu");
    compare(g, (zs_llm_options){.quant = ZS_QUANT_Q8_0}, ZS_F32, "gpt2 q8_0");
    zt_section("bloom f32, bf16 KV cache, on the test device = cpu");
    compare(gb, (zs_llm_options){0}, ZS_BF16, "bloom f32 bf16-kv");
    zt_section("gpt2 int8 (LLM.int8()) and f64 on the test device = cpu");
    compare(g, (zs_llm_options){.quant = ZS_QUANT_INT8}, ZS_F32, "gpt2 int8");
    zs_module *g64 = tiny_gpt(ZS_GPT2);
    ZT_CHECK(zs_module_to_dtype(g64, ZS_F64) == ZS_OK, "to f64");
    compare(g64, (zs_llm_options){0}, ZS_F32, "gpt2 f64");
    zs_module_free(g64);
    test_steady(g);
    zs_module_free(g);
    zs_module_free(gb);
    return zt_done();
}
