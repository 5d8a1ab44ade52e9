/*
 * testutil.c - see testutil.h.
 */
#include "testutil.h"

#include <stdlib.h>

int zt_failures;
int zt_checks;
static int section_failures;

void zt_section(const char *name)
{
    int f = zt_failures - section_failures;
    printf("%s %s\n", f ? "FAILED" : "ok", name);
    fflush(stdout);
    section_failures = zt_failures;
}

int zt_done(void)
{
    printf("%d checks, %d failures\n", zt_checks, zt_failures);
    return zt_failures ? 1 : 0;
}

void zt_dist_start(int *argc, char ***argv, int *rank, int *size)
{
    if (zs_dist_init(argc, argv) != ZS_OK) {
        fprintf(stderr, "%s\n", zs_last_error());
        exit(1);
    }
    *rank = zs_comm_rank(zs_comm_world());
    *size = zs_comm_size(zs_comm_world());
    printf("rank %d of %d (%s)\n", *rank, *size,
           zs_dist_is_mpi() ? "MPI" : "single process");
}

int zt_dist_done(void)
{
    int rc = zt_done();
    zs_dist_finalize();
    return rc;
}

zs_tensor *zt_rand(zs_dtype dt, int ndim, const int64_t *shape, uint64_t seed)
{
    return zs_uniform(dt, ndim, shape, -1.0, 1.0, seed);
}

zs_tensor *zt_rand_strided(zs_dtype dt, int ndim, const int64_t *shape,
                           uint64_t seed)
{
    zs_tensor *src = zt_rand(dt, ndim, shape, seed);
    if (ndim == 0)
        return src;
    /* Buffer [.., 2*last] transposed: a view with non-unit strides. */
    int64_t wide[ZS_MAX_DIMS];
    memcpy(wide, shape, (size_t)ndim * sizeof *wide);
    wide[ndim - 1] *= 2;
    zs_tensor *buf = zs_zeros(dt, ndim, wide);
    zs_tensor *view = zs_slice(buf, ndim - 1, 0, wide[ndim - 1], 2);
    zs_copy_(view, src);
    zs_release(buf);
    zs_release(src);
    return view;
}

double *zt_values(const zs_tensor *t)
{
    int64_t n = zs_numel(t);
    double *v = malloc((size_t)(n ? n : 1) * sizeof *v);
    for (int64_t i = 0; i < n; i++)
        v[i] = zs_get(t, i);
    return v;
}

double zt_max_err(const zs_tensor *t, const double *ref, int64_t n)
{
    if (!t || zs_numel(t) != n)
        return INFINITY;
    double worst = 0;
    for (int64_t i = 0; i < n; i++) {
        double a = zs_get(t, i), e = fabs(a - ref[i]) / fmax(1.0, fabs(ref[i]));
        if (isnan(a) != isnan(ref[i]))
            return INFINITY;
        if (e > worst)
            worst = e;
    }
    return worst;
}

void zt_expect_error_(const char *file, int line, bool failed,
                      const char *needle)
{
    zt_checks++;
    const char *msg = zs_last_error();
    if (!failed || !strstr(msg, needle)) {
        zt_failures++;
        fprintf(stderr, "FAIL %s:%d: expected an error containing '%s', got "
                "%s ('%s')\n", file, line, needle,
                failed ? "an error" : "success", msg);
    }
    zs_clear_error();
}

void zt_gradcheck_(const char *file, int line, const char *name, zs_grad_fn fn,
                   void *ctx, int n, zs_tensor **inputs)
{
    zs_gradcheck_result r;
    zs_status st = zs_gradcheck(fn, ctx, n, inputs, 1e-6, 1e-6, 1e-5, &r);
    zt_checks++;
    if (st != ZS_OK || !r.ok) {
        zt_failures++;
        fprintf(stderr, "FAIL %s:%d: gradcheck %s: status %d, max abs err "
                "%.3g, max rel err %.3g (input %d, element %lld) [%s]\n", file,
                line, name, (int)st, r.max_abs_err, r.max_rel_err,
                r.worst_input, (long long)r.worst_index, zs_last_error());
    }
    for (int i = 0; i < n; i++)
        zs_zero_grad(inputs[i], true);
}

int64_t zt_live_bytes(void)
{
    zs_alloc_stats st;
    zs_alloc_get_stats(&st);
    return (int64_t)st.current_bytes;
}

static uint64_t irand_state;

void zt_irand_seed(uint64_t seed) { irand_state = seed; }

int64_t zt_irand(int64_t lo, int64_t hi)
{
    irand_state = irand_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return lo + (int64_t)((irand_state >> 33) % (uint64_t)(hi - lo + 1));
}

bool zt_shape_is(const zs_tensor *t, int ndim, const int64_t *shape)
{
    if (!t || t->ndim != ndim)
        return false;
    for (int d = 0; d < ndim; d++)
        if (t->shape[d] != shape[d])
            return false;
    return true;
}

zs_module *zt_tiny_gpt(zs_gpt_arch arch, int64_t vocab, int64_t ctx, uint64_t seed,
                       uint64_t bias_seed)
{
    zs_gpt_config c = {.arch = arch, .vocab = vocab, .ctx = ctx, .layers = 2,
                       .heads = 4, .width = 64};
    zs_module *m = zs_gpt_new(&c, seed);
    zs_tensor **p;
    char **names;
    int n = m ? zs_module_parameters(m, &p, &names) : 0;
    for (int i = 0; i < n; i++)
        if (strstr(names[i], "bias") || strstr(names[i], "ln")) {
            zs_tensor *r = zt_rand(ZS_F32, p[i]->ndim, p[i]->shape, bias_seed + (uint64_t)i);
            zs_tensor *s = zs_mul_scalar(r, 0.2);
            zs_copy_(p[i], s);
            zs_release(r);
            zs_release(s);
        }
    if (m)
        zs_names_free(n, p, names);
    return m;
}

zs_status zt_token_batch(int64_t index, int rows, zs_tensor **x, zs_tensor **y)
{
    int64_t ids[4 * 13];
    rows = rows < 1 ? 1 : rows > 4 ? 4 : rows;
    for (int r = 0; r < rows; r++)
        for (int t = 0; t < 13; t++)
            ids[r * 13 + t] = (3 * index + 5 * r + 7 * t + r * t) % 61;
    zs_tensor *all = zs_from_data(ZS_I64, ZS_SHAPE(rows, 13), ids);
    *x = zs_contiguous(zs_narrow(all, 1, 0, 12));
    *y = zs_contiguous(zs_narrow(all, 1, 1, 12));
    zs_release(all);
    return *x && *y ? ZS_OK : ZS_ERR_NOMEM;
}
