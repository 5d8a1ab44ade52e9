/*
 * cnn.h - pieces shared by `zs train lenet|resnet` and `zs eval`.
 */
#ifndef ZS_APPS_CNN_H
#define ZS_APPS_CNN_H

#include "zs/zs.h"

/* Loads the train or test half of an MNIST-format directory and checks
 * that it suits the CNNs: N > 0 images u8 [N, 28, 28] (the library checks
 * the labels: [N], < 10). ZS_OK, or an error naming the file and the shape
 * found; out is empty then. */
zs_status app_mnist_load(const char *dir, bool train, zs_image_data *out);

typedef struct eval_result {
    double loss, accuracy;
    int64_t n;
    int64_t confusion[10][10]; /* [true][predicted] */
} eval_result;

/* Mean cross-entropy and accuracy of m (put in eval mode for the call) on
 * the whole data set, in batches of 1000 under no-grad. */
zs_status app_evaluate(zs_module *m, const zs_image_data *d,
                          eval_result *r);

/* Normalisation of Fashion-MNIST pixels (mean, std of the training set). */
#define ZS_FMNIST_MEAN 0.2860f
#define ZS_FMNIST_STD 0.3530f
#define ZS_FMNIST_DIR "/usr/share/datasets/fashion-mnist"

#endif
