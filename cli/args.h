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
#endif
