/*
 * test_sparse_attention.c - block-sparse attention (src/ops/
 * sparse_attention.c, src/kernels/cpu/sparse_attention.c): the layout's
 * rules (local, global, random, causal), its density and pair counts
 * against a brute-force count; forward and gradients against dense
 * attention with the same mask applied (matmul, masked_fill, softmax,
 * matmul, differentiated by autograd) in float64 for several layouts, odd
 * lengths (a partial last block), both causal modes and strided inputs;
 * f32 against the same reference; a gradient check; the test device; error
 * paths. Tolerances: f64 1e-10 (both sides are float64 sums of the same
 * terms in other orders), f32 2e-5 relative (a D = 24..64 dot product and
 * a softmax in f32).
 */
#include <stdlib.h>

#include "testutil.h"

/* Brute force: blocks i sees under the rules of zs/attention.h, without
 * the random ones; checks the layout keeps them and only allowed ones. */
static void test_layout_rules(const zs_sparse_params *p, int64_t T)
{
    zs_sparse_layout *l = zs_sparse_layout_new(p, T);
    ZT_CHECK(l != NULL, "layout");
    if (!l)
        return;
    int64_t nb = (T + p->block - 1) / p->block, bad = 0, rnd_bad = 0;
    ZT_CHECK(l->nb == nb && l->row_ptr[nb] == l->nnz, "nb %lld, nnz", (long long)l->nb);
    for (int64_t i = 0; i < nb; i++) {
        int64_t kept = 0, base = 0, allowed = 0;
        for (int64_t j = 0; j < nb; j++) {
            bool ok = !p->causal || j <= i;
            int64_t d = i > j ? i - j : j - i;
            bool must = ok && (d <= p->local || j < p->global || i < p->global);
            bool has = false;
            for (int64_t k = l->row_ptr[i]; k < l->row_ptr[i + 1]; k++)
                has = has || l->cols[k] == j;
            bad += (must && !has) || (!ok && has);
            kept += has;
            base += must;
            allowed += ok;
        }
        int64_t want = base + p->random < allowed ? base + p->random : allowed;
        rnd_bad += kept != want;
        for (int64_t k = l->row_ptr[i] + 1; k < l->row_ptr[i + 1]; k++)
            bad += l->cols[k] <= l->cols[k - 1];
    }
    ZT_CHECK(bad == 0, "%lld blocks break the local/global/causal rules", (long long)bad);
    ZT_CHECK(rnd_bad == 0, "%lld rows without exactly R random blocks", (long long)rnd_bad);
    double pairs = 0, vis = 0;
    for (int64_t i = 0; i < T; i++)
        for (int64_t j = 0; j < T; j++) {
            bool in_block = false;
            int64_t qb = i / p->block, kb = j / p->block;
            for (int64_t k = l->row_ptr[qb]; k < l->row_ptr[qb + 1]; k++)
                in_block = in_block || l->cols[k] == kb;
            pairs += in_block;
            vis += zs_sparse_layout_visible(l, i, j);
        }
    ZT_CHECK(pairs == l->pairs && vis == l->visible, "pairs %g vs %g, visible %g vs %g",
             l->pairs, pairs, l->visible, vis);
    ZT_CHECK(fabs(l->density - (double)l->nnz / (double)(nb * nb)) < 1e-15, "density");
    zs_sparse_layout *l2 = zs_sparse_layout_new(p, T);
    bool same = l2 && l2->nnz == l->nnz;
    for (int64_t k = 0; same && k < l->nnz; k++)
        same = l->cols[k] == l2->cols[k];
    ZT_CHECK(same, "the same seed gives the same layout");
    zs_sparse_layout_free(l2);
    zs_sparse_layout_free(l);
}

static void test_layouts(void)
{
    zs_sparse_params ps[] = {
        {.block = 16, .local = 1, .global = 1, .random = 1, .seed = 3, .causal = true},
        {.block = 16, .local = 0, .global = 0, .random = 2, .seed = 4},
        {.block = 32, .local = 2, .global = 2, .random = 3, .seed = 5},
        {.block = 128, .local = 3, .global = 1, .random = 2, .seed = 6, .causal = true},
    };
    int64_t Ts[] = {200, 171, 700, 4000};
    for (int i = 0; i < 4; i++)
        test_layout_rules(&ps[i], Ts[i]);
    zs_sparse_params a = {.block = 16, .random = 3, .seed = 1};
    zs_sparse_params b = a;
    b.seed = 2;
    zs_sparse_layout *la = zs_sparse_layout_new(&a, 1024), *lb = zs_sparse_layout_new(&b, 1024);
    bool differ = false;
    for (int64_t k = 0; la && lb && k < la->nnz && k < lb->nnz; k++)
        differ = differ || la->cols[k] != lb->cols[k];
    ZT_CHECK(differ, "another seed draws other random blocks");
    zs_sparse_params d = {.block = 64, .local = 1000, .causal = true};
    zs_sparse_layout *ld = zs_sparse_layout_new(&d, 1000);
    ZT_CHECK(ld && ld->visible == ld->dense_pairs, "a full causal layout sees the "
             "dense causal pairs: %g vs %g", ld ? ld->visible : 0, ld ? ld->dense_pairs : 0);
    printf("layout T 4096, block 64, local 2, global 1, random 1, causal: ");
    zs_sparse_params g = {.block = 64, .local = 2, .global = 1, .random = 1, .causal = true};
    zs_sparse_layout *lg = zs_sparse_layout_new(&g, 4096);
    if (lg)
        printf("density %.3f, pairs %.3g (dense causal %.3g), %.3g GFLOP forward at "
               "B 1, H 12, D 64\n", lg->density, lg->pairs, lg->dense_pairs,
               zs_sparse_layout_flops(lg, 1, 12, 64) / 1e9);
    zs_sparse_layout_free(la);
    zs_sparse_layout_free(lb);
    zs_sparse_layout_free(ld);
    zs_sparse_layout_free(lg);
    zt_section("layouts: local, global, random, causal; density and pairs");
}

/* Dense reference: softmax(q k^T scale, masked by the layout) v with zs
 * operators (autograd differentiates it). */
static zs_tensor *dense_masked(zs_tensor *q, zs_tensor *k, zs_tensor *v,
                               const zs_sparse_layout *l, double scale)
{
    int64_t T = q->shape[2];
    zs_tensor *m = zs_empty(ZS_U8, 2, (int64_t[]){T, T});
    uint8_t *md = zs_data(m);
    for (int64_t i = 0; i < T; i++)
        for (int64_t j = 0; j < T; j++)
            md[i * T + j] = !zs_sparse_layout_visible(l, i, j);
    zs_tensor *s = zs_matmul_t(q, k, false, true);
    zs_tensor *ss = zs_mul_scalar(s, scale);
    zs_tensor *f = zs_masked_fill(ss, m, -INFINITY);
    zs_tensor *p = zs_softmax(f, -1);
    zs_tensor *o = zs_matmul(p, v);
    zs_tensor *tmp[] = {m, s, ss, f, p};
    for (int i = 0; i < 5; i++)
        zs_release(tmp[i]);
    return o;
}

/* q, k, v [B, H, T, D] of dtype dt: contiguous, or views of [B, T, H, D]
 * (strided t and h dims). */
static zs_tensor *input(zs_dtype dt, int64_t B, int64_t H, int64_t T, int64_t D,
                        bool strided, uint64_t seed)
{
    if (!strided)
        return zt_rand(dt, ZS_SHAPE(B, H, T, D), seed);
    zs_tensor *x = zt_rand(dt, ZS_SHAPE(B, T, H, D), seed);
    zs_tensor *p = zs_permute(x, (int[]){0, 2, 1, 3});
    zs_release(x);
    return p;
}

static double max_diff(const zs_tensor *a, const zs_tensor *b)
{
    double m = 0;
    if (!a || !b || !zs_same_shape(a, b))
        return INFINITY;
    for (int64_t i = 0; i < zs_numel(a); i++) {
        double d = fabs(zs_get(a, i) - zs_get(b, i)) / fmax(1, fabs(zs_get(b, i)));
        m = d > m ? d : m;
    }
    return m;
}

/* Forward and gradients of sparse (dtype dt) against the f64 dense masked
 * reference. */
static void compare(const zs_sparse_params *p, zs_dtype dt, int64_t B, int64_t H,
                    int64_t T, int64_t D, bool strided, double tol)
{
    zs_tensor *x[3], *r[3], *gd[3] = {0}, *gs[3] = {0};
    for (int i = 0; i < 3; i++) {
        r[i] = input(ZS_F64, B, H, T, D, strided, 10 + (uint64_t)i);
        x[i] = dt == ZS_F64 ? zs_retain(r[i]) : zs_to_dtype(r[i], dt);
        zs_release(r[i]);
        r[i] = dt == ZS_F64 ? zs_retain(x[i]) : zs_to_dtype(x[i], ZS_F64);
        zs_set_requires_grad(x[i], true);
        if (r[i] != x[i])
            zs_set_requires_grad(r[i], true);
    }
    zs_sparse_layout *l = zs_sparse_layout_new(p, T);
    double scale = p->scale != 0 ? p->scale : 1 / sqrt((double)D);
    zs_tensor *gout = zt_rand(ZS_F64, ZS_SHAPE(B, H, T, D), 99);
    zs_tensor *go = zs_to_dtype(gout, dt);
    zs_tensor *od = dense_masked(r[0], r[1], r[2], l, scale);
    ZT_CHECK(od && zs_backward(od, gout, false) == ZS_OK, "dense backward");
    for (int i = 0; i < 3; i++)
        gd[i] = zs_retain(zs_grad(r[i]));
    for (int i = 0; i < 3 && r[i] == x[i]; i++)
        zs_zero_grad(x[i], true);
    zs_tensor *os = zs_sparse_attention(x[0], x[1], x[2], p);
    ZT_CHECK(os && zs_backward(os, go, false) == ZS_OK, "sparse backward");
    for (int i = 0; i < 3; i++)
        gs[i] = zs_retain(zs_grad(x[i]));
    double e = max_diff(os, od);
    ZT_CHECK(e <= tol, "%s block %lld L%lld G%lld R%lld %s T %lld D %lld%s: forward "
             "error %.3g", zs_dtype_name(dt), (long long)p->block, (long long)p->local,
             (long long)p->global, (long long)p->random, p->causal ? "causal" : "full",
             (long long)T, (long long)D, strided ? " strided" : "", e);
    const char *nm[] = {"dq", "dk", "dv"};
    for (int i = 0; i < 3; i++) {
        double eg = max_diff(gs[i], gd[i]);
        ZT_CHECK(eg <= tol * 4, "%s block %lld %s T %lld: %s error %.3g", zs_dtype_name(dt),
                 (long long)p->block, p->causal ? "causal" : "full", (long long)T, nm[i], eg);
    }
    zs_tensor *tmp[] = {gout, go, od, os, x[0], x[1], x[2], r[0], r[1], r[2],
                        gd[0], gd[1], gd[2], gs[0], gs[1], gs[2]};
    for (size_t i = 0; i < sizeof tmp / sizeof *tmp; i++)
        zs_release(tmp[i]);
    zs_sparse_layout_free(l);
}

static void test_against_dense(void)
{
    struct {
        zs_sparse_params p;
        int64_t B, H, T, D;
        bool strided;
    } cs[] = {
        {{.block = 16, .local = 1, .global = 1, .random = 1, .seed = 3, .causal = true}, 2, 2, 50, 24, false},
        {{.block = 16, .local = 0, .global = 0, .random = 2, .seed = 4}, 1, 3, 37, 32, false},
        {{.block = 32, .local = 1, .global = 0, .random = 0, .causal = true}, 2, 1, 70, 16, true},
        {{.block = 16, .local = 2, .global = 1, .random = 0}, 1, 2, 64, 40, true},
        {{.block = 16, .local = 1, .global = 2, .random = 3, .seed = 9, .causal = true,
          .scale = 0.3}, 1, 2, 129, 8, false},
        {{.block = 64, .local = 0, .global = 1, .random = 1, .seed = 7}, 1, 1, 150, 64, false},
    };
    for (size_t i = 0; i < sizeof cs / sizeof *cs; i++) {
        compare(&cs[i].p, ZS_F64, cs[i].B, cs[i].H, cs[i].T, cs[i].D, cs[i].strided, 1e-10);
        compare(&cs[i].p, ZS_F32, cs[i].B, cs[i].H, cs[i].T, cs[i].D, cs[i].strided, 2e-5);
    }
    zt_section("forward and gradients against dense masked attention (f64, f32)");
}

static zs_tensor *sparse_fn(void *ctx, zs_tensor **in)
{
    return zs_sparse_attention(in[0], in[1], in[2], ctx);
}

static void test_gradcheck(void)
{
    zs_sparse_params p = {.block = 16, .local = 1, .global = 1, .random = 1, .seed = 2,
                          .causal = true};
    zs_tensor *in[3];
    for (int i = 0; i < 3; i++) {
        in[i] = zt_rand(ZS_F64, ZS_SHAPE(1, 1, 35, 4), 50 + (uint64_t)i);
        zs_set_requires_grad(in[i], true);
    }
    ZT_GRADCHECK("sparse attention, T 35, causal", sparse_fn, &p, 3, in);
    for (int i = 0; i < 3; i++)
        zs_release(in[i]);
    zt_section("gradient check by central differences");
}

static void test_device(void)
{
    ZT_CHECK(zs_test_device_enable() == ZS_OK, "test device");
    zs_sparse_params p = {.block = 16, .local = 1, .global = 1, .random = 1, .seed = 5,
                          .causal = true};
    zs_tensor *x[3], *xd[3];
    for (int i = 0; i < 3; i++) {
        x[i] = zt_rand(ZS_F32, ZS_SHAPE(2, 2, 45, 16), 60 + (uint64_t)i);
        xd[i] = zs_to_device(x[i], ZS_TEST_DEVICE);
        zs_set_requires_grad(x[i], true);
        zs_set_requires_grad(xd[i], true);
    }
    zs_tensor *o = zs_sparse_attention(x[0], x[1], x[2], &p);
    zs_tensor *od = zs_sparse_attention(xd[0], xd[1], xd[2], &p);
    zs_tensor *s = zs_sum(o, 0, NULL, false), *sd = zs_sum(od, 0, NULL, false);
    ZT_CHECK(zs_backward(s, NULL, false) == ZS_OK && zs_backward(sd, NULL, false) == ZS_OK,
             "backward on both devices");
    zs_tensor *oh = od ? zs_to_device(od, ZS_CPU) : NULL;
    ZT_CHECK(max_diff(oh, o) == 0, "test device forward identical");
    for (int i = 0; i < 3; i++) {
        zs_tensor *gh = zs_grad(xd[i]) ? zs_to_device(zs_grad(xd[i]), ZS_CPU) : NULL;
        ZT_CHECK(max_diff(gh, zs_grad(x[i])) == 0, "test device gradient %d identical", i);
        zs_release(gh);
    }
    ZT_CHECK(zs_test_device_calls("sparse_attention_backward") >= 1, "ran on the device");
    zs_tensor *tmp[] = {o, od, s, sd, oh, x[0], x[1], x[2], xd[0], xd[1], xd[2]};
    for (size_t i = 0; i < sizeof tmp / sizeof *tmp; i++)
        zs_release(tmp[i]);
    zt_section("test device");
}

static void test_errors(void)
{
    zs_tensor *q = zt_rand(ZS_F32, ZS_SHAPE(1, 2, 40, 8), 1);
    zs_tensor *k = zt_rand(ZS_F32, ZS_SHAPE(1, 2, 40, 8), 2);
    zs_tensor *k2 = zt_rand(ZS_F32, ZS_SHAPE(1, 2, 41, 8), 3);
    zs_tensor *kd = zt_rand(ZS_F64, ZS_SHAPE(1, 2, 40, 8), 4);
    zs_tensor *qi = zs_zeros(ZS_I32, ZS_SHAPE(1, 2, 40, 8));
    zs_tensor *q3 = zt_rand(ZS_F32, ZS_SHAPE(2, 40, 8), 5);
    zs_sparse_params ok = {.block = 16, .local = 1};
    zs_sparse_params small = {.block = 8}, big = {.block = 256};
    zs_sparse_params neg = {.block = 16, .local = -1}, inf = {.block = 16, .scale = INFINITY};
    ZT_EXPECT_ERROR(!zs_sparse_attention(q, k, k, &small), "16..128");
    ZT_EXPECT_ERROR(!zs_sparse_attention(q, k, k, &big), "16..128");
    ZT_EXPECT_ERROR(!zs_sparse_attention(q, k, k, &neg), ">= 0");
    ZT_EXPECT_ERROR(!zs_sparse_attention(q, k, k, &inf), "finite");
    ZT_EXPECT_ERROR(!zs_sparse_attention(q, k2, k2, &ok), "self-attention");
    ZT_EXPECT_ERROR(!zs_sparse_attention(q3, q3, q3, &ok), "[B, H, T, D]");
    ZT_EXPECT_ERROR(!zs_sparse_attention(q, kd, k, &ok), "sparse_attention");
    ZT_EXPECT_ERROR(!zs_sparse_attention(qi, qi, qi, &ok), "f32 or f64");
    ZT_EXPECT_ERROR(!zs_sparse_attention(q, k, k, NULL), "no layout");
    ZT_EXPECT_ERROR(!zs_sparse_layout_new(&ok, 0), "tokens");
    ZT_EXPECT_ERROR(!zs_sparse_layout_new(NULL, 10), "no parameters");
    zs_set_error("first");
    ZT_CHECK(!zs_sparse_attention(NULL, k, k, &ok) && strstr(zs_last_error(), "first"),
             "NULL input keeps the first error");
    zs_tensor *all[] = {q, k, k2, kd, qi, q3};
    for (int i = 0; i < 6; i++)
        zs_release(all[i]);
    zt_section("error paths");
}

int main(void)
{
    test_layouts();
    test_against_dense();
    test_gradcheck();
    test_device();
    test_errors();
    return zt_done();
}
