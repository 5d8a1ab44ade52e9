/*
 * collectives.c - all-reduce bandwidth of Zhisuan's ring (point-to-point,
 * src/parallel/ring.c) and of MPI's own MPI_Allreduce (both through
 * zs_comm_allreduce), in one run, for 1 KB .. 256 MB of f32.
 *
 * algbw = bytes / time; busbw = algbw * 2(N-1)/N (the NCCL-tests
 * definitions: busbw is what each rank's link carries, comparable across
 * rank counts). Time: the best over repetitions of the mean over ranks of
 * one all-reduce started after a barrier. Run without mpirun, the program
 * relaunches itself under mpirun with 2 and then 4 ranks
 * (--allow-run-as-root --oversubscribe) and prints both tables; its last
 * line is `allreduce busbw 64MB 4 ranks zhisuan-ring/mpi = R`.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "zs/zs.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Best over reps of the mean over ranks of one all-reduce. */
static double time_allreduce(zs_comm *w, zs_tensor *t, zs_allreduce_algo algo, int reps)
{
    zs_tensor *slow = zs_scalar(ZS_F64, 0);
    double best = 1e30;
    zs_comm_allreduce(w, t, false, algo); /* warm-up */
    for (int r = 0; r < reps; r++) {
        zs_comm_barrier(w);
        double t0 = now();
        zs_comm_allreduce(w, t, false, algo);
        double dt = now() - t0;
        zs_fill_(slow, dt);
        zs_comm_allreduce(w, slow, false, ZS_ALLREDUCE_MPI);
        double mean = zs_item(slow) / zs_comm_size(w); /* mean over ranks */
        if (mean < best)
            best = mean;
    }
    zs_release(slow);
    return best;
}

static int run_ranks(void)
{
    zs_comm *w = zs_comm_world();
    int P = zs_comm_size(w), R = zs_comm_rank(w);
    double factor = 2.0 * (P - 1) / P, ratio64 = 0;
    if (R == 0)
        printf("\nall-reduce, %d ranks (f32, sum; busbw = algbw * 2(N-1)/N)\n"
               "%10s %15s %15s %15s %15s %9s\n", P, "bytes", "ring algbw",
               "ring busbw", "mpi algbw", "mpi busbw", "ring/mpi");
    for (int64_t bytes = 1024; bytes <= (256ll << 20); bytes *= 4) {
        int64_t n = bytes / 4;
        zs_tensor *t = zs_zeros(ZS_F32, 1, &n); /* stays finite however often summed */
        int reps = bytes <= (1 << 20) ? 50 : bytes <= (16 << 20) ? 10 : 3;
        double tr = time_allreduce(w, t, ZS_ALLREDUCE_RING, reps);
        double tm = time_allreduce(w, t, ZS_ALLREDUCE_MPI, reps);
        double ar = (double)bytes / tr / 1e9, am = (double)bytes / tm / 1e9;
        if (bytes == (64ll << 20))
            ratio64 = tm / tr;
        if (R == 0)
            printf("%10lld %10.2f GB/s %10.2f GB/s %10.2f GB/s %10.2f GB/s %9.2f\n",
                   (long long)bytes, ar, ar * factor, am, am * factor, tm / tr);
        zs_release(t);
    }
    if (R == 0) {
        printf("allreduce busbw 64MB %d ranks zhisuan-ring/mpi = %.3f\n", P, ratio64);
        fflush(stdout);
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (zs_dist_init(&argc, &argv) != ZS_OK) {
        fprintf(stderr, "collectives: %s\n", zs_last_error());
        return 1;
    }
    if (zs_dist_is_mpi()) {
        int rc = run_ranks();
        zs_dist_finalize();
        return rc;
    }
    /* Not under mpirun: relaunch with 2 and 4 ranks. */
    char cmd[4600], self[4096];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len <= 0) {
        fprintf(stderr, "collectives: cannot find my own path\n");
        return 1;
    }
    self[len] = '\0';
    int rc = 0;
    for (int np = 2; np <= 4; np += 2) {
        snprintf(cmd, sizeof cmd, "mpirun --allow-run-as-root --oversubscribe -np %d %s",
                 np, self);
        if (system(cmd) != 0) {
            fprintf(stderr, "collectives: `%s` failed (is OpenMPI installed and "
                    "Zhisuan built with it?)\n", cmd);
            rc = 1;
        }
    }
    return rc;
}
