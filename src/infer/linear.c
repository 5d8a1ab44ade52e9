/*
 * linear.c - one linear layer of the inference model in each weight format
 * (infer/internal.h): building it from float weights, running it on a
 * batch of rows, freeing it.
 *
 * Batch invariance holds in every format: the f32 kernel accumulates each
 * output in one fma chain over k, the f64 loop likewise, the block formats
 * (qpacked.h) and int8 quantize activations per row and sum blocks in a
 * fixed order.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "infer/internal.h"
#include "ops/op.h"

static zs_status oom(void)
{
    return zs_set_error_code(ZS_ERR_NOMEM, "llm: out of memory");
}

zsk_qfmt zsi_qfmt(zsi_wfmt f)
{
    return f == ZSI_W_Q8_0 ? ZSK_Q8_0 : f == ZSI_W_Q4_0 ? ZSK_Q4_0 : ZSK_Q4_1;
}

static bool is_q(zsi_wfmt f)
{
    return f == ZSI_W_Q8_0 || f == ZSI_W_Q4_0 || f == ZSI_W_Q4_1;
}

/* W as n floats (converted from src_dt when it is f64), malloc'd. */
static float *as_f32(const void *W, zs_dtype src_dt, int64_t n)
{
    float *f = malloc((size_t)n * sizeof *f);
    if (f && src_dt == ZS_F64)
        for (int64_t i = 0; i < n; i++)
            f[i] = (float)((const double *)W)[i];
    else if (f)
        memcpy(f, W, (size_t)n * sizeof *f);
    return f;
}

static zs_status build_weights(zsi_linear *l, const float *w)
{
    int64_t N = l->N, K = l->K;
    if (l->fmt == ZSI_W_F32) {
        l->w_bytes = N * K * 4;
        return zsk_pack_f32(w, N, K, &l->packed);
    }
    if (is_q(l->fmt)) {
        void *blocks = malloc((size_t)(N * K / ZSK_QBLOCK * zsk_qblock_bytes(zsi_qfmt(l->fmt))));
        if (!blocks)
            return oom();
        zs_status s = zsk_quantize(zsi_qfmt(l->fmt), w, N * K, blocks);
        if (s == ZS_OK)
            s = zsi_linear_tiles(l, blocks);
        free(blocks);
        return s;
    }
    l->w_bytes = N * K;
    l->w = malloc((size_t)(N * K));
    l->scale = malloc((size_t)N * sizeof *l->scale);
    if (!l->w || !l->scale)
        return oom();
    return zsk_quantize_rows_i8(w, N, K, l->w, l->scale);
}

zs_status zsi_linear_build(zsi_linear *l, zsi_wfmt fmt, zs_dtype src_dt, const void *W,
                           int64_t N, int64_t K, const void *bias, zs_dtype dt)
{
    *l = (zsi_linear){.fmt = fmt, .N = N, .K = K};
    if (is_q(fmt) && K % ZSK_QBLOCK != 0)
        return zs_set_error("llm: a %lld x %lld weight cannot be quantized in blocks "
                            "of %d (the width must be a multiple of %d)",
                            (long long)N, (long long)K, ZSK_QBLOCK, ZSK_QBLOCK);
    zs_status s = ZS_OK;
    if (bias) {
        size_t nb = (size_t)N * zs_dtype_size(dt);
        if (!(l->bias = malloc(nb)))
            return oom();
        memcpy(l->bias, bias, nb);
    }
    if (fmt == ZSI_W_F64) {
        l->w_bytes = N * K * 8;
        if (!(l->w = malloc((size_t)l->w_bytes)))
            return oom();
        memcpy(l->w, W, (size_t)l->w_bytes);
        return ZS_OK;
    }
    float *w = as_f32(W, src_dt, N * K);
    s = w ? build_weights(l, w) : oom();
    free(w);
    return s;
}

zs_status zsi_linear_tiles(zsi_linear *l, const void *blocks)
{
    zs_status s = zsk_qpack(zsi_qfmt(l->fmt), blocks, l->N, l->K, &l->tiles);
    l->w_bytes = zsk_qpacked_bytes(&l->tiles);
    return s;
}

void zsi_linear_free(zsi_linear *l)
{
    zs_release(l->tw), zs_release(l->tscale), zs_release(l->tsmooth);
    zs_release(l->tbias);
    if (l->in_arena) /* the layer's arena holds them */
        l->packed.data = NULL, l->tiles.data = NULL, l->w = NULL;
    zsk_packed_free(&l->packed);
    zsk_qpacked_free(&l->tiles);
    free(l->w);
    free(l->scale);
    free(l->smooth);
    free(l->bias);
    *l = (zsi_linear){0};
}

int64_t zsi_linear_bytes(const zsi_linear *l)
{
    return l->w_bytes + (l->fmt == ZSI_W_I8 ? l->N * 4 : 0);
}

/* ---- a layer's weights in one block -------------------------------------- */

/* Why: at batch 1 every token streams all weights from memory, a layer's
 * four matrices one after the other. Separately allocated, a quantized
 * layer's matrices (0.6-2.5 MB for GPT-2 in Q8_0) sit below zs_alloc's
 * huge-page threshold, so every 4 KiB of the stream is a TLB miss and a
 * page walk; gathered in one block (7.5 MB) they lie on 2 MiB pages.
 * Measured on GPT-2 (bench/infer's decode, both layouts interleaved in one
 * process, two runs): Q8_0 197.5 -> 206.7 and 216.4 -> 224.3 tok/s, Q4_0
 * 304.3 -> 323.0 and 333.4 -> 341.4 (+2-6%). Peak memory while gathering:
 * the model plus one layer. */

/* l's weight data (the pointer of its format) and where it came from. */
static void *weight_data(const zsi_linear *l, bool *zs_owned)
{
    *zs_owned = l->fmt == ZSI_W_F32 || is_q(l->fmt);
    return l->fmt == ZSI_W_F32 ? (void *)l->packed.data
           : is_q(l->fmt)      ? (void *)l->tiles.data
                               : l->w;
}

static void set_weight_data(zsi_linear *l, void *p)
{
    if (l->fmt == ZSI_W_F32)
        l->packed.data = p;
    else if (is_q(l->fmt))
        l->tiles.data = p;
    else
        l->w = p;
}

/* Bytes of l's weight data: F32 panels are padded to 64 columns. */
static size_t weight_bytes(const zsi_linear *l)
{
    if (l->fmt == ZSI_W_F32)
        return (size_t)(l->packed.panels * l->K) * ZSK_PANEL * sizeof(float);
    return (size_t)l->w_bytes;
}

static size_t round64(size_t n) { return (n + 63) / 64 * 64; }

void *zsi_linear_weights(const zsi_linear *l, size_t *bytes)
{
    bool zs_owned;
    *bytes = weight_bytes(l);
    return weight_data(l, &zs_owned);
}

zs_status zsi_layer_gather(zsi_layer *y)
{
    zsi_linear *ls[4] = {&y->qkv, &y->proj, &y->fc, &y->fc2}; /* forward order */
    size_t total = 0;
    for (int i = 0; i < 4; i++)
        total += round64(weight_bytes(ls[i]));
    char *a = zs_alloc(total ? total : 1);
    if (!a)
        return oom();
    zs_advise_huge(a, total); /* zs_alloc advises from 4 MiB on */
    size_t off = 0;
    for (int i = 0; i < 4; i++) {
        bool zs_owned;
        void *old = weight_data(ls[i], &zs_owned);
        if (old)
            memcpy(a + off, old, weight_bytes(ls[i]));
        if (zs_owned)
            zs_free(old);
        else
            free(old);
        set_weight_data(ls[i], old ? a + off : NULL);
        ls[i]->in_arena = true;
        off += round64(weight_bytes(ls[i]));
    }
    y->arena = a;
    y->arena_bytes = (int64_t)total;
    return ZS_OK;
}

zs_status zsi_linear_run(const zsi_linear *l, zs_tensor *x, int64_t M, int64_t ldx,
                         zs_tensor *residual, int64_t ldr, zsk_act act, zs_tensor *y,
                         int64_t ldy)
{
    if (M == 0)
        return ZS_OK;
    zsi_linear_attrs a = {l->fmt, act, l->N, l->K, M, ldx, ldr, ldy,
                          l->tiles.tile_bytes, l->threshold,
                          l->tscale != NULL, l->tsmooth != NULL, l->tbias != NULL,
                          residual != NULL};
    zs_tensor *in[7] = {y, x, l->tw};
    int n = 3;
    if (l->tscale)
        in[n++] = l->tscale;
    if (l->tsmooth)
        in[n++] = l->tsmooth;
    if (l->tbias)
        in[n++] = l->tbias;
    if (residual)
        in[n++] = residual;
    zs_tensor *r = zsi_run(&zsi_def_packed_linear, n, in, &a);
    if (!r)
        return ZS_ERR_ARG;
    zs_release(r); /* in[0], retained */
    return ZS_OK;
}

/* ---- the weights as tensors ----------------------------------------------- */

/* A tensor wrapping n elements of dt at p (host), untracked. */
static zs_tensor *wrap(void *p, zs_dtype dt, int64_t n)
{
    zsi_tracking_pause();
    zs_tensor *t = zs_from_blob(dt, 1, (int64_t[]){n}, p);
    zsi_tracking_resume();
    return t;
}

/* A u8 view of bytes [off, off + n) of arena, untracked. */
static zs_tensor *arena_view(zs_tensor *arena, int64_t off, int64_t n)
{
    zsi_tracking_pause();
    zs_tensor *t = zsi_new_view(arena, 1, (int64_t[]){n}, (int64_t[]){1}, off);
    zsi_tracking_resume();
    return t;
}

zs_status zsi_linear_wrap(zsi_linear *l, zs_dtype dt, zs_tensor *arena, const void *base)
{
    size_t nb;
    void *w = zsi_linear_weights(l, &nb);
    l->tw = arena && w ? arena_view(arena, (const char *)w - (const char *)base, (int64_t)nb)
                       : wrap(w, ZS_U8, (int64_t)nb);
    bool ok = l->tw != NULL;
    if (ok && l->scale)
        ok = (l->tscale = wrap(l->scale, ZS_F32, l->N)) != NULL;
    if (ok && l->smooth)
        ok = (l->tsmooth = wrap(l->smooth, ZS_F32, l->K)) != NULL;
    if (ok && l->bias)
        ok = (l->tbias = wrap(l->bias, dt, l->N)) != NULL;
    return ok ? ZS_OK : oom();
}

/* *t replaced by its copy on device (NULL stays NULL). */
bool zsi_move_tensor(zs_tensor **t, int device)
{
    if (!*t)
        return true;
    zsi_tracking_pause();
    zs_tensor *d = zs_to_device(*t, device);
    zsi_tracking_resume();
    if (!d)
        return false;
    zs_release(*t);
    *t = d;
    return true;
}

zs_status zsi_linear_move(zsi_linear *l, int device, zs_tensor *arena)
{
    bool ok = true;
    if (arena) { /* the same bytes of the arena, now on the device */
        int64_t off = l->tw->offset, n = zs_numel(l->tw);
        zs_release(l->tw);
        ok = (l->tw = arena_view(arena, off, n)) != NULL;
    } else {
        ok = zsi_move_tensor(&l->tw, device);
    }
    ok = ok && zsi_move_tensor(&l->tscale, device) && zsi_move_tensor(&l->tsmooth, device) &&
         zsi_move_tensor(&l->tbias, device);
    if (!ok)
        return ZS_ERR_NOMEM;
    if (!l->in_arena) { /* the host copies go (the arena's go with it) */
        bool zs_owned;
        void *w = weight_data(l, &zs_owned);
        if (zs_owned)
            zs_free(w);
        else
            free(w);
        set_weight_data(l, NULL);
    }
    free(l->scale), free(l->smooth), free(l->bias);
    l->scale = l->smooth = NULL;
    l->bias = NULL;
    return ZS_OK;
}
