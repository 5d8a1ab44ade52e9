/*
 * ops/cuda_attention.c - the CUDA adapters of attention and
 * attention_backward (f32, bf16), the contract of ops/attention.c: q, k, v
 * read in place when their last dim has unit stride (else made
 * contiguous), kept as the forward's aux results 0..2, lse (f32
 * [B, H, Tq]) aux 3 when a node is recorded; the backward takes q, k, v,
 * out, lse, g and writes dq, dk, dv. ALiBi slopes (zs_alibi_slopes) are
 * copied to the GPU for each call. Kernels in kernels/cuda/attention.cu.
 */
#include <math.h>
#include <stdlib.h>

#include "ops/cuda_internal.h"
#include "zs/attention.h"

#ifdef ZS_HAVE_CUDA

static zs_tensor *unit_last(zs_tensor *t)
{
    return t->shape[3] <= 1 || t->strides[3] == 1 ? zs_retain(t) : zsi_cuda_contig(t);
}

/* The slopes of H heads on the GPU (a new tensor), or NULL with *st OK when
 * alibi is off. */
static zs_tensor *slopes_on_gpu(bool alibi, int64_t H, zs_status *st)
{
    *st = ZS_OK;
    if (!alibi || H == 0)
        return NULL;
    double *s = malloc((size_t)H * sizeof *s);
    zs_tensor *t = s ? zsi_cuda_empty(ZS_F64, 1, &H) : NULL;
    if (t)
        zs_alibi_slopes(H, s);
    *st = t ? zsi_device_copy(ZS_CUDA, zsi_ptr(t), s, (size_t)H * sizeof *s,
                              ZS_COPY_FROM_HOST)
            : zs_set_error_code(ZS_ERR_NOMEM, "attention: out of memory");
    free(s);
    if (*st != ZS_OK) {
        zs_release(t);
        return NULL;
    }
    return t;
}

static void fill(zsk_cuda_attn *a, const zsi_call *c, zs_tensor *const *qkv,
                 const zs_tensor *slopes)
{
    const attention_attrs *at = c->attrs;
    const zs_tensor *q = qkv[0], *k = qkv[1], *v = qkv[2];
    int64_t D = q->shape[3];
    double scale = at->scale != 0 ? at->scale : D > 0 ? 1 / sqrt((double)D) : 1;
    *a = (zsk_cuda_attn){.dt = q->dtype, .B = q->shape[0], .H = q->shape[1],
                         .Tq = q->shape[2], .Tk = k->shape[2], .D = D,
                         .q = zsi_ptr(q), .k = zsi_ptr(k), .v = zsi_ptr(v),
                         .scale = (float)scale, .causal = at->causal,
                         .q_offset = at->q_offset,
                         .slopes = slopes ? zsi_ptr(slopes) : NULL};
    for (int d = 0; d < 3; d++) {
        a->sq[d] = q->strides[d];
        a->sk[d] = k->strides[d];
        a->sv[d] = v->strides[d];
    }
}

static zs_status k_attention(const zsi_call *c, zs_tensor *out)
{
    const attention_attrs *at = c->attrs;
    for (int i = 0; i < 3; i++)
        if (!zsi_aux_copy(c, i, c->in[i], unit_last))
            return ZS_ERR_NOMEM;
    zs_status st;
    zs_tensor *slopes = slopes_on_gpu(at->alibi, c->in[0]->shape[1], &st);
    zsk_cuda_attn a;
    fill(&a, c, c->aux, slopes);
    if (st == ZS_OK && zsi_call_records(c) &&
        !zsi_aux_new(c, 3, ZS_F32, 3, (int64_t[]){a.B, a.H, a.Tq}))
        st = ZS_ERR_NOMEM;
    if (st == ZS_OK)
        st = zsk_cuda_attention_forward(&a, zsi_ptr(out),
                                        c->aux[3] ? zsi_ptr(c->aux[3]) : NULL);
    zs_release(slopes);
    return st;
}

/* inputs q, k, v, out, lse, g; results dq (this), dk, dv (c->outs) */
static zs_status k_attention_backward(const zsi_call *c, zs_tensor *dq)
{
    const attention_attrs *at = c->attrs;
    zs_tensor *t[6] = {unit_last(c->in[0]), unit_last(c->in[1]), unit_last(c->in[2]),
                       zsi_cuda_contig(c->in[3]), zsi_cuda_contig(c->in[4]),
                       zsi_cuda_contig(c->in[5])};
    zs_status st = ZS_OK;
    for (int i = 0; i < 6; i++)
        if (!t[i])
            st = ZS_ERR_NOMEM;
    zs_tensor *slopes = NULL, *delta = NULL;
    if (st == ZS_OK)
        slopes = slopes_on_gpu(at->alibi, dq->shape[1], &st);
    if (st == ZS_OK) {
        zsk_cuda_attn a;
        fill(&a, c, t, slopes);
        int64_t rows = a.B * a.H * a.Tq;
        if (!(delta = zsi_cuda_empty(ZS_F32, 1, &rows)))
            st = ZS_ERR_NOMEM;
        else
            st = zsk_cuda_attention_backward(&a, zsi_ptr(t[3]), zsi_ptr(t[4]),
                                             zsi_ptr(t[5]), zsi_ptr(delta), zsi_ptr(dq),
                                             zsi_ptr(c->outs[1]), zsi_ptr(c->outs[2]));
    }
    for (int i = 0; i < 6; i++)
        zs_release(t[i]);
    zs_release(slopes);
    zs_release(delta);
    return st;
}

zs_status zsi_cuda_install_attention(void)
{
    zsi_cuda_kernel k[] = {
        {&zsi_def_attention, ZS_F32, k_attention},
        {&zsi_def_attention, ZS_BF16, k_attention},
        {&zsi_def_attention_backward, ZS_F32, k_attention_backward},
        {&zsi_def_attention_backward, ZS_BF16, k_attention_backward},
    };
    return zsi_cuda_install(k, sizeof k / sizeof *k);
}

#endif
