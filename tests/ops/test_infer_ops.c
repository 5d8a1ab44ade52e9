/*
 * test_infer_ops.c - the inference engine's descriptors (ops/infer_ops.c)
 * run directly:
 *   - packed_linear (f32 panels with bias, GeLU and y as its residual;
 *     Q8_0 tiles; int8 rows with smoothing and outliers; f64) gives the
 *     bits of the zsk_ call it wraps, on the CPU and on the test device;
 *   - embedding_rows, kv_store + paged_attention, layer_norm_rows and
 *     gather_rows against the zsk_ kernels and plain loops (exact);
 *   - all six are listed, in place, not differentiable; too-small buffers,
 *     wrong dtypes, a wrong input count and an f64 format mismatch are
 *     refused with a message naming the operator.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/int8_linear.h"
#include "kernels/cpu/norm.h"
#include "kernels/cpu/paged_attention.h"
#include "kernels/cpu/qpacked.h"
#include "ops/infer_ops.h"
#include "ops/op.h"
#include "testutil.h"

#define DEV ZS_TEST_DEVICE

/* Runs in-place def on in[0 .. n): ZS_OK or the failure. */
static zs_status run(zsi_opdef *def, int n, zs_tensor **in, const void *a)
{
    zs_tensor *r = zsi_run(def, n, in, a);
    if (!r)
        return ZS_ERR_ARG;
    zs_release(r);
    return ZS_OK;
}

static zs_tensor *bytes_of(const void *p, int64_t n)
{
    return zs_from_data(ZS_U8, 1, (int64_t[]){n}, p);
}

/* in[] moved to the test device (new references). */
static void to_dev(int n, zs_tensor **in, zs_tensor **out)
{
    for (int i = 0; i < n; i++)
        out[i] = zs_to_device(in[i], DEV);
}

/* run on the CPU and on the test device: y's bytes equal ref (n floats). */
static bool same_both(zsi_opdef *def, int n, zs_tensor **in, const void *a,
                      const void *ref, size_t bytes)
{
    zs_tensor *d[8];
    to_dev(n, in, d);
    bool ok = run(def, n, in, a) == ZS_OK && !memcmp(zs_data(in[0]), ref, bytes);
    ok = ok && run(def, n, d, a) == ZS_OK;
    zs_tensor *back = ok ? zs_to_device(d[0], ZS_CPU) : NULL;
    ok = ok && back && !memcmp(zs_data(back), ref, bytes);
    zs_release(back);
    for (int i = 0; i < n; i++)
        zs_release(d[i]);
    return ok;
}

static void test_linear(void)
{
    int64_t N = 70, K = 64, M = 5;
    zs_tensor *W = zt_rand(ZS_F32, ZS_SHAPE(N, K), 1), *x = zt_rand(ZS_F32, ZS_SHAPE(M, K), 2);
    zs_tensor *b = zt_rand(ZS_F32, ZS_SHAPE(N), 3), *y0 = zt_rand(ZS_F32, ZS_SHAPE(M, N), 4);
    const float *w = zs_data(W);
    float *ref = malloc((size_t)(M * N) * sizeof *ref);

    /* f32 panels: y = gelu(x W^T + b) + y */
    zsk_packed_f32 p;
    zsk_pack_f32(w, N, K, &p);
    memcpy(ref, zs_data(y0), (size_t)(M * N) * 4);
    zsk_packed_linear_f32(&p, zs_data(x), M, K, zs_data(b), ref, N, ZSK_ACT_GELU_TANH, ref, N);
    zs_tensor *tw = bytes_of(p.data, p.panels * K * ZSK_PANEL * 4), *y = zs_clone(y0);
    zsi_linear_attrs a = {ZSI_W_F32, ZSK_ACT_GELU_TANH, N, K, M, K, N, N, 0, 0, 0, 0, 1, 1};
    zs_tensor *in[7] = {y, x, tw, b, y};
    zs_copy_(y, y0);
    bool ok = run(&zsi_def_packed_linear, 5, in, &a) == ZS_OK &&
              !memcmp(zs_data(y), ref, (size_t)(M * N) * 4);
    zs_tensor *d[5];
    zs_copy_(y, y0);
    to_dev(4, in, d);
    d[4] = d[0];
    ok = ok && run(&zsi_def_packed_linear, 5, d, &a) == ZS_OK;
    zs_tensor *back = zs_to_device(d[0], ZS_CPU);
    ok = ok && back && !memcmp(zs_data(back), ref, (size_t)(M * N) * 4);
    ZT_CHECK(ok, "packed_linear f32 (bias, gelu, y as residual) = zsk_packed_linear_f32, "
             "on cpu and test");
    zs_release(back);
    for (int i = 0; i < 4; i++)
        zs_release(d[i]);

    /* the refusals */
    a.M = M + 1;
    ZT_EXPECT_ERROR(run(&zsi_def_packed_linear, 5, in, &a) != ZS_OK, "packed_linear: y holds");
    a.M = M;
    ZT_EXPECT_ERROR(run(&zsi_def_packed_linear, 4, in, &a) != ZS_OK, "4 inputs, format 0");
    a.fmt = ZSI_W_F64;
    ZT_EXPECT_ERROR(run(&zsi_def_packed_linear, 5, in, &a) != ZS_OK, "f64 with f64 only");
    a.fmt = ZSI_W_F32;
    zs_tensor *x64 = zs_to_dtype(x, ZS_F64);
    in[1] = x64;
    ZT_EXPECT_ERROR(run(&zsi_def_packed_linear, 5, in, &a) != ZS_OK, "x is f64, expected f32");
    in[1] = x;
    zsk_packed_free(&p);
    zs_release(tw);

    /* Q8_0 tiles, no bias */
    size_t qb = (size_t)(N * K / ZSK_QBLOCK * zsk_qblock_bytes(ZSK_Q8_0));
    void *blocks = malloc(qb);
    zsk_qpacked q;
    zsk_quantize(ZSK_Q8_0, w, N * K, blocks);
    zsk_qpack(ZSK_Q8_0, blocks, N, K, &q);
    zsk_qpacked_linear(&q, zs_data(x), M, K, NULL, NULL, 0, ZSK_ACT_NONE, ref, N);
    tw = bytes_of(q.data, zsk_qpacked_bytes(&q));
    a = (zsi_linear_attrs){ZSI_W_Q8_0, ZSK_ACT_NONE, N, K, M, K, 0, N, q.tile_bytes, 0, 0, 0, 0, 0};
    in[2] = tw;
    ZT_CHECK(same_both(&zsi_def_packed_linear, 3, in, &a, ref, (size_t)(M * N) * 4),
             "packed_linear q8_0 = zsk_qpacked_linear, on cpu and test");
    zsk_qpacked_free(&q);
    zs_release(tw);
    free(blocks);

    /* int8 rows with smoothing, outliers and a bias */
    int8_t *wq = malloc((size_t)(N * K));
    float sc[70], sm[64];
    for (int k = 0; k < K; k++)
        sm[k] = 0.5f + (float)k / 64;
    zsk_quantize_rows_i8(w, N, K, wq, sc);
    zsk_i8_opts io = {sm, 0.9f};
    zsk_i8_linear(wq, sc, N, K, zs_data(x), M, K, &io, zs_data(b), NULL, 0, ZSK_ACT_NONE,
                  ref, N);
    zs_tensor *twq = bytes_of(wq, N * K), *tsc = zs_from_data(ZS_F32, 1, (int64_t[]){N}, sc);
    zs_tensor *tsm = zs_from_data(ZS_F32, 1, (int64_t[]){K}, sm);
    a = (zsi_linear_attrs){ZSI_W_I8, ZSK_ACT_NONE, N, K, M, K, 0, N, 0, 0.9f, 1, 1, 1, 0};
    zs_tensor *in8[6] = {y, x, twq, tsc, tsm, b};
    ZT_CHECK(same_both(&zsi_def_packed_linear, 6, in8, &a, ref, (size_t)(M * N) * 4),
             "packed_linear int8 (smooth, threshold, bias) = zsk_i8_linear, on cpu and test");
    a.scale = 0;
    zs_tensor *in8b[5] = {y, x, twq, tsm, b};
    a.smooth = 1;
    ZT_EXPECT_ERROR(run(&zsi_def_packed_linear, 5, in8b, &a) != ZS_OK, "without their scales");
    free(wq);
    zs_release(twq), zs_release(tsc), zs_release(tsm);

    /* f64: a plain dot in increasing k, then + bias (exact comparison) */
    zs_tensor *W64 = zs_to_dtype(W, ZS_F64), *b64 = zs_to_dtype(b, ZS_F64);
    zs_tensor *y64 = zs_zeros(ZS_F64, ZS_SHAPE(M, N)), *tw64 = bytes_of(zs_data(W64), N * K * 8);
    double *r64 = malloc((size_t)(M * N) * sizeof *r64);
    const double *xv = zs_data(x64), *wv = zs_data(W64), *bv = zs_data(b64);
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            double acc = 0;
            for (int64_t k = 0; k < K; k++)
                acc += xv[m * K + k] * wv[n * K + k];
            r64[m * N + n] = acc + bv[n];
        }
    a = (zsi_linear_attrs){ZSI_W_F64, ZSK_ACT_NONE, N, K, M, K, 0, N, 0, 0, 0, 0, 1, 0};
    zs_tensor *in64[4] = {y64, x64, tw64, b64};
    ZT_CHECK(same_both(&zsi_def_packed_linear, 4, in64, &a, r64, (size_t)(M * N) * 8),
             "packed_linear f64 = the plain dot, on cpu and test");
    free(r64);
    zs_tensor *ts[] = {W, x, b, y0, y, x64, W64, b64, y64, tw64};
    for (size_t i = 0; i < sizeof ts / sizeof *ts; i++)
        zs_release(ts[i]);
    free(ref);
    zt_section("packed_linear: every format = its zsk_ kernel; refusals");
}

/* The metadata of 3 rows: tokens, positions 2, 0, 5, one table each
 * (blocks of 4), rows 2 and 0 out. */
static zsi_step_meta meta_of(int32_t *a)
{
    zsi_step_meta m = {3, 2, 0, 3, 6, 9, 15};
    int32_t v[15] = {4, 1, 6, 2, 0, 5, 11, 12, 13, 2, 0, /* tables: */ 1, 0, 3, 2};
    /* row 0 -> table at 11 ([1]), row 1 -> 12 ([0]), row 2 -> 13 ([3, 2]) */
    memcpy(a, v, sizeof v);
    return m;
}

static void test_attention_rows(void)
{
    int64_t H = 2, D = 16, C = H * D, L = 2, bs = 4, nb = 4, V = 7;
    int32_t mv[15];
    zsi_step_meta sm = meta_of(mv);
    zs_tensor *meta = zs_from_data(ZS_I32, 1, (int64_t[]){15}, mv);
    zs_tensor *pool = zs_zeros(ZS_F32, ZS_SHAPE(nb * 2 * L * bs * C));
    zs_tensor *qkv = zt_rand(ZS_F32, ZS_SHAPE(3, 3 * C), 7), *q = zs_zeros(ZS_F32, ZS_SHAPE(3, C));
    /* earlier positions of every row: random keys and values in the pool */
    zs_tensor *r = zt_rand(ZS_F32, ZS_SHAPE(nb * 2 * L * bs * C), 8);
    zs_copy_(pool, r);
    zs_tensor *pool0 = zs_clone(pool);
    zsi_kv_attrs ka = {sm, C, L, 1, bs};
    bool ok = run(&zsi_def_kv_store, 4, (zs_tensor *[]){q, pool, qkv, meta}, &ka) == ZS_OK;
    const float *P = zs_data(pool), *Q = zs_data(qkv);
    const int32_t blk[3] = {1, 0, 2}, slot[3] = {2, 0, 1}; /* pos 2, 0, 5 */
    for (int i = 0; ok && i < 3; i++) {
        const float *k = P + ((blk[i] * 2 * L + 1) * bs + slot[i]) * C;
        ok = !memcmp(k, Q + i * 3 * C + C, (size_t)C * 4) &&
             !memcmp(k + L * bs * C, Q + i * 3 * C + 2 * C, (size_t)C * 4) &&
             !memcmp((float *)zs_data(q) + i * C, Q + i * 3 * C, (size_t)C * 4);
    }
    ZT_CHECK(ok, "kv_store: q, K and V of each row at its table's block and slot");

    /* attention against the kernel called on the same pool */
    const int32_t t0[1] = {1}, t1[1] = {0}, t2[2] = {3, 2};
    const int32_t *tabs[3] = {t0, t1, t2};
    int64_t len[3] = {3, 1, 6}, per = bs * C;
    float ref[3 * 32];
    zsk_paged_attn pa = {3, H, D, zs_data(q), zs_data(pool), 2 * L * per, per, (L + 1) * per,
                         bs, tabs, len, (float)(1 / sqrt((double)D)), NULL, ZS_F32};
    zsk_paged_attention_f32(&pa, ref);
    zs_tensor *o = zs_zeros(ZS_F32, ZS_SHAPE(3, C));
    zsi_paged_attn_attrs aa = {sm, H, D, L, 1, bs, 0};
    ZT_CHECK(same_both(&zsi_def_paged_attention, 4, (zs_tensor *[]){o, q, pool, meta}, &aa,
                       ref, sizeof ref), "paged_attention = zsk_paged_attention_f32 over "
             "the metadata's tables, on cpu and test");
    aa.l = 2;
    ZT_EXPECT_ERROR(run(&zsi_def_paged_attention, 4, (zs_tensor *[]){o, q, pool, meta},
                        &aa) != ZS_OK, "paged_attention: a f32 pool");
    sm.len = 16;
    ka.m = sm;
    ZT_EXPECT_ERROR(run(&zsi_def_kv_store, 4, (zs_tensor *[]){q, pool0, qkv, meta}, &ka)
                        != ZS_OK, "the step's metadata holds 15");

    /* layer_norm_rows in place, gather_rows, embedding_rows */
    zs_tensor *x = zt_rand(ZS_F32, ZS_SHAPE(3, C), 9), *w = zt_rand(ZS_F32, ZS_SHAPE(C), 10);
    zs_tensor *b = zt_rand(ZS_F32, ZS_SHAPE(C), 11), *x1 = zs_clone(x);
    float ln[3 * 32];
    zsk_layer_norm(ZS_F32, zs_data(x), zs_data(w), zs_data(b), 3, C, 1e-5, ln, NULL, NULL);
    zsi_norm_rows_attrs na = {3, C, 1e-5};
    ZT_CHECK(same_both(&zsi_def_layer_norm_rows, 4, (zs_tensor *[]){x1, x1, w, b}, &na, ln,
                       sizeof ln), "layer_norm_rows (y = x) = zsk_layer_norm");
    zs_tensor *g = zs_zeros(ZS_F32, ZS_SHAPE(2, C));
    zsi_gather_attrs ga = {meta_of(mv), C};
    float gref[2 * 32];
    memcpy(gref, (float *)zs_data(x) + 2 * C, (size_t)C * 4);
    memcpy(gref + C, zs_data(x), (size_t)C * 4);
    ZT_CHECK(same_both(&zsi_def_gather_rows, 3, (zs_tensor *[]){g, x, meta}, &ga, gref,
                       sizeof gref), "gather_rows: rows 2 and 0");
    zs_tensor *wte = zt_rand(ZS_F32, ZS_SHAPE(V, C), 12), *wpe = zt_rand(ZS_F32, ZS_SHAPE(8, C), 13);
    zs_tensor *e = zs_zeros(ZS_F32, ZS_SHAPE(3, C));
    float eref[3 * 32];
    for (int i = 0; i < 3; i++)
        for (int c = 0; c < C; c++)
            eref[i * C + c] = ((float *)zs_data(wte))[mv[i] * C + c] +
                              ((float *)zs_data(wpe))[mv[3 + i] * C + c];
    zsi_embed_attrs ea = {meta_of(mv), C, V, ZSI_W_F32, 1, 0};
    ZT_CHECK(same_both(&zsi_def_embedding_rows, 4, (zs_tensor *[]){e, meta, wte, wpe}, &ea,
                       eref, sizeof eref), "embedding_rows: wte[token] + wpe[pos]");
    ea.V = V + 1;
    ZT_EXPECT_ERROR(run(&zsi_def_embedding_rows, 4, (zs_tensor *[]){e, meta, wte, wpe}, &ea)
                        != ZS_OK, "embedding_rows: the table holds");
    zs_tensor *ts[] = {meta, pool, pool0, qkv, q, r, o, x, w, b, x1, g, wte, wpe, e};
    for (size_t i = 0; i < sizeof ts / sizeof *ts; i++)
        zs_release(ts[i]);
    zt_section("kv_store, paged_attention, layer_norm_rows, gather_rows, embedding_rows");
}

int main(void)
{
    zs_test_device_enable();
    const char *names[] = {"packed_linear", "embedding_rows", "kv_store", "paged_attention",
                           "layer_norm_rows", "gather_rows"};
    bool listed = true;
    for (int i = 0; i < 6; i++) {
        zsi_opdef *d = zsi_opdef_find(names[i]);
        listed = listed && d && d->inplace && !d->op.backward && d->attr_size > 0 &&
                 d->kernel[DEV][ZS_F32] && d->kernel[DEV][ZS_F64];
    }
    ZT_CHECK(listed, "the six are listed, in place, typed, not differentiable, with "
             "f32 and f64 kernels on the test device");
    test_linear();
    test_attention_rows();
    return zt_done();
}
