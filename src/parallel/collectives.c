/*
 * collectives.c - broadcast, reduce, all-gather, reduce-scatter, scatter,
 * gather, barrier and send/recv on tensors (contracts in zs/dist.h); the
 * all-reduce lives in ring.c.
 *
 * Every operation: local checks -> cross-rank agreement (when checks are
 * on) -> the non-blocking MPI call -> a wait against the communicator's
 * deadline (zsi_wait). On a single process each is the identity or a copy.
 * Byte-moving operations send any dtype as MPI_BYTE; reductions use the
 * matching MPI type and MPI_SUM.
 */
#include <string.h>
#include <time.h>

#include "parallel/internal.h"

/* Root in range: checked on every rank (all see the same size). */
static zs_status check_root(const char *op, const zs_comm *c, int root)
{
    if (root < 0 || root >= c->size)
        return zs_set_error("%s: root %d is not a rank of a communicator of "
                            "size %d", op, root, c->size);
    return ZS_OK;
}

/* whole (numel size * n) and part (numel n), same dtype. */
static zs_status check_parts(const char *op, const zs_comm *c, const zs_tensor *part,
                             const zs_tensor *whole, bool sum)
{
    zs_status st = zsi_check_tensor(op, part, sum);
    if (st == ZS_OK)
        st = zsi_check_tensor(op, whole, sum);
    if (st == ZS_OK && (part->dtype != whole->dtype ||
                        zs_numel(whole) != zs_numel(part) * c->size))
        st = zs_set_error("%s: %lld-element %s part and %lld-element %s whole; "
                          "expected the whole to be %d x the part, same dtype", op,
                          (long long)zs_numel(part), zs_dtype_name(part->dtype),
                          (long long)zs_numel(whole), zs_dtype_name(whole->dtype),
                          c->size);
    return st;
}

static int dtype_of(const zs_tensor *t) { return t ? (int)t->dtype : -1; }
static int64_t numel_of(const zs_tensor *t) { return t ? zs_numel(t) : -1; }

#ifdef ZS_HAVE_MPI
/* Waits for one started MPI collective; on a timeout the tensors stay
 * referenced for ever, as MPI may still write them. */
static zs_status finish(zs_comm *c, const char *op, int rc, MPI_Request *rq,
                        const zs_tensor *a, const zs_tensor *b)
{
    zs_status st = zsi_mpi(c, op, rc);
    if (st == ZS_OK)
        st = zsi_wait(c, op, 1, rq, zsi_deadline(c), -1);
    if (st != ZS_OK && c->broken) {
        if (a)
            zs_retain((zs_tensor *)a);
        if (b)
            zs_retain((zs_tensor *)b);
    }
    return st;
}

static int nbytes_int(const zs_tensor *t) { return (int)zs_nbytes(t); }
#endif

zs_status zs_comm_barrier(zs_comm *c)
{
    zs_status st = zsi_check_comm("barrier", c);
    if (st != ZS_OK)
        return st;
    st = zsi_agree(c, "barrier", ZSI_OP_BARRIER, 0, 0, 0, ZS_OK);
#ifdef ZS_HAVE_MPI
    if (st == ZS_OK && zsi_multi(c)) {
        MPI_Request rq = MPI_REQUEST_NULL;
        st = finish(c, "barrier", MPI_Ibarrier(c->mpi, &rq), &rq, NULL, NULL);
    }
#endif
    return st;
}

zs_status zs_comm_broadcast(zs_comm *c, zs_tensor *t, int root)
{
    const char *op = "broadcast";
    zs_status st = zsi_check_comm(op, c);
    if (st != ZS_OK)
        return st;
    st = zsi_check_tensor(op, t, false);
    if (st == ZS_OK)
        st = check_root(op, c, root);
    st = zsi_agree(c, op, ZSI_OP_BROADCAST, dtype_of(t), numel_of(t), root, st);
#ifdef ZS_HAVE_MPI
    if (st == ZS_OK && zsi_multi(c)) {
        MPI_Request rq = MPI_REQUEST_NULL;
        st = finish(c, op, MPI_Ibcast(zs_data(t), nbytes_int(t), MPI_BYTE, root, c->mpi, &rq),
                    &rq, t, NULL);
    }
#endif
    return st;
}

zs_status zs_comm_reduce(zs_comm *c, zs_tensor *t, int root)
{
    const char *op = "reduce";
    zs_status st = zsi_check_comm(op, c);
    if (st != ZS_OK)
        return st;
    st = zsi_check_tensor(op, t, true);
    if (st == ZS_OK)
        st = check_root(op, c, root);
    st = zsi_agree(c, op, ZSI_OP_REDUCE, dtype_of(t), numel_of(t), root, st);
#ifdef ZS_HAVE_MPI
    if (st == ZS_OK && zsi_multi(c)) {
        MPI_Request rq = MPI_REQUEST_NULL;
        void *d = zs_data(t);
        st = finish(c, op, MPI_Ireduce(c->rank == root ? MPI_IN_PLACE : d, d,
                                       (int)zs_numel(t), zsi_mpi_type(t->dtype), MPI_SUM,
                                       root, c->mpi, &rq), &rq, t, NULL);
    }
#endif
    return st;
}

zs_status zs_comm_allgather(zs_comm *c, const zs_tensor *in, zs_tensor *out)
{
    const char *op = "allgather";
    zs_status st = zsi_check_comm(op, c);
    if (st != ZS_OK)
        return st;
    st = check_parts(op, c, in, out, false);
    st = zsi_agree(c, op, ZSI_OP_ALLGATHER, dtype_of(in), numel_of(in), 0, st);
    if (st != ZS_OK)
        return st;
#ifdef ZS_HAVE_MPI
    if (zsi_multi(c)) {
        MPI_Request rq = MPI_REQUEST_NULL;
        return finish(c, op, MPI_Iallgather(zs_data(in), nbytes_int(in), MPI_BYTE,
                                            zs_data(out), nbytes_int(in), MPI_BYTE,
                                            c->mpi, &rq), &rq, in, out);
    }
#endif
    memcpy(zs_data(out), zs_data(in), zs_nbytes(in));
    return ZS_OK;
}

zs_status zs_comm_reduce_scatter(zs_comm *c, const zs_tensor *in, zs_tensor *out)
{
    const char *op = "reduce_scatter";
    zs_status st = zsi_check_comm(op, c);
    if (st != ZS_OK)
        return st;
    st = check_parts(op, c, out, in, true);
    st = zsi_agree(c, op, ZSI_OP_REDUCE_SCATTER, dtype_of(out), numel_of(out), 0, st);
    if (st != ZS_OK)
        return st;
#ifdef ZS_HAVE_MPI
    if (zsi_multi(c)) {
        MPI_Request rq = MPI_REQUEST_NULL;
        return finish(c, op, MPI_Ireduce_scatter_block(zs_data(in), zs_data(out),
                                                       (int)zs_numel(out),
                                                       zsi_mpi_type(in->dtype), MPI_SUM,
                                                       c->mpi, &rq), &rq, in, out);
    }
#endif
    memcpy(zs_data(out), zs_data(in), zs_nbytes(out));
    return ZS_OK;
}

zs_status zs_comm_scatter(zs_comm *c, const zs_tensor *in, zs_tensor *out, int root)
{
    const char *op = "scatter";
    zs_status st = zsi_check_comm(op, c);
    if (st != ZS_OK)
        return st;
    st = check_root(op, c, root);
    if (st == ZS_OK)
        st = c->rank == root ? check_parts(op, c, out, in, false)
                             : zsi_check_tensor(op, out, false);
    st = zsi_agree(c, op, ZSI_OP_SCATTER, dtype_of(out), numel_of(out), root, st);
    if (st != ZS_OK)
        return st;
#ifdef ZS_HAVE_MPI
    if (zsi_multi(c)) {
        MPI_Request rq = MPI_REQUEST_NULL;
        bool me = c->rank == root;
        return finish(c, op, MPI_Iscatter(me ? zs_data(in) : NULL, nbytes_int(out), MPI_BYTE,
                                          zs_data(out), nbytes_int(out), MPI_BYTE, root,
                                          c->mpi, &rq), &rq, me ? in : NULL, out);
    }
#endif
    memcpy(zs_data(out), zs_data(in), zs_nbytes(out));
    return ZS_OK;
}

zs_status zs_comm_gather(zs_comm *c, const zs_tensor *in, zs_tensor *out, int root)
{
    const char *op = "gather";
    zs_status st = zsi_check_comm(op, c);
    if (st != ZS_OK)
        return st;
    st = check_root(op, c, root);
    if (st == ZS_OK)
        st = c->rank == root ? check_parts(op, c, in, out, false)
                             : zsi_check_tensor(op, in, false);
    st = zsi_agree(c, op, ZSI_OP_GATHER, dtype_of(in), numel_of(in), root, st);
    if (st != ZS_OK)
        return st;
#ifdef ZS_HAVE_MPI
    if (zsi_multi(c)) {
        MPI_Request rq = MPI_REQUEST_NULL;
        bool me = c->rank == root;
        return finish(c, op, MPI_Igather(zs_data(in), nbytes_int(in), MPI_BYTE,
                                         me ? zs_data(out) : NULL, nbytes_int(in), MPI_BYTE,
                                         root, c->mpi, &rq), &rq, in, me ? out : NULL);
    }
#endif
    memcpy(zs_data(out), zs_data(in), zs_nbytes(in));
    return ZS_OK;
}

/* ---- point-to-point ------------------------------------------------------ */

static zs_status check_peer(const char *op, const zs_comm *c, const zs_tensor *t,
                            int peer, int tag)
{
    zs_status st = zsi_check_comm(op, c);
    if (st == ZS_OK)
        st = zsi_check_tensor(op, t, false);
    if (st == ZS_OK && (peer < 0 || peer >= c->size || peer == c->rank))
        st = zs_set_error("%s: rank %d is not another rank of a communicator of "
                          "size %d", op, peer, c->size);
    if (st == ZS_OK && (tag < 0 || tag > 32767))
        st = zs_set_error("%s: tag %d outside [0, 32767]", op, tag);
    return st;
}

zs_status zs_comm_send(zs_comm *c, const zs_tensor *t, int dst, int tag)
{
    zs_status st = check_peer("send", c, t, dst, tag);
#ifdef ZS_HAVE_MPI
    if (st == ZS_OK && zsi_multi(c)) {
        MPI_Request rq = MPI_REQUEST_NULL;
        st = zsi_mpi(c, "send", MPI_Isend(zs_data(t), nbytes_int(t), MPI_BYTE, dst, tag,
                                          c->mpi, &rq));
        if (st == ZS_OK)
            st = zsi_wait(c, "send", 1, &rq, zsi_deadline(c), dst);
        if (st != ZS_OK && c->broken)
            zs_retain((zs_tensor *)t);
    }
#endif
    return st;
}

#ifdef ZS_HAVE_MPI
/* Completes a posted receive before c's deadline; checks the byte count
 * (a longer message is truncated by MPI and reported, a shorter one is
 * reported here; either leaves c usable). */
static zs_status recv_wait(zs_comm *c, MPI_Request *rq, int src, int want)
{
    double dl = zsi_deadline(c);
    MPI_Status ms;
    int flag = 0, rc;
    do {
        rc = dl > 0 ? MPI_Test(rq, &flag, &ms) : (flag = 1, MPI_Wait(rq, &ms));
        if (!flag && zsi_now() > dl) {
            zsi_cancel_recv(rq);
            return zsi_timeout(c, "recv", 0, NULL, src, false);
        }
    } while (!flag && rc == MPI_SUCCESS);
    int cls = MPI_SUCCESS, got = 0;
    if (rc != MPI_SUCCESS)
        MPI_Error_class(rc, &cls);
    if (cls == MPI_ERR_TRUNCATE)
        return zs_set_error("recv: rank %d sent more than the %d bytes expected", src, want);
    if (rc != MPI_SUCCESS)
        return zsi_mpi(c, "recv", rc);
    MPI_Get_count(&ms, MPI_BYTE, &got);
    if (got != want)
        return zs_set_error("recv: got %d bytes from rank %d, expected %d", got, src, want);
    return ZS_OK;
}

/* Polls a posted receive, sleeping ~50 us between tests, until it
 * completes or c's deadline passes; *from gets the sender. */
static zs_status recv_idle_wait(zs_comm *c, MPI_Request *rq, int src, int want,
                                int *from)
{
    double dl = zsi_deadline(c);
    MPI_Status ms;
    int flag = 0, rc;
    struct timespec nap = {0, 50000};
    for (;;) {
        rc = MPI_Test(rq, &flag, &ms);
        if (flag || rc != MPI_SUCCESS)
            break;
        if (dl > 0 && zsi_now() > dl) {
            zsi_cancel_recv(rq);
            if (src >= 0)
                return zsi_timeout(c, "recv", 0, NULL, src, false);
            zs_set_error_code(ZS_ERR_IO, "recv: rank %d heard from no rank in %.3g s",
                              c->rank, c->timeout);
            return zsi_break(c, ZS_ERR_IO);
        }
        nanosleep(&nap, NULL);
    }
    if (rc != MPI_SUCCESS)
        return zsi_mpi(c, "recv", rc);
    int got = 0;
    MPI_Get_count(&ms, MPI_BYTE, &got);
    *from = ms.MPI_SOURCE;
    if (got != want)
        return zs_set_error("recv: got %d bytes from rank %d, expected %d", got,
                            ms.MPI_SOURCE, want);
    return ZS_OK;
}
#endif

zs_status zs_comm_recv_idle(zs_comm *c, zs_tensor *t, int src, int tag, int *from)
{
    zs_status st = src == ZS_ANY_SOURCE ? zsi_check_comm("recv", c)
                                        : check_peer("recv", c, t, src, tag);
    if (st == ZS_OK)
        st = zsi_check_tensor("recv", t, false);
    if (st == ZS_OK && (tag < 0 || tag > 32767))
        st = zs_set_error("recv: tag %d outside [0, 32767]", tag);
    if (st == ZS_OK && c->size == 1)
        st = zs_set_error("recv: a communicator of one rank has no one to hear from");
#ifdef ZS_HAVE_MPI
    if (st == ZS_OK && zsi_multi(c)) {
        MPI_Request rq = MPI_REQUEST_NULL;
        int from_ = -1;
        st = zsi_mpi(c, "recv", MPI_Irecv(zs_data(t), nbytes_int(t), MPI_BYTE,
                                          src == ZS_ANY_SOURCE ? MPI_ANY_SOURCE : src,
                                          tag, c->mpi, &rq));
        if (st == ZS_OK)
            st = recv_idle_wait(c, &rq, src, nbytes_int(t), &from_);
        if (from)
            *from = from_;
    }
#endif
    return st;
}

zs_status zs_comm_recv(zs_comm *c, zs_tensor *t, int src, int tag)
{
    zs_status st = check_peer("recv", c, t, src, tag);
#ifdef ZS_HAVE_MPI
    if (st == ZS_OK && zsi_multi(c)) {
        MPI_Request rq = MPI_REQUEST_NULL;
        st = zsi_mpi(c, "recv", MPI_Irecv(zs_data(t), nbytes_int(t), MPI_BYTE, src, tag,
                                          c->mpi, &rq));
        if (st == ZS_OK)
            st = recv_wait(c, &rq, src, nbytes_int(t));
    }
#endif
    return st;
}
