/*
 * comm_self.c - the backend of a communicator of one process (a program
 * not started by mpirun): every collective is the identity or a copy from
 * the input to the output, and completes at once. Point-to-point has no
 * peer (the callers reject it before reaching here). See backend.h.
 */
#include <string.h>

#include "parallel/internal.h"

static zs_status no_peer(const char *op)
{
    return zs_set_error("%s: a communicator of one process has no other rank", op);
}

static void copy(void *out, const void *in, int64_t bytes)
{
    if (out != in && bytes > 0)
        memcpy(out, in, (size_t)bytes);
}

static zs_status self_split(zs_comm *c, int color, int key, zs_comm *n)
{
    (void)c, (void)color, (void)key, (void)n; /* n stays a one-process communicator */
    return ZS_OK;
}

static void self_free(zs_comm *c) { (void)c; }

static void self_abort(zs_comm *c, int code) { (void)c, (void)code; }

static zs_status self_ibarrier(zs_comm *c, const char *op, zsi_req *rq)
{
    (void)c, (void)op;
    *rq = ZSI_REQ_NONE;
    return ZS_OK;
}

static zs_status self_ibroadcast(zs_comm *c, const char *op, void *buf, int64_t bytes,
                                 int root, zsi_req *rq)
{
    (void)c, (void)op, (void)buf, (void)bytes, (void)root;
    *rq = ZSI_REQ_NONE;
    return ZS_OK;
}

static zs_status self_iallreduce(zs_comm *c, const char *op, void *buf, int64_t n,
                                 zs_dtype dt, zsi_req *rq)
{
    (void)c, (void)op, (void)buf, (void)n, (void)dt;
    *rq = ZSI_REQ_NONE;
    return ZS_OK;
}

static zs_status self_ireduce(zs_comm *c, const char *op, void *buf, int64_t n,
                              zs_dtype dt, int root, zsi_req *rq)
{
    (void)root;
    return self_iallreduce(c, op, buf, n, dt, rq);
}

static zs_status self_iallgather(zs_comm *c, const char *op, zsi_chan ch, const void *in,
                                 void *out, int64_t bytes, zsi_req *rq)
{
    (void)c, (void)op, (void)ch;
    copy(out, in, bytes);
    *rq = ZSI_REQ_NONE;
    return ZS_OK;
}

static zs_status self_ireduce_scatter(zs_comm *c, const char *op, const void *in,
                                      void *out, int64_t n, zs_dtype dt, zsi_req *rq)
{
    (void)c, (void)op;
    copy(out, in, n * (int64_t)zs_dtype_size(dt));
    *rq = ZSI_REQ_NONE;
    return ZS_OK;
}

static zs_status self_iscatter(zs_comm *c, const char *op, const void *in, void *out,
                               int64_t bytes, int root, zsi_req *rq)
{
    (void)c, (void)op, (void)root;
    copy(out, in, bytes);
    *rq = ZSI_REQ_NONE;
    return ZS_OK;
}

static zs_status self_isend(zs_comm *c, const char *op, zsi_chan ch, const void *buf,
                            int64_t bytes, int dst, int tag, zsi_req *rq)
{
    (void)c, (void)ch, (void)buf, (void)bytes, (void)dst, (void)tag;
    *rq = ZSI_REQ_NONE;
    return no_peer(op);
}

static zs_status self_irecv(zs_comm *c, const char *op, zsi_chan ch, void *buf,
                            int64_t bytes, int src, int tag, zsi_req *rq)
{
    (void)c, (void)ch, (void)buf, (void)bytes, (void)src, (void)tag;
    *rq = ZSI_REQ_NONE;
    return no_peer(op);
}

static zs_status self_test(zs_comm *c, const char *op, int n, zsi_req *rq, bool *done,
                           zsi_recv_info *info)
{
    (void)c, (void)op, (void)n, (void)rq, (void)info;
    *done = true; /* nothing is ever pending */
    return ZS_OK;
}

static zs_status self_wait(zs_comm *c, const char *op, int n, zsi_req *rq,
                           zsi_recv_info *info)
{
    (void)c, (void)op, (void)n, (void)rq, (void)info;
    return ZS_OK;
}

static void self_cancel_recv(zs_comm *c, zsi_req *rq) { (void)c, (void)rq; }

const zsi_comm_backend zsi_backend_self = {
    .name = "self",
    .split = self_split,
    .free = self_free,
    .abort = self_abort,
    .ibarrier = self_ibarrier,
    .ibroadcast = self_ibroadcast,
    .iallreduce = self_iallreduce,
    .ireduce = self_ireduce,
    .iallgather = self_iallgather,
    .ireduce_scatter = self_ireduce_scatter,
    .iscatter = self_iscatter,
    .igather = self_iscatter, /* a copy of in to out, as scatter */
    .isend = self_isend,
    .irecv = self_irecv,
    .test = self_test,
    .wait = self_wait,
    .cancel_recv = self_cancel_recv,
};
