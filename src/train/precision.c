/*
 * precision.c - the trainer's mixed precision (zs_trainer_config.precision,
 * docs/precision.md): autocast around forward and loss with the step's one
 * conversion pass of the flat f32 weights (zs_autocast_cache_flat into a
 * low buffer kept across steps), and the loss scaler's check before the
 * update (f16 and fp8): the gradients unscaled in one pass, the Inf/NaN
 * flag agreed by every rank (ZeRO's shards differ), the step skipped and
 * the scale backed off on overflow.
 */
#include <math.h>
#include <string.h>

#include "core/internal.h"
#include "train/internal.h"

const char *zs_precision_name(zs_dtype p)
{
    switch (p) {
    case ZS_F32: return "fp32";
    case ZS_BF16: return "bf16";
    case ZS_F16: return "fp16";
    case ZS_F8E4M3: return "fp8";
    default: return "?";
    }
}

int zs_precision_parse(const char *name)
{
    static const struct {
        const char *name;
        zs_dtype dt;
    } names[] = {{"fp32", ZS_F32}, {"f32", ZS_F32}, {"bf16", ZS_BF16},
                 {"fp16", ZS_F16}, {"f16", ZS_F16}, {"fp8", ZS_F8E4M3},
                 {"f8e4m3", ZS_F8E4M3}};
    for (size_t i = 0; name && i < sizeof names / sizeof *names; i++)
        if (!strcmp(name, names[i].name))
            return (int)names[i].dt;
    return -1;
}

zs_status zsi_train_amp_begin(zs_trainer *t, bool flat)
{
    zs_dtype p = t->c.precision;
    if (p == ZS_F32)
        return ZS_OK;
    zs_status st = zs_autocast_push(p);
    /* ZeRO-3 holds a block's weights only while it runs: each is cast
     * once per step as it is used (the autocast cache) */
    if (st != ZS_OK || !flat || t->c.zero == 3)
        return st;
    zs_dtype dt = zs_autocast_compute_dtype(p, (int)t->fp->device);
    if (dt != ZS_F32 && !t->fp_low) {
        zsi_tracking_pause(); /* the trainer's, not the open scope's */
        t->fp_low = zs_empty_on((int)t->fp->device, dt, t->fp->ndim, t->fp->shape);
        zsi_tracking_resume();
        st = t->fp_low ? ZS_OK : ZS_ERR_NOMEM;
    }
    if (st == ZS_OK && dt != ZS_F32)
        st = zs_autocast_cache_flat(t->fp, t->fp_low);
    if (st != ZS_OK)
        zs_autocast_pop();
    return st;
}

void zsi_train_amp_end(zs_trainer *t)
{
    if (t->c.precision != ZS_F32)
        zs_autocast_pop();
}

zs_status zsi_train_unscale(zs_trainer *t, bool *skip)
{
    *skip = t->skipped = false;
    t->step_scale = t->scaler ? zs_grad_scaler_get_scale(t->scaler) : 1;
    if (!t->scaler)
        return ZS_OK;
    int n = 1;
    /* model parallelism: the part's whole gradient (its norm is taken
     * over tp and pp from every parameter, ZeRO-1's shards included), and
     * the flag agreed by every rank of the grid (each checked its part) */
    zs_tensor **ps = t->par ? &t->fp : zs_optim_params(t->o, &n);
    zs_comm *all = t->par ? zsi_par_world(t) : t->comm;
    zs_status st = zs_grad_scaler_unscale(t->scaler, n, ps);
    bool found = zs_grad_scaler_found_inf(t->scaler);
    if (st == ZS_OK && zs_comm_size(all) > 1) { /* ZeRO: each rank checked its shard */
        zs_tensor *f = zs_scalar(ZS_F64, found ? 1 : 0);
        st = f ? zs_comm_allreduce(all, f, false, ZS_ALLREDUCE_MPI) : ZS_ERR_NOMEM;
        found = st == ZS_OK && zs_item(f) > 0;
        zs_release(f);
        zs_grad_scaler_set_found_inf(t->scaler, found);
    }
    *skip = t->skipped = found;
    return st;
}

zs_status zsi_train_optim_step(zs_trainer *t, double lr, double grad_scale)
{
    if (!t->scaler)
        return zs_optim_step_scaled(t->o, lr, grad_scale);
    zs_status st = zs_grad_scaler_step(t->scaler, t->o, lr, grad_scale);
    zs_status su = zs_grad_scaler_update(t->scaler);
    return st != ZS_OK ? st : su;
}

void zsi_train_log_precision(const zs_trainer *t)
{
    zs_dtype p = t->c.precision;
    if (p == ZS_F32)
        return;
    zs_dtype dt = zs_autocast_compute_dtype(p, (int)t->fp->device);
    fprintf(t->c.log, "precision %s: matrix products, convolutions and attention in "
            "%s%s, norms, softmax, loss and optimizer in f32; f32 master weights, "
            "gradients and optimizer state, weights converted once per step%s\n",
            zs_precision_name(p), zs_dtype_name(dt),
            p == ZS_F8E4M3 ? "; linears in fp8 (e4m3 weights and activations with "
                             "1x128 / 128x128 tile scales, e5m2 gradients, f32 "
                             "accumulation)"
            : dt == ZS_F32 ? " (no kernel for the low dtype here)" : "",
            t->scaler ? "; dynamic loss scaling" : "");
    if (t->scaler) {
        const zs_trainer_config *c = &t->c;
        zs_grad_scaler_config d = zs_grad_scaler_defaults();
        bool def = c->scaler.init_scale == 0;
        fprintf(t->c.log, "loss scale %g, x%g after %lld clean steps, x%g and the step "
                "skipped on Inf/NaN\n", zs_grad_scaler_get_scale(t->scaler),
                def ? d.growth_factor : c->scaler.growth_factor,
                (long long)(def ? d.growth_interval : c->scaler.growth_interval),
                def ? d.backoff_factor : c->scaler.backoff_factor);
    }
}
