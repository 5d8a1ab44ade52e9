/*
 * comm.c - communication volume of one training step, per device, and the
 * pipeline bubble.
 *
 * Data parallel (dp ranks): a ring all-reduce of the gradients sends
 *   2(dp-1)/dp * gradient bytes per rank; ZeRO-1/2 replace it by a
 *   reduce-scatter of the gradients and an all-gather of the updated
 *   weights, the same volume; ZeRO-3 gathers the weights once more for the
 *   backward pass: + (dp-1)/dp * weight bytes (1.5x the all-reduce).
 * Tensor parallel (Megatron, t ranks): per layer and micro-batch two
 *   all-reduces of b*s*h activations forward (after attention and after
 *   the MLP) and two backward: 4 * 2(t-1)/t * bsh * element bytes; full
 *   recomputation repeats the two forward ones. Counted for the largest
 *   stage, ceil(l/p) layers.
 * Pipeline parallel: per micro-batch a stage sends its b*s*h activations
 *   to the next stage and b*s*h gradients to the previous one: 2 * m *
 *   bsh * element bytes for a middle stage (the first and last send in one
 *   direction only).
 * Bubble (p stages, m micro-batches): (p-1)/(m+p-1) of the step for GPipe
 *   and for 1F1B alike; 1F1B only lowers the activations held.
 */
#include <string.h>

#include "zs/analyze.h"

double zs_ring_allreduce_bytes(double bytes, int64_t n)
{
    return n <= 1 ? 0 : 2.0 * (double)(n - 1) / (double)n * bytes;
}

double zs_ring_allgather_bytes(double bytes, int64_t n)
{
    return n <= 1 ? 0 : (double)(n - 1) / (double)n * bytes;
}

double zs_pipeline_bubble(int64_t p, int64_t m)
{
    if (p <= 0 || m <= 0)
        return -1;
    return (double)(p - 1) / (double)(m + p - 1);
}

zs_status zs_comm_analyze(const zs_model_config *c, const zs_parallel *p,
                          zs_comm_report *o)
{
    zs_status st = zs_parallel_check(c, p);
    if (st != ZS_OK)
        return st;
    memset(o, 0, sizeof *o);
    zs_param_count pc;
    zs_model_params(c, &pc);
    double elem = p->precision == ZS_PREC_FP32 ? 4 : 2;
    double shard = pc.total / (double)(p->tp * p->pp);
    int64_t m = zs_parallel_micro_batches(p);
    o->micro_batches = m;
    o->grad_bytes = shard * elem;
    o->dp_allreduce = zs_ring_allreduce_bytes(o->grad_bytes, p->dp);
    if (p->zero == 3)
        o->zero3_gather = zs_ring_allgather_bytes(shard * elem, p->dp);
    double act = (double)p->micro_batch * (double)p->seq *
                 (double)c->d_model * elem;
    double one = zs_ring_allreduce_bytes(act, p->tp);
    int ar = p->recompute == ZS_RECOMPUTE_FULL ? 6 : 4;
    o->tp_layer = 4 * one;
    o->tp_step = ar * one * (double)zs_parallel_layers_per_stage(c, p) * (double)m;
    o->pp_p2p = p->pp > 1 ? 2 * (double)m * act : 0;
    o->tp_embed = (p->pp > 1 ? 1 : 2) * one * (double)m;
    o->total = o->dp_allreduce + o->zero3_gather + o->tp_step + o->pp_p2p;
    o->bubble_gpipe = zs_pipeline_bubble(p->pp, m);
    o->bubble_1f1b = zs_pipeline_bubble(p->pp, m);
    return ZS_OK;
}
