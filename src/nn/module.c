/*
 * module.c - the module tree: parameters, buffers, children, traversal,
 * training mode, and flattening parameters/gradients into flat buffers.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "zs/autograd.h"
#include "zs/nn.h"
#include "zs/ops.h"

/* The root's flat buffers live in a hidden impl-independent slot: they are
 * stored as buffers named "\x01flat_params" / "\x01flat_grads" would leak
 * into state dicts, so keep them in a side table keyed by module. */
typedef struct flat_entry {
    zs_module *m;
    zs_tensor *params, *grads;
    struct flat_entry *next;
} flat_entry;
/* The table is shared by every thread's modules: flats_mu guards the list
 * (an entry's module is its owner's, used by one thread at a time). */
static flat_entry *flats;
static pthread_mutex_t flats_mu = PTHREAD_MUTEX_INITIALIZER;

zs_module *zs_module_new(const zs_module_vtable *vt, void *impl)
{
    zs_module *m = calloc(1, sizeof *m);
    if (!m) {
        zs_set_error_code(ZS_ERR_NOMEM, "module: out of memory");
        return NULL;
    }
    m->vt = vt;
    m->impl = impl;
    m->training = true;
    return m;
}

static bool grow(void ***arr, char ***names, int n)
{
    void **a = realloc(*arr, (size_t)(n + 1) * sizeof **arr);
    if (a)
        *arr = a;
    char **nm = realloc(*names, (size_t)(n + 1) * sizeof **names);
    if (nm)
        *names = nm;
    return a && nm;
}

zs_tensor *zs_module_add_param(zs_module *m, const char *name, zs_tensor *t)
{
    if (!m || !t) {
        zs_release(t);
        return NULL;
    }
    zs_keep(t);
    char *nm = strdup(name);
    if (!nm || !grow((void ***)&m->params, &m->param_names, m->nparams)) {
        free(nm);
        zs_release(t);
        zs_set_error_code(ZS_ERR_NOMEM, "module: out of memory");
        return NULL;
    }
    zs_set_requires_grad(t, true);
    m->params[m->nparams] = t;
    m->param_names[m->nparams++] = nm;
    return t;
}

zs_tensor *zs_module_add_buffer(zs_module *m, const char *name, zs_tensor *t)
{
    if (!m || !t) {
        zs_release(t);
        return NULL;
    }
    zs_keep(t);
    char *nm = strdup(name);
    if (!nm || !grow((void ***)&m->buffers, &m->buffer_names, m->nbuffers)) {
        free(nm);
        zs_release(t);
        zs_set_error_code(ZS_ERR_NOMEM, "module: out of memory");
        return NULL;
    }
    m->buffers[m->nbuffers] = t;
    m->buffer_names[m->nbuffers++] = nm;
    return t;
}

zs_module *zs_module_add_child(zs_module *m, const char *name, zs_module *c)
{
    if (!m || !c) {
        zs_module_free(c);
        return NULL;
    }
    char *nm = strdup(name);
    if (!nm || !grow((void ***)&m->children, &m->child_names, m->nchildren)) {
        free(nm);
        zs_module_free(c);
        zs_set_error_code(ZS_ERR_NOMEM, "module: out of memory");
        return NULL;
    }
    m->children[m->nchildren] = c;
    m->child_names[m->nchildren++] = nm;
    return c;
}

void zs_module_free(zs_module *m)
{
    if (!m)
        return;
    flat_entry *e = NULL;
    pthread_mutex_lock(&flats_mu);
    for (flat_entry **p = &flats; *p; p = &(*p)->next) {
        if ((*p)->m == m) {
            e = *p;
            *p = e->next;
            break;
        }
    }
    pthread_mutex_unlock(&flats_mu);
    if (e) {
        zs_release(e->params);
        zs_release(e->grads);
        free(e);
    }
    for (int i = 0; i < m->nchildren; i++) {
        zs_module_free(m->children[i]);
        free(m->child_names[i]);
    }
    for (int i = 0; i < m->nparams; i++) {
        zs_release(m->params[i]);
        free(m->param_names[i]);
    }
    for (int i = 0; i < m->nbuffers; i++) {
        zs_release(m->buffers[i]);
        free(m->buffer_names[i]);
    }
    free(m->children);
    free(m->child_names);
    free(m->params);
    free(m->param_names);
    free(m->buffers);
    free(m->buffer_names);
    if (m->vt && m->vt->free_impl)
        m->vt->free_impl(m);
    free(m);
}

zs_tensor *zs_module_forward(zs_module *m, zs_tensor *x)
{
    if (!m || !x)
        return NULL;
    return m->vt->forward(m, x);
}

void zs_module_train(zs_module *m, bool training)
{
    if (!m)
        return;
    m->training = training;
    for (int i = 0; i < m->nchildren; i++)
        zs_module_train(m->children[i], training);
}

typedef struct collector {
    int n, cap;
    zs_tensor **ts;
    char **names;
    bool failed;
} collector;

static void collect_push(collector *c, const char *prefix, const char *name,
                         zs_tensor *t)
{
    if (c->n == c->cap) {
        int cap = c->cap ? 2 * c->cap : 32;
        zs_tensor **ts = realloc(c->ts, (size_t)cap * sizeof *ts);
        char **nm = realloc(c->names, (size_t)cap * sizeof *nm);
        if (ts)
            c->ts = ts;
        if (nm)
            c->names = nm;
        if (!ts || !nm) {
            c->failed = true;
            return;
        }
        c->cap = cap;
    }
    size_t len = strlen(prefix) + strlen(name) + 2;
    char *full = malloc(len);
    if (!full) {
        c->failed = true;
        return;
    }
    snprintf(full, len, "%s%s%s", prefix, *prefix ? "." : "", name);
    c->ts[c->n] = t;
    c->names[c->n++] = full;
}

static void collect(zs_module *m, const char *prefix, collector *c, bool bufs)
{
    int n = bufs ? m->nbuffers : m->nparams;
    for (int i = 0; i < n; i++)
        collect_push(c, prefix, bufs ? m->buffer_names[i] : m->param_names[i],
                     bufs ? m->buffers[i] : m->params[i]);
    for (int i = 0; i < m->nchildren; i++) {
        size_t len = strlen(prefix) + strlen(m->child_names[i]) + 2;
        char *p = malloc(len);
        if (!p) {
            c->failed = true;
            return;
        }
        snprintf(p, len, "%s%s%s", prefix, *prefix ? "." : "", m->child_names[i]);
        collect(m->children[i], p, c, bufs);
        free(p);
    }
}

static int collect_all(zs_module *m, zs_tensor ***ts, char ***names, bool bufs)
{
    collector c = {0};
    collect(m, "", &c, bufs);
    if (c.failed) {
        zs_names_free(c.n, c.ts, c.names);
        zs_set_error_code(ZS_ERR_NOMEM, "module: out of memory");
        return ZS_ERR_NOMEM;
    }
    *ts = c.ts;
    *names = c.names;
    return c.n;
}

int zs_module_parameters(zs_module *m, zs_tensor ***params, char ***names)
{
    return collect_all(m, params, names, false);
}

int zs_module_buffers(zs_module *m, zs_tensor ***bufs, char ***names)
{
    return collect_all(m, bufs, names, true);
}

void zs_names_free(int n, zs_tensor **ts, char **names)
{
    for (int i = 0; names && i < n; i++)
        free(names[i]);
    free(names);
    free(ts);
}

int64_t zs_module_num_params(zs_module *m)
{
    zs_tensor **ps;
    char **nm;
    int n = zs_module_parameters(m, &ps, &nm);
    int64_t total = 0;
    for (int i = 0; i < n; i++)
        total += zs_numel(ps[i]);
    zs_names_free(n, ps, nm);
    return total;
}

/* Re-points parameter t at flat storage: t keeps its header (so modules
 * holding it see the move) but now shares fp's storage at `offset`. */
static void rehome(zs_tensor *t, zs_tensor *flat, int64_t offset)
{
    zs_tensor *src = zs_detach(t); /* keeps the old storage alive */
    zs_storage *old = t->storage;
    t->storage = flat->storage;
    zsi_storage_retain(t->storage);
    t->offset = offset;
    zsi_contig_strides(t->ndim, t->shape, t->strides);
    zs_copy_(t, src);
    zs_release(src);
    zsi_storage_release(old); /* frees it when the module held the last */
}

zs_status zs_module_flatten(zs_module *m, zs_tensor **flat_params,
                            zs_tensor **flat_grads)
{
    zs_tensor **ps;
    char **nm;
    int n = zs_module_parameters(m, &ps, &nm);
    if (n < 0)
        return n;
    int64_t total = 0;
    zs_status st = ZS_OK;
    int dev = n ? (int)ps[0]->device : ZS_CPU;
    for (int i = 0; i < n; i++) {
        if (ps[i]->dtype != ZS_F32)
            st = zs_set_error("flatten: parameter %s is %s, expected f32",
                              nm[i], zs_dtype_name(ps[i]->dtype));
        else if ((int)ps[i]->device != dev)
            st = zs_set_error("flatten: parameter %s is on %s, %s on %s: "
                              "move the module with zs_module_to_device",
                              nm[i], zs_device_name(ps[i]->device), nm[0],
                              zs_device_name(dev));
        total += zs_numel(ps[i]);
    }
    flat_entry *e = st == ZS_OK ? calloc(1, sizeof *e) : NULL;
    zsi_tracking_pause();
    if (e) {
        e->params = zs_zeros_on(dev, ZS_F32, 1, &total);
        e->grads = flat_grads ? zs_zeros_on(dev, ZS_F32, 1, &total) : NULL;
    }
    zsi_tracking_resume();
    if (st == ZS_OK && (!e || !e->params || (flat_grads && !e->grads))) {
        st = ZS_ERR_NOMEM;
        if (e) {
            zs_release(e->params);
            zs_release(e->grads);
        }
        free(e);
    }
    if (st == ZS_OK) {
        int64_t off = 0;
        for (int i = 0; i < n; i++) {
            rehome(ps[i], e->params, off);
            zs_release(ps[i]->grad);
            ps[i]->grad = NULL;
            zsi_tracking_pause();
            if (e->grads)
                ps[i]->grad = zsi_new_view(e->grads, ps[i]->ndim, ps[i]->shape,
                                           ps[i]->strides, off);
            zsi_tracking_resume();
            off += zs_numel(ps[i]);
        }
        e->m = m;
        pthread_mutex_lock(&flats_mu);
        e->next = flats;
        flats = e;
        pthread_mutex_unlock(&flats_mu);
        *flat_params = e->params;
        if (flat_grads)
            *flat_grads = e->grads;
        zs_alloc_trim(); /* the parameters' old blocks: don't keep them resident */
    }
    zs_names_free(n, ps, nm);
    return st;
}

/* fn(t, arg) on every parameter, then every buffer of the tree, until
 * one fails. */
static zs_status each_state(zs_module *m, zs_status (*fn)(zs_tensor *, int),
                            int arg)
{
    zs_tensor **ts;
    char **nm;
    zs_status st = ZS_OK;
    for (int pass = 0; pass < 2 && st == ZS_OK; pass++) {
        int n = pass ? zs_module_buffers(m, &ts, &nm) : zs_module_parameters(m, &ts, &nm);
        if (n < 0)
            return n;
        for (int i = 0; i < n && st == ZS_OK; i++)
            st = fn(ts[i], arg);
        zs_names_free(n, ts, nm);
    }
    return st;
}

/* True when a module of the tree was flattened (its parameters are views
 * of one buffer that the root owns). */
static bool is_flat(zs_module *m)
{
    pthread_mutex_lock(&flats_mu);
    bool flat = false;
    for (flat_entry *e = flats; e && !flat; e = e->next)
        flat = e->m == m;
    pthread_mutex_unlock(&flats_mu);
    return flat;
}

/* Gives t new storage on device holding its values (a contiguous copy);
 * drops its gradient. */
static zs_status move(zs_tensor *t, int device)
{
    zsi_tracking_pause();
    zs_tensor *d = zs_to_device(t, device);
    zsi_tracking_resume();
    if (!d)
        return ZS_ERR_ARG;
    if (d->storage != t->storage) {
        zs_storage *old = t->storage;
        t->storage = d->storage;
        zsi_storage_retain(t->storage);
        t->device = d->device;
        t->offset = 0;
        memcpy(t->strides, d->strides, sizeof t->strides);
        zsi_storage_release(old);
        zs_zero_grad(t, true);
    }
    zs_release(d);
    return ZS_OK;
}

zs_status zs_module_to_device(zs_module *m, int device)
{
    if (!m)
        return zs_set_error("module_to_device: no module");
    if (!zs_device_get(device))
        return zs_set_error("module_to_device: %s (devices here: %s)",
                            zs_device_name(device), zs_device_list());
    if (is_flat(m))
        return zs_set_error("module_to_device: the module is flattened: move "
                            "it before zs_module_flatten");
    return each_state(m, move, device);
}

int zs_module_device(zs_module *m)
{
    zs_tensor **ts;
    char **nm;
    int n = m ? zs_module_parameters(m, &ts, &nm) : -1;
    int d = n > 0 ? (int)ts[0]->device : ZS_CPU;
    if (n >= 0)
        zs_names_free(n, ts, nm);
    return d;
}

/* Gives t new storage of dtype dt holding its converted values. */
static zs_status convert(zs_tensor *t, int dt)
{
    zsi_tracking_pause();
    zs_tensor *c = zs_empty_on(t->device, (zs_dtype)dt, t->ndim, t->shape);
    zs_status st = c ? zs_copy_(c, t) : ZS_ERR_NOMEM;
    if (st == ZS_OK) {
        zs_storage *old = t->storage;
        t->storage = c->storage;
        zsi_storage_retain(t->storage);
        t->dtype = (zs_dtype)dt;
        t->offset = 0;
        memcpy(t->strides, c->strides, sizeof t->strides);
        zsi_storage_release(old);
        zs_zero_grad(t, true);
    }
    zs_release(c);
    zsi_tracking_resume();
    return st;
}

zs_status zs_module_to_dtype(zs_module *m, zs_dtype dt)
{
    if (!zs_dtype_is_float(dt))
        return zs_set_error("module_to_dtype: %s is not a float dtype",
                            zs_dtype_name(dt));
    return each_state(m, convert, (int)dt);
}

void zs_module_zero_grad(zs_module *m)
{
    zs_tensor **ps;
    char **nm;
    int n = zs_module_parameters(m, &ps, &nm);
    for (int i = 0; i < n; i++)
        zs_zero_grad(ps[i], false);
    zs_names_free(n, ps, nm);
}

/* ---- units ------------------------------------------------------------- */

typedef struct unit_walk {
    zs_tensor **ts; /* every parameter of the tree, depth first */
    int *unit;      /* its unit, or -1 */
    int n, cap, units;
    bool failed;
} unit_walk;

static void walk_units(zs_module *m, int in_unit, unit_walk *w)
{
    if (in_unit < 0 && m->unit)
        in_unit = w->units++;
    for (int i = 0; i < m->nparams; i++) {
        if (w->n == w->cap) {
            int cap = w->cap ? 2 * w->cap : 64;
            zs_tensor **ts = realloc(w->ts, (size_t)cap * sizeof *ts);
            if (ts)
                w->ts = ts;
            int *u = realloc(w->unit, (size_t)cap * sizeof *u);
            if (u)
                w->unit = u;
            if (!ts || !u) {
                w->failed = true;
                return;
            }
            w->cap = cap;
        }
        w->ts[w->n] = m->params[i];
        w->unit[w->n++] = in_unit;
    }
    for (int i = 0; i < m->nchildren; i++)
        walk_units(m->children[i], in_unit, w);
}

int zs_module_units(zs_module *m, int n, zs_tensor *const *params, int *group)
{
    if (!m || n < 0 || (n > 0 && (!params || !group)))
        return zs_set_error("module_units: needs a module and n parameters");
    unit_walk w = {0};
    walk_units(m, -1, &w);
    int st = w.failed ? zs_set_error_code(ZS_ERR_NOMEM, "module_units: out of memory")
                      : w.units;
    for (int i = 0; st >= 0 && i < n; i++) {
        int j = 0;
        while (j < w.n && w.ts[j] != params[i])
            j++;
        if (j == w.n)
            st = zs_set_error("module_units: parameter %d is not in the module tree", i);
        else
            group[i] = w.unit[j];
    }
    free(w.ts);
    free(w.unit);
    return st;
}
