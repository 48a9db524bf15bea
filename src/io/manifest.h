/* checkpoint.json: the manifest that makes the files of a checkpoint one unit.
 *
 * A save writes each file of the checkpoint as dir/NAME.next.PID (atomic, fsync'ed), then
 * dir/checkpoint.json naming the step and every file's size and CRC-32 (atomic: the commit point),
 * then renames each staged file over dir/NAME. A reader (manifest_check) finishes a save that was
 * cut after its commit (the staged files that the manifest names are renamed into place), drops
 * the staged files of a save cut before it (their writer gone), and checks the files it will read
 * against the manifest: it sees the old checkpoint or the new one, never a mix, and a file changed
 * or copied in from another checkpoint is refused. A folder without checkpoint.json (moh before
 * the manifest, Hugging Face, timm) is read as it is.
 *
 * Format {"format": "moh-checkpoint-v1", "step": N (absent: not a training save),
 *         "files": {NAME: {"bytes": B, "crc32": "8 lowercase hex digits"}, ...}}
 * Reader rules (manifest_parse): valid JSON, an object with exactly these keys, each once;
 * "format" exactly "moh-checkpoint-v1"; "step" an integer in [0, 1e15]; "files" an object of
 * 1..5 distinct names from config.json, model.safetensors, optimizer.safetensors, tokenizer.json,
 * tokenizer_config.json, with config.json and model.safetensors among them; "bytes" an integer in
 * [0, 2^53]; "crc32" exactly 8 lowercase hex digits; nothing else anywhere. */
#ifndef MOH_MANIFEST_H
#define MOH_MANIFEST_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "moh.h"

#define CKPT_MANIFEST "checkpoint.json"
#define CKPT_MAX_FILES 5

typedef struct ckpt_file_sum {
    char name[32];   /* one of the checkpoint's file names */
    uint64_t bytes;
    uint32_t crc32;  /* zlib's CRC-32 of the whole file */
} ckpt_file_sum;

typedef struct ckpt_manifest {
    long step;       /* optimizer steps of the save; -1: not a training save */
    int n;
    ckpt_file_sum files[CKPT_MAX_FILES];
} ckpt_manifest;

/* Parses a manifest's text (len bytes, need not be NUL-terminated) by the rules above. label
 * starts every message. MOH_OK, MOH_E_FORMAT naming the field and the expected value, MOH_E_NOMEM. */
int manifest_parse(ckpt_manifest *mf, const char *text, size_t len, const char *label, moh_error *err);

/* The staged name of dir/name written by this process: dir/name.next.PID (out, cap bytes). */
void manifest_staged_path(char *out, size_t cap, const char *dir, const char *name);

/* Commits a save: the staged files of names[n] (manifest_staged_path, written and fsync'ed by the
 * caller) are summed into dir/checkpoint.json (step; -1 for none), written atomically, then each
 * is renamed over dir/NAME and the folder synced; tokenizer files not in names are removed (a
 * byte model saved over a BPE one). On an error before the commit the staged files are removed and
 * the previous checkpoint is untouched. MOH_OK, MOH_E_IO naming the file, MOH_E_NOMEM. */
int manifest_commit(const char *dir, const char *const *names, int n, long step, moh_error *err);

/* Removes the staged files of this process (a save that failed before its commit). */
void manifest_discard(const char *dir);

/* Brings dir to its last committed save and checks it before a read. Without dir/checkpoint.json:
 * *found = false, nothing done. Else: staged files matching the manifest are renamed into place,
 * other staged files whose writer has ended are removed; then every listed file is checked against
 * its size and CRC-32, optimizer.safetensors only when with_optimizer (a resume). *model_missing
 * (may be NULL: then an error) is set instead of failing when model.safetensors alone is missing
 * (a resume writes it again from optimizer.safetensors). mf (may be NULL) gets the manifest.
 * Errors name the file, the save's step and how to go on: MOH_E_FORMAT (a file that differs from
 * the manifest, one it does not list, a damaged manifest), MOH_E_IO, MOH_E_NOMEM. */
int manifest_check(const char *dir, bool with_optimizer, bool *found, bool *model_missing, ckpt_manifest *mf,
                   moh_error *err);
#endif
