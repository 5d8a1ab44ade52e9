/*
 * kernels/cpu/sparse_attention.h - block-sparse attention on raw pointers:
 * the block layout (which key blocks each query block sees) and the
 * forward and backward kernels that touch only those blocks (see
 * sparse_attention.c).
 *
 * Tokens 0..T-1 are cut into nb = ceil(T / bs) blocks of bs tokens (the
 * last one partial). The layout is a pure function of (T, bs, local,
 * global, random, seed, causal), so an operator's attributes can carry
 * those values and rebuild it. q, k, v [B, H, T, D] are addressed through
 * element strides of their b, h and t dims (d stride 1); o, dq, dk, dv and
 * lse [B, H, T] are contiguous. Arrays of dtype dt (ZS_F32 or ZS_F64).
 */
#ifndef ZS_KERNELS_CPU_SPARSE_ATTENTION_H
#define ZS_KERNELS_CPU_SPARSE_ATTENTION_H

#include <stdbool.h>
#include <stdint.h>

#include "zs/core.h"

/* Query block i sees key block j when (causal: j <= i only)
 *   local:  i - L <= j <= i (causal) or |i - j| <= L; L = 0 is the
 *           diagonal block alone, which every row always has;
 *   global: j < G (every row attends the first G blocks) or i < G (the
 *           first G blocks attend every allowed block);
 *   random: R more blocks per row, drawn without replacement among the
 *           allowed ones not yet taken, from Philox(seed, i): the same
 *           for any thread count.
 * Inside a causal diagonal block, key t is visible to query t' when
 * t <= t'. */
typedef struct zsk_blocks {
    int64_t T, bs, nb;   /* tokens, block size, blocks */
    bool causal;
    int64_t nnz;         /* key blocks over all rows */
    int64_t *row_ptr;    /* [nb + 1]: row i's blocks are cols[row_ptr[i]..] */
    int32_t *cols;       /* [nnz], ascending within a row */
} zsk_blocks;

/* Builds the layout into *out (arrays malloc'd; free with zsk_blocks_free).
 * Sizes are checked by the caller (T >= 1, bs >= 1, L, G, R >= 0). Fails
 * only on allocation (message set). */
zs_status zsk_blocks_build(int64_t T, int64_t bs, int64_t local, int64_t global,
                           int64_t random, uint64_t seed, bool causal,
                           zsk_blocks *out);
void zsk_blocks_free(zsk_blocks *b);
/* (query, key) elements the kernels compute per (batch, head): the area
 * of the layout's blocks (partial edge blocks by their real size);
 * *visible receives those unmasked (causal diagonal blocks: the lower
 * triangle). */
double zsk_blocks_pairs(const zsk_blocks *b, double *visible);

typedef struct zsk_sattn {
    zs_dtype dt;
    int64_t B, H, T, D;
    const void *q, *k, *v;       /* first elements */
    int64_t sq[3], sk[3], sv[3]; /* strides of b, h, t in elements */
    double scale;                /* multiplies q . k */
    const zsk_blocks *lay;       /* lay->T == T */
} zsk_sattn;

/* o = softmax(q k^T * scale + mask) v over the layout's blocks, and
 * lse[b,h,i] = log of row i's sum of exp (max included) when lse is not
 * NULL. Parallel over (b, h, query block). Fails only when scratch memory
 * cannot be allocated (message set). */
zs_status zsk_sparse_attention_forward(const zsk_sattn *a, void *o, void *lse);

/* From the forward's o and lse and the output gradient dout (strides sd of
 * b, h, t; d stride 1): dq, dk, dv (contiguous, fully written). Parallel
 * over (b, h): a task owns its dq, dk and dv. */
zs_status zsk_sparse_attention_backward(const zsk_sattn *a, const void *o,
                                        const void *lse, const void *dout,
                                        const int64_t sd[3], void *dq, void *dk,
                                        void *dv);

#endif
