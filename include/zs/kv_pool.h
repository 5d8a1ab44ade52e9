/*
 * zs/kv_pool.h - the paged KV cache's memory: one pool of fixed-size
 * blocks (block_size tokens of every layer's K and V), allocated once;
 * a block table per sequence; a free list; reference counts so that
 * sequences sharing a prompt share its blocks, with copy-on-write when one
 * of them writes into a shared block; and a prefix cache that keys full
 * blocks by a hash of their tokens and every token before them, so a new
 * sequence whose prompt starts with a cached prefix takes those blocks
 * instead of recomputing them (vLLM's PagedAttention memory manager).
 *
 * Layout of a block: [2 (K, V)][layers][block_size][heads][head_dim]
 * elements of the pool's dtype, so one token of one layer is a contiguous
 * heads * head_dim row. Running out of blocks is an error (ZS_ERR_NOMEM
 * with a message), never a crash: the caller preempts a sequence and
 * retries.
 *
 * Threads: a pool and its sequences belong to one thread (the engine's).
 */
#ifndef ZS_KV_POOL_H
#define ZS_KV_POOL_H

#include "core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct zs_kv_pool_config {
    int64_t layers, heads, head_dim;
    int64_t block_size;  /* tokens per block; 0: 16 */
    int64_t num_blocks;  /* the whole pool, allocated at once */
    zs_dtype dtype;      /* f32, f64, bf16 or f16 */
} zs_kv_pool_config;

typedef struct zs_kv_pool zs_kv_pool;

/* A sequence's view of the pool: its block table and token count. The
 * fields are read-only for callers. */
typedef struct zs_kv_seq {
    int32_t *blocks;     /* blocks[i] holds tokens [i * block_size, ...) */
    int64_t n_blocks, cap_blocks;
    int64_t n_tokens;    /* positions written (or claimed) so far */
    int64_t n_hashed;    /* full blocks whose prefix hash is known */
    uint64_t hash;       /* the prefix hash of those blocks */
} zs_kv_seq;

typedef struct zs_kv_pool_stats {
    int64_t blocks, used_blocks, free_blocks, cached_blocks;
    int64_t block_bytes;
    int64_t used_bytes;    /* blocks referenced by sequences */
    int64_t wasted_bytes;  /* slots of used blocks that hold no token */
    int64_t prefix_queries, prefix_hits; /* blocks asked for / found */
    int64_t cow_copies;
} zs_kv_pool_stats;

/* NULL + error for a bad config or when the pool does not fit in memory. */
zs_kv_pool *zs_kv_pool_new(const zs_kv_pool_config *c);
/* The same with the blocks on device (ZS_CPU, or a registered device);
 * the tables, counts and the prefix cache stay on the host. */
zs_kv_pool *zs_kv_pool_new_on(const zs_kv_pool_config *c, int device);
void zs_kv_pool_free(zs_kv_pool *p);
const zs_kv_pool_config *zs_kv_pool_config_of(const zs_kv_pool *p);
/* Block 0's first element: block b starts b * 2 * layers * block_size *
 * heads * head_dim elements further (the layout above), for kernels that
 * read through block tables: an address on the pool's device. */
void *zs_kv_pool_data(zs_kv_pool *p);
/* The whole pool as one 1-D tensor of its dtype on its device (borrowed:
 * valid while the pool lives), for the operators that read and write it. */
zs_tensor *zs_kv_pool_tensor(zs_kv_pool *p);

/* An empty sequence (no blocks). */
void zs_kv_seq_init(zs_kv_seq *s);
/* Releases s's blocks (shared ones stay with their other holders; full
 * blocks in the prefix cache stay cached until their memory is needed). */
void zs_kv_seq_release(zs_kv_pool *p, zs_kv_seq *s);
/* dst (empty) shares every block of src (n > 1 samples of one prompt). */
zs_status zs_kv_seq_fork(zs_kv_pool *p, const zs_kv_seq *src, zs_kv_seq *dst);

/* Claims n more positions at the end of s, allocating blocks as needed;
 * a shared last block that the new positions write into is copied first
 * (copy-on-write). All or nothing: on ZS_ERR_NOMEM ("out of KV blocks")
 * s is unchanged. */
zs_status zs_kv_seq_append(zs_kv_pool *p, zs_kv_seq *s, int64_t n);
/* The K (kv 0) or V (kv 1) row of position pos of layer, heads * head_dim
 * elements; pos < s->n_tokens. An address on the pool's device. */
void *zs_kv_seq_row(zs_kv_pool *p, const zs_kv_seq *s, int kv, int64_t layer,
                    int64_t pos);

/* Prefix caching. zs_kv_seq_publish registers s's full blocks whose
 * contents are final (the tokens of positions [0, n_tokens) are
 * tokens[0, n_tokens)) under their prefix hash. zs_kv_seq_match, on an
 * empty s, takes the longest run of cached full blocks that start
 * tokens[0, n) and returns how many tokens they cover (a multiple of the
 * block size, at most n - 1 so the last token is always computed). */
void zs_kv_seq_publish(zs_kv_pool *p, zs_kv_seq *s, const int32_t *tokens);
int64_t zs_kv_seq_match(zs_kv_pool *p, zs_kv_seq *s, const int32_t *tokens, int64_t n);

void zs_kv_pool_get_stats(const zs_kv_pool *p, zs_kv_pool_stats *st);

#ifdef __cplusplus
}
#endif
#endif
