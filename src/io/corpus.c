/*
 * corpus.c - a tokenized corpus on disk (zs/text.h): a trained BPE and
 * the token file of the text, split for training and validation.
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "zs/text.h"

#define VAL_FRACTION 0.1

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Whether n tokens, split as zs_tokens_split does, leave both halves a
 * window; an error otherwise. */
static zs_status fits(int64_t n, int64_t window)
{
    int64_t val = (int64_t)((double)n * VAL_FRACTION), train = n - val;
    if (val >= window && train >= window)
        return ZS_OK;
    return zs_set_error("corpus too small: %lld train / %lld validation tokens for "
                        "sequences of %lld (give a longer text or a smaller --seq)",
                        (long long)train, (long long)val, (long long)window - 1);
}

static zs_status split(zs_text_corpus *c, int64_t window)
{
    zs_status st = fits(c->all.n, window);
    if (st == ZS_OK)
        st = zs_tokens_split(&c->all, VAL_FRACTION, &c->train, &c->val);
    if (st != ZS_OK)
        zs_text_corpus_close(c);
    return st;
}

zs_status zs_text_corpus_open(const char *dir, int64_t window, zs_text_corpus *out)
{
    char path[4200];
    *out = (zs_text_corpus){.reused = true};
    snprintf(path, sizeof path, "%s/tokenizer.bpe", dir);
    if (!(out->bpe = zs_bpe_load(path)))
        return ZS_ERR_IO;
    snprintf(path, sizeof path, "%s/tokens.bin", dir);
    zs_status st = zs_tokens_open(path, &out->all);
    if (st != ZS_OK) {
        zs_text_corpus_close(out);
        return st;
    }
    return split(out, window);
}

zs_status zs_text_corpus_make(const char *dir, const char *text, size_t n,
                              int32_t vocab, int64_t window, zs_text_corpus *out)
{
    char path[4200];
    *out = (zs_text_corpus){.text_bytes = n};
    double t0 = now();
    if (!(out->bpe = zs_bpe_train(text, n, vocab)))
        return ZS_ERR_ARG;
    double t1 = now();
    int32_t *ids = NULL;
    size_t nid = 0;
    zs_status st = zs_bpe_encode(out->bpe, text, n, 0, &ids, &nid);
    out->train_s = t1 - t0;
    out->encode_s = now() - t1;
    if (st == ZS_OK)
        st = fits((int64_t)nid, window);
    snprintf(path, sizeof path, "%s/tokenizer.bpe", dir);
    if (st == ZS_OK)
        st = zs_bpe_save(out->bpe, path);
    snprintf(path, sizeof path, "%s/tokens.bin", dir);
    if (st == ZS_OK)
        st = zs_tokens_write(path, ids, (int64_t)nid, zs_bpe_vocab_size(out->bpe));
    free(ids);
    if (st == ZS_OK)
        st = zs_tokens_open(path, &out->all);
    if (st != ZS_OK) {
        zs_text_corpus_close(out);
        return st;
    }
    return split(out, window);
}

void zs_text_corpus_close(zs_text_corpus *c)
{
    zs_tokens_close(&c->all);
    zs_bpe_free(c->bpe);
    *c = (zs_text_corpus){0};
}
