/*
 * safetensors.c - checkpoints in the safetensors format.
 *
 * File: u64 little-endian N, then N bytes of JSON (padded with spaces to a
 * multiple of 8): {"name": {"dtype": "F32", "shape": [..],
 * "data_offsets": [begin, end]}, ..., "__metadata__": {"k": "v"}}, then the
 * data block; offsets are relative to the start of the data block. Tensors
 * are written in name order, contiguous, little-endian (this code assumes a
 * little-endian host, checked at run time).
 *
 * Saving is atomic: write "<path>.tmp.<pid>", fsync, rename over path,
 * fsync the directory. A crash at any point leaves either the old file or
 * the new one, never a torn one.
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/checked.h"
#include "core/internal.h"
#include "io/fileio.h"
#include "io/st_internal.h"
#include "zs/ops.h"
#include "zs/io.h"
#include "zs/ops.h"

static const char *st_names[ZS_DTYPE_COUNT] = {
    [ZS_F32] = "F32", [ZS_F64] = "F64", [ZS_F16] = "F16", [ZS_BF16] = "BF16",
    [ZS_F8E4M3] = "F8_E4M3", [ZS_F8E5M2] = "F8_E5M2", [ZS_I8] = "I8",
    [ZS_U8] = "U8", [ZS_I32] = "I32", [ZS_I64] = "I64",
};

static int parse_dtype(const char *s)
{
    for (int i = 0; i < ZS_DTYPE_COUNT; i++)
        if (s && st_names[i] && !strcmp(s, st_names[i]))
            return i;
    return -1;
}

const char *zsi_safetensors_dtype_name(zs_dtype dt)
{
    return (unsigned)dt < ZS_DTYPE_COUNT ? st_names[dt] : NULL;
}

int zsi_safetensors_dtype_parse(const char *s) { return parse_dtype(s); }

static bool little_endian(void)
{
    uint16_t x = 1;
    return *(uint8_t *)&x == 1;
}

static int cmp_idx_names(const void *a, const void *b, void *names)
{
    const char *const *nm = names;
    return strcmp(nm[*(const int *)a], nm[*(const int *)b]);
}

static char *build_header(int n, const char *const *names,
                          zs_tensor *const *tensors, const int *order,
                          const char *metadata_json, size_t *len)
{
    cJSON *root = cJSON_CreateObject();
    if (!root)
        return NULL;
    if (metadata_json) {
        cJSON *meta = cJSON_Parse(metadata_json);
        if (!meta || !cJSON_IsObject(meta)) {
            cJSON_Delete(meta);
            cJSON_Delete(root);
            zs_set_error("safetensors: metadata is not a JSON object");
            return NULL;
        }
        cJSON_AddItemToObject(root, "__metadata__", meta);
    }
    size_t off = 0;
    for (int k = 0; k < n; k++) {
        int i = order[k];
        zs_tensor *t = tensors[i];
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "dtype", st_names[t->dtype]);
        cJSON *shape = cJSON_AddArrayToObject(e, "shape");
        for (int d = 0; d < t->ndim; d++)
            cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)t->shape[d]));
        cJSON *offs = cJSON_AddArrayToObject(e, "data_offsets");
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)off));
        off += zs_nbytes(t);
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)off));
        cJSON_AddItemToObject(root, names[i], e);
    }
    char *json = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (!json)
        return NULL;
    size_t l = strlen(json), padded = (l + 7) / 8 * 8;
    char *out = malloc(padded + 1);
    if (out) {
        memcpy(out, json, l);
        memset(out + l, ' ', padded - l);
        out[padded] = '\0';
        *len = padded;
    }
    free(json);
    return out;
}

static zs_status check_inputs(int n, const char *const *names,
                              zs_tensor *const *tensors)
{
    if (!little_endian())
        return zs_set_error_code(ZS_ERR_UNSUPPORTED,
                                 "safetensors: big-endian hosts unsupported");
    for (int i = 0; i < n; i++) {
        if (!names[i] || !names[i][0] || !tensors[i])
            return zs_set_error("safetensors: entry %d has no name or tensor", i);
        if (!strcmp(names[i], "__metadata__"))
            return zs_set_error("safetensors: '__metadata__' is reserved");
        for (int j = 0; j < i; j++)
            if (!strcmp(names[i], names[j]))
                return zs_set_error("safetensors: duplicate name '%s'", names[i]);
    }
    return ZS_OK;
}

static zs_status write_tensor(int fd, zs_tensor *t, const char *path)
{
    if (t->device != ZS_CPU) { /* copied to the host explicitly */
        zsi_tracking_pause();
        zs_no_grad_push();
        zs_tensor *c = zs_contiguous(t);
        zs_tensor *h = zs_to_device(c, ZS_CPU);
        zs_no_grad_pop();
        zsi_tracking_resume();
        zs_status st = h ? write_tensor(fd, h, path) : ZS_ERR_ARG;
        zs_release(c);
        zs_release(h);
        return st;
    }
    if (zs_is_contiguous(t))
        return zsi_write_all(fd, zs_data(t), zs_nbytes(t), path, "safetensors");
    zsi_tracking_pause();
    zs_tensor *c = zsi_new_tensor(t->dtype, t->ndim, t->shape);
    zs_status st = c ? zs_copy_(c, t) : ZS_ERR_NOMEM;
    if (st == ZS_OK)
        st = zsi_write_all(fd, zs_data(c), zs_nbytes(c), path, "safetensors");
    zs_release(c);
    zsi_tracking_resume();
    return st;
}

zs_status zs_safetensors_save(const char *path, int n, const char *const *names,
                              zs_tensor *const *tensors,
                              const char *metadata_json)
{
    if (n < 0 || (n > 0 && (!names || !tensors)))
        return zs_set_error("safetensors: bad tensor list (n = %d)", n);
    zs_status st = check_inputs(n, names, tensors);
    if (st != ZS_OK)
        return st;
    int *order = malloc(((size_t)n + 1) * sizeof *order);
    if (!order)
        return zs_set_error_code(ZS_ERR_NOMEM, "safetensors: out of memory");
    for (int i = 0; i < n; i++)
        order[i] = i;
    qsort_r(order, (size_t)n, sizeof *order, cmp_idx_names, (void *)names);
    size_t hlen = 0;
    char *hdr = build_header(n, names, tensors, order, metadata_json, &hlen);
    if (!hdr) {
        free(order);
        return zs_last_error()[0] ? ZS_ERR_ARG : ZS_ERR_NOMEM;
    }
    size_t tl = strlen(path) + 32;
    char *tmp = malloc(tl);
    int fd = -1;
    if (tmp) {
        snprintf(tmp, tl, "%s.tmp.%d", path, (int)getpid());
        fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    }
    if (fd < 0) {
        st = zs_set_error_code(ZS_ERR_IO, "safetensors: cannot create %s: %s",
                               tmp ? tmp : path, strerror(errno));
        goto out;
    }
    uint64_t len = hlen;
    st = zsi_write_all(fd, &len, 8, tmp, "safetensors");
    if (st == ZS_OK)
        st = zsi_write_all(fd, hdr, hlen, tmp, "safetensors");
    for (int k = 0; k < n && st == ZS_OK; k++)
        st = write_tensor(fd, tensors[order[k]], tmp);
    if (st == ZS_OK && fsync(fd) != 0)
        st = zs_set_error_code(ZS_ERR_IO, "safetensors: fsync %s: %s", tmp,
                               strerror(errno));
    if (close(fd) != 0 && st == ZS_OK)
        st = zs_set_error_code(ZS_ERR_IO, "safetensors: close %s: %s", tmp,
                               strerror(errno));
    if (st == ZS_OK && rename(tmp, path) != 0)
        st = zs_set_error_code(ZS_ERR_IO, "safetensors: rename to %s: %s",
                               path, strerror(errno));
    if (st == ZS_OK)
        zsi_fsync_dir(path);
    else
        unlink(tmp);
out:
    free(tmp);
    free(hdr);
    free(order);
    return st;
}

/* ---- loading ---------------------------------------------------------- */

void zs_tensor_set_free(zs_tensor_set *s)
{
    if (!s)
        return;
    for (int i = 0; i < s->n; i++) {
        free(s->names[i]);
        zs_release(s->tensors[i]);
    }
    free(s->names);
    free(s->tensors);
    free(s->metadata_json);
    memset(s, 0, sizeof *s);
}

zs_tensor *zs_tensor_set_get(const zs_tensor_set *s, const char *name)
{
    for (int i = 0; s && i < s->n; i++)
        if (!strcmp(s->names[i], name))
            return s->tensors[i];
    return NULL;
}

/* Reads a whole regular file. A directory, a FIFO or a device is refused
 * by name before anything is allocated (ftell on a directory gives
 * LONG_MAX). */
static unsigned char *read_file(const char *path, size_t *size)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        zs_set_error_code(ZS_ERR_IO, "safetensors: cannot open %s: %s", path,
                          strerror(errno));
        return NULL;
    }
    struct stat sb;
    unsigned char *buf = NULL;
    if (fstat(fileno(f), &sb) != 0 || !S_ISREG(sb.st_mode)) {
        bool dir = fstat(fileno(f), &sb) == 0 && S_ISDIR(sb.st_mode);
        zs_set_error_code(ZS_ERR_IO, "safetensors: %s is %s, not a checkpoint "
                          "file", path, dir ? "a directory" : "not a regular file");
        fclose(f);
        return NULL;
    }
    size_t n = (size_t)sb.st_size;
    buf = malloc(n + 1);
    if (buf && fread(buf, 1, n, f) != n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (!buf)
        zs_set_error_code(ZS_ERR_IO, "safetensors: cannot read %s (%zu bytes)",
                          path, n);
    *size = n;
    return buf;
}

typedef struct span {
    uint64_t b, e;
} span;

static int cmp_span(const void *a, const void *b)
{
    const span *x = a, *y = b;
    return x->b < y->b ? -1 : x->b > y->b;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* A JSON number that is an integer in [0, 2^53]: sizes and offsets. */
static bool json_count(const cJSON *v, uint64_t *out)
{
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0) ||
        v->valuedouble > (double)ZSI_MAX_NUMEL ||
        v->valuedouble != (double)(int64_t)v->valuedouble)
        return false;
    *out = (uint64_t)v->valuedouble;
    return true;
}

/* Validates one header entry and makes its tensor. */
static zs_status load_entry(const char *path, cJSON *e, const unsigned char *data,
                            uint64_t dsize, zs_tensor **out, span *sp)
{
    const char *name = e->string;
    cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    cJSON *shape = cJSON_GetObjectItemCaseSensitive(e, "shape");
    cJSON *offs = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    int dtype = cJSON_IsString(dt) ? parse_dtype(dt->valuestring) : -1;
    if (dtype < 0 || !cJSON_IsArray(shape) || !cJSON_IsArray(offs) ||
        cJSON_GetArraySize(offs) != 2 || cJSON_GetArraySize(shape) > ZS_MAX_DIMS)
        return zs_set_error_code(ZS_ERR_FORMAT, "safetensors: %s: entry '%s' "
                                 "has a bad dtype, shape or data_offsets",
                                 path, name);
    int64_t sh[ZS_MAX_DIMS];
    int nd = cJSON_GetArraySize(shape);
    for (int d = 0; d < nd; d++) {
        uint64_t v;
        if (!json_count(cJSON_GetArrayItem(shape, d), &v))
            return zs_set_error_code(ZS_ERR_FORMAT, "safetensors: %s: entry "
                                     "'%s' has a bad shape (sizes must be "
                                     "integers >= 0)", path, name);
        sh[d] = (int64_t)v;
    }
    size_t need;
    if (!zsi_shape_bytes_checked(nd, sh, zs_dtype_size(dtype), &need))
        return zs_set_error_code(ZS_ERR_FORMAT, "safetensors: %s: entry '%s' "
                                 "has a shape too large to address", path, name);
    uint64_t b, en;
    if (!json_count(cJSON_GetArrayItem(offs, 0), &b) ||
        !json_count(cJSON_GetArrayItem(offs, 1), &en))
        return zs_set_error_code(ZS_ERR_FORMAT, "safetensors: %s: entry '%s' "
                                 "data_offsets must be two integers >= 0",
                                 path, name);
    if (en < b || en > dsize || en - b != need)
        return zs_set_error_code(ZS_ERR_FORMAT, "safetensors: %s: entry '%s' "
                                 "data_offsets [%llu, %llu] do not match its "
                                 "%zu bytes within %llu bytes of data", path,
                                 name, (unsigned long long)b,
                                 (unsigned long long)en, need,
                                 (unsigned long long)dsize);
    sp->b = b;
    sp->e = en;
    *out = zsi_new_tensor(dtype, nd, sh);
    if (!*out)
        return ZS_ERR_NOMEM;
    memcpy(zs_data(*out), data + b, need);
    return ZS_OK;
}

/* After loading: no two tensors share a name, no two share bytes. */
static zs_status check_unique(const char *path, zs_tensor_set *out, span *spans)
{
    int n = out->n;
    char **names = malloc(((size_t)n + 1) * sizeof *names);
    if (!names)
        return zs_set_error_code(ZS_ERR_NOMEM, "safetensors: out of memory");
    memcpy(names, out->names, (size_t)n * sizeof *names);
    qsort(names, (size_t)n, sizeof *names, cmp_str);
    zs_status st = ZS_OK;
    for (int i = 1; st == ZS_OK && i < n; i++)
        if (!strcmp(names[i], names[i - 1]))
            st = zs_set_error_code(ZS_ERR_FORMAT, "safetensors: %s: tensor "
                                   "'%s' appears twice in the header", path,
                                   names[i]);
    free(names);
    qsort(spans, (size_t)n, sizeof *spans, cmp_span);
    for (int i = 1; st == ZS_OK && i < n; i++)
        if (spans[i].b < spans[i - 1].e)
            st = zs_set_error_code(ZS_ERR_FORMAT, "safetensors: %s: tensors "
                                   "overlap in the data block", path);
    return st;
}

static zs_status parse_set(const char *path, cJSON *root, const unsigned char *data,
                           uint64_t dsize, zs_tensor_set *out)
{
    int count = cJSON_GetArraySize(root);
    out->names = calloc((size_t)count + 1, sizeof *out->names);
    out->tensors = calloc((size_t)count + 1, sizeof *out->tensors);
    span *spans = calloc((size_t)count + 1, sizeof *spans);
    zs_status st = (out->names && out->tensors && spans) ? ZS_OK : ZS_ERR_NOMEM;
    if (st != ZS_OK)
        zs_set_error_code(st, "safetensors: out of memory");
    cJSON *e;
    cJSON_ArrayForEach(e, root) {
        if (st != ZS_OK)
            break;
        if (!strcmp(e->string, "__metadata__")) {
            if (out->metadata_json || !cJSON_IsObject(e)) {
                st = zs_set_error_code(ZS_ERR_FORMAT, "safetensors: %s: "
                                       "__metadata__ %s", path,
                                       out->metadata_json ? "appears twice"
                                                          : "is not an object");
                break;
            }
            out->metadata_json = cJSON_PrintUnformatted(e);
            if (!out->metadata_json)
                st = zs_set_error_code(ZS_ERR_NOMEM, "safetensors: out of memory");
            continue;
        }
        if (!cJSON_IsObject(e)) {
            st = zs_set_error_code(ZS_ERR_FORMAT, "safetensors: %s: entry '%s' "
                                   "is not an object", path, e->string);
            break;
        }
        st = load_entry(path, e, data, dsize, &out->tensors[out->n],
                        &spans[out->n]);
        if (st == ZS_OK) {
            out->names[out->n] = strdup(e->string);
            if (!out->names[out->n])
                st = zs_set_error_code(ZS_ERR_NOMEM, "safetensors: out of memory");
            out->n++; /* the tensor is owned by out either way */
        }
    }
    if (st == ZS_OK)
        st = check_unique(path, out, spans);
    free(spans);
    return st;
}

zs_status zs_safetensors_load(const char *path, zs_tensor_set *out)
{
    memset(out, 0, sizeof *out);
    size_t size = 0;
    unsigned char *buf = read_file(path, &size);
    if (!buf)
        return ZS_ERR_IO;
    zs_status st = ZS_OK;
    uint64_t hlen = 0;
    if (size < 8 || (memcpy(&hlen, buf, 8), hlen > size - 8)) {
        st = zs_set_error_code(ZS_ERR_FORMAT, "safetensors: %s is truncated or "
                               "not a safetensors file (size %zu, header "
                               "length %llu)", path, size,
                               (unsigned long long)hlen);
        free(buf);
        return st;
    }
    cJSON *root = cJSON_ParseWithLength((const char *)buf + 8, (size_t)hlen);
    if (!root || !cJSON_IsObject(root)) {
        st = zs_set_error_code(ZS_ERR_FORMAT, "safetensors: %s: header is not "
                               "a JSON object", path);
    } else {
        zsi_tracking_pause();
        st = parse_set(path, root, buf + 8 + hlen, size - 8 - hlen, out);
        zsi_tracking_resume();
    }
    cJSON_Delete(root);
    free(buf);
    if (st != ZS_OK)
        zs_tensor_set_free(out);
    return st;
}
