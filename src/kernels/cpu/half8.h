/*
 * kernels/cpu/half8.h - 8 lanes of 16-bit floats (bf16, or IEEE halves)
 * on AVX2 + F16C, for the AVX2 kernels that read and write them in
 * registers (the GEMM's packing and epilogue, GeLU's backward, paged
 * attention's K/V rows): loads and stores of the first n (1..8) of a row, exact
 * widening, and rounding as zs_f32_to_bf16 / vcvtps2ph. Inline, compiled
 * for avx2,fma,f16c: call them only from functions with that target, on
 * CPUs that have it (zs_cpu()).
 */
#ifndef ZS_KERNELS_CPU_HALF8_H
#define ZS_KERNELS_CPU_HALF8_H

#include <immintrin.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#define ZSK_HALF8                                                              \
    static inline __attribute__((always_inline, target("avx2,fma,f16c")))

/* The first n halves at p (n >= 8: eight; n <= 0: none), the rest 0;
 * nothing past them is read. */
ZSK_HALF8 __m128i zsk_ld8h(const uint16_t *p, int64_t n)
{
    if (n >= 8)
        return _mm_loadu_si128((const __m128i *)p);
    uint16_t b[8] = {0};
    for (int64_t i = 0; i < n; i++)
        b[i] = p[i];
    return _mm_loadu_si128((const __m128i *)b);
}

/* The first n (1..8) halves of h to p. */
ZSK_HALF8 void zsk_st8h(uint16_t *p, __m128i h, int64_t n)
{
    if (n >= 8) {
        _mm_storeu_si128((__m128i *)p, h);
        return;
    }
    uint16_t b[8];
    _mm_storeu_si128((__m128i *)b, h);
    memcpy(p, b, (size_t)n * sizeof *b);
}

/* 8 halves widened to f32 (exact). */
ZSK_HALF8 __m256 zsk_cvt8h(__m128i h, bool f16)
{
    if (f16)
        return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* v rounded to 8 halves: bf16 as zs_f32_to_bf16 (nearest even; NaN: the
 * top half with the quiet bit set), f16 by vcvtps2ph (nearest even). */
ZSK_HALF8 __m128i zsk_rnd8h(__m256 v, bool f16)
{
    if (f16)
        return _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256i u = _mm256_castps_si256(v), hi = _mm256_srli_epi32(u, 16);
    __m256i odd = _mm256_and_si256(hi, _mm256_set1_epi32(1));
    __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7fff)));
    r = _mm256_srli_epi32(r, 16);
    __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    r = _mm256_blendv_epi8(r, _mm256_or_si256(hi, _mm256_set1_epi32(0x40)), nan);
    return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}

#endif
