/*
 * test_tokens.c - token files: write/open round trips in both widths, the
 * header checked byte by byte, corrupt headers, truncated and padded files,
 * out-of-vocabulary tokens, failed writes that leave the old file intact,
 * the train/val split, and the (seed, step) window sampler.
 */
#include <stdlib.h>
#include <unistd.h>

#include "testutil.h"

static char dir[256];

static void path_of(char *buf, size_t n, const char *name)
{
    snprintf(buf, n, "%s/%s", dir, name);
}

static uint8_t *read_all(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *buf = malloc((size_t)sz + 1);
    *n = fread(buf, 1, (size_t)sz, f);
    fclose(f);
    return buf;
}

static void write_bytes(const char *path, const uint8_t *b, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (f) {
        fwrite(b, 1, n, f);
        fclose(f);
    }
}

static int32_t *make_ids(int64_t n, int32_t vocab, uint64_t seed)
{
    int32_t *ids = malloc((size_t)n * sizeof *ids);
    for (int64_t i = 0; i < n; i++) {
        uint32_t r[4];
        zs_philox(seed, (uint64_t)i, r);
        ids[i] = (int32_t)(r[0] % (uint32_t)vocab);
    }
    return ids;
}

static void test_round_trip(void)
{
    char p[512];
    const int32_t vocabs[] = {4096, 65536, 100000};
    const int widths[] = {2, 2, 4};
    for (int k = 0; k < 3; k++) {
        int64_t n = 12345;
        int32_t *ids = make_ids(n, vocabs[k], (uint64_t)k);
        ids[0] = vocabs[k] - 1; /* the largest id fits */
        path_of(p, sizeof p, "a.tok");
        ZT_CHECK(zs_tokens_write(p, ids, n, vocabs[k]) == ZS_OK, "write");
        size_t fn = 0;
        uint8_t *raw = read_all(p, &fn);
        ZT_CHECK(raw && fn == 32 + (size_t)n * (size_t)widths[k] &&
                     !memcmp(raw, "ZSTK", 4) && raw[4] == 1 &&
                     raw[8] == (uint8_t)vocabs[k] &&
                     raw[12] == widths[k] && raw[16] == (uint8_t)n &&
                     raw[17] == (uint8_t)(n >> 8),
                 "header bytes: magic, version 1, vocab, width %d, count",
                 widths[k]);
        free(raw);
        zs_tokens t;
        ZT_CHECK(zs_tokens_open(p, &t) == ZS_OK && t.n == n &&
                     t.width == widths[k] && t.vocab_size == vocabs[k],
                 "open: n, width, vocab (vocab %d)", vocabs[k]);
        bool same = t.n == n;
        for (int64_t i = 0; same && i < n; i++)
            same = zs_tokens_at(&t, i) == ids[i];
        ZT_CHECK(same, "tokens survive the round trip (width %d)", widths[k]);
        zs_tokens_close(&t);
        ZT_CHECK(t.map == NULL && t.n == 0, "close clears the struct");
        free(ids);
    }
    /* empty file of tokens */
    path_of(p, sizeof p, "empty.tok");
    zs_tokens t;
    ZT_CHECK(zs_tokens_write(p, NULL, 0, 10) == ZS_OK &&
                 zs_tokens_open(p, &t) == ZS_OK && t.n == 0,
             "zero tokens");
    zs_tokens_close(&t);
    zt_section("token files: write/open round trip");
}

static void expect_open_error(const char *name, const uint8_t *b, size_t n,
                              const char *needle)
{
    char p[512];
    path_of(p, sizeof p, name);
    write_bytes(p, b, n);
    zs_tokens t;
    ZT_EXPECT_ERROR(zs_tokens_open(p, &t) < 0, needle);
    ZT_CHECK(t.map == NULL && t.data == NULL, "failed open leaves nothing");
}

static void test_corrupt(void)
{
    char p[512];
    path_of(p, sizeof p, "good.tok");
    int32_t ids[100];
    for (int i = 0; i < 100; i++)
        ids[i] = i;
    ZT_CHECK(zs_tokens_write(p, ids, 100, 300) == ZS_OK, "write");
    size_t n = 0;
    uint8_t *good = read_all(p, &n), *b = malloc(n + 8);

    memcpy(b, good, n);
    b[0] = 'X';
    expect_open_error("magic.tok", b, n, "bad magic");
    memcpy(b, good, n);
    b[4] = 2;
    expect_open_error("version.tok", b, n, "version 2");
    memcpy(b, good, n);
    b[12] = 3;
    expect_open_error("width.tok", b, n, "width 3");
    memcpy(b, good, n);
    b[8] = 0, b[9] = 0, b[10] = 2; /* vocab 131072 with 2-byte tokens */
    expect_open_error("vocab.tok", b, n, "bad header");
    memcpy(b, good, n);
    expect_open_error("trunc.tok", b, n - 1, "truncated");
    expect_open_error("short.tok", b, 20, "shorter than the 32-byte header");
    expect_open_error("zero.tok", b, 0, "shorter than the 32-byte header");
    memcpy(b, good, n);
    memset(b + n, 0, 2);
    expect_open_error("long.tok", b, n + 2, "holds 202 bytes");
    memcpy(b, good, n);
    b[16] = 0xff, b[23] = 0x7f; /* absurd count: no overflow */
    expect_open_error("count.tok", b, n, "truncated");
    memcpy(b, good, n);
    b[32 + 2 * 50] = 0x2c, b[32 + 2 * 50 + 1] = 0x01; /* token 50 = 300 */
    expect_open_error("oov.tok", b, n, "token 50 is 300, outside the vocabulary");
    path_of(p, sizeof p, "missing.tok");
    zs_tokens t;
    ZT_EXPECT_ERROR(zs_tokens_open(p, &t) < 0, "cannot open");

    /* failed writes leave the existing file as it was */
    path_of(p, sizeof p, "good.tok");
    ids[7] = 300;
    ZT_EXPECT_ERROR(zs_tokens_write(p, ids, 100, 300) < 0,
                    "token 300 at position 7 is outside [0, 300)");
    ids[7] = -1;
    ZT_EXPECT_ERROR(zs_tokens_write(p, ids, 100, 300) < 0, "outside");
    size_t n2 = 0;
    uint8_t *again = read_all(p, &n2);
    ZT_CHECK(again && n2 == n && !memcmp(again, good, n), "old file intact");
    free(again);
    ZT_EXPECT_ERROR(zs_tokens_write("/nonexistent-dir/x.tok", ids, 3, 300) < 0,
                    "cannot create");
    free(good);
    free(b);
    zt_section("token files: corrupt headers, truncated, out of vocabulary");
}

static void test_split_sample(void)
{
    char p[512];
    path_of(p, sizeof p, "s.tok");
    int64_t n = 1000;
    int32_t *ids = malloc((size_t)n * sizeof *ids);
    for (int64_t i = 0; i < n; i++)
        ids[i] = (int32_t)i; /* token = position: windows are easy to check */
    zs_tokens all, tr, va;
    ZT_CHECK(zs_tokens_write(p, ids, n, 1000) == ZS_OK &&
                 zs_tokens_open(p, &all) == ZS_OK, "write + open");
    free(ids);
    ZT_CHECK(zs_tokens_split(&all, 0.1, &tr, &va) == ZS_OK && tr.n == 900 &&
                 va.n == 100 && zs_tokens_at(&va, 0) == 900 &&
                 zs_tokens_at(&tr, 899) == 899 && !tr.map && !va.map,
             "split: last 10%% is validation, views own nothing");
    ZT_EXPECT_ERROR(zs_tokens_split(&all, 1.0, &tr, &va) < 0, "fraction 1");

    int64_t B = 5, T = 16;
    zs_tensor *x, *y, *x2, *y2, *x3, *y3;
    ZT_CHECK(zs_tokens_sample(&tr, B, T, 42, 7, &x, &y) == ZS_OK &&
                 x->dtype == ZS_I64 && x->ndim == 2 && x->shape[0] == B &&
                 x->shape[1] == T && zs_same_shape(x, y),
             "sample: x, y i64 [B, T]");
    bool ok = true;
    const int64_t *xd = zs_data(x), *yd = zs_data(y);
    for (int64_t b = 0; b < B; b++) {
        ok = ok && xd[b * T] >= 0 && xd[b * T] + T <= 899;
        for (int64_t t = 0; t < T; t++)
            ok = ok && xd[b * T + t] == xd[b * T] + t && yd[b * T + t] ==
                                                             xd[b * T + t] + 1;
    }
    ZT_CHECK(ok, "windows are consecutive, in range, y = x shifted by one");
    ZT_CHECK(zs_tokens_sample(&tr, B, T, 42, 7, &x2, &y2) == ZS_OK &&
                 !memcmp(zs_data(x2), zs_data(x), (size_t)(B * T) * 8) &&
                 !memcmp(zs_data(y2), zs_data(y), (size_t)(B * T) * 8),
             "same (seed, step): same batch (a resumed run)");
    ZT_CHECK(zs_tokens_sample(&tr, B, T, 42, 8, &x3, &y3) == ZS_OK &&
                 memcmp(zs_data(x3), zs_data(x), (size_t)(B * T) * 8),
             "next step: a different batch");
    zs_release(x2);
    zs_release(y2);
    zs_release(x3);
    zs_release(y3);
    ZT_CHECK(zs_tokens_sample(&tr, B, T, 43, 7, &x3, &y3) == ZS_OK &&
                 memcmp(zs_data(x3), zs_data(x), (size_t)(B * T) * 8),
             "other seed: a different batch");
    zs_release(x3);
    zs_release(y3);
    /* every start is reachable: windows cover the whole range over steps */
    bool lo = false, hi = false;
    for (uint64_t s = 0; s < 400; s++) {
        ZT_CHECK(zs_tokens_sample(&va, 4, 98, 1, s, &x3, &y3) == ZS_OK,
                 "sample val");
        const int64_t *d = zs_data(x3);
        for (int b = 0; b < 4; b++) {
            lo = lo || d[b * 98] == 900;
            hi = hi || d[b * 98] == 901;
        }
        zs_release(x3);
        zs_release(y3);
    }
    ZT_CHECK(lo && hi, "both starts of a 2-window range are drawn");
    ZT_EXPECT_ERROR(zs_tokens_sample(&va, 2, 100, 1, 0, &x3, &y3) < 0,
                    "100 tokens cannot hold a window of T + 1 = 101");
    ZT_CHECK(x3 == NULL && y3 == NULL, "no tensors on failure");
    int64_t starts[2] = {0, 884};
    ZT_CHECK(zs_tokens_batch(&tr, 2, 15, starts, &x3, &y3) == ZS_OK &&
                 zs_get(y3, 29) == 899, "batch at given starts");
    zs_release(x3);
    zs_release(y3);
    starts[1] = 885;
    ZT_EXPECT_ERROR(zs_tokens_batch(&tr, 2, 15, starts, &x3, &y3) < 0,
                    "window 1 starts at 885");
    zs_release(x);
    zs_release(y);
    zs_tokens_close(&all);
    zt_section("split and seeded window sampler");
}

int main(void)
{
    snprintf(dir, sizeof dir, "/tmp/zs_test_tokens_%d", (int)getpid());
    char cmd[300];
    snprintf(cmd, sizeof cmd, "mkdir -p %s", dir);
    if (system(cmd) != 0)
        return 1;
    test_round_trip();
    test_corrupt();
    test_split_sample();
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0)
        return 1;
    return zt_done();
}
