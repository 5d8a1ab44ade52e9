/*
 * unscale.c - zs_unscale_ (zs/ops.h): the loss scaler's one pass over a
 * gradient, as an in-place descriptor ("unscale_" over g and found_inf):
 * g *= inv_scale, and found_inf = 1 when an element of g was Inf or NaN
 * (torch._amp_foreach_non_finite_check_and_unscale_ for one tensor). The
 * flag stays on g's device, so a scaler checks many tensors and reads the
 * flag back once (src/optim/scaler.c). Not differentiable.
 */
#include <math.h>

#include "kernels/cpu/amp.h"
#include "ops/internal.h"

typedef struct unscale_attrs {
    double inv;
} unscale_attrs;
ZSI_ATTRS(unscale_attrs);

/* g: contiguous f32 or f64; found: one f32 element on g's device. */
static zs_status infer_unscale(zsi_call *c)
{
    const zs_tensor *g = c->in[0], *f = c->in[1];
    char a[96];
    if ((g->dtype != ZS_F32 && g->dtype != ZS_F64) || !zs_is_contiguous(g))
        return zs_set_error("unscale_: gradient %s %s%s, expected a contiguous f32 "
                            "or f64 tensor", zs_dtype_name(g->dtype),
                            zs_shape_str(g, a, sizeof a),
                            zs_is_contiguous(g) ? "" : " (strided)");
    if (f->dtype != ZS_F32 || zs_numel(f) != 1)
        return zs_set_error("unscale_: found_inf %s %s, expected one f32 element",
                            zs_dtype_name(f->dtype), zs_shape_str(f, a, sizeof a));
    zsi_out_like(c, g);
    return ZS_OK;
}

static zs_status cpu_unscale(const zsi_call *c, zs_tensor *g)
{
    const unscale_attrs *at = c->attrs;
    bool bad = g->dtype == ZS_F32 ? zsk_unscale_f32(zs_data(g), zs_numel(g), (float)at->inv)
                                  : zsk_unscale_f64(zs_data(g), zs_numel(g), at->inv);
    if (bad)
        *(float *)zs_data(c->in[1]) = 1.0f;
    return ZS_OK;
}

/* g read and written, one multiply per element */
static zsi_cost unscale_cost(const zsi_call *c, const zs_tensor *g)
{
    double n = (double)zs_nbytes(g);
    return (zsi_cost){(double)zs_numel(g), n + 4, n};
}

zsi_opdef zsi_def_unscale_ = {
    .op = {.name = "unscale_"}, .arity = 2, .inplace = true,
    .infer = infer_unscale, .cost = unscale_cost,
    .attr_size = sizeof(unscale_attrs),
    .kernel = {[ZS_CPU] = {[ZS_F32] = cpu_unscale, [ZS_F64] = cpu_unscale}},
};

zs_status zs_unscale_(zs_tensor *g, zs_tensor *found_inf, double inv_scale)
{
    if (!(inv_scale > 0) || isinf(inv_scale))
        return zs_set_error("unscale_: inverse scale %g, expected a finite value > 0",
                            inv_scale);
    unscale_attrs a = {inv_scale};
    zs_tensor *r = zsi_run(&zsi_def_unscale_, 2, (zs_tensor *[]){g, found_inf}, &a);
    if (!r)
        return ZS_ERR_ARG;
    zs_release(r);
    return ZS_OK;
}
