/*
 * fuzz_util.c - memfd-backed files and small helpers for the fuzz harnesses
 * (see fuzz_util.h).
 */
#include "fuzz_util.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <zlib.h>

#include "zs/core.h"
#include "zs/text.h"

static void die(const char *what)
{
    perror(what);
    abort();
}

const char *zf_file(int slot, const uint8_t *data, size_t size)
{
    static int fd[ZF_SLOTS];
    static char path[ZF_SLOTS][32];
    static bool started;
    if (slot < 0 || slot >= ZF_SLOTS)
        abort();
    if (!started) {
        for (int i = 0; i < ZF_SLOTS; i++)
            fd[i] = -1;
        zs_set_num_threads(1);
        started = true;
    }
    if (fd[slot] < 0) {
        if ((fd[slot] = memfd_create("zs-fuzz", MFD_CLOEXEC)) < 0)
            die("memfd_create");
        snprintf(path[slot], sizeof path[slot], "/proc/self/fd/%d", fd[slot]);
    }
    if (ftruncate(fd[slot], 0) != 0)
        die("ftruncate");
    size_t done = 0;
    while (done < size) {
        ssize_t w = pwrite(fd[slot], data + done, size - done, (off_t)done);
        if (w <= 0)
            die("pwrite");
        done += (size_t)w;
    }
    return path[slot];
}

char *zf_cstr(const uint8_t *data, size_t size)
{
    char *s = malloc(size + 1);
    if (!s)
        abort();
    memcpy(s, data, size);
    s[size] = 0;
    return s;
}

uint8_t *zf_gzip(const uint8_t *data, size_t size, size_t *n)
{
    z_stream z = {0};
    /* windowBits 15 + 16: a gzip header and trailer instead of zlib's */
    if (deflateInit2(&z, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK)
        abort();
    size_t cap = deflateBound(&z, (uLong)size) + 32;
    uint8_t *out = malloc(cap);
    if (!out)
        abort();
    z.next_in = (Bytef *)data;
    z.avail_in = (uInt)size;
    z.next_out = out;
    z.avail_out = (uInt)cap;
    if (deflate(&z, Z_FINISH) != Z_STREAM_END)
        abort();
    *n = z.total_out;
    deflateEnd(&z);
    return out;
}

void zf_bpe_exercise(const zs_bpe *b)
{
    static const char text[] = "Hello, world! It's 2024 <|endoftext|>\n\n"
                               "\xe6\x99\xba\xe7\xae\x97 \xff\x00 the end";
    const size_t n = sizeof text - 1;
    int32_t l, r, res, *ids = NULL;
    size_t len, n_ids = 0;
    int32_t m = zs_bpe_n_merges(b), v = zs_bpe_vocab_size(b);
    if (m > 0) {
        zs_bpe_merge(b, 0, &l, &r, &res);
        zs_bpe_merge(b, m - 1, &l, &r, &res);
    }
    zs_bpe_token(b, v - 1, &len);
    zs_bpe_token(b, zs_bpe_eot(b), &len);
    for (int flags = 0; flags <= ZS_BPE_ALLOW_SPECIAL; flags++) {
        if (zs_bpe_encode(b, text, n, flags, &ids, &n_ids) != ZS_OK)
            continue;
        char *back = NULL;
        size_t back_len = 0;
        zs_status st = zs_bpe_decode(b, ids, n_ids, &back, &back_len);
        if (flags == 0 && (st != ZS_OK || back_len != n || memcmp(back, text, n))) {
            fprintf(stderr, "bpe: encode/decode does not give the text back: "
                    "%s\n", st == ZS_OK ? "different bytes" : zs_last_error());
            abort();
        }
        free(back);
        free(ids);
    }
}
