/*
 * error.c - thread-local last-error message.
 *
 * A failing function sets one message naming the operation, the shapes and
 * what was expected; the caller reads it with zs_last_error(). Operators
 * given a NULL input return NULL without touching the message, so the first
 * failure of a chain is the one reported.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "zs/core.h"

static _Thread_local char last_error[512];

const char *zs_last_error(void) { return last_error; }

void zs_clear_error(void) { last_error[0] = '\0'; }

/* Formats into a scratch buffer first, so a message may quote the
 * previous one (zs_set_error("step 3: %s", zs_last_error())): vsnprintf
 * into the buffer it reads from is undefined. */
static void set_msg(const char *fmt, va_list ap)
{
    char msg[sizeof last_error];
    vsnprintf(msg, sizeof msg, fmt, ap);
    memcpy(last_error, msg, sizeof msg);
}

zs_status zs_set_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    set_msg(fmt, ap);
    va_end(ap);
    return ZS_ERR_ARG;
}

zs_status zs_set_error_code(zs_status code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    set_msg(fmt, ap);
    va_end(ap);
    return code;
}

const char *zs_status_str(zs_status s)
{
    switch (s) {
    case ZS_OK: return "ok";
    case ZS_ERR_ARG: return "invalid argument";
    case ZS_ERR_NOMEM: return "out of memory";
    case ZS_ERR_IO: return "i/o error";
    case ZS_ERR_FORMAT: return "bad format";
    case ZS_ERR_STATE: return "invalid state";
    case ZS_ERR_UNSUPPORTED: return "unsupported";
    }
    return "unknown error";
}
