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

/* ---- safetensors one tensor at a time (src/io/safetensors_stream.c) ---- */

/* A tensor's name (borrowed), dtype and shape, without its data. */
typedef struct zs_tensor_info {
    const char *name;
    zs_dtype dtype;
    int ndim;
    int64_t shape[ZS_MAX_DIMS];
} zs_tensor_info;

/* Writes a safetensors file piece by piece, for a checkpoint never held
 * in memory at once: the same layout and header as zs_safetensors_save
 * (tensors in name order), made atomic as it is. _new writes the header
 * of the n tensors described (infos borrowed during the call) into a
 * temporary file; _put writes nbytes of tensor `name`'s contiguous,
 * little-endian data starting at byte `at` of it; _finish fails unless
 * every byte was put, else fsyncs and renames over path; both _finish and
 * _abort free w, _abort removing the temporary file. NULL / < 0 + error. */
typedef struct zs_safetensors_writer zs_safetensors_writer;
zs_safetensors_writer *zs_safetensors_writer_new(const char *path, int n,
                                                 const zs_tensor_info *infos,
                                                 const char *metadata_json);
zs_status zs_safetensors_writer_put(zs_safetensors_writer *w, const char *name,
                                    size_t at, const void *data, size_t nbytes);
zs_status zs_safetensors_writer_finish(zs_safetensors_writer *w);
void zs_safetensors_writer_abort(zs_safetensors_writer *w);

/* Reads pieces of a safetensors file: _open reads and checks the header
 * only (dtypes, shapes, offsets within the file); _info describes tensor
 * `name` (out->name borrowed from r), _read copies nbytes of its data from
 * byte `at` into dst; _metadata is the __metadata__ object as JSON
 * (borrowed) or NULL. A missing name is ZS_ERR_FORMAT naming the file. */
typedef struct zs_safetensors_reader zs_safetensors_reader;
zs_safetensors_reader *zs_safetensors_open(const char *path);
zs_status zs_safetensors_reader_info(const zs_safetensors_reader *r, const char *name,
                                     zs_tensor_info *out);
zs_status zs_safetensors_reader_read(const zs_safetensors_reader *r, const char *name,
                                     size_t at, void *dst, size_t nbytes);
int zs_safetensors_reader_count(const zs_safetensors_reader *r);
const char *zs_safetensors_reader_metadata(const zs_safetensors_reader *r);
void zs_safetensors_reader_close(zs_safetensors_reader *r);

/* ---- image classification data ------------------------------------- */

typedef struct zs_image_data {
    zs_tensor *images; /* u8 [N, H, W] */
    zs_tensor *labels; /* u8 [N], values < 10 */
} zs_image_data;

/* Loads MNIST-format files from dir: {train,t10k}-images-idx3-ubyte[.gz]
 * and the matching labels. Checks that counts agree and labels are < 10. */
zs_status zs_mnist_load(const char *dir, bool train, zs_image_data *out);
void zs_image_data_free(zs_image_data *d);
/* The first n examples (views), for quick runs and tests. */
zs_status zs_image_data_head(const zs_image_data *d, int64_t n,
                             zs_image_data *out);

/* Batches of (x f32 [B, 1, H, W] normalised as (pixel/255 - mean)/std,
 * y i64 [B]). Epoch e visits a permutation that depends only on (seed, e),
 * so a resumed run sees the same batches. A background thread prepares the
 * next batch while the current one trains. */
typedef struct zs_loader zs_loader;

zs_loader *zs_loader_new(const zs_image_data *d, int64_t batch, bool shuffle,
                         uint64_t seed, float mean, float std);
void zs_loader_free(zs_loader *l);
/* Positions the loader at batch `index` of epoch `epoch`. */
void zs_loader_seek(zs_loader *l, int64_t epoch, int64_t index);
/* Next batch of the current epoch: new references in *x, *y; returns 1 at
 * the end of the epoch (then the loader moves to the next epoch), 0 with a
 * batch, < 0 on error. The last batch of an epoch may be smaller. */
int zs_loader_next(zs_loader *l, zs_tensor **x, zs_tensor **y);
int64_t zs_loader_batches_per_epoch(const zs_loader *l);
int64_t zs_loader_epoch(const zs_loader *l);
int64_t zs_loader_index(const zs_loader *l);

/* ---- plots --------------------------------------------------------------- */

typedef struct zs_plot_series {
    const char *name;
    int panel;          /* which panel (0-based) it is drawn in */
    int64_t n;
    const double *x, *y;
} zs_plot_series;

/* Writes an SVG with npanels side-by-side line charts (titles given),
 * axes scaled to the data, a legend per panel. Non-finite points are
 * skipped. Written atomically (temporary file + rename). */
zs_status zs_svg_plot(const char *path, const char *title, int npanels,
                      const char *const *panel_titles, int nseries,
                      const zs_plot_series *series);

#ifdef __cplusplus
}
#endif
#endif
