/*
 * test_alloc.c - the host allocator's size classes and its peak
 * attribution (src/core/alloc.c).
 *
 * Classes: for random sizes (odd ones, 1 B to 64 MiB, from a printed
 * seed) the bytes a block holds (the rise of current_bytes) cover the
 * request, exceed it by at most 25% below 1 MiB and 3.125% from 1 MiB, and
 * are the smallest class that does (one class step less would not hold
 * it); a freed block serves the next request of its class without the
 * system allocator.
 *
 * Attribution: the program runs itself again with ZS_ALLOC_TRACE=1 (the
 * variable is read at start); there, blocks allocated under tags are
 * reported at the peak with their group's bytes, a block freed before the
 * peak is not, zs_alloc_reset_peak starts a new snapshot, an operator's
 * result carries the operator's name and a node's backward its name. With
 * tracing off the report is refused with a message.
 */
#include <stdlib.h>
#include <unistd.h>

#include "testutil.h"

/* Bytes the allocator holds for a request of n. */
static size_t held_for(size_t n, void **p)
{
    zs_alloc_stats a, b;
    zs_alloc_get_stats(&a);
    *p = zs_alloc(n);
    zs_alloc_get_stats(&b);
    return b.current_bytes - a.current_bytes;
}

/* The class step around n: the power of two below n over 4 (below 1 MiB)
 * or 32. */
static size_t step_of(size_t n)
{
    size_t p = 64;
    while (p * 2 < n)
        p *= 2;
    return p / (p < ((size_t)1 << 20) ? 4 : 32);
}

static void test_classes(void)
{
    uint64_t seed = 0xA110C;
    zt_irand_seed(seed);
    for (int i = 0; i < 400; i++) {
        int64_t lg = zt_irand(0, 26);
        size_t n = (size_t)zt_irand(1, (int64_t)1 << lg) | 1;
        void *p;
        size_t h = held_for(n, &p);
        double lim = n >= ((size_t)1 << 20) ? 1.03125 : 1.25;
        ZT_CHECK(p && h >= n && (n <= 64 ? h == 64 : (double)h <= lim * (double)n),
                 "%zu bytes held as %zu (bound %.4f x; seed %llu)", n, h, lim,
                 (unsigned long long)seed);
        ZT_CHECK(n <= 64 || h - step_of(n) < n,
                 "%zu bytes held as %zu: a class step of %zu less holds it too", n, h,
                 step_of(n));
        zs_alloc_stats a, b;
        zs_alloc_get_stats(&a);
        zs_free(p);
        void *q = zs_alloc(n);
        zs_alloc_get_stats(&b);
        ZT_CHECK(q && b.n_system == a.n_system && b.current_bytes == a.current_bytes,
                 "%zu bytes again: the cached block (%llu system calls)", n,
                 (unsigned long long)(b.n_system - a.n_system));
        zs_free(q);
    }
    ZT_EXPECT_ERROR(zs_alloc_peak_report(stdout, 0) != ZS_OK || zs_alloc_tracing(),
                    "ZS_ALLOC_TRACE");
    zt_section("size classes");
}

/* The report of the last snapshot, in a string (malloc'd). */
static char *report(size_t min_bytes)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f)
        return NULL;
    zs_status st = zs_alloc_peak_report(f, min_bytes);
    fclose(f);
    if (st != ZS_OK) {
        free(buf);
        return NULL;
    }
    return buf;
}

/* The MiB the report gives the tag line ending in `tags`, or -1. */
static double line_mib(const char *r, const char *tags)
{
    for (const char *l = r; l && *l;) {
        const char *e = strchr(l, '\n');
        size_t n = e ? (size_t)(e - l) : strlen(l), k = strlen(tags);
        if (n > k + 1 && !strncmp(l + n - k, tags, k) && !strncmp(l + n - k - 2, ": ", 2))
            return atof(l);
        l = e ? e + 1 : NULL;
    }
    return -1;
}

static zs_tensor *square(void *ctx, zs_tensor **in)
{
    (void)ctx;
    return zs_mul(in[0], in[0]);
}

static void test_traced(void)
{
    ZT_CHECK(zs_alloc_tracing(), "tracing on under ZS_ALLOC_TRACE=1");
    zs_alloc_trim();
    zs_alloc_reset_peak();
    zs_alloc_tag_push("outer");
    void *a = zs_alloc(3 << 20); /* 3 MiB */
    zs_alloc_tag_push("middle");
    zs_alloc_tag_push("inner");
    void *b = zs_alloc(2 << 20);
    zs_alloc_tag_pop();
    void *gone = zs_alloc(1 << 20);
    zs_free(gone); /* freed before the peak */
    zs_alloc_tag_pop();
    zs_alloc_tag_pop();
    void *c = zs_alloc(5 << 20); /* the peak: a, b, c */
    char *r = report(1 << 20);
    ZT_CHECK(r && line_mib(r, "outer") == 3.0 && line_mib(r, "outer > middle > inner") == 2.0 &&
             line_mib(r, "(untagged)") == 5.0 && line_mib(r, "outer > middle") < 0,
             "the peak's groups: outer 3, outer > middle > inner 2, untagged 5, no freed "
             "block:\n%s", r ? r : "(none)");
    free(r);
    zs_free(c);
    zs_alloc_reset_peak(); /* now: a, b */
    r = report(1 << 20);
    ZT_CHECK(r && line_mib(r, "outer") == 3.0 && line_mib(r, "(untagged)") < 0,
             "after reset_peak: a and b only:\n%s", r ? r : "(none)");
    free(r);
    zs_free(a);
    zs_free(b);
    /* an operator's result, and a backward's gradient, are named */
    zs_alloc_reset_peak();
    zs_tensor *x = zt_rand(ZS_F32, 2, (int64_t[]){512, 1024}, 3);
    zs_set_requires_grad(x, true);
    zs_tensor *y = square(NULL, &x);
    zs_tensor *s = zs_sum(y, 0, NULL, false);
    zs_status st = zs_backward(s, NULL, false);
    r = report(1 << 20);
    ZT_CHECK(st == ZS_OK && r && line_mib(r, "mul") == 2.0 && line_mib(r, "mul > mul") >= 2.0,
             "forward mul 2 MiB, its backward's mul named under the node:\n%s",
             r ? r : "(none)");
    free(r);
    zs_release(s);
    zs_release(y);
    zs_release(x);
    zt_section("peak attribution");
}

int main(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "--traced")) {
        test_traced();
        return zt_done();
    }
    test_classes();
    int rc = zt_done();
    if (rc != 0)
        return rc;
    fflush(stdout);
    setenv("ZS_ALLOC_TRACE", "1", 1);
    execl("/proc/self/exe", argv[0], "--traced", (char *)NULL);
    fprintf(stderr, "FAIL: could not run myself again under ZS_ALLOC_TRACE=1\n");
    return 1;
}
