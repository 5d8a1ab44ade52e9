/*
 * comm.c - communicators (see zs/dist.h): start and end of the process's
 * transport, the world and its splits, and the failure machinery every
 * collective shares whatever the backend (backend.h): waits against a
 * deadline, the timeout survey that names the missing ranks, and the
 * cross-rank argument agreement.
 *
 * Started by mpirun (and built with MPI), every communicator is an MPI one
 * (comm_mpi.c); otherwise the world is one process (comm_self.c) and every
 * collective is the identity or a copy, so the same program runs without
 * MPI.
 *
 * The survey: a rank whose wait expired sends its rank to every other rank
 * on the communicator's PRIVATE channel and listens, for as long as the
 * timeout again, for the same message from each. Ranks that are alive and
 * stuck in the same (or any) wait time out too and answer; a rank that is
 * dead, stopped, or busy elsewhere does not, and is named.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "parallel/internal.h"

static zs_comm world = {.be = &zsi_backend_self, .rank = 0, .size = 1};
static bool initialised, using_mpi;
static int thread_level = -1;

double zsi_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

bool zs_dist_is_mpi(void) { return using_mpi; }
int zs_dist_thread_level(void) { return thread_level; }

/* ZS_COMM_TIMEOUT and ZS_COMM_CHECK configure the world. */
static void world_from_env(void)
{
    const char *t = getenv("ZS_COMM_TIMEOUT"), *k = getenv("ZS_COMM_CHECK");
    if (t && atof(t) > 0)
        world.timeout = atof(t);
    world.checks = k && atoi(k) != 0;
}

zs_status zs_dist_init(int *argc, char ***argv)
{
    if (initialised)
        return ZS_OK;
    initialised = true;
    world_from_env();
    return zsi_mpi_start(argc, argv, &world, &using_mpi, &thread_level);
}

void zs_dist_finalize(void)
{
    if (using_mpi) {
        if (world.broken) { /* pending transfers: MPI_Finalize could hang */
            fprintf(stderr, "rank %d: %s\n", world.rank, world.why);
            world.be->abort(&world, 1);
        }
        zsi_mpi_finalize(&world);
    }
    using_mpi = false;
}

void zs_dist_abort(int code)
{
    fprintf(stderr, "rank %d: %s\n", world.rank, zs_last_error());
    fflush(stderr);
    world.be->abort(&world, code);
    exit(code);
}

zs_comm *zs_comm_world(void)
{
    if (!initialised)
        zs_dist_init(NULL, NULL);
    return &world;
}

int zs_comm_rank(const zs_comm *c) { return c ? c->rank : -1; }
int zs_comm_size(const zs_comm *c) { return c ? c->size : 0; }
void zs_comm_set_timeout(zs_comm *c, double s) { if (c) c->timeout = s > 0 ? s : 0; }
double zs_comm_timeout(const zs_comm *c) { return c ? c->timeout : 0; }
void zs_comm_set_checks(zs_comm *c, bool on) { if (c) c->checks = on; }
bool zs_comm_is_broken(const zs_comm *c) { return c && c->broken; }

bool zsi_multi(const zs_comm *c) { return c->size > 1; }

double zsi_deadline(zs_comm *c)
{
    c->check_at = zsi_now();
    c->stalled = 0;
    return c->timeout > 0 ? c->check_at + c->timeout : 0;
}

bool zsi_expired(zs_comm *c, double dl)
{
    double now = zsi_now();
    if (now - c->check_at > c->stalled)
        c->stalled = now - c->check_at;
    c->check_at = now;
    return dl > 0 && now > dl;
}

zs_comm *zs_comm_split(zs_comm *c, int color, int key)
{
    if (zsi_check_comm("comm_split", c) != ZS_OK)
        return NULL;
    zs_comm *n = calloc(1, sizeof *n);
    if (!n) {
        zs_set_error_code(ZS_ERR_NOMEM, "comm_split: out of memory");
        return NULL;
    }
    n->be = &zsi_backend_self;
    n->size = 1;
    n->timeout = c->timeout;
    n->checks = c->checks;
    if (c->be->split(c, color, key, n) != ZS_OK) { /* collective: every rank takes part */
        zs_comm_free(n);
        return NULL;
    }
    if (color < 0) {
        zs_comm_free(n);
        zs_set_error("comm_split: color %d is negative (expected >= 0)", color);
        return NULL;
    }
    return n;
}

void zs_comm_free(zs_comm *c)
{
    if (!c || c == &world)
        return;
    c->be->free(c);
    free(c);
}

/* ---- shared checks and helpers ------------------------------------------- */

zs_status zsi_check_comm(const char *op, const zs_comm *c)
{
    if (!c)
        return zs_set_error("%s: NULL communicator", op);
    if (c->broken)
        return zs_set_error_code(ZS_ERR_STATE, "%s: communicator unusable after an "
                                 "earlier failure: %s", op, c->why);
    return ZS_OK;
}

zs_status zsi_check_tensor(const char *op, const zs_tensor *t, bool sum)
{
    if (!t)
        return zs_set_error("%s: NULL tensor", op);
    if (t->device != ZS_CPU)
        return zs_set_error("%s: the tensor is on %s: the collectives take host "
                            "tensors (no device transport yet; copy it with "
                            "zs_to_device)", op, zs_device_name(t->device));
    if (!zs_is_contiguous(t))
        return zs_set_error("%s: tensor must be contiguous and on the CPU", op);
    if (sum && t->dtype != ZS_F32 && t->dtype != ZS_F64 &&
        t->dtype != ZS_I32 && t->dtype != ZS_I64)
        return zs_set_error("%s: cannot sum dtype %s (expected f32, f64, i32 "
                            "or i64)", op, zs_dtype_name(t->dtype));
    if (zs_nbytes(t) > (size_t)0x7fffffff)
        return zs_set_error("%s: %zu bytes is more than one MPI message carries "
                            "(2^31 - 1); split the tensor", op, zs_nbytes(t));
    return ZS_OK;
}

zs_status zsi_break(zs_comm *c, zs_status st)
{
    if (c && !c->broken) {
        c->broken = true;
        snprintf(c->why, sizeof c->why, "%s", zs_last_error());
    }
    return st;
}

void zsi_add_into(zs_dtype dt, void *dst, const void *src, int64_t n)
{
    switch (dt) {
    case ZS_F32: {
        float *d = dst;
        const float *s = src;
        for (int64_t i = 0; i < n; i++)
            d[i] += s[i];
        break;
    }
    case ZS_F64: {
        double *d = dst;
        const double *s = src;
        for (int64_t i = 0; i < n; i++)
            d[i] += s[i];
        break;
    }
    case ZS_I32: {
        int32_t *d = dst;
        const int32_t *s = src;
        for (int64_t i = 0; i < n; i++)
            d[i] = (int32_t)((uint32_t)d[i] + (uint32_t)s[i]); /* wraps like MPI */
        break;
    }
    default: {
        int64_t *d = dst;
        const int64_t *s = src;
        for (int64_t i = 0; i < n; i++)
            d[i] = (int64_t)((uint64_t)d[i] + (uint64_t)s[i]);
        break;
    }
    }
}

void zsi_scale(zs_tensor *t, double s)
{
    int64_t n = zs_numel(t);
    if (t->dtype == ZS_F32) {
        float *d = zs_data(t), f = (float)s;
        for (int64_t i = 0; i < n; i++)
            d[i] *= f;
    } else if (t->dtype == ZS_F64) {
        double *d = zs_data(t);
        for (int64_t i = 0; i < n; i++)
            d[i] *= s;
    }
}

/* ---- waits, timeouts and the survey ----------------------------------------- */

/* Leaves pending requests to the backend: those not finished are dropped
 * (never freed, counted in c->orphans: see zs/dist.h); a receive should
 * be cancelled first. */
static void abandon(zs_comm *c, int n, zsi_req *rq)
{
    for (int i = 0; i < n; i++) {
        if (!zsi_req_pending(rq[i]))
            continue;
        bool done = false;
        c->be->test(c, "abandon", 1, &rq[i], &done, NULL);
        if (!done) {
            rq[i] = ZSI_REQ_NONE; /* leaked on purpose */
            c->orphans++;
        }
    }
}

/* Writes into out the ranks that do not answer the survey within
 * `grace` seconds (empty when all answer). */
static void survey(zs_comm *c, double grace, char *out, size_t cap)
{
    static int32_t token; /* outlives abandoned sends */
    int P = c->size;
    int32_t *got = calloc((size_t)P, sizeof *got);
    zsi_req *rq = calloc(2 * (size_t)P, sizeof *rq); /* receives, then sends */
    out[0] = '\0';
    if (!got || !rq) {
        free(got);
        free(rq);
        snprintf(out, cap, "(survey: out of memory)");
        return;
    }
    const char *op = "survey";
    token = c->rank;
    for (int r = 0; r < P; r++) {
        if (r == c->rank)
            continue;
        c->be->irecv(c, op, ZSI_CHAN_PRIVATE, &got[r], sizeof *got, r, ZSI_TAG_SURVEY, &rq[r]);
        c->be->isend(c, op, ZSI_CHAN_PRIVATE, &token, sizeof token, r, ZSI_TAG_SURVEY,
                     &rq[P + r]);
    }
    double end = zsi_now() + grace;
    bool all = false;
    zsi_idle w;
    zsi_idle_init(&w, c, false);
    while (zsi_now() < end) {
        if (c->be->test(c, op, 2 * P, rq, &all, NULL) != ZS_OK || all)
            break;
        zsi_idle_pause(&w);
    }
    size_t len = 0;
    for (int r = 0; r < P; r++) {
        bool done = true;
        if (zsi_req_pending(rq[r]))
            c->be->test(c, op, 1, &rq[r], &done, NULL);
        if (done)
            continue;
        c->be->cancel_recv(c, &rq[r]);
        if (len < cap)
            len += (size_t)snprintf(out + len, cap - len, "%s%d", len ? ", " : "", r);
    }
    abandon(c, P, rq + P);
    free(got);
    free(rq);
}

zs_status zsi_timeout(zs_comm *c, const char *op, int n, zsi_req *rq, int peer, bool ask)
{
    abandon(c, n, rq);
    char who[256] = "", waited[64] = "";
    if (peer >= 0)
        snprintf(waited, sizeof waited, " waiting for rank %d", peer);
    /* A rank stopped (SIGSTOP) or starved through much of its own wait:
     * its peers may have given up long ago, and the survey's answers may
     * be old ones; say so beside them. */
    char stall[128] = "";
    if (c->stalled > 0.5 * c->timeout)
        snprintf(stall, sizeof stall, "; this rank itself did not run for %.3g s of "
                 "the wait (stopped, or starved of CPU)", c->stalled);
    if (!ask) /* point-to-point: the peer is the one */
        zs_set_error_code(ZS_ERR_IO, "%s: rank %d timed out after %.3g s%s%s", op, c->rank,
                          c->timeout, waited, stall);
    else if (survey(c, c->timeout, who, sizeof who), who[0])
        zs_set_error_code(ZS_ERR_IO, "%s: rank %d timed out after %.3g s%s; rank%s %s "
                          "did not answer%s", op, c->rank, c->timeout, waited,
                          strchr(who, ',') ? "s" : "", who, stall);
    else
        zs_set_error_code(ZS_ERR_IO, "%s: rank %d timed out after %.3g s%s; every rank "
                          "answered the survey (a rank may be in another collective)%s",
                          op, c->rank, c->timeout, waited, stall);
    return zsi_break(c, ZS_ERR_IO);
}

zs_status zsi_poll(zs_comm *c, const char *op, int n, zsi_req *rq, double deadline,
                   bool *expired)
{
    *expired = false;
    if (deadline <= 0 && !zsi_oversubscribed())
        return c->be->wait(c, op, n, rq, NULL); /* the backend's own wait */
    zsi_idle w;
    zsi_idle_init(&w, c, false);
    for (;;) {
        bool done = false;
        zs_status st = c->be->test(c, op, n, rq, &done, NULL);
        if (st != ZS_OK || done)
            return st;
        if (deadline > 0 && zsi_expired(c, deadline)) {
            *expired = true;
            return ZS_OK;
        }
        zsi_idle_pause(&w);
    }
}

zs_status zsi_wait(zs_comm *c, const char *op, int n, zsi_req *rq, double deadline,
                   int peer)
{
    bool expired;
    zs_status st = zsi_poll(c, op, n, rq, deadline, &expired);
    if (st == ZS_OK && expired)
        st = zsi_timeout(c, op, n, rq, peer, peer < 0);
    return st;
}

/* ---- argument agreement -------------------------------------------------- */

static const char *op_name(int64_t id)
{
    static const char *names[] = {"?", "barrier", "broadcast", "allreduce", "reduce",
                                  "allgather", "reduce_scatter", "scatter", "gather"};
    return id >= 1 && id <= ZSI_OP_GATHER ? names[id] : "?";
}

zs_status zsi_agree(zs_comm *c, const char *op, int opid, int dtype, int64_t numel,
                    int root, zs_status local)
{
    if (!c || !c->checks || !zsi_multi(c) || c->broken)
        return local;
    int P = c->size;
    int64_t *all = malloc(5 * (size_t)(P + 1) * sizeof *all), *mine = all + 5 * P;
    if (!all)
        return zs_set_error_code(ZS_ERR_NOMEM, "%s: out of memory", op);
    memcpy(mine, (int64_t[5]){opid, dtype, numel, root, local == ZS_OK}, 5 * sizeof *mine);
    char keep[384];
    snprintf(keep, sizeof keep, "%s", zs_last_error());
    zsi_req rq = ZSI_REQ_NONE;
    zs_status st = c->be->iallgather(c, op, ZSI_CHAN_PRIVATE, mine, all, 5 * sizeof *mine, &rq);
    if (st == ZS_OK)
        st = zsi_wait(c, op, 1, &rq, zsi_deadline(c), -1);
    for (int r = 0; st == ZS_OK && r < P; r++) {
        const int64_t *o = all + 5 * r;
        if (local != ZS_OK) {
            st = zs_set_error_code(local, "%s", keep);
        } else if (!o[4]) {
            st = zs_set_error("%s: rank %d rejected its arguments to %s", op, r,
                              op_name(o[0]));
        } else if (memcmp(o, mine, 4 * sizeof *o) != 0) {
            st = zs_set_error("%s: rank %d called %s(%lld %s, %lld) but rank %d called "
                              "%s(%lld %s, %lld) (element count, dtype, root or algorithm)", op,
                              r, op_name(o[0]), (long long)o[2],
                              o[1] >= 0 && o[1] < ZS_DTYPE_COUNT ? zs_dtype_name((zs_dtype)o[1]) : "?",
                              (long long)o[3], c->rank, op_name(opid), (long long)numel,
                              dtype >= 0 && dtype < ZS_DTYPE_COUNT ? zs_dtype_name((zs_dtype)dtype) : "?",
                              (long long)root);
        }
    }
    if (!c->broken) /* else the backend may still use it: kept */
        free(all);
    return st;
}
