/*
 * test_embedding.c - zs_embedding: forward (i32 and i64 indices of several
 * ranks, strided weight and indices, f32 and f64) against direct lookup;
 * backward: repeated indices accumulate, a multi-threaded scatter-add
 * against a float64 reference, gradcheck of the weight; the descriptor
 * embedding_backward run directly (strided gout and indices, an index
 * outside [0, V) adds nothing, its errors); errors, including an
 * out-of-range index named with its position.
 *
 * Forward results are copies, so they must match exactly; the backward
 * reference sums in double, f64 results within 1e-12.
 */
#include <stdlib.h>

#include <string.h>

#include "ops/op.h"
#include "testutil.h"

/* Index tensor of dtype dt with values (i * 7 + 3) % V (repeats when
 * n > V). */
static zs_tensor *make_idx(zs_dtype dt, int ndim, const int64_t *shape,
                           int64_t V)
{
    zs_tensor *t = zs_empty(dt, ndim, shape);
    int64_t n = zs_numel(t);
    for (int64_t i = 0; i < n; i++) {
        int64_t v = (i * 7 + 3) % V;
        if (dt == ZS_I64)
            ((int64_t *)zs_data(t))[i] = v;
        else
            ((int32_t *)zs_data(t))[i] = (int32_t)v;
    }
    return t;
}

static void check_lookup(const zs_tensor *w, const zs_tensor *idx,
                         const zs_tensor *out, const char *what)
{
    int64_t n = zs_numel(idx), D = w->shape[1];
    bool shape_ok = out && out->ndim == idx->ndim + 1 &&
                    out->shape[idx->ndim] == D;
    for (int d = 0; shape_ok && d < idx->ndim; d++)
        shape_ok = out->shape[d] == idx->shape[d];
    int bad = 0;
    for (int64_t i = 0; shape_ok && i < n; i++) {
        int64_t v = (int64_t)zs_get(idx, i);
        for (int64_t d = 0; d < D; d++)
            bad += zs_get(out, i * D + d) != zs_get(w, v * D + d);
    }
    ZT_CHECK(shape_ok && bad == 0, "embedding %s: shape ok %d, %d wrong",
             what, shape_ok, bad);
}

static void test_forward(void)
{
    for (int k = 0; k < 8; k++) {
        zs_dtype wdt = k & 1 ? ZS_F64 : ZS_F32;
        zs_dtype idt = k & 2 ? ZS_I64 : ZS_I32;
        bool strided = k & 4;
        zs_tensor *w = strided ? zt_rand_strided(wdt, ZS_SHAPE(11, 7), k)
                               : zt_rand(wdt, ZS_SHAPE(11, 7), k);
        zs_tensor *i2 = make_idx(idt, ZS_SHAPE(3, 5), 11);
        zs_tensor *i2t = zs_transpose(i2, 0, 1); /* non-contiguous [5, 3] */
        zs_tensor *i0 = make_idx(idt, 0, NULL, 11);
        zs_tensor *i3 = make_idx(idt, ZS_SHAPE(2, 3, 4), 11);
        zs_tensor *idxs[] = {i2, i2t, i0, i3};
        const char *names[] = {"[3, 5]", "transposed [5, 3]", "0-d", "[2, 3, 4]"};
        for (int j = 0; j < 4; j++) {
            zs_tensor *o = zs_embedding(w, idxs[j]);
            char what[96];
            snprintf(what, sizeof what, "%s %s idx %s%s", zs_dtype_name(wdt),
                     zs_dtype_name(idt), names[j], strided ? " strided w" : "");
            check_lookup(w, idxs[j], o, what);
            zs_release(o);
        }
        zs_release(w);
        zs_release(i2);
        zs_release(i2t);
        zs_release(i0);
        zs_release(i3);
    }
    zt_section("forward: i32/i64, ranks 0-3, strided weight and indices");
}

static void test_accumulate(void)
{
    zs_tensor *w = zt_rand(ZS_F32, ZS_SHAPE(5, 3), 1);
    zs_set_requires_grad(w, true);
    int64_t iv[] = {1, 1, 4, 1};
    zs_tensor *idx = zs_from_data(ZS_I64, ZS_SHAPE(4), iv);
    zs_tensor *o = zs_embedding(w, idx);
    zs_tensor *s = zs_sum(o, 0, NULL, false);
    ZT_CHECK(zs_backward(s, NULL, false) == ZS_OK, "backward runs");
    const double expect[5] = {0, 3, 0, 0, 1};
    int bad = 0;
    for (int v = 0; v < 5; v++)
        for (int d = 0; d < 3; d++)
            bad += zs_get(zs_grad(w), v * 3 + d) != expect[v];
    ZT_CHECK(bad == 0, "repeated indices accumulate: %d wrong", bad);
    zs_release(s);
    zs_release(o);
    zs_release(idx);
    zs_release(w);

    /* many tokens over threads: every vocabulary range sees every index */
    const int64_t V = 1000, D = 64, n = 4000;
    w = zt_rand(ZS_F64, ZS_SHAPE(V, D), 2);
    zs_set_requires_grad(w, true);
    zs_tensor *u = zs_uniform(ZS_F64, ZS_SHAPE(n), 0, (double)V, 3);
    idx = zs_to_dtype(u, ZS_I32); /* truncates to [0, V) */
    zs_tensor *r = zt_rand(ZS_F64, ZS_SHAPE(n, D), 4);
    o = zs_embedding(w, idx);
    zs_tensor *orr = zs_mul(o, r);
    s = zs_sum(orr, 0, NULL, false);
    ZT_CHECK(zs_backward(s, NULL, false) == ZS_OK, "backward runs");
    double *ref = calloc((size_t)(V * D), sizeof *ref);
    for (int64_t i = 0; i < n; i++) {
        int64_t v = (int64_t)zs_get(idx, i);
        for (int64_t d = 0; d < D; d++)
            ref[v * D + d] += zs_get(r, i * D + d);
    }
    double err = zt_max_err(zs_grad(w), ref, V * D);
    ZT_CHECK(err <= 1e-12, "scatter-add [%lld tokens, %lld x %lld]: err %g",
             (long long)n, (long long)V, (long long)D, err);
    free(ref);
    zs_release(s);
    zs_release(orr);
    zs_release(o);
    zs_release(r);
    zs_release(idx);
    zs_release(u);
    zs_release(w);
    zt_section("backward: repeated indices accumulate, threaded scatter-add");
}

static zs_tensor *emb_fn(void *ctx, zs_tensor **in)
{
    return zs_embedding(in[0], ctx);
}

static void test_grad(void)
{
    zs_tensor *w = zt_rand_strided(ZS_F64, ZS_SHAPE(6, 5), 5);
    zs_set_requires_grad(w, true);
    for (int k = 0; k < 2; k++) {
        zs_tensor *idx = make_idx(k ? ZS_I64 : ZS_I32, ZS_SHAPE(3, 4), 6);
        ZT_GRADCHECK(k ? "embedding i64" : "embedding i32", emb_fn, idx, 1, &w);
        zs_release(idx);
    }
    zs_release(w);
    zt_section("gradcheck of the weight");
}

static void test_errors(void)
{
    zs_tensor *w = zs_ones(ZS_F32, ZS_SHAPE(10, 4));
    int64_t bad[] = {1, 2, 3, 4, 5, 10};
    zs_tensor *idx = zs_from_data(ZS_I64, ZS_SHAPE(2, 3), bad);
    ZT_EXPECT_ERROR(zs_embedding(w, idx) == NULL,
                    "embedding: index 10 at position [1, 2] (flat 5) is out "
                    "of range [0, 10)");
    int32_t neg[] = {0, -1};
    zs_tensor *in = zs_from_data(ZS_I32, ZS_SHAPE(2), neg);
    ZT_EXPECT_ERROR(zs_embedding(w, in) == NULL, "index -1 at position [1]");
    zs_tensor *fidx = zs_ones(ZS_F32, ZS_SHAPE(3));
    ZT_EXPECT_ERROR(zs_embedding(w, fidx) == NULL, "index dtype f32");
    zs_tensor *w1 = zs_ones(ZS_F32, ZS_SHAPE(10));
    ZT_EXPECT_ERROR(zs_embedding(w1, in) == NULL,
                    "weight [10] has 1 dims, expected 2");
    zs_tensor *wi = zs_ones(ZS_I32, ZS_SHAPE(10, 4));
    ZT_EXPECT_ERROR(zs_embedding(wi, in) == NULL, "dtype i32 is not supported");
    zs_set_error("first");
    ZT_CHECK(zs_embedding(NULL, in) == NULL && zs_embedding(w, NULL) == NULL &&
                 !strcmp(zs_last_error(), "first"),
             "NULL input keeps the first error");
    zs_release(w);
    zs_release(idx);
    zs_release(in);
    zs_release(fidx);
    zs_release(w1);
    zs_release(wi);
    ZT_CHECK(zs_autograd_live_nodes() == 0, "no autograd nodes left");
    zt_section("errors");
}

/* ---- output shapes against the plain shape rule ----------------------- */

static void test_embedding_shapes(void)
{
    const uint64_t seed = 1303;
    zt_irand_seed(seed);
    for (int trial = 0; trial < 20; trial++) {
        zs_scope_push();
        int nd = (int)zt_irand(0, 3);
        int64_t s[4], V = zt_irand(1, 9), D = zt_irand(0, 7);
        for (int d = 0; d < nd; d++)
            s[d] = zt_irand(0, 4);
        s[nd] = D; /* [idx..., D] */
        zs_tensor *w = zs_zeros(ZS_F32, 2, (int64_t[]){V, D});
        ZT_CHECK(zt_shape_is(zs_embedding(w, zs_zeros(ZS_I64, nd, s)), nd + 1, s),
                 "embedding shape, seed %llu trial %d", (unsigned long long)seed, trial);
        zs_scope_pop();
    }
    zt_section("embedding: [idx..., D] on random shapes");
}

/* The layout of embedding_backward_attrs (src/ops/embedding.c). */
typedef struct emb_bw_attrs {
    int64_t V;
} emb_bw_attrs;

/* embedding_backward called directly, as a backward rule on any device
 * does: strided f64 gout [3, 5, D] and strided i32 indices with repeats
 * and one index out of range (V), against a float64 scatter-add. */
static void test_backward_descriptor(void)
{
    zsi_opdef *def = zsi_opdef_find("embedding_backward");
    zsi_opdef *fw = zsi_opdef_find("embedding");
    ZT_CHECK(def && fw && fw->bw_ops && fw->bw_ops[0] == def && !fw->bw_ops[1] &&
                 !def->op.backward, "embedding's bw_ops");
    if (!def)
        return;
    int64_t V = 6, D = 4;
    zs_tensor *ib = make_idx(ZS_I32, ZS_SHAPE(5, 3), V);
    ((int32_t *)zs_data(ib))[4] = (int32_t)V; /* out of range: skipped */
    zs_tensor *idx = zs_transpose(ib, 0, 1);  /* [3, 5], strided */
    zs_tensor *g = zt_rand_strided(ZS_F64, ZS_SHAPE(3, 5, D), 9);
    double ref[6 * 4] = {0};
    for (int64_t i = 0; i < 15; i++) {
        int64_t v = (int64_t)zs_get(idx, i);
        for (int64_t d = 0; v < V && d < D; d++)
            ref[v * D + d] += zs_get(g, i * D + d);
    }
    emb_bw_attrs at = {V};
    zs_tensor *gw = zsi_run(def, 2, (zs_tensor *[]){idx, g}, &at);
    double err = gw ? zt_max_err(gw, ref, V * D) : 1;
    ZT_CHECK(!zs_is_contiguous(idx) && zt_shape_is(gw, ZS_SHAPE(V, D)) &&
                 err <= 1e-12, "scatter-add: err %g", err);
    zs_tensor *g2 = zt_rand(ZS_F64, ZS_SHAPE(3, 4, D), 9);
    ZT_EXPECT_ERROR(!zsi_run(def, 2, (zs_tensor *[]){idx, g2}, &at),
                    "embedding_backward: idx [3, 5], g [3, 4, 4], V 6: "
                    "expected g [idx..., D]");
    ZT_EXPECT_ERROR(!zsi_run(def, 2, (zs_tensor *[]){g, g}, &at), "embedding_backward");
    zs_release(ib);
    zs_release(idx);
    zs_release(g);
    zs_release(g2);
    zs_release(gw);
    zt_section("embedding_backward run directly: strided inputs, skipped index, errors");
}

int main(void)
{
    test_embedding_shapes();
    test_forward();
    test_accumulate();
    test_grad();
    test_backward_descriptor();
    test_errors();
    return zt_done();
}
