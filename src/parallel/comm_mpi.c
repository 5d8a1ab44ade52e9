/*
 * comm_mpi.c - the MPI backend (backend.h): the only file that includes
 * mpi.h or calls MPI. Built without MPI, it keeps two stubs: a program
 * started by mpirun is then refused with a message, any other runs as one
 * process.
 *
 * A communicator's state is two MPI communicators with MPI_ERRORS_RETURN
 * (failures come back as messages): `user` carries the USER channel (the
 * MPI collectives and the user's send/recv), `coll`, a duplicate, the
 * PRIVATE one (the ring, the survey, the agreement), so no message of one
 * can match a receive of the other. MPI is started with
 * MPI_THREAD_FUNNELED: only the thread that called zs_dist_init calls MPI.
 *
 * Byte-moving operations send MPI_BYTE; reductions use the matching MPI
 * type and MPI_SUM. A zsi_req holds the MPI_Request itself (no
 * allocation); all-zero bytes stand for MPI_REQUEST_NULL.
 */
#include <stdlib.h>
#include <string.h>

#include "parallel/internal.h"

static bool launched_by_mpirun(void)
{
    return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") || getenv("PMIX_RANK");
}

#ifdef ZS_HAVE_MPI
#include <mpi.h>

_Static_assert(sizeof(MPI_Request) <= sizeof(uint64_t), "an MPI_Request fits a zsi_req");

typedef struct mpi_state {
    MPI_Comm user, coll;
    bool own_user; /* false for MPI_COMM_WORLD */
} mpi_state;

static MPI_Comm chan(const zs_comm *c, zsi_chan ch)
{
    const mpi_state *s = c->impl;
    return ch == ZSI_CHAN_PRIVATE ? s->coll : s->user;
}

static MPI_Request to_mpi(zsi_req r)
{
    MPI_Request m = MPI_REQUEST_NULL;
    if (r.h)
        memcpy(&m, &r.h, sizeof m);
    return m;
}

static zsi_req from_mpi(MPI_Request m)
{
    zsi_req r = ZSI_REQ_NONE;
    if (m != MPI_REQUEST_NULL)
        memcpy(&r.h, &m, sizeof m);
    return r;
}

static MPI_Datatype mpi_type(zs_dtype dt)
{
    switch (dt) {
    case ZS_F32: return MPI_FLOAT;
    case ZS_F64: return MPI_DOUBLE;
    case ZS_I32: return MPI_INT32_T;
    case ZS_I64: return MPI_INT64_T;
    default: return MPI_BYTE;
    }
}

/* An MPI return code as a status with "op: MPI error on rank r: ..."
 * (breaks c). */
static zs_status check(zs_comm *c, const char *op, int rc)
{
    if (rc == MPI_SUCCESS)
        return ZS_OK;
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    zs_set_error_code(ZS_ERR_IO, "%s: MPI error on rank %d: %s", op, c ? c->rank : -1, msg);
    return zsi_break(c, ZS_ERR_IO);
}

/* Stores a started request (or breaks c on a failed start). */
static zs_status started(zs_comm *c, const char *op, int rc, MPI_Request m, zsi_req *rq)
{
    *rq = rc == MPI_SUCCESS ? from_mpi(m) : ZSI_REQ_NONE;
    return check(c, op, rc);
}

/* ---- communicators ------------------------------------------------------ */

static zs_status attach(zs_comm *n, MPI_Comm user, bool own)
{
    mpi_state *s = calloc(1, sizeof *s);
    if (!s)
        return zs_set_error_code(ZS_ERR_NOMEM, "comm: out of memory");
    s->user = user;
    s->own_user = own;
    s->coll = MPI_COMM_NULL;
    if (MPI_Comm_dup(user, &s->coll) != MPI_SUCCESS) {
        free(s);
        return zs_set_error_code(ZS_ERR_IO, "comm: MPI_Comm_dup failed");
    }
    MPI_Comm_set_errhandler(user, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(s->coll, MPI_ERRORS_RETURN);
    MPI_Comm_rank(user, &n->rank);
    MPI_Comm_size(user, &n->size);
    n->be = &zsi_backend_mpi;
    n->impl = s;
    return ZS_OK;
}

static zs_status mpi_split(zs_comm *c, int color, int key, zs_comm *n)
{
    MPI_Comm nc = MPI_COMM_NULL;
    int rc = MPI_Comm_split(chan(c, ZSI_CHAN_USER), color < 0 ? MPI_UNDEFINED : color, key,
                            &nc);
    if (rc != MPI_SUCCESS)
        return check(c, "comm_split", rc);
    if (nc == MPI_COMM_NULL)
        return ZS_OK;
    zs_status st = attach(n, nc, true);
    if (st != ZS_OK)
        MPI_Comm_free(&nc);
    return st;
}

static void mpi_free(zs_comm *c)
{
    mpi_state *s = c->impl;
    if (!s)
        return;
    /* MPI would still progress an abandoned transfer on a freed
     * communicator (and crash): such a communicator is never freed. */
    if (!c->orphans) {
        if (s->coll != MPI_COMM_NULL)
            MPI_Comm_free(&s->coll);
        if (s->own_user && s->user != MPI_COMM_NULL)
            MPI_Comm_free(&s->user);
    }
    free(s);
    c->impl = NULL;
}

static void mpi_abort(zs_comm *c, int code)
{
    (void)c;
    MPI_Abort(MPI_COMM_WORLD, code);
}

/* ---- collectives --------------------------------------------------------- */

static zs_status mpi_ibarrier(zs_comm *c, const char *op, zsi_req *rq)
{
    MPI_Request m = MPI_REQUEST_NULL;
    int rc = MPI_Ibarrier(chan(c, ZSI_CHAN_USER), &m);
    return started(c, op, rc, m, rq);
}

static zs_status mpi_ibroadcast(zs_comm *c, const char *op, void *buf, int64_t bytes,
                                int root, zsi_req *rq)
{
    MPI_Request m = MPI_REQUEST_NULL;
    int rc = MPI_Ibcast(buf, (int)bytes, MPI_BYTE, root, chan(c, ZSI_CHAN_USER), &m);
    return started(c, op, rc, m, rq);
}

static zs_status mpi_iallreduce(zs_comm *c, const char *op, void *buf, int64_t n,
                                zs_dtype dt, zsi_req *rq)
{
    MPI_Request m = MPI_REQUEST_NULL;
    int rc = MPI_Iallreduce(MPI_IN_PLACE, buf, (int)n, mpi_type(dt), MPI_SUM,
                            chan(c, ZSI_CHAN_USER), &m);
    return started(c, op, rc, m, rq);
}

static zs_status mpi_ireduce(zs_comm *c, const char *op, void *buf, int64_t n, zs_dtype dt,
                             int root, zsi_req *rq)
{
    MPI_Request m = MPI_REQUEST_NULL;
    int rc = MPI_Ireduce(c->rank == root ? MPI_IN_PLACE : buf, buf, (int)n, mpi_type(dt),
                         MPI_SUM, root, chan(c, ZSI_CHAN_USER), &m);
    return started(c, op, rc, m, rq);
}

static zs_status mpi_iallgather(zs_comm *c, const char *op, zsi_chan ch, const void *in,
                                void *out, int64_t bytes, zsi_req *rq)
{
    MPI_Request m = MPI_REQUEST_NULL;
    int rc = MPI_Iallgather(in, (int)bytes, MPI_BYTE, out, (int)bytes, MPI_BYTE,
                            chan(c, ch), &m);
    return started(c, op, rc, m, rq);
}

static zs_status mpi_ireduce_scatter(zs_comm *c, const char *op, const void *in, void *out,
                                     int64_t n, zs_dtype dt, zsi_req *rq)
{
    MPI_Request m = MPI_REQUEST_NULL;
    int rc = MPI_Ireduce_scatter_block(in, out, (int)n, mpi_type(dt), MPI_SUM,
                                       chan(c, ZSI_CHAN_USER), &m);
    return started(c, op, rc, m, rq);
}

static zs_status mpi_iscatter(zs_comm *c, const char *op, const void *in, void *out,
                              int64_t bytes, int root, zsi_req *rq)
{
    MPI_Request m = MPI_REQUEST_NULL;
    int rc = MPI_Iscatter(in, (int)bytes, MPI_BYTE, out, (int)bytes, MPI_BYTE, root,
                          chan(c, ZSI_CHAN_USER), &m);
    return started(c, op, rc, m, rq);
}

static zs_status mpi_igather(zs_comm *c, const char *op, const void *in, void *out,
                             int64_t bytes, int root, zsi_req *rq)
{
    MPI_Request m = MPI_REQUEST_NULL;
    int rc = MPI_Igather(in, (int)bytes, MPI_BYTE, out, (int)bytes, MPI_BYTE, root,
                         chan(c, ZSI_CHAN_USER), &m);
    return started(c, op, rc, m, rq);
}

/* ---- point-to-point ---------------------------------------------------- */

static zs_status mpi_isend(zs_comm *c, const char *op, zsi_chan ch, const void *buf,
                           int64_t bytes, int dst, int tag, zsi_req *rq)
{
    MPI_Request m = MPI_REQUEST_NULL;
    int rc = MPI_Isend(buf, (int)bytes, MPI_BYTE, dst, tag, chan(c, ch), &m);
    return started(c, op, rc, m, rq);
}

static zs_status mpi_irecv(zs_comm *c, const char *op, zsi_chan ch, void *buf,
                           int64_t bytes, int src, int tag, zsi_req *rq)
{
    MPI_Request m = MPI_REQUEST_NULL;
    int rc = MPI_Irecv(buf, (int)bytes, MPI_BYTE, src == ZS_ANY_SOURCE ? MPI_ANY_SOURCE : src,
                       tag, chan(c, ch), &m);
    return started(c, op, rc, m, rq);
}

/* ---- completion ------------------------------------------------------------ */

/* One request finished with rc and status ms: a truncated receive is
 * reported through info (c stays usable), other errors break c. */
static zs_status finished_one(zs_comm *c, const char *op, int rc, MPI_Status *ms,
                              zsi_recv_info *info)
{
    if (rc != MPI_SUCCESS) {
        int cls = MPI_SUCCESS;
        MPI_Error_class(rc, &cls);
        if (cls == MPI_ERR_TRUNCATE && info) {
            info->source = ms->MPI_SOURCE;
            info->truncated = true;
            return ZS_OK;
        }
        return check(c, op, rc);
    }
    if (info) {
        int got = 0;
        MPI_Get_count(ms, MPI_BYTE, &got);
        info->source = ms->MPI_SOURCE;
        info->bytes = got;
        info->truncated = false;
    }
    return ZS_OK;
}

/* The n requests as MPI handles in m (stack space for a few). */
static MPI_Request *handles(int n, const zsi_req *rq, MPI_Request *few, int nfew)
{
    MPI_Request *m = n <= nfew ? few : malloc((size_t)n * sizeof *m);
    for (int i = 0; m && i < n; i++)
        m[i] = to_mpi(rq[i]);
    return m;
}

static void store(int n, zsi_req *rq, const MPI_Request *m)
{
    for (int i = 0; i < n; i++)
        rq[i] = from_mpi(m[i]);
}

static zs_status mpi_test(zs_comm *c, const char *op, int n, zsi_req *rq, bool *done,
                          zsi_recv_info *info)
{
    if (n == 1) {
        MPI_Request m = to_mpi(rq[0]);
        MPI_Status ms;
        int flag = 0;
        int rc = MPI_Test(&m, &flag, &ms);
        *done = flag || rc != MPI_SUCCESS;
        rq[0] = from_mpi(m);
        return *done ? finished_one(c, op, rc, &ms, info) : ZS_OK;
    }
    MPI_Request few[8], *m = handles(n, rq, few, 8);
    if (!m)
        return zs_set_error_code(ZS_ERR_NOMEM, "%s: out of memory", op);
    int flag = 0;
    int rc = MPI_Testall(n, m, &flag, MPI_STATUSES_IGNORE);
    store(n, rq, m);
    if (m != few)
        free(m);
    *done = flag != 0;
    return check(c, op, rc);
}

static zs_status mpi_wait(zs_comm *c, const char *op, int n, zsi_req *rq,
                          zsi_recv_info *info)
{
    if (n == 1) {
        MPI_Request m = to_mpi(rq[0]);
        MPI_Status ms;
        int rc = MPI_Wait(&m, &ms);
        rq[0] = from_mpi(m);
        return finished_one(c, op, rc, &ms, info);
    }
    MPI_Request few[8], *m = handles(n, rq, few, 8);
    if (!m)
        return zs_set_error_code(ZS_ERR_NOMEM, "%s: out of memory", op);
    int rc = MPI_Waitall(n, m, MPI_STATUSES_IGNORE);
    store(n, rq, m);
    if (m != few)
        free(m);
    return check(c, op, rc);
}

static void mpi_cancel_recv(zs_comm *c, zsi_req *rq)
{
    (void)c;
    MPI_Request m = to_mpi(*rq);
    if (m == MPI_REQUEST_NULL)
        return;
    MPI_Cancel(&m);
    MPI_Wait(&m, MPI_STATUS_IGNORE);
    *rq = ZSI_REQ_NONE;
}

const zsi_comm_backend zsi_backend_mpi = {
    .name = "mpi",
    .split = mpi_split,
    .free = mpi_free,
    .abort = mpi_abort,
    .ibarrier = mpi_ibarrier,
    .ibroadcast = mpi_ibroadcast,
    .iallreduce = mpi_iallreduce,
    .ireduce = mpi_ireduce,
    .iallgather = mpi_iallgather,
    .ireduce_scatter = mpi_ireduce_scatter,
    .iscatter = mpi_iscatter,
    .igather = mpi_igather,
    .isend = mpi_isend,
    .irecv = mpi_irecv,
    .test = mpi_test,
    .wait = mpi_wait,
    .cancel_recv = mpi_cancel_recv,
};

/* ---- the process ------------------------------------------------------------ */

zs_status zsi_mpi_start(int *argc, char ***argv, zs_comm *world, bool *started_,
                        int *thread_level)
{
    *started_ = false;
    if (!launched_by_mpirun())
        return ZS_OK;
    int provided = -1;
    if (MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
        return zs_set_error_code(ZS_ERR_IO, "dist: MPI_Init_thread failed");
    *thread_level = provided;
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    if (provided < MPI_THREAD_FUNNELED) {
        MPI_Finalize();
        return zs_set_error_code(ZS_ERR_UNSUPPORTED, "dist: MPI grants thread "
                                 "level %d, below MPI_THREAD_FUNNELED", provided);
    }
    *started_ = true;
    return attach(world, MPI_COMM_WORLD, false);
}

void zsi_mpi_finalize(zs_comm *world)
{
    if (world->be == &zsi_backend_mpi)
        mpi_free(world);
    world->be = &zsi_backend_self;
    MPI_Finalize();
}

#else /* built without MPI */

zs_status zsi_mpi_start(int *argc, char ***argv, zs_comm *world, bool *started,
                        int *thread_level)
{
    (void)argc, (void)argv, (void)world, (void)thread_level;
    *started = false;
    if (launched_by_mpirun())
        return zs_set_error_code(ZS_ERR_UNSUPPORTED, "dist: started by mpirun "
                                 "but Zhisuan was built without MPI "
                                 "(install libopenmpi-dev and rebuild)");
    return ZS_OK;
}

void zsi_mpi_finalize(zs_comm *world) { (void)world; }

#endif
