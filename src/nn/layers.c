/*
 * layers.c - the standard layers: Linear, Conv2d, pooling, BatchNorm,
 * LayerNorm, Embedding, Dropout, Flatten, activations, Sequential; and the
 * initialisation schemes.
 *
 * Each layer is a zs_module whose impl holds its hyper-parameters; its
 * parameters and buffers live in the module's named lists, so traversal,
 * flattening and checkpoints need no per-layer code.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "zs/linear.h"
#include "zs/nn.h"
#include "zs/ops.h"

/* ---- initialisation ------------------------------------------------------ */

/* fan_in / fan_out of a weight: [out, in] or [out, in/groups, kh, kw]. */
static void fans(int ndim, const int64_t *shape, double *fi, double *fo)
{
    double rf = 1;
    for (int d = 2; d < ndim; d++)
        rf *= (double)shape[d];
    *fi = (ndim > 1 ? (double)shape[1] : (double)shape[0]) * rf;
    *fo = (double)shape[0] * rf;
}

static zs_tensor *init_weight(int ndim, const int64_t *shape, zs_init init,
                              uint64_t seed)
{
    double fi, fo;
    fans(ndim, shape, &fi, &fo);
    switch (init) {
    case ZS_INIT_KAIMING_NORMAL:
        return zs_normal(ZS_F32, ndim, shape, 0, sqrt(2.0 / fi), seed);
    case ZS_INIT_KAIMING_UNIFORM: {
        double b = sqrt(6.0 / fi);
        return zs_uniform(ZS_F32, ndim, shape, -b, b, seed);
    }
    case ZS_INIT_XAVIER_NORMAL:
        return zs_normal(ZS_F32, ndim, shape, 0, sqrt(2.0 / (fi + fo)), seed);
    case ZS_INIT_XAVIER_UNIFORM: {
        double b = sqrt(6.0 / (fi + fo));
        return zs_uniform(ZS_F32, ndim, shape, -b, b, seed);
    }
    case ZS_INIT_NORMAL_002:
        return zs_normal(ZS_F32, ndim, shape, 0, 0.02, seed);
    default: { /* PyTorch default: kaiming_uniform(a = sqrt 5) = U(+-1/sqrt(fi)) */
        double b = 1.0 / sqrt(fi);
        return zs_uniform(ZS_F32, ndim, shape, -b, b, seed);
    }
    }
}

/* Bias as PyTorch initialises it: U(+-1/sqrt(fan_in)). */
static zs_tensor *init_bias(int64_t n, double fan_in, zs_init init, uint64_t seed)
{
    if (init == ZS_INIT_NORMAL_002 || init == ZS_INIT_KAIMING_NORMAL ||
        init == ZS_INIT_XAVIER_NORMAL || init == ZS_INIT_XAVIER_UNIFORM)
        return zs_zeros(ZS_F32, 1, &n);
    double b = 1.0 / sqrt(fan_in);
    return zs_uniform(ZS_F32, 1, &n, -b, b, seed);
}

static zs_tensor *param(zs_module *m, const char *name)
{
    for (int i = 0; i < m->nparams; i++)
        if (!strcmp(m->param_names[i], name))
            return m->params[i];
    return NULL;
}

static zs_tensor *buffer(zs_module *m, const char *name)
{
    for (int i = 0; i < m->nbuffers; i++)
        if (!strcmp(m->buffer_names[i], name))
            return m->buffers[i];
    return NULL;
}

static void free_impl(zs_module *m) { free(m->impl); }

/* Creates a module with a copy of `cfg` (size bytes) as impl. */
static zs_module *with_impl(const zs_module_vtable *vt, const void *cfg,
                            size_t size)
{
    void *impl = NULL;
    if (size) {
        impl = malloc(size);
        if (!impl) {
            zs_set_error_code(ZS_ERR_NOMEM, "%s: out of memory", vt->type);
            return NULL;
        }
        memcpy(impl, cfg, size);
    }
    zs_module *m = zs_module_new(vt, impl);
    if (!m)
        free(impl);
    return m;
}

/* Fails the constructor cleanly: frees m, returns NULL. */
static zs_module *built(zs_module *m, bool ok)
{
    if (!ok) {
        zs_module_free(m);
        return NULL;
    }
    return m;
}

/* ---- Linear ---------------------------------------------------------------- */

static zs_tensor *linear_fwd(zs_module *m, zs_tensor *x)
{
    return zs_linear(x, param(m, "weight"), param(m, "bias"));
}

static const zs_module_vtable linear_vt = {"Linear", linear_fwd, free_impl};

zs_module *zs_linear_new(int64_t in, int64_t out, bool bias, zs_init init,
                         uint64_t seed)
{
    if (in <= 0 || out <= 0) {
        zs_set_error("linear: sizes %lld -> %lld, expected positive",
                     (long long)in, (long long)out);
        return NULL;
    }
    zs_module *m = with_impl(&linear_vt, NULL, 0);
    if (!m)
        return NULL;
    int64_t shape[2] = {out, in};
    bool ok = zs_module_add_param(m, "weight", init_weight(2, shape, init, seed));
    if (ok && bias)
        ok = zs_module_add_param(m, "bias", init_bias(out, (double)in, init, seed + 1));
    return built(m, ok);
}

/* ---- Conv2d -------------------------------------------------------------- */

static zs_tensor *conv_fwd(zs_module *m, zs_tensor *x)
{
    const zs_conv2d_params *p = m->impl;
    return zs_conv2d(x, param(m, "weight"), param(m, "bias"), p);
}

static const zs_module_vtable conv_vt = {"Conv2d", conv_fwd, free_impl};

zs_module *zs_conv2d_new(int64_t in_ch, int64_t out_ch, int kernel, int stride,
                         int padding, int groups, bool bias, zs_init init,
                         uint64_t seed)
{
    if (groups < 1)
        groups = 1;
    if (in_ch <= 0 || out_ch <= 0 || kernel <= 0 || in_ch % groups ||
        out_ch % groups) {
        zs_set_error("conv2d: %lld -> %lld channels, kernel %d, groups %d: "
                     "expected positive sizes divisible by groups",
                     (long long)in_ch, (long long)out_ch, kernel, groups);
        return NULL;
    }
    zs_conv2d_params p = {{stride, stride}, {padding, padding}, {1, 1}, groups};
    zs_module *m = with_impl(&conv_vt, &p, sizeof p);
    if (!m)
        return NULL;
    int64_t shape[4] = {out_ch, in_ch / groups, kernel, kernel};
    bool ok = zs_module_add_param(m, "weight", init_weight(4, shape, init, seed));
    if (ok && bias)
        ok = zs_module_add_param(m, "bias",
                                 init_bias(out_ch, (double)(in_ch / groups) * kernel * kernel,
                                           init, seed + 1));
    return built(m, ok);
}

/* ---- pooling ------------------------------------------------------------- */

static zs_tensor *maxpool_fwd(zs_module *m, zs_tensor *x)
{
    return zs_max_pool2d(x, m->impl);
}

static zs_tensor *avgpool_fwd(zs_module *m, zs_tensor *x)
{
    return zs_avg_pool2d(x, m->impl);
}

static const zs_module_vtable maxpool_vt = {"MaxPool2d", maxpool_fwd, free_impl};
static const zs_module_vtable avgpool_vt = {"AvgPool2d", avgpool_fwd, free_impl};

static zs_module *pool_new(const zs_module_vtable *vt, int kernel, int stride)
{
    if (kernel <= 0 || stride < 0) {
        zs_set_error("%s: kernel %d, stride %d: expected kernel > 0", vt->type,
                     kernel, stride);
        return NULL;
    }
    zs_pool2d_params p = {{kernel, kernel}, {stride, stride}, {0, 0}, false};
    return with_impl(vt, &p, sizeof p);
}

zs_module *zs_maxpool2d_new(int kernel, int stride)
{
    return pool_new(&maxpool_vt, kernel, stride);
}

zs_module *zs_avgpool2d_new(int kernel, int stride)
{
    return pool_new(&avgpool_vt, kernel, stride);
}

/* ---- normalisation ----------------------------------------------------- */

typedef struct norm_cfg {
    double momentum, eps;
} norm_cfg;

static zs_tensor *batchnorm_fwd(zs_module *m, zs_tensor *x)
{
    const norm_cfg *c = m->impl;
    return zs_batch_norm(x, param(m, "weight"), param(m, "bias"),
                         buffer(m, "running_mean"), buffer(m, "running_var"),
                         m->training, c->momentum, c->eps);
}

static const zs_module_vtable batchnorm_vt = {"BatchNorm", batchnorm_fwd, free_impl};

zs_module *zs_batchnorm_new(int64_t channels, double momentum, double eps)
{
    if (channels <= 0) {
        zs_set_error("batchnorm: %lld channels, expected > 0", (long long)channels);
        return NULL;
    }
    norm_cfg c = {momentum, eps};
    zs_module *m = with_impl(&batchnorm_vt, &c, sizeof c);
    if (!m)
        return NULL;
    bool ok = zs_module_add_param(m, "weight", zs_ones(ZS_F32, 1, &channels)) &&
              zs_module_add_param(m, "bias", zs_zeros(ZS_F32, 1, &channels)) &&
              zs_module_add_buffer(m, "running_mean", zs_zeros(ZS_F32, 1, &channels)) &&
              zs_module_add_buffer(m, "running_var", zs_ones(ZS_F32, 1, &channels));
    return built(m, ok);
}

static zs_tensor *layernorm_fwd(zs_module *m, zs_tensor *x)
{
    const norm_cfg *c = m->impl;
    return zs_layer_norm(x, param(m, "weight"), param(m, "bias"), c->eps);
}

static const zs_module_vtable layernorm_vt = {"LayerNorm", layernorm_fwd, free_impl};

zs_module *zs_layernorm_new(int64_t dim, double eps)
{
    if (dim <= 0) {
        zs_set_error("layernorm: dim %lld, expected > 0", (long long)dim);
        return NULL;
    }
    norm_cfg c = {0, eps};
    zs_module *m = with_impl(&layernorm_vt, &c, sizeof c);
    if (!m)
        return NULL;
    bool ok = zs_module_add_param(m, "weight", zs_ones(ZS_F32, 1, &dim)) &&
              zs_module_add_param(m, "bias", zs_zeros(ZS_F32, 1, &dim));
    return built(m, ok);
}

/* ---- embedding, dropout, flatten, activations --------------------------- */

static zs_tensor *embedding_fwd(zs_module *m, zs_tensor *idx)
{
    return zs_embedding(param(m, "weight"), idx);
}

static const zs_module_vtable embedding_vt = {"Embedding", embedding_fwd, free_impl};

zs_module *zs_embedding_new(int64_t vocab, int64_t dim, uint64_t seed)
{
    if (vocab <= 0 || dim <= 0) {
        zs_set_error("embedding: %lld x %lld, expected positive sizes",
                     (long long)vocab, (long long)dim);
        return NULL;
    }
    zs_module *m = with_impl(&embedding_vt, NULL, 0);
    if (!m)
        return NULL;
    int64_t shape[2] = {vocab, dim};
    return built(m, zs_module_add_param(m, "weight",
                                        zs_normal(ZS_F32, 2, shape, 0, 1, seed)));
}

static zs_tensor *dropout_fwd(zs_module *m, zs_tensor *x)
{
    return zs_dropout(x, *(const double *)m->impl, m->training);
}

static const zs_module_vtable dropout_vt = {"Dropout", dropout_fwd, free_impl};

zs_module *zs_dropout_new(double p)
{
    if (!(p >= 0 && p < 1)) {
        zs_set_error("dropout: p = %g, expected 0 <= p < 1", p);
        return NULL;
    }
    return with_impl(&dropout_vt, &p, sizeof p);
}

static zs_tensor *flatten_fwd(zs_module *m, zs_tensor *x)
{
    return zs_flatten(x, 1, -1);
}

static const zs_module_vtable flatten_vt = {"Flatten", flatten_fwd, NULL};

zs_module *zs_flatten_new(void) { return zs_module_new(&flatten_vt, NULL); }

static zs_tensor *act_fwd(zs_module *m, zs_tensor *x)
{
    switch (*(const zs_activation *)m->impl) {
    case ZS_ACT_RELU: return zs_relu(x);
    case ZS_ACT_TANH: return zs_tanh(x);
    case ZS_ACT_SIGMOID: return zs_sigmoid(x);
    case ZS_ACT_GELU: return zs_gelu(x, ZS_GELU_ERF);
    case ZS_ACT_GELU_TANH: return zs_gelu(x, ZS_GELU_TANH);
    case ZS_ACT_SILU: return zs_silu(x);
    }
    return NULL;
}

static const zs_module_vtable act_vt = {"Activation", act_fwd, free_impl};

zs_module *zs_activation_new(zs_activation a)
{
    if ((unsigned)a > ZS_ACT_SILU) {
        zs_set_error("activation: unknown kind %d", (int)a);
        return NULL;
    }
    return with_impl(&act_vt, &a, sizeof a);
}

/* ---- Sequential ------------------------------------------------------------ */

static zs_tensor *seq_fwd(zs_module *m, zs_tensor *x)
{
    zs_tensor *cur = zs_retain(x);
    for (int i = 0; i < m->nchildren && cur; i++) {
        zs_tensor *next = zs_module_forward(m->children[i], cur);
        zs_release(cur);
        cur = next;
    }
    return cur;
}

static const zs_module_vtable seq_vt = {"Sequential", seq_fwd, NULL};

zs_module *zs_sequential_new(int n, zs_module **mods)
{
    zs_module *m = zs_module_new(&seq_vt, NULL);
    bool ok = m != NULL;
    for (int i = 0; i < n; i++) {
        char name[16];
        snprintf(name, sizeof name, "%d", i);
        if (!mods[i])
            ok = false;
        if (ok)
            ok = zs_module_add_child(m, name, mods[i]) != NULL;
        else
            zs_module_free(mods[i]);
    }
    return built(m, ok);
}
