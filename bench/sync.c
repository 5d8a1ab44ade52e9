/*
 * sync.c - bench/sync: convergence of the data-parallel synchronisation
 * schemes against all-reduce on the same run length.
 *
 * Every scheme trains the same GPT (`zs train gpt`, default corpus: the
 * King James Bible) from the same seed for the same number of steps, one
 * step being one global batch of --batch sequences, so every run sees the
 * same number of samples:
 *   allreduce  W ranks, gradients averaged by Zhisuan's ring (the peer)
 *   ps         W ranks, synchronous parameter server on rank 0
 *   async      W workers + a server rank; each worker's gradient (batch/W
 *              sequences) is one update, applied on arrival
 *   ssp-S      as async, no worker more than S gradients ahead
 * The asynchronous schemes make W updates per step with W-times smaller
 * batches; their server sleeps between polls, so W workers still fill W
 * cores. Per scheme: wall time, tokens/s, mean train loss over the last
 * tenth of the steps, final validation loss, and its ratio to
 * all-reduce's (below 1: converged further on the same samples), plus the
 * server's staleness report. The last line reads
 * `sync val loss async/allreduce = R`.
 *
 * Usage: sync [--preset tiny|small] [--steps N] [--batch B] [--seq T]
 *             [--workers W] [--zs PATH] [--data FILE]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct opts {
    const char *preset, *zs, *data;
    int steps, batch, seq, workers;
} opts;

typedef struct result {
    double wall, tps, train, val;
    char report[256];
    int ok;
} result;

/* Mean of the last tenth of the step losses, the last val_loss and the
 * mean tokens/s of a metrics.jsonl. */
static int read_metrics(const char *path, int steps, result *r)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    char line[512];
    int step, from = steps - (steps + 9) / 10, n = 0, nt = 0;
    double sum = 0, tps_sum = 0, x;
    r->val = -1;
    while (fgets(line, sizeof line, f)) {
        char *p = strstr(line, "\"loss\":"), *v = strstr(line, "\"val_loss\":");
        char *t = strstr(line, "\"tokens_per_s\":");
        if (sscanf(line, "{\"step\":%d", &step) != 1)
            continue;
        if (p && sscanf(p + 7, "%lf", &x) == 1 && step >= from) {
            sum += x;
            n++;
        }
        if (t && sscanf(t + 15, "%lf", &x) == 1) {
            tps_sum += x;
            nt++;
        }
        if (v)
            sscanf(v + 11, "%lf", &r->val);
    }
    fclose(f);
    r->train = n ? sum / n : -1;
    r->tps = nt ? tps_sum / nt : 0;
    return n && r->val >= 0 ? 0 : -1;
}

/* Runs one scheme; its log and metrics go to dir/<name>. */
static void run(const opts *o, const char *dir, const char *name, int np,
                const char *flags, result *r)
{
    char cmd[4096], out[1024], log[1100];
    snprintf(out, sizeof out, "%s/%s", dir, name);
    snprintf(log, sizeof log, "%s.log", out);
    snprintf(cmd, sizeof cmd,
             "mpirun --allow-run-as-root --oversubscribe -np %d %s train gpt --preset %s "
             "--steps %d --batch %d --seq %d --threads 1 --seed 1 --warmup %d "
             "--eval-every %d %s%s %s --out %s > %s 2>&1",
             np, o->zs, o->preset, o->steps, o->batch, o->seq, o->steps / 10,
             o->steps, o->data ? "--data " : "", o->data ? o->data : "", flags, out, log);
    memset(r, 0, sizeof *r);
    if (system(cmd) != 0) {
        fprintf(stderr, "sync: %s failed; see %s\n", name, log);
        return;
    }
    char path[1200], line[512];
    snprintf(path, sizeof path, "%s/metrics.jsonl", out);
    r->ok = read_metrics(path, o->steps, r) == 0;
    FILE *f = fopen(log, "r");
    while (f && fgets(line, sizeof line, f)) {
        double w;
        if (sscanf(line, "trained %*d steps in %lf s", &w) == 1)
            r->wall = w;
        char *p = strstr(line, "updates, staleness");
        if (p) {
            line[strcspn(line, "\n")] = '\0';
            snprintf(r->report, sizeof r->report, "%s", strstr(line, "staleness"));
        }
    }
    if (f)
        fclose(f);
}

static int parse(int argc, char **argv, opts *o)
{
    static char self_zs[4096];
    *o = (opts){"tiny", NULL, NULL, 300, 8, 64, 2};
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) {
            fprintf(stderr, "sync: %s wants a value\n", f);
            return -1;
        }
        i++;
        if (!strcmp(f, "--preset")) o->preset = v;
        else if (!strcmp(f, "--zs")) o->zs = v;
        else if (!strcmp(f, "--data")) o->data = v;
        else if (!strcmp(f, "--steps")) o->steps = atoi(v);
        else if (!strcmp(f, "--batch")) o->batch = atoi(v);
        else if (!strcmp(f, "--seq")) o->seq = atoi(v);
        else if (!strcmp(f, "--workers")) o->workers = atoi(v);
        else {
            fprintf(stderr, "sync: unknown flag %s\n", f);
            return -1;
        }
    }
    if (o->steps < 10 || o->workers < 1 || o->batch % o->workers) {
        fprintf(stderr, "sync: wants --steps >= 10 and --batch divisible by --workers\n");
        return -1;
    }
    if (!o->zs) { /* build/bench/sync -> build/zs */
        ssize_t n = readlink("/proc/self/exe", self_zs, sizeof self_zs - 16);
        if (n <= 0)
            return -1;
        self_zs[n] = '\0';
        char *slash = strrchr(self_zs, '/');
        *slash = '\0';
        strcat(self_zs, "/../zs");
        o->zs = self_zs;
    }
    return 0;
}

int main(int argc, char **argv)
{
    opts o;
    if (parse(argc, argv, &o))
        return 2;
    char dir[] = "/tmp/zs-bench-sync-XXXXXX";
    if (!mkdtemp(dir)) {
        perror("sync: mkdtemp");
        return 1;
    }
    int W = o.workers;
    struct { const char *name; int np; const char *flags; } modes[] = {
        {"allreduce", W, "--sync allreduce"},
        {"ps", W, "--sync ps"},
        {"async", W + 1, "--sync async"},
        {"ssp-0", W + 1, "--sync ssp --staleness 0"},
        {"ssp-2", W + 1, "--sync ssp --staleness 2"},
    };
    enum { NM = sizeof modes / sizeof modes[0] };
    result r[NM];
    printf("GPT %s, %d steps of %d x %d tokens (same samples in every scheme), %d "
           "computing ranks, 1 thread each; outputs in %s\n\n", o.preset, o.steps,
           o.batch, o.seq, W, dir);
    printf("%-10s %5s %8s %9s %11s %9s %9s  %s\n", "scheme", "ranks", "wall s",
           "tokens/s", "train loss", "val loss", "val/allr", "server");
    for (int m = 0; m < NM; m++) {
        run(&o, dir, modes[m].name, modes[m].np, modes[m].flags, &r[m]);
        if (!r[m].ok) {
            printf("%-10s %5d failed\n", modes[m].name, modes[m].np);
            continue;
        }
        printf("%-10s %5d %8.1f %9.0f %11.4f %9.4f %9.3f  %s\n", modes[m].name,
               modes[m].np, r[m].wall, r[m].tps, r[m].train, r[m].val,
               r[0].ok ? r[m].val / r[0].val : 0.0, r[m].report);
        fflush(stdout);
    }
    if (!r[0].ok || !r[2].ok)
        return 1;
    printf("sync val loss async/allreduce = %.3f\n", r[2].val / r[0].val);
    return 0;
}
