/*
 * pipeline.c - pipeline parallelism as library pieces (contracts in
 * zs/tp.h): the GPipe and 1F1B schedules as pure functions, a model-clock
 * simulation of them (the bubble), and zs_pipe, the point-to-point channel
 * between neighbouring stages.
 *
 * Sends never block: each is started on the backend (backend.h) and kept,
 * with its tensor retained, until a later call finds it complete or
 * zs_pipe_flush waits for it. With blocking (rendezvous) sends, 1F1B
 * deadlocks as soon as two neighbours both send before receiving, which
 * its steady phase does. Receives block. Tags: 2 mb + kind, so that every
 * (kind, micro-batch) is its own message stream on the USER channel.
 */
#include <stdlib.h>
#include <string.h>

#include "parallel/internal.h"
#include "zs/tp.h"

#define MAX_MB 16383

/* ---- schedules --------------------------------------------------------- */

zs_status zs_pp_schedule_parse(const char *name, zs_pp_schedule *s)
{
    if (name && !strcmp(name, "gpipe")) {
        *s = ZS_PP_GPIPE;
        return ZS_OK;
    }
    if (name && !strcmp(name, "1f1b")) {
        *s = ZS_PP_1F1B;
        return ZS_OK;
    }
    return zs_set_error("pipeline schedule '%s': expected gpipe or 1f1b",
                        name ? name : "(null)");
}

const char *zs_pp_schedule_name(zs_pp_schedule s)
{
    return s == ZS_PP_GPIPE ? "gpipe" : s == ZS_PP_1F1B ? "1f1b" : "?";
}

zs_status zs_pp_schedule_make(zs_pp_schedule sched, int s, int p, int m, zs_pp_action *out)
{
    if (p < 1 || s < 0 || s >= p || m < 1 || m > MAX_MB + 1 || !out ||
        (sched != ZS_PP_GPIPE && sched != ZS_PP_1F1B))
        return zs_set_error("pipeline schedule: stage %d of %d with %d micro-batches "
                            "(schedule %d): expected 0 <= stage < stages and 1 <= "
                            "micro-batches <= %d", s, p, m, (int)sched, MAX_MB + 1);
    int k = 0, f = 0, b = 0;
    int warm = sched == ZS_PP_GPIPE ? m : (p - s - 1 < m ? p - s - 1 : m);
    while (f < warm)
        out[k++] = (zs_pp_action){false, f++};
    while (f < m) { /* steady 1F1B: one forward, then the oldest backward */
        out[k++] = (zs_pp_action){false, f++};
        out[k++] = (zs_pp_action){true, b++};
    }
    while (b < m)
        out[k++] = (zs_pp_action){true, b++};
    return ZS_OK;
}

double zs_pp_bubble(int p, int m)
{
    return m > 0 ? (double)(p - 1) / (double)m : 0.0;
}

/* Model-clock simulation: stage s runs its actions in order; an action
 * starts when the stage is free and its input exists (a forward needs
 * stage s-1's forward of the micro-batch, a backward stage s+1's
 * backward, and the last stage's backward its own forward, which its
 * order already ensures). */
typedef struct sim {
    int p, m;
    zs_pp_action *acts; /* [p][2m] */
    int *next;          /* [p] next action index */
    double *free_at;    /* [p] */
    double *fdone, *bdone; /* [p][m] finish times, -1: not yet */
} sim;

/* Finish time of the action a depends on, -1 if not finished, 0 if none. */
static double dep_time(const sim *S, int s, zs_pp_action a)
{
    if (!a.backward)
        return s == 0 ? 0 : S->fdone[(s - 1) * S->m + a.mb];
    return s == S->p - 1 ? S->fdone[s * S->m + a.mb] : S->bdone[(s + 1) * S->m + a.mb];
}

static bool sim_step(sim *S, double tf, double tb)
{
    bool moved = false;
    for (int s = 0; s < S->p; s++) {
        while (S->next[s] < 2 * S->m) {
            zs_pp_action a = S->acts[s * 2 * S->m + S->next[s]];
            double dep = dep_time(S, s, a);
            if (dep < 0)
                break;
            double start = dep > S->free_at[s] ? dep : S->free_at[s];
            S->free_at[s] = start + (a.backward ? tb : tf);
            (a.backward ? S->bdone : S->fdone)[s * S->m + a.mb] = S->free_at[s];
            S->next[s]++;
            moved = true;
        }
    }
    return moved;
}

zs_status zs_pp_simulate(zs_pp_schedule sched, int p, int m, double t_fwd, double t_bwd,
                         double *bubble)
{
    if (p < 1 || m < 1 || !(t_fwd > 0) || !(t_bwd > 0) || !bubble)
        return zs_set_error("pipeline simulate: %d stages, %d micro-batches, times "
                            "%g and %g: expected positive values", p, m, t_fwd, t_bwd);
    sim S = {.p = p, .m = m};
    size_t pm = (size_t)p * (size_t)m;
    S.acts = malloc(2 * pm * sizeof *S.acts);
    S.next = calloc((size_t)p, sizeof *S.next);
    S.free_at = calloc((size_t)p, sizeof *S.free_at);
    S.fdone = malloc(pm * sizeof *S.fdone);
    S.bdone = malloc(pm * sizeof *S.bdone);
    zs_status st = S.acts && S.next && S.free_at && S.fdone && S.bdone
                       ? ZS_OK : zs_set_error_code(ZS_ERR_NOMEM, "pipeline simulate: "
                                                   "out of memory");
    for (size_t i = 0; st == ZS_OK && i < pm; i++)
        S.fdone[i] = S.bdone[i] = -1;
    for (int s = 0; st == ZS_OK && s < p; s++)
        st = zs_pp_schedule_make(sched, s, p, m, S.acts + (size_t)s * 2 * (size_t)m);
    while (st == ZS_OK && sim_step(&S, t_fwd, t_bwd))
        ;
    double span = 0;
    for (int s = 0; st == ZS_OK && s < p; s++) {
        if (S.next[s] < 2 * m)
            st = zs_set_error_code(ZS_ERR_STATE, "pipeline simulate: %s deadlocks at "
                                   "stage %d, action %d", zs_pp_schedule_name(sched), s,
                                   S.next[s]);
        span = S.free_at[s] > span ? S.free_at[s] : span;
    }
    if (st == ZS_OK) {
        double ideal = m * (t_fwd + t_bwd);
        *bubble = (span - ideal) / ideal;
    }
    free(S.acts);
    free(S.next);
    free(S.free_at);
    free(S.fdone);
    free(S.bdone);
    return st;
}

/* ---- the channel -------------------------------------------------------- */

typedef struct pending {
    zsi_req rq;
    zs_tensor *t;   /* retained */
    int peer;
} pending;

struct zs_pipe {
    zs_comm *c;     /* borrowed */
    pending *q;
    int n, cap;
    int64_t sent;   /* bytes */
};

zs_pipe *zs_pipe_new(zs_comm *pp)
{
    if (zsi_check_comm("pipe", pp) != ZS_OK)
        return NULL;
    zs_pipe *p = calloc(1, sizeof *p);
    if (!p)
        zs_set_error_code(ZS_ERR_NOMEM, "pipe: out of memory");
    else
        p->c = pp;
    return p;
}

/* The peer of a transfer of kind: sends (send true) of activations go to
 * stage + 1, of gradients to stage - 1; receives the reverse. */
static zs_status peer_of(const char *op, zs_pipe *p, zs_pipe_kind kind, int mb,
                         bool send, int *peer)
{
    zs_status st = p ? zsi_check_comm(op, p->c) : zs_set_error("%s: NULL pipe", op);
    if (st != ZS_OK)
        return st;
    if (kind != ZS_PIPE_ACT && kind != ZS_PIPE_GRAD)
        return zs_set_error("%s: kind %d is neither activation nor gradient", op, (int)kind);
    if (mb < 0 || mb > MAX_MB)
        return zs_set_error("%s: micro-batch %d outside [0, %d]", op, mb, MAX_MB);
    int stage = p->c->rank, n = p->c->size;
    bool up = (kind == ZS_PIPE_ACT) == send;
    *peer = up ? stage + 1 : stage - 1;
    if (*peer < 0 || *peer >= n)
        return zs_set_error("%s: stage %d of %d has no %s stage to %s %s of "
                            "micro-batch %d", op, stage, n, up ? "next" : "previous",
                            send ? "send" : "receive",
                            kind == ZS_PIPE_ACT ? "activations" : "gradients", mb);
    return ZS_OK;
}

/* Frees the completed sends (without blocking). */
static zs_status reap(zs_pipe *p)
{
    int k = 0;
    zs_status st = ZS_OK;
    for (int i = 0; i < p->n; i++) {
        bool done = false;
        if (st == ZS_OK)
            st = p->c->be->test(p->c, "pipe send", 1, &p->q[i].rq, &done, NULL);
        if (done && st == ZS_OK)
            zs_release(p->q[i].t);
        else
            p->q[k++] = p->q[i];
    }
    p->n = k;
    return st;
}

zs_status zs_pipe_send(zs_pipe *p, zs_pipe_kind kind, int mb, zs_tensor *t)
{
    int peer = -1;
    zs_status st = peer_of("pipe send", p, kind, mb, true, &peer);
    if (st == ZS_OK)
        st = zsi_check_tensor("pipe send", t, false);
    if (st == ZS_OK)
        st = reap(p);
    if (st == ZS_OK && p->n == p->cap) {
        int cap = p->cap ? 2 * p->cap : 8;
        pending *q = realloc(p->q, (size_t)cap * sizeof *q);
        if (!q)
            return zs_set_error_code(ZS_ERR_NOMEM, "pipe send: out of memory");
        p->q = q;
        p->cap = cap;
    }
    if (st != ZS_OK)
        return st;
    pending *e = &p->q[p->n];
    *e = (pending){ZSI_REQ_NONE, t, peer};
    st = p->c->be->isend(p->c, "pipe send", ZSI_CHAN_USER, zs_data(t),
                         (int64_t)zs_nbytes(t), peer, 2 * mb + (int)kind, &e->rq);
    if (st != ZS_OK)
        return st;
    zs_retain(t);
    p->n++;
    p->sent += (int64_t)zs_nbytes(t);
    return ZS_OK;
}

zs_status zs_pipe_recv(zs_pipe *p, zs_pipe_kind kind, int mb, zs_tensor *t)
{
    int peer = -1;
    zs_status st = peer_of("pipe recv", p, kind, mb, false, &peer);
    if (st == ZS_OK)
        st = reap(p);
    return st == ZS_OK ? zs_comm_recv(p->c, t, peer, 2 * mb + (int)kind) : st;
}

zs_status zs_pipe_flush(zs_pipe *p)
{
    if (!p)
        return zs_set_error("pipe flush: NULL pipe");
    zs_status st = zsi_check_comm("pipe flush", p->c);
    while (st == ZS_OK && p->n > 0) {
        pending *e = &p->q[p->n - 1];
        st = zsi_wait(p->c, "pipe send", 1, &e->rq, zsi_deadline(p->c), e->peer);
        if (st != ZS_OK)
            break; /* the tensor stays retained: the transport may still read it */
        zs_release(e->t);
        p->n--;
    }
    return st;
}

int zs_pipe_pending(const zs_pipe *p)
{
    return p ? p->n : 0;
}

int64_t zs_pipe_bytes_sent(const zs_pipe *p)
{
    return p ? p->sent : 0;
}

void zs_pipe_free(zs_pipe *p)
{
    if (!p)
        return;
    /* on a failure the pending sends' tensors stay retained (abandoned,
     * as the transport may still read them) */
    zs_pipe_flush(p);
    free(p->q);
    free(p);
}
