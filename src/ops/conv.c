/*
 * conv.c - zs_conv2d: 2-D convolution, NCHW, with stride, padding,
 * dilation, groups and an optional bias (kernels in kernels/cpu/conv.c).
 *
 * x [N, C, H, W] (any layout), w [O, C/groups, KH, KW], bias [O] or NULL
 * -> y [N, O, OH, OW], OH = floor((H + 2*ph - dh*(KH-1) - 1)/sh) + 1.
 * Cost model: 2*N*O*OH*OW*(C/groups)*KH*KW FLOPs (+ N*O*OH*OW for the
 * bias); bytes = inputs + output.
 *
 * A descriptor run by zsi_run (ops/op.h): infer checks dtypes, shapes
 * and parameters, the CPU kernel (f32, f64) reads w and bias contiguous.
 *
 * Backward calls the kernels directly (first derivatives only; the rule is
 * not itself differentiable): x and the contiguous w are saved; gradients
 * for x, w and bias are computed as zsi_needs_grad asks. Its cost is
 * counted under the operator "conv2d_backward".
 */
#include <string.h>

#include "kernels/cpu/conv.h"
#include "ops/internal.h"

static zs_status conv2d_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin);

static zsi_op OP_CONV2D_BW = {.name = "conv2d_backward"};

/* Reads p (NULL = defaults) into s's stride/padding/dilation/groups. */
static zs_status read_params(const zs_conv2d_params *p, zsk_conv2d_shape *s)
{
    zs_conv2d_params d = {{1, 1}, {0, 0}, {1, 1}, 1};
    if (p)
        d = *p;
    for (int i = 0; i < 2; i++) {
        if (d.stride[i] < 0 || d.dilation[i] < 0 || d.padding[i] < 0)
            return zs_set_error("conv2d: stride [%d, %d], padding [%d, %d] "
                                "and dilation [%d, %d] must not be negative",
                                d.stride[0], d.stride[1], d.padding[0],
                                d.padding[1], d.dilation[0], d.dilation[1]);
    }
    if (d.groups < 0)
        return zs_set_error("conv2d: groups %d must not be negative", d.groups);
    s->sh = d.stride[0] ? d.stride[0] : 1;
    s->sw = d.stride[1] ? d.stride[1] : 1;
    s->ph = d.padding[0];
    s->pw = d.padding[1];
    s->dh = d.dilation[0] ? d.dilation[0] : 1;
    s->dw = d.dilation[1] ? d.dilation[1] : 1;
    s->G = d.groups ? d.groups : 1;
    return ZS_OK;
}

static zs_status check_shapes(const zs_tensor *x, const zs_tensor *w,
                              const zs_tensor *b, zsk_conv2d_shape *s)
{
    char sx[96], sw[96], sb[96];
    zs_shape_str(x, sx, sizeof sx);
    zs_shape_str(w, sw, sizeof sw);
    if (x->ndim != 4)
        return zs_set_error("conv2d: input %s has %d dims, expected 4 "
                            "[N, C, H, W]", sx, x->ndim);
    if (w->ndim != 4)
        return zs_set_error("conv2d: weight %s has %d dims, expected 4 "
                            "[O, C/groups, KH, KW]", sw, w->ndim);
    s->N = x->shape[0], s->C = x->shape[1], s->H = x->shape[2], s->W = x->shape[3];
    s->O = w->shape[0], s->KH = w->shape[2], s->KW = w->shape[3];
    if (s->C % s->G || s->O % s->G)
        return zs_set_error("conv2d: input %s and weight %s: channels C = %lld "
                            "and O = %lld must be divisible by groups %lld", sx,
                            sw, (long long)s->C, (long long)s->O,
                            (long long)s->G);
    if (w->shape[1] != s->C / s->G)
        return zs_set_error("conv2d: weight %s has %lld input channels per "
                            "group, expected C/groups = %lld for input %s "
                            "with groups %lld", sw, (long long)w->shape[1],
                            (long long)(s->C / s->G), sx, (long long)s->G);
    if (s->KH < 1 || s->KW < 1)
        return zs_set_error("conv2d: weight %s has an empty kernel", sw);
    if (b && (b->ndim != 1 || b->shape[0] != s->O))
        return zs_set_error("conv2d: bias %s does not match weight %s, "
                            "expected [%lld]", zs_shape_str(b, sb, sizeof sb),
                            sw, (long long)s->O);
    s->OH = zsk_conv_out_size(s->H, s->KH, s->sh, s->ph, s->dh);
    s->OW = zsk_conv_out_size(s->W, s->KW, s->sw, s->pw, s->dw);
    if (s->OH <= 0 || s->OW <= 0)
        return zs_set_error("conv2d: input %s with weight %s, stride [%lld, "
                            "%lld], padding [%lld, %lld], dilation [%lld, "
                            "%lld] gives an empty output, expected (H + 2*pad "
                            "- dilation*(K-1) - 1) >= 0", sx, sw,
                            (long long)s->sh, (long long)s->sw,
                            (long long)s->ph, (long long)s->pw,
                            (long long)s->dh, (long long)s->dw);
    return ZS_OK;
}

static double conv_flops(const zsk_conv2d_shape *s)
{
    return 2.0 * (double)s->N * (double)s->O * (double)(s->OH * s->OW) *
           (double)(s->C / s->G) * (double)(s->KH * s->KW);
}

/* Inputs x, w (, bias); attributes: ptr = the zs_conv2d_params (NULL:
 * defaults). Node: p.i[8..14] = sh, sw, ph, pw, dh, dw, G; saved 0 x,
 * 1 the contiguous w. */
#define P_GEOM 8

static zs_status infer_conv(zsi_call *c)
{
    zs_tensor *x = c->in[0], *w = c->in[1], *b = c->nin > 2 ? c->in[2] : NULL;
    zsk_conv2d_shape s;
    if (c->nin < 2 || c->nin > 3)
        return zs_set_error("conv2d: %d inputs, expected x, w and an optional "
                            "bias", c->nin);
    if (zsi_check_pair_dtype("conv2d", x, w) != ZS_OK ||
        (b && zsi_check_pair_dtype("conv2d", x, b) != ZS_OK) ||
        read_params(c->a->ptr, &s) != ZS_OK || check_shapes(x, w, b, &s) != ZS_OK)
        return ZS_ERR_ARG;
    c->dtype = x->dtype;
    c->ndim = 4;
    int64_t os[4] = {s.N, s.O, s.OH, s.OW};
    memcpy(c->shape, os, sizeof os);
    return ZS_OK;
}

/* The geometry of an inferred call. */
static zsk_conv2d_shape call_shape(const zsi_call *c)
{
    const zs_tensor *x = c->in[0], *w = c->in[1];
    zsk_conv2d_shape s;
    read_params(c->a->ptr, &s);
    s.N = x->shape[0], s.C = x->shape[1], s.H = x->shape[2], s.W = x->shape[3];
    s.O = w->shape[0], s.KH = w->shape[2], s.KW = w->shape[3];
    s.OH = zsk_conv_out_size(s.H, s.KH, s.sh, s.ph, s.dh);
    s.OW = zsk_conv_out_size(s.W, s.KW, s.sw, s.pw, s.dw);
    return s;
}

/* The kernel reads w (and bias) contiguous; the contiguous w, which the
 * backward reads too, is handed to save as aux 0. */
static zs_status cpu_conv(const zsi_call *c, zs_tensor *out)
{
    zs_tensor *x = c->in[0], *bias = c->nin > 2 ? c->in[2] : NULL;
    zsk_conv2d_shape s = call_shape(c);
    zsi_tracking_pause();
    zs_no_grad_push();
    zs_tensor *wc = c->aux[0] = zs_contiguous(c->in[1]);
    zs_tensor *bc = bias ? zs_contiguous(bias) : NULL;
    zs_no_grad_pop();
    zsi_tracking_resume();
    zs_status st = ZS_ERR_NOMEM;
    if (wc && (bc || !bias))
        st = zsk_conv2d_forward(x->dtype, &s, zs_data(x), x->strides,
                                zs_data(wc), bc ? zs_data(bc) : NULL,
                                zs_data(out));
    zs_release(bc);
    return st;
}

static void save_conv(zsi_ctx *n, const zsi_call *c, zs_tensor *out)
{
    zsk_conv2d_shape s = call_shape(c);
    int64_t prm[] = {s.sh, s.sw, s.ph, s.pw, s.dh, s.dw, s.G};
    for (int i = 0; i < 7; i++)
        n->p.i[P_GEOM + i] = prm[i];
    zsi_save(n, 0, c->in[0]);
    zsi_save(n, 1, c->aux[0]);
}

static zsi_cost conv_cost(const zsi_call *c, const zs_tensor *out)
{
    zsk_conv2d_shape s = call_shape(c);
    bool b = c->nin > 2;
    return (zsi_cost){conv_flops(&s) + (b ? (double)zs_numel(out) : 0),
                      zsi_bytes(c->in[0]) + zsi_bytes(c->in[1]) +
                          (b ? zsi_bytes(c->in[2]) : 0),
                      zsi_bytes(out)};
}

zsi_opdef zsi_def_conv2d = {
    .op = {.name = "conv2d", .backward = conv2d_bw}, .infer = infer_conv,
    .kernel = {[ZS_CPU] = {[ZS_F32] = cpu_conv, [ZS_F64] = cpu_conv}},
    .save = save_conv, .cost = conv_cost};

zs_tensor *zs_conv2d(zs_tensor *x, zs_tensor *w, zs_tensor *bias,
                     const zs_conv2d_params *p)
{
    zsi_attrs at = {.ptr = p};
    return zsi_run(&zsi_def_conv2d, bias ? 3 : 2, (zs_tensor *[]){x, w, bias}, &at);
}

static zs_status conv2d_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin)
{
    double t0 = zsi_op_begin(&OP_CONV2D_BW);
    zs_tensor *x = n->saved[0], *w = n->saved[1];
    zsk_conv2d_shape s = {
        .N = x->shape[0], .C = x->shape[1], .H = x->shape[2], .W = x->shape[3],
        .O = w->shape[0], .KH = w->shape[2], .KW = w->shape[3],
        .OH = g->shape[2], .OW = g->shape[3],
        .sh = n->p.i[P_GEOM], .sw = n->p.i[P_GEOM + 1],
        .ph = n->p.i[P_GEOM + 2], .pw = n->p.i[P_GEOM + 3],
        .dh = n->p.i[P_GEOM + 4], .dw = n->p.i[P_GEOM + 5],
        .G = n->p.i[P_GEOM + 6]};
    bool nx = zsi_needs_grad(n, 0), nw = zsi_needs_grad(n, 1);
    bool nb = n->nin == 3 && zsi_needs_grad(n, 2);
    zs_tensor *gc = zs_contiguous(g);
    zs_tensor *gx = nx ? zsi_new_tensor(x->dtype, x->ndim, x->shape) : NULL;
    zs_tensor *gw = nw ? zsi_new_tensor(w->dtype, w->ndim, w->shape) : NULL;
    zs_tensor *gb = nb ? zsi_new_tensor(w->dtype, ZS_SHAPE(s.O)) : NULL;
    zs_status st = ZS_ERR_NOMEM;
    if (gc && (gx || !nx) && (gw || !nw) && (gb || !nb))
        st = zsk_conv2d_backward(x->dtype, &s, zs_data(x), x->strides,
                                 zs_data(w), zs_data(gc),
                                 gx ? zs_data(gx) : NULL,
                                 gw ? zs_data(gw) : NULL,
                                 gb ? zs_data(gb) : NULL);
    zs_release(gc);
    if (st != ZS_OK) {
        zs_release(gx);
        zs_release(gw);
        zs_release(gb);
        return st;
    }
    gin[0] = gx;
    gin[1] = gw;
    if (n->nin == 3)
        gin[2] = gb;
    double f = conv_flops(&s);
    zsi_op_end(&OP_CONV2D_BW, t0,
               (nx ? f : 0) + (nw ? f : 0) + (nb ? (double)zs_numel(g) : 0),
               zsi_bytes(g) + (nw ? zsi_bytes(x) : 0) + (nx ? zsi_bytes(w) : 0),
               (gx ? zsi_bytes(gx) : 0) + (gw ? zsi_bytes(gw) : 0) +
                   (gb ? zsi_bytes(gb) : 0));
    return ZS_OK;
}
