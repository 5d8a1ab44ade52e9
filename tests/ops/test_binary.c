/*
 * test_binary.c - add, sub, mul, div (broadcasting, strided inputs, f32 and
 * f64), the scalar forms and axpy_, against float64 references; gradient
 * checks; error paths.
 */
#include <stdlib.h>

#include "testutil.h"

typedef zs_tensor *(*binop)(zs_tensor *, zs_tensor *);

static double ref_op(int k, double a, double b)
{
    switch (k) {
    case 0: return a + b;
    case 1: return a - b;
    case 2: return a * b;
    default: return a / b;
    }
}

static const binop ops[] = {zs_add, zs_sub, zs_mul, zs_div};
static const char *names[] = {"add", "sub", "mul", "div"};

/* Reference with broadcasting by index arithmetic on row-major values. */
static void reference(int k, const zs_tensor *a, const zs_tensor *b, int ndim,
                      const int64_t *shape, double *out)
{
    int64_t n = 1;
    for (int d = 0; d < ndim; d++)
        n *= shape[d];
    for (int64_t i = 0; i < n; i++) {
        int64_t rem = i, ia = 0, ib = 0, ma = 1, mb = 1;
        for (int d = ndim - 1; d >= 0; d--) {
            int64_t idx = rem % shape[d];
            rem /= shape[d];
            int da = d - (ndim - a->ndim), db = d - (ndim - b->ndim);
            if (da >= 0) {
                ia += (a->shape[da] == 1 ? 0 : idx) * ma;
                ma *= a->shape[da];
            }
            if (db >= 0) {
                ib += (b->shape[db] == 1 ? 0 : idx) * mb;
                mb *= b->shape[db];
            }
        }
        out[i] = ref_op(k, zs_get(a, ia), zs_get(b, ib));
    }
}

typedef struct shape_case {
    int na, nb, no;
    int64_t a[4], b[4], o[4];
} shape_case;

static const shape_case cases[] = {
    {2, 2, 2, {7, 13}, {7, 13}, {7, 13}},
    {2, 1, 2, {7, 13}, {13}, {7, 13}},
    {2, 2, 2, {7, 1}, {1, 13}, {7, 13}},
    {3, 2, 3, {3, 1, 5}, {4, 1}, {3, 4, 5}},
    {0, 2, 2, {0}, {5, 3}, {5, 3}},
    {1, 1, 1, {100003}, {100003}, {100003}},
    {2, 1, 2, {1000, 77}, {77}, {1000, 77}},
};

static void test_forward(zs_dtype dt, bool strided)
{
    uint64_t seed = 10;
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        const shape_case *sc = &cases[c];
        for (int k = 0; k < 4; k++) {
            zs_tensor *a = strided ? zt_rand_strided(dt, sc->na, sc->a, seed)
                                   : zt_rand(dt, sc->na, sc->a, seed);
            zs_tensor *b = zt_rand(dt, sc->nb, sc->b, seed + 1);
            if (k == 3) { /* keep divisors away from zero */
                zs_tensor *b2 = zs_add_scalar(b, 3.0);
                zs_release(b);
                b = b2;
            }
            zs_tensor *o = ops[k](a, b);
            int64_t n = 1;
            for (int d = 0; d < sc->no; d++)
                n *= sc->o[d];
            double *ref = malloc((size_t)n * sizeof *ref);
            reference(k, a, b, sc->no, sc->o, ref);
            double tol = dt == ZS_F32 ? 2e-7 : 1e-15;
            double err = zt_max_err(o, ref, n);
            ZT_CHECK(o && o->ndim == sc->no && err <= tol,
                     "%s case %zu %s%s: err %g (seed %llu)", names[k], c,
                     zs_dtype_name(dt), strided ? " strided" : "", err,
                     (unsigned long long)seed);
            free(ref);
            zs_release(a);
            zs_release(b);
            zs_release(o);
            seed += 2;
        }
    }
}

static void test_scalar_and_axpy(void)
{
    zs_tensor *a = zt_rand_strided(ZS_F32, ZS_SHAPE(9, 11), 3);
    zs_tensor *s = zs_add_scalar(a, 0.5), *m = zs_mul_scalar(a, -3.0);
    int bad = 0;
    for (int i = 0; i < 99; i++) {
        bad += fabs(zs_get(s, i) - (zs_get(a, i) + 0.5)) > 1e-6;
        bad += fabs(zs_get(m, i) - (zs_get(a, i) * -3.0)) > 1e-6;
    }
    ZT_CHECK(bad == 0, "scalar ops: %d wrong", bad);
    zs_tensor *d = zs_zeros(ZS_F32, ZS_SHAPE(9, 11));
    zs_tensor *row = zt_rand(ZS_F32, ZS_SHAPE(11), 4);
    ZT_CHECK(zs_axpy_(d, 2.0, row) == ZS_OK, "axpy broadcast");
    ZT_CHECK(fabs(zs_get(d, 8 * 11 + 3) - 2 * zs_get(row, 3)) < 1e-6, "axpy value");
    ZT_EXPECT_ERROR(zs_axpy_(row, 1.0, d) < 0, "does not broadcast");
    zs_release(a);
    zs_release(s);
    zs_release(m);
    zs_release(d);
    zs_release(row);
    zt_section("scalar ops and axpy_");
}

typedef struct gc_ctx {
    int k;
} gc_ctx;

static zs_tensor *gc_fn(void *ctx, zs_tensor **in)
{
    gc_ctx *c = ctx;
    return ops[c->k](in[0], in[1]);
}

static zs_tensor *gc_scalar(void *ctx, zs_tensor **in)
{
    zs_tensor *t = zs_mul_scalar(in[0], 1.7);
    zs_tensor *u = zs_add_scalar(t, 0.3);
    zs_tensor *v = zs_neg(u);
    zs_release(t);
    zs_release(u);
    return v;
}

static void test_grad(void)
{
    for (size_t c = 0; c < 4; c++) {
        const shape_case *sc = &cases[c];
        for (int k = 0; k < 4; k++) {
            zs_tensor *a = zt_rand_strided(ZS_F64, sc->na, sc->a, 100 + k);
            zs_tensor *b0 = zt_rand(ZS_F64, sc->nb, sc->b, 200 + k);
            zs_tensor *b = zs_add_scalar(b0, 2.5);
            zs_set_requires_grad(a, true);
            zs_set_requires_grad(b, true);
            gc_ctx ctx = {k};
            char name[64];
            snprintf(name, sizeof name, "%s case %zu", names[k], c);
            ZT_GRADCHECK(name, gc_fn, &ctx, 2, ((zs_tensor *[]){a, b}));
            zs_release(a);
            zs_release(b0);
            zs_release(b);
        }
    }
    zs_tensor *x = zt_rand(ZS_F64, ZS_SHAPE(4, 3), 9);
    zs_set_requires_grad(x, true);
    ZT_GRADCHECK("scalar chain", gc_scalar, NULL, 1, &x);
    zs_release(x);
    zt_section("gradients");
}

static void test_errors(void)
{
    zs_tensor *a = zs_ones(ZS_F32, ZS_SHAPE(2, 3));
    zs_tensor *b = zs_ones(ZS_F32, ZS_SHAPE(4));
    zs_tensor *c = zs_ones(ZS_F64, ZS_SHAPE(2, 3));
    zs_tensor *i = zs_ones(ZS_I32, ZS_SHAPE(2, 3));
    ZT_EXPECT_ERROR(zs_add(a, b) == NULL, "add: shapes [2, 3] and [4] cannot be broadcast");
    ZT_EXPECT_ERROR(zs_mul(a, c) == NULL, "dtypes f32 and f64 differ");
    ZT_EXPECT_ERROR(zs_sub(i, i) == NULL, "dtype i32 is not supported");
    zs_set_error("first");
    ZT_CHECK(zs_div(NULL, a) == NULL && !strcmp(zs_last_error(), "first"),
             "NULL input keeps the first error");
    zs_release(a);
    zs_release(b);
    zs_release(c);
    zs_release(i);
    zt_section("errors");
}

int main(void)
{
    test_forward(ZS_F32, false);
    test_forward(ZS_F64, false);
    test_forward(ZS_F32, true);
    zt_section("forward vs float64 reference (broadcast, strided)");
    test_scalar_and_axpy();
    test_grad();
    test_errors();
    return zt_done();
}
