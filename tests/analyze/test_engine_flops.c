/*
 * test_engine_flops.c - the analyzer's prediction of one GPT training
 * step (zs_analyze_engine_step_flops) against the engine's own counters:
 * a real step (zs_gpt_loss + zs_backward) of Zhisuan's presets tiny and
 * small, GPT-2 and BLOOM, at several batch sizes, sequence lengths (one at
 * the context) and vocabularies, must count exactly the predicted FLOPs
 * and calls for every operator, and nothing else. Also: the analyzer's
 * gpt-tiny / gpt-small presets match zs_gpt_preset, the breakdown's parts
 * add up and relate to the chapter's formula, and models the GPT cannot
 * run are refused.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "testutil.h"

/* The analyzer's config of Zhisuan's preset (gpt-tiny, gpt-small) with
 * vocabulary V, as the BLOOM variant when bloom. */
static zs_model_config model_config(const char *preset, bool bloom, int64_t V)
{
    char name[32], vocab[32];
    snprintf(name, sizeof name, "gpt-%s", preset);
    snprintf(vocab, sizeof vocab, "%lld", (long long)V);
    const zs_model_config *p = zs_model_preset(name);
    ZT_CHECK(p != NULL, "analyzer preset %s", name);
    zs_model_config c = p ? *p : (zs_model_config){0};
    const char *keys[] = {"vocab", "learned_pos", "embed_norm"};
    const char *vals[] = {vocab, bloom ? "false" : "true", bloom ? "true" : "false"};
    ZT_CHECK(zs_model_config_set_many(&c, 3, keys, vals) == ZS_OK, "%s",
             zs_last_error());
    return c;
}

static void print_table(const zs_engine_flops *e, const zs_op_stat *s, int n)
{
    fprintf(stderr, "  %-24s %8s %18s %8s %18s\n", "operator", "calls",
            "counted", "pred.", "predicted");
    for (int i = 0; i < n; i++) {
        const zs_engine_op *p = NULL;
        for (int j = 0; j < e->nops; j++)
            if (!strcmp(e->ops[j].name, s[i].name))
                p = &e->ops[j];
        fprintf(stderr, "  %-24s %8llu %18.0f %8lld %18.0f%s\n", s[i].name,
                (unsigned long long)s[i].calls, s[i].flops,
                p ? (long long)p->calls : 0LL, p ? p->flops : 0.0,
                (p ? p->flops == s[i].flops && p->calls == (int64_t)s[i].calls
                   : s[i].flops == 0) ? "" : "  <-- differs");
    }
}

/* Every operator of the step against the prediction: the predicted ones
 * with their calls and FLOPs, the others with 0 FLOPs. */
static bool ops_match(const zs_engine_flops *e, const zs_op_stat *s, int n)
{
    int found = 0;
    for (int i = 0; i < n; i++) {
        const zs_engine_op *p = NULL;
        for (int j = 0; j < e->nops; j++)
            if (!strcmp(e->ops[j].name, s[i].name))
                p = &e->ops[j];
        if (!p && s[i].flops != 0)
            return false;
        if (p && (p->flops != s[i].flops || p->calls != (int64_t)s[i].calls))
            return false;
        found += p != NULL;
    }
    return found == e->nops;
}

/* Runs one step and compares; returns the counted total. */
static double check(const char *preset, bool bloom, int64_t V, int64_t B,
                    int64_t T)
{
    zs_gpt_config gc = {.arch = bloom ? ZS_BLOOM : ZS_GPT2, .vocab = V};
    zs_gpt_preset(preset, &gc);
    zs_model_config mc = model_config(preset, bloom, V);
    zs_module *m = zs_gpt_new(&gc, 1);
    zs_tensor *x = zs_zeros(ZS_I64, 2, (int64_t[]){B, T});
    zs_tensor *y = zs_ones(ZS_I64, 2, (int64_t[]){B, T});
    zs_profile_reset();
    zs_profile_enable(true); /* counters run only while profiling */
    zs_tensor *l = zs_gpt_loss(m, x, y);
    zs_status st = l ? zs_backward(l, NULL, false) : ZS_ERR_ARG;
    zs_profile_enable(false);
    double counted = zs_profile_total_flops();
    zs_op_stat s[128];
    int n = zs_profile_stats(s, 128);
    zs_engine_flops e;
    double predicted = zs_analyze_engine_step_flops(&mc, B, T, &e);
    const char *arch = bloom ? "bloom" : "gpt2";
    bool ok = st == ZS_OK && counted == predicted && ops_match(&e, s, n);
    ZT_CHECK(ok, "%s %s V=%lld B=%lld T=%lld: engine counted %.0f FLOPs, "
             "analyzer predicts %.0f", preset, arch, (long long)V,
             (long long)B, (long long)T, counted, predicted);
    if (!ok)
        print_table(&e, s, n);
    else
        printf("%s %s V=%lld B=%lld T=%lld: %.0f FLOPs in %d operators "
               "(engine = analyzer)\n", preset, arch, (long long)V,
               (long long)B, (long long)T, counted, e.nops);
    zs_release(l);
    zs_release(x);
    zs_release(y);
    zs_module_free(m);
    return counted;
}

static void test_steps(void)
{
    /* tiny GPT-2, V=4096, B=2, T=16 by hand: N=32 tokens, C=64, F=256,
     * L=2, d=16, P = B*heads*T(T+1)/2 = 1088 causal pairs. */
    double tiny = check("tiny", false, 4096, 2, 16);
    double N = 32, C = 64, F = 256, V = 4096, L = 2, P = 2 * 4 * 16 * 17 / 2.0;
    double hand = 3 * (L * 2 * N * C * (4 * C + 2 * F) + 2 * N * C * V) /* GEMMs */
                + L * 3.5 * 4 * 16 * P                        /* attention */
                + L * (3 * N * C + 4 * N * C + 31 * N * F)    /* biases, res., GeLU */
                + 5 * 18 * N * C                              /* 5 norms, 8 + 10 */
                + 9 * N * V                                   /* loss fwd + bwd */
                + L * (5 * N * C + N * F + 2 * N * C)         /* sums, adds */
                + L * 38 * N * F                              /* g gelu'(h) */
                + N * C + N * C + N * C;     /* wpe add, wpe sum, embedding bw */
    ZT_CHECK(tiny == hand && tiny == 72267776.0,
             "tiny B=2 T=16: counted %.0f, by hand %.0f", tiny, hand);
    check("tiny", false, 4096, 3, 128); /* T = the context */
    check("tiny", false, 257, 1, 1);
    check("tiny", true, 4096, 2, 16);
    check("tiny", true, 100, 4, 37);
    check("small", false, 4096, 1, 32);
    check("small", true, 4096, 1, 32);
    check("small", false, 512, 2, 7);
    zt_section("per-operator FLOPs and calls of a real step == analyzer");
}

static void test_parts(void)
{
    for (int bloom = 0; bloom < 2; bloom++) {
        zs_gpt_config gc = {.arch = bloom ? ZS_BLOOM : ZS_GPT2, .vocab = 4096};
        zs_gpt_preset("small", &gc);
        zs_model_config mc = model_config("small", bloom, 4096);
        zs_param_count pc;
        zs_model_params(&mc, &pc);
        ZT_CHECK(pc.total == (double)zs_gpt_param_count(&gc) &&
                 mc.seq_len == gc.ctx,
                 "gpt-small %s: analyzer %.0f parameters, engine %lld",
                 bloom ? "bloom" : "gpt2", pc.total,
                 (long long)zs_gpt_param_count(&gc));
    }
    zs_model_config c = model_config("small", false, 4096);
    zs_engine_flops e;
    int64_t B = 4, T = 256;
    double t = zs_analyze_engine_step_flops(&c, B, T, &e);
    double N = (double)(B * T), C = 384, L = 6, V = 4096;
    double sq = 12 * N * (double)T * L * C; /* the chapter's attention */
    ZT_CHECK(t == e.total && e.fwd + e.bwd == t &&
             e.gemm + e.attention + e.elementwise == t, "parts add up");
    ZT_CHECK(e.gemm == 72 * N * L * C * C + 6 * N * C * V &&
             e.chapter == e.gemm + sq, "gemm %.0f, chapter %.0f", e.gemm,
             e.chapter);
    ZT_CHECK(e.attention == 7 * N * (double)(T + 1) * L * C,
             "causal attention %.0f", e.attention);
    ZT_CHECK(e.six_n == 6 * N * (L * (12 * C * C + 13 * C) + 2 * C + V * C +
                                 (double)T * C), "6N %.0f", e.six_n);
    double sum = 0;
    for (int i = 0; i < e.nops; i++)
        sum += e.ops[i].flops;
    ZT_CHECK(sum == t && e.nops == 14, "%d operators sum to %.0f", e.nops, sum);
    ZT_CHECK(zs_analyze_engine_step_flops(&c, 1, 8, NULL) > 0, "out NULL");
    zt_section("breakdown: gemm + attention + elementwise, chapter, 6N");
}

static void test_errors(void)
{
    zs_model_config c = model_config("tiny", false, 4096);
    ZT_EXPECT_ERROR(zs_analyze_engine_step_flops(&c, 1, 129, NULL) < 0,
                    "1 <= sequence <= 128");
    ZT_EXPECT_ERROR(zs_analyze_engine_step_flops(&c, 0, 8, NULL) < 0,
                    "batch >= 1");
    ZT_EXPECT_ERROR(zs_analyze_engine_step_flops(zs_model_preset("llama-65b"),
                                                 1, 8, NULL) < 0,
                    "Zhisuan's GPT cannot run it: its MLP is not GeLU");
    zs_model_config both = c;
    both.embed_norm = true;
    ZT_EXPECT_ERROR(zs_analyze_engine_step_flops(&both, 1, 8, NULL) < 0,
                    "neither learned positions alone");
    zs_model_config untied = c;
    untied.tied_embeddings = false;
    ZT_EXPECT_ERROR(zs_analyze_engine_step_flops(&untied, 1, 8, NULL) < 0,
                    "not tied");
    ZT_CHECK(zs_analyze_engine_step_flops(zs_model_preset("bloom-176b"), 16,
                                          2048, NULL) > 0,
             "BLOOM-176B is a model Zhisuan's GPT (BLOOM variant) describes");
    zt_section("models the GPT cannot run are refused with a reason");
}

int main(void)
{
    test_steps();
    test_parts();
    test_errors();
    return zt_done();
}
