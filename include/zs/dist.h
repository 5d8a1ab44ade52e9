/*
 * zs/dist.h - communication between processes: a communicator on MPI (when
 * the library is built with it and the program runs under mpirun) or a
 * single-process communicator with the same API, and collectives on
 * tensors, including Zhisuan's own ring all-reduce (blocking and
 * non-blocking). See shared/DESIGN.md, "Distributed". The transport is a
 * backend under the communicator (src/parallel/backend.h: MPI, or one
 * process); the rules below hold for every backend.
 *
 * Tensors are contiguous CPU tensors. Reductions (sum) take f32, f64, i32
 * or i64; broadcast, gather, scatter, all-gather and send/recv move any
 * dtype as bytes. Every rank must call the collectives of a communicator
 * in the same order with matching sizes (the MPI rule).
 *
 * Failures, in increasing order of cost:
 *  - Arguments that can be checked locally (dtype, contiguity, root, the
 *    size relation between a part and a whole) are checked before any
 *    message is sent: a mistake gives an error, not a hang. A rank that
 *    fails such a check returns at once, so the others wait for it.
 *  - With checks on (zs_comm_set_checks, or ZS_COMM_CHECK=1 for the world)
 *    every collective first exchanges (operation, dtype, size, root) among
 *    the ranks, so a rank passing different sizes, another collective, or
 *    arguments its local check rejected makes every rank fail with a
 *    message naming it. Costs one small all-gather per collective.
 *  - With a timeout (zs_comm_set_timeout, or ZS_COMM_TIMEOUT=seconds for
 *    the world) every wait polls the transport's non-blocking calls
 *    against a deadline. On expiry the ranks that timed out exchange a
 *    short survey (for up to the timeout again) and fail with a message
 *    naming the ranks that did not answer, so failure is reported within
 *    twice the timeout. A communicator that timed out or saw a transport
 *    (MPI) error is broken: later calls on it fail at once with the first
 *    message; pending transfers are abandoned (the tensors involved are
 *    kept alive, never freed), and the job is expected to end
 *    (zs_dist_abort).
 *
 * Waiting: between two polls a waiting rank spins for ~50 us, then
 * yields the CPU, and after 1 ms naps (10 us doubling to 200 us, at most
 * timeout / 100). Where this host runs more ranks than it has online
 * CPUs (mpirun --oversubscribe; OMPI_COMM_WORLD_LOCAL_SIZE or the like
 * against sysconf), or OpenMPI's mpi_yield_when_idle is set, it
 * never spins and naps after two yields, also in waits without a timeout
 * (which otherwise block in MPI_Wait); ZS_COMM_IDLE=spin|polite forces
 * either (src/parallel/idle.c).
 *
 * Threads: MPI is started with MPI_THREAD_FUNNELED (only the thread that
 * called zs_dist_init calls MPI; the thread pool never does). The
 * non-blocking ring therefore advances by progress calls, not by a helper
 * thread: zs_request_test, zs_comm_progress and zs_request_wait advance it.
 */
#ifndef ZS_DIST_H
#define ZS_DIST_H

#include "core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct zs_comm zs_comm;
typedef struct zs_request zs_request;

typedef enum zs_allreduce_algo {
    ZS_ALLREDUCE_MPI = 0,  /* the backend's own: the MPI library's MPI_(I)allreduce */
    ZS_ALLREDUCE_RING = 1, /* Zhisuan's ring: reduce-scatter, then all-gather */
} zs_allreduce_algo;

/* Starts MPI when built with it and launched by mpirun (the launcher's
 * environment says so); otherwise the world is this one process. Safe to
 * call more than once; zs_comm_world calls it (argc/argv NULL) when the
 * program did not. A program under mpirun must end with
 * zs_dist_finalize; one that exits without it (a failed rank) makes
 * mpirun end the whole job, which is the intended failure path, so no
 * atexit handler finalizes (MPI_Finalize would wait for the others). */
zs_status zs_dist_init(int *argc, char ***argv);
/* Ends MPI (every communicator and request must be freed first). Aborts
 * the job instead when the world communicator is broken. */
void zs_dist_finalize(void);
/* True when MPI was started (the program runs under mpirun; even with one
 * rank). */
bool zs_dist_is_mpi(void);
/* The MPI_THREAD_* level MPI granted; -1 without MPI. */
int zs_dist_thread_level(void);
/* Ends every process of the job with exit code `code` (MPI_Abort), after
 * printing zs_last_error() prefixed with the rank; without MPI, exit(). */
void zs_dist_abort(int code);

/* The world communicator (borrowed). */
zs_comm *zs_comm_world(void);
int zs_comm_rank(const zs_comm *c);
int zs_comm_size(const zs_comm *c);
/* Ranks with the same color (>= 0) form a new communicator, ordered by key
 * (data-, tensor- and pipeline-parallel groups); it inherits c's timeout
 * and checks. Collective, on every rank of c. A rank passing a negative
 * color takes part (so no rank hangs) and gets NULL and an error. Returns
 * a new communicator to free with zs_comm_free. */
zs_comm *zs_comm_split(zs_comm *c, int color, int key);
/* Frees a communicator from zs_comm_split (the world is ignored). Its
 * requests must have been waited for. */
void zs_comm_free(zs_comm *c);

/* Seconds a blocking call (or zs_request_wait) on c may wait for the
 * others; 0 (the default) waits forever. */
void zs_comm_set_timeout(zs_comm *c, double seconds);
double zs_comm_timeout(const zs_comm *c);
/* Cross-rank argument agreement before every collective (see above). */
void zs_comm_set_checks(zs_comm *c, bool on);
/* True after a timeout or transport (MPI) error made c unusable. */
bool zs_comm_is_broken(const zs_comm *c);

zs_status zs_comm_barrier(zs_comm *c);
/* t on every rank becomes root's t. */
zs_status zs_comm_broadcast(zs_comm *c, zs_tensor *t, int root);
/* In place: t = sum over ranks; with average, divided by the size (float
 * dtypes only). The ring and MPI give equal integers and floats equal up to
 * the order of the additions. */
zs_status zs_comm_allreduce(zs_comm *c, zs_tensor *t, bool average,
                            zs_allreduce_algo algo);
/* In place on root: t = sum over ranks; other ranks' t unchanged. */
zs_status zs_comm_reduce(zs_comm *c, zs_tensor *t, int root);
/* out (numel size * numel(in), any shape) = every rank's in, in rank
 * order. */
zs_status zs_comm_allgather(zs_comm *c, const zs_tensor *in, zs_tensor *out);
/* out (numel n) = sum over ranks of chunk `rank` of in (numel size * n). */
zs_status zs_comm_reduce_scatter(zs_comm *c, const zs_tensor *in,
                                 zs_tensor *out);
/* Root's in (numel size * n) is cut in rank order into every out (n); in
 * is ignored (may be NULL) on other ranks. */
zs_status zs_comm_scatter(zs_comm *c, const zs_tensor *in, zs_tensor *out,
                          int root);
/* Root's out (size * n) receives every rank's in (n) in rank order; out
 * is ignored (may be NULL) on other ranks. */
zs_status zs_comm_gather(zs_comm *c, const zs_tensor *in, zs_tensor *out,
                         int root);
/* Point-to-point, tag in [0, 32767]. recv fails when the message has
 * another byte count than t. On timeout the message names the peer. */
zs_status zs_comm_send(zs_comm *c, const zs_tensor *t, int dst, int tag);
zs_status zs_comm_recv(zs_comm *c, zs_tensor *t, int src, int tag);

/* A source for zs_comm_recv_idle: whichever rank sends first. */
#define ZS_ANY_SOURCE (-1)
/* zs_comm_recv for a rank with nothing else to do (a parameter server
 * waiting for gradients, a worker held back by its server): src may be
 * ZS_ANY_SOURCE, *from (if not NULL) receives the sender, and the wait
 * sleeps ~50 us between polls instead of spinning, so the waiting process
 * leaves its core to the ranks that compute. Timeouts as zs_comm_recv. */
zs_status zs_comm_recv_idle(zs_comm *c, zs_tensor *t, int src, int tag, int *from);

/* Non-blocking all-reduce of t in place (same contract as
 * zs_comm_allreduce): MPI_Iallreduce for ZS_ALLREDUCE_MPI, the ring as a
 * state machine for ZS_ALLREDUCE_RING. t is retained by the request and
 * must not be read or written until the request completes. Requests on a
 * communicator complete in any order, but every rank must start them in
 * the same order. Returns a new request (freed by zs_request_wait) or NULL
 * and an error. */
zs_request *zs_comm_iallreduce(zs_comm *c, zs_tensor *t, bool average,
                               zs_allreduce_algo algo);
/* Advances r (and every other request of its communicator) without
 * blocking; *done says whether r has finished. r stays owned by the
 * caller. Returns r's error, if it failed. */
zs_status zs_request_test(zs_request *r, bool *done);
/* Advances every request of c without blocking (call it between pieces of
 * work, e.g. from backward hooks, so ring all-reduces make progress). */
zs_status zs_comm_progress(zs_comm *c);
/* Waits until r completes (at most the communicator's timeout), frees r
 * and returns its status. NULL returns ZS_ERR_ARG without a new message. */
zs_status zs_request_wait(zs_request *r);

#ifdef __cplusplus
}
#endif
#endif
