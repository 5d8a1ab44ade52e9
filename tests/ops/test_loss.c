/*
 * test_loss.c - zs_cross_entropy and zs_mse_loss against float64
 * references: class counts 1, 7, 1000 and 50257, [N, C] and [..., C]
 * logits with i32 and i64 targets (matching or flattened), ignore_index
 * (some and all rows ignored), strided logits, f32 and f64; the fused
 * cross-entropy backward against (softmax - onehot) / count, also run
 * directly as the descriptor cross_entropy_backward (strided inputs, a
 * count of 0, its errors); mse on odd
 * and >1M sizes; gradient checks in f64; error paths (target shape and
 * dtype, class index out of range, mse shape mismatch). Under autocast,
 * bf16/f16 logits (strided, an ignored row, 1031 classes): the loss in
 * f32, the logits saved in their own dtype (no f32 copy), their gradient
 * in their dtype, bit-identical to the f32-copy path it replaces (loss and
 * gradient) and within the format's rounding of float64.
 *
 * Tolerances (relative to max(1, |ref|)): f32 losses are means of
 * log-sum-exp terms computed with a ~2 ulp exp and double sums: 1e-5;
 * gradients 1e-6 (entries <= 1/count); f64 1e-12.
 */
#include <stdlib.h>

#include "autograd/node.h"
#include "ops/op.h"
#include "testutil.h"

#define IGNORE (-100)

static double tol_of(zs_dtype dt) { return dt == ZS_F32 ? 1e-5 : 1e-12; }

/* Mean cross entropy of logits v [N, C] and targets t; fills the gradient
 * ref (softmax - onehot) / count when gx != NULL. */
static double ce_ref(const double *v, const int64_t *t, int64_t N, int64_t C,
                     int64_t ignore, double *gx)
{
    double total = 0;
    int64_t count = 0;
    for (int64_t i = 0; i < N; i++)
        count += t[i] != ignore;
    for (int64_t i = 0; i < N; i++) {
        const double *x = v + i * C;
        double m = -INFINITY, s = 0;
        for (int64_t j = 0; j < C; j++)
            m = fmax(m, x[j]);
        for (int64_t j = 0; j < C; j++)
            s += exp(x[j] - m);
        double lse = m + log(s);
        if (t[i] != ignore)
            total += lse - x[t[i]];
        for (int64_t j = 0; gx && j < C; j++)
            gx[i * C + j] = t[i] == ignore ? 0
                            : (exp(x[j] - lse) - (j == t[i])) / (double)count;
    }
    return count ? total / (double)count : 0;
}

/* Targets in [0, C), every fourth ignored when with_ignore. */
static zs_tensor *make_targets(zs_dtype dt, int nd, const int64_t *shape,
                               int64_t C, bool with_ignore, uint64_t seed,
                               int64_t *vals)
{
    zs_tensor *t = zs_empty(dt, nd, shape);
    int64_t n = zs_numel(t);
    uint64_t s = seed * 2654435761u + 1;
    for (int64_t i = 0; i < n; i++) {
        s = s * 6364136223846793005u + 1442695040888963407u;
        vals[i] = (int64_t)((s >> 33) % (uint64_t)C);
        if (with_ignore && i % 4 == 1)
            vals[i] = IGNORE;
        if (dt == ZS_I64)
            ((int64_t *)zs_data(t))[i] = vals[i];
        else
            ((int32_t *)zs_data(t))[i] = (int32_t)vals[i];
    }
    return t;
}

typedef struct ce_case {
    int nd;
    int64_t shape[3]; /* logits; the last is C */
    bool flat_target;
    bool with_ignore;
} ce_case;

static void check_ce(zs_dtype dt, zs_dtype tdt, const ce_case *c, bool strided,
                     uint64_t seed)
{
    int64_t C = c->shape[c->nd - 1], N = 1;
    for (int d = 0; d < c->nd - 1; d++)
        N *= c->shape[d];
    zs_tensor *x = strided ? zt_rand_strided(dt, c->nd, c->shape, seed)
                           : zt_rand(dt, c->nd, c->shape, seed);
    zs_set_requires_grad(x, true);
    int64_t *tv = malloc((size_t)N * sizeof *tv);
    zs_tensor *t = c->flat_target
                       ? make_targets(tdt, 1, &N, C, c->with_ignore, seed, tv)
                       : make_targets(tdt, c->nd - 1, c->shape, C,
                                      c->with_ignore, seed, tv);
    double *v = zt_values(x), *gref = malloc((size_t)(N * C) * sizeof *gref);
    double ref = ce_ref(v, tv, N, C, IGNORE, gref);
    zs_tensor *loss = zs_cross_entropy(x, t, IGNORE);
    double err = loss ? fabs(zs_item(loss) - ref) / fmax(1, fabs(ref))
                      : INFINITY;
    ZT_CHECK(loss && loss->ndim == 0 && err <= tol_of(dt),
             "cross_entropy %s %s C %lld N %lld%s: err %g (seed %llu)",
             zs_dtype_name(dt), zs_dtype_name(tdt), (long long)C,
             (long long)N, strided ? " strided" : "", err,
             (unsigned long long)seed);
    if (loss && zs_backward(loss, NULL, false) == ZS_OK) {
        double gerr = zt_max_err(zs_grad(x), gref, N * C);
        ZT_CHECK(gerr <= (dt == ZS_F32 ? 1e-6 : 1e-12),
                 "cross_entropy backward %s C %lld: err %g",
                 zs_dtype_name(dt), (long long)C, gerr);
    } else {
        ZT_CHECK(false, "cross_entropy backward C %lld", (long long)C);
    }
    free(v);
    free(gref);
    free(tv);
    zs_release(loss);
    zs_release(t);
    zs_release(x);
}

static void test_cross_entropy(void)
{
    static const ce_case cases[] = {
        {2, {5, 7}, false, false},     {2, {6, 1}, false, false},
        {2, {9, 1000}, false, true},   {2, {4, 50257}, false, true},
        {3, {2, 3, 7}, false, true},   {3, {2, 3, 7}, true, false},
        {1, {11}, false, false},       {2, {300, 13}, true, true},
    };
    uint64_t seed = 1;
    for (int dti = 0; dti < 2; dti++)
        for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
            for (int k = 0; k < 2; k++)
                check_ce(dti ? ZS_F64 : ZS_F32, k ? ZS_I64 : ZS_I32, &cases[i],
                         k == 1, seed++);
    zt_section("cross_entropy forward and fused backward vs float64");
}

/* The layout of cross_entropy_attrs (src/ops/attrs.h). */
typedef struct ce_attrs {
    int64_t ignore_index;
    bool f32_loss;
} ce_attrs;

/* cross_entropy_backward called directly, as a backward rule on any
 * device does: strided f64 logits [N, C] (made contiguous by the kernel),
 * i32 targets with ignored rows, lse from float64, g = 0.7. */
static void test_ce_descriptor(void)
{
    zsi_opdef *def = zsi_opdef_find("cross_entropy_backward");
    zsi_opdef *fw = zsi_opdef_find("cross_entropy");
    ZT_CHECK(def && fw && fw->bw_ops && fw->bw_ops[0] == def && !fw->bw_ops[1] &&
                 !def->op.backward, "cross_entropy's bw_ops");
    if (!def)
        return;
    int64_t N = 13, C = 9, tv[13];
    zs_tensor *x = zt_rand_strided(ZS_F64, ZS_SHAPE(N, C), 5);
    zs_tensor *t = make_targets(ZS_I32, 1, &N, C, true, 6, tv);
    double *v = zt_values(x), *gref = malloc((size_t)(N * C) * sizeof *gref);
    ce_ref(v, tv, N, C, IGNORE, gref);
    zs_tensor *lse = zs_empty(ZS_F64, ZS_SHAPE(N));
    int64_t count = 0;
    for (int64_t i = 0; i < N; i++) {
        double m = -INFINITY, s = 0;
        for (int64_t j = 0; j < C; j++)
            m = fmax(m, v[i * C + j]);
        for (int64_t j = 0; j < C; j++)
            s += exp(v[i * C + j] - m);
        ((double *)zs_data(lse))[i] = m + log(s);
        count += tv[i] != IGNORE;
    }
    for (int64_t i = 0; i < N * C; i++)
        gref[i] *= 0.7;
    zs_tensor *cnt = zs_full(ZS_I64, 0, NULL, (double)count);
    zs_tensor *zero = zs_full(ZS_I64, 0, NULL, 0);
    zs_tensor *g = zs_full(ZS_F64, 0, NULL, 0.7);
    ce_attrs at = {IGNORE, false};
    zs_tensor *gx = zsi_run(def, 5, (zs_tensor *[]){x, t, lse, cnt, g}, &at);
    double err = gx ? zt_max_err(gx, gref, N * C) : 1;
    ZT_CHECK(gx && zs_same_shape(gx, x) && err <= 1e-12,
             "strided logits: err %g", err);
    zs_tensor *g0 = zsi_run(def, 5, (zs_tensor *[]){x, t, lse, zero, g}, &at);
    bool zeros = g0 != NULL;
    for (int64_t i = 0; zeros && i < N * C; i++)
        zeros = zs_get(g0, i) == 0;
    ZT_CHECK(zeros, "count 0: gx = 0");
    zs_tensor *l32 = zs_to_dtype(lse, ZS_F32);
    ZT_EXPECT_ERROR(!zsi_run(def, 5, (zs_tensor *[]){x, t, l32, cnt, g}, &at),
                    "expected 13 targets, 13 f64 lse values");
    ZT_EXPECT_ERROR(!zsi_run(def, 5, (zs_tensor *[]){x, lse, lse, cnt, g}, &at),
                    "cross_entropy_backward");
    ZT_EXPECT_ERROR(!zsi_run(def, 4, (zs_tensor *[]){x, t, lse, cnt}, &at),
                    "4 inputs, expected 5");
    free(v);
    free(gref);
    zs_tensor *all[] = {x, t, lse, cnt, zero, g, gx, g0, l32};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        zs_release(all[i]);
    zt_section("cross_entropy_backward run directly: strided logits, count 0, errors");
}

static void test_ce_special(void)
{
    /* every row ignored: loss 0, gradient 0 */
    zs_tensor *x = zt_rand(ZS_F32, ZS_SHAPE(3, 5), 4);
    zs_set_requires_grad(x, true);
    zs_tensor *t = zs_full(ZS_I64, ZS_SHAPE(3), IGNORE);
    zs_tensor *l = zs_cross_entropy(x, t, IGNORE);
    ZT_CHECK(l && zs_item(l) == 0, "all ignored gives 0");
    ZT_CHECK(l && zs_backward(l, NULL, false) == ZS_OK && zs_grad(x), "bw");
    double zeros[15] = {0};
    ZT_CHECK(zt_max_err(zs_grad(x), zeros, 15) == 0, "all ignored grad 0");
    zs_release(l);
    zs_release(t);
    zs_release(x);
    /* huge logits stay finite; an ignore_index inside [0, C) is honoured */
    float big[] = {1000, -1000, 0, 500, 800, 900};
    zs_tensor *xb = zs_from_data(ZS_F32, ZS_SHAPE(2, 3), big);
    int32_t tg[] = {1, 2};
    zs_tensor *tb = zs_from_data(ZS_I32, ZS_SHAPE(2), tg);
    zs_tensor *lb = zs_cross_entropy(xb, tb, 2);
    ZT_CHECK(lb && fabs(zs_item(lb) - 2000.0) < 1e-3,
             "large logits: %g, expected 2000", lb ? zs_item(lb) : NAN);
    zs_release(lb);
    zs_release(tb);
    zs_release(xb);
    zt_section("cross_entropy: all ignored, large logits");
}

typedef struct ce_args {
    zs_tensor *t;
} ce_args;

static zs_tensor *ce_fn(void *ctx, zs_tensor **in)
{
    return zs_cross_entropy(in[0], ((ce_args *)ctx)->t, IGNORE);
}

static zs_tensor *mse_fn(void *ctx, zs_tensor **in)
{
    (void)ctx;
    return zs_mse_loss(in[0], in[1]);
}

static void test_grad(void)
{
    int64_t tv[6];
    zs_tensor *x = zt_rand(ZS_F64, ZS_SHAPE(6, 7), 8);
    zs_set_requires_grad(x, true);
    ce_args a = {make_targets(ZS_I64, 1, (int64_t[]){6}, 7, true, 8, tv)};
    ZT_GRADCHECK("cross_entropy [6, 7] with ignored rows", ce_fn, &a, 1, &x);
    zs_release(a.t);
    zs_release(x);
    x = zt_rand_strided(ZS_F64, ZS_SHAPE(2, 3, 5), 9);
    zs_set_requires_grad(x, true);
    a.t = make_targets(ZS_I32, 2, (int64_t[]){2, 3}, 5, false, 9, tv);
    ZT_GRADCHECK("cross_entropy [2, 3, 5] strided", ce_fn, &a, 1, &x);
    zs_release(a.t);
    zs_release(x);
    for (int which = 0; which < 3; which++) {
        zs_tensor *in[2] = {zt_rand(ZS_F64, ZS_SHAPE(4, 5), 10),
                            zt_rand_strided(ZS_F64, ZS_SHAPE(4, 5), 11)};
        if (which != 1)
            zs_set_requires_grad(in[0], true);
        if (which != 0)
            zs_set_requires_grad(in[1], true);
        ZT_GRADCHECK("mse_loss", mse_fn, NULL, 2, in);
        zs_release(in[0]);
        zs_release(in[1]);
    }
    zt_section("gradcheck cross_entropy mse_loss (f64)");
}

static void test_mse(void)
{
    static const int64_t sizes[][2] = {{7, 13}, {1, 1}, {1100, 1031}};
    uint64_t seed = 30;
    for (int dti = 0; dti < 2; dti++)
        for (size_t i = 0; i < 3; i++)
            for (int strided = 0; strided < 2; strided++) {
                zs_dtype dt = dti ? ZS_F64 : ZS_F32;
                zs_tensor *a = zt_rand(dt, 2, sizes[i], seed++);
                zs_tensor *b = strided
                                   ? zt_rand_strided(dt, 2, sizes[i], seed++)
                                   : zt_rand(dt, 2, sizes[i], seed++);
                double *av = zt_values(a), *bv = zt_values(b), ref = 0;
                int64_t n = zs_numel(a);
                for (int64_t k = 0; k < n; k++)
                    ref += (av[k] - bv[k]) * (av[k] - bv[k]);
                ref /= (double)n;
                zs_tensor *l = zs_mse_loss(a, b);
                double err = l ? fabs(zs_item(l) - ref) / fmax(1, ref)
                               : INFINITY;
                ZT_CHECK(l && l->ndim == 0 && err <= tol_of(dt),
                         "mse %s n %lld: err %g", zs_dtype_name(dt),
                         (long long)n, err);
                free(av);
                free(bv);
                zs_release(l);
                zs_release(a);
                zs_release(b);
            }
    zt_section("mse_loss forward vs float64 (incl. >1M)");
}

static void test_errors(void)
{
    zs_tensor *x = zt_rand(ZS_F32, ZS_SHAPE(4, 5), 1);
    zs_tensor *t3 = zs_zeros(ZS_I64, ZS_SHAPE(3));
    ZT_EXPECT_ERROR(zs_cross_entropy(x, t3, IGNORE) == NULL, "does not match");
    zs_tensor *t2d = zs_zeros(ZS_I64, ZS_SHAPE(4, 1));
    ZT_EXPECT_ERROR(zs_cross_entropy(x, t2d, IGNORE) == NULL, "expected [4]");
    zs_tensor *tf = zs_zeros(ZS_F32, ZS_SHAPE(4));
    ZT_EXPECT_ERROR(zs_cross_entropy(x, tf, IGNORE) == NULL, "index dtype f32");
    int64_t bad[] = {0, 1, 5, 2};
    zs_tensor *tb = zs_from_data(ZS_I64, ZS_SHAPE(4), bad);
    ZT_EXPECT_ERROR(zs_cross_entropy(x, tb, IGNORE) == NULL,
                    "target 5 at index 2 is out of range [0, 5)");
    int32_t neg[] = {0, -1, 1, 2};
    zs_tensor *tn = zs_from_data(ZS_I32, ZS_SHAPE(4), neg);
    ZT_EXPECT_ERROR(zs_cross_entropy(x, tn, IGNORE) == NULL,
                    "target -1 at index 1");
    zs_tensor *s = zs_scalar(ZS_F32, 1);
    ZT_EXPECT_ERROR(zs_cross_entropy(s, t3, IGNORE) == NULL, "0-d");
    zs_tensor *xi = zs_zeros(ZS_I32, ZS_SHAPE(4, 5));
    ZT_EXPECT_ERROR(zs_cross_entropy(xi, tb, IGNORE) == NULL, "dtype i32");
    zs_tensor *y = zt_rand(ZS_F32, ZS_SHAPE(5, 4), 2);
    ZT_EXPECT_ERROR(zs_mse_loss(x, y) == NULL, "shapes [4, 5] and [5, 4]");
    zs_tensor *xd = zt_rand(ZS_F64, ZS_SHAPE(4, 5), 3);
    ZT_EXPECT_ERROR(zs_mse_loss(x, xd) == NULL, "differ");
    ZT_CHECK(zs_cross_entropy(NULL, t3, 0) == NULL &&
                 zs_mse_loss(x, NULL) == NULL, "NULL in");
    zs_tensor *all[] = {x, t3, t2d, tf, tb, tn, s, xi, y, xd};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        zs_release(all[i]);
    zt_section("errors");
}

/* Output shapes on random shapes (logits 1 to 4 dims, sizes 1 to 4,
 * targets logits.shape[:-1] or flat [N]; mse 0 to 4 dims) against the
 * rule: a 0-d tensor of the input's dtype. */
static void test_random_shapes(void)
{
    uint64_t seed = 4242, r = seed;
    for (int it = 0; it < 100; it++) {
        r = r * 6364136223846793005ULL + 1442695040888963407ULL;
        int nd = (int)(r >> 33) % 5;
        bool flat = (r >> 40) & 1;
        int64_t shape[4];
        for (int d = 0; d < nd; d++) {
            r = r * 6364136223846793005ULL + 1442695040888963407ULL;
            shape[d] = 1 + (int64_t)((r >> 35) % 4);
        }
        zs_dtype dt = it % 2 ? ZS_F64 : ZS_F32;
        zs_tensor *a = zt_rand(dt, nd, shape, seed + (uint64_t)it);
        zs_tensor *b = zt_rand(dt, nd, shape, seed + 1000 + (uint64_t)it);
        zs_tensor *m = zs_mse_loss(a, b), *ce = NULL;
        if (nd > 0) {
            int64_t N = zs_numel(a) / shape[nd - 1];
            zs_tensor *t = flat ? zs_zeros(ZS_I64, 1, &N)
                                : zs_zeros(ZS_I64, nd - 1, shape);
            ce = zs_cross_entropy(a, t, IGNORE);
            zs_release(t);
        }
        char sx[96];
        zs_shape_str(a, sx, sizeof sx);
        ZT_CHECK(m && m->ndim == 0 && m->dtype == dt, "mse_loss shape of %s "
                 "(seed %llu, case %d)", sx, (unsigned long long)seed, it);
        ZT_CHECK(nd == 0 || (ce && ce->ndim == 0 && ce->dtype == dt),
                 "cross_entropy shape of logits %s, %s targets (seed %llu, "
                 "case %d)", sx, flat ? "flat" : "shaped",
                 (unsigned long long)seed, it);
        zs_release(a);
        zs_release(b);
        zs_release(m);
        zs_release(ce);
    }
    zt_section("shapes: cross_entropy mse_loss on 100 random shapes");
}

/* Under autocast, 16-bit logits are read as they are: the loss is f32,
 * the node saves the 16-bit logits (no f32 copy) and their gradient is
 * 16-bit; the same bits as casting them to f32 first (the path before:
 * to_dtype, the f32 kernel, the gradient cast back) and close to float64. */
static void test_ce_autocast(void)
{
    int64_t N = 37, C = 1031;
    for (int k = 0; k < 2; k++) {
        zs_scope_push();
        zs_dtype dt = k ? ZS_F16 : ZS_BF16;
        uint64_t seed = 700 + (uint64_t)k;
        zs_tensor *x = zs_mul_scalar(zt_rand_strided(ZS_F32, ZS_SHAPE(N, C), seed), 6.0);
        zs_tensor *wide = zs_to_dtype(zs_concat(2, (zs_tensor *[]){x, x}, 1), dt);
        zs_tensor *a = zs_slice(wide, 1, 0, C, 1); /* strided rows */
        zs_tensor *b = zs_contiguous(a);
        zs_set_requires_grad(a, true);
        zs_set_requires_grad(b, true);
        int64_t tv[37];
        zs_tensor *t = make_targets(ZS_I64, 1, &N, C, true, seed, tv);
        zs_autocast_push(dt);
        zs_tensor *l = zs_cross_entropy(a, t, IGNORE);
        zs_autocast_pop();
        zs_tensor *saved = l && l->node ? l->node->c.saved[0] : NULL;
        ZT_CHECK(l && l->dtype == ZS_F32 && saved && saved->dtype == dt,
                 "%s logits under autocast: loss %s, saved logits %s (expected f32, %s)",
                 zs_dtype_name(dt), l ? zs_dtype_name(l->dtype) : "NULL",
                 saved ? zs_dtype_name(saved->dtype) : "none", zs_dtype_name(dt));
        zs_tensor *l2 = zs_cross_entropy(zs_to_dtype(b, ZS_F32), t, IGNORE);
        bool bw = l && l2 && zs_backward(l, NULL, false) == ZS_OK &&
                  zs_backward(l2, NULL, false) == ZS_OK;
        zs_tensor *ga = zs_grad(a), *gb = zs_grad(b);
        ZT_CHECK(bw && ga && gb && ga->dtype == dt && gb->dtype == dt,
                 "%s: gradient in %s", zs_dtype_name(dt), ga ? zs_dtype_name(ga->dtype) : "NULL");
        bool same = bw && ga && gb && zs_item(l) == zs_item(l2);
        for (int64_t i = 0; same && i < N * C; i++)
            same = zs_get(ga, i) == zs_get(gb, i);
        ZT_CHECK(same, "%s: loss and gradient bit-identical to the f32-copy path "
                 "(seed %llu)", zs_dtype_name(dt), (unsigned long long)seed);
        double *v = zt_values(a), *gref = malloc((size_t)(N * C) * sizeof *gref);
        double ref = ce_ref(v, tv, N, C, IGNORE, gref), eg = 0, gmax = 0;
        for (int64_t i = 0; ga && i < N * C; i++) {
            eg = fmax(eg, fabs(zs_get(ga, i) - gref[i]));
            gmax = fmax(gmax, fabs(gref[i]));
        }
        double el = l ? fabs(zs_item(l) - ref) / fmax(1, fabs(ref)) : 1;
        /* the loss in f32 (1e-5 as above); the gradient rounded once to
         * the format: half an ulp of the largest entry (bf16 2^-9, f16
         * 2^-12; f16 subnormals below 6e-8 lose more, absolutely) */
        double gtol = (dt == ZS_BF16 ? 0x1p-8 : 0x1p-11) * gmax + 1e-7;
        ZT_CHECK(el <= 1e-5 && eg <= gtol, "%s vs float64: loss %.3g, gradient %.3g "
                 "(tolerance %.3g, seed %llu)", zs_dtype_name(dt), el, eg, gtol,
                 (unsigned long long)seed);
        free(v);
        free(gref);
        zs_scope_pop();
    }
    zt_section("cross_entropy under autocast: 16-bit logits read as they are, f32 loss");
}

int main(void)
{
    test_random_shapes();
    test_cross_entropy();
    test_ce_special();
    test_ce_descriptor();
    test_ce_autocast();
    test_grad();
    test_mse();
    test_errors();
    ZT_CHECK(zs_autograd_live_nodes() == 0, "no live nodes");
    return zt_done();
}
