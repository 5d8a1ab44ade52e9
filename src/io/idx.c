/*
 * idx.c - IDX files (the MNIST / Fashion-MNIST format), gzip or plain.
 *
 * Layout: two zero bytes, a type code (0x08 u8, 0x09 i8, 0x0B i16,
 * 0x0C i32, 0x0D f32, 0x0E f64), the number of dims, then each dim as a
 * big-endian u32, then the data, big-endian. zlib's gzread reads plain files
 * too, so one path serves both.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "core/checked.h"
#include "core/internal.h"
#include "zs/io.h"

static zs_status read_exact(gzFile f, void *buf, size_t n, const char *path,
                            const char *what)
{
    size_t got = 0;
    while (got < n) {
        unsigned chunk = n - got > (1u << 30) ? (1u << 30) : (unsigned)(n - got);
        int r = gzread(f, (char *)buf + got, chunk);
        if (r < 0) {
            int e;
            const char *msg = gzerror(f, &e);
            return zs_set_error_code(ZS_ERR_FORMAT, "idx: %s: reading %s failed (truncated or corrupt): %s",
                                     path, what, msg);
        }
        if (r == 0)
            return zs_set_error_code(ZS_ERR_FORMAT, "idx: %s is truncated: "
                                     "expected %zu bytes of %s, got %zu",
                                     path, n, what, got);
        got += (size_t)r;
    }
    return ZS_OK;
}

static void swap_bytes(void *data, int64_t n, size_t es)
{
    unsigned char *p = data;
    for (int64_t i = 0; i < n; i++, p += es)
        for (size_t a = 0, b = es - 1; a < b; a++, b--) {
            unsigned char t = p[a];
            p[a] = p[b];
            p[b] = t;
        }
}

/* Reads exactly n bytes of data into a malloc'd buffer that grows as the
 * bytes arrive (1 MiB first, then doubling), so a header that declares far
 * more than the file holds (a 16-byte file claiming 20 GB, or a gzip
 * stream whose size is not known before it is inflated) costs at most
 * twice what is really there before the "truncated" error. */
static unsigned char *read_data(gzFile f, size_t n, const char *path)
{
    size_t cap = n < (1u << 20) ? n : (1u << 20), got = 0;
    unsigned char *buf = malloc(cap + 1);
    while (buf && got < n) {
        if (got == cap) {
            cap = cap > n / 2 ? n : 2 * cap;
            unsigned char *nb = realloc(buf, cap + 1);
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
        }
        if (read_exact(f, buf + got, cap - got, path, "data") != ZS_OK) {
            char why[512];
            snprintf(why, sizeof why, "%s", zs_last_error());
            zs_set_error_code(ZS_ERR_FORMAT, "%s (at byte %zu of the %zu bytes "
                              "of data the header declares)", why, got, n);
            free(buf);
            return NULL;
        }
        got = cap;
    }
    if (!buf)
        zs_set_error_code(ZS_ERR_NOMEM, "idx: %s: out of memory for %zu bytes",
                          path, n);
    return buf;
}

/* Header: magic, type code and dims. Fills dt, es (bytes per element in
 * the file), ndim and shape. */
static zs_status read_header(gzFile f, const char *path, zs_dtype *dt,
                             size_t *es, int *ndim, int64_t *shape)
{
    unsigned char hdr[4];
    zs_status st = read_exact(f, hdr, 4, path, "header");
    if (st != ZS_OK)
        return st;
    switch (hdr[2]) {
    case 0x08: *dt = ZS_U8; *es = 1; break;
    case 0x09: *dt = ZS_I8; *es = 1; break;
    case 0x0B: *dt = ZS_I32; *es = 2; break; /* widened below */
    case 0x0C: *dt = ZS_I32; *es = 4; break;
    case 0x0D: *dt = ZS_F32; *es = 4; break;
    case 0x0E: *dt = ZS_F64; *es = 8; break;
    default:
        return zs_set_error_code(ZS_ERR_FORMAT, "idx: %s: unknown type code "
                                 "0x%02x (not an IDX file?)", path, hdr[2]);
    }
    *ndim = hdr[3];
    if (hdr[0] != 0 || hdr[1] != 0 || *ndim < 1 || *ndim > ZS_MAX_DIMS)
        return zs_set_error_code(ZS_ERR_FORMAT, "idx: %s: bad magic %02x %02x "
                                 "%02x %02x", path, hdr[0], hdr[1], hdr[2],
                                 hdr[3]);
    unsigned char dims[4 * ZS_MAX_DIMS];
    st = read_exact(f, dims, 4 * (size_t)*ndim, path, "dimensions");
    for (int d = 0; st == ZS_OK && d < *ndim; d++)
        shape[d] = ((int64_t)dims[4 * d] << 24) | (dims[4 * d + 1] << 16) |
                   (dims[4 * d + 2] << 8) | dims[4 * d + 3];
    return st;
}

zs_tensor *zs_idx_load(const char *path)
{
    gzFile f = gzopen(path, "rb");
    if (!f) {
        zs_set_error_code(ZS_ERR_IO, "idx: cannot open %s: %s", path,
                          strerror(errno ? errno : ENOENT));
        return NULL;
    }
    zs_tensor *t = NULL;
    unsigned char *raw = NULL;
    zs_dtype dt = ZS_U8;
    size_t es = 1, bytes = 0;
    int ndim = 0;
    int64_t shape[ZS_MAX_DIMS], n;
    if (read_header(f, path, &dt, &es, &ndim, shape) != ZS_OK)
        goto out;
    if (!zsi_shape_numel_checked(ndim, shape, &n) ||
        !zsi_shape_bytes_checked(ndim, shape, es, &bytes)) {
        char buf[160];
        zs_set_error_code(ZS_ERR_FORMAT, "idx: %s: shape %s is too large", path,
                          zsi_shape_fmt(ndim, shape, buf, sizeof buf));
        goto out;
    }
    if (!(raw = read_data(f, bytes, path)))
        goto out;
    unsigned char extra;
    if (gzread(f, &extra, 1) == 1) {
        zs_set_error_code(ZS_ERR_FORMAT, "idx: %s has data past the %lld "
                          "elements its header declares", path, (long long)n);
        goto out;
    }
    swap_bytes(raw, n, es);
    if (!(t = zsi_new_tensor(dt, ndim, shape)))
        goto out;
    if (es == 2) { /* i16 file: widen to i32 */
        int32_t *dst = zs_data(t);
        for (int64_t i = 0; i < n; i++)
            dst[i] = ((const int16_t *)raw)[i];
    } else if (bytes) {
        memcpy(zs_data(t), raw, bytes);
    }
out:
    free(raw);
    gzclose(f);
    return t;
}
