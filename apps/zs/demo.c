/*
 * demo.c - `zs demo`: fits y = 3x - 2 + noise with a one-parameter-pair
 * model by gradient descent, using autograd, and prints the losses. The
 * placeholder main job until `zs train` exists.
 */
#include <stdio.h>

#include "apps/zs/commands.h"
#include "apps/zs/flags.h"
#include "zs/zs.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: zs demo [--steps N]\n  --steps N  gradient-descent "
            "steps (default 50)\n");
}

int cmd_demo(int argc, char **argv)
{
    int steps = 50;
    flag t[] = {FLAG_NUM("--steps", &steps, 1, 1e6)};
    int p = flags_parse("zs demo", t, NFLAGS(t), usage, argc, argv);
    if (p != FLAGS_OK)
        return flags_exit(p);
    zs_tensor *x = zs_uniform(ZS_F32, ZS_SHAPE(256, 1), -1, 1, 1);
    zs_tensor *noise = zs_normal(ZS_F32, ZS_SHAPE(256, 1), 0, 0.05, 2);
    zs_tensor *w = zs_zeros(ZS_F32, ZS_SHAPE(1, 1));
    zs_tensor *b = zs_zeros(ZS_F32, ZS_SHAPE(1));
    zs_scope_push();
    zs_tensor *y = zs_keep(zs_add(zs_add_scalar(zs_mul_scalar(x, 3.0), -2.0), noise));
    zs_scope_pop();
    zs_set_requires_grad(w, true);
    zs_set_requires_grad(b, true);
    double loss_v = 0;
    int rc = 0;
    for (int s = 0; s < steps; s++) {
        zs_scope_push();
        zs_tensor *pred = zs_add(zs_mul(x, w), b);
        zs_tensor *d = zs_sub(pred, y);
        zs_tensor *loss = zs_mean(zs_mul(d, d), 0, NULL, false);
        if (!loss || zs_backward(loss, NULL, false) != ZS_OK) {
            fprintf(stderr, "zs demo: %s\n", zs_last_error());
            zs_scope_pop();
            rc = 1;
            break;
        }
        loss_v = zs_item(loss);
        zs_axpy_(w, -0.5, zs_grad(w));
        zs_axpy_(b, -0.5, zs_grad(b));
        zs_zero_grad(w, false);
        zs_zero_grad(b, false);
        zs_scope_pop();
        if (s % 10 == 0 || s == steps - 1)
            printf("step %3d  loss %.6f  w %.4f  b %.4f\n", s, loss_v,
                   zs_item(w), zs_item(b));
    }
    zs_release(x);
    zs_release(noise);
    zs_release(y);
    zs_release(w);
    zs_release(b);
    return rc;
}
