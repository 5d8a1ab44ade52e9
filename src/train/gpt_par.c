/*
 * gpt_par.c - one rank's part of a GPT under model parallelism (issue 28):
 * the blocks [l0, l1) of a pipeline stage, each split over a
 * tensor-parallel group as Megatron-LM does (zs/tp.h):
 *   attention: c_attn column-parallel (each rank a slice of the heads'
 *              q, k and v: zs_tp_shard's 3 blocks), c_proj row-parallel
 *   MLP:       c_fc column-parallel, c_proj row-parallel
 *   wte:       the vocabulary-parallel embedding on the first stage and
 *              the tied head (logits [.., V/P]) with the
 *              vocabulary-parallel cross-entropy on the last
 *   norms, wpe, the row-parallel biases: replicated.
 * With sequence parallelism the residual stream between the linears is
 * this rank's sequence shard [b, T/P, C] (norms run on shards; the
 * linears gather / reduce-scatter): the replicated parameters then get
 * partial gradients, which the caller sums over tp after backward
 * (zsi_pgpt_replicated).
 *
 * Parameters keep the one-process names ("h.3.mlp.c_fc.weight"), so a
 * checkpoint moves between layouts name by name. This GPT has no dropout
 * (zs/nn.h), so there is no dropout seed to give; the rule Megatron uses
 * is zs_tp_dropout_seed. Attention is the fused kernel, except BLOOM on
 * several tp ranks, whose ALiBi slopes depend on the head's global
 * number: that path computes softmax(q k^T / sqrt(D) + alibi + mask) v
 * with ordinary operators on this rank's heads.
 *
 * Recomputation and sparse attention follow the one-process GPT the part
 * is cut from (zs_gpt_set_recompute, zs_gpt_set_sparse_attention; their
 * contracts and memory accounting in src/nn/gpt.c), through the same
 * library API:
 *   selective: the attention core (this rank's heads, from qkv to the
 *     merged heads) runs under zs_checkpoint; it holds no collective.
 *   full: blocks l < recompute_layers (0: all; global block numbers, so
 *     the same blocks as one process) run under zs_checkpoint keeping only
 *     their input. The region holds the block's tp collectives (tp_copy /
 *     sp_gather in, all-reduce / reduce-scatter out): the replay in
 *     backward runs the forward collectives again, then the region's
 *     backward collectives, as Megatron's recomputation does. They match
 *     across the tp group because every tp rank of a stage runs the same
 *     schedule on the same micro-batches: the same regions are replayed
 *     in the same order on each. zs_checkpoint restores the RNG state
 *     (the seed Megatron's dropout would draw from; this GPT has none).
 *     Under pp each micro-batch's regions keep that micro-batch's input
 *     (their node in its graph) until its backward.
 *   sparse: each rank runs the block-sparse kernel on its heads; the
 *     layout is the same for every head (zs/attention.h), so the split
 *     computes exactly the one-process heads. BLOOM has no sparse kernel
 *     (refused when it is set on the GPT).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "train/par.h"
#include "zs/attention.h"
#include "zs/autograd.h"
#include "zs/linear.h"

typedef struct pblock {
    zs_tensor *ln1_w, *ln1_b, *attn_w, *attn_b, *proj_w, *proj_b;
    zs_tensor *ln2_w, *ln2_b, *fc_w, *fc_b, *fcproj_w, *fcproj_b;
    zsi_pgpt *pg;  /* the part and the block's global number: the ctx */
    int64_t layer; /* of the block's recomputed regions */
} pblock;

struct zsi_pgpt {
    zs_gpt_config c;
    zs_comm *tp;
    int tr, tn;        /* tp rank and size */
    bool sp;
    int64_t l0, l1;
    bool first, last;
    zs_module *m;      /* holds the parameters (owned) */
    zs_tensor *wte, *wpe, *emb_ln_w, *emb_ln_b, *lnf_w, *lnf_b;
    pblock *b;         /* blocks l0 .. l1-1 */
    zs_recompute recompute; /* the one-process GPT's settings */
    int64_t recompute_layers;
    bool sparse;
    zs_sparse_params sparams;
};

int64_t zsi_gpt_param_layer(const char *name, int64_t layers)
{
    if (!strncmp(name, "h.", 2))
        return strtoll(name + 2, NULL, 10);
    return !strncmp(name, "ln_f.", 5) ? layers : -1;
}

bool zsi_gpt_param_split(const char *name, int *dim, int *blocks)
{
    static const struct {
        const char *suffix;
        int dim, blocks;
    } rules[] = {
        {"attn.c_attn.weight", 0, 3}, {"attn.c_attn.bias", 0, 3},
        {"attn.c_proj.weight", 1, 1}, {"mlp.c_fc.weight", 0, 1},
        {"mlp.c_fc.bias", 0, 1},      {"mlp.c_proj.weight", 1, 1},
    };
    size_t n = strlen(name);
    *dim = 0, *blocks = 1;
    if (!strcmp(name, "wte.weight"))
        return true;
    for (size_t i = 0; i < sizeof rules / sizeof *rules; i++) {
        size_t k = strlen(rules[i].suffix);
        if (n > k && !strcmp(name + n - k, rules[i].suffix) && name[n - k - 1] == '.') {
            *dim = rules[i].dim, *blocks = rules[i].blocks;
            return true;
        }
    }
    return false;
}

bool zsi_pgpt_holds(const zsi_pgpt *pg, const char *name)
{
    int64_t l = zsi_gpt_param_layer(name, pg->c.layers);
    if (l < 0)
        return pg->first || (pg->last && !strcmp(name, "wte.weight"));
    if (l == pg->c.layers)
        return pg->last;
    return l >= pg->l0 && l < pg->l1;
}

static void pgpt_free_impl(zs_module *m) { (void)m; }

static zs_tensor *pgpt_forward(zs_module *m, zs_tensor *x)
{
    (void)m, (void)x;
    zs_set_error("model-parallel GPT: run by the trainer's pipeline, not forward");
    return NULL;
}

static const zs_module_vtable pgpt_vt = {"GPTPart", pgpt_forward, pgpt_free_impl};

/* The sizes tp must divide; ZS_OK or an error naming them. */
static zs_status check_split(const zs_gpt_config *c, int P)
{
    if (c->heads % P || c->vocab % P)
        return zs_set_error("tensor parallel over %d ranks: the %lld heads and the "
                            "vocabulary of %lld must divide by %d", P,
                            (long long)c->heads, (long long)c->vocab, P);
    return ZS_OK;
}

/* The pointer slot of parameter `name` (layer l) in pg. */
static zs_tensor **slot(zsi_pgpt *pg, const char *name, int64_t l)
{
    static const char *gl[] = {"wte.weight", "wpe.weight", "emb_ln.weight",
                               "emb_ln.bias", "ln_f.weight", "ln_f.bias"};
    zs_tensor **gs[] = {&pg->wte, &pg->wpe, &pg->emb_ln_w, &pg->emb_ln_b,
                        &pg->lnf_w, &pg->lnf_b};
    for (int i = 0; i < 6; i++)
        if (!strcmp(name, gl[i]))
            return gs[i];
    static const char *bl[] = {"ln_1.weight", "ln_1.bias", "attn.c_attn.weight",
                               "attn.c_attn.bias", "attn.c_proj.weight",
                               "attn.c_proj.bias", "ln_2.weight", "ln_2.bias",
                               "mlp.c_fc.weight", "mlp.c_fc.bias",
                               "mlp.c_proj.weight", "mlp.c_proj.bias"};
    const char *dot = strchr(name + 2, '.');
    if (l < 0 || l >= pg->c.layers || !dot)
        return NULL;
    pblock *b = &pg->b[l - pg->l0];
    zs_tensor **bs[] = {&b->ln1_w, &b->ln1_b, &b->attn_w, &b->attn_b, &b->proj_w,
                        &b->proj_b, &b->ln2_w, &b->ln2_b, &b->fc_w, &b->fc_b,
                        &b->fcproj_w, &b->fcproj_b};
    for (int i = 0; i < 12; i++)
        if (!strcmp(dot + 1, bl[i]))
            return bs[i];
    return NULL;
}

zsi_pgpt *zsi_pgpt_new(zs_module *full, zs_comm *tp, bool sp, int64_t l0, int64_t l1,
                       bool first, bool last)
{
    const zs_gpt_config *c = zs_gpt_config_of(full);
    if (!c || !tp) {
        zs_set_error("model-parallel GPT: the model is not a GPT");
        return NULL;
    }
    int P = zs_comm_size(tp);
    if (check_split(c, P) != ZS_OK)
        return NULL;
    zsi_pgpt *pg = calloc(1, sizeof *pg);
    if (pg)
        pg->b = calloc((size_t)(l1 - l0 > 0 ? l1 - l0 : 1), sizeof *pg->b);
    if (pg && pg->b)
        pg->m = zs_module_new(&pgpt_vt, pg);
    if (!pg || !pg->m) {
        zsi_pgpt_free(pg);
        zs_set_error_code(ZS_ERR_NOMEM, "model-parallel GPT: out of memory");
        return NULL;
    }
    pg->c = *c;
    pg->tp = tp;
    pg->tr = zs_comm_rank(tp);
    pg->tn = P;
    pg->sp = sp;
    pg->l0 = l0, pg->l1 = l1;
    pg->first = first, pg->last = last;
    for (int64_t l = l0; l < l1; l++)
        pg->b[l - l0].pg = pg, pg->b[l - l0].layer = l;
    const zs_sparse_params *spa = zs_gpt_sparse_attention_of(full);
    if ((pg->sparse = spa != NULL))
        pg->sparams = *spa;
    zs_gpt_get_recompute(full, &pg->recompute, &pg->recompute_layers);
    zs_tensor **ps;
    char **names;
    int n = zs_module_parameters(full, &ps, &names);
    bool ok = n > 0;
    for (int i = 0; ok && i < n; i++) {
        if (!zsi_pgpt_holds(pg, names[i]))
            continue;
        int dim, blocks;
        bool split = zsi_gpt_param_split(names[i], &dim, &blocks);
        zs_tensor *s = zs_tp_shard(ps[i], dim, blocks, split ? pg->tr : 0, split ? P : 1);
        zs_tensor **sl = slot(pg, names[i], zsi_gpt_param_layer(names[i], c->layers));
        ok = sl && (*sl = zs_module_add_param(pg->m, names[i], s));
    }
    if (n >= 0)
        zs_names_free(n, ps, names);
    if (!ok) {
        zsi_pgpt_free(pg);
        return NULL;
    }
    return pg;
}

void zsi_pgpt_free(zsi_pgpt *pg)
{
    if (!pg)
        return;
    zs_module_free(pg->m);
    free(pg->b);
    free(pg);
}

zs_module *zsi_pgpt_module(zsi_pgpt *pg) { return pg->m; }

zs_status zsi_pgpt_from_full(zsi_pgpt *pg, zs_module *full)
{
    zs_tensor **ps;
    char **names;
    int n = zs_module_parameters(full, &ps, &names);
    zs_status st = n > 0 ? ZS_OK : ZS_ERR_STATE;
    for (int i = 0; st == ZS_OK && i < n; i++) {
        if (!zsi_pgpt_holds(pg, names[i]))
            continue;
        int dim, blocks;
        bool split = zsi_gpt_param_split(names[i], &dim, &blocks);
        zs_tensor *s = zs_tp_shard(ps[i], dim, blocks, split ? pg->tr : 0,
                                   split ? pg->tn : 1);
        zs_tensor *dst = *slot(pg, names[i], zsi_gpt_param_layer(names[i], pg->c.layers));
        st = s && zs_nbytes(s) == zs_nbytes(dst) ? ZS_OK : ZS_ERR_STATE;
        if (st == ZS_OK)
            memcpy(zs_data(dst), zs_data(s), zs_nbytes(s));
        zs_release(s);
    }
    if (n >= 0)
        zs_names_free(n, ps, names);
    return st;
}

int zsi_pgpt_replicated(zsi_pgpt *pg, zs_tensor **out)
{
    int k = 0;
    for (int i = 0; i < pg->m->nparams; i++) {
        int dim, blocks;
        if (!zsi_gpt_param_split(pg->m->param_names[i], &dim, &blocks))
            out[k++] = pg->m->params[i];
    }
    return k;
}

/* ---- forward ----------------------------------------------------------- */

static int seq_dim(const zsi_pgpt *pg) { return pg->sp ? 1 : -1; }

zs_status zsi_pgpt_check_seq(const zsi_pgpt *pg, int64_t T)
{
    if (pg->sp && T % pg->tn)
        return zs_set_error("sequence parallel over %d ranks: the sequence of %lld "
                            "tokens must divide by %d", pg->tn, (long long)T, pg->tn);
    if (T > pg->c.ctx)
        return zs_set_error("gpt: sequence of %lld tokens exceeds the context of %lld",
                            (long long)T, (long long)pg->c.ctx);
    return ZS_OK;
}

zs_tensor *zsi_pgpt_embed(zsi_pgpt *pg, zs_tensor *idx)
{
    int64_t T = idx->shape[1], n = pg->sp ? T / pg->tn : T;
    zs_tensor *tok = zs_tp_vocab_embedding(pg->tp, pg->wte, idx, seq_dim(pg));
    if (pg->c.arch == ZS_BLOOM) {
        zs_tensor *x = zs_layer_norm(tok, pg->emb_ln_w, pg->emb_ln_b, 1e-5);
        zs_release(tok);
        return x;
    }
    zs_tensor *wpe = zs_narrow(pg->wpe, 0, pg->sp ? pg->tr * n : 0, n);
    zs_tensor *x = zs_add(tok, wpe);
    zs_release(tok);
    zs_release(wpe);
    return x;
}

/* softmax(q k^T / sqrt(D) + ALiBi + causal mask) v for this rank's heads
 * h0 .. h0+Hl-1 of H; q, k, v [B, Hl, T, D]. */
static zs_tensor *alibi_attention(zs_tensor *q, zs_tensor *k, zs_tensor *v,
                                  int64_t h0, int64_t H)
{
    int64_t Hl = q->shape[1], T = q->shape[2], D = q->shape[3];
    double *sl = malloc((size_t)H * sizeof *sl);
    zs_tensor *bias = sl ? zs_empty(q->dtype, 3, (int64_t[]){Hl, T, T}) : NULL;
    if (!bias) {
        free(sl);
        return NULL;
    }
    zs_alibi_slopes(H, sl);
    for (int64_t h = 0; h < Hl; h++)
        for (int64_t i = 0; i < T; i++)
            for (int64_t j = 0; j < T; j++) {
                double b = j <= i ? -sl[h0 + h] * (double)(i - j) : -INFINITY;
                int64_t o = (h * T + i) * T + j;
                if (q->dtype == ZS_F64)
                    ((double *)zs_data(bias))[o] = b;
                else
                    ((float *)zs_data(bias))[o] = (float)b;
            }
    free(sl);
    zs_tensor *s = zs_matmul_t(q, k, false, true);
    zs_tensor *ss = zs_mul_scalar(s, 1.0 / sqrt((double)D));
    zs_tensor *sb = zs_add(ss, bias);
    zs_tensor *p = zs_softmax(sb, -1);
    zs_tensor *o = zs_matmul(p, v);
    zs_tensor *tmp[] = {bias, s, ss, sb, p};
    for (int i = 0; i < 5; i++)
        zs_release(tmp[i]);
    return o;
}

/* This rank's heads: qkv [B, T, 3 C/P] -> merged [B, T, C/P]. */
static zs_tensor *attention_core(const zsi_pgpt *pg, zs_tensor *qkv)
{
    int64_t B = qkv->shape[0], n = qkv->shape[1], H = pg->c.heads / pg->tn;
    int64_t D = pg->c.width / pg->c.heads;
    zs_tensor *r = zs_reshape(qkv, 5, (int64_t[]){B, n, 3, H, D});
    zs_tensor *p = zs_permute(r, (int[]){2, 0, 3, 1, 4});          /* [3,B,H,n,D] */
    zs_tensor *parts[3] = {NULL, NULL, NULL};
    for (int i = 0; i < 3; i++) {
        zs_tensor *s = zs_narrow(p, 0, i, 1);
        parts[i] = zs_squeeze(s, 0);
        zs_release(s);
    }
    zs_attention_params ap = {.causal = true, .alibi = pg->c.arch == ZS_BLOOM};
    zs_tensor *a = pg->sparse ? zs_sparse_attention(parts[0], parts[1], parts[2],
                                                    &pg->sparams)
                   : pg->c.arch == ZS_BLOOM && pg->tn > 1
                       ? alibi_attention(parts[0], parts[1], parts[2], pg->tr * H,
                                         pg->c.heads)
                       : zs_attention(parts[0], parts[1], parts[2], &ap);
    zs_tensor *at = zs_permute(a, (int[]){0, 2, 1, 3});             /* [B,n,H,D] */
    zs_tensor *merged = zs_reshape(at, 3, (int64_t[]){B, n, H * D});
    zs_tensor *tmp[] = {r, p, parts[0], parts[1], parts[2], a, at};
    for (size_t i = 0; i < sizeof tmp / sizeof *tmp; i++)
        zs_release(tmp[i]);
    return merged;
}

/* zs_grad_fn of the selective region: in[0] = qkv, ctx the block. */
static zs_tensor *core_region(void *ctx, zs_tensor **in)
{
    const pblock *b = ctx;
    return attention_core(b->pg, in[0]);
}

/* Block l on x (the residual stream, [B, T, C] or its sequence shard). */
static zs_tensor *block_body(zsi_pgpt *pg, int64_t l, zs_tensor *x)
{
    pblock *b = &pg->b[l - pg->l0];
    int sd = seq_dim(pg);
    bool sel = pg->recompute == ZS_RECOMPUTE_SELECTIVE && zs_grad_enabled();
    zs_tensor *h = zs_layer_norm(x, b->ln1_w, b->ln1_b, 1e-5);
    zs_tensor *qkv = zs_tp_column_linear(pg->tp, h, b->attn_w, b->attn_b, false, sd);
    zs_tensor *mg = !qkv ? NULL : sel ? zs_checkpoint(core_region, b, 1, &qkv)
                                      : attention_core(pg, qkv);
    zs_tensor *a = zs_tp_row_linear(pg->tp, mg, b->proj_w, b->proj_b, true, sd);
    zs_tensor *x2 = a ? zs_add(x, a) : NULL;
    zs_tensor *h2 = x2 ? zs_layer_norm(x2, b->ln2_w, b->ln2_b, 1e-5) : NULL;
    zs_tensor *f = zs_tp_column_linear(pg->tp, h2, b->fc_w, b->fc_b, false, sd);
    zs_tensor *g = f ? zs_gelu(f, ZS_GELU_TANH) : NULL;
    zs_tensor *o = zs_tp_row_linear(pg->tp, g, b->fcproj_w, b->fcproj_b, true, sd);
    zs_tensor *x3 = o ? zs_add(x2, o) : NULL;
    zs_tensor *tmp[] = {h, qkv, mg, a, x2, h2, f, g, o};
    for (size_t i = 0; i < sizeof tmp / sizeof *tmp; i++)
        zs_release(tmp[i]);
    return x3;
}

/* zs_grad_fn of the full region: in[0] = the block's input. */
static zs_tensor *block_region(void *ctx, zs_tensor **in)
{
    const pblock *b = ctx;
    return block_body(b->pg, b->layer, in[0]);
}

/* Block l on x: under full recomputation (training, l < layers or all)
 * a checkpointed region keeping x only. */
static zs_tensor *block(zsi_pgpt *pg, int64_t l, zs_tensor *x)
{
    int64_t n = pg->recompute_layers;
    if (pg->recompute == ZS_RECOMPUTE_FULL && zs_grad_enabled() && (n <= 0 || l < n))
        return zs_checkpoint(block_region, &pg->b[l - pg->l0], 1, &x);
    return block_body(pg, l, x);
}

zs_tensor *zsi_pgpt_blocks(zsi_pgpt *pg, zs_tensor *x)
{
    zs_tensor *y = x ? zs_retain(x) : NULL;
    for (int64_t l = pg->l0; y && l < pg->l1; l++) {
        zs_tensor *z = block(pg, l, y);
        zs_release(y);
        y = z;
    }
    return y;
}

zs_tensor *zsi_pgpt_loss(zsi_pgpt *pg, zs_tensor *x, zs_tensor *y)
{
    zs_tensor *h = x ? zs_layer_norm(x, pg->lnf_w, pg->lnf_b, 1e-5) : NULL;
    zs_tensor *hf = !h ? NULL : pg->sp ? zs_sp_gather(pg->tp, h, 1) : zs_tp_copy(pg->tp, h);
    zs_tensor *logits = hf ? zs_matmul_t(hf, pg->wte, false, true) : NULL; /* [B,T,V/P] */
    zs_tensor *loss = logits ? zs_tp_vocab_cross_entropy(pg->tp, logits, y, -1) : NULL;
    zs_release(h);
    zs_release(hf);
    zs_release(logits);
    return loss;
}

zs_recompute zsi_pgpt_recompute(const zsi_pgpt *pg) { return pg->recompute; }
