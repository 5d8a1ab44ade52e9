/*
 * infer_gemm.c - bench/infer_gemm: the batch-invariant linear kernels of
 * inference (packed_linear.h f32, int8_linear.h W8A8) and zsk_qmatmul
 * (Q8_0 / Q4_0 / Q4_1) on GPT-2's weight shapes, beside zsk_sgemm.
 *
 * M = 1 (decode, a GEMV) is memory-bound: the weights are read once per
 * call. Each shape is allocated in enough copies to fill >= 256 MB (8x
 * the 32 MB L3) and the calls rotate through them, so every call reads
 * its weights from DRAM as decode does (a whole model does not fit in
 * cache). GB/s = weight bytes in the kernel's format (scales included)
 * / time; "triad" is zs_measure_triad_gbs on the same threads (3 arrays
 * of 64 MB), the best of 10 before the table and one per round of the
 * M = 1 measurements (the reference is the best of all). The triad moves
 * 2 reads + 1 write (plus a write-allocate read it does not count), so a
 * read-only stream may exceed it.
 * The "M=1 set" lines sum bytes and times over the five shapes.
 *
 * M >= 64 (prefill) is compute-bound: GFLOP/s = 2 M N K / time (int8:
 * multiply-adds counted the same way), beside peak
 * (zs_measure_peak_gflops, same threads) and zsk_sgemm (B transposed: W as
 * stored) on the same problem in the same run ("vs sgemm" = sgemm time /
 * kernel time).
 *
 * Timing: best of `reps` samples after a warm-up pass; a sample is one
 * pass over all copies (M = 1) or >= 20 ms of calls (M >= 64). The kinds
 * of a shape take turns, one sample each per round, so that a burst of
 * load from other processes (the machine may be shared) spoils a round of
 * every kind rather than every sample of one.
 *
 * Usage: infer_gemm [--threads N] [--reps N] [--quick]
 *   --quick: M = 1 and M = 64 only, 3 reps
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/int8_linear.h"
#include "kernels/cpu/packed_linear.h"
#include "kernels/cpu/qpacked.h"
#include "kernels/cpu/quant.h"
#include "zs/analyze.h"
#include "zs/zs.h"

#define COLD_BYTES (256.0 * 1e6)
#define MAX_COPIES 512
#define TRIAD_BYTES ((size_t)64 << 20) /* per array */

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef enum kind { F32_PACKED, F32_SGEMM, I8, Q8_0, Q4_0, Q4_1, QT8_0, QT4_0, QT4_1,
                    NKINDS } kind;
static const char *KNAME[NKINDS] = {"f32 packed", "f32 zsk_sgemm", "int8 W8A8",
                                    "q8_0 qmatmul", "q4_0 qmatmul", "q4_1 qmatmul",
                                    "q8_0 tiles", "q4_0 tiles", "q4_1 tiles"};

/* The block format of a quantized kind. */
static zsk_qfmt qfmt(kind k) { return (zsk_qfmt)(k >= QT8_0 ? k - QT8_0 : k - Q8_0); }

typedef struct shape {
    const char *name;
    int64_t N, K;
} shape;

static const shape SHAPES[] = {
    {"qkv", 2304, 768}, {"attn.proj", 768, 768}, {"fc", 3072, 768},
    {"fc.proj", 768, 3072}, {"lm_head", 50304, 768},
};
#define NSHAPES (int)(sizeof SHAPES / sizeof *SHAPES)

/* One kind's weights for one shape, in ncopies copies. */
typedef struct weights {
    kind k;
    int64_t N, K;
    int ncopies;
    double bytes; /* of one copy */
    zsk_packed_f32 packed[MAX_COPIES];
    zsk_qpacked tiles[MAX_COPIES];
    void *raw[MAX_COPIES];    /* f32, int8 or quantized blocks */
    float *scale[MAX_COPIES]; /* int8 row scales */
} weights;

static void die(const char *what)
{
    fprintf(stderr, "infer_gemm: %s: %s\n", what, zs_last_error());
    exit(1);
}

static double weight_bytes(kind k, int64_t N, int64_t K)
{
    switch (k) {
    case F32_PACKED: return 4.0 * (double)((N + 63) / 64 * 64) * (double)K;
    case F32_SGEMM: return 4.0 * (double)N * (double)K;
    case I8: return (double)N * (double)K + 4.0 * (double)N;
    case QT8_0: case QT4_0: case QT4_1: { /* as qpacked.h lays the tiles out */
        int64_t nb = K / ZSK_QBLOCK, qb = k == QT8_0 ? 512 : 256, ns = k == QT4_1 ? 2 : 1;
        return (double)((N + 15) / 16) * (double)((nb * (qb + ns * 32) + 63) / 64 * 64);
    }
    default: return (double)N * (double)(K / ZSK_QBLOCK) * (double)zsk_qblock_bytes(qfmt(k));
    }
}

/* Copies of W [N, K] in kind k: as many as fill COLD_BYTES when cold. */
static weights *make_weights(kind k, const float *W, int64_t N, int64_t K, bool cold)
{
    weights *w = calloc(1, sizeof *w);
    if (!w)
        die("calloc");
    *w = (weights){.k = k, .N = N, .K = K, .bytes = weight_bytes(k, N, K)};
    double nc = cold ? ceil(COLD_BYTES / w->bytes) : 1;
    w->ncopies = nc > MAX_COPIES ? MAX_COPIES : (int)nc;
    size_t nk = (size_t)(N * K);
    for (int c = 0; c < w->ncopies; c++) { /* copy 0 converted, the rest memcpy'd */
        switch (k) {
        case F32_PACKED:
            if (zsk_pack_f32(W, N, K, &w->packed[c]) < 0)
                die("pack");
            break;
        case F32_SGEMM:
            w->raw[c] = malloc(nk * sizeof(float));
            if (!w->raw[c])
                die("malloc");
            memcpy(w->raw[c], W, nk * sizeof(float));
            break;
        case I8:
            w->raw[c] = malloc(nk);
            w->scale[c] = malloc((size_t)N * sizeof(float));
            if (!w->raw[c] || !w->scale[c])
                die("malloc");
            if (c > 0) {
                memcpy(w->raw[c], w->raw[0], nk);
                memcpy(w->scale[c], w->scale[0], (size_t)N * sizeof(float));
            } else if (zsk_quantize_rows_i8(W, N, K, w->raw[c], w->scale[c]) < 0) {
                die("int8 weights");
            }
            break;
        case QT8_0: case QT4_0: case QT4_1:
            if (c == 0) { /* the row blocks, kept in raw[0] for the other copies */
                w->raw[0] = malloc((size_t)(weight_bytes(Q8_0 + qfmt(k), N, K)));
                if (!w->raw[0] || zsk_quantize(qfmt(k), W, N * K, w->raw[0]) < 0)
                    die("quantize");
            }
            if (zsk_qpack(qfmt(k), w->raw[0], N, K, &w->tiles[c]) < 0)
                die("qpack");
            break;
        default:
            w->raw[c] = malloc((size_t)w->bytes);
            if (!w->raw[c])
                die("malloc");
            if (c > 0)
                memcpy(w->raw[c], w->raw[0], (size_t)w->bytes);
            else if (zsk_quantize(qfmt(k), W, N * K, w->raw[c]) < 0)
                die("quantize");
        }
    }
    return w;
}

static void free_weights(weights *w)
{
    for (int c = 0; c < w->ncopies; c++) {
        zsk_packed_free(&w->packed[c]);
        zsk_qpacked_free(&w->tiles[c]);
        free(w->raw[c]);
        free(w->scale[c]);
    }
    free(w);
}

static void call(const weights *w, int c, const float *x, int64_t M, float *y)
{
    zs_status st = ZS_OK;
    switch (w->k) {
    case F32_PACKED:
        st = zsk_packed_linear_f32(&w->packed[c], x, M, w->K, NULL, NULL, 0, ZSK_ACT_NONE,
                                   y, w->N);
        break;
    case F32_SGEMM:
        zsk_sgemm(false, true, M, w->N, w->K, 1.0f, x, w->K, w->raw[c], w->K, 0.0f, y, w->N);
        break;
    case I8:
        st = zsk_i8_linear(w->raw[c], w->scale[c], w->N, w->K, x, M, w->K, NULL, NULL, NULL,
                           0, ZSK_ACT_NONE, y, w->N);
        break;
    case QT8_0: case QT4_0: case QT4_1:
        st = zsk_qpacked_linear(&w->tiles[c], x, M, w->K, NULL, NULL, 0, ZSK_ACT_NONE, y,
                                w->N);
        break;
    default:
        st = zsk_qmatmul(qfmt(w->k), w->raw[c], x, y, M, w->N, w->K);
    }
    if (st < 0)
        die(KNAME[w->k]);
}

/* Best seconds per call over `reps` samples, each one pass over the copies
 * or (one copy) >= 20 ms of calls; warm: one untimed pass first. */
static double time_calls(const weights *w, const float *x, int64_t M, float *y, int reps,
                         bool warm)
{
    if (warm)
        for (int c = 0; c < w->ncopies; c++)
            call(w, c, x, M, y);
    int calls = w->ncopies;
    if (w->ncopies == 1) {
        double t0 = now();
        call(w, 0, x, M, y);
        double one = now() - t0;
        calls = (int)(0.02 / fmax(one, 1e-6)) + 1;
    }
    double best = INFINITY;
    for (int r = 0; r < reps; r++) {
        double t0 = now();
        for (int i = 0; i < calls; i++)
            call(w, i % w->ncopies, x, M, y);
        best = fmin(best, (now() - t0) / calls);
    }
    return best;
}

static float *rand_floats(int64_t n, uint64_t seed)
{
    float *p = malloc((size_t)n * sizeof *p);
    if (!p)
        die("malloc");
    uint64_t s = seed;
    for (int64_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        p[i] = (float)((double)(s >> 11) / 9007199254740992.0 - 0.5);
    }
    return p;
}

typedef struct options {
    int threads, reps;
    bool quick;
} options;

static options parse(int argc, char **argv)
{
    options o = {.threads = 2, .reps = 0};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick"))
            o.quick = true;
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            o.threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            o.reps = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: infer_gemm [--threads N] [--reps N] [--quick]\n");
            exit(2);
        }
    }
    o.threads = o.threads < 1 ? 1 : o.threads;
    if (o.reps < 1)
        o.reps = o.quick ? 3 : 7;
    return o;
}

static void header(void)
{
    printf("%-14s %-10s %11s %5s %9s %7s %7s %8s %6s %8s\n", "kernel", "layer", "N x K",
           "M", "ms", "GB/s", "triad", "GFLOP/s", "peak", "vs sgemm");
}

static void row(kind k, const shape *s, int64_t M, double t, double bytes, double triad,
                double peak, double t_sgemm)
{
    char nk[32];
    snprintf(nk, sizeof nk, "%lldx%lld", (long long)s->N, (long long)s->K);
    double gf = 2.0 * (double)M * (double)s->N * (double)s->K / t / 1e9;
    printf("%-14s %-10s %11s %5lld %9.3f", KNAME[k], s->name, nk, (long long)M, t * 1e3);
    if (M == 1)
        printf(" %7.1f %6.0f%%", bytes / t / 1e9, 100 * bytes / t / 1e9 / triad);
    else
        printf(" %7s %7s", "", "");
    printf(" %8.1f %5.0f%%", gf, 100 * gf / peak);
    if (t_sgemm > 0)
        printf(" %8.2f", t_sgemm / t);
    printf("\n");
    fflush(stdout);
}

/* M = 1: per shape, the copies of every kind, then `reps` rounds of one
 * pass per kind (a burst of load from other processes spoils one round of
 * every kind, not all samples of one); rows printed per kind. set_gbs[i]:
 * the five shapes' bytes / summed best times of kinds[i]. */
static void decode_rows(const options *o, const kind *kinds, int nk, double *triad,
                        double peak, double *set_gbs)
{
    double best[NKINDS][NSHAPES], bytes[NKINDS][NSHAPES];
    header();
    for (int s = 0; s < NSHAPES; s++) {
        const shape *sh = &SHAPES[s];
        float *W = rand_floats(sh->N * sh->K, 42 + (uint64_t)s);
        float *x = rand_floats(sh->K, 7), *y = malloc((size_t)sh->N * sizeof *y);
        weights *w[NKINDS];
        for (int i = 0; i < nk; i++) {
            w[i] = make_weights(kinds[i], W, sh->N, sh->K, true);
            bytes[i][s] = w[i]->bytes;
            best[i][s] = INFINITY;
            for (int c = 0; c < w[i]->ncopies; c++) /* warm-up pass */
                call(w[i], c, x, 1, y);
        }
        free(W);
        for (int r = 0; r < o->reps; r++) {
            *triad = fmax(*triad, zs_measure_triad_gbs(o->threads, TRIAD_BYTES, 1));
            for (int i = 0; i < nk; i++)
                best[i][s] = fmin(best[i][s], time_calls(w[i], x, 1, y, 1, false));
        }
        for (int i = 0; i < nk; i++)
            free_weights(w[i]);
        free(x);
        free(y);
    }
    for (int i = 0; i < nk; i++) {
        double b = 0, t = 0;
        for (int s = 0; s < NSHAPES; s++) {
            row(kinds[i], &SHAPES[s], 1, best[i][s], bytes[i][s], *triad, peak, 0);
            b += bytes[i][s];
            t += best[i][s];
        }
        set_gbs[i] = b / t / 1e9;
        printf("%-14s %-10s %11s %5d %9.3f %7.1f %6.0f%%\n", KNAME[kinds[i]], "M=1 set", "",
               1, t * 1e3, set_gbs[i], 100 * set_gbs[i] / *triad);
    }
}

/* M >= 64: zsk_sgemm and kinds[], taking turns as in decode_rows. */
static void prefill_rows(const options *o, const kind *kinds, int nk, double triad,
                         double peak)
{
    static const int64_t Ms[] = {64, 256, 1024};
    int nM = o->quick ? 1 : 3;
    for (int s = 0; s < NSHAPES; s++) {
        const shape *sh = &SHAPES[s];
        float *W = rand_floats(sh->N * sh->K, 42 + (uint64_t)s);
        weights *w[NKINDS + 1];
        w[0] = make_weights(F32_SGEMM, W, sh->N, sh->K, false);
        for (int i = 0; i < nk; i++)
            w[i + 1] = make_weights(kinds[i], W, sh->N, sh->K, false);
        for (int mi = 0; mi < nM; mi++) {
            int64_t M = Ms[mi];
            if (sh->N > 10000 && M > 64)
                continue; /* lm_head runs on the last position only */
            float *x = rand_floats(M * sh->K, 9), *y = malloc((size_t)(M * sh->N) * 4);
            double best[NKINDS + 1];
            for (int i = 0; i <= nk; i++)
                best[i] = INFINITY;
            for (int r = 0; r < o->reps; r++)
                for (int i = 0; i <= nk; i++)
                    best[i] = fmin(best[i], time_calls(w[i], x, M, y, 1, r == 0));
            row(F32_SGEMM, sh, M, best[0], 0, triad, peak, 0);
            for (int i = 0; i < nk; i++)
                row(kinds[i], sh, M, best[i + 1], 0, triad, peak, best[0]);
            free(x);
            free(y);
        }
        for (int i = 0; i <= nk; i++)
            free_weights(w[i]);
        free(W);
    }
}

int main(int argc, char **argv)
{
    options o = parse(argc, argv);
    zs_set_num_threads(o.threads);
    double triad = zs_measure_triad_gbs(o.threads, TRIAD_BYTES, 10);
    double peak = zs_measure_peak_gflops(o.threads, 0.5);
    printf("infer_gemm: %d thread(s), best of %d; CPU %s, VNNI %s; triad before %.1f GB/s, "
           "peak %.0f GFLOP/s\n", zs_num_threads(), o.reps,
           zs_cpu()->avx512f ? "AVX-512" : "no AVX-512", zsk_quant_has_vnni() ? "yes" : "no",
           triad, peak);
    static const kind dec[] = {F32_PACKED, F32_SGEMM, I8, Q8_0, Q4_0, Q4_1, QT8_0, QT4_0, QT4_1};
    int nd = (int)(sizeof dec / sizeof *dec);
    double set[NKINDS];
    decode_rows(&o, dec, nd, &triad, peak, set); /* prints after measuring */
    printf("(M = 1 fractions: of the best triad, %.1f GB/s, of the one before and one per "
           "round)\n\n", triad);
    static const kind pre[] = {F32_PACKED, I8, Q8_0, QT8_0, QT4_0};
    header();
    prefill_rows(&o, pre, (int)(sizeof pre / sizeof *pre), triad, peak);
    double triad1 = zs_measure_triad_gbs(o.threads, TRIAD_BYTES, 10);
    double peak1 = zs_measure_peak_gflops(o.threads, 0.5);
    printf("\nafter: triad %.1f GB/s, peak %.0f GFLOP/s. M=1 sets against max(triad) = "
           "%.1f GB/s:", triad1, peak1, fmax(triad, triad1));
    for (int i = 0; i < nd; i++)
        printf(" %s %.0f%%%s", KNAME[dec[i]], 100 * set[i] / fmax(triad, triad1),
               i + 1 < nd ? "," : "\n");
    return 0;
}
