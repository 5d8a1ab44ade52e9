/*
 * zs/analyze.h - machine measurements and (later) model analysis.
 */
#ifndef ZS_ANALYZE_H
#define ZS_ANALYZE_H

#include "core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Peak FP32 FMA rate in GFLOP/s on `threads` threads, measured with a
 * register-resident FMA loop (AVX-512, else AVX2, else scalar) for about
 * `seconds`. */
double zs_measure_peak_gflops(int threads, double seconds);
/* STREAM-style triad a = b + s*c on `threads` threads over arrays of
 * `bytes` each (well beyond cache), in GB/s counting 3 arrays moved
 * (2 reads, 1 write); best of `reps`. */
double zs_measure_triad_gbs(int threads, size_t bytes, int reps);

#ifdef __cplusplus
}
#endif
#endif
