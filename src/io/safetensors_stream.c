/*
 * safetensors_stream.c - safetensors files one tensor (or one piece of a
 * tensor) at a time, for checkpoints too large to hold in memory at once
 * (model parallelism writes the one-process layout from shards gathered
 * tensor by tensor, and each rank reads back only the tensors it holds).
 *
 * The writer lays the file out exactly as zs_safetensors_save does (the
 * tensors in name order, the same header), so either reader reads either
 * file: the header is written first from the tensors' names, dtypes and
 * shapes, then each piece is written at its offset (pwrite), and _finish
 * makes the file durable and renames it over path (atomic, as
 * safetensors.c). The reader parses and checks the header only (offsets
 * in range and matching dtype x shape) and reads pieces with pread.
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/checked.h"
#include "io/fileio.h"
#include "io/st_internal.h"
#include "zs/io.h"

typedef struct entry {
    char *name;
    zs_dtype dtype;
    int ndim;
    int64_t shape[ZS_MAX_DIMS];
    uint64_t begin, nbytes; /* within the data block */
} entry;

/* n entries, and the data block's start in the file. */
typedef struct table {
    int n;
    entry *e;
    uint64_t data_at, data_size;
} table;

static void table_free(table *t)
{
    for (int i = 0; t->e && i < t->n; i++)
        free(t->e[i].name);
    free(t->e);
    memset(t, 0, sizeof *t);
}

static const entry *table_find(const table *t, const char *name)
{
    for (int i = 0; i < t->n; i++)
        if (!strcmp(t->e[i].name, name))
            return &t->e[i];
    return NULL;
}

static int cmp_entry(const void *a, const void *b)
{
    return strcmp(((const entry *)a)->name, ((const entry *)b)->name);
}

/* ---- writing ----------------------------------------------------------- */

struct zs_safetensors_writer {
    char *path, *tmp;
    int fd;
    table t;
    uint64_t put; /* bytes written into the data block so far */
};

/* The entries of infos, checked, sorted by name, with their offsets. */
static zs_status writer_table(int n, const zs_tensor_info *infos, table *t)
{
    if (n < 0 || (n > 0 && !infos))
        return zs_set_error("safetensors writer: bad tensor list (n = %d)", n);
    t->e = calloc((size_t)n + 1, sizeof *t->e);
    if (!t->e)
        return zs_set_error_code(ZS_ERR_NOMEM, "safetensors writer: out of memory");
    for (int i = 0; i < n; i++, t->n++) {
        const zs_tensor_info *f = &infos[i];
        size_t bytes;
        if (!f->name || !f->name[0] || !strcmp(f->name, "__metadata__") ||
            !zsi_safetensors_dtype_name(f->dtype) || f->ndim < 0 || f->ndim > ZS_MAX_DIMS ||
            !zsi_shape_bytes_checked(f->ndim, f->shape, zs_dtype_size(f->dtype), &bytes))
            return zs_set_error("safetensors writer: entry %d ('%s') has no name, a "
                                "reserved one, or a bad dtype or shape", i,
                                f->name ? f->name : "");
        if (table_find(t, f->name))
            return zs_set_error("safetensors writer: duplicate name '%s'", f->name);
        entry *e = &t->e[i];
        if (!(e->name = strdup(f->name)))
            return zs_set_error_code(ZS_ERR_NOMEM, "safetensors writer: out of memory");
        e->dtype = f->dtype, e->ndim = f->ndim, e->nbytes = bytes;
        memcpy(e->shape, f->shape, sizeof e->shape);
    }
    qsort(t->e, (size_t)n, sizeof *t->e, cmp_entry);
    for (int i = 0; i < n; i++) {
        t->e[i].begin = t->data_size;
        t->data_size += t->e[i].nbytes;
    }
    return ZS_OK;
}

/* The header as zs_safetensors_save writes it (padded to 8 bytes). */
static char *writer_header(const table *t, const char *metadata_json, size_t *len)
{
    cJSON *root = cJSON_CreateObject();
    if (metadata_json && root) {
        cJSON *meta = cJSON_Parse(metadata_json);
        if (!meta || !cJSON_IsObject(meta)) {
            cJSON_Delete(meta);
            cJSON_Delete(root);
            zs_set_error("safetensors writer: metadata is not a JSON object");
            return NULL;
        }
        cJSON_AddItemToObject(root, "__metadata__", meta);
    }
    for (int i = 0; root && i < t->n; i++) {
        const entry *e = &t->e[i];
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "dtype", zsi_safetensors_dtype_name(e->dtype));
        cJSON *shape = cJSON_AddArrayToObject(o, "shape");
        for (int d = 0; d < e->ndim; d++)
            cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)e->shape[d]));
        cJSON *offs = cJSON_AddArrayToObject(o, "data_offsets");
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)e->begin));
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)(e->begin + e->nbytes)));
        cJSON_AddItemToObject(root, e->name, o);
    }
    char *json = root ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    size_t l = json ? strlen(json) : 0, padded = (l + 7) / 8 * 8;
    char *out = json ? malloc(padded + 1) : NULL;
    if (out) {
        memcpy(out, json, l);
        memset(out + l, ' ', padded - l);
        out[padded] = '\0';
        *len = padded;
    } else {
        zs_set_error_code(ZS_ERR_NOMEM, "safetensors writer: out of memory");
    }
    free(json);
    return out;
}

static zs_status pwrite_all(int fd, const void *buf, size_t n, uint64_t at, const char *path)
{
    const char *p = buf;
    while (n > 0) {
        ssize_t k = pwrite(fd, p, n, (off_t)at);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return zs_set_error_code(ZS_ERR_IO, "safetensors writer: writing %s: %s",
                                     path, k < 0 ? strerror(errno) : "no progress");
        p += k, n -= (size_t)k, at += (uint64_t)k;
    }
    return ZS_OK;
}

zs_safetensors_writer *zs_safetensors_writer_new(const char *path, int n,
                                                 const zs_tensor_info *infos,
                                                 const char *metadata_json)
{
    zs_safetensors_writer *w = path ? calloc(1, sizeof *w) : NULL;
    if (!w) {
        zs_set_error_code(path ? ZS_ERR_NOMEM : ZS_ERR_ARG,
                          "safetensors writer: %s", path ? "out of memory" : "no path");
        return NULL;
    }
    w->fd = -1;
    size_t hlen = 0, tl = strlen(path) + 32;
    char *hdr = NULL;
    zs_status st = writer_table(n, infos, &w->t);
    if (st == ZS_OK && !(hdr = writer_header(&w->t, metadata_json, &hlen)))
        st = ZS_ERR_ARG;
    if (st == ZS_OK && (!(w->path = strdup(path)) || !(w->tmp = malloc(tl))))
        st = zs_set_error_code(ZS_ERR_NOMEM, "safetensors writer: out of memory");
    if (st == ZS_OK) {
        snprintf(w->tmp, tl, "%s.tmp.%d", path, (int)getpid());
        if ((w->fd = open(w->tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644)) < 0)
            st = zs_set_error_code(ZS_ERR_IO, "safetensors writer: cannot create %s: %s",
                                   w->tmp, strerror(errno));
    }
    uint64_t len = hlen;
    if (st == ZS_OK)
        st = zsi_write_all(w->fd, &len, 8, w->tmp, "safetensors");
    if (st == ZS_OK)
        st = zsi_write_all(w->fd, hdr, hlen, w->tmp, "safetensors");
    w->t.data_at = 8 + hlen;
    if (st == ZS_OK && ftruncate(w->fd, (off_t)(w->t.data_at + w->t.data_size)) != 0)
        st = zs_set_error_code(ZS_ERR_IO, "safetensors writer: sizing %s: %s", w->tmp,
                               strerror(errno));
    free(hdr);
    if (st != ZS_OK) {
        zs_safetensors_writer_abort(w);
        return NULL;
    }
    return w;
}

zs_status zs_safetensors_writer_put(zs_safetensors_writer *w, const char *name,
                                    size_t at, const void *data, size_t nbytes)
{
    const entry *e = w && name ? table_find(&w->t, name) : NULL;
    if (!e)
        return zs_set_error("safetensors writer: no tensor '%s' in the file",
                            name ? name : "(null)");
    if (at > e->nbytes || nbytes > e->nbytes - at)
        return zs_set_error("safetensors writer: '%s' has %llu bytes, not [%zu, %zu)",
                            name, (unsigned long long)e->nbytes, at, at + nbytes);
    zs_status st = pwrite_all(w->fd, data, nbytes, w->t.data_at + e->begin + at, w->tmp);
    if (st == ZS_OK)
        w->put += nbytes;
    return st;
}

zs_status zs_safetensors_writer_finish(zs_safetensors_writer *w)
{
    if (!w)
        return zs_set_error("safetensors writer: none");
    zs_status st = ZS_OK;
    if (w->put != w->t.data_size)
        st = zs_set_error("safetensors writer: %s: %llu of %llu data bytes written",
                          w->path, (unsigned long long)w->put,
                          (unsigned long long)w->t.data_size);
    if (st == ZS_OK && fsync(w->fd) != 0)
        st = zs_set_error_code(ZS_ERR_IO, "safetensors writer: fsync %s: %s", w->tmp,
                               strerror(errno));
    int fd = w->fd;
    w->fd = -1;
    if (close(fd) != 0 && st == ZS_OK)
        st = zs_set_error_code(ZS_ERR_IO, "safetensors writer: close %s: %s", w->tmp,
                               strerror(errno));
    if (st == ZS_OK && rename(w->tmp, w->path) != 0)
        st = zs_set_error_code(ZS_ERR_IO, "safetensors writer: rename to %s: %s",
                               w->path, strerror(errno));
    if (st == ZS_OK) {
        zsi_fsync_dir(w->path);
        free(w->tmp); /* nothing left to remove */
        w->tmp = NULL;
    }
    zs_safetensors_writer_abort(w);
    return st;
}

void zs_safetensors_writer_abort(zs_safetensors_writer *w)
{
    if (!w)
        return;
    if (w->fd >= 0)
        close(w->fd);
    if (w->tmp)
        unlink(w->tmp);
    table_free(&w->t);
    free(w->tmp);
    free(w->path);
    free(w);
}

/* ---- reading ----------------------------------------------------------- */

struct zs_safetensors_reader {
    char *path;
    int fd;
    table t;
    char *meta; /* the __metadata__ object as JSON, or NULL */
};

/* A JSON number that is an integer in [0, 2^53]. */
static bool count_of(const cJSON *v, uint64_t *out)
{
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0) ||
        v->valuedouble > (double)ZSI_MAX_NUMEL ||
        v->valuedouble != (double)(int64_t)v->valuedouble)
        return false;
    *out = (uint64_t)v->valuedouble;
    return true;
}

/* One header entry into e; false when malformed. */
static bool parse_entry(const cJSON *o, uint64_t data_size, entry *e)
{
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(o, "dtype");
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(o, "shape");
    const cJSON *offs = cJSON_GetObjectItemCaseSensitive(o, "data_offsets");
    int dtype = cJSON_IsString(dt) ? zsi_safetensors_dtype_parse(dt->valuestring) : -1;
    if (dtype < 0 || !cJSON_IsArray(shape) || !cJSON_IsArray(offs) ||
        cJSON_GetArraySize(offs) != 2 || cJSON_GetArraySize(shape) > ZS_MAX_DIMS)
        return false;
    e->dtype = (zs_dtype)dtype;
    e->ndim = cJSON_GetArraySize(shape);
    for (int d = 0; d < e->ndim; d++) {
        uint64_t v;
        if (!count_of(cJSON_GetArrayItem(shape, d), &v))
            return false;
        e->shape[d] = (int64_t)v;
    }
    size_t need;
    uint64_t b, en;
    return zsi_shape_bytes_checked(e->ndim, e->shape, zs_dtype_size(e->dtype), &need) &&
           count_of(cJSON_GetArrayItem(offs, 0), &b) &&
           count_of(cJSON_GetArrayItem(offs, 1), &en) && en >= b && en <= data_size &&
           en - b == need && (e->begin = b, e->nbytes = need, true);
}

static zs_status reader_parse(zs_safetensors_reader *r, const char *hdr, uint64_t hlen,
                              uint64_t data_size)
{
    cJSON *root = cJSON_ParseWithLength(hdr, (size_t)hlen);
    zs_status st = cJSON_IsObject(root) ? ZS_OK
                   : zs_set_error_code(ZS_ERR_FORMAT, "safetensors: %s: header is "
                                       "not a JSON object", r->path);
    int count = st == ZS_OK ? cJSON_GetArraySize(root) : 0;
    if (st == ZS_OK && !(r->t.e = calloc((size_t)count + 1, sizeof *r->t.e)))
        st = zs_set_error_code(ZS_ERR_NOMEM, "safetensors: out of memory");
    const cJSON *o;
    cJSON_ArrayForEach(o, root) {
        if (st != ZS_OK)
            break;
        if (!strcmp(o->string, "__metadata__")) {
            if (r->meta || !cJSON_IsObject(o) || !(r->meta = cJSON_PrintUnformatted(o)))
                st = zs_set_error_code(ZS_ERR_FORMAT, "safetensors: %s: bad "
                                       "__metadata__", r->path);
            continue;
        }
        entry *e = &r->t.e[r->t.n];
        if (table_find(&r->t, o->string) || !parse_entry(o, data_size, e) ||
            !(e->name = strdup(o->string)))
            st = zs_set_error_code(ZS_ERR_FORMAT, "safetensors: %s: entry '%s' is "
                                   "repeated or has a bad dtype, shape or data_offsets",
                                   r->path, o->string);
        else
            r->t.n++;
    }
    cJSON_Delete(root);
    return st;
}

zs_safetensors_reader *zs_safetensors_open(const char *path)
{
    zs_safetensors_reader *r = path ? calloc(1, sizeof *r) : NULL;
    if (!r || !(r->path = strdup(path))) {
        free(r);
        zs_set_error_code(ZS_ERR_NOMEM, "safetensors: %s", path ? "out of memory" : "no path");
        return NULL;
    }
    struct stat sb;
    uint64_t hlen = 0;
    char *hdr = NULL;
    zs_status st = ZS_OK;
    r->fd = open(path, O_RDONLY);
    if (r->fd < 0 || fstat(r->fd, &sb) != 0 || !S_ISREG(sb.st_mode))
        st = zs_set_error_code(ZS_ERR_IO, "safetensors: cannot open %s: %s", path,
                               r->fd < 0 ? strerror(errno) : "not a regular file");
    uint64_t size = st == ZS_OK ? (uint64_t)sb.st_size : 0;
    if (st == ZS_OK && (size < 8 || pread(r->fd, &hlen, 8, 0) != 8 || hlen > size - 8))
        st = zs_set_error_code(ZS_ERR_FORMAT, "safetensors: %s is truncated or not a "
                               "safetensors file (size %llu)", path,
                               (unsigned long long)size);
    if (st == ZS_OK && !(hdr = malloc(hlen + 1)))
        st = zs_set_error_code(ZS_ERR_NOMEM, "safetensors: out of memory");
    if (st == ZS_OK && pread(r->fd, hdr, hlen, 8) != (ssize_t)hlen)
        st = zs_set_error_code(ZS_ERR_IO, "safetensors: reading %s's header", path);
    if (st == ZS_OK) {
        r->t.data_at = 8 + hlen;
        r->t.data_size = size - 8 - hlen;
        st = reader_parse(r, hdr, hlen, r->t.data_size);
    }
    free(hdr);
    if (st != ZS_OK) {
        zs_safetensors_reader_close(r);
        return NULL;
    }
    return r;
}

zs_status zs_safetensors_reader_info(const zs_safetensors_reader *r, const char *name,
                                     zs_tensor_info *out)
{
    const entry *e = r && name ? table_find(&r->t, name) : NULL;
    if (!e)
        return zs_set_error_code(ZS_ERR_FORMAT, "checkpoint: %s has no tensor '%s' "
                                 "(written for another model?)", r ? r->path : "?",
                                 name ? name : "(null)");
    out->name = e->name;
    out->dtype = e->dtype;
    out->ndim = e->ndim;
    memcpy(out->shape, e->shape, sizeof out->shape);
    return ZS_OK;
}

zs_status zs_safetensors_reader_read(const zs_safetensors_reader *r, const char *name,
                                     size_t at, void *dst, size_t nbytes)
{
    const entry *e = r && name ? table_find(&r->t, name) : NULL;
    if (!e)
        return zs_set_error_code(ZS_ERR_FORMAT, "checkpoint: %s has no tensor '%s'",
                                 r ? r->path : "?", name ? name : "(null)");
    if (at > e->nbytes || nbytes > e->nbytes - at)
        return zs_set_error("safetensors: '%s' has %llu bytes, not [%zu, %zu)", name,
                            (unsigned long long)e->nbytes, at, at + nbytes);
    char *p = dst;
    uint64_t off = r->t.data_at + e->begin + at;
    while (nbytes > 0) {
        ssize_t k = pread(r->fd, p, nbytes, (off_t)off);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return zs_set_error_code(ZS_ERR_IO, "safetensors: reading %s: %s", r->path,
                                     k < 0 ? strerror(errno) : "truncated");
        p += k, nbytes -= (size_t)k, off += (uint64_t)k;
    }
    return ZS_OK;
}

int zs_safetensors_reader_count(const zs_safetensors_reader *r) { return r ? r->t.n : 0; }

const char *zs_safetensors_reader_metadata(const zs_safetensors_reader *r)
{
    return r ? r->meta : NULL;
}

void zs_safetensors_reader_close(zs_safetensors_reader *r)
{
    if (!r)
        return;
    if (r->fd >= 0)
        close(r->fd);
    table_free(&r->t);
    free(r->meta);
    free(r->path);
    free(r);
}
