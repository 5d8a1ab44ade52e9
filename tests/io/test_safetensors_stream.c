/*
 * test_safetensors_stream.c - the piecewise safetensors writer and reader
 * (src/io/safetensors_stream.c): a file written piece by piece, in an
 * arbitrary order, is byte for byte the file zs_safetensors_save writes
 * for the same tensors; the reader reads pieces of either back; an
 * incomplete file is not renamed into place; errors name what is wrong.
 */
#include <stdlib.h>
#include <unistd.h>

#include "testutil.h"

static char dir[64];

static unsigned char *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    unsigned char *b = NULL;
    if (f && fseek(f, 0, SEEK_END) == 0) {
        long len = ftell(f);
        b = len >= 0 ? malloc((size_t)len + 1) : NULL;
        rewind(f);
        *n = b ? fread(b, 1, (size_t)len, f) : 0;
    }
    if (f)
        fclose(f);
    return b;
}

static void test_same_file(void)
{
    const char *names[3] = {"w.b", "a", "z.moment"};
    zs_tensor *ts[3] = {zt_rand(ZS_F32, 2, (int64_t[]){5, 7}, 1),
                        zt_rand(ZS_F32, 1, (int64_t[]){3}, 2),
                        zt_rand(ZS_F32, 1, (int64_t[]){101}, 3)};
    char p1[128], p2[128];
    snprintf(p1, sizeof p1, "%s/whole.safetensors", dir);
    snprintf(p2, sizeof p2, "%s/pieces.safetensors", dir);
    const char *meta = "{\"step\":\"4\"}";
    ZT_CHECK(zs_safetensors_save(p1, 3, names, ts, meta) == ZS_OK, "save");
    zs_tensor_info in[3];
    for (int i = 0; i < 3; i++) {
        in[i] = (zs_tensor_info){names[i], ZS_F32, ts[i]->ndim, {0}};
        memcpy(in[i].shape, ts[i]->shape, sizeof in[i].shape);
    }
    zs_safetensors_writer *w = zs_safetensors_writer_new(p2, 3, in, meta);
    ZT_CHECK(w != NULL, "writer");
    /* the last tensor in three pieces, last piece first, then the others */
    const char *z = zs_data(ts[2]);
    ZT_CHECK(zs_safetensors_writer_put(w, "z.moment", 80 * 4, z + 80 * 4, 21 * 4) == ZS_OK &&
             zs_safetensors_writer_put(w, "z.moment", 0, z, 40 * 4) == ZS_OK &&
             zs_safetensors_writer_put(w, "z.moment", 40 * 4, z + 40 * 4, 40 * 4) == ZS_OK &&
             zs_safetensors_writer_put(w, "a", 0, zs_data(ts[1]), 12) == ZS_OK &&
             zs_safetensors_writer_put(w, "w.b", 0, zs_data(ts[0]), 35 * 4) == ZS_OK,
             "puts");
    ZT_EXPECT_ERROR(zs_safetensors_writer_put(w, "a", 8, zs_data(ts[1]), 8) != ZS_OK,
                    "has 12 bytes");
    ZT_EXPECT_ERROR(zs_safetensors_writer_put(w, "nope", 0, zs_data(ts[1]), 4) != ZS_OK,
                    "no tensor 'nope'");
    ZT_CHECK(zs_safetensors_writer_finish(w) == ZS_OK, "finish");
    size_t n1 = 0, n2 = 0;
    unsigned char *b1 = slurp(p1, &n1), *b2 = slurp(p2, &n2);
    ZT_CHECK(b1 && b2 && n1 == n2 && !memcmp(b1, b2, n1),
             "piecewise file differs from zs_safetensors_save's (%zu vs %zu bytes)", n1, n2);
    free(b1);
    free(b2);
    /* the reader: pieces of the whole file, the metadata, the shapes */
    zs_safetensors_reader *r = zs_safetensors_open(p1);
    ZT_CHECK(r && zs_safetensors_reader_count(r) == 3, "reader count");
    zs_tensor_info f;
    ZT_CHECK(r && zs_safetensors_reader_info(r, "w.b", &f) == ZS_OK && f.ndim == 2 &&
             f.shape[0] == 5 && f.shape[1] == 7 && f.dtype == ZS_F32, "info");
    float piece[21];
    ZT_CHECK(r && zs_safetensors_reader_read(r, "z.moment", 80 * 4, piece, sizeof piece) ==
                  ZS_OK && !memcmp(piece, z + 80 * 4, sizeof piece), "read a piece");
    ZT_CHECK(r && zs_safetensors_reader_metadata(r) &&
             strstr(zs_safetensors_reader_metadata(r), "\"step\":\"4\""), "metadata");
    ZT_EXPECT_ERROR(!r || zs_safetensors_reader_read(r, "a", 4, piece, 12) != ZS_OK,
                    "has 12 bytes");
    ZT_EXPECT_ERROR(!r || zs_safetensors_reader_info(r, "b", &f) != ZS_OK, "no tensor 'b'");
    zs_safetensors_reader_close(r);
    for (int i = 0; i < 3; i++)
        zs_release(ts[i]);
    zt_section("piecewise writer = zs_safetensors_save, reader reads pieces");
}

static void test_errors(void)
{
    char p[128];
    snprintf(p, sizeof p, "%s/partial.safetensors", dir);
    zs_tensor_info in[2] = {{"x", ZS_F32, 1, {4}}, {"x", ZS_F32, 1, {2}}};
    ZT_EXPECT_ERROR(zs_safetensors_writer_new(p, 2, in, NULL) == NULL, "duplicate name 'x'");
    in[1] = (zs_tensor_info){"y", ZS_F32, -1, {0}};
    ZT_EXPECT_ERROR(zs_safetensors_writer_new(p, 2, in, NULL) == NULL, "bad dtype or shape");
    in[1] = (zs_tensor_info){"y", ZS_F32, 1, {2}};
    ZT_EXPECT_ERROR(zs_safetensors_writer_new(p, 2, in, "[1]") == NULL, "not a JSON object");
    zs_safetensors_writer *w = zs_safetensors_writer_new(p, 2, in, NULL);
    float v[4] = {1, 2, 3, 4};
    ZT_CHECK(w && zs_safetensors_writer_put(w, "x", 0, v, 16) == ZS_OK, "put x");
    ZT_EXPECT_ERROR(zs_safetensors_writer_finish(w) != ZS_OK, "16 of 24 data bytes");
    ZT_CHECK(access(p, F_OK) != 0, "an incomplete file was renamed into place");
    ZT_EXPECT_ERROR(zs_safetensors_open(p) == NULL, "cannot open");
    /* a truncated file: the header's offsets run past its end */
    char q[128];
    snprintf(q, sizeof q, "%s/trunc.safetensors", dir);
    zs_tensor *t = zt_rand(ZS_F32, 1, (int64_t[]){64}, 9);
    ZT_CHECK(zs_safetensors_save(q, 1, (const char *[]){"t"}, &t, NULL) == ZS_OK, "save");
    ZT_CHECK(truncate(q, 100) == 0, "truncate");
    ZT_EXPECT_ERROR(zs_safetensors_open(q) == NULL, "bad dtype, shape or data_offsets");
    zs_release(t);
    zt_section("writer and reader errors");
}

int main(void)
{
    snprintf(dir, sizeof dir, "/tmp/zs_test_st_stream_%d", (int)getpid());
    char cmd[128];
    snprintf(cmd, sizeof cmd, "mkdir -p %s", dir);
    if (system(cmd) != 0)
        return 1;
    test_same_file();
    test_errors();
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0)
        return 1;
    return zt_done();
}
