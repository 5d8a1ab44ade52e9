/*
 * zs/onebit.h - the compressed all-reduce of 1-bit Adam (Tang et al. 2021,
 * "1-bit Adam: Communication Efficient Large-Scale Training with Adam's
 * Convergence Speed"; DeepSpeed's compressed_allreduce): a buffer of f32
 * averaged over the ranks of a communicator while each rank sends about
 * 1/32 of the bytes of an f32 all-reduce.
 *
 * The buffer of n elements is cut into P chunks as the ring cuts it
 * (chunk j = [n*j/P, n*(j+1)/P)); rank j is the "server" of chunk j.
 * One call:
 *   1. worker (every rank, every chunk): c = x + worker_error; compress c
 *      (below); worker_error = c - decompress(c); send the packet of chunk
 *      j to rank j;
 *   2. server (rank r, its chunk): a = sum over ranks i, in rank order, of
 *      (1/P) * decompress(packet from i), accumulated in f32 from 0;
 *      c = a + server_error; compress; server_error = c - decompress(c);
 *      send that packet to every rank;
 *   3. every rank: x = the decompressed server packets of every chunk, so
 *      all ranks end with the same x (to the bit).
 * Compression of len elements in blocks of `block` (the last block of a
 * chunk may be shorter): per block one f32 scale s = ||c_b||_2 /
 * sqrt(len_b) (DeepSpeed's; the sum of squares in double, rounded to f32
 * once) and one sign bit per element, 1 for c >= 0 (also -0 and NaN, as
 * DeepSpeed's sign().add_(1).bool()); decompress(c)_k = bit ? s : -s. A
 * packet is the block scales (f32, host byte order) followed by the sign
 * bits, 8 per byte, element k in bit k % 8 of byte k / 8. DeepSpeed keeps
 * one scale per tensor; a scale per block (2048 elements by default: 1.6%
 * more bytes) follows layers of different magnitude within a flat buffer.
 *
 * The error buffers (worker: n elements; server: its chunk) start at zero
 * and carry what compression dropped into the next call, so nothing is
 * lost over time: the sum of what the ranks contributed and the sum of
 * what they received differ by the current errors only.
 *
 * Transport: the communicator's point-to-point messages (an all-to-all,
 * then an all-gather of the server packets, both as P - 1 sends and
 * receives per rank), subject to its timeout and checks (zs/dist.h).
 * Tensors are contiguous f32 CPU tensors. Threads: the thread that
 * initialised MPI.
 */
#ifndef ZS_ONEBIT_H
#define ZS_ONEBIT_H

#include "dist.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct zs_onebit zs_onebit;

/* Default elements per scale. */
#define ZS_ONEBIT_BLOCK 2048

typedef struct zs_onebit_stats {
    int64_t calls;
    int64_t bytes_sent;       /* this rank, all calls: counted as they are sent */
    int64_t last_bytes_sent;  /* this rank, the last call */
} zs_onebit_stats;

/* A compressed all-reduce of buffers of n (>= 1) f32 elements over c
 * (borrowed; it must outlive ob), with block elements per scale (a
 * multiple of 8; 0: ZS_ONEBIT_BLOCK). Local (no message). Returns a new
 * object (zs_onebit_free) with zeroed error buffers, or NULL and an
 * error. */
zs_onebit *zs_onebit_new(zs_comm *c, int64_t n, int64_t block);
void zs_onebit_free(zs_onebit *ob);
/* In place: x (contiguous f32 CPU tensor of n elements) becomes the
 * compressed average over the ranks described above; the error buffers
 * advance. Collective over c: every rank calls it with its own x. One
 * rank runs the same compression (nothing is sent). Fails before any
 * message for a bad tensor; a transport failure or timeout breaks c as
 * zs/dist.h says. */
zs_status zs_onebit_allreduce(zs_onebit *ob, zs_tensor *x);
/* Zeroes both error buffers (a resumed run starts them afresh, as
 * DeepSpeed's load_state_dict does). */
void zs_onebit_reset(zs_onebit *ob);
void zs_onebit_get_stats(const zs_onebit *ob, zs_onebit_stats *s);
/* The error buffers, borrowed (tests): the worker's n elements and the
 * server's *len elements of this rank's chunk. */
const float *zs_onebit_worker_error(const zs_onebit *ob);
const float *zs_onebit_server_error(const zs_onebit *ob, int64_t *len);

/* Bytes rank `rank` of P sends in one zs_onebit_allreduce of n elements
 * (0 for P = 1): the packets of the other ranks' chunks, then its server
 * packet to each of the P - 1 others; about 2 (P-1)/P * n (1/8 + 4/block)
 * bytes. */
int64_t zs_onebit_bytes(int64_t n, int64_t block, int P, int rank);
/* The baseline: bytes rank `rank` of P sends in a ring all-reduce of n
 * elements of elem_bytes each (src/parallel/ring.c's chunking: all
 * chunks but one in the reduce-scatter, all but another in the
 * all-gather; about 2 (P-1)/P * n * elem_bytes). */
int64_t zs_onebit_ring_bytes(int64_t n, int64_t elem_bytes, int P, int rank);

#ifdef __cplusplus
}
#endif
#endif
