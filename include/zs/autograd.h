/*
 * zs/autograd.h - reverse-mode automatic differentiation (eager tape).
 *
 * Operators record a node when grad mode is on and an input requires grad.
 * zs_backward walks the nodes from the loss in reverse topological order,
 * calling each operator's backward rule (written with other operators) and
 * accumulating into the .grad of leaves that require grad. The tape is freed
 * after backward unless keep_graph is set; using it again is an error.
 */
#ifndef ZS_AUTOGRAD_H
#define ZS_AUTOGRAD_H

#include "core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Marks a leaf tensor (float dtype) as requiring grad. */
zs_status zs_set_requires_grad(zs_tensor *t, bool on);
/* zs_requires_grad, zs_no_grad_push/pop and zs_grad_enabled are in
 * zs/core.h (grad mode is core state that operators read too). */
/* A non-leaf keeps its .grad after backward. */
zs_status zs_retain_grad(zs_tensor *t);
/* Borrowed gradient, NULL if none. */
zs_tensor *zs_grad(const zs_tensor *t);
/* Zeroes .grad in place (keeps its memory); set_to_none frees it. */
void zs_zero_grad(zs_tensor *t, bool set_to_none);

/* Backpropagates from `root`. grad: d(loss)/d(root), same shape as root, or
 * NULL for a one-element root (ones). keep_graph: allow another backward
 * through the same nodes. */
zs_status zs_backward(zs_tensor *root, zs_tensor *grad, bool keep_graph);

/* Called by zs_backward on the thread running it, once per leaf and
 * backward, as soon as every gradient that backward sends the leaf has
 * been accumulated into leaf->grad (its gradient for this backward is
 * final while the rest of the graph is still being differentiated). Data
 * parallelism uses it to start reducing gradient buckets during backward.
 * The hook must not run autograd itself, nor add or remove hooks; it may
 * read leaf->grad. */
typedef void (*zs_grad_ready_fn)(void *ctx, zs_tensor *leaf);
/* Adds fn for this thread's later backward calls: every hook of the
 * thread is called for each ready leaf, in the order they were added
 * (data parallelism's, a profiler's, ...). Returns the hook's id (> 0,
 * for zs_grad_ready_hook_remove) or a negative status (fn NULL, out of
 * memory). */
int zs_grad_ready_hook_add(zs_grad_ready_fn fn, void *ctx);
/* Removes the hook with this id from this thread's list; an id that is
 * not there gives ZS_ERR_ARG and a message. */
zs_status zs_grad_ready_hook_remove(int id);

/* Number of live autograd nodes (tests check that tapes are freed). */
int64_t zs_autograd_live_nodes(void);

/* ---- gradient checking ------------------------------------------------ */

/* A function of n f64 tensors returning a new f64 tensor. */
typedef zs_tensor *(*zs_grad_fn)(void *ctx, zs_tensor **inputs);

typedef struct zs_gradcheck_result {
    double max_abs_err;   /* |analytic - numeric| */
    double max_rel_err;   /* relative to max(|numeric|, 1) */
    int worst_input;
    int64_t worst_index;
    bool ok;
} zs_gradcheck_result;

/* Compares the backward pass of fn with central differences (step eps) on
 * L = sum(fn(x) * r) for a fixed random r. Inputs with requires_grad are
 * checked; they must be f64. ok when every |a - n| <= atol + rtol * |n|.
 * Returns ZS_OK (check .ok) or an error if fn fails. */
zs_status zs_gradcheck(zs_grad_fn fn, void *ctx, int n, zs_tensor **inputs,
                       double eps, double atol, double rtol,
                       zs_gradcheck_result *res);

#ifdef __cplusplus
}
#endif
#endif
