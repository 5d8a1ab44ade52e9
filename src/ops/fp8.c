/*
 * ops/fp8.c - FP8 with DeepSeek-V3 tile scales as operators: fp8_quantize
 * (x -> q, scales), fp8_dequantize, fp8_gemm, and linear_fp8 with its
 * backward rule (zs/ops.h: zs_fp8_quantize, zs_fp8_dequantize,
 * zs_linear_fp8). The numerics are kernels/cpu/fp8.h's.
 *
 * linear_fp8: y [..., N] (f32) = x [..., K] (f32 or bf16) w^T + b, w [N, K]
 * f32 (master weights), b [N] f32 or none. Forward: x is quantized to e4m3
 * with 1x128 tiles (along K), w to e4m3 with 128x128 blocks, and the FP8
 * GEMM runs with the bias applied at its first promotion. When autograd
 * records, the kernel keeps the quantized operands (its aux results): the
 * e4m3 x and its scales (a quarter of x's f32 bytes) and the e4m3 w and
 * its block scales. The backward rule, driver calls only (so it runs on
 * any device), with g2 = g seen as [M, N]:
 *   dx = gq w:     g2 quantized to e5m2 with 1x128 tiles along N (the
 *                  contraction), times the saved e4m3 w read transposed:
 *                  the contraction runs over w's rows, so the block (nb, kb)
 *                  scales chunk nb of output columns kb*128.. (fp8_gemm
 *                  with b_trans);
 *   dw = g^T x:    the contraction is over M, along which neither saved
 *                  tiling runs, so (as DeepSeek-V3) both operands are
 *                  re-tiled along M: g2 quantized to e5m2 and the saved x
 *                  dequantized and quantized again to e4m3, both in 128x1
 *                  tiles (the 1x128 tiles of their transposes) kept in
 *                  their [M, .] layout, which fp8_gemm reads transposed
 *                  (a_trans, b_trans with b_rows 1): no transposed copy;
 *   db = sum of g2 over rows, in f32.
 * dx has x's dtype (bf16 for a bf16 x); dw and db are f32.
 *
 * fp8_gemm (not differentiable) -> f32 [M, N] = op(a) op(b)^T (+ bias [N]
 * f32), operands e4m3 or e5m2 with their scales tiled along K:
 *   a [M, K], scales [M, KB] (1x128 tiles), or with a_trans a stored
 *     [K, M], scales [KB, M] (128x1 tiles);
 *   b [N, K], scales per b_rows x 128 tile ([N, KB] or [NB, KB]), or with
 *     b_trans b stored [K, N], scales [KB, N] (b_rows 1: 128x1 tiles) or
 *     [KB, NB] (b_rows 128: the blocks of a [K, N] weight).
 * fp8_quantize (not differentiable; zsi_run_n, results q and scales):
 * x [..., C] f32 or bf16 -> q (the format, x's shape) and scales f32:
 * block_rows 1: [..., ceil(C/128)]; block_rows > 1 (x 2-D [R, C]):
 * [ceil(R/block_rows), ceil(C/128)]; internally also 128x1 tiles of a
 * 2-D x (cols): [ceil(R/128), C].
 * fp8_dequantize: (q, scales, block_rows) -> f32 of q's shape.
 * fp8_quantize reads 1-D and 2-D inputs of any strides in place; other
 * inputs are read contiguous (a host copy when they are not).
 */
#include <string.h>

#include "kernels/cpu/fp8.h"
#include "ops/internal.h"

static bool is_fp8(zs_dtype dt) { return dt == ZS_F8E4M3 || dt == ZS_F8E5M2; }

static zsk_fp8_fmt fmt_of(zs_dtype dt)
{
    return dt == ZS_F8E5M2 ? ZSK_FP8_E5M2 : ZSK_FP8_E4M3;
}

/* Rows of t seen as [rows, last dim]. */
static int64_t rows_of(const zs_tensor *t)
{
    return t->ndim ? zsi_shape_numel(t->ndim - 1, t->shape) : 1;
}

static int64_t last_of(const zs_tensor *t)
{
    return t->ndim ? t->shape[t->ndim - 1] : 1;
}

/* The scales' shape of an [..., C] tensor of shape (ndim, shape) in tiles
 * of br x 128, into m (dtype f32). */
static void scales_meta(int ndim, const int64_t *shape, int64_t br,
                        zsi_meta *m)
{
    m->dtype = ZS_F32;
    m->ndim = ndim;
    memcpy(m->shape, shape, (size_t)ndim * sizeof *shape);
    m->shape[ndim - 1] = zsk_fp8_groups(shape[ndim - 1], ZSK_FP8_TILE);
    if (br > 1)
        m->shape[0] = zsk_fp8_groups(shape[0], br);
}

/* The scales' shape of a 2-D [R, C] in 128x1 tiles: [ceil(R/128), C]. */
static void cols_meta(const int64_t *shape, zsi_meta *m)
{
    *m = (zsi_meta){ZS_F32, 2, {zsk_fp8_groups(shape[0], ZSK_FP8_TILE), shape[1]}};
}

static zs_status check_scales(const char *op, const char *what,
                              const zs_tensor *s, const zsi_meta *want)
{
    bool ok = s->dtype == ZS_F32 && s->ndim == want->ndim &&
              !memcmp(s->shape, want->shape, (size_t)want->ndim * sizeof(int64_t));
    if (ok)
        return ZS_OK;
    char s1[96], s2[96];
    return zs_set_error("%s: %s %s %s, expected f32 %s", op, what,
                        zs_dtype_name(s->dtype), zs_shape_str(s, s1, sizeof s1),
                        zsi_shape_fmt(want->ndim, want->shape, s2, sizeof s2));
}

/* ---- fp8_quantize ---------------------------------------------------------- */

typedef struct quant_attrs {
    int64_t fmt;        /* ZS_F8E4M3 or ZS_F8E5M2 */
    int64_t block_rows; /* 1: 1x128 tiles; > 1: blocks of a 2-D x */
    int64_t cols;       /* 128x1 tiles of a 2-D x (block_rows 1), scales
                         * [ceil(R/128), C]: internal (the backward's) */
} quant_attrs;
ZSI_ATTRS(quant_attrs);

static zs_status infer_quant(zsi_call *c)
{
    const quant_attrs *a = c->attrs;
    const zs_tensor *x = c->in[0];
    const char *op = "fp8_quantize";
    char s1[96];
    if (x->dtype != ZS_F32 && x->dtype != ZS_BF16)
        return zs_set_error("%s: input dtype %s, expected f32 or bf16", op,
                            zs_dtype_name(x->dtype));
    if (!is_fp8((zs_dtype)a->fmt))
        return zs_set_error("%s: format %s, expected f8e4m3 or f8e5m2", op,
                            zs_dtype_name((zs_dtype)a->fmt));
    if (a->block_rows < 1)
        return zs_set_error("%s: block_rows %lld, expected >= 1", op,
                            (long long)a->block_rows);
    if (x->ndim < 1 || ((a->block_rows > 1 || a->cols) && x->ndim != 2) ||
        (a->cols && a->block_rows != 1))
        return zs_set_error("%s: input %s: expected [..., C] (tiles) or "
                            "[R, C] (block_rows %lld%s)", op,
                            zs_shape_str(x, s1, sizeof s1),
                            (long long)a->block_rows, a->cols ? ", 128x1" : "");
    zsi_out_like(c, x);
    c->dtype = (zs_dtype)a->fmt;
    c->nout = 2;
    if (a->cols)
        cols_meta(x->shape, &c->more[0]);
    else
        scales_meta(x->ndim, x->shape, a->block_rows, &c->more[0]);
    return ZS_OK;
}

/* A 1-D or 2-D x of any strides is read in place (a transposed view
 * quantizes along its rows without a copy; 128x1 tiles need unit column
 * stride); others contiguous. */
static zs_status cpu_quant(const zsi_call *c, zs_tensor *out)
{
    const quant_attrs *a = c->attrs;
    const zs_tensor *in = c->in[0];
    bool direct = in->ndim == 1 ||
                  (in->ndim == 2 && (!a->cols || in->strides[1] == 1));
    zs_tensor *x = direct ? zs_retain(c->in[0]) : zsi_contig_host(c->in[0]);
    if (!x)
        return ZS_ERR_NOMEM;
    int64_t C = last_of(x), cs = x->ndim ? x->strides[x->ndim - 1] : 1;
    int64_t rs = x->ndim == 2 ? x->strides[0] : C * cs;
    zsk_fp8_fmt f = fmt_of(out->dtype);
    bool bf16 = x->dtype == ZS_BF16;
    if (a->cols)
        zsk_fp8_quantize_cols(f, bf16, zs_data(x), rows_of(x), C, rs,
                              zs_data(out), zs_data(c->outs[1]));
    else
        zsk_fp8_quantize(f, bf16, zs_data(x), rows_of(x), C, rs, cs,
                         a->block_rows, zs_data(out), zs_data(c->outs[1]));
    zs_release(x);
    return ZS_OK;
}

static zsi_cost quant_cost(const zsi_call *c, const zs_tensor *out)
{
    double n = (double)zs_numel(out);
    return (zsi_cost){4 * n, zsi_bytes(c->in[0]), n + n / 32};
}

zsi_opdef zsi_def_fp8_quantize = {
    .op = {.name = "fp8_quantize"}, .arity = 1, .infer = infer_quant,
    .kernel = {[ZS_CPU] = {[ZS_F32] = cpu_quant, [ZS_BF16] = cpu_quant}},
    .cost = quant_cost, .attr_size = sizeof(quant_attrs)};

zs_status zs_fp8_quantize(zs_tensor *x, zs_dtype fmt, int64_t block_rows,
                          zs_tensor **q, zs_tensor **scales)
{
    quant_attrs at = {fmt, block_rows, 0};
    zs_tensor *r[2];
    zs_status st = zsi_run_n(&zsi_def_fp8_quantize, 1, (zs_tensor *[]){x},
                             &at, 2, r);
    *q = r[0];
    *scales = r[1];
    return st;
}

/* ---- fp8_dequantize -------------------------------------------------------- */

typedef struct dequant_attrs {
    int64_t block_rows;
} dequant_attrs;
ZSI_ATTRS(dequant_attrs);

static zs_status infer_dequant(zsi_call *c)
{
    const dequant_attrs *a = c->attrs;
    const zs_tensor *q = c->in[0], *s = c->in[1];
    const char *op = "fp8_dequantize";
    char s1[96];
    if (!is_fp8(q->dtype))
        return zs_set_error("%s: input dtype %s, expected f8e4m3 or f8e5m2",
                            op, zs_dtype_name(q->dtype));
    if (a->block_rows < 1 || q->ndim < 1 ||
        (a->block_rows > 1 && q->ndim != 2))
        return zs_set_error("%s: input %s with block_rows %lld: expected "
                            "[..., C] with block_rows 1 or [R, C]", op,
                            zs_shape_str(q, s1, sizeof s1),
                            (long long)a->block_rows);
    zsi_meta want;
    scales_meta(q->ndim, q->shape, a->block_rows, &want);
    if (check_scales(op, "scales", s, &want) != ZS_OK)
        return ZS_ERR_ARG;
    zsi_out_like(c, q);
    c->dtype = ZS_F32;
    return ZS_OK;
}

static zs_status cpu_dequant(const zsi_call *c, zs_tensor *out)
{
    const dequant_attrs *a = c->attrs;
    zs_tensor *q = zsi_contig_host(c->in[0]);
    zs_tensor *s = q ? zsi_contig_host(c->in[1]) : NULL;
    if (s) {
        int64_t C = last_of(q);
        zsk_fp8_dequantize(fmt_of(q->dtype), zs_data(q), rows_of(q), C, C,
                           a->block_rows, zs_data(s), zs_data(out));
    }
    zs_release(q);
    zs_release(s);
    return s ? ZS_OK : ZS_ERR_NOMEM;
}

zsi_opdef zsi_def_fp8_dequantize = {
    .op = {.name = "fp8_dequantize"}, .arity = 2, .infer = infer_dequant,
    .kernel = {[ZS_CPU] = {[ZS_F8E4M3] = cpu_dequant,
                           [ZS_F8E5M2] = cpu_dequant}},
    .flops = 1, .attr_size = sizeof(dequant_attrs)};

zs_tensor *zs_fp8_dequantize(zs_tensor *q, zs_tensor *scales,
                             int64_t block_rows)
{
    dequant_attrs at = {block_rows};
    return zsi_run(&zsi_def_fp8_dequantize, 2, (zs_tensor *[]){q, scales}, &at);
}

/* ---- fp8_gemm ---------------------------------------------------------------- */

typedef struct gemm_attrs {
    int64_t b_rows;  /* rows of b per scale: 1 or 128 */
    int64_t b_trans; /* b stored [K, N] */
    int64_t bias;    /* input index of the bias; -1: none */
    int64_t a_trans; /* a stored [K, M] (128x1 tiles) */
} gemm_attrs;
ZSI_ATTRS(gemm_attrs);

static zs_status infer_gemm(zsi_call *c)
{
    const gemm_attrs *at = c->attrs;
    const zs_tensor *a = c->in[0], *sa = c->in[1], *b = c->in[2],
                    *sb = c->in[3];
    const char *op = "fp8_gemm";
    char s1[96], s2[96];
    if (!is_fp8(a->dtype) || !is_fp8(b->dtype))
        return zs_set_error("%s: operands %s and %s, expected f8e4m3 or "
                            "f8e5m2", op, zs_dtype_name(a->dtype),
                            zs_dtype_name(b->dtype));
    if (at->b_rows != 1 && at->b_rows != 128)
        return zs_set_error("%s: b_rows %lld, expected 1 or 128", op,
                            (long long)at->b_rows);
    int ta = at->a_trans != 0, tb = at->b_trans != 0;
    int64_t K = a->ndim == 2 ? a->shape[ta ? 0 : 1] : -1;
    int64_t bk = b->ndim == 2 ? b->shape[tb ? 0 : 1] : -2;
    if (K != bk)
        return zs_set_error("%s: a %s%s and b %s%s do not match: expected 2-D "
                            "%s and %s", op, zs_shape_str(a, s1, sizeof s1),
                            ta ? " (transposed)" : "",
                            zs_shape_str(b, s2, sizeof s2),
                            tb ? " (transposed)" : "", ta ? "[K, M]" : "[M, K]",
                            tb ? "[K, N]" : "[N, K]");
    int64_t M = a->shape[ta ? 1 : 0], N = b->shape[tb ? 1 : 0];
    /* tiles along K: a [M, KB], or stored [K, M] (128x1 tiles) [KB, M]; b's
     * rows in groups of b_rows: [NB, KB], or stored [K, N]: [KB, NB] */
    zsi_meta wa, wb;
    if (ta)
        cols_meta(a->shape, &wa);
    else
        scales_meta(2, a->shape, 1, &wa);
    if (tb && at->b_rows == 1)
        cols_meta(b->shape, &wb);
    else
        scales_meta(2, b->shape, at->b_rows, &wb);
    if (check_scales(op, "scales of a", sa, &wa) != ZS_OK ||
        check_scales(op, "scales of b", sb, &wb) != ZS_OK)
        return ZS_ERR_ARG;
    if (at->bias >= 0) {
        const zs_tensor *bias = c->in[at->bias];
        if (bias->dtype != ZS_F32 || bias->ndim != 1 || bias->shape[0] != N)
            return zs_set_error("%s: bias %s %s, expected f32 [%lld]", op,
                                zs_dtype_name(bias->dtype),
                                zs_shape_str(bias, s1, sizeof s1), (long long)N);
    }
    c->dtype = ZS_F32;
    c->ndim = 2;
    c->shape[0] = M;
    c->shape[1] = N;
    return ZS_OK;
}

static zs_status cpu_gemm(const zsi_call *c, zs_tensor *out)
{
    const gemm_attrs *at = c->attrs;
    int nin = at->bias >= 0 ? 5 : 4;
    zs_tensor *t[5] = {0};
    zs_status st = ZS_OK;
    for (int i = 0; i < nin; i++)
        if (!(t[i] = zsi_contig_host(c->in[i])))
            st = ZS_ERR_NOMEM;
    if (st == ZS_OK) {
        const zs_tensor *a = t[0], *b = t[2];
        int64_t M = out->shape[0], N = out->shape[1];
        int64_t K = a->shape[at->a_trans ? 0 : 1];
        int64_t sac = t[1]->shape[1], sbc = t[3]->shape[1], rg = at->b_rows;
        zsk_fp8_fmt fa = fmt_of(a->dtype), fb = fmt_of(b->dtype);
        zsk_fp8_mat ma = at->a_trans
            ? (zsk_fp8_mat){zs_data(a), 1, M, fa, zs_data(t[1]), 1, 1, sac}
            : (zsk_fp8_mat){zs_data(a), K, 1, fa, zs_data(t[1]), 1, sac, 1};
        zsk_fp8_mat mb = at->b_trans
            ? (zsk_fp8_mat){zs_data(b), 1, N, fb, zs_data(t[3]), rg, 1, sbc}
            : (zsk_fp8_mat){zs_data(b), K, 1, fb, zs_data(t[3]), rg, sbc, 1};
        st = zsk_gemm_fp8(M, N, K, &ma, &mb, t[4] ? zs_data(t[4]) : NULL,
                          zs_data(out), N);
    }
    for (int i = 0; i < nin; i++)
        zs_release(t[i]);
    return st;
}

static zsi_cost gemm_cost(const zsi_call *c, const zs_tensor *out)
{
    double rd = 0;
    for (int i = 0; i < c->nin; i++)
        rd += zsi_bytes(c->in[i]);
    const gemm_attrs *at = c->attrs;
    double K = (double)c->in[0]->shape[at->a_trans ? 0 : 1];
    return (zsi_cost){2.0 * (double)zs_numel(out) * K, rd, zsi_bytes(out)};
}

zsi_opdef zsi_def_fp8_gemm = {
    .op = {.name = "fp8_gemm"}, .cls = ZSI_GEMM, .infer = infer_gemm,
    .kernel = {[ZS_CPU] = {[ZS_F8E4M3] = cpu_gemm, [ZS_F8E5M2] = cpu_gemm}},
    .cost = gemm_cost, .attr_size = sizeof(gemm_attrs)};

/* op(a) op(b)^T through fp8_gemm (op: stored transposed when *_trans);
 * a new reference. */
static zs_tensor *fp8_gemm(zs_tensor *a, zs_tensor *sa, bool a_trans,
                           zs_tensor *b, zs_tensor *sb, int64_t b_rows,
                           bool b_trans)
{
    gemm_attrs at = {b_rows, b_trans, -1, a_trans};
    return zsi_run(&zsi_def_fp8_gemm, 4, (zs_tensor *[]){a, sa, b, sb}, &at);
}

/* ---- linear_fp8 ---------------------------------------------------------------- */

typedef struct linear_fp8_attrs {
    int64_t bias; /* input index of b; -1: none */
} linear_fp8_attrs;
ZSI_ATTRS(linear_fp8_attrs);

static zs_status linear_fp8_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin);

static zs_status infer_linear_fp8(zsi_call *c)
{
    const linear_fp8_attrs *at = c->attrs;
    const zs_tensor *x = c->in[0], *w = c->in[1];
    const zs_tensor *b = at->bias >= 0 ? c->in[at->bias] : NULL;
    const char *op = "linear_fp8";
    char s1[96], s2[96];
    if (x->dtype != ZS_F32 && x->dtype != ZS_BF16)
        return zs_set_error("%s: input dtype %s, expected f32 or bf16", op,
                            zs_dtype_name(x->dtype));
    if (w->dtype != ZS_F32 || (b && b->dtype != ZS_F32))
        return zs_set_error("%s: weight %s and bias %s: expected f32 (master "
                            "weights)", op, zs_dtype_name(w->dtype),
                            b ? zs_dtype_name(b->dtype) : "none");
    if (x->ndim < 1 || w->ndim != 2 || w->shape[1] != last_of(x))
        return zs_set_error("%s: input %s and weight %s do not match: "
                            "expected [..., K] and [N, K]", op,
                            zs_shape_str(x, s1, sizeof s1),
                            zs_shape_str(w, s2, sizeof s2));
    if (b && (b->ndim != 1 || b->shape[0] != w->shape[0]))
        return zs_set_error("%s: bias %s does not match weight %s, expected "
                            "[%lld]", op, zs_shape_str(b, s1, sizeof s1),
                            zs_shape_str(w, s2, sizeof s2),
                            (long long)w->shape[0]);
    zsi_out_like(c, x);
    c->dtype = ZS_F32;
    c->shape[x->ndim - 1] = w->shape[0];
    return ZS_OK;
}

/* Quantizes x (tiles) and w (blocks) into q[0..3] = xq, xs, wq, ws (made
 * by the caller with the shapes of operand_shapes) and runs the GEMM into
 * out. */
static zs_status run_linear_fp8(zs_tensor *x, zs_tensor *w, zs_tensor *b,
                                zs_tensor *out, zs_tensor **q)
{
    int64_t K = w->shape[1], N = w->shape[0], M = rows_of(x);
    int64_t KB = zsk_fp8_groups(K, ZSK_FP8_TILE);
    zsk_fp8_quantize(ZSK_FP8_E4M3, x->dtype == ZS_BF16, zs_data(x), M, K, K,
                     1, 1, zs_data(q[0]), zs_data(q[1]));
    zsk_fp8_quantize(ZSK_FP8_E4M3, false, zs_data(w), N, K, K, 1, 128,
                     zs_data(q[2]), zs_data(q[3]));
    zsk_fp8_mat ma = {zs_data(q[0]), K, 1, ZSK_FP8_E4M3, zs_data(q[1]), 1,
                      KB, 1};
    zsk_fp8_mat mb = {zs_data(q[2]), K, 1, ZSK_FP8_E4M3, zs_data(q[3]), 128,
                      KB, 1};
    return zsk_gemm_fp8(M, N, K, &ma, &mb, b ? zs_data(b) : NULL,
                        zs_data(out), N);
}

/* The quantized operands are the aux results 0..3 when a node will be
 * recorded (zsi_aux_new: a graph's replay supplies the captured ones, so
 * the backward nodes read this step's values), else temporaries. */
static zs_status cpu_linear_fp8(const zsi_call *c, zs_tensor *out)
{
    const linear_fp8_attrs *at = c->attrs;
    zs_tensor *xin = c->in[0], *win = c->in[1];
    int64_t K = win->shape[1], N = win->shape[0], M = rows_of(xin);
    int64_t KB = zsk_fp8_groups(K, ZSK_FP8_TILE);
    const zs_dtype dt[4] = {ZS_F8E4M3, ZS_F32, ZS_F8E4M3, ZS_F32};
    const int64_t shape[4][2] = {{M, K}, {M, KB}, {N, K}, {zsk_fp8_groups(N, 128), KB}};
    bool keep = zsi_call_records(c);
    zsi_tracking_pause();
    zs_tensor *q[4] = {0};
    zs_status st = ZS_OK;
    for (int i = 0; i < 4 && st == ZS_OK; i++) {
        q[i] = keep ? zsi_aux_new(c, i, dt[i], 2, shape[i])
                    : zsi_new_tensor(dt[i], 2, shape[i]);
        st = q[i] ? ZS_OK : ZS_ERR_NOMEM;
    }
    zs_tensor *x = st == ZS_OK ? zsi_contig_host(xin) : NULL;
    zs_tensor *w = x ? zsi_contig_host(win) : NULL;
    zs_tensor *b = w && at->bias >= 0 ? zsi_contig_host(c->in[at->bias]) : NULL;
    if (st == ZS_OK)
        st = !w || (at->bias >= 0 && !b) ? ZS_ERR_NOMEM
                                         : run_linear_fp8(x, w, b, out, q);
    for (int i = 0; i < 4 && !keep; i++) /* aux results: the call owns them */
        zs_release(q[i]);
    zs_release(x);
    zs_release(w);
    zs_release(b);
    zsi_tracking_resume();
    return st;
}

/* Saved: 0 xq [M, K] e4m3, 1 its scales [M, KB], 2 wq [N, K] e4m3, 3 its
 * block scales [NB, KB]. */
static void save_linear_fp8(zsi_ctx *n, const zsi_call *c, zs_tensor *out)
{
    for (int i = 0; i < 4; i++)
        zsi_save(n, i, c->aux[i]);
}

static zsi_cost linear_fp8_cost(const zsi_call *c, const zs_tensor *out)
{
    const zs_tensor *x = c->in[0], *w = c->in[1];
    double mn = (double)zs_numel(out), rd = 0;
    for (int i = 0; i < c->nin; i++)
        rd += zsi_bytes(c->in[i]);
    double q = (double)(zs_numel(x) + zs_numel(w));
    return (zsi_cost){2.0 * mn * (double)w->shape[1] + 4.0 * q, rd,
                      zsi_bytes(out) + (out->node ? q : 0)};
}

zsi_opdef zsi_def_linear_fp8 = {
    .op = {.name = "linear_fp8", .backward = linear_fp8_bw}, .cls = ZSI_GEMM,
    .infer = infer_linear_fp8,
    .kernel = {[ZS_CPU] = {[ZS_F32] = cpu_linear_fp8,
                           [ZS_BF16] = cpu_linear_fp8}},
    .save = save_linear_fp8, .cost = linear_fp8_cost,
    .attr_size = sizeof(linear_fp8_attrs),
    .bw_ops = (zsi_opdef *const[]){&zsi_def_fp8_quantize, &zsi_def_fp8_gemm,
                                   &zsi_def_fp8_dequantize, &zsi_def_view,
                                   &zsi_def_to_dtype, &zsi_def_sum, NULL}};

zs_tensor *zs_linear_fp8(zs_tensor *x, zs_tensor *w, zs_tensor *b)
{
    linear_fp8_attrs at = {b ? 2 : -1};
    return zsi_run(&zsi_def_linear_fp8, b ? 3 : 2, (zs_tensor *[]){x, w, b},
                   &at);
}

/* ---- backward ------------------------------------------------------------------ */

/* t (2-D [R, C]) quantized in 1x128 tiles (128x1 when cols): new
 * references in *q and *s. */
static zs_status quant2(zs_tensor *t, bool cols, zs_dtype fmt, zs_tensor **q,
                        zs_tensor **s)
{
    quant_attrs at = {fmt, 1, cols};
    zs_tensor *r[2];
    zs_status st = zsi_run_n(&zsi_def_fp8_quantize, 1, (zs_tensor *[]){t},
                             &at, 2, r);
    *q = r[0];
    *s = r[1];
    return st;
}

/* dx = gq w, reshaped to x's shape and dtype. */
static zs_tensor *grad_x(zsi_ctx *n, zs_tensor *g2)
{
    zs_tensor *gq = NULL, *gs = NULL, *d = NULL, *dx = NULL;
    if (quant2(g2, false, ZS_F8E5M2, &gq, &gs) == ZS_OK)
        d = fp8_gemm(gq, gs, false, n->saved[2], n->saved[3], 128, true);
    const zsi_meta *m = &n->in_meta[0];
    zs_tensor *r = d ? zs_reshape(d, m->ndim, m->shape) : NULL;
    if (r)
        dx = m->dtype == ZS_F32 ? zs_retain(r) : zs_to_dtype(r, m->dtype);
    zs_tensor *all[] = {gq, gs, d, r};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        zs_release(all[i]);
    return dx;
}

/* dw = g2^T x: both operands in 128x1 tiles (along M, the contraction),
 * kept in their [M, .] layout and read transposed by the GEMM. */
static zs_tensor *grad_w(zsi_ctx *n, zs_tensor *g2)
{
    zs_tensor *gq = NULL, *gs = NULL, *xq = NULL, *xs = NULL, *dw = NULL;
    zs_tensor *xd = zs_fp8_dequantize(n->saved[0], n->saved[1], 1);
    if (xd && quant2(g2, true, ZS_F8E5M2, &gq, &gs) == ZS_OK &&
        quant2(xd, true, ZS_F8E4M3, &xq, &xs) == ZS_OK)
        dw = fp8_gemm(gq, gs, true, xq, xs, 1, true);
    zs_tensor *all[] = {xd, gq, gs, xq, xs};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        zs_release(all[i]);
    return dw;
}

static zs_status linear_fp8_bw(zsi_ctx *n, zs_tensor *g, zs_tensor **gin)
{
    const linear_fp8_attrs *at = zsi_node_attrs(n);
    int64_t N = n->in_meta[1].shape[0];
    zs_tensor *g2 = zs_reshape(g, 2, (int64_t[]){-1, N});
    if (!g2)
        return ZS_ERR_NOMEM;
    zs_status st = ZS_OK;
    if (zsi_needs_grad(n, 0) && !(gin[0] = grad_x(n, g2)))
        st = ZS_ERR_NOMEM;
    if (st == ZS_OK && zsi_needs_grad(n, 1) && !(gin[1] = grad_w(n, g2)))
        st = ZS_ERR_NOMEM;
    int ib = (int)at->bias;
    if (st == ZS_OK && ib >= 0 && zsi_needs_grad(n, ib) &&
        !(gin[ib] = zsi_sum_to(g2, &n->in_meta[ib])))
        st = ZS_ERR_NOMEM;
    zs_release(g2);
    return st;
}
