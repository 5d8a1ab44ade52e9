/*
 * test_mlp.c - a two-layer perceptron end to end through autograd:
 * x [5, 7] -> h = x W1 + b1 [5, 11] -> a = h * h -> y = a W2 + b2 [5, 3]
 * -> loss = mean(y * y). Built from matmul, add, mul and mean only.
 *
 * Checks: the loss equals a float64 reference; the gradients of every
 * parameter (and of x) equal central finite differences (ZT_GRADCHECK);
 * one explicit backward fills .grad of every leaf with the same values the
 * gradient check accepted; the tape's nodes are freed once backward has run
 * and the tensors are released, with and without a scope.
 */
#include <stdlib.h>

#include "testutil.h"

enum { B = 5, IN = 7, HID = 11, OUT = 3 };

/* in: x, W1, b1, W2, b2; returns the 0-d loss (new reference). ctx
 * non-NULL: called inside a scope, which owns the temporaries. */
static zs_tensor *mlp(void *ctx, zs_tensor **in)
{
    zs_tensor *xw = zs_matmul(in[0], in[1]);
    zs_tensor *h = zs_add(xw, in[2]);
    zs_tensor *a = zs_mul(h, h);
    zs_tensor *aw = zs_matmul(a, in[3]);
    zs_tensor *y = zs_add(aw, in[4]);
    zs_tensor *y2 = zs_mul(y, y);
    zs_tensor *loss = zs_mean(y2, 0, NULL, false);
    zs_tensor *tmp[] = {xw, h, a, aw, y, y2};
    for (int i = 0; i < 6 && !ctx; i++)
        zs_release(tmp[i]);
    return loss;
}

static double reference_loss(zs_tensor **in)
{
    double *x = zt_values(in[0]), *w1 = zt_values(in[1]), *b1 = zt_values(in[2]);
    double *w2 = zt_values(in[3]), *b2 = zt_values(in[4]);
    double loss = 0;
    for (int i = 0; i < B; i++) {
        double a[HID];
        for (int j = 0; j < HID; j++) {
            double h = b1[j];
            for (int k = 0; k < IN; k++)
                h += x[i * IN + k] * w1[k * HID + j];
            a[j] = h * h;
        }
        for (int o = 0; o < OUT; o++) {
            double y = b2[o];
            for (int j = 0; j < HID; j++)
                y += a[j] * w2[j * OUT + o];
            loss += y * y;
        }
    }
    free(x);
    free(w1);
    free(b1);
    free(w2);
    free(b2);
    return loss / (B * OUT);
}

static void make_inputs(zs_tensor **in)
{
    in[0] = zt_rand(ZS_F64, ZS_SHAPE(B, IN), 1);
    in[1] = zt_rand(ZS_F64, ZS_SHAPE(IN, HID), 2);
    in[2] = zt_rand(ZS_F64, ZS_SHAPE(HID), 3);
    in[3] = zt_rand(ZS_F64, ZS_SHAPE(HID, OUT), 4);
    in[4] = zt_rand(ZS_F64, ZS_SHAPE(OUT), 5);
    for (int i = 0; i < 5; i++)
        zs_set_requires_grad(in[i], true);
}

static void test_gradients(void)
{
    zs_tensor *in[5];
    make_inputs(in);
    zs_tensor *loss = mlp(NULL, in);
    double ref = reference_loss(in);
    ZT_CHECK(loss && fabs(zs_item(loss) - ref) <= 1e-12 * fmax(1, fabs(ref)),
             "loss %.17g vs reference %.17g", loss ? zs_item(loss) : NAN, ref);
    zs_release(loss);
    ZT_GRADCHECK("mlp x, W1, b1, W2, b2", mlp, NULL, 5, in);
    for (int i = 0; i < 5; i++)
        zs_release(in[i]);
    zt_section("mlp loss and gradients vs finite differences");
}

/* .grad after one backward equals a central difference on each leaf. */
static void test_backward_grads(void)
{
    zs_tensor *in[5];
    make_inputs(in);
    zs_tensor *loss = mlp(NULL, in);
    ZT_CHECK(zs_backward(loss, NULL, false) == ZS_OK, "backward");
    zs_release(loss);
    double worst = 0;
    for (int i = 0; i < 5; i++) {
        zs_tensor *g = zs_grad(in[i]);
        ZT_CHECK(g && zs_same_shape(g, in[i]), "grad %d present", i);
        if (!g)
            continue;
        double *p = zs_data(in[i]);
        for (int64_t k = 0; k < zs_numel(in[i]); k++) {
            double v = p[k], eps = 1e-6;
            zs_no_grad_push();
            p[k] = v + eps;
            zs_tensor *lp = mlp(NULL, in);
            p[k] = v - eps;
            zs_tensor *lm = mlp(NULL, in);
            p[k] = v;
            zs_no_grad_pop();
            double num = (zs_item(lp) - zs_item(lm)) / (2 * eps);
            double err = fabs(zs_get(g, k) - num) / fmax(1, fabs(num));
            worst = fmax(worst, err);
            zs_release(lp);
            zs_release(lm);
        }
    }
    ZT_CHECK(worst <= 1e-6, "backward grads vs differences: %.3g", worst);
    for (int i = 0; i < 5; i++)
        zs_release(in[i]);
    zt_section("mlp backward fills every .grad");
}

static void test_lifetime(void)
{
    int64_t nodes0 = zs_autograd_live_nodes(), bytes0 = zt_live_bytes();
    zs_tensor *in[5];
    make_inputs(in);
    zs_tensor *loss = mlp(NULL, in);
    ZT_CHECK(zs_autograd_live_nodes() > nodes0, "forward records nodes");
    ZT_CHECK(zs_backward(loss, NULL, false) == ZS_OK, "backward");
    zs_release(loss);
    ZT_CHECK(zs_autograd_live_nodes() == nodes0,
             "nodes after backward and release: %lld left",
             (long long)(zs_autograd_live_nodes() - nodes0));
    /* the same step inside a scope: popping it frees the tape too */
    zs_scope_push();
    int in_scope = 1;
    zs_tensor *l2 = mlp(&in_scope, in);
    ZT_CHECK(zs_backward(l2, NULL, false) == ZS_OK, "backward in scope");
    zs_scope_pop();
    ZT_CHECK(zs_autograd_live_nodes() == nodes0, "nodes after scope: %lld left",
             (long long)(zs_autograd_live_nodes() - nodes0));
    for (int i = 0; i < 5; i++)
        zs_release(in[i]);
    ZT_CHECK(zt_live_bytes() == bytes0, "live bytes %lld -> %lld",
             (long long)bytes0, (long long)zt_live_bytes());
    zt_section("mlp tape freed after backward and release");
}

int main(void)
{
    test_gradients();
    test_backward_grads();
    test_lifetime();
    return zt_done();
}
