/*
 * test_paged_attention.c - decode attention through block tables
 * (kernels/cpu/paged_attention.h) against a float64 reference, for random
 * batches of lengths 1..300 in pools of block size 1, 16 and 32 whose
 * blocks are handed out in a shuffled order; batch invariance (a sequence
 * alone gives the bits it gives in a batch) and thread-count invariance;
 * D = 16 and 64 take the AVX-512 path (when the CPU has it) and again the
 * portable one (zsk_linear_force_portable), D = 40 the portable one; keys
 * and values in f32, bf16 and f16 (the reference reads the 16-bit values
 * exactly, so the tolerance is the f32 path's).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/packed_linear.h"
#include "kernels/cpu/paged_attention.h"
#include "testutil.h"
#include "zs/kv_pool.h"

#define L 2
#define H 3
#define NS 7

static float frand(void) { return (float)zt_irand(-1000, 1000) / 1000.0f; }

/* Element e of a pool row in dtype kv, widened exactly. */
static double elem(const void *row, int64_t e, zs_dtype kv)
{
    if (kv == ZS_F32)
        return ((const float *)row)[e];
    uint16_t u = ((const uint16_t *)row)[e];
    return kv == ZS_BF16 ? zs_bf16_to_f32(u) : zs_f16_to_f32(u);
}

static void put(void *row, int64_t e, zs_dtype kv, float x)
{
    if (kv == ZS_F32)
        ((float *)row)[e] = x;
    else
        ((uint16_t *)row)[e] = kv == ZS_BF16 ? zs_f32_to_bf16(x) : zs_f32_to_f16(x);
}

/* The attention of layer l for sequence q of the pool, in float64. */
static void reference(zs_kv_pool *p, const zs_kv_seq *s, int64_t D, int64_t l,
                      const float *q, double *o)
{
    int64_t T = s->n_tokens;
    zs_dtype kv = zs_kv_pool_config_of(p)->dtype;
    double *w = malloc((size_t)T * sizeof *w);
    for (int64_t h = 0; h < H; h++) {
        double m = -INFINITY, sum = 0;
        for (int64_t t = 0; t < T; t++) {
            const void *k = zs_kv_seq_row(p, s, 0, l, t);
            double x = 0;
            for (int64_t d = 0; d < D; d++)
                x += (double)q[h * D + d] * elem(k, h * D + d, kv);
            w[t] = x / sqrt((double)D);
            m = w[t] > m ? w[t] : m;
        }
        for (int64_t t = 0; t < T; t++)
            sum += (w[t] = exp(w[t] - m));
        for (int64_t d = 0; d < D; d++) {
            double acc = 0;
            for (int64_t t = 0; t < T; t++)
                acc += w[t] * elem(zs_kv_seq_row(p, s, 1, l, t), h * D + d, kv);
            o[h * D + d] = acc / sum;
        }
    }
    free(w);
}

static zsk_paged_attn attn_of(zs_kv_pool *p, int64_t D, int64_t l, int64_t n,
                              const float *q, const int32_t **tables, const int64_t *len)
{
    const zs_kv_pool_config *c = zs_kv_pool_config_of(p);
    int64_t per = c->block_size * H * D;
    return (zsk_paged_attn){n, H, D, q, zs_kv_pool_data(p), 2 * L * per, l * per,
                            (L + l) * per, c->block_size, tables, len,
                            (float)(1 / sqrt((double)D)), NULL, c->dtype};
}

static void run_case(int64_t bs, int64_t D, zs_dtype kv)
{
    zs_kv_pool_config c = {L, H, D, bs, 2 * NS * (300 / bs + 2), kv};
    zs_kv_pool *p = zs_kv_pool_new(&c);
    zs_kv_seq s[NS], filler;
    zs_kv_seq_init(&filler);
    int64_t len[NS];
    const int32_t *tables[NS];
    for (int i = 0; i < NS; i++) {
        zs_kv_seq_init(&s[i]);
        len[i] = i == 0 ? 300 : zt_irand(1, 300);
        /* interleave with a filler so blocks are not in order */
        for (int64_t t = 0; t < len[i]; t++) {
            zs_kv_seq_append(p, &s[i], 1);
            if (zt_irand(0, 3) == 0)
                zs_kv_seq_append(p, &filler, 1);
        }
        for (int64_t t = 0; t < len[i]; t++)
            for (int kv = 0; kv < 2; kv++)
                for (int64_t l = 0; l < L; l++) {
                    void *r = zs_kv_seq_row(p, &s[i], kv, l, t);
                    for (int64_t e = 0; e < H * D; e++)
                        put(r, e, c.dtype, frand());
                }
        tables[i] = s[i].blocks;
    }
    float *q = malloc(NS * H * D * sizeof *q), *o = malloc(NS * H * D * sizeof *o);
    float *o1 = malloc(H * D * sizeof *o1), *o2 = malloc(NS * H * D * sizeof *o2);
    double *ref = malloc(H * D * sizeof *ref), worst = 0;
    for (int64_t i = 0; i < NS * H * D; i++)
        q[i] = 2 * frand();
    bool inv = true;
    for (int64_t l = 0; l < L; l++) {
        zsk_paged_attn a = attn_of(p, D, l, NS, q, tables, len);
        ZT_CHECK(zsk_paged_attention_f32(&a, o) == ZS_OK, "runs");
        for (int i = 0; i < NS; i++) {
            reference(p, &s[i], D, l, q + i * H * D, ref);
            for (int64_t e = 0; e < H * D; e++)
                worst = fmax(worst, fabs(o[i * H * D + e] - ref[e]));
        }
        /* sequence 3 alone, and the batch on one thread: the same bits */
        zsk_paged_attn one = attn_of(p, D, l, 1, q + 3 * H * D, tables + 3, len + 3);
        zsk_paged_attention_f32(&one, o1);
        inv = inv && memcmp(o1, o + 3 * H * D, H * D * sizeof *o1) == 0;
        int nt = zs_num_threads();
        zs_set_num_threads(1);
        zsk_paged_attention_f32(&a, o2);
        zs_set_num_threads(nt);
        inv = inv && memcmp(o2, o, NS * H * D * sizeof *o2) == 0;
    }
    ZT_CHECK(worst < 2e-5, "%s, block size %lld, D %lld: lengths up to 300, max error "
             "%.2g vs float64", zs_dtype_name(c.dtype), (long long)bs, (long long)D, worst);
    ZT_CHECK(inv, "%s, block size %lld: alone == in the batch, 1 thread == 2 threads "
             "(bits)", zs_dtype_name(c.dtype), (long long)bs);
    int64_t zero[1] = {0};
    zsk_paged_attn bad = attn_of(p, D, 0, 1, q, tables, zero);
    ZT_EXPECT_ERROR(zsk_paged_attention_f32(&bad, o) != ZS_OK, "no cached position");
    zsk_paged_attn bad_kv = attn_of(p, D, 0, 1, q, tables, len);
    bad_kv.kv = ZS_I8;
    ZT_EXPECT_ERROR(zsk_paged_attention_f32(&bad_kv, o) != ZS_OK, "expected f32, bf16");
    for (int i = 0; i < NS; i++)
        zs_kv_seq_release(p, &s[i]);
    zs_kv_seq_release(p, &filler);
    free(q);
    free(o);
    free(o1);
    free(o2);
    free(ref);
    zs_kv_pool_free(p);
}

int main(void)
{
    zt_irand_seed(7);
    const zs_dtype kvs[3] = {ZS_F32, ZS_BF16, ZS_F16};
    for (int i = 0; i < 3; i++) {
        run_case(1, 16, kvs[i]);
        run_case(16, 40, kvs[i]);
        run_case(32, 64, kvs[i]);
    }
    zt_section("paged decode attention (f32, bf16, f16 keys and values)");
    bool old = zsk_linear_force_portable(true); /* the portable path for D % 16 == 0 */
    for (int i = 0; i < 3; i++) {
        run_case(16, 64, kvs[i]);
        run_case(1, 32, kvs[i]);
    }
    zsk_linear_force_portable(old);
    zt_section("paged decode attention, portable path");
    return zt_done();
}
