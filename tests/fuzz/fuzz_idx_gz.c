/*
 * fuzz_idx_gz.c - zs_idx_load on the input gzip-compressed here, so that
 * structured IDX headers and data reach the loader's gzip path (fuzzing
 * the compressed bytes directly mostly exercises zlib's checksums).
 */
#include <stdlib.h>

#include "fuzz_util.h"

#include "zs/io.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    size_t n = 0;
    uint8_t *gz = zf_gzip(data, size, &n);
    zs_release(zs_idx_load(zf_file(0, gz, n)));
    free(gz);
    return 0;
}
