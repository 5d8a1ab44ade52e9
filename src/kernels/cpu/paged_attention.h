/*
 * kernels/cpu/paged_attention.h - decode attention for a batch of
 * sequences of different lengths whose keys and values live in the blocks
 * of a paged KV cache (zs/kv_pool.h), read through each sequence's block
 * table.
 *
 * Sequence s has one query row q[s] ([H, D], contiguous) at position
 * len[s] - 1 and sees every cached position 0 .. len[s] - 1. Position t of
 * sequence s is slot t % bs of block tables[s][t / bs]; its key row (H x D
 * elements, contiguous) starts at base + block * block_stride + k_off +
 * (t % bs) * H * D, its value row at ... + v_off + ... (offsets in
 * elements: they pick the layer inside a block).
 *
 * Work items are (sequence, chunk of 16 positions), all heads, spread over
 * the pool, so one sequence of 32 positions or more already uses two cores;
 * each (chunk, head) keeps its own running max, sum and weighted value sum,
 * and the chunks of a (sequence, head) are merged in order afterwards. The
 * result of a sequence therefore depends on its own length only: not on the
 * other sequences of the batch, nor on the number of threads (batch
 * invariance).
 *
 * Keys and values may be stored in 16 bits (kv = ZS_BF16 or ZS_F16, for an
 * f32 model: half the bytes that decode streams per token); each element
 * is widened to f32 exactly as zs_bf16_to_f32 / zs_f16_to_f32 do and the
 * arithmetic is the f32 path's.
 *
 * Paths: AVX-512 (when D is a multiple of 16, H <= 128 and the CPU has
 * AVX-512F: a tile's rows read in address order, 16 scores per head as one
 * vector), else AVX2+FMA+F16C (D a multiple of 8, H <= 128: the same
 * order on 8 lanes, 16 scores per head as two vectors), else portable
 * loops (ZSK_ISA_FN variants); the three differ in rounding, each keeps the
 * batch invariance above. zsk_linear_force_portable (packed_linear.h) forces the
 * portable path, for tests.
 */
#ifndef ZS_KERNELS_CPU_PAGED_ATTENTION_H
#define ZS_KERNELS_CPU_PAGED_ATTENTION_H

#include <stdint.h>

#include "zs/core.h"

typedef struct zsk_paged_attn {
    int64_t n_seqs, H, D;
    const float *q;               /* [n_seqs, H, D] */
    const void *base;             /* the pool's first element, of type kv */
    int64_t block_stride;         /* elements from one block to the next */
    int64_t k_off, v_off;         /* elements: this layer's K and V in a block */
    int64_t bs;                   /* tokens per block */
    const int32_t *const *tables; /* [n_seqs] block tables */
    const int64_t *len;           /* [n_seqs] cached positions, >= 1 */
    float scale;                  /* multiplies q . k (1 / sqrt(D)) */
    const float *slopes;          /* [H] ALiBi slopes (BLOOM), or NULL: the
                                   * score of position t gets
                                   * - slopes[h] * (len - 1 - t) */
    zs_dtype kv;                  /* the pool's elements: ZS_F32 (0), ZS_BF16
                                   * or ZS_F16 */
} zsk_paged_attn;

/* The same for float64 queries, pool and output (a float64 model): plain
 * loops, one pass per (sequence, head), for correctness rather than
 * speed. */
typedef struct zsk_paged_attn_f64 {
    int64_t n_seqs, H, D;
    const double *q, *base;
    int64_t block_stride, k_off, v_off, bs;
    const int32_t *const *tables;
    const int64_t *len;
    double scale;
    const double *slopes;
} zsk_paged_attn_f64;

/* o [n_seqs, H, D] = softmax(q k^T * scale) v per sequence and head.
 * ZS_ERR_ARG for a sequence of length < 1 or another kv dtype (f32
 * queries); ZS_ERR_NOMEM when scratch
 * memory cannot be had (message set). */
zs_status zsk_paged_attention_f32(const zsk_paged_attn *a, float *o);
zs_status zsk_paged_attention_f64(const zsk_paged_attn_f64 *a, double *o);

#endif
