/*
 * cpu.c - run-time CPU feature detection (cpuid + xgetbv), so kernels pick
 * AVX-512 / AVX2 / scalar code without -march=native at build time, and
 * the ISA cap: ZS_CPU_ISA=portable|avx2|avx512 clears the features above
 * it in what zs_cpu() reports, so one AVX-512 machine runs and tests the
 * paths of the machines that stop at AVX2 or at none; and how many CPUs
 * this process may use (zs_cpu_count: affinity mask, cgroup quota) and how
 * many ranks of its MPI job share the host (zs_local_ranks), which size the
 * thread pool and the comm's waits.
 */
#include <cpuid.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/internal.h"
#include "zs/core.h"

static zs_cpu_features hw, feats; /* the hardware's; capped */
static const char *isa = "portable";
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void detect_hw(zs_cpu_features *f)
{
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d))
        return;
    bool osxsave = c & (1u << 27);
    bool fma = c & (1u << 12), f16c = c & (1u << 29), avx = c & (1u << 28);
    unsigned long long xcr0 = 0;
    if (osxsave) {
        unsigned lo, hi;
        __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
        xcr0 = ((unsigned long long)hi << 32) | lo;
    }
    bool ymm = (xcr0 & 6) == 6, zmm = (xcr0 & 0xe6) == 0xe6;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d))
        return;
    f->avx2 = avx && ymm && (b & (1u << 5));
    f->fma = fma && ymm;
    f->f16c = f16c && ymm;
    f->avx512f = zmm && (b & (1u << 16));
    f->avx512bw = f->avx512f && (b & (1u << 30));
    f->avx512vl = f->avx512f && (b & (1u << 31));
    f->avx512vnni = f->avx512f && (c & (1u << 11));
    if (__get_cpuid_count(7, 1, &a, &b, &c, &d))
        f->avx512_bf16 = f->avx512f && (a & (1u << 5));
}

/* 2: avx512, 1: avx2 (with FMA and F16C), 0: portable. */
static int level_of(const zs_cpu_features *f)
{
    if (f->avx512f && f->avx512bw && f->avx512vl && f->avx2 && f->fma)
        return 2;
    return f->avx2 && f->fma && f->f16c ? 1 : 0;
}

static void detect(void)
{
    static const char *names[] = {"portable", "avx2", "avx512"};
    detect_hw(&hw);
    int have = level_of(&hw), cap = have;
    const char *e = getenv("ZS_CPU_ISA");
    if (e && *e) {
        int want = -1;
        for (int i = 0; i < 3; i++)
            if (!strcmp(e, names[i]))
                want = i;
        if (want < 0) /* a user's setting: warn once, never abort */
            fprintf(stderr, "zhisuan: ZS_CPU_ISA=%s: expected portable, avx2 or "
                    "avx512; using %s\n", e, names[have]);
        else if (want < cap)
            cap = want;
    }
    feats = hw;
    if (cap < 2)
        feats.avx512f = feats.avx512bw = feats.avx512vl = feats.avx512_bf16 =
            feats.avx512vnni = false;
    if (cap < 1)
        feats.avx2 = feats.fma = feats.f16c = false;
    isa = names[cap];
}

const zs_cpu_features *zs_cpu(void)
{
    pthread_once(&once, detect);
    return &feats;
}

const zs_cpu_features *zs_cpu_hw(void)
{
    pthread_once(&once, detect);
    return &hw;
}

const char *zs_cpu_isa(void)
{
    pthread_once(&once, detect);
    return isa;
}

/* ---- CPUs this process may use ------------------------------------------ */

int zs_cpu_quota(void)
{
    long q = -1, p = 0;
    FILE *f = fopen("/sys/fs/cgroup/cpu.max", "r");
    if (f) {
        if (fscanf(f, "%ld %ld", &q, &p) != 2)
            q = -1; /* "max PERIOD": no quota */
        fclose(f);
    } else {
        FILE *fq = fopen("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", "r");
        FILE *fp = fopen("/sys/fs/cgroup/cpu/cpu.cfs_period_us", "r");
        if (!fq || fscanf(fq, "%ld", &q) != 1 || !fp || fscanf(fp, "%ld", &p) != 1)
            q = -1;
        if (fq)
            fclose(fq);
        if (fp)
            fclose(fp);
    }
    return q > 0 && p > 0 ? (int)((q + p - 1) / p) : 0;
}

long zsi_affinity_cpus(void)
{
#if defined(__linux__)
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0)
        return CPU_COUNT(&set);
#endif
    return 0;
}

/* The online count, cut to the affinity mask (taskset, a container's
 * cpuset) and the cgroup quota (docker --cpus). With the online count
 * alone, a 2-CPU container on a 64-core host would size the thread pool at
 * 64 threads, each with one static chunk, and every parallel region would
 * wait for threads the quota has descheduled; and ranks that mpirun binds
 * to a core each would run a pool per core. */
int zs_cpu_count(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN), a = zsi_affinity_cpus(), q = zs_cpu_quota();
    if (a >= 1 && a < n)
        n = a;
    if (q >= 1 && q < n)
        n = q;
    return n >= 1 ? (int)n : 1;
}

int zs_local_ranks(void)
{
    const char *vars[] = {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "PMI_LOCAL_SIZE",
                          "MV2_COMM_WORLD_LOCAL_SIZE"};
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++) {
        const char *v = getenv(vars[i]);
        if (v && atol(v) > 0)
            return (int)atol(v);
    }
    return 0;
}
