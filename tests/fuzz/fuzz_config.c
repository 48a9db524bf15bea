/* libFuzzer target: moh_attn_config_parse_json on arbitrary bytes (not NUL-terminated).
 * Invariants checked (trap on violation): a parsed config validates; every error message is one
 * NUL-terminated line that starts with the label. */
#include "moh.h"

#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    moh_attn_config c;
    moh_error err;
    memset(&err, 0, sizeof err);
    int rc = moh_attn_config_parse_json(&c, (const char *)data, size, "fuzz.json", &err);
    if (rc == MOH_OK) {
        if (moh_attn_config_validate(&c, "fuzz.json", &err) != MOH_OK) __builtin_trap();
        if (c.fused_qkv) __builtin_trap();
        return 0;
    }
    if (err.code != rc || !memchr(err.msg, '\0', sizeof err.msg)) __builtin_trap();
    if (strchr(err.msg, '\n') || strncmp(err.msg, "fuzz.json: ", 11) != 0) __builtin_trap();
    return 0;
}
