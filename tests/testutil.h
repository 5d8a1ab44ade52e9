/*
 * testutil.h - the small test framework every tests/ program uses.
 *
 * ZT_CHECK records a failure with file:line and a message and goes on, so
 * one run reports every broken case; zt_done() prints a summary and returns
 * the exit code. Random inputs come from fixed seeds printed on failure.
 */
#ifndef ZS_TESTUTIL_H
#define ZS_TESTUTIL_H

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "zs/zs.h"

extern int zt_failures;
extern int zt_checks;

#define ZT_CHECK(cond, ...)                                                   \
    do {                                                                      \
        zt_checks++;                                                          \
        if (!(cond)) {                                                        \
            zt_failures++;                                                    \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);              \
            fprintf(stderr, __VA_ARGS__);                                     \
            fprintf(stderr, "  [zs_last_error: %s]\n", zs_last_error());      \
        }                                                                     \
    } while (0)

/* Prints "ok <name>" or the failure count of a section. */
void zt_section(const char *name);
/* Summary line; returns 0 when every check passed. */
int zt_done(void);
/* For tests that run plainly and under mpirun: starts the world (exits 1
 * with the message on failure), sets *rank and *size and prints them.
 * zt_dist_done finalizes and returns zt_done()'s exit code. */
void zt_dist_start(int *argc, char ***argv, int *rank, int *size);
int zt_dist_done(void);

/* Uniform [-1, 1) tensor of dtype dt. */
zs_tensor *zt_rand(zs_dtype dt, int ndim, const int64_t *shape, uint64_t seed);
/* A GPT batch for the graph tests: rows (<= 4) rows of 12 tokens from a
 * vocabulary of 61 as *x and the next 12 as *y, a function of index only.
 * Returns ZS_ERR_NOMEM when a tensor could not be made. */
zs_status zt_token_batch(int64_t index, int rows, zs_tensor **x, zs_tensor **y);
/* Same values as zt_rand but stored as a non-contiguous view (every other
 * element of a twice-as-wide buffer, then transposed back and forth). */
zs_tensor *zt_rand_strided(zs_dtype dt, int ndim, const int64_t *shape,
                           uint64_t seed);
/* Deterministic integers for random shapes: zt_irand_seed(seed), then
 * zt_irand(lo, hi) is uniform in [lo, hi] (a 64-bit LCG; print the seed
 * on failure). */
void zt_irand_seed(uint64_t seed);
int64_t zt_irand(int64_t lo, int64_t hi);
/* True when t is non-NULL and has exactly this shape. */
bool zt_shape_is(const zs_tensor *t, int ndim, const int64_t *shape);
/* Copies t's values (row-major) into a new malloc'd double array. */
double *zt_values(const zs_tensor *t);
/* max |t - ref| / max(1, |ref|) over all elements; shape must match n. */
double zt_max_err(const zs_tensor *t, const double *ref, int64_t n);
/* Checks an error: ptr NULL (or st < 0) and the message contains `needle`. */
void zt_expect_error_(const char *file, int line, bool failed,
                      const char *needle);
#define ZT_EXPECT_ERROR(failed, needle)                                       \
    zt_expect_error_(__FILE__, __LINE__, (failed), (needle))

/* Runs zs_gradcheck (eps 1e-6, atol 1e-6, rtol 1e-5) and records a check. */
void zt_gradcheck_(const char *file, int line, const char *name, zs_grad_fn fn,
                   void *ctx, int n, zs_tensor **inputs);
#define ZT_GRADCHECK(name, fn, ctx, n, inputs)                                \
    zt_gradcheck_(__FILE__, __LINE__, (name), (fn), (ctx), (n), (inputs))

/* Leak check for a test body: tensors and nodes alive at the end. */
int64_t zt_live_bytes(void);
/* A 2-layer, 4-head, width-64 GPT of the given vocabulary and context
 * (init seed), with its biases and norms set to 0.2 x zt_rand(bias_seed + i)
 * so that every parameter matters (the engine tests). */
zs_module *zt_tiny_gpt(zs_gpt_arch arch, int64_t vocab, int64_t ctx, uint64_t seed,
                       uint64_t bias_seed);

#endif
