/*
 * scaler.c - zs_grad_scaler (zs/optim.h): dynamic loss scaling as
 * torch.cuda.amp.GradScaler, with its defaults (scale 2^16, growth x2
 * after 2000 clean steps, backoff x0.5 on Inf/NaN).
 *
 * Per step: the caller backpropagates zs_grad_scaler_scale(loss); unscale
 * runs zs_unscale_ (ops/unscale.c) over every gradient (one read and one
 * write, the Inf/NaN check in the same pass, the flag a one-element f32
 * tensor on the gradients' device read back once); step skips the update
 * when the flag is set; update moves the scale. The state is the scale
 * and the count of clean steps since the last change (growth_tracker),
 * both kept in checkpoints by the trainer.
 */
#include <math.h>
#include <stdlib.h>

#include "zs/ops.h"
#include "zs/optim.h"

typedef enum phase { READY, UNSCALED, STEPPED } phase;

struct zs_grad_scaler {
    zs_grad_scaler_config c;
    double scale;
    int64_t tracker;
    phase ph;
    bool found, skipped;
};

zs_grad_scaler_config zs_grad_scaler_defaults(void)
{
    return (zs_grad_scaler_config){65536.0, 2.0, 0.5, 2000};
}

zs_grad_scaler *zs_grad_scaler_new(const zs_grad_scaler_config *cfg)
{
    zs_grad_scaler_config c = cfg ? *cfg : zs_grad_scaler_defaults();
    if (!(c.init_scale > 0) || isinf(c.init_scale) || !(c.growth_factor > 1) ||
        isinf(c.growth_factor) || !(c.backoff_factor > 0 && c.backoff_factor < 1) ||
        c.growth_interval < 1) {
        zs_set_error("grad_scaler: bad config (init_scale %g, growth_factor %g, "
                     "backoff_factor %g, growth_interval %lld): expected a finite "
                     "scale > 0, growth > 1, backoff in (0, 1), interval >= 1",
                     c.init_scale, c.growth_factor, c.backoff_factor,
                     (long long)c.growth_interval);
        return NULL;
    }
    zs_grad_scaler *s = calloc(1, sizeof *s);
    if (!s) {
        zs_set_error_code(ZS_ERR_NOMEM, "grad_scaler: out of memory");
        return NULL;
    }
    s->c = c;
    s->scale = c.init_scale;
    return s;
}

void zs_grad_scaler_free(zs_grad_scaler *s) { free(s); }

zs_tensor *zs_grad_scaler_scale(zs_grad_scaler *s, zs_tensor *loss)
{
    return loss ? zs_mul_scalar(loss, s->scale) : NULL;
}

/* The flag tensor on dev: zeros, a new reference. */
static zs_tensor *new_flag(int dev)
{
    return zs_zeros_on(dev, ZS_F32, 1, (int64_t[]){1});
}

zs_status zs_grad_scaler_unscale(zs_grad_scaler *s, int n, zs_tensor **params)
{
    if (s->ph != READY)
        return zs_set_error_code(ZS_ERR_STATE, "grad_scaler: unscale called twice "
                                 "in one step (call update after the step)");
    zs_tensor *flag = NULL;
    zs_status st = ZS_OK;
    double inv = 1.0 / s->scale;
    for (int i = 0; st == ZS_OK && i < n; i++) {
        zs_tensor *g = params[i] ? params[i]->grad : NULL;
        if (!g)
            continue;
        if (!flag && !(flag = new_flag((int)g->device)))
            st = ZS_ERR_NOMEM;
        if (st == ZS_OK)
            st = zs_unscale_(g, flag, inv);
    }
    if (st == ZS_OK && flag) {
        zs_tensor *h = zs_to_device(flag, ZS_CPU); /* the one read back */
        st = h ? ZS_OK : ZS_ERR_NOMEM;
        s->found = h && zs_get(h, 0) != 0;
        zs_release(h);
    }
    zs_release(flag);
    if (st == ZS_OK)
        s->ph = UNSCALED;
    return st;
}

void zs_grad_scaler_set_found_inf(zs_grad_scaler *s, bool found)
{
    s->found = s->found || found;
}

bool zs_grad_scaler_found_inf(const zs_grad_scaler *s) { return s->found; }

zs_status zs_grad_scaler_step(zs_grad_scaler *s, zs_optim *o, double lr,
                              double grad_scale)
{
    if (s->ph == STEPPED)
        return zs_set_error_code(ZS_ERR_STATE, "grad_scaler: step called twice in "
                                 "one step (call update after the step)");
    zs_status st = ZS_OK;
    if (s->ph == READY) {
        int n;
        zs_tensor **ps = zs_optim_params(o, &n);
        if ((st = zs_grad_scaler_unscale(s, n, ps)) != ZS_OK)
            return st;
    }
    s->skipped = s->found;
    if (!s->found)
        st = zs_optim_step_scaled(o, lr, grad_scale);
    s->ph = STEPPED;
    return st;
}

zs_status zs_grad_scaler_update(zs_grad_scaler *s)
{
    if (s->ph == READY)
        return zs_set_error_code(ZS_ERR_STATE, "grad_scaler: update before unscale "
                                 "or step: nothing was checked this step");
    if (s->found) {
        s->scale *= s->c.backoff_factor;
        s->tracker = 0;
    } else if (++s->tracker == s->c.growth_interval) {
        double g = s->scale * s->c.growth_factor;
        s->scale = isinf(g) ? s->scale : g; /* PyTorch keeps a finite scale */
        s->tracker = 0;
    }
    s->found = false;
    s->ph = READY;
    return ZS_OK;
}

double zs_grad_scaler_get_scale(const zs_grad_scaler *s) { return s->scale; }
bool zs_grad_scaler_skipped(const zs_grad_scaler *s) { return s->skipped; }
int64_t zs_grad_scaler_growth_tracker(const zs_grad_scaler *s) { return s->tracker; }

zs_status zs_grad_scaler_set_state(zs_grad_scaler *s, double scale, int64_t growth_tracker)
{
    if (!(scale > 0) || isinf(scale) || growth_tracker < 0)
        return zs_set_error("grad_scaler: state scale %g, growth tracker %lld: "
                            "expected a finite scale > 0 and a tracker >= 0", scale,
                            (long long)growth_tracker);
    s->scale = scale;
    s->tracker = growth_tracker % s->c.growth_interval;
    return ZS_OK;
}
