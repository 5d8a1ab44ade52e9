/*
 * kernels/cpu/select.h - kernels behind concat, where/masked_fill,
 * index_select and gather (src/ops/join.c, src/ops/select.c).
 *
 * Pure data movement: they copy elements by size (1, 2, 4 or 8 bytes), so
 * they serve every dtype; only the scatter-add used by backward rules does
 * arithmetic (f32, f64). Multithreaded over the pool when large.
 */
#ifndef ZS_KERNELS_CPU_SELECT_H
#define ZS_KERNELS_CPU_SELECT_H

#include <stddef.h>

#include "kernels/cpu/kernels.h"

/* Concatenation of n contiguous blocks: dst is [O, C] (row-major, elements
 * of esize bytes) and src[i] is [O, cols[i]] with sum(cols) = C. src[i] may
 * be NULL: its columns are skipped (the caller copies them). */
void zsk_concat_rows(size_t esize, int n, const void *const *src,
                     const int64_t *cols, int64_t O, int64_t C, void *dst);

/* out = cond ? a : b elementwise; `it` has 4 operands: out, cond (u8), a,
 * b, with element strides (0 for broadcast, e.g. a scalar value). */
void zsk_where(size_t esize, const zsk_iter *it, void *out,
               const uint8_t *cond, const void *a, const void *b);

/* Indexed access over an index space [O, L, K]. Element (o, l, k) of the
 * dense side is at (o * L + l) * K + k. Its index is
 *     j = idx[o * is_o + l * is_l + k * is_k]   (0 <= j < the dim's size)
 * and its element on the indexed side is at
 *     ooff[o] + j * sd + (koff ? koff[k] : k * ks).
 * gather: out[o,l,k] = a[o, idx(o,l,k), k] with the dense side = out;
 * index_select: the same with is_o = is_k = 0. */
typedef struct zsk_index_plan {
    int64_t O, L, K;
    const int64_t *idx;
    int64_t is_o, is_l, is_k;
    const int64_t *ooff; /* [O] */
    const int64_t *koff; /* [K] or NULL */
    int64_t ks, sd;
} zsk_index_plan;

/* dense[o, l, k] = src[indexed offset of (o, l, k)]. */
void zsk_index_gather(size_t esize, const zsk_index_plan *p, void *dense,
                      const void *src);
/* dst[indexed offset of (o, l, k)] += dense[o, l, k], f32 or f64; repeated
 * indices accumulate. Deterministic: each destination element is summed by
 * one thread in l order. */
void zsk_index_scatter_add(zs_dtype dt, const zsk_index_plan *p, void *dst,
                           const void *dense);

/* First flat position i in [0, n) with idx[i] outside [0, size), or -1. */
int64_t zsk_index_find_bad(const int64_t *idx, int64_t n, int64_t size);

#endif
