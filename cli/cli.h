/* Subcommands of the moh CLI: each takes argc/argv after the subcommand name, returns an exit
 * code (0 success, 1 runtime error, 2 usage error) and prints errors as one line to stderr. */
#ifndef MOH_CLI_H
#define MOH_CLI_H
#include <stddef.h>

int cmd_layer(int argc, char **argv);

/* Reads a whole file (at most max_bytes) into a NUL-terminated malloc'd buffer; *len = bytes. */
char *cli_read_file(const char *path, size_t max_bytes, size_t *len, char *errbuf, size_t errlen);
#endif
