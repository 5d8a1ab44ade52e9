/*
 * dp.c - bench/dp: how much of the gradient all-reduce of data-parallel
 * GPT training the gradient buckets hide behind backward.
 *
 * Under mpirun every rank runs the same training step of a GPT (forward,
 * backward on its own micro-batch of random tokens, gradient averaging;
 * no optimizer, which is the same in every mode) in these modes, the
 * modes interleaved round by round so that machine noise hits all alike:
 *   compute   forward + backward, no communication (the floor)
 *   mpi-after one MPI_Allreduce of the whole gradient after backward: the
 *             peer (what a program without buckets does with MPI)
 *   ring-after Zhisuan's ring, one all-reduce after backward
 *   mpi-bucket / ring-bucket  buckets of --bucket-mb all-reduced during
 *             backward (zs/dp.h)
 * Per mode it prints the median step time over the rounds (max over ranks
 * of each step), the communication left exposed (step - compute) and the
 * fraction of the after-backward communication the buckets hid. The last
 * line reads `dp step time mpi-after/ring-bucket 2 ranks = R` (R > 1:
 * Zhisuan's bucketed ring is faster than the peer).
 *
 * Run without mpirun, the program relaunches itself with -np 2 (one
 * thread per rank: two ranks fill this machine's 2 cores, so the ring's
 * additions compete with backward for the same cores; on separate
 * machines the overlap can only be better).
 *
 * Usage: dp [--preset tiny|small] [--batch B] [--seq T] [--rounds N]
 *           [--bucket-mb X] [--np N]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "zs/zs.h"

enum { COMPUTE, MPI_AFTER, RING_AFTER, MPI_BUCKET, RING_BUCKET, NMODES };
static const char *mode_name[NMODES] = {"compute", "mpi-after", "ring-after",
                                        "mpi-bucket", "ring-bucket"};

typedef struct opts {
    const char *preset;
    int64_t batch, seq;
    int rounds, np;
    double bucket_mb;
} opts;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t next_rand(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static zs_tensor *random_tokens(uint64_t *rng, int64_t b, int64_t t, int64_t vocab)
{
    zs_tensor *x = zs_empty(ZS_I64, 2, (int64_t[]){b, t});
    int64_t *ids = zs_data(x);
    for (int64_t i = 0; i < b * t; i++)
        ids[i] = (int64_t)(next_rand(rng) % (uint64_t)vocab);
    return x;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* One step in mode m; returns its seconds (max over ranks). */
static double step(zs_module *m, zs_dp *dp, uint64_t *rng, const opts *o,
                   int64_t vocab, zs_tensor *fg)
{
    zs_comm *w = zs_comm_world();
    zs_comm_barrier(w);
    double t0 = now();
    zs_scope_push();
    zs_tensor *x = random_tokens(rng, o->batch, o->seq, vocab);
    zs_tensor *y = random_tokens(rng, o->batch, o->seq, vocab);
    if (dp && zs_dp_begin(dp) != ZS_OK)
        return -1;
    zs_tensor *loss = zs_gpt_loss(m, x, y);
    if (!loss || zs_backward(loss, NULL, false) != ZS_OK)
        return -1;
    zs_scope_pop();
    if (dp && zs_dp_finish(dp) != ZS_OK)
        return -1;
    double dt = now() - t0;
    zs_fill_(fg, 0.0);
    zs_tensor *all = zs_empty(ZS_F64, 1, (int64_t[]){zs_comm_size(w)});
    zs_tensor *one = zs_from_data(ZS_F64, 1, (int64_t[]){1}, &dt);
    zs_comm_allgather(w, one, all);
    double mx = 0;
    for (int r = 0; r < zs_comm_size(w); r++)
        if (((double *)zs_data(all))[r] > mx)
            mx = ((double *)zs_data(all))[r];
    zs_release(one);
    zs_release(all);
    return mx;
}

static int run_ranks(const opts *o)
{
    zs_comm *w = zs_comm_world();
    int P = zs_comm_size(w), R = zs_comm_rank(w);
    zs_set_num_threads(1);
    zs_gpt_config gc = {.arch = ZS_GPT2, .vocab = 4096};
    if (zs_gpt_preset(o->preset, &gc) != 0) {
        fprintf(stderr, "dp: %s\n", zs_last_error());
        return 1;
    }
    zs_module *m = zs_gpt_new(&gc, 1);
    zs_tensor *fp, *fg, **ps;
    char **names;
    if (!m || zs_module_flatten(m, &fp, &fg) != ZS_OK) {
        fprintf(stderr, "dp: %s\n", zs_last_error());
        return 1;
    }
    int np = zs_module_parameters(m, &ps, &names);
    zs_dp *dps[NMODES] = {NULL};
    for (int k = MPI_AFTER; k < NMODES; k++) {
        zs_dp_config dc = {k == MPI_AFTER || k == MPI_BUCKET ? ZS_ALLREDUCE_MPI
                                                             : ZS_ALLREDUCE_RING,
                           k >= MPI_BUCKET ? (int64_t)(o->bucket_mb * 1048576) : 0};
        if (!(dps[k] = zs_dp_new(w, &dc, np, ps, fg))) {
            fprintf(stderr, "dp: %s\n", zs_last_error());
            return 1;
        }
    }
    zs_names_free(np, ps, names);
    zs_dp_stats st;
    zs_dp_get_stats(dps[RING_BUCKET], &st);
    if (R == 0)
        printf("bench/dp: %d ranks x 1 thread, GPT %s (%lld parameters, gradient "
               "%.1f MiB), per-rank batch %lld x %lld, %d buckets of ~%.1f MiB, "
               "median of %d rounds\n", P, o->preset, (long long)zs_numel(fp),
               4.0 * (double)zs_numel(fg) / 1048576, (long long)o->batch,
               (long long)o->seq, st.buckets,
               4.0 * (double)zs_numel(fg) / st.buckets / 1048576, o->rounds);
    uint64_t rng = 0x9E3779B97F4A7C15ull + (uint64_t)R;
    double *t[NMODES], early[NMODES] = {0};
    for (int k = 0; k < NMODES; k++)
        t[k] = calloc((size_t)o->rounds, sizeof(double));
    for (int k = 0; k < NMODES; k++) /* warm-up */
        step(m, dps[k], &rng, o, gc.vocab, fg);
    for (int r = 0; r < o->rounds; r++)
        for (int k = 0; k < NMODES; k++) {
            t[k][r] = step(m, dps[k], &rng, o, gc.vocab, fg);
            if (dps[k]) {
                zs_dp_get_stats(dps[k], &st);
                early[k] += (double)st.started_in_backward / st.buckets / o->rounds;
            }
        }
    double med[NMODES];
    for (int k = 0; k < NMODES; k++) {
        qsort(t[k], (size_t)o->rounds, sizeof(double), cmp_double);
        med[k] = t[k][o->rounds / 2];
    }
    if (R == 0) {
        printf("\n%-12s %10s %12s %14s %16s\n", "mode", "step ms", "exposed ms",
               "hidden", "buckets early");
        for (int k = 0; k < NMODES; k++) {
            int after = k == MPI_BUCKET ? MPI_AFTER : k == RING_BUCKET ? RING_AFTER : -1;
            double exposed = med[k] - med[COMPUTE];
            char hidden[32] = "", e[32] = "";
            if (after >= 0)
                snprintf(hidden, sizeof hidden, "%.0f%%",
                         100 * (1 - exposed / (med[after] - med[COMPUTE])));
            if (k >= MPI_BUCKET)
                snprintf(e, sizeof e, "%.0f%%", 100 * early[k]);
            printf("%-12s %10.1f %12.1f %14s %16s\n", mode_name[k], 1e3 * med[k],
                   k == COMPUTE ? 0.0 : 1e3 * exposed, hidden, e);
        }
        printf("dp step time mpi-after/ring-bucket %d ranks = %.3f\n", P,
               med[MPI_AFTER] / med[RING_BUCKET]);
    }
    for (int k = 0; k < NMODES; k++) {
        zs_dp_free(dps[k]);
        free(t[k]);
    }
    zs_module_free(m);
    return 0;
}

int main(int argc, char **argv)
{
    opts o = {"small", 2, 128, 7, 2, 8};
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--preset")) o.preset = argv[i + 1];
        else if (!strcmp(argv[i], "--batch")) o.batch = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--seq")) o.seq = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--rounds")) o.rounds = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--bucket-mb")) o.bucket_mb = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--np")) o.np = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "usage: dp [--preset P] [--batch B] [--seq T] [--rounds N] "
                    "[--bucket-mb X] [--np N]\n");
            return 2;
        }
    }
    if (o.batch < 1 || o.seq < 1 || o.rounds < 1 || o.np < 2) {
        fprintf(stderr, "dp: bad option value\n");
        return 2;
    }
    if (zs_dist_init(&argc, &argv) != ZS_OK) {
        fprintf(stderr, "dp: %s\n", zs_last_error());
        return 1;
    }
    if (zs_dist_is_mpi()) {
        int rc = run_ranks(&o);
        zs_dist_finalize();
        return rc;
    }
    char cmd[8192], self[4096];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len <= 0) {
        fprintf(stderr, "dp: cannot find my own path\n");
        return 1;
    }
    self[len] = '\0';
    int n = snprintf(cmd, sizeof cmd, "mpirun --allow-run-as-root --oversubscribe -np %d %s",
                     o.np, self);
    for (int i = 1; i < argc && n < (int)sizeof cmd - 256; i++)
        n += snprintf(cmd + n, sizeof cmd - (size_t)n, " '%s'", argv[i]);
    if (system(cmd) != 0) {
        fprintf(stderr, "dp: `%s` failed (is OpenMPI installed and Zhisuan built "
                "with it?)\n", cmd);
        return 1;
    }
    return 0;
}
