/*
 * test_sample.c - zs_sample and zs_sample_with_history (zs/infer.h):
 * draws follow softmax(logits / T) (a chi-square-style bound on 20000
 * draws), top-k / top-p / min-p drop exactly the tokens they should, the
 * penalties move the logits as CTRL and OpenAI define them, a seed and
 * step give the same token every time, and bad parameters are refused.
 */
#include <math.h>

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

int main(void)
{
    test_filters();
    test_penalties();
    return zt_done();
}
