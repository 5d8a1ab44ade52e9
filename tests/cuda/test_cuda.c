/*
 * test_cuda.c - the CUDA device and the kernels installed so far
 * (src/ops/cuda.c), against the CPU: the allocator (alloc, free, reuse
 * without a new cudaMalloc in a steady loop, statistics), copies both
 * ways and on the device, memset, streams and events; add/sub/mul/div in
 * f32 and bf16 with broadcasting (bit-identical to the CPU: one rounding
 * of the same float operation), fill_, scale_, axpy_, sgd_update and
 * adam_update (bit-identical: the CUDA file is compiled without FMA
 * contraction, as the CPU kernels are), sum_squares (against float64);
 * an operator without a CUDA kernel is refused with the device named.
 *
 * Without a GPU (or in a build without CUDA) the test says why and exits
 * 77, which ctest reports as skipped.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

static zs_tensor *to_gpu(zs_tensor *t)
{
    zs_tensor *g = zs_to_device(t, ZS_CUDA);
    ZT_CHECK(g != NULL, "to cuda: %s", g ? "" : zs_last_error());
    return g;
}

/* Host copy of a device tensor (a new reference). */
static zs_tensor *to_cpu(zs_tensor *t)
{
    zs_tensor *h = zs_to_device(t, ZS_CPU);
    ZT_CHECK(h != NULL, "to cpu: %s", h ? "" : zs_last_error());
    return h;
}

static bool same_bits(const zs_tensor *a, const zs_tensor *b)
{
    return a && b && zs_nbytes(a) == zs_nbytes(b) &&
           memcmp(zs_data(a), zs_data(b), zs_nbytes(a)) == 0;
}

static void test_device(void)
{
    zt_section("device: copies, memset, streams, events, allocator");
    const int64_t shape[2] = {37, 129};
    zs_tensor *h = zt_rand(ZS_F32, 2, shape, 1);
    zs_tensor *g = to_gpu(h);
    zs_tensor *back = to_cpu(g);
    ZT_CHECK(same_bits(h, back), "host -> cuda -> host changed the bytes");
    zs_tensor *z = zs_zeros_on(ZS_CUDA, ZS_F32, 2, shape);
    zs_tensor *zh = to_cpu(z);
    double worst = 0;
    for (int64_t i = 0; zh && i < zs_numel(zh); i++)
        worst = fmax(worst, fabs(zs_get(zh, i)));
    ZT_CHECK(zh && worst == 0, "zs_zeros_on(cuda) is not zero (max %g)", worst);

    zs_stream *s = zs_stream_new(ZS_CUDA);
    zs_event *e = zs_event_new(ZS_CUDA);
    ZT_CHECK(s && e, "stream/event: %s", zs_last_error());
    zs_tensor *h2 = zs_empty(ZS_F32, 2, shape);
    ZT_CHECK(zs_copy_async(h2, g, s) == ZS_OK && zs_event_record(ZS_CUDA, e, s) == ZS_OK &&
                 zs_event_sync(ZS_CUDA, e) == ZS_OK,
             "async copy: %s", zs_last_error());
    ZT_CHECK(same_bits(h, h2), "async copy to the host changed the bytes");
    zs_event_free(ZS_CUDA, e);
    zs_stream_free(ZS_CUDA, s);

    /* a steady loop of the same sizes allocates once */
    zs_device_stats st0, st1;
    zs_device_get_stats(ZS_CUDA, &st0);
    for (int it = 0; it < 10; it++) {
        zs_tensor *a = zs_empty_on(ZS_CUDA, ZS_F32, 2, shape);
        zs_tensor *b = zs_empty_on(ZS_CUDA, ZS_BF16, 2, shape);
        zs_release(a);
        zs_release(b);
    }
    zs_device_get_stats(ZS_CUDA, &st1);
    ZT_CHECK(st1.n_allocs - st0.n_allocs <= 2 && st1.current_bytes == st0.current_bytes,
             "steady loop: %llu cudaMalloc calls (expected at most 2), live %zu -> %zu",
             (unsigned long long)(st1.n_allocs - st0.n_allocs), st0.current_bytes,
             st1.current_bytes);
    zs_release(h);
    zs_release(g);
    zs_release(back);
    zs_release(z);
    zs_release(zh);
    zs_release(h2);
}

typedef zs_tensor *(*binop)(zs_tensor *, zs_tensor *);

static void check_binary(const char *name, binop f, zs_dtype dt, int an,
                         const int64_t *as, int bn, const int64_t *bs, uint64_t seed)
{
    zs_tensor *a = zt_rand(dt, an, as, seed), *b = zt_rand(dt, bn, bs, seed + 1);
    zs_tensor *ga = to_gpu(a), *gb = to_gpu(b);
    zs_tensor *ref = f(a, b), *go = f(ga, gb);
    ZT_CHECK(go != NULL, "%s on cuda: %s", name, go ? "" : zs_last_error());
    zs_tensor *out = go ? to_cpu(go) : NULL;
    ZT_CHECK(same_bits(ref, out), "%s %s (seed %llu): cuda differs from cpu", name,
             zs_dtype_name(dt), (unsigned long long)seed);
    zs_release(a), zs_release(b), zs_release(ga), zs_release(gb);
    zs_release(ref), zs_release(go), zs_release(out);
}

static void test_binary(void)
{
    zt_section("add, sub, mul, div: f32 and bf16, broadcasting, against the cpu");
    const int64_t as[3] = {3, 17, 129}, bs[2] = {1, 129}, cs[3] = {3, 1, 1};
    struct { const char *n; binop f; } ops[] = {
        {"add", zs_add}, {"sub", zs_sub}, {"mul", zs_mul}, {"div", zs_div}};
    for (int i = 0; i < 4; i++)
        for (int d = 0; d < 2; d++) {
            zs_dtype dt = d ? ZS_BF16 : ZS_F32;
            check_binary(ops[i].n, ops[i].f, dt, 3, as, 3, as, 10 + i);
            check_binary(ops[i].n, ops[i].f, dt, 3, as, 2, bs, 20 + i);
            check_binary(ops[i].n, ops[i].f, dt, 3, cs, 3, as, 30 + i);
        }
}

static void test_inplace_and_optim(void)
{
    zt_section("fill_, scale_, axpy_, adam_update, sgd_update, sum_squares");
    const int64_t n[1] = {100003};
    zs_tensor *p = zt_rand(ZS_F32, 1, n, 3), *g = zt_rand(ZS_F32, 1, n, 4);
    zs_tensor *m = zs_zeros(ZS_F32, 1, n), *v = zs_zeros(ZS_F32, 1, n);
    zs_tensor *gp = to_gpu(p), *gg = to_gpu(g), *gm = to_gpu(m), *gv = to_gpu(v);
    zs_adam_step s = {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8,
                      .weight_decay = 0.1, .adamw = true, .grad_scale = 0.5};
    for (int step = 1; step <= 3; step++) {
        s.step = step;
        ZT_CHECK(zs_adam_update_(p, g, m, v, &s) == ZS_OK &&
                     zs_adam_update_(gp, gg, gm, gv, &s) == ZS_OK,
                 "adam_update: %s", zs_last_error());
    }
    zs_tensor *hp = to_cpu(gp), *hm = to_cpu(gm), *hv = to_cpu(gv);
    ZT_CHECK(same_bits(p, hp) && same_bits(m, hm) && same_bits(v, hv),
             "adam_update on cuda differs from the cpu after 3 steps");

    ZT_CHECK(zs_scale_(gp, 0.25) == ZS_OK && zs_scale_(p, 0.25) == ZS_OK &&
                 zs_axpy_(gp, -2.0, gg) == ZS_OK && zs_axpy_(p, -2.0, g) == ZS_OK,
             "scale_/axpy_: %s", zs_last_error());
    zs_release(hp);
    hp = to_cpu(gp);
    ZT_CHECK(same_bits(p, hp), "scale_ + axpy_ on cuda differ from the cpu");

    zs_tensor *ss = zs_sum_squares(gp, NULL), *hs = ss ? to_cpu(ss) : NULL;
    double ref = 0;
    for (int64_t i = 0; i < n[0]; i++) {
        double x = zs_get(p, i);
        ref += x * x;
    }
    ZT_CHECK(hs && fabs(zs_item(hs) - ref) <= 1e-12 * ref,
             "sum_squares on cuda %.17g, float64 %.17g", hs ? zs_item(hs) : 0.0, ref);

    ZT_CHECK(zs_fill_(gm, 1.5) == ZS_OK, "fill_: %s", zs_last_error());
    zs_release(hm);
    hm = to_cpu(gm);
    ZT_CHECK(hm && zs_get(hm, 0) == 1.5 && zs_get(hm, n[0] - 1) == 1.5, "fill_ on cuda");

    zs_tensor *bad = zs_exp(gp);
    ZT_EXPECT_ERROR(bad == NULL, "cuda");
    zs_release(bad);
    zs_tensor *all[] = {p, g, m, v, gp, gg, gm, gv, hp, hm, hv, ss, hs};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        zs_release(all[i]);
}

int main(void)
{
    if (zs_cuda_enable() != ZS_OK) {
        printf("SKIP: %s\n", zs_last_error());
        return 77;
    }
    char gpu[384];
    zs_cuda_describe(gpu, sizeof gpu);
    printf("gpu: %s\n", gpu);
    test_device();
    test_binary();
    test_inplace_and_optim();
    return zt_done();
}
