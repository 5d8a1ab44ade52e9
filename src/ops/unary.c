/*
 * unary.c - elementwise functions of one tensor.
 */
#include "ops/internal.h"

static zs_status neg_bw(zsi_node *n, zs_tensor *g, zs_tensor **gin);
static zsi_op OP_NEG = {.name = "neg", .backward = neg_bw};

zs_tensor *zs_neg(zs_tensor *a)
{
    if (!a)
        return NULL;
    double t0 = zsi_op_begin(&OP_NEG);
    if (zsi_check_float("neg", a) != ZS_OK)
        return NULL;
    zs_tensor *out = zsi_new_tensor(a->dtype, a->ndim, a->shape);
    if (!out)
        return NULL;
    zsk_iter it;
    zsk_iter_init(&it, a->ndim, a->shape, 2, (const int64_t *[]){NULL, a->strides});
    zsk_binary_scalar(a->dtype, ZSK_MUL, &it, zs_data(out), zs_data(a), -1.0);
    zsi_node *n;
    if (zsi_record(&OP_NEG, out, 1, &a, &n) != ZS_OK) {
        zs_release(out);
        return NULL;
    }
    zsi_op_end(&OP_NEG, t0, (double)zs_numel(out), zsi_bytes(a), zsi_bytes(out));
    return out;
}

static zs_status neg_bw(zsi_node *n, zs_tensor *g, zs_tensor **gin)
{
    gin[0] = zs_neg(g);
    return gin[0] ? ZS_OK : ZS_ERR_NOMEM;
}
