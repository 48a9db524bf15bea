/* A small table-driven option parser shared by the subcommands: --name VALUE or --flag. */
#ifndef MOH_CLI_ARGS_H
#define MOH_CLI_ARGS_H
#include <stdbool.h>
#include <stdint.h>

/* ARG_CHOICE: a string that must be one of the '|'-separated words of the spec's meta. */
typedef enum arg_kind { ARG_STR, ARG_INT, ARG_LONG, ARG_DOUBLE, ARG_U64, ARG_FLAG, ARG_CHOICE } arg_kind;

/* Bounds of a numeric value given on the command line (not of the default: -1/0 sentinels stay
 * allowed). lo_kind/hi_kind: 0 = no bound, 1 = inclusive, 2 = exclusive. */
typedef struct arg_range {
    unsigned char lo_kind, hi_kind;
    double lo, hi;
} arg_range;
#define ARG_ANY {0, 0, 0.0, 0.0}
#define ARG_GE(a) {1, 0, (a), 0.0}          /* x >= a */
#define ARG_GT(a) {2, 0, (a), 0.0}          /* x > a */
#define ARG_IN(a, b) {1, 1, (a), (b)}       /* a <= x <= b */
#define ARG_IN_OC(a, b) {2, 1, (a), (b)}    /* a < x <= b */
#define ARG_IN_OO(a, b) {2, 2, (a), (b)}    /* a < x < b */

typedef struct arg_spec {
    const char *name;  /* "--steps" */
    arg_kind kind;
    void *dst;         /* const char ** (STR, CHOICE), int *, long *, double *, uint64_t *, bool * */
    const char *meta;  /* value placeholder in help, e.g. "N" (NULL for flags); CHOICE: "a|b|c" */
    const char *help;  /* one line; defaults are appended by the caller's text */
    bool required;
    arg_range range;   /* checked by args_parse for INT, LONG, DOUBLE, U64; shown in --help */
} arg_spec;

/* Parses argv[1..argc) against specs. Returns 0 (parsed), 1 (--help printed to stdout), or 2
 * (usage error printed to stderr as one line naming the one bad option, its value and what it
 * expects). Rejects: unknown options (suggesting the nearest known one when close: edit distance,
 * a unique prefix, initials like --learning-rate for --lr, or --name=value), a missing value,
 * integers that do not parse or overflow the type, doubles that are not finite (nan, inf), values
 * outside spec.range and CHOICE values outside meta. */
int args_parse(const char *cmd, int argc, char **argv, const arg_spec *specs, int n,
               const char *synopsis, const char *epilog);

/* The index of the name in names[0..n) nearest to key (leading dashes ignored on both sides; the
 * rules of unknown-option suggestions: small edit distance, a unique prefix, initials), or -1. */
int args_nearest(const char *key, const char *const *names, int n);

/* The value after the first `name` in argv (before parsing), or NULL. */
const char *args_value(int argc, char **argv, const char *name);

/* A check across two options, made only when both were given: a_val < b_val. Prints one line
 * naming both ("moh train: --warmup 500 must be less than --steps 100") and returns 1 if not. */
int args_check_less(const char *cmd, int argc, char **argv, const char *a, long a_val, const char *b,
                    long b_val);
#endif
