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
#include "ops/infer_ops.h" /* zsi_wfmt, the forward pass's descriptors */
#include "zs/infer.h"
#include "zs/kv_pool.h"

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
    /* The same as tensors on the model's device (what the forward pass
     * runs on): on the CPU they wrap the buffers above; on another device
     * they own the device's copy and the host buffers are gone (NULL). */
    zs_tensor *tw;         /* u8 [weight bytes] (a view of the layer's arena) */
    zs_tensor *tscale, *tsmooth, *tbias;
} zsi_linear;

typedef struct zsi_layer {
    void *ln1_w, *ln1_b, *ln2_w, *ln2_b; /* [C], compute dtype */
    zsi_linear qkv, proj, fc, fc2;       /* c_attn, attn.c_proj, c_fc, mlp.c_proj */
    void *arena;                         /* the four linears' weights, one
                                          * zs_alloc block (zsi_layer_gather) */
    int64_t arena_bytes;
    zs_tensor *tarena, *tln1_w, *tln1_b, *tln2_w, *tln2_b; /* on the device */
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
    zsi_calib *calib;  /* non-NULL while calibrating (f32 models on the CPU) */
    /* Where the forward pass runs: the buffers above as tensors on device
     * (place.c). On the CPU they wrap the buffers; on another device the
     * host buffers are freed (NULL) and the tensors own device memory. */
    int device;
    zs_tensor *twte;   /* the embedding rows' table: wte, or head.tw */
    zs_tensor *twpe, *temb_ln_w, *temb_ln_b, *tlnf_w, *tlnf_b, *tslopes;
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
/* y [M, ldy] = act(x W^T + bias) + residual (residual may be y itself,
 * NULL: none), through the packed_linear descriptor on the tensors' device
 * (l's tensors, x, residual and y on one device, in the compute dtype).
 * Row m of y depends on row m of x only (batch invariance). */
zs_status zsi_linear_run(const zsi_linear *l, zs_tensor *x, int64_t M, int64_t ldx,
                         zs_tensor *residual, int64_t ldr, zsk_act act, zs_tensor *y,
                         int64_t ldy);
/* l's weight data (the pointer of its format, NULL once on a device) and
 * its bytes (F32 panels are padded to 64 columns). */
void *zsi_linear_weights(const zsi_linear *l, size_t *bytes);
/* l's tensors (linear.c): wrappers of its host buffers (bias in dt; the
 * weights a view of arena, the layer's arena wrapped, whose bytes start at
 * base; arena NULL: l's own), or moved to device (arena: the layer's arena
 * already there, or NULL), the host buffers then freed. */
zs_status zsi_linear_wrap(zsi_linear *l, zs_dtype dt, zs_tensor *arena, const void *base);
zs_status zsi_linear_move(zsi_linear *l, int device, zs_tensor *arena);
/* *t (NULL stays NULL) replaced by its copy on device; false + message on
 * failure, *t unchanged. */
bool zsi_move_tensor(zs_tensor **t, int device);
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
 * serving loop does not fault fresh pages in every step: tensors on the
 * model's device, in its compute dtype, 1-D of the capacity below. */
typedef struct zsi_work {
    int64_t rows, out_rows;
    int device;
    zs_tensor *x, *h, *big, *att; /* [rows, C], [rows, C], [rows, 4C], [rows, C] */
    zs_tensor *q;                 /* [rows, C] queries, contiguous per row */
    zs_tensor *hout;              /* [out_rows, C] */
    zs_tensor *logits;            /* [out_rows, V] on a device other than the CPU;
                                   * on the CPU a wrapper of the caller's
                                   * buffer (logits_at), remade when it moves */
    void *logits_at;
    int64_t logits_n;
    int32_t *meta;                /* the step's metadata on the host ... */
    int64_t meta_cap;
    zs_tensor *tmeta;             /* ... and on the device ([meta_cap] i32; on
                                   * the CPU it wraps meta) */
} zsi_work;

zs_status zsi_work_reserve(zsi_work *w, const zs_llm *m, int64_t rows, int64_t out_rows);
void zsi_work_free(zsi_work *w);

/* Runs the batch's rows through the model: writes their K and V into the
 * pool at (table, pos), attends over positions 0 .. pos of each row's
 * sequence, and writes the logits of the out rows to logits [n_out, V]
 * (compute dtype, host memory). The pool's dtype is the model's compute
 * dtype, or bf16 or f16 for an f32 model (keys and values rounded on the
 * way in); it lives on the model's device. Every computation runs through
 * the driver (ops/infer_ops.h) on the model's device; on another device
 * than the CPU the step's metadata goes there in one copy and the logits
 * come back in one. */
zs_status zsi_forward(const zs_llm *m, zs_kv_pool *pool, const zsi_batch *b,
                      zsi_work *w, void *logits);

/* Places m's buffers on its device as tensors (place.c): on the CPU
 * (m->device 0) wrappers of the host buffers, no copy; call once, when m
 * is built. zsi_llm_move then moves a CPU model to another device: one
 * copy of every buffer, the host buffers freed. On failure m stays usable
 * where it was (move) or must be freed (wrap); message set. */
zs_status zsi_llm_wrap(zs_llm *m);
zs_status zsi_llm_move(zs_llm *m, int device);
/* m (a new model, wrapped on the CPU) moved to o->device (o NULL: stays):
 * m, or NULL + message with m freed. */
zs_llm *zsi_llm_place(zs_llm *m, const zs_llm_options *o);

#endif
