/*
 * cpu.c - run-time CPU feature detection (cpuid + xgetbv), so kernels pick
 * AVX-512 / AVX2 / scalar code without -march=native at build time.
 */
#include <cpuid.h>
#include <pthread.h>

#include "zs/core.h"

static zs_cpu_features feats;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void detect(void)
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
    feats.avx2 = avx && ymm && (b & (1u << 5));
    feats.fma = fma && ymm;
    feats.f16c = f16c && ymm;
    feats.avx512f = zmm && (b & (1u << 16));
    feats.avx512bw = feats.avx512f && (b & (1u << 30));
    feats.avx512vl = feats.avx512f && (b & (1u << 31));
    if (__get_cpuid_count(7, 1, &a, &b, &c, &d))
        feats.avx512_bf16 = feats.avx512f && (a & (1u << 5));
}

const zs_cpu_features *zs_cpu(void)
{
    pthread_once(&once, detect);
    return &feats;
}
