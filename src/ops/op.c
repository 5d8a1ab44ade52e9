/*
 * op.c - operator registry, cost counters and the profiler table.
 *
 * Each operator's zsi_op registers itself on its first call. While
 * profiling is on, every call adds its cost model (FLOPs, bytes read and
 * written) and its wall time to the operator's counters, so
 * zs_profile_print can show achieved GFLOP/s and GB/s per operator.
 *
 * Threads: registration takes reg_mu once per operator (double-checked on
 * op->registered, so later calls take no lock); the counters are added
 * under count_mu, only while profiling is on, so with profiling off a
 * call pays one relaxed load. zs_profile_enable itself is set-up: call it
 * while no other thread runs operators (a call in flight when it changes
 * is counted or not, never torn).
 *
 * It also holds the recorder hook and zsi_save (ops/op.h); the driver
 * zsi_run lives in dispatch.c.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ops/op.h"
#include "core/internal.h"
#include "zs/ops.h"

static zsi_op *registry; /* under reg_mu */
static pthread_mutex_t reg_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t count_mu = PTHREAD_MUTEX_INITIALIZER; /* counters */
static atomic_bool profiling;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void op_register(zsi_op *op)
{
    pthread_mutex_lock(&reg_mu);
    if (!atomic_load_explicit(&op->registered, memory_order_relaxed)) {
        op->next = registry;
        registry = op;
        atomic_store_explicit(&op->registered, true, memory_order_release);
    }
    pthread_mutex_unlock(&reg_mu);
}

double zsi_op_begin(zsi_op *op)
{
    if (!atomic_load_explicit(&op->registered, memory_order_acquire))
        op_register(op);
    /* CLOCK_MONOTONIC is > 0 after boot: t0 == 0 means "not profiled" */
    return atomic_load_explicit(&profiling, memory_order_relaxed) ? now() : 0;
}

void zsi_op_end(zsi_op *op, double t0, double flops, double bytes_read,
                double bytes_written)
{
    if (t0 == 0)
        return;
    double dt = now() - t0; /* a composite op's time includes the ops it calls */
    pthread_mutex_lock(&count_mu);
    op->calls++;
    op->flops += flops;
    op->bytes += bytes_read + bytes_written;
    op->seconds += dt;
    pthread_mutex_unlock(&count_mu);
}

/* Set once by autograd's constructor (before main), read-only after. */
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

void zs_profile_enable(bool on)
{
    atomic_store_explicit(&profiling, on, memory_order_relaxed);
}

/* The readers below hold both locks (reg_mu first): the list and the
 * counters stay still while they walk. */
void zs_profile_reset(void)
{
    pthread_mutex_lock(&reg_mu);
    pthread_mutex_lock(&count_mu);
    for (zsi_op *op = registry; op; op = op->next) {
        op->calls = 0;
        op->flops = op->bytes = op->seconds = 0;
    }
    pthread_mutex_unlock(&count_mu);
    pthread_mutex_unlock(&reg_mu);
}

int zs_profile_stats(zs_op_stat *out, int max)
{
    int k = 0;
    pthread_mutex_lock(&reg_mu);
    pthread_mutex_lock(&count_mu);
    for (zsi_op *op = registry; op && k < max; op = op->next) {
        if (!op->calls)
            continue;
        out[k++] = (zs_op_stat){op->name, op->calls, op->flops, op->bytes,
                                op->seconds};
    }
    pthread_mutex_unlock(&count_mu);
    pthread_mutex_unlock(&reg_mu);
    return k;
}

double zs_profile_total_flops(void)
{
    double f = 0;
    pthread_mutex_lock(&reg_mu);
    pthread_mutex_lock(&count_mu);
    for (zsi_op *op = registry; op; op = op->next)
        f += op->flops;
    pthread_mutex_unlock(&count_mu);
    pthread_mutex_unlock(&reg_mu);
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

zs_tensor *zsi_contig_host(zs_tensor *t)
{
    if (zs_is_contiguous(t))
        return zs_retain(t);
    zsi_tracking_pause();
    zs_tensor *c = zsi_new_tensor(t->dtype, t->ndim, t->shape);
    zsi_tracking_resume();
    if (c && zsi_copy_host(c, t) != ZS_OK) {
        zs_release(c);
        c = NULL;
    }
    return c;
}
