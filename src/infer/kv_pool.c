/*
 * kv_pool.c - the paged KV cache's block pool (zs/kv_pool.h).
 *
 * Every block has a reference count (the sequences holding it). A block
 * whose count falls to 0 goes back to the free stack, unless it is in the
 * prefix cache: then it joins an LRU list of cached blocks, still findable
 * by its hash, and is evicted (taken off the table) only when the free
 * stack is empty and memory is needed. The hash table is open addressing
 * with linear probing; keys 0 and 1 mark empty and deleted slots, so
 * hashes are kept >= 2.
 */
#include <stdlib.h>
#include <string.h>

#include "core/checked.h"
#include "core/internal.h"
#include "zs/kv_pool.h"

#define EMPTY 0
#define DELETED 1

struct zs_kv_pool {
    zs_kv_pool_config c;
    int device;                      /* where mem is */
    size_t token_bytes, block_bytes; /* one token of one layer's K; a block */
    unsigned char *mem;              /* on the pool's device */
    zs_tensor *tmem;                 /* the same, as a tensor */
    int32_t *ref, *filled;           /* holders; positions written */
    uint64_t *hash;                  /* prefix hash of a cached block, else 0 */
    int32_t *free_stack;
    int64_t n_free;
    int32_t *prev, *next, lru_head, lru_tail; /* cached blocks with ref 0 */
    int64_t n_lru;
    uint64_t *keys;                  /* hash table: key -> block */
    int32_t *vals;
    int64_t cap, n_keys, n_deleted;
    int64_t queries, hits, cow;
};

static size_t dtype_bytes(zs_dtype dt)
{
    switch (dt) {
    case ZS_F32: return 4;
    case ZS_F64: return 8;
    case ZS_BF16: case ZS_F16: return 2;
    default: return 0;
    }
}

zs_kv_pool *zs_kv_pool_new(const zs_kv_pool_config *cfg)
{
    return zs_kv_pool_new_on(cfg, ZS_CPU);
}

zs_kv_pool *zs_kv_pool_new_on(const zs_kv_pool_config *cfg, int device)
{
    zs_kv_pool_config c = *cfg;
    c.block_size = c.block_size ? c.block_size : 16;
    size_t es = dtype_bytes(c.dtype);
    int64_t row = 0, tb = 0, bb = 0, total = 0;
    if (!es || c.layers < 1 || c.heads < 1 || c.head_dim < 1 || c.block_size < 1 ||
        c.num_blocks < 1 || c.num_blocks > INT32_MAX / 4 ||
        !zsi_mul_i64(c.heads, c.head_dim, &row) ||
        !zsi_mul_i64(row, (int64_t)es, &tb) ||
        !zsi_mul_i64(tb, 2 * c.layers * c.block_size, &bb) ||
        !zsi_mul_i64(bb, c.num_blocks, &total) ||
        (device != ZS_CPU && !zs_device_get(device))) {
        zs_set_error("kv pool: bad config (layers %lld, heads %lld, head_dim %lld, "
                     "block_size %lld, blocks %lld, dtype %s, device %s)",
                     (long long)c.layers, (long long)c.heads, (long long)c.head_dim,
                     (long long)c.block_size, (long long)c.num_blocks,
                     zs_dtype_name(c.dtype), zs_device_name(device));
        return NULL;
    }
    zs_kv_pool *p = calloc(1, sizeof *p);
    int64_t nb = c.num_blocks, cap = 16;
    while (cap < 2 * nb)
        cap *= 2;
    if (p) {
        *p = (zs_kv_pool){.c = c, .device = device, .token_bytes = (size_t)tb,
                          .block_bytes = (size_t)bb, .cap = cap, .lru_head = -1, .lru_tail = -1};
        zsi_tracking_pause();
        if (device == ZS_CPU) { /* malloc'd and wrapped, as before tensors */
            p->mem = malloc((size_t)total);
            if (p->mem)
                zs_advise_huge(p->mem, (size_t)total);
            p->tmem = p->mem ? zs_from_blob(c.dtype, 1, (int64_t[]){total / (int64_t)es},
                                            p->mem)
                             : NULL;
        } else {
            p->tmem = zs_empty_on(device, c.dtype, 1, (int64_t[]){total / (int64_t)es});
            p->mem = p->tmem ? zsi_ptr(p->tmem) : NULL;
        }
        zsi_tracking_resume();
        p->ref = calloc((size_t)nb, sizeof *p->ref);
        p->filled = calloc((size_t)nb, sizeof *p->filled);
        p->hash = calloc((size_t)nb, sizeof *p->hash);
        p->free_stack = malloc((size_t)nb * sizeof *p->free_stack);
        p->prev = malloc((size_t)nb * sizeof *p->prev);
        p->next = malloc((size_t)nb * sizeof *p->next);
        p->keys = calloc((size_t)cap, sizeof *p->keys);
        p->vals = calloc((size_t)cap, sizeof *p->vals);
    }
    if (!p || !p->mem || !p->tmem || !p->ref || !p->filled || !p->hash || !p->free_stack ||
        !p->prev || !p->next || !p->keys || !p->vals) {
        zs_kv_pool_free(p);
        zs_set_error_code(ZS_ERR_NOMEM, "kv pool: no memory for %lld blocks of %lld "
                          "bytes", (long long)nb, (long long)bb);
        return NULL;
    }
    for (int64_t i = 0; i < nb; i++) /* block 0 on top */
        p->free_stack[p->n_free++] = (int32_t)(nb - 1 - i);
    return p;
}

void zs_kv_pool_free(zs_kv_pool *p)
{
    if (!p)
        return;
    bool host = p->device == ZS_CPU;
    zs_release(p->tmem); /* device memory goes with it */
    if (host)
        free(p->mem);
    free(p->ref);
    free(p->filled);
    free(p->hash);
    free(p->free_stack);
    free(p->prev);
    free(p->next);
    free(p->keys);
    free(p->vals);
    free(p);
}

const zs_kv_pool_config *zs_kv_pool_config_of(const zs_kv_pool *p) { return &p->c; }
void *zs_kv_pool_data(zs_kv_pool *p) { return p->mem; }
zs_tensor *zs_kv_pool_tensor(zs_kv_pool *p) { return p->tmem; }

/* ---- the hash table ---------------------------------------------------- */

static int64_t slot_of(const zs_kv_pool *p, uint64_t key)
{
    int64_t i = (int64_t)(key & (uint64_t)(p->cap - 1));
    while (p->keys[i] != EMPTY && p->keys[i] != key)
        i = (i + 1) & (p->cap - 1);
    return i;
}

static int32_t table_find(const zs_kv_pool *p, uint64_t key)
{
    int64_t i = slot_of(p, key);
    return p->keys[i] == key ? p->vals[i] : -1;
}

static void table_remove(zs_kv_pool *p, uint64_t key)
{
    int64_t i = slot_of(p, key);
    if (p->keys[i] == key) {
        p->keys[i] = DELETED;
        p->n_keys--;
        p->n_deleted++;
    }
}

/* Rebuilds the table without its deleted slots (same capacity: at most
 * one key per block, and cap >= 2 blocks). */
static void table_rebuild(zs_kv_pool *p)
{
    memset(p->keys, 0, (size_t)p->cap * sizeof *p->keys);
    p->n_keys = p->n_deleted = 0;
    for (int32_t b = 0; b < (int32_t)p->c.num_blocks; b++)
        if (p->hash[b]) {
            int64_t i = slot_of(p, p->hash[b]);
            p->keys[i] = p->hash[b];
            p->vals[i] = b;
            p->n_keys++;
        }
}

static void table_insert(zs_kv_pool *p, uint64_t key, int32_t block)
{
    if (p->n_keys + p->n_deleted + 1 > p->cap * 3 / 4)
        table_rebuild(p);
    int64_t i = (int64_t)(key & (uint64_t)(p->cap - 1));
    while (p->keys[i] != EMPTY && p->keys[i] != DELETED)
        i = (i + 1) & (p->cap - 1);
    p->n_deleted -= p->keys[i] == DELETED;
    p->keys[i] = key;
    p->vals[i] = block;
    p->n_keys++;
}

/* ---- blocks ---------------------------------------------------------------- */

static void lru_unlink(zs_kv_pool *p, int32_t b)
{
    if (p->prev[b] >= 0)
        p->next[p->prev[b]] = p->next[b];
    else
        p->lru_head = p->next[b];
    if (p->next[b] >= 0)
        p->prev[p->next[b]] = p->prev[b];
    else
        p->lru_tail = p->prev[b];
    p->n_lru--;
}

static void lru_push(zs_kv_pool *p, int32_t b)
{
    p->prev[b] = p->lru_tail;
    p->next[b] = -1;
    if (p->lru_tail >= 0)
        p->next[p->lru_tail] = b;
    else
        p->lru_head = b;
    p->lru_tail = b;
    p->n_lru++;
}

/* A block for new contents (ref 1, nothing filled): the free stack first,
 * else the least recently used cached block, evicted. -1 when none. */
static int32_t take(zs_kv_pool *p)
{
    int32_t b = -1;
    if (p->n_free > 0) {
        b = p->free_stack[--p->n_free];
    } else if (p->lru_head >= 0) {
        b = p->lru_head;
        lru_unlink(p, b);
        table_remove(p, p->hash[b]);
        p->hash[b] = 0;
    }
    if (b >= 0) {
        p->ref[b] = 1;
        p->filled[b] = 0;
    }
    return b;
}

static void hold(zs_kv_pool *p, int32_t b)
{
    if (p->ref[b]++ == 0) /* a cached block back in use */
        lru_unlink(p, b);
}

static void drop(zs_kv_pool *p, int32_t b)
{
    if (--p->ref[b] > 0)
        return;
    if (p->hash[b])
        lru_push(p, b);
    else
        p->free_stack[p->n_free++] = b;
}

static unsigned char *block_mem(const zs_kv_pool *p, int32_t b)
{
    return p->mem + (size_t)b * p->block_bytes;
}

/* ---- sequences -------------------------------------------------------------- */

void zs_kv_seq_init(zs_kv_seq *s) { *s = (zs_kv_seq){0}; }

void zs_kv_seq_release(zs_kv_pool *p, zs_kv_seq *s)
{
    for (int64_t i = 0; i < s->n_blocks; i++)
        drop(p, s->blocks[i]);
    free(s->blocks);
    *s = (zs_kv_seq){0};
}

static zs_status grow_table(zs_kv_seq *s, int64_t n)
{
    if (n <= s->cap_blocks)
        return ZS_OK;
    int64_t cap = s->cap_blocks ? s->cap_blocks : 8;
    while (cap < n)
        cap *= 2;
    int32_t *b = realloc(s->blocks, (size_t)cap * sizeof *b);
    if (!b)
        return zs_set_error_code(ZS_ERR_NOMEM, "kv pool: out of memory for a block table");
    s->blocks = b;
    s->cap_blocks = cap;
    return ZS_OK;
}

zs_status zs_kv_seq_fork(zs_kv_pool *p, const zs_kv_seq *src, zs_kv_seq *dst)
{
    zs_kv_seq_init(dst);
    zs_status st = grow_table(dst, src->n_blocks);
    if (st != ZS_OK)
        return st;
    for (int64_t i = 0; i < src->n_blocks; i++)
        hold(p, dst->blocks[i] = src->blocks[i]);
    dst->n_blocks = src->n_blocks;
    dst->n_tokens = src->n_tokens;
    dst->n_hashed = src->n_hashed;
    dst->hash = src->hash;
    return ZS_OK;
}

zs_status zs_kv_seq_append(zs_kv_pool *p, zs_kv_seq *s, int64_t n)
{
    int64_t bs = p->c.block_size, total = s->n_tokens + n;
    if (n < 0 || total > (int64_t)INT32_MAX * bs)
        return zs_set_error("kv pool: cannot append %lld positions", (long long)n);
    int64_t need = (total + bs - 1) / bs - s->n_blocks;
    bool partial = s->n_tokens % bs != 0 && n > 0;
    int32_t last = s->n_blocks ? s->blocks[s->n_blocks - 1] : -1;
    bool cow = partial && p->ref[last] > 1;
    if (need + cow > p->n_free + p->n_lru)
        return zs_set_error_code(ZS_ERR_NOMEM, "kv pool: out of KV blocks (%lld needed, "
                                 "%lld free of %lld)", (long long)(need + cow),
                                 (long long)(p->n_free + p->n_lru),
                                 (long long)p->c.num_blocks);
    zs_status st = grow_table(s, s->n_blocks + need);
    if (st != ZS_OK)
        return st;
    if (cow) { /* the shared partial block: this sequence writes a copy */
        int32_t b = take(p);
        if (p->device == ZS_CPU) {
            memcpy(block_mem(p, b), block_mem(p, last), p->block_bytes);
        } else if ((st = zsi_device_copy(p->device, block_mem(p, b), block_mem(p, last),
                                         p->block_bytes, ZS_COPY_ON_DEVICE)) != ZS_OK) {
            drop(p, b);
            return st;
        }
        p->filled[b] = p->filled[last];
        drop(p, last);
        s->blocks[s->n_blocks - 1] = b;
        p->cow++;
    }
    for (int64_t i = 0; i < need; i++)
        s->blocks[s->n_blocks++] = take(p);
    for (int64_t pos = s->n_tokens; pos < total; pos++) { /* slots now used */
        int32_t b = s->blocks[pos / bs];
        if (p->filled[b] < pos % bs + 1)
            p->filled[b] = (int32_t)(pos % bs + 1);
    }
    s->n_tokens = total;
    return ZS_OK;
}

void *zs_kv_seq_row(zs_kv_pool *p, const zs_kv_seq *s, int kv, int64_t layer, int64_t pos)
{
    int64_t bs = p->c.block_size;
    size_t off = ((size_t)(kv * p->c.layers + layer) * (size_t)bs + (size_t)(pos % bs)) *
                 p->token_bytes;
    return block_mem(p, s->blocks[pos / bs]) + off;
}

/* The prefix hash after one more full block of tokens (FNV-1a over the
 * previous hash and the ids), kept >= 2. */
static uint64_t chain(uint64_t h, const int32_t *tokens, int64_t n)
{
    h ^= 0x9E3779B97F4A7C15ull;
    for (int64_t i = 0; i < n; i++) {
        uint32_t t = (uint32_t)tokens[i];
        for (int k = 0; k < 4; k++)
            h = (h ^ ((t >> (8 * k)) & 0xFF)) * 1099511628211ull;
    }
    return h < 2 ? h + 2 : h;
}

void zs_kv_seq_publish(zs_kv_pool *p, zs_kv_seq *s, const int32_t *tokens)
{
    int64_t bs = p->c.block_size;
    for (int64_t i = s->n_hashed; i < s->n_tokens / bs; i++) {
        uint64_t h = chain(s->hash, tokens + i * bs, bs);
        int32_t b = s->blocks[i];
        if (!p->hash[b] && table_find(p, h) < 0) {
            p->hash[b] = h;
            table_insert(p, h, b);
        }
        s->hash = h;
        s->n_hashed = i + 1;
    }
}

int64_t zs_kv_seq_match(zs_kv_pool *p, zs_kv_seq *s, const int32_t *tokens, int64_t n)
{
    int64_t bs = p->c.block_size;
    if (s->n_blocks != 0)
        return 0;
    for (int64_t i = 0; (i + 1) * bs <= n - 1; i++) {
        uint64_t h = chain(s->hash, tokens + i * bs, bs);
        int32_t b = table_find(p, h);
        p->queries++;
        if (b < 0 || grow_table(s, i + 1) != ZS_OK)
            break;
        p->hits++;
        hold(p, b);
        s->blocks[s->n_blocks++] = b;
        s->n_tokens = (i + 1) * bs;
        s->n_hashed = i + 1;
        s->hash = h;
    }
    return s->n_tokens;
}

void zs_kv_pool_get_stats(const zs_kv_pool *p, zs_kv_pool_stats *st)
{
    int64_t used = 0, waste = 0, bs = p->c.block_size;
    for (int64_t b = 0; b < p->c.num_blocks; b++)
        if (p->ref[b] > 0) {
            used++;
            waste += bs - p->filled[b];
        }
    *st = (zs_kv_pool_stats){
        .blocks = p->c.num_blocks, .used_blocks = used, .free_blocks = p->n_free,
        .cached_blocks = p->n_lru, .block_bytes = (int64_t)p->block_bytes,
        .used_bytes = used * (int64_t)p->block_bytes,
        .wasted_bytes = waste * (int64_t)p->token_bytes * 2 * p->c.layers,
        .prefix_queries = p->queries, .prefix_hits = p->hits, .cow_copies = p->cow,
    };
}
