/*
 * test_nn.c - modules: Linear against a float64 reference, parameter
 * traversal and names, LeNet-5 / ResNet shapes and parameter counts,
 * flattening into flat buffers (values kept, gradients land in the flat
 * buffer), train/eval mode, checkpoints (round trip, mismatch leaves the
 * model untouched), and the batch loader (permutations, determinism, seek).
 */
#include <stdlib.h>
#include <unistd.h>

#include "testutil.h"

static void test_linear(void)
{
    zs_module *lin = zs_linear_new(7, 5, true, ZS_INIT_DEFAULT, 3);
    zs_tensor *x = zt_rand_strided(ZS_F32, ZS_SHAPE(4, 7), 9);
    zs_tensor *y = zs_module_forward(lin, x);
    zs_tensor *w = lin->params[0], *b = lin->params[1];
    double worst = 0;
    for (int i = 0; i < 4; i++)
        for (int o = 0; o < 5; o++) {
            double s = zs_get(b, o);
            for (int k = 0; k < 7; k++)
                s += zs_get(x, i * 7 + k) * zs_get(w, o * 7 + k);
            worst = fmax(worst, fabs(s - zs_get(y, i * 5 + o)));
        }
    ZT_CHECK(y && y->shape[1] == 5 && worst < 1e-5, "linear forward err %g", worst);
    double bound = 1 / sqrt(7.0), wmax = 0;
    for (int k = 0; k < 35; k++)
        wmax = fmax(wmax, fabs(zs_get(w, k)));
    ZT_CHECK(wmax <= bound && wmax > bound / 2, "default init bound %g (max %g)", bound, wmax);
    ZT_EXPECT_ERROR(zs_linear_new(0, 3, true, ZS_INIT_DEFAULT, 1) == NULL, "expected positive");
    zs_tensor *bad = zs_ones(ZS_F32, ZS_SHAPE(2, 6));
    ZT_EXPECT_ERROR(zs_module_forward(lin, bad) == NULL, "do not match");
    zs_release(bad);
    zs_release(x);
    zs_release(y);
    zs_module_free(lin);
    zt_section("linear");
}

static void test_models(void)
{
    zs_module *le = zs_lenet5_new(1);
    ZT_CHECK(zs_module_num_params(le) == 61706, "lenet params %lld",
             (long long)zs_module_num_params(le));
    zs_tensor **ps;
    char **names;
    int n = zs_module_parameters(le, &ps, &names);
    ZT_CHECK(n == 10 && !strcmp(names[0], "0.weight") && !strcmp(names[9], "11.bias"),
             "parameter names (%d, %s)", n, n ? names[0] : "");
    zs_names_free(n, ps, names);
    zs_tensor *x = zt_rand(ZS_F32, ZS_SHAPE(3, 1, 28, 28), 4);
    zs_tensor *y = zs_module_forward(le, x);
    ZT_CHECK(y && y->ndim == 2 && y->shape[0] == 3 && y->shape[1] == 10, "lenet output");
    zs_release(y);
    zs_module *rn = zs_resnet_small_new(1);
    zs_tensor **bs;
    int nb = zs_module_buffers(rn, &bs, &names);
    ZT_CHECK(nb > 0 && strstr(names[0], "running_mean"), "resnet buffers (%d)", nb);
    zs_names_free(nb, bs, names);
    y = zs_module_forward(rn, x);
    ZT_CHECK(y && y->shape[1] == 10, "resnet output");
    zs_release(y);
    zs_module_train(rn, false);
    zs_no_grad_push();
    y = zs_module_forward(rn, x);
    zs_no_grad_pop();
    ZT_CHECK(y && !rn->children[1]->training, "eval mode forward");
    zs_release(y);
    zs_release(x);
    zs_module_free(le);
    zs_module_free(rn);
    zt_section("models");
}

static void test_flatten(void)
{
    zs_module *le = zs_lenet5_new(2);
    zs_tensor **ps;
    char **names;
    int n = zs_module_parameters(le, &ps, &names);
    double w0 = zs_get(ps[0], 7), wl = zs_get(ps[n - 1], 3);
    zs_tensor *fp, *fg;
    ZT_CHECK(zs_module_flatten(le, &fp, &fg) == ZS_OK, "flatten");
    ZT_CHECK(zs_numel(fp) == 61706 && zs_get(ps[0], 7) == w0 && zs_get(ps[n - 1], 3) == wl,
             "values kept");
    ZT_CHECK(ps[0]->storage == fp->storage && ps[0]->grad->storage == fg->storage,
             "params and grads live in the flat buffers");
    zs_tensor *x = zt_rand(ZS_F32, ZS_SHAPE(2, 1, 28, 28), 5);
    zs_tensor *y = zs_module_forward(le, x);
    zs_tensor *l = zs_sum(y, 0, NULL, false);
    ZT_CHECK(zs_backward(l, NULL, false) == ZS_OK, "backward");
    double s = 0;
    for (int64_t i = 0; i < zs_numel(fg); i++)
        s += fabs(zs_get(fg, i));
    ZT_CHECK(s > 0 && ps[n - 1]->grad->storage == fg->storage, "gradients in the flat buffer");
    zs_names_free(n, ps, names);
    zs_release(x);
    zs_release(y);
    zs_release(l);
    zs_module_free(le);
    zt_section("flatten");
}

static void test_checkpoint(void)
{
    char path[128], bad[128];
    snprintf(path, sizeof path, "/tmp/zs_test_nn_%d.safetensors", (int)getpid());
    snprintf(bad, sizeof bad, "/tmp/zs_test_nn_%d_bad.safetensors", (int)getpid());
    zs_module *a = zs_resnet_small_new(3), *b = zs_resnet_small_new(4);
    ZT_CHECK(zs_module_save(path, a, NULL, "{\"model\":\"resnet\"}") == ZS_OK, "save");
    char *meta = NULL;
    ZT_CHECK(zs_module_load(path, b, NULL, &meta) == ZS_OK && meta &&
             strstr(meta, "resnet"), "load");
    free(meta);
    zs_tensor **pa, **pb;
    char **na, **nb;
    int n = zs_module_parameters(a, &pa, &na);
    zs_module_parameters(b, &pb, &nb);
    int diff = 0;
    for (int i = 0; i < n; i++)
        for (int64_t k = 0; k < zs_numel(pa[i]); k += 7)
            diff += zs_get(pa[i], k) != zs_get(pb[i], k);
    ZT_CHECK(diff == 0, "parameters restored (%d differ)", diff);
    zs_names_free(n, pa, na);
    zs_names_free(n, pb, nb);
    zs_module *le = zs_lenet5_new(5);
    double before = zs_get(le->children[0]->params[0], 0);
    ZT_EXPECT_ERROR(zs_module_load(path, le, NULL, NULL) < 0, "the model expects");
    ZT_CHECK(zs_get(le->children[0]->params[0], 0) == before, "failed load changes nothing");
    FILE *f = fopen(path, "rb"), *g = fopen(bad, "wb");
    char buf[400];
    size_t got = fread(buf, 1, sizeof buf, f);
    fwrite(buf, 1, got, g);
    fclose(f);
    fclose(g);
    ZT_EXPECT_ERROR(zs_module_load(bad, b, NULL, NULL) < 0, "safetensors");
    unlink(path);
    unlink(bad);
    zs_module_free(a);
    zs_module_free(b);
    zs_module_free(le);
    zt_section("checkpoints");
}

static void test_loader(void)
{
    int64_t n = 103;
    zs_image_data d = {zs_zeros(ZS_U8, ZS_SHAPE(103, 2, 3)), zs_zeros(ZS_U8, ZS_SHAPE(103))};
    uint8_t *img = zs_data(d.images), *lab = zs_data(d.labels);
    for (int64_t i = 0; i < n; i++) {
        img[i * 6] = (uint8_t)i; /* pixel 0 identifies the example */
        lab[i] = (uint8_t)(i % 10);
    }
    zs_loader *l = zs_loader_new(&d, 10, true, 7, 0.0f, 1.0f);
    ZT_CHECK(l && zs_loader_batches_per_epoch(l) == 11, "batches per epoch");
    int seen[103] = {0}, count = 0;
    int64_t first[2][10];
    for (int e = 0; e < 2; e++) {
        zs_tensor *x, *y;
        int k = 0;
        while (zs_loader_next(l, &x, &y) == 0) {
            for (int64_t i = 0; i < x->shape[0]; i++) {
                int id = (int)lround(zs_get(x, i * 6) * 255.0);
                if (e == 0) {
                    seen[id]++;
                    count++;
                    ZT_CHECK(zs_get(y, i) == id % 10, "label follows image");
                }
                if (k == 0)
                    first[e][i] = id;
            }
            k++;
            zs_release(x);
            zs_release(y);
        }
    }
    int bad = 0;
    for (int i = 0; i < 103; i++)
        bad += seen[i] != 1;
    ZT_CHECK(count == 103 && bad == 0, "an epoch is a permutation (%d bad)", bad);
    ZT_CHECK(memcmp(first[0], first[1], sizeof first[0]) != 0, "epochs differ in order");
    zs_loader_seek(l, 1, 0);
    zs_tensor *x, *y;
    zs_loader_next(l, &x, &y);
    ZT_CHECK(lround(zs_get(x, 0) * 255.0) == first[1][0], "seek rebuilds the same batch");
    zs_release(x);
    zs_release(y);
    zs_loader_free(l);
    ZT_EXPECT_ERROR(zs_loader_new(&d, 0, true, 1, 0, 1) == NULL, "batch > 0");
    zs_image_data_free(&d);
    zs_image_data e = {0};
    ZT_EXPECT_ERROR(zs_mnist_load("/nonexistent", true, &e) < 0, "does not exist");
    zt_section("loader");
}

int main(void)
{
    test_linear();
    test_models();
    test_flatten();
    test_checkpoint();
    test_loader();
    return zt_done();
}
