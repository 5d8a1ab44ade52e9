/*
 * optable.c - the operator table as text (`zs ops`): every descriptor of
 * ops/oplist.h, its class, its kernels per registered device and dtype,
 * and what its backward runs (the backward descriptors it calls, or
 * "composite" for a rule made of other operators, "-" when it has none).
 */
#include <string.h>

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
    fprintf(f, "  %s\n", "backward");
    zsi_opdef *const *all = zsi_opdefs();
    for (int i = 0; all[i]; i++) {
        char buf[160];
        fprintf(f, "%-22s  %-9s", all[i]->op.name, class_name(all[i]->cls));
        for (int j = 0; j < nd; j++) {
            dtypes_text(all[i], devs[j], buf, sizeof buf);
            fprintf(f, "  %-16s", buf[0] ? buf : "-");
        }
        backward_text(all[i], buf, sizeof buf);
        fprintf(f, "  %s\n", buf);
    }
}
