/*
 * test_sample.c - zs_sample and zs_sample_with_history (zs/infer.h):
 * draws follow softmax(logits / T) (a chi-square-style bound on 20000
 * draws), top-k / top-p / min-p drop exactly the tokens they should, the
 * penalties move the logits as CTRL and OpenAI define them, a seed and
 * step give the same token every time, and bad parameters are refused.
 * A large vocabulary with ties (the partial sorts' paths: top-k selection,
 * top-p prefixes that must grow, a min-p set past the first prefix): every
 * draw lies in the set a full float64 sort keeps, and the likeliest kept
 * token comes up as often as its renormalised probability says.
 */
#include <math.h>
#include <stdlib.h>

#include "testutil.h"

#define V 6

static const float LOGITS[V] = {2.0f, 1.5f, 1.0f, 0.0f, -1.0f, -3.0f};

/* Frequencies of n draws at steps 0..n-1. */
static void draw(const zs_sampler *s, int n, double *f)
{
    for (int i = 0; i < V; i++)
        f[i] = 0;
    for (int k = 0; k < n; k++) {
        int64_t id = zs_sample(LOGITS, V, s, (uint64_t)k);
        if (id >= 0)
            f[id] += 1.0 / n;
    }
}

/* softmax(LOGITS / T) restricted to keep[] (renormalised). */
static void expected(double T, const bool *keep, double *p)
{
    double z = 0;
    for (int i = 0; i < V; i++)
        z += keep[i] ? (p[i] = exp(LOGITS[i] / T)) : (p[i] = 0);
    for (int i = 0; i < V; i++)
        p[i] /= z;
}

static bool close_to(const double *f, const double *p, int n)
{
    for (int i = 0; i < V; i++)
        if (fabs(f[i] - p[i]) > 4 * sqrt(p[i] * (1 - p[i]) / n) + 1e-12)
            return false;
    return true;
}

static void test_filters(void)
{
    int n = 20000;
    double f[V], p[V];
    bool all[V] = {1, 1, 1, 1, 1, 1};
    zs_sampler s = {.temperature = 1, .top_p = 1, .seed = 3};
    draw(&s, n, f);
    expected(1, all, p);
    ZT_CHECK(close_to(f, p, n), "T = 1: frequencies follow the softmax");
    s.temperature = 0.5;
    draw(&s, n, f);
    expected(0.5, all, p);
    ZT_CHECK(close_to(f, p, n), "T = 0.5: frequencies follow softmax(l / 0.5)");
    s = (zs_sampler){.temperature = 1, .top_k = 3, .top_p = 1, .seed = 4};
    draw(&s, n, f);
    expected(1, (bool[V]){1, 1, 1, 0, 0, 0}, p);
    ZT_CHECK(close_to(f, p, n), "top-k 3");
    /* softmax masses ~ .42 .26 .16 .06 .02 .003: top-p .8 keeps 3 */
    s = (zs_sampler){.temperature = 1, .top_p = 0.8, .seed = 5};
    draw(&s, n, f);
    ZT_CHECK(close_to(f, p, n), "top-p 0.8 keeps the 3 tokens reaching 0.8");
    /* min-p 0.1: p_i / p_0 = exp(l_i - 2) is 1, .61, .37, .135, .05, .007:
     * the first four stay */
    s = (zs_sampler){.temperature = 1, .top_p = 1, .min_p = 0.1, .seed = 6};
    draw(&s, n, f);
    expected(1, (bool[V]){1, 1, 1, 1, 0, 0}, p);
    ZT_CHECK(close_to(f, p, n), "min-p 0.1 drops tokens below a tenth of the top one");
    s.min_p = 1;
    draw(&s, 200, f);
    ZT_CHECK(f[0] > 0.999 && f[1] == 0, "min-p 1: only the most likely");
    ZT_CHECK(zs_sample(LOGITS, V, &s, 17) == zs_sample(LOGITS, V, &s, 17),
             "a seed and a step give one token");
    zt_section("temperature, top-k, top-p, min-p");
}

static void test_penalties(void)
{
    float l[2] = {1.0f, 0.9f};
    int32_t seen[2] = {0, 0};
    zs_sampler g = {.temperature = 0, .top_p = 1};
    ZT_CHECK(zs_sample_with_history(l, 2, &g, seen, 2, 0) == 0, "no penalty: argmax");
    g.frequency_penalty = 0.1; /* 1.0 - 2 * 0.1 = 0.8 < 0.9 */
    ZT_CHECK(zs_sample_with_history(l, 2, &g, seen, 2, 0) == 1, "frequency: per occurrence");
    g.frequency_penalty = 0, g.presence_penalty = 0.05; /* 0.95 > 0.9 */
    ZT_CHECK(zs_sample_with_history(l, 2, &g, seen, 2, 0) == 0, "presence: once");
    g.presence_penalty = 0.2; /* 0.8 < 0.9 */
    ZT_CHECK(zs_sample_with_history(l, 2, &g, seen, 2, 0) == 1, "presence 0.2");
    g.presence_penalty = 0, g.repetition_penalty = 1.2; /* 1.0 / 1.2 = 0.83 */
    ZT_CHECK(zs_sample_with_history(l, 2, &g, seen, 1, 0) == 1, "repetition divides a "
             "positive logit");
    float neg[2] = {-1.0f, -1.1f}; /* -1.0 * 1.2 = -1.2 < -1.1 */
    ZT_CHECK(zs_sample_with_history(neg, 2, &g, seen, 1, 0) == 1, "repetition multiplies "
             "a negative logit");
    ZT_CHECK(l[0] == 1.0f && neg[0] == -1.0f, "the caller's logits are not changed");
    int32_t bad[1] = {2};
    ZT_EXPECT_ERROR(zs_sample_with_history(l, 2, &g, bad, 1, 0) < 0, "outside [0, 2)");
    g.repetition_penalty = -1;
    ZT_EXPECT_ERROR(zs_sample_with_history(l, 2, &g, seen, 1, 0) < 0, "repetition penalty");
    g.repetition_penalty = 1, g.frequency_penalty = NAN;
    ZT_EXPECT_ERROR(zs_sample_with_history(l, 2, &g, seen, 1, 0) < 0, "frequency");
    zs_sampler s = {.temperature = 1, .top_p = 1, .min_p = 1.5};
    ZT_EXPECT_ERROR(zs_sample(LOGITS, V, &s, 0) < 0, "min_p");
    s.min_p = 0, s.top_p = 0;
    ZT_EXPECT_ERROR(zs_sample(LOGITS, V, &s, 0) < 0, "top_p");
    zt_section("penalties and errors");
}

#define BIGV 3000

static int by_desc(const void *a, const void *b)
{
    const double *x = a, *y = b; /* {logit, id} */
    if (x[0] != y[0])
        return x[0] < y[0] ? 1 : -1;
    return x[1] < y[1] ? -1 : x[1] > y[1];
}

/* The ids the sampler may return for s (full sort, float64) into keep[],
 * and the renormalised probability of the likeliest. */
static double reference_keep(const float *l, const zs_sampler *s, bool *keep)
{
    static double c[BIGV][2], p[BIGV];
    for (int i = 0; i < BIGV; i++)
        c[i][0] = l[i], c[i][1] = i, keep[i] = false;
    qsort(c, BIGV, sizeof c[0], by_desc);
    int n = s->top_k > 0 && s->top_k < BIGV ? s->top_k : BIGV;
    double total = 0;
    for (int i = 0; i < n; i++)
        total += (p[i] = exp((c[i][0] - c[0][0]) / s->temperature));
    int keep_n = n;
    double acc = 0;
    for (int i = 0; s->top_p < 1 && i < n; i++)
        if ((acc += p[i] / total) >= s->top_p) {
            keep_n = i + 1;
            break;
        }
    while (s->min_p > 0 && keep_n > 1 && p[keep_n - 1] < s->min_p * p[0])
        keep_n--;
    double kept = 0;
    for (int i = 0; i < keep_n; i++)
        keep[(int)c[i][1]] = true, kept += p[i];
    return p[0] / kept;
}

static void test_large_vocab(void)
{
    static float l[BIGV];
    static bool keep[BIGV];
    zt_irand_seed(11);
    for (int i = 0; i < BIGV; i++) /* steps of 0.01: many ties */
        l[i] = (float)zt_irand(-400, 400) / 100.0f;
    l[1234] = 4.5f;
    const zs_sampler cases[] = {
        {.temperature = 0.7, .top_k = 50, .top_p = 1, .seed = 1},
        {.temperature = 0.7, .top_p = 0.9, .seed = 2},
        {.temperature = 1.3, .top_p = 0.999, .seed = 3}, /* grows past 256 */
        {.temperature = 0.7, .top_p = 1, .min_p = 0.05, .seed = 4},
        {.temperature = 1, .top_p = 1, .min_p = 0.0001, .seed = 5}, /* > 256 kept */
        {.temperature = 0.7, .top_k = 200, .top_p = 0.5, .min_p = 0.01, .seed = 6},
        {.temperature = 2, .top_p = 1, .seed = 7}, /* untruncated */
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        double p1 = reference_keep(l, &cases[k], keep);
        int n = 4000, outside = 0, top = 0;
        for (int i = 0; i < n; i++) {
            int64_t id = zs_sample(l, BIGV, &cases[k], (uint64_t)i);
            outside += id < 0 || id >= BIGV || !keep[id];
            top += id == 1234;
        }
        double sd = sqrt(p1 * (1 - p1) / n);
        ZT_CHECK(outside == 0, "case %zu: %d draws outside the kept set", k, outside);
        ZT_CHECK(fabs((double)top / n - p1) < 5 * sd + 1e-9,
                 "case %zu: the likeliest drawn %.4f of the time, expected %.4f", k,
                 (double)top / n, p1);
    }
}

int main(void)
{
    test_filters();
    test_penalties();
    test_large_vocab();
    zt_section("large vocabulary, partial sorts");
    return zt_done();
}
