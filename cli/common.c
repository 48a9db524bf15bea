#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

static bool readable(const char *p) { return access(p, R_OK) == 0; }

bool cli_resolve_config(const char *name, char *out, size_t cap) {
    if (readable(name)) {
        snprintf(out, cap, "%s", name);
        return true;
    }
    char exe[PATH_MAX] = "";
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = 0;
        char *slash = strrchr(exe, '/');
        if (slash) *slash = 0;
    }
    const char *dirs[] = {"configs", n > 0 ? exe : NULL};
    for (int i = 0; i < 2; i++) {
        if (!dirs[i]) continue;
        const char *fmt = i == 0 ? "%s/%s.json" : "%s/../configs/%s.json";
        snprintf(out, cap, fmt, dirs[i], name);
        if (readable(out)) return true;
    }
    return false;
}
