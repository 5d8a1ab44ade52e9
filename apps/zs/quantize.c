/*
 * quantize.c - `zs quantize --ckpt IN --out DIR --type T`: a float GPT
 * checkpoint written as a quantized one (zs_llm_save) that zs generate
 * and zs serve load directly, with the tokenizer beside it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "apps/zs/commands.h"
#include "apps/zs/common.h"
#include "apps/zs/flags.h"

typedef struct quant_cfg {
    const char *ckpt, *out, *type, *calib;
    int64_t calib_tokens;
    double alpha, threshold;
} quant_cfg;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: zs quantize --ckpt IN --out DIR --type T [flags]\n"
            "  --ckpt IN          a zs train gpt directory or checkpoint (float)\n"
            "  --out DIR          writes DIR/checkpoint.safetensors and\n"
            "                     DIR/tokenizer.bpe\n"
            "  --type T           q8_0 (q8), q4_0 (q4), q4_1: llama.cpp's 32-weight\n"
            "                     blocks; int8: LLM.int8() (outliers in f32);\n"
            "                     w8a8: SmoothQuant (needs calibration text)\n"
            "  --calib FILE       w8a8: calibration text (default: the training\n"
            "                     directory's tokens.bin)\n"
            "  --calib-tokens N   w8a8: tokens to calibrate on (default 4096)\n"
            "  --alpha X          w8a8: migration strength (default 0.5)\n"
            "  --threshold X      int8: outlier threshold (default 6)\n");
}

static int parse(int argc, char **argv, quant_cfg *c)
{
    *c = (quant_cfg){.calib_tokens = 4096, .alpha = 0.5, .threshold = 6};
    flag t[] = {
        FLAG_STR("--ckpt", &c->ckpt),
        FLAG_STR("--out", &c->out),
        FLAG_STR("--type", &c->type),
        FLAG_STR("--calib", &c->calib),
        FLAG_NUM("--calib-tokens", &c->calib_tokens, 1, 1e8),
        FLAG_NUM_ABOVE("--alpha", &c->alpha, 0, 1),
        FLAG_NUM_ABOVE("--threshold", &c->threshold, 0, 1e6),
    };
    int p = flags_parse("zs quantize", t, NFLAGS(t), usage, argc, argv);
    if (p != FLAGS_OK)
        return p;
    if (!c->ckpt || !c->out || !c->type)
        return flags_error("zs quantize", "--ckpt, --out and --type are required "
                           "(see zs quantize --help)");
    return FLAGS_OK;
}

/* Calibration tokens: the --calib text, or the start of the training
 * directory's token file. *ids is malloc'd. */
static zs_status calibration(const quant_cfg *c, const zs_bpe *bpe, int32_t **ids,
                             int64_t *n)
{
    if (c->calib) {
        size_t len, k;
        char *text = app_read_corpus(c->calib, &len);
        zs_status s = text ? zs_bpe_encode(bpe, text, len, 0, ids, &k) : ZS_ERR_IO;
        free(text);
        *n = s == ZS_OK ? ((int64_t)k < c->calib_tokens ? (int64_t)k : c->calib_tokens) : 0;
        return s;
    }
    zs_text_corpus tc;
    if (zs_text_corpus_open(c->ckpt, 2, &tc) != ZS_OK)
        return zs_set_error("w8a8 needs calibration text: --calib FILE (%s)",
                            zs_last_error());
    int64_t k = tc.train.n < c->calib_tokens ? tc.train.n : c->calib_tokens;
    *ids = malloc((size_t)(k ? k : 1) * sizeof **ids);
    for (int64_t i = 0; *ids && i < k; i++)
        (*ids)[i] = zs_tokens_at(&tc.train, i);
    zs_text_corpus_close(&tc);
    *n = k;
    return *ids ? ZS_OK : zs_set_error_code(ZS_ERR_NOMEM, "out of memory");
}

static int quantize(const quant_cfg *c, zs_model_file *f, zs_llm_options *o)
{
    int32_t *calib = NULL;
    if (o->quant == ZS_QUANT_W8A8 && calibration(c, f->tokenizer, &calib, &o->n_calib) != ZS_OK)
        return 2;
    o->calib = calib;
    double t0 = app_now();
    zs_llm *m = zs_llm_from_gpt(f->model, o);
    free(calib);
    if (!m)
        return 2;
    char path[4200], src[4001], meta[4400];
    snprintf(path, sizeof path, "%s/checkpoint.safetensors", c->out);
    snprintf(src, sizeof src, "%s", c->ckpt);
    for (char *q = src; *q; q++) /* keep the JSON valid for any path */
        *q = *q == '"' || *q == '\\' || (unsigned char)*q < 32 ? '_' : *q;
    snprintf(meta, sizeof meta, "{\"quantized_from\":\"%s\"}", src);
    zs_status s = app_make_outdir(c->out);
    if (s == ZS_OK)
        s = zs_llm_save(m, path, meta);
    snprintf(path, sizeof path, "%s/tokenizer.bpe", c->out);
    if (s == ZS_OK)
        s = zs_bpe_save(f->tokenizer, path);
    if (s == ZS_OK)
        printf("%s: %s, %lld parameters, %.1f MB of weights read per token (f32 %.1f "
               "MB), %.1f s\n", c->out, zs_quant_name(o->quant),
               (long long)zs_module_num_params(f->model),
               (double)zs_llm_weight_bytes(m) / 1e6,
               (double)zs_module_num_params(f->model) * 4 / 1e6, app_now() - t0);
    zs_llm_free(m);
    return s == ZS_OK ? 0 : 1;
}

int cmd_quantize(int argc, char **argv)
{
    quant_cfg c;
    int p = parse(argc, argv, &c);
    if (p != FLAGS_OK)
        return flags_exit(p);
    zs_llm_options o = {.int8_threshold = (float)c.threshold, .smooth_alpha = c.alpha};
    zs_model_file f = {0};
    int rc = zs_quant_parse(c.type, &o.quant) == ZS_OK ? 0 : 2;
    if (!rc && o.quant == ZS_QUANT_NONE) {
        zs_set_error("--type %s: nothing to quantize", c.type);
        rc = 2;
    }
    if (!rc && zs_model_open(c.ckpt, &f) != ZS_OK)
        rc = 2;
    if (!rc && strcmp(f.kind, "gpt")) {
        zs_set_error("%s holds a %s, not a GPT", c.ckpt, f.kind);
        rc = 2;
    }
    if (!rc)
        rc = quantize(&c, &f, &o);
    if (rc)
        fprintf(stderr, "zs quantize: %s\n", zs_last_error());
    zs_model_close(&f);
    return rc;
}
