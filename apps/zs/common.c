/*
 * common.c - corpus reading, metadata, timing, progress and loss history
 * shared by the zs subcommands.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "apps/zs/common.h"

double app_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static char *slurp(FILE *f, size_t *n)
{
    size_t cap = 1 << 20, len = 0;
    char *buf = malloc(cap + 1);
    while (buf) {
        size_t got = fread(buf + len, 1, cap - len, f);
        len += got;
        if (got == 0)
            break;
        if (len == cap) {
            char *b = realloc(buf, 2 * cap + 1);
            if (!b) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = b;
            cap *= 2;
        }
    }
    if (buf)
        buf[len] = '\0';
    *n = len;
    return buf;
}

zs_status app_make_outdir(const char *dir)
{
    struct stat st;
    mkdir("runs", 0755);
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return zs_set_error("cannot create output directory %s: %s", dir,
                            strerror(errno));
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return zs_set_error("--out %s exists and is not a directory", dir);
    return ZS_OK;
}

char *app_read_corpus(const char *path, size_t *n)
{
    FILE *f;
    bool pipe = !path;
    struct stat st;
    *n = 0;
    if (!pipe && stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
        zs_set_error_code(ZS_ERR_IO, "corpus %s is a directory; give a text file",
                          path);
        return NULL;
    }
    if (pipe)
        f = popen("bible -f 'Gen1:1-Rev22:21' 2>/dev/null", "r");
    else
        f = fopen(path, "rb");
    if (!f) {
        zs_set_error_code(ZS_ERR_IO, "cannot read corpus %s: %s",
                          path ? path : "(bible)", strerror(errno));
        return NULL;
    }
    char *text = slurp(f, n);
    bool read_error = ferror(f);
    int err = errno; /* of the failed read, before the close */
    int status = pipe ? pclose(f) : (fclose(f), 0);
    if (text && read_error) {
        free(text);
        zs_set_error_code(ZS_ERR_IO, "cannot read corpus %s: %s",
                          path ? path : "(bible)", strerror(err));
        return NULL;
    }
    if (!text) {
        zs_set_error_code(ZS_ERR_NOMEM, "out of memory reading the corpus");
        return NULL;
    }
    if (*n == 0) {
        free(text);
        if (pipe)
            zs_set_error_code(ZS_ERR_FORMAT, "%s", status
                              ? "the default corpus needs the `bible` command "
                                "(Debian package bible-kjv)"
                              : "the bible command printed nothing");
        else
            zs_set_error_code(ZS_ERR_FORMAT, "corpus file %s is empty", path);
        return NULL;
    }
    if (memchr(text, '\0', *n)) {
        free(text);
        zs_set_error_code(ZS_ERR_FORMAT, "corpus %s looks binary (it contains "
                          "NUL bytes); give a text file", path ? path : "");
        return NULL;
    }
    return text;
}

void app_progress(bool tty, int64_t step, int64_t steps, double loss,
                     double tokens_per_s, double mfu, double eta_s)
{
    int eta = eta_s > 0 ? (int)eta_s : 0;
    if (tty) {
        int w = 20, done = (int)(w * (step + 1) / (steps ? steps : 1));
        fprintf(stderr, "\rstep %lld/%lld [", (long long)step + 1, (long long)steps);
        for (int k = 0; k < w; k++)
            fputc(k < done ? '=' : k == done ? '>' : ' ', stderr);
        fprintf(stderr, "] loss %.4f %.0f tok/s MFU %.1f%% ETA %d:%02d   ", loss,
                tokens_per_s, 100 * mfu, eta / 60, eta % 60);
    } else if ((step + 1) % 10 == 0) {
        fprintf(stderr, "step %lld/%lld loss %.4f %.0f tok/s MFU %.1f%% ETA %d:%02d\n",
                (long long)step + 1, (long long)steps, loss, tokens_per_s, 100 * mfu,
                eta / 60, eta % 60);
    }
}


int app_device(const char *cmd, const char *name)
{
    if (!name)
        return ZS_CPU;
    if (!strcmp(name, "test") && zs_test_device_enable() != ZS_OK) {
        fprintf(stderr, "%s: %s\n", cmd, zs_last_error());
        return -1;
    }
    if (!strcmp(name, "cuda") && zs_cuda_enable() != ZS_OK) {
        fprintf(stderr, "%s: --device cuda: %s\n", cmd, zs_last_error());
        return -1;
    }
    int d = zs_device_find(name);
    if (d < 0) {
        /* the test device is always available from the command line */
        fprintf(stderr, "%s: --device: no device named '%s' (devices: %s%s)\n",
                cmd, name, zs_device_list(),
                zs_device_get(ZS_TEST_DEVICE) ? "" : ", test");
        return -1;
    }
    return d;
}
