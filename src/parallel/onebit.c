/*
 * onebit.c - the compressed all-reduce of 1-bit Adam (zs/onebit.h): the
 * sign-and-scale compressor with error feedback, and the two exchanges
 * (worker packets to their servers, server packets to everyone) on the
 * communicator's point-to-point messages.
 *
 * Both exchanges are all-to-all patterns with packets of per-chunk sizes
 * (chunks differ by one element at most, so packets by a byte or a scale),
 * posted at once as P - 1 receives and P - 1 sends on the PRIVATE channel
 * and completed by one zsi_wait against the communicator's deadline. Every
 * size is known to both sides, so nothing but the packets travels. A
 * failed wait may leave the backend writing into the buffers: they are then
 * kept for ever (as ring.c keeps its chunks).
 *
 * Block arithmetic: blocks start at multiples of `block` (a multiple of 8)
 * from the chunk's start, so block b's signs start at byte b * block / 8;
 * the pool splits a chunk by whole blocks and each block's sum of squares
 * runs in order, so results do not depend on the thread count.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "parallel/internal.h"
#include "parallel/onebit.h"
#include "zs/onebit.h"

#define OP "onebit allreduce"
#define TAG_TO_SERVER 2  /* PRIVATE-channel tags: the survey is 1, rings 100.. */
#define TAG_FROM_SERVER 3
#define ONEBIT_ALGO 2    /* for the argument agreement: not MPI (0) nor ring (1) */

#define CH_LO(n, P, k) ((n) * (int64_t)(k) / (P))
#define CH_N(n, P, k) (CH_LO(n, P, (k) + 1) - CH_LO(n, P, k))

/* ---- the compressor ------------------------------------------------------- */

int64_t zsi_onebit_packet_bytes(int64_t n, int64_t block)
{
    return 4 * ((n + block - 1) / block) + (n + 7) / 8;
}

typedef struct codec {
    const float *x;
    float *err, *out;
    const uint8_t *in;
    uint8_t *packet;
    int64_t n, block, nb;
    float w;
} codec;

static float scale_at(const uint8_t *packet, int64_t b)
{
    float s;
    memcpy(&s, packet + 4 * b, sizeof s);
    return s;
}

/* Blocks [b0, b1) of one compression. */
static void compress_blocks(void *ctx, int64_t b0, int64_t b1)
{
    const codec *k = ctx;
    uint8_t *signs = k->packet + 4 * k->nb;
    for (int64_t b = b0; b < b1; b++) {
        int64_t lo = b * k->block, hi = lo + k->block < k->n ? lo + k->block : k->n;
        double ss = 0;
        for (int64_t i = lo; i < hi; i++) {
            float c = k->x[i] + k->err[i];
            ss += (double)c * c;
        }
        float s = (float)sqrt(ss / (double)(hi - lo));
        memcpy(k->packet + 4 * b, &s, sizeof s);
        memset(signs + lo / 8, 0, (size_t)((hi - lo + 7) / 8));
        for (int64_t i = lo; i < hi; i++) {
            float c = k->x[i] + k->err[i];
            bool pos = !(c < 0);
            signs[i / 8] |= (uint8_t)(pos << (i % 8));
            k->err[i] = c - (pos ? s : -s);
        }
    }
}

/* Blocks [b0, b1) of a decode (w == 0) or an accumulation. */
static void decode_blocks(void *ctx, int64_t b0, int64_t b1)
{
    const codec *k = ctx;
    const uint8_t *signs = k->in + 4 * k->nb;
    for (int64_t b = b0; b < b1; b++) {
        int64_t lo = b * k->block, hi = lo + k->block < k->n ? lo + k->block : k->n;
        float s = scale_at(k->in, b), ws = k->w * s;
        for (int64_t i = lo; i < hi; i++) {
            bool pos = (signs[i / 8] >> (i % 8)) & 1;
            if (k->w == 0)
                k->out[i] = pos ? s : -s;
            else
                k->out[i] += pos ? ws : -ws;
        }
    }
}

/* Blocks per pool task: about 64 Ki elements. */
static int64_t grain(int64_t block) { return block >= 65536 ? 1 : 65536 / block; }

void zsi_onebit_compress(const float *x, float *err, int64_t n, int64_t block,
                         uint8_t *packet)
{
    codec k = {.x = x, .err = err, .packet = packet, .n = n, .block = block,
               .nb = (n + block - 1) / block};
    zs_parallel_for(k.nb, grain(block), compress_blocks, &k);
}

void zsi_onebit_decode(const uint8_t *packet, int64_t n, int64_t block, float *out)
{
    codec k = {.in = packet, .out = out, .n = n, .block = block,
               .nb = (n + block - 1) / block};
    zs_parallel_for(k.nb, grain(block), decode_blocks, &k);
}

/* w * s is rounded once per block: the same f32 product as w * (±s). */
void zsi_onebit_accumulate(const uint8_t *packet, int64_t n, int64_t block, float w,
                           float *acc)
{
    codec k = {.in = packet, .out = acc, .n = n, .block = block,
               .nb = (n + block - 1) / block, .w = w};
    if (w == 0)
        return;
    zs_parallel_for(k.nb, grain(block), decode_blocks, &k);
}

/* ---- byte counts -------------------------------------------------------- */

int64_t zs_onebit_bytes(int64_t n, int64_t block, int P, int rank)
{
    if (P <= 1 || n < 0 || rank < 0 || rank >= P)
        return 0;
    block = block > 0 ? block : ZS_ONEBIT_BLOCK;
    int64_t sent = 0;
    for (int j = 0; j < P; j++)
        if (j != rank)
            sent += zsi_onebit_packet_bytes(CH_N(n, P, j), block);
    return sent + (P - 1) * zsi_onebit_packet_bytes(CH_N(n, P, rank), block);
}

int64_t zs_onebit_ring_bytes(int64_t n, int64_t elem_bytes, int P, int rank)
{
    if (P <= 1 || n < 0 || rank < 0 || rank >= P)
        return 0;
    /* reduce-scatter: every chunk but rank+1; all-gather: all but rank+2 */
    return elem_bytes * (2 * n - CH_N(n, P, (rank + 1) % P) - CH_N(n, P, (rank + 2) % P));
}

/* ---- the all-reduce ------------------------------------------------------- */

struct zs_onebit {
    zs_comm *c;
    int64_t n, block;
    int P, r;
    int64_t lo, len;      /* this rank's chunk */
    float *werr, *serr;   /* worker error (n), server error (len) */
    float *acc;           /* the server's average (len) */
    int64_t *off;         /* P + 1: chunk j's packet in the all-chunk layout */
    int64_t pk;           /* bytes of a packet of this rank's chunk */
    uint8_t *send;        /* the worker packets, all-chunk layout */
    uint8_t *in;          /* P packets of this rank's chunk (from each worker) */
    uint8_t *out;         /* the server packets, all-chunk layout */
    zsi_req *rq;          /* 2 (P - 1) */
    bool keep;            /* a failed exchange may still use the buffers */
    zs_onebit_stats st;
};

zs_onebit *zs_onebit_new(zs_comm *c, int64_t n, int64_t block)
{
    block = block ? block : ZS_ONEBIT_BLOCK;
    if (zsi_check_comm("onebit_new", c) != ZS_OK)
        return NULL;
    if (n < 1 || block < 8 || block % 8 != 0) {
        zs_set_error("onebit_new: %lld elements in blocks of %lld: expected n >= 1 and "
                     "a block that is a positive multiple of 8", (long long)n,
                     (long long)block);
        return NULL;
    }
    zs_onebit *ob = calloc(1, sizeof *ob);
    if (!ob)
        goto oom;
    int P = c->size, r = c->rank;
    *ob = (zs_onebit){.c = c, .n = n, .block = block, .P = P, .r = r,
                      .lo = CH_LO(n, P, r), .len = CH_N(n, P, r)};
    ob->off = calloc((size_t)P + 1, sizeof *ob->off);
    ob->rq = calloc(2 * (size_t)P, sizeof *ob->rq);
    if (!ob->off || !ob->rq)
        goto oom;
    for (int j = 0; j < P; j++)
        ob->off[j + 1] = ob->off[j] + zsi_onebit_packet_bytes(CH_N(n, P, j), block);
    ob->pk = zsi_onebit_packet_bytes(ob->len, block);
    ob->werr = calloc((size_t)n, sizeof *ob->werr);
    ob->serr = calloc((size_t)ob->len + 1, sizeof *ob->serr);
    ob->acc = malloc(((size_t)ob->len + 1) * sizeof *ob->acc);
    ob->send = malloc((size_t)ob->off[P] + 1);
    ob->out = malloc((size_t)ob->off[P] + 1);
    ob->in = malloc((size_t)(P * ob->pk) + 1);
    if (ob->werr && ob->serr && ob->acc && ob->send && ob->out && ob->in)
        return ob;
oom:
    zs_onebit_free(ob);
    zs_set_error_code(ZS_ERR_NOMEM, "onebit_new: out of memory for %lld elements",
                      (long long)n);
    return NULL;
}

void zs_onebit_free(zs_onebit *ob)
{
    if (!ob)
        return;
    if (!ob->keep) { /* else the backend may still write them */
        free(ob->send);
        free(ob->in);
        free(ob->out);
    }
    free(ob->werr);
    free(ob->serr);
    free(ob->acc);
    free(ob->off);
    free(ob->rq);
    free(ob);
}

void zs_onebit_reset(zs_onebit *ob)
{
    if (!ob)
        return;
    memset(ob->werr, 0, (size_t)ob->n * sizeof *ob->werr);
    memset(ob->serr, 0, (size_t)ob->len * sizeof *ob->serr);
}

void zs_onebit_get_stats(const zs_onebit *ob, zs_onebit_stats *s)
{
    *s = ob ? ob->st : (zs_onebit_stats){0};
}

const float *zs_onebit_worker_error(const zs_onebit *ob) { return ob ? ob->werr : NULL; }

const float *zs_onebit_server_error(const zs_onebit *ob, int64_t *len)
{
    if (len)
        *len = ob ? ob->len : 0;
    return ob ? ob->serr : NULL;
}

/* Posts a receive of the packet `recv_at(j)` from every other rank j and a
 * send of `send_at(j)` to every other rank j, then waits for all. */
static zs_status exchange(zs_onebit *ob, int tag, uint8_t *const *recv_at,
                          const int64_t *recv_bytes, uint8_t *const *send_at,
                          const int64_t *send_bytes, int64_t *sent)
{
    zs_comm *c = ob->c;
    int k = 0;
    zs_status st = ZS_OK;
    for (int j = 0; st == ZS_OK && j < ob->P; j++)
        if (j != ob->r) {
            ob->rq[k] = ZSI_REQ_NONE;
            st = c->be->irecv(c, OP, ZSI_CHAN_PRIVATE, recv_at[j], recv_bytes[j], j, tag,
                              &ob->rq[k++]);
        }
    for (int j = 0; st == ZS_OK && j < ob->P; j++)
        if (j != ob->r) {
            ob->rq[k] = ZSI_REQ_NONE;
            st = c->be->isend(c, OP, ZSI_CHAN_PRIVATE, send_at[j], send_bytes[j], j, tag,
                              &ob->rq[k++]);
            *sent += send_bytes[j];
        }
    if (st == ZS_OK)
        st = zsi_wait(c, OP, k, ob->rq, zsi_deadline(c), -1);
    if (st != ZS_OK)
        ob->keep = true;
    return st;
}

/* The local checks of zs_onebit_allreduce. */
static zs_status check_args(const zs_onebit *ob, const zs_tensor *x)
{
    zs_status st = zsi_check_tensor(OP, x, false);
    if (st == ZS_OK && (x->dtype != ZS_F32 || zs_numel(x) != ob->n))
        st = zs_set_error("%s: %s tensor of %lld elements, expected f32 of %lld (the "
                          "size given to zs_onebit_new)", OP, zs_dtype_name(x->dtype),
                          (long long)zs_numel(x), (long long)ob->n);
    return st;
}

zs_status zs_onebit_allreduce(zs_onebit *ob, zs_tensor *x)
{
    if (!ob)
        return zs_set_error("%s: NULL compressor", OP);
    zs_comm *c = ob->c;
    zs_status st = zsi_check_comm(OP, c);
    if (st != ZS_OK)
        return st;
    st = zsi_agree(c, OP, ZSI_OP_ALLREDUCE, ZS_F32, ob->n, ONEBIT_ALGO, check_args(ob, x));
    if (st != ZS_OK)
        return st;
    int P = ob->P, r = ob->r;
    int64_t n = ob->n, B = ob->block, sent = 0;
    float *d = zs_data(x);
    uint8_t *recv_at[P], *send_at[P];
    int64_t recv_bytes[P], send_bytes[P];
    /* 1. worker: every chunk compressed with the worker error; chunk j to j */
    for (int j = 0; j < P; j++) {
        zsi_onebit_compress(d + CH_LO(n, P, j), ob->werr + CH_LO(n, P, j), CH_N(n, P, j),
                            B, ob->send + ob->off[j]);
        recv_at[j] = ob->in + j * ob->pk;
        recv_bytes[j] = ob->pk;
        send_at[j] = ob->send + ob->off[j];
        send_bytes[j] = ob->off[j + 1] - ob->off[j];
    }
    memcpy(ob->in + r * ob->pk, ob->send + ob->off[r], (size_t)ob->pk);
    if (P > 1 && (st = exchange(ob, TAG_TO_SERVER, recv_at, recv_bytes, send_at,
                                send_bytes, &sent)) != ZS_OK)
        return st;
    /* 2. server: the average of this chunk, compressed with the server error */
    memset(ob->acc, 0, (size_t)ob->len * sizeof *ob->acc);
    for (int i = 0; i < P; i++)
        zsi_onebit_accumulate(ob->in + i * ob->pk, ob->len, B, 1.0f / (float)P, ob->acc);
    zsi_onebit_compress(ob->acc, ob->serr, ob->len, B, ob->out + ob->off[r]);
    /* 3. the server packets to everyone; every chunk decoded alike */
    for (int j = 0; j < P; j++) {
        recv_at[j] = ob->out + ob->off[j];
        recv_bytes[j] = ob->off[j + 1] - ob->off[j];
        send_at[j] = ob->out + ob->off[r];
        send_bytes[j] = ob->pk;
    }
    if (P > 1 && (st = exchange(ob, TAG_FROM_SERVER, recv_at, recv_bytes, send_at,
                                send_bytes, &sent)) != ZS_OK)
        return st;
    for (int j = 0; j < P; j++)
        zsi_onebit_decode(ob->out + ob->off[j], CH_N(n, P, j), B, d + CH_LO(n, P, j));
    ob->st.calls++;
    ob->st.bytes_sent += sent;
    ob->st.last_bytes_sent = sent;
    return ZS_OK;
}
