/*
 * test_tensor.c - tensors: creation, dtypes and conversions, views,
 * contiguous, copies, scopes and refcounts, RNG, thread pool, allocator.
 */
#include <stdlib.h>

#include <string.h>

#include "testutil.h"

static void test_dtypes(void)
{
    /* bf16: round to nearest even at the 16-bit boundary */
    ZT_CHECK(zs_bf16_to_f32(zs_f32_to_bf16(1.0f)) == 1.0f, "bf16 1.0");
    float tie = 1.0f + 1.0f / 256.0f; /* halfway between 1 and 1+2^-7 */
    ZT_CHECK(zs_bf16_to_f32(zs_f32_to_bf16(tie)) == 1.0f, "bf16 tie to even");
    float above = 1.0f + 1.0f / 256.0f + 1.0f / 65536.0f;
    ZT_CHECK(zs_bf16_to_f32(zs_f32_to_bf16(above)) == 1.0f + 1.0f / 128.0f,
             "bf16 above tie rounds up");
    ZT_CHECK(isnan(zs_bf16_to_f32(zs_f32_to_bf16(NAN))), "bf16 nan");
    /* f16 */
    ZT_CHECK(zs_f16_to_f32(zs_f32_to_f16(65504.0f)) == 65504.0f, "f16 max");
    ZT_CHECK(isinf(zs_f16_to_f32(zs_f32_to_f16(65520.0f))), "f16 overflow");
    ZT_CHECK(zs_f16_to_f32(zs_f32_to_f16(1.0f + 1.0f / 2048.0f)) == 1.0f,
             "f16 tie to even");
    ZT_CHECK(zs_f16_to_f32(zs_f32_to_f16(5.9604645e-8f)) == 5.9604645e-8f,
             "f16 smallest subnormal");
    ZT_CHECK(zs_f32_to_f16(-0.0f) == 0x8000, "f16 -0");
    /* every f16 / bf16 / f8 bit pattern round-trips through f32 */
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = zs_f16_to_f32((uint16_t)h);
        if (!isnan(f) && zs_f32_to_f16(f) != h)
            bad++;
        float g = zs_bf16_to_f32((uint16_t)h);
        if (!isnan(g) && zs_f32_to_bf16(g) != h)
            bad++;
    }
    for (uint32_t v = 0; v < 256; v++) {
        float a = zs_f8e4m3_to_f32((uint8_t)v), b = zs_f8e5m2_to_f32((uint8_t)v);
        if (!isnan(a) && zs_f32_to_f8e4m3(a) != v)
            bad++;
        if (!isnan(b) && zs_f32_to_f8e5m2(b) != v)
            bad++;
    }
    ZT_CHECK(bad == 0, "%d bit patterns do not round-trip", bad);
    ZT_CHECK(zs_f8e4m3_to_f32(zs_f32_to_f8e4m3(1000.0f)) == 448.0f, "e4m3 saturates");
    ZT_CHECK(isinf(zs_f8e5m2_to_f32(zs_f32_to_f8e5m2(1e6f))), "e5m2 overflow inf");
    ZT_CHECK(zs_dtype_parse("bf16") == ZS_BF16 && zs_dtype_parse("x") == -1, "parse");
    zt_section("dtypes");
}

static void test_creation(void)
{
    zs_tensor *a = zs_arange(ZS_F32, 0, 10, 3);
    ZT_CHECK(a && a->ndim == 1 && a->shape[0] == 4 && zs_get(a, 3) == 9, "arange");
    zs_release(a);
    ZT_EXPECT_ERROR(zs_arange(ZS_F32, 0, 1, 0) == NULL, "step");
    zs_tensor *f = zs_full(ZS_I32, ZS_SHAPE(2, 3), 7);
    ZT_CHECK(f && zs_get(f, 5) == 7 && zs_nbytes(f) == 24, "full i32");
    zs_release(f);
    ZT_EXPECT_ERROR(zs_zeros(ZS_F32, ZS_SHAPE(2, -3)) == NULL, "size -3");
    ZT_EXPECT_ERROR(zs_zeros(ZS_F32, 9, (int64_t[9]){1}) == NULL, "9 dims");
    double buf[6] = {1, 2, 3, 4, 5, 6}, back[6] = {0};
    zs_tensor *t = zs_from_data(ZS_F64, ZS_SHAPE(2, 3), buf);
    ZT_CHECK(zs_copy_to_buffer(t, back, sizeof back) == ZS_OK && back[5] == 6, "to buffer");
    ZT_EXPECT_ERROR(zs_copy_to_buffer(t, back, 8) < 0, "buffer holds 8 bytes");
    zs_tensor *tt = zs_transpose(t, 0, 1);
    ZT_CHECK(zs_copy_to_buffer(tt, back, sizeof back) == ZS_OK && back[1] == 4, "transposed to buffer");
    zs_release(tt);
    zs_release(t);
    /* dtype conversion of a whole tensor */
    zs_tensor *x = zt_rand(ZS_F32, ZS_SHAPE(5, 7), 3);
    zs_tensor *h = zs_to_dtype(x, ZS_BF16);
    zs_tensor *x2 = zs_to_dtype(h, ZS_F32);
    double worst = 0;
    for (int i = 0; i < 35; i++)
        worst = fmax(worst, fabs(zs_get(x, i) - zs_get(x2, i)));
    ZT_CHECK(worst <= 1.0 / 256, "bf16 round trip error %g", worst);
    zs_release(x);
    zs_release(h);
    zs_release(x2);
    zt_section("creation and copies");
}

static void test_views(void)
{
    zs_tensor *a = zs_arange(ZS_F32, 0, 24, 1);
    zs_tensor *b = zs_reshape(a, ZS_SHAPE(2, 3, 4));
    ZT_CHECK(b && b->storage == a->storage, "reshape shares storage");
    zs_tensor *p = zs_permute(b, (int[]){2, 0, 1}); /* [4, 2, 3] */
    ZT_CHECK(p && p->shape[0] == 4 && !zs_is_contiguous(p), "permute");
    /* p[i][j][k] = b[j][k][i] = 12j + 4k + i */
    ZT_CHECK(zs_get(p, 1 * 6 + 1 * 3 + 2) == 12 + 8 + 1, "permute value");
    zs_tensor *c = zs_contiguous(p);
    ZT_CHECK(zs_is_contiguous(c) && zs_get(c, 1 * 6 + 1 * 3 + 2) == 21, "contiguous");
    zs_tensor *n = zs_narrow(b, 2, 1, 2); /* [2, 3, 2] */
    ZT_CHECK(n && zs_get(n, 0) == 1 && zs_get(n, 1) == 2 && zs_get(n, 2) == 5, "narrow");
    zs_tensor *s = zs_slice(a, 0, 1, 100, 5); /* 1, 6, 11, 16, 21 */
    ZT_CHECK(s && s->shape[0] == 5 && zs_get(s, 4) == 21, "slice clamps end");
    zs_tensor *u = zs_unsqueeze(s, 0);
    zs_tensor *e = zs_expand(u, ZS_SHAPE(3, 5));
    ZT_CHECK(e && e->strides[0] == 0 && zs_get(e, 12) == 11, "expand");
    zs_tensor *q = zs_squeeze(u, 0);
    ZT_CHECK(q && q->ndim == 1, "squeeze");
    zs_tensor *r = zs_reshape(p, ZS_SHAPE(-1, 6)); /* copies */
    ZT_CHECK(r && r->shape[0] == 4 && zs_get(r, 7) == zs_get(p, 7), "reshape -1 copy");
    zs_tensor *fl = zs_flatten(b, 1, 2);
    ZT_CHECK(fl && fl->ndim == 2 && fl->shape[1] == 12, "flatten");
    ZT_EXPECT_ERROR(zs_reshape(a, ZS_SHAPE(5, 5)) == NULL, "cannot reshape");
    ZT_EXPECT_ERROR(zs_view(p, ZS_SHAPE(24)) == NULL, "not contiguous");
    ZT_EXPECT_ERROR(zs_permute(b, (int[]){0, 0, 1}) == NULL, "permutation");
    ZT_EXPECT_ERROR(zs_narrow(b, 2, 3, 2) == NULL, "out of range");
    ZT_EXPECT_ERROR(zs_expand(b, ZS_SHAPE(2, 5, 4)) == NULL, "cannot expand");
    ZT_EXPECT_ERROR(zs_squeeze(b, 0) == NULL, "expected 1");
    ZT_EXPECT_ERROR(zs_transpose(b, 0, 3) == NULL, "dim 3 out of range");
    /* tensors without elements are contiguous (as in PyTorch), fresh or
     * permuted, so view and reshape accept them */
    zs_tensor *z = zs_empty(ZS_F32, ZS_SHAPE(2, 0, 3));
    zs_tensor *zt = zs_transpose(z, 0, 2);
    zs_tensor *zv = zs_view(z, ZS_SHAPE(0, 5)), *zr = zs_reshape(zt, ZS_SHAPE(6, 0));
    ZT_CHECK(zs_is_contiguous(z) && zs_is_contiguous(zt) && zv && zv->shape[1] == 5 &&
             zr && zr->shape[0] == 6 && zs_numel(zr) == 0, "view/reshape of empty tensors");
    ZT_EXPECT_ERROR(zs_reshape(z, ZS_SHAPE(-1, 0)) == NULL, "cannot reshape");
    zs_tensor *all[] = {a, b, p, c, n, s, u, e, q, r, fl, z, zt, zv, zr};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        zs_release(all[i]);
    zt_section("views");
}

/* The tiled transpose path of zs_copy_: odd sizes around the 16 x 16
 * blocks and 256 x 256 tiles, f32 and f64, a batch dim. */
static void test_transpose_copy(void)
{
    const int64_t sizes[][3] = {{1, 37, 300}, {3, 17, 33}, {2, 513, 260}, {1, 16, 16}};
    for (int dt = 0; dt < 2; dt++)
        for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
            zs_dtype t = dt ? ZS_F64 : ZS_F32;
            zs_tensor *a = zt_rand(t, 3, sizes[k], 40 + k);
            zs_tensor *at = zs_transpose(a, 1, 2);
            zs_tensor *c = zs_contiguous(at);
            int64_t B = sizes[k][0], R = sizes[k][1], C = sizes[k][2];
            int bad = 0;
            for (int64_t b = 0; b < B; b++)
                for (int64_t i = 0; i < C; i++)
                    for (int64_t j = 0; j < R; j++)
                        bad += zs_get(c, (b * C + i) * R + j) != zs_get(a, (b * R + j) * C + i);
            ZT_CHECK(bad == 0, "transpose copy %s [%lld,%lld,%lld]: %d wrong",
                     zs_dtype_name(t), (long long)B, (long long)R, (long long)C, bad);
            zs_release(a);
            zs_release(at);
            zs_release(c);
        }
    zt_section("tiled transpose copy");
}

static void test_scopes(void)
{
    int64_t before = zt_live_bytes();
    zs_tensor *kept;
    zs_scope_push();
    zs_tensor *a = zs_ones(ZS_F32, ZS_SHAPE(100));
    zs_tensor *b = zs_add(a, a);
    zs_release(zs_mul(a, b)); /* early release inside a scope is safe */
    zs_scope_push();
    zs_tensor *inner = zs_add(b, b);
    zs_keep(inner); /* moves to the outer scope */
    zs_scope_pop();
    ZT_CHECK(zs_get(inner, 0) == 4, "kept tensor alive after inner pop");
    kept = zs_keep(zs_mul_scalar(inner, 2.0)); /* moves to the caller */
    zs_scope_pop();
    ZT_CHECK(zs_get(kept, 99) == 8, "kept value");
    zs_release(kept);
    ZT_CHECK(zt_live_bytes() == before, "scope freed everything: %lld bytes left",
             (long long)(zt_live_bytes() - before));
    zt_section("scopes");
}

static void test_rng(void)
{
    zs_tensor *a = zs_normal(ZS_F64, ZS_SHAPE(100001), 1.0, 2.0, 42);
    zs_set_num_threads(1);
    zs_tensor *b = zs_normal(ZS_F64, ZS_SHAPE(100001), 1.0, 2.0, 42);
    zs_set_num_threads(2);
    int diff = 0;
    double mean = 0, m2 = 0;
    for (int i = 0; i < 100001; i++) {
        double v = zs_get(a, i);
        diff += v != zs_get(b, i);
        mean += v;
        m2 += v * v;
    }
    mean /= 100001;
    double sd = sqrt(m2 / 100001 - mean * mean);
    ZT_CHECK(diff == 0, "normal differs across thread counts (%d)", diff);
    ZT_CHECK(fabs(mean - 1) < 0.03 && fabs(sd - 2) < 0.03, "normal moments %g %g", mean, sd);
    zs_tensor *u = zs_uniform(ZS_F32, ZS_SHAPE(1000), 2, 3, 7);
    double lo = 9, hi = -9;
    for (int i = 0; i < 1000; i++) {
        lo = fmin(lo, zs_get(u, i));
        hi = fmax(hi, zs_get(u, i));
    }
    ZT_CHECK(lo >= 2 && hi < 3 && hi - lo > 0.95, "uniform range [%g, %g]", lo, hi);
    ZT_EXPECT_ERROR(zs_uniform(ZS_I32, ZS_SHAPE(3), 0, 1, 1) == NULL, "not a float");
    zs_release(a);
    zs_release(b);
    zs_release(u);
    zt_section("rng");
}

typedef struct { int64_t *hits; } pf_ctx;
static void pf_body(void *ctx, int64_t b, int64_t e)
{
    pf_ctx *c = ctx;
    for (int64_t i = b; i < e; i++)
        c->hits[i]++;
}

static void test_threads(void)
{
    int64_t hits[1000] = {0};
    pf_ctx c = {hits};
    for (int rep = 0; rep < 200; rep++)
        zs_parallel_for(1000, 1, pf_body, &c);
    int bad = 0;
    for (int i = 0; i < 1000; i++)
        bad += hits[i] != 200;
    ZT_CHECK(bad == 0, "parallel_for visited %d items wrongly", bad);
    zs_set_num_threads(3);
    ZT_CHECK(zs_num_threads() == 3, "resize pool");
    zs_parallel_for(1000, 7, pf_body, &c);
    ZT_CHECK(hits[999] == 201, "after resize");
    zs_set_num_threads(2);
    zt_section("thread pool");
}

static void test_alloc(void)
{
    zs_alloc_stats s0, s1;
    zs_tensor *warm = zs_empty(ZS_F32, ZS_SHAPE(1 << 20));
    zs_release(warm);
    zs_alloc_get_stats(&s0);
    for (int i = 0; i < 10; i++)
        zs_release(zs_empty(ZS_F32, ZS_SHAPE(1 << 20)));
    zs_alloc_get_stats(&s1);
    ZT_CHECK(s1.n_system == s0.n_system, "cache reused blocks (%llu new)",
             (unsigned long long)(s1.n_system - s0.n_system));
    ZT_CHECK(s1.peak_bytes >= (4u << 20), "peak counted");
    zs_alloc_fail_after(1);
    ZT_EXPECT_ERROR(zs_zeros(ZS_F32, ZS_SHAPE(10)) == NULL, "out of memory");
    zs_tensor *ok = zs_zeros(ZS_F32, ZS_SHAPE(10));
    ZT_CHECK(ok != NULL, "allocation works again");
    zs_release(ok);
    zt_section("allocator");
}

/* ---- output shapes against the plain shape rule ----------------------- */

static void test_view_shapes(void)
{
    const uint64_t seed = 1301;
    zt_irand_seed(seed);
    for (int trial = 0; trial < 40; trial++) {
        zs_scope_push();
        int nd = (int)zt_irand(1, 4);
        int64_t s[4], numel = 1, e[ZS_MAX_DIMS];
        for (int d = 0; d < nd; d++)
            numel *= (s[d] = zt_irand(1, 5));
        zs_tensor *t = zs_zeros(ZS_F32, nd, s);
        ZT_CHECK(zt_shape_is(zs_reshape(t, 2, (int64_t[]){-1, s[nd - 1]}), 2,
                        (int64_t[]){numel / s[nd - 1], s[nd - 1]}) &&
                 zt_shape_is(zs_view(t, 1, (int64_t[]){numel}), 1, (int64_t[]){numel}) &&
                 zt_shape_is(zs_flatten(t, 0, -1), 1, (int64_t[]){numel}),
                 "reshape/view/flatten shape, seed %llu trial %d", (unsigned long long)seed, trial);
        int perm[4] = {0, 1, 2, 3};
        for (int d = nd - 1; d > 0; d--) {
            int j = (int)zt_irand(0, d), x = perm[d];
            perm[d] = perm[j];
            perm[j] = x;
        }
        for (int d = 0; d < nd; d++)
            e[d] = s[perm[d]];
        ZT_CHECK(zt_shape_is(zs_permute(t, perm), nd, e), "permute shape, seed %llu trial %d",
                 (unsigned long long)seed, trial);
        memcpy(e, s, sizeof s);
        e[0] = s[nd - 1], e[nd - 1] = s[0];
        ZT_CHECK(zt_shape_is(zs_transpose(t, 0, -1), nd, e), "transpose shape, seed %llu "
                 "trial %d", (unsigned long long)seed, trial);
        int dim = (int)zt_irand(0, nd - 1);
        int64_t n = s[dim], st = zt_irand(-n - 1, n + 1), en = zt_irand(-n - 1, n + 1);
        int64_t step = zt_irand(1, 3), a = st < 0 ? st + n : st, b = en < 0 ? en + n : en;
        a = a < 0 ? 0 : a > n ? n : a;
        b = b < a ? a : b > n ? n : b;
        memcpy(e, s, sizeof s);
        e[dim] = (b - a + step - 1) / step; /* ceil((end - start) / step) */
        ZT_CHECK(zt_shape_is(zs_slice(t, dim, st, en, step), nd, e), "slice shape, seed "
                 "%llu trial %d", (unsigned long long)seed, trial);
        int64_t len = zt_irand(0, n), off = zt_irand(0, n - len);
        e[dim] = len;
        ZT_CHECK(zt_shape_is(zs_narrow(t, dim, off, len), nd, e), "narrow shape, seed %llu "
                 "trial %d", (unsigned long long)seed, trial);
        for (int d = 0, k = 0; d <= nd; d++)
            e[d] = d == dim ? 1 : s[k++];
        zs_tensor *u = zs_unsqueeze(t, dim);
        ZT_CHECK(zt_shape_is(u, nd + 1, e) && zt_shape_is(zs_squeeze(u, dim), nd, s),
                 "unsqueeze/squeeze shape, seed %llu trial %d", (unsigned long long)seed,
                 trial);
        int64_t one[4];
        for (int d = 0; d < nd; d++)
            one[d] = zt_irand(0, 1) ? 1 : s[d];
        e[0] = 2;
        memcpy(e + 1, s, sizeof s);
        ZT_CHECK(zt_shape_is(zs_expand(zs_zeros(ZS_F32, nd, one), nd + 1, e), nd + 1, e),
                 "expand shape, seed %llu trial %d", (unsigned long long)seed, trial);
        zs_tensor *p = zs_permute(t, perm);
        ZT_CHECK(zt_shape_is(zs_contiguous(p), nd, p->shape) && zt_shape_is(zs_clone(p), nd, p->shape) &&
                 zt_shape_is(zs_to_dtype(p, ZS_F64), nd, p->shape),
                 "contiguous/clone/to_dtype shape, seed %llu trial %d",
                 (unsigned long long)seed, trial);
        zs_scope_pop();
    }
    zt_section("views and copies: output shapes on random shapes == the shape rule");
}

/* A message may quote the previous one (the trainer prefixes the step). */
static void test_error_quoting(void)
{
    zs_set_error("inner %d", 42);
    zs_status st = zs_set_error_code(ZS_ERR_STATE, "step %d failed: %s", 7, zs_last_error());
    ZT_CHECK(st == ZS_ERR_STATE && !strcmp(zs_last_error(), "step 7 failed: inner 42"),
             "quoted message: '%s'", zs_last_error());
    zs_clear_error();
    zt_section("error messages quoting the previous one");
}

int main(void)
{
    test_error_quoting();
    test_view_shapes();
    test_dtypes();
    test_creation();
    test_views();
    test_transpose_copy();
    test_scopes();
    test_rng();
    test_threads();
    test_alloc();
    return zt_done();
}
