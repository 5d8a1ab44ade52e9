/*
 * kernels/cpu/attention.h - flash-attention forward and backward on raw
 * pointers (see attention.c for the tiling).
 *
 * q [B, H, Tq, D], k and v [B, H, Tk, D] are addressed through element
 * strides of their b, h and t dims; the d dim must have stride 1. Outputs
 * (o, dq, dk, dv) and the logsumexp lse [B, H, Tq] are contiguous. All
 * arrays have dtype dt (ZS_F32, ZS_F64, ZS_BF16 or ZS_F16) except lse,
 * which is f64 for f64 and f32 otherwise (bf16/f16 compute in f32 and
 * round o, dq, dk, dv once); slopes are double.
 */
#ifndef ZS_KERNELS_CPU_ATTENTION_H
#define ZS_KERNELS_CPU_ATTENTION_H

#include <stdbool.h>
#include <stdint.h>

#include "zs/core.h"

typedef struct zsk_attn {
    zs_dtype dt;
    int64_t B, H, Tq, Tk, D;
    const void *q, *k, *v;       /* first elements */
    int64_t sq[3], sk[3], sv[3]; /* strides of b, h, t in elements */
    double scale;                /* multiplies q . k */
    bool causal;                 /* key j visible to row i: j <= q_offset+i */
    int64_t q_offset;            /* absolute position of query row 0 */
    const double *slopes;        /* [H] ALiBi slopes, or NULL for no bias */
} zsk_attn;

/* o = softmax(q k^T * scale + bias + mask) v, and lse[b,h,i] = the
 * natural log of the row's sum of exp (max included), when lse is not NULL.
 * Rows without a visible key (impossible when the op's checks hold) get
 * o = 0 and lse = -inf. Parallel over (b, h, query block). Fails only when
 * scratch memory cannot be allocated (message set). */
zs_status zsk_attention_forward(const zsk_attn *a, void *o, void *lse);

/* From the forward's o and lse and the output gradient dout (strides sd of
 * b, h, t; d stride 1): dq, dk, dv (contiguous, fully written). Parallel
 * over (b, h); each task owns its rows of dq, dk and dv. Fails only when
 * scratch memory cannot be allocated (message set). */
zs_status zsk_attention_backward(const zsk_attn *a, const void *o,
                                 const void *lse, const void *dout,
                                 const int64_t sd[3], void *dq, void *dk,
                                 void *dv);

/* The vdpbf16ps forward of attention_bf16.c: usable for bf16 on CPUs with
 * AVX512_BF16 (zs_cpu(), so ZS_CPU_ISA caps it) when D is a multiple of 16;
 * zsk_attention_forward calls it then (the backward widens to f32: faster,
 * see attention_bf16.c). The contract of zsk_attention_forward.
 * zsk_attention_bf16_off (a test hook) turns it off. */
extern bool zsk_attention_bf16_off;
bool zsk_attention_bf16_usable(const zsk_attn *a);
zs_status zsk_attention_forward_bf16(const zsk_attn *a, void *o, void *lse);

/* The AVX2 + FMA f32 kernels of attention_avx2.c, for f32 with
 * D % 16 == 0 and D <= 128 (zsk_attention_avx2_usable; always false off
 * x86-64); attention.c's f32 task bodies call them at ISA level 1 (callers
 * must be on an AVX2 + FMA CPU). Single-threaded, no allocation.
 * _forward: query rows [i0, i0 + nq) (nq <= 64) of head bh = b H + h;
 * o: those rows of the output, [nq, D] contiguous; lse: their nq
 * logsumexps, or NULL. _backward: head bh, from o and lse of that head
 * ([Tq, D] and [Tq], contiguous) and dout (the head's first element, rows
 * sd apart, d stride 1): dq [Tq, D], dk and dv [Tk, D] of the head,
 * contiguous, fully written. */
bool zsk_attention_avx2_usable(const zsk_attn *a);
void zsk_attention_avx2_forward(const zsk_attn *a, int64_t bh, int64_t i0,
                                int64_t nq, float *o, float *lse);
void zsk_attention_avx2_backward(const zsk_attn *a, int64_t bh,
                                 const float *o, const float *lse,
                                 const float *dout, int64_t sd, float *dq,
                                 float *dk, float *dv);

#endif
