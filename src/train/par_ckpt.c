/*
 * par_ckpt.c - checkpoints of a model-parallel run in the one-process
 * layout (issue 28), without any rank holding the whole model.
 *
 * The file is the one zs_module_save writes for the one-process GPT and
 * its optimizer over the flat parameters: every parameter under its name,
 * and the moments as flat tensors "optim.exp_avg.0", "optim.exp_avg_sq.0"
 * (AdamW) or "optim.momentum.0" (SGD with momentum) of all the model's
 * elements, in the one-process flat order. So a run resumes on any layout,
 * one process included.
 *
 * Saving, one parameter at a time: the dp-0 ranks of its owning stage
 * all-gather it over tp (zs_tp_unshard; replicated tensors are already
 * whole), tp rank 0 of that stage sends it to world rank 0 over the pp
 * group (world rank 0 is dp 0, tp 0, pp 0), which writes it and its
 * moments' slices where they go (zs_safetensors_writer). A rank holds at
 * most one whole parameter (and its moments) beyond its part.
 *
 * Loading: every rank opens the file (its header only), checks that every
 * tensor is there with its one-process shape, and reads the parameters it
 * holds one at a time, cutting its shard (zs_tp_shard) out of each.
 */
#include <stdlib.h>
#include <string.h>

#include "train/internal.h"
#include "train/par.h"
#include "zs/io.h"

#define MAX_MOMENTS 4

/* ---- the table of parameters ------------------------------------------ */

/* The stage owning a parameter of the one-process model. */
static int owner(const zsi_par *p, const char *name)
{
    int64_t L = p->bounds[p->stages];
    int64_t l = zsi_gpt_param_layer(name, L);
    if (l < 0)
        return 0;
    if (l >= L)
        return p->stages - 1;
    int s = 0;
    while (s + 1 < p->stages && l >= p->bounds[s + 1])
        s++;
    return s;
}

zs_status zsi_par_layout(zsi_par *p, zs_module *full)
{
    zs_tensor **ps, **bs;
    char **names, **bn;
    int n = zs_module_parameters(full, &ps, &names);
    int nb = n >= 0 ? zs_module_buffers(full, &bs, &bn) : -1;
    if (n <= 0 || nb < 0)
        return n == 0 ? zs_set_error("model parallel: the GPT has no parameters")
                      : ZS_ERR_NOMEM;
    zs_names_free(nb, bs, bn);
    zs_module *part = zsi_pgpt_module(p->pg);
    zs_status st = nb == 0 ? ZS_OK
                   : zs_set_error("model parallel: the GPT has buffers (not split)");
    if (st == ZS_OK && !(p->info = calloc((size_t)n, sizeof *p->info)))
        st = zs_set_error_code(ZS_ERR_NOMEM, "trainer: out of memory");
    int k = 0;
    for (int i = 0; st == ZS_OK && i < n; i++, p->ninfo++) {
        zsi_pinfo *f = &p->info[i];
        if (!(f->name = strdup(names[i])))
            st = zs_set_error_code(ZS_ERR_NOMEM, "trainer: out of memory");
        f->ndim = ps[i]->ndim;
        memcpy(f->shape, ps[i]->shape, sizeof f->shape);
        f->numel = zs_numel(ps[i]);
        f->off = p->full_numel;
        p->full_numel += f->numel;
        f->stage = owner(p, names[i]);
        f->local = -1;
        if (zsi_pgpt_holds(p->pg, names[i])) {
            while (k < part->nparams && strcmp(part->param_names[k], names[i]))
                k++;
            f->local = k < part->nparams ? k : -1;
            if (f->local < 0)
                st = zs_set_error("model parallel: the part lacks %s", names[i]);
        }
    }
    zs_names_free(n, ps, names);
    return st;
}

void zsi_par_layout_free(zsi_par *p)
{
    for (int i = 0; p->info && i < p->ninfo; i++)
        free(p->info[i].name);
    free(p->info);
    p->info = NULL;
    p->ninfo = 0;
}

/* ---- helpers ----------------------------------------------------------- */

/* A view of like's numel elements of flat (f32) at element off, shaped as
 * like. */
static zs_tensor *flat_view(zs_tensor *flat, int64_t off, const zs_tensor *like)
{
    return zs_from_blob(ZS_F32, like->ndim, like->shape, (float *)zs_data(flat) + off);
}

static int64_t offset_in(const zs_tensor *flat, const zs_tensor *p)
{
    return (const float *)zs_data(p) - (const float *)zs_data(flat);
}

/* The optimizer's moments of local (over t->fp): their file names
 * ("optim.exp_avg.0", ...) into names[MAX_MOMENTS][48]; the count. */
static int moments(zs_optim *local, char names[MAX_MOMENTS][48])
{
    const char *on[MAX_MOMENTS];
    zs_tensor *ot[MAX_MOMENTS];
    int k = local ? zs_optim_state(local, MAX_MOMENTS, on, ot) : 0;
    for (int j = 0; j < k; j++)
        snprintf(names[j], 48, "optim.%s", on[j]);
    return k;
}

/* Whether every rank of the world reported ok (collective). */
static zs_status agree(zsi_par *p, zs_status st)
{
    zs_tensor *f = zs_scalar(ZS_F64, st == ZS_OK ? 0 : 1);
    zs_status a = f ? zs_comm_allreduce(p->grid->world, f, false, ZS_ALLREDUCE_MPI)
                    : ZS_ERR_NOMEM;
    bool bad = a != ZS_OK || zs_item(f) > 0;
    zs_release(f);
    if (st != ZS_OK || !bad)
        return st;
    return a != ZS_OK ? a : zs_set_error_code(ZS_ERR_STATE, "model parallel: another "
                                              "rank failed with the checkpoint");
}

/* The whole of tensor x of this stage's part (a shard or replicated)
 * over tp (collective over tp): a new tensor. */
static zs_tensor *whole(zsi_par *p, zs_tensor *x, const char *name)
{
    int dim, blocks;
    if (!zsi_gpt_param_split(name, &dim, &blocks))
        return zs_contiguous(x);
    return zs_tp_unshard(p->grid->tp, x, dim, blocks);
}

/* This rank's shard of the whole tensor w of parameter name: new. */
static zs_tensor *shard(zsi_par *p, zs_tensor *w, const char *name)
{
    int dim, blocks;
    bool split = zsi_gpt_param_split(name, &dim, &blocks);
    return zs_tp_shard(w, dim, blocks, split ? p->grid->me.tp : 0,
                       split ? p->grid->dims.tp : 1);
}

/* ---- saving ------------------------------------------------------------ */

typedef struct saver {
    zs_trainer *t;
    zsi_par *p;
    zs_safetensors_writer *w; /* world rank 0 only */
    zs_optim *local;
    int k;                    /* moments */
    char names[MAX_MOMENTS][48];
    zs_status st;             /* world rank 0's writes */
} saver;

/* The whole tensor of item j (-1: the parameter, else moment j) of f on
 * the dp-0 ranks of its stage; NULL elsewhere (or NULL + error). */
static zs_tensor *gather_item(saver *s, const zsi_pinfo *f, int j)
{
    zsi_par *p = s->p;
    zs_trainer *t = s->t;
    if (p->grid->me.dp != 0 || p->stage != f->stage)
        return NULL;
    zs_tensor *mine = t->m->params[f->local];
    zs_tensor *src = j < 0 ? zs_retain(mine)
                           : flat_view(zs_optim_moment(s->local, j, 0),
                                       offset_in(t->fp, mine), mine);
    zs_tensor *w = src ? whole(p, src, f->name) : NULL;
    zs_release(src);
    return w;
}

/* World rank 0 writes x (whole) as item j of f. */
static void put(saver *s, const zsi_pinfo *f, int j, zs_tensor *x)
{
    if (s->st != ZS_OK)
        return;
    if (!x || zs_numel(x) != f->numel)
        s->st = zs_set_error("checkpoint: %s gathered with %lld elements, expected %lld",
                             f->name, (long long)(x ? zs_numel(x) : -1),
                             (long long)f->numel);
    else
        s->st = zs_safetensors_writer_put(s->w, j < 0 ? f->name : s->names[j],
                                          j < 0 ? 0 : (size_t)f->off * 4, zs_data(x),
                                          (size_t)f->numel * 4);
}

/* Item j of f, from its stage to world rank 0. */
static zs_status move_item(saver *s, const zsi_pinfo *f, int j, int tag)
{
    zsi_par *p = s->p;
    bool sender = p->grid->me.dp == 0 && p->grid->me.tp == 0 && p->stage == f->stage;
    bool lead = p->grid->rank == 0;
    zs_clear_error();
    zs_tensor *x = gather_item(s, f, j);
    zs_status st = x || !(p->grid->me.dp == 0 && p->stage == f->stage) ? ZS_OK
                   : ZS_ERR_STATE;
    if (st == ZS_OK && sender && !lead)
        st = zs_comm_send(p->grid->pp, x, 0, tag);
    if (st == ZS_OK && lead && !sender) {
        x = zs_empty(ZS_F32, f->ndim, f->shape);
        st = x ? zs_comm_recv(p->grid->pp, x, f->stage, tag) : ZS_ERR_NOMEM;
    }
    if (st == ZS_OK && lead)
        put(s, f, j, x);
    zs_release(x);
    return st;
}

/* The file's tensors: the parameters, then the flat moments. */
static zs_safetensors_writer *open_writer(saver *s, const char *path, const char *meta)
{
    zsi_par *p = s->p;
    zs_tensor_info *in = calloc((size_t)(p->ninfo + s->k), sizeof *in);
    if (!in) {
        zs_set_error_code(ZS_ERR_NOMEM, "checkpoint: out of memory");
        return NULL;
    }
    for (int i = 0; i < p->ninfo; i++) {
        in[i].name = p->info[i].name;
        in[i].dtype = ZS_F32;
        in[i].ndim = p->info[i].ndim;
        memcpy(in[i].shape, p->info[i].shape, sizeof in[i].shape);
    }
    for (int j = 0; j < s->k; j++)
        in[p->ninfo + j] = (zs_tensor_info){s->names[j], ZS_F32, 1, {p->full_numel}};
    zs_safetensors_writer *w = zs_safetensors_writer_new(path, p->ninfo + s->k, in, meta);
    free(in);
    return w;
}

zs_status zsi_par_save(zs_trainer *t, const char *path, const char *meta, zs_optim *local)
{
    zsi_par *p = t->par;
    saver s = {t, p, NULL, local, 0, {{0}}, ZS_OK};
    s.k = moments(local, s.names);
    if (p->grid->rank == 0 && !(s.w = open_writer(&s, path, meta)))
        s.st = ZS_ERR_IO;
    zs_status st = agree(p, s.st); /* nobody sends to a rank that cannot write */
    zs_no_grad_push();
    for (int i = 0; st == ZS_OK && i < p->ninfo; i++)
        for (int j = -1; st == ZS_OK && j < s.k; j++)
            st = move_item(&s, &p->info[i], j, 1 + i * (MAX_MOMENTS + 1) + (j + 1));
    zs_no_grad_pop();
    if (s.w) {
        if (st == ZS_OK && s.st == ZS_OK)
            s.st = zs_safetensors_writer_finish(s.w);
        else
            zs_safetensors_writer_abort(s.w);
    }
    if (st == ZS_OK)
        st = s.st;
    return agree(p, st);
}

/* ---- loading ----------------------------------------------------------- */

/* Every tensor of the one-process layout is in r with its shape. */
static zs_status check_file(zsi_par *p, const zs_safetensors_reader *r, const char *path,
                            int k, char names[MAX_MOMENTS][48])
{
    zs_status st = ZS_OK;
    for (int i = 0; st == ZS_OK && i < p->ninfo + k; i++) {
        const zsi_pinfo *f = i < p->ninfo ? &p->info[i] : NULL;
        zs_tensor_info in;
        int64_t one[1] = {p->full_numel};
        int nd = f ? f->ndim : 1;
        const int64_t *sh = f ? f->shape : one;
        st = zs_safetensors_reader_info(r, f ? f->name : names[i - p->ninfo], &in);
        bool same = st == ZS_OK && in.dtype == ZS_F32 && in.ndim == nd;
        for (int d = 0; same && d < nd; d++)
            same = in.shape[d] == sh[d];
        if (st == ZS_OK && !same)
            st = zs_set_error_code(ZS_ERR_FORMAT, "checkpoint: %s: '%s' has another dtype "
                                   "or shape than the model's (written for another "
                                   "model?)", path, in.name);
    }
    int n = zs_safetensors_reader_count(r);
    if (st == ZS_OK && n != p->ninfo + k)
        st = zs_set_error_code(ZS_ERR_FORMAT, "checkpoint: %s holds %d tensors, the model "
                               "and optimizer have %d", path, n, p->ninfo + k);
    return st;
}

/* Item j of f read from r, and this rank's shard copied to dst. */
static zs_status load_item(zsi_par *p, const zs_safetensors_reader *r, const zsi_pinfo *f,
                           const char *name, size_t at, zs_tensor *dst)
{
    zs_tensor *w = zs_empty(ZS_F32, f->ndim, f->shape);
    zs_status st = w ? zs_safetensors_reader_read(r, name, at, zs_data(w),
                                                  (size_t)f->numel * 4)
                     : ZS_ERR_NOMEM;
    zs_tensor *sh = st == ZS_OK ? shard(p, w, f->name) : NULL;
    if (st == ZS_OK && (!sh || zs_numel(sh) != zs_numel(dst)))
        st = zs_set_error("checkpoint: %s: the shard does not fit the part", f->name);
    if (st == ZS_OK)
        memcpy(zs_data(dst), zs_data(sh), zs_nbytes(sh));
    zs_release(sh);
    zs_release(w);
    return st;
}

zs_status zsi_par_load(zs_trainer *t, const char *path, zs_optim *local, char **meta)
{
    zsi_par *p = t->par;
    char names[MAX_MOMENTS][48];
    int k = moments(local, names);
    zs_safetensors_reader *r = zs_safetensors_open(path);
    zs_status st = r ? check_file(p, r, path, k, names) : ZS_ERR_IO;
    zs_no_grad_push();
    for (int i = 0; st == ZS_OK && i < p->ninfo; i++) {
        const zsi_pinfo *f = &p->info[i];
        if (f->local < 0)
            continue;
        zs_tensor *mine = t->m->params[f->local];
        st = load_item(p, r, f, f->name, 0, mine);
        for (int j = 0; st == ZS_OK && j < k; j++) {
            zs_tensor *v = flat_view(zs_optim_moment(local, j, 0), offset_in(t->fp, mine),
                                     mine);
            st = v ? load_item(p, r, f, names[j], (size_t)f->off * 4, v) : ZS_ERR_NOMEM;
            zs_release(v);
        }
    }
    zs_no_grad_pop();
    const char *m = r ? zs_safetensors_reader_metadata(r) : NULL;
    if (st == ZS_OK && meta && m && !(*meta = strdup(m)))
        st = zs_set_error_code(ZS_ERR_NOMEM, "checkpoint: out of memory");
    zs_safetensors_reader_close(r);
    st = agree(p, st);
    if (st != ZS_OK && meta) {
        free(*meta);
        *meta = NULL;
    }
    return st;
}
