/*
 * ops/cuda_conv.c - the CUDA adapters of conv2d, conv2d_backward,
 * max_pool2d and max_pool2d_backward (f32), the contracts of ops/conv.c
 * and ops/pool.c (the descriptors' infer functions have checked shapes and
 * parameters; the geometry is recomputed here the same way). conv2d's aux
 * 0 is the contiguous weight; max_pool2d's aux 0 the i64 argmax indices
 * when a node is recorded. Kernels in kernels/cuda/conv.cu.
 */
#include <string.h>

#include "ops/cuda_internal.h"

#ifdef ZS_HAVE_CUDA

static int64_t out_size(int64_t n, int64_t k, int64_t s, int64_t p, int64_t d)
{
    return (n + 2 * p - d * (k - 1) - 1) / s + 1;
}

/* The geometry of x [N, C, H, W] with w [O, C/G, KH, KW] and params p. */
static zsk_cuda_conv conv_geom(const zs_tensor *x, const zs_tensor *w,
                               const zs_conv2d_params *p)
{
    zsk_cuda_conv s = {.N = x->shape[0], .C = x->shape[1], .H = x->shape[2],
                       .W = x->shape[3], .O = w->shape[0], .KH = w->shape[2],
                       .KW = w->shape[3], .G = p->groups ? p->groups : 1,
                       .sh = p->stride[0] ? p->stride[0] : 1,
                       .sw = p->stride[1] ? p->stride[1] : 1, .ph = p->padding[0],
                       .pw = p->padding[1], .dh = p->dilation[0] ? p->dilation[0] : 1,
                       .dw = p->dilation[1] ? p->dilation[1] : 1};
    s.OH = out_size(s.H, s.KH, s.sh, s.ph, s.dh);
    s.OW = out_size(s.W, s.KW, s.sw, s.pw, s.dw);
    return s;
}

static zsk_cuda_strides4 strides4(const zs_tensor *x)
{
    zsk_cuda_strides4 s;
    memcpy(s.s, x->strides, sizeof s.s);
    return s;
}

static zs_status k_conv(const zsi_call *c, zs_tensor *out)
{
    const conv_attrs *a = c->attrs;
    zs_tensor *x = c->in[0], *b = c->nin > 2 ? c->in[2] : NULL;
    zs_tensor *wc = zsi_aux_copy(c, 0, c->in[1], zs_contiguous); /* borrowed */
    zs_tensor *bc = b ? zsi_cuda_contig(b) : NULL;
    zs_status st = wc && (!b || bc) ? ZS_OK : ZS_ERR_NOMEM;
    zsk_cuda_conv s = conv_geom(x, c->in[1], &a->p);
    zsk_cuda_strides4 xs = strides4(x);
    if (st == ZS_OK)
        st = zsk_cuda_conv2d(&s, zsi_ptr(x), &xs, zsi_ptr(wc), bc ? zsi_ptr(bc) : NULL,
                             zsi_ptr(out));
    zs_release(bc);
    return st;
}

/* inputs x, w, g; results the wanted ones of gx, gw, gb in that order */
static zs_status k_conv_bw(const zsi_call *c, zs_tensor *out)
{
    const conv_bw_attrs *a = c->attrs;
    zs_tensor *x = c->in[0];
    zs_tensor *wc = zsi_cuda_contig(c->in[1]), *gc = zsi_cuda_contig(c->in[2]);
    float *r[3] = {0};
    int k = 0;
    if (a->gx)
        r[0] = zsi_ptr(c->outs[k++]);
    if (a->gw)
        r[1] = zsi_ptr(c->outs[k++]);
    if (a->gb)
        r[2] = zsi_ptr(c->outs[k++]);
    zs_status st = wc && gc ? ZS_OK : ZS_ERR_NOMEM;
    zsk_cuda_conv s = conv_geom(x, c->in[1], &a->p);
    zsk_cuda_strides4 xs = strides4(x);
    if (st == ZS_OK)
        st = zsk_cuda_conv2d_backward(&s, zsi_ptr(x), &xs, zsi_ptr(wc), zsi_ptr(gc),
                                      r[0], r[1], r[2]);
    zs_release(wc);
    zs_release(gc);
    return st;
}

/* pool.c's geometry (stride 0 = the kernel size) for an [N, C, H, W] input */
static zsk_cuda_pool pool_geom(int64_t N, int64_t C, int64_t H, int64_t W,
                               const zs_pool2d_params *p)
{
    zsk_cuda_pool s = {.N = N, .C = C, .H = H, .W = W, .kh = p->kernel[0],
                       .kw = p->kernel[1],
                       .sh = p->stride[0] ? p->stride[0] : p->kernel[0],
                       .sw = p->stride[1] ? p->stride[1] : p->kernel[1],
                       .ph = p->padding[0], .pw = p->padding[1]};
    s.OH = (H + 2 * s.ph - s.kh) / s.sh + 1;
    s.OW = (W + 2 * s.pw - s.kw) / s.sw + 1;
    return s;
}

static zs_status k_max_pool(const zsi_call *c, zs_tensor *out)
{
    const pool_attrs *a = c->attrs;
    const zs_tensor *x = c->in[0];
    zsk_cuda_pool s = pool_geom(x->shape[0], x->shape[1], x->shape[2], x->shape[3],
                                &a->p);
    if (zsi_call_records(c) && !zsi_aux_new(c, 0, ZS_I64, out->ndim, out->shape))
        return ZS_ERR_NOMEM;
    zsk_cuda_strides4 xs = strides4(x);
    return zsk_cuda_max_pool2d(&s, zsi_ptr(x), &xs, zsi_ptr(out),
                               c->aux[0] ? zsi_ptr(c->aux[0]) : NULL);
}

/* inputs g, indices; out [N, C, H, W] */
static zs_status k_max_pool_bw(const zsi_call *c, zs_tensor *out)
{
    const pool_bw_attrs *a = c->attrs;
    zs_tensor *gc = zsi_cuda_contig(c->in[0]), *ic = zsi_cuda_contig(c->in[1]);
    zsk_cuda_pool s = pool_geom(out->shape[0], out->shape[1], a->H, a->W, &a->p);
    zs_status st = gc && ic ? zsk_cuda_max_pool2d_backward(&s, zsi_ptr(gc), zsi_ptr(ic),
                                                           zsi_ptr(out))
                            : ZS_ERR_NOMEM;
    zs_release(gc);
    zs_release(ic);
    return st;
}

zs_status zsi_cuda_install_conv(void)
{
    zsi_cuda_kernel k[] = {
        {&zsi_def_conv2d, ZS_F32, k_conv},
        {&zsi_def_conv2d_backward, ZS_F32, k_conv_bw},
        {&zsi_def_max_pool, ZS_F32, k_max_pool},
        {&zsi_def_max_pool_backward, ZS_F32, k_max_pool_bw},
    };
    return zsi_cuda_install(k, sizeof k / sizeof *k);
}

#endif
