/*
 * zs/analyze.h - machine measurements and the analysis of large models:
 * parameters, FLOPs per operator and per step, training memory (ZeRO,
 * offload, activations with recomputation), communication per step,
 * pipeline bubbles, and a roofline over a table of accelerators. The
 * formulas follow the chapter on large-model systems (BLOOM-176B) and
 * Korthikanti et al., "Reducing Activation Recomputation in Large
 * Transformer Models" (2022); each function states its formula.
 *
 * Units: FLOPs and bytes are doubles (exact for integers below 2^53);
 * "GB" means 1e9 bytes, as the chapter's 3525 GB and 80 GB devices do.
 */
#ifndef ZS_ANALYZE_H
#define ZS_ANALYZE_H

#include "core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Peak FP32 FMA rate in GFLOP/s on `threads` threads, measured with a
 * register-resident FMA loop (AVX-512, else AVX2, else scalar) for about
 * `seconds`. */
double zs_measure_peak_gflops(int threads, double seconds);
/* The same loop timed by each thread's CPU time (CLOCK_THREAD_CPUTIME_ID):
 * GFLOP/s per core while running, blind to time spent descheduled, for a
 * loaded machine where the wall-clock peak moves with the load; best
 * thread of the best of a few runs of about `seconds` in all. */
double zs_measure_peak_gflops_cpu(int threads, double seconds);
/* STREAM-style triad a = b + s*c on `threads` threads over arrays of
 * `bytes` each (well beyond cache), in GB/s counting 3 arrays moved
 * (2 reads, 1 write); best of `reps`. */
double zs_measure_triad_gbs(int threads, size_t bytes, int reps);

/* ---- model descriptions (src/analyze/model.c) ------------------------- */
typedef enum zs_mlp_kind {
    ZS_MLP_GELU = 0,   /* up [h, ff] -> GeLU -> down [ff, h] (GPT, BLOOM) */
    ZS_MLP_SWIGLU = 1, /* gate, up [h, ff]; silu(gate) * up; down (LLaMA) */
} zs_mlp_kind;

typedef enum zs_norm_kind {
    ZS_NORM_LAYER = 0, /* weight + bias: 2h parameters */
    ZS_NORM_RMS = 1,   /* weight only: h parameters */
} zs_norm_kind;

/* A decoder-only transformer. Symbols are the chapter's: l, h, n, d, s, V.
 * Q has n heads of width d, K and V have n_kv_head heads (grouped-query
 * attention when n_kv_head < n_head). */
typedef struct zs_model_config {
    char name[64];
    int64_t n_layer;      /* l */
    int64_t d_model;      /* h */
    int64_t n_head;       /* n */
    int64_t n_kv_head;    /* K/V heads; n for multi-head attention */
    int64_t d_head;       /* d; h / n unless given */
    int64_t d_ff;         /* MLP inner width; 4h for GeLU unless given */
    int64_t vocab;        /* V */
    int64_t seq_len;      /* s: default sequence length (context) */
    zs_mlp_kind mlp;
    zs_norm_kind norm;
    bool bias;            /* linear layers have biases */
    bool tied_embeddings; /* the logit layer reuses the token embedding */
    bool learned_pos;     /* a [seq_len, h] position table (GPT-2, GPT-3) */
    bool embed_norm;      /* a norm after the embedding (BLOOM) */
} zs_model_config;

int zs_model_preset_count(void);
/* The i-th preset (borrowed, static) or NULL when out of range. */
const zs_model_config *zs_model_preset_at(int i);
/* The preset named `name` (case-insensitive; borrowed) or NULL + error
 * listing the known names. */
const zs_model_config *zs_model_preset(const char *name);
/* Sets one field from text: key is a field name above ("n_layer", ...;
 * '-' may stand for '_'; "l", "h", "n", "d", "s", "V" are accepted too),
 * value a decimal integer, "gelu"/"swiglu", "layernorm"/"rmsnorm",
 * "true"/"false". ZS_ERR_ARG + message naming key and value on failure. */
zs_status zs_model_config_set(zs_model_config *c, const char *key,
                              const char *value);
/* Sets n fields (as zs_model_config_set), then re-derives the derived
 * fields not among them from the sizes that changed (d_head when d_model
 * or n_head is set, n_kv_head when n_head is, d_ff when d_model or mlp
 * is) and finishes the config. Stops at the first error. */
zs_status zs_model_config_set_many(zs_model_config *c, int n,
                                   const char *const *keys,
                                   const char *const *values);
/* Fills d_head (h/n), n_kv_head (n) and d_ff (4h for GeLU; LLaMA's
 * 256*ceil(8h/3/256) for SwiGLU) where they are 0, then checks that every
 * size is positive and n_head is a multiple of n_kv_head. */
zs_status zs_model_config_finish(zs_model_config *c);
/* Reads a flat JSON object {"key": value, ...} (keys as for
 * zs_model_config_set; values numbers, booleans or the strings above; an
 * optional "base": "preset-name" is applied first), re-derives as
 * zs_model_config_set_many does, and finishes it.
 * ZS_ERR_IO when the file cannot be read, ZS_ERR_FORMAT with line and column
 * for malformed JSON, ZS_ERR_ARG for an unknown key or a bad value. */
zs_status zs_model_config_load_json(const char *path, zs_model_config *out);
zs_status zs_model_config_parse_json(const char *text, zs_model_config *out);

/* Parameter count, by part. */
typedef struct zs_param_count {
    double embedding;   /* V*h token table */
    double position;    /* seq_len*h when learned_pos */
    double embed_norm;  /* BLOOM's embedding norm */
    double attention;   /* per layer: Q, K, V, output (+ biases) */
    double mlp;         /* per layer */
    double norms;       /* per layer: two norms */
    double per_layer;   /* attention + mlp + norms */
    double final_norm;
    double logit;       /* V*h when the logit layer is not tied */
    double total;
} zs_param_count;
/* Closed form: total = l*(attention + mlp + norms) + the rest. */
void zs_model_params(const zs_model_config *c, zs_param_count *out);

/* ---- FLOPs, bytes, arithmetic intensity (src/analyze/flops.c) --------- */
/* One forward operator of a decoder block on a micro-batch b of length s.
 * elems counts the elements of every input and output moved once (the
 * chapter's arithmetic intensity is flops/elems); bytes = elems * element
 * size. Shapes are text such as "(2, 2048, 14336)". */
typedef struct zs_op_cost {
    char name[32];
    char in1[48], in2[48], out[48];
    double flops, elems, bytes;
    bool matmul; /* counted by the chapter's 24bsh^2 + 4bs^2h */
} zs_op_cost;

#define ZS_BLOCK_MAX_OPS 24
/* Fills ops (room for ZS_BLOCK_MAX_OPS) with the operators of one decoder
 * block in execution order: projections, QK^T, softmax, attention x V,
 * output projection, MLP, norms, residual adds. Elementwise FLOPs per
 * element: add 1, softmax 5, GeLU 8, SiLU-and-multiply 5, LayerNorm 8,
 * RMSNorm 4. Returns the count, or < 0 + error for b, s or elem_bytes <= 0. */
int zs_block_ops(const zs_model_config *c, int64_t b, int64_t s,
                 double elem_bytes, zs_op_cost *ops);
/* Matmul FLOPs of one block's forward pass:
 * 2bs*h*(n*d + 2*kv*d) + 2bs*n*d*h + 2bs*h*ff*(2 or 3) + 4*b*n*s^2*d,
 * which is 24bsh^2 + 4bs^2h for GPT blocks (ff = 4h, n*d = h, kv = n). */
double zs_block_matmul_flops(const zs_model_config *c, int64_t b, int64_t s);

typedef enum zs_recompute {
    ZS_RECOMPUTE_NONE = 0,
    ZS_RECOMPUTE_SELECTIVE = 1, /* recompute QK^T, softmax, attention x V */
    ZS_RECOMPUTE_FULL = 2,      /* recompute each block's forward */
} zs_recompute;

/* Training FLOPs of one global batch of `batch` sequences of length s.
 * Backward = 2 x forward for every matmul. */
typedef struct zs_train_flops {
    double fwd, bwd, total;    /* decoder blocks: l * block, x2, x3: the
                                * chapter's 24blsh^2 + 4bls^2h, 72.. + 12.. */
    double logit_fwd;          /* 2bshV: the logit (LM head) layer */
    double total_with_logit;   /* 3 * (fwd + logit_fwd) */
    double recompute_selective;/* extra: l * 4bs^2h (QK^T, attention x V) */
    double recompute_full;     /* extra: fwd (one more forward of blocks) */
    double step;               /* total_with_logit + the chosen extra */
    double per_token;          /* step / (batch * s) */
    double six_n_per_token;    /* the 6N rule of thumb, for comparison */
} zs_train_flops;
zs_status zs_train_flops_compute(const zs_model_config *c, int64_t batch,
                                 int64_t s, zs_recompute rc,
                                 zs_train_flops *out);
/* The chapter's matmul FLOPs of one training step (forward, backward,
 * logit layer, square attention, no recomputation): total_with_logit.
 * What the engine's operators count, exactly, is
 * zs_analyze_engine_step_flops. Returns < 0 + error on bad sizes. */
double zs_analyze_step_flops(const zs_model_config *c, int64_t batch,
                             int64_t s);

/* ---- memory (src/analyze/memory.c) ------------------------------------ */
typedef enum zs_precision {
    ZS_PREC_FP32 = 0,  /* fp32 AdamW: 4 weights + 4 grads + 12 optimizer */
    ZS_PREC_MIXED = 1, /* bf16/fp16 + fp32 master: 2 + 2 + 12 */
} zs_precision;

/* Bytes of training state: weights, gradients, optimizer states (the
 * fp32 master copy, first and second moments: 12 bytes per parameter in
 * both precisions, as in the chapter and the ZeRO paper). */
typedef struct zs_state_bytes {
    double weights, grads, optim, total;
} zs_state_bytes;
void zs_state_bytes_full(double params, zs_precision p, zs_state_bytes *out);
/* One rank's share of a replica's state under ZeRO stage 0..3 over dp
 * ranks: stage 1 divides the optimizer states, 2 also the gradients, 3
 * also the weights (ZeRO paper, sec. 5). */
void zs_state_bytes_zero(const zs_state_bytes *replica, int64_t dp, int stage,
                         zs_state_bytes *out);

/* A parallel layout of one training step. */
typedef struct zs_parallel {
    int64_t batch;       /* global batch B (sequences) */
    int64_t micro_batch; /* b */
    int64_t seq;         /* s */
    int64_t dp, tp, pp;
    int zero;            /* ZeRO stage 0..3 over the dp group */
    bool offload;        /* ZeRO-Offload: optimizer states (and gradients
                          * from stage 2, weights at stage 3) live on host */
    zs_recompute recompute;
    zs_precision precision;
    /* Like for like with an engine that differs from the chapter's
     * model (all zero: the chapter's, as described above), used by
     * zs_memory_analyze_stage: */
    int act_bytes;       /* bytes of an activation element; 0: 2 (16-bit) */
    bool flash;          /* fused attention: no s^2 terms (scores,
                          * softmax, its dropout); keeps the attention
                          * output and its log-sum-exp per head and row */
    bool no_dropout;     /* no dropout, so no masks */
    double optim_bytes;  /* optimizer state per parameter; 0: 12 (fp32
                          * master, m, v); fp32 AdamW keeps m and v: 8 */
    bool gpipe;          /* GPipe: all m micro-batches in flight (else
                          * 1F1B: min(pp - stage, m)) */
} zs_parallel;
/* Checks sizes, that batch is a multiple of micro_batch * dp, that
 * n_kv_head (hence n_head) is a multiple of tp and that pp <= n_layer
 * (stages may be uneven, as BLOOM's 70 layers over 12 stages). */
zs_status zs_parallel_check(const zs_model_config *c, const zs_parallel *p);
/* Micro-batches per step per pipeline: batch / (micro_batch * dp). */
int64_t zs_parallel_micro_batches(const zs_parallel *p);
/* Layers of the largest pipeline stage: ceil(n_layer / pp). */
int64_t zs_parallel_layers_per_stage(const zs_model_config *c,
                                     const zs_parallel *p);

/* Activation bytes of one layer for one micro-batch, 16-bit activations,
 * per tensor-parallel rank (Korthikanti et al., Table 2, without sequence
 * parallelism): none: sbh(10 + 24/t) + 5as^2b/t, i.e. 34sbh + 5as^2b at
 * t = 1; selective: sbh(10 + 24/t); full: 2sbh (the block's input). Built
 * from the saved tensors (see memory.c), so GQA and SwiGLU change it. */
double zs_activation_bytes_layer(const zs_model_config *c, int64_t b,
                                 int64_t s, int64_t tp, zs_recompute rc);

typedef struct zs_memory_report {
    zs_state_bytes fp32, mixed;   /* whole model, one replica */
    zs_state_bytes device;        /* per device: /(tp*pp), ZeRO over dp */
    zs_state_bytes host;          /* per device's share offloaded to host */
    double act_layer[3];          /* per layer, per micro-batch, by zs_recompute */
    double act_device;            /* chosen recompute, per device (below) */
    int64_t layers_per_stage;
    int64_t micro_batches_in_flight; /* 1F1B: min(pp, m) */
    double device_total;          /* device state + act_device */
} zs_memory_report;
/* Activations held per device: layers_per_stage * in-flight micro-batches
 * * per-layer bytes (1F1B schedule; the first stage holds min(p, m)). */
zs_status zs_memory_analyze(const zs_model_config *c, const zs_parallel *p,
                            zs_memory_report *out);
/* One rank of pipeline stage `stage` (of p->pp) holding `layers` blocks,
 * placed as Megatron-LM and Zhisuan's split GPT place them: the first
 * stage also holds the token (and position) embedding, the last the
 * final norm and the head (the tied token table again when pp > 1); tp
 * splits the vocabulary and the blocks' matrices (their norms are
 * replicated). Activations per layer as zs_activation_bytes_layer with
 * p's like-for-like options (act_bytes, flash, no_dropout), times the
 * micro-batches the stage holds at once (1F1B: min(pp - stage, m);
 * GPipe: m), plus each held micro-batch's stage output (sbh, stages
 * before the last) or head (the last: the final norm's input and output,
 * 2sbh, and the vocabulary-parallel logits, sbV/t), plus the backward's
 * working set at the peak (memory.c gives each term's formula). */
typedef struct zs_stage_memory {
    double params;          /* elements on one rank of the stage */
    zs_state_bytes state;   /* weights, gradients, optimizer (ZeRO over dp) */
    double act_layer;       /* bytes per layer per micro-batch */
    int64_t in_flight;      /* micro-batches held at once */
    double act_head;        /* the last stage's head, in_flight micro-batches */
    double act;             /* layers * in_flight * act_layer + boundary +
                             * act_head */
    double total;           /* state.total + act + work */
    double boundary;        /* stages before the last: in_flight outputs */
    double work;            /* the backward's working set at the peak */
} zs_stage_memory;
zs_status zs_memory_analyze_stage(const zs_model_config *c, const zs_parallel *p,
                                  int64_t stage, int64_t layers, zs_stage_memory *out);

/* Smallest number of devices of device_bytes that can hold total_bytes:
 * ceil(total / device); < 0 + error when device_bytes <= 0. */
int64_t zs_min_devices(double total_bytes, double device_bytes);

/* ---- communication (src/analyze/comm.c) ------------------------------- */
/* Bytes each rank sends in a ring all-reduce of `bytes` over n ranks:
 * 2(n-1)/n * bytes (reduce-scatter then all-gather); 0 for n = 1. */
double zs_ring_allreduce_bytes(double bytes, int64_t n);
/* Bytes each rank sends in a ring all-gather or reduce-scatter:
 * (n-1)/n * bytes. */
double zs_ring_allgather_bytes(double bytes, int64_t n);
/* Pipeline bubble fraction of a step: (p-1)/(m+p-1). GPipe and 1F1B have
 * the same bubble; 1F1B holds min(p, m) micro-batches of activations
 * instead of m. */
double zs_pipeline_bubble(int64_t p, int64_t m);

/* Bytes sent per device per step (one global batch). */
typedef struct zs_comm_report {
    double grad_bytes;      /* gradient bytes of this device's model shard */
    double dp_allreduce;    /* ring all-reduce of the gradients over dp
                             * (ZeRO 1/2: reduce-scatter + all-gather, same) */
    double zero3_gather;    /* ZeRO-3 extra: weights all-gathered again in
                             * backward: (dp-1)/dp * weight bytes */
    double tp_layer;        /* per layer per micro-batch: 4 all-reduces
                             * (2 forward, 2 backward) of b*s*h elements */
    double tp_step;         /* tp_layer * layers/stage * micro-batches
                             * (+2 forward all-reduces per layer under full
                             * recomputation) */
    double pp_p2p;          /* activations forward + gradients backward:
                             * 2 * m * b*s*h elements per stage boundary */
    double tp_embed;        /* per step: the vocabulary-parallel embedding's
                             * forward all-reduce (first stage) and the
                             * head's backward all-reduce of its input (last
                             * stage), b*s*h each per micro-batch: for the
                             * stage holding one of them (pp > 1), both
                             * when pp = 1; not in total, which keeps the
                             * chapter's count */
    double total;
    int64_t micro_batches;
    double bubble_gpipe, bubble_1f1b;
} zs_comm_report;
zs_status zs_comm_analyze(const zs_model_config *c, const zs_parallel *p,
                          zs_comm_report *out);

/* ---- devices and roofline (src/analyze/devices.c) --------------------- */
typedef struct zs_hw_spec {
    char name[32];
    double tflops16;  /* dense fp16/bf16 (tensor cores) peak, TFLOP/s */
    double tflops32;  /* fp32 peak, TFLOP/s */
    double bw_gbs;    /* memory bandwidth, GB/s */
    double mem_gb;    /* device memory, GB */
    bool measured;    /* "cpu": measured on this machine */
} zs_hw_spec;

int zs_hw_count(void);
/* The i-th device of the static table (borrowed) or NULL. */
const zs_hw_spec *zs_hw_at(int i);
/* Looks up a device by name (case-insensitive; "a100" = "a100-80gb",
 * "h100" = "h100-sxm"). "cpu" is measured now with zs_measure_peak_gflops
 * and zs_measure_triad_gbs on zs_num_threads() threads (its 16-bit peak is
 * the fp32 one) and the machine's RAM. ZS_ERR_ARG + message when unknown. */
zs_status zs_hw_lookup(const char *name, zs_hw_spec *out);
/* Peak FLOP/s for a precision (mixed uses the 16-bit peak). */
double zs_hw_peak_flops(const zs_hw_spec *d, zs_precision p);
/* Ridge point of the roofline in FLOP/byte: peak / bandwidth. */
double zs_hw_ridge(const zs_hw_spec *d, zs_precision p);
/* Roofline time of an operator: max(flops / peak, bytes / bandwidth). */
double zs_roofline_seconds(const zs_hw_spec *d, zs_precision p,
                           double flops, double bytes);
/* Seconds for `flops` on `devices` devices at model-FLOPs utilisation
 * mfu (0 < mfu <= 1): flops / (devices * peak * mfu). */
double zs_step_seconds(const zs_hw_spec *d, zs_precision p, double flops,
                       int64_t devices, double mfu);

/* ---- the engine's own count (src/analyze/engine_flops.c) -------------- */
#define ZS_ENGINE_MAX_OPS 16

/* One operator of the engine over one training step. */
typedef struct zs_engine_op {
    char name[32];  /* as zs_profile_stats names it ("linear_gelu", ...) */
    int64_t calls;  /* calls in one step, forward and backward */
    double flops;   /* its cost model summed over those calls */
    double fwd;     /* the part counted in the forward pass */
} zs_engine_op;

typedef struct zs_engine_flops {
    zs_engine_op ops[ZS_ENGINE_MAX_OPS]; /* every operator that counts
                                          * FLOPs, forward ones first */
    int nops;
    double fwd, bwd, total;  /* total = the engine's zs_profile_total_flops */
    double gemm;        /* GEMMs of linear*, matmul: 72BTlh^2 + 6BThV */
    double attention;   /* attention + attention_backward: 3.5 x 4d per
                         * causal (query, key) pair and head */
    double elementwise; /* the rest: biases, GeLU, residuals, norms, loss,
                         * bias and position sums, gradient accumulation */
    double chapter;     /* zs_analyze_step_flops: 72BTlh^2 + 12BT^2lh +
                         * 6BThV (square attention, matmuls only) */
    double six_n;       /* 6 x parameters x B*T tokens */
} zs_engine_flops;

/* Predicts, from the dimensions alone, the FLOPs that each of the engine's
 * operators counts during one training step of Zhisuan's GPT (zs_gpt_loss
 * forward + zs_backward; the optimizer is not an operator) on batch
 * sequences of length seq: out (may be NULL) gets the per-operator
 * breakdown. c must describe a model src/nn/gpt.c builds: GeLU MLP with
 * d_ff = 4h, LayerNorm, biases, tied embeddings, n_kv_head = n_head,
 * n_head * d_head = d_model, and either learned positions (GPT-2) or an
 * embedding norm (BLOOM, ALiBi); 1 <= seq <= seq_len (the context).
 * Returns the total, or < 0 + an error naming what does not fit. */
double zs_analyze_engine_step_flops(const zs_model_config *c, int64_t batch,
                                    int64_t seq, zs_engine_flops *out);

#ifdef __cplusplus
}
#endif
#endif
