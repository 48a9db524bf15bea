#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

char *cli_read_file(const char *path, size_t max_bytes, size_t *len, char *errbuf, size_t errlen) {
    if (errlen) errbuf[0] = 0;
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(errbuf, errlen, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap + 1);
    while (buf) {
        if (n == cap) {
            if (cap >= max_bytes) {
                snprintf(errbuf, errlen, "%s: larger than the %zu-byte limit", path, max_bytes);
                free(buf);
                buf = NULL;
                break;
            }
            cap *= 2;
            char *nb = realloc(buf, cap + 1);
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
        }
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0) {
            if (ferror(f)) {
                snprintf(errbuf, errlen, "%s: read error: %s", path, strerror(errno));
                free(buf);
                buf = NULL;
            }
            break;
        }
    }
    if (!buf && !errbuf[0]) snprintf(errbuf, errlen, "%s: out of memory", path);
    fclose(f);
    if (buf) {
        buf[n] = 0;
        *len = n;
    }
    return buf;
}
