#define _XOPEN_SOURCE 700 /* realpath */
#include "core/fsutil.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int sync_parent_dir(const char *path) {
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash == dir) slash[1] = 0;
    else if (slash) *slash = 0;
    else snprintf(dir, sizeof dir, ".");
    int fd = open(dir, O_RDONLY);
    if (fd < 0) return -1;
    int rc = fsync(fd);
    close(fd);
    return rc;
}

int fs_write_atomic(const char *path, const void *data, size_t len, moh_error *err) {
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) return moh_fail(err, MOH_E_IO, "%s: cannot create: %s", tmp, strerror(errno));
    const char *p = data;
    size_t left = len;
    while (left > 0) {
        ssize_t w = write(fd, p, left);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            int e = errno;
            close(fd);
            unlink(tmp);
            return moh_fail(err, MOH_E_IO, "%s: write failed: %s", tmp, strerror(e));
        }
        p += w;
        left -= (size_t)w;
    }
    if (fsync(fd) != 0 || close(fd) != 0) {
        int e = errno;
        unlink(tmp);
        return moh_fail(err, MOH_E_IO, "%s: fsync failed: %s", tmp, strerror(e));
    }
    if (rename(tmp, path) != 0) {
        int e = errno;
        unlink(tmp);
        return moh_fail(err, MOH_E_IO, "%s: rename into place failed: %s", path, strerror(e));
    }
    sync_parent_dir(path);
    return MOH_OK;
}

int fs_mkdir_p(const char *dir, moh_error *err) {
    char buf[4096];
    if (snprintf(buf, sizeof buf, "%s", dir) >= (int)sizeof buf)
        return moh_fail(err, MOH_E_IO, "%s: path too long", dir);
    for (char *s = buf + 1; *s; s++) {
        if (*s != '/') continue;
        *s = 0;
        if (mkdir(buf, 0755) != 0 && errno != EEXIST)
            return moh_fail(err, MOH_E_IO, "%s: cannot create directory: %s", buf, strerror(errno));
        *s = '/';
    }
    if (mkdir(buf, 0755) != 0 && errno != EEXIST)
        return moh_fail(err, MOH_E_IO, "%s: cannot create directory: %s", buf, strerror(errno));
    struct stat st;
    if (stat(buf, &st) != 0 || !S_ISDIR(st.st_mode))
        return moh_fail(err, MOH_E_IO, "%s: exists and is not a directory", buf);
    return MOH_OK;
}

FILE *fs_fopen_read(const char *path) {
    const int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return NULL;
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        const int e = errno;
        close(fd);
        errno = e;
    }
    return f;
}

char *fs_read_file(const char *path, size_t max_bytes, size_t *len, moh_error *err) {
    FILE *f = fs_fopen_read(path);
    if (!f) {
        moh_fail(err, MOH_E_IO, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        fclose(f);
        moh_fail(err, MOH_E_IO, "%s: not a regular file", path);
        return NULL;
    }
    if ((size_t)st.st_size > max_bytes) {
        fclose(f);
        moh_fail(err, MOH_E_IO, "%s: %lld bytes, larger than the %zu-byte limit", path,
                 (long long)st.st_size, max_bytes);
        return NULL;
    }
    char *buf = malloc((size_t)st.st_size + 1);
    if (!buf) {
        fclose(f);
        moh_fail(err, MOH_E_NOMEM, "%s: out of memory", path);
        return NULL;
    }
    size_t n = fread(buf, 1, (size_t)st.st_size, f);
    int bad = ferror(f);
    fclose(f);
    if (bad || n != (size_t)st.st_size) {
        free(buf);
        moh_fail(err, MOH_E_IO, "%s: read error (got %zu of %lld bytes)", path, n, (long long)st.st_size);
        return NULL;
    }
    buf[n] = 0;
    *len = n;
    return buf;
}

int fs_remove_stale_tmp(const char *dir) {
    static const char *const names[] = {"config.json",    "model.safetensors",    "optimizer.safetensors",
                                        "metrics.jsonl",  "checkpoint.json",      "tokenizer.json",
                                        "tokenizer_config.json"};
    DIR *d = opendir(dir);
    if (!d) return 0;
    int removed = 0;
    for (struct dirent *e; (e = readdir(d));) {
        for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
            const size_t n = strlen(names[i]);
            if (strncmp(e->d_name, names[i], n) || strncmp(e->d_name + n, ".tmp.", 5)) continue;
            const char *digits = e->d_name + n + 5;
            char *end = NULL;
            errno = 0;
            const long pid = strtol(digits, &end, 10);
            if (end == digits || *end || errno || pid <= 0 || pid > INT_MAX) continue;
            if (kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue; /* its writer may still run */
            char path[4200];
            struct stat sb;
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            if (lstat(path, &sb) == 0 && S_ISREG(sb.st_mode) && unlink(path) == 0) removed++;
        }
    }
    closedir(d);
    return removed;
}

bool fs_has_suffix(const char *s, const char *suffix) {
    const size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

bool fs_absolute(const char *path, char *out, size_t cap) {
    char buf[PATH_MAX];
    if (!realpath(path, buf) || strlen(buf) >= cap) return false;
    memcpy(out, buf, strlen(buf) + 1);
    return true;
}

/* A file moh reads from a checkpoint or model folder (existing: whether it is there now; another
 * *.safetensors is a shard of a Hugging Face folder only when it exists). */
static bool folder_input_name(const char *name, bool existing) {
    static const char *const names[] = {"config.json", "model.safetensors", "optimizer.safetensors", "checkpoint.json",
                                        "tokenizer.json", "tokenizer_config.json", "metrics.jsonl",
                                        "model.safetensors.index.json"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!strcmp(name, names[i])) return true;
    return existing && fs_has_suffix(name, ".safetensors");
}

int fs_check_output(const char *opt, const char *out, const char *const *inputs, int n, moh_error *err) {
    struct stat so, sp, si;
    if (!out[0]) return moh_fail(err, MOH_E_ARG, "%s: an empty path (expected a file or folder path)", opt);
    const bool exists = stat(out, &so) == 0;
    /* outputs are written beside and renamed into place: a device or FIFO would be replaced, not written */
    if (exists && !S_ISREG(so.st_mode) && !S_ISDIR(so.st_mode))
        return moh_fail(err, MOH_E_ARG, "%s %s is a device, FIFO or socket (expected a regular file or folder path)",
                        opt, out);
    char parent[4096];
    snprintf(parent, sizeof parent, "%s", out);
    char *slash = strrchr(parent, '/');
    const char *base = slash ? slash + 1 : out;
    if (slash == parent) parent[1] = '\0';
    else if (slash) *slash = '\0';
    else snprintf(parent, sizeof parent, ".");
    const bool have_parent = stat(parent, &sp) == 0;
    for (int i = 0; i < n; i++) {
        if (!inputs[i] || stat(inputs[i], &si) != 0) continue;
        if (S_ISDIR(si.st_mode)) {
            if (have_parent && sp.st_dev == si.st_dev && sp.st_ino == si.st_ino && folder_input_name(base, exists))
                return moh_fail(err, MOH_E_ARG, "%s %s would overwrite %s/%s, an input of this command: choose another "
                                "path", opt, out, inputs[i], base);
            if (!exists) continue;
            DIR *d = opendir(inputs[i]); /* a link to one of the folder's files from elsewhere */
            for (struct dirent *e; d && (e = readdir(d));) {
                char path[4400];
                struct stat sf;
                snprintf(path, sizeof path, "%s/%s", inputs[i], e->d_name);
                if (folder_input_name(e->d_name, true) && stat(path, &sf) == 0 && sf.st_dev == so.st_dev &&
                    sf.st_ino == so.st_ino) {
                    closedir(d);
                    return moh_fail(err, MOH_E_ARG, "%s %s would overwrite %s, an input of this command: choose "
                                    "another path", opt, out, path);
                }
            }
            if (d) closedir(d);
        } else if (exists && si.st_dev == so.st_dev && si.st_ino == so.st_ino) {
            return moh_fail(err, MOH_E_ARG, "%s %s would overwrite %s, an input of this command: choose another path",
                            opt, out, inputs[i]);
        }
    }
    return MOH_OK;
}
