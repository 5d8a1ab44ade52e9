/*
 * test_loss_shard.c - the cross-entropy over a shard of the classes
 * (src/ops/loss.c: row_lse, cross_entropy_shard), which the
 * vocabulary-parallel head runs on each tp rank, against float64
 * references in one process: logits [N, C] of odd sizes split into three
 * uneven class shards (one a strided view), targets with ignored rows.
 *
 * Checked: row_lse of each shard and of a transposed (strided) view
 * against the float64 log-sum-exp; the shards' losses, given the combined
 * log-sum-exp and summed with zs_add (whose backward passes g on as the
 * contract asks), equal the float64 mean cross-entropy of the whole
 * logits, and each shard's gradient equals its columns of the float64
 * (softmax - onehot) / count; a shard holding no target row gives its
 * softmax part only; every row ignored gives 0 and a zero gradient;
 * error paths (shapes, dtypes, count) name the operator.
 * Tolerances relative to max(1, |ref|): f64 1e-12; f32 1e-5 (losses, a
 * ~2 ulp exp and double sums), 1e-6 (gradient entries <= 1/count).
 */
#include <stdlib.h>

#include "ops/internal.h"
#include "testutil.h"

#define IGN (-7)

static const int64_t N = 37, C = 23;
static const int64_t lo[4] = {0, 7, 16, 23}; /* the shards' class ranges */

/* float64 log-sum-exp of row i of v [N, C] over columns [a, b). */
static double lse_ref(const double *v, int64_t i, int64_t a, int64_t b)
{
    double m = -INFINITY, s = 0;
    for (int64_t j = a; j < b; j++)
        m = fmax(m, v[i * C + j]);
    for (int64_t j = a; j < b; j++)
        s += exp(v[i * C + j] - m);
    return m + log(s);
}

/* Shard k of x as a leaf: columns [lo[k], lo[k+1]); shard 1 is left a
 * strided view (narrowed columns), the others are contiguous copies. */
static zs_tensor *shard_of(zs_tensor *x, int k)
{
    zs_tensor *v = zs_narrow(x, 1, lo[k], lo[k + 1] - lo[k]);
    zs_tensor *s = k == 1 ? zs_detach(v) : zs_contiguous(v);
    zs_release(v);
    zs_set_requires_grad(s, true);
    return s;
}

static void run(zs_dtype dt, bool all_ignored)
{
    double tol = dt == ZS_F32 ? 1e-5 : 1e-12, gtol = dt == ZS_F32 ? 1e-6 : 1e-12;
    zs_tensor *x = zt_rand(dt, 2, (int64_t[]){N, C}, 17);
    zs_tensor *x4 = zs_mul_scalar(x, 4.0);
    double *v = zt_values(x4);
    int64_t tg[37], count = 0;
    zt_irand_seed(23);
    for (int64_t i = 0; i < N; i++) {
        /* no target in shard 2 (classes 16..22) but for rows 5 and 9 */
        tg[i] = all_ignored || i % 5 == 3 ? IGN : i == 5 || i == 9 ? 20 : zt_irand(0, 15);
        count += tg[i] != IGN;
    }
    zs_tensor *glse = zs_empty(ZS_F64, 1, (int64_t[]){N});
    for (int64_t i = 0; i < N; i++)
        ((double *)zs_data(glse))[i] = lse_ref(v, i, 0, C);
    zs_tensor *cnt = zs_from_data(ZS_I64, 0, NULL, &count);
    zs_tensor *sh[3], *total = NULL;
    double lerr = 0;
    for (int k = 0; k < 3; k++) {
        sh[k] = shard_of(x4, k);
        zs_tensor *ll = zsi_row_lse(sh[k]);
        for (int64_t i = 0; ll && i < N; i++)
            lerr = fmax(lerr, fabs(zs_get(ll, i) - lse_ref(v, i, lo[k], lo[k + 1])) /
                                  fmax(1, fabs(lse_ref(v, i, lo[k], lo[k + 1]))));
        ZT_CHECK(ll && ll->dtype == ZS_F64, "row_lse: f64 [N]");
        zs_release(ll);
        int64_t t[37];
        for (int64_t i = 0; i < N; i++)
            t[i] = tg[i] == IGN ? IGN
                   : tg[i] >= lo[k] && tg[i] < lo[k + 1] ? tg[i] - lo[k] : -1;
        zs_tensor *tt = zs_from_data(ZS_I64, 1, &N, t);
        zs_tensor *part = zsi_cross_entropy_shard(sh[k], tt, glse, cnt, IGN);
        zs_tensor *s = total && part ? zs_add(total, part) : part ? zs_retain(part) : NULL;
        zs_release(total);
        zs_release(part);
        zs_release(tt);
        total = s;
    }
    ZT_CHECK(lerr <= tol, "%s row_lse of each shard: error %.2e (tol %.0e)",
             zs_dtype_name(dt), lerr, tol);
    double *gref = malloc((size_t)(N * C) * sizeof *gref);
    double loss = 0;
    for (int64_t i = 0; i < N; i++) {
        double l = lse_ref(v, i, 0, C);
        if (tg[i] != IGN)
            loss += l - v[i * C + tg[i]];
        for (int64_t j = 0; j < C; j++)
            gref[i * C + j] = tg[i] == IGN ? 0 : (exp(v[i * C + j] - l) - (j == tg[i])) / count;
    }
    loss = count ? loss / count : 0;
    ZT_CHECK(total && total->ndim == 0 && total->dtype == dt &&
             fabs(zs_item(total) - loss) <= tol * fmax(1, fabs(loss)),
             "%s%s: the shards' losses sum to %.15g, float64 %.15g", zs_dtype_name(dt),
             all_ignored ? " (all ignored)" : "", total ? zs_item(total) : NAN, loss);
    ZT_CHECK(total && zs_backward(total, NULL, false) == ZS_OK, "backward");
    double gerr = 0;
    for (int k = 0; k < 3; k++) {
        zs_tensor *g = zs_grad(sh[k]);
        for (int64_t i = 0; g && i < N; i++)
            for (int64_t j = lo[k]; j < lo[k + 1]; j++)
                gerr = fmax(gerr, fabs(zs_get(g, i * (lo[k + 1] - lo[k]) + j - lo[k]) -
                                       gref[i * C + j]));
        ZT_CHECK(g != NULL, "shard %d has a gradient", k);
    }
    ZT_CHECK(gerr <= gtol, "%s%s: the shards' gradients against float64 (softmax - "
             "onehot) / count: error %.2e (tol %.0e)", zs_dtype_name(dt),
             all_ignored ? " (all ignored)" : "", gerr, gtol);
    /* strided logits: a transposed view's row_lse */
    zs_tensor *x4t = zs_transpose(x4, 0, 1);
    zs_tensor *xt = zs_contiguous(x4t); /* [C, N] */
    zs_release(x4t);
    zs_tensor *back = zs_transpose(xt, 0, 1);              /* [N, C], strided */
    zs_tensor *ls = zsi_row_lse(back);
    double serr = 0;
    for (int64_t i = 0; ls && i < N; i++)
        serr = fmax(serr, fabs(zs_get(ls, i) - lse_ref(v, i, 0, C)));
    ZT_CHECK(ls && serr <= tol * 10, "%s row_lse of a transposed view: error %.2e",
             zs_dtype_name(dt), serr);
    zs_release(ls);
    zs_release(back);
    zs_release(xt);
    free(gref);
    free(v);
    for (int k = 0; k < 3; k++)
        zs_release(sh[k]);
    zs_release(total);
    zs_release(cnt);
    zs_release(glse);
    zs_release(x4);
    zs_release(x);
    zt_section(all_ignored ? "cross_entropy_shard, every row ignored"
                           : "row_lse and cross_entropy_shard against float64");
}

static void errors(void)
{
    zs_tensor *z = zt_rand(ZS_F32, 2, (int64_t[]){4, 5}, 1);
    zs_tensor *t = zs_zeros(ZS_I64, 1, (int64_t[]){4});
    zs_tensor *l = zs_zeros(ZS_F64, 1, (int64_t[]){4});
    zs_tensor *l32 = zs_zeros(ZS_F32, 1, (int64_t[]){4});
    zs_tensor *t3 = zs_zeros(ZS_I64, 1, (int64_t[]){3});
    zs_tensor *c = zs_zeros(ZS_I64, 0, NULL), *c2 = zs_zeros(ZS_I64, 1, (int64_t[]){2});
    zs_tensor *z3 = zt_rand(ZS_F32, 3, (int64_t[]){2, 2, 5}, 2);
    ZT_EXPECT_ERROR(zsi_cross_entropy_shard(z, t3, l, c, -1) == NULL, "cross_entropy_shard");
    ZT_EXPECT_ERROR(zsi_cross_entropy_shard(z, t, l32, c, -1) == NULL, "f64 lse");
    ZT_EXPECT_ERROR(zsi_cross_entropy_shard(z, t, l, c2, -1) == NULL, "one i64 count");
    ZT_EXPECT_ERROR(zsi_cross_entropy_shard(z3, t, l, c, -1) == NULL, "logits [N, C]");
    ZT_EXPECT_ERROR(zsi_cross_entropy_shard(z, l, l, c, -1) == NULL, "cross_entropy_shard");
    ZT_EXPECT_ERROR(zsi_row_lse(z3) == NULL, "row_lse");
    ZT_EXPECT_ERROR(zsi_row_lse(t) == NULL, "row_lse");
    zs_tensor *all[] = {z, t, l, l32, t3, c, c2, z3};
    for (int i = 0; i < 8; i++)
        zs_release(all[i]);
    zt_section("cross_entropy_shard and row_lse errors");
}

int main(void)
{
    run(ZS_F64, false);
    run(ZS_F32, false);
    run(ZS_F64, true);
    errors();
    return zt_done();
}
