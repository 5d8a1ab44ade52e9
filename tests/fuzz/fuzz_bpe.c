/*
 * fuzz_bpe.c - zs_bpe_load (Zhisuan's "zs-bpe 1" text format) on arbitrary
 * bytes; a tokenizer that loads is exercised (fuzz_util.c).
 */
#include "fuzz_util.h"

#include "zs/text.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    zs_bpe *b = zs_bpe_load(zf_file(0, data, size));
    if (b)
        zf_bpe_exercise(b);
    zs_bpe_free(b);
    return 0;
}
