/*
 * idle.c - how a rank spends the time between two polls of a wait that
 * found nothing done (comm.c zsi_poll, the receive loop of collectives.c,
 * the ring's wait in ring.c, the timeout survey). One schedule for every
 * polling loop:
 *
 *   spin   poll again at once, for the first SPIN_S of the wait (the
 *          latency of a short wait stays that of a busy loop);
 *   yield  sched_yield between polls, until YIELD_S into the wait (a
 *          rank that has work and shares this core runs first);
 *   nap    nanosleep between polls, from FIRST_NAP_S doubling up to
 *          zsi_idle_cap (<= MAX_NAP_S): a long wait costs no CPU.
 *
 * When the host runs more ranks than it has CPUs (zsi_oversubscribed:
 * mpirun --oversubscribe, 8 ranks on 2 cores), or for a wait that asks to
 * be polite (a server waiting for any worker), there is no spin phase and
 * only a few yields: a spinning rank would take the CPU from the ranks
 * that have the work it waits for. OpenMPI then also yields inside its
 * own progress (mpi_yield_when_idle defaults to 1 when oversubscribed),
 * which does not give the core away for long; the naps do.
 *
 * A nap lasts longer than asked by the kernel's timer slack (50 us for
 * a normal thread). Measured on a loaded 2-core machine (load 11-17):
 * test_parallel3d.sh's 2-rank tp runs took 0.8-1.0 CPU s instead of
 * 2.4-2.9 (spinning), and the unchanged script 189 s instead of 326.
 *
 * Timeouts are the caller's (zsi_expired): a nap is at most 1/100 of the
 * communicator's timeout (and MAX_NAP_S), so a napping rank is never
 * taken for a stalled one (stall: a gap over half the timeout) and a
 * deadline is overshot by at most one nap.
 */
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "parallel/internal.h"

#define SPIN_S 50e-6       /* not oversubscribed: busy polls first */
#define YIELD_S 1e-3       /* not oversubscribed: then yields until here */
#define POLITE_YIELDS 2    /* oversubscribed or polite: yields before napping */
#define FIRST_NAP_S 10e-6
#define MAX_NAP_S 200e-6

/* The host's online CPUs, cut to the cgroup CPU quota (a container's
 * share: docker --cpus). Not this process's affinity mask: mpirun binds
 * each of 2 ranks on 2 cores to a core of its own (a mask of one CPU),
 * which is no oversubscription. (A container's cpuset smaller than the
 * online CPUs goes unseen: ZS_COMM_IDLE=polite says it.) */
static long host_cpus(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN), q = zs_cpu_quota();
    if (q >= 1 && q < n)
        n = q;
    return n > 0 ? n : 1;
}

/* An MCA boolean set in the environment ("1", "true", "yes", ...). */
static bool env_true(const char *name)
{
    const char *v = getenv(name);
    return v && (atoi(v) > 0 || !strcasecmp(v, "true") || !strcasecmp(v, "yes") ||
                 !strcasecmp(v, "y") || !strcasecmp(v, "t") || !strcasecmp(v, "enabled"));
}

/* ZS_COMM_IDLE=spin|polite overrides the detection; else OpenMPI's
 * mpi_yield_when_idle asked for, or more local ranks than online CPUs. */
bool zsi_idle_detect(void)
{
    const char *o = getenv("ZS_COMM_IDLE");
    if (o && !strcmp(o, "spin"))
        return false;
    if (o && !strcmp(o, "polite"))
        return true;
    if (env_true("OMPI_MCA_mpi_yield_when_idle"))
        return true;
    long ranks = zs_local_ranks();
    return ranks > host_cpus();
}

bool zsi_oversubscribed(void)
{
    static int known = -1; /* read once: the environment does not change */
    if (known < 0)
        known = zsi_idle_detect();
    return known;
}

double zsi_idle_cap(const zs_comm *c)
{
    double cap = MAX_NAP_S;
    if (c && c->timeout > 0 && c->timeout / 100 < cap)
        cap = c->timeout / 100;
    return cap;
}

void zsi_idle_init(zsi_idle *w, const zs_comm *c, bool polite)
{
    memset(w, 0, sizeof *w);
    w->polite = polite || zsi_oversubscribed();
    w->cap = zsi_idle_cap(c);
}

void zsi_idle_reset(zsi_idle *w)
{
    w->start = 0;
    w->calls = 0;
    w->nap = 0;
}

static void nap(double s)
{
    struct timespec ts = {0, (long)(s * 1e9)};
    nanosleep(&ts, NULL);
}

void zsi_idle_pause(zsi_idle *w)
{
    double now = zsi_now();
    if (w->calls++ == 0)
        w->start = now;
    double waited = now - w->start;
    bool napping = w->polite ? w->calls > POLITE_YIELDS : waited >= YIELD_S;
    if (!napping) {
        if (w->polite || waited >= SPIN_S)
            sched_yield();
        return;
    }
    w->nap = w->nap <= 0 ? FIRST_NAP_S : 2 * w->nap;
    if (w->nap > w->cap)
        w->nap = w->cap;
    w->naps++;
    nap(w->nap);
}
