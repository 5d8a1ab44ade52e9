/*
 * fuzz_ckpt_quant.c - zs_llm_open on arbitrary bytes: a quantized GPT
 * checkpoint (zs quantize) whose config, formats, block scales and shapes
 * all come from the input. A model that loads computes the logits of two
 * tokens, so a tensor that slipped through the checks shows up here.
 */
#include <stdlib.h>

#include "fuzz_util.h"

#include "zs/infer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    zs_llm *m = zs_llm_open(zf_file(0, data, size), NULL, NULL);
    if (m) {
        const zs_gpt_config *c = zs_llm_config(m);
        int32_t tok[2] = {0, (int32_t)(c->vocab - 1)};
        int64_t n = c->ctx < 2 ? c->ctx : 2;
        float *lg = c->vocab <= 100000 ? malloc((size_t)(n * c->vocab) * sizeof *lg) : NULL;
        if (lg)
            zs_llm_logits(m, tok, n, lg);
        free(lg);
        zs_llm_free(m);
    }
    return 0;
}
