/*
 * bpe.h - internals shared by bpe.c (vocabulary, pre-tokenizer, decoding,
 * files), bpe_train.c and bpe_encode.c: the tokenizer struct and two small
 * open-addressing hash maps (byte strings -> entry index, id pairs -> int).
 */
#ifndef ZS_IO_BPE_H
#define ZS_IO_BPE_H

#include <stdint.h>
#include <stdlib.h>

#include "zs/text.h"

/* ---- byte-string map: key bytes -> dense entry index 0, 1, ... ------- */

typedef struct zsi_strmap {
    int32_t *slots;     /* entry + 1; 0 = empty */
    size_t cap;         /* power of two */
    uint64_t *hash;     /* [n] per entry */
    size_t *off;        /* [n] key offset into arena */
    uint32_t *len;      /* [n] key length */
    size_t n, ncap;
    uint8_t *arena;
    size_t arena_len, arena_cap;
} zsi_strmap;

uint64_t zsi_hash_bytes(const uint8_t *s, size_t n);
void zsi_strmap_deinit(zsi_strmap *m);
/* Entry index of key, or -1. h = zsi_hash_bytes(key, len). */
int32_t zsi_strmap_find(const zsi_strmap *m, const uint8_t *key, size_t len,
                        uint64_t h);
/* Entry index of key, inserting it if absent (*added says which); -1 when
 * out of memory (no message: callers name their own context). */
int32_t zsi_strmap_insert(zsi_strmap *m, const uint8_t *key, size_t len,
                          uint64_t h, int *added);
static inline const uint8_t *zsi_strmap_key(const zsi_strmap *m, int32_t e)
{
    return m->arena + m->off[e];
}

/* ---- pair map: (a, b) -> int32 --------------------------------------- */

typedef struct zsi_pairmap {
    uint64_t *keys;     /* UINT64_MAX = empty */
    int32_t *vals;
    size_t cap, n;      /* cap: power of two or 0 */
} zsi_pairmap;

static inline uint64_t zsi_pair_key(int32_t a, int32_t b)
{
    return (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
}
static inline uint64_t zsi_mix64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}
void zsi_pairmap_deinit(zsi_pairmap *m);
int32_t zsi_pairmap_get(const zsi_pairmap *m, uint64_t key); /* -1: absent */
/* Slot index of key, inserting it with value `init` if absent; -1 when
 * out of memory. The slot stays valid until the next insertion. */
int64_t zsi_pairmap_slot(zsi_pairmap *m, uint64_t key, int32_t init);

/* ---- the tokenizer ---------------------------------------------------- */

struct zs_bpe {
    int32_t n_vocab;
    int32_t eot;            /* -1: none */
    int32_t byte_id[256];   /* id of each single byte */
    size_t *tok_off;        /* [n_vocab] offsets into tok_bytes */
    uint32_t *tok_len;      /* [n_vocab]; 0 = not defined yet */
    uint8_t *tok_bytes;
    size_t tok_bytes_len, tok_bytes_cap;
    int32_t n_merges, merges_cap;
    int32_t (*merges)[3];   /* rank order: left, right, result */
    zsi_pairmap ranks;      /* (left, right) -> rank, by zsi_bpe_finish */
};

/* Empty tokenizer for n_vocab ids (all undefined); NULL + message. */
zs_bpe *zsi_bpe_alloc(int32_t n_vocab);
/* Defines token id's bytes (len >= 1); 0, or -1 + message. */
int zsi_bpe_set_token(zs_bpe *b, int32_t id, const uint8_t *s, size_t len);
/* Appends a merge of the next rank; 0, or -1 + message. */
int zsi_bpe_add_merge(zs_bpe *b, int32_t left, int32_t right, int32_t result);
/* Checks the invariants listed in text.h (every id defined, every byte a
 * token, merges consistent) and builds byte_id and the rank index.
 * `what` prefixes error messages. */
zs_status zsi_bpe_finish(zs_bpe *b, const char *what);
/* Rank of the merge of (left, right), or -1. */
static inline int32_t zsi_bpe_rank(const zs_bpe *b, int32_t l, int32_t r)
{
    return zsi_pairmap_get(&b->ranks, zsi_pair_key(l, r));
}

/* End of the pre-token that starts at s[i] (i < n), GPT-2's pattern
 *   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 * over UTF-8 code points, with the Unicode classes of Python's `regex`
 * module (bpe_unicode.c); each byte of invalid UTF-8 is one code point of
 * the "other" class (neither letter, number nor space). */
size_t zsi_pretok_next(const uint8_t *s, size_t n, size_t i);

/* Character classes of the pre-tokenizer: letter, number, space, other. */
enum { ZSI_UC_L, ZSI_UC_N, ZSI_UC_S, ZSI_UC_O };
typedef struct zsi_urange {
    uint32_t lo, hi;
    uint8_t cl;
} zsi_urange;
/* Code points >= 0x80 that are not letters (bpe_unicode.c), sorted. */
extern const zsi_urange zsi_unicode_ranges[];
extern const size_t zsi_unicode_nranges;

#endif
