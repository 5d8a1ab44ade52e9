/*
 * lowp.c - dtype checks of the operators that have bf16 and f16 kernels
 * besides f32 and f64 (attention, conv2d, norms, softmax, losses,
 * reductions, pools, ...): those kernels read the 16-bit inputs directly,
 * compute in f32 and round their results once (kernels/cpu/lowp.h).
 */
#include "ops/internal.h"

static bool kernel_float(zs_dtype dt)
{
    return dt == ZS_F32 || dt == ZS_F64 || dt == ZS_BF16 || dt == ZS_F16;
}

zs_status zsi_check_float16_dtype(const char *op, const zs_tensor *t)
{
    if (!kernel_float(t->dtype))
        return zs_set_error("%s: dtype %s is not supported, expected f32, "
                            "f64, bf16 or f16 (convert with zs_to_dtype)", op,
                            zs_dtype_name(t->dtype));
    return ZS_OK;
}

zs_status zsi_check_pair_float16(const char *op, const zs_tensor *a,
                                 const zs_tensor *b)
{
    zs_status st = zsi_check_float16_dtype(op, a);
    if (st == ZS_OK)
        st = zsi_check_float16_dtype(op, b);
    if (st == ZS_OK && a->dtype != b->dtype)
        st = zs_set_error("%s: dtypes %s and %s differ, expected equal "
                          "(convert with zs_to_dtype)", op,
                          zs_dtype_name(a->dtype), zs_dtype_name(b->dtype));
    return st;
}
