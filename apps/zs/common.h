/*
 * common.h - helpers shared by the zs subcommands (metadata, timing,
 * corpus reading, progress lines, loss history).
 */
#ifndef ZS_APPS_COMMON_H
#define ZS_APPS_COMMON_H

#include <stdbool.h>
#include <stdio.h>

#include "zs/zs.h"

/* Reads the corpus: path, or the King James Bible (`bible -f
 * "Gen1:1-Rev22:21"`) when path is NULL. Rejects empty and binary (NUL
 * bytes) input. Returns a malloc'd buffer or NULL + message. */
char *app_read_corpus(const char *path, size_t *n);
/* Makes the output directory dir (and runs/, where default outputs go);
 * an error when it cannot be made or exists as something else. */
zs_status app_make_outdir(const char *dir);
/* Monotonic wall-clock seconds. */
double app_now(void);
/* One progress line (a bar on a terminal, a plain line every 10 steps
 * otherwise). */
void app_progress(bool tty, int64_t step, int64_t steps, double loss,
                     double tokens_per_s, double mfu, double eta_s);

/* The device id of a --device value: "cpu" (or NULL), "test" (the test
 * device, registered on first use) or another registered device's name. -1 after
 * a one-line message on stderr naming cmd and the devices there are (the
 * caller exits with status 2). */
int app_device(const char *cmd, const char *name);

/* `zs train gpt`: argv[0] is "gpt"; returns the exit status. */
int cmd_train_gpt(int argc, char **argv);

#endif
