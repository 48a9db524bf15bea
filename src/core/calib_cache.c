#include "core/calib_cache.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fsutil.h"

enum { CACHE_MAX_BYTES = 1 << 20 };

/* The value of /proc/cpuinfo's first line starting with field (NULL: none) into out[cap]. */
static bool cpuinfo_field(const char *field, char *out, size_t cap) {
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return false;
    char line[512];
    bool found = false;
    const size_t n = strlen(field);
    while (!found && fgets(line, sizeof line, f)) {
        if (strncmp(line, field, n)) continue;
        const char *v = line + n;
        while (*v == ' ' || *v == '\t') v++;
        if (*v != ':') continue; /* "model" is not "model name" */
        for (v++; *v == ' ' || *v == '\t'; v++) {
        }
        snprintf(out, cap, "%s", v);
        out[strcspn(out, "\n")] = 0;
        found = true;
    }
    fclose(f);
    return found;
}

void calib_cpu_model(char *out, size_t cap) {
    if (!cpuinfo_field("model name", out, cap)) snprintf(out, cap, "unknown");
}

void calib_cpu_id(char *out, size_t cap) {
    char name[256], fam[32], model[32];
    calib_cpu_model(name, sizeof name);
    if (!cpuinfo_field("cpu family", fam, sizeof fam)) snprintf(fam, sizeof fam, "?");
    if (!cpuinfo_field("model", model, sizeof model)) snprintf(model, sizeof model, "?");
    snprintf(out, cap, "%s (%s/%s)", name, fam, model);
}

static bool cache_dir(char *dir, size_t cap) {
    const char *m = getenv("MOH_CACHE_DIR"), *x = getenv("XDG_CACHE_HOME"), *h = getenv("HOME");
    int n;
    if (m) {
        if (!*m || !strcmp(m, "off")) return false;
        n = snprintf(dir, cap, "%s", m);
    } else if (x && x[0] == '/') {
        n = snprintf(dir, cap, "%s/moh", x);
    } else if (h && h[0] == '/') {
        n = snprintf(dir, cap, "%s/.cache/moh", h);
    } else {
        return false;
    }
    return n > 0 && (size_t)n < cap;
}

bool calib_cache_path(const char *kind, char *path, size_t cap) {
    char dir[4096];
    if (!cache_dir(dir, sizeof dir)) return false;
    const int n = snprintf(path, cap, "%s/%s.tsv", dir, kind);
    return n > 0 && (size_t)n < cap;
}

/* The values of line [p, e) when its key is key: true with v[0..n) set. */
static bool parse_line(const char *p, const char *e, const char *key, double *v, int n) {
    const size_t kl = strlen(key);
    if ((size_t)(e - p) <= kl || memcmp(p, key, kl) || p[kl] != '\t') return false;
    p += kl;
    double tmp[CALIB_MAX_VALUES];
    int i = 0;
    while (p < e && *p == '\t') {
        p++;
        char num[64];
        size_t k = 0;
        while (p < e && *p != '\t' && k + 1 < sizeof num) num[k++] = *p++;
        num[k] = 0;
        if (k == 0 || i >= CALIB_MAX_VALUES || (p < e && *p != '\t')) return false;
        char *end = NULL;
        errno = 0;
        const double x = strtod(num, &end);
        if (end != num + k || errno || !isfinite(x) || strspn(num, "0123456789.-+eE") != k) /* decimal only */
            return false;
        tmp[i++] = x;
    }
    if (p != e || i != n) return false;
    memcpy(v, tmp, sizeof(double) * (size_t)n);
    return true;
}

bool calib_cache_parse(const char *text, size_t len, const char *key, double *v, int n) {
    if (n < 1 || n > CALIB_MAX_VALUES || !*key) return false;
    bool found = false;
    for (const char *p = text, *end = text + len; p < end;) {
        const char *e = memchr(p, '\n', (size_t)(end - p));
        if (!e) break; /* an unterminated last line: a write cut short */
        found = parse_line(p, e, key, v, n) || found;
        p = e + 1;
    }
    return found;
}

bool calib_cache_get(const char *kind, const char *key, double *v, int n) {
    char path[4200];
    if (!calib_cache_path(kind, path, sizeof path)) return false;
    moh_error err = {0};
    size_t len = 0;
    char *text = fs_read_file(path, CACHE_MAX_BYTES, &len, &err);
    if (!text) return false;
    const bool ok = calib_cache_parse(text, len, key, v, n);
    free(text);
    return ok;
}

bool calib_cache_put(const char *kind, const char *key, const double *v, int n) {
    char path[4200], dir[4096];
    const size_t kl = strlen(key);
    if (n < 1 || n > CALIB_MAX_VALUES || kl == 0 || kl >= CALIB_MAX_KEY || strpbrk(key, "\t\n")) return false;
    if (!calib_cache_path(kind, path, sizeof path) || !cache_dir(dir, sizeof dir)) return false;
    moh_error err = {0};
    if (fs_mkdir_p(dir, &err)) return false;
    size_t len = 0;
    char *old = fs_read_file(path, CACHE_MAX_BYTES, &len, &err);
    const size_t cap = (old ? len : 0) + kl + 32 * (size_t)n + 4;
    char *out = malloc(cap);
    if (!out) {
        free(old);
        return false;
    }
    size_t at = 0;
    for (const char *p = old, *end = old ? old + len : NULL; p && p < end;) { /* keep the other keys' lines */
        const char *e = memchr(p, '\n', (size_t)(end - p));
        if (!e) break;
        if (!((size_t)(e - p) > kl && !memcmp(p, key, kl) && p[kl] == '\t')) {
            memcpy(out + at, p, (size_t)(e - p + 1));
            at += (size_t)(e - p + 1);
        }
        p = e + 1;
    }
    free(old);
    memcpy(out + at, key, kl);
    at += kl;
    for (int i = 0; i < n; i++) at += (size_t)snprintf(out + at, cap - at, "\t%.6g", isfinite(v[i]) ? v[i] : 0.0);
    out[at++] = '\n';
    const bool ok = fs_write_atomic(path, out, at, &err) == MOH_OK;
    free(out);
    return ok;
}
