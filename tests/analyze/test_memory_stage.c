/*
 * test_memory_stage.c - zs_memory_analyze_stage (src/analyze/memory.c):
 * one rank of a pipeline stage, each term against its formula written out
 * here for GPT small (6 blocks, width 384, 6 heads, vocabulary 4096) with
 * the bench's like-for-like options (f32 activations, fused attention, no
 * dropout, AdamW's m and v), f32 model state and its ZeRO-1 split.
 *
 * Checked (relative 1e-12): the state (4 + 4 + 8/dp bytes a parameter
 * under ZeRO-1); a middle stage's in-flight count (1F1B: min(pp - s, m);
 * GPipe: m), its layers x n x per-layer activations plus n stage outputs
 * e sb h, and its working set e sb (h + ff/t) + the GEMM's packed weight
 * block + (1F1B) one pending input gradient e sb h; the last stage's head
 * n e sb (2h + V/t), no outputs term, and a working set of at least the
 * logits' gradient e sb V/t and the logits GEMM's packed table; the first stage has no pending gradient; the
 * total adds them; a bad stage is refused with a message.
 */
#include "testutil.h"

static zs_model_config small(void)
{
    zs_model_config c = {"small", 6, 384, 6, 6, 64, 1536, 4096, 1024,
                         ZS_MLP_GELU, ZS_NORM_LAYER, true, true, true, false};
    return c;
}

static bool near(double a, double b) { return fabs(a - b) <= 1e-12 * fmax(1, fabs(b)); }

static void check(int tp, int pp, int dp, int zero, int m, bool gpipe, int stage,
                  int layers)
{
    zs_model_config c = small();
    int64_t B = 32, b = B / (dp * m), s = 64;
    zs_parallel p = {B, b, s, dp, tp, pp, zero, false, ZS_RECOMPUTE_NONE, ZS_PREC_FP32,
                     4, true, true, 8, gpipe};
    zs_stage_memory sm;
    zs_status st = zs_memory_analyze_stage(&c, &p, stage, layers, &sm);
    ZT_CHECK(st == ZS_OK, "analyze stage %d", stage);
    if (st != ZS_OK)
        return;
    double e = 4, sb = (double)(b * s), h = 384, ff = 1536.0 / tp, vt = 4096.0 / tp;
    bool first = stage == 0, last = stage == pp - 1;
    int64_t n = gpipe ? m : (m < pp - stage ? m : pp - stage);
    double state = sm.params * (4 + 4 + 8.0 / (zero ? dp : 1));
    double bnd = last ? 0 : (double)n * e * sb * h;
    double head = last ? (double)n * e * sb * (2 * h + vt) : 0;
    double work = e * sb * (h + ff) + 4 * fmin(h, 1024) * fmin(ff, 2048);
    if (last)
        work = fmax(work, fmax(e * sb * vt, 4 * fmin(h, 1024) * fmin(vt, 2048)));
    if (!gpipe && !first && m > 1)
        work += e * sb * h;
    double act = (double)layers * (double)n * sm.act_layer + bnd + head;
    ZT_CHECK(sm.in_flight == n && near(sm.state.total, state) && near(sm.boundary, bnd) &&
             near(sm.act_head, head) && near(sm.work, work) && near(sm.act, act) &&
             near(sm.total, state + act + work),
             "tp %d pp %d dp %d z%d m %d %s stage %d: in flight %lld (%lld), state %.0f "
             "(%.0f), outputs %.0f (%.0f), head %.0f (%.0f), work %.0f (%.0f), total %.0f "
             "(%.0f)", tp, pp, dp, zero, m, gpipe ? "gpipe" : "1f1b", stage,
             (long long)sm.in_flight, (long long)n, sm.state.total, state, sm.boundary,
             bnd, sm.act_head, head, sm.work, work, sm.total, state + act + work);
}

int main(void)
{
    check(1, 4, 1, 0, 8, false, 0, 2); /* first: no pending gradient */
    check(1, 4, 1, 0, 8, false, 1, 2);
    check(1, 4, 1, 0, 8, false, 3, 1); /* last: the head */
    check(1, 4, 2, 0, 4, true, 1, 2);
    check(1, 4, 2, 0, 4, true, 3, 1);
    check(2, 2, 2, 1, 8, false, 0, 3); /* ZeRO-1 over dp 2 */
    check(2, 2, 2, 1, 8, false, 1, 3);
    zt_section("per-stage memory terms");
    zs_model_config c = small();
    zs_parallel p = {32, 4, 64, 1, 1, 4, 0, false, ZS_RECOMPUTE_NONE, ZS_PREC_FP32,
                     4, true, true, 8, false};
    zs_stage_memory sm;
    ZT_EXPECT_ERROR(zs_memory_analyze_stage(&c, &p, 4, 1, &sm) != ZS_OK, "stage 4 of 4");
    zt_section("per-stage memory errors");
    return zt_done();
}
