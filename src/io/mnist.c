/*
 * mnist.c - MNIST / Fashion-MNIST image sets from IDX files.
 */
#include <string.h>
#include <sys/stat.h>

#include "core/internal.h"
#include "zs/ops.h"
#include "zs/io.h"

/* Finds "<dir>/<stem>" or "<dir>/<stem>.gz". */
static bool find_file(const char *dir, const char *stem, char *out, size_t n)
{
    struct stat st;
    snprintf(out, n, "%s/%s.gz", dir, stem);
    if (stat(out, &st) == 0)
        return true;
    snprintf(out, n, "%s/%s", dir, stem);
    return stat(out, &st) == 0;
}

zs_status zs_mnist_load(const char *dir, bool train, zs_image_data *out)
{
    memset(out, 0, sizeof *out);
    const char *pre = train ? "train" : "t10k";
    char stem[64], ipath[4096], lpath[4096];
    struct stat st;
    if (!dir || stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return zs_set_error_code(ZS_ERR_IO, "data: directory '%s' does not "
                                 "exist (install dataset-fashion-mnist or pass "
                                 "--data DIR)", dir ? dir : "(null)");
    snprintf(stem, sizeof stem, "%s-images-idx3-ubyte", pre);
    if (!find_file(dir, stem, ipath, sizeof ipath))
        return zs_set_error_code(ZS_ERR_IO, "data: %s/%s[.gz] not found", dir, stem);
    snprintf(stem, sizeof stem, "%s-labels-idx1-ubyte", pre);
    if (!find_file(dir, stem, lpath, sizeof lpath))
        return zs_set_error_code(ZS_ERR_IO, "data: %s/%s[.gz] not found", dir, stem);
    zsi_tracking_pause();
    zs_status s = ZS_OK;
    out->images = zs_idx_load(ipath);
    out->labels = out->images ? zs_idx_load(lpath) : NULL;
    if (!out->images || !out->labels) {
        s = ZS_ERR_FORMAT;
    } else if (out->images->dtype != ZS_U8 || out->images->ndim != 3 ||
               out->labels->dtype != ZS_U8 || out->labels->ndim != 1) {
        s = zs_set_error_code(ZS_ERR_FORMAT, "data: %s must hold u8 [N, H, W] "
                              "and %s u8 [N]", ipath, lpath);
    } else if (out->images->shape[0] != out->labels->shape[0]) {
        s = zs_set_error_code(ZS_ERR_FORMAT, "data: %lld images but %lld labels "
                              "in %s", (long long)out->images->shape[0],
                              (long long)out->labels->shape[0], dir);
    } else {
        const uint8_t *lab = zs_data(out->labels);
        for (int64_t i = 0; i < out->labels->shape[0]; i++)
            if (lab[i] >= 10) {
                s = zs_set_error_code(ZS_ERR_FORMAT, "data: %s: label %d at "
                                      "index %lld, expected 0..9", lpath,
                                      lab[i], (long long)i);
                break;
            }
    }
    zsi_tracking_resume();
    if (s != ZS_OK)
        zs_image_data_free(out);
    return s;
}

void zs_image_data_free(zs_image_data *d)
{
    zs_release(d->images);
    zs_release(d->labels);
    d->images = d->labels = NULL;
}

zs_status zs_image_data_head(const zs_image_data *d, int64_t n,
                             zs_image_data *out)
{
    if (n > d->images->shape[0])
        n = d->images->shape[0];
    zsi_tracking_pause();
    out->images = zs_narrow(d->images, 0, 0, n);
    out->labels = zs_narrow(d->labels, 0, 0, n);
    zsi_tracking_resume();
    if (!out->images || !out->labels) {
        zs_image_data_free(out);
        return ZS_ERR_NOMEM;
    }
    return ZS_OK;
}
