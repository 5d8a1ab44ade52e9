/*
 * loader.c - shuffled mini-batches of images, prepared one batch ahead by
 * a background thread.
 *
 * Only the producer thread builds batches: the consumer posts a request
 * (epoch, index) and takes the finished batch from a one-slot mailbox,
 * then immediately requests the following batch, so preparing batch k+1
 * overlaps training on batch k. Epoch e's order is a Fisher-Yates shuffle
 * driven by Philox keyed with (seed, e): any (epoch, index) can be rebuilt
 * exactly, which is what resuming from a checkpoint needs.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "zs/ops.h"
#include "zs/io.h"

struct zs_loader {
    zs_tensor *images, *labels;
    int64_t n, h, w, batch, nb;
    bool shuffle;
    uint64_t seed;
    float mean, std;
    int64_t epoch, index; /* next batch to hand out */

    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool stop, has_request, has_result, busy;
    int64_t busy_epoch, busy_index; /* what the producer is building */
    int64_t req_epoch, req_index, res_epoch, res_index;
    zs_tensor *res_x, *res_y;

    int64_t *perm; /* producer-owned: order of perm_epoch */
    int64_t perm_epoch;
};

static void make_perm(zs_loader *l, int64_t epoch)
{
    for (int64_t i = 0; i < l->n; i++)
        l->perm[i] = i;
    if (l->shuffle) {
        uint64_t key = l->seed * 0x9E3779B97F4A7C15ull + (uint64_t)epoch;
        for (int64_t i = l->n - 1; i > 0; i--) {
            uint32_t r[4];
            zs_philox(key, (uint64_t)i, r);
            uint64_t x = ((uint64_t)r[0] << 32) | r[1];
            int64_t j = (int64_t)(x % (uint64_t)(i + 1));
            int64_t t = l->perm[i];
            l->perm[i] = l->perm[j];
            l->perm[j] = t;
        }
    }
    l->perm_epoch = epoch;
}

static void build(zs_loader *l, int64_t epoch, int64_t index, zs_tensor **xo,
                  zs_tensor **yo)
{
    if (l->perm_epoch != epoch)
        make_perm(l, epoch);
    int64_t b0 = index * l->batch, b = l->n - b0 < l->batch ? l->n - b0 : l->batch;
    zs_tensor *x = zs_empty(ZS_F32, 4, (int64_t[]){b, 1, l->h, l->w});
    zs_tensor *y = zs_empty(ZS_I64, 1, &b);
    if (x && y) {
        const uint8_t *img = zs_data(l->images), *lab = zs_data(l->labels);
        float *xd = zs_data(x);
        int64_t *yd = zs_data(y), hw = l->h * l->w;
        float scale = 1.0f / (255.0f * l->std), shift = l->mean / l->std;
        for (int64_t k = 0; k < b; k++) {
            int64_t s = l->perm[b0 + k];
            const uint8_t *src = img + s * hw;
            for (int64_t p = 0; p < hw; p++)
                xd[k * hw + p] = (float)src[p] * scale - shift;
            yd[k] = lab[s];
        }
    } else {
        zs_release(x);
        zs_release(y);
        x = y = NULL;
    }
    *xo = x;
    *yo = y;
}

static void *producer(void *arg)
{
    zs_loader *l = arg;
    pthread_mutex_lock(&l->mu);
    for (;;) {
        while (!l->stop && !l->has_request)
            pthread_cond_wait(&l->cv, &l->mu);
        if (l->stop)
            break;
        int64_t e = l->req_epoch, i = l->req_index;
        l->has_request = false;
        l->busy = true;
        l->busy_epoch = e;
        l->busy_index = i;
        pthread_mutex_unlock(&l->mu);
        zs_tensor *x, *y;
        build(l, e, i, &x, &y);
        pthread_mutex_lock(&l->mu);
        zs_release(l->res_x);
        zs_release(l->res_y);
        l->res_x = x;
        l->res_y = y;
        l->res_epoch = e;
        l->res_index = i;
        l->has_result = true;
        l->busy = false;
        pthread_cond_broadcast(&l->cv);
    }
    pthread_mutex_unlock(&l->mu);
    return NULL;
}

/* Caller holds mu. */
static void request(zs_loader *l, int64_t epoch, int64_t index)
{
    if (index >= l->nb) {
        epoch++;
        index = 0;
    }
    if (l->has_result && l->res_epoch == epoch && l->res_index == index)
        return;
    if (l->busy && l->busy_epoch == epoch && l->busy_index == index) {
        l->has_request = false; /* already being built */
        return;
    }
    l->req_epoch = epoch;
    l->req_index = index;
    l->has_request = true;
    pthread_cond_broadcast(&l->cv);
}

zs_loader *zs_loader_new(const zs_image_data *d, int64_t batch, bool shuffle,
                         uint64_t seed, float mean, float std)
{
    if (!d || !d->images || !d->labels || d->images->ndim != 3 || batch <= 0 ||
        !(std > 0) || d->images->shape[0] == 0) {
        zs_set_error("loader: needs images [N, H, W] with N > 0, batch > 0 "
                     "(got %lld) and std > 0", (long long)batch);
        return NULL;
    }
    zs_loader *l = calloc(1, sizeof *l);
    if (!l)
        goto oom;
    zsi_tracking_pause();
    l->images = zs_contiguous(d->images);
    l->labels = zs_contiguous(d->labels);
    zsi_tracking_resume();
    l->n = d->images->shape[0];
    l->h = d->images->shape[1];
    l->w = d->images->shape[2];
    l->batch = batch;
    l->nb = (l->n + batch - 1) / batch;
    l->shuffle = shuffle;
    l->seed = seed;
    l->mean = mean;
    l->std = std;
    l->perm = malloc((size_t)l->n * sizeof *l->perm);
    l->perm_epoch = -1;
    if (!l->images || !l->labels || !l->perm)
        goto oom;
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->cv, NULL);
    if (pthread_create(&l->thread, NULL, producer, l) != 0) {
        pthread_mutex_destroy(&l->mu);
        pthread_cond_destroy(&l->cv);
        goto oom;
    }
    pthread_mutex_lock(&l->mu);
    request(l, 0, 0);
    pthread_mutex_unlock(&l->mu);
    return l;
oom:
    if (l) {
        zs_release(l->images);
        zs_release(l->labels);
        free(l->perm);
        free(l);
    }
    zs_set_error_code(ZS_ERR_NOMEM, "loader: cannot start (out of memory or "
                      "threads)");
    return NULL;
}

void zs_loader_free(zs_loader *l)
{
    if (!l)
        return;
    pthread_mutex_lock(&l->mu);
    l->stop = true;
    pthread_cond_broadcast(&l->cv);
    pthread_mutex_unlock(&l->mu);
    pthread_join(l->thread, NULL);
    pthread_mutex_destroy(&l->mu);
    pthread_cond_destroy(&l->cv);
    zs_release(l->res_x);
    zs_release(l->res_y);
    zs_release(l->images);
    zs_release(l->labels);
    free(l->perm);
    free(l);
}

void zs_loader_seek(zs_loader *l, int64_t epoch, int64_t index)
{
    pthread_mutex_lock(&l->mu);
    l->epoch = epoch;
    l->index = index;
    request(l, epoch, index);
    pthread_mutex_unlock(&l->mu);
}

int zs_loader_next(zs_loader *l, zs_tensor **x, zs_tensor **y)
{
    *x = *y = NULL;
    if (l->index >= l->nb) {
        pthread_mutex_lock(&l->mu);
        l->epoch++;
        l->index = 0;
        request(l, l->epoch, 0);
        pthread_mutex_unlock(&l->mu);
        return 1;
    }
    pthread_mutex_lock(&l->mu);
    request(l, l->epoch, l->index);
    while (!(l->has_result && l->res_epoch == l->epoch && l->res_index == l->index))
        pthread_cond_wait(&l->cv, &l->mu);
    *x = l->res_x;
    *y = l->res_y;
    l->res_x = l->res_y = NULL;
    l->has_result = false;
    l->index++;
    request(l, l->epoch, l->index);
    pthread_mutex_unlock(&l->mu);
    if (!*x || !*y) {
        zs_release(*x);
        zs_release(*y);
        *x = *y = NULL;
        zs_set_error_code(ZS_ERR_NOMEM, "loader: out of memory building a batch");
        return ZS_ERR_NOMEM;
    }
    zsi_track(*x);
    zsi_track(*y);
    return 0;
}

int64_t zs_loader_batches_per_epoch(const zs_loader *l) { return l->nb; }
int64_t zs_loader_epoch(const zs_loader *l) { return l->epoch; }
int64_t zs_loader_index(const zs_loader *l) { return l->index; }
