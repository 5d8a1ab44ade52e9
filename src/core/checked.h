/*
 * core/checked.h - overflow-checked arithmetic for sizes that come from
 * input (file headers, JSON configs, flags, requests).
 *
 * Every product or sum of values a user controls goes through these before
 * it is used as a count, a byte size or a stride: signed overflow is
 * undefined behaviour, and a wrapped size turns a bad file into a small
 * allocation followed by a large copy. Each helper returns false (and
 * leaves *out unspecified) when the exact result does not fit.
 */
#ifndef ZS_CORE_CHECKED_H
#define ZS_CORE_CHECKED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

static inline bool zsi_mul_i64(int64_t a, int64_t b, int64_t *out)
{
    return !__builtin_mul_overflow(a, b, out);
}

static inline bool zsi_add_i64(int64_t a, int64_t b, int64_t *out)
{
    return !__builtin_add_overflow(a, b, out);
}

static inline bool zsi_mul_size(size_t a, size_t b, size_t *out)
{
    return !__builtin_mul_overflow(a, b, out);
}

/* Largest element count (and largest contiguous stride) a tensor may have:
 * 2^53, so that every count is also exact as a double. */
#define ZSI_MAX_NUMEL ((int64_t)1 << 53)

/* Element count of a shape whose sizes are >= 0, checked so that the
 * product of all sizes, zeros counted as 1, stays <= ZSI_MAX_NUMEL: then
 * the count and every contiguous stride are exact (a zero beside huge
 * sizes does not hide an overflowing stride). false when it does not fit
 * or a size is negative. */
static inline bool zsi_shape_numel_checked(int ndim, const int64_t *shape,
                                           int64_t *numel)
{
    int64_t span = 1, n = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0 || !zsi_mul_i64(span, shape[i] ? shape[i] : 1, &span) ||
            span > ZSI_MAX_NUMEL)
            return false;
        n = shape[i] ? n * shape[i] : 0; /* |n| <= span: cannot overflow */
    }
    *numel = n;
    return true;
}

/* Bytes of a shape of elements of elem_size bytes, checked as above and
 * for the byte count itself. */
static inline bool zsi_shape_bytes_checked(int ndim, const int64_t *shape,
                                           size_t elem_size, size_t *bytes)
{
    int64_t n;
    return zsi_shape_numel_checked(ndim, shape, &n) &&
           zsi_mul_size((size_t)n, elem_size, bytes);
}

#endif
