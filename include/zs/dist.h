/*
 * zs/dist.h - communication between processes: a communicator on MPI (when
 * the library is built with it and the program runs under mpirun) or a
 * single-process communicator with the same API, and collectives on
 * tensors, including Zhisuan's own ring all-reduce.
 *
 * Tensors are contiguous CPU tensors. Reductions (sum) take f32, f64, i32
 * or i64; broadcast, gather, scatter, all-gather and send/recv move any
 * dtype as bytes. Every rank must call a collective with matching sizes;
 * sizes and dtypes that can be checked locally are checked before any
 * message is sent, so a mistake gives an error, not a hang.
 */
#ifndef ZS_DIST_H
#define ZS_DIST_H

#include "core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct zs_comm zs_comm;

typedef enum zs_allreduce_algo {
    ZS_ALLREDUCE_MPI = 0,  /* the MPI library's MPI_Allreduce */
    ZS_ALLREDUCE_RING = 1, /* Zhisuan's ring: reduce-scatter, then all-gather */
} zs_allreduce_algo;

/* Starts MPI when built with it and launched by mpirun (the launcher's
 * environment says so); otherwise the world is this one process. Safe to
 * call more than once. */
zs_status zs_dist_init(int *argc, char ***argv);
void zs_dist_finalize(void);
/* True when the world spans processes through MPI. */
bool zs_dist_is_mpi(void);

/* The world communicator (borrowed; valid after zs_dist_init). */
zs_comm *zs_comm_world(void);
int zs_comm_rank(const zs_comm *c);
int zs_comm_size(const zs_comm *c);
/* Ranks with the same color form a new communicator, ordered by key
 * (data-, tensor- and pipeline-parallel groups). Collective. */
zs_comm *zs_comm_split(zs_comm *c, int color, int key);
void zs_comm_free(zs_comm *c); /* not the world */

zs_status zs_comm_barrier(zs_comm *c);
/* t on every rank becomes root's t. */
zs_status zs_comm_broadcast(zs_comm *c, zs_tensor *t, int root);
/* In place: t = sum over ranks (average: divided by the size; floats). */
zs_status zs_comm_allreduce(zs_comm *c, zs_tensor *t, bool average,
                            zs_allreduce_algo algo);
/* In place on root: t = sum over ranks; other ranks' t unchanged. */
zs_status zs_comm_reduce(zs_comm *c, zs_tensor *t, int root);
/* out [size * numel(in)] (any shape with that numel) = concatenation of
 * every rank's in, in rank order. */
zs_status zs_comm_allgather(zs_comm *c, const zs_tensor *in, zs_tensor *out);
/* out (numel n) = sum over ranks of chunk `rank` of in (numel size * n). */
zs_status zs_comm_reduce_scatter(zs_comm *c, const zs_tensor *in,
                                 zs_tensor *out);
/* Root's in (numel size * n) is cut in rank order into every out (n). */
zs_status zs_comm_scatter(zs_comm *c, const zs_tensor *in, zs_tensor *out,
                          int root);
/* Root's out (size * n) receives every rank's in (n) in rank order; out
 * is ignored (may be NULL) on other ranks. */
zs_status zs_comm_gather(zs_comm *c, const zs_tensor *in, zs_tensor *out,
                         int root);
zs_status zs_comm_send(zs_comm *c, const zs_tensor *t, int dst, int tag);
zs_status zs_comm_recv(zs_comm *c, zs_tensor *t, int src, int tag);

#ifdef __cplusplus
}
#endif
#endif
