/*
 * zero3.c - ZeRO stage 3 over a GPT (zs/train.h): the parallel layer
 * shards and fetches units without knowing models, nn knows the blocks and
 * their hook; this layer, above both, joins them.
 */
#include <stdlib.h>

#include "zs/train.h"
#include "zs/zero.h"

/* The block hook: a block's unit is gathered before its forward and its
 * backward and dropped after its forward (zero.c drops it after its
 * backward, once its gradients are reduce-scattered). */
static zs_status block_event(void *ctx, int64_t block, zs_gpt_block_event ev)
{
    zs_zero *z = ctx;
    return ev == ZS_GPT_BLOCK_LEAVE ? zs_zero_drop(z, (int)block)
                                    : zs_zero_fetch(z, (int)block);
}

static void unhook(void *gpt) { zs_gpt_set_block_hook(gpt, NULL, NULL); }

zs_zero *zs_zero_new3_module(zs_comm *c, zs_module *m, zs_tensor *flat_params)
{
    const zs_gpt_config *gc = zs_gpt_config_of(m);
    if (!gc) {
        zs_set_error("ZeRO-3: zs_zero_new3_module takes a GPT (its block hook fetches "
                     "the units); for another module use zs_module_units and "
                     "zs_zero_new3");
        return NULL;
    }
    zs_tensor **ps = NULL;
    char **names = NULL;
    int n = zs_module_parameters(m, &ps, &names);
    if (n < 0)
        return NULL;
    int *group = malloc((size_t)(n + 1) * sizeof *group);
    int units = group ? zs_module_units(m, n, ps, group)
                      : zs_set_error_code(ZS_ERR_NOMEM, "ZeRO-3: out of memory");
    if (units >= 0 && units != gc->layers)
        units = zs_set_error("ZeRO-3: the GPT has %lld blocks but %d units",
                             (long long)gc->layers, units);
    zs_zero *z = units >= 0 ? zs_zero_new3(c, n, ps, flat_params, group) : NULL;
    if (z) {
        zs_gpt_set_block_hook(m, block_event, z);
        zs_zero_on_free(z, unhook, m);
    }
    free(group);
    zs_names_free(n, ps, names);
    return z;
}
