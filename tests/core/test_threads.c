/*
 * test_threads.c - several user threads using the library at once, each on
 * its own tensors and models (the contract in zs/core.h, "Threads").
 *
 * A job trains two models of its own for STEPS steps: a 2-layer MLP
 * (linear, tanh-GeLU, layer norm, linear; softmax cross-entropy plus the
 * mean square of the softmax) with Adam on its parameter list, and a tiny
 * GPT (zs_gpt_new, flattened) with gradient clipping and AdamW on the flat
 * buffers. Every job also retains, views and releases one shared read-only
 * input tensor in a loop, and even jobs train their MLP on that shared
 * input. Each job is first run alone on the main thread; then NTHREADS
 * threads run the jobs at once (ROUNDS times, started from a barrier), and
 * each thread's losses, last gradients and final parameters must be
 * bit-identical to its job run alone (the pool serves one call at a time:
 * the other threads run their kernels inline, which must not change a
 * bit). A second threaded run has the profiler on: each
 * operator's calls, FLOPs and bytes must equal those of the jobs run one
 * after the other (no lost counter updates). Last, threads calling
 * zs_parallel_for directly (and nested) must each see every index of their
 * own range exactly once.
 *
 * scripts/test.sh --tsan runs this test under ThreadSanitizer. Checks run
 * on the main thread only (the test framework's counters are not atomic).
 */
#include <pthread.h>
#include <stdlib.h>

#include "core/internal.h"
#include "testutil.h"

enum {
    NTHREADS = 4,
    STEPS = 3,
    /* Sizes large enough that GEMMs, pointwise operators and layer norm
     * split over the pool (PAR_MIN_MACS, ZSK_GRAIN), so threads contend
     * for it, small enough for ThreadSanitizer. */
    N = 512, IN = 64, HID = 128, CLS = 10, /* MLP: x [N, IN] -> [N, CLS] */
    GB = 4, GT = 16,                       /* GPT batch and sequence (ctx) */
    SHARE_LOOPS = 200,
    ROUNDS = 3,                            /* threaded runs compared */
};

/* What one job produced; compared bit for bit. */
typedef struct result {
    double mlp_loss[STEPS], gpt_loss[STEPS];
    /* last step's MLP gradients, final MLP parameters, last step's GPT
     * flat gradients, final GPT flat parameters */
    float *vals;
    int64_t nvals;
    bool ok;
    char err[256];
} result;

typedef struct job {
    int id;
    zs_tensor *shared; /* read-only input, borrowed (the main thread's) */
    pthread_barrier_t *start; /* threads wait there, to start together */
    result r;
} job;

static bool append(result *r, const zs_tensor *t)
{
    int64_t n = zs_numel(t);
    float *v = realloc(r->vals, (size_t)(r->nvals + n) * sizeof *v);
    if (!v)
        return false;
    r->vals = v;
    if (zs_copy_to_buffer(t, v + r->nvals, (size_t)n * sizeof *v) != ZS_OK)
        return false;
    r->nvals += n;
    return true;
}

static zs_tensor *labels(int64_t n, int64_t classes, uint64_t seed)
{
    zs_tensor *t = zs_empty(ZS_I64, 1, &n);
    if (!t)
        return NULL;
    int64_t *d = zs_data(t);
    for (int64_t i = 0; i < n; i++) {
        uint32_t w[4];
        zs_philox(seed, (uint64_t)i, w);
        d[i] = w[0] % (uint32_t)classes;
    }
    return t;
}

/* Many references to one tensor from every thread at once: retain,
 * views (which retain its storage), release. */
static bool share_loop(zs_tensor *s)
{
    for (int i = 0; i < SHARE_LOOPS; i++) {
        zs_tensor *a = zs_retain(s);
        zs_tensor *v = zs_narrow(a, 0, i % N, 1);
        zs_tensor *w = zs_reshape(v, 1, (int64_t[]){IN});
        bool ok = v && w && zs_numel(w) == IN;
        zs_release(w);
        zs_release(v);
        zs_release(a);
        if (!ok)
            return false;
    }
    return true;
}

/* loss = cross_entropy(logits, y) + mean(softmax(logits)^2) */
static zs_tensor *mlp_loss(zs_module *m, zs_tensor *x, zs_tensor *y)
{
    zs_tensor *logits = zs_module_forward(m, x);
    zs_tensor *p = zs_softmax(logits, -1);
    zs_tensor *ce = zs_cross_entropy(logits, y, -1);
    zs_tensor *sq = zs_mean(zs_mul(p, p), 0, NULL, false);
    return zs_add(ce, sq);
}

static zs_status run_mlp(job *j)
{
    result *r = &j->r;
    uint64_t seed = 1000 + (uint64_t)j->id;
    zs_module *mods[] = {
        zs_linear_new(IN, HID, true, ZS_INIT_DEFAULT, seed),
        zs_activation_new(ZS_ACT_GELU_TANH),
        zs_layernorm_new(HID, 1e-5),
        zs_linear_new(HID, CLS, true, ZS_INIT_DEFAULT, seed + 7),
    };
    zs_module *m = zs_sequential_new(4, mods);
    zs_tensor *own = zt_rand(ZS_F32, 2, (int64_t[]){N, IN}, seed + 11);
    zs_tensor *x = j->id % 2 == 0 ? j->shared : own;
    zs_tensor *y = labels(N, CLS, seed + 13);
    zs_tensor **ps = NULL;
    char **names = NULL;
    int np = m ? zs_module_parameters(m, &ps, &names) : -1;
    zs_optim_config oc = {ZS_ADAM, 1e-2, 0, false, 0, 0.9, 0.999, 1e-8};
    zs_optim *o = np > 0 ? zs_optim_new(&oc, np, ps) : NULL;
    zs_status st = o && own && y ? ZS_OK : ZS_ERR_ARG;
    for (int s = 0; s < STEPS && st == ZS_OK; s++) {
        zs_scope_push();
        zs_module_zero_grad(m);
        zs_tensor *l = mlp_loss(m, x, y);
        st = l ? zs_backward(l, NULL, false) : ZS_ERR_ARG;
        if (st == ZS_OK) {
            r->mlp_loss[s] = zs_item(l);
            if (s == STEPS - 1)
                for (int i = 0; i < np && st == ZS_OK; i++)
                    st = ps[i]->grad && append(r, ps[i]->grad) ? ZS_OK : ZS_ERR_ARG;
            if (st == ZS_OK)
                st = zs_optim_step(o, 1e-2);
        }
        zs_scope_pop();
    }
    for (int i = 0; i < np && st == ZS_OK; i++)
        st = append(r, ps[i]) ? ZS_OK : ZS_ERR_ARG;
    zs_optim_free(o);
    if (np >= 0)
        zs_names_free(np, ps, names);
    zs_release(own);
    zs_release(y);
    zs_module_free(m);
    return st;
}

static zs_tensor *tokens(int64_t V, uint64_t seed)
{
    zs_tensor *t = zs_empty(ZS_I64, 2, (int64_t[]){GB, GT});
    if (!t)
        return NULL;
    int64_t *d = zs_data(t);
    for (int64_t i = 0; i < GB * GT; i++) {
        uint32_t w[4];
        zs_philox(seed, (uint64_t)i, w);
        d[i] = w[0] % (uint32_t)V;
    }
    return t;
}

static zs_status run_gpt(job *j)
{
    result *r = &j->r;
    uint64_t seed = 2000 + (uint64_t)j->id;
    zs_gpt_config gc = {ZS_GPT2, 64, GT, 2, 4, 32};
    zs_module *m = zs_gpt_new(&gc, seed);
    zs_tensor *fp = NULL, *fg = NULL;
    zs_status st = m ? zs_module_flatten(m, &fp, &fg) : ZS_ERR_ARG;
    zs_optim *o = NULL;
    if (st == ZS_OK) {
        fp->grad = zs_retain(fg);
        zs_optim_config oc = {ZS_ADAMW, 1e-3, 0, false, 0.1, 0.9, 0.95, 1e-8};
        o = zs_optim_new(&oc, 1, &fp);
        st = o ? ZS_OK : ZS_ERR_ARG;
    }
    for (int s = 0; s < STEPS && st == ZS_OK; s++) {
        zs_scope_push();
        zs_tensor *x = tokens(gc.vocab, seed * 31 + (uint64_t)s);
        zs_tensor *y = tokens(gc.vocab, seed * 37 + (uint64_t)s);
        zs_tensor *l = x && y ? zs_gpt_loss(m, x, y) : NULL;
        st = l ? zs_backward(l, NULL, false) : ZS_ERR_ARG;
        if (st == ZS_OK) {
            r->gpt_loss[s] = zs_item(l);
            zs_clip_grad_norm(1, &fp, 1.0);
            if (s == STEPS - 1 && !append(r, fg))
                st = ZS_ERR_ARG;
            if (st == ZS_OK)
                st = zs_optim_step(o, 1e-3);
            if (st == ZS_OK)
                st = zs_fill_(fg, 0.0);
        }
        zs_scope_pop();
    }
    if (st == ZS_OK && !append(r, fp))
        st = ZS_ERR_ARG;
    zs_optim_free(o);
    zs_module_free(m);
    return st;
}

static void *run_job(void *arg)
{
    job *j = arg;
    result *r = &j->r;
    *r = (result){0};
    if (j->start)
        pthread_barrier_wait(j->start);
    zs_clear_error();
    zs_status st = share_loop(j->shared) ? ZS_OK : ZS_ERR_ARG;
    if (st == ZS_OK)
        st = run_mlp(j);
    if (st == ZS_OK)
        st = run_gpt(j);
    if (st == ZS_OK && !share_loop(j->shared))
        st = ZS_ERR_ARG;
    r->ok = st == ZS_OK && zs_scope_depth() == 0;
    if (!r->ok)
        snprintf(r->err, sizeof r->err, "status %d: %s", (int)st, zs_last_error());
    return NULL;
}

static void result_free(result *r)
{
    free(r->vals);
    r->vals = NULL;
}

/* Runs the NTHREADS jobs on NTHREADS threads at once (from a barrier).
 * false when a thread could not be started (then none ran). */
static bool run_threads(job *jobs)
{
    pthread_t th[NTHREADS];
    pthread_barrier_t start;
    if (pthread_barrier_init(&start, NULL, NTHREADS) != 0)
        return false;
    for (int k = 0; k < NTHREADS; k++)
        jobs[k].start = &start;
    int started = 0;
    for (; started < NTHREADS; started++)
        if (pthread_create(&th[started], NULL, run_job, &jobs[started]) != 0)
            abort(); /* the others wait at the barrier forever */
    for (int i = 0; i < started; i++)
        pthread_join(th[i], NULL);
    pthread_barrier_destroy(&start);
    for (int k = 0; k < NTHREADS; k++)
        jobs[k].start = NULL;
    return true;
}

static bool same(const result *a, const result *b)
{
    return a->ok && b->ok && a->nvals == b->nvals &&
           !memcmp(a->mlp_loss, b->mlp_loss, sizeof a->mlp_loss) &&
           !memcmp(a->gpt_loss, b->gpt_loss, sizeof a->gpt_loss) &&
           !memcmp(a->vals, b->vals, (size_t)a->nvals * sizeof *a->vals);
}

static void compare(const char *what, job *ref, job *got)
{
    for (int k = 0; k < NTHREADS; k++) {
        ZT_CHECK(got[k].r.ok, "%s: thread %d failed: %s", what, k, got[k].r.err);
        ZT_CHECK(same(&ref[k].r, &got[k].r), "%s: thread %d: losses mlp %.9g gpt "
                 "%.9g, %lld values; alone: mlp %.9g gpt %.9g, %lld values "
                 "(not bit-identical)", what, k, got[k].r.mlp_loss[STEPS - 1],
                 got[k].r.gpt_loss[STEPS - 1], (long long)got[k].r.nvals,
                 ref[k].r.mlp_loss[STEPS - 1], ref[k].r.gpt_loss[STEPS - 1],
                 (long long)ref[k].r.nvals);
    }
}

static void test_training(zs_tensor *shared)
{
    job ref[NTHREADS], got[NTHREADS];
    for (int k = 0; k < NTHREADS; k++) {
        ref[k] = (job){.id = k, .shared = shared};
        run_job(&ref[k]);
        ZT_CHECK(ref[k].r.ok, "job %d alone: %s", k, ref[k].r.err);
        got[k] = (job){.id = k, .shared = shared};
    }
    ZT_CHECK(zs_autograd_live_nodes() == 0, "alone: %lld nodes left",
             (long long)zs_autograd_live_nodes());
    for (int round = 0; round < ROUNDS; round++) {
        char what[32];
        snprintf(what, sizeof what, "threads, round %d", round);
        ZT_CHECK(run_threads(got), "started %d threads", NTHREADS);
        compare(what, ref, got);
        for (int k = 0; k < NTHREADS; k++)
            result_free(&got[k].r);
    }
    ZT_CHECK(zs_autograd_live_nodes() == 0, "threads: %lld nodes left",
             (long long)zs_autograd_live_nodes());
    ZT_CHECK(zsi_ref_get(&shared->refcount) == 1 &&
             zsi_ref_get(&shared->storage->refcount) == 1,
             "the shared input is back to one reference (tensor %d, storage %d)",
             zsi_ref_get(&shared->refcount), zsi_ref_get(&shared->storage->refcount));
    printf("%d threads x (MLP %d->%d->%d + tiny GPT, %d steps), %d rounds: "
           "losses, gradients and parameters bit-identical to each job alone\n",
           NTHREADS, IN, HID, CLS, STEPS, ROUNDS);
    zt_section("training on threads");

    /* Profiler on: the counters of the threaded run equal the sum over
     * the jobs run one after the other. */
    zs_op_stat seq[128], par[128];
    zs_profile_reset();
    zs_profile_enable(true);
    for (int k = 0; k < NTHREADS; k++)
        run_job(&got[k]);
    int nseq = zs_profile_stats(seq, 128);
    zs_profile_reset();
    for (int k = 0; k < NTHREADS; k++)
        result_free(&got[k].r);
    ZT_CHECK(run_threads(got), "started %d threads", NTHREADS);
    zs_profile_enable(false);
    int npar = zs_profile_stats(par, 128);
    compare("threads, profiling", ref, got);
    ZT_CHECK(nseq == npar && nseq > 10, "%d operators counted in turn, %d on "
             "threads", nseq, npar);
    uint64_t calls = 0;
    for (int i = 0; i < nseq; i++) {
        const zs_op_stat *p = NULL;
        for (int k = 0; k < npar; k++)
            if (!strcmp(par[k].name, seq[i].name))
                p = &par[k];
        calls += seq[i].calls;
        ZT_CHECK(p && p->calls == seq[i].calls &&
                 fabs(p->flops - seq[i].flops) <= 1e-12 * seq[i].flops &&
                 fabs(p->bytes - seq[i].bytes) <= 1e-12 * seq[i].bytes,
                 "%s: %llu calls, %.17g FLOPs, %.17g bytes in turn; on threads "
                 "%llu, %.17g, %.17g", seq[i].name, (unsigned long long)seq[i].calls,
                 seq[i].flops, seq[i].bytes, p ? (unsigned long long)p->calls : 0ULL,
                 p ? p->flops : 0, p ? p->bytes : 0);
    }
    zs_profile_reset();
    printf("profiler on: %d operators, %llu calls counted on %d threads, as "
           "in turn\n", nseq, (unsigned long long)calls, NTHREADS);
    for (int k = 0; k < NTHREADS; k++) {
        result_free(&ref[k].r);
        result_free(&got[k].r);
    }
    zt_section("profiler counters on threads");
}

/* ---- zs_parallel_for from several threads -------------------------------- */

enum { PF_N = 50000, PF_CALLS = 100 };

typedef struct pf_job {
    int id;
    int *hits; /* [PF_N] */
    bool nested, ok;
} pf_job;

static void pf_inner(void *ctx, int64_t b, int64_t e)
{
    int *hits = ctx;
    for (int64_t i = b; i < e; i++)
        hits[i]++;
}

typedef struct pf_ctx {
    pf_job *j;
} pf_ctx;

/* Outer body: counts its range; nested jobs count it through an inner
 * zs_parallel_for (which runs inline inside a pool task). */
static void pf_outer(void *ctx, int64_t b, int64_t e)
{
    pf_job *j = ((pf_ctx *)ctx)->j;
    if (j->nested)
        zs_parallel_for(e - b, 64, pf_inner, j->hits + b);
    else
        pf_inner(j->hits, b, e);
}

static void *pf_run(void *arg)
{
    pf_job *j = arg;
    pf_ctx c = {j};
    for (int k = 0; k < PF_CALLS; k++)
        zs_parallel_for(PF_N, 1000 + 97 * j->id, pf_outer, &c);
    j->ok = true;
    for (int64_t i = 0; i < PF_N; i++)
        j->ok = j->ok && j->hits[i] == PF_CALLS;
    return NULL;
}

static void test_parallel_for(void)
{
    pthread_t th[NTHREADS];
    pf_job jobs[NTHREADS];
    int started = 0;
    for (int k = 0; k < NTHREADS; k++)
        jobs[k] = (pf_job){k, calloc(PF_N, sizeof(int)), k % 2 == 1, false};
    for (; started < NTHREADS; started++)
        if (!jobs[started].hits ||
            pthread_create(&th[started], NULL, pf_run, &jobs[started]) != 0)
            break;
    for (int k = 0; k < started; k++)
        pthread_join(th[k], NULL);
    ZT_CHECK(started == NTHREADS, "started %d of %d threads", started, NTHREADS);
    for (int k = 0; k < started; k++)
        ZT_CHECK(jobs[k].ok, "thread %d (%s): an index was not visited exactly "
                 "%d times", k, jobs[k].nested ? "nested" : "flat", PF_CALLS);
    for (int k = 0; k < NTHREADS; k++)
        free(jobs[k].hits);
    printf("%d threads x %d zs_parallel_for calls over %d items (half of "
           "them nested) on a pool of %d: every index once per call\n",
           NTHREADS, PF_CALLS, PF_N, zs_num_threads());
    zt_section("parallel_for from several threads");
}

int main(void)
{
    zs_tensor *shared = zt_rand(ZS_F32, 2, (int64_t[]){N, IN}, 7);
    ZT_CHECK(shared != NULL, "shared input");
    if (shared) {
        test_training(shared);
        zs_release(shared);
    }
    test_parallel_for();
    return zt_done();
}
