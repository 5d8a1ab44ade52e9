/*
 * fuzz_ckpt_gpt.c - zs_gpt_load on arbitrary bytes: the GPT's shape comes
 * from the checkpoint's metadata and must agree with its tensors before
 * anything is allocated. A model that loads runs one forward pass of two
 * tokens, so a config that slipped through the checks shows up here.
 */
#include <stdlib.h>

#include "fuzz_util.h"

#include "zs/nn.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *meta = NULL;
    zs_module *m = zs_gpt_load(zf_file(0, data, size), &meta);
    if (m) {
        zs_tensor *idx = zs_zeros(ZS_I64, ZS_SHAPE(1, 2));
        zs_release(zs_gpt_logits(m, idx));
        zs_release(idx);
        zs_module_free(m);
    }
    free(meta);
    return 0;
}
