/*
 * dp.c - bench/dp: how much of the gradient all-reduce of data-parallel
 * GPT training the gradient buckets hide behind backward.
 *
 * Under mpirun every rank runs the same training step of a GPT through
 * the library's trainer (zs_trainer_step: forward, backward on its rows
 * of a global batch of random tokens, gradient averaging, then an SGD
 * update with learning rate 0). The time counted is forward + backward +
 * the wait for communication (the trainer's profile), without the update,
 * which is the same in every mode. One model and trainer per mode, the
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
    int64_t *ids = x ? zs_data(x) : NULL;
    for (int64_t i = 0; ids && i < b * t; i++)
        ids[i] = (int64_t)(next_rand(rng) % (uint64_t)vocab);
    return x;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The batches of one mode: rows sequences of seq random tokens. */
typedef struct source {
    int64_t rows, seq, vocab;
    uint64_t seed;
} source;

static zs_status random_batch(void *ctx, int64_t index, zs_tensor **x, zs_tensor **y)
{
    const source *s = ctx;
    uint64_t rng = s->seed + 0x9E3779B97F4A7C15ull * (uint64_t)(index + 1);
    *x = random_tokens(&rng, s->rows, s->seq, s->vocab);
    *y = random_tokens(&rng, s->rows, s->seq, s->vocab);
    return *x && *y ? ZS_OK : ZS_ERR_NOMEM;
}

/* One step of trainer t; returns forward + backward + communication
 * seconds, the max over the ranks of w. */
static double step(zs_trainer *t, zs_comm *w)
{
    zs_train_profile a, b;
    zs_comm_barrier(w);
    zs_trainer_profile(t, &a);
    if (zs_trainer_step(t, NULL) != ZS_OK)
        return -1;
    zs_trainer_profile(t, &b);
    double dt = (b.forward_s - a.forward_s) + (b.backward_s - a.backward_s) +
                (b.comm_s - a.comm_s);
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

/* Mode k's trainer over its own model (every rank alike), on alone (a
 * one-rank communicator: the compute floor) or the world. */
static zs_trainer *mode_trainer(int k, const opts *o, zs_module **m, source *src,
                                zs_comm *alone)
{
    zs_comm *w = zs_comm_world();
    zs_gpt_config gc = {.arch = ZS_GPT2, .vocab = 4096};
    if (zs_gpt_preset(o->preset, &gc) != 0 || !(*m = zs_gpt_new(&gc, 1)))
        return NULL;
    *src = (source){o->batch * (k == COMPUTE ? 1 : zs_comm_size(w)), o->seq, gc.vocab,
                    (uint64_t)(k == COMPUTE ? zs_comm_rank(w) : 0)};
    zs_trainer_config tc = zs_trainer_defaults();
    tc.optim = (zs_optim_config){ZS_SGD, 0, 0, false, 0, 0, 0, 0};
    tc.schedule = (zs_lr_schedule){ZS_LR_CONSTANT, 0, 0, 0, 0, 0, 0};
    tc.steps = 1 << 30;
    tc.clip = 0;
    tc.batch = random_batch, tc.batch_ctx = src;
    tc.comm = k == COMPUTE ? alone : w;
    tc.algo = k == MPI_AFTER || k == MPI_BUCKET ? ZS_ALLREDUCE_MPI : ZS_ALLREDUCE_RING;
    tc.bucket_bytes = k >= MPI_BUCKET ? (int64_t)(o->bucket_mb * 1048576) : 0;
    return zs_trainer_new(*m, &tc);
}

static int run_ranks(const opts *o)
{
    zs_comm *w = zs_comm_world();
    int P = zs_comm_size(w), R = zs_comm_rank(w);
    zs_set_num_threads(1);
    zs_comm *alone = zs_comm_split(w, R, 0);
    zs_module *m[NMODES] = {NULL};
    zs_trainer *tr[NMODES] = {NULL};
    source src[NMODES];
    for (int k = 0; k < NMODES; k++)
        if (!alone || !(tr[k] = mode_trainer(k, o, &m[k], &src[k], alone))) {
            fprintf(stderr, "dp: %s\n", zs_last_error());
            return 1;
        }
    double *t[NMODES], early[NMODES] = {0};
    for (int k = 0; k < NMODES; k++) {
        t[k] = calloc((size_t)o->rounds, sizeof(double));
        step(tr[k], w); /* warm-up */
    }
    zs_train_profile pr;
    zs_trainer_profile(tr[RING_BUCKET], &pr);
    int64_t n = zs_numel(zs_trainer_flat_params(tr[COMPUTE]));
    if (R == 0)
        printf("bench/dp: %d ranks x 1 thread, GPT %s (%lld parameters, gradient "
               "%.1f MiB), per-rank batch %lld x %lld, %d buckets of ~%.1f MiB, "
               "median of %d rounds\n", P, o->preset, (long long)n,
               4.0 * (double)n / 1048576, (long long)o->batch, (long long)o->seq,
               pr.buckets, 4.0 * (double)n / pr.buckets / 1048576, o->rounds);
    for (int r = 0; r < o->rounds; r++)
        for (int k = 0; k < NMODES; k++) {
            t[k][r] = step(tr[k], w);
            zs_trainer_profile(tr[k], &pr);
            early[k] += pr.buckets_early / o->rounds;
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
        zs_trainer_free(tr[k]);
        zs_module_free(m[k]);
        free(t[k]);
    }
    zs_comm_free(alone);
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
