/*
 * zs/text.h - text data for language models: a byte-level BPE tokenizer
 * (train, encode, decode, save/load, GPT-2's encoder.json + vocab.bpe) and
 * memory-mapped binary token files with a train/val split and a seeded
 * random-window sampler.
 *
 * Token ids are int32_t. Every byte sequence encodes and decodes back to
 * itself exactly (invalid UTF-8 included): the 256 single bytes are tokens,
 * and merges only ever join adjacent tokens inside one pre-token.
 */
#ifndef ZS_TEXT_H
#define ZS_TEXT_H

#include "core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- byte-level BPE ------------------------------------------------- */

/* The end-of-text special token, as GPT-2 spells it. */
#define ZS_BPE_EOT "<|endoftext|>"

/* zs_bpe_encode flags. */
enum {
    /* Literal "<|endoftext|>" in the text becomes the end-of-text id;
     * without the flag it is encoded as ordinary bytes. */
    ZS_BPE_ALLOW_SPECIAL = 1,
};

/* A tokenizer: a vocabulary (id -> bytes), the merge list in rank order
 * and the end-of-text id. Immutable once built, so every function below
 * that takes a const zs_bpe * may be called from several threads at once. */
typedef struct zs_bpe zs_bpe;

/* Trains a vocabulary of at most vocab_size tokens from text[0, n):
 * ids 0..255 are the bytes, 256.. the merges in the order learned, and the
 * last id is "<|endoftext|>". Text is first split GPT-2 style (contractions,
 * optional leading space + letters, + digits, + punctuation, whitespace),
 * so merges never cross those boundaries; literal "<|endoftext|>" in the
 * text is a boundary and is not counted. Each step merges the most frequent
 * adjacent pair (counts weighted by pre-token frequency); ties go to the
 * pair with the smallest (left id, right id). Stops early, with a smaller
 * vocabulary, when no pair is left. vocab_size >= 257. Returns a new
 * tokenizer (zs_bpe_free) or NULL + message. */
zs_bpe *zs_bpe_train(const void *text, size_t n, int32_t vocab_size);
void zs_bpe_free(zs_bpe *b); /* NULL is fine */

int32_t zs_bpe_vocab_size(const zs_bpe *b);
/* Id of "<|endoftext|>", or -1 when the vocabulary has none. */
int32_t zs_bpe_eot(const zs_bpe *b);
int32_t zs_bpe_n_merges(const zs_bpe *b);
/* Merge of the given rank (0 = first learned): left + right -> result. */
zs_status zs_bpe_merge(const zs_bpe *b, int32_t rank, int32_t *left,
                       int32_t *right, int32_t *result);
/* The bytes of token id (borrowed, *len bytes, not NUL-terminated), or
 * NULL + message when id is out of range. For streaming output. */
const uint8_t *zs_bpe_token(const zs_bpe *b, int32_t id, size_t *len);

/* Encodes text[0, n) into *ids (new malloc'd array, free() it; never NULL
 * on success, even for n = 0) of *n_ids tokens. Merges apply by rank within
 * each pre-token, exactly as GPT-2's encoder; repeated pre-tokens come from
 * a per-call cache. flags: ZS_BPE_ALLOW_SPECIAL or 0. */
zs_status zs_bpe_encode(const zs_bpe *b, const void *text, size_t n,
                        int flags, int32_t **ids, size_t *n_ids);
/* Decodes ids into *text (new malloc'd buffer of *len bytes plus a
 * terminating NUL, free() it). Fails with a message naming the position of
 * an id out of range. */
zs_status zs_bpe_decode(const zs_bpe *b, const int32_t *ids, size_t n,
                        char **text, size_t *len);

/* Saves in Zhisuan's text format, atomically (temporary file + rename):
 *   zs-bpe 1
 *   vocab_size V merges M eot E          (E = -1: none)
 *   token <id> <hex bytes>               V lines, ids 0..V-1 in order
 *   merge <left> <right> <result>        M lines, in rank order
 * Hex is lowercase, two digits per byte. Every byte 0..255 is a one-byte
 * token; a merge's result bytes are its left's followed by its right's, and
 * its left and right are bytes or results of earlier merges. */
zs_status zs_bpe_save(const zs_bpe *b, const char *path);
/* Loads that format; any deviation fails with "path:line: what". */
zs_bpe *zs_bpe_load(const char *path);
/* Loads GPT-2's encoder.json (token string in GPT-2's byte-to-unicode
 * alphabet -> id) and vocab.bpe ("#version" line, then "left right" merges
 * in rank order). "<|endoftext|>" in encoder.json is the end-of-text id. */
zs_bpe *zs_bpe_load_gpt2(const char *encoder_json, const char *vocab_bpe);

/* ---- token files ---------------------------------------------------- */

/* A token file: a 32-byte little-endian header
 *   0  "ZSTK"        magic
 *   4  u32 version   1
 *   8  u32 vocab     vocabulary size (every token is < vocab)
 *   12 u32 width     bytes per token: 2 (vocab <= 65536) or 4
 *   16 u64 count     number of tokens
 *   24 u64 reserved  0
 * followed by count little-endian tokens of `width` bytes; the file size
 * is exactly 32 + count * width.
 *
 * A zs_tokens is either the owner of a mapped file (zs_tokens_open) or a
 * view into one (zs_tokens_split); views borrow the owner's mapping and
 * must not outlive it. Read-only, so safe to share between threads. */
typedef struct zs_tokens {
    const uint8_t *data; /* borrowed: n tokens of `width` bytes */
    int64_t n;
    int width;           /* 2 or 4 */
    int32_t vocab_size;
    void *map;           /* owner only: the mapping, else NULL */
    size_t map_len;
} zs_tokens;

/* Writes ids[0, n) to path atomically (temporary file, fsync, rename).
 * Fails, leaving any existing file intact, when an id is outside
 * [0, vocab_size). */
zs_status zs_tokens_write(const char *path, const int32_t *ids, int64_t n,
                          int32_t vocab_size);
/* Memory-maps path into *out (zs_tokens_close releases it). Checks magic,
 * version, width, the size against the count, and every token against the
 * vocabulary size; fails with a message naming the file otherwise. */
zs_status zs_tokens_open(const char *path, zs_tokens *out);
void zs_tokens_close(zs_tokens *t); /* views and zeroed structs: no-op */
/* Token i (0 <= i < t->n, unchecked). */
static inline int32_t zs_tokens_at(const zs_tokens *t, int64_t i)
{
    const uint8_t *p = t->data + i * t->width;
    if (t->width == 2)
        return (int32_t)(p[0] | (uint32_t)p[1] << 8);
    return (int32_t)(p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                     (uint32_t)p[3] << 24);
}
/* Views: *val = the last floor(n * val_fraction) tokens, *train = the rest.
 * 0 <= val_fraction < 1. */
zs_status zs_tokens_split(const zs_tokens *all, double val_fraction,
                          zs_tokens *train, zs_tokens *val);
/* Batch from given window starts: x[b, t] = tok[starts[b] + t] and
 * y[b, t] = tok[starts[b] + t + 1], t < T; x, y new i64 [B, T] tensors.
 * Every start must satisfy 0 <= start <= n - T - 1. */
zs_status zs_tokens_batch(const zs_tokens *t, int64_t B, int64_t T,
                          const int64_t *starts, zs_tensor **x,
                          zs_tensor **y);
/* Batch of B windows at uniformly random starts in [0, n - T - 1]. Start b
 * is a pure function of (seed, step, b) through zs_philox, so a run resumed
 * at `step` draws the same batches. Needs n >= T + 1. */
zs_status zs_tokens_sample(const zs_tokens *t, int64_t B, int64_t T,
                           uint64_t seed, uint64_t step, zs_tensor **x,
                           zs_tensor **y);

/* ---- a tokenized corpus on disk --------------------------------------- */

/* A directory's tokenizer.bpe and tokens.bin, the token file split 90/10
 * into training and validation views. */
typedef struct zs_text_corpus {
    zs_bpe *bpe;
    zs_tokens all, train, val; /* train, val: views of all */
    bool reused;               /* opened, not made */
    size_t text_bytes;         /* of the text it was made from (0: reused) */
    double train_s, encode_s;  /* seconds to train the BPE and encode */
} zs_text_corpus;

/* Makes dir/tokenizer.bpe (a BPE of vocab tokens trained on text[0, n))
 * and dir/tokens.bin (text encoded), then opens them. window: both halves
 * of the split must hold a window of this many tokens (a sequence + 1),
 * else an error before anything is written. */
zs_status zs_text_corpus_make(const char *dir, const char *text, size_t n,
                              int32_t vocab, int64_t window, zs_text_corpus *out);
/* Opens what zs_text_corpus_make wrote (same window rule). */
zs_status zs_text_corpus_open(const char *dir, int64_t window, zs_text_corpus *out);
void zs_text_corpus_close(zs_text_corpus *c); /* zeroed structs: no-op */

#ifdef __cplusplus
}
#endif
#endif
