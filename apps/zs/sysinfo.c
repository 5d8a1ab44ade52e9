/*
 * sysinfo.c - `zs sysinfo`: what this machine offers Zhisuan.
 */
#include <stdio.h>

#include "apps/zs/commands.h"
#include "apps/zs/flags.h"
#include "zs/zs.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: zs sysinfo [--quick]\n  --quick  skip the peak "
            "and bandwidth measurements\n");
}

int cmd_sysinfo(int argc, char **argv)
{
    bool quick = false;
    flag t[] = {FLAG_SWITCH("--quick", &quick)};
    int p = flags_parse("zs sysinfo", t, NFLAGS(t), usage, argc, argv);
    if (p != FLAGS_OK)
        return flags_exit(p);
    const zs_cpu_features *f = zs_cpu();
    printf("zhisuan %s\n", ZS_VERSION);
    printf("threads        %d (ZS_NUM_THREADS; %d CPUs usable: affinity, cgroup quota)\n",
           zs_num_threads(), zs_cpu_count());
    printf("cpu features   avx2=%d fma=%d f16c=%d avx512f=%d avx512bw=%d "
           "avx512vl=%d avx512_bf16=%d avx512vnni=%d (as capped)\n", f->avx2, f->fma, f->f16c,
           f->avx512f, f->avx512bw, f->avx512vl, f->avx512_bf16, f->avx512vnni);
    char gpu[384];
    zs_cuda_describe(gpu, sizeof gpu);
    printf("gpu            %s\n", gpu);
    zs_kernel_paths_print(stdout);
    if (quick)
        return 0;
    int nt = zs_num_threads();
    double p1 = zs_measure_peak_gflops(1, 0.2);
    double pn = nt > 1 ? zs_measure_peak_gflops(nt, 0.2) : p1;
    double b1 = zs_measure_triad_gbs(1, 64u << 20, 5);
    double bn = nt > 1 ? zs_measure_triad_gbs(nt, 64u << 20, 5) : b1;
    printf("fp32 fma peak  %.1f GFLOP/s (1 thread), %.1f GFLOP/s (%d threads)\n",
           p1, pn, nt);
    printf("triad          %.1f GB/s (1 thread), %.1f GB/s (%d threads)\n", b1,
           bn, nt);
    printf("ridge point    %.1f FLOP/byte (%d threads)\n", pn / bn, nt);
    return 0;
}

static void ops_usage(FILE *f)
{
    fprintf(f, "usage: zs ops\n  prints every operator with its kernels per "
            "device and dtype, and what its backward runs\n");
}

/* `zs ops`: the operator table, with every device the command line offers
 * (the test device included). */
int cmd_ops(int argc, char **argv)
{
    int p = flags_parse("zs ops", NULL, 0, ops_usage, argc, argv);
    if (p != FLAGS_OK)
        return flags_exit(p);
    if (zs_test_device_enable() != ZS_OK) {
        fprintf(stderr, "zs ops: %s\n", zs_last_error());
        return 1;
    }
    zs_ops_print(stdout);
    return 0;
}
