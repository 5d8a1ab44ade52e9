/*
 * test_idle.c - how waiting ranks spend the time between polls
 * (src/parallel/idle.c, used by zsi_poll in comm.c): the oversubscription
 * decision from the launcher's environment, the nap schedule (spin, yield,
 * naps doubling to the cap, the cap at most 1/100 of the timeout), and
 * zsi_poll on a fake backend whose transfer finishes after a while: a
 * polite wait (oversubscribed) polls a few hundred times where a spinning
 * one polls hundreds of thousands; a wait that expires still expires (its
 * naps stay under timeout / 100, far from the stall bound of timeout / 2:
 * the schedule's test). Counts of polls are asserted, never times.
 */
#include <stdlib.h>
#include <time.h>

#include "parallel/internal.h"
#include "testutil.h"

static void unset_all(void)
{
    unsetenv("ZS_COMM_IDLE");
    unsetenv("OMPI_MCA_mpi_yield_when_idle");
    unsetenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    unsetenv("MPI_LOCALNRANKS");
    unsetenv("PMI_LOCAL_SIZE");
    unsetenv("MV2_COMM_WORLD_LOCAL_SIZE");
}

static void test_detect(void)
{
    unset_all();
    ZT_CHECK(!zsi_idle_detect(), "no launcher: not oversubscribed");
    setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "1", 1);
    ZT_CHECK(!zsi_idle_detect(), "1 local rank: not oversubscribed");
    setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "100000", 1);
    ZT_CHECK(zsi_idle_detect(), "100000 local ranks: oversubscribed");
    setenv("ZS_COMM_IDLE", "spin", 1);
    ZT_CHECK(!zsi_idle_detect(), "ZS_COMM_IDLE=spin overrides");
    unset_all();
    setenv("MPI_LOCALNRANKS", "100000", 1); /* MPICH's hydra */
    ZT_CHECK(zsi_idle_detect(), "MPI_LOCALNRANKS=100000: oversubscribed");
    unset_all();
    setenv("OMPI_MCA_mpi_yield_when_idle", "true", 1);
    ZT_CHECK(zsi_idle_detect(), "mpi_yield_when_idle=true asks for yielding");
    setenv("OMPI_MCA_mpi_yield_when_idle", "0", 1);
    ZT_CHECK(!zsi_idle_detect(), "mpi_yield_when_idle=0");
    unset_all();
    setenv("ZS_COMM_IDLE", "polite", 1);
    ZT_CHECK(zsi_idle_detect(), "ZS_COMM_IDLE=polite");
    unset_all();
    zt_section("oversubscription from the launcher's environment");
}

static void test_schedule(void)
{
    zs_comm c = {.be = &zsi_backend_self, .size = 2};
    ZT_CHECK(zsi_idle_cap(&c) == 200e-6, "no timeout: cap 200 us, got %g", zsi_idle_cap(&c));
    c.timeout = 5e-3;
    ZT_CHECK(zsi_idle_cap(&c) == 5e-5, "timeout 5 ms: cap 50 us, got %g", zsi_idle_cap(&c));
    ZT_CHECK(zsi_idle_cap(NULL) == 200e-6, "no communicator: cap 200 us");

    zsi_idle w;
    zsi_idle_init(&w, &c, true);
    ZT_CHECK(w.polite, "polite asked");
    for (int i = 0; i < 2; i++)
        zsi_idle_pause(&w);
    ZT_CHECK(w.naps == 0, "polite: two yields before the first nap, got %d naps", w.naps);
    double last = 0;
    bool doubling = true;
    for (int i = 0; i < 10; i++) {
        zsi_idle_pause(&w);
        if (w.nap < last || (w.nap < w.cap && last > 0 && w.nap != 2 * last))
            doubling = false;
        last = w.nap;
    }
    ZT_CHECK(w.naps == 10 && doubling && w.nap == w.cap,
             "naps double to the cap: %d naps, last %g s, cap %g s", w.naps, w.nap, w.cap);
    zsi_idle_reset(&w);
    zsi_idle_pause(&w);
    ZT_CHECK(w.calls == 1 && w.nap == 0 && w.naps == 10, "reset: back to the yields");

    /* Not polite: no nap within the first millisecond of a wait. */
    c.timeout = 0;
    zsi_idle_init(&w, &c, false);
    if (!zsi_oversubscribed()) {
        for (int i = 0; i < 20; i++)
            zsi_idle_pause(&w);
        ZT_CHECK(w.naps == 0 || zsi_now() - w.start >= 1e-3,
                 "spin and yield first: %d naps after %g s", w.naps, zsi_now() - w.start);
        while (zsi_now() - w.start < 2e-3)
            zsi_idle_pause(&w);
        zsi_idle_pause(&w);
        ZT_CHECK(w.naps > 0, "naps once the wait is 1 ms old");
    }
    zt_section("pause schedule: yields, naps doubling to min(200 us, timeout / 100)");
}

/* A fake transport: the transfer is done `after` seconds after it starts;
 * test() counts its calls. */
static double done_at;
static long tests;

static zs_status fake_test(zs_comm *c, const char *op, int n, zsi_req *rq, bool *done,
                           zsi_recv_info *info)
{
    tests++;
    *done = zsi_now() >= done_at;
    if (*done)
        rq[0] = ZSI_REQ_NONE;
    return ZS_OK;
}

static zs_status fake_wait(zs_comm *c, const char *op, int n, zsi_req *rq,
                           zsi_recv_info *info)
{
    while (zsi_now() < done_at) {
    }
    rq[0] = ZSI_REQ_NONE;
    return ZS_OK;
}

static const zsi_comm_backend fake = {.name = "fake", .test = fake_test, .wait = fake_wait};

/* zsi_poll of one transfer finishing in `after` s on a communicator with
 * `timeout`; returns the polls made, *expired as zsi_poll says. */
static long poll_for(double after, double timeout, bool *expired)
{
    zs_comm c = {.be = &fake, .size = 2, .timeout = timeout};
    zsi_req rq = {1};
    tests = 0;
    done_at = zsi_now() + after;
    double dl = zsi_deadline(&c);
    zs_status st = zsi_poll(&c, "fake", 1, &rq, dl, expired);
    ZT_CHECK(st == ZS_OK, "zsi_poll returned %d", (int)st);
    ZT_CHECK(*expired || !zsi_req_pending(rq), "done or expired");
    return tests;
}

static void test_poll(void)
{
    bool expired = false;
    bool polite = zsi_oversubscribed();
    /* 50 ms of waiting: naps of <= 200 us (plus the timer's slack) make at
     * most ~250 polls, a spin would make 10^5 and more even on a loaded
     * machine; not oversubscribed, the first millisecond spins and
     * yields (a few thousand polls). */
    long n = poll_for(0.05, 10, &expired);
    long bound = polite ? 2000 : 40000;
    ZT_CHECK(!expired && n < bound, "50 ms wait: %ld polls (bound %ld, %s)", n, bound,
             polite ? "oversubscribed" : "spin first");
    printf("  50 ms wait (%s): %ld polls\n", polite ? "oversubscribed" : "not oversubscribed",
           n);
    /* The deadline passes first: expired. */
    n = poll_for(10, 0.03, &expired);
    ZT_CHECK(expired, "a wait past its 30 ms deadline expires (%ld polls)", n);
    /* Done at once: one poll. */
    n = poll_for(-1, 10, &expired);
    ZT_CHECK(!expired && n == 1, "a finished transfer: %ld polls", n);
    zt_section("zsi_poll on a slow transport: done, expired, polls counted");
}

int main(void)
{
    /* ctest runs this plainly and as test_idle_polite (ZS_COMM_IDLE=polite:
     * the oversubscribed schedule); test_detect changes the environment
     * before zsi_oversubscribed first reads it, so it is put back. */
    const char *mode = getenv("ZS_COMM_IDLE");
    char keep[32] = "";
    if (mode)
        snprintf(keep, sizeof keep, "%s", mode);
    test_detect();
    if (keep[0])
        setenv("ZS_COMM_IDLE", keep, 1);
    printf("  this run: %s\n", zsi_oversubscribed() ? "oversubscribed (polite waits)"
                                                    : "not oversubscribed (spin first)");
    test_schedule();
    test_poll();
    return zt_done();
}
