/*
 * ring.c - all-reduce, blocking and non-blocking: the backend's own
 * (MPI_Iallreduce under MPI: ZS_ALLREDUCE_MPI) or Zhisuan's ring on the
 * backend's point-to-point messages (ZS_ALLREDUCE_RING).
 *
 * The ring cuts the n elements into `size` chunks, chunk k = [n*k/P,
 * n*(k+1)/P) (sizes differ by at most one; some are empty when n < P). In
 * P-1 reduce-scatter steps rank r sends chunk (r-s) to its right
 * neighbour and adds the chunk (r-s-1) received from its left, so it ends
 * owning the full sum of chunk r+1; P-1 all-gather steps then pass the
 * finished chunks around. Each rank sends 2(P-1)/P of the tensor: the
 * bandwidth-optimal volume (bench/collectives compares it with MPI's).
 *
 * A ring is a request whose state is the step it is in: each step posts a
 * receive from the left and a send to the right on the communicator's
 * PRIVATE channel, with a tag of its own (rings started in the same
 * order on every rank get the same tag), so several rings can be in flight
 * at once (gradient buckets). The ring advances only inside a progress
 * call (zs_request_test, zs_comm_progress, zs_request_wait), which
 * advances every unfinished request of the communicator: no helper
 * thread, so MPI_THREAD_FUNNELED suffices. One rank is a ring of no
 * steps.
 */
#include <stdlib.h>
#include <string.h>

#include "parallel/internal.h"

#define CH_LO(n, P, k) ((n) * (int64_t)(k) / (P))
#define CH_N(n, P, k) (CH_LO(n, P, (k) + 1) - CH_LO(n, P, k))

static void unlink_request(zs_request *r)
{
    for (zs_request **p = &r->c->active; *p; p = &(*p)->next)
        if (*p == r) {
            *p = r->next;
            break;
        }
    r->next = NULL;
}

/* Marks r finished with status st (its message saved for the waiter). A
 * failed request's pending receive is cancelled; if a send or a backend
 * collective is still pending, its buffers are kept for ever (the backend
 * may still read or write them). */
static void complete(zs_request *r, zs_status st)
{
    r->st = st;
    r->done = true;
    unlink_request(r);
    if (st == ZS_OK) {
        if (r->average)
            zsi_scale(r->t, 1.0 / r->c->size);
        return;
    }
    snprintf(r->err, sizeof r->err, "%s", zs_last_error());
    zs_comm *c = r->c;
    if (r->algo == ZS_ALLREDUCE_RING)
        c->be->cancel_recv(c, &r->rq[0]);
    bool pending = false;
    for (int i = 0; i < 2; i++) {
        bool done = true;
        if (zsi_req_pending(r->rq[i]))
            c->be->test(c, "allreduce", 1, &r->rq[i], &done, NULL);
        pending |= !done;
        c->orphans += !done;
    }
    if (pending) {
        r->t = NULL;
        r->tmp = NULL;
    }
}

static const char *ring_op = "allreduce (ring)";

/* Posts the transfers of step r->step. */
static zs_status ring_post(zs_request *r)
{
    zs_comm *c = r->c;
    int P = c->size, me = c->rank, s = r->step;
    int right = (me + 1) % P, left = (me + P - 1) % P, send, recv;
    int64_t n = zs_numel(r->t), es = (int64_t)zs_dtype_size(r->t->dtype);
    char *d = zs_data(r->t);
    void *into;
    if (s < P - 1) { /* reduce-scatter */
        send = (me - s + P) % P;
        recv = (me - s - 1 + 2 * P) % P;
        into = r->tmp;
    } else { /* all-gather */
        int g = s - (P - 1);
        send = (me + 1 - g + P) % P;
        recv = (me - g + P) % P;
        into = d + CH_LO(n, P, recv) * es;
    }
    zs_status st = c->be->irecv(c, ring_op, ZSI_CHAN_PRIVATE, into, CH_N(n, P, recv) * es,
                                left, r->tag, &r->rq[0]);
    if (st == ZS_OK)
        st = c->be->isend(c, ring_op, ZSI_CHAN_PRIVATE, d + CH_LO(n, P, send) * es,
                          CH_N(n, P, send) * es, right, r->tag, &r->rq[1]);
    return st;
}

static bool ring_finished(const zs_request *r) { return r->step >= 2 * (r->c->size - 1); }

/* The step's transfers are done: add the received chunk, post the next. */
static zs_status ring_next(zs_request *r)
{
    int P = r->c->size;
    if (r->step < P - 1) {
        int64_t n = zs_numel(r->t);
        int k = (r->c->rank - r->step - 1 + 2 * P) % P;
        size_t es = zs_dtype_size(r->t->dtype);
        zsi_add_into(r->t->dtype, (char *)zs_data(r->t) + CH_LO(n, P, k) * (int64_t)es,
                     r->tmp, CH_N(n, P, k));
    }
    r->step++;
    return ring_finished(r) ? ZS_OK : ring_post(r);
}

/* Advances a ring as far as its messages have arrived, without blocking. */
static zs_status ring_progress(zs_request *r)
{
    while (!ring_finished(r)) {
        bool done = false;
        zs_status st = r->c->be->test(r->c, ring_op, 2, r->rq, &done, NULL);
        if (st != ZS_OK)
            return st;
        if (!done)
            return ZS_OK;
        if ((st = ring_next(r)) != ZS_OK)
            return st;
    }
    return ZS_OK;
}

static zs_status ring_start(zs_request *r)
{
    zs_comm *c = r->c;
    r->tag = ZSI_TAG_RING0 + (int)(c->rings++ % ZSI_RING_TAGS);
    r->step = 0;
    if (ring_finished(r)) /* one rank */
        return ZS_OK;
    int64_t maxchunk = (zs_numel(r->t) + c->size - 1) / c->size;
    r->tmp = malloc((size_t)(maxchunk ? maxchunk : 1) * zs_dtype_size(r->t->dtype));
    if (!r->tmp)
        return zs_set_error_code(ZS_ERR_NOMEM, "allreduce (ring): out of memory");
    return ring_post(r);
}

/* Advances one unfinished request without blocking. */
zs_status zsi_request_progress(zs_request *r)
{
    if (r->done)
        return r->st;
    zs_status st;
    bool fin;
    if (r->algo == ZS_ALLREDUCE_RING) {
        st = ring_progress(r);
        fin = st != ZS_OK || ring_finished(r);
    } else {
        st = r->c->be->test(r->c, "allreduce", 1, &r->rq[0], &fin, NULL);
        fin = fin || st != ZS_OK;
    }
    if (fin)
        complete(r, st);
    return st;
}

zs_status zs_comm_progress(zs_comm *c)
{
    if (!c)
        return zs_set_error("progress: NULL communicator");
    zs_status st = ZS_OK;
    for (zs_request *r = c->active, *next; r; r = next) {
        next = r->next; /* r may unlink itself */
        zs_status s = c->broken ? zsi_check_comm("allreduce", c) : zsi_request_progress(r);
        if (c->broken && !r->done)
            complete(r, s);
        if (st == ZS_OK)
            st = s;
    }
    return st;
}

/* zs_comm_iallreduce with the failure's status in *out. */
static zs_request *start(zs_comm *c, zs_tensor *t, bool average, zs_allreduce_algo algo,
                         zs_status *out)
{
    const char *op = "allreduce";
    zs_status st = *out = zsi_check_comm(op, c);
    if (st != ZS_OK)
        return NULL;
    st = zsi_check_tensor(op, t, true);
    if (st == ZS_OK && algo != ZS_ALLREDUCE_MPI && algo != ZS_ALLREDUCE_RING)
        st = zs_set_error("allreduce: unknown algorithm %d", (int)algo);
    if (st == ZS_OK && average && t->dtype != ZS_F32 && t->dtype != ZS_F64)
        st = zs_set_error("allreduce: average of %s would truncate (float dtypes only)",
                          zs_dtype_name(t->dtype));
    st = zsi_agree(c, op, ZSI_OP_ALLREDUCE, t ? (int)t->dtype : -1, t ? zs_numel(t) : -1,
                   (int)algo * 2 + average, st);
    zs_request *r = st == ZS_OK ? calloc(1, sizeof *r) : NULL;
    if (st == ZS_OK && !r)
        st = zs_set_error_code(ZS_ERR_NOMEM, "allreduce: out of memory");
    *out = st;
    if (!r)
        return NULL;
    r->c = c;
    r->t = zs_retain(t);
    r->average = average;
    r->algo = algo;
    r->next = c->active;
    c->active = r;
    if (algo == ZS_ALLREDUCE_RING)
        st = ring_start(r);
    else
        st = c->be->iallreduce(c, op, zs_data(t), zs_numel(t), t->dtype, &r->rq[0]);
    bool idle = !zsi_req_pending(r->rq[0]) && !zsi_req_pending(r->rq[1]);
    if (st != ZS_OK || idle) /* idle: one process, the sum is t itself */
        complete(r, st);
    return r;
}

zs_request *zs_comm_iallreduce(zs_comm *c, zs_tensor *t, bool average,
                               zs_allreduce_algo algo)
{
    zs_status st;
    return start(c, t, average, algo, &st);
}

zs_status zs_request_test(zs_request *r, bool *done)
{
    if (!r) {
        if (done)
            *done = true;
        return ZS_ERR_ARG;
    }
    if (!r->done)
        zs_comm_progress(r->c);
    if (done)
        *done = r->done;
    if (r->done && r->st != ZS_OK)
        return zs_set_error_code(r->st, "%s", r->err);
    return ZS_OK;
}

static void request_free(zs_request *r)
{
    unlink_request(r);
    free(r->tmp);
    zs_release(r->t);
    free(r);
}

/* Blocks until r is done or c's deadline passes, advancing every request
 * of c meanwhile, with zsi_idle_pause between rounds that found nothing
 * done (its schedule restarts when r's ring takes a step). Without a
 * deadline, a lone request waits in the backend's wait (no polling of our
 * own) unless the host is oversubscribed. */
static void wait_progress(zs_request *r)
{
    zs_comm *c = r->c;
    double dl = zsi_deadline(c);
    bool ring = r->algo == ZS_ALLREDUCE_RING;
    bool block = dl <= 0 && !zsi_oversubscribed();
    zsi_idle w;
    zsi_idle_init(&w, c, false);
    while (!r->done) {
        int step = r->step;
        zs_comm_progress(c);
        if (r->done)
            break;
        if (r->step != step)
            zsi_idle_reset(&w);
        if (block && c->active == r && r->next == NULL) {
            zs_status st = c->be->wait(c, ring ? ring_op : "allreduce", ring ? 2 : 1, r->rq,
                                       NULL);
            if (st == ZS_OK && ring)
                st = ring_next(r);
            if (st != ZS_OK || !ring || ring_finished(r))
                complete(r, st);
        } else if (dl > 0 && zsi_expired(c, dl)) {
            int left = (c->rank + c->size - 1) % c->size;
            complete(r, zsi_timeout(c, ring ? ring_op : "allreduce", 0, NULL,
                                    ring ? left : -1, true));
        } else {
            zsi_idle_pause(&w);
        }
    }
}

zs_status zs_request_wait(zs_request *r)
{
    if (!r)
        return ZS_ERR_ARG;
    wait_progress(r);
    zs_status st = r->st;
    if (st != ZS_OK)
        zs_set_error_code(st, "%s", r->err);
    request_free(r);
    return st;
}

zs_status zs_comm_allreduce(zs_comm *c, zs_tensor *t, bool average,
                            zs_allreduce_algo algo)
{
    zs_status st;
    zs_request *r = start(c, t, average, algo, &st);
    return r ? zs_request_wait(r) : st;
}
