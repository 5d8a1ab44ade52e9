/*
 * isa_cap.h - the instruction-set cap of a benchmark run, shared by the
 * bench programs (header only: each bench program is built from one .c file).
 *
 * ZS_CPU_ISA=portable|avx2|avx512 caps Zhisuan's kernels (src/core/cpu.c).
 * When it caps them below what the hardware has (e.g. avx2 on an AVX-512
 * machine), the peers get the same cap, so the comparison is the one a
 * CPU that stops there would see:
 *   PyTorch (python peer processes): ATEN_CPU_CAPABILITY=avx2 (its
 *     vectorised ATen kernels) and DNNL_MAX_CPU_ISA=AVX2 (oneDNN, which
 *     runs its matmuls and convolutions); portable: default / SSE41;
 *   OpenBLAS: OPENBLAS_CORETYPE=Haswell (its AVX2 kernels); portable:
 *     Prescott. OpenBLAS reads it when it loads, before main, so a bench
 *     that links it re-executes itself with the variable set (isa_cap_exec).
 * Without a cap below the hardware the peers run uncapped, as before.
 * isa_cap_header prints one line naming the cap, Zhisuan's path for the
 * families the bench exercises (the rows of `zs sysinfo`) and the peer's
 * cap.
 */
#ifndef ZS_BENCH_ISA_CAP_H
#define ZS_BENCH_ISA_CAP_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "zs/zs.h"

/* 2 avx512, 1 avx2, 0 portable: the hardware's level and the capped one. */
static inline int isa_cap_level(const char *name)
{
    return !strcmp(name, "avx512") ? 2 : !strcmp(name, "avx2") ? 1 : 0;
}

static inline int isa_cap_hw_level(void)
{
    const zs_cpu_features *h = zs_cpu_hw();
    return h->avx512f && h->avx512bw && h->avx512vl ? 2
           : h->avx2 && h->fma && h->f16c          ? 1
                                                   : 0;
}

/* True when ZS_CPU_ISA caps below the hardware (the peers are capped). */
static inline bool isa_capped(void)
{
    return isa_cap_level(zs_cpu_isa()) < isa_cap_hw_level();
}

/* Environment assignments for a PyTorch peer process ("" uncapped), each
 * followed by a space, to put after `env` in its command line. */
static inline const char *isa_cap_torch_env(void)
{
    if (!isa_capped())
        return "";
    return isa_cap_level(zs_cpu_isa()) == 1
               ? "ATEN_CPU_CAPABILITY=avx2 DNNL_MAX_CPU_ISA=AVX2 "
               : "ATEN_CPU_CAPABILITY=default DNNL_MAX_CPU_ISA=SSE41 ";
}

/* OPENBLAS_CORETYPE for the cap, or NULL (uncapped: OpenBLAS's own choice
 * for the CPU). */
static inline const char *isa_cap_openblas_core(void)
{
    if (!isa_capped())
        return NULL;
    return isa_cap_level(zs_cpu_isa()) == 1 ? "Haswell" : "Prescott";
}

/* Makes OPENBLAS_CORETYPE what the cap asks for (unset when uncapped) and
 * re-executes the program when it was not, so OpenBLAS loads with it.
 * Returns only when nothing had to change or the exec failed. */
static inline void isa_cap_exec(char **argv)
{
    const char *want = isa_cap_openblas_core(), *have = getenv("OPENBLAS_CORETYPE");
    if (want ? have && !strcmp(have, want) : !have)
        return;
    if (want)
        setenv("OPENBLAS_CORETYPE", want, 1);
    else
        unsetenv("OPENBLAS_CORETYPE");
    execv("/proc/self/exe", argv);
    perror("bench: re-exec with OPENBLAS_CORETYPE set for the ISA cap");
}

/* Zhisuan's path for `family` (a row of zs sysinfo) into out. */
static inline void isa_cap_family(const char *family, char *out, size_t cap)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    snprintf(out, cap, "?");
    if (!f)
        return;
    zs_kernel_paths_print(f);
    fclose(f);
    size_t fl = strlen(family);
    for (char *line = strtok(buf, "\n"); line; line = strtok(NULL, "\n")) {
        while (*line == ' ')
            line++;
        if (!strncmp(line, family, fl) && line[fl] == ' ') {
            const char *v = line + fl;
            while (*v == ' ')
                v++;
            snprintf(out, cap, "%s", v);
        }
    }
    free(buf);
}

/* "isa: ZS_CPU_ISA cap avx2 (hardware avx512); zhisuan gemm f32 = avx2
 * 6x16, ...; peer: <peer> <its cap>" for the n families (rows of zs
 * sysinfo). peer names the peer ("PyTorch", "OpenBLAS"); for OpenBLAS the
 * cap is the OPENBLAS_CORETYPE in force. */
static inline void isa_cap_header(FILE *out, const char *const *families, int n,
                                  const char *peer)
{
    static const char *names[] = {"portable", "avx2", "avx512"};
    fprintf(out, "isa: ZS_CPU_ISA cap %s (hardware %s); zhisuan", zs_cpu_isa(),
            names[isa_cap_hw_level()]);
    for (int i = 0; i < n; i++) {
        char path[160];
        isa_cap_family(families[i], path, sizeof path);
        fprintf(out, "%s %s = %s", i ? ";" : "", families[i], path);
    }
    if (peer && !strcmp(peer, "OpenBLAS")) {
        const char *core = getenv("OPENBLAS_CORETYPE");
        fprintf(out, "; peer OpenBLAS: %s\n",
                core ? core : "uncapped (its best kernel for the CPU)");
    } else if (peer) {
        const char *env = isa_cap_torch_env();
        if (*env)
            fprintf(out, "; peer %s: %.*s\n", peer, (int)strlen(env) - 1, env);
        else
            fprintf(out, "; peer %s: uncapped (its best kernels for the CPU)\n", peer);
    } else {
        fprintf(out, "\n");
    }
}

#endif
