/*
 * checkpoint.c - a module (and optimizer) to and from a safetensors file.
 *
 * Loading is all-or-nothing: every tensor is checked against the model
 * before the first byte is copied, so a mismatched checkpoint leaves the
 * model as it was.
 */
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "nn/internal.h"
#include "zs/io.h"
#include "zs/nn.h"
#include "zs/ops.h"
#include "zs/optim.h"

#define MAX_OPT 512

typedef struct entries {
    int n;
    const char **names;
    zs_tensor **ts;
    char **owned; /* names we allocated */
    int nowned;
} entries;

static void entries_free(entries *e)
{
    for (int i = 0; i < e->nowned; i++)
        free(e->owned[i]);
    free(e->owned);
    free(e->names);
    free(e->ts);
    memset(e, 0, sizeof *e);
}

/* Gathers params, buffers and optimizer state with their file names. */
static zs_status gather(zs_module *m, zs_optim *o, entries *e)
{
    memset(e, 0, sizeof *e);
    zs_tensor **ps = NULL, **bs = NULL;
    char **pn = NULL, **bn = NULL;
    int np = zs_module_parameters(m, &ps, &pn);
    int nb = np < 0 ? -1 : zs_module_buffers(m, &bs, &bn);
    if (np < 0 || nb < 0) {
        zs_names_free(np > 0 ? np : 0, ps, pn);
        return ZS_ERR_NOMEM;
    }
    const char *on[MAX_OPT];
    zs_tensor *ot[MAX_OPT];
    int no = o ? zs_optim_state(o, MAX_OPT, on, ot) : 0;
    int total = np + nb + no;
    e->names = calloc((size_t)total + 1, sizeof *e->names);
    e->ts = calloc((size_t)total + 1, sizeof *e->ts);
    e->owned = calloc((size_t)total + 1, sizeof *e->owned);
    zs_status st = (e->names && e->ts && e->owned) ? ZS_OK : ZS_ERR_NOMEM;
    for (int i = 0; st == ZS_OK && i < total; i++) {
        const char *src = i < np ? pn[i] : i < np + nb ? bn[i - np] : on[i - np - nb];
        size_t len = strlen(src) + 8;
        char *name = malloc(len);
        if (!name) {
            st = ZS_ERR_NOMEM;
            break;
        }
        snprintf(name, len, "%s%s", i >= np + nb ? "optim." : "", src);
        e->owned[e->nowned++] = name;
        e->names[i] = name;
        e->ts[i] = i < np ? ps[i] : i < np + nb ? bs[i - np] : ot[i - np - nb];
        e->n++;
    }
    zs_names_free(np, ps, pn);
    zs_names_free(nb, bs, bn);
    if (st != ZS_OK) {
        entries_free(e);
        zs_set_error_code(st, "checkpoint: out of memory");
    }
    return st;
}

zs_status zs_module_save(const char *path, zs_module *m, zs_optim *o,
                             const char *metadata_json)
{
    entries e;
    zs_status st = gather(m, o, &e);
    if (st != ZS_OK)
        return st;
    st = zs_safetensors_save(path, e.n, e.names, e.ts, metadata_json);
    entries_free(&e);
    return st;
}

zs_status zsi_module_state_apply(const char *path, const zs_tensor_set *set,
                               zs_module *m, zs_optim *o, char **metadata_json)
{
    entries e;
    zs_status st = gather(m, o, &e);
    for (int i = 0; st == ZS_OK && i < e.n; i++) {
        zs_tensor *src = zs_tensor_set_get(set, e.names[i]);
        char a[96], b[96];
        if (!src)
            st = zs_set_error_code(ZS_ERR_FORMAT, "checkpoint: %s has no tensor "
                                   "'%s' (written for another model?)", path,
                                   e.names[i]);
        else if (!zs_same_shape(src, e.ts[i]) || src->dtype != e.ts[i]->dtype)
            st = zs_set_error_code(ZS_ERR_FORMAT, "checkpoint: %s: '%s' is %s %s, "
                                   "the model expects %s %s", path, e.names[i],
                                   zs_shape_str(src, a, sizeof a),
                                   zs_dtype_name(src->dtype),
                                   zs_shape_str(e.ts[i], b, sizeof b),
                                   zs_dtype_name(e.ts[i]->dtype));
    }
    int expected = st == ZS_OK ? e.n : 0, present = set->n;
    for (int i = 0; !o && i < set->n; i++) /* optimizer state not asked for */
        present -= strncmp(set->names[i], "optim.", 6) == 0;
    if (st == ZS_OK && present != expected)
        st = zs_set_error_code(ZS_ERR_FORMAT, "checkpoint: %s holds %d tensors, "
                               "the model and optimizer have %d", path, present,
                               expected);
    for (int i = 0; st == ZS_OK && i < e.n; i++)
        st = zs_copy_(e.ts[i], zs_tensor_set_get(set, e.names[i]));
    if (st == ZS_OK && metadata_json) {
        *metadata_json = set->metadata_json ? strdup(set->metadata_json) : NULL;
        if (set->metadata_json && !*metadata_json)
            st = zs_set_error_code(ZS_ERR_NOMEM, "checkpoint: out of memory");
    }
    if (e.names)
        entries_free(&e);
    return st;
}

zs_status zs_module_load(const char *path, zs_module *m, zs_optim *o,
                             char **metadata_json)
{
    zs_tensor_set set;
    zs_status st = zs_safetensors_load(path, &set);
    if (st != ZS_OK)
        return st;
    st = zsi_module_state_apply(path, &set, m, o, metadata_json);
    zs_tensor_set_free(&set);
    return st;
}
