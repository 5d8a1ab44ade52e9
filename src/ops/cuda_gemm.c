/*
 * ops/cuda_gemm.c - the CUDA adapters of matmul and linear (linear,
 * linear_gelu, linear_residual), f32 and bf16, on cuBLASLt
 * (kernels/cuda/gemm.c).
 *
 * matmul: each operand's last two dims are read in place when one
 * orientation has unit stride (its row stride the leading dimension, the
 * orientation folded into the transpose flag, as ops/matmul.c), else made
 * contiguous on the GPU. The broadcast batch runs as one strided-batched
 * call when every operand's matrices are equally spaced (broadcast: 0),
 * else one call per matrix. bf16 accumulates in f32 and rounds once.
 *
 * linear: x [..., K] (made contiguous) times w^T (w [N, K] read in place
 * when its rows have unit stride). f32 without GeLU or residual: one call
 * with cuBLASLt's bias epilogue. Otherwise the product goes to an f32
 * buffer and one epilogue kernel adds the bias, keeps the pre-activation h
 * (f32, linear_gelu's aux 0, when a node is recorded), applies GeLU (tanh
 * form, as the CPU) or adds the residual, and rounds once: the CPU's
 * run_bf16 order of operations.
 */
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/iter.h"
#include "ops/cuda_internal.h"

#ifdef ZS_HAVE_CUDA

/* A matrix operand: the tensor read (new reference), leading dim, flag. */
typedef struct operand {
    zs_tensor *t;
    int64_t ld;
    bool trans;
} operand;

static zs_status operand_init(operand *op, zs_tensor *x, bool trans)
{
    if (zsi_mat_layout(x, trans, &op->ld, &op->trans)) {
        op->t = zs_retain(x);
        return ZS_OK;
    }
    op->t = zsi_cuda_contig(x);
    if (!op->t)
        return ZS_ERR_NOMEM;
    zsi_mat_layout(op->t, trans, &op->ld, &op->trans);
    return ZS_OK;
}

/* Offsets of x's matrices for each index of the broadcast batch shape. */
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

/* True when off[i] = i * off[1] for every i (equally spaced). */
static bool uniform(const int64_t *off, int64_t n)
{
    for (int64_t i = 2; i < n; i++)
        if (off[i] != i * off[1])
            return false;
    return true;
}

static zs_status k_matmul(const zsi_call *c, zs_tensor *out)
{
    zs_tensor *a = c->in[0], *b = c->in[1];
    const matmul_attrs *at = c->attrs;
    int nb = out->ndim - 2;
    int64_t M = out->shape[nb], N = out->shape[nb + 1];
    int64_t K = a->shape[a->ndim - (at->trans_a ? 2 : 1)];
    int64_t nbatch = zsi_shape_numel(nb, out->shape);
    if (nbatch == 0 || M == 0 || N == 0)
        return ZS_OK;
    if (K == 0)
        return zsi_device_memset(ZS_CUDA, zsi_ptr(out), 0, zs_nbytes(out));
    operand oa = {0}, ob = {0};
    int64_t *off = NULL;
    zs_status st = operand_init(&oa, a, at->trans_a);
    if (st == ZS_OK)
        st = operand_init(&ob, b, at->trans_b);
    if (st == ZS_OK && !(off = malloc(2 * (size_t)nbatch * sizeof *off)))
        st = zs_set_error_code(ZS_ERR_NOMEM, "matmul: out of memory");
    if (st != ZS_OK)
        goto done;
    batch_offsets(oa.t, nb, out->shape, nbatch, off);
    batch_offsets(ob.t, nb, out->shape, nbatch, off + nbatch);
    size_t es = zs_dtype_size(a->dtype), os = zs_dtype_size(out->dtype);
    zsk_cuda_gemm_args g = {.in_dt = a->dtype, .out_dt = out->dtype,
                            .ta = oa.trans, .tb = ob.trans, .M = M, .N = N, .K = K,
                            .lda = oa.ld, .ldb = ob.ld, .ldc = N, .batch = nbatch,
                            .sa = nbatch > 1 ? off[1] : 0,
                            .sb = nbatch > 1 ? off[nbatch + 1] : 0, .sc = M * N};
    char *A = zsi_ptr(oa.t), *B = zsi_ptr(ob.t), *C = zsi_ptr(out);
    if (uniform(off, nbatch) && uniform(off + nbatch, nbatch)) {
        g.A = A, g.B = B, g.C = C;
        st = zsk_cuda_gemm(&g);
    } else {
        g.batch = 1;
        for (int64_t i = 0; st == ZS_OK && i < nbatch; i++) {
            g.A = A + (size_t)off[i] * es;
            g.B = B + (size_t)off[nbatch + i] * es;
            g.C = C + (size_t)(i * M * N) * os;
            st = zsk_cuda_gemm(&g);
        }
    }
done:
    free(off);
    zs_release(oa.t);
    zs_release(ob.t);
    return st;
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

static zs_status k_linear(const zsi_call *c, zs_tensor *out)
{
    const linear_attrs *at = c->attrs;
    zs_tensor *w = c->in[1], *b = in_b(c), *r = in_r(c);
    int64_t N = w->shape[0], K = w->shape[1];
    int64_t M = zsi_shape_numel(out->ndim - 1, out->shape);
    if (M == 0 || N == 0)
        return ZS_OK;
    bool gelu = at->kind == LIN_GELU;
    float *h = NULL;
    if (gelu && zsi_call_records(c)) {
        zs_tensor *ht = zsi_aux_new(c, 0, ZS_F32, out->ndim, out->shape);
        if (!ht)
            return ZS_ERR_NOMEM;
        h = zsi_ptr(ht);
    }
    operand ow = {0};
    zs_tensor *x = zsi_cuda_contig(c->in[0]);
    zs_tensor *bc = b ? zsi_cuda_contig(b) : NULL, *rc = r ? zsi_cuda_contig(r) : NULL;
    zs_tensor *acc = NULL;
    zs_status st = x && (!b || bc) && (!r || rc) ? ZS_OK : ZS_ERR_NOMEM;
    if (st == ZS_OK)
        st = operand_init(&ow, w, true); /* op(B) = w^T */
    bool direct = out->dtype == ZS_F32 && at->kind == LIN_PLAIN &&
                  (!b || b->dtype == ZS_F32);
    if (st == ZS_OK && !direct && out->dtype != ZS_F32 &&
        !(acc = zsi_cuda_empty(ZS_F32, out->ndim, out->shape)))
        st = ZS_ERR_NOMEM;
    if (st == ZS_OK && K == 0)
        st = zsi_device_memset(ZS_CUDA, zsi_ptr(acc ? acc : out), 0, (size_t)(M * N) * 4);
    if (st == ZS_OK && K > 0) {
        zsk_cuda_gemm_args g = {.in_dt = x->dtype, .out_dt = ZS_F32, .ta = false,
                                .tb = ow.trans, .M = M, .N = N, .K = K,
                                .A = zsi_ptr(x), .B = zsi_ptr(ow.t),
                                .C = zsi_ptr(acc ? acc : out), .lda = K,
                                .ldb = ow.ld, .ldc = N, .batch = 1,
                                .bias = direct && bc ? zsi_ptr(bc) : NULL};
        st = zsk_cuda_gemm(&g);
    }
    if (st == ZS_OK && (!direct || K == 0))
        st = zsk_cuda_linear_epilogue(M, N, zsi_ptr(acc ? acc : out),
                                      bc ? bc->dtype : ZS_F32,
                                      direct && K > 0 ? NULL : bc ? zsi_ptr(bc) : NULL,
                                      gelu, h, rc ? zsi_ptr(rc) : NULL, out->dtype,
                                      zsi_ptr(out));
    zs_release(ow.t);
    zs_release(x);
    zs_release(bc);
    zs_release(rc);
    zs_release(acc);
    return st;
}

zs_status zsi_cuda_install_gemm(void)
{
    zsi_cuda_kernel k[] = {
        {&zsi_def_matmul, ZS_F32, k_matmul},      {&zsi_def_matmul, ZS_BF16, k_matmul},
        {&zsi_def_linear, ZS_F32, k_linear},      {&zsi_def_linear, ZS_BF16, k_linear},
        {&zsi_def_linear_gelu, ZS_F32, k_linear}, {&zsi_def_linear_gelu, ZS_BF16, k_linear},
        {&zsi_def_linear_res, ZS_F32, k_linear},  {&zsi_def_linear_res, ZS_BF16, k_linear},
    };
    return zsi_cuda_install(k, sizeof k / sizeof *k);
}

#endif
