/*
 * eval.c - `zs eval --ckpt PATH`: accuracy and confusion matrix of a CNN
 * checkpoint on the test set; and the evaluation loop `zs train` uses.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "apps/zs/cnn.h"
#include "apps/zs/commands.h"
#include "apps/zs/common.h"
#include "apps/zs/flags.h"

zs_status app_mnist_load(const char *dir, bool train, zs_image_data *out)
{
    zs_status st = zs_mnist_load(dir, train, out);
    if (st != ZS_OK)
        return st;
    const int64_t *s = out->images->shape;
    const char *file = train ? "train-images-idx3-ubyte" : "t10k-images-idx3-ubyte";
    if (s[0] == 0)
        st = zs_set_error_code(ZS_ERR_FORMAT, "data: %s/%s[.gz] holds no images",
                               dir, file);
    else if (s[1] != 28 || s[2] != 28)
        st = zs_set_error_code(ZS_ERR_FORMAT, "data: %s/%s[.gz] holds images "
                               "[%lld, %lld, %lld]; lenet and resnet want [N, 28, "
                               "28]", dir, file, (long long)s[0], (long long)s[1],
                               (long long)s[2]);
    if (st != ZS_OK)
        zs_image_data_free(out);
    return st;
}

zs_status app_evaluate(zs_module *m, const zs_image_data *d,
                          eval_result *r)
{
    memset(r, 0, sizeof *r);
    zs_loader *l = zs_loader_new(d, 1000, false, 0, ZS_FMNIST_MEAN, ZS_FMNIST_STD);
    if (!l)
        return ZS_ERR_ARG;
    bool was_training = m->training;
    zs_module_train(m, false);
    zs_no_grad_push();
    zs_status st = ZS_OK;
    double loss_sum = 0;
    int64_t correct = 0;
    for (;;) {
        zs_scope_push();
        zs_tensor *x, *y;
        int rc = zs_loader_next(l, &x, &y);
        if (rc != 0) {
            zs_scope_pop();
            st = rc < 0 ? rc : ZS_OK;
            break;
        }
        int dev = zs_module_device(m); /* the batch goes where the model is */
        zs_tensor *logits = zs_module_forward(m, zs_to_device(x, dev));
        zs_tensor *loss = zs_cross_entropy(logits, zs_to_device(y, dev), -100);
        /* the predictions come back to the host to be counted */
        zs_tensor *pred = zs_to_device(zs_argmax(logits, 1, false), ZS_CPU);
        if (!loss || !pred) {
            zs_scope_pop();
            st = ZS_ERR_ARG;
            break;
        }
        int64_t b = y->shape[0];
        loss_sum += zs_item(loss) * (double)b;
        const int64_t *yt = zs_data(y), *pt = zs_data(pred);
        for (int64_t i = 0; i < b; i++) {
            correct += yt[i] == pt[i];
            r->confusion[yt[i]][pt[i]]++;
        }
        r->n += b;
        zs_scope_pop();
    }
    zs_no_grad_pop();
    zs_module_train(m, was_training);
    zs_loader_free(l);
    r->loss = r->n ? loss_sum / (double)r->n : 0;
    r->accuracy = r->n ? (double)correct / (double)r->n : 0;
    return st;
}

static void print_result(const char *model_name, const eval_result *r)
{
    printf("model %s, %lld test images: accuracy %.2f%%, loss %.4f\n",
           model_name, (long long)r->n, 100 * r->accuracy, r->loss);
    printf("confusion matrix (rows: true class, columns: predicted)\n     ");
    for (int j = 0; j < 10; j++)
        printf("%6d", j);
    printf("\n");
    for (int i = 0; i < 10; i++) {
        printf("%4d ", i);
        for (int j = 0; j < 10; j++)
            printf("%6lld", (long long)r->confusion[i][j]);
        printf("\n");
    }
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: zs eval --ckpt PATH [flags]\n"
            "  --ckpt PATH       a checkpoint written by zs train lenet|resnet, or its\n"
            "                    output directory\n"
            "  --data DIR        MNIST-format directory whose test set is used\n"
            "                    (default %s)\n", ZS_FMNIST_DIR);
}

int cmd_eval(int argc, char **argv)
{
    const char *ckpt = NULL, *data = ZS_FMNIST_DIR;
    flag t[] = {
        FLAG_STR("--ckpt", &ckpt),
        FLAG_STR("--data", &data),
    };
    int p = flags_parse("zs eval", t, NFLAGS(t), usage, argc, argv);
    if (p != FLAGS_OK)
        return flags_exit(p);
    if (!ckpt)
        return flags_error("zs eval", "--ckpt PATH is required (see zs eval "
                              "--help)");
    zs_model_file mf;
    zs_image_data test = {0};
    zs_status st = zs_model_open(ckpt, &mf);
    if (st == ZS_OK && strcmp(mf.kind, "gpt") != 0)
        st = app_mnist_load(data, false, &test);
    else if (st == ZS_OK)
        st = zs_set_error("%s holds a %s; zs eval evaluates lenet or resnet "
                          "checkpoints (zs generate runs GPTs)", ckpt, mf.kind);
    if (st != ZS_OK) {
        fprintf(stderr, "zs eval: %s\n", zs_last_error());
        zs_model_close(&mf);
        return 2;
    }
    zs_module *m = mf.model;
    const char *model_name = mf.kind;
    eval_result r;
    st = app_evaluate(m, &test, &r);
    if (st == ZS_OK)
        print_result(model_name, &r);
    else
        fprintf(stderr, "zs eval: %s\n", zs_last_error());
    zs_image_data_free(&test);
    zs_model_close(&mf);
    return st == ZS_OK ? 0 : 1;
}
