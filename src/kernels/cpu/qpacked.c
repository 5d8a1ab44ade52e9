/*
 * kernels/cpu/qpacked.c - quantized weights in 16-row tiles and the linear
 * layer on them (layout, arithmetic and contract in qpacked.h).
 *
 * Work items are tiles, split into contiguous ranges by the pool. Within
 * an item, activation rows pass over the tile MR at a time: per block the
 * tile's 8 weight vectors (Q4: 4 loads, each masked into its two nibbles)
 * are loaded once and dotted with the MR rows' broadcast bytes, two int32
 * chains per row (the vpdpbusd latency, not the ports, bounds one chain).
 * At M = 1 a thread runs four quarters of its tile range side by side
 * (four sequential weight streams: on GPT-2's lm_head, 2 threads, q4_0 went
 * from 26 GB/s with two streams to 33 with four; eight were slower;
 * software prefetch at any distance gained nothing), writes the raw sums
 * and runs the epilogue once over its range. Each tile is one stream: with
 * the scales in a region of their own (two streams per tile, eight per
 * thread) the same lm_head ran at 27-29 GB/s, interleaved at 35, the f32
 * kernel's rate in the same run.
 *
 * Measured (2 threads unless noted, the 2-core Zen 4 VM):
 *   hot in L2, 1 thread, M = 1: 1.4 cycles per Q8_0 block of 32 weights,
 *   0.9 per Q4_0 (zsk_qmatmul's per-row dots: 4.2 and 5.0);
 *   bench/infer_gemm --quick, M = 1 over GPT-2's five shapes from DRAM, one
 *   run: Q8_0 34.2, Q4_0 36.1, Q4_1 36.0 GB/s of weights, f32 packed 34.0,
 *   zsk_qmatmul 33.4 / 25.3 / 24.3 (the triad moved from 70 to 41 GB/s
 *   within the run: the machine's memory speed is not steady);
 *   M = 64: 570-625 GFLOP/s-equivalent, 4.4-5.3x zsk_sgemm and 4-5x
 *   zsk_qmatmul.
 * AVX2 path (ZS_CPU_ISA=avx2, same machine, shared with another job, so
 * the figures swing 2x between runs): the same blocking (MR, STREAMS),
 * each tile block as 16 ymm re-read from L1 per activation row; the M = 1
 * set of infer_gemm --quick at 82% (Q8_0) and 66% (Q4_0) of the triad
 * against the VNNI path's 71% and 74% in the next run; bench/infer
 * decode q8_0 / f32 2.26-2.84x, q4_0 / f32 2.65-3.24x (VNNI: 2.42-2.51x,
 * 3.35-3.41x; portable C: 0.30x, 0.22x).
 * The M = 1 AVX2 kernels were then rewritten (gemv_q8_0_avx2 /
 * gemv_q4_avx2): hot in L2, one thread, 0.82 -> 0.55 ns per Q8_0 row
 * block of 32 weights and 0.58 -> 0.39 per Q4_0 (VNNI 0.34 / 0.25, the
 * f32 packed kernel 1.21 per 32 weights). Decode on the 2-core VM at load
 * 6-30 (other jobs): q8_0 / f32 2.3-5.7x and q4_0 / f32 2.9-6.1x for the
 * old and the new code alike, run to run; the machine's load decides.
 */
#include "kernels/cpu/qpacked.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/kernels.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define ZSK_QPACKED_VNNI 1
#define VNNI __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")))
#define VNNI_INLINE static inline __attribute__((always_inline, \
    target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")))
#define AVX2 __attribute__((target("avx2,fma,f16c")))
#define AVX2_INLINE static inline __attribute__((always_inline, target("avx2,fma,f16c")))
#endif

#define MR 4               /* activation rows per pass over a tile block */
#define STREAMS 4          /* tiles side by side at M = 1 (weight streams) */
#define ITEM_MACS 65536    /* fewer products per work item run on one thread */

/* ---- layout ------------------------------------------------------------------ */

/* Data bytes of one tile block (16 rows x 32 weights). */
static int64_t qbytes(zsk_qfmt f) { return f == ZSK_Q8_0 ? 512 : 256; }

/* f16 arrays per tile: d, and m for Q4_1. */
static int64_t nscales(zsk_qfmt f) { return f == ZSK_Q4_1 ? 2 : 1; }

/* A tile is ceil(nb / 2) groups of two blocks, each group their scales
 * (64 bytes: 2 x 16 f16 d, then for Q4_1 64 bytes of m) and then their
 * data (2 x QB), so one tile is one sequential stream with every vector
 * 64-byte aligned. */
static int64_t group_bytes(zsk_qfmt f) { return 64 * nscales(f) + 2 * qbytes(f); }

/* Offset in a tile of block b's data. */
static int64_t data_off(zsk_qfmt f, int64_t b)
{
    return b / 2 * group_bytes(f) + 64 * nscales(f) + b % 2 * qbytes(f);
}

/* Offset in a tile of block b's 16 scales d (which = 0) or minimums m (1). */
static int64_t scale_off(zsk_qfmt f, int64_t b, int which)
{
    return b / 2 * group_bytes(f) + which * 64 + b % 2 * ZSK_QTILE * 2;
}

static int64_t tile_size(zsk_qfmt f, int64_t nb)
{
    return (nb + 1) / 2 * group_bytes(f);
}

/* Pointers into row n's block b of quant.h's layout: its d, its m (Q4_1)
 * and its 32 (Q8_0) or 16 (Q4) quantized bytes. */
typedef struct row_block {
    uint8_t *d, *m, *q;
} row_block;

static row_block row_block_at(zsk_qfmt f, const void *blocks, int64_t nb, int64_t n,
                              int64_t b)
{
    uint8_t *p = (uint8_t *)blocks + (n * nb + b) * zsk_qblock_bytes(f);
    if (f == ZSK_Q4_1)
        return (row_block){p, p + 2, p + 4};
    return (row_block){p, NULL, p + 2};
}

/* Copies between row (n, b) of quant.h's blocks and tile row r; to_tile
 * picks the direction. The tile's bytes: Q8_0 64 g + 4 r + j <-> q[4 g + j]
 * + 128, Q4 64 g + 4 r + j <-> qs[4 g + j]. */
static void move_row(zsk_qfmt f, uint8_t *tile, int64_t nb, int64_t b, int r,
                     row_block rb, bool to_tile)
{
    uint8_t *t = tile + data_off(f, b) + 4 * r;
    int groups = f == ZSK_Q8_0 ? 8 : 4;
    uint8_t bias = f == ZSK_Q8_0 ? 128 : 0;
    for (int g = 0; g < groups; g++)
        for (int j = 0; j < 4; j++) {
            if (to_tile)
                t[64 * g + j] = (uint8_t)(rb.q[4 * g + j] + bias);
            else
                rb.q[4 * g + j] = (uint8_t)(t[64 * g + j] - bias);
        }
    for (int which = 0; which < nscales(f); which++) {
        uint8_t *s = tile + scale_off(f, b, which) + 2 * r;
        uint8_t *o = which ? rb.m : rb.d;
        memcpy(to_tile ? s : o, to_tile ? o : s, 2);
    }
}

zs_status zsk_qpack(zsk_qfmt fmt, const void *blocks, int64_t N, int64_t K,
                    zsk_qpacked *out)
{
    if (!out)
        return zs_set_error("qpack: NULL output struct");
    *out = (zsk_qpacked){0};
    if (zsk_qblock_bytes(fmt) == 0)
        return zs_set_error("qpack: unknown format %d", (int)fmt);
    if (N < 0 || K < 0 || K % ZSK_QBLOCK != 0)
        return zs_set_error("qpack: bad size N = %lld, K = %lld (K must be a "
                            "non-negative multiple of %d)",
                            (long long)N, (long long)K, ZSK_QBLOCK);
    int64_t nb = K / ZSK_QBLOCK, tiles = (N + ZSK_QTILE - 1) / ZSK_QTILE;
    int64_t tb = tile_size(fmt, nb);
    if (N == 0 || K == 0) {
        *out = (zsk_qpacked){fmt, N, K, tiles, tb, NULL};
        return ZS_OK;
    }
    if (!blocks)
        return zs_set_error("qpack: NULL blocks");
    if (tiles > (int64_t)(SIZE_MAX / 2) / tb)
        return zs_set_error("qpack: N = %lld x K = %lld is too large", (long long)N,
                            (long long)K);
    uint8_t *data = zs_alloc((size_t)(tiles * tb));
    if (!data)
        return zs_set_error_code(ZS_ERR_NOMEM, "qpack: out of memory (%lld bytes)",
                                 (long long)(tiles * tb));
    /* Padding rows: code 0 (Q8_0: -128, Q4: 0) with scale 0 -> weight 0. */
    memset(data, 0, (size_t)(tiles * tb));
    for (int64_t n = 0; n < N; n++)
        for (int64_t b = 0; b < nb; b++)
            move_row(fmt, data + n / ZSK_QTILE * tb, nb, b, (int)(n % ZSK_QTILE),
                     row_block_at(fmt, blocks, nb, n, b), true);
    *out = (zsk_qpacked){fmt, N, K, tiles, tb, data};
    return ZS_OK;
}

static zs_status check_packed(const char *who, const zsk_qpacked *p)
{
    if (!p || zsk_qblock_bytes(p->fmt) == 0 || p->N < 0 || p->K < 0 ||
        p->K % ZSK_QBLOCK != 0 || p->tiles != (p->N + ZSK_QTILE - 1) / ZSK_QTILE ||
        (p->N > 0 && p->K > 0 && !p->data))
        return zs_set_error("%s: weights not packed (zsk_qpack)", who);
    return ZS_OK;
}

zs_status zsk_qunpack(const zsk_qpacked *p, void *blocks)
{
    zs_status s = check_packed("qunpack", p);
    if (s < 0)
        return s;
    if (p->N == 0 || p->K == 0)
        return ZS_OK;
    if (!blocks)
        return zs_set_error("qunpack: NULL blocks");
    int64_t nb = p->K / ZSK_QBLOCK;
    for (int64_t n = 0; n < p->N; n++)
        for (int64_t b = 0; b < nb; b++)
            move_row(p->fmt, p->data + n / ZSK_QTILE * p->tile_bytes, nb, b,
                     (int)(n % ZSK_QTILE), row_block_at(p->fmt, blocks, nb, n, b), false);
    return ZS_OK;
}

zs_status zsk_qpacked_row(const zsk_qpacked *p, int64_t n, float *dst)
{
    zs_status s = check_packed("qpacked_row", p);
    if (s < 0)
        return s;
    if (n < 0 || n >= p->N)
        return zs_set_error("qpacked_row: row %lld outside [0, %lld)", (long long)n,
                            (long long)p->N);
    if (p->K == 0)
        return ZS_OK;
    if (!dst)
        return zs_set_error("qpacked_row: NULL dst");
    int64_t nb = p->K / ZSK_QBLOCK;
    uint8_t blk[ZSK_Q4_1_BYTES > ZSK_Q8_0_BYTES ? ZSK_Q4_1_BYTES : ZSK_Q8_0_BYTES];
    for (int64_t b = 0; b < nb; b++) {
        move_row(p->fmt, p->data + n / ZSK_QTILE * p->tile_bytes, nb, b,
                 (int)(n % ZSK_QTILE), row_block_at(p->fmt, blk, 1, 0, 0), false);
        zsk_dequantize(p->fmt, blk, ZSK_QBLOCK, dst + b * ZSK_QBLOCK);
    }
    return ZS_OK;
}

int64_t zsk_qpacked_bytes(const zsk_qpacked *p)
{
    return p && p->data ? p->tiles * p->tile_bytes : 0;
}

void zsk_qpacked_free(zsk_qpacked *p)
{
    if (!p)
        return;
    zs_free(p->data);
    *p = (zsk_qpacked){0};
}

/* ---- tile kernels: acc[i * 16 + r] for R activation rows of xq ------------------ */

/* The unsigned weight codes' offset c of qpacked.h's arithmetic. */
static int32_t code_offset(zsk_qfmt f) { return f == ZSK_Q8_0 ? 128 : f == ZSK_Q4_0 ? 8 : 0; }

/* Weight code of tile row r, k = 4 g + j of block data q. */
static inline int32_t code_at(zsk_qfmt f, const uint8_t *q, int r, int g, int j)
{
    if (f == ZSK_Q8_0)
        return q[64 * g + 4 * r + j];
    uint8_t v = q[64 * (g & 3) + 4 * r + j];
    return g < 4 ? v & 15 : v >> 4;
}

/* Portable: the same integer sums and the same fmaf per block and row. */
static ZSK_ISA_VOID(tile_c, (zsk_qfmt f, const uint8_t *tile, int64_t nb,
    const zsk_block_q8x *xq, int R, float *acc), (f, tile, nb, xq, R, acc))
{
    int32_t c = code_offset(f);
    for (int i = 0; i < R * ZSK_QTILE; i++)
        acc[i] = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *q = tile + data_off(f, b);
        const uint16_t *d = (const uint16_t *)(tile + scale_off(f, b, 0));
        const uint16_t *m = (const uint16_t *)(tile + scale_off(f, b, 1));
        for (int i = 0; i < R; i++) {
            const zsk_block_q8x *xb = xq + i * nb + b;
            for (int r = 0; r < ZSK_QTILE; r++) {
                int32_t s = 0;
                for (int g = 0; g < 8; g++)
                    for (int j = 0; j < 4; j++)
                        s += code_at(f, q, r, g, j) * xb->q[4 * g + j];
                s -= c * xb->s;
                float *a = &acc[i * ZSK_QTILE + r];
                *a = fmaf((float)s, zs_f16_to_f32(d[r]) * xb->d, *a);
                if (f == ZSK_Q4_1)
                    *a = fmaf(zs_f16_to_f32(m[r]), xb->d * (float)xb->s, *a);
            }
        }
    }
}

#ifdef ZSK_QPACKED_VNNI
/* Bytes 4 g .. 4 g + 3 of q broadcast to every 32-bit lane. */
VNNI_INLINE __m512i bcast4(const int8_t *q, int g)
{
    int32_t v;
    memcpy(&v, q + 4 * g, 4);
    return _mm512_set1_epi32(v);
}

/* The 8 weight-code vectors (one per group of 4 k) of a tile block. Q4:
 * groups 4 .. 7 are the high nibbles left in place (16 x the code: a mask
 * and no shift; block_sums divides their sum by 16). */
VNNI_INLINE void load_codes(zsk_qfmt f, const uint8_t *q, __m512i w[8])
{
    if (f == ZSK_Q8_0) {
        for (int g = 0; g < 8; g++)
            w[g] = _mm512_load_si512((const void *)(q + 64 * g));
        return;
    }
    __m512i lo = _mm512_set1_epi8(0x0f), hi = _mm512_set1_epi8((char)0xf0);
    for (int g = 0; g < 4; g++) {
        __m512i v = _mm512_load_si512((const void *)(q + 64 * g));
        w[g] = _mm512_and_si512(v, lo);
        w[g + 4] = _mm512_and_si512(v, hi);
    }
}

/* One activation block against the loaded codes: the exact int32 sums s of
 * the 16 rows, minus c * s_x (off = -c * s_x in every lane, the first
 * chain's start). Q4: the high nibbles' chain holds 16 x its sum, a
 * multiple of 16, so the shift divides exactly (|16 x sum| < 2^19). */
VNNI_INLINE __m512i block_sums(zsk_qfmt f, const __m512i w[8], const zsk_block_q8x *xb,
                               __m512i off)
{
    __m512i s0 = off, s1 = _mm512_setzero_si512();
    if (f == ZSK_Q8_0) {
        for (int g = 0; g < 8; g += 2) {
            s0 = _mm512_dpbusd_epi32(s0, w[g], bcast4(xb->q, g));
            s1 = _mm512_dpbusd_epi32(s1, w[g + 1], bcast4(xb->q, g + 1));
        }
        return _mm512_add_epi32(s0, s1);
    }
    for (int g = 0; g < 4; g++) {
        s0 = _mm512_dpbusd_epi32(s0, w[g], bcast4(xb->q, g));
        s1 = _mm512_dpbusd_epi32(s1, w[g + 4], bcast4(xb->q, g + 4));
    }
    return _mm512_add_epi32(s0, _mm512_srai_epi32(s1, 4));
}

/* acc <- the file comment's fma(s, d * d_x) (and Q4_1's minimum term). */
VNNI_INLINE __m512 block_acc(zsk_qfmt f, __m512 acc, __m512i s, __m512 d, __m512 m,
                             const zsk_block_q8x *xb)
{
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(d, _mm512_set1_ps(xb->d)),
                          acc);
    if (f == ZSK_Q4_1)
        acc = _mm512_fmadd_ps(m, _mm512_set1_ps(xb->d * (float)xb->s), acc);
    return acc;
}

VNNI_INLINE __m512 load_scales(const uint8_t *tile, zsk_qfmt f, int64_t b,
                               int which)
{
    return _mm512_cvtph_ps(
        _mm256_load_si256((const __m256i *)(tile + scale_off(f, b, which))));
}

VNNI_INLINE void tile_vnni_r(zsk_qfmt f, int R, const uint8_t *tile, int64_t nb,
                             const zsk_block_q8x *xq, float *acc)
{
    int32_t c = code_offset(f);
    __m512 a[MR];
    for (int i = 0; i < R; i++)
        a[i] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        __m512i w[8];
        load_codes(f, tile + data_off(f, b), w);
        __m512 d = load_scales(tile, f, b, 0);
        __m512 m = f == ZSK_Q4_1 ? load_scales(tile, f, b, 1) : d;
        for (int i = 0; i < R; i++) {
            const zsk_block_q8x *xb = xq + i * nb + b;
            __m512i off = _mm512_set1_epi32(-c * xb->s);
            a[i] = block_acc(f, a[i], block_sums(f, w, xb, off), d, m, xb);
        }
    }
    for (int i = 0; i < R; i++)
        _mm512_storeu_ps(acc + i * ZSK_QTILE, a[i]);
}

/* The rows count and format as constants, so each loop unrolls. */
#define TILE_CASES(F)                                                              \
    switch (R) {                                                                   \
    case 1: tile_vnni_r(F, 1, tile, nb, xq, acc); return;                          \
    case 2: tile_vnni_r(F, 2, tile, nb, xq, acc); return;                          \
    case 3: tile_vnni_r(F, 3, tile, nb, xq, acc); return;                          \
    default: tile_vnni_r(F, MR, tile, nb, xq, acc); return;                        \
    }

VNNI static void tile_vnni(zsk_qfmt f, const uint8_t *tile, int64_t nb,
                           const zsk_block_q8x *xq, int R, float *acc)
{
    switch (f) {
    case ZSK_Q8_0: TILE_CASES(ZSK_Q8_0)
    case ZSK_Q4_0: TILE_CASES(ZSK_Q4_0)
    case ZSK_Q4_1: TILE_CASES(ZSK_Q4_1)
    }
}

/* M = 1 on STREAMS tiles at once (one weight stream each): tile i's 16
 * sums to out[i]. */
VNNI_INLINE void gemv_vnni_f(zsk_qfmt f, const uint8_t *const *t, int64_t nb,
                             const zsk_block_q8x *xq, float *const *out)
{
    int32_t c = code_offset(f);
    __m512 a[STREAMS];
    for (int i = 0; i < STREAMS; i++)
        a[i] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const zsk_block_q8x *xb = xq + b;
        __m512i off = _mm512_set1_epi32(-c * xb->s);
        for (int i = 0; i < STREAMS; i++) {
            __m512i w[8];
            load_codes(f, t[i] + data_off(f, b), w);
            __m512 d = load_scales(t[i], f, b, 0);
            __m512 m = f == ZSK_Q4_1 ? load_scales(t[i], f, b, 1) : d;
            a[i] = block_acc(f, a[i], block_sums(f, w, xb, off), d, m, xb);
        }
    }
    for (int i = 0; i < STREAMS; i++)
        _mm512_storeu_ps(out[i], a[i]);
}

VNNI static void gemv_vnni(zsk_qfmt f, const uint8_t *const *t, int64_t nb,
                           const zsk_block_q8x *xq, float *const *out)
{
    switch (f) {
    case ZSK_Q8_0: gemv_vnni_f(ZSK_Q8_0, t, nb, xq, out); return;
    case ZSK_Q4_0: gemv_vnni_f(ZSK_Q4_0, t, nb, xq, out); return;
    case ZSK_Q4_1: gemv_vnni_f(ZSK_Q4_1, t, nb, xq, out); return;
    }
}

/* ---- AVX2 + FMA + F16C: the same sums with vpmaddubsw / vpmaddwd ---------------- */

/* A 64-byte group of a tile block is two ymm: rows 0 .. 7 (half 0) and
 * 8 .. 15 (half 1), 4 consecutive k per 32-bit lane as for vpdpbusd. With
 * no u8 x s8 -> s32 instruction, vpmaddubsw makes s16 pair sums that must
 * not saturate, and vpmaddwd with ones adds the pairs into the lanes:
 *   Q8_0: the codes u (0 .. 255) times x (-127 .. 127) would saturate a
 *         pair, so w = u - 128 (a xor) and the sign trick on the
 *         activation's side: |x| (0 .. 127) as u8, w with x's sign as s8;
 *         |pair| <= 2 * 127 * 128 = 32512. |x| is made once per group of
 *         4 k and serves every weight vector of the group (abs(w) and
 *         sign(x, w) cost two operations per vector). The lanes then hold
 *         sum w x, which is s already (no offset).
 *   Q4:   nibbles (0 .. 15) as u8, x as s8: |pair| <= 3810, so a block's 8
 *         groups add in s16 (<= 30480) and one vpmaddwd per half ends it.
 * All integer, so the sums are exactly those of the VNNI and portable paths
 * and so are the bits that follow (same f32 operations per row and block). */

AVX2_INLINE __m256i bcast4_256(const int8_t *q, int g)
{
    int32_t v;
    memcpy(&v, q + 4 * g, 4);
    return _mm256_set1_epi32(v);
}

/* s[h] <- the exact int32 sums of block q's rows 8 h .. 8 h + 7 against
 * activation block xb (c * s_x already subtracted). */
AVX2_INLINE void block_sums_avx2(zsk_qfmt f, const uint8_t *q, const zsk_block_q8x *xb,
                                 __m256i s[2])
{
    __m256i ones = _mm256_set1_epi16(1);
    if (f == ZSK_Q8_0) {
        __m256i flip = _mm256_set1_epi8((char)0x80);
        s[0] = s[1] = _mm256_setzero_si256();
        for (int g = 0; g < 8; g++) {
            __m256i x = bcast4_256(xb->q, g), ax = _mm256_abs_epi8(x);
            for (int h = 0; h < 2; h++) {
                __m256i w = _mm256_xor_si256(
                    _mm256_load_si256((const __m256i *)(q + 64 * g + 32 * h)), flip);
                __m256i p = _mm256_maddubs_epi16(ax, _mm256_sign_epi8(w, x));
                s[h] = _mm256_add_epi32(s[h], _mm256_madd_epi16(p, ones));
            }
        }
        return;
    }
    __m256i lo = _mm256_set1_epi8(0x0f);
    __m256i off = _mm256_set1_epi32(-code_offset(f) * xb->s);
    for (int h = 0; h < 2; h++) {
        __m256i p = _mm256_setzero_si256();
        for (int g = 0; g < 4; g++) {
            __m256i v = _mm256_load_si256((const __m256i *)(q + 64 * g + 32 * h));
            p = _mm256_add_epi16(p, _mm256_maddubs_epi16(_mm256_and_si256(v, lo),
                                                         bcast4_256(xb->q, g)));
            p = _mm256_add_epi16(
                p, _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(v, 4), lo),
                                        bcast4_256(xb->q, g + 4)));
        }
        s[h] = _mm256_add_epi32(_mm256_madd_epi16(p, ones), off);
    }
}

/* a[h] <- fma(s, d * d_x, a[h]) (and Q4_1's minimum term) for block b. */
AVX2_INLINE void block_acc_avx2(zsk_qfmt f, const uint8_t *tile, int64_t b,
                                const __m256i s[2], const zsk_block_q8x *xb, __m256 a[2])
{
    __m256 xd = _mm256_set1_ps(xb->d), xm = _mm256_set1_ps(xb->d * (float)xb->s);
    for (int h = 0; h < 2; h++) {
        __m256 d = _mm256_cvtph_ps(
            _mm_load_si128((const __m128i *)(tile + scale_off(f, b, 0) + 16 * h)));
        a[h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[h]), _mm256_mul_ps(d, xd), a[h]);
        if (f == ZSK_Q4_1) {
            __m256 m = _mm256_cvtph_ps(
                _mm_load_si128((const __m128i *)(tile + scale_off(f, b, 1) + 16 * h)));
            a[h] = _mm256_fmadd_ps(m, xm, a[h]);
        }
    }
}

/* block_acc_avx2 on 16 f32 accumulators in memory. */
AVX2_INLINE void block_acc_mem(zsk_qfmt f, const uint8_t *tile, int64_t b, const __m256i s[2],
                               const zsk_block_q8x *xb, float *acc)
{
    __m256 a[2] = {_mm256_load_ps(acc), _mm256_load_ps(acc + 8)};
    block_acc_avx2(f, tile, b, s, xb, a);
    _mm256_store_ps(acc, a[0]);
    _mm256_store_ps(acc + 8, a[1]);
}

/* R activation rows over one tile, a block at a time (the tile block stays
 * in L1 while the rows pass; unlike zmm, its 16 ymm do not fit in
 * registers, so each row reloads them). */
AVX2_INLINE void tile_avx2_f(zsk_qfmt f, const uint8_t *tile, int64_t nb,
                             const zsk_block_q8x *xq, int R, float *acc)
{
    __m256 a[MR][2];
    for (int i = 0; i < R; i++)
        a[i][0] = a[i][1] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *q = tile + data_off(f, b);
        for (int i = 0; i < R; i++) {
            __m256i s[2];
            block_sums_avx2(f, q, xq + i * nb + b, s);
            block_acc_avx2(f, tile, b, s, xq + i * nb + b, a[i]);
        }
    }
    for (int i = 0; i < R; i++) {
        _mm256_storeu_ps(acc + i * ZSK_QTILE, a[i][0]);
        _mm256_storeu_ps(acc + i * ZSK_QTILE + 8, a[i][1]);
    }
}

AVX2 static void tile_avx2(zsk_qfmt f, const uint8_t *tile, int64_t nb,
                           const zsk_block_q8x *xq, int R, float *acc)
{
    switch (f) {
    case ZSK_Q8_0: tile_avx2_f(ZSK_Q8_0, tile, nb, xq, R, acc); return;
    case ZSK_Q4_0: tile_avx2_f(ZSK_Q4_0, tile, nb, xq, R, acc); return;
    case ZSK_Q4_1: tile_avx2_f(ZSK_Q4_1, tile, nb, xq, R, acc); return;
    }
}

/* M = 1 on STREAMS tiles at once, as gemv_vnni, with the group loop
 * outside the streams: an activation group's broadcasts are made once for
 * the 8 weight vectors (4 streams x 2 halves) that use them, and the 8
 * int32 (Q8_0) or int16 (Q4) sums stay in registers for the block; the
 * f32 accumulators live in acc [STREAMS][16] (L1), touched once a block.
 * Q8_0 as block_sums_avx2: a weight vector costs xor, vpsignb, vpmaddubsw,
 * vpmaddwd and an add. The first version (streams inside the group loop,
 * abs(w) and sign(x, w) per vector) spilled its broadcasts and ran 0.82 ns
 * per row block of 32 weights hot in L2 on one Zen 4 thread (Q4_0 0.58),
 * this one 0.55 (0.39); removing the xor too (unbiased Q8_0 bytes on this
 * path) or vpsignb (xor and subtract with x's sign mask) measured no
 * faster: neither bounds it (~59 GB/s of tiles from L2; the two multiplies
 * per vector alone would allow about twice that). */
AVX2_INLINE void gemv_q8_0_avx2(const uint8_t *const *t, int64_t nb, const zsk_block_q8x *xq,
                                float acc[STREAMS][ZSK_QTILE])
{
    const __m256i flip = _mm256_set1_epi8((char)0x80), ones = _mm256_set1_epi16(1);
    for (int64_t b = 0; b < nb; b++) {
        const zsk_block_q8x *xb = xq + b;
        int64_t off = data_off(ZSK_Q8_0, b);
        __m256i s[STREAMS][2];
        for (int i = 0; i < STREAMS; i++)
            s[i][0] = s[i][1] = _mm256_setzero_si256();
        for (int g = 0; g < 8; g++) {
            __m256i x = bcast4_256(xb->q, g), ax = _mm256_abs_epi8(x);
            for (int i = 0; i < STREAMS; i++)
                for (int h = 0; h < 2; h++) {
                    __m256i w = _mm256_xor_si256(
                        _mm256_load_si256((const __m256i *)(t[i] + off + 64 * g + 32 * h)),
                        flip);
                    __m256i p = _mm256_maddubs_epi16(ax, _mm256_sign_epi8(w, x));
                    s[i][h] = _mm256_add_epi32(s[i][h], _mm256_madd_epi16(p, ones));
                }
        }
        for (int i = 0; i < STREAMS; i++)
            block_acc_mem(ZSK_Q8_0, t[i], b, s[i], xb, acc[i]);
    }
}

/* Q4_0 / Q4_1: per group the low nibbles against x of k = 4 g + j and the
 * high ones against k = 16 + 4 g + j, in int16 as before (a block's 8
 * groups sum to at most 30480). */
AVX2_INLINE void gemv_q4_avx2(zsk_qfmt f, const uint8_t *const *t, int64_t nb,
                              const zsk_block_q8x *xq, float acc[STREAMS][ZSK_QTILE])
{
    const __m256i lo = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
    for (int64_t b = 0; b < nb; b++) {
        const zsk_block_q8x *xb = xq + b;
        int64_t off = data_off(f, b);
        __m256i p[STREAMS][2];
        for (int i = 0; i < STREAMS; i++)
            p[i][0] = p[i][1] = _mm256_setzero_si256();
        for (int g = 0; g < 4; g++) {
            __m256i xl = bcast4_256(xb->q, g), xh = bcast4_256(xb->q, g + 4);
            for (int i = 0; i < STREAMS; i++)
                for (int h = 0; h < 2; h++) {
                    __m256i v =
                        _mm256_load_si256((const __m256i *)(t[i] + off + 64 * g + 32 * h));
                    __m256i a = _mm256_maddubs_epi16(_mm256_and_si256(v, lo), xl);
                    __m256i c = _mm256_maddubs_epi16(
                        _mm256_and_si256(_mm256_srli_epi16(v, 4), lo), xh);
                    p[i][h] = _mm256_add_epi16(p[i][h], _mm256_add_epi16(a, c));
                }
        }
        __m256i o = _mm256_set1_epi32(-code_offset(f) * xb->s);
        for (int i = 0; i < STREAMS; i++) {
            __m256i s[2] = {_mm256_add_epi32(_mm256_madd_epi16(p[i][0], ones), o),
                            _mm256_add_epi32(_mm256_madd_epi16(p[i][1], ones), o)};
            block_acc_mem(f, t[i], b, s, xb, acc[i]);
        }
    }
}

AVX2 static void gemv_avx2(zsk_qfmt f, const uint8_t *const *t, int64_t nb,
                           const zsk_block_q8x *xq, float *const *out)
{
    _Alignas(32) float acc[STREAMS][ZSK_QTILE] = {{0}};
    switch (f) {
    case ZSK_Q8_0: gemv_q8_0_avx2(t, nb, xq, acc); break;
    case ZSK_Q4_0: gemv_q4_avx2(ZSK_Q4_0, t, nb, xq, acc); break;
    case ZSK_Q4_1: gemv_q4_avx2(ZSK_Q4_1, t, nb, xq, acc); break;
    }
    for (int i = 0; i < STREAMS; i++)
        memcpy(out[i], acc[i], sizeof acc[i]);
}
#endif

/* ---- driver -------------------------------------------------------------------- */

typedef struct qlin_job {
    const zsk_qpacked *p;
    const float *x, *bias, *res;
    float *y;
    zsk_block_q8x *xq; /* [M, nb] */
    float *raw;        /* M = 1: [tiles * 16] sums before the epilogue */
    int64_t M, nb, ldx, ldr, ldy;
    zsk_act act;
    bool vnni, avx2; /* at most one: the path taken */
} qlin_job;

static void quantize_rows(void *ctx, int64_t m0, int64_t m1)
{
    const qlin_job *j = ctx;
    for (int64_t m = m0; m < m1; m++)
        zsk_quantize_q8x(j->x + m * j->ldx, j->p->K, j->xq + m * j->nb);
}

/* Epilogue of tile t's outputs for row m from acc [16]. */
static void finish(const qlin_job *j, int64_t t, int64_t m, const float *acc)
{
    int64_t n0 = t * ZSK_QTILE, N = j->p->N;
    int64_t nc = N - n0 < ZSK_QTILE ? N - n0 : ZSK_QTILE;
    zsk_linear_epilogue_at(acc, n0, nc, m, j->bias, j->res, j->ldr, j->act, j->y, j->ldy);
}

/* One tile's sums for R rows of xq into acc [R * 16]. */
static void tile_sums(const qlin_job *j, int64_t t, const zsk_block_q8x *xq, int R,
                      float *acc)
{
    const uint8_t *tile = j->p->data + t * j->p->tile_bytes;
#ifdef ZSK_QPACKED_VNNI
    if (j->vnni) {
        tile_vnni(j->p->fmt, tile, j->nb, xq, R, acc);
        return;
    }
    if (j->avx2) {
        tile_avx2(j->p->fmt, tile, j->nb, xq, R, acc);
        return;
    }
#endif
    tile_c(j->p->fmt, tile, j->nb, xq, R, acc);
}

/* M = 1: the sums of tiles [t0, t1) into raw (STREAMS tiles side by side
 * on the VNNI path), then one epilogue over their outputs. */
static void gemv_tiles(const qlin_job *j, int64_t t0, int64_t t1)
{
    int64_t first = t0, N = j->p->N;
#ifdef ZSK_QPACKED_VNNI
    if ((j->vnni || j->avx2) && t1 - t0 >= STREAMS) {
        int64_t h = (t1 - t0) / STREAMS;
        for (int64_t t = 0; t < h; t++) {
            const uint8_t *tp[STREAMS];
            float *out[STREAMS];
            for (int i = 0; i < STREAMS; i++) {
                tp[i] = j->p->data + (t0 + i * h + t) * j->p->tile_bytes;
                out[i] = j->raw + (t0 + i * h + t) * ZSK_QTILE;
            }
            if (j->vnni)
                gemv_vnni(j->p->fmt, tp, j->nb, j->xq, out);
            else
                gemv_avx2(j->p->fmt, tp, j->nb, j->xq, out);
        }
        t0 += STREAMS * h;
    }
#endif
    for (int64_t t = t0; t < t1; t++)
        tile_sums(j, t, j->xq, 1, j->raw + t * ZSK_QTILE);
    int64_t n0 = first * ZSK_QTILE, n1 = t1 * ZSK_QTILE < N ? t1 * ZSK_QTILE : N;
    zsk_linear_epilogue_at(j->raw + n0, n0, n1 - n0, 0, j->bias, j->res, j->ldr, j->act,
                           j->y, j->ldy);
}

static void run_tiles(void *ctx, int64_t t0, int64_t t1)
{
    const qlin_job *j = ctx;
    _Alignas(64) float acc[MR * ZSK_QTILE];
    if (j->nb == 0) { /* K = 0: no data, every dot is 0 */
        memset(acc, 0, sizeof acc);
        for (int64_t t = t0; t < t1; t++)
            for (int64_t m = 0; m < j->M; m++)
                finish(j, t, m, acc);
        return;
    }
    if (j->M == 1) {
        gemv_tiles(j, t0, t1);
        return;
    }
    for (int64_t t = t0; t < t1; t++)
        for (int64_t m = 0; m < j->M; m += MR) {
            int R = (int)(j->M - m < MR ? j->M - m : MR);
            tile_sums(j, t, j->xq + m * j->nb, R, acc);
            for (int r = 0; r < R; r++)
                finish(j, t, m + r, acc + r * ZSK_QTILE);
        }
}

zs_status zsk_qpacked_linear(const zsk_qpacked *p, const float *x, int64_t M,
                             int64_t ldx, const float *bias, const float *residual,
                             int64_t ldr, zsk_act act, float *y, int64_t ldy)
{
    zs_status s = check_packed("qpacked_linear", p);
    if (s == ZS_OK)
        s = zsk_linear_check("qpacked_linear", p->N, p->K, x, M, ldx, residual, ldr, act,
                             y, ldy);
    if (s < 0 || M == 0 || p->N == 0)
        return s;
    int64_t nb = p->K / ZSK_QBLOCK;
    /* workspace: the quantized rows, then (M = 1) the raw sums */
    size_t xbytes = (size_t)(M * nb) * sizeof(zsk_block_q8x);
    xbytes = (xbytes + 63) / 64 * 64;
    size_t bytes = xbytes + (M == 1 ? (size_t)(p->tiles * ZSK_QTILE) * sizeof(float) : 0);
    char *ws = zs_alloc(bytes ? bytes : 1);
    if (!ws)
        return zs_set_error_code(ZS_ERR_NOMEM, "qpacked_linear: out of memory (%zu bytes)",
                                 bytes);
    qlin_job j = {p, x, bias, residual, y, (zsk_block_q8x *)ws, (float *)(ws + xbytes), M,
                  nb, ldx, ldr, ldy, act, false, false};
#ifdef ZSK_QPACKED_VNNI
    j.vnni = !zsk_linear_portable() && zsk_quant_has_vnni();
    j.avx2 = !zsk_linear_portable() && !j.vnni && zsk_quant_has_avx2();
#endif
    if (nb > 0)
        zs_parallel_for(M, 1 + 16384 / p->K, quantize_rows, &j);
    zs_parallel_for(p->tiles, 1 + ITEM_MACS / (M * ZSK_QTILE * (p->K + 1)), run_tiles, &j);
    zs_free(ws);
    return ZS_OK;
}
