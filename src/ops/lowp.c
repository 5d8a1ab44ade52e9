/*
 * lowp.c - zsi_via_f32_keep: the f32 kernel on f32 copies for 16-bit
 * kernels with several results or in-place inputs (batch norm). The dtype
 * checks of the operators with bf16 and f16 kernels are binary.c's shared
 * checks (zsi_check_float16_dtype, zsi_check_pair_float16).
 */
#include "ops/internal.h"

static bool lowp16(zs_dtype dt) { return dt == ZS_BF16 || dt == ZS_F16; }

/* t as a new f32 host copy when it is bf16 / f16, else t retained. */
static zs_tensor *widen(int device, zs_tensor *t)
{
    if (!t || !lowp16(t->dtype))
        return t ? zs_retain(t) : NULL;
    zs_tensor *r = zsi_new_tensor_on(device, ZS_F32, t->ndim, t->shape);
    if (r && zsi_copy_host(r, t) != ZS_OK) {
        zs_release(r);
        r = NULL;
    }
    return r;
}

zs_status zsi_via_f32_keep(const zsi_call *c, zs_tensor *out,
                           zsi_kernel_fn f32, uint64_t keep)
{
    zs_tensor *in32[ZSI_MAX_IN] = {0}, *o32[ZSI_MAX_OUT] = {0};
    zs_tensor *outs[ZSI_MAX_OUT] = {out};
    int nout = c->nout > 1 ? c->nout : 1;
    for (int k = 1; k < nout; k++)
        outs[k] = c->outs ? c->outs[k] : NULL;
    zsi_tracking_pause();
    zs_no_grad_push();
    zs_status st = ZS_OK;
    for (int i = 0; i < c->nin && st == ZS_OK; i++)
        if (!(in32[i] = keep >> i & 1 ? zs_retain(c->in[i]) : widen(c->device, c->in[i])))
            st = ZS_ERR_NOMEM;
    for (int k = 0; k < nout && st == ZS_OK; k++) {
        zs_tensor *t = outs[k];
        o32[k] = !t || !lowp16(t->dtype) ? (t ? zs_retain(t) : NULL)
                 : zsi_new_tensor_on(c->device, ZS_F32, t->ndim, t->shape);
        if (t && !o32[k])
            st = ZS_ERR_NOMEM;
    }
    if (st == ZS_OK) {
        zsi_call c32 = *c;
        c32.in = in32;
        c32.outs = o32;
        c32.key = c32.dtype = ZS_F32;
        st = f32(&c32, o32[0]);
    }
    for (int k = 0; k < nout && st == ZS_OK; k++)
        if (outs[k] && o32[k] != outs[k])
            st = zsi_copy_host(outs[k], o32[k]); /* rounds once */
    for (int k = 0; k < nout; k++)
        zs_release(o32[k]);
    for (int i = 0; i < c->nin; i++)
        zs_release(in32[i]);
    zs_no_grad_pop();
    zsi_tracking_resume();
    return st;
}
