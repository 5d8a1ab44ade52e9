/*
 * fuzz_idx.c - zs_idx_load on arbitrary bytes: a plain IDX file, or a gzip
 * stream when the bytes start with gzip's magic (the loader decides).
 */
#include "fuzz_util.h"

#include "zs/io.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    zs_release(zs_idx_load(zf_file(0, data, size)));
    return 0;
}
