/*
 * zs/infer.h - inference: a trained model back from disk, and sampling the
 * next token.
 */
#ifndef ZS_INFER_H
#define ZS_INFER_H

#include "core.h"
#include "nn.h"
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

#ifdef __cplusplus
}
#endif
#endif
