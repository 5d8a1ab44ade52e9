/*
 * test_gemm_sched.c - the packed GEMM driver's results do not depend on
 * how C is cut and shared (gemm.c: row tiles claimed per column band,
 * zsk_gemm_tiles_per_thread; a thread keeping its band's packed B):
 * every descriptor the CPU runs, 1 thread with one tile as the reference,
 * then 2 and 3 threads with 1, 3 and the default number of tiles per
 * thread, must give the same bits, for C (alpha, beta = 0.5 on C's old
 * values, a bias epilogue) and for the bf16 output of an out16 epilogue
 * with no C at all. Batch invariance of the inference engine rests on
 * this (a row's result must not depend on the other rows).
 *
 * Shapes: several K blocks and a column block split (130 x 530 x 1100);
 * wide and short, which the grid splits by columns (2 bands) with two
 * column blocks per band on the 16-bit paths (40 x 2200 x 300); two
 * column blocks of the f32 NC = 2048 in one band (300 x 2100 x 64).
 * Inputs from a fixed LCG (seed 777).
 */
#include <stdlib.h>

#include "kernels/cpu/gemm.h"
#include "testutil.h"

#define SEED 777u

static uint64_t rng_state = SEED;

static float urand(void)
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(rng_state >> 40) / (double)(1ull << 23) - 1.0);
}

typedef struct shape {
    int64_t M, N, K;
    bool ta, tb;
} shape;

/* One run on the current settings: C (f32 result) and o (out16). */
static void run(const zsk_gemm_desc *d, const shape *s, const void *A,
                const void *B, const float *C0, const float *bias, float *C,
                uint16_t *o)
{
    int64_t lda = s->ta ? s->M : s->K, ldb = s->tb ? s->K : s->N;
    memcpy(C, C0, (size_t)(s->M * s->N) * sizeof *C);
    zsk_epilogue ep = {.bias = bias};
    zsk_gemm_run(d, s->ta, s->tb, s->M, s->N, s->K, 0.75f, A, lda, B, ldb,
                 0.5f, C, s->N, &ep);
    zsk_epilogue e16 = {.out16 = o, .ldo = s->N};
    zsk_gemm_run(d, s->ta, s->tb, s->M, s->N, s->K, 1.0f, A, lda, B, ldb,
                 0.0f, NULL, s->N, &e16);
}

static void check_desc(const zsk_gemm_desc *d, const shape *s)
{
    int64_t na = s->M * s->K, nb = s->K * s->N, nc = s->M * s->N;
    bool half = d->type != ZSK_GEMM_F32;
    void *A = malloc((size_t)na * 4), *B = malloc((size_t)nb * 4);
    float *C0 = malloc((size_t)nc * 4), *bias = malloc((size_t)s->N * 4);
    float *C[2] = {malloc((size_t)nc * 4), malloc((size_t)nc * 4)};
    uint16_t *o[2] = {malloc((size_t)nc * 2), malloc((size_t)nc * 2)};
    for (int64_t i = 0; i < na + nb; i++) {
        float v = urand();
        void *p = i < na ? A : B;
        int64_t at = i < na ? i : i - na;
        if (half)
            ((uint16_t *)p)[at] = d->type == ZSK_GEMM_BF16 ? zs_f32_to_bf16(v)
                                                           : zs_f32_to_f16(v);
        else
            ((float *)p)[at] = v;
    }
    for (int64_t i = 0; i < nc; i++)
        C0[i] = urand();
    for (int64_t j = 0; j < s->N; j++)
        bias[j] = urand();
    zs_set_num_threads(1);
    zsk_gemm_tiles_per_thread = 1;
    run(d, s, A, B, C0, bias, C[0], o[0]);
    static const int tiles[] = {1, 3, 0};
    for (int t = 2; t <= 3; t++)
        for (int k = 0; k < 3; k++) {
            zs_set_num_threads(t);
            zsk_gemm_tiles_per_thread = tiles[k];
            run(d, s, A, B, C0, bias, C[1], o[1]);
            int64_t dc = 0, d16 = 0;
            for (int64_t i = 0; i < nc; i++) {
                dc += memcmp(&C[0][i], &C[1][i], sizeof(float)) != 0;
                d16 += o[0][i] != o[1][i];
            }
            ZT_CHECK(dc == 0 && d16 == 0, "%s M %lld N %lld K %lld ta %d tb %d, "
                     "%d threads, %d tiles per thread: %lld of C and %lld of "
                     "out16 differ from 1 thread, 1 tile (seed %u)", d->name,
                     (long long)s->M, (long long)s->N, (long long)s->K, s->ta,
                     s->tb, t, tiles[k], (long long)dc, (long long)d16, SEED);
        }
    zsk_gemm_tiles_per_thread = 0;
    free(A), free(B), free(C0), free(bias);
    for (int i = 0; i < 2; i++)
        free(C[i]), free(o[i]);
}

int main(void)
{
    int threads = zs_num_threads();
    static const shape S[] = {{130, 530, 1100, false, true},
                              {40, 2200, 300, true, false},
                              {300, 2100, 64, false, false}};
    const zsk_gemm_desc *ds[16];
    int nd = zsk_gemm_descs(ds, 16);
    for (int di = 0; di < nd; di++) {
        for (int s = 0; s < 3; s++)
            check_desc(ds[di], &S[s]);
        printf("  %s: 3 shapes x 6 tilings, C and out16\n", ds[di]->name);
    }
    zs_set_num_threads(threads);
    zt_section("packed GEMM: the same bits for every thread count and tiling");
    return zt_done();
}
