/*
 * test_kv_pool.c - the paged KV cache's block pool (zs/kv_pool.h): block
 * accounting, copy-on-write after a fork, running out of blocks without
 * a change, prefix-cache hits and eviction, and a random trace of appends,
 * forks, releases, publishes and matches in a small pool after which
 * every sequence still reads exactly what it wrote.
 */
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
#include "zs/kv_pool.h"

/* The value a sequence writes at pos: a function of the token there and
 * the position, so blocks shared through the prefix cache agree. */
static float value(int32_t token, int64_t pos) { return (float)token + 0.001f * (float)pos; }

typedef struct seq {
    zs_kv_seq s;
    int32_t tok[512];
    bool live;
} seq;

/* Appends n random tokens to q and writes their K and V rows (every layer). */
static zs_status grow(zs_kv_pool *p, seq *q, int64_t n)
{
    const zs_kv_pool_config *c = zs_kv_pool_config_of(p);
    int64_t n0 = q->s.n_tokens;
    if (n0 + n > 512)
        return ZS_ERR_ARG;
    zs_status st = zs_kv_seq_append(p, &q->s, n);
    for (int64_t pos = n0; st == ZS_OK && pos < n0 + n; pos++) {
        q->tok[pos] = (int32_t)zt_irand(0, 5); /* few ids: prefixes repeat */
        for (int kv = 0; kv < 2; kv++)
            for (int64_t l = 0; l < c->layers; l++) {
                float *row = zs_kv_seq_row(p, &q->s, kv, l, pos);
                for (int64_t e = 0; e < c->heads * c->head_dim; e++)
                    row[e] = value(q->tok[pos], pos) + (float)(kv * 7 + l * 3 + e);
            }
    }
    return st;
}

static bool reads_back(zs_kv_pool *p, const seq *q)
{
    const zs_kv_pool_config *c = zs_kv_pool_config_of(p);
    for (int64_t pos = 0; pos < q->s.n_tokens; pos++)
        for (int kv = 0; kv < 2; kv++)
            for (int64_t l = 0; l < c->layers; l++) {
                const float *row = zs_kv_seq_row(p, &q->s, kv, l, pos);
                for (int64_t e = 0; e < c->heads * c->head_dim; e++)
                    if (row[e] != value(q->tok[pos], pos) + (float)(kv * 7 + l * 3 + e))
                        return false;
            }
    return true;
}

static zs_kv_pool *pool(int64_t blocks, int64_t bs)
{
    zs_kv_pool_config c = {2, 2, 3, bs, blocks, ZS_F32};
    return zs_kv_pool_new(&c);
}

static void test_config(void)
{
    zs_kv_pool_config c = {2, 2, 3, 16, 0, ZS_F32};
    ZT_EXPECT_ERROR(zs_kv_pool_new(&c) == NULL, "bad config");
    c.num_blocks = 4, c.dtype = ZS_I8;
    ZT_EXPECT_ERROR(zs_kv_pool_new(&c) == NULL, "bad config");
    c.dtype = ZS_F32, c.heads = (int64_t)1 << 40, c.head_dim = (int64_t)1 << 40;
    ZT_EXPECT_ERROR(zs_kv_pool_new(&c) == NULL, "bad config");
    zt_section("bad configs");
}

static void test_fork_cow(void)
{
    zs_kv_pool *p = pool(8, 16);
    seq *a = calloc(2, sizeof *a), *b = a + 1;
    zt_irand_seed(1);
    ZT_CHECK(grow(p, a, 20) == ZS_OK && a->s.n_blocks == 2, "20 tokens: 2 blocks");
    zs_kv_pool_stats st;
    zs_kv_pool_get_stats(p, &st);
    ZT_CHECK(st.used_blocks == 2 && st.free_blocks == 6 &&
             st.wasted_bytes == 12 * 2 * 2 * 6 * 4, "used 2, free 6, 12 empty slots wasted "
             "(%lld bytes)", (long long)st.wasted_bytes);
    zs_kv_seq_fork(p, &a->s, &b->s);
    memcpy(b->tok, a->tok, sizeof a->tok);
    zs_kv_pool_get_stats(p, &st);
    ZT_CHECK(st.used_blocks == 2, "a fork shares every block");
    ZT_CHECK(grow(p, b, 3) == ZS_OK, "the fork appends");
    zs_kv_pool_get_stats(p, &st);
    ZT_CHECK(st.cow_copies == 1 && st.used_blocks == 3 && b->s.blocks[0] == a->s.blocks[0] &&
             b->s.blocks[1] != a->s.blocks[1], "copy-on-write of the shared partial block only");
    ZT_CHECK(grow(p, a, 5) == ZS_OK && reads_back(p, a) && reads_back(p, b),
             "both read what they wrote after both appended");
    ZT_EXPECT_ERROR(grow(p, a, 200) == ZS_ERR_NOMEM, "out of KV blocks");
    ZT_CHECK(a->s.n_tokens == 25 && reads_back(p, a), "a failed append changes nothing");
    zs_kv_seq_release(p, &a->s);
    zs_kv_seq_release(p, &b->s);
    zs_kv_pool_get_stats(p, &st);
    ZT_CHECK(st.used_blocks == 0 && st.free_blocks == 8, "all blocks back");
    free(a);
    zs_kv_pool_free(p);
    zt_section("fork, copy-on-write, out of blocks");
}

static void test_prefix(void)
{
    zs_kv_pool *p = pool(6, 4);
    seq *q = calloc(3, sizeof *q);
    zt_irand_seed(2);
    grow(p, &q[0], 10); /* blocks: 4 + 4 full, 2 */
    zs_kv_seq_publish(p, &q[0].s, q[0].tok);
    memcpy(q[1].tok, q[0].tok, sizeof q[0].tok);
    q[1].tok[9] = 99; /* same first 9 tokens */
    zs_kv_seq_release(p, &q[0].s);
    zs_kv_pool_stats st;
    zs_kv_pool_get_stats(p, &st);
    ZT_CHECK(st.cached_blocks == 2 && st.used_blocks == 0, "2 full blocks stay cached");
    int64_t got = zs_kv_seq_match(p, &q[1].s, q[1].tok, 10);
    zs_kv_pool_get_stats(p, &st);
    ZT_CHECK(got == 8 && st.prefix_hits == 2 && reads_back(p, &q[1]),
             "a prompt with the same 9 first tokens reuses 8 (%lld)", (long long)got);
    seq *r = &q[2];
    memcpy(r->tok, q[0].tok, sizeof r->tok);
    r->tok[1] ^= 1;
    ZT_CHECK(zs_kv_seq_match(p, &r->s, r->tok, 10) == 0, "a different first block: no hit");
    ZT_CHECK(zs_kv_seq_match(p, &r->s, q[0].tok, 8) == 4,
             "at most n - 1 tokens: 8 tokens match one block");
    zs_kv_seq_release(p, &r->s);
    zs_kv_seq_release(p, &q[1].s);
    seq *big = calloc(1, sizeof *big);
    ZT_CHECK(grow(p, big, 24) == ZS_OK, "the whole pool: cached blocks evicted");
    zs_kv_seq_release(p, &big->s);
    ZT_CHECK(zs_kv_seq_match(p, &r->s, q[0].tok, 10) == 0, "evicted blocks are gone");
    free(big);
    free(q);
    zs_kv_pool_free(p);
    zt_section("prefix cache: hits, misses, eviction");
}

static void test_random(void)
{
    for (int bs = 1; bs <= 16; bs += 15) {
        int64_t nb = bs == 1 ? 40 : 12; /* small enough to run out */
        zs_kv_pool *p = pool(nb, bs);
        seq *q = calloc(8, sizeof *q);
        zt_irand_seed(3 + bs);
        bool ok = true;
        int64_t nomem = 0;
        for (int it = 0; it < 3000 && ok; it++) {
            int i = (int)zt_irand(0, 7), j = (int)zt_irand(0, 7), op = (int)zt_irand(0, 9);
            seq *a = &q[i], *b = &q[j];
            if (!a->live) {
                zs_kv_seq_init(&a->s);
                a->live = true;
            }
            if (op < 4) {
                zs_status st = grow(p, a, zt_irand(1, 9));
                nomem += st == ZS_ERR_NOMEM;
                if (st == ZS_ERR_NOMEM)
                    zs_kv_seq_release(p, &a->s); /* preempted */
            } else if (op < 6 && i != j && b->live) {
                zs_kv_seq_release(p, &a->s);
                zs_kv_seq_fork(p, &b->s, &a->s);
                memcpy(a->tok, b->tok, sizeof a->tok);
            } else if (op < 8) {
                zs_kv_seq_publish(p, &a->s, a->tok);
            } else if (op == 8) {
                zs_kv_seq_release(p, &a->s);
                for (int k = 0; k < 12; k++)
                    a->tok[k] = (int32_t)zt_irand(0, 5);
                zs_kv_seq_match(p, &a->s, a->tok, 12);
            } else {
                zs_kv_seq_release(p, &a->s);
            }
            int64_t held = 0;
            for (int k = 0; k < 8; k++)
                ok = ok && (!q[k].live || reads_back(p, &q[k]));
            zs_kv_pool_stats st;
            zs_kv_pool_get_stats(p, &st);
            for (int k = 0; k < 8; k++)
                held += q[k].s.n_blocks;
            ok = ok && st.used_blocks + st.free_blocks + st.cached_blocks == nb &&
                 st.used_blocks <= held;
        }
        ZT_CHECK(ok && nomem > 0, "block size %d: 3000 random operations, %lld preemptions, every "
                 "sequence reads what it wrote", bs, (long long)nomem);
        for (int k = 0; k < 8; k++)
            zs_kv_seq_release(p, &q[k].s);
        zs_kv_pool_stats st;
        zs_kv_pool_get_stats(p, &st);
        ZT_CHECK(st.used_blocks == 0, "block size %d: nothing held at the end", bs);
        free(q);
        zs_kv_pool_free(p);
    }
    zt_section("random trace");
}

int main(void)
{
    test_config();
    test_fork_cow();
    test_prefix();
    test_random();
    return zt_done();
}
