/*
 * test_unary.c - elementwise unary operators: forward against float64
 * references written here (f32 and f64, contiguous, transposed and
 * step-2 inputs, odd sizes), a wide-range sweep of the f32 kernels (AVX-512
 * and fallback) including 0, subnormals, huge values, inf and NaN, a large
 * multithreaded case whose size is not a multiple of 16, gradient checks on
 * f64, replay of recorded calls from their typed attributes, and error
 * paths.
 *
 * Tolerances: f32 results must be within 1e-6 relative of the double
 * reference evaluated on the same float input (a few ulp; the kernels aim
 * at <= 3 ulp) wherever the reference is a normal float (|ref| >= 1e-30);
 * below that, within 1e-30 absolute. f64 results use libm directly: 1e-13.
 */
#include <float.h>
#include <stdlib.h>

#include "kernels/cpu/unary.h"
#include "ops/op.h"
#include "testutil.h"

/* ---- references (double) ---------------------------------------------- */

static double sig_ref(double v)
{
    return v >= 0 ? 1 / (1 + exp(-v)) : exp(v) / (1 + exp(v));
}

static double ref_eval(zsk_unop op, double x, double p0, double p1)
{
    const double c = sqrt(2 / M_PI);
    switch (op) {
    case ZSK_EXP: return exp(x);
    case ZSK_LOG: return log(x);
    case ZSK_SQRT: return sqrt(x);
    case ZSK_RSQRT: return 1 / sqrt(x);
    case ZSK_POW: return pow(x, p0);
    case ZSK_SIN: return sin(x);
    case ZSK_COS: return cos(x);
    case ZSK_TANH: return tanh(x);
    case ZSK_SIGMOID: return sig_ref(x);
    case ZSK_RELU: return isnan(x) ? x : x > 0 ? x : 0;
    case ZSK_GELU_ERF: /* limit 0 at -inf */
        return isinf(x) && x < 0 ? 0 : 0.5 * x * erfc(-x / sqrt(2.0));
    case ZSK_GELU_TANH: /* 0.5 x (1 + tanh u) = x sigmoid(2u) */
        return isinf(x) && x < 0 ? 0 : x * sig_ref(2 * c * (x + 0.044715 * x * x * x));
    case ZSK_SILU: return isinf(x) && x < 0 ? 0 : x * sig_ref(x);
    case ZSK_ABS: return fabs(x);
    case ZSK_CLAMP: return isnan(x) ? x : fmin(fmax(x, p0), p1);
    default: return NAN;
    }
}

typedef struct op_case {
    const char *name;
    zsk_unop k;
    double lo, hi;  /* forward input range */
    double p0, p1;
} op_case;

static const op_case cases[] = {
    {"exp", ZSK_EXP, -10, 10, 0, 0},
    {"log", ZSK_LOG, 0.001, 100, 0, 0},
    {"sqrt", ZSK_SQRT, 0, 100, 0, 0},
    {"rsqrt", ZSK_RSQRT, 0.01, 100, 0, 0},
    {"pow 2", ZSK_POW, -3, 3, 2, 0},
    {"pow 3", ZSK_POW, -3, 3, 3, 0},
    {"pow 0.5", ZSK_POW, 0, 9, 0.5, 0},
    {"pow -1.5", ZSK_POW, 0.1, 5, -1.5, 0},
    {"sin", ZSK_SIN, -10, 10, 0, 0},
    {"cos", ZSK_COS, -10, 10, 0, 0},
    {"tanh", ZSK_TANH, -6, 6, 0, 0},
    {"sigmoid", ZSK_SIGMOID, -30, 30, 0, 0},
    {"relu", ZSK_RELU, -3, 3, 0, 0},
    {"gelu erf", ZSK_GELU_ERF, -8, 8, 0, 0},
    {"gelu tanh", ZSK_GELU_TANH, -8, 8, 0, 0},
    {"silu", ZSK_SILU, -30, 30, 0, 0},
    {"abs", ZSK_ABS, -3, 3, 0, 0},
    {"clamp", ZSK_CLAMP, -3, 3, -1, 2},
};
#define NCASES (int)(sizeof cases / sizeof *cases)

/* The public operator for a case. */
static zs_tensor *run_op(const op_case *c, zs_tensor *x)
{
    switch (c->k) {
    case ZSK_EXP: return zs_exp(x);
    case ZSK_LOG: return zs_log(x);
    case ZSK_SQRT: return zs_sqrt(x);
    case ZSK_RSQRT: return zs_rsqrt(x);
    case ZSK_POW: return zs_pow(x, c->p0);
    case ZSK_SIN: return zs_sin(x);
    case ZSK_COS: return zs_cos(x);
    case ZSK_TANH: return zs_tanh(x);
    case ZSK_SIGMOID: return zs_sigmoid(x);
    case ZSK_RELU: return zs_relu(x);
    case ZSK_GELU_ERF: return zs_gelu(x, ZS_GELU_ERF);
    case ZSK_GELU_TANH: return zs_gelu(x, ZS_GELU_TANH);
    case ZSK_SILU: return zs_silu(x);
    case ZSK_ABS: return zs_abs(x);
    case ZSK_CLAMP: return zs_clamp(x, c->p0, c->p1);
    default: return NULL;
    }
}

/* Deterministic uniform [0, 1) (splitmix64). */
static double urand(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return (double)((z ^ (z >> 31)) >> 11) * 0x1p-53;
}

/* |y - ref| scaled as in the file comment; NaN/inf must match exactly. */
static double err_of(double y, double ref, double tiny)
{
    if (isnan(ref) || isnan(y))
        return isnan(ref) && isnan(y) ? 0 : INFINITY;
    if (isinf(ref) || isinf(y))
        return y == ref ? 0 : INFINITY;
    if (fabs(ref) < tiny)
        return fabs(y - ref) <= tiny ? 0 : INFINITY;
    return fabs(y - ref) / fabs(ref);
}

/* An input of shape [7, 13] with values in [lo, hi]: layout 0 contiguous,
 * 1 a transposed view of [13, 7], 2 every other element of [7, 26]. */
static zs_tensor *make_input(zs_dtype dt, int layout, double lo, double hi,
                             uint64_t seed)
{
    double v[7 * 26];
    for (int i = 0; i < 7 * 26; i++)
        v[i] = lo + (hi - lo) * urand(&seed);
    zs_tensor *base, *x;
    if (layout == 1) {
        base = zs_from_data(ZS_F64, ZS_SHAPE(13, 7), v);
        x = zs_transpose(base, 0, 1);
    } else if (layout == 2) {
        base = zs_from_data(ZS_F64, ZS_SHAPE(7, 26), v);
        x = zs_slice(base, 1, 0, 26, 2);
    } else {
        base = zs_from_data(ZS_F64, ZS_SHAPE(7, 13), v);
        x = zs_retain(base);
    }
    zs_release(base);
    if (dt == ZS_F64)
        return x;
    /* an f32 tensor with the same (non-contiguous) layout */
    int64_t shp[2] = {layout == 1 ? 13 : 7, layout == 1 ? 7 : layout == 2 ? 26 : 13};
    zs_tensor *wide = zs_zeros(ZS_F32, 2, shp);
    zs_tensor *view = layout == 1 ? zs_transpose(wide, 0, 1)
                      : layout == 2 ? zs_slice(wide, 1, 0, 26, 2)
                                    : zs_retain(wide);
    zs_copy_(view, x);
    zs_release(wide);
    zs_release(x);
    return view;
}

/* ---- forward through the operators ------------------------------------- */

static void test_forward(zs_dtype dt)
{
    for (int ci = 0; ci < NCASES; ci++) {
        const op_case *c = &cases[ci];
        for (int layout = 0; layout < 3; layout++) {
            uint64_t seed = 1000 + (uint64_t)(ci * 3 + layout);
            zs_tensor *x = make_input(dt, layout, c->lo, c->hi, seed);
            zs_tensor *y = run_op(c, x);
            double worst = 0;
            ZT_CHECK(y && y->dtype == dt && y->ndim == 2 && y->shape[0] == 7 &&
                     y->shape[1] == 13 && zs_is_contiguous(y),
                     "%s: result shape/dtype", c->name);
            for (int64_t i = 0; y && i < 91; i++) {
                double ref = ref_eval(c->k, zs_get(x, i), c->p0, c->p1);
                double e = err_of(zs_get(y, i), ref, dt == ZS_F32 ? 1e-30 : 1e-300);
                worst = e > worst ? e : worst;
            }
            double tol = dt == ZS_F32 ? 1e-6 : 1e-13;
            ZT_CHECK(worst <= tol, "%s %s layout %d: rel err %g > %g (seed %llu)",
                     c->name, zs_dtype_name(dt), layout, worst, tol,
                     (unsigned long long)seed);
            zs_release(x);
            zs_release(y);
        }
    }
}

/* Strided inputs go through a gather buffer: results equal the contiguous
 * ones bit for bit. */
static void test_strided_identical(void)
{
    int bad = 0;
    for (int ci = 0; ci < NCASES; ci++) {
        zs_tensor *xs = make_input(ZS_F32, 1, cases[ci].lo, cases[ci].hi, 77);
        zs_tensor *xc = zs_contiguous(xs);
        zs_tensor *ys = run_op(&cases[ci], xs), *yc = run_op(&cases[ci], xc);
        for (int64_t i = 0; i < 91; i++) {
            double a = zs_get(ys, i), b = zs_get(yc, i);
            bad += !(a == b || (isnan(a) && isnan(b)));
        }
        zs_release(xs);
        zs_release(xc);
        zs_release(ys);
        zs_release(yc);
    }
    ZT_CHECK(bad == 0, "%d strided results differ from contiguous ones", bad);
}

/* ---- wide-range sweep of the f32 kernels -------------------------------- */

#define SWEEP_N 200000

static void fill_sweep(float *x, int64_t n)
{
    static const float specials[] = {
        0.0f, -0.0f, INFINITY, -INFINITY, NAN, FLT_MIN, -FLT_MIN, 1e-45f,
        -1e-45f, FLT_MAX, -FLT_MAX, 1.0f, -1.0f, 0.625f, -0.625f, 88.7f,
        88.72f, 89.0f, -87.3f, -88.0f, -103.0f, -104.5f, 20.0f, -20.0f,
        20.5f, -20.5f, 1e-7f, -1e-7f, 1e30f, -1e30f, 0.5f, 2.0f, 100.0f,
    };
    int64_t ns = (int64_t)(sizeof specials / sizeof *specials);
    uint64_t s = 4242;
    for (int64_t i = 0; i < n; i++) {
        if (i < ns) {
            x[i] = specials[i];
        } else if (i % 2) {
            x[i] = (float)(-100 + 200 * urand(&s));   /* uniform [-100, 100] */
        } else { /* log-uniform magnitudes 1e-8 .. 1e3, both signs */
            double m = pow(10.0, -8 + 11 * urand(&s));
            x[i] = (float)(urand(&s) < 0.5 ? -m : m);
        }
    }
}

static void test_sweep(void)
{
    static const zsk_unop ops[] = {
        ZSK_EXP, ZSK_LOG, ZSK_SQRT, ZSK_RSQRT, ZSK_TANH, ZSK_SIGMOID,
        ZSK_SILU, ZSK_GELU_TANH, ZSK_GELU_ERF, ZSK_RELU, ZSK_ABS, ZSK_CLAMP,
        ZSK_SIN, ZSK_COS, ZSK_POW,
    };
    static const char *names[] = {
        [ZSK_EXP] = "exp", [ZSK_LOG] = "log", [ZSK_SQRT] = "sqrt",
        [ZSK_RSQRT] = "rsqrt", [ZSK_TANH] = "tanh", [ZSK_SIGMOID] = "sigmoid",
        [ZSK_SILU] = "silu", [ZSK_GELU_TANH] = "gelu_t", [ZSK_GELU_ERF] = "gelu_e",
        [ZSK_RELU] = "relu", [ZSK_ABS] = "abs", [ZSK_CLAMP] = "clamp",
        [ZSK_SIN] = "sin", [ZSK_COS] = "cos", [ZSK_POW] = "pow 1.5",
    };
    float *x = malloc(SWEEP_N * sizeof *x), *y = malloc(SWEEP_N * sizeof *y);
    fill_sweep(x, SWEEP_N);
    for (size_t k = 0; k < sizeof ops / sizeof *ops; k++) {
        for (int vec = 0; vec < 2; vec++) {
            zsk_unop op = ops[k];
            double p0 = op == ZSK_CLAMP ? -1.5 : op == ZSK_POW ? 1.5 : 0;
            double p1 = op == ZSK_CLAMP ? 2.5 : 0;
            zsk_unary_f32_contig(op, y, x, SWEEP_N, p0, p1, vec);
            double worst = 0;
            int64_t wi = 0;
            for (int64_t i = 0; i < SWEEP_N; i++) {
                double e = err_of(y[i], (float)ref_eval(op, x[i], p0, p1), 1e-30);
                if (e > worst) {
                    worst = e;
                    wi = i;
                }
            }
            ZT_CHECK(worst <= 1e-6, "sweep op %d %s: rel err %g at x = %.9g "
                     "(got %.9g, want %.9g)", (int)op,
                     vec ? "vector" : "fallback", worst, x[wi], y[wi],
                     ref_eval(op, x[wi], p0, p1));
            printf("%s %-8s %s %.2g", vec ? "," : "  sweep", names[op],
                   vec ? "vector" : "fallback", worst);
        }
        printf("\n");
    }
    free(x);
    free(y);
    printf("  AVX-512 f32 routines %s\n",
           zsk_unary_has_vector(ZSK_EXP) ? "tested" : "not available here");
}

/* ---- large tensors: pool + vector path, size % 16 != 0 ------------------ */

static void test_large(void)
{
    const int64_t n = 1000003;
    zs_tensor *x = zs_uniform(ZS_F32, ZS_SHAPE(n), -12, 12, 5);
    static const int pick[] = {0, 10, 11, 13, 14, 15, 12, 17};
    for (size_t j = 0; j < sizeof pick / sizeof *pick; j++) {
        const op_case *c = &cases[pick[j]];
        zs_tensor *y = run_op(c, x);
        const float *xv = zs_data(x), *yv = y ? zs_data(y) : NULL;
        double worst = y ? 0 : INFINITY;
        for (int64_t i = 0; y && i < n; i++) {
            double e = err_of(yv[i], (float)ref_eval(c->k, xv[i], c->p0, c->p1), 1e-30);
            worst = e > worst ? e : worst;
        }
        ZT_CHECK(worst <= 1e-6, "large %s: rel err %g", c->name, worst);
        zs_release(y);
    }
    zs_release(x);
}

/* ---- special values and documented domain behaviour -------------------- */

static void test_specials(void)
{
    zs_tensor *x = zs_from_data(ZS_F32, ZS_SHAPE(4), (float[]){-2, -0.5f, 0, 4});
    zs_tensor *p = zs_pow(x, 1.5), *q = zs_pow(x, 3), *l = zs_log(x);
    ZT_CHECK(p && isnan(zs_get(p, 0)) && isnan(zs_get(p, 1)) && zs_get(p, 2) == 0 &&
             zs_get(p, 3) == 8, "pow(neg, 1.5) is NaN as in libm");
    ZT_CHECK(q && zs_get(q, 0) == -8, "pow(-2, 3) = -8");
    ZT_CHECK(l && isnan(zs_get(l, 0)) && zs_get(l, 2) == -INFINITY,
             "log(-2) NaN, log(0) = -inf");
    zs_tensor *s = zs_scalar(ZS_F64, -1.5), *e = zs_exp(s);
    ZT_CHECK(e && e->ndim == 0 && fabs(zs_item(e) - exp(-1.5)) < 1e-15, "0-d exp");
    zs_tensor *z = zs_zeros(ZS_F32, ZS_SHAPE(0, 3)), *ez = zs_tanh(z);
    ZT_CHECK(ez && zs_numel(ez) == 0 && ez->shape[1] == 3, "empty tanh");
    zs_release(x);
    zs_release(p);
    zs_release(q);
    zs_release(l);
    zs_release(s);
    zs_release(e);
    zs_release(z);
    zs_release(ez);
}

/* ---- gradients ---------------------------------------------------------- */

typedef struct gc_case {
    const op_case *c;
    double lo, hi;       /* input magnitude range */
    bool signed_in;      /* random sign */
    double kinks[2];     /* keep inputs 0.05 away from these */
    int nkinks;
} gc_case;

static zs_tensor *gc_fn(void *ctx, zs_tensor **in)
{
    return run_op(((const gc_case *)ctx)->c, in[0]);
}

static zs_tensor *gc_input(const gc_case *g, uint64_t seed, bool transposed)
{
    double v[20];
    for (int i = 0; i < 20; i++) {
        double x;
        bool near;
        do {
            x = g->lo + (g->hi - g->lo) * urand(&seed);
            if (g->signed_in && urand(&seed) < 0.5)
                x = -x;
            near = false;
            for (int k = 0; k < g->nkinks; k++)
                near = near || fabs(x - g->kinks[k]) < 0.05;
        } while (near);
        v[i] = x;
    }
    zs_tensor *t = zs_from_data(ZS_F64, ZS_SHAPE(4, 5), v);
    if (!transposed)
        return t;
    zs_tensor *u = zs_transpose(t, 0, 1);
    zs_release(t);
    return u;
}

static void test_grad(void)
{
    const op_case pow0 = {"pow 0", ZSK_POW, 0, 0, 0, 0};
    const op_case pow1 = {"pow 1", ZSK_POW, 0, 0, 1, 0};
    const gc_case gcs[] = {
        {&cases[0], 0, 2, true, {0}, 0},         /* exp */
        {&cases[1], 0.3, 3, false, {0}, 0},      /* log */
        {&cases[2], 0.3, 3, false, {0}, 0},      /* sqrt */
        {&cases[3], 0.3, 3, false, {0}, 0},      /* rsqrt */
        {&cases[4], 0.1, 2, true, {0}, 0},       /* pow 2 */
        {&cases[5], 0.1, 2, true, {0}, 0},       /* pow 3 */
        {&cases[6], 0.3, 3, false, {0}, 0},      /* pow 0.5 */
        {&cases[7], 0.3, 3, false, {0}, 0},      /* pow -1.5 */
        {&pow0, 0.1, 2, true, {0}, 0},
        {&pow1, 0.1, 2, true, {0}, 0},
        {&cases[8], 0, 3, true, {0}, 0},         /* sin */
        {&cases[9], 0, 3, true, {0}, 0},         /* cos */
        {&cases[10], 0, 3, true, {0}, 0},        /* tanh */
        {&cases[11], 0, 6, true, {0}, 0},        /* sigmoid */
        {&cases[12], 0.05, 2, true, {0}, 0},     /* relu */
        {&cases[13], 0, 4, true, {0}, 0},        /* gelu erf */
        {&cases[14], 0, 4, true, {0}, 0},        /* gelu tanh */
        {&cases[15], 0, 6, true, {0}, 0},        /* silu */
        {&cases[16], 0.05, 2, true, {0}, 0},     /* abs */
        {&cases[17], 0, 3, true, {-1, 2}, 2},    /* clamp [-1, 2] */
    };
    for (size_t i = 0; i < sizeof gcs / sizeof *gcs; i++) {
        for (int tr = 0; tr < 2; tr++) {
            zs_tensor *x = gc_input(&gcs[i], 300 + i, tr);
            zs_set_requires_grad(x, true);
            char name[64];
            snprintf(name, sizeof name, "%s%s", gcs[i].c->name,
                     tr ? " (transposed)" : "");
            ZT_GRADCHECK(name, gc_fn, (void *)&gcs[i], 1, &x);
            zs_release(x);
        }
    }
    /* relu's gradient is exactly g * (x > 0) */
    zs_tensor *x = zs_from_data(ZS_F64, ZS_SHAPE(4), (double[]){-1, 0, 0.5, 2});
    zs_set_requires_grad(x, true);
    zs_tensor *y = zs_relu(x), *s = zs_sum(y, 0, NULL, false);
    ZT_CHECK(zs_backward(s, NULL, false) == ZS_OK, "relu backward");
    zs_tensor *g = zs_grad(x);
    ZT_CHECK(g && zs_get(g, 0) == 0 && zs_get(g, 1) == 0 && zs_get(g, 2) == 1 &&
             zs_get(g, 3) == 1, "relu grad mask");
    zs_release(s);
    zs_release(y);
    zs_release(x);
    ZT_CHECK(zs_autograd_live_nodes() == 0, "tape freed");
}

/* ---- tanh GeLU backward: the fused vector pass ------------------------- */

/* zs_gelu(x, ZS_GELU_TANH)'s backward on f32 and bf16 runs the vector
 * kernel of linear_gelu_backward once (no unary_deriv, which evaluates in
 * double), on a strided x of an odd size (3 x 11 x 37: vector tails on 8
 * and 16 lanes) with a random upstream gradient, and matches
 * g gelu_tanh'(x) in double: within 1e-5 relative (f32; the kernel is
 * ~3e-7) or 1e-2 (bf16, one rounding of the result). The erf form keeps
 * unary_deriv. ctest reruns this under ZS_CPU_ISA=avx2 and portable. */
static void test_gelu_tanh_backward(void)
{
    const int64_t shape[3] = {37, 11, 3};
    const int perm[3] = {2, 1, 0};
    for (int p = 0; p < 3; p++) {
        zs_dtype dt = p == 1 ? ZS_BF16 : ZS_F32;
        bool tanh_form = p < 2;
        zs_tensor *x32 = zt_rand(ZS_F32, 3, shape, 70 + (uint64_t)p);
        zs_tensor *g32 = zt_rand(ZS_F32, 3, (int64_t[]){3, 11, 37}, 80 + (uint64_t)p);
        zs_tensor *x4 = zs_mul_scalar(x32, 4.0); /* [-4, 4): both tails */
        zs_tensor *g = zs_to_dtype(g32, dt), *base = x4 ? zs_to_dtype(x4, dt) : NULL;
        zs_set_requires_grad(base, true);
        zs_tensor *xv = zs_permute(base, perm); /* [3, 11, 37], strided */
        zs_profile_reset();
        zs_profile_enable(true);
        zs_tensor *y = zs_gelu(xv, tanh_form ? ZS_GELU_TANH : ZS_GELU_ERF);
        ZT_CHECK(y && zs_backward(y, g, false) == ZS_OK, "gelu backward");
        zs_profile_enable(false);
        zs_op_stat st[64];
        int n = zs_profile_stats(st, 64), fused = 0, deriv = 0;
        for (int i = 0; i < n; i++) {
            fused += strcmp(st[i].name, "linear_gelu_backward") ? 0 : (int)st[i].calls;
            deriv += strcmp(st[i].name, "unary_deriv") ? 0 : (int)st[i].calls;
        }
        ZT_CHECK(tanh_form ? fused == 1 && deriv == 0 : fused == 0 && deriv == 1,
                 "gelu %s %s backward: linear_gelu_backward ran %d times, "
                 "unary_deriv %d", tanh_form ? "tanh" : "erf", zs_dtype_name(dt),
                 fused, deriv);
        zs_tensor *gx = base && zs_grad(base) ? zs_permute(zs_grad(base), perm) : NULL;
        if (tanh_form && gx) {
            double *x = zt_values(xv), *gv = zt_values(g), *got = zt_values(gx);
            double worst = 0;
            for (int64_t i = 0; i < zs_numel(g); i++) {
                double v = x[i], u = 1.5957691216057308 * (v + 0.044715 * v * v * v);
                double s = sig_ref(u);
                double d = s + v * s * (1 - s) * 1.5957691216057308 *
                                   (1 + 3 * 0.044715 * v * v);
                double e = fabs(got[i] - gv[i] * d) / (1 + fabs(gv[i] * d));
                worst = e > worst ? e : worst;
            }
            double tol = dt == ZS_F32 ? 1e-5 : 1e-2;
            ZT_CHECK(worst <= tol, "gelu tanh %s grad vs double: error %.3g > "
                     "%.0e", zs_dtype_name(dt), worst, tol);
            printf("  gelu tanh %s grad vs double: max error %.3g\n",
                   zs_dtype_name(dt), worst);
            free(x);
            free(gv);
            free(got);
        }
        ZT_CHECK(gx != NULL, "gelu %s grad", zs_dtype_name(dt));
        zs_tensor *rel[] = {x32, g32, x4, g, base, xv, y, gx};
        for (size_t i = 0; i < sizeof rel / sizeof *rel; i++)
            zs_release(rel[i]);
    }
    ZT_CHECK(zs_autograd_live_nodes() == 0, "tape freed");
}

/* ---- replay ----------------------------------------------------------- */

/* A recorded call holds its attributes whole (ops/op.h): running its
 * descriptor again on the same input with the node's attributes gives the
 * same bits, for every operator (parameters: pow's exponent, clamp's
 * bounds, gelu's form), and neg. */
static void test_replay(void)
{
    zs_tensor *x = zt_rand(ZS_F32, ZS_SHAPE(7, 9), 77);
    zs_tensor *xp = zs_abs(x); /* log, sqrt, pow: positive inputs */
    zs_set_requires_grad(x, true);
    zs_set_requires_grad(xp, true);
    int bad = 0, n = 0;
    for (int ci = 0; ci <= NCASES; ci++) {
        zs_tensor *in = ci < NCASES && cases[ci].lo >= 0 ? xp : x;
        zs_tensor *y = ci < NCASES ? run_op(&cases[ci], in) : zs_neg(in);
        const zsi_ctx *node = y ? zsi_ctx_of(y) : NULL;
        zs_tensor *r = NULL;
        if (node) {
            zs_no_grad_push();
            r = zsi_run((zsi_opdef *)node->op, 1, &in, zsi_node_attrs(node));
            zs_no_grad_pop();
        }
        bad += !r || memcmp(zs_data(r), zs_data(y), zs_nbytes(y)) != 0;
        n++;
        zs_release(r);
        zs_release(y);
    }
    ZT_CHECK(bad == 0, "%d of %d unary calls replayed from their node's "
             "attributes differ", bad, n);
    zs_release(xp);
    zs_release(x);
    ZT_CHECK(zs_autograd_live_nodes() == 0, "tape freed");
}

/* ---- errors -------------------------------------------------------------- */

static void test_errors(void)
{
    zs_tensor *i = zs_ones(ZS_I32, ZS_SHAPE(2, 3));
    char needle[64];
    for (int ci = 0; ci < NCASES; ci++) {
        const char *nm = ci >= 4 && ci <= 7 ? "pow"
                         : ci == 13 || ci == 14 ? "gelu" : cases[ci].name;
        snprintf(needle, sizeof needle, "%s: dtype i32 is not supported", nm);
        ZT_EXPECT_ERROR(run_op(&cases[ci], i) == NULL, needle);
    }
    ZT_EXPECT_ERROR(zs_neg(i) == NULL, "neg: dtype i32");
    zs_tensor *a = zs_ones(ZS_F32, ZS_SHAPE(3));
    ZT_EXPECT_ERROR(zs_clamp(a, 2, 1) == NULL, "clamp: bounds lo 2, hi 1, expected lo <= hi");
    ZT_EXPECT_ERROR(zs_clamp(a, NAN, 1) == NULL, "clamp: bounds");
    ZT_EXPECT_ERROR(zs_gelu(a, (zs_gelu_approx)7) == NULL, "gelu: approximation 7");
    zs_set_error("first");
    ZT_CHECK(zs_exp(NULL) == NULL && zs_clamp(NULL, 2, 1) == NULL &&
             zs_gelu(NULL, ZS_GELU_TANH) == NULL &&
             !strcmp(zs_last_error(), "first"), "NULL input keeps the first error");
    zs_clear_error();
    zs_release(a);
    zs_release(i);
}

int main(void)
{
    test_forward(ZS_F32);
    test_forward(ZS_F64);
    test_strided_identical();
    zt_section("forward vs float64 reference (f32, f64; contiguous, transposed, step 2)");
    test_sweep();
    zt_section("f32 kernels over a wide range (vector and fallback), specials");
    test_large();
    zt_section("large tensors (1000003 elements, threads, vector tail)");
    test_specials();
    zt_section("domain: pow of negative base, log(0), 0-d and empty");
    test_grad();
    zt_section("gradients (f64 gradcheck, contiguous and transposed)");
    test_gelu_tanh_backward();
    zt_section("tanh GeLU backward: one vector pass (f32, bf16) vs double");
    test_replay();
    zt_section("replay of recorded calls from the node's typed attributes");
    test_errors();
    zt_section("errors");
    return zt_done();
}
