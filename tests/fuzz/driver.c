/*
 * driver.c - runs a fuzz harness without libFuzzer: every file named on
 * the command line, or found directly in a directory named there, is read
 * and passed once to LLVMFuzzerTestOneInput, in name order. This is how
 * ctest replays the regression corpus (tests/fuzz/corpus/<name>/) and the
 * seeds the build writes, in every build; under ASan + UBSan a crash, a
 * leak or undefined behaviour fails the test.
 *
 *   fuzz_regress_<name> PATH...     exit 0 when every input ran; 1 when a
 *                                    path cannot be read
 */
#include <dirent.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz_util.h"

/* The whole file in a malloc'd buffer (never NULL, even when empty: the
 * harnesses, like libFuzzer's, may assume a valid pointer). */
static uint8_t *read_all(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 4096, len = 0;
    uint8_t *buf = malloc(cap);
    while (buf) {
        len += fread(buf + len, 1, cap - len, f);
        if (len < cap)
            break;
        uint8_t *grown = realloc(buf, cap *= 2);
        if (!grown)
            free(buf);
        buf = grown;
    }
    bool bad = ferror(f);
    fclose(f);
    if (bad) {
        free(buf);
        return NULL;
    }
    *n = len;
    return buf;
}

static int run_file(const char *path)
{
    size_t n = 0;
    uint8_t *data = read_all(path, &n);
    if (!data) {
        fprintf(stderr, "driver: cannot read %s\n", path);
        return -1;
    }
    /* named before it runs, so a sanitizer report follows its input's name */
    fprintf(stderr, "  %s (%zu bytes)\n", path, n);
    LLVMFuzzerTestOneInput(data, n);
    free(data);
    return 0;
}

static int by_name(const struct dirent **a, const struct dirent **b)
{
    return strcmp((*a)->d_name, (*b)->d_name);
}

/* Runs the regular files directly in dir; returns how many, or -1. */
static int run_dir(const char *dir)
{
    struct dirent **ents;
    int n = scandir(dir, &ents, NULL, by_name), ran = 0;
    if (n < 0) {
        fprintf(stderr, "driver: cannot list %s\n", dir);
        return -1;
    }
    for (int i = 0; i < n; i++) {
        char path[4096];
        struct stat st;
        snprintf(path, sizeof path, "%s/%s", dir, ents[i]->d_name);
        if (ran >= 0 && ents[i]->d_name[0] != '.' && stat(path, &st) == 0 &&
            S_ISREG(st.st_mode))
            ran = run_file(path) < 0 ? -1 : ran + 1;
        free(ents[i]);
    }
    free(ents);
    return ran;
}

int main(int argc, char **argv)
{
    int status = 0, total = 0;
    if (argc < 2) {
        fprintf(stderr, "usage: %s FILE|DIR...\n", argv[0]);
        return 2;
    }
    for (int i = 1; i < argc; i++) {
        struct stat st;
        int ran = stat(argv[i], &st) != 0      ? -1
                  : S_ISDIR(st.st_mode)        ? run_dir(argv[i])
                  : run_file(argv[i]) == 0     ? 1
                                               : -1;
        if (ran < 0) {
            fprintf(stderr, "driver: %s: missing or unreadable\n", argv[i]);
            status = 1;
            continue;
        }
        printf("%s: %d inputs ran\n", argv[i], ran);
        total += ran;
    }
    printf("%d inputs ran in all\n", total);
    return status;
}
