/* libFuzzer target: manifest_parse (src/io/manifest.c, checkpoint.json) on arbitrary bytes.
 * Invariants (trap on violation): an accepted manifest lists 1..5 distinct files with config.json
 * and model.safetensors among them and a step of -1 or >= 0; every refusal is one NUL-terminated
 * line starting with the label and leaves no files listed. */
#include <string.h>

#include "io/manifest.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ckpt_manifest mf;
    moh_error err;
    memset(&err, 0, sizeof err);
    const int rc = manifest_parse(&mf, (const char *)data, size, "fuzz.json", &err);
    if (rc == MOH_OK) {
        if (mf.n < 2 || mf.n > CKPT_MAX_FILES || mf.step < -1) __builtin_trap();
        int cfg = 0, model = 0;
        for (int i = 0; i < mf.n; i++) {
            cfg += !strcmp(mf.files[i].name, "config.json");
            model += !strcmp(mf.files[i].name, "model.safetensors");
            for (int j = i + 1; j < mf.n; j++)
                if (!strcmp(mf.files[i].name, mf.files[j].name)) __builtin_trap();
        }
        if (cfg != 1 || model != 1) __builtin_trap();
        return 0;
    }
    if (mf.n != 0 || err.code != rc || !memchr(err.msg, '\0', sizeof err.msg)) __builtin_trap();
    if (rc != MOH_E_NOMEM && (strchr(err.msg, '\n') || strncmp(err.msg, "fuzz.json: ", 11) != 0)) __builtin_trap();
    return 0;
}
