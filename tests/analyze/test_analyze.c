/*
 * test_analyze.c - the large-model analyzer against hand computations:
 * parameter counts from per-matrix sizes (and published totals), the
 * chapter's BLOOM-176B figures (34.8 PFLOP per batch of 16, 3525 GB of
 * fp32 AdamW state, 45 devices of 80 GB) and intensity formulas, FLOPs as
 * 2 x weight-matrix parameters x tokens, Korthikanti's activation
 * formulas, the ZeRO paper's per-device figures, ring all-reduce volumes,
 * pipeline bubbles, the device roofline, and config parsing errors.
 */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "testutil.h"

static bool close_rel(double a, double b, double tol)
{
    return fabs(a - b) <= tol * fmax(1, fmax(fabs(a), fabs(b)));
}

static const zs_model_config *preset(const char *name)
{
    const zs_model_config *c = zs_model_preset(name);
    ZT_CHECK(c != NULL, "preset %s", name);
    return c;
}

/* Parameters as a framework's state dict lists them: every weight matrix,
 * bias and norm vector of the model, summed. `matrices` receives the
 * weight-matrix parameters of one layer (what the matmuls multiply by). */
static double count_by_tensors(const zs_model_config *c, double *matrices)
{
    double h = (double)c->d_model, V = (double)c->vocab, ff = (double)c->d_ff;
    double q = (double)(c->n_head * c->d_head), kv = (double)(c->n_kv_head * c->d_head);
    double norm_vecs = c->norm == ZS_NORM_LAYER ? 2 : 1; /* weight (+ bias) */
    double layer_mats[8][2] = {{q, h}, {kv, h}, {kv, h}, {h, q}, {ff, h}, {h, ff}, {ff, h}};
    int nmats = c->mlp == ZS_MLP_SWIGLU ? 7 : 6;
    double biases[8] = {q, kv, kv, h, ff, h, ff};
    if (c->mlp == ZS_MLP_GELU) {
        layer_mats[5][0] = h;
        layer_mats[5][1] = ff;
        biases[5] = h;
    }
    double layer = 0, mats = 0;
    for (int i = 0; i < nmats; i++) {
        mats += layer_mats[i][0] * layer_mats[i][1];
        if (c->bias)
            layer += biases[i];
    }
    layer += mats + 2 * norm_vecs * h;
    double total = (double)c->n_layer * layer + V * h + norm_vecs * h;
    if (c->learned_pos)
        total += (double)c->seq_len * h;
    if (c->embed_norm)
        total += norm_vecs * h;
    if (!c->tied_embeddings)
        total += V * h;
    if (matrices)
        *matrices = mats;
    return total;
}

static void test_params(void)
{
    for (int i = 0; i < zs_model_preset_count(); i++) {
        const zs_model_config *c = zs_model_preset_at(i);
        zs_param_count pc;
        zs_model_params(c, &pc);
        double ref = count_by_tensors(c, NULL);
        ZT_CHECK(pc.total == ref, "%s: %.0f params, by tensors %.0f", c->name,
                 pc.total, ref);
    }
    /* Published totals (Hugging Face checkpoints). */
    static const struct {
        const char *name;
        double params;
    } known[] = {
        {"gpt2-small", 124439808},   {"gpt2-medium", 354823168},
        {"gpt2-large", 774030080},   {"gpt2-xl", 1557611200},
        {"bloom-176b", 176247271424.0}, {"llama-65b", 65285660672.0},
        {"llama2-70b", 68976648192.0},
    };
    for (size_t i = 0; i < sizeof known / sizeof *known; i++) {
        zs_param_count pc;
        zs_model_params(preset(known[i].name), &pc);
        ZT_CHECK(pc.total == known[i].params, "%s: %.0f, published %.0f",
                 known[i].name, pc.total, known[i].params);
    }
    zs_param_count g3;
    zs_model_params(preset("gpt3-175b"), &g3);
    ZT_CHECK(close_rel(g3.total, 175e9, 0.01), "gpt3 %.4g", g3.total);
    ZT_CHECK(zs_model_preset_at(-1) == NULL && zs_model_preset_at(99) == NULL, "at");
    ZT_EXPECT_ERROR(zs_model_preset("alexnet") == NULL, "unknown model 'alexnet'");
    ZT_CHECK(zs_model_preset("GPT2") == zs_model_preset("gpt2-small"), "alias");
    zt_section("parameters: closed form = sum over tensors = published");
}

/* The chapter: BLOOM-176B, global batch 16, micro-batch 2, s = 2048. */
static void test_bloom_chapter(void)
{
    const zs_model_config *c = preset("bloom-176b");
    double B = 16, l = 70, s = 2048, h = 14336, V = 250880;
    zs_train_flops f;
    ZT_CHECK(zs_train_flops_compute(c, 16, 2048, ZS_RECOMPUTE_NONE, &f) == ZS_OK, "flops");
    double fwd = 24 * B * l * s * h * h + 4 * B * l * s * s * h;
    double total = 72 * B * l * s * h * h + 12 * B * l * s * s * h;
    ZT_CHECK(f.fwd == fwd && f.bwd == 2 * fwd, "forward %.6g vs %.6g", f.fwd, fwd);
    ZT_CHECK(f.total == total, "total %.6g vs %.6g", f.total, total);
    /* 34.75 PFLOP: the chapter's 34.8 P is the decoder blocks alone. */
    ZT_CHECK(round(f.total / 1e14) / 10 == 34.8, "34.8 PFLOP, got %.4f P",
             f.total / 1e15);
    ZT_CHECK(round(f.total_with_logit / 1e14) / 10 == 35.5 &&
             f.total_with_logit == total + 6 * B * s * h * V,
             "with the logit layer 35.5 P, got %.4f", f.total_with_logit / 1e15);
    /* fp32 AdamW: 705 + 2115 + 705 = 3525 GB, 45 devices of 80 GB. */
    zs_param_count pc;
    zs_model_params(c, &pc);
    zs_state_bytes st;
    zs_state_bytes_full(pc.total, ZS_PREC_FP32, &st);
    ZT_CHECK(round(st.weights / 1e9) == 705 && round(st.optim / 1e9) == 2115 &&
             round(st.grads / 1e9) == 705, "705/2115/705 GB: %.1f %.1f %.1f",
             st.weights / 1e9, st.optim / 1e9, st.grads / 1e9);
    ZT_CHECK(round(st.total / 1e9) == 3525 && st.total == 20 * pc.total,
             "3525 GB, got %.2f", st.total / 1e9);
    int64_t nd = zs_min_devices(st.total, 80e9);
    ZT_CHECK(nd == 45 && nd >= 45, "45 devices of 80 GB, got %lld", (long long)nd);
    /* Per-operator intensities of the chapter's table, b = 2. */
    zs_op_cost ops[ZS_BLOCK_MAX_OPS];
    int n = zs_block_ops(c, 2, 2048, 2, ops);
    double b = 2, d = 128;
    double dense1 = 1 / (1 / h + 1 / (2 * b * s)), attn = 1 / (1 / s + 1 / (2 * d));
    double dense2 = 1 / (5 / (8 * h) + 1 / (2 * b * s));
    int seen = 0;
    double mm = 0;
    for (int i = 0; i < n; i++) {
        const zs_op_cost *o = &ops[i];
        double in = o->flops / o->elems;
        const char *nm = o->name;
        if (!strcmp(nm, "x W_Q") || !strcmp(nm, "x W_K") || !strcmp(nm, "x W_V") ||
            !strcmp(nm, "out proj")) {
            ZT_CHECK(o->flops == 2 * b * s * h * h && close_rel(in, dense1, 1e-12),
                     "%s: %g flops, intensity %g vs %g", nm, o->flops, in, dense1);
            seen++;
        } else if (!strcmp(nm, "Q K^T") || !strcmp(nm, "P V")) {
            ZT_CHECK(o->flops == 2 * b * s * s * h && close_rel(in, attn, 1e-12),
                     "%s: intensity %g vs %g", nm, in, attn);
            seen++;
        } else if (!strcmp(nm, "MLP up") || !strcmp(nm, "MLP down")) {
            ZT_CHECK(o->flops == 8 * b * s * h * h && close_rel(in, dense2, 1e-12),
                     "%s: intensity %g vs %g", nm, in, dense2);
            seen++;
        }
        ZT_CHECK(o->bytes == 2 * o->elems, "%s bytes", nm);
        if (o->matmul)
            mm += o->flops;
    }
    ZT_CHECK(seen == 8, "8 matmuls in the table, saw %d", seen);
    ZT_CHECK(mm == 24 * b * s * h * h + 4 * b * s * s * h, "block sum 24bsh^2 + 4bs^2h");
    ZT_CHECK(!strcmp(ops[4].in1, "(2, 112, 2048, 128)") &&
             !strcmp(ops[4].out, "(2, 112, 2048, 2048)"), "QK^T shapes %s -> %s",
             ops[4].in1, ops[4].out);
    zt_section("BLOOM-176B: 34.8 PFLOP / batch 16, 3525 GB, 45 x 80 GB, intensities");
}

/* FLOPs = 2 x (weight-matrix parameters) x tokens + the attention products,
 * on the GQA + SwiGLU models and odd sizes. */
static void test_flops_general(void)
{
    zs_model_config odd = {.name = "odd", .n_layer = 3, .d_model = 70, .n_head = 6,
                           .n_kv_head = 2, .d_head = 13, .d_ff = 0, .vocab = 101,
                           .seq_len = 17, .mlp = ZS_MLP_SWIGLU, .norm = ZS_NORM_RMS};
    ZT_CHECK(zs_model_config_finish(&odd) == ZS_OK && odd.d_ff == 256, "ff rule %lld",
             (long long)odd.d_ff);
    const zs_model_config *cs[] = {preset("llama2-70b"), preset("llama-65b"),
                                   preset("gpt2-small"), &odd};
    for (int k = 0; k < 4; k++) {
        const zs_model_config *c = cs[k];
        double mats;
        count_by_tensors(c, &mats);
        int64_t b = 3, s = 7 + k;
        double attn = 2 * 2 * (double)b * (double)c->n_head * (double)(s * s) *
                      (double)c->d_head;
        double ref = 2 * mats * (double)(b * s) + attn;
        ZT_CHECK(zs_block_matmul_flops(c, b, s) == ref, "%s block %g vs %g",
                 c->name, zs_block_matmul_flops(c, b, s), ref);
        zs_op_cost ops[ZS_BLOCK_MAX_OPS];
        int n = zs_block_ops(c, b, s, 4, ops);
        double sum = 0;
        for (int i = 0; i < n; i++)
            sum += ops[i].matmul ? ops[i].flops : 0;
        ZT_CHECK(n > 0 && n <= ZS_BLOCK_MAX_OPS && sum == ref, "%s ops sum", c->name);
        zs_train_flops f;
        zs_train_flops_compute(c, b, s, ZS_RECOMPUTE_FULL, &f);
        double lf = (double)c->n_layer * ref, logit = 2 * (double)(b * s) *
                    (double)c->d_model * (double)c->vocab;
        ZT_CHECK(f.step == 4 * lf + 3 * logit, "%s full recompute = 4 fwd + 3 logit",
                 c->name);
        zs_train_flops_compute(c, b, s, ZS_RECOMPUTE_SELECTIVE, &f);
        ZT_CHECK(f.step == 3 * (lf + logit) + (double)c->n_layer * attn,
                 "%s selective adds QK^T and PV once", c->name);
        ZT_CHECK(f.per_token == f.step / (double)(b * s), "per token");
        ZT_CHECK(zs_analyze_step_flops(c, b, s) == 3 * (lf + logit), "step flops");
    }
    /* GPT-2 small, B=4, s=64: the engine cross-check's prediction. */
    double B = 4, s = 64, h = 768, l = 12, V = 50257;
    ZT_CHECK(zs_analyze_step_flops(preset("gpt2-small"), 4, 64) ==
             3 * (l * (24 * B * s * h * h + 4 * B * s * s * h) + 2 * B * s * h * V),
             "gpt2-small step");
    zs_op_cost ops[ZS_BLOCK_MAX_OPS];
    ZT_EXPECT_ERROR(zs_block_ops(&odd, 0, 5, 2, ops) < 0, "need b, s");
    zs_train_flops f;
    ZT_EXPECT_ERROR(zs_train_flops_compute(&odd, 1, -1, 0, &f) != ZS_OK, "batch and s");
    ZT_CHECK(zs_analyze_step_flops(&odd, 0, 3) < 0, "bad batch");
    zt_section("FLOPs = 2 x matrix params x tokens + attention; recompute variants");
}

static void test_memory(void)
{
    /* Korthikanti et al.: 34sbh + 5as^2b, selective 34sbh, full 2sbh; with
     * t-way TP sbh(10 + 24/t) + 5as^2b/t. */
    const zs_model_config *g = preset("gpt3-175b");
    double s = 2048, b = 1, h = 12288, a = 96;
    for (int t = 1; t <= 8; t *= 2) {
        double none = s * b * h * (10 + 24.0 / t) + 5 * a * s * s * b / t;
        double sel = s * b * h * (10 + 24.0 / t);
        ZT_CHECK(close_rel(zs_activation_bytes_layer(g, 1, 2048, t, ZS_RECOMPUTE_NONE),
                           none, 1e-12), "none t=%d", t);
        ZT_CHECK(close_rel(zs_activation_bytes_layer(g, 1, 2048, t, ZS_RECOMPUTE_SELECTIVE),
                           sel, 1e-12), "selective t=%d", t);
        ZT_CHECK(zs_activation_bytes_layer(g, 1, 2048, t, ZS_RECOMPUTE_FULL) ==
                 2 * s * b * h, "full t=%d", t);
    }
    ZT_CHECK(zs_activation_bytes_layer(g, 1, 2048, 1, 0) == 34 * s * h + 5 * a * s * s,
             "34sbh + 5as^2b");
    /* Llama-2-70B (GQA 8/64, SwiGLU 28672), hand count of saved tensors. */
    const zs_model_config *L = preset("llama2-70b");
    double hh = 8192, kvd = 1024, ff = 28672, S = 4096, A = 64;
    double hand = S * (4 * hh + 2 * hh + 2 * hh + 2 * hh + 2 * hh + 4 * kvd +
                       2 * hh + 6 * ff) + 5 * A * S * S;
    ZT_CHECK(zs_activation_bytes_layer(L, 1, 4096, 1, 0) == hand, "llama2 act");

    /* ZeRO paper, Fig. 1: Psi = 7.5B, Nd = 64, K = 12, mixed precision:
     * 120 GB, 31.4 GB, 16.6 GB, 1.9 GB per device. */
    zs_model_config z = {.n_layer = 1, .d_model = 1, .n_head = 1, .vocab = 1, .seq_len = 1};
    zs_model_config_finish(&z);
    zs_parallel p = {.batch = 64, .micro_batch = 1, .seq = 1, .dp = 64, .tp = 1,
                     .pp = 1, .precision = ZS_PREC_MIXED};
    zs_memory_report m;
    const double psi = 7.5e9, expect[4] = {120, 31.4, 16.6, 1.9};
    for (int stage = 0; stage < 4; stage++) {
        p.zero = stage;
        ZT_CHECK(zs_memory_analyze(&z, &p, &m) == ZS_OK, "analyze");
        double scale = psi / m.mixed.total * 16; /* the model has few params */
        double per = m.device.total * scale / 1e9;
        ZT_CHECK(fabs(per - expect[stage]) < 0.06, "ZeRO-%d: %.2f GB, paper %.1f",
                 stage, per, expect[stage]);
    }
    /* Offload at stage 2: optimizer and gradients on the host. */
    p.zero = 2;
    p.offload = true;
    zs_memory_analyze(&z, &p, &m);
    ZT_CHECK(m.device.optim == 0 && m.device.grads == 0 && m.host.total > 0 &&
             m.device.weights == m.mixed.weights, "offload stage 2");
    /* Activations per device: 1F1B holds min(p, m) micro-batches. */
    const zs_model_config *bl = preset("bloom-176b");
    zs_parallel q = {.batch = 2048, .micro_batch = 2, .seq = 2048, .dp = 8, .tp = 4,
                     .pp = 12, .zero = 1, .recompute = ZS_RECOMPUTE_SELECTIVE};
    ZT_CHECK(zs_memory_analyze(bl, &q, &m) == ZS_OK, "bloom layout");
    ZT_CHECK(m.layers_per_stage == 6 && m.micro_batches_in_flight == 12 &&
             m.act_device == 6 * 12 * m.act_layer[1], "in flight");
    ZT_CHECK(zs_min_devices(160e9, 80e9) == 2 && zs_min_devices(160.1e9, 80e9) == 3,
             "min devices exact multiple");
    ZT_EXPECT_ERROR(zs_min_devices(1, 0) < 0, "device memory must be > 0");
    q.batch = 100;
    ZT_EXPECT_ERROR(zs_memory_analyze(bl, &q, &m) != ZS_OK, "not a multiple");
    q.batch = 2048;
    q.tp = 3;
    ZT_EXPECT_ERROR(zs_parallel_check(bl, &q) != ZS_OK, "do not split over tp 3");
    q.tp = 1;
    q.zero = 0;
    q.offload = true;
    ZT_EXPECT_ERROR(zs_parallel_check(bl, &q) != ZS_OK, "--offload needs ZeRO");
    q.offload = false;
    q.pp = 71;
    ZT_EXPECT_ERROR(zs_parallel_check(bl, &q) != ZS_OK, "cannot fill 71");
    zt_section("memory: Korthikanti activations, ZeRO paper figures, offload, devices");
}

static void test_comm(void)
{
    ZT_CHECK(zs_ring_allreduce_bytes(1000, 4) == 1500 && zs_ring_allreduce_bytes(1000, 1) == 0,
             "ring 2(N-1)/N");
    ZT_CHECK(zs_ring_allgather_bytes(1000, 4) == 750, "all-gather (N-1)/N");
    ZT_CHECK(zs_pipeline_bubble(4, 8) == 3.0 / 11 && zs_pipeline_bubble(1, 5) == 0,
             "bubble (p-1)/(m+p-1)");
    ZT_CHECK(zs_pipeline_bubble(0, 1) < 0, "bad bubble");
    const zs_model_config *c = preset("gpt2-medium");
    zs_param_count pc;
    zs_model_params(c, &pc);
    zs_parallel p = {.batch = 64, .micro_batch = 2, .seq = 1024, .dp = 4, .tp = 2,
                     .pp = 3, .zero = 3, .precision = ZS_PREC_MIXED};
    zs_comm_report r;
    ZT_CHECK(zs_comm_analyze(c, &p, &r) == ZS_OK, "comm");
    double grad = pc.total / 6 * 2, act = 2.0 * 1024 * 1024 * 2;
    int64_t m = 64 / (2 * 4);
    ZT_CHECK(r.micro_batches == m && close_rel(r.dp_allreduce, 2 * 3.0 / 4 * grad, 1e-12),
             "dp all-reduce");
    ZT_CHECK(close_rel(r.dp_allreduce + r.zero3_gather, 1.5 * r.dp_allreduce, 1e-12),
             "ZeRO-3 = 1.5 x all-reduce");
    ZT_CHECK(close_rel(r.tp_layer, 4 * (2 * 1.0 / 2) * act, 1e-12), "tp per layer");
    ZT_CHECK(close_rel(r.tp_step, r.tp_layer * 8 * (double)m, 1e-12), "tp per step");
    ZT_CHECK(r.pp_p2p == 2 * (double)m * act, "pp p2p");
    ZT_CHECK(r.bubble_1f1b == 2.0 / (8 + 2) && r.bubble_gpipe == r.bubble_1f1b, "bubbles");
    p.recompute = ZS_RECOMPUTE_FULL;
    zs_comm_analyze(c, &p, &r);
    ZT_CHECK(close_rel(r.tp_step, 1.5 * r.tp_layer * 8 * (double)m, 1e-12),
             "full recompute repeats forward all-reduces");
    zt_section("communication: ring volumes, ZeRO-3, TP, PP, bubbles");
}

static void test_devices(void)
{
    zs_hw_spec d;
    ZT_CHECK(zs_hw_lookup("A100", &d) == ZS_OK && !strcmp(d.name, "a100-80gb") &&
             d.tflops16 == 312 && d.bw_gbs == 2039 && d.mem_gb == 80, "a100");
    ZT_CHECK(close_rel(zs_hw_ridge(&d, ZS_PREC_MIXED), 312e12 / 2039e9, 1e-15) &&
             close_rel(zs_hw_ridge(&d, ZS_PREC_FP32), 19.5e12 / 2039e9, 1e-15),
             "ridge");
    ZT_CHECK(zs_roofline_seconds(&d, ZS_PREC_MIXED, 312e12, 1) == 1 &&
             close_rel(zs_roofline_seconds(&d, ZS_PREC_MIXED, 1, 2039e9), 1, 1e-15),
             "roofline max(compute, memory)");
    ZT_CHECK(close_rel(zs_step_seconds(&d, ZS_PREC_MIXED, 34.75e15, 8, 0.5),
                       34.75e15 / (8 * 312e12 * 0.5), 1e-15), "step time");
    ZT_CHECK(zs_step_seconds(&d, ZS_PREC_MIXED, 1, 0, 0.5) < 0, "no devices");
    const char *names[] = {"v100", "h100", "h200"};
    const double tf[] = {125, 989, 989}, bw[] = {900, 3350, 4800};
    for (int i = 0; i < 3; i++)
        ZT_CHECK(zs_hw_lookup(names[i], &d) == ZS_OK && d.tflops16 == tf[i] &&
                 d.bw_gbs == bw[i], "%s", names[i]);
    ZT_CHECK(zs_hw_lookup("v100", &d) == ZS_OK && d.tflops32 == 15.7, "v100 fp32");
    ZT_CHECK(zs_hw_lookup("cpu", &d) == ZS_OK && d.measured && d.tflops32 > 0 &&
             d.bw_gbs > 0 && d.mem_gb > 0, "cpu measured: %.3f TF/s %.1f GB/s",
             d.tflops32, d.bw_gbs);
    ZT_EXPECT_ERROR(zs_hw_lookup("tpu", &d) != ZS_OK, "unknown device 'tpu'");
    /* BLOOM on an A100: the projections are compute-bound, QK^T memory-bound
     * (227.6 FLOP/elem = 113.8 FLOP/B < 153). */
    zs_hw_lookup("a100", &d);
    zs_op_cost ops[ZS_BLOCK_MAX_OPS];
    int n = zs_block_ops(preset("bloom-176b"), 2, 2048, 2, ops);
    double ridge = zs_hw_ridge(&d, ZS_PREC_MIXED);
    for (int i = 0; i < n; i++) {
        bool compute = ops[i].flops / ops[i].bytes >= ridge;
        bool dense = ops[i].matmul && strcmp(ops[i].name, "Q K^T") && strcmp(ops[i].name, "P V");
        ZT_CHECK(compute == dense, "%s bound", ops[i].name);
    }
    zt_section("devices: table, ridge points, roofline, measured cpu");
}

static void test_config(void)
{
    zs_model_config c;
    const char *ok = "{\"base\": \"gpt2-small\", \"n_layer\": 6,\n \"d-model\": 512, "
                     "\"n_head\": 8, \"mlp\": \"swiglu\", \"bias\": false, \"name\": \"mini\"}";
    ZT_CHECK(zs_model_config_parse_json(ok, &c) == ZS_OK && c.n_layer == 6 &&
             c.d_model == 512 && c.d_head == 64 && c.vocab == 50257 && !c.bias &&
             c.mlp == ZS_MLP_SWIGLU && !strcmp(c.name, "mini"), "json with base");
    /* d_ff re-derived for SwiGLU from the new d_model: 256*ceil(8*512/3/256). */
    ZT_CHECK(c.d_ff == 1536 && c.n_kv_head == 8, "re-derived d_ff %lld",
             (long long)c.d_ff);
    const char *keep = "{\"base\": \"llama2-70b\", \"n_layer\": 4}";
    ZT_CHECK(zs_model_config_parse_json(keep, &c) == ZS_OK && c.d_ff == 28672 &&
             c.n_kv_head == 8, "unchanged sizes keep the base's derived fields");
    const char *syms = "{\"l\": 2, \"h\": 64, \"n\": 4, \"V\": 100, \"s\": 32}";
    ZT_CHECK(zs_model_config_parse_json(syms, &c) == ZS_OK && c.d_ff == 256 &&
             c.n_kv_head == 4 && c.d_head == 16 && !strcmp(c.name, "custom"), "symbols");
    struct {
        const char *text, *needle;
    } bad[] = {
        {"{\"n_layer\": 2,\n  \"d_model\": }", "line 2, column 14"},
        {"{\"n_layer\": 2} trailing", "malformed JSON"},
        {"", "malformed JSON"},
        {"[1, 2]", "must be a JSON object"},
        {"{\"layers\": 2}", "unknown config key 'layers'"},
        {"{\"n_layer\": 1.5}", "'n_layer' must be a positive integer"},
        {"{\"n_layer\": -3}", "positive integer"},
        {"{\"n_layer\": 1e300}", "positive integer"},
        {"{\"n_layer\": \"2\"}", "'n_layer' must be a number"},
        {"{\"bias\": 1}", "'bias' must be true or false"},
        {"{\"mlp\": \"relu\"}", "mlp must be gelu or swiglu"},
        {"{\"n_layer\": {\"x\": 1}}", "nested values"},
        {"{\"base\": \"gpt5\"}", "unknown model 'gpt5'"},
        {"{\"n_layer\": 2, \"d_model\": 64, \"n_head\": 4, \"vocab\": 10}", "lacks seq_len"},
        {"{\"n_layer\": 2, \"d_model\": 65, \"n_head\": 4, \"vocab\": 10, \"seq_len\": 8}",
         "not a multiple of n_head"},
        {"{\"base\": \"gpt2\", \"n_kv_head\": 5}", "not a multiple of n_kv_head"},
        /* fuzzer finding (issue 17): each value within 2^40, the product
         * overflowed in the FLOP counts */
        {"{\"n_head\":1099511627776,\"d_head\":1099511627776,\"n_layer\":1,"
         "\"d_model\":1,\"vocab\":1,\"seq_len\":1}", "wider than 2^40"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        ZT_EXPECT_ERROR(zs_model_config_parse_json(bad[i].text, &c) != ZS_OK,
                        bad[i].needle);
    ZT_CHECK(zs_model_config_load_json("/nonexistent/x.json", &c) == ZS_ERR_IO, "io");
    ZT_EXPECT_ERROR(true, "cannot open config '/nonexistent/x.json'");
    char path[] = "/tmp/zs_analyze_XXXXXX";
    int fd = mkstemp(path);
    ZT_CHECK(fd >= 0, "mkstemp");
    if (fd >= 0) {
        FILE *f = fdopen(fd, "w");
        fputs("{\"base\": \"llama-65b\",\n\"n_layer\": 8,\n}", f);
        fclose(f);
        ZT_CHECK(zs_model_config_load_json(path, &c) == ZS_ERR_FORMAT, "format");
        ZT_EXPECT_ERROR(true, "malformed JSON at line 3");
        f = fopen(path, "w");
        fputs("{\"base\": \"llama-65b\", \"n_layer\": 8}", f);
        fclose(f);
        ZT_CHECK(zs_model_config_load_json(path, &c) == ZS_OK && c.n_layer == 8 &&
                 c.d_ff == 22016 && c.norm == ZS_NORM_RMS, "file");
        unlink(path);
    }
    zs_model_config s = *preset("gpt2-small");
    ZT_CHECK(zs_model_config_set(&s, "n-layer", "4") == ZS_OK && s.n_layer == 4 &&
             zs_model_config_set(&s, "norm", "rmsnorm") == ZS_OK && s.norm == ZS_NORM_RMS &&
             zs_model_config_set(&s, "tied_embeddings", "false") == ZS_OK &&
             !s.tied_embeddings, "set");
    const char *keys[] = {"d_model", "n_head"}, *vals[] = {"1024", "16"};
    ZT_CHECK(zs_model_config_set_many(&s, 2, keys, vals) == ZS_OK && s.d_head == 64 &&
             s.d_ff == 4096 && s.n_kv_head == 16, "set_many re-derives");
    ZT_EXPECT_ERROR(zs_model_config_set(&s, "n_layer", "4x") != ZS_OK, "got '4x'");
    ZT_EXPECT_ERROR(zs_model_config_set(&s, "frob", "1") != ZS_OK, "unknown config key 'frob'");
    ZT_EXPECT_ERROR(zs_model_config_set(&s, "bias", "maybe") != ZS_OK, "true or false");
    zt_section("configs: JSON, flags, defaults, errors with line and column");
}

int main(void)
{
    test_params();
    test_bloom_chapter();
    test_flops_general();
    test_memory();
    test_comm();
    test_devices();
    test_config();
    return zt_done();
}
