/*
 * devices.c - a table of accelerators (vendor peak figures: dense 16-bit
 * tensor-core FLOP/s, fp32 FLOP/s, memory bandwidth, memory) plus this
 * machine's CPU, measured, and the roofline built on them.
 *
 * Roofline: an operator of intensity I FLOP/byte runs at most at
 * min(peak, I * bandwidth); it is memory-bound when I is below the ridge
 * point peak / bandwidth. Time at a model-FLOPs utilisation (MFU):
 * flops / (devices * peak * MFU).
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "zs/analyze.h"

static const zs_hw_spec table[] = {
    /* name        16-bit  fp32   GB/s    GB */
    {"v100", 125, 15.7, 900, 32, false},
    {"a100-80gb", 312, 19.5, 2039, 80, false},
    {"h100-sxm", 989, 67, 3350, 80, false},
    {"h200", 989, 67, 4800, 141, false},
    {"cpu", 0, 0, 0, 0, true},
};
#define N_DEVICES ((int)(sizeof table / sizeof *table))

int zs_hw_count(void) { return N_DEVICES; }

const zs_hw_spec *zs_hw_at(int i)
{
    return i >= 0 && i < N_DEVICES ? &table[i] : NULL;
}

/* Measured once per process (pthread_once: the first caller measures,
 * concurrent ones wait for it): the FMA peak (0.1 s) and a triad over
 * three 32 MB arrays, on zs_num_threads() threads. */
static zs_hw_spec cpu_cached;
static pthread_once_t cpu_once = PTHREAD_ONCE_INIT;

static void measure_cpu_once(void)
{
    int nt = zs_num_threads();
    double gflops = zs_measure_peak_gflops(nt, 0.1);
    double gbs = zs_measure_triad_gbs(nt, (size_t)32 << 20, 3);
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    cpu_cached = table[N_DEVICES - 1];
    cpu_cached.tflops32 = gflops / 1e3;
    cpu_cached.tflops16 = cpu_cached.tflops32;
    cpu_cached.bw_gbs = gbs;
    cpu_cached.mem_gb = pages > 0 && page > 0 ? (double)pages * (double)page / 1e9 : 0;
}

static void measure_cpu(zs_hw_spec *d)
{
    pthread_once(&cpu_once, measure_cpu_once);
    *d = cpu_cached;
}

zs_status zs_hw_lookup(const char *name, zs_hw_spec *out)
{
    static const struct {
        const char *alias, *name;
    } aliases[] = {{"a100", "a100-80gb"}, {"h100", "h100-sxm"}};
    if (!name || !out)
        return zs_set_error("analyze: device_lookup: NULL argument");
    for (size_t i = 0; i < sizeof aliases / sizeof *aliases; i++)
        if (!strcasecmp(name, aliases[i].alias))
            name = aliases[i].name;
    for (int i = 0; i < N_DEVICES; i++) {
        if (strcasecmp(name, table[i].name))
            continue;
        if (table[i].measured)
            measure_cpu(out);
        else
            *out = table[i];
        return ZS_OK;
    }
    return zs_set_error("analyze: unknown device '%s' (known: v100, "
                        "a100-80gb, h100-sxm, h200, cpu)", name);
}

double zs_hw_peak_flops(const zs_hw_spec *d, zs_precision p)
{
    return 1e12 * (p == ZS_PREC_FP32 ? d->tflops32 : d->tflops16);
}

double zs_hw_ridge(const zs_hw_spec *d, zs_precision p)
{
    return d->bw_gbs > 0 ? zs_hw_peak_flops(d, p) / (d->bw_gbs * 1e9) : 0;
}

double zs_roofline_seconds(const zs_hw_spec *d, zs_precision p,
                           double flops, double bytes)
{
    double peak = zs_hw_peak_flops(d, p), bw = d->bw_gbs * 1e9;
    double tc = peak > 0 ? flops / peak : 0, tm = bw > 0 ? bytes / bw : 0;
    return tc > tm ? tc : tm;
}

double zs_step_seconds(const zs_hw_spec *d, zs_precision p, double flops,
                       int64_t devices, double mfu)
{
    double peak = zs_hw_peak_flops(d, p);
    if (devices <= 0 || !(mfu > 0) || !(peak > 0))
        return -1;
    return flops / ((double)devices * peak * mfu);
}
