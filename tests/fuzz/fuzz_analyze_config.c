/*
 * fuzz_analyze_config.c - zs_model_config_parse_json on arbitrary text; a
 * config that parses goes through what `zs analyze --config` computes from
 * it (apps/zs/analyze.c: parameters, block operators, training FLOPs,
 * memory, communication, the engine's FLOP count) for a few batch,
 * sequence and parallel layouts, so that products of large sizes are
 * reached with every formula.
 */
#include <stdlib.h>

#include "fuzz_util.h"

#include "zs/analyze.h"

static void analyze(const zs_model_config *c, const zs_parallel *p)
{
    zs_param_count pc;
    zs_op_cost ops[ZS_BLOCK_MAX_OPS];
    zs_train_flops tf;
    zs_memory_report mem;
    zs_comm_report comm;
    zs_engine_flops ef;
    zs_model_params(c, &pc);
    zs_block_ops(c, p->micro_batch, p->seq, 2, ops);
    zs_block_matmul_flops(c, p->micro_batch, p->seq);
    zs_analyze_step_flops(c, p->batch, p->seq);
    zs_analyze_engine_step_flops(c, p->batch, p->seq, &ef);
    for (int rc = ZS_RECOMPUTE_NONE; rc <= ZS_RECOMPUTE_FULL; rc++) {
        zs_train_flops_compute(c, p->batch, p->seq, (zs_recompute)rc, &tf);
        zs_activation_bytes_layer(c, p->micro_batch, p->seq, p->tp, (zs_recompute)rc);
    }
    if (zs_parallel_check(c, p) != ZS_OK)
        return;
    if (zs_memory_analyze(c, p, &mem) == ZS_OK) {
        zs_min_devices(mem.fp32.total, 80e9);
        zs_min_devices(mem.mixed.total, 80e9);
    }
    zs_comm_analyze(c, p, &comm);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = zf_cstr(data, size);
    zs_model_config c;
    if (zs_model_config_parse_json(text, &c) == ZS_OK) {
        /* zs analyze's defaults, a large batch, and a 3-D layout with ZeRO */
        zs_parallel layouts[] = {
            {.batch = 1, .micro_batch = 1, .seq = c.seq_len, .dp = 1, .tp = 1, .pp = 1,
             .precision = ZS_PREC_MIXED},
            {.batch = 4096, .micro_batch = 4, .seq = 1 << 20, .dp = 8, .tp = 1, .pp = 1,
             .zero = 3, .offload = true, .precision = ZS_PREC_FP32},
            {.batch = 64, .micro_batch = 2, .seq = 2048, .dp = 2, .tp = 2, .pp = 4,
             .zero = 1, .recompute = ZS_RECOMPUTE_SELECTIVE, .precision = ZS_PREC_MIXED},
        };
        for (size_t i = 0; i < sizeof layouts / sizeof *layouts; i++)
            analyze(&c, &layouts[i]);
    }
    free(text);
    return 0;
}
