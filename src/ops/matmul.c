/*
 * matmul.c - matrix products with numpy semantics, on the GEMM kernels.
 *
 * zs_matmul_t(a, b, ta, tb): a [..., M, K] (or [..., K, M] when ta), b
 * [..., K, N] (or [..., N, K] when tb) -> [..., M, N], batch dims broadcast.
 * zs_matmul promotes 1-D operands ([K] -> [1, K] on the left, [K, 1] on the
 * right) with differentiable views and squeezes the added dim from the
 * result.
 *
 * No copies for transposed or strided views: when the last two dims of an
 * operand have unit stride in either orientation, its row stride becomes
 * the GEMM's leading dimension and the orientation its transpose flag; only
 * other layouts are copied. A batched a [..., M, K] times a 2-D b folds the
 * batch into M (one large GEMM). Other batches loop over the broadcast batch
 * index, in parallel over the batch when each product is small.
 *
 * Backward (g: [..., M, N]): d op(a) = g op(b)^T, d op(b) = op(a)^T g,
 * expressed as matmul_t calls with the flags folded in, then summed over
 * broadcast batch dims (zsi_sum_to). Cost model: 2 M N K FLOPs per matrix.
 */
#include <stdlib.h>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/gemm_lowp.h"
#include "ops/internal.h"
#include "ops/attrs.h"

static zs_status matmul_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin);


/* FLOPs per product below which the batch loop runs in parallel (each
 * product then runs on one thread). */
#define SMALL_GEMM_FLOPS (2.0 * 96 * 96 * 96)

/* An operand as the GEMM sees it: stored rows of length ld, transposed or
 * not, and one element offset per output batch index. */
typedef struct operand {
    zs_tensor *t;     /* the tensor read (input, or a contiguous copy) */
    int64_t ld;
    bool trans;
} operand;

/* ops/internal.h */
bool zsi_mat_layout(const zs_tensor *x, bool trans, int64_t *ld, bool *t)
{
    int nd = x->ndim;
    int64_t R = x->shape[nd - 2], C = x->shape[nd - 1];
    int64_t sr = x->strides[nd - 2], sc = x->strides[nd - 1];
    int64_t wc = C > 1 ? C : 1, wr = R > 1 ? R : 1;
    if ((C <= 1 || sc == 1) && (R <= 1 || sr >= wc)) {
        *ld = R <= 1 ? wc : sr;
        *t = trans;
        return true;
    }
    if ((R <= 1 || sr == 1) && (C <= 1 || sc >= wr)) {
        *ld = C <= 1 ? wr : sc;
        *t = !trans;
        return true;
    }
    return false;
}

/* Fills op with x or a contiguous copy of x (new reference either way). */
static zs_status operand_init(operand *op, zs_tensor *x, bool trans)
{
    if (zsi_mat_layout(x, trans, &op->ld, &op->trans)) {
        op->t = zs_retain(x);
        return ZS_OK;
    }
    zsi_tracking_pause();
    zs_no_grad_push();
    zs_tensor *c = zs_clone(x);
    zs_no_grad_pop();
    zsi_tracking_resume();
    if (!c)
        return ZS_ERR_NOMEM;
    op->t = c;
    zsi_mat_layout(c, trans, &op->ld, &op->trans);
    return ZS_OK;
}

/* C = op(A) op(B) for inputs of dtype dt: f32 and f64 write C in their
 * dtype; bf16 and f16 accumulate in f32 and write f32 C (the BF16 and
 * F16 GEMMs). */
static void gemm(zs_dtype dt, const operand *a, const operand *b, int64_t M,
                 int64_t N, int64_t K, const void *A, const void *B, void *C)
{
    if (dt == ZS_F32)
        zsk_sgemm(a->trans, b->trans, M, N, K, 1.0f, A, a->ld, B, b->ld, 0.0f,
                  C, N);
    else if (dt == ZS_F64)
        zsk_dgemm(a->trans, b->trans, M, N, K, 1.0, A, a->ld, B, b->ld, 0.0,
                  C, N);
    else if (dt == ZS_F16)
        zsk_gemm_f16(a->trans, b->trans, M, N, K, 1.0f, A, a->ld, B, b->ld,
                     0.0f, C, N);
    else
        zsk_gemm_bf16(a->trans, b->trans, M, N, K, 1.0f, A, a->ld, B, b->ld,
                      0.0f, C, N);
}

typedef struct batch_job {
    zs_dtype dt;                /* of the inputs */
    const operand *a, *b;
    int64_t M, N, K;
    const int64_t *offa, *offb; /* element offsets per batch index */
    const char *A, *B;
    char *C;
    size_t esz, csz;            /* bytes per input and per output element */
} batch_job;

static void batch_range(void *p, int64_t i0, int64_t i1)
{
    const batch_job *j = p;
    for (int64_t i = i0; i < i1; i++)
        gemm(j->dt, j->a, j->b, j->M, j->N, j->K,
             j->A + (size_t)j->offa[i] * j->esz,
             j->B + (size_t)j->offb[i] * j->esz,
             j->C + (size_t)(i * j->M * j->N) * j->csz);
}

/* Offsets of x's matrices for every index of the broadcast batch shape. */
static void batch_offsets(const zs_tensor *x, int nb, const int64_t *bshape,
                          int64_t nbatch, int64_t *off)
{
    int64_t st[ZS_MAX_DIMS];
    zsk_broadcast_strides(x->ndim - 2, x->shape, x->strides, nb, bshape, st);
    for (int64_t i = 0; i < nbatch; i++) {
        int64_t rem = i, o = 0;
        for (int d = nb - 1; d >= 0; d--) {
            o += (rem % bshape[d]) * st[d];
            rem /= bshape[d];
        }
        off[i] = o;
    }
}

/* Runs the products of out = op(a) op(b) over the batch. */
static zs_status run_batched(zs_tensor *out, const operand *a,
                             const operand *b, int nb, const int64_t *bshape,
                             int64_t M, int64_t N, int64_t K)
{
    int64_t nbatch = zsi_shape_numel(nb, bshape);
    if (nbatch == 0 || M == 0 || N == 0)
        return ZS_OK;
    /* a [..., M, K] contiguous by rows times a 2-D b: one GEMM of
     * (nbatch * M) rows. */
    if (b->t->ndim == 2 && !a->trans && zs_is_contiguous(a->t) &&
        a->t->ndim - 2 == nb) {
        gemm(a->t->dtype, a, b, nbatch * M, N, K, zs_data(a->t), zs_data(b->t),
             zs_data(out));
        return ZS_OK;
    }
    int64_t *off = malloc(2 * (size_t)nbatch * sizeof *off);
    if (!off)
        return zs_set_error_code(ZS_ERR_NOMEM, "matmul: out of memory");
    batch_offsets(a->t, nb, bshape, nbatch, off);
    batch_offsets(b->t, nb, bshape, nbatch, off + nbatch);
    batch_job j = {a->t->dtype, a, b, M, N, K, off, off + nbatch,
                   zs_data(a->t), zs_data(b->t), zs_data(out),
                   zs_dtype_size(a->t->dtype), zs_dtype_size(out->dtype)};
    if (2.0 * (double)M * (double)N * (double)K < SMALL_GEMM_FLOPS)
        zs_parallel_for(nbatch, 1, batch_range, &j);
    else
        batch_range(&j, 0, nbatch);
    free(off);
    return ZS_OK;
}

static zs_status check_shapes(const zs_tensor *a, const zs_tensor *b, bool ta,
                              bool tb, int *nb, int64_t *bshape)
{
    char sa[96], sb[96];
    if (a->ndim < 2 || b->ndim < 2)
        return zs_set_error("matmul: operands %s and %s need at least 2 dims "
                            "(matmul_t) or 1 (matmul)",
                            zs_shape_str(a, sa, sizeof sa),
                            zs_shape_str(b, sb, sizeof sb));
    int64_t ka = a->shape[a->ndim - (ta ? 2 : 1)];
    int64_t kb = b->shape[b->ndim - (tb ? 1 : 2)];
    if (ka != kb)
        return zs_set_error("matmul: shapes %s%s and %s%s do not match, "
                            "inner dims %lld vs %lld",
                            zs_shape_str(a, sa, sizeof sa), ta ? "^T" : "",
                            zs_shape_str(b, sb, sizeof sb), tb ? "^T" : "",
                            (long long)ka, (long long)kb);
    int na = a->ndim - 2, nbb = b->ndim - 2, n = na > nbb ? na : nbb;
    for (int d = 0; d < n; d++) {
        int da = d - (n - na), db = d - (n - nbb);
        int64_t x = da >= 0 ? a->shape[da] : 1, y = db >= 0 ? b->shape[db] : 1;
        if (x != y && x != 1 && y != 1)
            return zs_set_error("matmul: batch dims of %s and %s cannot be "
                                "broadcast (%lld vs %lld)",
                                zs_shape_str(a, sa, sizeof sa),
                                zs_shape_str(b, sb, sizeof sb), (long long)x,
                                (long long)y);
        bshape[d] = x == 1 ? y : x;
    }
    *nb = n;
    return ZS_OK;
}

/* Attributes: op(a) = a^T when trans_a, op(b) = b^T when trans_b. */

static zs_status infer_matmul(zsi_call *c)
{
    const zs_tensor *a = c->in[0], *b = c->in[1];
    const matmul_attrs *at = c->attrs;
    bool ta = at->trans_a, tb = at->trans_b;
    if (zsi_check_same_float("matmul", a, b) != ZS_OK ||
        check_shapes(a, b, ta, tb, &c->ndim, c->shape) != ZS_OK)
        return ZS_ERR_ARG;
    c->shape[c->ndim] = a->shape[a->ndim - (ta ? 1 : 2)];     /* M */
    c->shape[c->ndim + 1] = b->shape[b->ndim - (tb ? 2 : 1)]; /* N */
    c->ndim += 2;
    c->dtype = a->dtype;
    return ZS_OK;
}

/* out = op(a) op(b) into out (f32, f64) or, for bf16 inputs, into an f32
 * tensor of out's shape. */
static zs_status run_matmul(const zsi_call *c, zs_tensor *out)
{
    zs_tensor *a = c->in[0], *b = c->in[1];
    const matmul_attrs *at = c->attrs;
    bool ta = at->trans_a, tb = at->trans_b;
    int nb = out->ndim - 2;
    int64_t M = out->shape[nb], N = out->shape[nb + 1];
    int64_t K = a->shape[a->ndim - (ta ? 2 : 1)];
    operand oa = {0}, ob = {0};
    zs_status st = operand_init(&oa, a, ta);
    if (st == ZS_OK)
        st = operand_init(&ob, b, tb);
    if (st == ZS_OK)
        st = run_batched(out, &oa, &ob, nb, out->shape, M, N, K);
    zs_release(oa.t);
    zs_release(ob.t);
    return st;
}

/* bf16 as one GEMM (a [..., M, K] by rows times a 2-D b, or 2-D times
 * 2-D): the f32 sums stay in the GEMM's per-thread block (no rows x N f32
 * buffer) and its epilogue writes out rounded to bf16 while each block is
 * in cache.
 * False when the product is batched (the caller then runs it into an f32
 * tensor and rounds that). */
static bool matmul_bf16_fused(const zsi_call *c, zs_tensor *out,
                              zs_status *st)
{
    zs_tensor *a = c->in[0], *b = c->in[1];
    const matmul_attrs *at = c->attrs;
    int nb = out->ndim - 2;
    int64_t M = out->shape[nb], N = out->shape[nb + 1];
    int64_t K = a->shape[a->ndim - (at->trans_a ? 2 : 1)];
    int64_t rows = zsi_shape_numel(nb, out->shape) * M;
    if (b->ndim != 2 || (a->ndim > 2 && (at->trans_a || !zs_is_contiguous(a))))
        return false;
    operand oa = {0}, ob = {0};
    *st = operand_init(&oa, a, at->trans_a);
    if (*st == ZS_OK)
        *st = operand_init(&ob, b, at->trans_b);
    if (*st == ZS_OK && rows > 0 && N > 0) {
        zsk_epilogue ep = {.out16 = zs_data(out), .ldo = N};
        zsk_gemm_bf16_ex(oa.trans, ob.trans, rows, N, K, 1.0f,
                         zs_data(oa.t), oa.ld, zs_data(ob.t), ob.ld, 0.0f,
                         NULL, N, &ep);
    }
    zs_release(oa.t);
    zs_release(ob.t);
    return true;
}

/* bf16 and f16: the BF16 / F16 GEMM (f32 accumulation), rounded once:
 * bf16 fused into the GEMM's epilogue for one GEMM, else into an f32
 * tensor rounded after. */
static zs_status run_matmul_bf16(const zsi_call *c, zs_tensor *out)
{
    zsi_tracking_pause();
    zs_status st = ZS_OK;
    /* the fused epilogue writes bf16 only: f16 takes the f32 tensor */
    if (out->dtype == ZS_BF16 && matmul_bf16_fused(c, out, &st)) {
        zsi_tracking_resume();
        return st;
    }
    zs_tensor *acc = zsi_new_tensor_on(c->device, ZS_F32, out->ndim, out->shape);
    st = acc ? run_matmul(c, acc) : ZS_ERR_NOMEM;
    if (st == ZS_OK)
        st = zsi_copy_host(out, acc); /* rounds to nearest even, once */
    zs_release(acc);
    zsi_tracking_resume();
    return st;
}

static void save_ab(zsi_ctx *n, const zsi_call *c, zs_tensor *out)
{
    zsi_save(n, 0, c->in[0]);
    zsi_save(n, 1, c->in[1]);
}

/* 2 M N K FLOPs per matrix of the batch */
static zsi_cost matmul_cost(const zsi_call *c, const zs_tensor *out)
{
    const zs_tensor *a = c->in[0];
    const matmul_attrs *at = c->attrs;
    double K = (double)a->shape[a->ndim - (at->trans_a ? 2 : 1)];
    return (zsi_cost){2.0 * (double)zs_numel(out) * K,
                      (double)(zs_nbytes(a) + zs_nbytes(c->in[1])),
                      (double)zs_nbytes(out)};
}

zsi_opdef zsi_def_matmul = {
    .op = {.name = "matmul", .backward = matmul_bw}, .arity = 2,
    .cls = ZSI_GEMM, .infer = infer_matmul,
    .kernel = {[ZS_CPU] = {[ZS_F32] = run_matmul, [ZS_F64] = run_matmul,
                           [ZS_BF16] = run_matmul_bf16,
                           [ZS_F16] = run_matmul_bf16}}, /* f16: the same, F16 GEMM */
    .save = save_ab, .cost = matmul_cost, .attr_size = sizeof(matmul_attrs),
    .bw_ops = (zsi_opdef *const[]){&zsi_def_matmul, &zsi_def_view, &zsi_def_copy,
                                   &zsi_def_sum, &zsi_def_to_dtype,
                                   &zsi_def_matmul_acc_, NULL}};

zs_tensor *zs_matmul_t(zs_tensor *a, zs_tensor *b, bool trans_a, bool trans_b)
{
    matmul_attrs at = {.trans_a = trans_a, .trans_b = trans_b};
    return zsi_run(&zsi_def_matmul, 2, (zs_tensor *[]){a, b}, &at);
}

/* ---- matmul_acc_: dst += op(a) op(b), in place ---------------------------
 * The in-place gradient accumulation of the backward rules (zsi_grad_acc):
 * a weight's gradient added into its leaf's .grad by the GEMM (beta 1)
 * instead of made whole and then added. dst [M, N] contiguous, a and b
 * 2-D (any layout; a contiguous copy where the GEMM cannot read one), all
 * f32 or all f64. Onto zeros the result has the bits of zs_matmul_t (the
 * same GEMM; 0 + v is v). No node is recorded. */
static zs_status infer_matmul_acc(zsi_call *c)
{
    const zs_tensor *d = c->in[0], *a = c->in[1], *b = c->in[2];
    const matmul_attrs *at = c->attrs;
    const char *op = c->def->op.name;
    char sd[96], sa[96], sb[96];
    if (zsi_check_pair_dtype(op, d, a) != ZS_OK || zsi_check_pair_dtype(op, a, b) != ZS_OK)
        return ZS_ERR_ARG;
    if (d->ndim != 2 || a->ndim != 2 || b->ndim != 2 || !zs_is_contiguous(d) ||
        a->shape[at->trans_a ? 1 : 0] != d->shape[0] ||
        b->shape[at->trans_b ? 0 : 1] != d->shape[1] ||
        a->shape[at->trans_a ? 0 : 1] != b->shape[at->trans_b ? 1 : 0])
        return zs_set_error("%s: destination %s += %s%s x %s%s: expected a contiguous "
                            "[M, N] destination and 2-D operands [M, K] x [K, N]", op,
                            zs_shape_str(d, sd, sizeof sd), zs_shape_str(a, sa, sizeof sa),
                            at->trans_a ? "^T" : "", zs_shape_str(b, sb, sizeof sb),
                            at->trans_b ? "^T" : "");
    c->dtype = d->dtype;
    c->ndim = 2;
    c->shape[0] = d->shape[0];
    c->shape[1] = d->shape[1];
    return ZS_OK;
}

static zs_status cpu_matmul_acc(const zsi_call *c, zs_tensor *dst)
{
    const matmul_attrs *at = c->attrs;
    int64_t M = dst->shape[0], N = dst->shape[1];
    int64_t K = c->in[1]->shape[at->trans_a ? 0 : 1];
    operand oa = {0}, ob = {0};
    zs_status st = operand_init(&oa, c->in[1], at->trans_a);
    if (st == ZS_OK)
        st = operand_init(&ob, c->in[2], at->trans_b);
    if (st == ZS_OK && M > 0 && N > 0) {
        if (dst->dtype == ZS_F32)
            zsk_sgemm(oa.trans, ob.trans, M, N, K, 1.0f, zs_data(oa.t), oa.ld,
                      zs_data(ob.t), ob.ld, 1.0f, zs_data(dst), N);
        else
            zsk_dgemm(oa.trans, ob.trans, M, N, K, 1.0, zs_data(oa.t), oa.ld,
                      zs_data(ob.t), ob.ld, 1.0, zs_data(dst), N);
    }
    zs_release(oa.t);
    zs_release(ob.t);
    return st;
}

/* 2 M N K FLOPs; a, b and dst read, dst written */
static zsi_cost matmul_acc_cost(const zsi_call *c, const zs_tensor *out)
{
    const matmul_attrs *at = c->attrs;
    double K = (double)c->in[1]->shape[at->trans_a ? 0 : 1];
    return (zsi_cost){2.0 * (double)zs_numel(out) * K,
                      (double)(zs_nbytes(c->in[1]) + zs_nbytes(c->in[2]) + zs_nbytes(out)),
                      (double)zs_nbytes(out)};
}

zsi_opdef zsi_def_matmul_acc_ = {
    .op = {.name = "matmul_acc_"}, .arity = 3, .inplace = true, .inplace_in0 = true,
    .cls = ZSI_GEMM,
    .infer = infer_matmul_acc, .cost = matmul_acc_cost,
    .attr_size = sizeof(matmul_attrs),
    .kernel = {[ZS_CPU] = {[ZS_F32] = cpu_matmul_acc, [ZS_F64] = cpu_matmul_acc}}};

zs_status zsi_matmul_acc_(zs_tensor *dst, zs_tensor *a, zs_tensor *b, bool trans_a,
                          bool trans_b)
{
    matmul_attrs at = {.trans_a = trans_a, .trans_b = trans_b};
    zs_tensor *r = zsi_run(&zsi_def_matmul_acc_, 3, (zs_tensor *[]){dst, a, b}, &at);
    zs_release(r);
    return r ? ZS_OK : ZS_ERR_ARG;
}

/* Whether dst (a gradient destination, or NULL) can take op(a) op(b)
 * through matmul_acc_: f32 or f64 like a and b (the 16-bit GEMMs round
 * their result; they keep the ordinary path). */
bool zsi_matmul_acc_ok(const zs_tensor *dst, const zs_tensor *a, const zs_tensor *b)
{
    return dst && (dst->dtype == ZS_F32 || dst->dtype == ZS_F64) &&
           a->dtype == dst->dtype && b->dtype == dst->dtype && a->device == dst->device &&
           b->device == dst->device && (unsigned)dst->device < ZS_MAX_DEVICES &&
           zsi_def_matmul_acc_.kernel[dst->device][dst->dtype];
}

/* Promotes 1-D operands, multiplies, squeezes the promoted dims. Views are
 * differentiable, so autograd flows through them. */
zs_tensor *zs_matmul(zs_tensor *a, zs_tensor *b)
{
    if (!a || !b)
        return NULL;
    if (a->ndim >= 2 && b->ndim >= 2)
        return zs_matmul_t(a, b, false, false);
    char sa[96], sb[96];
    if (a->ndim == 0 || b->ndim == 0) {
        zs_set_error("matmul: 0-d operand (shapes %s and %s), expected at "
                     "least 1 dim", zs_shape_str(a, sa, sizeof sa),
                     zs_shape_str(b, sb, sizeof sb));
        return NULL;
    }
    int64_t ka = a->shape[a->ndim - 1];
    int64_t kb = b->shape[b->ndim == 1 ? 0 : b->ndim - 2];
    if (ka != kb) {
        zs_set_error("matmul: shapes %s and %s do not match, inner dims "
                     "%lld vs %lld", zs_shape_str(a, sa, sizeof sa),
                     zs_shape_str(b, sb, sizeof sb), (long long)ka,
                     (long long)kb);
        return NULL;
    }
    bool pa = a->ndim == 1, pb = b->ndim == 1;
    zsi_tracking_pause();
    zs_tensor *a2 = pa ? zs_unsqueeze(a, 0) : zs_retain(a);
    zs_tensor *b2 = pb ? zs_unsqueeze(b, 1) : zs_retain(b);
    zs_tensor *o = zs_matmul_t(a2, b2, false, false);
    zs_tensor *o1 = pb && o ? zs_squeeze(o, -1) : zs_retain(o);
    zs_tensor *o2 = pa && o1 ? zs_squeeze(o1, -2 + pb) : zs_retain(o1);
    zs_release(a2);
    zs_release(b2);
    zs_release(o);
    zs_release(o1);
    zsi_tracking_resume();
    return zsi_track(o2);
}

/* out = op(a) op(b):
 *   d a = g op(b)^T          (!ta)   or  op(b) g^T  (ta)
 *   d b = op(a)^T g          (!tb)   or  g^T op(a)  (tb) */
/* Gradient of a 2-D b shared by a batched a [..., M, K] (not transposed):
 * the batch folds into the rows, so dB is one GEMM over [batch*M, K] and
 * [batch*M, N] instead of a [batch, K, N] product summed afterwards (for a
 * GPT's tied logits that temporary was batch x V x C floats). */
/* acc (zsi_grad_acc, or NULL): the product is added there instead, and
 * *done set (the result is NULL then). */
static zs_tensor *folded_grad_b(zs_tensor *a, zs_tensor *g, bool tb, zs_tensor *acc,
                                bool *done)
{
    int64_t K = a->shape[a->ndim - 1], N = g->shape[g->ndim - 1];
    int64_t rows = zsi_shape_numel(a->ndim - 1, a->shape); /* not -1: K or N may be 0 */
    zs_tensor *a2 = zs_reshape(a, 2, (int64_t[]){rows, K});
    zs_tensor *g2 = zs_reshape(g, 2, (int64_t[]){rows, N});
    zs_tensor *d = NULL;
    zs_tensor *x = tb ? g2 : a2, *y = tb ? a2 : g2;
    *done = false;
    if (a2 && g2 && zsi_matmul_acc_ok(acc, x, y))
        *done = zsi_matmul_acc_(acc, x, y, true, false) == ZS_OK;
    else if (a2 && g2)
        d = zs_matmul_t(x, y, true, false);
    zs_release(a2);
    zs_release(g2);
    return d;
}

static zs_status matmul_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin)
{
    zs_tensor *a = n->saved[0], *b = n->saved[1];
    const matmul_attrs *at = zsi_node_attrs(n);
    bool ta = at->trans_a, tb = at->trans_b;
    for (int i = 0; i < 2; i++) {
        if (!zsi_needs_grad(n, i))
            continue;
        zs_tensor *d;
        bool done = false;
        if (i == 1 && n->in_meta[1].ndim == 2 && a->ndim > 2 && !ta) {
            d = folded_grad_b(a, g, tb, zsi_grad_acc(n, 1), &done);
            if (done)
                continue; /* added into the leaf's gradient */
        } else if (i == 0) {
            d = ta ? zs_matmul_t(b, g, tb, true) : zs_matmul_t(g, b, false, !tb);
        } else {
            d = tb ? zs_matmul_t(g, a, true, ta) : zs_matmul_t(a, g, !ta, false);
        }
        gin[i] = d ? zsi_sum_to(d, &n->in_meta[i]) : NULL;
        zs_release(d);
        if (!gin[i])
            return ZS_ERR_NOMEM;
    }
    return ZS_OK;
}
