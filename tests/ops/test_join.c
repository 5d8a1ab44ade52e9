/*
 * test_join.c - concat, stack, split, chunk: forward against float64
 * references (odd sizes, negative dims, non-contiguous inputs, one input,
 * hundreds of inputs, a size large enough to run threaded), gradient checks
 * in f64 (some inputs without grad, split/chunk pieces used downstream),
 * concat as a descriptor (one call up to ZSI_MAX_IN inputs, groups above,
 * replay from the node's attributes, every dtype, its cost), and error
 * paths. Copies are exact, so forward tolerances are 0.
 */
#include <stdlib.h>

#include "ops/op.h"
#include "testutil.h"

static void unravel(int64_t i, int ndim, const int64_t *shape, int64_t *c)
{
    for (int d = ndim - 1; d >= 0; d--) {
        c[d] = i % shape[d];
        i /= shape[d];
    }
}

static int64_t ravel(int ndim, const int64_t *shape, const int64_t *c)
{
    int64_t i = 0;
    for (int d = 0; d < ndim; d++)
        i = i * shape[d] + c[d];
    return i;
}

/* Reference concat along d: ref[] receives the output's row-major values. */
static void concat_ref(int n, zs_tensor **ts, int d, int ndim,
                       const int64_t *oshape, double *ref)
{
    int64_t numel = 1, c[ZS_MAX_DIMS];
    for (int k = 0; k < ndim; k++)
        numel *= oshape[k];
    for (int64_t i = 0; i < numel; i++) {
        unravel(i, ndim, oshape, c);
        int k = 0;
        while (c[d] >= ts[k]->shape[d])
            c[d] -= ts[k++]->shape[d];
        ref[i] = zs_get(ts[k], ravel(ndim, ts[k]->shape, c));
    }
}

typedef struct cat_case {
    int n, ndim, dim;
    int64_t shape[3][3]; /* shapes of the n inputs */
    bool strided[3];
} cat_case;

static const cat_case cat_cases[] = {
    {3, 2, 0, {{7, 13}, {2, 13}, {5, 13}}, {false, true, false}},
    {3, 2, -1, {{7, 13}, {7, 1}, {7, 6}}, {true, false, true}},
    {3, 3, 1, {{3, 4, 5}, {3, 0, 5}, {3, 7, 5}}, {false, false, true}},
    {2, 3, -3, {{2, 3, 5}, {1, 3, 5}}, {true, true}},
    {1, 2, 1, {{7, 13}}, {true}},
    {2, 2, 1, {{301, 257}, {301, 129}}, {false, true}},
};

static void test_concat_forward(zs_dtype dt)
{
    uint64_t seed = 1;
    for (size_t ci = 0; ci < sizeof cat_cases / sizeof *cat_cases; ci++) {
        const cat_case *cc = &cat_cases[ci];
        zs_tensor *ts[3];
        for (int i = 0; i < cc->n; i++)
            ts[i] = cc->strided[i]
                        ? zt_rand_strided(dt, cc->ndim, cc->shape[i], seed + i)
                        : zt_rand(dt, cc->ndim, cc->shape[i], seed + i);
        int d = cc->dim < 0 ? cc->dim + cc->ndim : cc->dim;
        int64_t oshape[3], numel = 1;
        for (int k = 0; k < cc->ndim; k++) {
            oshape[k] = k == d ? 0 : cc->shape[0][k];
            for (int i = 0; k == d && i < cc->n; i++)
                oshape[k] += cc->shape[i][k];
            numel *= oshape[k];
        }
        double *ref = malloc((size_t)numel * sizeof *ref);
        concat_ref(cc->n, ts, d, cc->ndim, oshape, ref);
        zs_tensor *o = zs_concat(cc->n, ts, cc->dim);
        double err = zt_max_err(o, ref, numel);
        ZT_CHECK(o && o->ndim == cc->ndim && o->shape[d] == oshape[d] &&
                     err == 0, "concat case %zu %s: err %g (seed %llu)", ci,
                 zs_dtype_name(dt), err, (unsigned long long)seed);
        ZT_CHECK(!o || cc->n > 1 || zs_data(o) != zs_data(ts[0]),
                 "concat of one input is a copy");
        free(ref);
        zs_release(o);
        for (int i = 0; i < cc->n; i++)
            zs_release(ts[i]);
        seed += 3;
    }
}

/* Hundreds of inputs of varying width, alternately strided. */
static void test_concat_many(void)
{
    enum { N = 300 };
    zs_tensor *ts[N];
    int64_t width = 0;
    for (int i = 0; i < N; i++) {
        int64_t sh[2] = {5, 1 + i % 4};
        ts[i] = i % 2 ? zt_rand_strided(ZS_F32, 2, sh, 500 + i)
                      : zt_rand(ZS_F32, 2, sh, 500 + i);
        width += sh[1];
    }
    int64_t oshape[2] = {5, width};
    double *ref = malloc((size_t)(5 * width) * sizeof *ref);
    concat_ref(N, ts, 1, 2, oshape, ref);
    zs_tensor *o = zs_concat(N, ts, -1);
    double err = zt_max_err(o, ref, 5 * width);
    ZT_CHECK(o && err == 0, "concat of %d inputs: err %g", N, err);
    zs_release(o);
    /* and along dim 0, every input requiring grad */
    zs_tensor *rows[N];
    for (int i = 0; i < N; i++) {
        rows[i] = zt_rand(ZS_F64, ZS_SHAPE(3), 900 + i);
        zs_set_requires_grad(rows[i], true);
    }
    zs_tensor *c = zs_concat(N, rows, 0);
    zs_tensor *w = zs_arange(ZS_F64, 0, 3 * N, 1);
    zs_tensor *p = zs_mul(c, w);
    zs_tensor *s = zs_sum(p, 0, NULL, false);
    ZT_CHECK(s && zs_backward(s, NULL, false) == ZS_OK, "backward");
    int bad = 0;
    for (int i = 0; i < N; i++)
        for (int k = 0; k < 3; k++)
            bad += !zs_grad(rows[i]) || zs_get(zs_grad(rows[i]), k) != 3 * i + k;
    ZT_CHECK(bad == 0, "gradients of %d concat inputs: %d wrong", N, bad);
    zs_release(c);
    zs_release(w);
    zs_release(p);
    zs_release(s);
    ZT_CHECK(zs_autograd_live_nodes() == 0, "tape freed (%lld nodes live)",
             (long long)zs_autograd_live_nodes());
    for (int i = 0; i < N; i++) {
        zs_release(ts[i]);
        zs_release(rows[i]);
    }
    free(ref);
    zt_section("concat of 300 inputs (forward, backward)");
}

static void test_stack(zs_dtype dt)
{
    int dims[] = {0, 1, 2, -1, -2};
    for (size_t di = 0; di < sizeof dims / sizeof *dims; di++) {
        int dim = dims[di], d = dim < 0 ? dim + 3 : dim;
        zs_tensor *ts[3];
        for (int i = 0; i < 3; i++)
            ts[i] = i == 1 ? zt_rand_strided(dt, ZS_SHAPE(7, 13), 40 + i)
                           : zt_rand(dt, ZS_SHAPE(7, 13), 40 + i);
        zs_tensor *o = zs_stack(3, ts, dim);
        int64_t osh[3], c[3], ic[2];
        for (int k = 0, j = 0; k < 3; k++)
            osh[k] = k == d ? 3 : ts[0]->shape[j++];
        double *ref = malloc(3 * 7 * 13 * sizeof *ref);
        for (int64_t i = 0; i < 3 * 7 * 13; i++) {
            unravel(i, 3, osh, c);
            for (int k = 0, j = 0; k < 3; k++)
                if (k != d)
                    ic[j++] = c[k];
            ref[i] = zs_get(ts[c[d]], ravel(2, ts[0]->shape, ic));
        }
        double err = zt_max_err(o, ref, 3 * 7 * 13);
        ZT_CHECK(o && o->ndim == 3 && o->shape[d] == 3 && err == 0,
                 "stack dim %d %s: err %g", dim, zs_dtype_name(dt), err);
        free(ref);
        zs_release(o);
        for (int i = 0; i < 3; i++)
            zs_release(ts[i]);
    }
    zs_tensor *one = zt_rand(dt, ZS_SHAPE(4), 3);
    zs_tensor *s1 = zs_stack(1, &one, 0);
    ZT_CHECK(s1 && s1->ndim == 2 && s1->shape[0] == 1 &&
                 zs_get(s1, 3) == zs_get(one, 3), "stack of one");
    zs_release(s1);
    zs_release(one);
    zs_tensor *sc[3] = {zs_scalar(dt, 1), zs_scalar(dt, 2), zs_scalar(dt, 3)};
    zs_tensor *v = zs_stack(3, sc, -1);
    ZT_CHECK(v && v->ndim == 1 && v->shape[0] == 3 && zs_get(v, 2) == 3,
             "stack of 0-d tensors");
    zs_release(v);
    for (int i = 0; i < 3; i++)
        zs_release(sc[i]);
}

static void test_split_chunk(void)
{
    zs_tensor *x = zt_rand_strided(ZS_F32, ZS_SHAPE(5, 9), 7);
    zs_tensor *p[4];
    ZT_CHECK(zs_split(x, -1, 3, (int64_t[]){3, 0, 6}, p) == ZS_OK, "split");
    ZT_CHECK(p[0] && p[1] && p[2] && p[0]->shape[1] == 3 &&
                 p[1]->shape[1] == 0 && p[2]->shape[1] == 6 &&
                 p[2]->storage == x->storage, "split shapes, views");
    int bad = 0;
    for (int r = 0; r < 5; r++)
        for (int c = 0; c < 6; c++)
            bad += zs_get(p[2], r * 6 + c) != zs_get(x, r * 9 + 3 + c) ||
                   (c < 3 && zs_get(p[0], r * 3 + c) != zs_get(x, r * 9 + c));
    ZT_CHECK(bad == 0, "split values: %d wrong", bad);
    for (int i = 0; i < 3; i++)
        zs_release(p[i]);
    bad = 0; /* torch.chunk sizes */
    struct { int64_t size; int n, pieces; int64_t first, last; } cc[] = {
        {10, 3, 3, 4, 2}, {5, 4, 3, 2, 1}, {6, 4, 3, 2, 2}, {7, 1, 1, 7, 7},
        {3, 5, 3, 1, 1}, {0, 3, 3, 0, 0},
    };
    for (size_t i = 0; i < sizeof cc / sizeof *cc; i++) {
        zs_tensor *t = zt_rand(ZS_F32, ZS_SHAPE(2, cc[i].size), 11);
        zs_tensor *out[8] = {0};
        int k = zs_chunk(t, cc[i].n, 1, out);
        ZT_CHECK(k == cc[i].pieces && out[0] && out[k - 1] &&
                     out[0]->shape[1] == cc[i].first &&
                     out[k - 1]->shape[1] == cc[i].last,
                 "chunk size %lld into %d: got %d pieces",
                 (long long)cc[i].size, cc[i].n, k);
        int64_t start = 0;
        for (int j = 0; j < k; j++) {
            for (int64_t c = 0; c < out[j]->shape[1]; c++)
                bad += zs_get(out[j], out[j]->shape[1] + c) !=
                       zs_get(t, cc[i].size + start + c);
            start += out[j]->shape[1];
            zs_release(out[j]);
        }
        ZT_CHECK(start == cc[i].size && bad == 0, "chunk values");
        zs_release(t);
    }
    zs_release(x);
    zt_section("split and chunk (views, torch.chunk sizes)");
}

/* ---- gradients ---------------------------------------------------------- */

static zs_tensor *gc_concat(void *ctx, zs_tensor **in)
{
    int *dim = ctx;
    return zs_concat(3, in, *dim);
}

static zs_tensor *gc_stack(void *ctx, zs_tensor **in)
{
    zs_tensor *s = zs_stack(3, in, -2);
    zs_tensor *t = zs_mul(s, s); /* non-linear, so the routing matters */
    zs_release(s);
    return t;
}

/* x [5, 9] split {3, 2, 4} on dim -1: concat(p0 * p0, 2 * p2) [5, 7]. */
static zs_tensor *gc_split(void *ctx, zs_tensor **in)
{
    zs_tensor *p[3];
    if (zs_split(in[0], -1, 3, (int64_t[]){3, 2, 4}, p) != ZS_OK)
        return NULL;
    zs_tensor *a = zs_mul(p[0], p[0]), *b = zs_mul_scalar(p[2], 2.0);
    zs_tensor *o = zs_concat(2, (zs_tensor *[]){a, b}, 1);
    zs_release(a);
    zs_release(b);
    for (int i = 0; i < 3; i++)
        zs_release(p[i]);
    return o;
}

/* x [7, 4] chunked in 3 on dim 0 ([3, 4], [3, 4], [1, 4]): c0 * c1 + c2. */
static zs_tensor *gc_chunk(void *ctx, zs_tensor **in)
{
    zs_tensor *c[3];
    if (zs_chunk(in[0], 3, 0, c) != 3)
        return NULL;
    zs_tensor *m = zs_mul(c[0], c[1]);
    zs_tensor *o = zs_add(m, c[2]);
    zs_release(m);
    for (int i = 0; i < 3; i++)
        zs_release(c[i]);
    return o;
}

static void test_grad(void)
{
    /* concat of three, only inputs 0 and 2 require grad; input 0 strided */
    zs_tensor *in[3] = {zt_rand_strided(ZS_F64, ZS_SHAPE(4, 3), 1),
                        zt_rand(ZS_F64, ZS_SHAPE(4, 5), 2),
                        zt_rand(ZS_F64, ZS_SHAPE(4, 2), 3)};
    zs_set_requires_grad(in[0], true);
    zs_set_requires_grad(in[2], true);
    int dim = -1;
    ZT_GRADCHECK("concat (inputs 0, 2 require grad)", gc_concat, &dim, 3, in);
    ZT_CHECK(zs_grad(in[1]) == NULL, "input without grad gets none");
    for (int i = 0; i < 3; i++)
        zs_release(in[i]);
    zs_tensor *r[3] = {zt_rand(ZS_F64, ZS_SHAPE(2, 3, 4), 4),
                       zt_rand(ZS_F64, ZS_SHAPE(1, 3, 4), 5),
                       zt_rand_strided(ZS_F64, ZS_SHAPE(3, 3, 4), 6)};
    for (int i = 0; i < 3; i++)
        zs_set_requires_grad(r[i], true);
    dim = 0;
    ZT_GRADCHECK("concat dim 0, all require grad", gc_concat, &dim, 3, r);
    for (int i = 0; i < 3; i++)
        zs_release(r[i]);
    zs_tensor *s[3] = {zt_rand(ZS_F64, ZS_SHAPE(3, 5), 7),
                       zt_rand_strided(ZS_F64, ZS_SHAPE(3, 5), 8),
                       zt_rand(ZS_F64, ZS_SHAPE(3, 5), 9)};
    zs_set_requires_grad(s[0], true);
    zs_set_requires_grad(s[1], true);
    ZT_GRADCHECK("stack dim -2", gc_stack, NULL, 3, s);
    for (int i = 0; i < 3; i++)
        zs_release(s[i]);
    zs_tensor *x = zt_rand_strided(ZS_F64, ZS_SHAPE(5, 9), 10);
    zs_set_requires_grad(x, true);
    ZT_GRADCHECK("split pieces downstream", gc_split, NULL, 1, &x);
    zs_release(x);
    zs_tensor *y = zt_rand(ZS_F64, ZS_SHAPE(7, 4), 11);
    zs_set_requires_grad(y, true);
    ZT_GRADCHECK("chunk pieces downstream", gc_chunk, NULL, 1, &y);
    zs_release(y);
    ZT_CHECK(zs_autograd_live_nodes() == 0, "tape freed (%lld nodes live)",
             (long long)zs_autograd_live_nodes());
    zt_section("gradients (concat, stack, split, chunk)");
}

/* concat is the descriptor "concat": ZSI_MAX_IN inputs are one call (one
 * node with an input per tensor), ZSI_MAX_IN + 1 run in groups (a node
 * with two inputs) with the same values and gradients; a recorded call
 * replays bit-identically from its node's attributes; integer dtypes;
 * cost = inputs read + output written; an error in a grouped concat names
 * the input's index in the whole list. */
static void test_concat_descriptor(void)
{
    enum { N = ZSI_MAX_IN + 1 };
    zs_tensor *ts[N];
    for (int i = 0; i < N; i++) {
        ts[i] = zt_rand(ZS_F64, ZS_SHAPE(2, 1 + i % 3), 40 + i);
        zs_set_requires_grad(ts[i], true);
    }
    zs_tensor *one = zs_concat(ZSI_MAX_IN, ts, -1), *grp = zs_concat(N, ts, 1);
    int bad;
    const zsi_ctx *n1 = one ? zsi_ctx_of(one) : NULL, *n2 = grp ? zsi_ctx_of(grp) : NULL;
    ZT_CHECK(n1 && n2 && !strcmp(n1->op->name, "concat") && n1->nin == ZSI_MAX_IN &&
             !strcmp(n2->op->name, "concat") && n2->nin == 2,
             "%d inputs: one call; %d: two groups (node inputs %d, %d)", ZSI_MAX_IN,
             N, n1 ? n1->nin : -1, n2 ? n2->nin : -1);
    zs_tensor *head = grp && one ? zs_narrow(grp, 1, 0, one->shape[1]) : NULL;
    bad = !head;
    for (int64_t i = 0; head && i < zs_numel(one); i++)
        bad += zs_get(head, i) != zs_get(one, i);
    zs_release(head);
    ZT_CHECK(bad == 0, "grouped concat begins with the one-call concat");
    zs_tensor *r = NULL;
    if (n1) {
        zs_no_grad_push();
        r = zsi_run((zsi_opdef *)n1->op, ZSI_MAX_IN, ts, zsi_node_attrs(n1));
        zs_no_grad_pop();
    }
    ZT_CHECK(r && zs_same_shape(r, one) && !memcmp(zs_data(r), zs_data(one),
                                                     zs_nbytes(one)),
             "replay from the node's attributes");
    /* gradients through the groups: d sum(grp * k) / d ts[i] = its columns' k */
    zs_tensor *k = zs_arange(ZS_F64, 0, (double)zs_numel(grp), 1);
    zs_tensor *kr = k ? zs_reshape(k, 2, grp->shape) : NULL;
    zs_tensor *pr = kr ? zs_mul(grp, kr) : NULL;
    zs_tensor *s = pr ? zs_sum(pr, 0, NULL, false) : NULL;
    ZT_CHECK(s && zs_backward(s, NULL, false) == ZS_OK, "backward through groups");
    bad = 0;
    int64_t col = 0, W = grp ? grp->shape[1] : 0;
    for (int i = 0; i < N; i++) {
        const zs_tensor *g = zs_grad(ts[i]);
        int64_t w = ts[i]->shape[1];
        for (int64_t j = 0; j < 2 * w; j++)
            bad += !g || zs_get(g, j) != (double)((j / w) * W + col + j % w);
        col += w;
    }
    ZT_CHECK(bad == 0, "gradients of %d inputs through groups: %d wrong", N, bad);
    zs_tensor *rel[] = {one, grp, r, k, kr, pr, s};
    for (size_t i = 0; i < sizeof rel / sizeof *rel; i++)
        zs_release(rel[i]);
    /* integers, and the cost model */
    zs_tensor *ia = zs_arange(ZS_I32, 0, 6, 1), *ib = zs_arange(ZS_I32, 6, 10, 1);
    zs_profile_reset();
    zs_profile_enable(true);
    zs_tensor *ic = zs_concat(2, (zs_tensor *[]){ia, ib}, 0);
    zs_profile_enable(false);
    zs_op_stat st[64];
    int ns = zs_profile_stats(st, 64);
    double bytes = -1;
    for (int i = 0; i < ns; i++)
        if (!strcmp(st[i].name, "concat"))
            bytes = st[i].bytes;
    bad = !ic || ic->dtype != ZS_I32 || zs_numel(ic) != 10;
    for (int i = 0; !bad && i < 10; i++)
        bad += ((const int32_t *)zs_data(ic))[i] != i;
    ZT_CHECK(bad == 0 && bytes == 2 * 40.0, "i32 concat, cost %g bytes (want 80)",
             bytes);
    zs_release(ia);
    zs_release(ib);
    zs_release(ic);
    /* an error in the 2nd group names the input's index in the list */
    zs_tensor *keep = ts[ZSI_MAX_IN];
    ts[ZSI_MAX_IN] = zs_ones(ZS_F32, ZS_SHAPE(2, 1));
    char msg[96];
    snprintf(msg, sizeof msg, "concat: input %d has dtype f32, expected f64",
             ZSI_MAX_IN);
    ZT_EXPECT_ERROR(zs_concat(N, ts, 1) == NULL, msg);
    zs_release(ts[ZSI_MAX_IN]);
    ts[ZSI_MAX_IN] = keep;
    for (int i = 0; i < N; i++)
        zs_release(ts[i]);
    ZT_CHECK(zs_autograd_live_nodes() == 0, "tape freed");
    zt_section("concat: one call up to ZSI_MAX_IN inputs, groups above, replay, "
               "integers, cost");
}

static void test_errors(void)
{
    zs_tensor *a = zs_ones(ZS_F32, ZS_SHAPE(2, 3));
    zs_tensor *b = zs_ones(ZS_F32, ZS_SHAPE(2, 4));
    zs_tensor *c = zs_ones(ZS_F32, ZS_SHAPE(5, 3));
    zs_tensor *e = zs_ones(ZS_F64, ZS_SHAPE(2, 3));
    zs_tensor *v = zs_ones(ZS_F32, ZS_SHAPE(3));
    zs_tensor *z = zs_scalar(ZS_F32, 1);
    ZT_EXPECT_ERROR(zs_concat(3, (zs_tensor *[]){a, b, c}, 0) == NULL,
                    "concat: input 1 has shape [2, 4], input 0 has [2, 3]: "
                    "sizes differ in dim 1");
    ZT_EXPECT_ERROR(zs_concat(3, (zs_tensor *[]){a, c, b}, 1) == NULL,
                    "input 1 has shape [5, 3], input 0 has [2, 3]: sizes "
                    "differ in dim 0 (5 vs 2), expected equal except in dim 1");
    ZT_EXPECT_ERROR(zs_concat(2, (zs_tensor *[]){a, e}, 0) == NULL,
                    "concat: input 1 has dtype f64, expected f32");
    ZT_EXPECT_ERROR(zs_concat(2, (zs_tensor *[]){a, v}, 0) == NULL,
                    "input 1 has shape [3] (1 dims), expected 2 dims");
    ZT_EXPECT_ERROR(zs_concat(0, NULL, 0) == NULL, "0 inputs");
    ZT_EXPECT_ERROR(zs_concat(1, &z, 0) == NULL, "0-d");
    ZT_EXPECT_ERROR(zs_concat(2, (zs_tensor *[]){a, a}, 2) == NULL,
                    "concat: dim 2 out of range");
    zs_set_error("first");
    ZT_CHECK(zs_concat(2, (zs_tensor *[]){a, NULL}, 0) == NULL &&
                 !strcmp(zs_last_error(), "first"),
             "NULL input keeps the first error");
    ZT_EXPECT_ERROR(zs_stack(2, (zs_tensor *[]){a, b}, 0) == NULL,
                    "stack: input 1 is f32 [2, 4], expected f32 [2, 3]");
    ZT_EXPECT_ERROR(zs_stack(0, NULL, 0) == NULL, "stack: 0 inputs");
    ZT_EXPECT_ERROR(zs_stack(2, (zs_tensor *[]){a, a}, 3) == NULL,
                    "stack: dim 3 out of range");
    zs_tensor *p[3] = {0};
    ZT_EXPECT_ERROR(zs_split(a, 1, 2, (int64_t[]){1, 1}, p) < 0,
                    "split: sizes sum to 2, expected 3");
    ZT_CHECK(p[0] == NULL && p[1] == NULL, "failed split leaves out NULL");
    ZT_EXPECT_ERROR(zs_split(a, 1, 2, (int64_t[]){4, -1}, p) < 0,
                    "size -1 at position 1");
    ZT_EXPECT_ERROR(zs_split(a, -3, 1, (int64_t[]){3}, p) < 0,
                    "split: dim -3 out of range");
    ZT_EXPECT_ERROR(zs_chunk(a, 0, 0, p) < 0, "chunk: 0 chunks");
    ZT_EXPECT_ERROR(zs_chunk(z, 2, 0, p) < 0, "chunk: dim 0 out of range");
    zs_release(a);
    zs_release(b);
    zs_release(c);
    zs_release(e);
    zs_release(v);
    zs_release(z);
    zt_section("errors");
}

int main(void)
{
    test_concat_forward(ZS_F32);
    test_concat_forward(ZS_F64);
    zt_section("concat vs reference (odd sizes, negative dims, strided, n=1)");
    test_concat_many();
    test_stack(ZS_F32);
    test_stack(ZS_F64);
    zt_section("stack vs reference (every dim)");
    test_split_chunk();
    test_grad();
    test_concat_descriptor();
    test_errors();
    return zt_done();
}
