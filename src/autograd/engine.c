/*
 * engine.c - the eager backward engine, grad mode and node lifetime.
 *
 * zs_backward(root) counts, for every node reachable from root's node, how
 * many consumers inside the graph will send it a gradient, then processes
 * nodes in Kahn order from the root: a node runs its backward rule once all
 * of its consumers have contributed to its gout. Leaf gradients accumulate
 * into .grad in place, so a training loop reuses the same gradient memory.
 * Unless keep_graph, each node drops its saved tensors once used and is
 * marked freed; a later backward through it fails with a message.
 *
 * Threads: node reference counts and the live-node count are atomic, so
 * graphs of different threads may share nodes' inputs; one backward walks
 * its graph's scratch fields (deps, visit, gout, leaves' grad_pending)
 * unlocked, so two threads must not backpropagate through a shared node
 * or into a shared leaf at once (zs/core.h, "Threads").
 */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/node.h"
#include "core/internal.h"
#include "zs/autograd.h"
#include "zs/ops.h"

/* This thread's grad-ready hooks, in registration order. The array is
 * freed when the last hook goes, so a thread leaves nothing behind. */
typedef struct ready_hook {
    zs_grad_ready_fn fn;
    void *ctx;
    int id;
} ready_hook;
static _Thread_local ready_hook *hooks;
static _Thread_local int nhooks, cap_hooks, last_hook_id;

int zs_grad_ready_hook_add(zs_grad_ready_fn fn, void *ctx)
{
    if (!fn)
        return zs_set_error("grad_ready_hook_add: no function");
    if (nhooks == cap_hooks) {
        int cap = cap_hooks ? 2 * cap_hooks : 4;
        ready_hook *h = realloc(hooks, (size_t)cap * sizeof *h);
        if (!h)
            return zs_set_error_code(ZS_ERR_NOMEM, "grad_ready_hook_add: out of memory");
        hooks = h;
        cap_hooks = cap;
    }
    if (last_hook_id == INT_MAX)
        last_hook_id = 0;
    hooks[nhooks++] = (ready_hook){fn, ctx, ++last_hook_id};
    return last_hook_id;
}

zs_status zs_grad_ready_hook_remove(int id)
{
    for (int i = 0; i < nhooks; i++)
        if (hooks[i].id == id) {
            memmove(&hooks[i], &hooks[i + 1], (size_t)(nhooks - i - 1) * sizeof *hooks);
            if (--nhooks == 0) {
                free(hooks);
                hooks = NULL;
                cap_hooks = 0;
            }
            return ZS_OK;
        }
    return zs_set_error("grad_ready_hook_remove: no hook %d on this thread", id);
}
static atomic_llong live_nodes; /* every thread's nodes (relaxed counts) */

int64_t zs_autograd_live_nodes(void)
{
    return atomic_load_explicit(&live_nodes, memory_order_relaxed);
}

zs_status zs_set_requires_grad(zs_tensor *t, bool on)
{
    if (!t)
        return ZS_ERR_ARG;
    if (t->node)
        return zs_set_error("set_requires_grad: tensor is not a leaf (it was "
                            "made by %s)", t->node->c.op->name);
    if (on && !zs_dtype_is_float(t->dtype))
        return zs_set_error("set_requires_grad: dtype %s cannot require grad, "
                            "expected a float dtype", zs_dtype_name(t->dtype));
    t->requires_grad = on;
    return ZS_OK;
}

zs_status zs_retain_grad(zs_tensor *t)
{
    if (!t)
        return ZS_ERR_ARG;
    if (!zs_requires_grad(t))
        return zs_set_error("retain_grad: tensor does not require grad");
    t->retains_grad = true;
    if (t->node)
        t->node->retain_target = t;
    return ZS_OK;
}

zs_tensor *zs_grad(const zs_tensor *t) { return t ? t->grad : NULL; }

void zs_zero_grad(zs_tensor *t, bool set_to_none)
{
    if (!t || !t->grad)
        return;
    if (set_to_none) {
        zs_release(t->grad);
        t->grad = NULL;
    } else {
        zs_fill_(t->grad, 0.0);
    }
}

/* ---- nodes ----------------------------------------------------------- */

static void node_hook(zs_tensor *t)
{
    if (t->node->retain_target == t)
        t->node->retain_target = NULL;
    zsi_node_release(t->node);
}

void zsi_node_retain(zsi_node *n) { zsi_ref_inc(&n->refcount); }

static void node_drop_saved(zsi_node *n)
{
    for (int k = 0; k < ZSI_MAX_SAVED; k++) {
        zs_release(n->c.saved[k]);
        n->c.saved[k] = NULL;
    }
}

void zsi_node_release(zsi_node *n)
{
    /* Iterative over the chain of single-consumer inputs to bound the stack
     * depth of long graphs (one level per branch, not per node). */
    while (n && zsi_ref_dec(&n->refcount)) {
        zsi_node *next = NULL;
        node_drop_saved(n);
        zs_release(n->gout);
        for (int i = 0; i < n->c.nin; i++) {
            zs_release(n->in_leaf[i]);
            if (n->in_node[i]) {
                if (!next)
                    next = n->in_node[i];
                else
                    zsi_node_release(n->in_node[i]);
            }
        }
        if (n->extra_free)
            n->extra_free(n->c.extra);
        else
            free(n->c.extra);
        free(n);
        atomic_fetch_sub_explicit(&live_nodes, 1, memory_order_relaxed);
        n = next;
    }
}

static void meta_of(zsi_meta *m, const zs_tensor *t)
{
    m->dtype = t->dtype;
    m->ndim = t->ndim;
    memcpy(m->shape, t->shape, sizeof m->shape);
}

/* The recorder installed in the operator layer (ops/op.h): one allocation
 * holds the node and its per-input arrays. */
static zs_status record(zsi_op *op, zs_tensor *out, int nin, zs_tensor *const *in,
                        zsi_ctx **ctx)
{
    *ctx = NULL;
    if (!zs_grad_enabled())
        return ZS_OK;
    bool any = false;
    for (int i = 0; i < nin; i++)
        any = any || zs_requires_grad(in[i]);
    if (!any)
        return ZS_OK;
    size_t un = (size_t)nin;
    zsi_node *n = calloc(1, sizeof *n + un * (sizeof *n->in_node +
                         sizeof *n->in_leaf + sizeof *n->c.in_meta + 1));
    if (!n)
        return zs_set_error_code(ZS_ERR_NOMEM, "%s: out of memory recording "
                                 "the autograd node", op->name);
    n->c.in_meta = (zsi_meta *)(n + 1);
    n->in_node = (zsi_node **)(n->c.in_meta + un);
    n->in_leaf = (zs_tensor **)(n->in_node + un);
    n->c.needs = (uint8_t *)(n->in_leaf + un);
    atomic_fetch_add_explicit(&live_nodes, 1, memory_order_relaxed);
    atomic_init(&n->refcount, 1);
    n->c.op = op;
    n->c.nin = nin;
    for (int i = 0; i < nin; i++) {
        meta_of(&n->c.in_meta[i], in[i]);
        if (in[i]->node) {
            n->in_node[i] = in[i]->node;
            zsi_node_retain(in[i]->node);
        } else if (in[i]->requires_grad) {
            n->in_leaf[i] = zs_retain(in[i]);
        }
        n->c.needs[i] = n->in_node[i] || n->in_leaf[i];
    }
    meta_of(&n->c.out_meta, out);
    out->node = n;
    out->requires_grad = true;
    *ctx = &n->c;
    return ZS_OK;
}

/* Both hooks are set once, before main, and only read after: no thread
 * can see them change. */
__attribute__((constructor)) static void install_recorder(void)
{
    zsi_node_release_hook = node_hook;
    zsi_set_recorder(record);
}

/* ---- backward -------------------------------------------------------- */

typedef struct vec {
    zsi_node **v;
    int64_t n, cap;
} vec;

static bool vec_push(vec *s, zsi_node *x)
{
    if (s->n == s->cap) {
        int64_t cap = s->cap ? s->cap * 2 : 256;
        zsi_node **v = realloc(s->v, (size_t)cap * sizeof *v);
        if (!v)
            return false;
        s->v = v;
        s->cap = cap;
    }
    s->v[s->n++] = x;
    return true;
}

/* Collects every node reachable from root into `all` and counts deps. */
static zs_status collect(zsi_node *root, vec *all)
{
    vec stack = {0};
    zs_status st = ZS_OK;
    root->visit = 1;
    root->deps = 0;
    if (!vec_push(&stack, root) || !vec_push(all, root))
        st = ZS_ERR_NOMEM;
    while (st == ZS_OK && stack.n > 0) {
        zsi_node *n = stack.v[--stack.n];
        for (int i = 0; i < n->c.nin; i++) {
            zsi_node *m = n->in_node[i];
            if (!m) {
                if (n->in_leaf[i])
                    n->in_leaf[i]->grad_pending++;
                continue;
            }
            if (!m->visit) {
                m->visit = 1;
                m->deps = 0;
                if (!vec_push(&stack, m) || !vec_push(all, m)) {
                    st = ZS_ERR_NOMEM;
                    break;
                }
            }
            m->deps++;
        }
    }
    free(stack.v);
    if (st != ZS_OK)
        zs_set_error_code(st, "backward: out of memory");
    return st;
}

/* The default gradient of the root: ones like it, on its device. */
static zs_tensor *seed_ones(const zs_tensor *root)
{
    if (root->device == ZS_CPU)
        return zs_ones(root->dtype, root->ndim, root->shape);
    zs_tensor *g = zs_empty_like(root);
    if (g && zs_fill_(g, 1.0) != ZS_OK) {
        zs_release(g);
        g = NULL;
    }
    return g;
}

static zs_status accumulate_leaf(zs_tensor *leaf, zs_tensor *g)
{
    if (!leaf->grad) {
        if (zsi_ref_get(&g->refcount) == 1 && zsi_ref_get(&g->storage->refcount) == 1 &&
            zs_is_contiguous(g) &&
            g->dtype == leaf->dtype && !g->node) {
            leaf->grad = zs_retain(g);
        } else {
            leaf->grad = zs_empty_like(leaf);
            if (!leaf->grad)
                return ZS_ERR_NOMEM;
            return zs_copy_(leaf->grad, g);
        }
        return ZS_OK;
    }
    return zs_axpy_(leaf->grad, 1.0, g);
}

static zs_status accumulate_node(zsi_node *m, zs_tensor *g)
{
    if (!m->gout) {
        m->gout = zs_retain(g);
        return ZS_OK;
    }
    zs_tensor *sum = zs_add(m->gout, g);
    if (!sum)
        return ZS_ERR_NOMEM;
    zs_release(m->gout);
    m->gout = sum;
    return ZS_OK;
}

static bool meta_matches(const zsi_meta *m, const zs_tensor *g)
{
    if (m->ndim != g->ndim)
        return false;
    for (int i = 0; i < m->ndim; i++)
        if (m->shape[i] != g->shape[i])
            return false;
    return true;
}

/* The sum so far of node m's gradient when the engine holds it alone (no
 * other reference to the tensor or its memory: a rule's result that is
 * also another input's gradient, as add's, is left alone), else NULL. */
static zs_tensor *sole_gout(const zsi_node *m)
{
    zs_tensor *g = m->gout;
    return g && zsi_ref_get(&g->refcount) == 1 && g->storage &&
                   zsi_ref_get(&g->storage->refcount) == 1 ? g : NULL;
}

/* The in-place gradient destinations a rule may use (zsi_grad_acc): for
 * each leaf input (at most 8 inputs) whose .grad exists, is contiguous
 * and has the input's dtype, shape and device, that .grad (a captured
 * graph records the in-place node, as it records accumulate_leaf's axpy);
 * with zsi_op.acc_nodes, outside graph capture, also a non-leaf input's
 * gradient summed so far (sole_gout; a capture records the rules' plain
 * form, which graph passes rewrite: the slices pass for slices). Adding there is what
 * accumulate_leaf's axpy or accumulate_node's add would do, without the
 * gradient's own buffer. True when one is offered. */
static bool offer_acc(const zsi_node *n, zs_tensor **acc)
{
    bool any = false, nodes = n->c.op->acc_nodes && !zsi_capture;
    if (n->c.nin > 8)
        return false;
    for (int i = 0; i < n->c.nin; i++) {
        zs_tensor *leaf = n->in_node[i] ? NULL : n->in_leaf[i];
        zs_tensor *g = leaf ? leaf->grad
                     : nodes && n->in_node[i] ? sole_gout(n->in_node[i]) : NULL;
        if (g && zsi_needs_grad(&n->c, i) && zs_is_contiguous(g) &&
            g->dtype == n->c.in_meta[i].dtype &&
            (!leaf || g->device == leaf->device) &&
            meta_matches(&n->c.in_meta[i], g)) {
            acc[i] = g;
            any = true;
        }
    }
    return any;
}

/* After node n ran: each leaf input has one gradient fewer to wait for;
 * the hook hears of those with none left (only while all is well). */
static void leaves_done(zsi_node *n, zs_status st)
{
    for (int i = 0; i < n->c.nin; i++) {
        zs_tensor *leaf = n->in_node[i] ? NULL : n->in_leaf[i];
        if (leaf && --leaf->grad_pending == 0 && nhooks && st == ZS_OK && leaf->grad)
            for (int k = 0; k < nhooks; k++)
                hooks[k].fn(hooks[k].ctx, leaf);
    }
}

static zs_status run_node(zsi_node *n, bool keep_graph)
{
    if (n->freed)
        return zs_set_error_code(ZS_ERR_STATE,
                                 "backward: the graph through '%s' was freed "
                                 "by an earlier backward; pass keep_graph to "
                                 "backpropagate twice", n->c.op->name);
    zs_status st = ZS_OK;
    if (n->retain_target && n->gout) {
        zs_release(n->retain_target->grad);
        n->retain_target->grad = zs_contiguous(n->gout);
    }
    zs_tensor *stack_gin[8], **gin = stack_gin;
    if (n->c.nin > 8 && !(gin = calloc((size_t)n->c.nin, sizeof *gin)))
        return zs_set_error_code(ZS_ERR_NOMEM, "backward: out of memory");
    memset(gin, 0, (size_t)(n->c.nin < 8 ? 8 : n->c.nin) * sizeof *gin);
    if (n->gout) {
        if (!n->c.op->backward) {
            st = zs_set_error("backward: operator '%s' is not differentiable",
                              n->c.op->name);
        } else {
            zs_tensor *acc[8] = {0};
            if (offer_acc(n, acc))
                n->c.acc = acc;
            zs_alloc_tag_push(n->c.op->name); /* the peak report's attribution */
            st = n->c.op->backward(&n->c, n->gout, gin);
            zs_alloc_tag_pop();
            n->c.acc = NULL;
        }
    }
    zs_alloc_tag_push("accumulate");
    for (int i = 0; st == ZS_OK && i < n->c.nin; i++) {
        if (!gin[i] || !zsi_needs_grad(&n->c, i))
            continue;
        if (!meta_matches(&n->c.in_meta[i], gin[i])) {
            st = zs_set_error_code(ZS_ERR_STATE, "backward: '%s' produced a "
                                   "gradient of the wrong shape for input %d",
                                   n->c.op->name, i);
        } else if (n->in_node[i]) {
            st = accumulate_node(n->in_node[i], gin[i]);
        } else {
            st = accumulate_leaf(n->in_leaf[i], gin[i]);
        }
    }
    zs_alloc_tag_pop();
    leaves_done(n, st);
    for (int i = 0; i < n->c.nin; i++)
        zs_release(gin[i]);
    if (gin != stack_gin)
        free(gin);
    zs_release(n->gout);
    n->gout = NULL;
    if (!keep_graph) {
        node_drop_saved(n);
        n->freed = true;
    }
    return st;
}

zs_status zs_backward(zs_tensor *root, zs_tensor *grad, bool keep_graph)
{
    if (!root)
        return ZS_ERR_ARG;
    if (!zs_requires_grad(root))
        return zs_set_error("backward: tensor does not require grad (no "
                            "input of the computation had requires_grad)");
    if (grad && (!zs_same_shape(grad, root) || grad->dtype != root->dtype)) {
        char a[96], b[96];
        return zs_set_error("backward: gradient %s %s does not match root "
                            "%s %s", zs_shape_str(grad, a, sizeof a),
                            zs_dtype_name(grad->dtype),
                            zs_shape_str(root, b, sizeof b),
                            zs_dtype_name(root->dtype));
    }
    if (!grad && zs_numel(root) != 1)
        return zs_set_error("backward: root has %lld elements; pass a "
                            "gradient for a non-scalar root",
                            (long long)zs_numel(root));
    zsi_tracking_pause();
    zs_no_grad_push();
    /* backward rules run in the dtypes forward saved: autocast off, as
     * PyTorch runs backward outside the autocast region */
    bool amp_off = zs_autocast_dtype() != ZS_F32 && zs_autocast_push(ZS_F32) == ZS_OK;
    zs_tensor *g = grad ? zs_retain(grad) : seed_ones(root);
    zs_status st = g ? ZS_OK : ZS_ERR_NOMEM;
    if (st == ZS_OK && !root->node) {
        st = accumulate_leaf(root, g);
        zs_release(g);
        goto out;
    }
    vec all = {0};
    if (st == ZS_OK)
        st = collect(root->node, &all);
    if (st == ZS_OK) {
        root->node->gout = g;
        g = NULL;
        /* Kahn order: ready holds nodes whose consumers are all done. */
        vec ready = {0};
        if (!vec_push(&ready, root->node))
            st = zs_set_error_code(ZS_ERR_NOMEM, "backward: out of memory");
        while (st == ZS_OK && ready.n > 0) {
            zsi_node *n = ready.v[--ready.n];
            st = run_node(n, keep_graph);
            for (int i = 0; st == ZS_OK && i < n->c.nin; i++) {
                zsi_node *m = n->in_node[i];
                if (m && --m->deps == 0 && !vec_push(&ready, m))
                    st = zs_set_error_code(ZS_ERR_NOMEM, "backward: out of memory");
            }
        }
        free(ready.v);
    }
    zs_release(g);
    for (int64_t i = 0; i < all.n; i++) {
        zsi_node *n = all.v[i];
        n->visit = 0;
        if (st != ZS_OK) {
            zs_release(n->gout);
            n->gout = NULL;
            for (int k = 0; k < n->c.nin; k++) /* nodes that never ran */
                if (!n->in_node[k] && n->in_leaf[k])
                    n->in_leaf[k]->grad_pending = 0;
        }
    }
    free(all.v);
out:
    if (amp_off)
        zs_autocast_pop();
    zs_no_grad_pop();
    zsi_tracking_resume();
    return st;
}
