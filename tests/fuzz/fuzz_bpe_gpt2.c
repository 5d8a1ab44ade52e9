/*
 * fuzz_bpe_gpt2.c - zs_bpe_load_gpt2 on two files cut from one input: the
 * bytes before the first 0 byte are encoder.json, those after it vocab.bpe
 * (no 0 byte: an empty vocab.bpe). A tokenizer that loads is exercised.
 */
#include <string.h>

#include "fuzz_util.h"

#include "zs/text.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *cut = memchr(data, 0, size);
    size_t n_enc = cut ? (size_t)(cut - data) : size;
    size_t n_voc = cut ? size - n_enc - 1 : 0;
    const char *enc = zf_file(0, data, n_enc);
    const char *voc = zf_file(1, data + n_enc + (cut ? 1 : 0), n_voc);
    zs_bpe *b = zs_bpe_load_gpt2(enc, voc);
    if (b)
        zf_bpe_exercise(b);
    zs_bpe_free(b);
    return 0;
}
