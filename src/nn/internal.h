/*
 * nn/internal.h - helpers shared inside the nn layer (zsi_ prefix).
 */
#ifndef ZS_NN_INTERNAL_H
#define ZS_NN_INTERNAL_H

#include "zs/io.h"
#include "zs/nn.h"
#include "zs/optim.h"

/* zs_module_load on a set already read from path (named in messages):
 * checks every tensor of m (and o, when given) against set, then copies;
 * all or nothing. Borrows set. */
zs_status zsi_module_state_apply(const char *path, const zs_tensor_set *set,
                               zs_module *m, zs_optim *o, char **metadata_json);

#endif
