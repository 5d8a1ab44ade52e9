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

/* ---- activation recomputation ----------------------------------------- */

/* Runs fn(ctx, inputs) (a zs_grad_fn: a new tensor from n tensors) under
 * no-grad, keeping none of its intermediates, and returns its result as a
 * new tensor (a fresh header, never one of the inputs) with one autograd
 * node "checkpoint" whose inputs are `inputs`. Its backward runs fn again
 * from the saved inputs with grad mode on, the global RNG stream set back
 * to where it was (zs_rng_get_state), so dropout draws the same masks,
 * and back-propagates the output gradient through the recomputed graph:
 * into the inputs that require grad (as the node's input gradients) and
 * into the .grad of every other leaf fn used (parameters reached through
 * ctx). fn's operators go through the operator driver both times, so a
 * region runs on any device and recomputes bit-identical values.
 *
 * Contracts: fn must compute the same shapes each time, may be called
 * again during backward (ctx, borrowed, must live until then) and
 * returns a new reference (or leaves temporaries to the current scope:
 * the backward gives it a scope of its own). n <= 64 inputs (NULL inputs
 * pass the first error on). Saved: aliases of the inputs, kept until the
 * node goes (as a keep_graph backward needs them).
 *
 * Differences from torch.utils.checkpoint (use_reentrant=False): the node
 * is recorded only when grad mode is on and an input requires grad (as
 * use_reentrant=True: a region whose only gradient path is a parameter
 * reached through ctx needs an input that requires grad, or the
 * parameters passed as inputs); the parameters' gradients are accumulated
 * by a nested zs_backward inside the node's backward (the reentrant
 * scheme), so a grad-ready hook hears of them from there; there is no
 * early stop of the recomputation and no determinism check beyond the
 * output's shape; the RNG state saved is the global stream's only
 * (operators given explicit seeds repeat anyway). */
zs_tensor *zs_checkpoint(zs_grad_fn fn, void *ctx, int n, zs_tensor **inputs);

/* A region with several outputs: fills out[0..nout) with new references,
 * returns ZS_OK or a negative status (message set). */
typedef zs_status (*zs_region_fn)(void *ctx, zs_tensor **inputs, int nout,
                                  zs_tensor **out);
/* zs_checkpoint for nout (1..64) outputs of one dtype and device: they are
 * copied into one flat buffer that carries the node, and outputs[k]
 * receive differentiable views of it (new references; all NULL on
 * failure). The backward recomputes all of them once. */
zs_status zs_checkpoint_n(zs_region_fn fn, void *ctx, int n, zs_tensor **inputs,
                          int nout, zs_tensor **outputs);

#ifdef __cplusplus
}
#endif
#endif
