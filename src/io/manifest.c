/* checkpoint.json (format, reader rules and the save protocol in manifest.h). */
#include "io/manifest.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cjson/cJSON.h>

#include "core/fsutil.h"

#define FORMAT "moh-checkpoint-v1"
#define STAGED ".next."

/* The files a checkpoint may hold (moh's names; what manifest_check owns in a folder). */
static const char *const OWNED[] = {"config.json", "model.safetensors", "optimizer.safetensors", "tokenizer.json",
                                    "tokenizer_config.json"};
enum { N_OWNED = (int)(sizeof OWNED / sizeof OWNED[0]) };

static int owned_index(const char *name, size_t len) {
    for (int i = 0; i < N_OWNED; i++)
        if (strlen(OWNED[i]) == len && !memcmp(OWNED[i], name, len)) return i;
    return -1;
}

static void join(char *out, size_t cap, const char *dir, const char *name) { snprintf(out, cap, "%s/%s", dir, name); }

void manifest_staged_path(char *out, size_t cap, const char *dir, const char *name) {
    snprintf(out, cap, "%s/%s" STAGED "%ld", dir, name, (long)getpid());
}

/* Size and CRC-32 of the regular file at path. MOH_E_IO naming it (ENOENT left in errno). */
static int file_sum(const char *path, uint64_t *bytes, uint32_t *crc, moh_error *err) {
    const int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        const int e = errno;
        moh_fail(err, MOH_E_IO, "%s: cannot open: %s", path, strerror(e));
        errno = e;
        return MOH_E_IO;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        errno = EINVAL;
        return moh_fail(err, MOH_E_IO, "%s: not a regular file", path);
    }
    enum { CHUNK = 1 << 22 };
    unsigned char *buf = malloc(CHUNK);
    if (!buf) {
        close(fd);
        return moh_fail(err, MOH_E_NOMEM, "%s: out of memory", path);
    }
    uLong c = crc32_z(0L, Z_NULL, 0);
    uint64_t total = 0;
    int rc = MOH_OK;
    for (;;) {
        const ssize_t r = read(fd, buf, CHUNK);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            rc = moh_fail(err, MOH_E_IO, "%s: read error: %s", path, strerror(errno));
            break;
        }
        if (r == 0) break;
        c = crc32_z(c, buf, (z_size_t)r);
        total += (uint64_t)r;
    }
    free(buf);
    close(fd);
    *bytes = total;
    *crc = (uint32_t)c;
    return rc;
}

/* ---- the reader ------------------------------------------------------------------------------- */

static bool json_int(const cJSON *v, double lo, double hi) {
    return cJSON_IsNumber(v) && isfinite(v->valuedouble) && v->valuedouble == floor(v->valuedouble) &&
           v->valuedouble >= lo && v->valuedouble <= hi;
}

/* NULL when obj's member names are distinct and each is one of allowed[n]; else the offending
 * name. */
static const char *bad_member(const cJSON *obj, const char *const *allowed, int n) {
    for (const cJSON *a = obj->child; a; a = a->next) {
        bool ok = false;
        for (int i = 0; i < n && !ok; i++) ok = !strcmp(a->string, allowed[i]);
        for (const cJSON *b = a->next; ok && b; b = b->next) ok = strcmp(a->string, b->string) != 0;
        if (!ok) return a->string;
    }
    return NULL;
}

int manifest_parse(ckpt_manifest *mf, const char *text, size_t len, const char *label, moh_error *err) {
    memset(mf, 0, sizeof *mf);
    mf->step = -1;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, false);
    if (!root && !cJSON_GetErrorPtr()) return moh_fail(err, MOH_E_NOMEM, "%s: out of memory", label);
    bool tail = false;
    for (const char *p = end; root && p && p < text + len && !tail; p++)
        tail = !(*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r');
    int rc = MOH_OK;
    static const char *const top[] = {"format", "step", "files"};
    static const char *const per_file[] = {"bytes", "crc32"};
    const char *bad = NULL;
    char shown[64];
    if (!root || tail || memchr(text, '\0', len))
        rc = moh_fail(err, MOH_E_FORMAT, "%s: not valid JSON, expected {\"format\": \"" FORMAT "\", ...}", label);
    else if (!cJSON_IsObject(root))
        rc = moh_fail(err, MOH_E_FORMAT, "%s: the top level is not an object, expected {\"format\": \"" FORMAT "\", ...}",
                      label);
    else if ((bad = bad_member(root, top, 3)))
        rc = moh_fail(err, MOH_E_FORMAT, "%s: key '%s' is unknown or repeated, expected format, step and files once "
                      "each", label, moh_st_quote(shown, sizeof shown, bad));
    const cJSON *fmt = root ? cJSON_GetObjectItemCaseSensitive(root, "format") : NULL;
    const cJSON *step = root ? cJSON_GetObjectItemCaseSensitive(root, "step") : NULL;
    const cJSON *files = root ? cJSON_GetObjectItemCaseSensitive(root, "files") : NULL;
    if (!rc && !(cJSON_IsString(fmt) && !strcmp(fmt->valuestring, FORMAT)))
        rc = moh_fail(err, MOH_E_FORMAT, "%s: field 'format' is %s, expected \"" FORMAT "\"", label,
                      cJSON_IsString(fmt) ? "another string" : "missing or not a string");
    if (!rc && step && !json_int(step, 0, 1e15))
        rc = moh_fail(err, MOH_E_FORMAT, "%s: field 'step' is not an integer in [0, 1e15]", label);
    if (!rc && step) mf->step = (long)step->valuedouble;
    if (!rc && !cJSON_IsObject(files))
        rc = moh_fail(err, MOH_E_FORMAT, "%s: field 'files' is missing or not an object, expected {NAME: {\"bytes\": "
                      "B, \"crc32\": \"HEX8\"}, ...}", label);
    if (!rc && (bad = bad_member(files, OWNED, N_OWNED)))
        rc = moh_fail(err, MOH_E_FORMAT, "%s: files names '%s' (unknown or repeated), expected each of config.json, "
                      "model.safetensors, optimizer.safetensors, tokenizer.json, tokenizer_config.json at most once",
                      label, moh_st_quote(shown, sizeof shown, bad));
    for (const cJSON *f = files ? files->child : NULL; !rc && f; f = f->next) {
        const cJSON *b = cJSON_GetObjectItemCaseSensitive(f, "bytes"), *c = cJSON_GetObjectItemCaseSensitive(f, "crc32");
        const char *s = cJSON_IsString(c) ? c->valuestring : NULL;
        bool hex = s && strlen(s) == 8;
        for (int i = 0; hex && i < 8; i++) hex = (s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f');
        if (!cJSON_IsObject(f) || bad_member(f, per_file, 2) || !json_int(b, 0, 9007199254740992.0) || !hex) {
            rc = moh_fail(err, MOH_E_FORMAT, "%s: files.%s is not {\"bytes\": an integer >= 0, \"crc32\": 8 lowercase "
                          "hex digits}", label, f->string);
            break;
        }
        ckpt_file_sum *d = &mf->files[mf->n++];
        snprintf(d->name, sizeof d->name, "%s", f->string);
        d->bytes = (uint64_t)b->valuedouble;
        d->crc32 = (uint32_t)strtoul(s, NULL, 16);
    }
    for (int k = 0; k < 2 && !rc; k++) {
        const char *need = k ? "model.safetensors" : "config.json";
        bool have = false;
        for (int i = 0; i < mf->n; i++) have |= !strcmp(mf->files[i].name, need);
        if (!have) rc = moh_fail(err, MOH_E_FORMAT, "%s: files lacks %s, expected every checkpoint to hold it", label, need);
    }
    cJSON_Delete(root);
    if (rc) mf->n = 0;
    return rc;
}

static const ckpt_file_sum *listed(const ckpt_manifest *mf, const char *name) {
    for (int i = 0; i < mf->n; i++)
        if (!strcmp(mf->files[i].name, name)) return &mf->files[i];
    return NULL;
}

/* ---- the writer ------------------------------------------------------------------------------- */

void manifest_discard(const char *dir) {
    char path[4200];
    for (int i = 0; i < N_OWNED; i++) {
        manifest_staged_path(path, sizeof path, dir, OWNED[i]);
        unlink(path);
    }
}

static int sync_dir(const char *dir) {
    const int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return -1;
    const int r = fsync(fd);
    close(fd);
    return r;
}

int manifest_commit(const char *dir, const char *const *names, int n, long step, moh_error *err) {
    ckpt_manifest mf = {.step = step, .n = 0};
    char path[4200], final_path[4200];
    int rc = MOH_OK;
    if (n < 1 || n > CKPT_MAX_FILES) rc = moh_fail(err, MOH_E_ARG, "%s: %d checkpoint files, expected 1..5", dir, n);
    for (int i = 0; !rc && i < n; i++) {
        ckpt_file_sum *f = &mf.files[mf.n++];
        snprintf(f->name, sizeof f->name, "%s", names[i]);
        manifest_staged_path(path, sizeof path, dir, names[i]);
        rc = file_sum(path, &f->bytes, &f->crc32, err);
    }
    char *json = NULL;
    if (!rc) {
        const size_t cap = 256 + (size_t)n * 128;
        if (!(json = malloc(cap))) rc = moh_fail(err, MOH_E_NOMEM, "%s: out of memory", dir);
        size_t used = 0;
        if (!rc) {
            used += (size_t)snprintf(json + used, cap - used, "{\"format\": \"" FORMAT "\"");
            if (step >= 0) used += (size_t)snprintf(json + used, cap - used, ", \"step\": %ld", step);
            used += (size_t)snprintf(json + used, cap - used, ", \"files\": {");
            for (int i = 0; i < mf.n; i++)
                used += (size_t)snprintf(json + used, cap - used, "%s\n  \"%s\": {\"bytes\": %" PRIu64 ", \"crc32\": \"%08"
                                         PRIx32 "\"}", i ? "," : "", mf.files[i].name, mf.files[i].bytes,
                                         mf.files[i].crc32);
            used += (size_t)snprintf(json + used, cap - used, "}}\n");
            join(path, sizeof path, dir, CKPT_MANIFEST);
            rc = fs_write_atomic(path, json, used, err); /* the commit */
        }
        free(json);
    }
    if (rc) {
        manifest_discard(dir);
        return rc;
    }
    for (int i = 0; i < n; i++) { /* a reader may have done it already (manifest_check) */
        manifest_staged_path(path, sizeof path, dir, names[i]);
        join(final_path, sizeof final_path, dir, names[i]);
        if (rename(path, final_path) != 0 && errno != ENOENT && !rc)
            rc = moh_fail(err, MOH_E_IO, "%s: cannot rename %s into place (the save of step %ld is committed; the next "
                          "moh command on this folder finishes it): %s", final_path, path, step, strerror(errno));
    }
    for (int i = 3; !rc && i < N_OWNED; i++) { /* tokenizer files of a model that has none now */
        if (listed(&mf, OWNED[i])) continue;
        join(final_path, sizeof final_path, dir, OWNED[i]);
        if (unlink(final_path) != 0 && errno != ENOENT)
            rc = moh_fail(err, MOH_E_IO, "%s: cannot remove the stale tokenizer file: %s", final_path, strerror(errno));
    }
    if (!rc) sync_dir(dir); /* best effort: a filesystem may not sync folders; the commit is durable */
    return rc;
}

/* ---- the check before a read ------------------------------------------------------------------ */

static void describe_step(char *out, size_t cap, long step) {
    if (step >= 0) snprintf(out, cap, "the save of step %ld", step);
    else snprintf(out, cap, "the save");
}

/* Finishes a committed save (staged files that match mf renamed into place) and drops the staged
 * files of an uncommitted one whose writer has ended. */
static int roll(const char *dir, const ckpt_manifest *mf, moh_error *err) {
    DIR *d = opendir(dir);
    if (!d) return moh_fail(err, MOH_E_IO, "%s: cannot read the folder: %s", dir, strerror(errno));
    int rc = MOH_OK;
    char path[4200], final_path[4200];
    for (struct dirent *e; !rc && (e = readdir(d));) {
        const char *dot = strstr(e->d_name, STAGED);
        if (!dot) continue;
        const int k = owned_index(e->d_name, (size_t)(dot - e->d_name));
        const char *digits = dot + strlen(STAGED);
        char *end = NULL;
        errno = 0;
        long pid = strtol(digits, &end, 10);
        if (k < 0 || end == digits || errno || pid <= 0 || pid > INT_MAX) continue;
        const bool tmp = !strncmp(end, ".tmp.", 5); /* NAME.next.PID.tmp.PID: a staged file being written */
        if (tmp) {
            digits = end + 5;
            pid = strtol(digits, &end, 10);
            if (end == digits || errno || pid <= 0 || pid > INT_MAX) continue;
        }
        if (*end) continue;
        join(path, sizeof path, dir, e->d_name);
        const ckpt_file_sum *want = tmp ? NULL : listed(mf, OWNED[k]);
        uint64_t bytes = 0;
        uint32_t crc = 0;
        moh_error ignore;
        if (want && file_sum(path, &bytes, &crc, &ignore) == MOH_OK && bytes == want->bytes && crc == want->crc32) {
            join(final_path, sizeof final_path, dir, OWNED[k]);
            if (rename(path, final_path) != 0 && errno != ENOENT)
                rc = moh_fail(err, MOH_E_IO, "%s: cannot finish the committed save of step %ld (rename %s): %s",
                              final_path, mf->step, path, strerror(errno));
            continue;
        }
        if (kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue; /* a save in progress */
        unlink(path);                                             /* of a save cut before its commit */
    }
    closedir(d);
    return rc;
}

/* Checks dir's files against mf (see manifest_check). */
static int verify(const char *dir, const ckpt_manifest *mf, bool with_optimizer, bool *model_missing,
                  const char *label, moh_error *err) {
    char path[4200], save[64];
    describe_step(save, sizeof save, mf->step);
    for (int i = 0; i < N_OWNED; i++) {
        const bool opt = !strcmp(OWNED[i], "optimizer.safetensors");
        if (opt && !with_optimizer) continue;
        join(path, sizeof path, dir, OWNED[i]);
        const ckpt_file_sum *want = listed(mf, OWNED[i]);
        struct stat sb;
        if (!want) {
            if (lstat(path, &sb) == 0)
                return moh_fail(err, MOH_E_FORMAT, "%s is not part of the checkpoint: %s (%s) does not list it; remove "
                                "it, or delete %s to take the folder as it is", path, label, save, CKPT_MANIFEST);
            continue;
        }
        const bool model_file = !strcmp(OWNED[i], "model.safetensors");
        uint64_t bytes = 0;
        uint32_t crc = 0;
        moh_error e2;
        if (file_sum(path, &bytes, &crc, &e2) != MOH_OK) {
            if (lstat(path, &sb) != 0 && errno == ENOENT) {
                if (model_file && model_missing) {
                    *model_missing = true;
                    continue;
                }
                return moh_fail(err, MOH_E_FORMAT, "%s is missing: %s lists it (%s); restore it, or delete %s to take "
                                "the folder as it is", path, label, save, CKPT_MANIFEST);
            }
            return moh_fail(err, e2.code, "%s", e2.msg);
        }
        if (bytes == want->bytes && crc == want->crc32) continue;
        const char *fix = model_file && with_optimizer
                              ? "to resume from optimizer.safetensors, move it away: the next save writes it again"
                          : opt ? "a resume needs this save's optimizer state: restore it, or train from the weights "
                                  "with --init"
                                : "restore that save's file, or delete " CKPT_MANIFEST " to take the folder as it is";
        return moh_fail(err, MOH_E_FORMAT, "%s does not match %s (%s: %" PRIu64 " bytes, CRC-32 %08" PRIx32 "; the file: "
                        "%" PRIu64 " bytes, CRC-32 %08" PRIx32 "): changed, or copied from another checkpoint, after "
                        "that save; %s", path, label, save, want->bytes, want->crc32, bytes, crc, fix);
    }
    return MOH_OK;
}

int manifest_check(const char *dir, bool with_optimizer, bool *found, bool *model_missing, ckpt_manifest *out,
                   moh_error *err) {
    *found = false;
    char path[4200];
    join(path, sizeof path, dir, CKPT_MANIFEST);
    char *prev = NULL;
    int rc = MOH_OK;
    /* a save committed while this runs changes the manifest under us: read it again (three times at most) */
    for (int attempt = 0; attempt < 3; attempt++) {
        if (model_missing) *model_missing = false;
        struct stat sb;
        if (lstat(path, &sb) != 0 && errno == ENOENT && !prev) { /* a folder without a manifest */
            const ckpt_manifest none = {.step = -1, .n = 0};
            moh_error ignore;
            roll(dir, &none, &ignore); /* staged files of a first save cut before its commit */
            return MOH_OK;
        }
        size_t len = 0;
        char *text = fs_read_file(path, (size_t)1 << 20, &len, err);
        if (!text) {
            rc = err ? err->code : MOH_E_IO;
            break;
        }
        if (prev && !strcmp(prev, text)) { /* unchanged: the failure stands */
            free(text);
            break;
        }
        free(prev);
        prev = text;
        ckpt_manifest mf;
        if ((rc = manifest_parse(&mf, text, len, path, err))) break;
        *found = true;
        if (out) *out = mf;
        if ((rc = roll(dir, &mf, err))) break;
        if ((rc = verify(dir, &mf, with_optimizer, model_missing, path, err)) == MOH_OK) break;
    }
    free(prev);
    return rc;
}
