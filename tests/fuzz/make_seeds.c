/*
 * make_seeds.c - writes the seed corpora of the fuzz harnesses: a few small
 * valid inputs per target under DIR/<name>/, made with the library's own
 * writers (or, for IDX and GPT-2's files, by the formats' definitions), so
 * that fuzzing starts past the parsers' first checks. ctest runs it as the
 * fixture of the fuzz_regress_* tests; scripts/test.sh --fuzz before a
 * campaign.
 *
 *   make_seeds DIR      exit 0, or 1 with a message naming what failed
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

#include "zs/analyze.h"
#include "zs/io.h"
#include "zs/infer.h"
#include "zs/nn.h"
#include "zs/optim.h"
#include "zs/text.h"

static const char *root;

static void fail(const char *what)
{
    const char *e = zs_last_error();
    fprintf(stderr, "make_seeds: %s%s%s\n", what, *e ? ": " : "", e);
    exit(1);
}

#define CHECK(cond, what)                                                  \
    do {                                                                   \
        if (!(cond))                                                       \
            fail(what);                                                    \
    } while (0)

/* DIR/<target>/<file>, with DIR/<target> created; a static buffer. */
static const char *seed_path(const char *target, const char *file)
{
    static char path[4096];
    snprintf(path, sizeof path, "%s/%s", root, target);
    CHECK(mkdir(path, 0755) == 0 || errno == EEXIST, path);
    snprintf(path, sizeof path, "%s/%s/%s", root, target, file);
    return path;
}

static void write_file(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    CHECK(f && fwrite(data, 1, n, f) == n && fclose(f) == 0, path);
}

/* ---- safetensors ------------------------------------------------------- */

static void seed_safetensors(void)
{
    const char *names[] = {"w", "half", "bf", "ids", "bytes", "scalar", "empty", "i32"};
    zs_tensor *ts[] = {
        zs_arange(ZS_F32, 0, 6, 1), zs_full(ZS_F16, ZS_SHAPE(2, 2), 1.5),
        zs_full(ZS_BF16, ZS_SHAPE(3), -2), zs_arange(ZS_I64, 0, 3, 1),
        zs_full(ZS_U8, ZS_SHAPE(2, 1, 2), 7), zs_scalar(ZS_F64, 3.25),
        zs_zeros(ZS_I8, ZS_SHAPE(0, 4)), zs_full(ZS_I32, ZS_SHAPE(2, 2), -1),
    };
    for (int i = 0; i < 8; i++)
        CHECK(ts[i], "tensor");
    CHECK(zs_safetensors_save(seed_path("safetensors", "mixed.safetensors"), 8,
                              names, ts, "{\"format\":\"pt\",\"note\":\"seed\"}") == ZS_OK,
          "mixed.safetensors");
    CHECK(zs_safetensors_save(seed_path("safetensors", "one.safetensors"), 1, names,
                              ts, NULL) == ZS_OK, "one.safetensors");
    CHECK(zs_safetensors_save(seed_path("safetensors", "none.safetensors"), 0, NULL,
                              NULL, "{}") == ZS_OK, "none.safetensors");
    for (int i = 0; i < 8; i++)
        zs_release(ts[i]);
}

/* ---- IDX ----------------------------------------------------------------- */

/* An IDX file: 0, 0, type, ndim, big-endian u32 dims, big-endian data of
 * `esize`-byte elements (data given little-endian, as on this machine). */
static size_t idx_bytes(uint8_t *out, int type, int ndim, const uint32_t *dims,
                        const void *data, size_t esize)
{
    size_t n = 1, k = 0;
    out[k++] = 0, out[k++] = 0, out[k++] = (uint8_t)type, out[k++] = (uint8_t)ndim;
    for (int d = 0; d < ndim; d++) {
        for (int b = 3; b >= 0; b--)
            out[k++] = (uint8_t)(dims[d] >> (8 * b));
        n *= dims[d];
    }
    for (size_t i = 0; i < n; i++)
        for (size_t b = 0; b < esize; b++)
            out[k++] = ((const uint8_t *)data)[i * esize + esize - 1 - b];
    return k;
}

/* idx/ gets each file as it is and the images gzip'd too; idx_gz/ the
 * plain files, which its harness compresses itself. */
static void seed_idx(void)
{
    static uint8_t buf[1024];
    uint8_t images[48], labels[3] = {0, 7, 9};
    float f[6] = {0, -1.5f, 2.25f, 1e30f, -0.0f, 3};
    int16_t s[5] = {0, 1, -1, 32767, -32768};
    for (int i = 0; i < 48; i++)
        images[i] = (uint8_t)(i * 5);
    struct {
        const char *name;
        int type, ndim;
        uint32_t dims[3];
        const void *data;
        size_t esize;
    } files[] = {
        {"images-u8.idx", 0x08, 3, {3, 4, 4}, images, 1},
        {"labels-u8.idx", 0x08, 1, {3}, labels, 1},
        {"f32.idx", 0x0D, 2, {2, 3}, f, 4},
        {"i16.idx", 0x0B, 1, {5}, s, 2},
    };
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        size_t n = idx_bytes(buf, files[i].type, files[i].ndim, files[i].dims,
                             files[i].data, files[i].esize);
        write_file(seed_path("idx", files[i].name), buf, n);
        write_file(seed_path("idx_gz", files[i].name), buf, n);
        if (i == 0) {
            gzFile gz = gzopen(seed_path("idx", "images-u8.idx.gz"), "wb");
            CHECK(gz && gzwrite(gz, buf, (unsigned)n) == (int)n && gzclose(gz) == Z_OK,
                  "images-u8.idx.gz");
        }
    }
}

/* ---- tokenizers and token files ------------------------------------------ */

static const char corpus[] =
    "In the beginning was the word, and the word was with the light.\n"
    "It's 2024: the model's loss fell from 5.75 to 3.10 in 300 steps!\n"
    "\xe6\x99\xba\xe7\xae\x97 trains GPT-2 and BLOOM; the tokenizer is byte-level BPE.\n"
    "<|endoftext|>The end of one text, the beginning of the next.\n";

/* GPT-2's bytes_to_unicode: printable bytes keep their code point, the
 * other 68 map to U+0100 and up in byte order. Appends the JSON-escaped
 * UTF-8 of byte c's character to *p. */
static void gpt2_char(char **p, uint8_t c, bool json)
{
    bool printable = (c >= 33 && c <= 126) || (c >= 161 && c <= 172) || c >= 174;
    uint32_t cp = c;
    if (!printable) {
        cp = 256;
        for (int b = 0; b < c; b++)
            cp += !((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174);
    }
    if (json && (cp == '"' || cp == '\\'))
        *(*p)++ = '\\';
    if (cp < 0x80) {
        *(*p)++ = (char)cp;
    } else {
        *(*p)++ = (char)(0xC0 | cp >> 6);
        *(*p)++ = (char)(0x80 | (cp & 0x3F));
    }
}

static void gpt2_token(char **p, const zs_bpe *b, int32_t id, bool json)
{
    size_t len = 0;
    const uint8_t *t = zs_bpe_token(b, id, &len);
    for (size_t i = 0; t && i < len; i++)
        gpt2_char(p, t[i], json);
}

/* bpe_gpt2/: the tokenizer as GPT-2's encoder.json and vocab.bpe, joined
 * by a 0 byte as the harness splits them; checked to load. */
static void seed_gpt2(const zs_bpe *b)
{
    int32_t v = zs_bpe_vocab_size(b), m = zs_bpe_n_merges(b);
    size_t cap = 64, len = 0; /* a byte takes at most 3 characters */
    for (int32_t id = 0; id < v; id++)
        cap += (zs_bpe_token(b, id, &len) ? 3 * len : 0) + 32;
    cap *= 2; /* vocab.bpe: a merge's two tokens spell its result's bytes */
    char *buf = malloc(cap), *p = buf;
    CHECK(buf, "out of memory");
    *p++ = '{';
    for (int32_t id = 0; id < v; id++) {
        p += sprintf(p, "%s\"", id ? ",\n " : "");
        if (id == zs_bpe_eot(b))
            p += sprintf(p, "%s", ZS_BPE_EOT);
        else
            gpt2_token(&p, b, id, true);
        p += sprintf(p, "\": %d", id);
    }
    p += sprintf(p, "}\n");
    size_t n_enc = (size_t)(p - buf);
    *p++ = 0;
    p += sprintf(p, "#version: 0.2\n");
    for (int32_t r = 0; r < m; r++) {
        int32_t l, rt, res;
        CHECK(zs_bpe_merge(b, r, &l, &rt, &res) == ZS_OK, "merge");
        gpt2_token(&p, b, l, false);
        *p++ = ' ';
        gpt2_token(&p, b, rt, false);
        *p++ = '\n';
    }
    const char *pair = seed_path("bpe_gpt2", "pair.bin");
    write_file(pair, buf, (size_t)(p - buf));
    char enc[4200], voc[4200];
    snprintf(enc, sizeof enc, "%s/encoder.json.tmp", root);
    snprintf(voc, sizeof voc, "%s/vocab.bpe.tmp", root);
    write_file(enc, buf, n_enc);
    write_file(voc, buf + n_enc + 1, (size_t)(p - buf) - n_enc - 1);
    zs_bpe *back = zs_bpe_load_gpt2(enc, voc);
    CHECK(back && zs_bpe_vocab_size(back) == v, "the GPT-2 pair does not load");
    zs_bpe_free(back);
    remove(enc);
    remove(voc);
    free(buf);
}

static void seed_text(void)
{
    zs_bpe *b = zs_bpe_train(corpus, sizeof corpus - 1, 300);
    CHECK(b, "bpe train");
    CHECK(zs_bpe_save(b, seed_path("bpe", "tokenizer.bpe")) == ZS_OK, "tokenizer.bpe");
    seed_gpt2(b);
    int32_t *ids = NULL;
    size_t n = 0;
    CHECK(zs_bpe_encode(b, corpus, sizeof corpus - 1, ZS_BPE_ALLOW_SPECIAL, &ids,
                        &n) == ZS_OK, "bpe encode");
    CHECK(zs_tokens_write(seed_path("tokens", "corpus-w2.bin"), ids, (int64_t)n,
                          zs_bpe_vocab_size(b)) == ZS_OK, "corpus-w2.bin");
    for (size_t i = 0; i < n; i++)
        ids[i] = ids[i] * 211 % 70000;
    CHECK(zs_tokens_write(seed_path("tokens", "wide-w4.bin"), ids, n < 24 ? (int64_t)n : 24,
                          70000) == ZS_OK, "wide-w4.bin");
    free(ids);
    zs_bpe_free(b);
}

/* ---- checkpoints -------------------------------------------------------- */

/* m flattened with an optimizer of `kind` over the flat parameters, saved
 * with and, when plain_name is given, without the optimizer's state. */
static void save_ckpt(zs_module *m, zs_optim_kind kind, const char *target,
                      const char *name, const char *plain_name, const char *meta)
{
    zs_tensor *fp = NULL, *fg = NULL;
    zs_optim_config oc = {.kind = kind, .lr = 1e-3, .weight_decay = 0.1};
    CHECK(m && zs_module_flatten(m, &fp, &fg) == ZS_OK, "model");
    zs_optim *o = zs_optim_new(&oc, 1, &fp);
    CHECK(o && zs_optim_step(o, 1e-3) == ZS_OK, "optimizer");
    CHECK(zs_module_save(seed_path(target, name), m, o, meta) == ZS_OK, name);
    if (plain_name)
        CHECK(zs_module_save(seed_path(target, plain_name), m, NULL, meta) == ZS_OK,
              plain_name);
    zs_optim_free(o);
    zs_module_free(m);
}

static void seed_checkpoints(void)
{
    save_ckpt(zs_lenet5_new(1), ZS_ADAM, "ckpt_lenet", "lenet-adam.safetensors",
              "lenet.safetensors", "{\"model\":\"lenet\",\"epoch\":\"1\"}");
    /* as `zs train gpt` writes them (apps/zs/gpt_train.c, save()) */
    zs_gpt_config gc = {ZS_GPT2, 300, 16, 1, 2, 16};
    save_ckpt(zs_gpt_new(&gc, 1), ZS_ADAMW, "ckpt_gpt", "gpt2-adamw.safetensors", NULL,
              "{\"model\":\"gpt\",\"arch\":\"gpt2\",\"preset\":\"tiny\",\"vocab\":\"300\","
              "\"ctx\":\"16\",\"layers\":\"1\",\"heads\":\"2\",\"width\":\"16\","
              "\"step\":\"10\",\"val_loss\":\"5.123456\"}");
    gc = (zs_gpt_config){ZS_BLOOM, 260, 8, 2, 4, 8};
    save_ckpt(zs_gpt_new(&gc, 2), ZS_ADAMW, "ckpt_gpt", "bloom-adamw.safetensors",
              "bloom.safetensors",
              "{\"model\":\"gpt\",\"arch\":\"bloom\",\"preset\":\"tiny\",\"vocab\":\"260\","
              "\"ctx\":\"8\",\"layers\":\"2\",\"heads\":\"4\",\"width\":\"8\","
              "\"step\":\"3\",\"val_loss\":\"nan\"}");
}

/* Quantized GPTs as zs quantize writes them (zs_llm_save): every format. */
static void seed_quantized(void)
{
    zs_gpt_config gc = {ZS_GPT2, 50, 16, 1, 2, 32};
    zs_module *g = zs_gpt_new(&gc, 3);
    int32_t calib[40];
    for (int i = 0; i < 40; i++)
        calib[i] = (i * 7) % 50;
    const zs_quant qs[] = {ZS_QUANT_Q8_0, ZS_QUANT_Q4_0, ZS_QUANT_Q4_1, ZS_QUANT_INT8,
                           ZS_QUANT_W8A8};
    for (int i = 0; i < 5; i++) {
        zs_llm_options o = {.quant = qs[i], .calib = calib, .n_calib = 40};
        zs_llm *m = zs_llm_from_gpt(g, &o);
        char name[64];
        snprintf(name, sizeof name, "gpt2-%s.safetensors", zs_quant_name(qs[i]));
        CHECK(m && zs_llm_save(m, seed_path("ckpt_quant", name), NULL) == ZS_OK, name);
        zs_llm_free(m);
    }
    zs_module_free(g);
}

/* ---- analyzer configs ---------------------------------------------------- */

static void seed_analyze(void)
{
    static const char *configs[][2] = {
        {"base-swiglu.json", "{\"base\": \"gpt2-small\", \"n_layer\": 6,\n \"d-model\": 512, "
                             "\"n_head\": 8, \"mlp\": \"swiglu\", \"bias\": false, "
                             "\"name\": \"mini\"}\n"},
        {"symbols.json", "{\"l\": 2, \"h\": 64, \"n\": 4, \"V\": 100, \"s\": 32}\n"},
        {"llama-base.json", "{\"base\": \"llama2-70b\", \"n_layer\": 4}\n"},
        {"bloom-full.json",
         "{\"name\": \"bloom-like\", \"n_layer\": 70, \"d_model\": 14336, \"n_head\": 112,\n"
         " \"vocab\": 250880, \"seq_len\": 2048, \"mlp\": \"gelu\", \"norm\": \"layernorm\",\n"
         " \"bias\": true, \"tied_embeddings\": true, \"learned_pos\": false, "
         "\"embed_norm\": true}\n"},
        {"gqa.json", "{\"n_layer\": 2, \"d_model\": 64, \"n_head\": 8, \"n_kv_head\": 2, "
                     "\"d_head\": 8, \"d_ff\": 172, \"vocab\": 100, \"seq_len\": 16,\n"
                     " \"mlp\": \"swiglu\", \"norm\": \"rmsnorm\"}\n"},
    };
    for (size_t i = 0; i < sizeof configs / sizeof *configs; i++) {
        zs_model_config c;
        CHECK(zs_model_config_parse_json(configs[i][1], &c) == ZS_OK, configs[i][0]);
        write_file(seed_path("analyze_config", configs[i][0]), configs[i][1],
                   strlen(configs[i][1]));
    }
}

/* serve_request/: request bodies of both endpoints, valid and not */
static void seed_serve(void)
{
    static const char *bodies[][2] = {
        {"completion.json", "{\"model\": \"m\", \"prompt\": \"In the beginning\", "
                            "\"max_tokens\": 8, \"temperature\": 0.7, \"top_p\": 0.9, \"n\": 2, "
                            "\"stop\": [\"light\", \"\\n\"], \"seed\": 42, \"logprobs\": 2, "
                            "\"echo\": true, \"stream\": true, \"stream_options\": "
                            "{\"include_usage\": true}}"},
        {"tokens.json", "{\"prompt\": [[1, 2, 3]], \"max_tokens\": 1, \"top_k\": 5, "
                        "\"min_p\": 0.1, \"presence_penalty\": -1.5, \"ignore_eos\": true}"},
        {"chat.json", "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, "
                      "{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": "
                      "\"caf\\u00e9\"}]}, {\"role\": \"assistant\", \"content\": null}], "
                      "\"logprobs\": true, \"top_logprobs\": 3, \"max_completion_tokens\": 4}"},
        {"bad-types.json", "{\"prompt\": 5, \"temperature\": \"hot\", \"n\": 1e400}"},
        {"prompt-list.json", "{\"prompt\": [\"In the\", \"\", \"light\"], \"n\": 3, "
                             "\"echo\": true, \"logprobs\": 1}"},
        {"prompt-id-lists.json", "{\"prompt\": [[1, 2], [3], [4, 5, 6]], \"n\": 2}"},
        {"prompt-mixed.json", "{\"prompt\": [\"a\", [1, 2], 3], \"n\": 64}"},
    };
    for (size_t i = 0; i < sizeof bodies / sizeof *bodies; i++)
        write_file(seed_path("serve_request", bodies[i][0]), bodies[i][1],
                   strlen(bodies[i][1]));
}

/* ---- every seed loads -------------------------------------------------- */

/* A seed its loader refuses only tests the first check of a parser; this
 * catches a format that moved on (say, `zs train gpt`'s metadata) and left
 * the seeds behind. The analyzer configs and the GPT-2 pair are checked
 * where they are written. */
static void check_loads(void)
{
    zs_tensor_set set;
    zs_tokens tok;
    zs_tensor *t;
    zs_bpe *b;
    char *meta = NULL;
    const char *idx[] = {"images-u8.idx", "images-u8.idx.gz", "labels-u8.idx", "f32.idx",
                         "i16.idx"};
    for (int i = 0; i < 5; i++) {
        CHECK((t = zs_idx_load(seed_path("idx", idx[i]))), idx[i]);
        zs_release(t);
    }
    CHECK(zs_safetensors_load(seed_path("safetensors", "mixed.safetensors"), &set) == ZS_OK &&
              set.n == 8, "mixed.safetensors does not load");
    zs_tensor_set_free(&set);
    CHECK((b = zs_bpe_load(seed_path("bpe", "tokenizer.bpe"))), "tokenizer.bpe does not load");
    zs_bpe_free(b);
    CHECK(zs_tokens_open(seed_path("tokens", "wide-w4.bin"), &tok) == ZS_OK,
          "wide-w4.bin does not open");
    zs_tokens_close(&tok);
    zs_module *m = zs_gpt_load(seed_path("ckpt_gpt", "gpt2-adamw.safetensors"), &meta);
    CHECK(m, "gpt2-adamw.safetensors does not load");
    zs_module_free(m);
    free(meta);
    CHECK((m = zs_lenet5_new(1)), "lenet");
    CHECK(zs_module_load(seed_path("ckpt_lenet", "lenet.safetensors"), m, NULL, NULL) ==
              ZS_OK, "lenet.safetensors does not load");
    zs_module_free(m);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: make_seeds DIR\n");
        return 2;
    }
    root = argv[1];
    CHECK(mkdir(root, 0755) == 0 || errno == EEXIST, root);
    seed_safetensors();
    seed_idx();
    seed_text();
    seed_checkpoints();
    seed_quantized();
    seed_analyze();
    seed_serve();
    check_loads();
    printf("make_seeds: seed corpora written under %s\n", root);
    return 0;
}
