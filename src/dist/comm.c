/*
 * comm.c - communicators and collectives on tensors (see zs/dist.h).
 *
 * Built with MPI (ZS_HAVE_MPI) and started by mpirun, a zs_comm wraps an
 * MPI communicator with MPI_ERRORS_RETURN, so MPI failures come back as
 * messages. Otherwise the world is one process and every collective is
 * the identity (or a copy), so the same program runs without MPI.
 *
 * The ring all-reduce (ZS_ALLREDUCE_RING) cuts the tensor into `size`
 * chunks; in size-1 steps of reduce-scatter each rank sends one chunk to
 * its right neighbour and adds the chunk received from its left, so rank r
 * ends up owning the full sum of chunk r+1; size-1 all-gather steps then
 * pass the finished chunks around. Each rank sends 2(size-1)/size of the
 * tensor: the bandwidth-optimal volume that bench/collectives compares
 * with MPI's own all-reduce.
 */
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "zs/dist.h"

#ifdef ZS_HAVE_MPI
#include <mpi.h>
#endif

struct zs_comm {
    int rank, size;
#ifdef ZS_HAVE_MPI
    MPI_Comm mpi; /* MPI_COMM_NULL for the single-process world */
#endif
};

static zs_comm world = {0, 1
#ifdef ZS_HAVE_MPI
                        , MPI_COMM_NULL
#endif
};
static bool initialised, using_mpi;

bool zs_dist_is_mpi(void) { return using_mpi; }

static bool launched_by_mpirun(void)
{
    return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") ||
           getenv("PMIX_RANK");
}

zs_status zs_dist_init(int *argc, char ***argv)
{
    if (initialised)
        return ZS_OK;
    initialised = true;
#ifdef ZS_HAVE_MPI
    if (launched_by_mpirun()) {
        int provided;
        if (MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
            return zs_set_error_code(ZS_ERR_IO, "dist: MPI_Init failed");
        using_mpi = true;
        world.mpi = MPI_COMM_WORLD;
        MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
        MPI_Comm_rank(MPI_COMM_WORLD, &world.rank);
        MPI_Comm_size(MPI_COMM_WORLD, &world.size);
    }
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
    if (using_mpi)
        MPI_Finalize();
#endif
    using_mpi = false;
    initialised = false;
}

zs_comm *zs_comm_world(void) { return &world; }
int zs_comm_rank(const zs_comm *c) { return c ? c->rank : -1; }
int zs_comm_size(const zs_comm *c) { return c ? c->size : 0; }

zs_comm *zs_comm_split(zs_comm *c, int color, int key)
{
    if (!c) {
        zs_set_error("comm_split: NULL communicator");
        return NULL;
    }
    zs_comm *n = calloc(1, sizeof *n);
    if (!n) {
        zs_set_error_code(ZS_ERR_NOMEM, "comm_split: out of memory");
        return NULL;
    }
    n->rank = 0;
    n->size = 1;
#ifdef ZS_HAVE_MPI
    n->mpi = MPI_COMM_NULL;
    if (c->mpi != MPI_COMM_NULL) {
        if (MPI_Comm_split(c->mpi, color, key, &n->mpi) != MPI_SUCCESS) {
            free(n);
            zs_set_error_code(ZS_ERR_IO, "comm_split: MPI_Comm_split failed");
            return NULL;
        }
        MPI_Comm_set_errhandler(n->mpi, MPI_ERRORS_RETURN);
        MPI_Comm_rank(n->mpi, &n->rank);
        MPI_Comm_size(n->mpi, &n->size);
    }
#else
    (void)color;
    (void)key;
#endif
    return n;
}

void zs_comm_free(zs_comm *c)
{
    if (!c || c == &world)
        return;
#ifdef ZS_HAVE_MPI
    if (c->mpi != MPI_COMM_NULL)
        MPI_Comm_free(&c->mpi);
#endif
    free(c);
}

/* ---- checks -------------------------------------------------------------- */

static zs_status check_tensor(const char *op, const zs_tensor *t, bool reduce)
{
    if (!t)
        return zs_set_error("%s: NULL tensor", op);
    if (!zs_is_contiguous(t) || t->device != ZS_CPU)
        return zs_set_error("%s: tensor must be contiguous and on the CPU", op);
    if (reduce && t->dtype != ZS_F32 && t->dtype != ZS_F64 &&
        t->dtype != ZS_I32 && t->dtype != ZS_I64)
        return zs_set_error("%s: cannot sum dtype %s (expected f32, f64, i32 "
                            "or i64)", op, zs_dtype_name(t->dtype));
    return ZS_OK;
}

static zs_status check_root(const char *op, const zs_comm *c, int root)
{
    if (root < 0 || root >= c->size)
        return zs_set_error("%s: root %d is not a rank of a communicator of "
                            "size %d", op, root, c->size);
    return ZS_OK;
}

/* Adds n elements of src into dst. */
static void add_into(zs_dtype dt, void *dst, const void *src, int64_t n)
{
    switch (dt) {
    case ZS_F32: for (int64_t i = 0; i < n; i++) ((float *)dst)[i] += ((const float *)src)[i]; break;
    case ZS_F64: for (int64_t i = 0; i < n; i++) ((double *)dst)[i] += ((const double *)src)[i]; break;
    case ZS_I32: for (int64_t i = 0; i < n; i++) ((int32_t *)dst)[i] += ((const int32_t *)src)[i]; break;
    default: for (int64_t i = 0; i < n; i++) ((int64_t *)dst)[i] += ((const int64_t *)src)[i]; break;
    }
}

static void scale(zs_tensor *t, double s)
{
    int64_t n = zs_numel(t);
    if (t->dtype == ZS_F32)
        for (int64_t i = 0; i < n; i++)
            ((float *)zs_data(t))[i] *= (float)s;
    else if (t->dtype == ZS_F64)
        for (int64_t i = 0; i < n; i++)
            ((double *)zs_data(t))[i] *= s;
}

#ifdef ZS_HAVE_MPI
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

static zs_status mpi_check(const char *op, int rc)
{
    if (rc == MPI_SUCCESS)
        return ZS_OK;
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    return zs_set_error_code(ZS_ERR_IO, "%s: MPI error: %s", op, msg);
}

/* Byte count for byte-wise transfers of any dtype. */
static int nbytes_int(const zs_tensor *t) { return (int)zs_nbytes(t); }

static zs_status ring_allreduce(zs_comm *c, zs_tensor *t)
{
    int P = c->size, r = c->rank;
    int64_t n = zs_numel(t);
    size_t es = zs_dtype_size(t->dtype);
    char *d = zs_data(t);
    int64_t maxchunk = (n + P - 1) / P;
    void *tmp = malloc((size_t)(maxchunk ? maxchunk : 1) * es);
    if (!tmp)
        return zs_set_error_code(ZS_ERR_NOMEM, "allreduce: out of memory");
    int right = (r + 1) % P, left = (r + P - 1) % P;
    MPI_Datatype ty = mpi_type(t->dtype);
    zs_status st = ZS_OK;
#define CH_LO(k) (n * (int64_t)(k) / P)
#define CH_N(k) (CH_LO((k) + 1) - CH_LO(k))
    for (int s = 0; st == ZS_OK && s < P - 1; s++) { /* reduce-scatter */
        int send = (r - s + P) % P, recv = (r - s - 1 + 2 * P) % P;
        st = mpi_check("allreduce (ring)",
                       MPI_Sendrecv(d + CH_LO(send) * (int64_t)es, (int)CH_N(send), ty,
                                    right, 7001, tmp, (int)CH_N(recv), ty, left, 7001,
                                    c->mpi, MPI_STATUS_IGNORE));
        if (st == ZS_OK)
            add_into(t->dtype, d + CH_LO(recv) * (int64_t)es, tmp, CH_N(recv));
    }
    for (int s = 0; st == ZS_OK && s < P - 1; s++) { /* all-gather */
        int send = (r + 1 - s + P) % P, recv = (r - s + P) % P;
        st = mpi_check("allreduce (ring)",
                       MPI_Sendrecv(d + CH_LO(send) * (int64_t)es, (int)CH_N(send), ty,
                                    right, 7002, d + CH_LO(recv) * (int64_t)es,
                                    (int)CH_N(recv), ty, left, 7002, c->mpi,
                                    MPI_STATUS_IGNORE));
    }
#undef CH_LO
#undef CH_N
    free(tmp);
    return st;
}
#endif

#ifdef ZS_HAVE_MPI
#define MULTI(c) ((c)->mpi != MPI_COMM_NULL)
#else
#define MULTI(c) false
#endif

/* ---- collectives ----------------------------------------------------------- */

zs_status zs_comm_barrier(zs_comm *c)
{
    if (!c)
        return zs_set_error("barrier: NULL communicator");
#ifdef ZS_HAVE_MPI
    if (MULTI(c))
        return mpi_check("barrier", MPI_Barrier(c->mpi));
#endif
    return ZS_OK;
}

zs_status zs_comm_broadcast(zs_comm *c, zs_tensor *t, int root)
{
    zs_status st = c ? check_tensor("broadcast", t, false) : zs_set_error("broadcast: NULL communicator");
    if (st == ZS_OK)
        st = check_root("broadcast", c, root);
#ifdef ZS_HAVE_MPI
    if (st == ZS_OK && MULTI(c))
        st = mpi_check("broadcast", MPI_Bcast(zs_data(t), nbytes_int(t), MPI_BYTE, root, c->mpi));
#endif
    return st;
}

zs_status zs_comm_allreduce(zs_comm *c, zs_tensor *t, bool average,
                            zs_allreduce_algo algo)
{
    zs_status st = c ? check_tensor("allreduce", t, true) : zs_set_error("allreduce: NULL communicator");
    if (st == ZS_OK && algo != ZS_ALLREDUCE_MPI && algo != ZS_ALLREDUCE_RING)
        st = zs_set_error("allreduce: unknown algorithm %d", (int)algo);
    if (st != ZS_OK)
        return st;
#ifdef ZS_HAVE_MPI
    if (MULTI(c) && c->size > 1) {
        if (algo == ZS_ALLREDUCE_RING)
            st = ring_allreduce(c, t);
        else
            st = mpi_check("allreduce", MPI_Allreduce(MPI_IN_PLACE, zs_data(t),
                                                      (int)zs_numel(t), mpi_type(t->dtype),
                                                      MPI_SUM, c->mpi));
    }
#endif
    if (st == ZS_OK && average)
        scale(t, 1.0 / c->size);
    return st;
}

zs_status zs_comm_reduce(zs_comm *c, zs_tensor *t, int root)
{
    zs_status st = c ? check_tensor("reduce", t, true) : zs_set_error("reduce: NULL communicator");
    if (st == ZS_OK)
        st = check_root("reduce", c, root);
#ifdef ZS_HAVE_MPI
    if (st == ZS_OK && MULTI(c))
        st = mpi_check("reduce", MPI_Reduce(c->rank == root ? MPI_IN_PLACE : zs_data(t),
                                            zs_data(t), (int)zs_numel(t),
                                            mpi_type(t->dtype), MPI_SUM, root, c->mpi));
#endif
    return st;
}

static zs_status check_parts(const char *op, const zs_comm *c, const zs_tensor *part,
                             const zs_tensor *whole)
{
    zs_status st = check_tensor(op, part, false);
    if (st == ZS_OK)
        st = check_tensor(op, whole, false);
    if (st == ZS_OK && (part->dtype != whole->dtype ||
                        zs_numel(whole) != zs_numel(part) * c->size))
        st = zs_set_error("%s: %lld-element %s part and %lld-element %s whole; "
                          "expected the whole to be %d x the part, same dtype", op,
                          (long long)zs_numel(part), zs_dtype_name(part->dtype),
                          (long long)zs_numel(whole), zs_dtype_name(whole->dtype),
                          c->size);
    return st;
}

zs_status zs_comm_allgather(zs_comm *c, const zs_tensor *in, zs_tensor *out)
{
    if (!c)
        return zs_set_error("allgather: NULL communicator");
    zs_status st = check_parts("allgather", c, in, out);
    if (st != ZS_OK)
        return st;
#ifdef ZS_HAVE_MPI
    if (MULTI(c))
        return mpi_check("allgather", MPI_Allgather(zs_data(in), nbytes_int(in), MPI_BYTE,
                                                    zs_data(out), nbytes_int(in), MPI_BYTE,
                                                    c->mpi));
#endif
    memcpy(zs_data(out), zs_data(in), zs_nbytes(in));
    return ZS_OK;
}

zs_status zs_comm_reduce_scatter(zs_comm *c, const zs_tensor *in, zs_tensor *out)
{
    if (!c)
        return zs_set_error("reduce_scatter: NULL communicator");
    zs_status st = check_parts("reduce_scatter", c, out, in);
    if (st == ZS_OK)
        st = check_tensor("reduce_scatter", in, true);
    if (st != ZS_OK)
        return st;
#ifdef ZS_HAVE_MPI
    if (MULTI(c))
        return mpi_check("reduce_scatter",
                         MPI_Reduce_scatter_block(zs_data(in), zs_data(out), (int)zs_numel(out),
                                                  mpi_type(in->dtype), MPI_SUM, c->mpi));
#endif
    memcpy(zs_data(out), zs_data(in), zs_nbytes(out));
    return ZS_OK;
}

zs_status zs_comm_scatter(zs_comm *c, const zs_tensor *in, zs_tensor *out, int root)
{
    if (!c)
        return zs_set_error("scatter: NULL communicator");
    zs_status st = check_root("scatter", c, root);
    if (st == ZS_OK)
        st = c->rank == root ? check_parts("scatter", c, out, in)
                             : check_tensor("scatter", out, false);
    if (st != ZS_OK)
        return st;
#ifdef ZS_HAVE_MPI
    if (MULTI(c))
        return mpi_check("scatter", MPI_Scatter(c->rank == root ? zs_data(in) : NULL,
                                                nbytes_int(out), MPI_BYTE, zs_data(out),
                                                nbytes_int(out), MPI_BYTE, root, c->mpi));
#endif
    memcpy(zs_data(out), zs_data(in), zs_nbytes(out));
    return ZS_OK;
}

zs_status zs_comm_gather(zs_comm *c, const zs_tensor *in, zs_tensor *out, int root)
{
    if (!c)
        return zs_set_error("gather: NULL communicator");
    zs_status st = check_root("gather", c, root);
    if (st == ZS_OK)
        st = c->rank == root ? check_parts("gather", c, in, out)
                             : check_tensor("gather", in, false);
    if (st != ZS_OK)
        return st;
#ifdef ZS_HAVE_MPI
    if (MULTI(c))
        return mpi_check("gather", MPI_Gather(zs_data(in), nbytes_int(in), MPI_BYTE,
                                              c->rank == root ? zs_data(out) : NULL,
                                              nbytes_int(in), MPI_BYTE, root, c->mpi));
#endif
    memcpy(zs_data(out), zs_data(in), zs_nbytes(in));
    return ZS_OK;
}

zs_status zs_comm_send(zs_comm *c, const zs_tensor *t, int dst, int tag)
{
    zs_status st = c ? check_tensor("send", t, false) : zs_set_error("send: NULL communicator");
    if (st == ZS_OK && (dst < 0 || dst >= c->size || dst == c->rank))
        st = zs_set_error("send: destination %d is not another rank of %d", dst, c->size);
#ifdef ZS_HAVE_MPI
    if (st == ZS_OK && MULTI(c))
        st = mpi_check("send", MPI_Send(zs_data(t), nbytes_int(t), MPI_BYTE, dst, tag, c->mpi));
#else
    (void)tag;
#endif
    return st;
}

zs_status zs_comm_recv(zs_comm *c, zs_tensor *t, int src, int tag)
{
    zs_status st = c ? check_tensor("recv", t, false) : zs_set_error("recv: NULL communicator");
    if (st == ZS_OK && (src < 0 || src >= c->size || src == c->rank))
        st = zs_set_error("recv: source %d is not another rank of %d", src, c->size);
#ifdef ZS_HAVE_MPI
    if (st == ZS_OK && MULTI(c)) {
        MPI_Status ms;
        st = mpi_check("recv", MPI_Recv(zs_data(t), nbytes_int(t), MPI_BYTE, src, tag,
                                        c->mpi, &ms));
        int got = 0;
        if (st == ZS_OK && (MPI_Get_count(&ms, MPI_BYTE, &got), got != nbytes_int(t)))
            st = zs_set_error("recv: got %d bytes from rank %d, expected %d", got, src,
                              nbytes_int(t));
    }
#else
    (void)tag;
#endif
    return st;
}
