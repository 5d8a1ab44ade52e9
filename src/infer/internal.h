/*
 * infer/internal.h - the inference model's layout (zs_llm) and its forward
 * pass over a flat batch of tokens, shared by llm.c (building and
 * quantizing), llm_io.c (quantized checkpoints), forward.c and engine.c.
 *
 * Every matrix product of the forward pass is batch invariant: the bits of
 * a token's row depend on that row and the weights only, never on how many
 * other rows share the batch or where the row sits in it (see zsi_linear).
 */
#ifndef ZS_INFER_INTERNAL_H
#define ZS_INFER_INTERNAL_H

#include "kernels/cpu/int8_linear.h"
#include "kernels/cpu/packed_linear.h"
#include "kernels/cpu/qpacked.h"
#include "zs/infer.h"
#include "zs/kv_pool.h"

/* How one linear layer's weight W [N, K] is held. */
typedef enum zsi_wfmt {
    ZSI_W_F32,  /* packed panels (zsk_packed_f32) */
    ZSI_W_F64,  /* plain [N, K] doubles (a float64 model) */
    ZSI_W_Q8_0, /* 16-row tiles of 32-blocks (kernels/cpu/qpacked.h) */
    ZSI_W_Q4_0,
    ZSI_W_Q4_1,
    ZSI_W_I8,   /* int8 [N, K] + one f32 scale per row (zsk_i8_linear):
                 * LLM.int8() with a threshold, SmoothQuant with smooth */
} zsi_wfmt;

typedef struct zsi_linear {
    zsi_wfmt fmt;
    int64_t N, K;
    zsk_packed_f32 packed; /* F32 */
    zsk_qpacked tiles;     /* Q8_0, Q4_0, Q4_1 */
    void *w;               /* F64: double [N, K]; I8: int8 [N, K] */
    int64_t w_bytes;       /* bytes of w, packed or tiles */
    float *scale;          /* I8: [N] */
    float *smooth;         /* I8: [K] multipliers of x (SmoothQuant 1/s), or NULL */
    float threshold;       /* I8: LLM.int8() outlier threshold, 0 = none */
    void *bias;            /* [N] in the compute dtype, or NULL */
    bool in_arena;         /* the weights (packed, tiles or w) lie in the
                            * layer's arena, which owns them */
} zsi_linear;

typedef struct zsi_layer {
    void *ln1_w, *ln1_b, *ln2_w, *ln2_b; /* [C], compute dtype */
    zsi_linear qkv, proj, fc, fc2;       /* c_attn, attn.c_proj, c_fc, mlp.c_proj */
    void *arena;                         /* the four linears' weights, one
                                          * zs_alloc block (zsi_layer_gather) */
} zsi_layer;

/* Per-layer activation statistics for SmoothQuant: max |x| of every input
 * channel of the four linears, over the calibration tokens. */
typedef struct zsi_calib {
    float *amax[4]; /* [layers * K] each: qkv, proj, fc, fc2 */
} zsi_calib;

struct zs_llm {
    zs_gpt_config c;
    zs_dtype dt;       /* compute dtype: ZS_F32 or ZS_F64 */
    zs_quant quant;
    float int8_threshold;
    double smooth_alpha;
    void *wte;         /* [V, C] dense rows for the embedding, or NULL: the
                        * rows are dequantized from head */
    void *wpe;         /* [ctx, C] (GPT-2), else NULL */
    void *emb_ln_w, *emb_ln_b, *lnf_w, *lnf_b;
    zsi_layer *layers; /* [layers] */
    zsi_linear head;   /* logits = ln_f(x) wte^T: N = vocab, K = width */
    float *slopes;     /* [heads] ALiBi (BLOOM), f32 */
    double *slopes64;  /* the same in f64 */
    zsi_calib *calib;  /* non-NULL while calibrating (f32 models) */
};

/* path: a checkpoint file or a training directory -> the checkpoint file
 * (DIR/checkpoint.safetensors) and the directory of its tokenizer, each at
 * most n bytes. */
void zsi_ckpt_paths(const char *path, char *ckpt, char *dir, size_t n);

/* m->slopes and slopes64 for a BLOOM model (nothing for GPT-2). */
zs_status zsi_llm_slopes(zs_llm *m);

/* Builds W [N, K] (f32 or f64 values, row-major, borrowed) into l in
 * format fmt; bias [N] (compute dtype) is copied, NULL = none. */
zs_status zsi_linear_build(zsi_linear *l, zsi_wfmt fmt, zs_dtype src_dt, const void *W,
                           int64_t N, int64_t K, const void *bias, zs_dtype dt);
void zsi_linear_free(zsi_linear *l);
/* The block format of a ZSI_W_Q* format. */
zsk_qfmt zsi_qfmt(zsi_wfmt f);
/* l->tiles (and w_bytes) from quant.h's row blocks of l's block format,
 * borrowed: N = l->N rows of l->K / 32 blocks. */
zs_status zsi_linear_tiles(zsi_linear *l, const void *blocks);
/* y [M, ldy] = act(x W^T + bias) + residual (residual may be y itself).
 * Row m of y depends on row m of x only (batch invariance). */
zs_status zsi_linear_run(const zsi_linear *l, zs_dtype dt, const void *x, int64_t M,
                         int64_t ldx, const void *residual, int64_t ldr, zsk_act act,
                         void *y, int64_t ldy);
/* The weight bytes one pass over l reads. */
int64_t zsi_linear_bytes(const zsi_linear *l);
/* Moves the weights of y's four linears into one block, y->arena, in the
 * order the forward pass reads them (see linear.c); y keeps its linears
 * on failure. */
zs_status zsi_layer_gather(zsi_layer *y);

/* A flat batch for zsi_forward: n token rows, each of one sequence. */
typedef struct zsi_batch {
    int64_t n;
    const int32_t *tokens;          /* [n] */
    const int64_t *pos;             /* [n] the row's position in its sequence */
    const int32_t *const *tables;   /* [n] the block table of the row's sequence;
                                     * its positions 0 .. pos are claimed */
    int64_t n_out;
    const int64_t *out_rows;        /* [n_out] rows whose logits are wanted */
} zsi_batch;

/* Scratch memory for batches of up to rows tokens, kept between steps so a
 * serving loop does not fault fresh pages in every step. */
typedef struct zsi_work {
    int64_t rows, out_rows;
    void *x, *h, *big, *att; /* [rows, C], [rows, C], [rows, 4C], [rows, C] */
    void *q;                 /* [rows, C] queries, contiguous per row */
    void *hout;              /* [out_rows, C] */
    int64_t *len;            /* [rows] */
} zsi_work;

zs_status zsi_work_reserve(zsi_work *w, const zs_llm *m, int64_t rows, int64_t out_rows);
void zsi_work_free(zsi_work *w);

/* Runs the batch's rows through the model: writes their K and V into the
 * pool at (table, pos), attends over positions 0 .. pos of each row's
 * sequence, and writes the logits of the out rows to logits [n_out, V]
 * (compute dtype). The pool's dtype is the model's compute dtype, or bf16
 * or f16 for an f32 model (keys and values rounded on the way in). */
zs_status zsi_forward(const zs_llm *m, zs_kv_pool *pool, const zsi_batch *b,
                      zsi_work *w, void *logits);

#endif
