/*
 * trainer.c - zs_trainer (zs/train.h): setup, the synchronous step
 * (all-reduce data parallelism, ZeRO 1-3, the synchronous parameter
 * server) and the loop with its events, validation and checkpoints.
 *
 * A step, for accum micro-batches:
 *     for each micro-batch a: batch(step * accum + a); this rank's rows;
 *         ZeRO: zero_begin; loss; backward (dp: buckets reduced during
 *         the last backward); ZeRO: zero_finish
 *     dp_finish (the flat gradient is the average over the ranks)
 *     norm pass; update with the clip factor fused in; zero the gradients
 * Every rank runs every step, so the losses equal a single process's on
 * the same global batch up to the order of the additions.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "train/internal.h"
#include "zs/ops.h"
#include "zs/analyze.h"

double zsi_train_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

zs_trainer_config zs_trainer_defaults(void)
{
    return (zs_trainer_config){
        .optim = {ZS_ADAMW, 1e-3, 0, false, 0.1, 0.9, 0.95, 1e-8},
        .schedule = {ZS_LR_COSINE, 1e-3, 100, 1000, 1e-4, 0, 0},
        .steps = 1000, .accum = 1, .clip = 1.0, .staleness = 2,
        .bucket_bytes = 8 << 20, .algo = ZS_ALLREDUCE_RING,
    };
}

/* The config's mistakes, each named; ZS_OK or an error. */
static zs_status check_config(const zs_trainer_config *c, int size)
{
    if (!c->batch)
        return zs_set_error("trainer: no batch function");
    if (c->steps < 1 || c->accum < 1 || c->eval_every < 0 || c->stop_after < 0)
        return zs_set_error("trainer: steps (%lld) and accum (%lld) must be >= 1, "
                            "eval_every and stop_after >= 0", (long long)c->steps,
                            (long long)c->accum);
    if (!(c->clip >= 0) || !(c->max_seconds >= 0) || !(c->flops_per_token >= 0))
        return zs_set_error("trainer: clip, max_seconds and flops_per_token must "
                            "be >= 0");
    if ((unsigned)c->sync > ZS_SYNC_SSP || c->zero < 0 || c->zero > 3 || c->staleness < 0)
        return zs_set_error("trainer: bad sync mode %d, ZeRO stage %d or staleness %d",
                            (int)c->sync, c->zero, c->staleness);
    if (c->device != ZS_CPU && !zs_device_get(c->device))
        return zs_set_error("trainer: %s (devices here: %s)",
                            zs_device_name(c->device), zs_device_list());
    if (c->device != ZS_CPU && size > 1)
        return zs_set_error("trainer: %d ranks on %s: the collectives take host "
                            "tensors only, so data parallelism runs on the cpu",
                            size, zs_device_name(c->device));
    if (zs_precision_parse(zs_precision_name(c->precision)) < 0)
        return zs_set_error("trainer: precision %s, expected f32, bf16, f16 or "
                            "f8e4m3 (fp32, bf16, fp16, fp8)",
                            (unsigned)c->precision < ZS_DTYPE_COUNT
                                ? zs_dtype_name(c->precision) : "?");
    if ((c->precision == ZS_F16 || c->precision == ZS_F8E4M3) &&
        c->sync != ZS_SYNC_ALLREDUCE)
        return zs_set_error("trainer: %s scales the loss, which works with "
                            "all-reduce data parallelism only (not a parameter "
                            "server)", zs_precision_name(c->precision));
    if (c->zero > 0 && c->sync != ZS_SYNC_ALLREDUCE)
        return zs_set_error("trainer: ZeRO works with all-reduce data parallelism "
                            "only (a parameter server keeps the optimizer state on "
                            "rank 0)");
    if (c->graph && (size > 1 || c->accum != 1 || c->zero || c->device != ZS_CPU))
        return zs_set_error("trainer: graph mode runs one process, accum 1, no "
                            "ZeRO, on the cpu (here: %d ranks, accum %lld, ZeRO %d, "
                            "%s)", size, (long long)c->accum, c->zero,
                            zs_device_name(c->device));
    if (c->dump_graph && !c->graph)
        return zs_set_error("trainer: dump_graph needs graph mode (graph = true, "
                            "--graph)");
    if (c->sync >= ZS_SYNC_ASYNC && size < 2)
        return zs_set_error("trainer: asynchronous and stale-synchronous training "
                            "need at least 2 ranks (rank 0 serves, the others "
                            "compute)");
    if (zsi_par_check(c) != ZS_OK)
        return ZS_ERR_ARG;
    return zsi_train_onebit_check(c);
}

/* Model-state bytes per rank, measured, beside zs analyze's formula
 * (zs_state_bytes_zero over the fp32 replica). The formula's optimizer
 * term is 12 bytes a parameter: an fp32 master copy, m and v; fp32
 * training updates the weights themselves, so it keeps m and v only and
 * the measured optimizer state is 8/12 of the formula. */
static void log_zero(const zs_trainer *t)
{
    int n;
    zs_zero_shards(t->z, &n);
    double opt = 0, mib = 1048576;
    for (int i = 0; i < n; i++)
        for (int w = 0; w < 2; w++)
            opt += (double)zs_nbytes(zs_optim_moment(t->o, w, i));
    zs_zero_memory zm;
    zs_zero_get_memory(t->z, &zm);
    zs_state_bytes full, f;
    zs_state_bytes_full((double)zs_numel(t->fp), ZS_PREC_FP32, &full);
    zs_state_bytes_zero(&full, t->size, t->c.zero, &f);
    fprintf(t->c.log, "ZeRO-%d over %d ranks, per rank, measured (zs analyze formula): "
            "weights %.3f (%.3f) MiB, gradients %.3f (%.3f) MiB%s, optimizer state %.3f "
            "(%.3f, of which fp32 training keeps m and v: %.3f) MiB\n", t->c.zero,
            t->size, (double)zm.params / mib, f.weights / mib,
            (double)zm.grad_shard / mib, f.grads / mib,
            t->c.zero == 2 ? " + the buckets in flight" : "", opt / mib, f.optim / mib,
            f.optim * 8 / 12 / mib);
}

static void log_setup(const zs_trainer *t)
{
    if (!t->c.log || t->rank != 0)
        return;
    zsi_train_log_precision(t);
    if (t->par)
        zsi_par_log_setup(t);
    if (t->z)
        log_zero(t);
    if (t->dp) {
        zs_dp_stats ds;
        zs_dp_get_stats(t->dp, &ds);
        fprintf(t->c.log, "data parallel over %d ranks: %d gradient bucket%s of ~%.1f "
                "MiB, %s all-reduce\n", t->size, ds.buckets, ds.buckets == 1 ? "" : "s",
                4.0 * (double)zs_numel(t->fg) / ds.buckets / 1048576,
                t->c.algo == ZS_ALLREDUCE_RING ? "ring" : "MPI");
    }
    if (t->c.sync != ZS_SYNC_ALLREDUCE) {
        static const char *names[] = {"allreduce", "ps", "async", "ssp"};
        fprintf(t->c.log, "parameter server (%s) on rank 0 over %d ranks: optimizer "
                "state %.1f MiB on rank 0 only\n", names[t->c.sync], t->size,
                8.0 * (double)zs_numel(t->fp) / 1048576);
    }
}

/* The flat buffers, ZeRO or the bucketed all-reduce, and the optimizer. */
static zs_status build(zs_trainer *t)
{
    const zs_trainer_config *c = &t->c;
    bool z2 = c->zero >= 2; /* gradients only as shards */
    if (zs_module_device(t->m) != c->device &&
        zs_module_to_device(t->m, c->device) != ZS_OK)
        return ZS_ERR_STATE;
    if (zs_module_flatten(t->m, &t->fp, z2 ? NULL : &t->fg) != ZS_OK)
        return ZS_ERR_STATE;
    if (!z2) {
        zs_release(t->fp->grad);
        t->fp->grad = zs_retain(t->fg);
    }
    zs_tensor **ps;
    char **names;
    int np = zs_module_parameters(t->m, &ps, &names);
    if (np < 0)
        return ZS_ERR_STATE;
    zs_status st = ZS_OK;
    if (c->zero == 3) /* units: the model's blocks */
        t->z = zs_zero_new3_module(t->comm, t->m, t->fp);
    else if (c->zero > 0)
        t->z = zs_zero_new(t->comm, c->zero, c->bucket_bytes, np, ps, t->fp, t->fg);
    if (c->zero > 0 && !t->z)
        st = ZS_ERR_STATE;
    if (st == ZS_OK && !z2 && c->sync == ZS_SYNC_ALLREDUCE && t->size > 1) {
        zs_dp_config dc = {c->algo, c->bucket_bytes};
        if (!(t->dp = zs_dp_new(t->comm, &dc, np, ps, t->fg)))
            st = ZS_ERR_STATE;
    }
    zs_names_free(np, ps, names);
    if (st != ZS_OK)
        return st;
    zs_tensor **opt = &t->fp;
    int n_opt = 1;
    if (t->z && !(opt = zs_zero_shards(t->z, &n_opt), n_opt > 0))
        return zs_set_error("ZeRO: rank %d owns no parameters (more ranks than "
                            "elements)", t->rank);
    /* the parameter-server modes keep the optimizer on rank 0 only */
    if ((c->sync == ZS_SYNC_ALLREDUCE || t->rank == 0) &&
        !(t->o = c->optim.kind == ZS_ONEBIT_ADAM
                     ? zs_optim_new_onebit(&c->optim, c->freeze_step, n_opt, opt)
                     : zs_optim_new(&c->optim, n_opt, opt)))
        return ZS_ERR_STATE;
    if ((c->precision == ZS_F16 || c->precision == ZS_F8E4M3) &&
        !(t->scaler = zs_grad_scaler_new(c->scaler.init_scale == 0 ? NULL : &c->scaler)))
        return ZS_ERR_STATE;
    return zsi_train_onebit_setup(t);
}

/* The peak MFU is measured against: the FP32 FMA loop's, doubled where
 * the products run in bf16 on AVX512_BF16 (vdpbf16ps: two multiply-adds
 * per f32 lane; bf16 and fp8 route their GEMMs there). fp16 widens to f32
 * on the CPU (F16C), so its peak is the FP32 one; as PyTorch and Megatron
 * count MFU against the peak of the dtype the products use. */
static double measured_peak(const zs_trainer_config *cfg)
{
    double p = zs_measure_peak_gflops(zs_num_threads(), 0.1) * 1e9;
    bool bf16 = cfg->precision == ZS_BF16 || cfg->precision == ZS_F8E4M3;
    return bf16 && cfg->device == ZS_CPU && zs_cpu()->avx512_bf16 ? 2 * p : p;
}

zs_trainer *zs_trainer_new(zs_module *m, const zs_trainer_config *cfg)
{
    zs_comm *comm = cfg && cfg->comm ? cfg->comm : zs_comm_world();
    if (!m || !cfg || !comm) {
        zs_set_error("trainer: no model, config or communicator");
        return NULL;
    }
    if (check_config(cfg, zs_comm_size(comm)) != ZS_OK)
        return NULL;
    zs_trainer *t = calloc(1, sizeof *t);
    if (!t) {
        zs_set_error_code(ZS_ERR_NOMEM, "trainer: out of memory");
        return NULL;
    }
    t->c = *cfg;
    t->m = m;
    t->comm = comm;
    t->rank = zs_comm_rank(comm);
    t->size = zs_comm_size(comm);
    t->parts = cfg->sync >= ZS_SYNC_ASYNC ? t->size - 1 : t->size;
    t->last_val = NAN;
    t->targets = -1;
    t->step_scale = 1;
    /* model parallelism: t->m becomes this rank's part, comm its dp group */
    zs_alloc_tag_push("trainer setup");
    if ((zsi_par_wanted(cfg) && zsi_par_setup(t) != ZS_OK) || build(t) != ZS_OK) {
        zs_alloc_tag_pop();
        zs_trainer_free(t);
        return NULL;
    }
    zs_alloc_tag_pop();
    if (cfg->flops_per_token > 0)
        t->peak = (cfg->peak_flops > 0 ? cfg->peak_flops : measured_peak(cfg)) * t->parts;
    log_setup(t);
    zs_module_train(m, true);
    return t;
}

void zs_trainer_free(zs_trainer *t)
{
    if (!t)
        return;
    zs_ps_free(t->ps);
    zs_onebit_free(t->ob);
    zs_zero_free(t->z);
    zs_dp_free(t->dp);
    zs_optim_free(t->o);
    zs_grad_scaler_free(t->scaler);
    zs_release(t->fp_low);
    zsi_train_graph_free(t);
    zsi_par_free(t);
    free(t);
}

int64_t zs_trainer_next_step(const zs_trainer *t) { return t ? t->step : 0; }
zs_optim *zs_trainer_optim(zs_trainer *t) { return t ? t->o : NULL; }
zs_tensor *zs_trainer_flat_params(zs_trainer *t) { return t ? t->fp : NULL; }

void zs_trainer_profile(const zs_trainer *t, zs_train_profile *p)
{
    *p = t->prof;
    /* the norm reads the gradients in hand; the update reads g and p
     * and reads and writes each state tensor and p */
    const zs_optim_config *oc = &t->c.optim;
    int states = oc->kind == ZS_SGD ? (oc->momentum > 0) : 2;
    double n = 0;
    int k = t->z ? 0 : 1;
    zs_tensor **opt = t->z ? zs_zero_shards(t->z, &k) : (zs_tensor **)&t->fp;
    for (int i = 0; i < k; i++)
        n += opt[i] ? (double)zs_numel(opt[i]) : 0;
    if (t->dp) {
        zs_dp_stats ds;
        zs_dp_get_stats(t->dp, &ds);
        p->buckets = ds.buckets;
        p->buckets_early = ds.buckets ? (double)ds.started_in_backward / ds.buckets : 0;
    }
    if (t->par)
        zsi_par_profile(t, p);
    p->norm_bytes = t->c.clip > 0 ? 4 * n : 0;
    p->update_bytes = t->o ? 4 * n * (3 + 2 * states) : 0;
}

void zs_trainer_profile_reset(zs_trainer *t)
{
    memset(&t->prof, 0, sizeof t->prof);
    if (t->par)
        zsi_par_profile_reset(t);
}

void zsi_train_my_rows(zs_tensor **x, zs_tensor **y, int part, int parts)
{
    if (parts == 1)
        return;
    int64_t B = (*x)->shape[0], b0 = B * part / parts, nb = B * (part + 1) / parts - b0;
    *x = zs_contiguous(zs_narrow(*x, 0, b0, nb));
    *y = zs_contiguous(zs_narrow(*y, 0, b0, nb));
}

zs_status zsi_train_update(zs_trainer *t, int64_t step, double *gnorm)
{
    double t0 = zsi_train_now(), scale = 1, lr = zs_lr_at(&t->c.schedule, step);
    *gnorm = 0;
    bool skip; /* the loss scaler found Inf/NaN: no update this step */
    zs_status st = zsi_train_unscale(t, &skip);
    if (st != ZS_OK || skip) {
        zs_status su = zsi_train_optim_step(t, lr, 1);
        return st != ZS_OK ? st : su;
    }
    if (t->c.clip > 0) {
        if (t->par) {
            /* a failed reduction (a rank timed out) keeps its own message */
            if ((st = zsi_par_grad_norm(t, gnorm)) != ZS_OK)
                return st;
        } else {
            zs_clear_error(); /* ZeRO's norm says a failed reduction by NaN + message */
            *gnorm = t->z ? zs_zero_grad_norm(t->z) : zs_grad_norm(1, &t->fp);
            if (isnan(*gnorm) && t->z && *zs_last_error())
                return zs_set_error_code(ZS_ERR_IO, "step %lld: gradient norm: %s",
                                         (long long)step, zs_last_error());
        }
        if (isnan(*gnorm))
            return zs_set_error_code(ZS_ERR_STATE, "step %lld: the gradient norm is NaN",
                                     (long long)step);
        scale = zs_clip_coef(*gnorm, t->c.clip);
    }
    double t1 = zsi_train_now();
    zs_alloc_tag_push("optimizer step");
    st = zsi_train_optim_step(t, lr, scale);
    zs_alloc_tag_pop();
    t->prof.norm_s += t1 - t0;
    t->prof.update_s += zsi_train_now() - t1;
    return st;
}

zs_status zsi_train_micro(zs_trainer *t, int64_t index, int part, int parts,
                          bool last, double *loss)
{
    zs_tensor *x, *y;
    zs_status st = t->c.batch(t->c.batch_ctx, index, &x, &y);
    if (st != ZS_OK)
        return st;
    if (!x || !y || x->ndim < 1 || y->ndim < 1 || x->shape[0] != y->shape[0] ||
        x->shape[0] % parts != 0)
        return zs_set_error("trainer: batch %lld has %lld input and %lld target rows; "
                            "they must be equal and divisible by the %d ranks that "
                            "compute", (long long)index,
                            (long long)(x && x->ndim ? x->shape[0] : -1),
                            (long long)(y && y->ndim ? y->shape[0] : -1), parts);
    t->targets += zs_numel(y); /* the global batch's, before the split */
    zsi_train_my_rows(&x, &y, part, parts);
    if (t->c.device != ZS_CPU) { /* the batch goes where the model is */
        x = zs_to_device(x, t->c.device);
        y = zs_to_device(y, t->c.device);
        if (!x || !y)
            return ZS_ERR_STATE;
    }
    /* ZeRO-2/3 reduce every micro-batch into the shard (3 gathers the
     * parameters kept through the step first); plain data parallelism
     * the accumulated gradient, during the last backward */
    if (t->z && (st = zs_zero_begin(t->z)) != ZS_OK)
        return st;
    double t0 = zsi_train_now();
    zs_tensor *l = t->c.loss ? t->c.loss(t->c.loss_ctx, t->m, x, y) : zs_gpt_loss(t->m, x, y);
    /* 1 / accum, times the loss scale for f16 and fp8 */
    double f = (t->scaler ? zs_grad_scaler_get_scale(t->scaler) : 1) / (double)t->c.accum;
    zs_tensor *scaled = l && f != 1 ? zs_mul_scalar(l, f) : l;
    double t1 = zsi_train_now();
    if (t->dp && last && !zsi_train_grads_local(t)) /* 1-bit Adam: not after the freeze */
        st = zs_dp_begin(t->dp);
    if (st == ZS_OK && (!scaled || zs_backward(scaled, NULL, false) != ZS_OK))
        st = ZS_ERR_STATE;
    if (t->z && zs_zero_finish(t->z) != ZS_OK)
        st = ZS_ERR_STATE;
    t->prof.forward_s += t1 - t0;
    t->prof.backward_s += zsi_train_now() - t1;
    if (st == ZS_OK)
        *loss = zs_item(l);
    return st;
}

typedef struct ps_update {
    zs_trainer *t;
    int64_t step;
    double *gnorm;
} ps_update;

/* zs_ps_update_fn of the synchronous parameter server (rank 0). */
static int apply_sync(void *ctx, const zs_ps_update *u)
{
    ps_update *x = ctx;
    (void)u;
    return zsi_train_update(x->t, x->step, x->gnorm) == ZS_OK ? 0 : ZS_ERR_STATE;
}

zs_status zsi_train_accumulate(zs_trainer *t, int64_t i, int part, int parts,
                               double *loss)
{
    double sum = 0;
    /* forward and loss under autocast; the weights converted once */
    zs_status st = zsi_train_amp_begin(t, true);
    bool amp = st == ZS_OK;
    for (int64_t a = 0; st == ZS_OK && a < t->c.accum; a++) {
        double l = 0;
        zs_scope_push();
        st = zsi_train_micro(t, i * t->c.accum + a, part, parts, a == t->c.accum - 1, &l);
        zs_scope_pop();
        sum += l;
    }
    if (amp)
        zsi_train_amp_end(t);
    *loss = sum / (double)t->c.accum;
    return st;
}

/* The gradients (all micro-batches, averaged over the ranks) and the loss
 * of step `step`; *loss gets the mean over the global batch. */
static zs_status gradients(zs_trainer *t, int64_t step, double *loss)
{
    double sum = 0;
    zs_status st = zsi_train_accumulate(t, step, t->rank, t->size, &sum);
    double t0 = zsi_train_now();
    bool local = zsi_train_grads_local(t);
    t->comm_bytes = zsi_train_step_bytes(t, local);
    if (t->dp && !local && zs_dp_finish(t->dp) != ZS_OK) /* averaged over ranks */
        st = ZS_ERR_STATE;
    t->prof.comm_s += zsi_train_now() - t0;
    if (st == ZS_OK && t->size > 1) { /* and the losses */
        zs_tensor *l = zs_scalar(ZS_F64, sum);
        st = zs_comm_allreduce(t->comm, l, true, ZS_ALLREDUCE_MPI);
        sum = l ? zs_item(l) : NAN;
        zs_release(l);
    }
    *loss = sum;
    return st;
}

/* Gradients to zero for the next step. */
static void zero_grad(zs_trainer *t)
{
    double t0 = zsi_train_now();
    if (t->z)
        zs_zero_zero_grad(t->z);
    else
        zs_fill_(t->fg, 0.0);
    t->prof.zero_grad_s += zsi_train_now() - t0;
}

/* The parameter server starts after any resume (every rank then gets rank
 * 0's parameters); ZeRO-3 ranks keep only their chunks from here on. */
static zs_status start(zs_trainer *t)
{
    if (t->z)
        zs_zero_release(t->z);
    if (t->c.sync == ZS_SYNC_ALLREDUCE || t->ps)
        return ZS_OK;
    zs_ps_mode mode = t->c.sync == ZS_SYNC_PS ? ZS_PS_SYNC
                    : t->c.sync == ZS_SYNC_ASYNC ? ZS_PS_ASYNC : ZS_PS_SSP;
    t->ps = zs_ps_new(t->comm, mode, t->c.staleness, t->fp, t->fg);
    return t->ps ? ZS_OK : ZS_ERR_STATE;
}

/* One synchronous step; *loss and *gnorm get its metrics. */
static zs_status sync_step(zs_trainer *t, int64_t step, double *loss, double *gnorm)
{
    t->targets = 0; /* counted by the micro-batches */
    if (t->c.graph) {
        zs_status st = zsi_train_graph_step(t, step, loss, gnorm);
        zero_grad(t);
        t->prof.steps++;
        return st;
    }
    zs_status st = t->par ? zsi_par_gradients(t, step, loss) : gradients(t, step, loss);
    if (st == ZS_OK && t->ob && zsi_train_grads_local(t)) { /* counted by the update */
        st = zsi_train_update(t, step, gnorm);
        t->comm_bytes = zsi_train_step_bytes(t, true);
    } else if (st == ZS_OK && t->ps) { /* rank 0 applies the average, then broadcasts */
        ps_update u = {t, step, gnorm};
        if (zs_ps_sync_step(t->ps, *loss, apply_sync, &u) < 0)
            st = ZS_ERR_STATE;
    } else if (st == ZS_OK) {
        st = zsi_train_update(t, step, gnorm);
        if (st == ZS_OK && t->z && t->c.zero < 3) /* 3: fetched on use */
            st = zs_zero_gather(t->z);
    }
    zero_grad(t);
    t->prof.steps++;
    return st;
}

/* The event of step `step`, without validation. */
static zs_train_event event_of(const zs_trainer *t, int64_t step, double loss,
                               double gnorm, double dt, int64_t targets)
{
    double elapsed = zsi_train_now() - t->t0, done = (double)(step + 1 - t->first_step);
    zs_train_event e = {
        .step = step, .steps = t->c.steps, .loss = loss, .grad_norm = gnorm,
        .lr = zs_lr_at(&t->c.schedule, step), .step_s = dt,
        .targets = targets, .tokens_per_s = dt > 0 ? (double)targets / dt : 0,
        .elapsed_s = elapsed,
        .val_loss = NAN, .rank = t->rank, .comm_bytes = t->comm_bytes,
        .precision = t->c.precision, .loss_scale = t->step_scale, .skipped = t->skipped,
    };
    e.mfu = t->peak > 0 ? t->c.flops_per_token * e.tokens_per_s / t->peak : 0;
    e.eta_s = done > 0 ? elapsed / done * (double)(t->c.steps - step - 1) : 0;
    if (t->c.max_seconds > 0 && t->c.max_seconds - elapsed < e.eta_s)
        e.eta_s = t->c.max_seconds - elapsed > 0 ? t->c.max_seconds - elapsed : 0;
    e.last = step + 1 >= t->c.steps || step + 1 == t->c.stop_after ||
             (t->c.max_seconds > 0 && elapsed >= t->c.max_seconds);
    return e;
}

/* Targets (elements of y) of one global batch, all micro-batches, for the
 * asynchronous server, which sees no batch: a probe makes batch 0. */
static int64_t targets_per_step(zs_trainer *t)
{
    zs_scope_push();
    zs_tensor *x = NULL, *y = NULL;
    int64_t n = t->c.batch(t->c.batch_ctx, 0, &x, &y) == ZS_OK && y ? zs_numel(y) : 0;
    zs_scope_pop();
    return n * t->c.accum;
}

double zs_trainer_validate(zs_trainer *t)
{
    if (!t->c.eval)
        return NAN;
    if (t->par) { /* the split model; its weights cast on use */
        zs_no_grad_push();
        bool amp = zsi_train_amp_begin(t, false) == ZS_OK;
        double v = amp ? zsi_par_validate(t) : NAN;
        if (amp)
            zsi_train_amp_end(t);
        zs_no_grad_pop();
        return v;
    }
    /* ZeRO-3: the whole model, gathered, for validation */
    if (t->c.zero == 3 && zs_zero_gather(t->z) != ZS_OK)
        return NAN;
    zs_no_grad_push();
    zs_module_train(t->m, false);
    bool amp = zsi_train_amp_begin(t, true) == ZS_OK;
    double v = amp ? t->c.eval(t->c.eval_ctx, t->m) : NAN;
    if (amp)
        zsi_train_amp_end(t);
    zs_module_train(t->m, true);
    zs_no_grad_pop();
    if (t->c.zero == 3)
        zs_zero_release(t->z);
    return v;
}

int zsi_train_after_step(zs_trainer *t, int64_t step, double loss, double gnorm,
                         double dt)
{
    if (t->targets < 0)
        t->targets = targets_per_step(t);
    zs_train_event e = event_of(t, step, loss, gnorm, dt, t->targets);
    t->step = step + 1;
    int64_t every = t->c.eval_every;
    bool due = e.last || (every > 0 && (step + 1) % every == 0);
    zs_status st = ZS_OK;
    if (due && t->c.eval) {
        e.val_loss = t->last_val = zs_trainer_validate(t);
        e.validated = true;
        if (isnan(e.val_loss))
            st = zs_set_error_code(ZS_ERR_STATE, "validation after step %lld failed: %s",
                                   (long long)step + 1, zs_last_error());
    }
    /* asynchronous workers hold other parameters by design and are busy */
    if (st == ZS_OK && due && t->c.sync <= ZS_SYNC_PS)
        st = zsi_train_check_replicas(t);
    if (st == ZS_OK && t->c.on_step && t->c.on_step(t->c.on_step_ctx, &e) != 0)
        e.last = true; /* asked to stop */
    if (st == ZS_OK && due && t->c.checkpoint)
        st = zs_trainer_save(t, t->c.checkpoint, e.val_loss);
    return st != ZS_OK ? -1 : e.last ? 1 : 0;
}

/* ZeRO-3: what rank 0 held at most. */
static void log_end(const zs_trainer *t)
{
    if (t->c.log && t->rank == 0 && t->par)
        zsi_par_log_end(t);
    if (!t->c.log || t->rank != 0 || t->c.zero != 3)
        return;
    zs_zero_memory zm;
    zs_zero_get_memory(t->z, &zm);
    fprintf(t->c.log, "ZeRO-3 parameters held by rank 0: its chunks %.3f MiB, at most "
            "%.3f MiB with the gathered units (the whole model: %.3f MiB)\n",
            (double)zm.params / 1048576, (double)zm.params_peak / 1048576,
            (double)zs_nbytes(t->fp) / 1048576);
}

zs_status zs_trainer_step(zs_trainer *t, zs_train_event *e)
{
    if (!t)
        return ZS_ERR_ARG;
    if (t->c.sync >= ZS_SYNC_ASYNC)
        return zs_set_error("zs_trainer_step: asynchronous modes run with "
                            "zs_trainer_run");
    zs_status st = start(t);
    double ts = zsi_train_now(), loss = NAN, gnorm = 0;
    if (t->t0 == 0) {
        t->t0 = ts;
        t->first_step = t->step;
    }
    if (st == ZS_OK)
        st = sync_step(t, t->step, &loss, &gnorm);
    if (st != ZS_OK)
        return st;
    if (t->targets < 0)
        t->targets = targets_per_step(t);
    if (e)
        *e = event_of(t, t->step, loss, gnorm, zsi_train_now() - ts, t->targets);
    t->step++;
    return ZS_OK;
}

zs_status zs_trainer_run(zs_trainer *t)
{
    if (!t)
        return ZS_ERR_ARG;
    zs_status st = start(t);
    t->t0 = zsi_train_now();
    t->first_step = t->step;
    if (st != ZS_OK || t->step >= t->c.steps ||
        (t->c.stop_after > 0 && t->step >= t->c.stop_after))
        return st;
    if (t->c.sync >= ZS_SYNC_ASYNC)
        return zsi_train_run_async(t);
    for (int64_t step = t->step; step < t->c.steps; step++) {
        double ts = zsi_train_now(), loss = NAN, gnorm = 0;
        if ((st = sync_step(t, step, &loss, &gnorm)) != ZS_OK)
            return zs_set_error_code(st, "step %lld failed: %s", (long long)step,
                                     zs_last_error());
        int r = zsi_train_after_step(t, step, loss, gnorm, zsi_train_now() - ts);
        if (r < 0)
            return ZS_ERR_STATE;
        if (r)
            break;
    }
    if (t->par)
        zsi_par_log_memory(t);
    log_end(t);
    return ZS_OK;
}
