/*
 * test_isa_dispatch.c - the capped ISA dispatch of kernels/cpu/kernels.h
 * (ZSK_ISA_FN / ZSK_ISA_VOID, zsk_isa_level) and what zs sysinfo prints
 * for the families that use it.
 *
 * (1) zsk_isa_level() is the lower of the hardware's level and the cap in
 *     ZS_CPU_ISA (ctest runs this test again under avx2 and portable).
 * (2) Kernels defined here with both macros (static and external, with a
 *     return value and without) give the float64 reference's results on
 *     the level in force: a dot product in double lanes (exact for these
 *     inputs) and an axpy on odd lengths and a strided tail.
 * (3) zs_kernel_paths_print names the capped path: optimizer and softmax/
 *     norms = the level's name; pointwise and attention begin with it
 *     (avx2 under the avx2 cap, portable under the portable one).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/kernels.h"
#include "testutil.h"
#include "zs/ops.h"

/* sum_i a[i] * b[i] in double (each product exact: 12-bit inputs). */
static ZSK_ISA_FN(double, dot_d, (const float *a, const float *b, int64_t n), (a, b, n))
{
    double acc[4] = {0};
    int64_t i = 0;
    for (; i + 4 <= n; i += 4)
        for (int k = 0; k < 4; k++)
            acc[k] += (double)a[i + k] * (double)b[i + k];
    for (; i < n; i++)
        acc[0] += (double)a[i] * (double)b[i];
    return (acc[0] + acc[1]) + (acc[2] + acc[3]);
}

/* y[i * inc] += s * x[i] (external linkage: no `static`). */
void test_isa_axpy(float *restrict y, int64_t inc, float s, const float *restrict x,
                   int64_t n);
ZSK_ISA_VOID(test_isa_axpy, (float *restrict y, int64_t inc, float s,
                             const float *restrict x, int64_t n),
             (y, inc, s, x, n))
{
    for (int64_t i = 0; i < n; i++)
        y[i * inc] += s * x[i];
}

static int hw_level(void)
{
    const zs_cpu_features *h = zs_cpu_hw();
    bool v3 = h->avx2 && h->fma && h->f16c;
    return v3 && h->avx512f && h->avx512bw && h->avx512vl ? 2 : v3 ? 1 : 0;
}

static void check_level(void)
{
    const char *e = getenv("ZS_CPU_ISA");
    int cap = 2;
    if (e && !strcmp(e, "avx2"))
        cap = 1;
    else if (e && !strcmp(e, "portable"))
        cap = 0;
    int want = hw_level() < cap ? hw_level() : cap;
#if !defined(__x86_64__)
    want = zsk_isa_level(); /* the macros define plain functions */
#endif
    ZT_CHECK(zsk_isa_level() == want, "ZS_CPU_ISA=%s, hardware level %d: level %d, want %d",
             e ? e : "(unset)", hw_level(), zsk_isa_level(), want);
    printf("level %d (%s), hardware %d\n", zsk_isa_level(), zsk_isa_name(), hw_level());
}

static void check_kernels(void)
{
    static const int64_t NS[] = {0, 1, 7, 16, 33, 1000, 4099};
    uint64_t s = 5;
    for (size_t t = 0; t < sizeof NS / sizeof *NS; t++) {
        int64_t n = NS[t];
        float *a = malloc((size_t)(n + 1) * sizeof *a), *b = malloc((size_t)(n + 1) * sizeof *b);
        float *y = malloc((size_t)(3 * n + 1) * sizeof *y);
        double ref = 0;
        for (int64_t i = 0; i < n; i++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            a[i] = (float)((int)(s >> 52) - 2048) / 64.0f; /* 12-bit values */
            b[i] = (float)((int)((s >> 40) & 4095) - 2048) / 32.0f;
            ref += (double)a[i] * (double)b[i];
        }
        ZT_CHECK(dot_d(a, b, n) == ref, "dot n=%lld: %.17g, want %.17g", (long long)n,
                 dot_d(a, b, n), ref);
        for (int inc = 1; inc <= 3; inc += 2) {
            for (int64_t i = 0; i < 3 * n; i++)
                y[i] = (float)(i % 13);
            test_isa_axpy(y, inc, 0.5f, a, n);
            int64_t bad = 0;
            for (int64_t i = 0; i < 3 * n; i++) {
                bool hit = i % inc == 0 && i / inc < n;
                float want = (float)(i % 13) + (hit ? 0.5f * a[i / inc] : 0.0f);
                bad += y[i] != want; /* both operands exact: no rounding */
            }
            ZT_CHECK(bad == 0, "axpy n=%lld inc=%d: %lld wrong", (long long)n, inc,
                     (long long)bad);
        }
        free(a);
        free(b);
        free(y);
    }
}

/* The row of `family` in zs sysinfo's path table, into row. */
static bool paths_row(const char *family, char *row, size_t cap)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f)
        return false;
    zs_kernel_paths_print(f);
    fclose(f);
    bool found = false;
    for (char *line = strtok(buf, "\n"); line; line = strtok(NULL, "\n")) {
        while (*line == ' ')
            line++;
        if (!strncmp(line, family, strlen(family)) && line[strlen(family)] == ' ') {
            const char *v = line + strlen(family);
            while (*v == ' ')
                v++;
            snprintf(row, cap, "%s", v);
            found = true;
        }
    }
    free(buf);
    return found;
}

static void check_sysinfo(void)
{
    char row[200];
    ZT_CHECK(paths_row("optimizer", row, sizeof row) && !strcmp(row, zsk_isa_name()),
             "optimizer path '%s', want '%s'", row, zsk_isa_name());
    ZT_CHECK(paths_row("softmax, norms, reductions", row, sizeof row) &&
                 !strcmp(row, zsk_isa_name()),
             "softmax/norms path '%s', want '%s'", row, zsk_isa_name());
    ZT_CHECK(paths_row("pointwise", row, sizeof row), "pointwise row");
    const char *want = zsk_isa_level() == 2 ? "avx512" : zsk_isa_level() == 1 ? "avx2" : "portable";
    ZT_CHECK(!strncmp(row, want, strlen(want)), "pointwise path '%s', want '%s...'", row, want);
    ZT_CHECK(!strstr(row, "clone"), "pointwise path '%s' names the uncapped clones", row);
    ZT_CHECK(paths_row("attention", row, sizeof row) &&
                 !strncmp(row, zsk_isa_name(), strlen(zsk_isa_name())),
             "attention path '%s', want '%s...'", row, zsk_isa_name());
}

int main(void)
{
    check_level();
    zt_section("zsk_isa_level follows ZS_CPU_ISA");
    check_kernels();
    zt_section("ZSK_ISA_FN / ZSK_ISA_VOID kernels on the level in force");
    check_sysinfo();
    zt_section("zs sysinfo names the capped path (pointwise, attention, softmax, optimizer)");
    return zt_done();
}
