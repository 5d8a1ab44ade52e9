/*
 * onebit.c - bench/onebit: 1-bit Adam against AdamW under data
 * parallelism, the communication half of issue 29's bench/memcomm (the
 * recomputation and sparse-attention rows live in bench/memcomm.c).
 *
 * Both runs train the same GPT (`zs train gpt`, default corpus: the King
 * James Bible) from the same seed for the same steps on `--ranks` MPI
 * ranks (mpirun -np 4 by default), so they see the same samples:
 *   adamw        gradients averaged by Zhisuan's ring all-reduce (the peer)
 *   onebit-adam  AdamW with the same all-reduce for --freeze steps, then v
 *                frozen and the momentum averaged by the compressed
 *                all-reduce (signs + one f32 scale per 2048 elements, worker
 *                and server error feedback)
 * Per run, from its metrics.jsonl: the bytes rank 0 sent per step before
 * and after the freeze (the ring's volume 2(P-1)/P of the gradient,
 * computed; the compressed all-reduce's, counted), the mean over the run,
 * the final validation loss and its ratio to AdamW's (target: within 2%),
 * wall time and tokens/s. The last lines read
 * `memcomm onebit/adam val loss = R` and `memcomm onebit/adam bytes = R`
 * (bytes per step after the freeze over AdamW's; target <= 0.2, i.e.
 * >= 5x fewer).
 *
 * Usage: onebit [--preset tiny|small] [--steps N] [--freeze N] [--batch B]
 *               [--seq T] [--ranks P] [--zs PATH] [--data FILE]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct opts {
    const char *preset, *zs, *data;
    int steps, freeze, batch, seq, ranks;
} opts;

typedef struct result {
    double wall, tps, val;
    double warm_bytes, frozen_bytes, mean_bytes; /* per step, rank 0 */
    int ok;
} result;

/* Bytes per step before and after the freeze, the mean tokens/s and the
 * last val_loss of a metrics.jsonl. */
static int read_metrics(const char *path, int freeze, result *r)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    char line[512];
    int step, nw = 0, nf = 0, nt = 0;
    double warm = 0, frozen = 0, tps = 0, x;
    long long b;
    r->val = -1;
    while (fgets(line, sizeof line, f)) {
        if (sscanf(line, "{\"step\":%d", &step) != 1)
            continue;
        char *c = strstr(line, "\"comm_bytes\":"), *t = strstr(line, "\"tokens_per_s\":");
        char *v = strstr(line, "\"val_loss\":");
        if (c && sscanf(c + 13, "%lld", &b) == 1) {
            if (step < freeze)
                warm += (double)b, nw++;
            else
                frozen += (double)b, nf++;
        }
        if (t && sscanf(t + 15, "%lf", &x) == 1)
            tps += x, nt++;
        if (v)
            sscanf(v + 11, "%lf", &r->val);
    }
    fclose(f);
    r->warm_bytes = nw ? warm / nw : 0;
    r->frozen_bytes = nf ? frozen / nf : 0;
    r->mean_bytes = nw + nf ? (warm + frozen) / (nw + nf) : 0;
    r->tps = nt ? tps / nt : 0;
    return nw + nf > 0 && r->val >= 0 ? 0 : -1;
}

/* Runs one optimizer; its log and metrics go to dir/<name>. */
static void run(const opts *o, const char *dir, const char *name, const char *flags,
                result *r)
{
    char cmd[4096], out[1024], log[1100];
    snprintf(out, sizeof out, "%s/%s", dir, name);
    snprintf(log, sizeof log, "%s.log", out);
    snprintf(cmd, sizeof cmd,
             "mpirun --allow-run-as-root --oversubscribe -np %d %s train gpt --preset %s "
             "--steps %d --batch %d --seq %d --threads 1 --seed 1 --warmup %d "
             "--eval-every %d %s%s %s --out %s > %s 2>&1",
             o->ranks, o->zs, o->preset, o->steps, o->batch, o->seq, o->steps / 10,
             o->steps, o->data ? "--data " : "", o->data ? o->data : "", flags, out, log);
    memset(r, 0, sizeof *r);
    if (system(cmd) != 0) {
        fprintf(stderr, "onebit: %s failed; see %s\n", name, log);
        return;
    }
    char path[1200], line[512];
    snprintf(path, sizeof path, "%s/metrics.jsonl", out);
    r->ok = read_metrics(path, o->freeze, r) == 0;
    FILE *f = fopen(log, "r");
    while (f && fgets(line, sizeof line, f)) {
        double w;
        if (sscanf(line, "trained %*d steps in %lf s", &w) == 1)
            r->wall = w;
    }
    if (f)
        fclose(f);
}

static int parse(int argc, char **argv, opts *o)
{
    static char self_zs[4096];
    *o = (opts){"tiny", NULL, NULL, 300, -1, 8, 64, 4};
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) {
            fprintf(stderr, "onebit: %s wants a value\n", f);
            return -1;
        }
        i++;
        if (!strcmp(f, "--preset")) o->preset = v;
        else if (!strcmp(f, "--zs")) o->zs = v;
        else if (!strcmp(f, "--data")) o->data = v;
        else if (!strcmp(f, "--steps")) o->steps = atoi(v);
        else if (!strcmp(f, "--freeze")) o->freeze = atoi(v);
        else if (!strcmp(f, "--batch")) o->batch = atoi(v);
        else if (!strcmp(f, "--seq")) o->seq = atoi(v);
        else if (!strcmp(f, "--ranks")) o->ranks = atoi(v);
        else {
            fprintf(stderr, "onebit: unknown flag %s\n", f);
            return -1;
        }
    }
    if (o->freeze < 0) /* DeepSpeed suggests 15-25% of the steps */
        o->freeze = o->steps / 5 > 0 ? o->steps / 5 : 1;
    if (o->steps < 2 || o->ranks < 2 || o->batch % o->ranks || o->freeze < 1 ||
        o->freeze >= o->steps) {
        fprintf(stderr, "onebit: wants --steps >= 2, --ranks >= 2 dividing --batch, "
                "1 <= --freeze < --steps\n");
        return -1;
    }
    if (!o->zs) { /* build/bench/onebit -> build/zs */
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
    char dir[] = "/tmp/zs-bench-onebit-XXXXXX";
    if (!mkdtemp(dir)) {
        perror("onebit: mkdtemp");
        return 1;
    }
    char flags[64];
    snprintf(flags, sizeof flags, "--optim onebit-adam --freeze-step %d", o.freeze);
    struct { const char *name, *flags; } modes[] = {
        {"adamw", "--optim adamw"},
        {"onebit-adam", flags},
    };
    result r[2];
    printf("GPT %s, %d steps of %d x %d tokens on %d ranks (1 thread each), 1-bit Adam "
           "frozen after %d steps; bytes are rank 0's per step; outputs in %s\n\n",
           o.preset, o.steps, o.batch, o.seq, o.ranks, o.freeze, dir);
    printf("%-12s %12s %12s %12s %9s %9s %8s %9s\n", "optimizer", "B/step <frz",
           "B/step >=frz", "B/step mean", "val loss", "val/adam", "wall s", "tokens/s");
    for (int m = 0; m < 2; m++) {
        run(&o, dir, modes[m].name, modes[m].flags, &r[m]);
        if (!r[m].ok) {
            printf("%-12s failed\n", modes[m].name);
            continue;
        }
        printf("%-12s %12.0f %12.0f %12.0f %9.4f %9.4f %8.1f %9.0f\n", modes[m].name,
               r[m].warm_bytes, r[m].frozen_bytes, r[m].mean_bytes, r[m].val,
               r[0].ok ? r[m].val / r[0].val : 0.0, r[m].wall, r[m].tps);
        fflush(stdout);
    }
    if (!r[0].ok || !r[1].ok)
        return 1;
    double adam = r[0].mean_bytes, one = r[1].frozen_bytes;
    printf("\n1-bit Adam after the freeze: %.1fx fewer bytes per step (target >= 5x); "
           "over the whole run %.1fx; val loss %+.2f%% against AdamW (target within 2%%)\n",
           adam / one, adam / r[1].mean_bytes, 100 * (r[1].val / r[0].val - 1));
    printf("memcomm onebit/adam val loss = %.4f\n", r[1].val / r[0].val);
    printf("memcomm onebit/adam bytes = %.4f\n", one / adam);
    return 0;
}
