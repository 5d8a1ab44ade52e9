/*
 * test_inplace.c - the in-place descriptors of ops/inplace.c (axpy_,
 * copy_, fill_, scale_) and the driver's in-place path: values against
 * float64 references (or the exact rounding the dtype prescribes) over
 * contiguous, strided and broadcast layouts and dtype conversions; the
 * result is the destination itself, nothing is allocated or recorded; a
 * destination that requires grad and is not a leaf is refused under grad
 * mode; a second device's kernel gets out == in[0]; error paths (shapes,
 * dtypes, devices).
 */
#include <stdlib.h>

#include "ops/op.h"
#include "testutil.h"

/* ---- axpy_ ---------------------------------------------------------------- */

/* dst [5, 7, 9] (contiguous or strided) += alpha * src, src of shape
 * sshape broadcast from dst's trailing dims; against the float64
 * reference, relative to max(1, |ref|): f32 within 1e-6 (alpha rounded
 * to f32, a product and a sum rounded: a few ulp of values <= 3), f64
 * within 1e-14. */
static void check_axpy(zs_dtype dt, bool strided, int sndim, const int64_t *sshape,
                       double alpha, uint64_t seed)
{
    const int64_t shape[3] = {5, 7, 9};
    zs_tensor *d = strided ? zt_rand_strided(dt, 3, shape, seed)
                           : zt_rand(dt, 3, shape, seed);
    zs_tensor *s = zt_rand_strided(dt, sndim, sshape, seed + 1);
    double *before = zt_values(d), *sv = zt_values(s);
    zs_status st = zs_axpy_(d, alpha, s);
    /* 16-bit: computed in f32 and rounded once: half an ulp of the result,
     * at most 2^-8 (bf16) or 2^-11 (f16) of it, plus the f32 arithmetic */
    double worst = 0, tol = dt == ZS_F32 ? 1e-6 : dt == ZS_BF16 ? 3.95e-3
                          : dt == ZS_F16 ? 4.95e-4 : 1e-14;
    for (int64_t i = 0; i < 5 * 7 * 9; i++) {
        int64_t rem = i, k = 0, m = 1;
        for (int dd = 2, sd = sndim - 1; sd >= 0; dd--, sd--) {
            int64_t idx = rem % shape[dd];
            rem /= shape[dd];
            k += (sshape[sd] == 1 ? 0 : idx) * m;
            m *= sshape[sd];
        }
        double ref = before[i] + alpha * sv[k];
        worst = fmax(worst, fabs(zs_get(d, i) - ref) / fmax(1, fabs(ref)));
    }
    ZT_CHECK(st == ZS_OK && worst < tol, "axpy_ %s %s, src ndim %d, alpha %g, "
             "seed %llu: max rel err %g (tol %g)", zs_dtype_name(dt),
             strided ? "strided" : "contiguous", sndim, alpha,
             (unsigned long long)seed, worst, tol);
    free(before);
    free(sv);
    zs_release(d);
    zs_release(s);
}

static void test_axpy(void)
{
    const zs_dtype dts[] = {ZS_F32, ZS_F64, ZS_BF16, ZS_F16};
    for (int t = 0; t < 4; t++) {
        zs_dtype dt = dts[t];
        for (int strided = 0; strided < 2; strided++) {
            check_axpy(dt, strided, 3, (int64_t[]){5, 7, 9}, 0.75, 10);
            check_axpy(dt, strided, 1, (int64_t[]){9}, -2.0, 20);
            check_axpy(dt, strided, 2, (int64_t[]){7, 1}, 1.0, 30);
            check_axpy(dt, strided, 3, (int64_t[]){5, 1, 9}, 3.0, 40);
            check_axpy(dt, strided, 1, (int64_t[]){1}, 0.1, 50);
        }
    }
    zt_section("axpy_ vs float64: same shape and broadcast sources, strided "
               "destinations, f32, f64, bf16 and f16");
}

/* ---- copy_ ---------------------------------------------------------------- */

/* dst's row-major values are src's, each converted as conv says */
static bool same_values(const zs_tensor *dst, const zs_tensor *src,
                        double (*conv)(double))
{
    for (int64_t i = 0; i < zs_numel(dst); i++) {
        double want = conv ? conv(zs_get(src, i)) : zs_get(src, i);
        if (zs_get(dst, i) != want)
            return false;
    }
    return true;
}

static double to_f32(double v) { return (float)v; }
static double to_bf16(double v) { return zs_bf16_to_f32(zs_f32_to_bf16((float)v)); }
static double to_f16(double v) { return zs_f16_to_f32(zs_f32_to_f16((float)v)); }

static void test_copy(void)
{
    /* layouts, one dtype: exact */
    zs_tensor *a = zt_rand(ZS_F32, ZS_SHAPE(33, 70), 1);
    zs_tensor *at = zs_transpose(a, 0, 1);
    zs_tensor *c = zs_empty(ZS_F32, ZS_SHAPE(70, 33));
    ZT_CHECK(zs_copy_(c, at) == ZS_OK && same_values(c, at, NULL),
             "transposed f32 [70, 33] into contiguous");
    zs_tensor *s = zt_rand_strided(ZS_F64, ZS_SHAPE(6, 4), 2);
    zs_tensor *r = zs_empty(ZS_F64, ZS_SHAPE(4, 6));
    ZT_CHECK(zs_copy_(r, s) == ZS_OK && same_values(r, s, NULL),
             "strided [6, 4] into [4, 6]: row-major order");
    zs_tensor *big = zs_zeros(ZS_F32, ZS_SHAPE(70, 33));
    zs_tensor *bt = zs_transpose(big, 0, 1);
    ZT_CHECK(zs_copy_(bt, a) == ZS_OK && same_values(bt, a, NULL),
             "contiguous into a transposed destination");
    /* conversions: the rounding of the destination's dtype */
    zs_tensor *d64 = zt_rand_strided(ZS_F64, ZS_SHAPE(9, 13), 3);
    zs_tensor *f32 = zs_empty(ZS_F32, ZS_SHAPE(9, 13));
    zs_tensor *bf = zs_empty(ZS_BF16, ZS_SHAPE(9, 13));
    zs_tensor *h = zs_empty(ZS_F16, ZS_SHAPE(9, 13));
    ZT_CHECK(zs_copy_(f32, d64) == ZS_OK && same_values(f32, d64, to_f32),
             "f64 -> f32 rounds to nearest");
    ZT_CHECK(zs_copy_(bf, f32) == ZS_OK && same_values(bf, f32, to_bf16),
             "f32 -> bf16 rounds to nearest even");
    ZT_CHECK(zs_copy_(h, d64) == ZS_OK && same_values(h, d64, to_f16),
             "f64 -> f16 through f32");
    zs_tensor *src = zs_from_blob(ZS_F64, ZS_SHAPE(5), (double[]){-1e10, -2.5, 0.5, 7.9, 1e10});
    zs_tensor *i32 = zs_empty(ZS_I32, ZS_SHAPE(5));
    const double want[5] = {-2147483648.0, -2, 0, 7, 2147483647.0};
    bool ok = zs_copy_(i32, src) == ZS_OK;
    for (int i = 0; i < 5; i++)
        ok = ok && zs_get(i32, i) == want[i];
    ZT_CHECK(ok, "f64 -> i32 truncates and saturates");
    zs_tensor *e0 = zs_empty(ZS_F32, ZS_SHAPE(0, 3)), *e1 = zs_empty(ZS_F64, ZS_SHAPE(3, 0));
    ZT_CHECK(zs_copy_(e0, e1) == ZS_OK, "empty tensors");
    zs_tensor *ts[] = {a, at, c, s, r, big, bt, d64, f32, bf, h, src, i32, e0, e1};
    for (size_t i = 0; i < sizeof ts / sizeof *ts; i++)
        zs_release(ts[i]);
    zt_section("copy_: layouts, reshaping, conversions (exact)");
}

/* Contiguous conversions are split into chunks of 32768 elements over the
 * pool (core/copy.c): 100011 elements (three chunks and a tail), the source
 * a contiguous view at an offset, each element against the scalar
 * conversion, and back. */
static void test_copy_flat(void)
{
    zs_tensor *all = zt_rand(ZS_F32, ZS_SHAPE(4, 33337), 21);
    zs_tensor *x = zs_narrow(all, 0, 1, 3); /* contiguous, offset 33337 */
    zs_tensor *bf = zs_empty(ZS_BF16, ZS_SHAPE(3, 33337));
    zs_tensor *h = zs_empty(ZS_F16, ZS_SHAPE(3, 33337));
    zs_tensor *back = zs_empty(ZS_F32, ZS_SHAPE(3, 33337));
    bool ok = zs_is_contiguous(x) && zs_copy_(bf, x) == ZS_OK && zs_copy_(h, x) == ZS_OK;
    const float *xs = (const float *)zs_data(all) + 33337;
    const uint16_t *bs = zs_data(bf), *hs = zs_data(h);
    int64_t bad = 0;
    for (int64_t i = 0; i < 3 * 33337; i++)
        bad += bs[i] != zs_f32_to_bf16(xs[i]) || hs[i] != zs_f32_to_f16(xs[i]);
    ZT_CHECK(ok && bad == 0, "f32 [3, 33337] at an offset -> bf16, f16: %lld elements "
             "differ from the scalar conversion", (long long)bad);
    ok = zs_copy_(back, bf) == ZS_OK;
    const float *r = zs_data(back);
    bad = 0;
    for (int64_t i = 0; i < 3 * 33337; i++)
        bad += r[i] != zs_bf16_to_f32(bs[i]);
    ZT_CHECK(ok && bad == 0, "bf16 -> f32 [3, 33337]: %lld elements differ", (long long)bad);
    zs_tensor *ts[] = {all, x, bf, h, back};
    for (int i = 0; i < 5; i++)
        zs_release(ts[i]);
    zt_section("copy_: contiguous conversions in chunks over the pool (scalar bits)");
}

/* ---- fill_ and scale_ ------------------------------------------------------- */

static void test_fill_scale(void)
{
    zs_tensor *a = zs_zeros(ZS_F64, ZS_SHAPE(6, 8));
    zs_tensor *v = zs_slice(a, 1, 1, 8, 3); /* columns 1, 4, 7 */
    bool ok = zs_fill_(v, -1.25) == ZS_OK;
    for (int64_t i = 0; i < 48; i++)
        ok = ok && zs_get(a, i) == (i % 8 % 3 == 1 ? -1.25 : 0);
    ZT_CHECK(ok, "fill_ of a strided view writes its elements only");
    zs_tensor *f = zs_empty(ZS_F32, ZS_SHAPE(1000)), *n = zs_empty(ZS_I32, ZS_SHAPE(7));
    zs_tensor *b = zs_empty(ZS_BF16, ZS_SHAPE(5));
    ok = zs_fill_(f, 0.1) == ZS_OK && zs_fill_(n, 3.9) == ZS_OK && zs_fill_(b, 0.1) == ZS_OK;
    for (int64_t i = 0; i < 1000; i++)
        ok = ok && zs_get(f, i) == (float)0.1;
    for (int64_t i = 0; i < 7; i++)
        ok = ok && zs_get(n, i) == 3;
    ok = ok && zs_get(b, 4) == to_bf16(0.1);
    ZT_CHECK(ok, "fill_ f32, i32 (truncated), bf16 (rounded)");

    /* scale_: the product in the dtype, s rounded to it first (f32: as
     * zs_mul_scalar and the old clipping loop, exact) */
    const double sc = 0.3;
    zs_tensor *x = zt_rand(ZS_F32, ZS_SHAPE(100003), 4), *x0 = zs_clone(x);
    zs_tensor *y = zt_rand_strided(ZS_F32, ZS_SHAPE(37, 11), 5), *y0 = zs_clone(y);
    zs_tensor *z = zt_rand_strided(ZS_F64, ZS_SHAPE(37, 11), 6), *z0 = zs_clone(z);
    zs_tensor *w = zs_to_dtype(y0, ZS_BF16), *w0 = zs_clone(w);
    ok = zs_scale_(x, sc) == ZS_OK && zs_scale_(y, sc) == ZS_OK &&
         zs_scale_(z, sc) == ZS_OK && zs_scale_(w, sc) == ZS_OK;
    for (int64_t i = 0; ok && i < 100003; i++)
        ok = zs_get(x, i) == (double)((float)zs_get(x0, i) * (float)sc);
    ZT_CHECK(ok, "scale_ f32 contiguous (pool): x * (float)s, exact");
    ok = true;
    for (int64_t i = 0; i < 37 * 11; i++) {
        float fy = (float)zs_get(y0, i) * (float)sc;
        float fw = (float)zs_get(w0, i) * (float)sc;
        ok = ok && zs_get(y, i) == fy && zs_get(z, i) == zs_get(z0, i) * sc &&
             zs_get(w, i) == to_bf16(fw);
    }
    ZT_CHECK(ok, "scale_ strided f32, strided f64, bf16 (in f32, rounded once): exact");
    zs_tensor *ts[] = {a, v, f, n, b, x, x0, y, y0, z, z0, w, w0};
    for (size_t i = 0; i < sizeof ts / sizeof *ts; i++)
        zs_release(ts[i]);
    zt_section("fill_ and scale_ (exact)");
}

/* ---- the driver's in-place path ------------------------------------------- */

static void test_driver(void)
{
    const char *names[] = {"axpy_", "copy_", "fill_", "scale_"};
    bool listed = true;
    for (int i = 0; i < 4; i++) {
        zsi_opdef *d = zsi_opdef_find(names[i]);
        listed = listed && d && d->inplace && !d->op.backward;
    }
    ZT_CHECK(listed, "the four descriptors are listed, in place, not differentiable");

    zs_tensor *t = zs_zeros(ZS_F32, ZS_SHAPE(4));
    int rc = zsi_ref_get(&t->refcount);
    struct { double value; } fa = {2.0};
    zs_tensor *r = zsi_run(&zsi_def_fill_, 1, &t, &fa);
    ZT_CHECK(r == t && zsi_ref_get(&t->refcount) == rc + 1 && zs_get(t, 3) == 2.0,
             "zsi_run returns the destination, retained, written");
    zs_release(r);
    zs_tensor *outs[1];
    ZT_EXPECT_ERROR(zsi_run_n(&zsi_def_fill_, 1, &t, &fa, 1, outs) < 0,
                    "fill_: in place: run it with zsi_run");

    /* leaves may be written under grad mode (parameters, loading weights);
     * nothing is recorded */
    zs_tensor *p = zt_rand(ZS_F32, ZS_SHAPE(4), 1), *q = zt_rand(ZS_F32, ZS_SHAPE(4), 2);
    zs_set_requires_grad(p, true);
    zs_set_requires_grad(q, true);
    ZT_CHECK(zs_grad_enabled() && zs_copy_(p, q) == ZS_OK && zs_axpy_(p, 1.0, q) == ZS_OK &&
             !p->node && zs_get(p, 0) == 2 * zs_get(q, 0),
             "a leaf that requires grad is written, no node recorded");
    /* a non-leaf that requires grad is refused under grad mode */
    zs_tensor *y = zs_mul_scalar(p, 2.0);
    ZT_CHECK(y && y->node, "y = 2p has a node");
    double y0 = zs_get(y, 0);
    ZT_EXPECT_ERROR(zs_fill_(y, 0) < 0, "fill_: the destination requires grad "
                    "and is not a leaf");
    ZT_EXPECT_ERROR(zs_copy_(y, q) < 0, "copy_: the destination requires grad");
    ZT_EXPECT_ERROR(zs_axpy_(y, 1.0, q) < 0, "axpy_: the destination requires grad");
    ZT_EXPECT_ERROR(zs_scale_(y, 2.0) < 0, "scale_: the destination requires grad");
    ZT_CHECK(zs_get(y, 0) == y0, "refused calls leave y unchanged");
    zs_no_grad_push();
    ZT_CHECK(zs_fill_(y, 5) == ZS_OK && zs_get(y, 2) == 5, "allowed under no-grad");
    zs_no_grad_pop();
    zs_tensor *yd = zs_detach(y);
    ZT_CHECK(zs_fill_(yd, 6) == ZS_OK && zs_get(y, 1) == 6, "allowed into a detached alias");
    /* a source that requires grad is only read */
    zs_tensor *u = zs_zeros(ZS_F32, ZS_SHAPE(4));
    ZT_CHECK(zs_copy_(u, y) == ZS_OK && !u->node && !u->requires_grad,
             "a non-leaf source is fine; the destination stays out of the graph");
    /* NULL arguments: a negative status, the first error kept */
    zs_set_error("earlier failure");
    ZT_EXPECT_ERROR(zs_copy_(NULL, t) < 0 && zs_fill_(NULL, 1) < 0 &&
                    zs_axpy_(t, 1, NULL) < 0 && zs_scale_(NULL, 2) < 0,
                    "earlier failure");
    zs_tensor *ts[] = {t, p, q, y, yd, u};
    for (size_t i = 0; i < sizeof ts / sizeof *ts; i++)
        zs_release(ts[i]);
    zt_section("driver: result = destination, nothing recorded, non-leaf refused");
}

/* ---- a second device: host memory the CPU is told it cannot address --- */

#define TESTDEV 5
static void *dev_alloc(void *ctx, size_t n) { return malloc(n ? n : 1); }
static void dev_free(void *ctx, void *p) { free(p); }
static zs_status dev_copy(void *ctx, void *dst, const void *src, size_t n,
                          zs_copy_kind kind)
{
    memcpy(dst, src, n);
    return ZS_OK;
}

static int fill_calls;
static bool fill_aliased = true;

/* The device's fill_ (f32, contiguous): counts, and checks out == in[0]. */
static zs_status dev_fill(const zsi_call *c, zs_tensor *out)
{
    const struct { double value; } *a = c->attrs;
    fill_calls++;
    fill_aliased = fill_aliased && out == c->in[0];
    float *o = zsi_ptr(out);
    for (int64_t i = 0; i < zs_numel(out); i++)
        o[i] = (float)a->value;
    return ZS_OK;
}

static void test_device(void)
{
    zs_device_ops ops = {.name = "testdev", .alloc = dev_alloc, .free = dev_free,
                         .copy = dev_copy};
    ZT_CHECK(zs_device_register(TESTDEV, &ops) == ZS_OK, "register");
    zs_tensor *x = zt_rand(ZS_F32, ZS_SHAPE(3, 5), 1);
    zs_tensor *xd = zs_to_device(x, TESTDEV);
    ZT_EXPECT_ERROR(zs_fill_(xd, 1.0) < 0, "fill_: no kernel for f32 on testdev");
    /* across devices src moves to dst's device first: a CPU destination
     * takes the device's bytes; axpy_ still refuses two devices */
    zs_tensor *h = zs_zeros(ZS_F32, ZS_SHAPE(3, 5));
    ZT_CHECK(zs_copy_(h, xd) == ZS_OK && !memcmp(zs_data(h), zs_data(x), 60),
             "copy_ from the device to the host moves the bytes");
    ZT_EXPECT_ERROR(zs_axpy_(h, 1, xd) < 0, "axpy_: inputs on cpu and testdev");
    zs_release(h);
    ZT_CHECK(zsi_op_set_kernel(&zsi_def_fill_, TESTDEV, ZS_F32, dev_fill) == ZS_OK,
             "set kernel");
    zs_tensor *back = NULL;
    ZT_CHECK(zs_fill_(xd, 0.5) == ZS_OK && fill_calls == 1 && fill_aliased &&
             (back = zs_to_device(xd, ZS_CPU)) && zs_get(back, 14) == 0.5,
             "the device's kernel ran in place (out == in[0]), nothing allocated");
    zsi_op_set_kernel(&zsi_def_fill_, TESTDEV, ZS_F32, NULL);
    zs_release(back);
    zs_release(xd);
    zs_release(x);
    ZT_CHECK(zs_device_register(TESTDEV, NULL) == ZS_OK, "unregister");
    zt_section("a second device: its in-place kernel, one device per call");
}

/* ---- errors ---------------------------------------------------------------- */

static void test_errors(void)
{
    zs_tensor *a = zs_zeros(ZS_F32, ZS_SHAPE(3, 4)), *b = zs_zeros(ZS_F32, ZS_SHAPE(5));
    zs_tensor *c = zs_zeros(ZS_F32, ZS_SHAPE(2, 3, 4)), *w = zs_zeros(ZS_F64, ZS_SHAPE(3, 4));
    zs_tensor *i = zs_zeros(ZS_I32, ZS_SHAPE(3, 4)), *row = zs_zeros(ZS_F32, ZS_SHAPE(4));
    zs_tensor *e = zs_expand(row, ZS_SHAPE(3, 4));
    ZT_EXPECT_ERROR(zs_axpy_(a, 1, b) < 0, "axpy_: shapes [3, 4] and [5] cannot be broadcast");
    ZT_EXPECT_ERROR(zs_axpy_(a, 1, c) < 0, "axpy_: source [2, 3, 4] does not broadcast "
                    "to destination [3, 4]");
    ZT_EXPECT_ERROR(zs_axpy_(a, 1, w) < 0, "axpy_: dtypes f32 and f64 differ");
    ZT_EXPECT_ERROR(zs_axpy_(i, 1, i) < 0, "axpy_: dtype i32 is not supported");
    ZT_EXPECT_ERROR(zs_axpy_(e, 1, a) < 0, "axpy_: destination is a broadcast view");
    ZT_EXPECT_ERROR(zs_copy_(a, b) < 0, "copy_: destination [3, 4] and source [5] "
                    "differ in element count");
    ZT_EXPECT_ERROR(zs_scale_(i, 2) < 0, "scale_: dtype i32 is not supported");
    zs_tensor *ts[] = {a, b, c, w, i, row, e};
    for (size_t k = 0; k < sizeof ts / sizeof *ts; k++)
        zs_release(ts[k]);
    zt_section("errors: shapes, dtypes, broadcast destination");
}

int main(void)
{
    test_axpy();
    test_copy();
    test_copy_flat();
    test_fill_scale();
    test_driver();
    test_device();
    test_errors();
    return zt_done();
}
