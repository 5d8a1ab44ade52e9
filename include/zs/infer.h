/*
 * zs/infer.h - inference: a trained model back from disk, sampling the
 * next token, and the serving engine: a GPT laid out for inference
 * (zs_llm: f32, f64 or quantized weights) and an engine that answers many
 * requests at once (zs_engine: paged KV cache, continuous batching, prefix
 * caching, per-request sampling).
 *
 * Batch invariance: every kernel of the engine's forward pass computes a
 * token's row with a reduction order that depends on that row only (the
 * matrix products accumulate each output in one fixed order whatever the
 * batch; attention splits a sequence into fixed 256-position chunks merged
 * in order, whatever else runs), so a request with a seed gives the same
 * tokens, bit for bit, alone or batched with any others, and after a
 * preemption that recomputes it.
 */
#ifndef ZS_INFER_H
#define ZS_INFER_H

#include "core.h"
#include "nn.h"
#include "kv_pool.h"
#include "text.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A model as zs train left it. */
typedef struct zs_model_file {
    zs_module *model;    /* owned */
    zs_bpe *tokenizer;   /* owned; NULL for models without text (CNNs) */
    char kind[16];       /* the metadata's "model": gpt, lenet, resnet */
    zs_gpt_config gpt;   /* kind "gpt": its config */
    char *metadata;      /* owned: the checkpoint's metadata JSON */
} zs_model_file;

/* Opens path: a checkpoint file, or a training output directory holding
 * checkpoint.safetensors. The kind and config come from the metadata
 * (checked against the file's tensors before anything is allocated, see
 * zs_gpt_load); a GPT also needs the tokenizer.bpe of its directory, with
 * the same vocabulary. On failure *out is empty and the message names the
 * file and what is wrong. */
zs_status zs_model_open(const char *path, zs_model_file *out);
void zs_model_close(zs_model_file *f); /* zeroed structs: no-op */

typedef struct zs_sampler {
    double temperature; /* 0 = greedy (argmax) */
    int top_k;          /* 0 = off */
    double top_p;       /* 1 = off; keeps the smallest set with mass >= p */
    uint64_t seed;
    double min_p;       /* 0 = off; drops tokens whose probability is below
                         * min_p times the most likely one's */
    /* Penalties on the tokens of the history given to
     * zs_sample_with_history (0 = off for all three): */
    double repetition_penalty; /* CTRL / Hugging Face: a seen token's logit
                                * is divided by it when positive, multiplied
                                * when negative; 1 = off */
    double presence_penalty;   /* OpenAI: subtracted once from a seen token */
    double frequency_penalty;  /* OpenAI: subtracted per occurrence */
} zs_sampler;

/* Draws a token from logits[0, V) (f32): softmax(logits / temperature),
 * restricted to the top_k most likely, then to the top_p nucleus, then to
 * those with at least min_p of the top probability (the order of vLLM);
 * the uniform draw is zs_philox(seed, step), so a generation is
 * reproducible and does not depend on what else runs. Returns the id, or
 * -1 + message for bad parameters. The penalties are ignored here. */
int64_t zs_sample(const float *logits, int64_t V, const zs_sampler *s,
                  uint64_t step);
/* zs_sample after the penalties for the tokens prev[0, n_prev) (ids
 * outside [0, V) are an error): the caller decides what counts as seen
 * (vLLM: the prompt and the output for the repetition penalty, the output
 * for presence and frequency; pass the one list that fits). */
int64_t zs_sample_with_history(const float *logits, int64_t V, const zs_sampler *s,
                               const int32_t *prev, int64_t n_prev, uint64_t step);

/* ---- the inference model ------------------------------------------------ */

typedef enum zs_quant {
    ZS_QUANT_NONE = 0, /* the model's precision: f64 stays f64; f32, bf16 and
                        * f16 weights run in f32 */
    ZS_QUANT_Q8_0,     /* int8, one f16 scale per 32 weights (llama.cpp Q8_0);
                        * activations quantized per 32 on the fly */
    ZS_QUANT_Q4_0,     /* int4, one scale per 32 (Q4_0); the logits head Q8_0 */
    ZS_QUANT_Q4_1,     /* int4, scale and offset per 32 (Q4_1); head Q8_0 */
    ZS_QUANT_INT8,     /* LLM.int8(): int8 per output row, activations int8 per
                        * token row except outlier features (|x| > threshold),
                        * which stay f32; the logits head stays f32 */
    ZS_QUANT_W8A8,     /* SmoothQuant: W * s and x / s per input channel with
                        * s = amax(x)^alpha / amax(W)^(1-alpha) calibrated on
                        * text, then int8 per output row and per token row;
                        * the logits head stays f32 */
} zs_quant;

/* "none", "q8_0", "q4_0", "q4_1", "int8", "w8a8"; zs_quant_parse also takes
 * "f32", "q8" (= q8_0), "q4" (= q4_0), "llm.int8" and "smoothquant". */
const char *zs_quant_name(zs_quant q);
zs_status zs_quant_parse(const char *s, zs_quant *q);

typedef struct zs_llm_options {
    zs_quant quant;
    float int8_threshold;  /* ZS_QUANT_INT8; 0: 6.0 (the paper's) */
    double smooth_alpha;   /* ZS_QUANT_W8A8; 0: 0.5 */
    const int32_t *calib;  /* ZS_QUANT_W8A8: calibration tokens (required) */
    int64_t n_calib;
    int device;            /* where the weights live and the forward pass
                            * runs: ZS_CPU (0) or a registered device
                            * (zs_device_find); its engines keep their KV
                            * pool and work buffers there too, and only the
                            * logits come back to the host */
} zs_llm_options;

typedef struct zs_llm zs_llm;

/* The GPT's weights copied into inference layout, quantized as asked (o
 * may be NULL: no quantization). The module is borrowed for the call only.
 * Quantized formats need the width to be a multiple of 32. */
zs_llm *zs_llm_from_gpt(zs_module *gpt, const zs_llm_options *o);
void zs_llm_free(zs_llm *m);
const zs_gpt_config *zs_llm_config(const zs_llm *m);
zs_quant zs_llm_quant(const zs_llm *m);
zs_dtype zs_llm_dtype(const zs_llm *m);     /* compute dtype: f32 or f64 */
int64_t zs_llm_weight_bytes(const zs_llm *m); /* read per decode step */

/* Writes m (a model on the CPU) as safetensors at path (atomically): the GPT's tensor names,
 * quantized tensors as U8 blocks or I8 rows (+ ".scale", ".smooth"), the
 * format of each in the metadata ("quant", "quant.<name>"), beside the
 * GPT config and extra_metadata's keys (a JSON object of strings or NULL). */
zs_status zs_llm_save(const zs_llm *m, const char *path, const char *extra_metadata);
/* Reads a checkpoint written by zs_llm_save or zs train (a file, or a
 * training directory holding checkpoint.safetensors); every tensor's
 * dtype, shape and scales are checked (a corrupted file is an error, never
 * a crash). With quant != NONE a float checkpoint is quantized on load
 * (W8A8 needs calibration tokens: use zs_llm_from_gpt). *tokenizer, when
 * not NULL, gets the tokenizer.bpe beside it. */
zs_llm *zs_llm_open(const char *path, const zs_llm_options *o, zs_bpe **tokenizer);

/* Logits [n, V] (f32, caller's buffer) of every position of one sequence
 * tokens[0, n), n <= ctx, computed through the engine's kernels: a cold
 * run for tests and for validation loss. */
zs_status zs_llm_logits(const zs_llm *m, const int32_t *tokens, int64_t n, float *logits);

/* ---- the engine -------------------------------------------------------- */

typedef struct zs_engine_config {
    int64_t block_size;          /* tokens per KV block; 0: 16 */
    int64_t kv_blocks;           /* blocks in the pool; 0: enough for
                                  * max_num_seqs full contexts, at most 1 GiB */
    int64_t max_num_seqs;        /* sequences decoding at once; 0: 64 */
    int64_t max_batched_tokens;  /* tokens per step (decodes + prefill
                                  * chunks); 0: 512 */
    bool no_prefix_cache;        /* prefix caching is on unless set */
    bool static_batching;        /* comparison mode: a batch is admitted
                                  * only when the previous one has finished
                                  * entirely, each member is padded to the
                                  * longest (its slot stays busy), and its
                                  * prompt to the batch's longest prompt
                                  * (the pad rows are computed in a scratch
                                  * sequence and dropped, as masked left
                                  * padding costs) */
    zs_dtype kv_dtype;           /* keys and values in the pool: ZS_F32 (0)
                                  * means the model's compute dtype; ZS_BF16
                                  * or ZS_F16 store an f32 model's in 16 bits
                                  * (half the memory and the bytes decode
                                  * reads; rounded to nearest even, attention
                                  * still computes in f32) */
} zs_engine_config;

typedef enum zs_finish {
    ZS_FINISH_NONE = 0, /* still running */
    ZS_FINISH_LENGTH,   /* max_tokens reached, or the model's context */
    ZS_FINISH_STOP,     /* a stop token id, a stop string or end of text */
    ZS_FINISH_ABORT,    /* zs_engine_abort */
} zs_finish;

const char *zs_finish_name(zs_finish f); /* "length", "stop", "abort", NULL */

#define ZS_MAX_LOGPROBS 20

typedef struct zs_gen_request {
    const int32_t *prompt;  /* copied; 1 .. ctx - 1 ids in [0, vocab) */
    int64_t n_prompt;
    zs_sampler sampling;    /* sample i of n draws with seed + i */
    int64_t max_tokens;     /* new tokens per sample; 0: up to the context */
    int n;                  /* samples of the prompt; 0: 1. They share the
                             * prompt's KV blocks (copy-on-write). */
    const int32_t *stop_ids;/* copied: tokens that end a sample (not output) */
    int n_stop_ids;
    const char *const *stop;/* copied: strings that end a sample; the text
                             * is cut before them (needs a tokenizer) */
    int n_stop;
    bool ignore_eos;        /* keep going past the tokenizer's end of text */
    int logprobs;           /* alternatives per token, 0 .. ZS_MAX_LOGPROBS */
    void *user;             /* handed back in the events */
} zs_gen_request;

/* One sampled token of one sample of a request, or the sample's end. The
 * pointers are valid during the callback only. */
typedef struct zs_token_event {
    uint64_t request;
    int sample;
    void *user;
    int32_t token;          /* -1 when the event only ends the sample */
    const float *logits;    /* [V] the raw logits the token was drawn from */
    float logprob;          /* log softmax of the raw logits at token */
    int n_top;              /* top alternatives (request's logprobs) */
    const int32_t *top_ids;
    const float *top_logprobs;
    zs_finish finish;       /* != NONE: this was the sample's last event */
    int64_t n_output;       /* tokens of the sample's output so far (the
                             * stop token excluded) */
    int64_t text_bytes;     /* bytes of the output text to keep (a stop
                             * string and what follows cut), -1 without a
                             * tokenizer */
} zs_token_event;

typedef void (*zs_token_fn)(void *ctx, const zs_token_event *ev);

typedef struct zs_engine_stats {
    int64_t running, waiting, steps, preemptions;
    int64_t prompt_tokens, computed_prompt_tokens, generated_tokens;
    int64_t requests_done;
    int64_t padding_rows;    /* static batching's prompt padding computed */
    zs_kv_pool_stats kv;     /* prefix_hits / prefix_queries = hit rate */
} zs_engine_stats;

typedef struct zs_engine zs_engine;

/* The engine borrows m and tokenizer (NULL: no stop strings, no end of
 * text) for its lifetime. NULL + message for a bad config or no memory. */
zs_engine *zs_engine_new(const zs_llm *m, const zs_bpe *tokenizer,
                         const zs_engine_config *c);
void zs_engine_free(zs_engine *e);
/* Queues a request (first come, first served). A bad request (empty
 * prompt, longer than the context, unknown ids, bad sampling values) is
 * refused with a message and queues nothing. *id identifies it. */
zs_status zs_engine_add(zs_engine *e, const zs_gen_request *r, uint64_t *id);
/* Ends a request now: its samples get a ZS_FINISH_ABORT event at the next
 * step, its KV blocks are freed at once. Unknown id: ZS_ERR_ARG. */
zs_status zs_engine_abort(zs_engine *e, uint64_t id);
/* One iteration: schedules decodes and prefill chunks under the token
 * budget, runs them as one batch, samples and reports through fn. */
zs_status zs_engine_step(zs_engine *e, zs_token_fn fn, void *ctx);
bool zs_engine_busy(const zs_engine *e); /* anything running or waiting */
/* Steps until nothing is left. */
zs_status zs_engine_run(zs_engine *e, zs_token_fn fn, void *ctx);
void zs_engine_get_stats(const zs_engine *e, zs_engine_stats *st);

#ifdef __cplusplus
}
#endif
#endif
