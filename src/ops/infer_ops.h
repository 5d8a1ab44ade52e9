/*
 * ops/infer_ops.h - the descriptors of the inference engine's forward pass
 * (ops/infer_ops.c) and their typed attributes, which the engine
 * (src/infer/forward.c, linear.c) fills.
 *
 * The engine keeps its weights, work buffers and KV pool as tensors on
 * the model's device and runs every computation of a step through the
 * driver: these descriptors are in place (ops/op.h: the kernel writes into
 * in[0], nothing is allocated or recorded) because the engine's buffers
 * outlive the step, and each takes the row count of the step in its
 * attributes, so the buffers keep their capacity shape from step to step.
 * Their CPU kernels call the zsk_ functions the engine called before, with
 * the same arguments (bit-identical results, batch invariance kept).
 *
 * A step's control data (token ids, positions, block tables, the rows
 * whose logits are wanted) is one i32 tensor, the step's metadata, built
 * on the host and copied to the device once per step; zsi_step_meta says
 * where each array lies in it.
 */
#ifndef ZS_OPS_INFER_OPS_H
#define ZS_OPS_INFER_OPS_H

#include <stdint.h>

/* How one linear layer's weight W [N, K] is held (its weight tensor's
 * bytes, u8). */
typedef enum zsi_wfmt {
    ZSI_W_F32,  /* packed panels (zsk_packed_f32) */
    ZSI_W_F64,  /* plain [N, K] doubles (a float64 model) */
    ZSI_W_Q8_0, /* 16-row tiles of 32-blocks (kernels/cpu/qpacked.h) */
    ZSI_W_Q4_0,
    ZSI_W_Q4_1,
    ZSI_W_I8,   /* int8 [N, K] + one f32 scale per row (zsk_i8_linear):
                 * LLM.int8() with a threshold, SmoothQuant with smooth */
} zsi_wfmt;

/* Offsets (in elements) of a step's arrays in its metadata tensor (i32):
 * tok [n] token ids, pos [n] positions, tab [n] the offset in the
 * metadata of each row's block table (the blocks of positions 0 .. pos),
 * out [n_out] the rows whose logits are wanted; len: elements in all. */
typedef struct zsi_step_meta {
    int64_t n, n_out;
    int64_t tok, pos, tab, out, len;
} zsi_step_meta;

/* packed_linear: y [M rows of ldy] = act(x W^T + bias) + residual.
 * Inputs: y (written; f32, or f64 with fmt ZSI_W_F64), x [M rows of ldx],
 * W (u8, the format's bytes), then the optional ones flagged here, in this
 * order: scale [N] f32, smooth [K] f32 (I8), bias [N], residual [M rows
 * of ldr] (may be y itself: y += ...), all in y's dtype but the I8 ones. */
typedef struct zsi_linear_attrs {
    int32_t fmt;        /* zsi_wfmt */
    int32_t act;        /* zsk_act */
    int64_t N, K, M;
    int64_t ldx, ldr, ldy;
    int64_t tile_bytes; /* ZSI_W_Q*: bytes of one 16-row tile */
    float threshold;    /* ZSI_W_I8: LLM.int8()'s outlier threshold, 0: none */
    uint8_t scale, smooth, bias, residual;
} zsi_linear_attrs;

/* embedding_rows: x [n, C] = the token rows (+ wpe [pos] rows when wpe).
 * Inputs: x (written; f32, f64, bf16 or f16), meta (i32), table: dense
 * [V, C] rows in x's dtype (fmt ZSI_W_F32 or F64) or the head's quantized
 * tiles (u8, ZSI_W_Q*: the rows dequantized; f32 x only), then wpe [ctx,
 * C] when flagged (bf16 / f16: the sum in f32, rounded once). */
typedef struct zsi_embed_attrs {
    zsi_step_meta m;
    int64_t C, V;
    int32_t fmt;
    uint8_t wpe;
    int64_t tile_bytes;
} zsi_embed_attrs;

/* kv_store: for every row i, q[i] = qkv[i, 0:C] and the row's key and
 * value (qkv[i, C:2C], qkv[i, 2C:3C]) into the pool at layer l, position
 * pos[i] of its block table, in the pool's dtype (rounded to nearest even
 * when 16 bits). Inputs: q [n, C] (written), pool (written too: f32, f64,
 * bf16 or f16, layout zs/kv_pool.h), qkv [n, 3C] (q's dtype), meta. */
typedef struct zsi_kv_attrs {
    zsi_step_meta m;
    int64_t C, L, l, bs; /* width, layers, the layer, block size */
} zsi_kv_attrs;

/* paged_attention: o [n, C] = softmax(q k^T / sqrt(D) [- ALiBi]) v, each
 * row over positions 0 .. pos[i] of its sequence in the pool, layer l.
 * Inputs: o (written; f32 or f64), q [n, C], pool, meta, then slopes [H]
 * (o's dtype) when flagged. */
typedef struct zsi_paged_attn_attrs {
    zsi_step_meta m;
    int64_t H, D, L, l, bs;
    uint8_t slopes;
} zsi_paged_attn_attrs;

/* layer_norm_rows: y [n, C] = layer_norm(x [n, C]) * w + b (eps), rows
 * normalised independently; y may be x. Inputs: y (written), x, w, b,
 * one dtype: f32, f64, or bf16 / f16 (computed in f32, y rounded once). */
typedef struct zsi_norm_rows_attrs {
    int64_t n, C;
    double eps;
} zsi_norm_rows_attrs;

/* gather_rows: dst[i] = src[out[i]] for the step's out rows, C elements
 * each. Inputs: dst (written), src (dst's dtype), meta. */
typedef struct zsi_gather_attrs {
    zsi_step_meta m;
    int64_t C;
} zsi_gather_attrs;

#endif
