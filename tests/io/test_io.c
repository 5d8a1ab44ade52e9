/*
 * test_io.c - safetensors (round trip, byte-exact against an independent
 * Python reader, metadata, corrupt files, no clobbering on failure) and IDX
 * (plain and gzip, truncated and malformed files, Fashion-MNIST if
 * installed).
 */
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "testutil.h"

static char dir[256];

static void path_of(char *buf, size_t n, const char *name)
{
    snprintf(buf, n, "%s/%s", dir, name);
}

static void dump_raw(const char *name, zs_tensor *t)
{
    char p[512];
    snprintf(p, sizeof p, "%s/%s.bin", dir, name);
    size_t nb = zs_nbytes(t);
    void *buf = malloc(nb + 1);
    zs_copy_to_buffer(t, buf, nb);
    FILE *f = fopen(p, "wb");
    fwrite(buf, 1, nb, f);
    fclose(f);
    free(buf);
}

static void test_safetensors(void)
{
    zs_tensor *w = zt_rand(ZS_F32, ZS_SHAPE(7, 5), 1);
    zs_tensor *wt = zs_transpose(w, 0, 1); /* non-contiguous: saved as [5, 7] */
    zs_tensor *d = zt_rand(ZS_F64, ZS_SHAPE(3), 2);
    zs_tensor *h = zs_to_dtype(w, ZS_BF16);
    zs_tensor *i = zs_arange(ZS_I64, 0, 10, 1);
    zs_tensor *s = zs_scalar(ZS_F32, 3.5);
    zs_tensor *e = zs_zeros(ZS_U8, ZS_SHAPE(0, 4));
    const char *names[] = {"w.t", "b", "half", "idx", "step", "empty"};
    zs_tensor *ts[] = {wt, d, h, i, s, e};
    char p[512];
    path_of(p, sizeof p, "a.safetensors");
    ZT_CHECK(zs_safetensors_save(p, 6, names, ts, "{\"format\":\"pt\",\"step\":\"7\"}") == ZS_OK,
             "save");
    for (int k = 0; k < 6; k++)
        dump_raw(names[k], ts[k]);
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "python3 %s/tests/io/read_safetensors.py %s %s > %s/py.txt",
             getenv("ZS_SOURCE_DIR") ? getenv("ZS_SOURCE_DIR") : "..", p, dir, dir);
    ZT_CHECK(system(cmd) == 0, "independent python reader agrees byte for byte (%s)", cmd);
    zs_tensor_set set;
    ZT_CHECK(zs_safetensors_load(p, &set) == ZS_OK && set.n == 6, "load");
    zs_tensor *r = zs_tensor_set_get(&set, "w.t");
    bool same = r && r->shape[0] == 5 && r->shape[1] == 7;
    for (int k = 0; same && k < 35; k++)
        same = zs_get(r, k) == zs_get(wt, k);
    ZT_CHECK(same, "values survive the round trip");
    ZT_CHECK(set.metadata_json && strstr(set.metadata_json, "\"step\":\"7\""), "metadata");
    zs_tensor *e2 = zs_tensor_set_get(&set, "empty");
    ZT_CHECK(e2 && e2->ndim == 2 && zs_numel(e2) == 0, "empty tensor");
    zs_tensor_set_free(&set);
    /* failures never clobber the existing file */
    ZT_EXPECT_ERROR(zs_safetensors_save(p, 1, names, ts, "[1,2]") < 0, "metadata is not a JSON object");
    const char *dup[] = {"x", "x"};
    ZT_EXPECT_ERROR(zs_safetensors_save(p, 2, dup, ts, NULL) < 0, "duplicate name");
    ZT_CHECK(zs_safetensors_load(p, &set) == ZS_OK && set.n == 6, "old file intact");
    zs_tensor_set_free(&set);
    ZT_EXPECT_ERROR(zs_safetensors_save("/nonexistent-dir/x.safetensors", 1, names, ts, NULL) < 0,
                    "cannot create");
    zs_tensor *all[] = {w, wt, d, h, i, s, e};
    for (size_t k = 0; k < sizeof all / sizeof *all; k++)
        zs_release(all[k]);
    zt_section("safetensors round trip");
}

static void write_bytes(const char *name, const void *b, size_t n)
{
    char p[512];
    path_of(p, sizeof p, name);
    FILE *f = fopen(p, "wb");
    fwrite(b, 1, n, f);
    fclose(f);
}

static void test_safetensors_corrupt(void)
{
    char p[512], q[512];
    path_of(p, sizeof p, "a.safetensors");
    FILE *f = fopen(p, "rb");
    static unsigned char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    zs_tensor_set set;
    path_of(q, sizeof q, "bad.safetensors");
    write_bytes("bad.safetensors", buf, n - 3);
    ZT_EXPECT_ERROR(zs_safetensors_load(q, &set) < 0, "do not match");
    write_bytes("bad.safetensors", buf, 5);
    ZT_EXPECT_ERROR(zs_safetensors_load(q, &set) < 0, "truncated");
    unsigned char big[16] = {0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0, '{', '}'};
    write_bytes("bad.safetensors", big, 16);
    ZT_EXPECT_ERROR(zs_safetensors_load(q, &set) < 0, "header length");
    unsigned char junk[24] = {8, 0, 0, 0, 0, 0, 0, 0, 'n', 'o', 't', ' ', 'j', 's', 'o', 'n'};
    write_bytes("bad.safetensors", junk, 16);
    ZT_EXPECT_ERROR(zs_safetensors_load(q, &set) < 0, "not a JSON object");
    const char *hdr = "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                      "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}";
    size_t hl = strlen(hdr);
    unsigned char ov[256] = {0};
    uint64_t l64 = hl;
    memcpy(ov, &l64, 8);
    memcpy(ov + 8, hdr, hl);
    write_bytes("bad.safetensors", ov, 8 + hl + 12);
    ZT_EXPECT_ERROR(zs_safetensors_load(q, &set) < 0, "overlap");
    const char *hdr2 = "{\"a\":{\"dtype\":\"Q7\",\"shape\":[2],\"data_offsets\":[0,8]}}";
    hl = strlen(hdr2);
    l64 = hl;
    memcpy(ov, &l64, 8);
    memcpy(ov + 8, hdr2, hl);
    write_bytes("bad.safetensors", ov, 8 + hl + 8);
    ZT_EXPECT_ERROR(zs_safetensors_load(q, &set) < 0, "bad dtype");
    ZT_EXPECT_ERROR(zs_safetensors_load("/nonexistent/x", &set) < 0, "cannot open");
    zt_section("safetensors corrupt files");
}

/* A safetensors file made of header text hdr followed by data bytes. */
static void write_st(const char *name, const char *hdr, const char *data)
{
    static unsigned char b[4096];
    uint64_t hl = strlen(hdr);
    memcpy(b, &hl, 8);
    memcpy(b + 8, hdr, hl);
    memcpy(b + 8 + hl, data, strlen(data));
    write_bytes(name, b, 8 + hl + strlen(data));
}

/* Inputs a fuzzer found (issue 17; the files are also in
 * tests/fuzz/corpus/safetensors): each must fail with its message and
 * leak nothing. */
static void test_safetensors_hostile(void)
{
    static const struct {
        const char *hdr, *data, *msg;
    } cases[] = {
        {"{\"__metadata__\":{\"a\":\"b\"},\"__metadata__\":{\"c\":\"d\"}}", "",
         "__metadata__ appears twice"},
        {"{\"__metadata__\":[1,2]}", "", "__metadata__ is not an object"},
        {"{\"t\":{\"dtype\":\"F32\",\"shape\":[1000000000000,1000000000000,0],"
         "\"data_offsets\":[0,0]}}", "", "too large"},
        {"{\"t\":{\"dtype\":\"F32\",\"shape\":[24,81844674407,3709551615],"
         "\"data_offsets\":[0,96]}}", "", "too large"},
        {"{\"t\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[\"x\",null]}}",
         "", "two integers"},
        {"{\"t\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[null,null]}}",
         "", "two integers"},
        {"{\"t\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0.5,4.5]}}",
         "abcdefgh", "two integers"},
        {"{\"t\":{\"dtype\":\"U8\",\"shape\":[2.5],\"data_offsets\":[0,2]}}",
         "ab", "bad shape"},
        {"{\"t\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
         "\"t\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}", "ab",
         "'t' appears twice"},
    };
    char q[512];
    path_of(q, sizeof q, "hostile.safetensors");
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        write_st("hostile.safetensors", cases[i].hdr, cases[i].data);
        zs_tensor_set set;
        ZT_EXPECT_ERROR(zs_safetensors_load(q, &set) < 0, cases[i].msg);
    }
    zs_tensor_set set;
    ZT_EXPECT_ERROR(zs_safetensors_load(dir, &set) < 0, "is a directory");
    zt_section("safetensors hostile headers (fuzzer findings)");
}

static void test_idx(void)
{
    /* 3 images of 2x3, u8; big-endian dims */
    unsigned char idx[4 + 12 + 18] = {0, 0, 0x08, 3, 0, 0, 0, 3, 0, 0, 0, 2, 0, 0, 0, 3};
    for (int k = 0; k < 18; k++)
        idx[16 + k] = (unsigned char)(k * 7);
    write_bytes("x.idx", idx, sizeof idx);
    char p[512];
    path_of(p, sizeof p, "x.idx.gz");
    gzFile g = gzopen(p, "wb");
    gzwrite(g, idx, sizeof idx);
    gzclose(g);
    zs_tensor *t = zs_idx_load(p);
    ZT_CHECK(t && t->dtype == ZS_U8 && t->ndim == 3 && t->shape[0] == 3 &&
             t->shape[2] == 3 && zs_get(t, 17) == 119, "gzip idx");
    zs_release(t);
    path_of(p, sizeof p, "x.idx");
    t = zs_idx_load(p);
    ZT_CHECK(t && zs_get(t, 5) == 35, "plain idx");
    zs_release(t);
    /* i32 big-endian */
    unsigned char i32[4 + 4 + 8] = {0, 0, 0x0C, 1, 0, 0, 0, 2, 0, 0, 1, 0, 0xff, 0xff, 0xff, 0xfe};
    write_bytes("i.idx", i32, sizeof i32);
    path_of(p, sizeof p, "i.idx");
    t = zs_idx_load(p);
    ZT_CHECK(t && t->dtype == ZS_I32 && zs_get(t, 0) == 256 && zs_get(t, 1) == -2, "i32 idx");
    zs_release(t);
    write_bytes("x.idx", idx, sizeof idx - 5);
    path_of(p, sizeof p, "x.idx");
    ZT_EXPECT_ERROR(zs_idx_load(p) == NULL, "truncated");
    unsigned char bad[8] = {1, 2, 3, 4};
    write_bytes("x.idx", bad, 8);
    ZT_EXPECT_ERROR(zs_idx_load(p) == NULL, "type code");
    idx[2] = 0x08;
    write_bytes("x.idx", idx, sizeof idx);
    FILE *f = fopen(p, "ab");
    fputc(1, f);
    fclose(f);
    ZT_EXPECT_ERROR(zs_idx_load(p) == NULL, "past the");
    ZT_EXPECT_ERROR(zs_idx_load("/nonexistent/train-images-idx3-ubyte.gz") == NULL, "cannot open");
    const char *fm = "/usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz";
    if (access(fm, R_OK) == 0) {
        t = zs_idx_load(fm);
        ZT_CHECK(t && t->ndim == 1 && t->shape[0] == 10000, "fashion-mnist labels");
        zs_release(t);
    } else {
        printf("skip fashion-mnist (not installed)\n");
    }
    zt_section("idx");
}

#if defined(__SANITIZE_ADDRESS__)
#define ZT_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define ZT_ASAN 1
#endif
#endif

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#ifndef ZT_ASAN /* ASan reserves terabytes of shadow: no RLIMIT_AS there */
/* Loads path in a child process whose address space is capped at 256 MB
 * above what it has now: true when the load fails with msg without
 * needing the memory its header declares. */
static bool idx_fails_in_bounded_memory(const char *path, const char *msg)
{
    pid_t pid = fork();
    if (pid == 0) {
        FILE *f = fopen("/proc/self/statm", "r");
        unsigned long pages = 0;
        if (!f || fscanf(f, "%lu", &pages) != 1)
            _exit(3);
        fclose(f);
        rlim_t cap = (rlim_t)pages * (rlim_t)sysconf(_SC_PAGESIZE) + (256u << 20);
        struct rlimit rl = {cap, cap};
        if (setrlimit(RLIMIT_AS, &rl) != 0)
            _exit(3);
        zs_tensor *t = zs_idx_load(path);
        _exit(!t && strstr(zs_last_error(), msg) ? 0 : 1);
    }
    int status = 0;
    return pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) &&
           WEXITSTATUS(status) == 0;
}
#endif

/* Inputs a fuzzer found (issue 17; also in tests/fuzz/corpus/idx): sizes
 * that overflow, and headers that declare gigabytes the file does not
 * hold, which must fail before that much is allocated, plain or gzip. */
static void test_idx_hostile(void)
{
    char p[512], gz[512];
    path_of(p, sizeof p, "h.idx");
    path_of(gz, sizeof gz, "h.idx.gz");
    /* u8 [0, 2^32-1, 2^32-1]: no elements, but the strides overflow */
    unsigned char zero[16] = {0, 0, 8, 3, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff,
                              0xff, 0xff, 0xff, 0xff};
    write_bytes("h.idx", zero, sizeof zero);
    ZT_EXPECT_ERROR(zs_idx_load(p) == NULL, "too large");
    static const struct {
        unsigned char hdr[16];
        size_t n;
        const char *what;
    } big[] = {
        /* f32 [1, 1, 0xc0000401]: 12.9 GB declared, 4 bytes present */
        {{0, 0, 0x0d, 3, 0, 0, 0, 1, 0, 0, 0, 1, 0xc0, 0, 4, 1}, 16, "f32 12 GB"},
        /* i16 [255, 0x10affff]: 8.9 GB (as i32: 17.8 GB) declared */
        {{0, 0, 0x0b, 2, 0, 0, 0, 0xff, 1, 0x0a, 0xff, 0xff, 0x14, 0x0b}, 14, "i16 18 GB"},
    };
    for (size_t i = 0; i < sizeof big / sizeof *big; i++) {
        write_bytes("h.idx", big[i].hdr, big[i].n);
        gzFile g = gzopen(gz, "wb");
        gzwrite(g, big[i].hdr, (unsigned)big[i].n);
        gzclose(g);
        double t0 = now_s();
        ZT_EXPECT_ERROR(zs_idx_load(p) == NULL, "truncated");
        ZT_EXPECT_ERROR(zs_idx_load(gz) == NULL, "truncated");
        ZT_CHECK(now_s() - t0 < 1.0, "%s: refused in %.2f s", big[i].what,
                 now_s() - t0);
#ifndef ZT_ASAN
        ZT_CHECK(idx_fails_in_bounded_memory(p, "truncated") &&
                 idx_fails_in_bounded_memory(gz, "truncated"),
                 "%s header: refused within 256 MB of address space", big[i].what);
#endif
    }
    zt_section("idx hostile headers (fuzzer findings)");
}

/* Random corruptions of valid files: every load either succeeds or fails
 * with a message; none may crash or leak (the sanitizer build runs this). */
static void test_fuzz(void)
{
    char good[512], bad[512];
    path_of(good, sizeof good, "a.safetensors");
    path_of(bad, sizeof bad, "fuzz.bin");
    FILE *f = fopen(good, "rb");
    static unsigned char orig[1 << 16], buf[1 << 16];
    size_t n = fread(orig, 1, sizeof orig, f);
    fclose(f);
    int failures = 0, loads = 0;
    for (int round = 0; round < 300; round++) {
        memcpy(buf, orig, n);
        uint32_t w[4];
        zs_philox(77, (uint64_t)round, w);
        size_t len = round % 3 == 0 ? w[3] % n : n; /* truncate a third */
        for (int k = 0; k < 1 + (int)(w[0] % 4); k++) {
            uint32_t v[4];
            zs_philox(78, (uint64_t)(round * 8 + k), v);
            /* mostly hit the header, where the structure is */
            size_t pos = v[0] % (v[1] % 2 ? 200 : n);
            buf[pos] = (unsigned char)v[2];
        }
        FILE *g = fopen(bad, "wb");
        fwrite(buf, 1, len, g);
        fclose(g);
        zs_tensor_set set;
        zs_status st = zs_safetensors_load(bad, &set);
        if (st == ZS_OK) {
            loads++;
            zs_tensor_set_free(&set);
        } else if (!zs_last_error()[0]) {
            failures++; /* failed without a message */
        }
        zs_clear_error();
        zs_tensor *t = zs_idx_load(bad); /* not an IDX file: must fail cleanly */
        zs_release(t);
        zs_clear_error();
    }
    /* the BPE vocabulary format and token files, likewise */
    const char *text = "the quick brown fox jumps over the lazy dog; the dog sleeps.";
    zs_bpe *b = zs_bpe_train(text, strlen(text), 280);
    char vpath[512], tpath[512];
    path_of(vpath, sizeof vpath, "v.bpe");
    path_of(tpath, sizeof tpath, "t.bin");
    int32_t ids[64];
    for (int i = 0; i < 64; i++)
        ids[i] = i * 3 % 256;
    ZT_CHECK(b && zs_bpe_save(b, vpath) == ZS_OK &&
             zs_tokens_write(tpath, ids, 64, 256) == ZS_OK, "bpe and tokens saved");
    const char *paths[] = {vpath, tpath};
    for (int which = 0; which < 2; which++) {
        FILE *h = fopen(paths[which], "rb");
        size_t m = fread(orig, 1, sizeof orig, h);
        fclose(h);
        for (int round = 0; round < 200; round++) {
            memcpy(buf, orig, m);
            uint32_t v[4];
            zs_philox(79 + (uint64_t)which, (uint64_t)round, v);
            size_t len = round % 4 == 0 ? v[3] % m : m;
            buf[v[0] % m] = (unsigned char)v[1];
            buf[v[2] % m] ^= (unsigned char)(1u << (v[1] % 8));
            FILE *g = fopen(bad, "wb");
            fwrite(buf, 1, len, g);
            fclose(g);
            if (which == 0) {
                zs_bpe *c = zs_bpe_load(bad);
                failures += !c && !zs_last_error()[0];
                zs_bpe_free(c);
            } else {
                zs_tokens t;
                zs_status st = zs_tokens_open(bad, &t);
                failures += st != ZS_OK && !zs_last_error()[0];
                if (st == ZS_OK)
                    zs_tokens_close(&t);
            }
            zs_clear_error();
        }
    }
    zs_bpe_free(b);
    ZT_CHECK(failures == 0, "%d corrupted files failed without a message", failures);
    printf("fuzz: 300 corrupted safetensors (%d still loadable), 200 BPE vocabularies "
           "and 200 token files: none crashed\n", loads);
    zt_section("corrupted files never crash");
}

int main(void)
{
    snprintf(dir, sizeof dir, "/tmp/zs_test_io_%d", (int)getpid());
    char cmd[300];
    snprintf(cmd, sizeof cmd, "mkdir -p %s", dir);
    if (system(cmd) != 0)
        return 1;
    test_safetensors();
    test_safetensors_corrupt();
    test_safetensors_hostile();
    test_idx();
    test_idx_hostile();
    test_fuzz();
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0)
        return 1;
    return zt_done();
}
