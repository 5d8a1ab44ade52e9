/*
 * bpe.c - the byte-level BPE tokenizer's vocabulary: hash maps, GPT-2's
 * pre-tokenizer, building and checking a vocabulary, decoding, and the two
 * file formats (Zhisuan's text format and GPT-2's encoder.json + vocab.bpe).
 * Training is in bpe_train.c, encoding in bpe_encode.c.
 *
 * Invariant of a finished zs_bpe (zsi_bpe_finish): ids 0..n_vocab-1 all
 * have bytes, every byte value is a one-byte token, and every merge joins
 * two tokens that exist before it (a byte or an earlier merge's result)
 * into a token whose bytes are their concatenation. Decoding therefore
 * never fails on valid ids, and encoding can always fall back to bytes.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "io/bpe.h"

/* ---- hash maps ----------------------------------------------------------- */

uint64_t zsi_hash_bytes(const uint8_t *s, size_t n)
{
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (uint64_t)n;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, s, 8);
        h = zsi_mix64(h ^ w);
        s += 8;
        n -= 8;
    }
    uint64_t w = 0;
    for (size_t i = 0; i < n; i++)
        w |= (uint64_t)s[i] << (8 * i);
    return zsi_mix64(h ^ w ^ 0x5bd1e995ull);
}

void zsi_strmap_deinit(zsi_strmap *m)
{
    free(m->slots);
    free(m->hash);
    free(m->off);
    free(m->len);
    free(m->arena);
    memset(m, 0, sizeof *m);
}

int32_t zsi_strmap_find(const zsi_strmap *m, const uint8_t *key, size_t len,
                        uint64_t h)
{
    if (!m->cap)
        return -1;
    for (size_t i = h & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
        int32_t e = m->slots[i] - 1;
        if (e < 0)
            return -1;
        if (m->hash[e] == h && m->len[e] == len &&
            !memcmp(m->arena + m->off[e], key, len))
            return e;
    }
}

static int strmap_grow(zsi_strmap *m)
{
    size_t cap = m->cap ? m->cap * 2 : 1024;
    int32_t *slots = calloc(cap, sizeof *slots);
    if (!slots)
        return -1;
    for (size_t e = 0; e < m->n; e++) {
        size_t i = m->hash[e] & (cap - 1);
        while (slots[i])
            i = (i + 1) & (cap - 1);
        slots[i] = (int32_t)e + 1;
    }
    free(m->slots);
    m->slots = slots;
    m->cap = cap;
    return 0;
}

static int grow_array(void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return 0;
    size_t c = *cap ? *cap : 64;
    while (c < need)
        c *= 2;
    void *q = realloc(*p, c * elem);
    if (!q)
        return -1;
    *p = q;
    *cap = c;
    return 0;
}

int32_t zsi_strmap_insert(zsi_strmap *m, const uint8_t *key, size_t len,
                          uint64_t h, int *added)
{
    *added = 0;
    int32_t e = zsi_strmap_find(m, key, len, h);
    if (e >= 0)
        return e;
    if (m->n >= INT32_MAX - 1 || len > UINT32_MAX)
        return -1;
    if ((m->n + 1) * 2 > m->cap && strmap_grow(m))
        return -1;
    size_t ncap = m->ncap;
    if (m->n + 1 > ncap) {
        size_t c = ncap;
        if (grow_array((void **)&m->hash, &c, m->n + 1, sizeof *m->hash))
            return -1;
        c = ncap;
        if (grow_array((void **)&m->off, &c, m->n + 1, sizeof *m->off))
            return -1;
        c = ncap;
        if (grow_array((void **)&m->len, &c, m->n + 1, sizeof *m->len))
            return -1;
        m->ncap = c;
    }
    if (grow_array((void **)&m->arena, &m->arena_cap, m->arena_len + len + 1, 1))
        return -1;
    e = (int32_t)m->n++;
    memcpy(m->arena + m->arena_len, key, len);
    m->hash[e] = h;
    m->off[e] = m->arena_len;
    m->len[e] = (uint32_t)len;
    m->arena_len += len;
    size_t i = h & (m->cap - 1);
    while (m->slots[i])
        i = (i + 1) & (m->cap - 1);
    m->slots[i] = e + 1;
    *added = 1;
    return e;
}

void zsi_pairmap_deinit(zsi_pairmap *m)
{
    free(m->keys);
    free(m->vals);
    memset(m, 0, sizeof *m);
}

int32_t zsi_pairmap_get(const zsi_pairmap *m, uint64_t key)
{
    if (!m->cap)
        return -1;
    for (size_t i = zsi_mix64(key) & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
        if (m->keys[i] == key)
            return m->vals[i];
        if (m->keys[i] == UINT64_MAX)
            return -1;
    }
}

static int pairmap_grow(zsi_pairmap *m)
{
    size_t cap = m->cap ? m->cap * 2 : 1024;
    uint64_t *keys = malloc(cap * sizeof *keys);
    int32_t *vals = malloc(cap * sizeof *vals);
    if (!keys || !vals) {
        free(keys);
        free(vals);
        return -1;
    }
    memset(keys, 0xff, cap * sizeof *keys);
    for (size_t j = 0; j < m->cap; j++) {
        if (m->keys[j] == UINT64_MAX)
            continue;
        size_t i = zsi_mix64(m->keys[j]) & (cap - 1);
        while (keys[i] != UINT64_MAX)
            i = (i + 1) & (cap - 1);
        keys[i] = m->keys[j];
        vals[i] = m->vals[j];
    }
    free(m->keys);
    free(m->vals);
    m->keys = keys;
    m->vals = vals;
    m->cap = cap;
    return 0;
}

int64_t zsi_pairmap_slot(zsi_pairmap *m, uint64_t key, int32_t init)
{
    if ((m->n + 1) * 2 > m->cap && pairmap_grow(m))
        return -1;
    size_t i = zsi_mix64(key) & (m->cap - 1);
    while (m->keys[i] != key) {
        if (m->keys[i] == UINT64_MAX) {
            m->keys[i] = key;
            m->vals[i] = init;
            m->n++;
            break;
        }
        i = (i + 1) & (m->cap - 1);
    }
    return (int64_t)i;
}

/* ---- pre-tokenizer --------------------------------------------------------- */

enum { CL_L = ZSI_UC_L, CL_N = ZSI_UC_N, CL_S = ZSI_UC_S, CL_O = ZSI_UC_O };

/* Classes of ASCII: letters, digits, \t\n\v\f\r and space, the rest. */
#define L_ CL_L,
#define N_ CL_N,
#define S_ CL_S,
#define O_ CL_O,
static const uint8_t ascii_class[128] = {
    O_ O_ O_ O_ O_ O_ O_ O_ O_ S_ S_ S_ S_ S_ O_ O_
    O_ O_ O_ O_ O_ O_ O_ O_ O_ O_ O_ O_ O_ O_ O_ O_
    S_ O_ O_ O_ O_ O_ O_ O_ O_ O_ O_ O_ O_ O_ O_ O_
    N_ N_ N_ N_ N_ N_ N_ N_ N_ N_ O_ O_ O_ O_ O_ O_
    O_ L_ L_ L_ L_ L_ L_ L_ L_ L_ L_ L_ L_ L_ L_ L_
    L_ L_ L_ L_ L_ L_ L_ L_ L_ L_ L_ O_ O_ O_ O_ O_
    O_ L_ L_ L_ L_ L_ L_ L_ L_ L_ L_ L_ L_ L_ L_ L_
    L_ L_ L_ L_ L_ L_ L_ L_ L_ L_ L_ O_ O_ O_ O_ O_
};
#undef L_
#undef N_
#undef S_
#undef O_

static int unicode_class(uint32_t cp)
{
    const zsi_urange *r = zsi_unicode_ranges;
    size_t lo = 0, hi = zsi_unicode_nranges;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (cp < r[mid].lo)
            hi = mid;
        else if (cp > r[mid].hi)
            lo = mid + 1;
        else
            return r[mid].cl;
    }
    return CL_L;
}

/* Class of the code point at s[i] and its length in bytes (strict UTF-8:
 * no overlong forms, surrogates or values above 0x10FFFF). */
static int class_at(const uint8_t *s, size_t n, size_t i, size_t *len)
{
    uint8_t c = s[i];
    if (c < 0x80) {
        *len = 1;
        return ascii_class[c];
    }
    size_t need;
    uint32_t cp;
    uint8_t lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF)
        need = 1, cp = c & 0x1F;
    else if (c >= 0xE0 && c <= 0xEF) {
        need = 2, cp = c & 0x0F;
        lo = c == 0xE0 ? 0xA0 : 0x80;
        hi = c == 0xED ? 0x9F : 0xBF;
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 3, cp = c & 0x07;
        lo = c == 0xF0 ? 0x90 : 0x80;
        hi = c == 0xF4 ? 0x8F : 0xBF;
    } else {
        *len = 1;
        return CL_O;
    }
    if (i + need >= n) {
        *len = 1;
        return CL_O;
    }
    for (size_t k = 1; k <= need; k++) {
        uint8_t t = s[i + k];
        if (t < (k == 1 ? lo : 0x80) || t > (k == 1 ? hi : 0xBF)) {
            *len = 1;
            return CL_O;
        }
        cp = cp << 6 | (t & 0x3F);
    }
    *len = need + 1;
    return unicode_class(cp);
}

static size_t run_of(const uint8_t *s, size_t n, size_t i, int cl)
{
    size_t len;
    while (i < n && class_at(s, n, i, &len) == cl)
        i += len;
    return i;
}

size_t zsi_pretok_next(const uint8_t *s, size_t n, size_t i)
{
    if (s[i] == '\'' && i + 1 < n) {
        uint8_t a = s[i + 1], b = i + 2 < n ? s[i + 2] : 0;
        if (a == 's' || a == 't' || a == 'm' || a == 'd')
            return i + 2;
        if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') ||
            (a == 'l' && b == 'l'))
            return i + 3;
    }
    size_t len;
    int cl = class_at(s, n, i, &len);
    if (cl != CL_S)
        return run_of(s, n, i + len, cl);
    if (s[i] == ' ' && i + 1 < n) {
        size_t l2;
        int c2 = class_at(s, n, i + 1, &l2);
        if (c2 != CL_S)
            return run_of(s, n, i + 1 + l2, c2);
    }
    /* \s+(?!\S)|\s+ : a run followed by non-space gives up its last char */
    size_t j = i, last = i;
    while (j < n && class_at(s, n, j, &len) == CL_S) {
        last = j;
        j += len;
    }
    if (j < n && last > i)
        return last;
    return j;
}

/* ---- building a vocabulary ------------------------------------------------ */

zs_bpe *zsi_bpe_alloc(int32_t n_vocab)
{
    if (n_vocab < 257 || n_vocab > (1 << 24)) {
        zs_set_error("bpe: vocabulary size %d outside [257, %d]", n_vocab,
                     1 << 24);
        return NULL;
    }
    zs_bpe *b = calloc(1, sizeof *b);
    if (b) {
        b->n_vocab = n_vocab;
        b->eot = -1;
        b->tok_off = calloc((size_t)n_vocab, sizeof *b->tok_off);
        b->tok_len = calloc((size_t)n_vocab, sizeof *b->tok_len);
    }
    if (!b || !b->tok_off || !b->tok_len) {
        zs_bpe_free(b);
        zs_set_error_code(ZS_ERR_NOMEM, "bpe: out of memory");
        return NULL;
    }
    return b;
}

void zs_bpe_free(zs_bpe *b)
{
    if (!b)
        return;
    free(b->tok_off);
    free(b->tok_len);
    free(b->tok_bytes);
    free(b->merges);
    zsi_pairmap_deinit(&b->ranks);
    free(b);
}

int zsi_bpe_set_token(zs_bpe *b, int32_t id, const uint8_t *s, size_t len)
{
    if (len == 0 || len > UINT32_MAX || id < 0 || id >= b->n_vocab) {
        zs_set_error("bpe: bad token (id %d, %zu bytes)", id, len);
        return -1;
    }
    if (grow_array((void **)&b->tok_bytes, &b->tok_bytes_cap,
                   b->tok_bytes_len + len, 1)) {
        zs_set_error_code(ZS_ERR_NOMEM, "bpe: out of memory");
        return -1;
    }
    memcpy(b->tok_bytes + b->tok_bytes_len, s, len);
    b->tok_off[id] = b->tok_bytes_len;
    b->tok_len[id] = (uint32_t)len;
    b->tok_bytes_len += len;
    return 0;
}

int zsi_bpe_add_merge(zs_bpe *b, int32_t left, int32_t right, int32_t result)
{
    size_t cap = (size_t)b->merges_cap;
    if (grow_array((void **)&b->merges, &cap, (size_t)b->n_merges + 1,
                   sizeof *b->merges) || cap > INT32_MAX) {
        zs_set_error_code(ZS_ERR_NOMEM, "bpe: out of memory");
        return -1;
    }
    b->merges_cap = (int32_t)cap;
    int32_t *m = b->merges[b->n_merges++];
    m[0] = left;
    m[1] = right;
    m[2] = result;
    return 0;
}

static zs_status check_merge(const zs_bpe *b, int32_t r, const uint8_t *avail,
                             const char *what)
{
    const int32_t *m = b->merges[r];
    for (int k = 0; k < 3; k++)
        if (m[k] < 0 || m[k] >= b->n_vocab || m[k] == b->eot)
            return zs_set_error_code(ZS_ERR_FORMAT,
                                     "%s: merge %d uses id %d, which is %s",
                                     what, r, m[k],
                                     m[k] == b->eot && m[k] >= 0
                                         ? "the end-of-text token"
                                         : "out of range");
    if (!avail[m[0]] || !avail[m[1]])
        return zs_set_error_code(ZS_ERR_FORMAT,
                                 "%s: merge %d joins token %d, which is "
                                 "neither a byte nor made by an earlier merge",
                                 what, r, avail[m[0]] ? m[1] : m[0]);
    size_t l0 = b->tok_len[m[0]], l1 = b->tok_len[m[1]];
    if (b->tok_len[m[2]] != l0 + l1 ||
        memcmp(b->tok_bytes + b->tok_off[m[2]], b->tok_bytes + b->tok_off[m[0]], l0) ||
        memcmp(b->tok_bytes + b->tok_off[m[2]] + l0,
               b->tok_bytes + b->tok_off[m[1]], l1))
        return zs_set_error_code(ZS_ERR_FORMAT,
                                 "%s: merge %d: token %d is not token %d "
                                 "followed by token %d",
                                 what, r, m[2], m[0], m[1]);
    return ZS_OK;
}

zs_status zsi_bpe_finish(zs_bpe *b, const char *what)
{
    const size_t el = sizeof ZS_BPE_EOT - 1;
    if (b->eot >= 0 && (b->tok_len[b->eot] != el ||
                        memcmp(b->tok_bytes + b->tok_off[b->eot], ZS_BPE_EOT, el)))
        return zs_set_error_code(ZS_ERR_FORMAT, "%s: the end-of-text token %d "
                                 "is not \"" ZS_BPE_EOT "\"", what, b->eot);
    for (int c = 0; c < 256; c++)
        b->byte_id[c] = -1;
    for (int32_t id = 0; id < b->n_vocab; id++) {
        if (!b->tok_len[id])
            return zs_set_error_code(ZS_ERR_FORMAT, "%s: token id %d is not "
                                     "defined", what, id);
        uint8_t c = b->tok_bytes[b->tok_off[id]];
        if (b->tok_len[id] == 1 && id != b->eot && b->byte_id[c] < 0)
            b->byte_id[c] = id;
    }
    for (int c = 0; c < 256; c++)
        if (b->byte_id[c] < 0)
            return zs_set_error_code(ZS_ERR_FORMAT, "%s: byte 0x%02x has no "
                                     "token", what, c);
    uint8_t *avail = calloc((size_t)b->n_vocab, 1);
    if (!avail)
        return zs_set_error_code(ZS_ERR_NOMEM, "%s: out of memory", what);
    for (int c = 0; c < 256; c++)
        avail[b->byte_id[c]] = 1;
    zs_status st = ZS_OK;
    zsi_pairmap_deinit(&b->ranks);
    for (int32_t r = 0; r < b->n_merges && st == ZS_OK; r++) {
        st = check_merge(b, r, avail, what);
        if (st != ZS_OK)
            break;
        avail[b->merges[r][2]] = 1;
        int64_t slot = zsi_pairmap_slot(
            &b->ranks, zsi_pair_key(b->merges[r][0], b->merges[r][1]), r);
        if (slot < 0)
            st = zs_set_error_code(ZS_ERR_NOMEM, "%s: out of memory", what);
    }
    free(avail);
    return st;
}

/* ---- queries and decoding ------------------------------------------------- */

int32_t zs_bpe_vocab_size(const zs_bpe *b) { return b ? b->n_vocab : 0; }
int32_t zs_bpe_eot(const zs_bpe *b) { return b ? b->eot : -1; }
int32_t zs_bpe_n_merges(const zs_bpe *b) { return b ? b->n_merges : 0; }

zs_status zs_bpe_merge(const zs_bpe *b, int32_t rank, int32_t *left,
                       int32_t *right, int32_t *result)
{
    if (!b || rank < 0 || rank >= b->n_merges)
        return zs_set_error("bpe: merge rank %d out of range [0, %d)", rank,
                            b ? b->n_merges : 0);
    *left = b->merges[rank][0];
    *right = b->merges[rank][1];
    *result = b->merges[rank][2];
    return ZS_OK;
}

const uint8_t *zs_bpe_token(const zs_bpe *b, int32_t id, size_t *len)
{
    if (!b || id < 0 || id >= b->n_vocab) {
        zs_set_error("bpe: token id %d out of range [0, %d)", id,
                     b ? b->n_vocab : 0);
        return NULL;
    }
    *len = b->tok_len[id];
    return b->tok_bytes + b->tok_off[id];
}

zs_status zs_bpe_decode(const zs_bpe *b, const int32_t *ids, size_t n,
                        char **text, size_t *len)
{
    *text = NULL;
    *len = 0;
    if (!b || (n && !ids))
        return zs_set_error("bpe decode: NULL tokenizer or ids");
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= b->n_vocab)
            return zs_set_error("bpe decode: id %d at position %zu is out of "
                                "range [0, %d)", ids[i], i, b->n_vocab);
        total += b->tok_len[ids[i]];
    }
    char *out = malloc(total + 1);
    if (!out)
        return zs_set_error_code(ZS_ERR_NOMEM, "bpe decode: out of memory "
                                 "(%zu bytes)", total);
    size_t p = 0;
    for (size_t i = 0; i < n; i++) {
        memcpy(out + p, b->tok_bytes + b->tok_off[ids[i]], b->tok_len[ids[i]]);
        p += b->tok_len[ids[i]];
    }
    out[p] = 0;
    *text = out;
    *len = p;
    return ZS_OK;
}

/* ---- Zhisuan's format -------------------------------------------------- */

zs_status zs_bpe_save(const zs_bpe *b, const char *path)
{
    if (!b || !path)
        return zs_set_error("bpe save: NULL tokenizer or path");
    size_t tl = strlen(path) + 32;
    char *tmp = malloc(tl);
    if (!tmp)
        return zs_set_error_code(ZS_ERR_NOMEM, "bpe save: out of memory");
    snprintf(tmp, tl, "%s.tmp.%d", path, (int)getpid());
    FILE *f = fopen(tmp, "w");
    if (!f) {
        zs_status st = zs_set_error_code(ZS_ERR_IO, "bpe save: cannot create "
                                         "%s: %s", tmp, strerror(errno));
        free(tmp);
        return st;
    }
    fprintf(f, "zs-bpe 1\nvocab_size %d merges %d eot %d\n", b->n_vocab,
            b->n_merges, b->eot);
    static const char hex[] = "0123456789abcdef";
    for (int32_t id = 0; id < b->n_vocab; id++) {
        fprintf(f, "token %d ", id);
        const uint8_t *s = b->tok_bytes + b->tok_off[id];
        for (uint32_t k = 0; k < b->tok_len[id]; k++) {
            fputc(hex[s[k] >> 4], f);
            fputc(hex[s[k] & 15], f);
        }
        fputc('\n', f);
    }
    for (int32_t r = 0; r < b->n_merges; r++)
        fprintf(f, "merge %d %d %d\n", b->merges[r][0], b->merges[r][1],
                b->merges[r][2]);
    int bad = ferror(f) || fflush(f) || fsync(fileno(f));
    bad |= fclose(f) != 0;
    if (!bad)
        bad = rename(tmp, path) != 0;
    zs_status st = ZS_OK;
    if (bad) {
        st = zs_set_error_code(ZS_ERR_IO, "bpe save: writing %s: %s", path,
                               strerror(errno));
        unlink(tmp);
    }
    free(tmp);
    return st;
}

/* Whole file + NUL terminator (malloc'd), or NULL + message. */
static char *slurp(const char *path, const char *what, size_t *size)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        zs_set_error_code(ZS_ERR_IO, "%s: cannot open %s: %s", what, path,
                          strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        n += fread(buf + n, 1, cap - 1 - n, f);
        if (n < cap - 1)
            break;
        char *nb = realloc(buf, cap * 2);
        if (!nb) {
            free(buf);
            buf = NULL;
        } else {
            buf = nb;
            cap *= 2;
        }
    }
    int err = ferror(f);
    fclose(f);
    if (!buf || err) {
        free(buf);
        zs_set_error_code(buf ? ZS_ERR_IO : ZS_ERR_NOMEM, "%s: cannot read %s",
                          what, path);
        return NULL;
    }
    buf[n] = 0;
    *size = n;
    return buf;
}

/* Splits line (NUL-terminated, modified) at single spaces into at most
 * max fields; returns the count, or max + 1 when there are more. */
static int split_fields(char *line, char **f, int max)
{
    int k = 0;
    for (char *p = line;;) {
        if (k == max)
            return max + 1;
        f[k++] = p;
        char *sp = strchr(p, ' ');
        if (!sp)
            return k;
        *sp = 0;
        p = sp + 1;
    }
}

static bool parse_i32(const char *s, int32_t lo, int32_t hi, int32_t *out)
{
    if (!*s)
        return false;
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (*end || errno || v < lo || v > hi)
        return false;
    *out = (int32_t)v;
    return true;
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    return -1;
}

/* Next line of the buffer (NUL-terminated in place), or NULL at the end. */
static char *next_line(char **cur, char *end)
{
    if (*cur >= end)
        return NULL;
    char *line = *cur, *nl = memchr(line, '\n', (size_t)(end - line));
    if (nl) {
        *nl = 0;
        *cur = nl + 1;
    } else {
        *cur = end;
    }
    size_t l = strlen(line);
    if (l && line[l - 1] == '\r')
        line[l - 1] = 0;
    return line;
}

static zs_status load_token_line(zs_bpe *b, char *line, int32_t id,
                                 uint8_t *scratch, const char *path, int ln)
{
    char *f[4];
    int32_t got;
    if (split_fields(line, f, 3) != 3 || strcmp(f[0], "token") ||
        !parse_i32(f[1], 0, INT32_MAX, &got) || got != id)
        return zs_set_error_code(ZS_ERR_FORMAT, "%s:%d: expected \"token %d "
                                 "<hex>\"", path, ln, id);
    size_t hl = strlen(f[2]);
    if (hl == 0 || hl % 2)
        return zs_set_error_code(ZS_ERR_FORMAT, "%s:%d: token hex has odd or "
                                 "zero length", path, ln);
    for (size_t k = 0; k < hl / 2; k++) {
        int hi = hexval(f[2][2 * k]), lo = hexval(f[2][2 * k + 1]);
        if (hi < 0 || lo < 0)
            return zs_set_error_code(ZS_ERR_FORMAT, "%s:%d: bad hex digit",
                                     path, ln);
        scratch[k] = (uint8_t)(hi << 4 | lo);
    }
    return zsi_bpe_set_token(b, id, scratch, hl / 2) ? ZS_ERR_NOMEM : ZS_OK;
}

static zs_status load_body(zs_bpe *b, char *cur, char *end, int32_t n_merges,
                           const char *path)
{
    uint8_t *scratch = malloc((size_t)(end - cur) / 2 + 1);
    if (!scratch)
        return zs_set_error_code(ZS_ERR_NOMEM, "bpe load: out of memory");
    zs_status st = ZS_OK;
    int ln = 2;
    for (int32_t id = 0; id < b->n_vocab && st == ZS_OK; id++) {
        char *line = next_line(&cur, end);
        ln++;
        st = line ? load_token_line(b, line, id, scratch, path, ln)
                  : zs_set_error_code(ZS_ERR_FORMAT, "%s:%d: file ends before "
                                      "token %d", path, ln, id);
    }
    free(scratch);
    for (int32_t r = 0; r < n_merges && st == ZS_OK; r++) {
        char *line = next_line(&cur, end), *f[5];
        int32_t v[3];
        ln++;
        if (!line || split_fields(line, f, 4) != 4 || strcmp(f[0], "merge") ||
            !parse_i32(f[1], 0, INT32_MAX, &v[0]) ||
            !parse_i32(f[2], 0, INT32_MAX, &v[1]) ||
            !parse_i32(f[3], 0, INT32_MAX, &v[2]))
            st = zs_set_error_code(ZS_ERR_FORMAT, "%s:%d: expected \"merge "
                                   "<left> <right> <result>\" (merge %d of %d)",
                                   path, ln, r, n_merges);
        else if (zsi_bpe_add_merge(b, v[0], v[1], v[2]))
            st = ZS_ERR_NOMEM;
    }
    char *extra;
    while (st == ZS_OK && (extra = next_line(&cur, end)) != NULL)
        if (*extra)
            st = zs_set_error_code(ZS_ERR_FORMAT, "%s:%d: unexpected text after "
                                   "the last merge", path, ln + 1);
    return st;
}

zs_bpe *zs_bpe_load(const char *path)
{
    size_t size;
    char *buf = path ? slurp(path, "bpe load", &size) : NULL;
    if (!buf) {
        if (!path)
            zs_set_error("bpe load: NULL path");
        return NULL;
    }
    char *cur = buf, *end = buf + size, *f[7];
    char *l1 = next_line(&cur, end), *l2 = next_line(&cur, end);
    int32_t v, m, e;
    zs_bpe *b = NULL;
    if (!l1 || strcmp(l1, "zs-bpe 1")) {
        zs_set_error_code(ZS_ERR_FORMAT, "%s:1: not a zs-bpe version 1 file "
                          "(expected \"zs-bpe 1\")", path);
    } else if (!l2 || split_fields(l2, f, 6) != 6 || strcmp(f[0], "vocab_size") ||
               strcmp(f[2], "merges") || strcmp(f[4], "eot") ||
               !parse_i32(f[1], 0, INT32_MAX, &v) ||
               !parse_i32(f[3], 0, INT32_MAX, &m) ||
               !parse_i32(f[5], -1, INT32_MAX, &e) || e >= v) {
        zs_set_error_code(ZS_ERR_FORMAT, "%s:2: expected \"vocab_size V merges "
                          "M eot E\" with -1 <= E < V", path);
    } else if ((size_t)v * 9 > size) { /* "token I HH\n" >= 9 bytes each */
        zs_set_error_code(ZS_ERR_FORMAT, "%s: header promises %d tokens but "
                          "the file has only %zu bytes (truncated?)", path, v,
                          size);
    } else if ((b = zsi_bpe_alloc(v)) != NULL) {
        b->eot = e;
        if (load_body(b, cur, end, m, path) != ZS_OK ||
            zsi_bpe_finish(b, path) != ZS_OK) {
            zs_bpe_free(b);
            b = NULL;
        }
    }
    free(buf);
    return b;
}

/* ---- GPT-2's format ------------------------------------------------------- */

/* GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves,
 * the other 68 bytes map to 256, 257, ... in byte order. */
static void gpt2_alphabet(int16_t byte_of_cp[512])
{
    for (int i = 0; i < 512; i++)
        byte_of_cp[i] = -1;
    int extra = 0;
    for (int c = 0; c < 256; c++) {
        bool keep = (c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) ||
                    (c >= 0xAE && c <= 0xFF);
        byte_of_cp[keep ? c : 256 + extra++] = (int16_t)c;
    }
}

/* Maps a UTF-8 string in GPT-2's alphabet to bytes (out has room for
 * strlen(s)); returns the byte count, or -1 on a character outside it. */
static long gpt2_decode(const int16_t *alpha, const char *s, uint8_t *out)
{
    const uint8_t *p = (const uint8_t *)s;
    long n = 0;
    while (*p) {
        uint32_t cp;
        if (p[0] < 0x80)
            cp = *p++;
        else if ((p[0] & 0xE0) == 0xC0 && (p[1] & 0xC0) == 0x80) {
            cp = (uint32_t)(p[0] & 0x1F) << 6 | (p[1] & 0x3F);
            p += 2;
        } else {
            return -1;
        }
        if (cp >= 512 || alpha[cp] < 0)
            return -1;
        out[n++] = (uint8_t)alpha[cp];
    }
    return n;
}

/* Defines every token of encoder.json; by_bytes maps token bytes (all but
 * end-of-text) to entries, id_of_entry (room for every key) entry -> id. */
static zs_status gpt2_tokens(zs_bpe *b, cJSON *root, const int16_t *alpha,
                             zsi_strmap *by_bytes, int32_t *id_of_entry,
                             const char *path)
{
    cJSON *it;
    cJSON_ArrayForEach(it, root) {
        size_t kl = strlen(it->string);
        uint8_t *tmp = malloc(kl + 1);
        if (!tmp)
            return zs_set_error_code(ZS_ERR_NOMEM, "bpe gpt2: out of memory");
        int32_t id = (int32_t)it->valuedouble;
        bool is_eot = !strcmp(it->string, ZS_BPE_EOT);
        long n = (long)kl;
        if (is_eot)
            memcpy(tmp, it->string, kl);
        else
            n = gpt2_decode(alpha, it->string, tmp);
        zs_status st = ZS_OK;
        int added;
        int32_t e = 0;
        if (n <= 0)
            st = zs_set_error_code(ZS_ERR_FORMAT, "%s: token \"%s\" is empty "
                                   "or has a character outside GPT-2's byte "
                                   "alphabet", path, it->string);
        else if (b->tok_len[id])
            st = zs_set_error_code(ZS_ERR_FORMAT, "%s: id %d appears twice",
                                   path, id);
        else if (zsi_bpe_set_token(b, id, tmp, (size_t)n))
            st = ZS_ERR_NOMEM;
        else if (is_eot)
            b->eot = id;
        else if ((e = zsi_strmap_insert(by_bytes, tmp, (size_t)n,
                                        zsi_hash_bytes(tmp, (size_t)n),
                                        &added)) < 0)
            st = zs_set_error_code(ZS_ERR_NOMEM, "bpe gpt2: out of memory");
        else if (added)
            id_of_entry[e] = id;
        free(tmp);
        if (st != ZS_OK)
            return st;
    }
    return ZS_OK;
}

/* The id of a token string of vocab.bpe, or -1 + message. */
static int32_t gpt2_lookup(const int16_t *alpha, const zsi_strmap *by_bytes,
                           const int32_t *id_of_entry, const char *s,
                           uint8_t *tmp, const char *path, int ln)
{
    long n = gpt2_decode(alpha, s, tmp);
    int32_t e = n > 0 ? zsi_strmap_find(by_bytes, tmp, (size_t)n,
                                        zsi_hash_bytes(tmp, (size_t)n))
                      : -1;
    if (e < 0)
        zs_set_error_code(ZS_ERR_FORMAT, "%s:%d: token \"%s\" is not in "
                          "encoder.json", path, ln, s);
    return e < 0 ? -1 : id_of_entry[e];
}

static zs_status gpt2_merges(zs_bpe *b, char *buf, size_t size,
                             const int16_t *alpha, const zsi_strmap *by_bytes,
                             const int32_t *id_of_entry, const char *path)
{
    char *cur = buf, *end = buf + size, *line;
    uint8_t *tmp = malloc(size + 1);
    if (!tmp)
        return zs_set_error_code(ZS_ERR_NOMEM, "bpe gpt2: out of memory");
    zs_status st = ZS_OK;
    for (int ln = 1; st == ZS_OK && (line = next_line(&cur, end)); ln++) {
        if ((ln == 1 && !strncmp(line, "#version", 8)) || !*line)
            continue;
        char *f[3];
        if (split_fields(line, f, 2) != 2 || !*f[0] || !*f[1]) {
            st = zs_set_error_code(ZS_ERR_FORMAT, "%s:%d: expected two tokens "
                                   "separated by one space", path, ln);
            break;
        }
        size_t l0 = strlen(f[0]), l1 = strlen(f[1]);
        char *joined = malloc(l0 + l1 + 1);
        int32_t ids[3] = {-1, -1, -1};
        if (joined) {
            memcpy(joined, f[0], l0);
            memcpy(joined + l0, f[1], l1 + 1);
            ids[0] = gpt2_lookup(alpha, by_bytes, id_of_entry, f[0], tmp, path, ln);
            if (ids[0] >= 0)
                ids[1] = gpt2_lookup(alpha, by_bytes, id_of_entry, f[1], tmp, path, ln);
            if (ids[1] >= 0)
                ids[2] = gpt2_lookup(alpha, by_bytes, id_of_entry, joined, tmp, path, ln);
        } else {
            zs_set_error_code(ZS_ERR_NOMEM, "bpe gpt2: out of memory");
        }
        free(joined);
        if (ids[2] < 0 || zsi_bpe_add_merge(b, ids[0], ids[1], ids[2]))
            st = ZS_ERR_FORMAT;
    }
    free(tmp);
    return st;
}

/* Parses encoder.json into a tokenizer with every token defined. */
static zs_bpe *gpt2_encoder(const char *path, const int16_t *alpha,
                            zsi_strmap *by_bytes, int32_t **id_of_entry)
{
    size_t size;
    char *buf = slurp(path, "bpe gpt2", &size);
    if (!buf)
        return NULL;
    cJSON *root = cJSON_ParseWithLength(buf, size);
    free(buf);
    int32_t maxid = -1;
    cJSON *it;
    bool ok = root && cJSON_IsObject(root);
    cJSON *obj = ok ? root : NULL;
    cJSON_ArrayForEach(it, obj) {
        double v = cJSON_IsNumber(it) ? it->valuedouble : -1;
        if (v < 0 || v >= (1 << 24) || v != (double)(int32_t)v) {
            zs_set_error_code(ZS_ERR_FORMAT, "%s: token \"%s\" has id that is "
                              "not an integer in [0, 2^24)", path, it->string);
            cJSON_Delete(root);
            return NULL;
        }
        if ((int32_t)v > maxid)
            maxid = (int32_t)v;
    }
    if (!ok) {
        zs_set_error_code(ZS_ERR_FORMAT, "%s: not a JSON object of token ids",
                          path);
        cJSON_Delete(root);
        return NULL;
    }
    zs_bpe *b = zsi_bpe_alloc(maxid + 1);
    *id_of_entry = b ? malloc(((size_t)cJSON_GetArraySize(root) + 1) *
                              sizeof **id_of_entry)
                     : NULL;
    if (b && !*id_of_entry)
        zs_set_error_code(ZS_ERR_NOMEM, "bpe gpt2: out of memory");
    if (b && (!*id_of_entry || gpt2_tokens(b, root, alpha, by_bytes,
                                           *id_of_entry, path) != ZS_OK)) {
        zs_bpe_free(b);
        b = NULL;
    }
    cJSON_Delete(root);
    return b;
}

zs_bpe *zs_bpe_load_gpt2(const char *encoder_json, const char *vocab_bpe)
{
    if (!encoder_json || !vocab_bpe) {
        zs_set_error("bpe gpt2: NULL path");
        return NULL;
    }
    int16_t alpha[512];
    gpt2_alphabet(alpha);
    zsi_strmap by_bytes = {0};
    int32_t *id_of_entry = NULL;
    zs_bpe *b = gpt2_encoder(encoder_json, alpha, &by_bytes, &id_of_entry);
    size_t size;
    char *buf = b ? slurp(vocab_bpe, "bpe gpt2", &size) : NULL;
    zs_status st = buf ? gpt2_merges(b, buf, size, alpha, &by_bytes,
                                     id_of_entry, vocab_bpe)
                       : ZS_ERR_IO;
    if (st == ZS_OK)
        st = zsi_bpe_finish(b, encoder_json);
    free(buf);
    free(id_of_entry);
    zsi_strmap_deinit(&by_bytes);
    if (st != ZS_OK) {
        zs_bpe_free(b);
        return NULL;
    }
    return b;
}
