/*
 * grad_mode.c - grad mode (nestable no-grad regions, per thread) and
 * whether a tensor takes part in autograd.
 *
 * This state sits in core because both operators (which decide whether to
 * keep what a backward needs) and autograd (which records and walks the
 * graph) read it, and operators must not depend on autograd.
 */
#include "core/internal.h"

static _Thread_local int no_grad_depth;

void zs_no_grad_push(void) { no_grad_depth++; }

void zs_no_grad_pop(void)
{
    if (no_grad_depth > 0)
        no_grad_depth--;
}

bool zs_grad_enabled(void) { return no_grad_depth == 0; }

bool zs_requires_grad(const zs_tensor *t)
{
    return t && (t->requires_grad || t->node);
}

bool zsi_grad_needed(const zs_tensor *t)
{
    return no_grad_depth == 0 && zs_requires_grad(t);
}
