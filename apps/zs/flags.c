/*
 * flags.c - the table-driven flag parser of the zs subcommands (see
 * flags.h for the table format and the rules). Hostile argv is the point:
 * every value is checked before it is converted, so no flag reaches an
 * out-of-range float-to-integer conversion, and every message fits on one
 * line however long or odd the offending argument is.
 */
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "apps/zs/flags.h"

int flags_exit(int parse_result)
{
    return parse_result == FLAGS_HELP ? 0 : 2;
}

int flags_error(const char *cmd, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s: ", cmd);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return 2;
}

/* s for a message: at most 60 bytes, control bytes as '?', so that an
 * argument with newlines or megabytes of text still gives one line. */
static const char *shown(const char *s, char buf[72])
{
    size_t n = 0;
    for (; s[n] && n < 60; n++)
        buf[n] = iscntrl((unsigned char)s[n]) ? '?' : s[n];
    strcpy(buf + n, s[n] ? "..." : "");
    return buf;
}

static bool is_int_kind(flag_kind k)
{
    return k == FLAG_INT || k == FLAG_INT64 || k == FLAG_UINT64;
}

/* The row's bounds, narrowed to what its type holds exactly; integer kinds
 * get integral bounds. */
static void bounds(const flag *f, double *lo, double *hi)
{
    double tlo = -INFINITY, thi = INFINITY;
    if (f->kind == FLAG_INT) {
        tlo = INT_MIN;
        thi = INT_MAX;
    } else if (f->kind == FLAG_INT64) {
        tlo = -FLAG_EXACT_MAX;
        thi = FLAG_EXACT_MAX;
    } else if (f->kind == FLAG_UINT64) {
        tlo = 0;
        thi = FLAG_EXACT_MAX;
    }
    *lo = f->lo > tlo ? f->lo : tlo;
    *hi = f->hi < thi ? f->hi : thi;
    if (is_int_kind(f->kind)) {
        *lo = ceil(*lo);
        *hi = floor(*hi);
    }
}

static bool in_range(const flag *f, double v, double lo, double hi)
{
    return (f->lo_open ? v > lo : v >= lo) && v <= hi;
}

/* The value of s as a double for row f, or false. Integer kinds read a
 * plain decimal integer exactly (strtoll), anything else with strtod and
 * then insist on an integral value. */
static bool read_number(const flag *f, const char *s, double *out)
{
    double lo, hi;
    bounds(f, &lo, &hi);
    if (!*s || isspace((unsigned char)*s))
        return false;
    char *end;
    if (is_int_kind(f->kind)) {
        errno = 0;
        long long ll = strtoll(s, &end, 10);
        if (*end == '\0') { /* |lo|, |hi| <= 2^53: exact as long long */
            if (errno || ll < (long long)lo || ll > (long long)hi)
                return false;
            *out = (double)ll;
            return true;
        }
    }
    double v = strtod(s, &end);
    if (*end != '\0' || !isfinite(v) || !in_range(f, v, lo, hi))
        return false;
    if (is_int_kind(f->kind) && v != floor(v))
        return false;
    *out = v;
    return true;
}

static int bad_number(const char *cmd, const flag *f, const char *s)
{
    double lo, hi;
    char buf[72];
    bounds(f, &lo, &hi);
    if (is_int_kind(f->kind))
        return flags_error(cmd, "%s wants a number in [%.0f, %.0f] (an integer), "
                              "got '%s'", f->name, lo, hi, shown(s, buf));
    return flags_error(cmd, "%s wants a number in %c%g, %g], got '%s'", f->name,
                          f->lo_open ? '(' : '[', lo, hi, shown(s, buf));
}

static int set_number(const char *cmd, const flag *f, const char *s)
{
    double v;
    if (!read_number(f, s, &v))
        return bad_number(cmd, f, s);
    switch (f->kind) {
    case FLAG_INT: *(int *)f->dst = (int)v; break;
    case FLAG_INT64: *(int64_t *)f->dst = (int64_t)v; break;
    case FLAG_UINT64: *(uint64_t *)f->dst = (uint64_t)v; break;
    default: *(double *)f->dst = v; break;
    }
    return 0;
}

/* Index of s among "a|b|c", or -1. */
static int choice_index(const char *choices, const char *s)
{
    size_t len = strlen(s);
    int k = 0;
    for (const char *p = choices;; k++) {
        const char *bar = strchr(p, '|');
        size_t n = bar ? (size_t)(bar - p) : strlen(p);
        if (n == len && !strncmp(p, s, n))
            return k;
        if (!bar)
            return -1;
        p = bar + 1;
    }
}

/* "must be a, b or c, got 'x'" */
static int bad_choice(const char *cmd, const flag *f, const char *s)
{
    char list[256] = "", buf[72];
    size_t used = 0;
    for (const char *p = f->choices; *p && used + 8 < sizeof list;) {
        const char *bar = strchr(p, '|');
        size_t n = bar ? (size_t)(bar - p) : strlen(p);
        const char *sep = p == f->choices ? "" : strchr(p, '|') ? ", " : " or ";
        used += (size_t)snprintf(list + used, sizeof list - used, "%s%.*s", sep,
                                 (int)n, p);
        p = bar ? bar + 1 : p + n;
    }
    return flags_error(cmd, "%s must be %s, got '%s'", f->name, list, shown(s, buf));
}

/* Stores value s of the valued row f; 0 or 2 after a message. */
static int set_value(const char *cmd, const flag *f, const char *s)
{
    switch (f->kind) {
    case FLAG_STRING:
        *(const char **)f->dst = s;
        return 0;
    case FLAG_ARG:
        if (f->choices && choice_index(f->choices, s) < 0)
            return bad_choice(cmd, f, s);
        *(const char **)f->dst = s;
        return 0;
    case FLAG_CHOICE:
    case FLAG_CHOICE_INDEX: {
        int k = choice_index(f->choices, s);
        if (k < 0)
            return bad_choice(cmd, f, s);
        if (f->kind == FLAG_CHOICE)
            *(const char **)f->dst = s;
        else
            *(int *)f->dst = k;
        return 0;
    }
    case FLAG_LIST: {
        flag_list *l = f->dst;
        if (l->n == FLAG_LIST_MAX)
            return flags_error(cmd, "too many %s flags (at most %d)", f->name,
                                  FLAG_LIST_MAX);
        l->items[l->n++] = s;
        return 0;
    }
    default:
        return set_number(cmd, f, s);
    }
}

static const flag *find(const flag *t, size_t n, const char *name)
{
    for (size_t i = 0; i < n; i++)
        if (t[i].kind != FLAG_ARG && !strcmp(t[i].name, name))
            return &t[i];
    return NULL;
}

/* The next positional row after `taken` of them, or a message. */
static int positional(const char *cmd, const flag *t, size_t n, int *taken,
                      const char *s)
{
    const flag *last = NULL;
    char buf[72], prev[72];
    int k = 0;
    for (size_t i = 0; i < n; i++) {
        if (t[i].kind != FLAG_ARG)
            continue;
        if (k++ == *taken) {
            ++*taken;
            return set_value(cmd, &t[i], s);
        }
        last = &t[i];
    }
    if (!last)
        return flags_error(cmd, "unexpected argument '%s' (see %s --help)",
                              shown(s, buf), cmd);
    return flags_error(cmd, "unexpected argument '%s' (%s is already '%s')",
                          shown(s, buf), last->name,
                          shown(*(const char **)last->dst, prev));
}

int flags_parse(const char *cmd, const flag *table, size_t n,
                   void (*usage)(FILE *f), int argc, char **argv)
{
    int taken = 0;
    char buf[72];
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return FLAGS_HELP;
        }
        int rc;
        if (a[0] != '-') {
            rc = positional(cmd, table, n, &taken, a);
        } else {
            const flag *f = find(table, n, a);
            if (!f)
                rc = flags_error(cmd, "unknown flag '%s' (see %s --help)",
                                    shown(a, buf), cmd);
            else if (f->kind == FLAG_SWITCH)
                rc = (*(bool *)f->dst = true, 0);
            else if (i + 1 == argc)
                rc = flags_error(cmd, "%s needs a value (see %s --help)", a, cmd);
            else
                rc = set_value(cmd, f, argv[++i]);
        }
        if (rc)
            return FLAGS_BAD;
    }
    return FLAGS_OK;
}
