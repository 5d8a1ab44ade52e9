/*
 * buckets.c - cutting a flat gradient buffer into buckets of whole
 * parameters (contract in parallel/internal.h).
 */
#include <stdlib.h>

#include "parallel/internal.h"

static int by_offset_desc(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x < y) - (x > y);
}

int zsi_plan_buckets(int n, const int64_t *off, int64_t total, int64_t limit,
                     int64_t *lo, int *cnt)
{
    int64_t *o = malloc((size_t)(n > 0 ? n : 1) * sizeof *o);
    if (!o)
        return -1;
    for (int i = 0; i < n; i++)
        o[i] = off[i];
    qsort(o, (size_t)n, sizeof *o, by_offset_desc);
    int nb = 0;
    int64_t hi = total;
    cnt[0] = 0;
    for (int i = 0; i < n; i++) {
        cnt[nb]++;
        bool last = i == n - 1;
        if (last || (limit > 0 && hi - o[i] >= limit)) {
            lo[nb] = last ? 0 : o[i]; /* the lowest bucket reaches 0 */
            hi = lo[nb++];
            cnt[nb] = 0;
        }
    }
    if (nb == 0) { /* no parameters: one empty bucket over everything */
        lo[0] = 0;
        nb = 1;
    }
    free(o);
    return nb;
}

int zsi_find_bucket(int nb, const int64_t *lo, int64_t total, int64_t off)
{
    if (off < 0 || off >= total)
        return -1;
    int a = 0, b = nb - 1; /* first bucket with lo <= off */
    while (a < b) {
        int mid = (a + b) / 2;
        if (off >= lo[mid])
            b = mid;
        else
            a = mid + 1;
    }
    return off >= lo[a] ? a : -1;
}
