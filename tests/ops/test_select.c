/*
 * test_select.c - where, masked_fill, index_select, gather: forward against
 * float64 references (three-way broadcasting, odd sizes, negative dims,
 * non-contiguous inputs and indices, repeated indices, integer dtypes, a
 * size large enough to run threaded), gradient checks in f64, the
 * descriptors index_select_backward and gather_backward run directly
 * (strided g, repeated indices, against a float64 scatter-add; their
 * errors), where's backward on the test device (the cpu's bits), and
 * error paths (cond/mask not u8, dtype and shape mismatch, indices out of
 * range named with their value and position). Selection is exact:
 * tolerance 0.
 */
#include <stdlib.h>

#include <string.h>

#include "ops/op.h"
#include "testutil.h"

static void unravel(int64_t i, int ndim, const int64_t *shape, int64_t *c)
{
    for (int d = ndim - 1; d >= 0; d--) {
        c[d] = i % shape[d];
        i /= shape[d];
    }
}

static int64_t numel_of(int ndim, const int64_t *shape)
{
    int64_t n = 1;
    for (int d = 0; d < ndim; d++)
        n *= shape[d];
    return n;
}

/* Flat row-major index into t of output coordinates c (ndim dims), with
 * numpy broadcasting (missing leading dims, size-1 dims). */
static int64_t bcast_index(const zs_tensor *t, int ndim, const int64_t *c)
{
    int64_t i = 0;
    for (int d = 0; d < t->ndim; d++) {
        int64_t x = t->shape[d] == 1 ? 0 : c[d + ndim - t->ndim];
        i = i * t->shape[d] + x;
    }
    return i;
}

/* Deterministic u8 tensor with values in {0, 1, 7} (non-zero = true). */
static zs_tensor *rand_mask(int ndim, const int64_t *shape, uint64_t seed)
{
    int64_t n = numel_of(ndim, shape);
    uint8_t *v = malloc((size_t)(n ? n : 1));
    uint64_t s = seed * 6364136223846793005ull + 1442695040888963407ull;
    for (int64_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        uint32_t r = (uint32_t)(s >> 33) % 3;
        v[i] = r == 0 ? 0 : r == 1 ? 1 : 7;
    }
    zs_tensor *t = zs_from_data(ZS_U8, ndim, shape, v);
    free(v);
    return t;
}

/* Random indices in [0, hi) of dtype dt. */
static zs_tensor *rand_index(zs_dtype dt, int ndim, const int64_t *shape,
                             int64_t hi, uint64_t seed)
{
    zs_tensor *u = zs_uniform(ZS_F64, ndim, shape, 0, (double)hi, seed);
    int64_t n = zs_numel(u);
    zs_tensor *t = zs_empty(dt, ndim, shape);
    for (int64_t i = 0; i < n; i++) {
        int64_t k = (int64_t)zs_get(u, i);
        if (dt == ZS_I64)
            ((int64_t *)zs_data(t))[i] = k < hi ? k : hi - 1;
        else
            ((int32_t *)zs_data(t))[i] = (int32_t)(k < hi ? k : hi - 1);
    }
    zs_release(u);
    return t;
}

/* ---- where, masked_fill ------------------------------------------------ */

typedef struct where_case {
    int nc, na, nb, no;
    int64_t c[3], a[3], b[3], o[3];
} where_case;

static const where_case where_cases[] = {
    {2, 2, 2, 2, {7, 13}, {7, 13}, {7, 13}, {7, 13}},
    {2, 1, 2, 2, {7, 1}, {13}, {1, 1}, {7, 13}},
    {3, 2, 3, 3, {3, 1, 5}, {4, 1}, {3, 4, 5}, {3, 4, 5}},
    {1, 2, 0, 2, {13}, {7, 13}, {0}, {7, 13}},
    {1, 1, 1, 1, {100003}, {100003}, {100003}, {100003}},
    {2, 2, 2, 2, {0, 3}, {1, 3}, {0, 1}, {0, 3}},
};

static void test_where(zs_dtype dt, bool strided)
{
    uint64_t seed = 20;
    for (size_t k = 0; k < sizeof where_cases / sizeof *where_cases; k++) {
        const where_case *wc = &where_cases[k];
        zs_tensor *c = rand_mask(wc->nc, wc->c, seed);
        zs_tensor *a = strided ? zt_rand_strided(dt, wc->na, wc->a, seed + 1)
                               : zt_rand(dt, wc->na, wc->a, seed + 1);
        zs_tensor *b = zt_rand(dt, wc->nb, wc->b, seed + 2);
        zs_tensor *o = zs_where(c, a, b);
        int64_t n = numel_of(wc->no, wc->o), co[3];
        double *ref = malloc((size_t)(n ? n : 1) * sizeof *ref);
        for (int64_t i = 0; i < n; i++) {
            unravel(i, wc->no, wc->o, co);
            bool m = zs_get(c, bcast_index(c, wc->no, co)) != 0;
            ref[i] = m ? zs_get(a, bcast_index(a, wc->no, co))
                       : zs_get(b, bcast_index(b, wc->no, co));
        }
        double err = zt_max_err(o, ref, n);
        ZT_CHECK(o && o->ndim == wc->no && err == 0,
                 "where case %zu %s%s: err %g (seed %llu)", k,
                 zs_dtype_name(dt), strided ? " strided" : "", err,
                 (unsigned long long)seed);
        free(ref);
        zs_release(c);
        zs_release(a);
        zs_release(b);
        zs_release(o);
        seed += 3;
    }
}

static void test_where_int(void)
{
    zs_tensor *c = rand_mask(ZS_SHAPE(5, 6), 1);
    zs_tensor *a = zs_arange(ZS_I64, 0, 6, 1);
    zs_tensor *b = zs_full(ZS_I64, ZS_SHAPE(5, 1), -1);
    zs_tensor *o = zs_where(c, a, b);
    int bad = !o;
    for (int i = 0; o && i < 30; i++)
        bad += zs_get(o, i) != (zs_get(c, i) ? i % 6 : -1);
    ZT_CHECK(bad == 0 && o->dtype == ZS_I64, "where i64: %d wrong", bad);
    zs_tensor *u = zs_full(ZS_U8, ZS_SHAPE(5, 6), 3);
    zs_tensor *f = zs_masked_fill(u, c, 200);
    bad = !f;
    for (int i = 0; f && i < 30; i++)
        bad += zs_get(f, i) != (zs_get(c, i) ? 200 : 3);
    ZT_CHECK(bad == 0, "masked_fill u8: %d wrong", bad);
    zs_release(c);
    zs_release(a);
    zs_release(b);
    zs_release(o);
    zs_release(u);
    zs_release(f);
}

static void test_masked_fill(zs_dtype dt)
{
    struct { int na, nm; int64_t a[3], m[3]; bool strided; } cases[] = {
        {2, 2, {7, 13}, {7, 13}, false},
        {2, 2, {7, 13}, {7, 1}, true},
        {3, 1, {3, 4, 5}, {5}, true},
        {1, 1, {100003}, {100003}, false},
        {2, 0, {4, 3}, {0}, false},
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        int na = cases[k].na;
        zs_tensor *a = cases[k].strided ? zt_rand_strided(dt, na, cases[k].a, k)
                                        : zt_rand(dt, na, cases[k].a, k);
        zs_tensor *m = rand_mask(cases[k].nm, cases[k].m, 50 + k);
        double value = k == 0 ? -INFINITY : 2.5;
        zs_tensor *o = zs_masked_fill(a, m, value);
        int64_t n = numel_of(na, cases[k].a), c[3];
        double *ref = malloc((size_t)n * sizeof *ref);
        for (int64_t i = 0; i < n; i++) {
            unravel(i, na, cases[k].a, c);
            ref[i] = zs_get(m, bcast_index(m, na, c)) ? value : zs_get(a, i);
        }
        double err = 0;
        for (int64_t i = 0; o && i < n; i++)
            err += zs_get(o, i) != ref[i];
        ZT_CHECK(o && zs_same_shape(o, a) && err == 0,
                 "masked_fill case %zu %s: %g wrong", k, zs_dtype_name(dt),
                 err);
        free(ref);
        zs_release(a);
        zs_release(m);
        zs_release(o);
    }
}

/* ---- index_select, gather ---------------------------------------------- */

static void index_select_case(zs_dtype dt, int ndim, const int64_t *ashape,
                              bool strided, int dim, zs_dtype idt, int64_t L,
                              uint64_t seed)
{
    int d = dim < 0 ? dim + ndim : dim;
    zs_tensor *a = strided ? zt_rand_strided(dt, ndim, ashape, seed)
                           : zt_rand(dt, ndim, ashape, seed);
    zs_tensor *idx = rand_index(idt, 1, (int64_t[]){L}, ashape[d], seed + 1);
    zs_tensor *o = zs_index_select(a, dim, idx);
    int64_t osh[ZS_MAX_DIMS], c[ZS_MAX_DIMS];
    for (int k = 0; k < ndim; k++)
        osh[k] = k == d ? L : ashape[k];
    int64_t n = numel_of(ndim, osh);
    double *ref = malloc((size_t)(n ? n : 1) * sizeof *ref);
    for (int64_t i = 0; i < n; i++) {
        unravel(i, ndim, osh, c);
        c[d] = (int64_t)zs_get(idx, c[d]);
        int64_t j = 0;
        for (int k = 0; k < ndim; k++)
            j = j * ashape[k] + c[k];
        ref[i] = zs_get(a, j);
    }
    double err = zt_max_err(o, ref, n);
    ZT_CHECK(o && o->ndim == ndim && o->shape[d] == L && err == 0,
             "index_select %s dim %d L %lld%s: err %g (seed %llu)",
             zs_dtype_name(dt), dim, (long long)L, strided ? " strided" : "",
             err, (unsigned long long)seed);
    free(ref);
    zs_release(a);
    zs_release(idx);
    zs_release(o);
}

/* idx may be given a non-contiguous layout (transposed storage). */
static void gather_case(zs_dtype dt, int ndim, const int64_t *ashape,
                        bool strided, int dim, int ni, const int64_t *ishape,
                        bool idx_strided, uint64_t seed)
{
    (void)ni; /* equals ndim: gather's index has the input's rank */
    int d = dim < 0 ? dim + ndim : dim;
    zs_tensor *a = strided ? zt_rand_strided(dt, ndim, ashape, seed)
                           : zt_rand(dt, ndim, ashape, seed);
    zs_tensor *idx = rand_index(ZS_I64, ndim, ishape, ashape[d], seed + 1);
    if (idx_strided) { /* same values, transposed layout */
        int64_t tsh[ZS_MAX_DIMS];
        for (int k = 0; k < ndim; k++)
            tsh[k] = ishape[ndim - 1 - k];
        zs_tensor *buf = zs_empty(ZS_I64, ndim, tsh);
        zs_tensor *bt = zs_transpose(buf, 0, ndim - 1);
        zs_copy_(bt, idx);
        zs_release(idx);
        zs_release(buf);
        idx = bt;
    }
    zs_tensor *o = zs_gather(a, dim, idx);
    int64_t n = numel_of(ndim, ishape), c[ZS_MAX_DIMS];
    double *ref = malloc((size_t)(n ? n : 1) * sizeof *ref);
    for (int64_t i = 0; i < n; i++) {
        unravel(i, ndim, ishape, c);
        c[d] = (int64_t)zs_get(idx, i);
        int64_t j = 0;
        for (int k = 0; k < ndim; k++)
            j = j * ashape[k] + c[k];
        ref[i] = zs_get(a, j);
    }
    double err = zt_max_err(o, ref, n);
    ZT_CHECK(o && o->ndim == ndim && err == 0,
             "gather %s dim %d%s%s: err %g (seed %llu)", zs_dtype_name(dt),
             dim, strided ? " strided" : "", idx_strided ? " strided idx" : "",
             err, (unsigned long long)seed);
    free(ref);
    zs_release(a);
    zs_release(idx);
    zs_release(o);
}

static void test_index(zs_dtype dt)
{
    index_select_case(dt, ZS_SHAPE(7, 13), false, 0, ZS_I64, 5, 1);
    index_select_case(dt, ZS_SHAPE(7, 13), true, -1, ZS_I32, 20, 2);
    index_select_case(dt, ZS_SHAPE(4, 5, 6), true, 1, ZS_I64, 9, 3);
    index_select_case(dt, ZS_SHAPE(4, 5, 6), false, -3, ZS_I32, 3, 4);
    index_select_case(dt, ZS_SHAPE(4, 5, 6), false, 2, ZS_I64, 0, 5);
    index_select_case(dt, ZS_SHAPE(20011, 33), false, 0, ZS_I64, 5003, 6);
    index_select_case(dt, ZS_SHAPE(3001, 37), true, 1, ZS_I32, 41, 7);
    gather_case(dt, ZS_SHAPE(7, 13), false, 0, ZS_SHAPE(5, 9), false, 10);
    gather_case(dt, ZS_SHAPE(7, 13), true, 1, ZS_SHAPE(7, 20), false, 11);
    gather_case(dt, ZS_SHAPE(7, 13), false, -1, ZS_SHAPE(3, 4), true, 12);
    gather_case(dt, ZS_SHAPE(4, 5, 6), true, -2, ZS_SHAPE(3, 8, 2), true, 13);
    gather_case(dt, ZS_SHAPE(4, 5, 6), false, 0, ZS_SHAPE(4, 5, 6), false, 14);
    gather_case(dt, ZS_SHAPE(4, 5, 6), false, 2, ZS_SHAPE(4, 0, 6), false, 15);
    gather_case(dt, ZS_SHAPE(301, 257), false, 0, ZS_SHAPE(500, 257), false, 16);
}

/* ---- gradients ---------------------------------------------------------- */

typedef struct sel_ctx {
    zs_tensor *t; /* cond, mask or index */
    int dim;
} sel_ctx;

static zs_tensor *gc_where(void *ctx, zs_tensor **in)
{
    sel_ctx *c = ctx;
    zs_tensor *w = zs_where(c->t, in[0], in[1]);
    zs_tensor *o = zs_mul(w, w);
    zs_release(w);
    return o;
}

static zs_tensor *gc_masked_fill(void *ctx, zs_tensor **in)
{
    sel_ctx *c = ctx;
    zs_tensor *s = zs_mul(in[0], in[0]);
    zs_tensor *o = zs_masked_fill(s, c->t, 3.0);
    zs_release(s);
    return o;
}

static zs_tensor *gc_index_select(void *ctx, zs_tensor **in)
{
    sel_ctx *c = ctx;
    return zs_index_select(in[0], c->dim, c->t);
}

static zs_tensor *gc_gather(void *ctx, zs_tensor **in)
{
    sel_ctx *c = ctx;
    return zs_gather(in[0], c->dim, c->t);
}

static void test_grad(void)
{
    zs_tensor *cond = rand_mask(ZS_SHAPE(7, 13), 3);
    zs_tensor *a = zt_rand_strided(ZS_F64, ZS_SHAPE(13), 1);
    zs_tensor *b = zt_rand(ZS_F64, ZS_SHAPE(7, 1), 2);
    zs_set_requires_grad(a, true);
    zs_set_requires_grad(b, true);
    sel_ctx ctx = {cond, 0};
    ZT_GRADCHECK("where, a and b broadcast", gc_where, &ctx, 2,
                 ((zs_tensor *[]){a, b}));
    zs_release(a);
    zs_release(b);
    zs_release(cond);
    cond = rand_mask(ZS_SHAPE(4, 1), 4);
    a = zt_rand(ZS_F64, ZS_SHAPE(4, 5), 3);
    b = zt_rand(ZS_F64, ZS_SHAPE(4, 5), 4);
    zs_set_requires_grad(b, true);
    ctx.t = cond;
    ZT_GRADCHECK("where, only b requires grad", gc_where, &ctx, 2,
                 ((zs_tensor *[]){a, b}));
    zs_release(a);
    zs_release(b);
    zs_release(cond);

    zs_tensor *mask = rand_mask(ZS_SHAPE(6, 1), 5);
    zs_tensor *x = zt_rand_strided(ZS_F64, ZS_SHAPE(6, 7), 5);
    zs_set_requires_grad(x, true);
    ctx.t = mask;
    ZT_GRADCHECK("masked_fill, broadcast mask", gc_masked_fill, &ctx, 1, &x);
    zs_release(x);
    zs_release(mask);

    int64_t iv[] = {2, 0, 2, 4, 2, 1};
    zs_tensor *idx = zs_from_data(ZS_I64, ZS_SHAPE(6), iv);
    zs_tensor *y = zt_rand_strided(ZS_F64, ZS_SHAPE(5, 3, 4), 6);
    zs_set_requires_grad(y, true);
    ctx = (sel_ctx){idx, 0};
    ZT_GRADCHECK("index_select dim 0, repeated", gc_index_select, &ctx, 1, &y);
    zs_release(y);
    y = zt_rand(ZS_F64, ZS_SHAPE(3, 5, 4), 7);
    zs_set_requires_grad(y, true);
    ctx.dim = -2;
    ZT_GRADCHECK("index_select dim -2, repeated", gc_index_select, &ctx, 1, &y);
    zs_release(y);
    zs_release(idx);

    zs_tensor *gi = rand_index(ZS_I32, ZS_SHAPE(4, 9, 3), 5, 8);
    y = zt_rand_strided(ZS_F64, ZS_SHAPE(5, 5, 4), 9);
    zs_set_requires_grad(y, true);
    ctx = (sel_ctx){gi, 1};
    ZT_GRADCHECK("gather dim 1 (idx smaller off dim)", gc_gather, &ctx, 1, &y);
    zs_release(gi);
    gi = rand_index(ZS_I64, ZS_SHAPE(6, 4), 5, 9);
    zs_release(y);
    y = zt_rand(ZS_F64, ZS_SHAPE(5, 4), 10);
    zs_set_requires_grad(y, true);
    ctx = (sel_ctx){gi, 0};
    ZT_GRADCHECK("gather dim 0", gc_gather, &ctx, 1, &y);
    zs_release(gi);
    zs_release(y);

    /* repeated indices accumulate: counts per row */
    zs_tensor *w = zs_ones(ZS_F32, ZS_SHAPE(4, 3));
    zs_set_requires_grad(w, true);
    int32_t rv[] = {1, 1, 1, 3};
    idx = zs_from_data(ZS_I32, ZS_SHAPE(4), rv);
    zs_tensor *s = zs_index_select(w, 0, idx);
    zs_tensor *t = zs_sum(s, 0, NULL, false);
    ZT_CHECK(t && zs_backward(t, NULL, false) == ZS_OK, "backward");
    double want[4] = {0, 3, 0, 1};
    int bad = !zs_grad(w);
    for (int i = 0; !bad && i < 12; i++)
        bad += zs_get(zs_grad(w), i) != want[i / 3];
    ZT_CHECK(bad == 0, "index_select accumulates repeated rows");
    zs_release(w);
    zs_release(idx);
    zs_release(s);
    zs_release(t);
    ZT_CHECK(zs_autograd_live_nodes() == 0, "tape freed (%lld nodes live)",
             (long long)zs_autograd_live_nodes());
    zt_section("gradients (where, masked_fill, index_select, gather)");
}

/* where's backward on the test device (memory the host may not touch):
 * its zero is made on g's device, so the rule runs there and gives the
 * CPU's gradients, to the bit. */
static void test_where_device(void)
{
    zs_tensor *cond = rand_mask(ZS_SHAPE(5, 6), 11);
    zs_tensor *a = zt_rand(ZS_F32, ZS_SHAPE(5, 6), 12);
    zs_tensor *b = zt_rand(ZS_F32, ZS_SHAPE(6), 13);
    zs_tensor *ga[2] = {0}, *gb[2] = {0};
    bool ran = zs_test_device_enable() == ZS_OK;
    for (int k = 0; k < 2 && ran; k++) { /* 0 cpu, 1 test */
        int dev = k ? ZS_TEST_DEVICE : ZS_CPU;
        zs_tensor *c = zs_to_device(cond, dev), *x = zs_to_device(a, dev);
        zs_tensor *y = zs_to_device(b, dev);
        zs_set_requires_grad(x, true);
        zs_set_requires_grad(y, true);
        zs_tensor *w = zs_where(c, x, y), *l = w ? zs_sum(w, 0, NULL, false) : NULL;
        ran = l && zs_backward(l, NULL, false) == ZS_OK && zs_grad(x) && zs_grad(y);
        if (ran) {
            ga[k] = zs_to_device(zs_grad(x), ZS_CPU);
            gb[k] = zs_to_device(zs_grad(y), ZS_CPU);
        }
        zs_tensor *ts[] = {c, x, y, w, l};
        for (size_t i = 0; i < sizeof ts / sizeof *ts; i++)
            zs_release(ts[i]);
    }
    ZT_CHECK(ran && ga[1] && gb[1] &&
             !memcmp(zs_data(ga[0]), zs_data(ga[1]), zs_nbytes(ga[0])) &&
             !memcmp(zs_data(gb[0]), zs_data(gb[1]), zs_nbytes(gb[0])),
             "where backward on the test device = the cpu's gradients (bits)");
    zs_tensor *ts[] = {cond, a, b, ga[0], ga[1], gb[0], gb[1]};
    for (size_t i = 0; i < sizeof ts / sizeof *ts; i++)
        zs_release(ts[i]);
    zt_section("where backward on another device");
}

/* The layout of index_attrs (src/ops/select.c). */
typedef struct index_attrs {
    int64_t dim;
    int64_t ndim;
    int64_t shape[ZS_MAX_DIMS];
} index_attrs;

/* index_select_backward and gather_backward called directly, as a backward
 * rule on any device does: strided f64 g, i64 indices with repeats, into
 * an input of shape [5, 6, 4] along dim 1 (given as -2), against a float64
 * scatter-add; errors. */
static void test_index_backward_descriptor(void)
{
    for (int gather = 0; gather < 2; gather++) {
        const char *name = gather ? "gather_backward" : "index_select_backward";
        zsi_opdef *def = zsi_opdef_find(name);
        zsi_opdef *fw = zsi_opdef_find(gather ? "gather" : "index_select");
        ZT_CHECK(def && fw && fw->bw_ops && fw->bw_ops[0] == def &&
                     !fw->bw_ops[1] && !def->op.backward, "%s: bw_ops", name);
        if (!def)
            continue;
        int64_t ashape[3] = {5, 6, 4};
        int64_t gshape[3] = {gather ? 4 : 5, 9, gather ? 3 : 4};
        zs_tensor *g = zt_rand_strided(ZS_F64, 3, gshape, 700 + gather);
        zs_tensor *idx = gather ? rand_index(ZS_I64, 3, gshape, 6, 710)
                                : rand_index(ZS_I64, 1, (int64_t[]){9}, 6, 711);
        double ref[120] = {0};
        int64_t c[3];
        for (int64_t i = 0; i < zs_numel(g); i++) {
            unravel(i, 3, gshape, c);
            int64_t j = (int64_t)zs_get(idx, gather ? i : c[1]);
            ref[(c[0] * 6 + j) * 4 + c[2]] += zs_get(g, i);
        }
        index_attrs at = {.dim = -2, .ndim = 3, .shape = {5, 6, 4}};
        zs_tensor *gx = zsi_run(def, 2, (zs_tensor *[]){g, idx}, &at);
        double err = gx ? zt_max_err(gx, ref, 120) : 1;
        ZT_CHECK(!zs_is_contiguous(g) && zt_shape_is(gx, 3, ashape) && err <= 1e-15,
                 "%s: err %g", name, err);
        zs_tensor *i32 = zs_to_dtype(idx, ZS_I32);
        ZT_EXPECT_ERROR(!zsi_run(def, 2, (zs_tensor *[]){g, i32}, &at),
                        "expected i64 indices of the forward");
        at.shape[gather ? 0 : 2] = 3; /* smaller than g off dim */
        ZT_EXPECT_ERROR(!zsi_run(def, 2, (zs_tensor *[]){g, idx}, &at),
                        gather ? "gather_backward: g [4, 9, 3], idx i64 [4, 9, "
                                 "3], input [3, 6, 4]"
                               : "index_select_backward: g [5, 9, 4], idx i64 "
                                 "[9], input [5, 6, 3]");
        zs_release(g);
        zs_release(idx);
        zs_release(i32);
        zs_release(gx);
    }
    zt_section("index_select_backward, gather_backward run directly: strided g, "
               "repeats, errors");
}

static void test_errors(void)
{
    zs_tensor *a = zs_ones(ZS_F32, ZS_SHAPE(2, 3));
    zs_tensor *b = zs_ones(ZS_F64, ZS_SHAPE(2, 3));
    zs_tensor *c = zs_ones(ZS_U8, ZS_SHAPE(2, 3));
    zs_tensor *c4 = zs_ones(ZS_U8, ZS_SHAPE(4));
    zs_tensor *fc = zs_ones(ZS_F32, ZS_SHAPE(2, 3));
    ZT_EXPECT_ERROR(zs_where(fc, a, a) == NULL,
                    "where: condition dtype f32, expected u8");
    ZT_EXPECT_ERROR(zs_where(c, a, b) == NULL,
                    "where: dtypes f32 (a) and f64 (b) differ");
    ZT_EXPECT_ERROR(zs_where(c4, a, a) == NULL,
                    "where: shapes [4] (cond), [2, 3] (a) and [2, 3] (b) "
                    "cannot be broadcast");
    ZT_EXPECT_ERROR(zs_masked_fill(a, fc, 0) == NULL,
                    "masked_fill: mask dtype f32, expected u8");
    zs_tensor *big = zs_ones(ZS_U8, ZS_SHAPE(5, 2, 3));
    ZT_EXPECT_ERROR(zs_masked_fill(a, big, 0) == NULL,
                    "masked_fill: mask [5, 2, 3] does not broadcast to the "
                    "input's shape [2, 3]");
    ZT_EXPECT_ERROR(zs_masked_fill(a, c4, 0) == NULL, "cannot be broadcast");

    int64_t iv[] = {0, 2, 3, 1};
    zs_tensor *idx = zs_from_data(ZS_I64, ZS_SHAPE(4), iv);
    ZT_EXPECT_ERROR(zs_index_select(a, 1, idx) == NULL,
                    "index_select: index 3 at position 2 is out of range for "
                    "dim 1 of size 3");
    int32_t nv[] = {1, -1};
    zs_tensor *neg = zs_from_data(ZS_I32, ZS_SHAPE(2), nv);
    ZT_EXPECT_ERROR(zs_index_select(a, 0, neg) == NULL,
                    "index -1 at position 1 is out of range for dim 0 of size 2");
    ZT_EXPECT_ERROR(zs_index_select(a, 0, fc) == NULL,
                    "index_select: index dtype f32, expected i32 or i64");
    zs_tensor *i2 = zs_zeros(ZS_I64, ZS_SHAPE(2, 2));
    ZT_EXPECT_ERROR(zs_index_select(a, 0, i2) == NULL,
                    "index has shape [2, 2], expected 1-D");
    ZT_EXPECT_ERROR(zs_index_select(a, 2, idx) == NULL,
                    "index_select: dim 2 out of range");
    int64_t gv[] = {0, 1, 2, 1, 5, 0};
    zs_tensor *gidx = zs_from_data(ZS_I64, ZS_SHAPE(2, 3), gv);
    ZT_EXPECT_ERROR(zs_gather(a, 1, gidx) == NULL,
                    "gather: index 5 at position [1, 1] is out of range for "
                    "dim 1 of size 3");
    ZT_EXPECT_ERROR(zs_gather(a, 0, idx) == NULL,
                    "gather: index [4] has 1 dims, expected 2");
    zs_tensor *wide = zs_zeros(ZS_I32, ZS_SHAPE(2, 4));
    ZT_EXPECT_ERROR(zs_gather(a, 0, wide) == NULL,
                    "gather: index [2, 4] is larger than the input [2, 3] in "
                    "dim 1");
    zs_tensor *big_idx = zs_full(ZS_I64, ZS_SHAPE(100003), 1);
    ((int64_t *)zs_data(big_idx))[77777] = 1000;
    ZT_EXPECT_ERROR(zs_index_select(a, 1, big_idx) == NULL,
                    "index 1000 at position 77777");
    zs_set_error("first");
    ZT_CHECK(zs_gather(NULL, 0, gidx) == NULL && zs_where(c, a, NULL) == NULL &&
                 !strcmp(zs_last_error(), "first"),
             "NULL input keeps the first error");
    zs_release(a);
    zs_release(b);
    zs_release(c);
    zs_release(c4);
    zs_release(fc);
    zs_release(big);
    zs_release(idx);
    zs_release(neg);
    zs_release(i2);
    zs_release(gidx);
    zs_release(wide);
    zs_release(big_idx);
    zt_section("errors");
}

/* ---- output shapes against the plain shape rule ----------------------- */

static void test_select_shapes(void)
{
    const uint64_t seed = 1302;
    zt_irand_seed(seed);
    for (int trial = 0; trial < 30; trial++) {
        zs_scope_push();
        int nd = (int)zt_irand(1, 4);
        int64_t s[4], sc[4], sb[4], e[4];
        for (int d = 0; d < nd; d++) {
            s[d] = zt_irand(1, 4);
            sc[d] = zt_irand(0, 1) ? 1 : s[d];
        }
        int nb = (int)zt_irand(1, nd); /* b: the trailing nb dims, some 1 */
        for (int d = 0; d < nb; d++)
            sb[d] = zt_irand(0, 1) ? 1 : s[nd - nb + d];
        for (int d = 0; d < nd; d++) { /* numpy broadcasting of cond, a, b */
            int db = d - (nd - nb);
            int64_t x = sc[d] > 1 ? sc[d] : 1, y = db >= 0 ? sb[db] : 1;
            e[d] = x > 1 ? x : y;
        }
        zs_tensor *cond = zs_zeros(ZS_U8, nd, sc), *a = zs_zeros(ZS_F32, nd, sc);
        zs_tensor *b = zs_zeros(ZS_F32, nb, sb), *x = zs_zeros(ZS_F32, nd, s);
        ZT_CHECK(zt_shape_is(zs_where(cond, a, b), nd, e), "where shape, seed %llu trial %d",
                 (unsigned long long)seed, trial);
        ZT_CHECK(zt_shape_is(zs_masked_fill(x, cond, 1.0), nd, s), "masked_fill shape, seed "
                 "%llu trial %d", (unsigned long long)seed, trial);
        int dim = (int)zt_irand(0, nd - 1);
        int64_t k = zt_irand(0, 5);
        memcpy(e, s, sizeof s);
        e[dim] = k;
        ZT_CHECK(zt_shape_is(zs_index_select(x, dim, zs_zeros(ZS_I64, 1, &k)), nd, e),
                 "index_select shape, seed %llu trial %d", (unsigned long long)seed, trial);
        for (int d = 0; d < nd; d++)
            e[d] = d == dim ? zt_irand(0, 5) : zt_irand(0, s[d]);
        ZT_CHECK(zt_shape_is(zs_gather(x, dim, zs_zeros(ZS_I32, nd, e)), nd, e),
                 "gather shape, seed %llu trial %d", (unsigned long long)seed, trial);
        zs_scope_pop();
    }
    zt_section("where, masked_fill, index_select, gather: shapes on random shapes");
}

int main(void)
{
    test_select_shapes();
    test_where(ZS_F32, false);
    test_where(ZS_F64, false);
    test_where(ZS_F32, true);
    test_where_int();
    zt_section("where vs reference (three-way broadcast, strided, i64)");
    test_masked_fill(ZS_F32);
    test_masked_fill(ZS_F64);
    zt_section("masked_fill vs reference (broadcast mask, strided, -inf)");
    test_index(ZS_F32);
    test_index(ZS_F64);
    zt_section("index_select and gather vs reference");
    test_grad();
    test_index_backward_descriptor();
    test_where_device();
    test_errors();
    return zt_done();
}
