/*
 * analyze.c - `zs analyze`: compute, memory, communication and roofline of
 * training a large model, from a preset, a JSON config or flags, printed
 * as tables (or one JSON object with --json). The formulas live in
 * src/analyze/ (see include/zs/analyze.h); this file parses flags and
 * prints. Bad usage: one message on stderr, exit status 2.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "apps/zs/commands.h"
#include "apps/zs/flags.h"
#include "zs/zs.h"

typedef struct opts {
    zs_model_config cfg;
    zs_parallel par;
    const char *device;
    double device_mem_gb; /* 0: the device's own */
    double mfu, tokens;
    bool json;
} opts;

#define CMD "zs analyze" /* prefix of every message */

static const char *rc_names[] = {"none", "selective", "full"};

static void usage(FILE *f)
{
    fprintf(f,
        "usage: zs analyze --model NAME|--config FILE [flags]\n"
        "  --model NAME        gpt2-small|gpt2-medium|gpt2-large|gpt2-xl|\n"
        "                      bloom-176b|gpt3-175b|llama-65b|llama2-70b|\n"
        "                      gpt-tiny|gpt-small (Zhisuan's GPT presets)\n"
        "  --config FILE       flat JSON object: {\"base\": \"gpt2-small\",\n"
        "                      \"n_layer\": 6, \"d_model\": 512, ...}\n"
        "  --set KEY=VALUE     set a config field (n_layer, d_model, n_head,\n"
        "                      n_kv_head, d_head, d_ff, vocab, seq_len, mlp,\n"
        "                      norm, bias, tied_embeddings, learned_pos,\n"
        "                      embed_norm); without --model/--config the\n"
        "                      config is built from these alone\n"
        "  --batch B           global batch in sequences (default b * dp)\n"
        "  --micro-batch b     micro-batch (default 1)\n"
        "  --seq S             sequence length (default: the model's)\n"
        "  --dp N --tp N --pp N   data, tensor, pipeline parallel sizes (1)\n"
        "  --zero 0-3          ZeRO stage over dp (default 0)\n"
        "  --offload           optimizer states (and more) on the host\n"
        "  --recompute none|selective|full   (default none)\n"
        "  --precision fp32|mixed  training state and roofline (default mixed)\n"
        "  --device NAME       v100|a100-80gb|h100-sxm|h200|cpu (default a100-80gb)\n"
        "  --device-mem GB     device memory (default: the device's)\n"
        "  --mfu F             model-FLOPs utilisation, 0 < F <= 1 (default 0.4)\n"
        "  --tokens T          token budget for total compute (e.g. 366e9)\n"
        "  --json              one JSON object instead of tables\n");
}

/* The library's message without its "analyze: " prefix. */
static const char *lib_error(void)
{
    const char *e = zs_last_error();
    return strncmp(e, "analyze: ", 9) ? e : e + 9;
}

/* Applies the --set KEY=VALUE flags at once (so derived sizes follow). */
static int apply_sets(zs_model_config *c, int n, const char *const *sets)
{
    char keys[64][64];
    const char *kp[64], *vp[64];
    for (int i = 0; i < n; i++) {
        const char *eq = strchr(sets[i], '=');
        if (!eq || eq == sets[i] || (size_t)(eq - sets[i]) >= sizeof keys[i])
            return flags_error(CMD, "--set needs KEY=VALUE, got '%.60s'",
                                  sets[i]);
        memcpy(keys[i], sets[i], (size_t)(eq - sets[i]));
        keys[i][eq - sets[i]] = 0;
        kp[i] = keys[i];
        vp[i] = eq + 1;
    }
    if (zs_model_config_set_many(c, n, kp, vp) != ZS_OK)
        return flags_error(CMD, "%s", lib_error());
    return 0;
}

/* Parses argv into o: FLAGS_OK, FLAGS_HELP (usage printed) or
 * FLAGS_BAD after a message. */
static int parse(int argc, char **argv, opts *o)
{
    const char *model = NULL, *config = NULL;
    flag_list sets = {0};
    int recompute = 0, precision = 1; /* indices into the choices below */
    memset(o, 0, sizeof *o);
    o->par = (zs_parallel){.micro_batch = 1, .dp = 1, .tp = 1, .pp = 1};
    o->device = "a100-80gb";
    o->mfu = 0.4;
    const double big = (double)((int64_t)1 << 40);
    flag t[] = {
        FLAG_STR("--model", &model),
        FLAG_STR("--config", &config),
        FLAG_LIST("--set", &sets),
        FLAG_NUM("--batch", &o->par.batch, 1, big),
        FLAG_NUM("--micro-batch", &o->par.micro_batch, 1, big),
        FLAG_NUM("--seq", &o->par.seq, 1, big),
        FLAG_NUM("--dp", &o->par.dp, 1, 1 << 24),
        FLAG_NUM("--tp", &o->par.tp, 1, 1 << 16),
        FLAG_NUM("--pp", &o->par.pp, 1, 1 << 16),
        FLAG_NUM("--zero", &o->par.zero, 0, 3),
        FLAG_SWITCH("--offload", &o->par.offload),
        FLAG_CHOICE("--recompute", &recompute, "none|selective|full"), /* rc_names */
        FLAG_CHOICE("--precision", &precision, "fp32|mixed"),
        FLAG_STR("--device", &o->device),
        FLAG_NUM("--device-mem", &o->device_mem_gb, 1e-3, 1e6),
        FLAG_NUM("--mfu", &o->mfu, 1e-6, 1),
        FLAG_NUM("--tokens", &o->tokens, 0, 1e18),
        FLAG_SWITCH("--json", &o->json),
    };
    int res = flags_parse(CMD, t, NFLAGS(t), usage, argc, argv);
    if (res != FLAGS_OK)
        return res;
    o->par.recompute = (zs_recompute)recompute;
    o->par.precision = precision ? ZS_PREC_MIXED : ZS_PREC_FP32;
    if (model && config)
        return flags_error(CMD, "give --model or --config, not both");
    if (model) {
        const zs_model_config *p = zs_model_preset(model);
        if (!p)
            return flags_error(CMD, "%s", lib_error());
        o->cfg = *p;
    } else if (config) {
        if (zs_model_config_load_json(config, &o->cfg) != ZS_OK)
            return flags_error(CMD, "%s", lib_error());
    } else if (sets.n == 0) {
        return flags_error(CMD, "no model: give --model NAME, --config FILE or "
                              "--set KEY=VALUE (see zs analyze --help)");
    }
    if (apply_sets(&o->cfg, sets.n, sets.items))
        return FLAGS_BAD;
    if (zs_model_config_finish(&o->cfg) != ZS_OK)
        return flags_error(CMD, "%s", lib_error());
    if (!o->par.seq)
        o->par.seq = o->cfg.seq_len;
    if (!o->par.batch)
        o->par.batch = o->par.micro_batch * o->par.dp;
    if (zs_parallel_check(&o->cfg, &o->par) != ZS_OK)
        return flags_error(CMD, "%s", lib_error());
    return FLAGS_OK;
}

/* ---- the analysis, computed once for both printers --------------------- */

typedef struct result {
    zs_param_count params;
    zs_op_cost ops[ZS_BLOCK_MAX_OPS];
    int nops;
    double elem_bytes;
    zs_train_flops flops;
    zs_memory_report mem;
    zs_comm_report comm;
    zs_hw_spec dev;
    double device_mem_gb;
    int64_t min_dev_fp32, min_dev_mixed, devices;
    double step_s, tokens_flops, tokens_s;
    zs_engine_flops engine; /* valid when engine_ok */
    bool engine_ok;
    char engine_why[256];   /* why Zhisuan's GPT cannot run it otherwise */
} result;

static int compute(const opts *o, result *r)
{
    const zs_parallel *p = &o->par;
    memset(r, 0, sizeof *r);
    zs_model_params(&o->cfg, &r->params);
    r->elem_bytes = p->precision == ZS_PREC_FP32 ? 4 : 2;
    r->nops = zs_block_ops(&o->cfg, p->micro_batch, p->seq, r->elem_bytes, r->ops);
    if (r->nops < 0 ||
        zs_train_flops_compute(&o->cfg, p->batch, p->seq, p->recompute, &r->flops) ||
        zs_memory_analyze(&o->cfg, p, &r->mem) || zs_comm_analyze(&o->cfg, p, &r->comm))
        return flags_error(CMD, "%s", lib_error());
    if (zs_hw_lookup(o->device, &r->dev) != ZS_OK)
        return flags_error(CMD, "%s", lib_error());
    r->device_mem_gb = o->device_mem_gb > 0 ? o->device_mem_gb : r->dev.mem_gb;
    r->min_dev_fp32 = zs_min_devices(r->mem.fp32.total, r->device_mem_gb * 1e9);
    r->min_dev_mixed = zs_min_devices(r->mem.mixed.total, r->device_mem_gb * 1e9);
    r->devices = p->dp * p->tp * p->pp;
    r->step_s = zs_step_seconds(&r->dev, p->precision, r->flops.step, r->devices, o->mfu);
    r->tokens_flops = r->flops.per_token * o->tokens;
    r->tokens_s = zs_step_seconds(&r->dev, p->precision, r->tokens_flops, r->devices, o->mfu);
    r->engine_ok = zs_analyze_engine_step_flops(&o->cfg, p->batch, p->seq,
                                                &r->engine) >= 0;
    if (!r->engine_ok)
        snprintf(r->engine_why, sizeof r->engine_why, "%s", lib_error());
    return 0;
}

/* ---- tables ------------------------------------------------------------- */

/* "34.8 P" style: value scaled by 10^3k with a unit prefix. */
static const char *si(char *buf, double v)
{
    static const char *pre[] = {"", "K", "M", "G", "T", "P", "E", "Z"};
    int k = 0;
    while (fabs(v) >= 1000 && k < 7) {
        v /= 1000;
        k++;
    }
    snprintf(buf, 32, "%.*f %s", fabs(v) < 10 ? 2 : 1, v, pre[k]);
    return buf;
}

static const char *gb(char *buf, double bytes)
{
    double g = bytes / 1e9;
    snprintf(buf, 32, "%.*f GB", g >= 100 ? 0 : g >= 10 ? 1 : 3, g);
    return buf;
}

static void print_model(const opts *o, const result *r)
{
    const zs_model_config *c = &o->cfg;
    const zs_param_count *pc = &r->params;
    printf("Model %s: l=%lld h=%lld n=%lld (K/V heads %lld) d=%lld ff=%lld "
           "V=%lld s=%lld\n", c->name, (long long)c->n_layer,
           (long long)c->d_model, (long long)c->n_head, (long long)c->n_kv_head,
           (long long)c->d_head, (long long)c->d_ff, (long long)c->vocab,
           (long long)o->par.seq);
    printf("  mlp %s, %s, %s, %s embeddings, %s positions%s\n",
           c->mlp == ZS_MLP_GELU ? "GeLU" : "SwiGLU",
           c->norm == ZS_NORM_LAYER ? "LayerNorm" : "RMSNorm",
           c->bias ? "biases" : "no biases", c->tied_embeddings ? "tied" : "untied",
           c->learned_pos ? "learned" : "no learned",
           c->embed_norm ? ", norm after the embedding" : "");
    printf("Parameters %.0f (%.2f B): %lld layers x %.0f (attention %.0f, "
           "MLP %.0f, norms %.0f), embedding %.0f", pc->total, pc->total / 1e9,
           (long long)c->n_layer, pc->per_layer, pc->attention, pc->mlp,
           pc->norms, pc->embedding);
    if (pc->position > 0)
        printf(", positions %.0f", pc->position);
    if (pc->logit > 0)
        printf(", logit layer %.0f", pc->logit);
    printf("\n  layout: global batch %lld, micro-batch %lld, dp %lld, tp %lld, "
           "pp %lld, %lld micro-batches, ZeRO-%d%s, recompute %s, %s\n\n",
           (long long)o->par.batch, (long long)o->par.micro_batch,
           (long long)o->par.dp, (long long)o->par.tp, (long long)o->par.pp,
           (long long)r->comm.micro_batches, o->par.zero,
           o->par.offload ? " + offload" : "", rc_names[o->par.recompute],
           o->par.precision == ZS_PREC_FP32 ? "fp32" : "mixed precision");
}

static void print_ops(const opts *o, const result *r)
{
    zs_precision pr = o->par.precision;
    double ridge = zs_hw_ridge(&r->dev, pr);
    char b1[32], b2[32];
    printf("Per operator, one decoder block, forward, b=%lld s=%lld "
           "(%g bytes/element; %s ridge %.1f FLOP/byte)\n",
           (long long)o->par.micro_batch, (long long)o->par.seq, r->elem_bytes,
           r->dev.name, ridge);
    printf("%-16s %-22s %-22s %-22s %10s %10s %9s %9s %-7s %10s\n", "op",
           "input 1", "input 2", "output", "FLOPs", "bytes", "FLOP/elem",
           "FLOP/B", "bound", "time");
    double mm = 0, all = 0, t = 0;
    for (int i = 0; i < r->nops; i++) {
        const zs_op_cost *op = &r->ops[i];
        double ib = op->flops / op->bytes;
        double sec = zs_roofline_seconds(&r->dev, pr, op->flops, op->bytes);
        printf("%-16s %-22s %-22s %-22s %10s %9sB %9.1f %9.1f %-7s %8.3f ms\n",
               op->name, op->in1, op->in2[0] ? op->in2 : "-", op->out,
               si(b1, op->flops), si(b2, op->bytes), op->flops / op->elems, ib,
               ib < ridge ? "memory" : "compute", sec * 1e3);
        mm += op->matmul ? op->flops : 0;
        all += op->flops;
        t += sec;
    }
    printf("matmuls %sFLOP (24bsh^2 + 4bs^2h for GPT blocks), all ops %sFLOP, "
           "roofline time %.3f ms per block on one %s\n\n", si(b1, mm),
           si(b2, all), t * 1e3, r->dev.name);
}

static void print_flops(const opts *o, const result *r)
{
    const zs_train_flops *f = &r->flops;
    char a[32], b[32], c[32];
    printf("Training FLOPs per global batch B=%lld, s=%lld\n",
           (long long)o->par.batch, (long long)o->par.seq);
    printf("%-36s %12s %12s %12s\n", "", "forward", "backward", "total");
    printf("%-36s %11sF %11sF %11sF  (%.4e)\n", "decoder blocks (chapter)",
           si(a, f->fwd), si(b, f->bwd), si(c, f->total), f->total);
    printf("%-36s %11sF %11sF %11sF  (%.4e)\n", "+ logit layer (2BshV forward)",
           si(a, f->fwd + f->logit_fwd), si(b, 2 * (f->fwd + f->logit_fwd)),
           si(c, f->total_with_logit), f->total_with_logit);
    printf("%-36s %11sF\n", "+ selective recompute (QK^T, PV)",
           si(a, f->total_with_logit + f->recompute_selective));
    printf("%-36s %11sF\n", "+ full recompute (one more forward)",
           si(a, f->total_with_logit + f->recompute_full));
    printf("step (recompute %s): %sFLOP; per token %sFLOP (6N: %sFLOP)\n",
           rc_names[o->par.recompute], si(a, f->step), si(b, f->per_token),
           si(c, f->six_n_per_token));
    if (o->tokens > 0)
        printf("compute for %s tokens: %sFLOP (%.3e)\n", si(a, o->tokens),
               si(b, r->tokens_flops), r->tokens_flops);
    printf("\n");
}

/* What Zhisuan's own operators count for one training step of this model
 * on one process (src/analyze/engine_flops.c), beside the textbook counts. */
static void print_engine(const opts *o, const result *r)
{
    if (!r->engine_ok) {
        printf("Engine step: %s\n\n", r->engine_why);
        return;
    }
    const zs_engine_flops *e = &r->engine;
    char a[32], b[32], c[32];
    printf("Engine step: Zhisuan's GPT, one training step (zs_gpt_loss + "
           "zs_backward) of B=%lld, T=%lld, as its operators count it\n",
           (long long)o->par.batch, (long long)o->par.seq);
    printf("%-24s %8s %12s %12s %12s\n", "operator", "calls", "forward",
           "backward", "total");
    for (int i = 0; i < e->nops; i++) {
        const zs_engine_op *p = &e->ops[i];
        double bw = p->flops - p->fwd;
        printf("%-24s %8lld %11s%s %11s%s %11sF\n", p->name,
               (long long)p->calls, p->fwd ? si(a, p->fwd) : "-",
               p->fwd ? "F" : " ", bw ? si(b, bw) : "-", bw ? "F" : " ",
               si(c, p->flops));
    }
    printf("%-24s %8s %11sF %11sF %11sF  (%.0f)\n", "total", "", si(a, e->fwd),
           si(b, e->bwd), si(c, e->total), e->total);
    printf("  GEMMs 72BTlh^2 + 6BThV = 6 x matmul weights x tokens  %sF\n",
           si(a, e->gemm));
    printf("  attention, causal: 3.5 x 2BT(T+1)lh                  %sF "
           "(chapter, square: 12BT^2lh = %sF)\n", si(b, e->attention),
           si(c, e->chapter - e->gemm));
    printf("  elementwise: biases, GeLU, norms, loss, sums, adds   %sF\n",
           si(a, e->elementwise));
    printf("  chapter 72BTlh^2 (1 + T/6h + V/12lh): %sF; 6N x tokens: %sF; "
           "engine / chapter %.3f\n\n", si(a, e->chapter), si(b, e->six_n),
           e->total / e->chapter);
}

static void print_state_row(const char *name, double a, double b,
                            const char *na, const char *nb)
{
    char x[32], y[32];
    printf("%-20s %10s %-5s %12s %-5s\n", name, gb(x, a), na, gb(y, b), nb);
}

static void print_memory(const opts *o, const result *r)
{
    const zs_memory_report *m = &r->mem;
    char a[32], b[32], c[32], d[32];
    printf("Memory: training state of one replica (activations not included)\n");
    printf("%-20s %-16s %-18s\n", "", "fp32 AdamW", "  mixed precision");
    print_state_row("weights", m->fp32.weights, m->mixed.weights, "N*4", "N*2");
    print_state_row("optimizer states", m->fp32.optim, m->mixed.optim, "N*12", "N*12");
    print_state_row("gradients", m->fp32.grads, m->mixed.grads, "N*4", "N*2");
    print_state_row("subtotal", m->fp32.total, m->mixed.total, "N*20", "N*16");
    printf("%-20s %10lld %5s %12lld       (devices of %.0f GB)\n",
           "min devices", (long long)r->min_dev_fp32, "",
           (long long)r->min_dev_mixed, r->device_mem_gb);
    printf("per device (%s, /tp*pp, ZeRO-%d over dp=%lld%s): weights %s, "
           "gradients %s, optimizer %s, total %s\n",
           o->par.precision == ZS_PREC_FP32 ? "fp32" : "mixed", o->par.zero,
           (long long)o->par.dp, o->par.offload ? ", offload" : "",
           gb(a, m->device.weights), gb(b, m->device.grads),
           gb(c, m->device.optim), gb(d, m->device.total));
    if (o->par.offload)
        printf("  on the host per device: %s\n", gb(a, m->host.total));
    printf("activations per layer per micro-batch (16-bit, tp=%lld): none %s, "
           "selective %s, full %s\n", (long long)o->par.tp,
           gb(a, m->act_layer[0]), gb(b, m->act_layer[1]), gb(c, m->act_layer[2]));
    printf("activations per device (recompute %s, %lld layers x %lld "
           "micro-batches in flight, 1F1B): %s\n", rc_names[o->par.recompute],
           (long long)m->layers_per_stage, (long long)m->micro_batches_in_flight,
           gb(a, m->act_device));
    printf("device total %s of %.0f GB: %s\n\n", gb(a, m->device_total),
           r->device_mem_gb,
           m->device_total <= r->device_mem_gb * 1e9 ? "fits" : "does not fit");
}

static void print_comm(const opts *o, const result *r)
{
    const zs_comm_report *c = &r->comm;
    char a[32], b[32];
    printf("Communication per device per step (%lld micro-batches)\n",
           (long long)c->micro_batches);
    printf("  data parallel ring all-reduce   2(N-1)/N x %s = %s\n",
           gb(a, c->grad_bytes), gb(b, c->dp_allreduce));
    printf("  ZeRO-3 extra weight all-gather  %s\n", gb(a, c->zero3_gather));
    printf("  tensor parallel all-reduces     %s per layer per micro-batch, "
           "%s per step\n", gb(a, c->tp_layer), gb(b, c->tp_step));
    printf("  pipeline point-to-point         %s\n", gb(a, c->pp_p2p));
    printf("  total                           %s\n", gb(a, c->total));
    printf("  pipeline bubble (p=%lld, m=%lld): GPipe %.1f%%, 1F1B %.1f%% of "
           "the step\n\n", (long long)o->par.pp, (long long)c->micro_batches,
           100 * c->bubble_gpipe, 100 * c->bubble_1f1b);
}

static void print_devices(const opts *o, const result *r)
{
    printf("Devices\n%-10s %12s %12s %10s %8s %12s %12s\n", "name",
           "16-bit TF/s", "fp32 TF/s", "GB/s", "mem GB", "ridge 16-bit",
           "ridge fp32");
    for (int i = 0; i < zs_hw_count(); i++) {
        zs_hw_spec d;
        zs_hw_lookup(zs_hw_at(i)->name, &d);
        printf("%-10s %12.1f %12.2f %10.0f %8.0f %12.1f %12.1f%s\n", d.name,
               d.tflops16, d.tflops32, d.bw_gbs, d.mem_gb,
               zs_hw_ridge(&d, ZS_PREC_MIXED), zs_hw_ridge(&d, ZS_PREC_FP32),
               d.measured ? "  (measured)" : "");
    }
    printf("step time on %lld x %s at MFU %.2f: %.3f s", (long long)r->devices,
           r->dev.name, o->mfu, r->step_s);
    if (o->tokens > 0)
        printf("; %g tokens: %.1f days", o->tokens, r->tokens_s / 86400);
    printf("\n");
}

/* ---- JSON ---------------------------------------------------------------- */

typedef struct jw {
    int depth;
    bool first[16];
} jw;

static void jkey(jw *w, const char *key)
{
    printf("%s\n%*s", w->first[w->depth] ? "" : ",", 2 * w->depth, "");
    w->first[w->depth] = false;
    if (key)
        printf("\"%s\": ", key);
}

static void jopen(jw *w, const char *key, char br)
{
    jkey(w, key);
    putchar(br);
    w->first[++w->depth] = true;
}

static void jclose(jw *w, char br)
{
    w->depth--;
    printf("\n%*s%c", 2 * w->depth, "", br);
}

static void jnum(jw *w, const char *key, double v)
{
    jkey(w, key);
    if (isfinite(v))
        printf("%.17g", v);
    else
        printf("null");
}

static void jstr(jw *w, const char *key, const char *s)
{
    jkey(w, key);
    putchar('"');
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            printf("\\%c", ch);
        else if (ch < 0x20)
            printf("\\u%04x", ch);
        else
            putchar(ch);
    }
    putchar('"');
}

static void jbool(jw *w, const char *key, bool v)
{
    jkey(w, key);
    printf(v ? "true" : "false");
}

static void jstate(jw *w, const char *key, const zs_state_bytes *s)
{
    jopen(w, key, '{');
    jnum(w, "weights", s->weights);
    jnum(w, "grads", s->grads);
    jnum(w, "optim", s->optim);
    jnum(w, "total", s->total);
    jclose(w, '}');
}

static void json_model(jw *w, const opts *o, const result *r)
{
    const zs_model_config *c = &o->cfg;
    jopen(w, "model", '{');
    jstr(w, "name", c->name);
    jnum(w, "n_layer", (double)c->n_layer);
    jnum(w, "d_model", (double)c->d_model);
    jnum(w, "n_head", (double)c->n_head);
    jnum(w, "n_kv_head", (double)c->n_kv_head);
    jnum(w, "d_head", (double)c->d_head);
    jnum(w, "d_ff", (double)c->d_ff);
    jnum(w, "vocab", (double)c->vocab);
    jnum(w, "seq_len", (double)c->seq_len);
    jstr(w, "mlp", c->mlp == ZS_MLP_GELU ? "gelu" : "swiglu");
    jstr(w, "norm", c->norm == ZS_NORM_LAYER ? "layernorm" : "rmsnorm");
    jbool(w, "bias", c->bias);
    jbool(w, "tied_embeddings", c->tied_embeddings);
    jbool(w, "learned_pos", c->learned_pos);
    jbool(w, "embed_norm", c->embed_norm);
    jnum(w, "params", r->params.total);
    jnum(w, "params_per_layer", r->params.per_layer);
    jclose(w, '}');
    const zs_parallel *p = &o->par;
    jopen(w, "layout", '{');
    jnum(w, "batch", (double)p->batch);
    jnum(w, "micro_batch", (double)p->micro_batch);
    jnum(w, "seq", (double)p->seq);
    jnum(w, "dp", (double)p->dp);
    jnum(w, "tp", (double)p->tp);
    jnum(w, "pp", (double)p->pp);
    jnum(w, "zero", p->zero);
    jbool(w, "offload", p->offload);
    jstr(w, "recompute", rc_names[p->recompute]);
    jstr(w, "precision", p->precision == ZS_PREC_FP32 ? "fp32" : "mixed");
    jnum(w, "micro_batches", (double)r->comm.micro_batches);
    jclose(w, '}');
}

/* "engine": the engine's per-operator count of one step, or null. */
static void json_engine(jw *w, const result *r)
{
    if (!r->engine_ok) {
        jkey(w, "engine");
        printf("null");
        return;
    }
    const zs_engine_flops *e = &r->engine;
    jopen(w, "engine", '{');
    jopen(w, "ops", '[');
    for (int i = 0; i < e->nops; i++) {
        jopen(w, NULL, '{');
        jstr(w, "name", e->ops[i].name);
        jnum(w, "calls", (double)e->ops[i].calls);
        jnum(w, "forward", e->ops[i].fwd);
        jnum(w, "flops", e->ops[i].flops);
        jclose(w, '}');
    }
    jclose(w, ']');
    jnum(w, "forward", e->fwd);
    jnum(w, "backward", e->bwd);
    jnum(w, "total", e->total);
    jnum(w, "gemm", e->gemm);
    jnum(w, "attention", e->attention);
    jnum(w, "elementwise", e->elementwise);
    jnum(w, "chapter", e->chapter);
    jnum(w, "six_n", e->six_n);
    jclose(w, '}');
}

static void json_ops(jw *w, const opts *o, const result *r)
{
    double ridge = zs_hw_ridge(&r->dev, o->par.precision);
    jopen(w, "block_ops", '[');
    for (int i = 0; i < r->nops; i++) {
        const zs_op_cost *op = &r->ops[i];
        jopen(w, NULL, '{');
        jstr(w, "name", op->name);
        jstr(w, "input1", op->in1);
        jstr(w, "input2", op->in2);
        jstr(w, "output", op->out);
        jbool(w, "matmul", op->matmul);
        jnum(w, "flops", op->flops);
        jnum(w, "elems", op->elems);
        jnum(w, "bytes", op->bytes);
        jnum(w, "flop_per_elem", op->flops / op->elems);
        jnum(w, "flop_per_byte", op->flops / op->bytes);
        jstr(w, "bound", op->flops / op->bytes < ridge ? "memory" : "compute");
        jnum(w, "roofline_seconds", zs_roofline_seconds(&r->dev, o->par.precision,
                                                        op->flops, op->bytes));
        jclose(w, '}');
    }
    jclose(w, ']');
    const zs_train_flops *f = &r->flops;
    jopen(w, "flops", '{');
    jnum(w, "forward", f->fwd);
    jnum(w, "backward", f->bwd);
    jnum(w, "total", f->total);
    jnum(w, "logit_forward", f->logit_fwd);
    jnum(w, "total_with_logit", f->total_with_logit);
    jnum(w, "recompute_selective_extra", f->recompute_selective);
    jnum(w, "recompute_full_extra", f->recompute_full);
    jnum(w, "step", f->step);
    jnum(w, "per_token", f->per_token);
    jnum(w, "six_n_per_token", f->six_n_per_token);
    jnum(w, "tokens", o->tokens);
    jnum(w, "tokens_flops", r->tokens_flops);
    jclose(w, '}');
    json_engine(w, r);
}

static void json_rest(jw *w, const opts *o, const result *r)
{
    const zs_memory_report *m = &r->mem;
    jopen(w, "memory", '{');
    jstate(w, "fp32", &m->fp32);
    jstate(w, "mixed", &m->mixed);
    jnum(w, "device_mem_gb", r->device_mem_gb);
    jnum(w, "min_devices_fp32", (double)r->min_dev_fp32);
    jnum(w, "min_devices_mixed", (double)r->min_dev_mixed);
    jstate(w, "device", &m->device);
    jstate(w, "host", &m->host);
    jnum(w, "activation_layer_none", m->act_layer[0]);
    jnum(w, "activation_layer_selective", m->act_layer[1]);
    jnum(w, "activation_layer_full", m->act_layer[2]);
    jnum(w, "activation_device", m->act_device);
    jnum(w, "device_total", m->device_total);
    jbool(w, "fits", m->device_total <= r->device_mem_gb * 1e9);
    jclose(w, '}');
    const zs_comm_report *c = &r->comm;
    jopen(w, "comm", '{');
    jnum(w, "grad_bytes", c->grad_bytes);
    jnum(w, "dp_allreduce", c->dp_allreduce);
    jnum(w, "zero3_gather", c->zero3_gather);
    jnum(w, "tp_layer", c->tp_layer);
    jnum(w, "tp_step", c->tp_step);
    jnum(w, "pp_p2p", c->pp_p2p);
    jnum(w, "total", c->total);
    jnum(w, "bubble_gpipe", c->bubble_gpipe);
    jnum(w, "bubble_1f1b", c->bubble_1f1b);
    jclose(w, '}');
    jopen(w, "estimate", '{');
    jstr(w, "device", r->dev.name);
    jnum(w, "devices", (double)r->devices);
    jnum(w, "mfu", o->mfu);
    jnum(w, "ridge", zs_hw_ridge(&r->dev, o->par.precision));
    jnum(w, "step_seconds", r->step_s);
    jnum(w, "tokens_seconds", r->tokens_s);
    jclose(w, '}');
    jopen(w, "devices", '[');
    for (int i = 0; i < zs_hw_count(); i++) {
        zs_hw_spec d;
        zs_hw_lookup(zs_hw_at(i)->name, &d);
        jopen(w, NULL, '{');
        jstr(w, "name", d.name);
        jnum(w, "tflops16", d.tflops16);
        jnum(w, "tflops32", d.tflops32);
        jnum(w, "bw_gbs", d.bw_gbs);
        jnum(w, "mem_gb", d.mem_gb);
        jnum(w, "ridge16", zs_hw_ridge(&d, ZS_PREC_MIXED));
        jnum(w, "ridge32", zs_hw_ridge(&d, ZS_PREC_FP32));
        jbool(w, "measured", d.measured);
        jclose(w, '}');
    }
    jclose(w, ']');
}

int cmd_analyze(int argc, char **argv)
{
    opts o;
    int p = parse(argc, argv, &o);
    if (p != FLAGS_OK)
        return flags_exit(p);
    result r;
    if (compute(&o, &r))
        return 2;
    if (o.json) {
        jw w = {.depth = 0, .first = {true}};
        jopen(&w, NULL, '{');
        json_model(&w, &o, &r);
        json_ops(&w, &o, &r);
        json_rest(&w, &o, &r);
        jclose(&w, '}');
        printf("\n");
        return 0;
    }
    print_model(&o, &r);
    print_ops(&o, &r);
    print_flops(&o, &r);
    print_engine(&o, &r);
    print_memory(&o, &r);
    print_comm(&o, &r);
    print_devices(&o, &r);
    return 0;
}
