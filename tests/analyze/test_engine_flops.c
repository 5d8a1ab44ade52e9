/*
 * test_engine_flops.c - the analyzer's prediction of one GPT training
 * step's FLOPs equals, exactly, the sum of the FLOPs the engine's
 * operators count while that step really runs (presets tiny and small,
 * GPT-2 and BLOOM, several batch and sequence sizes).
 */
#include "testutil.h"

static void check(const char *preset, zs_gpt_arch arch, int64_t V, int64_t B,
                  int64_t T)
{
    zs_gpt_config c = {.arch = arch, .vocab = V};
    zs_gpt_preset(preset, &c);
    zs_module *m = zs_gpt_new(&c, 1);
    zs_tensor *x = zs_zeros(ZS_I64, 2, (int64_t[]){B, T});
    zs_tensor *y = zs_ones(ZS_I64, 2, (int64_t[]){B, T});
    zs_profile_reset();
    zs_tensor *l = zs_gpt_loss(m, x, y);
    zs_status st = l ? zs_backward(l, NULL, false) : ZS_ERR_ARG;
    double counted = zs_profile_total_flops();
    double predicted = zs_analyze_gpt_step_flops_engine(arch == ZS_BLOOM, V, c.layers,
                                                        c.heads, c.width, B, T);
    ZT_CHECK(st == ZS_OK && counted == predicted,
             "%s %s B=%lld T=%lld: engine counted %.0f FLOPs, analyzer predicts %.0f",
             preset, arch == ZS_BLOOM ? "bloom" : "gpt2", (long long)B, (long long)T,
             counted, predicted);
    if (counted != predicted) {
        zs_op_stat s[128];
        int n = zs_profile_stats(s, 128);
        for (int i = 0; i < n; i++)
            fprintf(stderr, "  %-24s %6llu calls %16.0f FLOPs\n", s[i].name,
                    (unsigned long long)s[i].calls, s[i].flops);
    } else {
        printf("%s %s B=%lld T=%lld: %.0f FLOPs (engine = analyzer)\n", preset,
               arch == ZS_BLOOM ? "bloom" : "gpt2", (long long)B, (long long)T,
               counted);
    }
    zs_release(l);
    zs_release(x);
    zs_release(y);
    zs_module_free(m);
}

int main(void)
{
    for (int a = 0; a < 2; a++) {
        check("tiny", a, 100, 2, 16);
        check("tiny", a, 257, 3, 128);
        check("small", a, 4096, 1, 32);
        check("small", a, 512, 2, 7);
    }
    zt_section("analyzer step FLOPs == engine counted FLOPs");
    return zt_done();
}
