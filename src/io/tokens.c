/*
 * tokens.c - binary token files (format in zs/text.h): atomic writing,
 * memory-mapped reading with the header checked against the file size and
 * every token checked against the vocabulary, train/val views, and batches
 * of (x, y) windows for next-token prediction.
 *
 * Random windows are a pure function of (seed, step, b): start b of step s
 * comes from zs_philox(seed, s * 2^32 + b), so a resumed run that knows its
 * step draws exactly the batches the uninterrupted run would have.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/fileio.h"
#include "zs/text.h"

enum { HEADER_BYTES = 32, VERSION = 1 };

static void put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get_u32(const uint8_t *p)
{
    return p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
           (uint32_t)p[3] << 24;
}

static uint64_t get_u64(const uint8_t *p)
{
    return get_u32(p) | (uint64_t)get_u32(p + 4) << 32;
}

/* Writes the tokens through a bounded buffer in the file's width. */
static zs_status write_body(int fd, const int32_t *ids, int64_t n, int width,
                            const char *path)
{
    enum { CHUNK = 1 << 16 };
    uint8_t *buf = malloc((size_t)CHUNK * (size_t)width);
    if (!buf)
        return zs_set_error_code(ZS_ERR_NOMEM, "tokens: out of memory");
    zs_status st = ZS_OK;
    for (int64_t i = 0; i < n && st == ZS_OK; i += CHUNK) {
        int64_t m = n - i < CHUNK ? n - i : CHUNK;
        for (int64_t k = 0; k < m; k++) {
            uint32_t v = (uint32_t)ids[i + k];
            for (int b = 0; b < width; b++)
                buf[k * width + b] = (uint8_t)(v >> (8 * b));
        }
        st = zsi_write_all(fd, buf, (size_t)(m * width), path, "tokens");
    }
    free(buf);
    return st;
}

zs_status zs_tokens_write(const char *path, const int32_t *ids, int64_t n,
                          int32_t vocab_size)
{
    if (!path || n < 0 || (n && !ids) || vocab_size <= 0)
        return zs_set_error("tokens write: bad arguments (n = %lld, vocab "
                            "%d)", (long long)n, vocab_size);
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= vocab_size)
            return zs_set_error("tokens write: token %d at position %lld is "
                                "outside [0, %d)", ids[i], (long long)i,
                                vocab_size);
    int width = vocab_size <= 65536 ? 2 : 4;
    uint8_t hdr[HEADER_BYTES] = "ZSTK";
    put_u32(hdr + 4, VERSION);
    put_u32(hdr + 8, (uint32_t)vocab_size);
    put_u32(hdr + 12, (uint32_t)width);
    put_u64(hdr + 16, (uint64_t)n);
    put_u64(hdr + 24, 0);
    size_t tl = strlen(path) + 32;
    char *tmp = malloc(tl);
    if (!tmp)
        return zs_set_error_code(ZS_ERR_NOMEM, "tokens write: out of memory");
    snprintf(tmp, tl, "%s.tmp.%d", path, (int)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) {
        zs_status st = zs_set_error_code(ZS_ERR_IO, "tokens write: cannot "
                                         "create %s: %s", tmp, strerror(errno));
        free(tmp);
        return st;
    }
    zs_status st = zsi_write_all(fd, hdr, sizeof hdr, tmp, "tokens");
    if (st == ZS_OK)
        st = write_body(fd, ids, n, width, tmp);
    if (st == ZS_OK && fsync(fd) != 0)
        st = zs_set_error_code(ZS_ERR_IO, "tokens write: fsync %s: %s", tmp,
                               strerror(errno));
    if (close(fd) != 0 && st == ZS_OK)
        st = zs_set_error_code(ZS_ERR_IO, "tokens write: close %s: %s", tmp,
                               strerror(errno));
    if (st == ZS_OK && rename(tmp, path) != 0)
        st = zs_set_error_code(ZS_ERR_IO, "tokens write: rename to %s: %s",
                               path, strerror(errno));
    if (st == ZS_OK)
        zsi_fsync_dir(path);
    else
        unlink(tmp);
    free(tmp);
    return st;
}

/* Checks the mapped header and tokens; fills *t on success. */
static zs_status check_file(const uint8_t *p, size_t size, const char *path,
                            zs_tokens *t)
{
    if (size < HEADER_BYTES)
        return zs_set_error_code(ZS_ERR_FORMAT, "tokens: %s is %zu bytes, "
                                 "shorter than the %d-byte header", path, size,
                                 HEADER_BYTES);
    if (memcmp(p, "ZSTK", 4))
        return zs_set_error_code(ZS_ERR_FORMAT, "tokens: %s is not a token "
                                 "file (bad magic)", path);
    uint32_t version = get_u32(p + 4), vocab = get_u32(p + 8);
    uint32_t width = get_u32(p + 12);
    uint64_t count = get_u64(p + 16);
    if (version != VERSION)
        return zs_set_error_code(ZS_ERR_FORMAT, "tokens: %s has version %u, "
                                 "expected %d", path, version, VERSION);
    if (vocab == 0 || vocab > INT32_MAX || (width != 2 && width != 4) ||
        (width == 2 && vocab > 65536))
        return zs_set_error_code(ZS_ERR_FORMAT, "tokens: %s has a bad header "
                                 "(vocabulary %u, width %u)", path, vocab,
                                 width);
    uint64_t body = size - HEADER_BYTES;
    if (count > body / width || count * width != body)
        return zs_set_error_code(ZS_ERR_FORMAT, "tokens: %s header says %llu "
                                 "tokens of %u bytes (%llu bytes) but the file "
                                 "holds %llu bytes of tokens (truncated?)",
                                 path, (unsigned long long)count, width,
                                 (unsigned long long)count * width,
                                 (unsigned long long)body);
    *t = (zs_tokens){.data = p + HEADER_BYTES, .n = (int64_t)count,
                     .width = (int)width, .vocab_size = (int32_t)vocab};
    for (int64_t i = 0; i < t->n; i++) {
        int32_t v = zs_tokens_at(t, i);
        if (v < 0 || v >= t->vocab_size)
            return zs_set_error_code(ZS_ERR_FORMAT, "tokens: %s: token %lld "
                                     "is %d, outside the vocabulary [0, %d)",
                                     path, (long long)i, v, t->vocab_size);
    }
    return ZS_OK;
}

zs_status zs_tokens_open(const char *path, zs_tokens *out)
{
    memset(out, 0, sizeof *out);
    if (!path)
        return zs_set_error("tokens open: NULL path");
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return zs_set_error_code(ZS_ERR_IO, "tokens: cannot open %s: %s", path,
                                 strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        zs_status st = zs_set_error_code(ZS_ERR_IO, "tokens: stat %s: %s", path,
                                         strerror(errno));
        close(fd);
        return st;
    }
    size_t size = (size_t)sb.st_size;
    void *map = size ? mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0) : NULL;
    close(fd);
    if (map == MAP_FAILED)
        return zs_set_error_code(ZS_ERR_IO, "tokens: mmap %s: %s", path,
                                 strerror(errno));
    zs_tokens t;
    zs_status st = check_file(map ? map : "", size, path, &t);
    if (st != ZS_OK) {
        if (map)
            munmap(map, size);
        return st;
    }
    t.map = map;
    t.map_len = size;
    *out = t;
    return ZS_OK;
}

void zs_tokens_close(zs_tokens *t)
{
    if (t && t->map)
        munmap(t->map, t->map_len);
    if (t)
        memset(t, 0, sizeof *t);
}

zs_status zs_tokens_split(const zs_tokens *all, double val_fraction,
                          zs_tokens *train, zs_tokens *val)
{
    if (!all || !train || !val || !(val_fraction >= 0 && val_fraction < 1))
        return zs_set_error("tokens split: validation fraction %g outside "
                            "[0, 1)", val_fraction);
    int64_t nv = (int64_t)((double)all->n * val_fraction);
    zs_tokens v = *all, t = *all;
    v.map = t.map = NULL;
    v.map_len = t.map_len = 0;
    t.n = all->n - nv;
    v.n = nv;
    v.data = all->data + t.n * all->width;
    *train = t;
    *val = v;
    return ZS_OK;
}

zs_status zs_tokens_batch(const zs_tokens *t, int64_t B, int64_t T,
                          const int64_t *starts, zs_tensor **x, zs_tensor **y)
{
    *x = *y = NULL;
    if (!t || B <= 0 || T <= 0 || !starts)
        return zs_set_error("tokens batch: bad arguments (B = %lld, T = %lld)",
                            (long long)B, (long long)T);
    for (int64_t b = 0; b < B; b++)
        if (starts[b] < 0 || starts[b] > t->n - T - 1)
            return zs_set_error("tokens batch: window %lld starts at %lld; "
                                "windows of %lld tokens need a start in [0, "
                                "%lld]", (long long)b, (long long)starts[b],
                                (long long)(T + 1), (long long)(t->n - T - 1));
    zs_tensor *xt = zs_empty(ZS_I64, ZS_SHAPE(B, T));
    zs_tensor *yt = xt ? zs_empty(ZS_I64, ZS_SHAPE(B, T)) : NULL;
    if (!yt) {
        zs_release(xt);
        return ZS_ERR_NOMEM;
    }
    int64_t *xd = zs_data(xt), *yd = zs_data(yt);
    for (int64_t b = 0; b < B; b++) {
        int32_t prev = zs_tokens_at(t, starts[b]);
        for (int64_t i = 0; i < T; i++) {
            int32_t next = zs_tokens_at(t, starts[b] + i + 1);
            xd[b * T + i] = prev;
            yd[b * T + i] = next;
            prev = next;
        }
    }
    *x = xt;
    *y = yt;
    return ZS_OK;
}

zs_status zs_tokens_sample(const zs_tokens *t, int64_t B, int64_t T,
                           uint64_t seed, uint64_t step, zs_tensor **x,
                           zs_tensor **y)
{
    *x = *y = NULL;
    if (!t || B <= 0 || T <= 0 || B > UINT32_MAX)
        return zs_set_error("tokens sample: bad arguments (B = %lld, T = %lld)",
                            (long long)B, (long long)T);
    if (t->n < T + 1)
        return zs_set_error("tokens sample: %lld tokens cannot hold a window "
                            "of T + 1 = %lld tokens", (long long)t->n,
                            (long long)(T + 1));
    int64_t *starts = malloc((size_t)B * sizeof *starts);
    if (!starts)
        return zs_set_error_code(ZS_ERR_NOMEM, "tokens sample: out of memory");
    uint64_t nstarts = (uint64_t)(t->n - T);
    for (int64_t b = 0; b < B; b++) {
        uint32_t r[4];
        zs_philox(seed, step << 32 | (uint64_t)b, r);
        uint64_t v = (uint64_t)r[0] << 32 | r[1];
        starts[b] = (int64_t)(v % nstarts);
    }
    zs_status st = zs_tokens_batch(t, B, T, starts, x, y);
    free(starts);
    return st;
}
