/*
 * fuzz_ckpt_lenet.c - zs_module_load of arbitrary bytes into a LeNet-5,
 * without and with an Adam optimizer (whose state the file must then hold
 * under "optim.*"). The model and optimizer are built once: a load changes
 * them completely or not at all, so what one input leaves is as good a
 * start as a fresh model for the next.
 */
#include <stdlib.h>

#include "fuzz_util.h"

#include "zs/nn.h"
#include "zs/optim.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static zs_module *m;
    static zs_optim *o;
    if (!m) {
        zs_tensor *fp = NULL, *fg = NULL;
        zs_optim_config oc = {.kind = ZS_ADAM, .lr = 1e-3};
        if (!(m = zs_lenet5_new(1)) || zs_module_flatten(m, &fp, &fg) != ZS_OK ||
            !(o = zs_optim_new(&oc, 1, &fp)))
            abort();
    }
    const char *path = zf_file(0, data, size);
    char *meta = NULL;
    if (zs_module_load(path, m, NULL, &meta) == ZS_OK) {
        free(meta);
        meta = NULL;
        zs_module_load(path, m, o, &meta);
    }
    free(meta);
    return 0;
}
