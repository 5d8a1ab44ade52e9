/*
 * test_onebit.c - the 1-bit compressor and the compressed all-reduce of
 * 1-bit Adam (src/parallel/onebit.c, zs/onebit.h), plainly and by ctest
 * under `mpirun -np 2` and `-np 4`.
 *
 * The compressor against float64 (odd lengths, blocks of 8, 24 and 2048,
 * a partial last block): signs exact (x + err never changes sign when
 * rounded), scales ||c||/sqrt(len) within 1e-6 relative (an f32 rounding
 * of a double), the new error c - (±s) within 1e-6 of |c| + s, the bits in
 * place (element k: bit k % 8 of byte k / 8) and the packet size; error
 * feedback telescopes: the decoded outputs of T calls on a constant x
 * sum to T x - err_T (float64 sum, 1e-5).
 *
 * The all-reduce: every rank's result, worker error and server error
 * equal, to the bit, one process simulating the algorithm for all P ranks
 * over the same inputs (written here from zs/onebit.h, the same f32
 * operations in the same order), over several calls so the error buffers
 * matter; each rank sends the bytes zs_onebit_bytes says, at least 5x
 * fewer than the ring all-reduce of the same buffer. Errors: bad sizes,
 * blocks, dtypes, layouts.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "parallel/onebit.h"
#include "testutil.h"
#include "zs/onebit.h"

static int R, P;

/* Deterministic values in [-mag, mag): an LCG of (seed, i). */
static float val(uint64_t seed, int64_t i, float mag)
{
    uint64_t z = (seed + 1) * 0x9E3779B97F4A7C15ull + (uint64_t)i * 0xBF58476D1CE4E5B9ull;
    z ^= z >> 31;
    z *= 0x94D049BB133111EBull;
    z ^= z >> 29;
    return mag * (float)((double)(z >> 11) / 9007199254740992.0 * 2 - 1);
}

/* Elements of the simulated/world buffers: magnitudes vary by region as
 * layers of a flat model would. */
static float input(int rank, int call, int64_t i)
{
    float mag = (i / 700) % 3 == 0 ? 1.0f : (i / 700) % 3 == 1 ? 1e-3f : 30.0f;
    return val(1000 * (uint64_t)call + (uint64_t)rank, i, mag);
}

static bool bit_at(const uint8_t *signs, int64_t k) { return (signs[k / 8] >> (k % 8)) & 1; }

/* ---- the compressor against float64 ---------------------------------------- */

static void check_compress(int64_t n, int64_t block, uint64_t seed)
{
    float *x = malloc((size_t)n * sizeof *x), *err = malloc((size_t)n * sizeof *err);
    double *c = malloc((size_t)n * sizeof *c);
    int64_t nb = (n + block - 1) / block, bytes = zsi_onebit_packet_bytes(n, block);
    uint8_t *pk = malloc((size_t)bytes);
    for (int64_t i = 0; i < n; i++) {
        x[i] = val(seed, i, 2);
        err[i] = val(seed + 7, i, 0.1f);
        c[i] = (double)x[i] + (double)err[i];
    }
    if (n > 3) {
        x[1] = -0.0f, err[1] = 0; /* -0 counts as positive, as DeepSpeed's sign+1 */
        x[2] = 0.0f, err[2] = 0;
        c[1] = c[2] = 0;
    }
    ZT_CHECK(bytes == 4 * nb + (n + 7) / 8, "packet of %lld in blocks of %lld: %lld bytes",
             (long long)n, (long long)block, (long long)bytes);
    zsi_onebit_compress(x, err, n, block, pk);
    const uint8_t *signs = pk + 4 * nb;
    double worst_s = 0, worst_e = 0;
    int64_t bad_signs = 0;
    for (int64_t b = 0; b < nb; b++) {
        int64_t lo = b * block, hi = lo + block < n ? lo + block : n;
        double ss = 0;
        for (int64_t i = lo; i < hi; i++)
            ss += c[i] * c[i];
        double s = sqrt(ss / (double)(hi - lo));
        float got;
        memcpy(&got, pk + 4 * b, sizeof got);
        worst_s = fmax(worst_s, fabs(got - s) / fmax(s, 1e-30));
        for (int64_t i = lo; i < hi; i++) {
            bool pos = c[i] >= 0;
            bad_signs += bit_at(signs, i) != pos;
            double e = c[i] - (pos ? s : -s);
            worst_e = fmax(worst_e, fabs(err[i] - e) / (fabs(c[i]) + s));
        }
    }
    ZT_CHECK(bad_signs == 0, "n %lld block %lld: %lld signs differ", (long long)n,
             (long long)block, (long long)bad_signs);
    ZT_CHECK(worst_s < 1e-6, "n %lld block %lld: scale off by %.3g", (long long)n,
             (long long)block, worst_s);
    ZT_CHECK(worst_e < 1e-6, "n %lld block %lld: error off by %.3g", (long long)n,
             (long long)block, worst_e);
    /* unused bits of the last byte stay 0 */
    if (n % 8)
        ZT_CHECK((signs[(n - 1) / 8] >> (n % 8)) == 0, "padding bits set");
    /* decode and accumulate use the stored scales exactly */
    float *out = malloc((size_t)n * sizeof *out), *acc = malloc((size_t)n * sizeof *acc);
    zsi_onebit_decode(pk, n, block, out);
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) {
        float s;
        memcpy(&s, pk + 4 * (i / block), sizeof s);
        bad += out[i] != (bit_at(signs, i) ? s : -s);
        acc[i] = 1.0f;
    }
    zsi_onebit_accumulate(pk, n, block, 0.25f, acc);
    for (int64_t i = 0; i < n; i++)
        bad += acc[i] != 1.0f + 0.25f * out[i];
    ZT_CHECK(bad == 0, "n %lld block %lld: %lld decoded values differ", (long long)n,
             (long long)block, (long long)bad);
    free(out);
    free(acc);
    free(x);
    free(err);
    free(c);
    free(pk);
}

/* Error feedback: with c_t = x + e_{t-1}, d_t = c_t - e_t, so the sum of T
 * decodes is T x - e_T (e_0 = 0). */
static void check_feedback(int64_t n, int64_t block)
{
    enum { T = 20 };
    float *x = malloc((size_t)n * sizeof *x), *err = calloc((size_t)n, sizeof *err);
    float *out = malloc((size_t)n * sizeof *out);
    double *sum = calloc((size_t)n, sizeof *sum);
    uint8_t *pk = malloc((size_t)zsi_onebit_packet_bytes(n, block));
    for (int64_t i = 0; i < n; i++)
        x[i] = val(99, i, 1);
    for (int t = 0; t < T; t++) {
        zsi_onebit_compress(x, err, n, block, pk);
        zsi_onebit_decode(pk, n, block, out);
        for (int64_t i = 0; i < n; i++)
            sum[i] += out[i];
    }
    double worst = 0, drift = 0;
    for (int64_t i = 0; i < n; i++) {
        worst = fmax(worst, fabs(sum[i] + err[i] - T * (double)x[i]));
        drift = fmax(drift, fabs(sum[i] / T - x[i]));
    }
    ZT_CHECK(worst < 1e-4, "n %lld: sum of decodes + error - T x = %.3g", (long long)n,
             worst);
    printf("  error feedback over %d calls (n %lld, block %lld): |mean decode - x| <= "
           "%.3g, telescoping residual %.2g\n", T, (long long)n, (long long)block, drift,
           worst);
    free(x);
    free(err);
    free(out);
    free(sum);
    free(pk);
}

static void test_compressor(void)
{
    const int64_t ns[] = {1, 7, 8, 13, 1000, 4099, 70001};
    const int64_t blocks[] = {8, 24, 2048};
    for (size_t a = 0; a < sizeof ns / sizeof *ns; a++)
        for (size_t b = 0; b < sizeof blocks / sizeof *blocks; b++)
            check_compress(ns[a], blocks[b], 17 * a + b);
    check_feedback(1001, 64);
    zt_section("compressor: signs, scales, packing, error update vs float64; error "
               "feedback telescopes");
}

/* ---- the all-reduce against a one-process simulation --------------------- */

#define LO(n, P, k) ((n) * (int64_t)(k) / (P))

/* One compression as zs/onebit.h states it, written independently:
 * returns the decoded values in d and updates err. */
static void sim_compress(const float *x, float *err, int64_t n, int64_t block, float *d)
{
    for (int64_t lo = 0; lo < n; lo += block) {
        int64_t hi = lo + block < n ? lo + block : n;
        double ss = 0;
        for (int64_t i = lo; i < hi; i++) {
            float c = x[i] + err[i];
            ss += (double)c * c;
        }
        float s = (float)sqrt(ss / (double)(hi - lo));
        for (int64_t i = lo; i < hi; i++) {
            float c = x[i] + err[i];
            d[i] = c < 0 ? -s : s;
            err[i] = c - d[i];
        }
    }
}

typedef struct sim {
    int P;
    int64_t n, block;
    float **werr, **serr; /* per rank: n; per server j: its chunk */
} sim;

/* x[i]: rank i's buffer, replaced by the all-reduce's result. */
static void sim_allreduce(sim *s, float **x)
{
    int64_t n = s->n;
    float *d = malloc((size_t)n * s->P * sizeof *d), *acc = malloc((size_t)n * sizeof *acc);
    for (int i = 0; i < s->P; i++) /* workers, chunk by chunk */
        for (int j = 0; j < s->P; j++) {
            int64_t lo = LO(n, s->P, j), len = LO(n, s->P, j + 1) - lo;
            sim_compress(x[i] + lo, s->werr[i] + lo, len, s->block, d + i * n + lo);
        }
    for (int j = 0; j < s->P; j++) { /* servers */
        int64_t lo = LO(n, s->P, j), len = LO(n, s->P, j + 1) - lo;
        float w = 1.0f / (float)s->P;
        for (int64_t k = 0; k < len; k++) {
            acc[k] = 0;
            for (int i = 0; i < s->P; i++) {
                float dv = d[i * n + lo + k], ws = w * fabsf(dv);
                acc[k] += dv < 0 ? -ws : ws;
            }
        }
        float *out = malloc((size_t)(len + 1) * sizeof *out);
        sim_compress(acc, s->serr[j], len, s->block, out);
        for (int i = 0; i < s->P; i++)
            memcpy(x[i] + lo, out, (size_t)len * sizeof *out);
        free(out);
    }
    free(d);
    free(acc);
}

static void check_world(int64_t n, int64_t block)
{
    enum { CALLS = 5 };
    zs_comm *c = zs_comm_world();
    zs_onebit *ob = zs_onebit_new(c, n, block);
    ZT_CHECK(ob != NULL, "onebit_new(%lld, %lld)", (long long)n, (long long)block);
    if (!ob)
        return;
    sim s = {P, n, block ? block : ZS_ONEBIT_BLOCK, malloc(P * sizeof(float *)),
             malloc(P * sizeof(float *))};
    float **xs = malloc(P * sizeof *xs);
    for (int i = 0; i < P; i++) {
        s.werr[i] = calloc((size_t)n, sizeof(float));
        s.serr[i] = calloc((size_t)n + 1, sizeof(float));
        xs[i] = malloc((size_t)n * sizeof(float));
    }
    zs_tensor *x = zs_empty(ZS_F32, 1, &n);
    int64_t diff = 0, ediff = 0;
    for (int call = 0; call < CALLS; call++) {
        float *d = zs_data(x);
        for (int64_t k = 0; k < n; k++)
            d[k] = input(R, call, k);
        for (int i = 0; i < P; i++)
            for (int64_t k = 0; k < n; k++)
                xs[i][k] = input(i, call, k);
        ZT_CHECK(zs_onebit_allreduce(ob, x) == ZS_OK, "call %d", call);
        sim_allreduce(&s, xs);
        for (int64_t k = 0; k < n; k++)
            diff += memcmp(&d[k], &xs[R][k], sizeof(float)) != 0;
    }
    const float *we = zs_onebit_worker_error(ob);
    int64_t len;
    const float *se = zs_onebit_server_error(ob, &len);
    ediff += memcmp(we, s.werr[R], (size_t)n * sizeof(float)) != 0;
    ediff += len != LO(n, P, R + 1) - LO(n, P, R) ||
             memcmp(se, s.serr[R], (size_t)len * sizeof(float)) != 0;
    ZT_CHECK(diff == 0, "n %lld block %lld: %lld results differ from the simulation",
             (long long)n, (long long)block, (long long)diff);
    ZT_CHECK(ediff == 0, "n %lld: error buffers differ from the simulation", (long long)n);
    zs_onebit_stats st;
    zs_onebit_get_stats(ob, &st);
    int64_t want = zs_onebit_bytes(n, block, P, R), ring = zs_onebit_ring_bytes(n, 4, P, R);
    ZT_CHECK(st.calls == CALLS && st.last_bytes_sent == want &&
             st.bytes_sent == CALLS * want, "bytes: %lld calls, last %lld, total %lld; "
             "expected %lld per call", (long long)st.calls, (long long)st.last_bytes_sent,
             (long long)st.bytes_sent, (long long)want);
    if (P > 1 && n >= 1000) /* tiny buffers are mostly scales */
        ZT_CHECK(ring >= 5 * want, "ring %lld bytes vs 1-bit %lld: less than 5x",
                 (long long)ring, (long long)want);
    if (R == 0)
        printf("  n %lld, block %lld, %d ranks: rank 0 sends %lld bytes per call, the "
               "ring all-reduce %lld (%.1fx)\n", (long long)n, (long long)s.block, P,
               (long long)want, (long long)ring, want ? (double)ring / want : 0.0);
    zs_onebit_reset(ob);
    ZT_CHECK(zs_onebit_worker_error(ob)[n - 1] == 0, "reset");
    zs_release(x);
    for (int i = 0; i < P; i++) {
        free(s.werr[i]);
        free(s.serr[i]);
        free(xs[i]);
    }
    free(s.werr);
    free(s.serr);
    free(xs);
    zs_onebit_free(ob);
}

static void test_world(void)
{
    check_world(1, 8);
    check_world(3, 8);     /* fewer elements than 4 ranks: empty chunks */
    check_world(5003, 24);
    check_world(70001, 0); /* the default block */
    zt_section("compressed all-reduce equals the one-process simulation to the bit "
               "(results and both error buffers); bytes as counted");
}

static void test_bytes(void)
{
    /* the ring sends 2 (P-1) n elements over all ranks together */
    for (int p = 2; p <= 5; p++) {
        int64_t n = 10007, sum = 0;
        for (int r = 0; r < p; r++)
            sum += zs_onebit_ring_bytes(n, 4, p, r);
        ZT_CHECK(sum == 4 * 2 * (p - 1) * n, "ring bytes over %d ranks: %lld", p,
                 (long long)sum);
        int64_t ob = zs_onebit_bytes(n, 2048, p, 0);
        double per = 2.0 * (p - 1) / p * n * (1.0 / 8 + 4.0 / 2048);
        ZT_CHECK(fabs((double)ob - per) < 16 * p, "1-bit bytes %lld, about %.0f",
                 (long long)ob, per);
    }
    ZT_CHECK(zs_onebit_bytes(100, 8, 1, 0) == 0 && zs_onebit_ring_bytes(100, 4, 1, 0) == 0,
             "one rank sends nothing");
    zt_section("byte counts: ring 2(P-1)/P, 1-bit about 1/30 of it");
}

static void test_errors(void)
{
    zs_comm *c = zs_comm_world();
    ZT_EXPECT_ERROR(zs_onebit_new(c, 100, 12) == NULL, "multiple of 8");
    ZT_EXPECT_ERROR(zs_onebit_new(c, 100, -8) == NULL, "multiple of 8");
    ZT_EXPECT_ERROR(zs_onebit_new(c, 0, 8) == NULL, "n >= 1");
    ZT_EXPECT_ERROR(zs_onebit_new(NULL, 10, 8) == NULL, "NULL communicator");
    ZT_EXPECT_ERROR(zs_onebit_allreduce(NULL, NULL) != ZS_OK, "NULL compressor");
    zs_onebit *ob = zs_onebit_new(c, 10, 8);
    int64_t n9 = 9, n10 = 10, n20 = 20;
    zs_tensor *a = zs_zeros(ZS_F32, 1, &n9), *b = zs_zeros(ZS_F64, 1, &n10);
    zs_tensor *w = zs_zeros(ZS_F32, 1, &n20), *strided = zs_slice(w, 0, 0, 20, 2);
    /* every rank makes the same mistake, so none waits for another */
    ZT_EXPECT_ERROR(zs_onebit_allreduce(ob, a) != ZS_OK, "expected f32 of 10");
    ZT_EXPECT_ERROR(zs_onebit_allreduce(ob, b) != ZS_OK, "expected f32 of 10");
    ZT_EXPECT_ERROR(zs_onebit_allreduce(ob, strided) != ZS_OK, "contiguous");
    ZT_EXPECT_ERROR(zs_onebit_allreduce(ob, NULL) != ZS_OK, "NULL tensor");
    zs_release(a);
    zs_release(b);
    zs_release(strided);
    zs_release(w);
    zs_onebit_free(ob);
    if (P > 1) { /* with checks on, a rank of another size fails every rank */
        zs_comm_set_checks(c, true);
        int64_t n = R == 0 ? 11 : 10;
        zs_onebit *odd = zs_onebit_new(c, n, 8);
        zs_tensor *x = zs_zeros(ZS_F32, 1, &n);
        ZT_EXPECT_ERROR(zs_onebit_allreduce(odd, x) != ZS_OK, "rank");
        zs_release(x);
        zs_onebit_free(odd);
        zs_comm_set_checks(c, false);
    }
    zt_section("errors: sizes, blocks, dtypes and layouts refused before any message");
}

int main(int argc, char **argv)
{
    zt_dist_start(&argc, &argv, &R, &P);
    test_compressor();
    test_bytes();
    test_world();
    test_errors();
    return zt_dist_done();
}
