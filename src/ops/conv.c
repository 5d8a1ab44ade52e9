/*
 * conv.c - zs_conv2d: 2-D convolution, NCHW, with stride, padding,
 * dilation, groups and an optional bias (kernels in kernels/cpu/conv.c).
 *
 * x [N, C, H, W] (any layout), w [O, C/groups, KH, KW], bias [O] or NULL
 * -> y [N, O, OH, OW], OH = floor((H + 2*ph - dh*(KH-1) - 1)/sh) + 1.
 * Cost model: 2*N*O*OH*OW*(C/groups)*KH*KW FLOPs (+ N*O*OH*OW for the
 * bias); bytes = inputs + output.
 *
 * A descriptor run by zsi_run (ops/op.h), attributes the params by value
 * (conv_attrs): infer checks dtypes, shapes and parameters, the CPU kernel
 * (f32, f64, bf16, f16: x, w and bias of one dtype, the output and the
 * gradients in it; bf16/f16 accumulate in f32, as torch) reads w and bias
 * contiguous.
 *
 * Backward (first derivatives only; the rule is not itself
 * differentiable): x and the contiguous w are saved; the rule runs the
 * descriptor "conv2d_backward" once, for the gradients of x, w and bias
 * that zsi_needs_grad asks for (zsi_run_n).
 * Its cost: 2*N*O*OH*OW*(C/groups)*KH*KW FLOPs for each of gx and gw,
 * N*O*OH*OW for gb; bytes = g (+ x for gw, + w for gx) read, the
 * gradients written.
 */
#include <string.h>

#include "kernels/cpu/conv.h"
#include "ops/internal.h"
#include "ops/attrs.h"

static zs_status conv2d_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin);

/* The attributes: the params by value (zeros: the defaults, stride 1, no
 * padding, dilation 1, one group). */

/* Reads p into s's stride/padding/dilation/groups (0 means 1 for stride,
 * dilation and groups); fails with a message naming op. */
static zs_status read_params(const char *op, const zs_conv2d_params *p,
                             zsk_conv2d_shape *s)
{
    const zs_conv2d_params d = *p;
    for (int i = 0; i < 2; i++) {
        if (d.stride[i] < 0 || d.dilation[i] < 0 || d.padding[i] < 0)
            return zs_set_error("%s: stride [%d, %d], padding [%d, %d] "
                                "and dilation [%d, %d] must not be negative",
                                op, d.stride[0], d.stride[1], d.padding[0],
                                d.padding[1], d.dilation[0], d.dilation[1]);
    }
    if (d.groups < 0)
        return zs_set_error("%s: groups %d must not be negative", op, d.groups);
    s->sh = d.stride[0] ? d.stride[0] : 1;
    s->sw = d.stride[1] ? d.stride[1] : 1;
    s->ph = d.padding[0];
    s->pw = d.padding[1];
    s->dh = d.dilation[0] ? d.dilation[0] : 1;
    s->dw = d.dilation[1] ? d.dilation[1] : 1;
    s->G = d.groups ? d.groups : 1;
    return ZS_OK;
}

static zs_status check_shapes(const char *op, const zs_tensor *x,
                              const zs_tensor *w, const zs_tensor *b,
                              zsk_conv2d_shape *s)
{
    char sx[96], sw[96], sb[96];
    zs_shape_str(x, sx, sizeof sx);
    zs_shape_str(w, sw, sizeof sw);
    if (x->ndim != 4)
        return zs_set_error("%s: input %s has %d dims, expected 4 "
                            "[N, C, H, W]", op, sx, x->ndim);
    if (w->ndim != 4)
        return zs_set_error("%s: weight %s has %d dims, expected 4 "
                            "[O, C/groups, KH, KW]", op, sw, w->ndim);
    s->N = x->shape[0], s->C = x->shape[1], s->H = x->shape[2], s->W = x->shape[3];
    s->O = w->shape[0], s->KH = w->shape[2], s->KW = w->shape[3];
    if (s->C % s->G || s->O % s->G)
        return zs_set_error("%s: input %s and weight %s: channels C = %lld "
                            "and O = %lld must be divisible by groups %lld", op,
                            sx, sw, (long long)s->C, (long long)s->O,
                            (long long)s->G);
    if (w->shape[1] != s->C / s->G)
        return zs_set_error("%s: weight %s has %lld input channels per "
                            "group, expected C/groups = %lld for input %s "
                            "with groups %lld", op, sw, (long long)w->shape[1],
                            (long long)(s->C / s->G), sx, (long long)s->G);
    if (s->KH < 1 || s->KW < 1)
        return zs_set_error("%s: weight %s has an empty kernel", op, sw);
    if (b && (b->ndim != 1 || b->shape[0] != s->O))
        return zs_set_error("%s: bias %s does not match weight %s, "
                            "expected [%lld]", op, zs_shape_str(b, sb, sizeof sb),
                            sw, (long long)s->O);
    s->OH = zsk_conv_out_size(s->H, s->KH, s->sh, s->ph, s->dh);
    s->OW = zsk_conv_out_size(s->W, s->KW, s->sw, s->pw, s->dw);
    if (s->OH <= 0 || s->OW <= 0)
        return zs_set_error("%s: input %s with weight %s, stride [%lld, "
                            "%lld], padding [%lld, %lld], dilation [%lld, "
                            "%lld] gives an empty output, expected (H + 2*pad "
                            "- dilation*(K-1) - 1) >= 0", op, sx, sw,
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

/* Inputs x, w (, bias); attributes conv_attrs. Node: saved 0 x, 1 the
 * contiguous w. */
static zs_status infer_conv(zsi_call *c)
{
    zs_tensor *x = c->in[0], *w = c->in[1], *b = c->nin > 2 ? c->in[2] : NULL;
    zsk_conv2d_shape s;
    if (c->nin < 2 || c->nin > 3)
        return zs_set_error("conv2d: %d inputs, expected x, w and an optional "
                            "bias", c->nin);
    if (zsi_check_pair_float16("conv2d", x, w) != ZS_OK ||
        (b && zsi_check_pair_float16("conv2d", x, b) != ZS_OK) ||
        read_params("conv2d", &((const conv_attrs *)c->attrs)->p, &s) != ZS_OK ||
        check_shapes("conv2d", x, w, b, &s) != ZS_OK)
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
    read_params("conv2d", &((const conv_attrs *)c->attrs)->p, &s);
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
    zs_tensor *wc = zsi_aux_copy(c, 0, c->in[1], zs_contiguous);
    zsi_tracking_pause();
    zs_no_grad_push();
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
    .kernel = {[ZS_CPU] = {[ZS_F32] = cpu_conv, [ZS_F64] = cpu_conv,
                           [ZS_BF16] = cpu_conv, [ZS_F16] = cpu_conv}},
    .save = save_conv, .cost = conv_cost, .attr_size = sizeof(conv_attrs),
    .bw_ops = (zsi_opdef *const[]){&zsi_def_conv2d_backward, NULL}};

zs_tensor *zs_conv2d(zs_tensor *x, zs_tensor *w, zs_tensor *bias,
                     const zs_conv2d_params *p)
{
    conv_attrs at = {0};
    if (p)
        at.p = *p;
    return zsi_run(&zsi_def_conv2d, bias ? 3 : 2, (zs_tensor *[]){x, w, bias}, &at);
}

/* ---- backward ---------------------------------------------------------- */

/* conv2d_backward: x [N, C, H, W] (any layout), w [O, C/groups, KH, KW]
 * and g [N, O, OH, OW] (any layout) -> the wanted gradients among gx
 * (x's shape, contiguous), gw (w's shape) and gb [O], in that order (so
 * 1 to 3 results, zsi_run_n). Attributes: the forward's params and which
 * gradients are wanted. x is read only for gw, w only for gx. Not
 * differentiable. */

static zs_status infer_conv_bw(zsi_call *c)
{
    const conv_bw_attrs *a = c->attrs;
    const zs_tensor *x = c->in[0], *w = c->in[1], *g = c->in[2];
    const char *op = "conv2d_backward";
    zsk_conv2d_shape s;
    if (zsi_check_pair_float16(op, x, w) != ZS_OK ||
        zsi_check_pair_float16(op, x, g) != ZS_OK ||
        read_params(op, &a->p, &s) != ZS_OK ||
        check_shapes(op, x, w, NULL, &s) != ZS_OK)
        return ZS_ERR_ARG;
    int64_t gs[4] = {s.N, s.O, s.OH, s.OW};
    if (g->ndim != 4 || memcmp(g->shape, gs, sizeof gs)) {
        char sg[96], se[96];
        return zs_set_error("%s: gradient %s, expected %s", op,
                            zs_shape_str(g, sg, sizeof sg),
                            zsi_shape_fmt(4, gs, se, sizeof se));
    }
    if (!a->gx && !a->gw && !a->gb)
        return zs_set_error("%s: no gradient wanted", op);
    const zs_tensor *like[2] = {x, w};
    zsi_meta r[3];
    int k = 0;
    for (int i = 0; i < 2; i++)
        if (i ? a->gw : a->gx) {
            r[k] = (zsi_meta){x->dtype, 4, {0}};
            memcpy(r[k++].shape, like[i]->shape, 4 * sizeof(int64_t));
        }
    if (a->gb)
        r[k++] = (zsi_meta){x->dtype, 1, {s.O}};
    c->dtype = r[0].dtype;
    c->ndim = r[0].ndim;
    memcpy(c->shape, r[0].shape, sizeof c->shape);
    for (int i = 1; i < k; i++)
        c->more[i - 1] = r[i];
    c->nout = k;
    return ZS_OK;
}

/* The geometry of an inferred backward call. */
static zsk_conv2d_shape bw_shape(const zsi_call *c)
{
    zsk_conv2d_shape s;
    read_params("conv2d_backward", &((const conv_bw_attrs *)c->attrs)->p, &s);
    check_shapes("conv2d_backward", c->in[0], c->in[1], NULL, &s);
    return s;
}

/* The kernel reads w and g contiguous (aliases when they are). */
static zs_status cpu_conv_bw(const zsi_call *c, zs_tensor *out)
{
    const conv_bw_attrs *a = c->attrs;
    const zs_tensor *x = c->in[0];
    zsk_conv2d_shape s = bw_shape(c);
    void *r[3] = {0};
    int k = 0;
    if (a->gx)
        r[0] = zs_data(c->outs[k++]);
    if (a->gw)
        r[1] = zs_data(c->outs[k++]);
    if (a->gb)
        r[2] = zs_data(c->outs[k++]);
    zsi_tracking_pause();
    zs_no_grad_push();
    zs_tensor *wc = zs_contiguous(c->in[1]), *gc = zs_contiguous(c->in[2]);
    zs_no_grad_pop();
    zsi_tracking_resume();
    zs_status st = ZS_ERR_NOMEM;
    if (wc && gc)
        st = zsk_conv2d_backward(x->dtype, &s, zs_data(x), x->strides,
                                 zs_data(wc), zs_data(gc), r[0], r[1], r[2]);
    zs_release(wc);
    zs_release(gc);
    return st;
}

static zsi_cost conv_bw_cost(const zsi_call *c, const zs_tensor *out)
{
    const conv_bw_attrs *a = c->attrs;
    zsk_conv2d_shape s = bw_shape(c);
    const zs_tensor *x = c->in[0], *w = c->in[1], *g = c->in[2];
    double f = conv_flops(&s);
    double gb = (double)s.O * (double)zs_dtype_size(g->dtype);
    return (zsi_cost){(a->gx ? f : 0) + (a->gw ? f : 0) +
                          (a->gb ? (double)zs_numel(g) : 0),
                      zsi_bytes(g) + (a->gw ? zsi_bytes(x) : 0) +
                          (a->gx ? zsi_bytes(w) : 0),
                      (a->gx ? zsi_bytes(x) : 0) + (a->gw ? zsi_bytes(w) : 0) +
                          (a->gb ? gb : 0)};
}

zsi_opdef zsi_def_conv2d_backward = {
    .op = {.name = "conv2d_backward"}, .arity = 3, .infer = infer_conv_bw,
    .kernel = {[ZS_CPU] = {[ZS_F32] = cpu_conv_bw, [ZS_F64] = cpu_conv_bw,
                           [ZS_BF16] = cpu_conv_bw, [ZS_F16] = cpu_conv_bw}},
    .cost = conv_bw_cost, .attr_size = sizeof(conv_bw_attrs)};

static zs_status conv2d_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin)
{
    conv_bw_attrs at = {((const conv_attrs *)zsi_node_attrs(n))->p,
                        zsi_needs_grad(n, 0), zsi_needs_grad(n, 1),
                        n->nin == 3 && zsi_needs_grad(n, 2)};
    int k = at.gx + at.gw + at.gb;
    zs_tensor *r[3] = {0};
    if (k == 0)
        return ZS_OK;
    zs_status st = zsi_run_n(&zsi_def_conv2d_backward, 3,
                             (zs_tensor *[]){n->saved[0], n->saved[1], g}, &at, k, r);
    if (st != ZS_OK)
        return st;
    k = 0;
    if (at.gx)
        gin[0] = r[k++];
    if (at.gw)
        gin[1] = r[k++];
    if (at.gb)
        gin[2] = r[k++];
    return ZS_OK;
}
