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
    double check_at;        /* last deadline check (zsi_expired), seconds */
    double stalled;         /* longest gap between two checks since the
                             * last zsi_deadline: this process not running */
    int64_t tp_sent;        /* bytes sent by the tensor-parallel operators
                             * (tp.c) on this group, ring volume */
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

/* Deadline for a wait starting now, from c's timeout (0: none). Starts
 * the stall watch that zsi_expired keeps. */
double zsi_deadline(zs_comm *c);
/* True when deadline dl (> 0) has passed. Also records the longest gap
 * between two calls: a wait that expired while this process itself was
 * stopped or starved (gap > timeout / 2) is reported as that, not as the
 * peers' fault (zsi_timeout). */
bool zsi_expired(zs_comm *c, double dl);
/* Completes n requests on c before `deadline` (0: none, a blocking wait);
 * *expired says the deadline passed first (the requests are then still
 * pending). Polls with zsi_idle_pause between tests; without a deadline
 * it blocks in the backend's wait instead, unless oversubscribed. */
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

/* ---- idling between polls (idle.c) ------------------------------------- */

/* The pause schedule of one wait: spin, then yield, then growing naps
 * (idle.c). Caller-allocated; zsi_idle_init before the first pause. */
typedef struct zsi_idle {
    bool polite;    /* no spin phase: oversubscribed host, or asked */
    double cap;     /* the longest nap, seconds (zsi_idle_cap) */
    double start;   /* time of the first pause */
    double nap;     /* the last nap, seconds (0: none yet) */
    int calls;      /* pauses since init or reset */
    int naps;       /* naps taken since init (never reset) */
} zsi_idle;

/* True when this host runs more ranks of the job than it has online CPUs
 * (the launcher's local size, e.g. OMPI_COMM_WORLD_LOCAL_SIZE), or
 * OpenMPI was asked for mpi_yield_when_idle; ZS_COMM_IDLE=spin or =polite
 * overrides. Read once per process. */
bool zsi_oversubscribed(void);
/* The same decision from the environment now, not cached (for tests). */
bool zsi_idle_detect(void);
/* The longest nap of a wait on c: 200 us, at most c's timeout / 100. */
double zsi_idle_cap(const zs_comm *c);
/* Starts the schedule of a wait on c (c may be NULL: no timeout);
 * polite: never spin (forced when zsi_oversubscribed). */
void zsi_idle_init(zsi_idle *w, const zs_comm *c, bool polite);
/* Back to the start of the schedule (the wait made progress). */
void zsi_idle_reset(zsi_idle *w);
/* One pause after a poll that found nothing done: returns at once, yields
 * the CPU, or sleeps up to w->cap. Checks no deadline: the caller does
 * (zsi_expired) between pauses. */
void zsi_idle_pause(zsi_idle *w);

/* ---- the bucket engine (buckets.c), shared by dp.c and zero.c ----------- */

/* One bucket: flat elements [lo, lo + len) holding whole parameters.
 * Bucket 0 ends at the buffer's end; lo descends with the index and the
 * last bucket reaches 0. */
typedef struct zsi_bucket {
    int64_t lo, len;
    int nparams;
    int group;            /* by units: the caller's unit, -1 for a kept run */
    /* this round (zsi_buckets_begin .. the bucket's start): */
    int pending;          /* parameters whose gradient is not final yet */
    int nready;           /* ready[0..nready): leaves whose gradient is final */
    zs_tensor **ready;
    int64_t ready_bytes;  /* bytes of their gradients */
} zsi_bucket;

typedef struct zsi_bucket_ops {
    /* Bucket k is complete (or forced) and every bucket before it has
     * started: start its reduction. b[k].ready lists its leaves whose
     * gradients are final (emptied after the call). Failures are the
     * user's to record. */
    void (*ready)(void *ctx, int k);
    /* After each grad-ready event the engine handled (may be NULL): a
     * place to advance the reductions in flight. */
    void (*after_event)(void *ctx);
} zsi_bucket_ops;

typedef struct zsi_buckets {
    zsi_bucket *b;
    int nb, next;         /* next: the lowest bucket not started this round */
    const zs_tensor *flat;
    bool by_grad;         /* leaves are found by their .grad's view (dp)
                           * rather than their own (ZeRO) */
    int64_t total;        /* elements of flat */
    int64_t waiting, peak; /* final gradient bytes whose bucket has not
                            * started: now, and the most this round */
    zsi_bucket_ops ops;
    void *ctx;
    int hook;             /* grad-ready hook id while listening, else 0 */
    zs_tensor **ready;    /* storage of the buckets' ready lists */
} zsi_buckets;

/* Plans the buckets of n parameters whose views (their .grad with
 * by_grad) lie in `flat` (a contiguous 1-D buffer): by size, closed once
 * a bucket reaches `limit` elements (<= 0: one bucket), or, with group
 * (group[i]: parameter i's unit >= 0, or -1), one bucket per maximal run
 * of one unit in flat order (a unit split in two runs is an error).
 * Borrows params and flat; ops is copied; `who` prefixes messages. Returns
 * a new engine (zsi_buckets_free) or NULL and an error. */
zsi_buckets *zsi_buckets_new(const char *who, int n, zs_tensor *const *params,
                             const zs_tensor *flat, bool by_grad, int64_t limit,
                             const int *group, const zsi_bucket_ops *ops, void *ctx);
void zsi_buckets_free(zsi_buckets *e);
/* The bucket holding flat element off, or -1. */
int zsi_buckets_find(const zsi_buckets *e, int64_t off);
/* Starts a round: every bucket waits for all of its parameters. listen:
 * hear this thread's grad-ready events (a hook added to the autograd
 * engine's list) until zsi_buckets_finish. */
zs_status zsi_buckets_begin(zsi_buckets *e, bool listen);
/* Ends a round: stops listening; start_rest hands the buckets not started
 * yet to `ready`, in order; otherwise they are skipped. */
void zsi_buckets_finish(zsi_buckets *e, bool start_rest);

/* Ring and request internals (ring.c). */
zs_status zsi_request_progress(zs_request *r);

#endif
