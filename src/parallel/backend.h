/*
 * parallel/backend.h - the transport under a communicator: a table of
 * functions that move raw buffers between the ranks of one communicator.
 * Not public.
 *
 * Every collective of zs/dist.h is written once (collectives.c, ring.c)
 * on top of this table: local checks, the cross-rank agreement, one
 * non-blocking start through the backend, then a wait that polls the
 * backend's `test` against the communicator's deadline (comm.c). So the
 * failure rules of zs/dist.h (checks, timeouts, the survey naming the
 * missing ranks, broken communicators) hold for every backend alike, and a
 * backend only starts transfers and says whether they are done.
 *
 * Backends:
 *   zsi_backend_mpi   comm_mpi.c, MPI (the only file that includes mpi.h);
 *                     every communicator of a program started by mpirun
 *   zsi_backend_self  comm_self.c, a communicator of one process without
 *                     MPI: collectives are the identity or a copy
 * A third (NCCL between GPUs) fits the same table: operations take
 * pointers, byte or element counts and a zs_dtype, never MPI types;
 * a request is an opaque 8-byte handle (an MPI_Request, a CUDA event).
 *
 * Contract for every start function: it returns ZS_OK with *rq holding
 * the pending transfer (ZSI_REQ_NONE when it finished at once), or fails
 * with a message "op: ..." and marks c broken (zsi_break), so that a
 * transport failure makes the communicator unusable as zs/dist.h says.
 * Buffers must stay valid until the request completes. Counts are at
 * most 2^31 - 1 bytes (zsi_check_tensor enforces it for tensors).
 */
#ifndef ZS_PARALLEL_BACKEND_H
#define ZS_PARALLEL_BACKEND_H

#include <stdbool.h>
#include <stdint.h>

#include "zs/dist.h"

/* A pending transfer, opaque outside its backend; all-zero = none. */
typedef struct zsi_req {
    uint64_t h;
} zsi_req;
#define ZSI_REQ_NONE ((zsi_req){0})
static inline bool zsi_req_pending(zsi_req r) { return r.h != 0; }

/* Traffic classes of a communicator, kept apart so that none can match
 * another's message: USER carries the user's collectives and send/recv;
 * PRIVATE the ring's point-to-point steps, the timeout survey and the
 * argument agreement. */
typedef enum zsi_chan { ZSI_CHAN_USER = 0, ZSI_CHAN_PRIVATE = 1 } zsi_chan;

/* What a completed receive reports (test/wait with one request). */
typedef struct zsi_recv_info {
    int source;       /* the sender (for a ZS_ANY_SOURCE receive) */
    int64_t bytes;    /* bytes received */
    bool truncated;   /* the message was longer than the buffer: an error
                       * for the caller to report; c stays usable */
} zsi_recv_info;

typedef struct zsi_comm_backend {
    const char *name;

    /* ---- communicators ---- */
    /* Collective over c: fills the new communicator n (already holding
     * c's timeout and checks) with its backend, state, rank and size for
     * the ranks of equal color >= 0, ordered by key; a rank with a
     * negative color takes part and leaves n as it is. */
    zs_status (*split)(zs_comm *c, int color, int key, zs_comm *n);
    /* Frees c's backend state (not c); keeps what abandoned transfers may
     * still use (c->orphans > 0). */
    void (*free)(zs_comm *c);
    /* Ends every process of the job with exit code `code`; returns only
     * when the backend cannot (the caller then exits this process). */
    void (*abort)(zs_comm *c, int code);

    /* ---- collectives, non-blocking, on the USER channel ---- */
    zs_status (*ibarrier)(zs_comm *c, const char *op, zsi_req *rq);
    /* bytes at buf on every rank become root's. */
    zs_status (*ibroadcast)(zs_comm *c, const char *op, void *buf, int64_t bytes, int root,
                            zsi_req *rq);
    /* n elements of dt at buf = their sum over the ranks (in place). */
    zs_status (*iallreduce)(zs_comm *c, const char *op, void *buf, int64_t n, zs_dtype dt,
                            zsi_req *rq);
    /* As iallreduce, the sum only on root (other ranks' buf unchanged). */
    zs_status (*ireduce)(zs_comm *c, const char *op, void *buf, int64_t n, zs_dtype dt,
                         int root, zsi_req *rq);
    /* out (size * bytes) = every rank's in (bytes), in rank order; on
     * `ch` (the agreement uses PRIVATE). */
    zs_status (*iallgather)(zs_comm *c, const char *op, zsi_chan ch, const void *in,
                            void *out, int64_t bytes, zsi_req *rq);
    /* out (n elements) = sum over ranks of chunk `rank` of in (size * n). */
    zs_status (*ireduce_scatter)(zs_comm *c, const char *op, const void *in, void *out,
                                 int64_t n, zs_dtype dt, zsi_req *rq);
    /* Root's in (size * bytes) cut into every rank's out (bytes); in is
     * NULL on other ranks. */
    zs_status (*iscatter)(zs_comm *c, const char *op, const void *in, void *out,
                          int64_t bytes, int root, zsi_req *rq);
    /* Root's out (size * bytes) = every rank's in (bytes); out is NULL on
     * other ranks. */
    zs_status (*igather)(zs_comm *c, const char *op, const void *in, void *out,
                         int64_t bytes, int root, zsi_req *rq);

    /* ---- point-to-point, non-blocking; tag >= 0 ---- */
    zs_status (*isend)(zs_comm *c, const char *op, zsi_chan ch, const void *buf,
                       int64_t bytes, int dst, int tag, zsi_req *rq);
    /* src may be ZS_ANY_SOURCE; receives at most `bytes`. */
    zs_status (*irecv)(zs_comm *c, const char *op, zsi_chan ch, void *buf, int64_t bytes,
                       int src, int tag, zsi_req *rq);

    /* ---- completion: the timeout polling hooks ---- */
    /* Without blocking, *done = every one of the n requests completed
     * (they are then ZSI_REQ_NONE; NONE counts as completed). info (n == 1
     * only, may be NULL) describes a completed receive. */
    zs_status (*test)(zs_comm *c, const char *op, int n, zsi_req *rq, bool *done,
                      zsi_recv_info *info);
    /* Blocks until the n requests complete (no deadline: a communicator
     * without timeout waits here rather than spinning). */
    zs_status (*wait)(zs_comm *c, const char *op, int n, zsi_req *rq, zsi_recv_info *info);
    /* Cancels a pending receive and completes it (NONE: nothing). */
    void (*cancel_recv)(zs_comm *c, zsi_req *rq);
} zsi_comm_backend;

extern const zsi_comm_backend zsi_backend_self;
extern const zsi_comm_backend zsi_backend_mpi;

/* Starting and ending the process-wide transport (comm_mpi.c; without
 * MPI support, stubs). zsi_mpi_start: when the launcher says the program
 * runs under mpirun, starts MPI and makes `world` an MPI communicator
 * (*started true, *thread_level the MPI_THREAD_* level granted); otherwise
 * leaves world alone. Fails when MPI is wanted but unavailable. */
zs_status zsi_mpi_start(int *argc, char ***argv, zs_comm *world, bool *started,
                        int *thread_level);
/* Frees world's MPI state and ends MPI. */
void zsi_mpi_finalize(zs_comm *world);

#endif
