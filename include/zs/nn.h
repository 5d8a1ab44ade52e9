/*
 * zs/nn.h - neural-network modules.
 *
 * A zs_module is a node of a tree: it owns named parameters (leaf tensors
 * that require grad), named buffers (state without gradients, such as batch
 * norm's running statistics) and named children. forward takes a borrowed
 * input and returns a new reference, like every operator.
 *
 * zs_module_flatten moves every parameter of a tree into one flat buffer
 * (and every gradient into another), so that an optimizer step, a gradient
 * all-reduce or a checkpoint is one call over contiguous memory, as in
 * llm.c. Parameter tensors become views into the flat buffer.
 */
#ifndef ZS_NN_H
#define ZS_NN_H

#include "analyze.h" /* zs_recompute */
#include "core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct zs_module zs_module;

typedef struct zs_module_vtable {
    const char *type;
    zs_tensor *(*forward)(zs_module *m, zs_tensor *x);
    void (*free_impl)(zs_module *m); /* frees m->impl; may be NULL */
} zs_module_vtable;

struct zs_module {
    const zs_module_vtable *vt;
    void *impl;
    bool training;
    /* A repeated block (a transformer layer): its parameters are used
     * together, so ZeRO-3 gathers and drops them as one unit
     * (zs_module_units). Set by the module that creates the block. */
    bool unit;
    int nparams, nbuffers, nchildren;
    char **param_names, **buffer_names, **child_names;
    zs_tensor **params;   /* owned references */
    zs_tensor **buffers;  /* owned references */
    zs_module **children; /* owned */
};

typedef enum zs_init {
    ZS_INIT_DEFAULT = 0,  /* PyTorch's default: kaiming-uniform(a=sqrt 5) */
    ZS_INIT_KAIMING_NORMAL,
    ZS_INIT_KAIMING_UNIFORM,
    ZS_INIT_XAVIER_NORMAL,
    ZS_INIT_XAVIER_UNIFORM,
    ZS_INIT_NORMAL_002,   /* N(0, 0.02), as GPT-2 */
} zs_init;

/* ---- construction (library and user modules) ------------------------ */

/* A module with no parameters yet; vt is borrowed (static). */
zs_module *zs_module_new(const zs_module_vtable *vt, void *impl);
/* Adds a parameter (steals t; marks it requires_grad) / buffer (steals) /
 * child (steals). Return the added object (borrowed) or NULL. */
zs_tensor *zs_module_add_param(zs_module *m, const char *name, zs_tensor *t);
zs_tensor *zs_module_add_buffer(zs_module *m, const char *name, zs_tensor *t);
zs_module *zs_module_add_child(zs_module *m, const char *name, zs_module *c);
void zs_module_free(zs_module *m);

/* ---- use ------------------------------------------------------------- */

zs_tensor *zs_module_forward(zs_module *m, zs_tensor *x);
/* Sets training mode on the whole tree. */
void zs_module_train(zs_module *m, bool training);

/* Every parameter of the tree, depth first, with dotted names
 * ("features.0.weight"). Arrays are malloc'd (free both and each name);
 * tensors are borrowed. Returns the count or < 0. */
int zs_module_parameters(zs_module *m, zs_tensor ***params, char ***names);
/* Same for buffers. */
int zs_module_buffers(zs_module *m, zs_tensor ***bufs, char ***names);
void zs_names_free(int n, zs_tensor **ts, char **names);
int64_t zs_module_num_params(zs_module *m);

/* Moves parameters into one flat f32 buffer and gives each a gradient view
 * into a second flat buffer (zeroed). Returns the two buffers (borrowed,
 * owned by the root module) via out-params. flat_grads NULL: no gradient
 * buffer, the parameters' .grad are dropped (backward allocates them, as
 * ZeRO stage 2 wants). */
zs_status zs_module_flatten(zs_module *m, zs_tensor **flat_params,
                            zs_tensor **flat_grads);
/* Converts every parameter and buffer of the tree to dtype dt in place
 * (the tensor objects stay, so modules keep their pointers); gradients are
 * dropped. For float64 gradient checks of whole models. Not after flatten. */
zs_status zs_module_to_dtype(zs_module *m, zs_dtype dt);
/* Moves every parameter and buffer of the tree to device in place (the
 * tensor objects stay, so modules keep their pointers; their storage is
 * replaced by a copy there); gradients are dropped. Not after flatten:
 * move first, and flatten puts the flat buffers on the parameters'
 * device. */
zs_status zs_module_to_device(zs_module *m, int device);
/* The device of the module's parameters (ZS_CPU for a module with none). */
int zs_module_device(zs_module *m);
/* Zeroes every parameter's gradient in place. */
void zs_module_zero_grad(zs_module *m);
/* The units of a tree: its modules marked `unit`, numbered 0, 1, ... in
 * depth-first order (a unit inside a unit belongs to the outer one).
 * group[i] (n entries, caller's) receives the number of the unit holding
 * params[i], or -1 for a parameter outside every unit (embeddings, a
 * final norm). Returns the number of units, or a negative status when a
 * parameter is not in the tree. For a GPT, unit i is block i. */
int zs_module_units(zs_module *m, int n, zs_tensor *const *params, int *group);

/* ---- layers ------------------------------------------------------------ */

/* x [..., in] -> [..., out]; weight [out, in], bias [out]. */
zs_module *zs_linear_new(int64_t in, int64_t out, bool bias, zs_init init,
                         uint64_t seed);
zs_module *zs_conv2d_new(int64_t in_ch, int64_t out_ch, int kernel, int stride,
                         int padding, int groups, bool bias, zs_init init,
                         uint64_t seed);
zs_module *zs_maxpool2d_new(int kernel, int stride);
zs_module *zs_avgpool2d_new(int kernel, int stride);
/* C features; affine weight/bias, running stats as buffers. */
zs_module *zs_batchnorm_new(int64_t channels, double momentum, double eps);
zs_module *zs_layernorm_new(int64_t dim, double eps);
zs_module *zs_embedding_new(int64_t vocab, int64_t dim, uint64_t seed);
zs_module *zs_dropout_new(double p);
/* [N, ...] -> [N, prod(...)] */
zs_module *zs_flatten_new(void);

typedef enum zs_activation {
    ZS_ACT_RELU, ZS_ACT_TANH, ZS_ACT_SIGMOID, ZS_ACT_GELU, ZS_ACT_GELU_TANH,
    ZS_ACT_SILU,
} zs_activation;
zs_module *zs_activation_new(zs_activation a);

/* Runs children in order; steals the n modules. */
zs_module *zs_sequential_new(int n, zs_module **mods);

/* ---- models ------------------------------------------------------------ */

/* LeNet-5 for [N, 1, 28, 28] inputs, 10 classes (conv 6@5x5 pad 2, pool,
 * conv 16@5x5, pool, fc 120, fc 84, fc 10; ReLU). */
zs_module *zs_lenet5_new(uint64_t seed);
/* A small ResNet for [N, 1, 28, 28]: stem conv 32, three stages of
 * residual blocks (32, 64, 128 channels, stride 2 between stages) with
 * batch norm, global average pooling, fc 10. */
zs_module *zs_resnet_small_new(uint64_t seed);
/* The CNN of a name: "lenet" (zs_lenet5_new) or "resnet"
 * (zs_resnet_small_new); NULL + error for other names. */
zs_module *zs_cnn_new(const char *name, uint64_t seed);

/* ---- GPT ------------------------------------------------------------------ */

typedef enum zs_gpt_arch { ZS_GPT2 = 0, ZS_BLOOM = 1 } zs_gpt_arch;

typedef struct zs_gpt_config {
    zs_gpt_arch arch;
    int64_t vocab;     /* tokenizer vocabulary size */
    int64_t ctx;       /* maximum sequence length */
    int64_t layers, heads, width;
} zs_gpt_config;

/* Presets: "tiny" (2 layers, 64 wide, 4 heads, ctx 128), "small" (6, 384,
 * 6, ctx 256), "gpt2" (12, 768, 12, ctx 1024). vocab is left to the
 * caller (the tokenizer's size). Returns 0 or < 0 for an unknown name. */
int zs_gpt_preset(const char *name, zs_gpt_config *c);
/* Parameter count by formula: V*C (+ ctx*C for GPT-2 positions, + 2C for
 * BLOOM's embedding LayerNorm) + L*(12C^2 + 13C) + 2C (final LayerNorm);
 * the output projection is tied to the token embedding. */
int64_t zs_gpt_param_count(const zs_gpt_config *c);

/* GPT-2 (pre-LayerNorm, learned positions, causal multi-head attention,
 * 4x MLP with tanh-GeLU, tied embeddings, N(0, 0.02) init with residual
 * projections scaled by 1/sqrt(2L)) or BLOOM (ALiBi instead of positions,
 * LayerNorm after the embedding). Parameters named as in GPT-2:
 * wte, wpe, h.<i>.ln_1, h.<i>.attn.c_attn, h.<i>.attn.c_proj, h.<i>.ln_2,
 * h.<i>.mlp.c_fc, h.<i>.mlp.c_proj, ln_f. The tree: the embeddings are the
 * root's parameters; child "h" runs the blocks "h.<i>" in order, each a
 * child module marked `unit` (its forward is the block on x [B, T, C]);
 * child "ln_f" is the final LayerNorm. */
zs_module *zs_gpt_new(const zs_gpt_config *c, uint64_t seed);
const zs_gpt_config *zs_gpt_config_of(const zs_module *gpt);

/* Checks a config's values (ranges, heads dividing width, a parameter count
 * that fits in memory arithmetic) without allocating. ZS_OK or an error
 * naming the bad field. */
zs_status zs_gpt_config_check(const zs_gpt_config *c);
/* The config in a checkpoint's metadata (as written by `zs train gpt`:
 * "arch" gpt2|bloom, "vocab", "ctx", "layers", "heads", "width"), checked
 * with zs_gpt_config_check. An unknown arch or a missing or non-integer
 * field is an error. */
zs_status zs_gpt_config_from_metadata(const char *metadata_json,
                                      zs_gpt_config *out);
/* The inverse: c as a metadata JSON object ("model":"gpt" and the fields
 * above) into buf[0, n); false when it does not fit. */
bool zs_gpt_config_to_metadata(const zs_gpt_config *c, char *buf, size_t n);
/* Builds the GPT a checkpoint file holds: reads the file once, takes the
 * config from its metadata, checks the config against the file's tensors
 * (every parameter present with its shape, nothing more) before allocating
 * the model, then copies the weights (optimizer state is ignored). Returns
 * a new module or NULL + message; *metadata_json (may be NULL) receives a
 * malloc'd copy of the metadata on success. */
zs_module *zs_gpt_load(const char *path, char **metadata_json);

/* Logits [B, T, V] for token ids idx [B, T] (i64), T <= ctx. */
zs_tensor *zs_gpt_logits(zs_module *gpt, zs_tensor *idx);
/* Mean cross-entropy of next-token prediction: targets [B, T] (i64,
 * -1 = ignore). */
zs_tensor *zs_gpt_loss(zs_module *gpt, zs_tensor *idx, zs_tensor *targets);

/* Events of a GPT block's parameters, for code that keeps them elsewhere
 * between uses (ZeRO-3): ENTER before block i's forward reads them, LEAVE
 * after it, BACKWARD before block i's backward (in grad mode the block's
 * output carries a zs_backward_hook). A failing hook stops the forward
 * (NULL result) or the backward with its message. */
typedef enum zs_gpt_block_event {
    ZS_GPT_BLOCK_ENTER,
    ZS_GPT_BLOCK_LEAVE,
    ZS_GPT_BLOCK_BACKWARD,
} zs_gpt_block_event;
typedef zs_status (*zs_gpt_block_fn)(void *ctx, int64_t block, zs_gpt_block_event ev);
/* Installs (fn NULL: removes) the block hook of a GPT. */
void zs_gpt_set_block_hook(zs_module *gpt, zs_gpt_block_fn fn, void *ctx);
/* Activation recomputation of a GPT in training (src/nn/gpt.c explains
 * what each mode keeps, against Korthikanti et al.'s 34sbh + 5as^2b;
 * zs_recompute is zs/analyze.h's, whose formulas it follows): NONE (the
 * default) keeps every block's activations; FULL runs each of the blocks
 * 0..layers-1 (layers 0: all, as Megatron's recompute_num_layers) under
 * zs_checkpoint, keeping only its input; SELECTIVE recomputes only each
 * block's attention core (from the fused q, k, v projection's output to
 * the merged heads). Only grad-mode forwards are affected; losses and
 * gradients are bit-identical to NONE. ZS_OK, or an error for a module
 * that is not a GPT, an unknown mode or layers < 0. */
zs_status zs_gpt_set_recompute(zs_module *gpt, zs_recompute mode, int64_t layers);
struct zs_sparse_params;
/* Block-sparse attention for a GPT's blocks (zs_sparse_attention of
 * zs/attention.h with p's layout, made causal whatever p says; scale from
 * p, 0: 1/sqrt(D)); p NULL goes back to the dense fused attention. Applies
 * to full-sequence forwards (training, zs_gpt_logits/loss), not to the KV
 * cache of zs/infer.h. BLOOM's ALiBi has no sparse kernel: an error. ZS_OK
 * or an error (also for p's bad values, checked for a T of 1). */
zs_status zs_gpt_set_sparse_attention(zs_module *gpt, const struct zs_sparse_params *p);
/* The settings above, as set (the model-parallel trainer gives them to
 * the split model it cuts from this GPT): the recomputation mode and
 * layers (ZS_OK, or an error for a module that is not a GPT), and the
 * sparse attention's parameters (borrowed until the next set; NULL:
 * dense attention or not a GPT). */
zs_status zs_gpt_get_recompute(const zs_module *gpt, zs_recompute *mode, int64_t *layers);
const struct zs_sparse_params *zs_gpt_sparse_attention_of(const zs_module *gpt);

/* Generation with a KV cache: zs_llm and zs_engine (zs/infer.h). */

/* ---- checkpoints -------------------------------------------------------- */

struct zs_optim;

/* Saves parameters and buffers under their dotted names, the optimizer's
 * state (if o) under "optim.<name>" and metadata (a JSON object of string
 * values, may be NULL) to a safetensors file, atomically. */
zs_status zs_module_save(const char *path, zs_module *m, struct zs_optim *o,
                             const char *metadata_json);
/* Loads a checkpoint written by zs_module_save into m (and o): every
 * parameter and buffer must be present with the same shape, or nothing is
 * changed and the message names the first mismatch. *metadata_json (if
 * not NULL) receives a malloc'd copy of the metadata. */
zs_status zs_module_load(const char *path, zs_module *m, struct zs_optim *o,
                             char **metadata_json);

#ifdef __cplusplus
}
#endif
#endif
