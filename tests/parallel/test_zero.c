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
 *
 * Stage 1's gather with one bucket over a parameter of 1,100,003 elements
 * (so each rank's chunk, up to 1.1 M elements, goes in several rounds of
 * the staging buffer) and a small one: every rank writes its shards, the
 * gather gives every rank every element, the staging buffer stays a
 * round's size (the allocator holds about P rounds more, not a bucket).
 *
 * zs_zero_grad_norm at stages 1, 2 and 3 equals the float64 norm of the
 * averaged gradient and scales nothing; zs_zero_clip_grad_norm scales to
 * the bound. zs_zero_new3_module on a tiny GPT (units from its module
 * tree, its block hook installed by the library) gives every rank's shard
 * the gradient of an unsharded copy of the model on the same batch.
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

static void model_init_grads(model *md, zs_tensor **fg)
{
    memset(md, 0, sizeof *md);
    md->m = zs_module_new(NULL, NULL);
    for (int i = 0; i < NP; i++) {
        char name[16];
        snprintf(name, sizeof name, "p%d", i);
        zs_module_add_param(md->m, name, zs_empty(ZS_F32, 1, &sizes[i])); /* steals */
    }
    zs_module_flatten(md->m, &md->fp, fg);
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

static void model_init(model *md) { model_init_grads(md, NULL); }

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

/* Norm of the gradient averaged over the ranks: element i's per-rank
 * gradient is input(r, i) (loss = sum p * x), in float64. */
static double avg_norm(int64_t total)
{
    double sq = 0;
    for (int64_t i = 0; i < total; i++) {
        double g = 0;
        for (int r = 0; r < P; r++)
            g += input(r, i);
        sq += (g / P) * (g / P);
    }
    return sqrt(sq);
}

/* One backward of loss = sum_i sum(p_i * x_i) with this rank's inputs. */
static void backward_inputs(model *md)
{
    zs_tensor *loss = NULL;
    for (int i = 0; i < NP; i++) {
        zs_tensor *x = zs_empty(ZS_F32, 1, &sizes[i]);
        float *d = zs_data(x);
        for (int64_t k = 0; k < sizes[i]; k++)
            d[k] = (float)input(R, md->off[i] + k);
        zs_tensor *pr = zs_mul(md->p[i], x), *s = zs_sum(pr, 0, NULL, false);
        zs_tensor *acc = loss ? zs_add(loss, s) : zs_retain(s);
        zs_release(loss);
        zs_release(pr);
        zs_release(s);
        zs_release(x);
        loss = acc;
    }
    ZT_CHECK(zs_backward(loss, NULL, false) == ZS_OK, "backward");
    zs_release(loss);
}

/* zs_zero_grad_norm and zs_zero_clip_grad_norm at stages 1 and 2. */
static void test_grad_norm(void)
{
    for (int stage = 1; stage <= 2; stage++) {
        model md;
        zs_tensor *fg = NULL;
        model_init_grads(&md, stage == 1 ? &fg : NULL);
        zs_zero *z = zs_zero_new(zs_comm_world(), stage, 8192, NP, md.p, md.fp, fg);
        ZT_CHECK(z != NULL, "stage %d: %s", stage, zs_last_error());
        if (!z) {
            model_free(&md);
            continue;
        }
        ZT_CHECK(zs_zero_begin(z) == ZS_OK, "begin");
        backward_inputs(&md);
        ZT_CHECK(zs_zero_finish(z) == ZS_OK, "finish");
        if (stage == 1) /* stage 1 leaves the averaging to data parallelism */
            ZT_CHECK(zs_comm_allreduce(zs_comm_world(), fg, true, ZS_ALLREDUCE_RING) ==
                     ZS_OK, "average");
        double want = avg_norm(md.total), got = zs_zero_grad_norm(z);
        double again = zs_zero_grad_norm(z);
        ZT_CHECK(fabs(got - want) <= 1e-6 * want && got == again,
                 "stage %d: grad norm %.9g (again %.9g), float64 %.9g: nothing scaled",
                 stage, got, again, want);
        double clipped = zs_zero_clip_grad_norm(z, want / 4);
        double after = zs_zero_grad_norm(z);
        ZT_CHECK(clipped == got && fabs(after - want / 4) <= 1e-5 * want,
                 "stage %d: clip returns the norm %.9g and scales to %.9g (bound %.9g)",
                 stage, clipped, after, want / 4);
        zs_zero_free(z);
        model_free(&md);
    }
    ZT_CHECK(isnan(zs_zero_grad_norm(NULL)), "no ZeRO: NaN");
    zt_section("zs_zero_grad_norm (stages 1, 2) scales nothing; clip scales to the bound");
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
    double want = avg_norm(md.total), got = zs_zero_grad_norm(z);
    ZT_CHECK(fabs(got - want) <= 1e-6 * want, "stage 3 grad norm %.9g, float64 %.9g", got,
             want);
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

/* Random tokens [B, T] below vocab, the same on every rank. */
static zs_tensor *tokens(int64_t b, int64_t t, int64_t vocab, uint64_t seed)
{
    zs_tensor *x = zs_empty(ZS_I64, 2, (int64_t[]){b, t});
    int64_t *d = zs_data(x);
    for (int64_t i = 0; i < b * t; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        d[i] = (int64_t)((seed >> 33) % (uint64_t)vocab);
    }
    return x;
}

static void test_module3(void)
{
    zs_gpt_config gc = {.arch = ZS_GPT2, .vocab = 61};
    zs_gpt_preset("tiny", &gc);
    gc.layers = 3;
    zs_module *ref = zs_gpt_new(&gc, 7), *m = zs_gpt_new(&gc, 7);
    zs_tensor *rfp, *rfg, *fp;
    ZT_CHECK(ref && m && zs_module_flatten(ref, &rfp, &rfg) == ZS_OK &&
             zs_module_flatten(m, &fp, NULL) == ZS_OK, "two copies of a GPT");
    zs_zero *z = zs_zero_new3_module(zs_comm_world(), m, fp);
    ZT_CHECK(z != NULL, "zero3 from the module: %s", zs_last_error());
    if (!z) {
        zs_module_free(ref);
        zs_module_free(m);
        return;
    }
    zs_zero_memory mem;
    zs_zero_get_memory(z, &mem);
    ZT_CHECK(mem.buckets == 3 + 2, "3 block units + 2 kept runs (wte/wpe, ln_f): %lld",
             (long long)mem.buckets);
    zs_zero_release(z);
    zs_tensor *x = tokens(2, 16, gc.vocab, 11), *y = tokens(2, 16, gc.vocab, 12);
    zs_tensor *l = zs_gpt_loss(ref, x, y);
    ZT_CHECK(l && zs_backward(l, NULL, false) == ZS_OK, "reference backward");
    double ref_loss = l ? zs_item(l) : NAN;
    zs_release(l);
    ZT_CHECK(zs_zero_begin(z) == ZS_OK, "begin");
    l = zs_gpt_loss(m, x, y); /* the block hook fetches and drops the units */
    ZT_CHECK(l && zs_backward(l, NULL, false) == ZS_OK, "backward: %s", zs_last_error());
    ZT_CHECK(zs_zero_finish(z) == ZS_OK, "finish: %s", zs_last_error());
    double loss = l ? zs_item(l) : NAN;
    zs_release(l);
    /* same batch on every rank: the average is the reference gradient (sums
     * of P equal f32 values times 1/P, exact for P a power of two) */
    int ns;
    zs_tensor **sh = zs_zero_shards(z, &ns);
    const float *rg = zs_data(rfg);
    double err = 0, scale = 0;
    for (int s = 0; s < ns; s++) {
        const float *g = zs_data(sh[s]->grad);
        int64_t o = sh[s]->offset - fp->offset;
        for (int64_t k = 0; k < zs_numel(sh[s]); k++) {
            err = fmax(err, fabs(g[k] - rg[o + k]));
            scale = fmax(scale, fabs(rg[o + k]));
        }
    }
    ZT_CHECK(loss == ref_loss && err <= 1e-6 * scale, "loss %.9g (reference %.9g), shard "
             "gradients off by %.2e (largest %.2e)", loss, ref_loss, err, scale);
    double sq = 0;
    for (int64_t i = 0; i < zs_numel(rfg); i++)
        sq += (double)rg[i] * rg[i];
    double norm = zs_zero_grad_norm(z);
    ZT_CHECK(fabs(norm - sqrt(sq)) <= 1e-5 * sqrt(sq), "grad norm %.9g, reference %.9g",
             norm, sqrt(sq));
    zs_zero_free(z); /* removes the block hook: m runs on its own again */
    l = zs_gpt_loss(m, x, y);
    ZT_CHECK(l != NULL, "forward after zs_zero_free");
    zs_release(l);
    zs_module *lin = zs_linear_new(4, 4, true, ZS_INIT_DEFAULT, 1);
    zs_tensor *lfp;
    zs_module_flatten(lin, &lfp, NULL);
    ZT_EXPECT_ERROR(zs_zero_new3_module(zs_comm_world(), lin, lfp) == NULL, "takes a GPT");
    zs_module_free(lin);
    zs_release(x);
    zs_release(y);
    zs_module_free(ref);
    zs_module_free(m);
    zt_section("zs_zero_new3_module: a GPT's blocks as units, its hook installed; "
               "shards hold the unsharded gradient");
}

/* Stage 1: zs_zero_gather of one large bucket in rounds. */
static void test_gather_rounds(void)
{
    const int64_t n[2] = {1100003, 7};
    zs_module *m = zs_module_new(NULL, NULL);
    for (int i = 0; i < 2; i++)
        zs_module_add_param(m, i ? "b" : "a", zs_empty(ZS_F32, 1, &n[i]));
    zs_tensor *fp = NULL, *fg = NULL, **ps;
    char **names;
    zs_module_flatten(m, &fp, &fg);
    int np = zs_module_parameters(m, &ps, &names);
    float *d = zs_data(fp);
    for (int64_t i = 0; i < zs_numel(fp); i++)
        d[i] = -1.0f; /* what a shard must overwrite */
    zs_alloc_stats a0, a1;
    zs_alloc_get_stats(&a0);
    zs_zero *z = zs_zero_new(zs_comm_world(), 1, 0, np, ps, fp, fg);
    zs_alloc_get_stats(&a1);
    int k = 0;
    zs_tensor **sh = z ? zs_zero_shards(z, &k) : NULL;
    for (int s = 0; s < k; s++) { /* this rank's chunks: their global index */
        float *v = zs_data(sh[s]);
        int64_t off = sh[s]->offset - fp->offset;
        for (int64_t i = 0; i < zs_numel(sh[s]); i++)
            v[i] = (float)(off + i);
    }
    zs_status st = z ? zs_zero_gather(z) : ZS_ERR_STATE;
    int64_t wrong = 0;
    for (int64_t i = 0; st == ZS_OK && i < zs_numel(fp); i++)
        wrong += d[i] != (float)i;
    ZT_CHECK(z && st == ZS_OK && wrong == 0,
             "stage 1 gather in rounds: %lld of %lld elements wrong", (long long)wrong,
             (long long)zs_numel(fp));
    double extra = (double)(a1.current_bytes - a0.current_bytes);
    ZT_CHECK(extra < (P + 1.5) * 1048576.0, "stage 1 staging: %.0f bytes held (rounds of "
             "1 MiB per rank), not a bucket of %.0f", extra, 4.0 * (double)zs_numel(fp));
    zs_zero_free(z);
    zs_names_free(np, ps, names);
    zs_module_free(m); /* owns fp and fg */
    zt_section("stage 1 gather in rounds");
}

int main(int argc, char **argv)
{
    zt_dist_start(&argc, &argv, &R, &P);
    test_gather_rounds();
    test_grad_norm();
    test_module3();
    test_units();
    return zt_dist_done();
}
