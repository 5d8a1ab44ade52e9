/*
 * print.c - human-readable tensor printing (abbreviated past 6 per dim).
 */
#include "core/internal.h"

static void print_rec(const zs_tensor *t, FILE *f, int d, int64_t off,
                      int indent)
{
    int64_t n = t->shape[d];
    fputc('[', f);
    for (int64_t i = 0; i < n; i++) {
        if (n > 6 && i == 3) {
            fputs(d == t->ndim - 1 ? "..., " : "...,\n", f);
            i = n - 3;
        }
        int64_t o = off + i * t->strides[d];
        if (d == t->ndim - 1) {
            double v = zsi_load(t->dtype, t->storage->data, o);
            if (zs_dtype_is_float(t->dtype))
                fprintf(f, "%.6g", v);
            else
                fprintf(f, "%lld", (long long)v);
        } else {
            if (i > 0)
                fprintf(f, "%*s", indent + 1, "");
            print_rec(t, f, d + 1, o, indent + 1);
        }
        if (i + 1 < n)
            fputs(d == t->ndim - 1 ? ", " : ",\n", f);
    }
    fputc(']', f);
}

void zs_print(const zs_tensor *t, FILE *f)
{
    if (!t) {
        fputs("tensor(NULL)\n", f);
        return;
    }
    char buf[128];
    fprintf(f, "tensor(%s, %s", zs_shape_str(t, buf, sizeof buf),
            zs_dtype_name(t->dtype));
    if (t->requires_grad)
        fputs(", requires_grad", f);
    fputs(")\n", f);
    if (t->ndim == 0) {
        fprintf(f, "%.6g\n", zsi_load(t->dtype, t->storage->data, t->offset));
        return;
    }
    if (zs_numel(t) == 0) {
        fputs("[]\n", f);
        return;
    }
    print_rec(t, f, 0, t->offset, 0);
    fputc('\n', f);
}
