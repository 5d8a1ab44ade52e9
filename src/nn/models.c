/*
 * models.c - ready-made CNNs for 28x28 single-channel images (MNIST,
 * Fashion-MNIST): LeNet-5 and a small ResNet with batch norm.
 */
#include <stdlib.h>
#include <string.h>

#include "zs/nn.h"
#include "zs/ops.h"

zs_module *zs_lenet5_new(uint64_t seed)
{
    zs_module *layers[] = {
        zs_conv2d_new(1, 6, 5, 1, 2, 1, true, ZS_INIT_DEFAULT, seed),
        zs_activation_new(ZS_ACT_RELU),
        zs_maxpool2d_new(2, 2),
        zs_conv2d_new(6, 16, 5, 1, 0, 1, true, ZS_INIT_DEFAULT, seed + 10),
        zs_activation_new(ZS_ACT_RELU),
        zs_maxpool2d_new(2, 2),
        zs_flatten_new(),
        zs_linear_new(16 * 5 * 5, 120, true, ZS_INIT_DEFAULT, seed + 20),
        zs_activation_new(ZS_ACT_RELU),
        zs_linear_new(120, 84, true, ZS_INIT_DEFAULT, seed + 30),
        zs_activation_new(ZS_ACT_RELU),
        zs_linear_new(84, 10, true, ZS_INIT_DEFAULT, seed + 40),
    };
    return zs_sequential_new((int)(sizeof layers / sizeof *layers), layers);
}

/* Residual block: relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x)),
 * where shortcut is a strided 1x1 conv + bn when the shape changes. */
static zs_tensor *block_fwd(zs_module *m, zs_tensor *x)
{
    zs_module **c = m->children; /* conv1 bn1 conv2 bn2 [proj projbn] */
    zs_tensor *h1 = zs_module_forward(c[0], x);
    zs_tensor *h2 = zs_module_forward(c[1], h1);
    zs_tensor *h3 = zs_relu(h2);
    zs_tensor *h4 = zs_module_forward(c[2], h3);
    zs_tensor *h5 = zs_module_forward(c[3], h4);
    zs_tensor *s1 = NULL, *s2 = NULL;
    if (m->nchildren == 6) {
        s1 = zs_module_forward(c[4], x);
        s2 = zs_module_forward(c[5], s1);
    }
    zs_tensor *sum = zs_add(h5, m->nchildren == 6 ? s2 : x);
    zs_tensor *out = zs_relu(sum);
    zs_tensor *tmp[] = {h1, h2, h3, h4, h5, s1, s2, sum};
    for (size_t i = 0; i < sizeof tmp / sizeof *tmp; i++)
        zs_release(tmp[i]);
    return out;
}

static const zs_module_vtable block_vt = {"ResidualBlock", block_fwd, NULL};

static zs_module *block_new(int64_t in, int64_t out, int stride, uint64_t seed)
{
    zs_module *m = zs_module_new(&block_vt, NULL);
    bool ok = m &&
        zs_module_add_child(m, "conv1", zs_conv2d_new(in, out, 3, stride, 1, 1, false,
                                                      ZS_INIT_KAIMING_NORMAL, seed)) &&
        zs_module_add_child(m, "bn1", zs_batchnorm_new(out, 0.1, 1e-5)) &&
        zs_module_add_child(m, "conv2", zs_conv2d_new(out, out, 3, 1, 1, 1, false,
                                                      ZS_INIT_KAIMING_NORMAL, seed + 1)) &&
        zs_module_add_child(m, "bn2", zs_batchnorm_new(out, 0.1, 1e-5));
    if (ok && (in != out || stride != 1))
        ok = zs_module_add_child(m, "proj", zs_conv2d_new(in, out, 1, stride, 0, 1, false,
                                                          ZS_INIT_KAIMING_NORMAL, seed + 2)) &&
             zs_module_add_child(m, "projbn", zs_batchnorm_new(out, 0.1, 1e-5));
    if (!ok) {
        zs_module_free(m);
        return NULL;
    }
    return m;
}

zs_module *zs_resnet_small_new(uint64_t seed)
{
    zs_module *layers[] = {
        zs_conv2d_new(1, 32, 3, 1, 1, 1, false, ZS_INIT_KAIMING_NORMAL, seed),
        zs_batchnorm_new(32, 0.1, 1e-5),
        zs_activation_new(ZS_ACT_RELU),
        block_new(32, 32, 1, seed + 10),
        block_new(32, 64, 2, seed + 20),   /* 14x14 */
        block_new(64, 128, 2, seed + 30),  /* 7x7 */
        zs_avgpool2d_new(7, 7),
        zs_flatten_new(),
        zs_linear_new(128, 10, true, ZS_INIT_DEFAULT, seed + 40),
    };
    return zs_sequential_new((int)(sizeof layers / sizeof *layers), layers);
}

zs_module *zs_cnn_new(const char *name, uint64_t seed)
{
    if (name && !strcmp(name, "lenet"))
        return zs_lenet5_new(seed);
    if (name && !strcmp(name, "resnet"))
        return zs_resnet_small_new(seed);
    zs_set_error("unknown model '%s' (known: lenet, resnet)", name ? name : "(none)");
    return NULL;
}
