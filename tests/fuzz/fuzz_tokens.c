/*
 * fuzz_tokens.c - zs_tokens_open on arbitrary bytes; a file that opens is
 * split, batched at its first and last valid window and sampled, which
 * reads tokens at both ends of the mapping.
 */
#include "fuzz_util.h"

#include "zs/text.h"

static void batches(const zs_tokens *t)
{
    const int64_t T = 4;
    zs_tensor *x = NULL, *y = NULL;
    if (t->n < T + 1)
        return;
    int64_t starts[2] = {0, t->n - T - 1};
    if (zs_tokens_batch(t, 2, T, starts, &x, &y) == ZS_OK) {
        zs_release(x);
        zs_release(y);
    }
    if (zs_tokens_sample(t, 2, T, 1, 0, &x, &y) == ZS_OK) {
        zs_release(x);
        zs_release(y);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    zs_tokens all = {0}, train = {0}, val = {0};
    if (zs_tokens_open(zf_file(0, data, size), &all) != ZS_OK)
        return 0;
    batches(&all);
    if (zs_tokens_split(&all, 0.25, &train, &val) == ZS_OK) {
        batches(&train);
        batches(&val);
    }
    zs_tokens_close(&val);
    zs_tokens_close(&train);
    zs_tokens_close(&all);
    return 0;
}
