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
    const char *model, *data, *out, *optim, *schedule, *device;
    int epochs, threads, stop_after, dev, precision;
    int64_t batch, limit;
    double lr, momentum, wd;
    uint64_t seed;
    bool resume, graph;
    const char *dump_graph;
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
            "  --stop-after N    stop after epoch N (to test --resume)\n"
            "  --device NAME     cpu (default), or test: the test device (host memory\n"
            "                    the host may not touch, running the CPU kernels)\n"
            "  --precision NAME  fp32 (default) | bf16 | fp16 (loss scaling) | fp8 (loss\n"
            "                    scaling; linears in fp8 with tile scales, the other\n"
            "                    products in bf16): mixed precision with f32 master\n"
            "                    weights (docs/precision.md)\n"
            "  --graph           capture the first step as a graph, replay it after\n"
            "                    (cpu; the last shorter batch recaptures)\n"
            "  --dump-graph FILE with --graph: the first graph before and after its\n"
            "                    passes as text in FILE (its replay profile appended)\n"
            "                    and Graphviz in FILE.dot\n",
            ZS_FMNIST_DIR);
}

/* Parses argv into c: FLAGS_OK, FLAGS_HELP or FLAGS_BAD (printed). */
static int parse_args(int argc, char **argv, train_cfg *c)
{
    *c = (train_cfg){NULL, ZS_FMNIST_DIR, NULL, "adam", "constant", "cpu", 5, 0, 0,
                     0, 0, 64, 0, -1, 0.9, 0, 1, false, false, NULL};
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
        FLAG_STR("--device", &c->device),
        FLAG_CHOICE("--precision", &c->precision, "fp32|bf16|fp16|fp8"),
        FLAG_SWITCH("--graph", &c->graph),
        FLAG_STR("--dump-graph", &c->dump_graph),
    };
    int p = flags_parse("zs train", t, NFLAGS(t), usage, argc, argv);
    if (p != FLAGS_OK)
        return p;
    if ((c->dev = app_device("zs train", c->device)) < 0)
        return FLAGS_BAD;
    if (!c->model)
        return flags_error("zs train", "which model? (lenet or resnet; "
                              "see zs train --help)");
    if (!strcmp(c->model, "gpt")) /* cmd_train sends `zs train gpt ...` on */
        return flags_error("zs train", "gpt comes first: zs train gpt [flags]");
    if (c->lr < 0)
        c->lr = strcmp(c->optim, "sgd") ? 1e-3 : 0.05;
    return FLAGS_OK;
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

/* The run's state seen by the trainer's callbacks. */
typedef struct cnn_run {
    const train_cfg *c;
    zs_loader *l;
    const zs_image_data *test;
    FILE *metrics;
    history h;
    bool tty;
    int64_t nb, seen;
    double loss_sum, t_epoch;
    eval_result r;   /* of the last validation */
    char meta[512];  /* the checkpoint's metadata, updated per epoch */
} cnn_run;

/* zs_batch_fn: batch index % nb of epoch index / nb (a seek only when the
 * loader is elsewhere, so its prefetch keeps working). */
static zs_status cnn_batch(void *ctx, int64_t index, zs_tensor **x, zs_tensor **y)
{
    cnn_run *r = ctx;
    int64_t ep = index / r->nb, i = index % r->nb;
    if (zs_loader_epoch(r->l) != ep || zs_loader_index(r->l) != i)
        zs_loader_seek(r->l, ep, i);
    return zs_loader_next(r->l, x, y) == 0 ? ZS_OK : ZS_ERR_STATE;
}

/* zs_eval_fn: test loss (accuracy and confusion kept in r->r). */
static double cnn_eval(void *ctx, zs_module *m)
{
    cnn_run *r = ctx;
    return app_evaluate(m, r->test, &r->r) == ZS_OK ? r->r.loss : NAN;
}

static void progress(const cnn_run *r, const zs_train_event *e)
{
    int64_t i = e->step % r->nb, ep = e->step / r->nb;
    double loss = r->loss_sum / (double)r->seen, ips = e->tokens_per_s;
    int eta = (int)e->eta_s, epochs = r->c->epochs;
    if (r->tty) {
        int w = 24, done = (int)(w * (i + 1) / r->nb);
        fprintf(stderr, "\repoch %d/%d [", (int)ep + 1, epochs);
        for (int k = 0; k < w; k++)
            fputc(k < done ? '=' : k == done ? '>' : ' ', stderr);
        fprintf(stderr, "] %lld/%lld loss %.4f %.0f img/s ETA %d:%02d   ",
                (long long)(i + 1), (long long)r->nb, loss, ips, eta / 60, eta % 60);
    } else if ((i + 1) % (r->nb / 5 > 0 ? r->nb / 5 : 1) == 0 || i + 1 == r->nb) {
        fprintf(stderr, "epoch %d/%d step %lld/%lld loss %.4f %.0f img/s ETA %d:%02d\n",
                (int)ep + 1, epochs, (long long)(i + 1), (long long)r->nb, loss, ips,
                eta / 60, eta % 60);
    }
}

/* The end of an epoch: its line, metrics, curves and checkpoint metadata. */
static void epoch_done(cnn_run *r, int ep)
{
    double train_loss = r->loss_sum / (double)r->seen, s = app_now() - r->t_epoch;
    if (r->tty)
        fputc('\n', stderr);
    printf("epoch %d: train loss %.4f, test loss %.4f, test accuracy %.2f%%, %.1f s\n",
           ep + 1, train_loss, r->r.loss, 100 * r->r.accuracy, s);
    fflush(stdout);
    fprintf(r->metrics, "{\"epoch\":%d,\"train_loss\":%.9g,\"test_loss\":%.9g,"
            "\"test_accuracy\":%.6f,\"epoch_seconds\":%.3f}\n", ep + 1, train_loss,
            r->r.loss, r->r.accuracy, s);
    fflush(r->metrics);
    history *h = &r->h;
    if (h->ne < 256) {
        h->ep[h->ne] = ep + 1;
        h->train_loss[h->ne] = train_loss;
        h->test_loss[h->ne] = r->r.loss;
        h->test_acc[h->ne++] = r->r.accuracy;
    }
    snprintf(r->meta, sizeof r->meta, "{\"model\":\"%s\",\"epoch\":\"%d\",\"optim\":\"%s\","
             "\"test_accuracy\":\"%.4f\"}", r->c->model, ep + 1, r->c->optim,
             r->r.accuracy);
    write_plot(r->c, h);
    r->loss_sum = 0;
    r->seen = 0;
    r->t_epoch = app_now();
}

/* zs_train_event_fn: per-step metrics and progress; per-epoch summary. */
static int on_step(void *ctx, const zs_train_event *e)
{
    cnn_run *r = ctx;
    int ep = (int)(e->step / r->nb);
    int64_t b = e->targets; /* images */
    r->loss_sum += e->loss * (double)b;
    r->seen += b;
    fprintf(r->metrics, "{\"epoch\":%d,\"step\":%lld,\"loss\":%.9g,\"precision\":\"%s\","
            "\"loss_scale\":%.9g,\"skipped\":%s}\n", ep + 1, (long long)e->step, e->loss,
            zs_precision_name(e->precision), e->loss_scale, e->skipped ? "true" : "false");
    history_push(&r->h, (double)e->step / (double)r->nb, e->loss);
    progress(r, e);
    if (e->validated)
        epoch_done(r, ep);
    return 0;
}

/* The trainer's config: the optimizer and schedule of the flags, one
 * validation and checkpoint per epoch. */
static zs_trainer_config cnn_config(const train_cfg *c, cnn_run *r, const char *ckpt)
{
    zs_optim_kind kind = !strcmp(c->optim, "sgd") ? ZS_SGD
                       : !strcmp(c->optim, "adam") ? ZS_ADAM : ZS_ADAMW;
    zs_trainer_config t = zs_trainer_defaults();
    t.optim = (zs_optim_config){kind, c->lr, kind == ZS_SGD ? c->momentum : 0, false,
                                c->wd, 0, 0, 0};
    int64_t nb = r->nb;
    t.schedule = (zs_lr_schedule){ZS_LR_CONSTANT, c->lr, 0, 0, 0, 0, 0};
    if (!strcmp(c->schedule, "cosine"))
        t.schedule = (zs_lr_schedule){ZS_LR_COSINE, c->lr, nb, nb * c->epochs, c->lr / 100, 0, 0};
    else if (!strcmp(c->schedule, "step"))
        t.schedule = (zs_lr_schedule){ZS_LR_STEP, c->lr, 0, 0, 0, 2 * nb, 0.1};
    t.steps = nb * c->epochs;
    t.stop_after = c->stop_after > 0 ? nb * c->stop_after : 0;
    t.clip = 0;
    t.eval_every = nb;
    t.batch = cnn_batch, t.batch_ctx = r;
    t.loss = zs_classifier_loss;
    t.eval = cnn_eval, t.eval_ctx = r;
    t.on_step = on_step, t.on_step_ctx = r;
    t.checkpoint = ckpt;
    t.metadata = r->meta;
    t.device = c->dev;
    t.precision = zs_precision_parse((const char *[]){"fp32", "bf16", "fp16",
                                                      "fp8"}[c->precision]);
    t.graph = c->graph;
    t.dump_graph = c->dump_graph;
    return t;
}

static int run(train_cfg *c)
{
    int rc = 2;
    zs_image_data train = {0}, test = {0}, full = {0};
    zs_module *m = NULL;
    zs_trainer *t = NULL;
    cnn_run r = {.c = c, .test = &test, .tty = isatty(2)};
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
    if (!(m = zs_cnn_new(c->model, c->seed)) || app_make_outdir(c->out) != ZS_OK ||
        !(r.l = zs_loader_new(&train, c->batch, true, c->seed, ZS_FMNIST_MEAN, ZS_FMNIST_STD)))
        goto fail;
    r.nb = zs_loader_batches_per_epoch(r.l);
    snprintf(r.meta, sizeof r.meta, "{\"model\":\"%s\"}", c->model);
    snprintf(path, sizeof path, "%s/checkpoint.safetensors", c->out);
    zs_trainer_config tc = cnn_config(c, &r, path);
    if (!(t = zs_trainer_new(m, &tc)))
        goto fail;
    zs_manual_seed(c->seed);
    char *meta = NULL;
    if (c->resume && zs_trainer_resume(t, path, &meta) != ZS_OK)
        goto fail;
    char want[64];
    snprintf(want, sizeof want, "\"model\":\"%s\"", c->model);
    bool same = !c->resume || (meta && strstr(meta, want));
    free(meta);
    if (!same) {
        zs_set_error("checkpoint %s was not written for model %s", path, c->model);
        goto fail;
    }
    if (c->resume)
        fprintf(stderr, "resuming %s after epoch %lld\n", path,
                (long long)(zs_trainer_next_step(t) / r.nb));
    char mpath[4200];
    snprintf(mpath, sizeof mpath, "%s/metrics.jsonl", c->out);
    if (!(r.metrics = fopen(mpath, c->resume ? "a" : "w"))) {
        zs_set_error("cannot write %s", mpath);
        goto fail;
    }
    fprintf(stderr, "%s: %lld parameters, %lld train / %lld test images, "
            "batch %lld, %s lr %g, %d threads, precision %s\n", c->model,
            (long long)zs_module_num_params(m), (long long)train.images->shape[0],
            (long long)test.images->shape[0], (long long)c->batch, c->optim,
            c->lr, zs_num_threads(), zs_precision_name(tc.precision));
    rc = 1;
    double t_start = r.t_epoch = app_now();
    if (zs_trainer_run(t) != ZS_OK)
        goto fail;
    fprintf(stderr, "done in %.1f s; checkpoint, metrics.jsonl and curves.svg in %s\n",
            app_now() - t_start, c->out);
    rc = 0;
fail:
    if (rc)
        fprintf(stderr, "zs train: %s\n", zs_last_error());
    if (r.metrics)
        fclose(r.metrics);
    zs_trainer_free(t);
    zs_loader_free(r.l);
    zs_module_free(m);
    zs_image_data_free(&train);
    zs_image_data_free(&test);
    zs_image_data_free(&full);
    free(r.h.step);
    free(r.h.loss);
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
