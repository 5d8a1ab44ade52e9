/*
 * copy.c - element access, fill, copies between layouts and dtypes, on
 * memory the CPU addresses.
 *
 * These are core's host helpers: the public in-place operators zs_copy_
 * and zs_fill_ are descriptors of the ops layer (ops/inplace.c) whose CPU
 * kernels call zsi_copy_host and zsi_fill_host; core uses them directly
 * for its own copies (host buffers, zs_full).
 *
 * zsi_copy_host walks the destination in row-major order with an n-d counter;
 * the innermost dim runs as a tight loop (memcpy when both sides are
 * contiguous there and share the dtype). Rows are split across the pool.
 */
#include <string.h>

#include "core/internal.h"

double zsi_load(zs_dtype dt, const void *base, int64_t i)
{
    switch (dt) {
    case ZS_F32: return ((const float *)base)[i];
    case ZS_F64: return ((const double *)base)[i];
    case ZS_F16: return zs_f16_to_f32(((const uint16_t *)base)[i]);
    case ZS_BF16: return zs_bf16_to_f32(((const uint16_t *)base)[i]);
    case ZS_F8E4M3: return zs_f8e4m3_to_f32(((const uint8_t *)base)[i]);
    case ZS_F8E5M2: return zs_f8e5m2_to_f32(((const uint8_t *)base)[i]);
    case ZS_I8: return ((const int8_t *)base)[i];
    case ZS_U8: return ((const uint8_t *)base)[i];
    case ZS_I32: return ((const int32_t *)base)[i];
    case ZS_I64: return (double)((const int64_t *)base)[i];
    default: return 0;
    }
}

static double clampd(double v, double lo, double hi)
{
    return v != v ? 0 : v < lo ? lo : v > hi ? hi : v;
}

void zsi_store(zs_dtype dt, void *base, int64_t i, double v)
{
    switch (dt) {
    case ZS_F32: ((float *)base)[i] = (float)v; break;
    case ZS_F64: ((double *)base)[i] = v; break;
    case ZS_F16: ((uint16_t *)base)[i] = zs_f32_to_f16((float)v); break;
    case ZS_BF16: ((uint16_t *)base)[i] = zs_f32_to_bf16((float)v); break;
    case ZS_F8E4M3: ((uint8_t *)base)[i] = zs_f32_to_f8e4m3((float)v); break;
    case ZS_F8E5M2: ((uint8_t *)base)[i] = zs_f32_to_f8e5m2((float)v); break;
    case ZS_I8: ((int8_t *)base)[i] = (int8_t)clampd(v, -128, 127); break;
    case ZS_U8: ((uint8_t *)base)[i] = (uint8_t)clampd(v, 0, 255); break;
    case ZS_I32:
        ((int32_t *)base)[i] = (int32_t)clampd(v, -2147483648.0, 2147483647.0);
        break;
    case ZS_I64: ((int64_t *)base)[i] = (int64_t)clampd(v, -9.2e18, 9.2e18); break;
    default: break;
    }
}

/* Offset (elements) of the row-major flat index i in t. */
static int64_t flat_offset(const zs_tensor *t, int64_t i)
{
    int64_t off = 0;
    for (int d = t->ndim - 1; d >= 0; d--) {
        int64_t n = t->shape[d];
        off += (i % n) * t->strides[d];
        i /= n;
    }
    return off;
}

double zs_get(const zs_tensor *t, int64_t flat_index)
{
    if (!t || flat_index < 0 || flat_index >= zs_numel(t))
        return 0;
    zsi_dry_touch(t);
    if (!t->storage->data)
        return 0;
    int64_t off = t->offset + flat_offset(t, flat_index);
    if (zsi_device_host(t->device))
        return zsi_load(t->dtype, t->storage->data, off);
    /* another device's memory: that one element, copied to the host */
    size_t es = zs_dtype_size(t->dtype);
    unsigned char buf[16];
    if (zsi_device_copy(t->device, buf, (char *)t->storage->data + off * (int64_t)es,
                        es, ZS_COPY_TO_HOST) != ZS_OK)
        return 0;
    return zsi_load(t->dtype, buf, 0);
}

double zs_item(const zs_tensor *t) { return zs_get(t, 0); }

typedef struct copy_job {
    zs_tensor *dst;
    const zs_tensor *src;
    int64_t inner; /* size of the last dim (1 for 0-d); flat: of a chunk */
    int64_t numel; /* flat: both contiguous, rows are chunks of numel */
    bool flat;
} copy_job;

/* Elements per row of a flat copy: both sides contiguous (the flat f32
 * weights converted to bf16 once per step, one dim of 12 M elements, ran
 * on one thread as one row). */
#define FLAT_CHUNK 32768

/* zs_f32_to_bf16 inlined (nearest even; NaN: its top half, quiet), the
 * same bits. */
static inline uint16_t bf16_round(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? (u >> 16) | 0x40u : r);
}

static void copy_row(const copy_job *j, int64_t row)
{
    const zs_tensor *d = j->dst, *s = j->src;
    int64_t n = j->inner;
    int64_t doff = d->offset, soff = s->offset;
    int64_t ds = d->ndim ? d->strides[d->ndim - 1] : 1;
    int64_t ss = s->ndim ? s->strides[s->ndim - 1] : 1;
    if (j->flat) {
        doff += row * n;
        soff += row * n;
        n = j->numel - row * n < n ? j->numel - row * n : n;
        ds = ss = 1;
    } else if (d->ndim > 0) {
        doff += flat_offset(d, row * n);
        soff += flat_offset(s, row * n);
    }
    size_t es = zs_dtype_size(d->dtype);
    char *dp = (char *)d->storage->data;
    const char *sp = (const char *)s->storage->data;
    if (d->dtype == s->dtype) {
        if (ds == 1 && ss == 1) {
            memcpy(dp + doff * (int64_t)es, sp + soff * (int64_t)es, (size_t)n * es);
        } else if (es == 4) {
            uint32_t *o = (uint32_t *)dp + doff;
            const uint32_t *x = (const uint32_t *)sp + soff;
            for (int64_t i = 0; i < n; i++)
                o[i * ds] = x[i * ss];
        } else if (es == 8) {
            uint64_t *o = (uint64_t *)dp + doff;
            const uint64_t *x = (const uint64_t *)sp + soff;
            for (int64_t i = 0; i < n; i++)
                o[i * ds] = x[i * ss];
        } else {
            for (int64_t i = 0; i < n; i++)
                memcpy(dp + (doff + i * ds) * (int64_t)es,
                       sp + (soff + i * ss) * (int64_t)es, es);
        }
        return;
    }
    if (d->dtype == ZS_F32 && s->dtype == ZS_F64) {
        float *o = (float *)dp + doff;
        const double *x = (const double *)sp + soff;
        for (int64_t i = 0; i < n; i++)
            o[i * ds] = (float)x[i * ss];
        return;
    }
    if (d->dtype == ZS_F64 && s->dtype == ZS_F32) {
        double *o = (double *)dp + doff;
        const float *x = (const float *)sp + soff;
        for (int64_t i = 0; i < n; i++)
            o[i * ds] = x[i * ss];
        return;
    }
    /* bf16 <-> f32, the casts of mixed precision (ops/autocast.c): inline,
     * not through double (the generic loop ran at 0.2 GB/s), and the
     * rounding inlined (bf16_round) so that the loop vectorises */
    if (d->dtype == ZS_BF16 && s->dtype == ZS_F32) {
        uint16_t *o = (uint16_t *)dp + doff;
        const float *x = (const float *)sp + soff;
        if (ds == 1 && ss == 1) {
            for (int64_t i = 0; i < n; i++)
                o[i] = bf16_round(x[i]);
            return;
        }
        for (int64_t i = 0; i < n; i++)
            o[i * ds] = bf16_round(x[i * ss]);
        return;
    }
    if (d->dtype == ZS_F32 && s->dtype == ZS_BF16) {
        float *o = (float *)dp + doff;
        const uint16_t *x = (const uint16_t *)sp + soff;
        if (ds == 1 && ss == 1) {
            for (int64_t i = 0; i < n; i++) {
                uint32_t u = (uint32_t)x[i] << 16;
                memcpy(&o[i], &u, sizeof u);
            }
            return;
        }
        for (int64_t i = 0; i < n; i++) {
            uint32_t u = (uint32_t)x[i * ss] << 16;
            memcpy(&o[i * ds], &u, sizeof u);
        }
        return;
    }
    /* f16 <-> f32, the casts of --precision fp16: rows through F16C */
    if (d->dtype == ZS_F16 && s->dtype == ZS_F32) {
        uint16_t *o = (uint16_t *)dp + doff;
        const float *x = (const float *)sp + soff;
        if (ds == 1 && ss == 1) {
            zsi_f16_narrow(x, o, n);
            return;
        }
        for (int64_t i = 0; i < n; i++)
            o[i * ds] = zs_f32_to_f16(x[i * ss]);
        return;
    }
    if (d->dtype == ZS_F32 && s->dtype == ZS_F16) {
        float *o = (float *)dp + doff;
        const uint16_t *x = (const uint16_t *)sp + soff;
        if (ds == 1 && ss == 1) {
            zsi_f16_widen(x, o, n);
            return;
        }
        for (int64_t i = 0; i < n; i++)
            o[i * ds] = zs_f16_to_f32(x[i * ss]);
        return;
    }
    for (int64_t i = 0; i < n; i++)
        zsi_store(d->dtype, dp, doff + i * ds,
                  zsi_load(s->dtype, sp, soff + i * ss));
}

static void copy_rows(void *ctx, int64_t b, int64_t e)
{
    for (int64_t r = b; r < e; r++)
        copy_row(ctx, r);
}

/* dst contiguous [.., R, C] from src whose last two dims are swapped in
 * memory (src stride 1 along dim -2): copied in 256 x 256 tiles (so the
 * pages of both sides stay in the TLB) of line-sized blocks (so both sides
 * move whole cache lines). Element by element it reached 3% of the memory
 * bandwidth in bench/bandwidth. */
typedef struct tr_job {
    char *d;
    const char *s;
    int64_t R, C, sr, sc; /* src strides of the two dims (sr == 1) */
    size_t es;
    const zs_tensor *src;
    int64_t outer, rblocks, cblocks;
} tr_job;

#define TILE 256 /* pages per tile stay in the TLB: 256 source + 256 dest */

/* One B x B block (B = elements per 64-byte line): each source line is read
 * whole into a local buffer and each destination line written whole, so a
 * power-of-two row stride (all lines in one cache set) costs nothing. */
#define DEFINE_BLOCK(T, B, NAME)                                              \
    static void NAME(T *d, int64_t ldd, const T *s, int64_t lds, int64_t nr,  \
                     int64_t nc)                                              \
    {                                                                         \
        T buf[B][B];                                                          \
        for (int64_t c = 0; c < nc; c++)                                      \
            for (int64_t r = 0; r < nr; r++)                                  \
                buf[c][r] = s[c * lds + r];                                   \
        for (int64_t r = 0; r < nr; r++)                                      \
            for (int64_t c = 0; c < nc; c++)                                  \
                d[r * ldd + c] = buf[c][r];                                   \
    }
DEFINE_BLOCK(uint32_t, 16, block32)
DEFINE_BLOCK(uint64_t, 8, block64)

static void tr_tile(const tr_job *j, int64_t o, int64_t rb, int64_t cb)
{
    /* offset of outer index o in src (dims before the last two) */
    const zs_tensor *t = j->src;
    int64_t soff = t->offset, rem = o;
    for (int d = t->ndim - 3; d >= 0; d--) {
        soff += (rem % t->shape[d]) * t->strides[d];
        rem /= t->shape[d];
    }
    int64_t r0 = rb * TILE, r1 = r0 + TILE < j->R ? r0 + TILE : j->R;
    int64_t cs = cb * TILE, ce = cs + TILE < j->C ? cs + TILE : j->C;
    int64_t B = j->es == 4 ? 16 : 8;
    char *dbase = j->d + (size_t)(o * j->R * j->C) * j->es;
    for (int64_t c0 = cs; c0 < ce; c0 += B) {
        int64_t nc = ce - c0 < B ? ce - c0 : B;
        for (int64_t rr = r0; rr < r1; rr += B) {
            int64_t nr = r1 - rr < B ? r1 - rr : B;
            if (j->es == 4)
                block32((uint32_t *)dbase + rr * j->C + c0, j->C,
                        (const uint32_t *)j->s + soff + rr + c0 * j->sc, j->sc, nr, nc);
            else
                block64((uint64_t *)dbase + rr * j->C + c0, j->C,
                        (const uint64_t *)j->s + soff + rr + c0 * j->sc, j->sc, nr, nc);
        }
    }
}

static void tr_body(void *ctx, int64_t b, int64_t e)
{
    const tr_job *j = ctx;
    for (int64_t t = b; t < e; t++) {
        int64_t per = j->rblocks * j->cblocks, in = t % per;
        tr_tile(j, t / per, in / j->cblocks, in % j->cblocks);
    }
}

static bool try_transpose_copy(zs_tensor *dst, const zs_tensor *src)
{
    int n = src->ndim;
    size_t es = zs_dtype_size(src->dtype);
    if (n < 2 || dst->dtype != src->dtype || (es != 4 && es != 8) ||
        !zs_is_contiguous(dst) || src->strides[n - 2] != 1 ||
        src->strides[n - 1] == 1 || src->shape[n - 1] < 2 || src->shape[n - 2] < 2)
        return false;
    tr_job j = {zs_data(dst), (const char *)src->storage->data, src->shape[n - 2],
                src->shape[n - 1], 1, src->strides[n - 1], es, src, 1, 0, 0};
    for (int d = 0; d < n - 2; d++)
        j.outer *= src->shape[d];
    j.rblocks = (j.R + TILE - 1) / TILE;
    j.cblocks = (j.C + TILE - 1) / TILE;
    zs_parallel_for(j.outer * j.rblocks * j.cblocks, 1, tr_body, &j);
    return true;
}

zs_status zsi_copy_host(zs_tensor *dst, const zs_tensor *src)
{
    if (zs_numel(dst) != zs_numel(src)) {
        char a[96], b[96];
        return zs_set_error("copy: destination %s and source %s differ in "
                            "element count", zs_shape_str(dst, a, sizeof a),
                            zs_shape_str(src, b, sizeof b));
    }
    int64_t numel = zs_numel(dst);
    if (numel == 0)
        return ZS_OK;
    /* Same shape: walk both by the destination's shape. Different shapes
     * with equal numel: go through flat indices of both (reshape copy). */
    if (!zs_same_shape(dst, src)) {
        if (zs_is_contiguous(dst) && zs_is_contiguous(src) && dst->dtype == src->dtype) {
            memcpy(zs_data(dst), zs_data(src), zs_nbytes(dst));
            return ZS_OK;
        }
        for (int64_t i = 0; i < numel; i++)
            zsi_store(dst->dtype, dst->storage->data,
                      dst->offset + flat_offset(dst, i),
                      zsi_load(src->dtype, src->storage->data,
                               src->offset + flat_offset(src, i)));
        return ZS_OK;
    }
    if (zs_is_contiguous(dst) && zs_is_contiguous(src) && dst->dtype == src->dtype) {
        memcpy(zs_data(dst), zs_data(src), zs_nbytes(dst));
        return ZS_OK;
    }
    if (try_transpose_copy(dst, src))
        return ZS_OK;
    copy_job j = {dst, src, dst->ndim ? dst->shape[dst->ndim - 1] : 1, numel, false};
    if (zs_is_contiguous(dst) && zs_is_contiguous(src)) {
        j.flat = true;
        j.inner = FLAT_CHUNK;
    }
    int64_t rows = (numel + j.inner - 1) / j.inner;
    zs_parallel_for(rows, 1 + 16384 / (j.inner + 1), copy_rows, &j);
    return ZS_OK;
}

zs_status zsi_fill_host(zs_tensor *t, double v)
{
    int64_t n = zs_numel(t);
    if (zs_is_contiguous(t)) {
        void *d = zs_data(t);
        if (t->dtype == ZS_F32) {
            float f = (float)v, *p = d;
            for (int64_t i = 0; i < n; i++)
                p[i] = f;
        } else if (t->dtype == ZS_F64) {
            double *p = d;
            for (int64_t i = 0; i < n; i++)
                p[i] = v;
        } else {
            for (int64_t i = 0; i < n; i++)
                zsi_store(t->dtype, d, i, v);
        }
        return ZS_OK;
    }
    for (int64_t i = 0; i < n; i++)
        zsi_store(t->dtype, t->storage->data, t->offset + flat_offset(t, i), v);
    return ZS_OK;
}

/* A contiguous tensor on a device the host cannot address: one device
 * copy between its bytes and the host buffer. */
static zs_status device_buffer_copy(const zs_tensor *t, void *buf, size_t n,
                                    zs_copy_kind kind)
{
    if (!zs_is_contiguous(t))
        return zs_set_error("copy_%s_buffer: a strided view on %s: make it "
                            "contiguous there first (zs_contiguous)",
                            kind == ZS_COPY_TO_HOST ? "to" : "from",
                            zs_device_name(t->device));
    void *p = zsi_ptr(t); /* an address on the device, not dereferenced */
    return kind == ZS_COPY_TO_HOST ? zsi_device_copy(t->device, buf, p, n, kind)
                                   : zsi_device_copy(t->device, p, buf, n, kind);
}

zs_status zs_copy_to_buffer(const zs_tensor *t, void *buf, size_t nbytes)
{
    if (!t || !buf)
        return zs_set_error("copy_to_buffer: NULL argument");
    if (nbytes != zs_nbytes(t))
        return zs_set_error("copy_to_buffer: buffer holds %zu bytes, tensor "
                            "needs %zu", nbytes, zs_nbytes(t));
    zsi_dry_touch(t);
    if (!zsi_device_host(t->device))
        return device_buffer_copy(t, buf, nbytes, ZS_COPY_TO_HOST);
    zs_tensor *view = zs_from_blob(t->dtype, t->ndim, t->shape, buf);
    if (!view)
        return ZS_ERR_NOMEM;
    zs_keep(view);
    zs_status st = zsi_copy_host(view, t);
    zs_release(view);
    return st;
}

zs_status zs_copy_from_buffer(zs_tensor *t, const void *buf, size_t nbytes)
{
    if (!t || !buf)
        return zs_set_error("copy_from_buffer: NULL argument");
    if (nbytes != zs_nbytes(t))
        return zs_set_error("copy_from_buffer: buffer holds %zu bytes, tensor "
                            "needs %zu", nbytes, zs_nbytes(t));
    if (!zsi_device_host(t->device))
        return device_buffer_copy(t, (void *)buf, nbytes, ZS_COPY_FROM_HOST);
    zs_tensor *view = zs_from_blob(t->dtype, t->ndim, t->shape, (void *)buf);
    if (!view)
        return ZS_ERR_NOMEM;
    zs_keep(view);
    zs_status st = zsi_copy_host(t, view);
    zs_release(view);
    return st;
}
