/* A small table-driven option parser shared by the subcommands: --name VALUE or --flag. */
#ifndef MOH_CLI_ARGS_H
#define MOH_CLI_ARGS_H
#include <stdbool.h>
#include <stdint.h>

typedef enum arg_kind { ARG_STR, ARG_INT, ARG_LONG, ARG_DOUBLE, ARG_U64, ARG_FLAG } arg_kind;

typedef struct arg_spec {
    const char *name;  /* "--steps" */
    arg_kind kind;
    void *dst;         /* const char **, int *, long *, double *, uint64_t *, bool * */
    const char *meta;  /* value placeholder in help, e.g. "N" (NULL for flags) */
    const char *help;  /* one line; defaults are appended by the caller's text */
    bool required;
} arg_spec;

/* Parses argv[1..argc) against specs. Returns 0 (parsed), 1 (--help printed to stdout), or 2
 * (usage error printed to stderr as one line naming the option and what it expects). */
int args_parse(const char *cmd, int argc, char **argv, const arg_spec *specs, int n,
               const char *synopsis, const char *epilog);

/* The value after the first `name` in argv (before parsing), or NULL. */
const char *args_value(int argc, char **argv, const char *name);

/* moh train: --steps, when given, must be >= 1; --log-every >= 1; --lr in (0, 1000]; --epochs in
 * (0, 1e6] (pass 1 where there is none). Prints the error; 1 on error. */
int args_check_train(int argc, char **argv, long steps, long log_every, double lr, double epochs);
#endif
