/* IDX reader: valid plain and gzip files written by the test (split loading, plain preferred over
 * .gz), every error (truncation, bad magic, zero/absurd sizes, trailing bytes, corrupt/truncated/
 * oversized gzip, count mismatch, label >= num_classes, missing file), normalisation statistics,
 * the epoch order and the augmentation. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "data/idx.h"
#include "test_util.h"

static size_t put_be32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
    return 4;
}

/* An IDX image file of n images of r x c pixels, pixel (i, y, x) = (i * 31 + y * 7 + x) % 256. */
static uint8_t *make_images(int n, int r, int c, size_t *len) {
    *len = 16 + (size_t)n * r * c;
    uint8_t *b = malloc(*len);
    size_t o = put_be32(b, IDX_MAGIC_IMAGES);
    o += put_be32(b + o, (uint32_t)n);
    o += put_be32(b + o, (uint32_t)r);
    o += put_be32(b + o, (uint32_t)c);
    for (int i = 0; i < n; i++)
        for (int y = 0; y < r; y++)
            for (int x = 0; x < c; x++) b[o++] = (uint8_t)((i * 31 + y * 7 + x) % 256);
    return b;
}

static uint8_t *make_labels(int n, int mod, size_t *len) {
    *len = 8 + (size_t)n;
    uint8_t *b = malloc(*len);
    size_t o = put_be32(b, IDX_MAGIC_LABELS);
    o += put_be32(b + o, (uint32_t)n);
    for (int i = 0; i < n; i++) b[o++] = (uint8_t)(i % mod);
    return b;
}

/* gzip (RFC 1952) of buf, malloc'd. */
static uint8_t *gz(const uint8_t *buf, size_t len, size_t *out_len) {
    z_stream z;
    memset(&z, 0, sizeof z);
    deflateInit2(&z, 6, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY);
    size_t cap = deflateBound(&z, (uLong)len) + 64;
    uint8_t *o = malloc(cap);
    z.next_in = (Bytef *)buf;
    z.avail_in = (uInt)len;
    z.next_out = o;
    z.avail_out = (uInt)cap;
    deflate(&z, Z_FINISH);
    *out_len = cap - z.avail_out;
    deflateEnd(&z);
    return o;
}

static void write_file(const char *dir, const char *name, const uint8_t *b, size_t n) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    fwrite(b, 1, n, f);
    fclose(f);
}

static void expect_err(test_ctx *ctx, const char *what, int rc, int code, const moh_error *err,
                       const char *needle) {
    CHECK(ctx, rc == code && strstr(err->msg, needle) && !strchr(err->msg, '\n'),
          "%s: rc %d (want %d), message '%s' (want '%s')", what, rc, code, err->msg, needle);
}

static void parse_errors(test_ctx *ctx) {
    moh_error err;
    idx_images im;
    idx_labels lb;
    size_t n;
    uint8_t *img = make_images(3, 4, 5, &n);
    int rc = idx_parse_images(&im, img, n, 1 << 20, "t", &err);
    CHECK(ctx, rc == MOH_OK && im.n == 3 && im.rows == 4 && im.cols == 5 && im.pixels[20 + 1 * 5 + 2] == (31 + 7 + 2) % 256,
          "valid images: %s", err.msg);
    idx_images_free(&im);
    rc = idx_parse_images(&im, img, 2, 1 << 20, "t", &err);
    expect_err(ctx, "2 bytes", rc, MOH_E_FORMAT, &err, "t: truncated: 2 bytes");
    rc = idx_parse_images(&im, img, 10, 1 << 20, "t", &err);
    expect_err(ctx, "truncated header", rc, MOH_E_FORMAT, &err, "truncated header: 10 bytes, expected 16");
    rc = idx_parse_images(&im, img, n - 1, 1 << 20, "t", &err);
    expect_err(ctx, "truncated data", rc, MOH_E_FORMAT, &err, "truncated: 59 data bytes, expected 60");
    CHECK(ctx, im.pixels == NULL && im.n == 0, "output empty on error");
    uint8_t *big = malloc(n + 3);
    memcpy(big, img, n);
    memset(big + n, 7, 3);
    rc = idx_parse_images(&im, big, n + 3, 1 << 20, "t", &err);
    expect_err(ctx, "trailing", rc, MOH_E_FORMAT, &err, "3 bytes after the data");
    free(big);
    img[3] = 0x01; /* labels magic in an image file */
    rc = idx_parse_images(&im, img, n, 1 << 20, "t", &err);
    expect_err(ctx, "bad magic", rc, MOH_E_FORMAT, &err, "bad magic 0x00000801, expected 0x00000803");
    expect_err(ctx, "bad magic reason", rc, MOH_E_FORMAT, &err, "3 dims): wrong number of dims");
    img[0] = 0x01; /* not IDX at all: the first two bytes must be zero */
    img[3] = 0x03;
    rc = idx_parse_images(&im, img, n, 1 << 20, "t", &err);
    expect_err(ctx, "not IDX", rc, MOH_E_FORMAT, &err, "bad magic 0x01000803, expected 0x00000803");
    expect_err(ctx, "not IDX reason", rc, MOH_E_FORMAT, &err, "not an IDX file: its first two bytes must be zero");
    img[0] = 0x00;
    img[3] = 0x03;
    img[2] = 0x0D; /* float data type */
    rc = idx_parse_images(&im, img, n, 1 << 20, "t", &err);
    expect_err(ctx, "float type", rc, MOH_E_FORMAT, &err, "bad magic 0x00000d03");
    expect_err(ctx, "float type reason", rc, MOH_E_FORMAT, &err, "type code is not 0x08 (unsigned byte)");
    img[2] = 0x08;
    put_be32(img + 8, 0);
    rc = idx_parse_images(&im, img, n, 1 << 20, "t", &err);
    expect_err(ctx, "zero rows", rc, MOH_E_FORMAT, &err, "size 1 of the images header is 0, expected 1..4096");
    put_be32(img + 8, 5000);
    rc = idx_parse_images(&im, img, n, 1 << 20, "t", &err);
    expect_err(ctx, "absurd rows", rc, MOH_E_FORMAT, &err, "is 5000, expected 1..4096");
    put_be32(img + 8, 4);
    put_be32(img + 4, 0xFFFFFFFFu);
    rc = idx_parse_images(&im, img, n, 1 << 20, "t", &err);
    expect_err(ctx, "absurd count", rc, MOH_E_FORMAT, &err, "size 0 of the images header is 4294967295");
    put_be32(img + 4, 3);

    /* gzip: valid, truncated, corrupt, oversized */
    size_t gn;
    uint8_t *g = gz(img, n, &gn);
    rc = idx_parse_images(&im, g, gn, 1 << 20, "g", &err);
    CHECK(ctx, rc == MOH_OK && im.n == 3 && !memcmp(im.pixels, img + 16, 60), "gzip images: %s", err.msg);
    idx_images_free(&im);
    rc = idx_parse_images(&im, g, gn - 9, 1 << 20, "g", &err);
    expect_err(ctx, "gzip truncated", rc, MOH_E_FORMAT, &err, "gzip data is truncated");
    rc = idx_parse_images(&im, g, gn, 40, "g", &err);
    expect_err(ctx, "gzip too large", rc, MOH_E_FORMAT, &err, "inflates to more than 40 bytes");
    uint8_t *bad = malloc(gn);
    memcpy(bad, g, gn);
    for (size_t i = 10; i < gn - 8; i++) bad[i] ^= 0x5A;
    rc = idx_parse_images(&im, bad, gn, 1 << 20, "g", &err);
    expect_err(ctx, "gzip corrupt", rc, MOH_E_FORMAT, &err, "g: gzip data");
    memcpy(bad, g, gn);
    bad[gn - 1] ^= 0xFF; /* ISIZE trailer */
    rc = idx_parse_images(&im, bad, gn, 1 << 20, "g", &err);
    expect_err(ctx, "gzip bad trailer", rc, MOH_E_FORMAT, &err, "gzip data is corrupt");
    free(bad);
    /* two concatenated gzip members inflate to the concatenation */
    uint8_t *g1 = gz(img, 30, &gn), *g2;
    size_t gn2;
    g2 = gz(img + 30, n - 30, &gn2);
    uint8_t *cat = malloc(gn + gn2);
    memcpy(cat, g1, gn);
    memcpy(cat + gn, g2, gn2);
    rc = idx_parse_images(&im, cat, gn + gn2, 1 << 20, "g", &err);
    CHECK(ctx, rc == MOH_OK && im.n == 3, "concatenated gzip members: %s", err.msg);
    idx_images_free(&im);
    free(g1);
    free(g2);
    free(cat);
    free(g);

    uint8_t *lab = make_labels(3, 10, &n);
    rc = idx_parse_labels(&lb, lab, n, 1 << 20, "l", &err);
    CHECK(ctx, rc == MOH_OK && lb.n == 3 && lb.labels[2] == 2, "labels: %s", err.msg);
    idx_labels_free(&lb);
    rc = idx_parse_labels(&lb, img, 76, 1 << 20, "l", &err);
    expect_err(ctx, "images as labels", rc, MOH_E_FORMAT, &err, "bad magic 0x00000803, expected 0x00000801");
    free(lab);
    free(img);
}

static void split_tests(test_ctx *ctx) {
    moh_error err;
    idx_split s;
    char dir[] = "/tmp/moh_test_idx_XXXXXX";
    CHECK(ctx, mkdtemp(dir) != NULL, "mkdtemp");
    size_t ni, nl, gi, gl;
    uint8_t *img = make_images(6, 4, 4, &ni), *lab = make_labels(6, 3, &nl);
    uint8_t *zimg = gz(img, ni, &gi), *zlab = gz(lab, nl, &gl);
    /* missing files */
    int rc = idx_split_load(&s, dir, "train", 3, &err);
    expect_err(ctx, "missing", rc, MOH_E_IO, &err, "train-images-idx3-ubyte: no such file (nor ");
    /* gzip only */
    write_file(dir, "train-images-idx3-ubyte.gz", zimg, gi);
    write_file(dir, "train-labels-idx1-ubyte.gz", zlab, gl);
    rc = idx_split_load(&s, dir, "train", 3, &err);
    CHECK(ctx, rc == MOH_OK && s.n == 6 && s.rows == 4 && s.cols == 4 && s.labels[5] == 2 &&
               !memcmp(s.images, img + 16, 96), "gzip split: %s", err.msg);
    double mean, sd, m2 = 0, s2 = 0;
    idx_mean_std(&s, &mean, &sd);
    for (int i = 0; i < 96; i++) m2 += img[16 + i] / 255.0;
    m2 /= 96;
    for (int i = 0; i < 96; i++) s2 += (img[16 + i] / 255.0 - m2) * (img[16 + i] / 255.0 - m2);
    s2 = sqrt(s2 / 96);
    CHECK(ctx, fabs(mean - m2) < 1e-12 && fabs(sd - s2) < 1e-9, "mean/std %g %g vs %g %g", mean, sd, m2, s2);
    /* normalisation without augmentation */
    float out[16];
    idx_image_to_float(&s, 2, mean, sd, NULL, 0, 0, out);
    CHECK(ctx, fabs(out[5] - (img[16 + 32 + 5] / 255.0 - mean) / sd) < 1e-5, "normalised pixel");
    /* crop: every output is a shifted copy within [-pad, pad]; flip mirrors; deterministic */
    const idx_augment aug = {2, true};
    int flips = 0, shifted = 0;
    for (uint64_t key = 0; key < 400; key++) {
        float a[16], b[16];
        idx_image_to_float(&s, 1, 0.0, 1.0 / 255.0, &aug, 7, key, a); /* out = pixel value */
        idx_image_to_float(&s, 1, 0.0, 1.0 / 255.0, &aug, 7, key, b);
        CHECK(ctx, !memcmp(a, b, sizeof a), "augmentation not deterministic for key %llu", (unsigned long long)key);
        bool found = false;
        for (int fl = 0; fl < 2 && !found; fl++)
            for (int dy = -2; dy <= 2 && !found; dy++)
                for (int dx = -2; dx <= 2 && !found; dx++) {
                    bool ok = true;
                    for (int y = 0; y < 4 && ok; y++)
                        for (int x = 0; x < 4 && ok; x++) {
                            const int sx = (fl ? 3 - x : x) + dx, sy = y + dy;
                            const int v = sy >= 0 && sy < 4 && sx >= 0 && sx < 4 ? s.images[16 + sy * 4 + sx] : 0;
                            ok = fabsf(a[y * 4 + x] - (float)v) < 1e-3f;
                        }
                    if (ok) {
                        found = true;
                        flips += fl;
                        shifted += dy != 0 || dx != 0;
                    }
                }
        CHECK(ctx, found, "augmented image %llu is not a crop/flip of the original", (unsigned long long)key);
    }
    CHECK(ctx, flips > 140 && flips < 260 && shifted > 300, "flips %d/400, shifted %d/400", flips, shifted);
    idx_split_free(&s);
    /* label out of range, count mismatch */
    rc = idx_split_load(&s, dir, "train", 2, &err);
    expect_err(ctx, "label range", rc, MOH_E_FORMAT, &err, "label 2 of item 2, expected 0..1 (num_classes 2)");
    CHECK(ctx, s.images == NULL && s.n == 0, "split empty on error");
    size_t n5;
    uint8_t *lab5 = make_labels(5, 3, &n5);
    write_file(dir, "train-labels-idx1-ubyte", lab5, n5); /* plain file preferred over .gz */
    rc = idx_split_load(&s, dir, "train", 3, &err);
    expect_err(ctx, "count mismatch", rc, MOH_E_FORMAT, &err, "train-labels-idx1-ubyte: 5 labels, expected 6");
    rc = idx_split_from_buffers(&s, img, ni, lab5, n5, 3, 1 << 20, "mem", &err);
    expect_err(ctx, "count mismatch (memory)", rc, MOH_E_FORMAT, &err, "mem labels: 5 labels, expected 6 (one per image in mem images)");
    rc = idx_split_from_buffers(&s, img, ni, lab, nl, 3, 1 << 20, "mem", &err);
    CHECK(ctx, rc == MOH_OK && s.n == 6, "from buffers: %s", err.msg);
    idx_split_free(&s);
    char path[600];
    const char *names[] = {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", "train-labels-idx1-ubyte"};
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        unlink(path);
    }
    rmdir(dir);
    free(img);
    free(lab);
    free(lab5);
    free(zimg);
    free(zlab);
}

static void order_tests(test_ctx *ctx) {
    enum { N = 1000 };
    static int a[N], b[N], c[N], seen[N];
    idx_epoch_order(a, N, 5, 0);
    idx_epoch_order(b, N, 5, 0);
    idx_epoch_order(c, N, 5, 1);
    memset(seen, 0, sizeof seen);
    int same = 0, fixed = 0;
    for (int i = 0; i < N; i++) {
        seen[a[i]]++;
        same += a[i] == c[i];
        fixed += a[i] == i;
    }
    bool perm = true;
    for (int i = 0; i < N; i++) perm &= seen[i] == 1;
    CHECK(ctx, perm && !memcmp(a, b, sizeof a), "epoch order is a deterministic permutation");
    CHECK(ctx, same < 20 && fixed < 20, "epochs differ (%d equal positions, %d fixed points)", same, fixed);
}

int main(void) {
    test_ctx ctx = {0};
    parse_errors(&ctx);
    split_tests(&ctx);
    order_tests(&ctx);
    return test_finish("test_idx", &ctx);
}
