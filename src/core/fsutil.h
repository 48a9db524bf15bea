/* Small file-system helpers: atomic whole-file writes and mkdir -p. */
#ifndef MOH_FSUTIL_H
#define MOH_FSUTIL_H
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "moh.h"

/* Writes len bytes to path atomically: PATH.tmp.<pid>, fsync, rename, fsync of the directory.
 * An existing file is untouched on error. MOH_OK or MOH_E_IO naming the path and errno text. */
int fs_write_atomic(const char *path, const void *data, size_t len, moh_error *err);
/* Creates dir and missing parents (mode 0755). MOH_OK or MOH_E_IO. */
int fs_mkdir_p(const char *dir, moh_error *err);
/* Removes dir/NAME.tmp.<pid> files of the checkpoint files moh writes there (config.json,
 * model.safetensors, optimizer.safetensors, metrics.jsonl, checkpoint.json, the tokenizer files)
 * whose writer process no longer exists:
 * what a kill -9 during an atomic write leaves. Returns how many were removed (best effort). */
int fs_remove_stale_tmp(const char *dir);
/* fopen(path, "rb") that never blocks on a FIFO or device (O_NONBLOCK open; callers then fstat and
 * reject what is not a regular file). NULL with errno set on failure. */
FILE *fs_fopen_read(const char *path);
/* True when string s ends with suffix (file extensions: ".gguf"; tensor names: "wg.weight"). */
bool fs_has_suffix(const char *s, const char *suffix);
/* The absolute path of an existing path (realpath) into out (cap bytes); false when it cannot be
 * resolved or does not fit. */
bool fs_absolute(const char *path, char *out, size_t cap);
/* Refuses an output path that is one of the command's inputs: the same file as an input file (by
 * any link), or inside an input folder a file that moh reads there (config.json, model.safetensors,
 * optimizer.safetensors, checkpoint.json, tokenizer.json, tokenizer_config.json, metrics.jsonl,
 * model.safetensors.index.json, whether it exists yet or not; another existing *.safetensors). opt names the
 * option in the message; inputs[n] (NULL entries skipped). Also refuses an empty path, and an
 * existing device, FIFO or socket (every output is written beside and renamed into place, which
 * would replace it). MOH_OK, or MOH_E_ARG: "OPT OUT would overwrite INPUT, an input of this command:
 * choose another path". */
int fs_check_output(const char *opt, const char *out, const char *const *inputs, int n, moh_error *err);
/* Reads a whole file (<= max_bytes) into a NUL-terminated malloc'd buffer. MOH_E_IO on error. */
char *fs_read_file(const char *path, size_t max_bytes, size_t *len, moh_error *err);
#endif
