/*
 * collectives.c - broadcast, reduce, all-gather, reduce-scatter, scatter,
 * gather, barrier and send/recv on tensors (contracts in zs/dist.h); the
 * all-reduce lives in ring.c.
 *
 * Every operation: local checks -> cross-rank agreement (when checks are
 * on) -> the backend's non-blocking start (backend.h) -> a wait against
 * the communicator's deadline (zsi_wait). Byte-moving operations move any
 * dtype as bytes; reductions sum in the tensor's dtype.
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

/* Waits for one started transfer (st: how its start went); when the
 * failure broke c, the tensors stay referenced for ever, as the backend
 * may still write them. */
static zs_status finish(zs_comm *c, const char *op, zs_status st, zsi_req *rq,
                        const zs_tensor *a, const zs_tensor *b)
{
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

static int64_t nbytes(const zs_tensor *t) { return (int64_t)zs_nbytes(t); }

zs_status zs_comm_barrier(zs_comm *c)
{
    zs_status st = zsi_check_comm("barrier", c);
    if (st != ZS_OK)
        return st;
    st = zsi_agree(c, "barrier", ZSI_OP_BARRIER, 0, 0, 0, ZS_OK);
    if (st != ZS_OK)
        return st;
    zsi_req rq = ZSI_REQ_NONE;
    return finish(c, "barrier", c->be->ibarrier(c, "barrier", &rq), &rq, NULL, NULL);
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
    if (st != ZS_OK)
        return st;
    zsi_req rq = ZSI_REQ_NONE;
    return finish(c, op, c->be->ibroadcast(c, op, zs_data(t), nbytes(t), root, &rq), &rq,
                  t, NULL);
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
    if (st != ZS_OK)
        return st;
    zsi_req rq = ZSI_REQ_NONE;
    return finish(c, op, c->be->ireduce(c, op, zs_data(t), zs_numel(t), t->dtype, root, &rq),
                  &rq, t, NULL);
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
    zsi_req rq = ZSI_REQ_NONE;
    return finish(c, op, c->be->iallgather(c, op, ZSI_CHAN_USER, zs_data(in), zs_data(out),
                                           nbytes(in), &rq), &rq, in, out);
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
    zsi_req rq = ZSI_REQ_NONE;
    return finish(c, op, c->be->ireduce_scatter(c, op, zs_data(in), zs_data(out),
                                                zs_numel(out), in->dtype, &rq), &rq, in, out);
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
    bool me = c->rank == root;
    zsi_req rq = ZSI_REQ_NONE;
    return finish(c, op, c->be->iscatter(c, op, me ? zs_data(in) : NULL, zs_data(out),
                                         nbytes(out), root, &rq), &rq, me ? in : NULL, out);
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
    bool me = c->rank == root;
    zsi_req rq = ZSI_REQ_NONE;
    return finish(c, op, c->be->igather(c, op, zs_data(in), me ? zs_data(out) : NULL,
                                        nbytes(in), root, &rq), &rq, in, me ? out : NULL);
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
    if (st != ZS_OK)
        return st;
    zsi_req rq = ZSI_REQ_NONE;
    st = c->be->isend(c, "send", ZSI_CHAN_USER, zs_data(t), nbytes(t), dst, tag, &rq);
    if (st == ZS_OK)
        st = zsi_wait(c, "send", 1, &rq, zsi_deadline(c), dst);
    if (st != ZS_OK && c->broken)
        zs_retain((zs_tensor *)t);
    return st;
}

/* Completes a posted receive of `want` bytes from src (or any rank)
 * before c's deadline; *from gets the sender. Polls with zsi_idle_pause;
 * idle: politely (no spinning: the core is left to the ranks that
 * compute), even without a deadline; otherwise a receive without
 * deadline blocks in the backend (unless oversubscribed).
 * Checks the byte count: a longer message is truncated by the backend, a
 * shorter one is found here; either is reported and leaves c usable. */
static zs_status recv_finish(zs_comm *c, zsi_req *rq, int src, int64_t want, bool idle,
                             int *from)
{
    double dl = zsi_deadline(c);
    zsi_recv_info info = {.source = src};
    zs_status st;
    if (dl <= 0 && !idle && !zsi_oversubscribed()) {
        st = c->be->wait(c, "recv", 1, rq, &info);
    } else {
        zsi_idle w;
        zsi_idle_init(&w, c, idle);
        for (;;) {
            bool done = false;
            st = c->be->test(c, "recv", 1, rq, &done, &info);
            if (st != ZS_OK || done)
                break;
            if (dl > 0 && zsi_expired(c, dl)) {
                c->be->cancel_recv(c, rq);
                if (src >= 0)
                    return zsi_timeout(c, "recv", 0, NULL, src, false);
                zs_set_error_code(ZS_ERR_IO, "recv: rank %d heard from no rank in %.3g s",
                                  c->rank, c->timeout);
                return zsi_break(c, ZS_ERR_IO);
            }
            zsi_idle_pause(&w);
        }
    }
    if (st != ZS_OK)
        return st;
    if (from)
        *from = info.source;
    if (info.truncated)
        return zs_set_error("recv: rank %d sent more than the %lld bytes expected",
                            info.source, (long long)want);
    if (info.bytes != want)
        return zs_set_error("recv: got %lld bytes from rank %d, expected %lld",
                            (long long)info.bytes, info.source, (long long)want);
    return ZS_OK;
}

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
    if (st != ZS_OK)
        return st;
    int from_ = -1;
    zsi_req rq = ZSI_REQ_NONE;
    st = c->be->irecv(c, "recv", ZSI_CHAN_USER, zs_data(t), nbytes(t), src, tag, &rq);
    if (st == ZS_OK)
        st = recv_finish(c, &rq, src, nbytes(t), true, &from_);
    if (from)
        *from = from_;
    return st;
}

zs_status zs_comm_recv(zs_comm *c, zs_tensor *t, int src, int tag)
{
    zs_status st = check_peer("recv", c, t, src, tag);
    if (st != ZS_OK)
        return st;
    zsi_req rq = ZSI_REQ_NONE;
    st = c->be->irecv(c, "recv", ZSI_CHAN_USER, zs_data(t), nbytes(t), src, tag, &rq);
    return st == ZS_OK ? recv_finish(c, &rq, src, nbytes(t), false, NULL) : st;
}
