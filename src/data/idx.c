/* IDX (MNIST-format) reader, plain or gzip, and the image pipeline of the ViT trainer.
 *
 * Accepted files are those the common readers accept for MNIST data (the format on
 * yann.lecun.com/exdb/mnist; torchvision's read_sn3_pascalvincent_tensor + read_image_file /
 * read_label_file): magic 0x0000TTNN, big-endian (the first two bytes zero, else it is not IDX);
 * type code TT = 0x08, unsigned byte (the other IDX types 0x09..0x0E are valid IDX, but
 * torchvision's MNIST readers refuse them too); NN = 3 dims for images, 1 for labels; NN
 * big-endian uint32 sizes; then exactly prod(sizes) bytes: torchvision's view(*sizes) fails on
 * both missing and trailing bytes, and so does this reader. A zero size is refused (torchvision
 * fails on the empty buffer as well); sizes above IDX_MAX_COUNT / IDX_MAX_SIDE are moh's resource
 * caps and the message states them. gzip: concatenated members and trailing zero padding are
 * accepted and anything else after the stream refused, as Python's gzip module does. */
#include "data/idx.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <zlib.h>

#include "core/fsutil.h"
#include "core/rng.h"

static uint32_t be32(const uint8_t *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

static bool is_gzip(const uint8_t *buf, size_t len) { return len >= 2 && buf[0] == 0x1f && buf[1] == 0x8b; }

int idx_gunzip(const uint8_t *buf, size_t len, size_t max_bytes, uint8_t **out, size_t *out_len,
               const char *label, moh_error *err) {
    *out = NULL;
    *out_len = 0;
    z_stream z;
    memset(&z, 0, sizeof z);
    if (inflateInit2(&z, 16 + MAX_WBITS) != Z_OK)
        return moh_fail(err, MOH_E_NOMEM, "%s: cannot initialise zlib", label);
    size_t cap = len < max_bytes / 4 ? len * 4 + 1024 : max_bytes;
    if (cap > max_bytes) cap = max_bytes;
    if (cap == 0) cap = 1;
    uint8_t *dst = malloc(cap);
    size_t used = 0, in_pos = 0;
    int rc = MOH_OK;
    if (!dst) {
        inflateEnd(&z);
        return moh_fail(err, MOH_E_NOMEM, "%s: out of memory inflating gzip data", label);
    }
    for (;;) {
        if (used == cap) {
            if (cap >= max_bytes) {
                rc = moh_fail(err, MOH_E_FORMAT, "%s: gzip data inflates to more than %zu bytes, "
                              "expected at most that", label, max_bytes);
                break;
            }
            size_t ncap = cap > max_bytes / 2 ? max_bytes : cap * 2;
            uint8_t *nd = realloc(dst, ncap);
            if (!nd) {
                rc = moh_fail(err, MOH_E_NOMEM, "%s: out of memory inflating gzip data (%zu bytes)", label, ncap);
                break;
            }
            dst = nd;
            cap = ncap;
        }
        const size_t in_chunk = len - in_pos < (size_t)UINT_MAX ? len - in_pos : (size_t)UINT_MAX;
        const size_t out_chunk = cap - used < (size_t)UINT_MAX ? cap - used : (size_t)UINT_MAX;
        z.next_in = (Bytef *)(buf + in_pos);
        z.avail_in = (uInt)in_chunk;
        z.next_out = dst + used;
        z.avail_out = (uInt)out_chunk;
        const int zr = inflate(&z, Z_NO_FLUSH);
        in_pos += in_chunk - z.avail_in;
        used += out_chunk - z.avail_out;
        if (zr == Z_STREAM_END) {
            /* another gzip member may follow (concatenated .gz); trailing zero padding is ignored */
            size_t k = in_pos;
            while (k < len && buf[k] == 0) k++;
            if (k >= len) break;
            if (!is_gzip(buf + in_pos, len - in_pos)) {
                rc = moh_fail(err, MOH_E_FORMAT, "%s: %zu unexpected bytes after the gzip stream, "
                              "expected the end of the file or another gzip member", label, len - in_pos);
                break;
            }
            inflateReset(&z);
            continue;
        }
        if (zr == Z_BUF_ERROR && in_pos >= len) {
            rc = moh_fail(err, MOH_E_FORMAT, "%s: gzip data is truncated (ends after %zu compressed "
                          "bytes, %zu inflated), expected a complete stream", label, len, used);
            break;
        }
        if (zr != Z_OK && zr != Z_BUF_ERROR) {
            rc = moh_fail(err, MOH_E_FORMAT, "%s: gzip data is corrupt (zlib: %s)", label,
                          z.msg ? z.msg : "error");
            break;
        }
    }
    inflateEnd(&z);
    if (rc) {
        free(dst);
        return rc;
    }
    *out = dst;
    *out_len = used;
    return MOH_OK;
}

/* Checks the header of a plain IDX buffer: magic, sizes, exact data length. dims[ndim] out. */
static int parse_header(const uint8_t *buf, size_t len, uint32_t magic, int ndim, int64_t *dims,
                        const char *what, const char *label, moh_error *err) {
    const size_t hdr = 4 + 4 * (size_t)ndim;
    if (len < 4)
        return moh_fail(err, MOH_E_FORMAT, "%s: truncated: %zu bytes, expected an IDX %s header of %zu bytes",
                        label, len, what, hdr);
    const uint32_t m = be32(buf);
    if (m != magic) {
        const char *why = (m >> 16) != 0 ? "not an IDX file: its first two bytes must be zero"
                          : ((m >> 8) & 0xff) != 0x08
                              ? "IDX type code is not 0x08 (unsigned byte), the only type of MNIST data"
                              : "wrong number of dims";
        return moh_fail(err, MOH_E_FORMAT,
                        "%s: bad magic 0x%08x, expected 0x%08x (IDX unsigned-byte %s, %d dims): %s",
                        label, m, magic, what, ndim, why);
    }
    if (len < hdr)
        return moh_fail(err, MOH_E_FORMAT, "%s: truncated header: %zu bytes, expected %zu", label, len, hdr);
    uint64_t total = 1;
    for (int i = 0; i < ndim; i++) {
        const uint32_t v = be32(buf + 4 + 4 * i);
        const uint32_t hi = i == 0 ? IDX_MAX_COUNT : IDX_MAX_SIDE;
        if (v == 0 || v > hi)
            return moh_fail(err, MOH_E_FORMAT, "%s: size %d of the %s header is %u, expected 1..%u",
                            label, i, what, v, hi);
        dims[i] = v;
        total *= v; /* <= 1e8 * 4096^2 < 2^64 */
    }
    const uint64_t have = len - hdr;
    if (have < total)
        return moh_fail(err, MOH_E_FORMAT, "%s: truncated: %llu data bytes, expected %llu for the "
                        "header's sizes", label, (unsigned long long)have, (unsigned long long)total);
    if (have > total)
        return moh_fail(err, MOH_E_FORMAT, "%s: %llu bytes after the data, expected none (header "
                        "sizes give %llu data bytes)", label, (unsigned long long)(have - total),
                        (unsigned long long)total);
    return MOH_OK;
}

/* Inflates when gzip; *plain points to the bytes to parse, *owned to free afterwards. */
static int maybe_gunzip(const uint8_t *buf, size_t len, size_t max_bytes, const uint8_t **plain,
                        size_t *plain_len, uint8_t **owned, const char *label, moh_error *err) {
    *owned = NULL;
    *plain = buf;
    *plain_len = len;
    if (!is_gzip(buf, len)) return MOH_OK;
    int rc = idx_gunzip(buf, len, max_bytes, owned, plain_len, label, err);
    if (rc) return rc;
    *plain = *owned;
    return MOH_OK;
}

/* The payload of an IDX file (inflated when gzip) with a valid header of ndim dimensions into d:
 * a copy into *out (malloc'd, the product of d bytes). MOH_E_ARG, the header's errors, MOH_E_NOMEM. */
static int read_idx(const uint8_t *buf, size_t len, size_t max_bytes, uint32_t magic, int ndim, int64_t *d,
                    const char *what, const char *label, uint8_t **out, moh_error *err) {
    *out = NULL;
    if (!buf && len) return moh_fail(err, MOH_E_ARG, "%s: NULL buffer", label);
    const uint8_t *p = NULL;
    uint8_t *owned = NULL;
    size_t n;
    int rc = maybe_gunzip(buf, len, max_bytes, &p, &n, &owned, label, err);
    if (!rc) rc = parse_header(p, n, magic, ndim, d, what, label, err);
    if (!rc) {
        size_t bytes = 1;
        for (int i = 0; i < ndim; i++) bytes *= (size_t)d[i];
        *out = malloc(bytes ? bytes : 1);
        if (!*out) rc = moh_fail(err, MOH_E_NOMEM, "%s: out of memory for %zu bytes of %s", label, bytes, what);
        else memcpy(*out, p + 4 + 4 * (size_t)ndim, bytes);
    }
    free(owned);
    return rc;
}

int idx_parse_images(idx_images *out, const uint8_t *buf, size_t len, size_t max_bytes,
                     const char *label, moh_error *err) {
    memset(out, 0, sizeof *out);
    int64_t d[3];
    const int rc = read_idx(buf, len, max_bytes, IDX_MAGIC_IMAGES, 3, d, "images", label ? label : "<memory>",
                            &out->pixels, err);
    if (rc) return rc;
    out->n = (int)d[0];
    out->rows = (int)d[1];
    out->cols = (int)d[2];
    return MOH_OK;
}

int idx_parse_labels(idx_labels *out, const uint8_t *buf, size_t len, size_t max_bytes,
                     const char *label, moh_error *err) {
    memset(out, 0, sizeof *out);
    int64_t d[1];
    const int rc = read_idx(buf, len, max_bytes, IDX_MAGIC_LABELS, 1, d, "labels", label ? label : "<memory>",
                            &out->labels, err);
    if (rc) return rc;
    out->n = (int)d[0];
    return MOH_OK;
}

void idx_images_free(idx_images *im) {
    if (!im) return;
    free(im->pixels);
    memset(im, 0, sizeof *im);
}

void idx_labels_free(idx_labels *lb) {
    if (!lb) return;
    free(lb->labels);
    memset(lb, 0, sizeof *lb);
}

static int build_split(idx_split *s, idx_images *im, idx_labels *lb, int num_classes,
                       const char *img_label, const char *lab_label, moh_error *err) {
    if (im->n != lb->n)
        return moh_fail(err, MOH_E_FORMAT, "%s: %d labels, expected %d (one per image in %s)",
                        lab_label, lb->n, im->n, img_label);
    for (int i = 0; i < lb->n; i++)
        if (lb->labels[i] >= num_classes)
            return moh_fail(err, MOH_E_FORMAT, "%s: label %d of item %d, expected 0..%d (num_classes %d)",
                            lab_label, lb->labels[i], i, num_classes - 1, num_classes);
    s->n = im->n;
    s->rows = im->rows;
    s->cols = im->cols;
    s->num_classes = num_classes;
    s->images = im->pixels;
    s->labels = lb->labels;
    im->pixels = NULL;
    lb->labels = NULL;
    return MOH_OK;
}

int idx_split_from_buffers(idx_split *s, const uint8_t *img, size_t img_len, const uint8_t *lab,
                           size_t lab_len, int num_classes, size_t max_bytes, const char *label,
                           moh_error *err) {
    memset(s, 0, sizeof *s);
    if (!label) label = "<memory>";
    if (num_classes < 1 || num_classes > 256)
        return moh_fail(err, MOH_E_ARG, "%s: num_classes %d, expected 1..256 (IDX labels are bytes)", label, num_classes);
    char li[300], ll[300];
    snprintf(li, sizeof li, "%s images", label);
    snprintf(ll, sizeof ll, "%s labels", label);
    idx_images im;
    idx_labels lb;
    int rc = idx_parse_images(&im, img, img_len, max_bytes, li, err);
    if (rc) return rc;
    if ((rc = idx_parse_labels(&lb, lab, lab_len, max_bytes, ll, err))) {
        idx_images_free(&im);
        return rc;
    }
    rc = build_split(s, &im, &lb, num_classes, li, ll, err);
    idx_images_free(&im);
    idx_labels_free(&lb);
    return rc;
}

/* Reads DIR/NAME, or DIR/NAME.gz when the plain file does not exist. */
static uint8_t *read_either(const char *dir, const char *name, char *path, size_t cap, size_t *len,
                            moh_error *err) {
    struct stat st;
    snprintf(path, cap, "%s/%s", dir, name);
    if (stat(path, &st) != 0) {
        snprintf(path, cap, "%s/%s.gz", dir, name);
        if (stat(path, &st) != 0) {
            moh_fail(err, MOH_E_IO, "%s/%s: no such file (nor %s/%s.gz), expected an MNIST-style "
                     "data dir (train/t10k images and labels)", dir, name, dir, name);
            return NULL;
        }
    }
    return (uint8_t *)fs_read_file(path, (size_t)1 << 31, len, err);
}

int idx_split_load(idx_split *s, const char *dir, const char *prefix, int num_classes, moh_error *err) {
    memset(s, 0, sizeof *s);
    if (num_classes < 1 || num_classes > 256)
        return moh_fail(err, MOH_E_ARG, "%s: num_classes %d, expected 1..256 (IDX labels are bytes)", dir, num_classes);
    char name[256], ipath[4400], lpath[4400];
    size_t ilen = 0, llen = 0;
    snprintf(name, sizeof name, "%s-images-idx3-ubyte", prefix);
    uint8_t *ib = read_either(dir, name, ipath, sizeof ipath, &ilen, err);
    if (!ib) return err ? err->code : MOH_E_IO;
    snprintf(name, sizeof name, "%s-labels-idx1-ubyte", prefix);
    uint8_t *lbuf = read_either(dir, name, lpath, sizeof lpath, &llen, err);
    if (!lbuf) {
        free(ib);
        return err ? err->code : MOH_E_IO;
    }
    idx_images im;
    idx_labels lb;
    memset(&lb, 0, sizeof lb);
    int rc = idx_parse_images(&im, ib, ilen, IDX_MAX_FILE_BYTES, ipath, err);
    if (!rc) rc = idx_parse_labels(&lb, lbuf, llen, IDX_MAX_FILE_BYTES, lpath, err);
    if (!rc) rc = build_split(s, &im, &lb, num_classes, ipath, lpath, err);
    idx_images_free(&im);
    idx_labels_free(&lb);
    free(ib);
    free(lbuf);
    return rc;
}

uint32_t idx_split_crc(const idx_split *s, int n, uint32_t crc) {
    const size_t px = (size_t)n * (size_t)s->rows * (size_t)s->cols;
    uLong c = crc32_z(crc, s->images, px);
    return (uint32_t)crc32_z(c, s->labels, (size_t)n);
}

void idx_split_free(idx_split *s) {
    if (!s) return;
    free(s->images);
    free(s->labels);
    memset(s, 0, sizeof *s);
}

void idx_mean_std(const idx_split *s, double *mean, double *std) {
    const size_t n = (size_t)s->n * s->rows * s->cols;
    double sum = 0.0, sq = 0.0;
    for (size_t i = 0; i < n; i++) {
        const double v = s->images[i] / 255.0;
        sum += v;
        sq += v * v;
    }
    const double m = n ? sum / (double)n : 0.0;
    const double var = n ? sq / (double)n - m * m : 0.0;
    *mean = m;
    *std = sqrt(var > 0 ? var : 0);
}

int idx_train_mean_std(const char *dir, int num_classes, double *mean, double *std, moh_error *err) {
    idx_split tr;
    const int rc = idx_split_load(&tr, dir, "train", num_classes, err);
    if (rc) return rc;
    idx_mean_std(&tr, mean, std);
    idx_split_free(&tr);
    return MOH_OK;
}

const char *const *idx_fashion_names(const char *dir, int num_classes) {
    static const char *const names[10] = {"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                                          "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"};
    if (num_classes != 10 || !dir) return NULL;
    for (const char *c = dir; *c; c++)
        if (!strncasecmp(c, "fashion", 7)) return names;
    return NULL;
}

/* Uniform integer in [0, n) without modulo bias. */
static uint64_t below(uint64_t *st, uint64_t n) {
    const uint64_t lim = UINT64_MAX - UINT64_MAX % n;
    uint64_t r;
    do r = moh_rng_next(st);
    while (r >= lim);
    return r % n;
}

void idx_epoch_order(int *perm, int n, uint64_t seed, long epoch) {
    uint64_t st = seed * 0xD1B54A32D192ED03ULL ^ ((uint64_t)epoch + 1) * 0x9E3779B97F4A7C15ULL;
    for (int i = 0; i < n; i++) perm[i] = i;
    for (int i = n - 1; i > 0; i--) {
        const int j = (int)below(&st, (uint64_t)i + 1);
        const int t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
}

void idx_image_to_float(const idx_split *s, int i, double mean, double std, const idx_augment *aug,
                        uint64_t seed, uint64_t key, float *out) {
    const int R = s->rows, C = s->cols;
    const uint8_t *src = s->images + (size_t)i * R * C;
    int dy = 0, dx = 0;
    bool flip = false;
    if (aug && (aug->pad > 0 || aug->hflip)) {
        uint64_t st = seed ^ (key + 1) * 0xA24BAED4963EE407ULL;
        const uint64_t span = 2 * (uint64_t)aug->pad + 1;
        if (aug->pad > 0) {
            dy = (int)below(&st, span) - aug->pad;
            dx = (int)below(&st, span) - aug->pad;
        }
        if (aug->hflip) flip = moh_rng_next(&st) >> 63;
    }
    const float scale = (float)(1.0 / (255.0 * std)), shift = (float)(-mean / std);
    for (int y = 0; y < R; y++)
        for (int x = 0; x < C; x++) {
            /* crop of the padded image at offset (pad + dy, pad + dx), then the flip */
            const int sx = (flip ? C - 1 - x : x) + dx, sy = y + dy;
            const int v = sy >= 0 && sy < R && sx >= 0 && sx < C ? src[(size_t)sy * C + sx] : 0;
            out[(size_t)y * C + x] = (float)v * scale + shift;
        }
}

static void put_be32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

int idx_write(const char *path, const uint8_t *images, int n, int rows, int cols, const char *label_path,
              const uint8_t *labels, moh_error *err) {
    const size_t np = (size_t)n * rows * cols;
    uint8_t *buf = malloc(16 + (np > (size_t)n ? np : (size_t)n));
    if (!buf) return moh_fail(err, MOH_E_NOMEM, "%s: out of memory", path);
    put_be32(buf, IDX_MAGIC_IMAGES);
    put_be32(buf + 4, (uint32_t)n);
    put_be32(buf + 8, (uint32_t)rows);
    put_be32(buf + 12, (uint32_t)cols);
    memcpy(buf + 16, images, np);
    int rc = fs_write_atomic(path, buf, 16 + np, err);
    if (!rc && label_path && labels) {
        put_be32(buf, IDX_MAGIC_LABELS);
        put_be32(buf + 4, (uint32_t)n);
        memcpy(buf + 8, labels, (size_t)n);
        rc = fs_write_atomic(label_path, buf, 8 + (size_t)n, err);
    }
    free(buf);
    return rc;
}
