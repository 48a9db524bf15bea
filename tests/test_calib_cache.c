/* The measurement cache behind --precision auto (src/core/calib_cache.c): what a line must look like
 * to be read (exact key, tab-separated finite decimals, the right count, a newline), a round trip
 * through a file under MOH_CACHE_DIR (another key's line kept, the same key replaced), and
 * MOH_CACHE_DIR=off turning it off. */
#define _POSIX_C_SOURCE 200809L /* mkdtemp, setenv */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/calib_cache.h"
#include "test_util.h"

static bool parse(const char *text, const char *key, double *v, int n) {
    return calib_cache_parse(text, strlen(text), key, v, n);
}

static void parse_tests(test_ctx *ctx) {
    double v[2] = {0, 0};
    CHECK(ctx, parse("cpu|a\t512.5\t390\n", "cpu|a", v, 2) && v[0] == 512.5 && v[1] == 390.0, "a plain line");
    CHECK(ctx, parse("x\t1\t2\ncpu|a\t3\t4\ncpu|a\t5\t6\n", "cpu|a", v, 2) && v[0] == 5.0 && v[1] == 6.0,
          "the last line of a key wins");
    static const char *const bad[] = {
        "cpu|a\t1\t2",         /* no newline: a write cut short */
        "cpu|a\t1\n",          /* one value where two are asked */
        "cpu|a\t1\t2\t3\n",    /* three */
        "cpu|a\t1\tnan\n",     /* not finite */
        "cpu|a\t1\tinf\n",     /* not finite */
        "cpu|a\t1\t0x10\n",    /* hex: strtod would take it */
        "cpu|a\t1\t 2\n",      /* a blank */
        "cpu|a\t1\t2x\n",      /* trailing bytes */
        "cpu|a\t1\t\t2\n",     /* an empty field */
        "cpu|ab\t1\t2\n",      /* another key that starts alike */
        "cpu|\t1\t2\n",        /* a key that is a prefix */
        " cpu|a\t1\t2\n",      /* not at the line start */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        v[0] = v[1] = -7.0;
        CHECK(ctx, !parse(bad[i], "cpu|a", v, 2) && v[0] == -7.0, "accepted a bad line %zu: %s", i, bad[i]);
    }
    CHECK(ctx, !parse("cpu|a\t1\t2\n", "", v, 2) && !parse("cpu|a\t1\t2\n", "cpu|a", v, 0), "empty key or no values");
}

static void file_tests(test_ctx *ctx) {
    char dir[] = "/tmp/moh_calib_XXXXXX";
    CHECK(ctx, mkdtemp(dir) != NULL, "mkdtemp");
    char sub[64], path[256];
    snprintf(sub, sizeof sub, "%s/d", dir); /* made on the first write */
    setenv("MOH_CACHE_DIR", sub, 1);
    double v[2] = {0, 0};
    CHECK(ctx, !calib_cache_get("precision", "k1", v, 2), "an empty cache has k1");
    CHECK(ctx, calib_cache_put("precision", "k1", (const double[]){1.5, 2.25}, 2), "put k1");
    CHECK(ctx, calib_cache_put("precision", "k2", (const double[]){3, 4}, 2), "put k2");
    CHECK(ctx, calib_cache_put("precision", "k1", (const double[]){5, 6}, 2), "put k1 again");
    CHECK(ctx, calib_cache_get("precision", "k1", v, 2) && v[0] == 5 && v[1] == 6, "k1 replaced: %g %g", v[0], v[1]);
    CHECK(ctx, calib_cache_get("precision", "k2", v, 2) && v[0] == 3 && v[1] == 4, "k2 kept: %g %g", v[0], v[1]);
    CHECK(ctx, calib_cache_path("precision", path, sizeof path) && !strncmp(path, sub, strlen(sub)), "path %s", path);
    FILE *f = fopen(path, "r");
    int lines = 0;
    for (int c; f && (c = fgetc(f)) != EOF;) lines += c == '\n';
    if (f) fclose(f);
    CHECK(ctx, lines == 2, "%d lines in the cache, want 2 (one per key)", lines);
    CHECK(ctx, !calib_cache_put("precision", "a\tb", (const double[]){1, 2}, 2), "a key with a tab was stored");
    setenv("MOH_CACHE_DIR", "off", 1);
    CHECK(ctx, !calib_cache_get("precision", "k1", v, 2) && !calib_cache_put("precision", "k3", v, 2),
          "MOH_CACHE_DIR=off still caches");
    unsetenv("MOH_CACHE_DIR");
    unlink(path);
    rmdir(sub);
    rmdir(dir);
}

int main(void) {
    test_ctx ctx = {0};
    parse_tests(&ctx);
    file_tests(&ctx);
    return test_finish("test_calib_cache", &ctx);
}
