/*
 * fuzz_util.h - what the libFuzzer harnesses in tests/fuzz share.
 *
 * The library reads files by path, so a harness puts the fuzzer's bytes
 * into a memfd and passes "/proc/self/fd/N": no disk I/O per input, and the
 * file is reused (truncated and rewritten) from one input to the next.
 * Every harness defines LLVMFuzzerTestOneInput; it runs under libFuzzer
 * (ZS_FUZZ builds) or under driver.c, which feeds it the files of a corpus.
 */
#ifndef ZS_TESTS_FUZZ_UTIL_H
#define ZS_TESTS_FUZZ_UTIL_H

#include <stddef.h>
#include <stdint.h>

/* Files a harness may hold at once (bpe_gpt2 needs two). */
#define ZF_SLOTS 2

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Writes data[0, size) into memfd `slot` (0 <= slot < ZF_SLOTS) and returns
 * its path (borrowed, valid until the next call for that slot). The first
 * call also sets the library to one thread, so coverage and speed do not
 * depend on scheduling. Aborts if the memfd cannot be made: that is the
 * harness's failure, not the library's. */
const char *zf_file(int slot, const uint8_t *data, size_t size);

struct zs_bpe;

/* Exercises a loaded tokenizer: its merges and tokens, and an encode and
 * decode of a short mixed text (ASCII, UTF-8, invalid bytes, the special
 * token) that must give the text back, as zs/text.h promises for every
 * vocabulary; aborts otherwise. */
void zf_bpe_exercise(const struct zs_bpe *b);

/* A malloc'd NUL-terminated copy of data[0, size) (free() it). */
char *zf_cstr(const uint8_t *data, size_t size);

/* A gzip stream (RFC 1952) of data[0, size) in a malloc'd buffer of *n
 * bytes (free() it). */
uint8_t *zf_gzip(const uint8_t *data, size_t size, size_t *n);

#endif
