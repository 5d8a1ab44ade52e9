/*
 * comm.c - communicators (see zs/dist.h): start and end of MPI, the world
 * and its splits, and the failure machinery every collective shares:
 * waits against a deadline, the timeout survey that names the missing
 * ranks, and the cross-rank argument agreement.
 *
 * Built with MPI (ZS_HAVE_MPI) and started by mpirun, a zs_comm wraps an
 * MPI communicator with MPI_ERRORS_RETURN, so MPI failures come back as
 * messages. Otherwise the world is one process and every collective is
 * the identity (or a copy), so the same program runs without MPI.
 *
 * The survey: a rank whose wait expired sends its rank to every other rank
 * on the communicator's private duplicate and listens, for as long as the
 * timeout again, for the same message from each. Ranks that are alive and
 * stuck in the same (or any) wait time out too and answer; a rank that is
 * dead, stopped, or busy elsewhere does not, and is named.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "parallel/internal.h"

static zs_comm world = {.rank = 0, .size = 1
#ifdef ZS_HAVE_MPI
                        , .mpi = MPI_COMM_NULL, .coll = MPI_COMM_NULL
#endif
};
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

static bool launched_by_mpirun(void)
{
    return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") ||
           getenv("PMIX_RANK");
}

/* ZS_COMM_TIMEOUT and ZS_COMM_CHECK configure the world. */
static void world_from_env(void)
{
    const char *t = getenv("ZS_COMM_TIMEOUT"), *k = getenv("ZS_COMM_CHECK");
    if (t && atof(t) > 0)
        world.timeout = atof(t);
    world.checks = k && atoi(k) != 0;
}

#ifdef ZS_HAVE_MPI
static zs_status start_mpi(int *argc, char ***argv)
{
    int provided = -1;
    if (MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
        return zs_set_error_code(ZS_ERR_IO, "dist: MPI_Init_thread failed");
    thread_level = provided;
    using_mpi = true;
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    if (provided < MPI_THREAD_FUNNELED) {
        MPI_Finalize();
        using_mpi = false;
        return zs_set_error_code(ZS_ERR_UNSUPPORTED, "dist: MPI grants thread "
                                 "level %d, below MPI_THREAD_FUNNELED", provided);
    }
    world.mpi = MPI_COMM_WORLD;
    MPI_Comm_rank(MPI_COMM_WORLD, &world.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world.size);
    if (MPI_Comm_dup(MPI_COMM_WORLD, &world.coll) != MPI_SUCCESS)
        return zs_set_error_code(ZS_ERR_IO, "dist: MPI_Comm_dup failed");
    MPI_Comm_set_errhandler(world.coll, MPI_ERRORS_RETURN);
    return ZS_OK;
}
#endif

zs_status zs_dist_init(int *argc, char ***argv)
{
    if (initialised)
        return ZS_OK;
    initialised = true;
    world_from_env();
#ifdef ZS_HAVE_MPI
    if (launched_by_mpirun())
        return start_mpi(argc, argv);
#else
    (void)argc;
    (void)argv;
    if (launched_by_mpirun())
        return zs_set_error_code(ZS_ERR_UNSUPPORTED, "dist: started by mpirun "
                                 "but Zhisuan was built without MPI "
                                 "(install libopenmpi-dev and rebuild)");
#endif
    return ZS_OK;
}

void zs_dist_finalize(void)
{
#ifdef ZS_HAVE_MPI
    if (using_mpi) {
        if (world.broken) { /* pending transfers: MPI_Finalize could hang */
            fprintf(stderr, "rank %d: %s\n", world.rank, world.why);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        if (world.coll != MPI_COMM_NULL)
            MPI_Comm_free(&world.coll);
        MPI_Finalize();
    }
    world.mpi = world.coll = MPI_COMM_NULL;
#endif
    using_mpi = false;
}

void zs_dist_abort(int code)
{
    fprintf(stderr, "rank %d: %s\n", world.rank, zs_last_error());
    fflush(stderr);
#ifdef ZS_HAVE_MPI
    if (using_mpi)
        MPI_Abort(MPI_COMM_WORLD, code);
#endif
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

bool zsi_multi(const zs_comm *c)
{
#ifdef ZS_HAVE_MPI
    return c->mpi != MPI_COMM_NULL && c->size > 1;
#else
    (void)c;
    return false;
#endif
}

double zsi_deadline(const zs_comm *c)
{
    return c->timeout > 0 ? zsi_now() + c->timeout : 0;
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
    n->size = 1;
    n->timeout = c->timeout;
    n->checks = c->checks;
#ifdef ZS_HAVE_MPI
    n->mpi = n->coll = MPI_COMM_NULL;
    if (c->mpi != MPI_COMM_NULL) {
        int rc = MPI_Comm_split(c->mpi, color < 0 ? MPI_UNDEFINED : color, key, &n->mpi);
        if (rc == MPI_SUCCESS && n->mpi != MPI_COMM_NULL)
            rc = MPI_Comm_dup(n->mpi, &n->coll);
        if (rc != MPI_SUCCESS) {
            zs_comm_free(n);
            zsi_mpi(c, "comm_split", rc);
            return NULL;
        }
        if (n->mpi != MPI_COMM_NULL) {
            MPI_Comm_set_errhandler(n->mpi, MPI_ERRORS_RETURN);
            MPI_Comm_set_errhandler(n->coll, MPI_ERRORS_RETURN);
            MPI_Comm_rank(n->mpi, &n->rank);
            MPI_Comm_size(n->mpi, &n->size);
        }
    }
#endif
    if (color < 0) {
        zs_comm_free(n);
        zs_set_error("comm_split: color %d is negative (expected >= 0)", color);
        return NULL;
    }
    (void)key;
    return n;
}

void zs_comm_free(zs_comm *c)
{
    if (!c || c == &world)
        return;
#ifdef ZS_HAVE_MPI
    /* MPI would still progress an abandoned collective on a freed
     * communicator (and crash): such a communicator is never freed. */
    if (c->coll != MPI_COMM_NULL && !c->orphans)
        MPI_Comm_free(&c->coll);
    if (c->mpi != MPI_COMM_NULL && !c->orphans)
        MPI_Comm_free(&c->mpi);
#endif
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
    if (!zs_is_contiguous(t) || t->device != ZS_CPU)
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

#ifdef ZS_HAVE_MPI
MPI_Datatype zsi_mpi_type(zs_dtype dt)
{
    switch (dt) {
    case ZS_F32: return MPI_FLOAT;
    case ZS_F64: return MPI_DOUBLE;
    case ZS_I32: return MPI_INT32_T;
    case ZS_I64: return MPI_INT64_T;
    default: return MPI_BYTE;
    }
}

zs_status zsi_mpi(zs_comm *c, const char *op, int rc)
{
    if (rc == MPI_SUCCESS)
        return ZS_OK;
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    zs_set_error_code(ZS_ERR_IO, "%s: MPI error on rank %d: %s", op,
                      c ? c->rank : -1, msg);
    return zsi_break(c, ZS_ERR_IO);
}

/* Leaves pending requests to MPI: receives are cancelled (their buffers
 * are then free), sends and collectives cannot be and keep running. */
static void abandon(zs_comm *c, int n, MPI_Request *rq)
{
    for (int i = 0; i < n; i++) {
        if (rq[i] == MPI_REQUEST_NULL)
            continue;
        int flag = 0;
        MPI_Test(&rq[i], &flag, MPI_STATUS_IGNORE);
        if (!flag) {
            rq[i] = MPI_REQUEST_NULL; /* leaked on purpose: see zs/dist.h */
            c->orphans++;
        }
    }
}

void zsi_cancel_recv(MPI_Request *rq)
{
    if (*rq == MPI_REQUEST_NULL)
        return;
    MPI_Cancel(rq);
    MPI_Wait(rq, MPI_STATUS_IGNORE);
}

/* Writes into out the ranks that do not answer the survey within
 * `grace` seconds (empty when all answer). */
static void survey(zs_comm *c, double grace, char *out, size_t cap)
{
    static int32_t token; /* outlives abandoned sends */
    int P = c->size;
    int32_t *got = calloc((size_t)P, sizeof *got);
    MPI_Request *rq = malloc(2 * (size_t)P * sizeof *rq);
    out[0] = '\0';
    if (!got || !rq) {
        free(got);
        free(rq);
        snprintf(out, cap, "(survey: out of memory)");
        return;
    }
    token = c->rank;
    for (int r = 0; r < P; r++) {
        rq[r] = rq[P + r] = MPI_REQUEST_NULL;
        if (r == c->rank)
            continue;
        MPI_Irecv(&got[r], 1, MPI_INT32_T, r, ZSI_TAG_SURVEY, c->coll, &rq[r]);
        MPI_Isend(&token, 1, MPI_INT32_T, r, ZSI_TAG_SURVEY, c->coll, &rq[P + r]);
    }
    double end = zsi_now() + grace;
    int all = 0;
    while (!all && zsi_now() < end)
        MPI_Testall(P, rq, &all, MPI_STATUSES_IGNORE);
    size_t len = 0;
    for (int r = 0; r < P; r++) {
        int flag = 1;
        if (rq[r] != MPI_REQUEST_NULL)
            MPI_Test(&rq[r], &flag, MPI_STATUS_IGNORE);
        if (flag)
            continue;
        zsi_cancel_recv(&rq[r]);
        if (len < cap)
            len += (size_t)snprintf(out + len, cap - len, "%s%d", len ? ", " : "", r);
    }
    for (int r = 0; r < P; r++)
        if (rq[P + r] != MPI_REQUEST_NULL)
            MPI_Request_free(&rq[P + r]);
    free(got);
    free(rq);
}

zs_status zsi_timeout(zs_comm *c, const char *op, int n, MPI_Request *rq, int peer,
                      bool ask)
{
    abandon(c, n, rq);
    char who[256] = "", waited[64] = "";
    if (peer >= 0)
        snprintf(waited, sizeof waited, " waiting for rank %d", peer);
    if (!ask) /* point-to-point: the peer is the one */
        zs_set_error_code(ZS_ERR_IO, "%s: rank %d timed out after %.3g s%s", op, c->rank,
                          c->timeout, waited);
    else if (survey(c, c->timeout, who, sizeof who), who[0])
        zs_set_error_code(ZS_ERR_IO, "%s: rank %d timed out after %.3g s%s; rank%s %s "
                          "did not answer", op, c->rank, c->timeout, waited,
                          strchr(who, ',') ? "s" : "", who);
    else
        zs_set_error_code(ZS_ERR_IO, "%s: rank %d timed out after %.3g s%s; every rank "
                          "answered the survey (a rank may be in another collective)",
                          op, c->rank, c->timeout, waited);
    return zsi_break(c, ZS_ERR_IO);
}

zs_status zsi_poll(zs_comm *c, const char *op, int n, MPI_Request *rq,
                   double deadline, bool *expired)
{
    *expired = false;
    if (deadline <= 0)
        return zsi_mpi(c, op, MPI_Waitall(n, rq, MPI_STATUSES_IGNORE));
    for (;;) {
        int done = 0;
        int rc = MPI_Testall(n, rq, &done, MPI_STATUSES_IGNORE);
        if (rc != MPI_SUCCESS)
            return zsi_mpi(c, op, rc);
        if (done)
            return ZS_OK;
        if (zsi_now() > deadline) {
            *expired = true;
            return ZS_OK;
        }
    }
}

zs_status zsi_wait(zs_comm *c, const char *op, int n, MPI_Request *rq,
                   double deadline, int peer)
{
    bool expired;
    zs_status st = zsi_poll(c, op, n, rq, deadline, &expired);
    if (st == ZS_OK && expired)
        st = zsi_timeout(c, op, n, rq, peer, peer < 0);
    return st;
}
#endif

/* ---- argument agreement -------------------------------------------------- */

#ifdef ZS_HAVE_MPI
static const char *op_name(int64_t id)
{
    static const char *names[] = {"?", "barrier", "broadcast", "allreduce", "reduce",
                                  "allgather", "reduce_scatter", "scatter", "gather"};
    return id >= 1 && id <= ZSI_OP_GATHER ? names[id] : "?";
}
#endif

zs_status zsi_agree(zs_comm *c, const char *op, int opid, int dtype, int64_t numel,
                    int root, zs_status local)
{
    if (!c || !c->checks || !zsi_multi(c) || c->broken)
        return local;
#ifdef ZS_HAVE_MPI
    int P = c->size;
    int64_t mine[5] = {opid, dtype, numel, root, local == ZS_OK};
    int64_t *all = malloc(5 * (size_t)P * sizeof *all);
    if (!all)
        return zs_set_error_code(ZS_ERR_NOMEM, "%s: out of memory", op);
    char keep[384];
    snprintf(keep, sizeof keep, "%s", zs_last_error());
    MPI_Request rq = MPI_REQUEST_NULL;
    zs_status st = zsi_mpi(c, op, MPI_Iallgather(mine, 5, MPI_INT64_T, all, 5, MPI_INT64_T,
                                                 c->coll, &rq));
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
    free(all);
    return st;
#else
    (void)op, (void)opid, (void)dtype, (void)numel, (void)root;
    return local;
#endif
}
