/*
 * test_zero.c - ZeRO stage 3's units (src/parallel/zero.c) on a small model,
 * plainly and by ctest under `mpirun -np 2` and `-np 4`.
 *
 * Five parameters tile a flat buffer: p0 (kept, group -1), then units 0, 1
 * and 2 of odd sizes spanning several pages, the last one p4 kept too.
 * Values are known functions of the element index, the same on every rank.
 * Checked: a release keeps this rank's chunks and hands the other pages
 * back (they read as zeros); a fetch restores a unit exactly; a gather
 * pins everything until release; begin/backward/finish leaves in each
 * shard gradient the average over ranks of the per-rank gradient (float64
 * reference; f32 sums of P terms: 1e-6) and drops the units again; and the
 * errors: unknown units, units not contiguous, stage 3 through
 * zs_zero_new.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

static int R, P;

#define NP 5
static const int64_t sizes[NP] = {300, 5003, 4099, 6007, 17};
static const int groups[NP] = {-1, 0, 1, 2, -1};

static float init_value(int64_t i) { return 0.5f + (float)(i % 1013) * 0.001f; }

/* The per-rank input of element i (gradient of loss = sum(w * x)). */
static double input(int r, int64_t i) { return (double)((r + 1) * ((i % 17) + 1)) / 16.0; }

typedef struct model {
    zs_module *m;
    zs_tensor *fp, *p[NP];
    char **names;
    int64_t off[NP], total;
} model;

static void model_init(model *md)
{
    memset(md, 0, sizeof *md);
    md->m = zs_module_new(NULL, NULL);
    for (int i = 0; i < NP; i++) {
        char name[16];
        snprintf(name, sizeof name, "p%d", i);
        zs_module_add_param(md->m, name, zs_empty(ZS_F32, 1, &sizes[i])); /* steals */
    }
    zs_module_flatten(md->m, &md->fp, NULL);
    zs_tensor **ps;
    zs_module_parameters(md->m, &ps, &md->names);
    for (int i = 0; i < NP; i++) {
        md->p[i] = ps[i];
        md->off[i] = ps[i]->offset - md->fp->offset;
    }
    free(ps);
    md->total = zs_numel(md->fp);
    float *d = zs_data(md->fp);
    for (int64_t i = 0; i < md->total; i++)
        d[i] = init_value(i);
}

static void model_free(model *md)
{
    for (int i = 0; i < NP; i++)
        free(md->names[i]);
    free(md->names);
    zs_module_free(md->m);
}

/* Elements of unit u's range [lo, hi) that differ from their value, and
 * those that read zero outside this rank's chunk. */
static void scan(const model *md, int i, int64_t *wrong, int64_t *zeros)
{
    const float *d = zs_data(md->fp);
    *wrong = *zeros = 0;
    for (int64_t k = md->off[i]; k < md->off[i] + sizes[i]; k++) {
        *wrong += d[k] != init_value(k);
        *zeros += d[k] == 0.0f;
    }
}

static void test_units(void)
{
    model md;
    model_init(&md);
    zs_zero *z = zs_zero_new3(zs_comm_world(), NP, md.p, md.fp, groups);
    ZT_CHECK(z != NULL, "zero3: %s", zs_last_error());
    if (!z) {
        model_free(&md);
        return;
    }
    zs_zero_release(z);
    /* every shard (this rank's chunk) keeps its values */
    int ns;
    zs_tensor **sh = zs_zero_shards(z, &ns);
    int64_t bad = 0;
    for (int s = 0; s < ns; s++) {
        const float *d = zs_data(sh[s]);
        int64_t o = sh[s]->offset - md.fp->offset;
        for (int64_t k = 0; k < zs_numel(sh[s]); k++)
            bad += d[k] != init_value(o + k);
    }
    ZT_CHECK(bad == 0, "rank %d's chunks kept through a release (%lld wrong)", R,
             (long long)bad);
    int64_t wrong, zeros;
    scan(&md, 2, &wrong, &zeros); /* unit 1: 4099 floats, 16 KiB */
    if (P > 1)
        ZT_CHECK(zeros >= 1024 * (P - 1) - 2048, "unit 1 dropped: %lld of %lld foreign "
                 "elements read zero", (long long)zeros,
                 (long long)(sizes[2] - sizes[2] / P));
    ZT_CHECK(zs_zero_fetch(z, 1) == ZS_OK, "fetch unit 1");
    scan(&md, 2, &wrong, &zeros);
    ZT_CHECK(wrong == 0, "unit 1 gathered exactly (%lld wrong)", (long long)wrong);
    ZT_CHECK(zs_zero_drop(z, 1) == ZS_OK, "drop unit 1");
    ZT_CHECK(zs_zero_gather(z) == ZS_OK, "gather all");
    int64_t total_wrong = 0;
    for (int i = 0; i < NP; i++) {
        scan(&md, i, &wrong, &zeros);
        total_wrong += wrong;
    }
    zs_zero_drop(z, 2); /* pinned: ignored */
    scan(&md, 3, &wrong, &zeros);
    ZT_CHECK(total_wrong == 0 && wrong == 0, "gather restores every unit and pins it");
    zs_zero_release(z);

    /* a step: loss = sum_i sum(p_i * x_i), units fetched as a model would */
    zs_tensor *x[NP];
    for (int i = 0; i < NP; i++) {
        x[i] = zs_empty(ZS_F32, 1, &sizes[i]);
        float *d = zs_data(x[i]);
        for (int64_t k = 0; k < sizes[i]; k++)
            d[k] = (float)input(R, md.off[i] + k);
    }
    ZT_CHECK(zs_zero_begin(z) == ZS_OK, "begin");
    zs_tensor *loss = NULL;
    for (int i = 0; i < NP; i++) {
        if (groups[i] >= 0)
            zs_zero_fetch(z, groups[i]);
        zs_tensor *pr = zs_mul(md.p[i], x[i]), *s = zs_sum(pr, 0, NULL, false);
        zs_tensor *acc = loss ? zs_add(loss, s) : zs_retain(s);
        zs_release(loss);
        zs_release(pr);
        zs_release(s);
        loss = acc;
        if (groups[i] >= 0)
            zs_zero_drop(z, groups[i]);
    }
    /* backward needs no parameter values here (d loss / d p = x) */
    ZT_CHECK(zs_backward(loss, NULL, false) == ZS_OK, "backward");
    ZT_CHECK(zs_zero_finish(z) == ZS_OK, "finish: %s", zs_last_error());
    double err = 0;
    for (int s = 0; s < ns; s++) {
        const float *g = zs_data(sh[s]->grad);
        int64_t o = sh[s]->offset - md.fp->offset;
        for (int64_t k = 0; k < zs_numel(sh[s]); k++) {
            double want = 0;
            for (int r = 0; r < P; r++)
                want += input(r, o + k);
            err = fmax(err, fabs(g[k] - want / P));
        }
    }
    ZT_CHECK(err <= 1e-6, "shard gradients = average over %d ranks (error %.2e)", P, err);
    scan(&md, 3, &wrong, &zeros); /* unit 2 */
    if (P > 1)
        ZT_CHECK(zeros > 0, "units dropped again after the step");
    zs_zero_memory mem;
    zs_zero_get_memory(z, &mem);
    ZT_CHECK(mem.params < mem.params_peak || P == 1, "chunks %lld < peak %lld bytes",
             (long long)mem.params, (long long)mem.params_peak);
    zs_release(loss);
    for (int i = 0; i < NP; i++)
        zs_release(x[i]);
    /* errors */
    ZT_EXPECT_ERROR(zs_zero_fetch(z, 7) < 0, "no unit 7");
    ZT_EXPECT_ERROR(zs_zero_drop(z, -1) < 0, "no unit -1");
    zs_zero_free(z);
    int split[NP] = {-1, 0, 1, 0, -1};
    ZT_EXPECT_ERROR(zs_zero_new3(zs_comm_world(), NP, md.p, md.fp, split) == NULL,
                    "not contiguous");
    ZT_EXPECT_ERROR(zs_zero_new(zs_comm_world(), 3, 0, NP, md.p, md.fp, NULL) == NULL,
                    "zs_zero_new3");
    ZT_EXPECT_ERROR(zs_zero_new3(zs_comm_world(), NP, md.p, md.fp, NULL) == NULL,
                    "units");
    model_free(&md);
    zt_section("ZeRO-3 units: release keeps chunks and drops pages, fetch/gather "
               "restore exactly, step gradients averaged, errors");
}

int main(int argc, char **argv)
{
    zt_dist_start(&argc, &argv, &R, &P);
    test_units();
    return zt_dist_done();
}
