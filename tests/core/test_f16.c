/*
 * test_f16.c - IEEE half conversions (zs_f32_to_f16, zs_f16_to_f32):
 * edge values (signed zeros, the largest half, overflow to inf, subnormals,
 * ties to even), every one of the 65536 halves decoded against a float64
 * formula and encoded back, and random floats over 48 binades against a
 * float64 round-to-nearest-even reference.
 */
#include <math.h>
#include <string.h>

#include "testutil.h"

/* The half nearest |x| (ties to even) as a double, from its spacing:
 * 2^(e - 10) for binade e >= -14, 2^-24 below; inf from 65520 on. */
static double nearest_half(double x)
{
    double a = fabs(x);
    if (a >= 65520.0)
        return copysign(INFINITY, x);
    int e = a > 0 ? ilogb(a) : -14;
    double q = ldexp(1.0, (e < -14 ? -14 : e) - 10);
    return copysign(nearbyint(a / q) * q, x); /* the default mode: to even */
}

/* A half's value in float64. */
static double half_value(uint16_t h)
{
    int e = (h >> 10) & 31, m = h & 1023;
    double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY)
                                                : ldexp(1024 + m, e - 25);
    return (h & 0x8000) ? -v : v;
}

static void test_edges(void)
{
    static const struct { float x; uint16_t h; } e[] = {
        {0.0f, 0x0000}, {-0.0f, 0x8000}, {1.0f, 0x3c00}, {-2.0f, 0xc000},
        {65504.0f, 0x7bff}, {65519.0f, 0x7bff}, {65520.0f, 0x7c00},
        {1e9f, 0x7c00}, {-1e9f, 0xfc00}, {INFINITY, 0x7c00},
        {0x1p-24f, 0x0001}, {0x1p-25f, 0x0000},       /* tie -> even 0 */
        {0x1.8p-24f, 0x0002},                         /* 1.5 quanta -> 2 */
        {0x1.4p-23f, 0x0002},                         /* 2.5 quanta -> 2 */
        {0x1p-14f, 0x0400}, {0x1.ffcp-15f, 0x0400},  /* 1023.5 quanta -> 1024 */
        {0x1.ff8p-15f, 0x03ff},                       /* largest subnormal */
        {0x1.002p0f, 0x3c00},                         /* 1 + 2^-11: tie -> 1 */
        {0x1.006p0f, 0x3c02},                         /* 1 + 3*2^-11 -> even */
        {0x1.0021p0f, 0x3c01},                        /* just above the tie */
        {1e-30f, 0x0000}, {-1e-30f, 0x8000},
    };
    for (size_t i = 0; i < sizeof e / sizeof e[0]; i++) {
        uint16_t h = zs_f32_to_f16(e[i].x);
        ZT_CHECK(h == e[i].h, "f32_to_f16(%a) = 0x%04x, want 0x%04x", e[i].x, h, e[i].h);
    }
    ZT_CHECK((zs_f32_to_f16(NAN) & 0x7c00) == 0x7c00 && (zs_f32_to_f16(NAN) & 0x3ff) != 0,
             "f32_to_f16(NaN) is a NaN");
    zt_section("edge values");
}

static void test_all_halves(void)
{
    int bad = 0;
    for (uint32_t h = 0; h < 65536 && bad < 5; h++) {
        float f = zs_f16_to_f32((uint16_t)h);
        double want = half_value((uint16_t)h);
        bool ok = isnan(want) ? isnan(f) && (zs_f32_to_f16(f) & 0x7fff) > 0x7c00
                              : (double)f == want && !signbit(f) == !signbit(want) &&
                                    zs_f32_to_f16(f) == h;
        if (!ok) {
            ZT_CHECK(0, "half 0x%04x -> %a (want %a) -> 0x%04x", h, f, want,
                     zs_f32_to_f16(f));
            bad++;
        }
    }
    zt_section("all 65536 halves decode to the float64 formula and encode back");
}

static void test_random(void)
{
    uint64_t s = 7;
    int bad = 0;
    for (int i = 0; i < 200000 && bad < 10; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        float x = ldexpf((float)((double)(s >> 11) / 9007199254740992.0 * 2.0 - 1.0),
                         (int)((s >> 3) % 48) - 30);
        double got = half_value(zs_f32_to_f16(x)), want = nearest_half(x);
        if (got != want) {
            ZT_CHECK(0, "f32_to_f16(%a) = %a, nearest half %a", x, got, want);
            bad++;
        }
    }
    zt_section("200000 random floats round to the nearest half (ties to even)");
}

/* zs_copy_ between f32 and f16 (the casts of --precision fp16): rows
 * through F16C where the CPU has it, strided views element by element;
 * both give zs_f32_to_f16's bits and zs_f16_to_f32's values (ctest runs
 * this again under ZS_CPU_ISA=portable: the scalar rows). */
static void test_copy_rows(void)
{
    enum { R = 7, C = 1003 }; /* odd rows: an 8-lane body and a tail */
    zs_tensor *x = zs_empty(ZS_F32, ZS_SHAPE(R, C)), *h = zs_empty(ZS_F16, ZS_SHAPE(R, C));
    zs_tensor *back = zs_empty(ZS_F32, ZS_SHAPE(R, C));
    float *xs = zs_data(x);
    uint64_t s = 11;
    for (int i = 0; i < R * C; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        xs[i] = ldexpf((float)((double)(s >> 11) / 9007199254740992.0 * 2.0 - 1.0),
                       (int)((s >> 3) % 48) - 30); /* subnormal halves to inf */
    }
    xs[5] = 65519.0f; /* rounds down to the largest half */
    xs[6] = 65520.0f; /* a tie up to inf */
    xs[7] = -INFINITY;
    int bad = 0;
    ZT_CHECK(zs_copy_(h, x) == ZS_OK && zs_copy_(back, h) == ZS_OK, "f32 -> f16 -> f32");
    const uint16_t *hs = zs_data(h);
    const float *bs = zs_data(back);
    for (int i = 0; i < R * C && bad < 5; i++)
        if (hs[i] != zs_f32_to_f16(xs[i]) || memcmp(&bs[i], &(float){zs_f16_to_f32(hs[i])}, 4)) {
            ZT_CHECK(0, "element %d: %a -> %#x -> %a, want %#x -> %a", i, xs[i], hs[i], bs[i],
                     zs_f32_to_f16(xs[i]), zs_f16_to_f32(zs_f32_to_f16(xs[i])));
            bad++;
        }
    /* transposed views: the strided loops */
    zs_tensor *ht = zs_empty(ZS_F16, ZS_SHAPE(C, R)), *bt = zs_empty(ZS_F32, ZS_SHAPE(C, R));
    zs_tensor *xv = zs_transpose(x, 0, 1), *hv = zs_transpose(h, 0, 1);
    ZT_CHECK(zs_copy_(ht, xv) == ZS_OK && zs_copy_(bt, hv) == ZS_OK,
             "strided casts");
    const uint16_t *hts = zs_data(ht);
    const float *bts = zs_data(bt);
    for (int r = 0; r < R && bad < 5; r++)
        for (int c = 0; c < C && bad < 5; c++)
            if (hts[c * R + r] != hs[r * C + c] || bts[c * R + r] != bs[r * C + c]) {
                ZT_CHECK(0, "strided element (%d, %d) differs from the row's", r, c);
                bad++;
            }
    zs_tensor *all[] = {x, h, back, ht, bt, xv, hv};
    for (int i = 0; i < 7; i++)
        zs_release(all[i]);
    zt_section("zs_copy_ f32 <-> f16 rows (7 x 1003) and strided views: the scalar bits");
}

int main(void)
{
    test_edges();
    test_all_halves();
    test_random();
    test_copy_rows();
    return zt_done();
}
