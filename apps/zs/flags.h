/*
 * flags.h - the one command-line parser of the zs subcommands.
 *
 * A command describes its flags in a table whose rows point into its
 * config struct, then calls flags_parse once:
 *
 *     flag t[] = {
 *         FLAG_ARG("MODEL", &c->model, "lenet|resnet"),
 *         FLAG_NUM("--epochs", &c->epochs, 1, 1000),
 *         FLAG_CHOICE("--optim", &c->optim, "sgd|adam|adamw"),
 *         FLAG_SWITCH("--resume", &c->resume),
 *     };
 *     int p = flags_parse("zs train", t, NFLAGS(t), usage, argc, argv);
 *     if (p != FLAGS_OK)
 *         return flags_exit(p);
 *
 * Defaults are whatever the struct holds before the call; a flag given
 * twice keeps its last value. Every rejection is one line on stderr,
 * "zs train: --epochs wants a number in [1, 1000] (an integer), got '2.5'",
 * naming the flag, the value and what is accepted; the command then exits
 * with status 2. --help (or -h) prints the usage on stdout and exits 0.
 *
 * Numbers: strtod syntax ("1e6" is fine), finite, within the row's bounds.
 * Integer kinds take integral values only, and their bounds are clipped to
 * what the type holds exactly (int: INT_MIN..INT_MAX; int64_t and uint64_t:
 * at most 2^53 in magnitude, where every integer is a double), so a value
 * that passes always converts without overflow.
 */
#ifndef ZS_APPS_FLAGS_H
#define ZS_APPS_FLAGS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef enum flag_kind {
    FLAG_INT,          /* int *       */
    FLAG_INT64,        /* int64_t *   */
    FLAG_UINT64,       /* uint64_t *  */
    FLAG_DOUBLE,       /* double *    */
    FLAG_STRING,       /* const char **: the argv string (borrowed) */
    FLAG_SWITCH,       /* bool *: set true, takes no value */
    FLAG_CHOICE,       /* const char **: the argv string, one of choices */
    FLAG_CHOICE_INDEX, /* int *: index of the value in choices */
    FLAG_LIST,         /* flag_list *: every value of a repeatable flag */
    FLAG_ARG,          /* const char **: a positional argument */
} flag_kind;

/* The values of a repeatable flag (--set K=V --set K=V ...), in order. */
#define FLAG_LIST_MAX 64
typedef struct flag_list {
    int n;
    const char *items[FLAG_LIST_MAX];
} flag_list;

typedef struct flag {
    const char *name;    /* "--epochs"; for FLAG_ARG the label "MODEL" */
    flag_kind kind;
    void *dst;           /* where the value goes, of the kind's type */
    double lo, hi;       /* numeric kinds: accepted range */
    bool lo_open;        /* the range is (lo, hi] rather than [lo, hi] */
    const char *choices; /* choice kinds: "sgd|adam|adamw" */
} flag;

/* A numeric row; the kind follows the pointer's type (a pointer of any
 * other type does not compile). */
#define FLAG_NUM(name, ptr, lo, hi)                                         \
    {(name), _Generic((ptr), int *: FLAG_INT, int64_t *: FLAG_INT64,     \
                      uint64_t *: FLAG_UINT64, double *: FLAG_DOUBLE),   \
     (ptr), (lo), (hi), false, NULL}
/* A double in (lo, hi]: lo itself is refused (top-p, say, must be > 0). */
#define FLAG_NUM_ABOVE(name, ptr, lo, hi)                                   \
    {(name), _Generic((ptr), double *: FLAG_DOUBLE), (ptr), (lo), (hi),     \
     true, NULL}
#define FLAG_STR(name, ptr)                                                 \
    {(name), _Generic((ptr), const char **: FLAG_STRING), (ptr), 0, 0,      \
     false, NULL}
#define FLAG_SWITCH(name, ptr)                                              \
    {(name), _Generic((ptr), bool *: FLAG_SWITCH), (ptr), 0, 0, false, NULL}
/* One of "a|b|c": the string itself (const char **) or its index (int *). */
#define FLAG_CHOICE(name, ptr, choices)                                     \
    {(name), _Generic((ptr), const char **: FLAG_CHOICE,                    \
                      int *: FLAG_CHOICE_INDEX), (ptr), 0, 0, false, (choices)}
#define FLAG_LIST(name, ptr)                                                \
    {(name), _Generic((ptr), flag_list *: FLAG_LIST), (ptr), 0, 0,       \
     false, NULL}
/* A positional argument: the first non-flag argument fills the first ARG
 * row, and so on; one too many is refused. choices ("a|b") or NULL for
 * any string. */
#define FLAG_ARG(label, ptr, choices)                                       \
    {(label), _Generic((ptr), const char **: FLAG_ARG), (ptr), 0, 0, false, \
     (choices)}

/* 2^53: the largest bound an int64_t or uint64_t row can have (every
 * integer up to it is a double). */
#define FLAG_EXACT_MAX 9007199254740992.0

#define NFLAGS(table) (sizeof(table) / sizeof *(table))

enum { FLAGS_OK = 0, FLAGS_HELP = 1, FLAGS_BAD = 2 };

/* Parses argv[1..argc) (argv[0] is the command's own name) against the
 * table. cmd prefixes the messages ("zs train gpt"); usage prints the
 * command's help. Returns FLAGS_OK, FLAGS_HELP after printing the
 * usage on stdout, or FLAGS_BAD after one message on stderr. The table
 * and argv are borrowed; string values point into argv. */
int flags_parse(const char *cmd, const flag *table, size_t n,
                   void (*usage)(FILE *f), int argc, char **argv);

/* The exit status for a result other than FLAGS_OK: 0 after --help,
 * 2 after bad usage. */
int flags_exit(int parse_result);

/* Prints "cmd: <message>" on stderr, for the checks a command makes after
 * parsing (a required flag missing, flags that conflict); returns
 * FLAGS_BAD, which is also 2, the exit status of bad usage. */
__attribute__((format(printf, 2, 3))) int flags_error(const char *cmd,
                                                        const char *fmt, ...);

#endif
