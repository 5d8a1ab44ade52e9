/*
 * bpe_encode.c - text -> token ids with a finished zs_bpe.
 *
 * The text is split into pre-tokens (zsi_pretok_next); each pre-token
 * starts as its bytes and repeatedly merges the adjacent pair of lowest
 * rank, leftmost first. A min-heap of (rank, position) over a linked list
 * of symbols makes that O(m log m) for a pre-token of m bytes, and gives
 * GPT-2's result: a merge's parts always exist before it (zsi_bpe_finish),
 * so pairs created by a merge rank after it, and all occurrences of one
 * rank are merged left to right before any later rank, as GPT-2 does.
 *
 * Encoded pre-tokens of up to CACHE_MAX_LEN bytes are cached per call.
 * Texts of 16 MB and more are cut at safe pre-token boundaries into 4 MB
 * chunks encoded in parallel (zs_parallel_for), a cache per thread; the
 * result does not depend on the thread count. (One thread encodes the
 * 4.4 MB Bible in about 35 ms, so smaller texts are not worth splitting.)
 */
#include <string.h>

#include "io/bpe.h"

enum {
    CACHE_MAX_LEN = 64,          /* longer pre-tokens are not cached */
    CACHE_MAX_ENTRIES = 1 << 20, /* per chunk */
    CHUNK_BYTES = 4 << 20,       /* parallel encoding: bytes per chunk */
};

/* Per-thread encoder state. */
typedef struct enc {
    const zs_bpe *b;
    zsi_strmap cache;       /* pre-token bytes -> entry */
    int32_t *c_off, *c_len; /* entry -> ids in pool */
    size_t c_cap;
    int32_t *pool;
    size_t pool_len, pool_cap;
    int32_t *sym, *prev, *next; /* symbols of the current pre-token */
    uint64_t *heap;             /* rank << 32 | position */
    size_t scap;
    int failed;
} enc;

static void enc_deinit(enc *e)
{
    zsi_strmap_deinit(&e->cache);
    free(e->c_off);
    free(e->c_len);
    free(e->pool);
    free(e->sym);
    free(e->prev);
    free(e->next);
    free(e->heap);
}

static int enc_scratch(enc *e, size_t m)
{
    if (m <= e->scap)
        return 0;
    size_t c = m < 256 ? 256 : m;
    int32_t *s = realloc(e->sym, c * sizeof *s);
    if (s)
        e->sym = s;
    int32_t *p = realloc(e->prev, c * sizeof *p);
    if (p)
        e->prev = p;
    int32_t *nx = realloc(e->next, c * sizeof *nx);
    if (nx)
        e->next = nx;
    uint64_t *h = realloc(e->heap, 2 * c * sizeof *h);
    if (h)
        e->heap = h;
    if (!s || !p || !nx || !h)
        return -1;
    e->scap = c;
    return 0;
}

static void heap_push(uint64_t *h, size_t *n, uint64_t v)
{
    size_t i = (*n)++;
    while (i > 0 && h[(i - 1) / 2] > v) {
        h[i] = h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h[i] = v;
}

static uint64_t heap_pop(uint64_t *h, size_t *n)
{
    uint64_t top = h[0], v = h[--*n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n)
            break;
        if (c + 1 < *n && h[c + 1] < h[c])
            c++;
        if (h[c] >= v)
            break;
        h[i] = h[c];
        i = c;
    }
    if (*n)
        h[i] = v;
    return top;
}

/* Pushes the pair starting at symbol i if it is a merge. */
static void push_pair(enc *e, size_t *nh, int32_t i)
{
    int32_t j = i >= 0 ? e->next[i] : -1;
    if (j < 0)
        return;
    int32_t r = zsi_bpe_rank(e->b, e->sym[i], e->sym[j]);
    if (r >= 0)
        heap_push(e->heap, nh, (uint64_t)r << 32 | (uint32_t)i);
}

/* BPE of one pre-token w[0, m), 1 <= m < 2^31: writes the ids to out
 * (room for m) and returns their count; -1 when out of memory. */
static int64_t bpe_word(enc *e, const uint8_t *w, size_t m, int32_t *out)
{
    const zs_bpe *b = e->b;
    if (m == 1) {
        out[0] = b->byte_id[w[0]];
        return 1;
    }
    if (enc_scratch(e, m))
        return -1;
    for (size_t i = 0; i < m; i++) {
        e->sym[i] = b->byte_id[w[i]];
        e->prev[i] = (int32_t)i - 1;
        e->next[i] = i + 1 < m ? (int32_t)i + 1 : -1;
    }
    size_t nh = 0;
    for (size_t i = 0; i + 1 < m; i++)
        push_pair(e, &nh, (int32_t)i);
    while (nh) {
        uint64_t top = heap_pop(e->heap, &nh);
        int32_t r = (int32_t)(top >> 32), i = (int32_t)(uint32_t)top;
        int32_t j = e->next[i];
        if (e->sym[i] < 0 || j < 0 || zsi_bpe_rank(b, e->sym[i], e->sym[j]) != r)
            continue; /* stale: a neighbour merged since it was pushed */
        e->sym[i] = b->merges[r][2];
        e->sym[j] = -1;
        e->next[i] = e->next[j];
        if (e->next[j] >= 0)
            e->prev[e->next[j]] = i;
        push_pair(e, &nh, e->prev[i]);
        push_pair(e, &nh, i);
    }
    int64_t k = 0;
    for (int32_t i = 0; i >= 0; i = e->next[i])
        out[k++] = e->sym[i];
    return k;
}

/* Encodes one pre-token through the cache; returns the id count or -1. */
static int64_t encode_piece(enc *e, const uint8_t *w, size_t m, int32_t *out)
{
    if (m == 1) {
        out[0] = e->b->byte_id[w[0]];
        return 1;
    }
    if (m > CACHE_MAX_LEN)
        return bpe_word(e, w, m, out);
    uint64_t h = zsi_hash_bytes(w, m);
    int32_t c = zsi_strmap_find(&e->cache, w, m, h);
    if (c >= 0) {
        memcpy(out, e->pool + e->c_off[c], (size_t)e->c_len[c] * sizeof *out);
        return e->c_len[c];
    }
    int64_t k = bpe_word(e, w, m, out);
    if (k < 0 || e->cache.n >= CACHE_MAX_ENTRIES)
        return k;
    int added;
    if (e->pool_len + (size_t)k > e->pool_cap) {
        size_t cap = e->pool_cap ? e->pool_cap * 2 : 1 << 16;
        int32_t *p = realloc(e->pool, cap * sizeof *p);
        if (!p)
            return k; /* the cache is an optimisation: skip it */
        e->pool = p;
        e->pool_cap = cap;
    }
    c = zsi_strmap_insert(&e->cache, w, m, h, &added);
    if (c < 0)
        return k;
    if ((size_t)c >= e->c_cap) {
        size_t cap = e->c_cap ? e->c_cap * 2 : 1024;
        int32_t *o = realloc(e->c_off, cap * sizeof *o);
        if (o)
            e->c_off = o;
        int32_t *l = realloc(e->c_len, cap * sizeof *l);
        if (l)
            e->c_len = l;
        if (!o || !l)
            return -1;
        e->c_cap = cap;
    }
    e->c_off[c] = (int32_t)e->pool_len;
    e->c_len[c] = (int32_t)k;
    memcpy(e->pool + e->pool_len, out, (size_t)k * sizeof *out);
    e->pool_len += (size_t)k;
    return k;
}

/* Pre-tokens longer than this are encoded in pieces of this size, so that
 * positions fit the heap's 32 bits; only absurd inputs get there. */
#define PIECE_MAX ((size_t)1 << 30)

/* Encodes plain text s[0, n) (no specials) into out (room for n ids);
 * returns the count, or -1 when out of memory. */
static int64_t encode_plain(enc *e, const uint8_t *s, size_t n, int32_t *out)
{
    int64_t k = 0;
    for (size_t i = 0; i < n;) {
        size_t j = zsi_pretok_next(s, n, i);
        while (i < j) {
            size_t m = j - i < PIECE_MAX ? j - i : PIECE_MAX;
            int64_t c = encode_piece(e, s + i, m, out + k);
            if (c < 0)
                return -1;
            k += c;
            i += m;
        }
    }
    return k;
}

/* Encodes s[0, n), turning "<|endoftext|>" into eot when allowed. */
static int64_t encode_text(enc *e, const uint8_t *s, size_t n, bool special,
                           int32_t *out)
{
    if (!special || e->b->eot < 0)
        return encode_plain(e, s, n, out);
    const size_t sl = sizeof ZS_BPE_EOT - 1;
    int64_t k = 0;
    for (size_t i = 0; i <= n;) {
        const uint8_t *hit = memmem(s + i, n - i, ZS_BPE_EOT, sl);
        size_t end = hit ? (size_t)(hit - s) : n;
        int64_t c = encode_plain(e, s + i, end - i, out + k);
        if (c < 0)
            return -1;
        k += c;
        if (!hit)
            break;
        out[k++] = e->b->eot;
        i = end + sl;
    }
    return k;
}

/* ---- parallel chunks ------------------------------------------------------ */

/* A cut before position p is a pre-token boundary whatever came before: a
 * space between two ASCII letters (the left letter run ends there, and the
 * space starts " letters"), outside any "<|endoftext|>". */
static bool safe_cut(const uint8_t *s, size_t n, size_t p)
{
    return p >= 2 && p + 1 < n && s[p] == ' ' &&
           ((s[p - 1] | 32) >= 'a' && (s[p - 1] | 32) <= 'z') &&
           ((s[p + 1] | 32) >= 'a' && (s[p + 1] | 32) <= 'z');
}

typedef struct chunk_job {
    const zs_bpe *b;
    const uint8_t *s;
    size_t *cuts;      /* [nchunks + 1] */
    int32_t **outs;    /* per chunk, room for its bytes */
    int64_t *counts;
    bool special;
} chunk_job;

static void encode_chunks(void *ctx, int64_t begin, int64_t end)
{
    chunk_job *j = ctx;
    enc e = {.b = j->b};
    for (int64_t c = begin; c < end; c++) {
        size_t lo = j->cuts[c], hi = j->cuts[c + 1];
        j->outs[c] = malloc((hi - lo + 1) * sizeof *j->outs[c]);
        j->counts[c] = j->outs[c] ? encode_text(&e, j->s + lo, hi - lo,
                                                j->special, j->outs[c])
                                  : -1;
    }
    enc_deinit(&e);
}

/* Cuts s[0, n) into chunks of about CHUNK_BYTES at safe points that are
 * not inside "<|endoftext|>"; returns the count (cuts[0] = 0, cuts[k] = n). */
static size_t make_cuts(const uint8_t *s, size_t n, size_t *cuts, size_t max)
{
    size_t k = 0, p = CHUNK_BYTES;
    cuts[k++] = 0;
    while (p < n && k < max) {
        while (p < n && !safe_cut(s, n, p))
            p++;
        if (p >= n)
            break;
        cuts[k++] = p;
        p += CHUNK_BYTES;
    }
    cuts[k] = n;
    return k;
}

static zs_status encode_parallel(const zs_bpe *b, const uint8_t *s, size_t n,
                                 bool special, int32_t *out, size_t *n_out)
{
    size_t max = n / CHUNK_BYTES + 2;
    chunk_job j = {.b = b, .s = s, .special = special};
    j.cuts = malloc((max + 1) * sizeof *j.cuts);
    j.outs = calloc(max, sizeof *j.outs);
    j.counts = calloc(max, sizeof *j.counts);
    zs_status st = ZS_OK;
    size_t nc = 0;
    if (!j.cuts || !j.outs || !j.counts) {
        st = zs_set_error_code(ZS_ERR_NOMEM, "bpe encode: out of memory");
    } else {
        nc = make_cuts(s, n, j.cuts, max);
        zs_parallel_for((int64_t)nc, 1, encode_chunks, &j);
    }
    size_t k = 0;
    for (size_t c = 0; c < nc; c++) {
        if (j.counts[c] < 0 && st == ZS_OK)
            st = zs_set_error_code(ZS_ERR_NOMEM, "bpe encode: out of memory");
        if (st == ZS_OK)
            memcpy(out + k, j.outs[c], (size_t)j.counts[c] * sizeof *out);
        k += st == ZS_OK ? (size_t)j.counts[c] : 0;
        free(j.outs[c]);
    }
    free(j.cuts);
    free(j.outs);
    free(j.counts);
    *n_out = k;
    return st;
}

zs_status zs_bpe_encode(const zs_bpe *b, const void *text, size_t n,
                        int flags, int32_t **ids, size_t *n_ids)
{
    *ids = NULL;
    *n_ids = 0;
    if (!b || (n && !text))
        return zs_set_error("bpe encode: NULL tokenizer or text");
    int32_t *out = malloc((n + 1) * sizeof *out);
    if (!out)
        return zs_set_error_code(ZS_ERR_NOMEM, "bpe encode: out of memory for "
                                 "%zu bytes of text", n);
    bool special = flags & ZS_BPE_ALLOW_SPECIAL;
    size_t k = 0;
    zs_status st = ZS_OK;
    if (n >= 4 * (size_t)CHUNK_BYTES && zs_num_threads() > 1) {
        st = encode_parallel(b, text, n, special, out, &k);
    } else {
        enc e = {.b = b};
        int64_t c = encode_text(&e, text, n, special, out);
        enc_deinit(&e);
        if (c < 0)
            st = zs_set_error_code(ZS_ERR_NOMEM, "bpe encode: out of memory");
        k = c < 0 ? 0 : (size_t)c;
    }
    if (st != ZS_OK) {
        free(out);
        return st;
    }
    int32_t *shrunk = realloc(out, (k + 1) * sizeof *out);
    *ids = shrunk ? shrunk : out;
    *n_ids = k;
    return ZS_OK;
}
