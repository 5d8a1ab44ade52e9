/*
 * state.c - a trainer's checkpoints and the replica check.
 *
 * A checkpoint is one safetensors file (zs_module_save): the model, the
 * optimizer state of the whole flat parameter vector, and metadata. Under
 * ZeRO each rank holds the state of its chunks only: they are gathered
 * into a plain optimizer over the flat parameters for writing and cut
 * again for reading, so a run may resume on any number of ranks, with or
 * without ZeRO.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "train/internal.h"

/* Moves the optimizer's moments between ZeRO's per-rank chunks (t->o) and
 * a plain optimizer over the flat parameters (full). to_full: collective
 * gather (full may be NULL on ranks that do not write); else a local copy
 * of this rank's chunks out of full. */
static zs_status zero_state(zs_trainer *t, zs_optim *full, bool to_full)
{
    int n;
    zs_zero_shards(t->z, &n);
    zs_tensor **chunks = calloc((size_t)n + 1, sizeof *chunks);
    zs_status st = chunks ? ZS_OK : zs_set_error_code(ZS_ERR_NOMEM, "out of memory");
    int kinds = t->c.optim.kind == ZS_SGD ? (t->c.optim.momentum > 0) : 2;
    for (int w = 0; st == ZS_OK && w < kinds; w++) {
        for (int i = 0; i < n; i++)
            chunks[i] = zs_optim_moment(t->o, w, i);
        zs_tensor *f = zs_optim_moment(full, w, 0);
        st = to_full ? zs_zero_gather_state(t->z, chunks, f)
                     : zs_zero_scatter_state(t->z, f, chunks);
    }
    free(chunks);
    return st;
}

/* The caller's metadata object with the trainer's keys added; malloc'd. */
static char *metadata(const zs_trainer *t, double val_loss)
{
    const char *user = t->c.metadata ? t->c.metadata : "{}";
    size_t n = strlen(user);
    while (n > 0 && user[n - 1] != '}') /* up to the closing brace */
        n--;
    bool empty = true;
    for (size_t i = 0; i + 1 < n; i++)
        if (user[i] != '{' && user[i] != ' ' && user[i] != '\n')
            empty = false;
    uint64_t seed, offset;
    zs_rng_get_state(&seed, &offset);
    char mine[768], amp[256] = "";
    /* the precision, and the loss scaler's state (f16, fp8) */
    if (t->c.precision != ZS_F32)
        snprintf(amp, sizeof amp, ",\"precision\":\"%s\"", zs_precision_name(t->c.precision));
    if (t->scaler)
        snprintf(amp + strlen(amp), sizeof amp - strlen(amp),
                 ",\"loss_scale\":\"%.17g\",\"loss_scale_growth\":\"%lld\"",
                 zs_grad_scaler_get_scale(t->scaler),
                 (long long)zs_grad_scaler_growth_tracker(t->scaler));
    snprintf(mine, sizeof mine, "%s\"step\":\"%lld\",\"optim_steps\":\"%lld\","
             "\"rng_seed\":\"%llu\",\"rng_offset\":\"%llu\",\"val_loss\":\"%.6f\"%s}",
             empty ? "" : ",", (long long)t->step, (long long)zs_optim_steps(t->o),
             (unsigned long long)seed, (unsigned long long)offset, val_loss, amp);
    size_t head = n > 0 ? n - 1 : 0;
    char *out = malloc(head + strlen(mine) + 2);
    if (!out)
        return NULL;
    if (n == 0)
        strcpy(out, "{");
    else
        memcpy(out, user, head), out[head] = '\0';
    strcat(out, mine);
    return out;
}

/* Model parallelism (par_ckpt.c): the one-process layout, gathered to
 * world rank 0 one parameter at a time, or read back into this rank's
 * part; under ZeRO-1 the optimizer state of this rank's part is gathered
 * over dp first (and cut again after reading). Collective. */
static zs_status par_state(zs_trainer *t, const char *path, double val_loss,
                           bool save, char **meta_out)
{
    zs_optim *local = t->z ? zs_optim_new(&t->c.optim, 1, &t->fp) : t->o;
    zs_status st = local ? ZS_OK : zs_set_error_code(ZS_ERR_NOMEM, "out of memory");
    if (save) {
        if (st == ZS_OK && t->z)
            st = zero_state(t, local, true);
        char *meta = st == ZS_OK && t->rank == 0 ? metadata(t, val_loss) : NULL;
        if (st == ZS_OK && t->rank == 0 && !meta)
            st = zs_set_error_code(ZS_ERR_NOMEM, "checkpoint: out of memory");
        if (st == ZS_OK)
            st = zsi_par_save(t, path, meta, local);
        free(meta);
    } else {
        if (st == ZS_OK)
            st = zsi_par_load(t, path, local, meta_out);
        if (st == ZS_OK && t->z)
            st = zero_state(t, local, false);
    }
    if (t->z)
        zs_optim_free(local);
    return st;
}

zs_status zs_trainer_save(zs_trainer *t, const char *path, double val_loss)
{
    if (t->par)
        return par_state(t, path, val_loss, true, NULL);
    bool lead = t->rank == 0;
    if (!lead && !t->z) /* ZeRO: every rank takes part in the gather */
        return ZS_OK;
    /* ZeRO-3: the whole model, gathered for the write */
    if (t->c.zero == 3 && zs_zero_gather(t->z) != ZS_OK)
        return ZS_ERR_STATE;
    zs_optim *o = t->z && lead ? zs_optim_new(&t->c.optim, 1, &t->fp) : t->o;
    zs_status st = o || !lead ? ZS_OK : ZS_ERR_NOMEM;
    if (st == ZS_OK && t->z)
        st = zero_state(t, lead ? o : NULL, true);
    char *meta = lead && st == ZS_OK ? metadata(t, val_loss) : NULL;
    if (lead && st == ZS_OK && !meta)
        st = zs_set_error_code(ZS_ERR_NOMEM, "checkpoint: out of memory");
    if (st == ZS_OK && lead) {
        zs_optim_set_steps(o, zs_optim_steps(t->o));
        st = zs_module_save(path, t->m, o, meta);
    }
    free(meta);
    if (t->z && lead)
        zs_optim_free(o);
    if (t->c.zero == 3)
        zs_zero_release(t->z);
    return st;
}

/* The unsigned decimal string value of key in the metadata object (all
 * of it digits, at most 2^53): *out and true; false when absent. A value
 * that is there but malformed is an error (*bad set). */
static bool meta_u64(const cJSON *root, const char *key, uint64_t *out, bool *bad)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!v)
        return false;
    char *end = NULL;
    const char *s = cJSON_IsString(v) ? v->valuestring : "";
    unsigned long long x = s[0] >= '0' && s[0] <= '9' ? strtoull(s, &end, 10) : 0;
    if (!end || *end || x > (1ull << 53)) {
        *bad = true;
        return false;
    }
    *out = x;
    return true;
}

/* The loss scaler's state (loss_scale, loss_scale_growth), when the
 * checkpoint has it (one written without a scaler: the scaler starts
 * afresh). */
static zs_status read_scaler(zs_trainer *t, const cJSON *root, bool *bad)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, "loss_scale");
    uint64_t growth = 0;
    if (!t->scaler || !v)
        return ZS_OK;
    char *end = NULL;
    double scale = cJSON_IsString(v) ? strtod(v->valuestring, &end) : 0;
    meta_u64(root, "loss_scale_growth", &growth, bad);
    if (!end || *end || *bad ||
        zs_grad_scaler_set_state(t->scaler, scale, (int64_t)growth) != ZS_OK) {
        *bad = true;
        return ZS_ERR_ARG;
    }
    return ZS_OK;
}

/* step, optim_steps and the RNG state of a checkpoint's metadata. */
static zs_status read_progress(zs_trainer *t, const char *path, const char *meta)
{
    cJSON *root = meta ? cJSON_Parse(meta) : NULL;
    uint64_t step = 0, osteps, seed, off;
    bool bad = !cJSON_IsObject(root);
    if (!bad && !meta_u64(root, "step", &step, &bad) && !bad)
        bad = true;
    /* asynchronous updates make (ranks - 1) optimizer steps per step */
    int64_t per_step = t->c.sync >= ZS_SYNC_ASYNC ? t->size - 1 : 1;
    bool have_o = !bad && meta_u64(root, "optim_steps", &osteps, &bad);
    bool have_rng = !bad && meta_u64(root, "rng_seed", &seed, &bad) &&
                    meta_u64(root, "rng_offset", &off, &bad);
    if (!bad)
        read_scaler(t, root, &bad);
    cJSON_Delete(root);
    if (bad)
        return zs_set_error("checkpoint %s: its metadata has no valid \"step\" (a "
                            "decimal string up to 2^53; not written by a zs_trainer?)",
                            path);
    t->step = (int64_t)step;
    zs_optim_set_steps(t->o, have_o ? (int64_t)osteps : t->step * per_step);
    if (have_rng)
        zs_rng_set_state(seed, off);
    return ZS_OK;
}

zs_status zs_trainer_resume(zs_trainer *t, const char *path, char **meta_out)
{
    char *meta = NULL;
    /* ZeRO: the full state is read, then each rank keeps its chunks;
     * parameter-server workers read the weights only */
    zs_optim *o = t->z ? zs_optim_new(&t->c.optim, 1, &t->fp) : t->o;
    zs_status st = o || !t->z ? ZS_OK : ZS_ERR_NOMEM;
    if (st == ZS_OK && t->par)
        st = par_state(t, path, NAN, false, &meta);
    else if (st == ZS_OK)
        st = zs_module_load(path, t->m, o, &meta);
    if (st == ZS_OK && t->z && !t->par)
        st = zero_state(t, o, false);
    if (t->z)
        zs_optim_free(o);
    if (st != ZS_OK) {
        free(meta);
        return st;
    }
    if ((st = read_progress(t, path, meta)) != ZS_OK) {
        free(meta);
        return st;
    }
    if (t->c.log && t->rank == 0)
        fprintf(t->c.log, "resuming %s at step %lld\n", path, (long long)t->step);
    if (meta_out)
        *meta_out = meta;
    else
        free(meta);
    return ZS_OK;
}

/* Data parallelism keeps one copy of the parameters per rank: a 64-bit
 * FNV-1a hash of the flat parameter bytes is gathered from all ranks, and
 * any difference is an error naming the rank that diverged. */
zs_status zsi_train_check_replicas(zs_trainer *t)
{
    if (t->size == 1)
        return ZS_OK;
    if (t->c.zero == 3 && zs_zero_gather(t->z) != ZS_OK) /* the whole model */
        return ZS_ERR_STATE;
    const unsigned char *p = zs_data(t->fp);
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < zs_nbytes(t->fp); i++)
        h = (h ^ p[i]) * 1099511628211ull;
    int64_t mine = (int64_t)h, all_n = t->size;
    zs_tensor *one = zs_from_data(ZS_I64, 1, (int64_t[]){1}, &mine);
    zs_tensor *all = zs_empty(ZS_I64, 1, &all_n);
    zs_status st = one && all ? zs_comm_allgather(t->comm, one, all) : ZS_ERR_NOMEM;
    for (int r = 1; st == ZS_OK && r < t->size; r++)
        if (((int64_t *)zs_data(all))[r] != ((int64_t *)zs_data(all))[0])
            st = zs_set_error_code(ZS_ERR_STATE, "data parallel: the parameters "
                                   "of rank %d differ from rank 0's", r);
    zs_release(one);
    zs_release(all);
    if (t->c.zero == 3)
        zs_zero_release(t->z);
    return st;
}
