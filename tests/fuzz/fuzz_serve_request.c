/*
 * fuzz_serve_request.c - what the HTTP server does with a request body
 * before anything reaches the engine (src/serve/params.c): the UTF-8
 * check and cJSON parse of arbitrary bytes, then the completion and the
 * chat parsers (types, ranges, prompts, the chat template, tokenization)
 * on whatever parses. The output side too: the server's JSON string of the
 * input bytes must parse back as a JSON string of valid UTF-8, and the
 * stream hold-back rules must stay within the text; abort() otherwise.
 *
 * The server here is a zs_server struct with only what the parsers read
 * (a tokenizer, the model name, the locks): no threads, no socket.
 */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"

#include "serve/internal.h"

static zs_server *server(void)
{
    static zs_server *s;
    if (s)
        return s;
    static const char text[] = "In the beginning was the word, and the word was with the "
                               "light. <|user|>\nhello\n<|assistant|>\n";
    s = calloc(1, sizeof *s);
    if (!s || !(s->tok = zs_bpe_train(text, sizeof text - 1, 300)))
        abort();
    s->model = "m";
    s->eot = zs_bpe_eot(s->tok);
    pthread_mutex_init(&s->mu, NULL);
    pthread_mutex_init(&s->json_mu, NULL);
    return s;
}

static void output_side(const uint8_t *data, size_t size)
{
    zsi_buf b = {0};
    zsi_buf_json_str(&b, (const char *)data, size);
    cJSON *j = b.p ? cJSON_ParseWithLength(b.p, b.len) : NULL;
    if (!cJSON_IsString(j) || !zsi_utf8_valid(b.p, b.len))
        abort();
    cJSON_Delete(j);
    zsi_buf_free(&b);
    if (zsi_utf8_complete((const char *)data, size) > size || size - zsi_utf8_complete(
            (const char *)data, size) > 3)
        abort();
    char *stops[] = {"light", "<|", "\xC3\xA9"}; /* a hold-back is a proper prefix */
    size_t hold = zsi_stop_holdback((const char *)data, size, stops, 3);
    if (hold > size || hold > 4)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    zs_server *s = server();
    zsi_err e = {0};
    cJSON *req = zsi_json_parse(s, (const char *)data, size, &e);
    if (!req && e.status != 400)
        abort(); /* a body that does not parse is always the client's fault */
    for (int chat = 0; req && chat < 2; chat++) {
        zsi_params p;
        zsi_err pe = {0};
        bool ok = zsi_params_parse(s, req, chat, &p, &pe);
        if (ok && (p.n_prompts < 1 || p.n < 1 || p.n_choices != p.n_prompts * p.n ||
                   p.n_choices > ZSI_MAX_N || (chat && p.n_prompts != 1)))
            abort();
        for (int i = 0; ok && i < p.n_prompts; i++)
            if (p.prompts[i].n < 1 || !p.prompts[i].ids)
                abort();
        if (!ok && pe.status != 400 && pe.status != 404)
            abort();
        zsi_params_free(&p);
    }
    cJSON_Delete(req);
    output_side(data, size);
    return 0;
}
