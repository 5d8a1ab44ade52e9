/*
 * optable.c - the operator table as text (`zs ops`): every descriptor of
 * ops/oplist.h, its class, its kernels per registered device and dtype,
 * its autocast class (ops/autocast.c: lowp, f32, f32/reads-lowp,
 * promote, default, never), and what its backward runs (the backward
 * descriptors it calls, or
 * "composite" for a rule made of other operators, "-" when it has none),
 * and the path each CPU kernel family takes under the ISA cap (`zs
 * sysinfo`).
 */
#include <string.h>
#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include "kernels/cpu/fp8.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/int8_linear.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/packed_linear.h"
#include "kernels/cpu/quant.h"
#include "kernels/cpu/unary.h"
#include "ops/op.h"
#include "zs/ops.h"

static const char *class_name(zsi_op_class c)
{
    switch (c) {
    case ZSI_POINTWISE: return "pointwise";
    case ZSI_REDUCTION: return "reduction";
    case ZSI_GEMM: return "gemm";
    case ZSI_VIEW: return "view";
    default: return "other";
    }
}

/* "f32 f64 bf16" for def's kernels on device d ("" when none; "all" for
 * every dtype; "any" for a view, which needs no kernel). */
static void dtypes_text(const zsi_opdef *def, int d, char *buf, size_t n)
{
    size_t k = 0;
    buf[0] = '\0';
    if (def->view) {
        snprintf(buf, n, "any");
        return;
    }
    int have = 0;
    for (int t = 0; t < ZS_DTYPE_COUNT; t++)
        have += def->kernel[d][t] != NULL;
    if (have == ZS_DTYPE_COUNT) {
        snprintf(buf, n, "all");
        return;
    }
    for (int t = 0; t < ZS_DTYPE_COUNT && k < n; t++)
        if (def->kernel[d][t])
            k += (size_t)snprintf(buf + k, n - k, "%s%s", k ? " " : "",
                                  zs_dtype_name((zs_dtype)t));
}

static void backward_text(const zsi_opdef *def, char *buf, size_t n)
{
    size_t k = 0;
    buf[0] = '\0';
    if (!def->op.backward) {
        snprintf(buf, n, "-");
        return;
    }
    for (int i = 0; def->bw_ops && def->bw_ops[i] && k < n; i++)
        k += (size_t)snprintf(buf + k, n - k, "%s%s", k ? ", " : "",
                              def->bw_ops[i]->op.name);
    if (!buf[0])
        snprintf(buf, n, "composite");
}

void zs_ops_print(FILE *f)
{
    int devs[ZS_MAX_DEVICES], nd = 0;
    for (int d = 0; d < ZS_MAX_DEVICES; d++)
        if (zs_device_get(d))
            devs[nd++] = d;
    /* columns are separated by two spaces or more (a dtype list has
     * single spaces), so a script may split on "  +" */
    fprintf(f, "%-22s  %-9s", "operator", "class");
    for (int j = 0; j < nd; j++)
        fprintf(f, "  %-16s", zs_device_name(devs[j]));
    fprintf(f, "  %-14s  %s\n", "autocast", "backward");
    zsi_opdef *const *all = zsi_opdefs();
    for (int i = 0; all[i]; i++) {
        char buf[160];
        fprintf(f, "%-22s  %-9s", all[i]->op.name, class_name(all[i]->cls));
        for (int j = 0; j < nd; j++) {
            dtypes_text(all[i], devs[j], buf, sizeof buf);
            fprintf(f, "  %-16s", buf[0] ? buf : "-");
        }
        backward_text(all[i], buf, sizeof buf);
        fprintf(f, "  %-14s  %s\n", zsi_amp_class_name(all[i]), buf);
    }
}

/* unary.c's AVX-512 vector math, else its compiled loops (ZSK_ISA_VOID)
 * with libm; binary.c's loops follow the same cap. */
static const char *pointwise_path(void)
{
    static const char *const loops[] = {"portable",
                                        "avx2 (compiled loops, libm math)",
                                        "avx512 (compiled loops, libm math)"};
    if (zsk_unary_has_vector(ZSK_EXP))
        return "avx512 (vector math and loops)";
    return loops[zsk_isa_level()];
}

/* attention.c's f32 tiles: attention_avx2.c's 6x16 register blocks for
 * D % 16 == 0 (D <= 128) under AVX2 and AVX-512 (faster on Zen 4: see
 * attention.c), else 16 lanes x 64 keys (AVX-512, and the portable build
 * of the same body) or 8 lanes x 32 keys (AVX2). */
static const char *attention_path(void)
{
    static const char *const names[] = {"portable", "avx2 (6x16 blocks; 8-lane tiles)",
                                        "avx512 (ymm 6x16 blocks; 16-lane tiles)"};
    return names[zsk_isa_level()];
}

/* The CPU's brand string (CPUID 0x80000002..4), trimmed, into buf; "?"
 * where there is none. Benchmark figures name the CPU they ran on. */
static void cpu_name(char *buf, size_t cap)
{
    snprintf(buf, cap, "?");
#if defined(__x86_64__)
    unsigned r[12];
    if (__get_cpuid_max(0x80000000u, NULL) < 0x80000004u)
        return;
    for (unsigned i = 0; i < 3; i++)
        __get_cpuid(0x80000002u + i, &r[4 * i], &r[4 * i + 1], &r[4 * i + 2], &r[4 * i + 3]);
    char s[49];
    memcpy(s, r, 48);
    s[48] = 0;
    const char *b = s;
    while (*b == ' ')
        b++;
    size_t n = strlen(b);
    while (n > 0 && b[n - 1] == ' ')
        n--;
    if (n > 0)
        snprintf(buf, cap, "%.*s", (int)n, b);
#endif
}

void zs_kernel_paths_print(FILE *f)
{
    char name[64];
    cpu_name(name, sizeof name);
    fprintf(f, "cpu            %s\n", name);
    const zs_cpu_features *c = zs_cpu();
    bool vec = !zsk_linear_portable();
    fprintf(f, "isa cap        %s (ZS_CPU_ISA; the hardware has %s)\n",
            zs_cpu_isa(), zs_cpu_hw()->avx512f ? "avx512" : zs_cpu_hw()->avx2 ? "avx2"
                                                                               : "neither");
    const struct {
        const char *family, *path;
    } rows[] = {
        {"gemm f32", zsk_gemm_desc_for(ZSK_GEMM_F32)->name},
        {"gemm bf16", zsk_gemm_desc_for(ZSK_GEMM_BF16)->name},
        {"gemm f16", zsk_gemm_desc_for(ZSK_GEMM_F16)->name},
        {"gemm fp8", zsk_gemm_fp8_path()},
        {"packed linear", vec && c->avx512f               ? "avx512"
                          : vec && c->avx2 && c->fma ? "avx2"
                                                     : "portable"},
        {"quantized matmul", !vec ? "portable" : zsk_quant_has_vnni() ? "avx512 vnni"
                             : zsk_quant_has_avx2() ? "avx2" : "portable"},
        {"int8 / w8a8", vec && zsk_i8_has_vnni()   ? "avx512 vnni"
                        : vec && zsk_i8_has_avx2() ? "avx2"
                                                   : "portable"},
        {"paged attention",
         vec && c->avx512f && c->avx2 && c->fma && c->f16c
             ? "avx512 (head dim % 16 == 0), else avx2 (head dim % 8 == 0)"
         : vec && c->avx512f ? "avx512 (head dim % 16 == 0)"
         : vec && c->avx2 && c->fma && c->f16c ? "avx2 (head dim % 8 == 0)"
                                                : "portable"},
        {"pointwise", pointwise_path()},
        {"convolution", c->avx512f ? "direct avx512 where it fits (direct avx2 for "
                                     "<= 8 channels), else im2col + gemm"
                        : c->avx2 && c->fma ? "direct avx2 (stride 1), else im2col + gemm"
                                            : "im2col + gemm"},
        {"attention", attention_path()},
        {"softmax, norms, reductions", zsk_isa_name()},
        {"optimizer", zsk_isa_name()},
    };
    for (size_t i = 0; i < sizeof rows / sizeof *rows; i++)
        fprintf(f, "  %-27s %s\n", rows[i].family, rows[i].path);
}
