/*
 * gpt.c - decoder-only transformers: GPT-2 and the BLOOM variant, for
 * training (full sequences) and generation (incremental, KV cache).
 *
 * x [B, T, C] flows through L pre-LayerNorm blocks:
 *   x += proj(attention(split_heads(c_attn(ln_1(x)))))
 *   x += c_proj(gelu_tanh(c_fc(ln_2(x))))
 * then ln_f and the tied output projection logits = x @ wte^T. Attention is
 * the fused causal kernel (zs_attention: no T x T buffer). Weights follow
 * the [out, in] convention of zs_linear, so y = x @ W^T + b.
 *
 * Activation recomputation (zs_gpt_set_recompute; Korthikanti et al.,
 * "Reducing Activation Recomputation in Large Transformer Models").
 * Their count per layer, in bytes of 16-bit activations with 1-byte
 * dropout masks, s tokens, b sequences, h width, a heads, is
 * 34sbh + 5as^2b: LayerNorm inputs 4sbh, QKV input 2sbh, Q and K 4sbh,
 * V 2sbh, softmax output 2as^2b, its dropout mask as^2b and output 2as^2b,
 * projection input 2sbh, MLP input 2sbh, GeLU input and output 16sbh, two
 * dropout masks 2sbh. What this block keeps, in elements of sbh (f32: 4
 * bytes each), with no dropout and flash attention:
 *   x (ln_1's input, the residual stream) 1, h = ln_1(x) (c_attn's input)
 *   1, qkv (the attention's q, k, v are views of it) 3, the attention's
 *   output o (its backward's delta = do . o) 1 and lse (s a b, tiny),
 *   merged heads (c_proj's input, a copy: permute then reshape) 1, x2
 *   (ln_2's input) 1, h2 (c_fc's input) 1, GeLU input 4 and output 4:
 *   17 sbh elements = 34sbh bytes at 16 bits (68sbh in f32), and no s^2
 *   term: the flash kernel already recomputes the scores in backward.
 * So the s^2 terms that selective recomputation removes in the paper are
 * absent here even without it. Selective recomputation keeps its meaning
 * (recompute the attention core, never a GEMM of the linear layers): the
 * region from qkv to the merged heads runs under zs_checkpoint, which
 * saves qkv (already kept) and drops o and lse: 16 sbh elements, i.e.
 * 32sbh bytes at 16 bits, the paper's 34sbh without its two dropout masks
 * (this GPT has no dropout), for the cost of one more attention forward
 * (4bs^2h causal/2). Extending the region to the c_attn GEMM would drop
 * 3 sbh more (qkv) but recompute 6sbh^2 FLOPs of linear layers, which the
 * paper's selective scheme avoids by design. Full recomputation keeps
 * only each recomputed block's input x (1 sbh) and recomputes the whole
 * block in backward (one more forward of it), as Megatron's
 * recompute_num_layers with the "block" method: blocks 0..N-1.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "zs/attention.h"
#include "zs/autograd.h"
#include "zs/linear.h"
#include "zs/nn.h"
#include "zs/ops.h"

typedef struct gpt_impl gpt_impl;

typedef struct block_params {
    zs_tensor *ln1_w, *ln1_b, *attn_w, *attn_b, *proj_w, *proj_b;
    zs_tensor *ln2_w, *ln2_b, *fc_w, *fc_b, *fcproj_w, *fcproj_b;
    gpt_impl *g;   /* the model and the block's number: the ctx of the */
    int64_t layer; /* block's recomputed regions */
} block_params;

struct gpt_impl {
    zs_gpt_config c;
    zs_tensor *wte, *wpe, *emb_ln_w, *emb_ln_b, *lnf_w, *lnf_b;
    block_params *blocks;
    zs_gpt_block_fn hook; /* see zs_gpt_set_block_hook */
    void *hook_ctx;
    zs_recompute recompute; /* see zs_gpt_set_recompute */
    int64_t recompute_layers;
    bool sparse;            /* see zs_gpt_set_sparse_attention */
    zs_sparse_params sp;
};

int zs_gpt_preset(const char *name, zs_gpt_config *c)
{
    static const struct {
        const char *name;
        int64_t ctx, layers, heads, width;
    } presets[] = {
        {"tiny", 128, 2, 4, 64},
        {"small", 256, 6, 6, 384},
        {"gpt2", 1024, 12, 12, 768},
    };
    for (size_t i = 0; i < sizeof presets / sizeof *presets; i++) {
        if (!strcmp(name, presets[i].name)) {
            c->ctx = presets[i].ctx;
            c->layers = presets[i].layers;
            c->heads = presets[i].heads;
            c->width = presets[i].width;
            return 0;
        }
    }
    zs_set_error("gpt: unknown preset '%s' (known: tiny, small, gpt2)", name);
    return -1;
}

int64_t zs_gpt_param_count(const zs_gpt_config *c)
{
    int64_t C = c->width;
    int64_t n = c->vocab * C + c->layers * (12 * C * C + 13 * C) + 2 * C;
    return n + (c->arch == ZS_BLOOM ? 2 * C : c->ctx * C);
}

static const zs_module_vtable gpt_vt;

static gpt_impl *impl_of(const zs_module *m)
{
    return m && m->vt == &gpt_vt ? m->impl : NULL;
}

const zs_gpt_config *zs_gpt_config_of(const zs_module *gpt)
{
    gpt_impl *g = impl_of(gpt);
    return g ? &g->c : NULL;
}

static zs_tensor *normal(int ndim, const int64_t *shape, double std,
                         uint64_t seed)
{
    return zs_normal(ZS_F32, ndim, shape, 0.0, std, seed);
}

/* Adds a parameter and returns it (borrowed). */
static zs_tensor *add(zs_module *m, const char *name, zs_tensor *t)
{
    return zs_module_add_param(m, name, t);
}

static bool add_block(zs_module *m, block_params *b, int64_t i,
                      const zs_gpt_config *c, uint64_t seed)
{
    int64_t C = c->width;
    double std = 0.02, res_std = 0.02 / sqrt(2.0 * (double)c->layers);
    uint64_t s = seed + 100 * (uint64_t)(i + 1);
    b->ln1_w = add(m, "ln_1.weight", zs_ones(ZS_F32, 1, &C));
    b->ln1_b = add(m, "ln_1.bias", zs_zeros(ZS_F32, 1, &C));
    b->attn_w = add(m, "attn.c_attn.weight", normal(2, (int64_t[]){3 * C, C}, std, s + 1));
    b->attn_b = add(m, "attn.c_attn.bias", zs_zeros(ZS_F32, 1, (int64_t[]){3 * C}));
    b->proj_w = add(m, "attn.c_proj.weight", normal(2, (int64_t[]){C, C}, res_std, s + 2));
    b->proj_b = add(m, "attn.c_proj.bias", zs_zeros(ZS_F32, 1, &C));
    b->ln2_w = add(m, "ln_2.weight", zs_ones(ZS_F32, 1, &C));
    b->ln2_b = add(m, "ln_2.bias", zs_zeros(ZS_F32, 1, &C));
    b->fc_w = add(m, "mlp.c_fc.weight", normal(2, (int64_t[]){4 * C, C}, std, s + 3));
    b->fc_b = add(m, "mlp.c_fc.bias", zs_zeros(ZS_F32, 1, (int64_t[]){4 * C}));
    b->fcproj_w = add(m, "mlp.c_proj.weight", normal(2, (int64_t[]){C, 4 * C}, res_std, s + 4));
    b->fcproj_b = add(m, "mlp.c_proj.bias", zs_zeros(ZS_F32, 1, &C));
    return b->ln1_w && b->ln1_b && b->attn_w && b->attn_b && b->proj_w &&
           b->proj_b && b->ln2_w && b->ln2_b && b->fc_w && b->fc_b &&
           b->fcproj_w && b->fcproj_b;
}

/* A block as a module of its own ("h.<i>", a unit): it runs block i of
 * its GPT, whose impl holds the parameters' pointers. */
typedef struct block_ref {
    gpt_impl *g;
    int64_t layer;
} block_ref;

static zs_tensor *block_forward(gpt_impl *g, int64_t l, zs_tensor *x);

static zs_tensor *block_module_forward(zs_module *m, zs_tensor *x)
{
    const block_ref *r = m->impl;
    return block_forward(r->g, r->layer, x);
}

static void block_free_impl(zs_module *m) { free(m->impl); }

static const zs_module_vtable block_vt = {"GPTBlock", block_module_forward, block_free_impl};

/* Blocks 0..L-1 as the children of a sequential "h" (so h.<i>.*). */
static zs_module *new_blocks(gpt_impl *g, uint64_t seed)
{
    int64_t L = g->c.layers;
    zs_module **mods = calloc((size_t)L, sizeof *mods);
    if (!mods) {
        zs_set_error_code(ZS_ERR_NOMEM, "gpt: out of memory");
        return NULL;
    }
    bool ok = true;
    for (int64_t i = 0; i < L; i++) {
        block_ref *r = ok ? malloc(sizeof *r) : NULL;
        if (r)
            *r = (block_ref){g, i};
        mods[i] = r ? zs_module_new(&block_vt, r) : NULL;
        if (!mods[i])
            free(r);
        ok = mods[i] && add_block(mods[i], &g->blocks[i], i, &g->c, seed);
        g->blocks[i].g = g;
        g->blocks[i].layer = i;
        if (mods[i])
            mods[i]->unit = true;
    }
    zs_module *h = zs_sequential_new((int)L, mods); /* frees them all on failure */
    free(mods);
    return h;
}

static void gpt_free_impl(zs_module *m)
{
    gpt_impl *g = m->impl;
    if (g)
        free(g->blocks);
    free(g);
}

static zs_tensor *gpt_forward(zs_module *m, zs_tensor *idx)
{
    return zs_gpt_logits(m, idx);
}

static const zs_module_vtable gpt_vt = {"GPT", gpt_forward, gpt_free_impl};

zs_module *zs_gpt_new(const zs_gpt_config *c, uint64_t seed)
{
    if (c->vocab <= 0 || c->ctx <= 0 || c->layers <= 0 || c->heads <= 0 ||
        c->width <= 0 || c->width % c->heads != 0) {
        zs_set_error("gpt: vocab %lld, ctx %lld, %lld layers, width %lld, %lld "
                     "heads: expected positive sizes with width divisible by "
                     "heads", (long long)c->vocab, (long long)c->ctx,
                     (long long)c->layers, (long long)c->width,
                     (long long)c->heads);
        return NULL;
    }
    gpt_impl *g = calloc(1, sizeof *g);
    if (g)
        g->blocks = calloc((size_t)c->layers, sizeof *g->blocks);
    zs_module *m = g && g->blocks ? zs_module_new(&gpt_vt, g) : NULL;
    if (!m) {
        if (g)
            free(g->blocks);
        free(g);
        zs_set_error_code(ZS_ERR_NOMEM, "gpt: out of memory");
        return NULL;
    }
    g->c = *c;
    int64_t C = c->width;
    bool ok = (g->wte = add(m, "wte.weight", normal(2, (int64_t[]){c->vocab, C}, 0.02, seed)));
    if (ok && c->arch == ZS_GPT2)
        ok = (g->wpe = add(m, "wpe.weight", normal(2, (int64_t[]){c->ctx, C}, 0.01, seed + 1)));
    if (ok && c->arch == ZS_BLOOM)
        ok = (g->emb_ln_w = add(m, "emb_ln.weight", zs_ones(ZS_F32, 1, &C))) &&
             (g->emb_ln_b = add(m, "emb_ln.bias", zs_zeros(ZS_F32, 1, &C)));
    /* children after the root's own parameters: the flat order (and the
     * checkpoint order) stays wte, wpe, h.0 ... h.L-1, ln_f */
    ok = ok && zs_module_add_child(m, "h", new_blocks(g, seed));
    zs_module *lnf = ok ? zs_module_add_child(m, "ln_f", zs_layernorm_new(C, 1e-5)) : NULL;
    ok = lnf != NULL;
    if (ok) {
        g->lnf_w = lnf->params[0]; /* weight, bias */
        g->lnf_b = lnf->params[1];
    }
    if (!ok) {
        zs_module_free(m);
        return NULL;
    }
    return m;
}

/* ---- forward ----------------------------------------------------------- */


/* Token (+ position) embedding of idx [B, n] at positions pos..pos+n-1. */
static zs_tensor *embed(gpt_impl *g, zs_tensor *idx, int64_t pos)
{
    zs_tensor *tok = zs_embedding(g->wte, idx);
    if (g->c.arch == ZS_BLOOM) {
        zs_tensor *x = zs_layer_norm(tok, g->emb_ln_w, g->emb_ln_b, 1e-5);
        zs_release(tok);
        return x;
    }
    zs_tensor *wpe = zs_narrow(g->wpe, 0, pos, idx->shape[1]);
    zs_tensor *x = zs_add(tok, wpe); /* [B, n, C] + [n, C] */
    zs_release(tok);
    zs_release(wpe);
    return x;
}

/* The attention core: qkv [B, n, 3C] -> the heads' outputs merged
 * [B, n, C] (the region selective recomputation replays). */
static zs_tensor *attention_core(const gpt_impl *g, zs_tensor *qkv)
{
    int64_t B = qkv->shape[0], n = qkv->shape[1], C = g->c.width, H = g->c.heads;
    int64_t D = C / H;
    zs_tensor *r = zs_reshape(qkv, 5, (int64_t[]){B, n, 3, H, D});
    zs_tensor *p = zs_permute(r, (int[]){2, 0, 3, 1, 4});          /* [3,B,H,n,D] */
    zs_tensor *parts[3] = {NULL, NULL, NULL};
    for (int i = 0; i < 3; i++) {
        zs_tensor *s = zs_narrow(p, 0, i, 1);
        parts[i] = zs_squeeze(s, 0);
        zs_release(s);
    }
    zs_attention_params ap = {.causal = true, .alibi = g->c.arch == ZS_BLOOM};
    zs_tensor *k = zs_retain(parts[1]), *v = zs_retain(parts[2]);
    zs_tensor *a = g->sparse ? zs_sparse_attention(parts[0], k, v, &g->sp)
                             : zs_attention(parts[0], k, v, &ap);   /* [B,H,n,D] */
    zs_tensor *at = zs_permute(a, (int[]){0, 2, 1, 3});             /* [B,n,H,D] */
    zs_tensor *merged = zs_reshape(at, 3, (int64_t[]){B, n, C});
    zs_tensor *tmp[] = {r, p, parts[0], parts[1], parts[2], k, v, a, at};
    for (size_t i = 0; i < sizeof tmp / sizeof *tmp; i++)
        zs_release(tmp[i]);
    return merged;
}

/* zs_grad_fn of the selective region: in[0] = qkv, ctx the block. */
static zs_tensor *core_region(void *ctx, zs_tensor **in)
{
    const block_params *b = ctx;
    return attention_core(b->g, in[0]);
}

/* x + proj(attention(h)) for h = ln_1(x) [B, n, C]. */
static zs_tensor *attention_block(gpt_impl *g, block_params *b,
                                  zs_tensor *x, zs_tensor *h)
{
    zs_tensor *qkv = zs_linear(h, b->attn_w, b->attn_b);           /* [B,n,3C] */
    bool sel = g->recompute == ZS_RECOMPUTE_SELECTIVE && zs_grad_enabled();
    zs_tensor *merged = !qkv ? NULL : sel ? zs_checkpoint(core_region, b, 1, &qkv)
                                          : attention_core(g, qkv);
    zs_tensor *out = zs_linear_residual(merged, b->proj_w, b->proj_b, x);
    zs_release(qkv);
    zs_release(merged);
    return out;
}

/* x + c_proj(gelu(c_fc(h))) for h = ln_2(x), with the bias, GeLU and
 * residual fused into the GEMMs' epilogues. */
static zs_tensor *mlp_block(const block_params *b, zs_tensor *x, zs_tensor *h)
{
    zs_tensor *a = zs_linear_gelu(h, b->fc_w, b->fc_b);
    zs_tensor *out = zs_linear_residual(a, b->fcproj_w, b->fcproj_b, x);
    zs_release(a);
    return out;
}

static zs_status block_backward(void *ctx, int64_t block)
{
    const gpt_impl *g = ctx;
    return g->hook ? g->hook(g->hook_ctx, block, ZS_GPT_BLOCK_BACKWARD) : ZS_OK;
}

void zs_gpt_set_block_hook(zs_module *gpt, zs_gpt_block_fn fn, void *ctx)
{
    gpt_impl *g = impl_of(gpt);
    if (g) {
        g->hook = fn;
        g->hook_ctx = ctx;
    }
}

zs_status zs_gpt_set_recompute(zs_module *gpt, zs_recompute mode, int64_t layers)
{
    gpt_impl *g = impl_of(gpt);
    if (!g)
        return zs_set_error("gpt_set_recompute: module is not a GPT");
    if ((mode != ZS_RECOMPUTE_NONE && mode != ZS_RECOMPUTE_FULL &&
         mode != ZS_RECOMPUTE_SELECTIVE) || layers < 0)
        return zs_set_error("gpt_set_recompute: mode %d, %lld layers: expected "
                            "none, full or selective and layers >= 0 (0: all)",
                            (int)mode, (long long)layers);
    g->recompute = mode;
    g->recompute_layers = layers;
    return ZS_OK;
}

zs_status zs_gpt_set_sparse_attention(zs_module *gpt, const zs_sparse_params *p)
{
    gpt_impl *g = impl_of(gpt);
    if (!g)
        return zs_set_error("gpt_set_sparse_attention: module is not a GPT");
    if (!p) {
        g->sparse = false;
        return ZS_OK;
    }
    if (g->c.arch == ZS_BLOOM)
        return zs_set_error("gpt_set_sparse_attention: BLOOM's ALiBi bias has no "
                            "sparse kernel (use --arch gpt2)");
    zs_sparse_params sp = *p;
    sp.causal = true;
    zs_sparse_layout *l = zs_sparse_layout_new(&sp, 1); /* checks the values */
    if (!l)
        return ZS_ERR_ARG;
    zs_sparse_layout_free(l);
    g->sp = sp;
    g->sparse = true;
    return ZS_OK;
}

zs_status zs_gpt_get_recompute(const zs_module *gpt, zs_recompute *mode, int64_t *layers)
{
    const gpt_impl *g = impl_of(gpt);
    if (!g)
        return zs_set_error("gpt_get_recompute: module is not a GPT");
    *mode = g->recompute;
    *layers = g->recompute_layers;
    return ZS_OK;
}

const zs_sparse_params *zs_gpt_sparse_attention_of(const zs_module *gpt)
{
    const gpt_impl *g = impl_of(gpt);
    return g && g->sparse ? &g->sp : NULL;
}

/* The block's layers on x [B, n, C] (borrowed): a new x. */
static zs_tensor *block_body(gpt_impl *g, int64_t l, zs_tensor *x)
{
    block_params *b = &g->blocks[l];
    zs_tensor *h = zs_layer_norm(x, b->ln1_w, b->ln1_b, 1e-5);
    zs_tensor *x2 = h ? attention_block(g, b, x, h) : NULL;
    zs_tensor *h2 = zs_layer_norm(x2, b->ln2_w, b->ln2_b, 1e-5);
    zs_tensor *x3 = h2 ? mlp_block(b, x2, h2) : NULL;
    zs_release(h);
    zs_release(x2);
    zs_release(h2);
    return x3;
}

/* zs_grad_fn of the full region: in[0] = the block's input. */
static zs_tensor *block_region(void *ctx, zs_tensor **in)
{
    const block_params *b = ctx;
    return block_body(b->g, b->layer, in[0]);
}

/* Block l under full recomputation (training only). */
static bool full_recompute(const gpt_impl *g, int64_t l)
{
    int64_t n = g->recompute_layers;
    return g->recompute == ZS_RECOMPUTE_FULL && zs_grad_enabled() &&
           (n <= 0 || l < n);
}

/* Block l on x [B, n, C] (borrowed): a new x, with the block hook's
 * events around it. */
static zs_tensor *block_forward(gpt_impl *g, int64_t l, zs_tensor *x)
{
    bool ok = x && (!g->hook || g->hook(g->hook_ctx, l, ZS_GPT_BLOCK_ENTER) == ZS_OK);
    zs_tensor *x3 = !ok ? NULL : full_recompute(g, l)
                                     ? zs_checkpoint(block_region, &g->blocks[l], 1, &x)
                                     : block_body(g, l, x);
    if (x3 && g->hook) {
        zs_tensor *y = zs_grad_enabled() ? zs_backward_hook(x3, block_backward, g, l)
                                         : zs_retain(x3);
        zs_release(x3);
        x3 = y && g->hook(g->hook_ctx, l, ZS_GPT_BLOCK_LEAVE) == ZS_OK ? y : NULL;
        if (!x3)
            zs_release(y);
    }
    return x3;
}

/* Final hidden states ln_f(x) [B, n, C]. */
static zs_tensor *hidden(gpt_impl *g, zs_tensor *idx)
{
    zs_tensor *x = embed(g, idx, 0);
    for (int64_t l = 0; x && l < g->c.layers; l++) {
        zs_tensor *y = block_forward(g, l, x);
        zs_release(x);
        x = y;
    }
    zs_tensor *out = zs_layer_norm(x, g->lnf_w, g->lnf_b, 1e-5);
    zs_release(x);
    return out;
}

static zs_status check_idx(const gpt_impl *g, const zs_tensor *idx, int64_t pos)
{
    if (!idx)
        return ZS_ERR_ARG;
    if (idx->ndim != 2 || idx->dtype != ZS_I64) {
        char s[96];
        return zs_set_error("gpt: token ids %s %s, expected i64 [B, T]",
                            zs_shape_str(idx, s, sizeof s), zs_dtype_name(idx->dtype));
    }
    if (pos + idx->shape[1] > g->c.ctx || idx->shape[1] == 0)
        return zs_set_error("gpt: sequence of %lld tokens at position %lld "
                            "exceeds the model's context of %lld",
                            (long long)idx->shape[1], (long long)pos,
                            (long long)g->c.ctx);
    return ZS_OK;
}

zs_tensor *zs_gpt_logits(zs_module *gpt, zs_tensor *idx)
{
    gpt_impl *g = impl_of(gpt);
    if (!g) {
        zs_set_error("gpt_logits: module is not a GPT");
        return NULL;
    }
    if (check_idx(g, idx, 0) != ZS_OK)
        return NULL;
    zs_tensor *x = hidden(g, idx);
    zs_tensor *logits = zs_matmul_t(x, g->wte, false, true);
    zs_release(x);
    return logits;
}

zs_tensor *zs_gpt_loss(zs_module *gpt, zs_tensor *idx, zs_tensor *targets)
{
    if (!targets)
        return NULL;
    if (idx && (targets->ndim != 2 || !zs_same_shape(idx, targets))) {
        char a[96], b[96];
        zs_set_error("gpt_loss: targets %s do not match ids %s",
                     zs_shape_str(targets, a, sizeof a), zs_shape_str(idx, b, sizeof b));
        return NULL;
    }
    zs_tensor *logits = zs_gpt_logits(gpt, idx);
    if (!logits)
        return NULL;
    int64_t V = logits->shape[2];
    zs_tensor *flat = zs_reshape(logits, 2, (int64_t[]){-1, V});
    zs_tensor *tf = zs_reshape(targets, 1, (int64_t[]){-1});
    zs_tensor *loss = zs_cross_entropy(flat, tf, -1);
    zs_release(logits);
    zs_release(flat);
    zs_release(tf);
    return loss;
}
