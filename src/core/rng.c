/*
 * rng.c - counter-based random numbers (Philox-4x32-10).
 *
 * Element i of a random tensor is a pure function of (seed, counter + i/4):
 * each Philox call yields four 32-bit words, so any thread can produce any
 * element and the result never depends on the thread count. The global
 * stream (zs_manual_seed) hands out counter ranges for operators without an
 * explicit seed, such as dropout; its state is saved in checkpoints.
 */
#include <math.h>
#include <pthread.h>

#include "core/internal.h"

void zs_philox(uint64_t key, uint64_t counter, uint32_t out[4])
{
    uint32_t c0 = (uint32_t)counter, c1 = (uint32_t)(counter >> 32), c2 = 0,
             c3 = 0;
    uint32_t k0 = (uint32_t)key, k1 = (uint32_t)(key >> 32);
    for (int r = 0; r < 10; r++) {
        uint64_t p0 = (uint64_t)0xD2511F53u * c0;
        uint64_t p1 = (uint64_t)0xCD9E8D57u * c2;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0;
        uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        c1 = (uint32_t)p1;
        c3 = (uint32_t)p0;
        c0 = n0;
        c2 = n2;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static uint64_t g_seed = 0x5eed, g_offset;

void zs_manual_seed(uint64_t seed)
{
    pthread_mutex_lock(&mu);
    g_seed = seed;
    g_offset = 0;
    pthread_mutex_unlock(&mu);
}

void zs_rng_reserve(uint64_t n, uint64_t *seed, uint64_t *offset)
{
    pthread_mutex_lock(&mu);
    *seed = g_seed;
    *offset = g_offset;
    g_offset += (n + 3) / 4;
    pthread_mutex_unlock(&mu);
}

void zs_rng_get_state(uint64_t *seed, uint64_t *offset)
{
    pthread_mutex_lock(&mu);
    *seed = g_seed;
    *offset = g_offset;
    pthread_mutex_unlock(&mu);
}

void zs_rng_set_state(uint64_t seed, uint64_t offset)
{
    pthread_mutex_lock(&mu);
    g_seed = seed;
    g_offset = offset;
    pthread_mutex_unlock(&mu);
}

/* Uniform in (0, 1): 24 bits keep float exactness, never 0. */
static double u01(uint32_t w) { return ((double)(w >> 8) + 0.5) / 16777216.0; }

typedef struct rand_job {
    zs_tensor *t;
    uint64_t seed;
    double a, b;
    bool normal;
} rand_job;

/* Each group of 4 elements [4g, 4g+4) comes from Philox counter g. */
static void rand_fill(void *ctx, int64_t g0, int64_t g1)
{
    rand_job *j = ctx;
    int64_t n = zs_numel(j->t);
    void *d = zs_data(j->t);
    for (int64_t g = g0; g < g1; g++) {
        uint32_t w[4];
        zs_philox(j->seed, (uint64_t)g, w);
        double v[4];
        if (j->normal) { /* Box-Muller on two pairs */
            for (int k = 0; k < 4; k += 2) {
                double r = sqrt(-2.0 * log(u01(w[k])));
                double th = 6.283185307179586 * u01(w[k + 1]);
                v[k] = j->a + j->b * r * cos(th);
                v[k + 1] = j->a + j->b * r * sin(th);
            }
        } else {
            for (int k = 0; k < 4; k++)
                v[k] = j->a + (j->b - j->a) * u01(w[k]);
        }
        for (int k = 0; k < 4 && 4 * g + k < n; k++)
            zsi_store(j->t->dtype, d, 4 * g + k, v[k]);
    }
}

static zs_tensor *rand_tensor(zs_dtype dt, int ndim, const int64_t *shape,
                              double a, double b, uint64_t seed, bool normal)
{
    if (!zs_dtype_is_float(dt)) {
        zs_set_error("%s: dtype %s is not a float type",
                     normal ? "normal" : "uniform", zs_dtype_name(dt));
        return NULL;
    }
    zs_tensor *t = zsi_new_tensor(dt, ndim, shape);
    if (!t)
        return NULL;
    rand_job j = {t, seed, a, b, normal};
    zs_parallel_for((zs_numel(t) + 3) / 4, 4096, rand_fill, &j);
    return t;
}

zs_tensor *zs_uniform(zs_dtype dt, int ndim, const int64_t *shape, double lo,
                      double hi, uint64_t seed)
{
    return rand_tensor(dt, ndim, shape, lo, hi, seed, false);
}

zs_tensor *zs_normal(zs_dtype dt, int ndim, const int64_t *shape, double mean,
                     double std, uint64_t seed)
{
    return rand_tensor(dt, ndim, shape, mean, std, seed, true);
}
