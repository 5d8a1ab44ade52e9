/*
 * idx.c - IDX files (the MNIST / Fashion-MNIST format), gzip or plain.
 *
 * Layout: two zero bytes, a type code (0x08 u8, 0x09 i8, 0x0B i16,
 * 0x0C i32, 0x0D f32, 0x0E f64), the number of dims, then each dim as a
 * big-endian u32, then the data, big-endian. zlib's gzread reads plain files
 * too, so one path serves both.
 */
#include <errno.h>
#include <string.h>
#include <zlib.h>

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

zs_tensor *zs_idx_load(const char *path)
{
    gzFile f = gzopen(path, "rb");
    if (!f) {
        zs_set_error_code(ZS_ERR_IO, "idx: cannot open %s: %s", path,
                          strerror(errno ? errno : ENOENT));
        return NULL;
    }
    zs_tensor *t = NULL, *wide = NULL;
    unsigned char hdr[4];
    if (read_exact(f, hdr, 4, path, "header") != ZS_OK)
        goto out;
    int ndim = hdr[3];
    zs_dtype dt;
    size_t es;
    switch (hdr[2]) {
    case 0x08: dt = ZS_U8; es = 1; break;
    case 0x09: dt = ZS_I8; es = 1; break;
    case 0x0B: dt = ZS_I32; es = 2; break; /* widened below */
    case 0x0C: dt = ZS_I32; es = 4; break;
    case 0x0D: dt = ZS_F32; es = 4; break;
    case 0x0E: dt = ZS_F64; es = 8; break;
    default:
        zs_set_error_code(ZS_ERR_FORMAT, "idx: %s: unknown type code 0x%02x "
                          "(not an IDX file?)", path, hdr[2]);
        goto out;
    }
    if (hdr[0] != 0 || hdr[1] != 0 || ndim < 1 || ndim > ZS_MAX_DIMS) {
        zs_set_error_code(ZS_ERR_FORMAT, "idx: %s: bad magic %02x %02x %02x "
                          "%02x", path, hdr[0], hdr[1], hdr[2], hdr[3]);
        goto out;
    }
    unsigned char dims[4 * ZS_MAX_DIMS];
    if (read_exact(f, dims, 4 * (size_t)ndim, path, "dimensions") != ZS_OK)
        goto out;
    int64_t shape[ZS_MAX_DIMS];
    double total = 1;
    for (int d = 0; d < ndim; d++) {
        shape[d] = ((int64_t)dims[4 * d] << 24) | (dims[4 * d + 1] << 16) |
                   (dims[4 * d + 2] << 8) | dims[4 * d + 3];
        total *= (double)shape[d];
    }
    if (total * (double)es > 16e9) {
        zs_set_error_code(ZS_ERR_FORMAT, "idx: %s: %g elements is too many",
                          path, total);
        goto out;
    }
    if (es == 2) { /* i16 file: read raw, widen to i32 */
        wide = zsi_new_tensor(ZS_I32, ndim, shape);
        int64_t n = wide ? zs_numel(wide) : 0;
        int16_t *raw = wide ? zs_alloc((size_t)n * 2 + 1) : NULL;
        if (raw && read_exact(f, raw, (size_t)n * 2, path, "data") == ZS_OK) {
            swap_bytes(raw, n, 2);
            for (int64_t i = 0; i < n; i++)
                ((int32_t *)zs_data(wide))[i] = raw[i];
            t = wide;
            wide = NULL;
        }
        zs_free(raw);
        goto out;
    }
    t = zsi_new_tensor(dt, ndim, shape);
    if (!t)
        goto out;
    if (read_exact(f, zs_data(t), zs_nbytes(t), path, "data") != ZS_OK) {
        zs_release(t);
        t = NULL;
        goto out;
    }
    if (es > 1)
        swap_bytes(zs_data(t), zs_numel(t), es);
    unsigned char extra;
    if (gzread(f, &extra, 1) == 1) {
        zs_set_error_code(ZS_ERR_FORMAT, "idx: %s has data past the %lld "
                          "elements its header declares", path,
                          (long long)zs_numel(t));
        zs_release(t);
        t = NULL;
    }
out:
    zs_release(wide);
    gzclose(f);
    return t;
}
