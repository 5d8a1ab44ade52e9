/*
 * fuzz_safetensors.c - zs_safetensors_load on arbitrary bytes: the header
 * JSON, offsets, dtypes and shapes all come from the input. A load either
 * fails with a message or returns a set that is freed whole.
 */
#include "fuzz_util.h"

#include "zs/io.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    zs_tensor_set set = {0};
    if (zs_safetensors_load(zf_file(0, data, size), &set) == ZS_OK) {
        for (int i = 0; i < set.n; i++)
            zs_tensor_set_get(&set, set.names[i]);
        zs_tensor_set_free(&set);
    }
    return 0;
}
