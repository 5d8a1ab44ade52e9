/*
 * data.c - ready-made pieces for zs_trainer: batches and validation over
 * a token file, the classifier loss, and a GPT's model FLOPs per token.
 */
#include <math.h>

#include "zs/ops.h"
#include "zs/train.h"

zs_status zs_token_batch(void *src, int64_t index, zs_tensor **x, zs_tensor **y)
{
    const zs_token_source *s = src;
    return zs_tokens_sample(s->tokens, s->batch, s->seq, s->seed, (uint64_t)index, x, y);
}

double zs_token_eval(void *src, zs_module *m)
{
    const zs_token_source *s = src;
    int64_t n = s->eval_batches > 0 ? s->eval_batches : 1;
    double sum = 0;
    zs_status st = ZS_OK;
    for (int64_t b = 0; st == ZS_OK && b < n; b++) {
        zs_scope_push();
        zs_tensor *x, *y, *l = NULL;
        st = zs_token_batch(src, b, &x, &y);
        int dev = zs_module_device(m); /* the batch goes where the model is */
        if (st == ZS_OK && !(l = zs_gpt_loss(m, zs_to_device(x, dev),
                                             zs_to_device(y, dev))))
            st = ZS_ERR_STATE;
        if (st == ZS_OK)
            sum += zs_item(l);
        zs_scope_pop();
    }
    return st == ZS_OK ? sum / (double)n : NAN;
}

zs_tensor *zs_classifier_loss(void *ctx, zs_module *m, zs_tensor *x, zs_tensor *y)
{
    (void)ctx;
    return zs_cross_entropy(zs_module_forward(m, x), y, -100);
}

double zs_gpt_train_flops_per_token(const zs_gpt_config *g, int64_t seq)
{
    double n = (double)zs_gpt_param_count(g);
    if (g->arch == ZS_GPT2) /* the position embedding is a lookup */
        n -= (double)(g->ctx * g->width);
    return 6 * n + 6.0 * (double)(g->layers * seq * g->width);
}
