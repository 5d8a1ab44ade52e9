/*
 * test_tp.c - Megatron tensor parallelism (src/parallel/tp.c,
 * tp_layers.c) against the unsplit layers in float64: every rank builds
 * the same whole weights and inputs (fixed seeds), runs the full layer
 * itself as the reference, and runs its shard of the split layer; the
 * outputs and the gradients (shards gathered back with zs_tp_unshard)
 * must agree to 1e-12. Run plainly (one rank: every collective is the
 * identity) and by ctest under mpirun with 2 and 4 ranks, over the world
 * and, with 4 ranks, over the tp groups of a dp 2 x tp 2 grid.
 *
 * Covered: the mappings (gather/split, reduce-scatter), column-parallel
 * (gathered or split output), row-parallel (split or parallel input), the
 * MLP as column then row with and without sequence parallelism, the
 * vocabulary-parallel embedding (also sequence-parallel) and
 * cross-entropy (f64 to 1e-12, f32 to 1e-5, ignored targets, 3-D
 * logits), shard/unshard of fused (3-block) weights, dropout seeds, and
 * the error paths.
 */
#include <stdlib.h>

#include "testutil.h"

static int R, P;          /* rank and size of the tp group under test */
static const char *where; /* "world" or "grid tp" */

#define TOL 1e-12

/* max |got - ref| / max(1, |ref|), with equal shapes. */
static double diff(const zs_tensor *got, const zs_tensor *ref)
{
    if (!got || !ref || !zs_same_shape(got, ref))
        return 1e300;
    double *rv = zt_values(ref);
    double e = zt_max_err(got, rv, zs_numel(ref));
    free(rv);
    return e;
}

static zs_tensor *leaf(zs_tensor *t)
{
    zs_set_requires_grad(t, true);
    return t;
}

/* A new leaf requiring grad with t's values. */
static zs_tensor *leaf_copy(zs_tensor *t)
{
    return leaf(zs_contiguous(zs_clone(zs_detach(t))));
}

static zs_tensor *rnd(int ndim, const int64_t *shape, uint64_t seed)
{
    return zt_rand(ZS_F64, ndim, shape, seed);
}

/* sum(y * r) as the loss. */
static zs_tensor *dot(zs_tensor *y, zs_tensor *r)
{
    return zs_sum(zs_mul(y, r), 0, NULL, false);
}

/* Gradient of a shard, gathered along dim, against the full gradient. */
static void check_grad(const char *what, zs_comm *T, zs_tensor *shard, int dim, int blocks,
                       zs_tensor *full)
{
    zs_tensor *g = zs_tp_unshard(T, zs_grad(shard), dim, blocks);
    double e = diff(g, zs_grad(full));
    ZT_CHECK(e < TOL, "%s (%s, rank %d/%d): gathered gradient off by %g", what, where, R,
             P, e);
}

/* ---- mappings ----------------------------------------------------------- */

static void test_mappings(zs_comm *T)
{
    zs_scope_push();
    zs_tensor *x = rnd(3, (int64_t[]){3, 2 * P, 5}, 11);
    /* split then gather along every dim divisible by P */
    zs_tensor *s1 = zs_tp_split(T, x, 1);
    zs_tensor *g1 = zs_tp_gather(T, s1, 1);
    ZT_CHECK(diff(g1, x) == 0, "gather(split(x, 1), 1) == x (%s)", where);
    ZT_CHECK(diff(s1, zs_tp_shard(x, 1, 1, R, P)) == 0, "split is this rank's shard");
    zs_tensor *y = rnd(3, (int64_t[]){P, 3, 4}, 12);
    zs_tensor *g0 = zs_tp_gather(T, zs_tp_split(T, y, 0), 0);
    zs_tensor *g2 = zs_tp_gather(T, zs_tp_split(T, rnd(2, (int64_t[]){3, 3 * P}, 13), -1), -1);
    ZT_CHECK(diff(g0, y) == 0 && g2 && g2->shape[1] == 3 * P, "gather/split dims 0, -1");
    /* reduce-scatter of replicated x = P x this rank's chunk */
    zs_tensor *rs = zs_sp_reduce_scatter(T, x, 1);
    zs_tensor *want = zs_mul_scalar(zs_tp_shard(x, 1, 1, R, P), (double)P);
    ZT_CHECK(diff(rs, want) < TOL, "reduce-scatter of a replicated tensor");
    zs_tensor *ar = zs_tp_reduce(T, x);
    ZT_CHECK(diff(ar, zs_mul_scalar(x, (double)P)) < TOL, "all-reduce of a replicated tensor");
    /* backward of tp_copy sums the ranks' gradients */
    zs_tensor *xl = leaf_copy(x);
    zs_backward(dot(zs_tp_copy(T, xl), zs_full(ZS_F64, 3, x->shape, R + 1.0)), NULL, false);
    ZT_CHECK(zs_grad(xl) && fabs(zs_get(zs_grad(xl), 0) - P * (P + 1) / 2.0) < TOL,
             "tp_copy backward: sum of 1..P");
    /* strided input */
    zs_tensor *xt = zs_transpose(rnd(3, (int64_t[]){5, 2 * P, 3}, 14), 0, 2);
    ZT_CHECK(diff(zs_tp_gather(T, zs_tp_split(T, xt, 1), 1), xt) == 0, "strided input");
    zs_scope_pop();
    zt_section("mappings: gather, split, reduce-scatter, all-reduce, copy");
}

/* ---- linear layers ------------------------------------------------------ */

static void test_column(zs_comm *T, bool gather)
{
    zs_scope_push();
    int64_t N = 3 * P, K = 7;
    zs_tensor *W = leaf(rnd(2, (int64_t[]){N, K}, 21)), *b = leaf(rnd(1, &N, 22));
    zs_tensor *x = leaf(rnd(3, (int64_t[]){2, 5, K}, 23));
    zs_tensor *Rr = rnd(3, (int64_t[]){2, 5, N}, 24);
    zs_tensor *y = zs_linear(x, W, b);
    zs_backward(dot(y, Rr), NULL, false);

    zs_tensor *Ws = leaf(zs_tp_shard(W, 0, 1, R, P)), *bs = leaf(zs_tp_shard(b, 0, 1, R, P));
    zs_tensor *xs = leaf_copy(x);
    zs_tensor *ys = zs_tp_column_linear(T, xs, Ws, bs, gather, -1);
    zs_tensor *yref = gather ? y : zs_tp_shard(y, -1, 1, R, P);
    double e = diff(ys, yref);
    ZT_CHECK(e < TOL, "column linear output (gather %d) off by %g", gather, e);
    zs_backward(dot(ys, gather ? Rr : zs_tp_shard(Rr, -1, 1, R, P)), NULL, false);
    check_grad("column dW", T, Ws, 0, 1, W);
    check_grad("column db", T, bs, 0, 1, b);
    e = diff(zs_grad(xs), zs_grad(x));
    ZT_CHECK(e < TOL, "column dx (all-reduced) off by %g", e);
    zs_scope_pop();
    zt_section(gather ? "column-parallel linear, gathered output"
                      : "column-parallel linear, split output");
}

static void test_row(zs_comm *T, bool parallel_in)
{
    zs_scope_push();
    int64_t N = 7, K = 3 * P;
    zs_tensor *W = leaf(rnd(2, (int64_t[]){N, K}, 31)), *b = leaf(rnd(1, &N, 32));
    zs_tensor *x = leaf(rnd(3, (int64_t[]){2, 5, K}, 33));
    zs_tensor *Rr = rnd(3, (int64_t[]){2, 5, N}, 34);
    zs_tensor *y = zs_linear(x, W, b);
    zs_backward(dot(y, Rr), NULL, false);

    zs_tensor *Ws = leaf(zs_tp_shard(W, 1, 1, R, P)), *bs = leaf_copy(b);
    zs_tensor *xs = parallel_in ? leaf(zs_tp_shard(x, -1, 1, R, P)) : leaf_copy(x);
    zs_tensor *ys = zs_tp_row_linear(T, xs, Ws, bs, parallel_in, -1);
    double e = diff(ys, y);
    ZT_CHECK(e < TOL, "row linear output off by %g", e);
    zs_backward(dot(ys, Rr), NULL, false);
    check_grad("row dW", T, Ws, 1, 1, W);
    e = diff(zs_grad(bs), zs_grad(b));
    ZT_CHECK(e < TOL, "row db (bias added once) off by %g", e);
    zs_tensor *gx = parallel_in ? zs_tp_unshard(T, zs_grad(xs), -1, 1) : zs_grad(xs);
    e = diff(gx, zs_grad(x));
    ZT_CHECK(e < TOL, "row dx off by %g", e);
    zs_scope_pop();
    zt_section(parallel_in ? "row-parallel linear, parallel input"
                           : "row-parallel linear, split input");
}

/* The MLP as column then row: x [2, S, C] -> gelu(x W1^T + b1) W2^T + b2;
 * with sp the sequence dim (1) is sharded outside the MLP. */
static void test_mlp(zs_comm *T, bool sp)
{
    zs_scope_push();
    int64_t C = 5, H = 4 * P, S = 3 * P;
    zs_tensor *W1 = leaf(rnd(2, (int64_t[]){H, C}, 41)), *b1 = leaf(rnd(1, &H, 42));
    zs_tensor *W2 = leaf(rnd(2, (int64_t[]){C, H}, 43)), *b2 = leaf(rnd(1, &C, 44));
    zs_tensor *x = leaf(rnd(3, (int64_t[]){2, S, C}, 45));
    zs_tensor *Rr = rnd(3, (int64_t[]){2, S, C}, 46);
    zs_tensor *z = zs_linear(zs_gelu(zs_linear(x, W1, b1), ZS_GELU_TANH), W2, b2);
    zs_backward(dot(z, Rr), NULL, false);

    zs_tensor *W1s = leaf(zs_tp_shard(W1, 0, 1, R, P)), *b1s = leaf(zs_tp_shard(b1, 0, 1, R, P));
    zs_tensor *W2s = leaf(zs_tp_shard(W2, 1, 1, R, P)), *b2s = leaf_copy(b2);
    int sd = sp ? 1 : -1;
    zs_tensor *xs = sp ? leaf(zs_tp_shard(x, 1, 1, R, P)) : leaf_copy(x);
    zs_tensor *h = zs_tp_column_linear(T, xs, W1s, b1s, false, sd);
    zs_tensor *zs_ = zs_tp_row_linear(T, zs_gelu(h, ZS_GELU_TANH), W2s, b2s, true, sd);
    zs_tensor *zref = sp ? zs_tp_shard(z, 1, 1, R, P) : z;
    double e = diff(zs_, zref);
    ZT_CHECK(e < TOL, "MLP (sp %d) output off by %g", sp, e);
    zs_backward(dot(zs_, sp ? zs_tp_shard(Rr, 1, 1, R, P) : Rr), NULL, false);
    if (sp)
        ZT_CHECK(zs_tp_allreduce_grads(T, 1, &b2s) == ZS_OK, "allreduce_grads");
    check_grad("mlp dW1", T, W1s, 0, 1, W1);
    check_grad("mlp db1", T, b1s, 0, 1, b1);
    check_grad("mlp dW2", T, W2s, 1, 1, W2);
    e = diff(zs_grad(b2s), zs_grad(b2));
    ZT_CHECK(e < TOL, "mlp db2 off by %g", e);
    zs_tensor *gx = sp ? zs_tp_unshard(T, zs_grad(xs), 1, 1) : zs_grad(xs);
    e = diff(gx, zs_grad(x));
    ZT_CHECK(e < TOL, "mlp dx off by %g", e);
    zs_scope_pop();
    zt_section(sp ? "MLP column then row, sequence parallel" : "MLP column then row");
}

/* ---- vocabulary-parallel embedding and cross-entropy -------------------- */

static zs_tensor *ids(int ndim, const int64_t *shape, int64_t V, uint64_t seed, bool ignore)
{
    zs_tensor *t = zs_empty(ZS_I64, ndim, shape);
    int64_t *d = zs_data(t);
    zt_irand_seed(seed);
    for (int64_t i = 0; i < zs_numel(t); i++)
        d[i] = ignore && i % 4 == 1 ? -1 : zt_irand(0, V - 1);
    if (zs_numel(t) > 2) { /* the vocabulary's ends */
        d[0] = 0;
        d[2] = V - 1;
    }
    return t;
}

static void test_embedding(zs_comm *T, bool sp)
{
    zs_scope_push();
    int64_t V = 5 * P, D = 3;
    zs_tensor *W = leaf(rnd(2, (int64_t[]){V, D}, 51));
    zs_tensor *idx = ids(2, (int64_t[]){3, 4}, V, 52, false);
    zs_tensor *Rr = rnd(3, (int64_t[]){3, 4, D}, 53);
    zs_tensor *e = zs_embedding(W, idx);
    zs_backward(dot(e, Rr), NULL, false);

    zs_tensor *Ws = leaf(zs_tp_shard(W, 0, 1, R, P));
    zs_tensor *es = zs_tp_vocab_embedding(T, Ws, idx, sp ? 1 : -1);
    double err = diff(es, sp ? zs_tp_shard(e, 1, 1, R, P) : e);
    ZT_CHECK(err < TOL, "vocab embedding (sp %d) output off by %g", sp, err);
    zs_backward(dot(es, sp ? zs_tp_shard(Rr, 1, 1, R, P) : Rr), NULL, false);
    check_grad("embedding dW", T, Ws, 0, 1, W);
    zs_scope_pop();
    zt_section(sp ? "vocabulary-parallel embedding, sequence parallel"
                  : "vocabulary-parallel embedding");
}

static void test_ce(zs_comm *T, zs_dtype dt, int ndim, bool ignore)
{
    zs_scope_push();
    int64_t V = 5 * P;
    int64_t lsh[3] = {7, V}, tsh[2] = {7};
    if (ndim == 3) {
        lsh[0] = 2, lsh[1] = 3, lsh[2] = V;
        tsh[0] = 2, tsh[1] = 3;
    }
    zs_tensor *Lg = leaf(zs_mul_scalar(zt_rand(dt, ndim, lsh, 61), 4.0));
    zs_tensor *tg = ids(ndim - 1, tsh, V, 62, ignore);
    zs_tensor *ref = zs_cross_entropy(Lg, tg, -1);
    zs_backward(ref, NULL, false);

    zs_tensor *Ls = leaf(zs_tp_shard(Lg, -1, 1, R, P));
    zs_tensor *loss = zs_tp_vocab_cross_entropy(T, Ls, tg, -1);
    double tol = dt == ZS_F64 ? TOL : 1e-5;
    double err = loss ? fabs(zs_item(loss) - zs_item(ref)) / fmax(1, fabs(zs_item(ref))) : 1e300;
    ZT_CHECK(loss && loss->ndim == 0 && err < tol, "vocab CE %s: loss off by %g",
             zs_dtype_name(dt), err);
    zs_backward(loss, NULL, false);
    zs_tensor *g = zs_tp_unshard(T, zs_grad(Ls), -1, 1);
    err = diff(g, zs_grad(Lg));
    ZT_CHECK(err < tol, "vocab CE %s: gathered gradient off by %g", zs_dtype_name(dt), err);
    zs_scope_pop();
    char name[128];
    snprintf(name, sizeof name, "vocabulary-parallel cross-entropy %s, %d-D logits%s",
             zs_dtype_name(dt), ndim, ignore ? ", ignored targets" : "");
    zt_section(name);
}

static void test_ce_all_ignored(zs_comm *T)
{
    zs_scope_push();
    zs_tensor *Ls = leaf(rnd(2, (int64_t[]){3, 4}, 63));
    zs_tensor *tg = zs_full(ZS_I64, 1, (int64_t[]){3}, -1);
    zs_tensor *loss = zs_tp_vocab_cross_entropy(T, Ls, tg, -1);
    ZT_CHECK(loss && zs_item(loss) == 0, "all targets ignored: loss 0");
    ZT_CHECK(zs_backward(loss, NULL, false) == ZS_OK && zs_grad(Ls) &&
                 zs_get(zs_grad(Ls), 0) == 0, "all ignored: zero gradient");
    zs_scope_pop();
    zt_section("vocabulary-parallel cross-entropy, every target ignored");
}

/* ---- the test device ---------------------------------------------------- */

/* A copy of t on device dev as a leaf requiring grad. */
static zs_tensor *leaf_on(zs_tensor *t, int dev)
{
    return leaf(zs_to_device(t, dev));
}

/* The sequence-parallel MLP, the vocabulary embedding and cross-entropy
 * on device dev: the loss and gradients (on the CPU, in g[]). */
static double step_on(zs_comm *T, int dev, zs_tensor **g)
{
    int64_t C = 5, H = 4 * P, S = 3 * P, V = 5 * P;
    zs_tensor *W1 = leaf_on(zs_tp_shard(rnd(2, (int64_t[]){H, C}, 91), 0, 1, R, P), dev);
    zs_tensor *W2 = leaf_on(zs_tp_shard(rnd(2, (int64_t[]){C, H}, 92), 1, 1, R, P), dev);
    zs_tensor *E = leaf_on(zs_tp_shard(rnd(2, (int64_t[]){V, C}, 93), 0, 1, R, P), dev);
    zs_tensor *U = leaf_on(zs_tp_shard(rnd(2, (int64_t[]){V, C}, 94), 0, 1, R, P), dev);
    zs_tensor *idx = ids(2, (int64_t[]){2, S}, V, 95, false);
    zs_tensor *tg = ids(2, (int64_t[]){2, S}, V, 96, true);
    zs_tensor *x = zs_tp_vocab_embedding(T, E, idx, 1);             /* [2, S/P, C] */
    zs_tensor *h = zs_tp_column_linear(T, x, W1, NULL, false, 1);   /* [2, S, H/P] */
    zs_tensor *y = zs_tp_row_linear(T, zs_gelu(h, ZS_GELU_TANH), W2, NULL, true, 1);
    zs_tensor *lg = zs_tp_column_linear(T, y, U, NULL, false, 1);   /* [2, S, V/P] */
    zs_tensor *loss = zs_tp_vocab_cross_entropy(T, lg, tg, -1);
    double v = loss ? zs_item(zs_to_device(loss, ZS_CPU)) : NAN;
    zs_backward(loss, NULL, false);
    zs_tensor *ps[4] = {W1, W2, E, U};
    for (int i = 0; i < 4; i++)
        g[i] = zs_grad(ps[i]) ? zs_to_device(zs_grad(ps[i]), ZS_CPU) : NULL;
    return v;
}

static void test_device(zs_comm *T)
{
    if (zs_test_device_enable() != ZS_OK) {
        ZT_CHECK(false, "test device");
        return;
    }
    zs_scope_push();
    zs_tensor *gc[4], *gd[4];
    double lc = step_on(T, ZS_CPU, gc), ld = step_on(T, ZS_TEST_DEVICE, gd);
    ZT_CHECK(lc == ld && isfinite(lc), "loss on the test device %.17g, CPU %.17g", ld, lc);
    for (int i = 0; i < 4; i++)
        ZT_CHECK(diff(gd[i], gc[i]) == 0, "gradient %d: test device == CPU", i);
    ZT_CHECK(zs_test_device_calls("tp_allgather") > 0 &&
                 zs_test_device_calls("tp_reduce_scatter") > 0,
             "the collectives' kernels ran on the test device");
    zs_scope_pop();
    zt_section("embedding, sequence-parallel MLP, head and vocab CE on the test device");
}

/* ---- shards, seeds, errors ---------------------------------------------- */

static void test_shards(zs_comm *T)
{
    zs_scope_push();
    /* fused QKV: [3 C, C], 3 blocks, each split by rows */
    int64_t C = 2 * P;
    zs_tensor *W = rnd(2, (int64_t[]){3 * C, 5}, 71);
    zs_tensor *s = zs_tp_shard(W, 0, 3, R, P);
    ZT_CHECK(s && s->shape[0] == 3 * C / P, "QKV shard shape");
    bool ok = s != NULL;
    for (int k = 0; ok && k < 3; k++)
        for (int64_t j = 0; j < C / P; j++)
            for (int64_t i = 0; i < 5; i++)
                ok = ok && zs_get(s, (k * (C / P) + j) * 5 + i) ==
                               zs_get(W, (k * C + R * (C / P) + j) * 5 + i);
    ZT_CHECK(ok, "QKV shard: rank %d's rows of q, k and v", R);
    ZT_CHECK(diff(zs_tp_unshard(T, s, 0, 3), W) == 0, "QKV unshard gives the whole");
    zs_tensor *W3 = rnd(3, (int64_t[]){2, 4 * P, 3}, 72);
    ZT_CHECK(diff(zs_tp_unshard(T, zs_tp_shard(W3, 1, 2, R, P), 1, 2), W3) == 0,
             "2-block unshard(shard) along a middle dim");
    ZT_CHECK(zs_tp_dropout_seed(7, R, false) == 7, "replicated seed the same everywhere");
    ZT_CHECK(zs_tp_dropout_seed(7, 0, true) != zs_tp_dropout_seed(7, 1, true) &&
                 zs_tp_dropout_seed(7, 1, true) == 7 + 2718 + 1,
             "split seeds differ per tp rank (Megatron's seed + 2718 + rank)");
    zs_scope_pop();
    zt_section("shard/unshard (fused blocks), dropout seeds");
}

static void test_errors(zs_comm *T)
{
    zs_scope_push();
    zs_tensor *x = rnd(2, (int64_t[]){3, 5}, 81);
    ZT_EXPECT_ERROR(zs_tp_copy(NULL, x) == NULL, "NULL communicator");
    ZT_EXPECT_ERROR(zs_tp_reduce(T, zs_zeros(ZS_I64, 1, (int64_t[]){3})) == NULL, "tp_allreduce");
    ZT_EXPECT_ERROR(zs_tp_gather(T, x, 2) == NULL, "gather");
    if (P > 1)
        ZT_EXPECT_ERROR(zs_tp_split(T, rnd(1, (int64_t[]){2 * P + 1}, 82), 0) == NULL,
                        "does not divide");
    ZT_EXPECT_ERROR(zs_tp_column_linear(T, x, rnd(2, (int64_t[]){2, 5}, 83), NULL, true, 1) == NULL,
                    "gather_output with sequence parallelism");
    zs_tensor *Ls = rnd(2, (int64_t[]){3, 4}, 84);
    zs_tensor *bad = zs_full(ZS_I64, 1, (int64_t[]){3}, 4.0 * P);
    ZT_EXPECT_ERROR(zs_tp_vocab_cross_entropy(T, Ls, bad, -1) == NULL, "outside the vocabulary");
    ZT_EXPECT_ERROR(zs_tp_vocab_cross_entropy(T, Ls, zs_zeros(ZS_I64, 1, (int64_t[]){4}), -1) == NULL,
                    "one target per row");
    ZT_EXPECT_ERROR(zs_tp_vocab_cross_entropy(T, Ls, zs_zeros(ZS_F64, 1, (int64_t[]){3}), -1) == NULL,
                    "i32 or i64");
    ZT_EXPECT_ERROR(zs_tp_vocab_embedding(T, Ls, bad, -1) == NULL, "outside the vocabulary");
    ZT_EXPECT_ERROR(zs_tp_vocab_embedding(T, rnd(1, (int64_t[]){4}, 85), bad, -1) == NULL,
                    "expected a float [V/P, D]");
    ZT_EXPECT_ERROR(zs_tp_shard(x, 1, 2, 0, 2) == NULL, "does not split into 2 blocks x 2 ranks");
    ZT_EXPECT_ERROR(zs_tp_shard(x, 0, 1, 3, 3) == NULL, "rank 3 of 3");
    ZT_EXPECT_ERROR(zs_tp_shard(x, 4, 1, 0, 1) == NULL, "dim");
    zs_scope_pop();
    zt_section("errors: communicator, dtypes, shapes, ids, shards");
}

static void run_all(zs_comm *T, const char *label)
{
    R = zs_comm_rank(T);
    P = zs_comm_size(T);
    where = label;
    printf("-- tp over %s: rank %d of %d\n", label, R, P);
    test_mappings(T);
    test_column(T, true);
    test_column(T, false);
    test_row(T, false);
    test_row(T, true);
    test_mlp(T, false);
    test_mlp(T, true);
    test_embedding(T, false);
    test_embedding(T, true);
    test_ce(T, ZS_F64, 2, false);
    test_ce(T, ZS_F64, 2, true);
    test_ce(T, ZS_F64, 3, true);
    test_ce(T, ZS_F32, 2, true);
    test_ce_all_ignored(T);
    test_device(T);
    test_shards(T);
    test_errors(T);
}

int main(int argc, char **argv)
{
    int rank, size;
    zt_dist_start(&argc, &argv, &rank, &size);
    zs_comm *world = zs_comm_world();
    zs_comm_set_timeout(world, 120);
    int64_t live = zt_live_bytes();
    run_all(world, "world");
    if (size % 2 == 0 && size > 2) {
        zs_grid *g = zs_grid_new(world, 0, 2, 1);
        ZT_CHECK(g && zs_comm_size(g->tp) == 2, "grid tp 2");
        if (g)
            run_all(g->tp, "grid tp");
        zs_grid_free(g);
    }
    ZT_CHECK(zt_live_bytes() == live, "no tensor leaked (%lld bytes live, %lld before)",
             (long long)zt_live_bytes(), (long long)live);
    return zt_dist_done();
}
