/*
 * linear.c - zs_linear, zs_linear_gelu, zs_linear_residual (zs/linear.h):
 * x [..., K] w^T [K, N] + b [N], then GeLU or + r [..., N].
 *
 * f32: one zsk_sgemm_ex call with x seen as an [M, K] matrix (M = product
 * of the leading dims) and w as op(B) = w^T; the bias, GeLU (storing the
 * pre-activation h when autograd records) and residual run in the GEMM's
 * epilogue, so the output is written once. Operands whose rows are not
 * unit-stride are copied first; a transposed 2-D x or w is read in place.
 * bf16 and f16: the 16-bit GEMM accumulates x w^T in f32; its epilogue
 * adds the 16-bit bias, applies GeLU and adds the 16-bit residual in f32
 * and writes the 16-bit output, rounded once (h, the saved pre-activation,
 * in the 16-bit type: half the bytes of f32, as PyTorch's autocast keeps
 * its 16-bit linear output). f64 composes matmul, add and gelu (same
 * math, used by gradient checks) and copies the result into the output.
 * Each is a descriptor run by zsi_run (ops/op.h): kernels f32, bf16 and
 * f16 (run_gemm) and f64 on the CPU; h is the kernel's aux result, made only
 * when a node is recorded; one node with the backward rule below.
 *
 * Backward (g: [..., N]): gh = g gelu'(h) (GeLU; bf16 and f32: one pass,
 * linear_gelu_backward, where the device has its kernel) or g; dx = gh w,
 * dw = gh^T x (over the flattened [M, N] and [M, K]), db = sum of gh over
 * rows, dr = g. Saved: x, w, and h for GeLU.
 * Cost model: 2 M N K FLOPs plus M N per bias and residual add and 30 per
 * GeLU (unary.c's count); bytes: inputs read, output (and h) written.
 */
#include <string.h>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/gemm_lowp.h"
#include "kernels/cpu/unary.h"
#include "ops/internal.h"
#include "ops/attrs.h"


static zs_status linear_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin);


#define GELU_FLOPS 30.0


/* ---- checks ------------------------------------------------------------ */

static zs_status check_inputs(const char *op, const zs_tensor *x,
                              const zs_tensor *w, const zs_tensor *b,
                              const zs_tensor *r)
{
    char s1[96], s2[96];
    if (zsi_check_same_float(op, x, w) != ZS_OK ||
        (b && zsi_check_same_float(op, x, b) != ZS_OK) ||
        (r && zsi_check_same_float(op, x, r) != ZS_OK))
        return ZS_ERR_ARG;
    if (x->dtype != ZS_F32 && x->dtype != ZS_F64 && x->dtype != ZS_BF16 &&
        x->dtype != ZS_F16)
        return zs_set_error("%s: dtype %s is not supported, expected f32, f64, "
                            "bf16 or f16", op, zs_dtype_name(x->dtype));
    if (x->ndim < 1)
        return zs_set_error("%s: input %s needs at least 1 dim [..., K]", op,
                            zs_shape_str(x, s1, sizeof s1));
    if (w->ndim != 2)
        return zs_set_error("%s: weight %s must be 2-D [N, K]", op,
                            zs_shape_str(w, s1, sizeof s1));
    int64_t K = x->shape[x->ndim - 1], N = w->shape[0];
    if (w->shape[1] != K)
        return zs_set_error("%s: input %s and weight %s do not match: "
                            "expected weight [%lld, %lld] (the input's last "
                            "dim is %lld)", op, zs_shape_str(x, s1, sizeof s1),
                            zs_shape_str(w, s2, sizeof s2), (long long)N,
                            (long long)K, (long long)K);
    if (b && (b->ndim != 1 || b->shape[0] != N))
        return zs_set_error("%s: bias %s does not match weight %s, expected "
                            "[%lld]", op, zs_shape_str(b, s1, sizeof s1),
                            zs_shape_str(w, s2, sizeof s2), (long long)N);
    if (r) {
        bool ok = r->ndim == x->ndim && r->shape[r->ndim - 1] == N;
        for (int d = 0; ok && d < x->ndim - 1; d++)
            ok = r->shape[d] == x->shape[d];
        if (!ok) {
            int64_t os[ZS_MAX_DIMS];
            memcpy(os, x->shape, sizeof os);
            os[x->ndim - 1] = N;
            char s3[96], s4[96];
            return zs_set_error("%s: residual %s does not match the output "
                                "%s (input %s, weight %s)", op,
                                zs_shape_str(r, s1, sizeof s1),
                                zsi_shape_fmt(x->ndim, os, s3, sizeof s3),
                                zs_shape_str(x, s2, sizeof s2),
                                zs_shape_str(w, s4, sizeof s4));
        }
    }
    return ZS_OK;
}

/* ---- f32: one fused GEMM ----------------------------------------------- */

/* A [rows, cols] matrix as the GEMM reads it: stored rows of length ld,
 * transposed or not; hold is a new reference to the tensor read. */
typedef struct mat {
    zs_tensor *hold;
    const void *p;
    int64_t ld;
    bool trans;
} mat;

/* t seen as [rows, cols]: 2-D views with a unit stride are read in place
 * (transposed when allow_trans), other layouts are made contiguous. */
static zs_status mat_init(mat *m, zs_tensor *t, int64_t rows, int64_t cols,
                          bool allow_trans)
{
    m->trans = false;
    m->ld = cols > 1 ? cols : 1;
    if (t->ndim == 2) {
        int64_t sr = t->strides[0], sc = t->strides[1];
        if ((cols <= 1 || sc == 1) && (rows <= 1 || sr >= cols)) {
            m->ld = rows <= 1 ? m->ld : sr;
            m->hold = zs_retain(t);
            m->p = zs_data(t);
            return ZS_OK;
        }
        if (allow_trans && (rows <= 1 || sr == 1) && (cols <= 1 || sc >= rows)) {
            m->trans = true;
            m->ld = cols <= 1 ? (rows > 1 ? rows : 1) : sc;
            m->hold = zs_retain(t);
            m->p = zs_data(t);
            return ZS_OK;
        }
    }
    zsi_tracking_pause();
    zs_no_grad_push();
    m->hold = zs_contiguous(t);
    zs_no_grad_pop();
    zsi_tracking_resume();
    if (!m->hold)
        return ZS_ERR_NOMEM;
    m->p = zs_data(m->hold);
    return ZS_OK;
}

static void mats_release(mat *m, int n)
{
    for (int i = 0; i < n; i++)
        zs_release(m[i].hold);
}

/* out = epilogue(x w^T) for f32, h (may be NULL) receiving the
 * pre-activation. */
/* The four operands of a linear as matrices: m[0] x [M, K], m[1] w
 * [N, K], m[2] the bias [1, N] and m[3] the residual [M, N] (left zero
 * when NULL). mats_release(m, 4) after, whatever the status. */
static zs_status mats_init(mat *m, zs_tensor *x, zs_tensor *w, zs_tensor *b, zs_tensor *r,
                           int64_t M, int64_t N, int64_t K)
{
    zs_status st = mat_init(&m[0], x, M, K, true);
    if (st == ZS_OK)
        st = mat_init(&m[1], w, N, K, true);
    if (st == ZS_OK && b)
        st = mat_init(&m[2], b, 1, N, false);
    if (st == ZS_OK && r)
        st = mat_init(&m[3], r, M, N, false);
    return st;
}

/* out = epilogue(x w^T) by one GEMM call for f32, bf16 and f16.
 * f32: zsk_sgemm_ex writes out, storing h (the f32 pre-activation) when
 * given. bf16 and f16: the 16-bit GEMM accumulates in f32 in its
 * per-thread block (no M x N f32 buffer: for the LM head's 2048 x 4096
 * that was 32 MiB per call); the epilogue adds the 16-bit bias, stores h
 * (the pre-activation rounded to out's dtype: GeLU's backward reads it),
 * applies GeLU to that rounded value (as PyTorch's autocast runs gelu on
 * the 16-bit linear output), adds the 16-bit residual, all in f32, and
 * writes out rounded once, while the block is in cache. (f16 composed
 * bias, GeLU and residual from operators over four M x N f32 temporaries
 * until 2026-11-27.) op(B) = w^T: w's rows (length K) read transposed. */
static zs_status run_gemm(lin_kind kind, zs_tensor *x, zs_tensor *w,
                          zs_tensor *b, zs_tensor *r, zs_tensor *out,
                          zs_tensor *h)
{
    int64_t K = w->shape[1], N = w->shape[0];
    int64_t M = zsi_shape_numel(x->ndim - 1, x->shape);
    if (M == 0 || N == 0)
        return ZS_OK;
    mat m[4] = {{0}};
    zs_status st = mats_init(m, x, w, b, r, M, N, K);
    if (st != ZS_OK) {
        mats_release(m, 4);
        return st;
    }
    zsk_epilogue ep = {.gelu = kind == LIN_GELU, .ldp = N, .ldr = m[3].ld};
    const void *bp = b ? m[2].p : NULL, *rp = r ? m[3].p : NULL;
    void *hp = h ? zs_data(h) : NULL;
    if (out->dtype == ZS_F32) {
        ep.bias = bp, ep.pre = hp, ep.res = rp;
        zsk_sgemm_ex(m[0].trans, !m[1].trans, M, N, K, 1.0f, m[0].p, m[0].ld, m[1].p,
                     m[1].ld, 0.0f, zs_data(out), N, &ep);
    } else {
        ep.bias16 = bp, ep.pre16 = hp, ep.res16 = rp;
        ep.out16 = zs_data(out), ep.ldo = N, ep.f16 = out->dtype == ZS_F16;
        (ep.f16 ? zsk_gemm_f16_ex : zsk_gemm_bf16_ex)(m[0].trans, !m[1].trans, M, N, K,
                                                       1.0f, m[0].p, m[0].ld, m[1].p,
                                                       m[1].ld, 0.0f, NULL, N, &ep);
    }
    mats_release(m, 4);
    return ZS_OK;
}

/* ---- f64: composed from operators --------------------------------------- */

/* Sets *out (and *h for GeLU when want_h) to new references; runs with
 * grad off and tracking paused. */
static zs_status run_f64(lin_kind kind, zs_tensor *x, zs_tensor *w,
                         zs_tensor *b, zs_tensor *r, bool want_h,
                         zs_tensor **out, zs_tensor **h)
{
    zs_tensor *wt = zs_transpose(w, 0, 1);
    zs_tensor *y = wt ? zs_matmul(x, wt) : NULL;
    zs_tensor *v = y && b ? zs_add(y, b) : zs_retain(y);
    zs_tensor *o = NULL;
    if (v && kind == LIN_GELU)
        o = zs_gelu(v, ZS_GELU_TANH);
    else if (v && kind == LIN_RESIDUAL)
        o = zs_add(v, r);
    else
        o = zs_retain(v);
    *out = o;
    *h = o && want_h && kind == LIN_GELU ? zs_retain(v) : NULL;
    zs_release(wt);
    zs_release(y);
    zs_release(v);
    return o ? ZS_OK : ZS_ERR_NOMEM;
}

/* ---- forward ------------------------------------------------------------ */

/* Inputs x, w, then b and r when given. Saved: 0 x, 1 w, 2 h (GeLU's
 * pre-activation: the kernel's aux 0, made only when a node is recorded;
 * in the output's dtype, bf16 for bf16); attributes: linear_attrs
 * (ops/attrs.h). */

static lin_kind kind_of(const zsi_call *c)
{
    return (lin_kind)((const linear_attrs *)c->attrs)->kind;
}

static zs_tensor *in_b(const zsi_call *c)
{
    const linear_attrs *a = c->attrs;
    return a->bias >= 0 ? c->in[a->bias] : NULL;
}

static zs_tensor *in_r(const zsi_call *c)
{
    const linear_attrs *a = c->attrs;
    return a->res >= 0 ? c->in[a->res] : NULL;
}

static zs_status infer_linear(zsi_call *c)
{
    const zs_tensor *x = c->in[0], *w = c->in[1];
    if (check_inputs(c->def->op.name, x, w, in_b(c), in_r(c)) != ZS_OK)
        return ZS_ERR_ARG;
    zsi_out_like(c, x);
    c->shape[x->ndim - 1] = w->shape[0];
    return ZS_OK;
}

/* h, GeLU's pre-activation (the output's dtype), as aux 0 when a node will
 * be recorded; NULL otherwise. */
static zs_status want_h(const zsi_call *c, zs_tensor *out, zs_dtype dt)
{
    if (kind_of(c) != LIN_GELU || !zsi_call_records(c))
        return ZS_OK;
    return zsi_aux_new(c, 0, dt, out->ndim, out->shape) ? ZS_OK : ZS_ERR_NOMEM;
}

/* f32, bf16 and f16 (run_gemm), with scope tracking
 * paused. */
static zs_status cpu_linear(const zsi_call *c, zs_tensor *out)
{
    zsi_tracking_pause();
    zs_status st = want_h(c, out, out->dtype);
    if (st == ZS_OK)
        st = run_gemm(
            kind_of(c), c->in[0], c->in[1], in_b(c), in_r(c), out, c->aux[0]);
    zsi_tracking_resume();
    return st;
}

/* f64: composed (grad off, tracking paused), then copied into out. */
static zs_status cpu_linear_f64(const zsi_call *c, zs_tensor *out)
{
    zs_tensor *o = NULL, *h = NULL;
    bool rec = zsi_call_records(c); /* before grad mode goes off */
    zsi_tracking_pause();
    zs_no_grad_push();
    zs_status st = run_f64(kind_of(c), c->in[0], c->in[1], in_b(c), in_r(c),
                           rec, &o, &h);
    zs_no_grad_pop();
    zsi_tracking_resume();
    if (st == ZS_OK)
        st = zsi_copy_host(out, o);
    if (h && c->aux[0]) { /* a replay: into the captured pre-activation */
        if (st == ZS_OK)
            st = zsi_copy_host(c->aux[0], h);
        zs_release(h);
    } else {
        c->aux[0] = h;
    }
    zs_release(o);
    return st;
}

static void save_linear(zsi_ctx *n, const zsi_call *c, zs_tensor *out)
{
    zsi_save(n, 0, c->in[0]);
    zsi_save(n, 1, c->in[1]);
    zsi_save(n, 2, c->aux[0]);
}

static zsi_cost linear_cost(const zsi_call *c, const zs_tensor *out)
{
    const zs_tensor *x = c->in[0], *w = c->in[1], *b = in_b(c), *r = in_r(c);
    bool gelu = kind_of(c) == LIN_GELU;
    double mn = (double)zs_numel(out);
    double flops = 2.0 * mn * (double)w->shape[1] + (b ? mn : 0) +
                   (gelu ? GELU_FLOPS * mn : 0) + (r ? mn : 0);
    double rd = zsi_bytes(x) + zsi_bytes(w) + (b ? zsi_bytes(b) : 0) +
                (r ? zsi_bytes(r) : 0);
    double h = gelu && out->node ? mn * (double)zs_dtype_size(x->dtype) : 0;
    return (zsi_cost){flops, rd, zsi_bytes(out) + h};
}

#define LINEAR_DEF(NAME)                                                      \
    {.op = {.name = NAME, .backward = linear_bw}, .cls = ZSI_GEMM,            \
     .infer = infer_linear,                                                   \
     .kernel = {[ZS_CPU] = {[ZS_F32] = cpu_linear, [ZS_BF16] = cpu_linear,    \
                            [ZS_F64] = cpu_linear_f64,                        \
                            [ZS_F16] = cpu_linear}},                          \
     .save = save_linear, .cost = linear_cost,                                \
     .attr_size = sizeof(linear_attrs),                                       \
     .bw_ops = (zsi_opdef *const[]){&zsi_def_deriv, &zsi_def_to_dtype,        \
                                    &zsi_def_mul, &zsi_def_matmul,            \
                                    &zsi_def_linear_gelu_backward,            \
                                    &zsi_def_view, &zsi_def_copy,             \
                                    &zsi_def_sum, &zsi_def_matmul_acc_, NULL}}

zsi_opdef zsi_def_linear = LINEAR_DEF("linear");
zsi_opdef zsi_def_linear_gelu = LINEAR_DEF("linear_gelu");
zsi_opdef zsi_def_linear_res = LINEAR_DEF("linear_residual");

static zs_tensor *linear_op(zsi_opdef *def, lin_kind kind, zs_tensor *x,
                            zs_tensor *w, zs_tensor *b, zs_tensor *r,
                            bool has_r)
{
    zs_tensor *in[4] = {x, w};
    int nin = 2, ib = -1, ir = -1;
    if (b)
        in[ib = nin++] = b;
    if (has_r)
        in[ir = nin++] = r;
    linear_attrs at = {.kind = kind, .bias = ib, .res = ir};
    return zsi_run(def, nin, in, &at);
}

zs_tensor *zs_linear(zs_tensor *x, zs_tensor *w, zs_tensor *b)
{
    return linear_op(&zsi_def_linear, LIN_PLAIN, x, w, b, NULL, false);
}

zs_tensor *zs_linear_gelu(zs_tensor *x, zs_tensor *w, zs_tensor *b)
{
    return linear_op(&zsi_def_linear_gelu, LIN_GELU, x, w, b, NULL, false);
}

zs_tensor *zs_linear_residual(zs_tensor *x, zs_tensor *w, zs_tensor *b,
                              zs_tensor *r)
{
    return linear_op(&zsi_def_linear_res, LIN_RESIDUAL, x, w, b, r, true);
}

/* ---- linear_gelu_backward: gh = g * gelu_tanh'(h) ----------------------- */

/* Inputs g and h, the same shape and dtype (bf16 or f32): one pass that
 * reads both and writes gh, the derivative computed in f32 (bf16: rounded
 * once) by vector code (zsk_gelu_tanh_bw: AVX-512, AVX2 + FMA or portable,
 * under ZS_CPU_ISA; relative error ~3e-7). Not differentiable (it runs in
 * backward). The GeLU backward of the bf16 and f32 models on the CPU (and
 * the test device); a device without this kernel (CUDA) runs unary_deriv
 * and mul instead (zsi_gelu_tanh_grad). Cost: GELU_FLOPS + 8 per element, where
 * unary_deriv + mul count 3 (src/analyze/engine_flops.c counts this
 * one). */
static zs_status infer_gelu_bw(zsi_call *c)
{
    const zs_tensor *g = c->in[0], *h = c->in[1];
    const char *op = c->def->op.name;
    char s1[96], s2[96];
    if (zsi_check_same_float(op, g, h) != ZS_OK)
        return ZS_ERR_ARG;
    if (g->dtype != ZS_BF16 && g->dtype != ZS_F32)
        return zs_set_error("%s: dtype %s is not supported, expected bf16 or "
                            "f32", op, zs_dtype_name(g->dtype));
    if (!zs_same_shape(g, h))
        return zs_set_error("%s: gradient %s and pre-activation %s differ in "
                            "shape", op, zs_shape_str(g, s1, sizeof s1),
                            zs_shape_str(h, s2, sizeof s2));
    zsi_out_like(c, g);
    return ZS_OK;
}

static zs_status cpu_gelu_bw(const zsi_call *c, zs_tensor *out)
{
    zs_tensor *g = zsi_contig_host(c->in[0]), *h = zsi_contig_host(c->in[1]);
    if (g && h)
        zsk_gelu_tanh_bw(out->dtype == ZS_BF16, zs_data(g), zs_data(h),
                         zs_data(out), zs_numel(out));
    zs_status st = g && h ? ZS_OK : ZS_ERR_NOMEM;
    zs_release(g);
    zs_release(h);
    return st;
}

static zsi_cost gelu_bw_cost(const zsi_call *c, const zs_tensor *out)
{
    double n = (double)zs_numel(out);
    return (zsi_cost){(GELU_FLOPS + 8) * n,
                      zsi_bytes(c->in[0]) + zsi_bytes(c->in[1]),
                      zsi_bytes(out)};
}

zsi_opdef zsi_def_linear_gelu_backward = {
    .op = {.name = "linear_gelu_backward"}, .arity = 2,
    .infer = infer_gelu_bw,
    .kernel = {[ZS_CPU] = {[ZS_F32] = cpu_gelu_bw, [ZS_BF16] = cpu_gelu_bw}},
    .cost = gelu_bw_cost};

static zs_tensor *gelu_bw_run(zs_tensor *g, zs_tensor *h)
{
    return zsi_run(&zsi_def_linear_gelu_backward, 2, (zs_tensor *[]){g, h},
                   NULL);
}

/* ---- backward ----------------------------------------------------------- */

/* g * gelu_tanh'(h), a new reference: one fused pass (f32, bf16) where
 * g's device has linear_gelu_backward's kernel for g's dtype and h has
 * that dtype too; else (CUDA; a bf16 g with an f32 h; f64) unary_deriv
 * and mul. Also zs_gelu's tanh-form backward (unary.c). */
zs_tensor *zsi_gelu_tanh_grad(zs_tensor *g, zs_tensor *h)
{
    if (g->dtype == h->dtype && (unsigned)g->device < ZS_MAX_DEVICES &&
        zsi_def_linear_gelu_backward.kernel[g->device][g->dtype])
        return gelu_bw_run(g, h);
    zs_tensor *d = zsi_unary_deriv(h, ZSK_GELU_TANH_GRAD, 0, 0);
    if (!d)
        return NULL;
    if (d->dtype != g->dtype) { /* bf16 model: h is f32 */
        zs_tensor *dl = zs_to_dtype(d, g->dtype);
        zs_release(d);
        d = dl;
    }
    zs_tensor *gh = d ? zs_mul(g, d) : NULL;
    zs_release(d);
    return gh;
}

/* The column sums [N] of a bf16 g2 [M, N] as ones[1, M] g2: the BF16
 * GEMM's skinny path reads g2 once, sums exact products in f32 and rounds
 * once (zsi_sum_to would first copy g2 to f32, and the bf16 sum kernel
 * reduces the leading dim slowly). On g2's device. */
static zs_tensor *col_sums_bf16(zs_tensor *g2)
{
    int64_t M = g2->shape[0], N = g2->shape[1];
    zs_tensor *ones = zsi_new_tensor_on(g2->device, ZS_BF16, 2, (int64_t[]){1, M});
    zs_tensor *s = ones && zs_fill_(ones, 1.0) == ZS_OK ? zs_matmul(ones, g2) : NULL;
    zs_tensor *r = s ? zs_reshape(s, 1, &N) : NULL;
    zs_release(ones);
    zs_release(s);
    return r;
}

/* dw = gh^T x and db = column sums of gh, over the flattened rows; dw
 * added into the weight's gradient in place where the engine offers it
 * (zsi_grad_acc: f32 and f64), so no [N, K] temporary is made. */
static zs_status weight_grads(zsi_ctx *n, zs_tensor *gh, zs_tensor **gin)
{
    const linear_attrs *a = zsi_node_attrs(n);
    zs_tensor *x = n->saved[0], *w = n->saved[1];
    int ib = (int)a->bias;
    int64_t N = w->shape[0], K = w->shape[1];
    zs_tensor *g2 = zs_reshape(gh, 2, (int64_t[]){-1, N});
    if (!g2)
        return ZS_ERR_NOMEM;
    bool in_place = false; /* dw added into the leaf's gradient */
    if (zsi_needs_grad(n, 1)) {
        zs_tensor *x2 = zs_reshape(x, 2, (int64_t[]){-1, K});
        zs_tensor *acc = zsi_grad_acc(n, 1);
        if (x2 && zsi_matmul_acc_ok(acc, g2, x2))
            in_place = zsi_matmul_acc_(acc, g2, x2, true, false) == ZS_OK;
        else
            gin[1] = x2 ? zs_matmul_t(g2, x2, true, false) : NULL;
        zs_release(x2);
    }
    if (ib >= 0 && zsi_needs_grad(n, ib)) /* column sums */
        gin[ib] = gh->dtype == ZS_BF16 ? col_sums_bf16(g2)
                                       : zsi_sum_to(g2, &n->in_meta[ib]);
    zs_release(g2);
    if ((zsi_needs_grad(n, 1) && !gin[1] && !in_place) ||
        (ib >= 0 && zsi_needs_grad(n, ib) && !gin[ib]))
        return ZS_ERR_NOMEM;
    return ZS_OK;
}

static zs_status linear_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin)
{
    const linear_attrs *a = zsi_node_attrs(n);
    zs_tensor *w = n->saved[1], *h = n->saved[2];
    int ir = (int)a->res;
    if (ir >= 0 && zsi_needs_grad(n, ir) && !(gin[ir] = zs_retain(g)))
        return ZS_ERR_NOMEM;
    zs_tensor *gh = h ? zsi_gelu_tanh_grad(g, h) : zs_retain(g);
    if (!gh)
        return ZS_ERR_NOMEM;
    zs_status st = ZS_OK;
    if (zsi_needs_grad(n, 0) && !(gin[0] = zs_matmul(gh, w)))
        st = ZS_ERR_NOMEM;
    if (st == ZS_OK)
        st = weight_grads(n, gh, gin);
    zs_release(gh);
    return st;
}
