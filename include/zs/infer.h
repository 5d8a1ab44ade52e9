/*
 * zs/infer.h - inference: sampling the next token.
 */
#ifndef ZS_INFER_H
#define ZS_INFER_H

#include "core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct zs_sampler {
    double temperature; /* 0 = greedy (argmax) */
    int top_k;          /* 0 = off */
    double top_p;       /* 1 = off; keeps the smallest set with mass >= p */
    uint64_t seed;
} zs_sampler;

/* Draws a token from logits[0, V) (f32): softmax(logits / temperature),
 * restricted to the top_k most likely and then to the top_p nucleus; the
 * uniform draw is zs_philox(seed, step), so a generation is reproducible.
 * Returns the id, or -1 + message for bad parameters. */
int64_t zs_sample(const float *logits, int64_t V, const zs_sampler *s,
                  uint64_t step);

#ifdef __cplusplus
}
#endif
#endif
