/*
 * zs/io.h - files: IDX datasets (MNIST format) and safetensors checkpoints.
 */
#ifndef ZS_IO_H
#define ZS_IO_H

#include "core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Reads an IDX file (plain or gzip-compressed) into a new tensor of the
 * file's element type (u8, i8, i32 (from i16/i32), f32, f64) and shape.
 * Truncated, oversized or malformed files fail with a message naming the
 * file and what was wrong. */
zs_tensor *zs_idx_load(const char *path);

/* A set of named tensors, as read from or written to a safetensors file. */
typedef struct zs_tensor_set {
    int n;
    char **names;          /* owned */
    zs_tensor **tensors;   /* owned references */
    char *metadata_json;   /* owned: the __metadata__ object as JSON, or NULL */
} zs_tensor_set;

/* Writes tensors (contiguous or not) to `path` in the safetensors format
 * (8-byte little-endian header size, JSON header, raw little-endian data)
 * atomically: a temporary file in the same directory, fsync, rename, fsync
 * of the directory. metadata: a JSON object of string values, or NULL.
 * An existing file at path is replaced only once the new one is complete. */
zs_status zs_safetensors_save(const char *path, int n, const char *const *names,
                              zs_tensor *const *tensors,
                              const char *metadata_json);
/* Reads a safetensors file; validates the header (offsets in range, no
 * overlaps, sizes matching dtype x shape). */
zs_status zs_safetensors_load(const char *path, zs_tensor_set *out);
void zs_tensor_set_free(zs_tensor_set *s);
/* Borrowed tensor by name, NULL if absent. */
zs_tensor *zs_tensor_set_get(const zs_tensor_set *s, const char *name);

#ifdef __cplusplus
}
#endif
#endif
