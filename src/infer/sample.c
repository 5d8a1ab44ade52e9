/*
 * sample.c - temperature, top-k, top-p (nucleus) and min-p sampling, and
 * the repetition, presence and frequency penalties.
 *
 * Candidates are sorted by logit only as far as needed (a full sort of the
 * vocabulary only when top-p alone is active); probabilities are computed
 * in double with the maximum subtracted.
 */
#include <math.h>
#include <stdlib.h>

#include "zs/infer.h"

typedef struct cand {
    float logit;
    int64_t id;
} cand;

static int by_logit_desc(const void *a, const void *b)
{
    const cand *x = a, *y = b;
    if (x->logit != y->logit)
        return x->logit < y->logit ? 1 : -1;
    return x->id < y->id ? -1 : x->id > y->id;
}

int64_t zs_sample(const float *logits, int64_t V, const zs_sampler *s,
                  uint64_t step)
{
    if (V <= 0 || !(s->temperature >= 0) || s->top_k < 0 ||
        !(s->top_p > 0 && s->top_p <= 1) || !(s->min_p >= 0 && s->min_p <= 1)) {
        zs_set_error("sample: V %lld, temperature %g, top_k %d, top_p %g, min_p %g: "
                     "expected V > 0, temperature >= 0, top_k >= 0, "
                     "0 < top_p <= 1, 0 <= min_p <= 1", (long long)V, s->temperature,
                     s->top_k, s->top_p, s->min_p);
        return -1;
    }
    if (s->temperature == 0 || s->top_k == 1) {
        int64_t best = 0;
        for (int64_t i = 1; i < V; i++)
            if (logits[i] > logits[best])
                best = i;
        return best;
    }
    cand *c = malloc((size_t)V * sizeof *c);
    double *p = malloc((size_t)V * sizeof *p);
    if (!c || !p) {
        free(c);
        free(p);
        zs_set_error_code(ZS_ERR_NOMEM, "sample: out of memory");
        return -1;
    }
    for (int64_t i = 0; i < V; i++)
        c[i] = (cand){isnan(logits[i]) ? -INFINITY : logits[i], i};
    qsort(c, (size_t)V, sizeof *c, by_logit_desc);
    int64_t n = s->top_k > 0 && s->top_k < V ? s->top_k : V;
    double mx = c[0].logit, total = 0;
    for (int64_t i = 0; i < n; i++) {
        p[i] = exp(((double)c[i].logit - mx) / s->temperature);
        total += p[i];
    }
    if (s->top_p < 1) {
        double acc = 0;
        int64_t keep = n;
        for (int64_t i = 0; i < n; i++) {
            acc += p[i] / total;
            if (acc >= s->top_p) {
                keep = i + 1;
                break;
            }
        }
        n = keep;
    }
    if (s->min_p > 0) /* p[0] is the largest */
        while (n > 1 && p[n - 1] < s->min_p * p[0])
            n--;
    total = 0;
    for (int64_t i = 0; i < n; i++)
        total += p[i];
    uint32_t w[4];
    zs_philox(s->seed, step, w);
    double u = ((double)w[0] + 0.5) / 4294967296.0 * total, acc = 0;
    int64_t pick = c[n - 1].id;
    for (int64_t i = 0; i < n; i++) {
        acc += p[i];
        if (u < acc) {
            pick = c[i].id;
            break;
        }
    }
    free(c);
    free(p);
    return pick;
}

int64_t zs_sample_with_history(const float *logits, int64_t V, const zs_sampler *s,
                               const int32_t *prev, int64_t n_prev, uint64_t step)
{
    double rep = s->repetition_penalty == 0 ? 1 : s->repetition_penalty;
    if (!(rep > 0) || !isfinite(s->presence_penalty) || !isfinite(s->frequency_penalty) ||
        n_prev < 0 || V <= 0) {
        zs_set_error("sample: repetition penalty %g (> 0), presence %g and frequency %g "
                     "(finite), %lld history tokens", s->repetition_penalty,
                     s->presence_penalty, s->frequency_penalty, (long long)n_prev);
        return -1;
    }
    for (int64_t i = 0; i < n_prev; i++)
        if (prev[i] < 0 || prev[i] >= V) {
            zs_set_error("sample: history token %lld is id %d, outside [0, %lld)",
                         (long long)i, prev[i], (long long)V);
            return -1;
        }
    float *l = malloc((size_t)V * sizeof *l);
    int32_t *count = calloc((size_t)V, sizeof *count);
    if (!l || !count) {
        free(l);
        free(count);
        zs_set_error_code(ZS_ERR_NOMEM, "sample: out of memory");
        return -1;
    }
    for (int64_t i = 0; i < V; i++)
        l[i] = logits[i];
    for (int64_t i = 0; i < n_prev; i++)
        count[prev[i]]++;
    for (int64_t i = 0; i < V; i++) {
        if (!count[i])
            continue;
        double x = l[i];
        x = x > 0 ? x / rep : x * rep;
        x -= s->presence_penalty + s->frequency_penalty * count[i];
        l[i] = (float)x;
    }
    int64_t id = zs_sample(l, V, s, step);
    free(l);
    free(count);
    return id;
}
