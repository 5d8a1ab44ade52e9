/*
 * memory.c - training memory: model state (weights, gradients, optimizer
 * states) per precision, split by tensor and pipeline parallelism and by
 * ZeRO over data parallelism, optional CPU offload; activations per layer
 * with and without recomputation; the smallest device count.
 *
 * Model state per parameter (the chapter's table; ZeRO paper, sec. 3.1):
 *   fp32 AdamW:       weights 4 + gradients 4 + optimizer 12 = 20 bytes
 *   mixed precision:  weights 2 + gradients 2 + optimizer 12 = 16 bytes
 * (optimizer = fp32 master weights, momentum, variance). BLOOM-176B:
 * 176.25e9 * 20 = 3525 GB, so ceil(3525 / 80) = 45 devices of 80 GB.
 *
 * ZeRO over dp ranks, per device: stage 1 divides the optimizer states,
 * stage 2 also the gradients, stage 3 also the weights. Offload moves the
 * optimizer states to the host, from stage 2 the gradients, at stage 3 the
 * weights too.
 *
 * Activations (Korthikanti et al. 2022, sec. 4, 16-bit, a = heads, t =
 * tensor-parallel size, no sequence parallelism), per layer per
 * micro-batch of b sequences of length s:
 *   kept on every TP rank: two norm inputs 4sbh, QKV input 2sbh, MLP input
 *     2sbh, two dropout masks 2sbh                      = 10sbh
 *   split over t: Q, K 4sbh, V 2sbh, out-proj input 2sbh, GeLU input and
 *     output 16sbh                                      = 24sbh
 *     softmax output 2as^2b, its dropout mask as^2b and output 2as^2b
 *                                                       = 5as^2b
 *   no recomputation:  sbh(10 + 24/t) + 5as^2b/t (34sbh + 5as^2b at t = 1)
 *   selective:         sbh(10 + 24/t)  (drops the 5as^2b term: QK^T,
 *                      softmax, dropout and P V are recomputed)
 *   full:              2sbh (only each block's input is kept)
 * The terms are computed from the saved tensors' widths, so grouped-query
 * attention (narrower K, V) and SwiGLU (gate, up and product of width ff)
 * change them accordingly. *
 * One rank of a pipeline stage (zs_memory_analyze_stage), with e bytes an
 * activation element, sb = micro-batch x sequence, h the width, ff the
 * MLP width, V the vocabulary, t the tp size and n the micro-batches in
 * flight (1F1B: min(pp - stage, m); GPipe: m), beyond the state and
 * layers x n x the per-layer count above (terms measured one by one with
 * the allocator's peak report, ZS_ALLOC_TRACE, on GPT small):
 *   boundary (every stage but the last): n e sb h, each micro-batch's
 *     stage output, the root of its backward, kept until its gradient
 *     comes back (the stage's input is the first norm's input, counted);
 *   head (the last stage): n e sb (2h + V/t), the final norm's input and
 *     output and the vocabulary-parallel logits, which the shard's
 *     cross-entropy keeps (no softmax: its backward recomputes it);
 *   work, the backward's working set at the peak, beside the held
 *     activations: e sb (h + ff/t) (the gradient on the residual stream
 *     and the MLP down-projection's input gradient) plus the f32 GEMM's
 *     packed weight block for that gradient, 4 min(h, KC) min(ff/t, NC)
 *     bytes (kernels/cpu/gemm.c: KC 1024, NC 2048); on the last stage at
 *     least e sb V/t (the logits' gradient beside the logits) and the
 *     logits GEMM's packed token table in forward, 4 min(h, KC)
 *     min(V/t, NC) bytes (beside the new logits, counted); under 1F1B
 *     on stages after the first, e sb h more (the previous micro-batch's
 *     input gradient, still in the pipe's send). Weight gradients add
 *     into the flat gradient in place (no transient).
 * Not counted: the allocator's size-class rounding (at most 3.1% of a
 * block from 1 MiB); the communication library's own buffers (the ring
 * all-reduce's chunk is malloc'd, outside the allocator).
 */
#define GEMM_KC 1024.0
#define GEMM_NC 2048.0
#include <math.h>
#include <string.h>

#include "zs/analyze.h"

void zs_state_bytes_full(double params, zs_precision p, zs_state_bytes *o)
{
    double w = p == ZS_PREC_FP32 ? 4 : 2;
    o->weights = params * w;
    o->grads = params * w;
    o->optim = params * 12;
    o->total = o->weights + o->grads + o->optim;
}

zs_status zs_parallel_check(const zs_model_config *c, const zs_parallel *p)
{
    if (p->batch <= 0 || p->micro_batch <= 0 || p->seq <= 0 || p->dp <= 0 ||
        p->tp <= 0 || p->pp <= 0)
        return zs_set_error("analyze: batch, micro-batch, seq, dp, tp and pp "
                            "must be positive");
    if (p->zero < 0 || p->zero > 3)
        return zs_set_error("analyze: ZeRO stage must be 0..3, got %d", p->zero);
    if (p->offload && p->zero < 1)
        return zs_set_error("analyze: --offload needs ZeRO stage 1..3");
    if (p->batch % (p->micro_batch * p->dp))
        return zs_set_error("analyze: global batch %lld is not a multiple of "
                            "micro-batch %lld x dp %lld", (long long)p->batch,
                            (long long)p->micro_batch, (long long)p->dp);
    if (p->pp > c->n_layer)
        return zs_set_error("analyze: %lld layers cannot fill %lld pipeline "
                            "stages", (long long)c->n_layer, (long long)p->pp);
    if (c->n_kv_head % p->tp)
        return zs_set_error("analyze: %lld %sheads do not split over tp %lld",
                            (long long)c->n_kv_head,
                            c->n_kv_head < c->n_head ? "K/V " : "",
                            (long long)p->tp);
    return ZS_OK;
}

int64_t zs_parallel_layers_per_stage(const zs_model_config *c,
                                     const zs_parallel *p)
{
    return (c->n_layer + p->pp - 1) / p->pp;
}

int64_t zs_parallel_micro_batches(const zs_parallel *p)
{
    return p->batch / (p->micro_batch * p->dp);
}

/* Per layer, per micro-batch, per tp rank: the chapter's count, or with
 * like-for-like options (p: act_bytes, flash, no_dropout; NULL: none). */
static double act_layer(const zs_model_config *c, int64_t b, int64_t s, int64_t tp,
                        zs_recompute rc, const zs_parallel *p)
{
    double e = p && p->act_bytes > 0 ? p->act_bytes : 2;
    double sb = (double)s * (double)b, h = (double)c->d_model;
    double qd = (double)(c->n_head * c->d_head);
    double kvd = (double)(c->n_kv_head * c->d_head);
    double ff = (double)c->d_ff, t = (double)tp;
    if (rc == ZS_RECOMPUTE_FULL)
        return e * sb * h;
    double kept = e * sb * h * 4                           /* norm inputs, QKV, MLP inputs */
                  + (p && p->no_dropout ? 0 : 2 * sb * h); /* masks, 1 byte */
    double split = e * sb * (qd + 2 * kvd) + e * sb * qd;  /* Q, K, V; out-proj input */
    split += (c->mlp == ZS_MLP_GELU ? 2 : 3) * e * sb * ff;
    double scores = p && p->flash ? e * sb * qd + 4 * (double)c->n_head * sb
                                  : 5 * (double)c->n_head * (double)s * sb;
    double total = kept + split / t;
    if (rc == ZS_RECOMPUTE_NONE || (p && p->flash))
        total += scores / t;
    return total;
}

double zs_activation_bytes_layer(const zs_model_config *c, int64_t b,
                                 int64_t s, int64_t tp, zs_recompute rc)
{
    return act_layer(c, b, s, tp, rc, NULL);
}

void zs_state_bytes_zero(const zs_state_bytes *replica, int64_t dp, int stage,
                         zs_state_bytes *o)
{
    double n = dp > 0 ? (double)dp : 1;
    o->weights = replica->weights / (stage >= 3 ? n : 1);
    o->grads = replica->grads / (stage >= 2 ? n : 1);
    o->optim = replica->optim / (stage >= 1 ? n : 1);
    o->total = o->weights + o->grads + o->optim;
}

/* Per-device model state: split over tp*pp, ZeRO over dp, offload. */
static void device_state(const zs_state_bytes *full, const zs_parallel *p,
                         zs_state_bytes *dev, zs_state_bytes *host)
{
    double mp = (double)(p->tp * p->pp);
    zs_state_bytes split = {full->weights / mp, full->grads / mp, full->optim / mp, 0};
    zs_state_bytes_zero(&split, p->dp, p->zero, dev);
    memset(host, 0, sizeof *host);
    if (p->offload) {
        host->optim = dev->optim;
        dev->optim = 0;
        if (p->zero >= 2) {
            host->grads = dev->grads;
            dev->grads = 0;
        }
        if (p->zero >= 3) {
            host->weights = dev->weights;
            dev->weights = 0;
        }
    }
    dev->total = dev->weights + dev->grads + dev->optim;
    host->total = host->weights + host->grads + host->optim;
}

zs_status zs_memory_analyze(const zs_model_config *c, const zs_parallel *p,
                            zs_memory_report *o)
{
    zs_status st = zs_parallel_check(c, p);
    if (st != ZS_OK)
        return st;
    memset(o, 0, sizeof *o);
    zs_param_count pc;
    zs_model_params(c, &pc);
    zs_state_bytes_full(pc.total, ZS_PREC_FP32, &o->fp32);
    zs_state_bytes_full(pc.total, ZS_PREC_MIXED, &o->mixed);
    device_state(p->precision == ZS_PREC_FP32 ? &o->fp32 : &o->mixed, p,
                 &o->device, &o->host);
    for (int r = 0; r < 3; r++)
        o->act_layer[r] = zs_activation_bytes_layer(c, p->micro_batch, p->seq,
                                                    p->tp, (zs_recompute)r);
    int64_t m = zs_parallel_micro_batches(p);
    o->layers_per_stage = zs_parallel_layers_per_stage(c, p);
    o->micro_batches_in_flight = m < p->pp ? m : p->pp;
    o->act_device = o->act_layer[p->recompute] * (double)o->layers_per_stage *
                    (double)o->micro_batches_in_flight;
    o->device_total = o->device.total + o->act_device;
    return ZS_OK;
}

zs_status zs_memory_analyze_stage(const zs_model_config *c, const zs_parallel *p,
                                  int64_t stage, int64_t layers, zs_stage_memory *o)
{
    zs_status st = zs_parallel_check(c, p);
    if (st != ZS_OK)
        return st;
    if (stage < 0 || stage >= p->pp || layers < 0 || layers > c->n_layer)
        return zs_set_error("analyze: stage %lld of %lld with %lld layers of %lld",
                            (long long)stage, (long long)p->pp, (long long)layers,
                            (long long)c->n_layer);
    memset(o, 0, sizeof *o);
    zs_param_count pc;
    zs_model_params(c, &pc);
    double t = (double)p->tp;
    bool first = stage == 0, last = stage == p->pp - 1;
    o->params = (double)layers * ((pc.attention + pc.mlp) / t + pc.norms);
    if (first)
        o->params += pc.embedding / t + pc.position + pc.embed_norm;
    if (last)
        o->params += pc.final_norm + (c->tied_embeddings ? (first ? 0 : pc.embedding / t)
                                                         : pc.logit / t);
    double w = p->precision == ZS_PREC_FP32 ? 4 : 2;
    double ob = p->optim_bytes > 0 ? p->optim_bytes : 12;
    zs_state_bytes rep = {o->params * w, o->params * w, o->params * ob, 0};
    zs_state_bytes_zero(&rep, p->dp, p->zero, &o->state);
    int64_t m = zs_parallel_micro_batches(p);
    o->in_flight = p->gpipe ? m : (m < p->pp - stage ? m : p->pp - stage);
    o->act_layer = act_layer(c, p->micro_batch, p->seq, p->tp, p->recompute, p);
    double e = p->act_bytes > 0 ? p->act_bytes : 2;
    double sb = (double)p->micro_batch * (double)p->seq, h = (double)c->d_model;
    double nf = (double)o->in_flight, vt = (double)c->vocab / t;
    if (last)
        o->act_head = nf * e * sb * (2 * h + vt);
    else
        o->boundary = nf * e * sb * h;
    o->act = (double)layers * nf * o->act_layer + o->boundary + o->act_head;
    /* the backward's working set beside what it frees as it goes */
    double ft = (double)c->d_ff / t;
    double pack = 4 * fmin(h, GEMM_KC) * fmin(ft, GEMM_NC);
    double work = layers > 0 ? e * sb * (h + ft) + pack : 0;
    if (last) /* the logits' gradient; in forward, the logits GEMM's packed table */
        work = fmax(work, fmax(e * sb * vt, 4 * fmin(h, GEMM_KC) * fmin(vt, GEMM_NC)));
    if (!p->gpipe && stage > 0 && zs_parallel_micro_batches(p) > 1)
        work += e * sb * h;
    o->work = work;
    o->total = o->state.total + o->act + o->work;
    return ZS_OK;
}

int64_t zs_min_devices(double total_bytes, double device_bytes)
{
    if (!(device_bytes > 0) || !(total_bytes >= 0))
        return zs_set_error("analyze: min_devices: device memory must be > 0 "
                            "and the total >= 0");
    return (int64_t)ceil(total_bytes / device_bytes);
}
