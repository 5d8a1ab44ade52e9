/*
 * sample.c - temperature, top-k, top-p (nucleus) and min-p sampling, and
 * the repetition, presence and frequency penalties.
 *
 * Candidates are ordered by logit (ties: lower id first) only as far as
 * the truncation needs: top-k selects its k by quickselect and sorts those
 * k; top-p and min-p select and sort a prefix of 256 candidates, growing it
 * 4x until the nucleus ends inside it (min-p's set is counted first). With
 * no truncation nothing is sorted and the draw walks the vocabulary in id
 * order (the same distribution). Sorting all 50257 ids of GPT-2 per token
 * cost about as much as the forward pass. Probabilities are computed in
 * double with the maximum subtracted. Scratch comes from zs_alloc, so a
 * serving loop does not fault fresh pages in per token.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "zs/infer.h"

typedef struct cand {
    float logit;
    int64_t id;
} cand;

#define PREFIX0 256 /* first sorted prefix for top-p / min-p */

/* a before b: larger logit, then lower id (a total order). */
static bool before(cand a, cand b)
{
    return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
}

static int by_logit_desc(const void *a, const void *b)
{
    const cand *x = a, *y = b;
    return before(*x, *y) ? -1 : before(*y, *x);
}

static int by_id(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

static void swap(cand *a, cand *b)
{
    cand t = *a;
    *a = *b;
    *b = t;
}

/* Reorders c[0, n) so that c[0, m) are its m first (in `before` order),
 * sorted; 0 < m <= n. Quickselect with a median-of-three pivot, then a
 * sort of the prefix. */
static void sort_prefix(cand *c, int64_t n, int64_t m)
{
    int64_t lo = 0, hi = n - 1;
    while (m < n && lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (before(c[hi], c[lo]))
            swap(&c[lo], &c[hi]);
        if (before(c[mid], c[lo]))
            swap(&c[mid], &c[lo]);
        if (before(c[hi], c[mid]))
            swap(&c[mid], &c[hi]);
        cand pv = c[mid];
        int64_t i = lo, j = hi;
        while (i <= j) {
            while (before(c[i], pv))
                i++;
            while (before(pv, c[j]))
                j--;
            if (i <= j)
                swap(&c[i++], &c[j--]);
        }
        /* [lo, j] before-or-equal pv, [i, hi] after-or-equal pv */
        if (m - 1 <= j)
            hi = j;
        else if (m - 1 >= i)
            lo = i;
        else
            break;
    }
    qsort(c, (size_t)m, sizeof *c, by_logit_desc);
}

/* The index drawn from weights p[0, n) (sum total) with the uniform draw of
 * (seed, step). */
static int64_t draw(const double *p, int64_t n, double total, uint64_t seed, uint64_t step)
{
    uint32_t w[4];
    zs_philox(seed, step, w);
    double u = ((double)w[0] + 0.5) / 4294967296.0 * total, acc = 0;
    for (int64_t i = 0; i < n; i++) {
        acc += p[i];
        if (u < acc)
            return i;
    }
    return n - 1;
}

/* The truncated draw: c holds every candidate, mx the largest logit. */
static int64_t sample_truncated(cand *c, double *p, int64_t V, float mx, const zs_sampler *s,
                                uint64_t step)
{
    double T = s->temperature;
    int64_t n = s->top_k > 0 && s->top_k < V ? s->top_k : V, m = n;
    double total = 0;
    if (n == V) { /* top-p / min-p: the whole vocabulary's mass, a prefix */
        int64_t need = 0;
        for (int64_t i = 0; i < V; i++) {
            double e = exp(((double)c[i].logit - mx) / T);
            total += e;
            need += s->min_p > 0 && e >= s->min_p; /* p[0] = 1 */
        }
        /* min-p keeps at most `need` (sorted, they are a prefix), so that
         * prefix is enough whatever top-p keeps; else grow from PREFIX0 */
        m = s->min_p > 0 ? need : PREFIX0;
        m = m < 1 ? 1 : m > V ? V : m;
    }
    for (;;) {
        sort_prefix(c, V, m);
        for (int64_t i = 0; i < m; i++)
            p[i] = exp(((double)c[i].logit - mx) / T);
        if (n < V)
            for (int64_t i = 0; i < n; i++)
                total += p[i];
        int64_t keep = m;
        bool found = s->top_p >= 1 || n < V;
        if (s->top_p < 1) {
            double acc = 0;
            for (int64_t i = 0; i < m; i++) {
                acc += p[i] / total;
                if (acc >= s->top_p) {
                    keep = i + 1, found = true;
                    break;
                }
            }
        }
        if (!found && m < V && !(s->min_p > 0)) { /* the nucleus reaches past m */
            m = m > V / 4 ? V : 4 * m;
            continue;
        }
        n = keep;
        break;
    }
    if (s->min_p > 0) /* p[0] is the largest */
        while (n > 1 && p[n - 1] < s->min_p * p[0])
            n--;
    total = 0;
    for (int64_t i = 0; i < n; i++)
        total += p[i];
    return c[draw(p, n, total, s->seed, step)].id;
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
    cand *c = zs_alloc((size_t)V * sizeof *c);
    double *p = zs_alloc((size_t)V * sizeof *p);
    if (!c || !p) {
        zs_free(c);
        zs_free(p);
        zs_set_error_code(ZS_ERR_NOMEM, "sample: out of memory");
        return -1;
    }
    float mx = -INFINITY;
    for (int64_t i = 0; i < V; i++) {
        c[i] = (cand){isnan(logits[i]) ? -INFINITY : logits[i], i};
        mx = c[i].logit > mx ? c[i].logit : mx;
    }
    int64_t pick;
    if (mx == -INFINITY) { /* nothing finite: the lowest id */
        pick = 0;
    } else if (s->top_k > 0 && s->top_k < V) {
        pick = sample_truncated(c, p, V, mx, s, step);
    } else if (s->top_p < 1 || s->min_p > 0) {
        pick = sample_truncated(c, p, V, mx, s, step);
    } else { /* no truncation: in id order, nothing sorted */
        double total = 0;
        for (int64_t i = 0; i < V; i++)
            total += (p[i] = exp(((double)c[i].logit - mx) / s->temperature));
        pick = draw(p, V, total, s->seed, step);
    }
    zs_free(c);
    zs_free(p);
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
    if (n_prev == 0 || (rep == 1 && s->presence_penalty == 0 && s->frequency_penalty == 0))
        return zs_sample(logits, V, s, step);
    /* the history sorted, so each seen id's count is its run's length */
    float *l = zs_alloc((size_t)V * sizeof *l);
    int32_t *seen = zs_alloc((size_t)n_prev * sizeof *seen);
    if (!l || !seen) {
        zs_free(l);
        zs_free(seen);
        zs_set_error_code(ZS_ERR_NOMEM, "sample: out of memory");
        return -1;
    }
    memcpy(l, logits, (size_t)V * sizeof *l);
    memcpy(seen, prev, (size_t)n_prev * sizeof *seen);
    qsort(seen, (size_t)n_prev, sizeof *seen, by_id);
    for (int64_t i = 0; i < n_prev;) {
        int64_t j = i;
        while (j < n_prev && seen[j] == seen[i])
            j++;
        double x = l[seen[i]];
        x = x > 0 ? x / rep : x * rep;
        x -= s->presence_penalty + s->frequency_penalty * (double)(j - i);
        l[seen[i]] = (float)x;
        i = j;
    }
    int64_t id = zs_sample(l, V, s, step);
    zs_free(l);
    zs_free(seen);
    return id;
}
