/*
 * log.c - zs_train_log: a run's metrics.jsonl and curves.svg, written
 * from the trainer's step events.
 */
#include <math.h>
#include <stdlib.h>

#include "zs/io.h"
#include "zs/train.h"

struct zs_train_log {
    FILE *f;
    char svg[4200];
    int64_t n, cap;
    double *step, *train, *val;
};

zs_train_log *zs_train_log_open(const char *dir, bool append, bool write)
{
    zs_train_log *l = calloc(1, sizeof *l);
    char path[4200];
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    if (l && !(l->f = fopen(write ? path : "/dev/null", append ? "a" : "w"))) {
        zs_set_error_code(ZS_ERR_IO, "cannot write %s", path);
        free(l);
        return NULL;
    }
    if (!l) {
        zs_set_error_code(ZS_ERR_NOMEM, "out of memory");
        return NULL;
    }
    if (write)
        snprintf(l->svg, sizeof l->svg, "%s/curves.svg", dir);
    return l;
}

void zs_train_log_close(zs_train_log *l)
{
    if (!l)
        return;
    fclose(l->f);
    free(l->step);
    free(l->train);
    free(l->val);
    free(l);
}

/* One point of the curves (a failed growth drops the point only). */
static void push(zs_train_log *l, double step, double train, double val)
{
    if (l->n == l->cap) {
        int64_t cap = l->cap ? 2 * l->cap : 1024;
        double *a = realloc(l->step, (size_t)cap * sizeof *a);
        l->step = a ? a : l->step;
        double *b = realloc(l->train, (size_t)cap * sizeof *b);
        l->train = b ? b : l->train;
        double *c = realloc(l->val, (size_t)cap * sizeof *c);
        l->val = c ? c : l->val;
        if (!a || !b || !c)
            return;
        l->cap = cap;
    }
    l->step[l->n] = step;
    l->train[l->n] = train;
    l->val[l->n++] = val;
}

int zs_train_log_event(void *ctx, const zs_train_event *e)
{
    zs_train_log *l = ctx;
    fprintf(l->f, "{\"step\":%lld,\"loss\":%.6f,\"lr\":%.3g,\"grad_norm\":%.4f,"
            "\"tokens_per_s\":%.0f,\"mfu\":%.4f,\"precision\":\"%s\",\"loss_scale\":%.9g,"
            "\"skipped\":%s", (long long)e->step, e->loss,
            e->lr, e->grad_norm, e->tokens_per_s, e->mfu, zs_precision_name(e->precision),
            e->loss_scale, e->skipped ? "true" : "false");
    if (e->comm_bytes > 0) /* data parallel: bytes this rank sent averaging */
        fprintf(l->f, ",\"comm_bytes\":%lld", (long long)e->comm_bytes);
    fputs("}\n", l->f);
    push(l, (double)e->step, e->loss, NAN);
    if (!e->validated)
        return 0;
    fprintf(l->f, "{\"step\":%lld,\"val_loss\":%.6f}\n", (long long)e->step, e->val_loss);
    fflush(l->f);
    push(l, (double)e->step, NAN, e->val_loss);
    const char *titles[] = {"loss (nats/token)"};
    zs_plot_series s[] = {
        {"train", 0, l->n, l->step, l->train},
        {"validation", 0, l->n, l->step, l->val},
    };
    if (l->svg[0] && zs_svg_plot(l->svg, "training", 1, titles, 2, s) != ZS_OK)
        fprintf(stderr, "warning: %s\n", zs_last_error());
    return 0;
}
