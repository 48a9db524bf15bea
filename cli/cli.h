/* Subcommands of the moh CLI: each takes argc/argv after the subcommand name, returns an exit
 * code (0 success, 1 runtime error, 2 usage error) and prints errors as one line to stderr. */
#ifndef MOH_CLI_H
#define MOH_CLI_H
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

int cmd_layer(int argc, char **argv);
int cmd_train(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_sample(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_analyze(int argc, char **argv);

/* A config given as a file path, or as a NAME found as configs/NAME.json in the working directory
 * or beside the executable (../configs, or ../share/moh/configs once installed). Writes the path
 * found to out; false if none. */
bool cli_resolve_config(const char *name, char *out, size_t cap);

/* moh --list-configs: every named config, one line each (model, size, heads active), to f.
 * Returns 0, or 1 (message on stderr) when no config folder is found. */
int cli_list_configs(FILE *f);
/* The named config nearest to a mistyped name (moh75 -> moh-75) into out; false if none is close. */
bool cli_suggest_config(const char *name, char *out, size_t cap);
/* Prints "moh CMD: --config 'X': no such file ..." with the nearest named config, if any. */
void cli_config_not_found(const char *cmd, const char *config);

#endif
