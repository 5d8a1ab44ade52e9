/*
 * parallel/internal.h - what the files of the parallel layer share: the
 * communicator and request structures, the failure machinery of comm.c
 * (waits against a deadline, the timeout survey, the argument agreement)
 * and the bucket engine of buckets.c. Not public.
 *
 * A communicator is generic state (rank, size, timeout, checks, the broken
 * flag, the requests in flight) plus a backend (backend.h) that moves the
 * bytes: MPI, or one process.
 */
#ifndef ZS_PARALLEL_INTERNAL_H
#define ZS_PARALLEL_INTERNAL_H

#include "core/internal.h"
#include "parallel/backend.h"
#include "zs/dist.h"

/* Operation ids for the argument agreement (and its messages). */
enum {
    ZSI_OP_BARRIER = 1, ZSI_OP_BROADCAST, ZSI_OP_ALLREDUCE, ZSI_OP_REDUCE,
    ZSI_OP_ALLGATHER, ZSI_OP_REDUCE_SCATTER, ZSI_OP_SCATTER, ZSI_OP_GATHER,
};

/* Tags on the PRIVATE channel: the survey, then one ring tag per started
 * ring (mod). */
#define ZSI_TAG_SURVEY 1
#define ZSI_TAG_RING0 100
#define ZSI_RING_TAGS 30000

struct zs_comm {
    const zsi_comm_backend *be;
    void *impl;             /* the backend's state */
    int rank, size;
    double timeout;         /* seconds; 0 = wait forever */
    bool checks;            /* cross-rank argument agreement */
    bool broken;            /* after a timeout or transport error */
    char why[384];          /* the message that broke it */
    uint32_t rings;         /* ring all-reduces started (their tags) */
    zs_request *active;     /* unfinished requests, linked by next */
    int orphans;            /* transfers abandoned on a timeout */
};

struct zs_request {
    zs_comm *c;
    zs_tensor *t;           /* retained until the request is freed */
    bool average, done;
    zs_allreduce_algo algo;
    zs_status st;
    char err[384];          /* message of a failed request */
    zs_request *next;       /* in c->active while unfinished */
    zsi_req rq[2];          /* ring: recv, send; the backend's: rq[0] */
    int step, tag;          /* ring: step in [0, 2(size-1)] */
    void *tmp;              /* ring: one received chunk */
};

/* Seconds on a monotonic clock. */
double zsi_now(void);
/* True when c spans several processes. */
bool zsi_multi(const zs_comm *c);
/* Fails with "op: communicator unusable ..." when c is NULL or broken. */
zs_status zsi_check_comm(const char *op, const zs_comm *c);
/* Checks a tensor is contiguous on the CPU (and summable, if sum). */
zs_status zsi_check_tensor(const char *op, const zs_tensor *t, bool sum);
/* Marks c broken with the current error message; returns st. */
zs_status zsi_break(zs_comm *c, zs_status st);
/* dst[i] += src[i] for n elements of a summable dtype. */
void zsi_add_into(zs_dtype dt, void *dst, const void *src, int64_t n);
/* t *= s for float dtypes. */
void zsi_scale(zs_tensor *t, double s);
/* Argument agreement: when c->checks is on and c spans processes, every
 * rank contributes (op, dtype, numel, root, local) and all fail alike if
 * any differs or any rank's local check failed; otherwise returns local. */
zs_status zsi_agree(zs_comm *c, const char *op, int opid, int dtype,
                    int64_t numel, int root, zs_status local);

/* Deadline for a wait starting now, from c's timeout (0: none). */
double zsi_deadline(const zs_comm *c);
/* Completes n requests on c before `deadline` (0: none, a blocking wait);
 * *expired says the deadline passed first (the requests are then still
 * pending). */
zs_status zsi_poll(zs_comm *c, const char *op, int n, zsi_req *rq, double deadline,
                   bool *expired);
/* zsi_poll, then on expiry zsi_timeout (survey unless peer >= 0). */
zs_status zsi_wait(zs_comm *c, const char *op, int n, zsi_req *rq, double deadline,
                   int peer);
/* The timeout failure: abandons the n requests (left to the backend,
 * never freed: c->orphans counts them), then with ask surveys the ranks
 * and breaks c with a message naming those that did not answer, or
 * without ask (point-to-point) names the peer. Returns ZS_ERR_IO. */
zs_status zsi_timeout(zs_comm *c, const char *op, int n, zsi_req *rq, int peer, bool ask);

/* Gradient buckets (buckets.c), shared by data parallelism (dp.c) and
 * ZeRO (zero.c). A flat buffer of `total` elements holds n parameters at
 * element offsets off[] (any order; they tile [0, total)). It is cut into
 * buckets of whole parameters from its end backwards (backward produces
 * the last layers' gradients first): bucket 0 holds the highest offsets,
 * bucket k covers [lo[k], k ? lo[k-1] : total), with cnt[k] parameters,
 * closed once it reaches `limit` elements (<= 0: one bucket). lo and cnt
 * have room for n + 1 entries. Returns the bucket count (>= 1), or -1
 * when out of memory. */
int zsi_plan_buckets(int n, const int64_t *off, int64_t total, int64_t limit,
                     int64_t *lo, int *cnt);
/* The bucket holding element off (lo descending as above), or -1. */
int zsi_find_bucket(int nb, const int64_t *lo, int64_t total, int64_t off);

/* Ring and request internals (ring.c). */
zs_status zsi_request_progress(zs_request *r);

#endif
