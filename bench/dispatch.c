/*
 * dispatch.c - the eager overhead of one operator call: ns per call of
 * add, mul and exp on 1-element f32 tensors, without and with autograd
 * recording, for Zhisuan (zsi_run: checks, infer, kernel lookup, device
 * allocation, record, cost) and PyTorch (/usr/bin/python3, 1 thread per
 * op as it runs these inline, its best environment) in the same run.
 *
 * Each figure is the best of --rounds rounds of --calls calls; a call's
 * result is released before the next (PyTorch frees it on rebinding).
 * Last line: "dispatch ns per call zhisuan/pytorch = R", the geometric
 * mean of the per-row ratios (target <= 0.2, and <= 1000 ns per call).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "zs/zs.h"

#define PEER_ENV                                                             \
    "env -u OPENBLAS_CORETYPE OMP_WAIT_POLICY=PASSIVE "                      \
    "GLIBC_TUNABLES=glibc.malloc.mmap_max=0:"                                \
    "glibc.malloc.trim_threshold=68719476736 "

enum { OP_ADD, OP_MUL, OP_EXP, NOPS };
static const char *op_names[NOPS] = {"add", "mul", "exp"};

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Best ns per call of op over rounds x calls. */
static double time_zs(int op, bool grad, int rounds, long calls)
{
    zs_tensor *a = zs_ones(ZS_F32, ZS_SHAPE(1)), *b = zs_ones(ZS_F32, ZS_SHAPE(1));
    zs_set_requires_grad(a, grad);
    double best = INFINITY;
    for (int r = 0; r < rounds; r++) {
        double t0 = now();
        for (long i = 0; i < calls; i++) {
            zs_tensor *c = op == OP_ADD ? zs_add(a, b) : op == OP_MUL ? zs_mul(a, b)
                                                                      : zs_exp(a);
            zs_release(c);
        }
        best = fmin(best, (now() - t0) / (double)calls * 1e9);
    }
    zs_release(a);
    zs_release(b);
    return best;
}

static const char *peer_script =
    "import sys, time, torch\n"
    "torch.set_num_threads(2)\n"
    "rounds, calls = int(sys.argv[1]), int(sys.argv[2])\n"
    "for op in ('add', 'mul', 'exp'):\n"
    "  for grad in (0, 1):\n"
    "    a = torch.ones(1, requires_grad=bool(grad)); b = torch.ones(1)\n"
    "    f = {'add': lambda: a + b, 'mul': lambda: a * b, 'exp': lambda: a.exp()}[op]\n"
    "    best = 1e30\n"
    "    for r in range(rounds):\n"
    "      t0 = time.perf_counter()\n"
    "      for i in range(calls):\n"
    "        c = f()\n"
    "      best = min(best, (time.perf_counter() - t0) / calls * 1e9)\n"
    "    print('zsbench dispatch', op, grad, best, flush=True)\n";

/* Fills peer[op][grad]; false when PyTorch is not there. */
static bool time_torch(int rounds, long calls, double peer[NOPS][2])
{
    char path[] = "/tmp/zs_dispatch_XXXXXX";
    int fd = mkstemp(path);
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (!f)
        return false;
    fputs(peer_script, f);
    fclose(f);
    char cmd[512];
    snprintf(cmd, sizeof cmd, PEER_ENV "/usr/bin/python3 %s %d %ld 2>&1", path,
             rounds, calls);
    FILE *p = popen(cmd, "r");
    int got = 0;
    char line[256], name[16];
    while (p && fgets(line, sizeof line, p)) {
        int grad;
        double ns;
        if (sscanf(line, "zsbench dispatch %15s %d %lf", name, &grad, &ns) == 3) {
            for (int o = 0; o < NOPS; o++)
                if (!strcmp(name, op_names[o]) && (grad == 0 || grad == 1)) {
                    peer[o][grad] = ns;
                    got++;
                }
        } else {
            fputs(line, stdout);
        }
    }
    if (p)
        pclose(p);
    remove(path);
    return got == 2 * NOPS;
}

int main(int argc, char **argv)
{
    int rounds = 5;
    long calls = 200000;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--rounds"))
            rounds = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--calls"))
            calls = atol(argv[i + 1]);
    }
    if (rounds < 1 || calls < 1) {
        fprintf(stderr, "usage: dispatch [--rounds N] [--calls N]\n");
        return 2;
    }
    double peer[NOPS][2] = {{0}};
    bool have_peer = time_torch(rounds, calls / 4, peer);
    printf("%-6s %-5s %14s %14s %8s\n", "op", "grad", "zhisuan ns", "pytorch ns",
           "ratio");
    double logsum = 0;
    int n = 0;
    for (int o = 0; o < NOPS; o++)
        for (int g = 0; g < 2; g++) {
            double z = time_zs(o, g, rounds, calls);
            if (have_peer) {
                printf("%-6s %-5s %14.1f %14.1f %8.3f\n", op_names[o], g ? "yes" : "no",
                       z, peer[o][g], z / peer[o][g]);
                logsum += log(z / peer[o][g]);
                n++;
            } else {
                printf("%-6s %-5s %14.1f %14s %8s\n", op_names[o], g ? "yes" : "no", z,
                       "-", "-");
            }
        }
    if (n)
        printf("dispatch ns per call zhisuan/pytorch = %.3f\n", exp(logsum / n));
    else
        printf("dispatch: PyTorch peer not available (python3-torch)\n");
    return 0;
}
