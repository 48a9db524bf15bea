/* Byte-level text data: loading, train/validation split, batches, evaluation chunks, entropy.
 *
 * Split of a single file: val gets k = ceil(len * val_fraction) bytes at the end, then its start p
 * = len - k moves back to the start of its line (the byte after the previous '\n', or 0), so the
 * line holding byte p goes wholly to val and no line is split. train = bytes[0, p), val =
 * bytes[p, len). A prepared directory (tools/data/fetch.sh) gives train.txt and val.txt as is.
 */
#include "data/text.h"
#include "core/fsutil.h"
#include "core/rng.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>
#include <sys/stat.h>

/* ---- helpers --------------------------------------------------------------------------------- */

static void text_errno_str(int e, char *buf, size_t cap) {
    if (strerror_r(e, buf, cap) != 0) snprintf(buf, cap, "errno %d", e);
}

/* Empty or binary-looking contents are MOH_E_FORMAT naming label. */
static int text_check_bytes(const char *label, const uint8_t *buf, size_t len, moh_error *err) {
    if (len == 0) return moh_fail(err, MOH_E_FORMAT, "%s: empty file; expected UTF-8 text", label);
    size_t scan = len < TEXT_BINARY_SCAN ? len : TEXT_BINARY_SCAN;
    const uint8_t *nul = memchr(buf, 0, scan);
    if (nul)
        return moh_fail(err, MOH_E_FORMAT,
                        "%s: looks binary (NUL byte at offset %zu in the first 64 KiB); expected a "
                        "UTF-8 text file",
                        label, (size_t)(nul - buf));
    return MOH_OK;
}

/* Opens path for reading and returns its size: a regular file of at most TEXT_MAX_BYTES. hint is
 * appended to the message when the file cannot be opened. */
static int text_open(const char *path, const char *hint, FILE **out, size_t *size,
                     moh_error *err) {
    char es[128];
    *out = NULL;
    *size = 0;
    FILE *f = fs_fopen_read(path);
    if (!f) {
        text_errno_str(errno, es, sizeof es);
        return moh_fail(err, MOH_E_IO, "%s: cannot open: %s%s", path, es, hint);
    }
    struct stat sb;
    if (fstat(fileno(f), &sb) != 0) {
        text_errno_str(errno, es, sizeof es);
        fclose(f);
        return moh_fail(err, MOH_E_IO, "%s: cannot stat: %s", path, es);
    }
    if (!S_ISREG(sb.st_mode)) {
        fclose(f);
        return moh_fail(err, MOH_E_IO, "%s: not a regular file; expected a text file", path);
    }
    if (sb.st_size < 0 || (uint64_t)sb.st_size > TEXT_MAX_BYTES ||
        (uint64_t)sb.st_size > (uint64_t)SIZE_MAX) {
        fclose(f);
        return moh_fail(err, MOH_E_IO,
                        "%s: %lld bytes is over the 4 GiB limit for text files; pass a smaller "
                        "file",
                        path, (long long)sb.st_size);
    }
    *out = f;
    *size = (size_t)sb.st_size;
    return MOH_OK;
}

/* Reads exactly size bytes of f into buf with one fread, then closes f. */
static int text_read_close(FILE *f, const char *path, uint8_t *buf, size_t size, moh_error *err) {
    size_t got = size ? fread(buf, 1, size, f) : 0;
    int bad = ferror(f);
    int e = errno;
    fclose(f);
    if (bad) {
        char es[128];
        text_errno_str(e, es, sizeof es);
        return moh_fail(err, MOH_E_IO, "%s: read failed after %zu of %zu bytes: %s", path, got,
                        size, es);
    }
    if (got != size)
        return moh_fail(err, MOH_E_IO, "%s: file shrank while reading (%zu of %zu bytes)", path,
                        got, size);
    return MOH_OK;
}

static int text_check_fraction(double val_fraction, const char *label, moh_error *err) {
    if (!(val_fraction > 0.0 && val_fraction < 1.0))
        return moh_fail(err, MOH_E_ARG, "%s: val_fraction is %g; expected a number in (0, 1)",
                        label, val_fraction);
    return MOH_OK;
}

/* Splits buf (owned; freed on error) into d as described at the top of the file. */
static int text_split(text_data *d, uint8_t *buf, size_t len, double val_fraction,
                      size_t min_bytes, const char *label, moh_error *err) {
    int rc = text_check_bytes(label, buf, len, err);
    if (rc != MOH_OK) {
        free(buf);
        return rc;
    }
    double want = ceil((double)len * val_fraction);
    size_t k = want >= (double)len ? len : (size_t)want;
    if (k == 0) k = 1;
    size_t target = len - k, p = target;
    while (p > 0 && buf[p - 1] != '\n') p--;
    if (len - p < min_bytes) {
        free(buf);
        return moh_fail(err, MOH_E_FORMAT,
                        "%s: validation split has %zu bytes (the last %g of %zu bytes, from the "
                        "start of a line); need at least %zu: use a longer file or a larger "
                        "val_fraction",
                        label, len - p, val_fraction, len, min_bytes);
    }
    if (p < min_bytes) {
        free(buf);
        if (p < target)
            return moh_fail(err, MOH_E_FORMAT,
                            "%s: training split has %zu bytes; need at least %zu: the line holding "
                            "byte %zu (where validation would start) begins at byte %zu, so use a "
                            "longer file, more line breaks or a smaller val_fraction",
                            label, p, min_bytes, target, p);
        return moh_fail(err, MOH_E_FORMAT,
                        "%s: training split has %zu bytes; need at least %zu: use a longer file or "
                        "a smaller val_fraction",
                        label, p, min_bytes);
    }
    d->train = buf;
    d->n_train = p;
    d->val = buf + p;
    d->n_val = len - p;
    return MOH_OK;
}

/* dir/name into out; MOH_E_IO if it does not fit. */
static int text_join(char *out, size_t cap, const char *dir, const char *name, moh_error *err) {
    size_t n = strlen(dir);
    const char *sep = (n > 0 && dir[n - 1] == '/') ? "" : "/";
    int w = snprintf(out, cap, "%s%s%s", dir, sep, name);
    if (w < 0 || (size_t)w >= cap) return moh_fail(err, MOH_E_IO, "%s: path too long", dir);
    return MOH_OK;
}

/* A prepared split: dir/train.txt and dir/val.txt read into one allocation. */
static int text_load_dir(text_data *d, const char *dir, size_t min_bytes, moh_error *err) {
    char paths[2][4096];
    const char *names[2] = {"train.txt", "val.txt"};
    FILE *files[2] = {NULL, NULL};
    size_t sizes[2] = {0, 0};
    int rc = MOH_OK;
    for (int i = 0; i < 2 && rc == MOH_OK; i++) {
        rc = text_join(paths[i], sizeof paths[i], dir, names[i], err);
        if (rc == MOH_OK)
            rc = text_open(paths[i], " (a data directory holds train.txt and val.txt)", &files[i],
                           &sizes[i], err);
    }
    if (rc == MOH_OK && sizes[0] > (size_t)TEXT_MAX_BYTES - sizes[1])
        rc = moh_fail(err, MOH_E_IO, "%s: train.txt + val.txt exceed the 4 GiB limit for text",
                      dir);
    uint8_t *buf = NULL;
    if (rc == MOH_OK) {
        buf = malloc(sizes[0] + sizes[1] + 1);
        if (!buf)
            rc = moh_fail(err, MOH_E_NOMEM, "%s: out of memory for %zu bytes of text", dir,
                          sizes[0] + sizes[1]);
    }
    for (int i = 0; i < 2; i++) {
        if (!files[i]) continue;
        if (rc == MOH_OK)
            rc = text_read_close(files[i], paths[i], buf + (i ? sizes[0] : 0), sizes[i], err);
        else fclose(files[i]);
        files[i] = NULL;
    }
    for (int i = 0; i < 2 && rc == MOH_OK; i++) {
        const uint8_t *b = buf + (i ? sizes[0] : 0);
        rc = text_check_bytes(paths[i], b, sizes[i], err);
        if (rc == MOH_OK && sizes[i] < min_bytes)
            rc = moh_fail(err, MOH_E_FORMAT, "%s: has %zu bytes; need at least %zu", paths[i],
                          sizes[i], min_bytes);
    }
    if (rc != MOH_OK) {
        free(buf);
        return rc;
    }
    d->train = buf;
    d->n_train = sizes[0];
    d->val = buf + sizes[0];
    d->n_val = sizes[1];
    return MOH_OK;
}

/* ---- public API ------------------------------------------------------------------------------ */

int text_data_load(text_data *d, const char *path, double val_fraction, size_t min_bytes,
                   moh_error *err) {
    if (!d) return moh_fail(err, MOH_E_ARG, "text_data_load: d is NULL");
    memset(d, 0, sizeof *d);
    if (!path) return moh_fail(err, MOH_E_ARG, "text_data_load: path is NULL");
    int rc = text_check_fraction(val_fraction, path, err);
    if (rc != MOH_OK) return rc;
    struct stat sb;
    if (stat(path, &sb) != 0) {
        char es[128];
        text_errno_str(errno, es, sizeof es);
        return moh_fail(err, MOH_E_IO, "%s: cannot open: %s", path, es);
    }
    if (S_ISDIR(sb.st_mode)) return text_load_dir(d, path, min_bytes, err);
    FILE *f;
    size_t size;
    rc = text_open(path, "", &f, &size, err);
    if (rc != MOH_OK) return rc;
    uint8_t *buf = malloc(size + 1);
    if (!buf) {
        fclose(f);
        return moh_fail(err, MOH_E_NOMEM, "%s: out of memory for %zu bytes of text", path, size);
    }
    rc = text_read_close(f, path, buf, size, err);
    if (rc != MOH_OK) {
        free(buf);
        return rc;
    }
    return text_split(d, buf, size, val_fraction, min_bytes, path, err);
}

int text_data_from_buffer(text_data *d, const uint8_t *buf, size_t len, double val_fraction,
                          size_t min_bytes, const char *label, moh_error *err) {
    if (!label) label = "<memory>";
    if (!d) return moh_fail(err, MOH_E_ARG, "%s: text_data_from_buffer: d is NULL", label);
    memset(d, 0, sizeof *d);
    if (!buf && len > 0)
        return moh_fail(err, MOH_E_ARG, "%s: text_data_from_buffer: buf is NULL", label);
    int rc = text_check_fraction(val_fraction, label, err);
    if (rc != MOH_OK) return rc;
    if ((uint64_t)len > TEXT_MAX_BYTES)
        return moh_fail(err, MOH_E_IO, "%s: %zu bytes is over the 4 GiB limit for text", label,
                        len);
    uint8_t *copy = malloc(len + 1);
    if (!copy)
        return moh_fail(err, MOH_E_NOMEM, "%s: out of memory for %zu bytes of text", label, len);
    if (len) memcpy(copy, buf, len);
    return text_split(d, copy, len, val_fraction, min_bytes, label, err);
}

uint32_t text_data_crc(const text_data *d) {
    uLong c = crc32_z(0L, d->train, d->n_train);
    return (uint32_t)crc32_z(c, d->val, d->n_val);
}

void text_data_free(text_data *d) {
    if (!d) return;
    free(d->train);
    memset(d, 0, sizeof *d);
}

double text_entropy_bits(const uint8_t *bytes, size_t n) {
    if (!bytes || n == 0) return 0.0;
    size_t count[256] = {0};
    for (size_t i = 0; i < n; i++) count[bytes[i]]++;
    double h = 0.0, inv = 1.0 / (double)n;
    for (int s = 0; s < 256; s++) {
        if (!count[s]) continue;
        double p = (double)count[s] * inv;
        h -= p * log2(p);
    }
    return h > 0.0 ? h : 0.0; /* a single symbol gives -0.0 */
}

/* The window offset of one example: uniform in [0, m) by rejection (no modulo bias). */
static size_t text_draw_offset(uint64_t *rng, uint64_t m) {
    const uint64_t reject_below = (0 - m) % m; /* 2^64 mod m: drawing r >= this makes r % m uniform */
    uint64_t r;
    do r = moh_rng_next(rng);
    while (r < reject_below);
    return (size_t)(r % m);
}

/* The checks of text_batch and text_batch_ids. */
static int text_batch_check(const void *data, size_t n, int B, int T, const uint64_t *rng, const int *tokens,
                            const int *targets, const char *unit, moh_error *err) {
    if (!data || !rng || !tokens || !targets)
        return moh_fail(err, MOH_E_ARG, "text_batch: NULL %s, rng, tokens or targets", unit);
    if (B < 1 || T < 1)
        return moh_fail(err, MOH_E_ARG, "text_batch: B = %d, T = %d; expected both >= 1", B, T);
    if (n < (size_t)T + 1)
        return moh_fail(err, MOH_E_ARG, "text_batch: %zu %s of text; need at least T+1 = %zu for one window", n,
                        unit, (size_t)T + 1);
    return MOH_OK;
}

int text_batch(const uint8_t *bytes, size_t n, int B, int T, uint64_t *rng, int *tokens,
               int *targets, moh_error *err) {
    int rc = text_batch_check(bytes, n, B, T, rng, tokens, targets, "bytes", err);
    if (rc) return rc;
    const uint64_t m = (uint64_t)(n - (size_t)T); /* offsets 0..m-1 */
    const size_t Ts = (size_t)T;
    for (size_t b = 0; b < (size_t)B; b++) {
        const uint8_t *w = bytes + text_draw_offset(rng, m);
        int *tok = tokens + b * Ts, *tgt = targets + b * Ts;
        for (size_t t = 0; t < Ts; t++) {
            tok[t] = w[t];
            tgt[t] = w[t + 1];
        }
    }
    return MOH_OK;
}

int text_batch_ids(const int *ids, size_t n, int B, int T, uint64_t *rng, int *tokens, int *targets,
                   moh_error *err) {
    int rc = text_batch_check(ids, n, B, T, rng, tokens, targets, "tokens", err);
    if (rc) return rc;
    const uint64_t m = (uint64_t)(n - (size_t)T);
    const size_t Ts = (size_t)T;
    for (size_t b = 0; b < (size_t)B; b++) {
        const int *w = ids + text_draw_offset(rng, m);
        memcpy(tokens + b * Ts, w, sizeof(int) * Ts);
        memcpy(targets + b * Ts, w + 1, sizeof(int) * Ts);
    }
    return MOH_OK;
}

long text_eval_num_chunks(size_t n, int T) {
    if (T < 1) return 0;
    size_t len = (size_t)T + 1;
    return (long)(n / len + (n % len >= 2 ? 1 : 0));
}

long text_eval_num_preds(size_t n, int T) {
    if (T < 1) return 0;
    return (long)n - text_eval_num_chunks(n, T) - (n % ((size_t)T + 1) == 1);
}

int text_eval_chunk_ids(const int *ids, size_t n, int T, long c, int *tokens, int *targets) {
    if (!ids || !tokens || !targets || T < 1 || c < 0 || c >= text_eval_num_chunks(n, T)) return 0;
    const size_t start = (size_t)c * ((size_t)T + 1);
    const size_t len = n - start < (size_t)T + 1 ? n - start : (size_t)T + 1;
    memcpy(tokens, ids + start, sizeof(int) * (len - 1));
    memcpy(targets, ids + start + 1, sizeof(int) * (len - 1));
    return (int)(len - 1);
}

int text_eval_chunk(const uint8_t *bytes, size_t n, int T, long c, int *tokens, int *targets) {
    if (!bytes || !tokens || !targets || T < 1 || c < 0 || c >= text_eval_num_chunks(n, T))
        return 0;
    size_t start = (size_t)c * ((size_t)T + 1);
    size_t len = n - start < (size_t)T + 1 ? n - start : (size_t)T + 1;
    for (size_t i = 0; i + 1 < len; i++) {
        tokens[i] = bytes[start + i];
        targets[i] = bytes[start + i + 1];
    }
    return (int)(len - 1);
}
