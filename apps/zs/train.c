/*
 * train.c - `zs train lenet|resnet`: trains a CNN on Fashion-MNIST (or any
 * MNIST-format directory) with a progress bar, test accuracy after every
 * epoch, metrics.jsonl, an SVG of the curves and a checkpoint per epoch;
 * --resume continues a stopped run exactly (same batches, same optimizer
 * state, so the same losses).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "apps/zs/cnn.h"
#include "apps/zs/commands.h"
#include "apps/zs/common.h"
#include "apps/zs/flags.h"

typedef struct train_cfg {
    const char *model, *data, *out, *optim, *schedule;
    int epochs, threads, stop_after;
    int64_t batch, limit;
    double lr, momentum, wd;
    uint64_t seed;
    bool resume;
} train_cfg;

typedef struct history {
    int64_t n, cap;
    double *step, *loss;             /* per step */
    int ne;
    double ep[256], test_loss[256], test_acc[256], train_loss[256];
} history;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: zs train lenet|resnet [flags]   (zs train gpt --help for GPTs)\n"
            "  --epochs N        epochs (default 5)\n"
            "  --batch N         batch size (default 64)\n"
            "  --optim NAME      sgd | adam | adamw (default adam)\n"
            "  --lr X            learning rate (default 1e-3 adam, 0.05 sgd)\n"
            "  --momentum X      SGD momentum (default 0.9)\n"
            "  --wd X            weight decay (default 0)\n"
            "  --schedule NAME   constant | cosine (1 epoch warm-up) | step (x0.1 every\n"
            "                    2 epochs) (default constant)\n"
            "  --seed N          seed for init and shuffling (default 1)\n"
            "  --threads N       worker threads (default ZS_NUM_THREADS)\n"
            "  --data DIR        MNIST-format directory (default %s)\n"
            "  --out DIR         output directory (default runs/<model>)\n"
            "  --limit N         train on the first N images only (all of them\n"
            "                    when the set has fewer)\n"
            "  --resume          continue from DIR/checkpoint.safetensors\n"
            "  --stop-after N    stop after epoch N (to test --resume)\n",
            ZS_FMNIST_DIR);
}

/* Parses argv into c: FLAGS_OK, FLAGS_HELP or FLAGS_BAD (printed). */
static int parse_args(int argc, char **argv, train_cfg *c)
{
    *c = (train_cfg){NULL, ZS_FMNIST_DIR, NULL, "adam", "constant", 5, 0, 0, 64, 0,
                     -1, 0.9, 0, 1, false};
    flag t[] = {
        FLAG_ARG("MODEL", &c->model, "lenet|resnet|gpt"),
        FLAG_NUM("--epochs", &c->epochs, 1, 1000),
        FLAG_NUM("--batch", &c->batch, 1, 1 << 20),
        FLAG_CHOICE("--optim", &c->optim, "sgd|adam|adamw"),
        FLAG_NUM("--lr", &c->lr, 0, 10),
        FLAG_NUM("--momentum", &c->momentum, 0, 0.999),
        FLAG_NUM("--wd", &c->wd, 0, 1),
        FLAG_CHOICE("--schedule", &c->schedule, "constant|cosine|step"),
        FLAG_NUM("--seed", &c->seed, 0, FLAG_EXACT_MAX),
        FLAG_NUM("--threads", &c->threads, 1, 256),
        FLAG_STR("--data", &c->data),
        FLAG_STR("--out", &c->out),
        FLAG_NUM("--limit", &c->limit, 1, 1e9),
        FLAG_SWITCH("--resume", &c->resume),
        FLAG_NUM("--stop-after", &c->stop_after, 1, 1000),
    };
    int p = flags_parse("zs train", t, NFLAGS(t), usage, argc, argv);
    if (p != FLAGS_OK)
        return p;
    if (!c->model)
        return flags_error("zs train", "which model? (lenet or resnet; "
                              "see zs train --help)");
    if (!strcmp(c->model, "gpt")) /* cmd_train sends `zs train gpt ...` on */
        return flags_error("zs train", "gpt comes first: zs train gpt [flags]");
    if (c->lr < 0)
        c->lr = strcmp(c->optim, "sgd") ? 1e-3 : 0.05;
    return FLAGS_OK;
}

static void progress(bool tty, int epoch, int epochs, int64_t i, int64_t nb,
                     double loss, double ips, double eta)
{
    if (tty) {
        int w = 24, done = (int)(w * (i + 1) / nb);
        fprintf(stderr, "\repoch %d/%d [", epoch + 1, epochs);
        for (int k = 0; k < w; k++)
            fputc(k < done ? '=' : k == done ? '>' : ' ', stderr);
        fprintf(stderr, "] %lld/%lld loss %.4f %.0f img/s ETA %d:%02d   ",
                (long long)(i + 1), (long long)nb, loss, ips, (int)eta / 60,
                (int)eta % 60);
    } else if ((i + 1) % (nb / 5 > 0 ? nb / 5 : 1) == 0 || i + 1 == nb) {
        fprintf(stderr, "epoch %d/%d step %lld/%lld loss %.4f %.0f img/s ETA %d:%02d\n",
                epoch + 1, epochs, (long long)(i + 1), (long long)nb, loss, ips,
                (int)eta / 60, (int)eta % 60);
    }
}

static void history_push(history *h, double step, double loss)
{
    if (h->n == h->cap) {
        int64_t cap = h->cap ? 2 * h->cap : 1024;
        double *s = realloc(h->step, (size_t)cap * sizeof *s);
        if (s)
            h->step = s;
        double *l = realloc(h->loss, (size_t)cap * sizeof *l);
        if (l)
            h->loss = l;
        if (!s || !l)
            return;
        h->cap = cap;
    }
    h->step[h->n] = step;
    h->loss[h->n++] = loss;
}

static void write_plot(const train_cfg *c, const history *h)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/curves.svg", c->out);
    const char *titles[] = {"loss", "test accuracy"};
    zs_plot_series s[] = {
        {"train loss (per epoch)", 0, h->ne, h->ep, h->train_loss},
        {"test loss", 0, h->ne, h->ep, h->test_loss},
        {"test accuracy", 1, h->ne, h->ep, h->test_acc},
    };
    if (zs_svg_plot(path, c->model, 2, titles, 3, s) != ZS_OK)
        fprintf(stderr, "zs train: warning: %s\n", zs_last_error());
}

static int run(train_cfg *c)
{
    int rc = 2;
    zs_image_data train = {0}, test = {0}, full = {0};
    zs_module *m = NULL;
    zs_optim *o = NULL;
    zs_loader *l = NULL;
    FILE *metrics = NULL;
    history h = {0};
    char outbuf[4096], path[4200];
    if (!c->out) {
        snprintf(outbuf, sizeof outbuf, "runs/%s", c->model);
        c->out = outbuf;
    }
    if (app_mnist_load(c->data, true, &full) != ZS_OK ||
        app_mnist_load(c->data, false, &test) != ZS_OK)
        goto fail;
    if (c->limit > 0) {
        if (zs_image_data_head(&full, c->limit, &train) != ZS_OK)
            goto fail;
    } else {
        train.images = zs_retain(full.images);
        train.labels = zs_retain(full.labels);
    }
    if (!(m = app_cnn_new(c->model, c->seed)))
        goto fail;
    zs_tensor *fp, *fg;
    if (zs_module_flatten(m, &fp, &fg) != ZS_OK)
        goto fail;
    fp->grad = zs_retain(fg);
    zs_optim_kind kind = !strcmp(c->optim, "sgd") ? ZS_SGD
                       : !strcmp(c->optim, "adam") ? ZS_ADAM : ZS_ADAMW;
    zs_optim_config oc = {kind, c->lr, kind == ZS_SGD ? c->momentum : 0, false,
                          c->wd, 0, 0, 0};
    if (!(o = zs_optim_new(&oc, 1, &fp)))
        goto fail;
    mkdir("runs", 0755);
    struct stat so;
    if (mkdir(c->out, 0755) != 0 && access(c->out, W_OK) != 0) {
        zs_set_error("cannot create output directory %s", c->out);
        goto fail;
    }
    if (stat(c->out, &so) != 0 || !S_ISDIR(so.st_mode)) {
        zs_set_error("--out %s exists and is not a directory", c->out);
        goto fail;
    }
    snprintf(path, sizeof path, "%s/checkpoint.safetensors", c->out);
    int start_epoch = 0;
    if (c->resume) {
        char *meta = NULL;
        if (zs_module_load(path, m, o, &meta) != ZS_OK)
            goto fail;
        start_epoch = (int)app_meta_int(meta, "epoch", 0);
        zs_optim_set_steps(o, app_meta_int(meta, "optim_steps", 0));
        zs_rng_set_state((uint64_t)app_meta_int(meta, "rng_seed", 0),
                         (uint64_t)app_meta_int(meta, "rng_offset", 0));
        char want[64];
        snprintf(want, sizeof want, "\"model\":\"%s\"", c->model);
        bool same = meta && strstr(meta, want);
        free(meta);
        if (!same) {
            zs_set_error("checkpoint %s was not written for model %s", path, c->model);
            goto fail;
        }
        fprintf(stderr, "resuming %s after epoch %d\n", path, start_epoch);
    } else {
        zs_manual_seed(c->seed);
    }
    snprintf(path, sizeof path, "%s/metrics.jsonl", c->out);
    if (!(metrics = fopen(path, c->resume ? "a" : "w"))) {
        zs_set_error("cannot write %s", path);
        goto fail;
    }
    if (!(l = zs_loader_new(&train, c->batch, true, c->seed, ZS_FMNIST_MEAN, ZS_FMNIST_STD)))
        goto fail;
    fprintf(stderr, "%s: %lld parameters, %lld train / %lld test images, "
            "batch %lld, %s lr %g, %d threads\n", c->model,
            (long long)zs_module_num_params(m), (long long)train.images->shape[0],
            (long long)test.images->shape[0], (long long)c->batch, c->optim,
            c->lr, zs_num_threads());
    rc = 1;
    bool tty = isatty(2);
    int64_t nb = zs_loader_batches_per_epoch(l);
    zs_lr_schedule sched = {ZS_LR_CONSTANT, c->lr, 0, 0, 0, 0, 0};
    if (!strcmp(c->schedule, "cosine"))
        sched = (zs_lr_schedule){ZS_LR_COSINE, c->lr, nb, nb * c->epochs, c->lr / 100, 0, 0};
    else if (!strcmp(c->schedule, "step"))
        sched = (zs_lr_schedule){ZS_LR_STEP, c->lr, 0, 0, 0, 2 * nb, 0.1};
    double t_start = app_now();
    int last = c->stop_after > 0 && c->stop_after < c->epochs ? c->stop_after : c->epochs;
    for (int ep = start_epoch; ep < last; ep++) {
        zs_loader_seek(l, ep, 0);
        zs_module_train(m, true);
        double t0 = app_now(), loss_sum = 0;
        int64_t seen = 0;
        for (int64_t i = 0; i < nb; i++) {
            zs_scope_push();
            zs_tensor *x, *y;
            if (zs_loader_next(l, &x, &y) != 0) {
                zs_scope_pop();
                goto fail;
            }
            zs_tensor *logits = zs_module_forward(m, x);
            zs_tensor *loss = zs_cross_entropy(logits, y, -100);
            if (!loss || zs_backward(loss, NULL, false) != ZS_OK ||
                zs_optim_step(o, zs_lr_at(&sched, zs_optim_steps(o))) != ZS_OK) {
                zs_scope_pop();
                goto fail;
            }
            zs_fill_(fg, 0.0);
            double lv = zs_item(loss);
            int64_t b = y->shape[0];
            zs_scope_pop();
            loss_sum += lv * (double)b;
            seen += b;
            int64_t step = (int64_t)ep * nb + i;
            fprintf(metrics, "{\"epoch\":%d,\"step\":%lld,\"loss\":%.9g}\n", ep + 1,
                    (long long)step, lv);
            history_push(&h, (double)step / (double)nb, lv);
            double dt = app_now() - t0, ips = (double)seen / (dt > 0 ? dt : 1e-9);
            double eta = (double)(nb - i - 1) * dt / (double)(i + 1) +
                         (double)(last - ep - 1) * dt * (double)nb / (double)(i + 1);
            progress(tty, ep, c->epochs, i, nb, loss_sum / (double)seen, ips, eta);
        }
        if (tty)
            fputc('\n', stderr);
        double epoch_s = app_now() - t0;
        eval_result r;
        if (app_evaluate(m, &test, &r) != ZS_OK)
            goto fail;
        printf("epoch %d: train loss %.4f, test loss %.4f, test accuracy %.2f%%, "
               "%.1f s\n", ep + 1, loss_sum / (double)seen, r.loss, 100 * r.accuracy,
               epoch_s);
        fflush(stdout);
        fprintf(metrics, "{\"epoch\":%d,\"train_loss\":%.9g,\"test_loss\":%.9g,"
                "\"test_accuracy\":%.6f,\"epoch_seconds\":%.3f}\n", ep + 1,
                loss_sum / (double)seen, r.loss, r.accuracy, epoch_s);
        fflush(metrics);
        if (h.ne < 256) {
            h.ep[h.ne] = ep + 1;
            h.train_loss[h.ne] = loss_sum / (double)seen;
            h.test_loss[h.ne] = r.loss;
            h.test_acc[h.ne++] = r.accuracy;
        }
        uint64_t rs, ro;
        zs_rng_get_state(&rs, &ro);
        char meta[512];
        snprintf(meta, sizeof meta, "{\"model\":\"%s\",\"epoch\":\"%d\","
                 "\"optim_steps\":\"%lld\",\"rng_seed\":\"%llu\",\"rng_offset\":"
                 "\"%llu\",\"optim\":\"%s\",\"test_accuracy\":\"%.4f\"}", c->model,
                 ep + 1, (long long)zs_optim_steps(o), (unsigned long long)rs,
                 (unsigned long long)ro, c->optim, r.accuracy);
        snprintf(path, sizeof path, "%s/checkpoint.safetensors", c->out);
        if (zs_module_save(path, m, o, meta) != ZS_OK)
            goto fail;
        write_plot(c, &h);
    }
    fprintf(stderr, "done in %.1f s; checkpoint, metrics.jsonl and curves.svg in %s\n",
            app_now() - t_start, c->out);
    rc = 0;
fail:
    if (rc)
        fprintf(stderr, "zs train: %s\n", zs_last_error());
    if (metrics)
        fclose(metrics);
    zs_loader_free(l);
    zs_optim_free(o);
    zs_module_free(m);
    zs_image_data_free(&train);
    zs_image_data_free(&test);
    zs_image_data_free(&full);
    free(h.step);
    free(h.loss);
    return rc;
}

int cmd_train(int argc, char **argv)
{
    if (argc >= 2 && !strcmp(argv[1], "gpt"))
        return cmd_train_gpt(argc - 1, argv + 1);
    train_cfg c;
    int p = parse_args(argc, argv, &c);
    if (p != FLAGS_OK)
        return flags_exit(p);
    if (c.threads > 0)
        zs_set_num_threads(c.threads);
    return run(&c);
}
