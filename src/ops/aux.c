/*
 * aux.c - the aux results of a kernel (ops/op.h, zsi_call.aux) made so
 * that a captured graph can replay the kernel (graph/graph.c).
 *
 * Eagerly the driver hands a kernel an aux array of NULLs and the kernel
 * stores new tensors there (norm statistics, dropout masks, attention's
 * log-sum-exp, max-pool indices, the contiguous or converted inputs its
 * backward reads). A replay hands the kernel the tensors the capture
 * made, because the recorded backward nodes read their storage: the
 * kernel must write into them, not make new ones. These two helpers are
 * the one place that decides: a supplied tensor is reused (and, for a
 * copy of an input, refreshed from the input), a missing one is made.
 * Both store the tensor in c->aux[k] (owned by the driver, or by the
 * graph node on replay) and return it borrowed.
 */
#include "ops/internal.h"

zs_tensor *zsi_aux_new(const zsi_call *c, int k, zs_dtype dt, int ndim,
                       const int64_t *shape)
{
    if (c->aux[k])
        return c->aux[k];
    zsi_tracking_pause();
    c->aux[k] = zsi_new_tensor_on(c->device, dt, ndim, shape);
    zsi_tracking_resume();
    return c->aux[k];
}

/* True when a is t itself or a header over the same elements. */
static bool same_view(const zs_tensor *a, const zs_tensor *t)
{
    if (a == t)
        return true;
    if (a->storage != t->storage || a->offset != t->offset ||
        a->dtype != t->dtype || a->ndim != t->ndim)
        return false;
    for (int d = 0; d < a->ndim; d++)
        if (a->shape[d] != t->shape[d] ||
            (a->shape[d] > 1 && a->strides[d] != t->strides[d]))
            return false;
    return true;
}

zs_tensor *zsi_aux_copy(const zsi_call *c, int k, zs_tensor *t,
                        zs_tensor *(*make)(zs_tensor *))
{
    zs_tensor *a = c->aux[k];
    zs_status st = ZS_OK;
    zsi_tracking_pause();
    zs_no_grad_push();
    if (!a)
        a = c->aux[k] = make(t);
    else if (!same_view(a, t)) /* replay: a copy made from t at capture */
        st = zs_copy_(a, t);
    zs_no_grad_pop();
    zsi_tracking_resume();
    return st == ZS_OK ? a : NULL;
}
