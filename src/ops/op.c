/*
 * op.c - operator registry, cost counters and the profiler table.
 *
 * Each operator's zsi_op registers itself on its first call. Every call adds
 * its cost model (FLOPs, bytes read and written) to the operator's
 * counters; while profiling is on, the wall time too, so zs_profile_print
 * can show achieved GFLOP/s and GB/s per operator. Counters are updated
 * from the calling thread only (operators are called from one thread).
 *
 * It also holds the recorder hook and zsi_save (ops/op.h); the driver
 * zsi_run lives in dispatch.c.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ops/op.h"
#include "core/internal.h"
#include "zs/ops.h"

static zsi_op *registry;
static bool profiling;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double zsi_op_begin(zsi_op *op)
{
    if (!op->registered) {
        op->registered = true;
        op->next = registry;
        registry = op;
    }
    return profiling ? now() : 0;
}

void zsi_op_end(zsi_op *op, double t0, double flops, double bytes_read,
                double bytes_written)
{
    op->calls++;
    op->flops += flops;
    op->bytes += bytes_read + bytes_written;
    if (t0 > 0) /* a composite op's time includes the ops it calls */
        op->seconds += now() - t0;
}

static zsi_recorder_fn recorder;

void zsi_set_recorder(zsi_recorder_fn fn) { recorder = fn; }

zs_status zsi_record(zsi_op *op, zs_tensor *out, int nin, zs_tensor *const *in,
                     zsi_ctx **ctx)
{
    *ctx = NULL;
    return recorder ? recorder(op, out, nin, in, ctx) : ZS_OK;
}

void zsi_save(zsi_ctx *n, int k, zs_tensor *t)
{
    if (!n || !t)
        return;
    zsi_tracking_pause();
    zs_tensor *alias = zsi_new_view(t, t->ndim, t->shape, t->strides, t->offset);
    zsi_tracking_resume();
    zs_release(n->saved[k]);
    n->saved[k] = alias;
}

void zs_profile_enable(bool on) { profiling = on; }

void zs_profile_reset(void)
{
    for (zsi_op *op = registry; op; op = op->next) {
        op->calls = 0;
        op->flops = op->bytes = op->seconds = 0;
    }
}

int zs_profile_stats(zs_op_stat *out, int max)
{
    int k = 0;
    for (zsi_op *op = registry; op && k < max; op = op->next) {
        if (!op->calls)
            continue;
        out[k++] = (zs_op_stat){op->name, op->calls, op->flops, op->bytes,
                                op->seconds};
    }
    return k;
}

double zs_profile_total_flops(void)
{
    double f = 0;
    for (zsi_op *op = registry; op; op = op->next)
        f += op->flops;
    return f;
}

static int by_time(const void *a, const void *b)
{
    const zs_op_stat *x = a, *y = b;
    if (x->seconds != y->seconds)
        return x->seconds < y->seconds ? 1 : -1;
    return x->flops < y->flops ? 1 : x->flops > y->flops ? -1 : 0;
}

void zs_profile_print(FILE *f)
{
    zs_op_stat st[256];
    int n = zs_profile_stats(st, 256);
    qsort(st, (size_t)n, sizeof *st, by_time);
    fprintf(f, "%-18s %8s %10s %10s %10s %10s %9s\n", "op", "calls", "GFLOP",
            "GB", "ms", "GFLOP/s", "GB/s");
    for (int i = 0; i < n; i++) {
        double s = st[i].seconds;
        fprintf(f, "%-18s %8llu %10.3f %10.3f %10.2f %10.2f %9.2f\n",
                st[i].name, (unsigned long long)st[i].calls, st[i].flops / 1e9,
                st[i].bytes / 1e9, s * 1e3, s > 0 ? st[i].flops / s / 1e9 : 0,
                s > 0 ? st[i].bytes / s / 1e9 : 0);
    }
}

zs_tensor *zsi_sum_to(zs_tensor *g, const zsi_meta *m)
{
    int axes[ZS_MAX_DIMS], na = 0;
    int lead = g->ndim - m->ndim;
    for (int d = 0; d < g->ndim; d++) {
        if (d < lead || (m->shape[d - lead] == 1 && g->shape[d] != 1))
            axes[na++] = d;
    }
    if (na == 0)
        return zs_retain(g);
    if (g->dtype == ZS_BF16 || g->dtype == ZS_F16) {
        /* low precision: sum in f32, round once */
        zs_tensor *g32 = zs_to_dtype(g, ZS_F32);
        zs_tensor *s32 = g32 ? zsi_sum_to(g32, m) : NULL;
        zs_tensor *r = s32 ? zs_to_dtype(s32, g->dtype) : NULL;
        zs_release(g32);
        zs_release(s32);
        return r;
    }
    zs_tensor *s = zs_sum(g, na, axes, true);
    if (!s)
        return NULL;
    zs_tensor *r = zs_reshape(s, m->ndim, m->shape);
    zs_release(s);
    return r;
}
