/*
 * print.c - human-readable tensor printing (abbreviated past 6 per dim).
 * A tensor on a device the host cannot read is copied to the host first.
 */
#include "core/internal.h"

static void print_host(const zs_tensor *t, FILE *f);

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

/* t's storage copied to the host (the caller frees *data with zs_free), in
 * a header h and storage s that alias it; for printing device tensors. */
static zs_status host_alias(const zs_tensor *t, zs_tensor *h, zs_storage *s)
{
    *s = *t->storage;
    *h = *t;
    h->storage = s;
    s->data = zs_alloc(s->nbytes ? s->nbytes : 1);
    if (!s->data)
        return ZS_ERR_NOMEM;
    zs_status st = zsi_device_copy(t->device, s->data, t->storage->data,
                                   s->nbytes, ZS_COPY_TO_HOST);
    if (st != ZS_OK)
        zs_free(s->data);
    return st;
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
    if (t->device != ZS_CPU)
        fprintf(f, ", device=%s", zs_device_name(t->device));
    if (!zsi_device_host(t->device)) {
        zs_tensor h;
        zs_storage s;
        if (host_alias(t, &h, &s) != ZS_OK) {
            fprintf(f, ", not readable: %s)\n", zs_last_error());
            return;
        }
        print_host(&h, f);
        zs_free(s.data);
        return;
    }
    print_host(t, f);
}

static void print_host(const zs_tensor *t, FILE *f)
{
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
