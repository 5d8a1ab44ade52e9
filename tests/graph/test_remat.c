/*
 * test_remat.c - the rematerialization pass (src/graph/remat.c,
 * zs_graph_remat) and the GeLU it recomputes with
 * (zsk_sgemm_gelu_of_pre).
 *
 * - zsk_sgemm_gelu_of_pre over linear_gelu's saved pre-activation equals
 *   linear_gelu's output bit for bit (odd shapes, with and without bias;
 *   under ZS_CPU_ISA caps the other GEMM descriptors' epilogues);
 * - GPT tiny: a captured forward + backward with the pass recomputes the
 *   layer norms, the attention copies and the GeLUs (4 per layer; under
 *   bf16 autocast the GeLU from its bf16 pre-activation too), its
 *   planned arena is smaller than the same step's without the pass, and
 *   both replay to the eager loss and gradients bit for bit;
 * - small graphs: layer_norm's output read early and late is recomputed
 *   (same bits as eager); not when its input is written in between, nor
 *   when its readers are close together;
 * - errors: a graph being captured, a planned graph.
 */
#include <string.h>

#include "graph/internal.h"
#include "kernels/cpu/gemm.h"
#include "testutil.h"

static bool same_bits(const zs_tensor *a, const zs_tensor *b)
{
    return a && b && zs_nbytes(a) == zs_nbytes(b) &&
           !memcmp(zs_data(a), zs_data(b), zs_nbytes(a));
}

static int count_label(const zs_graph *g, const char *label)
{
    int k = 0;
    for (int i = 0; i < g->n; i++)
        k += g->nodes[i]->label && !strcmp(g->nodes[i]->label, label);
    return k;
}

/* ---- the GeLU of the epilogue ------------------------------------------------ */

static void test_gelu_of_pre(void)
{
    int64_t shapes[][3] = {{1, 5, 3}, {7, 33, 19}, {65, 130, 47}, {300, 97, 64}};
    bool same = true;
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        for (int bias = 0; bias < 2; bias++) {
            int64_t M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
            zs_scope_push();
            zs_tensor *x = zt_rand(ZS_F32, 2, (int64_t[]){M, K}, 10 + s);
            zs_tensor *w = zt_rand(ZS_F32, 2, (int64_t[]){N, K}, 20 + s);
            zs_tensor *b = bias ? zt_rand(ZS_F32, 1, &N, 30 + s) : NULL;
            zs_set_requires_grad(x, true); /* the node keeps the pre-activation */
            zs_graph *g = zs_graph_capture_begin();
            zs_tensor *y = zs_linear_gelu(x, w, b);
            ZT_CHECK(zs_graph_capture_end(g) == ZS_OK && y && g->n == 1 && g->nodes[0]->aux[0],
                     "linear_gelu captured with its pre-activation");
            zs_tensor *h = g->nodes[0]->aux[0], *r = zs_zeros(ZS_F32, 2, (int64_t[]){M, N});
            zsk_sgemm_gelu_of_pre(zs_data(h), zs_data(r), M * N);
            same = same && same_bits(y, r);
            zs_graph_free(g);
            zs_scope_pop();
        }
    }
    ZT_CHECK(same, "GeLU of the saved pre-activation == linear_gelu's output, bits "
             "(GEMM %s)", zsk_gemm_isa_name());
    zt_section("zsk_sgemm_gelu_of_pre");
}

/* ---- GPT tiny ------------------------------------------------------------------ */

static const zs_gpt_config GPT2 = {ZS_GPT2, 61, 32, 2, 2, 32};

typedef struct step {
    zs_graph *g;
    zs_tensor *loss; /* an untracked alias of the captured loss */
} step;

static void zero_grads(int n, zs_tensor **ps)
{
    for (int i = 0; i < n; i++)
        zs_fill_(ps[i]->grad, 0.0);
}

/* Captures forward + backward on (x, y), then dce, fusion, [remat], plan. */
static step capture(zs_module *m, zs_tensor *x, zs_tensor *y, int np, zs_tensor **ps,
                    bool remat, int *nremat)
{
    step s = {0};
    zero_grads(np, ps);
    zs_scope_push();
    s.g = zs_graph_capture_begin();
    zs_tensor *l = zs_gpt_loss(m, x, y);
    zs_status st = l ? zs_backward(l, NULL, false) : ZS_ERR_STATE;
    ZT_CHECK(zs_graph_capture_end(s.g) == ZS_OK && st == ZS_OK, "capture: %s",
             zs_last_error());
    zsi_tracking_pause();
    s.loss = zsi_new_view(l, l->ndim, l->shape, l->strides, l->offset);
    zsi_tracking_resume();
    zs_scope_pop();
    ZT_CHECK(zs_graph_dce(s.g, 1, &s.loss) >= 0 && zs_graph_fuse(s.g, 1, &s.loss) >= 0,
             "dce and fusion: %s", zs_last_error());
    *nremat = remat ? zs_graph_remat(s.g, 1, &s.loss) : 0;
    ZT_CHECK(*nremat >= 0, "remat: %s", zs_last_error());
    ZT_CHECK(zs_graph_plan_memory(s.g, 1, &s.loss) == ZS_OK &&
             zs_graph_plan_verify(s.g) == ZS_OK, "plan: %s", zs_last_error());
    return s;
}

/* Replays s on zeroed gradients; the loss and a copy of every gradient. */
static double replay(step *s, int np, zs_tensor **ps, zs_tensor **grads)
{
    zero_grads(np, ps);
    ZT_CHECK(zs_graph_replay(s->g) == ZS_OK, "replay: %s", zs_last_error());
    for (int i = 0; i < np; i++)
        grads[i] = zs_clone(ps[i]->grad);
    return zs_item(s->loss);
}

/* bf16: under autocast (the linears' outputs and pre-activations bf16),
 * where the GeLU is recomputed by the 16-bit epilogue from the rounded
 * pre-activation (gemm.h) */
static void test_gpt(bool bf16)
{
    if (bf16)
        zs_autocast_push(ZS_BF16);
    zs_scope_push();
    zs_manual_seed(5);
    zs_module *m = zs_gpt_new(&GPT2, 3);
    int64_t ids[2 * 17];
    for (int i = 0; i < 2 * 17; i++)
        ids[i] = (i * 7 + 3) % 61;
    zs_tensor *all = zs_from_data(ZS_I64, 2, (int64_t[]){2, 17}, ids);
    zs_tensor *x = zs_contiguous(zs_narrow(all, 1, 0, 16));
    zs_tensor *y = zs_contiguous(zs_narrow(all, 1, 1, 16));
    zs_tensor **ps = NULL;
    char **names = NULL;
    int np = zs_module_parameters(m, &ps, &names);
    /* eager: the reference, and every .grad made before the captures */
    zs_tensor *le = zs_gpt_loss(m, x, y);
    ZT_CHECK(le && zs_backward(le, NULL, false) == ZS_OK, "eager step");
    double loss_e = zs_item(le);
    zs_tensor *ge[64] = {0}, *g0[64] = {0}, *g1[64] = {0};
    ZT_CHECK(np <= 64, "%d parameters", np);
    for (int i = 0; i < np; i++)
        ge[i] = zs_clone(ps[i]->grad);
    int r0 = 0, r1 = 0;
    step s0 = capture(m, x, y, np, ps, false, &r0);
    step s1 = capture(m, x, y, np, ps, true, &r1);
    int L = (int)GPT2.layers;
    ZT_CHECK(!bf16 || (count_label(s1.g, "remat:gelu") == L && r1 >= 2 * L),
             "GPT tiny bf16: the GeLU of every layer recomputed (%d nodes added, %d "
             "gelu)", r1, count_label(s1.g, "remat:gelu"));
    ZT_CHECK(bf16 || (count_label(s1.g, "remat:layer_norm") == 2 * L &&
             count_label(s1.g, "remat:gelu") == L && count_label(s1.g, "remat:copy") == L &&
             r1 == 4 * L), "GPT tiny: 2 layer norms, a GeLU and the attention copy per layer "
             "recomputed (%d nodes added: %d ln, %d gelu, %d copy)", r1,
             count_label(s1.g, "remat:layer_norm"), count_label(s1.g, "remat:gelu"),
             count_label(s1.g, "remat:copy"));
    zs_graph_stats a, b;
    zs_graph_get_stats(s0.g, &a);
    zs_graph_get_stats(s1.g, &b);
    ZT_CHECK(b.planned_bytes < a.planned_bytes, "the arena shrinks with the pass (%zu -> "
             "%zu bytes)", a.planned_bytes, b.planned_bytes);
    printf("GPT tiny step: arena %.1f KiB without rematerialization, %.1f KiB with "
           "(%.3fx; %d values recomputed)\n", (double)a.planned_bytes / 1024,
           (double)b.planned_bytes / 1024,
           (double)b.planned_bytes / (double)a.planned_bytes, r1);
    double l0 = replay(&s0, np, ps, g0), l1 = replay(&s1, np, ps, g1);
    bool same = l0 == loss_e && l1 == loss_e;
    for (int i = 0; i < np; i++)
        same = same && same_bits(ge[i], g0[i]) && same_bits(ge[i], g1[i]);
    ZT_CHECK(same, "replays with and without the pass == eager (loss %.9g %.9g %.9g, "
             "every gradient's bits)", loss_e, l0, l1);
    zs_graph_free(s0.g);
    zs_graph_free(s1.g);
    zs_release(s0.loss);
    zs_release(s1.loss);
    for (int i = 0; i < np; i++) {
        zs_release(ge[i]);
        zs_release(g0[i]);
        zs_release(g1[i]);
    }
    zs_names_free(np, ps, names);
    zs_module_free(m);
    zs_scope_pop();
    if (bf16)
        zs_autocast_pop();
    zt_section(bf16 ? "GPT tiny bf16: recomputed values (the GeLU too), a smaller arena, "
                      "the same bits"
                    : "GPT tiny: recomputed values, a smaller arena, the same bits");
}

/* ---- small graphs -------------------------------------------------------------- */

/* y = layer_norm(x); a = y * 2; `filler` tanh nodes on a; [x += 1 in
 * place]; out = y + a_last. Returns the graph (dce'd, remat'd, planned),
 * *added the nodes the pass added, *out the result (an alias). */
static zs_graph *ln_graph(zs_tensor *x, zs_tensor *w, zs_tensor *b, int filler,
                          bool write_x, int *added, zs_tensor **out)
{
    zs_graph *g = zs_graph_capture_begin();
    zs_tensor *y = zs_layer_norm(x, w, b, 1e-5);
    zs_tensor *a = zs_mul_scalar(y, 2.0);
    for (int i = 0; i < filler; i++)
        a = zs_tanh(a);
    if (write_x)
        zs_scale_(x, 1.5);
    zs_tensor *o = zs_add(y, a);
    ZT_CHECK(zs_graph_capture_end(g) == ZS_OK, "capture: %s", zs_last_error());
    zsi_tracking_pause();
    *out = zsi_new_view(o, o->ndim, o->shape, o->strides, o->offset);
    zsi_tracking_resume();
    *added = zs_graph_remat(g, 1, out);
    ZT_CHECK(*added >= 0, "remat: %s", zs_last_error());
    ZT_CHECK(zs_graph_plan_memory(g, 1, out) == ZS_OK, "plan: %s", zs_last_error());
    return g;
}

static void test_small(void)
{
    zs_scope_push();
    int64_t sh[2] = {9, 37}, C = 37;
    zs_tensor *x = zt_rand(ZS_F32, 2, sh, 1), *w = zt_rand(ZS_F32, 1, &C, 2);
    zs_tensor *b = zt_rand(ZS_F32, 1, &C, 3), *out = NULL;
    zs_set_requires_grad(w, true); /* layer_norm records (as in training) */
    int added = 0;
    zs_graph *g = ln_graph(x, w, b, 10, false, &added, &out);
    ZT_CHECK(added == 1 && count_label(g, "remat:layer_norm") == 1,
             "layer_norm read before and 11 nodes after: recomputed (%d added)", added);
    zs_tensor *x2 = zt_rand(ZS_F32, 2, sh, 4);
    zs_copy_(x, x2);
    ZT_CHECK(zs_graph_replay(g) == ZS_OK, "replay: %s", zs_last_error());
    zs_tensor *y = zs_layer_norm(x2, w, b, 1e-5), *a = zs_mul_scalar(y, 2.0);
    for (int i = 0; i < 10; i++)
        a = zs_tanh(a);
    ZT_CHECK(same_bits(out, zs_add(y, a)), "the replay with the recomputation == eager");
    zs_graph_free(g);
    zs_release(out);

    g = ln_graph(x, w, b, 10, true, &added, &out);
    ZT_CHECK(added == 0, "x written between the reads: not recomputed (%d added)", added);
    zs_graph_free(g);
    zs_release(out);
    g = ln_graph(x, w, b, 2, false, &added, &out);
    ZT_CHECK(added == 0, "readers 3 nodes apart: not recomputed (%d added)", added);
    /* errors */
    ZT_EXPECT_ERROR(zs_graph_remat(g, 1, &out) < 0, "graph remat: the memory is already "
                    "planned");
    zs_graph_free(g);
    zs_release(out);
    zs_graph *c = zs_graph_capture_begin();
    ZT_EXPECT_ERROR(zs_graph_remat(c, 0, NULL) < 0, "still being captured");
    zs_graph_capture_end(c);
    zs_graph_free(c);
    ZT_EXPECT_ERROR(zs_graph_remat(NULL, 0, NULL) < 0, "no graph");
    zs_scope_pop();
    zt_section("small graphs: when a value is recomputed; errors");
}

int main(void)
{
    test_gelu_of_pre();
    test_gpt(false);
    test_gpt(true);
    test_small();
    return zt_done();
}
