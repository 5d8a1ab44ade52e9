/*
 * io/st_internal.h - what safetensors.c shares with safetensors_stream.c:
 * the format's dtype names ("F32", "BF16", ...).
 */
#ifndef ZS_IO_ST_INTERNAL_H
#define ZS_IO_ST_INTERNAL_H

#include "zs/core.h"

/* The safetensors name of dt, or NULL for none. */
const char *zsi_safetensors_dtype_name(zs_dtype dt);
/* The dtype of a safetensors name, or -1. */
int zsi_safetensors_dtype_parse(const char *s);

#endif
